/* kernels/cpu/cpu_vec.h — what the CPU backend's own vectorised loops share: the clone
 * attribute, the stack chunk size, the threads' fixed shares of a tensor, loads and stores per
 * storage type and the generator that writes one loop body in fp32 and bf16 storage.
 *
 * Clones: each span function is compiled for AVX-512, AVX2 and the baseline (GCC/Clang
 * target_clones, picked once per process by the loader; the CUDA compiler's host pass gets the
 * baseline only, as does any other compiler). A span runs over fixed per-thread shares of the
 * tensor (cpu_vec_share), so results never depend on scheduling or the thread count.
 *
 * Storage: fp32 is read and written as is. bf16 is the high half of an fp32: widened exactly by
 * a shift and rounded to nearest even with tt_bf16_from_f32's rule (a NaN stays a NaN with its
 * quiet bit set), as integer arithmetic the compiler vectorises (not AVX512_BF16's
 * vcvtneps2bf16: it flushes denormals, the reference does not). fp16 converts element by
 * element through the reference's conversions (the baseline build has no F16C), into and out of
 * stack chunks of CPU_VEC_CHUNK floats. Intermediate fp32 values live in such chunks: nothing is
 * allocated.
 *
 * The generator: CPU_VEC_TWINS(DEF) expands DEF(sfx, T, LD, ST) once for fp32 storage
 * (f32, float) and once for bf16 (bf16, uint16_t); DEF writes its body once with LD(p, i, f)
 * (f = element i of p as fp32) and ST(p, i, f) (element i of p = f, rounded to the storage), so
 * the two forms run the same float expressions in the same order. Write `#pragma omp simd` in a
 * DEF body as CPU_VEC_SIMD or _Pragma("omp simd ...").
 */
#ifndef TT_CPU_VEC_H
#define TT_CPU_VEC_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../ref/ref.h"

#if defined(__GNUC__) && !defined(__CUDACC__) && (defined(__x86_64__) || defined(__i386__))
#define CPU_VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_VEC_CLONES
#endif
/* The clones of the functions defined in this header, which every file including it compiles:
 * GCC keeps each file's resolver local, clang 14 makes it a global symbol of the same name in
 * every file (`multiple definition of cpu_vec_bf_widen.resolver` when linking the clang fuzz
 * build), so under clang they are compiled without clones (the fuzz targets' speed does not matter). */
#if defined(__clang__)
#define CPU_VEC_CLONES_HDR
#else
#define CPU_VEC_CLONES_HDR CPU_VEC_CLONES
#endif

#define CPU_VEC_CHUNK 1024 /* fp32 elements per stack chunk (4 KiB) */
#define CPU_VEC_SIMD _Pragma("omp simd")

/* ---- loads and stores of element i as fp32 (statements; f an lvalue float) ---- */
#define CPU_VEC_LD_F32(p, i, f) \
  do {                          \
    (f) = (p)[i];               \
  } while (0)
#define CPU_VEC_ST_F32(p, i, f) \
  do {                          \
    (p)[i] = (f);               \
  } while (0)
/* memcpy, not a cast pointer: no aliasing assumptions (it compiles to a move) */
#define CPU_VEC_LD_BF16(p, i, f)          \
  do {                                    \
    uint32_t u_ = (uint32_t)(p)[i] << 16; \
    memcpy(&(f), &u_, 4);                 \
  } while (0)
#define CPU_VEC_ST_BF16(p, i, f)                                                                                  \
  do {                                                                                                            \
    uint32_t u_;                                                                                                  \
    memcpy(&u_, &(f), 4);                                                                                         \
    (p)[i] = (uint16_t)((u_ & 0x7fffffffu) > 0x7f800000u ? (u_ >> 16) | 0x40u : (u_ + 0x7fffu + ((u_ >> 16) & 1u)) >> 16); \
  } while (0)

/* DEF's fp32 and bf16 forms (see the header) */
#define CPU_VEC_TWINS(DEF)                                     \
  DEF(f32, float, CPU_VEC_LD_F32, CPU_VEC_ST_F32)              \
  DEF(bf16, uint16_t, CPU_VEC_LD_BF16, CPU_VEC_ST_BF16)

