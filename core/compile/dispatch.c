/* core/compile/dispatch.c — a layer step's backend calls (see dispatch.h). */
#include <math.h>
#include <string.h>

#include "dispatch.h"

/* A new call of fn in dt with every operand empty. */
static tt_call *dispatch_add(tt_call *calls, int *n, int fn, tt_dtype dt) {
  tt_call *c = &calls[(*n)++];
  memset(c, 0, sizeof *c); /* the desc whole: backends compare descs bytewise */
  c->fn = fn;
  if (fn < TT_OP_KIND_COUNT) c->op.kind = (tt_op_kind)fn;
  c->op.dt = dt;
  for (int k = 0; k < 5; k++) c->in[k] = -1;
  for (int k = 0; k < 3; k++) c->out[k] = -1;
  return c;
}

static void dispatch_in(tt_call *c, int a, int b, int d) { c->in[0] = a, c->in[1] = b, c->in[2] = d; }

int tt_step_calls(const tt_program *p, const tt_step *s, int batch, tt_call calls[TT_STEP_MAX_CALLS]) {
  tt_dtype dt = p->policy.act_dtype;
  const tt_op_args *a = &s->a;
  tt_call *c;
  int n = 0, bwd = s->op == TT_S_BWD, dx = bwd ? s->out[TT_BWD_DX] : -1;
  /* NHWC (TT_SF_NHWC): the ops that see only channels run on [batch*h*w, c, 1] (backend.h) */
  int nhwc = (s->flags & TT_SF_NHWC) != 0;
  float bdx = bwd ? (float)s->out_beta[TT_BWD_DX] : 0.0f;
  size_t cnt = (size_t)batch * a->eltwise.numel; /* elementwise kinds only */
  if (s->op != TT_S_FWD && !bwd) return 0;
  switch (s->kind) {
    case TT_L_CONV:
    case TT_L_LINEAR: {
      int conv = s->kind == TT_L_CONV;
      int lossy = conv && (s->flags & TT_SF_COMPACT) && p->policy.compress;
      tt_call *z = NULL; /* the lossy copy's call: shapes set after the loop below */
      if (!bwd) {
        c = dispatch_add(calls, &n, conv ? TT_OP_CONV_FWD : TT_OP_LINEAR_FWD, dt);
        c->op.bias = s->in[TT_FWD_B] >= 0;
        dispatch_in(c, s->in[TT_FWD_X], s->in[TT_FWD_W], s->in[TT_FWD_B]);
        c->out[0] = s->out[TT_FWD_Y];
        if (lossy) {
          z = dispatch_add(calls, &n, TT_CALL_SAVE_COMPRESS, dt);
          dispatch_in(z, s->in[TT_FWD_X], -1, -1);
          z->out[0] = s->out[TT_FWD_COMPACT];
        }
      } else {
        if (lossy) {
          z = dispatch_add(calls, &n, TT_CALL_SAVE_RESTORE, dt);
          dispatch_in(z, s->in[TT_BWD_SAVED], -1, -1);
          z->out[0] = s->out[TT_BWD_RESTORED];
        }
        c = dispatch_add(calls, &n, conv ? TT_OP_CONV_BWD_FILTER : TT_OP_LINEAR_BWD_FILTER, dt);
        c->op.bias = s->out[TT_BWD_DB] >= 0;
        dispatch_in(c, lossy ? s->out[TT_BWD_RESTORED] : s->in[TT_BWD_SAVED], s->in[TT_BWD_DY], -1);
        c->out[0] = s->out[TT_BWD_DW], c->out[1] = s->out[TT_BWD_DB];
        c->param_grads = 1;
        c->planned_only = c->out[0] < 0;
        if (dx >= 0) {
          c = dispatch_add(calls, &n, conv ? TT_OP_CONV_BWD_DATA : TT_OP_LINEAR_BWD_DATA, dt);
          c->op.accumulate = s->out_beta[TT_BWD_DX];
          dispatch_in(c, s->in[TT_BWD_DY], s->in[TT_BWD_W], -1);
          c->out[0] = dx, c->beta = bdx;
        }
      }
      for (int k = 0; k < n; k++) /* the same shape for every call of the step */
        if (&calls[k] == z) {
          z->fmt = p->policy.compress;
          z->op.u.bn.n = batch, z->op.u.bn.c = a->conv.c, z->op.u.bn.hw = a->conv.h * a->conv.w;
          if (a->conv.layout_x == TT_LAYOUT_NHWC) z->op.u.bn.n = batch * z->op.u.bn.hw, z->op.u.bn.hw = 1;
        } else if (conv) {
          calls[k].op.u.conv = a->conv, calls[k].op.u.conv.n = batch;
        } else { /* over a token tensor: one row per token */
          calls[k].op.u.linear.n = batch * a->linear.rows, calls[k].op.u.linear.in = a->linear.in;
          calls[k].op.u.linear.out = a->linear.out;
        }
      break;
    }
    case TT_L_PATCH_EMBED: {
      /* forward: conv -> [N, dim, hw] (TT_PE_CONV), then tokens (class token, position embedding)
       * -> y [N, t, dim]; backward: tokens_bwd -> the conv output's gradient (and the class
       * token's and position embedding's), then the conv's filter and data gradients */
      const tt_conv_desc *cd = &a->patch.conv;
      if (!bwd) {
        c = dispatch_add(calls, &n, TT_OP_CONV_FWD, dt);
        c->op.bias = s->in[TT_FWD_B] >= 0;
        dispatch_in(c, s->in[TT_FWD_X], s->in[TT_FWD_W], s->in[TT_FWD_B]);
        c->out[0] = s->out[TT_PE_CONV];
        c->op.u.conv = *cd, c->op.u.conv.n = batch;
        c = dispatch_add(calls, &n, TT_CALL_TOKENS_FWD, dt);
        dispatch_in(c, s->out[TT_PE_CONV], s->in[TT_PE_CLS], s->in[TT_PE_POS]);
        c->out[0] = s->out[TT_FWD_Y];
      } else {
        c = dispatch_add(calls, &n, TT_CALL_TOKENS_BWD, dt);
        dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
        c->out[0] = s->out[TT_PE_DCONV], c->out[1] = s->out[TT_PE_DCLS], c->out[2] = s->out[TT_PE_DPOS];
        c->param_grads = 1; /* beta 0: the conv output's gradient is this step's own */
      }
      c->op.u.bn.n = batch, c->op.u.bn.c = cd->k, c->op.u.bn.hw = cd->p * cd->q, c->mode = a->patch.cls;
      if (bwd) {
        c = dispatch_add(calls, &n, TT_OP_CONV_BWD_FILTER, dt);
        c->op.bias = s->out[TT_BWD_DB] >= 0;
        dispatch_in(c, s->in[TT_BWD_SAVED], s->out[TT_PE_DCONV], -1);
        c->out[0] = s->out[TT_BWD_DW], c->out[1] = s->out[TT_BWD_DB];
        c->param_grads = 1, c->planned_only = c->out[0] < 0;
        c->op.u.conv = *cd, c->op.u.conv.n = batch;
        if (dx >= 0) {
          c = dispatch_add(calls, &n, TT_OP_CONV_BWD_DATA, dt);
          c->op.accumulate = s->out_beta[TT_BWD_DX];
          dispatch_in(c, s->out[TT_PE_DCONV], s->in[TT_BWD_W], -1);
          c->out[0] = dx, c->beta = bdx;
          c->op.u.conv = *cd, c->op.u.conv.n = batch;
        }
      }
      break;
    }
    case TT_L_LAYERNORM:
      if (bwd) {
        if (dx < 0 && s->out[TT_BWD_DW] < 0) break; /* nothing to compute */
        c = dispatch_add(calls, &n, TT_OP_LN_BWD, dt);
        c->op.accumulate = s->out_beta[TT_BWD_DX];
        dispatch_in(c, s->in[TT_BWD_SAVED], s->in[TT_BWD_DY], s->in[TT_BWD_GAMMA]);
        c->in[3] = s->in[TT_BWD_SAVE_MEAN], c->in[4] = s->in[TT_BWD_SAVE_INVSTD];
        c->out[0] = dx, c->out[1] = s->out[TT_BWD_DW], c->out[2] = s->out[TT_BWD_DB];
        c->beta = bdx, c->param_grads = 1;
      } else { /* evaluation: no statistics saved (the out slots are -1) */
        c = dispatch_add(calls, &n, TT_OP_LN_FWD, dt);
        dispatch_in(c, s->in[TT_FWD_X], s->in[TT_BN_GAMMA], s->in[TT_BN_BETA]);
        c->out[0] = s->out[TT_FWD_Y], c->out[1] = s->out[TT_BN_SAVE_MEAN], c->out[2] = s->out[TT_BN_SAVE_INVSTD];
      }
      c->op.u.ln.rows = batch * a->ln.rows, c->op.u.ln.f = a->ln.f, c->op.u.ln.eps = a->ln.eps;
      break;
    case TT_L_ATTENTION: {
      /* in-proj linear over N*t rows -> qkv [N, t, 3f]; attn_fwd -> o [N, t, f] (and lse, probs);
       * out-proj linear -> y. Backward in reverse: out-proj (dW from o, then do), attn_bwd -> dqkv,
       * in-proj (dW from x, then dx). */
      int rows = batch * a->attn.t, f = a->attn.f;
      tt_attn_desc ad;
      memset(&ad, 0, sizeof ad);
      ad.n = batch, ad.t = a->attn.t, ad.heads = a->attn.heads, ad.d = f / a->attn.heads, ad.causal = a->attn.causal;
      ad.scale = 1.0f / sqrtf((float)ad.d);
      ad.p = (s->flags & TT_SF_EVAL) ? 0.0f : a->attn.p; /* dropout on the probabilities: training only */
      if (!bwd) {
        c = dispatch_add(calls, &n, TT_OP_LINEAR_FWD, dt);
        c->op.bias = s->in[TT_FWD_B] >= 0;
        dispatch_in(c, s->in[TT_FWD_X], s->in[TT_FWD_W], s->in[TT_FWD_B]);
        c->out[0] = s->out[TT_AT_QKV];
        c->op.u.linear.n = rows, c->op.u.linear.in = f, c->op.u.linear.out = 3 * f;
        c = dispatch_add(calls, &n, TT_OP_ATTN_FWD, dt);
        dispatch_in(c, s->out[TT_AT_QKV], -1, -1);
        c->out[0] = s->out[TT_AT_O], c->out[1] = s->out[TT_AT_LSE], c->out[2] = s->out[TT_AT_PROBS];
        c->op.u.attn = ad;
        c = dispatch_add(calls, &n, TT_OP_LINEAR_FWD, dt);
        c->op.bias = s->in[TT_AT_OUT_B] >= 0;
        dispatch_in(c, s->out[TT_AT_O], s->in[TT_AT_OUT_W], s->in[TT_AT_OUT_B]);
        c->out[0] = s->out[TT_FWD_Y];
        c->op.u.linear.n = rows, c->op.u.linear.in = f, c->op.u.linear.out = f;
        break;
      }
      c = dispatch_add(calls, &n, TT_OP_LINEAR_BWD_FILTER, dt);
      c->op.bias = s->out[TT_AB_DOUT_B] >= 0;
      dispatch_in(c, s->in[TT_AB_O], s->in[TT_BWD_DY], -1);
      c->out[0] = s->out[TT_AB_DOUT_W], c->out[1] = s->out[TT_AB_DOUT_B];
      c->param_grads = 1, c->planned_only = c->out[0] < 0;
      c->op.u.linear.n = rows, c->op.u.linear.in = f, c->op.u.linear.out = f;
      c = dispatch_add(calls, &n, TT_OP_LINEAR_BWD_DATA, dt);
      dispatch_in(c, s->in[TT_BWD_DY], s->in[TT_AB_OUT_W], -1);
      c->out[0] = s->out[TT_AB_DO];
      c->op.u.linear.n = rows, c->op.u.linear.in = f, c->op.u.linear.out = f;
      c = dispatch_add(calls, &n, TT_OP_ATTN_BWD, dt);
      dispatch_in(c, s->in[TT_AB_QKV], s->in[TT_AB_O], s->out[TT_AB_DO]);
      c->in[3] = s->in[TT_AB_LSE], c->in[4] = s->in[TT_AB_PROBS];
      c->out[0] = s->out[TT_AB_DQKV];
      c->op.u.attn = ad;
      c = dispatch_add(calls, &n, TT_OP_LINEAR_BWD_FILTER, dt);
      c->op.bias = s->out[TT_BWD_DB] >= 0;
      dispatch_in(c, s->in[TT_BWD_SAVED], s->out[TT_AB_DQKV], -1);
      c->out[0] = s->out[TT_BWD_DW], c->out[1] = s->out[TT_BWD_DB];
      c->param_grads = 1, c->planned_only = c->out[0] < 0;
      c->op.u.linear.n = rows, c->op.u.linear.in = f, c->op.u.linear.out = 3 * f;
      if (dx >= 0) {
        c = dispatch_add(calls, &n, TT_OP_LINEAR_BWD_DATA, dt);
        c->op.accumulate = s->out_beta[TT_BWD_DX];
        dispatch_in(c, s->out[TT_AB_DQKV], s->in[TT_BWD_W], -1);
        c->out[0] = dx, c->beta = bdx;
        c->op.u.linear.n = rows, c->op.u.linear.in = f, c->op.u.linear.out = 3 * f;
      }
      break;
    }
    case TT_L_TOKEN:
      if (bwd && dx < 0) break;
      c = dispatch_add(calls, &n, bwd ? TT_CALL_TOKEN_POOL_BWD : TT_CALL_TOKEN_POOL_FWD, dt);
      if (!bwd) {
        dispatch_in(c, s->in[TT_FWD_X], -1, -1);
        c->out[0] = s->out[TT_FWD_Y];
      } else {
        dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
        c->out[0] = dx, c->beta = bdx;
      }
      c->op.u.bn.n = batch, c->op.u.bn.c = a->token.f, c->op.u.bn.hw = a->token.t, c->mode = a->token.mode;
      break;
    case TT_L_BN:
      if (bwd) {
        c = dispatch_add(calls, &n, TT_OP_BN_BWD, dt);
        c->op.accumulate = s->out_beta[TT_BWD_DX];
        dispatch_in(c, s->in[TT_BWD_SAVED], s->in[TT_BWD_DY], s->in[TT_BWD_GAMMA]);
        c->in[3] = s->in[TT_BWD_SAVE_MEAN], c->in[4] = s->in[TT_BWD_SAVE_INVSTD];
        c->out[0] = dx, c->out[1] = s->out[TT_BWD_DW], c->out[2] = s->out[TT_BWD_DB];
        c->beta = bdx, c->param_grads = 1;
      } else if (s->flags & TT_SF_BN_APPLY) { /* rebuilt from the forward's saved statistics */
        c = dispatch_add(calls, &n, TT_CALL_BN_APPLY, dt);
        dispatch_in(c, s->in[TT_FWD_X], s->in[TT_BN_GAMMA], s->in[TT_BN_BETA]);
        c->in[3] = s->in[TT_BN_APPLY_MEAN], c->in[4] = s->in[TT_BN_APPLY_INVSTD];
        c->out[0] = s->out[TT_FWD_Y];
      } else {
        c = dispatch_add(calls, &n, (s->flags & TT_SF_EVAL) ? TT_OP_BN_FWD_INFER : TT_OP_BN_FWD_TRAIN, dt);
        dispatch_in(c, s->in[TT_FWD_X], s->in[TT_BN_GAMMA], s->in[TT_BN_BETA]);
        c->in[3] = s->in[TT_BN_RMEAN], c->in[4] = s->in[TT_BN_RVAR];
        c->out[0] = s->out[TT_FWD_Y];
        if (!(s->flags & TT_SF_EVAL)) c->out[1] = s->out[TT_BN_SAVE_MEAN], c->out[2] = s->out[TT_BN_SAVE_INVSTD];
        c->momentum = a->bn.momentum;
        c->update_running = !(s->flags & TT_SF_RECOMPUTE);
      }
      c->op.u.bn.n = batch, c->op.u.bn.c = a->bn.c, c->op.u.bn.hw = a->bn.hw, c->op.u.bn.eps = a->bn.eps;
      if (nhwc) c->op.u.bn.n = batch * a->bn.hw, c->op.u.bn.hw = 1;
      break;
    case TT_L_RELU:
    case TT_L_RELU6:
    case TT_L_SILU:
    case TT_L_GELU:
    case TT_L_MAXPOOL:
    case TT_L_AVGPOOL:
    case TT_L_DROPOUT:
    case TT_L_GAP: {
      /* one input, one output, no parameters: a backward with no dx to write (fed by the image)
       * has nothing to do */
      int act = s->kind == TT_L_RELU || s->kind == TT_L_RELU6 || s->kind == TT_L_SILU || s->kind == TT_L_GELU;
      int pool = s->kind == TT_L_MAXPOOL || s->kind == TT_L_AVGPOOL;
      int compact = (s->flags & TT_SF_COMPACT) != 0;
      int gap_pool = s->kind == TT_L_GAP && nhwc; /* an NHWC input: average pooling over the whole h x w */
      pool = pool || gap_pool;
      if (bwd && dx < 0) break;
      if (act)
        c = dispatch_add(calls, &n, bwd ? (compact ? TT_CALL_ACT_BWD_MASK : TT_OP_ACT_BWD) : TT_OP_ACT_FWD, dt);
      else if (pool)
        c = dispatch_add(calls, &n, bwd ? (compact ? TT_CALL_POOL_BWD_IDX : TT_OP_POOL_BWD) : TT_OP_POOL_FWD, dt);
      else if (s->kind == TT_L_DROPOUT)
        c = dispatch_add(calls, &n, bwd ? TT_CALL_DROPOUT_BWD : TT_CALL_DROPOUT_FWD, dt);
      else
        c = dispatch_add(calls, &n, bwd ? TT_CALL_GAP_BWD : TT_CALL_GAP_FWD, dt);
      if (!bwd) {
        dispatch_in(c, s->in[TT_FWD_X], -1, -1);
        c->out[0] = s->out[TT_FWD_Y];
      } else if (s->kind == TT_L_DROPOUT || (s->kind == TT_L_GAP && !gap_pool)) { /* the mask is regenerated; gap reads only dy */
        dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
        c->out[0] = dx, c->beta = bdx;
      } else if (gap_pool) { /* average pooling's backward reads only dy (x NULL) */
        c->op.accumulate = s->out_beta[TT_BWD_DX];
        dispatch_in(c, -1, s->in[TT_BWD_DY], -1);
        c->out[0] = dx, c->beta = bdx;
      } else {
        c->op.accumulate = s->out_beta[TT_BWD_DX];
        dispatch_in(c, s->in[TT_BWD_SAVED], s->in[TT_BWD_DY], -1);
        c->out[0] = dx, c->beta = bdx;
      }
      if (act) {
        if (s->kind == TT_L_GELU) /* PyTorch's nn.GELU(approximate = 'none' | 'tanh') */
          c->op.u.act.act = p->graph->nodes[s->node].L->approximate ? TT_ACT_GELU_TANH : TT_ACT_GELU_ERF;
        else
          c->op.u.act.act = s->kind == TT_L_RELU ? TT_ACT_RELU : (s->kind == TT_L_RELU6 ? TT_ACT_RELU6 : TT_ACT_SILU);
        c->op.u.act.count = cnt;
      } else if (gap_pool) {
        tt_pool_desc *d = &c->op.u.pool;
        c->op.pool_mode = TT_POOL_AVG;
        d->n = batch, d->c = a->gap.c, d->h = d->kh = a->gap.h, d->w = d->kw = a->gap.w;
        d->stride_h = d->stride_w = 1, d->p = d->q = 1, d->layout = TT_LAYOUT_NHWC;
      } else if (pool) {
        c->op.pool_mode = s->kind == TT_L_MAXPOOL ? TT_POOL_MAX : TT_POOL_AVG;
        c->op.u.pool = a->pool, c->op.u.pool.n = batch;
      } else if (s->kind == TT_L_DROPOUT) {
        c->op.u.act.count = cnt, c->p = a->eltwise.p;
      } else {
        c->op.u.bn.n = batch, c->op.u.bn.c = a->gap.c, c->op.u.bn.hw = a->gap.hw;
      }
      if (compact && !bwd && (act || pool)) { /* the compact save, from y (act) or x (pool) */
        tt_call *m = dispatch_add(calls, &n, act ? TT_CALL_ACT_MASK : TT_CALL_POOL_ARGMAX, dt);
        m->op.u = c->op.u, m->op.pool_mode = c->op.pool_mode;
        dispatch_in(m, act ? s->out[TT_FWD_Y] : s->in[TT_FWD_X], -1, -1);
        m->out[0] = s->out[TT_FWD_COMPACT];
      }
      break;
    }
    case TT_L_ADD:
      if (!bwd) { /* y = x0 + x1, then y += xk */
        for (int k = 1; k < s->nin; k++) {
          c = dispatch_add(calls, &n, TT_CALL_ADD, dt);
          dispatch_in(c, k == 1 ? s->in[0] : s->out[TT_FWD_Y], s->in[k], -1);
          c->out[0] = s->out[TT_FWD_Y], c->op.u.act.count = cnt;
        }
        break;
      }
      for (int k = 0; k < s->nout; k++) { /* every input's gradient is dy, added or copied */
        if (s->out[k] < 0) continue;
        c = dispatch_add(calls, &n, TT_CALL_ACCUMULATE, dt);
        dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
        c->out[0] = s->out[k], c->beta = (float)s->out_beta[k], c->op.u.act.count = cnt;
        c->dy_alias_last = 1;
      }
      break;
    case TT_L_CONCAT:
      /* forward: input k into channels [off, off + cin[k]) of y [N, c, hw]; backward: those
       * channels of dy into input k's gradient */
      for (int k = 0, off = 0; k < a->concat.nin; off += a->concat.cin[k], k++) {
        if (bwd && s->out[k] < 0) continue;
        c = dispatch_add(calls, &n, TT_CALL_CHANNEL_COPY, dt);
        c->op.u.bn.n = batch, c->hw = a->concat.hw, c->nc = a->concat.cin[k];
        if (nhwc) c->op.u.bn.n = batch * a->concat.hw, c->hw = 1;
        if (!bwd) {
          dispatch_in(c, s->in[k], -1, -1);
          c->out[0] = s->out[TT_FWD_Y];
          c->src_c = a->concat.cin[k], c->src_off = 0, c->dst_c = a->concat.c, c->dst_off = off;
        } else {
          dispatch_in(c, s->in[TT_BWD_DY], -1, -1);
          c->out[0] = s->out[k], c->beta = (float)s->out_beta[k];
          c->src_c = a->concat.c, c->src_off = off, c->dst_c = a->concat.cin[k], c->dst_off = 0;
        }
      }
      break;
    default:
      return -1;
  }
  return n;
}

int tt_step_backend_ops(const tt_program *p, const tt_step *s, int batch, tt_op_desc ops[TT_STEP_MAX_OPS]) {
  tt_call calls[TT_STEP_MAX_CALLS];
  int n = tt_step_calls(p, s, batch, calls), m = 0;
  for (int k = 0; k < n; k++)
    if (calls[k].fn < TT_OP_KIND_COUNT && m < TT_STEP_MAX_OPS) ops[m++] = calls[k].op;
  return m;
}
