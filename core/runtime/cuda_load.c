/* core/runtime/cuda_load.c — the CUDA backend loaded when a GPU is used (tt_cuda.h, tt_cuda_api).
 *
 * In the build that configure.py writes (TT_CUDA_DLOPEN), kernels/cuda/ is linked into
 * libtinytrain_cuda.so with cudart, cuBLAS, cuDNN and NCCL, and nothing else links them: the
 * tt_cuda_* functions below open it with dlopen on first use and call through its table. A
 * command that uses no GPU (--help, plan --device cpu, a machine without one) never maps the
 * CUDA libraries (tests/test_cli.sh: cli_startup). Without the device files of an NVIDIA GPU
 * (/dev/nvidiactl, /dev/nvidia0; /dev/dxg under WSL) tt_cuda_device_count answers 0 without
 * loading anything. Where libtinytrain_cuda.so is looked for: $TT_CUDA_LIBRARY, then beside the
 * object these functions are in (the tinytrain binary, libtinytrain.so, a program linked with
 * libtinytrain.a), its parent directory, ../lib (an installed bin/tinytrain), then the dynamic
 * linker's search path. The amalgamation and the emulated build link the backend directly. */
/* outside the #if: the amalgamation inlines a header once, where it is first included */
#include "../../kernels/cuda/tt_cuda.h"

#if defined(TT_HAVE_CUDA) && defined(TT_CUDA_DLOPEN)
#include <dlfcn.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA_LOAD_LIB "libtinytrain_cuda.so"

static const tt_cuda_api *cuda_load_api;
static char cuda_load_why[1024];
static pthread_once_t cuda_load_once = PTHREAD_ONCE_INIT;

static void *cuda_load_try(const char *path, char *why, size_t n) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h && !why[0]) snprintf(why, n, "%s", dlerror());
  return h;
}

static void cuda_load_open(void) {
  char path[8192 + 64], why[512] = "";
  void *h = NULL;
  const char *env = getenv("TT_CUDA_LIBRARY");
  if (env && *env) h = cuda_load_try(env, why, sizeof why);
  /* the directories of the object these functions are in (libtinytrain.so), and of the program */
  char dirs[2][4096];
  int nd = 0;
  Dl_info info;
  if (dladdr((void *)&cuda_load_open, &info) && info.dli_fname && strchr(info.dli_fname, '/'))
    snprintf(dirs[nd++], sizeof dirs[0], "%s", info.dli_fname);
  ssize_t k = readlink("/proc/self/exe", dirs[nd], sizeof dirs[0] - 1);
  if (k > 0) dirs[nd++][k] = 0;
  /* "/build": the default build links the program at the top of the source tree (./tinytrain) and
   * the library inside build/; without it the README's ./tinytrain trained on the CPU beside a GPU */
  static const char *const rel[] = {"", "/..", "/../lib", "/build"};
  for (int d = 0; d < nd && !h && !(env && *env); d++) {
    char *slash = strrchr(dirs[d], '/');
    if (slash) *slash = 0;
    for (int i = 0; i < 4 && !h; i++) {
      snprintf(path, sizeof path, "%s%s/%s", dirs[d], rel[i], CUDA_LOAD_LIB);
      if (access(path, F_OK) == 0) h = cuda_load_try(path, why, sizeof why);
    }
  }
  if (!h && !(env && *env)) h = cuda_load_try(CUDA_LOAD_LIB, why, sizeof why);
  if (!h) {
    snprintf(cuda_load_why, sizeof cuda_load_why, "the CUDA backend (%s) could not be loaded: %s; use --device cpu, or "
             "reinstall tinytrain (ninja install puts it beside libtinytrain.so), or set TT_CUDA_LIBRARY to its path",
             CUDA_LOAD_LIB, why);
    return;
  }
  const tt_cuda_api *(*get)(void) = (const tt_cuda_api *(*)(void))dlsym(h, "tt_cuda_api_get");
  const tt_cuda_api *api = get ? get() : NULL;
  if (!api || api->version != TT_CUDA_API_VERSION || api->size != (int)sizeof(tt_cuda_api)) {
    snprintf(cuda_load_why, sizeof cuda_load_why, "%s is of another tinytrain version (no matching tt_cuda_api_get); "
             "reinstall tinytrain", CUDA_LOAD_LIB);
    dlclose(h);
    return;
  }
  cuda_load_api = api;
}

static const tt_cuda_api *cuda_load(void) {
  pthread_once(&cuda_load_once, cuda_load_open);
  return cuda_load_api;
}

/* Some NVIDIA device file: without one there is no GPU to use, and nothing is loaded. */
static int cuda_load_device_files(void) {
  return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0 || access("/dev/dxg", F_OK) == 0;
}

int tt_cuda_device_count(void) {
  if (!cuda_load_device_files() && !getenv("TT_CUDA_LIBRARY")) return 0;
  const tt_cuda_api *a = cuda_load();
  return a ? a->device_count() : 0;
}

