/* kernels/ref/ref_conv.c — convolution on OpenBLAS sgemm (tt_ref_sgemm, ref_linear.c).
 *
 * Convolution strategy: im2col over a chunk of `nb` samples into one column matrix
 *   col [C*R*S, nb*P*Q]   (row = (c*R + r)*S + s, column = j*P*Q + oh*Q + ow)
 * so each group is one big sgemm with N = nb*P*Q (small 28x28 images then give gemms
 * large enough to use all threads well, instead of one tiny gemm per sample):
 *   forward      : mat[K, nb*PQ]  = W_g[Kg, Cg*R*S] * col_g,   then scatter mat -> y (+bias)
 *   backward data: col_g          = W_g^T * mat_g  (mat = dy gathered to [K, nb*PQ]),
 *                  then col2im: fp32 dx scatters per (sample, channel) plane, beta applied once
 *                  per plane first; fp16 dx gathers, each element written once
 *   backward filt: dW_g          += mat_g * col_g^T  (dW prescaled by beta once)
 *
 * Workspace rule (identical for every kind, so one desc has one chunk size):
 *   per_sample = (C*R*S + K) * P*Q * 4 bytes      (one sample's columns + its output matrix)
 *   nb = clamp(floor(32 MiB / per_sample), 1, n)  (at least one sample, at most the batch)
 *   bytes = [fp16 and bf16 only: fp32 copies of w (+ bias for forward)] + C*R*S*nb*PQ*4 + K*nb*PQ*4,
 * each part rounded up to 64 bytes. Backward filter needs no weight copy. The op computes the
 * same layout from the desc, so any ws_bytes >= conv_workspace() works. The three entry
 * points share one prologue, ref_conv_begin: checks, this layout, the fp16 weight copies.
 *
 * Determinism: chunks are processed in order, tt_ref_sgemm splits only M or N across
 * threads, db sums serially per channel (tt_ref_channel_sum); so a fixed thread count gives
 * bit-identical results.
 */
#include <cblas.h>
#include <stdlib.h>

#include "ref_internal.h"

#ifndef REF_CONV_CHUNK_BYTES
#define REF_CONV_CHUNK_BYTES ((size_t)32 << 20)
#endif

typedef struct ref_conv_plan {
  int nb;                       /* samples per chunk */
  size_t off_w, off_b;          /* fp32 copies of w and bias (fp16 only), in floats */
  size_t off_col, off_mat;      /* column matrix and [K, nb*PQ] matrix, in floats */
  size_t total_bytes;
} ref_conv_plan;

static ref_conv_plan ref_conv_make_plan(const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which) {
  ref_conv_plan pl;
  size_t crs = (size_t)d->c * d->r * d->s, pq = (size_t)d->p * d->q, wsz = (size_t)d->k * (d->c / d->groups) * d->r * d->s;
  size_t per_sample = (crs + (size_t)d->k) * pq * sizeof(float), off = 0, nb;
  nb = per_sample ? REF_CONV_CHUNK_BYTES / per_sample : 1;
  if (nb < 1) nb = 1;
  if (nb > (size_t)d->n) nb = (size_t)d->n;
  pl.nb = (int)nb;
  pl.off_w = pl.off_b = 0;
  if (dt != TT_F32 && which != TT_WS_BWD_FILTER) { /* fp16, bf16: fp32 weight copies */
    pl.off_w = off;
    off += tt_ref_round_floats(wsz);
    if (which == TT_WS_FWD) {
      pl.off_b = off;
      off += tt_ref_round_floats((size_t)d->k);
    }
  }
  pl.off_col = off;
  off += tt_ref_round_floats(crs * nb * pq);
  pl.off_mat = off;
  off += tt_ref_round_floats((size_t)d->k * nb * pq);
  pl.total_bytes = off * sizeof(float);
  return pl;
}

