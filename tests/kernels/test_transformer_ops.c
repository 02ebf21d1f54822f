/* tests/kernels/test_transformer_ops.c — the transformer ops of backend.h (layer norm, fused-QKV
 * attention, patch tokens, token pooling, GELU) on the reference backend ("ref:...") and the
 * oneDNN CPU backend ("cpu:..."), each against direct double-precision loops written here from
 * backend.h's comments, and backward against central finite differences.
 *
 * Finite differences as tests/kernels/test_ops.c: L = sum(r * y) in double, analytic gradient from the
 * backward with dy = r, numeric (L(p + h) - L(p - h)) / 2h with h = 1e-2, pass when
 * |analytic - numeric| <= 1e-2 * max(|analytic|, |numeric|) + 2e-3. Layer norm, softmax and
 * GELU are smooth, so the O(h^2) truncation error (~1e-4) is well inside. Attention dropout
 * keeps its mask fixed for a fixed seed, so the function stays differentiable.
 *
 * fp16: inputs are rounded to fp16 first so both paths see the same values; the fp16 result
 * must match the fp32 one within F16_TOL * max|fp32 result| (fp16 storage rounds at ~5e-4
 * relative; attention's probabilities and layer norm's normalisation each add one rounding of
 * a stored value, so 8e-3 leaves room for a few).
 *
 * Every call gets exactly the workspace op_workspace answers (no more), so an op that used
 * more than it asked for would read or write past a malloc'ed block (the sanitizer build).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPS_SEED 0x7a11ce5ull
#include "core/base/knobs.h"
#include "tests/kernels/ops_util.h"

static float *ffill(size_t n, float v) {
  float *p = (float *)malloc((n ? n : 1) * sizeof(float));
  size_t i;
  for (i = 0; i < n; i++) p[i] = v;
  return p;
}
static float *fcopy(const float *a, size_t n) {
  float *p = (float *)malloc((n ? n : 1) * sizeof(float));
  memcpy(p, a, n * sizeof(float));
  return p;
}
/* max |a - ref| / max(max|ref|, 1e-30) */
static double rel_vs_double(const float *a, const double *ref, size_t n) {
  double m = 0.0, s = 0.0;
  size_t i;
  for (i = 0; i < n; i++) {
    m = fmax(m, fabs((double)a[i] - ref[i]));
    s = fmax(s, fabs(ref[i]));
  }
  return m / fmax(s, 1e-30);
}
static int all_finite(const float *a, size_t n) {
  size_t i;
  for (i = 0; i < n; i++)
    if (!isfinite(a[i])) return 0;
  return 1;
}
static void from16(const uint16_t *h, float *a, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) a[i] = tt_f16_to_f32(h[i]);
}
#define F16_TOL 8e-3

/* Exactly the workspace op_workspace asks for (a 1-byte block when it asks for none). */
static size_t ws_of(tt_op_kind kind, tt_dtype dt, const tt_ln_desc *ln, const tt_attn_desc *at) {
  tt_op_desc op;
  memset(&op, 0, sizeof op);
  op.kind = kind;
  op.dt = dt;
  if (ln) op.u.ln = *ln;
  if (at) op.u.attn = *at;
  return B->op_workspace(B, &op);
}

/* ------------------------------------ layer norm ------------------------------------- */

typedef struct {
  int rows, f;
  float eps;
  float *x, *g, *bt, *r, *y;
  void *ws;
  size_t wsb;
} ln_ctx;

static double ln_loss(void *v) {
  ln_ctx *c = (ln_ctx *)v;
  if (B->ln_fwd(B, c->rows, c->f, TT_F32, c->x, c->g, c->bt, c->eps, c->y, NULL, NULL, c->ws, c->wsb)) return NAN;
  return dot(c->r, c->y, (size_t)c->rows * c->f);
}

