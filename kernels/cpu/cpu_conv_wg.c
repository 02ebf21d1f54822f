/* kernels/cpu/cpu_conv_wg.c — 3x3 stride-1 pad-1 fp32 convolutions on NHWC activations by
 * Winograd's F(4x4, 3x3), in all three directions, on CPUs where oneDNN has no Winograd kernel
 * (below AVX-512: oneDNN 2.6's only fp32 Winograd is for AVX-512 and the blocked nChw16c layout,
 * which cpu_conv.c's cpu_conv_wino uses there).
 *
 * Why: held to AVX2, a ResNet step is 85 to 90% convolutions already near oneDNN's fp32 matmul
 * rate (docs/measured.md), so only fewer multiplications make it faster. F(4x4, 3x3) computes a
 * 4x4 output tile from a 6x6 input tile with 36 products per (input, output) channel pair where
 * the direct form takes 144: 4 times fewer, at the price of the tile transforms (additions, memory
 * traffic) and of rounding (the transforms' constants 1/4, 1/6, 1/24 and 8 make the result differ
 * from the direct sum by about 1e-6 relative in fp32; test_cpu_vs_ref's conv_winograd,
 * tests/kernels/cpu_conv_own.h, holds it to the usual fp32 tolerance against the reference).
 *
 * How (the matrices are the standard ones for F(4, 3) with the points 0, 1, -1, 2, -2 and
 * infinity): the weights' transform U = G g G^T, [36][ci][co], is computed per call into the
 * workspace; a block of TB output tiles is transformed to V = B^T d B, [36][TB][ci] (8 channels
 * in a vector: NHWC keeps them adjacent), multiplied by U at each of the 36 points (M[a] = V[a]
 * U[a], our own register-blocked kernel, FMA), and transformed back, y = A^T M A. Each thread takes
 * whole blocks (blocks t, t + nt, ...), so every output is one thread's fixed sequence of
 * operations: the bits do not depend on the thread count. Backward data is the same forward over
 * dy with the filter flipped and its channels swapped. Backward weights is the gradient of that
 * forward: dU[a] = sum over tiles of V[a]^T (A dy A^T)[a], then dw = G^T dU G; its tiles are
 * transformed a block at a time by all threads, then each (point, 4 input channels) of dU is one
 * thread's sum in tile order (again independent of the thread count).
 *
 * Where: fp32, ungrouped, 3x3, stride 1, pad 1, x and y NHWC, KCRS filters, channel counts that
 * are multiples of 8, and U at most CPU_WG_U_MAX bytes (ResNet-50's 512-channel stage, a 7x7 image
 * whose 8x8 tiles waste a quarter, keeps oneDNN); on CPUs with AVX2 and FMA, our loops not held
 * below AVX2 (TINYTRAIN_CPU_ISA=baseline), and by default only where oneDNN has no AVX-512
 * (TINYTRAIN_CONV_WINOGRAD: auto, on, off; tt_cpu_state.conv_wg). Where the copies cannot be
 * compiled (CPU_VEC_COPIES 0: the CUDA compiler's host pass of the amalgamation) it never runs.
 * Workspace: U (or dU) and the blocks, from the arena; nothing is allocated. */
#include "cpu_internal.h"
#include "cpu_vec.h"

#if CPU_VEC_COPIES
#include <immintrin.h>
#endif

#define CPU_WG_A 36                     /* transformed points per tile (6 x 6) */
#define CPU_WG_U_MAX ((size_t)16 << 20) /* bytes of U at most: 36 x ci x co floats */

/* Output tiles per block, forward and backward data: a multiple of 6 (the kernel's rows), so that
 * the block's V, 36 x TB x ci floats, stays near 256 KiB and V and M together near 512 KiB (a Zen
 * 2 core's L2), 6 to 96 tiles. On the 2 MiB-L2 Xeon of docs/measured.md twice that measured the
 * same (small ResNet and ResNet-50 steps, held to AVX2). */
static int cpu_wg_tb(int ci, int co) {
  int m = ci > co ? ci : co, t = 1820 / (6 * m);
  if (t < 1) t = 1;
  if (t > 16) t = 16;
  return 6 * t;
}

/* Tiles per block of backward weights: the block's V and Z, shared by all threads, at most about
 * 2.3 MiB each (36 x 16384 floats); 16 to 256 tiles. */
static int cpu_wg_tbw(int c, int k) {
  int t = 16384 / (c > k ? c : k);
  return t < 16 ? 16 : t > 256 ? 256 : t;
}

static size_t cpu_wg_al(size_t bytes) { return (bytes + 63) / 64 * 64; }

