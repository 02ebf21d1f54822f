/* kernels/cpu/cpu_pool.c — pooling on the CPU backend: max pooling as our own vectorised loops
 * (fp32 and bf16, NCHW and NHWC, below); average pooling, and the backward of overlapping bf16
 * max-pool windows, as oneDNN primitives (fp32, and bf16 where oneDNN computes it:
 * tt_cpu_compute_type; dx overwritten); global average pooling as our loops in fp32 and bf16
 * (cpu_vec.h; the compact saves' max-pool winners, pool_argmax and pool_bwd_idx, are
 * cpu_pool_idx.c's); a pooling from NHWC into NCHW (y_nchw) through its workspace. fp16
 * pooling, an accumulating pooling dx and the cases named below run the reference loops (see
 * cpu_backend.c), in NCHW or NHWC (the state's nhwc_pool: the pooling loops walk a channel's
 * plane c apart).
 *
 * Pooling: max takes the first maximum, average divides by the whole window (PyTorch's
 * count_include_pad), as the reference. oneDNN's forward runs for inference (no workspace kept);
 * its max-pool backward (overlapping bf16 windows only) needs the forward's workspace, so it
 * re-runs the training forward into workspace regions first, in the same step.
 *
 * Our loops give the reference's bits: the same float expressions per element, bf16 widened
 * and rounded as cpu_vec.h does. Global average pooling sums each plane in double in index
 * order, as the reference does, eight planes at once (independent chains, no reordering).
 */
#include <math.h>
#include <stdio.h>

#include "cpu_internal.h"
#include "cpu_vec.h"

/* ---- max pooling: our loops (fp32 and bf16 storage, NCHW and NHWC, dx overwritten) ----
 * The backward finds each window's first maximum again from x and writes dy there, so it needs
 * no workspace and no second forward: oneDNN's backward needs the training forward's workspace,
 * which (kept from nothing) cost a training forward per backward, and on AVX2 oneDNN 2.6 runs
 * NCHW pooling in its slow simple_nchw form. Measured in docs/measured.md.
 *
 * The reference's bits (ref_pool.c): y is the window's maximum, NaN wins; dx[i] is 0.0f plus
 * dy of each window whose first maximum (the last NaN, if any) is i, added in (oh, ow) order.
 * Adding 0.0f for the windows that do not pick i changes no bit: a sum that starts at +0.0 is
 * never -0.0. bf16 dx is added into in place only where windows do not overlap (stride >= kernel):
 * one term per element, rounded once as the reference does; overlapping bf16 windows go to oneDNN. */

/* y row (sample n, output row oh) of an NHWC x [n, h, w, c] of fp32 or bf16: each pixel's c channels
 * at once, in chunks of CPU_VEC_CHUNK (bf16 widened into a chunk first: the comparisons then
 * vectorise as fp32's do, where bf16 loads inside the select did not) */
CPU_VEC_FN(cpu_pool_max_nhwc_row, (const tt_pool_desc *d, tt_dtype dt, const void *x, void *y, int oh),
           (d, dt, x, y, oh), {
  int c = d->c, ow, ih, iw;
  int r0 = oh * d->stride_h - d->pad_h, h0 = r0 < 0 ? 0 : r0, h1 = r0 + d->kh > d->h ? d->h : r0 + d->kh;
  float best[CPU_VEC_CHUNK], buf[CPU_VEC_CHUNK];
  for (ow = 0; ow < d->q; ow++) {
    int c0 = ow * d->stride_w - d->pad_w, w0 = c0 < 0 ? 0 : c0, w1 = c0 + d->kw > d->w ? d->w : c0 + d->kw;
    for (int k0 = 0; k0 < c; k0 += CPU_VEC_CHUNK) {
      int e = c - k0 < CPU_VEC_CHUNK ? c - k0 : CPU_VEC_CHUNK, k;
      for (k = 0; k < e; k++) best[k] = -INFINITY;
      for (ih = h0; ih < h1; ih++)
        for (iw = w0; iw < w1; iw++) {
          const float *v = cpu_vec_view(dt, x, ((size_t)ih * d->w + iw) * c + k0, buf, (size_t)e);
          CPU_VEC_SIMD for (k = 0; k < e; k++) best[k] = (v[k] > best[k]) | (v[k] != v[k]) ? v[k] : best[k];
        }
      size_t yo = ((size_t)oh * d->q + ow) * c + k0;
      if (dt == TT_F32) memcpy((float *)y + yo, best, (size_t)e * sizeof(float));
      else cpu_vec_narrow(dt, best, y, yo, (size_t)e);
    }
  }
})

/* dx of one sample of an NHWC x [h, w, c] from dy [p, q, c] (fp32 or bf16): each window's dy added
 * at its first maximum, channel by channel (the winner's tap number per lane, then a masked add per
 * tap); zeroed first unless the windows tile x (then every element is stored once: 0.0f + term) */
