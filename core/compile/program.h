/* core/compile/program.h — differentiate + lower: the training graph (forward, loss, backward,
 * optimizer update) as a flat list of steps over buffers, for one Policy; and the plan of
 * those buffers in one arena.
 *
 * A training Program has two phases on one timeline: the micro-step (steps
 * [0, micro_end): load input, forward, loss, backward, recompute inserted), executed
 * accum_steps times per optimizer step, and the update phase (steps [micro_end, nsteps):
 * overflow check and optimizer updates), executed once. Persistent buffers (weights,
 * gradient accumulators, optimizer state, running statistics) live across everything and
 * are packed first; transient buffers are placed by arena/ from their first and last use. */
#ifndef TT_PROGRAM_H
#define TT_PROGRAM_H
#include "../../kernels/backend.h"
#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TT_BC_PARAMS = 0,   /* fp32 master weights and batch-norm statistics */
  TT_BC_GRADS,        /* fp32 gradient accumulators */
  TT_BC_OPTIMIZER,    /* momentum, Adam m and v */
  TT_BC_ACTIVATIONS,  /* activations, saved statistics, input batch, labels */
  TT_BC_ACT_GRADS,    /* activation gradients */
  TT_BC_WEIGHT_COPIES,/* fp16 copies of weights under autocast */
  TT_BC_WORKSPACE,    /* convolution / matmul workspace */
  TT_BC_MISC,         /* loss statistics, overflow flag */
  TT_BC_COUNT
} tt_buf_class;

const char *tt_buf_class_name(tt_buf_class c);

typedef struct tt_buf {
  char name[TT_NAME_MAX + 24];
  size_t bytes;
  tt_dtype dtype;
  tt_buf_class cls;
  int persistent;
  int node;           /* graph node it belongs to, or -1 */
  int param;          /* parameter id for params/grads/optimizer/weight copies, or -1 */
  int alias_of;       /* a buffer whose storage this one may take (in-place op), or -1 */
  int first, last;    /* step range (computed by lowering) */
  size_t offset;      /* planned offset in the arena */
  int aliased;        /* the planner accepted alias_of */
  int state;          /* TT_BC_OPTIMIZER: tt_state_fmt the values are held in (bytes counts them so); else 0 */
  int host;           /* 1: planned host offload (core/compile/offload.h): the buffer lives in the program's
                       * pinned host region at `offset`, not in the arena (persistent optimizer state, and
                       * under policy.offload 2 fp32 masters) */
  int krsc;           /* TT_BC_WEIGHT_COPIES: 1 when the copy of a filter [k, c/g, r, s] is stored KRSC
                       * [k, r, s, c/g] (its cast transposes; every reader is an all-NHWC convolution whose
                       * desc says layout_w KRSC: core/compile/krsc.c); else 0 (the master's KCRS order) */
} tt_buf;

typedef enum {
  TT_S_LOAD_INPUT = 0, /* in: u8 staging, labels; out: x (normalised, dtype) */
  TT_S_CAST,           /* in: fp32 master; out: fp16 copy (arg = param id) */
  TT_S_FWD,            /* forward of `node`: slots below */
  TT_S_LOSS,           /* in: logits, labels; out: dlogits (training only, else -1), stats */
  TT_S_BWD,            /* backward of `node`: slots below */
  TT_S_CHECK,          /* overflow check of every gradient accumulator; out: flag */
  TT_S_UPDATE,         /* optimizer update of param `arg`: in grad; out param, m, v */
  TT_S_CLIP,           /* [train] clip_norm: the sum of squares of the whole gradient region (every
                        * gradient accumulator, end to end in the arena with their zero padding);
                        * out: that sum, fp32, which every update then reads on the device */
  TT_S_OFFLOAD         /* an offloaded saved activation's copy step (offload.c, arg a TT_OFF_*; a.count
                        * the activation's index k, which names its events): OUT in the value, out its
                        * host copy; WAIT in the host copy; MARK in the host copy; IN in the host copy,
                        * out the device slot backward reads */
} tt_step_op;

/* TT_S_OFFLOAD's arg: the four steps of one offloaded activation k (core/compile/offload.h). */
enum {
  TT_OFF_OUT = 0,  /* after the value's forward: record mark[k]; copy device -> host after it (done[k]) */
  TT_OFF_WAIT = 1, /* where the value's storage dies: later compute waits for done[k] */
  TT_OFF_MARK = 2, /* where the device slot's life begins: record mark[k] (its storage is free) */
  TT_OFF_IN = 3    /* before the first backward reader: copy host -> slot after mark[k]; compute waits */
};

