/* kernels/cpu/cpu_conv_col.c — backward weights of a convolution with one input channel (a
 * grayscale network's first layer) as column blocks and single-threaded sgemm calls, on CPUs
 * where oneDNN has no AVX-512 kernels.
 *
 * Why: oneDNN 2.6's AVX2 JIT backward-weights kernel pads the input to 8 channels, 8 times the
 * work. LeNet's first layer (128x1x28x28 -> 32, 5x5, pad 2: 161 MFLOP), one thread,
 * ONEDNN_MAX_CPU_ISA=AVX2 on the AVX-512 Xeon: 15 ms a call (jit:avx2, ONEDNN_VERBOSE), against
 * 1.2 ms for its AVX-512 kernel on the same machine, where this file stays out of the way; the
 * column form about 10 ms (sgemm of this thin shape runs at about 22 GFLOP/s here). Not for 3
 * channels: ResNet-50's stem (16x3x224x224 -> 64, 7x7, stride 2) took 180 to 220 ms a call this
 * way against oneDNN's 79 to 84 (one thread, held to AVX2, TINYTRAIN_PROFILE, 2 runs each). Its
 * plain-layout alternative, oneDNN's gemm form, opens a parallel region per image (cpu_conv.c's
 * cpu_conv_act_tag says what that did beside another busy process).
 *
 * How: the output pixels, a block of at most 2048 at a time, become the rows of a column
 * matrix col[rows][c*r*s] (the input values each pixel's filter taps read, 0 in the padding; the
 * columns in KCRS's (c, r, s) order), and dw[k][c*r*s] += dy^T col by cblas_sgemm (OpenBLAS, one
 * thread: the backend's threads take whole blocks; an NCHW dy one product per sample in the block).
 * Each thread sums its blocks into its own
 * fp32 partial; the partials are added into dw in thread order after, so a given thread count
 * gives the same bits every run. The bias gradient is tt_ref_channel_sum's fixed-order sum of dy.
 * Workspace: per thread one block's columns and one partial, from the arena (nothing allocated).
 * fp32 only (a first layer reads the fp32 image; 16-bit plans keep oneDNN's kernels). The fill
 * handles any channel count and layout, so the selection alone says where it runs.
 * TINYTRAIN_CONV_MATMUL=0 turns it off with the other matmul forms. */
#include <cblas.h>

#include "cpu_internal.h"

/* Output pixels (rows) per column block: 2048 rows of at most 343 floats (2.7 MiB; LeNet's 5x5
 * layer: 200 KiB), so a block stays in or near the L2 cache and the workspace stays small whatever
 * the image size. */
#define CPU_CONV_COL_ROWS 2048

/* Whether op (a backward-weights convolution) runs here: fp32, ungrouped, one input channel, at
 * most 343 taps per output channel, under the knob (tt_cpu_state.conv_col: -1 where oneDNN has no
 * AVX-512, 1 forced by tests, 0 off). */
int tt_cpu_conv_col(tt_backend *b, const tt_op_desc *op) {
  const tt_conv_desc *d = &op->u.conv;
  int on = tt_cpu_st(b)->conv_col;
  if (on < 0) on = !tt_cpu_dnnl_has_avx512();
  return on && op->kind == TT_OP_CONV_BWD_FILTER && op->dt == TT_F32 && d->groups == 1 && d->c == 1 &&
         d->r * d->s <= 343 && d->n > 0 && d->p > 0 && d->q > 0;
}

/* Blocks of CPU_CONV_COL_ROWS rows (the last one shorter) and the threads that share them (at most one
 * per block). */
static void cpu_conv_col_split(tt_backend *b, const tt_conv_desc *d, int *blocks, int *threads) {
  size_t rows = (size_t)d->n * d->p * d->q;
  *blocks = (int)((rows + CPU_CONV_COL_ROWS - 1) / CPU_CONV_COL_ROWS);
  int nt = tt_cpu_threads_for(b, rows * (size_t)(d->c * d->r * d->s));
  *threads = nt < *blocks ? nt : *blocks;
}

/* Bytes of one thread's share of the workspace: a block's columns and a partial dw, each
 * 64-byte aligned. */
