/* tests/cuda_emu/emu_runtime.cc — the emulated device: one fake sm_75 (another
 * compute capability when a test sets one) with 4 GiB, device memory
 * on host mappings (tracked, poisoned when fresh, inaccessible to host code, a guard page after
 * each), errors (sticky ones from failed kernels; messages through cudaGetErrorString), and the
 * SIGSEGV handler that turns a fault into a message. Streams, events and copies:
 * emu_stream.cc; the model: emu_internal.h.
 *
 * Contracts checked here, each failing the call with the error a real runtime gives and a
 * message: a freed pointer is a live allocation's start; allocations fit the device.
 */
#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "cuda_profiler_api.h"
#include "emu_internal.h"

tt_emu_counts emu_counts;

/* --------------------------------- errors --------------------------------------------- */

static int emu_quiet;
static char emu_last[2048];
static cudaError_t emu_sticky_code = cudaSuccess, emu_last_code = cudaSuccess;
static emu_status_detail emu_rt; /* the runtime's last failure, for cudaGetErrorString */

const char *emu_vviolation(const char *fmt, va_list ap) {
  vsnprintf(emu_last, sizeof emu_last, fmt, ap);
  if (!emu_quiet) {
    fprintf(stderr, "cuda_emu: %s\n", emu_last);
    fflush(stderr);
  }
  return emu_last;
}

const char *emu_violation(const char *fmt, ...) {
  va_list ap;
  const char *r;
  va_start(ap, fmt);
  r = emu_vviolation(fmt, ap);
  va_end(ap);
  return r;
}

int emu_detail_vfail(emu_status_detail *d, int s, const char *fmt, va_list ap) {
  snprintf(d->msg, sizeof d->msg, "%s", emu_vviolation(fmt, ap));
  d->code = s;
  return s;
}

const char *emu_detail_string(emu_status_detail *d, int s, const char *text) {
  if (s != 0 && s == d->code && d->msg[0]) {
    snprintf(d->str, sizeof d->str, "%s [cuda_emu: %s]", text, d->msg);
    return d->str;
  }
  return text;
}

cudaError_t emu_cuda_fail(cudaError_t e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emu_detail_vfail(&emu_rt, e, fmt, ap);
  va_end(ap);
  emu_last_code = e;
  return e;
}

cudaError_t emu_sticky(void) { return emu_sticky_code; }

void emu_set_sticky(cudaError_t e, const char *msg) {
  if (emu_sticky_code != cudaSuccess) return; /* the first failure is the one to read */
  emu_sticky_code = e;
  snprintf(emu_rt.msg, sizeof emu_rt.msg, "%s", msg);
  emu_rt.code = e;
  emu_violation("%s", msg);
}

extern "C" int tt_emu_set_quiet(int quiet) {
  int o = emu_quiet;
  emu_quiet = quiet;
  return o;
}
extern "C" const char *tt_emu_last_violation(void) { return emu_last; }
extern "C" void tt_emu_clear_sticky(void) {
  emu_sticky_code = emu_last_code = cudaSuccess;
  emu_rt.code = cudaSuccess;
  emu_rt.msg[0] = 0;
}
extern "C" void tt_emu_get_counts(tt_emu_counts *c) { *c = emu_counts; }

static const char *emu_error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    default: return "cudaErrorUnknown";
  }
}

static const char *emu_error_text(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalState: return "the resource is not in a valid state to perform the operation";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    default: return "unknown error";
  }
}

extern "C" const char *cudaGetErrorName(cudaError_t e) { return emu_error_name(e); }
extern "C" const char *cudaGetErrorString(cudaError_t e) {
  return emu_detail_string(&emu_rt, e, emu_error_text(e));
}
extern "C" cudaError_t cudaGetLastError(void) {
  cudaError_t e = emu_sticky_code != cudaSuccess ? emu_sticky_code : emu_last_code;
  emu_last_code = cudaSuccess;
  return e;
}
extern "C" cudaError_t cudaPeekAtLastError(void) {
  return emu_sticky_code != cudaSuccess ? emu_sticky_code : emu_last_code;
}

