/* kernels/cuda/cuda_layernorm.cu — layer norm of backend.h on the CUDA backend's own kernels, the
 * reference backend's semantics (kernels/ref/): fp32 statistics over the last dimension (biased
 * variance); beta 0 overwrites (never 0*old), as everywhere in the backend.
 *
 * Determinism: no float atomics. dgamma and dbeta, sums over rows, are summed in a fixed order:
 * per-block partials in the planned workspace, then one thread per output summing them in block
 * order.
 */
#include <math.h>
#include <string.h>

#include "cuda_internal.h"

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
      mean = tt_cuda_sum32(s1) / (float)f;
      TT_UNROLL
      for (int k = 0; k < CUDA_LN_REG; k++) {
        float dv = v[k] - mean;
        if (k * 32 + lane < f) s2 += dv * dv;
      }
      invstd = (float)(1.0 / sqrt((double)(tt_cuda_sum32(s2) / (float)f) + (double)eps));
      TT_UNROLL
      for (int k = 0; k < CUDA_LN_REG; k++) {
        int c = k * 32 + lane;
        if (c < f) tt_cuda_st(dt, y, base + c, (v[k] - mean) * invstd * sgam[c] + sbet[c]);
      }
    } else {
      for (int c = lane; c < f; c += 32) s1 += tt_cuda_ld(dt, x, base + c);
      mean = tt_cuda_sum32(s1) / (float)f;
      for (int c = lane; c < f; c += 32) {
        float dv = tt_cuda_ld(dt, x, base + c) - mean;
        s2 += dv * dv;
      }
      invstd = (float)(1.0 / sqrt((double)(tt_cuda_sum32(s2) / (float)f) + (double)eps));
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
      a = tt_cuda_sum32(s1) / (float)f;
      bm = tt_cuda_sum32(s2) / (float)f;
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
  a = tt_cuda_sum32(s1) / (float)f;
  bm = tt_cuda_sum32(s2) / (float)f;
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
  return tt_cuda_dt_check(b, op, dt);
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
  TT_LAUNCH(cuda_ln_fwd_k, (unsigned)cuda_ln_blocks(rows), CUDA_LN_THREADS, 0, tt_cuda_stream(b), rows, f, dt, x, gamma,
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
    TT_LAUNCH(cuda_ln_bwd_k, (unsigned)cuda_ln_blocks(rows), CUDA_LN_THREADS, 0, tt_cuda_stream(b), rows, f, dt, x, dy,
              gamma, save_mean, save_invstd, dx, beta_dx, part);
    CUDA_LAUNCH_CHECK(b, "ln_bwd");
    if (part) {
      TT_LAUNCH(cuda_ln_param_final_k, tt_cuda_blocks((size_t)f), TT_CUDA_THREADS, 0, tt_cuda_stream(b), f,
                cuda_ln_blocks(rows), (const cuda_ln_f2 *)part, dgamma, dbeta, beta_param);
      CUDA_LAUNCH_CHECK(b, "ln_bwd");
    }
    return 0;
  }
  if (dgamma || dbeta) {
    int splits = cuda_ln_splits(rows), chunk = (rows + splits - 1) / splits;
    /* first: it reads dy, which dx may overwrite below */
    TT_LAUNCH(cuda_ln_param_part_k, dim3((unsigned)((f + 31) / 32), (unsigned)splits), CUDA_LN_PTHREADS, 0,
              tt_cuda_stream(b), rows, f, chunk, dt, x, dy, save_mean, save_invstd, (cuda_ln_f2 *)ws);
    CUDA_LAUNCH_CHECK(b, "ln_bwd");
    TT_LAUNCH(cuda_ln_param_final_k, tt_cuda_blocks((size_t)f), TT_CUDA_THREADS, 0, tt_cuda_stream(b), f, splits,
              (const cuda_ln_f2 *)ws, dgamma, dbeta, beta_param);
    CUDA_LAUNCH_CHECK(b, "ln_bwd");
  }
  if (dx) {
    TT_LAUNCH(cuda_ln_dx_k, (unsigned)((rows + CUDA_LN_ROWS_PER_BLOCK - 1) / CUDA_LN_ROWS_PER_BLOCK), CUDA_LN_THREADS, 0,
              tt_cuda_stream(b), rows, f, dt, x, dy, gamma, save_mean, save_invstd, dx, beta_dx);
    CUDA_LAUNCH_CHECK(b, "ln_bwd");
  }
  return 0;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(layernorm, TT_CUDA_KERNEL(cuda_ln_fwd_k, CUDA_LN_THREADS),
                     TT_CUDA_KERNEL(cuda_ln_dx_k, CUDA_LN_THREADS), TT_CUDA_KERNEL(cuda_ln_bwd_k, CUDA_LN_THREADS),
                     TT_CUDA_KERNEL(cuda_ln_param_part_k, CUDA_LN_PTHREADS),
                     TT_CUDA_KERNEL(cuda_ln_param_final_k, TT_CUDA_THREADS));
