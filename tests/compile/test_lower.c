/* tests/compile/test_lower.c — the lower stage on its own data (DESIGN.md, "Every stage can be
 * tested on its own data"): for one fixed recipe, the buffers and steps the lowering emits,
 * their operand slots and arguments, liveness, in-place proposals and recompute steps. The
 * counts below are derived by hand from the recipe in the comments, not read off a run. */
#include <stdio.h>
#include <string.h>

#include "core/base/knobs.h"
#include "core/compile/dispatch.h"
#include "core/compile/graph.h"
#include "core/compile/lower_int.h"
#include "core/compile/program.h"
#include "core/compile/recipe.h"
#include "core/compile/policy.h"
#include "kernels/backend.h"
#include "tests/tt_test.h"

tt_backend *tt_cpu_backend_create(int threads);

/* nodes: 0 input, 1 c1, 2 b1, 3 r1, 4 c2, 5 a1, 6 f1 (a view), 7 fc
 * params: c1.weight; b1 gamma, beta, running mean, running var; c2 weight, bias; fc weight,
 * bias: 9, of which 7 trainable (running statistics are not). */
static const char *lower_recipe =
    "[net]\ninput = 1x8x8\nclasses = 3\n"
    "[train]\nbatch = 4\noptimizer = sgd\nlr = 0.1\nmomentum = 0.9\n"
    "[conv c1]\nfilters = 2\nsize = 3\npad = 1\nbias = false\n"
    "[bn b1]\n"
    "[relu r1]\n"
    "[conv c2]\nfilters = 2\nsize = 3\npad = 1\n"
    "[add a1]\nfrom = c2, r1\n"
    "[flatten f1]\n"
    "[linear fc]\nout = 3\n";

typedef struct lw {
  tt_model m;
  tt_graph g;
  tt_program p;
  tt_backend *be;
} lw;

static void lw_close(lw *t);

/* Builds the program; on failure records it in the current test, frees what was made and
 * returns -1. */
static int lw_no_apply; /* lw_open: plan for a backend without bn_apply (the CUDA backend's table for now) */
static int lw_caps;     /* lw_open: the backend's plan_caps (the optional calls the call list may use) */

/* The CPU backend offering exactly the fused calls caps lists (its table has them all: the ones
 * not listed are taken out, so tt_program_caps finds only caps). */
static void lw_offer(tt_backend *be, int caps) {
  if (!be) return;
  be->plan_caps = caps;
  if (!(caps & TT_CAP_BN_RELU_FWD)) be->bn_fwd_train_relu = NULL;
  if (!(caps & TT_CAP_BN_RELU_BWD)) be->bn_bwd_relu = NULL;
  if (!(caps & TT_CAP_BN_ADD_RELU_FWD)) be->bn_fwd_train_add_relu = NULL;
  if (!(caps & TT_CAP_BN_ADD_RELU_BWD)) be->bn_bwd_add_relu = NULL;
}

static int lw_open(lw *t, int training, tt_dtype dt, int inplace, const unsigned char *rec) {
  tt_err e = {{0}};
  memset(t, 0, sizeof *t);
  t->be = tt_cpu_backend_create(1);
  if (t->be && lw_no_apply) t->be->bn_apply = NULL;
  lw_offer(t->be, lw_caps);
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 4, pol.accum_steps = 1, pol.act_dtype = dt, pol.inplace = inplace, pol.training = training;
  pol.recompute = (unsigned char *)rec;
  if (!t->be || tt_recipe_parse("lower.recipe", lower_recipe, &t->m, &e, NULL, NULL) || tt_graph_build(&t->m, &t->g, &e) ||
      tt_lower(&t->g, &pol, t->be, &t->p, &e) || tt_program_plan(&t->p, &e)) {
    TT_CHECK(0, "setting up: %s", t->be ? e.msg : "no CPU backend");
    lw_close(t);
    return -1;
  }
  return 0;
}

static void lw_close(lw *t) {
  tt_program_free(&t->p);
  tt_graph_free(&t->g);
  tt_model_free(&t->m);
  if (t->be) t->be->destroy(t->be);
}

static int count_steps(const tt_program *p, tt_step_op op, int node) {
  int n = 0;
  for (int i = 0; i < p->nsteps; i++)
    if (p->steps[i].op == op && (node < 0 || p->steps[i].node == node)) n++;
  return n;
}

static int find_step(const tt_program *p, tt_step_op op, int node, int flags) {
  for (int i = 0; i < p->nsteps; i++)
    if (p->steps[i].op == op && p->steps[i].node == node && (p->steps[i].flags & flags) == flags) return i;
  return -1;
}

static int find_buf(const tt_program *p, const char *name) {
  for (int i = 0; i < p->nbufs; i++)
    if (!strcmp(p->bufs[i].name, name)) return i;
  return -1;
}

static int count_class(const tt_program *p, tt_buf_class c) {
  int n = 0;
  for (int i = 0; i < p->nbufs; i++) n += p->bufs[i].cls == c;
  return n;
}

static void test_counts(void) {
  TT_TEST_BEGIN("lower_buffer_and_step_counts");
  lw t;
  if (lw_open(&t, 1, TT_F32, 0, NULL)) return;
  const tt_program *p = &t.p;
  /* micro-step: load, 6 forwards (the flatten is a view), loss, 6 backwards (nothing for
   * the input, nothing for the view); update phase: 7 updates, no check in fp32 */
  TT_CHECK(count_steps(p, TT_S_LOAD_INPUT, -1) == 1, "load steps %d", count_steps(p, TT_S_LOAD_INPUT, -1));
  TT_CHECK(count_steps(p, TT_S_FWD, -1) == 6, "forward steps %d", count_steps(p, TT_S_FWD, -1));
  TT_CHECK(count_steps(p, TT_S_FWD, 6) == 0, "the flatten view got a step");
  TT_CHECK(count_steps(p, TT_S_LOSS, -1) == 1, "loss steps %d", count_steps(p, TT_S_LOSS, -1));
  TT_CHECK(count_steps(p, TT_S_BWD, -1) == 6, "backward steps %d", count_steps(p, TT_S_BWD, -1));
  TT_CHECK(count_steps(p, TT_S_UPDATE, -1) == 7, "update steps %d", count_steps(p, TT_S_UPDATE, -1));
  TT_CHECK(count_steps(p, TT_S_CAST, -1) == 0 && count_steps(p, TT_S_CHECK, -1) == 0, "fp32 has casts or a check");
  TT_CHECK(p->micro_end == 14 && p->nsteps == 21, "micro_end %d nsteps %d", p->micro_end, p->nsteps);
  /* buffers: 9 masters, 7 gradients, 7 momenta; activations: u8 batch, labels, the 6 values
   * and the input value, 2 batch-norm saved statistics; 6 activation gradients */
  TT_CHECK(count_class(p, TT_BC_PARAMS) == 9, "params %d", count_class(p, TT_BC_PARAMS));
  TT_CHECK(count_class(p, TT_BC_GRADS) == 7, "grads %d", count_class(p, TT_BC_GRADS));
  TT_CHECK(count_class(p, TT_BC_OPTIMIZER) == 7, "optimizer %d", count_class(p, TT_BC_OPTIMIZER));
  TT_CHECK(count_class(p, TT_BC_ACTIVATIONS) == 11, "activations %d", count_class(p, TT_BC_ACTIVATIONS));
  TT_CHECK(count_class(p, TT_BC_ACT_GRADS) == 6, "activation grads %d", count_class(p, TT_BC_ACT_GRADS));
  TT_CHECK(count_class(p, TT_BC_WEIGHT_COPIES) == 0, "weight copies in fp32");
  TT_CHECK(find_buf(p, "f1") < 0, "a buffer for the flatten view");
  TT_CHECK(p->value_buf[6] == p->value_buf[5], "the view's value is not its input's");
  TT_CHECK(p->nparams == 9 && p->input_numel == 64, "nparams %d input_numel %zu", p->nparams, p->input_numel);
  lw_close(&t);

  /* fp16 autocast: one cast per conv/linear weight and bias (5) made once per micro-step
   * and reused by backward, and the overflow check */
  if (!lw_open(&t, 1, TT_F16, 0, NULL)) {
    TT_CHECK(count_steps(&t.p, TT_S_CAST, -1) == 5, "casts %d", count_steps(&t.p, TT_S_CAST, -1));
    TT_CHECK(count_class(&t.p, TT_BC_WEIGHT_COPIES) == 5, "copies %d", count_class(&t.p, TT_BC_WEIGHT_COPIES));
    TT_CHECK(count_steps(&t.p, TT_S_CHECK, -1) == 1 && t.p.overflow_flag >= 0, "no overflow check under fp16");
    TT_CHECK(t.p.nsteps == 27, "fp16 nsteps %d", t.p.nsteps);
    lw_close(&t);
  }

  /* evaluation: forward and loss only; no gradients, no optimizer state */
  if (!lw_open(&t, 0, TT_F32, 0, NULL)) {
    TT_CHECK(t.p.nsteps == 8 && t.p.micro_end == 8, "eval nsteps %d micro_end %d", t.p.nsteps, t.p.micro_end);
    TT_CHECK(count_class(&t.p, TT_BC_GRADS) == 0 && count_class(&t.p, TT_BC_OPTIMIZER) == 0, "eval has training state");
    int l = find_step(&t.p, TT_S_LOSS, 7, TT_SF_EVAL);
    TT_CHECK(l >= 0 && t.p.steps[l].out[TT_LOSS_DLOGITS] == -1 && t.p.steps[l].out[TT_LOSS_STATS] == t.p.stats,
             "eval loss writes dlogits");
    lw_close(&t);
  }
  TT_TEST_END();
}

