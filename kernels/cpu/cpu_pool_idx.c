/* kernels/cpu/cpu_pool_idx.c — the compact saves of max pooling on the CPU backend (backend.h:
 * pool_argmax, pool_bwd_idx): each window's winner as a uint8, and dx from the winners and dy,
 * as our own loops in fp32 and bf16 (cpu_vec.h), NCHW and NHWC (where a pooling writes NCHW from
 * NHWC, tt_pool_desc.y_nchw, pool_bwd_idx reads the NCHW dy); the rest, and fp16, go to the
 * reference loops. Split from cpu_pool.c (the pooling itself) at its size limit. The reference's
 * bits: the same float expressions per element. */
#include <math.h>
#include <stdio.h>

#include "cpu_internal.h"
#include "cpu_vec.h"

/* ---- compact saves: max-pool winners (backend.h: pool_argmax, pool_bwd_idx), NCHW ----
 * pool_argmax: each window scanned in raster order with the reference's rule (the first maximum;
 * a NaN wins, the last NaN if several), typed loads and no divisions per output. pool_bwd_idx:
 * windows that do not overlap (stride >= kernel, as 2x2 stride 2), where each input position is
 * in at most one window: its window and in-window position come from per-row and per-column
 * tables made once per call, so dx = beta*dx + (idx == position ? 0 + dy : 0) needs no division
 * per element; overlapping windows (a 3x3 stride 2 stem) go to the reference's gather. */

#define CPU_POOL_MAX_SIDE 4096 /* the row and column tables live on the caller's stack */

/* The common case, 2x2 windows at stride 2 without padding, a row of windows at a time (inputs
 * rows r0, r1 of fp32; bf16 rows are widened first), vectorised over the windows. */
CPU_VEC_FN(cpu_pool_argmax2_row, (const float *r0, const float *r1, uint8_t *out, int q), (r0, r1, out, q), {
  int ow;
  CPU_VEC_SIMD
  for (ow = 0; ow < q; ow++) {
    float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], e = r1[2 * ow + 1], best = a;
    int r = 0;
    if (b > best || b != b) best = b, r = 1;
    if (c > best || c != c) best = c, r = 2;
    if (e > best || e != e) r = 3;
    out[ow] = (uint8_t)r;
  }
})

/* o0, o1: input rows 2oh, 2oh+1 of dx (w wide; a column past 2q is in no window):
 * beta*o + (winner ? 0 + g : 0) */
CPU_VEC_FN(cpu_pool_unpool2_row, (const float *g, const uint8_t *id, float *o0, float *o1, int q, int w, float beta),
           (g, id, o0, o1, q, w, beta), {
  int iw, n = 2 * q;
  /* over the input columns (window iw/2, its column iw&1): contiguous stores, so it vectorises */
  if (beta == 0.0f) {
    CPU_VEC_SIMD
    for (iw = 0; iw < n; iw++) {
      int k = id[iw >> 1], c = iw & 1;
      float gv = 0.0f + g[iw >> 1];
      o0[iw] = k == c ? gv : 0.0f;
      o1[iw] = k == c + 2 ? gv : 0.0f;
    }
    if (w > n) o0[w - 1] = 0.0f, o1[w - 1] = 0.0f;
  } else {
    CPU_VEC_SIMD
    for (iw = 0; iw < n; iw++) {
      int k = id[iw >> 1], c = iw & 1;
      float gv = 0.0f + g[iw >> 1];
      o0[iw] = (k == c ? gv : 0.0f) + beta * o0[iw];
      o1[iw] = (k == c + 2 ? gv : 0.0f) + beta * o1[iw];
    }
    if (w > n) o0[w - 1] = 0.0f + beta * o0[w - 1], o1[w - 1] = 0.0f + beta * o1[w - 1];
  }
})

