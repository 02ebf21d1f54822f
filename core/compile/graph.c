/* core/compile/graph.c — the build stage: Model -> forward graph with shapes and parameters.
 *
 * Node by node, in recipe order: link the inputs (earlier layers only), apply the kind's
 * shape rule (output shape, conv groups, forward FLOPs; the checks a recipe cannot make
 * alone), then create the parameters the kind owns. Last, every output must be used and the
 * last layer must give one value per class. Errors name the recipe file and layer line. */
#include "graph.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "PATH:LINE: [kind name]: what"; returns -1. */
static int graph_layer_fail(const tt_model *m, const tt_layer *L, tt_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static int graph_layer_fail(const tt_model *m, const tt_layer *L, tt_err *err, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return tt_fail(err, "%s:%d: [%s %s]: %s", m->path, L->line, tt_layer_kind_name(L->kind), L->name, what);
}

/* Output size of a sliding window, or -1 when the window does not fit the padded input:
 * PyTorch's rule, floor((in + 2 pad - k) / stride) + 1 with in + 2 pad >= k. (C's division
 * truncates toward zero, so without the sign test a window one pixel too large still gave 1
 * when the stride exceeded the overhang.) In 64 bits, where the sizes (ints) cannot wrap. */
static int64_t graph_out_dim(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  int64_t span = in + 2 * pad - k;
  return span < 0 ? -1 : span / stride + 1;
}

/* Sets n's output shape after checking it: not empty, and at most TT_MAX_SAMPLE_NUMEL values
 * per sample (so c, h, w, c*h*w and h*w all fit the ints the kernels take). */
static int graph_set_shape(const tt_model *m, tt_node *n, int64_t c, int64_t h, int64_t w, tt_err *err) {
  const int64_t max = TT_MAX_SAMPLE_NUMEL;
  if (c < 1 || h < 1 || w < 1)
    return graph_layer_fail(m, n->L, err, "its output would be empty (%lldx%lldx%lld)", (long long)c, (long long)h,
                            (long long)w);
  if (c > max || h > max / c || w > max / (c * h))
    return graph_layer_fail(m, n->L, err,
                            "its output %lldx%lldx%lld is %.0f values per image, more than the %lld one tensor may "
                            "hold (the kernels count in 32 bits); make the layer smaller",
                            (long long)c, (long long)h, (long long)w, (double)c * (double)h * (double)w, (long long)max);
  n->c = (int)c, n->h = (int)h, n->w = (int)w;
  return 0;
}

/* ---- shape rules: a node's output shape (and conv groups, FLOPs) from its first input x ---- */

/* conv: [xc, xh, xw] -> [filters, h, w] by graph_out_dim per axis. groups < 0 ("depthwise")
 * means one group per input channel and 0 means 1; both xc and filters must be multiples of
 * it. Also refuses a filter whose fan-in or fan-out passes the kernels' 32-bit limit, since
 * those are matrix dimensions of the convolution's GEMMs. FLOPs: 2 x output values x fan-in. */
static int graph_conv_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  const tt_layer *L = n->L;
  int xc = x->c, xh = x->h, xw = x->w;
  int groups = L->groups < 0 ? xc : (L->groups == 0 ? 1 : L->groups);
  if (L->filters <= 0 || L->kh <= 0 || L->kw <= 0 || L->sh <= 0 || L->sw <= 0 || L->ph < 0 || L->pw < 0)
    return graph_layer_fail(m, L, err, "filters, size and stride must be positive and pad non-negative");
  if (xc % groups || L->filters % groups)
    return graph_layer_fail(m, L, err, "groups = %d must divide the input channels (%d) and filters (%d)", groups, xc,
                            L->filters);
  n->groups = groups;
  int64_t h = graph_out_dim(xh, L->kh, L->sh, L->ph), w = graph_out_dim(xw, L->kw, L->sw, L->pw);
  if (h < 0 || w < 0)
    return graph_layer_fail(m, L, err, "a %dx%d window with pad %dx%d does not fit the %dx%d input", L->kh, L->kw, L->ph,
                            L->pw, xh, xw);
  /* the filter's inputs and outputs per position: the kernels' matrix sizes, and the fans */
  int64_t window = (int64_t)L->kh * L->kw, fan_in = (int64_t)(xc / groups) * window;
  int64_t fan_out = (int64_t)(L->filters / groups) * window;
  if (fan_in > TT_MAX_SAMPLE_NUMEL || fan_out > TT_MAX_SAMPLE_NUMEL)
    return graph_layer_fail(m, L, err, "its filter's fan-in (%lld) or fan-out (%lld) is more than %d; use a smaller size, "
                            "fewer filters or more groups", (long long)fan_in, (long long)fan_out, TT_MAX_SAMPLE_NUMEL);
  if (graph_set_shape(m, n, L->filters, h, w, err)) return -1;
  n->flops = 2.0 * (double)n->c * n->h * n->w * (double)fan_in;
  return 0;
}

