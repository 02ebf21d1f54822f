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
