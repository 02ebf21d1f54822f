/* kernels/cuda/cuda_elementwise.cu — the backend's own elementwise kernels: activations,
 * add, accumulate, dropout (the CPU backend's counter hash, bit for bit), channel copy,
 * cast, input normalisation, and the bias add / bias gradient helpers that conv and linear
 * share.
 *
 * Elementwise kernels are grid-stride loops, one element per iteration (add, accumulate and cast:
 * one vector of up to 16 bytes per iteration where the pointers are aligned, the tail element by
 * element; the bias add a 2-D grid of planes x positions), computing in fp32
 * exactly the expression the CPU backend computes (so results agree to rounding: nvcc may
 * contract a*b+c into an fma). Reductions run in one block per output with a fixed-order
 * tree, so they are deterministic.
 */
#include <math.h>

#include "cuda_internal.h"

static int cuda_ew_dt(tt_backend *b, const char *op, tt_dtype dt) {
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "%s: unknown dtype %d (the CUDA backend computes fp32, fp16 and bf16)", op, (int)dt);
  return 0;
}

/* The checks of save_compress and save_restore: the dtype and a known save format. */
static int cuda_ew_save_check(tt_backend *b, const char *op, int f, tt_dtype dt) {
  if (cuda_ew_dt(b, op, dt)) return -1;
  if (f < TT_SAVE_FP16 || f > TT_SAVE_INT8) return tt_cuda_fail(b, "%s: unknown format %d", op, f);
  return 0;
}

/* ------------------------------------ helpers ----------------------------------------- */

/* 2-D grid: y strides the planes (n*c), x the plane; the channel once per plane, no division per
 * element. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_add_bias_k(size_t planes, size_t hw, int c, tt_dtype dt,
                                                                     const void *bias, void *y) {
  for (size_t pl = blockIdx.y; pl < planes; pl += gridDim.y) {
    float bv = tt_cuda_ld(dt, bias, pl % (size_t)c);
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < hw; k += (size_t)blockDim.x * gridDim.x)
      tt_cuda_st(dt, y, pl * hw + k, tt_cuda_ld(dt, y, pl * hw + k) + bv);
  }
}

/* hw == 1 (an NHWC tensor as [n*h*w, c, 1]: channels fastest): flat over the elements, the
 * channel i % c; the plane kernel would run one element per 256-thread block there. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_add_bias_rows_k(size_t count, int c, tt_dtype dt,
                                                                          const void *bias, void *y) {
  TT_CUDA_LOOP(i, count) tt_cuda_st(dt, y, i, tt_cuda_ld(dt, y, i) + tt_cuda_ld(dt, bias, i % (size_t)c));
}

int tt_cuda_add_bias(tt_backend *b, const char *op, int n, int c, size_t hw, tt_dtype dt, const void *bias, void *y) {
  size_t planes = (size_t)n * c, gx = (hw + TT_CUDA_THREADS - 1) / TT_CUDA_THREADS, gy = planes;
  if (!planes || !hw) return 0;
  if (hw == 1) {
    TT_LAUNCH(cuda_ew_add_bias_rows_k, tt_cuda_blocks(planes), TT_CUDA_THREADS, 0, tt_cuda_stream(b), planes, c, dt, bias,
              y);
    CUDA_LAUNCH_CHECK(b, op);
    return 0;
  }
  if (gx > 1024) gx = 1024;
  if (gy > 65535) gy = 65535;
  TT_LAUNCH(cuda_ew_add_bias_k, dim3((unsigned)gx, (unsigned)gy), TT_CUDA_THREADS, 0, tt_cuda_stream(b), planes, hw, c, dt,
            bias, y);
  CUDA_LAUNCH_CHECK(b, op);
  return 0;
}

/* One block per channel. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_channel_sum_k(int n, int c, size_t hw, tt_dtype dt,
                                                                        const void *t, float *out, float beta) {
  __shared__ double sh[33];
  int ch = blockIdx.x;
  size_t m = (size_t)n * hw;
  float part = 0.0f;
  for (size_t idx = threadIdx.x; idx < m; idx += blockDim.x) {
    size_t s = idx / hw, k = idx - s * hw;
    part += tt_cuda_ld(dt, t, (s * c + ch) * hw + k);
  }
  double tot = tt_cuda_block_sum((double)part, sh);
  if (threadIdx.x == 0) out[ch] = beta != 0.0f ? beta * out[ch] + (float)tot : (float)tot;
}

int tt_cuda_channel_sum(tt_backend *b, const char *op, int n, int c, size_t hw, tt_dtype dt, const void *t, float *out,
                        float beta) {
  if (c <= 0) return 0;
  TT_LAUNCH(cuda_ew_channel_sum_k, c, TT_CUDA_THREADS, 0, tt_cuda_stream(b), n, c, hw, dt, t, out, beta);
  CUDA_LAUNCH_CHECK(b, op);
  return 0;
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_accum_f32_k(size_t count, tt_dtype dt, const void *x,
                                                                      float *y, float beta) {
  TT_CUDA_LOOP(i, count) {
    float v = tt_cuda_ld(dt, x, i);
    y[i] = beta != 0.0f ? beta * y[i] + v : v;
  }
}

int tt_cuda_accum_to_f32(tt_backend *b, const char *op, size_t count, tt_dtype dt, const void *x, float *y, float beta) {
  if (!count) return 0;
  TT_LAUNCH(cuda_ew_accum_f32_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, dt, x, y, beta);
  CUDA_LAUNCH_CHECK(b, op);
  return 0;
}

/* ------------------------------ inner transposes (conv) ------------------------------- */

