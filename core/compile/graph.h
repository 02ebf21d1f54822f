/* core/compile/graph.h — the forward graph: one node per recipe layer, with per-sample output
 * shapes (the batch dimension stays symbolic) and the parameters each node owns. */
#ifndef TT_GRAPH_H
#define TT_GRAPH_H
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most values one tensor may hold per sample (channels x height x width): the kernels take
 * per-sample sizes, and a linear layer's inputs, as 32-bit ints. A layer whose output (or a
 * conv whose filter, per output position) would hold more is refused at its recipe line. */
#define TT_MAX_SAMPLE_NUMEL 2147483647

typedef enum {
  TT_PR_WEIGHT = 0, /* conv [k, c/g, r, s] or linear [out, in] */
  TT_PR_BIAS,       /* conv or linear bias [k] */
  TT_PR_BN_GAMMA,   /* saved as "<bn>.weight", as PyTorch does */
  TT_PR_BN_BETA,    /* "<bn>.bias" */
  TT_PR_BN_MEAN,    /* "<bn>.running_mean", not trainable */
  TT_PR_BN_VAR,     /* "<bn>.running_var", not trainable */
  /* Only TT_PR_WEIGHT is a weight matrix (conv, linear, attention in_proj_weight and
   * out_proj.weight): the AdamW default decays that role alone. */
  TT_PR_LN_GAMMA,   /* "<layernorm>.weight" [f] */
  TT_PR_LN_BETA,    /* "<layernorm>.bias" [f] */
  TT_PR_CLS_TOKEN,  /* patch_embed's class token [1, 1, dim] ("<name>.class_token") */
  TT_PR_POS_EMBED   /* patch_embed's position embedding [1, t, dim] ("<name>.pos_embedding") */
} tt_param_role;

typedef struct tt_param {
  char name[TT_NAME_MAX + 16];
  int ndim;
  int64_t shape[4];
  size_t numel;
  int trainable;   /* gradient, optimizer state and an update step */
  int half_copy;   /* under fp16 autocast the op reads an fp16 copy (conv/linear weights, biases) */
  int node;
  tt_param_role role;
  int fan_in, fan_out; /* for initialisation */
} tt_param;

typedef struct tt_node {
  int layer;               /* index in tt_model.layers (== node index) */
  tt_layer_kind kind;
  const tt_layer *L;
  int in[TT_MAX_INPUTS];   /* input node ids */
  int nin;
  int c, h, w;             /* output shape per sample; a token tensor [t, f] is c = t, h = 1, w = f */
  int tokens;              /* 1: the output is a token tensor [t, f] (stored [n, t, f], f fastest) */
  int cls;                 /* tokens: token 0 is patch_embed's class token */
  int groups;              /* conv groups, "depthwise" resolved */
  int weight, bias, gamma, beta, rmean, rvar; /* param ids or -1 (attention: weight, bias = in_proj;
                            * layernorm: gamma, beta) */
  int out_w, out_b;        /* attention: out_proj.weight, out_proj.bias (param ids or -1) */
  int cls_tok, pos_emb;    /* patch_embed: class token, position embedding (param ids or -1) */
  int nconsumers;
  double flops;            /* forward FLOPs per sample (multiply-add = 2) */
} tt_node;

typedef struct tt_graph {
  const tt_model *model;
  tt_node *nodes;  /* nodes[0] is the input; nodes[nnodes-1] gives the logits */
  int nnodes;
  tt_param *params;
  int nparams;
  size_t trainable_numel;
  size_t frozen_numel;   /* weights of layers with freeze = true (not trainable) */
  double flops_per_sample; /* forward */
} tt_graph;

/* Builds the graph, checking shapes; errors name the recipe file and line of the layer. */
int tt_graph_build(const tt_model *m, tt_graph *g, tt_err *err);
void tt_graph_free(tt_graph *g);
/* Whether bn, add and relu are a residual block's end: relu reads only add, add sums two different
 * inputs and feeds only relu, bn is one of them (*k_bn: which, 0 or 1) and feeds only add. The
 * pattern calls.c fuses into bn_fwd_train_add_relu / bn_bwd_add_relu and lowering keeps fusable. */
int tt_graph_bn_add_relu(const tt_graph *g, int bn, int add, int relu, int *k_bn);

static inline size_t tt_node_numel(const tt_node *n) { return (size_t)n->c * (size_t)n->h * (size_t)n->w; }

/* Bytes backward keeps for node v besides the values (per tt_op bwd_reads) at micro-batch mb
 * and activation element size es (bytes of the dtype): attention's qkv [t, 3f] and o [t, f] (dt), row statistics [heads, t]
 * (fp32) and, when keep_probs, the probabilities [heads, t, t] (dt); layer norm's statistics
 * [t] x 2 (fp32); batch norm's [c] x 2. The recompute cost model and plan reports use it. */
double tt_node_saved_bytes(const tt_graph *g, int v, int mb, size_t es, int keep_probs);
/* The attention probabilities' bytes of node v at mb, es (0 for other kinds). */
double tt_node_probs_bytes(const tt_graph *g, int v, int mb, size_t es);

#ifdef __cplusplus
}
#endif
#endif
