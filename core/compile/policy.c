/* core/compile/policy.c — policy search: the fastest policy per image that fits the budget. */
#include "policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* sched_plan_one's compact argument: bit 0 compact saves, bit 1 the fused attention form. */
#define SCHED_COMPACT 1
#define SCHED_FUSED 2

/* The 16-bit type a policy's autocast uses: the recipe's, or under auto the one the hardware has. */
tt_dtype tt_policy_half(const tt_policy_opts *o) {
  if (o->precision == TT_PREC_BF16) return TT_BF16;
  if (o->precision == TT_PREC_FP16) return TT_F16;
  return o->auto_half == TT_BF16 ? TT_BF16 : TT_F16;
}

int tt_policy_plan(const tt_graph *g, tt_policy *pol, tt_backend *be, tt_program *p, tt_err *err) {
  const char *env = getenv("TINYTRAIN_GRADS"); /* =persistent: the accumulators always, to measure */
  int rc;
  if (env && !strcmp(env, "persistent")) pol->grads_persistent = 1;
  if ((rc = tt_lower(g, pol, be, p, err))) return rc;
  if ((rc = tt_program_plan(p, err))) {
    tt_program_free(p);
    return rc;
  }
  /* Transient gradients lower the lower bound, but the arena is a heuristic's packing: where it
   * is above what any arena with persistent gradients could be (their lower bound), that plan is
   * made too and the smaller kept (seen on a small net with every node recomputed: 1.2% larger). */
  if (p->transient_grads && p->arena_bytes > tt_program_bound_grads_persistent(p)) {
    tt_program q;
    tt_policy alt = *pol;
    alt.grads_persistent = 1;
    if ((rc = tt_lower(g, &alt, be, &q, err)) == 0 && (rc = tt_program_plan(&q, err)) != 0) tt_program_free(&q);
    if (rc) { /* out of memory, as the first would have been: the caller sees the error */
      tt_program_free(p);
      return rc;
    }
    if (q.arena_bytes < p->arena_bytes) {
      tt_program_free(p);
      *p = q;
      pol->grads_persistent = 1;
    } else {
      tt_program_free(&q);
    }
  }
  return 0;
}

/* Lowers and plans one policy; returns 0 and fills p, or -1 or TT_ERR_TOO_LARGE (err set).
 * compact: SCHED_COMPACT | SCHED_FUSED bits. */
static int sched_plan_one(const tt_graph *g, tt_backend *be, int mb, int accum, tt_dtype dt, int inplace, unsigned char *rec,
                          int compact, tt_program *p, tt_err *err) {
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = mb, pol.accum_steps = accum, pol.act_dtype = dt, pol.inplace = inplace, pol.recompute = rec;
  pol.training = 1;
  /* exact: a ReLU mask or pool index only where it frees the tensor (sched_try decides when) */
  pol.compact = (compact & SCHED_COMPACT) != 0;
  pol.compress = pol.compact ? g->model->train.compress_saved : 0; /* lossy: only when the recipe asks */
  pol.attn_fused = (compact & SCHED_FUSED) != 0;
  return tt_policy_plan(g, &pol, be, p, err);
}

/* One candidate: with in-place ops allowed, planned both ways. An accepted alias fuses two
 * buffers' lifetimes into one block, which sometimes packs worse (VGG-16: 2 MiB more); the
 * cost model times both alike, so in-place ops stay only when the arena is no larger. */
static int sched_try_c(const tt_graph *g, tt_backend *be, int mb, int accum, tt_dtype dt, int inplace, unsigned char *rec,
                       int compact, tt_program *p, tt_err *err) {
  tt_program q;
  int rc;
  if ((rc = sched_plan_one(g, be, mb, accum, dt, inplace, rec, compact, p, err)) || !inplace) return rc;
  if ((rc = sched_plan_one(g, be, mb, accum, dt, 0, rec, compact, &q, err))) {
    tt_program_free(p);
    return rc;
  }
  if (q.arena_bytes < p->arena_bytes) {
    tt_program_free(p);
    *p = q;
  } else {
    tt_program_free(&q);
  }
  return 0;
}

/* Compact saves (ReLU 1-bit masks, max-pool uint8 indices) are a memory technique like
 * recompute: used when the full tensors do not fit `budget` (0: none), and kept only when they
 * give the smaller arena. Always on, they made LeNet's arena 18% smaller but packed 1.09x its
 * lower bound, against the arena's 1.05 (tests/test_cli.sh, cli_plan_json): the many small,
 * long-lived masks fragment the greedy placement. TINYTRAIN_COMPACT=1 uses them always,
 * TINYTRAIN_COMPACT=0 never. */
