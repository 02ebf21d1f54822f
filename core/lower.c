/* core/lower.c — differentiate and lower: forward graph + Policy -> Program.
 *
 * Forward steps run in recipe order; the loss op writes dlogits directly; backward runs in
 * reverse and writes each input's gradient (the first writer overwrites, later writers of a
 * fan-out add). Nodes marked for recompute lose their forward value after the forward pass;
 * a backward step that needs such a value re-runs the forward ops that produce it (from the
 * nearest kept values) into new buffers, just before it. In-place ops only *propose* to reuse
 * their input's storage (alias_of); arena/ accepts the alias only when the input is dead after
 * that op, so correctness never rests on the proposal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program.h"

typedef struct lower_ctx {
  const tt_graph *g;
  const tt_policy *pol;
  tt_backend *be;
  tt_program *p;
  tt_err *err;
  int *canon;     /* node -> node whose value it shares (flatten; dropout in evaluation) */
  int *cur_val;   /* node -> buffer now holding its value, -1 if dropped */
  int *cur_save;  /* node -> first of two buffers with batch-norm saved statistics */
  int *gbuf;      /* node -> gradient buffer, -1 until a consumer writes it */
  int *wcopy;     /* param -> fp16 copy buffer, -1 if not made yet in this micro-step */
} lower_ctx;

static int lower_grow(void **arr, int *cap, int need, size_t elem, tt_err *err) {
  if (need <= *cap) return 0;
  int nc = *cap ? *cap * 2 : 64;
  while (nc < need) nc *= 2;
  void *q = realloc(*arr, (size_t)nc * elem);
  if (!q) return tt_fail(err, "out of host memory growing the program to %d entries", nc);
  *arr = q;
  *cap = nc;
  return 0;
}

static int lower_buf(lower_ctx *c, const char *name, const char *suffix, size_t bytes, tt_dtype dt, tt_buf_class cls,
                     int persistent, int node, int param) {
  tt_program *p = c->p;
  if (lower_grow((void **)&p->bufs, &p->cap_bufs, p->nbufs + 1, sizeof(tt_buf), c->err)) return -1;
  tt_buf *b = &p->bufs[p->nbufs];
  memset(b, 0, sizeof *b);
  snprintf(b->name, sizeof b->name, "%s%s", name, suffix);
  b->bytes = bytes;
  b->dtype = dt;
  b->cls = cls;
  b->persistent = persistent;
  b->node = node;
  b->param = param;
  b->alias_of = -1;
  b->first = b->last = -1;
  return p->nbufs++;
}

static tt_step *lower_step(lower_ctx *c, tt_step_op op, int node, int flags) {
  tt_program *p = c->p;
  if (lower_grow((void **)&p->steps, &p->cap_steps, p->nsteps + 1, sizeof(tt_step), c->err)) return NULL;
  tt_step *s = &p->steps[p->nsteps++];
  memset(s, 0, sizeof *s);
  s->op = op;
  s->node = node;
  s->arg = -1;
  s->flags = flags;
  s->ws = -1;
  return s;
}

static size_t lower_act_bytes(const lower_ctx *c, int node) {
  return (size_t)c->pol->micro_batch * tt_node_numel(&c->g->nodes[node]) * tt_dtype_size(c->pol->act_dtype);
}

/* Workspace for a conv or linear node's forward (kind FWD) or backward (both kinds). */
static size_t lower_ws_bytes(const lower_ctx *c, int node, int backward) {
  const tt_node *n = &c->g->nodes[node];
  const tt_node *x = &c->g->nodes[c->canon[n->in[0]]];
  tt_backend *be = c->be;
  tt_dtype dt = c->pol->act_dtype;
  int mb = c->pol->micro_batch;
  if (n->kind == TT_L_CONV) {
    tt_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = mb, d.c = x->c, d.h = x->h, d.w = x->w, d.k = n->c, d.r = n->L->kh, d.s = n->L->kw;
    d.stride_h = n->L->sh, d.stride_w = n->L->sw, d.pad_h = n->L->ph, d.pad_w = n->L->pw, d.groups = n->groups;
    d.p = n->h, d.q = n->w;
    if (!backward) return be->conv_workspace(be, &d, dt, TT_WS_FWD);
    size_t a = be->conv_workspace(be, &d, dt, TT_WS_BWD_DATA), b = be->conv_workspace(be, &d, dt, TT_WS_BWD_FILTER);
    return a > b ? a : b;
  }
  if (n->kind == TT_L_LINEAR) {
    int in = (int)tt_node_numel(x);
    if (!backward) return be->linear_workspace(be, mb, in, n->c, dt, TT_WS_FWD);
    size_t a = be->linear_workspace(be, mb, in, n->c, dt, TT_WS_BWD_DATA);
    size_t b = be->linear_workspace(be, mb, in, n->c, dt, TT_WS_BWD_FILTER);
    return a > b ? a : b;
  }
  return 0;
}

