/* kernels/ref/ref_bn.c — batch norm over x [n, c, hw] (NCHW): the training forward (batch
 * statistics, running statistics updated), inference (running statistics), the apply of saved
 * statistics, and the backward (dx, dgamma, dbias).
 *
 * Every loop is parallel over channels and every reduction (a channel's mean, variance, dgamma,
 * dbias) is serial inside its task, in double, so results do not depend on the thread count.
 * 16-bit tensors are converted per element; no workspace is needed.
 */
#include <math.h>

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

int tt_ref_bn_fwd_train(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                        float eps, float *save_mean, float *save_invstd, int update_running, void *ws, size_t ws_bytes) {
  ptrdiff_t ch;
  int nt = tt_ref_threads(b);
  const size_t m = (size_t)n * hw;
  (void)nt;
  if (tt_ref_nchw_check(b, "bn_fwd_train", n, c, hw, dt)) return -1;
  if (!x || !gamma || !bias || !y || !save_mean || !save_invstd)
    return tt_ref_fail(b, "bn_fwd_train: NULL x, gamma, bias, y, save_mean or save_invstd");
  if (update_running && (!running_mean || !running_var))
    return tt_ref_fail(b, "bn_fwd_train: update_running set but running_mean or running_var is NULL");
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
    ref_bn_channel(dt, x, y, n, c, hw, ch, mean, invstd, g, bb);
  }
  return 0;
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

int tt_ref_bn_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                  const float *gamma, const float *save_mean, const float *save_invstd, void *dx, float *dgamma,
                  float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  ptrdiff_t ch;
  int nt = tt_ref_threads(b);
  const size_t m = (size_t)n * hw;
  (void)nt;
  if (tt_ref_nchw_check(b, "bn_bwd", n, c, hw, dt)) return -1;
  if (!x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_ref_fail(b, "bn_bwd: NULL x, dy, gamma, save_mean or save_invstd");
#pragma omp parallel for schedule(static) num_threads(nt) if (m * c > TT_REF_PAR_MIN)
  for (ch = 0; ch < c; ch++) {
    double sdy = 0.0, sdyx = 0.0;
    float mean = save_mean[ch], invstd = save_invstd[ch], a, mdy, mdyx;
    int i;
    size_t k;
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * c + (size_t)ch) * hw;
      for (k = 0; k < (size_t)hw; k++) {
        float g = tt_ref_ld(dt, dy, off + k);
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
        float v = a * (tt_ref_ld(dt, dy, off + k) - mdy - xh * mdyx);
        tt_ref_st_beta(dt, dx, off + k, v, beta_dx);
      }
    }
  }
  return 0;
}
