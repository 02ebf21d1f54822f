/* core/compile/policy.h — the policy search: training graph + budget -> Policy.
 *
 * Enumerates micro-batch x precision x recompute set, lowers and plans each candidate
 * (planning is cheap), predicts its step time with a cost model, and keeps the fastest per
 * image that fits the budget. Recompute plans (core/compile/recompute.c) recompute segments
 * of the graph's units (the stretches between single-tensor cut points: a layer of a plain
 * chain, a residual block), chosen by a dynamic program that minimises recompute time for the
 * memory it must free, or single values, and the per-tensor search decides per saved value:
 * keep, recompute or compress (recompute.h); every plan is checked against the real planner. */
#ifndef TT_POLICY_H
#define TT_POLICY_H
#include "cost.h"
#include "program.h"
#include "recompute.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Without a GPU to measure, the CUDA context and cuDNN/cuBLAS handles are estimated at this
 * many bytes (a CUDA 12/13 context with lazy module loading plus the library handles is
 * 300-600 MiB on current drivers; we take the upper end so a plan never overcommits). */
#define TT_RESERVE_ESTIMATE_BYTES ((size_t)600 << 20)

/* Which recompute search `auto` runs: all, keeping the fastest plan that fits (the default);
 * whole segments of units only (the search before issue 26); single ops only (with the
 * per-tensor search, issue 42); all but the per-tensor search (the searches before issue 42, to
 * compare). */
typedef enum { TT_RSEARCH_BEST = 0, TT_RSEARCH_SEGMENTS, TT_RSEARCH_OPS, TT_RSEARCH_NO_TENSORS } tt_recompute_search_kind;

typedef struct tt_policy_opts {
  size_t vram_bytes;            /* the card's memory; 0 = no budget */
  size_t reserve_bytes;         /* subtracted from vram_bytes */
  int micro_batch;              /* 0 = search */
  tt_precision precision;       /* AUTO = search fp32 and auto_half */
  tt_dtype auto_half;           /* the 16-bit dtype AUTO weighs against fp32: TT_BF16 where the device computes
                                 * bf16 natively, else TT_F16 (TT_F32, the zero value, means TT_F16) */
  tt_recompute_mode recompute;  /* AUTO = search */
  int inplace;                  /* 1 normally; 0 to switch in-place ops off */
  int eval_batch;               /* 0 = largest that fits in the training arena's transient region */
  const tt_device_profile *profile;
  tt_recompute_search_kind recompute_search; /* BEST (0): segments and per op, the faster that fits */
  int ostate;                   /* tt_state_fmt the candidates hold optimizer state in under [train]
                                 * optimizer_state = auto (tt_policy_search tries fp32, then bf16,
                                 * then int8, until one fits); ignored otherwise */
  size_t host_bytes;            /* planned host offload (offload.h): the pinned host bytes the optimizer
                                 * state may take; 0: never offload. tt_policy_search also plans every
                                 * candidate with the state on the host where the backend stages to a
                                 * device and the profile has a link, and keeps that plan when it is
                                 * faster (or alone fits) and its host region fits host_bytes */
  int offload;                  /* the candidates being planned hold it there (set by tt_policy_search) */
  int no_blocked;               /* tt_policy.no_blocked of the candidates (set by tt_policy_search) */
} tt_policy_opts;

#define TT_POLICY_MAX_ALTS 12

typedef struct tt_policy_alt {
  int micro_batch;
  tt_dtype dtype;
  int recompute_units;          /* -1: none possible */
  size_t arena_bytes;
  double step_ms;               /* per effective batch */
  char why[160];                /* why it lost */
} tt_policy_alt;

