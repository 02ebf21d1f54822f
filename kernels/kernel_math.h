/* kernels/kernel_math.h — numerics every backend must compute identically, written once.
 *
 * The CPU backend compiles these as plain C; the CUDA backend as __host__ __device__
 * functions inside its kernels. Dropout masks in particular are a contract: backward and
 * recompute regenerate them from (seed, index), so a CUDA mask must equal the CPU's bit for
 * bit. Nothing here allocates or touches a stream. */
#ifndef TT_KERNEL_MATH_H
#define TT_KERNEL_MATH_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"

#ifdef __CUDACC__
#define TT_HD __host__ __device__
#else
#define TT_HD
#endif

/* The one 64-bit mixer of the project: splitmix64's step (add the golden-ratio increment)
 * and finaliser. Dropout masks, data shuffles, parameter initialisation and the tests'
 * generators all derive their bits from it, so each stream is reproducible everywhere. */
#define TT_GOLDEN64 0x9E3779B97F4A7C15ull
static inline TT_HD uint64_t tt_mix64(uint64_t z) {
  z += TT_GOLDEN64;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The next value of a splitmix64 stream whose state is *s. */
static inline TT_HD uint64_t tt_splitmix_next(uint64_t *s) {
  uint64_t r = tt_mix64(*s);
  *s += TT_GOLDEN64;
  return r;
}

/* bfloat16 <-> float: bf16 is the high half of an fp32. fp32 -> bf16 rounds to nearest even
 * (overflow past the largest bf16 gives inf, as IEEE rounding does); a NaN stays a NaN (its
 * quiet bit set, the top payload bits kept), never rounded into inf. Every backend and
 * compress_saved's bf16 format use these two, so a bf16 value is the same bits everywhere. */
static inline TT_HD uint16_t tt_bf16_from_f32(float f) {
  uint32_t u;
#ifdef __CUDA_ARCH__
  u = __float_as_uint(f);
#else
  memcpy(&u, &f, 4);
#endif
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline TT_HD float tt_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

/* Dropout: the mixer of (seed XOR i * golden ratio). Element i is kept iff
 * (uint32_t)(h >> 32) >= (uint32_t)(p * 2^32) (p in [0, 1)); p >= 1 drops everything;
 * kept values are scaled by 1 / (1 - p) computed in fp32. */
static inline TT_HD uint64_t tt_dropout_hash(uint64_t seed, uint64_t i) { return tt_mix64(seed ^ (i * TT_GOLDEN64)); }

/* The seed a dropout or attention call of a training micro-step draws with: the micro-step's base
 * (the executor's, from the run's seed, the step and the micro-step) plus the call's number k (its
 * graph node), mixed. An eager call is given tt_seed_at(base, k); a call recorded into a CUDA graph
 * is given k and reads base from device memory at each replay (backend.h graph_values), so both
 * draw the same mask. */
static inline TT_HD uint64_t tt_seed_at(uint64_t base, uint64_t k) { return tt_mix64(base + k); }

/* Batch-norm training statistics of one channel from its m values: sq is the sum of squared
 * deviations from mean. Writes the saved mean and 1/sqrt(biased var + eps) and, when asked,
 * moves the running statistics as PyTorch does: running_var takes the unbiased variance, except
 * for m == 1 where that would be inf/NaN and the biased one is used. */
static inline TT_HD void tt_bn_channel_stats(double mean_d, double sq, size_t m, float eps, float momentum,
                                             int update_running, float *save_mean, float *save_invstd,
                                             float *running_mean, float *running_var) {
  double var = sq / (double)m; /* biased: used to normalise */
  float mean = (float)mean_d;
  *save_mean = mean;
  *save_invstd = (float)(1.0 / sqrt(var + (double)eps));
  if (update_running) {
    double unbiased = m > 1 ? sq / (double)(m - 1) : var;
    *running_mean = (1.0f - momentum) * *running_mean + momentum * mean;
    *running_var = (1.0f - momentum) * *running_var + momentum * (float)unbiased;
  }
}

/* Activation forward; NaN propagates through ReLU and ReLU6, as in PyTorch. */
static inline TT_HD float tt_act_value(tt_act a, float v) {
  switch (a) {
    case TT_ACT_RELU: return (v > 0.0f || v != v) ? v : 0.0f;
    case TT_ACT_RELU6: return v != v ? v : (v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v));
    /* GELU, PyTorch's two forms: x * Phi(x) exactly, and the tanh approximation
     * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
    case TT_ACT_GELU_ERF: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case TT_ACT_GELU_TANH: return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    default: return v / (1.0f + expf(-v)); /* SiLU */
  }
}

/* Activation backward from the saved tensor: y for RELU and RELU6, x for SILU and GELU. */
static inline TT_HD float tt_act_grad(tt_act a, float saved, float g) {
  switch (a) {
    case TT_ACT_RELU: return saved > 0.0f ? g : 0.0f;
    case TT_ACT_RELU6: return (saved > 0.0f && saved < 6.0f) ? g : 0.0f;
    case TT_ACT_GELU_ERF: { /* d/dx x Phi(x) = Phi(x) + x phi(x) */
      float cdf = 0.5f * (1.0f + erff(saved * 0.70710678118654752f));
      float pdf = 0.39894228040143268f * expf(-0.5f * saved * saved);
      return g * (cdf + saved * pdf);
    }
    case TT_ACT_GELU_TANH: {
      float x2 = saved * saved, u = 0.79788456080286536f * (saved + 0.044715f * x2 * saved);
      float th = tanhf(u), du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x2);
      return g * (0.5f * (1.0f + th) + 0.5f * saved * (1.0f - th * th) * du);
    }
    default: {
      float s = 1.0f / (1.0f + expf(-saved));
      return g * s * (1.0f + saved * (1.0f - s));
    }
  }
}

