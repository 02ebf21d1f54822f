/* core/compile/calls.c — the last lowering pass: a planned Program's steps resolved into the final
 * list of backend calls (program.h tt_call), fusions decided from one table. The executor walks
 * this list and nothing else; `plan --calls` and `plan --json` print it.
 *
 * Runs after tt_program_plan has placed the buffers, because a fusion is only sound where the
 * planned storage lets one call do the pair's work (a fused backward reads a buffer that the plan
 * let die at the first step of the pair). */
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "program.h"

const char *tt_call_name(int fn) {
  static const char *const names[TT_CALL_COUNT] = {
      "conv_fwd", "conv_bwd_data", "conv_bwd_filter", "linear_fwd", "linear_bwd_data", "linear_bwd_filter",
      "bn_fwd_train", "bn_fwd_infer", "bn_bwd", "pool_fwd", "pool_bwd", "act_fwd", "act_bwd", "ln_fwd", "ln_bwd",
      "attn_fwd", "attn_bwd",
      /* TT_CALL_* */
      "gap_fwd", "gap_bwd", "dropout_fwd", "dropout_bwd", "add", "accumulate", "channel_copy", "act_mask",
      "act_bwd_mask", "pool_argmax", "pool_bwd_idx", "save_compress", "save_restore", "tokens_fwd", "tokens_bwd",
      "token_pool_fwd", "token_pool_bwd", "bn_apply", "bn_fwd_train_relu", "bn_bwd_relu", "bn_fwd_train_add_relu", "bn_bwd_add_relu", "normalize_u8", "cast",
      "cast_multi", "softmax_ce", "zero", "check_finite", "check_finite_multi", "sum_squares", "update", "update_multi",
      "offload"};
  return fn >= 0 && fn < TT_CALL_COUNT && names[fn] ? names[fn] : "call";
}

int tt_program_caps(const tt_backend *be, int fuse) {
  int caps = be->plan_caps & (fuse ? ~0 : ~TT_CAP_FUSIONS);
  if (fuse && be->bn_fwd_train_relu) caps |= TT_CAP_BN_RELU_FWD;
  if (fuse && be->bn_bwd_relu) caps |= TT_CAP_BN_RELU_BWD;
  if (fuse && be->bn_fwd_train_add_relu) caps |= TT_CAP_BN_ADD_RELU_FWD;
  if (fuse && be->bn_bwd_add_relu) caps |= TT_CAP_BN_ADD_RELU_BWD;
  if (be->cast_multi) caps |= TT_CAP_CAST_MULTI;
  if (be->filter_krsc && be->cast_multi) caps |= TT_CAP_FILTER_KRSC;
  if (be->sgd_update_multi && be->adam_update_multi) caps |= TT_CAP_UPDATE_MULTI;
  return caps;
}

/* The list being built: grows by doubling. */
typedef struct calls_list {
  tt_program *p;
  tt_call *v;
  int n, cap;
  tt_err *err;
} calls_list;

/* A new call appended for step `step` with every operand empty; NULL when out of memory. */
static tt_call *calls_push(calls_list *l, int fn, int step) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    tt_call *v = (tt_call *)realloc(l->v, sizeof(tt_call) * (size_t)cap);
    if (!v) {
      tt_fail(l->err, "out of memory for the program's call list (%d calls)", cap);
      return NULL;
    }
    l->v = v, l->cap = cap;
  }
  tt_call *c = &l->v[l->n++];
  memset(c, 0, sizeof *c);
  c->fn = fn, c->step = step, c->fused_into = -1, c->ws = -1;
  c->node = l->p->steps[step].node;
  for (int k = 0; k < TT_CALL_MAX_IN; k++) c->in[k] = -1;
  for (int k = 0; k < TT_CALL_MAX_OUT; k++) c->out[k] = -1;
  c->op.dt = l->p->policy.act_dtype;
  return c;
}