CPU_VEC_FN(cpu_pool_max_nhwc_bwd, (const tt_pool_desc *d, tt_dtype dt, const void *x, const void *dy, void *dx),
           (d, dt, x, dy, dx), {
  int c = d->c, oh, ow, ih, iw;
  size_t es = dt == TT_F32 ? 4 : 2;
  int tiled = d->stride_h == d->kh && d->stride_w == d->kw && !d->pad_h && !d->pad_w && d->p * d->kh == d->h &&
              d->q * d->kw == d->w;
  float best[CPU_VEC_CHUNK], buf[CPU_VEC_CHUNK], gbuf[CPU_VEC_CHUNK], acc[CPU_VEC_CHUNK];
  int win[CPU_VEC_CHUNK];
  if (!tiled) memset(dx, 0, (size_t)d->h * d->w * c * es); /* +0.0 in fp32 and bf16 */
  for (oh = 0; oh < d->p; oh++) {
    int r0 = oh * d->stride_h - d->pad_h, h0 = r0 < 0 ? 0 : r0, h1 = r0 + d->kh > d->h ? d->h : r0 + d->kh;
    for (ow = 0; ow < d->q; ow++) {
      int c0 = ow * d->stride_w - d->pad_w, w0 = c0 < 0 ? 0 : c0, w1 = c0 + d->kw > d->w ? d->w : c0 + d->kw;
      for (int k0 = 0; k0 < c; k0 += CPU_VEC_CHUNK) {
        int e = c - k0 < CPU_VEC_CHUNK ? c - k0 : CPU_VEC_CHUNK, k, t;
        const float *g = cpu_vec_view(dt, dy, ((size_t)oh * d->q + ow) * c + k0, gbuf, (size_t)e);
        for (k = 0; k < e; k++) best[k] = -INFINITY, win[k] = -1;
        for (t = 0, ih = h0; ih < h1; ih++)
          for (iw = w0; iw < w1; iw++, t++) {
            const float *v = cpu_vec_view(dt, x, ((size_t)ih * d->w + iw) * c + k0, buf, (size_t)e);
            CPU_VEC_SIMD for (k = 0; k < e; k++) {
              int take = (win[k] < 0) | (v[k] > best[k]) | (v[k] != v[k]);
              best[k] = take ? v[k] : best[k];
              win[k] = take ? t : win[k];
            }
          }
        for (t = 0, ih = h0; ih < h1; ih++)
          for (iw = w0; iw < w1; iw++, t++) {
            size_t o = ((size_t)ih * d->w + iw) * c + k0;
            if (tiled) {
              CPU_VEC_SIMD for (k = 0; k < e; k++) acc[k] = 0.0f + (win[k] == t ? g[k] : 0.0f);
            } else {
              const float *a = cpu_vec_view(dt, dx, o, acc, (size_t)e);
              CPU_VEC_SIMD for (k = 0; k < e; k++) acc[k] = a[k] + (win[k] == t ? g[k] : 0.0f);
            }
            if (dt == TT_F32) memcpy((float *)dx + o, acc, (size_t)e * sizeof(float));
            else cpu_vec_narrow(dt, acc, dx, o, (size_t)e);
          }
      }
    }
  }
})

/* 2x2 windows at stride 2 without padding on NHWC (LeNet's first pooling): output row oh of one
 * sample from input rows 2oh and 2oh + 1, a pixel's channels at a time in chunks of CPU_VEC_CHUNK
 * (bf16 widened first). The four taps a (2oh, 2ow), b (2oh, 2ow + 1), c (2oh + 1, 2ow), e
 * (2oh + 1, 2ow + 1) in the reference's raster order: the first maximum, a NaN wins (the last
 * NaN). Forward (dy NULL): y's row. Backward: the four dx pixels of each window, 0.0f + dy where
 * the tap won and 0.0f + 0.0f elsewhere (the reference's sum of one term); an odd last input row
 * (zeroed by the last output row's task) or column is in no window and gets +0.0. One pass over
 * x and dy where the general loop (cpu_pool_max_nhwc_bwd) made eight short loops and four
 * copies per window. */
/* one tap v (number t) against the window's best so far: a later maximum takes over, a NaN always */
#define CPU_POOL_TAP(v, t)                                          \
  CPU_VEC_SIMD for (k = 0; k < e; k++) {                            \
    const int take = (v[k] > best[k]) | (v[k] != v[k]);            \
    best[k] = take ? v[k] : best[k], win[k] = take ? (t) : win[k];  \
  }
