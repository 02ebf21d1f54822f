/* kernels/cuda/cuda_norm.cu — batch norm, pooling and global average pooling, as the
 * backend's own kernels (not cuDNN), so that the semantics are the CPU backend's exactly:
 * batch norm normalises with the biased batch variance, updates running_var with the
 * unbiased one (biased when there is one value per channel), running = (1-m)*running +
 * m*batch; max pooling takes the first maximum (NaN wins) and its backward re-finds it from
 * x; average pooling divides by the full window (count_include_pad). Batch-norm training
 * forward and backward take a workspace (tt_cuda_bn_workspace); nothing else does.
 *
 * Batch norm: see below; the statistics are deterministic (fixed order throughout). Pooling
 * (below): a block per band of rows of a plane, the band's inputs staged in shared memory, one
 * thread per output (forward) or per input (backward, gather form: every dx element written
 * once, with beta); planes too wide for a band take untiled kernels with the same arithmetic.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

static int cuda_norm_bn_check(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt) {
  if (n <= 0 || c <= 0 || hw <= 0) return tt_cuda_fail(b, "%s: bad shape n=%d c=%d hw=%d", op, n, c, hw);
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "%s: unknown dtype %d (the CUDA backend computes fp32, fp16 and bf16)", op, (int)dt);
  return 0;
}

/* A pooling call: the dtype here (this backend's three), the shape by the rules the CPU backends
 * share (kernel_math.h; its dtype test is theirs, so it is given fp32, a dtype all backends take). */
static int cuda_norm_pool_check(tt_backend *b, const char *op, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt) {
  char msg[256];
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "%s: unknown dtype %d (the CUDA backend computes fp32, fp16 and bf16)", op, (int)dt);
  if (tt_pool_desc_error(op, d, mode, TT_F32, msg, sizeof msg)) return tt_cuda_fail(b, "%s", msg);
  return 0;
}

static cudaStream_t cuda_norm_stream(tt_backend *b) { return tt_cuda_st(b)->compute; }

/* --------------------------------- batch norm ----------------------------------------- */

/* Each channel is split over S blocks (grid (c, S)), each block a contiguous run of the
 * channel's n*hw values taken as vectors of V elements (16 bytes, or fewer when hw or a pointer
 * does not allow it): one load per vector, no division per element (a thread's (sample,
 * position) advances by additions). Training forward: a statistics kernel (per-block sums of
 * x - K and (x - K)^2 in fp32 per thread and double per block, K the channel's first value, so
 * that one pass gives the variance without cancellation), a finalise kernel (one thread per
 * channel sums the S partials in block order: deterministic) and the normalisation. Backward
 * likewise (sums of dy and dy*xhat). The partials live in the op's workspace
 * (tt_cuda_bn_workspace). */

#define CUDA_BN_MAX_SPLITS 64
/* The flat forms (below: cuda_bni_body, cuda_bn_flat_blocks): a block takes CUDA_BNI_VPT x 256
 * vectors of 16 bytes of the flat tensor, for planes of at least CUDA_BNI_MINHW elements, so it
 * touches at most CUDA_BNI_MAXP planes. */
#define CUDA_BNI_VPT 2
#define CUDA_BNI_MINHW 32
#define CUDA_BNI_MAXP (TT_CUDA_THREADS * CUDA_BNI_VPT * 8 / CUDA_BNI_MINHW + 2)
static_assert(CUDA_BNI_MAXP <= TT_CUDA_THREADS, "the flat statistics give each of a group's channels its own thread");

typedef struct cuda_bn_geom {
  int n, c, hw;
  int v;           /* elements per vector: 8, 4, 2 or 1 */
  size_t hwv, mv;  /* vectors per plane, per channel */
  size_t chunk;    /* vectors per block */
  size_t step_s, step_k; /* blockDim.x vectors as (planes, vectors) */
} cuda_bn_geom;

struct alignas(16) cuda_bn_d2 { /* a block's partial sums */
  double x, y;
};
struct alignas(8) cuda_bn_f2 {
  float x, y;
};

/* Batch norm's output before rounding, one expression for every kernel (fmaf pins the
 * contraction), so that the ReLU-fused backward recomputes the forward's value bit for bit. */
static __device__ __forceinline__ float cuda_bn_y(float x, float mean, float invstd, float gm, float bb) {
  return fmaf((x - mean) * invstd, gm, bb);
}
/* ReLU after the rounding to dt, as act_fwd does it on the stored y: NaN passes, the rest
 * max(y, 0) (a value that rounds to -0 or to +0 gives +0 either way). */
static __device__ __forceinline__ float cuda_bn_relu(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }
/* Whether ReLU's backward passes the gradient where batch norm computed v: act_bwd's test on
 * the stored ReLU output (y > 0), which is v rounded to dt, > 0 (NaN fails). */
static __device__ __forceinline__ int cuda_bn_relu_pass(tt_dtype dt, float v) {
  if (dt == TT_F16) return __half2float(__float2half_rn(v)) > 0.0f;
  if (dt == TT_BF16) return __bfloat162float(__float2bfloat16_rn(v)) > 0.0f;
  return v > 0.0f;
}
/* bn_bwd_relu's dy at one element: g (the ReLU's output gradient) where the ReLU passed it, recomputed
 * from x and the channel's constants; g itself without relu. */
static __device__ __forceinline__ float cuda_bn_relu_grad(tt_dtype dt, int relu, float g, float x, float mean, float invstd,
                                                          float gm, float bb) {
  return relu && !cuda_bn_relu_pass(dt, cuda_bn_y(x, mean, invstd, gm, bb)) ? 0.0f : g;
}

/* A channel's statistics from its sums of x - K and (x - K)^2 over m values (K its first value):
 * the saved mean and invstd into *mean, *invstd, and the running ones at running_*[ch] when
 * update_running. One place for the finalise kernel and the held-on-chip forward. */
static __device__ __forceinline__ void cuda_bn_stats_finish(float K, double t1, double t2, size_t m, float eps,
                                                            float momentum, int update_running, float *running_mean,
                                                            float *running_var, size_t ch, float *mean, float *invstd) {
  double mean_d = (double)K + t1 / (double)m, sq = t2 - t1 * t1 / (double)m;
  if (sq < 0.0) sq = 0.0;
  tt_bn_channel_stats(mean_d, sq, m, eps, momentum, update_running, mean, invstd,
                      update_running ? running_mean + ch : NULL, update_running ? running_var + ch : NULL);
}

/* A channel's backward sums (of dy, and of dy * xhat, over m values): dbias and dgamma at [ch]
 * (each kept times beta_param plus the sum; NULL: not wanted) and the two means dx needs. One
 * place for the finalise kernel and the held-on-chip backward. */
static __device__ __forceinline__ cuda_bn_f2 cuda_bn_bwd_finish(double sdy, double sdyx, size_t m, float beta_param,
                                                                float *dgamma, float *dbias, size_t ch) {
  if (dbias) dbias[ch] = beta_param != 0.0f ? beta_param * dbias[ch] + (float)sdy : (float)sdy;
  if (dgamma) dgamma[ch] = beta_param != 0.0f ? beta_param * dgamma[ch] + (float)sdyx : (float)sdyx;
  return cuda_bn_f2{(float)(sdy / (double)m), (float)(sdyx / (double)m)};
}

/* dx at one element before beta_dx: a = gamma * invstd, (mdy, mdyx) the channel's two means (md),
 * g the incoming gradient (the ReLU's, masked here with relu). One expression for every dx
 * kernel, so their results are the same bits. */
static __device__ __forceinline__ float cuda_bn_dx_value(tt_dtype dt, int relu, float g, float x, float mean, float invstd,
                                                         float a, float mdy, float mdyx, float gm, float bb) {
  const float xh = (x - mean) * invstd;
  return a * (cuda_bn_relu_grad(dt, relu, g, x, mean, invstd, gm, bb) - mdy - xh * mdyx);
}

/* Calls f(vector index) for this thread's vectors of block (ch = blockIdx.x, split blockIdx.y):
 * the channel's vectors [split*chunk, min(mv, (split+1)*chunk)) in order, blockDim.x apart. */
template <typename F>
static __device__ __forceinline__ void cuda_bn_walk(const cuda_bn_geom &g, F f) {
  const size_t ch = blockIdx.x, e0 = (size_t)blockIdx.y * g.chunk + threadIdx.x;
  size_t e1 = (size_t)(blockIdx.y + 1) * g.chunk, s, k, e;
  if (e1 > g.mv) e1 = g.mv;
  if (e0 >= e1) return;
  s = e0 / g.hwv; /* once per thread */
  k = e0 - s * g.hwv;
  for (e = e0; e < e1; e += blockDim.x) {
    f(((size_t)s * g.c + ch) * g.hwv + k);
    k += g.step_k, s += g.step_s;
    if (k >= g.hwv) k -= g.hwv, s++;
  }
}

/* Per-block partial sums, written to part[split * c + ch] (x: first, y: second). */
template <int V>
static __device__ __forceinline__ void cuda_bn_stats_fwd(const cuda_bn_geom &g, tt_dtype dt, const void *x, float K,
                                                         float &s1, float &s2) {
  cuda_bn_walk(g, [&](size_t iv) {
    float v[V];
    tt_cuda_ldv<V>(dt, x, iv, v);
    for (int j = 0; j < V; j++) {
      float d = v[j] - K;
      s1 += d;
      s2 += d * d;
    }
  });
}

static __device__ __forceinline__ float cuda_bn_first(const cuda_bn_geom &g, tt_dtype dt, const void *x, size_t ch) {
  return tt_cuda_ld(dt, x, ch * (size_t)g.hw);
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_stats_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                         cuda_bn_d2 *part) {
  __shared__ double sh[33];
  __shared__ float kk;
  float s1 = 0.0f, s2 = 0.0f, K;
  double t1, t2;
  if (threadIdx.x == 0) kk = cuda_bn_first(g, dt, x, blockIdx.x);
  __syncthreads();
  K = kk;
  switch (g.v) {
    case 8: cuda_bn_stats_fwd<8>(g, dt, x, K, s1, s2); break;
    case 4: cuda_bn_stats_fwd<4>(g, dt, x, K, s1, s2); break;
    case 2: cuda_bn_stats_fwd<2>(g, dt, x, K, s1, s2); break;
    default: cuda_bn_stats_fwd<1>(g, dt, x, K, s1, s2); break;
  }
  t1 = tt_cuda_block_sum((double)s1, sh);
  t2 = tt_cuda_block_sum((double)s2, sh);
  if (threadIdx.x == 0) part[(size_t)blockIdx.y * g.c + blockIdx.x] = cuda_bn_d2{t1, t2};
}

/* One thread per channel: the S partials in split order, then the statistics (as the CPU). */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_final_k(cuda_bn_geom g, int splits, tt_dtype dt,
                                                                         const void *x, const cuda_bn_d2 *part,
                                                                         float *running_mean, float *running_var,
                                                                         float momentum, float eps, float *save_mean,
                                                                         float *save_invstd, int update_running) {
  TT_CUDA_LOOP(ch, (size_t)g.c) {
    double t1 = 0.0, t2 = 0.0;
    for (int j = 0; j < splits; j++) {
      cuda_bn_d2 p = part[(size_t)j * g.c + ch];
      t1 += p.x, t2 += p.y;
    }
    cuda_bn_stats_finish(cuda_bn_first(g, dt, x, ch), t1, t2, (size_t)g.n * g.hw, eps, momentum, update_running,
                         running_mean, running_var, ch, save_mean + ch, save_invstd + ch);
  }
}

/* y = (x - mean) * invstd * gamma + bias, the channel's constants loaded once per block;
 * inference (infer != 0) derives invstd from the running variance, once per block. */
