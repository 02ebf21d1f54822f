/* kernels/cuda/cuda_backend.cu — the CUDA backend's table, device, memory and streams.
 *
 * One compute stream runs every kernel, cuDNN and cuBLAS call; every copy between host and
 * device runs on the copy stream, ordered by two events: `ev`, recorded on the compute stream
 * and waited for by the copy stream (a copy starts after the work queued before it, which may
 * still use its destination or produce its source), and `ev_copy`, recorded after the copy and
 * waited for by the compute stream (the work queued after it sees the bytes). The batch goes
 * through upload_async from page-locked staging (host_alloc): the host does not wait, and the
 * caller's event says when the staging buffer may be refilled. upload and download wait for
 * their copy before returning, so their host buffers are free (or filled) when they return;
 * they serve setup, checkpoints and tests. The arena is one cudaMalloc per arena_alloc
 * (execution calls it once); alloc_count counts them and the cudaHostAlloc calls.
 *
 * The reserve (context + cuBLAS + cuDNN) is measured with NVML, loaded with dlopen so that a
 * machine without the driver can still run the binary (and the CPU backend).
 */
#include <unistd.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "tt_cuda.h"

int tt_cuda_fail(tt_backend *b, const char *fmt, ...) {
  if (b && b->impl) {
    tt_cuda_state *st = tt_cuda_st(b);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->err, sizeof st->err, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* ------------------------------------- NVML ------------------------------------------- */

typedef struct cuda_nvml_memory {
  unsigned long long total, free, used;
} cuda_nvml_memory;
typedef int (*cuda_nvml_init_fn)(void);
typedef int (*cuda_nvml_by_bus_fn)(const char *, void **);
typedef int (*cuda_nvml_getmem_fn)(void *, cuda_nvml_memory *);

/* NVML through dlopen; the host emulation (tests/cuda_emu) supplies its own, which records
 * whether its baseline was read before a CUDA context existed. */
#ifdef TT_CUDA_EMULATION
#define CUDA_NVML_OPEN() tt_emu_nvml_open()
#define CUDA_NVML_SYM(lib, name) tt_emu_nvml_sym((lib), (name))
#define CUDA_NVML_CLOSE(lib) ((void)(lib))
#else
#define CUDA_NVML_OPEN() dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)
#define CUDA_NVML_SYM(lib, name) dlsym((lib), (name))
#define CUDA_NVML_CLOSE(lib) dlclose(lib)
#endif

/* Opens NVML and finds the device with the given PCI bus id; 0 on success. Every failure after
 * nvmlInit shuts NVML down again. */
static int cuda_nvml_open(tt_cuda_state *st, const char *bus_id) {
  void *lib = CUDA_NVML_OPEN();
  cuda_nvml_init_fn init;
  cuda_nvml_by_bus_fn by_bus;
  int (*shutdown)(void);
  void *dev = NULL;
  if (!lib) return -1;
  init = (cuda_nvml_init_fn)CUDA_NVML_SYM(lib, "nvmlInit_v2");
  by_bus = (cuda_nvml_by_bus_fn)CUDA_NVML_SYM(lib, "nvmlDeviceGetHandleByPciBusId_v2");
  shutdown = (int (*)(void))CUDA_NVML_SYM(lib, "nvmlShutdown");
  st->nvml_getmem = CUDA_NVML_SYM(lib, "nvmlDeviceGetMemoryInfo");
  if (!init || !by_bus || !st->nvml_getmem || init() != 0) {
    CUDA_NVML_CLOSE(lib);
    st->nvml_getmem = NULL;
    return -1;
  }
  if (by_bus(bus_id, &dev) != 0 || !dev) {
    if (shutdown) shutdown(); /* nvmlInit succeeded: balance it */
    CUDA_NVML_CLOSE(lib);
    st->nvml_getmem = NULL;
    return -1;
  }
  st->nvml_lib = lib;
  st->nvml_dev = dev;
  return 0;
}

static int cuda_nvml_used(tt_cuda_state *st, size_t *used, size_t *total) {
  cuda_nvml_memory m;
  if (!st->nvml_lib || ((cuda_nvml_getmem_fn)st->nvml_getmem)(st->nvml_dev, &m) != 0) return -1;
  *used = (size_t)m.used;
  if (total) *total = (size_t)m.total;
  return 0;
}

static void cuda_nvml_close(tt_cuda_state *st) {
  if (st->nvml_lib) {
    int (*shutdown)(void) = (int (*)(void))CUDA_NVML_SYM(st->nvml_lib, "nvmlShutdown");
    if (shutdown) shutdown();
    CUDA_NVML_CLOSE(st->nvml_lib);
  }
  st->nvml_lib = st->nvml_dev = st->nvml_getmem = NULL;
}

/* The driver's own version ("580.65.06") through NVML, or "" where NVML is missing. */
static void cuda_nvml_driver(char *buf, size_t n) {
  void *lib = CUDA_NVML_OPEN();
  buf[0] = 0;
  if (!lib) return;
  int (*init)(void) = (int (*)(void))CUDA_NVML_SYM(lib, "nvmlInit_v2");
  int (*ver)(char *, unsigned) = (int (*)(char *, unsigned))CUDA_NVML_SYM(lib, "nvmlSystemGetDriverVersion");
  int (*shutdown)(void) = (int (*)(void))CUDA_NVML_SYM(lib, "nvmlShutdown");
  if (init && ver && init() == 0) {
    if (ver(buf, (unsigned)n) != 0) buf[0] = 0;
    if (shutdown) shutdown();
  }
  CUDA_NVML_CLOSE(lib);
}

/* --------------------------------- table entries -------------------------------------- */

static void cuda_be_destroy(tt_backend *b) {
  tt_cuda_state *st;
  if (!b) return;
  st = tt_cuda_st(b);
  if (st) {
    /* Teardown: errors cannot be reported any more, but are still looked at. */
    if (st->compute && cudaStreamSynchronize(st->compute) != cudaSuccess) (void)cudaGetLastError();
    tt_cuda_nccl_destroy(b);
    tt_cuda_conv_cache_destroy(b);
    if (st->ss_part && cudaFree(st->ss_part) != cudaSuccess) (void)cudaGetLastError();
    if (st->dnn && cudnnDestroy(st->dnn) != CUDNN_STATUS_SUCCESS) fprintf(stderr, "cuda: cudnnDestroy failed\n");
    if (st->blas && cublasDestroy(st->blas) != CUBLAS_STATUS_SUCCESS) fprintf(stderr, "cuda: cublasDestroy failed\n");
    if (st->ev && cudaEventDestroy(st->ev) != cudaSuccess) (void)cudaGetLastError();
    if (st->ev_copy && cudaEventDestroy(st->ev_copy) != cudaSuccess) (void)cudaGetLastError();
    if (st->copy && cudaStreamDestroy(st->copy) != cudaSuccess) (void)cudaGetLastError();
    if (st->compute && cudaStreamDestroy(st->compute) != cudaSuccess) (void)cudaGetLastError();
    cuda_nvml_close(st);
    free(st);
  }
  free(b);
}

static const char *cuda_be_last_error(tt_backend *b) {
  if (!b || !b->impl) return "no backend";
  return tt_cuda_st(b)->err;
}

static void *cuda_be_arena_alloc(tt_backend *b, size_t bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  void *p = NULL;
  cudaError_t e;
  size_t sz = (bytes + 255u) & ~(size_t)255u;
  if (sz == 0) sz = 256;
  st->alloc_count++;
  e = cudaMalloc(&p, sz);
  if (e != cudaSuccess) {
    size_t fr = 0, tot = 0;
    (void)cudaGetLastError();
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) (void)cudaGetLastError();
    tt_cuda_fail(b, "cudaMalloc(%zu bytes) failed: %s (device has %.1f MiB free of %.1f MiB); lower --vram or the batch",
                 sz, cudaGetErrorString(e), fr / 1048576.0, tot / 1048576.0);
    return NULL;
  }
  st->arena_bytes += sz;
  return p;
}

static void cuda_be_arena_free(tt_backend *b, void *p) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (!p) return;
  /* both streams: a copy on the copy stream may still target the arena */
  if (cudaStreamSynchronize(st->compute) != cudaSuccess) (void)cudaGetLastError();
  if (cudaStreamSynchronize(st->copy) != cudaSuccess) (void)cudaGetLastError();
  if (cudaFree(p) != cudaSuccess) {
    tt_cuda_fail(b, "cudaFree failed: %s", cudaGetErrorString(cudaGetLastError()));
    return;
  }
  st->arena_bytes = 0;
}