/* max and average pooling: channels kept, h and w by graph_out_dim. Padding is at most half
 * the window (PyTorch's rule), so every window covers at least one real pixel and a max pool
 * never returns the padding's value. */
static int graph_pool_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  const tt_layer *L = n->L;
  if (L->kh <= 0 || L->kw <= 0 || L->sh <= 0 || L->sw <= 0 || L->ph < 0 || L->pw < 0 || (int64_t)L->ph * 2 > L->kh ||
      (int64_t)L->pw * 2 > L->kw)
    return graph_layer_fail(m, L, err, "size and stride must be positive and pad at most half the size");
  int64_t h = graph_out_dim(x->h, L->kh, L->sh, L->ph), w = graph_out_dim(x->w, L->kw, L->sw, L->pw);
  if (h < 0 || w < 0) {
    if (L->ph || L->pw)
      return graph_layer_fail(m, L, err, "a %dx%d window with pad %dx%d does not fit the %dx%d input", L->kh, L->kw, L->ph,
                              L->pw, x->h, x->w);
    return graph_layer_fail(m, L, err, "a %dx%d window does not fit the %dx%d input", L->kh, L->kw, x->h, x->w);
  }
  if (graph_set_shape(m, n, x->c, h, w, err)) return -1;
  n->flops = (double)n->c * n->h * n->w * L->kh * L->kw;
  return 0;
}

/* linear: a flat vector [in, 1, 1] -> [out, 1, 1], or a token tensor [t, in] -> [t, out]
 * applied per token (class token flag kept). An image-shaped input is refused with the hint
 * to add [flatten] or [gap]: nothing is flattened implicitly. */
static int graph_linear_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  const tt_layer *L = n->L;
  if (L->filters <= 0) return graph_layer_fail(m, L, err, "out must be a positive integer");
  if (x->tokens) { /* per token over the last dimension: [t, in] -> [t, out] */
    if (graph_set_shape(m, n, x->c, 1, L->filters, err)) return -1;
    n->tokens = 1, n->cls = x->cls;
    n->flops = 2.0 * x->c * (double)x->w * L->filters;
    return 0;
  }
  if (x->h != 1 || x->w != 1)
    return graph_layer_fail(m, L, err, "input is %dx%dx%d; add a [flatten] or [gap] layer before a linear layer", x->c, x->h,
                            x->w);
  if (graph_set_shape(m, n, L->filters, 1, 1, err)) return -1;
  n->flops = 2.0 * x->c * L->filters;
  return 0;
}

/* add: every input has the first one's shape; concat (along channels): the same height and width. */
static int graph_join_shape(const tt_graph *g, tt_node *n, tt_err *err) {
  const tt_model *m = g->model;
  const tt_layer *L = n->L;
  const tt_node *x = &g->nodes[n->in[0]];
  int xc = x->c, xh = x->h, xw = x->w, k;
  int64_t csum = 0;
  if (n->nin < 2) return graph_layer_fail(m, L, err, "needs at least two inputs: from = a, b");
  for (k = 0; k < n->nin; k++) {
    const tt_node *y = &g->nodes[n->in[k]];
    int same = L->kind == TT_L_ADD ? (y->c == xc && y->h == xh && y->w == xw && y->tokens == x->tokens)
                                   : (y->h == xh && y->w == xw && !y->tokens);
    if (!same)
      return graph_layer_fail(m, L, err, "input '%s' is %dx%dx%d but '%s' is %dx%dx%d; %s", m->layers[n->in[k]].name, y->c,
                              y->h, y->w, m->layers[n->in[0]].name, xc, xh, xw,
                              L->kind == TT_L_ADD ? "add needs equal shapes" : "concat needs equal height and width");
    csum += y->c;
  }
  if (graph_set_shape(m, n, L->kind == TT_L_ADD ? xc : csum, xh, xw, err)) return -1;
  if (L->kind == TT_L_ADD) { /* tokens stay tokens; token 0 is a class token only if it is in every input */
    n->tokens = x->tokens, n->cls = x->cls;
    for (k = 1; k < n->nin; k++) n->cls = n->cls && g->nodes[n->in[k]].cls;
  }
  n->flops = L->kind == TT_L_ADD ? (double)xc * xh * xw * (n->nin - 1) : 0.0;
  return 0;
}