static int sched_try_k(const tt_graph *g, tt_backend *be, int mb, int accum, tt_dtype dt, int inplace, unsigned char *rec,
                       size_t budget, int fused, tt_program *p, tt_err *err) {
  const char *env = getenv("TINYTRAIN_COMPACT");
  int force = env && *env ? (strcmp(env, "0") ? 1 : 0) : -1, rc;
  if (force >= 0) return sched_try_c(g, be, mb, accum, dt, inplace, rec, force | fused, p, err);
  if ((rc = sched_try_c(g, be, mb, accum, dt, inplace, rec, fused, p, err)) || !budget || p->arena_bytes <= budget) return rc;
  tt_program q;
  if ((rc = sched_try_c(g, be, mb, accum, dt, inplace, rec, SCHED_COMPACT | fused, &q, err))) {
    tt_program_free(p);
    return rc;
  }
  if (q.arena_bytes < p->arena_bytes) {
    tt_program_free(p);
    *p = q;
  } else {
    tt_program_free(&q);
  }
  return 0;
}

/* The attention probabilities [N, heads, t, t] are kept for backward (the faster backward) when
 * the plan fits `budget` (0: none) with them; otherwise the fused form, which keeps only the row
 * statistics and rebuilds the probabilities in backward, when it gives the smaller arena: a
 * memory technique like compact saves, tried before recompute is (the recompute search runs on
 * whatever this returns). TINYTRAIN_ATTN=keep|fused forces one. */
static int sched_try(const tt_graph *g, tt_backend *be, int mb, int accum, tt_dtype dt, int inplace, unsigned char *rec,
                     size_t budget, tt_program *p, tt_err *err) {
  const char *env = getenv("TINYTRAIN_ATTN");
  int has_attn = 0, rc;
  for (int i = 0; i < g->nnodes; i++) has_attn |= g->nodes[i].kind == TT_L_ATTENTION;
  if (!has_attn) return sched_try_k(g, be, mb, accum, dt, inplace, rec, budget, 0, p, err);
  if (env && *env) return sched_try_k(g, be, mb, accum, dt, inplace, rec, budget, strcmp(env, "fused") ? 0 : SCHED_FUSED, p, err);
  if ((rc = sched_try_k(g, be, mb, accum, dt, inplace, rec, budget, 0, p, err)) || !budget || p->arena_bytes <= budget) return rc;
  tt_program q;
  if ((rc = sched_try_k(g, be, mb, accum, dt, inplace, rec, budget, SCHED_FUSED, &q, err))) {
    tt_program_free(p);
    return rc;
  }
  if (q.arena_bytes < p->arena_bytes) {
    tt_program_free(p);
    *p = q;
  } else {
    tt_program_free(&q);
  }
  return 0;
}

static int sched_count(const unsigned char *rec, int n) {
  int c = 0;
  for (int i = 0; i < n; i++) c += rec[i] != 0;
  return c;
}

/* Which recompute search runs: the options', or TINYTRAIN_RECOMPUTE_SEARCH=segments|ops
 * (to compare the searches, e.g. tests/bench/memory_tradeoff), or both. */
static tt_recompute_search_kind sched_rsearch(const tt_policy_opts *o) {
  const char *e;
  if (o->recompute_search != TT_RSEARCH_BEST) return o->recompute_search;
  e = getenv("TINYTRAIN_RECOMPUTE_SEARCH");
  if (e && !strcmp(e, "segments")) return TT_RSEARCH_SEGMENTS;
  if (e && !strcmp(e, "ops")) return TT_RSEARCH_OPS;
  return TT_RSEARCH_BEST;
}

/* The fit-by-overshoot loops below ask the search to free `need` bytes, plan, and ask for
 * 1.25x the remaining overshoot more until the real planner says it fits. That last step can
 * overshoot far (a larger budget then got a slower plan than a smaller one: ResNet-50 at
 * --vram 800M planned 150 s where 790M planned 144 s), so once a need fits and a smaller one
 * did not, the need is bisected between them (SCHED_REFINE times at most) and the fastest
 * fitting plan kept (sched_pick). */
#define SCHED_REFINE 3

/* The next need after a plan: fits says whether the last one (at *need) fitted; *lo is the
 * largest need that did not fit (-1: none yet), *hi the smallest that did (-1: none yet), step
 * the overshoot to add while nothing has fitted. 1: plan again at *need, 0: stop. */
static int sched_next_need(int fits, double *need, double *lo, double *hi, double step, int *refined) {
  if (fits) *hi = *need;
  else *lo = *need;
  if (*hi < 0.0) {
    *need += step;
    return 1;
  }
  if (*lo < 0.0 || *refined >= SCHED_REFINE || *hi - *lo < 0.02 * *hi + 1.0) return 0;
  (*refined)++;
  *need = 0.5 * (*lo + *hi);
  return 1;
}

/* The bytes to ask for beyond the last need when its plan overshot the budget: 1.25x the
 * overshoot, doubled each time the arena did not shrink since the last overshoot (*prev: that
 * arena, 0 at first), since a small overshoot can take several steps to free one more value
 * (ResNet-50 at --vram 800M overshot by 0.4 MiB ten times with the same plan, then gave up). */
static double sched_step(size_t arena, size_t budget, size_t *prev, double *mult) {
  if (*prev && arena >= *prev) *mult *= 2.0;
  *prev = arena;
  return (double)(arena - budget) * 1.25 * *mult + 1.0;
}

