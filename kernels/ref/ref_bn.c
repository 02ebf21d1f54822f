/* kernels/ref/ref_bn.c — batch norm over x [n, c, hw] (NCHW): the training forward (batch
 * statistics, running statistics updated), inference (running statistics), the apply of saved
 * statistics, and the backward (dx, dgamma, dbias); and the residual block's batch norm, add and
 * ReLU as one call each way (bn_fwd_train_add_relu, bn_bwd_add_relu), the same loops with the add
 * and the ReLU composed per element, so the fused path has a reference on every machine.
 *
 * Every loop is parallel over channels and every reduction (a channel's mean, variance, dgamma,
 * dbias) is serial inside its task, in double, so results do not depend on the thread count.
 * 16-bit tensors are converted per element; no workspace is needed.
 */
#include <math.h>
#include <stdint.h>

#include "ref_internal.h"

/* y = (x - mean) * invstd * g + bb over channel ch of x [n, c, hw]: the one normalisation the
 * training forward, inference and bn_apply share, so bn_apply's y is bit for bit the training
 * forward's from the same statistics. */
static void ref_bn_channel(tt_dtype dt, const void *x, void *y, int n, int c, int hw, ptrdiff_t ch, float mean,
                           float invstd, float g, float bb) {
  int i;
  size_t k;
  for (i = 0; i < n; i++) {
    size_t off = ((size_t)i * c + (size_t)ch) * hw;
    for (k = 0; k < (size_t)hw; k++) tt_ref_st(dt, y, off + k, (tt_ref_ld(dt, x, off + k) - mean) * invstd * g + bb);
  }
}

/* Whether bytes [a, a + bytes) and [b2, b2 + bytes) share a byte (the fused calls' alias checks). */
static int ref_bn_overlap(const void *a, const void *b2, size_t bytes) {
  uintptr_t p = (uintptr_t)a, q = (uintptr_t)b2;
  return a && b2 && bytes && p < q + bytes && q < p + bytes;
}

/* The shortcut's add and the ReLU after channel ch's normalisation (bn_fwd_train_add_relu), per
 * element in the unfused calls' order and rounding: t = the normalised value stored in dt (as
 * ref_bn_channel stores it), then add's t + s stored in dt, then act_fwd's ReLU of that. s[i] is read
 * before y[i] is first written, so y may be s. */
static void ref_bn_channel_add_relu(tt_dtype dt, const void *x, const void *s, void *y, int n, int c, int hw,
                                    ptrdiff_t ch, float mean, float invstd, float g, float bb) {
  int i;
  size_t k;
  for (i = 0; i < n; i++) {
    size_t off = ((size_t)i * c + (size_t)ch) * hw;
    for (k = 0; k < (size_t)hw; k++) {
      float sv = tt_ref_ld(dt, s, off + k);
      tt_ref_st(dt, y, off + k, (tt_ref_ld(dt, x, off + k) - mean) * invstd * g + bb);
      tt_ref_st(dt, y, off + k, tt_ref_ld(dt, y, off + k) + sv);
      tt_ref_st(dt, y, off + k, tt_act_value(TT_ACT_RELU, tt_ref_ld(dt, y, off + k)));
    }
  }
}

/* bn_fwd_train, and with s non-NULL bn_fwd_train_add_relu (op names the entry in messages): the
 * statistics of each channel, then its normalisation, alone or with the add and the ReLU. */
static int ref_bn_fwd_train(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt, const void *x,
                            const float *gamma, const float *bias, const void *s, void *y, float *running_mean,
                            float *running_var, float momentum, float eps, float *save_mean, float *save_invstd,
                            int update_running) {
  ptrdiff_t ch;
  int nt = tt_ref_threads(b);
  const size_t m = (size_t)n * hw;
  (void)nt;
  if (tt_ref_nchw_check(b, op, n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !y || !save_mean || !save_invstd)
    return tt_ref_fail(b, "%s: NULL x, gamma, bias, y, save_mean or save_invstd", op);
  if (update_running && (!running_mean || !running_var))
    return tt_ref_fail(b, "%s: update_running set but running_mean or running_var is NULL", op);
#pragma omp parallel for schedule(static) num_threads(nt) if (m * c > TT_REF_PAR_MIN)
  for (ch = 0; ch < c; ch++) {
    double sum = 0.0, sq = 0.0, mean_d;
    float mean, invstd, g, bb;
    int i;
    size_t k;
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * c + (size_t)ch) * hw;
      for (k = 0; k < (size_t)hw; k++) sum += tt_ref_ld(dt, x, off + k);
    }
    mean_d = sum / (double)m;
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * c + (size_t)ch) * hw;
      for (k = 0; k < (size_t)hw; k++) {
        double dv = tt_ref_ld(dt, x, off + k) - mean_d;
        sq += dv * dv;
      }
    }
    tt_bn_channel_stats(mean_d, sq, m, eps, momentum, update_running, save_mean + ch, save_invstd + ch,
                        update_running ? running_mean + ch : NULL, update_running ? running_var + ch : NULL);
    mean = save_mean[ch];
    invstd = save_invstd[ch];
    g = gamma[ch];
    bb = bias[ch];
    if (s) ref_bn_channel_add_relu(dt, x, s, y, n, c, hw, ch, mean, invstd, g, bb);
    else ref_bn_channel(dt, x, y, n, c, hw, ch, mean, invstd, g, bb);
  }
  return 0;
}

