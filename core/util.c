#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* A counter of host allocations made through tt_malloc; only tests read it. */
static volatile uint64_t util_alloc_count;

int tt_fail(tt_err *err, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return -1;
}

void *tt_malloc(size_t bytes, const char *what, tt_err *err) {
  void *p = malloc(bytes ? bytes : 1);
  __sync_fetch_and_add(&util_alloc_count, 1);
  if (!p) tt_fail(err, "out of host memory allocating %zu bytes for %s", bytes, what);
  return p;
}

void *tt_calloc(size_t n, size_t size, const char *what, tt_err *err) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  __sync_fetch_and_add(&util_alloc_count, 1);
  if (!p) tt_fail(err, "out of host memory allocating %zu x %zu bytes for %s", n, size, what);
  return p;
}

uint64_t tt_host_alloc_count(void) { return __sync_fetch_and_add(&util_alloc_count, 0); }

double tt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
