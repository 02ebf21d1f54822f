/* kernels/cuda/tt_cuda.h — what the rest of tinytrain (and tests) see of the CUDA backend.
 * Only meaningful in a build with TT_HAVE_CUDA. */
#ifndef TT_CUDA_H
#define TT_CUDA_H
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA backend's layouts_16bit (backend.h): NHWC where the knobs ask (TINYTRAIN_LAYOUT=nhwc),
 * else none (fp16 and bf16 activations NCHW: measured faster on an H100, cuda_backend.cu). One
 * rule for the backend itself and for `plan`'s stand-in for a card not here (core/runtime/session.c). */
static inline unsigned tt_cuda_layouts_16bit(const tt_backend_knobs *k) {
  return k && k->layout == TT_LAYOUT_NHWC ? 1u << TT_LAYOUT_NHWC : 0u;
}

/* NULL with a message in errbuf (errsize bytes; "no CUDA device (...)") when there is no
 * usable GPU. reserve_bytes receives the device memory the context, every kernel of the backend
 * (loaded at setup) and the cuBLAS/cuDNN handles took: NVML's used bytes before the context
 * exists and after all of that (cudaMemGetInfo when NVML is missing: then everything in use on
 * the device counts). It does not include TT_CUDA_LIBRARY_MARGIN_BYTES. */
tt_backend *tt_cuda_backend_create(size_t *reserve_bytes, const tt_backend_knobs *knobs, char *errbuf, size_t errsize);
/* What cuDNN and cuBLAS may still take after setup: their kernels load lazily, on an
 * algorithm's first run, and a kernel that needs more local memory than the context holds
 * grows it. The planner keeps this much beside the measured reserve, and a training session
 * runs every convolution and GEMM of its programs once after allocating the arena and checks
 * that the libraries stayed within it (core/runtime/session.c). */
/* The margin is sized per card at setup (tt_cuda_library_margin): TT_CUDA_LIBRARY_CODE_BYTES for
 * the libraries' modules, plus TT_CUDA_LOCAL_BYTES_PER_THREAD of local memory for every thread
 * the device holds at once (multiprocessors x threads per multiprocessor; the driver sizes a
 * context's local memory so), never under TT_CUDA_LIBRARY_MARGIN_BYTES: 128 MiB on a T4
 * (40 x 1024 threads), 196 MiB on an H100 SXM (132 x 2048). */
#define TT_CUDA_LIBRARY_MARGIN_BYTES ((size_t)128 << 20)
#define TT_CUDA_LIBRARY_CODE_BYTES ((size_t)64 << 20)
#define TT_CUDA_LOCAL_BYTES_PER_THREAD ((size_t)512)
/* The smallest per-thread stack limit setup sets (TINYTRAIN_CUDA_STACK): our kernels take no
 * local memory, so this is a floor, not a need (cuda_backend.cu: cuda_be_stack_limit). */
#define TT_CUDA_STACK_MIN_BYTES ((size_t)16)
/* This backend's margin (TT_CUDA_LIBRARY_MARGIN_BYTES for any other backend or NULL). */
size_t tt_cuda_library_margin(tt_backend *b);
/* The device's compute capability, major * 10 + minor (75: a T4; 90: an H100); 0 for any other
 * backend or NULL. From 80 the backend computes bf16 convolutions and GEMMs (docs/gpu.md#bf16):
 * what --precision auto asks to choose bf16 over fp16. */
int tt_cuda_compute_capability(tt_backend *b);
/* TF32 for fp32 convolutions and GEMMs (docs/gpu.md#tf32). A backend starts without it (cuDNN
 * CUDNN_FMA_MATH, cuBLAS CUBLAS_DEFAULT_MATH: true fp32, what the tests comparing with the CPU
 * need); the session turns it on by the recipe's [train] tf32 (default on) and --tf32. on = 1 asks
 * for it: it is used from compute capability 8.0 (an sm_75 card has no TF32 tensor cores and
 * stays in fp32). Returns 1 when TF32 is now in use, 0 when not, -1 with last_error on failure.
 * Forgets the convolution algorithms chosen so far (their math type changes): call it before the
 * plan's workspace queries. */
int tt_cuda_set_tf32(tt_backend *b, int on);
/* The largest cuDNN workspace a convolution algorithm may ask for (bytes). Setup sets the default
 * (TT_CUDA_CONV_WS_DEFAULT_CAP, or 1/64 of the card on small cards); the session raises it to what
 * the budget leaves beside the plan (core/runtime/session.c) and re-plans. bytes 0: the default.
 * Returns the cap before the call; forgets the algorithms chosen so far. */
size_t tt_cuda_set_conv_workspace_cap(tt_backend *b, size_t bytes);
#define TT_CUDA_CONV_WS_DEFAULT_CAP ((size_t)64 << 20)
/* Which API serves convolution call op (kind, dtype, desc, accumulate), building it if new:
 * 1 cuDNN's graph API (*engine: the engine global index that runs, *ws: its planned workspace in
 * bytes), 0 the legacy API, -1 with last_error (TINYTRAIN_CUDA_CONV_API=graph and a shape it does
 * not serve). For tests (kernels/cuda/cuda_conv_graph.cu); not in tt_cuda_api below (the dlopen
 * table): only programs that link the backend (the emulated tests, the amalgamation) reach it. */
