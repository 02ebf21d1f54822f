/* tests/compile/policy_util.h — what tests/compile/test_policy.c, tests/runtime/test_equiv.c and
 * tests/runtime/test_precision.c share: a recipe's model and graph, a training or evaluation Program
 * lowered and planned for a policy, and a main around one CPU backend. */
#ifndef TT_TEST_SCHED_UTIL_H
#define TT_TEST_SCHED_UTIL_H
#include <string.h>

#include "core/compile/graph.h"
#include "core/compile/program.h"
#include "core/compile/recipe.h"
#include "core/compile/policy.h"
#include "core/base/util.h"
#include "kernels/backend.h"
#include "tests/tt_test.h"

typedef struct net {
  tt_model m;
  tt_graph g;
  int have_m, have_g;
} net;

static inline int net_open(net *n, const char *name, const char *text, const char *path, tt_err *e) {
  memset(n, 0, sizeof *n);
  int rc = path ? tt_recipe_load(path, &n->m, e, NULL, NULL) : tt_recipe_parse(name, text, &n->m, e, NULL, NULL);
  if (rc) return -1;
  n->have_m = 1;
  if (tt_graph_build(&n->m, &n->g, e)) return -1;
  n->have_g = 1;
  return 0;
}
/* net_open inside a test: on failure the error is the test's FAIL line, the test ends, and -1 tells
 * the caller to return. */
static inline int net_open_test(net *n, const char *name, const char *text, const char *path, tt_err *e) {
  if (!net_open(n, name, text, path, e)) return 0;
  TT_CHECK(0, "%s", e->msg);
  TT_TEST_END();
  return -1;
}
static inline void net_close(net *n) {
  if (n->have_g) tt_graph_free(&n->g);
  if (n->have_m) tt_model_free(&n->m);
  memset(n, 0, sizeof *n);
}

/* A Program for mb x accum in dt, recomputing rec (may be NULL), in-place ops on or off. */
/* build_prog_ex with compact saves (policy.compact, what the scheduler plans) on or off */
static inline int build_prog_cx(const tt_graph *g, tt_backend *be, int mb, int accum, tt_dtype dt, const unsigned char *rec,
                                int training, int inplace, int compact, tt_program *p, tt_err *e) {
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = mb, pol.accum_steps = accum, pol.act_dtype = dt, pol.inplace = inplace;
  pol.recompute = (unsigned char *)rec, pol.training = training, pol.compact = compact;
  memset(p, 0, sizeof *p);
  if (tt_lower(g, &pol, be, p, e)) return -1;
  if (tt_program_plan(p, e)) {
    tt_program_free(p);
    return -1;
  }
  return 0;
}
static inline int build_prog_ex(const tt_graph *g, tt_backend *be, int mb, int accum, tt_dtype dt, const unsigned char *rec,
                                int training, int inplace, tt_program *p, tt_err *e) {
  return build_prog_cx(g, be, mb, accum, dt, rec, training, inplace, 0, p, e);
}
static inline int build_prog(const tt_graph *g, tt_backend *be, int mb, int accum, tt_dtype dt, const unsigned char *rec,
                             int training, tt_program *p, tt_err *e) {
  return build_prog_ex(g, be, mb, accum, dt, rec, training, 1, p, e);
}

/* One residual block of TT_TEST_RECIPE_BN. */
#define BLK(i, prev)                                                                                   \
  "[conv b" #i "c1]\nfilters = 8\nsize = 3\nbias = false\n[bn b" #i "n1]\n[relu b" #i "r1]\n"      \
  "[dropout b" #i "d]\np = 0.3\n"                                                                      \
  "[conv b" #i "c2]\nfilters = 8\nsize = 3\nbias = false\n[bn b" #i "n2]\n"                          \
  "[add b" #i "a]\nfrom = b" #i "n2, " prev "\n[relu b" #i "r2]\n"
/* A small residual net with batch norm and dropout (both test files train or plan it). */
#define TT_TEST_RECIPE_BN \
    "[net]\ninput = 1x12x12\nclasses = 5\n" \
    "[train]\nbatch = 16\nmicro_batch = 8\noptimizer = sgd\nlr = 0.05\nmomentum = 0.9\nweight_decay = 5e-4\nseed = 7\n" \
    "[conv c0]\nfilters = 8\nsize = 3\nbias = false\n" \
    "[bn n0]\n[relu r0]\n" \
    BLK(1, "r0") BLK(2, "b1r2") BLK(3, "b2r2") BLK(4, "b3r2") \
    "[maxpool p1]\nsize = 2\n" \
    "[flatten]\n" \
    "[linear fc]\nout = 5\n"

/* main for a binary whose tests run on one CPU backend: tt_test_main, with a setup that creates
 * the backend in *be (threads: 0 = all cores) and a teardown that prints "  (<what>: S s)" and
 * destroys it. The FAIL line when the backend cannot be created names the program. */
static struct {
  tt_backend **be;
  int threads;
  const char *what;
  double t0;
} tt_cpu_main;
static inline int tt_cpu_main_setup(void) {
  tt_cpu_main.t0 = tt_now();
  *tt_cpu_main.be = tt_cpu_backend_create(tt_cpu_main.threads);
  if (*tt_cpu_main.be) return 0;
  printf("FAIL %s: could not create the CPU backend\n", tt_cpu_main.what);
  return 1;
}
static inline void tt_cpu_main_teardown(void) {
  printf("  (%s: %.1f s)\n", tt_cpu_main.what, tt_now() - tt_cpu_main.t0);
  (*tt_cpu_main.be)->destroy(*tt_cpu_main.be);
}
static inline int tt_test_main_cpu(int argc, char **argv, const tt_test_case *t, int n, tt_backend **be, int threads,
                                   const char *what) {
  tt_cpu_main.be = be, tt_cpu_main.threads = threads, tt_cpu_main.what = what;
  return tt_test_main(argc, argv, t, n, tt_cpu_main_setup, tt_cpu_main_teardown);
}
#endif
