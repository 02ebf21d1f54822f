/* core/compile/cost.c — the cost model that ranks candidate policies (cost.h). Each Program op
 * costs max(FLOPs / peak, bytes moved / bandwidth) plus a fixed dispatch overhead (a roofline
 * per op); step times are in milliseconds per effective batch. */
#include "cost.h"

/* Ranking numbers, not promises: a T4-class card (8 TFLOP/s fp32, ~30 TFLOP/s sustained fp16
 * tensor-core, 300 GB/s) and a 2-core AVX2 CPU. Memory figures never depend on them. */
static const tt_device_profile cost_cuda = {"cuda (generic T4-class estimate)", 8e12, 30e12, 300e9, 8e-6};
/* the CPU backend computes fp16 by converting to fp32, so fp16 is slower there, not faster */
static const tt_device_profile cost_cpu = {"cpu", 60e9, 20e9, 10e9, 2e-6};

const tt_device_profile *tt_profile_cuda_generic(void) { return &cost_cuda; }
const tt_device_profile *tt_profile_cpu(void) { return &cost_cpu; }

static double cost_step_s(const tt_program *p, const tt_step *s, const tt_device_profile *prof) {
  const tt_graph *g = p->graph;
  double flops = 0.0, bytes = 0.0;
  for (int k = 0; k < s->nin; k++)
    if (s->in[k] >= 0) bytes += (double)p->bufs[s->in[k]].bytes;
  for (int k = 0; k < s->nout; k++)
    if (s->out[k] >= 0) bytes += (double)p->bufs[s->out[k]].bytes;
  if (s->node >= 0 && (s->op == TT_S_FWD || s->op == TT_S_BWD)) {
    const tt_node *n = &g->nodes[s->node];
    double f = n->flops * p->policy.micro_batch;
    /* backward of conv/linear computes two products (data and filter) */
    flops = (s->op == TT_S_BWD && (n->kind == TT_L_CONV || n->kind == TT_L_LINEAR)) ? 2.0 * f : f;
  }
  double peak = p->policy.act_dtype == TT_F16 ? prof->flops_fp16 : prof->flops_fp32;
  double t = flops / peak, tb = bytes / prof->bytes_per_s;
  return (t > tb ? t : tb) + prof->op_overhead_s;
}

double tt_cost_predict_ms(const tt_program *p, const tt_device_profile *prof, double *recompute_ms) {
  double micro = 0.0, upd = 0.0, rec = 0.0;
  for (int i = 0; i < p->nsteps; i++) {
    double t = cost_step_s(p, &p->steps[i], prof);
    if (i < p->micro_end) micro += t;
    else upd += t;
    if (p->steps[i].flags & TT_SF_RECOMPUTE) rec += t;
  }
  int acc = p->policy.accum_steps > 0 ? p->policy.accum_steps : 1;
  if (recompute_ms) *recompute_ms = 1e3 * rec * acc;
  return 1e3 * (micro * acc + upd);
}

double tt_predict_ms(const tt_program *p, const tt_device_profile *prof) { return tt_cost_predict_ms(p, prof, NULL); }

