/* core/compile/offload.h — planned host offload of the optimizer state (issue 42 item 2).
 *
 * A training program planned with policy.offload holds every optimizer-state buffer (SGD's
 * momentum, Adam's m and v, in the format [train] optimizer_state gives them) in one pinned host
 * region instead of the arena (tt_buf.host; offsets into the region, p->host_bytes long), and
 * plans one transient device window of two slots, live in the update phase only, each slot big
 * enough for the largest tensor's state. The executor (core/runtime/offload_exec.c) streams each
 * tensor's state through the slots in turn: copied in on the copy stream, updated by the
 * backend's own update kernels, copied back. The copies move bytes, never change them, so a run
 * with offload is bit for bit the run without. */
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

/* The default host budget for pinned buffers: half of the memory the kernel reports available
 * now (MemAvailable in /proc/meminfo; sysconf's free pages where that is unreadable), 0 when
 * neither can be read. */
#define TT_HOST_MEM_DEFAULT_FRACTION 0.5
size_t tt_offload_default_host_budget(void);

#ifdef __cplusplus
}
#endif
#endif
