/* tests/cuda_emu/emu_internal.h — shared by the files of the CUDA host emulation only.
 *
 * Files: emu_runtime.cc (device, memory, errors), emu_stream.cc (streams, events, copies,
 * kernel submission), emu_sched.cc (kernel launches:
 * each CUDA thread a ucontext fiber, barriers and warp exchanges), emu_cublas.cc and
 * emu_cudnn.cc (reference implementations of the library calls the backend makes, which check
 * the documented argument contracts). Names: emu_ inside the emulation, tt_emu_ where tests or
 * the stub headers call in.
 *
 * The model: one host thread plays the device. Work given to a stream is queued and runs only
 * when something waits for it (a stream or device synchronisation, an event the host or
 * another stream waits on, a copy into pageable host memory), in stream order; so a missing
 * wait shows up as stale data. Device memory is mapped inaccessible while host code runs, so a
 * host dereference of a device pointer stops the program with a message.
 */
#ifndef TT_EMU_INTERNAL_H
#define TT_EMU_INTERNAL_H
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <functional>

#include "tt_emu.h"

/* ---------------------------------- violations ---------------------------------------- */

/* Records a contract violation (tt_emu_last_violation) and prints "cuda_emu: <msg>" on
 * stderr unless quiet. Returns the recorded message. */
const char *emu_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *emu_vviolation(const char *fmt, va_list ap);
/* A library's last failure as the emulation explained it (the runtime, cuBLAS, cuDNN): the failing
 * status (0, success in each library, when none), the explanation, and the buffer the library's
 * status string is built in. */
struct emu_status_detail {
  int code;
  char msg[2048], str[2400];
};
/* Records status s failing with fmt's message, a violation (emu_vviolation); returns s. */
int emu_detail_vfail(emu_status_detail *d, int s, const char *fmt, va_list ap);
/* What a library's status-string call returns for s, named text: text, or "text [cuda_emu: msg]"
 * when s is d's failure (not 0) and it has a message. */
const char *emu_detail_string(emu_status_detail *d, int s, const char *text);
/* A runtime call failing with e: the message is what cudaGetErrorString(e) will add. */
cudaError_t emu_cuda_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The sticky error (a kernel that failed), or cudaSuccess; every API call returns it. */
cudaError_t emu_sticky(void);
void emu_set_sticky(cudaError_t e, const char *msg);
/* Shared memory per block on the emulated device: what every kernel may use (cudaDeviceProp's
 * sharedMemPerBlock, 48 KiB on every architecture), and the most one may opt in to with
 * cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize): sharedMemPerBlockOptin,
 * the emulated compute capability's (emu_shared_optin: 64 KiB on sm_75, 227 KiB on sm_90). */
enum { EMU_SHARED_PER_BLOCK = 48 * 1024 };
int emu_shared_optin(void);
/* Shared memory per multiprocessor of the emulated compute capability (sharedMemPerMultiprocessor). */
int emu_shared_per_sm(void);
/* First call of the process: the fake context. */
void emu_init(void);
/* The emulated device's compute capability, major * 10 + minor (tt_emu_set_compute_capability). */
int emu_compute_capability(void);
/* v rounded to TF32 (10 mantissa bits, nearest even), as tensor cores read an fp32 operand. */
double emu_tf32_round(double v);
/* What the last cuDNN convolution and the last cublasGemmEx ran with (tt_emu_last_conv_math,
 * tt_emu_last_gemm_math): set by emu_cudnn.cc and emu_cublas.cc. */
extern int emu_last_conv_math, emu_last_conv_tf32, emu_last_gemm_math, emu_last_gemm_tf32;
/* The device's primary context now exists (as cudaSetDevice, cudaFree(0), an allocation or a
 * stream creates it on CUDA 12 and newer); NVML's used memory counts it from then on. */
void emu_context_create(void);
/* Every API entry: the context exists, a sticky error fails the call. */
#define EMU_ENTER()                                      \
  do {                                                   \
    emu_init();                                          \
    emu_context_create();                                \
    if (emu_sticky() != cudaSuccess) return emu_sticky(); \
  } while (0)
/* An entry that creates no context (cudaGetDevice, cudaGetDeviceProperties, cudaDeviceGetPCIBusId). */
#define EMU_ENTER_NO_CONTEXT()                           \
  do {                                                   \
    emu_init();                                          \
    if (emu_sticky() != cudaSuccess) return emu_sticky(); \
  } while (0)


/* ---------------------------------- allocations --------------------------------------- */