/* Whether buffers a and b are the same planned storage (same offset). */
static int calls_same(const tt_program *p, int a, int b) {
  return a >= 0 && b >= 0 && p->bufs[a].offset == p->bufs[b].offset;
}

/* Whether buffer w's storage overlaps buffer r's (-1: none); same_ok: not when they are the same
 * storage exactly. */
static int calls_overlap(const tt_program *p, int r, int w, int same_ok) {
  if (r < 0 || w < 0) return 0;
  size_t r0 = p->bufs[r].offset, w0 = p->bufs[w].offset, rb = p->bufs[r].bytes, wb = p->bufs[w].bytes;
  if (same_ok && r0 == w0 && rb == wb) return 0;
  return r0 < w0 + wb && w0 < r0 + rb;
}

/* The gradient region: every gradient accumulator, end to end in the arena (lower.c makes them one
 * after another, tt_program_plan packs persistent buffers in that order), from the first's offset
 * to the last's end: *off and *count floats. The alignment padding between them belongs to no
 * buffer, was zeroed with the persistent region at setup and is never written (a multi-process
 * all-reduce sums it as zeros), so it adds nothing to a sum of squares or an overflow check.
 * Checked: no other persistent buffer lies inside. */
static int calls_grad_region(const tt_program *p, size_t *off, size_t *count, tt_err *err) {
  size_t lo = (size_t)-1, hi = 0;
  if (p->transient_grads)
    return tt_fail(err, "internal error: %d gradients are transient, not one region (lower.c keeps them persistent "
                   "under clip_norm)", p->transient_grads);
  for (int k = 0; k < p->nparams; k++) {
    int gb = p->grad_buf[k];
    if (gb < 0) continue;
    if (p->bufs[gb].offset < lo) lo = p->bufs[gb].offset;
    if (p->bufs[gb].offset + p->bufs[gb].bytes > hi) hi = p->bufs[gb].offset + p->bufs[gb].bytes;
  }
  *off = *count = 0;
  if (hi <= lo) return 0;
  for (int i = 0; i < p->nbufs; i++) {
    const tt_buf *b = &p->bufs[i];
    if (!b->persistent || b->host || b->cls == TT_BC_GRADS || b->offset >= hi || b->offset + b->bytes <= lo) continue;
    return tt_fail(err, "internal error: buffer '%s' lies inside the gradient region [%zu, %zu) that clip_norm sums",
                   b->name, lo, hi);
  }
  *off = lo;
  *count = (hi - lo) / sizeof(float);
  return 0;
}

/* A forward or backward step's calls (dispatch.h) at the planned micro-batch, in run order: an add
 * backward's copy into dy's own storage after the step's other calls, which still read dy. */
static int calls_layer(calls_list *l, int i) {
  const tt_program *p = l->p;
  const tt_step *s = &p->steps[i];
  tt_call tmp[TT_STEP_MAX_CALLS];
  int n = tt_step_calls(p, s, p->policy.micro_batch, tmp);
  if (n < 0)
    return tt_fail(l->err, "internal error: no %s for layer '%s' of kind %s", s->op == TT_S_BWD ? "backward" : "forward",
                   s->name ? s->name : "?", tt_layer_kind_name(s->kind));
  for (int pass = 0; pass < 2; pass++)
    for (int k = 0; k < n; k++) {
      int late = tmp[k].dy_alias_last && calls_same(p, tmp[k].out[0], tmp[k].in[0]);
      if (late != pass) continue;
      tt_call *c = calls_push(l, tmp[k].fn, i);
      if (!c) return -1;
      *c = tmp[k];
      c->step = i, c->node = s->node, c->ws = s->ws, c->fused_into = -1;
      c->prepared = c->fn < TT_OP_KIND_COUNT;
    }
  return 0;
}

/* The update phase's overflow check: zero the flag, then every gradient in one call: the whole
 * region, or (transient gradients are no region) one check_finite_multi call followed by its
 * members, one per gradient, which the executor binds into its segment table (exec.c). */
