/* core/compile/model.h — what the recipe parser (recipe.h) produces: named layers in topological
 * order, the input shape, the loss, training settings and the data section. Plain data. */
#ifndef TT_MODEL_H
#define TT_MODEL_H
#include "../base/data_cfg.h" /* the data section, tt_data_cfg, and TT_PATH_MAX */
#include "../base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TT_NAME_MAX 96
#define TT_MAX_INPUTS 8

typedef enum {
  TT_L_INPUT = 0,
  TT_L_CONV,
  TT_L_BN,
  TT_L_RELU,
  TT_L_RELU6,
  TT_L_SILU,
  TT_L_MAXPOOL,
  TT_L_AVGPOOL,
  TT_L_GAP, /* global average pool: [c,h,w] -> [c,1,1] */
  TT_L_LINEAR,
  TT_L_DROPOUT,
  TT_L_FLATTEN, /* [c,h,w] -> [c*h*w,1,1]; a view, no data moves */
  TT_L_ADD,
  TT_L_CONCAT, /* along channels */
  /* transformer layers. A token tensor [t, f] per sample is stored [n, t, f] row-major (f
   * fastest); in the graph it is the node shape c = t, h = 1, w = f with tt_node.tokens set. */
  TT_L_PATCH_EMBED, /* image [c,h,w] -> tokens [t, dim]: conv kernel = stride = size, then class
                     * token (optional, token 0) and learned position embedding (optional) */
  TT_L_LAYERNORM,   /* over the last dimension f (PyTorch's nn.LayerNorm(f)) */
  TT_L_ATTENTION,   /* multi-head self-attention as nn.MultiheadAttention: fused QKV in-proj
                     * linear, softmax(q k^T / sqrt(d)) v per head, out-proj linear */
  TT_L_GELU,        /* elementwise; approximate = none (erf) or tanh */
  TT_L_TOKEN,       /* tokens [t, f] -> [f]: the class token (token 0) or the mean */
  TT_L_KIND_COUNT
} tt_layer_kind;

typedef struct tt_layer {
  tt_layer_kind kind;
  char name[TT_NAME_MAX];       /* unique; safetensors names are "<name>.weight" etc. */
  int inputs[TT_MAX_INPUTS];    /* indices of earlier layers */
  int ninputs;
  int line;                     /* recipe line of the section that made this layer */
  /* conv: filters = output channels; linear: filters = output features */
  int filters;
  int kh, kw, sh, sw, ph, pw;   /* conv and pooling window, stride, padding */
  int groups;                   /* conv; groups == input channels is depthwise; -1 = "depthwise"
                                 * in the recipe: the graph stage sets it to the input channels */
  int bias;                     /* conv, linear, patch_embed, attention (both projections): 1 if the layer has biases */
  int freeze;                   /* conv, linear, batch norm, patch_embed, layernorm, attention: 1 keeps the weights as loaded (no gradient,
                                 * no optimizer state, no update; batch norm's running statistics
                                 * still update in training) */
  float eps, momentum;          /* batch norm (PyTorch meaning of momentum: 0.1 default); layernorm eps */
  float p;                      /* dropout probability; attention: dropout on the probabilities */
  /* patch_embed: filters = dim, kh = kw = sh = sw = size (no padding) */
  int class_token, pos_embed;   /* patch_embed: 1 adds a class token (token 0) / a position embedding */
  /* patch_embed name overrides ("" = "<name>.weight"/".bias", "<name>.class_token",
   * "<name>.pos_embedding"): conv_name is a prefix (conv_name.weight, conv_name.bias); the other
   * two are full tensor names (torchvision's vit_b_16: class_token, encoder.pos_embedding) */
  char conv_name[TT_NAME_MAX], class_token_name[TT_NAME_MAX], pos_embedding_name[TT_NAME_MAX];
  int heads, causal;            /* attention: f % heads == 0; causal masks key j > query i */
  int approximate;              /* gelu: 0 none (erf), 1 tanh */
  int token_mode;               /* token: 0 class (token 0), 1 mean over the tokens */
} tt_layer;

