/* kernels/cpu/cpu_bf16.c — the CPU backend's own loops for the ops a bf16 step runs besides
 * convolution, linear, pooling, batch norm and ReLU/add (those are cpu_conv.c, cpu_linear.c,
 * cpu_norm.c, cpu_elementwise.c): casts between fp32 and bf16 (the weight copies, every step),
 * dropout forward and backward, global average pooling forward and backward, input
 * normalisation, the overflow check and the compact saves' ReLU/ReLU6 bit masks and max-pool
 * winners (act_mask, act_bwd_mask, pool_argmax, pool_bwd_idx; NCHW). fp32 takes the same loops
 * (all but the casts, which fp32 steps do not make); fp16, and every case not named here, goes
 * to the reference loops (kernels/ref), which also check the arguments and word the refusals. The
 * compact-save loops matter in fp32 as much: as the reference's scalar loops they took about
 * three quarters of a LeNet step on one thread (perf, a loaded machine).
 *
 * Bit for bit the reference's results: the same float expressions per element, bf16 widened
 * exactly (a shift) and rounded to nearest even with tt_bf16_from_f32's rule (NaN kept a NaN
 * with its quiet bit set), written here as integer arithmetic the compiler vectorises. (Not
 * AVX512_BF16's vcvtneps2bf16: it flushes denormal inputs and outputs to zero, the reference
 * does not.) Global average pooling sums each plane in double in index order, as the reference
 * does, eight planes at once (independent chains, no reordering).
 *
 * Vectorised as cpu_elementwise.c is: span functions compiled for AVX-512, AVX2 and the
 * baseline (target_clones; the CUDA compiler's host pass gets the baseline), run over fixed
 * per-thread shares of the tensor, so results never depend on the thread count. Intermediate
 * fp32 values live in per-thread stack chunks of CPU_BF_CHUNK elements: nothing is allocated.
 *
 * softmax_ce stays the reference's in every dtype: its cost is the exp per logit (double),
 * the same in fp32 and bf16, and its tensors are [batch, classes].
 */
#include <math.h>

#include "cpu_internal.h"

#if defined(__GNUC__) && !defined(__CUDACC__) && (defined(__x86_64__) || defined(__i386__))
#define CPU_BF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_BF_CLONES
#endif

#define CPU_BF_CHUNK 1024 /* fp32 elements per stack chunk (4 KiB) */

/* ---- conversions ---- */

/* d[i] = s[i] widened: bf16 is the high half of an fp32 */
static CPU_BF_CLONES void cpu_bf_widen(const uint16_t *s, float *d, size_t n) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) {
    uint32_t u = (uint32_t)s[i] << 16;
    memcpy(d + i, &u, 4); /* memcpy, not a cast pointer: no aliasing assumptions (it compiles to a move) */
  }
}

/* d[i] = s[i] rounded to nearest even (tt_bf16_from_f32) */
static CPU_BF_CLONES void cpu_bf_round(const float *s, uint16_t *d, size_t n) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) {
    uint32_t v;
    memcpy(&v, s + i, 4);
    d[i] = (uint16_t)((v & 0x7fffffffu) > 0x7f800000u ? (v >> 16) | 0x40u : (v + 0x7fffu + ((v >> 16) & 1u)) >> 16);
  }
}

/* The share [lo, hi) of count elements thread t of nt takes: equal shares rounded to 64
 * elements, fixed by (count, nt). */
static void cpu_bf_share(size_t count, int t, int nt, size_t *lo, size_t *hi) {
  size_t per = (count + (size_t)nt - 1) / (size_t)nt;
  per = (per + 63u) & ~(size_t)63u;
  *lo = (size_t)t * per;
  *hi = *lo + per;
  if (*lo > count) *lo = count;
  if (*hi > count) *hi = count;
}

#ifdef _OPENMP
#define CPU_BF_SHARE(count, lo, hi) cpu_bf_share((count), omp_get_thread_num(), omp_get_num_threads(), (lo), (hi))
#else
#define CPU_BF_SHARE(count, lo, hi) cpu_bf_share((count), 0, 1, (lo), (hi))
#endif

/* ---- cast ---- */