typedef struct tt_policy_result {
  tt_policy policy;             /* policy.recompute points into recompute[] below */
  unsigned char *recompute;     /* per node */
  unsigned char *compress;      /* per node: 1 where the per-tensor search keeps the value in its compact or
                                 * compressed form (policy.compact_sel points here; NULL there when the plan
                                 * chose no value: then policy.compact, if set, applies to every one) */
  tt_program train, eval;
  size_t budget_bytes, reserve_bytes;
  double predicted_step_ms;     /* per effective batch (all micro-steps and the update) */
  double recompute_ms;          /* the part of it spent recomputing */
  int nunits, recomputed_units;
  tt_policy_alt alts[TT_POLICY_MAX_ALTS]; /* candidates that fit but lost (their why: tt_policy_explain) */
  int nalts;
  int candidates_tried;
  /* Report-only, filled by tt_policy_explain (zero after tt_policy_search alone): what each technique
   * saved, in arena bytes, at the chosen micro-batch; and when nothing fits, the largest buffer
   * classes of the smallest plan ("params 0.10 GiB, grads 0.10 GiB, optimizer 0.10 GiB"). */
  size_t arena_fp32_plain, arena_no_inplace, arena_no_recompute;
  char dominant[256];
} tt_policy_result;

/* Returns 0 with a fitting schedule; -1 with err set when nothing fits (the message gives
 * the smallest --vram that would fit and the buffers that dominate it). */
/* The 16-bit dtype the options allow: bf16 for TT_PREC_BF16, fp16 for TT_PREC_FP16, and for AUTO
 * auto_half (bf16 where the device computes it natively, else fp16). */
tt_dtype tt_policy_half(const tt_policy_opts *o);
/* Lowers and plans pol into p (tt_lower, tt_program_plan), with the gradients' form chosen: where
 * lower.c makes them transient but the arena packs larger than any with them persistent could be,
 * it plans that too and keeps the smaller, setting pol->grads_persistent (p->policy has it).
 * 0, or tt_lower's or tt_program_plan's error with err set and p freed. */
int tt_policy_plan(const tt_graph *g, tt_policy *pol, tt_backend *be, tt_program *p, tt_err *err);
int tt_policy_search(const tt_graph *g, tt_backend *planner_be, const tt_policy_opts *o, tt_policy_result *r, tt_err *err);
void tt_policy_result_free(tt_policy_result *r);
/* The convolution workspace cap from the budget, after tt_policy_search (the CUDA backend: cuDNN
 * algorithms are chosen among those whose workspace is at most a cap, by default 64 MiB). The
 * schedule was chosen with the backend's default cap; whatever `budget` leaves beside its arena
 * (persistent + the larger transient region of train and eval) may go to the workspaces too. A
 * workspace is live only during its op, so the same policies are lowered and planned again with
 * the cap raised by that slack, then by half and a quarter of it; the first pair of programs that
 * still fits `budget` replaces r->train and r->eval. None fits (or no slack, or budget 0): the
 * default cap and the programs stay. set_cap(be, bytes) sets the backend's cap (0: its default)
 * and returns the one before. Out: *cap the cap the programs were planned with, *dflt the default,
 * *ws_max the largest workspace buffer of r->train. 0, or -1 with err set when lowering fails. */
int tt_policy_widen_workspace(const tt_graph *g, tt_backend *be, tt_policy_result *r, size_t budget,
                              size_t (*set_cap)(tt_backend *, size_t), size_t *cap, size_t *dflt, size_t *ws_max,
                              tt_err *err);
/* The parts of a schedule only a report reads, planned only when asked (`tinytrain plan`, and
 * tt_policy_search's refusal): for a schedule tt_policy_search chose, the arena with each technique
 * switched off and why each alternative lost; for none (r->policy.micro_batch 0), which
 * buffer classes dominate the smallest plan. o: the options tt_policy_search was given. */
void tt_policy_explain(const tt_graph *g, tt_backend *planner_be, const tt_policy_opts *o, tt_policy_result *r);

/* Largest micro-batch that fits (0 if none) for a fixed dtype and recompute mode. */
int tt_policy_max_batch(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_dtype dt, tt_recompute_mode rm,
                       size_t *arena_out);

#ifdef __cplusplus
}
#endif
#endif