/* Floats from one point's rows to the next in a block of tb tiles of ch channels: tb*ch plus 16,
 * so that the 36 points of a tile do not share one cache set (tb*ch*4 bytes is often a multiple
 * of 4096: the 36 stores of a tile's transform then missed in an L1 set of 8 or 12 ways). */
static size_t cpu_wg_ps(int tb, int ch) { return (size_t)tb * ch + 16; }

/* Bytes of a block's 36 points (cpu_wg_ps), 64-aligned. */
static size_t cpu_wg_blk(int tb, int ch) { return cpu_wg_al(CPU_WG_A * cpu_wg_ps(tb, ch) * sizeof(float)); }

static int cpu_wg_cpu_ok(void) {
#if CPU_VEC_COPIES
  static int ok = -1;
  if (ok < 0) {
    __builtin_cpu_init();
    ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  return ok && tt_cpu_vec_level >= CPU_VEC_AVX2;
#else
  return 0;
#endif
}

int tt_cpu_conv_wg(tt_backend *b, const tt_op_desc *op) {
  const tt_conv_desc *d = &op->u.conv;
  int on = tt_cpu_st(b)->conv_wg;
  if (on < 0) on = !tt_cpu_dnnl_has_avx512();
  return on && cpu_wg_cpu_ok() &&
         (op->kind == TT_OP_CONV_FWD || op->kind == TT_OP_CONV_BWD_DATA || op->kind == TT_OP_CONV_BWD_FILTER) &&
         op->dt == TT_F32 && d->groups == 1 && d->r == 3 && d->s == 3 && d->stride_h == 1 && d->stride_w == 1 &&
         d->pad_h == 1 && d->pad_w == 1 && d->layout_x == TT_LAYOUT_NHWC && d->layout_y == TT_LAYOUT_NHWC &&
         d->layout_w == 0 && d->c % 8 == 0 && d->k % 8 == 0 && d->c > 0 && d->k > 0 && d->n > 0 && d->h > 0 &&
         d->w > 0 && d->p == d->h && d->q == d->w && (size_t)CPU_WG_A * d->c * d->k * sizeof(float) <= CPU_WG_U_MAX;
}

/* Workspace bytes of op (tt_cpu_conv_wg true), for nt threads: forward and backward data, U then
 * each thread's V and M blocks; backward weights, dU then the shared V and Z blocks. */
static size_t cpu_wg_bytes(const tt_op_desc *op, int nt) {
  const tt_conv_desc *d = &op->u.conv;
  size_t u = cpu_wg_al((size_t)CPU_WG_A * d->c * d->k * sizeof(float));
  if (op->kind == TT_OP_CONV_BWD_FILTER) {
    int tb = cpu_wg_tbw(d->c, d->k);
    return 64 + u + cpu_wg_blk(tb, d->c) + cpu_wg_blk(tb, d->k);
  }
  int tb = cpu_wg_tb(d->c, d->k);
  return 64 + u + (size_t)nt * (cpu_wg_blk(tb, d->c) + cpu_wg_blk(tb, d->k));
}

size_t tt_cpu_conv_wg_workspace(tt_backend *b, const tt_op_desc *op) {
  return tt_cpu_conv_wg(b, op) ? cpu_wg_bytes(op, tt_cpu_st(b)->ref.threads) : 0;
}

#if CPU_VEC_COPIES
/* ---- the weights' transforms (scalar: ci x co x about 150 operations a call) ---- */

/* U[a][i][o] = (G g G^T)[a], g the 3x3 filter from input channel i to output channel o: w[o][i]
 * (forward), or for backward data (flip) w[i][o] rotated by 180 degrees (ci = k, co = c). */
static void cpu_wg_weights(const float *w, int ci, int co, int flip, float *U, int nt) {
  ptrdiff_t pr, npairs = (ptrdiff_t)ci * co;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (pr = 0; pr < npairs; pr++) {
    int i = (int)(pr / co), o = (int)(pr % co), r, s;
    float g[3][3], t[6][3];
    for (r = 0; r < 3; r++)
      for (s = 0; s < 3; s++)
        g[r][s] = flip ? w[(((size_t)i * co + o) * 3 + 2 - r) * 3 + 2 - s] : w[(((size_t)o * ci + i) * 3 + r) * 3 + s];
    for (s = 0; s < 3; s++) { /* t = G g, a column at a time */
      float g0 = g[0][s], g1 = g[1][s], g2 = g[2][s];
      t[0][s] = g0 * 0.25f;
      t[1][s] = -(g0 + g1 + g2) * (1.0f / 6.0f);
      t[2][s] = -(g0 - g1 + g2) * (1.0f / 6.0f);
      t[3][s] = g0 * (1.0f / 24.0f) + g1 * (1.0f / 12.0f) + g2 * (1.0f / 6.0f);
      t[4][s] = g0 * (1.0f / 24.0f) - g1 * (1.0f / 12.0f) + g2 * (1.0f / 6.0f);
      t[5][s] = g2;
    }
    for (r = 0; r < 6; r++) { /* U = t G^T, a row at a time */
      float g0 = t[r][0], g1 = t[r][1], g2 = t[r][2], *u = U + (size_t)r * 6 * npairs + (size_t)pr;
      u[0 * npairs] = g0 * 0.25f;
      u[1 * npairs] = -(g0 + g1 + g2) * (1.0f / 6.0f);
      u[2 * npairs] = -(g0 - g1 + g2) * (1.0f / 6.0f);
      u[3 * npairs] = g0 * (1.0f / 24.0f) + g1 * (1.0f / 12.0f) + g2 * (1.0f / 6.0f);
      u[4 * npairs] = g0 * (1.0f / 24.0f) - g1 * (1.0f / 12.0f) + g2 * (1.0f / 6.0f);
      u[5 * npairs] = g2;
    }
  }
}

/* dw[k][c] = beta*dw + G^T dU G, dU [36][c][k] (the weights' gradient through their transform). */
static void cpu_wg_weights_grad(const float *dU, int c, int k, float *dw, float beta, int nt) {
  ptrdiff_t pr, npairs = (ptrdiff_t)c * k;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (pr = 0; pr < npairs; pr++) {
    int i = (int)(pr / k), o = (int)(pr % k), r, s;
    float t[6][3];
    for (r = 0; r < 6; r++) { /* t = u G, a row of u at a time */
      const float *u = dU + (size_t)r * 6 * npairs + (size_t)pr;
      float u0 = u[0], u1 = u[npairs], u2 = u[2 * npairs], u3 = u[3 * npairs], u4 = u[4 * npairs], u5 = u[5 * npairs];
      t[r][0] = u0 * 0.25f - u1 * (1.0f / 6.0f) - u2 * (1.0f / 6.0f) + u3 * (1.0f / 24.0f) + u4 * (1.0f / 24.0f);
      t[r][1] = -u1 * (1.0f / 6.0f) + u2 * (1.0f / 6.0f) + u3 * (1.0f / 12.0f) - u4 * (1.0f / 12.0f);
      t[r][2] = -u1 * (1.0f / 6.0f) - u2 * (1.0f / 6.0f) + u3 * (1.0f / 6.0f) + u4 * (1.0f / 6.0f) + u5;
    }
    for (s = 0; s < 3; s++) { /* G^T t, a column at a time */
      float u0 = t[0][s], u1 = t[1][s], u2 = t[2][s], u3 = t[3][s], u4 = t[4][s], u5 = t[5][s], v[3];
      v[0] = u0 * 0.25f - u1 * (1.0f / 6.0f) - u2 * (1.0f / 6.0f) + u3 * (1.0f / 24.0f) + u4 * (1.0f / 24.0f);
      v[1] = -u1 * (1.0f / 6.0f) + u2 * (1.0f / 6.0f) + u3 * (1.0f / 12.0f) - u4 * (1.0f / 12.0f);
      v[2] = -u1 * (1.0f / 6.0f) - u2 * (1.0f / 6.0f) + u3 * (1.0f / 6.0f) + u4 * (1.0f / 6.0f) + u5;
      for (r = 0; r < 3; r++) {
        float *o_ = dw + (((size_t)o * c + i) * 3 + r) * 3 + s;
        *o_ = beta == 0.0f ? v[r] : beta * *o_ + v[r];
      }
    }
  }
}

#define CPU_WG_T_ __attribute__((target("avx2,fma")))
/* B^T applied to six vectors (a column or a row of a tile): the input transform's 1-D step,
 * 4 d0 - 5 d2 + d4, -4 (d1 + d2) + d3 + d4, 4 (d1 - d2) + d4 - d3, 2 (d3 - d1) + d4 - d2,
 * -2 (d3 - d1) + d4 - d2, 4 d1 - 5 d3 + d5: 14 operations with FMA. */
#define CPU_WG_BT(d0, d1, d2, d3, d4, d5, o0, o1, o2, o3, o4, o5)                        \
  do {                                                                                    \
    __m256 s12_ = _mm256_add_ps(d1, d2), s34_ = _mm256_add_ps(d3, d4);                   \
    __m256 m12_ = _mm256_sub_ps(d1, d2), m43_ = _mm256_sub_ps(d4, d3);                   \
    __m256 a42_ = _mm256_sub_ps(d4, d2), m31_ = _mm256_sub_ps(d3, d1);                   \
    o0 = _mm256_fmadd_ps(k4, d0, _mm256_fnmadd_ps(k5, d2, d4));                         \
    o1 = _mm256_fnmadd_ps(k4, s12_, s34_);                                               \
    o2 = _mm256_fmadd_ps(k4, m12_, m43_);                                                \
    o3 = _mm256_fmadd_ps(k2, m31_, a42_);                                                \
    o4 = _mm256_fnmadd_ps(k2, m31_, a42_);                                               \
    o5 = _mm256_fmadd_ps(k4, d1, _mm256_fnmadd_ps(k5, d3, d5));                         \
  } while (0)

/* V[a][t*ldv + c0 ..+8] = (B^T d B)[a] for the 6x6 input tile of x (NHWC, nc channels) whose
 * top-left pixel is (ih0, iw0), zeros outside the image; a = 6*row + column. */
static CPU_WG_T_ void cpu_wg_in(const float *x, int h, int w, int nc, int ih0, int iw0, int c0, float *V, size_t vstride) {
  __m256 d[6][6], t[6][6];
  const __m256 k2 = _mm256_set1_ps(2.0f), k4 = _mm256_set1_ps(4.0f), k5 = _mm256_set1_ps(5.0f);
  if (ih0 >= 0 && iw0 >= 0 && ih0 + 6 <= h && iw0 + 6 <= w) { /* inside the image: no checks */
    const float *row = x + ((size_t)ih0 * w + iw0) * nc + c0;
    for (int i = 0; i < 6; i++, row += (size_t)w * nc)
      for (int j = 0; j < 6; j++) d[i][j] = _mm256_loadu_ps(row + (size_t)j * nc);
  } else {
    for (int i = 0; i < 6; i++) {
      int ih = ih0 + i;
      for (int j = 0; j < 6; j++) {
        int iw = iw0 + j;
        d[i][j] = ih >= 0 && ih < h && iw >= 0 && iw < w ? _mm256_loadu_ps(x + ((size_t)ih * w + iw) * nc + c0)
                                                          : _mm256_setzero_ps();
      }
    }
  }
  for (int j = 0; j < 6; j++)
    CPU_WG_BT(d[0][j], d[1][j], d[2][j], d[3][j], d[4][j], d[5][j], t[0][j], t[1][j], t[2][j], t[3][j], t[4][j], t[5][j]);
  for (int i = 0; i < 6; i++) {
    __m256 o[6];
    CPU_WG_BT(t[i][0], t[i][1], t[i][2], t[i][3], t[i][4], t[i][5], o[0], o[1], o[2], o[3], o[4], o[5]);
    for (int j = 0; j < 6; j++) _mm256_storeu_ps(V + (size_t)(i * 6 + j) * vstride, o[j]);
  }
}

/* A^T applied to six vectors: the output transform's 1-D step (six in, four out): m0 + (m1 + m2)
 * + (m3 + m4), (m1 - m2) + 2 (m3 - m4), (m1 + m2) + 4 (m3 + m4), (m1 - m2) + m5 + 8 (m3 - m4). */
#define CPU_WG_AT(m0, m1, m2, m3, m4, m5, o0, o1, o2, o3)                                          \
  do {                                                                                             \
    __m256 p12_ = _mm256_add_ps(m1, m2), n12_ = _mm256_sub_ps(m1, m2);                            \
    __m256 p34_ = _mm256_add_ps(m3, m4), n34_ = _mm256_sub_ps(m3, m4);                            \
    o0 = _mm256_add_ps(_mm256_add_ps(m0, p12_), p34_);                                            \
    o1 = _mm256_fmadd_ps(k2, n34_, n12_);                                                         \
    o2 = _mm256_fmadd_ps(k4, p34_, p12_);                                                         \
    o3 = _mm256_fmadd_ps(k8, n34_, _mm256_add_ps(n12_, m5));                                      \
  } while (0)

/* y's 4x4 output tile at (oh0, ow0) (NHWC, nk channels, p x q, the part inside), channels k0..+8,
 * = beta*y + bias + (A^T M A), M[a] at M + a*mstride. */
static CPU_WG_T_ void cpu_wg_out(const float *M, size_t mstride, const float *bias, float beta, float *y, int p, int q, int nk,
                                 int oh0, int ow0, int k0) {
  __m256 m[6][6], t[4][6], bv = _mm256_setzero_ps(), bt = _mm256_set1_ps(beta);
  const __m256 k2 = _mm256_set1_ps(2.0f), k4 = _mm256_set1_ps(4.0f), k8 = _mm256_set1_ps(8.0f);
  for (int a = 0; a < 36; a++) m[a / 6][a % 6] = _mm256_loadu_ps(M + (size_t)a * mstride);
  if (bias) bv = _mm256_loadu_ps(bias + k0);
  for (int j = 0; j < 6; j++) CPU_WG_AT(m[0][j], m[1][j], m[2][j], m[3][j], m[4][j], m[5][j], t[0][j], t[1][j], t[2][j], t[3][j]);
  for (int i = 0; i < 4 && oh0 + i < p; i++) {
    __m256 o[4];
    CPU_WG_AT(t[i][0], t[i][1], t[i][2], t[i][3], t[i][4], t[i][5], o[0], o[1], o[2], o[3]);
    for (int j = 0; j < 4 && ow0 + j < q; j++) {
      float *py = y + ((size_t)(oh0 + i) * q + ow0 + j) * nk + k0;
      __m256 v = _mm256_add_ps(o[j], bv);
      if (beta != 0.0f) v = _mm256_fmadd_ps(bt, _mm256_loadu_ps(py), v);
      _mm256_storeu_ps(py, v);
    }
  }
}

/* Z[a][t*ldz + k0..+8] = (A dY A^T)[a] for dy's 4x4 tile at (oh0, ow0) (zeros outside p x q). */
static CPU_WG_T_ void cpu_wg_dy(const float *dy, int p, int q, int nk, int oh0, int ow0, int k0, float *Z, size_t zstride) {
  __m256 g[4][4], t[6][4];
  const __m256 k4 = _mm256_set1_ps(4.0f), k8 = _mm256_set1_ps(8.0f);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++)
      g[i][j] = oh0 + i < p && ow0 + j < q ? _mm256_loadu_ps(dy + ((size_t)(oh0 + i) * q + ow0 + j) * nk + k0) : _mm256_setzero_ps();
/* A applied to four vectors (four in, six out): y0, (y0 + y2) + (y1 + y3), (y0 + y2) - (y1 + y3),
 * (y0 + 4 y2) + (2 y1 + 8 y3), (y0 + 4 y2) - (2 y1 + 8 y3), y3 */
#define CPU_WG_A6(y0, y1, y2, y3, o0, o1, o2, o3, o4, o5)                                           \
  do {                                                                                              \
    __m256 e02_ = _mm256_add_ps(y0, y2), e13_ = _mm256_add_ps(y1, y3);                             \
    __m256 f02_ = _mm256_fmadd_ps(k4, y2, y0), f13_ = _mm256_fmadd_ps(k8, y3, _mm256_add_ps(y1, y1)); \
    o0 = y0;                                                                                        \
    o1 = _mm256_add_ps(e02_, e13_);                                                                 \
    o2 = _mm256_sub_ps(e02_, e13_);                                                                 \
    o3 = _mm256_add_ps(f02_, f13_);                                                                 \
    o4 = _mm256_sub_ps(f02_, f13_);                                                                 \
    o5 = y3;                                                                                        \
  } while (0)
  for (int j = 0; j < 4; j++) CPU_WG_A6(g[0][j], g[1][j], g[2][j], g[3][j], t[0][j], t[1][j], t[2][j], t[3][j], t[4][j], t[5][j]);
  for (int i = 0; i < 6; i++) {
    __m256 o[6];
    CPU_WG_A6(t[i][0], t[i][1], t[i][2], t[i][3], o[0], o[1], o[2], o[3], o[4], o[5]);
    for (int j = 0; j < 6; j++) _mm256_storeu_ps(Z + (size_t)(i * 6 + j) * zstride, o[j]);
  }
#undef CPU_WG_A6
}