/* patch_embed: a conv with kernel = stride = size and no padding over an image, its output
 * [dim, h/size, w/size] read as (h/size)*(w/size) tokens of width dim, after a class token. */
static int graph_patch_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  const tt_layer *L = n->L;
  int s = L->kh;
  if (x->tokens) return graph_layer_fail(m, L, err, "its input is a token tensor; patch_embed takes an image (CxHxW)");
  if (s <= 0 || L->filters <= 0) return graph_layer_fail(m, L, err, "size and dim must be positive");
  if (x->h % s || x->w % s)
    return graph_layer_fail(m, L, err, "the %dx%d input is not a multiple of the patch size %d; use a size that divides "
                            "both (or change [net] input)", x->h, x->w, s);
  int64_t hw = (int64_t)(x->h / s) * (x->w / s), fan_in = (int64_t)x->c * s * s, t = hw + (L->class_token ? 1 : 0);
  if (fan_in > TT_MAX_SAMPLE_NUMEL)
    return graph_layer_fail(m, L, err, "its patch holds %lld values, more than %d; use a smaller size", (long long)fan_in,
                            TT_MAX_SAMPLE_NUMEL);
  if ((int64_t)L->filters * hw > TT_MAX_SAMPLE_NUMEL)
    return graph_layer_fail(m, L, err, "its convolution output (%d x %lld) is more than %d values; use a smaller dim or a "
                            "larger size", L->filters, (long long)hw, TT_MAX_SAMPLE_NUMEL);
  n->groups = 1;
  if (graph_set_shape(m, n, t, 1, L->filters, err)) return -1;
  n->tokens = 1, n->cls = L->class_token != 0;
  n->flops = 2.0 * (double)L->filters * (double)hw * (double)fan_in + (double)t * L->filters;
  return 0;
}

/* layernorm over the last dimension: f = w of a token tensor, c of a flat vector [c, 1, 1]. */
static int graph_ln_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  if (!x->tokens && (x->h != 1 || x->w != 1))
    return graph_layer_fail(m, n->L, err, "its input is the image-shaped %dx%dx%d; layernorm normalises the last dimension "
                            "of a token tensor (after [patch_embed]) or of a flat vector ([flatten] or [gap] first)",
                            x->c, x->h, x->w);
  n->c = x->c, n->h = x->h, n->w = x->w, n->tokens = x->tokens, n->cls = x->cls;
  n->flops = 8.0 * (double)tt_node_numel(x);
  return 0;
}

/* 0 when x is a token tensor, else -1 with the error saying so and then what the layer needs
 * (need). */
static int graph_need_tokens(const tt_model *m, const tt_layer *L, const tt_node *x, const char *need, tt_err *err) {
  if (x->tokens) return 0;
  return graph_layer_fail(m, L, err, "its input %dx%dx%d is not a token tensor; %s", x->c, x->h, x->w, need);
}

/* attention: tokens [t, f] -> [t, f], f a multiple of heads (head width f / heads). The
 * per-sample qkv [t, 3f] and scores [heads, t, t] must fit the kernels' 32-bit counts. */
