/* core/compile/policy_int.h — what the policy search (policy.c) shares with the largest-batch
 * search (policy_batch.c) and the reports (policy_explain.c): one candidate's context and its plan
 * in one memory form (policy_form.c), the fit of one candidate, and the refusal. */
#ifndef TT_POLICY_INT_H
#define TT_POLICY_INT_H
#include "policy.h"

/* A candidate's memory form (policy_plan_one): bit 0 compact saves, bit 1 the fused attention form. */
#define POLICY_COMPACT 1
#define POLICY_FUSED 2

/* The smallest plan any candidate made (the refusal's): its arena ((size_t)-1: none planned),
 * micro-batch, activation dtype and whether it recomputes. */
typedef struct policy_min {
  size_t arena;
  int mb, recomputes;
  tt_dtype dt;
} policy_min;

/* What every plan of one candidate shares: the graph, backend and options, the budget (0: none),
 * micro-batch, accumulation steps and dtype; min (may be NULL) receives the smallest plan made,
 * memo (may be NULL) remembers the arena plans made, cache (may be NULL) the programs policy_try
 * made for the candidate. */
typedef struct policy_ctx {
  const tt_graph *g;
  tt_backend *be;
  const tt_policy_opts *o;
  size_t budget;
  int mb, accum;
  tt_dtype dt;
  policy_min *min;
  tt_plan_memo *memo;
  struct policy_cache *cache;
  int batch_transient; /* the candidate's plans keep the uint8 batch transient (tt_policy.batch_transient) */
  int fit_first; /* the search and max_batch: an in-place plan that fits (any, without a budget) is kept as it is */
  tt_err *err;
} policy_ctx;

/* A context by value: the search, the reports and max_batch each fill in their own. */
policy_ctx tt_policy_ctx_of(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, size_t budget, int mb, int accum,
                            tt_dtype dt, policy_min *min, tt_plan_memo *memo, tt_err *err);
/* The candidate cin fitted to its budget (policy.c: the recompute searches as the options say):
 * 1 with out planned, 0 when nothing fits, -1 on error. */
int tt_policy_fit(const policy_ctx *cin, unsigned char *rec, tt_program *out);
/* Candidate c with recompute set rec in one memory form (POLICY_*), in-place ops allowed when
 * inplace and kept only when the arena is no larger (policy_form.c): 0 with p planned, else nonzero. */
int tt_policy_try_form(const policy_ctx *c, int inplace, unsigned char *rec, int form, tt_program *p);
/* Keeps the smaller arena of *best and *cand in *best (ties: *best) and frees the other; 1 when
 * cand was kept (policy_form.c). */
int tt_policy_keep_smaller(tt_program *best, tt_program *cand);
/* Whether per-tensor decisions rec (n of them) compress a value (TT_DEC_COMPRESS), offload one
 * (TT_DEC_OFFLOAD). */
int tt_policy_has_compress(const unsigned char *rec, int n);
int tt_policy_has_offload(const unsigned char *rec, int n);
/* Nothing fits (policy_explain.c): err says the smallest --vram that would (min: the smallest
 * plan made) and what dominates that plan; r is freed; returns -1. */
int tt_policy_refuse(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r, const policy_min *min,
                     tt_err *err);

#endif
