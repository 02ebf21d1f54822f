/* core/compile/lower_passes.c — lowering's passes over a whole lowered program (lower.c runs them
 * after the last step is made): each buffer's live range, the gradients no step writes, and the
 * forward adds' in-place proposals. They read and change the tt_program alone. */
#include "lower_int.h"

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