static int graph_attn_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  const tt_layer *L = n->L;
  if (graph_need_tokens(m, L, x, "attention needs tokens (a [patch_embed] before it)", err)) return -1;
  int t = x->c, f = x->w;
  if (L->heads <= 0 || f % L->heads)
    return graph_layer_fail(m, L, err, "the token width %d is not a multiple of heads = %d; use a number of heads that "
                            "divides %d", f, L->heads, f);
  if (L->p < 0.0f || L->p >= 1.0f) return graph_layer_fail(m, L, err, "dropout must be in [0, 1)");
  if (3.0 * t * f > TT_MAX_SAMPLE_NUMEL || (double)L->heads * t * t > TT_MAX_SAMPLE_NUMEL)
    return graph_layer_fail(m, L, err, "its qkv (%d x %d) or scores (%d x %d x %d) hold more than %d values per sample; "
                            "use fewer tokens", t, 3 * f, L->heads, t, t, TT_MAX_SAMPLE_NUMEL);
  n->c = x->c, n->h = 1, n->w = f, n->tokens = 1, n->cls = x->cls;
  /* in-proj, scores q k^T, probabilities x v, out-proj */
  n->flops = 2.0 * t * f * 3.0 * f + 2.0 * 2.0 * (double)t * t * f + 2.0 * t * (double)f * f;
  return 0;
}

/* token pooling: tokens [t, f] -> [f, 1, 1], either token 0 (mode class; it must be a class
 * token) or the mean over the t tokens (mode mean). */
static int graph_token_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  const tt_layer *L = n->L;
  if (graph_need_tokens(m, L, x, "token pooling follows the transformer layers", err)) return -1;
  if (L->token_mode == 0 && !x->cls)
    return graph_layer_fail(m, L, err, "mode = class needs a class token at token 0 (class_token = true on the "
                            "[patch_embed]); use mode = mean");
  if (graph_set_shape(m, n, x->w, 1, 1, err)) return -1;
  n->flops = L->token_mode ? (double)x->c * x->w : 0.0;
  return 0;
}

/* The shape rule of n's kind, from its first input x (add and concat look at all inputs):
 * sets n->c, h, w, the token flags and n->flops (forward FLOPs per sample, a multiply-add
 * counting 2). Token tensors may feed only the kinds listed below; the image-only kinds
 * would read [t, 1, f] as a 1-pixel-high image. Returns 0, or -1 with the layer's error. */
static int graph_shape(const tt_graph *g, tt_node *n, tt_err *err) {
  const tt_model *m = g->model;
  const tt_layer *L = n->L;
  const tt_node *x = &g->nodes[n->in[0]];
  double xn = (double)x->c * x->h * x->w;
  if (x->tokens) { /* what a token tensor may feed: the kinds below that keep or reduce its rows */
    int ok = L->kind == TT_L_RELU || L->kind == TT_L_RELU6 || L->kind == TT_L_SILU || L->kind == TT_L_GELU ||
             L->kind == TT_L_DROPOUT || L->kind == TT_L_LINEAR || L->kind == TT_L_ADD || L->kind == TT_L_FLATTEN ||
             L->kind == TT_L_LAYERNORM || L->kind == TT_L_ATTENTION || L->kind == TT_L_TOKEN;
    if (!ok)
      return graph_layer_fail(m, L, err, "its input '%s' is a token tensor [%d tokens x %d]; %s takes images (use "
                              "[layernorm] for normalisation, [token] to pool the tokens)",
                              m->layers[n->in[0]].name, x->c, x->w, tt_layer_kind_name(L->kind));
  }
  switch (L->kind) {
    case TT_L_CONV: return graph_conv_shape(m, n, x, err);
    case TT_L_PATCH_EMBED: return graph_patch_shape(m, n, x, err);
    case TT_L_LAYERNORM: return graph_ln_shape(m, n, x, err);
    case TT_L_ATTENTION: return graph_attn_shape(m, n, x, err);
    case TT_L_TOKEN: return graph_token_shape(m, n, x, err);
    case TT_L_BN:
      n->c = x->c, n->h = x->h, n->w = x->w;
      n->flops = 8.0 * xn;
      return 0;
    case TT_L_RELU:
    case TT_L_RELU6:
    case TT_L_SILU:
    case TT_L_GELU:
    case TT_L_DROPOUT:
      if (L->kind == TT_L_DROPOUT && (L->p < 0.0f || L->p >= 1.0f)) return graph_layer_fail(m, L, err, "dropout p must be in [0, 1)");
      n->c = x->c, n->h = x->h, n->w = x->w, n->tokens = x->tokens, n->cls = x->cls;
      n->flops = L->kind == TT_L_GELU ? 8.0 * xn : xn;
      return 0;
    case TT_L_MAXPOOL:
    case TT_L_AVGPOOL: return graph_pool_shape(m, n, x, err);
    case TT_L_GAP:
      n->c = x->c, n->h = 1, n->w = 1;
      n->flops = xn;
      return 0;
    case TT_L_FLATTEN: /* x holds at most TT_MAX_SAMPLE_NUMEL values, so c*h*w fits an int */
      return graph_set_shape(m, n, (int64_t)x->c * x->h * x->w, 1, 1, err);
    case TT_L_LINEAR: return graph_linear_shape(m, n, x, err);
    case TT_L_ADD:
    case TT_L_CONCAT: return graph_join_shape(g, n, err);
    default: return graph_layer_fail(m, L, err, "unsupported layer kind");
  }
}

