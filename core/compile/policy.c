/* core/compile/policy.c — policy search: the fastest policy per image that fits the budget.
 *
 * A candidate (micro-batch, dtype) is planned plain; when that overshoots the budget, each
 * recompute search (policy_searches[]) is run through one fit loop (policy_fit_loop) that asks
 * it for a recompute set freeing `need` bytes, plans it in its memory forms (policy_try: the
 * smaller arena of a short list of variants) and moves `need` until the real planner says it
 * fits; the fastest fitting plan in the cost model is kept (policy_pick). One plan memo per
 * search (program.h) lets the many candidates that lower to buffers planned before skip the
 * arena planner. One candidate planned in one memory form is policy_form.c's; what `plan` and a
 * refusal say beyond the choice, policy_explain.c's. */
#include "../base/knobs.h"
#include "offload.h"
#include "policy.h"
#include "policy_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* The attention probabilities [N, heads, t, t] are kept for backward (the faster backward) when
 * the plan fits the budget with them; otherwise the fused form, which keeps only the row
 * statistics and rebuilds the probabilities in backward, when it gives the smaller arena: a
 * memory technique like compact saves, tried before recompute is (the recompute search runs on
 * whatever policy_try returns). TINYTRAIN_ATTN=keep|fused forces one. Fills the attention forms
 * to try, in order; returns how many. */
static int policy_fused_forms(const tt_graph *g, int *forms) {
  int has_attn = 0, force = tt_knobs_get()->attn; /* -1, or 0 keep, 1 fused */
  for (int i = 0; i < g->nnodes; i++) has_attn |= g->nodes[i].kind == TT_L_ATTENTION;
  forms[0] = 0;
  if (!has_attn) return 1;
  if (force >= 0) return forms[0] = force ? POLICY_FUSED : 0, 1;
  forms[1] = POLICY_FUSED;
  return 2;
}

/* Compact saves (ReLU 1-bit masks, max-pool uint8 indices) are a memory technique like
 * recompute: used when the full tensors do not fit the budget, and kept only when they give the
 * smaller arena. Always on, they made LeNet's arena 18% smaller but packed 1.09x its lower bound,
 * against the arena's 1.05 (tests/test_cli.sh, cli_plan_json): the many small, long-lived masks
 * fragment the greedy placement. TINYTRAIN_COMPACT=1 uses them always, TINYTRAIN_COMPACT=0
 * never. Fills the compact forms to try, in order; returns how many. */
static int policy_compact_forms(int *forms) {
  int force = tt_knobs_get()->compact; /* -1, or 0 never, 1 always */
  if (force >= 0) return forms[0] = force ? POLICY_COMPACT : 0, 1;
  forms[0] = 0, forms[1] = POLICY_COMPACT;
  return 2;
}

/* One candidate with recompute set rec: its memory forms in order (attention kept before fused,
 * each without compact saves before with), each planned only while the smallest arena so far
 * overshoots the budget (no budget: the first form alone), the smallest kept (as small: the
 * earlier form, the faster one). 0 and p filled, or -1 or TT_ERR_TOO_LARGE (err set). */
static int policy_try_forms(const policy_ctx *c, unsigned char *rec, tt_program *p) {
  int fused[2], compact[2], nf = policy_fused_forms(c->g, fused), nk = policy_compact_forms(compact), have = 0;
  if (tt_policy_has_compress(rec, c->g->nnodes)) compact[0] = POLICY_COMPACT, nk = 1; /* the search chose the forms */
  for (int f = 0; f < nf; f++)
    for (int k = 0; k < nk; k++) {
      tt_program q;
      int rc;
      if (have && (!c->budget || p->arena_bytes <= c->budget)) return 0;
      if ((rc = tt_policy_try_form(c, c->o->inplace, rec, fused[f] | compact[k], have ? &q : p))) {
        if (have) tt_program_free(p);
        return rc;
      }
      if (have) tt_policy_keep_smaller(p, &q);
      have = 1;
    }
  return 0;
}

/* The programs policy_try made for one candidate (policy_fit), by recompute set: the searches
 * reach the same set often (on ViT-B/16 at --vram 1M, 28 of 159 sets), and a copy of the program
 * costs a small part of lowering and planning it in up to eight forms again. Past
 * POLICY_CACHE_CAP bytes held, programs are made but no longer kept. */
#define POLICY_CACHE_CAP ((size_t)256 << 20)

typedef struct policy_cache_entry {
  unsigned char *rec; /* [nnodes] */
  tt_program p;
} policy_cache_entry;

typedef struct policy_cache {
  policy_cache_entry *e;
  int n, cap;
  size_t bytes;
} policy_cache;

static void policy_cache_free(policy_cache *k) {
  for (int i = 0; i < k->n; i++) {
    free(k->e[i].rec);
    tt_program_free(&k->e[i].p);
  }
  free(k->e);
}

/* Keeps a copy of p, planned for recompute set rec, in c's cache (nothing when out of memory
 * or past the cap: the cache only saves work). */