int tt_cpu_cast(tt_backend *b, size_t count, tt_dtype src_dt, const void *src, tt_dtype dst_dt, void *dst) {
  int to_bf = src_dt == TT_F32 && dst_dt == TT_BF16, from_bf = src_dt == TT_BF16 && dst_dt == TT_F32;
  if ((!to_bf && !from_bf) || !count || !src || !dst || src == dst) /* the reference checks and says why */
    return tt_ref_cast(b, count, src_dt, src, dst_dt, dst);
  {
    int nt = tt_cpu_threads_for(b, count);
    (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      size_t lo, hi;
      CPU_BF_SHARE(count, &lo, &hi);
      if (hi > lo) {
        if (to_bf)
          cpu_bf_round((const float *)src + lo, (uint16_t *)dst + lo, hi - lo);
        else
          cpu_bf_widen((const uint16_t *)src + lo, (float *)dst + lo, hi - lo);
      }
    }
  }
  return 0;
}

/* ---- dropout (kernel_math.h: tt_dropout_hash; thresholds as the reference's) ---- */

/* y[i] = keep(first + i) ? x[i] * scale : 0 */
static CPU_BF_CLONES void cpu_bf_dropout_span(const float *x, float *y, size_t n, uint64_t first, uint64_t seed,
                                             uint32_t thr, float scale, int all_drop) {
  size_t i;
  if (all_drop) {
    for (i = 0; i < n; i++) y[i] = 0.0f;
    return;
  }
#pragma omp simd
  for (i = 0; i < n; i++) {
    int keep = (uint32_t)(tt_dropout_hash(seed, first + i) >> 32) >= thr;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
}

/* y = beta*y + x (beta 0: y = x, never reading y), as tt_ref_st_beta */
static CPU_BF_CLONES void cpu_bf_beta_span(const float *x, float *y, size_t n, float beta) {
  size_t i;
  if (beta == 0.0f) {
    for (i = 0; i < n; i++) y[i] = x[i];
  } else {
#pragma omp simd
    for (i = 0; i < n; i++) y[i] = x[i] + beta * y[i];
  }
}

static int cpu_bf_dropout_params(tt_backend *b, const char *op, float p, uint32_t *thr, float *scale, int *all_drop) {
  if (!(p >= 0.0f && p <= 1.0f)) return tt_ref_fail(b, "%s: dropout probability %g is outside [0, 1]", op, (double)p);
  *all_drop = p >= 1.0f;
  *thr = *all_drop ? 0u : (uint32_t)((double)p * 4294967296.0);
  *scale = *all_drop ? 0.0f : 1.0f / (1.0f - p);
  return 0;
}

/* out = beta*out + dropout(in) over count elements of dt (fp32 or bf16); forward passes beta 0 */
static void cpu_bf_dropout_run(tt_backend *b, size_t count, tt_dtype dt, uint64_t seed, uint32_t thr, float scale,
                               int all_drop, const void *in, void *out, float beta) {
  int nt = tt_cpu_threads_for(b, count);
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi, c0;
    float a[CPU_BF_CHUNK], o[CPU_BF_CHUNK];
    CPU_BF_SHARE(count, &lo, &hi);
    for (c0 = lo; c0 < hi; c0 += CPU_BF_CHUNK) {
      size_t m = hi - c0 < CPU_BF_CHUNK ? hi - c0 : CPU_BF_CHUNK;
      if (dt == TT_F32) {
        if (beta == 0.0f) {
          cpu_bf_dropout_span((const float *)in + c0, (float *)out + c0, m, c0, seed, thr, scale, all_drop);
        } else {
          cpu_bf_dropout_span((const float *)in + c0, a, m, c0, seed, thr, scale, all_drop);
          cpu_bf_beta_span(a, (float *)out + c0, m, beta);
        }
      } else {
        cpu_bf_widen((const uint16_t *)in + c0, a, m);
        if (beta == 0.0f) {
          cpu_bf_dropout_span(a, o, m, c0, seed, thr, scale, all_drop);
        } else {
          cpu_bf_dropout_span(a, a, m, c0, seed, thr, scale, all_drop);
          cpu_bf_widen((const uint16_t *)out + c0, o, m);
          cpu_bf_beta_span(a, o, m, beta);
        }
        cpu_bf_round(o, (uint16_t *)out + c0, m);
      }
    }
  }
}

int tt_cpu_dropout_fwd(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *x, void *y) {
  uint32_t thr = 0;
  float scale = 0.0f;
  int all_drop = 0;
  if ((dt != TT_F32 && dt != TT_BF16) || !count || !x || !y) return tt_ref_dropout_fwd(b, count, dt, p, seed, x, y);
  if (cpu_bf_dropout_params(b, "dropout_fwd", p, &thr, &scale, &all_drop)) return -1;
  cpu_bf_dropout_run(b, count, dt, seed, thr, scale, all_drop, x, y, 0.0f);
  return 0;
}