/* ---- parameters ---- */

/* Adds a parameter; its id, or -1 when its element count (or the model's) does not fit in 64
 * bits. The shape rules keep every dimension below 2^31, so only absurd models get there. */
static int graph_add_param(tt_graph *g, int node, const char *layer, const char *suffix, tt_param_role role,
                           int ndim, const int64_t *shape, int trainable, int half_copy, int fan_in, int fan_out) {
  tt_param *p = &g->params[g->nparams];
  memset(p, 0, sizeof *p);
  if (suffix) snprintf(p->name, sizeof p->name, "%s.%s", layer, suffix);
  else snprintf(p->name, sizeof p->name, "%s", layer); /* a full name (patch_embed's overrides) */
  p->ndim = ndim;
  p->numel = 1;
  for (int i = 0; i < ndim; i++) {
    p->shape[i] = shape[i];
    p->numel = tt_size_mul(p->numel, (size_t)shape[i]);
  }
  p->trainable = trainable;
  p->half_copy = half_copy;
  p->node = node;
  p->role = role;
  p->fan_in = fan_in;
  p->fan_out = fan_out;
  if (trainable) g->trainable_numel = tt_size_add(g->trainable_numel, p->numel);
  else if (role != TT_PR_BN_MEAN && role != TT_PR_BN_VAR) g->frozen_numel = tt_size_add(g->frozen_numel, p->numel);
  if (p->numel == SIZE_MAX || g->trainable_numel == SIZE_MAX) return -1;
  return g->nparams++;
}

/* The parameters a node owns, after its shape rule: conv weight [k, c/g, r, s] and bias [k],
 * linear weight [out, in] and bias [out], batch-norm gamma, beta and running statistics [c].
 * Returns -1 when a count overflows (graph_add_param). */