static int calls_check(calls_list *l, int i) {
  const tt_program *p = l->p;
  int flag = p->steps[i].out[TT_CHECK_FLAG];
  tt_call *c = calls_push(l, TT_CALL_ZERO_FLAG, i);
  if (!c) return -1;
  c->out[0] = flag, c->a.count = sizeof(int32_t);
  if (p->transient_grads) {
    int n = 0;
    for (int k = 0; k < p->nparams; k++) n += p->grad_buf[k] >= 0;
    if (!n) return 0;
    if (!(c = calls_push(l, TT_CALL_CHECK_FINITE_MULTI, i))) return -1;
    c->out[0] = flag, c->op.dt = TT_F32, c->nseg = n;
    for (int k = 0; k < p->nparams; k++) {
      if (p->grad_buf[k] < 0) continue;
      if (!(c = calls_push(l, TT_CALL_CHECK_FINITE, i))) return -1;
      c->in[0] = p->grad_buf[k], c->out[0] = flag, c->op.dt = TT_F32, c->skip = TT_CALL_MEMBER;
      c->region_count = p->bufs[p->grad_buf[k]].bytes / sizeof(float);
    }
    return 0;
  }
  size_t off, cnt;
  if (calls_grad_region(p, &off, &cnt, l->err)) return -1;
  if (!cnt) return 0;
  if (!(c = calls_push(l, TT_CALL_CHECK_FINITE, i))) return -1;
  c->out[0] = flag, c->op.dt = TT_F32, c->region_off = off, c->region_count = cnt;
  return 0;
}

/* A run of consecutive steps of one kind (CAST steps casting to one dtype, or UPDATE steps) as a
 * *_MULTI call followed by its members, where the backend has the many-tensor entry point. */
static int calls_run_end(const tt_program *p, int i, int end) {
  int j = i + 1;
  if (p->steps[i].op == TT_S_CAST)
    while (j < end && p->steps[j].op == TT_S_CAST &&
           p->bufs[p->steps[j].out[TT_CAST_DST]].dtype == p->bufs[p->steps[i].out[TT_CAST_DST]].dtype)
      j++;
  else
    while (j < end && p->steps[j].op == p->steps[i].op) j++;
  return j;
}

/* The one fixed call of a step other than a layer's (load, cast, loss, clip, update); CHECK has
 * its own (calls_check). member: a member of a *_MULTI call before it. */
