/* core/compile/dispatch.c — a layer step's backend calls (see dispatch.h): one function per layer
 * kind, in a table indexed by the kind (as ops.c keeps the traits), each appending the calls of one
 * forward or backward step in run order. */
#include <math.h>
#include <string.h>

#include "dispatch.h"

/* What every kind's function sees of the step it expands, and the list it appends to. */
typedef struct dispatch_ctx {
  const tt_program *p;
  const tt_step *s;
  const tt_op_args *a;
  int batch;       /* samples every call runs on */
  tt_dtype dt;     /* the program's activation dtype */
  int bwd;         /* a TT_S_BWD step */
  int dx;          /* BWD: the input gradient's buffer (-1: fed by the image or frozen) */
  float bdx;       /* BWD: 0 overwrites dx, 1 adds into it (fan-out) */
  int nhwc;        /* TT_SF_NHWC: channel-only ops run on [batch*h*w, c, 1] (backend.h) */
  int blk;         /* TT_SF_NCHW16C: batch norm runs on [batch, c/16, h*w, 16] (tt_bn_desc.blk) */
  size_t cnt;      /* elementwise kinds: elements at the batch */
  tt_call *calls;
  int n;
} dispatch_ctx;

/* A new call of fn in the program's dtype with every operand empty. */
static tt_call *dispatch_add(dispatch_ctx *d, int fn) {
  tt_call *c = &d->calls[d->n++];
  memset(c, 0, sizeof *c); /* the desc whole: backends compare descs bytewise */
  c->fn = fn;
  if (fn < TT_OP_KIND_COUNT) c->op.kind = (tt_op_kind)fn;
  c->op.dt = d->dt;
  for (int k = 0; k < TT_CALL_MAX_IN; k++) c->in[k] = -1;
  for (int k = 0; k < TT_CALL_MAX_OUT; k++) c->out[k] = -1;
  c->ws = -1, c->node = -1, c->fused_into = -1;
  return c;
}

static void dispatch_in(tt_call *c, int a, int b, int d) { c->in[0] = a, c->in[1] = b, c->in[2] = d; }

/* The input-gradient call of a conv or linear backward: dx from dy and the weight, added into dx
 * where the step's fan-out says so. */
static tt_call *dispatch_dx(dispatch_ctx *d, int fn, int dy, int w) {
  tt_call *c = dispatch_add(d, fn);
  c->op.accumulate = d->s->out_beta[TT_BWD_DX];
  dispatch_in(c, dy, w, -1);
  c->out[0] = d->dx, c->beta = d->bdx;
  return c;
}

/* The weight-gradient call of a conv or linear backward from x and dy into (dw, db); a frozen
 * layer's (dw -1) is only prepared: lowering has always sized it. */
static tt_call *dispatch_dw(dispatch_ctx *d, int fn, int x, int dy, int dw, int db) {
  tt_call *c = dispatch_add(d, fn);
  c->op.bias = db >= 0;
  dispatch_in(c, x, dy, -1);
  c->out[0] = dw, c->out[1] = db;
  c->param_grads = 1, c->skip = dw < 0 ? TT_CALL_PREPARED_ONLY : TT_CALL_RUNS;
  return c;
}

/* conv and linear: forward y = x * W (+ b), with a lossy saved copy of x where the policy
 * compresses; backward dW (from x, restored first when lossy), then dx. */