static int ref_conv_check(tt_backend *b, const char *op, const tt_conv_desc *d, tt_dtype dt) {
  if (!d) return tt_ref_fail(b, "%s: NULL conv desc", op);
  if (tt_ref_dt_check(b, op, dt)) return -1;
  if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->k <= 0 || d->r <= 0 || d->s <= 0 ||
      d->stride_h <= 0 || d->stride_w <= 0 || d->pad_h < 0 || d->pad_w < 0 || d->groups <= 0)
    return tt_ref_fail(b, "%s: bad conv desc (n=%d c=%d h=%d w=%d k=%d r=%d s=%d stride=%dx%d pad=%dx%d groups=%d)",
                       op, d->n, d->c, d->h, d->w, d->k, d->r, d->s, d->stride_h, d->stride_w, d->pad_h, d->pad_w,
                       d->groups);
  if (d->c % d->groups || d->k % d->groups)
    return tt_ref_fail(b, "%s: channels c=%d and k=%d must be divisible by groups=%d", op, d->c, d->k, d->groups);
  if (d->layout_x != TT_LAYOUT_NCHW || d->layout_y != TT_LAYOUT_NCHW)
    return tt_ref_fail(b, "%s: x in %s, y in %s: the reference backend runs NCHW only (its table lists no other layout, "
                       "so a plan never asks for one: pass layout_x = layout_y = 0)", op, tt_layout_name(d->layout_x),
                       tt_layout_name(d->layout_y));
  if (d->layout_w != TT_FILTER_KCRS) /* backend.h: only a backend whose filter_krsc is 1 is given KRSC */
    return tt_ref_fail(b, "%s: filter layout %d: the reference backend reads KCRS filters only (layout_w 0)", op, d->layout_w);
  if (d->h + 2 * d->pad_h < d->r || d->w + 2 * d->pad_w < d->s ||
      d->p != (d->h + 2 * d->pad_h - d->r) / d->stride_h + 1 || d->q != (d->w + 2 * d->pad_w - d->s) / d->stride_w + 1)
    return tt_ref_fail(b, "%s: output %dx%d does not match input %dx%d, kernel %dx%d, stride %dx%d, pad %dx%d", op,
                       d->p, d->q, d->h, d->w, d->r, d->s, d->stride_h, d->stride_w, d->pad_h, d->pad_w);
  return 0;
}

/* What the three entry points set up alike, filled once by ref_conv_begin. */
typedef struct ref_conv_setup {
  int nb;                /* samples per chunk (the plan's) */
  int G, K, Kg;          /* groups, output channels, output channels per group */
  size_t PQ, CgRS;       /* output positions per sample; rows of one group's columns (C/G*R*S) */
  float *col, *mat;      /* workspace: col [C*R*S, nb*PQ], mat [K, nb*PQ] */
  const float *w32;      /* w [K, C/G, R, S] in fp32: w itself, or its workspace copy (fp16); NULL if w is */
  const float *b32;      /* bias [K] in fp32 likewise; NULL if bias is */
} ref_conv_setup;

/* The prologue of conv_fwd, conv_bwd_data and conv_bwd_filter, checks in this order: the
 * desc and dtype, the tensor pointers (ptrs_ok false: "<op>: NULL <ptr_names>"), the
 * workspace against the plan for `which`. Then carves the workspace and, for fp16, converts
 * w and bias (each when non-NULL) into their fp32 copies. */
static int ref_conv_begin(tt_backend *b, const char *op, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which,
                          int ptrs_ok, const char *ptr_names, const void *w, const void *bias, void *ws,
                          size_t ws_bytes, ref_conv_setup *cs) {
  ref_conv_plan pl;
  float *wsf = (float *)ws;
  if (ref_conv_check(b, op, d, dt)) return -1;
  if (!ptrs_ok) return tt_ref_fail(b, "%s: NULL %s", op, ptr_names);
  pl = ref_conv_make_plan(d, dt, which);
  if (ws_bytes < pl.total_bytes || (pl.total_bytes && !ws))
    return tt_ref_fail(b, "%s: workspace too small: needs %zu bytes, given %zu%s", op, pl.total_bytes, ws_bytes,
                       ws ? "" : " (NULL)");
  cs->nb = pl.nb;
  cs->G = d->groups;
  cs->K = d->k;
  cs->Kg = cs->K / cs->G;
  cs->PQ = (size_t)d->p * d->q;
  cs->CgRS = (size_t)(d->c / cs->G) * d->r * d->s;
  cs->col = wsf + pl.off_col;
  cs->mat = wsf + pl.off_mat;
  cs->w32 = NULL;
  cs->b32 = NULL;
  if (dt == TT_F32) {
    cs->w32 = (const float *)w;
    cs->b32 = (const float *)bias;
  } else {
    if (w) {
      tt_ref_to_f32(b, dt, w, wsf + pl.off_w, (size_t)cs->K * cs->CgRS);
      cs->w32 = wsf + pl.off_w;
    }
    if (bias) {
      tt_ref_to_f32(b, dt, bias, wsf + pl.off_b, (size_t)cs->K);
      cs->b32 = wsf + pl.off_b;
    }
  }
  return 0;
}

