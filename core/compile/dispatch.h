/* core/compile/dispatch.h — the one mapping from a layer's Program step (TT_S_FWD, TT_S_BWD) to
 * backend calls: which tt_backend entry each call is, on which buffers, with which shape.
 * Lowering sizes a step's workspace from it (the calls with a tt_op_kind, through op_workspace),
 * the executor prepares those same calls and then runs every call of the list, in order, so
 * what is planned and what runs cannot drift apart. (The other steps, load, cast, loss, check
 * and update, are one fixed backend call each with no workspace: the executor makes them.)
 *
 * compile/ may not include runtime/, so this lives here and core/runtime/exec.c includes it. */
#ifndef TT_DISPATCH_H
#define TT_DISPATCH_H
#include "program.h"

#ifdef __cplusplus
extern "C" {
#endif

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
  TT_CALL_BN_APPLY      /* batch norm from saved statistics (TT_SF_BN_APPLY): op.u.bn; in x, gamma, beta,
                         * saved mean, saved 1/std; out y. No workspace, nothing to prepare. */
};

/* One backend call. Shapes are at the batch tt_step_calls was given. */
typedef struct tt_call {
  int fn;          /* a tt_op_kind, or a TT_CALL_ above */
  tt_op_desc op;   /* dt always; for fn < TT_OP_KIND_COUNT the whole desc (op.kind == fn), as
                    * op_workspace and prepare see it; for the others op.u.act.count (dropout, add,
                    * accumulate: elements) or op.u.bn's n, c, hw (gap: x [n, c, hw]) */
  int in[5];       /* buffer ids of the pointer arguments the entry point reads, in its argument
                    * order (-1: NULL); bn forward: x, gamma, beta, running mean and variance (the
                    * training forward updates the last two in place) */
  int out[3];      /* likewise for what it writes: y, or dx (bn: dx, dgamma, dbeta; backward-filter:
                    * dw, db) */
  float beta;      /* activation-gradient output: 0 overwrites, 1 adds into (fan-out) */
  int param_grads; /* writes parameter gradients: beta is the micro-step's (0 first, then 1) */
  int planned_only;/* listed for workspace and prepare, never run: a frozen layer's weight-gradient
                    * call (its dw, out[0], is -1), which lowering has always sized */
  int dy_alias_last; /* add backward: when out[0] shares in[0]'s (dy's) storage, runs after the
                      * step's other calls, which read dy */
  float momentum;  /* bn training forward */
  int update_running; /* bn training forward: 0 when recomputing */
  float p;         /* dropout probability; the mask seed is the executor's (node, micro-step) */
  int fmt;         /* save_compress / save_restore: tt_save_fmt */
  int hw, src_c, src_off, dst_c, dst_off, nc; /* channel_copy (n is op.u.bn.n) */
  int mode;        /* tokens: 1 with a class token; token pooling: 0 class, 1 mean */
} tt_call;

#define TT_STEP_MAX_CALLS (TT_MAX_INPUTS + 3)

/* The calls of step s at `batch` samples into calls, in run order; returns their count (0 for
 * steps other than TT_S_FWD and TT_S_BWD). */
int tt_step_calls(const tt_program *p, const tt_step *s, int batch, tt_call calls[TT_STEP_MAX_CALLS]);

/* The planned calls of step s (those with a tt_op_kind: what op_workspace sizes and prepare
 * builds) as descs, into ops; returns their count. */
#define TT_STEP_MAX_OPS 6 /* attention backward: two linear backward pairs and attn_bwd */
int tt_step_backend_ops(const tt_program *p, const tt_step *s, int batch, tt_op_desc ops[TT_STEP_MAX_OPS]);

#ifdef __cplusplus
}
#endif
#endif
