/* core/runtime/session.c — opening a recipe: parse, build, choose the backend, schedule, allocate. */
#include "session.h"

#include "../base/knobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "dist.h"
#include "../compile/offload.h"
#include "../compile/recipe.h"
#include "../../kernels/cuda/tt_cuda.h" /* tt_cuda_layouts_16bit for plan's stand-in, also in CPU-only builds */

#ifdef TT_HAVE_CUDA
/* After the arena: every convolution and GEMM runs once, so cuDNN and cuBLAS load what they will
 * use, and the device memory they took beyond the arena is measured against the margin the plan
 * kept for them (TT_CUDA_LIBRARY_MARGIN_BYTES). Over the margin and over --vram: refused now,
 * before the first step, with the figures. (The free-memory difference counts the whole device:
 * on a GPU another process is allocating on, the figure is pessimistic.) */
static int session_settle(tt_session *s, size_t reserve, tt_err *err) {
  size_t fr = 0;
  if (tt_exec_warmup(&s->x, err)) return -1;
  if (tt_cuda_mem_free(s->be, &fr, NULL)) return tt_fail(err, "cudaMemGetInfo after the warm-up failed: %s", s->be->last_error(s->be));
  size_t taken = s->device_free_bytes > fr ? s->device_free_bytes - fr : 0;
  s->library_bytes = taken > s->x.arena_bytes ? taken - s->x.arena_bytes : 0;
  size_t margin = s->lib_margin; /* the fixed margin, or after a re-plan the measured one */
  size_t measured = reserve - margin, total = measured + s->x.arena_bytes + s->library_bytes;
  if (s->library_bytes > margin && s->vram_bytes && total > s->vram_bytes)
    return tt_fail(err,
                   "cuDNN/cuBLAS took %.0f MiB of device memory after setup, more than the %.0f MiB margin the plan "
                   "kept: the process holds %.0f MiB, over --vram %.0f MiB; lower --vram by %.0f MiB",
                   s->library_bytes / 1048576.0, margin / 1048576.0, total / 1048576.0,
                   s->vram_bytes / 1048576.0, (total - s->vram_bytes) / 1048576.0 + 1);
  return 0;
}

/* The cuDNN workspace cap comes from the budget (tt_policy_widen_workspace): --vram less the
 * reserve, or without --vram the device's free memory less the libraries' margin. */
static int session_conv_workspace(tt_session *s, tt_err *err) {
  tt_policy_result *r = &s->sched;
  size_t margin = s->lib_margin, budget = r->budget_bytes;
  if (!budget && s->device_free_known) budget = s->device_free_bytes > margin ? s->device_free_bytes - margin : 0;
  return tt_policy_widen_workspace(&s->graph, s->be, r, budget, tt_cuda_set_conv_workspace_cap, &s->conv_ws_cap,
                                   &s->conv_ws_default, &s->conv_ws_max, err);
}
#endif
/* The CPU backend's threads: what was asked (0: all), but never more than the cores this
 * process may run on. More gain nothing, each costs its stack (--threads 10000: 700 MB), and
 * OpenMP fails outright on 1000000; so a larger request is lowered, with a warning. */
static int session_threads(int asked) {
#ifdef _OPENMP
  int cores = omp_get_num_procs(); /* the CPUs in this process's affinity mask */
#else
  int cores = 1;
#endif
  if (cores < 1) cores = 1;
  if (asked <= cores) return asked;
  char msg[160];
  snprintf(msg, sizeof msg, "tinytrain: warning: --threads %d is more than the %d cores this process can use; using %d", asked,
           cores, cores);
  tt_warn_stderr(NULL, msg);
  return cores;
}

/* The backend. --device auto means the same device for `plan` as for `train`: the GPU when there
 * is one, else the CPU. A CUDA card without one here is `plan --device cuda` (a generic card) or
 * `plan --gpu NAME` (a card of cost.h's table: its memory, reserve and speed): the reserve is then
 * estimated and workspaces are the reference backend's (bounded im2col chunks, like a capped cuDNN
 * workspace). *reserve: the device memory outside the arena that the budget must leave. */
