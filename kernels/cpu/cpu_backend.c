/* kernels/cpu/cpu_backend.c — the CPU backend's table, memory and threads.
 *
 * Memory is host memory: the "arena" is one 64-byte aligned allocation, upload/download are
 * memcpy, sync is a no-op. The thread count chosen at creation is used by every OpenMP loop
 * (num_threads clause) and set for OpenBLAS (openblas_set_num_threads, process-wide: the last
 * created CPU backend wins, which is fine for one backend per process).
 */
#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_internal.h"

int tt_cpu_fail(tt_backend *b, const char *fmt, ...) {
  if (b && b->impl) {
    tt_cpu_state *st = (tt_cpu_state *)b->impl;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->err, sizeof st->err, fmt, ap);
    va_end(ap);
  }
  return -1;
}

void tt_cpu_to_f32(tt_backend *b, tt_dtype dt, const void *src, float *dst, size_t count) {
  if (dt == TT_F32) {
    if ((const void *)dst != src) memcpy(dst, src, count * sizeof(float));
    return;
  }
  {
    const uint16_t *s = (const uint16_t *)src;
    ptrdiff_t i, cnt = (ptrdiff_t)count;
    int nt = tt_cpu_threads(b);
    (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (cnt > TT_CPU_PAR_MIN)
    for (i = 0; i < cnt; i++) dst[i] = tt_cpu_h2f(s[i]);
  }
}

void tt_cpu_from_f32(tt_backend *b, tt_dtype dt, const float *src, void *dst, size_t count) {
  if (dt == TT_F32) {
    if ((const void *)src != dst) memcpy(dst, src, count * sizeof(float));
    return;
  }
  {
    uint16_t *d = (uint16_t *)dst;
    ptrdiff_t i, cnt = (ptrdiff_t)count;
    int nt = tt_cpu_threads(b);
    (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (cnt > TT_CPU_PAR_MIN)
    for (i = 0; i < cnt; i++) d[i] = tt_cpu_f2h(src[i]);
  }
}

uint16_t tt_f32_to_f16(float f) { return tt_cpu_f2h(f); }
float tt_f16_to_f32(uint16_t h) { return tt_cpu_h2f(h); }

static void cpu_be_destroy(tt_backend *b) {
  if (!b) return;
  free(b->impl);
  free(b);
}

static const char *cpu_be_last_error(tt_backend *b) {
  if (!b || !b->impl) return "no backend";
  return ((tt_cpu_state *)b->impl)->err;
}

static void *cpu_be_arena_alloc(tt_backend *b, size_t bytes) {
  void *p;
  /* C11 aligned_alloc (posix_memalign needs feature macros that an amalgamated file cannot
   * place before its first include); the size is rounded up to the alignment as C11 asks. */
  size_t sz = (bytes + 63u) & ~(size_t)63u;
  if (sz == 0) sz = 64;
  p = aligned_alloc(64, sz);
  if (!p) {
    tt_cpu_fail(b, "arena_alloc: out of host memory allocating %zu bytes; lower the memory budget or batch",
                bytes);
    return NULL;
  }
  return p;
}

static void cpu_be_arena_free(tt_backend *b, void *p) {
  (void)b;
  free(p);
}

static int cpu_be_upload(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes) {
  if (bytes && (!dst_dev || !src_host)) return tt_cpu_fail(b, "upload: NULL pointer for %zu bytes", bytes);
  if (bytes) memmove(dst_dev, src_host, bytes);
  return 0;
}

static int cpu_be_download(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes) {
  if (bytes && (!dst_host || !src_dev)) return tt_cpu_fail(b, "download: NULL pointer for %zu bytes", bytes);
  if (bytes) memmove(dst_host, src_dev, bytes);
  return 0;
}

static int cpu_be_zero(tt_backend *b, void *p, size_t bytes) {
  if (bytes && !p) return tt_cpu_fail(b, "zero: NULL pointer for %zu bytes", bytes);
  if (bytes) memset(p, 0, bytes);
  return 0;
}

static int cpu_be_sync(tt_backend *b) {
  (void)b;
  return 0;
}

/* Staging on the CPU: the "device" is host memory and every copy is done when the call returns,
 * so events have nothing to wait for; one immutable token stands for all of them. */
static const char cpu_be_event_token = 0;

static void *cpu_be_host_alloc(tt_backend *b, size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) tt_cpu_fail(b, "host_alloc: out of host memory allocating %zu bytes", bytes);
  return p;
}

static void cpu_be_host_free(tt_backend *b, void *p) {
  (void)b;
  free(p);
}

static void *cpu_be_event_create(tt_backend *b) {
  (void)b;
  return (void *)&cpu_be_event_token;
}

static void cpu_be_event_destroy(tt_backend *b, void *ev) { (void)b, (void)ev; }

static int cpu_be_event_sync(tt_backend *b, void *ev) {
  if (!ev) return tt_cpu_fail(b, "event_sync: NULL event");
  return 0;
}

static int cpu_be_upload_async(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes, void *done) {
  (void)done;
  return cpu_be_upload(b, dst_dev, src_host, bytes);
}

static int cpu_be_download_async(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes, void *done) {
  (void)done;
  return cpu_be_download(b, dst_host, src_dev, bytes);
}

tt_backend *tt_cpu_backend_create(int threads) {
  tt_backend *b = (tt_backend *)calloc(1, sizeof *b);
  tt_cpu_state *st = (tt_cpu_state *)calloc(1, sizeof *st);
  if (!b || !st) {
    free(b);
    free(st);
    return NULL;
  }
  if (threads <= 0) {
#ifdef _OPENMP
    threads = omp_get_num_procs();
#else
    threads = 1;
#endif
  }
  if (threads < 1) threads = 1;
  st->threads = threads;
  openblas_set_num_threads(1); /* we thread around single-threaded calls: see tt_cpu_sgemm */
  b->name = "cpu";
  b->align = 256; /* what vectorised loops and OpenBLAS like; matches the CUDA backend so plans agree */
  b->impl = st;
  b->destroy = cpu_be_destroy;
  b->last_error = cpu_be_last_error;
  b->arena_alloc = cpu_be_arena_alloc;
  b->arena_free = cpu_be_arena_free;
  b->upload = cpu_be_upload;
  b->download = cpu_be_download;
  b->zero = cpu_be_zero;
  b->sync = cpu_be_sync;
  b->host_alloc = cpu_be_host_alloc;
  b->host_free = cpu_be_host_free;
  b->event_create = cpu_be_event_create;
  b->event_destroy = cpu_be_event_destroy;
  b->event_sync = cpu_be_event_sync;
  b->upload_async = cpu_be_upload_async;
  b->download_async = cpu_be_download_async;
  b->conv_workspace = tt_cpu_conv_workspace;
  b->linear_workspace = tt_cpu_linear_workspace;
  b->conv_fwd = tt_cpu_conv_fwd;
  b->conv_bwd_data = tt_cpu_conv_bwd_data;
  b->conv_bwd_filter = tt_cpu_conv_bwd_filter;
  b->linear_fwd = tt_cpu_linear_fwd;
  b->linear_bwd_data = tt_cpu_linear_bwd_data;
  b->linear_bwd_filter = tt_cpu_linear_bwd_filter;
  b->bn_fwd_train = tt_cpu_bn_fwd_train;
  b->bn_fwd_infer = tt_cpu_bn_fwd_infer;
  b->bn_bwd = tt_cpu_bn_bwd;
  b->pool_fwd = tt_cpu_pool_fwd;
  b->pool_bwd = tt_cpu_pool_bwd;
  b->gap_fwd = tt_cpu_gap_fwd;
  b->gap_bwd = tt_cpu_gap_bwd;
  b->act_fwd = tt_cpu_act_fwd;
  b->act_bwd = tt_cpu_act_bwd;
  b->add = tt_cpu_add;
  b->accumulate = tt_cpu_accumulate;
  b->dropout_fwd = tt_cpu_dropout_fwd;
  b->dropout_bwd = tt_cpu_dropout_bwd;
  b->channel_copy = tt_cpu_channel_copy;
  b->cast = tt_cpu_cast;
  b->normalize_u8 = tt_cpu_normalize_u8;
  b->softmax_ce = tt_cpu_softmax_ce;
  b->sgd_update = tt_cpu_sgd_update;
  b->adam_update = tt_cpu_adam_update;
  b->check_finite = tt_cpu_check_finite;
  return b;
}
