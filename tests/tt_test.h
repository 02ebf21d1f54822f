/* Minimal test harness. Each test binary prints one line per check group:
 *   PASS <name>
 *   FAIL <name>: <why>
 *   SKIP <name>: <why>
 * and exits 1 if anything failed. tests/run_tests.py runs every binary and prints the
 * closing "N passed, N failed, N skipped" line. */
#ifndef TT_TEST_H
#define TT_TEST_H
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernel_math.h"

static int tt_test_failures;
static int tt_test_current_failed;
static const char *tt_test_current_name;

#define TT_TEST_BEGIN(name) \
  do { tt_test_current_name = (name); tt_test_current_failed = 0; } while (0)
#define TT_TEST_END() \
  do { if (!tt_test_current_failed) printf("PASS %s\n", tt_test_current_name); fflush(stdout); } while (0)
#define TT_SKIP(name, why) do { printf("SKIP %s: %s\n", (name), (why)); fflush(stdout); } while (0)

/* Records a failure for the current test. Prints the first one per test on the FAIL line; with
 * TT_TEST_ALL_FAILS=1 in the environment (tests/gpu/acceptance.sh: one device run must show every
 * defect, not the first) up to 12 more, each on an indented "  also" line that no runner counts. */
static int tt_test_also;
static inline int tt_test_all_fails(void) {
  static int v = -1;
  (void)tt_test_also;
  if (v < 0) v = getenv("TT_TEST_ALL_FAILS") && !strcmp(getenv("TT_TEST_ALL_FAILS"), "1");
  return v;
}
#define TT_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) {                                                                \
      if (!tt_test_current_failed) {                                              \
        printf("FAIL %s: %s:%d: ", tt_test_current_name, __FILE__, __LINE__);     \
        printf(__VA_ARGS__);                                                      \
        printf("\n");                                                             \
        fflush(stdout);                                                           \
        tt_test_also = 0;                                                         \
      } else if (tt_test_all_fails() && tt_test_also++ < 12) {                    \
        printf("  also %s:%d: ", __FILE__, __LINE__);                             \
        printf(__VA_ARGS__);                                                      \
        printf("\n");                                                             \
        fflush(stdout);                                                           \
      }                                                                           \
      tt_test_current_failed = 1;                                                 \
      tt_test_failures++;                                                         \
    }                                                                             \
  } while (0)

#define TT_TEST_EXIT() return tt_test_failures ? 1 : 0

/* ---- the sanitizer build ---- */

/* 1 when the test runs in the sanitizer build's `ninja test` (configure.py --sanitize puts
 * TT_TEST_SANITIZE=1 in the tests' environment; set it by hand to run a sanitized binary the
 * same way). ASan + UBSan make code 3-10x slower and find their errors on the first pass over a
 * code path: the long numerical parts (accuracy over hundreds of steps, big planning sweeps)
 * then run shorter or smaller, and the parts that are only numerics or timing print a SKIP
 * "under sanitizers: ..." (tt_test_skip_sanitized). The plain build runs them in full. */
static inline int tt_test_sanitized(void) {
  const char *v = getenv("TT_TEST_SANITIZE");
  return v && *v && strcmp(v, "0") != 0;
}
/* Under the sanitizers prints "SKIP <name>: under sanitizers: <why>" and returns 1 (the
 * caller returns); else returns 0. */
static inline int tt_test_skip_sanitized(const char *name, const char *why) {
  if (!tt_test_sanitized()) return 0;
  printf("SKIP %s: under sanitizers: %s\n", name, why);
  fflush(stdout);
  return 1;
}

/* ---- deterministic generators: the same data on every run and machine ---- */

/* A splitmix64 stream (the project's one mixer, kernels/kernel_math.h); s is the seed. */
typedef struct tt_test_rng { uint64_t s; } tt_test_rng;
static inline uint64_t tt_test_rng_next(tt_test_rng *r) { return tt_splitmix_next(&r->s); }
/* Uniform in [0, 1): the top 53 bits. */
static inline double tt_test_rng_unit(tt_test_rng *r) {
  return (double)(tt_test_rng_next(r) >> 11) / 9007199254740992.0;
}
/* Uniform in [lo, hi], both included (modulo bias is irrelevant here). */
static inline int tt_test_rng_int(tt_test_rng *r, int lo, int hi) {
  return lo + (int)(tt_test_rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* xorshift64 (13, 7, 17): the generator test_recipe's fuzzer and test_cuda's inputs were
 * written with. Kept rather than moved to the splitmix stream so those tests keep seeing the
 * very inputs they always have. *s must not be 0. */
static inline uint64_t tt_test_xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return *s = x;
}

/* ---- one temporary directory per test binary ---- */

/* Its path; empty until tt_test_tmpdir made it. */
static inline char *tt_test_dir(void) {
  static char dir[256];
  return dir;
}
/* Makes /tmp/tt_test_<tag>_XXXXXX. On failure prints "FAIL <name>: ..." and returns -1. */
static inline int tt_test_tmpdir(const char *tag, const char *name) {
  snprintf(tt_test_dir(), 256, "/tmp/tt_test_%s_XXXXXX", tag);
  if (mkdtemp(tt_test_dir())) return 0;
  printf("FAIL %s: cannot create a temporary directory\n", name);
  return -1;
}
/* <dir>/<name> in buf (1024 bytes). */
static inline const char *tt_test_path_in(char *buf, const char *name) {
  snprintf(buf, 1024, "%s/%s", tt_test_dir(), name);
  return buf;
}
/* <dir>/<name> in one of 8 rotating buffers: enough for the arguments of one call. */
static inline const char *tt_test_path(const char *name) {
  static char buf[8][1024];
  static int k;
  return tt_test_path_in(buf[k++ & 7], name);
}
/* Removes the directory and everything in it (the end of main). */
static inline void tt_test_tmpdir_remove(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tt_test_dir());
  if (system(cmd) != 0) printf("# could not remove %s\n", tt_test_dir());
}

/* A reader that opens a named pipe waits for a writer forever: a test that could hang arms
 * this alarm, which turns the hang into a failure of the test that hung after `seconds`
 * (alarm(0) disarms it). */
static inline void tt_test_on_alarm(int sig) {
  char line[256];
  int n = snprintf(line, sizeof line, "FAIL %s: hung for the alarm's time (a named pipe was opened and waited on)\n",
                   tt_test_current_name ? tt_test_current_name : "?");
  (void)sig;
  if (write(1, line, (size_t)n) < 0) _exit(2);
  _exit(1);
}
static inline void tt_test_arm_alarm(unsigned seconds) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = tt_test_on_alarm;
  sigaction(SIGALRM, &sa, NULL);
  alarm(seconds);
}

#endif