/* One element of SGD as torch.optim.SGD: d = g*gs + wd*w; m = momentum*m + d;
 * step = nesterov ? d + momentum*m : m; w -= lr*step. m may be NULL when momentum == 0. */
static inline TT_HD void tt_sgd_elem(size_t i, float *w, const float *g, float *m, float lr, float momentum, int nesterov,
                                     float weight_decay, float grad_scale) {
  float d = g[i] * grad_scale, step, wv = w[i]; /* w read once: the store to m may alias it for the compiler */
  if (weight_decay != 0.0f) d += weight_decay * wv;
  if (momentum != 0.0f) {
    float mv = momentum * m[i] + d;
    m[i] = mv;
    step = nesterov ? d + momentum * mv : mv;
  } else {
    step = d;
  }
  w[i] = wv - lr * step;
}

/* The gradient scale an update uses under global-norm clipping (backend.h, tt_clip): grad_scale
 * times min(1, max_norm / (norm + 1e-6)), norm = sqrt(sumsq) * grad_scale the true gradient's L2
 * norm, as torch.nn.utils.clip_grad_norm_ (its eps and clamp). A norm that is NaN leaves the
 * gradient unscaled (as NaN as it is); an overflowed fp16 step is skipped before this matters. */
static inline TT_HD float tt_clip_grad_scale(float grad_scale, const float *sumsq, float max_norm) {
  if (!sumsq || !(max_norm > 0.0f)) return grad_scale;
  float norm = sqrtf(sumsq[0]) * grad_scale;
  float coef = max_norm / (norm + 1e-6f);
  return coef < 1.0f ? grad_scale * coef : grad_scale;
}

/* Adam's per-step constants, as torch.optim.Adam(W) computes them: bias corrections as
 * Python floats (double), then fp32; AdamW decays the weight by (1 - lr*wd) first. */
typedef struct tt_adam_consts {
  float step_size, bc2_sqrt, decay;
} tt_adam_consts;

static inline tt_adam_consts tt_adam_make_consts(float lr, float beta1, float beta2, float weight_decay, int decoupled,
                                                 int t) {
  tt_adam_consts k;
  k.step_size = (float)((double)lr / (1.0 - pow((double)beta1, (double)t)));
  k.bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t));
  k.decay = decoupled ? 1.0f - lr * weight_decay : 1.0f;
  return k;
}

