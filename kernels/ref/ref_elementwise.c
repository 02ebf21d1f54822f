/* kernels/ref/ref_elementwise.c — activations, add, accumulate, dropout, channel copy,
 * cast, input normalisation, and the per-channel sum that the conv and linear bias
 * gradients share. Elementwise loops are independent per element (static schedule), so
 * results do not depend on the thread count. fp16 and bf16 values are converted per element
 * and computed in fp32.
 */
#include <math.h>
#include <string.h>

#include "ref_internal.h"

static int ref_ew_dt(tt_backend *b, const char *op, tt_dtype dt) { return tt_ref_dt_check(b, op, dt); }

/* The checks of the activation ops: the dtype, and an activation op takes (mask_form: one with a
 * mask form, ReLU or ReLU6). */
static int ref_ew_act_check(tt_backend *b, const char *op, tt_dtype dt, tt_act a, int mask_form) {
  if (ref_ew_dt(b, op, dt)) return -1;
  if (mask_form && a != TT_ACT_RELU && a != TT_ACT_RELU6)
    return tt_ref_fail(b, "%s: activation %d has no mask form", op, (int)a);
  if (!mask_form && (unsigned)a > (unsigned)TT_ACT_GELU_TANH) return tt_ref_fail(b, "%s: unknown activation %d", op, (int)a);
  return 0;
}

/* An activation backward's dx may be its dy only when it overwrites it. */
static int ref_ew_alias_check(tt_backend *b, const char *op, const void *dy, const void *dx, float beta) {
  if (dx == dy && beta != 0.0f)
    return tt_ref_fail(b, "%s: dx may alias dy only when beta == 0 (beta=%g)", op, (double)beta);
  return 0;
}

/* out[ch] = beta*out[ch] + sum over (n, hw) of t[n, ch, hw]: the bias gradient of conv and
 * linear. Serial per channel: one float partial per sample, the partials added in sample
 * order in double, so the sum does not depend on the thread count. */
void tt_ref_channel_sum(tt_backend *b, int n, int c, size_t hw, tt_dtype dt, const void *t, float *out, float beta) {
  ptrdiff_t ch;
  int nt = tt_ref_threads(b);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)n * c * hw > TT_REF_PAR_MIN)
  for (ch = 0; ch < c; ch++) {
    double acc = 0.0;
    int i;
    size_t q;
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * c + (size_t)ch) * hw;
      float part = 0.0f;
      if (dt == TT_F32)
        for (q = 0; q < hw; q++) part += ((const float *)t)[off + q];
      else
        for (q = 0; q < hw; q++) part += tt_ref_ld(dt, t, off + q);
      acc += part;
    }
    out[ch] = tt_ref_beta_f32(out[ch], (float)acc, beta);
  }
}

int tt_ref_act_fwd(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *x, void *y) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_act_check(b, "act_fwd", dt, a, 0)) return -1;
  if (count && (!x || !y)) return tt_ref_fail(b, "act_fwd: NULL x or y");
  if (dt == TT_F32) {
    const float *xs = (const float *)x;
    float *ys = (float *)y;
    if (a == TT_ACT_RELU) { /* the common case, as its own loop so the compiler vectorises it */
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
      for (i = 0; i < n; i++) ys[i] = tt_act_value(TT_ACT_RELU, xs[i]);
    } else {
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
      for (i = 0; i < n; i++) ys[i] = tt_act_value(a, xs[i]);
    }
  } else { /* fp16, bf16 */
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
    for (i = 0; i < n; i++) tt_ref_st(dt, y, (size_t)i, tt_act_value(a, tt_ref_ld(dt, x, (size_t)i)));
  }
  return 0;
}

int tt_ref_act_bwd(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *saved, const void *dy,
                   void *dx, float beta) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_act_check(b, "act_bwd", dt, a, 0)) return -1;
  if (count && (!saved || !dy || !dx)) return tt_ref_fail(b, "act_bwd: NULL saved, dy or dx");
  if (ref_ew_alias_check(b, "act_bwd", dy, dx, beta)) return -1;
  if (dt == TT_F32 && a == TT_ACT_RELU) { /* the common case, vectorisable */
    const float *sv = (const float *)saved, *g = (const float *)dy;
    float *o = (float *)dx;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
    for (i = 0; i < n; i++) o[i] = tt_ref_beta_f32(o[i], tt_act_grad(TT_ACT_RELU, sv[i], g[i]), beta);
    return 0;
  }
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
  for (i = 0; i < n; i++) {
    float v = tt_act_grad(a, tt_ref_ld(dt, saved, (size_t)i), tt_ref_ld(dt, dy, (size_t)i));
    tt_ref_st_beta(dt, dx, (size_t)i, v, beta);
  }
  return 0;
}

