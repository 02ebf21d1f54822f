/* kernels/cuda/cuda_norm.cu — batch norm, pooling and global average pooling, as the
 * backend's own kernels (not cuDNN), so that the semantics are the CPU backend's exactly:
 * batch norm normalises with the biased batch variance, updates running_var with the
 * unbiased one (biased when there is one value per channel), running = (1-m)*running +
 * m*batch; max pooling takes the first maximum (NaN wins) and its backward re-finds it from
 * x; average pooling divides by the full window (count_include_pad). No workspace.
 *
 * Batch norm runs one block per channel: a two-pass mean / variance (per-thread fp32
 * partials, combined in double in a fixed tree), then the normalisation, so the statistics
 * are deterministic. Pooling is one thread per output (forward) or per input (backward,
 * gather form: every dx element written once, with beta).
 */
#include <math.h>

#include "cuda_internal.h"

#define CUDA_NORM_THREADS 512

static int cuda_norm_bn_check(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt) {
  if (n <= 0 || c <= 0 || hw <= 0) return tt_cuda_fail(b, "%s: bad shape n=%d c=%d hw=%d", op, n, c, hw);
  if (dt != TT_F32 && dt != TT_F16) return tt_cuda_fail(b, "%s: unknown dtype %d", op, (int)dt);
  return 0;
}

static cudaStream_t cuda_norm_stream(tt_backend *b) { return tt_cuda_st(b)->compute; }

/* --------------------------------- batch norm ----------------------------------------- */

static __global__ void TT_LAUNCH_BOUNDS(CUDA_NORM_THREADS) cuda_bn_train_k(int n, int c, int hw, tt_dtype dt, const void *x,
                                                                    const float *gamma, const float *bias, void *y,
                                                                    float *running_mean, float *running_var,
                                                                    float momentum, float eps, float *save_mean,
                                                                    float *save_invstd, int update_running) {
  __shared__ double sh[33];
  const int ch = blockIdx.x;
  const size_t m = (size_t)n * hw;
  float part = 0.0f, mean, invstd, g, bb;
  double mean_d, sq;
  for (size_t idx = threadIdx.x; idx < m; idx += blockDim.x) {
    size_t s = idx / hw, k = idx - s * hw;
    part += tt_cuda_ld(dt, x, (s * c + ch) * hw + k);
  }
  mean_d = tt_cuda_block_sum((double)part, sh) / (double)m;
  part = 0.0f;
  for (size_t idx = threadIdx.x; idx < m; idx += blockDim.x) {
    size_t s = idx / hw, k = idx - s * hw;
    float dv = (float)((double)tt_cuda_ld(dt, x, (s * c + ch) * hw + k) - mean_d);
    part += dv * dv;
  }
  sq = tt_cuda_block_sum((double)part, sh);
  {
    /* every thread needs mean and invstd; thread 0 alone writes them and moves the running stats */
    const int lead = threadIdx.x == 0, upd = lead && update_running;
    tt_bn_channel_stats(mean_d, sq, m, eps, momentum, upd, &mean, &invstd, upd ? running_mean + ch : NULL,
                        upd ? running_var + ch : NULL);
    if (lead) {
      save_mean[ch] = mean;
      save_invstd[ch] = invstd;
    }
  }
  g = gamma[ch];
  bb = bias[ch];
  for (size_t idx = threadIdx.x; idx < m; idx += blockDim.x) {
    size_t s = idx / hw, k = idx - s * hw, o = (s * c + ch) * hw + k;
    tt_cuda_st(dt, y, o, (tt_cuda_ld(dt, x, o) - mean) * invstd * g + bb);
  }
}

int tt_cuda_bn_fwd_train(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                         const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                         float *save_mean, float *save_invstd, int update_running, void *ws, size_t ws_bytes) {
  if (cuda_norm_bn_check(b, "bn_fwd_train", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !y || !save_mean || !save_invstd)
    return tt_cuda_fail(b, "bn_fwd_train: NULL x, gamma, bias, y, save_mean or save_invstd");
  if (update_running && (!running_mean || !running_var))
    return tt_cuda_fail(b, "bn_fwd_train: update_running set but running_mean or running_var is NULL");
  TT_LAUNCH(cuda_bn_train_k, c, CUDA_NORM_THREADS, 0, cuda_norm_stream(b), n, c, hw, dt, x, gamma, bias, y, running_mean,
                                                                    running_var, momentum, eps, save_mean, save_invstd,
                                                                    update_running);
  CUDA_LAUNCH_CHECK(b, "bn_fwd_train");
  return 0;
}

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_bn_infer_k(size_t count, int c, size_t hw, tt_dtype dt,
                                                                  const void *x, const float *gamma, const float *bias,
                                                                  const float *running_mean, const float *running_var,
                                                                  float eps, void *y) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    int ch = (int)((i / hw) % (size_t)c);
    float mean = running_mean[ch], invstd = (float)(1.0 / sqrt((double)running_var[ch] + (double)eps));
    tt_cuda_st(dt, y, i, (tt_cuda_ld(dt, x, i) - mean) * invstd * gamma[ch] + bias[ch]);
  }
}