static int graph_params(tt_graph *g, tt_node *n) {
  const tt_layer *L = n->L;
  const tt_node *x = &g->nodes[n->in[0]];
  int i = n->layer, xc = x->c, tr = !L->freeze; /* a frozen layer's weights are not trainable */
  if (L->kind == TT_L_CONV) {
    int cg = xc / n->groups;
    int64_t ws[4] = {L->filters, cg, L->kh, L->kw};
    int fan_in = cg * L->kh * L->kw, fan_out = L->filters / n->groups * L->kh * L->kw; /* < 2^31: graph_conv_shape */
    if ((n->weight = graph_add_param(g, i, L->name, "weight", TT_PR_WEIGHT, 4, ws, tr, 1, fan_in, fan_out)) < 0) return -1;
    if (L->bias) {
      int64_t bs[1] = {L->filters};
      if ((n->bias = graph_add_param(g, i, L->name, "bias", TT_PR_BIAS, 1, bs, tr, 1, fan_in, fan_out)) < 0) return -1;
    }
  } else if (L->kind == TT_L_BN) {
    int64_t s[1] = {xc};
    if ((n->gamma = graph_add_param(g, i, L->name, "weight", TT_PR_BN_GAMMA, 1, s, tr, 0, 0, 0)) < 0 ||
        (n->beta = graph_add_param(g, i, L->name, "bias", TT_PR_BN_BETA, 1, s, tr, 0, 0, 0)) < 0 ||
        (n->rmean = graph_add_param(g, i, L->name, "running_mean", TT_PR_BN_MEAN, 1, s, 0, 0, 0, 0)) < 0 ||
        (n->rvar = graph_add_param(g, i, L->name, "running_var", TT_PR_BN_VAR, 1, s, 0, 0, 0, 0)) < 0)
      return -1;
  } else if (L->kind == TT_L_LINEAR) {
    int in = x->tokens ? x->w : xc; /* per token: the last dimension */
    int64_t ws[2] = {L->filters, in};
    if ((n->weight = graph_add_param(g, i, L->name, "weight", TT_PR_WEIGHT, 2, ws, tr, 1, in, L->filters)) < 0) return -1;
    if (L->bias) {
      int64_t bs[1] = {L->filters};
      if ((n->bias = graph_add_param(g, i, L->name, "bias", TT_PR_BIAS, 1, bs, tr, 1, in, L->filters)) < 0) return -1;
    }
  } else if (L->kind == TT_L_PATCH_EMBED) {
    /* PyTorch's shapes, so a safetensors file matches torchvision's: conv weight [dim, c, s, s],
     * bias [dim], class token [1, 1, dim], position embedding [1, t, dim] */
    const char *cn = L->conv_name[0] ? L->conv_name : L->name;
    int s = L->kh, fan_in = xc * s * s, fan_out = L->filters * s * s;
    int64_t ws[4] = {L->filters, xc, s, s}, bs[1] = {L->filters}, cs[3] = {1, 1, L->filters}, ps[3] = {1, n->c, L->filters};
    if ((n->weight = graph_add_param(g, i, cn, "weight", TT_PR_WEIGHT, 4, ws, tr, 1, fan_in, fan_out)) < 0) return -1;
    if (L->bias && (n->bias = graph_add_param(g, i, cn, "bias", TT_PR_BIAS, 1, bs, tr, 1, fan_in, fan_out)) < 0) return -1;
    if (L->class_token &&
        (n->cls_tok = graph_add_param(g, i, L->class_token_name[0] ? L->class_token_name : L->name,
                                      L->class_token_name[0] ? NULL : "class_token", TT_PR_CLS_TOKEN, 3, cs, tr, 0, 0, 0)) < 0)
      return -1;
    if (L->pos_embed &&
        (n->pos_emb = graph_add_param(g, i, L->pos_embedding_name[0] ? L->pos_embedding_name : L->name,
                                      L->pos_embedding_name[0] ? NULL : "pos_embedding", TT_PR_POS_EMBED, 3, ps, tr, 0, 0, 0)) < 0)
      return -1;
  } else if (L->kind == TT_L_LAYERNORM) {
    int64_t s[1] = {x->tokens ? x->w : xc}; /* fp32, as batch norm's: no fp16 copy under autocast */
    if ((n->gamma = graph_add_param(g, i, L->name, "weight", TT_PR_LN_GAMMA, 1, s, tr, 0, 0, 0)) < 0 ||
        (n->beta = graph_add_param(g, i, L->name, "bias", TT_PR_LN_BETA, 1, s, tr, 0, 0, 0)) < 0)
      return -1;
  } else if (L->kind == TT_L_ATTENTION) {
    /* nn.MultiheadAttention's names and shapes: in_proj_weight [3f, f] (q, k, v rows), in_proj_bias
     * [3f], out_proj.weight [f, f], out_proj.bias [f] */
    int f = x->w;
    int64_t iw[2] = {3 * (int64_t)f, f}, ib[1] = {3 * (int64_t)f}, ow[2] = {f, f}, ob[1] = {f};
    if ((n->weight = graph_add_param(g, i, L->name, "in_proj_weight", TT_PR_WEIGHT, 2, iw, tr, 1, f, 3 * f)) < 0) return -1;
    if (L->bias && (n->bias = graph_add_param(g, i, L->name, "in_proj_bias", TT_PR_BIAS, 1, ib, tr, 1, f, 3 * f)) < 0)
      return -1;
    if ((n->out_w = graph_add_param(g, i, L->name, "out_proj.weight", TT_PR_WEIGHT, 2, ow, tr, 1, f, f)) < 0) return -1;
    if (L->bias && (n->out_b = graph_add_param(g, i, L->name, "out_proj.bias", TT_PR_BIAS, 1, ob, tr, 1, f, f)) < 0) return -1;
  }
  return 0;
}

