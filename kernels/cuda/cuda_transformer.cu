/* kernels/cuda/cuda_transformer.cu — the transformer ops of backend.h on the CUDA backend's own
 * kernels: layer norm, fused scaled-dot-product attention (flash-style), patch tokens and token
 * pooling. sum_squares (gradient clipping) lives elsewhere.
 *
 * Semantics are the reference backend's (kernels/ref/): layer norm with fp32 statistics over the
 * last dimension (biased variance); attention over the fused QKV tensor of tt_attn_desc with the
 * probabilities' dropout decided by tt_dropout_hash at the flat [n, heads, t, t] index, bit for
 * bit the ref's mask; beta 0 overwrites (never 0*old), as everywhere in the backend.
 *
 * Determinism: no float atomics anywhere. Parameter gradients that sum over rows or samples
 * (layer norm's dgamma/dbeta, the class token's and position embedding's) are summed in a fixed
 * order: per-block partials in the planned workspace, then one thread per output summing them in
 * block order (layer norm), or one thread per output looping over the batch (tokens). Attention's
 * dq comes from one kernel over key tiles per query tile and dk, dv from one kernel over query
 * tiles per key tile, each element written once.
 *
 * Attention (docs/gpu.md, "Attention"): one block of 128 threads per (query tile, head, sample);
 * the tile's queries in shared memory, keys and values streamed through shared memory a tile at a
 * time, scores S = scale * q k^T and the online softmax (running max m and sum l per query row)
 * in registers, o accumulated in registers and divided by l at the end; lse = m + log(l) per row
 * is all that backward keeps. The [t, t] matrix is never stored, unless the caller asks for the
 * probabilities (probs non-NULL): then a second sweep over the key tiles recomputes the scores
 * and writes exp(s - lse), the probabilities before dropout. Backward: a small kernel computes
 * D = rowsum(dO * O) into the workspace; the dq kernel (per query tile, over key tiles) and the
 * dk/dv kernel (per key tile, over query tiles) rebuild P from qkv and lse (or read it from probs)
 * tile by tile. The head dimension picks one of three instantiations (d <= 32, 64, 128; columns
 * past d are zero in shared memory); d > 128 is refused. Static shared memory only, under the
 * 48 KiB a block gets without opting in (the tile sizes below are chosen for that).
 */
#include <math.h>
#include <string.h>

#include "cuda_internal.h"

/* Every tensor load and store here goes through tt_cuda_ld/st, so these kernels take the dtypes
 * those know: fp32, fp16 and bf16 (storage; the arithmetic is fp32). */
static int cuda_tr_dt(tt_backend *b, const char *op, tt_dtype dt) {
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "%s: unknown dtype %d (fp32, fp16 and bf16)", op, (int)dt);
  return 0;
}

static cudaStream_t cuda_tr_stream(tt_backend *b) { return tt_cuda_st(b)->compute; }

/* Sum (max) over the 16 lanes of a half-warp (lanes l and l ^ 8, 4, 2, 1 stay in the half): every
 * lane of the warp must call it. */