static int lower_ws(lower_ctx *c, int node, int backward) {
  size_t bytes = lower_ws_bytes(c, node, backward);
  if (!bytes) return -1; /* no workspace */
  int b = lower_buf(c, c->g->model->layers[node].name, backward ? ".ws_bwd" : ".ws_fwd", bytes, TT_F32, TT_BC_WORKSPACE, 0,
                    node, -1);
  return b < 0 ? -2 : b;
}

/* The buffer an op reads for parameter `param`: the fp32 master, or under autocast an fp16
 * copy made once per micro-step at its first use. */
static int lower_weight(lower_ctx *c, int param) {
  const tt_param *pr = &c->g->params[param];
  if (c->pol->act_dtype == TT_F32 || !pr->half_copy) return c->p->param_buf[param];
  if (c->wcopy[param] >= 0) return c->wcopy[param];
  int b = lower_buf(c, pr->name, ".fp16", pr->numel * 2, TT_F16, TT_BC_WEIGHT_COPIES, 0, pr->node, param);
  if (b < 0) return -1;
  tt_step *s = lower_step(c, TT_S_CAST, pr->node, 0);
  if (!s) return -1;
  s->arg = param;
  s->in[s->nin++] = c->p->param_buf[param];
  s->out[s->nout++] = b;
  c->wcopy[param] = b;
  return b;
}

static int lower_value(lower_ctx *c, int node);

/* Emits the forward of `node` into a new value buffer; inputs must hold their values. */
static int lower_fwd(lower_ctx *c, int node, int flags) {
  const tt_graph *g = c->g;
  const tt_node *n = &g->nodes[node];
  const char *name = g->model->layers[node].name;
  int ins[TT_MAX_INPUTS];
  for (int k = 0; k < n->nin; k++) {
    ins[k] = lower_value(c, c->canon[n->in[k]]);
    if (ins[k] < 0) return -1;
  }
  int w = -1, b = -1;
  if (n->weight >= 0 && (w = lower_weight(c, n->weight)) < 0) return -1;
  if (n->bias >= 0 && (b = lower_weight(c, n->bias)) < 0) return -1;
  int ws = tt_op(n->kind)->workspace ? lower_ws(c, node, 0) : -1;
  if (ws < -1) return -1;
  int y = lower_buf(c, name, (flags & TT_SF_RECOMPUTE) ? ".recomputed" : "", lower_act_bytes(c, node), c->pol->act_dtype,
                    TT_BC_ACTIVATIONS, 0, node, -1);
  if (y < 0) return -1;
  if (c->pol->inplace && tt_op_fwd_inplace(n->L, c->pol->training)) c->p->bufs[y].alias_of = ins[0];
  tt_step *s;
  if (n->kind == TT_L_INPUT) {
    s = lower_step(c, TT_S_LOAD_INPUT, node, flags);
    if (!s) return -1;
    s->in[s->nin++] = c->p->input_u8;
    s->in[s->nin++] = c->p->labels; /* makes the labels live from the first step */
    s->out[s->nout++] = y;
    c->cur_val[node] = y;
    return y;
  }
  s = lower_step(c, TT_S_FWD, node, flags);
  if (!s) return -1;
  for (int k = 0; k < n->nin; k++) s->in[s->nin++] = ins[k];
  if (w >= 0) s->in[s->nin++] = w;
  if (b >= 0) s->in[s->nin++] = b;
  if (n->kind == TT_L_BN) {
    s->in[s->nin++] = c->p->param_buf[n->gamma];
    s->in[s->nin++] = c->p->param_buf[n->beta];
    s->in[s->nin++] = c->p->param_buf[n->rmean];
    s->in[s->nin++] = c->p->param_buf[n->rvar];
  }
  s->out[s->nout++] = y;
  if (n->kind == TT_L_BN && c->pol->training) {
    size_t sb = (size_t)n->c * sizeof(float);
    int m = lower_buf(c, name, ".save_mean", sb, TT_F32, TT_BC_ACTIVATIONS, 0, node, -1);
    int v = lower_buf(c, name, ".save_invstd", sb, TT_F32, TT_BC_ACTIVATIONS, 0, node, -1);
    if (m < 0 || v < 0) return -1;
    s = &c->p->steps[c->p->nsteps - 1]; /* lower_buf may not move steps, but be explicit */
    s->out[s->nout++] = m;
    s->out[s->nout++] = v;
    c->cur_save[node] = m;
  }
  s->ws = ws;
  if (flags & TT_SF_RECOMPUTE) c->p->n_recomputed_steps++;
  c->cur_val[node] = y;
  return y;
}