/* One uint32 word per iteration (32 elements), so threads never share a word. */
int tt_ref_act_mask(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *y, uint32_t *mask) {
  ptrdiff_t wi, nw = (ptrdiff_t)((count + 31u) / 32u);
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_act_check(b, "act_mask", dt, a, 1)) return -1;
  if (count && (!y || !mask)) return tt_ref_fail(b, "act_mask: NULL y or mask");
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)count > TT_REF_PAR_MIN)
  for (wi = 0; wi < nw; wi++) {
    size_t i0 = (size_t)wi * 32u, i1 = i0 + 32u < count ? i0 + 32u : count, i;
    uint32_t m = 0;
    for (i = i0; i < i1; i++)
      if (tt_act_grad(a, tt_ref_ld(dt, y, i), 1.0f) != 0.0f) m |= 1u << (i - i0);
    mask[wi] = m;
  }
  return 0;
}

int tt_ref_act_bwd_mask(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const uint32_t *mask, const void *dy,
                        void *dx, float beta) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_act_check(b, "act_bwd_mask", dt, a, 1)) return -1;
  if (count && (!mask || !dy || !dx)) return tt_ref_fail(b, "act_bwd_mask: NULL mask, dy or dx");
  if (ref_ew_alias_check(b, "act_bwd_mask", dy, dx, beta)) return -1;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
  for (i = 0; i < n; i++) {
    float g = tt_ref_ld(dt, dy, (size_t)i);
    float v = ((mask[(size_t)i >> 5] >> ((size_t)i & 31u)) & 1u) ? g : 0.0f;
    tt_ref_st_beta(dt, dx, (size_t)i, v, beta);
  }
  return 0;
}

int tt_ref_add(tt_backend *b, size_t count, tt_dtype dt, const void *a, const void *b2, void *y) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_dt(b, "add", dt)) return -1;
  if (count && (!a || !b2 || !y)) return tt_ref_fail(b, "add: NULL a, b2 or y");
  if (dt == TT_F32) {
    const float *as = (const float *)a, *bs = (const float *)b2;
    float *ys = (float *)y;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
    for (i = 0; i < n; i++) ys[i] = as[i] + bs[i];
  } else {
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
    for (i = 0; i < n; i++) tt_ref_st(dt, y, (size_t)i, tt_ref_ld(dt, a, (size_t)i) + tt_ref_ld(dt, b2, (size_t)i));
  }
  return 0;
}

int tt_ref_accumulate(tt_backend *b, size_t count, tt_dtype dt, const void *x, void *y, float beta) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_dt(b, "accumulate", dt)) return -1;
  if (count && (!x || !y)) return tt_ref_fail(b, "accumulate: NULL x or y");
  if (dt == TT_F32) {
    const float *xs = (const float *)x;
    float *ys = (float *)y;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
    for (i = 0; i < n; i++) ys[i] = tt_ref_beta_f32(ys[i], xs[i], beta);
  } else {
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
    for (i = 0; i < n; i++) tt_ref_st_beta(dt, y, (size_t)i, tt_ref_ld(dt, x, (size_t)i), beta);
  }
  return 0;
}

/* Keep threshold and scale for dropout; see tt_dropout_hash in kernels/kernel_math.h. */
static int ref_ew_dropout_params(tt_backend *b, const char *op, float p, uint32_t *thr, float *scale, int *all_drop) {
  if (!(p >= 0.0f && p <= 1.0f)) return tt_ref_fail(b, "%s: dropout probability %g is outside [0, 1]", op, (double)p);
  *all_drop = p >= 1.0f;
  *thr = *all_drop ? 0u : (uint32_t)((double)p * 4294967296.0);
  *scale = *all_drop ? 0.0f : 1.0f / (1.0f - p);
  return 0;
}