static __device__ __forceinline__ float cuda_tr_sum16(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, 16);
  return v;
}
static __device__ __forceinline__ float cuda_tr_max16(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, 16));
  return v;
}
static __device__ __forceinline__ float cuda_tr_sum32(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* ------------------------------------- layer norm -------------------------------------- */

/* One warp per row, CUDA_LN_THREADS / 32 warps per block, each block CUDA_LN_BLOCK_ROWS
 * consecutive rows (warp w takes rows w, w + 4, ...), so that gamma and beta, staged in shared
 * memory once per block when f <= 32 * CUDA_LN_REG, are read from global memory once per 64
 * rows rather than once per row. A lane keeps its values of the row (columns lane, lane + 32,
 * ...) in registers when f <= 32 * CUDA_LN_REG (ViT-B's 768, ViT-L's 1024), so x is read once;
 * longer rows are read again from global memory for each pass (and gamma, beta from global
 * memory). Mean, then the sum of squared deviations from it (two passes, no cancellation), in
 * fp32. */
#define CUDA_LN_THREADS 128
#define CUDA_LN_ROWS_PER_BLOCK (CUDA_LN_THREADS / 32)
#define CUDA_LN_BLOCK_ROWS 64
#define CUDA_LN_REG 32
#define CUDA_LN_SHF (32 * CUDA_LN_REG) /* the longest row whose parameters are staged */

static __global__ void TT_LAUNCH_BOUNDS(CUDA_LN_THREADS) cuda_ln_fwd_k(int rows, int f, tt_dtype dt, const void *x,
                                                                       const float *gamma, const float *beta, float eps,
                                                                       void *y, float *save_mean, float *save_invstd) {
  __shared__ float sgam[CUDA_LN_SHF], sbet[CUDA_LN_SHF];
  const int lane = threadIdx.x & 31;
  const int r0 = blockIdx.x * CUDA_LN_BLOCK_ROWS, r1 = r0 + CUDA_LN_BLOCK_ROWS < rows ? r0 + CUDA_LN_BLOCK_ROWS : rows;
  if (f <= CUDA_LN_SHF) {
    for (int c = threadIdx.x; c < f; c += blockDim.x) sgam[c] = gamma[c], sbet[c] = beta[c];
    __syncthreads();
  }
  for (int row = r0 + (threadIdx.x >> 5); row < r1; row += CUDA_LN_ROWS_PER_BLOCK) {
    const size_t base = (size_t)row * (size_t)f;
    float s1 = 0.0f, s2 = 0.0f, mean, invstd;
    if (f <= CUDA_LN_SHF) {
      float v[CUDA_LN_REG];
      TT_UNROLL
      for (int k = 0; k < CUDA_LN_REG; k++) {
        int c = k * 32 + lane;
        v[k] = c < f ? tt_cuda_ld(dt, x, base + c) : 0.0f;
        s1 += v[k];
      }
      mean = cuda_tr_sum32(s1) / (float)f;
      TT_UNROLL
      for (int k = 0; k < CUDA_LN_REG; k++) {
        float dv = v[k] - mean;
        if (k * 32 + lane < f) s2 += dv * dv;
      }
      invstd = (float)(1.0 / sqrt((double)(cuda_tr_sum32(s2) / (float)f) + (double)eps));
      TT_UNROLL
      for (int k = 0; k < CUDA_LN_REG; k++) {
        int c = k * 32 + lane;
        if (c < f) tt_cuda_st(dt, y, base + c, (v[k] - mean) * invstd * sgam[c] + sbet[c]);
      }
    } else {
      for (int c = lane; c < f; c += 32) s1 += tt_cuda_ld(dt, x, base + c);
      mean = cuda_tr_sum32(s1) / (float)f;
      for (int c = lane; c < f; c += 32) {
        float dv = tt_cuda_ld(dt, x, base + c) - mean;
        s2 += dv * dv;
      }
      invstd = (float)(1.0 / sqrt((double)(cuda_tr_sum32(s2) / (float)f) + (double)eps));
      for (int c = lane; c < f; c += 32)
        tt_cuda_st(dt, y, base + c, (tt_cuda_ld(dt, x, base + c) - mean) * invstd * gamma[c] + beta[c]);
    }
    if (lane == 0 && save_mean) save_mean[row] = mean;
    if (lane == 0 && save_invstd) save_invstd[row] = invstd;
  }
}

/* The fused backward for f <= CUDA_LN_SHF: per row (one warp, the block's rows as forward's)
 * dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma (gamma staged once per
 * block), and, when part is non-NULL, the block's dgamma / dbeta partials from the same
 * registers: each lane sums dy * xhat and dy of its columns over its warp's rows (in row
 * order), then the 4 warps are added in warp order in shared memory and the block writes one
 * (sum dy*xhat, sum dy) pair per column to part[blockIdx.x * f + c]; cuda_ln_param_final_k sums
 * the blocks in order. x and dy are read once (the separate column pass below read them again).
 * dx may alias dy (beta_dx == 0): a row's dy is in registers before its dx is written. */
struct alignas(8) cuda_ln_f2 {
  float g, b; /* sum of dy * xhat, sum of dy */
};

static __global__ void TT_LAUNCH_BOUNDS(CUDA_LN_THREADS) cuda_ln_bwd_k(int rows, int f, tt_dtype dt, const void *x,
                                                                       const void *dy, const float *gamma,
                                                                       const float *save_mean, const float *save_invstd,
                                                                       void *dx, float beta_dx, cuda_ln_f2 *part) {
  __shared__ float sgam[CUDA_LN_SHF];
  __shared__ float sacc[2][CUDA_LN_SHF];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  const int r0 = blockIdx.x * CUDA_LN_BLOCK_ROWS, r1 = r0 + CUDA_LN_BLOCK_ROWS < rows ? r0 + CUDA_LN_BLOCK_ROWS : rows;
  float pg[CUDA_LN_REG], pb[CUDA_LN_REG];
  for (int c = threadIdx.x; c < f; c += blockDim.x) sgam[c] = gamma[c];
  __syncthreads();
  TT_UNROLL
  for (int k = 0; k < CUDA_LN_REG; k++) pg[k] = 0.0f, pb[k] = 0.0f;
  for (int row = r0 + wid; row < r1; row += CUDA_LN_ROWS_PER_BLOCK) {
    const size_t base = (size_t)row * (size_t)f;
    /* the row's statistics: one lane loads, the warp shares (one 4-byte request each) */
    const float mean = __shfl_sync(0xffffffffu, lane == 0 ? save_mean[row] : 0.0f, 0);
    const float invstd = __shfl_sync(0xffffffffu, lane == 0 ? save_invstd[row] : 0.0f, 0);
    float xh[CUDA_LN_REG], g[CUDA_LN_REG], s1 = 0.0f, s2 = 0.0f, a, bm;
    TT_UNROLL
    for (int k = 0; k < CUDA_LN_REG; k++) {
      int c = k * 32 + lane;
      float d = c < f ? tt_cuda_ld(dt, dy, base + c) : 0.0f;
      xh[k] = c < f ? (tt_cuda_ld(dt, x, base + c) - mean) * invstd : 0.0f;
      g[k] = c < f ? d * sgam[c] : 0.0f;
      pg[k] += d * xh[k], pb[k] += d;
      s1 += g[k];
      s2 += g[k] * xh[k];
    }
    if (dx) {
      a = cuda_tr_sum32(s1) / (float)f;
      bm = cuda_tr_sum32(s2) / (float)f;
      TT_UNROLL
      for (int k = 0; k < CUDA_LN_REG; k++) {
        int c = k * 32 + lane;
        if (c < f) tt_cuda_st_beta(dt, dx, base + c, invstd * (g[k] - a - xh[k] * bm), beta_dx);
      }
    }
  }
  if (!part) return; /* uniform across the block */
  for (int w = 0; w < CUDA_LN_ROWS_PER_BLOCK; w++) { /* warp order: deterministic */
    if (wid == w) {
      TT_UNROLL
      for (int k = 0; k < CUDA_LN_REG; k++) {
        int c = k * 32 + lane;
        if (c < f) {
          sacc[0][c] = w ? sacc[0][c] + pg[k] : pg[k];
          sacc[1][c] = w ? sacc[1][c] + pb[k] : pb[k];
        }
      }
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < f; c += blockDim.x) part[(size_t)blockIdx.x * f + c] = cuda_ln_f2{sacc[0][c], sacc[1][c]};
}

/* dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, per row (one warp):
 * rows longer than CUDA_LN_SHF (x and dy read twice, gamma per row). */
static __global__ void TT_LAUNCH_BOUNDS(CUDA_LN_THREADS) cuda_ln_dx_k(int rows, int f, tt_dtype dt, const void *x,
                                                                      const void *dy, const float *gamma,
                                                                      const float *save_mean, const float *save_invstd,
                                                                      void *dx, float beta_dx) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * CUDA_LN_ROWS_PER_BLOCK + (threadIdx.x >> 5);
  if (row >= rows) return;
  const size_t base = (size_t)row * (size_t)f;
  const float mean = save_mean[row], invstd = save_invstd[row];
  float s1 = 0.0f, s2 = 0.0f, a, bm;
  for (int c = lane; c < f; c += 32) {
    float xv = (tt_cuda_ld(dt, x, base + c) - mean) * invstd, gv = tt_cuda_ld(dt, dy, base + c) * gamma[c];
    s1 += gv;
    s2 += gv * xv;
  }
  a = cuda_tr_sum32(s1) / (float)f;
  bm = cuda_tr_sum32(s2) / (float)f;
  for (int c = lane; c < f; c += 32) {
    float xv = (tt_cuda_ld(dt, x, base + c) - mean) * invstd, gv = tt_cuda_ld(dt, dy, base + c) * gamma[c];
    tt_cuda_st_beta(dt, dx, base + c, invstd * (gv - a - xv * bm), beta_dx);
  }
}

/* dgamma and dbeta for rows longer than CUDA_LN_SHF: column sums over the rows. Grid (column
 * tiles of 32, splits): a block's threads are 32 columns x 8 row lanes, each lane summing every
 * 8th row of the split's contiguous run (a warp reads 32 consecutive columns of one row), the 8
 * lanes then summed in order in shared memory, one partial per split and column in the
 * workspace; the final kernel sums the splits in order. Deterministic: the geometry depends on
 * (rows, f) only. */
#define CUDA_LN_PTHREADS 256
#define CUDA_LN_MAX_SPLITS 64
#define CUDA_LN_ROWS_PER_SPLIT 256

static int cuda_ln_splits(int rows) {
  int s = (rows + CUDA_LN_ROWS_PER_SPLIT - 1) / CUDA_LN_ROWS_PER_SPLIT;
  return s < 1 ? 1 : (s > CUDA_LN_MAX_SPLITS ? CUDA_LN_MAX_SPLITS : s);
}

static __global__ void TT_LAUNCH_BOUNDS(CUDA_LN_PTHREADS) cuda_ln_param_part_k(int rows, int f, int chunk, tt_dtype dt,
                                                                               const void *x, const void *dy,
                                                                               const float *save_mean,
                                                                               const float *save_invstd, cuda_ln_f2 *part) {
  __shared__ float sh[2][CUDA_LN_PTHREADS / 32][33];
  const int cl = threadIdx.x & 31, rl = threadIdx.x >> 5, col = blockIdx.x * 32 + cl;
  int r0 = blockIdx.y * chunk, r1 = r0 + chunk;
  float sg = 0.0f, sb = 0.0f;
  if (r1 > rows) r1 = rows;
  if (col < f)
    for (int r = r0 + rl; r < r1; r += CUDA_LN_PTHREADS / 32) {
      size_t i = (size_t)r * (size_t)f + col;
      float g = tt_cuda_ld(dt, dy, i);
      sg += g * ((tt_cuda_ld(dt, x, i) - save_mean[r]) * save_invstd[r]);
      sb += g;
    }
  sh[0][rl][cl] = sg;
  sh[1][rl][cl] = sb;
  __syncthreads();
  if (rl == 0 && col < f) {
    float tg = 0.0f, tb = 0.0f;
    for (int k = 0; k < CUDA_LN_PTHREADS / 32; k++) tg += sh[0][k][cl], tb += sh[1][k][cl];
    part[(size_t)blockIdx.y * f + col] = cuda_ln_f2{tg, tb};
  }
}

/* One thread per column: the partials of the splits (blocks) in order, in double. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ln_param_final_k(int f, int splits, const cuda_ln_f2 *part,
                                                                               float *dgamma, float *dbeta,
                                                                               float beta_param) {
  TT_CUDA_LOOP(c, (size_t)f) {
    double tg = 0.0, tb = 0.0;
    for (int j = 0; j < splits; j++) {
      cuda_ln_f2 p = part[(size_t)j * f + c];
      tg += p.g, tb += p.b;
    }
    if (dgamma) dgamma[c] = beta_param != 0.0f ? beta_param * dgamma[c] + (float)tg : (float)tg;
    if (dbeta) dbeta[c] = beta_param != 0.0f ? beta_param * dbeta[c] + (float)tb : (float)tb;
  }
}

static int cuda_ln_check(tt_backend *b, const char *op, int rows, int f, tt_dtype dt) {
  if (rows <= 0 || f <= 0) return tt_cuda_fail(b, "%s: bad shape rows=%d f=%d", op, rows, f);
  if ((rows + CUDA_LN_ROWS_PER_BLOCK - 1) / CUDA_LN_ROWS_PER_BLOCK > 0x7fffffff / 2)
    return tt_cuda_fail(b, "%s: %d rows over the grid's limit", op, rows);
  return cuda_tr_dt(b, op, dt);
}

/* Blocks of ln_fwd and the fused ln_bwd: CUDA_LN_BLOCK_ROWS rows each. */
static int cuda_ln_blocks(int rows) { return (rows + CUDA_LN_BLOCK_ROWS - 1) / CUDA_LN_BLOCK_ROWS; }
/* Workspace of ln_bwd: the dgamma/dbeta partials, 8 bytes per column per block of the fused
 * kernel (f <= CUDA_LN_SHF) or per split of the column pass (ln_fwd takes none). */
static size_t cuda_ln_ws_bytes(int rows, int f) {
  return (size_t)(f <= CUDA_LN_SHF ? cuda_ln_blocks(rows) : cuda_ln_splits(rows)) * (size_t)f * sizeof(cuda_ln_f2);
}
size_t tt_cuda_ln_workspace(tt_backend *b, int rows, int f, tt_dtype dt, int bwd) {
  if (cuda_ln_check(b, bwd ? "ln_bwd" : "ln_fwd", rows, f, dt)) return TT_WS_ERROR;
  return bwd ? cuda_ln_ws_bytes(rows, f) : 0;
}

int tt_cuda_ln_fwd(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const float *gamma, const float *beta,
                   float eps, void *y, float *save_mean, float *save_invstd, void *ws, size_t ws_bytes) {
  (void)ws, (void)ws_bytes;
  if (cuda_ln_check(b, "ln_fwd", rows, f, dt)) return -1;
  if (!x || !gamma || !beta || !y) return tt_cuda_fail(b, "ln_fwd: NULL x, gamma, beta or y");
  TT_LAUNCH(cuda_ln_fwd_k, (unsigned)cuda_ln_blocks(rows), CUDA_LN_THREADS, 0, cuda_tr_stream(b), rows, f, dt, x, gamma,
            beta, eps, y, save_mean, save_invstd);
  CUDA_LAUNCH_CHECK(b, "ln_fwd");
  return 0;
}

int tt_cuda_ln_bwd(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                   const float *save_mean, const float *save_invstd, void *dx, float *dgamma, float *dbeta,
                   float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  if (cuda_ln_check(b, "ln_bwd", rows, f, dt)) return -1;
  if (!x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_cuda_fail(b, "ln_bwd: NULL x, dy, gamma, save_mean or save_invstd");
  if (dx && dx == dy && beta_dx != 0.0f) return tt_cuda_fail(b, "ln_bwd: dx may alias dy only when beta_dx == 0");
  if (dgamma || dbeta) {
    size_t need = cuda_ln_ws_bytes(rows, f);
    if (!ws || ws_bytes < need || ((uintptr_t)ws & 15))
      return tt_cuda_fail(b, "ln_bwd: workspace %zu bytes at %p, needs %zu bytes 16-byte aligned (op_workspace)",
                          ws_bytes, ws, need);
  }
  if (f <= CUDA_LN_SHF) { /* one pass: dx and the parameter partials */
    cuda_ln_f2 *part = dgamma || dbeta ? (cuda_ln_f2 *)ws : NULL;
    if (!dx && !part) return 0;
    TT_LAUNCH(cuda_ln_bwd_k, (unsigned)cuda_ln_blocks(rows), CUDA_LN_THREADS, 0, cuda_tr_stream(b), rows, f, dt, x, dy,
              gamma, save_mean, save_invstd, dx, beta_dx, part);
    CUDA_LAUNCH_CHECK(b, "ln_bwd");
    if (part) {
      TT_LAUNCH(cuda_ln_param_final_k, tt_cuda_blocks((size_t)f), TT_CUDA_THREADS, 0, cuda_tr_stream(b), f,
                cuda_ln_blocks(rows), (const cuda_ln_f2 *)part, dgamma, dbeta, beta_param);
      CUDA_LAUNCH_CHECK(b, "ln_bwd");
    }
    return 0;
  }
  if (dgamma || dbeta) {
    int splits = cuda_ln_splits(rows), chunk = (rows + splits - 1) / splits;
    /* first: it reads dy, which dx may overwrite below */
    TT_LAUNCH(cuda_ln_param_part_k, dim3((unsigned)((f + 31) / 32), (unsigned)splits), CUDA_LN_PTHREADS, 0,
              cuda_tr_stream(b), rows, f, chunk, dt, x, dy, save_mean, save_invstd, (cuda_ln_f2 *)ws);
    CUDA_LAUNCH_CHECK(b, "ln_bwd");
    TT_LAUNCH(cuda_ln_param_final_k, tt_cuda_blocks((size_t)f), TT_CUDA_THREADS, 0, cuda_tr_stream(b), f, splits,
              (const cuda_ln_f2 *)ws, dgamma, dbeta, beta_param);
    CUDA_LAUNCH_CHECK(b, "ln_bwd");
  }
  if (dx) {
    TT_LAUNCH(cuda_ln_dx_k, (unsigned)((rows + CUDA_LN_ROWS_PER_BLOCK - 1) / CUDA_LN_ROWS_PER_BLOCK), CUDA_LN_THREADS, 0,
              cuda_tr_stream(b), rows, f, dt, x, dy, gamma, save_mean, save_invstd, dx, beta_dx);
    CUDA_LAUNCH_CHECK(b, "ln_bwd");
  }
  return 0;
}

/* -------------------------------------- attention -------------------------------------- */

/* Every attention kernel runs 128 threads as 8 row groups x 16 lanes (g = tid / 16, l = tid % 16):
 * in a [rows, keys] tile a thread holds rows g, g + 8, ... and keys l, l + 16, ...; in a
 * [rows, D] accumulator rows g, g + 8, ... and columns l, l + 16, .... A row's 16 lanes are one
 * half-warp, so row maxima and sums are half-warp shuffles. Shared tiles are fp32 with rows
 * padded to D + 1 floats (no bank conflicts when 16 lanes read 16 rows at one column). */
#define CUDA_ATTN_THREADS 128
#define CUDA_ATTN_MAX_D 128
/* The attention kernels' launch bound names one resident block per multiprocessor as the
 * minimum, __launch_bounds__(CUDA_ATTN_THREADS, 1) (written out: tests/tools/cuda_check.py reads
 * it there): without it, ptxas for sm_90 caps the 128-column forward at 96 registers and spills;
 * with it every architecture keeps the accumulators in registers (at most 158 per thread, sm_120). */

/* Tile sizes per head-dimension class (queries BQ, keys BK), sized so that each kernel's shared
 * memory stays under 48 KiB: forward, dq and dk/dv. */
#define CUDA_ATTN_FWD_BQ 32
#define CUDA_ATTN_FWD_BK(D) ((D) > 64 ? 16 : 32)
#define CUDA_ATTN_BWD_B(D) ((D) > 64 ? 16 : 32)

typedef struct cuda_attn_args {
  int n, t, heads, d, causal;
  float scale;
  uint32_t thr;     /* dropout: kept iff (hash >> 32) >= thr */
  float dscale;     /* 1 / (1 - p); 0 when everything is dropped */
  int drop;         /* 0: p == 0 (no hashing) */
  int all_drop;
  uint64_t seed;
  tt_dtype dt;
  const void *qkv;  /* [n, t, 3, heads, d] */
  void *o;          /* forward: [n, t, heads, d] */
  float *lse;       /* [n, heads, t] */
  void *probs;      /* [n, heads, t, t] or NULL */
  const void *dout; /* backward */
  const void *ocst; /* backward: the forward's o */
  const float *lsec;
  const void *probsc;
  const float *dsum; /* backward: D = rowsum(dO * O), [n, heads, t] (workspace) */
  void *dqkv;
  float beta;
} cuda_attn_args;

/* Keep factor of probability (i, j) of (sample s, head h): dscale if kept, else 0. */
static __device__ __forceinline__ float cuda_attn_keep(const cuda_attn_args &a, int s, int h, int i, int j) {
  if (!a.drop) return 1.0f;
  if (a.all_drop) return 0.0f;
  uint64_t idx = (((uint64_t)s * (uint64_t)a.heads + (uint64_t)h) * (uint64_t)a.t + (uint64_t)i) * (uint64_t)a.t + (uint64_t)j;
  return (uint32_t)(tt_dropout_hash(a.seed, idx) >> 32) >= a.thr ? a.dscale : 0.0f;
}

/* Loads rows [r0, r0 + R) of part p (0 q, 1 k, 2 v) of head h, sample s into sh[R][D + 1] as fp32;
 * rows past t and columns past d are zero. */
template <int D, int R>
static __device__ __forceinline__ void cuda_attn_load_qkv(const cuda_attn_args &a, int s, int h, int p, int r0,
                                                          float (*sh)[D + 1]) {
  const size_t f = (size_t)a.heads * a.d;
  for (int e = threadIdx.x; e < R * D; e += CUDA_ATTN_THREADS) {
    int r = e / D, c = e % D, i = r0 + r;
    sh[r][c] = (i < a.t && c < a.d) ? tt_cuda_ld(a.dt, a.qkv, ((size_t)s * a.t + i) * 3 * f + (size_t)p * f + (size_t)h * a.d + c)
                                    : 0.0f;
  }
}
/* The same for a [n, t, heads, d] tensor (dout). */
template <int D, int R>
static __device__ __forceinline__ void cuda_attn_load_o(const cuda_attn_args &a, const void *src, int s, int h, int r0,
                                                        float (*sh)[D + 1]) {
  const size_t f = (size_t)a.heads * a.d;
  for (int e = threadIdx.x; e < R * D; e += CUDA_ATTN_THREADS) {
    int r = e / D, c = e % D, i = r0 + r;
    sh[r][c] = (i < a.t && c < a.d) ? tt_cuda_ld(a.dt, src, ((size_t)s * a.t + i) * f + (size_t)h * a.d + c) : 0.0f;
  }
}

template <int D, int BQ, int BK>
struct cuda_attn_fwd_smem {
  float q[BQ][D + 1], k[BK][D + 1], v[BK][D + 1], p[BQ][BK + 1];
};

template <int D, int BQ, int BK>
static __device__ __forceinline__ void cuda_attn_fwd_body(const cuda_attn_args &a, cuda_attn_fwd_smem<D, BQ, BK> &sm) {
  constexpr int RB = BQ / 8, KA = BK / 16, CM = D / 16;
  const int g = threadIdx.x >> 4, l = threadIdx.x & 15;
  const int q0 = blockIdx.x * BQ, h = blockIdx.y, s = blockIdx.z;
  const int kend = a.causal ? min(a.t, q0 + BQ) : a.t;
  float m[RB], lsum[RB], acc[RB][CM];
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    m[b] = -INFINITY, lsum[b] = 0.0f;
    TT_UNROLL
    for (int c = 0; c < CM; c++) acc[b][c] = 0.0f;
  }
  cuda_attn_load_qkv<D, BQ>(a, s, h, 0, q0, sm.q);
  for (int k0 = 0; k0 < kend; k0 += BK) {
    float sv[RB][KA];
    __syncthreads(); /* the previous tile's k, v and p are read; q is written */
    cuda_attn_load_qkv<D, BK>(a, s, h, 1, k0, sm.k);
    cuda_attn_load_qkv<D, BK>(a, s, h, 2, k0, sm.v);
    __syncthreads();
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) sv[b][ka] = 0.0f;
    }
    for (int c = 0; c < D; c++) {
      float qv[RB], kv[KA];
      TT_UNROLL
      for (int b = 0; b < RB; b++) qv[b] = sm.q[g + 8 * b][c];
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) kv[ka] = sm.k[l + 16 * ka][c];
      TT_UNROLL
      for (int b = 0; b < RB; b++) {
        TT_UNROLL
        for (int ka = 0; ka < KA; ka++) sv[b][ka] += qv[b] * kv[ka];
      }
    }
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int i = q0 + g + 8 * b;
      float mx = -INFINITY, mnew, corr, rs = 0.0f;
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) {
        const int j = k0 + l + 16 * ka;
        sv[b][ka] = (j >= a.t || (a.causal && j > i)) ? -INFINITY : sv[b][ka] * a.scale;
        mx = fmaxf(mx, sv[b][ka]);
      }
      mx = cuda_tr_max16(mx);
      mnew = fmaxf(m[b], mx);
      /* a row with every key so far masked keeps m = -inf, l = 0 and a zero accumulator */
      corr = mnew == -INFINITY ? 1.0f : expf(m[b] - mnew);
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) {
        const int j = k0 + l + 16 * ka;
        float e = sv[b][ka] == -INFINITY ? 0.0f : expf(sv[b][ka] - mnew);
        rs += e;
        sm.p[g + 8 * b][l + 16 * ka] = e == 0.0f ? 0.0f : e * cuda_attn_keep(a, s, h, i, j);
      }
      rs = cuda_tr_sum16(rs);
      lsum[b] = lsum[b] * corr + rs;
      m[b] = mnew;
      TT_UNROLL
      for (int c = 0; c < CM; c++) acc[b][c] *= corr;
    }
    __syncthreads();
    for (int jj = 0; jj < BK; jj++) {
      float vv[CM];
      TT_UNROLL
      for (int c = 0; c < CM; c++) vv[c] = sm.v[jj][l + 16 * c];
      TT_UNROLL
      for (int b = 0; b < RB; b++) {
        const float pv = sm.p[g + 8 * b][jj];
        TT_UNROLL
        for (int c = 0; c < CM; c++) acc[b][c] += pv * vv[c];
      }
    }
  }
  {
    const size_t f = (size_t)a.heads * a.d;
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int i = q0 + g + 8 * b;
      const float inv = 1.0f / lsum[b];
      if (i >= a.t) continue;
      TT_UNROLL
      for (int c = 0; c < CM; c++)
        if (l + 16 * c < a.d) tt_cuda_st(a.dt, a.o, ((size_t)s * a.t + i) * f + (size_t)h * a.d + l + 16 * c, acc[b][c] * inv);
      if (l == 0 && a.lse) a.lse[((size_t)s * a.heads + h) * a.t + i] = m[b] + logf(lsum[b]);
    }
  }
  if (!a.probs) return;
  /* The probabilities before dropout, recomputed tile by tile against the final lse; every
   * element of the block's rows is written (masked ones as 0), the whole [t, t] row. */
  for (int b = 0; b < RB; b++) m[b] = m[b] + logf(lsum[b]); /* lse */
  for (int k0 = 0; k0 < a.t; k0 += BK) {
    float sv[RB][KA];
    __syncthreads();
    if (k0 < kend) cuda_attn_load_qkv<D, BK>(a, s, h, 1, k0, sm.k); /* past kend every key is masked */
    __syncthreads();
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) sv[b][ka] = 0.0f;
    }
    if (k0 < kend)
      for (int c = 0; c < D; c++) {
        float qv[RB], kv[KA];
        TT_UNROLL
        for (int b = 0; b < RB; b++) qv[b] = sm.q[g + 8 * b][c];
        TT_UNROLL
        for (int ka = 0; ka < KA; ka++) kv[ka] = sm.k[l + 16 * ka][c];
        TT_UNROLL
        for (int b = 0; b < RB; b++) {
          TT_UNROLL
          for (int ka = 0; ka < KA; ka++) sv[b][ka] += qv[b] * kv[ka];
        }
      }
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int i = q0 + g + 8 * b;
      if (i >= a.t) continue;
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) {
        const int j = k0 + l + 16 * ka;
        if (j >= a.t) continue;
        float pv = (a.causal && j > i) ? 0.0f : expf(sv[b][ka] * a.scale - m[b]);
        tt_cuda_st(a.dt, a.probs, (((size_t)s * a.heads + h) * a.t + i) * a.t + j, pv);
      }
    }
  }
}