/* ---- the graph ---- */

/* The network input, [net] input = CxHxW: the same limit as every other tensor. */
static int graph_input_shape(const tt_graph *g, tt_node *n, tt_err *err) {
  const tt_model *m = g->model;
  double numel = (double)m->in_c * (double)m->in_h * (double)m->in_w;
  if (m->in_c < 1 || m->in_h < 1 || m->in_w < 1 || numel > TT_MAX_SAMPLE_NUMEL)
    return tt_fail(err, "%s:%d: [net]: input = %dx%dx%d is %.0f values per image; an image must hold 1 to %d (the kernels "
                   "count in 32 bits); use a smaller input", m->path, n->L->line, m->in_c, m->in_h, m->in_w, numel,
                   TT_MAX_SAMPLE_NUMEL);
  n->c = m->in_c, n->h = m->in_h, n->w = m->in_w;
  return 0;
}

/* Node i of layer i: its inputs, which must be earlier layers. */
static int graph_link(tt_graph *g, int i, tt_err *err) {
  const tt_layer *L = &g->model->layers[i];
  tt_node *n = &g->nodes[i];
  n->layer = i;
  n->kind = L->kind;
  n->L = L;
  n->nin = L->ninputs;
  n->weight = n->bias = n->gamma = n->beta = n->rmean = n->rvar = -1;
  n->out_w = n->out_b = n->cls_tok = n->pos_emb = -1;
  for (int k = 0; k < L->ninputs; k++) {
    if (L->inputs[k] < 0 || L->inputs[k] >= i)
      return graph_layer_fail(g->model, L, err, "input refers to a layer that is not earlier in the recipe");
    n->in[k] = L->inputs[k];
    g->nodes[n->in[k]].nconsumers++;
  }
  return 0;
}

/* Every layer's output must reach the loss: a dangling branch would get no gradient. And the
 * last layer gives the logits, one per class. */
static int graph_check_outputs(const tt_graph *g, tt_err *err) {
  const tt_model *m = g->model;
  const tt_node *last = &g->nodes[g->nnodes - 1];
  for (int i = 0; i < g->nnodes - 1; i++)
    if (g->nodes[i].nconsumers == 0)
      return graph_layer_fail(m, &m->layers[i], err, "its output is never used; connect it with from = ... or remove it");
  if (last->tokens)
    return graph_layer_fail(m, last->L, err, "the last layer gives a token tensor [%d tokens x %d]; pool it with [token] "
                            "(mode = class or mean) and end with a linear layer of out = %d", last->c, last->w, m->classes);
  if (tt_node_numel(last) != (size_t)m->classes)
    return graph_layer_fail(m, last->L, err,
                            "the last layer gives %dx%dx%d values but [net] classes = %d; end with a linear layer of out = %d",
                            last->c, last->h, last->w, m->classes, m->classes);
  return 0;
}

/* Parameter names are the weights file's keys: patch_embed's name overrides must not take a name
 * another parameter has (layer names are unique, so only the overrides can collide). O(params)
 * per override. */
static int graph_check_names(const tt_graph *g, tt_err *err) {
  for (int i = 0; i < g->nparams; i++) {
    const tt_param *p = &g->params[i];
    const tt_layer *L = g->nodes[p->node].L;
    if (L->kind != TT_L_PATCH_EMBED || !(L->conv_name[0] || L->class_token_name[0] || L->pos_embedding_name[0])) continue;
    for (int j = 0; j < g->nparams; j++)
      if (j != i && !strcmp(g->params[j].name, p->name))
        return graph_layer_fail(g->model, L, err, "its parameter name '%s' is also the name of a parameter of layer '%s'; "
                                "choose another conv_name, class_token_name or pos_embedding_name", p->name,
                                g->model->layers[g->params[j].node].name);
  }
  return 0;
}

/* mb x heads x t x t x es: the attention probabilities [heads, t, t] of a micro-batch, where
 * t = n->c is the token count; 0 for other kinds. */