static void dispatch_conv_linear(dispatch_ctx *d) {
  const tt_step *s = d->s;
  const tt_op_args *a = d->a;
  int conv = s->kind == TT_L_CONV, first = d->n;
  int lossy = conv && (s->flags & TT_SF_COMPACT) && d->p->policy.compress;
  tt_call *c, *z = NULL; /* the lossy copy's call: shapes set after the loop below */
  if (!d->bwd) {
    c = dispatch_add(d, conv ? TT_OP_CONV_FWD : TT_OP_LINEAR_FWD);
    c->op.bias = s->in[TT_FWD_B] >= 0;
    dispatch_in(c, s->in[TT_FWD_X], s->in[TT_FWD_W], s->in[TT_FWD_B]);
    c->out[0] = s->out[TT_FWD_Y];
    if (lossy) {
      z = dispatch_add(d, TT_CALL_SAVE_COMPRESS);
      dispatch_in(z, s->in[TT_FWD_X], -1, -1);
      z->out[0] = s->out[TT_FWD_COMPACT];
    }
  } else {
    if (lossy) {
      z = dispatch_add(d, TT_CALL_SAVE_RESTORE);
      dispatch_in(z, s->in[TT_BWD_SAVED], -1, -1);
      z->out[0] = s->out[TT_BWD_RESTORED];
    }
    dispatch_dw(d, conv ? TT_OP_CONV_BWD_FILTER : TT_OP_LINEAR_BWD_FILTER, lossy ? s->out[TT_BWD_RESTORED] : s->in[TT_BWD_SAVED],
                s->in[TT_BWD_DY], s->out[TT_BWD_DW], s->out[TT_BWD_DB]);
    if (d->dx >= 0) dispatch_dx(d, conv ? TT_OP_CONV_BWD_DATA : TT_OP_LINEAR_BWD_DATA, s->in[TT_BWD_DY], s->in[TT_BWD_W]);
  }
  for (int k = first; k < d->n; k++) { /* the same shape for every call of the step */
    tt_call *e = &d->calls[k];
    if (e == z) {
      z->fmt = d->p->policy.compress;
      z->op.u.bn.n = d->batch, z->op.u.bn.c = a->conv.c, z->op.u.bn.hw = a->conv.h * a->conv.w;
      if (a->conv.layout_x == TT_LAYOUT_NHWC) z->op.u.bn.n = d->batch * z->op.u.bn.hw, z->op.u.bn.hw = 1;
    } else if (conv) {
      e->op.u.conv = a->conv, e->op.u.conv.n = d->batch;
      if (e->fn == TT_OP_CONV_BWD_FILTER) e->op.u.conv.layout_w = TT_FILTER_KCRS; /* dw: the fp32 KCRS gradient */
    } else { /* over a token tensor: one row per token */
      e->op.u.linear.n = d->batch * a->linear.rows, e->op.u.linear.in = a->linear.in, e->op.u.linear.out = a->linear.out;
    }
  }
}

/* patch embedding: forward conv -> [N, dim, hw] (TT_PE_CONV), then tokens (class token, position
 * embedding) -> y [N, t, dim]; backward: tokens_bwd -> the conv output's gradient (and the class
 * token's and position embedding's), then the conv's filter and data gradients. */
static void dispatch_patch(dispatch_ctx *d) {
  const tt_step *s = d->s;
  const tt_conv_desc *cd = &d->a->patch.conv;
  tt_call *c;
  if (!d->bwd) {
    c = dispatch_add(d, TT_OP_CONV_FWD);
    c->op.bias = s->in[TT_FWD_B] >= 0;
    dispatch_in(c, s->in[TT_FWD_X], s->in[TT_FWD_W], s->in[TT_FWD_B]);
    c->out[0] = s->out[TT_PE_CONV];
    c->op.u.conv = *cd, c->op.u.conv.n = d->batch;
    c = dispatch_add(d, TT_CALL_TOKENS_FWD);
    dispatch_in(c, s->out[TT_PE_CONV], s->in[TT_PE_CLS], s->in[TT_PE_POS]);
    c->out[0] = s->out[TT_FWD_Y];
  } else {
    c = dispatch_add(d, TT_CALL_TOKENS_BWD);
    dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
    c->out[0] = s->out[TT_PE_DCONV], c->out[1] = s->out[TT_PE_DCLS], c->out[2] = s->out[TT_PE_DPOS];
    c->param_grads = 1; /* beta 0: the conv output's gradient is this step's own */
  }
  c->op.u.bn.n = d->batch, c->op.u.bn.c = cd->k, c->op.u.bn.hw = cd->p * cd->q, c->mode = d->a->patch.cls;
  if (!d->bwd) return;
  c = dispatch_dw(d, TT_OP_CONV_BWD_FILTER, s->in[TT_BWD_SAVED], s->out[TT_PE_DCONV], s->out[TT_BWD_DW], s->out[TT_BWD_DB]);
  c->op.u.conv = *cd, c->op.u.conv.n = d->batch;
  if (d->dx >= 0) {
    c = dispatch_dx(d, TT_OP_CONV_BWD_DATA, s->out[TT_PE_DCONV], s->in[TT_BWD_W]);
    c->op.u.conv = *cd, c->op.u.conv.n = d->batch;
  }
}