static void policy_cache_put(const policy_ctx *c, const unsigned char *rec, const tt_program *p) {
  policy_cache *k = c->cache;
  size_t n = (size_t)c->g->nnodes;
  size_t bytes = n + sizeof(tt_buf) * (size_t)p->nbufs + sizeof(tt_step) * (size_t)p->nsteps +
                 sizeof(tt_call) * (size_t)p->ncalls + tt_program_table_bytes(c->g);
  tt_err e2;
  if (k->bytes + bytes > POLICY_CACHE_CAP) return;
  if (k->n == k->cap) {
    int nc = k->cap ? 2 * k->cap : 16;
    policy_cache_entry *ne = (policy_cache_entry *)realloc(k->e, sizeof(policy_cache_entry) * (size_t)nc);
    if (!ne) return;
    k->e = ne, k->cap = nc;
  }
  policy_cache_entry *x = &k->e[k->n];
  if (!(x->rec = (unsigned char *)malloc(n ? n : 1))) return;
  if (tt_program_copy(&x->p, p, &e2)) {
    free(x->rec);
    return;
  }
  memcpy(x->rec, rec, n);
  k->n++, k->bytes += bytes;
}

/* One candidate with recompute set rec, planned in its memory forms (policy_try_forms), or the
 * copy of the program made for the same set before (the same program: lowering and planning
 * are deterministic); 0 and p filled, or -1 or TT_ERR_TOO_LARGE (err set). */
static int policy_try(const policy_ctx *c, unsigned char *rec, tt_program *p) {
  size_t n = (size_t)c->g->nnodes;
  int rc;
  if (!c->cache) return policy_try_forms(c, rec, p);
  for (int i = 0; i < c->cache->n; i++)
    if (!memcmp(c->cache->e[i].rec, rec, n)) {
      if ((rc = tt_program_copy(p, &c->cache->e[i].p, c->err))) return rc;
      p->policy.recompute = rec; /* where a fresh lowering points it */
      return 0;
    }
  if ((rc = policy_try_forms(c, rec, p))) return rc;
  policy_cache_put(c, rec, p);
  return 0;
}

/* The nodes a recompute set drops (an alternative's "recomputed layers"; not those it compresses). */
static int policy_count(const unsigned char *rec, int n) {
  int c = 0;
  for (int i = 0; i < n; i++) c += rec[i] == TT_DEC_RECOMPUTE;
  return c;
}

/* Which recompute search runs: the options', or TINYTRAIN_RECOMPUTE_SEARCH=segments|ops
 * (to compare the searches, e.g. tests/bench/memory_tradeoff), or both. */
static tt_recompute_search_kind policy_rsearch_kind(const tt_policy_opts *o) {
  int k = tt_knobs_get()->recompute_search; /* 0 best, 1 segments, 2 ops */
  if (o->recompute_search != TT_RSEARCH_BEST) return o->recompute_search;
  return k == 1 ? TT_RSEARCH_SEGMENTS : k == 2 ? TT_RSEARCH_OPS : TT_RSEARCH_BEST;
}

/* Keeps candidate (p2, rec2) in (out, rec) when it is faster in the cost model (as fast: the
 * smaller arena) or there is none yet (*have 0); frees the loser. */
static void policy_pick(const policy_ctx *c, int *have, tt_program *out, unsigned char *rec, tt_program *p2,
                        const unsigned char *rec2) {
  int take = !*have;
  if (!take) {
    double a = tt_predict_ms(out, c->o->profile), b = tt_predict_ms(p2, c->o->profile);
    take = fabs(a - b) <= 1e-9 * a ? p2->arena_bytes < out->arena_bytes : b < a;
  }
  if (take) {
    if (*have) tt_program_free(out);
    *out = *p2;
    memcpy(rec, rec2, (size_t)c->g->nnodes);
    out->policy.recompute = rec;
    *have = 1;
  } else {
    tt_program_free(p2);
  }
}

/* ---- the fit loop and the recompute searches it runs ---- */

/* The fit loop asks a search to free `need` bytes, plans, and asks for 1.25x the remaining
 * overshoot more until the real planner says it fits. That last step can overshoot far (a
 * larger budget then got a slower plan than a smaller one: ResNet-50 at --vram 800M planned
 * 150 s where 790M planned 144 s), so once a need fits and a smaller one did not, the need is
 * bisected between them (POLICY_REFINE times at most, where the search refines) and the
 * fastest fitting plan kept (policy_pick). */
#define POLICY_REFINE 3

/* Where one fit loop stands: the need asked next; the largest that did not fit (lo) and the
 * smallest that did (hi), -1 while none (the local search starts lo at 0); bisections made;
 * the overshoot step's state (policy_step); whether a plan fits (have); and what a search's
 * start computed: the local search's most bytes it can free (all), the hybrid's one-hop drops
 * (pre, freed by the loop). */
typedef struct policy_fit_state {
  double need, lo, hi, all, mult;
  int refined, have;
  size_t prev;
  unsigned char *pre;
} policy_fit_state;

/* A recompute search as the fit loop runs it: at most `iters` plans, `refine` bisections after
 * the first fit (the overshoot rule); start (may be NULL) sets the state from the plain plan's
 * overshoot (scratch: n bytes), 0 or -1 on error; make fills rec for plan number iter at
 * s->need and returns >= 0, -1 when rec drops the most the search can, < -1 on error (err
 * set); next moves s->need after a plan (fits: whether it did; k: make's answer; step: the
 * overshoot step, 0 when it fit) and says whether to plan again. */
typedef struct policy_rsearch {
  int iters, refine;
  int (*start)(const policy_ctx *c, policy_fit_state *s, double over, unsigned char *scratch);
  int (*make)(const policy_ctx *c, policy_fit_state *s, int iter, unsigned char *rec);
  int (*next)(const struct policy_rsearch *r, policy_fit_state *s, int fits, int k, double step);
} policy_rsearch;

