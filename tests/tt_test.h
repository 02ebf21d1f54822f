/* Minimal test harness. Each test binary prints one line per check group:
 *   PASS <name>
 *   FAIL <name>: <why>
 *   SKIP <name>: <why>
 * and exits 1 if anything failed. tests/run_tests.py runs every binary and prints the
 * closing "N passed, N failed, N skipped" line. */
#ifndef TT_TEST_H
#define TT_TEST_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int tt_test_failures;
static int tt_test_current_failed;
static const char *tt_test_current_name;

#define TT_TEST_BEGIN(name) \
  do { tt_test_current_name = (name); tt_test_current_failed = 0; } while (0)
#define TT_TEST_END() \
  do { if (!tt_test_current_failed) printf("PASS %s\n", tt_test_current_name); fflush(stdout); } while (0)
#define TT_SKIP(name, why) do { printf("SKIP %s: %s\n", (name), (why)); fflush(stdout); } while (0)

/* Records a failure for the current test (prints only the first one per test). */
#define TT_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) {                                                                \
      if (!tt_test_current_failed) {                                              \
        printf("FAIL %s: %s:%d: ", tt_test_current_name, __FILE__, __LINE__);     \
        printf(__VA_ARGS__);                                                      \
        printf("\n");                                                             \
        fflush(stdout);                                                           \
      }                                                                           \
      tt_test_current_failed = 1;                                                 \
      tt_test_failures++;                                                         \
    }                                                                             \
  } while (0)

#define TT_TEST_EXIT() return tt_test_failures ? 1 : 0

#endif