/* src [outer, m, n] (sdt) -> dst [outer, n, m]: a 32 x 32 tile through shared memory, so the
 * read runs along src's n and the write along dst's m, both contiguous. Grid (n tiles, m tiles,
 * outer, strided when outer > 65535); 256 threads, 8 rows each pass. dst is ddt; with
 * ddt == TT_F32 and beta != 0 it accumulates (dst = beta * dst + v), else it is overwritten. The
 * convolutions' layout changes (cuda_conv.cu): a filter [k, c, rs] <-> [k, rs, c], a gradient
 * [n, k, pq] <-> [n, pq, k]. Values pass through fp32, exact for all three dtypes. */
#define CUDA_EW_TT 32
template <tt_dtype S, tt_dtype D, int ACC>
static __device__ __forceinline__ void cuda_ew_transpose_v(int outer, int m, int n, const void *src, void *dst, float beta,
                                                           float (*tile)[CUDA_EW_TT + 1]) {
  const int tx = threadIdx.x % CUDA_EW_TT, ty = threadIdx.x / CUDA_EW_TT;
  const int j0 = blockIdx.x * CUDA_EW_TT, i0 = blockIdx.y * CUDA_EW_TT;
  for (int o = blockIdx.z; o < outer; o += gridDim.z) {
    const size_t base = (size_t)o * m * n;
    for (int r = ty; r < CUDA_EW_TT; r += 256 / CUDA_EW_TT) {
      int i = i0 + r, j = j0 + tx;
      tile[r][tx] = (i < m && j < n) ? tt_cuda_ld(S, src, base + (size_t)i * n + j) : 0.0f;
    }
    __syncthreads();
    for (int r = ty; r < CUDA_EW_TT; r += 256 / CUDA_EW_TT) {
      int j = j0 + r, i = i0 + tx;
      if (i < m && j < n) {
        size_t at = base + (size_t)j * m + i;
        float v = tile[tx][r];
        if (ACC) v += beta * ((float *)dst)[at];
        tt_cuda_st(D, dst, at, v);
      }
    }
    __syncthreads(); /* the tile is reused for the next o */
  }
}
/* mode: 0 sdt -> sdt, 1 sdt -> fp32 overwriting, 2 sdt -> fp32 accumulating (beta); each branch
 * typed (no dtype test per element; untyped, it spilled on sm_90) */
static __global__ void TT_LAUNCH_BOUNDS(256) cuda_ew_transpose_k(int outer, int m, int n, tt_dtype sdt, int mode,
                                                                 const void *src, void *dst, float beta) {
  __shared__ float tile[CUDA_EW_TT][CUDA_EW_TT + 1]; /* [row of m][column of n] */
#define CUDA_EW_TR(S)                                                                        \
  if (sdt == (S)) {                                                                          \
    if (mode == 0) cuda_ew_transpose_v<(S), (S), 0>(outer, m, n, src, dst, beta, tile);      \
    else if (mode == 1) cuda_ew_transpose_v<(S), TT_F32, 0>(outer, m, n, src, dst, beta, tile); \
    else cuda_ew_transpose_v<(S), TT_F32, 1>(outer, m, n, src, dst, beta, tile);             \
    return;                                                                                  \
  }
  CUDA_EW_TR(TT_F32)
  CUDA_EW_TR(TT_F16)
  CUDA_EW_TR(TT_BF16)
#undef CUDA_EW_TR
}

int tt_cuda_transpose(tt_backend *b, const char *op, int outer, int m, int n, tt_dtype sdt, const void *src, tt_dtype ddt,
                      void *dst, float beta) {
  int mode = ddt == sdt && beta == 0.0f ? 0 : ddt == TT_F32 ? (beta != 0.0f ? 2 : 1) : -1;
  if (outer <= 0 || m <= 0 || n <= 0) return 0;
  if (!src || !dst) return tt_cuda_fail(b, "%s: transpose: NULL src or dst", op);
  if (cuda_ew_dt(b, op, sdt)) return -1;
  if (mode < 0)
    return tt_cuda_fail(b, "%s: transpose %s -> %s (beta %g): a dtype into itself, or into fp32 (accumulating with beta)",
                        op, tt_cuda_dtype_name(sdt), tt_cuda_dtype_name(ddt), (double)beta);
  dim3 grid((unsigned)((n + CUDA_EW_TT - 1) / CUDA_EW_TT), (unsigned)((m + CUDA_EW_TT - 1) / CUDA_EW_TT),
            (unsigned)(outer < 65535 ? outer : 65535));
  if (grid.y > 65535u) return tt_cuda_fail(b, "%s: transpose: %d rows is over the grid's limit", op, m);
  TT_LAUNCH(cuda_ew_transpose_k, grid, 256, 0, tt_cuda_stream(b), outer, m, n, sdt, mode, src, dst, beta);
  CUDA_LAUNCH_CHECK(b, op);
  return 0;
}

/* ---------------------------------- activations --------------------------------------- */

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_act_fwd_k(tt_act a, size_t count, tt_dtype dt, const void *x,
                                                                    void *y) {
  TT_CUDA_LOOP(i, count) tt_cuda_st(dt, y, i, tt_act_value(a, tt_cuda_ld(dt, x, i)));
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_act_bwd_k(tt_act a, size_t count, tt_dtype dt,
                                                                    const void *saved, const void *dy, void *dx,
                                                                    float beta) {
  TT_CUDA_LOOP(i, count) {
    float v = tt_act_grad(a, tt_cuda_ld(dt, saved, i), tt_cuda_ld(dt, dy, i));
    tt_cuda_st_beta(dt, dx, i, v, beta);
  }
}

int tt_cuda_act_fwd(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *x, void *y) {
  if (cuda_ew_dt(b, "act_fwd", dt)) return -1;
  if ((unsigned)a > (unsigned)TT_ACT_GELU_TANH)
    return tt_cuda_fail(b, "act_fwd: unknown activation %d", (int)a);
  if (!count) return 0;
  if (!x || !y) return tt_cuda_fail(b, "act_fwd: NULL x or y");
  TT_LAUNCH(cuda_ew_act_fwd_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), a, count, dt, x, y);
  CUDA_LAUNCH_CHECK(b, "act_fwd");
  return 0;
}