/* ---- the threads' shares ---- */

/* The share [lo, hi) of count elements that thread t of nt takes: equal shares rounded to 64
 * elements (whole 32-bit mask words, whole cache lines of fp32), fixed by (count, nt). */
static inline void cpu_vec_share(size_t count, int t, int nt, size_t *lo, size_t *hi) {
  size_t per = (count + (size_t)nt - 1) / (size_t)nt;
  per = (per + 63u) & ~(size_t)63u;
  *lo = (size_t)t * per;
  *hi = *lo + per;
  if (*lo > count) *lo = count;
  if (*hi > count) *hi = count;
}

/* the calling thread's share of a parallel region (the whole range outside one) */
static inline void cpu_vec_my_share(size_t count, size_t *lo, size_t *hi) {
#ifdef _OPENMP
  cpu_vec_share(count, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
#else
  cpu_vec_share(count, 0, 1, lo, hi);
#endif
}

/* the length of the chunk at c0 of a span ending at hi */
static inline size_t cpu_vec_chunk(size_t c0, size_t hi) { return hi - c0 < CPU_VEC_CHUNK ? hi - c0 : CPU_VEC_CHUNK; }

/* ---- whole spans: bf16 widened and rounded, copies, y = beta*y + x ---- */

/* d[i] = s[i] widened */
static inline CPU_VEC_CLONES_HDR void cpu_vec_bf_widen(const uint16_t *s, float *d, size_t n) {
  size_t i;
#pragma omp simd /* without it GCC 12 -O2 leaves this loop and the next scalar */
  for (i = 0; i < n; i++) CPU_VEC_LD_BF16(s, i, d[i]);
}

/* d[i] = s[i] rounded to nearest even (tt_bf16_from_f32) */
static inline CPU_VEC_CLONES_HDR void cpu_vec_bf_round(const float *s, uint16_t *d, size_t n) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) CPU_VEC_ST_BF16(d, i, s[i]);
}

/* y = beta*y + x (beta 0: y = x, never reading y) */
static inline CPU_VEC_CLONES_HDR void cpu_vec_acc_span(const float *x, float *y, size_t n, float beta) {
  size_t i;
  if (beta == 0.0f) {
#pragma omp simd
    for (i = 0; i < n; i++) y[i] = x[i];
  } else {
#pragma omp simd
    for (i = 0; i < n; i++) y[i] = beta * y[i] + x[i];
  }
}

/* y = x over count elements of es bytes each, nt threads' shares in parallel */
static inline void cpu_vec_copy(int nt, size_t count, size_t es, const void *x, void *y) {
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi;
    cpu_vec_my_share(count, &lo, &hi);
    if (hi > lo) memcpy((char *)y + lo * es, (const char *)x + lo * es, (hi - lo) * es);
  }
}

/* ---- any storage (fp32, bf16, fp16) to and from fp32 chunks ---- */

/* d[0..n) = element off.. of p (bf16 or fp16) as fp32 */
static inline void cpu_vec_widen(tt_dtype dt, const void *p, size_t off, float *d, size_t n) {
  size_t i;
  if (dt == TT_BF16) {
    cpu_vec_bf_widen((const uint16_t *)p + off, d, n);
    return;
  }
  for (i = 0; i < n; i++) d[i] = tt_ref_h2f(((const uint16_t *)p)[off + i]);
}

/* element off.. of p (bf16 or fp16) = s[0..n) rounded */
static inline void cpu_vec_narrow(tt_dtype dt, const float *s, void *p, size_t off, size_t n) {
  size_t i;
  if (dt == TT_BF16) {
    cpu_vec_bf_round(s, (uint16_t *)p + off, n);
    return;
  }
  for (i = 0; i < n; i++) ((uint16_t *)p)[off + i] = tt_ref_f2h(s[i]);
}

/* x's n values from element off as fp32: x itself for fp32, else widened into buf */
static inline const float *cpu_vec_view(tt_dtype dt, const void *x, size_t off, float *buf, size_t n) {
  if (dt == TT_F32) return (const float *)x + off;
  cpu_vec_widen(dt, x, off, buf, n);
  return buf;
}

#endif
