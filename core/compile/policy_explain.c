/* core/compile/policy_explain.c — what `tinytrain plan` and a refusal say beyond the choice
 * itself: the refusal's smallest --vram and what dominates it, the arenas the techniques save,
 * and why each losing candidate lost. Planned apart from the search (policy.c), and only when
 * asked, so that train and the API pay for the choice alone. */
#include "policy.h"
#include "policy_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- report-only: what `tinytrain plan` and a refusal say, planned only when asked ---- */

/* The three largest buffer classes live at the peak of the smallest plan the options allow at
 * micro-batch mb in dtype dt: every unit recomputed unless recompute is off. */
static void policy_dominant(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, int mb, tt_dtype dt, char *dom,
                            size_t size) {
  int eff = g->model->train.batch;
  unsigned char *rr = (unsigned char *)calloc((size_t)g->nnodes, 1);
  tt_program q;
  tt_err e2;
  dom[0] = 0;
  if (!rr || (o->recompute != TT_RECOMP_NONE && tt_recompute_all(g, rr, &e2))) {
    free(rr);
    return;
  }
  policy_ctx c = tt_policy_ctx_of(g, be, o, 0, mb, eff / mb, dt, NULL, NULL, &e2);
  if (!tt_policy_try_form(&c, o->inplace, rr, POLICY_COMPACT | POLICY_FUSED, &q)) { /* the smallest plan: compact saves and fused attention */
    size_t at[TT_BC_COUNT];
    char sz[32];
    tt_program_peak_breakdown(&q, at);
    for (int k = 0; k < 3; k++) {
      int bi = -1;
      for (int c = 0; c < TT_BC_COUNT; c++)
        if (at[c] && (bi < 0 || at[c] > at[bi])) bi = c;
      if (bi < 0) break;
      snprintf(dom + strlen(dom), size - strlen(dom), "%s%s %s", k ? ", " : "", tt_buf_class_name((tt_buf_class)bi),
               tt_size_text(sz, sizeof sz, at[bi], 0));
      at[bi] = 0;
    }
    tt_program_free(&q);
  }
  free(rr);
}

/* The arena at the chosen micro-batch with the techniques switched off: fp32 without in-place
 * or recompute; the chosen precision without in-place; without recompute. */
static void policy_savings(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r) {
  const tt_policy *pol = &r->policy;
  tt_program q;
  tt_err e2;
  int n = g->nnodes;
  unsigned char *none = (unsigned char *)calloc((size_t)n * 2, 1), *dec; /* dec: the chosen decisions */
  if (!none) return;
  dec = none + n;
  for (int i = 0; i < n; i++)
    dec[i] = r->recompute[i] ? TT_DEC_RECOMPUTE : r->compress && r->compress[i] ? TT_DEC_COMPRESS
             : r->policy.offload_sel && r->policy.offload_sel[i] ? TT_DEC_OFFLOAD : TT_DEC_KEEP;
  policy_ctx c = tt_policy_ctx_of(g, be, o, 0, pol->micro_batch, pol->accum_steps, TT_F32, NULL, NULL, &e2);
  if (!tt_policy_try_form(&c, 0, none, 0, &q)) {
    r->arena_fp32_plain = q.arena_bytes;
    tt_program_free(&q);
  }
  int same = (pol->compact ? POLICY_COMPACT : 0) | (pol->attn_fused ? POLICY_FUSED : 0);
  c.dt = pol->act_dtype;
  if (!tt_policy_try_form(&c, 0, dec, same, &q)) {
    r->arena_no_inplace = q.arena_bytes;
    tt_program_free(&q);
  }
  if (!tt_policy_try_form(&c, o->inplace, none, same, &q)) {
    r->arena_no_recompute = q.arena_bytes;
    tt_program_free(&q);
  }
  free(none);
}

/* Planned apart from the search so that train and the API pay only for the choice itself. */
void tt_policy_explain(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r) {
  if (r->policy.micro_batch <= 0) {
    int mb = o->micro_batch > 0 ? o->micro_batch : 1;
    policy_dominant(g, be, o, mb, o->precision == TT_PREC_FP32 ? TT_F32 : tt_policy_half(o), r->dominant, sizeof r->dominant);
    return;
  }
  policy_savings(g, be, o, r);
  for (int i = 0; i < r->nalts; i++)
    snprintf(r->alts[i].why, sizeof r->alts[i].why, "fits, predicted %.0f%% slower than the chosen policy",
             100.0 * (r->alts[i].step_ms / r->predicted_step_ms - 1.0));
}

/* Nothing fits: the message gives the smallest --vram that would, and which plan that is and what
 * dominates it. */
int tt_policy_refuse(const tt_graph *g, tt_backend *be, const tt_policy_opts *o, tt_policy_result *r,
                     const policy_min *min, tt_err *err) {
  int known = min->arena != (size_t)-1, mb = known ? min->mb : o->micro_batch > 0 ? o->micro_batch : 1;
  size_t need = known ? min->arena : 0;
  tt_dtype dt = known ? min->dt : o->precision == TT_PREC_FP32 ? TT_F32 : tt_policy_half(o);
  policy_dominant(g, be, o, mb, dt, r->dominant, sizeof r->dominant);
  char vram[32], resv[32], fit[32], arena[32], budget[32];
  tt_size_text(fit, sizeof fit, need + o->reserve_bytes, 1), tt_size_text(arena, sizeof arena, need, 0);
  if (o->vram_bytes && o->vram_bytes <= o->reserve_bytes)
    tt_fail(err, "--vram %s is not more than the %s reserved for the CUDA context and libraries: nothing is left for "
                 "%s's arena; the smallest --vram that fits is %s (the smallest plan, micro-batch %d, needs a %s arena)",
            tt_size_text(vram, sizeof vram, o->vram_bytes, 0), tt_size_text(resv, sizeof resv, o->reserve_bytes, 0),
            g->model->path, fit, mb, arena);
  else
    tt_fail(err, "%s does not fit: the smallest plan (micro-batch %d%s, %s) needs a %s arena but the budget is %s; the "
                 "smallest --vram that fits is %s; it is dominated by %s", g->model->path, mb,
            known && min->recomputes ? ", recomputing" : "", tt_dtype_name(dt), arena,
            tt_size_text(budget, sizeof budget, r->budget_bytes, 0), fit, r->dominant[0] ? r->dominant : "(breakdown unavailable)");
  tt_policy_result_free(r);
  return -1;
}