static int session_backend(tt_session *s, const tt_run_opts *o, tt_session_mode mode, size_t *reserve, tt_err *err) {
  const tt_device_profile *gpu = NULL;
  const tt_knobs *kn = tt_knobs_get(); /* read at the session's start (tt_session_open) */
  if (o->gpu) {
    if (mode != TT_SESSION_PLAN) return tt_fail(err, "--gpu %s: only `plan` plans for a card by name", o->gpu);
    if (o->device == TT_DEVICE_CPU) return tt_fail(err, "--gpu %s plans for a CUDA card, --device cpu for the CPU: give one of them", o->gpu);
    if (!(gpu = tt_profile_gpu(o->gpu))) return tt_fail(err, "--gpu %s: not a card tinytrain knows; known: %s", o->gpu, tt_profile_gpu_list());
  }
#ifdef TT_HAVE_CUDA
  if (!gpu && (o->device == TT_DEVICE_CUDA || o->device == TT_DEVICE_AUTO)) {
    char why[512];
    int ndev = tt_cuda_probe(why, sizeof why);
    if (ndev <= 0 && why[0]) { /* a driver too old for the runtime is not "no GPU": say so */
      if (o->device == TT_DEVICE_CUDA && mode != TT_SESSION_PLAN) return tt_fail(err, "--device cuda: %s", why);
      char msg[600];
      snprintf(msg, sizeof msg, "tinytrain: warning: %s; %s on the CPU", why, mode == TT_SESSION_PLAN ? "planning" : "running");
      tt_warn_stderr(NULL, msg);
    }
    if (ndev > 0 || (mode != TT_SESSION_PLAN && o->device == TT_DEVICE_CUDA)) {
      if (mode != TT_SESSION_PLAN && tt_dist_cuda_select(err)) return -1;
      s->be = tt_cuda_backend_create(reserve, &kn->be, err ? err->msg : NULL, err ? sizeof err->msg : 0);
      if (!s->be || (mode == TT_SESSION_TRAIN && tt_dist_cuda_attach(s->be, reserve, err))) return -1;
      s->target_cuda = 1, s->reserve_measured = 1;
      /* `auto` asks the device itself: bf16 from sm_80 (the backend computes bf16 convolutions
       * and GEMMs there), fp16 with loss scaling below; an unknown capability is no bf16 */
      s->gpu_cc = tt_cuda_compute_capability(s->be);
      s->gpu_here = *tt_profile_cuda_generic();
      s->gpu_here.sm = s->gpu_cc;
      s->gpu_here.bf16 = s->gpu_cc >= 80;
      if (s->gpu_cc)
        snprintf(s->gpu_here_name, sizeof s->gpu_here_name, "GPU sm_%d (generic T4-class speed estimate)", s->gpu_cc);
      else
        snprintf(s->gpu_here_name, sizeof s->gpu_here_name, "GPU of unknown compute capability (generic T4-class speed estimate)");
      s->gpu_here.name = s->gpu_here_name;
      s->profile = &s->gpu_here;
      s->target = "the GPU here (reserve measured)";
      s->lib_margin = tt_cuda_library_margin(s->be);
      *reserve += s->lib_margin; /* what cuDNN/cuBLAS load later (tt_cuda.h); a re-plan measures it */
      if (tt_cuda_mem_free(s->be, &s->device_free_bytes, NULL) == 0) s->device_free_known = 1;
      return 0;
    }
  }
#else
  if (o->device == TT_DEVICE_CUDA && mode != TT_SESSION_PLAN)
    return tt_fail(err, "--device cuda: this tinytrain was built without CUDA (configure found no nvcc/cuDNN); use --device cpu");
#endif
  /* TINYTRAIN_CPU_BACKEND=ref runs the reference loops instead of oneDNN (for comparisons; the
   * tests create both backends themselves). */
  s->target_cuda = mode == TT_SESSION_PLAN && (gpu || o->device == TT_DEVICE_CUDA);
  if (s->target_cuda || kn->cpu_ref)
    s->be = tt_ref_backend_create(session_threads(o->threads));
  else {
    char why[400];
    /* TINYTRAIN_CPU_ISA, held for the process before the backend's oneDNN queries (its refusal
     * has words; the creation only a NULL) */
    if (tt_cpu_isa_hold(kn->be.cpu_isa, why, sizeof why)) return tt_fail(err, "%s", why);
    s->be = tt_cpu_backend_create_knobs(session_threads(o->threads), &kn->be);
  }
  if (!s->be) return tt_fail(err, "could not create the CPU backend");
  /* planning for a card with the reference backend standing in: plan the buffers the CUDA backend
   * gets (a staged batch: the training program's input buffers persistent, lower.c); nothing runs */
  if (s->target_cuda) {
    s->be->host_memory = 0;
    /* and the CUDA backend's layouts (tt_cuda.h) and optional calls (the fused batch norm + ReLU
     * and batch norm + add + ReLU, the many-tensor casts and updates, the KRSC weight copies), so the plan shows the layout
     * and the calls the card gets */
    s->be->layouts_16bit = tt_cuda_layouts_16bit(&kn->be);
    s->be->plan_caps = TT_CAP_BN_RELU_FWD | TT_CAP_BN_RELU_BWD | TT_CAP_BN_ADD_RELU_FWD | TT_CAP_BN_ADD_RELU_BWD |
                       TT_CAP_CAST_MULTI | TT_CAP_UPDATE_MULTI | TT_CAP_ACT_OFFLOAD | TT_CAP_FILTER_KRSC;
  }
  if (gpu) {
    s->profile = gpu, s->target = gpu->name;
    *reserve = gpu->reserve_bytes;
  } else if (s->target_cuda) {
    s->profile = tt_profile_cuda_generic();
    s->target = "a generic CUDA card (--device cuda, no GPU here: reserve and speed are estimates)";
    if (o->vram_bytes) *reserve = TT_RESERVE_ESTIMATE_BYTES;
  } else {
    /* oneDNN's bf16 primitives run natively on AVX512_BF16 and AMX CPUs (its ISA query, which
     * honours ONEDNN_MAX_CPU_ISA), faster than fp32 except on Intel's without AMX; the reference
     * loops convert every bf16 value through fp32 */
    s->profile = strcmp(s->be->name, "cpu") || !tt_cpu_backend_bf16_native() ? tt_profile_cpu()
                 : tt_cpu_backend_bf16_fast()                               ? tt_profile_cpu_bf16()
                                                                            : tt_profile_cpu_bf16_slow();
    s->target = o->device == TT_DEVICE_CPU ? "the CPU (--device cpu)" : "the CPU (no NVIDIA GPU found: what train uses here)";
  }
  return 0;
}