int tt_ref_dropout_fwd(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *x, void *y) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  uint32_t thr = 0;
  float scale = 0.0f;
  int all_drop = 0, nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_dt(b, "dropout_fwd", dt)) return -1;
  if (ref_ew_dropout_params(b, "dropout_fwd", p, &thr, &scale, &all_drop)) return -1;
  if (count && (!x || !y)) return tt_ref_fail(b, "dropout_fwd: NULL x or y");
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
  for (i = 0; i < n; i++) {
    int keep = !all_drop && (uint32_t)(tt_dropout_hash(seed, (uint64_t)i) >> 32) >= thr;
    tt_ref_st(dt, y, (size_t)i, keep ? tt_ref_ld(dt, x, (size_t)i) * scale : 0.0f);
  }
  return 0;
}

int tt_ref_dropout_bwd(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *dy,
                       void *dx, float beta) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  uint32_t thr = 0;
  float scale = 0.0f;
  int all_drop = 0, nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_dt(b, "dropout_bwd", dt)) return -1;
  if (ref_ew_dropout_params(b, "dropout_bwd", p, &thr, &scale, &all_drop)) return -1;
  if (count && (!dy || !dx)) return tt_ref_fail(b, "dropout_bwd: NULL dy or dx");
  if (dx == dy && beta != 0.0f) return tt_ref_fail(b, "dropout_bwd: dx may alias dy only when beta == 0");
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
  for (i = 0; i < n; i++) {
    int keep = !all_drop && (uint32_t)(tt_dropout_hash(seed, (uint64_t)i) >> 32) >= thr;
    tt_ref_st_beta(dt, dx, (size_t)i, keep ? tt_ref_ld(dt, dy, (size_t)i) * scale : 0.0f, beta);
  }
  return 0;
}

int tt_ref_channel_copy(tt_backend *b, int n, int hw, tt_dtype dt, const void *src, int src_c, int src_off,
                        void *dst, int dst_c, int dst_off, int nc, float beta) {
  ptrdiff_t task, ntask = (ptrdiff_t)n * nc;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_dt(b, "channel_copy", dt)) return -1;
  if (n < 0 || hw < 0 || nc < 0 || src_off < 0 || dst_off < 0 || src_off + nc > src_c || dst_off + nc > dst_c)
    return tt_ref_fail(b, "channel_copy: block [%d, %d+%d) does not fit src (%d channels) or [%d, %d+%d) dst (%d)",
                       src_off, src_off, nc, src_c, dst_off, dst_off, nc, dst_c);
  if (ntask && hw && (!src || !dst)) return tt_ref_fail(b, "channel_copy: NULL src or dst");
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)ntask * hw > TT_REF_PAR_MIN)
  for (task = 0; task < ntask; task++) {
    int i = (int)(task / nc), ch = (int)(task % nc);
    size_t so = ((size_t)i * src_c + src_off + ch) * hw, d0 = ((size_t)i * dst_c + dst_off + ch) * hw, k;
    if (beta == 0.0f)
      memcpy((char *)dst + d0 * tt_dtype_size(dt), (const char *)src + so * tt_dtype_size(dt), (size_t)hw * tt_dtype_size(dt));
    else
      for (k = 0; k < (size_t)hw; k++) tt_ref_st_beta(dt, dst, d0 + k, tt_ref_ld(dt, src, so + k), beta);
  }
  return 0;
}

