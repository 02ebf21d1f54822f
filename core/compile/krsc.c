/* core/compile/krsc.c — which 16-bit weight copies the cast writes KRSC (issue 41, item 2).
 *
 * cuDNN's channels-last kernels read a KRSC filter [k, r, s, c/g] where the master weight is KCRS
 * [k, c/g, r, s] (PyTorch's order). The CUDA backend used to transpose the 16-bit copy into the front
 * of the workspace on every all-NHWC forward and backward-data call. Under fp16/bf16 autocast the copy
 * is made once per micro-step by a cast anyway, so where every reader of a copy is such a convolution,
 * the cast writes it KRSC (cast_multi's tt_cast_seg.rs) and the convolutions read it in place
 * (tt_conv_desc.layout_w): no transpose per call, and no filter bytes in their workspaces. The
 * decision is the planner's, carried by the copy's buffer (tt_buf.krsc) and the calls' descs; a
 * backend never guesses it. Backward-filter still writes the fp32 KCRS gradient. */
#include "lower_int.h"

#include <string.h>

#include "../base/knobs.h"

/* How node n reads parameter `param`: 1 as the filter of an all-NHWC convolution, 2 otherwise,
 * 0 not at all. layout/canon as lower.c has them (the x layout is its input's value's). */
static int krsc_reads(const tt_node *n, int param, const unsigned char *layout, const int *canon) {
  const int slots[] = {n->weight, n->bias, n->gamma, n->beta, n->rmean, n->rvar, n->out_w, n->out_b, n->cls_tok, n->pos_emb};
  int reads = 0;
  for (size_t k = 0; k < sizeof slots / sizeof slots[0]; k++) reads |= slots[k] == param;
  if (!reads) return 0;
  if (n->kind == TT_L_CONV && n->weight == param && n->nin == 1 &&
      layout[canon[n->in[0]]] == TT_LAYOUT_NHWC && layout[canon[n->layer]] == TT_LAYOUT_NHWC)
    return 1;
  return 2;
}

void tt_krsc_plan(const tt_graph *g, const tt_policy *pol, int caps, int knob, const unsigned char *layout,
                  const int *canon, unsigned char *krsc) {
  memset(krsc, 0, (size_t)g->nparams);
  /* the copy is cast by cast_multi (the one entry that writes KRSC) on a backend whose convolutions
   * read it (TT_CAP_FILTER_KRSC needs both); fp32 programs read the masters, which stay KCRS */
  if (!knob || pol->act_dtype == TT_F32 || !(caps & TT_CAP_FILTER_KRSC) || !(caps & TT_CAP_CAST_MULTI) || !layout) return;
  for (int i = 0; i < g->nnodes; i++) {
    const tt_node *n = &g->nodes[i];
    if (canon[i] != i) continue; /* a view owns no parameter */
    int slots[] = {n->weight, n->bias, n->gamma, n->beta, n->rmean, n->rvar, n->out_w, n->out_b, n->cls_tok, n->pos_emb};
    for (size_t k = 0; k < sizeof slots / sizeof slots[0]; k++) {
      int pr = slots[k], r;
      if (pr < 0 || pr >= g->nparams || !(r = krsc_reads(n, pr, layout, canon))) continue;
      if (krsc[pr] != 2) krsc[pr] = (unsigned char)r; /* one other reader keeps it KCRS for all */
    }
  }
  for (int p = 0; p < g->nparams; p++) {
    const tt_param *pr = &g->params[p];
    krsc[p] = krsc[p] == 1 && pr->half_copy && pr->role == TT_PR_WEIGHT && pr->ndim == 4;
  }
}

int tt_krsc_check(tt_program *p, tt_err *err) {
  p->n_krsc = 0;
  for (int b = 0; b < p->nbufs; b++) p->n_krsc += p->bufs[b].krsc != 0;
  for (int si = 0; si < p->nsteps; si++) {
    const tt_step *s = &p->steps[si];
    int conv = (s->op == TT_S_FWD || s->op == TT_S_BWD) && s->kind == TT_L_CONV;
    int wslot = s->op == TT_S_FWD ? TT_FWD_W : TT_BWD_W;
    int w_krsc = conv && s->a.conv.layout_w == TT_FILTER_KRSC;
    for (int j = 0; j < s->nin; j++) {
      int b = s->in[j];
      if (b < 0 || !p->bufs[b].krsc) continue;
      if (!w_krsc || j != wslot)
        return tt_fail(err, "internal error: step %d (%s) reads the KRSC weight copy '%s' but is not an all-NHWC "
                       "convolution reading it as its KRSC filter", si, s->name ? s->name : "?", p->bufs[b].name);
    }
    if (w_krsc && (s->in[wslot] < 0 || !p->bufs[s->in[wslot]].krsc))
      return tt_fail(err, "internal error: convolution '%s' (step %d) reads a KRSC filter from a buffer not cast KRSC",
                     s->name ? s->name : "?", si);
  }
  return 0;
}
