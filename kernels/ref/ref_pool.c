/* kernels/ref/ref_pool.c — pooling: max and average over windows (tt_pool_desc), the compact
 * max-pool winners (argmax as in-window positions) and their backward, and global average
 * pooling ([n, c, hw] -> [n, c]).
 *
 * All loops are parallel over (sample, channel) planes and every reduction is serial inside its
 * task, so results do not depend on the thread count. 16-bit tensors are converted per element;
 * no workspace is needed.
 */
#include <math.h>

#include "ref_internal.h"

/* Plane pl (sample pl / c, channel pl % c) of x and y: where its first element is and the
 * distance between its consecutive elements (NCHW: planes are contiguous; NHWC, only given where
 * nhwc_pool allows it: the channel's elements are c apart). */
static void ref_pool_plane(const tt_pool_desc *d, ptrdiff_t pl, size_t *xoff, size_t *yoff, size_t *es) {
  if (d->layout == TT_LAYOUT_NHWC) {
    size_t n = (size_t)pl / (size_t)d->c, ch = (size_t)pl % (size_t)d->c;
    *xoff = n * (size_t)d->h * d->w * d->c + ch, *yoff = n * (size_t)d->p * d->q * d->c + ch, *es = (size_t)d->c;
  } else {
    *xoff = (size_t)pl * d->h * d->w, *yoff = (size_t)pl * d->p * d->q, *es = 1;
  }
}

/* The input rows [*h0, *h1) and columns [*w0, *w1) of window (oh, ow), clipped to the plane
 * (padding holds nothing). */
static void ref_pool_window(const tt_pool_desc *d, int oh, int ow, int *h0, int *h1, int *w0, int *w1) {
  int r0 = oh * d->stride_h - d->pad_h, c0 = ow * d->stride_w - d->pad_w;
  int r1 = r0 + d->kh, c1 = c0 + d->kw;
  *h0 = r0 < 0 ? 0 : r0;
  *w0 = c0 < 0 ? 0 : c0;
  *h1 = r1 > d->h ? d->h : r1;
  *w1 = c1 > d->w ? d->w : c1;
}

/* The checks every windowed pooling call makes: dtype, descriptor (mode), and a layout this
 * backend runs (NCHW, or NHWC where nhwc_pool allows it). */
static int ref_pool_check(tt_backend *b, const char *op, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt) {
  char msg[256];
  if (tt_ref_dt_check(b, op, dt)) return -1;
  if (tt_pool_desc_error(op, d, mode, TT_F32, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg); /* dtype checked above: the shared check predates bf16 */
  if (d->layout != TT_LAYOUT_NCHW && !((tt_ref_state *)b->impl)->nhwc_pool)
    return tt_ref_fail(b, "%s: layout %s: the reference backend runs NCHW only", op, tt_layout_name(d->layout));
  return 0;
}

/* First maximum of window (oh, ow) in the plane starting at xoff (elements es apart), as an index
 * into the plane; NaN wins (PyTorch propagates NaN). Returns -1 only for an all-padding window. */
static ptrdiff_t ref_pool_argmax(const tt_pool_desc *d, tt_dtype dt, const void *x, size_t xoff, size_t es, int oh, int ow,
                                 float *best_out) {
  int h0, h1, w0, w1, ih, iw;
  ptrdiff_t arg = -1;
  float best = -INFINITY;
  ref_pool_window(d, oh, ow, &h0, &h1, &w0, &w1);
  for (ih = h0; ih < h1; ih++)
    for (iw = w0; iw < w1; iw++) {
      size_t i = (size_t)ih * d->w + iw;
      float v = tt_ref_ld(dt, x, xoff + i * es);
      if (arg < 0 || v > best || v != v) {
        best = v;
        arg = (ptrdiff_t)i;
      }
    }
  *best_out = best;
  return arg;
}

int tt_ref_pool_fwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, void *y,
                    void *ws, size_t ws_bytes) {
  ptrdiff_t pl, npl;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_pool_check(b, "pool_fwd", d, mode, dt)) return -1;
  if (!x || !y) return tt_ref_fail(b, "pool_fwd: NULL x or y");
  npl = (ptrdiff_t)d->n * d->c;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (pl = 0; pl < npl; pl++) {
    size_t xoff, yoff, es;
    ref_pool_plane(d, pl, &xoff, &yoff, &es);
    float inv = 1.0f / (float)(d->kh * d->kw); /* count_include_pad: the full window */
    int oh, ow;
    for (oh = 0; oh < d->p; oh++)
      for (ow = 0; ow < d->q; ow++) {
        float v;
        if (mode == TT_POOL_MAX) {
          ref_pool_argmax(d, dt, x, xoff, es, oh, ow, &v);
        } else {
          int h0, h1, w0, w1, ih, iw;
          float s = 0.0f;
          ref_pool_window(d, oh, ow, &h0, &h1, &w0, &w1);
          for (ih = h0; ih < h1; ih++)
            for (iw = w0; iw < w1; iw++) s += tt_ref_ld(dt, x, xoff + ((size_t)ih * d->w + iw) * es);
          v = s * inv;
        }
        tt_ref_st(dt, y, yoff + ((size_t)oh * d->q + ow) * es, v);
      }
  }
  return 0;
}

