/* kernels/ref/ref_layernorm.c — layer norm over the last dimension f of x [rows, f] (PyTorch's
 * nn.LayerNorm(f)), forward and backward; the reference form the CPU backend also runs.
 *
 * Every value goes through tt_ref_ld / tt_ref_st, so a tensor dtype is read and written in one
 * place (ref.h); statistics are computed in fp32 with double sums. Determinism: the forward and
 * dx are parallel over independent rows; dgamma/dbeta are summed per column block, rows in
 * order, so results do not depend on the thread count. No workspace.
 */
#include <math.h>

#include "ref_internal.h"

static int ref_ln_check(tt_backend *b, const char *op, int rows, int f, tt_dtype dt) {
  if (rows <= 0 || f <= 0) return tt_ref_fail(b, "%s: bad shape rows=%d f=%d (both must be >= 1)", op, rows, f);
  return tt_ref_dt_check(b, op, dt);
}

int tt_ref_ln_fwd(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const float *gamma, const float *beta,
                  float eps, void *y, float *save_mean, float *save_invstd, void *ws, size_t ws_bytes) {
  ptrdiff_t r;
  int nt = tt_ref_threads(b);
  (void)nt, (void)ws, (void)ws_bytes;
  if (ref_ln_check(b, "ln_fwd", rows, f, dt)) return -1;
  if (!x || !gamma || !beta || !y) return tt_ref_fail(b, "ln_fwd: NULL x, gamma, beta or y");
  if (!(eps >= 0.0f)) return tt_ref_fail(b, "ln_fwd: eps %g must be >= 0", (double)eps);
  if ((save_mean == NULL) != (save_invstd == NULL))
    return tt_ref_fail(b, "ln_fwd: save_mean and save_invstd must both be given (training) or both NULL");
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * f > TT_REF_PAR_MIN)
  for (r = 0; r < rows; r++) {
    size_t off = (size_t)r * f, j;
    double sum = 0.0, sq = 0.0, mean_d;
    float mean, invstd;
    for (j = 0; j < (size_t)f; j++) sum += tt_ref_ld(dt, x, off + j);
    mean_d = sum / (double)f;
    for (j = 0; j < (size_t)f; j++) {
      double dv = tt_ref_ld(dt, x, off + j) - mean_d;
      sq += dv * dv;
    }
    mean = (float)mean_d;
    invstd = (float)(1.0 / sqrt(sq / (double)f + (double)eps));
    if (save_mean) {
      save_mean[r] = mean;
      save_invstd[r] = invstd;
    }
    for (j = 0; j < (size_t)f; j++)
      tt_ref_st(dt, y, off + j, (tt_ref_ld(dt, x, off + j) - mean) * invstd * gamma[j] + beta[j]);
  }
  return 0;
}

/* Columns per dgamma/dbeta task: each task sums its columns over all rows in row order. */
#define REF_TF_LN_COLS 64

int tt_ref_ln_bwd(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                  const float *save_mean, const float *save_invstd, void *dx, float *dgamma, float *dbeta,
                  float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  ptrdiff_t r, cb, nblk = ((ptrdiff_t)f + REF_TF_LN_COLS - 1) / REF_TF_LN_COLS;
  int nt = tt_ref_threads(b);
  (void)nt, (void)ws, (void)ws_bytes;
  if (ref_ln_check(b, "ln_bwd", rows, f, dt)) return -1;
  if (!x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_ref_fail(b, "ln_bwd: NULL x, dy, gamma, save_mean or save_invstd");
  if (dx == dy && beta_dx != 0.0f)
    return tt_ref_fail(b, "ln_bwd: dx may alias dy only when beta_dx == 0 (beta_dx=%g)", (double)beta_dx);
  if (dgamma || dbeta) {
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * f > TT_REF_PAR_MIN)
    for (cb = 0; cb < nblk; cb++) {
      double sg[REF_TF_LN_COLS], sb[REF_TF_LN_COLS];
      int j0 = (int)cb * REF_TF_LN_COLS, j1 = j0 + REF_TF_LN_COLS < f ? j0 + REF_TF_LN_COLS : f, j, i;
      for (j = 0; j < j1 - j0; j++) sg[j] = sb[j] = 0.0;
      for (i = 0; i < rows; i++) {
        size_t off = (size_t)i * f;
        float mean = save_mean[i], invstd = save_invstd[i];
        for (j = j0; j < j1; j++) {
          float g = tt_ref_ld(dt, dy, off + j);
          sg[j - j0] += (double)g * ((tt_ref_ld(dt, x, off + j) - mean) * invstd);
          sb[j - j0] += g;
        }
      }
      for (j = j0; j < j1; j++) {
        if (dgamma) dgamma[j] = tt_ref_beta_f32(dgamma[j], (float)sg[j - j0], beta_param);
        if (dbeta) dbeta[j] = tt_ref_beta_f32(dbeta[j], (float)sb[j - j0], beta_param);
      }
    }
  }
  if (!dx) return 0;
  /* dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, per row. Both means
   * are taken before any dx is written, so dx may alias dy (beta_dx == 0). */
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * f > TT_REF_PAR_MIN)
  for (r = 0; r < rows; r++) {
    size_t off = (size_t)r * f, j;
    float mean = save_mean[r], invstd = save_invstd[r], mg, mgx;
    double sg = 0.0, sgx = 0.0;
    for (j = 0; j < (size_t)f; j++) {
      float g = tt_ref_ld(dt, dy, off + j) * gamma[j];
      sg += g;
      sgx += (double)g * ((tt_ref_ld(dt, x, off + j) - mean) * invstd);
    }
    mg = (float)(sg / (double)f);
    mgx = (float)(sgx / (double)f);
    for (j = 0; j < (size_t)f; j++) {
      float g = tt_ref_ld(dt, dy, off + j) * gamma[j];
      float xh = (tt_ref_ld(dt, x, off + j) - mean) * invstd;
      tt_ref_st_beta(dt, dx, off + j, invstd * (g - mg - xh * mgx), beta_dx);
    }
  }
  return 0;
}

/* op_workspace of TT_OP_LN_FWD/BWD: none, but the call must be one the loops take. */
size_t tt_ref_ln_workspace(tt_backend *b, int rows, int f, tt_dtype dt) {
  if (ref_ln_check(b, "ln workspace", rows, f, dt)) return TT_WS_ERROR;
  return 0;
}
