/* kernels/cuda/cuda_bn_rows.cu — batch norm on rows in 16-byte vectors: an NHWC tensor, which
 * backend.h's layouts hand over as [rows = n*h*w, c, hw = 1]. The entry points (cuda_bn.cu) take
 * these forms where c is a multiple of a vector's elements (8 in fp16/bf16, 4 in fp32) and every
 * tensor they touch is 16-byte aligned, else the scalar row kernels there.
 *
 * A block takes tc consecutive 16-byte columns of the row (tc * V channels) and a run of rows; its
 * threads are rl = TT_CUDA_THREADS / tc row lanes of tc columns (thread t: lane t / tc, column
 * t % tc, one division per thread). Where tc is the whole row (c <= 32 vectors) a warp reads one
 * contiguous span of the tensor; else each row's tc * 16 bytes are whole 32-byte sectors (tc >= 2).
 * A thread keeps its V channels' constants (mean, invstd, gamma, bias; for dx also gamma * invstd
 * and the two means) in registers for all its rows: no division and no parameter load per element;
 * a block stages them in shared memory first (each read once a block, coalesced: a thread's own V
 * would be loads 4 * V bytes apart, and every row lane would repeat them).
 * Each thread has CUDA_BNR_U rows' loads in flight before it uses them.
 *
 * Statistics (forward: sums of x - K and (x - K)^2, K the channel's first value; backward: of dy
 * and dy * xhat with the ReLU's mask) are fp32 per thread over its rows in order, then per block
 * the row lanes in lane order in double, written as the block's partial at part[split * c + ch]
 * (cuda_bn.cu's layout), which cuda_bn_final_k / cuda_bn_bwd_final_k add in split order: fixed
 * order throughout, the same bits every run on a device. The splits stay within the workspace's
 * (tt_cuda_bn_workspace: at most cuda_bn_max_splits(rows, 1) a channel); the grid is then widened
 * by narrower column groups until it has two blocks per multiprocessor (two waves of the SM
 * count), where c allows it. The normalisation and dx have no partials: their grids take about
 * CUDA_BNR_RPT rows a thread and at least the same two blocks per multiprocessor.
 * docs/gpu.md "Batch norm on NHWC rows".
 */
#include <math.h>

#include "cuda_bn.h"

#define CUDA_BNR_TC 32 /* most 16-byte columns a block takes (a warp's width) */
#define CUDA_BNR_U 4   /* rows in flight per thread: statistics and normalisation */
#define CUDA_BNR_UDX 2 /* in dx, whose seven constants a channel take more registers */
#define CUDA_BNR_RPT 16 /* rows a thread walks in the normalisation and dx, about */
#define CUDA_BNR_MINR 8 /* and at least, where the tensor is too small for the wanted blocks */
#define CUDA_BNR_MAXV 8 /* elements a 16-byte vector: fp16, bf16 */

typedef struct cuda_bnr_geom {
  size_t rows;
  int c, cv;    /* channels; 16-byte vectors a row (c / V) */
  int tc, rl;   /* columns a block; row lanes (TT_CUDA_THREADS / tc) */
  size_t chunk; /* rows a block (grid.y = the splits) */
} cuda_bnr_geom;

/* This thread's vector column in the row (-1: none: past cv, or a lane past rl) and its first row
 * and the block's end row. */
static __device__ __forceinline__ int cuda_bnr_span(const cuda_bnr_geom &g, size_t *r, size_t *r1) {
  const int lane = (int)threadIdx.x / g.tc, col = (int)threadIdx.x - lane * g.tc, j = (int)blockIdx.x * g.tc + col;
  const size_t r0 = (size_t)blockIdx.y * g.chunk;
  *r = r0 + (size_t)lane;
  *r1 = r0 + g.chunk < g.rows ? r0 + g.chunk : g.rows;
  return lane < g.rl && j < g.cv ? j : -1;
}

/* The block's partial per channel: each thread's V (a, b) pairs through shared memory, the row
 * lanes added in lane order in double by one thread per channel of the block (tc * V <= 256). */