/* The backward call of a batch or layer norm: dx (added where the step's fan-out says so), dgamma
 * and dbeta from the saved x, dy, gamma and the forward's saved mean and 1/std. */
static tt_call *dispatch_norm_bwd(dispatch_ctx *d, int fn) {
  const tt_step *s = d->s;
  tt_call *c = dispatch_add(d, fn);
  c->op.accumulate = s->out_beta[TT_BWD_DX];
  dispatch_in(c, s->in[TT_BWD_SAVED], s->in[TT_BWD_DY], s->in[TT_BWD_GAMMA]);
  c->in[3] = s->in[TT_BWD_SAVE_MEAN], c->in[4] = s->in[TT_BWD_SAVE_INVSTD];
  c->out[0] = d->dx, c->out[1] = s->out[TT_BWD_DW], c->out[2] = s->out[TT_BWD_DB];
  c->beta = d->bdx, c->param_grads = 1;
  return c;
}

/* layer norm over the last dimension; evaluation saves no statistics (the out slots are -1). */
static void dispatch_layernorm(dispatch_ctx *d) {
  const tt_step *s = d->s;
  tt_call *c;
  if (d->bwd) {
    if (d->dx < 0 && s->out[TT_BWD_DW] < 0) return; /* nothing to compute */
    c = dispatch_norm_bwd(d, TT_OP_LN_BWD);
  } else {
    c = dispatch_add(d, TT_OP_LN_FWD);
    dispatch_in(c, s->in[TT_FWD_X], s->in[TT_BN_GAMMA], s->in[TT_BN_BETA]);
    c->out[0] = s->out[TT_FWD_Y], c->out[1] = s->out[TT_BN_SAVE_MEAN], c->out[2] = s->out[TT_BN_SAVE_INVSTD];
  }
  c->op.u.ln.rows = d->batch * d->a->ln.rows, c->op.u.ln.f = d->a->ln.f, c->op.u.ln.eps = d->a->ln.eps;
}

/* A linear call over `rows` token rows, in -> out features. */
static void dispatch_rows(tt_call *c, int rows, int in, int out) {
  c->op.u.linear.n = rows, c->op.u.linear.in = in, c->op.u.linear.out = out;
}

/* attention: in-proj linear over N*t rows -> qkv [N, t, 3f]; attn_fwd -> o [N, t, f] (and lse,
 * probs); out-proj linear -> y. Backward in reverse: out-proj (dW from o, then do), attn_bwd ->
 * dqkv, in-proj (dW from x, then dx). */