/* a row in no window: beta*o + 0 */
static void cpu_pool_unpool_none(float *o, int w, float beta) {
  int i;
  for (i = 0; i < w; i++) o[i] = beta != 0.0f ? 0.0f + beta * o[i] : 0.0f;
}

/* The geometry both winner loops need (the caller has checked the strides are positive): a
 * nonempty NCHW input, padding at most half a window, the output size the windows give. */
static int cpu_pool_winners_ok(const tt_pool_desc *d) {
  return d->n > 0 && d->c > 0 && d->h > 0 && d->w > 0 && d->pad_h >= 0 && d->pad_w >= 0 && 2 * d->pad_h <= d->kh &&
         2 * d->pad_w <= d->kw && d->p == (d->h + 2 * d->pad_h - d->kh) / d->stride_h + 1 &&
         d->q == (d->w + 2 * d->pad_w - d->kw) / d->stride_w + 1 && d->layout == TT_LAYOUT_NCHW;
}

static int cpu_pool_is_2x2(const tt_pool_desc *d) {
  return d->kh == 2 && d->kw == 2 && d->stride_h == 2 && d->stride_w == 2 && d->pad_h == 0 && d->pad_w == 0 &&
         d->w <= CPU_VEC_CHUNK && d->p == d->h / 2 && d->q == d->w / 2 && d->p > 0 && d->q > 0;
}

/* one plane of pool_argmax, 2x2 stride 2 */
static void cpu_pool_argmax2_plane(const tt_pool_desc *d, tt_dtype dt, const void *x, size_t xoff, uint8_t *out) {
  float t0[CPU_VEC_CHUNK], t1[CPU_VEC_CHUNK];
  int oh;
  for (oh = 0; oh < d->p; oh++) {
    size_t r = xoff + (size_t)(2 * oh) * d->w;
    if (dt == TT_F32) {
      cpu_pool_argmax2_row((const float *)x + r, (const float *)x + r + d->w, out + (size_t)oh * d->q, d->q);
    } else {
      cpu_vec_bf_widen((const uint16_t *)x + r, t0, (size_t)d->w);
      cpu_vec_bf_widen((const uint16_t *)x + r + d->w, t1, (size_t)d->w);
      cpu_pool_argmax2_row(t0, t1, out + (size_t)oh * d->q, d->q);
    }
  }
}

/* one plane of pool_bwd_idx, 2x2 stride 2 (an odd height leaves the last row in no window) */
static void cpu_pool_unpool2_plane(const tt_pool_desc *d, tt_dtype dt, const uint8_t *id, const void *dy, size_t yoff,
                                 void *dx, size_t xoff, float beta) {
  float t0[CPU_VEC_CHUNK], t1[CPU_VEC_CHUNK], g[CPU_VEC_CHUNK];
  int oh, w = d->w;
  for (oh = 0; oh <= d->p; oh++) {
    int rows = oh < d->p ? 2 : d->h - 2 * d->p; /* the last pass: the row in no window, if any */
    size_t r = xoff + (size_t)(2 * oh) * w, yr = yoff + (size_t)oh * d->q;
    if (!rows) break;
    if (dt == TT_F32) {
      float *o0 = (float *)dx + r;
      if (oh < d->p)
        cpu_pool_unpool2_row((const float *)dy + yr, id + yr, o0, o0 + w, d->q, w, beta);
      else
        cpu_pool_unpool_none(o0, w, beta);
      continue;
    }
    {
      uint16_t *o0 = (uint16_t *)dx + r;
      if (beta != 0.0f) {
        cpu_vec_bf_widen(o0, t0, (size_t)w);
        if (rows == 2) cpu_vec_bf_widen(o0 + w, t1, (size_t)w);
      }
      if (oh < d->p) {
        cpu_vec_bf_widen((const uint16_t *)dy + yr, g, (size_t)d->q);
        cpu_pool_unpool2_row(g, id + yr, t0, t1, d->q, w, beta);
      } else {
        cpu_pool_unpool_none(t0, w, beta);
      }
      cpu_vec_bf_round(t0, o0, (size_t)w);
      if (rows == 2) cpu_vec_bf_round(t1, o0 + w, (size_t)w);
    }
  }
}