/* Gather form: each dx element sums the windows that contain it (in oh, ow order), so it
 * is written exactly once, with beta, and fp16 accumulates in fp32. */
int tt_ref_pool_bwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x,
                    const void *dy, void *dx, float beta, void *ws, size_t ws_bytes) {
  ptrdiff_t pl, npl;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_pool_check(b, "pool_bwd", d, mode, dt)) return -1;
  if ((mode == TT_POOL_MAX && !x) || !dy || !dx) return tt_ref_fail(b, "pool_bwd: NULL x (max), dy or dx");
  npl = (ptrdiff_t)d->n * d->c;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (pl = 0; pl < npl; pl++) {
    size_t xoff, yoff, es;
    ref_pool_plane(d, pl, &xoff, &yoff, &es);
    float inv = 1.0f / (float)(d->kh * d->kw);
    int ih, iw;
    for (ih = 0; ih < d->h; ih++) {
      int oh0, oh1;
      tt_ref_pool_covering(ih, d->pad_h, d->kh, d->stride_h, d->p, &oh0, &oh1);
      for (iw = 0; iw < d->w; iw++) {
        int ow0, ow1, oh, ow;
        ptrdiff_t me = (ptrdiff_t)ih * d->w + iw;
        float acc = 0.0f;
        tt_ref_pool_covering(iw, d->pad_w, d->kw, d->stride_w, d->q, &ow0, &ow1);
        for (oh = oh0; oh <= oh1; oh++)
          for (ow = ow0; ow <= ow1; ow++) {
            float g = tt_ref_ld(dt, dy, yoff + ((size_t)oh * d->q + ow) * es), bv;
            if (mode == TT_POOL_MAX) {
              if (ref_pool_argmax(d, dt, x, xoff, es, oh, ow, &bv) == me) acc += g;
            } else {
              acc += g * inv;
            }
          }
        tt_ref_st_beta(dt, dx, xoff + (size_t)me * es, acc, beta);
      }
    }
  }
  return 0;
}

/* The winners of ref_pool_argmax as in-window positions; an all-padding window stores 0
 * (its gradient goes nowhere: no input position is in it). */