/* The bytes to ask for beyond the last need when its plan overshot the budget: 1.25x the
 * overshoot, doubled each time the arena did not shrink since the last overshoot (*prev: that
 * arena, 0 at first), since a small overshoot can take several steps to free one more value
 * (ResNet-50 at --vram 800M overshot by 0.4 MiB ten times with the same plan, then gave up). */
static double policy_step(size_t arena, size_t budget, size_t *prev, double *mult) {
  if (*prev && arena >= *prev) *mult *= 2.0;
  *prev = arena;
  return (double)(arena - budget) * 1.25 * *mult + 1.0;
}

/* The overshoot rule: while nothing fits, add the step (stopping once the search drops all it
 * can and that does not fit); once a need fits and a smaller one did not, bisect between them
 * until they are within 2% or r->refine bisections are made. */
static int policy_next_overshoot(const policy_rsearch *r, policy_fit_state *s, int fits, int k, double step) {
  if (!fits && k < 0 && s->hi < 0.0) return 0;
  if (fits) s->hi = s->need;
  else s->lo = s->need;
  if (s->hi < 0.0) {
    s->need += step;
    return 1;
  }
  if (s->lo < 0.0 || s->refined >= r->refine || s->hi - s->lo < 0.02 * s->hi + 1.0) return 0;
  s->refined++;
  s->need = 0.5 * (s->lo + s->hi);
  return 1;
}

/* The local search's rule: a plan freeing less than all that fits is the one (its cheapest
 * drops first already); when only all of them fit, the need is bisected between the last that
 * did not and all, for the cheapest that fits, to within 1% of all. */
static int policy_next_local(const policy_rsearch *r, policy_fit_state *s, int fits, int k, double step) {
  (void)r;
  if (fits) {
    if (k >= 0 || s->need - s->lo < 0.01 * s->all) return 0;
    s->need = 0.5 * (s->lo + (s->need < s->all ? s->need : s->all)); /* all fit: does less? */
    return 1;
  }
  if (k < 0) return 0; /* all of them do not fit */
  s->lo = s->need;
  s->need = s->have ? 0.5 * (s->lo + s->all) : s->need + step;
  return !(s->have && s->need - s->lo < 0.01 * s->all);
}

/* Plans the segment search makes before its last resort, the plan that frees the most. */
#define POLICY_SEGMENT_TRIES 8

/* Segments of units (tt_recompute_search): the first plan that fits is kept, the model's
 * cheapest for its need; when none does, the plan that frees the most (tt_recompute_all). */
static int policy_make_segments(const policy_ctx *c, policy_fit_state *s, int iter, unsigned char *rec) {
  int units = -1;
  if (iter < POLICY_SEGMENT_TRIES && (units = tt_recompute_search(c->g, c->mb, c->dt, c->o->profile, s->need, rec, c->err)) < -1)
    return -2;
  if (units == -1 && tt_recompute_all(c->g, rec, c->err)) return -2;
  return units;
}

/* Single ops (tt_recompute_search_ops), cheapest recompute time per byte first. */
static int policy_make_ops(const policy_ctx *c, policy_fit_state *s, int iter, unsigned char *rec) {
  (void)iter;
  return tt_recompute_search_ops(c->g, c->mb, c->dt, c->o->profile, s->need, rec, c->err);
}

/* The local per-op plan (tt_recompute_add_cheap, local: cheapest first, recompute cascading only
 * inside a unit); start measures what dropping all of them frees. */
static int policy_start_local(const policy_ctx *c, policy_fit_state *s, double over, unsigned char *scratch) {
  (void)over;
  s->lo = 0.0;
  memset(scratch, 0, (size_t)c->g->nnodes);
  return tt_recompute_add_cheap(c->g, c->mb, c->dt, c->o->profile, -1.0, 1, scratch, &s->all, c->err) < -1 ? -1 : 0;
}

/* Drops the cheapest values (cascading inside their units) until `need` is freed, from empty. */
static int policy_make_local(const policy_ctx *c, policy_fit_state *s, int iter, unsigned char *rec) {
  (void)iter;
  memset(rec, 0, (size_t)c->g->nnodes);
  return tt_recompute_add_cheap(c->g, c->mb, c->dt, c->o->profile, s->need, 1, rec, NULL, c->err);
}

/* Segments and per-op recompute in one plan: every memory-bound value (batch norm, ReLU, add,
 * pooling) backward can recompute in one hop from values it keeps, beside the segments the
 * segment search picks for what they do not free (the one-hop drops re-chosen around those
 * segments, whose insides are dropped anyway). Outside the segments, in a conv -> BN -> ReLU
 * chain only the convolution's output stays. start finds the one-hop drops (s->pre) and asks
 * the segments for the overshoot they leave. */
static int policy_start_hybrid(const policy_ctx *c, policy_fit_state *s, double over, unsigned char *scratch) {
  double cheap = 0.0;
  (void)scratch;
  s->pre = (unsigned char *)tt_calloc((size_t)c->g->nnodes, 1, "recompute set", c->err);
  if (!s->pre || tt_recompute_add_cheap(c->g, c->mb, c->dt, c->o->profile, -1.0, 0, s->pre, &cheap, c->err) < -1) return -1;
  s->need = over - cheap > 1.0 ? over - cheap : 1.0;
  return 0;
}

