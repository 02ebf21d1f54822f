/* kernels/cuda/cuda_norm.cu — batch norm, pooling and global average pooling, as the
 * backend's own kernels (not cuDNN), so that the semantics are the CPU backend's exactly:
 * batch norm normalises with the biased batch variance, updates running_var with the
 * unbiased one (biased when there is one value per channel), running = (1-m)*running +
 * m*batch; max pooling takes the first maximum (NaN wins) and its backward re-finds it from
 * x; average pooling divides by the full window (count_include_pad). Batch-norm training
 * forward and backward take a workspace (tt_cuda_bn_workspace); nothing else does.
 *
 * Batch norm: see below; the statistics are deterministic (fixed order throughout). Pooling is one thread per output (forward) or per input (backward,
 * gather form: every dx element written once, with beta).
 */
#include <math.h>

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
    const size_t m = (size_t)g.n * g.hw;
    double t1 = 0.0, t2 = 0.0, mean_d, sq;
    for (int j = 0; j < splits; j++) {
      cuda_bn_d2 p = part[(size_t)j * g.c + ch];
      t1 += p.x, t2 += p.y;
    }
    mean_d = (double)cuda_bn_first(g, dt, x, ch) + t1 / (double)m;
    sq = t2 - t1 * t1 / (double)m;
    if (sq < 0.0) sq = 0.0;
    tt_bn_channel_stats(mean_d, sq, m, eps, momentum, update_running, save_mean + ch, save_invstd + ch,
                        update_running ? running_mean + ch : NULL, update_running ? running_var + ch : NULL);
  }
}

/* y = (x - mean) * invstd * gamma + bias, the channel's constants loaded once per block;
 * inference (infer != 0) derives invstd from the running variance, once per block. */