static void test_slots_and_args(void) {
  TT_TEST_BEGIN("lower_operand_slots_and_arguments");
  lw t;
  if (lw_open(&t, 1, TT_F32, 0, NULL)) return;
  const tt_program *p = &t.p;
  int c1 = find_step(p, TT_S_FWD, 1, 0), c2 = find_step(p, TT_S_FWD, 4, 0), fc = find_step(p, TT_S_FWD, 7, 0);
  int b1 = find_step(p, TT_S_FWD, 2, 0), ld = find_step(p, TT_S_LOAD_INPUT, 0, 0), ls = find_step(p, TT_S_LOSS, 7, 0);
  TT_CHECK(c1 >= 0 && c2 >= 0 && fc >= 0 && b1 >= 0 && ld >= 0 && ls >= 0, "steps missing");
  if (tt_test_current_failed) {
    lw_close(&t);
    return;
  }
  const tt_conv_desc *d = &p->steps[c1].a.conv;
  TT_CHECK(d->n == 4 && d->c == 1 && d->h == 8 && d->w == 8 && d->k == 2 && d->r == 3 && d->s == 3 && d->pad_h == 1 &&
               d->pad_w == 1 && d->stride_h == 1 && d->groups == 1 && d->p == 8 && d->q == 8,
           "c1 descriptor n%d c%d %dx%d k%d %dx%d", d->n, d->c, d->h, d->w, d->k, d->r, d->s);
  TT_CHECK(p->steps[c1].kind == TT_L_CONV && p->steps[c1].name && !strcmp(p->steps[c1].name, "c1"), "c1 kind or name");
  TT_CHECK(p->steps[c1].in[TT_FWD_W] == p->param_buf[t.g.nodes[1].weight], "c1 weight slot");
  TT_CHECK(p->steps[c1].in[TT_FWD_B] == -1, "c1 has no bias but its slot is %d", p->steps[c1].in[TT_FWD_B]);
  TT_CHECK(p->steps[c2].in[TT_FWD_B] == p->param_buf[t.g.nodes[4].bias], "c2 bias slot");
  TT_CHECK(p->steps[fc].a.linear.in == 128 && p->steps[fc].a.linear.out == 3, "fc %d -> %d", p->steps[fc].a.linear.in,
           p->steps[fc].a.linear.out);
  TT_CHECK(p->steps[fc].in[TT_FWD_X] == p->value_buf[5], "fc reads through the flatten view");
  TT_CHECK(p->steps[b1].a.bn.c == 2 && p->steps[b1].a.bn.hw == 64, "bn args c%d hw%d", p->steps[b1].a.bn.c,
           p->steps[b1].a.bn.hw);
  TT_CHECK(p->steps[b1].out[TT_BN_SAVE_MEAN] >= 0 && p->steps[b1].out[TT_BN_SAVE_INVSTD] == p->steps[b1].out[TT_BN_SAVE_MEAN] + 1,
           "bn saved statistics");
  TT_CHECK(p->steps[ld].a.load.c == 1 && p->steps[ld].a.load.hw == 64 && p->steps[ld].a.load.std[0] == 1.0f,
           "load args c%d hw%d", p->steps[ld].a.load.c, p->steps[ld].a.load.hw);
  TT_CHECK(p->steps[ls].a.loss.classes == 3, "loss classes %d", p->steps[ls].a.loss.classes);
  /* backward slots: c1 is fed by the image (no dx); c1's weight gradient; bn reads x and its statistics */
  int bc1 = find_step(p, TT_S_BWD, 1, 0), bb1 = find_step(p, TT_S_BWD, 2, 0), br1 = find_step(p, TT_S_BWD, 3, 0);
  TT_CHECK(bc1 >= 0 && p->steps[bc1].out[TT_BWD_DX] == -1, "c1 backward writes a gradient for the image");
  TT_CHECK(bc1 >= 0 && p->steps[bc1].out[TT_BWD_DW] == p->grad_buf[t.g.nodes[1].weight] && p->steps[bc1].out[TT_BWD_DB] == -1,
           "c1 parameter gradient slots");
  TT_CHECK(bc1 >= 0 && p->steps[bc1].in[TT_BWD_SAVED] == p->value_buf[0], "c1 backward does not read its input");
  TT_CHECK(bb1 >= 0 && p->steps[bb1].in[TT_BWD_SAVED] == p->value_buf[1] &&
               p->steps[bb1].in[TT_BWD_SAVE_MEAN] == p->steps[b1].out[TT_BN_SAVE_MEAN],
           "bn backward operands");
  TT_CHECK(br1 >= 0 && p->steps[br1].in[TT_BWD_SAVED] == p->value_buf[3], "relu backward reads its output");
  /* every update carries its parameter's size */
  for (int i = p->micro_end; i < p->nsteps; i++) {
    const tt_step *s = &p->steps[i];
    TT_CHECK(s->op == TT_S_UPDATE && s->a.count == t.g.params[s->arg].numel && s->out[TT_UPD_PARAM] == p->param_buf[s->arg] &&
                 s->out[TT_UPD_M] == p->m_buf[s->arg] && s->out[TT_UPD_V] == -1,
             "update step %d", i);
  }
  lw_close(&t);
  TT_TEST_END();
}

static void test_liveness(void) {
  TT_TEST_BEGIN("lower_liveness");
  lw t;
  if (lw_open(&t, 1, TT_F32, 0, NULL)) return;
  const tt_program *p = &t.p;
  for (int si = 0; si < p->nsteps; si++) {
    const tt_step *s = &p->steps[si];
    for (int k = 0; k < s->nin; k++)
      if (s->in[k] >= 0) TT_CHECK(p->bufs[s->in[k]].first <= si && si <= p->bufs[s->in[k]].last, "step %d reads a dead buffer", si);
    for (int k = 0; k < s->nout; k++)
      if (s->out[k] >= 0) TT_CHECK(p->bufs[s->out[k]].first <= si && si <= p->bufs[s->out[k]].last, "step %d writes a dead buffer", si);
  }
  for (int i = 0; i < p->nbufs; i++)
    if (p->bufs[i].persistent) TT_CHECK(p->bufs[i].first == 0 && p->bufs[i].last == p->nsteps - 1, "persistent %s", p->bufs[i].name);
  /* what backward reads decides how long a value lives (core/compile/ops.c): batch norm's backward
   * reads its input, not its output, so b1's value dies at the relu that reads it; relu's
   * backward reads its output, so r1's value lives until r1's backward */
  int fr1 = find_step(p, TT_S_FWD, 3, 0), br1 = find_step(p, TT_S_BWD, 3, 0), bb1 = find_step(p, TT_S_BWD, 2, 0);
  TT_CHECK(p->bufs[p->value_buf[2]].last == fr1, "b1 value last used at %d, not at the relu %d", p->bufs[p->value_buf[2]].last,
           fr1);
  TT_CHECK(p->bufs[p->value_buf[3]].last == br1, "r1 value last used at %d, not at its backward %d",
           p->bufs[p->value_buf[3]].last, br1);
  TT_CHECK(p->bufs[p->value_buf[1]].last == bb1, "c1 value last used at %d, not at bn backward %d", p->bufs[p->value_buf[1]].last,
           bb1);
  /* the fan-out: r1's gradient is written by the add's backward and added into by c2's */
  int ba1 = find_step(p, TT_S_BWD, 5, 0), bc2 = find_step(p, TT_S_BWD, 4, 0);
  int g_r1 = find_buf(p, "r1.grad");
  TT_CHECK(ba1 >= 0 && bc2 >= 0 && g_r1 >= 0, "fan-out steps");
  if (ba1 >= 0 && bc2 >= 0 && g_r1 >= 0) {
    TT_CHECK(p->steps[ba1].out[1] == g_r1 && p->steps[ba1].out_beta[1] == 0, "the add does not overwrite r1.grad");
    TT_CHECK(p->steps[bc2].out[TT_BWD_DX] == g_r1 && p->steps[bc2].out_beta[TT_BWD_DX] == 1, "c2 does not add into r1.grad");
    TT_CHECK(ba1 < bc2, "the overwrite comes after the add");
  }
  TT_CHECK(p->arena_bytes >= p->peak_live_bytes && p->peak_live_bytes > 0, "arena %zu < peak %zu", p->arena_bytes,
           p->peak_live_bytes);
  lw_close(&t);
  TT_TEST_END();
}

static void test_inplace(void) {
  TT_TEST_BEGIN("lower_inplace_proposals");
  lw t;
  if (!lw_open(&t, 1, TT_F32, 0, NULL)) {
    for (int i = 0; i < t.p.nbufs; i++) TT_CHECK(t.p.bufs[i].alias_of == -1, "%s proposes an alias without in-place", t.p.bufs[i].name);
    TT_CHECK(t.p.n_inplace == 0, "n_inplace %d", t.p.n_inplace);
    lw_close(&t);
  }
  if (lw_open(&t, 1, TT_F32, 1, NULL)) return;
  const tt_program *p = &t.p;
  /* forward: the relu over the batch norm's output (dead after it); the add over c2, its
   * first input, dead after the add (c2's backward reads r1, not c2) */
  TT_CHECK(p->bufs[p->value_buf[3]].alias_of == p->value_buf[2], "r1 does not propose b1's storage");
  TT_CHECK(p->bufs[p->value_buf[5]].alias_of == p->value_buf[4], "a1 does not propose c2's storage");
  TT_CHECK(p->bufs[p->value_buf[3]].aliased && p->bufs[p->value_buf[5]].aliased, "the planner refused a forward alias");
  /* backward: relu writes b1.grad over r1.grad; the add only its last input's gradient over dy */
  int g_b1 = find_buf(p, "b1.grad"), g_r1 = find_buf(p, "r1.grad"), g_c2 = find_buf(p, "c2.grad"), g_a1 = find_buf(p, "a1.grad");
  TT_CHECK(g_b1 >= 0 && g_r1 >= 0 && g_c2 >= 0 && g_a1 >= 0, "gradient buffers missing");
  if (g_b1 >= 0 && g_r1 >= 0 && g_c2 >= 0 && g_a1 >= 0) {
    TT_CHECK(p->bufs[g_b1].alias_of == g_r1, "relu backward does not propose dy");
    TT_CHECK(p->bufs[g_r1].alias_of == g_a1, "the add's last input does not propose dy");
    TT_CHECK(p->bufs[g_c2].alias_of == -1, "the add's first input proposes dy");
  }
  /* convolutions, batch norm and linear never run in place */
  TT_CHECK(p->bufs[p->value_buf[1]].alias_of == -1 && p->bufs[p->value_buf[2]].alias_of == -1 &&
               p->bufs[p->value_buf[7]].alias_of == -1,
           "a conv, bn or linear proposes an alias");
  TT_CHECK(p->n_inplace >= 3, "accepted aliases %d", p->n_inplace);
  lw_close(&t);
  /* the traits rule: silu's backward reads its input, so it runs in place only when evaluating */
  tt_layer L;
  memset(&L, 0, sizeof L);
  L.kind = TT_L_SILU;
  TT_CHECK(!tt_op_fwd_inplace(&L, 1) && tt_op_fwd_inplace(&L, 0), "silu in-place rule");
  L.kind = TT_L_DROPOUT;
  L.p = 0.5f;
  TT_CHECK(!tt_op_is_view(&L, 1) && tt_op_is_view(&L, 0), "dropout view rule");
  L.p = 0.0f;
  TT_CHECK(tt_op_is_view(&L, 1), "dropout with p = 0 is not a view");
  TT_TEST_END();
}

