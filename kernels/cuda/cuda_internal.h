/* kernels/cuda/cuda_internal.h — shared by the CUDA backend's files only.
 *
 * State lives in tt_cuda_state (b->impl), never in globals: the handles, the two streams,
 * the allocation counter, the convolution descriptor cache (allocated once at create time)
 * and the last error. Every CUDA / cuDNN / cuBLAS call goes through one of the CUDA_CHECK,
 * CUDNN_CHECK, CUBLAS_CHECK macros, which record "<call> failed: <reason>" and return -1.
 * Kernel launches are followed by CUDA_LAUNCH_CHECK (cudaGetLastError).
 *
 * Files, one op family each, named as in kernels/ref/ and kernels/cpu/ (docs/design.md):
 * cuda_backend.cu (table, device, memory, streams), cuda_conv.cu (cuDNN), cuda_linear.cu
 * (cuBLAS), cuda_bn.cu (batch norm; its held-on-chip form in cuda_bn_chip.cu, their shared
 * arithmetic in cuda_bn.h), cuda_pool.cu (max, average and global average pooling),
 * cuda_elementwise.cu (activations incl. GELU, add, casts), cuda_loss_optim.cu (softmax
 * cross-entropy, optimizer updates, the overflow check), cuda_attention.cu (fused attention),
 * cuda_layernorm.cu, cuda_tokens.cu (patch tokens, token pooling); cuda_nccl.cu (the all-reduce
 * between GPUs) and cuda_export.cu (the exported entry points' linkage).
 *
 * Names: functions shared between the CUDA files start tt_cuda_; file-static helpers start
 * with cuda_. fp16 tensors are IEEE half (__half), bf16 tensors bfloat16 (__nv_bfloat16: the high
 * half of an fp32); computation is fp32 for both. A 16-bit dtype is only storage to the backend's
 * own kernels: loads widen to fp32 (bf16: a 16-bit shift, on every architecture), stores round to
 * nearest even (__float2bfloat16_rn: one cvt.rn.bf16.f32 on sm_80 and newer, cuda_bf16.h's integer
 * fallback on sm_75, the same bits; a NaN stays a NaN, 0x7fff). Every dtype test names all three
 * dtypes, so a bf16 tensor never takes an fp32 or fp16 path by accident; entry points refuse any
 * other dtype by number.
 */
#ifndef TT_CUDA_INTERNAL_H
#define TT_CUDA_INTERNAL_H
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../backend.h"
#include "../kernel_math.h"

/* Convolution descriptor cache: slots (with their cuDNN descriptors) are created in
 * tt_cuda_backend_create; a miss reuses the least recently used slot, so nothing is
 * allocated after setup. The algorithm choice is a pure function of (shape, dtype,
 * workspace limit), so a re-derived slot picks the same algorithm the planner was told. */
#define TT_CUDA_CONV_SLOTS 256
#define TT_CUDA_MAX_NORM_CH 64 /* normalize_u8: channels passed by value */

typedef struct tt_cuda_conv_slot {
  int used;
  tt_conv_desc d;
  tt_dtype dt;
  uint64_t last_use;
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;    /* [k, c/g, r, s] (KCRS), as the weights are stored */
  cudnnTensorDescriptor_t yt;   /* y in the other layout (a transposed dy: cuda_conv_view) */
  cudnnFilterDescriptor_t wn;   /* the filter as [k, r, s, c/g] (CUDNN_TENSOR_NHWC), a transposed copy */
  cudnnConvolutionDescriptor_t conv;
  int have[3];                  /* algorithm chosen for TT_WS_FWD / BWD_DATA / BWD_FILTER */
  int algo[3];
  cudnnMathType_t math[3];
  size_t cudnn_ws[3];           /* cuDNN's own workspace for the chosen algorithm */
} tt_cuda_conv_slot;

/* A convolution through cuDNN's graph (backend) API (cuda_conv_graph.cu): per (shape, dtype,
 * direction, accumulate) the operation graph built once at setup, the heuristics' first few engine
 * configurations that pass (TT_CUDA_CONV_GRAPH_CANDS, each with its execution plan), which of them
 * runs. Held in a small cache beside the legacy slots; descriptors are cudnnBackendDescriptor_t. */
#define TT_CUDA_CONV_GRAPH_SLOTS 128
#define TT_CUDA_CONV_GRAPH_CANDS 4
typedef struct tt_cuda_conv_graph {
  int used;
  tt_conv_desc d;
  tt_dtype dt;
  int which;        /* tt_ws_kind */
  int acc;          /* backward-data: beta 1 (dx added into); the graph's beta is fixed when it is built */
  uint64_t last_use;
  int none;         /* the graph API offered nothing: this shape runs on the legacy API */
  char why[160];    /* what the graph API said when it offered nothing */
  const char *mode; /* "A" or "FALLBACK": the heuristic mode the candidates came from */
  int ncand, chosen, timed; /* candidates with a plan; the one that runs; 1 when chosen by timing */
  long long engine[TT_CUDA_CONV_GRAPH_CANDS]; /* each candidate's engine global index */
  size_t ws[TT_CUDA_CONV_GRAPH_CANDS];        /* its plan's workspace (bytes) */
  float ms[TT_CUDA_CONV_GRAPH_CANDS];         /* its time at setup (-1: not timed) */
  int tensor_core[TT_CUDA_CONV_GRAPH_CANDS];  /* CUDNN_NUMERICAL_NOTE_TENSOR_CORE */
  void *plan[TT_CUDA_CONV_GRAPH_CANDS];       /* finalized execution plans (NULL once dropped) */
  void *desc[6];    /* x, w, y tensors, the convolution, the operation, the operation graph */
  double build_ms;  /* time the graph, heuristics and plans took to build */
} tt_cuda_conv_graph;