template <int V>
static __device__ __forceinline__ void cuda_bn_norm(const cuda_bn_geom &g, tt_dtype dt, const void *x, void *y,
                                                    float mean, float invstd, float gm, float bb, int relu) {
  cuda_bn_walk(g, [&](size_t iv) {
    float v[V];
    tt_cuda_ldv<V>(dt, x, iv, v);
    for (int j = 0; j < V; j++) {
      v[j] = cuda_bn_y(v[j], mean, invstd, gm, bb);
      if (relu) v[j] = cuda_bn_relu(v[j]);
    }
    tt_cuda_stv<V>(dt, y, iv, v);
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_norm_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                        const float *gamma, const float *bias,
                                                                        const float *mean_p, const float *stat_p,
                                                                        int infer, float eps, int relu, void *y) {
  __shared__ float sc[4];
  const int ch = blockIdx.x;
  float mean, invstd;
  if (threadIdx.x == 0) {
    sc[0] = mean_p[ch];
    sc[1] = infer ? (float)(1.0 / sqrt((double)stat_p[ch] + (double)eps)) : stat_p[ch];
    sc[2] = gamma[ch], sc[3] = bias[ch];
  }
  __syncthreads();
  mean = sc[0], invstd = sc[1];
  {
    const float gm = sc[2], bb = sc[3];
    switch (g.v) {
      case 8: cuda_bn_norm<8>(g, dt, x, y, mean, invstd, gm, bb, relu); break;
      case 4: cuda_bn_norm<4>(g, dt, x, y, mean, invstd, gm, bb, relu); break;
      case 2: cuda_bn_norm<2>(g, dt, x, y, mean, invstd, gm, bb, relu); break;
      default: cuda_bn_norm<1>(g, dt, x, y, mean, invstd, gm, bb, relu); break;
    }
  }
}

/* The geometry of a call: V from hw and the pointers' alignment, S from the size. */
static cuda_bn_geom cuda_bn_geometry(int n, int c, int hw, tt_dtype dt, const void *const *ptrs, int nptrs) {
  cuda_bn_geom g;
  size_t es = tt_dtype_size(dt), want;
  int v = (int)(16 / es);
  while (v > 1) {
    int ok = hw % v == 0;
    for (int i = 0; i < nptrs && ok; i++)
      if (ptrs[i] && ((uintptr_t)ptrs[i] % ((size_t)v * es))) ok = 0;
    if (ok) break;
    v >>= 1;
  }
  g.n = n, g.c = c, g.hw = hw, g.v = v;
  g.hwv = (size_t)hw / (size_t)v;
  g.mv = (size_t)n * g.hwv;
  want = (g.mv + (size_t)TT_CUDA_THREADS * 8 - 1) / ((size_t)TT_CUDA_THREADS * 8); /* about 8 vectors a thread */
  if (want < 1) want = 1;
  if (want > CUDA_BN_MAX_SPLITS) want = CUDA_BN_MAX_SPLITS;
  g.chunk = (g.mv + want - 1) / want;
  g.step_s = (size_t)TT_CUDA_THREADS / g.hwv;
  g.step_k = (size_t)TT_CUDA_THREADS % g.hwv;
  return g;
}
static int cuda_bn_splits(const cuda_bn_geom &g) { return (int)((g.mv + g.chunk - 1) / g.chunk); }

/* The split count the workspace is sized for: 1-element vectors', the most any geometry of the
 * shape uses (and the flat statistics never use more). */
static size_t cuda_bn_max_splits(int n, int hw) {
  size_t mv = (size_t)n * (size_t)hw, want = (mv + (size_t)TT_CUDA_THREADS * 8 - 1) / ((size_t)TT_CUDA_THREADS * 8);
  if (want < 1) want = 1;
  if (want > CUDA_BN_MAX_SPLITS) want = CUDA_BN_MAX_SPLITS;
  return want;
}

/* Workspace of bn_fwd_train and bn_bwd: the partials (cuda_bn_d2, S x c) and, for the backward,
 * two floats per channel (cuda_bn_f2) after them. */
size_t tt_cuda_bn_workspace(int n, int c, int hw, tt_dtype dt) {
  (void)dt;
  if (n <= 0 || c <= 0 || hw <= 0) return 0;
  return cuda_bn_max_splits(n, hw) * (size_t)c * 16 + (size_t)c * 8;
}

static int cuda_bn_ws_check(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *ws,
                            size_t ws_bytes) {
  size_t need = tt_cuda_bn_workspace(n, c, hw, dt);
  if (!ws || ws_bytes < need || ((uintptr_t)ws & 15))
    return tt_cuda_fail(b, "%s: workspace %zu bytes at %p, needs %zu bytes 16-byte aligned (op_workspace)", op, ws_bytes,
                        ws, need);
  return 0;
}

/* ---- batch norm on rows: hw == 1 (an NHWC tensor as [n*h*w, c, 1], backend.h's layouts) ----
 * The per-channel kernels above would read a channel's values c elements apart (one element per
 * 32-byte sector in bf16). Here a block takes 32 channels (one per lane, so a warp reads 32
 * consecutive channels of one row: whole sectors) and one split of the rows, its 8 warps each
 * walking every 8th row of it; the 8 per-warp partials are added per channel in warp order, then
 * written as the split's partial (fp32 per thread, double per block, as above), and the finalise
 * kernels above add the splits in order: deterministic. Normalisation and dx are flat over the
 * elements (channel i % c), the per-element arithmetic of cuda_bn_norm and cuda_bn_dx. The splits
 * are cuda_bn_geometry's for hw == 1 (v == 1), within tt_cuda_bn_workspace's sizing. */
#define CUDA_BN_ROW_WARPS (TT_CUDA_THREADS / 32)

/* The rows [r0, r1) of split blockIdx.y and this thread's channel (-1: past c). */
static __device__ __forceinline__ int cuda_bn_rows_span(const cuda_bn_geom &g, size_t *r0, size_t *r1) {
  const int ch = (int)blockIdx.x * 32 + (int)(threadIdx.x & 31);
  *r0 = (size_t)blockIdx.y * g.chunk;
  *r1 = *r0 + g.chunk < (size_t)g.n ? *r0 + g.chunk : (size_t)g.n;
  return ch < g.c ? ch : -1;
}

/* sums (x, y) of the block's 8 warps per channel, in warp order; lane threads of warp 0 write */
static __device__ __forceinline__ void cuda_bn_rows_reduce(const cuda_bn_geom &g, int ch, float s1, float s2,
                                                           double (*sh)[CUDA_BN_ROW_WARPS][32], cuda_bn_d2 *part) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  sh[0][w][lane] = s1, sh[1][w][lane] = s2;
  __syncthreads();
  if (w == 0 && ch >= 0) {
    double t1 = 0.0, t2 = 0.0;
    for (int k = 0; k < CUDA_BN_ROW_WARPS; k++) t1 += sh[0][k][lane], t2 += sh[1][k][lane];
    part[(size_t)blockIdx.y * g.c + ch] = cuda_bn_d2{t1, t2};
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_rows_stats_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                              cuda_bn_d2 *part) {
  __shared__ double sh[2][CUDA_BN_ROW_WARPS][32];
  size_t r0, r1;
  const int ch = cuda_bn_rows_span(g, &r0, &r1);
  const size_t w0 = threadIdx.x >> 5; /* this thread's warp: its first row of the span */
  float s1 = 0.0f, s2 = 0.0f;
  if (ch >= 0) {
    const float K = tt_cuda_ld(dt, x, (size_t)ch); /* the channel's first value (cuda_bn_first, hw == 1) */
    for (size_t r = r0 + w0; r < r1; r += CUDA_BN_ROW_WARPS) {
      float d = tt_cuda_ld(dt, x, r * (size_t)g.c + ch) - K;
      s1 += d;
      s2 += d * d;
    }
  }
  cuda_bn_rows_reduce(g, ch, s1, s2, sh, part);
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_rows_bwd_stats_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                                  const void *dy, const float *save_mean,
                                                                                  const float *save_invstd, const float *gamma,
                                                                                  const float *bias, int relu,
                                                                                  cuda_bn_d2 *part) {
  __shared__ double sh[2][CUDA_BN_ROW_WARPS][32];
  size_t r0, r1;
  const int ch = cuda_bn_rows_span(g, &r0, &r1);
  const size_t w0 = threadIdx.x >> 5; /* this thread's warp: its first row of the span */
  float s1 = 0.0f, s2 = 0.0f;
  if (ch >= 0) {
    const float mean = save_mean[ch], invstd = save_invstd[ch];
    const float gm = relu ? gamma[ch] : 0.0f, bb = relu ? bias[ch] : 0.0f;
    for (size_t r = r0 + w0; r < r1; r += CUDA_BN_ROW_WARPS) {
      const size_t i = r * (size_t)g.c + ch;
      const float xv = tt_cuda_ld(dt, x, i);
      const float gv = cuda_bn_relu_grad(dt, relu, tt_cuda_ld(dt, dy, i), xv, mean, invstd, gm, bb);
      s1 += gv;
      s2 += gv * ((xv - mean) * invstd);
    }
  }
  cuda_bn_rows_reduce(g, ch, s1, s2, sh, part);
}

/* y = (x - mean) * invstd * gamma + bias over the flat [rows, c]; infer: invstd from the running
 * variance (stat_p), as cuda_bn_norm_k computes it */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_rows_norm_k(size_t count, int c, tt_dtype dt, const void *x,
                                                                             const float *gamma, const float *bias,
                                                                             const float *mean_p, const float *stat_p,
                                                                             int infer, float eps, int relu, void *y) {
  TT_CUDA_LOOP(i, count) {
    const int ch = (int)(i % (size_t)c);
    const float mean = mean_p[ch], invstd = infer ? (float)(1.0 / sqrt((double)stat_p[ch] + (double)eps)) : stat_p[ch];
    const float v = cuda_bn_y(tt_cuda_ld(dt, x, i), mean, invstd, gamma[ch], bias[ch]);
    tt_cuda_st(dt, y, i, relu ? cuda_bn_relu(v) : v);
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_rows_dx_k(size_t count, int c, tt_dtype dt, const void *x,
                                                                           const void *dy, const float *gamma,
                                                                           const float *save_mean, const float *save_invstd,
                                                                           const cuda_bn_f2 *md, const float *bias, int relu,
                                                                           void *dx, float beta_dx) {
  TT_CUDA_LOOP(i, count) {
    const int ch = (int)(i % (size_t)c);
    const float mean = save_mean[ch], invstd = save_invstd[ch], a = gamma[ch] * save_invstd[ch];
    const cuda_bn_f2 d = md[ch];
    const float v = cuda_bn_dx_value(dt, relu, tt_cuda_ld(dt, dy, i), tt_cuda_ld(dt, x, i), mean, invstd, a, d.x, d.y,
                                     gamma[ch], relu ? bias[ch] : 0.0f);
    tt_cuda_st(dt, dx, i, beta_dx != 0.0f ? v + beta_dx * tt_cuda_ld(dt, dx, i) : v);
  }
}

/* grid of the row statistics kernels: 32 channels by one split of rows per block */
static dim3 cuda_bn_rows_grid(const cuda_bn_geom &g) { return dim3((unsigned)((g.c + 31) / 32), (unsigned)cuda_bn_splits(g)); }

/* ---- batch norm held on chip: one read of x (and dy) where a block's channels fit ----------
 * The forms above read x twice in the training forward (statistics, then normalisation) and x
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
 * block's bytes fit the backend's cap (tt_cuda_state.bn_res_cap). */
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
                                                            int update_running, int relu) {
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
    float v[V];
    tt_cuda_ldv<V>(dt, buf, (size_t)iv, v);
    for (int q = 0; q < V; q++) {
      v[q] = cuda_bn_y(v[q], sc[c0][0], sc[c0][1], sc[c0][2], sc[c0][3]);
      if (relu) v[q] = cuda_bn_relu(v[q]);
      if (++j == g.hw) j = 0, c0++;
    }
    tt_cuda_stv<V>(dt, y, gv, v);
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_res_fwd_k(cuda_bn_rgeom g, tt_dtype dt, const void *x,
                                                                           const float *gamma, const float *bias, void *y,
                                                                           float *running_mean, float *running_var,
                                                                           float momentum, float eps, float *save_mean,
                                                                           float *save_invstd, int update_running, int relu) {
  if (dt == TT_F32)
    cuda_bn_res_fwd_body<4>(g, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                            update_running, relu);
  else
    cuda_bn_res_fwd_body<8>(g, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                            update_running, relu);
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

/* bn_apply's launches with the caller's op name in messages (below, beside the flat form) */
static int cuda_bn_apply_launch(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x,
                                const float *gamma, const float *bias, const float *save_mean, const float *save_invstd,
                                int relu, void *y);

/* the training forward's statistics in the flat form (below), when it applies: 1 launched, 0 not, -1 failed */
static int cuda_bn_fwd_stats_flat(tt_backend *b, const char *op, const cuda_bn_geom &g, int n, int c, int hw, tt_dtype dt,
                                  const void *x, const void *y, float *running_mean, float *running_var, float momentum,
                                  float eps, float *save_mean, float *save_invstd, int update_running, void *ws);

/* bn_fwd_train, and with relu the ReLU-fused form (backend.h bn_fwd_train_relu); op names the
 * entry point in messages. */
static int cuda_bn_fwd_train(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x,
                             const float *gamma, const float *bias, void *y, float *running_mean, float *running_var,
                             float momentum, float eps, float *save_mean, float *save_invstd, int update_running, int relu,
                             void *ws, size_t ws_bytes) {
  const void *ptrs[2] = {x, y};
  cuda_bn_geom g;
  int splits;
  if (cuda_norm_bn_check(b, op, n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !y || !save_mean || !save_invstd)
    return tt_cuda_fail(b, "%s: NULL x, gamma, bias, y, save_mean or save_invstd", op);
  if (update_running && (!running_mean || !running_var))
    return tt_cuda_fail(b, "%s: update_running set but running_mean or running_var is NULL", op);
  if (cuda_bn_ws_check(b, op, n, c, hw, dt, ws, ws_bytes)) return -1;
  {
    cuda_bn_rgeom rg;
    size_t sh;
    if (cuda_bn_res_geometry(b, n, c, hw, dt, ptrs, 2, 1, &rg, &sh)) { /* x held on chip: one read */
      TT_LAUNCH(cuda_bn_res_fwd_k, (unsigned)(c / rg.g), TT_CUDA_THREADS, sh, cuda_norm_stream(b), rg, dt, x, gamma, bias, y,
                running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running, relu);
      CUDA_LAUNCH_CHECK(b, op);
      return 0;
    }
  }
  g = cuda_bn_geometry(n, c, hw, dt, ptrs, 2);
  splits = cuda_bn_splits(g);
  if (hw == 1) { /* rows (an NHWC tensor): coalesced over channels */
    TT_LAUNCH(cuda_bn_rows_stats_k, cuda_bn_rows_grid(g), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x, (cuda_bn_d2 *)ws);
    CUDA_LAUNCH_CHECK(b, op);
    TT_LAUNCH(cuda_bn_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, splits, dt, x,
              (const cuda_bn_d2 *)ws, running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running);
    CUDA_LAUNCH_CHECK(b, op);
    TT_LAUNCH(cuda_bn_rows_norm_k, tt_cuda_blocks((size_t)n * c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), (size_t)n * c, c,
              dt, x, gamma, bias, (const float *)save_mean, (const float *)save_invstd, 0, eps, relu, y);
    CUDA_LAUNCH_CHECK(b, op);
    return 0;
  }
  switch (cuda_bn_fwd_stats_flat(b, op, g, n, c, hw, dt, x, y, running_mean, running_var, momentum, eps, save_mean,
                                 save_invstd, update_running, ws)) {
    case 1: break; /* the flat form's sums (planes not whole 16-byte vectors) */
    case -1: return -1;
    default:
      TT_LAUNCH(cuda_bn_stats_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x,
                (cuda_bn_d2 *)ws);
      CUDA_LAUNCH_CHECK(b, op);
      TT_LAUNCH(cuda_bn_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, splits, dt, x,
                (const cuda_bn_d2 *)ws, running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running);
      CUDA_LAUNCH_CHECK(b, op);
      break;
  }
  /* the normalisation as bn_apply does it from the statistics just written: the flat form
   * where the per-channel runs are not whole 16-byte vectors (7x7 and 14x14 planes), the same
   * per-element arithmetic either way */
  return cuda_bn_apply_launch(b, op, n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, relu, y);
}

int tt_cuda_bn_fwd_train(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                         const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                         float *save_mean, float *save_invstd, int update_running, void *ws, size_t ws_bytes) {
  return cuda_bn_fwd_train(b, "bn_fwd_train", n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps,
                           save_mean, save_invstd, update_running, 0, ws, ws_bytes);
}

/* backend.h's bn_fwd_train_relu: y = relu(bn(x)), the launches of bn_fwd_train with the ReLU in
 * the normalisation, bit for bit bn_fwd_train then act_fwd(RELU) on y. */
int tt_cuda_bn_fwd_train_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                              const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                              float eps, float *save_mean, float *save_invstd, int update_running, void *ws,
                              size_t ws_bytes) {
  return cuda_bn_fwd_train(b, "bn_fwd_train_relu", n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum,
                           eps, save_mean, save_invstd, update_running, 1, ws, ws_bytes);
}

/* Inference over the flat tensor, for planes whose per-channel runs cannot be read as 16-byte
 * vectors (hw not a multiple of 16 bytes: 7x7, 14x14 in fp16): a block takes a contiguous run
 * of CUDA_BNI_VPT x 256 vectors of 16 bytes, which may span many planes. It stages each plane's
 * constants (mean, invstd, gamma, bias: the per-channel kernel's, so y is bit for bit the
 * same) in shared memory once, then each vector is loaded, normalised element by element (the
 * plane advancing by a counter; one division per vector) and stored. For hw >= 32 a block
 * touches at most CUDA_BNI_MAXP planes. */

template <int V>
static __device__ __forceinline__ void cuda_bni_body(size_t total_v, int hw, int c, tt_dtype dt, const void *x,
                                                     const float *gamma, const float *bias, const float *rmean,
                                                     const float *rvar, float eps, int given, int relu, void *y,
                                                     float (*sp)[CUDA_BNI_MAXP]) {
  const size_t per = (size_t)blockDim.x * CUDA_BNI_VPT, v0 = (size_t)blockIdx.x * per;
  const size_t v1 = v0 + per < total_v ? v0 + per : total_v;
  const size_t p0 = v0 * V / (size_t)hw, p1 = (v1 * V - 1) / (size_t)hw;
  for (size_t j = threadIdx.x; j <= p1 - p0; j += blockDim.x) {
    const int ch = (int)((p0 + j) % (size_t)c);
    sp[0][j] = rmean[ch];
    sp[1][j] = given ? rvar[ch] : (float)(1.0 / sqrt((double)rvar[ch] + (double)eps)); /* given: bn_apply's invstd */
    sp[2][j] = gamma[ch], sp[3][j] = bias[ch];
  }
  __syncthreads();
  for (size_t iv = v0 + threadIdx.x; iv < v1; iv += blockDim.x) {
    const size_t e = iv * V, pl = e / (size_t)hw;
    int k = (int)(e - pl * (size_t)hw), j = (int)(pl - p0);
    float v[V];
    tt_cuda_ldv<V>(dt, x, iv, v);
    for (int q = 0; q < V; q++) {
      v[q] = cuda_bn_y(v[q], sp[0][j], sp[1][j], sp[2][j], sp[3][j]);
      if (relu) v[q] = cuda_bn_relu(v[q]);
      if (++k == hw) k = 0, j++;
    }
    tt_cuda_stv<V>(dt, y, iv, v);
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_infer_flat_k(size_t total_v, int hw, int c, tt_dtype dt,
                                                                              const void *x, const float *gamma,
                                                                              const float *bias, const float *rmean,
                                                                              const float *rvar, float eps, int given,
                                                                              int relu, void *y) {
  __shared__ float sp[4][CUDA_BNI_MAXP];
  if (dt == TT_F32)
    cuda_bni_body<4>(total_v, hw, c, dt, x, gamma, bias, rmean, rvar, eps, given, relu, y, sp);
  else
    cuda_bni_body<8>(total_v, hw, c, dt, x, gamma, bias, rmean, rvar, eps, given, relu, y, sp);
}

/* The flat forms' grid (0: they do not apply): hw not whole 16-byte vectors (g.v, from the same
 * pointers) but at least CUDA_BNI_MINHW, the tensor whole 16-byte vectors, every pointer 16-byte
 * aligned. Shared by the normalisation and bn_bwd's dx (cuda_bn_dx_flat_k). */
static size_t cuda_bn_flat_blocks(const cuda_bn_geom &g, int n, int c, int hw, tt_dtype dt, const void *const *ptrs,
                                  int nptrs) {
  const size_t vf = 16 / tt_dtype_size(dt), total = (size_t)n * c * hw;
  const size_t per = (size_t)TT_CUDA_THREADS * CUDA_BNI_VPT, blocks = (total / vf + per - 1) / per;
  if ((size_t)g.v >= vf || hw < CUDA_BNI_MINHW || total % vf || blocks > 0x7fffffffu) return 0;
  for (int i = 0; i < nptrs; i++)
    if ((uintptr_t)ptrs[i] & 15) return 0;
  return blocks;
}

/* The flat form's launch when it applies (returns 1 launched, 0 not, -1 failed: where
 * cuda_bn_flat_blocks says). given: rvar holds 1/std (bn_apply), else the running variance. */
static int cuda_bn_flat(tt_backend *b, const char *op, const cuda_bn_geom &g, int n, int c, int hw, tt_dtype dt, const void *x,
                        const float *gamma, const float *bias, const float *rmean, const float *rvar, float eps, int given,
                        int relu, void *y) {
  const void *ptrs[2] = {x, y};
  const size_t vf = 16 / tt_dtype_size(dt), total = (size_t)n * c * hw;
  const size_t blocks = cuda_bn_flat_blocks(g, n, c, hw, dt, ptrs, 2);
  if (!blocks) return 0;
  TT_LAUNCH(cuda_bn_infer_flat_k, (unsigned)blocks, TT_CUDA_THREADS, 0, cuda_norm_stream(b), total / vf, hw, c, dt, x, gamma,
            bias, rmean, rvar, eps, given, relu, y);
  CUDA_LAUNCH_CHECK(b, op);
  return 1;
}

/* ---- flat statistics: the training forward's and the backward's sums, where the normalisation
 * takes the flat form (planes not whole 16-byte vectors: 7x7 and 14x14 in fp16 and bf16, 7x7 in
 * fp32), which the per-channel kernels read 2 bytes at a time (one channel's 98-byte planes per
 * block at 7x7: 82% of sectors). A block takes a group of cg consecutive channels and a split of
 * the samples: in each sample the group's planes are one contiguous run, cg chosen so that every
 * group starts on a 16-byte boundary and a run is about CUDA_BNI_VPT x 256 16-byte vectors. Per
 * sample each thread sums its vectors' elements per plane (a vector holds at most two planes: V <=
 * 8 < CUDA_BNI_MINHW) into shared memory; then the thread of channel j adds its plane's vectors in
 * order and keeps the channel's sums over the samples (fp32 per sample, double across them). The
 * block writes its partial where the per-channel kernels do (part[split * c + ch], a cuda_bn_d2),
 * so cuda_bn_final_k and cuda_bn_bwd_final_k finish both: the same sums (x - K, its square, K
 * the channel's first value; dy and dy * xhat with the ReLU's mask for bn_bwd_relu), grouped
 * differently, so the statistics agree with the per-channel kernels' to rounding, not bit for
 * bit. Fixed order throughout: deterministic. ---- */
struct cuda_bn_fgeom {
  int n, c, hw, cg; /* shape; channels a group */
  int spb;          /* samples a split */
};

/* channels a group for hw and dt: a multiple of the channels whose planes make whole 16-byte
 * vectors, about CUDA_BNI_VPT x 256 vectors a run */
static int cuda_bn_flat_cg(int hw, tt_dtype dt) {
  const int es = (int)tt_dtype_size(dt), vf = 16 / es;
  int g0 = 1, cg;
  while ((g0 * hw * es) % 16) g0++;
  cg = TT_CUDA_THREADS * CUDA_BNI_VPT * vf / hw;
  cg -= cg % g0;
  return cg < g0 ? g0 : cg;
}

template <int V, int BWD>
static __device__ __forceinline__ void cuda_bn_flat_sums_body(cuda_bn_fgeom fg, tt_dtype dt, const void *x, const void *dy,
                                                              const float *mean_p, const float *invstd_p,
                                                              const float *gamma, const float *bias, int relu,
                                                              cuda_bn_d2 *part, float (*sp)[CUDA_BNI_MAXP],
                                                              float (*vs)[2][TT_CUDA_THREADS * CUDA_BNI_VPT]) {
  const int c0 = (int)blockIdx.x * fg.cg, cgb = fg.c - c0 < fg.cg ? fg.c - c0 : fg.cg;
  const size_t run_e = (size_t)cgb * fg.hw, run_v = (run_e + V - 1) / V;
  const int s0 = (int)blockIdx.y * fg.spb, s1 = s0 + fg.spb < fg.n ? s0 + fg.spb : fg.n;
  const int me = (int)threadIdx.x;
  double acc1 = 0.0, acc2 = 0.0;
  for (int j = me; j < cgb; j += blockDim.x) { /* each channel's constants */
    const size_t ch = (size_t)c0 + j;
    if (!BWD) {
      sp[0][j] = tt_cuda_ld(dt, x, ch * (size_t)fg.hw); /* K: cuda_bn_first */
    } else {
      sp[0][j] = mean_p[ch], sp[1][j] = invstd_p[ch];
      sp[2][j] = relu ? gamma[ch] : 0.0f, sp[3][j] = relu ? bias[ch] : 0.0f;
    }
  }
  __syncthreads();
  for (int s = s0; s < s1; s++) {
    const size_t base_v = ((size_t)s * fg.c + c0) * fg.hw / V; /* the run's first vector: whole, by cg's choice */
    for (size_t lv = me; lv < run_v; lv += blockDim.x) {
      const size_t el = lv * V;
      int j = (int)(el / (size_t)fg.hw), k = (int)(el - (size_t)j * fg.hw), sg = 0;
      float xv[V], gv[V], a0 = 0.0f, a1 = 0.0f, q0 = 0.0f, q1 = 0.0f; /* the two planes' sums (scalars: no local memory) */
      tt_cuda_ldv<V>(dt, x, base_v + lv, xv);
      if (BWD) tt_cuda_ldv<V>(dt, dy, base_v + lv, gv);
      /* el + t < run_e always holds (every group ends on a whole vector: cg's choice, c's check in
       * cuda_bn_stats_flat); without the test nvcc 13 spilled this loop's registers on sm_120 */
      for (int t = 0; t < V && el + t < run_e; t++) {
        const int jj = j + sg;
        float u, w;
        if (!BWD) {
          u = xv[t] - sp[0][jj];
          w = u * u;
        } else {
          u = gv[t];
          if (relu && !cuda_bn_relu_pass(dt, cuda_bn_y(xv[t], sp[0][jj], sp[1][jj], sp[2][jj], sp[3][jj]))) u = 0.0f;
          w = u * ((xv[t] - sp[0][jj]) * sp[1][jj]);
        }
        if (sg)
          a1 += u, q1 += w;
        else
          a0 += u, q0 += w;
        if (++k == fg.hw) k = 0, sg = 1;
      }
      vs[0][0][lv] = a0, vs[0][1][lv] = a1, vs[1][0][lv] = q0, vs[1][1][lv] = q1;
    }
    __syncthreads();
    for (int j = me; j < cgb; j += blockDim.x) { /* channel c0 + j: its plane's vectors in order */
      const size_t e0 = (size_t)j * fg.hw, e1 = e0 + fg.hw - 1;
      float t1 = 0.0f, t2 = 0.0f;
      for (size_t lv = e0 / V; lv <= e1 / V; lv++) {
        const int sg = lv * V / (size_t)fg.hw == (size_t)j ? 0 : 1; /* the plane is the vector's first or second */
        t1 += vs[0][sg][lv], t2 += vs[1][sg][lv];
      }
      if (j == me) acc1 += t1, acc2 += t2;
    }
    __syncthreads(); /* vs is written again for the next sample */
  }
  if (me < cgb) part[(size_t)blockIdx.y * fg.c + c0 + me] = cuda_bn_d2{acc1, acc2};
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_stats_flat_k(cuda_bn_fgeom fg, tt_dtype dt, const void *x,
                                                                              cuda_bn_d2 *part) {
  __shared__ float sp[4][CUDA_BNI_MAXP];
  __shared__ float vs[2][2][TT_CUDA_THREADS * CUDA_BNI_VPT];
  if (dt == TT_F32)
    cuda_bn_flat_sums_body<4, 0>(fg, dt, x, NULL, NULL, NULL, NULL, NULL, 0, part, sp, vs);
  else
    cuda_bn_flat_sums_body<8, 0>(fg, dt, x, NULL, NULL, NULL, NULL, NULL, 0, part, sp, vs);
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_bwd_stats_flat_k(cuda_bn_fgeom fg, tt_dtype dt,
                                                                                  const void *x, const void *dy,
                                                                                  const float *mean_p, const float *invstd_p,
                                                                                  const float *gamma, const float *bias,
                                                                                  int relu, cuda_bn_d2 *part) {
  __shared__ float sp[4][CUDA_BNI_MAXP];
  __shared__ float vs[2][2][TT_CUDA_THREADS * CUDA_BNI_VPT];
  if (dt == TT_F32)
    cuda_bn_flat_sums_body<4, 1>(fg, dt, x, dy, mean_p, invstd_p, gamma, bias, relu, part, sp, vs);
  else
    cuda_bn_flat_sums_body<8, 1>(fg, dt, x, dy, mean_p, invstd_p, gamma, bias, relu, part, sp, vs);
}

/* The flat statistics' launch when the flat form applies to ptrs (returns the split count, for the
 * final kernel; 0 not launched; -1 failed): bwd 0 the forward's sums of x into ws, bwd 1 the
 * backward's of x and dy. The group's channels must fit the block's constants (cg <= 128 for hw >=
 * CUDA_BNI_MINHW) and every group start a whole vector (c's planes whole 16-byte vectors per sample). */
static int cuda_bn_stats_flat(tt_backend *b, const char *op, const cuda_bn_geom &g, int n, int c, int hw, tt_dtype dt,
                              const void *const *ptrs, int nptrs, const void *x, const void *dy, const float *mean,
                              const float *invstd, const float *gamma, const float *bias, int relu, int bwd, void *ws) {
  const size_t es = tt_dtype_size(dt);
  cuda_bn_fgeom fg;
  int splits;
  if (!cuda_bn_flat_blocks(g, n, c, hw, dt, ptrs, nptrs) || ((size_t)c * hw * es) % 16) return 0;
  fg.n = n, fg.c = c, fg.hw = hw, fg.cg = cuda_bn_flat_cg(hw, dt);
  if (fg.cg > CUDA_BNI_MAXP || (size_t)fg.cg * hw > (size_t)TT_CUDA_THREADS * CUDA_BNI_VPT * (16 / es)) return 0;
  splits = (int)cuda_bn_max_splits(n, hw); /* within the workspace's sizing */
  if (splits > n) splits = n;
  fg.spb = (n + splits - 1) / splits;
  splits = (n + fg.spb - 1) / fg.spb;
  if (bwd)
    TT_LAUNCH(cuda_bn_bwd_stats_flat_k, dim3((unsigned)((c + fg.cg - 1) / fg.cg), (unsigned)splits), TT_CUDA_THREADS, 0,
              cuda_norm_stream(b), fg, dt, x, dy, mean, invstd, gamma, bias, relu, (cuda_bn_d2 *)ws);
  else
    TT_LAUNCH(cuda_bn_stats_flat_k, dim3((unsigned)((c + fg.cg - 1) / fg.cg), (unsigned)splits), TT_CUDA_THREADS, 0,
              cuda_norm_stream(b), fg, dt, x, (cuda_bn_d2 *)ws);
  CUDA_LAUNCH_CHECK(b, op);
  return splits;
}

static int cuda_bn_fwd_stats_flat(tt_backend *b, const char *op, const cuda_bn_geom &g, int n, int c, int hw, tt_dtype dt,
                                  const void *x, const void *y, float *running_mean, float *running_var, float momentum,
                                  float eps, float *save_mean, float *save_invstd, int update_running, void *ws) {
  const void *ptrs[2] = {x, y};
  int splits = cuda_bn_stats_flat(b, op, g, n, c, hw, dt, ptrs, 2, x, NULL, NULL, NULL, NULL, NULL, 0, 0, ws);
  if (splits <= 0) return splits;
  TT_LAUNCH(cuda_bn_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, splits, dt, x,
            (const cuda_bn_d2 *)ws, running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running);
  CUDA_LAUNCH_CHECK(b, op);
  return 1;
}

int tt_cuda_bn_fwd_infer(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                         const float *bias, const float *running_mean, const float *running_var, float eps, void *y,
                         void *ws, size_t ws_bytes) {
  const void *ptrs[2] = {x, y};
  cuda_bn_geom g;
  if (cuda_norm_bn_check(b, "bn_fwd_infer", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !running_mean || !running_var || !y)
    return tt_cuda_fail(b, "bn_fwd_infer: NULL x, gamma, bias, running_mean, running_var or y");
  g = cuda_bn_geometry(n, c, hw, dt, ptrs, 2);
  if (hw == 1) { /* rows: flat, channel i % c */
    TT_LAUNCH(cuda_bn_rows_norm_k, tt_cuda_blocks((size_t)n * c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), (size_t)n * c, c,
              dt, x, gamma, bias, running_mean, running_var, 1, eps, 0, y);
    CUDA_LAUNCH_CHECK(b, "bn_fwd_infer");
    return 0;
  }
  switch (cuda_bn_flat(b, "bn_fwd_infer", g, n, c, hw, dt, x, gamma, bias, running_mean, running_var, eps, 0, 0, y)) {
    case 1: return 0; /* the flat form: 16-byte vectors across planes */
    case -1: return -1;
    default: break;
  }
  TT_LAUNCH(cuda_bn_norm_k, dim3((unsigned)c, (unsigned)cuda_bn_splits(g)), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt,
            x, gamma, bias, running_mean, running_var, 1, eps, 0, y);
  CUDA_LAUNCH_CHECK(b, "bn_fwd_infer");
  return 0;
}

/* Batch norm from given statistics (backend.h bn_apply), and bn_fwd_train's normalisation from
 * the statistics it has just written: the same launches, so y is bit for bit what the training
 * forward wrote from them. The per-channel kernel on the geometry of V from hw and the x and y
 * pointers (S from the size); or, where inference takes it (7x7 planes in fp16: 98-byte planes
 * read 2 bytes at a time by the per-channel kernel, 70% sector efficiency), the flat form with
 * the same per-element arithmetic (test_cuda checks the bits against the per-channel kernel's).
 * No workspace. */
static int cuda_bn_apply_launch(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x,
                                const float *gamma, const float *bias, const float *save_mean, const float *save_invstd,
                                int relu, void *y) {
  const void *ptrs[2] = {x, y};
  cuda_bn_geom g = cuda_bn_geometry(n, c, hw, dt, ptrs, 2);
  if (hw == 1) { /* rows: bn_fwd_train's rows normalisation, the same kernel */
    TT_LAUNCH(cuda_bn_rows_norm_k, tt_cuda_blocks((size_t)n * c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), (size_t)n * c, c,
              dt, x, gamma, bias, save_mean, save_invstd, 0, 0.0f, relu, y);
    CUDA_LAUNCH_CHECK(b, op);
    return 0;
  }
  switch (cuda_bn_flat(b, op, g, n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, 0.0f, 1, relu, y)) {
    case 1: return 0;
    case -1: return -1;
    default: break;
  }
  TT_LAUNCH(cuda_bn_norm_k, dim3((unsigned)c, (unsigned)cuda_bn_splits(g)), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x,
            gamma, bias, save_mean, save_invstd, 0, 0.0f, relu, y);
  CUDA_LAUNCH_CHECK(b, op);
  return 0;
}

extern "C" int tt_cuda_bn_apply(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                                const float *bias, const float *save_mean, const float *save_invstd, void *y) {
  if (cuda_norm_bn_check(b, "bn_apply", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !save_mean || !save_invstd || !y)
    return tt_cuda_fail(b, "bn_apply: NULL x, gamma, bias, save_mean, save_invstd or y");
  return cuda_bn_apply_launch(b, "bn_apply", n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, 0, y);
}

template <int V>
static __device__ __forceinline__ void cuda_bn_stats_bwd(const cuda_bn_geom &g, tt_dtype dt, const void *x,
                                                         const void *dy, float mean, float invstd, float gm, float bb,
                                                         int relu, float &s1, float &s2) {
  cuda_bn_walk(g, [&](size_t iv) {
    float xv[V], gv[V];
    tt_cuda_ldv<V>(dt, x, iv, xv);
    tt_cuda_ldv<V>(dt, dy, iv, gv);
    for (int j = 0; j < V; j++) {
      gv[j] = cuda_bn_relu_grad(dt, relu, gv[j], xv[j], mean, invstd, gm, bb);
      s1 += gv[j];
      s2 += gv[j] * ((xv[j] - mean) * invstd);
    }
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_bwd_stats_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                             const void *dy, const float *save_mean,
                                                                             const float *save_invstd, const float *gamma,
                                                                             const float *bias, int relu, cuda_bn_d2 *part) {
  __shared__ double sh[33];
  __shared__ float sc[4];
  const int ch = blockIdx.x;
  float s1 = 0.0f, s2 = 0.0f, mean, invstd, gm, bb;
  double t1, t2;
  if (threadIdx.x == 0) {
    sc[0] = save_mean[ch], sc[1] = save_invstd[ch];
    sc[2] = relu ? gamma[ch] : 0.0f, sc[3] = relu ? bias[ch] : 0.0f; /* ReLU's mask from bn's y */
  }
  __syncthreads();
  mean = sc[0], invstd = sc[1], gm = sc[2], bb = sc[3];
  switch (g.v) {
    case 8: cuda_bn_stats_bwd<8>(g, dt, x, dy, mean, invstd, gm, bb, relu, s1, s2); break;
    case 4: cuda_bn_stats_bwd<4>(g, dt, x, dy, mean, invstd, gm, bb, relu, s1, s2); break;
    case 2: cuda_bn_stats_bwd<2>(g, dt, x, dy, mean, invstd, gm, bb, relu, s1, s2); break;
    default: cuda_bn_stats_bwd<1>(g, dt, x, dy, mean, invstd, gm, bb, relu, s1, s2); break;
  }
  t1 = tt_cuda_block_sum((double)s1, sh);
  t2 = tt_cuda_block_sum((double)s2, sh);
  if (threadIdx.x == 0) part[(size_t)blockIdx.y * g.c + ch] = cuda_bn_d2{t1, t2};
}

/* One thread per channel: dbias, dgamma (with beta_param) and the two means dx needs (md). */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_bwd_final_k(cuda_bn_geom g, int splits,
                                                                             const cuda_bn_d2 *part, float *dgamma,
                                                                             float *dbias, float beta_param, cuda_bn_f2 *md) {
  TT_CUDA_LOOP(ch, (size_t)g.c) {
    const size_t m = (size_t)g.n * g.hw;
    double sdy = 0.0, sdyx = 0.0;
    for (int j = 0; j < splits; j++) {
      cuda_bn_d2 p = part[(size_t)j * g.c + ch];
      sdy += p.x, sdyx += p.y;
    }
    md[ch] = cuda_bn_bwd_finish(sdy, sdyx, m, beta_param, dgamma, dbias, ch);
  }
}

template <int V>
static __device__ __forceinline__ void cuda_bn_dx(const cuda_bn_geom &g, tt_dtype dt, const void *x, const void *dy,
                                                  void *dx, float mean, float invstd, float a, float mdy, float mdyx,
                                                  float gm, float bb, int relu, float beta_dx) {
  cuda_bn_walk(g, [&](size_t iv) {
    float xv[V], gv[V], ov[V] = {}; /* read only with beta_dx (initialised for the compiler) */
    tt_cuda_ldv<V>(dt, x, iv, xv);
    tt_cuda_ldv<V>(dt, dy, iv, gv);
    if (beta_dx != 0.0f) tt_cuda_ldv<V>(dt, dx, iv, ov);
    for (int j = 0; j < V; j++) {
      float v = cuda_bn_dx_value(dt, relu, gv[j], xv[j], mean, invstd, a, mdy, mdyx, gm, bb);
      xv[j] = beta_dx != 0.0f ? v + beta_dx * ov[j] : v;
    }
    tt_cuda_stv<V>(dt, dx, iv, xv);
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_dx_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                      const void *dy, const float *gamma,
                                                                      const float *save_mean, const float *save_invstd,
                                                                      const cuda_bn_f2 *md, const float *bias, int relu,
                                                                      void *dx, float beta_dx) {
  __shared__ float sc[7];
  const int ch = blockIdx.x;
  if (threadIdx.x == 0) {
    const cuda_bn_f2 d = md[ch];
    const float gm = gamma[ch], is = save_invstd[ch];
    sc[0] = save_mean[ch], sc[1] = is, sc[2] = gm * is, sc[3] = d.x, sc[4] = d.y;
    sc[5] = gm, sc[6] = relu ? bias[ch] : 0.0f;
  }
  __syncthreads();
  switch (g.v) {
    case 8: cuda_bn_dx<8>(g, dt, x, dy, dx, sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], relu, beta_dx); break;
    case 4: cuda_bn_dx<4>(g, dt, x, dy, dx, sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], relu, beta_dx); break;
    case 2: cuda_bn_dx<2>(g, dt, x, dy, dx, sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], relu, beta_dx); break;
    default: cuda_bn_dx<1>(g, dt, x, dy, dx, sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], relu, beta_dx); break;
  }
}

/* dx over the flat tensor (cuda_bni_body's walk), for the planes the flat inference takes: per
 * plane the five constants cuda_bn_dx_k stages (mean, invstd, gamma * invstd and the two means
 * of md), then each 16-byte vector of x, dy (and dx, beta_dx != 0) is loaded and dx computed
 * element by element with cuda_bn_dx's arithmetic, so dx is bit for bit the per-channel
 * kernel's. */
template <int V>
static __device__ __forceinline__ void cuda_bn_dx_flat_body(size_t total_v, int hw, int c, tt_dtype dt, const void *x,
                                                            const void *dy, const float *gamma, const float *save_mean,
                                                            const float *save_invstd, const cuda_bn_f2 *md,
                                                            const float *bias, int relu, void *dx, float beta_dx,
                                                            float (*sp)[CUDA_BNI_MAXP]) {
  const size_t per = (size_t)blockDim.x * CUDA_BNI_VPT, v0 = (size_t)blockIdx.x * per;
  const size_t v1 = v0 + per < total_v ? v0 + per : total_v;
  const size_t p0 = v0 * V / (size_t)hw, p1 = (v1 * V - 1) / (size_t)hw;
  for (size_t j = threadIdx.x; j <= p1 - p0; j += blockDim.x) {
    const int ch = (int)((p0 + j) % (size_t)c);
    const cuda_bn_f2 d = md[ch];
    const float gm = gamma[ch], is = save_invstd[ch];
    sp[0][j] = save_mean[ch], sp[1][j] = is, sp[2][j] = gm * is;
    sp[3][j] = d.x, sp[4][j] = d.y;
    sp[5][j] = gm, sp[6][j] = relu ? bias[ch] : 0.0f;
  }
  __syncthreads();
  for (size_t iv = v0 + threadIdx.x; iv < v1; iv += blockDim.x) {
    const size_t e = iv * V, pl = e / (size_t)hw;
    int k = (int)(e - pl * (size_t)hw), j = (int)(pl - p0);
    float xv[V], gv[V], ov[V];
    tt_cuda_ldv<V>(dt, x, iv, xv);
    tt_cuda_ldv<V>(dt, dy, iv, gv);
    if (beta_dx != 0.0f) tt_cuda_ldv<V>(dt, dx, iv, ov);
    for (int q = 0; q < V; q++) {
      float v = cuda_bn_dx_value(dt, relu, gv[q], xv[q], sp[0][j], sp[1][j], sp[2][j], sp[3][j], sp[4][j], sp[5][j], sp[6][j]);
      xv[q] = beta_dx != 0.0f ? v + beta_dx * ov[q] : v;
      if (++k == hw) k = 0, j++;
    }
    tt_cuda_stv<V>(dt, dx, iv, xv);
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_dx_flat_k(size_t total_v, int hw, int c, tt_dtype dt,
                                                                           const void *x, const void *dy, const float *gamma,
                                                                           const float *save_mean, const float *save_invstd,
                                                                           const cuda_bn_f2 *md, const float *bias, int relu,
                                                                           void *dx, float beta_dx) {
  __shared__ float sp[7][CUDA_BNI_MAXP];
  if (dt == TT_F32)
    cuda_bn_dx_flat_body<4>(total_v, hw, c, dt, x, dy, gamma, save_mean, save_invstd, md, bias, relu, dx, beta_dx, sp);
  else
    cuda_bn_dx_flat_body<8>(total_v, hw, c, dt, x, dy, gamma, save_mean, save_invstd, md, bias, relu, dx, beta_dx, sp);
}

/* bn_bwd, and with relu (bias given) the ReLU-fused form: dy is the gradient of relu(y), the
 * mask recomputed from x per element (backend.h bn_bwd_relu); op names the entry point. */
static int cuda_bn_bwd(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                       const float *gamma, const float *bias, int relu, const float *save_mean, const float *save_invstd,
                       void *dx, float *dgamma, float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  const void *ptrs[3] = {x, dy, dx};
  cuda_bn_geom g;
  int splits;
  cuda_bn_f2 *md;
  if (cuda_norm_bn_check(b, op, n, c, hw, dt)) return -1;
  if (!x || !dy || !gamma || !save_mean || !save_invstd || (relu && !bias))
    return tt_cuda_fail(b, "%s: NULL x, dy, gamma, %ssave_mean or save_invstd", op, relu ? "bias, " : "");
  if (cuda_bn_ws_check(b, op, n, c, hw, dt, ws, ws_bytes)) return -1;
  {
    cuda_bn_rgeom rg;
    size_t sh;
    if (cuda_bn_res_geometry(b, n, c, hw, dt, ptrs, 3, 2, &rg, &sh)) { /* x and dy held on chip: one read each */
      TT_LAUNCH(cuda_bn_res_bwd_k, (unsigned)(c / rg.g), TT_CUDA_THREADS, sh, cuda_norm_stream(b), rg, dt, x, dy, gamma, bias,
                relu, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param);
      CUDA_LAUNCH_CHECK(b, op);
      return 0;
    }
  }
  g = cuda_bn_geometry(n, c, hw, dt, ptrs, 3);
  splits = cuda_bn_splits(g);
  md = (cuda_bn_f2 *)((char *)ws + cuda_bn_max_splits(n, hw) * c * 16); /* after any split count's partials */
  if (hw == 1) { /* rows (an NHWC tensor): coalesced over channels */
    TT_LAUNCH(cuda_bn_rows_bwd_stats_k, cuda_bn_rows_grid(g), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x, dy, save_mean,
              save_invstd, gamma, bias, relu, (cuda_bn_d2 *)ws);
    CUDA_LAUNCH_CHECK(b, op);
    TT_LAUNCH(cuda_bn_bwd_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, splits,
              (const cuda_bn_d2 *)ws, dgamma, dbias, beta_param, md);
    CUDA_LAUNCH_CHECK(b, op);
    if (!dx) return 0;
    TT_LAUNCH(cuda_bn_rows_dx_k, tt_cuda_blocks((size_t)n * c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), (size_t)n * c, c, dt,
              x, dy, gamma, save_mean, save_invstd, (const cuda_bn_f2 *)md, bias, relu, dx, beta_dx);
    CUDA_LAUNCH_CHECK(b, op);
    return 0;
  }
  switch (int fs = cuda_bn_stats_flat(b, op, g, n, c, hw, dt, ptrs, 3, x, dy, save_mean, save_invstd, gamma, bias, relu, 1,
                                      ws)) {
    case -1: return -1;
    case 0:
      TT_LAUNCH(cuda_bn_bwd_stats_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x,
                dy, save_mean, save_invstd, gamma, bias, relu, (cuda_bn_d2 *)ws);
      CUDA_LAUNCH_CHECK(b, op);
      TT_LAUNCH(cuda_bn_bwd_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, splits,
                (const cuda_bn_d2 *)ws, dgamma, dbias, beta_param, md);
      CUDA_LAUNCH_CHECK(b, op);
      break;
    default: /* the flat form's sums, fs splits of them */
      TT_LAUNCH(cuda_bn_bwd_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, fs,
                (const cuda_bn_d2 *)ws, dgamma, dbias, beta_param, md);
      CUDA_LAUNCH_CHECK(b, op);
      break;
  }
  if (!dx) return 0;
  {
    const size_t vf = 16 / tt_dtype_size(dt), total = (size_t)n * c * hw;
    const size_t blocks = cuda_bn_flat_blocks(g, n, c, hw, dt, ptrs, 3); /* x, dy, dx */
    if (blocks) {
      TT_LAUNCH(cuda_bn_dx_flat_k, (unsigned)blocks, TT_CUDA_THREADS, 0, cuda_norm_stream(b), total / vf, hw, c, dt, x, dy,
                gamma, save_mean, save_invstd, (const cuda_bn_f2 *)md, bias, relu, dx, beta_dx);
      CUDA_LAUNCH_CHECK(b, op);
      return 0;
    }
  }
  TT_LAUNCH(cuda_bn_dx_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x, dy, gamma,
            save_mean, save_invstd, (const cuda_bn_f2 *)md, bias, relu, dx, beta_dx);
  CUDA_LAUNCH_CHECK(b, op);
  return 0;
}

int tt_cuda_bn_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                   const float *save_mean, const float *save_invstd, void *dx, float *dgamma, float *dbias, float beta_dx,
                   float beta_param, void *ws, size_t ws_bytes) {
  return cuda_bn_bwd(b, "bn_bwd", n, c, hw, dt, x, dy, gamma, NULL, 0, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                     beta_param, ws, ws_bytes);
}

/* backend.h's bn_bwd_relu: bn_bwd's launches with ReLU's backward folded into every read of dy
 * (gradient kept where bn's y, rounded to dt, is > 0: bit for bit act_bwd(RELU) then bn_bwd). */
int tt_cuda_bn_bwd_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                        const float *gamma, const float *bias, const float *save_mean, const float *save_invstd, void *dx,
                        float *dgamma, float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  return cuda_bn_bwd(b, "bn_bwd_relu", n, c, hw, dt, x, dy, gamma, bias, 1, save_mean, save_invstd, dx, dgamma, dbias,
                     beta_dx, beta_param, ws, ws_bytes);
}

/* Setup (cuda_backend.cu, after the kernel check): the held-on-chip batch norm's cap on a
 * block's dynamic shared memory. The same on every card from a T4 (whose opt-in limit per block
 * is 64 KiB; tests/tools/cuda_check.py holds the kernels' static shared memory + this cap under
 * every architecture's), so a shape takes the same form, and its statistics the same rounding, on
 * every card; TINYTRAIN_CUDA_BN_RESIDENT=0 turns the form off. Above 48 KiB a launch needs the
 * kernels' opt-in attribute, set here. */
#define CUDA_BN_RES_CAP (62 * 1024)
int tt_cuda_norm_setup(tt_backend *b, const cudaDeviceProp *prop) {
  tt_cuda_state *st = tt_cuda_st(b);
  const char *env = getenv("TINYTRAIN_CUDA_BN_RESIDENT");
  cudaFuncAttributes fa, ba;
  size_t stat, cap;
  st->bn_res_cap = st->bn_res_cap_default = 0;
  if (env && !strcmp(env, "0")) return 0;
  CUDA_CHECK(b, cudaFuncGetAttributes(&fa, cuda_bn_res_fwd_k));
  CUDA_CHECK(b, cudaFuncGetAttributes(&ba, cuda_bn_res_bwd_k));
  stat = fa.sharedSizeBytes > ba.sharedSizeBytes ? fa.sharedSizeBytes : ba.sharedSizeBytes;
  if (prop->sharedMemPerBlockOptin <= stat) return 0;
  cap = prop->sharedMemPerBlockOptin - stat;
  if (cap > (size_t)CUDA_BN_RES_CAP) cap = CUDA_BN_RES_CAP;
  if (cap > prop->sharedMemPerBlock) {
    CUDA_CHECK(b, cudaFuncSetAttribute(cuda_bn_res_fwd_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap));
    CUDA_CHECK(b, cudaFuncSetAttribute(cuda_bn_res_bwd_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap));
  }
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

/* ----------------------------------- pooling ------------------------------------------ */

/* Element i of an [n, c, rows, cols] tensor in the desc's layout: its plane pl (sample * c +
 * channel) and position (r, col) in it. */
static __device__ __forceinline__ void cuda_pool_at(const tt_pool_desc &d, size_t i, int rows, int cols, size_t *pl, int *r,
                                                    int *col) {
  if (d.layout == TT_LAYOUT_NHWC) { /* [n, rows, cols, c]: channels fastest */
    size_t t = i / (size_t)d.c;
    *col = (int)(t % (size_t)cols), *r = (int)((t / (size_t)cols) % (size_t)rows);
    *pl = t / ((size_t)rows * cols) * (size_t)d.c + i % (size_t)d.c;
  } else {
    *col = (int)(i % (size_t)cols), *r = (int)((i / (size_t)cols) % (size_t)rows);
    *pl = i / ((size_t)rows * cols);
  }
}

/* Where plane pl of an [n, c, rows, cols] tensor starts, and the distance of its consecutive
 * elements (NCHW: contiguous planes; NHWC: a channel's elements are c apart). */
static __device__ __forceinline__ size_t cuda_pool_plane(const tt_pool_desc &d, size_t pl, int rows, int cols, size_t *es) {
  if (d.layout == TT_LAYOUT_NHWC) {
    *es = (size_t)d.c;
    return pl / (size_t)d.c * (size_t)rows * cols * d.c + pl % (size_t)d.c;
  }
  *es = 1;
  return pl * (size_t)rows * cols;
}

/* First maximum of window (oh, ow) of the plane at xoff, elements es apart (index into the
 * plane); NaN wins. */
static __device__ __forceinline__ long long cuda_norm_argmax(tt_pool_desc d, tt_dtype dt, const void *x, size_t xoff,
                                                             size_t es, int oh, int ow, float *best_out) {
  int h0 = oh * d.stride_h - d.pad_h, w0 = ow * d.stride_w - d.pad_w;
  int h1 = h0 + d.kh, w1 = w0 + d.kw;
  long long arg = -1;
  float best = -INFINITY;
  if (h0 < 0) h0 = 0;
  if (w0 < 0) w0 = 0;
  if (h1 > d.h) h1 = d.h;
  if (w1 > d.w) w1 = d.w;
  for (int ih = h0; ih < h1; ih++)
    for (int iw = w0; iw < w1; iw++) {
      size_t i = (size_t)ih * d.w + iw;
      float v = tt_cuda_ld(dt, x, xoff + i * es);
      if (arg < 0 || v > best || v != v) {
        best = v;
        arg = (long long)i;
      }
    }
  *best_out = best;
  return arg;
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_fwd_k(tt_pool_desc d, tt_pool_mode mode, tt_dtype dt,
                                                                  const void *x, void *y) {
  size_t count = (size_t)d.n * d.c * d.p * d.q;
  float inv = 1.0f / (float)(d.kh * d.kw);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int ow, oh;
    size_t pl, es, xoff;
    float v;
    cuda_pool_at(d, i, d.p, d.q, &pl, &oh, &ow);
    xoff = cuda_pool_plane(d, pl, d.h, d.w, &es);
    if (mode == TT_POOL_MAX) {
      cuda_norm_argmax(d, dt, x, xoff, es, oh, ow, &v);
    } else {
      int h0 = oh * d.stride_h - d.pad_h, w0 = ow * d.stride_w - d.pad_w;
      int h1 = h0 + d.kh, w1 = w0 + d.kw;
      float s = 0.0f;
      if (h0 < 0) h0 = 0;
      if (w0 < 0) w0 = 0;
      if (h1 > d.h) h1 = d.h;
      if (w1 > d.w) w1 = d.w;
      for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) s += tt_cuda_ld(dt, x, xoff + ((size_t)ih * d.w + iw) * es);
      v = s * inv;
    }
    tt_cuda_st(dt, y, i, v);
  }
}

/* dt a constant (one kernel per dtype below) */
static __device__ __forceinline__ void cuda_pool_bwd_dt(tt_dtype dt, const tt_pool_desc &d, tt_pool_mode mode,
                                                        const void *x, const void *dy, void *dx, float beta) {
  size_t count = (size_t)d.n * d.c * d.h * d.w;
  float inv = 1.0f / (float)(d.kh * d.kw);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int iw, ih;
    size_t pl, es, xoff, yoff;
    cuda_pool_at(d, i, d.h, d.w, &pl, &ih, &iw);
    xoff = cuda_pool_plane(d, pl, d.h, d.w, &es), yoff = cuda_pool_plane(d, pl, d.p, d.q, &es);
    long long me = (long long)ih * d.w + iw;
    int a = ih + d.pad_h - d.kh + 1, bq = iw + d.pad_w - d.kw + 1;
    int oh0 = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, oh1 = (ih + d.pad_h) / d.stride_h;
    int ow0 = bq <= 0 ? 0 : (bq + d.stride_w - 1) / d.stride_w, ow1 = (iw + d.pad_w) / d.stride_w;
    float acc = 0.0f, bv;
    if (oh1 > d.p - 1) oh1 = d.p - 1;
    if (ow1 > d.q - 1) ow1 = d.q - 1;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        float g = tt_cuda_ld(dt, dy, yoff + ((size_t)oh * d.q + ow) * es);
        if (mode == TT_POOL_MAX) {
          if (cuda_norm_argmax(d, dt, x, xoff, es, oh, ow, &bv) == me) acc += g;
        } else {
          acc += g * inv;
        }
      }
    tt_cuda_st_beta(dt, dx, i, acc, beta);
  }
}

/* One kernel per dtype, each with its own registers (one testing the dtype, or three inlined
 * paths in one, spilled on some architectures), with one resident block per multiprocessor as
 * the launch bound's minimum (__launch_bounds__(threads, 1), written out for cuda_check.py):
 * without it ptxas for sm_120 capped the fp16 kernel's registers and spilled 16 bytes. */
static __global__ void __launch_bounds__(TT_CUDA_THREADS, 1) cuda_pool_bwd_f32_k(tt_pool_desc d, tt_pool_mode mode, const void *x,
                                                                      const void *dy, void *dx, float beta) {
  cuda_pool_bwd_dt(TT_F32, d, mode, x, dy, dx, beta);
}
static __global__ void __launch_bounds__(TT_CUDA_THREADS, 1) cuda_pool_bwd_f16_k(tt_pool_desc d, tt_pool_mode mode, const void *x,
                                                                      const void *dy, void *dx, float beta) {
  cuda_pool_bwd_dt(TT_F16, d, mode, x, dy, dx, beta);
}
static __global__ void __launch_bounds__(TT_CUDA_THREADS, 1) cuda_pool_bwd_bf16_k(tt_pool_desc d, tt_pool_mode mode,
                                                                       const void *x, const void *dy, void *dx, float beta) {
  cuda_pool_bwd_dt(TT_BF16, d, mode, x, dy, dx, beta);
}

/* ---- tiled pooling: one block per (plane, band of rows), the band's inputs staged in shared
 * memory by wide coalesced loads, so that each input element is read from global memory once
 * per band (plus the windows' halo rows between bands) instead of once per covering window.
 *
 * Forward (max, average, argmax): a block computes output rows [r0, r0 + rows) of one plane;
 * it loads x rows [r0*sh - ph, (r0+rows-1)*sh - ph + kh) (clipped to the plane) into tx, then
 * every output from tx. Backward (max from x, max from the saved uint8 index, average): a block
 * writes dx rows [i0, i0 + rows) of one plane; it loads the dy rows of every window that covers
 * one of them into tdy, for max from x the x rows those windows read into tx and then each
 * window's winner (its in-window position, as pool_argmax) into tw, for max from the index the
 * index rows into tw; then each dx element gathers its covering windows in (oh, ow) order, as
 * the untiled kernels above do: the same fp32 sums in the same order, so that dx is bit for bit
 * the untiled kernels' and pool_bwd_idx's dx is pool_bwd's.
 *
 * A band starts at the 32-byte boundary at or before its first element (a lead of up to 31
 * bytes more, loaded and unused), so that each warp's load covers whole sectors; its loads are
 * vectors of V elements (16 bytes where the row length and the pointer allow; the host picks
 * V). rows comes from the host so that the band fits the tiles (cuda_pool_rows_*); a shape
 * whose single row band does not fit (a plane over ~1300 wide at 3x3), or a window of over 256
 * positions (backward's uint8 winners), takes the untiled kernels. */
#define CUDA_POOL_XT 4096 /* floats of x band (16 KiB) */
#define CUDA_POOL_YT 1024 /* floats of dy band (4 KiB) and bytes of winners */
#define CUDA_POOL_LEAD 32 /* elements a band's lead may add: at most 31 bytes */
#define CUDA_POOL_MAXW 2048 /* input columns of the backward's per-column window ranges (8 KiB) */

typedef struct cuda_pool_geom {
  tt_pool_desc d;
  int rows;   /* output rows (forward) or dx rows (backward) per block */
  int bands;  /* blocks per plane: ceil(p or h / rows) */
  int vx, vy; /* vector width (elements) of the x and dy band loads: 8, 4, 2 or 1 */
} cuda_pool_geom;

template <int V>
static __device__ __forceinline__ void cuda_pool_ldband(tt_dtype dt, const void *p, size_t start, size_t cnt, float *t) {
  const size_t v0 = start / V, nv = cnt / V; /* start and cnt are multiples of V (the host's choice of V) */
  for (size_t j = threadIdx.x; j < nv; j += blockDim.x) {
    float v[V];
    tt_cuda_ldv<V>(dt, p, v0 + j, v);
    for (int k = 0; k < V; k++) t[j * V + k] = v[k];
  }
}

/* Loads elements [start - lead, start + cnt) of p into t[0, lead + cnt) as fp32; returns lead,
 * the elements before start down to a 32-byte boundary (never before p itself). p is aligned to
 * V elements, start and cnt multiples of V, so lead is one too. */
static __device__ __forceinline__ int cuda_pool_load(tt_dtype dt, int v, const void *p, size_t start, size_t cnt, float *t) {
  const size_t es = dt == TT_F32 ? 4 : 2;
  size_t lead = (size_t)((((uintptr_t)p + start * es) & 31) / es);
  if (lead > start) lead = start;
  start -= lead, cnt += lead;
  switch (v) {
    case 8: cuda_pool_ldband<8>(dt, p, start, cnt, t); break;
    case 4: cuda_pool_ldband<4>(dt, p, start, cnt, t); break;
    case 2: cuda_pool_ldband<2>(dt, p, start, cnt, t); break;
    default: cuda_pool_ldband<1>(dt, p, start, cnt, t); break;
  }
  return (int)lead;
}

/* First maximum (NaN wins, as cuda_norm_argmax) of window (oh, ow) read from a band tile t
 * (t[(ih - ih_lo) * w + iw]); returns the winner's in-window position, its value in *best. */
static __device__ __forceinline__ int cuda_pool_tile_argmax(const tt_pool_desc &d, const float *t, int ih_lo, int oh, int ow,
                                                            float *best_out) {
  const int hs = oh * d.stride_h - d.pad_h, ws = ow * d.stride_w - d.pad_w;
  int h0 = hs < 0 ? 0 : hs, w0 = ws < 0 ? 0 : ws, h1 = hs + d.kh, w1 = ws + d.kw, arg = -1;
  float best = -INFINITY;
  if (h1 > d.h) h1 = d.h;
  if (w1 > d.w) w1 = d.w;
  for (int ih = h0; ih < h1; ih++)
    for (int iw = w0; iw < w1; iw++) {
      float v = t[(size_t)(ih - ih_lo) * d.w + iw];
      if (arg < 0 || v > best || v != v) {
        best = v;
        arg = (ih - hs) * d.kw + (iw - ws);
      }
    }
  *best_out = best;
  return arg < 0 ? 0 : arg; /* a window inside the padding alone (the desc check rules it out) */
}

/* what: 0 max (y), 1 average (y), 2 argmax (idx). Grid: planes * bands blocks. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_tfwd_k(cuda_pool_geom g, int what, tt_dtype dt,
                                                                          const void *x, void *y, uint8_t *idx) {
  __shared__ float tx[CUDA_POOL_XT];
  const tt_pool_desc d = g.d;
  const size_t plane = blockIdx.x / (unsigned)g.bands;
  const int r0 = (int)(blockIdx.x % (unsigned)g.bands) * g.rows;
  const int r1 = r0 + g.rows < d.p ? r0 + g.rows : d.p;
  const int lo = r0 * d.stride_h - d.pad_h, hi = (r1 - 1) * d.stride_h - d.pad_h + d.kh;
  const int ih_lo = lo < 0 ? 0 : lo, ih_hi = hi > d.h ? d.h : hi;
  const float inv = 1.0f / (float)(d.kh * d.kw);
  const size_t ybase = plane * d.p * d.q + (size_t)r0 * d.q;
  const int nout = (r1 - r0) * d.q;
  const int lead = cuda_pool_load(dt, g.vx, x, plane * d.h * d.w + (size_t)ih_lo * d.w, (size_t)(ih_hi - ih_lo) * d.w, tx);
  const float *t = tx + lead;
  __syncthreads();
  for (int o = threadIdx.x; o < nout; o += blockDim.x) {
    const int oh = r0 + o / d.q, ow = o % d.q;
    float v;
    if (what == 1) {
      const int hs = oh * d.stride_h - d.pad_h, ws = ow * d.stride_w - d.pad_w;
      int h0 = hs < 0 ? 0 : hs, w0 = ws < 0 ? 0 : ws, h1 = hs + d.kh, w1 = ws + d.kw;
      float s = 0.0f;
      if (h1 > d.h) h1 = d.h;
      if (w1 > d.w) w1 = d.w;
      for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) s += t[(size_t)(ih - ih_lo) * d.w + iw];
      v = s * inv;
    } else {
      const int r = cuda_pool_tile_argmax(d, t, ih_lo, oh, ow, &v);
      if (what == 2) {
        idx[ybase + o] = (uint8_t)r;
        continue;
      }
    }
    tt_cuda_st(dt, y, ybase + o, v);
  }
}

/* src: 0 max from x, 1 average, 2 max from idx. Grid: planes * bands blocks. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_tbwd_k(cuda_pool_geom g, int src, tt_dtype dt,
                                                                          const void *x, const uint8_t *idx,
                                                                          const void *dy, void *dx, float beta) {
  __shared__ float tx[CUDA_POOL_XT];
  __shared__ float tdy[CUDA_POOL_YT];
  __shared__ unsigned char tw[CUDA_POOL_YT];
  __shared__ int cw[CUDA_POOL_MAXW]; /* per input column: its first and last covering window, ow0 | ow1 << 16 */
  const tt_pool_desc d = g.d;
  const size_t plane = blockIdx.x / (unsigned)g.bands;
  const int i0 = (int)(blockIdx.x % (unsigned)g.bands) * g.rows;
  const int i1 = i0 + g.rows < d.h ? i0 + g.rows : d.h;
  const int a = i0 + d.pad_h - d.kh + 1, last = (i1 - 1 + d.pad_h) / d.stride_h;
  const int oh_lo = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, oh_hi = last < d.p - 1 ? last : d.p - 1;
  const float inv = 1.0f / (float)(d.kh * d.kw);
  int ly = 0, lw = 0;
  /* the column ranges once per block (w <= CUDA_POOL_MAXW, the host's condition), so that the
   * gather below divides by the strides once per row, not per element: the integer divisions
   * made this kernel instruction-bound (ncu on the H100: 75% SM, 9% memory throughput) */
  for (int iw = threadIdx.x; iw < d.w; iw += blockDim.x) {
    const int aw = iw + d.pad_w - d.kw + 1;
    int ow0 = aw <= 0 ? 0 : (aw + d.stride_w - 1) / d.stride_w, ow1 = (iw + d.pad_w) / d.stride_w;
    if (ow1 > d.q - 1) ow1 = d.q - 1;
    cw[iw] = ow0 | (ow1 << 16);
  }
  if (oh_lo <= oh_hi) { /* the windows that cover a row of the band: rows [oh_lo, oh_hi] of dy */
    const int nwin = (oh_hi - oh_lo + 1) * d.q;
    ly = cuda_pool_load(dt, g.vy, dy, plane * d.p * d.q + (size_t)oh_lo * d.q, (size_t)nwin, tdy);
    if (src == 2) { /* the saved winners, one byte each, from a 32-byte boundary */
      const size_t s0 = plane * d.p * d.q + (size_t)oh_lo * d.q;
      size_t l = (size_t)((uintptr_t)(idx + s0) & 31);
      if (l > s0) l = s0;
      for (int j = threadIdx.x; j < nwin + (int)l; j += blockDim.x) tw[j] = idx[s0 - l + j];
      lw = (int)l;
    } else if (src == 0) { /* x rows the windows read, then each window's winner */
      const int lo = oh_lo * d.stride_h - d.pad_h, hi = oh_hi * d.stride_h - d.pad_h + d.kh;
      const int ih_lo = lo < 0 ? 0 : lo, ih_hi = hi > d.h ? d.h : hi;
      const int lx = cuda_pool_load(dt, g.vx, x, plane * d.h * d.w + (size_t)ih_lo * d.w, (size_t)(ih_hi - ih_lo) * d.w, tx);
      __syncthreads();
      for (int j = threadIdx.x; j < nwin; j += blockDim.x) {
        float v;
        tw[j] = (unsigned char)cuda_pool_tile_argmax(d, tx + lx, ih_lo, oh_lo + j / d.q, j % d.q, &v);
      }
    }
  }
  __syncthreads();
  {
    const size_t xbase = plane * d.h * d.w + (size_t)i0 * d.w;
    const int nin = (i1 - i0) * d.w;
    const float *ty = tdy + ly;
    const unsigned char *win = tw + lw;
    /* e = r * w + iw, stepped by blockDim.x without dividing: r by step_r, iw by step_c with a carry */
    /* blockDim and threadIdx read once, before the loop: under the emulation built with ASan and
     * UBSan (whose swapcontext support ASan calls partial), reading blockDim here, after the
     * barrier above, gave "member access within null pointer" on the emulated builtins (a
     * thread_local) in CI's sanitizer pass; the cause inside the sanitizers is not established */
    const int nt = (int)blockDim.x, tid = (int)threadIdx.x;
    const int step_r = nt / d.w, step_c = nt % d.w;
    int r = tid / d.w, iw = tid % d.w, row = -1, oh0 = 0, oh1 = -1;
    for (int e = tid; e < nin; e += nt) {
      const int ih = i0 + r;
      if (ih != row) { /* the covering window rows, once per row a thread visits */
        const int ah = ih + d.pad_h - d.kh + 1;
        oh0 = ah <= 0 ? 0 : (ah + d.stride_h - 1) / d.stride_h, oh1 = (ih + d.pad_h) / d.stride_h;
        if (oh1 > d.p - 1) oh1 = d.p - 1;
        row = ih;
      }
      const int ow0 = cw[iw] & 0xffff, ow1 = cw[iw] >> 16;
      float acc = 0.0f;
      for (int oh = oh0; oh <= oh1; oh++)
        for (int ow = ow0; ow <= ow1; ow++) {
          const int j = (oh - oh_lo) * d.q + ow;
          if (src == 1) {
            acc += ty[j] * inv;
          } else {
            const int me = (ih - (oh * d.stride_h - d.pad_h)) * d.kw + (iw - (ow * d.stride_w - d.pad_w));
            if (win[j] == me) acc += ty[j];
          }
        }
      tt_cuda_st_beta(dt, dx, xbase + e, acc, beta);
      r += step_r, iw += step_c;
      if (iw >= d.w) iw -= d.w, r++;
    }
  }
}

/* The vector width for a band of rows of length len of p: the widest (16 bytes at most) that
 * divides len and p's alignment. */
static int cuda_pool_vec(const void *p, int len, tt_dtype dt) {
  size_t es = tt_dtype_size(dt);
  int v = (int)(16 / es);
  while (v > 1 && (len % v || ((uintptr_t)p % ((size_t)v * es)))) v >>= 1;
  return v;
}

/* Forward: the most output rows whose x band fits tx; 0 when not even one does. */
static int cuda_pool_rows_fwd(const tt_pool_desc *d) {
  int xr = (CUDA_POOL_XT - CUDA_POOL_LEAD) / d->w, r;
  if (xr < d->kh) return 0;
  r = (xr - d->kh) / d->stride_h + 1;
  return r < d->p ? r : d->p;
}

/* Backward: the most dx rows whose windows' dy rows fit tdy (and tw) and, for max from x, whose
 * x rows fit tx; 0 when not even one does. rows dx rows meet at most (rows + kh - 2) / sh + 1
 * window rows, which read at most (that - 1) * sh + kh rows of x. */
static int cuda_pool_rows_bwd(const tt_pool_desc *d, int need_x) {
  int r = d->h;
  if (d->kh * d->kw > 256) return 0; /* tw's uint8 winners */
  if (d->w > CUDA_POOL_MAXW) return 0; /* cw's column ranges */
  for (; r > 0; r--) {
    long long wr = (r + d->kh - 2) / d->stride_h + 1, xr = (wr - 1) * d->stride_h + d->kh;
    if (wr * d->q + CUDA_POOL_LEAD > CUDA_POOL_YT) continue;
    if (need_x && xr * d->w + CUDA_POOL_LEAD > CUDA_POOL_XT) continue;
    break;
  }
  return r;
}

static cuda_pool_geom cuda_pool_geometry(const tt_pool_desc *d, int rows, int len, tt_dtype dt, const void *x, const void *dy) {
  cuda_pool_geom g;
  g.d = *d, g.rows = rows, g.bands = (len + rows - 1) / rows;
  g.vx = x ? cuda_pool_vec(x, d->w, dt) : 1;
  g.vy = dy ? cuda_pool_vec(dy, d->q, dt) : 1;
  return g;
}

static int cuda_pool_grid_ok(tt_backend *b, const char *op, const tt_pool_desc *d, int bands) {
  if ((size_t)d->n * d->c * bands > 0x7fffffffu) return tt_cuda_fail(b, "%s: %d x %d planes x %d bands exceed a grid", op, d->n, d->c, bands);
  return 0;
}

int tt_cuda_pool_fwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, void *y,
                     void *ws, size_t ws_bytes) {
  int rows;
  (void)ws, (void)ws_bytes;
  if (cuda_norm_pool_check(b, "pool_fwd", d, mode, dt)) return -1;
  if (!x || !y) return tt_cuda_fail(b, "pool_fwd: NULL x or y");
  rows = d->layout == TT_LAYOUT_NHWC ? 0 : cuda_pool_rows_fwd(d); /* NHWC: the untiled kernels */
  if (rows > 0) {
    cuda_pool_geom g = cuda_pool_geometry(d, rows, d->p, dt, x, NULL);
    if (cuda_pool_grid_ok(b, "pool_fwd", d, g.bands)) return -1;
    TT_LAUNCH(cuda_pool_tfwd_k, (unsigned)((size_t)d->n * d->c * g.bands), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g,
              mode == TT_POOL_MAX ? 0 : 1, dt, x, y, (uint8_t *)NULL);
  } else {
    TT_LAUNCH(cuda_pool_fwd_k, tt_cuda_blocks((size_t)d->n * d->c * d->p * d->q), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
              *d, mode, dt, x, y);
  }
  CUDA_LAUNCH_CHECK(b, "pool_fwd");
  return 0;
}

int tt_cuda_pool_bwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, const void *dy,
                     void *dx, float beta, void *ws, size_t ws_bytes) {
  int rows;
  (void)ws, (void)ws_bytes;
  if (cuda_norm_pool_check(b, "pool_bwd", d, mode, dt)) return -1;
  if ((mode == TT_POOL_MAX && !x) || !dy || !dx) return tt_cuda_fail(b, "pool_bwd: NULL x (max), dy or dx");
  rows = d->layout == TT_LAYOUT_NHWC ? 0 : cuda_pool_rows_bwd(d, mode == TT_POOL_MAX); /* NHWC: untiled */
  if (rows > 0) {
    cuda_pool_geom g = cuda_pool_geometry(d, rows, d->h, dt, mode == TT_POOL_MAX ? x : NULL, dy);
    if (cuda_pool_grid_ok(b, "pool_bwd", d, g.bands)) return -1;
    TT_LAUNCH(cuda_pool_tbwd_k, (unsigned)((size_t)d->n * d->c * g.bands), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g,
              mode == TT_POOL_MAX ? 0 : 1, dt, x, (const uint8_t *)NULL, dy, dx, beta);
  } else {
    unsigned blocks = tt_cuda_blocks((size_t)d->n * d->c * d->h * d->w);
    if (dt == TT_F16)
      TT_LAUNCH(cuda_pool_bwd_f16_k, blocks, TT_CUDA_THREADS, 0, cuda_norm_stream(b), *d, mode, x, dy, dx, beta);
    else if (dt == TT_BF16)
      TT_LAUNCH(cuda_pool_bwd_bf16_k, blocks, TT_CUDA_THREADS, 0, cuda_norm_stream(b), *d, mode, x, dy, dx, beta);
    else
      TT_LAUNCH(cuda_pool_bwd_f32_k, blocks, TT_CUDA_THREADS, 0, cuda_norm_stream(b), *d, mode, x, dy, dx, beta);
  }
  CUDA_LAUNCH_CHECK(b, "pool_bwd");
  return 0;
}

/* The untiled kernels for shapes whose band does not fit: pool_argmax's, and pool_bwd_idx's
 * gather (cuda_pool_bwd_dt's, the winner read from idx). */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_argmax_k(tt_pool_desc d, tt_dtype dt, const void *x,
                                                                     uint8_t *idx) {
  size_t count = (size_t)d.n * d.c * d.p * d.q;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int ow, oh;
    size_t pl, es, xoff;
    float v;
    cuda_pool_at(d, i, d.p, d.q, &pl, &oh, &ow);
    xoff = cuda_pool_plane(d, pl, d.h, d.w, &es);
    long long a = cuda_norm_argmax(d, dt, x, xoff, es, oh, ow, &v);
    int r = 0;
    if (a >= 0) r = ((int)(a / d.w) - (oh * d.stride_h - d.pad_h)) * d.kw + ((int)(a % d.w) - (ow * d.stride_w - d.pad_w));
    idx[i] = (uint8_t)r;
  }
}

/* cuda_pool_bwd_k's gather, the winner read from idx. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_bwd_idx_k(tt_pool_desc d, tt_dtype dt, const uint8_t *idx,
                                                                      const void *dy, void *dx, float beta) {
  size_t count = (size_t)d.n * d.c * d.h * d.w;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int iw, ih;
    size_t pl, es, yoff;
    cuda_pool_at(d, i, d.h, d.w, &pl, &ih, &iw);
    yoff = cuda_pool_plane(d, pl, d.p, d.q, &es);
    int a = ih + d.pad_h - d.kh + 1, bq = iw + d.pad_w - d.kw + 1;
    int oh0 = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, oh1 = (ih + d.pad_h) / d.stride_h;
    int ow0 = bq <= 0 ? 0 : (bq + d.stride_w - 1) / d.stride_w, ow1 = (iw + d.pad_w) / d.stride_w;
    float acc = 0.0f;
    if (oh1 > d.p - 1) oh1 = d.p - 1;
    if (ow1 > d.q - 1) ow1 = d.q - 1;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        size_t yi = yoff + ((size_t)oh * d.q + ow) * es;
        int me = (ih - (oh * d.stride_h - d.pad_h)) * d.kw + (iw - (ow * d.stride_w - d.pad_w));
        if (idx[yi] == me) acc += tt_cuda_ld(dt, dy, yi);
      }
    tt_cuda_st_beta(dt, dx, i, acc, beta);
  }
}

int tt_cuda_pool_argmax(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const void *x, uint8_t *idx) {
  int rows;
  if (cuda_norm_pool_check(b, "pool_argmax", d, TT_POOL_MAX, dt)) return -1;
  if (d->kh * d->kw > 256) return tt_cuda_fail(b, "pool_argmax: a %dx%d window has no uint8 index", d->kh, d->kw);
  if (!x || !idx) return tt_cuda_fail(b, "pool_argmax: NULL x or idx");
  rows = d->layout == TT_LAYOUT_NHWC ? 0 : cuda_pool_rows_fwd(d); /* NHWC: the untiled kernels */
  if (rows > 0) {
    cuda_pool_geom g = cuda_pool_geometry(d, rows, d->p, dt, x, NULL);
    if (cuda_pool_grid_ok(b, "pool_argmax", d, g.bands)) return -1;
    TT_LAUNCH(cuda_pool_tfwd_k, (unsigned)((size_t)d->n * d->c * g.bands), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, 2,
              dt, x, (void *)NULL, idx);
  } else {
    TT_LAUNCH(cuda_pool_argmax_k, tt_cuda_blocks((size_t)d->n * d->c * d->p * d->q), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
              *d, dt, x, idx);
  }
  CUDA_LAUNCH_CHECK(b, "pool_argmax");
  return 0;
}

int tt_cuda_pool_bwd_idx(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const uint8_t *idx, const void *dy, void *dx,
                         float beta) {
  int rows;
  if (cuda_norm_pool_check(b, "pool_bwd_idx", d, TT_POOL_MAX, dt)) return -1;
  if (!idx || !dy || !dx) return tt_cuda_fail(b, "pool_bwd_idx: NULL idx, dy or dx");
  rows = d->layout == TT_LAYOUT_NHWC ? 0 : cuda_pool_rows_bwd(d, 0); /* NHWC: the untiled kernels */
  if (rows > 0) {
    cuda_pool_geom g = cuda_pool_geometry(d, rows, d->h, dt, NULL, dy);
    if (cuda_pool_grid_ok(b, "pool_bwd_idx", d, g.bands)) return -1;
    TT_LAUNCH(cuda_pool_tbwd_k, (unsigned)((size_t)d->n * d->c * g.bands), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, 2,
              dt, (const void *)NULL, idx, dy, dx, beta);
  } else {
    TT_LAUNCH(cuda_pool_bwd_idx_k, tt_cuda_blocks((size_t)d->n * d->c * d->h * d->w), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
              *d, dt, idx, dy, dx, beta);
  }
  CUDA_LAUNCH_CHECK(b, "pool_bwd_idx");
  return 0;
}

/* ---------------------------- global average pooling ---------------------------------- */

/* One warp per plane: lanes stride the plane, fp32 partials combined in double. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_gap_fwd_k(size_t planes, int hw, tt_dtype dt, const void *x,
                                                                 void *y) {
  size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  size_t nwarps = ((size_t)blockDim.x * gridDim.x) >> 5;
  for (size_t pl = warp; pl < planes; pl += nwarps) {
    size_t off = pl * hw;
    double s = 0.0;
    for (int k = lane; k < hw; k += 32) s += tt_cuda_ld(dt, x, off + k);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) tt_cuda_st(dt, y, pl, (float)(s / (double)hw));
  }
}

int tt_cuda_gap_fwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, void *y) {
  size_t planes = (size_t)n * c;
  if (cuda_norm_bn_check(b, "gap_fwd", n, c, hw, dt)) return -1;
  if (!x || !y) return tt_cuda_fail(b, "gap_fwd: NULL x or y");
  TT_LAUNCH(cuda_gap_fwd_k, tt_cuda_blocks(planes * 32), TT_CUDA_THREADS, 0, cuda_norm_stream(b), planes, hw, dt, x, y);
  CUDA_LAUNCH_CHECK(b, "gap_fwd");
  return 0;
}

/* One warp per plane: lane 0 loads dy once, the lanes write the plane. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_gap_bwd_k(size_t planes, int hw, tt_dtype dt, const void *dy,
                                                                 void *dx, float beta) {
  size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  size_t nwarps = ((size_t)blockDim.x * gridDim.x) >> 5;
  for (size_t pl = warp; pl < planes; pl += nwarps) {
    float g = lane == 0 ? tt_cuda_ld(dt, dy, pl) : 0.0f;
    g = __shfl_sync(0xffffffffu, g, 0) / (float)hw;
    for (int k = lane; k < hw; k += 32) tt_cuda_st_beta(dt, dx, pl * hw + k, g, beta);
  }
}

int tt_cuda_gap_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *dy, void *dx, float beta) {
  if (cuda_norm_bn_check(b, "gap_bwd", n, c, hw, dt)) return -1;
  if (!dy || !dx) return tt_cuda_fail(b, "gap_bwd: NULL dy or dx");
  TT_LAUNCH(cuda_gap_bwd_k, tt_cuda_blocks((size_t)n * c * 32), TT_CUDA_THREADS, 0, cuda_norm_stream(b), (size_t)n * c, hw,
            dt, dy, dx, beta);
  CUDA_LAUNCH_CHECK(b, "gap_bwd");
  return 0;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
const tt_cuda_kernel tt_cuda_norm_kernels[] = {
    TT_CUDA_KERNEL(cuda_bn_stats_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_final_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_norm_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_bwd_stats_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_bwd_final_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_dx_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_infer_flat_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_dx_flat_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_stats_flat_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_bwd_stats_flat_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_rows_stats_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_rows_bwd_stats_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_rows_norm_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_rows_dx_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_res_fwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_res_bwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_fwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_f32_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_f16_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_bf16_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_argmax_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_idx_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_tfwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_tbwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_gap_fwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_gap_bwd_k, TT_CUDA_THREADS),
};
const int tt_cuda_norm_nkernels = (int)(sizeof tt_cuda_norm_kernels / sizeof tt_cuda_norm_kernels[0]);
