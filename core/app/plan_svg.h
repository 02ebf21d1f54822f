/* core/app/plan_svg.h — `tinytrain plan --svg FILE`: a picture of the plan. */
#ifndef TT_PLAN_SVG_H
#define TT_PLAN_SVG_H
#include "../runtime/session.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes path (atomically): the bytes live at every Program op of s's training Program, stacked
 * by class (weights, gradients, optimizer state, fp16 weight copies, activations kept,
 * activations recomputed, activation gradients, workspaces), the budget line, the peak with
 * the largest buffers live there, the recompute segments shaded, and, when the chosen policy
 * recomputes or uses fp16, the same Program without recompute (or in fp32) as a thin line over
 * its own ops. When the plan holds buffers in pinned host memory (planned host offload), a host
 * lane beside the plot draws them on the same byte scale, by class, with the host budget, and the
 * picture grows by the lane's width (without offload it is unchanged). The root element carries
 * data-peak-bytes (equal to peak_live_bytes), data-peak-op and data-budget-bytes, and with
 * offload data-host-bytes (the host region, plan --json's offload_bytes), as does the lane's
 * <g class="host-lane">. Plain SVG 1.1. Returns 0 or -1 (err set). */
int tt_plan_svg(tt_session *s, const char *path, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