int tt_ref_cast(tt_backend *b, size_t count, tt_dtype src_dt, const void *src, tt_dtype dst_dt, void *dst) {
  if (ref_ew_dt(b, "cast", src_dt) || ref_ew_dt(b, "cast", dst_dt)) return -1;
  if (count && (!src || !dst)) return tt_ref_fail(b, "cast: NULL src or dst");
  if (src_dt == dst_dt) {
    if (src != dst && count) memmove(dst, src, count * tt_dtype_size(src_dt));
  } else if (dst_dt == TT_F32) {
    if (src == dst) return tt_ref_fail(b, "cast: %s -> fp32 cannot run in place", tt_dtype_name(src_dt));
    tt_ref_to_f32(b, src_dt, src, (float *)dst, count);
  } else if (src_dt == TT_F32) {
    if (src == dst) return tt_ref_fail(b, "cast: fp32 -> %s cannot run in place", tt_dtype_name(dst_dt));
    tt_ref_from_f32(b, dst_dt, (const float *)src, dst, count);
  } else { /* fp16 <-> bf16: both 2 bytes, element i in place of element i, so src may equal dst */
    ptrdiff_t i, n = (ptrdiff_t)count;
    int nt = tt_ref_threads(b);
    (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
    for (i = 0; i < n; i++) tt_ref_st(dst_dt, dst, (size_t)i, tt_ref_ld(src_dt, src, (size_t)i));
  }
  return 0;
}

/* One KRSC segment of cast_multi (backend.h tt_cast_seg, rs > 0): dst [k, rs, cg] from src
 * [k, cg, rs], each value converted as cast converts it (through fp32, one rounding). */
static int ref_ew_cast_krsc(tt_backend *b, int i, int nseg, const tt_cast_seg *sg, tt_dtype src_dt, tt_dtype dst_dt) {
  size_t kr = (size_t)(sg->k > 0 ? sg->k : 0) * (size_t)sg->rs;
  if (sg->k <= 0 || !kr || sg->count % kr)
    return tt_ref_fail(b, "cast_multi: tensor %d of %d: a KRSC filter of %zu elements as k=%d, r*s=%d is not whole filters", i,
                       nseg, sg->count, sg->k, sg->rs);
  if (!sg->count) return 0;
  if (!sg->src || !sg->dst) return tt_ref_fail(b, "cast_multi: tensor %d of %d: NULL src or dst", i, nseg);
  if (sg->src == (const void *)sg->dst || src_dt == dst_dt)
    return tt_ref_fail(b, "cast_multi: tensor %d of %d: a KRSC transpose %s -> %s cannot run in place or into its own dtype", i,
                       nseg, tt_dtype_name(src_dt), tt_dtype_name(dst_dt));
  const size_t rs = (size_t)sg->rs, cg = sg->count / kr;
  ptrdiff_t d, n = (ptrdiff_t)sg->count;
  int nt = tt_ref_threads(b);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
  for (d = 0; d < n; d++) {
    size_t l = (size_t)d % cg, q = (size_t)d / cg, j = q % rs, f = q / rs;
    tt_ref_st(dst_dt, sg->dst, (size_t)d, tt_ref_ld(src_dt, sg->src, (f * cg + l) * rs + j));
  }
  return 0;
}

int tt_ref_cast_multi_with(tt_backend *b, tt_cast_fn *cast, const tt_cast_seg *segs, int nseg, tt_dtype src_dt, tt_dtype dst_dt) {
  if (ref_ew_dt(b, "cast_multi", src_dt) || ref_ew_dt(b, "cast_multi", dst_dt)) return -1;
  if (nseg < 0 || (nseg && !segs)) return tt_ref_fail(b, "cast_multi: %d tensors at %p", nseg, (const void *)segs);
  for (int i = 0; i < nseg; i++) {
    if (segs[i].rs < 0) return tt_ref_fail(b, "cast_multi: tensor %d of %d: r*s = %d", i, nseg, segs[i].rs);
    if (segs[i].rs ? ref_ew_cast_krsc(b, i, nseg, &segs[i], src_dt, dst_dt)
                   : cast(b, segs[i].count, src_dt, segs[i].src, dst_dt, segs[i].dst))
      return -1;
  }
  return 0;
}

int tt_ref_cast_multi(tt_backend *b, const tt_cast_seg *segs, int nseg, tt_dtype src_dt, tt_dtype dst_dt) {
  return tt_ref_cast_multi_with(b, tt_ref_cast, segs, nseg, src_dt, dst_dt);
}

int tt_ref_normalize_u8(tt_backend *b, int n, int c, int hw, const uint8_t *src, const float *mean,
                        const float *std, tt_dtype dt, void *dst) {
  ptrdiff_t pl, npl = (ptrdiff_t)n * c;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_ew_dt(b, "normalize_u8", dt)) return -1;
  if (n < 0 || c <= 0 || hw < 0) return tt_ref_fail(b, "normalize_u8: bad shape n=%d c=%d hw=%d", n, c, hw);
  if (npl && hw && (!src || !mean || !std || !dst)) return tt_ref_fail(b, "normalize_u8: NULL src, mean, std or dst");
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)npl * hw > TT_REF_PAR_MIN)
  for (pl = 0; pl < npl; pl++) {
    int ch = (int)(pl % c);
    float m = mean[ch], s = std[ch];
    size_t off = (size_t)pl * hw, k;
    for (k = 0; k < (size_t)hw; k++) tt_ref_st(dt, dst, off + k, ((float)src[off + k] / 255.0f - m) / s);
  }
  return 0;
}

