/* kernels/ref/ref_state.c — what every file of the reference backend (and the oneDNN backend,
 * through ref.h) shares: the per-backend state (thread count, error buffer), the failure helper
 * that records an op's error there, and the argument checks every op family runs first.
 *
 * It depends on nothing else of kernels/ref/: the op families call it, and the table
 * (ref_backend.c) calls the families, so the files form no circle.
 */
#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>

#include "ref_internal.h"

int tt_ref_fail(tt_backend *b, const char *fmt, ...) {
  if (b && b->impl) {
    tt_ref_state *st = (tt_ref_state *)b->impl;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->err, sizeof st->err, fmt, ap);
    va_end(ap);
  }
  return -1;
}

void tt_ref_state_init(tt_ref_state *st, int threads) {
  if (threads <= 0) {
#ifdef _OPENMP
    threads = omp_get_num_procs();
#else
    threads = 1;
#endif
  }
  if (threads < 1) threads = 1;
  st->threads = threads;
  st->err[0] = 0;
  openblas_set_num_threads(1); /* we thread around single-threaded calls: see tt_ref_sgemm */
}

int tt_ref_dt_check(tt_backend *b, const char *op, tt_dtype dt) {
  if (dt == TT_F32 || dt == TT_F16 || dt == TT_BF16) return 0;
  return tt_ref_fail(b, "%s: unknown dtype %d (the %s backend computes fp32, fp16 and bf16)", op, (int)dt, b->name);
}

int tt_ref_nchw_check(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt) {
  if (n <= 0 || c <= 0 || hw <= 0) return tt_ref_fail(b, "%s: bad shape n=%d c=%d hw=%d", op, n, c, hw);
  if (tt_ref_dt_check(b, op, dt)) return -1;
  return 0;
}
