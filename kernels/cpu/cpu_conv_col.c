/* kernels/cpu/cpu_conv_col.c — backward weights of a convolution with one input channel (a
 * grayscale network's first layer) as column blocks, on CPUs where oneDNN has no AVX-512 kernels.
 *
 * Why: oneDNN 2.6's AVX2 JIT backward-weights kernel pads the input to 8 channels, 8 times the
 * work. LeNet's first layer (128x1x28x28 -> 32, 5x5, pad 2: 161 MFLOP), one thread,
 * ONEDNN_MAX_CPU_ISA=AVX2 on the AVX-512 Xeon: 15 ms a call (jit:avx2, ONEDNN_VERBOSE), against
 * 1.2 ms for its AVX-512 kernel on the same machine, where this file stays out of the way. The
 * column form with OpenBLAS's sgemm took about 10 ms (sgemm of this thin shape, 32 x 25 outputs
 * over 2048 rows, ran at 22 to 27 GFLOP/s); with cpu_conv_col_acc below (43 GFLOP/s on the same
 * shape, held to AVX2) and the fill's run copies, see docs/measured.md. Not for 3 channels:
 * ResNet-50's stem (16x3x224x224 -> 64, 7x7, stride 2) took 180 to 220 ms a call this way (the
 * sgemm form) against oneDNN's 79 to 84 (one thread, held to AVX2, TINYTRAIN_PROFILE, 2 runs each).
 * Its plain-layout alternative, oneDNN's gemm form, opens a parallel region per image (cpu_conv.c's
 * cpu_conv_act_tag says what that did beside another busy process).
 *
 * How: the output pixels, a block of at most 2048 at a time, become the rows of a column
 * matrix col[rows][c*r*s] (the input values each pixel's filter taps read, 0 in the padding; the
 * columns in KCRS's (c, r, s) order), and dw[k][c*r*s] += dy^T col: with an NHWC dy (rows of k
 * values) by cpu_conv_col_acc, our own loop over 8 output channels in a vector and 12 taps at a
 * time; with an NCHW dy by cblas_sgemm (OpenBLAS, one thread: the backend's threads take whole
 * blocks; one product per sample in the block). Each thread sums its blocks into its own fp32
 * partial; the partials are added into dw in thread order after, so a given thread count gives
 * the same bits every run (and, for an NHWC dy, at every ISA level: each lane sums its rows in
 * order, a multiply then an add, no lane crossing). The bias gradient is tt_ref_channel_sum's
 * fixed-order sum of dy.
 * Workspace: per thread one block's columns and one partial, from the arena (nothing allocated).
 * fp32 only (a first layer reads the fp32 image; 16-bit plans keep oneDNN's kernels).
 * TINYTRAIN_CONV_MATMUL=0 turns it off with the other matmul forms. */
#include <cblas.h>

#include "cpu_internal.h"
#include "cpu_vec.h"

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
         d->layout_y != TT_LAYOUT_NCHW16C && /* dy NCHW or NHWC only (cpu_conv_col_run) */
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

/* Floats of the padded input row cpu_conv_col_fill copies from: the output row's reach. */
static size_t cpu_conv_col_wp(const tt_conv_desc *d) { return (size_t)(d->q - 1) * d->stride_w + d->s; }

/* Bytes of one thread's share of the workspace: a block's columns and a partial dw, each
 * 64-byte aligned, and one padded input row (cpu_conv_col_fill). */
static size_t cpu_conv_col_share(const tt_conv_desc *d) {
  size_t crs = (size_t)d->c * d->r * d->s, col = (size_t)CPU_CONV_COL_ROWS * crs * sizeof(float);
  size_t part = (size_t)d->k * crs * sizeof(float), xrow = cpu_conv_col_wp(d) * sizeof(float);
  return (col + 63) / 64 * 64 + (part + 63) / 64 * 64 + (xrow + 63) / 64 * 64;
}

size_t tt_cpu_conv_col_workspace(tt_backend *b, const tt_op_desc *op) {
  int nb, nt;
  if (!tt_cpu_conv_col(b, op)) return 0;
  cpu_conv_col_split(b, &op->u.conv, &nb, &nt);
  return (size_t)nt * cpu_conv_col_share(&op->u.conv) + 64; /* + 64: the base aligned up */
}