/* --------------------------------- the device ----------------------------------------- */

static const size_t emu_total_mem = (size_t)4 << 30;
static const size_t emu_context_bytes = (size_t)300 << 20; /* what a context takes on a real card */
static long long emu_reserved; /* context + library handles */
static size_t emu_allocated;
static int emu_inited, emu_protect = 1;

static void emu_install_handler(void);

void emu_init(void) {
  const char *p;
  if (emu_inited) return;
  emu_inited = 1;
  emu_reserved = (long long)emu_context_bytes;
  p = getenv("TT_EMU_PROTECT");
  if (p && !strcmp(p, "0")) emu_protect = 0;
  emu_install_handler(); /* faults that are not the emulation's go on to the previous handler */
}

void emu_reserve_add(long long bytes) { emu_reserved += bytes; }

/* TT_EMU_LIBRARY_BYTES: bytes, or with a K, M or G suffix; unset or malformed: 0 (what the
 * emulated libraries took after setup before it existed). Once per process: a card loads a
 * library's modules once per context. */
void emu_library_load(void) {
  static int loaded;
  if (loaded) return;
  loaded = 1;
  const char *p = getenv("TT_EMU_LIBRARY_BYTES");
  char *end = NULL;
  if (!p || !*p) return;
  unsigned long long v = strtoull(p, &end, 10);
  if (end == p) return;
  if (*end == 'K' || *end == 'k') v <<= 10, end++;
  else if (*end == 'M' || *end == 'm') v <<= 20, end++;
  else if (*end == 'G' || *end == 'g') v <<= 30, end++;
  if (*end) return;
  emu_reserved += (long long)v;
}

/* The emulated device's compute capability (major * 10 + minor): 75, a T4, unless a test sets
 * another (tt_emu_set_compute_capability: the cuDNN emulation's bf16 configuration needs 80). */
static int emu_cc = 75;
int emu_compute_capability(void) { return emu_cc; }
extern "C" int tt_emu_set_compute_capability(int cc) {
  int o = emu_cc;
  if (cc >= 75 && cc <= 120) emu_cc = cc;
  return o;
}

/* The opt-in limit per block and the shared memory per multiprocessor of the emulated compute
 * capability (CUDA C++ Programming Guide, "Compute Capabilities", technical specifications:
 * 64 KiB / 64 KiB on 7.5; 163 / 164 KiB on 8.0 and 8.7; 99 / 100 KiB on 8.6, 8.9 and 12.x; 227 /
 * 228 KiB on 9.0 and 10.x), so that a backend sizing a kernel's shared memory from the attribute
 * (the held-on-chip batch norm) meets each card's. */
int emu_shared_optin(void) {
  if (emu_cc == 80 || emu_cc == 87) return 163 * 1024;
  if (emu_cc >= 90 && emu_cc < 120) return 227 * 1024;
  if (emu_cc > 75) return 99 * 1024;
  return 64 * 1024;
}
int emu_shared_per_sm(void) { return emu_cc > 75 ? emu_shared_optin() + 1024 : 64 * 1024; }

static int emu_context; /* the primary context exists */
void emu_context_create(void) { emu_context = 1; }
extern "C" int tt_emu_context_exists(void) { return emu_context; }

/* TT_EMU_DRIVER=12040: an installed driver that runs CUDA 12.4 at most, older than this runtime:
 * cudaGetDeviceCount fails with cudaErrorInsufficientDriver, cudaDriverGetVersion says 12040. */
static int emu_driver_version(void) {
  const char *p = getenv("TT_EMU_DRIVER");
  return p && *p ? atoi(p) : CUDART_VERSION;
}

static int emu_device_count(void) {
  const char *p = getenv("TT_EMU_DEVICES"); /* 0 emulates a machine without a GPU */
  return p && !strcmp(p, "0") ? 0 : 1;
}