/* One winner call: pool_argmax's x and idx, or pool_bwd_idx's idx (as cidx), dy, dx, beta and
 * its row and column tables (cpu_pool_table). */
typedef struct cpu_pool_job {
  const tt_pool_desc *d;
  tt_dtype dt;
  const void *x;
  uint8_t *idx;
  const uint8_t *cidx;
  const void *dy;
  void *dx;
  float beta;
  const int *rwin, *roff, *cwin, *coff;
} cpu_pool_job;

/* pool_argmax on the plane at xoff (x) and yoff (idx): each window scanned in raster order */
static void cpu_pool_argmax_plane(const cpu_pool_job *J, size_t xoff, size_t yoff) {
  const tt_pool_desc *d = J->d;
  const tt_dtype dt = J->dt;
  const void *x = J->x;
  int oh, ow;
  if (cpu_pool_is_2x2(d)) {
    cpu_pool_argmax2_plane(d, dt, x, xoff, J->idx + yoff);
    return;
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
      J->idx[yoff + (size_t)oh * d->q + ow] = (uint8_t)(r < 0 ? 0 : r);
    }
  }
}

/* pool_bwd_idx on the plane at xoff (dx) and yoff (idx, dy): each input position from its window
 * and in-window position (the tables) */
static void cpu_pool_unpool_plane(const cpu_pool_job *J, size_t xoff, size_t yoff) {
  const tt_pool_desc *d = J->d;
  const tt_dtype dt = J->dt;
  const float beta = J->beta;
  int ih, iw;
  if (cpu_pool_is_2x2(d)) {
    cpu_pool_unpool2_plane(d, dt, J->cidx, J->dy, yoff, J->dx, xoff, beta);
    return;
  }
  for (ih = 0; ih < d->h; ih++) {
    int oh = J->rwin[ih], rb = J->roff[ih] * d->kw;
    size_t xr = xoff + (size_t)ih * d->w, yr = yoff + (size_t)(oh < 0 ? 0 : oh) * d->q;
    for (iw = 0; iw < d->w; iw++) {
      int ow = J->cwin[iw];
      float acc = 0.0f;
      if (oh >= 0 && ow >= 0 && J->cidx[yr + (size_t)ow] == rb + J->coff[iw])
        acc += dt == TT_F32 ? ((const float *)J->dy)[yr + (size_t)ow]
                            : tt_bf16_to_f32(((const uint16_t *)J->dy)[yr + (size_t)ow]);
      if (dt == TT_F32) {
        float *o = (float *)J->dx + xr + (size_t)iw;
        *o = beta != 0.0f ? acc + beta * *o : acc;
      } else {
        uint16_t *o = (uint16_t *)J->dx + xr + (size_t)iw;
        *o = tt_bf16_from_f32(beta != 0.0f ? acc + beta * tt_bf16_to_f32(*o) : acc);
      }
    }
  }
}

/* Runs plane over every (sample, channel) plane of J's tensors, a plane per thread at a time */
static void cpu_pool_planes(tt_backend *b, const cpu_pool_job *J, void (*plane)(const cpu_pool_job *, size_t, size_t)) {
  const tt_pool_desc *d = J->d;
  ptrdiff_t pl, npl = (ptrdiff_t)d->n * d->c;
  int nt = tt_cpu_threads_for(b, (size_t)npl * (size_t)d->h * (size_t)d->w);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (pl = 0; pl < npl; pl++) plane(J, (size_t)pl * d->h * d->w, (size_t)pl * d->p * d->q);
}