typedef struct tt_cuda_state {
  int device;
  cudaStream_t compute, copy;
  cudaEvent_t ev;       /* compute -> copy: a copy starts after the work queued before it */
  cudaEvent_t ev_copy;  /* copy -> compute: the work queued after a copy waits for it */
  cublasHandle_t blas;
  cudnnHandle_t dnn;
  size_t alloc_count;   /* cudaMalloc (arena_alloc) and cudaHostAlloc (host_alloc) calls made */
  size_t arena_bytes;   /* bytes currently held by arena allocations */
  size_t total_mem;     /* device memory */
  int cc;               /* compute capability, major * 10 + minor (75: a T4; bf16 cuDNN/cuBLAS from 80) */
  size_t ws_cap;        /* largest cuDNN workspace a convolution algorithm may ask for */
  size_t ws_cap_default;/* the setup's ws_cap (tt_cuda_set_conv_workspace_cap(b, 0) restores it) */
  int tf32;             /* 1: fp32 convolutions and GEMMs may use TF32 (tt_cuda_set_tf32; only from cc 80) */
  int deterministic;    /* TINYTRAIN_CUDA_DETERMINISTIC=1 (read at creation): convolutions take only algorithms
                         * cuDNN reports CUDNN_DETERMINISTIC (no atomics: the same bits run to run) */
  tt_backend_knobs knobs; /* what creation was given (core/base/knobs.c): find, deterministic, bn_resident, layout */
  int conv_found;       /* directions whose algorithm cudnnFind*Ex chose at setup (tt_cuda_conv_find); for tests */
  size_t blas_ws;       /* cuBLAS workspace each GEMM is planned (cuda_linear.cu) */
  size_t lib_margin;    /* device memory kept for what cuDNN/cuBLAS load after setup (tt_cuda_library_margin) */
  size_t local_max;     /* the most local memory (bytes per thread) any kernel of ours takes (cuda_be_check_kernels) */
  size_t stack_limit;   /* the per-thread stack limit after setup (cudaDeviceGetLimit), bytes */
  size_t bn_res_cap;    /* bytes of shared memory a block of the held-on-chip batch norm may take; 0: that form
                         * is off (cuda_bn_chip.cu, tt_cuda_norm_setup, tt_cuda_set_bn_resident) */
  size_t bn_res_cap_default; /* the setup's (the kernels' opt-in attribute is set for it) */
  int sms;              /* multiprocessors (tt_cuda_norm_setup): the batch norm row kernels' grids */
  tt_cuda_conv_slot *conv;
  int nconv;
  tt_cuda_conv_graph *cg; /* the graph-API convolutions (cuda_conv_graph.cu); TT_CUDA_CONV_GRAPH_SLOTS */
  cudaEvent_t cg_ev[2];   /* the setup's timing of graph-API engine candidates */
  uint64_t tick;
  void *nvml_lib;       /* dlopen'ed libnvidia-ml (may be NULL) */
  void *nvml_dev;       /* nvmlDevice_t */
  void *nvml_getmem;    /* nvmlDeviceGetMemoryInfo */
  void *nccl;           /* ncclComm_t of a multi-process run (cuda_nccl.cu), else NULL */
  cudaStream_t nccl_stream; /* the gradient all-reduce's stream, beside compute (cuda_nccl.cu) */
  cudaEvent_t nccl_ready, nccl_done; /* compute -> nccl_stream, nccl_stream -> compute */
  double *ss_part;      /* per-block partial sums [TT_CUDA_SS_BLOCKS] of sum_squares, and softmax_ce's
                         * (loss, correct) pairs (cuda_loss_optim.cu): each op's second launch
                         * consumes them on the same stream; allocated at setup, before the reserve
                         * is measured */
  float *graph_scale;   /* the loss's gradient scale as a recorded loss reads it (cuda_graph.cu): the slot after
                         * ss_part's partial sums, allocated with them */
  uint64_t *graph_seed; /* the micro-step's dropout base as recorded dropout and attention calls read it
                         * (kernel_math.h tt_seed_at): the slot after graph_scale's */
  int capturing;        /* 1 between graph_begin and graph_end: softmax_ce reads graph_scale, not its argument;
                         * dropout and attention take their seed argument as the call's number, read graph_seed */
  char err[1024];       /* last error message, one line */
} tt_cuda_state;
#define TT_CUDA_SS_BLOCKS 1024

static inline tt_cuda_state *tt_cuda_st(tt_backend *b) { return (tt_cuda_state *)b->impl; }
/* The graph entries (backend.h graph_*; cuda_graph.cu). */
int tt_cuda_graph_begin(tt_backend *b);
int tt_cuda_graph_end(tt_backend *b, void **graph);
int tt_cuda_graph_values(tt_backend *b, float grad_scale, uint64_t seed_base);
int tt_cuda_graph_launch(tt_backend *b, void *graph);
void tt_cuda_graph_destroy(tt_backend *b, void *graph);
/* Queues, on the compute stream, graph_scale = grad_scale and graph_seed = seed_base in one launch:
 * what a recorded softmax_ce, dropout and attention read (cuda_loss_optim.cu). 0 or -1. */