int tt_cpu_dropout_bwd(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *dy, void *dx,
                       float beta) {
  uint32_t thr = 0;
  float scale = 0.0f;
  int all_drop = 0;
  if ((dt != TT_F32 && dt != TT_BF16) || !count || !dy || !dx || (dx == dy && beta != 0.0f))
    return tt_ref_dropout_bwd(b, count, dt, p, seed, dy, dx, beta);
  if (cpu_bf_dropout_params(b, "dropout_bwd", p, &thr, &scale, &all_drop)) return -1;
  cpu_bf_dropout_run(b, count, dt, seed, thr, scale, all_drop, dy, dx, beta);
  return 0;
}

/* ---- global average pooling: x [n, c, hw] -> y [n, c] ---- */

#define CPU_BF_GAP_PLANES 8 /* planes summed at once: independent double chains */

/* s[j] = sum over k in index order of plane j (of np <= CPU_BF_GAP_PLANES) of x, in double */
static void cpu_bf_gap_sums(const void *x, tt_dtype dt, size_t first_plane, int np, size_t hw, double *s) {
  size_t k;
  int j;
  for (j = 0; j < CPU_BF_GAP_PLANES; j++) s[j] = 0.0;
  if (dt == TT_F32) {
    const float *p = (const float *)x + first_plane * hw;
    if (np == CPU_BF_GAP_PLANES) {
      for (k = 0; k < hw; k++)
        for (j = 0; j < CPU_BF_GAP_PLANES; j++) s[j] += p[(size_t)j * hw + k];
    } else {
      for (j = 0; j < np; j++)
        for (k = 0; k < hw; k++) s[j] += p[(size_t)j * hw + k];
    }
  } else {
    const uint16_t *p = (const uint16_t *)x + first_plane * hw;
    if (np == CPU_BF_GAP_PLANES) {
      for (k = 0; k < hw; k++)
        for (j = 0; j < CPU_BF_GAP_PLANES; j++) s[j] += tt_bf16_to_f32(p[(size_t)j * hw + k]);
    } else {
      for (j = 0; j < np; j++)
        for (k = 0; k < hw; k++) s[j] += tt_bf16_to_f32(p[(size_t)j * hw + k]);
    }
  }
}

int tt_cpu_gap_fwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, void *y) {
  ptrdiff_t blk, nblk;
  size_t npl = (size_t)n * (size_t)c;
  int nt;
  if ((dt != TT_F32 && dt != TT_BF16) || n <= 0 || c <= 0 || hw <= 0 || !x || !y)
    return tt_ref_gap_fwd(b, n, c, hw, dt, x, y); /* the reference checks and says why */
  nblk = (ptrdiff_t)((npl + CPU_BF_GAP_PLANES - 1) / CPU_BF_GAP_PLANES);
  nt = tt_cpu_threads_for(b, npl * (size_t)hw);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (blk = 0; blk < nblk; blk++) {
    size_t p0 = (size_t)blk * CPU_BF_GAP_PLANES;
    int np = npl - p0 < CPU_BF_GAP_PLANES ? (int)(npl - p0) : CPU_BF_GAP_PLANES, j;
    double s[CPU_BF_GAP_PLANES];
    cpu_bf_gap_sums(x, dt, p0, np, (size_t)hw, s);
    for (j = 0; j < np; j++) {
      float v = (float)(s[j] / (double)hw);
      if (dt == TT_F32)
        ((float *)y)[p0 + (size_t)j] = v;
      else
        ((uint16_t *)y)[p0 + (size_t)j] = tt_bf16_from_f32(v);
    }
  }
  return 0;
}

/* y[0..n) = g (beta 0) or g + beta*y */
static CPU_BF_CLONES void cpu_bf_fill_span(float g, float *y, size_t n, float beta) {
  size_t i;
  if (beta == 0.0f) {
    for (i = 0; i < n; i++) y[i] = g;
  } else {
#pragma omp simd
    for (i = 0; i < n; i++) y[i] = g + beta * y[i];
  }
}

