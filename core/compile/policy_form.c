/* core/compile/policy_form.c — one candidate planned: lowered and packed in one memory form, with
 * and without in-place ops (policy_int.h). What the search (policy.c), the largest-batch search
 * (policy_batch.c) and the reports (policy_explain.c) plan each candidate with; it calls none of
 * them. */
#include "../base/knobs.h"
#include "policy.h"
#include "policy_int.h"

#include <stdlib.h>
#include <string.h>

/* A context by value: the search, the reports and max_batch each fill in their own. */
policy_ctx tt_policy_ctx_of(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, size_t budget, int mb, int accum,
                                tt_dtype dt, policy_min *min, tt_plan_memo *memo, tt_err *err) {
  policy_ctx c;
  c.g = g, c.be = be, c.o = o, c.budget = budget, c.mb = mb, c.accum = accum, c.dt = dt;
  c.min = min, c.memo = memo, c.cache = NULL, c.err = err, c.batch_transient = 0, c.fit_first = 0;
  return c;
}

/* The 16-bit type a policy's autocast uses: the recipe's, or under auto the one the hardware has. */
tt_dtype tt_policy_half(const tt_policy_opts *o) {
  if (o->precision == TT_PREC_BF16) return TT_BF16;
  if (o->precision == TT_PREC_FP16) return TT_F16;
  return o->auto_half == TT_BF16 ? TT_BF16 : TT_F16;
}

/* Keeps the smaller arena of *best and *cand in *best (as small: *best, the variant planned
 * first) and frees the other; 1 when cand was kept. Every "plan a variant too" below ends here. */
int tt_policy_keep_smaller(tt_program *best, tt_program *cand) {
  if (cand->arena_bytes < best->arena_bytes) {
    tt_program_free(best);
    *best = *cand;
    return 1;
  }
  tt_program_free(cand);
  return 0;
}

/* tt_lower then the arena plan (through memo when not NULL); p is freed when planning fails. */
static int policy_lower_plan(const tt_graph *g, tt_policy *pol, tt_backend *be, tt_plan_memo *memo, tt_program *p,
                             tt_err *err) {
  int rc;
  if ((rc = tt_lower(g, pol, be, p, err))) return rc;
  if ((rc = tt_program_plan_memo(p, memo, err))) tt_program_free(p);
  return rc;
}

/* tt_policy_plan with a plan memo (policy.h says what it does). The persistent-gradient variant
 * is planned only where the transient one packs above the lower bound that variant could reach,
 * so it costs nothing on the many plans the sweep packs at their bound. */
static int policy_plan(const tt_graph *g, tt_policy *pol, tt_backend *be, tt_plan_memo *memo, tt_program *p, tt_err *err) {
  int rc;
  if (tt_knobs_get()->grads_persistent) pol->grads_persistent = 1; /* TINYTRAIN_GRADS=persistent: to measure */
  if ((rc = policy_lower_plan(g, pol, be, memo, p, err))) return rc;
  /* Transient gradients lower the lower bound, but the arena is a heuristic's packing: where it
   * is above what any arena with persistent gradients could be (their lower bound), that plan is
   * made too and the smaller kept (seen on a small net with every node recomputed: 1.2% larger). */
  if (p->transient_grads && p->arena_bytes > tt_program_bound_grads_persistent(p)) {
    tt_program q;
    tt_policy alt = *pol;
    alt.grads_persistent = 1;
    if ((rc = policy_lower_plan(g, &alt, be, memo, &q, err))) { /* out of memory, as the first would have been */
      tt_program_free(p);
      return rc;
    }
    if (tt_policy_keep_smaller(p, &q)) pol->grads_persistent = 1;
  }
  return 0;
}

/* Callers outside the search plan one program at a time: no memo, and the program they get is
 * ready to run (its final call list made). */
int tt_policy_plan(const tt_graph *g, tt_policy *pol, tt_backend *be, tt_program *p, tt_err *err) {
  int rc = policy_plan(g, pol, be, NULL, p, err);
  if (!rc && (rc = tt_program_calls(p, err))) tt_program_free(p);
  return rc;
}

/* Whether a set holds per-tensor decisions to compress (TT_DEC_COMPRESS: the per-tensor search's). */
int tt_policy_has_compress(const unsigned char *rec, int n) {
  for (int i = 0; i < n; i++)
    if (rec[i] == TT_DEC_COMPRESS) return 1;
  return 0;
}

/* Whether a set offloads a value (TT_DEC_OFFLOAD: the per-tensor search's fourth choice). */
int tt_policy_has_offload(const unsigned char *rec, int n) {
  for (int i = 0; i < n; i++)
    if (rec[i] == TT_DEC_OFFLOAD) return 1;
  return 0;
}