/* The product kernel: Cm[i][j] (= or +=) sum over p < np of A[i*ai + p*ap] * B[p*ldb + j], for
 * rows i < MR (6 or 4) and columns j < NR (16 or 8); the sums in registers, one FMA per product,
 * in p order. Inlined into its four fixed-size copies below, whose constants fold the rows away. */
static CPU_WG_T_ inline __attribute__((always_inline)) void cpu_wg_kern(const int MR, const int NR, const float *A, ptrdiff_t ai,
                                                                        ptrdiff_t ap, const float *B, ptrdiff_t ldb, float *Cm,
                                                                        ptrdiff_t ldc, int np, int acc) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00, c40 = c00,
         c41 = c00, c50 = c00, c51 = c00;
#define CPU_WG_LD(r, v0, v1)                                       \
  if (MR > r) {                                                    \
    v0 = _mm256_loadu_ps(Cm + r * ldc);                            \
    if (NR == 16) v1 = _mm256_loadu_ps(Cm + r * ldc + 8);          \
  }
  if (acc) {
    CPU_WG_LD(0, c00, c01) CPU_WG_LD(1, c10, c11) CPU_WG_LD(2, c20, c21) CPU_WG_LD(3, c30, c31) CPU_WG_LD(4, c40, c41)
    CPU_WG_LD(5, c50, c51)
  }