template <int V>
static __device__ __forceinline__ void cuda_bnr_reduce(const cuda_bnr_geom &g, int j, const float *a, const float *bq,
                                                       float *red, cuda_bn_d2 *part) {
  const int k = (int)threadIdx.x, w = g.tc * V; /* floats a lane */
  const int ch = (int)blockIdx.x * w + k;
  double t1 = 0.0, t2 = 0.0;
  if (j >= 0)
    for (int q = 0; q < V; q++) red[(int)threadIdx.x * V + q] = a[q]; /* lane * w + col * V + q */
  __syncthreads();
  if (k < w && ch < g.c)
    for (int l = 0; l < g.rl; l++) t1 += (double)red[l * w + k];
  __syncthreads();
  if (j >= 0)
    for (int q = 0; q < V; q++) red[(int)threadIdx.x * V + q] = bq[q];
  __syncthreads();
  if (k < w && ch < g.c) {
    for (int l = 0; l < g.rl; l++) t2 += (double)red[l * w + k];
    part[(size_t)blockIdx.y * g.c + ch] = cuda_bn_d2{t1, t2};
  }
}

/* One 16-byte vector of a dt tensor, packed as loaded (tt_cuda_ld16), and its V elements as fp32:
 * tt_cuda_ldv<V> in two steps, so that a thread's rows in flight take 4 registers each until used. */
static __device__ __forceinline__ tt_cuda_u4 cuda_bnr_ld(const void *p, size_t iv) {
  return tt_cuda_ld16((const char *)p + iv * 16);
}
template <int V>
static __device__ __forceinline__ void cuda_bnr_unpack(tt_dtype dt, const tt_cuda_u4 &u, float *v) {
  if (dt == TT_F32) {
    v[0] = __uint_as_float(u.x), v[1 % V] = __uint_as_float(u.y), v[2 % V] = __uint_as_float(u.z);
    v[3 % V] = __uint_as_float(u.w);
  } else if (dt == TT_F16) {
    v[0] = tt_cuda_h(u.x, 0), v[1 % V] = tt_cuda_h(u.x, 1), v[2 % V] = tt_cuda_h(u.y, 0), v[3 % V] = tt_cuda_h(u.y, 1);
    v[4 % V] = tt_cuda_h(u.z, 0), v[5 % V] = tt_cuda_h(u.z, 1), v[6 % V] = tt_cuda_h(u.w, 0), v[7 % V] = tt_cuda_h(u.w, 1);
  } else {
    v[0] = tt_cuda_b(u.x, 0), v[1 % V] = tt_cuda_b(u.x, 1), v[2 % V] = tt_cuda_b(u.y, 0), v[3 % V] = tt_cuda_b(u.y, 1);
    v[4 % V] = tt_cuda_b(u.z, 0), v[5 % V] = tt_cuda_b(u.z, 1), v[6 % V] = tt_cuda_b(u.w, 0), v[7 % V] = tt_cuda_b(u.w, 1);
  }
}

/* Per-channel arrays of the block's tc * V channels staged in shared memory, each value read once a
 * block and coalesced (thread k < tc * V loads channel blockIdx.x * tc * V + k; a NULL array
 * gives 0): sp[i][k] for a[i]. Every thread of the block calls it (a barrier after). The thread's
 * V channels are then sp[i][col * V + q], col = j - blockIdx.x * tc, copied to registers once. */
template <int NA>
static __device__ __forceinline__ void cuda_bnr_stage(const cuda_bnr_geom &g, int v, const float *const *a,
                                                      float (*sp)[TT_CUDA_THREADS]) {
  const int k = (int)threadIdx.x, ch = (int)blockIdx.x * g.tc * v + k;
  if (k < g.tc * v && ch < g.c)
    for (int i = 0; i < NA; i++) sp[i][k] = a[i] ? a[i][ch] : 0.0f;
  __syncthreads();
}
template <int V>
static __device__ __forceinline__ void cuda_bnr_regs(const cuda_bnr_geom &g, int j, const float *spi, float *p) {
  const int c0 = (j - (int)blockIdx.x * g.tc) * V;
  TT_UNROLL
  for (int q = 0; q < V; q++) p[q] = spi[c0 + q];
}

/* The bodies below take dt as a constant (the kernels call them through TT_CUDA_BY_DTYPE), so the
 * unpacking has no dtype test per element; V = 16 / element bytes. */