CPU_VEC_FN(cpu_pool_max_nhwc2_row, (const tt_pool_desc *d, tt_dtype dt, const void *x, void *y, const void *dy, void *dx,
                                    int oh),
           (d, dt, x, y, dy, dx, oh), {
  const int c = d->c;
  const size_t w = (size_t)d->w, r0 = (size_t)(2 * oh) * w * c, r1 = r0 + w * c;
  float ba[CPU_VEC_CHUNK], bb[CPU_VEC_CHUNK], bc[CPU_VEC_CHUNK], be[CPU_VEC_CHUNK], bg[CPU_VEC_CHUNK];
  float o0[CPU_VEC_CHUNK], o1[CPU_VEC_CHUNK], o2[CPU_VEC_CHUNK], o3[CPU_VEC_CHUNK], best[CPU_VEC_CHUNK];
  int win[CPU_VEC_CHUNK];
  for (int ow = 0; ow < d->q; ow++) {
    const size_t ca = (size_t)(2 * ow) * c, cb = ca + (size_t)c, yo = ((size_t)oh * d->q + ow) * c;
    for (int k0 = 0; k0 < c; k0 += CPU_VEC_CHUNK) {
      const int e = c - k0 < CPU_VEC_CHUNK ? c - k0 : CPU_VEC_CHUNK;
      const float *a = cpu_vec_view(dt, x, r0 + ca + k0, ba, (size_t)e), *b = cpu_vec_view(dt, x, r0 + cb + k0, bb, (size_t)e);
      const float *cc = cpu_vec_view(dt, x, r1 + ca + k0, bc, (size_t)e), *ee = cpu_vec_view(dt, x, r1 + cb + k0, be, (size_t)e);
      int k;
      /* the taps in order, a pass each (a chain of selects in one loop does not vectorise under
       * GCC's default trapping math; these passes do) */
      /* fp32 writes y's and dx's elements in place (a copy per window through a buffer and
       * memcpy cost LeNet's 32-channel windows more than the selects); bf16 rounds from buffers */
      float *bo = dt == TT_F32 && !dy ? (float *)y + yo + k0 : best;
      CPU_VEC_SIMD for (k = 0; k < e; k++) bo[k] = a[k], win[k] = 0;
      {
        float *best = bo; /* CPU_POOL_TAP's running maximum */
        CPU_POOL_TAP(b, 1)
        CPU_POOL_TAP(cc, 2)
        CPU_POOL_TAP(ee, 3)
      }
      if (!dy) {
        if (dt != TT_F32) cpu_vec_narrow(dt, best, y, yo + k0, (size_t)e);
        continue;
      }
      const float *g = cpu_vec_view(dt, dy, yo + k0, bg, (size_t)e);
      float *p0 = o0, *p1 = o1, *p2 = o2, *p3 = o3;
      if (dt == TT_F32)
        p0 = (float *)dx + r0 + ca + k0, p1 = (float *)dx + r0 + cb + k0, p2 = (float *)dx + r1 + ca + k0, p3 = (float *)dx + r1 + cb + k0;
      CPU_VEC_SIMD for (k = 0; k < e; k++) { /* 0.0f + (won ? dy : 0.0f), the add hoisted out of the select */
        const float gz = 0.0f + g[k];
        p0[k] = win[k] == 0 ? gz : 0.0f, p1[k] = win[k] == 1 ? gz : 0.0f;
        p2[k] = win[k] == 2 ? gz : 0.0f, p3[k] = win[k] == 3 ? gz : 0.0f;
      }
      if (dt != TT_F32) {
        cpu_vec_narrow(dt, o0, dx, r0 + ca + k0, (size_t)e), cpu_vec_narrow(dt, o1, dx, r0 + cb + k0, (size_t)e);
        cpu_vec_narrow(dt, o2, dx, r1 + ca + k0, (size_t)e), cpu_vec_narrow(dt, o3, dx, r1 + cb + k0, (size_t)e);
      }
    }
  }
  if (dy) { /* +0.0 (fp32 and bf16 alike): an odd last column of both rows, then an odd last row */
    size_t es = dt == TT_F32 ? 4 : 2;
    if (d->w & 1) {
      memset((char *)dx + (r0 + (w - 1) * c) * es, 0, (size_t)c * es);
      memset((char *)dx + (r1 + (w - 1) * c) * es, 0, (size_t)c * es);
    }
    if ((d->h & 1) && oh == d->p - 1) memset((char *)dx + (r1 + w * c) * es, 0, w * c * es);
  }
})

/* The outputs [*lo, *hi] (empty when *lo > *hi) of [o0, o1) whose window column j is inside the
 * input: 0 <= ow * stride - pad + j < w. */
static void cpu_pool_cols(const tt_pool_desc *d, int j, int o0, int o1, int *lo, int *hi) {
  int a = d->pad_w - j, b = d->w - 1 + d->pad_w - j; /* ow * stride in [a, b] */
  int l = a <= 0 ? 0 : (a + d->stride_w - 1) / d->stride_w, h = b < 0 ? -1 : b / d->stride_w;
  *lo = l > o0 ? l : o0;
  *hi = h < o1 - 1 ? h : o1 - 1;
}

#define CPU_POOL_MAX_PLANE(sfx, T, LD, ST)                                                                      \
  /* one NCHW plane x [h, w] -> y [p, q] (forward), or dx [h, w] from dy [p, q] (backward, bwd != 0): an      \
   * output row at a time, the window's taps in the reference's (ih, iw) order, each tap over the outputs    \
   * whose window holds it (a strided load the compiler vectorises) */                                        \
  CPU_VEC_FN(cpu_pool_max_plane_##sfx, (const tt_pool_desc *d, const T *x, T *y, const T *dy, T *dx, int bwd),  \
             (d, x, y, dy, dx, bwd), {                                                                          \
    int oh, ih, j, k, lo, hi;                                                                                   \
    float z = 0.0f;                                                                                             \
    if (bwd)                                                                                                    \
      for (size_t i = 0; i < (size_t)d->h * d->w; i++) ST(dx, i, z);                                            \
    for (oh = 0; oh < d->p; oh++) {                                                                             \
      int r0 = oh * d->stride_h - d->pad_h, h0 = r0 < 0 ? 0 : r0, h1 = r0 + d->kh > d->h ? d->h : r0 + d->kh;  \
      for (int o0 = 0; o0 < d->q; o0 += CPU_VEC_CHUNK) {                                                        \
        int o1 = d->q - o0 < CPU_VEC_CHUNK ? d->q : o0 + CPU_VEC_CHUNK;                                         \
        float best[CPU_VEC_CHUNK];                                                                              \
        int win[CPU_VEC_CHUNK];                                                                                 \
        for (k = 0; k < o1 - o0; k++) best[k] = -INFINITY, win[k] = -1;                                         \
        for (ih = h0; ih < h1; ih++)                                                                            \
          for (j = 0; j < d->kw; j++) {                                                                         \
            const T *xr = x + (size_t)ih * d->w + j - d->pad_w; /* xr[ow * stride] is column ow's tap */        \
            int base = ih * d->w + j - d->pad_w, sw = d->stride_w;                                              \
            cpu_pool_cols(d, j, o0, o1, &lo, &hi);                                                              \
            if (!bwd) {                                                                                         \
              CPU_VEC_SIMD for (int ow = lo; ow <= hi; ow++) {                                                  \
                float v;                                                                                        \
                LD(xr, (ptrdiff_t)ow * sw, v);                                                                  \
                best[ow - o0] = (v > best[ow - o0]) | (v != v) ? v : best[ow - o0];                                \
              }                                                                                                 \
            } else {                                                                                            \
              CPU_VEC_SIMD for (int ow = lo; ow <= hi; ow++) {                                                  \
                float v;                                                                                        \
                LD(xr, (ptrdiff_t)ow * sw, v);                                                                  \
                int take = (win[ow - o0] < 0) | (v > best[ow - o0]) | (v != v);                                     \
                best[ow - o0] = take ? v : best[ow - o0];                                                       \
                win[ow - o0] = take ? base + ow * sw : win[ow - o0];                                            \
              }                                                                                                 \
            }                                                                                                   \
          }                                                                                                     \
        size_t yo = (size_t)oh * d->q;                                                                          \
        if (!bwd) {                                                                                             \
          for (k = o0; k < o1; k++) {                                                                           \
            float m = best[k - o0];                                                                             \
            ST(y, yo + k, m);                                                                                   \
          }                                                                                                     \
        } else {                                                                                                \
          for (k = o0; k < o1; k++) { /* in (oh, ow) order: the reference's order of the terms */              \
            float g, a;                                                                                         \
            if (win[k - o0] < 0) continue;                                                                      \
            LD(dy, yo + k, g);                                                                                  \
            LD(dx, win[k - o0], a);                                                                             \
            a += g;                                                                                             \
            ST(dx, win[k - o0], a);                                                                             \
          }                                                                                                     \
        }                                                                                                       \
      }                                                                                                         \
    }                                                                                                           \
  })
