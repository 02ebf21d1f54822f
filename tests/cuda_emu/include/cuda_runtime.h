/* tests/cuda_emu/include/cuda_runtime.h — the CUDA runtime as the host emulation provides it.
 *
 * The emulation build (configure.py: build/tests/test_cuda_emu) compiles the real
 * kernels/cuda/<name>.cu with `g++ -x c++ -D__CUDACC__ -DTT_CUDA_EMULATION -Itests/cuda_emu/include`,
 * so this header stands in for the toolkit's. It declares:
 *   - the execution-space keywords as macros (__global__, __device__, __shared__, ...);
 *     __launch_bounds__(N) records N on the kernel (see TT_EMU_BOUND below) so that a launch
 *     with more threads per block fails, as on a GPU;
 *   - threadIdx / blockIdx / blockDim / gridDim, read from the emulated thread that runs;
 *   - the device functions the kernels use: __syncthreads (and _or/_and/_count), __syncwarp,
 *     the warp shuffles, votes and atomics; each CUDA thread is a ucontext fiber, so barriers
 *     and shuffles are real exchanges between threads (tests/cuda_emu/emu_sched.cc);
 *   - TT_LAUNCH(kernel, grid, block, shmem, stream, args...), which kernels/cuda/cuda_internal.h
 *     takes instead of its <<<...>>> form: the arguments are converted to the kernel's parameter
 *     types once, at launch, as a real launch does, and the launch is queued on the stream;
 *   - the runtime API on host memory (tests/cuda_emu/emu_runtime.cc): one fake sm_75 device with
 *     4 GiB, allocations tracked (and inaccessible to host code), streams that run their work
 *     only when something waits for it.
 * What the emulation checks and what it cannot see: docs/testing.md.
 */
#ifndef TT_EMU_CUDA_RUNTIME_H
#define TT_EMU_CUDA_RUNTIME_H
#ifndef __cplusplus
#error "the CUDA emulation headers are C++: compile kernels/cuda/<name>.cu with g++ -x c++"
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "library_types.h"

#define CUDART_VERSION 13000
#define TT_CUDA_EMULATED 1

/* ---------------------------------- keywords ------------------------------------------ */

#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline
#define __restrict__ __restrict
/* Shared memory: one copy per kernel, reused block after block (blocks run one at a time). The
 * section lets the scheduler fill all of it with 0xff (NaN) before each block, so a read of
 * shared memory that no thread of the block wrote shows up. Dynamic shared memory has no
 * extern __shared__ array here: kernels/cuda/cuda_internal.h's macro asks tt_emu_dyn_shared
 * (below) for the launch's buffer, which is filled the same way. */
#define __shared__ static __attribute__((section("tt_emu_shared")))
/* __launch_bounds__(N[, minBlocks[, maxCluster]]): the bound is stored as N no-op bytes in front of
 * the kernel's entry (GCC's patchable_function_entry, which also lists the start of that padding
 * in the __patchable_function_entries section): the runtime reads N back from a kernel's address
 * (emu_sched.cc, tt_emu_kernel_bound). N may be any integer constant expression. */
#define __launch_bounds__(...) TT_EMU_LB_(__VA_ARGS__, 0)
#define TT_EMU_LB_(n, ...) __attribute__((patchable_function_entry((n), (n)), noinline))

/* ------------------------------------- types ------------------------------------------ */

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorCompatNotSupportedOnDevice = 804,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorInvalidPtx = 218,
  cudaErrorJitCompilerNotFound = 221,
  cudaErrorUnsupportedPtxVersion = 222,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorIllegalState = 401,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorUnknown = 999
} cudaError_t;

typedef enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxBlockDimX = 2,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
} cudaDeviceAttr;

/* cudaDeviceSetLimit's limits: the emulation records the stack size (tt_emu_stack_limit) */
typedef enum cudaLimit {
  cudaLimitStackSize = 0,
  cudaLimitPrintfFifoSize = 1,
  cudaLimitMallocHeapSize = 2
} cudaLimit;

typedef enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9
} cudaFuncAttribute;

#define cudaStreamDefault 0x00u
#define cudaStreamNonBlocking 0x01u
#define cudaDeviceScheduleAuto 0x00u
#define cudaDeviceScheduleSpin 0x01u
#define cudaDeviceScheduleYield 0x02u
#define cudaDeviceScheduleBlockingSync 0x04u
#define cudaDeviceMapHost 0x08u
#define cudaDeviceLmemResizeToMax 0x10u
#define cudaEventDefault 0x00u
#define cudaEventBlockingSync 0x01u
#define cudaEventDisableTiming 0x02u
#define cudaHostAllocDefault 0x00u
#define cudaHostAllocPortable 0x01u
#define cudaHostAllocMapped 0x02u
#define cudaHostAllocWriteCombined 0x04u
#define cudaHostRegisterDefault 0x00u
#define cudaHostRegisterPortable 0x01u
#define cudaHostRegisterMapped 0x02u

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
typedef void (*cudaHostFn_t)(void *userData);
/* Stream capture and graphs (emu_stream.cc): a capture records the stream's work as a graph's
 * nodes in order; an instantiated graph replays them on the stream it is launched on. */
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
} cudaStreamCaptureMode;
typedef enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
} cudaStreamCaptureStatus;
#define cudaEventRecordDefault 0x00u
#define cudaEventRecordExternal 0x01u