/* ---- compact saves on NHWC: winners an output row at a time, dx gathered an input row at a time ----
 * x [n, h, w, c], idx and dy [n, p, q, c]: a pixel's channels are contiguous, so every loop runs
 * over the channels in chunks (bf16 widened first) and vectorises; the reference walks each
 * channel's plane c elements apart. pool_bwd_idx gathers, as the reference does: each dx element
 * sums its covering windows' terms in (oh, ow) order and is stored once with beta, so bf16 rounds
 * once and overlapping windows (the 3x3 stride 2 stem) need no scatter. */

/* idx row oh (uint8, [q, c]) of one sample's x [h, w, c]: each window's first maximum as its
 * in-window position (the reference's rule: a NaN wins, the last NaN if several; an all-padding
 * window stores 0) */
CPU_VEC_FN(cpu_pool_argmax_nhwc_row, (const tt_pool_desc *d, tt_dtype dt, const void *x, uint8_t *idx, int oh),
           (d, dt, x, idx, oh), {
  int c = d->c, ow, ih, iw;
  int r0 = oh * d->stride_h - d->pad_h, h0 = r0 < 0 ? 0 : r0, h1 = r0 + d->kh > d->h ? d->h : r0 + d->kh;
  float best[CPU_VEC_CHUNK], buf[CPU_VEC_CHUNK];
  int win[CPU_VEC_CHUNK];
  for (ow = 0; ow < d->q; ow++) {
    int c0 = ow * d->stride_w - d->pad_w, w0 = c0 < 0 ? 0 : c0, w1 = c0 + d->kw > d->w ? d->w : c0 + d->kw;
    for (int k0 = 0; k0 < c; k0 += CPU_VEC_CHUNK) {
      int e = c - k0 < CPU_VEC_CHUNK ? c - k0 : CPU_VEC_CHUNK, k;
      uint8_t *o = idx + (size_t)ow * c + k0;
      for (k = 0; k < e; k++) best[k] = -INFINITY, win[k] = -1;
      for (ih = h0; ih < h1; ih++)
        for (iw = w0; iw < w1; iw++) {
          int t = (ih - r0) * d->kw + (iw - c0);
          const float *v = cpu_vec_view(dt, x, ((size_t)ih * d->w + iw) * c + k0, buf, (size_t)e);
          CPU_VEC_SIMD for (k = 0; k < e; k++) {
            int take = (win[k] < 0) | (v[k] > best[k]) | (v[k] != v[k]);
            best[k] = take ? v[k] : best[k];
            win[k] = take ? t : win[k];
          }
        }
      CPU_VEC_SIMD for (k = 0; k < e; k++) o[k] = (uint8_t)(win[k] < 0 ? 0 : win[k]);
    }
  }
})

/* dx row ih ([w, c]) of one sample from the winners idx and dy ([p, q, c]; [c, p, q] where the
 * pooling wrote NCHW, d->y_nchw: each chunk's channels gathered p*q apart, widened exactly) of
 * the output rows whose windows hold it: dx = sum of dy over the windows that picked the element,
 * in (oh, ow) order from +0.0, plus beta * dx (the reference's expression; a sum from +0.0 is
 * never -0.0, so adding 0.0f for a window that did not pick the element changes no bit) */