static void test_recompute(void) {
  TT_TEST_BEGIN("lower_recompute_steps");
  for (lw_no_apply = 0; lw_no_apply < 2; lw_no_apply++) {
  lw t;
  unsigned char rec[8] = {0, 0, 1, 1, 0, 0, 0, 0}; /* drop b1 and r1 after the forward pass */
  if (lw_open(&t, 1, TT_F32, 0, rec)) break;
  const tt_program *p = &t.p;
  /* c2's backward reads r1, which reads b1: both re-run (b1 from the kept c1), once, just
   * before it; r1's and b1's own backwards then find the recomputed values */
  TT_CHECK(p->n_recomputed_steps == 2, "recomputed steps %d", p->n_recomputed_steps);
  int rb1 = find_step(p, TT_S_FWD, 2, TT_SF_RECOMPUTE), rr1 = find_step(p, TT_S_FWD, 3, TT_SF_RECOMPUTE);
  int bc2 = find_step(p, TT_S_BWD, 4, 0), ls = find_step(p, TT_S_LOSS, 7, 0);
  TT_CHECK(rb1 > ls && rr1 > rb1 && bc2 > rr1, "order: loss %d, b1 again %d, r1 again %d, c2 backward %d", ls, rb1, rr1, bc2);
  int vb1 = find_buf(p, "b1.recomputed"), vr1 = find_buf(p, "r1.recomputed");
  TT_CHECK(vb1 >= 0 && vr1 >= 0, "recomputed buffers missing");
  if (rr1 >= 0 && vr1 >= 0) TT_CHECK(p->steps[rr1].out[TT_FWD_Y] == vr1, "r1 recomputed into another buffer");
  if (bc2 >= 0 && vr1 >= 0) TT_CHECK(p->steps[bc2].in[TT_BWD_SAVED] == vr1, "c2 backward reads the dropped value");
  /* the originals die with the forward pass */
  TT_CHECK(p->bufs[p->value_buf[3]].last <= ls && p->bufs[p->value_buf[2]].last <= ls, "dropped values live into backward");
  int bb1 = find_step(p, TT_S_BWD, 2, 0), fb1 = find_step(p, TT_S_FWD, 2, 0);
  if (!lw_no_apply && rb1 >= 0 && fb1 >= 0 && bb1 >= 0) {
    /* issue 26: rebuilt from the forward's saved statistics (bn_apply), writing y only; they stay
     * (persistent: small, and live from the forward to the backward anyway) for it and for the
     * backward; no running statistics in reach */
    const tt_step *r = &p->steps[rb1], *f = &p->steps[fb1];
    TT_CHECK((r->flags & TT_SF_BN_APPLY) && r->nout == 1 && r->in[TT_BN_RMEAN] < 0 && r->in[TT_BN_RVAR] < 0,
             "recomputed bn: flags %d, %d outputs, running statistics %d %d", r->flags, r->nout, r->in[TT_BN_RMEAN],
             r->in[TT_BN_RVAR]);
    TT_CHECK(r->in[TT_BN_APPLY_MEAN] == f->out[TT_BN_SAVE_MEAN] && r->in[TT_BN_APPLY_INVSTD] == f->out[TT_BN_SAVE_INVSTD] &&
                 p->steps[bb1].in[TT_BWD_SAVE_MEAN] == f->out[TT_BN_SAVE_MEAN],
             "recomputed bn or its backward reads statistics other than the forward's");
    TT_CHECK(p->bufs[f->out[TT_BN_SAVE_MEAN]].persistent && p->n_bn_applied == 1, "saved statistics transient, or %d applied",
             p->n_bn_applied);
    tt_call calls[TT_STEP_MAX_CALLS];
    int nc = tt_step_calls(p, r, 4, calls);
    TT_CHECK(nc == 1 && calls[0].fn == TT_CALL_BN_APPLY && calls[0].in[3] == r->in[TT_BN_APPLY_MEAN] && calls[0].out[1] < 0,
             "recomputed bn's call: %d calls, fn %d", nc, nc ? calls[0].fn : -1);
  } else if (lw_no_apply) {
    /* without bn_apply the batch norm re-runs the training forward: it saves statistics again
     * (bit for bit the same) but must not move running statistics: the flag the executor reads */
    TT_CHECK(rb1 >= 0 && p->steps[rb1].out[TT_BN_SAVE_MEAN] >= 0 && !(p->steps[rb1].flags & TT_SF_BN_APPLY),
             "recomputed bn (no bn_apply) has no statistics");
    if (rb1 >= 0 && bb1 >= 0)
      TT_CHECK(p->steps[bb1].in[TT_BWD_SAVE_MEAN] == p->steps[rb1].out[TT_BN_SAVE_MEAN], "bn backward reads the old statistics");
  } else {
    TT_CHECK(0, "steps missing: recomputed bn %d, forward %d, backward %d", rb1, fb1, bb1);
  }
  TT_CHECK(count_steps(p, TT_S_FWD, -1) == 8 && count_steps(p, TT_S_BWD, -1) == 6, "forward %d backward %d",
           count_steps(p, TT_S_FWD, -1), count_steps(p, TT_S_BWD, -1));
  lw_close(&t);
  }
  lw_no_apply = 0;
  TT_TEST_END();
}

/* views (flatten, dropout that is active in training) and the other kinds whose backward
 * reads input or output: silu, maxpool, relu6 */
static const char *lower_recipe2 =
    "[net]\ninput = 2x6x6\nclasses = 4\n"
    "[train]\nbatch = 2\noptimizer = adam\nlr = 0.01\n"
    "[conv c1]\nfilters = 3\nsize = 3\npad = 1\n"
    "[silu s1]\n"
    "[maxpool p1]\nsize = 2\n"
    "[dropout d1]\np = 0.25\n"
    "[flatten f1]\n"
    "[relu6 r6]\n"
    "[dropout d2]\np = 0.5\n"
    "[linear fc1]\nout = 4\n"
    "[avgpool ap]\nfrom = p1\nsize = 3\n"
    "[flatten f2]\n"
    "[linear fc2]\nout = 4\n"
    "[add out]\nfrom = fc1, fc2\n";

/* The scheduler's memory model says a node's value is kept for backward exactly when the
 * lowered program (no recompute) has a backward step read it: both read core/compile/ops.c. */
static void check_sched_agrees_on(const char *name, const char *text, tt_backend *use);
static void check_sched_agrees(const char *name, const char *text) { check_sched_agrees_on(name, text, NULL); }
/* use: the backend to lower with (NULL: a CPU backend) */
static void check_sched_agrees_on(const char *name, const char *text, tt_backend *use) {
  tt_err e = {{0}};
  tt_model m;
  tt_graph g;
  tt_program p;
  memset(&m, 0, sizeof m);
  memset(&g, 0, sizeof g);
  memset(&p, 0, sizeof p);
  tt_backend *be = use ? use : tt_cpu_backend_create(1);
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 2, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.training = 1;
  if (!be || tt_recipe_parse(name, text, &m, &e, NULL, NULL) || tt_graph_build(&m, &g, &e) || tt_lower(&g, &pol, be, &p, &e)) {
    TT_CHECK(0, "%s: %s", name, e.msg);
  } else {
    for (int v = 0; v < g.nnodes; v++) {
      if (tt_op_is_view(g.nodes[v].L, 1)) continue; /* a view has no value of its own */
      int read = 0;
      for (int si = p.micro_end - 1; si >= 0 && p.steps[si].op == TT_S_BWD; si--)
        for (int k = 0; k < p.steps[si].nin; k++) read |= p.steps[si].in[k] == p.value_buf[v];
      TT_CHECK(read == tt_recompute_bwd_reads(&g, v), "%s: node %s: lowering %s its value in backward, the scheduler says %d", name,
               m.layers[v].name, read ? "reads" : "does not read", tt_recompute_bwd_reads(&g, v));
    }
  }
  tt_program_free(&p);
  tt_graph_free(&g);
  tt_model_free(&m);
  if (be && !use) be->destroy(be);
}

static void test_sched_agrees(void) {
  TT_TEST_BEGIN("lower_and_scheduler_agree_on_saved_values");
  check_sched_agrees("lower.recipe", lower_recipe);
  check_sched_agrees("lower2.recipe", lower_recipe2);
  TT_TEST_END();
}

/* A backend whose workspace query fails for one direction, as cuDNN's can: the CPU backend's
 * table with conv_workspace / linear_workspace replaced (and no op_workspace). */