/* Segments for what the one-hop drops leave, then the one-hop drops re-chosen around them. */
static int policy_make_hybrid(const policy_ctx *c, policy_fit_state *s, int iter, unsigned char *rec) {
  int units = tt_recompute_search_pre(c->g, c->mb, c->dt, c->o->profile, s->need, s->pre, rec, c->err);
  (void)iter;
  if (units < -1 || (units == -1 && tt_recompute_all(c->g, rec, c->err)) ||
      tt_recompute_add_cheap(c->g, c->mb, c->dt, c->o->profile, -1.0, 0, rec, NULL, c->err) < -1)
    return -2;
  return units;
}

/* The smaller forms c's backend and recipe allow a saved value (lower.c uses the same tests:
 * lower_compact_plan, lower_pool_compactable, lower_conv_compressible; in fp16 lower_pool_compactable
 * also leaves whole the input of a pooling that reads NHWC and writes NCHW, which these forms do
 * not see: the search's estimate of such a plan is low by that input's bytes less its uint8 index,
 * and the lowered plan's own arena is what is checked against the budget). */
static tt_save_forms policy_save_forms(const policy_ctx *c) {
  tt_save_forms f;
  f.mask = c->be->act_mask && c->be->act_bwd_mask;
  f.pool_idx = c->be->pool_argmax && c->be->pool_bwd_idx;
  f.lossy = c->be->save_compress && c->be->save_restore ? c->g->model->train.compress_saved : 0;
  if (tt_knobs_get()->compact == 0) f.mask = f.pool_idx = f.lossy = 0; /* TINYTRAIN_COMPACT=0: never */
  f.bias = 0.0;
  /* offload (CUDA): a copy stream that copies out without stopping compute, a link, a host budget */
  int copies = (c->be->download_after && c->be->event_wait && c->be->upload_after && c->be->event_record) ||
               (c->be->plan_caps & TT_CAP_ACT_OFFLOAD); /* plan --gpu: the card's entries */
  f.link = c->o->host_bytes && !c->be->host_memory && copies ? tt_offload_link_bytes_per_s(c->o->profile) : 0.0;
  f.host_left = (double)c->o->host_bytes;
  return f;
}

/* The second order's factor on the forms' price: compressing a residual block's output blocks
 * rebuilding the next block's add and ReLU from it (a recompute reads its sources whole), which
 * frees about four times the bytes; with the forms priced 3x those drops come first
 * (design.md, "The per-tensor search"; ResNet-50 with int8 copies). */
#define POLICY_FORMS_LATE 3.0
/* The per-tensor search (tt_recompute_search_tensors): each saved value kept, recomputed or
 * compressed, cheapest seconds per byte first, for the need the overshoot rule asks (its
 * bisection after the first fit finds a cheaper plan that still fits: ResNet-50 at micro-batch
 * 16 with compress_saved = bf16, --vram 800M, predicted 130.7 s against 132.9 s without it). */
static int policy_make_tensor(const policy_ctx *c, policy_fit_state *s, int iter, unsigned char *rec) {
  tt_save_forms f = policy_save_forms(c);
  (void)iter;
  return tt_recompute_search_tensors(c->g, c->mb, c->dt, c->o->profile, &f, s->need, rec, NULL, c->err);
}

/* The same in the second order (POLICY_FORMS_LATE); the fit loop keeps the faster plan of the two. */
static int policy_make_tensor_late(const policy_ctx *c, policy_fit_state *s, int iter, unsigned char *rec) {
  tt_save_forms f = policy_save_forms(c);
  (void)iter;
  f.bias = POLICY_FORMS_LATE;
  return tt_recompute_search_tensors(c->g, c->mb, c->dt, c->o->profile, &f, s->need, rec, NULL, c->err);
}

/* The searches, in the order policy_fit runs them (which run: policy_rsearch_kind). The
 * per-tensor search holds the per-op local one as its special case without forms; the others
 * stay beside it (segments, and segments with one-hop drops, reach plans its greedy order
 * does not), and the fastest plan that fits wins. */
enum { POLICY_RS_SEGMENTS, POLICY_RS_OPS, POLICY_RS_LOCAL, POLICY_RS_HYBRID, POLICY_RS_TENSOR, POLICY_RS_TENSOR_LATE,
       POLICY_RS_COUNT };
static const policy_rsearch policy_searches[POLICY_RS_COUNT] = {
    {POLICY_SEGMENT_TRIES + 1, 0, NULL, policy_make_segments, policy_next_overshoot},
    {10 + POLICY_REFINE, POLICY_REFINE, NULL, policy_make_ops, policy_next_overshoot},
    {10, 0, policy_start_local, policy_make_local, policy_next_local},
    {8 + POLICY_REFINE, POLICY_REFINE, policy_start_hybrid, policy_make_hybrid, policy_next_overshoot},
    {10 + POLICY_REFINE, POLICY_REFINE, NULL, policy_make_tensor, policy_next_overshoot},
    {10 + POLICY_REFINE, POLICY_REFINE, NULL, policy_make_tensor_late, policy_next_overshoot},
};

/* Notes a plan for the refusal's "smallest plan" (c->min may be NULL). */
static void policy_note_arena(const policy_ctx *c, const tt_program *q) {
  if (!c->min || q->arena_bytes >= c->min->arena) return;
  c->min->arena = q->arena_bytes, c->min->mb = q->policy.micro_batch, c->min->dt = q->policy.act_dtype;
  c->min->recomputes = q->n_recomputed_steps > 0;
}