#define CUDA_ATTN_FWD_SMEM(D) cuda_attn_fwd_smem<(D), CUDA_ATTN_FWD_BQ, CUDA_ATTN_FWD_BK(D)>
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_fwd32_k(cuda_attn_args a) {
  __shared__ CUDA_ATTN_FWD_SMEM(32) sm;
  cuda_attn_fwd_body<32, CUDA_ATTN_FWD_BQ, CUDA_ATTN_FWD_BK(32)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_fwd64_k(cuda_attn_args a) {
  __shared__ CUDA_ATTN_FWD_SMEM(64) sm;
  cuda_attn_fwd_body<64, CUDA_ATTN_FWD_BQ, CUDA_ATTN_FWD_BK(64)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_fwd128_k(cuda_attn_args a) {
  __shared__ CUDA_ATTN_FWD_SMEM(128) sm;
  cuda_attn_fwd_body<128, CUDA_ATTN_FWD_BQ, CUDA_ATTN_FWD_BK(128)>(a, sm);
}

/* D = rowsum(dO * O) per (sample, head, query): one warp per row of d values; written
 * [n, heads, t] (fp32, the workspace). */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_attn_dsum_k(int n, int t, int heads, int d, tt_dtype dt,
                                                                          const void *dout, const void *o, float *dsum) {
  const size_t r = (size_t)blockIdx.x * (TT_CUDA_THREADS / 32) + (threadIdx.x >> 5); /* (s * t + i) * heads + h */
  const int lane = threadIdx.x & 31;
  float v = 0.0f;
  if (r >= (size_t)n * t * heads) return; /* the whole warp */
  for (int c = lane; c < d; c += 32) v += tt_cuda_ld(dt, dout, r * d + c) * tt_cuda_ld(dt, o, r * d + c);
  v = cuda_tr_sum32(v);
  if (lane == 0) {
    size_t h = r % (size_t)heads, si = r / (size_t)heads, i = si % (size_t)t, s = si / (size_t)t;
    dsum[(s * heads + h) * t + i] = v;
  }
}

/* The score tile's backward quantities for rows (i = q0 + g + 8b) and keys (j = k0 + l + 16ka):
 * P (rebuilt from lse, or read from probs), pd = P * keep (what multiplied v), and
 * ds = P * (keep * dO.v - D). q, dO are [BQ][D + 1] tiles, k, v [BK][D + 1]; lse_s, ds_s the
 * rows' lse and D. */
template <int D, int BQ, int BK>
static __device__ __forceinline__ void cuda_attn_bwd_scores(const cuda_attn_args &a, int s, int h, int q0, int k0,
                                                            const float (*q)[D + 1], const float (*dO)[D + 1],
                                                            const float (*k)[D + 1], const float (*v)[D + 1],
                                                            const float *lse_s, const float *dd_s,
                                                            float (*pd)[BK + 1], float (*ds)[BK + 1]) {
  constexpr int RB = BQ / 8, KA = BK / 16;
  const int g = threadIdx.x >> 4, l = threadIdx.x & 15;
  float sv[RB][KA], dp[RB][KA];
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    TT_UNROLL
    for (int ka = 0; ka < KA; ka++) sv[b][ka] = 0.0f, dp[b][ka] = 0.0f;
  }
  for (int c = 0; c < D; c++) {
    float qv[RB], ov[RB], kv[KA], vv[KA];
    TT_UNROLL
    for (int b = 0; b < RB; b++) qv[b] = q[g + 8 * b][c], ov[b] = dO[g + 8 * b][c];
    TT_UNROLL
    for (int ka = 0; ka < KA; ka++) kv[ka] = k[l + 16 * ka][c], vv[ka] = v[l + 16 * ka][c];
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      TT_UNROLL
      for (int ka = 0; ka < KA; ka++) sv[b][ka] += qv[b] * kv[ka], dp[b][ka] += ov[b] * vv[ka];
    }
  }
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    const int i = q0 + g + 8 * b;
    TT_UNROLL
    for (int ka = 0; ka < KA; ka++) {
      const int j = k0 + l + 16 * ka;
      float p = 0.0f, keep = 0.0f;
      if (i < a.t && j < a.t && !(a.causal && j > i)) {
        p = a.probsc ? tt_cuda_ld(a.dt, a.probsc, (((size_t)s * a.heads + h) * a.t + i) * a.t + j)
                     : expf(sv[b][ka] * a.scale - lse_s[g + 8 * b]);
        keep = cuda_attn_keep(a, s, h, i, j);
      }
      pd[g + 8 * b][l + 16 * ka] = p * keep;
      ds[g + 8 * b][l + 16 * ka] = p * (keep * dp[b][ka] - dd_s[g + 8 * b]);
    }
  }
}

