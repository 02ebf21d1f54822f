/* Internal helpers shared by every module: error reporting and checked allocation.
 * Library code never exits; it fills a tt_err and returns a non-zero status. */
#ifndef TT_UTIL_H
#define TT_UTIL_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_err {
  char msg[1024]; /* one line, names the file:line or buffer, says what to do */
} tt_err;

/* Formats into err->msg (if err is non-NULL) and returns -1, so callers can write
 * `return tt_fail(err, "...")`. */
int tt_fail(tt_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* malloc/calloc that report failure through err with what was being allocated. */
void *tt_malloc(size_t bytes, const char *what, tt_err *err);
void *tt_calloc(size_t n, size_t size, const char *what, tt_err *err);

/* Host allocation counter: every tt_malloc/tt_calloc increments it. Tests read it to
 * prove that a training step allocates nothing after setup. Atomic, process-wide:
 * it is a diagnostic counter, not state the library depends on. */
uint64_t tt_host_alloc_count(void);

/* Where a stage reports a warning: one line, "file:line: warning: ..." or naming the file;
 * ud is the caller's. Recipe parsing and data loading take one (NULL: warnings dropped). */
typedef void (*tt_warn_fn)(void *ud, const char *line);

/* Monotonic clock in seconds. */
double tt_now(void);

#ifdef __cplusplus
}
#endif
#endif