#define CPU_WG_ROW(r, v0, v1)                                      \
  if (MR > r) {                                                    \
    __m256 a_ = _mm256_broadcast_ss(A + r * ai);                   \
    v0 = _mm256_fmadd_ps(a_, b0, v0);                              \
    if (NR == 16) v1 = _mm256_fmadd_ps(a_, b1, v1);                \
  }
  for (int p = 0; p < np; p++, A += ap, B += ldb) {
    __m256 b0 = _mm256_loadu_ps(B), b1 = NR == 16 ? _mm256_loadu_ps(B + 8) : b0;
    CPU_WG_ROW(0, c00, c01) CPU_WG_ROW(1, c10, c11) CPU_WG_ROW(2, c20, c21) CPU_WG_ROW(3, c30, c31) CPU_WG_ROW(4, c40, c41)
    CPU_WG_ROW(5, c50, c51)
  }
#define CPU_WG_SV(r, v0, v1)                                       \
  if (MR > r) {                                                    \
    _mm256_storeu_ps(Cm + r * ldc, v0);                            \
    if (NR == 16) _mm256_storeu_ps(Cm + r * ldc + 8, v1);          \
  }
  CPU_WG_SV(0, c00, c01) CPU_WG_SV(1, c10, c11) CPU_WG_SV(2, c20, c21) CPU_WG_SV(3, c30, c31) CPU_WG_SV(4, c40, c41)
  CPU_WG_SV(5, c50, c51)