/* Operand slots: the in[]/out[] entry that holds each tensor. An absent optional operand (a
 * bias, the input gradient of a layer fed by the image, dlogits when evaluating, optimizer
 * state SGD without momentum lacks) is -1. */
enum {
  /* FWD in: the inputs in recipe order (x = input 0; add and concat: input k in slot k),
   * then conv/linear weight and bias, or batch-norm parameters and running statistics */
  TT_FWD_X = 0, TT_FWD_W = 1, TT_FWD_B = 2,
  TT_BN_GAMMA = 1, TT_BN_BETA = 2, TT_BN_RMEAN = 3, TT_BN_RVAR = 4,
  /* batch norm rebuilt from saved statistics (TT_SF_BN_APPLY): the forward's saved mean and
   * 1/std read in place of the running statistics (slots 3 and 4 then -1) */
  TT_BN_APPLY_MEAN = 5, TT_BN_APPLY_INVSTD = 6,
  /* FWD out: the value; batch norm when training: saved mean and 1/std [c] fp32 */
  TT_FWD_Y = 0, TT_BN_SAVE_MEAN = 1, TT_BN_SAVE_INVSTD = 2, TT_FWD_COMPACT = 1,
  /* BWD in: dy, then what tt_op(kind)->bwd_reads names (x or y), then conv/linear weight or
   * batch-norm gamma and saved statistics */
  TT_BWD_DY = 0, TT_BWD_SAVED = 1, TT_BWD_W = 2,
  TT_BWD_GAMMA = 2, TT_BWD_SAVE_MEAN = 3, TT_BWD_SAVE_INVSTD = 4,
  /* BWD out: dx (add and concat: input k's gradient in slot k), then dw and db (batch norm:
   * dgamma and dbeta) */
  TT_BWD_DX = 0, TT_BWD_DW = 1, TT_BWD_DB = 2,
  TT_BWD_RESTORED = 3, /* conv with a lossy saved input: x restored for the weight gradient */
  /* LOAD_INPUT, LOSS, CAST, CHECK, UPDATE */
  TT_LOAD_U8 = 0, TT_LOAD_LABELS = 1, TT_LOAD_X = 0,
  TT_LOSS_LOGITS = 0, TT_LOSS_LABELS = 1, TT_LOSS_DLOGITS = 0, TT_LOSS_STATS = 1,
  TT_CAST_SRC = 0, TT_CAST_DST = 0,
  TT_CHECK_FLAG = 0, TT_CLIP_SUMSQ = 0,
  TT_UPD_GRAD = 0, TT_UPD_PARAM = 0, TT_UPD_M = 1, TT_UPD_V = 2
};

/* Transformer layers' slots beyond the common ones (x, W, B; y; dy, saved x, W; dx, dW, dB).
 * layernorm uses batch norm's: FWD in gamma, beta (TT_BN_GAMMA, TT_BN_BETA), out saved mean and
 * 1/std [t] fp32 per sample (TT_BN_SAVE_*); BWD in gamma and the saved statistics (TT_BWD_GAMMA,
 * TT_BWD_SAVE_*), out dgamma, dbeta (TT_BWD_DW, TT_BWD_DB). */
enum {
  /* patch_embed: W, B are the conv's; the conv's output [n, dim, hw] (dt) lives in the step
   * only; class token and position embedding are read as fp32 masters */
  TT_PE_CLS = 3, TT_PE_POS = 4,            /* FWD in */
  TT_PE_CONV = 1,                          /* FWD out: the conv output */
  TT_PE_DCLS = 3, TT_PE_DPOS = 4,          /* BWD out: their gradients */
  TT_PE_DCONV = 5,                         /* BWD out: the conv output's gradient (this step only) */
  /* attention: W, B are the in-proj's (in_proj_weight, in_proj_bias) */
  TT_AT_OUT_W = 3, TT_AT_OUT_B = 4,        /* FWD in: out_proj.weight, out_proj.bias */
  TT_AT_QKV = 1, TT_AT_O = 2,              /* FWD out: qkv [n, t, 3f], o [n, t, f] (dt) */
  TT_AT_LSE = 3, TT_AT_PROBS = 4,          /* FWD out (training): lse [n, heads, t] fp32; probs
                                            * [n, heads, t, t] dt, or -1 (the fused form) */
  TT_AB_OUT_W = 3, TT_AB_QKV = 4, TT_AB_O = 5, TT_AB_LSE = 6, TT_AB_PROBS = 7, /* BWD in */
  TT_AB_DOUT_W = 3, TT_AB_DOUT_B = 4,      /* BWD out: out_proj gradients */
  TT_AB_DO = 5, TT_AB_DQKV = 6             /* BWD out: do [n, t, f], dqkv [n, t, 3f] (this step only) */
};

