/* kernels/cuda/cuda_bn.h — shared by the batch-norm files only: cuda_bn.cu (the two-pass, row and
 * flat forms, the entry points) and cuda_bn_chip.cu (the held-on-chip form). The per-element
 * arithmetic and the finishing of the per-channel sums are here, once, so that every form computes
 * the same bits from the same statistics.
 */
#ifndef TT_CUDA_BN_H
#define TT_CUDA_BN_H
#include "cuda_internal.h"

struct alignas(8) cuda_bn_f2 {
  float x, y;
};
/* a block's partial sums of the two-pass statistics, at part[split * c + ch] of the workspace */
struct alignas(16) cuda_bn_d2 {
  double x, y;
};

/* Batch norm's output before rounding, one expression for every kernel (fmaf pins the
 * contraction), so that the ReLU-fused backward recomputes the forward's value bit for bit. */
static __device__ __forceinline__ float cuda_bn_y(float x, float mean, float invstd, float gm, float bb) {
  return fmaf((x - mean) * invstd, gm, bb);
}
/* ReLU after the rounding to dt, as act_fwd does it on the stored y: NaN passes, the rest
 * max(y, 0) (a value that rounds to -0 or to +0 gives +0 either way). */
static __device__ __forceinline__ float cuda_bn_relu(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }
/* v rounded to dt and back (what storing v in a dt tensor and loading it gives). */
static __device__ __forceinline__ float cuda_bn_round(tt_dtype dt, float v) {
  if (dt == TT_F16) return __half2float(__float2half_rn(v));
  if (dt == TT_BF16) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}
/* The forward's output at one element from batch norm's v: v; with relu the ReLU of it; with the
 * shortcut (has_s, bn_fwd_train_add_relu; sv its value) the unfused calls' roundings in order: v
 * rounded to dt (bn_fwd_train's stored value), plus sv in fp32 rounded to dt (add's), then the ReLU
 * (act_fwd's; exact). */
static __device__ __forceinline__ float cuda_bn_out(tt_dtype dt, float v, int relu, int has_s, float sv) {
  if (has_s) return cuda_bn_relu(cuda_bn_round(dt, cuda_bn_round(dt, v) + sv));
  return relu ? cuda_bn_relu(v) : v;
}
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

/* cuda_bn_chip.cu: the held-on-chip forms of bn_fwd_train(_relu) and bn_bwd(_relu) where they apply
 * (the arguments checked by the caller; op names the entry point in messages): 1 launched, 0 not
 * (the caller takes the two-pass forms), -1 failed. s: NULL, or bn_fwd_train_add_relu's shortcut
 * (cuda_bn_out). */
int tt_cuda_bn_chip_fwd(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x,
                        const float *gamma, const float *bias, void *y, float *running_mean, float *running_var,
                        float momentum, float eps, float *save_mean, float *save_invstd, int update_running, int relu,
                        const void *s);
int tt_cuda_bn_chip_bwd(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                        const float *gamma, const float *bias, int relu, const float *save_mean,
                        const float *save_invstd, void *dx, float *dgamma, float *dbias, float beta_dx,
                        float beta_param);

/* cuda_bn_rows.cu: batch norm on rows (hw == 1: an NHWC tensor as [rows, c]) in 16-byte vectors,
 * where c is whole vectors and every pointer given is 16-byte aligned (NULL ones ignored); 0 where
 * not (the caller takes the scalar row kernels), -1 failed. op names the entry point in messages.
 * tt_cuda_bnr_stats: the forward's partial sums of x (dy NULL; y only joins the alignment test, so
 * the statistics take the form the normalisation of y can) or the backward's of x and dy (the
 * ReLU's mask with relu), at most max_splits a channel into ws (cuda_bn_d2, part[split * c + ch]);
 * returns the splits, for cuda_bn_final_k / cuda_bn_bwd_final_k. tt_cuda_bnr_norm: y from the
 * statistics (cuda_bn_norm_k's arguments); tt_cuda_bnr_dx: dx from md (cuda_bn_dx_k's). */
int tt_cuda_bnr_stats(tt_backend *b, const char *op, size_t rows, int c, tt_dtype dt, const void *x, const void *y,
                      const void *dy, const float *save_mean, const float *save_invstd, const float *gamma,
                      const float *bias, int relu, void *ws, size_t max_splits);
int tt_cuda_bnr_norm(tt_backend *b, const char *op, size_t rows, int c, tt_dtype dt, const void *x, const float *gamma,
                     const float *bias, const float *mean_p, const float *stat_p, int infer, float eps, int relu,
                     const void *s, void *y);
int tt_cuda_bnr_dx(tt_backend *b, const char *op, size_t rows, int c, tt_dtype dt, const void *x, const void *dy,
                   const float *gamma, const float *save_mean, const float *save_invstd, const cuda_bn_f2 *md,
                   const float *bias, int relu, void *dx, float beta_dx);
#endif