/* The training programs the scheduler chooses under the budget (--vram less the reserve). */
/* tinytrain.h's option enums are the model's own values (model.h): the casts below rely on it.
 * (A negative array size if not: C and C++, the amalgamation through nvcc, alike.) */
typedef char session_enums_match[(TT_PRECISION_AUTO == (int)TT_PREC_AUTO && TT_PRECISION_FP32 == (int)TT_PREC_FP32 &&
                                  TT_PRECISION_FP16 == (int)TT_PREC_FP16 && TT_PRECISION_BF16 == (int)TT_PREC_BF16 && TT_RECOMPUTE_AUTO == (int)TT_RECOMP_AUTO &&
                                  TT_RECOMPUTE_NONE == (int)TT_RECOMP_NONE && TT_RECOMPUTE_ALL == (int)TT_RECOMP_ALL) ? 1 : -1];

static int session_schedule(tt_session *s, const tt_run_opts *o, size_t reserve, tt_err *err) {
  tt_policy_opts *so = &s->policy_opts;
  so->vram_bytes = s->vram_bytes;
  so->reserve_bytes = reserve;
#ifdef TT_HAVE_CUDA
  /* --vram is the card's memory; on a card that has less free (a desktop on it, another
   * process), the budget is what is free, keeping the libraries' margin free too */
  s->budget_clamped = 0;
  if (s->vram_bytes && s->device_free_known && s->vram_bytes > reserve) {
    size_t margin = s->lib_margin;
    size_t usable = s->device_free_bytes > margin ? s->device_free_bytes - margin : 0;
    if (s->vram_bytes - reserve > usable) so->vram_bytes = reserve + usable, s->budget_clamped = 1;
  }
#endif
  so->micro_batch = o->micro_batch > 0 ? o->micro_batch : s->model.train.micro_batch;
  so->precision = o->precision ? (tt_precision)o->precision : s->model.train.precision;
  so->recompute = o->recompute ? (tt_recompute_mode)o->recompute : s->model.train.recompute;
  so->inplace = 1;
  /* planned host offload of the optimizer state (core/compile/offload.h): --host-mem, by default
   * TT_HOST_MEM_DEFAULT_FRACTION of the RAM available now; the search uses it only for a card */
  so->host_bytes = o->host_mem_bytes < 0 ? 0 : o->host_mem_bytes ? (size_t)o->host_mem_bytes : tt_offload_default_host_budget();
  so->eval_batch = s->model.train.eval_batch;
  so->profile = s->profile;
  /* `auto` weighs fp32 against one 16-bit type by the cost model: bf16 where the device computes
   * it natively (AVX512_BF16/AMX CPUs, sm_80+ cards: the profile's bf16 flag), else fp16 with
   * loss scaling. The CPU backend computes fp16 through fp32 conversions, slower, so `auto` stays
   * fp32 on a CPU without native bf16 unless memory demands otherwise (the CPU profile gives fp16
   * no extra FLOP/s). */
  so->auto_half = s->profile->bf16 ? TT_BF16 : TT_F16;
  if (tt_policy_search(&s->graph, s->be, so, &s->sched, err)) {
    if (s->budget_clamped && err) {
      size_t n = strlen(err->msg);
      snprintf(err->msg + n, sizeof err->msg - n, " (the budget was clamped to the device's free memory: %.0f MiB free now)",
               s->device_free_bytes / 1048576.0);
    }
    return -1;
  }
#ifdef TT_HAVE_CUDA
  if (s->reserve_measured) return session_conv_workspace(s, err);
#endif
  return 0;
}