int tt_cpu_gap_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *dy, void *dx, float beta) {
  ptrdiff_t pl, npl = (ptrdiff_t)n * c;
  int nt;
  if ((dt != TT_F32 && dt != TT_BF16) || n <= 0 || c <= 0 || hw <= 0 || !dy || !dx)
    return tt_ref_gap_bwd(b, n, c, hw, dt, dy, dx, beta);
  nt = tt_cpu_threads_for(b, (size_t)npl * (size_t)hw);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (pl = 0; pl < npl; pl++) {
    size_t off = (size_t)pl * (size_t)hw, k0;
    if (dt == TT_F32) {
      float g = ((const float *)dy)[pl] / (float)hw;
      cpu_bf_fill_span(g, (float *)dx + off, (size_t)hw, beta);
      continue;
    }
    {
      float g = tt_bf16_to_f32(((const uint16_t *)dy)[pl]) / (float)hw, o[CPU_BF_CHUNK];
      uint16_t *d = (uint16_t *)dx + off;
      if (beta == 0.0f) { /* one rounding for the whole plane */
        uint16_t r = tt_bf16_from_f32(g);
        for (k0 = 0; k0 < (size_t)hw; k0++) d[k0] = r;
        continue;
      }
      for (k0 = 0; k0 < (size_t)hw; k0 += CPU_BF_CHUNK) {
        size_t m = (size_t)hw - k0 < CPU_BF_CHUNK ? (size_t)hw - k0 : CPU_BF_CHUNK;
        cpu_bf_widen(d + k0, o, m);
        cpu_bf_fill_span(g, o, m, beta);
        cpu_bf_round(o, d + k0, m);
      }
    }
  }
  return 0;
}

/* ---- input normalisation: uint8 [n, c, hw] -> (v/255 - mean[c]) / std[c] in dt ---- */

static CPU_BF_CLONES void cpu_bf_norm_span(const uint8_t *s, float *d, size_t n, float m, float sd) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) d[i] = ((float)s[i] / 255.0f - m) / sd;
}

int tt_cpu_normalize_u8(tt_backend *b, int n, int c, int hw, const uint8_t *src, const float *mean, const float *std,
                        tt_dtype dt, void *dst) {
  ptrdiff_t pl, npl = (ptrdiff_t)n * c;
  int nt;
  if ((dt != TT_F32 && dt != TT_BF16) || n <= 0 || c <= 0 || hw <= 0 || !src || !mean || !std || !dst)
    return tt_ref_normalize_u8(b, n, c, hw, src, mean, std, dt, dst);
  nt = tt_cpu_threads_for(b, (size_t)npl * (size_t)hw);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (pl = 0; pl < npl; pl++) {
    int ch = (int)(pl % c);
    size_t off = (size_t)pl * (size_t)hw, k0;
    float o[CPU_BF_CHUNK];
    if (dt == TT_F32) {
      cpu_bf_norm_span(src + off, (float *)dst + off, (size_t)hw, mean[ch], std[ch]);
      continue;
    }
    for (k0 = 0; k0 < (size_t)hw; k0 += CPU_BF_CHUNK) {
      size_t m = (size_t)hw - k0 < CPU_BF_CHUNK ? (size_t)hw - k0 : CPU_BF_CHUNK;
      cpu_bf_norm_span(src + off + k0, o, m, mean[ch], std[ch]);
      cpu_bf_round(o, (uint16_t *)dst + off + k0, m);
    }
  }
  return 0;
}

/* ---- compact saves: ReLU / ReLU6 bit masks (backend.h: act_mask, act_bwd_mask) ----
 * Elementwise, so any layout; each thread's share is a multiple of 64 elements, so threads never
 * share a mask word. Bit i = (ReLU: y > 0; ReLU6: 0 < y < 6), NaN never passes, as tt_act_grad. */

/* mask words of n <= CPU_BF_CHUNK elements of y (the last word's bits past n are zero) */
static CPU_BF_CLONES void cpu_bf_mask_span(const float *y, uint32_t *mask, size_t n, int relu6) {
  size_t w, nw = (n + 31u) / 32u;
  for (w = 0; w < nw; w++) {
    size_t e = n - w * 32u < 32u ? n - w * 32u : 32u, j;
    const float *p = y + w * 32u;
    uint32_t m = 0;
    if (relu6) {
#pragma omp simd reduction(| : m)
      for (j = 0; j < e; j++) m |= (uint32_t)(p[j] > 0.0f && p[j] < 6.0f) << j;
    } else {
#pragma omp simd reduction(| : m)
      for (j = 0; j < e; j++) m |= (uint32_t)(p[j] > 0.0f) << j;
    }
    mask[w] = m;
  }
}