CPU_VEC_TWINS(CPU_POOL_MAX_PLANE)

/* 2x2 windows at stride 2 without padding on NCHW with h and w even (the pooling before a
 * flatten): x is then [R][2][w] rows of pairs and y [R][q], R = n*c*h/2, whatever the planes, and
 * the loops run flat over a chunk of rows, where a plane's own rows (7 outputs in LeNet) were too
 * short to vectorise. The first maximum of taps (0,0), (0,1), (1,0), (1,1) is that of each row's
 * pair, then of the two rows' winners (ties to the top row; a NaN below wins, else a NaN above):
 * the reference's order, its NaN included. Rows [r0, r0 + rr) of pairs, rr * 2w <= CPU_POOL_2X2. */
#define CPU_POOL_2X2 2048 /* x elements of one chunk */
CPU_VEC_FN(cpu_pool_max_2x2, (const tt_pool_desc *d, tt_dtype dt, const void *x, void *y, const void *dy, void *dx,
                              size_t r0, size_t rr),
           (d, dt, x, y, dy, dx, r0, rr), {
  size_t q = (size_t)d->q, w2 = 2 * (size_t)d->w, half = rr * 2 * q, k; /* half: pairs in the chunk */
  float buf[CPU_POOL_2X2], hv[CPU_POOL_2X2 / 2], gt[CPU_POOL_2X2 / 2], gbuf[CPU_POOL_2X2 / 4];
  int hc[CPU_POOL_2X2 / 2];
  const float *v = cpu_vec_view(dt, x, r0 * w2, buf, rr * w2);
  CPU_VEC_SIMD for (k = 0; k < half; k++) { /* each row's pairs: the first maximum and its column */
    float a = v[2 * k], b = v[2 * k + 1];
    int c = (b > a) | (b != b);
    hv[k] = c ? b : a;
    hc[k] = c;
  }
  if (!dy) { /* forward: the maximum of the two rows' winners */
    for (size_t rl = 0; rl < rr; rl++) {
      const float *t = hv + 2 * rl * q, *u = t + q;
      float *o = buf + rl * q; /* buf is free again: y's rows */
      for (k = 0; k < q; k++) o[k] = (u[k] > t[k]) | (u[k] != u[k]) ? u[k] : t[k];
    }
    if (dt == TT_F32) memcpy((float *)y + r0 * q, buf, rr * q * sizeof(float));
    else cpu_vec_narrow(dt, buf, y, r0 * q, rr * q);
    return;
  }
  /* backward: each pair's share of dy (the winning row's pair gets it), then each element's */
  const float *g = cpu_vec_view(dt, dy, r0 * q, gbuf, rr * q);
  for (size_t rl = 0; rl < rr; rl++) {
    const float *t = hv + 2 * rl * q, *u = t + q, *gr = g + rl * q;
    float *st = gt + 2 * rl * q, *sb = st + q;
    for (k = 0; k < q; k++) {
      int lower = (u[k] > t[k]) | (u[k] != u[k]);
      st[k] = lower ? 0.0f : gr[k];
      sb[k] = lower ? gr[k] : 0.0f;
    }
  }
  CPU_VEC_SIMD for (k = 0; k < half; k++) { /* 0.0f + the term: the reference's sum of one */
    buf[2 * k] = 0.0f + (hc[k] ? 0.0f : gt[k]);
    buf[2 * k + 1] = 0.0f + (hc[k] ? gt[k] : 0.0f);
  }
  if (dt == TT_F32) memcpy((float *)dx + r0 * w2, buf, rr * w2 * sizeof(float));
  else cpu_vec_narrow(dt, buf, dx, r0 * w2, rr * w2);
})

/* Whether our loops run this max pooling: fp32 or bf16, dx overwritten; bf16 dx only where
 * windows do not overlap (see above). */