size_t tt_ref_conv_workspace(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which) {
  ref_conv_plan pl;
  tt_conv_desc nchw;
  /* The answer does not depend on the layouts. It is given for a layout the table lists, which
   * this backend's own never does: `tinytrain plan` for a CUDA card not here plans with a reference
   * backend standing in, given the CUDA backend's layouts_16bit (core/runtime/session.c), so its
   * fp16/bf16 programs plan NHWC as on the card (and, with its plan_caps, KRSC weight copies). Running
   * an NHWC convolution, or one with a KRSC filter, is refused always. */
  unsigned listed = b->layouts | (dt != TT_F32 ? b->layouts_16bit : 0u);
  if (d && (listed & (1u << TT_LAYOUT_NHWC)))
    nchw = *d, nchw.layout_x = nchw.layout_y = TT_LAYOUT_NCHW, nchw.layout_w = TT_FILTER_KCRS, d = &nchw;
  if (ref_conv_check(b, "conv_workspace", d, dt)) return TT_WS_ERROR;
  if (which != TT_WS_FWD && which != TT_WS_BWD_DATA && which != TT_WS_BWD_FILTER)
    return tt_ref_fail(b, "conv_workspace: unknown workspace kind %d", (int)which), TT_WS_ERROR;
  pl = ref_conv_make_plan(d, dt, which);
  return pl.total_bytes;
}

/* The output columns ow whose input column ow*sw - pw + s lies inside [0, W), as [*lo, *hi)
 * (empty when *lo == *hi); shared by im2col and col2im so both read the same window. */
static void ref_conv_valid_cols(int W, int Q, int sw, int pw, int s, int *lo, int *hi) {
  int l = pw - s > 0 ? (pw - s + sw - 1) / sw : 0;
  int h = W - 1 + pw - s >= 0 ? (W - 1 + pw - s) / sw + 1 : 0;
  if (h > Q) h = Q;
  if (l > h) l = h;
  *lo = l;
  *hi = h;
}

/* col[(c*R+r)*S+s][j*PQ + oh*Q + ow] = x[n0+j, c, oh*sh-ph+r, ow*sw-pw+s] (0 outside). */
static void ref_conv_im2col(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *x, int n0, int cur,
                            float *col) {
  const int C = d->c, H = d->h, W = d->w, R = d->r, S = d->s, P = d->p, Q = d->q;
  const int sh = d->stride_h, sw = d->stride_w, ph = d->pad_h, pw = d->pad_w;
  const size_t PQ = (size_t)P * Q, N = (size_t)cur * PQ, HW = (size_t)H * W;
  ptrdiff_t task, ntask = (ptrdiff_t)cur * C;
  int nt = tt_ref_threads(b);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (task = 0; task < ntask; task++) {
    int j = (int)(task / C), c = (int)(task % C), r, s, oh, ow;
    size_t xoff = ((size_t)(n0 + j) * C + c) * HW;
    for (r = 0; r < R; r++) {
      for (s = 0; s < S; s++) {
        float *dst = col + ((size_t)(c * R + r) * S + s) * N + (size_t)j * PQ;
        int lo, hi;
        ref_conv_valid_cols(W, Q, sw, pw, s, &lo, &hi);
        for (oh = 0; oh < P; oh++) {
          int ih = oh * sh - ph + r;
          float *drow = dst + (size_t)oh * Q;
          if (ih < 0 || ih >= H) {
            memset(drow, 0, (size_t)Q * sizeof(float));
            continue;
          }
          for (ow = 0; ow < lo; ow++) drow[ow] = 0.0f;
          if (hi > lo) {
            /* first valid input column: lo*sw - pw + s >= 0 */
            size_t xi = xoff + (size_t)ih * W + (size_t)(lo * sw - pw + s);
            if (dt == TT_F32) {
              const float *xr = (const float *)x + xi;
              if (sw == 1)
                memcpy(drow + lo, xr, (size_t)(hi - lo) * sizeof(float));
              else
                for (ow = lo; ow < hi; ow++) drow[ow] = xr[(size_t)(ow - lo) * sw];
            } else {
              for (ow = lo; ow < hi; ow++) drow[ow] = tt_ref_ld(dt, x, xi + (size_t)(ow - lo) * sw);
            }
          }
          for (ow = hi; ow < Q; ow++) drow[ow] = 0.0f;
        }
      }
    }
  }
}

