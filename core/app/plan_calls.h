/* core/app/plan_calls.h — the final call list in `plan`'s reports (plan_calls.c). */
#ifndef TT_PLAN_CALLS_H
#define TT_PLAN_CALLS_H
#include <stdio.h>

#include "../compile/program.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The text plan's line: calls per micro-step and update, the fused pairs by kind. */
void tt_plan_calls_line(const tt_program *p, FILE *out);
/* `plan --calls`: every call of p, one a line (call, step, phase, layer, entry point, buffers read
 * and written, workspace bytes, and why a listed call does not run by itself). */
void tt_plan_calls_text(const tt_program *p, FILE *out);
/* `plan --json`'s "calls" value: {"micro_step", "update", "fused", "list": [{"step", "call", "layer",
 * "in", "out", "workspace_bytes"[, "fused_into" | "runs"][, "tensors"]}]}. */
void tt_plan_calls_json(const tt_program *p, tt_strbuf *b);

#ifdef __cplusplus
}
#endif
#endif
