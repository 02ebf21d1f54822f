/* core/runtime/offload_exec.h — the executor's side of planned host offload (core/compile/offload.h):
 * the pinned host region of a training program whose optimizer state lives there, and the update's
 * window schedule. Called by exec.c only. */
#ifndef TT_OFFLOAD_EXEC_H
#define TT_OFFLOAD_EXEC_H
#include "exec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At tt_exec_create, after the arena: for a training program with host buffers, allocates the
 * pinned host region (host_alloc, zeroed: the state starts at zero like the arena's), the two
 * slots' events, and the list of the update calls whose state is offloaded, in run order.
 * Nothing for other programs. 0, or -1 with err set naming the bytes asked. */
int tt_offload_exec_setup(tt_exec *x, tt_err *err);
/* At tt_exec_destroy: waits for the copies, frees the region and the events. */
void tt_offload_exec_destroy(tt_exec *x);
/* The start of tt_exec_update: the first offloaded tensor's state copied into slot 0 (after all
 * the compute queued so far, which may still use that storage for activations). 0 or -1. */
int tt_offload_update_begin(tt_exec *x, tt_err *err);
/* For update call c of the training program: where its master and first and second optimizer
 * state are while it runs. A call whose buffers are in the arena keeps *w, *m1, *m2; an offloaded
 * one gets its window slot's (the next in the schedule) for each of them on the host. */
void tt_offload_window(const tt_exec *x, const tt_call *c, float **w, void **m1, void **m2);
/* After update call c has been queued (or, where its master is offloaded, the cast call after
 * it): for an offloaded one, the next tensor's buffers copied into the other slot (waiting only
 * for that slot's last update; it overlaps this update), then this tensor's copied back to the
 * host (the compute queued later waits for it). Nothing for other calls. 0, or -1 with err set. */
int tt_offload_after(tt_exec *x, const tt_call *c, tt_err *err);
/* Runs cast call c of the update phase (policy.offload 2: a TT_CALL_CAST, or a one-member
 * TT_CALL_CAST_MULTI for a KRSC copy): the offloaded master just updated in its window slot cast
 * into its persistent 16-bit copy. 0, or -1 with err set (a cast of no offloaded master). */
int tt_offload_cast(tt_exec *x, const tt_call *c, tt_err *err);
/* After the host region's master of parameter `param` was written (init, resume, tt_net_param_set:
 * exec.c's param copy): when it is an offloaded master (offload 2), copies it through slot 0 and
 * casts it into its persistent copy, waiting for the device; the copy is then what the micro-step's
 * cast would have made. Nothing for other parameters. 0, or -1 with err set. */
int tt_offload_master_set(tt_exec *x, int param, tt_err *err);
/* Runs call c (TT_CALL_OFFLOAD) of the training program: an offloaded activation's copy or event
 * (program.h TT_OFF_*; src, dst: its in[0] and out[0] resolved, the host copy in the pinned region).
 * OUT records mark and copies src -> dst after it on the copy stream (done recorded after); WAIT makes
 * later compute wait for done; MARK records mark; IN copies src -> dst after mark, later compute
 * waiting for it. 0, or -1 with err set naming the buffer. */
int tt_offload_act_call(tt_exec *x, const tt_call *c, void *src, void *dst, tt_err *err);
/* Host address of buffer b of the training program when it is a host buffer, else NULL. */
void *tt_offload_host_ptr(const tt_exec *x, const tt_program *p, int b);

#ifdef __cplusplus
}
#endif
#endif