static int calls_fixed(calls_list *l, int i, int member) {
  const tt_step *s = &l->p->steps[i];
  static const int fn_of[] = {TT_CALL_NORMALIZE, TT_CALL_CAST, -1, TT_CALL_SOFTMAX_CE, -1, -1, TT_CALL_UPDATE, TT_CALL_CLIP,
                                TT_CALL_OFFLOAD};
  tt_call *c;
  if ((int)s->op < 0 || (size_t)s->op >= sizeof fn_of / sizeof fn_of[0] || fn_of[s->op] < 0)
    return tt_fail(l->err, "internal error: step %d of kind %d has no fixed call", i, (int)s->op);
  if (!(c = calls_push(l, fn_of[s->op], i))) return -1;
  c->a = s->a, c->skip = member ? TT_CALL_MEMBER : TT_CALL_RUNS;
  switch (s->op) {
    case TT_S_LOAD_INPUT: c->in[0] = s->in[TT_LOAD_U8], c->out[0] = s->out[TT_LOAD_X]; break;
    case TT_S_CAST:
      c->in[0] = s->in[TT_CAST_SRC], c->out[0] = s->out[TT_CAST_DST];
      c->op.dt = l->p->bufs[s->out[TT_CAST_DST]].dtype;
      if (l->p->bufs[s->out[TT_CAST_DST]].krsc) { /* written KRSC: only cast_multi's segments transpose */
        const tt_param *pr = &l->p->graph->params[s->arg];
        if (!member || pr->ndim != 4)
          return tt_fail(l->err, "internal error: the KRSC copy '%s' is not cast by cast_multi as a 4-D filter",
                         l->p->bufs[s->out[TT_CAST_DST]].name);
        c->filter_k = (int)pr->shape[0], c->filter_rs = (int)(pr->shape[2] * pr->shape[3]);
      }
      break;
    case TT_S_LOSS:
      c->in[0] = s->in[TT_LOSS_LOGITS], c->in[1] = s->in[TT_LOSS_LABELS];
      c->out[0] = s->out[TT_LOSS_DLOGITS], c->out[1] = s->out[TT_LOSS_STATS];
      break;
    case TT_S_CLIP:
      c->out[0] = s->out[TT_CLIP_SUMSQ], c->op.dt = TT_F32;
      if (calls_grad_region(l->p, &c->region_off, &c->region_count, l->err)) return -1;
      break;
    case TT_S_OFFLOAD: /* an offloaded activation's copy or event (offload.c) */
      c->in[0] = s->in[0], c->out[0] = s->out[0], c->mode = s->arg, c->node = s->node;
      c->op.dt = l->p->bufs[s->in[0]].dtype;
      break;
    default: /* TT_S_UPDATE */
      c->in[0] = s->in[TT_UPD_GRAD], c->out[0] = s->out[TT_UPD_PARAM], c->out[1] = s->out[TT_UPD_M];
      c->out[2] = s->out[TT_UPD_V], c->op.dt = TT_F32, c->decay = (s->flags & TT_SF_DECAY) != 0;
      break;
  }
  return 0;
}

/* ---- the fusion table ----
 * A rule joins the one running call of step i with the one of step i + 1 when the steps' op and
 * layer kinds match and `match` accepts; `apply` then rewrites the pair. Every fused call is bit
 * for bit the calls it replaces (backend.h), so a fusion changes no result. */
typedef struct calls_fusion {
  const char *name;
  int cap;                       /* TT_CAP_* the backend must offer */
  tt_step_op op;                 /* both steps' */
  tt_layer_kind first, second;   /* the steps' layer kinds */
  int (*match)(const tt_program *p, const tt_call *a, const tt_call *b);
  void (*apply)(const tt_program *p, tt_call *a, tt_call *b, int ia, int ib);
} calls_fusion;

/* A ReLU node fed by one batch norm node that feeds nothing else (read off the graph). */
static int calls_bn_relu_nodes(const tt_program *p, int relu_node, int bn_node) {
  const tt_graph *g = p->graph;
  if (!g || relu_node < 0 || bn_node < 0) return 0;
  const tt_node *r = &g->nodes[relu_node];
  return r->nin == 1 && r->in[0] == bn_node && g->nodes[bn_node].kind == TT_L_BN && g->nodes[bn_node].nconsumers == 1;
}

/* forward: the training forward's bn_fwd_train immediately followed by a ReLU act_fwd working in
 * place on its y over exactly its elements: the batch norm call clamps, the ReLU's runs nothing. */
static int calls_match_bn_relu_fwd(const tt_program *p, const tt_call *a, const tt_call *b) {
  return calls_bn_relu_nodes(p, b->node, a->node) && a->fn == TT_OP_BN_FWD_TRAIN && b->fn == TT_OP_ACT_FWD &&
         b->op.u.act.act == TT_ACT_RELU && calls_same(p, b->in[0], a->out[0]) && calls_same(p, b->out[0], b->in[0]) &&
         b->op.u.act.count == (size_t)a->op.u.bn.n * a->op.u.bn.c * a->op.u.bn.hw;
}

static void calls_apply_bn_relu_fwd(const tt_program *p, tt_call *a, tt_call *b, int ia, int ib) {
  (void)p, (void)ib;
  a->fn = TT_CALL_BN_RELU_FWD;
  b->skip = TT_CALL_FUSED_AWAY, b->fused_into = ia;
}