#undef CPU_WG_LD
#undef CPU_WG_ROW
#undef CPU_WG_SV
}
#define CPU_WG_KERN(MR, NR)                                                                                          \
  static CPU_WG_T_ void cpu_wg_kern_##MR##x##NR(const float *A, ptrdiff_t ai, ptrdiff_t ap, const float *B, ptrdiff_t ldb, \
                                                float *Cm, ptrdiff_t ldc, int np, int acc) {                         \
    cpu_wg_kern(MR, NR, A, ai, ap, B, ldb, Cm, ldc, np, acc);                                                        \
  }
CPU_WG_KERN(6, 16)
CPU_WG_KERN(6, 8)
CPU_WG_KERN(4, 16)
CPU_WG_KERN(4, 8)

/* The forward pass over n images of h x w (output h x w too): out = beta*out + bias + conv(in, g),
 * in [n][h][w][ci], out [n][h][w][co] (NHWC), U [36][ci][co] from cpu_wg_weights; blk: per thread
 * 36 x TB x (ci + co) floats (V then M). */
static CPU_WG_T_ void cpu_wg_forward(int n, int h, int w, int ci, int co, const float *in, const float *U, const float *bias,
                                     float *out, float beta, char *blk, size_t blk_bytes, int nt) {
  int th = (h + 3) / 4, tw = (w + 3) / 4, TB = cpu_wg_tb(ci, co);
  ptrdiff_t ntiles = (ptrdiff_t)n * th * tw, nblocks = (ntiles + TB - 1) / TB;
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
#ifdef _OPENMP
    int me = omp_get_thread_num(), team = omp_get_num_threads();
#else
    int me = 0, team = 1;
#endif
    float *V = (float *)(blk + (size_t)me * blk_bytes);
    float *M = V + cpu_wg_blk(TB, ci) / sizeof(float);
    size_t vs = cpu_wg_ps(TB, ci), ms = cpu_wg_ps(TB, co); /* floats between points */
    for (ptrdiff_t bk = me; bk < nblocks; bk += team) {
      ptrdiff_t t0 = bk * TB;
      int nv = (int)(ntiles - t0 < TB ? ntiles - t0 : TB), rows = (nv + 5) / 6 * 6;
      for (int t = 0; t < nv; t++) {
        ptrdiff_t tile = t0 + t;
        int img = (int)(tile / ((ptrdiff_t)th * tw)), rest = (int)(tile % ((ptrdiff_t)th * tw));
        const float *x = in + (size_t)img * h * w * ci;
        for (int c0 = 0; c0 < ci; c0 += 8) cpu_wg_in(x, h, w, ci, rest / tw * 4 - 1, rest % tw * 4 - 1, c0, V + (size_t)t * ci + c0, vs);
      }
      for (int a = 0; a < CPU_WG_A; a++) /* the rows past nv (up to a multiple of 6) get zeros */
        memset(V + a * vs + (size_t)nv * ci, 0, sizeof(float) * (size_t)(rows - nv) * ci);
      for (int a = 0; a < CPU_WG_A; a++) {
        const float *Va = V + a * vs, *Ua = U + (size_t)a * ci * co;
        float *Ma = M + a * ms;
        int k0 = 0;
        for (; k0 + 16 <= co; k0 += 16)
          for (int r = 0; r < rows; r += 6) cpu_wg_kern_6x16(Va + (size_t)r * ci, ci, 1, Ua + k0, co, Ma + (size_t)r * co + k0, co, ci, 0);
        if (k0 < co)
          for (int r = 0; r < rows; r += 6) cpu_wg_kern_6x8(Va + (size_t)r * ci, ci, 1, Ua + k0, co, Ma + (size_t)r * co + k0, co, ci, 0);
      }
      for (int t = 0; t < nv; t++) {
        ptrdiff_t tile = t0 + t;
        int img = (int)(tile / ((ptrdiff_t)th * tw)), rest = (int)(tile % ((ptrdiff_t)th * tw));
        float *y = out + (size_t)img * h * w * co;
        for (int k0 = 0; k0 < co; k0 += 8)
          cpu_wg_out(M + (size_t)t * co + k0, ms, bias, beta, y, h, w, co, rest / tw * 4, rest % tw * 4, k0);
      }
    }
  }
}