static void test_ln(void) {
  const int rows = 7, f = 24;
  const size_t cnt = (size_t)rows * f;
  tt_ln_desc lnd;
  ln_ctx c;
  float *mean = ffill(rows, 0), *inv = ffill(rows, 0), *dx = ffill(cnt, NAN), *dg = ffill(f, NAN), *db = ffill(f, NAN);
  double *yref = (double *)malloc(cnt * sizeof(double));
  size_t wsf, wsb;
  void *wsfp, *wsbp;
  int i, j;
  lnd.rows = rows, lnd.f = f, lnd.eps = 1e-5f;
  wsf = ws_of(TT_OP_LN_FWD, TT_F32, &lnd, NULL);
  wsb = ws_of(TT_OP_LN_BWD, TT_F32, &lnd, NULL);
  wsfp = malloc(wsf ? wsf : 1);
  wsbp = malloc(wsb ? wsb : 1);
  c.rows = rows, c.f = f, c.eps = 1e-5f;
  c.x = fvec(cnt), c.g = fvec(f), c.bt = fvec(f), c.r = fvec(cnt), c.y = ffill(cnt, 0);
  for (i = 0; i < (int)cnt; i++) c.x[i] = c.x[i] * 3.0f + 0.5f; /* a non-zero mean */
  c.ws = wsfp, c.wsb = wsf;

  TT_TEST_BEGIN(tn("ln_fwd_vs_double"));
  TT_CHECK(wsf != TT_WS_ERROR && wsb != TT_WS_ERROR, "op_workspace failed: %s", B->last_error(B));
  TT_CHECK(B->ln_fwd(B, rows, f, TT_F32, c.x, c.g, c.bt, c.eps, c.y, mean, inv, wsfp, wsf) == 0, "ln_fwd: %s",
           B->last_error(B));
  for (i = 0; i < rows; i++) {
    double m = 0, v = 0, is;
    for (j = 0; j < f; j++) m += c.x[i * f + j];
    m /= f;
    for (j = 0; j < f; j++) v += (c.x[i * f + j] - m) * (c.x[i * f + j] - m);
    v /= f;
    is = 1.0 / sqrt(v + 1e-5);
    TT_CHECK(fabs(mean[i] - m) <= 1e-6 * (1 + fabs(m)) && fabs(inv[i] - is) <= 1e-5 * is, "row %d stats %g %g vs %g %g", i,
             (double)mean[i], (double)inv[i], m, is);
    for (j = 0; j < f; j++) yref[i * f + j] = (c.x[i * f + j] - m) * is * c.g[j] + c.bt[j];
  }
  TT_CHECK(rel_vs_double(c.y, yref, cnt) < 1e-5, "y rel err %g", rel_vs_double(c.y, yref, cnt));
  TT_TEST_END();

  TT_TEST_BEGIN(tn("ln_bwd_fd"));
  TT_CHECK(B->ln_bwd(B, rows, f, TT_F32, c.x, c.r, c.g, mean, inv, dx, dg, db, 0.0f, 0.0f, wsbp, wsb) == 0, "ln_bwd: %s",
           B->last_error(B));
  TT_CHECK(all_finite(dx, cnt) && all_finite(dg, f) && all_finite(db, f), "beta 0 kept a NaN of the old contents");
  fd_check("dx", ln_loss, &c, c.x, cnt, dx, 40);
  fd_check("dgamma", ln_loss, &c, c.g, f, dg, f);
  fd_check("dbeta", ln_loss, &c, c.bt, f, db, f);
  TT_TEST_END();

  TT_TEST_BEGIN(tn("ln_bwd_beta1"));
  {
    float *dx2 = fcopy(dx, cnt), *dg2 = fcopy(dg, f), *db2 = fcopy(db, f);
    float *dx0 = fvec(cnt), *dg0 = fvec(f), *db0 = fvec(f);
    float *dx1 = fcopy(dx0, cnt), *dg1 = fcopy(dg0, f), *db1 = fcopy(db0, f);
    TT_CHECK(B->ln_bwd(B, rows, f, TT_F32, c.x, c.r, c.g, mean, inv, dx1, dg1, db1, 1.0f, 1.0f, wsbp, wsb) == 0, "%s",
             B->last_error(B));
    for (i = 0; i < (int)cnt; i++) TT_CHECK(fabsf(dx1[i] - (dx0[i] + dx2[i])) <= 1e-5f, "dx[%d] not added into", i);
    for (j = 0; j < f; j++)
      TT_CHECK(fabsf(dg1[j] - (dg0[j] + dg2[j])) <= 1e-5f && fabsf(db1[j] - (db0[j] + db2[j])) <= 1e-5f,
               "dgamma/dbeta[%d] not added into", j);
    /* dx NULL: parameter gradients only (the CPU backend runs the loops then: equal to rounding);
     * dgamma NULL: dx only */
    TT_CHECK(B->ln_bwd(B, rows, f, TT_F32, c.x, c.r, c.g, mean, inv, NULL, dg1, NULL, 0.0f, 0.0f, wsbp, wsb) == 0 &&
                 maxdiff_rel(dg1, dg2, f) < 1e-6,
             "dgamma alone differs: %g", maxdiff_rel(dg1, dg2, f));
    TT_CHECK(B->ln_bwd(B, rows, f, TT_F32, c.x, c.r, c.g, mean, inv, dx1, NULL, NULL, 0.0f, 0.0f, wsbp, wsb) == 0 &&
                 memcmp(dx1, dx2, cnt * 4) == 0,
             "dx alone differs");
    free(dx2), free(dg2), free(db2), free(dx0), free(dg0), free(db0), free(dx1), free(dg1), free(db1);
  }
  TT_TEST_END();

  TT_TEST_BEGIN(tn("ln_f16"));
  {
    float *x = fcopy(c.x, cnt), *r = fcopy(c.r, cnt), *y32 = ffill(cnt, 0), *y16f = ffill(cnt, 0), *dx32 = ffill(cnt, 0),
          *dx16f = ffill(cnt, 0), *dg32 = ffill(f, 0), *dg16 = ffill(f, 0), *m16 = ffill(rows, 0), *i16 = ffill(rows, 0);
    uint16_t *x16, *r16, *y16 = (uint16_t *)calloc(cnt, 2), *dxh = (uint16_t *)calloc(cnt, 2);
    size_t wf16 = ws_of(TT_OP_LN_FWD, TT_F16, &lnd, NULL), wb16 = ws_of(TT_OP_LN_BWD, TT_F16, &lnd, NULL);
    void *w16f = malloc(wf16 ? wf16 : 1), *w16b = malloc(wb16 ? wb16 : 1);
    round16(x, cnt), round16(r, cnt);
    x16 = to16(x, cnt), r16 = to16(r, cnt);
    TT_CHECK(B->ln_fwd(B, rows, f, TT_F32, x, c.g, c.bt, c.eps, y32, mean, inv, wsfp, wsf) == 0, "%s", B->last_error(B));
    TT_CHECK(B->ln_bwd(B, rows, f, TT_F32, x, r, c.g, mean, inv, dx32, dg32, NULL, 0, 0, wsbp, wsb) == 0, "%s",
             B->last_error(B));
    TT_CHECK(B->ln_fwd(B, rows, f, TT_F16, x16, c.g, c.bt, c.eps, y16, m16, i16, w16f, wf16) == 0, "%s", B->last_error(B));
    TT_CHECK(B->ln_bwd(B, rows, f, TT_F16, x16, r16, c.g, m16, i16, dxh, dg16, NULL, 0, 0, w16b, wb16) == 0, "%s",
             B->last_error(B));
    from16(y16, y16f, cnt), from16(dxh, dx16f, cnt);
    TT_CHECK(maxdiff_rel(y16f, y32, cnt) < F16_TOL, "y fp16 vs fp32 %g", maxdiff_rel(y16f, y32, cnt));
    TT_CHECK(maxdiff_rel(dx16f, dx32, cnt) < F16_TOL, "dx fp16 vs fp32 %g", maxdiff_rel(dx16f, dx32, cnt));
    TT_CHECK(maxdiff_rel(dg16, dg32, f) < 1e-5, "dgamma fp16 vs fp32 %g (same inputs, fp32 sums)", maxdiff_rel(dg16, dg32, f));
    free(x), free(r), free(y32), free(y16f), free(dx32), free(dx16f), free(dg32), free(dg16), free(m16), free(i16);
    free(x16), free(r16), free(y16), free(dxh), free(w16f), free(w16b);
  }
  TT_TEST_END();

  TT_TEST_BEGIN(tn("ln_bad_args"));
  TT_CHECK(B->ln_fwd(B, 0, f, TT_F32, c.x, c.g, c.bt, c.eps, c.y, NULL, NULL, wsfp, wsf) != 0 &&
               strstr(B->last_error(B), "ln_fwd") != NULL,
           "rows 0 accepted or unnamed: %s", B->last_error(B));
  TT_CHECK(B->ln_fwd(B, rows, f, TT_F32, NULL, c.g, c.bt, c.eps, c.y, NULL, NULL, wsfp, wsf) != 0 &&
               strstr(B->last_error(B), "NULL") != NULL,
           "NULL x accepted: %s", B->last_error(B));
  TT_CHECK(B->ln_bwd(B, rows, f, TT_F32, c.x, c.r, c.g, NULL, inv, dx, dg, db, 0, 0, wsbp, wsb) != 0 &&
               strstr(B->last_error(B), "ln_bwd") != NULL,
           "NULL save_mean accepted: %s", B->last_error(B));
  TT_CHECK(B->ln_fwd(B, rows, f, (tt_dtype)7, c.x, c.g, c.bt, c.eps, c.y, NULL, NULL, wsfp, wsf) != 0 &&
               strstr(B->last_error(B), "dtype") != NULL,
           "an unknown dtype was accepted: %s", B->last_error(B));
  {
    tt_ln_desc bad = lnd;
    bad.f = 0;
    TT_CHECK(ws_of(TT_OP_LN_FWD, TT_F32, &bad, NULL) == TT_WS_ERROR, "op_workspace answered a size for f = 0");
  }
  TT_TEST_END();
  free(mean), free(inv), free(dx), free(dg), free(db), free(yref), free(wsfp), free(wsbp);
  free(c.x), free(c.g), free(c.bt), free(c.r), free(c.y);
}