static int cpu_pool_max_ours(const tt_op_desc *op) {
  const tt_pool_desc *d = &op->u.pool;
  if (op->pool_mode != TT_POOL_MAX || (op->dt != TT_F32 && op->dt != TT_BF16)) return 0;
  /* the forward too: oneDNN's JIT max pooling (AVX-512) is faster on NCHW (0.24 against 1.9 ms for
   * LeNet's 64x64x14x14, one thread) but lets a NaN through as vmaxps does, where the reference and
   * PyTorch propagate it; on AVX2 oneDNN 2.6 pools NCHW in its slow simple_nchw form */
  if (op->kind == TT_OP_POOL_FWD) return 1;
  return !op->accumulate && (op->dt == TT_F32 || (d->stride_h >= d->kh && d->stride_w >= d->kw));
}

/* Max pooling forward (dy == NULL) or backward by our loops, over samples (NHWC) or planes
 * (NCHW) in parallel: every output element is written by one thread in a fixed order. */
static int cpu_pool_max_run(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const void *x, void *y, const void *dy,
                            void *dx) {
  size_t es = dt == TT_F32 ? 4 : 2, xs = (size_t)d->h * d->w, ys = (size_t)d->p * d->q;
  int nhwc = d->layout == TT_LAYOUT_NHWC, bwd = dy != NULL;
  /* NCHW 2x2 at stride 2 without padding, h and w even: chunks of rows of pairs (cpu_pool_max_2x2) */
  int two = !nhwc && d->kh == 2 && d->kw == 2 && d->stride_h == 2 && d->stride_w == 2 && !d->pad_h && !d->pad_w &&
            !(d->h & 1) && !(d->w & 1) && 2 * (size_t)d->w <= CPU_POOL_2X2;
  size_t pairs = (size_t)d->n * d->c * (size_t)(d->h / 2), per = CPU_POOL_2X2 / (2 * (size_t)d->w);
  /* NHWC 2x2 at stride 2 without padding: an output row per task, backward too (cpu_pool_max_nhwc2_row) */
  int two_nhwc = nhwc && d->kh == 2 && d->kw == 2 && d->stride_h == 2 && d->stride_w == 2 && !d->pad_h && !d->pad_w &&
                 d->p == d->h / 2 && d->q == d->w / 2;
  ptrdiff_t i, count = nhwc ? (ptrdiff_t)d->n * (bwd && !two_nhwc ? 1 : d->p) : (ptrdiff_t)d->n * d->c;
  if (two) count = (ptrdiff_t)((pairs + per - 1) / per);
  int nt = tt_cpu_threads_for(b, (size_t)d->n * d->c * xs);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (i = 0; i < count; i++) {
    if (two_nhwc) {
      size_t n = (size_t)i / (size_t)d->p, cx = xs * (size_t)d->c, cy = ys * (size_t)d->c;
      cpu_pool_max_nhwc2_row(d, dt, (const char *)x + n * cx * es, bwd ? NULL : (char *)y + n * cy * es,
                             bwd ? (const char *)dy + n * cy * es : NULL, bwd ? (char *)dx + n * cx * es : NULL,
                             (int)(i % d->p));
    } else if (nhwc) {
      size_t n = bwd ? (size_t)i : (size_t)i / (size_t)d->p, cx = xs * (size_t)d->c, cy = ys * (size_t)d->c;
      int oh = bwd ? 0 : (int)(i % d->p);
      if (!bwd) cpu_pool_max_nhwc_row(d, dt, (const char *)x + n * cx * es, (char *)y + n * cy * es, oh);
      else cpu_pool_max_nhwc_bwd(d, dt, (const char *)x + n * cx * es, (const char *)dy + n * cy * es, (char *)dx + n * cx * es);
    } else if (two) {
      size_t r0 = (size_t)i * per;
      cpu_pool_max_2x2(d, dt, x, y, dy, dx, r0, pairs - r0 < per ? pairs - r0 : per);
    } else if (dt == TT_F32) {
      const float *xp = (const float *)x + (size_t)i * xs;
      cpu_pool_max_plane_f32(d, xp, bwd ? NULL : (float *)y + (size_t)i * ys, bwd ? (const float *)dy + (size_t)i * ys : NULL,
                             bwd ? (float *)dx + (size_t)i * xs : NULL, bwd);
    } else {
      const uint16_t *xp = (const uint16_t *)x + (size_t)i * xs;
      cpu_pool_max_plane_bf16(d, xp, bwd ? NULL : (uint16_t *)y + (size_t)i * ys,
                              bwd ? (const uint16_t *)dy + (size_t)i * ys : NULL, bwd ? (uint16_t *)dx + (size_t)i * xs : NULL, bwd);
    }
  }
  return 0;
}

/* ---- max and average pooling on oneDNN ---- */

/* Whether oneDNN runs a pooling op: fp32, and bf16 where oneDNN has bf16 kernels (fp16 converts
 * in the reference loops); the backward with dx overwritten only. */
int tt_cpu_pool_dnnl(const tt_op_desc *op) {
  if (cpu_pool_max_ours(op)) return 0;
  int dt_ok = op->dt == TT_F32 || tt_cpu_compute_type(op->dt) == dnnl_bf16;
  return op->kind == TT_OP_POOL_FWD ? dt_ok : dt_ok && !op->accumulate;
}