static void sched_pick(const tt_graph *g, const tt_policy_opts *o, int *have, tt_program *out, unsigned char *rec,
                       tt_program *p2, const unsigned char *rec2);

/* Per-op recompute (tt_recompute_search_ops) freeing `over` bytes, asking for more until the
 * real planner says it fits, then refined as above; 1 fits (out, rec), 0 not, -1 or
 * TT_ERR_TOO_LARGE on error. */
static int sched_fit_ops(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, size_t budget, int mb, int accum,
                         tt_dtype dt, double over, unsigned char *rec, tt_program *out, size_t *min_arena, tt_err *err) {
  int rc, have = 0, refined = 0, n = g->nnodes;
  double need = over, lo = -1.0, hi = -1.0, mult = 1.0;
  size_t prev = 0;
  unsigned char *r2 = (unsigned char *)tt_malloc((size_t)n, "recompute set", err);
  if (!r2) return -1;
  for (int iter = 0; iter < 10 + SCHED_REFINE; iter++) {
    tt_program q;
    int ops = tt_recompute_search_ops(g, mb, dt, o->profile, need, r2, err);
    if (ops < -1) {
      if (have) tt_program_free(out);
      return free(r2), -1;
    }
    if ((rc = sched_try(g, be, mb, accum, dt, o->inplace, r2, budget, &q, err))) {
      if (have) tt_program_free(out);
      return free(r2), rc;
    }
    if (min_arena && q.arena_bytes < *min_arena) *min_arena = q.arena_bytes;
    int fits = q.arena_bytes <= budget;
    double step = fits ? 0.0 : sched_step(q.arena_bytes, budget, &prev, &mult);
    if (fits) sched_pick(g, o, &have, out, rec, &q, r2);
    else tt_program_free(&q);
    if ((!fits && ops < 0 && hi < 0.0) || !sched_next_need(fits, &need, &lo, &hi, step, &refined)) break;
  }
  free(r2);
  return have;
}

static int sched_fit_segments(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, size_t budget, int mb, int accum,
                              tt_dtype dt, unsigned char *rec, tt_program *out, size_t *min_arena, double *over_out,
                              tt_err *err);

/* Keeps candidate (p2, rec2) in (out, rec) when it is faster in the cost model (as fast: the
 * smaller arena) or there is none yet (*have 0); frees the loser. */
static void sched_pick(const tt_graph *g, const tt_policy_opts *o, int *have, tt_program *out, unsigned char *rec,
                       tt_program *p2, const unsigned char *rec2) {
  int take = !*have;
  if (!take) {
    double a = tt_predict_ms(out, o->profile), b = tt_predict_ms(p2, o->profile);
    take = fabs(a - b) <= 1e-9 * a ? p2->arena_bytes < out->arena_bytes : b < a;
  }
  if (take) {
    if (*have) tt_program_free(out);
    *out = *p2;
    memcpy(rec, rec2, (size_t)g->nnodes);
    out->policy.recompute = rec;
    *have = 1;
  } else {
    tt_program_free(p2);
  }
}

/* The local per-op plan (tt_recompute_add_cheap, local: cheapest first, recompute cascading only
 * inside a unit) freeing `over` bytes, asking for more until the real planner says it fits; when
 * only the plan that drops them all fits, need is bisected between the last that did not and
 * that one, for the cheapest that fits. 1 fits (out, rec), 0 not, -1 or TT_ERR_TOO_LARGE on error. */
static int sched_fit_local(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, size_t budget, int mb, int accum,
                           tt_dtype dt, double over, unsigned char *rec, tt_program *out, size_t *min_arena, tt_err *err) {
  int n = g->nnodes, rc, k, have = 0;
  double need = over, lo = 0.0, all = 0.0, mult = 1.0;
  size_t prev = 0;
  unsigned char *r2 = (unsigned char *)tt_malloc((size_t)n, "recompute set", err);
  if (!r2) return -1;
  memset(r2, 0, (size_t)n);
  if (tt_recompute_add_cheap(g, mb, dt, o->profile, -1.0, 1, r2, &all, err) < -1) return free(r2), -1;
  for (int iter = 0; iter < 10; iter++) {
    tt_program q;
    memset(r2, 0, (size_t)n);
    if ((k = tt_recompute_add_cheap(g, mb, dt, o->profile, need, 1, r2, NULL, err)) < -1) break;
    if ((rc = sched_try(g, be, mb, accum, dt, o->inplace, r2, budget, &q, err))) {
      if (have) tt_program_free(out);
      return free(r2), rc;
    }
    if (min_arena && q.arena_bytes < *min_arena) *min_arena = q.arena_bytes;
    if (q.arena_bytes <= budget) {
      sched_pick(g, o, &have, out, rec, &q, r2);
      if (k >= 0 || need - lo < 0.01 * all) break; /* freeing less than all: the first that fits */
      need = 0.5 * (lo + (need < all ? need : all));  /* all fit: does less? */
      continue;
    }
    tt_program_free(&q);
    if (k < 0) break; /* all of them do not fit */
    lo = need;
    need = have ? 0.5 * (lo + all) : need + sched_step(q.arena_bytes, budget, &prev, &mult);
    if (have && need - lo < 0.01 * all) break;
  }
  free(r2);
  return k < -1 ? (have ? (tt_program_free(out), -1) : -1) : have;
}