template <int V>
static __device__ __forceinline__ void cuda_bnr_stats_body(const cuda_bnr_geom &g, tt_dtype dt, const void *x,
                                                           cuda_bn_d2 *part, float *red) {
  size_t r, r1;
  const int j = cuda_bnr_span(g, &r, &r1);
  float s1[V] = {}, s2[V] = {}, K[V];
  { /* row 0: the channels' first values (cuda_bn_first), staged once a block */
    const int k = (int)threadIdx.x, ch = (int)blockIdx.x * g.tc * V + k;
    if (k < g.tc * V && ch < g.c) red[k] = tt_cuda_ld(dt, x, (size_t)ch);
    __syncthreads();
    if (j >= 0) cuda_bnr_regs<V>(g, j, red, K);
    __syncthreads(); /* red is the reduction's next */
  }
  if (j >= 0) {
    for (; r < r1; r += (size_t)CUDA_BNR_U * g.rl) {
      tt_cuda_u4 u4[CUDA_BNR_U];
      TT_UNROLL
      for (int u = 0; u < CUDA_BNR_U; u++)
        if (r + (size_t)u * g.rl < r1) u4[u] = cuda_bnr_ld(x, (r + (size_t)u * g.rl) * g.cv + j);
      TT_UNROLL
      for (int u = 0; u < CUDA_BNR_U; u++)
        if (r + (size_t)u * g.rl < r1) {
          float v[V];
          cuda_bnr_unpack<V>(dt, u4[u], v);
          TT_UNROLL
          for (int q = 0; q < V; q++) {
            const float d = v[q] - K[q];
            s1[q] += d;
            s2[q] += d * d;
          }
        }
    }
  }
  cuda_bnr_reduce<V>(g, j, s1, s2, red, part);
}