/* One copy on the copy stream, ordered after the compute work queued so far and before the
 * compute work queued next (cudaStreamWaitEvent waits for the event's latest record at the time
 * of the call, so both events can be recorded again by the next copy); `done`, when given, is
 * recorded after it. */
static int cuda_be_copy(tt_backend *b, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                        cudaEvent_t done) {
  tt_cuda_state *st = tt_cuda_st(b);
  CUDA_CHECK(b, cudaEventRecord(st->ev, st->compute));
  CUDA_CHECK(b, cudaStreamWaitEvent(st->copy, st->ev, 0));
  CUDA_CHECK(b, cudaMemcpyAsync(dst, src, bytes, kind, st->copy));
  CUDA_CHECK(b, cudaEventRecord(st->ev_copy, st->copy));
  CUDA_CHECK(b, cudaStreamWaitEvent(st->compute, st->ev_copy, 0));
  if (done) CUDA_CHECK(b, cudaEventRecord(done, st->copy));
  return 0;
}

/* upload and download (op names which): cuda_be_copy, then waits for it, so the caller may
 * reuse or read its host buffer when this returns. */
static int cuda_be_copy_sync(tt_backend *b, const char *op, void *dst, const void *src, size_t bytes,
                             cudaMemcpyKind kind) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (!bytes) return 0;
  if (!dst || !src) return tt_cuda_fail(b, "%s: NULL pointer for %zu bytes", op, bytes);
  if (cuda_be_copy(b, dst, src, bytes, kind, NULL)) return -1;
  CUDA_CHECK(b, cudaStreamSynchronize(st->copy));
  return 0;
}

static int cuda_be_upload(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes) {
  return cuda_be_copy_sync(b, "upload", dst_dev, src_host, bytes, cudaMemcpyHostToDevice);
}

static int cuda_be_download(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes) {
  return cuda_be_copy_sync(b, "download", dst_host, src_dev, bytes, cudaMemcpyDeviceToHost);
}