/* The fields tinytrain and common code read; the emulated device fills them. */
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int clockRate;
  size_t totalConstMem;
  int major;
  int minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  size_t sharedMemPerMultiprocessor;
  size_t sharedMemPerBlockOptin;
  int pciBusID, pciDeviceID, pciDomainID;
  int memoryBusWidth;
  int l2CacheSize;
};

struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  size_t constSizeBytes;
  size_t localSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int ptxVersion;
  int binaryVersion;
  int maxDynamicSharedSizeBytes;
};

/* ---------------------------------- runtime API --------------------------------------- */

extern "C" {
/* The emulation's NVML (emu_runtime.cc), which the backend opens instead of libnvidia-ml. */
void *tt_emu_nvml_open(void);
void *tt_emu_nvml_sym(void *lib, const char *name);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaSetDeviceFlags(unsigned int flags);
cudaError_t cudaDeviceSetLimit(cudaLimit limit, size_t value);
cudaError_t cudaDeviceGetLimit(size_t *value, cudaLimit limit);
cudaError_t cudaGetDeviceFlags(unsigned int *flags);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream);
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);

cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int *flags);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
}

template <typename T>
static inline cudaError_t cudaMalloc(T **devPtr, size_t size) {
  return cudaMalloc((void **)devPtr, size);
}
template <typename T>
static inline cudaError_t cudaMallocHost(T **ptr, size_t size) {
  return cudaMallocHost((void **)ptr, size);
}

/* ---------------------------- emulated threads (device code) -------------------------- */

/* Set by the scheduler before it switches to a thread's fiber. */
struct tt_emu_builtins {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
extern thread_local tt_emu_builtins tt_emu_b;
#define threadIdx (static_cast<const uint3 &>(tt_emu_b.thread_idx))
#define blockIdx (static_cast<const uint3 &>(tt_emu_b.block_idx))
#define blockDim (static_cast<const dim3 &>(tt_emu_b.block_dim))
#define gridDim (static_cast<const dim3 &>(tt_emu_b.grid_dim))
static const int warpSize = 32;

enum { TT_EMU_RED_NONE = 0, TT_EMU_RED_OR, TT_EMU_RED_AND, TT_EMU_RED_COUNT };
enum {
  TT_EMU_WARP_SYNC = 0,
  TT_EMU_WARP_SHFL,
  TT_EMU_WARP_SHFL_UP,
  TT_EMU_WARP_SHFL_DOWN,
  TT_EMU_WARP_SHFL_XOR,
  TT_EMU_WARP_BALLOT,
  TT_EMU_WARP_ANY,
  TT_EMU_WARP_ALL
};

/* Block barrier; red combines pred over the block (TT_EMU_RED_*). file/line name the barrier in
 * messages (the caller's, through GCC's __builtin_FILE / __builtin_LINE). */
int tt_emu_block_barrier(int red, int pred, const char *file, int line);
/* Warp exchange: waits for the lanes of mask, returns the value this lane receives. */
uint64_t tt_emu_warp_op(int op, unsigned mask, uint64_t value, int size, int arg, int width, const char *file,
                        int line);
unsigned tt_emu_active_mask(void);
/* The running launch's dynamic shared memory: exactly its shmem bytes, 16-byte aligned, with an
 * inaccessible page after them (an overrun is cudaErrorIllegalAddress naming the thread; when
 * shmem is not a multiple of 16, up to 15 bytes lie between, checked for writes after each
 * block), 0xff in every byte when a block starts. In a launch with shmem 0 the block fails with a
 * message naming file:line (the caller's); called from host code, the program aborts. */
extern "C" void *tt_emu_dyn_shared(const char *file, int line);

static inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  tt_emu_block_barrier(TT_EMU_RED_NONE, 0, file, line);
}
static inline int __syncthreads_or(int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return tt_emu_block_barrier(TT_EMU_RED_OR, pred != 0, file, line);
}
static inline int __syncthreads_and(int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return tt_emu_block_barrier(TT_EMU_RED_AND, pred != 0, file, line);
}
static inline int __syncthreads_count(int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return tt_emu_block_barrier(TT_EMU_RED_COUNT, pred != 0, file, line);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  tt_emu_warp_op(TT_EMU_WARP_SYNC, mask, 0, 0, 0, 32, file, line);
}
static inline unsigned __activemask(void) { return tt_emu_active_mask(); }
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}

