/* Minimal test harness. Each test binary prints one line per check group:
 *   PASS <name>
 *   FAIL <name>: <why>
 *   SKIP <name>: <why>
 * and exits 1 if anything failed. tests/run_tests.py runs every binary and prints the
 * closing "N passed, N failed, N skipped" line.
 *
 * Each binary registers its tests in one table (tt_test_case: a name, tags, a function) and
 * runs it with tt_test_main, which gives every binary the same command line:
 *   --list       prints one line per registered test, "<name>  <tags>", and runs nothing;
 *   --only WORD  runs the tests whose name is WORD or whose tags include it; given several
 *                times, the tests of the first WORD run first, then the second's, and so on
 *                (a test runs once). Without --only every test runs, in the table's order. */
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

/* The harness's state. A test built from several files (test_cuda) defines TT_TEST_EXTERN_STATE
 * in each before this header, and TT_TEST_STATE_HERE too in the one file that holds the state:
 * a failure checked in any file then counts in main's exit status. */
#if defined(TT_TEST_EXTERN_STATE) && !defined(TT_TEST_STATE_HERE)
#define TT_TEST_STATE_ extern
#elif defined(TT_TEST_EXTERN_STATE)
#define TT_TEST_STATE_
#else
#define TT_TEST_STATE_ static
#endif
TT_TEST_STATE_ int tt_test_failures;
TT_TEST_STATE_ int tt_test_current_failed;
TT_TEST_STATE_ const char *tt_test_current_name;

#define TT_TEST_BEGIN(name) \
  do { tt_test_current_name = (name); tt_test_current_failed = 0; } while (0)
#define TT_TEST_END() \
  do { if (!tt_test_current_failed) printf("PASS %s\n", tt_test_current_name); fflush(stdout); } while (0)
#define TT_SKIP(name, why) do { printf("SKIP %s: %s\n", (name), (why)); fflush(stdout); } while (0)

/* Records a failure for the current test. Prints the first one per test on the FAIL line; with
 * TT_TEST_ALL_FAILS=1 in the environment (tests/gpu/acceptance.sh: one device run must show every
 * defect, not the first) up to 12 more, each on an indented "  also" line that no runner counts. */
TT_TEST_STATE_ int tt_test_also;
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

/* ---- the registry: one table per binary ---- */

/* One registered test. name: what --only and --list name (usually the group its PASS line
 * names); tags: space-separated words (the stage, the op family, "kernels", ...); fn: runs it,
 * printing its own PASS / FAIL / SKIP lines. fn NULL registers a test this build cannot run:
 * it prints "SKIP <name>: <skip>". */
typedef struct tt_test_case {
  const char *name;
  const char *tags;
  void (*fn)(void);
  const char *skip;
} tt_test_case;
#define TT_TEST(name, tags, fn) {name, tags, fn, NULL}
#define TT_TEST_SKIPPED(name, tags, why) {name, tags, NULL, why}
#define TT_TEST_COUNT(table) ((int)(sizeof(table) / sizeof((table)[0])))

/* The command line tt_test_args read: the --only words (argv's own strings), and --list. */
typedef struct tt_test_opts {
  const char *only[32];
  int nonly, list;
} tt_test_opts;
static inline tt_test_opts *tt_test_opt(void) {
  static tt_test_opts o;
  return &o;
}

/* 1 when word is one of the space-separated words of list. */
static inline int tt_test_has_word(const char *list, const char *word) {
  size_t n = strlen(word);
  for (const char *p = list; p && *p;) {
    while (*p == ' ') p++;
    size_t k = strcspn(p, " ");
    if (k == n && k && !strncmp(p, word, n)) return 1;
    p += k;
  }
  return 0;
}
/* 1 when test t matches word: its name, or one of its tags. */
static inline int tt_test_matches(const tt_test_case *t, const char *word) {
  return !strcmp(t->name, word) || tt_test_has_word(t->tags, word);
}
/* 1 when test t runs under the command line's --only words (every test without one). */
static inline int tt_test_selected(const tt_test_case *t) {
  tt_test_opts *o = tt_test_opt();
  for (int i = 0; i < o->nonly; i++)
    if (tt_test_matches(t, o->only[i])) return 1;
  return o->nonly == 0;
}
/* 1 when --only was given and every test it selects from the table carries tag. */
static inline int tt_test_only_tagged(const tt_test_case *t, int n, const char *tag) {
  if (!tt_test_opt()->nonly) return 0;
  for (int i = 0; i < n; i++)
    if (tt_test_selected(&t[i]) && !tt_test_has_word(t[i].tags, tag)) return 0;
  return 1;
}

/* Reads argv (--only WORD, --only=WORD, --list). Returns 0 to go on, 2 on a bad argument
 * (printed, with the usage, to stderr). */