/* dU [36][c][k] = sum over every tile of V[a]^T Z[a] (then dw from it: cpu_wg_weights_grad); x
 * [n][h][w][c], dy [n][h][w][k]; blk: the shared V and Z blocks. */
static CPU_WG_T_ void cpu_wg_backward_weights(int n, int h, int w, int c, int k, const float *x, const float *dy, float *dU,
                                              float *V, float *Z, int nt) {
  int th = (h + 3) / 4, tw = (w + 3) / 4, TB = cpu_wg_tbw(c, k);
  ptrdiff_t ntiles = (ptrdiff_t)n * th * tw, units = (ptrdiff_t)CPU_WG_A * (c / 4);
  size_t vs = cpu_wg_ps(TB, c), zs = cpu_wg_ps(TB, k);
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    ptrdiff_t t, u;
#pragma omp for schedule(static)
    for (u = 0; u < units; u++) memset(dU + (size_t)u * 4 * k, 0, sizeof(float) * 4 * (size_t)k);
    for (ptrdiff_t t0 = 0; t0 < ntiles; t0 += TB) {
      int nv = (int)(ntiles - t0 < TB ? ntiles - t0 : TB);
#pragma omp for schedule(static)
      for (t = 0; t < nv; t++) {
        ptrdiff_t tile = t0 + t;
        int img = (int)(tile / ((ptrdiff_t)th * tw)), rest = (int)(tile % ((ptrdiff_t)th * tw));
        int oh0 = rest / tw * 4, ow0 = rest % tw * 4;
        for (int c0 = 0; c0 < c; c0 += 8)
          cpu_wg_in(x + (size_t)img * h * w * c, h, w, c, oh0 - 1, ow0 - 1, c0, V + (size_t)t * c + c0, vs);
        for (int k0 = 0; k0 < k; k0 += 8)
          cpu_wg_dy(dy + (size_t)img * h * w * k, h, w, k, oh0, ow0, k0, Z + (size_t)t * k + k0, zs);
      }
      /* each unit (a point, 4 input channels) summed by one thread over the block's tiles in order */
#pragma omp for schedule(static)
      for (u = 0; u < units; u++) {
        int a = (int)(u / (c / 4)), c0 = (int)(u % (c / 4)) * 4, k0 = 0;
        const float *Va = V + a * vs + c0, *Za = Z + a * zs;
        float *Ua = dU + ((size_t)a * c + c0) * k;
        for (; k0 + 16 <= k; k0 += 16) cpu_wg_kern_4x16(Va, 1, c, Za + k0, k, Ua + k0, k, nv, 1);
        if (k0 < k) cpu_wg_kern_4x8(Va, 1, c, Za + k0, k, Ua + k0, k, nv, 1);
      }
    }
  }
}
#endif