/* The batch norm's beta (its bias): its training forward step's (not a recomputed one's: the same
 * parameter); -1 when there is none. */
static int calls_bn_bias(const tt_program *p, int node) {
  for (int k = 0; k < p->micro_end; k++)
    if (p->steps[k].op == TT_S_FWD && p->steps[k].node == node && p->steps[k].in[TT_BN_BETA] >= 0)
      return p->steps[k].in[TT_BN_BETA];
  return -1;
}

/* backward: a ReLU's backward overwriting its dx (beta 0), immediately followed by the batch norm's
 * whose dy that dx is: the batch norm call reads the ReLU's dy and recomputes the mask. The plan
 * let the ReLU's dy die at the ReLU's step, so the batch norm step may write its dx or workspace
 * there; fused it reads dy, so only where neither overlaps dy (or dx is dy's storage exactly:
 * bn_bwd reads each element of dy before it writes that element of dx, as it does in place). */
static int calls_match_bn_relu_bwd(const tt_program *p, const tt_call *a, const tt_call *b) {
  return calls_bn_relu_nodes(p, a->node, b->node) && (a->fn == TT_OP_ACT_BWD || a->fn == TT_CALL_ACT_BWD_MASK) &&
         a->op.u.act.act == TT_ACT_RELU && a->beta == 0.0f && !a->op.accumulate && b->fn == TT_OP_BN_BWD &&
         a->out[0] >= 0 && b->in[1] >= 0 && a->in[1] >= 0 && calls_same(p, a->out[0], b->in[1]) &&
         !calls_overlap(p, a->in[1], b->out[0], 1) && !calls_overlap(p, a->in[1], b->ws, 0) &&
         calls_bn_bias(p, b->node) >= 0;
}

static void calls_apply_bn_relu_bwd(const tt_program *p, tt_call *a, tt_call *b, int ia, int ib) {
  int dy = a->in[1];
  (void)ia;
  b->fn = TT_CALL_BN_RELU_BWD; /* x, the ReLU's dy, gamma, beta, saved mean, saved 1/std */
  b->in[5] = b->in[4], b->in[4] = b->in[3], b->in[3] = calls_bn_bias(p, b->node), b->in[1] = dy;
  a->skip = TT_CALL_FUSED_AWAY, a->fused_into = ib;
}

static const calls_fusion calls_fusions[] = {
    {"bn+relu", TT_CAP_BN_RELU_FWD, TT_S_FWD, TT_L_BN, TT_L_RELU, calls_match_bn_relu_fwd, calls_apply_bn_relu_fwd},
    {"relu+bn", TT_CAP_BN_RELU_BWD, TT_S_BWD, TT_L_RELU, TT_L_BN, calls_match_bn_relu_bwd, calls_apply_bn_relu_bwd},
};

/* The index of step i's one running call, or -1 when it has none or several. */
static int calls_single(const tt_program *p, int i) {
  int found = -1;
  for (int k = p->step_call[i]; k < p->step_call[i + 1]; k++) {
    if (p->calls[k].skip == TT_CALL_PREPARED_ONLY) continue;
    if (found >= 0 || p->calls[k].skip != TT_CALL_RUNS) return -1;
    found = k;
  }
  return found;
}

/* ---- three steps as one call: batch norm, add, ReLU (backend.h bn_fwd_train_add_relu and
 * bn_bwd_add_relu): the residual block's end (graph.c's tt_graph_bn_add_relu) ---- */

/* Whether a call other than calls[c0..c1] (the fused ones) reads buffer b: the intermediate tensors
 * a fusion stops writing must have no other reader. */
static int calls_read_elsewhere(const tt_program *p, int b, int c0, int c1) {
  for (int i = 0; i < p->ncalls; i++) {
    if (i >= c0 && i <= c1) continue;
    for (int k = 0; k < TT_CALL_MAX_IN; k++)
      if (b >= 0 && p->calls[i].in[k] == b) return 1;
  }
  return 0;
}

