/* tests/kernels/test_ops.c — per-op tests of the CPU backends: every check below runs on the reference
 * backend (kernels/ref/, names "ref:...") and on the oneDNN backend (kernels/cpu/, "cpu:..."),
 * each against direct double-precision formulas and finite differences. (The two backends
 * against each other, op by op and shape by shape, are tests/kernels/test_cpu_vs_ref.c.)
 *
 * Finite differences: for y = f(x, w) pick random r, L = sum(r * y) accumulated in double;
 * the analytic gradients come from the bwd functions with dy = r; the numeric ones are
 * (L(p + h) - L(p - h)) / 2h with h = 1e-2. Pass when
 *     |analytic - numeric| <= 1e-2 * max(|analytic|, |numeric|) + 2e-3.
 * Most ops are linear in the perturbed variable (conv, linear, pooling, gap, add) so the
 * difference quotient is exact up to fp32 rounding; for the smooth non-linear ones (batch
 * norm, SiLU, softmax) the O(h^2) truncation error is ~1e-4, well inside the tolerance. For
 * ReLU/ReLU6 and max pooling the inputs are kept at least 3h away from kinks and ties.
 *
 * fp16 vs fp32: inputs are rounded to fp16 first, so both paths see the same values; the
 * fp16 result must agree with the fp32 one within 4e-3 * max|fp32 result| per element (fp16
 * keeps 11 significant bits: storage rounding is ~5e-4 relative).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPS_SEED 0x1234567ull
#include "core/base/knobs.h"
#include "tests/kernels/ops_util.h"

/* Batch norm and pooling take a workspace (the oneDNN backend's scratchpad and staging): these
 * tests give every call this one, larger than any of them asks (test_cpu_vs_ref.c gives each
 * call exactly its op_workspace). */
#define WSB ((size_t)64 << 20)
static void *WS;

static float *fnan(size_t n) {
  float *p = (float *)malloc((n ? n : 1) * sizeof(float));
  size_t i;
  for (i = 0; i < n; i++) p[i] = NAN;
  return p;
}
static void *wsalloc(size_t bytes) { return malloc(bytes ? bytes : 1); }

/* fp16 helpers */
static float *from16(const uint16_t *h, size_t n) {
  float *a = (float *)malloc((n ? n : 1) * 4);
  size_t i;
  for (i = 0; i < n; i++) a[i] = tt_f16_to_f32(h[i]);
  return a;
}
#define F16_TOL 4e-3

/* ------------------------------- fp16 conversion --------------------------------------- */
static uint16_t hbits(float f) { return tt_f32_to_f16(f); }
static void test_f16_conversion(void) {
  uint32_t u;
  int bad = 0;
  TT_TEST_BEGIN(tn("f16_conversion"));
  TT_CHECK(hbits(0.0f) == 0x0000 && hbits(-0.0f) == 0x8000, "zeros");
  TT_CHECK(hbits(1.0f) == 0x3c00 && hbits(-2.0f) == 0xc000, "1 and -2");
  TT_CHECK(hbits(65504.0f) == 0x7bff && hbits(65519.0f) == 0x7bff, "max half");
  TT_CHECK(hbits(65520.0f) == 0x7c00 && hbits(1e6f) == 0x7c00 && hbits(-1e30f) == 0xfc00, "overflow to inf");
  TT_CHECK(hbits(INFINITY) == 0x7c00 && hbits(-INFINITY) == 0xfc00, "inf");
  TT_CHECK((hbits(NAN) & 0x7c00) == 0x7c00 && (hbits(NAN) & 0x3ff) != 0, "NaN stays NaN");
  TT_CHECK(hbits(ldexpf(1.0f, -24)) == 0x0001, "smallest subnormal");
  TT_CHECK(hbits(ldexpf(1.0f, -25)) == 0x0000, "2^-25 ties to even zero");
  TT_CHECK(hbits(ldexpf(1.0001f, -25)) == 0x0001, "just above 2^-25");
  TT_CHECK(hbits(ldexpf(1.5f, -24)) == 0x0002 && hbits(ldexpf(2.5f, -24)) == 0x0002, "subnormal ties to even");
  TT_CHECK(hbits(ldexpf(1.0f, -14)) == 0x0400 && hbits(ldexpf(1023.5f, -24)) == 0x0400, "smallest normal");
  TT_CHECK(hbits(1.0f + ldexpf(1.0f, -11)) == 0x3c00, "tie to even (down)");
  TT_CHECK(hbits(1.0f + 3.0f * ldexpf(1.0f, -11)) == 0x3c02, "tie to even (up)");
  TT_CHECK(hbits(1e-10f) == 0 && hbits(-1e-10f) == 0x8000, "underflow to signed zero");
  TT_CHECK(isinf(tt_f16_to_f32(0x7c00)) && isnan(tt_f16_to_f32(0x7e00)) && tt_f16_to_f32(0x0001) == ldexpf(1.0f, -24),
           "f16 -> f32 specials");
  for (u = 0; u < 65536u; u++) { /* every half round-trips */
    uint16_t h = (uint16_t)u;
    float f = tt_f16_to_f32(h);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
      if (!isnan(f) || (tt_f32_to_f16(f) & 0x7fff) <= 0x7c00) bad++;
    } else if (tt_f32_to_f16(f) != h) {
      bad++;
    }
  }
  TT_CHECK(bad == 0, "%d half values do not round-trip", bad);
#if defined(__FLT16_MAX__) && !defined(__cplusplus)
  { /* random floats against the compiler's own conversion */
    int i, mism = 0;
    for (i = 0; i < 200000; i++) {
      uint32_t r32 = (uint32_t)(urand() * 4294967296.0);
      float f;
      _Float16 h16;
      uint16_t ref;
      r32 = (r32 & 0x80000000u) | (0x30000000u + r32 % 0x18000000u); /* ~2^-31 .. 2^17 */
      memcpy(&f, &r32, 4);
      h16 = (_Float16)f;
      memcpy(&ref, &h16, 2);
      if (ref != tt_f32_to_f16(f)) mism++;
    }
    TT_CHECK(mism == 0, "%d random floats differ from _Float16 conversion", mism);
  }
#endif
  TT_TEST_END();
}

/* ------------------------------- convolution ------------------------------------------ */
typedef struct conv_ctx {
  tt_conv_desc d;
  float *x, *w, *bias, *y, *r;
  void *ws;
  size_t ws_bytes;
} conv_ctx;

