/* tests/kernels/ops_util.h — what tests/kernels/test_ops.c and tests/kernels/test_transformer_ops.c
 * share: the backend under test (B) and the "<backend>:<name>" test names, the random inputs, and
 * the central finite-difference check of a backward. The including file defines OPS_SEED, the
 * seed of its own random stream (each test keeps the inputs it has always seen). */
#ifndef TT_TEST_OPS_UTIL_H
#define TT_TEST_OPS_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/base/util.h"
#include "kernels/backend.h"
#include "tests/tt_test.h"

static tt_backend *B; /* the backend the running test checks */
static tt_test_rng ops_rng = {OPS_SEED};

/* "<backend>:<name>", in one of 8 rotating buffers. */
static inline const char *tn(const char *name) {
  static char buf[8][128];
  static int k;
  char *o = buf[k++ & 7];
  snprintf(o, 128, "%s:%s", B->name, name);
  return o;
}

static inline double urand(void) { return tt_test_rng_unit(&ops_rng); } /* [0, 1) */
static inline float frand(void) { return (float)(2.0 * urand() - 1.0); } /* [-1, 1) */
/* n floats uniform in [-1, 1) (malloc'ed, at least one). */
static inline float *fvec(size_t n) {
  float *p = (float *)malloc((n ? n : 1) * sizeof(float));
  size_t i;
  for (i = 0; i < n; i++) p[i] = frand();
  return p;
}
static inline double dot(const float *a, const float *b, size_t n) {
  double s = 0.0;
  size_t i;
  for (i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}
static inline double maxabs(const float *a, size_t n) {
  double m = 0.0;
  size_t i;
  for (i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
  return m;
}
/* Max |a-b| relative to max|b| (for fp16 comparisons and accumulation checks). */
static inline double maxdiff_rel(const float *a, const float *b, size_t n) {
  double m = 0.0, s = maxabs(b, n);
  size_t i;
  for (i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
  return s > 0 ? m / s : m;
}

/* fp16 copies (malloc'ed) and fp16 rounding in place */
static inline uint16_t *to16(const float *a, size_t n) {
  uint16_t *h = (uint16_t *)malloc((n ? n : 1) * 2);
  size_t i;
  for (i = 0; i < n; i++) h[i] = tt_f32_to_f16(a[i]);
  return h;
}
static inline void round16(float *a, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) a[i] = tt_f16_to_f32(tt_f32_to_f16(a[i]));
}

/* ---- generic finite-difference checker ---- */
typedef double (*loss_fn)(void *ctx);
#define FD_H 1e-2f
/* 1 when the analytic gradient a and the numeric one n agree (1% relative + 2e-3). */
static inline int close_fd(double a, double n) { return fabs(a - n) <= 1e-2 * fmax(fabs(a), fabs(n)) + 2e-3; }
/* Compares grad[i] with the central difference of f w.r.t. p[i] for up to `samples`
 * indices (all when n <= samples). */
static inline void fd_check(const char *what, loss_fn f, void *ctx, float *p, size_t n, const float *grad, int samples) {
  size_t k, cnt = n <= (size_t)samples ? n : (size_t)samples;
  for (k = 0; k < cnt; k++) {
    size_t i = n <= (size_t)samples ? k : (size_t)(urand() * (double)n);
    float old = p[i];
    double lp, lm, num;
    p[i] = old + FD_H;
    lp = f(ctx);
    p[i] = old - FD_H;
    lm = f(ctx);
    p[i] = old;
    num = (lp - lm) / (2.0 * (double)FD_H);
    TT_CHECK(close_fd(grad[i], num), "%s[%zu]: analytic %.6g vs numeric %.6g", what, i, (double)grad[i], num);
  }
}
#endif