/* The three directions (tt_cpu_conv_wg true for the op; the caller checked the pointers): the
 * workspace checked against the answer for op, U or dU at its start (64-aligned), then the
 * blocks. */
static char *cpu_wg_ws(tt_backend *b, const tt_op_desc *op, const char *what, void *ws, size_t ws_bytes, int nt) {
  const tt_conv_desc *d = &op->u.conv;
  size_t need = cpu_wg_bytes(op, nt);
  if (!ws || ws_bytes < need) {
    tt_ref_fail(b, "%s (%dx%dx%d -> %d, 3x3, as Winograd F(4x4, 3x3)): workspace of %zu bytes, needs %zu; pass what "
                "op_workspace answers", what, d->c, d->h, d->w, d->k, ws_bytes, need);
    return NULL;
  }
  return (char *)(((uintptr_t)ws + 63) / 64 * 64);
}

static void cpu_wg_op(tt_op_desc *op, tt_op_kind kind, const tt_conv_desc *d) {
  memset(op, 0, sizeof *op);
  op->kind = kind, op->dt = TT_F32, op->u.conv = *d;
}

/* The forward (data 0: y = conv(x, w) + bias) or backward data (data 1: dx = beta*dx + the forward
 * over dy with the filter rotated and its channels swapped) through cpu_wg_forward. */