/* ------------------------------------ attention -------------------------------------- */

/* Double-precision attention from backend.h's definition: o [n, t, heads, d], lse [n, heads, t],
 * probs [n, heads, t, t] (before dropout). */
static void attn_naive(const tt_attn_desc *d, const float *qkv, uint64_t seed, double *o, double *lse, double *probs) {
  int n = d->n, t = d->t, H = d->heads, D = d->d, f = H * D, s, h, i, j, c;
  uint32_t thr = d->p >= 1.0f ? 0u : (uint32_t)((double)d->p * 4294967296.0);
  double dsc = d->p >= 1.0f ? 0.0 : (double)(1.0f / (1.0f - d->p));
  double *sc = (double *)malloc((size_t)t * sizeof(double));
  for (s = 0; s < n; s++)
    for (h = 0; h < H; h++)
      for (i = 0; i < t; i++) {
        double m = -INFINITY, sum = 0.0;
        int jend = d->causal ? i + 1 : t;
        for (j = 0; j < jend; j++) {
          double acc = 0.0;
          for (c = 0; c < D; c++)
            acc += (double)qkv[((size_t)(s * t + i) * 3 + 0) * f + h * D + c] * qkv[((size_t)(s * t + j) * 3 + 1) * f + h * D + c];
          sc[j] = acc * d->scale;
          m = fmax(m, sc[j]);
        }
        for (j = 0; j < jend; j++) sum += exp(sc[j] - m);
        lse[((size_t)s * H + h) * t + i] = m + log(sum);
        for (c = 0; c < D; c++) o[((size_t)s * t + i) * f + h * D + c] = 0.0;
        for (j = 0; j < t; j++) {
          size_t pi = (((size_t)s * H + h) * t + i) * t + j;
          double pj = j < jend ? exp(sc[j] - m) / sum : 0.0, pd = pj;
          probs[pi] = pj;
          if (d->p > 0.0f) pd = ((uint32_t)(tt_dropout_hash(seed, pi) >> 32) >= thr && d->p < 1.0f) ? pj * dsc : 0.0;
          for (c = 0; c < D; c++) o[((size_t)s * t + i) * f + h * D + c] += pd * qkv[((size_t)(s * t + j) * 3 + 2) * f + h * D + c];
        }
      }
  free(sc);
}

typedef struct {
  tt_attn_desc d;
  float *qkv, *r, *o;
  uint64_t seed;
  void *ws;
  size_t wsb;
} at_ctx;

static double at_loss(void *v) {
  at_ctx *c = (at_ctx *)v;
  if (B->attn_fwd(B, &c->d, TT_F32, c->qkv, c->o, NULL, NULL, c->seed, c->ws, c->wsb)) return NAN;
  return dot(c->r, c->o, (size_t)c->d.n * c->d.t * c->d.heads * c->d.d);
}

