/* core/runtime/init.c — parameter initialisation: values from the seed on the host, uploaded
 * through the executor (the same numbers on every backend). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"

/* Whether param has a buffer of this role (1 gradient, 2 and 3 optimizer state). */
static int init_has_role(const tt_exec *x, int param, int role) {
  const tt_program *p = x->train ? x->train : x->eval;
  const int *tab = role == 1 ? p->grad_buf : (role == 2 ? p->m_buf : p->v_buf);
  /* a transient gradient (lower.c) has no value between steps: its backward step writes it */
  return tab[param] >= 0 && p->bufs[tab[param]].persistent;
}

/* Uniform on [0, 1) from (seed, parameter, element): counter-based, so every element's value
 * is fixed by the recipe's seed alone, whatever the thread count, backend or order of
 * initialisation, and a resumed or re-planned run (another micro-batch) starts from the same
 * weights. 53 random bits, the most a double's mantissa holds. */
static double init_uniform(uint64_t seed, uint64_t param, uint64_t i) {
  return (double)(tt_hash64(tt_hash64(seed, param), i) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal by Box-Muller from two of element k's uniforms (draw j: a redraw); u1 kept
 * off 0 for the log. */
static double init_normal(uint64_t seed, uint64_t param, uint64_t k, int j) {
  uint64_t base = (k << 6) + 2u * (uint64_t)j; /* up to 32 draws per element, disjoint counters */
  double u1 = init_uniform(seed, param, base) + 1e-300, u2 = init_uniform(seed, param, base + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Normal truncated to [-2, 2] standard deviations (timm's and torchvision's trunc_normal_ with
 * a = -2 std, b = 2 std): redrawn, 1 in 22 draws falls outside. */
static double init_trunc_normal(uint64_t seed, uint64_t param, uint64_t k) {
  for (int j = 0; j < 32; j++) {
    double z = init_normal(seed, param, k, j);
    if (z >= -2.0 && z <= 2.0) return z;
  }
  return 0.0; /* 32 misses: probability 1e-43 */
}

/* The Vision Transformer's parameters, initialised as torchvision's VisionTransformer does
 * (models/vision_transformer.py): the patch conv trunc-normal with std sqrt(1/fan_in) and zero
 * bias; the class token zero; the position embedding normal with std 0.02; attention as
 * nn.MultiheadAttention (in_proj_weight Xavier uniform, out_proj.weight PyTorch's Linear default
 * U(+-1/sqrt(fan_in)), both biases zero); a linear layer over tokens (the MLP) Xavier uniform
 * with biases normal std 1e-6; layer norm weight 1, bias 0. Returns 1 when param i is one of
 * them (*v set), 0 otherwise. */
static int init_vit(const tt_graph *g, int i, uint64_t seed, size_t k, double *v) {
  const tt_param *pr = &g->params[i];
  const tt_node *n = &g->nodes[pr->node];
  int tokens_in = n->nin && g->nodes[n->in[0]].tokens;
  switch (pr->role) {
    case TT_PR_LN_GAMMA: *v = 1.0; return 1;
    case TT_PR_LN_BETA: case TT_PR_CLS_TOKEN: *v = 0.0; return 1;
    case TT_PR_POS_EMBED: *v = 0.02 * init_normal(seed, (uint64_t)i, k, 0); return 1;
    default: break;
  }
  if (n->kind == TT_L_PATCH_EMBED) {
    *v = pr->role == TT_PR_WEIGHT ? init_trunc_normal(seed, (uint64_t)i, k) * sqrt(1.0 / (double)pr->fan_in) : 0.0;
    return 1;
  }
  if (n->kind == TT_L_ATTENTION) {
    if (pr->role == TT_PR_BIAS) *v = 0.0;
    else if (i == n->weight) *v = (2.0 * init_uniform(seed, (uint64_t)i, k) - 1.0) * sqrt(6.0 / (double)(pr->fan_in + pr->fan_out));
    else *v = (2.0 * init_uniform(seed, (uint64_t)i, k) - 1.0) / sqrt((double)pr->fan_in);
    return 1;
  }
  if (n->kind == TT_L_LINEAR && tokens_in) {
    if (pr->role == TT_PR_BIAS) *v = 1e-6 * init_normal(seed, (uint64_t)i, k, 0);
    else *v = (2.0 * init_uniform(seed, (uint64_t)i, k) - 1.0) * sqrt(6.0 / (double)(pr->fan_in + pr->fan_out));
    return 1;
  }
  return 0;
}

/* Sets every parameter of x to its initial value, a pure function of (seed, parameter index,
 * element index), and, in a training executor, zeroes the persistent gradients and optimizer
 * state. Host values go through one scratch buffer as large as the largest parameter.
 * Defaults: conv weights He normal (fan_out), other weights and biases U(+-1/sqrt(fan_in)),
 * batch norm gamma and running variance 1, beta and running mean 0; ViT parameters as
 * init_vit says. Returns 0, or -1 with err from the allocation or the upload. */
int tt_exec_init_params(tt_exec *x, uint64_t seed, tt_err *err) {
  size_t maxn = 1;
  for (int i = 0; i < x->g->nparams; i++)
    if (x->g->params[i].numel > maxn) maxn = x->g->params[i].numel;
  float *h = (float *)tt_malloc(maxn * sizeof(float), "parameter initialisation", err);
  if (!h) return -1;
  int rc = 0;
  for (int i = 0; i < x->g->nparams && !rc; i++) {
    const tt_param *pr = &x->g->params[i];
    const tt_node *n = &x->g->nodes[pr->node];
    double bound = 1.0 / sqrt((double)(pr->fan_in > 0 ? pr->fan_in : 1));
    for (size_t k = 0; k < pr->numel; k++) {
      double v = 0.0;
      if (init_vit(x->g, i, seed, k, &v)) {
        h[k] = (float)v;
        continue;
      }
      switch (pr->role) {
        case TT_PR_WEIGHT:
          /* conv: He normal in fan_out mode, what torchvision's ResNets use, so that deep
           * ReLU nets keep their activations' variance; u1 is kept off 0 for the log.
           * linear (and biases): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's default. */
          if (n->kind == TT_L_CONV) { /* He normal, fan_out mode, via Box-Muller */
            double u1 = init_uniform(seed, (uint64_t)i, 2 * k) + 1e-300, u2 = init_uniform(seed, (uint64_t)i, 2 * k + 1);
            v = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2) * sqrt(2.0 / (double)pr->fan_out);
          } else {
            v = (2.0 * init_uniform(seed, (uint64_t)i, k) - 1.0) * bound;
          }
          break;
        case TT_PR_BIAS: v = (2.0 * init_uniform(seed, (uint64_t)i, k) - 1.0) * bound; break;
        case TT_PR_BN_GAMMA: case TT_PR_BN_VAR: v = 1.0; break; /* identity: bn starts as a pure normalisation */
        default: v = 0.0; break;
      }
      h[k] = (float)v;
    }
    rc = tt_exec_param_set(x, i, 0, h, err);
    /* gradients and optimizer state start at zero: momentum and Adam's moments assume it */
    if (!rc && x->train) {
      memset(h, 0, pr->numel * sizeof(float));
      for (int role = 1; role <= 3 && !rc; role++)
        if (init_has_role(x, i, role)) rc = tt_exec_param_set(x, i, role, h, err);
    }
  }
  free(h);
  return rc;
}