/* Scatter-form col2im for fp32: one task owns the whole plane dx[n0+j, c], scales it by beta
 * once, then adds the column rows of each (r, s) in fixed order as contiguous row segments
 * (vectorisable; the gather form below costs a branchy loop per input element). The order of
 * the sums is fixed per plane, so results stay deterministic for any thread count. */
static void ref_conv_col2im_f32(tt_backend *b, const tt_conv_desc *d, const float *col, int n0, int cur, float *dx,
                                float beta) {
  const int C = d->c, H = d->h, W = d->w, R = d->r, S = d->s, P = d->p, Q = d->q;
  const int sh = d->stride_h, sw = d->stride_w, ph = d->pad_h, pw = d->pad_w;
  const size_t PQ = (size_t)P * Q, N = (size_t)cur * PQ, HW = (size_t)H * W;
  ptrdiff_t task, ntask = (ptrdiff_t)cur * C;
  int nt = tt_ref_threads(b);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (task = 0; task < ntask; task++) {
    int j = (int)(task / C), c = (int)(task % C), r, s, oh, ow;
    float *plane = dx + ((size_t)(n0 + j) * C + c) * HW;
    const float *cbase = col + (size_t)c * R * S * N + (size_t)j * PQ;
    size_t i;
    if (beta == 0.0f)
      memset(plane, 0, HW * sizeof(float));
    else if (beta != 1.0f)
      for (i = 0; i < HW; i++) plane[i] *= beta;
    for (r = 0; r < R; r++) {
      for (s = 0; s < S; s++) {
        const float *src = cbase + (size_t)(r * S + s) * N;
        int lo, hi;
        ref_conv_valid_cols(W, Q, sw, pw, s, &lo, &hi);
        if (lo == hi) continue;
        for (oh = 0; oh < P; oh++) {
          int ih = oh * sh - ph + r;
          const float *srow;
          float *drow;
          if (ih < 0 || ih >= H) continue;
          srow = src + (size_t)oh * Q + lo;
          drow = plane + (size_t)ih * W + (size_t)(lo * sw - pw + s); /* >= 0 by the choice of lo */
          if (sw == 1)
            for (ow = 0; ow < hi - lo; ow++) drow[ow] += srow[ow];
          else
            for (ow = 0; ow < hi - lo; ow++) drow[(size_t)ow * sw] += srow[ow];
        }
      }
    }
  }
}

/* Gather-form col2im: dx[n0+j, c, ih, iw] = beta*dx + sum over (r, s) of the column entries
 * that read this input element; each dx element is written exactly once, in fixed order.
 * Used for fp16 dx, where the scatter form would need an fp32 plane per task. */