static void dispatch_attention(dispatch_ctx *d) {
  const tt_step *s = d->s;
  const tt_attn_args *aa = &d->a->attn;
  int rows = d->batch * aa->t, f = aa->f;
  tt_attn_desc ad;
  tt_call *c;
  memset(&ad, 0, sizeof ad);
  ad.n = d->batch, ad.t = aa->t, ad.heads = aa->heads, ad.d = f / aa->heads, ad.causal = aa->causal;
  ad.scale = 1.0f / sqrtf((float)ad.d);
  ad.p = (s->flags & TT_SF_EVAL) ? 0.0f : aa->p; /* dropout on the probabilities: training only */
  if (!d->bwd) {
    c = dispatch_add(d, TT_OP_LINEAR_FWD);
    c->op.bias = s->in[TT_FWD_B] >= 0;
    dispatch_in(c, s->in[TT_FWD_X], s->in[TT_FWD_W], s->in[TT_FWD_B]);
    c->out[0] = s->out[TT_AT_QKV];
    dispatch_rows(c, rows, f, 3 * f);
    c = dispatch_add(d, TT_OP_ATTN_FWD);
    dispatch_in(c, s->out[TT_AT_QKV], -1, -1);
    c->out[0] = s->out[TT_AT_O], c->out[1] = s->out[TT_AT_LSE], c->out[2] = s->out[TT_AT_PROBS];
    c->op.u.attn = ad;
    c = dispatch_add(d, TT_OP_LINEAR_FWD);
    c->op.bias = s->in[TT_AT_OUT_B] >= 0;
    dispatch_in(c, s->out[TT_AT_O], s->in[TT_AT_OUT_W], s->in[TT_AT_OUT_B]);
    c->out[0] = s->out[TT_FWD_Y];
    dispatch_rows(c, rows, f, f);
    return;
  }
  c = dispatch_dw(d, TT_OP_LINEAR_BWD_FILTER, s->in[TT_AB_O], s->in[TT_BWD_DY], s->out[TT_AB_DOUT_W], s->out[TT_AB_DOUT_B]);
  dispatch_rows(c, rows, f, f);
  c = dispatch_add(d, TT_OP_LINEAR_BWD_DATA);
  dispatch_in(c, s->in[TT_BWD_DY], s->in[TT_AB_OUT_W], -1);
  c->out[0] = s->out[TT_AB_DO];
  dispatch_rows(c, rows, f, f);
  c = dispatch_add(d, TT_OP_ATTN_BWD);
  dispatch_in(c, s->in[TT_AB_QKV], s->in[TT_AB_O], s->out[TT_AB_DO]);
  c->in[3] = s->in[TT_AB_LSE], c->in[4] = s->in[TT_AB_PROBS];
  c->out[0] = s->out[TT_AB_DQKV];
  c->op.u.attn = ad;
  c = dispatch_dw(d, TT_OP_LINEAR_BWD_FILTER, s->in[TT_BWD_SAVED], s->out[TT_AB_DQKV], s->out[TT_BWD_DW], s->out[TT_BWD_DB]);
  dispatch_rows(c, rows, f, 3 * f);
  if (d->dx >= 0) {
    c = dispatch_dx(d, TT_OP_LINEAR_BWD_DATA, s->out[TT_AB_DQKV], s->in[TT_BWD_W]);
    dispatch_rows(c, rows, f, 3 * f);
  }
}

/* token pooling: [N, t, f] -> [N, f], the class token or the mean. */
static void dispatch_token(dispatch_ctx *d) {
  const tt_step *s = d->s;
  tt_call *c;
  if (d->bwd && d->dx < 0) return;
  c = dispatch_add(d, d->bwd ? TT_CALL_TOKEN_POOL_BWD : TT_CALL_TOKEN_POOL_FWD);
  if (!d->bwd) {
    dispatch_in(c, s->in[TT_FWD_X], -1, -1);
    c->out[0] = s->out[TT_FWD_Y];
  } else {
    dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
    c->out[0] = d->dx, c->beta = d->bdx;
  }
  c->op.u.bn.n = d->batch, c->op.u.bn.c = d->a->token.f, c->op.u.bn.hw = d->a->token.t, c->mode = d->a->token.mode;
}

/* batch norm: training forward (batch statistics saved, running statistics updated unless
 * recomputing), evaluation forward, the forward rebuilt from saved statistics, or backward. */