/* col[r - r0][kr*S + ks] = x[n, 0, oh*sh - ph + kr, ow*sw - pw + ks] for the output pixels
 * r = (n*P + oh)*Q + ow in [r0, r1), 0 outside the image; one input channel (x [n][h][w], the same
 * bytes in NCHW and NHWC). An output row at a time: per filter row, the input row goes once into
 * xrow (cpu_conv_col_wp floats, zeros in the padding), and each pixel's S taps are copied from it,
 * S = 3, 5 and 7 as lines of moves (a call to memcpy, or a loop, for 5 floats per pixel and filter
 * row cost more than the products here; a fill element by element with bounds checks, a quarter
 * of the call). */
static void cpu_conv_col_fill(const tt_conv_desc *d, const float *x, size_t r0, size_t r1, float *col, float *xrow) {
  int crs = d->r * d->s, S = d->s, sw = d->stride_w, wp = (int)cpu_conv_col_wp(d);
  size_t pq = (size_t)d->p * d->q;
  for (size_t r = r0; r < r1;) {
    size_t n = r / pq;
    int oh = (int)(r % pq / d->q), ow0 = (int)(r % d->q);
    int ow1 = (size_t)(d->q - ow0) < r1 - r ? d->q : ow0 + (int)(r1 - r); /* this output row's pixels in the block */
    for (int kr = 0; kr < d->r; kr++) {
      int ih = oh * d->stride_h - d->pad_h + kr;
      float *o = col + (r - r0) * crs + kr * S;
      if (ih < 0 || ih >= d->h) {
        for (int ow = ow0; ow < ow1; ow++) memset(o + (size_t)(ow - ow0) * crs, 0, sizeof(float) * (size_t)S);
        continue;
      }
      const float *src = x + (n * d->h + ih) * d->w;
      for (int iw = -d->pad_w, j = 0; j < wp; iw++, j++) xrow[j] = iw >= 0 && iw < d->w ? src[iw] : 0.0f;
      const float *in = xrow + (size_t)ow0 * sw;
#define CPU_COL_RUNS(body)                                                           \
  for (int ow = ow0; ow < ow1; ow++, o += crs, in += sw) { body }
      switch (S) {
      case 3:
        CPU_COL_RUNS(o[0] = in[0]; o[1] = in[1]; o[2] = in[2];)
        break;
      case 5:
        CPU_COL_RUNS(o[0] = in[0]; o[1] = in[1]; o[2] = in[2]; o[3] = in[3]; o[4] = in[4];)
        break;
      case 7:
        CPU_COL_RUNS(o[0] = in[0]; o[1] = in[1]; o[2] = in[2]; o[3] = in[3]; o[4] = in[4]; o[5] = in[5]; o[6] = in[6];)
        break;
      default:
        CPU_COL_RUNS(for (int ks = 0; ks < S; ks++) o[ks] = in[ks];)
      }
#undef CPU_COL_RUNS
    }
    r += (size_t)(ow1 - ow0);
  }
}

#if CPU_VEC_COPIES
/* 8 fp32 lanes (two SSE registers in the baseline copy, one AVX register in the others); loaded
 * and stored with memcpy (no alignment assumed) */
typedef float cpu_col_v8 __attribute__((vector_size(32)));
#endif

/* part[k][t] += sum over rows i of dy[i][k] * col[i][t], for k < K and t < crs: dy [rows][K]
 * (an NHWC block), col [rows][crs], part [K][crs]. Eight output channels in the lanes of a vector
 * times twelve taps: twelve independent sums (registers) per row, each tap's value broadcast;
 * channels past the last eight in scalar sums in row order; taps past the last twelve one at a
 * time (four partial sums over every fourth row, added in a fixed order). Which form sums an
 * output depends on K and crs alone, and every lane runs the same operations in the same order (a
 * product, rounded, then a sum: ISO C contracts nothing), so each ISA's copy gives the same bits.
 * Where the copies are not built (CPU_VEC_COPIES 0: the CUDA compiler's host pass) every output is
 * a scalar sum in row order. */