enum { EMU_DEVICE = 1, EMU_PINNED = 2 };
struct emu_alloc {
  char *base;      /* what the caller got */
  size_t size;     /* bytes asked for */
  char *map;       /* the mapping (base is near its end, a guard page follows) */
  size_t map_size; /* mapping bytes including the guard page */
  int kind;
  unsigned long id; /* 1, 2, ... in allocation order */
  int freed;
};
/* The live allocation containing p (base <= p < base + size; p == base + size counts when
 * size == 0 or end is set), or NULL. */
const emu_alloc *emu_alloc_find(const void *p, int end);
/* 0 when [p, p + bytes) lies inside one live device allocation; otherwise a message in msg. */
int emu_dev_range(const void *p, size_t bytes, char *msg, size_t msgsize);
int emu_is_device(const void *p);
/* "0x... (offset N of the M-byte device allocation #id)" or "0x... (host memory)". */
const char *emu_describe(const void *p, char *buf, size_t n);
static inline int emu_overlap(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return an && bn && x < y + bn && y < x + an;
}

/* Device code and copies run between enter and leave: device memory is accessible then. */
void emu_device_enter(void);
void emu_device_leave(void);
/* Memory the fake device reports as used by handles (cudaMemGetInfo). */
void emu_reserve_add(long long bytes);
/* The libraries' lazy load: the first call (cuBLAS's first GEMM) takes TT_EMU_LIBRARY_BYTES of
 * device memory beside the handles, as cuDNN's and cuBLAS's kernels and their local memory do on
 * a card after setup (what core/runtime/session.c measures after its warm-up); later calls none. */
void emu_library_load(void);
/* Frees a device allocation (who names the call in messages); its work must be done. */
cudaError_t emu_free_device(void *p, const char *who);

/* ------------------------------------ streams ----------------------------------------- */

/* 0 when s names a live stream (NULL and the legacy/per-thread handles included). */
int emu_stream_check(cudaStream_t s, const char *who, char *msg, size_t msgsize);
/* Queues fn on s; it runs when something waits for s. */
void emu_enqueue(cudaStream_t s, const char *what, std::function<void()> fn);
/* Adds ms of fake time to the clock events read (run from queued work: an emulated cuDNN engine's
 * duration, emu_cudnn_graph.cc). */
void emu_clock_advance(double ms);
/* Records a backend-API (graph) failure as cuDNN's last one, for cudnnGetErrorString; returns s. */
int emu_dnn_graph_vfail(int s, const char *fmt, va_list ap);
/* Runs every stream's queued work (a device synchronisation). */
void emu_run_all(void);
/* A call that the runtime refuses while any stream captures in the global or thread-local mode
 * (an allocation, a free, a device-wide or legacy-stream synchronisation; the emulation's host is
 * one thread, so both modes are alike): cudaSuccess when no such capture is active; otherwise every
 * such capture is invalidated (its cudaStreamEndCapture fails) and the call fails with
 * cudaErrorStreamCaptureUnsupported and a message naming who. */
cudaError_t emu_capture_unsafe(const char *who);

/* ------------------------------------ kernels ----------------------------------------- */

/* Runs every block of d (called when the stream reaches the launch); a failure sets the sticky
 * error with a message naming the kernel, the launch site, the block and the threads. */
void emu_run_launch(const tt_emu_launch_desc *d);
/* The kernel and block running now, for the SIGSEGV handler's message ("" outside kernels). */
const char *emu_kernel_now(char *buf, size_t n);
/* Called by the SIGSEGV handler for a fault inside a kernel: does not return. */
void emu_kernel_fault(const char *msg) __attribute__((noreturn));
int emu_in_kernel(void);
/* For the SIGSEGV handler: when p lies in the guard page after the running launch's dynamic
 * shared memory, describes it ("0x..., N bytes past the end of the M bytes of dynamic shared
 * memory") in buf and returns 1; else 0. */
int emu_dyn_shared_describe(const void *p, char *buf, size_t n);

/* An observer of kernel execution (NULL: none), called by the scheduler: EMU_OBS_LAUNCH_BEGIN
 * and _END around a launch, _BLOCK_BEGIN and _BLOCK_END around each block. The traffic
 * counter (tests/traffic/emu_traffic.cc) sets it. */
enum { EMU_OBS_LAUNCH_BEGIN, EMU_OBS_BLOCK_BEGIN, EMU_OBS_BLOCK_END, EMU_OBS_LAUNCH_END };
extern void (*emu_observer)(int what, const tt_emu_launch_desc *d);

/* ------------------------------------ counters ---------------------------------------- */

extern tt_emu_counts emu_counts;

#endif