/* Segments and per-op recompute in one plan: every memory-bound value (batch norm, ReLU, add,
 * pooling) backward can recompute in one hop from values it keeps, beside the segments the
 * segment search picks for what they do not free (the one-hop drops re-chosen around those
 * segments, whose insides are dropped anyway). Outside the segments, in a conv -> BN -> ReLU chain
 * only the convolution's output stays. 1 fits (out, rec), 0 not, -1 or TT_ERR_TOO_LARGE on error. */
static int sched_fit_hybrid(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, size_t budget, int mb, int accum,
                            tt_dtype dt, double over, unsigned char *rec, tt_program *out, size_t *min_arena, tt_err *err) {
  int n = g->nnodes, rc = 0;
  double cheap = 0.0, need;
  unsigned char *pre = (unsigned char *)tt_calloc((size_t)n, 1, "recompute set", err);
  if (!pre) return -1;
  if (tt_recompute_add_cheap(g, mb, dt, o->profile, -1.0, 0, pre, &cheap, err) < -1) return free(pre), -1;
  need = over - cheap > 1.0 ? over - cheap : 1.0;
  {
    int have = 0, refined = 0;
    double lo = -1.0, hi = -1.0, mult = 1.0;
    size_t prev = 0;
    unsigned char *r2 = (unsigned char *)tt_malloc((size_t)n, "recompute set", err);
    if (!r2) return free(pre), -1;
    for (int iter = 0; iter < 8 + SCHED_REFINE; iter++) {
      tt_program q;
      int units = tt_recompute_search_pre(g, mb, dt, o->profile, need, pre, r2, err);
      if (units < -1 || (units == -1 && tt_recompute_all(g, r2, err)) ||
          tt_recompute_add_cheap(g, mb, dt, o->profile, -1.0, 0, r2, NULL, err) < -1) {
        rc = -1;
        break;
      }
      if ((rc = sched_try(g, be, mb, accum, dt, o->inplace, r2, budget, &q, err))) break;
      if (min_arena && q.arena_bytes < *min_arena) *min_arena = q.arena_bytes;
      int fits = q.arena_bytes <= budget;
      double step = fits ? 0.0 : sched_step(q.arena_bytes, budget, &prev, &mult);
      if (fits) sched_pick(g, o, &have, out, rec, &q, r2);
      else tt_program_free(&q);
      if ((!fits && units < 0 && hi < 0.0) || !sched_next_need(fits, &need, &lo, &hi, step, &refined)) break;
    }
    free(r2);
    free(pre);
    if (rc) {
      if (have) tt_program_free(out);
      return rc;
    }
    return have;
  }
}

/* Best fitting program for (mb, dt): plain, or with the cheapest recompute set that fits: the
 * segment search's, the per-op search's and the two together (o->recompute_search), the faster
 * in the cost model (as fast: the smaller arena). rec receives the recompute set. Returns 1 if
 * fits, 0 if not, -1 or TT_ERR_TOO_LARGE on error. */
static int sched_fit(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, size_t budget, int mb, int accum, tt_dtype dt,
                     unsigned char *rec, tt_program *out, size_t *min_arena, tt_err *err) {
  double over = -1.0;
  int n = g->nnodes;
  int rc = sched_fit_segments(g, be, o, budget, mb, accum, dt, rec, out, min_arena, &over, err);
  tt_recompute_search_kind kind = sched_rsearch(o);
  if (rc < 0 || over < 0.0 || o->recompute != TT_RECOMP_AUTO || kind == TT_RSEARCH_SEGMENTS) return rc;
  /* the plain program did not fit and the segment search ran: try recomputing single ops, and
   * single ops beside segments */
  unsigned char *rec2 = (unsigned char *)tt_malloc((size_t)n, "recompute set", err);
  if (!rec2) {
    if (rc == 1) tt_program_free(out);
    return -1;
  }
  int have = rc == 1 && kind != TT_RSEARCH_OPS;
  if (rc == 1 && !have) tt_program_free(out);
  for (int c = 0; c < 3; c++) {
    if (c == 2 && kind == TT_RSEARCH_OPS) break; /* the hybrid has segments */
    tt_program p2;
    int rc2 = c == 0   ? sched_fit_ops(g, be, o, budget, mb, accum, dt, over, rec2, &p2, min_arena, err)
              : c == 1 ? sched_fit_local(g, be, o, budget, mb, accum, dt, over, rec2, &p2, min_arena, err)
                       : sched_fit_hybrid(g, be, o, budget, mb, accum, dt, over, rec2, &p2, min_arena, err);
    if (rc2 < 0) {
      free(rec2);
      if (have) tt_program_free(out);
      return rc2;
    }
    if (rc2 == 1) sched_pick(g, o, &have, out, rec, &p2, rec2);
  }
  free(rec2);
  return have;
}

