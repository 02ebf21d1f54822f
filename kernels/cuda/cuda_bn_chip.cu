/* kernels/cuda/cuda_bn_chip.cu — batch norm held on chip: one read of x (and dy) where a block's
 * channels fit its shared memory. The entry points (cuda_bn.cu) try this form first
 * (tt_cuda_bn_chip_fwd, tt_cuda_bn_chip_bwd) and take the two-pass forms where it does not apply.
 *
 * The two-pass forms (cuda_bn.cu) read x twice in the training forward (statistics, then normalisation) and x
 * and dy twice backward (sums, then dx): 1.5x and 1.67x the op's minimum bytes. Where a group of
 * channels' values fit a block's shared memory, one block per group copies them in once (16-byte
 * vectors), reduces per channel there, and writes y (dx) from there: each tensor read once and
 * written once, in one launch instead of three (docs/gpu.md#batch-norm-held-on-chip).
 *
 * A block takes g consecutive channels, g = 16 / gcd(hw * element bytes, 16) (1 where a plane is
 * whole 16-byte vectors, 8 at 7x7 in fp16, 2 at 14x14): the smallest count whose run per sample,
 * g planes, is whole vectors, so with 16-byte aligned tensors every run starts on a vector. The
 * shared buffer holds the block's n runs in sample order (x; then dy backward). Per channel,
 * TT_CUDA_THREADS / g threads (whole warps: g <= 8) sum its n * hw values in fp32 each, the warp
 * sums in double by a fixed shuffle tree, the channel's warps in order: deterministic. The
 * forward sums x - K (K the channel's first value) as cuda_bn_stats_k does; the statistics agree
 * with the two-pass forms' to rounding, not bit for bit; the per-element arithmetic (cuda_bn_y,
 * cuda_bn_dx_value) and the finishing of the sums (cuda_bn_stats_finish, cuda_bn_bwd_finish) are
 * theirs. Applies when hw > 1, c is a multiple of g, every tensor is 16-byte aligned and the
 * block's bytes fit the backend's cap (tt_cuda_state.bn_res_cap: the device's opt-in limit, below).
 * NHWC rows (hw == 1) have their own form here (cuda_bnc_*, below the NCHW one). */
#include <stdlib.h>
#include <string.h>

#include "cuda_bn.h"

#define CUDA_BN_RES_MAXG 8
#define CUDA_BN_RES_WARPS (TT_CUDA_THREADS / 32)
static_assert(TT_CUDA_THREADS % (32 * CUDA_BN_RES_MAXG) == 0, "a channel's threads are whole warps");

typedef struct cuda_bn_rgeom {
  int n, hw, g;
  int rv;             /* 16-byte vectors per sample's run (g planes) */
  size_t sv;          /* vectors from one sample to the next in the tensor (c * hw elements) */
  int tv;             /* the block's vectors: n * rv */
  int step_s, step_k; /* TT_CUDA_THREADS vectors as (samples, vectors of a run) */
  int per;            /* threads per channel, TT_CUDA_THREADS / g */
  int pst_s, pst_j;   /* per elements as (samples, positions in a plane) */
} cuda_bn_rgeom;

/* Calls f(vector in the block's buffer, vector in the tensor, element offset in its run) for
 * this thread's vectors, TT_CUDA_THREADS apart; (sample, vector) advance by additions. */
template <typename F>
static __device__ __forceinline__ void cuda_bn_res_walk(const cuda_bn_rgeom &g, F f) {
  int s = (int)threadIdx.x / g.rv, k = (int)threadIdx.x % g.rv; /* once per thread */
  for (int iv = threadIdx.x; iv < g.tv; iv += TT_CUDA_THREADS) {
    f(iv, (size_t)s * g.sv + (size_t)blockIdx.x * g.rv + k, k);
    k += g.step_k, s += g.step_s;
    if (k >= g.rv) k -= g.rv, s++;
  }
}

/* Copies the block's runs of t (x or dy) into buf, 16 bytes at a time, CUDA_BN_RES_ILP loads in
 * flight per thread before their stores: at the cap a T4 holds one 256-thread block per
 * multiprocessor, whose 256 loads at a time (4 KiB) would leave its share of the memory
 * bandwidth idle between round trips; four at a time keep about 16 KiB in flight. The walk is
 * cuda_bn_res_walk's, unrolled. */