int tt_cuda_graph_values_set(tt_backend *b, float grad_scale, uint64_t seed_base);
/* The seed a dropout or attention kernel draws with: seed itself, or while recorded (base non-NULL:
 * the device's graph_seed) tt_seed_at(*base, seed), seed being the call's number (backend.h). */
static __device__ __forceinline__ uint64_t tt_cuda_seed(uint64_t seed, const uint64_t *base) {
  return base ? tt_seed_at(*base, seed) : seed;
}
/* b's state when b is a CUDA backend (the entry points of tt_cuda.h take any backend), else NULL. */
static inline tt_cuda_state *tt_cuda_of(tt_backend *b) {
  return b && b->impl && b->name && !strcmp(b->name, "cuda") ? tt_cuda_st(b) : NULL;
}

/* tt_cuda_select_device's choice, taken by the next tt_cuda_backend_create (cuda_backend.cu). */
extern "C" void tt_cuda_set_next_device(int device);

/* Records a message in the backend and returns -1. */
int tt_cuda_fail(tt_backend *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define CUDA_CHECK(b, call)                                                                        \
  do {                                                                                             \
    cudaError_t cuda_e_ = (call);                                                                  \
    if (cuda_e_ != cudaSuccess) return tt_cuda_fail((b), "%s failed: %s", #call, cudaGetErrorString(cuda_e_)); \
  } while (0)
#define CUDNN_CHECK(b, call)                                                                       \
  do {                                                                                             \
    cudnnStatus_t cuda_s_ = (call);                                                                \
    if (cuda_s_ != CUDNN_STATUS_SUCCESS) return tt_cuda_fail((b), "%s failed: %s", #call, cudnnGetErrorString(cuda_s_)); \
  } while (0)
#define CUBLAS_CHECK(b, call)                                                                      \
  do {                                                                                             \
    cublasStatus_t cuda_s_ = (call);                                                               \
    if (cuda_s_ != CUBLAS_STATUS_SUCCESS) return tt_cuda_fail((b), "%s failed: %s", #call, cublasGetStatusString(cuda_s_)); \
  } while (0)
#define CUDA_LAUNCH_CHECK(b, what)                                                                 \
  do {                                                                                             \
    cudaError_t cuda_e_ = cudaGetLastError();                                                      \
    if (cuda_e_ != cudaSuccess) return tt_cuda_fail((b), "%s: kernel launch failed: %s", (what), cudaGetErrorString(cuda_e_)); \
  } while (0)

#define TT_CUDA_THREADS 256
/* Every kernel is declared with the block size it is launched with,
 *   static __global__ void TT_LAUNCH_BOUNDS(TT_CUDA_THREADS) name(...)
 * so that ptxas fits its registers to that block: a block may use 64K registers on every
 * architecture from sm_75, so 1024 threads get at most 64 registers each (CUDA C++ Programming
 * Guide, "Launch Bounds" and the compute-capability table). tests/tools/cuda_check.py holds the
 * bound equal to the launch's block size. The host emulation may define it away. Kernels (and
 * their __device__ helpers) are static, their file's own: every global name of the library
 * carries tt_ (tests/test_exports.sh). */
#ifndef TT_LAUNCH_BOUNDS
#define TT_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
#endif
/* A kernel's dynamic shared memory (the launch's shmem bytes, 16-byte aligned) as unsigned char
 * *name. The host emulation provides it per block (tests/cuda_emu). */
#ifdef TT_CUDA_EMULATED
#define TT_CUDA_DYN_SHARED(name) unsigned char *name = (unsigned char *)tt_emu_dyn_shared(__FILE__, __LINE__)
#else
#define TT_CUDA_DYN_SHARED(name)                              \
  extern __shared__ __align__(16) unsigned char tt_cuda_dsm_[]; \
  unsigned char *name = tt_cuda_dsm_
#endif
/* Every kernel launch goes through this macro, so that a build can run the kernels elsewhere
 * (the host emulation in tests/ defines it before including this header). */
#ifndef TT_LAUNCH
#define TT_LAUNCH(kernel, grid, block, shmem, stream, ...) kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#endif
/* The backend's own kernels, one table per file (TT_CUDA_KERNEL(kernel, block size) each), so
 * that setup can ask the runtime about every one (cudaFuncGetAttributes) before anything else:
 * that a kernel image for the device exists, that the block it is launched with fits, and, as
 * the reference loads a lazily loaded kernel, so that its module is on the device before the
 * reserve is measured. tests/tools/cuda_check.py holds the tables complete and their block sizes
 * equal to the launches'. */
typedef struct tt_cuda_kernel {
  const char *name;
  const void *fn;
  int threads;
} tt_cuda_kernel;
#define TT_CUDA_KERNEL(k, threads) {#k, (const void *)(k), (threads)}
/* Defines a kernel file's table, tt_cuda_<file>_kernels[] (the TT_CUDA_KERNEL entries given), and
 * its length tt_cuda_<file>_nkernels; used once, at the end of each file with kernels. */
#define TT_CUDA_KERNEL_TABLE(file, ...)                                  \
  const tt_cuda_kernel tt_cuda_##file##_kernels[] = {__VA_ARGS__};       \
  const int tt_cuda_##file##_nkernels = (int)(sizeof tt_cuda_##file##_kernels / sizeof(tt_cuda_kernel))
extern const tt_cuda_kernel tt_cuda_elementwise_kernels[], tt_cuda_bn_kernels[], tt_cuda_bn_chip_kernels[],
    tt_cuda_bn_rows_kernels[], tt_cuda_pool_kernels[], tt_cuda_loss_optim_kernels[], tt_cuda_layernorm_kernels[],
    tt_cuda_attention_kernels[], tt_cuda_tokens_kernels[];
extern const int tt_cuda_elementwise_nkernels, tt_cuda_bn_nkernels, tt_cuda_bn_chip_nkernels, tt_cuda_bn_rows_nkernels,
    tt_cuda_pool_nkernels, tt_cuda_loss_optim_nkernels, tt_cuda_layernorm_nkernels, tt_cuda_attention_nkernels, tt_cuda_tokens_nkernels;
extern const tt_cuda_kernel tt_cuda_pool_nhwc_kernels[];
extern const int tt_cuda_pool_nhwc_nkernels;

/* Fully unrolls the next loop on the device (a register array indexed by its counter stays in
 * registers); nothing in the host emulation. */
#ifdef TT_CUDA_EMULATED
#define TT_UNROLL
#else
#define TT_UNROLL _Pragma("unroll")
#endif
/* Calls f(DT, ...) with the dtype a constant, one call per dtype, so that once f is inlined each
 * dtype's path is compiled apart with no dtype test per element (f: a __device__ __forceinline__
 * function taking the dtype first). Where a kernel's inner loop would otherwise test a runtime
 * dtype three ways, this may keep its registers down (cuda-check found add spilling on sm_100 when
 * bf16 joined the runtime test; softmax_ce and pooling backward needed one kernel per dtype). */
#define TT_CUDA_BY_DTYPE(dt, f, ...)   \
  do {                                 \
    if ((dt) == TT_F16)                \
      f(TT_F16, __VA_ARGS__);          \
    else if ((dt) == TT_BF16)          \
      f(TT_BF16, __VA_ARGS__);         \
    else                               \
      f(TT_F32, __VA_ARGS__);          \
  } while (0)
/* Grid-stride loop over count elements (launch with tt_cuda_blocks(count) blocks). */
#define TT_CUDA_LOOP(i, count) \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (count); i += (size_t)blockDim.x * gridDim.x)
/* Blocks for a grid-stride loop over count elements. */
static inline unsigned tt_cuda_blocks(size_t count) {
  size_t bl = (count + TT_CUDA_THREADS - 1) / TT_CUDA_THREADS;
  if (bl < 1) bl = 1;
  if (bl > 65535u * 8u) bl = 65535u * 8u;
  return (unsigned)bl;
}

/* Whether a dtype is one of the three the backend computes (the entry points' check). */
static inline int tt_cuda_dtype_ok(tt_dtype dt) { return dt == TT_F32 || dt == TT_F16 || dt == TT_BF16; }
static inline const char *tt_cuda_dtype_name(tt_dtype dt) {
  return dt == TT_F32 ? "fp32" : dt == TT_F16 ? "fp16" : dt == TT_BF16 ? "bf16" : "unknown";
}
/* The dtype check of the transformer ops (attention, layer norm, tokens): every tensor load and
 * store there goes through tt_cuda_ld/st, so they take the dtypes those know (storage; the
 * arithmetic is fp32). */
static inline int tt_cuda_dt_check(tt_backend *b, const char *op, tt_dtype dt) {
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "%s: unknown dtype %d (fp32, fp16 and bf16)", op, (int)dt);
  return 0;
}
/* The dtype check of the library-backed ops (cuDNN convolutions, cuBLAS GEMMs): one of the three
 * the backend computes, and bf16 only from compute capability 8.0 on; what names the calls in the
 * refusal ("convolutions") and why the library's reason. */
static inline int tt_cuda_lib_dt_check(tt_backend *b, const char *op, tt_dtype dt, const char *what, const char *why) {
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "%s: unknown dtype %d (the CUDA backend computes fp32, fp16 and bf16)", op, (int)dt);
  if (dt == TT_BF16 && tt_cuda_st(b)->cc < 80)
    return tt_cuda_fail(b,
                        "%s: bf16 %s need compute capability 8.0 or newer (%s); this device is %d.%d: use --precision "
                        "fp16 (fp32 accumulation with loss scaling) or fp32",
                        op, what, why, tt_cuda_st(b)->cc / 10, tt_cuda_st(b)->cc % 10);
  return 0;
}
/* The check of an op over [n, c, hw] planes (batch norm, global average pooling): the shape, and
 * the dtype one of the three the backend computes. */
static inline int tt_cuda_planes_check(tt_backend *b, const char *op, int n, int c, int hw, tt_dtype dt) {
  if (n <= 0 || c <= 0 || hw <= 0) return tt_cuda_fail(b, "%s: bad shape n=%d c=%d hw=%d", op, n, c, hw);
  if (!tt_cuda_dtype_ok(dt)) return tt_cuda_fail(b, "%s: unknown dtype %d (the CUDA backend computes fp32, fp16 and bf16)", op, (int)dt);
  return 0;
}
/* The stream every op's kernels run on. */
static inline cudaStream_t tt_cuda_stream(tt_backend *b) { return tt_cuda_st(b)->compute; }

#ifdef __CUDACC__
/* Load/store one element of a dt tensor as fp32 (dt is uniform across a launch). */
__device__ __forceinline__ float tt_cuda_ld(tt_dtype dt, const void *p, size_t i) {
  if (dt == TT_F16) return __half2float(((const __half *)p)[i]);
  if (dt == TT_BF16) return __uint_as_float((unsigned int)((const unsigned short *)p)[i] << 16);
  return ((const float *)p)[i];
}
__device__ __forceinline__ void tt_cuda_st(tt_dtype dt, void *p, size_t i, float v) {
  if (dt == TT_F16)
    ((__half *)p)[i] = __float2half_rn(v);
  else if (dt == TT_BF16)
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
  else
    ((float *)p)[i] = v;
}
/* One 16-byte (8-byte) access: p aligned to it. On the device a uint4 (uint2)
 * load or store, one LDG.128 / STG.128 (.64); in the host emulation a GCC vector access, one
 * 16-byte access that the traffic test (tests/test_cuda_traffic.c) sees as one (a struct copy
 * would be split into four 4-byte accesses there). */
#ifdef TT_CUDA_EMULATED
struct tt_cuda_u4 {
  unsigned int x, y, z, w;
};
typedef unsigned int tt_cuda_u4v __attribute__((vector_size(16)));
static inline tt_cuda_u4 tt_cuda_ld16(const void *p) {
  tt_cuda_u4v v = *(const tt_cuda_u4v *)p;
  return tt_cuda_u4{v[0], v[1], v[2], v[3]};
}
static inline void tt_cuda_st16(void *p, tt_cuda_u4 u) {
  tt_cuda_u4v v = {u.x, u.y, u.z, u.w};
  *(tt_cuda_u4v *)p = v;
}
#else
typedef uint4 tt_cuda_u4;
__device__ __forceinline__ uint4 tt_cuda_ld16(const void *p) { return *(const uint4 *)p; }
__device__ __forceinline__ void tt_cuda_st16(void *p, uint4 u) { *(uint4 *)p = u; }
#endif
/* One 8-byte access as two 32-bit words (lo at the lower address): on the device a uint2, one
 * LDG.64 / STG.64 of a register pair. Never a 64-bit integer built with shifts and ORs: CUDA
 * 13.0's ptxas compiled the store of four packed fp16/bf16 built that way (PTX bfi.b64) for sm_90
 * into two PRMTs writing the same register and an STG.E.64 of that register and an unset one
 * (cuobjdump on the first H100 run); the fp32 -> fp16 cast gave -1e-45 -> +0 and 64096 -> NaN
 * there, which the emulation cannot see. */
#ifdef TT_CUDA_EMULATED
__device__ __forceinline__ void tt_cuda_ld8w(const void *p, unsigned int *lo, unsigned int *hi) {
  unsigned long long u = *(const unsigned long long *)p; /* one 8-byte access for the traffic test */
  *lo = (unsigned int)u, *hi = (unsigned int)(u >> 32);
}
__device__ __forceinline__ void tt_cuda_st8w(void *p, unsigned int lo, unsigned int hi) {
  *(unsigned long long *)p = (unsigned long long)lo | (unsigned long long)hi << 32;
}
#else
__device__ __forceinline__ void tt_cuda_ld8w(const void *p, unsigned int *lo, unsigned int *hi) {
  uint2 u = *(const uint2 *)p;
  *lo = u.x, *hi = u.y;
}
__device__ __forceinline__ void tt_cuda_st8w(void *p, unsigned int lo, unsigned int hi) { *(uint2 *)p = make_uint2(lo, hi); }
#endif
__device__ __forceinline__ float tt_cuda_h(unsigned int u, int hi) {
  return __half2float(__ushort_as_half((unsigned short)(hi ? u >> 16 : u & 0xffffu)));
}
__device__ __forceinline__ unsigned int tt_cuda_pack2(float a, float b) {
  return (unsigned int)__half_as_ushort(__float2half_rn(a)) | (unsigned int)__half_as_ushort(__float2half_rn(b)) << 16;
}
/* bf16: the low (hi == 0) or high element of a 32-bit word as fp32, and two rounded into one */
__device__ __forceinline__ float tt_cuda_b(unsigned int u, int hi) { return __uint_as_float(hi ? u & 0xffff0000u : u << 16); }
__device__ __forceinline__ unsigned int tt_cuda_packb2(float a, float b) {
  return (unsigned int)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
         (unsigned int)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16;
}

/* Vector iv (V elements of a dt tensor, one access of V x element bytes: 16 at most) as fp32,
 * and its store. V is 1, 2, 4 or 8 (fp16, bf16), 1, 2 or 4 (fp32); the pointer aligned to the
 * vector. */
template <int V>
__device__ __forceinline__ void tt_cuda_ldv(tt_dtype dt, const void *p, size_t iv, float *v) {
  if (dt == TT_F16) {
    if (V == 8) {
      tt_cuda_u4 u = tt_cuda_ld16((const char *)p + iv * 16);
      v[0] = tt_cuda_h(u.x, 0), v[1] = tt_cuda_h(u.x, 1), v[2] = tt_cuda_h(u.y, 0), v[3] = tt_cuda_h(u.y, 1);
      v[4 % V] = tt_cuda_h(u.z, 0), v[5 % V] = tt_cuda_h(u.z, 1), v[6 % V] = tt_cuda_h(u.w, 0), v[7 % V] = tt_cuda_h(u.w, 1);
    } else if (V == 4) {
      unsigned int lo, hi;
      tt_cuda_ld8w((const char *)p + iv * 8, &lo, &hi);
      v[0] = tt_cuda_h(lo, 0), v[1 % V] = tt_cuda_h(lo, 1), v[2 % V] = tt_cuda_h(hi, 0), v[3 % V] = tt_cuda_h(hi, 1);
    } else if (V == 2) {
      unsigned int u = ((const unsigned int *)p)[iv];
      v[0] = tt_cuda_h(u, 0), v[1 % V] = tt_cuda_h(u, 1);
    } else {
      v[0] = __half2float(((const __half *)p)[iv]);
    }
  } else if (dt == TT_BF16) {
    if (V == 8) {
      tt_cuda_u4 u = tt_cuda_ld16((const char *)p + iv * 16);
      v[0] = tt_cuda_b(u.x, 0), v[1] = tt_cuda_b(u.x, 1), v[2] = tt_cuda_b(u.y, 0), v[3] = tt_cuda_b(u.y, 1);
      v[4 % V] = tt_cuda_b(u.z, 0), v[5 % V] = tt_cuda_b(u.z, 1), v[6 % V] = tt_cuda_b(u.w, 0), v[7 % V] = tt_cuda_b(u.w, 1);
    } else if (V == 4) {
      unsigned int lo, hi;
      tt_cuda_ld8w((const char *)p + iv * 8, &lo, &hi);
      v[0] = tt_cuda_b(lo, 0), v[1 % V] = tt_cuda_b(lo, 1), v[2 % V] = tt_cuda_b(hi, 0), v[3 % V] = tt_cuda_b(hi, 1);
    } else if (V == 2) {
      unsigned int u = ((const unsigned int *)p)[iv];
      v[0] = tt_cuda_b(u, 0), v[1 % V] = tt_cuda_b(u, 1);
    } else {
      v[0] = tt_cuda_b(((const unsigned short *)p)[iv], 0);
    }
  } else {
    if (V == 4) {
      tt_cuda_u4 u = tt_cuda_ld16((const char *)p + iv * 16);
      v[0] = __uint_as_float(u.x), v[1 % V] = __uint_as_float(u.y), v[2 % V] = __uint_as_float(u.z),
      v[3 % V] = __uint_as_float(u.w);
    } else if (V == 2) {
      unsigned int lo, hi;
      tt_cuda_ld8w((const char *)p + iv * 8, &lo, &hi);
      v[0] = __uint_as_float(lo), v[1 % V] = __uint_as_float(hi);
    } else {
      v[0] = ((const float *)p)[iv];
    }
  }
}
template <int V>
__device__ __forceinline__ void tt_cuda_stv(tt_dtype dt, void *p, size_t iv, const float *v) {
  if (dt == TT_F16) {
    if (V == 8) {
      tt_cuda_u4 u;
      u.x = tt_cuda_pack2(v[0], v[1 % V]), u.y = tt_cuda_pack2(v[2 % V], v[3 % V]);
      u.z = tt_cuda_pack2(v[4 % V], v[5 % V]), u.w = tt_cuda_pack2(v[6 % V], v[7 % V]);
      tt_cuda_st16((char *)p + iv * 16, u);
    } else if (V == 4) {
      tt_cuda_st8w((char *)p + iv * 8, tt_cuda_pack2(v[0], v[1 % V]), tt_cuda_pack2(v[2 % V], v[3 % V]));
    } else if (V == 2) {
      ((unsigned int *)p)[iv] = tt_cuda_pack2(v[0], v[1 % V]);
    } else {
      ((__half *)p)[iv] = __float2half_rn(v[0]);
    }
  } else if (dt == TT_BF16) {
    if (V == 8) {
      tt_cuda_u4 u;
      u.x = tt_cuda_packb2(v[0], v[1 % V]), u.y = tt_cuda_packb2(v[2 % V], v[3 % V]);
      u.z = tt_cuda_packb2(v[4 % V], v[5 % V]), u.w = tt_cuda_packb2(v[6 % V], v[7 % V]);
      tt_cuda_st16((char *)p + iv * 16, u);
    } else if (V == 4) {
      tt_cuda_st8w((char *)p + iv * 8, tt_cuda_packb2(v[0], v[1 % V]), tt_cuda_packb2(v[2 % V], v[3 % V]));
    } else if (V == 2) {
      ((unsigned int *)p)[iv] = tt_cuda_packb2(v[0], v[1 % V]);
    } else {
      ((__nv_bfloat16 *)p)[iv] = __float2bfloat16_rn(v[0]);
    }
  } else {
    if (V == 4) {
      tt_cuda_u4 u;
      u.x = __float_as_uint(v[0]), u.y = __float_as_uint(v[1 % V]), u.z = __float_as_uint(v[2 % V]),
      u.w = __float_as_uint(v[3 % V]);
      tt_cuda_st16((char *)p + iv * 16, u);
    } else if (V == 2) {
      tt_cuda_st8w((char *)p + iv * 8, __float_as_uint(v[0]), __float_as_uint(v[1 % V]));
    } else {
      ((float *)p)[iv] = v[0];
    }
  }
}

/* beta == 0 overwrites (never 0*old, which would keep a NaN), as the CPU backend. */
__device__ __forceinline__ void tt_cuda_st_beta(tt_dtype dt, void *p, size_t i, float v, float beta) {
  if (beta != 0.0f) v += beta * tt_cuda_ld(dt, p, i);
  tt_cuda_st(dt, p, i, v);
}
/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024), returned to every
 * thread. sh: __shared__ double[33]. Fixed order, so deterministic. */
__device__ __forceinline__ double tt_cuda_block_sum(double v, double *sh) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5, o;
  for (o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  __syncthreads(); /* sh may still be read from a previous call */
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  if (wid == 0) {
    v = lane < nw ? sh[lane] : 0.0;
    for (o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) sh[32] = v;
  }
  __syncthreads();
  return sh[32];
}
/* Sum of v over the 32 lanes of a warp (butterfly: every lane gets the same sum); every lane of
 * the warp must call it. */
__device__ __forceinline__ float tt_cuda_sum32(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
#endif

/* The widest vector (elements, at most 16 bytes of the widest dtype) every pointer is aligned to. */
static inline int tt_cuda_vec_width(size_t es, const void *const *ptrs, int nptrs) {
  int v = (int)(16 / es);
  while (v > 1) {
    int ok = 1;
    for (int i = 0; i < nptrs && ok; i++)
      if (ptrs[i] && ((uintptr_t)ptrs[i] % ((size_t)v * es))) ok = 0;
    if (ok) break;
    v >>= 1;
  }
  return v;
}

/* ---- shared helpers (cuda_elementwise.cu) ---- */
/* y[(i*c + ch)*hw + k] += bias[ch] for y [n, c, hw] in dt, bias in dt. */
int tt_cuda_add_bias(tt_backend *b, const char *op, int n, int c, size_t hw, tt_dtype dt, const void *bias, void *y);
/* out[ch] = beta*out[ch] + sum over (n, hw) of t[n, ch, hw]; fp32 out. */
int tt_cuda_channel_sum(tt_backend *b, const char *op, int n, int c, size_t hw, tt_dtype dt, const void *t, float *out,
                        float beta);
/* y (fp32) = beta*y + x (dt), count elements. */
int tt_cuda_accum_to_f32(tt_backend *b, const char *op, size_t count, tt_dtype dt, const void *x, float *y, float beta);
/* src [outer, m, n] (sdt) -> dst [outer, n, m] (ddt); beta != 0 accumulates into an fp32 dst
 * (cuda_elementwise.cu) */
int tt_cuda_transpose(tt_backend *b, const char *op, int outer, int m, int n, tt_dtype sdt, const void *src, tt_dtype ddt,
                      void *dst, float beta);

/* ---- ops (see backend.h) ---- */
/* cuda_bn_chip.cu: setup of the held-on-chip batch norm (its shared-memory cap), after the kernel check */
int tt_cuda_norm_setup(tt_backend *b, const cudaDeviceProp *prop);
/* cuda_conv.cu, cuda_linear.cu */
TT_BACKEND_DECLARE_CONV_LINEAR(tt_cuda)
int tt_cuda_conv_cache_create(tt_backend *b);
void tt_cuda_conv_cache_destroy(tt_backend *b);
/* Forgets every chosen convolution algorithm (the next query or call chooses again): after the
 * TF32 setting or the workspace cap changed. */
void tt_cuda_conv_cache_forget(tt_backend *b);
/* backend.h's tune: times each convolution direction of ops with cudnnFind*Ex over scratch (the
 * arena's transient region at setup) and keeps the fastest algorithm within the workspace planned for
 * it; TINYTRAIN_CUDA_FIND=0 keeps the heuristic choices. */
int tt_cuda_conv_find(tt_backend *b, const tt_op_desc *ops, int nops, void *scratch, size_t scratch_bytes);
/* backend.h's prepare: builds the convolutions of ops (the graph-API ones' operation graphs and
 * plans, the legacy ones' algorithm choices); 0 or -1. */
int tt_cuda_conv_prepare(tt_backend *b, const tt_op_desc *ops, int nops);
/* op_workspace of a convolution call (its accumulate flag picks the graph-API graph's beta). */
size_t tt_cuda_conv_op_workspace(tt_backend *b, const tt_op_desc *op);

/* cuda_conv_graph.cu: convolutions through cuDNN's graph API, NHWC activations, KRSC filters.
 * tt_cuda_conv_graph_get: the graph slot serving (d, dt, which, acc), built if new; *g = NULL when
 * the legacy API serves the call (TINYTRAIN_CUDA_CONV_API=legacy, not all-NHWC, or the graph API
 * offered nothing under auto). 0, or -1 with the reason (under =graph, a shape the graph API does
 * not serve). */
int tt_cuda_conv_graph_get(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which, int acc,
                           tt_cuda_conv_graph **g);
/* Planned bytes of a graph-API call: the KRSC filter (or dw) copy, then the largest candidate's workspace;
 * w_krsc (the call's tt_conv_desc.layout_w is KRSC): forward and backward-data read the stored filter
 * as it is, with no copy in front. The slot is the same either way (tt_cuda_conv_graph_get). */
size_t tt_cuda_conv_graph_workspace(const tt_cuda_conv_graph *g, int w_krsc);
/* Runs g: in0/in1/out as the direction's operands (forward x, w, y; backward-data dy, w, dx;
 * backward-filter x, dy, dw in fp32 KCRS), beta for dx/dw, inside ws; w_krsc: forward's and
 * backward-data's w is KRSC already (else KCRS, transposed into the workspace's front). 0 or -1. */
int tt_cuda_conv_graph_run(tt_backend *b, tt_cuda_conv_graph *g, const char *op, const void *in0, const void *in1, void *out,
                           float beta, int w_krsc, void *ws, size_t ws_bytes);
/* tune's part for graph-API calls: times each slot's candidates on scratch; 0 or -1. */
int tt_cuda_conv_graph_tune(tt_backend *b, const tt_op_desc *ops, int nops, void *scratch, size_t scratch_bytes);
/* The TINYTRAIN_CUDA_CONV_LOG line of a graph-API call; planned: its planned workspace. */
void tt_cuda_conv_graph_log(const tt_cuda_conv_graph *g, size_t planned, double ms);
int tt_cuda_conv_graph_create(tt_backend *b);
void tt_cuda_conv_graph_forget(tt_backend *b);
void tt_cuda_conv_graph_destroy(tt_backend *b);
/* cuda_bn.cu */
/* Workspace bytes of bn_fwd_train and bn_bwd (16-byte aligned); bn_fwd_infer takes none. */
size_t tt_cuda_bn_workspace(int n, int c, int hw, tt_dtype dt);
TT_BACKEND_DECLARE_BN(tt_cuda)
/* The ReLU-fused forms (backend.h bn_fwd_train_relu, bn_bwd_relu): bn_fwd_train's and bn_bwd's
 * launches with the ReLU folded in. */
int tt_cuda_bn_fwd_train_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                              const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                              float eps, float *save_mean, float *save_invstd, int update_running, void *ws,
                              size_t ws_bytes);
int tt_cuda_bn_bwd_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                        const float *gamma, const float *bias, const float *save_mean, const float *save_invstd, void *dx,
                        float *dgamma, float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes);