static size_t conv_xn(const tt_conv_desc *d) { return (size_t)d->n * d->c * d->h * d->w; }
static size_t conv_wn(const tt_conv_desc *d) { return (size_t)d->k * (d->c / d->groups) * d->r * d->s; }
static size_t conv_yn(const tt_conv_desc *d) { return (size_t)d->n * d->k * d->p * d->q; }
static tt_conv_desc mkconv(int n, int c, int h, int w, int k, int r, int s, int sh, int sw, int ph, int pw, int g) {
  tt_conv_desc d;
  memset(&d, 0, sizeof d); /* backend.h: zero the whole desc (layout_w 0: KCRS) */
  d.n = n; d.c = c; d.h = h; d.w = w; d.k = k; d.r = r; d.s = s;
  d.stride_h = sh; d.stride_w = sw; d.pad_h = ph; d.pad_w = pw; d.groups = g;
  d.layout_x = d.layout_y = TT_LAYOUT_NCHW;
  d.p = (h + 2 * ph - r) / sh + 1;
  d.q = (w + 2 * pw - s) / sw + 1;
  return d;
}
static size_t conv_ws_max(const tt_conv_desc *d, tt_dtype dt) {
  size_t a = B->conv_workspace(B, d, dt, TT_WS_FWD), b = B->conv_workspace(B, d, dt, TT_WS_BWD_DATA);
  size_t c = B->conv_workspace(B, d, dt, TT_WS_BWD_FILTER);
  return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

/* Direct convolution in double: y, and the three gradients for dy. */
static void conv_naive(const tt_conv_desc *d, const float *x, const float *w, const float *bias, const float *dy,
                       double *y, double *dx, double *dw, double *db) {
  int n, k, c, p, q, r, s, G = d->groups, Cg = d->c / G, Kg = d->k / G;
  if (y) memset(y, 0, conv_yn(d) * sizeof(double));
  if (dx) memset(dx, 0, conv_xn(d) * sizeof(double));
  if (dw) memset(dw, 0, conv_wn(d) * sizeof(double));
  if (db) memset(db, 0, (size_t)d->k * sizeof(double));
  for (n = 0; n < d->n; n++)
    for (k = 0; k < d->k; k++)
      for (p = 0; p < d->p; p++)
        for (q = 0; q < d->q; q++) {
          size_t yi = (((size_t)n * d->k + k) * d->p + p) * d->q + q;
          double acc = bias ? bias[k] : 0.0, g = dy ? dy[yi] : 0.0;
          int gi = k / Kg;
          for (c = 0; c < Cg; c++)
            for (r = 0; r < d->r; r++)
              for (s = 0; s < d->s; s++) {
                int ih = p * d->stride_h - d->pad_h + r, iw = q * d->stride_w - d->pad_w + s;
                size_t xi, wi;
                if (ih < 0 || ih >= d->h || iw < 0 || iw >= d->w) continue;
                xi = (((size_t)n * d->c + gi * Cg + c) * d->h + ih) * d->w + iw;
                wi = (((size_t)k * Cg + c) * d->r + r) * d->s + s;
                acc += (double)x[xi] * w[wi];
                if (dx) dx[xi] += g * w[wi];
                if (dw) dw[wi] += g * x[xi];
              }
          if (y) y[yi] = acc;
          if (db) db[k] += g;
        }
}

static double conv_loss(void *vctx) {
  conv_ctx *c = (conv_ctx *)vctx;
  int rc = B->conv_fwd(B, &c->d, TT_F32, c->x, c->w, c->bias, c->y, c->ws, c->ws_bytes);
  if (rc) return NAN;
  return dot(c->r, c->y, conv_yn(&c->d));
}

static int check_vs_double(const float *a, const double *ref, size_t n, double tol) {
  size_t i;
  double m = 0.0;
  for (i = 0; i < n; i++) m = fmax(m, fabs(ref[i]));
  for (i = 0; i < n; i++)
    if (fabs((double)a[i] - ref[i]) > tol * (m + 1e-30)) return (int)i + 1;
  return 0;
}

static void test_conv_case(const char *name, tt_conv_desc d, int with_bias) {
  conv_ctx c;
  size_t xn = conv_xn(&d), wn = conv_wn(&d), yn = conv_yn(&d), i;
  float *dx, *dw, *db, *dx2, *dw2, *db2, *old;
  double *ry, *rdx, *rdw, *rdb;
  int bad;
  TT_TEST_BEGIN(tn(name));
  c.d = d;
  c.x = fvec(xn);
  c.w = fvec(wn);
  c.bias = with_bias ? fvec((size_t)d.k) : NULL;
  c.y = fnan(yn);
  c.r = fvec(yn);
  c.ws_bytes = conv_ws_max(&d, TT_F32);
  c.ws = wsalloc(c.ws_bytes);
  dx = fnan(xn);
  dw = fnan(wn);
  db = fnan((size_t)d.k);
  TT_CHECK(!B->conv_fwd(B, &d, TT_F32, c.x, c.w, c.bias, c.y, c.ws, c.ws_bytes), "conv_fwd: %s", B->last_error(B));
  TT_CHECK(!B->conv_bwd_data(B, &d, TT_F32, c.r, c.w, dx, 0.0f, c.ws, c.ws_bytes), "bwd_data: %s", B->last_error(B));
  TT_CHECK(!B->conv_bwd_filter(B, &d, TT_F32, c.x, c.r, dw, with_bias ? db : NULL, 0.0f, c.ws, c.ws_bytes),
           "bwd_filter: %s", B->last_error(B));
  /* forward and all gradients against the direct double-precision convolution */
  ry = (double *)malloc(yn * sizeof(double));
  rdx = (double *)malloc(xn * sizeof(double));
  rdw = (double *)malloc(wn * sizeof(double));
  rdb = (double *)malloc((size_t)d.k * sizeof(double));
  conv_naive(&d, c.x, c.w, c.bias, c.r, ry, rdx, rdw, rdb);
  bad = check_vs_double(c.y, ry, yn, 1e-5);
  TT_CHECK(!bad, "forward differs from direct conv at %d", bad - 1);
  bad = check_vs_double(dx, rdx, xn, 1e-5);
  TT_CHECK(!bad, "bwd_data differs from direct conv at %d", bad - 1);
  bad = check_vs_double(dw, rdw, wn, 1e-5);
  TT_CHECK(!bad, "bwd_filter differs from direct conv at %d", bad - 1);
  if (with_bias) {
    bad = check_vs_double(db, rdb, (size_t)d.k, 1e-5);
    TT_CHECK(!bad, "bias grad differs at %d", bad - 1);
  }
  /* finite differences */
  fd_check("dx", conv_loss, &c, c.x, xn, dx, 40);
  fd_check("dw", conv_loss, &c, c.w, wn, dw, 40);
  if (with_bias) fd_check("db", conv_loss, &c, c.bias, (size_t)d.k, db, 40);
  /* beta = 1 accumulates */
  old = fvec(xn > wn ? xn : wn);
  dx2 = (float *)malloc(xn * 4);
  dw2 = (float *)malloc(wn * 4);
  db2 = (float *)malloc((size_t)d.k * 4);
  memcpy(dx2, old, xn * 4);
  memcpy(dw2, old, wn * 4);
  for (i = 0; i < (size_t)d.k; i++) db2[i] = old[i];
  B->conv_bwd_data(B, &d, TT_F32, c.r, c.w, dx2, 1.0f, c.ws, c.ws_bytes);
  B->conv_bwd_filter(B, &d, TT_F32, c.x, c.r, dw2, with_bias ? db2 : NULL, 1.0f, c.ws, c.ws_bytes);
  for (i = 0; i < xn; i++) TT_CHECK(fabsf(dx2[i] - (old[i] + dx[i])) <= 1e-5f * (1 + fabsf(dx[i])), "beta=1 dx[%zu]", i);
  for (i = 0; i < wn; i++) TT_CHECK(fabsf(dw2[i] - (old[i] + dw[i])) <= 1e-5f * (1 + fabsf(dw[i])), "beta=1 dw[%zu]", i);
  if (with_bias)
    for (i = 0; i < (size_t)d.k; i++)
      TT_CHECK(fabsf(db2[i] - (old[i] + db[i])) <= 1e-5f * (1 + fabsf(db[i])), "beta=1 db[%zu]", i);
  TT_TEST_END();
  free(c.x); free(c.w); free(c.bias); free(c.y); free(c.r); free(c.ws);
  free(dx); free(dw); free(db); free(dx2); free(dw2); free(db2); free(old);
  free(ry); free(rdx); free(rdw); free(rdb);
}

/* A conv big enough that the 32 MiB chunk rule splits the batch (3 + 1 samples): checks
 * the chunked path against the direct conv, the workspace contract and determinism. */
static void test_conv_chunked(void) {
  tt_conv_desc d = mkconv(4, 16, 128, 128, 24, 3, 3, 1, 1, 1, 1, 1);
  size_t xn = conv_xn(&d), wn = conv_wn(&d), yn = conv_yn(&d), ws_f, ws_d, ws_w, ws_max, per;
  float *x = fvec(xn), *w = fvec(wn), *bias = fvec(24), *y = fnan(yn), *dy = fvec(yn), *dx = fnan(xn);
  float *dw = fnan(wn), *db = fnan(24), *dw2 = fnan(wn), *db2 = fnan(24);
  double *ry = (double *)malloc(yn * 8), *rdx = (double *)malloc(xn * 8), *rdw = (double *)malloc(wn * 8),
         *rdb = (double *)malloc(24 * 8);
  void *ws;
  int bad, rc;
  TT_TEST_BEGIN(tn("conv_chunked_workspace_determinism"));
  ws_f = B->conv_workspace(B, &d, TT_F32, TT_WS_FWD);
  ws_d = B->conv_workspace(B, &d, TT_F32, TT_WS_BWD_DATA);
  ws_w = B->conv_workspace(B, &d, TT_F32, TT_WS_BWD_FILTER);
  per = (size_t)(16 * 9 + 24) * 128 * 128 * 4;
  TT_CHECK(ws_f == ws_d && ws_f == ws_w && ws_f == 3 * per, "workspace %zu %zu %zu, expected 3 samples = %zu", ws_f,
           ws_d, ws_w, 3 * per);
  TT_CHECK(B->conv_workspace(B, &d, TT_F32, TT_WS_FWD) == ws_f, "workspace query not deterministic");
  TT_CHECK(B->conv_workspace(B, &d, TT_F16, TT_WS_FWD) > ws_f, "fp16 workspace must include weight copies");
  ws_max = conv_ws_max(&d, TT_F32);
  ws = wsalloc(ws_max);
  rc = B->conv_fwd(B, &d, TT_F32, x, w, bias, y, ws, ws_f - 1);
  TT_CHECK(rc != 0 && strstr(B->last_error(B), "conv_fwd") && strstr(B->last_error(B), "workspace"),
           "too small workspace not reported: %s", B->last_error(B));
  TT_CHECK(!B->conv_fwd(B, &d, TT_F32, x, w, bias, y, ws, ws_f), "%s", B->last_error(B));
  TT_CHECK(!B->conv_bwd_data(B, &d, TT_F32, dy, w, dx, 0.0f, ws, ws_d), "%s", B->last_error(B));
  TT_CHECK(!B->conv_bwd_filter(B, &d, TT_F32, x, dy, dw, db, 0.0f, ws, ws_w), "%s", B->last_error(B));
  conv_naive(&d, x, w, bias, dy, ry, rdx, rdw, rdb);
  bad = check_vs_double(y, ry, yn, 1e-5);
  TT_CHECK(!bad, "chunked forward differs at %d", bad - 1);
  bad = check_vs_double(dx, rdx, xn, 1e-5);
  TT_CHECK(!bad, "chunked bwd_data differs at %d", bad - 1);
  bad = check_vs_double(dw, rdw, wn, 1e-5);
  TT_CHECK(!bad, "chunked bwd_filter differs at %d", bad - 1);
  bad = check_vs_double(db, rdb, 24, 1e-5);
  TT_CHECK(!bad, "chunked bias grad differs at %d", bad - 1);
  TT_CHECK(!B->conv_bwd_filter(B, &d, TT_F32, x, dy, dw2, db2, 0.0f, ws, ws_w), "%s", B->last_error(B));
  TT_CHECK(!memcmp(dw, dw2, wn * 4) && !memcmp(db, db2, 24 * 4), "conv_bwd_filter is not bit-identical run to run");
  TT_TEST_END();
  free(x); free(w); free(bias); free(y); free(dy); free(dx); free(dw); free(db); free(dw2); free(db2);
  free(ry); free(rdx); free(rdw); free(rdb); free(ws);
}

static void test_conv_f16(void) {
  tt_conv_desc d = mkconv(3, 4, 9, 8, 6, 3, 3, 2, 1, 1, 1, 2);
  size_t xn = conv_xn(&d), wn = conv_wn(&d), yn = conv_yn(&d);
  float *x = fvec(xn), *w = fvec(wn), *bias = fvec(6), *dy = fvec(yn), *y = fnan(yn), *dx = fnan(xn);
  float *dw = fnan(wn), *db = fnan(6), *dw16 = fnan(wn), *db16 = fnan(6), *y16f, *dx16f;
  uint16_t *x16, *w16, *b16, *dy16, *y16, *dx16;
  size_t ws16 = conv_ws_max(&d, TT_F16), ws32 = conv_ws_max(&d, TT_F32);
  void *ws = wsalloc(ws16 > ws32 ? ws16 : ws32);
  TT_TEST_BEGIN(tn("conv_fp16_vs_fp32"));
  round16(x, xn); round16(w, wn); round16(bias, 6); round16(dy, yn);
  x16 = to16(x, xn); w16 = to16(w, wn); b16 = to16(bias, 6); dy16 = to16(dy, yn);
  y16 = to16(y, yn); dx16 = to16(dx, xn); /* NaN garbage */
  B->conv_fwd(B, &d, TT_F32, x, w, bias, y, ws, ws32);
  B->conv_bwd_data(B, &d, TT_F32, dy, w, dx, 0.0f, ws, ws32);
  B->conv_bwd_filter(B, &d, TT_F32, x, dy, dw, db, 0.0f, ws, ws32);
  TT_CHECK(!B->conv_fwd(B, &d, TT_F16, x16, w16, b16, y16, ws, B->conv_workspace(B, &d, TT_F16, TT_WS_FWD)), "%s",
           B->last_error(B));
  TT_CHECK(!B->conv_bwd_data(B, &d, TT_F16, dy16, w16, dx16, 0.0f, ws, B->conv_workspace(B, &d, TT_F16, TT_WS_BWD_DATA)),
           "%s", B->last_error(B));
  TT_CHECK(!B->conv_bwd_filter(B, &d, TT_F16, x16, dy16, dw16, db16, 0.0f, ws,
                               B->conv_workspace(B, &d, TT_F16, TT_WS_BWD_FILTER)),
           "%s", B->last_error(B));
  y16f = from16(y16, yn);
  dx16f = from16(dx16, xn);
  TT_CHECK(maxdiff_rel(y16f, y, yn) <= F16_TOL, "fwd rel diff %g", maxdiff_rel(y16f, y, yn));
  TT_CHECK(maxdiff_rel(dx16f, dx, xn) <= F16_TOL, "bwd_data rel diff %g", maxdiff_rel(dx16f, dx, xn));
  TT_CHECK(maxdiff_rel(dw16, dw, wn) <= 1e-5, "bwd_filter rel diff %g (same inputs, fp32 math)", maxdiff_rel(dw16, dw, wn));
  TT_CHECK(maxdiff_rel(db16, db, 6) <= 1e-5, "bias grad rel diff %g", maxdiff_rel(db16, db, 6));
  TT_TEST_END();
  free(x); free(w); free(bias); free(dy); free(y); free(dx); free(dw); free(db); free(dw16); free(db16);
  free(y16f); free(dx16f); free(x16); free(w16); free(b16); free(dy16); free(y16); free(dx16); free(ws);
}

/* --------------------------------- linear --------------------------------------------- */
typedef struct lin_ctx {
  int n, in, out;
  float *x, *w, *bias, *y, *r;
} lin_ctx;
static double lin_loss(void *v) {
  lin_ctx *c = (lin_ctx *)v;
  if (B->linear_fwd(B, c->n, c->in, c->out, TT_F32, c->x, c->w, c->bias, c->y, WS, WSB)) return NAN;
  return dot(c->r, c->y, (size_t)c->n * c->out);
}
static void test_linear(void) {
  lin_ctx c;
  int n = 5, in = 7, out = 4, i;
  size_t xn = (size_t)n * in, wn = (size_t)out * in, yn = (size_t)n * out, k;
  float *dx, *dw, *db, *dx1, *dw1, *db1, *old;
  TT_TEST_BEGIN(tn("linear_fd_beta"));
  c.n = n; c.in = in; c.out = out;
  c.x = fvec(xn); c.w = fvec(wn); c.bias = fvec((size_t)out); c.y = fnan(yn); c.r = fvec(yn);
  dx = fnan(xn); dw = fnan(wn); db = fnan((size_t)out);
  if (!strcmp(B->name, "ref")) TT_CHECK(B->linear_workspace(B, n, in, out, TT_F32, TT_WS_FWD) == 0, "fp32 linear needs no workspace");
  TT_CHECK(!B->linear_fwd(B, n, in, out, TT_F32, c.x, c.w, c.bias, c.y, WS, WSB), "%s", B->last_error(B));
  for (i = 0; i < n; i++) { /* direct check of y = x w^T + b */
    int o, j;
    for (o = 0; o < out; o++) {
      double s = c.bias[o];
      for (j = 0; j < in; j++) s += (double)c.x[i * in + j] * c.w[o * in + j];
      TT_CHECK(fabs(s - c.y[i * out + o]) < 1e-5, "y[%d,%d]", i, o);
    }
  }
  TT_CHECK(!B->linear_bwd_data(B, n, in, out, TT_F32, c.r, c.w, dx, 0.0f, WS, WSB), "%s", B->last_error(B));
  TT_CHECK(!B->linear_bwd_filter(B, n, in, out, TT_F32, c.x, c.r, dw, db, 0.0f, WS, WSB), "%s", B->last_error(B));
  fd_check("dx", lin_loss, &c, c.x, xn, dx, 100);
  fd_check("dw", lin_loss, &c, c.w, wn, dw, 100);
  fd_check("db", lin_loss, &c, c.bias, (size_t)out, db, 100);
  old = fvec(xn + wn);
  dx1 = (float *)malloc(xn * 4); dw1 = (float *)malloc(wn * 4); db1 = (float *)malloc((size_t)out * 4);
  memcpy(dx1, old, xn * 4); memcpy(dw1, old, wn * 4); memcpy(db1, old, (size_t)out * 4);
  B->linear_bwd_data(B, n, in, out, TT_F32, c.r, c.w, dx1, 1.0f, WS, WSB);
  B->linear_bwd_filter(B, n, in, out, TT_F32, c.x, c.r, dw1, db1, 1.0f, WS, WSB);
  for (k = 0; k < xn; k++) TT_CHECK(fabsf(dx1[k] - old[k] - dx[k]) < 1e-5f, "beta=1 dx[%zu]", k);
  for (k = 0; k < wn; k++) TT_CHECK(fabsf(dw1[k] - old[k] - dw[k]) < 1e-5f, "beta=1 dw[%zu]", k);
  for (k = 0; k < (size_t)out; k++) TT_CHECK(fabsf(db1[k] - old[k] - db[k]) < 1e-5f, "beta=1 db[%zu]", k);
  TT_TEST_END();

  TT_TEST_BEGIN(tn("linear_fp16_vs_fp32"));
  {
    uint16_t *x16, *w16, *b16, *r16, *y16, *dx16;
    float *dw16 = fnan(wn), *db16 = fnan((size_t)out), *yf, *dxf;
    size_t wsb = B->linear_workspace(B, n, in, out, TT_F16, TT_WS_FWD), t;
    void *ws;
    t = B->linear_workspace(B, n, in, out, TT_F16, TT_WS_BWD_DATA);
    wsb = t > wsb ? t : wsb;
    t = B->linear_workspace(B, n, in, out, TT_F16, TT_WS_BWD_FILTER);
    wsb = t > wsb ? t : wsb;
    ws = wsalloc(wsb);
    round16(c.x, xn); round16(c.w, wn); round16(c.bias, (size_t)out); round16(c.r, yn);
    B->linear_fwd(B, n, in, out, TT_F32, c.x, c.w, c.bias, c.y, WS, WSB);
    B->linear_bwd_data(B, n, in, out, TT_F32, c.r, c.w, dx, 0.0f, WS, WSB);
    B->linear_bwd_filter(B, n, in, out, TT_F32, c.x, c.r, dw, db, 0.0f, WS, WSB);
    x16 = to16(c.x, xn); w16 = to16(c.w, wn); b16 = to16(c.bias, (size_t)out); r16 = to16(c.r, yn);
    y16 = to16(dx, yn); dx16 = to16(dx, xn);
    TT_CHECK(B->linear_fwd(B, n, in, out, TT_F16, x16, w16, b16, y16, ws, wsb - 64) != 0, "small fp16 workspace accepted");
    TT_CHECK(!B->linear_fwd(B, n, in, out, TT_F16, x16, w16, b16, y16, ws, wsb), "%s", B->last_error(B));
    TT_CHECK(!B->linear_bwd_data(B, n, in, out, TT_F16, r16, w16, dx16, 0.0f, ws, wsb), "%s", B->last_error(B));
    TT_CHECK(!B->linear_bwd_filter(B, n, in, out, TT_F16, x16, r16, dw16, db16, 0.0f, ws, wsb), "%s", B->last_error(B));
    yf = from16(y16, yn);
    dxf = from16(dx16, xn);
    TT_CHECK(maxdiff_rel(yf, c.y, yn) <= F16_TOL, "fwd %g", maxdiff_rel(yf, c.y, yn));
    TT_CHECK(maxdiff_rel(dxf, dx, xn) <= F16_TOL, "bwd_data %g", maxdiff_rel(dxf, dx, xn));
    TT_CHECK(maxdiff_rel(dw16, dw, wn) <= 1e-5 && maxdiff_rel(db16, db, (size_t)out) <= 1e-5, "bwd_filter");
    free(x16); free(w16); free(b16); free(r16); free(y16); free(dx16); free(dw16); free(db16); free(yf); free(dxf);
    free(ws);
  }
  TT_TEST_END();
  free(c.x); free(c.w); free(c.bias); free(c.y); free(c.r); free(dx); free(dw); free(db);
  free(dx1); free(dw1); free(db1); free(old);
}

/* ------------------------------- batch norm ------------------------------------------- */
typedef struct bn_ctx {
  int n, c, hw;
  float *x, *gamma, *bias, *y, *r, *mean, *invstd;
} bn_ctx;
static double bn_loss(void *v) {
  bn_ctx *b = (bn_ctx *)v;
  if (B->bn_fwd_train(B, b->n, b->c, b->hw, TT_F32, b->x, b->gamma, b->bias, b->y, NULL, NULL, 0.1f, 1e-5f, b->mean,
                      b->invstd, 0, WS, WSB))
    return NAN;
  return dot(b->r, b->y, (size_t)b->n * b->c * b->hw);
}
static void test_bn(void) {
  bn_ctx b;
  int n = 3, c = 2, hw = 5, ch, i, k;
  size_t xn = (size_t)n * c * hw, j;
  float *dx = fnan(xn), *dg = fnan(2), *dbb = fnan(2), *dx1, *dg1, *db1, *old = fvec(xn);
  float rm[2] = {0.3f, -0.2f}, rv[2] = {1.5f, 0.7f}, rm0[2], rv0[2];
  TT_TEST_BEGIN(tn("bn_fd_beta"));
  b.n = n; b.c = c; b.hw = hw;
  b.x = fvec(xn); b.gamma = fvec(2); b.bias = fvec(2); b.y = fnan(xn); b.r = fvec(xn);
  b.mean = fnan(2); b.invstd = fnan(2);
  for (j = 0; j < xn; j++) b.x[j] = 2.0f * b.x[j] + 0.5f;
  bn_loss(&b);
  TT_CHECK(!B->bn_bwd(B, n, c, hw, TT_F32, b.x, b.r, b.gamma, b.mean, b.invstd, dx, dg, dbb, 0.0f, 0.0f, WS, WSB), "%s",
           B->last_error(B));
  fd_check("dx", bn_loss, &b, b.x, xn, dx, 100);
  fd_check("dgamma", bn_loss, &b, b.gamma, 2, dg, 100);
  fd_check("dbias", bn_loss, &b, b.bias, 2, dbb, 100);
  bn_loss(&b); /* restore saved stats for the unperturbed x */
  dx1 = (float *)malloc(xn * 4); dg1 = (float *)malloc(8); db1 = (float *)malloc(8);
  memcpy(dx1, old, xn * 4); memcpy(dg1, old, 8); memcpy(db1, old + 2, 8);
  B->bn_bwd(B, n, c, hw, TT_F32, b.x, b.r, b.gamma, b.mean, b.invstd, dx1, dg1, db1, 1.0f, 1.0f, WS, WSB);
  for (j = 0; j < xn; j++) TT_CHECK(fabsf(dx1[j] - old[j] - dx[j]) < 1e-5f, "beta=1 dx[%zu]", j);
  for (j = 0; j < 2; j++)
    TT_CHECK(fabsf(dg1[j] - old[j] - dg[j]) < 1e-5f && fabsf(db1[j] - old[j + 2] - dbb[j]) < 1e-5f, "beta=1 dgamma/dbias");
  TT_TEST_END();

  TT_TEST_BEGIN(tn("bn_running_stats"));
  memcpy(rm0, rm, 8); memcpy(rv0, rv, 8);
  B->bn_fwd_train(B, n, c, hw, TT_F32, b.x, b.gamma, b.bias, b.y, rm, rv, 0.1f, 1e-5f, b.mean, b.invstd, 0, WS, WSB);
  TT_CHECK(!memcmp(rm, rm0, 8) && !memcmp(rv, rv0, 8), "update_running=0 changed the running stats");
  TT_CHECK(!B->bn_fwd_train(B, n, c, hw, TT_F32, b.x, b.gamma, b.bias, b.y, rm, rv, 0.1f, 1e-5f, b.mean, b.invstd, 1, WS, WSB),
           "%s", B->last_error(B));
  for (ch = 0; ch < c; ch++) {
    double s = 0, sq = 0, mean, var;
    int m = n * hw;
    for (i = 0; i < n; i++)
      for (k = 0; k < hw; k++) s += b.x[(i * c + ch) * hw + k];
    mean = s / m;
    for (i = 0; i < n; i++)
      for (k = 0; k < hw; k++) sq += (b.x[(i * c + ch) * hw + k] - mean) * (b.x[(i * c + ch) * hw + k] - mean);
    var = sq / m;
    TT_CHECK(fabs(b.mean[ch] - mean) < 1e-6 && fabs(b.invstd[ch] - 1.0 / sqrt(var + 1e-5)) < 1e-5, "saved stats ch %d", ch);
    TT_CHECK(fabs(rm[ch] - (0.9 * rm0[ch] + 0.1 * mean)) < 1e-6, "running_mean ch %d", ch);
    TT_CHECK(fabs(rv[ch] - (0.9 * rv0[ch] + 0.1 * sq / (m - 1))) < 1e-6, "running_var (unbiased) ch %d: %g vs %g", ch,
             (double)rv[ch], 0.9 * rv0[ch] + 0.1 * sq / (m - 1));
    for (i = 0; i < n; i++)
      for (k = 0; k < hw; k++) {
        size_t q = (size_t)(i * c + ch) * hw + k;
        TT_CHECK(fabs(b.y[q] - ((b.x[q] - mean) / sqrt(var + 1e-5) * b.gamma[ch] + b.bias[ch])) < 1e-5, "train y");
      }
  }
  B->bn_fwd_infer(B, n, c, hw, TT_F32, b.x, b.gamma, b.bias, rm, rv, 1e-5f, b.y, WS, WSB);
  for (j = 0; j < xn; j++) {
    int chn = (int)((j / hw) % c);
    TT_CHECK(fabs(b.y[j] - ((b.x[j] - rm[chn]) / sqrt(rv[chn] + 1e-5) * b.gamma[chn] + b.bias[chn])) < 1e-5, "infer y");
  }
  TT_TEST_END();

  TT_TEST_BEGIN(tn("bn_fp16_vs_fp32"));
  {
    uint16_t *x16, *r16, *y16, *dx16;
    float *m16 = fnan(2), *is16 = fnan(2), *dg16 = fnan(2), *db16 = fnan(2), *yf, *dxf;
    round16(b.x, xn); round16(b.r, xn);
    x16 = to16(b.x, xn); r16 = to16(b.r, xn); y16 = to16(dx, xn); dx16 = to16(dx, xn);
    bn_loss(&b);
    B->bn_bwd(B, n, c, hw, TT_F32, b.x, b.r, b.gamma, b.mean, b.invstd, dx, dg, dbb, 0.0f, 0.0f, WS, WSB);
    TT_CHECK(!B->bn_fwd_train(B, n, c, hw, TT_F16, x16, b.gamma, b.bias, y16, NULL, NULL, 0.1f, 1e-5f, m16, is16, 0, WS, WSB), "%s",
             B->last_error(B));
    TT_CHECK(!B->bn_bwd(B, n, c, hw, TT_F16, x16, r16, b.gamma, m16, is16, dx16, dg16, db16, 0.0f, 0.0f, WS, WSB), "%s",
             B->last_error(B));
    yf = from16(y16, xn);
    dxf = from16(dx16, xn);
    TT_CHECK(maxdiff_rel(yf, b.y, xn) <= F16_TOL, "y %g", maxdiff_rel(yf, b.y, xn));
    TT_CHECK(maxdiff_rel(dxf, dx, xn) <= F16_TOL, "dx %g", maxdiff_rel(dxf, dx, xn));
    TT_CHECK(maxdiff_rel(dg16, dg, 2) <= 1e-5 && maxdiff_rel(db16, dbb, 2) <= 1e-5, "dgamma/dbias");
    TT_CHECK(maxdiff_rel(m16, b.mean, 2) <= 1e-6 && maxdiff_rel(is16, b.invstd, 2) <= 1e-6, "saved stats");
    free(x16); free(r16); free(y16); free(dx16); free(m16); free(is16); free(dg16); free(db16); free(yf); free(dxf);
  }
  TT_TEST_END();
  free(b.x); free(b.gamma); free(b.bias); free(b.y); free(b.r); free(b.mean); free(b.invstd);
  free(dx); free(dg); free(dbb); free(dx1); free(dg1); free(db1); free(old);
}

/* --------------------------------- pooling -------------------------------------------- */
typedef struct pool_ctx {
  tt_pool_desc d;
  tt_pool_mode mode;
  float *x, *y, *r;
} pool_ctx;
static tt_pool_desc mkpool(int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw) {
  tt_pool_desc d;
  memset(&d, 0, sizeof d); /* every field, y_nchw included */
  d.n = n; d.c = c; d.h = h; d.w = w; d.kh = kh; d.kw = kw;
  d.stride_h = sh; d.stride_w = sw; d.pad_h = ph; d.pad_w = pw;
  d.layout = TT_LAYOUT_NCHW;
  d.p = (h + 2 * ph - kh) / sh + 1;
  d.q = (w + 2 * pw - kw) / sw + 1;
  return d;
}
static double pool_loss(void *v) {
  pool_ctx *p = (pool_ctx *)v;
  if (B->pool_fwd(B, &p->d, p->mode, TT_F32, p->x, p->y, WS, WSB)) return NAN;
  return dot(p->r, p->y, (size_t)p->d.n * p->d.c * p->d.p * p->d.q);
}
static void test_pool_case(const char *name, tt_pool_desc d, tt_pool_mode mode) {
  pool_ctx p;
  size_t xn = (size_t)d.n * d.c * d.h * d.w, yn = (size_t)d.n * d.c * d.p * d.q, i;
  float *dx = fnan(xn), *dx1, *old = fvec(xn);
  int pl, oh, ow;
  TT_TEST_BEGIN(tn(name));
  p.d = d; p.mode = mode;
  p.x = fvec(xn); p.y = fnan(yn); p.r = fvec(yn);
  if (mode == TT_POOL_MAX) { /* distinct values 0.05 apart: an h = 1e-2 step never changes the arg-max */
    for (i = 0; i < xn; i++) p.x[i] = ((float)i - (float)xn / 2) * 0.05f;
    for (i = xn - 1; i > 0; i--) {
      size_t j = (size_t)(urand() * (double)(i + 1));
      float t = p.x[i];
      p.x[i] = p.x[j];
      p.x[j] = t;
    }
  }
  TT_CHECK(!B->pool_fwd(B, &d, mode, TT_F32, p.x, p.y, WS, WSB), "%s", B->last_error(B));
  for (pl = 0; pl < d.n * d.c; pl++) /* direct forward reference */
    for (oh = 0; oh < d.p; oh++)
      for (ow = 0; ow < d.q; ow++) {
        double acc = mode == TT_POOL_MAX ? -INFINITY : 0.0;
        int a, bq;
        for (a = 0; a < d.kh; a++)
          for (bq = 0; bq < d.kw; bq++) {
            int ih = oh * d.stride_h - d.pad_h + a, iw = ow * d.stride_w - d.pad_w + bq;
            float v;
            if (ih < 0 || iw < 0 || ih >= d.h || iw >= d.w) continue;
            v = p.x[(size_t)pl * d.h * d.w + ih * d.w + iw];
            acc = mode == TT_POOL_MAX ? fmax(acc, v) : acc + v;
          }
        if (mode == TT_POOL_AVG) acc /= d.kh * d.kw; /* count_include_pad */
        TT_CHECK(fabs(acc - p.y[(size_t)pl * d.p * d.q + oh * d.q + ow]) < 1e-6, "forward y[%d,%d,%d]", pl, oh, ow);
      }
  TT_CHECK(!B->pool_bwd(B, &d, mode, TT_F32, p.x, p.r, dx, 0.0f, WS, WSB), "%s", B->last_error(B));
  fd_check("dx", pool_loss, &p, p.x, xn, dx, 60);
  dx1 = (float *)malloc(xn * 4);
  memcpy(dx1, old, xn * 4);
  B->pool_bwd(B, &d, mode, TT_F32, p.x, p.r, dx1, 1.0f, WS, WSB);
  for (i = 0; i < xn; i++) TT_CHECK(fabsf(dx1[i] - old[i] - dx[i]) < 1e-5f, "beta=1 dx[%zu]", i);
  { /* fp16 agrees */
    uint16_t *x16, *r16, *y16, *dx16;
    float *yf, *dxf;
    round16(p.x, xn); round16(p.r, yn);
    B->pool_fwd(B, &d, mode, TT_F32, p.x, p.y, WS, WSB);
    B->pool_bwd(B, &d, mode, TT_F32, p.x, p.r, dx, 0.0f, WS, WSB);
    x16 = to16(p.x, xn); r16 = to16(p.r, yn); y16 = to16(p.y, yn); dx16 = to16(dx1, xn);
    TT_CHECK(!B->pool_fwd(B, &d, mode, TT_F16, x16, y16, WS, WSB), "%s", B->last_error(B));
    TT_CHECK(!B->pool_bwd(B, &d, mode, TT_F16, x16, r16, dx16, 0.0f, WS, WSB), "%s", B->last_error(B));
    yf = from16(y16, yn); dxf = from16(dx16, xn);
    TT_CHECK(maxdiff_rel(yf, p.y, yn) <= F16_TOL && maxdiff_rel(dxf, dx, xn) <= F16_TOL, "fp16 vs fp32: %g %g",
             maxdiff_rel(yf, p.y, yn), maxdiff_rel(dxf, dx, xn));
    free(x16); free(r16); free(y16); free(dx16); free(yf); free(dxf);
  }
  TT_TEST_END();
  free(p.x); free(p.y); free(p.r); free(dx); free(dx1); free(old);
}

static void test_pool(void) {
  test_pool_case("maxpool_3x3_s2_p1", mkpool(2, 2, 7, 7, 3, 3, 2, 2, 1, 1), TT_POOL_MAX);
  test_pool_case("maxpool_2x2_s2", mkpool(2, 3, 6, 6, 2, 2, 2, 2, 0, 0), TT_POOL_MAX);
  test_pool_case("avgpool_3x3_s2_p1", mkpool(2, 2, 7, 7, 3, 3, 2, 2, 1, 1), TT_POOL_AVG);
  test_pool_case("avgpool_2x3_s1_p1", mkpool(2, 2, 5, 6, 2, 3, 1, 1, 1, 1), TT_POOL_AVG);
  TT_TEST_BEGIN(tn("maxpool_first_max_and_bad_desc"));
  {
    tt_pool_desc d = mkpool(1, 1, 2, 2, 2, 2, 1, 1, 0, 0);
    float x[4] = {1, 1, 1, 1}, dy[1] = {2}, dx[4], y[1];
    B->pool_fwd(B, &d, TT_POOL_MAX, TT_F32, x, y, WS, WSB);
    B->pool_bwd(B, &d, TT_POOL_MAX, TT_F32, x, dy, dx, 0.0f, WS, WSB);
    TT_CHECK(y[0] == 1 && dx[0] == 2 && dx[1] == 0 && dx[2] == 0 && dx[3] == 0, "ties go to the first maximum");
    d.p = 3;
    TT_CHECK(B->pool_fwd(B, &d, TT_POOL_MAX, TT_F32, x, y, WS, WSB) != 0 && strstr(B->last_error(B), "pool_fwd"),
             "inconsistent output size accepted");
  }
  TT_TEST_END();
}

/* ------------------------------------ gap --------------------------------------------- */
typedef struct gap_ctx {
  int n, c, hw;
  float *x, *y, *r;
} gap_ctx;
static double gap_loss(void *v) {
  gap_ctx *g = (gap_ctx *)v;
  if (B->gap_fwd(B, g->n, g->c, g->hw, TT_F32, g->x, g->y)) return NAN;
  return dot(g->r, g->y, (size_t)g->n * g->c);
}
static void test_gap(void) {
  gap_ctx g;
  size_t xn = 2 * 3 * 5, i;
  float *dx = fnan(xn), *dx1 = fvec(xn), *old = (float *)malloc(xn * 4);
  TT_TEST_BEGIN(tn("gap_fd_beta"));
  g.n = 2; g.c = 3; g.hw = 5;
  g.x = fvec(xn); g.y = fnan(6); g.r = fvec(6);
  gap_loss(&g);
  TT_CHECK(!B->gap_bwd(B, 2, 3, 5, TT_F32, g.r, dx, 0.0f), "%s", B->last_error(B));
  fd_check("dx", gap_loss, &g, g.x, xn, dx, 100);
  memcpy(old, dx1, xn * 4);
  B->gap_bwd(B, 2, 3, 5, TT_F32, g.r, dx1, 1.0f);
  for (i = 0; i < xn; i++) TT_CHECK(fabsf(dx1[i] - old[i] - dx[i]) < 1e-6f, "beta=1 dx[%zu]", i);
  {
    uint16_t *x16 = to16(g.x, xn), *y16 = to16(g.y, 6), *r16, *dx16;
    float *yf, *dxf;
    round16(g.x, xn); round16(g.r, 6);
    r16 = to16(g.r, 6); dx16 = to16(dx, xn);
    gap_loss(&g);
    B->gap_bwd(B, 2, 3, 5, TT_F32, g.r, dx, 0.0f);
    B->gap_fwd(B, 2, 3, 5, TT_F16, x16, y16);
    B->gap_bwd(B, 2, 3, 5, TT_F16, r16, dx16, 0.0f);
    yf = from16(y16, 6); dxf = from16(dx16, xn);
    TT_CHECK(maxdiff_rel(yf, g.y, 6) <= F16_TOL && maxdiff_rel(dxf, dx, xn) <= F16_TOL, "fp16 vs fp32");
    free(x16); free(y16); free(r16); free(dx16); free(yf); free(dxf);
  }
  TT_TEST_END();
  free(g.x); free(g.y); free(g.r); free(dx); free(dx1); free(old);
}

/* ------------------------------ activations ------------------------------------------- */
typedef struct act_ctx {
  tt_act a;
  size_t n;
  float *x, *y, *r;
} act_ctx;
static double act_loss(void *v) {
  act_ctx *c = (act_ctx *)v;
  if (B->act_fwd(B, c->a, c->n, TT_F32, c->x, c->y)) return NAN;
  return dot(c->r, c->y, c->n);
}
static void test_act(void) {
  const char *names[3] = {"act_relu", "act_relu6", "act_silu"};
  int a;
  for (a = 0; a < 3; a++) {
    act_ctx c;
    size_t n = 200, i;
    float *dx = fnan(n), *dx1 = fvec(n), *old = (float *)malloc(n * 4), *xc;
    TT_TEST_BEGIN(tn(names[a]));
    c.a = (tt_act)a; c.n = n;
    c.x = fvec(n); c.y = fnan(n); c.r = fvec(n);
    for (i = 0; i < n; i++) { /* [-8, 8], at least 3h from the kinks at 0 and 6 */
      float v = 8.0f * c.x[i];
      if (fabsf(v) < 0.03f) v = 0.05f;
      if (fabsf(v - 6.0f) < 0.03f) v = 6.05f;
      c.x[i] = v;
    }
    act_loss(&c);
    TT_CHECK(!B->act_bwd(B, c.a, n, TT_F32, c.a == TT_ACT_SILU ? c.x : c.y, c.r, dx, 0.0f), "%s", B->last_error(B));
    fd_check("dx", act_loss, &c, c.x, n, dx, 200);
    memcpy(old, dx1, n * 4);
    B->act_bwd(B, c.a, n, TT_F32, c.a == TT_ACT_SILU ? c.x : c.y, c.r, dx1, 1.0f);
    for (i = 0; i < n; i++) TT_CHECK(fabsf(dx1[i] - old[i] - dx[i]) < 1e-5f, "beta=1 dx[%zu]", i);
    /* in place forward, and dx aliasing dy with beta 0 */
    xc = (float *)malloc(n * 4);
    act_loss(&c); /* fd_check leaves y from its last perturbed evaluation */
    memcpy(xc, c.x, n * 4);
    B->act_fwd(B, c.a, n, TT_F32, xc, xc);
    TT_CHECK(!memcmp(xc, c.y, n * 4), "in-place forward differs");
    memcpy(xc, c.r, n * 4);
    B->act_bwd(B, c.a, n, TT_F32, c.a == TT_ACT_SILU ? c.x : c.y, xc, xc, 0.0f);
    TT_CHECK(!memcmp(xc, dx, n * 4), "dx == dy backward differs");
    { /* fp16 */
      uint16_t *x16, *y16, *r16, *dx16;
      float *yf, *dxf;
      round16(c.x, n); round16(c.r, n);
      act_loss(&c);
      B->act_bwd(B, c.a, n, TT_F32, c.a == TT_ACT_SILU ? c.x : c.y, c.r, dx, 0.0f);
      x16 = to16(c.x, n); r16 = to16(c.r, n); y16 = to16(c.y, n); dx16 = to16(dx, n);
      B->act_fwd(B, c.a, n, TT_F16, x16, y16);
      B->act_bwd(B, c.a, n, TT_F16, c.a == TT_ACT_SILU ? x16 : y16, r16, dx16, 0.0f);
      yf = from16(y16, n); dxf = from16(dx16, n);
      TT_CHECK(maxdiff_rel(yf, c.y, n) <= F16_TOL && maxdiff_rel(dxf, dx, n) <= F16_TOL, "fp16 vs fp32: %g %g",
               maxdiff_rel(yf, c.y, n), maxdiff_rel(dxf, dx, n));
      free(x16); free(y16); free(r16); free(dx16); free(yf); free(dxf);
    }
    {
      float nanv = NAN, out = 0.0f;
      B->act_fwd(B, c.a, 1, TT_F32, &nanv, &out);
      TT_CHECK(isnan(out), "NaN must propagate through the activation");
    }
    TT_TEST_END();
    free(c.x); free(c.y); free(c.r); free(dx); free(dx1); free(old); free(xc);
  }
}

/* ------------------------ add, accumulate, channel copy, cast ------------------------- */
static void test_add_accumulate_copy(void) {
  size_t n = 50, i;
  float *a = fvec(n), *b2 = fvec(n), *y = fnan(n), *t = (float *)malloc(n * 4), *o = fvec(n);
  TT_TEST_BEGIN(tn("add_accumulate"));
  B->add(B, n, TT_F32, a, b2, y);
  for (i = 0; i < n; i++) TT_CHECK(y[i] == a[i] + b2[i], "add[%zu]", i);
  memcpy(t, a, n * 4);
  B->add(B, n, TT_F32, t, b2, t);
  TT_CHECK(!memcmp(t, y, n * 4), "add in place (y == a)");
  memcpy(t, b2, n * 4);
  B->add(B, n, TT_F32, a, t, t);
  TT_CHECK(!memcmp(t, y, n * 4), "add in place (y == b2)");
  for (i = 0; i < n; i++) t[i] = NAN;
  B->accumulate(B, n, TT_F32, a, t, 0.0f);
  TT_CHECK(!memcmp(t, a, n * 4), "accumulate beta=0 must overwrite NaN");
  memcpy(t, o, n * 4);
  B->accumulate(B, n, TT_F32, a, t, 1.0f);
  for (i = 0; i < n; i++) TT_CHECK(t[i] == o[i] + a[i], "accumulate beta=1");
  {
    uint16_t *a16 = to16(a, n), *b16 = to16(b2, n), *y16 = to16(y, n);
    float *yf;
    B->add(B, n, TT_F16, a16, b16, y16);
    B->accumulate(B, n, TT_F16, a16, y16, 1.0f);
    yf = from16(y16, n);
    for (i = 0; i < n; i++) TT_CHECK(fabsf(yf[i] - (2 * a[i] + b2[i])) < 4e-3f, "fp16 add+accumulate");
    free(a16); free(b16); free(y16); free(yf);
  }
  TT_TEST_END();

  TT_TEST_BEGIN(tn("channel_copy"));
  {
    int nn = 2, hw = 3, sc = 4, so = 1, dc = 5, dof = 2, nc = 2, s, ch, k;
    float *src = fvec((size_t)nn * sc * hw), *dst = fvec((size_t)nn * dc * hw), *d0 = (float *)malloc((size_t)nn * dc * hw * 4);
    memcpy(d0, dst, (size_t)nn * dc * hw * 4);
    TT_CHECK(!B->channel_copy(B, nn, hw, TT_F32, src, sc, so, dst, dc, dof, nc, 0.0f), "%s", B->last_error(B));
    for (s = 0; s < nn; s++)
      for (ch = 0; ch < dc; ch++)
        for (k = 0; k < hw; k++) {
          float v = dst[(s * dc + ch) * hw + k], expect = d0[(s * dc + ch) * hw + k];
          if (ch >= dof && ch < dof + nc) expect = src[(s * sc + so + ch - dof) * hw + k];
          TT_CHECK(v == expect, "beta=0 copy at %d,%d,%d", s, ch, k);
        }
    TT_CHECK(!B->channel_copy(B, nn, hw, TT_F32, src, sc, so, dst, dc, dof, nc, 1.0f), "%s", B->last_error(B));
    for (s = 0; s < nn; s++)
      for (ch = dof; ch < dof + nc; ch++)
        for (k = 0; k < hw; k++)
          TT_CHECK(dst[(s * dc + ch) * hw + k] == 2 * src[(s * sc + so + ch - dof) * hw + k], "beta=1 accumulate");
    TT_CHECK(B->channel_copy(B, nn, hw, TT_F32, src, sc, 3, dst, dc, dof, nc, 0.0f) != 0, "out-of-range block accepted");
    free(src); free(dst); free(d0);
  }
  TT_TEST_END();

  TT_TEST_BEGIN(tn("cast_normalize_u8"));
  {
    uint16_t *h = (uint16_t *)malloc(n * 2);
    float *back = fnan(n);
    uint8_t img[2 * 2 * 3] = {0, 255, 128, 1, 2, 3, 10, 20, 30, 40, 50, 60};
    float mean[2] = {0.5f, 0.25f}, sd[2] = {0.5f, 2.0f}, out[12];
    int k;
    B->cast(B, n, TT_F32, a, TT_F16, h);
    B->cast(B, n, TT_F16, h, TT_F32, back);
    for (i = 0; i < n; i++) TT_CHECK(h[i] == tt_f32_to_f16(a[i]) && back[i] == tt_f16_to_f32(h[i]), "cast[%zu]", i);
    B->cast(B, n, TT_F32, a, TT_F32, back);
    TT_CHECK(!memcmp(back, a, n * 4), "same-dtype cast copies");
    TT_CHECK(!B->normalize_u8(B, 2, 2, 3, img, mean, sd, TT_F32, out), "%s", B->last_error(B));
    for (k = 0; k < 12; k++) {
      int ch = (k / 3) % 2;
      TT_CHECK(fabsf(out[k] - ((float)img[k] / 255.0f - mean[ch]) / sd[ch]) < 1e-6f, "normalize[%d]", k);
    }
    free(h); free(back);
  }
  TT_TEST_END();
  free(a); free(b2); free(y); free(t); free(o);
}

/* --------------------------------- dropout -------------------------------------------- */
/* The documented mask hash (kernel_math.h: splitmix64's finaliser of seed ^ i * golden ratio),
 * written out here on purpose instead of calling tt_dropout_hash or tt_mix64: the check is that
 * the kernels agree with the documented formula, so it must not share their code. */
static uint64_t ref_hash(uint64_t seed, uint64_t i) {
  uint64_t z = seed ^ (i * 0x9E3779B97F4A7C15ull);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static void test_dropout(void) {
  size_t n = 20000, i, dropped = 0;
  float p = 0.3f, scale = 1.0f / (1.0f - p);
  float *x = fvec(n), *y = fnan(n), *y2 = fnan(n), *dy = fvec(n), *dx = fnan(n), *dx1, *old = fvec(n);
  uint32_t thr = (uint32_t)((double)p * 4294967296.0);
  TT_TEST_BEGIN(tn("dropout"));
  for (i = 0; i < n; i++)
    if (x[i] == 0.0f) x[i] = 0.5f;
  TT_CHECK(!B->dropout_fwd(B, n, TT_F32, p, 42, x, y), "%s", B->last_error(B));
  TT_CHECK(!B->dropout_bwd(B, n, TT_F32, p, 42, dy, dx, 0.0f), "%s", B->last_error(B));
  for (i = 0; i < n; i++) {
    int keep = (uint32_t)(ref_hash(42, i) >> 32) >= thr;
    dropped += !keep;
    TT_CHECK(y[i] == (keep ? x[i] * scale : 0.0f), "fwd[%zu] does not follow the documented mask", i);
    TT_CHECK(dx[i] == (keep ? dy[i] * scale : 0.0f), "bwd[%zu] does not match the forward mask", i);
  }
  TT_CHECK(fabs((double)dropped / n - p) < 0.02, "dropped fraction %g, expected %g", (double)dropped / n, (double)p);
  B->dropout_fwd(B, n, TT_F32, p, 42, x, y2);
  TT_CHECK(!memcmp(y, y2, n * 4), "same seed must give the same mask");
  B->dropout_fwd(B, n, TT_F32, p, 43, x, y2);
  TT_CHECK(memcmp(y, y2, n * 4) != 0, "different seeds give the same mask");
  dx1 = (float *)malloc(n * 4);
  memcpy(dx1, old, n * 4);
  B->dropout_bwd(B, n, TT_F32, p, 42, dy, dx1, 1.0f);
  for (i = 0; i < n; i++) TT_CHECK(fabsf(dx1[i] - old[i] - dx[i]) < 1e-5f, "beta=1 dx[%zu]", i);
  B->dropout_fwd(B, n, TT_F32, 0.0f, 42, x, y2);
  TT_CHECK(!memcmp(x, y2, n * 4), "p = 0 must keep everything unscaled");
  {
    uint16_t *x16, *y16;
    float *yf;
    round16(x, n);
    B->dropout_fwd(B, n, TT_F32, p, 42, x, y);
    x16 = to16(x, n); y16 = to16(y, n);
    B->dropout_fwd(B, n, TT_F16, p, 42, x16, y16);
    yf = from16(y16, n);
    for (i = 0; i < n; i++) TT_CHECK((yf[i] == 0.0f) == (y[i] == 0.0f), "fp16 mask differs at %zu", i);
    TT_CHECK(maxdiff_rel(yf, y, n) <= F16_TOL, "fp16 values");
    free(x16); free(y16); free(yf);
  }
  TT_TEST_END();
  free(x); free(y); free(y2); free(dy); free(dx); free(dx1); free(old);
}

/* ------------------------------- softmax ce ------------------------------------------- */
typedef struct ce_ctx {
  int n, classes;
  float smoothing;
  float *logits;
  int32_t *labels;
} ce_ctx;
static double ce_loss(void *v) {
  ce_ctx *c = (ce_ctx *)v;
  float stats[2] = {0, 0};
  if (B->softmax_ce(B, c->n, c->classes, TT_F32, c->logits, c->labels, c->smoothing, 1.0f, NULL, stats)) return NAN;
  return stats[0];
}
static double ce_ref(const float *z, const int32_t *lab, int n, int C, float s, double *correct) {
  double total = 0.0;
  int i, j;
  *correct = 0;
  for (i = 0; i < n; i++) {
    double mx = z[i * C], sum = 0.0, lse;
    int arg = 0;
    for (j = 1; j < C; j++)
      if (z[i * C + j] > mx) mx = z[i * C + j], arg = j;
    for (j = 0; j < C; j++) sum += exp(z[i * C + j] - mx);
    lse = mx + log(sum);
    for (j = 0; j < C; j++) total += ((j == lab[i] ? 1.0 - s : 0.0) + s / C) * (lse - z[i * C + j]);
    *correct += arg == lab[i];
  }
  return total;
}
static void test_softmax_ce(void) {
  ce_ctx c;
  int n = 4, C = 5, i;
  size_t zn = (size_t)n * C, k;
  int32_t labels[4] = {0, 3, 4, 1};
  float *dz = fnan(zn), *dz2 = fnan(zn), stats[2] = {1.0f, 2.0f};
  double correct, ref;
  TT_TEST_BEGIN(tn("softmax_ce_fd_smoothing"));
  c.n = n; c.classes = C; c.smoothing = 0.1f; c.logits = fvec(zn); c.labels = labels;
  for (k = 0; k < zn; k++) c.logits[k] *= 3.0f;
  /* dlogits with grad_scale = 1 is the gradient of the summed loss (stats[0]) */
  TT_CHECK(!B->softmax_ce(B, n, C, TT_F32, c.logits, labels, 0.1f, 1.0f, dz, stats), "%s", B->last_error(B));
  ref = ce_ref(c.logits, labels, n, C, 0.1f, &correct);
  TT_CHECK(fabs(stats[0] - 1.0 - ref) < 1e-5 * (1 + ref), "loss %g vs %g (stats accumulate)", stats[0] - 1.0, ref);
  TT_CHECK(stats[1] == (float)(2.0 + correct), "correct %g vs %g", (double)stats[1] - 2, correct);
  fd_check("dlogits", ce_loss, &c, c.logits, zn, dz, 100);
  /* the execution passes grad_scale = loss_scale / batch: dlogits scales linearly */
  B->softmax_ce(B, n, C, TT_F32, c.logits, labels, 0.1f, 0.25f, dz2, stats);
  for (k = 0; k < zn; k++) TT_CHECK(fabsf(dz2[k] - 0.25f * dz[k]) < 1e-7f, "grad_scale[%zu]", k);
  labels[0] = 7;
  TT_CHECK(B->softmax_ce(B, n, C, TT_F32, c.logits, labels, 0.1f, 1.0f, dz, stats) != 0, "bad label accepted");
  labels[0] = 0;
  { /* fp16 logits and grads */
    uint16_t *z16, *d16;
    float *df, st16[2] = {0, 0}, st32[2] = {0, 0};
    round16(c.logits, zn);
    z16 = to16(c.logits, zn); d16 = to16(dz, zn);
    B->softmax_ce(B, n, C, TT_F32, c.logits, labels, 0.1f, 1.0f, dz, st32);
    TT_CHECK(!B->softmax_ce(B, n, C, TT_F16, z16, labels, 0.1f, 1.0f, d16, st16), "%s", B->last_error(B));
    df = from16(d16, zn);
    TT_CHECK(maxdiff_rel(df, dz, zn) <= F16_TOL && fabsf(st16[0] - st32[0]) < 1e-5f && st16[1] == st32[1], "fp16");
    free(z16); free(d16); free(df);
  }
  TT_TEST_END();

  TT_TEST_BEGIN(tn("softmax_ce_large_batch"));
  {
    int nl = 3000, Cl = 10;
    float *z = fvec((size_t)nl * Cl), st[2] = {0, 0}, st2[2] = {0, 0};
    int32_t *lab = (int32_t *)malloc((size_t)nl * 4);
    for (i = 0; i < nl; i++) lab[i] = (int32_t)(urand() * Cl);
    B->softmax_ce(B, nl, Cl, TT_F32, z, lab, 0.0f, 1.0f, NULL, st);
    B->softmax_ce(B, nl, Cl, TT_F32, z, lab, 0.0f, 1.0f, NULL, st2);
    ref = ce_ref(z, lab, nl, Cl, 0.0f, &correct);
    TT_CHECK(fabs(st[0] - ref) < 1e-5 * ref && st[1] == (float)correct, "loss %g vs %g, correct %g vs %g", (double)st[0],
             ref, (double)st[1], correct);
    TT_CHECK(!memcmp(st, st2, 8), "stats not deterministic");
    free(z); free(lab);
  }
  TT_TEST_END();
  free(c.logits); free(dz); free(dz2);
}

/* -------------------------------- optimizers ------------------------------------------ */
static void test_optim(void) {
  size_t n = 37, i;
  int cfg, t;
  TT_TEST_BEGIN(tn("sgd_vs_reference"));
  for (cfg = 0; cfg < 4; cfg++) {
    float mom = cfg == 0 ? 0.0f : 0.9f, wd = cfg == 1 ? 0.0f : 0.01f, lr = 0.1f, gs = 0.5f;
    int nest = cfg == 3;
    float *w = fvec(n), *m = (float *)calloc(n, 4), *rw = (float *)malloc(n * 4), *rm = (float *)calloc(n, 4);
    memcpy(rw, w, n * 4);
    for (t = 0; t < 3; t++) {
      float *g = fvec(n);
      TT_CHECK(!B->sgd_update(B, n, w, g, mom != 0.0f ? m : NULL, lr, mom, nest, wd, gs, NULL, NULL), "%s", B->last_error(B));
      for (i = 0; i < n; i++) { /* torch.optim.SGD, dampening 0, buffer starts at zero */
        double d = (double)g[i] * gs + (double)wd * rw[i], step = d;
        if (mom != 0.0f) {
          rm[i] = (float)(mom * (double)rm[i] + d);
          step = nest ? d + mom * (double)rm[i] : rm[i];
        }
        rw[i] = (float)(rw[i] - lr * step);
      }
      free(g);
    }
    for (i = 0; i < n; i++) TT_CHECK(fabsf(w[i] - rw[i]) <= 1e-6f * (1 + fabsf(rw[i])), "cfg %d w[%zu] %g vs %g", cfg, i,
                                      (double)w[i], (double)rw[i]);
    free(w); free(m); free(rw); free(rm);
  }
  TT_TEST_END();

  TT_TEST_BEGIN(tn("adam_adamw_vs_reference"));
  for (cfg = 0; cfg < 2; cfg++) {
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.05f, gs = 0.5f;
    float *w = fvec(n), *m = (float *)calloc(n, 4), *v = (float *)calloc(n, 4);
    double *rw = (double *)malloc(n * 8), *rm = (double *)calloc(n, 8), *rv = (double *)calloc(n, 8);
    for (i = 0; i < n; i++) rw[i] = w[i];
    for (t = 1; t <= 4; t++) {
      float *g = fvec(n);
      double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
      TT_CHECK(!B->adam_update(B, n, w, g, m, v, lr, b1, b2, eps, wd, cfg, t, gs, NULL, NULL), "%s", B->last_error(B));
      for (i = 0; i < n; i++) {
        double gr = (double)g[i] * gs;
        if (cfg) rw[i] *= 1.0 - (double)lr * wd;
        else gr += (double)wd * rw[i];
        rm[i] = b1 * rm[i] + (1 - (double)b1) * gr;
        rv[i] = b2 * rv[i] + (1 - (double)b2) * gr * gr;
        rw[i] -= lr * (rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps);
      }
      free(g);
    }
    for (i = 0; i < n; i++)
      TT_CHECK(fabs(w[i] - rw[i]) <= 1e-5 * (1 + fabs(rw[i])), "%s w[%zu] %g vs %g", cfg ? "adamw" : "adam", i,
               (double)w[i], rw[i]);
    free(w); free(m); free(v); free(rw); free(rm); free(rv);
  }
  TT_TEST_END();

  /* the overflow flag skips the update: nothing moves when it is set, a clear flag is no flag */
  TT_TEST_BEGIN("optimizer_updates_skip_when_the_overflow_flag_is_set");
  {
    float *w = fvec(n), *g = fvec(n), *m = fvec(n), *v = fvec(n);
    float *w0 = (float *)malloc(n * 4), *m0 = (float *)malloc(n * 4), *v0 = (float *)malloc(n * 4);
    float *w1 = (float *)malloc(n * 4), *m1 = (float *)malloc(n * 4);
    int32_t set = 1, clear = 0;
    for (i = 0; i < n; i++) v[i] = fabsf(v[i]);
    memcpy(w0, w, n * 4), memcpy(m0, m, n * 4), memcpy(v0, v, n * 4);
    TT_CHECK(!B->sgd_update(B, n, w, g, m, 0.1f, 0.9f, 1, 0.01f, 0.5f, NULL, &set), "%s", B->last_error(B));
    TT_CHECK(!B->adam_update(B, n, w, g, m, v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 3, 0.5f, NULL, &set), "%s", B->last_error(B));
    TT_CHECK(!memcmp(w, w0, n * 4) && !memcmp(m, m0, n * 4) && !memcmp(v, v0, n * 4), "a set flag did not skip the update");
    TT_CHECK(!B->sgd_update(B, n, w, g, m, 0.1f, 0.9f, 1, 0.01f, 0.5f, NULL, &clear), "%s", B->last_error(B));
    memcpy(w1, w, n * 4), memcpy(m1, m, n * 4), memcpy(w, w0, n * 4), memcpy(m, m0, n * 4);
    TT_CHECK(!B->sgd_update(B, n, w, g, m, 0.1f, 0.9f, 1, 0.01f, 0.5f, NULL, NULL), "%s", B->last_error(B));
    TT_CHECK(!memcmp(w, w1, n * 4) && !memcmp(m, m1, n * 4) && memcmp(w, w0, n * 4),
             "a clear flag must update exactly as no flag");
    free(w); free(g); free(m); free(v); free(w0); free(m0); free(v0); free(w1); free(m1);
  }
  TT_TEST_END();
}

/* sum_squares: += into acc, equal to a double sum, and the same bits with 1 thread as with 4 (it
 * sums fixed blocks in a fixed order); past one parallel pass of blocks (64 x 4096 values). */
static void test_sum_squares(void) {
  size_t counts[3] = {1, 4097, 64 * 4096 * 2 + 5};
  TT_TEST_BEGIN(tn("sum_squares"));
  for (int c = 0; c < 3; c++) {
    size_t n = counts[c];
    float *g = (float *)malloc(n * 4), a1 = 0.25f, a4 = 0.25f;
    double want = 0.25;
    uint64_t st = 12345 + (uint64_t)c;
    for (size_t i = 0; i < n; i++) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      g[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 2.0 - 1.0);
      want += (double)g[i] * g[i];
    }
    tt_backend *one = tt_ref_backend_create(1), *four = tt_ref_backend_create(4);
    TT_CHECK(!B->sum_squares(B, n, g, &a1) && !four->sum_squares(four, n, g, &a4), "%s", B->last_error(B));
    TT_CHECK(fabs(a1 - want) <= 1e-6 * want, "n=%zu: %.9g, the double sum %.9g", n, (double)a1, want);
    float b1 = 0.25f;
    TT_CHECK(!one->sum_squares(one, n, g, &b1) && !memcmp(&b1, &a4, 4) && !memcmp(&a1, &b1, 4),
             "n=%zu: 1 thread %.9g, 4 threads %.9g, this backend %.9g", n, (double)b1, (double)a4, (double)a1);
    one->destroy(one), four->destroy(four);
    free(g);
  }
  TT_TEST_END();
}

static void test_check_finite(void) {
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint16_t h[8];
  int32_t flag = 0;
  int i;
  TT_TEST_BEGIN(tn("check_finite"));
  for (i = 0; i < 8; i++) h[i] = tt_f32_to_f16(x[i]);
  B->check_finite(B, 8, TT_F32, x, &flag);
  TT_CHECK(flag == 0, "clean fp32 flagged");
  x[5] = INFINITY;
  B->check_finite(B, 8, TT_F32, x, &flag);
  TT_CHECK(flag == 1, "inf not detected");
  flag = 0; x[5] = -INFINITY;
  B->check_finite(B, 8, TT_F32, x, &flag);
  TT_CHECK(flag == 1, "-inf not detected");
  flag = 0; x[5] = 1; x[7] = NAN;
  B->check_finite(B, 8, TT_F32, x, &flag);
  TT_CHECK(flag == 1, "NaN not detected");
  flag = 1; x[7] = 0;
  B->check_finite(B, 8, TT_F32, x, &flag);
  TT_CHECK(flag == 1, "flag must not be cleared");
  flag = 0;
  B->check_finite(B, 8, TT_F16, h, &flag);
  TT_CHECK(flag == 0, "clean fp16 flagged");
  h[3] = 0x7c00;
  B->check_finite(B, 8, TT_F16, h, &flag);
  TT_CHECK(flag == 1, "fp16 inf not detected");
  flag = 0; h[3] = 0x3c00; h[0] = 0xfe00;
  B->check_finite(B, 8, TT_F16, h, &flag);
  TT_CHECK(flag == 1, "fp16 NaN not detected");
  TT_TEST_END();
}

/* Writes an inf (bad 0) or a NaN (bad 1) of dt at element i of x. */
static void put_nonfinite(tt_dtype dt, void *x, size_t i, int bad) {
  if (dt == TT_F32) {
    uint32_t u = bad ? 0x7fc00000u : 0xff800000u; /* NaN, -inf */
    memcpy((char *)x + 4 * i, &u, 4);
  } else {
    uint16_t u = dt == TT_F16 ? (bad ? 0x7e00u : 0x7c00u) : (bad ? 0xffc0u : 0x7f80u); /* fp16 NaN, +inf; bf16 -NaN, +inf */
    memcpy((char *)x + 2 * i, &u, 2);
  }
}

/* check_finite_multi (backend.h): 300 segments of odd sizes, every 7th empty (x NULL), in fp32,
 * fp16 and bf16: clear on finite values; set by one inf or NaN in the first segment (its first
 * element), a middle one or the last (their last element); never cleared. */
static void test_check_finite_multi(void) {
  static const tt_dtype dts[3] = {TT_F32, TT_F16, TT_BF16};
  enum { NSEG = 300 };
  tt_finite_seg segs[NSEG];
  size_t cnt[NSEG], off[NSEG], total = 0;
  TT_TEST_BEGIN(tn("check_finite_multi"));
  TT_CHECK(B->check_finite_multi != NULL, "the %s backend has no check_finite_multi", B->name);
  for (int s = 0; s < NSEG; s++) {
    cnt[s] = s % 7 == 3 ? 0 : (size_t)(1 + (s * 37) % 101);
    off[s] = total, total += cnt[s];
  }
  for (int d = 0; d < 3 && B->check_finite_multi; d++) {
    tt_dtype dt = dts[d];
    size_t es = tt_dtype_size(dt);
    unsigned char *buf = (unsigned char *)calloc(total, es); /* zeros: finite */
    int32_t flag = 0;
    for (int s = 0; s < NSEG; s++) segs[s].x = cnt[s] ? buf + off[s] * es : NULL, segs[s].count = cnt[s];
    TT_CHECK(!B->check_finite_multi(B, segs, NSEG, dt, &flag) && flag == 0, "%s: finite values flagged (%d): %s",
             tt_dtype_name(dt), flag, B->last_error(B));
    const int where[3] = {0, 150, NSEG - 1}; /* the first, a middle and the last segment (none of them empty) */
    for (int w = 0; w < 3; w++)
      for (int bad = 0; bad < 2; bad++) {
        size_t at = off[where[w]] + (w ? cnt[where[w]] - 1 : 0);
        put_nonfinite(dt, buf, at, bad);
        flag = 0;
        TT_CHECK(!B->check_finite_multi(B, segs, NSEG, dt, &flag) && flag == 1, "%s: %s in segment %d (element %zu) not flagged",
                 tt_dtype_name(dt), bad ? "NaN" : "inf", where[w], at);
        memset(buf + at * es, 0, es);
      }
    flag = 1;
    TT_CHECK(!B->check_finite_multi(B, segs, NSEG, dt, &flag) && flag == 1, "%s: the flag was cleared", tt_dtype_name(dt));
    flag = 0;
    TT_CHECK(!B->check_finite_multi(B, segs, 0, dt, &flag) && flag == 0, "%s: no segments", tt_dtype_name(dt));
    free(buf);
  }
  TT_TEST_END();
}

/* ---------------------- batch norm + add + ReLU as one call (fused) ----------------------
 * backend.h's bn_fwd_train_add_relu and bn_bwd_add_relu, where the backend lists them, bit for bit
 * the unfused calls on the same backend: bn_fwd_train, add, act_fwd(RELU) forward (and in place on
 * the shortcut, y == s); act_bwd(RELU) (or act_bwd_mask from act_mask's bits), accumulate into the
 * shortcut's gradient and into bn_bwd's dy, bn_bwd backward; with the betas 0 and 1, ds == dy and
 * dx == dy.
 * fp32, bf16, fp16; NCHW [n, c, hw] and an NHWC tensor as the backends get it ([n*h*w, c, 1]). */
/* v in dt (cast from fp32 by the backend under test), count values uniform in [lo, hi). */
static void *fuse_rand(tt_dtype dt, size_t count, float lo, float hi) {
  float *f = (float *)malloc(count * sizeof(float));
  void *o = malloc(count * tt_dtype_size(dt));
  for (size_t i = 0; i < count; i++) f[i] = lo + (hi - lo) * (float)urand();
  B->cast(B, count, TT_F32, f, dt, o);
  free(f);
  return o;
}

/* One shape and dtype, every form of both calls (failures counted by TT_CHECK). */
static void fuse_case(tt_dtype dt, int n, int c, int hw, const char *lay) {
  size_t cnt = (size_t)n * c * hw, es = tt_dtype_size(dt), nb = cnt * es, fb = (size_t)c * sizeof(float);
  float mom = 0.1f, eps = 1e-5f;
  void *x = fuse_rand(dt, cnt, -2.0f, 3.0f), *s = fuse_rand(dt, cnt, -1.5f, 1.0f), *dy = fuse_rand(dt, cnt, -1.0f, 1.0f);
  void *dx0 = fuse_rand(dt, cnt, -1.0f, 1.0f), *ds0 = fuse_rand(dt, cnt, -1.0f, 1.0f);
  float *gm = (float *)fuse_rand(TT_F32, (size_t)c, 0.5f, 1.5f), *bb = (float *)fuse_rand(TT_F32, (size_t)c, -1.0f, 1.0f);
  float *st0 = (float *)fuse_rand(TT_F32, 6 * (size_t)c, 0.5f, 1.0f), *st = (float *)malloc(12 * fb);
  unsigned char *t = malloc(nb), *y1 = malloc(nb), *y2 = malloc(nb), *y3 = malloc(nb), *d = malloc(nb), *g = malloc(nb);
  unsigned char *dx1 = malloc(nb), *dx2 = malloc(nb), *ds1 = malloc(nb), *ds2 = malloc(nb), *dyc = malloc(nb);
  uint32_t *mask = (uint32_t *)malloc(tt_act_mask_bytes(cnt));
  int ok, zeros = 0;
  memcpy(st, st0, 6 * fb), memcpy(st + 6 * c, st0, 6 * fb), memcpy(y3, s, nb);
  ok = !B->bn_fwd_train(B, n, c, hw, dt, x, gm, bb, t, st, st + c, mom, eps, st + 2 * c, st + 3 * c, 1, WS, WSB) &&
       !B->add(B, cnt, dt, t, s, y1) && !B->act_fwd(B, TT_ACT_RELU, cnt, dt, y1, y1) &&
       !B->bn_fwd_train_add_relu(B, n, c, hw, dt, x, gm, bb, s, y2, st + 6 * c, st + 7 * c, mom, eps, st + 8 * c, st + 9 * c,
                                 1, WS, WSB);
  TT_CHECK(ok, "%s %s %dx%dx%d forward: %s", tt_dtype_name(dt), lay, n, c, hw, B->last_error(B));
  if (!ok) goto done;
  TT_CHECK(!memcmp(y1, y2, nb), "bn_fwd_train_add_relu %s %s %dx%dx%d: y differs from bn_fwd_train, add, act_fwd(RELU)",
           tt_dtype_name(dt), lay, n, c, hw);
  TT_CHECK(!memcmp(st, st + 6 * c, 4 * fb), "bn_fwd_train_add_relu %s %s: statistics differ from bn_fwd_train's",
           tt_dtype_name(dt), lay);
  ok = !B->bn_fwd_train_add_relu(B, n, c, hw, dt, x, gm, bb, y3, y3, st + 6 * c, st + 7 * c, mom, eps, st + 8 * c,
                                 st + 9 * c, 0, WS, WSB);
  TT_CHECK(ok && !memcmp(y1, y3, nb), "bn_fwd_train_add_relu %s %s in place on the shortcut (y == s): y differs (%s)",
           tt_dtype_name(dt), lay, ok ? "" : B->last_error(B));
  for (size_t i = 0; i < cnt; i++) { /* +0, all bytes zero: the ReLU's zeros */
    size_t z = 0;
    for (size_t k = 0; k < es; k++) z += y1[i * es + k] == 0;
    zeros += z == es;
  }
  TT_CHECK(zeros > 0 && (size_t)zeros < cnt, "%s %s: %d of %zu outputs zero: the inputs do not exercise the ReLU",
           tt_dtype_name(dt), lay, zeros, cnt);
  if (B->act_mask) TT_CHECK(!B->act_mask(B, TT_ACT_RELU, cnt, dt, y1, mask), "act_mask: %s", B->last_error(B));
  for (int form = 0; form < 4; form++) /* 0: y; 1: y with ds == dy; 2: the mask; 3: y with dx == dy (beta_dx 0) */
    for (int beta = 0; beta < 2 && (form != 2 || B->act_mask); beta++) {
      float bs = form == 1 ? 0.0f : (float)beta, bd = form == 3 ? 0.0f : (float)beta, bp = (float)beta;
      memcpy(dx1, dx0, nb), memcpy(dx2, dx0, nb), memcpy(ds1, ds0, nb), memcpy(ds2, ds0, nb), memcpy(dyc, dy, nb);
      memcpy(st + 4 * c, st0, 2 * fb), memcpy(st + 10 * c, st0, 2 * fb);
      ok = !B->act_bwd(B, TT_ACT_RELU, cnt, dt, y1, dy, d, 0.0f) && !B->accumulate(B, cnt, dt, d, ds1, bs) &&
           !B->accumulate(B, cnt, dt, d, g, 0.0f) &&
           !B->bn_bwd(B, n, c, hw, dt, x, g, gm, st + 2 * c, st + 3 * c, dx1, st + 4 * c, st + 5 * c, bd, bp, WS, WSB) &&
           !B->bn_bwd_add_relu(B, n, c, hw, dt, x, form == 2 ? NULL : y1, form == 2 ? mask : NULL, dyc, gm, st + 8 * c,
                               st + 9 * c, form == 3 ? (void *)dyc : (void *)dx2, form == 1 ? (void *)dyc : (void *)ds2,
                               st + 10 * c, st + 11 * c, bd, bs, bp, WS, WSB);
      TT_CHECK(ok, "%s %s %dx%dx%d backward form %d: %s", tt_dtype_name(dt), lay, n, c, hw, form, B->last_error(B));
      if (!ok) break;
      TT_CHECK(!memcmp(dx1, form == 3 ? dyc : dx2, nb) && !memcmp(ds1, form == 1 ? dyc : ds2, nb),
               "bn_bwd_add_relu %s %s %dx%dx%d form %d beta %d: dx or ds differ from act_bwd, accumulate, bn_bwd",
               tt_dtype_name(dt), lay, n, c, hw, form, beta);
      TT_CHECK(!memcmp(st + 4 * c, st + 10 * c, 2 * fb), "bn_bwd_add_relu %s %s form %d beta %d: dgamma or dbias differ",
               tt_dtype_name(dt), lay, form, beta);
    }
done:
  free(x), free(s), free(dy), free(dx0), free(ds0), free(gm), free(bb), free(st0), free(st), free(t), free(y1), free(y2);
  free(y3), free(d), free(g), free(dx1), free(dx2), free(ds1), free(ds2), free(dyc), free(mask);
}

static void test_bn_add_relu_fused(void) {
  static const tt_dtype dts[3] = {TT_F32, TT_BF16, TT_F16};
  TT_TEST_BEGIN(tn("bn_add_relu_fused"));
  if (!B->bn_fwd_train_add_relu || !B->bn_bwd_add_relu) { /* optional (backend.h): the CPU backend's come later */
    TT_CHECK(strcmp(B->name, "ref") != 0, "the reference backend lists no fused batch norm + add + ReLU");
    TT_TEST_END();
    return;
  }
  for (int k = 0; k < 3; k++) {
    fuse_case(dts[k], 3, 4, 10, "NCHW");
    fuse_case(dts[k], 2, 3, 49, "NCHW");
    fuse_case(dts[k], 30, 8, 1, "NHWC");
  }
  TT_TEST_END();
}

static void test_more(void) {
  test_bn();
  test_bn_add_relu_fused();
  test_pool();
  test_gap();
  test_act();
  test_add_accumulate_copy();
  test_dropout();
  test_softmax_ce();
  test_optim();
  test_check_finite();
  test_check_finite_multi();
  test_sum_squares();
}

static void test_backend(void) {
  test_conv_case("conv_3x3_s1_p1_bias", mkconv(2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1), 1);
  test_conv_case("conv_3x2_s2_p0_groups2", mkconv(2, 4, 8, 8, 6, 3, 2, 2, 2, 0, 0, 2), 1);
  test_conv_case("conv_depthwise_3x3_s2_p2_nobias", mkconv(2, 4, 6, 7, 4, 3, 3, 2, 2, 2, 2, 4), 0);
  test_conv_case("conv_1x1_bias", mkconv(3, 5, 5, 5, 3, 1, 1, 1, 1, 0, 0, 1), 1);
  test_conv_case("conv_2x4_s1x2_p1x2_nobias", mkconv(2, 2, 9, 10, 3, 2, 4, 1, 2, 1, 2, 1), 0);
  test_conv_case("conv_3x3_s2_p1_downsample", mkconv(2, 3, 9, 9, 4, 3, 3, 2, 2, 1, 1, 1), 1);
  test_conv_case("conv_5x5_p2_lenet", mkconv(2, 1, 12, 12, 3, 5, 5, 1, 1, 2, 2, 1), 1);
  if (!strcmp(B->name, "ref")) test_conv_chunked(); /* the reference's own chunk rule */
  test_conv_f16();
  test_linear();
  test_more();
}

/* Every check of test_backend on backend k (0: the reference, 1: oneDNN). */
static void test_on(int k) {
  B = k ? tt_cpu_backend_create(0) : tt_ref_backend_create(0);
  if (!B) {
    printf("FAIL test_ops: could not create the %s backend\n", k ? "oneDNN CPU" : "reference");
    tt_test_failures++;
    return;
  }
  if (!k) test_f16_conversion(); /* its name is the reference's: "ref:f16_conversion" */
  test_backend();
  B->destroy(B);
}
static void test_ref(void) { test_on(0); }
static void test_onednn(void) { test_on(1); }

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("ref", "kernels ref", test_ref),
  TT_TEST("cpu", "kernels cpu onednn", test_onednn),
};

/* main's setup and teardown: the ops' shared workspace */
static int setup(void) {
  WS = malloc(WSB);
  return 0;
}
static void teardown(void) { free(WS); }

int main(int argc, char **argv) {
  tt_cpu_isa_hold(tt_knobs_get()->be.cpu_isa, NULL, 0); /* TINYTRAIN_CPU_ISA, for the backends made without knobs */
  return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), setup, teardown);
}
