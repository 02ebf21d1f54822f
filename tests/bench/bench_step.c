/* tests/bench/bench_step.c — wall time of one training step (micro-step + update) and the
 * memory it needs, for a recipe on the CPU backend. Prints numbers; never passes or fails.
 *
 *   build/bench/bench_step [RECIPE] [MICRO_BATCH] [STEPS] [THREADS] [WARMUP] [VRAM] [PRECISION]
 *
 * Defaults: examples/fashion_mnist/lenet.recipe, 128, 30, all cores, 5, no budget, fp32. Reports
 * the median and the spread over STEPS timed steps after WARMUP warm-up steps, the planned
 * arena, the process's peak resident memory (getrusage) and the network's forward FLOPs per
 * image (the graph's count: 2 per multiply-add; a training step is about 3 times that). Without
 * VRAM (or with VRAM 0 or -) the step has in-place ops and nothing recomputed; with VRAM (e.g.
 * 1.2G) the scheduler chooses what to recompute at this micro-batch so the arena fits, as
 * `tinytrain --vram` on the CPU does. PRECISION: fp32, fp16 or bf16, the activations' dtype
 * (autocast as `--precision`); the loss is not scaled, which does not change the time of a step.
 * A precision this build or backend cannot run fails with the lowering's or backend's message
 * (bf16 under a budget needs the policy search's bf16 precision, not in this build yet). TINYTRAIN_CPU_BACKEND=ref runs the reference loops instead of oneDNN; TINYTRAIN_COMPACT=1
 * plans compact saves without a budget (the default there is the full tensors, as tinytrain plans), TINYTRAIN_RECOMPUTE_SEARCH=segments|ops one recompute search. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "core/base/knobs.h"
#include "core/data/data.h"
#include "core/runtime/exec.h"
#include "core/compile/recipe.h"
#include "core/compile/policy.h"

static int bench_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *recipe = argc > 1 ? argv[1] : "examples/fashion_mnist/lenet.recipe";
  int mb = argc > 2 ? atoi(argv[2]) : 128, steps = argc > 3 ? atoi(argv[3]) : 30, threads = argc > 4 ? atoi(argv[4]) : 0;
  int warmup = argc > 5 ? atoi(argv[5]) : 5;
  size_t vram = 0;
  if (argc > 6 && strcmp(argv[6], "-") && tt_parse_size(argv[6], &vram)) {
    fprintf(stderr, "bench_step: bad VRAM size '%s'\n", argv[6]);
    return 2;
  }
  const char *prec = argc > 7 ? argv[7] : "fp32";
  tt_dtype act = TT_F32;
  if (!strcmp(prec, "fp16"))
    act = TT_F16;
  else if (!strcmp(prec, "bf16"))
    act = TT_BF16;
  else if (strcmp(prec, "fp32")) {
    fprintf(stderr, "bench_step: PRECISION is fp32, fp16 or bf16, not '%s'\n", prec);
    return 2;
  }
  if (vram && act == TT_BF16) {
    fprintf(stderr, "bench_step: bf16 under a VRAM budget is not supported yet (the policy search has no bf16 precision "
                    "in this build); run without VRAM\n");
    return 2;
  }
  tt_err err;
  tt_model m;
  tt_graph g;
  tt_program p;
  tt_exec x;
  if (tt_recipe_load(recipe, &m, &err, NULL, NULL) || tt_graph_build(&m, &g, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  /* the TINYTRAIN_* knobs as `tinytrain` reads them (a malformed one is refused): the backend's
   * (TINYTRAIN_CPU_ISA, TINYTRAIN_CONV_BWDW, TINYTRAIN_LAYOUT, ...) reach it only this way */
  if (tt_knobs_init(&err)) {
    fprintf(stderr, "bench_step: %s\n", err.msg);
    return 2;
  }
  const tt_knobs *kn = tt_knobs_get();
  char why[400];
  /* as session.c does: TINYTRAIN_CPU_ISA held first (its refusal has words), then the backend */
  if (!kn->cpu_ref && tt_cpu_isa_hold(kn->be.cpu_isa, why, sizeof why)) {
    fprintf(stderr, "bench_step: %s\n", why);
    return 1;
  }
  tt_backend *be = kn->cpu_ref ? tt_ref_backend_create(threads) : tt_cpu_backend_create_knobs(threads, &kn->be);
  if (!be) {
    fprintf(stderr, "bench_step: could not create the CPU backend\n");
    return 1;
  }
  tt_policy pol;
  tt_policy_result sr;
  memset(&pol, 0, sizeof pol);
  memset(&sr, 0, sizeof sr);
  pol.micro_batch = mb, pol.accum_steps = 1, pol.act_dtype = act, pol.inplace = 1, pol.training = 1;
  /* without a budget, the full tensors, as `tinytrain` plans a run that fits without compact
   * saves (TINYTRAIN_COMPACT=1: compact saves); with one, as the scheduler plans */
  pol.compact = kn->compact == 1;
  if (vram) {
    tt_policy_opts so;
    memset(&so, 0, sizeof so);
    so.vram_bytes = vram, so.micro_batch = mb, so.precision = act == TT_F16 ? TT_PREC_FP16 : TT_PREC_FP32;
    so.recompute = TT_RECOMP_AUTO;
    so.inplace = 1, so.profile = tt_profile_cpu();
    if (tt_policy_search(&g, be, &so, &sr, &err)) {
      fprintf(stderr, "%s\n", err.msg);
      return 1;
    }
    p = sr.train;
    memset(&sr.train, 0, sizeof sr.train); /* p owns it now */
  } else if (tt_lower(&g, &pol, be, &p, &err) || tt_program_plan(&p, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  if (tt_exec_create(&x, &g, &p, NULL, be, 1, &err) || tt_exec_init_params(&x, 1, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  tt_dataset ds;
  tt_dataset_synthetic(mb, m.in_c, m.in_h, m.in_w, m.classes, 3, &ds, &err);
  tt_opt_hparams hp;
  memset(&hp, 0, sizeof hp);
  hp.kind = TT_OPT_SGD, hp.lr = 0.01f, hp.momentum = 0.9f, hp.nesterov = 1;
  if (steps < 1) steps = 1;
  double *t = (double *)malloc(sizeof(double) * (size_t)steps);
  for (int i = -warmup; i < steps; i++) {
    double t0 = tt_now();
    int of;
    if (tt_exec_micro_step(&x, ds.images, ds.labels, 0, (uint64_t)(i + warmup), 1.0f / mb, &err) ||
        tt_exec_update(&x, &hp, i + warmup + 1, 1.0f, &of, &err)) {
      fprintf(stderr, "%s\n", err.msg);
      return 1;
    }
    if (i >= 0) t[i] = 1e3 * (tt_now() - t0);
  }
  qsort(t, (size_t)steps, sizeof(double), bench_cmp);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("%s, micro-batch %d, %s, CPU backend '%s' (%d threads; %s; own loops %s)", recipe, mb, prec, be->name,
         threads, tt_cpu_backend_info(), tt_cpu_backend_loops());
  if (vram) printf(", --vram %.2f GiB: recompute %d of %d units", vram / 1073741824.0, sr.recomputed_units, sr.nunits);
  printf("\n");
  printf("  step wall time: median %.2f ms (min %.2f, max %.2f over %d steps) = %.0f images/s\n", t[steps / 2], t[0],
         t[steps - 1], steps, mb / (t[steps / 2] / 1e3));
  printf("  arena %.2f MiB (lower bound %.2f MiB); process peak resident memory %.1f MiB\n", x.arena_bytes / 1048576.0,
         p.peak_live_bytes / 1048576.0, ru.ru_maxrss / 1024.0);
  printf("  model: %.4f GFLOP per image forward\n", g.flops_per_sample / 1e9);
  free(t);
  tt_dataset_free(&ds);
  tt_exec_destroy(&x);
  tt_program_free(&p);
  tt_policy_result_free(&sr);
  be->destroy(be);
  tt_graph_free(&g);
  tt_model_free(&m);
  return 0;
}