#ifdef TT_HAVE_CUDA
/* Whether this session re-plans after its warm-up: training on the GPU here under --vram, in one
 * process (each rank would measure its own figure, and the ranks' plans must agree), with
 * TINYTRAIN_REPLAN not 0. Says in s->replan_text why not where the question arises. */
static int session_may_replan(tt_session *s, tt_session_mode mode) {
  if (mode != TT_SESSION_TRAIN || !s->reserve_measured || !s->vram_bytes) return 0;
  if (!tt_knobs_get()->replan) {
    snprintf(s->replan_text, sizeof s->replan_text, "not re-planned (TINYTRAIN_REPLAN=0): the plan keeps the fixed %.0f MiB "
             "library margin", s->lib_margin / 1048576.0);
    return 0;
  }
  if (s->ranks > 1) {
    snprintf(s->replan_text, sizeof s->replan_text, "not re-planned: a run of %d processes keeps the fixed %.0f MiB library "
             "margin (each would measure its own)", s->ranks, s->lib_margin / 1048576.0);
    return 0;
  }
  return 1;
}

/* The C API's precision for the activation dtype a plan chose (the re-plan keeps it). */
static tt_run_precision session_precision_of(tt_dtype dt) {
  return dt == TT_F16 ? TT_PRECISION_FP16 : dt == TT_BF16 ? TT_PRECISION_BF16 : TT_PRECISION_FP32;
}

/* The re-plan (docs/plan.md#re-planning-after-the-warm-up). The first arena's warm-up measured
 * what cuDNN and cuBLAS took (s->library_bytes); where that plus TT_REPLAN_SLACK_BYTES, rounded up
 * to TT_REPLAN_ROUND_BYTES, is less than the margin the plan kept, the schedule is made again with
 * it as the margin: in the precision the first plan chose, at micro-batch want_mb where the caller
 * asked for one the fixed margin had no room for (a resumed re-planned run), the effective batch
 * the recipe's. The arena is made again, warmed up and checked as the first (session_settle), all
 * before the first step; nothing is allocated after. *reserve: the reserve the first plan was
 * made with (the margin in it); updated. 0 (s->replan_text says what happened), or -1 with err. */
static int session_replan(tt_session *s, const tt_run_opts *o, size_t *reserve, int want_mb, tt_err *err) {
  size_t old_margin = s->lib_margin, lib = s->library_bytes;
  size_t m = (lib + TT_REPLAN_SLACK_BYTES + TT_REPLAN_ROUND_BYTES - 1) / TT_REPLAN_ROUND_BYTES * TT_REPLAN_ROUND_BYTES;
  const tt_policy *p = &s->sched.policy;
  int mb0 = p->micro_batch, acc0 = p->accum_steps, ru0 = s->sched.recomputed_units;
  double arena0 = s->x.arena_bytes / 1048576.0;
  if (m >= old_margin) {
    if (want_mb)
      return tt_fail(err, "micro-batch %d (--micro-batch, or the run being resumed) does not fit --vram %.0f MiB: cuDNN/cuBLAS "
                     "took %.0f MiB after the warm-up, which with %.0f MiB of slack leaves no more than the fixed %.0f MiB "
                     "margin; give a smaller --micro-batch or a larger --vram", want_mb, s->vram_bytes / 1048576.0,
                     lib / 1048576.0, TT_REPLAN_SLACK_BYTES / 1048576.0, old_margin / 1048576.0);
    snprintf(s->replan_text, sizeof s->replan_text, "not re-planned: cuDNN/cuBLAS took %.0f MiB after the warm-up; with %.0f MiB "
             "of slack that leaves no less than the %.0f MiB margin the plan kept", lib / 1048576.0,
             TT_REPLAN_SLACK_BYTES / 1048576.0, old_margin / 1048576.0);
    return 0;
  }
  tt_run_opts o2 = *o;
  o2.micro_batch = want_mb ? want_mb : o->micro_batch;
  o2.precision = session_precision_of(p->act_dtype);
  size_t r2 = *reserve - old_margin + m;
  tt_exec_destroy(&s->x);
  s->have_exec = 0;
  tt_policy_result_free(&s->sched);
  memset(&s->sched, 0, sizeof s->sched);
  s->lib_margin = m;
  tt_precision asked = s->policy_opts.precision; /* the precision line says what was asked, not the re-plan's */
  if (session_schedule(s, &o2, r2, err)) return -1;
  s->policy_opts.precision = asked;
  if (tt_exec_create(&s->x, &s->graph, &s->sched.train, &s->sched.eval, s->be, s->model.train.seed, err)) return -1;
  s->have_exec = 1, s->replanned = 1;
  *reserve = r2;
  p = &s->sched.policy;
  snprintf(s->replan_text, sizeof s->replan_text, "re-planned: cuDNN/cuBLAS took %.0f MiB after the warm-up; library margin "
           "%.0f MiB -> %.0f MiB (+%.0f MiB slack): micro-batch %d x %d -> %d x %d, recompute %d -> %d units, arena %.1f -> "
           "%.1f MiB", lib / 1048576.0, old_margin / 1048576.0, m / 1048576.0, TT_REPLAN_SLACK_BYTES / 1048576.0, mb0, acc0,
           p->micro_batch, p->accum_steps, ru0, s->sched.recomputed_units, arena0, s->x.arena_bytes / 1048576.0);
  return session_settle(s, r2, err);
}