int tt_cuda_bn_fwd_infer(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                         const float *bias, const float *running_mean, const float *running_var, float eps, void *y,
                         void *ws, size_t ws_bytes) {
  size_t count = (size_t)n * c * hw;
  if (cuda_norm_bn_check(b, "bn_fwd_infer", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !running_mean || !running_var || !y)
    return tt_cuda_fail(b, "bn_fwd_infer: NULL x, gamma, bias, running_mean, running_var or y");
  TT_LAUNCH(cuda_bn_infer_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
      count, c, (size_t)hw, dt, x, gamma, bias, running_mean, running_var, eps, y);
  CUDA_LAUNCH_CHECK(b, "bn_fwd_infer");
  return 0;
}

static __global__ void TT_LAUNCH_BOUNDS(CUDA_NORM_THREADS) cuda_bn_bwd_k(int n, int c, int hw, tt_dtype dt, const void *x,
                                                                  const void *dy, const float *gamma,
                                                                  const float *save_mean, const float *save_invstd,
                                                                  void *dx, float *dgamma, float *dbias, float beta_dx,
                                                                  float beta_param) {
  __shared__ double sh[33];
  const int ch = blockIdx.x;
  const size_t m = (size_t)n * hw;
  const float mean = save_mean[ch], invstd = save_invstd[ch];
  float p_dy = 0.0f, p_dyx = 0.0f, a, mdy, mdyx;
  double sdy, sdyx;
  for (size_t idx = threadIdx.x; idx < m; idx += blockDim.x) {
    size_t s = idx / hw, k = idx - s * hw, o = (s * c + ch) * hw + k;
    float g = tt_cuda_ld(dt, dy, o), xh = (tt_cuda_ld(dt, x, o) - mean) * invstd;
    p_dy += g;
    p_dyx += g * xh;
  }
  sdy = tt_cuda_block_sum((double)p_dy, sh);
  sdyx = tt_cuda_block_sum((double)p_dyx, sh);
  if (threadIdx.x == 0) {
    if (dbias) dbias[ch] = beta_param != 0.0f ? beta_param * dbias[ch] + (float)sdy : (float)sdy;
    if (dgamma) dgamma[ch] = beta_param != 0.0f ? beta_param * dgamma[ch] + (float)sdyx : (float)sdyx;
  }
  if (!dx) return;
  a = gamma[ch] * invstd;
  mdy = (float)(sdy / (double)m);
  mdyx = (float)(sdyx / (double)m);
  for (size_t idx = threadIdx.x; idx < m; idx += blockDim.x) {
    size_t s = idx / hw, k = idx - s * hw, o = (s * c + ch) * hw + k;
    float xh = (tt_cuda_ld(dt, x, o) - mean) * invstd;
    float v = a * (tt_cuda_ld(dt, dy, o) - mdy - xh * mdyx);
    tt_cuda_st_beta(dt, dx, o, v, beta_dx);
  }
}

int tt_cuda_bn_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                   const float *save_mean, const float *save_invstd, void *dx, float *dgamma, float *dbias, float beta_dx,
                   float beta_param, void *ws, size_t ws_bytes) {
  if (cuda_norm_bn_check(b, "bn_bwd", n, c, hw, dt)) return -1;
  if (!x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_cuda_fail(b, "bn_bwd: NULL x, dy, gamma, save_mean or save_invstd");
  TT_LAUNCH(cuda_bn_bwd_k, c, CUDA_NORM_THREADS, 0, cuda_norm_stream(b), n, c, hw, dt, x, dy, gamma, save_mean, save_invstd, dx,
                                                                  dgamma, dbias, beta_dx, beta_param);
  CUDA_LAUNCH_CHECK(b, "bn_bwd");
  return 0;
}

/* ----------------------------------- pooling ------------------------------------------ */

/* First maximum of window (oh, ow) of the plane at xoff (index into the plane); NaN wins. */
static __device__ long long cuda_norm_argmax(tt_pool_desc d, tt_dtype dt, const void *x, size_t xoff, int oh, int ow,
                                      float *best_out) {
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

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_pool_bwd_k(tt_pool_desc d, tt_pool_mode mode, tt_dtype dt,
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

int tt_cuda_pool_fwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, void *y,
                     void *ws, size_t ws_bytes) {
  char msg[256];
  if (tt_pool_desc_error("pool_fwd", d, mode, dt, msg, sizeof msg)) return tt_cuda_fail(b, "%s", msg);
  if (!x || !y) return tt_cuda_fail(b, "pool_fwd: NULL x or y");
  TT_LAUNCH(cuda_pool_fwd_k, tt_cuda_blocks((size_t)d->n * d->c * d->p * d->q), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
      *d, mode, dt, x, y);
  CUDA_LAUNCH_CHECK(b, "pool_fwd");
  return 0;
}

int tt_cuda_pool_bwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, const void *dy,
                     void *dx, float beta, void *ws, size_t ws_bytes) {
  char msg[256];
  if (tt_pool_desc_error("pool_bwd", d, mode, dt, msg, sizeof msg)) return tt_cuda_fail(b, "%s", msg);
  if ((mode == TT_POOL_MAX && !x) || !dy || !dx) return tt_cuda_fail(b, "pool_bwd: NULL x (max), dy or dx");
  TT_LAUNCH(cuda_pool_bwd_k, tt_cuda_blocks((size_t)d->n * d->c * d->h * d->w), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
      *d, mode, dt, x, dy, dx, beta);
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
  char msg[256];
  if (tt_pool_desc_error("pool_argmax", d, TT_POOL_MAX, dt, msg, sizeof msg)) return tt_cuda_fail(b, "%s", msg);
  if (d->kh * d->kw > 256) return tt_cuda_fail(b, "pool_argmax: a %dx%d window has no uint8 index", d->kh, d->kw);
  if (!x || !idx) return tt_cuda_fail(b, "pool_argmax: NULL x or idx");
  TT_LAUNCH(cuda_pool_argmax_k, tt_cuda_blocks((size_t)d->n * d->c * d->p * d->q), TT_CUDA_THREADS, 0, cuda_norm_stream(b),
      *d, dt, x, idx);
  CUDA_LAUNCH_CHECK(b, "pool_argmax");
  return 0;
}

int tt_cuda_pool_bwd_idx(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const uint8_t *idx, const void *dy, void *dx,
                         float beta) {
  char msg[256];
  if (tt_pool_desc_error("pool_bwd_idx", d, TT_POOL_MAX, dt, msg, sizeof msg)) return tt_cuda_fail(b, "%s", msg);
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

static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) cuda_gap_bwd_k(size_t count, int hw, tt_dtype dt, const void *dy,
                                                                 void *dx, float beta) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    float g = tt_cuda_ld(dt, dy, i / (size_t)hw) / (float)hw;
    tt_cuda_st_beta(dt, dx, i, g, beta);
  }
}