#define CUDA_BN_RES_ILP 4
static __device__ __forceinline__ void cuda_bn_res_load(const cuda_bn_rgeom &g, const void *t, unsigned char *buf) {
  int s = (int)threadIdx.x / g.rv, k = (int)threadIdx.x % g.rv; /* once per thread */
  for (int iv0 = threadIdx.x; iv0 < g.tv; iv0 += CUDA_BN_RES_ILP * TT_CUDA_THREADS) {
    tt_cuda_u4 u[CUDA_BN_RES_ILP] = {};
    TT_UNROLL
    for (int q = 0; q < CUDA_BN_RES_ILP; q++) {
      if (iv0 + q * TT_CUDA_THREADS < g.tv)
        u[q] = tt_cuda_ld16((const char *)t + ((size_t)s * g.sv + (size_t)blockIdx.x * g.rv + k) * 16);
      k += g.step_k, s += g.step_s;
      if (k >= g.rv) k -= g.rv, s++;
    }
    TT_UNROLL
    for (int q = 0; q < CUDA_BN_RES_ILP; q++)
      if (iv0 + q * TT_CUDA_THREADS < g.tv) tt_cuda_st16(buf + (size_t)(iv0 + q * TT_CUDA_THREADS) * 16, u[q]);
  }
}

/* Calls f(element index in buf) over this thread's share of channel ch's n * hw values (thread
 * p of the channel's per: elements p, p + per, ... of the channel in (sample, position) order). */
template <typename F>
static __device__ __forceinline__ void cuda_bn_res_chan(const cuda_bn_rgeom &g, int ch, int p, F f) {
  const size_t run = (size_t)g.g * g.hw;
  int s = p / g.hw, j = p % g.hw; /* once per thread */
  while (s < g.n) {
    f((size_t)s * run + (size_t)ch * g.hw + j);
    j += g.pst_j, s += g.pst_s;
    if (j >= g.hw) j -= g.hw, s++;
  }
}

/* Per channel of the block, (sum of a, sum of b) over its threads: each thread's fp32 pair in
 * double, a shuffle tree per warp, then the channel's warps in order (thread ch < g gets its
 * channel's; the others 0). */
static __device__ __forceinline__ void cuda_bn_res_reduce(const cuda_bn_rgeom &g, float a, float b, double (*ws)[2],
                                                          double *ta, double *tb) {
  double da = a, db = b;
  for (int off = 16; off > 0; off >>= 1) {
    da += __shfl_down_sync(0xffffffffu, da, off);
    db += __shfl_down_sync(0xffffffffu, db, off);
  }
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5][0] = da, ws[threadIdx.x >> 5][1] = db;
  __syncthreads();
  *ta = *tb = 0.0;
  if ((int)threadIdx.x < g.g) {
    const int w0 = (int)threadIdx.x * (g.per / 32);
    for (int w = w0; w < w0 + g.per / 32; w++) *ta += ws[w][0], *tb += ws[w][1];
  }
}