int tt_ref_pool_argmax(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const void *x, uint8_t *idx) {
  ptrdiff_t pl, npl;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_pool_check(b, "pool_argmax", d, TT_POOL_MAX, dt)) return -1;
  if (d->kh * d->kw > 256) return tt_ref_fail(b, "pool_argmax: a %dx%d window has no uint8 index", d->kh, d->kw);
  if (!x || !idx) return tt_ref_fail(b, "pool_argmax: NULL x or idx");
  npl = (ptrdiff_t)d->n * d->c;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (pl = 0; pl < npl; pl++) {
    size_t xoff, yoff, es;
    ref_pool_plane(d, pl, &xoff, &yoff, &es);
    int oh, ow;
    float v;
    for (oh = 0; oh < d->p; oh++)
      for (ow = 0; ow < d->q; ow++) {
        ptrdiff_t a = ref_pool_argmax(d, dt, x, xoff, es, oh, ow, &v);
        int r = 0;
        if (a >= 0) r = ((int)(a / d->w) - (oh * d->stride_h - d->pad_h)) * d->kw + ((int)(a % d->w) - (ow * d->stride_w - d->pad_w));
        idx[yoff + ((size_t)oh * d->q + ow) * es] = (uint8_t)r;
      }
  }
  return 0;
}

/* tt_ref_pool_bwd's gather, the winner read from idx. */
int tt_ref_pool_bwd_idx(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const uint8_t *idx, const void *dy, void *dx,
                        float beta) {
  ptrdiff_t pl, npl;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_pool_check(b, "pool_bwd_idx", d, TT_POOL_MAX, dt)) return -1;
  if (!idx || !dy || !dx) return tt_ref_fail(b, "pool_bwd_idx: NULL idx, dy or dx");
  npl = (ptrdiff_t)d->n * d->c;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (pl = 0; pl < npl; pl++) {
    size_t xoff, yoff, es;
    ref_pool_plane(d, pl, &xoff, &yoff, &es);
    int ih, iw;
    for (ih = 0; ih < d->h; ih++) {
      int oh0, oh1;
      tt_ref_pool_covering(ih, d->pad_h, d->kh, d->stride_h, d->p, &oh0, &oh1);
      for (iw = 0; iw < d->w; iw++) {
        int ow0, ow1, oh, ow;
        float acc = 0.0f;
        tt_ref_pool_covering(iw, d->pad_w, d->kw, d->stride_w, d->q, &ow0, &ow1);
        for (oh = oh0; oh <= oh1; oh++)
          for (ow = ow0; ow <= ow1; ow++) {
            size_t yi = yoff + ((size_t)oh * d->q + ow) * es;
            int me = (ih - (oh * d->stride_h - d->pad_h)) * d->kw + (iw - (ow * d->stride_w - d->pad_w));
            if (idx[yi] == me) acc += tt_ref_ld(dt, dy, yi);
          }
        tt_ref_st_beta(dt, dx, xoff + ((size_t)ih * d->w + iw) * es, acc, beta);
      }
    }
  }
  return 0;
}

/* --------------------------- global average pooling ----------------------------------- */

int tt_ref_gap_fwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, void *y) {
  ptrdiff_t pl, npl = (ptrdiff_t)n * c;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (tt_ref_nchw_check(b, "gap_fwd", n, c, hw, dt)) return -1;
  if (!x || !y) return tt_ref_fail(b, "gap_fwd: NULL x or y");
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)npl * hw > TT_REF_PAR_MIN)
  for (pl = 0; pl < npl; pl++) {
    size_t off = (size_t)pl * hw, k;
    double s = 0.0;
    for (k = 0; k < (size_t)hw; k++) s += tt_ref_ld(dt, x, off + k);
    tt_ref_st(dt, y, (size_t)pl, (float)(s / (double)hw));
  }
  return 0;
}

int tt_ref_gap_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *dy, void *dx, float beta) {
  ptrdiff_t pl, npl = (ptrdiff_t)n * c;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (tt_ref_nchw_check(b, "gap_bwd", n, c, hw, dt)) return -1;
  if (!dy || !dx) return tt_ref_fail(b, "gap_bwd: NULL dy or dx");
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)npl * hw > TT_REF_PAR_MIN)
  for (pl = 0; pl < npl; pl++) {
    size_t off = (size_t)pl * hw, k;
    float g = tt_ref_ld(dt, dy, (size_t)pl) / (float)hw;
    for (k = 0; k < (size_t)hw; k++) tt_ref_st_beta(dt, dx, off + k, g, beta);
  }
  return 0;
}
