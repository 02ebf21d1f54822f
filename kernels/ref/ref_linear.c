/* kernels/ref/ref_linear.c — linear layers, and the threaded sgemm that convolution uses too.
 *
 * Linear: x [n, in], w [out, in], y [n, out]. fp32 needs no workspace; fp16 converts the
 * operands into fp32 workspace copies (sizes below, each rounded to 64 bytes) and the result
 * back:  fwd: x, w, y    bwd_data: dy, w, dx    bwd_filter: x, dy.
 * db sums serially per output feature (tt_ref_channel_sum), so results are deterministic.
 */
#include <cblas.h>

#include "ref_internal.h"

/* OpenBLAS's own threading allocates a job table on every threaded call, which would break
 * the rule that a step allocates nothing. So OpenBLAS runs single-threaded and we split the
 * output across OpenMP threads: each element is still one full-length dot product computed by
 * one call, so results are deterministic for a given thread count. Row-major C = op(A) op(B). */
void tt_ref_sgemm(tt_backend *b, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  int nt = tt_ref_threads(b);
  double work = (double)M * N * K;
  if (nt <= 1 || work < 2e5) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  int split_n = N >= M;
  int len = split_n ? N : M;
  int chunk = (len + nt - 1) / nt;
  chunk = (chunk + 15) & ~15; /* keep the micro-kernel's column/row blocks whole */
  int parts = (len + chunk - 1) / chunk;
  int t;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (t = 0; t < parts; t++) {
    int lo = t * chunk, cnt = len - lo < chunk ? len - lo : chunk;
    if (split_n) {
      const float *Bp = tb == CblasNoTrans ? B + lo : B + (size_t)lo * ldb;
      cblas_sgemm(CblasRowMajor, ta, tb, M, cnt, K, alpha, A, lda, Bp, ldb, beta, C + lo, ldc);
    } else {
      const float *Ap = ta == CblasNoTrans ? A + (size_t)lo * lda : A + lo;
      cblas_sgemm(CblasRowMajor, ta, tb, cnt, N, K, alpha, Ap, lda, B, ldb, beta, C + (size_t)lo * ldc, ldc);
    }
  }
}

static size_t ref_lin_ws(int n, int in, int out, tt_dtype dt, tt_ws_kind which) {
  size_t x = tt_ref_round_floats((size_t)n * in), w = tt_ref_round_floats((size_t)out * in),
         y = tt_ref_round_floats((size_t)n * out);
  if (dt == TT_F32) return 0; /* fp16, bf16: fp32 copies of the operands */
  if (which == TT_WS_FWD) return (x + w + y) * sizeof(float);
  if (which == TT_WS_BWD_DATA) return (y + w + x) * sizeof(float);
  return (x + y) * sizeof(float);
}

static int ref_lin_check(tt_backend *b, const char *op, int n, int in, int out, tt_dtype dt, tt_ws_kind which,
                         const void *ws, size_t ws_bytes) {
  size_t need;
  if (n <= 0 || in <= 0 || out <= 0) return tt_ref_fail(b, "%s: bad shape n=%d in=%d out=%d", op, n, in, out);
  if (tt_ref_dt_check(b, op, dt)) return -1;
  need = ref_lin_ws(n, in, out, dt, which);
  if (ws_bytes < need || (need && !ws))
    return tt_ref_fail(b, "%s: workspace too small: needs %zu bytes, given %zu%s", op, need, ws_bytes, ws ? "" : " (NULL)");
  return 0;
}

size_t tt_ref_linear_workspace(tt_backend *b, int n, int in, int out, tt_dtype dt, tt_ws_kind which) {
  if (n <= 0 || in <= 0 || out <= 0)
    return tt_ref_fail(b, "linear_workspace: bad shape n=%d in=%d out=%d", n, in, out), TT_WS_ERROR;
  if (tt_ref_dt_check(b, "linear_workspace", dt)) return TT_WS_ERROR;
  return ref_lin_ws(n, in, out, dt, which);
}