template <typename T>
static inline T tt_emu_shfl(int op, unsigned mask, T var, int arg, int width, const char *file, int line) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffles move at most 8 bytes");
  uint64_t in = 0, out;
  T r;
  memcpy(&in, &var, sizeof(T));
  out = tt_emu_warp_op(op, mask, in, (int)sizeof(T), arg, width, file, line);
  memcpy(&r, &out, sizeof(T));
  return r;
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32, const char *file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  return tt_emu_shfl(TT_EMU_WARP_SHFL, mask, var, srcLane, width, file, line);
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                               const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return tt_emu_shfl(TT_EMU_WARP_SHFL_UP, mask, var, (int)delta, width, file, line);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                                 const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return tt_emu_shfl(TT_EMU_WARP_SHFL_DOWN, mask, var, (int)delta, width, file, line);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32,
                                const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return tt_emu_shfl(TT_EMU_WARP_SHFL_XOR, mask, var, laneMask, width, file, line);
}
static inline unsigned __ballot_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                                     int line = __builtin_LINE()) {
  return (unsigned)tt_emu_warp_op(TT_EMU_WARP_BALLOT, mask, pred != 0, 4, 0, 32, file, line);
}
static inline int __any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return (int)tt_emu_warp_op(TT_EMU_WARP_ANY, mask, pred != 0, 4, 0, 32, file, line);
}
static inline int __all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return (int)tt_emu_warp_op(TT_EMU_WARP_ALL, mask, pred != 0, 4, 0, 32, file, line);
}

/* Atomics: one host thread runs every emulated thread and switches only at barriers, so a
 * read-modify-write is atomic as written. */
template <typename T>
struct tt_emu_same {
  typedef T type;
};
template <typename T>
static inline T atomicAdd(T *p, typename tt_emu_same<T>::type v) {
  T o = *p;
  *p = (T)(o + v);
  return o;
}
template <typename T>
static inline T atomicSub(T *p, typename tt_emu_same<T>::type v) {
  T o = *p;
  *p = (T)(o - v);
  return o;
}
template <typename T>
static inline T atomicOr(T *p, typename tt_emu_same<T>::type v) {
  T o = *p;
  *p = o | v;
  return o;
}
template <typename T>
static inline T atomicAnd(T *p, typename tt_emu_same<T>::type v) {
  T o = *p;
  *p = o & v;
  return o;
}
template <typename T>
static inline T atomicXor(T *p, typename tt_emu_same<T>::type v) {
  T o = *p;
  *p = o ^ v;
  return o;
}
template <typename T>
static inline T atomicMax(T *p, typename tt_emu_same<T>::type v) {
  T o = *p;
  if (v > o) *p = v;
  return o;
}
template <typename T>
static inline T atomicMin(T *p, typename tt_emu_same<T>::type v) {
  T o = *p;
  if (v < o) *p = v;
  return o;
}
template <typename T>
static inline T atomicExch(T *p, typename tt_emu_same<T>::type v) {
  T o = *p;
  *p = v;
  return o;
}
template <typename T>
static inline T atomicCAS(T *p, typename tt_emu_same<T>::type cmp, typename tt_emu_same<T>::type v) {
  T o = *p;
  if (o == cmp) *p = v;
  return o;
}

/* Intrinsics: the host's functions (so the emulation cannot see the device's math library);
 * glibc already declares __expf and __logf. */
template <typename T>
static inline T __ldg(const T *p) {
  return *p;
}
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline unsigned __float_as_uint(float x) {
  unsigned u;
  memcpy(&u, &x, 4);
  return u;
}
static inline float __uint_as_float(unsigned u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
#ifndef TT_EMU_NO_MINMAX
/* CUDA's global min / max overloads for device code. */
#define TT_EMU_MINMAX(T)                                   \
  static inline T min(T a, T b) { return b < a ? b : a; } \
  static inline T max(T a, T b) { return a < b ? b : a; }
TT_EMU_MINMAX(int)
TT_EMU_MINMAX(unsigned)
TT_EMU_MINMAX(long)
TT_EMU_MINMAX(unsigned long)
TT_EMU_MINMAX(long long)
TT_EMU_MINMAX(unsigned long long)
#undef TT_EMU_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
#endif
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }

/* ------------------------------------ launches ---------------------------------------- */