CPU_VEC_FN(cpu_conv_col_acc, (const float *dy, int K, const float *col, int crs, size_t rows, float *part),
           (dy, K, col, crs, rows, part), {
  int k0 = 0;
#if CPU_VEC_COPIES
  for (; k0 + 8 <= K; k0 += 8) {
    int t0 = 0;
    for (; t0 + 12 <= crs; t0 += 12) {
      cpu_col_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0}, a8 = {0}, a9 = {0},
                 a10 = {0}, a11 = {0};
      for (size_t i = 0; i < rows; i++) {
        const float *c = col + i * (size_t)crs + t0;
        cpu_col_v8 g;
        memcpy(&g, dy + i * (size_t)K + k0, sizeof g);
        a0 += g * c[0], a1 += g * c[1], a2 += g * c[2], a3 += g * c[3], a4 += g * c[4], a5 += g * c[5];
        a6 += g * c[6], a7 += g * c[7], a8 += g * c[8], a9 += g * c[9], a10 += g * c[10], a11 += g * c[11];
      }
      cpu_col_v8 a[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
      for (int j = 0; j < 12; j++)
        for (int l = 0; l < 8; l++) part[(size_t)(k0 + l) * crs + t0 + j] += a[j][l];
    }
    for (; t0 < crs; t0++) { /* one tap: four sums over every fourth row, so no one sum's latency bounds it */
      cpu_col_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, g0, g1, g2, g3;
      size_t i = 0;
      for (; i + 4 <= rows; i += 4) {
        const float *c = col + i * (size_t)crs + t0, *g = dy + i * (size_t)K + k0;
        memcpy(&g0, g, sizeof g0), memcpy(&g1, g + K, sizeof g1), memcpy(&g2, g + 2 * K, sizeof g2), memcpy(&g3, g + 3 * K, sizeof g3);
        a0 += g0 * c[0], a1 += g1 * c[crs], a2 += g2 * c[2 * crs], a3 += g3 * c[3 * crs];
      }
      for (; i < rows; i++) {
        memcpy(&g0, dy + i * (size_t)K + k0, sizeof g0);
        a0 += g0 * col[i * (size_t)crs + t0];
      }
      a0 = (a0 + a1) + (a2 + a3);
      for (int l = 0; l < 8; l++) part[(size_t)(k0 + l) * crs + t0] += a0[l];
    }
  }
#endif
  for (; k0 < K; k0++)
    for (int t = 0; t < crs; t++) {
      float s = 0.0f;
      for (size_t i = 0; i < rows; i++) s += dy[i * (size_t)K + k0] * col[i * (size_t)crs + t];
      part[(size_t)k0 * crs + t] += s;
    }
})

/* dw = beta*dw + sum over samples of dy^T col (dw [k][c*r*s], KCRS); db likewise (NULL: none).
 * x and dy fp32 in their layouts (d->layout_x, d->layout_y). */
int tt_cpu_conv_col_bwd_filter(tt_backend *b, const tt_conv_desc *d, const float *x, const float *dy, float *dw, float *db,
                               float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  memset(&op, 0, sizeof op);
  op.kind = TT_OP_CONV_BWD_FILTER, op.dt = TT_F32, op.bias = db != NULL, op.u.conv = *d;
  size_t need = tt_cpu_conv_col_workspace(b, &op);
  if (!ws || ws_bytes < need)
    return tt_ref_fail(b, "conv_bwd_filter (%dx%dx%d -> %d, kernel %dx%d, as column blocks): workspace of %zu "
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
    float *xrow = (float *)(base + (size_t)t * share + colb + ((size_t)d->k * crs * sizeof(float) + 63) / 64 * 64);
    int first = 1;
    if (nhwc_y) memset(part, 0, sizeof(float) * (size_t)d->k * crs);
    for (int blk = t; blk < nb; blk += nt) { /* blocks t, t + nt, ...: fixed per thread count */
      size_t r0 = (size_t)blk * CPU_CONV_COL_ROWS, r1 = r0 + CPU_CONV_COL_ROWS < rows ? r0 + CPU_CONV_COL_ROWS : rows;
      cpu_conv_col_fill(d, x, r0, r1, col, xrow);
      if (nhwc_y) { /* dy [n*p*q][k]: the block's rows summed into part */
        cpu_conv_col_acc(dy + r0 * d->k, d->k, col, crs, r1 - r0, part);
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