CPU_VEC_FN(cpu_pool_gather_nhwc_row, (const tt_pool_desc *d, tt_dtype dt, const uint8_t *idx, const void *dy, void *dx,
                                      float beta, int ih),
           (d, dt, idx, dy, dx, beta, ih), {
  int c = d->c, iw, oh, ow, oh0, oh1, ow0, ow1;
  float acc[CPU_VEC_CHUNK], gbuf[CPU_VEC_CHUNK], obuf[CPU_VEC_CHUNK];
  tt_ref_pool_covering(ih, d->pad_h, d->kh, d->stride_h, d->p, &oh0, &oh1);
  for (iw = 0; iw < d->w; iw++) {
    tt_ref_pool_covering(iw, d->pad_w, d->kw, d->stride_w, d->q, &ow0, &ow1);
    for (int k0 = 0; k0 < c; k0 += CPU_VEC_CHUNK) {
      int e = c - k0 < CPU_VEC_CHUNK ? c - k0 : CPU_VEC_CHUNK, k;
      size_t xo = ((size_t)ih * d->w + iw) * c + k0;
      for (k = 0; k < e; k++) acc[k] = 0.0f;
      for (oh = oh0; oh <= oh1; oh++)
        for (ow = ow0; ow <= ow1; ow++) {
          size_t yo = ((size_t)oh * d->q + ow) * c + k0, pq = (size_t)d->p * d->q;
          int me = (ih - (oh * d->stride_h - d->pad_h)) * d->kw + (iw - (ow * d->stride_w - d->pad_w));
          const float *g = gbuf;
          if (!d->y_nchw) g = cpu_vec_view(dt, dy, yo, gbuf, (size_t)e);
          else
            for (k = 0; k < e; k++) {
              size_t o = (size_t)(k0 + k) * pq + (size_t)oh * d->q + ow;
              gbuf[k] = dt == TT_F32 ? ((const float *)dy)[o] : tt_bf16_to_f32(((const uint16_t *)dy)[o]);
            }
          const uint8_t *id = idx + yo;
          CPU_VEC_SIMD for (k = 0; k < e; k++) acc[k] += id[k] == me ? g[k] : 0.0f;
        }
      if (beta != 0.0f) {
        const float *a = cpu_vec_view(dt, dx, xo, obuf, (size_t)e);
        CPU_VEC_SIMD for (k = 0; k < e; k++) acc[k] = acc[k] + beta * a[k];
      }
      if (dt == TT_F32) memcpy((float *)dx + xo, acc, (size_t)e * sizeof(float));
      else cpu_vec_narrow(dt, acc, dx, xo, (size_t)e);
    }
  }
})

/* Whether the NHWC winner loops run d: fp32 or bf16 (checked by the caller), windows of at most
 * 256 taps, the reference's output size, padding under half the window. */
static int cpu_pool_winners_nhwc(const tt_pool_desc *d) {
  return d->layout == TT_LAYOUT_NHWC && d->n > 0 && d->c > 0 && d->h > 0 && d->w > 0 && d->kh > 0 && d->kw > 0 &&
         d->kh * d->kw <= 256 && d->stride_h > 0 && d->stride_w > 0 && d->pad_h >= 0 && d->pad_w >= 0 &&
         2 * d->pad_h <= d->kh && 2 * d->pad_w <= d->kw && d->p == (d->h + 2 * d->pad_h - d->kh) / d->stride_h + 1 &&
         d->q == (d->w + 2 * d->pad_w - d->kw) / d->stride_w + 1;
}

/* pool_argmax (bwd 0: rows of n * p outputs) or pool_bwd_idx (bwd 1: rows of n * h inputs) on NHWC,
 * a row per task: every output element is written by one thread */
static void cpu_pool_winners_nhwc_run(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const void *x, uint8_t *idx,
                                      const uint8_t *cidx, const void *dy, void *dx, float beta) {
  size_t es = dt == TT_F32 ? 4 : 2, cx = (size_t)d->h * d->w * d->c, cy = (size_t)d->p * d->q * d->c;
  int rows = x ? d->p : d->h;
  ptrdiff_t i, count = (ptrdiff_t)d->n * rows;
  int nt = tt_cpu_threads_for(b, (size_t)d->n * cx);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (i = 0; i < count; i++) {
    size_t n = (size_t)i / (size_t)rows;
    int r = (int)(i % rows);
    if (x)
      cpu_pool_argmax_nhwc_row(d, dt, (const char *)x + n * cx * es, idx + n * cy + (size_t)r * d->q * d->c, r);
    else
      cpu_pool_gather_nhwc_row(d, dt, cidx + n * cy, (const char *)dy + n * cy * es, (char *)dx + n * cx * es, beta, r);
  }
}

