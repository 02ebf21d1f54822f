/* kernels/ref/ref_tokens.c — the token ops of the Vision Transformer: patch tokens (a class
 * token and a position embedding added to the patch embedding's output, [n, f, hw] ->
 * [n, cls + hw, f]) and token pooling ([n, t, f] -> [n, f]: the class token or the mean), forward
 * and backward; the reference forms the CPU backend also runs.
 *
 * Determinism: every loop is parallel over independent outputs with schedule(static), and the
 * parameter gradients (dcls, dpos) sum over the batch serially per element, so results do not
 * depend on the thread count. No workspace.
 */
#include "ref_internal.h"

static int ref_tok_check(tt_backend *b, const char *op, int n, int f, int hw, int cls, tt_dtype dt) {
  if (n < 1 || f < 1 || hw < 1) return tt_ref_fail(b, "%s: bad shape n=%d f=%d hw=%d (all must be >= 1)", op, n, f, hw);
  if (cls != 0 && cls != 1) return tt_ref_fail(b, "%s: cls must be 0 or 1 (got %d)", op, cls);
  return tt_ref_dt_check(b, op, dt);
}

int tt_ref_tokens_fwd(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *x, const float *cls_tok,
                      const float *pos, void *y) {
  ptrdiff_t row, rows;
  int nt = tt_ref_threads(b), t = hw + cls;
  (void)nt;
  if (ref_tok_check(b, "tokens_fwd", n, f, hw, cls, dt)) return -1;
  if (!x || !y) return tt_ref_fail(b, "tokens_fwd: NULL x or y");
  if ((cls_tok == NULL) != (cls == 0))
    return tt_ref_fail(b, "tokens_fwd: cls_tok must be given iff cls == 1 (cls=%d, cls_tok %s)", cls,
                       cls_tok ? "given" : "NULL");
  rows = (ptrdiff_t)n * t;
  /* one output token [f] per task: y[s, tok, :] */
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * f > TT_REF_PAR_MIN)
  for (row = 0; row < rows; row++) {
    int s = (int)(row / t), tok = (int)(row % t), c;
    size_t yo = (size_t)row * f;
    for (c = 0; c < f; c++) {
      float v = tok < cls ? cls_tok[c] : tt_ref_ld(dt, x, ((size_t)s * f + (size_t)c) * hw + (size_t)(tok - cls));
      if (pos) v += pos[(size_t)tok * f + c];
      tt_ref_st(dt, y, yo + c, v);
    }
  }
  return 0;
}

int tt_ref_tokens_bwd(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *dy, void *dx,
                      float *dcls, float *dpos, float beta_dx, float beta_param) {
  ptrdiff_t row, rows;
  int nt = tt_ref_threads(b), t = hw + cls;
  (void)nt;
  if (ref_tok_check(b, "tokens_bwd", n, f, hw, cls, dt)) return -1;
  if (!dy || !dx) return tt_ref_fail(b, "tokens_bwd: NULL dy or dx");
  if (dcls && !cls) return tt_ref_fail(b, "tokens_bwd: dcls given but cls == 0 (no class token)");
  /* dx[s, c, i] = dy[s, cls + i, c]: one (s, c) plane of dx per task */
  rows = (ptrdiff_t)n * f;
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * hw > TT_REF_PAR_MIN)
  for (row = 0; row < rows; row++) {
    int s = (int)(row / f), c = (int)(row % f), i;
    for (i = 0; i < hw; i++)
      tt_ref_st_beta(dt, dx, (size_t)row * hw + i, tt_ref_ld(dt, dy, ((size_t)s * t + (size_t)(cls + i)) * f + c),
                     beta_dx);
  }
  /* dpos[tok, c] and dcls[c]: sums over the batch in sample order, one token per task */
  if (dpos || dcls) {
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)n * t * f > TT_REF_PAR_MIN)
    for (row = 0; row < t; row++) {
      int c, s;
      for (c = 0; c < f; c++) {
        double acc = 0.0;
        float v;
        for (s = 0; s < n; s++) acc += tt_ref_ld(dt, dy, ((size_t)s * t + (size_t)row) * f + c);
        v = (float)acc;
        if (dpos) dpos[(size_t)row * f + c] = tt_ref_beta_f32(dpos[(size_t)row * f + c], v, beta_param);
        if (dcls && row == 0) dcls[c] = tt_ref_beta_f32(dcls[c], v, beta_param);
      }
    }
  }
  return 0;
}

static int ref_tok_pool_check(tt_backend *b, const char *op, int n, int t, int f, int mode, tt_dtype dt) {
  if (n < 1 || t < 1 || f < 1) return tt_ref_fail(b, "%s: bad shape n=%d t=%d f=%d (all must be >= 1)", op, n, t, f);
  if (mode != 0 && mode != 1) return tt_ref_fail(b, "%s: unknown mode %d (0: class token, 1: mean)", op, mode);
  return tt_ref_dt_check(b, op, dt);
}

int tt_ref_token_pool_fwd(tt_backend *b, int n, int t, int f, int mode, tt_dtype dt, const void *x, void *y) {
  ptrdiff_t row, rows = (ptrdiff_t)n * f;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_tok_pool_check(b, "token_pool_fwd", n, t, f, mode, dt)) return -1;
  if (!x || !y) return tt_ref_fail(b, "token_pool_fwd: NULL x or y");
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * (mode ? t : 1) > TT_REF_PAR_MIN)
  for (row = 0; row < rows; row++) {
    int s = (int)(row / f), c = (int)(row % f), i;
    size_t base = (size_t)s * t * f + c;
    if (mode == 0) {
      tt_ref_st(dt, y, (size_t)row, tt_ref_ld(dt, x, base));
    } else {
      double acc = 0.0;
      for (i = 0; i < t; i++) acc += tt_ref_ld(dt, x, base + (size_t)i * f);
      tt_ref_st(dt, y, (size_t)row, (float)(acc / (double)t));
    }
  }
  return 0;
}

int tt_ref_token_pool_bwd(tt_backend *b, int n, int t, int f, int mode, tt_dtype dt, const void *dy, void *dx,
                          float beta) {
  ptrdiff_t row, rows = (ptrdiff_t)n * t;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (ref_tok_pool_check(b, "token_pool_bwd", n, t, f, mode, dt)) return -1;
  if (!dy || !dx) return tt_ref_fail(b, "token_pool_bwd: NULL dy or dx");
  /* one token row dx[s, tok, :] per task */
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * f > TT_REF_PAR_MIN)
  for (row = 0; row < rows; row++) {
    int s = (int)(row / t), tok = (int)(row % t), c;
    size_t off = (size_t)row * f;
    if (mode == 0 && tok > 0) {
      if (beta == 1.0f) continue; /* untouched */
      for (c = 0; c < f; c++) tt_ref_st_beta(dt, dx, off + c, 0.0f, beta);
      continue;
    }
    for (c = 0; c < f; c++) {
      float g = tt_ref_ld(dt, dy, (size_t)s * f + c);
      tt_ref_st_beta(dt, dx, off + c, mode == 0 ? g : g / (float)t, beta);
    }
  }
  return 0;
}