static void *cuda_be_host_alloc(tt_backend *b, size_t bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  void *p = NULL;
  cudaError_t e;
  st->alloc_count++;
  e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    tt_cuda_fail(b, "cudaHostAlloc(%zu bytes) failed: %s", bytes, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

static void cuda_be_host_free(tt_backend *b, void *p) {
  if (p && cudaFreeHost(p) != cudaSuccess)
    tt_cuda_fail(b, "cudaFreeHost failed: %s", cudaGetErrorString(cudaGetLastError()));
}

static void *cuda_be_event_create(tt_backend *b) {
  cudaEvent_t e = NULL;
  /* the host waits on these (event_sync): blocking, not spinning a core the data loader wants */
  cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync);
  if (r != cudaSuccess) {
    (void)cudaGetLastError();
    tt_cuda_fail(b, "cudaEventCreateWithFlags failed: %s", cudaGetErrorString(r));
    return NULL;
  }
  return (void *)e;
}

static void cuda_be_event_destroy(tt_backend *b, void *ev) {
  if (ev && cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess)
    tt_cuda_fail(b, "cudaEventDestroy failed: %s", cudaGetErrorString(cudaGetLastError()));
}

/* cudaEventSynchronize returns at once for an event never recorded (CUDA Runtime API). */
static int cuda_be_event_sync(tt_backend *b, void *ev) {
  if (!ev) return tt_cuda_fail(b, "event_sync: NULL event");
  CUDA_CHECK(b, cudaEventSynchronize((cudaEvent_t)ev));
  return 0;
}

static int cuda_be_upload_async(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes, void *done) {
  if (!bytes) return 0;
  if (!dst_dev || !src_host) return tt_cuda_fail(b, "upload_async: NULL pointer for %zu bytes", bytes);
  return cuda_be_copy(b, dst_dev, src_host, bytes, cudaMemcpyHostToDevice, (cudaEvent_t)done);
}

static int cuda_be_download_async(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes, void *done) {
  if (!bytes) return 0;
  if (!dst_host || !src_dev) return tt_cuda_fail(b, "download_async: NULL pointer for %zu bytes", bytes);
  return cuda_be_copy(b, dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, (cudaEvent_t)done);
}

/* While recording (cuda_graph.cu) a plain record too, which the runtime keeps inside the capture
 * (no node): it stands for the compute work captured so far, and a copy-stream wait on it forks the
 * copy stream into the capture (the saved activations' copies: download_after, upload_after), joined
 * back by the compute stream's wait on the copy's event (event_wait, upload_after's ev_copy). Such
 * an event orders nothing outside the recording: waited on after graph_end, or by work outside it,
 * it orders nothing or is refused (the executor records the batch's event between launches). */
static int cuda_be_event_record(tt_backend *b, void *ev) {
  if (!ev) return tt_cuda_fail(b, "event_record: NULL event");
  CUDA_CHECK(b, cudaEventRecord((cudaEvent_t)ev, tt_cuda_st(b)->compute));
  return 0;
}

/* TINYTRAIN_PROFILE's events (backend.h timer_*): timed ones, so no cudaEventDisableTiming;
 * blocking, as event_create's, since the host waits on them at the step's end. */
static void *cuda_be_timer_create(tt_backend *b) {
  cudaEvent_t e = NULL;
  cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventBlockingSync);
  if (r != cudaSuccess) {
    (void)cudaGetLastError();
    tt_cuda_fail(b, "cudaEventCreateWithFlags (a TINYTRAIN_PROFILE timer) failed: %s", cudaGetErrorString(r));
    return NULL;
  }
  return (void *)e;
}

static int cuda_be_timer_elapsed(tt_backend *b, void *start, void *end, float *ms) {
  if (!start || !end || !ms) return tt_cuda_fail(b, "timer_elapsed: NULL event or result");
  CUDA_CHECK(b, cudaEventSynchronize((cudaEvent_t)end));
  CUDA_CHECK(b, cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
  return 0;
}

/* TINYTRAIN_CUDA_PROFILE_STEP's range (backend.h profiler_range): cudaProfilerStart/Stop, which
 * `ncu --profile-from-start off` and `nsys --capture-range=cudaProfilerApi` wait for; outside a
 * profiler they do nothing. */
static int cuda_be_profiler_range(tt_backend *b, int on) {
  if (on) CUDA_CHECK(b, cudaProfilerStart());
  else CUDA_CHECK(b, cudaProfilerStop());
  return 0;
}

/* The copy waits for `after` only (cudaStreamWaitEvent on an event never recorded is a no-op,
 * CUDA Runtime API), not for the compute work queued so far as cuda_be_copy's does: the copy
 * stream runs it while the compute stream still works on the step before; the compute work
 * queued next waits for it (ev_copy), and `done` follows it. */
static int cuda_be_upload_after(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes, void *after, void *done) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (!bytes) return 0;
  if (!dst_dev || !src_host) return tt_cuda_fail(b, "upload_after: NULL pointer for %zu bytes", bytes);
  if (after) CUDA_CHECK(b, cudaStreamWaitEvent(st->copy, (cudaEvent_t)after, 0));
  CUDA_CHECK(b, cudaMemcpyAsync(dst_dev, src_host, bytes, cudaMemcpyHostToDevice, st->copy));
  CUDA_CHECK(b, cudaEventRecord(st->ev_copy, st->copy));
  CUDA_CHECK(b, cudaStreamWaitEvent(st->compute, st->ev_copy, 0));
  if (done) CUDA_CHECK(b, cudaEventRecord((cudaEvent_t)done, st->copy));
  return 0;
}

/* The activation's copy out (backend.h download_after): the copy stream waits for `after` only and
 * the compute stream not at all; `done` follows the copy, and event_wait makes compute wait for it
 * where the source's storage is reused. */
static int cuda_be_download_after(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes, void *after,
                                  void *done) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (!bytes) return 0;
  if (!dst_host || !src_dev) return tt_cuda_fail(b, "download_after: NULL pointer for %zu bytes", bytes);
  if (after) CUDA_CHECK(b, cudaStreamWaitEvent(st->copy, (cudaEvent_t)after, 0));
  CUDA_CHECK(b, cudaMemcpyAsync(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, st->copy));
  if (done) CUDA_CHECK(b, cudaEventRecord((cudaEvent_t)done, st->copy));
  return 0;
}

static int cuda_be_event_wait(tt_backend *b, void *ev) {
  if (!ev) return tt_cuda_fail(b, "event_wait: NULL event");
  CUDA_CHECK(b, cudaStreamWaitEvent(tt_cuda_st(b)->compute, (cudaEvent_t)ev, 0));
  return 0;
}

