/* core/compile/offload.h — planned host offload of the optimizer state (issue 42 item 2).
 *
 * A training program planned with policy.offload holds every optimizer-state buffer (SGD's
 * momentum, Adam's m and v, in the format [train] optimizer_state gives them) in one pinned host
 * region instead of the arena (tt_buf.host; offsets into the region, p->host_bytes long), and
 * plans one transient device window of two slots, live in the update phase only, each slot big
 * enough for the largest tensor's state. The executor (core/runtime/offload_exec.c) streams each
 * tensor's state through the slots in turn: copied in on the copy stream, updated by the
 * backend's own update kernels, copied back. The copies move bytes, never change them, so a run
 * with offload is bit for bit the run without.
 *
 * policy.offload 2 (autocast training on a backend with a copy stream) holds the fp32 master of
 * every trainable weight that has a 16-bit copy there too: lower.c makes that copy persistent (no
 * cast step in the micro-step) and puts a CAST step (master -> copy) right after the weight's
 * update; the master travels through the slot first, the executor points the update and that
 * cast at the slot, and casts every such master into its copy whenever the master is set (init,
 * resume, tt_net_param_set: offload_exec.c). A copy is the cast of the master as it was after the
 * last update, which is what the micro-step's cast made, so the run is again bit for bit the same. */
#ifndef TT_OFFLOAD_H
#define TT_OFFLOAD_H
#include "cost.h"
#include "program.h"

#ifdef __cplusplus
extern "C" {
#endif

/* After lowering a training program whose policy has offload set: marks its optimizer-state
 * buffers host, adds the window buffer (transient, [micro_end, nsteps - 1]) and drops the
 * many-tensor update from the call list's capabilities (each offloaded tensor's update is its
 * own call, between its copies). A program without optimizer state is left as it is. 0, or -1
 * with err set when out of host memory. */
int tt_offload_lower(tt_program *p, tt_err *err);

/* The update phase's CAST step of parameter `param`'s offloaded master into its persistent copy
 * (policy.offload 2, lower.c's lower_update), or -1 when it has none. */
int tt_offload_master_cast(const tt_program *p, int param);

/* The optimizer state's share of p's pinned host region, in bytes as held (the masters and saved
 * activations there left out; 0 when the state stays in the arena). */
size_t tt_offload_state_bytes(const tt_program *p);

/* The default host budget for pinned buffers: half of the memory the kernel reports available
 * now (MemAvailable in /proc/meminfo; sysconf's free pages where that is unreadable), 0 when
 * neither can be read. */
#define TT_HOST_MEM_DEFAULT_FRACTION 0.5
size_t tt_offload_default_host_budget(void);

#ifdef __cplusplus
}
#endif
#endif
