/* tests/cuda_emu/include/cuda_profiler_api.h — the profiler range of the CUDA runtime, for the host
 * emulation of the CUDA backend (emu_runtime.cc). The emulation counts the calls and whether a
 * range is open (tt_emu_profiler_calls, tt_emu.h); a profiler would record the work in between.
 * Both need the device's context, as the runtime's do. */
#ifndef TT_EMU_CUDA_PROFILER_API_H
#define TT_EMU_CUDA_PROFILER_API_H
#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif
cudaError_t cudaProfilerStart(void);
cudaError_t cudaProfilerStop(void);
#ifdef __cplusplus
}
#endif
#endif
