/* core/compile/lower_passes.c — lowering's passes over a whole lowered program (lower.c runs them
 * after the last step is made): each buffer's live range, the gradients no step writes, and the
 * forward adds' in-place proposals. They read and change the tt_program alone. */
#include "lower_int.h"

/* The residual block's end in backward, steps i, i + 1, i + 2: the ReLU's, its add's and the
 * batch norm's that feeds the add (the add feeding only the ReLU, the batch norm only the add), as
 * calls.c fuses them into one bn_bwd_add_relu call at the batch norm's place. That call reads the
 * ReLU's saved y (or 1-bit mask) two steps after the ReLU's own step, its last reader unfused: the
 * saved value lives to the batch norm's step, so the arena never gives its bytes to the batch
 * norm's dx (which the fusion then had to refuse: ResNet-50 mb 16 fused 5 of its 16 block ends,
 * now 16 in a 0.4% larger arena). Only where that costs little: a 1-bit mask, or a plan that
 * recomputes nothing. A full y kept longer in a plan that recomputes made the smallest arenas
 * 3 to 12% larger (the fashion ResNet at mb 128: 87.6 MiB against 78.4), more than the fused
 * call saves. */
static void lower_liveness_bn_add_relu(tt_program *p) {
  const tt_graph *g = p->graph;
  for (int i = 0; g && i + 2 < p->micro_end; i++) {
    const tt_step *r = &p->steps[i], *a = &p->steps[i + 1], *b = &p->steps[i + 2];
    if (r->op != TT_S_BWD || a->op != TT_S_BWD || b->op != TT_S_BWD || r->node < 0 || a->node < 0 || b->node < 0) continue;
    int k_bn;
    if (g->nodes[r->node].kind != TT_L_RELU || !tt_graph_bn_add_relu(g, b->node, a->node, r->node, &k_bn)) continue;
    int ys = r->nin > TT_BWD_SAVED ? r->in[TT_BWD_SAVED] : -1;
    if (!(r->flags & TT_SF_COMPACT) && p->n_recomputed_steps) continue; /* full y under memory pressure: see above */
    if (ys >= 0 && !p->bufs[ys].persistent && p->bufs[ys].last < i + 2) p->bufs[ys].last = i + 2;
  }
}

/* First and last step of every buffer; persistent ones span the whole program. */
void tt_lower_liveness(tt_program *p) {
  for (int si = 0; si < p->nsteps; si++) {
    const tt_step *s = &p->steps[si];
    int ids[2 * TT_STEP_MAX_IO + 1], k = 0;
    for (int j = 0; j < s->nin; j++) ids[k++] = s->in[j];
    for (int j = 0; j < s->nout; j++) ids[k++] = s->out[j];
    ids[k++] = s->ws;
    for (int j = 0; j < k; j++) {
      if (ids[j] < 0) continue;
      tt_buf *b = &p->bufs[ids[j]];
      if (b->first < 0) b->first = si;
      b->last = si;
    }
  }
  for (int i = 0; i < p->nbufs; i++) {
    tt_buf *b = &p->bufs[i];
    if (b->persistent) b->first = 0, b->last = p->nsteps - 1;
    if (b->first < 0) b->first = b->last = 0; /* unused (e.g. labels of a net without loss) */
  }
  if (p->caps & TT_CAP_BN_ADD_RELU_BWD) lower_liveness_bn_add_relu(p);
}

/* A transient gradient that no step of the micro-step writes (a parameter no gradient reaches)
 * would be read uninitialised by its update: it becomes persistent, zeroed at set-up and never
 * written, as every gradient was before they could be transient. Counts the transient ones left
 * into p->transient_grads. */
void tt_lower_grads_unwritten(tt_program *p) {
  p->transient_grads = 0;
  for (int k = 0; k < p->nparams; k++) {
    int gb = p->grad_buf[k];
    if (gb < 0 || p->bufs[gb].persistent) continue;
    /* tt_lower_liveness set first to the earliest step that names it: a writer if any step of the
     * micro-step does (backward only writes gradients; the update phase only reads them) */
    tt_buf *b = &p->bufs[gb];
    const tt_step *s = b->first < p->micro_end ? &p->steps[b->first] : NULL;
    int writes = 0;
    for (int j = 0; s && j < s->nout; j++) writes |= s->out[j] == gb;
    for (int j = 0; s && j < s->nin; j++) writes &= s->in[j] != gb; /* read before written: keep it whole */
    if (!writes) b->persistent = 1, b->first = 0, b->last = p->nsteps - 1;
    else p->transient_grads++;
  }
}

/* A forward add proposed to write over its first input; if that input is read later,
 * propose another input that is dead after the add instead. */
void tt_lower_retarget_add(tt_program *p) {
  for (int si = 0; si < p->nsteps; si++) {
    const tt_step *s = &p->steps[si];
    if (s->op != TT_S_FWD || s->kind != TT_L_ADD) continue;
    tt_buf *y = &p->bufs[s->out[TT_FWD_Y]];
    if (y->alias_of < 0 || p->bufs[y->alias_of].last == si) continue;
    for (int j = 1; j < s->nin; j++)
      if (p->bufs[s->in[j]].last == si) {
        y->alias_of = s->in[j];
        break;
      }
  }
}
