/* core/sched.h — the schedule stage: training graph + budget -> Policy.
 *
 * Enumerates micro-batch x precision x checkpoint plan, lowers and plans each candidate
 * (planning is cheap), predicts its step time with a cost model, and keeps the fastest per
 * image that fits the budget. Checkpoint plans (core/sched_recompute.c) recompute segments
 * of the graph's units (the stretches between single-tensor cut points: a layer of a plain
 * chain, a residual block), chosen by a dynamic program that minimises recompute time for the
 * memory it must free, and are checked against the real planner. */
#ifndef TT_SCHED_H
#define TT_SCHED_H
#include "program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_device_profile {
  const char *name;
  double flops_fp32, flops_fp16; /* sustained FLOP/s */
  double bytes_per_s;            /* memory bandwidth */
  double op_overhead_s;          /* per step launch / dispatch cost */
} tt_device_profile;

/* Documented targets: without a GPU, `plan --vram` plans for a generic CUDA card (the cost
 * model only ranks candidates; memory is exact); training on the CPU uses the CPU profile. */
const tt_device_profile *tt_profile_cuda_generic(void);
const tt_device_profile *tt_profile_cpu(void);

/* Without a GPU to measure, the CUDA context and cuDNN/cuBLAS handles are estimated at this
 * many bytes (a CUDA 12/13 context with lazy module loading plus the library handles is
 * 300-600 MiB on current drivers; we take the upper end so a plan never overcommits). */
#define TT_RESERVE_ESTIMATE_BYTES ((size_t)600 << 20)

typedef struct tt_sched_opts {
  size_t vram_bytes;            /* the card's memory; 0 = no budget */
  size_t reserve_bytes;         /* subtracted from vram_bytes */
  int micro_batch;              /* 0 = search */
  tt_precision precision;       /* AUTO = search */
  tt_recompute_mode recompute;  /* AUTO = search */
  int inplace;                  /* 1 normally; 0 to switch in-place ops off */
  int eval_batch;               /* 0 = largest that fits in the training arena's transient region */
  const tt_device_profile *profile;
} tt_sched_opts;

#define TT_SCHED_MAX_ALTS 12

typedef struct tt_sched_alt {
  int micro_batch;
  tt_dtype dtype;
  int recompute_units;          /* -1: none possible */
  size_t arena_bytes;
  double step_ms;               /* per effective batch */
  char why[160];                /* why it lost */
} tt_sched_alt;

typedef struct tt_schedule_result {
  tt_policy policy;             /* policy.recompute points into recompute[] below */
  unsigned char *recompute;     /* per node */
  tt_program train, eval;
  size_t budget_bytes, reserve_bytes;
  double predicted_step_ms;     /* per effective batch (all micro-steps and the update) */
  double recompute_ms;          /* the part of it spent recomputing */
  int nunits, recomputed_units;
  tt_sched_alt alts[TT_SCHED_MAX_ALTS]; /* candidates that fit but lost (their why: tt_sched_explain) */
  int nalts;
  int candidates_tried;
  /* Report-only, filled by tt_sched_explain (zero after tt_schedule alone): what each technique
   * saved, in arena bytes, at the chosen micro-batch; and when nothing fits, the largest buffer
   * classes of the smallest plan ("params 0.10 GiB, grads 0.10 GiB, optimizer 0.10 GiB"). */
  size_t arena_fp32_plain, arena_no_inplace, arena_no_recompute;
  char dominant[256];
} tt_schedule_result;

/* Returns 0 with a fitting schedule; -1 with err set when nothing fits (the message gives
 * the smallest --vram that would fit and the buffers that dominate it). */
int tt_schedule(const tt_graph *g, tt_backend *planner_be, const tt_sched_opts *o, tt_schedule_result *r, tt_err *err);
void tt_schedule_free(tt_schedule_result *r);
/* The parts of a schedule only a report reads, planned only when asked (`tinytrain plan`, and
 * tt_schedule's refusal): for a schedule tt_schedule chose, the arena with each technique
 * switched off and why each alternative lost; for none (r->policy.micro_batch 0), which
 * buffer classes dominate the smallest plan. o: the options tt_schedule was given. */
void tt_sched_explain(const tt_graph *g, tt_backend *planner_be, const tt_sched_opts *o, tt_schedule_result *r);

/* Exposed for tests and the --max-batch report. */
double tt_predict_ms(const tt_program *p, const tt_device_profile *prof);
/* Checkpoint plans (core/sched_recompute.c). Units: unit_of[node] = unit index (cut nodes end
 * a unit); returns the number of units, -1 out of host memory. */
int tt_sched_units(const tt_graph *g, int *unit_of);
/* Whether the backward pass reads node v's value (the checkpoint search's memory model; it
 * reads the same op-traits row as the lowering, and tests/test_lower.c holds them equal);
 * _all answers for every node at once, in O(nodes + edges). */
int tt_sched_bwd_reads(const tt_graph *g, int v);
void tt_sched_bwd_reads_all(const tt_graph *g, unsigned char *reads);
/* Fills rec[] (per node: 1 = dropped after the forward pass, recomputed in backward) with
 * the cheapest plan, in the cost model, that frees at least `need` bytes of the activation
 * memory backward keeps, at this micro-batch and dtype. Returns the units recomputed; -1 when
 * no plan frees that much (rec all zero); -2 out of host memory (err set). */
int tt_sched_checkpoint_dp(const tt_graph *g, int micro_batch, tt_dtype dt, const tt_device_profile *prof, double need,
                           unsigned char *rec, tt_err *err);
/* `--recompute all`: the plan that keeps the least activation memory in the model (segments
 * of units with checkpoints between them; on a chain of layers about sqrt(n) segments).
 * 0, or -1 out of host memory (err set). */
int tt_sched_checkpoint_all(const tt_graph *g, unsigned char *rec, tt_err *err);
/* The sqrt(n) baseline: every unit recomputed except every k-th, k = round(sqrt(units)). */
void tt_sched_checkpoint_sqrt(const tt_graph *g, unsigned char *rec);
/* Largest micro-batch that fits (0 if none) for a fixed dtype and recompute mode. */
int tt_sched_max_batch(const tt_graph *g, tt_backend *be, const tt_sched_opts *o, tt_dtype dt, tt_recompute_mode rm,
                       size_t *arena_out);

#ifdef __cplusplus
}
#endif
#endif
