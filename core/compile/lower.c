/* core/compile/lower.c — differentiate and lower: forward graph + Policy -> Program.
 *
 * Forward steps run in recipe order; the loss op writes dlogits directly; backward runs in
 * reverse and writes each input's gradient (the first writer overwrites, later writers of a
 * fan-out add). Nodes marked for recompute lose their forward value after the forward pass;
 * a backward step that needs such a value re-runs the forward ops that produce it (from the
 * nearest kept values) into new buffers, just before it. In-place ops only *propose* to reuse
 * their input's storage (alias_of); arena/ accepts the alias only when the input is dead after
 * that op, so correctness never rests on the proposal.
 *
 * Every step leaves here complete: its operands in the slots program.h names and its
 * arguments (descriptors, sizes, hyper-parameters) in tt_op_args, so the executor reads the
 * Program and nothing else. What an op's backward reads, whether it may run in place and
 * whether it is a view come from its row in core/compile/ops.c, the same row the scheduler reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decay.h"
#include "dispatch.h"
#include "../base/knobs.h"
#include "lower_int.h"
#include "offload.h"
#include "program.h"

typedef struct lower_ctx {
  const tt_graph *g;
  const tt_policy *pol;
  tt_backend *be;
  tt_program *p;
  tt_err *err;
  int *canon;     /* node -> node whose value it shares (a view: flatten; dropout in evaluation) */
  int *cur_val;   /* node -> buffer now holding its value, -1 if dropped */
  int *cur_save;  /* node -> first of two buffers with batch-norm saved statistics */
  int *gbuf;      /* node -> gradient buffer, -1 until a consumer writes it */
  int *wcopy;     /* param -> fp16/bf16 copy buffer, -1 if not made yet in this micro-step */
  unsigned char *krsc; /* param -> 1: its copy is cast KRSC and its convolutions read it so (krsc.c) */
  char *needs_grad; /* backward: node -> a trainable parameter at or before it (else no gradient flows in) */
  char *compact;  /* node -> 1: its forward writes a compact save its backward reads (TT_SF_COMPACT) */
  int *cur_cmp;   /* node -> the compact save's buffer, -1 if none */
  int too_large;  /* a buffer's size passed 2^64 bytes: tt_lower returns TT_ERR_TOO_LARGE */
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

/* A new buffer; bytes is SIZE_MAX when its size overflowed (tt_size_mul), which fails here,
 * naming the buffer, rather than wrapping to a small size. */