static tt_ws_kind ws_fail_which;
static int ws_fail_linear;
static const char *ws_fail_error(tt_backend *b) {
  (void)b;
  return "cudnnGetConvolutionBackwardFilterWorkspaceSize failed: CUDNN_STATUS_NOT_SUPPORTED";
}
static size_t ws_fail_conv(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which) {
  (void)b, (void)d, (void)dt;
  return !ws_fail_linear && which == ws_fail_which ? TT_WS_ERROR : 0;
}
static size_t ws_fail_lin(tt_backend *b, int n, int in, int out, tt_dtype dt, tt_ws_kind which) {
  (void)b, (void)n, (void)in, (void)out, (void)dt;
  return ws_fail_linear && which == ws_fail_which ? TT_WS_ERROR : 0;
}

static void test_workspace_query_failure(void) {
  TT_TEST_BEGIN("lower_workspace_query_failure_is_an_error_naming_the_layer");
  tt_err e = {{0}};
  tt_model m;
  tt_graph g;
  memset(&m, 0, sizeof m);
  memset(&g, 0, sizeof g);
  tt_backend *cpu = tt_cpu_backend_create(1);
  if (!cpu || tt_recipe_parse("lower.recipe", lower_recipe, &m, &e, NULL, NULL) || tt_graph_build(&m, &g, &e)) {
    TT_CHECK(0, "setting up: %s", e.msg);
  } else {
    tt_backend fake = *cpu;
    fake.last_error = ws_fail_error, fake.conv_workspace = ws_fail_conv, fake.linear_workspace = ws_fail_lin;
    fake.op_workspace = NULL; /* lowering then asks the two queries above (a backend without the generic one) */
    static const struct { int linear; tt_ws_kind which; const char *layer; const char *dir; } cases[] = {
        {0, TT_WS_FWD, "'c1'", "forward"}, {0, TT_WS_BWD_FILTER, "'c2'", "backward"}, /* backward runs last layer first */
        {0, TT_WS_BWD_DATA, "'c2'", "backward"}, {1, TT_WS_BWD_DATA, "'fc'", "backward"}};
    for (int k = 0; k < 4; k++) {
      ws_fail_linear = cases[k].linear, ws_fail_which = cases[k].which;
      tt_policy pol;
      memset(&pol, 0, sizeof pol);
      pol.micro_batch = 4, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1;
      tt_program p;
      e.msg[0] = 0;
      int rc = tt_lower(&g, &pol, &fake, &p, &e);
      TT_CHECK(rc != 0, "case %d: a failed workspace query was planned as %s", k, rc ? "" : "0 bytes");
      if (rc == 0) {
        tt_program_free(&p);
        continue;
      }
      TT_CHECK(strstr(e.msg, "lower.recipe:") && strstr(e.msg, cases[k].layer) && strstr(e.msg, cases[k].dir) &&
                   strstr(e.msg, "CUDNN_STATUS_NOT_SUPPORTED"),
               "case %d: the message should name the recipe line, layer %s, the %s workspace and the reason: %s", k,
               cases[k].layer, cases[k].dir, e.msg);
    }
    printf("  e.g. %s\n", e.msg);
    /* the CPU backend's own queries answer TT_WS_ERROR, with a reason, for a shape they cannot size */
    tt_conv_desc bad;
    memset(&bad, 0, sizeof bad);
    TT_CHECK(cpu->conv_workspace(cpu, &bad, TT_F32, TT_WS_FWD) == TT_WS_ERROR && *cpu->last_error(cpu),
             "cpu conv_workspace of an empty desc: not TT_WS_ERROR");
    TT_CHECK(cpu->linear_workspace(cpu, 0, 4, 4, TT_F16, TT_WS_FWD) == TT_WS_ERROR && *cpu->last_error(cpu),
             "cpu linear_workspace of n = 0: not TT_WS_ERROR");
  }
  tt_graph_free(&g);
  tt_model_free(&m);
  if (cpu) cpu->destroy(cpu);
  TT_TEST_END();
}

/* Byte sizes are micro-batch x values x dtype size: computed without wrapping, and a plan
 * whose sizes do not fit in 64 bits is refused with a message naming the buffer or the recipe. */
static void test_size_overflow(void) {
  TT_TEST_BEGIN("lower_and_plan_refuse_sizes_past_64_bits");
  tt_err e = {{0}};
  tt_model m;
  tt_graph g;
  tt_program p;
  tt_backend *be = tt_cpu_backend_create(1);
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1;
  /* (a) one buffer: a graph built by a program, not the recipe parser (which keeps tensors
   * below 2^31 values): r1 made 2^31-1 x 2 x 1 values at micro-batch 2^31-1 is 2^65 bytes */
  if (!be || tt_recipe_parse("lower.recipe", lower_recipe, &m, &e, NULL, NULL) || tt_graph_build(&m, &g, &e)) {
    TT_CHECK(0, "setting up: %s", e.msg);
  } else {
    g.nodes[3].c = 2147483647, g.nodes[3].h = 2, g.nodes[3].w = 1;
    pol.micro_batch = 2147483647;
    int rc = tt_lower(&g, &pol, be, &p, &e);
    if (!rc) tt_program_free(&p);
    TT_CHECK(rc != 0 && strstr(e.msg, "buffer 'r1'") && strstr(e.msg, "more than 2^64 bytes"),
             "a 2^65-byte value: tt_lower returned %d: %s", rc, rc ? e.msg : "");
    tt_graph_free(&g);
    tt_model_free(&m);
  }
  /* (b) the sum: 200 layers of 2^31 values at micro-batch 2^24 (2^57 bytes each) */
  static const char *many =
      "[net]\ninput = 1x46340x46340\nclasses = 10\n[train]\nbatch = 16777216\n"
      "[block r]\n[relu]\n[end]\n[r rr]\nrepeat = 200\n[gap]\n[linear]\nout = 10\n";
  if (!be || tt_recipe_parse("many.recipe", many, &m, &e, NULL, NULL) || tt_graph_build(&m, &g, &e)) {
    TT_CHECK(0, "setting up: %s", e.msg);
  } else {
    pol.micro_batch = 16777216;
    int rc = tt_lower(&g, &pol, be, &p, &e);
    if (!rc) {
      rc = tt_program_plan(&p, &e);
      if (!rc) printf("  planned an arena of %zu bytes\n", p.arena_bytes);
      tt_program_free(&p);
    }
    TT_CHECK(rc != 0 && strstr(e.msg, "many.recipe: the ") && strstr(e.msg, "add up to more than 2^64 bytes"),
             "buffers adding up past 2^64 bytes: %d: %s", rc, rc ? e.msg : "");
    tt_graph_free(&g);
    tt_model_free(&m);
  }
  if (be) be->destroy(be);
  TT_TEST_END();
}

/* ---- the transformer layers ----
 * nodes: 0 input, 1 embed (5 tokens x 8: 4 patches + the class token), 2 ln_1, 3 attn (2 heads),
 * 4 res1, 5 ln_2, 6 mlp.0 (per token 8 -> 16), 7 mlp.1 (gelu), 8 mlp.3, 9 res2, 10 pool, 11 head */
static const char *vit_recipe =
    "[net]\ninput = 1x8x8\nclasses = 3\n"
    "[train]\nbatch = 2\noptimizer = adamw\nlr = 0.001\n"
    "[patch_embed embed]\nsize = 4\ndim = 8\n"
    "[layernorm ln_1]\n"
    "[attention attn]\nheads = 2\n"
    "[add res1]\nfrom = embed, attn\n"
    "[layernorm ln_2]\n"
    "[linear mlp.0]\nout = 16\n"
    "[gelu mlp.1]\n"
    "[linear mlp.3]\nout = 8\n"
    "[add res2]\nfrom = res1, mlp.3\n"
    "[token pool]\n"
    "[linear head]\nout = 3\n";

/* The transformer entries are never called by lowering, only tested for NULL: a backend that has
 * them is the CPU backend's table with these set (whatever the CPU backend itself has). */
static int fake_ln_fwd(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const float *g, const float *be, float eps,
                       void *y, float *sm, float *si, void *ws, size_t wsb) {
  (void)b, (void)rows, (void)f, (void)dt, (void)x, (void)g, (void)be, (void)eps, (void)y, (void)sm, (void)si, (void)ws, (void)wsb;
  return -1;
}
static int fake_ln_bwd(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const void *dy, const float *g, const float *sm,
                       const float *si, void *dx, float *dg, float *db, float bdx, float bp, void *ws, size_t wsb) {
  (void)b, (void)rows, (void)f, (void)dt, (void)x, (void)dy, (void)g, (void)sm, (void)si, (void)dx, (void)dg, (void)db, (void)bdx,
      (void)bp, (void)ws, (void)wsb;
  return -1;
}
static int fake_attn_fwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, void *o, float *lse, void *pr,
                         uint64_t seed, void *ws, size_t wsb) {
  (void)b, (void)d, (void)dt, (void)qkv, (void)o, (void)lse, (void)pr, (void)seed, (void)ws, (void)wsb;
  return -1;
}
static int fake_attn_bwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, const void *o, const void *dout,
                         const float *lse, const void *pr, uint64_t seed, void *dqkv, float beta, void *ws, size_t wsb) {
  (void)b, (void)d, (void)dt, (void)qkv, (void)o, (void)dout, (void)lse, (void)pr, (void)seed, (void)dqkv, (void)beta, (void)ws,
      (void)wsb;
  return -1;
}
static int fake_tok_fwd(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *x, const float *ct, const float *pos,
                        void *y) {
  (void)b, (void)n, (void)f, (void)hw, (void)cls, (void)dt, (void)x, (void)ct, (void)pos, (void)y;
  return -1;
}
static int fake_tok_bwd(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *dy, void *dx, float *dc, float *dp,
                        float bdx, float bp) {
  (void)b, (void)n, (void)f, (void)hw, (void)cls, (void)dt, (void)dy, (void)dx, (void)dc, (void)dp, (void)bdx, (void)bp;
  return -1;
}
static int fake_pool_fwd(tt_backend *b, int n, int t, int f, int mode, tt_dtype dt, const void *x, void *y) {
  (void)b, (void)n, (void)t, (void)f, (void)mode, (void)dt, (void)x, (void)y;
  return -1;
}
static int fake_pool_bwd(tt_backend *b, int n, int t, int f, int mode, tt_dtype dt, const void *dy, void *dx, float beta) {
  (void)b, (void)n, (void)t, (void)f, (void)mode, (void)dt, (void)dy, (void)dx, (void)beta;
  return -1;
}