static void test_attn_case(const char *name, int n, int t, int heads, int dd, int causal, float p) {
  tt_attn_desc d;
  size_t nq, no, nl, np, wsf, wsb;
  float *qkv, *o, *lse, *probs, *r, *g1, *g2, *tmp;
  double *oref, *lref, *pref;
  void *wf, *wb;
  uint64_t seed = 0xabcdef12345ull;
  at_ctx c;
  char nm[96];
  memset(&d, 0, sizeof d);
  d.n = n, d.t = t, d.heads = heads, d.d = dd, d.causal = causal, d.scale = (float)(1.0 / sqrt((double)dd)), d.p = p;
  nq = (size_t)n * t * 3 * heads * dd, no = (size_t)n * t * heads * dd, nl = (size_t)n * heads * t, np = nl * t;
  qkv = fvec(nq), o = ffill(no, NAN), lse = ffill(nl, NAN), probs = ffill(np, NAN), r = fvec(no);
  g1 = ffill(nq, NAN), g2 = ffill(nq, NAN);
  for (size_t i = 0; i < nq; i++) qkv[i] *= 1.5f; /* scores of a few units: a peaked softmax */
  oref = (double *)malloc(no * sizeof(double)), lref = (double *)malloc(nl * sizeof(double));
  pref = (double *)malloc(np * sizeof(double));
  wsf = ws_of(TT_OP_ATTN_FWD, TT_F32, NULL, &d), wsb = ws_of(TT_OP_ATTN_BWD, TT_F32, NULL, &d);
  wf = malloc(wsf != TT_WS_ERROR && wsf ? wsf : 1), wb = malloc(wsb != TT_WS_ERROR && wsb ? wsb : 1);

  snprintf(nm, sizeof nm, "attn_fwd_%s", name);
  TT_TEST_BEGIN(tn(nm));
  TT_CHECK(wsf != TT_WS_ERROR && wsb != TT_WS_ERROR, "op_workspace: %s", B->last_error(B));
  TT_CHECK(B->attn_fwd(B, &d, TT_F32, qkv, o, lse, probs, seed, wf, wsf) == 0, "attn_fwd: %s", B->last_error(B));
  attn_naive(&d, qkv, seed, oref, lref, pref);
  TT_CHECK(rel_vs_double(o, oref, no) < 2e-5, "o rel err %g", rel_vs_double(o, oref, no));
  TT_CHECK(rel_vs_double(lse, lref, nl) < 2e-6, "lse rel err %g", rel_vs_double(lse, lref, nl));
  TT_CHECK(rel_vs_double(probs, pref, np) < 2e-5, "probs rel err %g", rel_vs_double(probs, pref, np));
  if (causal) {
    size_t k;
    int bad = 0;
    for (k = 0; k < np; k++)
      if ((int)(k % t) > (int)((k / t) % t) && probs[k] != 0.0f) bad = 1;
    TT_CHECK(!bad, "a masked (j > i) probability is not 0");
  }
  {
    /* lse NULL and probs NULL (evaluation): the same o */
    float *o2 = ffill(no, NAN);
    TT_CHECK(B->attn_fwd(B, &d, TT_F32, qkv, o2, NULL, NULL, seed, wf, wsf) == 0 && memcmp(o, o2, no * 4) == 0,
             "o without lse/probs differs");
    free(o2);
  }
  TT_TEST_END();

  snprintf(nm, sizeof nm, "attn_bwd_%s", name);
  TT_TEST_BEGIN(tn(nm));
  /* kept probabilities and fused (rebuilt from lse): the same dqkv, bit for bit on the ref */
  TT_CHECK(B->attn_bwd(B, &d, TT_F32, qkv, o, r, lse, probs, seed, g1, 0.0f, wb, wsb) == 0, "attn_bwd: %s",
           B->last_error(B));
  TT_CHECK(B->attn_bwd(B, &d, TT_F32, qkv, o, r, lse, NULL, seed, g2, 0.0f, wb, wsb) == 0, "attn_bwd fused: %s",
           B->last_error(B));
  TT_CHECK(all_finite(g1, nq) && all_finite(g2, nq), "beta 0 kept a NaN of the old contents");
  TT_CHECK(maxdiff_rel(g2, g1, nq) < 1e-6, "fused vs kept-probs dqkv differ by %g", maxdiff_rel(g2, g1, nq));
  c.d = d, c.qkv = qkv, c.r = r, c.o = ffill(no, 0), c.seed = seed, c.ws = wf, c.wsb = wsf;
  fd_check("dqkv", at_loss, &c, qkv, nq, g1, 60);
  /* beta = 1 adds into dqkv */
  tmp = fvec(nq);
  {
    float *acc = fcopy(tmp, nq);
    size_t i;
    int bad = 0;
    TT_CHECK(B->attn_bwd(B, &d, TT_F32, qkv, o, r, lse, NULL, seed, acc, 1.0f, wb, wsb) == 0, "%s", B->last_error(B));
    for (i = 0; i < nq; i++)
      if (fabsf(acc[i] - (tmp[i] + g2[i])) > 1e-5f * (1.0f + fabsf(tmp[i]))) bad = 1;
    TT_CHECK(!bad, "beta 1 did not add into dqkv");
    free(acc);
  }
  free(tmp);
  free(c.o);
  TT_TEST_END();

  if (p == 0.0f) {
    snprintf(nm, sizeof nm, "attn_f16_%s", name);
    TT_TEST_BEGIN(tn(nm));
    {
      float *q32 = fcopy(qkv, nq), *r32 = fcopy(r, no), *o32 = ffill(no, 0), *l32 = ffill(nl, 0), *gq32 = ffill(nq, 0);
      float *of = ffill(no, 0), *l16 = ffill(nl, 0), *gf = ffill(nq, 0), *gf2 = ffill(nq, 0);
      uint16_t *q16, *r16, *o16 = (uint16_t *)calloc(no, 2), *g16 = (uint16_t *)calloc(nq, 2), *p16 = (uint16_t *)calloc(np, 2);
      size_t wf16 = ws_of(TT_OP_ATTN_FWD, TT_F16, NULL, &d), wb16 = ws_of(TT_OP_ATTN_BWD, TT_F16, NULL, &d);
      void *w16f = malloc(wf16 != TT_WS_ERROR ? wf16 : 1), *w16b = malloc(wb16 != TT_WS_ERROR ? wb16 : 1);
      round16(q32, nq), round16(r32, no);
      q16 = to16(q32, nq), r16 = to16(r32, no);
      TT_CHECK(B->attn_fwd(B, &d, TT_F32, q32, o32, l32, NULL, seed, wf, wsf) == 0, "%s", B->last_error(B));
      TT_CHECK(B->attn_bwd(B, &d, TT_F32, q32, o32, r32, l32, NULL, seed, gq32, 0.0f, wb, wsb) == 0, "%s", B->last_error(B));
      TT_CHECK(B->attn_fwd(B, &d, TT_F16, q16, o16, l16, p16, seed, w16f, wf16) == 0, "%s", B->last_error(B));
      TT_CHECK(B->attn_bwd(B, &d, TT_F16, q16, o16, r16, l16, NULL, seed, g16, 0.0f, w16b, wb16) == 0, "%s", B->last_error(B));
      from16(o16, of, no), from16(g16, gf, nq);
      TT_CHECK(maxdiff_rel(of, o32, no) < F16_TOL, "o fp16 vs fp32 %g", maxdiff_rel(of, o32, no));
      TT_CHECK(maxdiff_rel(l16, l32, nl) < 1e-6, "lse fp16 vs fp32 %g (same inputs, fp32 math)", maxdiff_rel(l16, l32, nl));
      TT_CHECK(maxdiff_rel(gf, gq32, nq) < F16_TOL, "dqkv fp16 vs fp32 %g", maxdiff_rel(gf, gq32, nq));
      TT_CHECK(B->attn_bwd(B, &d, TT_F16, q16, o16, r16, l16, p16, seed, g16, 0.0f, w16b, wb16) == 0, "%s", B->last_error(B));
      from16(g16, gf2, nq);
      TT_CHECK(maxdiff_rel(gf2, gf, nq) < F16_TOL, "fp16 kept-probs vs fused dqkv %g", maxdiff_rel(gf2, gf, nq));
      free(q32), free(r32), free(o32), free(l32), free(gq32), free(of), free(l16), free(gf), free(gf2);
      free(q16), free(r16), free(o16), free(g16), free(p16), free(w16f), free(w16b);
    }
    TT_TEST_END();
  }
  free(qkv), free(o), free(lse), free(probs), free(r), free(g1), free(g2), free(oref), free(lref), free(pref);
  free(wf), free(wb);
}

