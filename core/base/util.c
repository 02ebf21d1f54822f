#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A counter of host allocations made through tt_malloc; only tests read it. */
static volatile uint64_t util_alloc_count;
/* The value of the counter at which an allocation fails (tt_host_alloc_fail_at); 0: none. */
static volatile uint64_t util_alloc_fail_at;

/* Counts one allocation; 1 when the test hook says this one fails. */
static int util_alloc_fails(void) {
  uint64_t k = __sync_add_and_fetch(&util_alloc_count, 1);
  return util_alloc_fail_at != 0 && k == util_alloc_fail_at;
}

/* Arms the failure hook: the n-th allocation from now fails (n counts from the next call of
 * tt_malloc/tt_calloc); n = 0 disarms it. Tests only; not thread-safe against a concurrent arm. */
void tt_host_alloc_fail_at(uint64_t n) { util_alloc_fail_at = n ? tt_host_alloc_count() + n : 0; }

/* Formats the message into err->msg (truncated to its size; err may be NULL) and returns -1,
 * so that a failing path can read `return tt_fail(err, ...)`. */
int tt_fail(tt_err *err, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* malloc that never returns NULL without a message: on failure err says how many bytes and
 * for `what`. A zero-byte request allocates one byte so that a valid pointer means success.
 * The caller owns the block and frees it with free(). */
void *tt_malloc(size_t bytes, const char *what, tt_err *err) {
  void *p = util_alloc_fails() ? NULL : malloc(bytes ? bytes : 1);
  if (!p) tt_fail(err, "out of host memory allocating %zu bytes for %s", bytes, what);
  return p;
}

/* Zeroed n * size bytes, with the same contract as tt_malloc (zero n or size counts as 1). */
void *tt_calloc(size_t n, size_t size, const char *what, tt_err *err) {
  void *p = util_alloc_fails() ? NULL : calloc(n ? n : 1, size ? size : 1);
  if (!p) tt_fail(err, "out of host memory allocating %zu x %zu bytes for %s", n, size, what);
  return p;
}

uint64_t tt_host_alloc_count(void) { return __sync_fetch_and_add(&util_alloc_count, 0); }

/* Seconds on the monotonic clock since an arbitrary origin: for intervals only, never dates. */
double tt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The default warning sink: one line to stderr; ud is unused. */
void tt_warn_stderr(void *ud, const char *line) {
  (void)ud;
  fprintf(stderr, "%s\n", line);
}

/* Makes room for `more` bytes and the terminating zero; 0, or -1 with oom set. */
static int util_strbuf_reserve(tt_strbuf *b, size_t more) {
  size_t cap;
  char *q;
  if (b->oom) return -1;
  if (b->n + more + 1 <= b->cap) return 0;
  cap = b->cap ? b->cap : 256;
  while (cap < b->n + more + 1) cap *= 2;
  q = (char *)realloc(b->p, cap);
  if (!q) {
    b->oom = 1;
    return -1;
  }
  b->p = q;
  b->cap = cap;
  return 0;
}

/* Appends n bytes of s and keeps p zero-terminated. Once an allocation failed (b->oom) every
 * later append is dropped, so callers check oom once at the end instead of after each call. */
void tt_strbuf_put(tt_strbuf *b, const char *s, size_t n) {
  if (util_strbuf_reserve(b, n)) return;
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

/* Appends a printf-formatted string: measures it first, then formats in place (two passes over
 * the arguments). A formatting error sets oom like a failed allocation. */
void tt_strbuf_printf(tt_strbuf *b, const char *fmt, ...) {
  va_list ap;
  int k;
  if (b->oom) return;
  va_start(ap, fmt);
  k = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (k < 0) {
    b->oom = 1;
    return;
  }
  if (util_strbuf_reserve(b, (size_t)k)) return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
  va_end(ap);
  b->n += (size_t)k;
}

/* Appends s as a JSON string literal: quotes, a backslash before '"' and before a backslash,
 * control characters as 4-hex-digit code point escapes; bytes >= 0x80 pass through, so valid
 * UTF-8 in gives valid UTF-8 out. */
/* The length of the UTF-8 sequence at p (RFC 3629: a lead byte, its continuation bytes 10xxxxxx,
 * the shortest form only, no surrogates, at most U+10FFFF), or 0 when none starts there. */
static int utf8_seq(const unsigned char *p) {
  unsigned c = *p, n, cp, min;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) n = 1, cp = c & 0x1f, min = 0x80;
  else if ((c & 0xf0) == 0xe0) n = 2, cp = c & 0x0f, min = 0x800;
  else if ((c & 0xf8) == 0xf0) n = 3, cp = c & 0x07, min = 0x10000;
  else return 0;
  for (unsigned k = 1; k <= n; k++) {
    if ((p[k] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[k] & 0x3f);
  }
  return cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : (int)n + 1;
}

int tt_utf8_valid(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    int n = utf8_seq(p);
    if (!n) return 0;
    p += n;
  }
  return 1;
}

void tt_strbuf_json(tt_strbuf *b, const char *s) {
  tt_strbuf_put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      char e[2];
      e[0] = '\\';
      e[1] = (char)ch;
      tt_strbuf_put(b, e, 2);
    } else if (ch < 0x20) {
      tt_strbuf_printf(b, "\\u%04x", ch);
    } else if (ch >= 0x80) { /* a UTF-8 sequence as it is; a byte that starts none as \u00XX (read as Latin-1),
                              * so that a file name in another encoding still makes valid JSON */
      int n = utf8_seq((const unsigned char *)s);
      if (n) tt_strbuf_put(b, s, (size_t)n), s += n - 1;
      else tt_strbuf_printf(b, "\\u%04x", ch);
    } else {
      tt_strbuf_put(b, (const char *)&ch, 1);
    }
  }
  tt_strbuf_put(b, "\"", 1);
}

