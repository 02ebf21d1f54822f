/* tests/cuda_emu/tt_emu.h — what a test program sees of the CUDA emulation (C and C++).
 * Only in the emulated build (TT_CUDA_EMULATION); see include/cuda_runtime.h. */
#ifndef TT_EMU_H
#define TT_EMU_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Work given to the emulated device: kernel launches (accepted by the launch checks), emulated
 * threads that ran, cuBLAS and cuDNN calls, copies and memsets. */
typedef struct tt_emu_counts {
  size_t launches, threads, blas_calls, dnn_calls, copies;
} tt_emu_counts;
void tt_emu_get_counts(tt_emu_counts *c);
/* Device and page-locked allocations (cudaMalloc, cudaMallocAsync, cudaHostAlloc, cudaMallocHost,
 * cudaHostRegister) made so far. */
size_t tt_emu_allocations(void);
/* cudaGraphLaunch calls that queued a graph's work so far, and the nodes they queued. */
size_t tt_emu_graph_launches(size_t *nodes);
/* Kernel launches that have run so far (eager ones and a graph's replayed ones): the count
 * TT_EMU_FAULT_LAUNCH=N compares with. tt_emu_counts.launches counts launch calls instead, which a
 * capture records without running and a replay runs without calling. */
size_t tt_emu_launches_run(void);
/* Launches of the kernel named `name` (as written in its TT_LAUNCH: "cuda_ew_cast_k") so far. */
size_t tt_emu_kernel_launches(const char *name);
/* The per-thread stack limit (cudaDeviceSetLimit(cudaLimitStackSize); the driver's 1024 bytes
 * until set) and how many times it was set. */
size_t tt_emu_stack_limit(int *sets);
/* The device flags (cudaSetDeviceFlags; 0 until set) and the flags an event was created with. */
unsigned tt_emu_device_flags(void);
unsigned tt_emu_event_flags(void *ev);
/* The emulated device's compute capability, major * 10 + minor (75 until set; 75..120 taken,
 * anything else ignored); returns the old value. A backend reads it when it is created. */
int tt_emu_set_compute_capability(int cc);
/* The last convolution (cudnnConvolutionForward / BackwardData / BackwardFilter) and the last
 * cublasGemmEx, as queued: the descriptor's cudnnMathType_t (the handle's cublasMath_t for the
 * GEMM), and *tf32 = 1 when the emulation rounded fp32 operands to TF32 for it (fp32 data, a math
 * type that allows TF32, an emulated device of compute capability 8.0 or newer). -1 before any. */
int tt_emu_last_conv_math(int *tf32);
int tt_emu_last_gemm_math(int *tf32);
/* The algorithms the emulated convolution calls of direction dir (0 forward, 1 backward data, 2
 * backward filter) ran since the last reset, one bit per cudnnConvolution*Algo_t value; reset != 0
 * clears them after reading. And the cudnnFind*AlgorithmEx calls so far. */
unsigned tt_emu_conv_algos_used(int dir, int reset);
size_t tt_emu_conv_find_calls(void);
/* cuDNN's backend (graph) API (emu_cudnn_graph.cc): the fake duration, in ms, that executing engine
 * `engine` (its global index: the legacy algorithm's value) of direction dir adds to the clock
 * events read ((algorithm count - engine) x 100 ms; -1 for no such engine); which heuristic modes
 * return results (bit 1 << cudnnBackendHeurMode_t; all by default; returns the old mask); and the
 * cudnnBackendExecute calls so far. */
double tt_emu_graph_engine_ms(int dir, int engine);
unsigned tt_emu_graph_offer(unsigned modes);
size_t tt_emu_graph_executes(void);
/* cudaStreamSynchronize and cudaDeviceSynchronize calls so far (the host waiting for the device). */
size_t tt_emu_host_syncs(void);
/* Profiler range (cudaProfilerStart/Stop): the calls so far, and whether a range is open now. */
size_t tt_emu_profiler_calls(int *active);
/* 1: violations are not printed on stderr (they still fail the call); returns the old value. */
int tt_emu_set_quiet(int quiet);
/* The message of the last violation the emulation found ("" if none). */
const char *tt_emu_last_violation(void);
/* Forgets a sticky error (a failed kernel) so that a test can go on; real CUDA cannot. */
void tt_emu_clear_sticky(void);
/* Whether the emulated device's primary context exists (cudaSetDevice and every allocating or
 * stream call create it; cudaGetDeviceCount, cudaGetDevice, cudaDeviceGetPCIBusId do not). */
int tt_emu_context_exists(void);
/* The emulated NVML: whether the context existed at the first memory read after nvmlInit (the
 * reserve's baseline; -1 before any), and nvmlInit calls not yet shut down. */
int tt_emu_nvml_baseline_context(void);
int tt_emu_nvml_open_count(void);

#ifdef __cplusplus
}
#endif
#endif