static inline TT_HD void tt_adam_elem(size_t i, float *w, const float *g, float *m, float *v, float beta1, float beta2,
                                      float eps, float weight_decay, int decoupled, tt_adam_consts k, float grad_scale) {
  float gr = g[i] * grad_scale, wv = w[i];
  if (decoupled)
    wv *= k.decay;
  else if (weight_decay != 0.0f)
    gr += weight_decay * wv;
  float mv = m[i] + (1.0f - beta1) * (gr - m[i]); /* exp_avg.lerp_(grad, 1-beta1) */
  float vv = beta2 * v[i] + (1.0f - beta2) * gr * gr;
  m[i] = mv;
  v[i] = vv;
  w[i] = wv - k.step_size * mv / (sqrtf(vv) / k.bc2_sqrt + eps);
}

/* ---- optimizer state held in bf16 or int8 (backend.h tt_state_fmt says the format and why) ----
 * Every backend codes and decodes with these, so a held state is the same bits everywhere the
 * fp32 arithmetic is. */

/* The int8 code of a signed value x (momentum, Adam's m) in a block whose largest magnitude is s. */
static inline TT_HD int8_t tt_state_q8s(float x, float s) {
  if (!(s > 0.0f)) return 0;
  float r = sqrtf(fabsf(x) / s) * 127.0f + 0.5f;
  int c = r < 127.0f ? (int)r : 127; /* rounds to nearest; |x| == s (and NaN) give 127 */
  return (int8_t)(x < 0.0f ? -c : c);
}
static inline TT_HD float tt_state_dq8s(int8_t c, float s) {
  float a = (float)c / 127.0f, q = a * a * s;
  return c < 0 ? -q : q;
}
/* The uint8 code of a non-negative value x (Adam's v) in a block whose largest value is s. */
static inline TT_HD uint8_t tt_state_q8u(float x, float s) {
  if (!(s > 0.0f) || !(x > 0.0f)) return 0;
  float r = sqrtf(sqrtf(x / s)) * 255.0f + 0.5f;
  return (uint8_t)(r < 255.0f ? (int)r : 255);
}
static inline TT_HD float tt_state_dq8u(uint8_t c, float s) {
  float a = (float)c / 255.0f, a2 = a * a;
  return a2 * a2 * s;
}
/* The fp32 scale of int8 block jb of a state buffer of count values (backend.h's layout). */
static inline TT_HD float *tt_state_scale(void *base, size_t count, size_t jb) {
  return (float *)((char *)base + (count + 3u) / 4u * 4u) + jb; /* tt_state_codes_bytes, on the device too */
}

/* Decodes values [j0, j0 + n) of the state at base (count values held as f; sgn 1: signed codes,
 * the first moment; 0: Adam's v) into out[0..n). For INT8, [j0, j0 + n) lies in one block. */
static inline TT_HD void tt_state_load(int f, int sgn, const void *base, size_t count, size_t j0, size_t n, float *out) {
  size_t k;
  if (f == TT_STATE_F32) {
    for (k = 0; k < n; k++) out[k] = ((const float *)base)[j0 + k];
  } else if (f == TT_STATE_BF16) {
    for (k = 0; k < n; k++) out[k] = tt_bf16_to_f32(((const uint16_t *)base)[j0 + k]);
  } else {
    float s = *tt_state_scale((void *)base, count, j0 / TT_STATE_BLOCK);
    for (k = 0; k < n; k++)
      out[k] = sgn ? tt_state_dq8s(((const int8_t *)base)[j0 + k], s) : tt_state_dq8u(((const uint8_t *)base)[j0 + k], s);
  }
}

/* Stores in[0..n) as values [j0, j0 + n) of the state at base (as tt_state_load reads them). For
 * INT8, [j0, j0 + n) is one whole block (j0 a multiple of TT_STATE_BLOCK; n the block's size): its
 * scale becomes the largest magnitude of in[] and every code is made from it. */
