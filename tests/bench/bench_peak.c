/* tests/bench/bench_peak.c — the CPU's attainable matmul rate through oneDNN, in fp32 and bf16:
 * the "peak" that tests/bench/cpu_vs_torch.py divides each network's achieved FLOP rate by.
 * Prints numbers; never passes or fails.
 *
 *   build/bench/bench_peak [THREADS] [SIZE] [SECONDS]
 *
 * Defaults: all cores, 2048, 1.0. One square matmul C[SIZE x SIZE] = A[SIZE x SIZE] x B[SIZE x SIZE]
 * per data type: fp32 (A, B, C fp32) and bf16 (A, B bf16, C fp32, as a bf16 convolution or
 * linear layer accumulates). A is plain row-major; B is in whatever blocked layout oneDNN's
 * matmul prefers (format "any": a network's weights are laid out once, not per call), so the
 * figure is what the library can reach, not what a plain-layout call would. Each matmul runs
 * once untimed (JIT, first touch), then repeatedly for SECONDS; the best and the median of the
 * timed calls are printed as GFLOP/s (2 * SIZE^3 flops per call), with the implementation
 * oneDNN chose and the ISA it dispatched to. A data type oneDNN cannot run here (bf16 on a CPU
 * without AVX-512) is reported as unavailable and the program still exits 0.
 *
 * Output lines the benchmark script reads:
 *   peak fp32: best 123.4 GFLOP/s, median 120.1 GFLOP/s (N calls, impl brg:avx512_core)
 *   peak bf16: unavailable (reason)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "kernels/cpu/cpu_internal.h" /* tt_cpu_dnnl_isa_name: the name tinytrain --version prints */

static double peak_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int peak_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Any failing oneDNN call: say which and why (the caller reports the type as unavailable). */
#define PEAK_CHECK(call, why)                                                                                  \
  do {                                                                                                        \
    dnnl_status_t s_ = (call);                                                                                \
    if (s_ != dnnl_success) {                                                                                 \
      snprintf(why, 256, "%s failed: %s (status %d)", #call, dnnl_status2str(s_), (int)s_);                   \
      goto done;                                                                                              \
    }                                                                                                         \
  } while (0)

/* Times one data type. Returns 0 and fills best/median (GFLOP/s), calls and impl; -1 with why. */
static int peak_run(dnnl_engine_t eng, dnnl_stream_t st, dnnl_data_type_t dt, int64_t n, double seconds, double *best,
                    double *median, int *calls, char *impl, char *why) {
  dnnl_memory_desc_t a_md, b_any, c_md;
  const dnnl_memory_desc_t *b_md;
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t prim = NULL;
  dnnl_memory_t a = NULL, b = NULL, c = NULL;
  const char *info = NULL;
  double *t = NULL;
  int rc = -1, cap = 1 << 16, k = 0;
  dnnl_dims_t dims; /* the header declares it DNNL_MAX_NDIMS long; 2 are used */
  memset(dims, 0, sizeof dims);
  dims[0] = n, dims[1] = n;
  PEAK_CHECK(dnnl_memory_desc_init_by_tag(&a_md, 2, dims, dt, dnnl_ab), why);
  PEAK_CHECK(dnnl_memory_desc_init_by_tag(&b_any, 2, dims, dt, dnnl_format_tag_any), why);
  PEAK_CHECK(dnnl_memory_desc_init_by_tag(&c_md, 2, dims, dnnl_f32, dnnl_ab), why);
  PEAK_CHECK(dnnl_matmul_desc_init(&desc, &a_md, &b_any, NULL, &c_md), why);
  PEAK_CHECK(dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL), why);
  PEAK_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &info), why);
  snprintf(impl, 128, "%s", info ? info : "?");
  b_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  if (!b_md) {
    snprintf(why, 256, "oneDNN gave no weights layout for the matmul");
    goto done;
  }
  PEAK_CHECK(dnnl_primitive_create(&prim, pd), why);
  PEAK_CHECK(dnnl_memory_create(&a, &a_md, eng, DNNL_MEMORY_ALLOCATE), why);
  PEAK_CHECK(dnnl_memory_create(&b, b_md, eng, DNNL_MEMORY_ALLOCATE), why);
  PEAK_CHECK(dnnl_memory_create(&c, &c_md, eng, DNNL_MEMORY_ALLOCATE), why);
  { /* every byte 0x3C: 0x3C3C3C3C is the fp32 0.0115 and 0x3C3C the bf16 0.0115, normal numbers in
     * both (denormals would slow some paths down and understate the peak) */
    void *h;
    PEAK_CHECK(dnnl_memory_get_data_handle(a, &h), why);
    memset(h, 0x3C, dnnl_memory_desc_get_size(&a_md));
    PEAK_CHECK(dnnl_memory_get_data_handle(b, &h), why);
    memset(h, 0x3C, dnnl_memory_desc_get_size(b_md));
    PEAK_CHECK(dnnl_memory_get_data_handle(c, &h), why);
    memset(h, 0, dnnl_memory_desc_get_size(&c_md));
  }
  t = (double *)malloc(sizeof(double) * (size_t)cap);
  if (!t) {
    snprintf(why, 256, "out of memory for %d timings", cap);
    goto done;
  }
  {
    dnnl_exec_arg_t args[3];
    double t_end;
    args[0].arg = DNNL_ARG_SRC, args[0].memory = a;
    args[1].arg = DNNL_ARG_WEIGHTS, args[1].memory = b;
    args[2].arg = DNNL_ARG_DST, args[2].memory = c;
    /* untimed: JIT code generation, first touch of the buffers */
    PEAK_CHECK(dnnl_primitive_execute(prim, st, 3, args), why);
    PEAK_CHECK(dnnl_stream_wait(st), why);
    t_end = peak_now() + seconds;
    while (k < cap && (k < 3 || peak_now() < t_end)) { /* at least 3 timed calls */
      double t0 = peak_now();
      PEAK_CHECK(dnnl_primitive_execute(prim, st, 3, args), why);
      PEAK_CHECK(dnnl_stream_wait(st), why);
      t[k++] = peak_now() - t0;
    }
  }
  qsort(t, (size_t)k, sizeof(double), peak_cmp);
  *best = 2.0 * (double)n * (double)n * (double)n / t[0] / 1e9;
  *median = 2.0 * (double)n * (double)n * (double)n / t[k / 2] / 1e9;
  *calls = k;
  rc = 0;
