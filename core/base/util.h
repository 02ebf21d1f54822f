/* Internal helpers shared by every module: error reporting, checked allocation, a growable
 * string, JSON string quoting and size parsing.
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
/* Test hook: the n-th tt_malloc/tt_calloc from now (1: the next one) fails as if the host were
 * out of memory; 0 switches it off. Process-wide like the counter; only tests call it, to
 * check that every failure path releases what it took. */
void tt_host_alloc_fail_at(uint64_t n);

/* Where a stage reports a warning: one line, "file:line: warning: ..." or naming the file;
 * ud is the caller's. Recipe parsing and data loading take one (NULL: warnings dropped). */
typedef void (*tt_warn_fn)(void *ud, const char *line);
/* The tt_warn_fn of the command line and the train stage: the line on stderr. */
void tt_warn_stderr(void *ud, const char *line);

/* A growable NUL-terminated string for text built in memory (safetensors headers, the SVG
 * chart, the plan's JSON). Zero-initialise it; after an allocation failure oom is set and
 * later appends do nothing, so a writer checks oom once at the end. free(p) releases it. */
typedef struct tt_strbuf {
  char *p;     /* NULL until the first append */
  size_t n;    /* bytes used, not counting the terminating zero */
  size_t cap;
  int oom;
} tt_strbuf;

void tt_strbuf_put(tt_strbuf *b, const char *s, size_t n);
void tt_strbuf_printf(tt_strbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Appends s as a quoted JSON string: '"' and '\\' escaped, control characters as \u00XX, and a
 * byte that starts no valid UTF-8 sequence as \u00XX (read as Latin-1): always valid JSON. */
void tt_strbuf_json(tt_strbuf *b, const char *s);

/* Size arithmetic that cannot wrap: the product or sum, or SIZE_MAX when it does not fit (and
 * SIZE_MAX in stays SIZE_MAX, so a chain of them needs one check at the end). */
static inline size_t tt_size_mul(size_t a, size_t b) {
  return (a == SIZE_MAX || b == SIZE_MAX || (a && b > SIZE_MAX / a)) ? SIZE_MAX : a * b;
}
static inline size_t tt_size_add(size_t a, size_t b) { return b >= SIZE_MAX - a ? SIZE_MAX : a + b; }

/* Parses "512M", "4G", "4GiB", "3.5G", "1024" (bytes); K, M, G, T are powers of 1024.
 * Returns 0, or -1 for anything else (zero bytes included). (--vram: core/app/cli.h) */
int tt_parse_size(const char *s, size_t *bytes);
/* bytes as "0.71 GiB" from 1 GiB up, else "5.6 MiB", into buf (n bytes), returned. up rounds up
 * (a size that must fit, as the smallest --vram of a refusal): to hundredths of a GiB, or to
 * whole MiB below 1 GiB, so that the figure fits when typed back. */
const char *tt_size_text(char *buf, size_t n, size_t bytes, int up);

/* The edit distance (insertions, deletions, substitutions; case-insensitive) between a and b,
 * counted up to cap + 1 (past it: cap + 1). For "did you mean" messages. */
int tt_edit_distance(const char *a, const char *b, int cap);
/* The name of names (NULL-terminated) nearest to s within distance 2 (and under half of s's
 * length, so short words do not match everything), or NULL. */
const char *tt_nearest_name(const char *s, const char *const *names);

/* Whether s is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF): names
 * that go into JSON (a run's class names in the weights' metadata) must be. */
int tt_utf8_valid(const char *s);

/* Monotonic clock in seconds. */
double tt_now(void);

#ifdef __cplusplus
}
#endif
#endif