static int cuda_be_zero(tt_backend *b, void *p, size_t bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (!bytes) return 0;
  if (!p) return tt_cuda_fail(b, "zero: NULL pointer for %zu bytes", bytes);
  CUDA_CHECK(b, cudaMemsetAsync(p, 0, bytes, st->compute));
  return 0;
}

static int cuda_be_sync(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  CUDA_CHECK(b, cudaStreamSynchronize(st->compute));
  CUDA_CHECK(b, cudaStreamSynchronize(st->copy));
  if (st->nccl_stream) CUDA_CHECK(b, cudaStreamSynchronize(st->nccl_stream)); /* a gradient all-reduce in flight */
  return 0;
}

/* ------------------------------------ public ------------------------------------------ */

/* The device a multi-process launch chose (tt_cuda_select_device), -1: the calling thread's.
 * Recorded, not set: cudaSetDevice creates the device's primary context (CUDA 12 and newer),
 * which must happen after the reserve's NVML baseline (cuda_be_setup). */
static int cuda_next_device = -1;
extern "C" void tt_cuda_set_next_device(int device) { cuda_next_device = device; }

/* "driver 580.65.06 (CUDA 13.0)", "driver 550.54 (CUDA 12.4)" or "no driver": what the installed
 * driver is and the newest CUDA it runs. */
static const char *cuda_driver_text(void) {
  static char buf[96];
  char nv[64];
  int dv = 0;
  if (cudaDriverGetVersion(&dv) != cudaSuccess) (void)cudaGetLastError(), dv = 0;
  cuda_nvml_driver(nv, sizeof nv);
  if (!dv && !nv[0]) return "no driver";
  snprintf(buf, sizeof buf, "driver %s (CUDA %d.%d)", nv[0] ? nv : "?", dv / 1000, (dv % 1000) / 10);
  return buf;
}

extern "C" int tt_cuda_probe(char *why, size_t whysize) {
  int n = 0, rt = 0, dv = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (why && whysize) why[0] = 0;
  if (e == cudaSuccess) return n;
  (void)cudaGetLastError();
  if (e == cudaErrorInsufficientDriver || e == cudaErrorCompatNotSupportedOnDevice) {
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) (void)cudaGetLastError();
    if (cudaDriverGetVersion(&dv) != cudaSuccess) (void)cudaGetLastError();
    /* no libcuda at all reads as an insufficient driver too, with driver version 0: no GPU */
    if (dv > 0 && why && whysize)
      snprintf(why, whysize,
               "the NVIDIA %s is too old for this tinytrain's CUDA runtime %d.%d (%s): the GPU is not used; "
               "CUDA %d needs driver %s or newer (docs/gpu.md)",
               cuda_driver_text(), rt / 1000, (rt % 1000) / 10, cudaGetErrorString(e), rt / 1000,
               rt / 1000 >= 13 ? "580" : rt / 1000 == 12 ? "525" : "?");
  }
  /* else: no driver / no device: not an error for `auto` */
  return 0;
}

extern "C" int tt_cuda_device_count(void) { return tt_cuda_probe(NULL, 0); }

extern "C" const char *tt_cuda_info(void) {
  static char buf[256];
  int rt = 0;
  size_t dnn = cudnnGetVersion();
  int bmaj = 0, bmin = 0, bpat = 0;
  if (cudaRuntimeGetVersion(&rt) != cudaSuccess) (void)cudaGetLastError();
  if (cublasGetProperty(MAJOR_VERSION, &bmaj) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(MINOR_VERSION, &bmin) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(PATCH_LEVEL, &bpat) != CUBLAS_STATUS_SUCCESS)
    bmaj = bmin = bpat = 0;
  /* cuDNN 9 encodes major*10000 + minor*100 + patch */
  snprintf(buf, sizeof buf, "CUDA runtime %d.%d, %s, cuDNN %zu.%zu.%zu, cuBLAS %d.%d.%d", rt / 1000, (rt % 1000) / 10,
           cuda_driver_text(), dnn / 10000, (dnn % 10000) / 100, dnn % 100, bmaj, bmin, bpat);
  return buf;
}

extern "C" size_t tt_cuda_library_margin(tt_backend *b) {
  return tt_cuda_of(b) ? tt_cuda_of(b)->lib_margin : TT_CUDA_LIBRARY_MARGIN_BYTES;
}

extern "C" int tt_cuda_compute_capability(tt_backend *b) {
  return tt_cuda_of(b) ? tt_cuda_of(b)->cc : 0;
}

/* TF32 (tt_cuda.h): cuBLAS through the handle's math mode (CUBLAS_TF32_TENSOR_OP_MATH lets
 * cublasGemmEx with CUBLAS_COMPUTE_32F round fp32 operands to TF32 on tensor cores; fp16 and bf16
 * GEMMs are unaffected), cuDNN through the math type each fp32 convolution is set to
 * (cuda_conv.cu: CUDNN_DEFAULT_MATH allows TF32 from cuDNN 8 on, CUDNN_FMA_MATH forbids it).
 * Below compute capability 8.0 both stay in true fp32: there are no TF32 tensor cores. */