enum {
  TT_SF_RECOMPUTE = 1, /* forward re-run before backward: no running-statistics update */
  TT_SF_EVAL = 2,      /* inference: batch norm uses running statistics, dropout is identity */
  TT_SF_NHWC = 8,      /* the node's image tensors are NHWC (program.layout): its value and
                        * gradient, and for global average pooling its input. Batch norm,
                        * concat and a lossy conv save then run on [N*h*w, c, 1]; pooling and
                        * convolution carry the layout in their descs. */
  TT_SF_BN_APPLY = 16, /* a recomputed batch norm (with TT_SF_RECOMPUTE) that normalises with the
                        * forward's saved statistics (in slots TT_BN_APPLY_*: backend.h bn_apply),
                        * writing y only: one read and one write, the batch statistics not
                        * recomputed, running statistics untouched */
  TT_SF_NCHW16C = 32,  /* the node's image tensors are nChw16c (program.layout), as TT_SF_NHWC says: batch
                        * norm then runs through bn_blk (tt_bn_desc.blk 16), global average pooling as
                        * an NHWC average pool over [N*c/16, 16, h, w] (the same bytes) */
  TT_SF_COMPACT = 4    /* relu/relu6 and max pooling: the forward also writes the compact save
                        * (out slot TT_FWD_COMPACT) and the backward reads it (TT_BWD_SAVED) in
                        * place of the full tensor: a 1-bit mask, a uint8 in-window index */
};

/* UPDATE steps: weight_decay applies to this parameter ([train] decay, core/compile/decay.h); a
 * bit apart from the layer flags above. */
enum { TT_SF_DECAY = 256 };

#define TT_STEP_MAX_IO (TT_MAX_INPUTS + 4)

/* What a step's op needs besides its buffers, per sample (the executor supplies the batch,
 * which for evaluation may be smaller than the planned one). Filled once by lower.c. */
typedef struct tt_linear_args { int in, out, rows; } tt_linear_args;   /* features; rows per sample (tokens, else 1) */
typedef struct tt_ln_args { int rows, f; float eps; } tt_ln_args;      /* x [N, rows, f] */
typedef struct tt_attn_args { int t, f, heads, causal; float p; } tt_attn_args; /* x [N, t, f] */
typedef struct tt_patch_args { tt_conv_desc conv; int cls; } tt_patch_args; /* conv output [N, dim, p*q] -> [N, t, dim] */
typedef struct tt_token_args { int t, f, mode; } tt_token_args;      /* [N, t, f] -> [N, f]; mode 0 class, 1 mean */
typedef struct tt_bn_args { int c, hw; float eps, momentum; } tt_bn_args; /* x [N, c, hw] */
typedef struct tt_gap_args { int c, hw, h, w; } tt_gap_args;          /* x [N, c, hw] -> y [N, c]; hw = h*w */
typedef struct tt_eltwise_args { size_t numel; float p; } tt_eltwise_args; /* y [N, numel]; dropout p */
typedef struct tt_concat_args { int c, hw, nin, cin[TT_MAX_INPUTS]; } tt_concat_args; /* y [N, c, hw] */
typedef struct tt_load_args { int c, hw; float mean[4], std[4]; } tt_load_args; /* u8 [N, c, hw] */
typedef struct tt_loss_args { int classes; float label_smoothing; } tt_loss_args; /* logits [N, classes] */

typedef union tt_op_args {
  tt_conv_desc conv;   /* n is the planned micro-batch; the executor runs its own batch */
  tt_pool_desc pool;   /* the same */
  tt_linear_args linear;
  tt_ln_args ln;
  tt_attn_args attn;
  tt_patch_args patch;
  tt_token_args token;
  tt_bn_args bn;
  tt_gap_args gap;
  tt_eltwise_args eltwise; /* relu, relu6, silu, dropout, add */
  tt_concat_args concat;
  tt_load_args load;
  tt_loss_args loss;
  size_t count;        /* CAST, UPDATE: elements of the parameter */
} tt_op_args;