/* o[i] = bit i of mask ? g[i] : 0 over n <= CPU_BF_CHUNK elements starting at a word boundary */
static CPU_BF_CLONES void cpu_bf_unmask_span(const uint32_t *mask, const float *g, float *o, size_t n) {
  size_t w, nw = (n + 31u) / 32u;
  for (w = 0; w < nw; w++) { /* a word at a time: the loop over its bits vectorises */
    size_t e = n - w * 32u < 32u ? n - w * 32u : 32u, j;
    const float *gp = g + w * 32u;
    float *op = o + w * 32u;
    uint32_t m = mask[w];
#pragma omp simd
    for (j = 0; j < e; j++) op[j] = ((m >> j) & 1u) ? gp[j] : 0.0f;
  }
}

int tt_cpu_act_mask(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *y, uint32_t *mask) {
  int nt;
  if ((dt != TT_F32 && dt != TT_BF16) || (a != TT_ACT_RELU && a != TT_ACT_RELU6) || !count || !y || !mask)
    return tt_ref_act_mask(b, a, count, dt, y, mask); /* the reference checks and says why */
  nt = tt_cpu_threads_for(b, count);
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi, c0;
    float t[CPU_BF_CHUNK];
    CPU_BF_SHARE(count, &lo, &hi);
    for (c0 = lo; c0 < hi; c0 += CPU_BF_CHUNK) {
      size_t m = hi - c0 < CPU_BF_CHUNK ? hi - c0 : CPU_BF_CHUNK;
      const float *src = (const float *)y + c0;
      if (dt == TT_BF16) {
        cpu_bf_widen((const uint16_t *)y + c0, t, m);
        src = t;
      }
      cpu_bf_mask_span(src, mask + c0 / 32u, m, a == TT_ACT_RELU6);
    }
  }
  return 0;
}

int tt_cpu_act_bwd_mask(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const uint32_t *mask, const void *dy,
                        void *dx, float beta) {
  int nt;
  if ((dt != TT_F32 && dt != TT_BF16) || (a != TT_ACT_RELU && a != TT_ACT_RELU6) || !count || !mask || !dy || !dx ||
      (dx == dy && beta != 0.0f))
    return tt_ref_act_bwd_mask(b, a, count, dt, mask, dy, dx, beta);
  nt = tt_cpu_threads_for(b, count);
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi, c0;
    float g[CPU_BF_CHUNK], o[CPU_BF_CHUNK];
    CPU_BF_SHARE(count, &lo, &hi);
    for (c0 = lo; c0 < hi; c0 += CPU_BF_CHUNK) {
      size_t m = hi - c0 < CPU_BF_CHUNK ? hi - c0 : CPU_BF_CHUNK;
      if (dt == TT_F32) {
        if (beta == 0.0f) {
          cpu_bf_unmask_span(mask + c0 / 32u, (const float *)dy + c0, (float *)dx + c0, m);
        } else {
          cpu_bf_unmask_span(mask + c0 / 32u, (const float *)dy + c0, g, m);
          cpu_bf_beta_span(g, (float *)dx + c0, m, beta);
        }
        continue;
      }
      cpu_bf_widen((const uint16_t *)dy + c0, g, m);
      if (beta == 0.0f) {
        cpu_bf_unmask_span(mask + c0 / 32u, g, o, m);
      } else {
        cpu_bf_unmask_span(mask + c0 / 32u, g, g, m);
        cpu_bf_widen((const uint16_t *)dx + c0, o, m);
        cpu_bf_beta_span(g, o, m, beta);
      }
      cpu_bf_round(o, (uint16_t *)dx + c0, m);
    }
  }
  return 0;
}

/* ---- compact saves: max-pool winners (backend.h: pool_argmax, pool_bwd_idx), NCHW ----
 * pool_argmax: each window scanned in raster order with the reference's rule (the first maximum;
 * a NaN wins, the last NaN if several), typed loads and no divisions per output. pool_bwd_idx:
 * windows that do not overlap (stride >= kernel, as 2x2 stride 2), where each input position is
 * in at most one window: its window and in-window position come from per-row and per-column
 * tables made once per call, so dx = beta*dx + (idx == position ? 0 + dy : 0) needs no division
 * per element; overlapping windows (a 3x3 stride 2 stem) go to the reference's gather. */

#define CPU_BF_POOL_MAX_SIDE 4096 /* the row and column tables live on the caller's stack */