extern "C" int tt_cuda_set_tf32(tt_backend *b, int on) {
  tt_cuda_state *st = tt_cuda_of(b);
  if (!st) return -1;
  st->tf32 = on && st->cc >= 80;
  CUBLAS_CHECK(b, cublasSetMathMode(st->blas, st->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  tt_cuda_conv_cache_forget(b); /* the algorithms were chosen for the other math type */
  return st->tf32;
}

extern "C" size_t tt_cuda_set_conv_workspace_cap(tt_backend *b, size_t bytes) {
  tt_cuda_state *st = tt_cuda_of(b);
  size_t old;
  if (!st) return 0;
  old = st->ws_cap;
  st->ws_cap = bytes ? bytes : st->ws_cap_default;
  if (st->ws_cap != old) tt_cuda_conv_cache_forget(b); /* the choices were made under the old cap */
  return old;
}

extern "C" size_t tt_cuda_alloc_count(tt_backend *b) {
  return tt_cuda_of(b) ? tt_cuda_of(b)->alloc_count : 0;
}

extern "C" int tt_cuda_mem_used(tt_backend *b, size_t *used, size_t *total) {
  tt_cuda_state *st = tt_cuda_st(b);
  size_t fr = 0, tot = 0;
  if (cuda_nvml_used(st, used, total) == 0) return 0;
  CUDA_CHECK(b, cudaMemGetInfo(&fr, &tot));
  *used = tot - fr;
  if (total) *total = tot;
  return 0;
}

#ifndef TT_CUDA_ARCHS
#define TT_CUDA_ARCHS "unknown" /* configure.py passes the sm_ list it built */
#endif

/* Asks the runtime about every kernel of the backend (cudaFuncGetAttributes): a card this build
 * has no image for fails here, in a second, naming the card and the --cuda-arch to build; a
 * kernel whose launch block does not fit the card's registers fails here rather than at the
 * first step. Under lazy loading (the default since CUDA 12.2; CUDA C++ Programming Guide,
 * "Lazy Loading") the runtime loads a kernel when it is first referenced, so this also puts
 * every kernel of ours on the device before the reserve is measured. */
static int cuda_be_check_kernels(tt_backend *b, const cudaDeviceProp *prop) {
  tt_cuda_state *st = tt_cuda_st(b);
  /* one table per file (cuda_internal.h) */
  const tt_cuda_kernel *tabs[] = {tt_cuda_elementwise_kernels, tt_cuda_bn_kernels, tt_cuda_bn_chip_kernels,
                                  tt_cuda_bn_rows_kernels, tt_cuda_pool_kernels, tt_cuda_loss_optim_kernels,
                                  tt_cuda_layernorm_kernels, tt_cuda_attention_kernels, tt_cuda_tokens_kernels,
                                  tt_cuda_pool_nhwc_kernels};
  const int counts[] = {tt_cuda_elementwise_nkernels, tt_cuda_bn_nkernels, tt_cuda_bn_chip_nkernels,
                        tt_cuda_bn_rows_nkernels, tt_cuda_pool_nkernels, tt_cuda_loss_optim_nkernels,
                        tt_cuda_layernorm_nkernels, tt_cuda_attention_nkernels, tt_cuda_tokens_nkernels,
                        tt_cuda_pool_nhwc_nkernels};
  int t, i, cc = prop->major * 10 + prop->minor;
  for (t = 0; t < (int)(sizeof tabs / sizeof tabs[0]); t++)
    for (i = 0; i < counts[t]; i++) {
      const tt_cuda_kernel *k = &tabs[t][i];
      cudaFuncAttributes a;
      cudaError_t e = cudaFuncGetAttributes(&a, k->fn);
      if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
        (void)cudaGetLastError();
        return tt_cuda_fail(b,
                            "CUDA device %d is a %s (compute capability %d.%d) and this tinytrain has no kernel image "
                            "for it (built for sm_%s, with PTX of the newest only); rebuild with "
                            "./configure.py --cuda-arch %d && ninja",
                            st->device, prop->name, prop->major, prop->minor, TT_CUDA_ARCHS, cc);
      }
      if (e == cudaErrorUnsupportedPtxVersion || e == cudaErrorInvalidPtx || e == cudaErrorJitCompilerNotFound) {
        (void)cudaGetLastError();
        return tt_cuda_fail(b,
                            "CUDA device %d is a %s (compute capability %d.%d): this build has no SASS for it and the "
                            "driver cannot compile its PTX (%s); update the driver, or rebuild with "
                            "./configure.py --cuda-arch %d && ninja",
                            st->device, prop->name, prop->major, prop->minor, cudaGetErrorString(e), cc);
      }
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tt_cuda_fail(b, "cudaFuncGetAttributes(%s) failed: %s", k->name, cudaGetErrorString(e));
      }
      if (a.localSizeBytes > st->local_max) st->local_max = a.localSizeBytes; /* 0: ninja cuda-check refuses local memory */
      if (a.maxThreadsPerBlock < k->threads)
        return tt_cuda_fail(b,
                            "kernel %s is launched with %d threads but takes at most %d on %s (%d registers per "
                            "thread); this build is broken: run ninja cuda-check",
                            k->name, k->threads, a.maxThreadsPerBlock, prop->name, a.numRegs);
    }
  return 0;
}

extern "C" int tt_cuda_mem_free(tt_backend *b, size_t *free_bytes, size_t *total_bytes) {
  size_t fr = 0, tot = 0;
  CUDA_CHECK(b, cudaMemGetInfo(&fr, &tot));
  *free_bytes = fr;
  if (total_bytes) *total_bytes = tot;
  return 0;
}

/* The per-thread stack limit (TINYTRAIN_CUDA_STACK, docs/gpu.md#the-stack-limit): the driver's
 * default (1 KiB a thread) sizes the context's local memory for every thread the device holds at
 * once (264 MiB on an H100 SXM: 132 x 2048 x 1 KiB), and our kernels take none (ninja cuda-check
 * refuses local memory and stack frames; st->local_max is what the runtime reports). Set before
 * cuBLAS and cuDNN load, to what our kernels need (TT_CUDA_STACK_MIN_BYTES at least): a library
 * kernel that needs more grows it at its launch (the driver raises the limit as a launch needs,
 * CUDA Runtime API, cudaDeviceSetLimit), which the warm-up measures against the library margin.
 * Whether the context gives the memory back only a card shows (tests/gpu/memprobe.py). */