/* The first schedule, where a re-plan may follow: a micro-batch asked for (--micro-batch, or a
 * resumed re-planned run's, kept in its run directory) that the fixed margin leaves no room for
 * is planned without, and *want_mb set for the re-plan to ask again. 0, or -1 with err (the
 * first refusal's words where the second schedule fails too). */
static int session_schedule_first(tt_session *s, const tt_run_opts *o, tt_session_mode mode, size_t reserve, int *want_mb,
                                  tt_err *err) {
  *want_mb = 0;
  if (!session_schedule(s, o, reserve, err)) return 0;
  if (o->micro_batch <= 0 || !session_may_replan(s, mode)) return -1;
  tt_err first;
  tt_run_opts o1 = *o;
  first.msg[0] = 0;
  if (err) first = *err;
  o1.micro_batch = 0;
  tt_policy_result_free(&s->sched);
  memset(&s->sched, 0, sizeof s->sched);
  if (session_schedule(s, &o1, reserve, err)) {
    if (err) *err = first;
    return -1;
  }
  *want_mb = o->micro_batch;
  return 0;
}
#endif

int tt_session_open(tt_session **out, const tt_run_opts *o, tt_session_mode mode, tt_err *err) {
  *out = NULL;
  if (!o) return tt_fail(err, "no options given (tt_run_opts is NULL)");
  if (!o->recipe && !o->recipe_text) return tt_fail(err, "no recipe given");
  if (o->device < TT_DEVICE_AUTO || o->device > TT_DEVICE_CUDA) return tt_fail(err, "device %d: use TT_DEVICE_AUTO, _CPU or _CUDA", o->device);
  if (o->precision < 0 || o->precision > 3)
    return tt_fail(err, "precision %d: use 0 (auto), 1 (fp32), 2 (fp16) or 3 (bf16)", o->precision);
  if (o->recompute < 0 || o->recompute > 2) return tt_fail(err, "recompute %d: use 0 (auto), 1 (none) or 2 (all)", o->recompute);
  if (o->tf32 < TT_TF32_RECIPE || o->tf32 > TT_TF32_OFF)
    return tt_fail(err, "tf32 %d: use TT_TF32_RECIPE (0), TT_TF32_ON (1) or TT_TF32_OFF (2)", (int)o->tf32);
  if (o->optimizer_state < TT_OPT_STATE_RECIPE || o->optimizer_state > TT_OPT_STATE_AUTO)
    return tt_fail(err, "optimizer_state %d: use TT_OPT_STATE_RECIPE (0), _FP32 (1), _BF16 (2), _INT8 (3) or _AUTO (4)",
                   (int)o->optimizer_state);
  if (o->host_mem_bytes < -1) return tt_fail(err, "host_mem_bytes %lld: use 0 (the default), -1 (no offload) or a size", o->host_mem_bytes);
  if (o->threads < 0 || o->epochs < 0 || o->micro_batch < 0 || o->ranks < 0 || o->max_steps < 0)
    return tt_fail(err, "threads, epochs, micro_batch, ranks and max_steps must be >= 0 (0: the default)");
  /* the TINYTRAIN_* knobs, read once for the session (core/base/knobs.h): a malformed or unknown
   * one is refused here, before anything is built, for the command line and the C API alike */
  if (tt_knobs_init(err)) return -1;
  tt_session *s = (tt_session *)tt_calloc(1, sizeof(tt_session), "session", err);
  size_t reserve = 0;
  double t0; /* declared before the first goto: C++ (the amalgamation under nvcc) forbids jumping over an initialisation */
  int want_mb = 0; /* a micro-batch the first plan could not give, asked of the re-plan (session_schedule_first) */
  if (!s) return -1;
  s->vram_bytes = o->vram_bytes;
  if (o->recipe_text ? tt_recipe_parse(o->recipe ? o->recipe : "(recipe text)", o->recipe_text, &s->model, err,
                                        tt_warn_stderr, NULL)
                     : tt_recipe_load(o->recipe, &s->model, err, tt_warn_stderr, NULL)) {
    free(s);
    return -1;
  }
  /* the C API's optimizer_state over the recipe's (tt_run_opt_state is tt_ostate_mode + 1) */
  if (o->optimizer_state) s->model.train.optimizer_state = (int)o->optimizer_state - 1;
  s->ranks = o->ranks > 1 && mode != TT_SESSION_EVAL ? o->ranks : 1;
  if (tt_dist_per_rank_batch(&s->model, s->ranks, err)) goto fail; /* the schedule is per rank */
  if (tt_graph_build(&s->model, &s->graph, err) || session_backend(s, o, mode, &reserve, err)) goto fail;
  /* TF32 before the first workspace query: the convolution algorithms depend on the math type */
  s->tf32_asked = o->tf32 == TT_TF32_ON || (o->tf32 != TT_TF32_OFF && !s->model.train.tf32_off);
  s->tf32_cli = o->tf32 != TT_TF32_RECIPE;
  if (s->target_cuda) s->tf32_used = s->tf32_asked && s->profile->sm >= 80; /* a named card; the generic one: sm 0 */
#ifdef TT_HAVE_CUDA
  if (s->reserve_measured) {
    int t = tt_cuda_set_tf32(s->be, s->tf32_asked);
    if (t < 0) {
      tt_fail(err, "CUDA backend: setting TF32 %s failed: %s", s->tf32_asked ? "on" : "off", s->be->last_error(s->be));
      goto fail;
    }
    s->tf32_used = t;
  }
#endif
  if (!s->vram_bytes && o->gpu) s->vram_bytes = s->profile->memory_bytes; /* --gpu t4 alone: the T4's memory */
  t0 = tt_now();
  if (mode == TT_SESSION_EVAL) {
    tt_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.micro_batch = s->model.train.eval_batch > 0 ? s->model.train.eval_batch : 256;
    pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 0;
    if (tt_lower(&s->graph, &pol, s->be, &s->sched.eval, err) || tt_program_plan(&s->sched.eval, err)) goto fail;
    s->sched.policy = pol;
  } else {
#ifdef TT_HAVE_CUDA
    if (session_schedule_first(s, o, mode, reserve, &want_mb, err)) goto fail;
#else
    (void)want_mb;
    if (session_schedule(s, o, reserve, err)) goto fail;
#endif
  }
  s->plan_ms = 1e3 * (tt_now() - t0);
  if (mode != TT_SESSION_PLAN) {
    const tt_program *tr = mode == TT_SESSION_TRAIN ? &s->sched.train : NULL;
    if (tt_exec_create(&s->x, &s->graph, tr, &s->sched.eval, s->be, s->model.train.seed, err)) goto fail;
    s->have_exec = 1;
#ifdef TT_HAVE_CUDA
    if (s->reserve_measured && session_settle(s, reserve, err)) goto fail;
    if (session_may_replan(s, mode) && session_replan(s, o, &reserve, want_mb, err)) goto fail;
#endif
  }
  *out = s;
  return 0;
fail:
  tt_session_close(s);
  return -1;
}