extern "C" cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return emu_cuda_fail(cudaErrorInvalidValue, "cudaGetDeviceCount: NULL count");
  if (emu_driver_version() < CUDART_VERSION) {
    *count = 0;
    return emu_cuda_fail(cudaErrorInsufficientDriver, "emulating a driver for CUDA %d.%d (TT_EMU_DRIVER)",
                         emu_driver_version() / 1000, emu_driver_version() % 1000 / 10);
  }
  *count = emu_device_count();
  if (!*count) return emu_cuda_fail(cudaErrorNoDevice, "emulating a machine without a GPU (TT_EMU_DEVICES=0)");
  return cudaSuccess;
}

static cudaError_t emu_check_device(const char *who, int device) {
  if (device != 0 || !emu_device_count())
    return emu_cuda_fail(cudaErrorInvalidDevice, "%s: device %d does not exist (the emulation has device 0)", who, device);
  return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int device) {
  EMU_ENTER();
  return emu_check_device("cudaSetDevice", device);
}
/* The device flags (cudaSetDeviceFlags): the runtime takes them before or after the primary
 * context exists (CUDA 12 and newer overwrite the previous flags); at most one scheduling mode. */
static unsigned emu_device_flags;
extern "C" cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  unsigned sched = flags & 0x07u;
  EMU_ENTER();
  if ((flags & ~0x1fu) || (sched && (sched & (sched - 1))))
    return emu_cuda_fail(cudaErrorInvalidValue, "cudaSetDeviceFlags: invalid flags 0x%x", flags);
  emu_device_flags = flags;
  return cudaSuccess;
}
/* The per-thread stack limit: recorded (the emulated device's memory does not depend on it; only
 * a card shows what the context gives back: tests/gpu/memprobe.py). */