static int cuda_be_stack_limit(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  if (st->knobs.cuda_stack) {
    size_t want = (st->local_max + 15) & ~(size_t)15;
    if (want < TT_CUDA_STACK_MIN_BYTES) want = TT_CUDA_STACK_MIN_BYTES;
    cudaError_t e = cudaDeviceSetLimit(cudaLimitStackSize, want);
    if (e != cudaSuccess)
      return tt_cuda_fail(b, "cudaDeviceSetLimit(cudaLimitStackSize, %zu) failed: %s; TINYTRAIN_CUDA_STACK=0 leaves the "
                          "driver's default", want, cudaGetErrorString(e));
  }
  CUDA_CHECK(b, cudaDeviceGetLimit(&st->stack_limit, cudaLimitStackSize));
  return 0;
}

/* Creation steps that record into b (so CUDA_CHECK can be used); the caller copies the
 * message into errbuf on failure. */
static int cuda_be_setup(tt_backend *b, size_t *reserve_bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  char bus[64];
  size_t before = 0, after = 0, fr = 0, tot = 0;
  int have_nvml;
  cudaDeviceProp prop;
  /* The baseline before anything creates this device's context (cudaSetDevice does, and
   * cudaFree(0) below): the context is part of the reserve. Neither cudaGetDeviceCount nor
   * cudaDeviceGetPCIBusId creates one. */
  CUDA_CHECK(b, cudaDeviceGetPCIBusId(bus, (int)sizeof bus, st->device));
  have_nvml = cuda_nvml_open(st, bus) == 0 && cuda_nvml_used(st, &before, NULL) == 0;
  CUDA_CHECK(b, cudaSetDevice(st->device));
  /* Host waits (stream and device synchronisation) block on an OS primitive instead of spinning
   * a CPU core, which the data loader's threads want; set before or after the primary context
   * exists (CUDA 12 and newer overwrite the previous flags). */
  CUDA_CHECK(b, cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
  CUDA_CHECK(b, cudaFree(0)); /* creates the primary context */
  CUDA_CHECK(b, cudaGetDeviceProperties(&prop, st->device));
  /* CUDA 13 builds for compute capability 7.5 and newer only (nvcc --list-gpu-arch) */
  if (prop.major * 10 + prop.minor < 75)
    return tt_cuda_fail(b, "CUDA device %d (%s) has compute capability %d.%d; tinytrain needs 7.5 or newer",
                        st->device, prop.name, prop.major, prop.minor);
  st->cc = prop.major * 10 + prop.minor;
  if (cuda_be_check_kernels(b, &prop)) return -1;
  if (cuda_be_stack_limit(b)) return -1;
  if (tt_cuda_norm_setup(b, &prop)) return -1;
  CUDA_CHECK(b, cudaStreamCreateWithFlags(&st->compute, cudaStreamNonBlocking));
  CUDA_CHECK(b, cudaStreamCreateWithFlags(&st->copy, cudaStreamNonBlocking));
  CUDA_CHECK(b, cudaEventCreateWithFlags(&st->ev, cudaEventDisableTiming));
  CUDA_CHECK(b, cudaEventCreateWithFlags(&st->ev_copy, cudaEventDisableTiming));
  CUBLAS_CHECK(b, cublasCreate(&st->blas));
  CUBLAS_CHECK(b, cublasSetStream(st->blas, st->compute));
  /* No cuBLAS-owned workspace: every GEMM gets its planned buffer (cuda_linear.cu). */
  CUBLAS_CHECK(b, cublasSetWorkspace(st->blas, NULL, 0));
  /* fp32 GEMMs in true fp32 (no TF32) until tt_cuda_set_tf32 says otherwise; fp16 and bf16
   * GEMMs use tensor cores through GemmEx either way. */
  st->tf32 = 0;
  CUBLAS_CHECK(b, cublasSetMathMode(st->blas, CUBLAS_DEFAULT_MATH));
  CUBLAS_CHECK(b, cublasSetPointerMode(st->blas, CUBLAS_POINTER_MODE_HOST));
  CUDNN_CHECK(b, cudnnCreate(&st->dnn));
  CUDNN_CHECK(b, cudnnSetStream(st->dnn, st->compute));
  if (tt_cuda_conv_cache_create(b)) return -1;
  /* sum_squares' partial sums (8 KiB): part of the reserve, never of the arena */
  /* two more doubles: the recorded loss's gradient scale and the recorded dropout base (cuda_graph.cu) */
  CUDA_CHECK(b, cudaMalloc((void **)&st->ss_part, (TT_CUDA_SS_BLOCKS + 2) * sizeof(double)));
  st->graph_scale = (float *)(st->ss_part + TT_CUDA_SS_BLOCKS);
  st->graph_seed = (uint64_t *)(st->ss_part + TT_CUDA_SS_BLOCKS + 1);
  CUDA_CHECK(b, cudaDeviceSynchronize());
  CUDA_CHECK(b, cudaMemGetInfo(&fr, &tot));
  st->total_mem = tot;
  /* cuDNN workspace cap until the plan says how much it can give (tt_cuda_set_conv_workspace_cap):
   * a convolution's algorithm is chosen among those needing at most this much (64 MiB, or 1/64
   * of the card on small cards). */
  st->ws_cap = tot / 64;
  if (st->ws_cap > TT_CUDA_CONV_WS_DEFAULT_CAP) st->ws_cap = TT_CUDA_CONV_WS_DEFAULT_CAP;
  st->ws_cap_default = st->ws_cap;
  st->deterministic = st->knobs.cuda_deterministic != 0; /* deterministic cuDNN algorithms only (docs/gpu.md) */
  st->blas_ws = (size_t)(prop.major >= 9 ? 32 : 4) << 20; /* cuda_linear.cu says why */
  /* What cuDNN and cuBLAS may still load after setup (tt_cuda.h): their modules, and the local
   * memory the context grows to for a kernel needing more per thread, which the driver sizes for
   * every thread the device can hold at once (multiprocessors x threads per multiprocessor). */
  st->lib_margin = TT_CUDA_LIBRARY_CODE_BYTES +
                   (size_t)prop.multiProcessorCount * (size_t)prop.maxThreadsPerMultiProcessor * TT_CUDA_LOCAL_BYTES_PER_THREAD;
  if (st->lib_margin < TT_CUDA_LIBRARY_MARGIN_BYTES) st->lib_margin = TT_CUDA_LIBRARY_MARGIN_BYTES;
  if (have_nvml && cuda_nvml_used(st, &after, NULL) == 0 && after >= before)
    *reserve_bytes = after - before;
  else
    *reserve_bytes = tot - fr; /* everything in use on the device: conservative */
  return 0;
}

/* Formats a creation failure into errbuf (when given). */
static void cuda_be_create_fail(char *errbuf, size_t errsize, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void cuda_be_create_fail(char *errbuf, size_t errsize, const char *fmt, ...) {
  va_list ap;
  if (!errbuf || !errsize) return;
  va_start(ap, fmt);
  vsnprintf(errbuf, errsize, fmt, ap);
  va_end(ap);
}

/* The generic workspace query: convolution and linear as their own queries (cuDNN's
 * algorithm workspace, the fp16 staging of GEMMs); batch norm's, layer norm's backward and
 * attention's backward partials (cuda_bn.cu, cuda_layernorm.cu, cuda_attention.cu); nothing else needs one. */
static size_t cuda_be_op_workspace(tt_backend *b, const tt_op_desc *op) {
  const tt_linear_desc *l = &op->u.linear;
  switch (op->kind) {
    case TT_OP_CONV_FWD:
    case TT_OP_CONV_BWD_DATA:
    case TT_OP_CONV_BWD_FILTER: return tt_cuda_conv_op_workspace(b, op);
    case TT_OP_LINEAR_FWD: return tt_cuda_linear_workspace(b, l->n, l->in, l->out, op->dt, TT_WS_FWD);
    case TT_OP_LINEAR_BWD_DATA: return tt_cuda_linear_workspace(b, l->n, l->in, l->out, op->dt, TT_WS_BWD_DATA);
    case TT_OP_LINEAR_BWD_FILTER: return tt_cuda_linear_workspace(b, l->n, l->in, l->out, op->dt, TT_WS_BWD_FILTER);
    case TT_OP_BN_FWD_TRAIN:
    case TT_OP_BN_BWD: return tt_cuda_bn_workspace(op->u.bn.n, op->u.bn.c, op->u.bn.hw, op->dt);
    case TT_OP_LN_FWD:
    case TT_OP_LN_BWD: return tt_cuda_ln_workspace(b, op->u.ln.rows, op->u.ln.f, op->dt, op->kind == TT_OP_LN_BWD);
    case TT_OP_ATTN_FWD:
    case TT_OP_ATTN_BWD: return tt_cuda_attn_workspace(b, &op->u.attn, op->dt, op->kind == TT_OP_ATTN_BWD);
    default: return 0;
  }
}

/* The convolutions: the graph-API ones' operation graphs and plans, the legacy ones' algorithms
 * (most were built by the workspace queries lowering already made; cuda_conv.cu). */
static int cuda_be_prepare(tt_backend *b, const tt_op_desc *ops, int nops) { return tt_cuda_conv_prepare(b, ops, nops); }

/* The CUDA backend's table; impl is each backend's own (tt_cuda_backend_create). Positional, in
 * backend.h's field order (C++ has no designated initializers before C++20). */
static const tt_backend cuda_be_table = {
    "cuda", NULL,
    256, /* align: cuDNN and the vectorised kernels want 256-byte aligned tensors */
    0,   /* host_memory: the arena is device memory */
    cuda_be_destroy, cuda_be_last_error,
    cuda_be_arena_alloc, cuda_be_arena_free, cuda_be_upload, cuda_be_download, cuda_be_zero, cuda_be_sync,
    cuda_be_host_alloc, cuda_be_host_free, cuda_be_event_create, cuda_be_event_destroy, cuda_be_event_sync,
    cuda_be_upload_async, cuda_be_download_async,
    tt_cuda_conv_workspace, tt_cuda_linear_workspace,
    tt_cuda_conv_fwd, tt_cuda_conv_bwd_data, tt_cuda_conv_bwd_filter,
    tt_cuda_linear_fwd, tt_cuda_linear_bwd_data, tt_cuda_linear_bwd_filter,
    tt_cuda_bn_fwd_train, tt_cuda_bn_fwd_infer, tt_cuda_bn_bwd,
    tt_cuda_pool_fwd, tt_cuda_pool_bwd, tt_cuda_gap_fwd, tt_cuda_gap_bwd,
    tt_cuda_act_fwd, tt_cuda_act_bwd, tt_cuda_add, tt_cuda_accumulate, tt_cuda_dropout_fwd, tt_cuda_dropout_bwd,
    tt_cuda_channel_copy, tt_cuda_cast, tt_cuda_normalize_u8, tt_cuda_softmax_ce,
    tt_cuda_sgd_update, tt_cuda_adam_update, tt_cuda_check_finite,
    cuda_be_op_workspace, cuda_be_prepare,
    tt_cuda_act_mask, tt_cuda_act_bwd_mask, tt_cuda_pool_argmax, tt_cuda_pool_bwd_idx,
    tt_cuda_save_compress, tt_cuda_save_restore,
    tt_cuda_ln_fwd, tt_cuda_ln_bwd, tt_cuda_attn_fwd, tt_cuda_attn_bwd, tt_cuda_tokens_fwd, tt_cuda_tokens_bwd,
    tt_cuda_token_pool_fwd, tt_cuda_token_pool_bwd,
    tt_cuda_sum_squares,
    tt_cuda_sgd_update_multi, tt_cuda_adam_update_multi,
    0u, /* layouts: fp32 activations stay NCHW (layouts_16bit below for fp16/bf16) */
    tt_cuda_bn_apply,
    tt_cuda_cast_multi, /* the weight casts of a step in one launch */
    cuda_be_event_record, cuda_be_upload_after, /* the next batch's copy overlaps the step */
    tt_cuda_conv_find, /* tune: cudnnFind*Ex over the arena's transient region at setup */
    0u, /* layouts_16bit: set by tt_cuda_backend_create (NHWC only under TINYTRAIN_LAYOUT=nhwc) */
    tt_cuda_bn_fwd_train_relu, tt_cuda_bn_bwd_relu, /* batch norm and ReLU in one call */
    tt_cuda_sgd_update_held, tt_cuda_adam_update_held, /* bf16 and int8 optimizer state */
    0, /* plan_caps: a real backend's calls are its entry points */
    tt_cuda_bn_fwd_train_add_relu, tt_cuda_bn_bwd_add_relu, /* batch norm, add and ReLU in one call */
    cuda_be_timer_create, cuda_be_timer_elapsed, /* TINYTRAIN_PROFILE by event pairs */
    cuda_be_profiler_range,                      /* TINYTRAIN_CUDA_PROFILE_STEP */
    tt_cuda_graph_begin, tt_cuda_graph_end, tt_cuda_graph_values, tt_cuda_graph_launch, /* the micro-step as a */
    tt_cuda_graph_destroy,                                                              /* CUDA graph */
    cuda_be_download_after, cuda_be_event_wait, /* saved activations in pinned host memory */
    tt_cuda_check_finite_multi, /* the overflow check of transient gradients in one launch */
    1, /* filter_krsc: all-NHWC convolutions read a KRSC weight copy in place, cast_multi writes it */
    0, /* pool_y_nchw: a pooling keeps its input's layout (y and dy too) */
    NULL, /* bn_blk: no nChw16c layout on CUDA */
};

extern "C" tt_backend *tt_cuda_backend_create(size_t *reserve_bytes, const tt_backend_knobs *knobs, char *errbuf,
                                               size_t errsize) {
  int count = 0;
  size_t reserve = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  tt_backend *b;
  tt_cuda_state *st;
  if (e != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();
    /* With no GPU at all the runtime says cudaErrorInsufficientDriver ("CUDA driver version is
     * insufficient"), which sends people to update a driver they need not have: without the
     * device files (/dev/nvidia0, /dev/nvidiactl) there is no NVIDIA GPU, and that is the message. */
    int no_dev_files = access("/dev/nvidiactl", F_OK) != 0 && access("/dev/nvidia0", F_OK) != 0;
    if ((e == cudaSuccess && count <= 0) || e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && no_dev_files))
      cuda_be_create_fail(errbuf, errsize, "no NVIDIA GPU found%s; use --device cpu or --device auto",
                          e == cudaErrorInsufficientDriver ? " (no /dev/nvidia* device files)" : "");
    else
      cuda_be_create_fail(errbuf, errsize, "no CUDA device (cudaGetDeviceCount: %s); use --device cpu or --device auto",
                          e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return NULL;
  }
  b = (tt_backend *)calloc(1, sizeof *b);
  st = (tt_cuda_state *)calloc(1, sizeof *st);
  if (!b || !st) {
    free(b);
    free(st);
    cuda_be_create_fail(errbuf, errsize, "out of host memory creating the CUDA backend");
    return NULL;
  }
  *b = cuda_be_table;
  b->impl = st;
  if (knobs) st->knobs = *knobs; /* what the knobs ask (core/base/knobs.c); NULL: the defaults */
  else tt_backend_knobs_default(&st->knobs);
  /* fp16/bf16 activations stay NCHW unless TINYTRAIN_LAYOUT=nhwc. Measured on the first H100
   * run (2026-11-27, cuDNN 9.19, ResNet-50 bf16 at micro-batch 64, TINYTRAIN_CUDA_PROFILE=1):
   * NHWC took 1.37x NCHW's time (4.83 s against 3.53 s for 12 steps; convolutions 2.70 s against
   * 2.04 s, batch norm 1.21 s against 0.75 s): the legacy API offers three algorithms per
   * direction for NHWC and they were slower (docs/gpu.md#nhwc-activations-for-fp16-and-bf16) */
  b->layouts_16bit = tt_cuda_layouts_16bit(&st->knobs);
  /* the device the calling thread selected: 0, or the one a multi-process launch chose by
   * local rank (tt_cuda_select_device) */
  st->device = cuda_next_device;
  if (st->device < 0 && cudaGetDevice(&st->device) != cudaSuccess) { /* cudaGetDevice creates no context */
    (void)cudaGetLastError();
    st->device = 0;
  }
  if (cuda_be_setup(b, &reserve)) {
    cuda_be_create_fail(errbuf, errsize, "CUDA backend: %s", st->err);
    cuda_be_destroy(b);
    return NULL;
  }
  if (reserve_bytes) *reserve_bytes = reserve;
  return b;
}