void tt_session_print_summary(const tt_session *s, FILE *out) {
  const tt_policy_result *r = &s->sched;
  const tt_policy *p = &r->policy;
  fprintf(out, "tinytrain %s: %s on %s\n", TT_VERSION, s->model.path, s->be->name);
  fprintf(out, "  model    %d layers, %.2fM parameters, %.3f GFLOP per image forward\n", s->graph.nnodes - 1,
          s->graph.trainable_numel / 1e6, s->graph.flops_per_sample / 1e9);
  char pol[256];
  tt_session_policy_text(s, pol, sizeof pol);
  fprintf(out, "  policy   %s\n", pol);
  if (!s->target_cuda && p->act_dtype == TT_F16) /* asked for: auto never picks fp16 on the CPU */
    fprintf(out, "  note     fp16 on the CPU converts every op through fp32: slower than fp32 here, only the\n"
                 "           activations' memory is halved (bf16 where the CPU has it, else fp32, is faster)\n");
  if (s->ranks > 1)
    fprintf(out, "  ranks    %d processes, each planned for its share: global batch %d x %d = %d\n", s->ranks,
            p->micro_batch * p->accum_steps, s->ranks, p->micro_batch * p->accum_steps * s->ranks);
  fprintf(out, "  memory   arena %.1f MiB (lower bound %.1f MiB)\n", s->x.arena_bytes / 1048576.0,
          r->train.peak_live_bytes / 1048576.0);
  if (s->vram_bytes) fprintf(out, "           budget %.1f MiB of --vram %.1f MiB%s\n", r->budget_bytes / 1048576.0, s->vram_bytes / 1048576.0,
                             s->budget_clamped ? ", clamped to the device's free memory" : "");
  if (r->train.n_masters_offloaded) /* offload 2 (core/compile/offload.h) */
    fprintf(out, "  offload  fp32 master weights in pinned host memory: %.1f MiB in %d buffers\n",
            r->train.master_offload_bytes / 1048576.0, r->train.n_masters_offloaded);
  if (r->train.n_offloaded) /* planned host offload (core/compile/offload.h): the state's share of the region */
    fprintf(out, "  offload  optimizer state in pinned host memory: %.1f MiB (--host-mem %.1f MiB), through a %.1f MiB window\n",
            tt_offload_state_bytes(&r->train) / 1048576.0, s->policy_opts.host_bytes / 1048576.0,
            2.0 * r->train.offload_slot_bytes / 1048576.0);
  char line[320];
  tt_session_tf32_text(s, line, sizeof line);
  if (line[0]) fprintf(out, "  tf32     %s\n", line);
  tt_session_workspace_text(s, line, sizeof line);
  if (line[0]) fprintf(out, "  cudnn ws %s\n", line);
#ifdef TT_HAVE_CUDA
  if (s->reserve_measured)
    fprintf(out, "           reserve %.1f MiB (measured, with %.0f MiB kept for cuDNN/cuBLAS, which took %.1f MiB)\n",
            s->policy_opts.reserve_bytes / 1048576.0, s->lib_margin / 1048576.0, s->library_bytes / 1048576.0);
#endif
  if (s->replan_text[0]) fprintf(out, "  replan   %s\n", s->replan_text);
  fflush(out);
}

