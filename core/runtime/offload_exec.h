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
/* For update call c of the training program: where its first and second optimizer state are
 * while it runs. A call whose state is in the arena keeps *m1, *m2; an offloaded one gets its
 * window slot's (the next in the schedule). */
void tt_offload_window(const tt_exec *x, const tt_call *c, void **m1, void **m2);
/* After update call c has been queued: for an offloaded one, the next tensor's state copied into
 * the other slot (waiting only for that slot's last update; it overlaps this update), then this
 * tensor's state copied back to the host (the compute queued later waits for it). Nothing for
 * other calls. 0, or -1 with err set. */
int tt_offload_after(tt_exec *x, const tt_call *c, tt_err *err);
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