static void vit_fake(tt_backend *fake, const tt_backend *cpu) {
  *fake = *cpu;
  fake->ln_fwd = fake_ln_fwd, fake->ln_bwd = fake_ln_bwd, fake->attn_fwd = fake_attn_fwd, fake->attn_bwd = fake_attn_bwd;
  fake->tokens_fwd = fake_tok_fwd, fake->tokens_bwd = fake_tok_bwd;
  fake->token_pool_fwd = fake_pool_fwd, fake->token_pool_bwd = fake_pool_bwd;
}

static int vit_lower(tt_backend *be, int fused, const unsigned char *rec, int training, tt_model *m, tt_graph *g, tt_program *p,
                     tt_err *e) {
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  memset(p, 0, sizeof *p);
  pol.micro_batch = 2, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = training;
  pol.attn_fused = fused, pol.recompute = (unsigned char *)rec;
  return tt_lower(g, &pol, be, p, e) || tt_program_plan(p, e);
  (void)m;
}

static void test_vit(void) {
  tt_err e = {{0}};
  tt_model m;
  tt_graph g;
  tt_program p;
  memset(&m, 0, sizeof m);
  memset(&g, 0, sizeof g);
  memset(&p, 0, sizeof p);
  tt_backend *cpu = tt_cpu_backend_create(1), fake;
  TT_TEST_BEGIN("lower_vit_refused_without_backend_entries");
  if (!cpu || tt_recipe_parse("vit.recipe", vit_recipe, &m, &e, NULL, NULL) || tt_graph_build(&m, &g, &e)) {
    TT_CHECK(0, "setting up: %s", e.msg);
    if (cpu) cpu->destroy(cpu);
    return;
  }
  vit_fake(&fake, cpu);
  {
    tt_backend none = fake;
    none.attn_bwd = NULL;
    int rc = vit_lower(&none, 0, NULL, 1, &m, &g, &p, &e);
    TT_CHECK(rc != 0 && strstr(e.msg, "vit.recipe:12: [attention attn]:") && strstr(e.msg, "attn_fwd/attn_bwd"),
             "want a refusal naming vit.recipe:12 [attention attn] and attn_fwd/attn_bwd: %s", rc ? e.msg : "lowered");
    if (!rc) tt_program_free(&p);
    none = fake, none.tokens_fwd = NULL;
    rc = vit_lower(&none, 0, NULL, 1, &m, &g, &p, &e);
    TT_CHECK(rc != 0 && strstr(e.msg, "[patch_embed embed]"), "patch_embed: %s", rc ? e.msg : "lowered");
    if (!rc) tt_program_free(&p);
  }
  TT_TEST_END();

  TT_TEST_BEGIN("lower_vit_attention_steps_and_calls");
  for (int fused = 0; fused < 2; fused++) {
    if (vit_lower(&fake, fused, NULL, 1, &m, &g, &p, &e)) {
      TT_CHECK(0, "lowering: %s", e.msg);
      continue;
    }
    int f = find_step(&p, TT_S_FWD, 3, 0), b = find_step(&p, TT_S_BWD, 3, 0);
    TT_CHECK(f >= 0 && b > f, "attention steps fwd %d bwd %d", f, b);
    if (f < 0 || b < 0) {
      tt_program_free(&p);
      continue;
    }
    const tt_step *sf = &p.steps[f], *sb = &p.steps[b];
    /* qkv [2, 5, 24], o [2, 5, 8], lse [2, 2, 5] fp32, probs [2, 2, 5, 5] unless fused */
    TT_CHECK(p.bufs[sf->out[TT_AT_QKV]].bytes == 2 * 5 * 24 * 4 && p.bufs[sf->out[TT_AT_O]].bytes == 2 * 5 * 8 * 4,
             "qkv %zu o %zu bytes", p.bufs[sf->out[TT_AT_QKV]].bytes, p.bufs[sf->out[TT_AT_O]].bytes);
    TT_CHECK(p.bufs[sf->out[TT_AT_LSE]].bytes == 2 * 2 * 5 * 4, "lse %zu bytes", p.bufs[sf->out[TT_AT_LSE]].bytes);
    if (fused) {
      TT_CHECK(sf->out[TT_AT_PROBS] < 0 && sb->in[TT_AB_PROBS] < 0 && find_buf(&p, "attn.attn_probs") < 0, "fused: a probs buffer");
    } else {
      TT_CHECK(sf->out[TT_AT_PROBS] >= 0 && p.bufs[sf->out[TT_AT_PROBS]].bytes == 2 * 2 * 5 * 5 * 4 &&
                   sb->in[TT_AB_PROBS] == sf->out[TT_AT_PROBS],
               "kept probabilities: the forward's [2, 2, 5, 5] buffer read by backward");
    }
    TT_CHECK(p.n_attn == 1 && p.attn_probs_bytes == 2 * 2 * 5 * 5 * 4, "n_attn %d probs %zu", p.n_attn, p.attn_probs_bytes);
    /* backward reads what the forward kept: x, qkv, o, lse */
    TT_CHECK(sb->in[TT_AB_QKV] == sf->out[TT_AT_QKV] && sb->in[TT_AB_O] == sf->out[TT_AT_O] && sb->in[TT_AB_LSE] == sf->out[TT_AT_LSE] &&
                 sb->in[TT_BWD_SAVED] == sf->in[TT_FWD_X],
             "backward's saved operands are not the forward's");
    tt_call calls[TT_STEP_MAX_CALLS];
    int nc = tt_step_calls(&p, sf, 2, calls);
    TT_CHECK(nc == 3 && calls[0].fn == TT_OP_LINEAR_FWD && calls[1].fn == TT_OP_ATTN_FWD && calls[2].fn == TT_OP_LINEAR_FWD,
             "forward calls: %d", nc);
    if (nc == 3) {
      TT_CHECK(calls[0].op.u.linear.n == 10 && calls[0].op.u.linear.in == 8 && calls[0].op.u.linear.out == 24,
               "in-proj over n*t rows: %d x %d -> %d", calls[0].op.u.linear.n, calls[0].op.u.linear.in, calls[0].op.u.linear.out);
      const tt_attn_desc *ad = &calls[1].op.u.attn;
      TT_CHECK(ad->n == 2 && ad->t == 5 && ad->heads == 2 && ad->d == 4 && fabsf(ad->scale - 0.5f) < 1e-7f, "attn desc");
      TT_CHECK(calls[1].out[2] == (fused ? -1 : sf->out[TT_AT_PROBS]), "probs operand");
    }
    nc = tt_step_calls(&p, sb, 2, calls);
    TT_CHECK(nc == 5 && calls[2].fn == TT_OP_ATTN_BWD && calls[4].fn == TT_OP_LINEAR_BWD_DATA, "backward calls: %d", nc);
    tt_op_desc ops[TT_STEP_MAX_OPS];
    TT_CHECK(tt_step_backend_ops(&p, sb, 2, ops) == 5, "attention backward: 5 planned calls");
    /* per-token linear: rows = tokens */
    int l0 = find_step(&p, TT_S_FWD, 6, 0);
    nc = l0 >= 0 ? tt_step_calls(&p, &p.steps[l0], 2, calls) : 0;
    TT_CHECK(nc == 1 && calls[0].op.u.linear.n == 10 && calls[0].op.u.linear.in == 8 && calls[0].op.u.linear.out == 16,
             "mlp.0 over 10 token rows");
    /* layer norm statistics: [2 samples x 5 tokens] fp32 each */
    int ln = find_step(&p, TT_S_FWD, 2, 0);
    TT_CHECK(ln >= 0 && p.bufs[p.steps[ln].out[TT_BN_SAVE_MEAN]].bytes == 2 * 5 * 4, "ln statistics");
    nc = ln >= 0 ? tt_step_calls(&p, &p.steps[ln], 2, calls) : 0;
    TT_CHECK(nc == 1 && calls[0].fn == TT_OP_LN_FWD && calls[0].op.u.ln.rows == 10 && calls[0].op.u.ln.f == 8, "ln call");
    /* patch embed: conv then tokens; backward tokens_bwd then the conv's filter gradient (no dx: the image) */
    int pe = find_step(&p, TT_S_FWD, 1, 0), pb = find_step(&p, TT_S_BWD, 1, 0);
    nc = pe >= 0 ? tt_step_calls(&p, &p.steps[pe], 2, calls) : 0;
    TT_CHECK(nc == 2 && calls[0].fn == TT_OP_CONV_FWD && calls[0].op.u.conv.k == 8 && calls[0].op.u.conv.p == 2 &&
                 calls[1].fn == TT_CALL_TOKENS_FWD && calls[1].mode == 1 && calls[1].op.u.bn.hw == 4,
             "patch forward calls");
    nc = pb >= 0 ? tt_step_calls(&p, &p.steps[pb], 2, calls) : 0;
    TT_CHECK(nc == 2 && calls[0].fn == TT_CALL_TOKENS_BWD && calls[0].out[1] >= 0 && calls[0].out[2] >= 0 &&
                 calls[1].fn == TT_OP_CONV_BWD_FILTER,
             "patch backward calls: %d", nc);
    tt_program_free(&p);
  }
  TT_TEST_END();

  TT_TEST_BEGIN("lower_vit_recompute_and_units");
  {
    /* a transformer block is one recompute unit: embed | ln_1 .. res2 | pool | head */
    int unit_of[12];
    int nu = tt_recompute_units(&g, unit_of);
    TT_CHECK(nu == 5 && unit_of[2] == unit_of[9] && unit_of[4] == unit_of[5] && unit_of[1] != unit_of[2] &&
                 unit_of[10] != unit_of[9],
             "units: %d (ln_1 %d, res1 %d, ln_2 %d, res2 %d)", nu, unit_of[2], unit_of[4], unit_of[5], unit_of[9]);
    /* dropping the block's inside: attention is recomputed before its backward, with its own qkv */
    unsigned char rec[12] = {0};
    for (int v = 2; v <= 8; v++) rec[v] = 1;
    if (vit_lower(&fake, 0, rec, 1, &m, &g, &p, &e)) {
      TT_CHECK(0, "lowering: %s", e.msg);
    } else {
      int r = find_step(&p, TT_S_FWD, 3, TT_SF_RECOMPUTE), b = find_step(&p, TT_S_BWD, 3, 0);
      TT_CHECK(r >= 0 && b > r && p.steps[b].in[TT_AB_QKV] == p.steps[r].out[TT_AT_QKV] &&
                   p.steps[b].in[TT_AB_PROBS] == p.steps[r].out[TT_AT_PROBS],
               "attention recomputed at %d before its backward %d, which reads the recomputed qkv and probabilities", r, b);
      tt_program_free(&p);
    }
  }
  TT_TEST_END();

  TT_TEST_BEGIN("lower_vit_scheduler_agrees_on_saved_values");
  check_sched_agrees_on("vit.recipe", vit_recipe, &fake);
  TT_TEST_END();

  TT_TEST_BEGIN("lower_vit_eval_has_no_saves");
  if (vit_lower(&fake, 0, NULL, 0, &m, &g, &p, &e)) {
    TT_CHECK(0, "lowering: %s", e.msg);
  } else {
    int f = find_step(&p, TT_S_FWD, 3, 0);
    TT_CHECK(f >= 0 && p.steps[f].out[TT_AT_LSE] < 0 && p.steps[f].out[TT_AT_PROBS] < 0 && p.n_attn == 0,
             "evaluation keeps no lse or probabilities");
    tt_program_free(&p);
  }
  TT_TEST_END();
  tt_graph_free(&g);
  tt_model_free(&m);
  cpu->destroy(cpu);
}