/* Levenshtein distance between a and b, ignoring ASCII case, with one rolling row. Returns
 * cap + 1 as soon as the distance must exceed cap, and for strings over 64 bytes (the row is
 * on the stack): callers only ask "is it a near miss?", never for a large exact distance. */
int tt_edit_distance(const char *a, const char *b, int cap) {
  size_t la = strlen(a), lb = strlen(b);
  int row[65];
  if (lb > 64 || la > 64) return cap + 1;
  if ((la > lb ? la - lb : lb - la) > (size_t)cap) return cap + 1;
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = row[0], best;
    row[0] = (int)i, best = row[0];
    for (size_t j = 1; j <= lb; j++) {
      int up = row[j], ca = a[i - 1], cb = b[j - 1];
      if (ca >= 'A' && ca <= 'Z') ca += 32;
      if (cb >= 'A' && cb <= 'Z') cb += 32;
      int v = diag + (ca != cb);
      if (up + 1 < v) v = up + 1;
      if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
      row[j] = v, diag = up;
      if (v < best) best = v;
    }
    if (best > cap) return cap + 1;
  }
  return row[lb] > cap ? cap + 1 : row[lb];
}

/* The entry of the NULL-terminated names that is a likely misspelling of s (for "did you
 * mean ...?" hints): distance at most 2 and less than half of s's length, so that short
 * words do not match everything; the first of equally near names wins; NULL if none. */
const char *tt_nearest_name(const char *s, const char *const *names) {
  const char *best = NULL;
  int bd = 3, len = (int)strlen(s);
  for (int k = 0; names[k]; k++) {
    int d = tt_edit_distance(s, names[k], 2);
    if (d < bd && 2 * d < len) bd = d, best = names[k];
  }
  return best;
}

/* Parses a byte count such as "512", "1.5G" or "64MiB" into *bytes (fractions of a unit are
 * truncated to whole bytes). Returns 0, or -1 for anything malformed or overflowing (*bytes
 * untouched) and for a size of zero (*bytes is then 0). */
int tt_parse_size(const char *str, size_t *bytes) {
  /* digits, an optional fraction (.digits), an optional unit K M G T (powers of 1024; then
   * optionally iB or B), an optional B alone; nothing else: no sign, spaces, hex or exponent,
   * and nothing that overflows size_t */
  const char *p = str;
  unsigned long long whole = 0, mul = 1;
  double frac = 0.0, scale = 0.1;
  if (!str || !bytes) return -1;
  if (*p < '0' || *p > '9') return -1;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (whole > (~0ull - 9) / 10) return -1;
    whole = whole * 10 + (unsigned long long)(*p - '0');
  }
  if (*p == '.') {
    if (p[1] < '0' || p[1] > '9') return -1;
    for (p++; *p >= '0' && *p <= '9'; p++, scale *= 0.1) frac += (*p - '0') * scale;
  }
  switch (*p) {
    case 'k': case 'K': mul = 1ull << 10, p++; break;
    case 'm': case 'M': mul = 1ull << 20, p++; break;
    case 'g': case 'G': mul = 1ull << 30, p++; break;
    case 't': case 'T': mul = 1ull << 40, p++; break;
    default: break;
  }
  if (mul > 1 && p[0] == 'i' && (p[1] == 'B' || p[1] == 'b')) p++;
  if (*p == 'B' || *p == 'b') p++;
  if (*p) return -1;
  if (whole > (unsigned long long)SIZE_MAX / mul) return -1;
  unsigned long long n = whole * mul, f = (unsigned long long)(frac * (double)mul);
  if (n > (unsigned long long)SIZE_MAX - f) return -1;
  *bytes = (size_t)(n + f);
  return *bytes ? 0 : -1;
}

const char *tt_size_text(char *buf, size_t n, size_t bytes, int up) {
  double gib = bytes / 1073741824.0, mib = bytes / 1048576.0;
  if (gib >= 1.0)
    snprintf(buf, n, "%.2f GiB", up ? ceil(gib * 100.0) / 100.0 : gib);
  else
    snprintf(buf, n, up ? "%.0f MiB" : "%.1f MiB", up ? ceil(mib) : mib);
  return buf;
}