void tt_session_policy_text(const tt_session *s, char *buf, size_t n) {
  const tt_policy_result *r = &s->sched;
  snprintf(buf, n, "micro-batch %d x %d accumulation steps = effective batch %d; %s; %d in-place ops; recompute %d of %d units (%d layers)",
           r->policy.micro_batch, r->policy.accum_steps, r->policy.micro_batch * r->policy.accum_steps,
           r->policy.act_dtype == TT_F16   ? "fp16 autocast with dynamic loss scaling"
           : r->policy.act_dtype == TT_BF16 ? "bf16 autocast (no loss scaling)"
                                            : "fp32", r->train.n_inplace,
           r->recomputed_units, r->nunits, r->train.n_recomputed_steps);
}

/* The device in the precision line's words: "GPU sm_90" for the GPU here (or why its capability
 * is unknown), the card's name for `plan --gpu`, the generic card's for `plan --device cuda`. */
static void session_device_words(const tt_session *s, char *buf, size_t n) {
  if (s->profile == &s->gpu_here && s->gpu_cc)
    snprintf(buf, n, "GPU sm_%d", s->gpu_cc);
  else if (s->profile == &s->gpu_here)
    snprintf(buf, n, "the GPU here (its compute capability is unknown: the CUDA backend library does not report it, "
                     "so no native bf16 is assumed)");
  else
    snprintf(buf, n, "%s", s->profile->name);
}

void tt_session_precision_text(const tt_session *s, char *buf, size_t n) {
  tt_dtype dt = s->sched.policy.act_dtype, half = tt_policy_half(&s->policy_opts);
  const char *name = tt_dtype_name(dt);
  char dev[256];
  session_device_words(s, dev, sizeof dev);
  switch (s->policy_opts.precision) {
    case TT_PREC_FP32:
    case TT_PREC_FP16:
    case TT_PREC_BF16:
      snprintf(buf, n, "%s, as asked (--precision or the recipe's precision)%s", name,
               dt == TT_BF16 && !s->profile->bf16 ? "; this device has no native bf16: it computes through fp32 conversions"
               : dt == TT_F16 && !s->target_cuda ? "; the CPU has no fp16 arithmetic: every op converts through fp32, "
                                                   "so this runs slower than fp32 and only halves the activations' memory"
                                                 : "");
      return;
    default: break;
  }
  if (dt == TT_BF16 && s->target_cuda)
    snprintf(buf, n, "bf16 (auto: %s computes bf16 natively; no loss scaling: bf16 has fp32's range)", dev);
  else if (dt == TT_BF16)
    snprintf(buf, n, "bf16 (auto: this CPU, %s computes bf16 natively; no loss scaling: bf16 has fp32's range)",
             tt_cpu_backend_info());
  else if (dt == TT_F16)
    snprintf(buf, n, "fp16 with dynamic loss scaling (auto: %s has no native bf16%s, and fp16 is %s than fp32 here)", dev,
             s->profile == &s->gpu_here && s->gpu_cc ? " (sm_80 and newer have)" : "",
             s->sched.nalts ? "faster or smaller" : "the fitting choice");
  else if (s->profile == tt_profile_cpu_bf16_slow())
    snprintf(buf, n, "fp32 (auto: this CPU computes bf16 natively, but slower than fp32: AVX512_BF16 without AMX on an "
                     "Intel CPU, where oneDNN's bf16 kernels run at about half the fp32 rate; --precision bf16 halves "
                     "the activations' memory)");
  else
    snprintf(buf, n, "fp32 (auto: %s, but the cost model predicts %s slower for this net%s)",
             s->profile->bf16 ? (s->target_cuda ? "the card computes bf16 natively" : "this CPU computes bf16 natively")
             : s->target_cuda ? "the card has no native bf16, only fp16"
                              : "this CPU has no native bf16 (no AVX512_BF16 or AMX in oneDNN's ISA); fp16 converts through fp32",
             tt_dtype_name(half),
             s->profile->bf16 && !s->target_cuda ? ": its batch norm and other reference-loop ops convert each bf16 value through fp32" : "");
}

