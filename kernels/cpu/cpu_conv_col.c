/* kernels/cpu/cpu_conv_col.c — backward weights of a convolution with few input channels (a
 * network's first layer: 1 to 7 channels) as column blocks and single-threaded sgemm calls, on
 * CPUs where oneDNN has no AVX-512 kernels.
 *
 * Why: oneDNN 2.6's AVX2 JIT backward-weights kernel pads such an input to 8 channels and runs
 * far below the machine's rate there. LeNet's first layer (128x1x28x28 -> 32, 5x5, pad 2: 161
 * MFLOP), one thread, ONEDNN_MAX_CPU_ISA=AVX2 on the AVX-512 Xeon: 15 ms a call (jit:avx2,
 * ONEDNN_VERBOSE), against 1.2 ms for its AVX-512 kernel on the same machine, where this file
 * stays out of the way. Its plain-layout alternative, oneDNN's gemm form, opens a parallel region
 * per image (cpu_conv.c's cpu_conv_act_tag says what that did beside another busy process).
 *
 * How: the output pixels, a block of whole samples at a time, become the rows of a column
 * matrix col[rows][c*r*s] (the input values each pixel's filter taps read, 0 in the padding; the
 * columns in KCRS's (c, r, s) order), and dw[k][c*r*s] += dy^T col by cblas_sgemm (OpenBLAS, one
 * thread: the backend's threads take whole blocks). Each thread sums its blocks into its own
 * fp32 partial; the partials are added into dw in thread order after, so a given thread count
 * gives the same bits every run. The bias gradient is tt_ref_channel_sum's fixed-order sum of dy.
 * Workspace: per thread one block's columns and one partial, from the arena (nothing allocated).
 * fp32 only (a first layer reads the fp32 image; 16-bit plans keep oneDNN's kernels).
 * TINYTRAIN_CONV_MATMUL=0 turns it off with the other matmul forms. */
#include <cblas.h>

#include "cpu_internal.h"

/* Output pixels per column block (rounded to whole samples, at least one): 2048 rows of at most
 * 7*r*s floats keeps a block in the L2 cache for the first layers this serves (LeNet's 5x5: 200
 * KiB). */
#define CPU_CONV_COL_ROWS 2048

/* Whether op (a backward-weights convolution) runs here: fp32, ungrouped, fewer than 8 input
 * channels, at most 7*7*7 taps per output channel, under the knob (tt_cpu_state.conv_col: -1
 * where oneDNN has no AVX-512, 1 forced by tests, 0 off). */
int tt_cpu_conv_col(tt_backend *b, const tt_op_desc *op) {
  const tt_conv_desc *d = &op->u.conv;
  int on = tt_cpu_st(b)->conv_col;
  if (on < 0) on = !tt_cpu_dnnl_has_avx512();
  return on && op->kind == TT_OP_CONV_BWD_FILTER && op->dt == TT_F32 && d->groups == 1 && d->c >= 1 && d->c < 8 &&
         d->r * d->s * d->c <= 343 && d->n > 0 && d->p > 0 && d->q > 0;
}

/* Samples per block, blocks, and the threads that share them (at most one per block). */
static void cpu_conv_col_split(tt_backend *b, const tt_conv_desc *d, int *per_block, int *blocks, int *threads) {
  size_t pq = (size_t)d->p * d->q;
  int s = pq >= CPU_CONV_COL_ROWS ? 1 : (int)(CPU_CONV_COL_ROWS / pq);
  if (s > d->n) s = d->n;
  *per_block = s;
  *blocks = (d->n + s - 1) / s;
  int nt = tt_cpu_threads_for(b, (size_t)d->n * pq * (size_t)(d->c * d->r * d->s));
  *threads = nt < *blocks ? nt : *blocks;
}

/* Bytes of one thread's share of the workspace: a block's columns and a partial dw, each
 * 64-byte aligned. */
static size_t cpu_conv_col_share(const tt_conv_desc *d, int per_block) {
  size_t crs = (size_t)d->c * d->r * d->s, col = (size_t)per_block * d->p * d->q * crs * sizeof(float);
  size_t part = (size_t)d->k * crs * sizeof(float);
  return (col + 63) / 64 * 64 + (part + 63) / 64 * 64;
}

size_t tt_cpu_conv_col_workspace(tt_backend *b, const tt_op_desc *op) {
  int s, nb, nt;
  if (!tt_cpu_conv_col(b, op)) return 0;
  cpu_conv_col_split(b, &op->u.conv, &s, &nb, &nt);
  return (size_t)nt * cpu_conv_col_share(&op->u.conv, s) + 64; /* + 64: the base aligned up */
}