/* ------------------------- lossy saved copies (backend.h) ----------------------------- */

/* The bf16 format rounds with tt_bf16_from_f32 (kernel_math.h), the one bf16 rounding of the
 * project, so a bf16 save of a bf16 tensor is exact. */
int tt_ref_save_compress(tt_backend *b, int f, int n, int c, int hw, tt_dtype dt, const void *x, void *dst) {
  ptrdiff_t ch;
  int nt = tt_ref_threads(b);
  size_t count = (size_t)n * c * hw;
  (void)nt;
  if (ref_ew_dt(b, "save_compress", dt)) return -1;
  if (f < TT_SAVE_FP16 || f > TT_SAVE_INT8) return tt_ref_fail(b, "save_compress: unknown format %d", f);
  if (count && (!x || !dst)) return tt_ref_fail(b, "save_compress: NULL x or dst");
  if (f != TT_SAVE_INT8) {
    ptrdiff_t i, m = (ptrdiff_t)count;
    uint16_t *o = (uint16_t *)dst;
#pragma omp parallel for schedule(static) num_threads(nt) if (m > TT_REF_PAR_MIN)
    for (i = 0; i < m; i++) {
      float v = tt_ref_ld(dt, x, (size_t)i);
      o[i] = f == TT_SAVE_FP16 ? tt_ref_f2h(v) : tt_bf16_from_f32(v);
    }
    return 0;
  }
  int8_t *q = (int8_t *)dst;
  float *scale = (float *)((char *)dst + (count + 3u) / 4u * 4u);
#pragma omp parallel for schedule(static) num_threads(nt) if (count > TT_REF_PAR_MIN)
  for (ch = 0; ch < c; ch++) {
    float m = 0.0f;
    for (int s = 0; s < n; s++)
      for (int k = 0; k < hw; k++) {
        float a = fabsf(tt_ref_ld(dt, x, ((size_t)s * c + (size_t)ch) * hw + k));
        if (a > m) m = a; /* NaN never wins: the scale stays finite */
      }
    float inv = m > 0.0f ? 127.0f / m : 0.0f;
    scale[ch] = m / 127.0f;
    for (int s = 0; s < n; s++)
      for (int k = 0; k < hw; k++) {
        size_t i = ((size_t)s * c + (size_t)ch) * hw + k;
        float r = rintf(tt_ref_ld(dt, x, i) * inv);
        q[i] = (int8_t)(r > 127.0f ? 127 : (r < -127.0f ? -127 : (r == r ? (int)r : 0)));
      }
  }
  return 0;
}

int tt_ref_save_restore(tt_backend *b, int f, int n, int c, int hw, tt_dtype dt, const void *src, void *x) {
  ptrdiff_t i, m;
  int nt = tt_ref_threads(b);
  size_t count = (size_t)n * c * hw;
  (void)nt;
  if (ref_ew_dt(b, "save_restore", dt)) return -1;
  if (f < TT_SAVE_FP16 || f > TT_SAVE_INT8) return tt_ref_fail(b, "save_restore: unknown format %d", f);
  if (count && (!x || !src)) return tt_ref_fail(b, "save_restore: NULL src or x");
  m = (ptrdiff_t)count;
  const float *scale = (const float *)((const char *)src + (count + 3u) / 4u * 4u);
#pragma omp parallel for schedule(static) num_threads(nt) if (m > TT_REF_PAR_MIN)
  for (i = 0; i < m; i++) {
    float v;
    if (f == TT_SAVE_FP16) v = tt_ref_h2f(((const uint16_t *)src)[i]);
    else if (f == TT_SAVE_BF16) v = tt_bf16_to_f32(((const uint16_t *)src)[i]);
    else v = (float)((const int8_t *)src)[i] * scale[((size_t)i / (size_t)hw) % (size_t)c];
    tt_ref_st(dt, x, (size_t)i, v);
  }
  return 0;
}