typedef struct tt_step {
  tt_step_op op;
  tt_layer_kind kind; /* FWD/BWD: the layer's kind */
  const char *name;   /* the layer's name (for messages), or NULL */
  int node;  /* graph node, or -1 */
  int arg;   /* param id for CAST/UPDATE */
  int flags;
  int in[TT_STEP_MAX_IO], nin;
  int out[TT_STEP_MAX_IO], nout;
  /* For BWD: out_beta[k] == 1 when out[k] already holds a partial gradient (fan-out) and
   * this step must add into it. Parameter gradients use the runtime micro-step index. */
  unsigned char out_beta[TT_STEP_MAX_IO];
  int ws;    /* workspace buffer, or -1 */
  tt_op_args a;
} tt_step;

/* ---- the final call list (calls.c) ----
 * Every step of a planned Program resolved into the backend calls it makes, in run order, with
 * their descriptors, buffers and workspace, fusions decided: what the executor runs and `plan
 * --calls` prints. A call's buffers are buffer ids of its program (-1: NULL). */

/* The entry points besides the tt_op_kind ones (those are planned: prepared, may need workspace). */
enum {
  TT_CALL_GAP_FWD = TT_OP_KIND_COUNT,
  TT_CALL_GAP_BWD,
  TT_CALL_DROPOUT_FWD,
  TT_CALL_DROPOUT_BWD,
  TT_CALL_ADD,
  TT_CALL_ACCUMULATE,
  TT_CALL_CHANNEL_COPY,
  TT_CALL_ACT_MASK,     /* compact saves (TT_SF_COMPACT): op.u.act; in y, out mask */
  TT_CALL_ACT_BWD_MASK, /* in mask, dy; out dx */
  TT_CALL_POOL_ARGMAX,  /* op.u.pool; in x, out idx */
  TT_CALL_POOL_BWD_IDX, /* in idx, dy; out dx */
  TT_CALL_SAVE_COMPRESS,/* lossy saved conv input: fmt; op.u.bn n, c, hw; in x, out the copy */
  TT_CALL_SAVE_RESTORE, /* in the copy, out x restored */
  TT_CALL_TOKENS_FWD,   /* patch tokens: op.u.bn n, c = f, hw; mode = cls; in conv output, class token, pos; out y */
  TT_CALL_TOKENS_BWD,   /* in dy; out the conv output's gradient, dcls, dpos */
  TT_CALL_TOKEN_POOL_FWD, /* op.u.bn n, c = f, hw = t; mode 0 class, 1 mean; in x, out y */
  TT_CALL_TOKEN_POOL_BWD, /* in dy, out dx */
  TT_CALL_BN_APPLY,     /* batch norm from saved statistics (TT_SF_BN_APPLY): op.u.bn; in x, gamma, beta,
                         * saved mean, saved 1/std; out y. No workspace, nothing to prepare. */
  /* fusions (calls.c's table): one call for two steps' calls, bit for bit the pair (backend.h) */
  TT_CALL_BN_RELU_FWD,  /* bn_fwd_train_relu: op.kind TT_OP_BN_FWD_TRAIN; the bn call's operands */
  TT_CALL_BN_RELU_BWD,  /* bn_bwd_relu: op.kind TT_OP_BN_BWD; in x, the ReLU's dy, gamma, beta, saved
                         * mean, saved 1/std; out dx, dgamma, dbeta */
  TT_CALL_BN_ADD_RELU_FWD, /* bn_fwd_train_add_relu (three steps: batch norm, add, ReLU): op.kind
                         * TT_OP_BN_FWD_TRAIN; in the bn call's five, then the shortcut s; out the
                         * ReLU's y, saved mean, saved 1/std */
  TT_CALL_BN_ADD_RELU_BWD, /* bn_bwd_add_relu (ReLU, add and batch norm backward): op.kind TT_OP_BN_BWD;
                         * in x, the ReLU's y (mode 1: its mask), the ReLU's dy, gamma, saved mean,
                         * saved 1/std; out dx, dgamma, dbeta, the shortcut's gradient (beta_s) */
  /* the steps other than a layer's: one fixed call each (a.load, a.loss, a.count from the step) */
  TT_CALL_NORMALIZE,    /* LOAD_INPUT: in u8 images; out x (the program's dtype) */
  TT_CALL_CAST,         /* CAST: in fp32 master; out the copy (op.dt: its dtype) */
  TT_CALL_CAST_MULTI,   /* the next `nseg` TT_CALL_CAST calls (members) as one cast_multi */
  TT_CALL_SOFTMAX_CE,   /* LOSS: in logits, labels; out dlogits (or -1), loss statistics */
  TT_CALL_ZERO_FLAG,    /* CHECK: out the overflow flag (int32), zeroed */
  TT_CALL_CHECK_FINITE, /* CHECK: in a gradient (or -1 with region: the gradient region); out the flag */
  TT_CALL_CHECK_FINITE_MULTI, /* CHECK: the next `nseg` TT_CALL_CHECK_FINITE calls (members: transient gradients)
                         * as one check_finite_multi; out the flag */
  TT_CALL_CLIP,         /* CLIP: the gradient region's sum of squares into out[0] (zeroed first);
                         * skipped when the step's clip_norm is 0 */
  TT_CALL_UPDATE,       /* UPDATE: in grad; out param, m, v; the optimizer's update (a.count values) */
  TT_CALL_UPDATE_MULTI, /* the next `nseg` TT_CALL_UPDATE calls (members) as one *_update_multi */
  TT_CALL_OFFLOAD,      /* TT_S_OFFLOAD: mode a TT_OFF_*, a.count the activation's index; in[0] / out[0] the
                         * step's; runs on the copy stream and events (offload_exec.c) */
  TT_CALL_COUNT
};