/* The segment search's fit; *over_out: the bytes the plain program overshot by (-1 when it
 * fit or recompute is not searched). */
static int sched_fit_segments(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, size_t budget, int mb, int accum,
                              tt_dtype dt, unsigned char *rec, tt_program *out, size_t *min_arena, double *over_out,
                              tt_err *err) {
  int n = g->nnodes, rc;
  tt_recompute_mode rm = o->recompute;
  memset(rec, 0, (size_t)n);
  if (rm == TT_RECOMP_ALL && tt_recompute_all(g, rec, err)) return -1;
  if ((rc = sched_try(g, be, mb, accum, dt, o->inplace, rec, budget, out, err))) return rc;
  if (min_arena && out->arena_bytes < *min_arena) *min_arena = out->arena_bytes;
  if (!budget || out->arena_bytes <= budget) return 1;
  if (rm != TT_RECOMP_AUTO) {
    tt_program_free(out);
    return 0;
  }
  /* Free the overshoot by recomputing; the model is approximate, so check with the real
   * planner and ask for more until it fits or the plan that frees the most is reached. */
  double over = (double)(out->arena_bytes - budget), mult = 1.0;
  size_t prev = 0;
  *over_out = over;
  tt_program_free(out);
  if (sched_rsearch(o) == TT_RSEARCH_OPS) return 0;
  for (int iter = 0; iter < 8; iter++) {
    int units = tt_recompute_search(g, mb, dt, o->profile, over, rec, err);
    if (units < -1 || (units == -1 && tt_recompute_all(g, rec, err))) return -1;
    if ((rc = sched_try(g, be, mb, accum, dt, o->inplace, rec, budget, out, err))) return rc;
    if (min_arena && out->arena_bytes < *min_arena) *min_arena = out->arena_bytes;
    if (out->arena_bytes <= budget) return 1;
    over += sched_step(out->arena_bytes, budget, &prev, &mult);
    tt_program_free(out);
    if (units < 0) break;
  }
  /* last resort: the plan that frees the most */
  if (tt_recompute_all(g, rec, err)) return -1;
  if ((rc = sched_try(g, be, mb, accum, dt, o->inplace, rec, budget, out, err))) return rc;
  if (min_arena && out->arena_bytes < *min_arena) *min_arena = out->arena_bytes;
  if (out->arena_bytes <= budget) return 1;
  tt_program_free(out);
  return 0;
}

/* Records a candidate that fits but lost; tt_policy_explain says why, against the final choice. */
static void sched_add_alt(tt_policy_result *r, int mb, tt_dtype dt, int ru, size_t arena, double ms) {
  if (r->nalts >= TT_POLICY_MAX_ALTS) return;
  tt_policy_alt *a = &r->alts[r->nalts++];
  a->micro_batch = mb, a->dtype = dt, a->recompute_units = ru, a->arena_bytes = arena, a->step_ms = ms;
}

static int sched_eval(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r, tt_err *err) {
  int eb = o->eval_batch > 0 ? o->eval_batch : r->policy.micro_batch;
  int fixed = o->eval_batch > 0;
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.act_dtype = r->policy.act_dtype, pol.inplace = o->inplace, pol.training = 0, pol.accum_steps = 1;
  for (;;) {
    pol.micro_batch = eb;
    tt_program p;
    int rc = tt_lower(g, &pol, be, &p, err);
    if (!rc && (rc = tt_program_plan(&p, err))) tt_program_free(&p);
    /* a larger batch too large to plan (sizes past 2^64 bytes): keep the previous one */
    if (rc) return rc == TT_ERR_TOO_LARGE && !fixed && eb != r->policy.micro_batch ? 0 : -1;
    int ok = p.transient_bytes <= r->train.transient_bytes;
    if (fixed || (!ok && eb == r->policy.micro_batch)) {
      r->eval = p;
      return 0;
    }
    if (!ok) { /* keep the previous (smaller) one */
      tt_program_free(&p);
      return 0;
    }
    tt_program_free(&r->eval);
    r->eval = p;
    if (eb >= 1024) return 0;
    eb *= 2;
  }
}

/* Checks the options against the recipe and sets r's reserve and budget. */
static int sched_budget(const tt_graph *g, const tt_policy_opts *o, tt_policy_result *r, tt_err *err) {
  const tt_model *m = g->model;
  int eff = m->train.batch;
  if (eff <= 0) return tt_fail(err, "%s: [train] batch must be a positive integer", m->path);
  r->reserve_bytes = o->vram_bytes ? o->reserve_bytes : 0;
  /* --vram at or below the reserve: a budget of 1 byte, in which nothing fits, so that the
   * refusal still names the smallest --vram that fits (sched_refuse) */
  r->budget_bytes = !o->vram_bytes ? 0 : o->vram_bytes > o->reserve_bytes ? o->vram_bytes - o->reserve_bytes : 1;
  if (o->micro_batch > 0 && eff % o->micro_batch)
    return tt_fail(err, "micro-batch %d does not divide the effective batch %d of %s; choose a divisor", o->micro_batch, eff,
                   m->path);
  return 0;
}