static void test_attn_dropout_rules(void) {
  tt_attn_desc d, d0;
  size_t nq, no, nl, wsf;
  float *qkv, *oa, *ob, *lse;
  void *wf;
  memset(&d, 0, sizeof d);
  d.n = 2, d.t = 5, d.heads = 2, d.d = 4, d.scale = 0.5f, d.p = 0.0f;
  d0 = d;
  nq = (size_t)d.n * d.t * 3 * d.heads * d.d, no = nq / 3, nl = (size_t)d.n * d.heads * d.t;
  qkv = fvec(nq), oa = ffill(no, 0), ob = ffill(no, 0), lse = ffill(nl, 0);
  d.p = 0.3f;
  wsf = ws_of(TT_OP_ATTN_FWD, TT_F32, NULL, &d);
  wf = malloc(wsf != TT_WS_ERROR ? wsf : 1);
  TT_TEST_BEGIN(tn("attn_dropout_rules"));
  /* p = 0: any seed gives the undropped output */
  TT_CHECK(B->attn_fwd(B, &d0, TT_F32, qkv, oa, lse, NULL, 1, wf, wsf) == 0 &&
               B->attn_fwd(B, &d0, TT_F32, qkv, ob, lse, NULL, 99, wf, wsf) == 0 && memcmp(oa, ob, no * 4) == 0,
           "p = 0 depends on the seed");
  /* p = 0.3: the same seed gives the same output, another seed another one */
  TT_CHECK(B->attn_fwd(B, &d, TT_F32, qkv, oa, lse, NULL, 7, wf, wsf) == 0 &&
               B->attn_fwd(B, &d, TT_F32, qkv, ob, lse, NULL, 7, wf, wsf) == 0 && memcmp(oa, ob, no * 4) == 0,
           "p = 0.3 is not reproducible for one seed");
  TT_CHECK(B->attn_fwd(B, &d, TT_F32, qkv, ob, lse, NULL, 8, wf, wsf) == 0 && memcmp(oa, ob, no * 4) != 0,
           "p = 0.3 ignores the seed");
  /* p = 1 drops everything */
  d.p = 1.0f;
  TT_CHECK(B->attn_fwd(B, &d, TT_F32, qkv, oa, lse, NULL, 7, wf, wsf) == 0 && maxabs(oa, no) == 0.0, "p = 1 kept something");
  TT_TEST_END();
  free(qkv), free(oa), free(ob), free(lse), free(wf);
}

/* The per-(sample, head) tasks are independent, so a one-thread backend of the same kind gives
 * the same bits as this one (on a shape big enough that the OpenMP loop runs in parallel). */
static void test_attn_threads(void) {
  tt_backend *one = strcmp(B->name, "cpu") == 0 ? tt_cpu_backend_create(1) : tt_ref_backend_create(1);
  tt_attn_desc d;
  size_t nq, no, nl, w0, w1, b0, b1;
  float *qkv, *r, *oa, *ob, *la, *lb, *ga, *gb;
  void *wa, *wb2, *xa, *xb;
  memset(&d, 0, sizeof d);
  d.n = 2, d.t = 40, d.heads = 4, d.d = 16, d.causal = 1, d.scale = 0.25f, d.p = 0.1f;
  nq = (size_t)d.n * d.t * 3 * d.heads * d.d, no = nq / 3, nl = (size_t)d.n * d.heads * d.t;
  qkv = fvec(nq), r = fvec(no), oa = ffill(no, 0), ob = ffill(no, 0), la = ffill(nl, 0), lb = ffill(nl, 0);
  ga = ffill(nq, 0), gb = ffill(nq, 0);
  TT_TEST_BEGIN(tn("attn_thread_count"));
  if (!one) {
    TT_CHECK(0, "could not create a one-thread %s backend", B->name);
    TT_TEST_END();
    return;
  }
  w0 = ws_of(TT_OP_ATTN_FWD, TT_F32, NULL, &d), b0 = ws_of(TT_OP_ATTN_BWD, TT_F32, NULL, &d);
  {
    tt_backend *keep = B;
    B = one;
    w1 = ws_of(TT_OP_ATTN_FWD, TT_F32, NULL, &d), b1 = ws_of(TT_OP_ATTN_BWD, TT_F32, NULL, &d);
    B = keep;
  }
  wa = malloc(w0), xa = malloc(b0), wb2 = malloc(w1), xb = malloc(b1);
  TT_CHECK(B->attn_fwd(B, &d, TT_F32, qkv, oa, la, NULL, 5, wa, w0) == 0 &&
               B->attn_bwd(B, &d, TT_F32, qkv, oa, r, la, NULL, 5, ga, 0.0f, xa, b0) == 0,
           "%s", B->last_error(B));
  TT_CHECK(one->attn_fwd(one, &d, TT_F32, qkv, ob, lb, NULL, 5, wb2, w1) == 0 &&
               one->attn_bwd(one, &d, TT_F32, qkv, ob, r, lb, NULL, 5, gb, 0.0f, xb, b1) == 0,
           "%s", one->last_error(one));
  TT_CHECK(memcmp(oa, ob, no * 4) == 0 && memcmp(la, lb, nl * 4) == 0, "o or lse depends on the thread count");
  TT_CHECK(memcmp(ga, gb, nq * 4) == 0, "dqkv depends on the thread count");
  TT_TEST_END();
  one->destroy(one);
  free(qkv), free(r), free(oa), free(ob), free(la), free(lb), free(ga), free(gb), free(wa), free(xa), free(wb2), free(xb);
}