template <int V>
static __device__ __forceinline__ void cuda_bn_norm(const cuda_bn_geom &g, tt_dtype dt, const void *x, void *y,
                                                    float mean, float invstd, float gm, float bb) {
  cuda_bn_walk(g, [&](size_t iv) {
    float v[V];
    tt_cuda_ldv<V>(dt, x, iv, v);
    for (int j = 0; j < V; j++) v[j] = (v[j] - mean) * invstd * gm + bb;
    tt_cuda_stv<V>(dt, y, iv, v);
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_norm_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                        const float *gamma, const float *bias,
                                                                        const float *mean_p, const float *stat_p,
                                                                        int infer, float eps, void *y) {
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
      case 8: cuda_bn_norm<8>(g, dt, x, y, mean, invstd, gm, bb); break;
      case 4: cuda_bn_norm<4>(g, dt, x, y, mean, invstd, gm, bb); break;
      case 2: cuda_bn_norm<2>(g, dt, x, y, mean, invstd, gm, bb); break;
      default: cuda_bn_norm<1>(g, dt, x, y, mean, invstd, gm, bb); break;
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

/* Workspace of bn_fwd_train and bn_bwd: the partials (cuda_bn_d2, S x c) and, for the backward,
 * two floats per channel (cuda_bn_f2). Sized for 1-element vectors, which give the most splits. */
size_t tt_cuda_bn_workspace(int n, int c, int hw, tt_dtype dt) {
  size_t mv = (size_t)n * (size_t)hw, want = (mv + (size_t)TT_CUDA_THREADS * 8 - 1) / ((size_t)TT_CUDA_THREADS * 8);
  (void)dt;
  if (n <= 0 || c <= 0 || hw <= 0) return 0;
  if (want < 1) want = 1;
  if (want > CUDA_BN_MAX_SPLITS) want = CUDA_BN_MAX_SPLITS;
  return want * (size_t)c * 16 + (size_t)c * 8;
}

static int cuda_bn_ws_check(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *ws,
                            size_t ws_bytes) {
  size_t need = tt_cuda_bn_workspace(n, c, hw, dt);
  if (!ws || ws_bytes < need || ((uintptr_t)ws & 15))
    return tt_cuda_fail(b, "%s: workspace %zu bytes at %p, needs %zu bytes 16-byte aligned (op_workspace)", op, ws_bytes,
                        ws, need);
  return 0;
}

int tt_cuda_bn_fwd_train(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                         const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                         float *save_mean, float *save_invstd, int update_running, void *ws, size_t ws_bytes) {
  const void *ptrs[2] = {x, y};
  cuda_bn_geom g;
  int splits;
  if (cuda_norm_bn_check(b, "bn_fwd_train", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !y || !save_mean || !save_invstd)
    return tt_cuda_fail(b, "bn_fwd_train: NULL x, gamma, bias, y, save_mean or save_invstd");
  if (update_running && (!running_mean || !running_var))
    return tt_cuda_fail(b, "bn_fwd_train: update_running set but running_mean or running_var is NULL");
  if (cuda_bn_ws_check(b, "bn_fwd_train", n, c, hw, dt, ws, ws_bytes)) return -1;
  g = cuda_bn_geometry(n, c, hw, dt, ptrs, 2);
  splits = cuda_bn_splits(g);
  TT_LAUNCH(cuda_bn_stats_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x,
            (cuda_bn_d2 *)ws);
  CUDA_LAUNCH_CHECK(b, "bn_fwd_train");
  TT_LAUNCH(cuda_bn_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, splits, dt, x,
            (const cuda_bn_d2 *)ws, running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running);
  CUDA_LAUNCH_CHECK(b, "bn_fwd_train");
  TT_LAUNCH(cuda_bn_norm_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x, gamma,
            bias, (const float *)save_mean, (const float *)save_invstd, 0, eps, y);
  CUDA_LAUNCH_CHECK(b, "bn_fwd_train");
  return 0;
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
  TT_LAUNCH(cuda_bn_norm_k, dim3((unsigned)c, (unsigned)cuda_bn_splits(g)), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt,
            x, gamma, bias, running_mean, running_var, 1, eps, y);
  CUDA_LAUNCH_CHECK(b, "bn_fwd_infer");
  return 0;
}

template <int V>
static __device__ __forceinline__ void cuda_bn_stats_bwd(const cuda_bn_geom &g, tt_dtype dt, const void *x,
                                                         const void *dy, float mean, float invstd, float &s1,
                                                         float &s2) {
  cuda_bn_walk(g, [&](size_t iv) {
    float xv[V], gv[V];
    tt_cuda_ldv<V>(dt, x, iv, xv);
    tt_cuda_ldv<V>(dt, dy, iv, gv);
    for (int j = 0; j < V; j++) {
      s1 += gv[j];
      s2 += gv[j] * ((xv[j] - mean) * invstd);
    }
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_bwd_stats_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                             const void *dy, const float *save_mean,
                                                                             const float *save_invstd, cuda_bn_d2 *part) {
  __shared__ double sh[33];
  __shared__ float sc[2];
  const int ch = blockIdx.x;
  float s1 = 0.0f, s2 = 0.0f, mean, invstd;
  double t1, t2;
  if (threadIdx.x == 0) sc[0] = save_mean[ch], sc[1] = save_invstd[ch];
  __syncthreads();
  mean = sc[0], invstd = sc[1];
  switch (g.v) {
    case 8: cuda_bn_stats_bwd<8>(g, dt, x, dy, mean, invstd, s1, s2); break;
    case 4: cuda_bn_stats_bwd<4>(g, dt, x, dy, mean, invstd, s1, s2); break;
    case 2: cuda_bn_stats_bwd<2>(g, dt, x, dy, mean, invstd, s1, s2); break;
    default: cuda_bn_stats_bwd<1>(g, dt, x, dy, mean, invstd, s1, s2); break;
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
    if (dbias) dbias[ch] = beta_param != 0.0f ? beta_param * dbias[ch] + (float)sdy : (float)sdy;
    if (dgamma) dgamma[ch] = beta_param != 0.0f ? beta_param * dgamma[ch] + (float)sdyx : (float)sdyx;
    md[ch] = cuda_bn_f2{(float)(sdy / (double)m), (float)(sdyx / (double)m)};
  }
}

template <int V>
static __device__ __forceinline__ void cuda_bn_dx(const cuda_bn_geom &g, tt_dtype dt, const void *x, const void *dy,
                                                  void *dx, float mean, float invstd, float a, float mdy, float mdyx,
                                                  float beta_dx) {
  cuda_bn_walk(g, [&](size_t iv) {
    float xv[V], gv[V], ov[V];
    tt_cuda_ldv<V>(dt, x, iv, xv);
    tt_cuda_ldv<V>(dt, dy, iv, gv);
    if (beta_dx != 0.0f) tt_cuda_ldv<V>(dt, dx, iv, ov);
    for (int j = 0; j < V; j++) {
      float xh = (xv[j] - mean) * invstd;
      float v = a * (gv[j] - mdy - xh * mdyx);
      xv[j] = beta_dx != 0.0f ? v + beta_dx * ov[j] : v;
    }
    tt_cuda_stv<V>(dt, dx, iv, xv);
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_dx_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                      const void *dy, const float *gamma,
                                                                      const float *save_mean, const float *save_invstd,
                                                                      const cuda_bn_f2 *md, void *dx, float beta_dx) {
  __shared__ float sc[5];
  const int ch = blockIdx.x;
  if (threadIdx.x == 0) {
    cuda_bn_f2 d = md[ch];
    sc[0] = save_mean[ch], sc[1] = save_invstd[ch], sc[2] = gamma[ch] * save_invstd[ch], sc[3] = d.x, sc[4] = d.y;
  }
  __syncthreads();
  switch (g.v) {
    case 8: cuda_bn_dx<8>(g, dt, x, dy, dx, sc[0], sc[1], sc[2], sc[3], sc[4], beta_dx); break;
    case 4: cuda_bn_dx<4>(g, dt, x, dy, dx, sc[0], sc[1], sc[2], sc[3], sc[4], beta_dx); break;
    case 2: cuda_bn_dx<2>(g, dt, x, dy, dx, sc[0], sc[1], sc[2], sc[3], sc[4], beta_dx); break;
    default: cuda_bn_dx<1>(g, dt, x, dy, dx, sc[0], sc[1], sc[2], sc[3], sc[4], beta_dx); break;
  }
}

int tt_cuda_bn_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                   const float *save_mean, const float *save_invstd, void *dx, float *dgamma, float *dbias, float beta_dx,
                   float beta_param, void *ws, size_t ws_bytes) {
  const void *ptrs[3] = {x, dy, dx};
  cuda_bn_geom g;
  int splits;
  cuda_bn_f2 *md;
  if (cuda_norm_bn_check(b, "bn_bwd", n, c, hw, dt)) return -1;
  if (!x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_cuda_fail(b, "bn_bwd: NULL x, dy, gamma, save_mean or save_invstd");
  if (cuda_bn_ws_check(b, "bn_bwd", n, c, hw, dt, ws, ws_bytes)) return -1;
  g = cuda_bn_geometry(n, c, hw, dt, ptrs, 3);
  splits = cuda_bn_splits(g);
  md = (cuda_bn_f2 *)((char *)ws + (size_t)splits * c * 16);
  TT_LAUNCH(cuda_bn_bwd_stats_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x, dy,
            save_mean, save_invstd, (cuda_bn_d2 *)ws);
  CUDA_LAUNCH_CHECK(b, "bn_bwd");
  TT_LAUNCH(cuda_bn_bwd_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, splits,
            (const cuda_bn_d2 *)ws, dgamma, dbias, beta_param, md);
  CUDA_LAUNCH_CHECK(b, "bn_bwd");
  if (!dx) return 0;
  TT_LAUNCH(cuda_bn_dx_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, cuda_norm_stream(b), g, dt, x, dy, gamma,
            save_mean, save_invstd, (const cuda_bn_f2 *)md, dx, beta_dx);
  CUDA_LAUNCH_CHECK(b, "bn_bwd");
  return 0;
}

/* ----------------------------------- pooling ------------------------------------------ */

/* First maximum of window (oh, ow) of the plane at xoff (index into the plane); NaN wins. */
static __device__ __forceinline__ long long cuda_norm_argmax(tt_pool_desc d, tt_dtype dt, const void *x, size_t xoff,
                                                             int oh, int ow, float *best_out) {
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
      float v = tt_cuda_ld(dt, x, xoff + i);
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
    int ow = (int)(i % d.q), oh = (int)((i / d.q) % d.p);
    size_t pl = i / ((size_t)d.p * d.q), xoff = pl * d.h * d.w;
    float v;
    if (mode == TT_POOL_MAX) {
      cuda_norm_argmax(d, dt, x, xoff, oh, ow, &v);
    } else {
      int h0 = oh * d.stride_h - d.pad_h, w0 = ow * d.stride_w - d.pad_w;
      int h1 = h0 + d.kh, w1 = w0 + d.kw;
      float s = 0.0f;
      if (h0 < 0) h0 = 0;
      if (w0 < 0) w0 = 0;
      if (h1 > d.h) h1 = d.h;
      if (w1 > d.w) w1 = d.w;
      for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) s += tt_cuda_ld(dt, x, xoff + (size_t)ih * d.w + iw);
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
    int iw = (int)(i % d.w), ih = (int)((i / d.w) % d.h);
    size_t pl = i / ((size_t)d.h * d.w), xoff = pl * d.h * d.w, yoff = pl * d.p * d.q;
    long long me = (long long)ih * d.w + iw;
    int a = ih + d.pad_h - d.kh + 1, bq = iw + d.pad_w - d.kw + 1;
    int oh0 = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, oh1 = (ih + d.pad_h) / d.stride_h;
    int ow0 = bq <= 0 ? 0 : (bq + d.stride_w - 1) / d.stride_w, ow1 = (iw + d.pad_w) / d.stride_w;
    float acc = 0.0f, bv;
    if (oh1 > d.p - 1) oh1 = d.p - 1;
    if (ow1 > d.q - 1) ow1 = d.q - 1;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        float g = tt_cuda_ld(dt, dy, yoff + (size_t)oh * d.q + ow);
        if (mode == TT_POOL_MAX) {
          if (cuda_norm_argmax(d, dt, x, xoff, oh, ow, &bv) == me) acc += g;
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

int tt_cuda_pool_fwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, void *y,
                     void *ws, size_t ws_bytes) {
  if (cuda_norm_pool_check(b, "pool_fwd", d, mode, dt)) return -1;
  if (!x || !y) return tt_cuda_fail(b, "pool_fwd: NULL x or y");
  TT_LAUNCH(cuda_pool_fwd_k, tt_cuda_blocks((size_t)d->n * d->c * d->p * d->q), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
      *d, mode, dt, x, y);
  CUDA_LAUNCH_CHECK(b, "pool_fwd");
  return 0;
}

int tt_cuda_pool_bwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, const void *dy,
                     void *dx, float beta, void *ws, size_t ws_bytes) {
  if (cuda_norm_pool_check(b, "pool_bwd", d, mode, dt)) return -1;
  if ((mode == TT_POOL_MAX && !x) || !dy || !dx) return tt_cuda_fail(b, "pool_bwd: NULL x (max), dy or dx");
  unsigned blocks = tt_cuda_blocks((size_t)d->n * d->c * d->h * d->w);
  if (dt == TT_F16)
    TT_LAUNCH(cuda_pool_bwd_f16_k, blocks, TT_CUDA_THREADS, 0, cuda_norm_stream(b), *d, mode, x, dy, dx, beta);
  else if (dt == TT_BF16)
    TT_LAUNCH(cuda_pool_bwd_bf16_k, blocks, TT_CUDA_THREADS, 0, cuda_norm_stream(b), *d, mode, x, dy, dx, beta);
  else
    TT_LAUNCH(cuda_pool_bwd_f32_k, blocks, TT_CUDA_THREADS, 0, cuda_norm_stream(b), *d, mode, x, dy, dx, beta);
  CUDA_LAUNCH_CHECK(b, "pool_bwd");
  return 0;
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_argmax_k(tt_pool_desc d, tt_dtype dt, const void *x,
                                                                     uint8_t *idx) {
  size_t count = (size_t)d.n * d.c * d.p * d.q;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int ow = (int)(i % d.q), oh = (int)((i / d.q) % d.p);
    size_t pl = i / ((size_t)d.p * d.q), xoff = pl * d.h * d.w;
    float v;
    long long a = cuda_norm_argmax(d, dt, x, xoff, oh, ow, &v);
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
    int iw = (int)(i % d.w), ih = (int)((i / d.w) % d.h);
    size_t pl = i / ((size_t)d.h * d.w), yoff = pl * d.p * d.q;
    int a = ih + d.pad_h - d.kh + 1, bq = iw + d.pad_w - d.kw + 1;
    int oh0 = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, oh1 = (ih + d.pad_h) / d.stride_h;
    int ow0 = bq <= 0 ? 0 : (bq + d.stride_w - 1) / d.stride_w, ow1 = (iw + d.pad_w) / d.stride_w;
    float acc = 0.0f;
    if (oh1 > d.p - 1) oh1 = d.p - 1;
    if (ow1 > d.q - 1) ow1 = d.q - 1;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++) {
        size_t yi = yoff + (size_t)oh * d.q + ow;
        int me = (ih - (oh * d.stride_h - d.pad_h)) * d.kw + (iw - (ow * d.stride_w - d.pad_w));
        if (idx[yi] == me) acc += tt_cuda_ld(dt, dy, yi);
      }
    tt_cuda_st_beta(dt, dx, i, acc, beta);
  }
}

int tt_cuda_pool_argmax(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const void *x, uint8_t *idx) {
  if (cuda_norm_pool_check(b, "pool_argmax", d, TT_POOL_MAX, dt)) return -1;
  if (d->kh * d->kw > 256) return tt_cuda_fail(b, "pool_argmax: a %dx%d window has no uint8 index", d->kh, d->kw);
  if (!x || !idx) return tt_cuda_fail(b, "pool_argmax: NULL x or idx");
  TT_LAUNCH(cuda_pool_argmax_k, tt_cuda_blocks((size_t)d->n * d->c * d->p * d->q), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
      *d, dt, x, idx);
  CUDA_LAUNCH_CHECK(b, "pool_argmax");
  return 0;
}

int tt_cuda_pool_bwd_idx(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const uint8_t *idx, const void *dy, void *dx,
                         float beta) {
  if (cuda_norm_pool_check(b, "pool_bwd_idx", d, TT_POOL_MAX, dt)) return -1;
  if (!idx || !dy || !dx) return tt_cuda_fail(b, "pool_bwd_idx: NULL idx, dy or dx");
  TT_LAUNCH(cuda_pool_bwd_idx_k, tt_cuda_blocks((size_t)d->n * d->c * d->h * d->w), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
      *d, dt, idx, dy, dx, beta);
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
    TT_CUDA_KERNEL(cuda_pool_fwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_f32_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_f16_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_bf16_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_argmax_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_idx_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_gap_fwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_gap_bwd_k, TT_CUDA_THREADS),
};
const int tt_cuda_norm_nkernels = (int)(sizeof tt_cuda_norm_kernels / sizeof tt_cuda_norm_kernels[0]);