/* Loads the rows' lse (or 0 where probs replace it) and D into shared memory. */
template <int BQ>
static __device__ __forceinline__ void cuda_attn_load_rowstats(const cuda_attn_args &a, int s, int h, int q0,
                                                               float *lse_s, float *dd_s) {
  for (int r = threadIdx.x; r < BQ; r += CUDA_ATTN_THREADS) {
    int i = q0 + r;
    size_t ri = ((size_t)s * a.heads + h) * a.t + i;
    lse_s[r] = (i < a.t && a.lsec) ? a.lsec[ri] : 0.0f;
    dd_s[r] = i < a.t ? a.dsum[ri] : 0.0f;
  }
}

template <int D, int B>
struct cuda_attn_bwd_smem {
  float q[B][D + 1], dO[B][D + 1], k[B][D + 1], v[B][D + 1];
  float pd[B][B + 1], ds[B][B + 1];
  float lse[B], dd[B];
};

/* dq for one query tile: over the key tiles, dq += ds k; dq = scale * that. */
template <int D, int B>
static __device__ __forceinline__ void cuda_attn_dq_body(const cuda_attn_args &a, cuda_attn_bwd_smem<D, B> &sm) {
  constexpr int RB = B / 8, CM = D / 16;
  const int g = threadIdx.x >> 4, l = threadIdx.x & 15;
  const int q0 = blockIdx.x * B, h = blockIdx.y, s = blockIdx.z;
  const int kend = a.causal ? min(a.t, q0 + B) : a.t;
  float acc[RB][CM];
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    TT_UNROLL
    for (int c = 0; c < CM; c++) acc[b][c] = 0.0f;
  }
  cuda_attn_load_qkv<D, B>(a, s, h, 0, q0, sm.q);
  cuda_attn_load_o<D, B>(a, a.dout, s, h, q0, sm.dO);
  cuda_attn_load_rowstats<B>(a, s, h, q0, sm.lse, sm.dd);
  for (int k0 = 0; k0 < kend; k0 += B) {
    __syncthreads();
    cuda_attn_load_qkv<D, B>(a, s, h, 1, k0, sm.k);
    cuda_attn_load_qkv<D, B>(a, s, h, 2, k0, sm.v);
    __syncthreads();
    cuda_attn_bwd_scores<D, B, B>(a, s, h, q0, k0, sm.q, sm.dO, sm.k, sm.v, sm.lse, sm.dd, sm.pd, sm.ds);
    __syncthreads();
    for (int jj = 0; jj < B; jj++) {
      float kv[CM];
      TT_UNROLL
      for (int c = 0; c < CM; c++) kv[c] = sm.k[jj][l + 16 * c];
      TT_UNROLL
      for (int b = 0; b < RB; b++) {
        const float dsv = sm.ds[g + 8 * b][jj];
        TT_UNROLL
        for (int c = 0; c < CM; c++) acc[b][c] += dsv * kv[c];
      }
    }
  }
  {
    const size_t f = (size_t)a.heads * a.d;
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int i = q0 + g + 8 * b;
      if (i >= a.t) continue;
      TT_UNROLL
      for (int c = 0; c < CM; c++)
        if (l + 16 * c < a.d)
          tt_cuda_st_beta(a.dt, a.dqkv, ((size_t)s * a.t + i) * 3 * f + (size_t)h * a.d + l + 16 * c, acc[b][c] * a.scale,
                          a.beta);
    }
  }
}