static size_t emu_stack_limit = 1024;
static int emu_stack_sets;
extern "C" cudaError_t cudaDeviceSetLimit(cudaLimit limit, size_t value) {
  EMU_ENTER();
  if (limit != cudaLimitStackSize && limit != cudaLimitPrintfFifoSize && limit != cudaLimitMallocHeapSize)
    return emu_cuda_fail(cudaErrorInvalidValue, "cudaDeviceSetLimit: limit %d is not emulated", (int)limit);
  if (emu_capture_unsafe("cudaDeviceSetLimit") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
  if (limit == cudaLimitStackSize) emu_stack_limit = value, emu_stack_sets++;
  return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceGetLimit(size_t *value, cudaLimit limit) {
  EMU_ENTER();
  if (!value) return emu_cuda_fail(cudaErrorInvalidValue, "cudaDeviceGetLimit: NULL value");
  if (limit != cudaLimitStackSize) return emu_cuda_fail(cudaErrorInvalidValue, "cudaDeviceGetLimit: limit %d is not emulated", (int)limit);
  *value = emu_stack_limit;
  return cudaSuccess;
}
extern "C" size_t tt_emu_stack_limit(int *sets) {
  if (sets) *sets = emu_stack_sets;
  return emu_stack_limit;
}
extern "C" cudaError_t cudaGetDeviceFlags(unsigned int *flags) {
  EMU_ENTER();
  if (!flags) return emu_cuda_fail(cudaErrorInvalidValue, "cudaGetDeviceFlags: NULL flags");
  *flags = emu_device_flags;
  return cudaSuccess;
}
extern "C" unsigned tt_emu_device_flags(void) { return emu_device_flags; }

/* The profiler's range (cuda_profiler_api.h): counted; starting an open range or stopping a closed
 * one is harmless, as in the runtime. */
static size_t emu_profiler_calls;
static int emu_profiler_active;
extern "C" cudaError_t cudaProfilerStart(void) {
  EMU_ENTER();
  emu_profiler_calls++, emu_profiler_active = 1;
  return cudaSuccess;
}
extern "C" cudaError_t cudaProfilerStop(void) {
  EMU_ENTER();
  emu_profiler_calls++, emu_profiler_active = 0;
  return cudaSuccess;
}
extern "C" size_t tt_emu_profiler_calls(int *active) {
  if (active) *active = emu_profiler_active;
  return emu_profiler_calls;
}

extern "C" cudaError_t cudaGetDevice(int *device) {
  EMU_ENTER_NO_CONTEXT();
  if (!device) return emu_cuda_fail(cudaErrorInvalidValue, "cudaGetDevice: NULL device");
  *device = 0;
  return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
  EMU_ENTER_NO_CONTEXT();
  if (!prop) return emu_cuda_fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: NULL prop");
  if (emu_check_device("cudaGetDeviceProperties", device)) return cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "tinytrain CUDA emulator (sm_%d, on the CPU)", emu_cc);
  prop->totalGlobalMem = emu_total_mem;
  prop->sharedMemPerBlock = EMU_SHARED_PER_BLOCK;
  prop->sharedMemPerBlockOptin = (size_t)emu_shared_optin();
  prop->sharedMemPerMultiprocessor = (size_t)emu_shared_per_sm();
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff, prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->clockRate = 1590000;
  prop->totalConstMem = 65536;
  prop->major = emu_cc / 10, prop->minor = emu_cc % 10;
  prop->multiProcessorCount = 40;
  prop->maxThreadsPerMultiProcessor = 1024;
  prop->memoryBusWidth = 256;
  prop->l2CacheSize = 4 << 20;
  return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  cudaError_t e;
  if (!value) return emu_cuda_fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: NULL value");
  if ((e = cudaGetDeviceProperties(&p, device)) != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return emu_cuda_fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
  }
  return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int device) {
  EMU_ENTER_NO_CONTEXT();
  if (!buf || len <= 0) return emu_cuda_fail(cudaErrorInvalidValue, "cudaDeviceGetPCIBusId: no buffer");
  if (emu_check_device("cudaDeviceGetPCIBusId", device)) return cudaErrorInvalidDevice;
  snprintf(buf, (size_t)len, "00000000:00:00.0"); /* the emulated NVML's one device */
  return cudaSuccess;
}

extern "C" cudaError_t cudaRuntimeGetVersion(int *v) {
  if (!v) return emu_cuda_fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion: NULL");
  *v = CUDART_VERSION;
  return cudaSuccess;
}
extern "C" cudaError_t cudaDriverGetVersion(int *v) {
  if (!v) return emu_cuda_fail(cudaErrorInvalidValue, "cudaDriverGetVersion: NULL");
  *v = emu_driver_version();
  return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

/* --------------------------------- allocations ---------------------------------------- */

/* Registries are never destroyed: objects they point to stay reachable until the process ends. */
static std::map<uintptr_t, emu_alloc> &emu_live = *new std::map<uintptr_t, emu_alloc>(); /* by base */
static std::vector<emu_alloc> &emu_freed = *new std::vector<emu_alloc>(); /* quarantined, for messages */
static unsigned long emu_next_id = 1;
/* Device and page-locked allocations (and registrations) made so far: ids are handed out in order. */
extern "C" size_t tt_emu_allocations(void) { return (size_t)(emu_next_id - 1); }
static int emu_window;                           /* device_enter depth */
static size_t emu_page;

static size_t emu_pagesize(void) {
  if (!emu_page) emu_page = (size_t)sysconf(_SC_PAGESIZE);
  return emu_page;
}

const emu_alloc *emu_alloc_find(const void *p, int end) {
  uintptr_t a = (uintptr_t)p;
  std::map<uintptr_t, emu_alloc>::const_iterator it = emu_live.upper_bound(a);
  if (it == emu_live.begin()) return NULL;
  --it;
  if (a < it->first + it->second.size || (a == it->first + it->second.size && (end || !it->second.size)))
    return &it->second;
  return NULL;
}

int emu_is_device(const void *p) {
  const emu_alloc *a = emu_alloc_find(p, 1);
  return a && a->kind == EMU_DEVICE;
}
/* Pinned (page-locked, registered) host memory is mapped for the device too (unified addressing). */
extern "C" int tt_emu_is_device_ptr(const void *p) { return emu_alloc_find(p, 1) != NULL; }

const char *emu_describe(const void *p, char *buf, size_t n) {
  const emu_alloc *a = emu_alloc_find(p, 1);
  if (a)
    snprintf(buf, n, "%p (offset %zu of the %zu-byte %s allocation #%lu)", p, (size_t)((const char *)p - a->base),
             a->size, a->kind == EMU_DEVICE ? "device" : "pinned host", a->id);
  else {
    for (size_t i = 0; i < emu_freed.size(); i++)
      if ((const char *)p >= emu_freed[i].base && (const char *)p < emu_freed[i].base + emu_freed[i].size) {
        snprintf(buf, n, "%p (offset %zu of the freed %zu-byte allocation #%lu)", p,
                 (size_t)((const char *)p - emu_freed[i].base), emu_freed[i].size, emu_freed[i].id);
        return buf;
      }
    snprintf(buf, n, "%p (host memory, not from cudaMalloc)", p);
  }
  return buf;
}

int emu_dev_range(const void *p, size_t bytes, char *msg, size_t msgsize) {
  const emu_alloc *a;
  char d[256];
  if (!p) return snprintf(msg, msgsize, "NULL pointer"), -1;
  a = emu_alloc_find(p, bytes == 0);
  if (!a || a->kind != EMU_DEVICE)
    return snprintf(msg, msgsize, "%s is not device memory", emu_describe(p, d, sizeof d)), -1;
  if ((size_t)((const char *)p - a->base) + bytes > a->size)
    return snprintf(msg, msgsize, "%zu bytes at %s run %zu bytes past its end", bytes, emu_describe(p, d, sizeof d),
                    (size_t)((const char *)p - a->base) + bytes - a->size),
           -1;
  return 0;
}

static void emu_protect_all(int prot) {
  if (!emu_protect) return;
  for (std::map<uintptr_t, emu_alloc>::iterator it = emu_live.begin(); it != emu_live.end(); ++it)
    if (it->second.kind == EMU_DEVICE)
      if (mprotect(it->second.map, it->second.map_size - emu_pagesize(), prot) != 0) {
        fprintf(stderr, "cuda_emu: mprotect failed: %s\n", strerror(errno));
        abort();
      }
}

void emu_device_enter(void) {
  if (emu_window++ == 0) emu_protect_all(PROT_READ | PROT_WRITE);
}
void emu_device_leave(void) {
  if (--emu_window == 0) emu_protect_all(PROT_NONE);
}

/* Mapping layout: [ ... | base ... base+size (rounded up to 256) | guard page ], so an access
 * just past the end (beyond the rounding) faults. */
static cudaError_t emu_map(void **ptr, size_t size, int kind, const char *who) {
  size_t pg = emu_pagesize(), body = (size + 255u) & ~(size_t)255u, map_body, map_size;
  char *m;
  emu_alloc a;
  if (!ptr) return emu_cuda_fail(cudaErrorInvalidValue, "%s: NULL result pointer", who);
  *ptr = NULL;
  if (body == 0) body = 256;
  map_body = (body + pg - 1) / pg * pg;
  map_size = map_body + pg;
  m = (char *)mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return emu_cuda_fail(cudaErrorMemoryAllocation, "%s(%zu bytes): host mmap failed", who, size);
  if (mprotect(m + map_body, pg, PROT_NONE) != 0) {
    munmap(m, map_size);
    return emu_cuda_fail(cudaErrorMemoryAllocation, "%s: mprotect failed", who);
  }
  /* Large device buffers on huge pages where the system offers them (transparent huge pages,
   * "madvise" mode): the device window protects and unprotects every device mapping at each
   * synchronisation (emu_protect_all), and mprotect's cost is one page-table entry per resident
   * page, so an 80 MiB buffer took 0.3 ms a call in 4 KiB pages. Advice only: refused, it
   * changes nothing. */
  if (kind == EMU_DEVICE && map_body >= ((size_t)2 << 20)) (void)madvise(m, map_body, MADV_HUGEPAGE);
  a.map = m, a.map_size = map_size, a.base = m + (map_body - body), a.size = size, a.kind = kind;
  a.id = emu_next_id++, a.freed = 0;
  /* fresh device memory is not zero on a GPU: fill it with NaN bytes */
  memset(a.base, kind == EMU_DEVICE ? 0xff : 0, body);
  if (kind == EMU_DEVICE && emu_protect && emu_window == 0) mprotect(m, map_body, PROT_NONE);
  emu_live[(uintptr_t)a.base] = a;
  *ptr = a.base;
  return cudaSuccess;
}

static cudaError_t emu_unmap(void *p, int kind, const char *who) {
  std::map<uintptr_t, emu_alloc>::iterator it = emu_live.find((uintptr_t)p);
  char d[256];
  if (!p) return cudaSuccess;
  if (it == emu_live.end() || it->second.kind != kind)
    return emu_cuda_fail(cudaErrorInvalidValue, "%s(%s): not the start of a live %s allocation", who,
                         emu_describe(p, d, sizeof d), kind == EMU_DEVICE ? "device" : "pinned host");
  if (!it->second.map)
    return emu_cuda_fail(cudaErrorInvalidValue, "%s(%p): registered with cudaHostRegister; use cudaHostUnregister", who, p);
  emu_alloc a = it->second;
  emu_live.erase(it);
  /* quarantine: the pages go back to the system, the addresses stay reserved and inaccessible */
  madvise(a.map, a.map_size, MADV_DONTNEED);
  mprotect(a.map, a.map_size, PROT_NONE);
  a.freed = 1;
  emu_freed.push_back(a);
  if (kind == EMU_DEVICE) emu_allocated -= (a.size + 255u) & ~(size_t)255u;
  return cudaSuccess;
}

extern "C" cudaError_t cudaMalloc(void **p, size_t size) {
  size_t body = (size + 255u) & ~(size_t)255u;
  cudaError_t e;
  EMU_ENTER();
  if (!p) return emu_cuda_fail(cudaErrorInvalidValue, "cudaMalloc: NULL devPtr");
  *p = NULL;
  if ((e = emu_capture_unsafe("cudaMalloc")) != cudaSuccess) return e;
  if (emu_allocated + body + (size_t)emu_reserved > emu_total_mem)
    return emu_cuda_fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes): the emulated device has %zu bytes free", size,
                         emu_total_mem - emu_allocated - (size_t)emu_reserved);
  if ((e = emu_map(p, size, EMU_DEVICE, "cudaMalloc")) != cudaSuccess) return e;
  emu_allocated += body;
  return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *p) {
  EMU_ENTER();
  if (!p) return cudaSuccess; /* cudaFree(0) creates the context */
  if (emu_capture_unsafe("cudaFree") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
  emu_run_all();              /* cudaFree synchronises the device */
  if (emu_sticky_code != cudaSuccess) return emu_sticky_code;
  return emu_unmap(p, EMU_DEVICE, "cudaFree");
}

extern "C" cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
  EMU_ENTER();
  if (emu_capture_unsafe("cudaHostAlloc") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
  return emu_map(p, size, EMU_PINNED, "cudaHostAlloc");
}
extern "C" cudaError_t cudaMallocHost(void **p, size_t size) { return cudaHostAlloc(p, size, 0); }
extern "C" cudaError_t cudaFreeHost(void *p) {
  EMU_ENTER();
  if (emu_capture_unsafe("cudaFreeHost") != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
  emu_run_all();
  return emu_unmap(p, EMU_PINNED, "cudaFreeHost");
}

/* Registered host memory counts as pinned: copies from it are not staged. */
static std::map<uintptr_t, size_t> &emu_registered = *new std::map<uintptr_t, size_t>();

extern "C" cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags) {
  emu_alloc a;
  EMU_ENTER();
  if (!p || !size) return emu_cuda_fail(cudaErrorInvalidValue, "cudaHostRegister: NULL or empty range");
  if (emu_alloc_find(p, 0) || emu_registered.count((uintptr_t)p))
    return emu_cuda_fail(cudaErrorInvalidValue, "cudaHostRegister(%p): already registered or allocated", p);
  memset(&a, 0, sizeof a);
  a.base = (char *)p, a.size = size, a.kind = EMU_PINNED, a.id = emu_next_id++;
  emu_live[(uintptr_t)p] = a;
  emu_registered[(uintptr_t)p] = size;
  return cudaSuccess;
}

extern "C" cudaError_t cudaHostUnregister(void *p) {
  EMU_ENTER();
  if (!emu_registered.count((uintptr_t)p))
    return emu_cuda_fail(cudaErrorInvalidValue, "cudaHostUnregister(%p): not registered", p);
  emu_run_all(); /* copies from it finish first */
  emu_registered.erase((uintptr_t)p);
  emu_live.erase((uintptr_t)p);
  return cudaSuccess;
}

cudaError_t emu_free_device(void *p, const char *who) { return emu_unmap(p, EMU_DEVICE, who); }

extern "C" cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
  EMU_ENTER();
  if (!free_b || !total) return emu_cuda_fail(cudaErrorInvalidValue, "cudaMemGetInfo: NULL argument");
  *total = emu_total_mem;
  *free_b = emu_total_mem - emu_allocated - (size_t)emu_reserved;
  return cudaSuccess;
}