static inline TT_HD void tt_state_store(int f, int sgn, void *base, size_t count, size_t j0, size_t n, const float *in) {
  size_t k;
  if (f == TT_STATE_F32) {
    for (k = 0; k < n; k++) ((float *)base)[j0 + k] = in[k];
  } else if (f == TT_STATE_BF16) {
    for (k = 0; k < n; k++) ((uint16_t *)base)[j0 + k] = tt_bf16_from_f32(in[k]);
  } else {
    float s = 0.0f;
    for (k = 0; k < n; k++) s = fmaxf(s, fabsf(in[k])); /* fmaxf drops a NaN */
    *tt_state_scale(base, count, j0 / TT_STATE_BLOCK) = s;
    for (k = 0; k < n; k++)
      if (sgn) ((int8_t *)base)[j0 + k] = tt_state_q8s(in[k], s);
      else ((uint8_t *)base)[j0 + k] = tt_state_q8u(in[k], s);
  }
}

/* Validates an update's clip argument (backend.h, tt_clip; NULL: no clipping); returns 0, or -1
 * with the reason in msg. */
static inline int tt_clip_error(const char *op, const tt_clip *clip, char *msg, size_t size) {
  if (!clip) return 0;
  if (!clip->sumsq) return snprintf(msg, size, "%s: clip without its sum of squares", op), -1;
  if (!(clip->max_norm > 0.0f))
    return snprintf(msg, size, "%s: clip max_norm %g must be > 0", op, (double)clip->max_norm), -1;
  return 0;
}

/* Validates a pooling call; returns 0, or -1 with the reason in msg. PyTorch's rule:
 * padding at most half the kernel, so no window is all padding. */
static inline int tt_pool_desc_error(const char *op, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, char *msg,
                                     size_t size) {
  if (!d) return snprintf(msg, size, "%s: NULL pool desc", op), -1;
  if (dt != TT_F32 && dt != TT_F16) return snprintf(msg, size, "%s: unknown dtype %d", op, (int)dt), -1;
  if (mode != TT_POOL_MAX && mode != TT_POOL_AVG) return snprintf(msg, size, "%s: unknown pool mode %d", op, (int)mode), -1;
  if (d->layout != TT_LAYOUT_NCHW && d->layout != TT_LAYOUT_NHWC)
    return snprintf(msg, size, "%s: unknown layout %d (0 NCHW, 1 NHWC)", op, d->layout), -1;
  if (d->y_nchw) /* a backend with pool_y_nchw runs the desc without it, on its workspace's copy */
    return snprintf(msg, size, "%s: y_nchw %d: this backend's pooling keeps x's layout for y (pool_y_nchw 0)", op, d->y_nchw),
           -1;
  if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->kh <= 0 || d->kw <= 0 || d->stride_h <= 0 ||
      d->stride_w <= 0 || d->pad_h < 0 || d->pad_w < 0)
    return snprintf(msg, size, "%s: bad pool desc (n=%d c=%d h=%d w=%d kernel=%dx%d stride=%dx%d pad=%dx%d)", op, d->n,
                    d->c, d->h, d->w, d->kh, d->kw, d->stride_h, d->stride_w, d->pad_h, d->pad_w),
           -1;
  if (2 * d->pad_h > d->kh || 2 * d->pad_w > d->kw)
    return snprintf(msg, size, "%s: padding %dx%d must be at most half the kernel %dx%d", op, d->pad_h, d->pad_w, d->kh,
                    d->kw),
           -1;
  if (d->h + 2 * d->pad_h < d->kh || d->w + 2 * d->pad_w < d->kw ||
      d->p != (d->h + 2 * d->pad_h - d->kh) / d->stride_h + 1 || d->q != (d->w + 2 * d->pad_w - d->kw) / d->stride_w + 1)
    return snprintf(msg, size, "%s: output %dx%d does not match input %dx%d, kernel %dx%d, stride %dx%d, pad %dx%d", op,
                    d->p, d->q, d->h, d->w, d->kh, d->kw, d->stride_h, d->stride_w, d->pad_h, d->pad_w),
           -1;
  return 0;
}

#endif