/* dk, dv for one key tile: over the query tiles, dv += pd^T dO, dk += ds^T q; dk = scale * that. */
template <int D, int B>
static __device__ __forceinline__ void cuda_attn_dkv_body(const cuda_attn_args &a, cuda_attn_bwd_smem<D, B> &sm) {
  constexpr int RB = B / 8, CM = D / 16;
  const int g = threadIdx.x >> 4, l = threadIdx.x & 15;
  const int k0 = blockIdx.x * B, h = blockIdx.y, s = blockIdx.z;
  float dk[RB][CM], dv[RB][CM];
  TT_UNROLL
  for (int b = 0; b < RB; b++) {
    TT_UNROLL
    for (int c = 0; c < CM; c++) dk[b][c] = 0.0f, dv[b][c] = 0.0f;
  }
  cuda_attn_load_qkv<D, B>(a, s, h, 1, k0, sm.k);
  cuda_attn_load_qkv<D, B>(a, s, h, 2, k0, sm.v);
  /* causal: query tiles wholly before the key tile see none of its keys */
  for (int q0 = a.causal ? k0 / B * B : 0; q0 < a.t; q0 += B) {
    __syncthreads();
    cuda_attn_load_qkv<D, B>(a, s, h, 0, q0, sm.q);
    cuda_attn_load_o<D, B>(a, a.dout, s, h, q0, sm.dO);
    cuda_attn_load_rowstats<B>(a, s, h, q0, sm.lse, sm.dd);
    __syncthreads();
    cuda_attn_bwd_scores<D, B, B>(a, s, h, q0, k0, sm.q, sm.dO, sm.k, sm.v, sm.lse, sm.dd, sm.pd, sm.ds);
    __syncthreads();
    for (int ii = 0; ii < B; ii++) {
      float qv[CM], ov[CM];
      TT_UNROLL
      for (int c = 0; c < CM; c++) qv[c] = sm.q[ii][l + 16 * c], ov[c] = sm.dO[ii][l + 16 * c];
      TT_UNROLL
      for (int b = 0; b < RB; b++) {
        const float pdv = sm.pd[ii][g + 8 * b], dsv = sm.ds[ii][g + 8 * b];
        TT_UNROLL
        for (int c = 0; c < CM; c++) dv[b][c] += pdv * ov[c], dk[b][c] += dsv * qv[c];
      }
    }
  }
  {
    const size_t f = (size_t)a.heads * a.d;
    TT_UNROLL
    for (int b = 0; b < RB; b++) {
      const int j = k0 + g + 8 * b;
      if (j >= a.t) continue;
      TT_UNROLL
      for (int c = 0; c < CM; c++)
        if (l + 16 * c < a.d) {
          size_t base = ((size_t)s * a.t + j) * 3 * f + (size_t)h * a.d + l + 16 * c;
          tt_cuda_st_beta(a.dt, a.dqkv, base + f, dk[b][c] * a.scale, a.beta);
          tt_cuda_st_beta(a.dt, a.dqkv, base + 2 * f, dv[b][c], a.beta);
        }
    }
  }
}