static void dispatch_bn(dispatch_ctx *d) {
  const tt_step *s = d->s;
  tt_call *c;
  if (d->bwd) {
    c = dispatch_norm_bwd(d, TT_OP_BN_BWD);
  } else if (s->flags & TT_SF_BN_APPLY) { /* rebuilt from the forward's saved statistics */
    c = dispatch_add(d, TT_CALL_BN_APPLY);
    dispatch_in(c, s->in[TT_FWD_X], s->in[TT_BN_GAMMA], s->in[TT_BN_BETA]);
    c->in[3] = s->in[TT_BN_APPLY_MEAN], c->in[4] = s->in[TT_BN_APPLY_INVSTD];
    c->out[0] = s->out[TT_FWD_Y];
  } else {
    c = dispatch_add(d, (s->flags & TT_SF_EVAL) ? TT_OP_BN_FWD_INFER : TT_OP_BN_FWD_TRAIN);
    dispatch_in(c, s->in[TT_FWD_X], s->in[TT_BN_GAMMA], s->in[TT_BN_BETA]);
    c->in[3] = s->in[TT_BN_RMEAN], c->in[4] = s->in[TT_BN_RVAR];
    c->out[0] = s->out[TT_FWD_Y];
    if (!(s->flags & TT_SF_EVAL)) c->out[1] = s->out[TT_BN_SAVE_MEAN], c->out[2] = s->out[TT_BN_SAVE_INVSTD];
    c->momentum = d->a->bn.momentum;
    c->update_running = !(s->flags & TT_SF_RECOMPUTE);
  }
  c->op.u.bn.n = d->batch, c->op.u.bn.c = d->a->bn.c, c->op.u.bn.hw = d->a->bn.hw, c->op.u.bn.eps = d->a->bn.eps;
  if (d->nhwc) c->op.u.bn.n = d->batch * d->a->bn.hw, c->op.u.bn.hw = 1;
  if (d->blk) c->op.u.bn.blk = 16;
}

/* The activation function of an activation layer kind. */
static tt_act dispatch_act(const tt_program *p, const tt_step *s) {
  switch (s->kind) {
    case TT_L_GELU: /* PyTorch's nn.GELU(approximate = 'none' | 'tanh') */
      return p->graph->nodes[s->node].L->approximate ? TT_ACT_GELU_TANH : TT_ACT_GELU_ERF;
    case TT_L_RELU: return TT_ACT_RELU;
    case TT_L_RELU6: return TT_ACT_RELU6;
    default: return TT_ACT_SILU;
  }
}

/* The one-input, one-output layers without parameters (activations, pooling, dropout, global
 * average pooling): a backward with no dx to write (fed by the image) has nothing to do; a
 * compact save adds the mask (activations) or the in-window index (max pooling) to the forward. */
