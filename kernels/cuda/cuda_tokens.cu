/* kernels/cuda/cuda_tokens.cu — patch tokens (a feature map to a token sequence, with the class
 * token and the position embedding) and token pooling of backend.h on the CUDA backend's own
 * kernels, the reference backend's semantics (kernels/ref/); beta 0 overwrites (never 0*old).
 *
 * Determinism: no float atomics. The class token's and the position embedding's gradients, sums
 * over the batch, are summed in a fixed order: one thread per output looping over the samples.
 */
#include "cuda_internal.h"

/* ----------------------------------- patch tokens -------------------------------------- */

/* x [n, f, hw] -> y [n, cls + hw, f]: a 32 x 32 (channels x positions) tile transposed through
 * shared memory, so both the read (along positions) and the write (along channels) are
 * contiguous. Grid (position tiles, channel tiles, n); the first position tile also writes the
 * class token. */
#define CUDA_TOK_THREADS 256
#define CUDA_TOK_TILE 32

static __global__ void TT_LAUNCH_BOUNDS(CUDA_TOK_THREADS) cuda_tok_fwd_k(int f, int hw, int cls, tt_dtype dt,
                                                                         const void *x, const float *cls_tok,
                                                                         const float *pos, void *y) {
  __shared__ float tile[CUDA_TOK_TILE][CUDA_TOK_TILE + 1]; /* [channel][position] */
  const int tx = threadIdx.x % CUDA_TOK_TILE, ty = threadIdx.x / CUDA_TOK_TILE;
  const int i0 = blockIdx.x * CUDA_TOK_TILE, c0 = blockIdx.y * CUDA_TOK_TILE, s = blockIdx.z, t = hw + cls;
  for (int r = ty; r < CUDA_TOK_TILE; r += CUDA_TOK_THREADS / CUDA_TOK_TILE) {
    int c = c0 + r, i = i0 + tx;
    tile[r][tx] = (c < f && i < hw) ? tt_cuda_ld(dt, x, ((size_t)s * f + c) * hw + i) : 0.0f;
  }
  __syncthreads();
  for (int r = ty; r < CUDA_TOK_TILE; r += CUDA_TOK_THREADS / CUDA_TOK_TILE) {
    int i = i0 + r, c = c0 + tx;
    if (i < hw && c < f) {
      float v = tile[tx][r];
      if (pos) v += pos[(size_t)(cls + i) * f + c];
      tt_cuda_st(dt, y, ((size_t)s * t + cls + i) * f + c, v);
    }
  }
  if (cls && blockIdx.x == 0 && ty == 0 && c0 + tx < f) {
    int c = c0 + tx;
    tt_cuda_st(dt, y, (size_t)s * t * f + c, cls_tok[c] + (pos ? pos[c] : 0.0f));
  }
}

/* dx [n, f, hw] = beta * dx + dy's tokens cls.. transposed back (the same tiling). */
static __global__ void TT_LAUNCH_BOUNDS(CUDA_TOK_THREADS) cuda_tok_dx_k(int f, int hw, int cls, tt_dtype dt,
                                                                        const void *dy, void *dx, float beta) {
  __shared__ float tile[CUDA_TOK_TILE][CUDA_TOK_TILE + 1]; /* [position][channel] */
  const int tx = threadIdx.x % CUDA_TOK_TILE, ty = threadIdx.x / CUDA_TOK_TILE;
  const int i0 = blockIdx.x * CUDA_TOK_TILE, c0 = blockIdx.y * CUDA_TOK_TILE, s = blockIdx.z, t = hw + cls;
  for (int r = ty; r < CUDA_TOK_TILE; r += CUDA_TOK_THREADS / CUDA_TOK_TILE) {
    int i = i0 + r, c = c0 + tx;
    tile[r][tx] = (c < f && i < hw) ? tt_cuda_ld(dt, dy, ((size_t)s * t + cls + i) * f + c) : 0.0f;
  }
  __syncthreads();
  for (int r = ty; r < CUDA_TOK_TILE; r += CUDA_TOK_THREADS / CUDA_TOK_TILE) {
    int c = c0 + r, i = i0 + tx;
    if (i < hw && c < f) tt_cuda_st_beta(dt, dx, ((size_t)s * f + c) * hw + i, tile[tx][r], beta);
  }
}

/* The backward with parameter gradients, fused: grid (position tiles, channel tiles), each
 * block looping over the samples in order. Per sample it stages dy's tile, writes dx's
 * transposed tile (when dx is non-NULL) and adds the tile into its threads' dpos sums (fp32,
 * samples in order, as one thread per element would); blocks of the first position tile also
 * sum token 0 (the class token) into dcls and dpos[0]. dy is read once for dx and the two sums
 * (a separate batch-sum pass read it twice). */