/* ------------------------------------- NVML ------------------------------------------- */

/* What the backend reaches through dlopen("libnvidia-ml.so.1") on a real machine: the device's
 * used memory, which counts the context only once one exists, so that a reserve whose baseline
 * was read after the context was created comes out 300 MiB short, as on a card. TT_EMU_NVML=0
 * emulates a machine without NVML. */
static int emu_nvml_baseline_ctx = -1; /* whether the context existed at the first memory read after nvmlInit */
static int emu_nvml_inits, emu_nvml_reads;
extern "C" int tt_emu_nvml_baseline_context(void) { return emu_nvml_baseline_ctx; }
extern "C" int tt_emu_nvml_open_count(void) { return emu_nvml_inits; }
static int emu_nvml_init(void) { emu_nvml_inits++, emu_nvml_reads = 0; return 0; }
static int emu_nvml_shutdown(void) { emu_nvml_inits--; return emu_nvml_inits < 0 ? 1 : 0; }
static int emu_nvml_by_bus(const char *bus, void **dev) {
  static int the_device;
  if (emu_nvml_inits <= 0) return 1; /* NVML_ERROR_UNINITIALIZED */
  const char *mode = getenv("TT_EMU_NVML"); /* "nodevice": NVML loads but does not know the device */
  if (!bus || strcmp(bus, "00000000:00:00.0") || (mode && !strcmp(mode, "nodevice"))) return 6; /* NVML_ERROR_NOT_FOUND */
  *dev = &the_device;
  return 0;
}
struct emu_nvml_memory { unsigned long long total, free, used; };
static int emu_nvml_getmem(void *dev, emu_nvml_memory *m) {
  if (emu_nvml_inits <= 0 || !dev) return 1;
  if (emu_nvml_reads++ == 0) emu_nvml_baseline_ctx = emu_context;
  m->total = emu_total_mem;
  m->used = (emu_context ? (unsigned long long)emu_reserved : 0ull) + emu_allocated;
  m->free = m->total - m->used;
  return 0;
}
static int emu_nvml_driver(char *buf, unsigned n) {
  if (emu_nvml_inits <= 0) return 1;
  snprintf(buf, n, "emulated-%d", emu_driver_version());
  return 0;
}
extern "C" void *tt_emu_nvml_open(void) {
  const char *p = getenv("TT_EMU_NVML");
  static int handle;
  return p && !strcmp(p, "0") ? NULL : (void *)&handle;
}
extern "C" void *tt_emu_nvml_sym(void *lib, const char *name) {
  if (!lib) return NULL;
  if (!strcmp(name, "nvmlInit_v2")) return (void *)emu_nvml_init;
  if (!strcmp(name, "nvmlShutdown")) return (void *)emu_nvml_shutdown;
  if (!strcmp(name, "nvmlDeviceGetHandleByPciBusId_v2")) return (void *)emu_nvml_by_bus;
  if (!strcmp(name, "nvmlDeviceGetMemoryInfo")) return (void *)emu_nvml_getmem;
  if (!strcmp(name, "nvmlSystemGetDriverVersion")) return (void *)emu_nvml_driver;
  return NULL;
}