static void ref_conv_col2im(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const float *col, int n0, int cur,
                            void *dx, float beta) {
  const int C = d->c, H = d->h, W = d->w, R = d->r, S = d->s, P = d->p, Q = d->q;
  const int sh = d->stride_h, sw = d->stride_w, ph = d->pad_h, pw = d->pad_w;
  const size_t PQ = (size_t)P * Q, N = (size_t)cur * PQ, HW = (size_t)H * W;
  ptrdiff_t task, ntask = (ptrdiff_t)cur * C;
  int nt = tt_ref_threads(b);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (task = 0; task < ntask; task++) {
    int j = (int)(task / C), c = (int)(task % C), ih, iw, r, s;
    size_t xoff = ((size_t)(n0 + j) * C + c) * HW;
    const float *cbase = col + (size_t)c * R * S * N + (size_t)j * PQ;
    for (ih = 0; ih < H; ih++) {
      for (iw = 0; iw < W; iw++) {
        float acc = 0.0f;
        for (r = 0; r < R; r++) {
          int on = ih + ph - r, oh;
          if (on < 0) break;
          if (sh == 1) {
            oh = on;
          } else {
            if (on % sh) continue;
            oh = on / sh;
          }
          if (oh >= P) continue;
          for (s = 0; s < S; s++) {
            int wn = iw + pw - s, ow;
            if (wn < 0) break;
            if (sw == 1) {
              ow = wn;
            } else {
              if (wn % sw) continue;
              ow = wn / sw;
            }
            if (ow >= Q) continue;
            acc += cbase[(size_t)(r * S + s) * N + (size_t)oh * Q + ow];
          }
        }
        tt_ref_st_beta(dt, dx, xoff + (size_t)ih * W + iw, acc, beta);
      }
    }
  }
}

/* mat[k][j*PQ + pq] = t[n0+j, k, pq] (t in dt, [n, K, PQ]). */
static void ref_conv_gather(tt_backend *b, int K, size_t PQ, tt_dtype dt, const void *t, int n0, int cur,
                            float *mat) {
  const size_t N = (size_t)cur * PQ;
  ptrdiff_t task, ntask = (ptrdiff_t)cur * K;
  int nt = tt_ref_threads(b);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (task = 0; task < ntask; task++) {
    int j = (int)(task / K), k = (int)(task % K);
    size_t toff = ((size_t)(n0 + j) * K + k) * PQ, i;
    float *dst = mat + (size_t)k * N + (size_t)j * PQ;
    if (dt == TT_F32)
      memcpy(dst, (const float *)t + toff, PQ * sizeof(float));
    else
      for (i = 0; i < PQ; i++) dst[i] = tt_ref_ld(dt, t, toff + i);
  }
}

/* y[n0+j, k, pq] = mat[k][j*PQ + pq] + b32[k] (b32 may be NULL; y [n, K, PQ] in dt): the
 * inverse of ref_conv_gather, with the bias. */
static void ref_conv_scatter(tt_backend *b, int K, size_t PQ, tt_dtype dt, const float *mat, const float *b32, int n0,
                             int cur, void *y) {
  const size_t N = (size_t)cur * PQ;
  ptrdiff_t task, ntask = (ptrdiff_t)cur * K;
  int nt = tt_ref_threads(b);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (task = 0; task < ntask; task++) {
    int j = (int)(task / K), k = (int)(task % K);
    size_t yoff = ((size_t)(n0 + j) * K + k) * PQ, i;
    const float *src = mat + (size_t)k * N + (size_t)j * PQ;
    float bv = b32 ? b32[k] : 0.0f;
    if (dt == TT_F32) {
      float *yd = (float *)y + yoff;
      for (i = 0; i < PQ; i++) yd[i] = src[i] + bv;
    } else {
      for (i = 0; i < PQ; i++) tt_ref_st(dt, y, yoff + i, src[i] + bv);
    }
  }
}

