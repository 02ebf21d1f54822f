/* tests/bench/bench_plan.c — planning time against depth: what `tinytrain plan` does (build,
 * schedule, the report's extra plans) for chains and residual nets of many layers, without and
 * with a budget that forces recomputation. Prints numbers; never passes or fails.
 *
 *   build/bench/bench_plan [LAYERS...]
 *
 * Defaults: 5000 20000 50000. Each line gives seconds per stage and microseconds per layer:
 * about constant per layer means planning grows linearly (it grew with the square: 113 s at
 * 50,000 layers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/compile/graph.h"
#include "core/compile/recipe.h"
#include "core/compile/policy.h"

/* About `layers` layers: conv-bn-relu blocks (residual: two and an add and a relu), repeated
 * in groups of at most 9000 (the recipe's repeat limit is 10000). */
static char *bench_recipe(int layers, int residual) {
  size_t cap = 4096;
  char *t = (char *)malloc(cap);
  int per = residual ? 7 : 3, blocks = layers / per, n = 0, k = 0;
  if (!t) return NULL;
  n += snprintf(t + n, cap - n, "[net]\ninput = 3x16x16\nclasses = 10\n[train]\nbatch = 32\n");
  if (residual)
    n += snprintf(t + n, cap - n, "[block b]\n[conv c1]\nfilters = 8\nsize = 3\nbias = false\n[bn n1]\n[relu r1]\n"
                                  "[conv c2]\nfilters = 8\nsize = 3\nbias = false\n[bn n2]\n[add a]\nfrom = n2, in\n"
                                  "[relu r2]\n[end]\n[conv stem]\nfilters = 8\nsize = 3\n");
  else
    n += snprintf(t + n, cap - n, "[block b]\n[conv c]\nfilters = 8\nsize = 3\nbias = false\n[bn n]\n[relu r]\n[end]\n");
  for (; blocks > 0 && n < (int)cap - 100; k++) {
    int c = blocks > 9000 ? 9000 : blocks;
    n += snprintf(t + n, cap - n, "[b g%d]\nrepeat = %d\n", k, c);
    blocks -= c;
  }
  snprintf(t + n, cap - n, "[gap]\n[linear fc]\nout = 10\n");
  return t;
}

static double bench_now(void) { return (double)clock() / CLOCKS_PER_SEC; }

/* Plans one recipe the way `plan` does; prints one line. budget_frac > 0: a budget of that
 * fraction of the unbudgeted arena, at the same micro-batch, so recomputation must close it. */
static void bench_one(tt_backend *be, int layers, int residual, double budget_frac, size_t *arena_io) {
  tt_err e;
  tt_model m;
  tt_graph g;
  tt_policy_result r;
  char *text = bench_recipe(layers, residual);
  double t0 = bench_now();
  if (!text || tt_recipe_parse("bench.recipe", text, &m, &e, NULL, NULL)) {
    printf("%6d layers: %s\n", layers, text ? e.msg : "out of memory");
    free(text);
    return;
  }
  double t1 = bench_now();
  if (tt_graph_build(&m, &g, &e)) {
    printf("%6d layers: %s\n", layers, e.msg);
    tt_model_free(&m);
    free(text);
    return;
  }
  double t2 = bench_now();
  tt_policy_opts o;
  memset(&o, 0, sizeof o);
  o.inplace = 1, o.precision = TT_PREC_FP16, o.micro_batch = 32, o.profile = tt_profile_cuda_generic();
  if (budget_frac > 0) o.vram_bytes = (size_t)(budget_frac * (double)*arena_io);
  int rc = tt_policy_search(&g, be, &o, &r, &e);
  double t3 = bench_now();
  if (!rc) tt_policy_explain(&g, be, &o, &r);
  double t4 = bench_now();
  if (rc) {
    printf("%6d layers (%s%s): %s\n", g.nnodes - 1, residual ? "residual" : "chain", budget_frac > 0 ? ", budget" : "",
           e.msg);
  } else {
    int rec = 0;
    for (int v = 0; v < g.nnodes; v++) rec += r.recompute[v] != 0;
    printf("%6d layers (%-8s %s): parse %.2f s, build %.2f s, schedule %.2f s, report %.2f s; %.1f us/layer; "
           "arena %.1f MiB (x%.4f), %d recomputed\n",
           g.nnodes - 1, residual ? "residual" : "chain", budget_frac > 0 ? "budget " : "no budget", t1 - t0, t2 - t1,
           t3 - t2, t4 - t3, 1e6 * (t4 - t0) / (g.nnodes - 1), r.train.arena_bytes / 1048576.0,
           (double)r.train.arena_bytes / (double)r.train.peak_live_bytes, rec);
    if (budget_frac <= 0) *arena_io = r.train.arena_bytes;
    tt_policy_result_free(&r);
  }
  fflush(stdout);
  tt_graph_free(&g);
  tt_model_free(&m);
  free(text);
}

int main(int argc, char **argv) {
  int sizes[16] = {5000, 20000, 50000}, ns = 3;
  if (argc > 1) {
    ns = 0;
    for (int i = 1; i < argc && ns < 16; i++) sizes[ns++] = atoi(argv[i]);
  }
  tt_backend *be = tt_cpu_backend_create(1);
  if (!be) return 1;
  printf("planning time (CPU seconds) by depth; micro-batch 32, fp16, the CUDA target's cost model\n");
  for (int residual = 0; residual < 2; residual++)
    for (int i = 0; i < ns; i++) {
      size_t arena = 0;
      bench_one(be, sizes[i], residual, 0.0, &arena);
      if (arena) bench_one(be, sizes[i], residual, 0.5, &arena);
    }
  be->destroy(be);
  return 0;
}