static size_t cpu_conv_col_share(const tt_conv_desc *d) {
  size_t crs = (size_t)d->c * d->r * d->s, col = (size_t)CPU_CONV_COL_ROWS * crs * sizeof(float);
  size_t part = (size_t)d->k * crs * sizeof(float);
  return (col + 63) / 64 * 64 + (part + 63) / 64 * 64;
}

size_t tt_cpu_conv_col_workspace(tt_backend *b, const tt_op_desc *op) {
  int nb, nt;
  if (!tt_cpu_conv_col(b, op)) return 0;
  cpu_conv_col_split(b, &op->u.conv, &nb, &nt);
  return (size_t)nt * cpu_conv_col_share(&op->u.conv) + 64; /* + 64: the base aligned up */
}

/* col[r - r0][(ch*R + kr)*S + ks] = x[n, ch, oh*sh - ph + kr, ow*sw - pw + ks] for the output pixels
 * r = (n*P + oh)*Q + ow in [r0, r1), 0 outside the image; x NCHW or NHWC (d->layout_x). */
static void cpu_conv_col_fill(const tt_conv_desc *d, const float *x, size_t r0, size_t r1, float *col) {
  int crs = d->c * d->r * d->s, nhwc = d->layout_x == TT_LAYOUT_NHWC;
  size_t hw = (size_t)d->h * d->w, pq = (size_t)d->p * d->q;
  for (size_t r = r0; r < r1; r++) {
    size_t n = r / pq;
    int oh = (int)(r % pq / d->q), ow = (int)(r % d->q);
    const float *xs = x + n * d->c * hw;
    float *row = col + (r - r0) * crs;
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
  int nb, nt, crs = d->c * d->r * d->s, nhwc_y = d->layout_y == TT_LAYOUT_NHWC;
  size_t pq = (size_t)d->p * d->q, rows = (size_t)d->n * pq;
  cpu_conv_col_split(b, d, &nb, &nt);
  size_t share = cpu_conv_col_share(d), colb = ((size_t)CPU_CONV_COL_ROWS * crs * sizeof(float) + 63) / 64 * 64;
  char *base = (char *)(((uintptr_t)ws + 63) / 64 * 64);
  int t;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (t = 0; t < nt; t++) {
    float *col = (float *)(base + (size_t)t * share), *part = (float *)(base + (size_t)t * share + colb);
    int first = 1;
    for (int blk = t; blk < nb; blk += nt) { /* blocks t, t + nt, ...: fixed per thread count */
      size_t r0 = (size_t)blk * CPU_CONV_COL_ROWS, r1 = r0 + CPU_CONV_COL_ROWS < rows ? r0 + CPU_CONV_COL_ROWS : rows;
      cpu_conv_col_fill(d, x, r0, r1, col);
      if (nhwc_y) { /* dy [n*p*q][k]: one product over the block's rows */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d->k, crs, (int)(r1 - r0), 1.0f, dy + r0 * d->k, d->k, col,
                    crs, first ? 0.0f : 1.0f, part, crs);
        first = 0;
        continue;
      }
      for (size_t s0 = r0; s0 < r1; first = 0) { /* dy [n][k][p*q]: one product per sample's rows in the block */
        size_t n = s0 / pq, s1 = (n + 1) * pq < r1 ? (n + 1) * pq : r1;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d->k, crs, (int)(s1 - s0), 1.0f,
                    dy + n * d->k * pq + (s0 - n * pq), (int)pq, col + (s0 - r0) * crs, crs, first ? 0.0f : 1.0f, part, crs);
        s0 = s1;
      }
    }
  }
  size_t nw = (size_t)d->k * crs;
  for (size_t i = 0; i < nw; i++) {
    float v = beta == 0.0f ? 0.0f : beta * dw[i];
    for (t = 0; t < nt; t++) v += ((const float *)(base + (size_t)t * share + colb))[i];
    dw[i] = v;
  }
  if (db) {
    if (nhwc_y) tt_ref_channel_sum(b, (int)rows, d->k, 1, TT_F32, dy, db, beta);
    else tt_ref_channel_sum(b, d->n, d->k, pq, TT_F32, dy, db, beta);
  }
  return 0;
}
