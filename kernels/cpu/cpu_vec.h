/* kernels/cpu/cpu_vec.h — what the CPU backend's own vectorised loops share: the generator of
 * their per-ISA copies, the stack chunk size, the threads' fixed shares of a tensor, loads and
 * stores per storage type and the generator that writes one loop body in fp32 and bf16 storage.
 *
 * Per-ISA copies: CPU_VEC_FN(name, (params), (args), { body }) (CPU_VEC_FN_RET(type, ...) for a
 * function that returns a value) compiles one body three times, as name_avx512f
 * (AVX-512 F, BW, VL and DQ in 512-bit vectors: CPU_VEC_AVX512_), name_avx2 (target("avx2")) and
 * name_base (the build's baseline, SSE2 on
 * x86-64), and defines name itself as the dispatcher that calls the copy of tt_cpu_vec_level: a
 * process-wide level set once, when the first CPU backend is created or the ISA is first asked
 * (cpu_dnnl.c: tt_cpu_isa_hold, from TINYTRAIN_CPU_ISA and __builtin_cpu_supports). The
 * copy is compiled on its own (noipa: no value ranges carried in from its callers), as the GCC
 * target_clones they replaced were; no FMA is used, which ISO C's -ffp-contract=off forbids.
 * Unlike the loader's pick, the level can be held below the CPU's (the AVX2 form on an AVX-512
 * machine: CI's rerun). Where the copies cannot be made (the CUDA compiler's host
 * pass, non-x86 targets, compilers without target attributes) CPU_VEC_COPIES is 0 and name is
 * the baseline body alone. A span runs over fixed per-thread shares of the tensor
 * (cpu_vec_share), so results never depend on scheduling or the thread count; the levels differ
 * only where a loop reduces in vector lanes (batch norm's sums, attention's row sums: the
 * lane count sets the order), elementwise loops give the same bits at every level.
 * `#pragma` cannot stand inside a macro's arguments: write it as CPU_VEC_SIMD or
 * _Pragma("omp simd ...") in a body.
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
 * the two forms run the same float expressions in the same order. A DEF body that is a
 * CPU_VEC_FN gives 2 dtypes x 3 ISAs from one loop written once.
 */
#ifndef TT_CPU_VEC_H
#define TT_CPU_VEC_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../ref/ref.h"

/* The per-ISA copies (see the header). GCC and clang on x86 outside the CUDA compiler's pass. */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && (defined(__x86_64__) || defined(__i386__))
#define CPU_VEC_COPIES 1
#else
#define CPU_VEC_COPIES 0
#endif

/* The levels, in tt_cpu_vec_level: the copy each call runs. */
#define CPU_VEC_BASE 0
#define CPU_VEC_AVX2 1
#define CPU_VEC_AVX512F 2

#ifdef __cplusplus
extern "C" {
#endif
/* The level every dispatcher reads (cpu_dnnl.c sets it once per process, tt_cpu_isa_hold; a
 * test may set it between calls to run every copy). CPU_VEC_BASE until then. */
extern int tt_cpu_vec_level;
#ifdef __cplusplus
}
#endif

#if CPU_VEC_COPIES
/* each copy compiled on its own, as a target_clones clone was (clang has no noipa) */
#if defined(__clang__)
#define CPU_VEC_OPAQUE_ __attribute__((noinline))
#else
#define CPU_VEC_OPAQUE_ __attribute__((noipa))
#endif
/* The AVX-512 copy: AVX-512F with BW, VL and DQ (every AVX-512 CPU since Skylake-SP, and Zen 4;
 * tt_cpu_vec_cpu_level asks for all four), in 512-bit vectors. With target("avx512f") alone GCC
 * 12 wrote these loops in 256-bit ymm registers (its generic tuning prefers 256 bits, and the
 * 16-bit loads and stores of bf16 want BW): ResNet-50's bf16 step at batch 16 on the AMX Xeon
 * took 743 to 786 ms that way and 683 to 707 ms in zmm (bench_step, 3 runs each). Clang takes
 * the width from min_vector_width, not from the target string (which it would ignore whole). */
#if defined(__clang__)
#define CPU_VEC_AVX512_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), min_vector_width(512)))
#else
#define CPU_VEC_AVX512_ __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")))
#endif
#define CPU_VEC_COPIES_(ret, name, params, ...)                                                       \
  static CPU_VEC_OPAQUE_ CPU_VEC_AVX512_ ret name##_avx512f params __VA_ARGS__                        \
  static CPU_VEC_OPAQUE_ __attribute__((target("avx2"))) ret name##_avx2 params __VA_ARGS__           \
  static CPU_VEC_OPAQUE_ ret name##_base params __VA_ARGS__
#define CPU_VEC_FN(name, params, args, ...)                                     \
  CPU_VEC_COPIES_(void, name, params, __VA_ARGS__)                              \
  static inline void name params {                                             \
    if (tt_cpu_vec_level == CPU_VEC_AVX512F)                                    \
      name##_avx512f args;                                                      \
    else if (tt_cpu_vec_level == CPU_VEC_AVX2)                                  \
      name##_avx2 args;                                                         \
    else                                                                        \
      name##_base args;                                                         \
  }
#define CPU_VEC_FN_RET(ret, name, params, args, ...)                            \
  CPU_VEC_COPIES_(ret, name, params, __VA_ARGS__)                               \
  static inline ret name params {                                              \
    return tt_cpu_vec_level == CPU_VEC_AVX512F ? name##_avx512f args            \
           : tt_cpu_vec_level == CPU_VEC_AVX2  ? name##_avx2 args               \
                                               : name##_base args;              \
  }
#else
#define CPU_VEC_FN(name, params, args, ...) static inline void name params __VA_ARGS__
#define CPU_VEC_FN_RET(ret, name, params, args, ...) static inline ret name params __VA_ARGS__
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
CPU_VEC_FN(cpu_vec_bf_widen, (const uint16_t *s, float *d, size_t n), (s, d, n), {
  size_t i;
  CPU_VEC_SIMD /* without it GCC 12 -O2 leaves this loop and the next scalar */
  for (i = 0; i < n; i++) CPU_VEC_LD_BF16(s, i, d[i]);
})

/* d[i] = s[i] rounded to nearest even (tt_bf16_from_f32) */
CPU_VEC_FN(cpu_vec_bf_round, (const float *s, uint16_t *d, size_t n), (s, d, n), {
  size_t i;
  CPU_VEC_SIMD
  for (i = 0; i < n; i++) CPU_VEC_ST_BF16(d, i, s[i]);
})

/* y = beta*y + x (beta 0: y = x, never reading y) */
CPU_VEC_FN(cpu_vec_acc_span, (const float *x, float *y, size_t n, float beta), (x, y, n, beta), {
  size_t i;
  if (beta == 0.0f) {
    CPU_VEC_SIMD
    for (i = 0; i < n; i++) y[i] = x[i];
  } else {
    CPU_VEC_SIMD
    for (i = 0; i < n; i++) y[i] = beta * y[i] + x[i];
  }
})

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