/* ------------------------------------ SIGSEGV ----------------------------------------- */

static void emu_write(const char *s) {
  ssize_t r = write(2, s, strlen(s));
  (void)r;
}

static struct sigaction emu_old_segv, emu_old_bus;
/* 1 while the handler prints a backtrace of host code that touched device memory: glibc's
 * backtrace() itself faults now and then there (about 1 run in 10 of cuda_emu_memory_streams'
 * forked child, on the alternate stack), and that nested fault, not being the emulation's, went
 * to the default action: the program died of SIGSEGV with the message half written. */
static volatile sig_atomic_t emu_in_backtrace;

static void emu_segv(int sig, siginfo_t *si, void *ctx) {
  static char msg[1200];
  char d[512], k[400];
  const char *addr = (const char *)si->si_addr;
  const emu_alloc *a, *freed = NULL, *below = NULL;
  size_t len;
  (void)ctx;
  if (emu_in_backtrace) { /* the message is out: stop as the handler meant to */
    emu_write("\n(backtrace incomplete)\n");
    signal(SIGABRT, SIG_DFL);
    abort();
  }
  a = emu_alloc_find(addr, 0);
  if (!a) {
    std::map<uintptr_t, emu_alloc>::iterator it = emu_live.upper_bound((uintptr_t)addr);
    if (it != emu_live.begin()) below = &(--it)->second; /* the live allocation just before */
    for (size_t i = 0; i < emu_freed.size(); i++)
      if (addr >= emu_freed[i].map && addr < emu_freed[i].map + emu_freed[i].map_size) freed = &emu_freed[i];
  }
  if (a)
    emu_describe(addr, d, sizeof d);
  else if (!emu_dyn_shared_describe(addr, d, sizeof d)) {
    len = (size_t)snprintf(d, sizeof d, "%p", (const void *)addr);
    if (below && addr - below->base < ((ptrdiff_t)64 << 20))
      len += (size_t)snprintf(d + len, sizeof d - len, ", %zu bytes past the end of the %zu-byte allocation #%lu",
                              (size_t)(addr - below->base - below->size), below->size, below->id);
    if (freed)
      snprintf(d + len, sizeof d - len, ", in the freed %zu-byte allocation #%lu", freed->size, freed->id);
  }
  if (emu_in_kernel()) {
    snprintf(msg, sizeof msg, "%s: illegal memory access at %s", emu_kernel_now(k, sizeof k), d);
    emu_kernel_fault(msg);
  }
  if (a || freed) {
    snprintf(msg, sizeof msg,
             "cuda_emu: host code touched device memory at %s: on a GPU the host cannot dereference a device pointer "
             "(copy with cudaMemcpy); backtrace:\n", d);
    emu_write(msg);
    {
      void *bt[32];
      int nb;
      emu_in_backtrace = 1;
      nb = backtrace(bt, 32);
      backtrace_symbols_fd(bt, nb, 2);
    }
    signal(SIGABRT, SIG_DFL);
    abort();
  }
  /* not ours: the handler that was there before (a sanitizer's, or the default) sees it again */
  sigaction(sig, sig == SIGBUS ? &emu_old_bus : &emu_old_segv, NULL);
}

static void emu_install_handler(void) {
  /* 1 MiB: backtrace() in the handler unwinds on this stack, and with 64 KiB the child of
   * cuda_emu_memory_streams died of a plain SIGSEGV after the message about 1 run in 20 (a fault
   * the kernel could not deliver: no alternate stack left), none in 500 runs with 1 MiB. */
  static char altstack[1024 * 1024];
  stack_t ss;
  struct sigaction sa;
  ss.ss_sp = altstack, ss.ss_size = sizeof altstack, ss.ss_flags = 0;
  sigaltstack(&ss, NULL);
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = emu_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &emu_old_segv);
  sigaction(SIGBUS, &sa, &emu_old_bus);
  /* backtrace() loads libgcc's unwinder on its first call, under the dynamic loader's lock; in
   * the handler, that first call could come in a child forked while another thread held the lock
   * (copied held, released by nobody), and hang. One call here, before any fork, loads it. */
  {
    void *bt[2];
    (void)backtrace(bt, 2);
  }
}