/* Makes the fitting program p (recompute set rec, predicted ms and rms) the schedule. */
static void sched_keep(tt_policy_result *r, const tt_program *p, const unsigned char *rec, int n, double ms, double rms) {
  r->train = *p;
  r->policy = p->policy;
  memcpy(r->recompute, rec, (size_t)n);
  r->policy.recompute = r->recompute;
  r->train.policy.recompute = r->recompute;
  r->predicted_step_ms = ms;
  r->recompute_ms = rms;
}

/* The search: each precision allowed, micro-batches from the effective batch down. Returns 1 with
 * the fastest fitting candidate kept in r and the others fitting listed as alternatives, 0 when
 * nothing fits, -1 on error. *min_arena receives the smallest arena any candidate planned. */
static int sched_search(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r,
                        unsigned char *rec, size_t *min_arena, tt_err *err) {
  int n = g->nnodes, eff = g->model->train.batch, have = 0, failed = 0;
  tt_dtype dts[2];
  int ndt = 0;
  if (o->precision == TT_PREC_AUTO || o->precision == TT_PREC_FP32) dts[ndt++] = TT_F32;
  if (o->precision != TT_PREC_FP32) dts[ndt++] = tt_policy_half(o);
  double best_ms_per_img = 1e300;
  for (int d = 0; d < ndt; d++) {
    for (int mb = eff; mb >= 1; mb--) {
      if (eff % mb || (o->micro_batch > 0 && mb != o->micro_batch)) continue;
      tt_program p;
      int fit = sched_fit(g, be, o, r->budget_bytes, mb, eff / mb, dts[d], rec, &p, min_arena, err);
      r->candidates_tried++;
      /* Under a budget, a candidate too large to plan (its sizes pass 2^64 bytes) does not
       * fit, and a smaller micro-batch may; err keeps why in case none plans at all. */
      if (fit == TT_ERR_TOO_LARGE && r->budget_bytes) {
        failed = 1;
        continue;
      }
      if (fit < 0) return -1;
      if (!fit) continue;
      double rms = 0.0;
      double ms = tt_cost_predict_ms(&p, o->profile, &rms);
      int ru = sched_count(rec, n);
      /* faster wins; as fast (to rounding), the smaller arena */
      int as_fast = fabs(ms - best_ms_per_img) <= 1e-9 * ms;
      if (as_fast ? have && p.arena_bytes < r->train.arena_bytes : ms < best_ms_per_img) {
        if (have) {
          sched_add_alt(r, r->policy.micro_batch, r->policy.act_dtype, sched_count(r->recompute, n), r->train.arena_bytes,
                        r->predicted_step_ms);
          tt_program_free(&r->train);
        }
        sched_keep(r, &p, rec, n, ms, rms);
        best_ms_per_img = ms;
        have = 1;
      } else {
        sched_add_alt(r, mb, dts[d], ru, p.arena_bytes, ms);
        tt_program_free(&p);
      }
      /* a smaller micro-batch without recompute is never faster in the model; one with
       * recompute might be, so keep going only while this one needed recompute */
      if (ru == 0) break;
    }
  }
  return !have && failed && *min_arena == (size_t)-1 ? -1 : have;
}

/* Units of the graph and how many of them the chosen plan recomputes (the run's summary). */
static void sched_count_units(const tt_graph *g, tt_policy_result *r) {
  int n = g->nnodes;
  int *unit_of = (int *)malloc(sizeof(int) * (size_t)n);
  if (!unit_of) return;
  r->nunits = tt_recompute_units(g, unit_of);
  int cnt = 0, prev = -1;
  for (int v = 0; v < n; v++)
    if (r->recompute[v] && unit_of[v] != prev) cnt++, prev = unit_of[v];
  r->recomputed_units = cnt;
  free(unit_of);
}

/* Nothing fits: the message gives the smallest --vram that would and what dominates it. */
static int sched_refuse(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r,
                        size_t min_arena, tt_err *err) {
  size_t need = min_arena == (size_t)-1 ? 0 : min_arena;
  tt_policy_explain(g, be, o, r);
  if (o->vram_bytes && o->vram_bytes <= o->reserve_bytes) {
    tt_fail(err, "--vram %.2f GiB is not more than the %.2f GiB reserved for the CUDA context and libraries: "
                   "nothing is left for %s's arena; the smallest --vram that fits is %.2f GiB (the smallest plan, micro-batch %d, "
                   "needs a %.2f GiB arena)", o->vram_bytes / 1073741824.0, o->reserve_bytes / 1073741824.0, g->model->path,
                   (need + o->reserve_bytes) / 1073741824.0 + 0.005, o->micro_batch > 0 ? o->micro_batch : 1, need / 1073741824.0);
    tt_policy_result_free(r);
    return -1;
  }
  tt_fail(err, "%s does not fit: the smallest plan (micro-batch %d%s, %s) needs a %.2f GiB arena but the budget is "
          "%.2f GiB; the smallest --vram that fits is %.2f GiB; it is dominated by %s",
          g->model->path, o->micro_batch > 0 ? o->micro_batch : 1, o->recompute == TT_RECOMP_NONE ? "" : ", recomputing",
          tt_dtype_name(o->precision == TT_PREC_FP32 ? TT_F32 : tt_policy_half(o)), need / 1073741824.0, r->budget_bytes / 1073741824.0,
          (need + o->reserve_bytes) / 1073741824.0 + 0.005, r->dominant[0] ? r->dominant : "(breakdown unavailable)");
  tt_policy_result_free(r);
  return -1;
}