done:
  free(t);
  if (a) dnnl_memory_destroy(a);
  if (b) dnnl_memory_destroy(b);
  if (c) dnnl_memory_destroy(c);
  if (prim) dnnl_primitive_destroy(prim);
  if (pd) dnnl_primitive_desc_destroy(pd);
  return rc;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 0;
  long size = argc > 2 ? atol(argv[2]) : 2048;
  double seconds = argc > 3 ? atof(argv[3]) : 1.0;
  dnnl_engine_t eng = NULL;
  dnnl_stream_t st = NULL;
  const dnnl_version_t *v = dnnl_version();
  static const dnnl_data_type_t types[2] = {dnnl_f32, dnnl_bf16};
  static const char *const names[2] = {"fp32", "bf16"};
  if (size < 16 || size > 32768 || seconds < 0.0 || threads < 0) {
    fprintf(stderr, "usage: bench_peak [THREADS] [SIZE 16..32768] [SECONDS]\n");
    return 2;
  }
#ifdef _OPENMP
  if (threads > 0) omp_set_num_threads(threads);
  omp_set_dynamic(0); /* oneDNN splits its work for exactly the team it asks for */
  threads = omp_get_max_threads();
#else
  threads = 1;
#endif
  if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success || dnnl_stream_create(&st, eng, dnnl_stream_default_flags)) {
    fprintf(stderr, "bench_peak: oneDNN could not create a CPU engine and stream\n");
    return 1;
  }
  printf("oneDNN %d.%d.%d, ISA %s, %d threads, %ldx%ld matmul, %.2f s per type\n", v->major, v->minor, v->patch, tt_cpu_dnnl_isa_name(dnnl_get_effective_cpu_isa()),
         threads, size, size, seconds);
  for (int i = 0; i < 2; i++) {
    double best = 0, median = 0;
    int calls = 0;
    char impl[128], why[256];
    impl[0] = why[0] = 0;
    if (peak_run(eng, st, types[i], (int64_t)size, seconds, &best, &median, &calls, impl, why))
      printf("peak %s: unavailable (%s)\n", names[i], why);
    else
      printf("peak %s: best %.1f GFLOP/s, median %.1f GFLOP/s (%d calls, impl %s)\n", names[i], best, median, calls, impl);
    fflush(stdout);
  }
  dnnl_stream_destroy(st);
  dnnl_engine_destroy(eng);
  return 0;
}