/* The index of the first call of kind fn in p's list, or -1. */
static int first_call(const tt_program *p, int fn) {
  for (int i = 0; i < p->ncalls; i++)
    if (p->calls[i].fn == fn) return i;
  return -1;
}

/* A residual net for the batch norm + add + ReLU fusion (calls.c calls_fuse_triple): b2 -> a1 -> r2
 * and b3 -> a2 -> r3 are residual ends (r3 feeds only the global average pool: a compact plan
 * keeps its 1-bit mask); b4 feeds its add and a second add, so it stays apart. */
static const char *fuse_recipe =
    "[net]\ninput = 2x6x6\nclasses = 3\n[train]\nbatch = 4\noptimizer = sgd\nlr = 0.1\nmomentum = 0.9\n"
    "[conv c1]\nfilters = 2\nsize = 3\npad = 1\nbias = false\n[bn b1]\n[relu r1]\n"
    "[conv c2]\nfilters = 2\nsize = 3\npad = 1\nbias = false\n[bn b2]\n[add a1]\nfrom = b2, r1\n[relu r2]\n"
    "[conv c4]\nfilters = 2\nsize = 3\npad = 1\nbias = false\n[bn b4]\n[add a3]\nfrom = b4, r2\n[relu r4]\n"
    "[add a4]\nfrom = r4, b4\n"
    "[conv c3]\nfilters = 2\nsize = 3\npad = 1\nbias = false\n[bn b3]\n[add a2]\nfrom = b3, a4\n[relu r3]\n"
    "[gap g]\n[linear fc]\nout = 3\n";

/* fuse_open's recompute set (the program's policy points at it while the test holds it). */
static unsigned char fuse_rec[64];

/* Lowers and plans fuse_recipe on the CPU backend with plan_caps caps (planning only, nothing
 * runs); compact: the compact saves; rec: NULL, or the layers to recompute (comma-separated names,
 * at most 64 nodes). 0, or -1 with a failed check. */
static int fuse_open_rec(lw *t, int caps, int compact, const char *rec) {
  tt_err e = {{0}};
  tt_policy pol;
  memset(t, 0, sizeof *t);
  t->be = tt_cpu_backend_create(1);
  lw_offer(t->be, caps);
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 4, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1, pol.compact = compact;
  int bad = !t->be || tt_recipe_parse("fuse.recipe", fuse_recipe, &t->m, &e, NULL, NULL) || tt_graph_build(&t->m, &t->g, &e);
  if (!bad && rec) {
    memset(fuse_rec, 0, sizeof fuse_rec);
    for (int i = 0; i < t->g.nnodes && i < 64; i++) {
      const char *nm = t->g.nodes[i].L ? t->g.nodes[i].L->name : NULL, *at = nm ? strstr(rec, nm) : NULL;
      size_t len = nm ? strlen(nm) : 0;
      fuse_rec[i] = at && (at == rec || at[-1] == ',') && (at[len] == ',' || at[len] == 0);
    }
    pol.recompute = fuse_rec;
  }
  if (bad || tt_lower(&t->g, &pol, t->be, &t->p, &e) || tt_program_plan(&t->p, &e)) {
    TT_CHECK(0, "setting up: %s", t->be ? e.msg : "no CPU backend");
    lw_close(t);
    return -1;
  }
  return 0;
}

static int fuse_open(lw *t, int caps, int compact) { return fuse_open_rec(t, caps, compact, NULL); }

static int count_calls(const tt_program *p, int fn) {
  int n = 0;
  for (int i = 0; i < p->ncalls; i++) n += p->calls[i].fn == fn;
  return n;
}

/* The batch norm + add + ReLU fusion: where the backend offers it (plan_caps here), the two
 * residual ends become one call each way at the batch norm's place, their add and ReLU calls fused
 * away into it, reading the shortcut (forward) and the ReLU's y or, compact, its mask (backward,
 * mode 1); b4, read by a second add, stays apart; TINYTRAIN_FUSE=0 and a backend without the calls
 * fuse nothing. */
static void test_fuse_bn_add_relu(void) {
  TT_TEST_BEGIN("lower_bn_add_relu_fused");
  lw t;
  tt_err e;
  const int caps = TT_CAP_BN_ADD_RELU_FWD | TT_CAP_BN_ADD_RELU_BWD;
  for (int compact = 0; compact < 2; compact++) {
    if (fuse_open(&t, caps, compact)) break;
    const tt_program *p = &t.p;
    int f = count_calls(p, TT_CALL_BN_ADD_RELU_FWD), b = count_calls(p, TT_CALL_BN_ADD_RELU_BWD), masks = 0;
    TT_CHECK(f == 2 && b == 2 && p->n_fused == 4, "compact %d: %d forward and %d backward fused calls, %d in all (want 2, 2, 4)",
             compact, f, b, p->n_fused);
    for (int i = 0; i < p->ncalls; i++) {
      const tt_call *c = &p->calls[i];
      if (c->fn == TT_CALL_BN_ADD_RELU_FWD) {
        int add = p->steps[c->step + 1].node, k;
        TT_CHECK(t.g.nodes[p->steps[c->step].node].kind == TT_L_BN && c->in[5] >= 0 && c->out[0] == p->steps[c->step + 2].out[TT_FWD_Y],
                 "forward fused call %d: step %d, shortcut %d, y %d", i, c->step, c->in[5], c->out[0]);
        for (k = p->step_call[c->step + 1]; k < p->step_call[c->step + 3]; k++)
          if (p->calls[k].fn != TT_CALL_ACT_MASK)
            TT_CHECK(p->calls[k].skip == TT_CALL_FUSED_AWAY && p->calls[k].fused_into == i,
                     "the add and ReLU calls of node %d are not fused into call %d", add, i);
        TT_CHECK(strcmp(t.g.nodes[p->steps[c->step].node].L->name, "b4") != 0, "b4 (read by two adds) was fused");
      }
      if (c->fn == TT_CALL_BN_ADD_RELU_BWD) {
        masks += c->mode;
        TT_CHECK(c->in[1] >= 0 && c->in[2] >= 0 && c->out[0] >= 0 && c->out[3] >= 0 && c->beta_s == 0.0f,
                 "backward fused call %d: y %d, dy %d, dx %d, ds %d, beta_s %g", i, c->in[1], c->in[2], c->out[0], c->out[3],
                 (double)c->beta_s);
      }
    }
    TT_CHECK(masks == compact, "compact %d: %d fused backward calls read the ReLU's mask (want r3's alone with compact)",
             compact, masks);
    lw_close(&t);
  }
  /* c2 and c3 recomputed (b2's and b3's input), compact: each is rebuilt before r2's and r3's
   * backward, not between it and its batch norm's (lower.c lower_bn_input_early), so b3's three
   * backward steps stay adjacent and fuse, reading r3's 1-bit mask (kept to b3's step:
   * lower_passes.c). r2's full y may share bytes with b2's dx in a plan that recomputes: not
   * asserted. */
  if (!fuse_open_rec(&t, caps, 1, "c2,c3")) {
    const tt_program *p = &t.p;
    int masks = 0;
    for (int i = 0; i < p->ncalls; i++) masks += p->calls[i].fn == TT_CALL_BN_ADD_RELU_BWD && p->calls[i].mode == 1;
    TT_CHECK(p->n_recomputed_steps >= 2 && masks == 1,
             "c2, c3 recomputed (%d recompute steps): %d fused backward calls reading r3's mask (want 1)", p->n_recomputed_steps,
             masks);
    lw_close(&t);
  }
  if (!fuse_open(&t, 0, 0)) { /* the CPU backend without the calls */
    TT_CHECK(t.p.n_fused == 0 && first_call(&t.p, TT_CALL_BN_ADD_RELU_FWD) < 0, "no calls offered, yet %d fused", t.p.n_fused);
    lw_close(&t);
  }
  setenv("TINYTRAIN_FUSE", "0", 1);
  TT_CHECK(tt_knobs_init(&e) == 0, "TINYTRAIN_FUSE=0: %s", e.msg);
  if (!fuse_open(&t, caps, 0)) {
    TT_CHECK(t.p.n_fused == 0, "TINYTRAIN_FUSE=0 left %d fused calls", t.p.n_fused);
    lw_close(&t);
  }
  unsetenv("TINYTRAIN_FUSE");
  tt_knobs_init(&e);
  TT_TEST_END();
}