/* The common case, 2x2 windows at stride 2 without padding, a row of windows at a time (inputs
 * rows r0, r1 of fp32; bf16 rows are widened first), vectorised over the windows. */
static CPU_BF_CLONES void cpu_bf_argmax2_row(const float *r0, const float *r1, uint8_t *out, int q) {
  int ow;
#pragma omp simd
  for (ow = 0; ow < q; ow++) {
    float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], e = r1[2 * ow + 1], best = a;
    int r = 0;
    if (b > best || b != b) best = b, r = 1;
    if (c > best || c != c) best = c, r = 2;
    if (e > best || e != e) r = 3;
    out[ow] = (uint8_t)r;
  }
}

/* o0, o1: input rows 2oh, 2oh+1 of dx (w wide; a column past 2q is in no window):
 * beta*o + (winner ? 0 + g : 0) */
static CPU_BF_CLONES void cpu_bf_unpool2_row(const float *g, const uint8_t *id, float *o0, float *o1, int q, int w,
                                            float beta) {
  int iw, n = 2 * q;
  /* over the input columns (window iw/2, its column iw&1): contiguous stores, so it vectorises */
  if (beta == 0.0f) {
#pragma omp simd
    for (iw = 0; iw < n; iw++) {
      int k = id[iw >> 1], c = iw & 1;
      float gv = 0.0f + g[iw >> 1];
      o0[iw] = k == c ? gv : 0.0f;
      o1[iw] = k == c + 2 ? gv : 0.0f;
    }
    if (w > n) o0[w - 1] = 0.0f, o1[w - 1] = 0.0f;
  } else {
#pragma omp simd
    for (iw = 0; iw < n; iw++) {
      int k = id[iw >> 1], c = iw & 1;
      float gv = 0.0f + g[iw >> 1];
      o0[iw] = (k == c ? gv : 0.0f) + beta * o0[iw];
      o1[iw] = (k == c + 2 ? gv : 0.0f) + beta * o1[iw];
    }
    if (w > n) o0[w - 1] = 0.0f + beta * o0[w - 1], o1[w - 1] = 0.0f + beta * o1[w - 1];
  }
}

/* a row in no window: beta*o + 0 */
static void cpu_bf_unpool_none(float *o, int w, float beta) {
  int i;
  for (i = 0; i < w; i++) o[i] = beta != 0.0f ? 0.0f + beta * o[i] : 0.0f;
}

static int cpu_bf_pool_is_2x2(const tt_pool_desc *d) {
  return d->kh == 2 && d->kw == 2 && d->stride_h == 2 && d->stride_w == 2 && d->pad_h == 0 && d->pad_w == 0 &&
         d->w <= CPU_BF_CHUNK && d->p == d->h / 2 && d->q == d->w / 2 && d->p > 0 && d->q > 0;
}

/* one plane of pool_argmax, 2x2 stride 2 */
static void cpu_bf_argmax2_plane(const tt_pool_desc *d, tt_dtype dt, const void *x, size_t xoff, uint8_t *out) {
  float t0[CPU_BF_CHUNK], t1[CPU_BF_CHUNK];
  int oh;
  for (oh = 0; oh < d->p; oh++) {
    size_t r = xoff + (size_t)(2 * oh) * d->w;
    if (dt == TT_F32) {
      cpu_bf_argmax2_row((const float *)x + r, (const float *)x + r + d->w, out + (size_t)oh * d->q, d->q);
    } else {
      cpu_bf_widen((const uint16_t *)x + r, t0, (size_t)d->w);
      cpu_bf_widen((const uint16_t *)x + r + d->w, t1, (size_t)d->w);
      cpu_bf_argmax2_row(t0, t1, out + (size_t)oh * d->q, d->q);
    }
  }
}