int tt_ref_conv_fwd(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *x, const void *w,
                    const void *bias, void *y, void *ws, size_t ws_bytes) {
  ref_conv_setup cs;
  int n0, g;
  if (ref_conv_begin(b, "conv_fwd", d, dt, TT_WS_FWD, x && w && y, "x, w or y", w, bias, ws, ws_bytes, &cs))
    return -1;
  for (n0 = 0; n0 < d->n; n0 += cs.nb) {
    int cur = d->n - n0 < cs.nb ? d->n - n0 : cs.nb;
    size_t N = (size_t)cur * cs.PQ;
    ref_conv_im2col(b, d, dt, x, n0, cur, cs.col);
    for (g = 0; g < cs.G; g++)
      tt_ref_sgemm(b, CblasNoTrans, CblasNoTrans, cs.Kg, (int)N, (int)cs.CgRS, 1.0f,
                   cs.w32 + (size_t)g * cs.Kg * cs.CgRS, (int)cs.CgRS, cs.col + (size_t)g * cs.CgRS * N, (int)N,
                   0.0f, cs.mat + (size_t)g * cs.Kg * N, (int)N);
    ref_conv_scatter(b, cs.K, cs.PQ, dt, cs.mat, cs.b32, n0, cur, y);
  }
  return 0;
}

int tt_ref_conv_bwd_data(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *dy, const void *w,
                         void *dx, float beta, void *ws, size_t ws_bytes) {
  ref_conv_setup cs;
  int n0, g;
  if (ref_conv_begin(b, "conv_bwd_data", d, dt, TT_WS_BWD_DATA, dy && w && dx, "dy, w or dx", w, NULL, ws, ws_bytes,
                     &cs))
    return -1;
  for (n0 = 0; n0 < d->n; n0 += cs.nb) {
    int cur = d->n - n0 < cs.nb ? d->n - n0 : cs.nb;
    size_t N = (size_t)cur * cs.PQ;
    ref_conv_gather(b, cs.K, cs.PQ, dt, dy, n0, cur, cs.mat);
    for (g = 0; g < cs.G; g++)
      tt_ref_sgemm(b, CblasTrans, CblasNoTrans, (int)cs.CgRS, (int)N, cs.Kg, 1.0f,
                   cs.w32 + (size_t)g * cs.Kg * cs.CgRS, (int)cs.CgRS, cs.mat + (size_t)g * cs.Kg * N, (int)N,
                   0.0f, cs.col + (size_t)g * cs.CgRS * N, (int)N);
    if (dt == TT_F32)
      ref_conv_col2im_f32(b, d, cs.col, n0, cur, (float *)dx, beta);
    else
      ref_conv_col2im(b, d, dt, cs.col, n0, cur, dx, beta);
  }
  return 0;
}

/* dw = beta*dw once, so the chunked gemms can all accumulate with beta = 1. */
static void ref_conv_prescale(float *p, size_t count, float beta) {
  size_t i;
  if (beta == 0.0f)
    memset(p, 0, count * sizeof(float));
  else if (beta != 1.0f)
    for (i = 0; i < count; i++) p[i] *= beta;
}

int tt_ref_conv_bwd_filter(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *x, const void *dy,
                           float *dw, float *db, float beta, void *ws, size_t ws_bytes) {
  ref_conv_setup cs;
  int n0, g;
  if (ref_conv_begin(b, "conv_bwd_filter", d, dt, TT_WS_BWD_FILTER, x && dy && dw, "x, dy or dw", NULL, NULL, ws,
                     ws_bytes, &cs))
    return -1;
  ref_conv_prescale(dw, (size_t)cs.K * cs.CgRS, beta);
  for (n0 = 0; n0 < d->n; n0 += cs.nb) {
    int cur = d->n - n0 < cs.nb ? d->n - n0 : cs.nb;
    size_t N = (size_t)cur * cs.PQ;
    ref_conv_im2col(b, d, dt, x, n0, cur, cs.col);
    ref_conv_gather(b, cs.K, cs.PQ, dt, dy, n0, cur, cs.mat);
    for (g = 0; g < cs.G; g++)
      tt_ref_sgemm(b, CblasNoTrans, CblasTrans, cs.Kg, (int)cs.CgRS, (int)N, 1.0f, cs.mat + (size_t)g * cs.Kg * N,
                   (int)N, cs.col + (size_t)g * cs.CgRS * N, (int)N, 1.0f, dw + (size_t)g * cs.Kg * cs.CgRS,
                   (int)cs.CgRS);
  }
  if (db) tt_ref_channel_sum(b, d->n, cs.K, cs.PQ, dt, dy, db, beta);
  return 0;
}
