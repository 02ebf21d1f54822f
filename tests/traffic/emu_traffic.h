/* tests/traffic/emu_traffic.h — global-memory traffic of the backend's own kernels under the
 * host emulation (tests/cuda_emu), for tests/kernels/test_cuda_traffic.c.
 *
 * kernels/cuda/<name>.cu are compiled for this (and only this) test with GCC's thread sanitizer
 * instrumentation (-fsanitize=thread, its runtime not linked): every load and store the
 * compiler emits calls __tsan_{read,write}N(addr), which emu_traffic.cc defines. The kernels'
 * sources are unchanged. An access counts when a kernel runs and the address lies in a device
 * allocation (shared memory, the fiber's stack and the launch's parameters do not).
 *
 * Per launch: bytes read and written (every access, and distinct bytes), and warp requests:
 * the k-th execution of one load/store instruction by each lane of a warp is one request
 * (lanes of a warp run that instruction together on a GPU); its cost is the number of
 * distinct 32-byte sectors its lanes touch, its ideal ceil(distinct bytes / 32). */
#ifndef TT_EMU_TRAFFIC_H
#define TT_EMU_TRAFFIC_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_emu_traffic_rec {
  const char *kernel;
  unsigned long long rd, wr;           /* bytes, every access */
  unsigned long long rd_uniq, wr_uniq; /* distinct bytes */
  unsigned long long requests, sectors, ideal_sectors;
} tt_emu_traffic_rec;

/* Starts (1) or stops (0) counting. */
void tt_emu_traffic_enable(int on);
/* Copies up to max records of the launches that ran since the last call and forgets them;
 * returns how many there were. */
size_t tt_emu_traffic_take(tt_emu_traffic_rec *out, size_t max);

#ifdef __cplusplus
}
#endif
#endif