int tt_cuda_gap_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *dy, void *dx, float beta) {
  size_t count = (size_t)n * c * hw;
  if (cuda_norm_bn_check(b, "gap_bwd", n, c, hw, dt)) return -1;
  if (!dy || !dx) return tt_cuda_fail(b, "gap_bwd: NULL dy or dx");
  TT_LAUNCH(cuda_gap_bwd_k, tt_cuda_blocks(count), TT_CUDA_THREADS, 0, cuda_norm_stream(b), count, hw, dt, dy, dx, beta);
  CUDA_LAUNCH_CHECK(b, "gap_bwd");
  return 0;
}

/* every kernel of this file, for the setup check (cuda_internal.h) */
const tt_cuda_kernel tt_cuda_norm_kernels[] = {
    TT_CUDA_KERNEL(cuda_bn_train_k, CUDA_NORM_THREADS),
    TT_CUDA_KERNEL(cuda_bn_infer_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_bn_bwd_k, CUDA_NORM_THREADS),
    TT_CUDA_KERNEL(cuda_pool_fwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_argmax_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_pool_bwd_idx_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_gap_fwd_k, TT_CUDA_THREADS),
    TT_CUDA_KERNEL(cuda_gap_bwd_k, TT_CUDA_THREADS),
};
const int tt_cuda_norm_nkernels = (int)(sizeof tt_cuda_norm_kernels / sizeof tt_cuda_norm_kernels[0]);
