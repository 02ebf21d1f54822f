/* core/app/plan_calls.c — the Program's final call list (core/compile/calls.c) as `plan` shows it:
 * a summary line in the text plan, the whole list under `plan --calls`, and in `plan --json`. */
#include <string.h>

#include "plan_calls.h"

/* Counts of p's calls that run: in the micro-step, in the update phase, and fused ones. */
static void plan_calls_count(const tt_program *p, int *micro, int *update) {
  *micro = *update = 0;
  for (int i = 0; i < p->ncalls; i++)
    if (p->calls[i].skip == TT_CALL_RUNS) (p->calls[i].step < p->micro_end ? micro : update)[0]++;
}

/* Why a listed call does not run by itself, as the listing says it ("" when it runs). */
static const char *plan_calls_skip(int skip) {
  switch (skip) {
    case TT_CALL_PREPARED_ONLY: return "prepared only (frozen)";
    case TT_CALL_FUSED_AWAY: return "fused";
    case TT_CALL_MEMBER: return "member";
    default: return "";
  }
}

/* The fused calls' kinds: "bn_fwd_train_relu 16, bn_bwd_relu 16, bn_fwd_train_add_relu 6, ..." into buf. */
static void plan_calls_fused_kinds(const tt_program *p, char *buf, size_t cap) {
  int n[TT_CALL_COUNT];
  size_t len = 0;
  memset(n, 0, sizeof n);
  buf[0] = 0;
  for (int i = 0; i < p->ncalls; i++)
    if (p->calls[i].fn >= TT_CALL_BN_RELU_FWD && p->calls[i].fn <= TT_CALL_BN_ADD_RELU_BWD) n[p->calls[i].fn]++;
  for (int f = 0; f < TT_CALL_COUNT && len < cap; f++)
    if (n[f]) len += (size_t)snprintf(buf + len, cap - len, "%s%s %d", len ? ", " : "", tt_call_name(f), n[f]);
}

void tt_plan_calls_line(const tt_program *p, FILE *out) {
  int micro, update;
  char kinds[160];
  plan_calls_count(p, &micro, &update);
  plan_calls_fused_kinds(p, kinds, sizeof kinds);
  fprintf(out, "  calls       %d backend calls per micro-step, %d in the update; ", micro, update);
  if (p->n_fused) fprintf(out, "%d fused calls (%s)", p->n_fused, kinds);
  else fprintf(out, "no fused calls");
  fprintf(out, " (plan --calls lists them)\n");
}

/* One buffer operand: its name, or "-" for none. */
static const char *plan_calls_buf(const tt_program *p, int b) { return b >= 0 ? p->bufs[b].name : "-"; }

void tt_plan_calls_text(const tt_program *p, FILE *out) {
  int micro, update;
  plan_calls_count(p, &micro, &update);
  fprintf(out, "calls of the training program: %d per micro-step, %d in the update, %d fused calls\n", micro, update,
          p->n_fused);
  fprintf(out, "%5s %5s %-10s %-22s %-20s %s\n", "call", "step", "phase", "layer", "entry point", "reads -> writes");
  for (int i = 0; i < p->ncalls; i++) {
    const tt_call *c = &p->calls[i];
    const tt_step *s = &p->steps[c->step];
    const char *phase = c->step >= p->micro_end ? "update" : s->op == TT_S_BWD ? "backward" : s->op == TT_S_FWD ?
                        ((s->flags & TT_SF_RECOMPUTE) ? "recompute" : "forward") : "micro-step";
    fprintf(out, "%5d %5d %-10s %-22.22s %-20s ", i, c->step, phase, s->name ? s->name : "-", tt_call_name(c->fn));
    for (int k = 0, n = 0; k < TT_CALL_MAX_IN; k++)
      if (c->in[k] >= 0) fprintf(out, "%s%s", n++ ? ", " : "", plan_calls_buf(p, c->in[k]));
    fprintf(out, " ->");
    for (int k = 0; k < TT_CALL_MAX_OUT; k++)
      if (c->out[k] >= 0) fprintf(out, " %s", plan_calls_buf(p, c->out[k]));
    if (c->ws >= 0 && p->bufs[c->ws].bytes) fprintf(out, "  ws %zu", p->bufs[c->ws].bytes);
    if (c->skip == TT_CALL_FUSED_AWAY) fprintf(out, "  [fused into call %d]", c->fused_into);
    else if (c->skip != TT_CALL_RUNS) fprintf(out, "  [%s]", plan_calls_skip(c->skip));
    if (c->nseg) fprintf(out, "  [%d tensors]", c->nseg);
    fprintf(out, "\n");
  }
}

void tt_plan_calls_json(const tt_program *p, tt_strbuf *b) {
  int micro, update;
  plan_calls_count(p, &micro, &update);
  tt_strbuf_printf(b, "{\"micro_step\": %d, \"update\": %d, \"fused\": %d, \"list\": [", micro, update, p->n_fused);
  for (int i = 0; i < p->ncalls; i++) {
    const tt_call *c = &p->calls[i];
    const tt_step *s = &p->steps[c->step];
    tt_strbuf_printf(b, "%s{\"step\": %d, \"call\": \"%s\", \"layer\": ", i ? ", " : "", c->step, tt_call_name(c->fn));
    if (s->name) tt_strbuf_json(b, s->name);
    else tt_strbuf_put(b, "null", 4);
    tt_strbuf_printf(b, ", \"in\": [");
    for (int k = 0, n = 0; k < TT_CALL_MAX_IN; k++)
      if (c->in[k] >= 0) {
        if (n++) tt_strbuf_put(b, ", ", 2);
        tt_strbuf_json(b, p->bufs[c->in[k]].name);
      }
    tt_strbuf_printf(b, "], \"out\": [");
    for (int k = 0, n = 0; k < TT_CALL_MAX_OUT; k++)
      if (c->out[k] >= 0) {
        if (n++) tt_strbuf_put(b, ", ", 2);
        tt_strbuf_json(b, p->bufs[c->out[k]].name);
      }
    tt_strbuf_printf(b, "], \"workspace_bytes\": %zu", c->ws >= 0 ? p->bufs[c->ws].bytes : (size_t)0);
    if (c->skip == TT_CALL_FUSED_AWAY) tt_strbuf_printf(b, ", \"fused_into\": %d", c->fused_into);
    else if (c->skip != TT_CALL_RUNS) tt_strbuf_printf(b, ", \"runs\": \"%s\"", plan_calls_skip(c->skip));
    if (c->nseg) tt_strbuf_printf(b, ", \"tensors\": %d", c->nseg);
    tt_strbuf_put(b, "}", 1);
  }
  tt_strbuf_put(b, "]}", 2);
}