/* Why a listed call does not run by itself. */
enum {
  TT_CALL_RUNS = 0,
  TT_CALL_PREPARED_ONLY, /* a frozen layer's weight-gradient call (its dw is -1): prepared and sized,
                          * never run */
  TT_CALL_FUSED_AWAY,    /* its work is done by a fused call of a neighbouring step (`fused_into`) */
  TT_CALL_MEMBER         /* one tensor of the *_MULTI call before it */
};

#define TT_CALL_MAX_IN 6
#define TT_CALL_MAX_OUT 4
typedef struct tt_call {
  int fn;          /* a tt_op_kind, or a TT_CALL_ above */
  tt_op_desc op;   /* dt always; for fn < TT_OP_KIND_COUNT and the fusions the whole desc (op.kind), as
                    * op_workspace and prepare see it; for the others op.u.act.count (dropout, add,
                    * accumulate: elements) or op.u.bn's n, c, hw (gap: x [n, c, hw]) */
  int in[TT_CALL_MAX_IN]; /* buffer ids of the pointer arguments the entry point reads, in its
                    * argument order (-1: NULL); bn forward: x, gamma, beta, running mean and variance
                    * (the training forward updates the last two in place) */
  int out[TT_CALL_MAX_OUT]; /* likewise for what it writes: y, or dx (bn: dx, dgamma, dbeta;
                    * backward-filter: dw, db; bn_bwd_add_relu adds the shortcut's gradient) */
  int step;        /* the Program step it belongs to */
  int node;        /* that step's graph node (dropout and attention seeds), or -1 */
  int ws;          /* the step's workspace buffer, or -1 */
  int skip;        /* TT_CALL_RUNS, or why not (the enum above) */
  int prepared;    /* handed to the backend's prepare (and tune): op is a planned tt_op_desc */
  int fused_into;  /* TT_CALL_FUSED_AWAY: the index of the call that does its work */
  int nseg;        /* *_MULTI: its member calls, which follow it */
  float beta;      /* activation-gradient output: 0 overwrites, 1 adds into (fan-out) */
  float beta_s;    /* TT_CALL_BN_ADD_RELU_BWD: beta of the shortcut's gradient (out[3]), the add
                    * backward's accumulate's */
  int param_grads; /* writes parameter gradients: beta is the micro-step's (0 first, then 1) */
  int dy_alias_last; /* add backward: out[0] may share in[0]'s (dy's) storage and must run after the
                      * step's other calls, which read dy (calls.c orders them so) */
  float momentum;  /* bn training forward */
  int update_running; /* bn training forward: 0 when recomputing */
  float p;         /* dropout probability; the mask seed is the executor's (node, micro-step) */
  int fmt;         /* save_compress / save_restore: tt_save_fmt */
  int hw, src_c, src_off, dst_c, dst_off, nc; /* channel_copy (n is op.u.bn.n) */
  int mode;        /* tokens: 1 with a class token; token pooling: 0 class, 1 mean */
  int decay;       /* TT_CALL_UPDATE: weight decay applies ([train] decay) */
  int filter_k, filter_rs; /* TT_CALL_CAST of a KRSC copy (tt_buf.krsc): the filter's k and r*s, which the
                    * cast_multi segment transposes by (tt_cast_seg.k, .rs); 0 for every other cast */
  size_t region_off, region_count; /* CHECK_FINITE with in[0] -1, CLIP: the gradient region, an arena
                    * offset of the training program and fp32 values */
  tt_op_args a;    /* the step's arguments for the non-layer calls: load, loss, count */
} tt_call;

