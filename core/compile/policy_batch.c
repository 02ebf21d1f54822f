/* core/compile/policy_batch.c — the largest micro-batch that fits a budget (tt_policy_max_batch,
 * policy.h; plan --max-batch), over the policy search's fit of one candidate (policy_int.h). */
#include "policy_int.h"

#include <stdlib.h>
#include <string.h>

/* The arena grows with the micro-batch, so fitting is monotone: doubling then bisection, through
 * policy_fit (recompute searched as the mode says), with one plan memo across the batches. */
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
  tt_plan_memo *memo = tt_plan_memo_new(); /* NULL (out of memory): plans without one */
  policy_ctx c = tt_policy_ctx_of(g, be, &oo, budget, hi, 1, dt, NULL, memo, &e);
  c.fit_first = 1;
  for (;;) {
    tt_program p;
    c.mb = hi;
    int fit = tt_policy_fit(&c, rec, &p);
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
      c.mb = mid;
      int fit = tt_policy_fit(&c, rec, &p);
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
  tt_plan_memo_free(memo);
  if (arena_out) *arena_out = lo_arena;
  return lo;
}