static int lower_buf(lower_ctx *c, const char *name, const char *suffix, size_t bytes, tt_dtype dt, tt_buf_class cls,
                     int persistent, int node, int param) {
  tt_program *p = c->p;
  if (bytes == SIZE_MAX) {
    c->too_large = 1;
    return tt_fail(c->err, "buffer '%s%s' at micro-batch %d needs more than 2^64 bytes; use a smaller micro-batch or a "
                   "smaller model", name, suffix, c->pol->micro_batch);
  }
  if (lower_grow((void **)&p->bufs, &p->cap_bufs, p->nbufs + 1, sizeof(tt_buf), c->err)) return -1;
  tt_buf *b = &p->bufs[p->nbufs];
  memset(b, 0, sizeof *b);
  /* name + suffix, cut to fit as snprintf would (this runs for every buffer of every candidate
   * the policy search lowers, where snprintf's format parsing was a tenth of the time) */
  size_t ln = strlen(name), ls = strlen(suffix), cap = sizeof b->name - 1;
  if (ln > cap) ln = cap;
  if (ls > cap - ln) ls = cap - ln;
  memcpy(b->name, name, ln);
  memcpy(b->name + ln, suffix, ls);
  b->name[ln + ls] = 0;
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

/* A new step with every operand slot empty (-1); node >= 0 names the layer it belongs to. */
static tt_step *lower_step(lower_ctx *c, tt_step_op op, int node, int flags) {
  tt_program *p = c->p;
  if (lower_grow((void **)&p->steps, &p->cap_steps, p->nsteps + 1, sizeof(tt_step), c->err)) return NULL;
  tt_step *s = &p->steps[p->nsteps++];
  memset(s, 0, sizeof *s);
  s->op = op;
  s->node = node;
  if (node >= 0) {
    s->kind = c->g->nodes[node].kind;
    s->name = c->g->model->layers[node].name;
  }
  s->arg = -1;
  s->flags = flags;
  if (node >= 0 && c->p->layout && (op == TT_S_FWD || op == TT_S_BWD)) {
    const tt_node *n = &c->g->nodes[node];
    int img = n->kind == TT_L_GAP ? c->canon[n->in[0]] : node; /* GAP: its input's layout */
    if (c->p->layout[img] == TT_LAYOUT_NHWC) s->flags |= TT_SF_NHWC;
    if (c->p->layout[img] == TT_LAYOUT_NCHW16C) s->flags |= TT_SF_NCHW16C;
  }
  s->ws = -1;
  for (int k = 0; k < TT_STEP_MAX_IO; k++) s->in[k] = s->out[k] = -1;
  return s;
}

/* Puts buffer b in slot k of the step's inputs (out = 0) or outputs (out = 1). */
static void lower_set(tt_step *s, int out, int k, int b) {
  int *slots = out ? s->out : s->in, *n = out ? &s->nout : &s->nin;
  slots[k] = b;
  if (*n < k + 1) *n = k + 1;
}

/* Bytes of a node's value or gradient at the micro-batch (SIZE_MAX: overflow, see lower_buf). */
static size_t lower_act_bytes(const lower_ctx *c, int node) {
  return tt_size_mul(tt_size_mul((size_t)c->pol->micro_batch, tt_node_numel(&c->g->nodes[node])),
                     tt_dtype_size(c->pol->act_dtype));
}

/* The node whose value a node's k-th input reads (views looked through). */
static const tt_node *lower_in(const lower_ctx *c, const tt_node *n, int k) { return &c->g->nodes[c->canon[n->in[k]]]; }

/* Whether pooling node n reads NHWC and writes NCHW (tt_pool_desc.y_nchw; lower_layout.c). */
static int lower_pool_y_nchw(const lower_ctx *c, const tt_node *n) {
  return c->p->layout[c->canon[n->in[0]]] == TT_LAYOUT_NHWC && c->p->layout[c->canon[n->layer]] != TT_LAYOUT_NHWC;
}

static void lower_conv_desc(const lower_ctx *c, const tt_node *n, tt_conv_desc *d) {
  const tt_node *x = lower_in(c, n, 0);
  memset(d, 0, sizeof *d);
  d->n = c->pol->micro_batch, d->c = x->c, d->h = x->h, d->w = x->w;
  d->k = n->c, d->r = n->L->kh, d->s = n->L->kw;
  d->stride_h = n->L->sh, d->stride_w = n->L->sw, d->pad_h = n->L->ph, d->pad_w = n->L->pw;
  d->groups = n->groups, d->p = n->h, d->q = n->w;
  d->layout_x = c->p->layout[c->canon[n->in[0]]], d->layout_y = c->p->layout[c->canon[n->layer]];
  if (n->weight >= 0 && c->krsc[n->weight]) d->layout_w = TT_FILTER_KRSC; /* its 16-bit copy, cast KRSC */
}

/* The operation arguments of a forward or backward step of node n. */
static void lower_args(const lower_ctx *c, const tt_node *n, tt_op_args *a) {
  const tt_node *x = n->nin ? lower_in(c, n, 0) : NULL;
  switch (n->kind) {
    case TT_L_CONV: lower_conv_desc(c, n, &a->conv); break;
    case TT_L_MAXPOOL:
    case TT_L_AVGPOOL: {
      tt_pool_desc *d = &a->pool;
      d->n = c->pol->micro_batch, d->c = x->c, d->h = x->h, d->w = x->w;
      d->kh = n->L->kh, d->kw = n->L->kw, d->stride_h = n->L->sh, d->stride_w = n->L->sw;
      d->pad_h = n->L->ph, d->pad_w = n->L->pw, d->p = n->h, d->q = n->w;
      d->layout = c->p->layout[c->canon[n->in[0]]]; /* x's; y is NCHW where the pooling ends an NHWC group */
      d->y_nchw = lower_pool_y_nchw(c, n);
      break;
    }
    case TT_L_LINEAR: /* per token over a token tensor's last dimension: rows = tokens */
      a->linear.in = x->tokens ? x->w : (int)tt_node_numel(x), a->linear.out = n->tokens ? n->w : n->c;
      a->linear.rows = x->tokens ? x->c : 1;
      break;
    case TT_L_LAYERNORM:
      a->ln.rows = x->tokens ? x->c : 1, a->ln.f = x->tokens ? x->w : x->c, a->ln.eps = n->L->eps;
      break;
    case TT_L_ATTENTION:
      a->attn.t = x->c, a->attn.f = x->w, a->attn.heads = n->L->heads, a->attn.causal = n->L->causal, a->attn.p = n->L->p;
      break;
    case TT_L_PATCH_EMBED: { /* the conv: kernel = stride = size, no padding; output [dim, h/size, w/size] */
      tt_conv_desc *d = &a->patch.conv;
      d->n = c->pol->micro_batch, d->c = x->c, d->h = x->h, d->w = x->w;
      d->k = n->L->filters, d->r = d->s = d->stride_h = d->stride_w = n->L->kh;
      d->groups = 1, d->p = x->h / n->L->kh, d->q = x->w / n->L->kh;
      a->patch.cls = n->L->class_token != 0;
      break;
    }
    case TT_L_TOKEN: a->token.t = x->c, a->token.f = x->w, a->token.mode = n->L->token_mode; break;
    case TT_L_BN: a->bn.c = n->c, a->bn.hw = n->h * n->w, a->bn.eps = n->L->eps, a->bn.momentum = n->L->momentum; break;
    case TT_L_GAP: a->gap.c = n->c, a->gap.hw = x->h * x->w, a->gap.h = x->h, a->gap.w = x->w; break;
    case TT_L_CONCAT:
      a->concat.c = n->c, a->concat.hw = n->h * n->w, a->concat.nin = n->nin;
      for (int k = 0; k < n->nin; k++) a->concat.cin[k] = c->g->nodes[n->in[k]].c;
      break;
    case TT_L_INPUT: {
      const tt_data_cfg *dc = &c->g->model->data;
      a->load.c = n->c, a->load.hw = n->h * n->w;
      memcpy(a->load.mean, dc->mean, sizeof a->load.mean);
      memcpy(a->load.std, dc->std, sizeof a->load.std);
      break;
    }
    default: /* relu, relu6, silu, dropout, add */
      a->eltwise.numel = tt_node_numel(n), a->eltwise.p = n->L->p;
      break;
  }
}

/* The step's workspace buffer (the largest any of its backend calls asks for, the calls being
 * those the executor will make: dispatch.h), or none. A
 * failed query (TT_WS_ERROR) is an error naming the layer: planning it as 0 bytes would fail at
 * run time. */
static int lower_ws(lower_ctx *c, tt_step *s) {
  tt_backend *be = c->be;
  tt_op_desc ops[TT_STEP_MAX_OPS];
  int n = tt_step_backend_ops(c->p, s, c->pol->micro_batch, ops);
  size_t bytes = 0;
  for (int k = 0; k < n; k++) {
    size_t w;
    if (be->op_workspace) {
      w = be->op_workspace(be, &ops[k]);
    } else if (ops[k].kind <= TT_OP_CONV_BWD_FILTER) { /* a backend without the generic query */
      w = be->conv_workspace(be, &ops[k].u.conv, ops[k].dt, (tt_ws_kind)(ops[k].kind - TT_OP_CONV_FWD));
    } else if (ops[k].kind <= TT_OP_LINEAR_BWD_FILTER) {
      const tt_linear_desc *l = &ops[k].u.linear;
      w = be->linear_workspace(be, l->n, l->in, l->out, ops[k].dt, (tt_ws_kind)(ops[k].kind - TT_OP_LINEAR_FWD));
    } else {
      w = 0;
    }
    if (w == TT_WS_ERROR) {
      const tt_layer *L = &c->g->model->layers[s->node];
      const char *msg = be->last_error ? be->last_error(be) : NULL;
      return tt_fail(c->err, "%s:%d: layer '%s': the %s backend could not size its %s workspace at micro-batch %d (%s): %s",
                     c->g->model->path, L->line, L->name, be->name, s->op == TT_S_BWD ? "backward" : "forward",
                     c->pol->micro_batch, tt_dtype_name(c->pol->act_dtype), msg && *msg ? msg : "no reason given");
    }
    if (w > bytes) bytes = w;
  }
  s->ws = -1;
  if (!bytes) return 0;
  int b = lower_buf(c, s->name ? s->name : "step", s->op == TT_S_BWD ? ".ws_bwd" : ".ws_fwd", bytes, TT_F32, TT_BC_WORKSPACE,
                    0, s->node, -1);
  if (b < 0) return -1;
  s->ws = b;
  return 0;
}

/* Whether parameter `param`'s fp32 master is held in pinned host memory (policy.offload 2,
 * core/compile/offload.h): a trainable weight read through a 16-bit copy. In a training program its
 * gradient is planned (a frozen weight stays on the device); an evaluation program planned beside
 * one asks the same of the graph (grad_buf is planned where trainable). */
static int lower_master_host(const lower_ctx *c, int param) {
  const tt_param *pr = &c->g->params[param];
  if (c->pol->offload != 2 || c->pol->act_dtype == TT_F32 || !pr->half_copy) return 0;
  return c->pol->training ? c->p->grad_buf[param] >= 0 : pr->trainable;
}

/* The buffer an op reads for parameter `param` (-1: none): the fp32 master, or under
 * autocast an fp16 or bf16 copy (the activations' dtype) made once per micro-step at its first
 * use; under offload 2 a master on the host has a persistent copy instead, made by no step of the
 * micro-step (lower_update casts it after each update, the executor whenever the master is set:
 * offload_exec.c). -2 on error. */
static int lower_weight(lower_ctx *c, int param) {
  if (param < 0) return -1;
  const tt_param *pr = &c->g->params[param];
  if (c->pol->act_dtype == TT_F32 || !pr->half_copy) return c->p->param_buf[param];
  if (c->wcopy[param] >= 0) return c->wcopy[param];
  tt_dtype hdt = c->pol->act_dtype;
  if (lower_master_host(c, param)) {
    int pb = lower_buf(c, pr->name, hdt == TT_BF16 ? ".bf16" : ".fp16", tt_size_mul(pr->numel, 2), hdt, TT_BC_WEIGHT_COPIES, 1,
                       pr->node, param);
    if (pb < 0) return -2;
    c->p->bufs[pb].krsc = c->krsc[param];
    return c->wcopy[param] = pb;
  }
  int b = lower_buf(c, pr->name, hdt == TT_BF16 ? ".bf16" : ".fp16", tt_size_mul(pr->numel, 2), hdt, TT_BC_WEIGHT_COPIES, 0,
                    pr->node, param);
  if (b < 0) return -2;
  c->p->bufs[b].krsc = c->krsc[param];
  tt_step *s = lower_step(c, TT_S_CAST, pr->node, 0);
  if (!s) return -2;
  s->arg = param;
  s->a.count = pr->numel;
  lower_set(s, 0, TT_CAST_SRC, c->p->param_buf[param]);
  lower_set(s, 1, TT_CAST_DST, b);
  c->wcopy[param] = b;
  return b;
}

static int lower_value(lower_ctx *c, int node);

/* The image batch: u8 staging and labels in, the normalised input out. */
static int lower_load(lower_ctx *c, int node, int y, int flags) {
  tt_step *s = lower_step(c, TT_S_LOAD_INPUT, node, flags);
  if (!s) return -1;
  lower_args(c, &c->g->nodes[node], &s->a);
  lower_set(s, 0, TT_LOAD_U8, c->p->input_u8);
  lower_set(s, 0, TT_LOAD_LABELS, c->p->labels); /* makes the labels live from the first step */
  lower_set(s, 1, TT_LOAD_X, y);
  c->cur_val[node] = y;
  return y;
}

/* Emits the forward of `node` into a new value buffer; inputs must hold their values. */
static int lower_fwd(lower_ctx *c, int node, int flags) {
  const tt_graph *g = c->g;
  const tt_node *n = &g->nodes[node];
  int ins[TT_MAX_INPUTS];
  for (int k = 0; k < n->nin; k++)
    if ((ins[k] = lower_value(c, c->canon[n->in[k]])) < 0) return -1;
  int w = lower_weight(c, n->weight), b = lower_weight(c, n->bias);
  int ow = lower_weight(c, n->out_w), ob = lower_weight(c, n->out_b); /* attention's out-proj */
  if (w < -1 || b < -1 || ow < -1 || ob < -1) return -1;
  int y = lower_buf(c, g->model->layers[node].name, (flags & TT_SF_RECOMPUTE) ? ".recomputed" : "", lower_act_bytes(c, node),
                    c->pol->act_dtype, TT_BC_ACTIVATIONS, 0, node, -1);
  if (y < 0) return -1;
  if (c->pol->inplace && tt_op_fwd_inplace(n->L, c->pol->training)) c->p->bufs[y].alias_of = ins[0];
  if (n->kind == TT_L_INPUT) return lower_load(c, node, y, flags);
  int save = -1, tmp = -1;
  const char *lname = g->model->layers[node].name;
  /* A recomputed batch norm whose forward statistics are still held (they stay until its backward)
   * normalises with them (bn_apply) on a backend that has the entry: no new statistics, and y bit
   * for bit the forward's. */
  int apply = n->kind == TT_L_BN && c->pol->training && (flags & TT_SF_RECOMPUTE) && c->cur_save[node] >= 0 &&
              c->be->bn_apply != NULL;
  if (apply) flags |= TT_SF_BN_APPLY;
  if ((n->kind == TT_L_BN || n->kind == TT_L_LAYERNORM) && c->pol->training && !apply) {
    /* batch norm: [c] per channel; layer norm: one per row, [N, t] */
    size_t sb = n->kind == TT_L_BN ? (size_t)n->c * sizeof(float)
                                    : tt_size_mul((size_t)c->pol->micro_batch, (size_t)(n->tokens ? n->c : 1) * sizeof(float));
    /* A batch norm that backward rebuilds from these (bn_apply) keeps them from its forward to
     * its backward, past its recompute: small ([c] each) and long-lived, placed among the large
     * transient values they fragmented the arena (ResNet-50 mb 16 with every unit recomputed:
     * 711 MiB against a 698 MiB lower bound, 1.019), so they sit with the persistent buffers,
     * at the bottom: 0.2 MiB there for ResNet-50 (c summed over 53 batch norms, x 8 bytes). */
    int keep = n->kind == TT_L_BN && c->be->bn_apply && c->pol->recompute && c->pol->recompute[node] &&
               !(flags & TT_SF_RECOMPUTE);
    save = lower_buf(c, lname, ".save_mean", sb, TT_F32, TT_BC_ACTIVATIONS, keep, node, -1);
    if (save < 0 || lower_buf(c, lname, ".save_invstd", sb, TT_F32, TT_BC_ACTIVATIONS, keep, node, -1) < 0) return -1;
  }
  if (n->kind == TT_L_ATTENTION) {
    /* qkv [N, t, 3f] and o [N, t, f] (dt): backward reads both when training, so they are made in
     * this order, with lse [N, heads, t] fp32 and the probabilities [N, heads, t, t] dt (unless
     * the fused form) after them: save, save+1, save+2, save+3 (lower_bwd counts on it) */
    size_t es = tt_dtype_size(c->pol->act_dtype), mb = (size_t)c->pol->micro_batch, t = (size_t)n->c, f = (size_t)n->w;
    size_t hd = (size_t)n->L->heads;
    int rec = (flags & TT_SF_RECOMPUTE) != 0;
    save = lower_buf(c, lname, rec ? ".qkv.recomputed" : ".qkv", tt_size_mul(tt_size_mul(mb * es, t), 3 * f), c->pol->act_dtype,
                     TT_BC_ACTIVATIONS, 0, node, -1);
    if (save < 0 || lower_buf(c, lname, rec ? ".attn_out.recomputed" : ".attn_out", tt_size_mul(tt_size_mul(mb * es, t), f),
                              c->pol->act_dtype, TT_BC_ACTIVATIONS, 0, node, -1) < 0)
      return -1;
    if (c->pol->training) {
      if (lower_buf(c, lname, ".lse", tt_size_mul(tt_size_mul(mb, hd), t * sizeof(float)), TT_F32, TT_BC_ACTIVATIONS, 0, node,
                    -1) < 0)
        return -1;
      if (!c->pol->attn_fused) {
        size_t pb = tt_size_mul(tt_size_mul(tt_size_mul(mb * es, hd), t), t);
        if (lower_buf(c, lname, rec ? ".attn_probs.recomputed" : ".attn_probs", pb, c->pol->act_dtype, TT_BC_ACTIVATIONS, 0,
                      node, -1) < 0)
          return -1;
        if (!rec) c->p->attn_probs_bytes += pb;
      } else if (!rec) {
        c->p->attn_probs_bytes += tt_size_mul(tt_size_mul(tt_size_mul(mb * es, hd), t), t); /* what it avoids */
      }
      if (!rec) c->p->n_attn++;
    }
  }
  if (n->kind == TT_L_PATCH_EMBED) { /* the conv's output [N, dim, hw], read by the token step only */
    size_t hw = (size_t)(n->c - (n->cls ? 1 : 0));
    tmp = lower_buf(c, lname, ".conv", tt_size_mul(tt_size_mul((size_t)c->pol->micro_batch, hw * (size_t)n->w),
                                                   tt_dtype_size(c->pol->act_dtype)),
                    c->pol->act_dtype, TT_BC_ACTIVATIONS, 0, node, -1);
    if (tmp < 0) return -1;
  }
  int cmp = -1;
  if (c->compact[node] && !(flags & (TT_SF_RECOMPUTE | TT_SF_EVAL))) {
    size_t count = tt_size_mul((size_t)c->pol->micro_batch, tt_node_numel(n)); /* mask: elements of y; index: of y too */
    size_t cb = n->kind == TT_L_MAXPOOL ? count : (count == SIZE_MAX ? SIZE_MAX : tt_act_mask_bytes(count));
    const char *suffix = n->kind == TT_L_MAXPOOL ? ".argmax_u8" : ".mask_1bit";
    if (n->kind == TT_L_CONV) { /* a lossy copy of the input x */
      static const char *const sfx[4] = {"", ".x_fp16", ".x_bf16", ".x_int8"};
      const tt_node *x = lower_in(c, n, 0);
      size_t xc = tt_size_mul((size_t)c->pol->micro_batch, tt_node_numel(x));
      cb = xc == SIZE_MAX ? SIZE_MAX : tt_saved_bytes((tt_save_fmt)c->pol->compress, (size_t)c->pol->micro_batch, (size_t)x->c,
                                                      (size_t)x->h * (size_t)x->w);
      suffix = sfx[c->pol->compress & 3];
    }
    cmp = lower_buf(c, g->model->layers[node].name, suffix, cb, TT_F32, TT_BC_ACTIVATIONS, 0, node, -1);
    if (cmp < 0) return -1;
    c->p->n_compact++;
    c->p->compact_bytes += cb;
    /* the tensor backward would otherwise keep: relu's y, the max pool's or the conv's x */
    size_t full = n->kind == TT_L_RELU || n->kind == TT_L_RELU6 ? lower_act_bytes(c, node) : lower_act_bytes(c, c->canon[n->in[0]]);
    c->p->compact_full_bytes += full;
    if (n->kind == TT_L_CONV) c->p->n_compressed++, c->p->compressed_bytes += cb, c->p->compressed_full_bytes += full;
    flags |= TT_SF_COMPACT;
  }
  tt_step *s = lower_step(c, TT_S_FWD, node, flags);
  if (!s) return -1;
  lower_args(c, n, &s->a);
  for (int k = 0; k < n->nin; k++) lower_set(s, 0, k, ins[k]);
  if (cmp >= 0) {
    lower_set(s, 1, TT_FWD_COMPACT, cmp);
    c->cur_cmp[node] = cmp;
  }
  if (n->kind == TT_L_CONV || n->kind == TT_L_LINEAR || n->kind == TT_L_PATCH_EMBED || n->kind == TT_L_ATTENTION) {
    lower_set(s, 0, TT_FWD_W, w);
    lower_set(s, 0, TT_FWD_B, b);
  }
  if (n->kind == TT_L_PATCH_EMBED) { /* class token and position embedding: fp32 masters */
    lower_set(s, 0, TT_PE_CLS, n->cls_tok >= 0 ? c->p->param_buf[n->cls_tok] : -1);
    lower_set(s, 0, TT_PE_POS, n->pos_emb >= 0 ? c->p->param_buf[n->pos_emb] : -1);
    lower_set(s, 1, TT_PE_CONV, tmp);
  } else if (n->kind == TT_L_ATTENTION) {
    lower_set(s, 0, TT_AT_OUT_W, ow);
    lower_set(s, 0, TT_AT_OUT_B, ob);
    lower_set(s, 1, TT_AT_QKV, save);
    lower_set(s, 1, TT_AT_O, save + 1);
    if (c->pol->training) {
      lower_set(s, 1, TT_AT_LSE, save + 2);
      lower_set(s, 1, TT_AT_PROBS, c->pol->attn_fused ? -1 : save + 3);
    }
    c->cur_save[node] = save;
  } else if (n->kind == TT_L_BN || n->kind == TT_L_LAYERNORM) {
    lower_set(s, 0, TT_BN_GAMMA, c->p->param_buf[n->gamma]);
    lower_set(s, 0, TT_BN_BETA, c->p->param_buf[n->beta]);
    if (apply) { /* the forward's statistics, kept alive until this step by reading them here */
      lower_set(s, 0, TT_BN_RMEAN, -1);
      lower_set(s, 0, TT_BN_RVAR, -1);
      lower_set(s, 0, TT_BN_APPLY_MEAN, c->cur_save[node]);
      lower_set(s, 0, TT_BN_APPLY_INVSTD, c->cur_save[node] + 1);
      c->p->n_bn_applied++;
    } else if (n->kind == TT_L_BN) { /* layer norm keeps no running statistics */
      lower_set(s, 0, TT_BN_RMEAN, c->p->param_buf[n->rmean]);
      lower_set(s, 0, TT_BN_RVAR, c->p->param_buf[n->rvar]);
    }
  }
  lower_set(s, 1, TT_FWD_Y, y);
  if (save >= 0 && n->kind != TT_L_ATTENTION) {
    lower_set(s, 1, TT_BN_SAVE_MEAN, save);
    lower_set(s, 1, TT_BN_SAVE_INVSTD, save + 1);
    c->cur_save[node] = save;
  }
  if (lower_ws(c, s)) return -1;
  if (flags & TT_SF_RECOMPUTE) c->p->n_recomputed_steps++;
  c->cur_val[node] = y;
  return y;
}

/* A buffer holding node's value now, recomputing it (and what it depends on) if dropped. */
static int lower_value(lower_ctx *c, int node) {
  if (c->cur_val[node] >= 0) return c->cur_val[node];
  return lower_fwd(c, node, TT_SF_RECOMPUTE);
}

/* The gradient outputs of backward step s (slots 0..nin-1), one per input of n: a new
 * buffer for the first writer, the existing one (added into) for later writers of a fan-out,
 * none (-1) for the image. */
static int lower_input_grads(lower_ctx *c, int node, tt_step **sp) {
  const tt_node *n = &c->g->nodes[node];
  for (int k = 0; k < n->nin; k++) {
    int t = c->canon[n->in[k]];
    tt_step *s = *sp;
    /* no gradient into the image, nor into a frozen prefix (nothing trainable at or before it)
     * where the consumer can leave dx out: conv and linear skip backward-data, add the output */
    if (c->g->nodes[t].kind == TT_L_INPUT ||
        (!c->needs_grad[t] && (n->kind == TT_L_CONV || n->kind == TT_L_LINEAR || n->kind == TT_L_ADD ||
                               n->kind == TT_L_ATTENTION || n->kind == TT_L_PATCH_EMBED))) {
      lower_set(s, 1, k, -1);
      continue;
    }
    if (c->gbuf[t] >= 0) {
      lower_set(s, 1, k, c->gbuf[t]);
      s->out_beta[k] = 1;
      continue;
    }
    int gb = lower_buf(c, c->g->model->layers[t].name, ".grad", lower_act_bytes(c, t), c->pol->act_dtype, TT_BC_ACT_GRADS, 0,
                       t, -1);
    if (gb < 0) return -1;
    *sp = s = &c->p->steps[c->p->nsteps - 1];
    /* Elementwise backward may write dx over dy; for add only the last input may, after
     * the others have read dy. */
    if (c->pol->inplace && tt_op(n->kind)->bwd_inplace && (n->kind != TT_L_ADD || k == n->nin - 1))
      c->p->bufs[gb].alias_of = s->in[TT_BWD_DY];
    c->gbuf[t] = gb;
    lower_set(s, 1, k, gb);
  }
  return 0;
}

/* A ReLU that ends batch norm -> ReLU or batch norm -> add -> ReLU (the residual block's end),
 * where calls.c may fuse their backward steps into one call (bn_bwd_relu, bn_bwd_add_relu): the
 * batch norm's input, when the policy dropped it, is rebuilt before the ReLU's backward step, not
 * between that step and the batch norm's, which would part the steps the fusion needs adjacent.
 * Same recompute steps, same values, two or three steps earlier; the arena plans the result as
 * it plans any program. 0, or -1 when the recompute cannot be lowered. */
static int lower_bn_input_early(lower_ctx *c, int node) {
  const tt_graph *g = c->g;
  const tt_node *n = &g->nodes[node];
  if (n->kind != TT_L_RELU || n->nin != 1 || !(c->p->caps & (TT_CAP_BN_RELU_BWD | TT_CAP_BN_ADD_RELU_BWD))) return 0;
  int a = c->canon[n->in[0]], bn = g->nodes[a].kind == TT_L_BN ? a : -1, k_bn;
  for (int k = 0; k < 2 && g->nodes[a].kind == TT_L_ADD && g->nodes[a].nin == 2; k++) {
    int in = g->nodes[a].in[k]; /* the later one: its backward step follows the add's (a downsampling
                                 * block adds two batch norms; calls.c fuses the shortcut's) */
    if (in > bn && tt_graph_bn_add_relu(g, in, a, node, &k_bn)) bn = in;
  }
  if (bn < 0 || g->nodes[bn].nconsumers != 1 || !c->needs_grad[bn]) return 0; /* frozen: no backward of its own */
  int x = c->canon[g->nodes[bn].in[0]];
  return c->cur_val[x] >= 0 || lower_value(c, x) >= 0 ? 0 : -1;
}

static int lower_bwd(lower_ctx *c, int node) {
  const tt_node *n = &c->g->nodes[node];
  const tt_op_traits *op = tt_op(n->kind);
  if (lower_bn_input_early(c, node)) return -1;
  /* Saved tensors first: recomputation steps must precede this backward step. */
  int saved = -1, compact = c->cur_cmp[node] >= 0;
  if (compact) saved = c->cur_cmp[node]; /* the mask or index the forward wrote */
  else if (op->bwd_reads & TT_READS_INPUT) saved = lower_value(c, c->canon[n->in[0]]); /* conv/linear: x for dW */
  else if (op->bwd_reads & TT_READS_OUTPUT) saved = lower_value(c, node);
  if (op->bwd_reads && saved < 0) return -1;
  if ((n->kind == TT_L_BN && (c->cur_save[node] < 0 || (c->cur_val[node] < 0 && !c->be->bn_apply))) ||
      ((n->kind == TT_L_LAYERNORM || n->kind == TT_L_ATTENTION) && c->cur_save[node] < 0)) {
    /* statistics (attention: qkv, o, lse, probabilities) were dropped with the value: recompute
     * the node itself. A batch norm's stay (lower_backward), and its backward reads x and them, not
     * y: with bn_apply nothing is rebuilt for it. Without the entry the node is still re-run (as
     * before issue 26: its fresh statistics replace the forward's, bit for bit the same). */
    if (lower_fwd(c, node, TT_SF_RECOMPUTE) < 0) return -1;
  }
  int w = lower_weight(c, n->weight), ow = lower_weight(c, n->out_w);
  if (w < -1 || ow < -1) return -1;
  /* gradients of the step's own intermediates, live in this step only: patch_embed's conv
   * output; attention's o and qkv */
  int t0 = -1, t1 = -1;
  const char *lname = c->g->model->layers[node].name;
  size_t es = tt_dtype_size(c->pol->act_dtype), mb = (size_t)c->pol->micro_batch;
  if (n->kind == TT_L_PATCH_EMBED &&
      (t0 = lower_buf(c, lname, ".conv.grad", tt_size_mul(tt_size_mul(mb * es, (size_t)(n->c - (n->cls ? 1 : 0))), (size_t)n->w),
                      c->pol->act_dtype, TT_BC_ACT_GRADS, 0, node, -1)) < 0)
    return -1;
  if (n->kind == TT_L_ATTENTION &&
      ((t0 = lower_buf(c, lname, ".attn_out.grad", tt_size_mul(tt_size_mul(mb * es, (size_t)n->c), (size_t)n->w),
                       c->pol->act_dtype, TT_BC_ACT_GRADS, 0, node, -1)) < 0 ||
       (t1 = lower_buf(c, lname, ".qkv.grad", tt_size_mul(tt_size_mul(mb * es, (size_t)n->c), 3 * (size_t)n->w),
                       c->pol->act_dtype, TT_BC_ACT_GRADS, 0, node, -1)) < 0))
    return -1;
  int restored = -1;
  if (compact && n->kind == TT_L_CONV) { /* x restored from the lossy copy, live during this step only */
    int xn = c->canon[n->in[0]];
    restored = lower_buf(c, c->g->model->layers[node].name, ".x_restored", lower_act_bytes(c, xn), c->pol->act_dtype,
                         TT_BC_ACTIVATIONS, 0, xn, -1);
    if (restored < 0) return -1;
  }
  tt_step *s = lower_step(c, TT_S_BWD, node, compact ? TT_SF_COMPACT : 0);
  if (!s) return -1;
  if (restored >= 0) lower_set(s, 1, TT_BWD_RESTORED, restored);
  lower_args(c, n, &s->a);
  lower_set(s, 0, TT_BWD_DY, c->gbuf[node]);
  if (saved >= 0) lower_set(s, 0, TT_BWD_SAVED, saved);
  if (n->kind == TT_L_CONV || n->kind == TT_L_LINEAR || n->kind == TT_L_PATCH_EMBED || n->kind == TT_L_ATTENTION)
    lower_set(s, 0, TT_BWD_W, w);
  if (n->kind == TT_L_PATCH_EMBED) lower_set(s, 1, TT_PE_DCONV, t0);
  if (n->kind == TT_L_ATTENTION) {
    int sv = c->cur_save[node];
    lower_set(s, 0, TT_AB_OUT_W, ow);
    lower_set(s, 0, TT_AB_QKV, sv);
    lower_set(s, 0, TT_AB_O, sv + 1);
    lower_set(s, 0, TT_AB_LSE, sv + 2);
    lower_set(s, 0, TT_AB_PROBS, c->pol->attn_fused ? -1 : sv + 3);
    lower_set(s, 1, TT_AB_DO, t0);
    lower_set(s, 1, TT_AB_DQKV, t1);
  }
  if (n->kind == TT_L_BN || n->kind == TT_L_LAYERNORM) {
    lower_set(s, 0, TT_BWD_GAMMA, c->p->param_buf[n->gamma]);
    lower_set(s, 0, TT_BWD_SAVE_MEAN, c->cur_save[node]);
    lower_set(s, 0, TT_BWD_SAVE_INVSTD, c->cur_save[node] + 1);
  }
  if (lower_input_grads(c, node, &s)) return -1;
  if (op->has_params) {
    int norm = n->kind == TT_L_BN || n->kind == TT_L_LAYERNORM;
    int pw = norm ? n->gamma : n->weight, pb = norm ? n->beta : n->bias;
    lower_set(s, 1, TT_BWD_DW, c->p->grad_buf[pw]);
    if (pb >= 0) lower_set(s, 1, TT_BWD_DB, c->p->grad_buf[pb]);
    if (n->kind == TT_L_ATTENTION) {
      lower_set(s, 1, TT_AB_DOUT_W, c->p->grad_buf[n->out_w]);
      lower_set(s, 1, TT_AB_DOUT_B, n->out_b >= 0 ? c->p->grad_buf[n->out_b] : -1);
    } else if (n->kind == TT_L_PATCH_EMBED) {
      lower_set(s, 1, TT_PE_DCLS, n->cls_tok >= 0 ? c->p->grad_buf[n->cls_tok] : -1);
      lower_set(s, 1, TT_PE_DPOS, n->pos_emb >= 0 ? c->p->grad_buf[n->pos_emb] : -1);
    }
  }
  return lower_ws(c, s); /* last: the calls depend on which gradients are added into */
}

/* Whether backward of node j (reading its input v) can read a compact form instead: max pooling
 * with a window a uint8 indexes, on a backend with the entries. */
static int lower_pool_compactable(const lower_ctx *c, const tt_node *n) {
  /* a pooling from NHWC into NCHW (lower_layout.c): its pool_bwd_idx reads an NCHW dy, which the
   * CPU backend's winner loops do in fp32 and bf16 only */
  return n->kind == TT_L_MAXPOOL && n->L->kh * n->L->kw <= 256 && c->be->pool_argmax && c->be->pool_bwd_idx &&
         (!lower_pool_y_nchw(c, n) || c->pol->act_dtype == TT_F32 || c->pol->act_dtype == TT_BF16);
}

/* Whether a convolution's backward may read a lossy copy of its input (policy.compress: fp16
 * or bf16 under fp32 activations, int8 under either). */
static int lower_conv_compressible(const lower_ctx *c, const tt_node *n) {
  const tt_policy *pol = c->pol;
  return n->kind == TT_L_CONV && pol->compress > TT_SAVE_EXACT && pol->compress <= TT_SAVE_INT8 && c->be->save_compress &&
         c->be->save_restore && (pol->act_dtype == TT_F32 || pol->compress == TT_SAVE_INT8);
}

/* Compact saves (policy.compact, training): a value v is kept for backward as the full tensor
 * only when something reads it there. When every backward reader of v can read a compact form
 * instead (v's own backward if v is a ReLU or ReLU6: a 1-bit mask; a max pool reading v: a
 * uint8 index), those readers get their compact forms and v dies with its last forward use.
 * Recompute re-reads values: a v that is recomputed, or read by a recomputed op, keeps the
 * full tensor. policy.compact_sel (when set) names the values that may take their forms. */
static void lower_compact_plan(lower_ctx *c) {
  const tt_graph *g = c->g;
  const tt_policy *pol = c->pol;
  int nn = g->nnodes;
  memset(c->compact, 0, (size_t)nn);
  if (!pol->training || !pol->compact) return;
  for (int v = 1; v < nn; v++) {
    const tt_node *nv = &g->nodes[v];
    if (c->canon[v] != v || (pol->recompute && pol->recompute[v]) || (pol->compact_sel && !pol->compact_sel[v])) continue;
    int ok = 1, readers = 0;
    if (tt_op(nv->kind)->bwd_reads & TT_READS_OUTPUT) {
      if ((nv->kind == TT_L_RELU || nv->kind == TT_L_RELU6) && c->be->act_mask && c->be->act_bwd_mask)
        readers++;
      else
        ok = 0;
    }
    for (int j = v + 1; j < nn && ok; j++) {
      const tt_node *nj = &g->nodes[j];
      int reads = 0;
      if (c->canon[j] != j) continue; /* a view: its consumers read v through canon */
      for (int k = 0; k < nj->nin; k++)
        if (c->canon[nj->in[k]] == v) reads = 1;
      if (!reads) continue;
      if (pol->recompute && pol->recompute[j]) ok = 0; /* re-run in backward: reads v there */
      else if (c->canon[nj->in[0]] == v && (tt_op(nj->kind)->bwd_reads & TT_READS_INPUT)) {
        if (lower_pool_compactable(c, nj) || lower_conv_compressible(c, nj)) readers++;
        else ok = 0;
      }
    }
    if (!ok || !readers) continue;
    if (tt_op(nv->kind)->bwd_reads & TT_READS_OUTPUT) c->compact[v] = 1;
    for (int j = v + 1; j < nn; j++)
      if (c->canon[j] == j && g->nodes[j].nin && c->canon[g->nodes[j].in[0]] == v &&
          (tt_op(g->nodes[j].kind)->bwd_reads & TT_READS_INPUT))
        c->compact[j] = 1;
  }
}

/* The tables of the lowering context and of the Program, in one allocation; views resolved. */
static int lower_tables(lower_ctx *c) {
  const tt_graph *g = c->g;
  tt_program *p = c->p;
  int nn = g->nnodes, np = g->nparams;
  int *ints = (int *)tt_malloc(tt_program_table_bytes(g), "lowering tables", c->err);
  if (!ints) return -1;
  for (int i = 0; i < 6 * nn + 5 * np + 8; i++) ints[i] = -1;
  c->cur_cmp = ints + 5 * nn + 5 * np + 8;
  c->compact = (char *)(ints + 6 * nn + 5 * np + 8);
  p->layout = (unsigned char *)(ints + 6 * nn + 5 * np + 8) + nn;
  c->canon = ints, c->cur_val = ints + nn, c->cur_save = ints + 2 * nn, c->gbuf = ints + 3 * nn;
  p->tables = ints;
  p->value_buf = ints + 4 * nn;
  c->wcopy = ints + 5 * nn;
  p->param_buf = ints + 5 * nn + np, p->grad_buf = ints + 5 * nn + 2 * np, p->m_buf = ints + 5 * nn + 3 * np;
  p->v_buf = ints + 5 * nn + 4 * np;
  for (int i = 0; i < nn; i++) {
    const tt_node *n = &g->nodes[i];
    c->canon[i] = tt_op_is_view(n->L, c->pol->training) ? c->canon[n->in[0]] : i;
  }
  if (tt_lower_layouts(g, c->pol, c->be, c->canon, p, c->err)) { /* nothing else is allocated yet: the tables go with it */
    free(p->tables);
    p->tables = NULL, p->value_buf = NULL, p->layout = NULL;
    return -1;
  }
  lower_compact_plan(c);
  return 0;
}

/* Persistent buffers (masters, then gradients, then optimizer state, each in parameter order;
 * loss statistics; the overflow flag) and the transient uint8 batch and labels. Persistent
 * buffers are packed in the order they are made (tt_program_plan), so the gradients lie end
 * to end: a multi-process run all-reduces runs of them in place as buckets (core/runtime/dist.c). */
static int lower_persistent(lower_ctx *c) {
  const tt_graph *g = c->g;
  const tt_train_cfg *tc = &g->model->train;
  const tt_policy *pol = c->pol;
  tt_program *p = c->p;
  for (int i = 0; i < g->nparams; i++) {
    const tt_param *pr = &g->params[i];
    if ((p->param_buf[i] = lower_buf(c, pr->name, "", tt_size_mul(pr->numel, sizeof(float)), TT_F32, TT_BC_PARAMS, 1,
                                     pr->node, i)) < 0)
      return -1;
  }
  /* Gradients are persistent accumulators only where they must be one region that outlives a
   * micro-step: accumulation over several micro-steps, a multi-process all-reduce (dist.c sums
   * runs of the region in place), or clip_norm (its sum of squares is one deterministic call over
   * the region, exec.c). Otherwise each is transient, live from the backward step that writes it
   * (every writer at micro-step 0 overwrites: exec.c's bp) to its update, so the planner overlaps
   * it with the activations backward has freed: at the training peak, early in backward, few
   * gradients are live yet (ResNet-50, bf16, micro-batch 16: 50 of its 97 MiB; the arena falls
   * from 999.1 to 941.4 MiB). lower_grads_unwritten keeps persistent (zeroed) any gradient no
   * backward step writes; tt_policy_plan (policy.c) where persistent ones pack smaller. */
  int grads_persistent = !(pol->accum_steps == 1 && tc->ranks <= 1 && !(tc->clip_norm > 0.0f)) || pol->grads_persistent;
  for (int i = 0; pol->training && i < g->nparams; i++) {
    const tt_param *pr = &g->params[i];
    if (pr->trainable &&
        (p->grad_buf[i] = lower_buf(c, pr->name, ".grad", tt_size_mul(pr->numel, sizeof(float)), TT_F32, TT_BC_GRADS,
                                    grads_persistent, pr->node, i)) < 0)
      return -1;
  }
  for (int i = 0; i < g->nparams; i++) {
    const tt_param *pr = &g->params[i];
    if (!pol->training || !pr->trainable) continue;
    int fmt = tt_program_state_fmt(g, pol, pr); /* [train] optimizer_state: the state at its held size */
    size_t bytes = fmt ? tt_state_bytes((tt_state_fmt)fmt, pr->numel) : tt_size_mul(pr->numel, sizeof(float));
    tt_dtype dt = fmt == TT_STATE_BF16 ? TT_BF16 : TT_F32;
    int nstate = tc->optimizer == TT_OPT_SGD ? (tc->momentum != 0.0f) : 2;
    if (nstate >= 1 && (p->m_buf[i] = lower_buf(c, pr->name, tc->optimizer == TT_OPT_SGD ? ".momentum" : ".adam_m", bytes,
                                                dt, TT_BC_OPTIMIZER, 1, pr->node, i)) < 0)
      return -1;
    if (nstate >= 2 && (p->v_buf[i] = lower_buf(c, pr->name, ".adam_v", bytes, dt, TT_BC_OPTIMIZER, 1, pr->node, i)) < 0)
      return -1;
    for (int k = 0; k < nstate; k++) p->bufs[k ? p->v_buf[i] : p->m_buf[i]].state = fmt;
  }
  if (tt_program_state_check(p, c->be, c->err)) return -1;
  if ((p->stats = lower_buf(c, "loss_stats", "", 2 * sizeof(float), TT_F32, TT_BC_MISC, 1, -1, -1)) < 0) return -1;
  if (pol->training && pol->act_dtype == TT_F16 &&
      (p->overflow_flag = lower_buf(c, "overflow_flag", "", sizeof(int32_t), TT_F32, TT_BC_MISC, 1, -1, -1)) < 0)
    return -1;
  /* The uint8 batch and the labels: transient (live from the load to the loss), except in a
   * training program on a backend that stages batches to a device (not host_memory): there they
   * are persistent, so that no other buffer shares their storage and the next batch's copy may run
   * while the current step computes (its copy waits only for the step's last reader of them: exec.c,
   * backend.h's upload_after). The cost is the batch's bytes (1 byte per input value, 4 per label)
   * live through the whole step where they were live in its first part. */
  int staged = pol->training && !c->be->host_memory && !pol->batch_transient; /* budget-bound: transient (policy.c) */
  if ((p->input_u8 = lower_buf(c, "input", ".u8", tt_size_mul((size_t)pol->micro_batch, p->input_numel), TT_F32,
                               TT_BC_ACTIVATIONS, staged, 0, -1)) < 0)
    return -1;
  if ((p->labels = lower_buf(c, "labels", "", tt_size_mul((size_t)pol->micro_batch, sizeof(int32_t)), TT_F32,
                             TT_BC_ACTIVATIONS, staged, -1, -1)) < 0)
    return -1;
  return 0;
}

/* Training under autocast: every 16-bit weight copy of the micro-step is made by CAST steps at
 * its start, one after another in forward order (the masters' order), so that the executor can
 * hand the whole run to the backend's cast_multi as one call (one launch on CUDA) instead of one
 * cast per weight at its first use. Each copy stays its own transient buffer, live from its cast
 * to its last reader; what this costs is the later layers' copies during the forward pass before
 * their layer, which is not where a training plan's peak lies (the end of the forward pass, where
 * every copy whose backward reads it is live anyway) unless the plan is tiny. Evaluation programs
 * keep the casts at first use: each copy there lives for its layer only, and casting them all
 * first would add every copy to their peak. */
static int lower_casts_first(lower_ctx *c) {
  const tt_graph *g = c->g;
  if (!c->pol->training || c->pol->act_dtype == TT_F32) return 0;
  for (int i = 0; i < g->nnodes; i++) {
    const tt_node *n = &g->nodes[i];
    if (c->canon[i] != i) continue;
    if (lower_weight(c, n->weight) < -1 || lower_weight(c, n->bias) < -1 || lower_weight(c, n->out_w) < -1 ||
        lower_weight(c, n->out_b) < -1)
      return -1;
  }
  return 0;
}

/* Forward in recipe order, then the loss on the last node's value. */
static int lower_forward(lower_ctx *c) {
  const tt_graph *g = c->g;
  const tt_policy *pol = c->pol;
  tt_program *p = c->p;
  int nn = g->nnodes;
  for (int i = 0; i < nn; i++) {
    if (c->canon[i] != i) continue;
    if (lower_fwd(c, i, pol->training ? 0 : TT_SF_EVAL) < 0) return -1;
    p->value_buf[i] = c->cur_val[i];
  }
  for (int i = 0; i < nn; i++) p->value_buf[i] = p->value_buf[c->canon[i]];
  int last = c->canon[nn - 1], gb = -1;
  if (pol->training &&
      (gb = lower_buf(c, g->model->layers[last].name, ".grad", lower_act_bytes(c, last), pol->act_dtype, TT_BC_ACT_GRADS, 0,
                      last, -1)) < 0)
    return -1;
  tt_step *s = lower_step(c, TT_S_LOSS, last, pol->training ? 0 : TT_SF_EVAL);
  if (!s) return -1;
  s->a.loss.classes = g->model->classes;
  s->a.loss.label_smoothing = g->model->train.label_smoothing;
  lower_set(s, 0, TT_LOSS_LOGITS, c->cur_val[last]);
  lower_set(s, 0, TT_LOSS_LABELS, p->labels);
  lower_set(s, 1, TT_LOSS_DLOGITS, gb);
  lower_set(s, 1, TT_LOSS_STATS, p->stats);
  c->gbuf[last] = gb;
  return 0;
}

/* Backward in reverse order, after dropping the values the policy recomputes. */
/* Whether node i holds a trainable parameter (its gradient is planned). */
static int lower_trainable(const lower_ctx *c, const tt_node *n) {
  const int pr[8] = {n->weight, n->bias, n->gamma, n->beta, n->out_w, n->out_b, n->cls_tok, n->pos_emb};
  for (int k = 0; k < 8; k++)
    if (pr[k] >= 0 && c->p->grad_buf[pr[k]] >= 0) return 1;
  return 0;
}

static int lower_backward(lower_ctx *c) {
  const tt_graph *g = c->g;
  const tt_policy *pol = c->pol;
  int rc = 0;
  if (pol->recompute)
    for (int i = 0; i < g->nnodes; i++)
      if (pol->recompute[i] && c->canon[i] == i) {
        c->cur_val[i] = -1; /* BN's saved statistics (2c floats) and layer norm's (2 per row) stay */
        if (g->nodes[i].kind == TT_L_ATTENTION) c->cur_save[i] = -1; /* qkv, o, lse, probabilities go */
      }
  c->needs_grad = (char *)tt_calloc((size_t)g->nnodes, 1, "lowering tables", c->err);
  if (!c->needs_grad) return -1;
  for (int i = 0; i < g->nnodes; i++) { /* inputs come before their consumers; a later one: assume so */
    const tt_node *n = &g->nodes[i];
    c->needs_grad[i] = (char)lower_trainable(c, n);
    for (int k = 0; k < n->nin; k++)
      if (n->in[k] >= i || c->needs_grad[c->canon[n->in[k]]]) c->needs_grad[i] = 1;
  }
  for (int i = g->nnodes - 1; i >= 1 && rc == 0; i--) {
    if (c->canon[i] != i || c->gbuf[i] < 0) continue;
    if (lower_bwd(c, i) < 0) rc = -1;
  }
  free(c->needs_grad);
  c->needs_grad = NULL;
  return rc;
}

/* The update phase: the overflow check under fp16 (not bf16: it has fp32's range and no loss
 * scale to back off); with [train] clip_norm the gradients' sum of
 * squares (into a persistent fp32 made here, after every other persistent buffer, so the
 * gradients stay end to end); then one update per trainable parameter, marked TT_SF_DECAY where
 * weight decay applies to it. */
static int lower_update(lower_ctx *c) {
  const tt_graph *g = c->g;
  tt_program *p = c->p;
  unsigned char *decays = (unsigned char *)tt_calloc((size_t)g->nparams + 1, 1, "decay table", c->err);
  if (!decays) return -1;
  if (tt_decay_mask(g, decays, c->err)) return free(decays), -1;
  if (p->overflow_flag >= 0) {
    tt_step *s = lower_step(c, TT_S_CHECK, -1, 0);
    if (!s) return free(decays), -1;
    lower_set(s, 1, TT_CHECK_FLAG, p->overflow_flag);
  }
  if (g->model->train.clip_norm > 0.0f) {
    int acc = lower_buf(c, "clip_sumsq", "", sizeof(float), TT_F32, TT_BC_MISC, 1, -1, -1);
    tt_step *s = acc < 0 ? NULL : lower_step(c, TT_S_CLIP, -1, 0);
    if (!s) return free(decays), -1;
    lower_set(s, 1, TT_CLIP_SUMSQ, acc);
  }
  for (int i = 0; i < g->nparams; i++) {
    if (p->grad_buf[i] < 0) continue;
    tt_step *s = lower_step(c, TT_S_UPDATE, g->params[i].node, decays[i] ? TT_SF_DECAY : 0);
    if (!s) return free(decays), -1;
    s->arg = i;
    s->a.count = g->params[i].numel;
    lower_set(s, 0, TT_UPD_GRAD, p->grad_buf[i]);
    lower_set(s, 1, TT_UPD_PARAM, p->param_buf[i]);
    if (p->m_buf[i] >= 0) lower_set(s, 1, TT_UPD_M, p->m_buf[i]);
    if (p->v_buf[i] >= 0) lower_set(s, 1, TT_UPD_V, p->v_buf[i]);
    int cb = c->wcopy[i];
    if (cb >= 0 && p->bufs[cb].persistent) { /* offload 2: the updated master into its copy, in the window */
      tt_step *cs = lower_step(c, TT_S_CAST, g->params[i].node, 0);
      if (!cs) return free(decays), -1;
      cs->arg = i, cs->a.count = g->params[i].numel;
      lower_set(cs, 0, TT_CAST_SRC, p->param_buf[i]);
      lower_set(cs, 1, TT_CAST_DST, cb);
    }
  }
  free(decays);
  return 0;
}

/* A backend may leave the transformer entries NULL (backend.h): a recipe that needs one is
 * refused here, naming the layer, rather than failing at its first step. */
static int lower_check_backend(const tt_graph *g, const tt_backend *be, tt_err *err) {
  for (int i = 1; i < g->nnodes; i++) {
    const tt_node *n = &g->nodes[i];
    const char *need = NULL;
    switch (n->kind) {
      case TT_L_PATCH_EMBED: need = !be->tokens_fwd || !be->tokens_bwd ? "tokens_fwd/tokens_bwd" : NULL; break;
      case TT_L_LAYERNORM: need = !be->ln_fwd || !be->ln_bwd ? "ln_fwd/ln_bwd" : NULL; break;
      case TT_L_ATTENTION: need = !be->attn_fwd || !be->attn_bwd ? "attn_fwd/attn_bwd" : NULL; break;
      case TT_L_TOKEN: need = !be->token_pool_fwd || !be->token_pool_bwd ? "token_pool_fwd/token_pool_bwd" : NULL; break;
      default: break;
    }
    if (need)
      return tt_fail(err, "%s:%d: [%s %s]: the %s backend does not implement %s (%s); use another backend (--backend) or "
                     "a recipe without this layer", g->model->path, n->L->line, tt_layer_kind_name(n->kind), n->L->name,
                     be->name, tt_layer_kind_name(n->kind), need);
  }
  return 0;
}

int tt_lower(const tt_graph *g, const tt_policy *pol, tt_backend *be, tt_program *p, tt_err *err) {
  memset(p, 0, sizeof *p);
  p->graph = g;
  p->policy = *pol;
  p->align = be->align ? be->align : 1;
  p->nparams = g->nparams;
  p->input_numel = tt_node_numel(&g->nodes[0]);
  p->input_u8 = p->labels = p->stats = p->overflow_flag = -1;
  p->caps = tt_program_caps(be, tt_knobs_get()->fuse); /* what calls.c's list may use */
  if (pol->micro_batch <= 0) return tt_fail(err, "micro-batch must be positive (got %d)", pol->micro_batch);
  if (lower_check_backend(g, be, err)) return -1;
  lower_ctx c;
  memset(&c, 0, sizeof c);
  c.g = g, c.pol = pol, c.be = be, c.p = p, c.err = err;
  if (lower_tables(&c)) return -1;
  if (!(c.krsc = (unsigned char *)tt_malloc((size_t)g->nparams + 1, "KRSC copies", err))) goto fail;
  tt_krsc_plan(g, pol, p->caps, tt_knobs_get()->krsc_cast, p->layout, c.canon, c.krsc);
  /* Room for about what a training program takes (a few buffers and steps per node and per
   * parameter) up front: the policy search lowers ~1,500 candidates, and growing from 64 by
   * doubling copied each program about twice over. Capacity only: the program is the same. */
  if (lower_grow((void **)&p->bufs, &p->cap_bufs, 4 * (g->nnodes + g->nparams) + 64, sizeof(tt_buf), err) ||
      lower_grow((void **)&p->steps, &p->cap_steps, 3 * g->nnodes + 2 * g->nparams + 64, sizeof(tt_step), err))
    goto fail;
  if (lower_persistent(&c) || lower_casts_first(&c) || lower_forward(&c) || (pol->training && lower_backward(&c))) goto fail;
  p->micro_end = p->nsteps;
  if (pol->training && lower_update(&c)) goto fail;
  tt_lower_liveness(p);
  tt_lower_grads_unwritten(p);
  tt_lower_retarget_add(p);
  if (tt_offload_lower(p, err) || tt_krsc_check(p, err)) goto fail; /* offload: the optimizer state on the host */
  free(c.krsc);
  return 0;
fail:
  free(c.krsc);
  tt_program_free(p);
  return c.too_large ? TT_ERR_TOO_LARGE : -1;
}