int tt_ref_bn_fwd_train(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                        float eps, float *save_mean, float *save_invstd, int update_running, void *ws, size_t ws_bytes) {
  return ref_bn_fwd_train(b, "bn_fwd_train", n, c, hw, dt, x, gamma, bias, NULL, y, running_mean, running_var, momentum,
                          eps, save_mean, save_invstd, update_running);
}

int tt_ref_bn_fwd_train_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                                 const float *bias, const void *s, void *y, float *running_mean, float *running_var,
                                 float momentum, float eps, float *save_mean, float *save_invstd, int update_running,
                                 void *ws, size_t ws_bytes) {
  if (!s) return tt_ref_fail(b, "bn_fwd_train_add_relu: NULL s (the shortcut)");
  if (s != y && ref_bn_overlap(s, y, (size_t)n * c * hw * tt_dtype_size(dt)))
    return tt_ref_fail(b, "bn_fwd_train_add_relu: y overlaps s without being s");
  return ref_bn_fwd_train(b, "bn_fwd_train_add_relu", n, c, hw, dt, x, gamma, bias, s, y, running_mean, running_var,
                          momentum, eps, save_mean, save_invstd, update_running);
}

/* y = (x - mean) * invstd * gamma + bias with given per-channel statistics: invstd given
 * (var NULL), or 1/sqrt(var + eps) from the variance (the running statistics). */
static int ref_bn_normalize(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                            const float *bias, const float *mean, const float *invstd, const float *var, float eps,
                            void *y) {
  ptrdiff_t ch;
  int nt = tt_ref_threads(b);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)n * hw * c > TT_REF_PAR_MIN)
  for (ch = 0; ch < c; ch++) {
    float is = var ? (float)(1.0 / sqrt((double)var[ch] + (double)eps)) : invstd[ch];
    ref_bn_channel(dt, x, y, n, c, hw, ch, mean[ch], is, gamma[ch], bias[ch]);
  }
  return 0;
}