/* A buffer holding node's value now, recomputing it (and what it depends on) if dropped. */
static int lower_value(lower_ctx *c, int node) {
  if (c->cur_val[node] >= 0) return c->cur_val[node];
  return lower_fwd(c, node, TT_SF_RECOMPUTE);
}

static int lower_bwd(lower_ctx *c, int node) {
  const tt_graph *g = c->g;
  const tt_node *n = &g->nodes[node];
  int dy = c->gbuf[node];
  /* Saved tensors first: recomputation steps must precede this backward step. */
  const tt_op_traits *op = tt_op(n->kind);
  int saved[2] = {-1, -1};
  int nsaved = 0;
  if (op->bwd_reads & TT_READS_INPUT) saved[nsaved++] = lower_value(c, c->canon[n->in[0]]); /* conv/linear: x for dW */
  if (op->bwd_reads & TT_READS_OUTPUT) saved[nsaved++] = lower_value(c, node);
  for (int k = 0; k < nsaved; k++)
    if (saved[k] < 0) return -1;
  int save_stats = -1;
  if (n->kind == TT_L_BN) {
    if (c->cur_save[node] < 0 || c->cur_val[node] < 0) {
      /* statistics were dropped with the value: recompute the node itself */
      if (lower_fwd(c, node, TT_SF_RECOMPUTE) < 0) return -1;
    }
    save_stats = c->cur_save[node];
  }
  int w = (n->weight >= 0) ? lower_weight(c, n->weight) : -1;
  if (n->weight >= 0 && w < 0) return -1;
  int ws = op->workspace ? lower_ws(c, node, 1) : -1;
  if (ws < -1) return -1;
  tt_step *s = lower_step(c, TT_S_BWD, node, 0);
  if (!s) return -1;
  s->in[s->nin++] = dy;
  for (int k = 0; k < nsaved; k++) s->in[s->nin++] = saved[k];
  if (w >= 0) s->in[s->nin++] = w;
  if (n->kind == TT_L_BN) {
    s->in[s->nin++] = c->p->param_buf[n->gamma];
    s->in[s->nin++] = save_stats;
    s->in[s->nin++] = save_stats + 1;
  }
  s->ws = ws;
  /* input gradients, one per input (-1 when the input is the image: no gradient needed) */
  for (int k = 0; k < n->nin; k++) {
    int t = c->canon[n->in[k]];
    if (g->nodes[t].kind == TT_L_INPUT) {
      s->out[s->nout] = -1;
      s->out_beta[s->nout++] = 0;
      continue;
    }
    if (c->gbuf[t] < 0) {
      int gb = lower_buf(c, g->model->layers[t].name, ".grad", lower_act_bytes(c, t), c->pol->act_dtype, TT_BC_ACT_GRADS, 0,
                         t, -1);
      if (gb < 0) return -1;
      s = &c->p->steps[c->p->nsteps - 1];
      /* Elementwise backward may write dx over dy; for add only the last input may, after
       * the others have read dy. */
      if (c->pol->inplace && op->bwd_inplace && (n->kind != TT_L_ADD || k == n->nin - 1))
        c->p->bufs[gb].alias_of = dy;
      c->gbuf[t] = gb;
      s->out[s->nout] = gb;
      s->out_beta[s->nout++] = 0;
    } else {
      s->out[s->nout] = c->gbuf[t];
      s->out_beta[s->nout++] = 1;
    }
  }
  /* parameter gradients */
  int pids[2] = {-1, -1};
  if (n->kind == TT_L_BN) pids[0] = n->gamma, pids[1] = n->beta;
  else pids[0] = n->weight, pids[1] = n->bias;
  for (int k = 0; k < 2; k++) {
    if (pids[k] < 0) continue;
    s->out[s->nout] = c->p->grad_buf[pids[k]];
    s->out_beta[s->nout++] = 0;
  }
  return 0;
}