int tt_cuda_act_bwd(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *saved, const void *dy, void *dx,
                    float beta) {
  if (cuda_ew_dt(b, "act_bwd", dt)) return -1;
  if ((unsigned)a > (unsigned)TT_ACT_GELU_TANH)
    return tt_cuda_fail(b, "act_bwd: unknown activation %d", (int)a);
  if (!count) return 0;
  if (!saved || !dy || !dx) return tt_cuda_fail(b, "act_bwd: NULL saved, dy or dx");
  if (dx == dy && beta != 0.0f)
    return tt_cuda_fail(b, "act_bwd: dx may alias dy only when beta == 0 (beta=%g)", (double)beta);
  TT_LAUNCH(cuda_ew_act_bwd_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), a, count, dt, saved, dy, dx, beta);
  CUDA_LAUNCH_CHECK(b, "act_bwd");
  return 0;
}

/* One thread per uint32 word of the mask (32 elements), so no two threads share a word. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_act_mask_k(tt_act a, size_t count, tt_dtype dt,
                                                                     const void *y, uint32_t *mask) {
  size_t nw = (count + 31u) / 32u;
  TT_CUDA_LOOP(wi, nw) {
    size_t i0 = wi * 32u, i1 = i0 + 32u < count ? i0 + 32u : count;
    uint32_t m = 0;
    for (size_t i = i0; i < i1; i++)
      if (tt_act_grad(a, tt_cuda_ld(dt, y, i), 1.0f) != 0.0f) m |= 1u << (i - i0);
    mask[wi] = m;
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_act_bwd_mask_k(size_t count, tt_dtype dt,
                                                                         const uint32_t *mask, const void *dy, void *dx,
                                                                         float beta) {
  TT_CUDA_LOOP(i, count) {
    float g = tt_cuda_ld(dt, dy, i);
    tt_cuda_st_beta(dt, dx, i, ((mask[i >> 5] >> (i & 31u)) & 1u) ? g : 0.0f, beta);
  }
}

int tt_cuda_act_mask(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *y, uint32_t *mask) {
  if (cuda_ew_dt(b, "act_mask", dt)) return -1;
  if (a != TT_ACT_RELU && a != TT_ACT_RELU6) return tt_cuda_fail(b, "act_mask: activation %d has no mask form", (int)a);
  if (!count) return 0;
  if (!y || !mask) return tt_cuda_fail(b, "act_mask: NULL y or mask");
  size_t nw = (count + 31u) / 32u;
  TT_LAUNCH(cuda_ew_act_mask_k, tt_cuda_blocks(nw), TT_CUDA_THREADS, 0, tt_cuda_stream(b), a, count, dt, y, mask);
  CUDA_LAUNCH_CHECK(b, "act_mask");
  return 0;
}

int tt_cuda_act_bwd_mask(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const uint32_t *mask, const void *dy,
                         void *dx, float beta) {
  if (cuda_ew_dt(b, "act_bwd_mask", dt)) return -1;
  if (a != TT_ACT_RELU && a != TT_ACT_RELU6) return tt_cuda_fail(b, "act_bwd_mask: activation %d has no mask form", (int)a);
  if (!count) return 0;
  if (!mask || !dy || !dx) return tt_cuda_fail(b, "act_bwd_mask: NULL mask, dy or dx");
  if (dx == dy && beta != 0.0f)
    return tt_cuda_fail(b, "act_bwd_mask: dx may alias dy only when beta == 0 (beta=%g)", (double)beta);
  TT_LAUNCH(cuda_ew_act_bwd_mask_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, dt, mask, dy, dx,
            beta);
  CUDA_LAUNCH_CHECK(b, "act_bwd_mask");
  return 0;
}

/* tt_cuda_relu_route (cuda_internal.h): one thread an element; each element's dy read before its
 * ds and dy are written, so ds may be dy. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_relu_route_k(size_t count, tt_dtype dt, const void *y,
                                                                        const uint32_t *mask, void *dy, void *ds,
                                                                        float beta_s) {
  TT_CUDA_LOOP(i, count) {
    const float d = tt_cuda_ld(dt, dy, i);
    const int pass = mask ? (int)((mask[i >> 5] >> (i & 31u)) & 1u) : tt_cuda_ld(dt, y, i) > 0.0f;
    const float g = pass ? d : 0.0f;
    if (ds) tt_cuda_st_beta(dt, ds, i, g, beta_s);
    if (ds != dy) tt_cuda_st(dt, dy, i, g);
  }
}

int tt_cuda_relu_route(tt_backend *b, size_t count, tt_dtype dt, const void *y, const uint32_t *mask, void *dy, void *ds,
                       float beta_s) {
  if (cuda_ew_dt(b, "bn_bwd_add_relu", dt)) return -1;
  if (count && (!dy || (!y && !mask)))
    return tt_cuda_fail(b, "bn_bwd_add_relu: NULL dy, or NULL y and mask (the ReLU's output or its mask is needed)");
  if (ds && ds == dy && beta_s != 0.0f)
    return tt_cuda_fail(b, "bn_bwd_add_relu: ds may be dy only when beta_s == 0 (beta_s=%g)", (double)beta_s);
  if (!count) return 0;
  TT_LAUNCH(cuda_ew_relu_route_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, dt, y, mask, dy, ds,
            beta_s);
  CUDA_LAUNCH_CHECK(b, "bn_bwd_add_relu");
  return 0;
}

/* ------------------------- lossy saved copies (backend.h) ----------------------------- */