/* Pointer indices: x, y (forward); x, dy, dx (backward; x unused by average pooling). */
int tt_cpu_pool_build(tt_cpu_build *bd, const tt_op_desc *op) {
  tt_backend *b = bd->b;
  tt_cpu_call *c = bd->c;
  const tt_pool_desc *d = &op->u.pool;
  tt_cpu_variant *v = &c->v[0];
  int64_t xd[4], yd[4];
  dnnl_memory_desc_t mx, my;   /* the caller's, fp32 plain */
  dnnl_memory_desc_t px, py;   /* the primitive's: plain, in the compute type (bf16 runs bf16 pooling) */
  dnnl_data_type_t ct = tt_cpu_compute_type(op->dt);
  dnnl_format_tag_t tag = d->layout == TT_LAYOUT_NHWC ? dnnl_nhwc : dnnl_nchw; /* the caller's, kept by the primitive */
  dnnl_dims_t strides, kernel, dil, pad;
  dnnl_alg_kind_t alg = op->pool_mode == TT_POOL_MAX ? dnnl_pooling_max : dnnl_pooling_avg_include_padding;
  dnnl_pooling_v2_desc_t fd, bwd;
  dnnl_primitive_desc_t fpd, bpd;
  char msg[256];
  int t;
  snprintf(c->what, sizeof c->what, "%s %s (n=%d, %dx%dx%d -> %dx%d, kernel %dx%d, stride %dx%d, pad %dx%d, %s)",
           op->kind == TT_OP_POOL_FWD ? "pool_fwd" : "pool_bwd", op->pool_mode == TT_POOL_MAX ? "max" : "avg", d->n, d->c,
           d->h, d->w, d->p, d->q, d->kh, d->kw, d->stride_h, d->stride_w, d->pad_h, d->pad_w, tt_layout_name(d->layout));
  if (tt_ref_dt_check(b, c->what, op->dt)) return -1;
  if (tt_pool_desc_error(c->what, d, op->pool_mode, TT_F32, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg); /* dtype checked above */
  c->nb = d->n, c->nv = 1;
  v->nb = d->n;
  xd[0] = d->n, xd[1] = d->c, xd[2] = d->h, xd[3] = d->w;
  yd[0] = d->n, yd[1] = d->c, yd[2] = d->p, yd[3] = d->q;
  strides[0] = d->stride_h, strides[1] = d->stride_w, kernel[0] = d->kh, kernel[1] = d->kw;
  dil[0] = dil[1] = 0, pad[0] = d->pad_h, pad[1] = d->pad_w;
  if (tt_cpu_md(b, c->what, &mx, 4, xd, tag) || tt_cpu_md(b, c->what, &my, 4, yd, tag) ||
      tt_cpu_md_dt(b, c->what, &px, 4, xd, tag, ct) || tt_cpu_md_dt(b, c->what, &py, 4, yd, tag, ct))
    return -1;
  if (op->kind == TT_OP_POOL_FWD) {
    if (TT_CPU_DNNL(b, c->what, dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_inference, alg, &px, &py, strides, kernel,
                                                                   dil, pad, pad)) ||
        tt_cpu_pd(bd, &fd, NULL, &fpd) || tt_cpu_add_stage(bd, v, fpd))
      return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &mx, op->dt, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &my, op->dt, 1) < 0)
      return -1;
    return 0;
  }
  if (TT_CPU_DNNL(b, c->what, dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_training, alg, &px, &py, strides, kernel,
                                                                 dil, pad, pad)) ||
      TT_CPU_DNNL(b, c->what, dnnl_pooling_v2_backward_desc_init(&bwd, alg, &px, &py, strides, kernel, dil, pad, pad)) ||
      tt_cpu_pd(bd, &fd, NULL, &fpd))
    return -1;
  if (op->pool_mode == TT_POOL_AVG) { /* no workspace: the backward alone */
    int rc = tt_cpu_pd(bd, &bwd, fpd, &bpd);
    dnnl_primitive_desc_destroy(fpd);
    if (rc || tt_cpu_add_stage(bd, v, bpd)) return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &my, op->dt, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &mx, op->dt, 2) < 0)
      return -1;
    return 0;
  }
  /* max: the training forward again (y and the workspace into regions), then the backward */
  if (tt_cpu_pd(bd, &bwd, fpd, &bpd)) {
    dnnl_primitive_desc_destroy(fpd);
    return -1;
  }
  if (tt_cpu_add_stage(bd, v, fpd)) {
    dnnl_primitive_desc_destroy(bpd);
    return -1;
  }
  if (tt_cpu_add_stage(bd, v, bpd)) return -1;
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &mx, op->dt, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_WS, NULL, TT_F32, -1) < 0 ||
      (t = tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WORKSPACE, TT_CPU_WS, NULL, TT_F32, -1)) < 0 ||
      tt_cpu_add_tensor(bd, v, 1, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &my, op->dt, 1) < 0 ||
      tt_cpu_share_tensor(bd, v, 1, DNNL_ARG_WORKSPACE, t) ||
      tt_cpu_add_tensor(bd, v, 1, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &mx, op->dt, 2) < 0)
    return -1;
  return 0;
}

static void cpu_pool_op(tt_op_desc *op, tt_op_kind kind, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt) {
  memset(op, 0, sizeof *op);
  op->kind = kind, op->dt = dt, op->pool_mode = mode;
  if (d) op->u.pool = *d;
}

/* ---- a pooling that ends an NHWC group (tt_pool_desc.y_nchw): x and dx NHWC, y and dy NCHW ----
 * The pooling runs on NHWC as any other, into (forward) or from (backward) an NHWC copy of y or
 * dy at the start of its workspace, and the copy is transposed from or into the caller's NCHW
 * tensor: y is the pooled size (LeNet's last pooling: a quarter of its input), so this moves far
 * fewer bytes than the convolution before it writing NCHW and its group running NCHW did. A
 * transposition moves elements unchanged: the bits are the NHWC pooling's. */