double tt_node_probs_bytes(const tt_graph *g, int v, int mb, size_t es) {
  const tt_node *n = &g->nodes[v];
  if (n->kind != TT_L_ATTENTION) return 0.0;
  return (double)mb * n->L->heads * (double)n->c * (double)n->c * (double)es;
}

/* See graph.h: what backward keeps besides the tensors it reads. Batch norm's statistics are
 * per channel, not per sample, so they do not scale with mb. */
double tt_node_saved_bytes(const tt_graph *g, int v, int mb, size_t es, int keep_probs) {
  const tt_node *n = &g->nodes[v];
  switch (n->kind) {
    case TT_L_ATTENTION: /* qkv [t, 3f] and o [t, f] in dt, lse [heads, t] fp32, probs [heads, t, t] */
      return (double)mb * (4.0 * n->c * (double)n->w * (double)es + 4.0 * n->L->heads * (double)n->c) +
             (keep_probs ? tt_node_probs_bytes(g, v, mb, es) : 0.0);
    case TT_L_LAYERNORM: return (double)mb * 8.0 * (double)(n->tokens ? n->c : 1);
    case TT_L_BN: return 8.0 * (double)n->c;
    default: return 0.0;
  }
}

/* Builds g from m, which must outlive g (nodes point at m's layers). Nodes are built in recipe
 * order, which the recipe parser keeps topological, so each node's inputs are complete when
 * its shape rule runs. params is sized at 6 per layer, more than any kind creates (at most 4:
 * bn, patch_embed, attention), so graph_add_param never grows it. Returns 0 with g owning
 * nodes and params (tt_graph_free), or -1 with err set and g freed. */
int tt_graph_build(const tt_model *m, tt_graph *g, tt_err *err) {
  int i;
  memset(g, 0, sizeof *g);
  g->model = m;
  if (m->nlayers < 2) return tt_fail(err, "%s: the recipe has no layers after [net]; add at least one layer", m->path);
  g->nodes = (tt_node *)tt_calloc((size_t)m->nlayers, sizeof(tt_node), "graph nodes", err);
  g->params = (tt_param *)tt_calloc((size_t)m->nlayers * 6, sizeof(tt_param), "graph parameters", err);
  if (!g->nodes || !g->params) goto fail;
  g->nnodes = m->nlayers;
  for (i = 0; i < m->nlayers; i++) {
    tt_node *n = &g->nodes[i];
    if (graph_link(g, i, err)) goto fail;
    if (n->kind == TT_L_INPUT) {
      if (graph_input_shape(g, n, err)) goto fail;
      continue;
    }
    if (n->nin < 1) {
      graph_layer_fail(m, n->L, err, "has no input");
      goto fail;
    }
    if (graph_shape(g, n, err)) goto fail;
    if (graph_params(g, n)) {
      graph_layer_fail(m, n->L, err, "its parameters, or the model's, number more than 2^64");
      goto fail;
    }
    g->flops_per_sample += n->flops;
  }
  if (graph_check_outputs(g, err)) goto fail;
  if (graph_check_names(g, err)) goto fail;
  return 0;
fail:
  tt_graph_free(g);
  return -1;
}

/* Frees what tt_graph_build allocated and clears the counts; g->model is left as it was.
 * Safe to call twice. */
void tt_graph_free(tt_graph *g) {
  free(g->nodes);
  free(g->params);
  g->nodes = NULL;
  g->params = NULL;
  g->nnodes = g->nparams = 0;
}

int tt_graph_bn_add_relu(const tt_graph *g, int bn, int add, int relu, int *k_bn) {
  if (!g || bn < 0 || add < 0 || relu < 0) return 0;
  const tt_node *r = &g->nodes[relu], *a = &g->nodes[add];
  if (r->nin != 1 || r->in[0] != add || a->kind != TT_L_ADD || a->nin != 2 || a->nconsumers != 1) return 0;
  if (g->nodes[bn].kind != TT_L_BN || g->nodes[bn].nconsumers != 1 || a->in[0] == a->in[1]) return 0;
  if (a->in[0] == bn) *k_bn = 0;
  else if (a->in[1] == bn) *k_bn = 1;
  else return 0;
  return 1;
}