/* one plane of pool_bwd_idx, 2x2 stride 2 (an odd height leaves the last row in no window) */
static void cpu_bf_unpool2_plane(const tt_pool_desc *d, tt_dtype dt, const uint8_t *id, const void *dy, size_t yoff,
                                 void *dx, size_t xoff, float beta) {
  float t0[CPU_BF_CHUNK], t1[CPU_BF_CHUNK], g[CPU_BF_CHUNK];
  int oh, w = d->w;
  for (oh = 0; oh <= d->p; oh++) {
    int rows = oh < d->p ? 2 : d->h - 2 * d->p; /* the last pass: the row in no window, if any */
    size_t r = xoff + (size_t)(2 * oh) * w, yr = yoff + (size_t)oh * d->q;
    if (!rows) break;
    if (dt == TT_F32) {
      float *o0 = (float *)dx + r;
      if (oh < d->p)
        cpu_bf_unpool2_row((const float *)dy + yr, id + yr, o0, o0 + w, d->q, w, beta);
      else
        cpu_bf_unpool_none(o0, w, beta);
      continue;
    }
    {
      uint16_t *o0 = (uint16_t *)dx + r;
      if (beta != 0.0f) {
        cpu_bf_widen(o0, t0, (size_t)w);
        if (rows == 2) cpu_bf_widen(o0 + w, t1, (size_t)w);
      }
      if (oh < d->p) {
        cpu_bf_widen((const uint16_t *)dy + yr, g, (size_t)d->q);
        cpu_bf_unpool2_row(g, id + yr, t0, t1, d->q, w, beta);
      } else {
        cpu_bf_unpool_none(t0, w, beta);
      }
      cpu_bf_round(t0, o0, (size_t)w);
      if (rows == 2) cpu_bf_round(t1, o0 + w, (size_t)w);
    }
  }
}

int tt_cpu_pool_argmax(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const void *x, uint8_t *idx) {
  ptrdiff_t pl, npl;
  int nt;
  if ((dt != TT_F32 && dt != TT_BF16) || !d || !x || !idx || d->n <= 0 || d->c <= 0 || d->kh * d->kw > 256 ||
      d->h <= 0 || d->w <= 0 || d->p <= 0 || d->q <= 0 || d->stride_h <= 0 || d->stride_w <= 0 || d->pad_h < 0 ||
      d->pad_w < 0 || 2 * d->pad_h > d->kh || 2 * d->pad_w > d->kw || d->p != (d->h + 2 * d->pad_h - d->kh) / d->stride_h + 1 ||
      d->q != (d->w + 2 * d->pad_w - d->kw) / d->stride_w + 1 || d->layout != TT_LAYOUT_NCHW)
    return tt_ref_pool_argmax(b, d, dt, x, idx); /* the reference checks and says why (NHWC: its loops walk c apart) */
  npl = (ptrdiff_t)d->n * d->c;
  nt = tt_cpu_threads_for(b, (size_t)npl * (size_t)d->h * (size_t)d->w);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (pl = 0; pl < npl; pl++) {
    size_t xoff = (size_t)pl * d->h * d->w, yoff = (size_t)pl * d->p * d->q;
    int oh, ow;
    if (cpu_bf_pool_is_2x2(d)) {
      cpu_bf_argmax2_plane(d, dt, x, xoff, idx + yoff);
      continue;
    }
    for (oh = 0; oh < d->p; oh++) {
      int h0 = oh * d->stride_h - d->pad_h, i0 = h0 < 0 ? -h0 : 0, i1 = h0 + d->kh > d->h ? d->h - h0 : d->kh;
      for (ow = 0; ow < d->q; ow++) {
        int w0 = ow * d->stride_w - d->pad_w, j0 = w0 < 0 ? -w0 : 0, j1 = w0 + d->kw > d->w ? d->w - w0 : d->kw;
        int i, j, r = -1;
        float best = -INFINITY;
        for (i = i0; i < i1; i++) {
          size_t row = xoff + (size_t)(h0 + i) * d->w + (size_t)w0;
          for (j = j0; j < j1; j++) {
            float v = dt == TT_F32 ? ((const float *)x)[row + (size_t)j] : tt_bf16_to_f32(((const uint16_t *)x)[row + (size_t)j]);
            if (r < 0 || v > best || v != v) best = v, r = i * d->kw + j;
          }
        }
        idx[yoff + (size_t)oh * d->q + ow] = (uint8_t)(r < 0 ? 0 : r);
      }
    }
  }
  return 0;
}

/* For each input row (or column) t of size: the window o it is in (-1: none) and its offset in
 * it, for windows of size k at stride s >= k after padding pad, outs windows. */
static void cpu_bf_pool_table(int size, int k, int s, int pad, int outs, int *win, int *off) {
  int t;
  for (t = 0; t < size; t++) {
    int u = t + pad, o = u / s, f = u - o * s;
    win[t] = f < k && o < outs ? o : -1;
    off[t] = f;
  }
}