/* Lowers and plans c's candidate with recompute set rec in one memory form (POLICY_COMPACT |
 * POLICY_FUSED bits) and in-place ops as given; 0 and p filled, or -1 or TT_ERR_TOO_LARGE (err set).
 * rec holds per-tensor decisions (TT_DEC_*): those to compress become policy.compact_sel (the
 * compact form on), those to recompute policy.recompute; the program's policy points at rec
 * after (policy_keep makes the two arrays the result's). */
static int policy_plan_one(const policy_ctx *c, int inplace, unsigned char *rec, int form, tt_program *p) {
  tt_policy pol;
  int n = c->g->nnodes, rc;
  unsigned char *split = NULL;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = c->mb, pol.accum_steps = c->accum, pol.act_dtype = c->dt, pol.inplace = inplace, pol.recompute = rec;
  pol.training = 1;
  int cmp = tt_policy_has_compress(rec, n), off = tt_policy_has_offload(rec, n);
  if (cmp || off) {
    if (!(split = (unsigned char *)tt_malloc((size_t)n * 3, "per-tensor decisions", c->err))) return -1;
    for (int i = 0; i < n; i++)
      split[i] = rec[i] == TT_DEC_RECOMPUTE, split[n + i] = rec[i] == TT_DEC_COMPRESS, split[2 * n + i] = rec[i] == TT_DEC_OFFLOAD;
    pol.recompute = split, pol.compact_sel = cmp ? split + n : NULL, pol.offload_sel = off ? split + 2 * n : NULL;
    pol.offload_profile = off ? c->o->profile : NULL; /* the copies' windows from its step times (offload.c) */
    if (tt_knobs_get()->compact == 1) pol.compact_sel = NULL; /* TINYTRAIN_COMPACT=1: every value that can */
    if (cmp) form |= POLICY_COMPACT;
  }
  /* exact: a ReLU mask or pool index only where it frees the tensor (policy_try decides when) */
  pol.compact = (form & POLICY_COMPACT) != 0;
  pol.compress = pol.compact ? c->g->model->train.compress_saved : 0; /* lossy: only when the recipe asks */
  pol.attn_fused = (form & POLICY_FUSED) != 0;
  pol.ostate = c->o->ostate;
  pol.offload = c->o->offload;
  pol.no_blocked = c->o->no_blocked;
  pol.batch_transient = c->batch_transient;
  rc = policy_plan(c->g, &pol, c->be, c->memo, p, c->err);
  if (!rc && p->host_bytes > c->o->host_bytes) { /* --host-mem bounds every pinned byte, state and activations */
    tt_fail(c->err, "the plan's pinned host memory (%zu bytes) is over --host-mem (%zu bytes)", p->host_bytes,
            c->o->host_bytes);
    tt_program_free(p);
    rc = TT_ERR_TOO_LARGE;
  }
  if (split) {
    if (!rc) p->policy.recompute = rec, p->policy.compact_sel = NULL, p->policy.offload_sel = NULL;
    free(split);
  }
  return rc;
}

/* One form, with in-place ops allowed, planned both ways. An accepted alias fuses two buffers'
 * lifetimes into one block, which sometimes packs worse (VGG-16: 2 MiB more), so in-place ops
 * stay only when the arena is no larger; but with c->fit_first (the search, max_batch) an in-place
 * plan that fits the budget, or any without one, is kept as it is: the cost model times both
 * alike, yet the fused calls (bn_fwd_train_relu and its kin) need the in-place forms, and plans
 * 0.1 to 6 MiB smaller without them ran their batch norms and ReLUs as separate passes (ResNet-50
 * mb 16, compress_saved = bf16, --vram 0.72G: 42 fused calls against 92). The reports (smallest
 * plan, savings) still want the smaller. */
int tt_policy_try_form(const policy_ctx *c, int inplace, unsigned char *rec, int form, tt_program *p) {
  tt_program q;
  int rc;
  if ((rc = policy_plan_one(c, inplace, rec, form, p)) || !inplace) return rc;
  if (c->fit_first && (!c->budget || p->arena_bytes <= c->budget)) return 0;
  if ((rc = policy_plan_one(c, 0, rec, form, &q))) {
    tt_program_free(p);
    return rc;
  }
  tt_policy_keep_smaller(p, &q);
  return 0;
}

void tt_policy_result_free(tt_policy_result *r) {
  tt_program_free(&r->train);
  tt_program_free(&r->eval);
  free(r->recompute);
  free(r->compress);
  r->recompute = NULL, r->compress = NULL;
}