#define CUDA_ATTN_BWD_SMEM(D) cuda_attn_bwd_smem<(D), CUDA_ATTN_BWD_B(D)>
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dq32_k(cuda_attn_args a) {
  __shared__ CUDA_ATTN_BWD_SMEM(32) sm;
  cuda_attn_dq_body<32, CUDA_ATTN_BWD_B(32)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dq64_k(cuda_attn_args a) {
  __shared__ CUDA_ATTN_BWD_SMEM(64) sm;
  cuda_attn_dq_body<64, CUDA_ATTN_BWD_B(64)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dq128_k(cuda_attn_args a) {
  __shared__ CUDA_ATTN_BWD_SMEM(128) sm;
  cuda_attn_dq_body<128, CUDA_ATTN_BWD_B(128)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dkv32_k(cuda_attn_args a) {
  __shared__ CUDA_ATTN_BWD_SMEM(32) sm;
  cuda_attn_dkv_body<32, CUDA_ATTN_BWD_B(32)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dkv64_k(cuda_attn_args a) {
  __shared__ CUDA_ATTN_BWD_SMEM(64) sm;
  cuda_attn_dkv_body<64, CUDA_ATTN_BWD_B(64)>(a, sm);
}
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS, 1) cuda_attn_dkv128_k(cuda_attn_args a) {
  __shared__ CUDA_ATTN_BWD_SMEM(128) sm;
  cuda_attn_dkv_body<128, CUDA_ATTN_BWD_B(128)>(a, sm);
}

/* The head-dimension class: the smallest instantiation holding d (0: too large). */
static int cuda_attn_class(int d) { return d <= 32 ? 32 : d <= 64 ? 64 : d <= CUDA_ATTN_MAX_D ? 128 : 0; }

static int cuda_attn_check(tt_backend *b, const char *op, const tt_attn_desc *d, tt_dtype dt) {
  if (!d) return tt_cuda_fail(b, "%s: NULL attention desc", op);
  if (d->n <= 0 || d->t <= 0 || d->heads <= 0 || d->d <= 0)
    return tt_cuda_fail(b, "%s: bad shape n=%d t=%d heads=%d d=%d", op, d->n, d->t, d->heads, d->d);
  if (!cuda_attn_class(d->d))
    return tt_cuda_fail(b, "%s: head dimension %d is over the CUDA attention kernel's %d (dim / heads); use more heads",
                        op, d->d, CUDA_ATTN_MAX_D);
  if (d->n > 65535 || d->heads > 65535)
    return tt_cuda_fail(b, "%s: n=%d or heads=%d over the grid's 65535", op, d->n, d->heads);
  if (!(d->p >= 0.0f && d->p <= 1.0f))
    return tt_cuda_fail(b, "%s: attention dropout %g is outside [0, 1]", op, (double)d->p);
  return cuda_tr_dt(b, op, dt);
}

static void cuda_attn_fill(cuda_attn_args *a, const tt_attn_desc *d, tt_dtype dt, uint64_t seed) {
  memset(a, 0, sizeof *a);
  a->n = d->n, a->t = d->t, a->heads = d->heads, a->d = d->d, a->causal = d->causal != 0;
  a->scale = d->scale, a->seed = seed, a->dt = dt;
  a->drop = d->p > 0.0f;
  a->all_drop = d->p >= 1.0f;
  a->thr = a->all_drop ? 0u : (uint32_t)((double)d->p * 4294967296.0); /* as the dropout op */
  a->dscale = a->all_drop ? 0.0f : 1.0f / (1.0f - d->p);
}

/* Workspace of attn_bwd: D, n * heads * t floats. The forward takes none. */
static size_t cuda_attn_ws_bytes(const tt_attn_desc *d) { return (size_t)d->n * d->heads * d->t * sizeof(float); }
size_t tt_cuda_attn_workspace(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, int bwd) {
  if (cuda_attn_check(b, bwd ? "attn_bwd" : "attn_fwd", d, dt)) return TT_WS_ERROR;
  return bwd ? cuda_attn_ws_bytes(d) : 0;
}

int tt_cuda_attn_fwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, void *o, float *lse,
                     void *probs, uint64_t seed, void *ws, size_t ws_bytes) {
  cuda_attn_args a;
  (void)ws, (void)ws_bytes;
  if (cuda_attn_check(b, "attn_fwd", d, dt)) return -1;
  if (!qkv || !o) return tt_cuda_fail(b, "attn_fwd: NULL qkv or o");
  cuda_attn_fill(&a, d, dt, seed);
  a.qkv = qkv, a.o = o, a.lse = lse, a.probs = probs;
  {
    dim3 grid((unsigned)((d->t + CUDA_ATTN_FWD_BQ - 1) / CUDA_ATTN_FWD_BQ), (unsigned)d->heads, (unsigned)d->n);
    switch (cuda_attn_class(d->d)) {
      case 32: TT_LAUNCH(cuda_attn_fwd32_k, grid, CUDA_ATTN_THREADS, 0, cuda_tr_stream(b), a); break;
      case 64: TT_LAUNCH(cuda_attn_fwd64_k, grid, CUDA_ATTN_THREADS, 0, cuda_tr_stream(b), a); break;
      default: TT_LAUNCH(cuda_attn_fwd128_k, grid, CUDA_ATTN_THREADS, 0, cuda_tr_stream(b), a); break;
    }
  }
  CUDA_LAUNCH_CHECK(b, "attn_fwd");
  return 0;
}

int tt_cuda_attn_bwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, const void *o,
                     const void *dout, const float *lse, const void *probs, uint64_t seed, void *dqkv, float beta,
                     void *ws, size_t ws_bytes) {
  cuda_attn_args a;
  size_t need;
  int cls;
  if (cuda_attn_check(b, "attn_bwd", d, dt)) return -1;
  if (!qkv || !o || !dout || !dqkv) return tt_cuda_fail(b, "attn_bwd: NULL qkv, o, dout or dqkv");
  if (!lse && !probs) return tt_cuda_fail(b, "attn_bwd: needs lse (the fused form) or the forward's probs");
  if (dqkv == qkv || dqkv == o || dqkv == dout)
    return tt_cuda_fail(b, "attn_bwd: dqkv may not alias qkv, o or dout (backward reads them while writing it)");
  need = cuda_attn_ws_bytes(d);
  if (!ws || ws_bytes < need || ((uintptr_t)ws & 3))
    return tt_cuda_fail(b, "attn_bwd: workspace %zu bytes at %p, needs %zu bytes (op_workspace)", ws_bytes, ws, need);
  cuda_attn_fill(&a, d, dt, seed);
  a.qkv = qkv, a.ocst = o, a.dout = dout, a.lsec = lse, a.probsc = probs, a.dsum = (const float *)ws;
  a.dqkv = dqkv, a.beta = beta;
  {
    size_t rows = (size_t)d->n * d->t * d->heads;
    TT_LAUNCH(cuda_attn_dsum_k, (unsigned)((rows + TT_CUDA_THREADS / 32 - 1) / (TT_CUDA_THREADS / 32)), TT_CUDA_THREADS, 0,
              cuda_tr_stream(b), d->n, d->t, d->heads, d->d, dt, dout, o, (float *)ws);
    CUDA_LAUNCH_CHECK(b, "attn_bwd");
  }
  cls = cuda_attn_class(d->d);
  {
    int bt = CUDA_ATTN_BWD_B(cls);
    dim3 grid((unsigned)((d->t + bt - 1) / bt), (unsigned)d->heads, (unsigned)d->n);
    switch (cls) {
      case 32:
        TT_LAUNCH(cuda_attn_dq32_k, grid, CUDA_ATTN_THREADS, 0, cuda_tr_stream(b), a);
        CUDA_LAUNCH_CHECK(b, "attn_bwd");
        TT_LAUNCH(cuda_attn_dkv32_k, grid, CUDA_ATTN_THREADS, 0, cuda_tr_stream(b), a);
        break;
      case 64:
        TT_LAUNCH(cuda_attn_dq64_k, grid, CUDA_ATTN_THREADS, 0, cuda_tr_stream(b), a);
        CUDA_LAUNCH_CHECK(b, "attn_bwd");
        TT_LAUNCH(cuda_attn_dkv64_k, grid, CUDA_ATTN_THREADS, 0, cuda_tr_stream(b), a);
        break;
      default:
        TT_LAUNCH(cuda_attn_dq128_k, grid, CUDA_ATTN_THREADS, 0, cuda_tr_stream(b), a);
        CUDA_LAUNCH_CHECK(b, "attn_bwd");
        TT_LAUNCH(cuda_attn_dkv128_k, grid, CUDA_ATTN_THREADS, 0, cuda_tr_stream(b), a);
        break;
    }
    CUDA_LAUNCH_CHECK(b, "attn_bwd");
  }
  return 0;
}

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
  return cuda_tr_dt(b, op, dt);
}

