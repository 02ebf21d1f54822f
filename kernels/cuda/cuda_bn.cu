/* kernels/cuda/cuda_bn.cu — batch norm as the backend's own kernels (not cuDNN), so that the
 * semantics are the CPU backend's exactly: normalisation with the biased batch variance, running_var
 * updated with the unbiased one (biased when there is one value per channel), running = (1-m)*running
 * + m*batch. Training forward and backward take a workspace (tt_cuda_bn_workspace); inference takes
 * none. The statistics are deterministic (fixed order throughout). Four forms: per channel (below),
 * on rows (hw == 1), flat (planes not whole 16-byte vectors) and held on chip (cuda_bn_chip.cu, tried
 * first by the training forward and the backward); their per-element arithmetic is cuda_bn.h's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_bn.h"

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
                                                    float mean, float invstd, float gm, float bb, int relu,
                                                    const void *s) {
  cuda_bn_walk(g, [&](size_t iv) {
    float v[V], sv[V] = {}; /* sv: bn_fwd_train_add_relu's shortcut, read before y is written */
    tt_cuda_ldv<V>(dt, x, iv, v);
    if (s) tt_cuda_ldv<V>(dt, s, iv, sv);
    for (int j = 0; j < V; j++) v[j] = cuda_bn_out(dt, cuda_bn_y(v[j], mean, invstd, gm, bb), relu, s != NULL, sv[j]);
    tt_cuda_stv<V>(dt, y, iv, v);
  });
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_norm_k(cuda_bn_geom g, tt_dtype dt, const void *x,
                                                                        const float *gamma, const float *bias,
                                                                        const float *mean_p, const float *stat_p,
                                                                        int infer, float eps, int relu, const void *s,
                                                                        void *y) {
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
      case 8: cuda_bn_norm<8>(g, dt, x, y, mean, invstd, gm, bb, relu, s); break;
      case 4: cuda_bn_norm<4>(g, dt, x, y, mean, invstd, gm, bb, relu, s); break;
      case 2: cuda_bn_norm<2>(g, dt, x, y, mean, invstd, gm, bb, relu, s); break;
      default: cuda_bn_norm<1>(g, dt, x, y, mean, invstd, gm, bb, relu, s); break;
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
                                                                             int infer, float eps, int relu, const void *s,
                                                                             void *y) {
  TT_CUDA_LOOP(i, count) {
    const int ch = (int)(i % (size_t)c);
    const float mean = mean_p[ch], invstd = infer ? (float)(1.0 / sqrt((double)stat_p[ch] + (double)eps)) : stat_p[ch];
    const float v = cuda_bn_y(tt_cuda_ld(dt, x, i), mean, invstd, gamma[ch], bias[ch]);
    tt_cuda_st(dt, y, i, cuda_bn_out(dt, v, relu, s != NULL, s ? tt_cuda_ld(dt, s, i) : 0.0f));
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

/* bn_apply's launches with the caller's op name in messages (below, beside the flat form) */
static int cuda_bn_apply_launch(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x,
                                const float *gamma, const float *bias, const float *save_mean, const float *save_invstd,
                                int relu, const void *s, void *y);

/* the training forward's statistics in the flat form (below), when it applies: 1 launched, 0 not, -1 failed */
static int cuda_bn_fwd_stats_flat(tt_backend *b, const char *op, const cuda_bn_geom &g, int n, int c, int hw, tt_dtype dt,
                                  const void *x, const void *y, float *running_mean, float *running_var, float momentum,
                                  float eps, float *save_mean, float *save_invstd, int update_running, void *ws);

/* bn_fwd_train, with relu the ReLU-fused form (backend.h bn_fwd_train_relu), with the shortcut s
 * the add-and-ReLU-fused one (bn_fwd_train_add_relu: cuda_bn_out); op names the entry point in
 * messages. The statistics take the form bn_fwd_train takes for x and y (s joins only the
 * normalisation's alignment), so they are its bits wherever s is as aligned as y (the arena's). */
static int cuda_bn_fwd_train(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x,
                             const float *gamma, const float *bias, void *y, float *running_mean, float *running_var,
                             float momentum, float eps, float *save_mean, float *save_invstd, int update_running, int relu,
                             const void *s, void *ws, size_t ws_bytes) {
  const void *ptrs[2] = {x, y};
  cuda_bn_geom g;
  int splits, chip;
  if (tt_cuda_planes_check(b, op, n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !y || !save_mean || !save_invstd)
    return tt_cuda_fail(b, "%s: NULL x, gamma, bias, y, save_mean or save_invstd", op);
  if (update_running && (!running_mean || !running_var))
    return tt_cuda_fail(b, "%s: update_running set but running_mean or running_var is NULL", op);
  if (cuda_bn_ws_check(b, op, n, c, hw, dt, ws, ws_bytes)) return -1;
  /* x held on chip where it fits: one read */
  if ((chip = tt_cuda_bn_chip_fwd(b, op, n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps,
                                  save_mean, save_invstd, update_running, relu, s)) != 0)
    return chip < 0 ? -1 : 0;
  g = cuda_bn_geometry(n, c, hw, dt, ptrs, 2);
  splits = cuda_bn_splits(g);
  if (hw == 1) { /* rows (an NHWC tensor): 16-byte vectors (cuda_bn_rows.cu) where c and x, y allow, else scalar */
    int rs = tt_cuda_bnr_stats(b, op, (size_t)n, c, dt, x, y, NULL, NULL, NULL, NULL, NULL, 0, ws, cuda_bn_max_splits(n, 1));
    if (rs < 0) return -1;
    if (rs == 0) {
      TT_LAUNCH(cuda_bn_rows_stats_k, cuda_bn_rows_grid(g), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, dt, x,
                (cuda_bn_d2 *)ws);
      CUDA_LAUNCH_CHECK(b, op);
      rs = splits;
    }
    TT_LAUNCH(cuda_bn_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, rs, dt, x,
              (const cuda_bn_d2 *)ws, running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running);
    CUDA_LAUNCH_CHECK(b, op);
    return cuda_bn_apply_launch(b, op, n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, relu, s, y);
  }
  switch (cuda_bn_fwd_stats_flat(b, op, g, n, c, hw, dt, x, y, running_mean, running_var, momentum, eps, save_mean,
                                 save_invstd, update_running, ws)) {
    case 1: break; /* the flat form's sums (planes not whole 16-byte vectors) */
    case -1: return -1;
    default:
      TT_LAUNCH(cuda_bn_stats_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, dt, x,
                (cuda_bn_d2 *)ws);
      CUDA_LAUNCH_CHECK(b, op);
      TT_LAUNCH(cuda_bn_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, splits, dt, x,
                (const cuda_bn_d2 *)ws, running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running);
      CUDA_LAUNCH_CHECK(b, op);
      break;
  }
  /* the normalisation as bn_apply does it from the statistics just written: the flat form
   * where the per-channel runs are not whole 16-byte vectors (7x7 and 14x14 planes), the same
   * per-element arithmetic either way */
  return cuda_bn_apply_launch(b, op, n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, relu, s, y);
}

int tt_cuda_bn_fwd_train(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                         const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                         float *save_mean, float *save_invstd, int update_running, void *ws, size_t ws_bytes) {
  return cuda_bn_fwd_train(b, "bn_fwd_train", n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps,
                           save_mean, save_invstd, update_running, 0, NULL, ws, ws_bytes);
}

/* backend.h's bn_fwd_train_relu: y = relu(bn(x)), the launches of bn_fwd_train with the ReLU in
 * the normalisation, bit for bit bn_fwd_train then act_fwd(RELU) on y. */
int tt_cuda_bn_fwd_train_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                              const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                              float eps, float *save_mean, float *save_invstd, int update_running, void *ws,
                              size_t ws_bytes) {
  return cuda_bn_fwd_train(b, "bn_fwd_train_relu", n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum,
                           eps, save_mean, save_invstd, update_running, 1, NULL, ws, ws_bytes);
}

/* backend.h's bn_fwd_train_add_relu: y = relu(bn(x) + s), bn_fwd_train's launches with the add and
 * the ReLU in the normalisation (cuda_bn_out: the unfused calls' roundings), s read where y is
 * written (y may be s). */
int tt_cuda_bn_fwd_train_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                                  const float *bias, const void *s, void *y, float *running_mean, float *running_var,
                                  float momentum, float eps, float *save_mean, float *save_invstd, int update_running,
                                  void *ws, size_t ws_bytes) {
  const size_t bytes = (size_t)(n > 0 ? n : 0) * (size_t)(c > 0 ? c : 0) * (size_t)(hw > 0 ? hw : 0) * tt_dtype_size(dt);
  if (!s) return tt_cuda_fail(b, "bn_fwd_train_add_relu: NULL s (the shortcut)");
  if (s != y && y && (uintptr_t)s < (uintptr_t)y + bytes && (uintptr_t)y < (uintptr_t)s + bytes)
    return tt_cuda_fail(b, "bn_fwd_train_add_relu: y overlaps s without being s");
  return cuda_bn_fwd_train(b, "bn_fwd_train_add_relu", n, c, hw, dt, x, gamma, bias, y, running_mean, running_var,
                           momentum, eps, save_mean, save_invstd, update_running, 0, s, ws, ws_bytes);
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
                                                     const float *rvar, float eps, int given, int relu, const void *s,
                                                     void *y, float (*sp)[CUDA_BNI_MAXP]) {
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
    float v[V], sv[V] = {}; /* sv: bn_fwd_train_add_relu's shortcut */
    tt_cuda_ldv<V>(dt, x, iv, v);
    if (s) tt_cuda_ldv<V>(dt, s, iv, sv);
    for (int q = 0; q < V; q++) {
      v[q] = cuda_bn_out(dt, cuda_bn_y(v[q], sp[0][j], sp[1][j], sp[2][j], sp[3][j]), relu, s != NULL, sv[q]);
      if (++k == hw) k = 0, j++;
    }
    tt_cuda_stv<V>(dt, y, iv, v);
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_infer_flat_k(size_t total_v, int hw, int c, tt_dtype dt,
                                                                              const void *x, const float *gamma,
                                                                              const float *bias, const float *rmean,
                                                                              const float *rvar, float eps, int given,
                                                                              int relu, const void *s, void *y) {
  __shared__ float sp[4][CUDA_BNI_MAXP];
  if (dt == TT_F32)
    cuda_bni_body<4>(total_v, hw, c, dt, x, gamma, bias, rmean, rvar, eps, given, relu, s, y, sp);
  else
    cuda_bni_body<8>(total_v, hw, c, dt, x, gamma, bias, rmean, rvar, eps, given, relu, s, y, sp);
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
                        int relu, const void *s, void *y) {
  const void *ptrs[3] = {x, y, s};
  const size_t vf = 16 / tt_dtype_size(dt), total = (size_t)n * c * hw;
  const size_t blocks = cuda_bn_flat_blocks(g, n, c, hw, dt, ptrs, s ? 3 : 2);
  if (!blocks) return 0;
  TT_LAUNCH(cuda_bn_infer_flat_k, (unsigned)blocks, TT_CUDA_THREADS, 0, tt_cuda_stream(b), total / vf, hw, c, dt, x, gamma,
            bias, rmean, rvar, eps, given, relu, s, y);
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
              tt_cuda_stream(b), fg, dt, x, dy, mean, invstd, gamma, bias, relu, (cuda_bn_d2 *)ws);
  else
    TT_LAUNCH(cuda_bn_stats_flat_k, dim3((unsigned)((c + fg.cg - 1) / fg.cg), (unsigned)splits), TT_CUDA_THREADS, 0,
              tt_cuda_stream(b), fg, dt, x, (cuda_bn_d2 *)ws);
  CUDA_LAUNCH_CHECK(b, op);
  return splits;
}

static int cuda_bn_fwd_stats_flat(tt_backend *b, const char *op, const cuda_bn_geom &g, int n, int c, int hw, tt_dtype dt,
                                  const void *x, const void *y, float *running_mean, float *running_var, float momentum,
                                  float eps, float *save_mean, float *save_invstd, int update_running, void *ws) {
  const void *ptrs[2] = {x, y};
  int splits = cuda_bn_stats_flat(b, op, g, n, c, hw, dt, ptrs, 2, x, NULL, NULL, NULL, NULL, NULL, 0, 0, ws);
  if (splits <= 0) return splits;
  TT_LAUNCH(cuda_bn_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, splits, dt, x,
            (const cuda_bn_d2 *)ws, running_mean, running_var, momentum, eps, save_mean, save_invstd, update_running);
  CUDA_LAUNCH_CHECK(b, op);
  return 1;
}

int tt_cuda_bn_fwd_infer(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                         const float *bias, const float *running_mean, const float *running_var, float eps, void *y,
                         void *ws, size_t ws_bytes) {
  const void *ptrs[2] = {x, y};
  cuda_bn_geom g;
  if (tt_cuda_planes_check(b, "bn_fwd_infer", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !running_mean || !running_var || !y)
    return tt_cuda_fail(b, "bn_fwd_infer: NULL x, gamma, bias, running_mean, running_var or y");
  g = cuda_bn_geometry(n, c, hw, dt, ptrs, 2);
  if (hw == 1) { /* rows: 16-byte vectors where c and x, y allow, else flat, channel i % c */
    switch (tt_cuda_bnr_norm(b, "bn_fwd_infer", (size_t)n, c, dt, x, gamma, bias, running_mean, running_var, 1, eps, 0,
                             NULL, y)) {
      case 1: return 0;
      case -1: return -1;
      default: break;
    }
    TT_LAUNCH(cuda_bn_rows_norm_k, tt_cuda_blocks((size_t)n * c), TT_CUDA_THREADS, 0, tt_cuda_stream(b), (size_t)n * c, c,
              dt, x, gamma, bias, running_mean, running_var, 1, eps, 0, (const void *)NULL, y);
    CUDA_LAUNCH_CHECK(b, "bn_fwd_infer");
    return 0;
  }
  switch (cuda_bn_flat(b, "bn_fwd_infer", g, n, c, hw, dt, x, gamma, bias, running_mean, running_var, eps, 0, 0, NULL, y)) {
    case 1: return 0; /* the flat form: 16-byte vectors across planes */
    case -1: return -1;
    default: break;
  }
  TT_LAUNCH(cuda_bn_norm_k, dim3((unsigned)c, (unsigned)cuda_bn_splits(g)), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, dt,
            x, gamma, bias, running_mean, running_var, 1, eps, 0, (const void *)NULL, y);
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
                                int relu, const void *s, void *y) {
  const void *ptrs[3] = {x, y, s};
  cuda_bn_geom g = cuda_bn_geometry(n, c, hw, dt, ptrs, s ? 3 : 2);
  if (hw == 1) { /* rows: bn_fwd_train's rows normalisation, the same kernel (16-byte vectors where they apply) */
    switch (tt_cuda_bnr_norm(b, op, (size_t)n, c, dt, x, gamma, bias, save_mean, save_invstd, 0, 0.0f, relu, s, y)) {
      case 1: return 0;
      case -1: return -1;
      default: break;
    }
    TT_LAUNCH(cuda_bn_rows_norm_k, tt_cuda_blocks((size_t)n * c), TT_CUDA_THREADS, 0, tt_cuda_stream(b), (size_t)n * c, c,
              dt, x, gamma, bias, save_mean, save_invstd, 0, 0.0f, relu, s, y);
    CUDA_LAUNCH_CHECK(b, op);
    return 0;
  }
  switch (cuda_bn_flat(b, op, g, n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, 0.0f, 1, relu, s, y)) {
    case 1: return 0;
    case -1: return -1;
    default: break;
  }
  TT_LAUNCH(cuda_bn_norm_k, dim3((unsigned)c, (unsigned)cuda_bn_splits(g)), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, dt, x,
            gamma, bias, save_mean, save_invstd, 0, 0.0f, relu, s, y);
  CUDA_LAUNCH_CHECK(b, op);
  return 0;
}

extern "C" int tt_cuda_bn_apply(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                                const float *bias, const float *save_mean, const float *save_invstd, void *y) {
  if (tt_cuda_planes_check(b, "bn_apply", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !save_mean || !save_invstd || !y)
    return tt_cuda_fail(b, "bn_apply: NULL x, gamma, bias, save_mean, save_invstd or y");
  return cuda_bn_apply_launch(b, "bn_apply", n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, 0, NULL, y);
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
  int splits, chip;
  cuda_bn_f2 *md;
  if (tt_cuda_planes_check(b, op, n, c, hw, dt)) return -1;
  if (!x || !dy || !gamma || !save_mean || !save_invstd || (relu && !bias))
    return tt_cuda_fail(b, "%s: NULL x, dy, gamma, %ssave_mean or save_invstd", op, relu ? "bias, " : "");
  if (cuda_bn_ws_check(b, op, n, c, hw, dt, ws, ws_bytes)) return -1;
  /* x and dy held on chip where they fit: one read each */
  if ((chip = tt_cuda_bn_chip_bwd(b, op, n, c, hw, dt, x, dy, gamma, bias, relu, save_mean, save_invstd, dx, dgamma,
                                  dbias, beta_dx, beta_param)) != 0)
    return chip < 0 ? -1 : 0;
  g = cuda_bn_geometry(n, c, hw, dt, ptrs, 3);
  splits = cuda_bn_splits(g);
  md = (cuda_bn_f2 *)((char *)ws + cuda_bn_max_splits(n, hw) * c * 16); /* after any split count's partials */
  if (hw == 1) { /* rows (an NHWC tensor): 16-byte vectors (cuda_bn_rows.cu) where c and x, dy, dx allow, else scalar */
    int rs = tt_cuda_bnr_stats(b, op, (size_t)n, c, dt, x, dx, dy, save_mean, save_invstd, gamma, bias, relu, ws,
                               cuda_bn_max_splits(n, 1));
    if (rs < 0) return -1;
    if (rs == 0) {
      TT_LAUNCH(cuda_bn_rows_bwd_stats_k, cuda_bn_rows_grid(g), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, dt, x, dy,
                save_mean, save_invstd, gamma, bias, relu, (cuda_bn_d2 *)ws);
      CUDA_LAUNCH_CHECK(b, op);
      rs = splits;
    }
    TT_LAUNCH(cuda_bn_bwd_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, rs,
              (const cuda_bn_d2 *)ws, dgamma, dbias, beta_param, md);
    CUDA_LAUNCH_CHECK(b, op);
    if (!dx) return 0;
    switch (tt_cuda_bnr_dx(b, op, (size_t)n, c, dt, x, dy, gamma, save_mean, save_invstd, md, bias, relu, dx, beta_dx)) {
      case 1: return 0;
      case -1: return -1;
      default: break;
    }
    TT_LAUNCH(cuda_bn_rows_dx_k, tt_cuda_blocks((size_t)n * c), TT_CUDA_THREADS, 0, tt_cuda_stream(b), (size_t)n * c, c, dt,
              x, dy, gamma, save_mean, save_invstd, (const cuda_bn_f2 *)md, bias, relu, dx, beta_dx);
    CUDA_LAUNCH_CHECK(b, op);
    return 0;
  }
  switch (int fs = cuda_bn_stats_flat(b, op, g, n, c, hw, dt, ptrs, 3, x, dy, save_mean, save_invstd, gamma, bias, relu, 1,
                                      ws)) {
    case -1: return -1;
    case 0:
      TT_LAUNCH(cuda_bn_bwd_stats_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, dt, x,
                dy, save_mean, save_invstd, gamma, bias, relu, (cuda_bn_d2 *)ws);
      CUDA_LAUNCH_CHECK(b, op);
      TT_LAUNCH(cuda_bn_bwd_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, splits,
                (const cuda_bn_d2 *)ws, dgamma, dbias, beta_param, md);
      CUDA_LAUNCH_CHECK(b, op);
      break;
    default: /* the flat form's sums, fs splits of them */
      TT_LAUNCH(cuda_bn_bwd_final_k, tt_cuda_blocks((size_t)c), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, fs,
                (const cuda_bn_d2 *)ws, dgamma, dbias, beta_param, md);
      CUDA_LAUNCH_CHECK(b, op);
      break;
  }
  if (!dx) return 0;
  {
    const size_t vf = 16 / tt_dtype_size(dt), total = (size_t)n * c * hw;
    const size_t blocks = cuda_bn_flat_blocks(g, n, c, hw, dt, ptrs, 3); /* x, dy, dx */
    if (blocks) {
      TT_LAUNCH(cuda_bn_dx_flat_k, (unsigned)blocks, TT_CUDA_THREADS, 0, tt_cuda_stream(b), total / vf, hw, c, dt, x, dy,
                gamma, save_mean, save_invstd, (const cuda_bn_f2 *)md, bias, relu, dx, beta_dx);
      CUDA_LAUNCH_CHECK(b, op);
      return 0;
    }
  }
  TT_LAUNCH(cuda_bn_dx_k, dim3((unsigned)c, (unsigned)splits), TT_CUDA_THREADS, 0, tt_cuda_stream(b), g, dt, x, dy, gamma,
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

/* backend.h's bn_bwd_add_relu: the ReLU's backward and the add's routing in one elementwise pass
 * (tt_cuda_relu_route: ds written, dy masked in place, which the contract allows), then bn_bwd's
 * own launches on the masked dy: bit for bit act_bwd(RELU), accumulate and bn_bwd. */
int tt_cuda_bn_bwd_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *y,
                            const uint32_t *mask, void *dy, const float *gamma, const float *save_mean,
                            const float *save_invstd, void *dx, void *ds, float *dgamma, float *dbias, float beta_dx,
                            float beta_s, float beta_param, void *ws, size_t ws_bytes) {
  if (tt_cuda_planes_check(b, "bn_bwd_add_relu", n, c, hw, dt)) return -1;
  if (tt_cuda_relu_route(b, (size_t)n * c * hw, dt, mask ? NULL : y, mask, dy, ds, beta_s)) return -1;
  return cuda_bn_bwd(b, "bn_bwd_add_relu", n, c, hw, dt, x, dy, gamma, NULL, 0, save_mean, save_invstd, dx, dgamma, dbias,
                     beta_dx, beta_param, ws, ws_bytes);
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(bn, TT_CUDA_KERNEL(cuda_bn_stats_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_bn_final_k, TT_CUDA_THREADS), TT_CUDA_KERNEL(cuda_bn_norm_k, TT_CUDA_THREADS),
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
                     TT_CUDA_KERNEL(cuda_bn_rows_dx_k, TT_CUDA_THREADS));