int tt_lower(const tt_graph *g, const tt_policy *pol, tt_backend *be, tt_program *p, tt_err *err) {
  memset(p, 0, sizeof *p);
  p->graph = g;
  p->policy = *pol;
  p->align = be->align ? be->align : 1;
  p->input_u8 = p->labels = p->stats = p->overflow_flag = -1;
  if (pol->micro_batch <= 0) return tt_fail(err, "micro-batch must be positive (got %d)", pol->micro_batch);
  int nn = g->nnodes, np = g->nparams;
  lower_ctx c;
  memset(&c, 0, sizeof c);
  c.g = g, c.pol = pol, c.be = be, c.p = p, c.err = err;
  int *ints = (int *)tt_malloc(sizeof(int) * (size_t)(5 * nn + 5 * np + 8), "lowering tables", err);
  if (!ints) return -1;
  for (int i = 0; i < 5 * nn + 5 * np + 8; i++) ints[i] = -1;
  c.canon = ints, c.cur_val = ints + nn, c.cur_save = ints + 2 * nn, c.gbuf = ints + 3 * nn;
  p->tables = ints;
  p->value_buf = ints + 4 * nn;
  c.wcopy = ints + 5 * nn;
  p->param_buf = ints + 5 * nn + np, p->grad_buf = ints + 5 * nn + 2 * np, p->m_buf = ints + 5 * nn + 3 * np;
  p->v_buf = ints + 5 * nn + 4 * np;
  for (int i = 0; i < nn; i++) {
    const tt_node *n = &g->nodes[i];
    c.canon[i] = tt_op_is_view(n->L, pol->training) ? c.canon[n->in[0]] : i;
  }
  const tt_model *m = g->model;
  /* persistent buffers: masters, gradients, optimizer state, in parameter order */
  for (int i = 0; i < np; i++) {
    const tt_param *pr = &g->params[i];
    size_t bytes = pr->numel * sizeof(float);
    if ((p->param_buf[i] = lower_buf(&c, pr->name, "", bytes, TT_F32, TT_BC_PARAMS, 1, pr->node, i)) < 0) goto fail;
    if (!pol->training || !pr->trainable) continue;
    if ((p->grad_buf[i] = lower_buf(&c, pr->name, ".grad", bytes, TT_F32, TT_BC_GRADS, 1, pr->node, i)) < 0) goto fail;
    int nstate = m->train.optimizer == TT_OPT_SGD ? (m->train.momentum != 0.0f) : 2;
    if (nstate >= 1 && (p->m_buf[i] = lower_buf(&c, pr->name, m->train.optimizer == TT_OPT_SGD ? ".momentum" : ".adam_m",
                                                bytes, TT_F32, TT_BC_OPTIMIZER, 1, pr->node, i)) < 0)
      goto fail;
    if (nstate >= 2 && (p->v_buf[i] = lower_buf(&c, pr->name, ".adam_v", bytes, TT_F32, TT_BC_OPTIMIZER, 1, pr->node, i)) < 0)
      goto fail;
  }
  if ((p->stats = lower_buf(&c, "loss_stats", "", 2 * sizeof(float), TT_F32, TT_BC_MISC, 1, -1, -1)) < 0) goto fail;
  if (pol->training && pol->act_dtype == TT_F16 &&
      (p->overflow_flag = lower_buf(&c, "overflow_flag", "", sizeof(int32_t), TT_F32, TT_BC_MISC, 1, -1, -1)) < 0)
    goto fail;
  /* transient: the uint8 batch and labels, uploaded before each micro-step */
  if ((p->input_u8 = lower_buf(&c, "input", ".u8", (size_t)pol->micro_batch * tt_node_numel(&g->nodes[0]), TT_F32,
                               TT_BC_ACTIVATIONS, 0, 0, -1)) < 0)
    goto fail;
  if ((p->labels = lower_buf(&c, "labels", "", (size_t)pol->micro_batch * sizeof(int32_t), TT_F32, TT_BC_ACTIVATIONS, 0, -1,
                             -1)) < 0)
    goto fail;
  /* forward */
  for (int i = 0; i < nn; i++) {
    if (c.canon[i] != i) continue;
    if (lower_fwd(&c, i, pol->training ? 0 : TT_SF_EVAL) < 0) goto fail;
    p->value_buf[i] = c.cur_val[i];
  }
  for (int i = 0; i < nn; i++) p->value_buf[i] = p->value_buf[c.canon[i]];
  {
    int last = c.canon[nn - 1];
    tt_step *s = lower_step(&c, TT_S_LOSS, last, pol->training ? 0 : TT_SF_EVAL);
    if (!s) goto fail;
    s->in[s->nin++] = c.cur_val[last];
    s->in[s->nin++] = p->labels;
    if (pol->training) {
      int gb = lower_buf(&c, m->layers[last].name, ".grad", lower_act_bytes(&c, last), pol->act_dtype, TT_BC_ACT_GRADS, 0,
                         last, -1);
      if (gb < 0) goto fail;
      s = &p->steps[p->nsteps - 1];
      s->out[s->nout++] = gb;
      c.gbuf[last] = gb;
    }
    s->out[s->nout++] = p->stats;
  }
  if (pol->training) {
    /* values of recomputed nodes are dropped after the forward pass */
    if (pol->recompute)
      for (int i = 0; i < nn; i++)
        if (pol->recompute[i] && c.canon[i] == i) c.cur_val[i] = -1; /* BN's saved statistics (2c floats) stay */
    for (int i = nn - 1; i >= 1; i--) {
      if (c.canon[i] != i || c.gbuf[i] < 0) continue;
      if (lower_bwd(&c, i) < 0) goto fail;
    }
  }
  p->micro_end = p->nsteps;
  if (pol->training) {
    if (p->overflow_flag >= 0) {
      tt_step *s = lower_step(&c, TT_S_CHECK, -1, 0);
      if (!s) goto fail;
      s->out[s->nout++] = p->overflow_flag;
    }
    for (int i = 0; i < np; i++) {
      if (p->grad_buf[i] < 0) continue;
      tt_step *s = lower_step(&c, TT_S_UPDATE, g->params[i].node, 0);
      if (!s) goto fail;
      s->arg = i;
      s->in[s->nin++] = p->grad_buf[i];
      s->out[s->nout++] = p->param_buf[i];
      if (p->m_buf[i] >= 0) s->out[s->nout++] = p->m_buf[i];
      if (p->v_buf[i] >= 0) s->out[s->nout++] = p->v_buf[i];
    }
  }
  /* liveness */
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
  /* A forward add proposed to write over its first input; if that input is read later,
   * propose another input that is dead after the add instead. */
  for (int si = 0; si < p->nsteps; si++) {
    const tt_step *s = &p->steps[si];
    if (s->op != TT_S_FWD || g->nodes[s->node].kind != TT_L_ADD) continue;
    tt_buf *y = &p->bufs[s->out[0]];
    if (y->alias_of < 0 || p->bufs[y->alias_of].last == si) continue;
    for (int j = 1; j < g->nodes[s->node].nin; j++)
      if (p->bufs[s->in[j]].last == si) {
        y->alias_of = s->in[j];
        break;
      }
  }
  for (int i = 0; i < p->nbufs; i++) {
    tt_buf *b = &p->bufs[i];
    if (b->persistent) b->first = 0, b->last = p->nsteps - 1;
    if (b->first < 0) b->first = b->last = 0; /* unused (e.g. labels of a net without loss) */
  }
  return 0;
fail:
  tt_program_free(p);
  return -1;
}