int tt_cuda_tokens_fwd(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *x, const float *cls_tok,
                       const float *pos, void *y) {
  if (cuda_tok_check(b, "tokens_fwd", n, f, hw, cls, dt)) return -1;
  if (!x || !y || (cls && !cls_tok)) return tt_cuda_fail(b, "tokens_fwd: NULL x, y or (with a class token) cls_tok");
  TT_LAUNCH(cuda_tok_fwd_k, dim3((unsigned)((hw + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)((f + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)n),
            CUDA_TOK_THREADS, 0, cuda_tr_stream(b), f, hw, cls, dt, x, cls_tok, pos, y);
  CUDA_LAUNCH_CHECK(b, "tokens_fwd");
  return 0;
}

int tt_cuda_tokens_bwd(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *dy, void *dx,
                       float *dcls, float *dpos, float beta_dx, float beta_param) {
  if (cuda_tok_check(b, "tokens_bwd", n, f, hw, cls, dt)) return -1;
  if (!dy) return tt_cuda_fail(b, "tokens_bwd: NULL dy");
  if (dcls || dpos) { /* one pass over dy: dx and the batch sums */
    TT_LAUNCH(cuda_tok_bwd_k, dim3((unsigned)((hw + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)((f + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE)),
              CUDA_TOK_THREADS, 0, cuda_tr_stream(b), n, f, hw, cls, dt, dy, dx, beta_dx, dcls, dpos, beta_param);
    CUDA_LAUNCH_CHECK(b, "tokens_bwd");
  } else if (dx) {
    TT_LAUNCH(cuda_tok_dx_k, dim3((unsigned)((hw + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)((f + CUDA_TOK_TILE - 1) / CUDA_TOK_TILE), (unsigned)n),
              CUDA_TOK_THREADS, 0, cuda_tr_stream(b), f, hw, cls, dt, dy, dx, beta_dx);
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
  if (cuda_tr_dt(b, "token_pool_fwd", dt)) return -1;
  if (!x || !y) return tt_cuda_fail(b, "token_pool_fwd: NULL x or y");
  TT_LAUNCH(cuda_pool_tok_fwd_k, tt_cuda_blocks((size_t)n * f), TT_CUDA_THREADS, 0, cuda_tr_stream(b), n, t, f, mode, dt, x,
            y);
  CUDA_LAUNCH_CHECK(b, "token_pool_fwd");
  return 0;
}

int tt_cuda_token_pool_bwd(tt_backend *b, int n, int t, int f, int mode, tt_dtype dt, const void *dy, void *dx,
                           float beta) {
  int token0_only = mode == 0 && beta == 1.0f;
  if (n <= 0 || t <= 0 || f <= 0 || (mode != 0 && mode != 1))
    return tt_cuda_fail(b, "token_pool_bwd: bad shape n=%d t=%d f=%d mode=%d", n, t, f, mode);
  if (cuda_tr_dt(b, "token_pool_bwd", dt)) return -1;
  if (!dy || !dx) return tt_cuda_fail(b, "token_pool_bwd: NULL dy or dx");
  TT_LAUNCH(cuda_pool_tok_bwd_k, tt_cuda_blocks((size_t)n * f), TT_CUDA_THREADS, 0, cuda_tr_stream(b), n, t, f, mode,
            token0_only, dt, dy, dx, beta);
  CUDA_LAUNCH_CHECK(b, "token_pool_bwd");
  return 0;
}

const tt_cuda_kernel tt_cuda_transformer_kernels[] = {
    TT_CUDA_KERNEL(cuda_ln_fwd_k, CUDA_LN_THREADS),
    TT_CUDA_KERNEL(cuda_ln_dx_k, CUDA_LN_THREADS),
    TT_CUDA_KERNEL(cuda_ln_bwd_k, CUDA_LN_THREADS),
    TT_CUDA_KERNEL(cuda_ln_param_part_k, CUDA_LN_PTHREADS),
    TT_CUDA_KERNEL(cuda_ln_param_final_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_attn_fwd32_k, CUDA_ATTN_THREADS),
    TT_CUDA_KERNEL(cuda_attn_fwd64_k, CUDA_ATTN_THREADS),
    TT_CUDA_KERNEL(cuda_attn_fwd128_k, CUDA_ATTN_THREADS),
    TT_CUDA_KERNEL(cuda_attn_dsum_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_attn_dq32_k, CUDA_ATTN_THREADS),
    TT_CUDA_KERNEL(cuda_attn_dq64_k, CUDA_ATTN_THREADS),
    TT_CUDA_KERNEL(cuda_attn_dq128_k, CUDA_ATTN_THREADS),
    TT_CUDA_KERNEL(cuda_attn_dkv32_k, CUDA_ATTN_THREADS),
    TT_CUDA_KERNEL(cuda_attn_dkv64_k, CUDA_ATTN_THREADS),
    TT_CUDA_KERNEL(cuda_attn_dkv128_k, CUDA_ATTN_THREADS),
    TT_CUDA_KERNEL(cuda_tok_fwd_k, CUDA_TOK_THREADS),
    TT_CUDA_KERNEL(cuda_tok_dx_k, CUDA_TOK_THREADS),
    TT_CUDA_KERNEL(cuda_tok_bwd_k, CUDA_TOK_THREADS),
    TT_CUDA_KERNEL(cuda_pool_tok_fwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_tok_bwd_k, TT_CUDA_THREADS),
};
const int tt_cuda_transformer_nkernels = (int)(sizeof tt_cuda_transformer_kernels / sizeof tt_cuda_transformer_kernels[0]);