/* forward (steps i, i + 1, i + 2): bn_fwd_train into t, add(t, s) into u, act_fwd(RELU) of u into y
 * (and a compact save's act_mask of y after it, which keeps running). The fused call runs at the
 * batch norm's place and writes y there: only where y overlaps neither x nor the workspace, and s
 * exactly or not at all (backend.h), and nothing else reads t or u. 1 when fused. */
static int calls_fuse_bn_add_relu_fwd(tt_program *p, int i) {
  int ia = calls_single(p, i), ib = calls_single(p, i + 1), ic = p->step_call[i + 2], k_bn;
  if (ia < 0 || ib < 0 || ic >= p->step_call[i + 3]) return 0;
  for (int k = ic + 1; k < p->step_call[i + 3]; k++)
    if (p->calls[k].fn != TT_CALL_ACT_MASK || p->calls[k].skip != TT_CALL_RUNS) return 0;
  tt_call *a = &p->calls[ia], *b = &p->calls[ib], *c = &p->calls[ic];
  size_t cnt = (size_t)a->op.u.bn.n * a->op.u.bn.c * a->op.u.bn.hw;
  if (a->fn != TT_OP_BN_FWD_TRAIN || b->fn != TT_CALL_ADD || c->fn != TT_OP_ACT_FWD || c->skip != TT_CALL_RUNS ||
      c->op.u.act.act != TT_ACT_RELU || !tt_graph_bn_add_relu(p->graph, a->node, b->node, c->node, &k_bn))
    return 0;
  int x = a->in[0], t = a->out[0], sc = b->in[1 - k_bn], u = b->out[0], y = c->out[0];
  if (b->op.u.act.count != cnt || c->op.u.act.count != cnt || !calls_same(p, b->in[k_bn], t) ||
      !calls_same(p, c->in[0], u) || sc < 0 || y < 0)
    return 0;
  if (calls_overlap(p, x, y, 0) || calls_overlap(p, sc, y, 1) || calls_overlap(p, x, sc, 0) ||
      calls_overlap(p, a->ws, y, 0) || calls_overlap(p, a->ws, sc, 0))
    return 0;
  if (calls_read_elsewhere(p, t, ia, ic) || calls_read_elsewhere(p, u, ia, ic)) return 0;
  a->fn = TT_CALL_BN_ADD_RELU_FWD, a->in[5] = sc, a->out[0] = y;
  b->skip = c->skip = TT_CALL_FUSED_AWAY, b->fused_into = c->fused_into = ia;
  return 1;
}

/* backward (steps i, i + 1, i + 2): act_bwd(RELU) (or act_bwd_mask) of dy into d with beta 0; the
 * add's accumulates of d into the batch norm's gradient g (beta 0: it feeds only the add) and the
 * shortcut's (any beta; none when the shortcut needs no gradient); bn_bwd from g. The fused call
 * runs at the batch norm's place, reading dy and y (or the mask) that the plan let die at the ReLU's
 * step: only where dx and the shortcut's gradient are dy's storage exactly (the latter with beta 0)
 * or miss it, miss each other, y and x, the workspace misses what the call reads and writes, and
 * nothing else reads d or g. 1 when fused. */