tt_backend *tt_cuda_backend_create(size_t *reserve_bytes, const tt_backend_knobs *knobs, char *errbuf, size_t errsize) {
  if (!cuda_load_device_files() && !getenv("TT_CUDA_LIBRARY")) {
    if (errbuf && errsize) snprintf(errbuf, errsize, "no NVIDIA GPU found (no /dev/nvidia* device files); use --device cpu or --device auto");
    return NULL;
  }
  const tt_cuda_api *a = cuda_load();
  if (a) return a->backend_create(reserve_bytes, knobs, errbuf, errsize);
  if (errbuf && errsize) snprintf(errbuf, errsize, "%s", cuda_load_why);
  return NULL;
}

int tt_cuda_probe(char *why, size_t whysize) {
  if (why && whysize) why[0] = 0;
  if (!cuda_load_device_files() && !getenv("TT_CUDA_LIBRARY")) return 0; /* no GPU: quietly none */
  const tt_cuda_api *a = cuda_load();
  if (a) return a->probe(why, whysize);
  /* device files but no loadable backend: not "no GPU", so the caller warns with the reason */
  if (why && whysize) snprintf(why, whysize, "%s", cuda_load_why);
  return 0;
}

/* NULL, or a backend of another kind: the fixed margin, without loading anything */
size_t tt_cuda_library_margin(tt_backend *b) {
  if (!b || !b->name || strcmp(b->name, "cuda")) return TT_CUDA_LIBRARY_MARGIN_BYTES;
  return cuda_load()->library_margin(b); /* a CUDA backend exists: the library is loaded */
}

/* The device's compute capability, 0 when unknown: NULL or another kind of backend, or a library
 * whose table leaves the entry NULL (a backend built before it reported one). The caller treats
 * 0 as "unknown" and says so (core/runtime/session.c: `auto` then keeps to fp16, never bf16). */
int tt_cuda_compute_capability(tt_backend *b) {
  if (!b || !b->name || strcmp(b->name, "cuda")) return 0;
  const tt_cuda_api *a = cuda_load(); /* a CUDA backend exists: the library is loaded */
  if (!a || (size_t)a->size < offsetof(tt_cuda_api, compute_capability) + sizeof a->compute_capability ||
      !a->compute_capability)
    return 0;
  int cc = a->compute_capability(b);
  return cc > 0 ? cc : 0;
}

const char *tt_cuda_info(void) {
  const tt_cuda_api *a = cuda_load();
  return a ? a->info() : cuda_load_why[0] ? cuda_load_why : "not loadable: " CUDA_LOAD_LIB " missing";
}

int tt_cuda_select_device(int local_rank, char *errbuf, size_t errsize) {
  const tt_cuda_api *a = cuda_load();
  if (a) return a->select_device(local_rank, errbuf, errsize);
  if (errbuf && errsize) snprintf(errbuf, errsize, "%s", cuda_load_why);
  return -1;
}

/* The rest take a backend tt_cuda_backend_create made: the library is loaded. */
int tt_cuda_mem_free(tt_backend *b, size_t *f, size_t *t) { return cuda_load()->mem_free(b, f, t); }
size_t tt_cuda_alloc_count(tt_backend *b) { return cuda_load()->alloc_count(b); }
int tt_cuda_mem_used(tt_backend *b, size_t *u, size_t *t) { return cuda_load()->mem_used(b, u, t); }
int tt_cuda_set_tf32(tt_backend *b, int on) { return cuda_load()->set_tf32(b, on); }
size_t tt_cuda_set_conv_workspace_cap(tt_backend *b, size_t bytes) { return cuda_load()->set_conv_workspace_cap(b, bytes); }
size_t tt_cuda_set_bn_resident(tt_backend *b, size_t bytes) { return cuda_load()->set_bn_resident(b, bytes); }
int tt_cuda_nccl_id(tt_backend *b, void *id) { return cuda_load()->nccl_id(b, id); }
int tt_cuda_nccl_init(tt_backend *b, const void *id, int n, int r, size_t *t) { return cuda_load()->nccl_init(b, id, n, r, t); }
int tt_cuda_nccl_group(tt_backend *b, int end) { return cuda_load()->nccl_group(b, end); }
int tt_cuda_nccl_allreduce_async(tt_backend *b, float *p, size_t n) { return cuda_load()->nccl_allreduce_async(b, p, n); }
int tt_cuda_nccl_join(tt_backend *b) { return cuda_load()->nccl_join(b); }
int tt_cuda_nccl_broadcast(tt_backend *b, float *p, size_t n, int root) { return cuda_load()->nccl_broadcast(b, p, n, root); }
void tt_cuda_nccl_destroy(tt_backend *b) { cuda_load()->nccl_destroy(b); }
#endif