template <int V>
static __device__ __forceinline__ void cuda_bn_res_fwd_body(const cuda_bn_rgeom &g, tt_dtype dt, const void *x,
                                                            const float *gamma, const float *bias, void *y,
                                                            float *running_mean, float *running_var, float momentum,
                                                            float eps, float *save_mean, float *save_invstd,
                                                            int update_running, int relu, const void *s) {
  __shared__ double ws[CUDA_BN_RES_WARPS][2];
  __shared__ float sc[CUDA_BN_RES_MAXG][4]; /* mean, invstd, gamma, bias per channel of the block */
  TT_CUDA_DYN_SHARED(buf);                  /* n runs of x: n * g * hw elements */
  const int ch = (int)threadIdx.x / g.per, p = (int)threadIdx.x % g.per;
  const size_t m = (size_t)g.n * g.hw;
  float s1 = 0.0f, s2 = 0.0f, K;
  double t1, t2;
  cuda_bn_res_load(g, x, buf);
  __syncthreads();
  K = tt_cuda_ld(dt, buf, (size_t)ch * g.hw); /* sample 0's first value: cuda_bn_first */
  cuda_bn_res_chan(g, ch, p, [&](size_t e) {
    float d = tt_cuda_ld(dt, buf, e) - K;
    s1 += d;
    s2 += d * d;
  });
  cuda_bn_res_reduce(g, s1, s2, ws, &t1, &t2);
  if ((int)threadIdx.x < g.g) {
    const size_t cg = (size_t)blockIdx.x * g.g + threadIdx.x; /* the channel in the tensor */
    float mean, invstd;
    /* thread t < g finishes the block's channel t, whose K is its first value in buf */
    cuda_bn_stats_finish(tt_cuda_ld(dt, buf, (size_t)threadIdx.x * g.hw), t1, t2, m, eps, momentum, update_running,
                         running_mean, running_var, cg, &mean, &invstd);
    save_mean[cg] = mean, save_invstd[cg] = invstd;
    sc[threadIdx.x][0] = mean, sc[threadIdx.x][1] = invstd, sc[threadIdx.x][2] = gamma[cg], sc[threadIdx.x][3] = bias[cg];
  }
  __syncthreads();
  cuda_bn_res_walk(g, [&](int iv, size_t gv, int k) {
    const int r0 = k * V;
    int c0 = r0 / g.hw, j = r0 - c0 * g.hw; /* one division per vector */
    float v[V], sv[V] = {}; /* sv: the shortcut's values (bn_fwd_train_add_relu), read before y is written */
    tt_cuda_ldv<V>(dt, buf, (size_t)iv, v);
    if (s) tt_cuda_ldv<V>(dt, s, gv, sv);
    for (int q = 0; q < V; q++) {
      v[q] = cuda_bn_out(dt, cuda_bn_y(v[q], sc[c0][0], sc[c0][1], sc[c0][2], sc[c0][3]), relu, s != NULL, sv[q]);
      if (++j == g.hw) j = 0, c0++;
    }
    tt_cuda_stv<V>(dt, y, gv, v);
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_res_fwd_k(cuda_bn_rgeom g, tt_dtype dt, const void *x,
                                                                           const float *gamma, const float *bias, void *y,
                                                                           float *running_mean, float *running_var,
                                                                           float momentum, float eps, float *save_mean,
                                                                           float *save_invstd, int update_running, int relu,
                                                                           const void *s) {
  if (dt == TT_F32)
    cuda_bn_res_fwd_body<4>(g, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                            update_running, relu, s);
  else
    cuda_bn_res_fwd_body<8>(g, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                            update_running, relu, s);
}

template <int V>
static __device__ __forceinline__ void cuda_bn_res_bwd_body(const cuda_bn_rgeom &g, tt_dtype dt, const void *x,
                                                            const void *dy, const float *gamma, const float *bias,
                                                            int relu, const float *save_mean, const float *save_invstd,
                                                            void *dx, float *dgamma, float *dbias, float beta_dx,
                                                            float beta_param) {
  __shared__ double ws[CUDA_BN_RES_WARPS][2];
  /* per channel of the block: mean, invstd, gamma, bias (the ReLU's mask), gamma * invstd, and
   * the two means dx needs (cuda_bn_bwd_final_k's md) */
  __shared__ float sc[CUDA_BN_RES_MAXG][7];
  TT_CUDA_DYN_SHARED(buf); /* n runs of x, then n runs of dy */
  unsigned char *bdy = buf + (size_t)g.tv * 16;
  const int ch = (int)threadIdx.x / g.per, p = (int)threadIdx.x % g.per;
  const size_t m = (size_t)g.n * g.hw;
  float s1 = 0.0f, s2 = 0.0f, mean, invstd, gm, bb;
  double t1, t2;
  if ((int)threadIdx.x < g.g) {
    const size_t cg = (size_t)blockIdx.x * g.g + threadIdx.x;
    sc[threadIdx.x][0] = save_mean[cg], sc[threadIdx.x][1] = save_invstd[cg];
    sc[threadIdx.x][2] = gamma[cg], sc[threadIdx.x][3] = relu ? bias[cg] : 0.0f;
  }
  cuda_bn_res_load(g, x, buf);
  cuda_bn_res_load(g, dy, bdy);
  __syncthreads();
  mean = sc[ch][0], invstd = sc[ch][1], gm = sc[ch][2], bb = sc[ch][3];
  cuda_bn_res_chan(g, ch, p, [&](size_t e) {
    const float xv = tt_cuda_ld(dt, buf, e);
    const float gv = cuda_bn_relu_grad(dt, relu, tt_cuda_ld(dt, bdy, e), xv, mean, invstd, gm, bb);
    s1 += gv;
    s2 += gv * ((xv - mean) * invstd);
  });
  cuda_bn_res_reduce(g, s1, s2, ws, &t1, &t2);
  if ((int)threadIdx.x < g.g) {
    const cuda_bn_f2 d = cuda_bn_bwd_finish(t1, t2, m, beta_param, dgamma, dbias, (size_t)blockIdx.x * g.g + threadIdx.x);
    sc[threadIdx.x][4] = sc[threadIdx.x][2] * sc[threadIdx.x][1];
    sc[threadIdx.x][5] = d.x, sc[threadIdx.x][6] = d.y;
  }
  if (!dx) return; /* uniform over the block: no barrier is skipped by some threads only */
  __syncthreads();
  cuda_bn_res_walk(g, [&](int iv, size_t gv, int k) {
    const int r0 = k * V;
    int c0 = r0 / g.hw, j = r0 - c0 * g.hw; /* one division per vector */
    float xv[V], dv[V], ov[V] = {};         /* ov read only with beta_dx (initialised for the compiler) */
    tt_cuda_ldv<V>(dt, buf, (size_t)iv, xv);
    tt_cuda_ldv<V>(dt, bdy, (size_t)iv, dv);
    if (beta_dx != 0.0f) tt_cuda_ldv<V>(dt, dx, gv, ov);
    for (int q = 0; q < V; q++) {
      const float *k7 = sc[c0];
      float v = cuda_bn_dx_value(dt, relu, dv[q], xv[q], k7[0], k7[1], k7[4], k7[5], k7[6], k7[2], k7[3]);
      xv[q] = beta_dx != 0.0f ? v + beta_dx * ov[q] : v;
      if (++j == g.hw) j = 0, c0++;
    }
    tt_cuda_stv<V>(dt, dx, gv, xv);
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_res_bwd_k(cuda_bn_rgeom g, tt_dtype dt, const void *x,
                                                                           const void *dy, const float *gamma,
                                                                           const float *bias, int relu,
                                                                           const float *save_mean, const float *save_invstd,
                                                                           void *dx, float *dgamma, float *dbias,
                                                                           float beta_dx, float beta_param) {
  if (dt == TT_F32)
    cuda_bn_res_bwd_body<4>(g, dt, x, dy, gamma, bias, relu, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                            beta_param);
  else
    cuda_bn_res_bwd_body<8>(g, dt, x, dy, gamma, bias, relu, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                            beta_param);
}

/* The held-on-chip form's geometry for a call over `tensors` inputs (1: x; 2: x and dy) and its
 * shared memory in *bytes; 0 when it does not apply (see above). */
static int cuda_bn_res_geometry(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *const *ptrs, int nptrs,
                                int tensors, cuda_bn_rgeom *g, size_t *bytes) {
  const size_t es = tt_dtype_size(dt), cap = tt_cuda_st(b)->bn_res_cap;
  size_t plane = (size_t)hw * es, run, gcd = 16;
  int gr;
  if (!cap || hw < 2 || (dt != TT_F32 && dt != TT_F16 && dt != TT_BF16)) return 0;
  for (size_t a = plane % 16, t; a;) t = gcd % a, gcd = a, a = t; /* gcd(plane, 16) */
  gr = (int)(16 / gcd);
  if (gr > CUDA_BN_RES_MAXG || c % gr) return 0;
  for (int i = 0; i < nptrs; i++)
    if (ptrs[i] && ((uintptr_t)ptrs[i] & 15)) return 0;
  run = (size_t)gr * plane; /* bytes per sample's run: whole vectors */
  if ((size_t)n * run > cap / (size_t)tensors) return 0;
  *bytes = (size_t)tensors * n * run;
  g->n = n, g->hw = hw, g->g = gr;
  g->rv = (int)(run / 16);
  g->sv = (size_t)c * plane / 16;
  g->tv = n * g->rv;
  g->step_s = TT_CUDA_THREADS / g->rv, g->step_k = TT_CUDA_THREADS % g->rv;
  g->per = TT_CUDA_THREADS / gr;
  g->pst_s = g->per / hw, g->pst_j = g->per % hw;
  return 1;
}

/* ---- held on chip on NHWC rows (hw == 1: [rows, c], cuda_bn_rows.cu's layout) ----
 * A block takes tc = 2 consecutive 16-byte columns of every row (one where the row is one
 * vector): 2 * V channels (16 in fp16), all the rows, copied into shared memory once (rows x 32
 * bytes: whole sectors). Thread t is row lane t / tc of column t % tc; it sums its rows' V channels
 * in fp32, the lanes are added in double by a fixed shuffle tree per warp and the warps in order
 * (deterministic), then it normalises (dx) its rows from the buffer with the channels' constants
 * in registers. Applies where the block's bytes fit the cap and the grid, cv / tc blocks, is at
 * least half the multiprocessors (ResNet-50's 1024 and 2048 channels in fp16 on an H100's 132: 64
 * and 128 blocks; fewer would leave most of the memory system idle: the two-pass row kernels,
 * whose grid is two blocks a multiprocessor, take those). */
#define CUDA_BNC_MAXC (2 * 8) /* channels a block: 2 columns of 8 */

typedef struct cuda_bn_cgeom {
  int rows, cv, tc, rl; /* rows; 16-byte vectors a row; columns a block; row lanes (TT_CUDA_THREADS / tc) */
} cuda_bn_cgeom;

/* Copies the block's columns of every row of t into buf (row r, column k at vector r * tc + k), 16
 * bytes at a time, CUDA_BN_RES_ILP loads in flight before their stores (cuda_bn_res_load's reason);
 * a column past the row's end (odd cv) is skipped. */
static __device__ __forceinline__ void cuda_bnc_load(const cuda_bn_cgeom &g, const void *t, unsigned char *buf) {
  const int tv = g.rows * g.tc, sh = g.tc == 2 ? 1 : 0, j0 = (int)blockIdx.x * g.tc;
  for (int iv0 = threadIdx.x; iv0 < tv; iv0 += CUDA_BN_RES_ILP * TT_CUDA_THREADS) {
    tt_cuda_u4 u[CUDA_BN_RES_ILP] = {};
    TT_UNROLL
    for (int q = 0; q < CUDA_BN_RES_ILP; q++) {
      const int iv = iv0 + q * TT_CUDA_THREADS, r = iv >> sh, k = iv - (r << sh);
      if (iv < tv && j0 + k < g.cv) u[q] = tt_cuda_ld16((const char *)t + ((size_t)r * g.cv + j0 + k) * 16);
    }
    TT_UNROLL
    for (int q = 0; q < CUDA_BN_RES_ILP; q++)
      if (iv0 + q * TT_CUDA_THREADS < tv) tt_cuda_st16(buf + (size_t)(iv0 + q * TT_CUDA_THREADS) * 16, u[q]);
  }
}

/* Per channel of the block, the sums of a and b over the row lanes: a shuffle tree per warp over
 * the lanes of one column (threads tc apart), the warps in order; thread k < tc * V gets channel
 * k's (column k / V, element k % V) in *ta, *tb. */
template <int V>
static __device__ __forceinline__ void cuda_bnc_reduce(const cuda_bn_cgeom &g, const float *a, const float *b,
                                                       double (*ws)[CUDA_BNC_MAXC][2], double *ta, double *tb) {
  const int w = (int)threadIdx.x >> 5, l = (int)threadIdx.x & 31, col = (int)threadIdx.x % g.tc;
  TT_UNROLL
  for (int q = 0; q < V; q++) {
    double da = a[q], db = b[q];
    for (int off = 16; off >= g.tc; off >>= 1) {
      da += __shfl_down_sync(0xffffffffu, da, off);
      db += __shfl_down_sync(0xffffffffu, db, off);
    }
    if (l < g.tc) ws[w][col * V + q][0] = da, ws[w][col * V + q][1] = db;
  }
  __syncthreads();
  *ta = *tb = 0.0;
  if ((int)threadIdx.x < g.tc * V)
    for (int k = 0; k < CUDA_BN_RES_WARPS; k++) *ta += ws[k][threadIdx.x][0], *tb += ws[k][threadIdx.x][1];
}

template <int V>
static __device__ __forceinline__ void cuda_bnc_fwd_body(const cuda_bn_cgeom &g, tt_dtype dt, const void *x,
                                                         const float *gamma, const float *bias, void *y,
                                                         float *running_mean, float *running_var, float momentum,
                                                         float eps, float *save_mean, float *save_invstd,
                                                         int update_running, int relu, const void *s,
                                                         double (*ws)[CUDA_BNC_MAXC][2], float (*sc)[4]) {
  TT_CUDA_DYN_SHARED(buf); /* rows x tc vectors of x */
  const int lane = (int)threadIdx.x / g.tc, col = (int)threadIdx.x - lane * g.tc, j = (int)blockIdx.x * g.tc + col;
  const int on = lane < g.rl && j < g.cv, c = g.cv * V;
  float s1[V] = {}, s2[V] = {}, K[V], v[V];
  double t1, t2;
  cuda_bnc_load(g, x, buf);
  __syncthreads();
  if (on) {
    tt_cuda_ldv<V>(dt, buf, (size_t)col, K); /* row 0: the channels' first values */
    for (int r = lane; r < g.rows; r += g.rl) {
      tt_cuda_ldv<V>(dt, buf, (size_t)r * g.tc + col, v);
      TT_UNROLL
      for (int q = 0; q < V; q++) {
        const float d = v[q] - K[q];
        s1[q] += d;
        s2[q] += d * d;
      }
    }
  }
  cuda_bnc_reduce<V>(g, s1, s2, ws, &t1, &t2);
  if ((int)threadIdx.x < g.tc * V && (int)blockIdx.x * g.tc * V + (int)threadIdx.x < c) {
    const int k = (int)threadIdx.x, cg = (int)blockIdx.x * g.tc * V + k;
    float mean, invstd;
    cuda_bn_stats_finish(tt_cuda_ld(dt, buf, (size_t)k), t1, t2, (size_t)g.rows, eps, momentum, update_running,
                         running_mean, running_var, (size_t)cg, &mean, &invstd);
    save_mean[cg] = mean, save_invstd[cg] = invstd;
    sc[k][0] = mean, sc[k][1] = invstd, sc[k][2] = gamma[cg], sc[k][3] = bias[cg];
  }
  __syncthreads();
  if (!on) return;
  {
    float mean[V], invstd[V], gm[V], bb[V];
    TT_UNROLL
    for (int q = 0; q < V; q++) {
      const float *k4 = sc[col * V + q];
      mean[q] = k4[0], invstd[q] = k4[1], gm[q] = k4[2], bb[q] = k4[3];
    }
    for (int r = lane; r < g.rows; r += g.rl) {
      const size_t gv = (size_t)r * g.cv + j;
      float sv[V] = {}; /* the shortcut (bn_fwd_train_add_relu), read before y is written */
      tt_cuda_ldv<V>(dt, buf, (size_t)r * g.tc + col, v);
      if (s) tt_cuda_ldv<V>(dt, s, gv, sv);
      TT_UNROLL
      for (int q = 0; q < V; q++) v[q] = cuda_bn_out(dt, cuda_bn_y(v[q], mean[q], invstd[q], gm[q], bb[q]), relu, s != NULL, sv[q]);
      tt_cuda_stv<V>(dt, y, gv, v);
    }
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bnc_fwd_k(cuda_bn_cgeom g, tt_dtype dt, const void *x,
                                                                        const float *gamma, const float *bias, void *y,
                                                                        float *running_mean, float *running_var,
                                                                        float momentum, float eps, float *save_mean,
                                                                        float *save_invstd, int update_running, int relu,
                                                                        const void *s) {
  /* here, not in the bodies: one copy for both instantiations (the cap is the opt-in limit less it) */
  __shared__ double ws[CUDA_BN_RES_WARPS][CUDA_BNC_MAXC][2];
  __shared__ float sc[CUDA_BNC_MAXC][4]; /* mean, invstd, gamma, bias per channel of the block */
  if (dt == TT_F32)
    cuda_bnc_fwd_body<4>(g, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                         update_running, relu, s, ws, sc);
  else
    cuda_bnc_fwd_body<8>(g, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                         update_running, relu, s, ws, sc);
}

template <int V>
static __device__ __forceinline__ void cuda_bnc_bwd_body(const cuda_bn_cgeom &g, tt_dtype dt, const void *x,
                                                         const void *dy, const float *gamma, const float *bias, int relu,
                                                         const float *save_mean, const float *save_invstd, void *dx,
                                                         float *dgamma, float *dbias, float beta_dx, float beta_param,
                                                         double (*ws)[CUDA_BNC_MAXC][2], float (*sc)[7]) {
  TT_CUDA_DYN_SHARED(buf); /* rows x tc vectors of x, then of dy */
  unsigned char *bdy = buf + (size_t)g.rows * g.tc * 16;
  const int lane = (int)threadIdx.x / g.tc, col = (int)threadIdx.x - lane * g.tc, j = (int)blockIdx.x * g.tc + col;
  const int on = lane < g.rl && j < g.cv, c = g.cv * V, k = (int)threadIdx.x, cg = (int)blockIdx.x * g.tc * V + k;
  const int mine = k < g.tc * V && cg < c; /* this thread finishes channel cg */
  float s1[V] = {}, s2[V] = {}, mean[V], invstd[V], gm[V], bb[V], xv[V], gv[V];
  double t1, t2;
  if (mine) sc[k][0] = save_mean[cg], sc[k][1] = save_invstd[cg], sc[k][2] = gamma[cg], sc[k][3] = relu ? bias[cg] : 0.0f;
  cuda_bnc_load(g, x, buf);
  cuda_bnc_load(g, dy, bdy);
  __syncthreads();
  if (on) {
    TT_UNROLL
    for (int q = 0; q < V; q++) {
      const float *k4 = sc[col * V + q];
      mean[q] = k4[0], invstd[q] = k4[1], gm[q] = k4[2], bb[q] = k4[3];
    }
    for (int r = lane; r < g.rows; r += g.rl) {
      tt_cuda_ldv<V>(dt, buf, (size_t)r * g.tc + col, xv);
      tt_cuda_ldv<V>(dt, bdy, (size_t)r * g.tc + col, gv);
      TT_UNROLL
      for (int q = 0; q < V; q++) {
        const float gq = cuda_bn_relu_grad(dt, relu, gv[q], xv[q], mean[q], invstd[q], gm[q], bb[q]);
        s1[q] += gq;
        s2[q] += gq * ((xv[q] - mean[q]) * invstd[q]);
      }
    }
  }
  cuda_bnc_reduce<V>(g, s1, s2, ws, &t1, &t2);
  if (mine) {
    const cuda_bn_f2 d = cuda_bn_bwd_finish(t1, t2, (size_t)g.rows, beta_param, dgamma, dbias, (size_t)cg);
    sc[k][4] = sc[k][2] * sc[k][1], sc[k][5] = d.x, sc[k][6] = d.y;
  }
  if (!dx) return; /* uniform over the block: no barrier is skipped by some threads only */
  __syncthreads();
  if (!on) return;
  {
    float a[V], mdy[V], mdyx[V];
    TT_UNROLL
    for (int q = 0; q < V; q++) a[q] = sc[col * V + q][4], mdy[q] = sc[col * V + q][5], mdyx[q] = sc[col * V + q][6];
    for (int r = lane; r < g.rows; r += g.rl) {
      const size_t gvi = (size_t)r * g.cv + j;
      float ov[V] = {}; /* read only with beta_dx */
      tt_cuda_ldv<V>(dt, buf, (size_t)r * g.tc + col, xv);
      tt_cuda_ldv<V>(dt, bdy, (size_t)r * g.tc + col, gv);
      if (beta_dx != 0.0f) tt_cuda_ldv<V>(dt, dx, gvi, ov);
      TT_UNROLL
      for (int q = 0; q < V; q++) {
        const float v = cuda_bn_dx_value(dt, relu, gv[q], xv[q], mean[q], invstd[q], a[q], mdy[q], mdyx[q], gm[q], bb[q]);
        xv[q] = beta_dx != 0.0f ? v + beta_dx * ov[q] : v;
      }
      tt_cuda_stv<V>(dt, dx, gvi, xv);
    }
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bnc_bwd_k(cuda_bn_cgeom g, tt_dtype dt, const void *x,
                                                                        const void *dy, const float *gamma,
                                                                        const float *bias, int relu, const float *save_mean,
                                                                        const float *save_invstd, void *dx, float *dgamma,
                                                                        float *dbias, float beta_dx, float beta_param) {
  __shared__ double ws[CUDA_BN_RES_WARPS][CUDA_BNC_MAXC][2];
  /* per channel of the block: mean, invstd, gamma, bias (the mask), gamma * invstd, md's two means */
  __shared__ float sc[CUDA_BNC_MAXC][7];
  if (dt == TT_F32)
    cuda_bnc_bwd_body<4>(g, dt, x, dy, gamma, bias, relu, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param,
                         ws, sc);
  else
    cuda_bnc_bwd_body<8>(g, dt, x, dy, gamma, bias, relu, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param,
                         ws, sc);
}

/* The rows form's geometry for `tensors` inputs and its shared memory in *bytes; 0 when it does
 * not apply (above). */
static int cuda_bnc_geometry(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *const *ptrs, int nptrs,
                             int tensors, cuda_bn_cgeom *g, size_t *bytes) {
  const size_t cap = tt_cuda_st(b)->bn_res_cap;
  int v, cv, tc;
  if (!cap || hw != 1 || !tt_cuda_dtype_ok(dt)) return 0;
  v = (int)(16 / tt_dtype_size(dt));
  if (c % v) return 0;
  for (int i = 0; i < nptrs; i++)
    if (ptrs[i] && ((uintptr_t)ptrs[i] & 15)) return 0;
  cv = c / v, tc = cv < 2 ? cv : 2;
  if (2 * ((cv + tc - 1) / tc) < tt_cuda_st(b)->sms || (size_t)n * tc * 16 > cap / (size_t)tensors) return 0;
  *bytes = (size_t)tensors * n * tc * 16;
  g->rows = n, g->cv = cv, g->tc = tc, g->rl = TT_CUDA_THREADS / tc;
  return 1;
}

int tt_cuda_bn_chip_fwd(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x,
                        const float *gamma, const float *bias, void *y, float *running_mean, float *running_var,
                        float momentum, float eps, float *save_mean, float *save_invstd, int update_running, int relu,
                        const void *s) {
  const void *ptrs[3] = {x, y, s};
  cuda_bn_rgeom rg;
  cuda_bn_cgeom cgm;
  size_t sh;
  if (cuda_bnc_geometry(b, n, c, hw, dt, ptrs, s ? 3 : 2, 1, &cgm, &sh)) { /* NHWC rows */
    TT_LAUNCH(cuda_bnc_fwd_k, (unsigned)((cgm.cv + cgm.tc - 1) / cgm.tc), TT_CUDA_THREADS, sh, tt_cuda_stream(b), cgm, dt,
              x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running, relu, s);
    CUDA_LAUNCH_CHECK(b, op);
    return 1;
  }
  if (!cuda_bn_res_geometry(b, n, c, hw, dt, ptrs, s ? 3 : 2, 1, &rg, &sh)) return 0;
  TT_LAUNCH(cuda_bn_res_fwd_k, (unsigned)(c / rg.g), TT_CUDA_THREADS, sh, tt_cuda_stream(b), rg, dt, x, gamma, bias, y,
            running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running, relu, s);
  CUDA_LAUNCH_CHECK(b, op);
  return 1;
}

int tt_cuda_bn_chip_bwd(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                        const float *gamma, const float *bias, int relu, const float *save_mean,
                        const float *save_invstd, void *dx, float *dgamma, float *dbias, float beta_dx,
                        float beta_param) {
  const void *ptrs[3] = {x, dy, dx};
  cuda_bn_rgeom rg;
  cuda_bn_cgeom cgm;
  size_t sh;
  if (cuda_bnc_geometry(b, n, c, hw, dt, ptrs, 3, 2, &cgm, &sh)) { /* NHWC rows */
    TT_LAUNCH(cuda_bnc_bwd_k, (unsigned)((cgm.cv + cgm.tc - 1) / cgm.tc), TT_CUDA_THREADS, sh, tt_cuda_stream(b), cgm, dt,
              x, dy, gamma, bias, relu, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param);
    CUDA_LAUNCH_CHECK(b, op);
    return 1;
  }
  if (!cuda_bn_res_geometry(b, n, c, hw, dt, ptrs, 3, 2, &rg, &sh)) return 0;
  TT_LAUNCH(cuda_bn_res_bwd_k, (unsigned)(c / rg.g), TT_CUDA_THREADS, sh, tt_cuda_stream(b), rg, dt, x, dy, gamma, bias,
            relu, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param);
  CUDA_LAUNCH_CHECK(b, op);
  return 1;
}

/* Setup (cuda_backend.cu, after the kernel check): the held-on-chip batch norm's cap on a
 * block's dynamic shared memory, the device's opt-in limit per block
 * (cudaDevAttrMaxSharedMemoryPerBlockOptin: 64 KiB on a T4, 99 KiB on sm_86/89/120, 163 KiB on an
 * A100, 227 KiB on an H100) less the kernels' static shared memory, and the kernels' opt-in
 * attribute (cudaFuncAttributeMaxDynamicSharedMemorySize) set to it. So a card takes the form for
 * as large a batch as it can hold: the same shape may take it on an H100 and the two-pass forms on
 * a T4, whose statistics agree to rounding, not bit for bit (runs on one card repeat their bits).
 * tests/tools/cuda_check.py holds every architecture's static shared memory of these kernels under
 * its opt-in limit; TINYTRAIN_CUDA_BN_RESIDENT=0 turns the form off. */
int tt_cuda_norm_setup(tt_backend *b, const cudaDeviceProp *prop) {
  tt_cuda_state *st = tt_cuda_st(b);
  const void *ks[4] = {(const void *)cuda_bn_res_fwd_k, (const void *)cuda_bn_res_bwd_k, (const void *)cuda_bnc_fwd_k,
                       (const void *)cuda_bnc_bwd_k};
  size_t stat = 0, cap;
  int optin = 0;
  st->sms = prop->multiProcessorCount; /* the row kernels' grids (cuda_bn_rows.cu) */
  st->bn_res_cap = st->bn_res_cap_default = 0;
  if (!st->knobs.cuda_bn_resident) return 0; /* TINYTRAIN_CUDA_BN_RESIDENT=0 */
  CUDA_CHECK(b, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, st->device));
  for (int k = 0; k < 4; k++) { /* the most static shared memory of the four kernels */
    cudaFuncAttributes fa;
    CUDA_CHECK(b, cudaFuncGetAttributes(&fa, ks[k]));
    if (fa.sharedSizeBytes > stat) stat = fa.sharedSizeBytes;
  }
  if (optin <= 0 || (size_t)optin <= stat) return 0;
  cap = ((size_t)optin - stat) & ~(size_t)15; /* whole 16-byte vectors */
  if (cap > prop->sharedMemPerBlock)
    for (int k = 0; k < 4; k++)
      CUDA_CHECK(b, cudaFuncSetAttribute(ks[k], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap));
  st->bn_res_cap = st->bn_res_cap_default = cap;
  return 0;
}

extern "C" size_t tt_cuda_set_bn_resident(tt_backend *b, size_t bytes) {
  tt_cuda_state *st = tt_cuda_of(b);
  size_t old;
  if (!st) return 0;
  old = st->bn_res_cap;
  st->bn_res_cap = bytes > st->bn_res_cap_default ? st->bn_res_cap_default : bytes;
  return old;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(bn_chip, TT_CUDA_KERNEL(cuda_bn_res_fwd_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_bn_res_bwd_k, TT_CUDA_THREADS), TT_CUDA_KERNEL(cuda_bnc_fwd_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_bnc_bwd_k, TT_CUDA_THREADS));