static int calls_fuse_bn_add_relu_bwd(tt_program *p, int i) {
  int ia = calls_single(p, i), ic = calls_single(p, i + 2), k_bn, gi = -1, si = -1, nrun = 0;
  if (ia < 0 || ic < 0) return 0;
  tt_call *a = &p->calls[ia], *c = &p->calls[ic];
  const tt_step *st = &p->steps[i + 1];
  size_t cnt = (size_t)c->op.u.bn.n * c->op.u.bn.c * c->op.u.bn.hw;
  if ((a->fn != TT_OP_ACT_BWD && a->fn != TT_CALL_ACT_BWD_MASK) || a->op.u.act.act != TT_ACT_RELU || a->beta != 0.0f ||
      a->op.accumulate || a->op.u.act.count != cnt || c->fn != TT_OP_BN_BWD ||
      !tt_graph_bn_add_relu(p->graph, c->node, st->node, a->node, &k_bn) || st->nout < 2)
    return 0;
  int x = c->in[0], ys = a->in[0], dy = a->in[1], d = a->out[0], g = st->out[k_bn], sg = st->out[1 - k_bn];
  int dx = c->out[0], ws = c->ws;
  for (int k = p->step_call[i + 1]; k < p->step_call[i + 2]; k++) {
    const tt_call *e = &p->calls[k];
    if (e->skip == TT_CALL_PREPARED_ONLY) continue;
    if (e->skip != TT_CALL_RUNS || e->fn != TT_CALL_ACCUMULATE || !calls_same(p, e->in[0], d) || e->op.u.act.count != cnt)
      return 0;
    nrun++;
    if (g >= 0 && e->out[0] == g) gi = k;
    else if (sg >= 0 && e->out[0] == sg) si = k;
    else return 0;
  }
  if (gi < 0 || nrun != 1 + (sg >= 0) || p->calls[gi].beta != 0.0f || !calls_same(p, c->in[1], g) || ys < 0 || dy < 0)
    return 0;
  float beta_s = si >= 0 ? p->calls[si].beta : 0.0f;
  if (calls_overlap(p, dy, dx, 1) || calls_overlap(p, dy, sg, beta_s == 0.0f) || calls_overlap(p, dx, sg, 0) ||
      calls_overlap(p, ys, dx, 0) || calls_overlap(p, ys, sg, 0) || calls_overlap(p, x, dx, 0) ||
      calls_overlap(p, x, sg, 0))
    return 0;
  if (calls_overlap(p, ws, dy, 0) || calls_overlap(p, ws, ys, 0) || calls_overlap(p, ws, sg, 0) ||
      calls_overlap(p, ws, dx, 0) || calls_overlap(p, ws, x, 0))
    return 0;
  if (calls_read_elsewhere(p, d, ia, ic) || calls_read_elsewhere(p, g, ia, ic) || calls_read_elsewhere(p, dy, ia, ic))
    return 0; /* the fused call consumes dy (backend.h) */
  c->fn = TT_CALL_BN_ADD_RELU_BWD, c->mode = a->fn == TT_CALL_ACT_BWD_MASK;
  c->in[5] = c->in[4], c->in[4] = c->in[3], c->in[3] = c->in[2], c->in[2] = dy, c->in[1] = ys; /* x, y, dy, gamma, mean, 1/std */
  c->out[3] = sg, c->beta_s = beta_s;
  for (int k = ia; k < ic; k++)
    if (p->calls[k].skip == TT_CALL_RUNS) p->calls[k].skip = TT_CALL_FUSED_AWAY, p->calls[k].fused_into = ic;
  return 1;
}

/* Steps i, i + 1, i + 2 as one batch norm + add + ReLU call where the steps' kinds and p->caps
 * allow and the calls match: 1 when fused. */
static int calls_fuse_triple(tt_program *p, int i) {
  const tt_step *s = &p->steps[i];
  if (i + 2 >= p->micro_end || s->op != p->steps[i + 1].op || s->op != p->steps[i + 2].op ||
      p->steps[i + 1].kind != TT_L_ADD)
    return 0;
  if (s->op == TT_S_FWD && (p->caps & TT_CAP_BN_ADD_RELU_FWD) && s->kind == TT_L_BN && p->steps[i + 2].kind == TT_L_RELU)
    return calls_fuse_bn_add_relu_fwd(p, i);
  if (s->op == TT_S_BWD && (p->caps & TT_CAP_BN_ADD_RELU_BWD) && s->kind == TT_L_RELU && p->steps[i + 2].kind == TT_L_BN)
    return calls_fuse_bn_add_relu_bwd(p, i);
  return 0;
}