#define CUDA_TOK_PER (CUDA_TOK_TILE * CUDA_TOK_TILE / CUDA_TOK_THREADS) /* tile rows per thread */

static __global__ void TT_LAUNCH_BOUNDS(CUDA_TOK_THREADS) cuda_tok_bwd_k(int n, int f, int hw, int cls, tt_dtype dt,
                                                                         const void *dy, void *dx, float beta_dx,
                                                                         float *dcls, float *dpos, float beta) {
  __shared__ float tile[CUDA_TOK_TILE][CUDA_TOK_TILE + 1]; /* [position][channel] */
  const int tx = threadIdx.x % CUDA_TOK_TILE, ty = threadIdx.x / CUDA_TOK_TILE;
  const int i0 = blockIdx.x * CUDA_TOK_TILE, c0 = blockIdx.y * CUDA_TOK_TILE, t = hw + cls;
  const int c = c0 + tx, do_cls = cls && blockIdx.x == 0 && ty == 0 && c < f;
  float acc[CUDA_TOK_PER], acls = 0.0f;
  TT_UNROLL
  for (int k = 0; k < CUDA_TOK_PER; k++) acc[k] = 0.0f;
  for (int s = 0; s < n; s++) {
    TT_UNROLL
    for (int k = 0; k < CUDA_TOK_PER; k++) {
      int r = ty + k * (CUDA_TOK_THREADS / CUDA_TOK_TILE), i = i0 + r;
      float v = (c < f && i < hw) ? tt_cuda_ld(dt, dy, ((size_t)s * t + cls + i) * f + c) : 0.0f;
      tile[r][tx] = v;
      acc[k] += v;
    }
    if (do_cls) acls += tt_cuda_ld(dt, dy, (size_t)s * t * f + c);
    if (dx) {
      __syncthreads();
      for (int r = ty; r < CUDA_TOK_TILE; r += CUDA_TOK_THREADS / CUDA_TOK_TILE) {
        int cc = c0 + r, i = i0 + tx;
        if (i < hw && cc < f) tt_cuda_st_beta(dt, dx, ((size_t)s * f + cc) * hw + i, tile[tx][r], beta_dx);
      }
      __syncthreads(); /* the tile is overwritten by the next sample */
    }
  }
  if (dpos) {
    TT_UNROLL
    for (int k = 0; k < CUDA_TOK_PER; k++) {
      int i = i0 + ty + k * (CUDA_TOK_THREADS / CUDA_TOK_TILE);
      if (c < f && i < hw) {
        size_t e = (size_t)(cls + i) * f + c;
        dpos[e] = beta != 0.0f ? beta * dpos[e] + acc[k] : acc[k];
      }
    }
    if (do_cls) dpos[c] = beta != 0.0f ? beta * dpos[c] + acls : acls;
  }
  if (do_cls && dcls) dcls[c] = beta != 0.0f ? beta * dcls[c] + acls : acls;
}