int tt_ref_bn_apply(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma, const float *bias,
                    const float *save_mean, const float *save_invstd, void *y) {
  if (tt_ref_nchw_check(b, "bn_apply", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !save_mean || !save_invstd || !y)
    return tt_ref_fail(b, "bn_apply: NULL x, gamma, bias, save_mean, save_invstd or y");
  return ref_bn_normalize(b, n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, NULL, 0.0f, y);
}

int tt_ref_bn_fwd_infer(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, const float *running_mean, const float *running_var, float eps,
                        void *y, void *ws, size_t ws_bytes) {
  if (tt_ref_nchw_check(b, "bn_fwd_infer", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !running_mean || !running_var || !y)
    return tt_ref_fail(b, "bn_fwd_infer: NULL x, gamma, bias, running_mean, running_var or y");
  return ref_bn_normalize(b, n, c, hw, dt, x, gamma, bias, running_mean, NULL, running_var, eps, y);
}

/* The gradient bn_bwd reads at element i: dy[i] itself, or with the ReLU folded in (the fused
 * backward: relu 1) act_bwd's dy[i] where the ReLU's output y[i] > 0 (mask: bit i set), else 0 --
 * act_bwd(TT_ACT_RELU) and act_bwd_mask's value, exact in dt, so storing it changes nothing. */
static float ref_bn_dy(tt_dtype dt, int relu, const void *y, const uint32_t *mask, const void *dy, size_t i) {
  float g = tt_ref_ld(dt, dy, i);
  if (!relu) return g;
  if (mask) return ((mask[i >> 5] >> (i & 31u)) & 1u) ? g : 0.0f;
  return tt_act_grad(TT_ACT_RELU, tt_ref_ld(dt, y, i), g);
}

/* bn_bwd, and with relu 1 bn_bwd_add_relu (op names the entry): each channel's sums of dy and
 * dy*xhat, then dx; the fused form reads its dy through the ReLU (ref_bn_dy) and writes the
 * shortcut's gradient ds (when non-NULL) as accumulate would, in the first pass: ds may be dy, and
 * the second pass's ref_bn_dy of a value already masked is that value. */
static int ref_bn_bwd(tt_backend *b, const char *op, int relu, int n, int c, int hw, tt_dtype dt, const void *x,
                      const void *y, const uint32_t *mask, const void *dy, const float *gamma, const float *save_mean,
                      const float *save_invstd, void *dx, void *ds, float *dgamma, float *dbias, float beta_dx,
                      float beta_s, float beta_param) {
  ptrdiff_t ch;
  int nt = tt_ref_threads(b);
  const size_t m = (size_t)n * hw;
  (void)nt;
  if (tt_ref_nchw_check(b, op, n, c, hw, dt)) return -1;
  if (!x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_ref_fail(b, "%s: NULL x, dy, gamma, save_mean or save_invstd", op);
#pragma omp parallel for schedule(static) num_threads(nt) if (m * c > TT_REF_PAR_MIN)
  for (ch = 0; ch < c; ch++) {
    double sdy = 0.0, sdyx = 0.0;
    float mean = save_mean[ch], invstd = save_invstd[ch], a, mdy, mdyx;
    int i;
    size_t k;
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * c + (size_t)ch) * hw;
      for (k = 0; k < (size_t)hw; k++) {
        float g = ref_bn_dy(dt, relu, y, mask, dy, off + k);
        if (ds) tt_ref_st_beta(dt, ds, off + k, g, beta_s);
        float xh = (tt_ref_ld(dt, x, off + k) - mean) * invstd;
        sdy += g;
        sdyx += (double)g * xh;
      }
    }
    if (dbias) dbias[ch] = tt_ref_beta_f32(dbias[ch], (float)sdy, beta_param);
    if (dgamma) dgamma[ch] = tt_ref_beta_f32(dgamma[ch], (float)sdyx, beta_param);
    if (!dx) continue;
    /* dx = gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat)) */
    a = gamma[ch] * invstd;
    mdy = (float)(sdy / (double)m);
    mdyx = (float)(sdyx / (double)m);
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * c + (size_t)ch) * hw;
      for (k = 0; k < (size_t)hw; k++) {
        float xh = (tt_ref_ld(dt, x, off + k) - mean) * invstd;
        float v = a * (ref_bn_dy(dt, relu, y, mask, dy, off + k) - mdy - xh * mdyx);
        tt_ref_st_beta(dt, dx, off + k, v, beta_dx);
      }
    }
  }
  return 0;
}

int tt_ref_bn_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                  const float *gamma, const float *save_mean, const float *save_invstd, void *dx, float *dgamma,
                  float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  return ref_bn_bwd(b, "bn_bwd", 0, n, c, hw, dt, x, NULL, NULL, dy, gamma, save_mean, save_invstd, dx, NULL, dgamma,
                    dbias, beta_dx, 0.0f, beta_param);
}

int tt_ref_bn_bwd_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *y,
                           const uint32_t *mask, void *dy, const float *gamma, const float *save_mean,
                           const float *save_invstd, void *dx, void *ds, float *dgamma, float *dbias, float beta_dx,
                           float beta_s, float beta_param, void *ws, size_t ws_bytes) {
  size_t bytes = (size_t)(n > 0 ? n : 0) * (size_t)(c > 0 ? c : 0) * (size_t)(hw > 0 ? hw : 0) * tt_dtype_size(dt);
  if (!y && !mask) return tt_ref_fail(b, "bn_bwd_add_relu: NULL y and mask (the ReLU's output or its mask is needed)");
  if (ds && ds == dy && beta_s != 0.0f)
    return tt_ref_fail(b, "bn_bwd_add_relu: ds may be dy only when beta_s == 0 (beta_s=%g)", (double)beta_s);
  if ((ds && ds != dy && ref_bn_overlap(ds, dy, bytes)) || (dx && dx != dy && ref_bn_overlap(dx, dy, bytes)) ||
      ref_bn_overlap(dx, ds, bytes))
    return tt_ref_fail(b, "bn_bwd_add_relu: dx or ds overlaps dy without being it, or dx overlaps ds");
  return ref_bn_bwd(b, "bn_bwd_add_relu", 1, n, c, hw, dt, x, mask ? NULL : y, mask, dy, gamma, save_mean, save_invstd,
                    dx, ds, dgamma, dbias, beta_dx, beta_s, beta_param);
}