static inline int tt_test_args(int argc, char **argv) {
  tt_test_opts *o = tt_test_opt();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *w = NULL;
    if (!strcmp(a, "--list")) o->list = 1;
    else if (!strcmp(a, "--only") && i + 1 < argc) w = argv[++i];
    else if (!strncmp(a, "--only=", 7)) w = a + 7;
    else {
      fprintf(stderr, "%s: unknown argument '%s'\nusage: %s [--list] [--only NAME|TAG]...\n", argv[0], a, argv[0]);
      return 2;
    }
    if (w && o->nonly < 32) o->only[o->nonly++] = w;
  }
  return 0;
}
/* Prints the table, one "<name>  <tags>" line per test (--list). */
static inline void tt_test_list(const tt_test_case *t, int n) {
  for (int i = 0; i < n; i++) printf("%-40s %s\n", t[i].name, t[i].tags);
  fflush(stdout);
}
/* Prints "SKIP <name>: <why>" for every selected test of the table (a build or machine that can
 * run none of them). */
static inline void tt_test_skip_all(const tt_test_case *t, int n, const char *why) {
  for (int i = 0; i < n; i++)
    if (tt_test_selected(&t[i])) printf("SKIP %s: %s\n", t[i].name, why);
  fflush(stdout);
}
/* Calls around each test tt_test_run runs, NULL by default; a binary's main may set them (this
 * translation unit's copy: the static below is per file). test_cuda counts each "kernels"-tagged
 * test's cuBLAS and cuDNN calls with them. */
typedef struct tt_test_hooks {
  void (*before)(const tt_test_case *t);
  void (*after)(const tt_test_case *t);
} tt_test_hooks;
static inline tt_test_hooks *tt_test_hook(void) {
  static tt_test_hooks h;
  return &h;
}
/* Runs test i: its function (between the hooks), or its SKIP line. */
static inline void tt_test_run_one(const tt_test_case *t) {
  tt_test_hooks *h = tt_test_hook();
  if (t->fn) {
    if (h->before) h->before(t);
    t->fn();
    if (h->after) h->after(t);
  } else {
    printf("SKIP %s: %s\n", t->name, t->skip);
  }
  fflush(stdout);
}
/* Runs the selected tests of the table: in its order without --only, else the first --only
 * word's tests, then the next word's (each test once). */
static inline void tt_test_run(const tt_test_case *t, int n) {
  tt_test_opts *o = tt_test_opt();
  if (!o->nonly) {
    for (int i = 0; i < n; i++) tt_test_run_one(&t[i]);
    return;
  }
  /* test i runs in the turn of the first word that selects it */
  for (int w = 0; w < o->nonly; w++)
    for (int i = 0; i < n; i++) {
      int earlier = 0;
      for (int v = 0; v < w && !earlier; v++) earlier = tt_test_matches(&t[i], o->only[v]);
      if (!earlier && tt_test_matches(&t[i], o->only[w])) tt_test_run_one(&t[i]);
    }
}
/* The start of every binary's main: reads the command line and answers --list. Returns -1 when
 * the tests are to run (setup, tt_test_run, teardown follow), else the exit status to return
 * (the table printed, or a bad argument). */
static inline int tt_test_start(int argc, char **argv, const tt_test_case *t, int n) {
  int rc = tt_test_args(argc, argv);
  if (rc) return rc;
  if (!tt_test_opt()->list) return -1;
  tt_test_list(t, n);
  return 0;
}

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

/* Its path; empty until tt_test_tmpdir made it. 64 bytes: the tags are short words, and a caller's
 * snprintf(buf, "%s/file", tt_test_dir()) into a buffer of 128 or more cannot be cut short (gcc's
 * -Wformat-truncation sees the array's size). */
#define TT_TEST_DIR_MAX 64
static inline char *tt_test_dir(void) {
  static char dir[TT_TEST_DIR_MAX];
  return dir;
}
/* Makes /tmp/tt_test_<tag>_XXXXXX (a tag of up to 40 characters). On failure prints "FAIL <name>: ..."
 * and returns -1. */
static inline int tt_test_tmpdir(const char *tag, const char *name) {
  snprintf(tt_test_dir(), TT_TEST_DIR_MAX, "/tmp/tt_test_%.40s_XXXXXX", tag);
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

/* ---- the whole of main ---- */

/* main for a binary: reads the command line (tt_test_start), makes the binary's temporary
 * directory /tmp/tt_test_<name>_XXXXXX (tt_test_dir, tt_test_path; <name>: the program's name
 * without its "test_"), calls setup, runs the selected tests, calls teardown, removes the
 * directory and returns the exit status. setup and teardown may be NULL; setup returns nonzero
 * when it failed, after printing its FAIL line (then no test runs and the status is 1). */
static inline int tt_test_main(int argc, char **argv, const tt_test_case *t, int n, int (*setup)(void),
                               void (*teardown)(void)) {
  int rc = tt_test_start(argc, argv, t, n);
  if (rc >= 0) return rc;
  const char *prog = argc > 0 && strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argc > 0 ? argv[0] : "test";
  if (tt_test_tmpdir(strncmp(prog, "test_", 5) ? prog : prog + 5, prog)) return 1;
  rc = setup ? setup() : 0;
  if (!rc) {
    tt_test_run(t, n);
    if (teardown) teardown();
  }
  tt_test_tmpdir_remove();
  return rc ? 1 : tt_test_failures ? 1 : 0;
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