/* The add-and-ReLU-fused forms (backend.h bn_fwd_train_add_relu, bn_bwd_add_relu): bn_fwd_train's
 * launches with the add and the ReLU in the normalisation; tt_cuda_relu_route, then bn_bwd's. */
int tt_cuda_bn_fwd_train_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                                  const float *bias, const void *s, void *y, float *running_mean, float *running_var,
                                  float momentum, float eps, float *save_mean, float *save_invstd, int update_running,
                                  void *ws, size_t ws_bytes);
int tt_cuda_bn_bwd_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *y,
                            const uint32_t *mask, void *dy, const float *gamma, const float *save_mean,
                            const float *save_invstd, void *dx, void *ds, float *dgamma, float *dbias, float beta_dx,
                            float beta_s, float beta_param, void *ws, size_t ws_bytes);
/* cuda_elementwise.cu: the ReLU's backward and an add's routing in one pass over count elements
 * (bn_bwd_add_relu's first launch): g = dy where the ReLU's output y > 0 (mask non-NULL: its bit
 * set), else 0, as act_bwd / act_bwd_mask give it; ds = beta_s*ds + g as accumulate writes it (ds
 * NULL: none; ds may be dy when beta_s == 0); then g over dy, for bn_bwd to read. */
int tt_cuda_relu_route(tt_backend *b, size_t count, tt_dtype dt, const void *y, const uint32_t *mask, void *dy, void *ds,
                       float beta_s);
