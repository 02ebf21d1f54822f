/* core/graph.c — the build stage: Model -> forward graph with shapes and parameters. */
#include "graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int graph_layer_fail(const tt_model *m, const tt_layer *L, tt_err *err, const char *what) {
  return tt_fail(err, "%s:%d: [%s %s]: %s", m->path, L->line, tt_layer_kind_name(L->kind), L->name, what);
}

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

/* Output size of a sliding window; <= 0 means the window does not fit. */
static int graph_out_dim(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

int tt_graph_build(const tt_model *m, tt_graph *g, tt_err *err) {
  memset(g, 0, sizeof *g);
  g->model = m;
  if (m->nlayers < 2) return tt_fail(err, "%s: the recipe has no layers after [net]; add at least one layer", m->path);
  g->nodes = (tt_node *)tt_calloc((size_t)m->nlayers, sizeof(tt_node), "graph nodes", err);
  g->params = (tt_param *)tt_calloc((size_t)m->nlayers * 6, sizeof(tt_param), "graph parameters", err);
  if (!g->nodes || !g->params) {
    tt_graph_free(g);
    return -1;
  }
  g->nnodes = m->nlayers;
  char msg[512];
  for (int i = 0; i < m->nlayers; i++) {
    const tt_layer *L = &m->layers[i];
    tt_node *n = &g->nodes[i];
    n->layer = i;
    n->kind = L->kind;
    n->L = L;
    n->nin = L->ninputs;
    n->weight = n->bias = n->gamma = n->beta = n->rmean = n->rvar = -1;
    for (int k = 0; k < L->ninputs; k++) {
      if (L->inputs[k] < 0 || L->inputs[k] >= i) {
        tt_graph_free(g);
        return graph_layer_fail(m, L, err, "input refers to a layer that is not earlier in the recipe");
      }
      n->in[k] = L->inputs[k];
      g->nodes[n->in[k]].nconsumers++;
    }
    if (L->kind == TT_L_INPUT) {
      n->c = m->in_c, n->h = m->in_h, n->w = m->in_w;
      continue;
    }
    if (n->nin < 1) {
      tt_graph_free(g);
      return graph_layer_fail(m, L, err, "has no input");
    }
    const tt_node *x = &g->nodes[n->in[0]];
    int xc = x->c, xh = x->h, xw = x->w;
    double xn = (double)xc * xh * xw;
    switch (L->kind) {
      case TT_L_CONV: {
        int groups = L->groups < 0 ? xc : (L->groups == 0 ? 1 : L->groups);
        if (L->filters <= 0 || L->kh <= 0 || L->kw <= 0 || L->sh <= 0 || L->sw <= 0 || L->ph < 0 || L->pw < 0) {
          tt_graph_free(g);
          return graph_layer_fail(m, L, err, "filters, size and stride must be positive and pad non-negative");
        }
        if (xc % groups || L->filters % groups) {
          snprintf(msg, sizeof msg, "groups = %d must divide the input channels (%d) and filters (%d)", groups, xc, L->filters);
          tt_graph_free(g);
          return graph_layer_fail(m, L, err, msg);
        }
        n->groups = groups;
        n->c = L->filters;
        n->h = graph_out_dim(xh, L->kh, L->sh, L->ph);
        n->w = graph_out_dim(xw, L->kw, L->sw, L->pw);
        if (n->h <= 0 || n->w <= 0) {
          snprintf(msg, sizeof msg, "a %dx%d window with pad %dx%d does not fit the %dx%d input", L->kh, L->kw, L->ph, L->pw, xh, xw);
          tt_graph_free(g);
          return graph_layer_fail(m, L, err, msg);
        }
        int cg = xc / groups;
        int64_t ws[4] = {L->filters, cg, L->kh, L->kw};
        int fan_in = cg * L->kh * L->kw, fan_out = L->filters / groups * L->kh * L->kw;
        n->weight = graph_add_param(g, i, L->name, "weight", TT_PR_WEIGHT, 4, ws, 1, 1, fan_in, fan_out);
        if (L->bias) {
          int64_t bs[1] = {L->filters};
          n->bias = graph_add_param(g, i, L->name, "bias", TT_PR_BIAS, 1, bs, 1, 1, fan_in, fan_out);
        }
        n->flops = 2.0 * (double)n->c * n->h * n->w * fan_in;
        break;
      }
      case TT_L_BN: {
        n->c = xc, n->h = xh, n->w = xw;
        int64_t s[1] = {xc};
        n->gamma = graph_add_param(g, i, L->name, "weight", TT_PR_BN_GAMMA, 1, s, 1, 0, 0, 0);
        n->beta = graph_add_param(g, i, L->name, "bias", TT_PR_BN_BETA, 1, s, 1, 0, 0, 0);
        n->rmean = graph_add_param(g, i, L->name, "running_mean", TT_PR_BN_MEAN, 1, s, 0, 0, 0, 0);
        n->rvar = graph_add_param(g, i, L->name, "running_var", TT_PR_BN_VAR, 1, s, 0, 0, 0, 0);
        n->flops = 8.0 * xn;
        break;
      }
      case TT_L_RELU:
      case TT_L_RELU6:
      case TT_L_SILU:
      case TT_L_DROPOUT:
        if (L->kind == TT_L_DROPOUT && (L->p < 0.0f || L->p >= 1.0f)) {
          tt_graph_free(g);
          return graph_layer_fail(m, L, err, "dropout p must be in [0, 1)");
        }
        n->c = xc, n->h = xh, n->w = xw;
        n->flops = xn;
        break;
      case TT_L_MAXPOOL:
      case TT_L_AVGPOOL:
        if (L->kh <= 0 || L->kw <= 0 || L->sh <= 0 || L->sw <= 0 || L->ph < 0 || L->pw < 0 || L->ph * 2 > L->kh ||
            L->pw * 2 > L->kw) {
          tt_graph_free(g);
          return graph_layer_fail(m, L, err, "size and stride must be positive and pad at most half the size");
        }
        n->c = xc;
        n->h = graph_out_dim(xh, L->kh, L->sh, L->ph);
        n->w = graph_out_dim(xw, L->kw, L->sw, L->pw);
        if (n->h <= 0 || n->w <= 0) {
          snprintf(msg, sizeof msg, "a %dx%d window does not fit the %dx%d input", L->kh, L->kw, xh, xw);
          tt_graph_free(g);
          return graph_layer_fail(m, L, err, msg);
        }
        n->flops = (double)n->c * n->h * n->w * L->kh * L->kw;
        break;
      case TT_L_GAP:
        n->c = xc, n->h = 1, n->w = 1;
        n->flops = xn;
        break;
      case TT_L_FLATTEN:
        n->c = xc * xh * xw, n->h = 1, n->w = 1;
        break;
      case TT_L_LINEAR: {
        if (L->filters <= 0) {
          tt_graph_free(g);
          return graph_layer_fail(m, L, err, "out must be a positive integer");
        }
        if (xh != 1 || xw != 1) {
          snprintf(msg, sizeof msg, "input is %dx%dx%d; add a [flatten] or [gap] layer before a linear layer", xc, xh, xw);
          tt_graph_free(g);
          return graph_layer_fail(m, L, err, msg);
        }
        n->c = L->filters, n->h = 1, n->w = 1;
        int64_t ws[2] = {L->filters, xc};
        n->weight = graph_add_param(g, i, L->name, "weight", TT_PR_WEIGHT, 2, ws, 1, 1, xc, L->filters);
        if (L->bias) {
          int64_t bs[1] = {L->filters};
          n->bias = graph_add_param(g, i, L->name, "bias", TT_PR_BIAS, 1, bs, 1, 1, xc, L->filters);
        }
        n->flops = 2.0 * xc * L->filters;
        break;
      }
      case TT_L_ADD:
      case TT_L_CONCAT: {
        if (n->nin < 2) {
          tt_graph_free(g);
          return graph_layer_fail(m, L, err, "needs at least two inputs: from = a, b");
        }
        int csum = 0;
        for (int k = 0; k < n->nin; k++) {
          const tt_node *y = &g->nodes[n->in[k]];
          int same = L->kind == TT_L_ADD ? (y->c == xc && y->h == xh && y->w == xw) : (y->h == xh && y->w == xw);
          if (!same) {
            snprintf(msg, sizeof msg, "input '%s' is %dx%dx%d but '%s' is %dx%dx%d; %s", m->layers[n->in[k]].name, y->c,
                     y->h, y->w, m->layers[n->in[0]].name, xc, xh, xw,
                     L->kind == TT_L_ADD ? "add needs equal shapes" : "concat needs equal height and width");
            tt_graph_free(g);
            return graph_layer_fail(m, L, err, msg);
          }
          csum += y->c;
        }
        n->c = L->kind == TT_L_ADD ? xc : csum, n->h = xh, n->w = xw;
        n->flops = L->kind == TT_L_ADD ? xn * (n->nin - 1) : 0.0;
        break;
      }
      default:
        tt_graph_free(g);
        return graph_layer_fail(m, L, err, "unsupported layer kind");
    }
    g->flops_per_sample += n->flops;
  }
  /* Every layer's output must reach the loss: a dangling branch would get no gradient. */
  for (int i = 0; i < g->nnodes - 1; i++) {
    if (g->nodes[i].nconsumers == 0) {
      const tt_layer *L = &m->layers[i];
      int r = graph_layer_fail(m, L, err, "its output is never used; connect it with from = ... or remove it");
      tt_graph_free(g);
      return r;
    }
  }
  const tt_node *last = &g->nodes[g->nnodes - 1];
  if (tt_node_numel(last) != (size_t)m->classes) {
    snprintf(msg, sizeof msg, "the last layer gives %dx%dx%d values but [net] classes = %d; end with a linear layer of out = %d",
             last->c, last->h, last->w, m->classes, m->classes);
    int r = graph_layer_fail(m, last->L, err, msg);
    tt_graph_free(g);
    return r;
  }
  return 0;
}

void tt_graph_free(tt_graph *g) {
  free(g->nodes);
  free(g->params);
  g->nodes = NULL;
  g->params = NULL;
  g->nnodes = g->nparams = 0;
}