size_t tt_cpu_pool_copy_bytes(const tt_op_desc *op) {
  const tt_pool_desc *d = &op->u.pool;
  if ((op->kind != TT_OP_POOL_FWD && op->kind != TT_OP_POOL_BWD) || !d->y_nchw || d->n <= 0 || d->c <= 0 || d->p <= 0 ||
      d->q <= 0)
    return 0;
  return ((size_t)d->n * d->c * d->p * d->q * tt_dtype_size(op->dt) + 63) / 64 * 64;
}

/* dst[s][j][i] = src[s][i][j] for every sample s < n, i < rows, j < cols; elements of T, in tiles
 * of 16 x 16 (both sides' lines stay in the cache); samples in parallel. One loop for every
 * element size (CPU_POOL_TRANSPOSE_AS). */
#define CPU_POOL_TRANSPOSE_AS(T)                                                                          \
  do {                                                                                                    \
    const T *src_ = (const T *)src;                                                                       \
    T *dst_ = (T *)dst;                                                                                   \
    ptrdiff_t s_;                                                                                         \
    _Pragma("omp parallel for schedule(static) num_threads(nt) if (nt > 1)") for (s_ = 0; s_ < n; s_++) { \
      const T *a_ = src_ + (size_t)s_ * rows * cols;                                                      \
      T *o_ = dst_ + (size_t)s_ * rows * cols;                                                            \
      for (size_t i0 = 0; i0 < rows; i0 += 16)                                                            \
        for (size_t j0 = 0; j0 < cols; j0 += 16) {                                                        \
          size_t i1 = i0 + 16 < rows ? i0 + 16 : rows, j1 = j0 + 16 < cols ? j0 + 16 : cols;              \
          for (size_t i = i0; i < i1; i++)                                                                \
            for (size_t j = j0; j < j1; j++) o_[j * rows + i] = a_[i * cols + j];                         \
        }                                                                                                 \
    }                                                                                                     \
  } while (0)
static void cpu_pool_transpose(tt_backend *b, ptrdiff_t n, size_t rows, size_t cols, size_t es, const void *src, void *dst) {
  int nt = tt_cpu_threads_for(b, (size_t)n * rows * cols * es);
  (void)nt;
  if (es == 4) CPU_POOL_TRANSPOSE_AS(uint32_t);
  else CPU_POOL_TRANSPOSE_AS(uint16_t);
}
#undef CPU_POOL_TRANSPOSE_AS

/* For a y_nchw call of kind (pool_fwd or pool_bwd): the desc without y_nchw, and the NHWC copy's
 * place, the start of ws, whose bytes go to *off (what follows is the pooling's own workspace).
 * NULL: a bad desc or dtype, or a short or missing workspace, refused with the bytes it needs. */
static void *cpu_pool_copy(tt_backend *b, tt_op_kind kind, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt,
                           tt_pool_desc *inner, void *ws, size_t ws_bytes, size_t *off) {
  tt_op_desc op;
  char msg[256];
  const char *what = kind == TT_OP_POOL_FWD ? "pool_fwd" : "pool_bwd";
  *inner = *d;
  inner->y_nchw = 0;
  if (d->y_nchw != 1 || d->layout != TT_LAYOUT_NHWC) {
    tt_ref_fail(b, "%s: y_nchw %d with layout %d: a pooling changes the layout only from NHWC (1) to NCHW", what, d->y_nchw,
                d->layout);
    return NULL;
  }
  if (tt_ref_dt_check(b, what, dt)) return NULL;
  if (tt_pool_desc_error(what, inner, mode, TT_F32, msg, sizeof msg)) {
    tt_ref_fail(b, "%s", msg);
    return NULL;
  }
  cpu_pool_op(&op, kind, d, mode, dt);
  *off = tt_cpu_pool_copy_bytes(&op);
  if (!ws || ws_bytes < *off) {
    tt_ref_fail(b, "%s (NHWC x, NCHW y): workspace of %zu bytes, the NHWC copy of %s alone needs %zu; pass what op_workspace "
                "answers", what, ws ? ws_bytes : 0, kind == TT_OP_POOL_FWD ? "y" : "dy", *off);
    return NULL;
  }
  return ws;
}

int tt_cpu_pool_fwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, void *y,
                    void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[2];
  char msg[256];
  if (d && d->y_nchw) { /* pool into the NHWC copy, then transpose each sample's [p*q, c] into y */
    tt_pool_desc in;
    size_t off;
    void *yh = cpu_pool_copy(b, TT_OP_POOL_FWD, d, mode, dt, &in, ws, ws_bytes, &off);
    if (!yh) return -1;
    if (!x || !y) return tt_ref_fail(b, "pool_fwd: NULL x or y");
    if (tt_cpu_pool_fwd(b, &in, mode, dt, x, yh, (char *)ws + off, ws_bytes - off)) return -1;
    cpu_pool_transpose(b, d->n, (size_t)d->p * d->q, (size_t)d->c, tt_dtype_size(dt), yh, y);
    return 0;
  }
  cpu_pool_op(&op, TT_OP_POOL_FWD, d, mode, dt);
  if (!d || (!tt_cpu_pool_dnnl(&op) && !cpu_pool_max_ours(&op))) return tt_ref_pool_fwd(b, d, mode, dt, x, y, ws, ws_bytes);
  if (tt_ref_dt_check(b, "pool_fwd", dt)) return -1;
  if (tt_pool_desc_error("pool_fwd", d, mode, TT_F32, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg); /* dtype checked above */
  if (!x || !y) return tt_ref_fail(b, "pool_fwd: NULL x or y");
  if (cpu_pool_max_ours(&op)) return cpu_pool_max_run(b, d, dt, x, y, NULL, NULL);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_pool_build))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = y;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, 0.0f);
}