int tt_ref_linear_fwd(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *x, const void *w,
                      const void *bias, void *y, void *ws, size_t ws_bytes) {
  const float *x32, *w32;
  float *y32, *wsf = (float *)ws;
  int i, o;
  if (ref_lin_check(b, "linear_fwd", n, in, out, dt, TT_WS_FWD, ws, ws_bytes)) return -1;
  if (!x || !w || !y) return tt_ref_fail(b, "linear_fwd: NULL x, w or y");
  if (dt == TT_F32) {
    x32 = (const float *)x;
    w32 = (const float *)w;
    y32 = (float *)y;
  } else {
    float *xs = wsf, *wsw = xs + tt_ref_round_floats((size_t)n * in);
    y32 = wsw + tt_ref_round_floats((size_t)out * in);
    tt_ref_to_f32(b, dt, x, xs, (size_t)n * in);
    tt_ref_to_f32(b, dt, w, wsw, (size_t)out * in);
    x32 = xs;
    w32 = wsw;
  }
  if (bias) {
    for (i = 0; i < n; i++)
      for (o = 0; o < out; o++) y32[(size_t)i * out + o] = tt_ref_ld(dt, bias, (size_t)o);
  }
  tt_ref_sgemm(b, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x32, in, w32, in, bias ? 1.0f : 0.0f, y32, out);
  if (dt != TT_F32) tt_ref_from_f32(b, dt, y32, y, (size_t)n * out);
  return 0;
}

int tt_ref_linear_bwd_data(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *dy, const void *w,
                           void *dx, float beta, void *ws, size_t ws_bytes) {
  float *wsf = (float *)ws;
  if (ref_lin_check(b, "linear_bwd_data", n, in, out, dt, TT_WS_BWD_DATA, ws, ws_bytes)) return -1;
  if (!dy || !w || !dx) return tt_ref_fail(b, "linear_bwd_data: NULL dy, w or dx");
  if (dt == TT_F32) {
    /* dx [n, in] = dy [n, out] * w [out, in]; zero first so beta = 0 never reads old NaNs. */
    if (beta == 0.0f) memset(dx, 0, (size_t)n * in * sizeof(float));
    tt_ref_sgemm(b, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, (const float *)dy, out, (const float *)w, in, beta,
                 (float *)dx, in);
  } else {
    float *dy32 = wsf, *w32 = dy32 + tt_ref_round_floats((size_t)n * out);
    float *dx32 = w32 + tt_ref_round_floats((size_t)out * in);
    size_t i, cnt = (size_t)n * in;
    tt_ref_to_f32(b, dt, dy, dy32, (size_t)n * out);
    tt_ref_to_f32(b, dt, w, w32, (size_t)out * in);
    tt_ref_sgemm(b, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy32, out, w32, in, 0.0f, dx32, in);
    for (i = 0; i < cnt; i++) tt_ref_st_beta(dt, dx, i, dx32[i], beta);
  }
  return 0;
}

int tt_ref_linear_bwd_filter(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *x, const void *dy,
                             float *dw, float *db, float beta, void *ws, size_t ws_bytes) {
  float *wsf = (float *)ws;
  const float *x32, *dy32;
  if (ref_lin_check(b, "linear_bwd_filter", n, in, out, dt, TT_WS_BWD_FILTER, ws, ws_bytes)) return -1;
  if (!x || !dy || !dw) return tt_ref_fail(b, "linear_bwd_filter: NULL x, dy or dw");
  if (dt == TT_F32) {
    x32 = (const float *)x;
    dy32 = (const float *)dy;
  } else {
    float *xs = wsf, *dys = xs + tt_ref_round_floats((size_t)n * in);
    tt_ref_to_f32(b, dt, x, xs, (size_t)n * in);
    tt_ref_to_f32(b, dt, dy, dys, (size_t)n * out);
    x32 = xs;
    dy32 = dys;
  }
  /* dw [out, in] = beta*dw + dy^T [out, n] * x [n, in] */
  if (beta == 0.0f) memset(dw, 0, (size_t)out * in * sizeof(float));
  tt_ref_sgemm(b, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy32, out, x32, in, beta, dw, in);
  if (db) tt_ref_channel_sum(b, n, out, 1, TT_F32, dy32, db, beta);
  return 0;
}