/* The final call list (core/compile/calls.c): every step resolved into its calls, contiguous per
 * step; the fusion table joins b1 + r1 forward and r1 + b1 backward where the backend offers the
 * fused calls (and TINYTRAIN_FUSE is not 0), the casts and updates become one many-tensor call
 * each where it offers those; without them the list is the steps' dispatch calls exactly. */
static void test_calls(void) {
  TT_TEST_BEGIN("lower_final_call_list_and_fusions");
  lw t;
  tt_err e;
  lw_caps = 0;
  if (lw_open(&t, 1, TT_F32, 1, NULL)) return;
  const tt_program *p = &t.p;
  int ok = p->step_call && p->step_call[0] == 0 && p->step_call[p->nsteps] == p->ncalls;
  for (int i = 0; ok && i < p->nsteps; i++) {
    tt_call tmp[TT_STEP_MAX_CALLS];
    int n = tt_step_calls(p, &p->steps[i], p->policy.micro_batch, tmp), have = p->step_call[i + 1] - p->step_call[i];
    int layer = p->steps[i].op == TT_S_FWD || p->steps[i].op == TT_S_BWD;
    ok = p->step_call[i] <= p->step_call[i + 1] && (layer ? have == n : have >= 1);
    for (int k = p->step_call[i]; ok && k < p->step_call[i + 1]; k++) ok = p->calls[k].step == i;
    TT_CHECK(ok, "step %d (%s): %d calls listed, dispatch makes %d", i, p->steps[i].name ? p->steps[i].name : "-", have, n);
  }
  TT_CHECK(p->n_fused == 0 && first_call(p, TT_CALL_BN_RELU_FWD) < 0 && first_call(p, TT_CALL_UPDATE_MULTI) < 0,
           "a backend without fused or many-tensor calls, yet the list has %d fused pairs", p->n_fused);
  lw_close(&t);

  lw_caps = TT_CAP_BN_RELU_FWD | TT_CAP_BN_RELU_BWD | TT_CAP_CAST_MULTI | TT_CAP_UPDATE_MULTI;
  if (!lw_open(&t, 1, TT_F32, 1, NULL)) {
    p = &t.p;
    int bf = find_step(p, TT_S_FWD, 2, 0), rf = find_step(p, TT_S_FWD, 3, 0);
    int rb = find_step(p, TT_S_BWD, 3, 0), bb = find_step(p, TT_S_BWD, 2, 0);
    int f = first_call(p, TT_CALL_BN_RELU_FWD), g = first_call(p, TT_CALL_BN_RELU_BWD), u = first_call(p, TT_CALL_UPDATE_MULTI);
    TT_CHECK(p->n_fused == 2 && f >= 0 && g >= 0, "fused pairs %d (want b1 + r1 forward and backward)", p->n_fused);
    if (f >= 0 && g >= 0 && bf >= 0 && rf >= 0 && rb >= 0 && bb >= 0) {
      const tt_call *rc = &p->calls[p->step_call[rf]], *rbc = &p->calls[p->step_call[rb]];
      TT_CHECK(p->calls[f].step == bf && rc->skip == TT_CALL_FUSED_AWAY && rc->fused_into == f,
               "forward: the fused call is at step %d (b1 is %d), r1's call skip %d into %d", p->calls[f].step, bf, rc->skip,
               rc->fused_into);
      TT_CHECK(p->calls[g].step == bb && rbc->skip == TT_CALL_FUSED_AWAY && rbc->fused_into == g &&
                   p->calls[g].in[1] == p->steps[rb].in[TT_BWD_DY] && p->calls[g].in[3] == p->param_buf[t.g.nodes[2].beta],
               "backward: the fused call reads dy %d (r1's is %d) and beta %d", p->calls[g].in[1], p->steps[rb].in[TT_BWD_DY],
               p->calls[g].in[3]);
    }
    TT_CHECK(u >= 0 && p->calls[u].nseg == 7 && u + 7 < p->ncalls && p->calls[u + 7].skip == TT_CALL_MEMBER &&
                 p->calls[u + 7].fn == TT_CALL_UPDATE,
             "the update: one update_multi over the 7 trainable tensors (at %d, %d of them)", u, u >= 0 ? p->calls[u].nseg : -1);
    lw_close(&t);
  }
  /* TINYTRAIN_FUSE=0: no fusion even where the backend has the calls */
  setenv("TINYTRAIN_FUSE", "0", 1);
  TT_CHECK(tt_knobs_init(&e) == 0, "TINYTRAIN_FUSE=0: %s", e.msg);
  if (!lw_open(&t, 1, TT_F32, 1, NULL)) {
    TT_CHECK(t.p.n_fused == 0 && first_call(&t.p, TT_CALL_UPDATE_MULTI) >= 0, "TINYTRAIN_FUSE=0 left %d fused pairs",
             t.p.n_fused);
    lw_close(&t);
  }
  unsetenv("TINYTRAIN_FUSE");
  tt_knobs_init(&e);
  /* fp16: the five weight copies cast by one cast_multi */
  if (!lw_open(&t, 1, TT_F16, 1, NULL)) {
    int c = first_call(&t.p, TT_CALL_CAST_MULTI);
    TT_CHECK(c >= 0 && t.p.calls[c].nseg == 5 && t.p.calls[c].op.dt == TT_F16, "cast_multi at %d over %d tensors", c,
             c >= 0 ? t.p.calls[c].nseg : -1);
    lw_close(&t);
  }
  lw_caps = 0;
  TT_TEST_END();
}

/* KRSC weight copies (core/compile/krsc.c; issue 41, item 2). nodes: 0 input, 1 c1 (the stem: x is
 * the NCHW image), 2 b1, 3 r1, 4 c2 (3x3), 5 r2, 6 c3 (1x1, bias), 7 a1, 8 g1 (global average pool,
 * reads NHWC), 9 f1, 10 fc: c1's y, b1 .. a1 are one NHWC group, so c2 and c3 are all-NHWC. */
static const char *krsc_recipe =
    "[net]\ninput = 3x8x8\nclasses = 3\n"
    "[train]\nbatch = 4\noptimizer = sgd\nlr = 0.1\n"
    "[conv c1]\nfilters = 8\nsize = 3\npad = 1\nbias = false\n"
    "[bn b1]\n[relu r1]\n"
    "[conv c2]\nfilters = 8\nsize = 3\npad = 1\nbias = false\n"
    "[relu r2]\n"
    "[conv c3]\nfilters = 8\nsize = 1\n"
    "[add a1]\nfrom = c3, r1\n"
    "[gap g1]\n[flatten f1]\n[linear fc]\nout = 3\n";

/* Lowers and plans krsc_recipe on the reference backend standing in for the CUDA one (NHWC for
 * 16-bit activations; caps as its plan_caps). 0, or -1 with the check failed. */
static int krsc_open(lw *t, int training, tt_dtype dt, int caps) {
  tt_err e = {{0}};
  memset(t, 0, sizeof *t);
  t->be = tt_ref_backend_create(1);
  if (t->be) t->be->layouts_16bit = 1u << TT_LAYOUT_NHWC, t->be->plan_caps = caps;
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 4, pol.accum_steps = 1, pol.act_dtype = dt, pol.training = training;
  if (!t->be || tt_recipe_parse("krsc.recipe", krsc_recipe, &t->m, &e, NULL, NULL) || tt_graph_build(&t->m, &t->g, &e) ||
      tt_lower(&t->g, &pol, t->be, &t->p, &e) || tt_program_plan(&t->p, &e)) {
    TT_CHECK(0, "setting up: %s", t->be ? e.msg : "no reference backend");
    lw_close(t);
    return -1;
  }
  return 0;
}

/* The copy buffer of parameter param, or -1. */
static int krsc_copy(const tt_program *p, int param) {
  for (int i = 0; i < p->nbufs; i++)
    if (p->bufs[i].param == param && p->bufs[i].cls == TT_BC_WEIGHT_COPIES) return i;
  return -1;
}

/* What the planner marks KRSC in an open program: each copy's flag, the convolutions' descs and
 * calls, the cast members' filter shape. want: 1 for c2 and c3, else none anywhere. */