/* What the backend offers that lowering's call list may use (tt_lower sets p->caps from the
 * backend and the knobs; calls.c reads it). */
enum {
  TT_CAP_BN_RELU_FWD = 1, TT_CAP_BN_RELU_BWD = 2, TT_CAP_CAST_MULTI = 4, TT_CAP_UPDATE_MULTI = 8,
  TT_CAP_BN_ADD_RELU_FWD = 16, TT_CAP_BN_ADD_RELU_BWD = 32,
  TT_CAP_ACT_OFFLOAD = 64, /* plan only: saved activations may go to pinned host memory (backend.h download_after) */
  TT_CAP_FILTER_KRSC = 128 /* all-NHWC convolutions read a KRSC 16-bit weight copy the cast wrote (backend.h filter_krsc) */
};
/* The fusions' capabilities, which TINYTRAIN_FUSE=0 takes away. */
#define TT_CAP_FUSIONS (TT_CAP_BN_RELU_FWD | TT_CAP_BN_RELU_BWD | TT_CAP_BN_ADD_RELU_FWD | TT_CAP_BN_ADD_RELU_BWD)

typedef struct tt_policy {
  int micro_batch;
  int accum_steps;     /* effective batch = micro_batch * accum_steps */
  tt_dtype act_dtype;  /* TT_F32, or TT_F16 / TT_BF16 for autocast */
  int inplace;         /* let ReLU/add/dropout and their backward reuse their input's storage */
  int compact;         /* training: keep for backward a ReLU's 1-bit mask and a max pool's uint8
                        * index instead of the tensor, where nothing else keeps the tensor alive
                        * (and the backend has the compact entries); exact */
  int no_blocked;      /* 1: no nChw16c groups (lower_layout.c) even where the backend lists the layout:
                        * the search's fallback when nothing fits with them (policy.c) */
  int compress;        /* tt_save_fmt: a convolution keeps its input for backward as fp16, bf16
                        * or int8 + per-channel scale (lossy; [train] compress_saved); 0: exact */
  unsigned char *recompute; /* per node: 1 = keep only for the forward pass, recompute in backward; may be NULL */
  const unsigned char *compact_sel; /* per node, under compact: 1 = this value may be kept in its compact
                        * or compressed form (the per-tensor search's choice, policy.c); NULL: every one */
  int attn_fused;      /* training: attention keeps only its row statistics (lse) for backward,
                        * which rebuilds the probabilities (no [n, heads, t, t] buffer); 0 keeps
                        * the probabilities (a faster backward). The planner's choice (policy.c). */
  int training;        /* 0: forward-only evaluation program */
  int grads_persistent; /* 1: the weight gradients are persistent accumulators even where lower.c
                        * could make them transient (policy.c: where that packs no smaller) */
  int ostate;          /* tt_state_fmt of the optimizer state under [train] optimizer_state = auto (the
                        * search's choice, policy.c); the recipe's fixed setting otherwise wins */
  int offload;         /* training: 1 holds the optimizer state in pinned host memory, streamed through a
                        * device window for the update (core/compile/offload.h); 2 the fp32 masters of the
                        * trainable weights with a 16-bit copy too (their copies persistent, recast after
                        * each update; an evaluation program planned beside it reads those copies); 0 keeps
                        * it in the arena */
  int batch_transient; /* training on a backend that stages batches: 1 keeps the uint8 batch and the labels
                        * transient (the next batch's copy then waits for the step), where the budget
                        * binds (policy.c); 0 persistent, copied while the step computes (lower.c) */
  const unsigned char *offload_sel; /* training, per node: 1 = its saved value is copied to pinned host memory
                        * in forward and back before its backward (the per-tensor search's TT_DEC_OFFLOAD,
                        * offload.c's steps); NULL: none */
  const struct tt_device_profile *offload_profile; /* with offload_sel: the cost profile (cost.h) whose step times
                        * and host link place each copy's window (offload.c); NULL: one-step windows */
} tt_policy;