/* Runs search r from the plain plan's overshoot `over` (bytes): asks it for a recompute set,
 * plans it (policy_try), and moves the need by r's rule until it stops; the fastest fitting
 * plan is kept (policy_pick). 1 fits (out, rec), 0 not, -1 or TT_ERR_TOO_LARGE on error. */
static int policy_fit_loop(const policy_ctx *c, const policy_rsearch *r, double over, unsigned char *rec, tt_program *out) {
  policy_fit_state s;
  int rc = 0;
  memset(&s, 0, sizeof s);
  s.need = over, s.lo = s.hi = -1.0, s.mult = 1.0;
  unsigned char *r2 = (unsigned char *)tt_malloc((size_t)c->g->nnodes, "recompute set", c->err);
  if (!r2 || (r->start && r->start(c, &s, over, r2))) rc = -1;
  for (int iter = 0; !rc && iter < r->iters; iter++) {
    tt_program q;
    int k = r->make(c, &s, iter, r2);
    if (k < -1) {
      rc = -1;
      break;
    }
    if ((rc = policy_try(c, r2, &q))) break;
    policy_note_arena(c, &q);
    int fits = q.arena_bytes <= c->budget;
    double step = fits ? 0.0 : policy_step(q.arena_bytes, c->budget, &s.prev, &s.mult);
    if (fits) policy_pick(c, &s.have, out, rec, &q, r2);
    else tt_program_free(&q);
    if (!r->next(r, &s, fits, k, step)) break;
  }
  free(r2);
  free(s.pre);
  if (rc && s.have) tt_program_free(out);
  return rc ? rc : s.have;
}

static int policy_fit_cached(const policy_ctx *c, unsigned char *rec, tt_program *out);

/* policy_fit_cached with a program cache for the candidate (policy_try), freed after. */
int tt_policy_fit(const policy_ctx *cin, unsigned char *rec, tt_program *out) {
  policy_cache cache;
  policy_ctx c = *cin;
  memset(&cache, 0, sizeof cache);
  c.cache = &cache;
  int rc = policy_fit_cached(&c, rec, out);
  policy_cache_free(&cache);
  return rc;
}

/* Best fitting program for c's candidate: plain (every unit recomputed under --recompute all),
 * or, under auto when that overshoots the budget, the fastest in the cost model (as fast: the
 * smaller arena) of the recompute searches' fitting plans. rec receives the recompute set.
 * 1 fits, 0 not, -1 or TT_ERR_TOO_LARGE on error. */
static int policy_fit_cached(const policy_ctx *c, unsigned char *rec, tt_program *out) {
  int n = c->g->nnodes, rc, have = 0;
  memset(rec, 0, (size_t)n);
  if (c->o->recompute == TT_RECOMP_ALL && tt_recompute_all(c->g, rec, c->err)) return -1;
  if ((rc = policy_try(c, rec, out))) return rc;
  policy_note_arena(c, out);
  if (!c->budget || out->arena_bytes <= c->budget) return 1;
  double over = (double)(out->arena_bytes - c->budget);
  int staged = out->input_u8 >= 0 && out->bufs[out->input_u8].persistent;
  tt_program_free(out);
  /* Budget-bound: the staged batch's persistence (its copy overlapping the step) is given back
   * before anything is recomputed; the candidate is fitted again with the batch transient, with
   * its own program cache (the cached plans hold the persistent batch). */
  if (staged && !c->batch_transient) {
    policy_cache k2;
    policy_ctx c2 = *c;
    memset(&k2, 0, sizeof k2);
    c2.cache = &k2, c2.batch_transient = 1;
    rc = policy_fit_cached(&c2, rec, out);
    policy_cache_free(&k2);
    return rc;
  }
  if (c->o->recompute != TT_RECOMP_AUTO) return 0;
  /* Free the overshoot by recomputing; the model is approximate, so each search checks its
   * plans with the real planner. */
  tt_recompute_search_kind kind = policy_rsearch_kind(c->o);
  unsigned char *rec2 = (unsigned char *)tt_malloc((size_t)n, "recompute set", c->err);
  if (!rec2) return -1;
  tt_save_forms f = policy_save_forms(c);
  int no_forms = !f.mask && !f.pool_idx && !f.lossy; /* then the per-tensor search is the local one */
  for (int i = 0; i < POLICY_RS_COUNT; i++) {
    tt_program p2;
    if ((i == POLICY_RS_SEGMENTS && kind == TT_RSEARCH_OPS) || (i != POLICY_RS_SEGMENTS && kind == TT_RSEARCH_SEGMENTS) ||
        (i == POLICY_RS_HYBRID && kind == TT_RSEARCH_OPS) || /* the hybrid has segments */
        (i >= POLICY_RS_TENSOR && (kind == TT_RSEARCH_NO_TENSORS || no_forms)))
      continue;
    int rc2 = policy_fit_loop(c, &policy_searches[i], over, rec2, &p2);
    if (rc2 < 0) {
      free(rec2);
      if (have) tt_program_free(out);
      return rc2;
    }
    if (rc2 == 1) policy_pick(c, &have, out, rec, &p2, rec2);
  }
  free(rec2);
  return have;
}