int tt_cpu_pool_bwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x,
                    const void *dy, void *dx, float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[3];
  char msg[256];
  cpu_pool_op(&op, TT_OP_POOL_BWD, d, mode, dt);
  op.accumulate = beta != 0.0f;
  if (d && d->y_nchw) { /* transpose each sample's dy [c, p*q] into the NHWC copy, then pool back from it */
    tt_pool_desc in;
    size_t off;
    void *dyh = cpu_pool_copy(b, TT_OP_POOL_BWD, d, mode, dt, &in, ws, ws_bytes, &off);
    if (!dyh) return -1;
    if (!dy) return tt_ref_fail(b, "pool_bwd: NULL dy");
    cpu_pool_transpose(b, d->n, (size_t)d->c, (size_t)d->p * d->q, tt_dtype_size(dt), dy, dyh);
    return tt_cpu_pool_bwd(b, &in, mode, dt, x, dyh, dx, beta, (char *)ws + off, ws_bytes - off);
  }
  if (!d || (!tt_cpu_pool_dnnl(&op) && !cpu_pool_max_ours(&op)) || beta != 0.0f)
    return tt_ref_pool_bwd(b, d, mode, dt, x, dy, dx, beta, ws, ws_bytes);
  if (tt_ref_dt_check(b, "pool_bwd", dt)) return -1;
  if (tt_pool_desc_error("pool_bwd", d, mode, TT_F32, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg); /* dtype checked above */
  if ((mode == TT_POOL_MAX && !x) || !dy || !dx) return tt_ref_fail(b, "pool_bwd: NULL x (max), dy or dx");
  if (cpu_pool_max_ours(&op)) return cpu_pool_max_run(b, d, dt, x, NULL, dy, dx);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_pool_build))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = (void *)dy, ptrs[2] = dx;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, 0.0f);
}

/* ---- global average pooling: x [n, c, hw] -> y [n, c] ---- */

#define CPU_POOL_GAP_PLANES 8 /* planes summed at once: independent double chains */

/* s[j] = sum over k in index order of plane j (of np <= CPU_POOL_GAP_PLANES) of x, in double */
static void cpu_pool_gap_sums(const void *x, tt_dtype dt, size_t first_plane, int np, size_t hw, double *s) {
  size_t k;
  int j;
  for (j = 0; j < CPU_POOL_GAP_PLANES; j++) s[j] = 0.0;
  if (dt == TT_F32) {
    const float *p = (const float *)x + first_plane * hw;
    if (np == CPU_POOL_GAP_PLANES) {
      for (k = 0; k < hw; k++)
        for (j = 0; j < CPU_POOL_GAP_PLANES; j++) s[j] += p[(size_t)j * hw + k];
    } else {
      for (j = 0; j < np; j++)
        for (k = 0; k < hw; k++) s[j] += p[(size_t)j * hw + k];
    }
  } else {
    const uint16_t *p = (const uint16_t *)x + first_plane * hw;
    if (np == CPU_POOL_GAP_PLANES) {
      for (k = 0; k < hw; k++)
        for (j = 0; j < CPU_POOL_GAP_PLANES; j++) s[j] += tt_bf16_to_f32(p[(size_t)j * hw + k]);
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
  nblk = (ptrdiff_t)((npl + CPU_POOL_GAP_PLANES - 1) / CPU_POOL_GAP_PLANES);
  nt = tt_cpu_threads_for(b, npl * (size_t)hw);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (blk = 0; blk < nblk; blk++) {
    size_t p0 = (size_t)blk * CPU_POOL_GAP_PLANES;
    int np = npl - p0 < CPU_POOL_GAP_PLANES ? (int)(npl - p0) : CPU_POOL_GAP_PLANES, j;
    double s[CPU_POOL_GAP_PLANES];
    cpu_pool_gap_sums(x, dt, p0, np, (size_t)hw, s);
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
CPU_VEC_FN(cpu_pool_fill_span, (float g, float *y, size_t n, float beta), (g, y, n, beta), {
  size_t i;
  if (beta == 0.0f) {
    for (i = 0; i < n; i++) y[i] = g;
  } else {
    CPU_VEC_SIMD
    for (i = 0; i < n; i++) y[i] = g + beta * y[i];
  }
})

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
      cpu_pool_fill_span(g, (float *)dx + off, (size_t)hw, beta);
      continue;
    }
    {
      float g = tt_bf16_to_f32(((const uint16_t *)dy)[pl]) / (float)hw, o[CPU_VEC_CHUNK];
      uint16_t *d = (uint16_t *)dx + off;
      if (beta == 0.0f) { /* one rounding for the whole plane */
        uint16_t r = tt_bf16_from_f32(g);
        for (k0 = 0; k0 < (size_t)hw; k0++) d[k0] = r;
        continue;
      }
      for (k0 = 0; k0 < (size_t)hw; k0 += CPU_VEC_CHUNK) {
        size_t m = (size_t)hw - k0 < CPU_VEC_CHUNK ? (size_t)hw - k0 : CPU_VEC_CHUNK;
        cpu_vec_bf_widen(d + k0, o, m);
        cpu_pool_fill_span(g, o, m, beta);
        cpu_vec_bf_round(o, d + k0, m);
      }
    }
  }
  return 0;
}