void tt_session_tf32_text(const tt_session *s, char *buf, size_t n) {
  const char *src = s->tf32_cli ? (s->tf32_asked ? "--tf32 on" : "--tf32 off")
                    : s->model.train.tf32_off ? "[train] tf32 = off" : "[train] tf32 = on, the default";
  buf[0] = 0;
  if (!s->target_cuda) return;
  int unused = s->sched.policy.micro_batch && s->sched.policy.act_dtype != TT_F32;
  if (!s->tf32_asked)
    snprintf(buf, n, "off (%s): fp32 convolutions and GEMMs in true fp32 (cuDNN FMA math, cuBLAS default math)", src);
  else if (s->tf32_used)
    snprintf(buf, n, "on (%s): fp32 convolutions and GEMMs on TF32 tensor cores (10-bit mantissa inputs, fp32 "
             "accumulation)%s", src, unused ? "; unused by this plan: its convolutions and GEMMs are 16-bit" : "");
  else if (s->reserve_measured || s->profile->sm)
    snprintf(buf, n, "asked (%s) but not used: compute capability %d.%d has no TF32 (sm_80 and newer have)", src,
             (s->reserve_measured ? s->gpu_cc : s->profile->sm) / 10, (s->reserve_measured ? s->gpu_cc : s->profile->sm) % 10);
  else
    snprintf(buf, n, "on (%s) where the card is sm_80 or newer; a generic card's compute capability is not known", src);
}

void tt_session_workspace_text(const tt_session *s, char *buf, size_t n) {
  buf[0] = 0;
  if (!s->conv_ws_cap) return;
  if (s->conv_ws_cap > s->conv_ws_default)
    snprintf(buf, n, "convolution algorithms may take up to %.0f MiB of workspace (%.0f MiB default + what the budget "
             "left beside the plan); the largest planned workspace is %.1f MiB", s->conv_ws_cap / 1048576.0,
             s->conv_ws_default / 1048576.0, s->conv_ws_max / 1048576.0);
  else
    snprintf(buf, n, "convolution algorithms may take up to %.0f MiB of workspace (the default: the budget leaves "
             "no more beside the plan); the largest planned workspace is %.1f MiB", s->conv_ws_cap / 1048576.0,
             s->conv_ws_max / 1048576.0);
}

void tt_session_close(tt_session *s) {
  if (!s) return;
  if (s->have_exec) tt_exec_destroy(&s->x);
  tt_policy_result_free(&s->sched);
  if (s->be) s->be->destroy(s->be);
  tt_graph_free(&s->graph);
  tt_model_free(&s->model);
  free(s);
}

const char *tt_build_info(void) {
  static char buf[512];
  /* the ISA oneDNN reports is the one TINYTRAIN_CPU_ISA holds it to: hold it first (a refusal
   * leaves what is in effect, which is then what this reports) */
  tt_cpu_isa_hold(tt_knobs_get()->be.cpu_isa, NULL, 0);
#ifdef TT_HAVE_CUDA
  snprintf(buf, sizeof buf, "backends: cpu (%s, %s threads), ref (OpenBLAS), cuda (%s; TF32 for fp32 convolutions and "
           "GEMMs on sm_80 and newer unless [train] tf32 = off or --tf32 off)", tt_cpu_backend_info(),
           tt_cpu_backend_threading(), tt_cuda_info());
#else
  snprintf(buf, sizeof buf, "backends: cpu (%s, %s threads), ref (OpenBLAS); built without CUDA", tt_cpu_backend_info(),
           tt_cpu_backend_threading());
#endif
  return buf;
}