extern "C" {
/* Whether a kernel may use p: inside (or one past the end of) memory from cudaMalloc, or
 * pinned host memory (cudaMallocHost, cudaHostAlloc, cudaHostRegister). */
int tt_emu_is_device_ptr(const void *p);
/* Maximum threads per block of a kernel: its __launch_bounds__, else 1024. */
int tt_emu_kernel_bound(const void *kernel);
/* cudaFuncSetAttribute on a kernel's address (emu_stream.cc), and the most dynamic shared memory
 * a launch of it may ask for: its cudaFuncAttributeMaxDynamicSharedMemorySize, 48 KiB until set. */
cudaError_t tt_emu_func_set_attribute(const void *kernel, int attr, int value);
int tt_emu_func_max_dyn_shared(const void *kernel);
}

/* A launch, type-erased: run(closure) calls the kernel with the converted arguments. */
struct tt_emu_launch_desc {
  const char *name, *file;
  int line;
  const void *kernel;
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;
  void *closure;
  void (*run)(void *closure);
  void (*destroy)(void *closure);
  const char *bad_arg; /* set when a pointer argument is not device memory */
  int bad_index;
  const void *bad_value;
};
cudaError_t tt_emu_launch_erased(tt_emu_launch_desc *d);

template <typename T>
static inline void tt_emu_check_arg(tt_emu_launch_desc *d, int index, const T &v) {
  if constexpr (std::is_pointer<T>::value) {
    if (v && !d->bad_arg && !tt_emu_is_device_ptr((const void *)v)) {
      d->bad_arg = "pointer";
      d->bad_index = index;
      d->bad_value = (const void *)v;
    }
  }
}

template <typename... P>
struct tt_emu_closure {
  void (*k)(P...);
  std::tuple<typename std::decay<P>::type...> args;
  static void run(void *c) {
    tt_emu_closure *self = (tt_emu_closure *)c;
    std::apply(self->k, self->args); /* each thread gets its own copy of the parameters */
  }
  static void destroy(void *c) { delete (tt_emu_closure *)c; }
};

template <typename... P, typename... A>
static inline cudaError_t tt_emu_launch(const char *name, const char *file, int line, void (*kernel)(P...), dim3 grid,
                                        dim3 block, size_t shmem, cudaStream_t stream, A &&...args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  tt_emu_closure<P...> *c = new tt_emu_closure<P...>{kernel, std::tuple<typename std::decay<P>::type...>(
                                                                 std::forward<A>(args)...)};
  tt_emu_launch_desc d{};
  d.name = name, d.file = file, d.line = line, d.kernel = (const void *)kernel;
  d.grid = grid, d.block = block, d.shmem = shmem, d.stream = stream;
  d.closure = c, d.run = &tt_emu_closure<P...>::run, d.destroy = &tt_emu_closure<P...>::destroy;
  std::apply([&d](const auto &...a) {
    int i = 0;
    (tt_emu_check_arg(&d, i++, a), ...);
  }, c->args);
  return tt_emu_launch_erased(&d);
}

/* kernels/cuda/cuda_internal.h uses this in place of kernel<<<grid, block, shmem, stream>>>(...);
 * as there, errors are picked up by the cudaGetLastError that follows. */
#ifndef TT_LAUNCH
#define TT_LAUNCH(kernel, grid, block, shmem, stream, ...) \
  ((void)tt_emu_launch(#kernel, __FILE__, __LINE__, kernel, (grid), (block), (shmem), (stream), __VA_ARGS__))
#endif

template <typename F>
static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, F *func) {
  if (!attr || !func) return cudaErrorInvalidValue;
  memset(attr, 0, sizeof *attr);
  attr->maxThreadsPerBlock = tt_emu_kernel_bound((const void *)func);
  attr->ptxVersion = attr->binaryVersion = 75;
  attr->maxDynamicSharedSizeBytes = tt_emu_func_max_dyn_shared((const void *)func);
  return cudaSuccess;
}
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value) {
  return tt_emu_func_set_attribute((const void *)func, (int)attr, value);
}
template <typename F>
static inline cudaError_t cudaOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, F *func,
                                                             size_t dynamicSMemSize = 0, int blockSizeLimit = 0) {
  int b;
  if (!minGridSize || !blockSize || !func) return cudaErrorInvalidValue;
  b = tt_emu_kernel_bound((const void *)func);
  if (blockSizeLimit > 0 && blockSizeLimit < b) b = blockSizeLimit;
  *blockSize = b;
  *minGridSize = 40 * (2048 / b > 0 ? 2048 / b : 1); /* 40 multiprocessors, 2048 threads each */
  return cudaSuccess;
}
template <typename F>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, F *func, int blockSize,
                                                                        size_t dynamicSMemSize) {
  if (!numBlocks || !func || blockSize <= 0) return cudaErrorInvalidValue;
  *numBlocks = blockSize > tt_emu_kernel_bound((const void *)func) ? 0 : 2048 / blockSize;
  return cudaSuccess;
}

#endif