static void test_attn_bad_args(void) {
  tt_attn_desc d, bad;
  size_t nq, no, nl, wsf, wsb;
  float *qkv, *o, *lse, *g;
  void *wf, *wb;
  memset(&d, 0, sizeof d);
  d.n = 1, d.t = 3, d.heads = 2, d.d = 2, d.scale = 0.7f;
  nq = (size_t)d.n * d.t * 3 * d.heads * d.d, no = nq / 3, nl = (size_t)d.n * d.heads * d.t;
  qkv = fvec(nq), o = ffill(no, 0), lse = ffill(nl, 0), g = ffill(nq, 0);
  wsf = ws_of(TT_OP_ATTN_FWD, TT_F32, NULL, &d), wsb = ws_of(TT_OP_ATTN_BWD, TT_F32, NULL, &d);
  wf = malloc(wsf + 1), wb = malloc(wsb + 1);
  TT_TEST_BEGIN(tn("attn_bad_args"));
  TT_CHECK(B->attn_fwd(B, &d, TT_F32, NULL, o, lse, NULL, 0, wf, wsf) != 0 && strstr(B->last_error(B), "NULL"),
           "NULL qkv accepted: %s", B->last_error(B));
  TT_CHECK(B->attn_fwd(B, NULL, TT_F32, qkv, o, lse, NULL, 0, wf, wsf) != 0, "NULL desc accepted");
  bad = d, bad.t = 0;
  TT_CHECK(B->attn_fwd(B, &bad, TT_F32, qkv, o, lse, NULL, 0, wf, wsf) != 0 && strstr(B->last_error(B), "t=0"),
           "t = 0 accepted or unnamed: %s", B->last_error(B));
  TT_CHECK(ws_of(TT_OP_ATTN_FWD, TT_F32, NULL, &bad) == TT_WS_ERROR, "op_workspace answered a size for t = 0");
  bad = d, bad.heads = 0; /* f % heads: a desc carries heads and d = f / heads, so 0 heads is the bad case */
  TT_CHECK(B->attn_fwd(B, &bad, TT_F32, qkv, o, lse, NULL, 0, wf, wsf) != 0 && strstr(B->last_error(B), "heads"),
           "heads = 0 accepted: %s", B->last_error(B));
  bad = d, bad.p = 1.5f;
  TT_CHECK(B->attn_fwd(B, &bad, TT_F32, qkv, o, lse, NULL, 0, wf, wsf) != 0, "dropout 1.5 accepted");
  if (wsf > 0)
    TT_CHECK(B->attn_fwd(B, &d, TT_F32, qkv, o, lse, NULL, 0, wf, wsf - 1) != 0 && strstr(B->last_error(B), "workspace"),
             "a short workspace accepted: %s", B->last_error(B));
  TT_CHECK(B->attn_fwd(B, &d, TT_F32, qkv, o, lse, NULL, 0, wf, wsf) == 0, "the good call failed: %s", B->last_error(B));
  TT_CHECK(B->attn_bwd(B, &d, TT_F32, qkv, o, o, NULL, NULL, 0, g, 0.0f, wb, wsb) != 0 && strstr(B->last_error(B), "lse"),
           "neither probs nor lse accepted: %s", B->last_error(B));
  TT_CHECK(B->attn_bwd(B, &d, TT_F32, qkv, o, NULL, lse, NULL, 0, g, 0.0f, wb, wsb) != 0, "NULL dout accepted");
  TT_CHECK(B->attn_bwd(B, &d, (tt_dtype)7, qkv, o, o, lse, NULL, 0, g, 0.0f, wb, wsb) != 0, "dtype 7 accepted");
  TT_TEST_END();
  free(qkv), free(o), free(lse), free(g), free(wf), free(wb);
}

/* ------------------------------- tokens and pooling ---------------------------------- */