static __device__ __forceinline__ void cuda_bnr_stats_dt(tt_dtype dt, const cuda_bnr_geom &g, const void *x,
                                                         cuda_bn_d2 *part, float *red) {
  if (dt == TT_F32)
    cuda_bnr_stats_body<4>(g, dt, x, part, red);
  else
    cuda_bnr_stats_body<8>(g, dt, x, part, red);
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bnr_stats_k(cuda_bnr_geom g, tt_dtype dt, const void *x,
                                                                          cuda_bn_d2 *part) {
  __shared__ float red[TT_CUDA_THREADS * CUDA_BNR_MAXV];
  TT_CUDA_BY_DTYPE(dt, cuda_bnr_stats_dt, g, x, part, red);
}


template <int V>
static __device__ __forceinline__ void cuda_bnr_bwd_stats_body(const cuda_bnr_geom &g, tt_dtype dt, const void *x,
                                                               const void *dy, const float *save_mean,
                                                               const float *save_invstd, const float *gamma,
                                                               const float *bias, int relu, cuda_bn_d2 *part, float *red) {
  size_t r, r1;
  const int j = cuda_bnr_span(g, &r, &r1);
  float s1[V] = {}, s2[V] = {}, mean[V], invstd[V], gm[V], bb[V];
  {
    const float *arr[4] = {save_mean, save_invstd, relu ? gamma : NULL, relu ? bias : NULL}; /* gamma, bias: the mask */
    float(*sp)[TT_CUDA_THREADS] = (float(*)[TT_CUDA_THREADS])red;
    cuda_bnr_stage<4>(g, V, arr, sp);
    if (j >= 0)
      cuda_bnr_regs<V>(g, j, sp[0], mean), cuda_bnr_regs<V>(g, j, sp[1], invstd), cuda_bnr_regs<V>(g, j, sp[2], gm),
          cuda_bnr_regs<V>(g, j, sp[3], bb);
    __syncthreads(); /* red is the reduction's next */
  }
  if (j >= 0) {
    for (; r < r1; r += (size_t)CUDA_BNR_U * g.rl) {
      tt_cuda_u4 xu[CUDA_BNR_U], gu[CUDA_BNR_U];
      TT_UNROLL
      for (int u = 0; u < CUDA_BNR_U; u++)
        if (r + (size_t)u * g.rl < r1) {
          const size_t iv = (r + (size_t)u * g.rl) * g.cv + j;
          xu[u] = cuda_bnr_ld(x, iv), gu[u] = cuda_bnr_ld(dy, iv);
        }
      TT_UNROLL
      for (int u = 0; u < CUDA_BNR_U; u++)
        if (r + (size_t)u * g.rl < r1) {
          float xv[V], gv[V];
          cuda_bnr_unpack<V>(dt, xu[u], xv), cuda_bnr_unpack<V>(dt, gu[u], gv);
          TT_UNROLL
          for (int q = 0; q < V; q++) {
            const float gq = cuda_bn_relu_grad(dt, relu, gv[q], xv[q], mean[q], invstd[q], gm[q], bb[q]);
            s1[q] += gq;
            s2[q] += gq * ((xv[q] - mean[q]) * invstd[q]);
          }
        }
    }
  }
  cuda_bnr_reduce<V>(g, j, s1, s2, red, part);
}

static __device__ __forceinline__ void cuda_bnr_bwd_stats_dt(tt_dtype dt, const cuda_bnr_geom &g, const void *x,
                                                             const void *dy, const float *save_mean,
                                                             const float *save_invstd, const float *gamma,
                                                             const float *bias, int relu, cuda_bn_d2 *part, float *red) {
  if (dt == TT_F32)
    cuda_bnr_bwd_stats_body<4>(g, dt, x, dy, save_mean, save_invstd, gamma, bias, relu, part, red);
  else
    cuda_bnr_bwd_stats_body<8>(g, dt, x, dy, save_mean, save_invstd, gamma, bias, relu, part, red);
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bnr_bwd_stats_k(cuda_bnr_geom g, tt_dtype dt, const void *x,
                                                                              const void *dy, const float *save_mean,
                                                                              const float *save_invstd, const float *gamma,
                                                                              const float *bias, int relu,
                                                                              cuda_bn_d2 *part) {
  __shared__ float red[TT_CUDA_THREADS * CUDA_BNR_MAXV];
  TT_CUDA_BY_DTYPE(dt, cuda_bnr_bwd_stats_dt, g, x, dy, save_mean, save_invstd, gamma, bias, relu, part, red);
}

/* y = cuda_bn_out(cuda_bn_y(x)) (with the shortcut s: bn_fwd_train_add_relu), the channel's
 * constants in registers; infer: invstd from the running variance (stat_p) as cuda_bn_norm_k
 * computes it, else stat_p is the saved invstd. */
template <int V>
static __device__ __forceinline__ void cuda_bnr_norm_body(const cuda_bnr_geom &g, tt_dtype dt, const void *x,
                                                          const float *gamma, const float *bias, const float *mean_p,
                                                          const float *stat_p, int infer, float eps, int relu,
                                                          const void *s, void *y, float (*sp)[TT_CUDA_THREADS]) {
  size_t r, r1;
  const int j = cuda_bnr_span(g, &r, &r1);
  float mean[V], invstd[V], gm[V], bb[V];
  const float *arr[4] = {mean_p, stat_p, gamma, bias};
  cuda_bnr_stage<4>(g, V, arr, sp);
  if (j < 0) return;
  cuda_bnr_regs<V>(g, j, sp[0], mean), cuda_bnr_regs<V>(g, j, sp[1], invstd);
  cuda_bnr_regs<V>(g, j, sp[2], gm), cuda_bnr_regs<V>(g, j, sp[3], bb);
  if (infer) {
    TT_UNROLL
    for (int q = 0; q < V; q++) invstd[q] = (float)(1.0 / sqrt((double)invstd[q] + (double)eps));
  }
  for (; r < r1; r += (size_t)CUDA_BNR_U * g.rl) {
    tt_cuda_u4 xu[CUDA_BNR_U], su[CUDA_BNR_U]; /* su: the shortcut, read before y is written (y may be s) */
    TT_UNROLL
    for (int u = 0; u < CUDA_BNR_U; u++)
      if (r + (size_t)u * g.rl < r1) {
        const size_t iv = (r + (size_t)u * g.rl) * g.cv + j;
        xu[u] = cuda_bnr_ld(x, iv);
        if (s) su[u] = cuda_bnr_ld(s, iv);
      }
    TT_UNROLL
    for (int u = 0; u < CUDA_BNR_U; u++)
      if (r + (size_t)u * g.rl < r1) {
        float v[V], sv[V] = {};
        cuda_bnr_unpack<V>(dt, xu[u], v);
        if (s) cuda_bnr_unpack<V>(dt, su[u], sv);
        TT_UNROLL
        for (int q = 0; q < V; q++)
          v[q] = cuda_bn_out(dt, cuda_bn_y(v[q], mean[q], invstd[q], gm[q], bb[q]), relu, s != NULL, sv[q]);
        tt_cuda_stv<V>(dt, y, (r + (size_t)u * g.rl) * g.cv + j, v);
      }
  }
}

static __device__ __forceinline__ void cuda_bnr_norm_dt(tt_dtype dt, const cuda_bnr_geom &g, const void *x,
                                                        const float *gamma, const float *bias, const float *mean_p,
                                                        const float *stat_p, int infer, float eps, int relu, const void *s,
                                                        void *y, float (*sp)[TT_CUDA_THREADS]) {
  if (dt == TT_F32)
    cuda_bnr_norm_body<4>(g, dt, x, gamma, bias, mean_p, stat_p, infer, eps, relu, s, y, sp);
  else
    cuda_bnr_norm_body<8>(g, dt, x, gamma, bias, mean_p, stat_p, infer, eps, relu, s, y, sp);
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bnr_norm_k(cuda_bnr_geom g, tt_dtype dt, const void *x,
                                                                         const float *gamma, const float *bias,
                                                                         const float *mean_p, const float *stat_p,
                                                                         int infer, float eps, int relu, const void *s,
                                                                         void *y) {
  __shared__ float sp[4][TT_CUDA_THREADS]; /* the block's channels' constants (cuda_bnr_stage) */
  TT_CUDA_BY_DTYPE(dt, cuda_bnr_norm_dt, g, x, gamma, bias, mean_p, stat_p, infer, eps, relu, s, y, sp);
}

/* dx = cuda_bn_dx_value (+ beta_dx * dx), the channel's seven constants in registers (those
 * cuda_bn_dx_k stages: mean, invstd, gamma * invstd, md's two means, gamma, bias for the mask). */
template <int V>
static __device__ __forceinline__ void cuda_bnr_dx_body(const cuda_bnr_geom &g, tt_dtype dt, const void *x, const void *dy,
                                                        const float *gamma, const float *save_mean,
                                                        const float *save_invstd, const cuda_bn_f2 *md,
                                                        const float *bias, int relu, void *dx, float beta_dx,
                                                        float (*sp)[TT_CUDA_THREADS]) {
  size_t r, r1;
  const int j = cuda_bnr_span(g, &r, &r1);
  float mean[V], invstd[V], a[V], mdy[V], mdyx[V], gm[V], bb[V];
  const float *arr[4] = {save_mean, save_invstd, gamma, relu ? bias : NULL};
  { /* md's pairs, one 8-byte load a channel */
    const int k = (int)threadIdx.x, ch = (int)blockIdx.x * g.tc * V + k;
    if (k < g.tc * V && ch < g.c) {
      const cuda_bn_f2 d = md[ch];
      sp[4][k] = d.x, sp[5][k] = d.y;
    }
  }
  cuda_bnr_stage<4>(g, V, arr, sp);
  if (j < 0) return;
  cuda_bnr_regs<V>(g, j, sp[0], mean), cuda_bnr_regs<V>(g, j, sp[1], invstd), cuda_bnr_regs<V>(g, j, sp[2], gm);
  cuda_bnr_regs<V>(g, j, sp[3], bb), cuda_bnr_regs<V>(g, j, sp[4], mdy), cuda_bnr_regs<V>(g, j, sp[5], mdyx);
  TT_UNROLL
  for (int q = 0; q < V; q++) a[q] = gm[q] * invstd[q];
  for (; r < r1; r += (size_t)CUDA_BNR_UDX * g.rl) {
    tt_cuda_u4 xu[CUDA_BNR_UDX], gu[CUDA_BNR_UDX], ou[CUDA_BNR_UDX]; /* ou read only with beta_dx */
    TT_UNROLL
    for (int u = 0; u < CUDA_BNR_UDX; u++)
      if (r + (size_t)u * g.rl < r1) {
        const size_t iv = (r + (size_t)u * g.rl) * g.cv + j;
        xu[u] = cuda_bnr_ld(x, iv), gu[u] = cuda_bnr_ld(dy, iv);
        if (beta_dx != 0.0f) ou[u] = cuda_bnr_ld(dx, iv);
      }
    TT_UNROLL
    for (int u = 0; u < CUDA_BNR_UDX; u++)
      if (r + (size_t)u * g.rl < r1) {
        float xv[V], gv[V], ov[V] = {};
        cuda_bnr_unpack<V>(dt, xu[u], xv), cuda_bnr_unpack<V>(dt, gu[u], gv);
        if (beta_dx != 0.0f) cuda_bnr_unpack<V>(dt, ou[u], ov);
        TT_UNROLL
        for (int q = 0; q < V; q++) {
          const float v = cuda_bn_dx_value(dt, relu, gv[q], xv[q], mean[q], invstd[q], a[q], mdy[q], mdyx[q], gm[q], bb[q]);
          xv[q] = beta_dx != 0.0f ? v + beta_dx * ov[q] : v;
        }
        tt_cuda_stv<V>(dt, dx, (r + (size_t)u * g.rl) * g.cv + j, xv);
      }
  }
}

static __device__ __forceinline__ void cuda_bnr_dx_dt(tt_dtype dt, const cuda_bnr_geom &g, const void *x, const void *dy,
                                                      const float *gamma, const float *save_mean, const float *save_invstd,
                                                      const cuda_bn_f2 *md, const float *bias, int relu, void *dx,
                                                      float beta_dx, float (*sp)[TT_CUDA_THREADS]) {
  if (dt == TT_F32)
    cuda_bnr_dx_body<4>(g, dt, x, dy, gamma, save_mean, save_invstd, md, bias, relu, dx, beta_dx, sp);
  else
    cuda_bnr_dx_body<8>(g, dt, x, dy, gamma, save_mean, save_invstd, md, bias, relu, dx, beta_dx, sp);
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bnr_dx_k(cuda_bnr_geom g, tt_dtype dt, const void *x,
                                                                       const void *dy, const float *gamma,
                                                                       const float *save_mean, const float *save_invstd,
                                                                       const cuda_bn_f2 *md, const float *bias, int relu,
                                                                       void *dx, float beta_dx) {
  __shared__ float sp[6][TT_CUDA_THREADS]; /* the block's channels' constants (cuda_bnr_stage), md's two */
  TT_CUDA_BY_DTYPE(dt, cuda_bnr_dx_dt, g, x, dy, gamma, save_mean, save_invstd, md, bias, relu, dx, beta_dx, sp);
}

/* Whether the vector forms take (rows, c, dt) with these pointers (NULL ones ignored): c a whole
 * number of 16-byte vectors, every pointer 16-byte aligned. */
static int cuda_bnr_applies(size_t rows, int c, tt_dtype dt, const void *const *ptrs, int nptrs) {
  if (!rows || c <= 0 || !tt_cuda_dtype_ok(dt) || c % (int)(16 / tt_dtype_size(dt))) return 0;
  for (int i = 0; i < nptrs; i++)
    if ((uintptr_t)ptrs[i] & 15) return 0;
  return 1;
}

/* The blocks a launch should reach: two per multiprocessor (setup's count; 40 before it). */
static size_t cuda_bnr_want(tt_backend *b) { return 2 * (size_t)(tt_cuda_st(b)->sms > 0 ? tt_cuda_st(b)->sms : 40); }

/* The statistics' geometry: the widest column group (at most CUDA_BNR_TC vectors, at least 2 or
 * the whole row) whose grid, with at most max_splits row splits of at least CUDA_BNR_U rows a
 * lane, reaches the wanted blocks; the narrowest allowed where none does. Returns the splits. */
static int cuda_bnr_stats_geom(tt_backend *b, size_t rows, int c, tt_dtype dt, size_t max_splits, cuda_bnr_geom *g) {
  const int cv = c / (int)(16 / tt_dtype_size(dt));
  const int tmin = cv < 2 ? cv : 2;
  const size_t want = cuda_bnr_want(b);
  size_t gy = 1;
  g->rows = rows, g->c = c, g->cv = cv;
  for (int tc = cv < CUDA_BNR_TC ? cv : CUDA_BNR_TC; tc >= tmin; tc--) {
    const size_t gx = (size_t)(cv + tc - 1) / (size_t)tc, rl = (size_t)(TT_CUDA_THREADS / tc);
    gy = (rows + rl * CUDA_BNR_U - 1) / (rl * CUDA_BNR_U);
    if (gy > max_splits) gy = max_splits;
    if (gy < 1) gy = 1;
    g->tc = tc, g->rl = (int)rl;
    if (gx * gy >= want) break;
  }
  g->chunk = (rows + gy - 1) / gy;
  return (int)((rows + g->chunk - 1) / g->chunk);
}

/* The normalisation's and dx's geometry (no partials): the whole row's columns up to
 * CUDA_BNR_TC a block, about CUDA_BNR_RPT rows a thread, at least the wanted blocks where the
 * rows allow CUDA_BNR_MINR a lane. Returns the grid. */
static dim3 cuda_bnr_ew_geom(tt_backend *b, size_t rows, int c, tt_dtype dt, cuda_bnr_geom *g) {
  const int cv = c / (int)(16 / tt_dtype_size(dt)), tc = cv < CUDA_BNR_TC ? cv : CUDA_BNR_TC;
  const size_t gx = (size_t)(cv + tc - 1) / (size_t)tc, rl = (size_t)(TT_CUDA_THREADS / tc);
  size_t gy = (rows + rl * CUDA_BNR_RPT - 1) / (rl * CUDA_BNR_RPT), most = (rows + rl * CUDA_BNR_MINR - 1) / (rl * CUDA_BNR_MINR);
  const size_t want = (cuda_bnr_want(b) + gx - 1) / gx;
  if (gy < want) gy = want < most ? want : most; /* not under CUDA_BNR_MINR rows a lane: the constants' staging */
  if (gy < 1) gy = 1;
  if (gy > 65535) gy = 65535;
  g->rows = rows, g->c = c, g->cv = cv, g->tc = tc, g->rl = (int)rl;
  g->chunk = (rows + gy - 1) / gy;
  return dim3((unsigned)gx, (unsigned)((rows + g->chunk - 1) / g->chunk));
}

int tt_cuda_bnr_stats(tt_backend *b, const char *op, size_t rows, int c, tt_dtype dt, const void *x, const void *y,
                      const void *dy, const float *save_mean, const float *save_invstd, const float *gamma,
                      const float *bias, int relu, void *ws, size_t max_splits) {
  const void *ptrs[3] = {x, y, dy};
  cuda_bnr_geom g;
  int splits;
  if (!cuda_bnr_applies(rows, c, dt, ptrs, 3)) return 0;
  splits = cuda_bnr_stats_geom(b, rows, c, dt, max_splits, &g);
  if (dy)
    TT_LAUNCH(cuda_bnr_bwd_stats_k, dim3((unsigned)((g.cv + g.tc - 1) / g.tc), (unsigned)splits), TT_CUDA_THREADS, 0,
              tt_cuda_stream(b), g, dt, x, dy, save_mean, save_invstd, gamma, bias, relu, (cuda_bn_d2 *)ws);
  else
    TT_LAUNCH(cuda_bnr_stats_k, dim3((unsigned)((g.cv + g.tc - 1) / g.tc), (unsigned)splits), TT_CUDA_THREADS, 0,
              tt_cuda_stream(b), g, dt, x, (cuda_bn_d2 *)ws);
  CUDA_LAUNCH_CHECK(b, op);
  return splits;
}

int tt_cuda_bnr_norm(tt_backend *b, const char *op, size_t rows, int c, tt_dtype dt, const void *x, const float *gamma,
                     const float *bias, const float *mean_p, const float *stat_p, int infer, float eps, int relu,
                     const void *s, void *y) {
  const void *ptrs[3] = {x, y, s};
  cuda_bnr_geom g;
  dim3 grid;
  if (!cuda_bnr_applies(rows, c, dt, ptrs, 3)) return 0;
  grid = cuda_bnr_ew_geom(b, rows, c, dt, &g);
  TT_LAUNCH(cuda_bnr_norm_k, grid, TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, dt, x, gamma, bias, mean_p, stat_p, infer,
            eps, relu, s, y);
  CUDA_LAUNCH_CHECK(b, op);
  return 1;
}

int tt_cuda_bnr_dx(tt_backend *b, const char *op, size_t rows, int c, tt_dtype dt, const void *x, const void *dy,
                   const float *gamma, const float *save_mean, const float *save_invstd, const cuda_bn_f2 *md,
                   const float *bias, int relu, void *dx, float beta_dx) {
  const void *ptrs[3] = {x, dy, dx};
  cuda_bnr_geom g;
  dim3 grid;
  if (!cuda_bnr_applies(rows, c, dt, ptrs, 3)) return 0;
  grid = cuda_bnr_ew_geom(b, rows, c, dt, &g);
  TT_LAUNCH(cuda_bnr_dx_k, grid, TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, dt, x, dy, gamma, save_mean, save_invstd, md,
            bias, relu, dx, beta_dx);
  CUDA_LAUNCH_CHECK(b, op);
  return 1;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(bn_rows, TT_CUDA_KERNEL(cuda_bnr_stats_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_bnr_bwd_stats_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_bnr_norm_k, TT_CUDA_THREADS), TT_CUDA_KERNEL(cuda_bnr_dx_k, TT_CUDA_THREADS));