int tt_cpu_pool_argmax(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const void *x, uint8_t *idx) {
  cpu_pool_job J;
  tt_pool_desc in;
  if (d && d->y_nchw) { /* the winners depend on x alone (NHWC), not on y's layout */
    in = *d, in.y_nchw = 0;
    return tt_cpu_pool_argmax(b, &in, dt, x, idx);
  }
  if ((dt == TT_F32 || dt == TT_BF16) && d && x && idx && cpu_pool_winners_nhwc(d)) {
    cpu_pool_winners_nhwc_run(b, d, dt, x, idx, NULL, NULL, NULL, 0.0f);
    return 0;
  }
  if ((dt != TT_F32 && dt != TT_BF16) || !d || !x || !idx || d->kh * d->kw > 256 || d->p <= 0 || d->q <= 0 ||
      d->stride_h <= 0 || d->stride_w <= 0 || !cpu_pool_winners_ok(d))
    return tt_ref_pool_argmax(b, d, dt, x, idx); /* the reference checks and says why (NHWC: its loops walk c apart) */
  memset(&J, 0, sizeof J);
  J.d = d, J.dt = dt, J.x = x, J.idx = idx;
  cpu_pool_planes(b, &J, cpu_pool_argmax_plane);
  return 0;
}

/* For each input row (or column) t of size: the window o it is in (-1: none) and its offset in
 * it, for windows of size k at stride s >= k after padding pad, outs windows. */
static void cpu_pool_table(int size, int k, int s, int pad, int outs, int *win, int *off) {
  int t;
  for (t = 0; t < size; t++) {
    int u = t + pad, o = u / s, f = u - o * s;
    win[t] = f < k && o < outs ? o : -1;
    off[t] = f;
  }
}

int tt_cpu_pool_bwd_idx(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const uint8_t *idx, const void *dy, void *dx,
                        float beta) {
  cpu_pool_job J;
  int rwin[CPU_POOL_MAX_SIDE], roff[CPU_POOL_MAX_SIDE], cwin[CPU_POOL_MAX_SIDE], coff[CPU_POOL_MAX_SIDE];
  if ((dt == TT_F32 || dt == TT_BF16) && d && idx && dy && dx && cpu_pool_winners_nhwc(d)) {
    cpu_pool_winners_nhwc_run(b, d, dt, NULL, NULL, idx, dy, dx, beta);
    return 0;
  }
  if (d && d->y_nchw) /* lowering saves such a pooling's winners only in fp32 and bf16 (lower.c) */
    return tt_ref_fail(b, "pool_bwd_idx: y_nchw (an NCHW dy from NHWC winners) runs only in fp32 and bf16 with "
                       "NHWC x (layout 1), windows of at most 256 taps; got %s, layout %d", tt_dtype_name(dt), d->layout);
  if ((dt != TT_F32 && dt != TT_BF16) || !d || !idx || !dy || !dx || d->h > CPU_POOL_MAX_SIDE ||
      d->w > CPU_POOL_MAX_SIDE || d->stride_h < d->kh || d->stride_w < d->kw || d->kh <= 0 || d->kw <= 0 ||
      !cpu_pool_winners_ok(d))
    return tt_ref_pool_bwd_idx(b, d, dt, idx, dy, dx, beta); /* overlapping windows, NHWC, or the reference says why */
  cpu_pool_table(d->h, d->kh, d->stride_h, d->pad_h, d->p, rwin, roff);
  cpu_pool_table(d->w, d->kw, d->stride_w, d->pad_w, d->q, cwin, coff);
  memset(&J, 0, sizeof J);
  J.d = d, J.dt = dt, J.cidx = idx, J.dy = dy, J.dx = dx, J.beta = beta;
  J.rwin = rwin, J.roff = roff, J.cwin = cwin, J.coff = coff;
  cpu_pool_planes(b, &J, cpu_pool_unpool_plane);
  return 0;
}