static void test_tokens(void) {
  const int n = 3, f = 5, hw = 4;
  int cls, s, tok, c, usepos;
  TT_TEST_BEGIN(tn("tokens"));
  for (cls = 0; cls <= 1; cls++)
    for (usepos = 0; usepos <= 1; usepos++) {
      int t = hw + cls;
      size_t nx = (size_t)n * f * hw, ny = (size_t)n * t * f;
      float *x = fvec(nx), *ct = fvec(f), *pos = fvec((size_t)t * f), *y = ffill(ny, NAN), *dy = fvec(ny);
      float *dx = ffill(nx, NAN), *dcls = ffill(f, NAN), *dpos = ffill((size_t)t * f, NAN);
      float *dx0 = fvec(nx), *dx1, *dpos0 = fvec((size_t)t * f), *dpos1;
      const float *pp = usepos ? pos : NULL;
      TT_CHECK(B->tokens_fwd(B, n, f, hw, cls, TT_F32, x, cls ? ct : NULL, pp, y) == 0, "tokens_fwd: %s", B->last_error(B));
      for (s = 0; s < n; s++)
        for (tok = 0; tok < t; tok++)
          for (c = 0; c < f; c++) {
            float want = tok < cls ? ct[c] : x[((size_t)s * f + c) * hw + (tok - cls)];
            if (pp) want += pp[tok * f + c];
            TT_CHECK(y[((size_t)s * t + tok) * f + c] == want, "cls %d pos %d y[%d,%d,%d]", cls, usepos, s, tok, c);
          }
      TT_CHECK(B->tokens_bwd(B, n, f, hw, cls, TT_F32, dy, dx, cls ? dcls : NULL, usepos ? dpos : NULL, 0.0f, 0.0f) == 0,
               "tokens_bwd: %s", B->last_error(B));
      for (s = 0; s < n; s++)
        for (c = 0; c < f; c++)
          for (tok = 0; tok < hw; tok++)
            TT_CHECK(dx[((size_t)s * f + c) * hw + tok] == dy[((size_t)s * t + tok + cls) * f + c], "dx routing");
      for (tok = 0; tok < t && usepos; tok++)
        for (c = 0; c < f; c++) {
          double acc = 0;
          for (s = 0; s < n; s++) acc += dy[((size_t)s * t + tok) * f + c];
          TT_CHECK(fabs(dpos[tok * f + c] - acc) < 1e-6, "dpos[%d,%d] %g vs %g", tok, c, (double)dpos[tok * f + c], acc);
          if (cls && tok == 0) TT_CHECK(dcls[c] == dpos[c], "dcls[%d] != dpos[0,%d]", c, c);
        }
      /* beta 1: both add into */
      dx1 = fcopy(dx0, nx), dpos1 = fcopy(dpos0, (size_t)t * f);
      TT_CHECK(B->tokens_bwd(B, n, f, hw, cls, TT_F32, dy, dx1, NULL, dpos1, 1.0f, 1.0f) == 0, "%s", B->last_error(B));
      for (size_t i = 0; i < nx; i++) TT_CHECK(fabsf(dx1[i] - (dx0[i] + dx[i])) < 1e-6f, "dx beta 1 at %zu", i);
      if (usepos)
        for (size_t i = 0; i < (size_t)t * f; i++) TT_CHECK(fabsf(dpos1[i] - (dpos0[i] + dpos[i])) < 1e-6f, "dpos beta 1 at %zu", i);
      /* fp16: exact routing of rounded values */
      {
        uint16_t *x16 = to16(x, nx), *y16 = (uint16_t *)calloc(ny, 2);
        float *yf = ffill(ny, 0), *xr = fcopy(x, nx), *yr = ffill(ny, 0);
        round16(xr, nx);
        TT_CHECK(B->tokens_fwd(B, n, f, hw, cls, TT_F16, x16, cls ? ct : NULL, pp, y16) == 0, "%s", B->last_error(B));
        TT_CHECK(B->tokens_fwd(B, n, f, hw, cls, TT_F32, xr, cls ? ct : NULL, pp, yr) == 0, "%s", B->last_error(B));
        from16(y16, yf, ny);
        round16(yr, ny);
        TT_CHECK(memcmp(yf, yr, ny * 4) == 0, "fp16 tokens are not the rounded fp32 ones");
        free(x16), free(y16), free(yf), free(xr), free(yr);
      }
      free(x), free(ct), free(pos), free(y), free(dy), free(dx), free(dcls), free(dpos), free(dx0), free(dx1), free(dpos0),
          free(dpos1);
    }
  {
    float v[8] = {0};
    TT_CHECK(B->tokens_fwd(B, 1, 2, 2, 1, TT_F32, v, NULL, NULL, v) != 0 && strstr(B->last_error(B), "cls_tok"),
             "cls 1 without a class token accepted: %s", B->last_error(B));
    TT_CHECK(B->tokens_fwd(B, 1, 2, 0, 0, TT_F32, v, NULL, NULL, v) != 0, "hw 0 accepted");
    TT_CHECK(B->tokens_bwd(B, 1, 2, 2, 0, TT_F32, NULL, v, NULL, NULL, 0, 0) != 0, "NULL dy accepted");
  }
  TT_TEST_END();
}

static void test_token_pool(void) {
  const int n = 3, t = 5, f = 6;
  const size_t nx = (size_t)n * t * f, ny = (size_t)n * f;
  int mode, s, tok, c;
  float *x = fvec(nx), *dy = fvec(ny), *y = ffill(ny, NAN), *dx = ffill(nx, NAN), *dx0 = fvec(nx), *dx1;
  TT_TEST_BEGIN(tn("token_pool"));
  for (mode = 0; mode <= 1; mode++) {
    TT_CHECK(B->token_pool_fwd(B, n, t, f, mode, TT_F32, x, y) == 0, "fwd: %s", B->last_error(B));
    for (s = 0; s < n; s++)
      for (c = 0; c < f; c++) {
        double want = 0;
        if (mode == 0)
          want = x[(size_t)s * t * f + c];
        else {
          for (tok = 0; tok < t; tok++) want += x[((size_t)s * t + tok) * f + c];
          want /= t;
        }
        TT_CHECK(fabs(y[s * f + c] - want) < 1e-6, "mode %d y[%d,%d] %g vs %g", mode, s, c, (double)y[s * f + c], want);
      }
    for (size_t i = 0; i < nx; i++) dx[i] = NAN;
    TT_CHECK(B->token_pool_bwd(B, n, t, f, mode, TT_F32, dy, dx, 0.0f) == 0, "bwd: %s", B->last_error(B));
    for (s = 0; s < n; s++)
      for (tok = 0; tok < t; tok++)
        for (c = 0; c < f; c++) {
          float got = dx[((size_t)s * t + tok) * f + c];
          float want = mode == 0 ? (tok == 0 ? dy[s * f + c] : 0.0f) : dy[s * f + c] / (float)t;
          TT_CHECK(fabsf(got - want) < 1e-7f, "mode %d dx[%d,%d,%d] %g vs %g", mode, s, tok, c, (double)got, (double)want);
        }
    dx1 = fcopy(dx0, nx);
    TT_CHECK(B->token_pool_bwd(B, n, t, f, mode, TT_F32, dy, dx1, 1.0f) == 0, "bwd beta 1: %s", B->last_error(B));
    for (size_t i = 0; i < nx; i++) {
      int untouched = mode == 0 && (i / f) % t != 0;
      TT_CHECK(untouched ? dx1[i] == dx0[i] : fabsf(dx1[i] - (dx0[i] + dx[i])) < 1e-6f, "mode %d beta 1 at %zu", mode, i);
    }
    free(dx1);
    {
      uint16_t *x16 = to16(x, nx), *y16 = (uint16_t *)calloc(ny, 2);
      float *yf = ffill(ny, 0), *y32 = ffill(ny, 0), *xr = fcopy(x, nx);
      round16(xr, nx);
      TT_CHECK(B->token_pool_fwd(B, n, t, f, mode, TT_F16, x16, y16) == 0, "fp16: %s", B->last_error(B));
      TT_CHECK(B->token_pool_fwd(B, n, t, f, mode, TT_F32, xr, y32) == 0, "%s", B->last_error(B));
      from16(y16, yf, ny);
      TT_CHECK(maxdiff_rel(yf, y32, ny) < 1e-3, "fp16 pool mode %d %g", mode, maxdiff_rel(yf, y32, ny));
      free(x16), free(y16), free(yf), free(y32), free(xr);
    }
  }
  TT_CHECK(B->token_pool_fwd(B, n, t, f, 2, TT_F32, x, y) != 0 && strstr(B->last_error(B), "mode"), "mode 2 accepted");
  TT_CHECK(B->token_pool_fwd(B, n, 0, f, 0, TT_F32, x, y) != 0, "t 0 accepted");
  TT_CHECK(B->token_pool_bwd(B, n, t, f, 0, TT_F32, NULL, dx, 0.0f) != 0, "NULL dy accepted");
  TT_TEST_END();
  free(x), free(dy), free(y), free(dx), free(dx0);
}