/* Applies the fusions over adjacent micro-step steps of a training program, the three-step one
 * (calls_fuse_triple) before the pair table; a step joins at most one fusion. */
static void calls_fuse(tt_program *p) {
  unsigned char taken_prev = 0;
  if (!p->policy.training) return;
  for (int i = 0; i + 1 < p->micro_end; i++) {
    const tt_step *s = &p->steps[i], *t = &p->steps[i + 1];
    int done = 0;
    if (!taken_prev && calls_fuse_triple(p, i)) { /* steps i + 1 and i + 2 are taken */
      p->n_fused++;
      i += 2;
      continue;
    }
    for (size_t r = 0; r < sizeof calls_fusions / sizeof calls_fusions[0] && !done && !taken_prev; r++) {
      const calls_fusion *f = &calls_fusions[r];
      int ia, ib;
      if (!(p->caps & f->cap) || s->op != f->op || t->op != f->op || s->kind != f->first || t->kind != f->second) continue;
      if ((ia = calls_single(p, i)) < 0 || (ib = calls_single(p, i + 1)) < 0) continue;
      if (!f->match(p, &p->calls[ia], &p->calls[ib])) continue;
      f->apply(p, &p->calls[ia], &p->calls[ib], ia, ib);
      p->n_fused++;
      done = 1;
    }
    taken_prev = (unsigned char)done;
  }
}

/* The program's steps in order, each into its calls (step_call[i] its first). */
static int calls_steps(calls_list *l) {
  tt_program *p = l->p;
  for (int i = 0; i < p->nsteps; i++) {
    const tt_step *s = &p->steps[i];
    int multi = (s->op == TT_S_CAST && (p->caps & TT_CAP_CAST_MULTI)) || (s->op == TT_S_UPDATE && (p->caps & TT_CAP_UPDATE_MULTI));
    p->step_call[i] = l->n;
    if (s->op == TT_S_FWD || s->op == TT_S_BWD) {
      if (calls_layer(l, i)) return -1;
    } else if (s->op == TT_S_CHECK) {
      if (calls_check(l, i)) return -1;
    } else if (multi) { /* a run of casts to one dtype, or every update: one call, then its members */
      int end = calls_run_end(p, i, s->op == TT_S_CAST ? p->micro_end : p->nsteps);
      tt_call *m = calls_push(l, s->op == TT_S_CAST ? TT_CALL_CAST_MULTI : TT_CALL_UPDATE_MULTI, i);
      if (!m) return -1;
      m->nseg = end - i, m->node = -1;
      if (s->op == TT_S_CAST) m->op.dt = p->bufs[s->out[TT_CAST_DST]].dtype;
      for (int j = i; j < end; j++) {
        if (j > i) p->step_call[j] = l->n;
        if (calls_fixed(l, j, 1)) return -1;
      }
      i = end - 1;
    } else if (calls_fixed(l, i, 0)) {
      return -1;
    }
  }
  p->step_call[p->nsteps] = l->n;
  return 0;
}

int tt_program_calls(tt_program *p, tt_err *err) {
  calls_list l;
  free(p->calls);
  free(p->step_call);
  p->calls = NULL, p->step_call = NULL, p->ncalls = 0, p->n_fused = 0;
  memset(&l, 0, sizeof l);
  l.p = p, l.err = err;
  p->step_call = (int *)tt_calloc((size_t)p->nsteps + 1, sizeof(int), "call list", err);
  if (!p->step_call) return -1;
  if (calls_steps(&l)) {
    free(l.v);
    free(p->step_call);
    p->step_call = NULL;
    return -1;
  }
  p->calls = l.v, p->ncalls = l.n;
  calls_fuse(p);
  return 0;
}