/* col[j*PQ + oh*Q + ow][(ch*R + kr)*S + ks] = x[n0 + j, ch, oh*sh - ph + kr, ow*sw - pw + ks], 0
 * outside the image; x NCHW or NHWC (d->layout_x). */
static void cpu_conv_col_fill(const tt_conv_desc *d, const float *x, int n0, int cnt, float *col) {
  int crs = d->c * d->r * d->s, nhwc = d->layout_x == TT_LAYOUT_NHWC;
  size_t hw = (size_t)d->h * d->w;
  for (int j = 0; j < cnt; j++) {
    const float *xs = x + (size_t)(n0 + j) * d->c * hw;
    for (int oh = 0; oh < d->p; oh++)
      for (int ow = 0; ow < d->q; ow++) {
        float *row = col + ((size_t)j * d->p * d->q + (size_t)oh * d->q + ow) * crs;
        for (int ch = 0; ch < d->c; ch++)
          for (int kr = 0; kr < d->r; kr++) {
            int ih = oh * d->stride_h - d->pad_h + kr;
            float *o = row + (ch * d->r + kr) * d->s;
            for (int ks = 0; ks < d->s; ks++) {
              int iw = ow * d->stride_w - d->pad_w + ks;
              int in = ih >= 0 && ih < d->h && iw >= 0 && iw < d->w;
              o[ks] = !in ? 0.0f : nhwc ? xs[((size_t)ih * d->w + iw) * d->c + ch] : xs[(size_t)ch * hw + (size_t)ih * d->w + iw];
            }
          }
      }
  }
}

/* dw = beta*dw + sum over samples of dy^T col (dw [k][c*r*s], KCRS); db likewise (NULL: none).
 * x and dy fp32 in their layouts (d->layout_x, d->layout_y). */
int tt_cpu_conv_col_bwd_filter(tt_backend *b, const tt_conv_desc *d, const float *x, const float *dy, float *dw, float *db,
                               float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  memset(&op, 0, sizeof op);
  op.kind = TT_OP_CONV_BWD_FILTER, op.dt = TT_F32, op.bias = db != NULL, op.u.conv = *d;
  size_t need = tt_cpu_conv_col_workspace(b, &op);
  if (!ws || ws_bytes < need)
    return tt_ref_fail(b, "conv_bwd_filter (%dx%dx%d -> %d, kernel %dx%d, as column blocks and sgemm): workspace of %zu "
                       "bytes, needs %zu; pass what op_workspace answers", d->c, d->h, d->w, d->k, d->r, d->s, ws_bytes, need);
  int s, nb, nt, crs = d->c * d->r * d->s, pq = d->p * d->q, nhwc_y = d->layout_y == TT_LAYOUT_NHWC;
  cpu_conv_col_split(b, d, &s, &nb, &nt);
  size_t share = cpu_conv_col_share(d, s), colb = ((size_t)s * pq * crs * sizeof(float) + 63) / 64 * 64;
  char *base = (char *)(((uintptr_t)ws + 63) / 64 * 64);
  int t;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (t = 0; t < nt; t++) {
    float *col = (float *)(base + (size_t)t * share), *part = (float *)(base + (size_t)t * share + colb);
    int first = 1;
    for (int blk = t; blk < nb; blk += nt) { /* blocks t, t + nt, ...: fixed per thread count */
      int n0 = blk * s, cnt = d->n - n0 < s ? d->n - n0 : s;
      cpu_conv_col_fill(d, x, n0, cnt, col);
      if (nhwc_y) /* dy [n*p*q][k]: one product over the block's rows */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d->k, crs, cnt * pq, 1.0f, dy + (size_t)n0 * pq * d->k, d->k,
                    col, crs, first ? 0.0f : 1.0f, part, crs);
      else /* dy [n][k][p*q]: one product per sample */
        for (int j = 0; j < cnt; j++, first = 0)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d->k, crs, pq, 1.0f, dy + (size_t)(n0 + j) * d->k * pq,
                      pq, col + (size_t)j * pq * crs, crs, first ? 0.0f : 1.0f, part, crs);
      first = 0;
    }
  }
  size_t nw = (size_t)d->k * crs;
  for (size_t i = 0; i < nw; i++) {
    float v = beta == 0.0f ? 0.0f : beta * dw[i];
    for (t = 0; t < nt; t++) v += ((const float *)(base + (size_t)t * share + colb))[i];
    dw[i] = v;
  }
  if (db) {
    if (nhwc_y) tt_ref_channel_sum(b, d->n * pq, d->k, 1, TT_F32, dy, db, beta);
    else tt_ref_channel_sum(b, d->n, d->k, (size_t)pq, TT_F32, dy, db, beta);
  }
  return 0;
}