typedef enum { TT_OPT_SGD = 0, TT_OPT_ADAM, TT_OPT_ADAMW } tt_opt_kind;
typedef enum { TT_LR_CONSTANT = 0, TT_LR_STEP, TT_LR_COSINE } tt_lr_schedule;
typedef enum { TT_PREC_AUTO = 0, TT_PREC_FP32, TT_PREC_FP16, TT_PREC_BF16 } tt_precision;
typedef enum { TT_RECOMP_AUTO = 0, TT_RECOMP_NONE, TT_RECOMP_ALL } tt_recompute_mode;
/* [train] decay: which parameters weight_decay applies to (core/compile/decay.c). DEFAULT is
 * WEIGHTS for adamw and ALL for sgd and adam (PyTorch's optimizers over model.parameters(), which
 * the CNN recipes and the PyTorch fixture assume); LIST is decay_list. */
/* [train] optimizer_state: how SGD's momentum and Adam's moments are held (kernels/backend.h
 * tt_state_fmt for the first three; AUTO: fp32 where the plan fits, else bf16, else int8). Under
 * bf16 and int8, 1-D tensors and tensors of fewer than TT_STATE_BLOCK values stay fp32. */
typedef enum { TT_OSTATE_FP32 = 0, TT_OSTATE_BF16, TT_OSTATE_INT8, TT_OSTATE_AUTO } tt_ostate_mode;
typedef enum { TT_DECAY_DEFAULT = 0, TT_DECAY_ALL, TT_DECAY_NONE, TT_DECAY_WEIGHTS, TT_DECAY_LIST } tt_decay_mode;

typedef struct tt_train_cfg {
  int batch;                    /* effective batch (images per optimizer step) */
  int micro_batch;              /* 0: the scheduler chooses */
  int eval_batch;               /* 0: same as the micro-batch the scheduler may pick */
  int epochs;
  tt_opt_kind optimizer;
  float lr, momentum, weight_decay, beta1, beta2, adam_eps;
  int nesterov;
  tt_lr_schedule schedule;
  float warmup_epochs;          /* linear warm-up from lr/100 (0 = none) */
  int step_epochs;              /* step schedule: multiply by gamma every step_epochs */
  float gamma;
  float min_lr;                 /* cosine floor */
  float label_smoothing;
  unsigned long long seed;
  tt_precision precision;
  tt_recompute_mode recompute;
  int compress_saved;           /* tt_save_fmt: convolutions' saved inputs for backward, lossy (0: exact) */
  int log_every;                /* optimizer steps between "train" metric lines */
  /* checkpoint_every: a checkpoint every this many optimizer steps, or (steps 0) every this many
   * seconds of wall time; both 0: only at the end of each epoch and on a stop. Default 600 s. */
  long long checkpoint_steps;
  double checkpoint_seconds;
  /* the update path (core/compile/decay.c, the update phase of lower.c) */
  tt_decay_mode decay;
  char decay_list[512];         /* LIST: items joined by ',' with no spaces: `weights` (every parameter
                                 * of role TT_PR_WEIGHT) and glob patterns (* and ?) on full names */
  int decay_line;               /* recipe line of `decay` (0: not given) */
  float clip_norm;              /* gradient clipping by global L2 norm; 0: off */
  int optimizer_state;          /* tt_ostate_mode (0, fp32: the default) */
  int ranks;                    /* not a recipe key: the processes of a multi-process run (set by
                                 * tt_dist_per_rank_batch; 0 or 1: one). Over 1, the gradients stay
                                 * persistent, one region the all-reduce sums in buckets (lower.c) */
  int tf32_off;                 /* [train] tf32 = off: fp32 convolutions and GEMMs in true fp32 on sm_80+ too
                                 * (0, the default: TF32 where the card has it; docs/gpu.md#tf32) */
} tt_train_cfg;

typedef struct tt_model {
  char path[TT_PATH_MAX];       /* recipe file */
  char name[TT_NAME_MAX];       /* recipe file name without directory and extension */
  int in_c, in_h, in_w;         /* input shape per sample */
  int classes;
  tt_layer *layers;             /* layers[0] is the input; the last layer gives the logits */
  int nlayers;
  tt_train_cfg train;
  tt_data_cfg data;
} tt_model;

#ifdef __cplusplus
}
#endif
#endif