static __device__ uint16_t cuda_ew_f2bf(float v) {
  uint32_t u = __float_as_uint(v);
  if (v != v) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_save16_k(size_t count, int f, tt_dtype dt, const void *x,
                                                                   uint16_t *o) {
  TT_CUDA_LOOP(i, count) {
    float v = tt_cuda_ld(dt, x, i);
    if (f == TT_SAVE_FP16) tt_cuda_st(TT_F16, o, i, v);
    else o[i] = cuda_ew_f2bf(v);
  }
}

/* One block per channel: max |x| over (n, hw) by a fixed-order tree, then the int8 values. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_save8_k(int n, int c, int hw, tt_dtype dt, const void *x,
                                                                  int8_t *q, float *scale) {
  __shared__ float sh[TT_CUDA_THREADS];
  int ch = blockIdx.x;
  size_t m = (size_t)n * hw;
  float mx = 0.0f;
  for (size_t idx = threadIdx.x; idx < m; idx += blockDim.x) {
    size_t s = idx / hw, k = idx - s * hw;
    float a = fabsf(tt_cuda_ld(dt, x, (s * c + ch) * hw + k));
    if (a > mx) mx = a;
  }
  sh[threadIdx.x] = mx;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o && sh[threadIdx.x + o] > sh[threadIdx.x]) sh[threadIdx.x] = sh[threadIdx.x + o];
    __syncthreads();
  }
  mx = sh[0];
  float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
  if (threadIdx.x == 0) scale[ch] = mx / 127.0f;
  for (size_t idx = threadIdx.x; idx < m; idx += blockDim.x) {
    size_t s = idx / hw, k = idx - s * hw, i = (s * c + ch) * hw + k;
    float r = rintf(tt_cuda_ld(dt, x, i) * inv);
    q[i] = (int8_t)(r > 127.0f ? 127 : (r < -127.0f ? -127 : (r == r ? (int)r : 0)));
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_restore_k(size_t count, int f, int c, int hw, tt_dtype dt,
                                                                    const void *src, const float *scale, void *x) {
  TT_CUDA_LOOP(i, count) {
    float v;
    if (f == TT_SAVE_FP16) v = tt_cuda_ld(TT_F16, src, i);
    else if (f == TT_SAVE_BF16) v = __uint_as_float((uint32_t)((const uint16_t *)src)[i] << 16);
    else v = (float)((const int8_t *)src)[i] * scale[(i / (size_t)hw) % (size_t)c];
    tt_cuda_st(dt, x, i, v);
  }
}

int tt_cuda_save_compress(tt_backend *b, int f, int n, int c, int hw, tt_dtype dt, const void *x, void *dst) {
  size_t count = (size_t)n * c * hw;
  if (cuda_ew_save_check(b, "save_compress", f, dt)) return -1;
  if (!count) return 0;
  if (!x || !dst) return tt_cuda_fail(b, "save_compress: NULL x or dst");
  if (f != TT_SAVE_INT8) {
    TT_LAUNCH(cuda_ew_save16_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, f, dt, x, (uint16_t *)dst);
  } else {
    float *scale = (float *)((char *)dst + (count + 3u) / 4u * 4u);
    TT_LAUNCH(cuda_ew_save8_k, c, TT_CUDA_THREADS, 0, tt_cuda_stream(b), n, c, hw, dt, x, (int8_t *)dst, scale);
  }
  CUDA_LAUNCH_CHECK(b, "save_compress");
  return 0;
}

int tt_cuda_save_restore(tt_backend *b, int f, int n, int c, int hw, tt_dtype dt, const void *src, void *x) {
  size_t count = (size_t)n * c * hw;
  if (cuda_ew_save_check(b, "save_restore", f, dt)) return -1;
  if (!count) return 0;
  if (!x || !src) return tt_cuda_fail(b, "save_restore: NULL src or x");
  const float *scale = (const float *)((const char *)src + (count + 3u) / 4u * 4u);
  TT_LAUNCH(cuda_ew_restore_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, f, c, hw, dt, src, scale, x);
  CUDA_LAUNCH_CHECK(b, "save_restore");
  return 0;
}

/* ------------------------------- add / accumulate ------------------------------------- */

/* Vectorised element-wise loops: the count / V whole vectors (one 16-byte access each where the
 * pointers allow), then the tail element by element; v is the host's tt_cuda_vec_width. */
template <int V>
static __device__ __forceinline__ void cuda_ew_add_v(size_t count, tt_dtype dt, const void *a, const void *b2, void *y) {
  const size_t nv = count / V;
  TT_CUDA_LOOP(i, nv) {
    float x[V], z[V];
    tt_cuda_ldv<V>(dt, a, i, x);
    tt_cuda_ldv<V>(dt, b2, i, z);
    TT_UNROLL
    for (int j = 0; j < V; j++) x[j] += z[j];
    tt_cuda_stv<V>(dt, y, i, x);
  }
  for (size_t i = nv * V + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x)
    tt_cuda_st(dt, y, i, tt_cuda_ld(dt, a, i) + tt_cuda_ld(dt, b2, i));
}

/* dt a constant (TT_CUDA_BY_DTYPE); 8-element vectors are 16-bit dtypes' only */
static __device__ __forceinline__ void cuda_ew_add_dt(tt_dtype dt, size_t count, int v, const void *a, const void *b2,
                                                      void *y) {
  switch (v) {
    case 8:
      if (dt != TT_F32) cuda_ew_add_v<8>(count, dt, a, b2, y);
      break;
    case 4: cuda_ew_add_v<4>(count, dt, a, b2, y); break;
    case 2: cuda_ew_add_v<2>(count, dt, a, b2, y); break;
    default: cuda_ew_add_v<1>(count, dt, a, b2, y); break;
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_add_k(size_t count, tt_dtype dt, int v, const void *a,
                                                                const void *b2, void *y) {
  TT_CUDA_BY_DTYPE(dt, cuda_ew_add_dt, count, v, a, b2, y);
}

int tt_cuda_add(tt_backend *b, size_t count, tt_dtype dt, const void *a, const void *b2, void *y) {
  if (cuda_ew_dt(b, "add", dt)) return -1;
  if (!count) return 0;
  if (!a || !b2 || !y) return tt_cuda_fail(b, "add: NULL a, b2 or y");
  const void *ptrs[3] = {a, b2, y};
  int v = tt_cuda_vec_width(tt_dtype_size(dt), ptrs, 3);
  TT_LAUNCH(cuda_ew_add_k, tt_cuda_blocks(count / (size_t)v), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, dt, v, a, b2, y);
  CUDA_LAUNCH_CHECK(b, "add");
  return 0;
}

template <int V>
static __device__ __forceinline__ void cuda_ew_accumulate_v(size_t count, tt_dtype dt, const void *x, void *y, float beta) {
  const size_t nv = count / V;
  TT_CUDA_LOOP(i, nv) {
    float xv[V], yv[V];
    tt_cuda_ldv<V>(dt, x, i, xv);
    if (beta != 0.0f) {
      tt_cuda_ldv<V>(dt, y, i, yv);
      TT_UNROLL
      for (int j = 0; j < V; j++) xv[j] += beta * yv[j];
    }
    tt_cuda_stv<V>(dt, y, i, xv);
  }
  for (size_t i = nv * V + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x)
    tt_cuda_st_beta(dt, y, i, tt_cuda_ld(dt, x, i), beta);
}

/* dt tested at run time here (one dtype constant per path, as add does, spilled 24 bytes on sm_100) */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_accumulate_k(size_t count, tt_dtype dt, int v, const void *x,
                                                                       void *y, float beta) {
  switch (v) {
    case 8: cuda_ew_accumulate_v<8>(count, dt, x, y, beta); break;
    case 4: cuda_ew_accumulate_v<4>(count, dt, x, y, beta); break;
    case 2: cuda_ew_accumulate_v<2>(count, dt, x, y, beta); break;
    default: cuda_ew_accumulate_v<1>(count, dt, x, y, beta); break;
  }
}

int tt_cuda_accumulate(tt_backend *b, size_t count, tt_dtype dt, const void *x, void *y, float beta) {
  if (cuda_ew_dt(b, "accumulate", dt)) return -1;
  if (!count) return 0;
  if (!x || !y) return tt_cuda_fail(b, "accumulate: NULL x or y");
  const void *ptrs[2] = {x, y};
  int v = tt_cuda_vec_width(tt_dtype_size(dt), ptrs, 2);
  TT_LAUNCH(cuda_ew_accumulate_k, tt_cuda_blocks(count / (size_t)v), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, dt, v, x,
            y, beta);
  CUDA_LAUNCH_CHECK(b, "accumulate");
  return 0;
}

/* ------------------------------------ dropout ----------------------------------------- */

static int cuda_ew_dropout_params(tt_backend *b, const char *op, float p, uint32_t *thr, float *scale, int *all_drop) {
  if (!(p >= 0.0f && p <= 1.0f))
    return tt_cuda_fail(b, "%s: dropout probability %g is outside [0, 1]", op, (double)p);
  *all_drop = p >= 1.0f;
  *thr = *all_drop ? 0u : (uint32_t)((double)p * 4294967296.0);
  *scale = *all_drop ? 0.0f : 1.0f / (1.0f - p);
  return 0;
}

/* fwd 1: plain store; 0: the backward's beta store. base: NULL, or (recorded in a graph) the
 * device's graph_seed, seed then being the call's number (tt_cuda_seed). */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_dropout_k(size_t count, tt_dtype dt, uint32_t thr,
                                                                    float scale, int all_drop, uint64_t seed,
                                                                    const uint64_t *base, const void *x, void *y,
                                                                    float beta, int fwd) {
  seed = tt_cuda_seed(seed, base);
  TT_CUDA_LOOP(i, count) {
    int keep = !all_drop && (uint32_t)(tt_dropout_hash(seed, (uint64_t)i) >> 32) >= thr;
    float v = keep ? tt_cuda_ld(dt, x, i) * scale : 0.0f;
    if (fwd)
      tt_cuda_st(dt, y, i, v);
    else
      tt_cuda_st_beta(dt, y, i, v, beta);
  }
}

/* dropout_fwd (fwd 1: src x, dst y, beta 0) and dropout_bwd (fwd 0: src dy, dst dx): the same
 * checks and the one kernel, which draws the same mask from (seed, index) both ways; while the
 * stream is recorded, seed is the call's number and the kernel reads the base (backend.h). */
static int cuda_ew_dropout(tt_backend *b, const char *op, size_t count, tt_dtype dt, float p, uint64_t seed,
                           const void *src, void *dst, float beta, int fwd) {
  uint32_t thr = 0;
  float scale = 0.0f;
  int all_drop = 0;
  if (cuda_ew_dt(b, op, dt)) return -1;
  if (cuda_ew_dropout_params(b, op, p, &thr, &scale, &all_drop)) return -1;
  if (!count) return 0;
  if (!src || !dst) return tt_cuda_fail(b, "%s: NULL %s", op, fwd ? "x or y" : "dy or dx");
  if (dst == src && beta != 0.0f) return tt_cuda_fail(b, "%s: dx may alias dy only when beta == 0", op);
  const uint64_t *base = tt_cuda_st(b)->capturing ? tt_cuda_st(b)->graph_seed : (const uint64_t *)NULL; /* read at each replay */
  TT_LAUNCH(cuda_ew_dropout_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, dt, thr, scale, all_drop,
                                                                                       seed, base, src, dst, beta, fwd);
  CUDA_LAUNCH_CHECK(b, op);
  return 0;
}

int tt_cuda_dropout_fwd(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *x, void *y) {
  return cuda_ew_dropout(b, "dropout_fwd", count, dt, p, seed, x, y, 0.0f, 1);
}

int tt_cuda_dropout_bwd(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *dy, void *dx,
                        float beta) {
  return cuda_ew_dropout(b, "dropout_bwd", count, dt, p, seed, dy, dx, beta, 0);
}

/* --------------------------------- channel copy / cast -------------------------------- */

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_channel_copy_k(size_t count, int nc, size_t hw, tt_dtype dt,
                                                                         const void *src, int src_c, int src_off,
                                                                         void *dst, int dst_c, int dst_off,
                                                                         float beta) {
  TT_CUDA_LOOP(i, count) {
    size_t k = i % hw, t = i / hw;
    int ch = (int)(t % (size_t)nc);
    size_t s = t / (size_t)nc;
    size_t so = (s * src_c + src_off + ch) * hw + k, d0 = (s * dst_c + dst_off + ch) * hw + k;
    if (beta == 0.0f) { /* the bits as they are: fp16 and bf16 are both 2 bytes */
      if (dt == TT_F32)
        ((float *)dst)[d0] = ((const float *)src)[so];
      else
        ((unsigned short *)dst)[d0] = ((const unsigned short *)src)[so];
    } else {
      tt_cuda_st_beta(dt, dst, d0, tt_cuda_ld(dt, src, so), beta);
    }
  }
}

int tt_cuda_channel_copy(tt_backend *b, int n, int hw, tt_dtype dt, const void *src, int src_c, int src_off, void *dst,
                         int dst_c, int dst_off, int nc, float beta) {
  size_t count = (size_t)(n > 0 ? n : 0) * (nc > 0 ? nc : 0) * (hw > 0 ? hw : 0);
  if (cuda_ew_dt(b, "channel_copy", dt)) return -1;
  if (n < 0 || hw < 0 || nc < 0 || src_off < 0 || dst_off < 0 || src_off + nc > src_c || dst_off + nc > dst_c)
    return tt_cuda_fail(b,
                        "channel_copy: block [%d, %d+%d) does not fit src (%d channels) or [%d, %d+%d) dst (%d)",
                        src_off, src_off, nc, src_c, dst_off, dst_off, nc, dst_c);
  if (!count) return 0;
  if (!src || !dst) return tt_cuda_fail(b, "channel_copy: NULL src or dst");
  TT_LAUNCH(cuda_ew_channel_copy_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b),
      count, nc, (size_t)hw, dt, src, src_c, src_off, dst, dst_c, dst_off, beta);
  CUDA_LAUNCH_CHECK(b, "channel_copy");
  return 0;
}

template <int V>
static __device__ __forceinline__ void cuda_ew_cast_v(size_t count, tt_dtype sdt, const void *src, tt_dtype ddt, void *dst) {
  const size_t nv = count / V;
  TT_CUDA_LOOP(i, nv) {
    float x[V];
    tt_cuda_ldv<V>(sdt, src, i, x);
    tt_cuda_stv<V>(ddt, dst, i, x);
  }
  for (size_t i = nv * V + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x)
    tt_cuda_st(ddt, dst, i, tt_cuda_ld(sdt, src, i));
}

/* v: 4 (16 bytes of fp32, 8 of a 16-bit dtype) or 1. The six conversions between fp32, fp16 and
 * bf16; each goes through fp32, which holds every fp16 and bf16 value exactly, so the result is
 * rounded once (nearest even), as a direct conversion would be. */
static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_cast_k(size_t count, tt_dtype sdt, const void *src,
                                                                 tt_dtype ddt, void *dst, int v) {
  /* the dtypes as constants: each branch is typed, with no dtype test per vector */
#define CUDA_EW_CAST(S, D)                                         \
  if (sdt == (S) && ddt == (D)) {                                  \
    if (v == 4)                                                    \
      cuda_ew_cast_v<4>(count, (S), src, (D), dst);                \
    else                                                           \
      cuda_ew_cast_v<1>(count, (S), src, (D), dst);                \
    return;                                                        \
  }
  CUDA_EW_CAST(TT_F32, TT_F16)
  CUDA_EW_CAST(TT_F16, TT_F32)
  CUDA_EW_CAST(TT_F32, TT_BF16)
  CUDA_EW_CAST(TT_BF16, TT_F32)
  CUDA_EW_CAST(TT_F16, TT_BF16)
  CUDA_EW_CAST(TT_BF16, TT_F16)
#undef CUDA_EW_CAST
}

int tt_cuda_cast(tt_backend *b, size_t count, tt_dtype src_dt, const void *src, tt_dtype dst_dt, void *dst) {
  if (cuda_ew_dt(b, "cast", src_dt) || cuda_ew_dt(b, "cast", dst_dt)) return -1;
  if (!count) return 0;
  if (!src || !dst) return tt_cuda_fail(b, "cast: NULL src or dst");
  if (src_dt == dst_dt) {
    if (src != dst)
      CUDA_CHECK(b, cudaMemcpyAsync(dst, src, count * tt_dtype_size(src_dt), cudaMemcpyDeviceToDevice, tt_cuda_stream(b)));
    return 0;
  }
  if (src == dst)
    return tt_cuda_fail(b, "cast: %s -> %s cannot run in place", tt_cuda_dtype_name(src_dt), tt_cuda_dtype_name(dst_dt));
  const void *ptrs[2] = {src, dst};
  int v = tt_cuda_vec_width(4, ptrs, 2) == 4 ? 4 : 1; /* fp32's 16 bytes, or one element (a third variant
                                                           spilled on sm_100) */
  TT_LAUNCH(cuda_ew_cast_k, tt_cuda_blocks(count / (size_t)v), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, src_dt, src,
            dst_dt, dst, v);
  CUDA_LAUNCH_CHECK(b, "cast");
  return 0;
}

/* ------------------------------- many casts per launch -------------------------------- */

/* Up to CUDA_EW_CASTS tensors per launch (backend.h's cast_multi: the weight casts of a step;
 * a ResNet-50 has 55, a ViT-B/16 100), their pointers and sizes in a table passed by value as a
 * kernel parameter (4016 bytes + 12 of arguments, under the 4 KiB every architecture takes;
 * nothing allocated or uploaded). The flat index space is in
 * vectors of 4 elements: tensor s owns vectors [cumv[s], cumv[s+1]), ceil(count / 4) of them; a
 * thread's vector finds its tensor by binary search and converts 4 elements with one 16-byte fp32
 * access (8 bytes of a 16-bit dtype) where the launch's every pointer allows it (v4 != 0), else
 * element by element; a tensor's last partial vector goes element by element. Each value goes
 * through fp32 as cast does, so the bits are cast's. A KRSC segment (tt_cast_seg.rs > 1) is
 * indexed by its destination: the thread's 4 consecutive KRSC elements each read their KCRS source
 * (rs apart, element by element); rs == 1 (a 1x1 filter) is the same order both ways. */
#define CUDA_EW_CASTS 100
typedef struct cuda_ew_cast_table { /* 101*8 + 3*100*8 + 2*100*4 + 8 = 4016 bytes */
  unsigned long long cumv[CUDA_EW_CASTS + 1];
  const void *src[CUDA_EW_CASTS];
  void *dst[CUDA_EW_CASTS];
  unsigned long long count[CUDA_EW_CASTS];
  unsigned int cg[CUDA_EW_CASTS], rs[CUDA_EW_CASTS]; /* KRSC: channels per group and taps per filter; rs <= 1: plain */
  int n;
} cuda_ew_cast_table;
static_assert(sizeof(cuda_ew_cast_table) + 3 * sizeof(int) <= 4096, "cast_multi's table must fit the 4 KiB of kernel parameters");

template <int V>
static __device__ __forceinline__ void cuda_ew_cast_multi_v(const cuda_ew_cast_table &t, tt_dtype sdt, tt_dtype ddt) {
  TT_CUDA_LOOP(iv, (size_t)t.cumv[t.n]) {
    int lo = 0, hi = t.n - 1;
    while (lo < hi) { /* the last s with cumv[s] <= iv */
      int mid = (lo + hi + 1) >> 1;
      if (t.cumv[mid] <= iv) lo = mid;
      else hi = mid - 1;
    }
    size_t v = iv - (size_t)t.cumv[lo], e = v * 4, count = (size_t)t.count[lo];
    const size_t rs = t.rs[lo], cg = t.cg[lo];
    if (rs > 1) { /* dst [k, rs, cg] (KRSC) element d from src [k, cg, rs] (KCRS) */
      for (size_t d = e; d < e + 4 && d < count; d++) {
        size_t l = d % cg, q = d / cg, j = q % rs, i = q / rs;
        tt_cuda_st(ddt, t.dst[lo], d, tt_cuda_ld(sdt, t.src[lo], (i * cg + l) * rs + j));
      }
    } else if (V == 4 && e + 4 <= count) {
      float x[4];
      tt_cuda_ldv<4>(sdt, t.src[lo], v, x);
      tt_cuda_stv<4>(ddt, t.dst[lo], v, x);
    } else {
      for (size_t k = e; k < e + 4 && k < count; k++) tt_cuda_st(ddt, t.dst[lo], k, tt_cuda_ld(sdt, t.src[lo], k));
    }
  }
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_cast_multi_k(cuda_ew_cast_table t, tt_dtype sdt,
                                                                        tt_dtype ddt, int v4) {
#define CUDA_EW_CAST_M(S, D)                                       \
  if (sdt == (S) && ddt == (D)) {                                  \
    if (v4)                                                        \
      cuda_ew_cast_multi_v<4>(t, (S), (D));                        \
    else                                                           \
      cuda_ew_cast_multi_v<1>(t, (S), (D));                        \
    return;                                                        \
  }
  CUDA_EW_CAST_M(TT_F32, TT_F16)
  CUDA_EW_CAST_M(TT_F32, TT_BF16)
  CUDA_EW_CAST_M(TT_F16, TT_F32)
  CUDA_EW_CAST_M(TT_BF16, TT_F32)
  CUDA_EW_CAST_M(TT_F16, TT_BF16)
  CUDA_EW_CAST_M(TT_BF16, TT_F16)
#undef CUDA_EW_CAST_M
}

int tt_cuda_cast_multi(tt_backend *b, const tt_cast_seg *segs, int nseg, tt_dtype src_dt, tt_dtype dst_dt) {
  cuda_ew_cast_table t;
  int i = 0;
  if (cuda_ew_dt(b, "cast_multi", src_dt) || cuda_ew_dt(b, "cast_multi", dst_dt)) return -1;
  if (nseg < 0 || (nseg && !segs)) return tt_cuda_fail(b, "cast_multi: %d tensors at %p", nseg, (const void *)segs);
  for (i = 0; i < nseg; i++) { /* a KRSC segment's shape must be whole filters (backend.h tt_cast_seg) */
    const tt_cast_seg *sg = &segs[i];
    if (sg->rs < 0 || (sg->rs > 0 && (sg->k <= 0 || sg->count % ((size_t)sg->k * (size_t)sg->rs) ||
                                      sg->count / ((size_t)sg->k * (size_t)sg->rs) > 0x7fffffffu)))
      return tt_cuda_fail(b, "cast_multi: tensor %d of %d: a KRSC filter of %zu elements as k=%d, r*s=%d is not whole filters", i,
                          nseg, sg->count, sg->k, sg->rs);
    if (sg->rs > 1 && src_dt == dst_dt)
      return tt_cuda_fail(b, "cast_multi: tensor %d of %d: a KRSC transpose %s -> %s (the copies are the other dtype's)", i, nseg,
                          tt_cuda_dtype_name(src_dt), tt_cuda_dtype_name(dst_dt));
  }
  i = 0;
  if (src_dt == dst_dt) { /* copies: cast's own path, one per tensor */
    for (i = 0; i < nseg; i++)
      if (tt_cuda_cast(b, segs[i].count, src_dt, segs[i].src, dst_dt, segs[i].dst)) return -1;
    return 0;
  }
  while (i < nseg) {
    int v4 = 1;
    memset(&t, 0, sizeof t);
    for (; i < nseg && t.n < CUDA_EW_CASTS; i++) {
      const tt_cast_seg *sg = &segs[i];
      const void *ptrs[2];
      if (!sg->count) continue;
      if (!sg->src || !sg->dst) return tt_cuda_fail(b, "cast_multi: tensor %d of %d: NULL src or dst", i, nseg);
      if (sg->src == (const void *)sg->dst)
        return tt_cuda_fail(b, "cast_multi: tensor %d of %d: %s -> %s cannot run in place", i, nseg,
                            tt_cuda_dtype_name(src_dt), tt_cuda_dtype_name(dst_dt));
      ptrs[0] = sg->src, ptrs[1] = sg->dst;
      if (tt_cuda_vec_width(4, ptrs, 2) != 4) v4 = 0; /* fp32's 16 bytes (a 16-bit side then 8-aligned too) */
      t.src[t.n] = sg->src, t.dst[t.n] = sg->dst, t.count[t.n] = sg->count;
      t.rs[t.n] = sg->rs > 1 ? (unsigned)sg->rs : 0u;
      t.cg[t.n] = sg->rs > 1 ? (unsigned)(sg->count / ((size_t)sg->k * (size_t)sg->rs)) : 0u;
      t.cumv[t.n + 1] = t.cumv[t.n] + (sg->count + 3) / 4;
      t.n++;
    }
    if (!t.n) break;
    TT_LAUNCH(cuda_ew_cast_multi_k, tt_cuda_blocks((size_t)t.cumv[t.n]), TT_CUDA_THREADS, 0, tt_cuda_stream(b), t, src_dt,
              dst_dt, v4);
    CUDA_LAUNCH_CHECK(b, "cast_multi");
  }
  return 0;
}

/* ---------------------------------- normalize_u8 -------------------------------------- */

typedef struct cuda_ew_norm_params {
  float mean[TT_CUDA_MAX_NORM_CH], std[TT_CUDA_MAX_NORM_CH];
} cuda_ew_norm_params;

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_ew_normalize_k(size_t count, int c, size_t hw,
                                                                      const uint8_t *src, cuda_ew_norm_params pr,
                                                                      tt_dtype dt, void *dst) {
  TT_CUDA_LOOP(i, count) {
    int ch = (int)((i / hw) % (size_t)c);
    tt_cuda_st(dt, dst, i, ((float)src[i] / 255.0f - pr.mean[ch]) / pr.std[ch]);
  }
}

int tt_cuda_normalize_u8(tt_backend *b, int n, int c, int hw, const uint8_t *src, const float *mean, const float *std,
                         tt_dtype dt, void *dst) {
  cuda_ew_norm_params pr;
  size_t count;
  int ch;
  if (cuda_ew_dt(b, "normalize_u8", dt)) return -1;
  if (n < 0 || c <= 0 || hw < 0) return tt_cuda_fail(b, "normalize_u8: bad shape n=%d c=%d hw=%d", n, c, hw);
  if (c > TT_CUDA_MAX_NORM_CH)
    return tt_cuda_fail(b, "normalize_u8: %d channels; the CUDA backend takes at most %d", c, TT_CUDA_MAX_NORM_CH);
  count = (size_t)n * c * hw;
  if (!count) return 0;
  if (!src || !mean || !std || !dst) return tt_cuda_fail(b, "normalize_u8: NULL src, mean, std or dst");
  /* mean and std are host arrays (the recipe's); they travel by value. */
  for (ch = 0; ch < c; ch++) pr.mean[ch] = mean[ch], pr.std[ch] = std[ch];
  TT_LAUNCH(cuda_ew_normalize_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, tt_cuda_stream(b), count, c, (size_t)hw, src, pr,
                                                                                         dt, dst);
  CUDA_LAUNCH_CHECK(b, "normalize_u8");
  return 0;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
TT_CUDA_KERNEL_TABLE(elementwise, TT_CUDA_KERNEL(cuda_ew_add_bias_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_add_bias_rows_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_channel_sum_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_accum_f32_k, TT_CUDA_THREADS), TT_CUDA_KERNEL(cuda_ew_transpose_k, 256),
                     TT_CUDA_KERNEL(cuda_ew_act_fwd_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_act_bwd_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_act_mask_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_act_bwd_mask_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_relu_route_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_save16_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_save8_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_restore_k, TT_CUDA_THREADS), TT_CUDA_KERNEL(cuda_ew_add_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_accumulate_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_dropout_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_channel_copy_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_cast_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_cast_multi_k, TT_CUDA_THREADS),
                     TT_CUDA_KERNEL(cuda_ew_normalize_k, TT_CUDA_THREADS));