/* Records a candidate that fits but lost; tt_policy_explain says why, against the final choice. */
static void policy_add_alt(tt_policy_result *r, int mb, tt_dtype dt, int ru, size_t arena, double ms) {
  if (r->nalts >= TT_POLICY_MAX_ALTS) return;
  tt_policy_alt *a = &r->alts[r->nalts++];
  a->micro_batch = mb, a->dtype = dt, a->recompute_units = ru, a->arena_bytes = arena, a->step_ms = ms;
}

/* The evaluation program: at the given batch, or the largest (doubling from the training
 * micro-batch, to 1024) whose transient region fits inside the training program's, so that
 * evaluation never grows the arena; 0, or -1 with err set when a plan fails (a larger batch too
 * large to plan keeps the one before). */
static int policy_eval(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r, tt_err *err) {
  int eb = o->eval_batch > 0 ? o->eval_batch : r->policy.micro_batch;
  int fixed = o->eval_batch > 0;
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.act_dtype = r->policy.act_dtype, pol.inplace = o->inplace, pol.training = 0, pol.accum_steps = 1;
  pol.offload = r->policy.offload == 2 ? 2 : 0; /* offload 2: it reads the training program's persistent copies */
  pol.no_blocked = r->policy.no_blocked;        /* the training program's layouts (its arena was planned so) */
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
static int policy_budget(const tt_graph *g, const tt_policy_opts *o, tt_policy_result *r, tt_err *err) {
  const tt_model *m = g->model;
  int eff = m->train.batch;
  if (eff <= 0) return tt_fail(err, "%s: [train] batch must be a positive integer", m->path);
  r->reserve_bytes = o->vram_bytes ? o->reserve_bytes : 0;
  /* --vram at or below the reserve: a budget of 1 byte, in which nothing fits, so that the
   * refusal still names the smallest --vram that fits (tt_policy_refuse, policy_explain.c) */
  r->budget_bytes = !o->vram_bytes ? 0 : o->vram_bytes > o->reserve_bytes ? o->vram_bytes - o->reserve_bytes : 1;
  if (o->micro_batch > 0 && eff % o->micro_batch)
    return tt_fail(err, "micro-batch %d does not divide the effective batch %d of %s; choose a divisor", o->micro_batch, eff,
                   m->path);
  return 0;
}

/* Makes the fitting program p (per-tensor decisions rec, TT_DEC_*; predicted ms and rms) the
 * schedule: its recompute and compress arrays the result's own. */
static void policy_keep(tt_policy_result *r, const tt_program *p, const unsigned char *rec, int n, double ms, double rms) {
  int any = 0, anyo = 0;
  r->train = *p;
  r->policy = p->policy;
  for (int i = 0; i < n; i++) { /* compress holds 2n: the compact selection, then the offload one */
    r->recompute[i] = rec[i] == TT_DEC_RECOMPUTE, r->compress[i] = rec[i] == TT_DEC_COMPRESS;
    r->compress[n + i] = rec[i] == TT_DEC_OFFLOAD;
    any |= r->compress[i], anyo |= r->compress[n + i];
  }
  r->policy.recompute = r->recompute;
  r->policy.compact_sel = any ? r->compress : NULL;
  r->policy.offload_sel = anyo ? r->compress + n : NULL;
  r->train.policy.recompute = r->recompute;
  r->train.policy.compact_sel = r->policy.compact_sel;
  r->train.policy.offload_sel = r->policy.offload_sel;
  r->predicted_step_ms = ms;
  r->recompute_ms = rms;
}

/* The search: each precision allowed, micro-batches from the effective batch down. Returns 1 with
 * the fastest fitting candidate kept in r and the others fitting listed as alternatives, 0 when
 * nothing fits, -1 on error. *min receives the smallest plan any candidate made. */
static int policy_search(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r,
                         unsigned char *rec, policy_min *min, tt_plan_memo *memo, tt_err *err) {
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
      policy_ctx c = tt_policy_ctx_of(g, be, o, r->budget_bytes, mb, eff / mb, dts[d], min, memo, err);
      c.fit_first = 1;
      int fit = tt_policy_fit(&c, rec, &p);
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
      int ru = policy_count(rec, n);
      /* faster wins; as fast (to rounding), the smaller arena */
      int as_fast = fabs(ms - best_ms_per_img) <= 1e-9 * ms;
      if (as_fast ? have && p.arena_bytes < r->train.arena_bytes : ms < best_ms_per_img) {
        if (have) {
          policy_add_alt(r, r->policy.micro_batch, r->policy.act_dtype, policy_count(r->recompute, n), r->train.arena_bytes,
                        r->predicted_step_ms);
          tt_program_free(&r->train);
        }
        policy_keep(r, &p, rec, n, ms, rms);
        best_ms_per_img = ms;
        have = 1;
      } else {
        policy_add_alt(r, mb, dts[d], ru, p.arena_bytes, ms);
        tt_program_free(&p);
      }
      /* a smaller micro-batch without recompute or offloaded activations is never faster in
       * the model; one with them might be, so keep going only while this one needed either */
      if (ru == 0 && !tt_policy_has_offload(rec, n)) break;
    }
  }
  return !have && failed && min->arena == (size_t)-1 ? -1 : have;
}