/* ------------------------------------- GELU ------------------------------------------ */

typedef struct {
  tt_act a;
  size_t n;
  float *x, *y, *r;
} gelu_ctx;
static double gelu_loss(void *v) {
  gelu_ctx *c = (gelu_ctx *)v;
  if (B->act_fwd(B, c->a, c->n, TT_F32, c->x, c->y)) return NAN;
  return dot(c->r, c->y, c->n);
}

static void test_gelu(void) {
  const size_t n = 300;
  int k;
  TT_TEST_BEGIN(tn("gelu"));
  for (k = 0; k < 2; k++) {
    tt_act a = k ? TT_ACT_GELU_TANH : TT_ACT_GELU_ERF;
    gelu_ctx c;
    float *dx = ffill(n, NAN);
    size_t i;
    c.a = a, c.n = n, c.x = fvec(n), c.y = ffill(n, NAN), c.r = fvec(n);
    for (i = 0; i < n; i++) c.x[i] *= 4.0f;
    TT_CHECK(B->act_fwd(B, a, n, TT_F32, c.x, c.y) == 0, "act_fwd: %s", B->last_error(B));
    for (i = 0; i < n; i++) {
      double x = c.x[i], want = k ? 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)))
                                  : 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
      TT_CHECK(fabs(c.y[i] - want) <= 2e-6 * (1.0 + fabs(want)), "%s gelu(%g) = %g, want %g", k ? "tanh" : "erf", x,
               (double)c.y[i], want);
    }
    TT_CHECK(B->act_bwd(B, a, n, TT_F32, c.x, c.r, dx, 0.0f) == 0, "act_bwd: %s", B->last_error(B));
    fd_check(k ? "gelu_tanh dx" : "gelu_erf dx", gelu_loss, &c, c.x, n, dx, 60);
    {
      uint16_t *x16 = to16(c.x, n), *y16 = (uint16_t *)calloc(n, 2);
      float *yf = ffill(n, 0), *xr = fcopy(c.x, n), *y32 = ffill(n, 0);
      round16(xr, n);
      TT_CHECK(B->act_fwd(B, a, n, TT_F16, x16, y16) == 0 && B->act_fwd(B, a, n, TT_F32, xr, y32) == 0, "%s", B->last_error(B));
      from16(y16, yf, n);
      TT_CHECK(maxdiff_rel(yf, y32, n) < 1e-3, "fp16 gelu %g", maxdiff_rel(yf, y32, n));
      free(x16), free(y16), free(yf), free(xr), free(y32);
    }
    free(dx), free(c.x), free(c.y), free(c.r);
  }
  TT_TEST_END();
}

static void test_backend(void) {
  if (!B->ln_fwd || !B->ln_bwd || !B->attn_fwd || !B->attn_bwd || !B->tokens_fwd || !B->tokens_bwd ||
      !B->token_pool_fwd || !B->token_pool_bwd) {
    TT_TEST_BEGIN(tn("transformer_entries"));
    TT_CHECK(0, "the %s backend leaves a transformer entry NULL", B->name);
    TT_TEST_END();
    return;
  }
  test_ln();
  test_attn_case("plain", 2, 6, 2, 4, 0, 0.0f);
  test_attn_case("causal", 2, 7, 3, 2, 1, 0.0f);
  test_attn_case("dropout", 2, 6, 2, 3, 0, 0.3f);
  test_attn_case("causal_dropout", 1, 9, 2, 4, 1, 0.3f);
  test_attn_case("one_token", 3, 1, 1, 5, 0, 0.0f);
  test_attn_case("long", 1, 37, 2, 8, 0, 0.0f); /* odd t, several sgemm blocks */
  test_attn_case("threaded", 2, 40, 4, 16, 1, 0.1f); /* n*heads*t*t*d past the parallel threshold */
  test_attn_threads();
  test_attn_dropout_rules();
  test_attn_bad_args();
  test_tokens();
  test_token_pool();
  test_gelu();
}

/* Every check of test_backend on backend k (0: the reference, 1: oneDNN). */
static void test_on(int k) {
  B = k ? tt_cpu_backend_create(0) : tt_ref_backend_create(0);
  if (!B) {
    printf("FAIL test_transformer_ops: could not create the %s backend\n", k ? "oneDNN CPU" : "reference");
    tt_test_failures++;
    return;
  }
  test_backend();
  B->destroy(B);
}
static void test_ref(void) { test_on(0); }
static void test_onednn(void) { test_on(1); }

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("ref", "kernels transformer ref", test_ref),
  TT_TEST("cpu", "kernels transformer cpu onednn", test_onednn),
};

int main(int argc, char **argv) {
  tt_cpu_isa_hold(tt_knobs_get()->be.cpu_isa, NULL, 0); /* TINYTRAIN_CPU_ISA, for the backends made without knobs */
  return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL);
}
