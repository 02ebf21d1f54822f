/* core/graph.c — the build stage: Model -> forward graph with shapes and parameters.
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

/* Output size of a sliding window; <= 0 means the window does not fit. */
static int graph_out_dim(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

/* ---- shape rules: a node's output shape (and conv groups, FLOPs) from its first input x ---- */

static int graph_conv_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  const tt_layer *L = n->L;
  int xc = x->c, xh = x->h, xw = x->w;
  int groups = L->groups < 0 ? xc : (L->groups == 0 ? 1 : L->groups);
  int fan_in;
  if (L->filters <= 0 || L->kh <= 0 || L->kw <= 0 || L->sh <= 0 || L->sw <= 0 || L->ph < 0 || L->pw < 0)
    return graph_layer_fail(m, L, err, "filters, size and stride must be positive and pad non-negative");
  if (xc % groups || L->filters % groups)
    return graph_layer_fail(m, L, err, "groups = %d must divide the input channels (%d) and filters (%d)", groups, xc,
                            L->filters);
  n->groups = groups;
  n->c = L->filters;
  n->h = graph_out_dim(xh, L->kh, L->sh, L->ph);
  n->w = graph_out_dim(xw, L->kw, L->sw, L->pw);
  if (n->h <= 0 || n->w <= 0)
    return graph_layer_fail(m, L, err, "a %dx%d window with pad %dx%d does not fit the %dx%d input", L->kh, L->kw, L->ph,
                            L->pw, xh, xw);
  fan_in = xc / groups * L->kh * L->kw;
  n->flops = 2.0 * (double)n->c * n->h * n->w * fan_in;
  return 0;
}

static int graph_pool_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  const tt_layer *L = n->L;
  if (L->kh <= 0 || L->kw <= 0 || L->sh <= 0 || L->sw <= 0 || L->ph < 0 || L->pw < 0 || L->ph * 2 > L->kh ||
      L->pw * 2 > L->kw)
    return graph_layer_fail(m, L, err, "size and stride must be positive and pad at most half the size");
  n->c = x->c;
  n->h = graph_out_dim(x->h, L->kh, L->sh, L->ph);
  n->w = graph_out_dim(x->w, L->kw, L->sw, L->pw);
  if (n->h <= 0 || n->w <= 0)
    return graph_layer_fail(m, L, err, "a %dx%d window does not fit the %dx%d input", L->kh, L->kw, x->h, x->w);
  n->flops = (double)n->c * n->h * n->w * L->kh * L->kw;
  return 0;
}

static int graph_linear_shape(const tt_model *m, tt_node *n, const tt_node *x, tt_err *err) {
  const tt_layer *L = n->L;
  if (L->filters <= 0) return graph_layer_fail(m, L, err, "out must be a positive integer");
  if (x->h != 1 || x->w != 1)
    return graph_layer_fail(m, L, err, "input is %dx%dx%d; add a [flatten] or [gap] layer before a linear layer", x->c, x->h,
                            x->w);
  n->c = L->filters, n->h = 1, n->w = 1;
  n->flops = 2.0 * x->c * L->filters;
  return 0;
}

/* add: every input has the first one's shape; concat (along channels): the same height and width. */
static int graph_join_shape(const tt_graph *g, tt_node *n, tt_err *err) {
  const tt_model *m = g->model;
  const tt_layer *L = n->L;
  const tt_node *x = &g->nodes[n->in[0]];
  int xc = x->c, xh = x->h, xw = x->w, csum = 0, k;
  if (n->nin < 2) return graph_layer_fail(m, L, err, "needs at least two inputs: from = a, b");
  for (k = 0; k < n->nin; k++) {
    const tt_node *y = &g->nodes[n->in[k]];
    int same = L->kind == TT_L_ADD ? (y->c == xc && y->h == xh && y->w == xw) : (y->h == xh && y->w == xw);
    if (!same)
      return graph_layer_fail(m, L, err, "input '%s' is %dx%dx%d but '%s' is %dx%dx%d; %s", m->layers[n->in[k]].name, y->c,
                              y->h, y->w, m->layers[n->in[0]].name, xc, xh, xw,
                              L->kind == TT_L_ADD ? "add needs equal shapes" : "concat needs equal height and width");
    csum += y->c;
  }
  n->c = L->kind == TT_L_ADD ? xc : csum, n->h = xh, n->w = xw;
  n->flops = L->kind == TT_L_ADD ? (double)xc * xh * xw * (n->nin - 1) : 0.0;
  return 0;
}