static void krsc_expect(const lw *t, int want, const char *what) {
  const tt_program *p = &t->p;
  const tt_graph *g = &t->g;
  static const int conv[3] = {1, 4, 6};
  for (int k = 0; k < 3; k++) {
    const tt_node *n = &g->nodes[conv[k]];
    int b = krsc_copy(p, n->weight), w = want && k > 0;
    TT_CHECK(b >= 0 && p->bufs[b].krsc == w, "%s: %s's copy krsc %d (want %d)", what, n->L->name, b >= 0 ? p->bufs[b].krsc : -1, w);
    for (int si = 0; si < p->nsteps; si++) {
      const tt_step *s = &p->steps[si];
      if ((s->op != TT_S_FWD && s->op != TT_S_BWD) || s->node != conv[k]) continue;
      TT_CHECK(s->a.conv.layout_w == w, "%s: %s step %d layout_w %d (want %d)", what, n->L->name, si, s->a.conv.layout_w, w);
      for (int c = p->step_call[si]; c < p->step_call[si + 1]; c++) {
        const tt_call *cl = &p->calls[c];
        if (cl->fn > TT_OP_CONV_BWD_FILTER) continue;
        int wc = cl->fn == TT_OP_CONV_BWD_FILTER ? 0 : w; /* dw is the fp32 KCRS gradient */
        TT_CHECK(cl->op.u.conv.layout_w == wc, "%s: %s's %s layout_w %d (want %d)", what, n->L->name, tt_call_name(cl->fn),
                 cl->op.u.conv.layout_w, wc);
      }
    }
    for (int c = 0; c < p->ncalls; c++) {
      const tt_call *cl = &p->calls[c];
      if (cl->fn != TT_CALL_CAST || cl->out[0] != b) continue;
      int rs = w ? n->L->kh * n->L->kw : 0;
      TT_CHECK(cl->skip == TT_CALL_MEMBER && cl->filter_rs == rs && cl->filter_k == (w ? n->c : 0),
               "%s: %s's cast: member %d, k %d, r*s %d (want %d, %d)", what, n->L->name, cl->skip == TT_CALL_MEMBER,
               cl->filter_k, cl->filter_rs, w ? n->c : 0, rs);
    }
  }
  int b = krsc_copy(p, g->nodes[6].bias), f = krsc_copy(p, g->nodes[10].weight);
  TT_CHECK(b >= 0 && f >= 0 && !p->bufs[b].krsc && !p->bufs[f].krsc && p->n_krsc == (want ? 2 : 0),
           "%s: c3's bias copy krsc %d, fc's weight copy %d, %d KRSC copies (want %d)", what, b >= 0 ? p->bufs[b].krsc : -1,
           f >= 0 ? p->bufs[f].krsc : -1, p->n_krsc, want ? 2 : 0);
}

static void test_krsc(void) {
  TT_TEST_BEGIN("krsc_copies");
  const int caps = TT_CAP_CAST_MULTI | TT_CAP_FILTER_KRSC;
  lw t;
  tt_err e;
  if (!krsc_open(&t, 1, TT_F16, caps)) { /* bf16's rule is fp16's: every 16-bit dtype */
    krsc_expect(&t, 1, "fp16 training");
    /* a weight that another layer reads too keeps KRSC off for every reader: the same graph with
     * fc reading c2's weight (the decision alone: this graph is never lowered) */
    tt_graph g2 = t.g;
    tt_node *nodes = (tt_node *)malloc(sizeof(tt_node) * (size_t)t.g.nnodes);
    int *canon = (int *)malloc(sizeof(int) * (size_t)t.g.nnodes);
    unsigned char *krsc = (unsigned char *)malloc((size_t)t.g.nparams);
    if (nodes && canon && krsc) {
      memcpy(nodes, t.g.nodes, sizeof(tt_node) * (size_t)t.g.nnodes);
      for (int i = 0; i < t.g.nnodes; i++) canon[i] = i == 9 ? 8 : i; /* f1 is a view of g1 */
      g2.nodes = nodes;
      tt_krsc_plan(&g2, &t.p.policy, caps, 1, t.p.layout, canon, krsc);
      TT_CHECK(krsc[nodes[4].weight] && krsc[nodes[6].weight] && !krsc[nodes[1].weight], "alone: c2 %d, c3 %d, c1 %d",
               krsc[nodes[4].weight], krsc[nodes[6].weight], krsc[nodes[1].weight]);
      nodes[10].weight = nodes[4].weight;
      tt_krsc_plan(&g2, &t.p.policy, caps, 1, t.p.layout, canon, krsc);
      TT_CHECK(!krsc[nodes[4].weight] && krsc[nodes[6].weight], "c2's weight read by fc too: c2 %d (want 0), c3 %d",
               krsc[nodes[4].weight], krsc[nodes[6].weight]);
      nodes[10].weight = t.g.nodes[10].weight, nodes[2].gamma = nodes[6].weight; /* read as a batch norm's gamma */
      tt_krsc_plan(&g2, &t.p.policy, caps, 1, t.p.layout, canon, krsc);
      TT_CHECK(krsc[nodes[4].weight] && !krsc[nodes[6].weight], "c3's weight read by b1 too: c3 %d (want 0)",
               krsc[nodes[6].weight]);
    }
    free(nodes), free(canon), free(krsc);
    lw_close(&t);
  }
  if (!krsc_open(&t, 0, TT_BF16, caps)) { /* evaluation: the casts at each layer, still cast_multi's members */
    krsc_expect(&t, 1, "bf16 evaluation");
    lw_close(&t);
  }
  if (!krsc_open(&t, 1, TT_F32, caps)) { /* fp32 reads the masters */
    TT_CHECK(t.p.n_krsc == 0, "fp32: %d KRSC copies", t.p.n_krsc);
    lw_close(&t);
  }
  if (!krsc_open(&t, 1, TT_F16, TT_CAP_CAST_MULTI)) { /* a backend without filter_krsc */
    krsc_expect(&t, 0, "fp16 without TT_CAP_FILTER_KRSC");
    lw_close(&t);
  }
  setenv("TINYTRAIN_KRSC_CAST", "0", 1);
  TT_CHECK(tt_knobs_init(&e) == 0, "TINYTRAIN_KRSC_CAST=0: %s", e.msg);
  if (!krsc_open(&t, 1, TT_F16, caps)) {
    krsc_expect(&t, 0, "fp16 under TINYTRAIN_KRSC_CAST=0");
    lw_close(&t);
  }
  unsetenv("TINYTRAIN_KRSC_CAST");
  tt_knobs_init(&e);
  TT_TEST_END();
}

/* core/base/knobs.c: every TINYTRAIN_* variable read once; unknown names and malformed values are
 * refused with the variable's name; plan's list shows only the knobs that differ from the defaults. */
static void test_knobs(void) {
  TT_TEST_BEGIN("knobs_read_refuse_and_print");
  tt_knobs k;
  tt_err e;
  static const char *bad[][2] = {{"TINYTRAIN_FUSE", "2"},          {"TINYTRAIN_FUSE", ""},
                                 {"TINYTRAIN_LAYOUT", "NHWC"},     {"TINYTRAIN_CPU_CHUNK_BYTES", "0x10"},
                                 {"TINYTRAIN_CPU_CHUNK_BYTES", "-5"}, {"TINYTRAIN_DIST_TIMEOUT", "soon"},
                                 {"TINYTRAIN_LAYOUTS", "nhwc"},    {"TINYTRAIN_CUDA_PROFILE_STEP", "0"},
                                 {"TINYTRAIN_CUDA_PROFILE_STEP", "2K"}, {"TINYTRAIN_CUDA_PROFILE_STEP", "-1"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv(bad[i][0], bad[i][1], 1);
    int rc = tt_knobs_read(&k, &e);
    unsetenv(bad[i][0]);
    TT_CHECK(rc == -1 && strstr(e.msg, bad[i][0]), "%s='%s' was not refused by name: rc %d, '%s'", bad[i][0], bad[i][1], rc,
             rc ? e.msg : "");
  }
  setenv("TINYTRAIN_LAYOUTS", "nhwc", 1);
  tt_knobs_read(&k, &e);
  unsetenv("TINYTRAIN_LAYOUTS");
  TT_CHECK(strstr(e.msg, "did you mean TINYTRAIN_LAYOUT"), "a misspelt name gets no suggestion: %s", e.msg);
  setenv("TINYTRAIN_LAYOUT", "nchw", 1);
  setenv("TINYTRAIN_CPU_CHUNK_BYTES", "64K", 1);
  setenv("TINYTRAIN_DIST_TIMEOUT", "2.5", 1);
  setenv("TINYTRAIN_CUDA_PROFILE_STEP", "3", 1); /* a count: whole, from 1 */
  int rc = tt_knobs_read(&k, &e);
  unsetenv("TINYTRAIN_LAYOUT"), unsetenv("TINYTRAIN_CPU_CHUNK_BYTES"), unsetenv("TINYTRAIN_DIST_TIMEOUT");
  unsetenv("TINYTRAIN_CUDA_PROFILE_STEP");
  TT_CHECK(rc == 0 && k.be.layout == TT_LAYOUT_NCHW && k.be.cpu_chunk_bytes == 65536 && k.dist_timeout == 2.5 &&
               k.cuda_profile_step == 3,
           "well-formed values: rc %d layout %d chunk %zu timeout %g step %zu (%s)", rc, k.be.layout, k.be.cpu_chunk_bytes,
           k.dist_timeout, k.cuda_profile_step, rc ? e.msg : "");
  FILE *f = tmpfile();
  char text[512] = "";
  int n = f ? tt_knobs_print_changed(&k, f, "knobs:") : -1;
  if (f) {
    rewind(f);
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
  }
  TT_CHECK(n == 4 && strstr(text, "TINYTRAIN_LAYOUT=nchw") && strstr(text, "TINYTRAIN_CPU_CHUNK_BYTES=65536") &&
               strstr(text, "TINYTRAIN_DIST_TIMEOUT=2.5") && strstr(text, "TINYTRAIN_CUDA_PROFILE_STEP=3") &&
               !strstr(text, "TINYTRAIN_FUSE"),
           "%d changed knobs printed:\n%s", n, text);
  tt_knobs_default(&k);
  TT_CHECK(tt_knobs_print_changed(&k, stdout, "knobs:") == 0, "the defaults print as changed");
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("workspace_query_failure", "compile lower", test_workspace_query_failure),
  TT_TEST("counts", "compile lower", test_counts),
  TT_TEST("slots_and_args", "compile lower", test_slots_and_args),
  TT_TEST("liveness", "compile lower", test_liveness),
  TT_TEST("inplace", "compile lower", test_inplace),
  TT_TEST("recompute", "compile lower", test_recompute),
  TT_TEST("sched_agrees", "compile lower", test_sched_agrees),
  TT_TEST("size_overflow", "compile lower", test_size_overflow),
  TT_TEST("vit", "compile lower", test_vit),
  TT_TEST("calls", "compile lower calls", test_calls),
  TT_TEST("bn_add_relu_fused", "compile lower calls", test_fuse_bn_add_relu),
  TT_TEST("krsc_copies", "compile lower calls", test_krsc),
  TT_TEST("knobs", "base knobs", test_knobs),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