int tt_cuda_conv_api_used(tt_backend *b, const tt_op_desc *op, long long *engine, size_t *ws);
/* The held-on-chip batch norm (kernels/cuda/cuda_bn_chip.cu; docs/gpu.md, "Batch norm held on
 * chip"): a block takes at most bytes of shared memory (0: the form is off; more than setup's cap:
 * setup's cap). Returns the cap before the call. For tests comparing it with the two-pass forms. */
size_t tt_cuda_set_bn_resident(tt_backend *b, size_t bytes);
/* The CUDA backend's bn_apply (backend.h; kernels/cuda/cuda_bn.cu): batch norm from the
 * training forward's statistics, bit for bit bn_fwd_train's y. Declared here, with C linkage,
 * for the emulated tests (which link the backend's sources) while cuda_backend.cu's table does
 * not list it yet; not in tt_cuda_api, so a GPU build reaches it only through the table. */
int tt_cuda_bn_apply(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                     const float *bias, const float *save_mean, const float *save_invstd, void *y);
/* The device's free and total memory now (cudaMemGetInfo); 0 on success. */
int tt_cuda_mem_free(tt_backend *b, size_t *free_bytes, size_t *total_bytes);
/* Number of CUDA devices; 0 (quietly) when there is no driver or no device. */
int tt_cuda_device_count(void);
/* The same, and where a driver is there but too old for the runtime (cudaErrorInsufficientDriver),
 * 0 with why (whysize bytes) naming the driver and runtime versions and the driver needed;
 * why is "" otherwise. */
int tt_cuda_probe(char *why, size_t whysize);
/* "CUDA runtime 13.0, driver 580.65.06 (CUDA 13.0), cuDNN 9.19.0, cuBLAS 13.1.0": versions of the
 * linked libraries and of the installed driver ("no driver" without one). */
const char *tt_cuda_info(void);
/* cudaMalloc and cudaHostAlloc calls this backend has made (tests: nothing is allocated after setup). */
size_t tt_cuda_alloc_count(tt_backend *b);
/* Device memory in use (NVML, whole device) and total; 0 on success. */
int tt_cuda_mem_used(tt_backend *b, size_t *used, size_t *total);

/* Multi-process training (core/runtime/dist.c, cuda_nccl.cu). tt_cuda_select_device: before the backend
 * is created, the device this process uses (its local rank modulo the devices it sees), which
 * tt_cuda_backend_create then takes. The NCCL calls fail with the reason in last_error: where
 * the build has no NCCL, they all do. tt_cuda_nccl_id (rank 0) writes the unique id that
 * tt_cuda_nccl_init takes on every rank; bytes_taken: the device memory NCCL took (measured).
 * broadcast is in place, fp32, on the compute stream; several go between tt_cuda_nccl_group(b, 0)
 * and tt_cuda_nccl_group(b, 1). allreduce_async sums in place on the all-reduce stream, after the
 * work queued on the compute stream so far (an event), so it overlaps what is queued after it;
 * join makes the compute stream's next work wait for every all-reduce started. The backend
 * destroys the communicator and the stream. */
#define TT_CUDA_NCCL_ID_BYTES 128
int tt_cuda_select_device(int local_rank, char *errbuf, size_t errsize);
int tt_cuda_nccl_id(tt_backend *b, void *id);
int tt_cuda_nccl_init(tt_backend *b, const void *id, int nranks, int rank, size_t *bytes_taken);
int tt_cuda_nccl_group(tt_backend *b, int end);
int tt_cuda_nccl_allreduce_async(tt_backend *b, float *buf, size_t count);
int tt_cuda_nccl_join(tt_backend *b);
int tt_cuda_nccl_broadcast(tt_backend *b, float *buf, size_t count, int root);
void tt_cuda_nccl_destroy(tt_backend *b);

/* The functions above as one table, the only symbol libtinytrain_cuda.so exports: the command
 * line and libtinytrain load the CUDA backend with dlopen when a GPU is used (core/runtime/
 * cuda_load.c), so that a command that uses none (--help, plan --device cpu, training on a
 * machine without a GPU) never maps cudart, cuBLAS, cuDNN or NCCL. The amalgamation and the
 * emulation link the backend directly. TT_CUDA_API_VERSION: bumped whenever the table changes. */
#define TT_CUDA_API_VERSION 6
typedef struct tt_cuda_api {
  int version, size;
  tt_backend *(*backend_create)(size_t *, const tt_backend_knobs *, char *, size_t);
  int (*mem_free)(tt_backend *, size_t *, size_t *);
  int (*device_count)(void);
  const char *(*info)(void);
  size_t (*alloc_count)(tt_backend *);
  int (*mem_used)(tt_backend *, size_t *, size_t *);
  int (*select_device)(int, char *, size_t);
  int (*nccl_id)(tt_backend *, void *);
  int (*nccl_init)(tt_backend *, const void *, int, int, size_t *);
  int (*nccl_group)(tt_backend *, int);
  int (*nccl_allreduce_async)(tt_backend *, float *, size_t);
  int (*nccl_join)(tt_backend *);
  int (*nccl_broadcast)(tt_backend *, float *, size_t, int);
  void (*nccl_destroy)(tt_backend *);
  int (*probe)(char *, size_t);
  size_t (*library_margin)(tt_backend *);
  int (*compute_capability)(tt_backend *);
  int (*set_tf32)(tt_backend *, int);
  size_t (*set_conv_workspace_cap)(tt_backend *, size_t);
  size_t (*set_bn_resident)(tt_backend *, size_t);
} tt_cuda_api;
const tt_cuda_api *tt_cuda_api_get(void);

#ifdef __cplusplus
}
#endif
#endif