/* cuda_pool.cu */
TT_BACKEND_DECLARE_POOL(tt_cuda)
/* cuda_pool_nhwc.cu: one pooling call on an NHWC desc, tiled (what: 0 max, 1 average forward into
 * out; 2 pool_argmax, its uint8 index into out; 3 max backward from x, 4 average, 5 max from idx,
 * into out with beta). 1: launched; 0: no tile fits this shape, the caller runs its untiled kernel;
 * -1: failed (the message set). */
int tt_cuda_pool_nhwc(tt_backend *b, const char *op, const tt_pool_desc *d, int what, tt_dtype dt, const void *x,
                      const void *dy, const uint8_t *idx, void *out, float beta);
/* cuda_elementwise.cu (check_finite: cuda_loss_optim.cu) */
TT_BACKEND_DECLARE_ELEMENTWISE(tt_cuda)
TT_BACKEND_DECLARE_SAVE_COPY(tt_cuda)
int tt_cuda_cast_multi(tt_backend *b, const tt_cast_seg *segs, int nseg, tt_dtype src_dt, tt_dtype dst_dt);
/* cuda_loss_optim.cu */
TT_BACKEND_DECLARE_LOSS_OPTIM(tt_cuda)
int tt_cuda_sgd_update_multi(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float momentum, int nesterov,
                             float weight_decay, float grad_scale, const tt_clip *clip, const int32_t *skip);
int tt_cuda_adam_update_multi(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float beta1, float beta2,
                              float eps, float weight_decay, int decoupled, int t, float grad_scale, const tt_clip *clip,
                              const int32_t *skip);
/* cuda_layernorm.cu, cuda_attention.cu, cuda_tokens.cu */
/* Workspace bytes (bwd: the backward's; the forwards take none), TT_WS_ERROR with the reason
 * recorded for a call the kernels cannot run. */
size_t tt_cuda_ln_workspace(tt_backend *b, int rows, int f, tt_dtype dt, int bwd);
size_t tt_cuda_attn_workspace(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, int bwd);
TT_BACKEND_DECLARE_LN_ATTN(tt_cuda)
TT_BACKEND_DECLARE_TOKENS(tt_cuda)
#endif