static int graph_shape(const tt_graph *g, tt_node *n, tt_err *err) {
  const tt_model *m = g->model;
  const tt_layer *L = n->L;
  const tt_node *x = &g->nodes[n->in[0]];
  double xn = (double)x->c * x->h * x->w;
  switch (L->kind) {
    case TT_L_CONV: return graph_conv_shape(m, n, x, err);
    case TT_L_BN:
      n->c = x->c, n->h = x->h, n->w = x->w;
      n->flops = 8.0 * xn;
      return 0;
    case TT_L_RELU:
    case TT_L_RELU6:
    case TT_L_SILU:
    case TT_L_DROPOUT:
      if (L->kind == TT_L_DROPOUT && (L->p < 0.0f || L->p >= 1.0f)) return graph_layer_fail(m, L, err, "dropout p must be in [0, 1)");
      n->c = x->c, n->h = x->h, n->w = x->w;
      n->flops = xn;
      return 0;
    case TT_L_MAXPOOL:
    case TT_L_AVGPOOL: return graph_pool_shape(m, n, x, err);
    case TT_L_GAP:
      n->c = x->c, n->h = 1, n->w = 1;
      n->flops = xn;
      return 0;
    case TT_L_FLATTEN:
      n->c = x->c * x->h * x->w, n->h = 1, n->w = 1;
      return 0;
    case TT_L_LINEAR: return graph_linear_shape(m, n, x, err);
    case TT_L_ADD:
    case TT_L_CONCAT: return graph_join_shape(g, n, err);
    default: return graph_layer_fail(m, L, err, "unsupported layer kind");
  }
}

/* ---- parameters ---- */

static int graph_add_param(tt_graph *g, int node, const char *layer, const char *suffix, tt_param_role role,
                           int ndim, const int64_t *shape, int trainable, int half_copy, int fan_in, int fan_out) {
  tt_param *p = &g->params[g->nparams];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s.%s", layer, suffix);
  p->ndim = ndim;
  p->numel = 1;
  for (int i = 0; i < ndim; i++) {
    p->shape[i] = shape[i];
    p->numel *= (size_t)shape[i];
  }
  p->trainable = trainable;
  p->half_copy = half_copy;
  p->node = node;
  p->role = role;
  p->fan_in = fan_in;
  p->fan_out = fan_out;
  if (trainable) g->trainable_numel += p->numel;
  return g->nparams++;
}

/* The parameters a node owns, after its shape rule: conv weight [k, c/g, r, s] and bias [k],
 * linear weight [out, in] and bias [out], batch-norm gamma, beta and running statistics [c]. */
static void graph_params(tt_graph *g, tt_node *n) {
  const tt_layer *L = n->L;
  const tt_node *x = &g->nodes[n->in[0]];
  int i = n->layer, xc = x->c;
  if (L->kind == TT_L_CONV) {
    int cg = xc / n->groups;
    int64_t ws[4] = {L->filters, cg, L->kh, L->kw};
    int fan_in = cg * L->kh * L->kw, fan_out = L->filters / n->groups * L->kh * L->kw;
    n->weight = graph_add_param(g, i, L->name, "weight", TT_PR_WEIGHT, 4, ws, 1, 1, fan_in, fan_out);
    if (L->bias) {
      int64_t bs[1] = {L->filters};
      n->bias = graph_add_param(g, i, L->name, "bias", TT_PR_BIAS, 1, bs, 1, 1, fan_in, fan_out);
    }
  } else if (L->kind == TT_L_BN) {
    int64_t s[1] = {xc};
    n->gamma = graph_add_param(g, i, L->name, "weight", TT_PR_BN_GAMMA, 1, s, 1, 0, 0, 0);
    n->beta = graph_add_param(g, i, L->name, "bias", TT_PR_BN_BETA, 1, s, 1, 0, 0, 0);
    n->rmean = graph_add_param(g, i, L->name, "running_mean", TT_PR_BN_MEAN, 1, s, 0, 0, 0, 0);
    n->rvar = graph_add_param(g, i, L->name, "running_var", TT_PR_BN_VAR, 1, s, 0, 0, 0, 0);
  } else if (L->kind == TT_L_LINEAR) {
    int64_t ws[2] = {L->filters, xc};
    n->weight = graph_add_param(g, i, L->name, "weight", TT_PR_WEIGHT, 2, ws, 1, 1, xc, L->filters);
    if (L->bias) {
      int64_t bs[1] = {L->filters};
      n->bias = graph_add_param(g, i, L->name, "bias", TT_PR_BIAS, 1, bs, 1, 1, xc, L->filters);
    }
  }
}

/* ---- the graph ---- */

/* Node i of layer i: its inputs, which must be earlier layers. */
static int graph_link(tt_graph *g, int i, tt_err *err) {
  const tt_layer *L = &g->model->layers[i];
  tt_node *n = &g->nodes[i];
  n->layer = i;
  n->kind = L->kind;
  n->L = L;
  n->nin = L->ninputs;
  n->weight = n->bias = n->gamma = n->beta = n->rmean = n->rvar = -1;
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
  if (tt_node_numel(last) != (size_t)m->classes)
    return graph_layer_fail(m, last->L, err,
                            "the last layer gives %dx%dx%d values but [net] classes = %d; end with a linear layer of out = %d",
                            last->c, last->h, last->w, m->classes, m->classes);
  return 0;
}

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
      n->c = m->in_c, n->h = m->in_h, n->w = m->in_w;
      continue;
    }
    if (n->nin < 1) {
      graph_layer_fail(m, n->L, err, "has no input");
      goto fail;
    }
    if (graph_shape(g, n, err)) goto fail;
    graph_params(g, n);
    g->flops_per_sample += n->flops;
  }
  if (graph_check_outputs(g, err)) goto fail;
  return 0;
fail:
  tt_graph_free(g);
  return -1;
}

void tt_graph_free(tt_graph *g) {
  free(g->nodes);
  free(g->params);
  g->nodes = NULL;
  g->params = NULL;
  g->nnodes = g->nparams = 0;
}