/* Units of the graph and how many of them the chosen plan recomputes (the run's summary). */
static void policy_count_units(const tt_graph *g, tt_policy_result *r) {
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

/* q empty, with r's budgets and its own zeroed schedule arrays for a graph of n nodes (recompute
 * per node; compress per node twice: compact, then offload). 0, or -1 with err set (q then holds
 * what was allocated, for tt_policy_result_free). */
static int policy_result_like(tt_policy_result *q, const tt_policy_result *r, int n, tt_err *err) {
  memset(q, 0, sizeof *q);
  q->budget_bytes = r->budget_bytes, q->reserve_bytes = r->reserve_bytes;
  q->recompute = (unsigned char *)tt_calloc((size_t)n, 1, "schedule", err);
  q->compress = (unsigned char *)tt_calloc((size_t)n * 2, 1, "schedule", err);
  return q->recompute && q->compress ? 0 : -1;
}

/* Planned host offload (offload.h): the search again with the optimizer state in pinned host memory
 * (under [train] optimizer_state = auto, fp32 state first, then bf16, int8, until a plan fits the
 * budget and its host region fits o->host_bytes), and where none does with the 16-bit plans' fp32
 * masters there too (offload 2); it replaces r's schedule when it is faster per
 * effective batch, the copies over the link included (cost.c), or when r has none (*have 0). Nothing
 * when offload is off (host_bytes 0), the backend computes in host memory, the profile has no link or
 * the optimizer keeps no state. 0, or -1 with err set. */
static int policy_offload(const tt_graph *g, tt_backend *be, tt_policy_opts *o, tt_policy_result *r, int *have,
                          policy_min *min, tt_plan_memo *memo, tt_err *err) {
  const tt_train_cfg *tc = &g->model->train;
  if (!o->host_bytes || be->host_memory || tt_offload_link_bytes_per_s(o->profile) <= 0.0 ||
      (tc->optimizer == TT_OPT_SGD && tc->momentum == 0.0f))
    return 0;
  tt_policy_result q;
  unsigned char *rec = (unsigned char *)tt_calloc((size_t)g->nnodes, 1, "schedule", err);
  int got = policy_result_like(&q, r, g->nnodes, err), ostate_auto = tc->optimizer_state == TT_OSTATE_AUTO,
      keep_ostate = o->ostate;
  if (!rec) got = -1;
  /* level 1 (the state), then level 2 (the fp32 masters of 16-bit plans too) only where level 1
   * found nothing that fits both budgets: the masters' copies cost 8 bytes per weight more over the
   * link each update (cost.c); one process only */
  for (int lvl = 1; lvl <= (tc->ranks > 1 ? 1 : 2) && got == 0; lvl++) { /* several processes: dist.c broadcasts device masters */
    o->offload = lvl;
    for (int st = TT_STATE_F32; got == 0 && st <= (ostate_auto ? TT_STATE_INT8 : TT_STATE_F32); st++) {
      o->ostate = st;
      if ((got = policy_search(g, be, o, &q, rec, min, memo, err)) == 1 &&
          (q.train.host_bytes > o->host_bytes || (lvl == 2 && !q.train.n_masters_offloaded))) {
        tt_program_free(&q.train); /* over the host budget (smaller state, or no offload); level 2 that holds no master */
        q.nalts = 0, got = 0;
      }
    }
  }
  o->offload = 0, o->ostate = keep_ostate;
  r->candidates_tried += q.candidates_tried;
  free(rec);
  if (got == 1 && (!*have || q.predicted_step_ms < r->predicted_step_ms)) {
    q.candidates_tried = r->candidates_tried;
    tt_policy_result_free(r);
    *r = q, *have = 1;
    return 0;
  }
  tt_policy_result_free(&q);
  return got < 0 ? -1 : 0;
}

/* The search over the optimizer state's formats ([train] optimizer_state = auto: fp32 state where
 * anything fits, else bf16, else int8; the smaller state frees its bytes for activations,
 * tt_program_state_fmt keeps small tensors fp32), then planned host offload (policy_offload),
 * into r: 1 a plan, 0 none fits, -1 with err set. */
static int policy_search_states(const tt_graph *g, tt_backend *be, tt_policy_opts *o, tt_policy_result *r, unsigned char *rec,
                                policy_min *min, tt_plan_memo *memo, tt_err *err) {
  int have = 0, ostate_auto = g->model->train.optimizer_state == TT_OSTATE_AUTO;
  for (int st = TT_STATE_F32; st <= (ostate_auto ? TT_STATE_INT8 : TT_STATE_F32) && !have; st++)
    if (o->ostate = st, (have = policy_search(g, be, o, r, rec, min, memo, err)) < 0) break;
  if (have >= 0 && policy_offload(g, be, o, r, &have, min, memo, err)) have = -1;
  return have;
}

/* One plan memo for the whole search: candidates at different micro-batches never share a plan,
 * but the searches and forms of one candidate often do. */
int tt_policy_search(const tt_graph *g, tt_backend *be, const tt_policy_opts *oin, tt_policy_result *r, tt_err *err) {
  memset(r, 0, sizeof *r);
  tt_policy_opts o = *oin;
  if (!o.profile) o.profile = tt_profile_cuda_generic();
  int n = g->nnodes;
  if (policy_budget(g, &o, r, err)) return -1;
  unsigned char *rec = (unsigned char *)tt_calloc((size_t)n, 1, "schedule", err);
  r->recompute = (unsigned char *)tt_calloc((size_t)n, 1, "schedule", err);
  r->compress = (unsigned char *)tt_calloc((size_t)n * 2, 1, "schedule", err); /* compact, then offload */
  if (!rec || !r->recompute || !r->compress) {
    free(rec);
    tt_policy_result_free(r);
    return -1;
  }
  policy_min min = {(size_t)-1, 0, 0, TT_F32};
  tt_plan_memo *memo = tt_plan_memo_new(); /* NULL (out of memory): plans without one */
  int have = policy_search_states(g, be, &o, r, rec, &min, memo, err);
  /* nChw16c groups plan a larger workspace (Winograd's: about 80 MiB more for ResNet-50 at
   * micro-batch 16), so under a budget their plan may need more recompute, or nothing fits: the
   * whole search again without them (NHWC), and the faster prediction wins, the blocked plan on a
   * tie (the cost model does not see Winograd's speed). So a larger budget never predicts slower,
   * and the refusal's smallest budget counts the NHWC plans too. */
  if (have >= 0 && (be->layouts & (1u << TT_LAYOUT_NCHW16C)) && be->bn_blk &&
      (have == 0 || (r->budget_bytes && r->train.n_blocked > 0))) {
    tt_policy_result q;
    int got = policy_result_like(&q, r, n, err);
    if (got == 0) {
      o.no_blocked = 1;
      got = policy_search_states(g, be, &o, &q, rec, &min, memo, err);
      o.no_blocked = 0;
    }
    if (got < 0) {
      have = -1;
      tt_policy_result_free(&q);
    } else if (got == 1 && (!have || q.predicted_step_ms < r->predicted_step_ms * (1.0 - 1e-9))) {
      q.candidates_tried += r->candidates_tried;
      tt_policy_result_free(r);
      *r = q, have = 1;
    } else {
      r->candidates_tried += q.candidates_tried;
      tt_policy_result_free(&q);
    }
  }
  tt_plan_memo_free(memo);
  free(rec);
  if (have < 0) {
    tt_policy_result_free(r);
    return -1;
  }
  if (!have) return tt_policy_refuse(g, be, &o, r, &min, err);
  policy_count_units(g, r);
  /* the candidates were ranked on their buffers' plans alone: the chosen one gets its final call
   * list here (policy_eval's evaluation program gets its own from tt_program_plan) */
  if (tt_program_calls(&r->train, err) || policy_eval(g, be, &o, r, err)) {
    tt_policy_result_free(r);
    return -1;
  }
  return 0;
}

/* ---- the convolution workspace cap from the budget (policy.h) ---- */

/* The largest workspace buffer of a program (its TT_BC_WORKSPACE buffers), bytes. */
static size_t policy_max_ws(const tt_program *p) {
  size_t m = 0;
  for (int i = 0; i < p->nbufs; i++)
    if (p->bufs[i].cls == TT_BC_WORKSPACE && p->bufs[i].bytes > m) m = p->bufs[i].bytes;
  return m;
}

/* Lowers and plans p's policy again (its recompute set included) into q. */
static int policy_relower(const tt_graph *g, tt_backend *be, const tt_program *p, tt_program *q, tt_err *err) {
  tt_policy pol = p->policy;
  int rc;
  if ((rc = tt_lower(g, &pol, be, q, err))) return rc;
  if ((rc = tt_program_plan(q, err))) tt_program_free(q);
  return rc;
}

/* The arena train and eval share: the persistent region and the larger transient one. */
static size_t policy_arena(const tt_program *t, const tt_program *e) {
  return t->persistent_bytes + (t->transient_bytes > e->transient_bytes ? t->transient_bytes : e->transient_bytes);
}

/* Widest first (all the slack, then half, a quarter): the first cap whose programs fit wins. */
int tt_policy_widen_workspace(const tt_graph *g, tt_backend *be, tt_policy_result *r, size_t budget,
                              size_t (*set_cap)(tt_backend *, size_t), size_t *cap, size_t *dflt, size_t *ws_max,
                              tt_err *err) {
  size_t d = set_cap(be, 0), arena = policy_arena(&r->train, &r->eval);
  *dflt = *cap = d;
  *ws_max = policy_max_ws(&r->train);
  /* under 1 MiB of slack changes no choice worth a second planning */
  if (!budget || arena >= budget || budget - arena <= ((size_t)1 << 20)) return 0;
  size_t slack = budget - arena;
  for (int k = 0; k < 3; k++) {
    size_t c = d + (slack >> k);
    tt_program nt, ne;
    int rc;
    set_cap(be, c);
    if ((rc = policy_relower(g, be, &r->train, &nt, err))) {
      if (rc == TT_ERR_TOO_LARGE) continue; /* sizes past 2^64 bytes: a smaller cap */
      set_cap(be, 0);
      return -1;
    }
    if ((rc = policy_relower(g, be, &r->eval, &ne, err))) {
      tt_program_free(&nt);
      if (rc == TT_ERR_TOO_LARGE) continue;
      set_cap(be, 0);
      return -1;
    }
    if (policy_arena(&nt, &ne) <= budget) {
      tt_program_free(&r->train);
      tt_program_free(&r->eval);
      r->train = nt, r->eval = ne;
      *cap = c;
      *ws_max = policy_max_ws(&r->train);
      return 0;
    }
    tt_program_free(&nt);
    tt_program_free(&ne);
  }
  set_cap(be, 0); /* the default, with which the kept programs were planned */
  return 0;
}