typedef struct tt_program {
  const tt_graph *graph;
  tt_policy policy;    /* recompute copied */
  tt_buf *bufs;
  int nbufs, cap_bufs;
  tt_step *steps;
  int nsteps, cap_steps;
  int micro_end;       /* first step of the update phase (== nsteps for evaluation) */
  size_t align;        /* every buffer's offset is a multiple of this (the backend's) */
  int nparams;         /* entries of param_buf, grad_buf, m_buf, v_buf */
  size_t input_numel;  /* elements of one input sample (c x h x w) */
  /* buffer ids the executor needs directly */
  int input_u8, labels, stats, overflow_flag;
  int *value_buf;      /* per node: buffer holding its forward output (first instance) */
  int *param_buf, *grad_buf, *m_buf, *v_buf; /* per param; -1 where none */
  int transient_grads; /* gradients planned transient (lower.c: accumulation 1, one process, no
                        * clip_norm): live from their backward step to the update only, so they are
                        * neither one region nor kept between optimizer steps */
  unsigned char *layout; /* per node: the tt_layout of its value and gradient (lower.c's
                       * lower_layouts: NHWC only on a backend that lists it, and only for image
                       * tensors between convolutions whose every reader takes NHWC) */
  int *tables;         /* the one allocation behind the per-node and per-param arrays */
  /* plan */
  size_t persistent_bytes, transient_bytes, transient_peak;
  size_t arena_bytes, peak_live_bytes;
  size_t class_bytes[TT_BC_COUNT]; /* sum of buffer sizes per class (aliased ones counted once) */
  int n_inplace;       /* accepted in-place aliases */
  int n_recomputed_steps;
  int n_bn_applied;    /* of those, batch norms rebuilt from the forward's saved statistics (TT_SF_BN_APPLY) */
  int n_compact;       /* compact saves (TT_SF_COMPACT forward steps) */
  size_t compact_bytes, compact_full_bytes; /* their buffers' bytes; the full tensors' they replace */
  int n_compressed;    /* of those, lossy saved convolution inputs (policy.compress) */
  size_t compressed_bytes, compressed_full_bytes;
  int n_nhwc;          /* image nodes whose value (and gradient) is NHWC (program.layout) */
  int n_layout_convs;  /* convolutions whose x and y layouts differ: where the layout changes, inside the
                        * convolution's planned workspace (no separate reorder step) */
  int n_layout_pools;  /* poolings that read NHWC and write NCHW (tt_pool_desc.y_nchw): where an NHWC
                        * group ends, inside the pooling's planned workspace */
  int n_krsc;          /* 16-bit weight copies stored KRSC by their cast (tt_buf.krsc) */
  size_t nhwc_bytes;   /* the NHWC nodes' value bytes at the micro-batch (no padding: NCHW's bytes) */
  int n_blocked;       /* image nodes whose value (and gradient) is nChw16c (TT_LAYOUT_NCHW16C) */
  size_t blocked_bytes; /* their value bytes at the micro-batch (channels multiples of 16: NCHW's bytes) */
  int n_attn;          /* attention forward steps (first instances) in the training program */
  size_t attn_probs_bytes; /* their probabilities' buffers: kept, or (attn_fused) what the fused form avoids */
  /* the final call list (calls.c: tt_program_calls, made by tt_program_plan) */
  int caps;            /* TT_CAP_* the call list may use */
  tt_call *calls;
  int ncalls;
  int *step_call;      /* [nsteps + 1]: step i's calls are calls[step_call[i] .. step_call[i + 1]) */
  int n_fused;         /* fused calls (each replacing two steps' calls, or three: bn + add + ReLU) */
  /* planned host offload (policy.offload, core/compile/offload.h) */
  size_t host_bytes;   /* the pinned host region: the host buffers end to end, aligned (0: none) */
  int offload_window;  /* the device window's buffer (two slots of offload_slot_bytes, update phase only), or -1 */
  size_t offload_slot_bytes; /* one slot: the largest tensor's master (offload 2) then m, then v, each at
                        * an aligned offset */
  int n_offloaded;     /* host buffers of the optimizer state */
  int n_masters_offloaded; /* offload 2: fp32 masters in the host region (each with a persistent copy) */
  size_t master_offload_bytes; /* their bytes */
  int n_act_offloaded; /* saved activations offloaded (policy.offload_sel): host buffers, four steps each */
  size_t act_offload_bytes; /* their host copies' bytes (the values' bytes) */
} tt_program;

/* The tt_state_fmt parameter pr's optimizer state is held in under policy pol: the model's [train]
 * optimizer_state (pol->ostate under auto), except that 1-D tensors (biases, norm weights) and
 * tensors of fewer than TT_STATE_BLOCK values stay fp32: they are few bytes and the first the
 * rounding would hurt (an int8 block of a 1-D gain mixes unrelated channels). */
