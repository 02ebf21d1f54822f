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
} tt_buf;

typedef enum {
  TT_S_LOAD_INPUT = 0, /* in: u8 staging, labels; out: x (normalised, dtype) */
  TT_S_CAST,           /* in: fp32 master; out: fp16 copy (arg = param id) */
  TT_S_FWD,            /* forward of `node`: slots below */
  TT_S_LOSS,           /* in: logits, labels; out: dlogits (training only, else -1), stats */
  TT_S_BWD,            /* backward of `node`: slots below */
  TT_S_CHECK,          /* overflow check of every gradient accumulator; out: flag */
  TT_S_UPDATE,         /* optimizer update of param `arg`: in grad; out param, m, v */
  TT_S_CLIP            /* [train] clip_norm: the sum of squares of the whole gradient region (every
                        * gradient accumulator, end to end in the arena with their zero padding);
                        * out: that sum, fp32, which every update then reads on the device */
} tt_step_op;

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

typedef struct tt_policy {
  int micro_batch;
  int accum_steps;     /* effective batch = micro_batch * accum_steps */
  tt_dtype act_dtype;  /* TT_F32, or TT_F16 / TT_BF16 for autocast */
  int inplace;         /* let ReLU/add/dropout and their backward reuse their input's storage */
  int compact;         /* training: keep for backward a ReLU's 1-bit mask and a max pool's uint8
                        * index instead of the tensor, where nothing else keeps the tensor alive
                        * (and the backend has the compact entries); exact */
  int compress;        /* tt_save_fmt: a convolution keeps its input for backward as fp16, bf16
                        * or int8 + per-channel scale (lossy; [train] compress_saved); 0: exact */
  unsigned char *recompute; /* per node: 1 = keep only for the forward pass, recompute in backward; may be NULL */
  int attn_fused;      /* training: attention keeps only its row statistics (lse) for backward,
                        * which rebuilds the probabilities (no [n, heads, t, t] buffer); 0 keeps
                        * the probabilities (a faster backward). The planner's choice (policy.c). */
  int training;        /* 0: forward-only evaluation program */
  int grads_persistent; /* 1: the weight gradients are persistent accumulators even where lower.c
                        * could make them transient (policy.c: where that packs no smaller) */
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
  size_t nhwc_bytes;   /* the NHWC nodes' value bytes at the micro-batch (no padding: NCHW's bytes) */
  int n_attn;          /* attention forward steps (first instances) in the training program */
  size_t attn_probs_bytes; /* their probabilities' buffers: kept, or (attn_fused) what the fused form avoids */
} tt_program;

/* What tt_lower and tt_program_plan return (besides 0 and -1) when a size would pass 2^64
 * bytes: the plan is too large to exist, which a search may treat as "does not fit". */
#define TT_ERR_TOO_LARGE (-2)

/* Differentiates and lowers graph g under pol into p. The workspace of each step is sized by
 * the backend's op_workspace for the calls tt_step_backend_ops (dispatch.h) lists; a failed query is an error
 * naming the layer; every buffer is aligned to be->align. */
int tt_lower(const tt_graph *g, const tt_policy *pol, tt_backend *be, tt_program *p, tt_err *err);
/* Plans the program's buffers: persistent ones packed first, transient ones by tt_arena_plan. */
int tt_program_plan(tt_program *p, tt_err *err);
/* The same with a memo of earlier plans (a search plans many programs whose buffers match one
 * planned before, buffer for buffer): an exact match copies that plan, else it is planned and
 * remembered. memo NULL: tt_program_plan. The memo belongs to one search; free it with
 * tt_plan_memo_free (NULL is fine). */
typedef struct tt_plan_memo tt_plan_memo;
tt_plan_memo *tt_plan_memo_new(void);
void tt_plan_memo_free(tt_plan_memo *m);
int tt_program_plan_memo(tt_program *p, tt_plan_memo *memo, tt_err *err);
void tt_program_free(tt_program *p);
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