static int cpu_wg_run_forward(tt_backend *b, const tt_conv_desc *d, int data, const float *in, const float *w,
                              const float *bias, float *out, float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  cpu_wg_op(&op, data ? TT_OP_CONV_BWD_DATA : TT_OP_CONV_FWD, d);
  int nt = tt_cpu_st(b)->ref.threads;
  char *base = cpu_wg_ws(b, &op, data ? "conv_bwd_data" : "conv_fwd", ws, ws_bytes, nt);
  if (!base) return -1;
#if CPU_VEC_COPIES
  int ci = data ? d->k : d->c, co = data ? d->c : d->k, tb = cpu_wg_tb(d->c, d->k);
  cpu_wg_weights(w, ci, co, data, (float *)base, nt);
  cpu_wg_forward(d->n, d->h, d->w, ci, co, in, (const float *)base, bias, out, beta,
                 base + cpu_wg_al((size_t)CPU_WG_A * d->c * d->k * sizeof(float)), cpu_wg_blk(tb, d->c) + cpu_wg_blk(tb, d->k), nt);
  return 0;
#else
  (void)in, (void)w, (void)bias, (void)out, (void)beta;
  return tt_ref_fail(b, "%s: Winograd not compiled in this build", data ? "conv_bwd_data" : "conv_fwd");
#endif
}

int tt_cpu_conv_wg_fwd(tt_backend *b, const tt_conv_desc *d, const float *x, const float *w, const float *bias, float *y,
                       void *ws, size_t ws_bytes) {
  return cpu_wg_run_forward(b, d, 0, x, w, bias, y, 0.0f, ws, ws_bytes);
}

int tt_cpu_conv_wg_bwd_data(tt_backend *b, const tt_conv_desc *d, const float *dy, const float *w, float *dx, float beta,
                            void *ws, size_t ws_bytes) {
  return cpu_wg_run_forward(b, d, 1, dy, w, NULL, dx, beta, ws, ws_bytes);
}

int tt_cpu_conv_wg_bwd_filter(tt_backend *b, const tt_conv_desc *d, const float *x, const float *dy, float *dw, float *db,
                              float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  cpu_wg_op(&op, TT_OP_CONV_BWD_FILTER, d);
  int nt = tt_cpu_st(b)->ref.threads;
  char *base = cpu_wg_ws(b, &op, "conv_bwd_filter", ws, ws_bytes, nt);
  if (!base) return -1;
#if CPU_VEC_COPIES
  size_t u = cpu_wg_al((size_t)CPU_WG_A * d->c * d->k * sizeof(float));
  int tb = cpu_wg_tbw(d->c, d->k);
  float *dU = (float *)base, *V = (float *)(base + u), *Z = (float *)(base + u + cpu_wg_blk(tb, d->c));
  cpu_wg_backward_weights(d->n, d->h, d->w, d->c, d->k, x, dy, dU, V, Z, nt);
  cpu_wg_weights_grad(dU, d->c, d->k, dw, beta, nt);
  if (db) tt_ref_channel_sum(b, d->n * d->p * d->q, d->k, 1, TT_F32, dy, db, beta);
  return 0;
#else
  (void)x, (void)dy, (void)dw, (void)db, (void)beta;
  return tt_ref_fail(b, "conv_bwd_filter: Winograd not compiled in this build");
#endif
}