int tt_policy_search(const tt_graph *g, tt_backend *be, const tt_policy_opts *oin, tt_policy_result *r, tt_err *err) {
  memset(r, 0, sizeof *r);
  tt_policy_opts o = *oin;
  if (!o.profile) o.profile = tt_profile_cuda_generic();
  int n = g->nnodes;
  if (sched_budget(g, &o, r, err)) return -1;
  unsigned char *rec = (unsigned char *)tt_calloc((size_t)n, 1, "schedule", err);
  r->recompute = (unsigned char *)tt_calloc((size_t)n, 1, "schedule", err);
  if (!rec || !r->recompute) {
    free(rec);
    tt_policy_result_free(r);
    return -1;
  }
  size_t min_arena = (size_t)-1;
  int have = sched_search(g, be, &o, r, rec, &min_arena, err);
  free(rec);
  if (have < 0) {
    tt_policy_result_free(r);
    return -1;
  }
  if (!have) return sched_refuse(g, be, &o, r, min_arena, err);
  sched_count_units(g, r);
  if (sched_eval(g, be, &o, r, err)) {
    tt_policy_result_free(r);
    return -1;
  }
  return 0;
}

/* ---- the convolution workspace cap from the budget (policy.h) ---- */

/* The largest workspace buffer of a program (its TT_BC_WORKSPACE buffers), bytes. */
static size_t sched_max_ws(const tt_program *p) {
  size_t m = 0;
  for (int i = 0; i < p->nbufs; i++)
    if (p->bufs[i].cls == TT_BC_WORKSPACE && p->bufs[i].bytes > m) m = p->bufs[i].bytes;
  return m;
}

/* Lowers and plans p's policy again (its recompute set included) into q. */
static int sched_relower(const tt_graph *g, tt_backend *be, const tt_program *p, tt_program *q, tt_err *err) {
  tt_policy pol = p->policy;
  int rc;
  if ((rc = tt_lower(g, &pol, be, q, err))) return rc;
  if ((rc = tt_program_plan(q, err))) tt_program_free(q);
  return rc;
}

static size_t sched_arena(const tt_program *t, const tt_program *e) {
  return t->persistent_bytes + (t->transient_bytes > e->transient_bytes ? t->transient_bytes : e->transient_bytes);
}

int tt_policy_widen_workspace(const tt_graph *g, tt_backend *be, tt_policy_result *r, size_t budget,
                              size_t (*set_cap)(tt_backend *, size_t), size_t *cap, size_t *dflt, size_t *ws_max,
                              tt_err *err) {
  size_t d = set_cap(be, 0), arena = sched_arena(&r->train, &r->eval);
  *dflt = *cap = d;
  *ws_max = sched_max_ws(&r->train);
  /* under 1 MiB of slack changes no choice worth a second planning */
  if (!budget || arena >= budget || budget - arena <= ((size_t)1 << 20)) return 0;
  size_t slack = budget - arena;
  for (int k = 0; k < 3; k++) {
    size_t c = d + (slack >> k);
    tt_program nt, ne;
    int rc;
    set_cap(be, c);
    if ((rc = sched_relower(g, be, &r->train, &nt, err))) {
      if (rc == TT_ERR_TOO_LARGE) continue; /* sizes past 2^64 bytes: a smaller cap */
      set_cap(be, 0);
      return -1;
    }
    if ((rc = sched_relower(g, be, &r->eval, &ne, err))) {
      tt_program_free(&nt);
      if (rc == TT_ERR_TOO_LARGE) continue;
      set_cap(be, 0);
      return -1;
    }
    if (sched_arena(&nt, &ne) <= budget) {
      tt_program_free(&r->train);
      tt_program_free(&r->eval);
      r->train = nt, r->eval = ne;
      *cap = c;
      *ws_max = sched_max_ws(&r->train);
      return 0;
    }
    tt_program_free(&nt);
    tt_program_free(&ne);
  }
  set_cap(be, 0); /* the default, with which the kept programs were planned */
  return 0;
}

/* ---- report-only: what `tinytrain plan` and a refusal say, planned only when asked ---- */

/* The three largest buffer classes live at the peak of the smallest plan the options allow:
 * micro-batch 1 (or the one given), every unit recomputed unless recompute is off. */
