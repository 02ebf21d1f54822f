/* kernels/cuda/cuda_linear.cu — linear layers through cuBLAS (cublasGemmEx).
 *
 * Row-major x [n, in], w [out, in], y [n, out] are column-major x^T, w^T, y^T:
 *   fwd:         y^T  (out x n)  = w (T of w^T) * x^T          gemm(T, N, out, n, in)
 *   bwd_data:    dx^T (in x n)   = w^T * dy^T                  gemm(N, N, in, n, out)
 *   bwd_filter:  dw^T (in x out) = x^T * dy (T of dy^T)        gemm(N, T, in, out, n)
 * Compute is CUBLAS_COMPUTE_32F: true fp32 while the handle's math mode is CUBLAS_DEFAULT_MATH
 * (a backend's start, --tf32 off, sm_75), TF32 tensor cores for fp32 operands once tt_cuda_set_tf32
 * set CUBLAS_TF32_TENSOR_OP_MATH (cuda_backend.cu); fp16 and bf16 operands use tensor cores with fp32 accumulation (GemmEx's
 * documented combinations: A/B CUDA_R_16F with C CUDA_R_16F or CUDA_R_32F, A/B CUDA_R_16BF with C
 * CUDA_R_16BF or CUDA_R_32F, all with CUBLAS_COMPUTE_32F). dw is fp32 for 16-bit operands (C
 * float) and accumulates with beta. bf16 is refused below compute capability 8.0, as the
 * convolutions are (cuda_conv.cu): the tensor cores of a T4 (7.5) take fp16, not bf16.
 *
 * Workspace: the handle has none of its own (setup sets a zero-byte one, so cuBLAS never
 * allocates); every GEMM gets its step's planned buffer through cublasSetWorkspace, which binds
 * it for the calls that follow on the handle's stream. linear_workspace asks for the size the
 * cuBLAS documentation recommends for cublasSetWorkspace: 32 MiB on Hopper (compute capability
 * 9.x), 4 MiB on the architectures before it; for Blackwell and newer we take Hopper's (what
 * PyTorch does for capability 9 and up), so the bigger tiles have room. A smaller buffer only
 * narrows cuBLAS's choice of algorithm. The buffer is 256-byte aligned (the arena's alignment),
 * as cuBLAS requires of a user workspace. cublasSetStream resets the workspace to the default
 * pool, so the stream is set once, at setup, before the zero-byte workspace.
 */
#include "cuda_internal.h"

/* The cuBLAS type of a dt tensor. */
static cudaDataType_t cuda_lin_type(tt_dtype dt) { return dt == TT_F16 ? CUDA_R_16F : dt == TT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

static int cuda_lin_check(tt_backend *b, const char *op, int n, int in, int out, tt_dtype dt) {
  if (tt_cuda_lib_dt_check(b, op, dt, "GEMMs", "bf16 tensor cores")) return -1;
  if (n <= 0 || in <= 0 || out <= 0) return tt_cuda_fail(b, "%s: bad shape n=%d in=%d out=%d", op, n, in, out);
  return 0;
}

size_t tt_cuda_linear_workspace(tt_backend *b, int n, int in, int out, tt_dtype dt, tt_ws_kind which) {
  if (cuda_lin_check(b, "linear_workspace", n, in, out, dt)) return TT_WS_ERROR;
  if (which != TT_WS_FWD && which != TT_WS_BWD_DATA && which != TT_WS_BWD_FILTER)
    return tt_cuda_fail(b, "linear_workspace: unknown workspace kind %d", (int)which), TT_WS_ERROR;
  return tt_cuda_st(b)->blas_ws; /* every direction is one GEMM */
}

static int cuda_lin_gemm(tt_backend *b, cublasOperation_t ta, cublasOperation_t tb, int m, int nn, int k, const void *A,
                         int lda, const void *B, int ldb, void *C, int ldc, tt_dtype dt, cudaDataType_t ctype, float beta,
                         void *ws, size_t ws_bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  float one = 1.0f;
  cudaDataType_t ab = cuda_lin_type(dt);
  CUBLAS_CHECK(b, cublasSetWorkspace(st->blas, ws_bytes ? ws : NULL, ws ? ws_bytes : 0));
  CUBLAS_CHECK(b, cublasGemmEx(st->blas, ta, tb, m, nn, k, &one, A, ab, lda, B, ab, ldb, &beta, C, ctype, ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

int tt_cuda_linear_fwd(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *x, const void *w,
                       const void *bias, void *y, void *ws, size_t ws_bytes) {
  if (cuda_lin_check(b, "linear_fwd", n, in, out, dt)) return -1;
  if (!x || !w || !y) return tt_cuda_fail(b, "linear_fwd: NULL x, w or y");
  if (cuda_lin_gemm(b, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, w, in, x, in, y, out, dt,
                    cuda_lin_type(dt), 0.0f, ws, ws_bytes))
    return -1;
  /* y [n, out] viewed as [n, out, 1]: bias per "channel" out */
  if (bias) return tt_cuda_add_bias(b, "linear_fwd", n, out, 1, dt, bias, y);
  return 0;
}

int tt_cuda_linear_bwd_data(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *dy, const void *w,
                            void *dx, float beta, void *ws, size_t ws_bytes) {
  if (cuda_lin_check(b, "linear_bwd_data", n, in, out, dt)) return -1;
  if (!dy || !w || !dx) return tt_cuda_fail(b, "linear_bwd_data: NULL dy, w or dx");
  return cuda_lin_gemm(b, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, w, in, dy, out, dx, in, dt,
                       cuda_lin_type(dt), beta, ws, ws_bytes);
}

int tt_cuda_linear_bwd_filter(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *x, const void *dy,
                              float *dw, float *db, float beta, void *ws, size_t ws_bytes) {
  if (cuda_lin_check(b, "linear_bwd_filter", n, in, out, dt)) return -1;
  if (!x || !dy || !dw) return tt_cuda_fail(b, "linear_bwd_filter: NULL x, dy or dw");
  if (cuda_lin_gemm(b, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, x, in, dy, out, dw, in, dt, CUDA_R_32F, beta, ws, ws_bytes))
    return -1;
  if (db) return tt_cuda_channel_sum(b, "linear_bwd_filter", n, out, 1, dt, dy, db, beta);
  return 0;
}