static void dispatch_unary(dispatch_ctx *d) {
  const tt_step *s = d->s;
  const tt_op_args *a = d->a;
  int k = s->kind, bwd = d->bwd;
  int act = k == TT_L_RELU || k == TT_L_RELU6 || k == TT_L_SILU || k == TT_L_GELU;
  int compact = (s->flags & TT_SF_COMPACT) != 0;
  int gap_pool = k == TT_L_GAP && (d->nhwc || d->blk); /* NHWC (or nChw16c) input: average pooling over h x w */
  int pool = k == TT_L_MAXPOOL || k == TT_L_AVGPOOL || gap_pool;
  tt_call *c;
  if (bwd && d->dx < 0) return;
  /* (int): the calls of our own (TT_CALL_*) extend tt_op_kind's numbers in an enum of their own, and
   * C++ (the amalgamation under nvcc) warns of a conditional that mixes the two */
  if (act) c = dispatch_add(d, bwd ? (compact ? (int)TT_CALL_ACT_BWD_MASK : (int)TT_OP_ACT_BWD) : (int)TT_OP_ACT_FWD);
  else if (pool) c = dispatch_add(d, bwd ? (compact ? (int)TT_CALL_POOL_BWD_IDX : (int)TT_OP_POOL_BWD) : (int)TT_OP_POOL_FWD);
  else if (k == TT_L_DROPOUT) c = dispatch_add(d, bwd ? TT_CALL_DROPOUT_BWD : TT_CALL_DROPOUT_FWD);
  else c = dispatch_add(d, bwd ? TT_CALL_GAP_BWD : TT_CALL_GAP_FWD);
  if (!bwd) {
    dispatch_in(c, s->in[TT_FWD_X], -1, -1);
    c->out[0] = s->out[TT_FWD_Y];
  } else if (k == TT_L_DROPOUT || (k == TT_L_GAP && !gap_pool)) { /* the mask is regenerated; gap reads only dy */
    dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
    c->out[0] = d->dx, c->beta = d->bdx;
  } else { /* average pooling over the whole plane reads only dy (x NULL) */
    c->op.accumulate = s->out_beta[TT_BWD_DX];
    dispatch_in(c, gap_pool ? -1 : s->in[TT_BWD_SAVED], s->in[TT_BWD_DY], -1);
    c->out[0] = d->dx, c->beta = d->bdx;
  }
  if (act) {
    c->op.u.act.act = dispatch_act(d->p, s), c->op.u.act.count = d->cnt;
  } else if (gap_pool) {
    tt_pool_desc *pd = &c->op.u.pool;
    c->op.pool_mode = TT_POOL_AVG;
    pd->n = d->batch, pd->c = a->gap.c, pd->h = pd->kh = a->gap.h, pd->w = pd->kw = a->gap.w;
    pd->stride_h = pd->stride_w = 1, pd->p = pd->q = 1, pd->layout = TT_LAYOUT_NHWC;
    /* nChw16c [batch, c/16, h, w, 16] is NHWC [batch*c/16, h, w, 16], and its pooled [batch*c/16, 16]
     * is [batch, c] in order: no blocked pooling loop needed (c is a multiple of 16 there) */
    if (d->blk) pd->n = d->batch * (a->gap.c / 16), pd->c = 16;
  } else if (pool) {
    c->op.pool_mode = k == TT_L_MAXPOOL ? TT_POOL_MAX : TT_POOL_AVG;
    c->op.u.pool = a->pool, c->op.u.pool.n = d->batch;
  } else if (k == TT_L_DROPOUT) {
    c->op.u.act.count = d->cnt, c->p = a->eltwise.p;
  } else {
    c->op.u.bn.n = d->batch, c->op.u.bn.c = a->gap.c, c->op.u.bn.hw = a->gap.hw;
  }
  if (compact && !bwd && (act || pool)) { /* the compact save, from y (act) or x (pool) */
    tt_op_desc op = c->op;
    tt_call *m = dispatch_add(d, act ? TT_CALL_ACT_MASK : TT_CALL_POOL_ARGMAX);
    m->op.u = op.u, m->op.pool_mode = op.pool_mode;
    dispatch_in(m, act ? s->out[TT_FWD_Y] : s->in[TT_FWD_X], -1, -1);
    m->out[0] = s->out[TT_FWD_COMPACT];
  }
}

/* add: forward y = x0 + x1, then y += xk; backward: every input's gradient is dy, added or
 * copied (the copy into dy's own storage last: calls.c orders dy_alias_last calls so). */
static void dispatch_addition(dispatch_ctx *d) {
  const tt_step *s = d->s;
  tt_call *c;
  if (!d->bwd) {
    for (int k = 1; k < s->nin; k++) {
      c = dispatch_add(d, TT_CALL_ADD);
      dispatch_in(c, k == 1 ? s->in[0] : s->out[TT_FWD_Y], s->in[k], -1);
      c->out[0] = s->out[TT_FWD_Y], c->op.u.act.count = d->cnt;
    }
    return;
  }
  for (int k = 0; k < s->nout; k++) {
    if (s->out[k] < 0) continue;
    c = dispatch_add(d, TT_CALL_ACCUMULATE);
    dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
    c->out[0] = s->out[k], c->beta = (float)s->out_beta[k], c->op.u.act.count = d->cnt;
    c->dy_alias_last = 1;
  }
}

/* concat along channels: forward input k into channels [off, off + cin[k]) of y [N, c, hw];
 * backward those channels of dy into input k's gradient. */