static void sched_dominant(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, char *dom, size_t size) {
  int eff = g->model->train.batch;
  unsigned char *rr = (unsigned char *)calloc((size_t)g->nnodes, 1);
  tt_program q;
  tt_err e2;
  dom[0] = 0;
  if (!rr) return;
  if (o->recompute != TT_RECOMP_NONE && tt_recompute_all(g, rr, &e2)) {
    free(rr);
    return;
  }
  if (!sched_try_c(g, be, o->micro_batch > 0 ? o->micro_batch : 1, eff, o->precision == TT_PREC_FP32 ? TT_F32 : tt_policy_half(o),
                   o->inplace, rr, SCHED_COMPACT | SCHED_FUSED, &q, &e2)) { /* the smallest plan: compact saves and fused attention */
    size_t at[TT_BC_COUNT];
    tt_program_peak_breakdown(&q, at);
    for (int k = 0; k < 3; k++) {
      int bi = -1;
      for (int c = 0; c < TT_BC_COUNT; c++)
        if (at[c] && (bi < 0 || at[c] > at[bi])) bi = c;
      if (bi < 0) break;
      snprintf(dom + strlen(dom), size - strlen(dom), "%s%s %.2f GiB", k ? ", " : "",
               tt_buf_class_name((tt_buf_class)bi), at[bi] / 1073741824.0);
      at[bi] = 0;
    }
    tt_program_free(&q);
  }
  free(rr);
}

/* The arena at the chosen micro-batch with the techniques switched off: fp32 without in-place
 * or recompute; the chosen precision without in-place; without recompute. */
static void sched_savings(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r) {
  const tt_policy *pol = &r->policy;
  tt_program q;
  tt_err e2;
  unsigned char *none = (unsigned char *)calloc((size_t)g->nnodes, 1);
  if (!none) return;
  if (!sched_try_c(g, be, pol->micro_batch, pol->accum_steps, TT_F32, 0, none, 0, &q, &e2)) {
    r->arena_fp32_plain = q.arena_bytes;
    tt_program_free(&q);
  }
  int same = (pol->compact ? SCHED_COMPACT : 0) | (pol->attn_fused ? SCHED_FUSED : 0);
  if (!sched_try_c(g, be, pol->micro_batch, pol->accum_steps, pol->act_dtype, 0, r->recompute, same, &q, &e2)) {
    r->arena_no_inplace = q.arena_bytes;
    tt_program_free(&q);
  }
  if (!sched_try_c(g, be, pol->micro_batch, pol->accum_steps, pol->act_dtype, o->inplace, none, same, &q, &e2)) {
    r->arena_no_recompute = q.arena_bytes;
    tt_program_free(&q);
  }
  free(none);
}

void tt_policy_explain(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r) {
  if (r->policy.micro_batch <= 0) {
    sched_dominant(g, be, o, r->dominant, sizeof r->dominant);
    return;
  }
  sched_savings(g, be, o, r);
  for (int i = 0; i < r->nalts; i++)
    snprintf(r->alts[i].why, sizeof r->alts[i].why, "fits, predicted %.0f%% slower than the chosen policy",
             100.0 * (r->alts[i].step_ms / r->predicted_step_ms - 1.0));
}

int tt_policy_max_batch(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_dtype dt, tt_recompute_mode rm,
                       size_t *arena_out) {
  size_t budget = o->vram_bytes > o->reserve_bytes ? o->vram_bytes - o->reserve_bytes : 0;
  int n = g->nnodes;
  unsigned char *rec = (unsigned char *)calloc((size_t)n, 1);
  if (!rec) return 0;
  tt_policy_opts oo = *o;
  oo.recompute = rm;
  if (!oo.profile) oo.profile = tt_profile_cuda_generic();
  /* arena size grows with the micro-batch: double until it does not fit, then bisect */
  int lo = 0, hi = 1;
  size_t lo_arena = 0;
  tt_err e;
  for (;;) {
    tt_program p;
    int fit = sched_fit(g, be, &oo, budget, hi, 1, dt, rec, &p, NULL, &e);
    if (fit <= 0) break;
    lo = hi, lo_arena = p.arena_bytes;
    tt_program_free(&p);
    if (hi >= (1 << 16)) break;
    hi *= 2;
  }
  if (lo > 0 && hi > lo) {
    int a = lo, b = hi; /* a fits, b does not */
    while (b - a > 1) {
      int mid = a + (b - a) / 2;
      tt_program p;
      int fit = sched_fit(g, be, &oo, budget, mid, 1, dt, rec, &p, NULL, &e);
      if (fit > 0) {
        a = mid, lo_arena = p.arena_bytes;
        tt_program_free(&p);
      } else {
        b = mid;
      }
    }
    lo = a;
  }
  free(rec);
  if (arena_out) *arena_out = lo_arena;
  return lo;
}

void tt_policy_result_free(tt_policy_result *r) {
  tt_program_free(&r->train);
  tt_program_free(&r->eval);
  free(r->recompute);
  r->recompute = NULL;
}