int tt_cpu_pool_bwd_idx(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const uint8_t *idx, const void *dy, void *dx,
                        float beta) {
  ptrdiff_t pl, npl;
  int nt;
  int rwin[CPU_BF_POOL_MAX_SIDE], roff[CPU_BF_POOL_MAX_SIDE], cwin[CPU_BF_POOL_MAX_SIDE], coff[CPU_BF_POOL_MAX_SIDE];
  if ((dt != TT_F32 && dt != TT_BF16) || !d || !idx || !dy || !dx || d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 ||
      d->h > CPU_BF_POOL_MAX_SIDE || d->w > CPU_BF_POOL_MAX_SIDE || d->stride_h < d->kh || d->stride_w < d->kw ||
      d->kh <= 0 || d->kw <= 0 || d->pad_h < 0 || d->pad_w < 0 || 2 * d->pad_h > d->kh || 2 * d->pad_w > d->kw ||
      d->p != (d->h + 2 * d->pad_h - d->kh) / d->stride_h + 1 || d->q != (d->w + 2 * d->pad_w - d->kw) / d->stride_w + 1 ||
      d->layout != TT_LAYOUT_NCHW)
    return tt_ref_pool_bwd_idx(b, d, dt, idx, dy, dx, beta); /* overlapping windows, NHWC, or the reference says why */
  cpu_bf_pool_table(d->h, d->kh, d->stride_h, d->pad_h, d->p, rwin, roff);
  cpu_bf_pool_table(d->w, d->kw, d->stride_w, d->pad_w, d->q, cwin, coff);
  npl = (ptrdiff_t)d->n * d->c;
  nt = tt_cpu_threads_for(b, (size_t)npl * (size_t)d->h * (size_t)d->w);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (pl = 0; pl < npl; pl++) {
    size_t xoff = (size_t)pl * d->h * d->w, yoff = (size_t)pl * d->p * d->q;
    int ih, iw;
    if (cpu_bf_pool_is_2x2(d)) {
      cpu_bf_unpool2_plane(d, dt, idx, dy, yoff, dx, xoff, beta);
      continue;
    }
    for (ih = 0; ih < d->h; ih++) {
      int oh = rwin[ih], rb = roff[ih] * d->kw;
      size_t xr = xoff + (size_t)ih * d->w, yr = yoff + (size_t)(oh < 0 ? 0 : oh) * d->q;
      for (iw = 0; iw < d->w; iw++) {
        int ow = cwin[iw];
        float acc = 0.0f;
        if (oh >= 0 && ow >= 0 && idx[yr + (size_t)ow] == rb + coff[iw])
          acc += dt == TT_F32 ? ((const float *)dy)[yr + (size_t)ow] : tt_bf16_to_f32(((const uint16_t *)dy)[yr + (size_t)ow]);
        if (dt == TT_F32) {
          float *o = (float *)dx + xr + (size_t)iw;
          *o = beta != 0.0f ? acc + beta * *o : acc;
        } else {
          uint16_t *o = (uint16_t *)dx + xr + (size_t)iw;
          *o = tt_bf16_from_f32(beta != 0.0f ? acc + beta * tt_bf16_to_f32(*o) : acc);
        }
      }
    }
  }
  return 0;
}

/* ---- overflow check: any exponent field all ones (inf or NaN), as the reference tests it ---- */

static CPU_BF_CLONES int cpu_bf_any_nonfinite32(const float *x, size_t n) {
  size_t i;
  uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
  for (i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, 4);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  return bad != 0;
}

static CPU_BF_CLONES int cpu_bf_any_nonfinite16(const uint16_t *u, size_t n) {
  size_t i;
  uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
  for (i = 0; i < n; i++) bad |= (u[i] & 0x7f80u) == 0x7f80u;
  return bad != 0;
}

int tt_cpu_check_finite(tt_backend *b, size_t count, tt_dtype dt, const void *x, int32_t *flag) {
  int bad = 0, nt;
  if ((dt != TT_F32 && dt != TT_BF16) || !count || !x || !flag) return tt_ref_check_finite(b, count, dt, x, flag);
  nt = tt_cpu_threads_for(b, count);
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : bad)
  {
    size_t lo, hi;
    CPU_BF_SHARE(count, &lo, &hi);
    if (hi > lo)
      bad |= dt == TT_F32 ? cpu_bf_any_nonfinite32((const float *)x + lo, hi - lo)
                          : cpu_bf_any_nonfinite16((const uint16_t *)x + lo, hi - lo);
  }
  if (bad) flag[0] = 1;
  return 0;
}