static void dispatch_concat(dispatch_ctx *d) {
  const tt_step *s = d->s;
  const tt_concat_args *ca = &d->a->concat;
  for (int k = 0, off = 0; k < ca->nin; off += ca->cin[k], k++) {
    if (d->bwd && s->out[k] < 0) continue;
    tt_call *c = dispatch_add(d, TT_CALL_CHANNEL_COPY);
    c->op.u.bn.n = d->batch, c->hw = ca->hw, c->nc = ca->cin[k];
    if (d->nhwc) c->op.u.bn.n = d->batch * ca->hw, c->hw = 1;
    if (!d->bwd) {
      dispatch_in(c, s->in[k], -1, -1);
      c->out[0] = s->out[TT_FWD_Y];
      c->src_c = ca->cin[k], c->src_off = 0, c->dst_c = ca->c, c->dst_off = off;
    } else {
      dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
      c->out[0] = s->out[k], c->beta = (float)s->out_beta[k];
      c->src_c = ca->c, c->src_off = off, c->dst_c = ca->cin[k], c->dst_off = 0;
    }
  }
}

/* Per layer kind, the function that lists its step's calls; NULL: the kind has no steps of its
 * own (input, flatten: views). */
static void (*const dispatch_by_kind[TT_L_KIND_COUNT])(dispatch_ctx *) = {
    NULL,                 /* TT_L_INPUT */
    dispatch_conv_linear, /* TT_L_CONV */
    dispatch_bn,          /* TT_L_BN */
    dispatch_unary,       /* TT_L_RELU */
    dispatch_unary,       /* TT_L_RELU6 */
    dispatch_unary,       /* TT_L_SILU */
    dispatch_unary,       /* TT_L_MAXPOOL */
    dispatch_unary,       /* TT_L_AVGPOOL */
    dispatch_unary,       /* TT_L_GAP */
    dispatch_conv_linear, /* TT_L_LINEAR */
    dispatch_unary,       /* TT_L_DROPOUT */
    NULL,                 /* TT_L_FLATTEN */
    dispatch_addition,    /* TT_L_ADD */
    dispatch_concat,      /* TT_L_CONCAT */
    dispatch_patch,       /* TT_L_PATCH_EMBED */
    dispatch_layernorm,   /* TT_L_LAYERNORM */
    dispatch_attention,   /* TT_L_ATTENTION */
    dispatch_unary,       /* TT_L_GELU */
    dispatch_token,       /* TT_L_TOKEN */
};

int tt_step_calls(const tt_program *p, const tt_step *s, int batch, tt_call calls[TT_STEP_MAX_CALLS]) {
  dispatch_ctx d;
  if (s->op != TT_S_FWD && s->op != TT_S_BWD) return 0;
  if ((int)s->kind < 0 || s->kind >= TT_L_KIND_COUNT || !dispatch_by_kind[s->kind]) return -1;
  memset(&d, 0, sizeof d);
  d.p = p, d.s = s, d.a = &s->a, d.batch = batch, d.dt = p->policy.act_dtype, d.calls = calls;
  d.bwd = s->op == TT_S_BWD;
  d.dx = d.bwd ? s->out[TT_BWD_DX] : -1;
  d.bdx = d.bwd ? (float)s->out_beta[TT_BWD_DX] : 0.0f;
  d.nhwc = (s->flags & TT_SF_NHWC) != 0;
  d.blk = (s->flags & TT_SF_NCHW16C) != 0;
  d.cnt = (size_t)batch * s->a.eltwise.numel; /* elementwise kinds only */
  dispatch_by_kind[s->kind](&d);
  return d.n;
}

int tt_step_backend_ops(const tt_program *p, const tt_step *s, int batch, tt_op_desc ops[TT_STEP_MAX_OPS]) {
  tt_call calls[TT_STEP_MAX_CALLS];
  int n = tt_step_calls(p, s, batch, calls), m = 0;
  for (int k = 0; k < n; k++)
    if (calls[k].fn < TT_OP_KIND_COUNT && m < TT_STEP_MAX_OPS) ops[m++] = calls[k].op;
  return m;
}