static int cuda_tok_check(tt_backend *b, const char *op, int n, int f, int hw, int cls, tt_dtype dt) {
  if (n <= 0 || f <= 0 || hw <= 0 || (cls != 0 && cls != 1))
    return tt_cuda_fail(b, "%s: bad shape n=%d f=%d hw=%d cls=%d", op, n, f, hw, cls);
  if (n > 65535 || (f + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE > 65535)
    return tt_cuda_fail(b, "%s: n=%d or f=%d over the grid's limits", op, n, f);
  return tt_cuda_dt_check(b, op, dt);
}

int tt_cuda_tokens_fwd(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *x, const float *cls_tok,
                       const float *pos, void *y) {
  if (cuda_tok_check(b, "tokens_fwd", n, f, hw, cls, dt)) return -1;
  if (!x || !y || (cls && !cls_tok)) return tt_cuda_fail(b, "tokens_fwd: NULL x, y or (with a class token) cls_tok");
  TT_LAUNCH(cuda_tok_fwd_k, dim3((unsigned)((hw + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)((f + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)n),
            CUDA_TOK_THREADS, 0, tt_cuda_stream(b), f, hw, cls, dt, x, cls_tok, pos, y);
  CUDA_LAUNCH_CHECK(b, "tokens_fwd");
  return 0;
}

int tt_cuda_tokens_bwd(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *dy, void *dx,
                       float *dcls, float *dpos, float beta_dx, float beta_param) {
  if (cuda_tok_check(b, "tokens_bwd", n, f, hw, cls, dt)) return -1;
  if (!dy) return tt_cuda_fail(b, "tokens_bwd: NULL dy");
  if (dcls || dpos) { /* one pass over dy: dx and the batch sums */
    TT_LAUNCH(cuda_tok_bwd_k, dim3((unsigned)((hw + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)((f + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE)),
              CUDA_TOK_THREADS, 0, tt_cuda_stream(b), n, f, hw, cls, dt, dy, dx, beta_dx, dcls, dpos, beta_param);
    CUDA_LAUNCH_CHECK(b, "tokens_bwd");
  } else if (dx) {
    TT_LAUNCH(cuda_tok_dx_k, dim3((unsigned)((hw + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)((f + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)n),
              CUDA_TOK_THREADS, 0, tt_cuda_stream(b), f, hw, cls, dt, dy, dx, beta_dx);
    CUDA_LAUNCH_CHECK(b, "tokens_bwd");
  }
  return 0;
}

/* ----------------------------------- token pooling ------------------------------------- */

/* y [n, f]: token 0, or the mean over the t tokens (summed in order, fp32). */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_tok_fwd_k(int n, int t, int f, int mode, tt_dtype dt,
                                                                             const void *x, void *y) {
  TT_CUDA_LOOP(e, (size_t)n * f) {
    size_t s = e / (size_t)f, c = e % (size_t)f, base = s * t * f + c;
    float v;
    if (mode == 0) {
      v = tt_cuda_ld(dt, x, base);
    } else {
      v = 0.0f;
      for (int k = 0; k < t; k++) v += tt_cuda_ld(dt, x, base + (size_t)k * f);
      v /= (float)t;
    }
    tt_cuda_st(dt, y, e, v);
  }
}

/* dx [n, t, f] = beta * dx + the routed dy: one thread per (sample, channel), dy read once and
 * the sample's tokens written in order (a warp writes 32 consecutive channels of one token).
 * token0_only: mode 0 with beta == 1, where only token 0 changes. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_tok_bwd_k(int n, int t, int f, int mode,
                                                                             int token0_only, tt_dtype dt,
                                                                             const void *dy, void *dx, float beta) {
  TT_CUDA_LOOP(e, (size_t)n * f) {
    const size_t s = e / (size_t)f, c = e % (size_t)f, base = s * t * f + c;
    const float g = tt_cuda_ld(dt, dy, e), v = mode == 0 ? g : g / (float)t;
    const int kend = token0_only ? 1 : t;
    for (int k = 0; k < kend; k++) tt_cuda_st_beta(dt, dx, base + (size_t)k * f, mode == 0 && k ? 0.0f : v, beta);
  }
}

int tt_cuda_token_pool_fwd(tt_backend *b, int n, int t, int f, int mode, tt_dtype dt, const void *x, void *y) {
  if (n <= 0 || t <= 0 || f <= 0 || (mode != 0 && mode != 1))
    return tt_cuda_fail(b, "token_pool_fwd: bad shape n=%d t=%d f=%d mode=%d", n, t, f, mode);
  if (tt_cuda_dt_check(b, "token_pool_fwd", dt)) return -1;
  if (!x || !y) return tt_cuda_fail(b, "token_pool_fwd: NULL x or y");
  TT_LAUNCH(cuda_pool_tok_fwd_k, tt_cuda_blocks((size_t)n * f), TT_CUDA_THREADS, 0, tt_cuda_stream(b), n, t, f, mode, dt, x,
            y);
  CUDA_LAUNCH_CHECK(b, "token_pool_fwd");
  return 0;
}

int tt_cuda_token_pool_bwd(tt_backend *b, int n, int t, int f, int mode, tt_dtype dt, const void *dy, void *dx,
                           float beta) {
  int token0_only = mode == 0 && beta == 1.0f;
  if (n <= 0 || t <= 0 || f <= 0 || (mode != 0 && mode != 1))
    return tt_cuda_fail(b, "token_pool_bwd: bad shape n=%d t=%d f=%d mode=%d", n, t, f, mode);
  if (tt_cuda_dt_check(b, "token_pool_bwd", dt)) return -1;
  if (!dy || !dx) return tt_cuda_fail(b, "token_pool_bwd: NULL dy or dx");
  TT_LAUNCH(cuda_pool_tok_bwd_k, tt_cuda_blocks((size_t)n * f), TT_CUDA_THREADS, 0, tt_cuda_stream(b), n, t, f, mode,
            token0_only, dt, dy, dx, beta);
  CUDA_LAUNCH_CHECK(b, "token_pool_bwd");
  return 0;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(tokens, TT_CUDA_KERNEL(cuda_tok_fwd_k, CUDA_TOK_THREADS),
                     TT_CUDA_KERNEL(cuda_tok_dx_k, CUDA_TOK_THREADS), TT_CUDA_KERNEL(cuda_tok_bwd_k, CUDA_TOK_THREADS),
                     TT_CUDA_KERNEL(cuda_pool_tok_fwd_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_pool_tok_bwd_k, TT_CUDA_THREADS));