int tt_program_state_fmt(const tt_graph *g, const tt_policy *pol, const tt_param *pr);
/* A program that holds optimizer state in bf16 or int8 needs the backend's held updates (backend.h
 * sgd_update_held): 0, or -1 naming the first such buffer on a backend that lacks them (lowering
 * refuses the plan before anything runs). */
int tt_program_state_check(const tt_program *p, const tt_backend *be, tt_err *err);

/* What tt_lower and tt_program_plan return (besides 0 and -1) when a size would pass 2^64
 * bytes: the plan is too large to exist, which a search may treat as "does not fit". */
#define TT_ERR_TOO_LARGE (-2)

/* Differentiates and lowers graph g under pol into p. The workspace of each step is sized by
 * the backend's op_workspace for the calls tt_step_backend_ops (dispatch.h) lists; a failed query is an error
 * naming the layer; every buffer is aligned to be->align. */
int tt_lower(const tt_graph *g, const tt_policy *pol, tt_backend *be, tt_program *p, tt_err *err);
/* Bytes of the one allocation (p->tables, made by tt_lower) behind a program's per-node and
 * per-parameter arrays. */
size_t tt_program_table_bytes(const tt_graph *g);
/* Plans the program's buffers (persistent ones packed first, transient ones by tt_arena_plan),
 * then makes its final call list (tt_program_calls): a program ready to run. */
int tt_program_plan(tt_program *p, tt_err *err);
/* The buffers' plan alone, without the call list: what a search needs of the many candidates it
 * ranks (tt_policy_search makes the chosen programs' call lists at its end). */
int tt_program_layout(tt_program *p, tt_err *err);
/* tt_program_layout with a memo of earlier plans (a search plans many programs whose buffers
 * match one planned before, buffer for buffer): an exact match copies that plan, else it is
 * planned and remembered. memo NULL: tt_program_layout. The memo belongs to one search; free it
 * with tt_plan_memo_free (NULL is fine). */
typedef struct tt_plan_memo tt_plan_memo;
tt_plan_memo *tt_plan_memo_new(void);
void tt_plan_memo_free(tt_plan_memo *m);
int tt_program_plan_memo(tt_program *p, tt_plan_memo *memo, tt_err *err);
void tt_program_free(tt_program *p);
/* A deep copy of a lowered (and perhaps planned) program: its buffers, steps, tables and call
 * list in new allocations, every other field as src has it (policy.recompute still points where
 * src's does). 0, or -1 with err set and dst freed when out of memory. */
int tt_program_copy(tt_program *dst, const tt_program *src, tt_err *err);
/* Resolves every step of planned program p into its backend calls (p->calls, p->step_call), in
 * run order, and applies the fusion table where p->caps allows (calls.c). Needs the plan's
 * offsets: a fusion is refused where the planned storage would make it read a buffer another
 * call of the pair overwrote. tt_program_plan calls it; 0, or -1 with err set. */
int tt_program_calls(tt_program *p, tt_err *err);
/* The name of a call's entry point, as the backend table and `plan --calls` name it. */
const char *tt_call_name(int fn);
/* The backend capabilities lowering's call list may use: be's optional entry points and its
 * plan_caps (a planning stand-in's), less the fusions when fuse is 0 (TINYTRAIN_FUSE=0). */
int tt_program_caps(const tt_backend *be, int fuse);
/* Bytes live at the peak step, per class, counted as peak_live_bytes is (persistent buffers
 * with their alignment padding; storage an in-place op took over counted once, as the buffer
 * live there), so the classes sum to peak_live_bytes. Returns the peak step (-1 and zeros when
 * out of host memory). For reports; O(steps + buffers). */
int tt_program_peak_breakdown(const tt_program *p, size_t out[TT_BC_COUNT]);
/* The lower bound p would have with its transient gradients persistent instead (lower.c; the
 * same steps and in-place aliases): no arena of that plan is smaller. p's own lower bound when
 * it has none; SIZE_MAX when out of memory. */
size_t tt_program_bound_grads_persistent(const tt_program *p);
/* The bytes buffer i adds to each step of [*first, *last] as peak_live_bytes counts them (the
 * same rule as tt_program_peak_breakdown): for reports that draw live bytes step by step. */
size_t tt_program_buf_live(const tt_program *p, int i, int *first, int *last);

#ifdef __cplusplus
}
#endif
#endif
