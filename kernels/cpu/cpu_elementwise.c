/* kernels/cpu/cpu_elementwise.c — the fp32 elementwise ops and batch-norm loops the CPU
 * backend runs itself, vectorised; bf16 ReLU, ReLU6, add and accumulate run the same fp32 spans
 * over chunks widened from bf16 and rounded back (tt_bf16_from_f32's rule, vectorised), so they
 * give the reference's bits; batch norm runs here in fp32, bf16 and fp16 storage; the rest of
 * fp16 goes to the reference loops.
 *
 * Why not oneDNN: its eltwise ReLU (vmaxps against 0) turns NaN into 0, where ours and
 * PyTorch's propagate it, and oneDNN 2.6's plain-layout batch norm (ncsp) measured no faster
 * than the scalar reference loops. Why not the reference loops: they are scalar (the baseline
 * x86-64 build has SSE2 only, and a ReLU written with a branch mispredicts on every other
 * element). Here each loop is a span function compiled for AVX-512, AVX2 and the baseline
 * (GCC/Clang target_clones, picked once per process by the loader; the CUDA compiler's host
 * pass gets the baseline only), run over fixed per-thread spans of the tensor.
 *
 * Results equal the reference's elementwise (the same float expressions) and, for batch norm,
 * agree to float rounding: sums are taken in float over blocks (TT_CPU_EW_BLOCK elements of a
 * plane, or a row block's partial vector in NHWC) in vector lanes, the blocks added in double,
 * in an order fixed by the shape and the machine's vector width (so bit-identical run to run on
 * one machine, for any thread count). Batch norm in bf16 storage runs the same fp32 expressions
 * in spans that widen and round inside the vectorised loop (tt_bf16_from_f32's rule, once on
 * store); fp16 runs the fp32 spans on chunks widened on the stack.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_internal.h"

#if defined(__GNUC__) && !defined(__CUDACC__) && (defined(__x86_64__) || defined(__i386__))
#define CPU_EW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_EW_CLONES
#endif

#define TT_CPU_EW_BLOCK 4096 /* floats summed in vector lanes before going to double */

/* ---- spans: n elements from the given pointers ---- */

static CPU_EW_CLONES void cpu_ew_relu_span(const float *x, float *y, size_t n) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) {
    float v = x[i];
    y[i] = (v > 0.0f || v != v) ? v : 0.0f; /* tt_act_value(TT_ACT_RELU) */
  }
}

static CPU_EW_CLONES void cpu_ew_relu6_span(const float *x, float *y, size_t n) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) {
    float v = x[i];
    y[i] = v != v ? v : (v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v));
  }
}

/* dx = beta*dx + (s > 0 ? g : 0): ReLU's backward from its output s */
static CPU_EW_CLONES void cpu_ew_relu_bwd_span(const float *s, const float *g, float *dx, size_t n, float beta) {
  size_t i;
  if (beta == 0.0f) {
#pragma omp simd
    for (i = 0; i < n; i++) dx[i] = s[i] > 0.0f ? g[i] : 0.0f;
  } else {
#pragma omp simd
    for (i = 0; i < n; i++) dx[i] = beta * dx[i] + (s[i] > 0.0f ? g[i] : 0.0f);
  }
}

/* dx = beta*dx + (0 < s < 6 ? g : 0): ReLU6's */
static CPU_EW_CLONES void cpu_ew_relu6_bwd_span(const float *s, const float *g, float *dx, size_t n, float beta) {
  size_t i;
  if (beta == 0.0f) {
#pragma omp simd
    for (i = 0; i < n; i++) dx[i] = (s[i] > 0.0f && s[i] < 6.0f) ? g[i] : 0.0f;
  } else {
#pragma omp simd
    for (i = 0; i < n; i++) dx[i] = beta * dx[i] + ((s[i] > 0.0f && s[i] < 6.0f) ? g[i] : 0.0f);
  }
}

static CPU_EW_CLONES void cpu_ew_add_span(const float *a, const float *b, float *y, size_t n) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* y = beta*y + x (beta 0: y = x, never reading y) */
static CPU_EW_CLONES void cpu_ew_acc_span(const float *x, float *y, size_t n, float beta) {
  size_t i;
  if (beta == 0.0f) {
#pragma omp simd
    for (i = 0; i < n; i++) y[i] = x[i];
  } else {
#pragma omp simd
    for (i = 0; i < n; i++) y[i] = beta * y[i] + x[i];
  }
}

/* The span [lo, hi) of count elements that thread t of nt takes: equal shares rounded to 64
 * elements, fixed by (count, nt), so results never depend on scheduling. */
static void cpu_ew_share(size_t count, int t, int nt, size_t *lo, size_t *hi) {
  size_t per = (count + (size_t)nt - 1) / (size_t)nt;
  per = (per + 63u) & ~(size_t)63u;
  *lo = (size_t)t * per;
  *hi = *lo + per;
  if (*lo > count) *lo = count;
  if (*hi > count) *hi = count;
}

/* the calling thread's span of a parallel region (the whole range outside one) */
static void cpu_ew_my_share(size_t count, size_t *lo, size_t *hi) {
#ifdef _OPENMP
  cpu_ew_share(count, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
#else
  cpu_ew_share(count, 0, 1, lo, hi);
#endif
}

/* What each thread runs: kind 0 relu, 1 relu6, 2 relu bwd, 3 relu6 bwd, 4 add, 5 accumulate. */
static void cpu_ew_run(tt_backend *b, int kind, size_t count, const float *p0, const float *p1, float *out, float beta) {
  int nt = count > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi;
    cpu_ew_my_share(count, &lo, &hi);
    if (hi > lo) switch (kind) {
        case 0: cpu_ew_relu_span(p0 + lo, out + lo, hi - lo); break;
        case 1: cpu_ew_relu6_span(p0 + lo, out + lo, hi - lo); break;
        case 2: cpu_ew_relu_bwd_span(p0 + lo, p1 + lo, out + lo, hi - lo, beta); break;
        case 3: cpu_ew_relu6_bwd_span(p0 + lo, p1 + lo, out + lo, hi - lo, beta); break;
        case 4: cpu_ew_add_span(p0 + lo, p1 + lo, out + lo, hi - lo); break;
        default: cpu_ew_acc_span(p0 + lo, out + lo, hi - lo, beta); break;
      }
  }
}

/* ---- bf16: chunks of CPU_EW_BF_CHUNK elements widened to fp32 on the stack, the fp32 span,
 * then rounded back to nearest even (NaN kept a NaN with its quiet bit set), as the reference's
 * tt_ref_ld / tt_ref_st do element by element ---- */
#define CPU_EW_BF_CHUNK 1024

static CPU_EW_CLONES void cpu_ew_bf_widen(const uint16_t *s, float *d, size_t n) {
  size_t i;
#pragma omp simd /* without it GCC 12 -O2 leaves this loop and the next scalar */
  for (i = 0; i < n; i++) {
    uint32_t u = (uint32_t)s[i] << 16;
    memcpy(d + i, &u, 4);
  }
}

static CPU_EW_CLONES void cpu_ew_bf_round(const float *s, uint16_t *d, size_t n) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, s + i, 4);
    d[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

/* cpu_ew_run's kinds on bf16 tensors (out is read too when the kind adds into it: beta != 0). */
static void cpu_ew_run_bf16(tt_backend *b, int kind, size_t count, const uint16_t *p0, const uint16_t *p1, uint16_t *out,
                            float beta) {
  int nt = count > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
  int reads_out = (kind == 2 || kind == 3 || kind == 5) && beta != 0.0f;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi, c0;
    float a[CPU_EW_BF_CHUNK], g[CPU_EW_BF_CHUNK], o[CPU_EW_BF_CHUNK];
    cpu_ew_my_share(count, &lo, &hi);
    for (c0 = lo; c0 < hi; c0 += CPU_EW_BF_CHUNK) {
      size_t m = hi - c0 < CPU_EW_BF_CHUNK ? hi - c0 : CPU_EW_BF_CHUNK;
      cpu_ew_bf_widen(p0 + c0, a, m);
      if (p1) cpu_ew_bf_widen(p1 + c0, g, m);
      if (reads_out) cpu_ew_bf_widen(out + c0, o, m);
      switch (kind) {
        case 0: cpu_ew_relu_span(a, o, m); break;
        case 1: cpu_ew_relu6_span(a, o, m); break;
        case 2: cpu_ew_relu_bwd_span(a, g, o, m, beta); break;
        case 3: cpu_ew_relu6_bwd_span(a, g, o, m, beta); break;
        case 4: cpu_ew_add_span(a, g, o, m); break;
        default: cpu_ew_acc_span(a, o, m, beta); break;
      }
      cpu_ew_bf_round(o, out + c0, m);
    }
  }
}

/* y = x over count elements of es bytes each, the threads' shares in parallel (a gradient's
 * first writer: backward add's copy of dy into the branch that cannot alias it) */
static void cpu_ew_copy(tt_backend *b, size_t count, size_t es, const void *x, void *y) {
  int nt = count > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi;
    cpu_ew_my_share(count, &lo, &hi);
    if (hi > lo) memcpy((char *)y + lo * es, (const char *)x + lo * es, (hi - lo) * es);
  }
}

void tt_cpu_combine(tt_backend *b, tt_dtype dt, tt_dtype sdt, const void *x, void *y, size_t count, float beta) {
  int nt = count > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
  const float *xf = (const float *)x;
  if (dt == TT_F32 && sdt == TT_F32) {
    if (beta == 0.0f)
      cpu_ew_copy(b, count, sizeof(float), x, y);
    else
      cpu_ew_run(b, 5, count, xf, NULL, (float *)y, beta);
    return;
  }
  if (dt == TT_BF16 && sdt == TT_BF16 && beta == 0.0f) {
    cpu_ew_copy(b, count, 2, x, y);
    return;
  }
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi, c0, i;
    float a[CPU_EW_BF_CHUNK], o[CPU_EW_BF_CHUNK];
    cpu_ew_my_share(count, &lo, &hi);
    if (dt != TT_BF16 || (sdt != TT_F32 && sdt != TT_BF16)) { /* fp16: the reference's loads and stores */
      for (i = lo; i < hi; i++) tt_ref_st_beta(dt, y, i, tt_ref_ld(sdt, x, i), beta);
    } else if (beta == 0.0f) { /* fp32 into bf16 */
      if (hi > lo) cpu_ew_bf_round(xf + lo, (uint16_t *)y + lo, hi - lo);
    } else {
      for (c0 = lo; c0 < hi; c0 += CPU_EW_BF_CHUNK) {
        size_t m = hi - c0 < CPU_EW_BF_CHUNK ? hi - c0 : CPU_EW_BF_CHUNK;
        const float *src = xf + c0;
        if (sdt == TT_BF16) cpu_ew_bf_widen((const uint16_t *)x + c0, a, m), src = a;
        cpu_ew_bf_widen((const uint16_t *)y + c0, o, m);
        cpu_ew_acc_span(src, o, m, beta);
        cpu_ew_bf_round(o, (uint16_t *)y + c0, m);
      }
    }
  }
}

int tt_cpu_act_fwd(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *x, void *y) {
  if (dt == TT_F32 && (a == TT_ACT_GELU_ERF || a == TT_ACT_GELU_TANH) && count && x && y)
    return tt_cpu_gelu_fwd(b, a, count, (const float *)x, (float *)y);
  if (dt == TT_BF16 && (a == TT_ACT_RELU || a == TT_ACT_RELU6) && x && y) {
    cpu_ew_run_bf16(b, a == TT_ACT_RELU ? 0 : 1, count, (const uint16_t *)x, NULL, (uint16_t *)y, 0.0f);
    return 0;
  }
  if (dt != TT_F32 || (a != TT_ACT_RELU && a != TT_ACT_RELU6) || !x || !y) return tt_ref_act_fwd(b, a, count, dt, x, y);
  cpu_ew_run(b, a == TT_ACT_RELU ? 0 : 1, count, (const float *)x, NULL, (float *)y, 0.0f);
  return 0;
}

int tt_cpu_act_bwd(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *saved, const void *dy, void *dx,
                   float beta) {
  if (dt == TT_F32 && (a == TT_ACT_GELU_ERF || a == TT_ACT_GELU_TANH) && count && saved && dy && dx && beta == 0.0f)
    return tt_cpu_gelu_bwd(b, a, count, (const float *)saved, (const float *)dy, (float *)dx);
  if ((dt != TT_F32 && dt != TT_BF16) || (a != TT_ACT_RELU && a != TT_ACT_RELU6) || !saved || !dy || !dx ||
      (dx == dy && beta != 0.0f))
    return tt_ref_act_bwd(b, a, count, dt, saved, dy, dx, beta);
  if (dt == TT_BF16) {
    cpu_ew_run_bf16(b, a == TT_ACT_RELU ? 2 : 3, count, (const uint16_t *)saved, (const uint16_t *)dy, (uint16_t *)dx, beta);
    return 0;
  }
  cpu_ew_run(b, a == TT_ACT_RELU ? 2 : 3, count, (const float *)saved, (const float *)dy, (float *)dx, beta);
  return 0;
}

int tt_cpu_add(tt_backend *b, size_t count, tt_dtype dt, const void *a, const void *b2, void *y) {
  if ((dt != TT_F32 && dt != TT_BF16) || !a || !b2 || !y) return tt_ref_add(b, count, dt, a, b2, y);
  if (dt == TT_BF16) {
    cpu_ew_run_bf16(b, 4, count, (const uint16_t *)a, (const uint16_t *)b2, (uint16_t *)y, 0.0f);
    return 0;
  }
  cpu_ew_run(b, 4, count, (const float *)a, (const float *)b2, (float *)y, 0.0f);
  return 0;
}

int tt_cpu_accumulate(tt_backend *b, size_t count, tt_dtype dt, const void *x, void *y, float beta) {
  if ((dt != TT_F32 && dt != TT_BF16) || !x || !y) return tt_ref_accumulate(b, count, dt, x, y, beta);
  if (beta == 0.0f) { /* a copy: bf16's widen and round give the same bits back (a NaN's quiet bit aside) */
    if (x != y) cpu_ew_copy(b, count, tt_dtype_size(dt), x, y);
    return 0;
  }
  if (dt == TT_BF16) {
    cpu_ew_run_bf16(b, 5, count, (const uint16_t *)x, NULL, (uint16_t *)y, beta);
    return 0;
  }
  cpu_ew_run(b, 5, count, (const float *)x, NULL, (float *)y, beta);
  return 0;
}

/* ------------------------------- batch-norm rows -------------------------------------- */

/* sums of d = x - shift and of d^2, added into *s and *q (one pass for the statistics) */
static CPU_EW_CLONES void cpu_ew_sum2(const float *x, size_t n, float shift, double *s, double *q) {
  size_t i0, i;
  for (i0 = 0; i0 < n; i0 += TT_CPU_EW_BLOCK) {
    size_t e = n - i0 < TT_CPU_EW_BLOCK ? n - i0 : TT_CPU_EW_BLOCK;
    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
    for (i = 0; i < e; i++) {
      float d = x[i0 + i] - shift;
      a += d;
      b += d * d;
    }
    *s += a;
    *q += b;
  }
}

/* sum of (x - m)^2 */
static CPU_EW_CLONES double cpu_ew_sqdev(const float *x, size_t n, float m) {
  double acc = 0.0;
  size_t i0, i;
  for (i0 = 0; i0 < n; i0 += TT_CPU_EW_BLOCK) {
    size_t e = n - i0 < TT_CPU_EW_BLOCK ? n - i0 : TT_CPU_EW_BLOCK;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (i = 0; i < e; i++) {
      float d = x[i0 + i] - m;
      s += d * d;
    }
    acc += s;
  }
  return acc;
}

/* y = (x - m) * k + sh */
static CPU_EW_CLONES void cpu_ew_affine(const float *x, float *y, size_t n, float m, float k, float sh) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) y[i] = (x[i] - m) * k + sh;
}

/* sums of dy and of dy * (x - m) */
static CPU_EW_CLONES void cpu_ew_bwd_sums(const float *x, const float *dy, size_t n, float m, double *sdy, double *sdyx) {
  size_t i0, i;
  for (i0 = 0; i0 < n; i0 += TT_CPU_EW_BLOCK) {
    size_t e = n - i0 < TT_CPU_EW_BLOCK ? n - i0 : TT_CPU_EW_BLOCK;
    float s = 0.0f, t = 0.0f;
#pragma omp simd reduction(+ : s, t)
    for (i = 0; i < e; i++) {
      float g = dy[i0 + i];
      s += g;
      t += g * (x[i0 + i] - m);
    }
    *sdy += s;
    *sdyx += t;
  }
}

/* dx = beta*dx + a * (dy - mdy - (x - m) * k), k = invstd * mean(dy * xhat) */
static CPU_EW_CLONES void cpu_ew_bwd_dx(const float *x, const float *dy, float *dx, size_t n, float m, float a, float mdy,
                                       float k, float beta) {
  size_t i;
  if (beta == 0.0f) {
#pragma omp simd
    for (i = 0; i < n; i++) dx[i] = a * (dy[i] - mdy - (x[i] - m) * k);
  } else {
#pragma omp simd
    for (i = 0; i < n; i++) dx[i] = beta * dx[i] + a * (dy[i] - mdy - (x[i] - m) * k);
  }
}

/* ---- storage widening for batch norm: fp16/bf16 chunks to fp32 on the stack and back ----
 * bf16 by integer shifts (cpu_ew_bf_widen/_round, vectorised, tt_bf16_from_f32's rounding);
 * fp16 element by element through the reference's conversions (no F16C in the baseline build). */
static void cpu_ew_widen(tt_dtype dt, const void *p, size_t off, float *d, size_t n) {
  size_t i;
  if (dt == TT_BF16) {
    cpu_ew_bf_widen((const uint16_t *)p + off, d, n);
    return;
  }
  for (i = 0; i < n; i++) d[i] = tt_ref_h2f(((const uint16_t *)p)[off + i]);
}

static void cpu_ew_narrow(tt_dtype dt, const float *s, void *p, size_t off, size_t n) {
  size_t i;
  if (dt == TT_BF16) {
    cpu_ew_bf_round(s, (uint16_t *)p + off, n);
    return;
  }
  for (i = 0; i < n; i++) ((uint16_t *)p)[off + i] = tt_ref_f2h(s[i]);
}

/* x's n values from element off as fp32: x itself for fp32, else widened into buf */
static const float *cpu_ew_view(tt_dtype dt, const void *x, size_t off, float *buf, size_t n) {
  if (dt == TT_F32) return (const float *)x + off;
  cpu_ew_widen(dt, x, off, buf, n);
  return buf;
}

/* ---- batch norm on planes: hw > 1, x [n, c, hw] (NCHW). A channel is one thread's: its n
 * planes are walked in order, in chunks of CPU_EW_BF_CHUNK (fp16/bf16, widened) or whole
 * (fp32, the span functions' TT_CPU_EW_BLOCK blocks), so the bits depend on the shape only. ---- */

/* ---- the planes' bf16 spans: the fp32 spans' expressions on values widened in the loop (an
 * integer shift) and, where they store, rounded in the loop (tt_bf16_from_f32's rule): no stack
 * round trip, one call per plane ---- */
#define CPU_EW_BF_LD(p, i, f)                  \
  do {                                         \
    uint32_t u_ = (uint32_t)(p)[i] << 16;      \
    memcpy(&(f), &u_, 4);                      \
  } while (0)
#define CPU_EW_BF_ST(p, i, f)                                                                                    \
  do {                                                                                                           \
    uint32_t u_;                                                                                                 \
    memcpy(&u_, &(f), 4);                                                                                        \
    (p)[i] = (uint16_t)((u_ & 0x7fffffffu) > 0x7f800000u ? (u_ >> 16) | 0x40u : (u_ + 0x7fffu + ((u_ >> 16) & 1u)) >> 16); \
  } while (0)

static CPU_EW_CLONES void cpu_ew_bf_sum2(const uint16_t *x, size_t n, float shift, double *s, double *q) {
  size_t i0, i;
  for (i0 = 0; i0 < n; i0 += TT_CPU_EW_BLOCK) {
    size_t e = n - i0 < TT_CPU_EW_BLOCK ? n - i0 : TT_CPU_EW_BLOCK;
    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
    for (i = 0; i < e; i++) {
      float v, d;
      CPU_EW_BF_LD(x, i0 + i, v);
      d = v - shift;
      a += d;
      b += d * d;
    }
    *s += a;
    *q += b;
  }
}

static CPU_EW_CLONES double cpu_ew_bf_sqdev(const uint16_t *x, size_t n, float m) {
  double acc = 0.0;
  size_t i0, i;
  for (i0 = 0; i0 < n; i0 += TT_CPU_EW_BLOCK) {
    size_t e = n - i0 < TT_CPU_EW_BLOCK ? n - i0 : TT_CPU_EW_BLOCK;
    float a = 0.0f;
#pragma omp simd reduction(+ : a)
    for (i = 0; i < e; i++) {
      float v, d;
      CPU_EW_BF_LD(x, i0 + i, v);
      d = v - m;
      a += d * d;
    }
    acc += a;
  }
  return acc;
}

static CPU_EW_CLONES void cpu_ew_bf_affine(const uint16_t *x, uint16_t *y, size_t n, float m, float k, float sh) {
  size_t i;
#pragma omp simd
  for (i = 0; i < n; i++) {
    float v, o;
    CPU_EW_BF_LD(x, i, v);
    o = (v - m) * k + sh;
    CPU_EW_BF_ST(y, i, o);
  }
}

static CPU_EW_CLONES void cpu_ew_bf_bwd_sums(const uint16_t *x, const uint16_t *dy, size_t n, float m, double *sdy,
                                             double *sdyx) {
  size_t i0, i;
  for (i0 = 0; i0 < n; i0 += TT_CPU_EW_BLOCK) {
    size_t e = n - i0 < TT_CPU_EW_BLOCK ? n - i0 : TT_CPU_EW_BLOCK;
    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
    for (i = 0; i < e; i++) {
      float v, g;
      CPU_EW_BF_LD(x, i0 + i, v);
      CPU_EW_BF_LD(dy, i0 + i, g);
      a += g;
      b += g * (v - m);
    }
    *sdy += a;
    *sdyx += b;
  }
}

static CPU_EW_CLONES void cpu_ew_bf_bwd_dx(const uint16_t *x, const uint16_t *dy, uint16_t *dx, size_t n, float m, float a,
                                           float mdy, float k, float beta) {
  size_t i;
  if (beta == 0.0f) {
#pragma omp simd
    for (i = 0; i < n; i++) {
      float v, g, o;
      CPU_EW_BF_LD(x, i, v);
      CPU_EW_BF_LD(dy, i, g);
      o = a * (g - mdy - (v - m) * k);
      CPU_EW_BF_ST(dx, i, o);
    }
  } else {
#pragma omp simd
    for (i = 0; i < n; i++) {
      float v, g, p, o;
      CPU_EW_BF_LD(x, i, v);
      CPU_EW_BF_LD(dy, i, g);
      CPU_EW_BF_LD(dx, i, p);
      o = beta * p + a * (g - mdy - (v - m) * k);
      CPU_EW_BF_ST(dx, i, o);
    }
  }
}

/* One-pass statistics. Shifted by a sample of the channel (its first value), the sums of
 * d = x - shift and of d^2 are small where x has a large mean and a small spread, so fp32 blocks
 * keep them; then mean = shift + sum d / m and the squared deviations sq = sum d^2 - (sum d)^2 / m
 * (double). That cancels when the shift is far from the mean against the spread: where
 * (mean - shift)^2 > CPU_EW_SHIFT_MAX * var (a rare outlier for a first value), or var <= 0, the
 * caller takes a second pass over (x - mean)^2 instead, as the two-pass loops did. Either way
 * the choice depends on the data only (never on the thread count). */
#define CPU_EW_SHIFT_MAX 8.0

/* whether the one-pass sq of m values with shifted sum s and square sum q needs the exact pass */
static int cpu_ew_need_sqdev(double s, double q, size_t m) {
  double md = s / (double)m, var = q / (double)m - md * md;
  return !(var > 0.0) || md * md > CPU_EW_SHIFT_MAX * var;
}

/* The channel's shifted sums over its planes (the pass over x), or, when mean is not NULL, the
 * sum of (x - mean)^2 into *s (the exact second pass). */
static void cpu_ew_plane_sums(tt_dtype dt, const void *x, int n, int c, size_t hw, int ch, float shift, const float *mean,
                              float *buf, double *s, double *q) {
  size_t c0;
  int i;
  *s = 0.0, *q = 0.0;
  for (i = 0; i < n; i++) {
    size_t off = ((size_t)i * (size_t)c + (size_t)ch) * hw;
    if (dt == TT_BF16) {
      const uint16_t *h = (const uint16_t *)x + off;
      if (mean)
        *s += cpu_ew_bf_sqdev(h, hw, *mean);
      else
        cpu_ew_bf_sum2(h, hw, shift, s, q);
      continue;
    }
    for (c0 = 0; c0 < hw; c0 += (dt == TT_F32 ? hw : CPU_EW_BF_CHUNK)) {
      size_t e = dt == TT_F32 ? hw : (hw - c0 < CPU_EW_BF_CHUNK ? hw - c0 : CPU_EW_BF_CHUNK);
      const float *v = cpu_ew_view(dt, x, off + c0, buf, e);
      if (mean)
        *s += cpu_ew_sqdev(v, e, *mean);
      else
        cpu_ew_sum2(v, e, shift, s, q);
    }
  }
}

/* The per-channel mean and invstd (not yet times gamma) the forward normalises with.
 * mode TT_CPU_BN_BATCH: batch statistics, written to save_mean/save_invstd (and the running ones
 * moved when update_running); TT_CPU_BN_RUNNING: from the running statistics; TT_CPU_BN_SAVED:
 * save_mean/save_invstd as given (the training forward's own floats, so the same bits). */
static void cpu_ew_bn_given(int mode, int ch, const float *running_mean, const float *running_var, float eps,
                            const float *save_mean, const float *save_invstd, float *mean, float *invstd) {
  if (mode == TT_CPU_BN_RUNNING) {
    *mean = running_mean[ch];
    *invstd = (float)(1.0 / sqrt((double)running_var[ch] + (double)eps));
  } else {
    *mean = save_mean[ch];
    *invstd = save_invstd[ch];
  }
}

static void cpu_ew_bn_fwd_planes(int nt, int n, int c, size_t hw, tt_dtype dt, const void *x, const float *gamma,
                                 const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                                 float eps, float *save_mean, float *save_invstd, int update_running, int mode) {
  const size_t m = (size_t)n * hw;
  ptrdiff_t ch;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (ch = 0; ch < c; ch++) {
    float buf[CPU_EW_BF_CHUNK], out[CPU_EW_BF_CHUNK];
    float mean, invstd, k;
    size_t c0;
    int i;
    if (mode == TT_CPU_BN_BATCH) {
      float shift; /* x[0, ch, 0] */
      double s, q, mean_d, sq;
      if (dt == TT_F32)
        shift = ((const float *)x)[(size_t)ch * hw];
      else
        cpu_ew_widen(dt, x, (size_t)ch * hw, &shift, 1);
      cpu_ew_plane_sums(dt, x, n, c, hw, (int)ch, shift, NULL, buf, &s, &q);
      mean_d = (double)shift + s / (double)m;
      sq = q - s * (s / (double)m);
      if (cpu_ew_need_sqdev(s, q, m)) {
        mean = (float)mean_d;
        cpu_ew_plane_sums(dt, x, n, c, hw, (int)ch, 0.0f, &mean, buf, &sq, &q);
      }
      tt_bn_channel_stats(mean_d, sq, m, eps, momentum, update_running, save_mean + ch, save_invstd + ch,
                          update_running ? running_mean + ch : NULL, update_running ? running_var + ch : NULL);
    }
    cpu_ew_bn_given(mode, (int)ch, running_mean, running_var, eps, save_mean, save_invstd, &mean, &invstd);
    k = invstd * gamma[ch]; /* the one apply every mode shares: y = (x - mean) * k + bias */
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * (size_t)c + (size_t)ch) * hw;
      if (dt == TT_F32) {
        cpu_ew_affine((const float *)x + off, (float *)y + off, hw, mean, k, bias[ch]);
        continue;
      }
      if (dt == TT_BF16) {
        cpu_ew_bf_affine((const uint16_t *)x + off, (uint16_t *)y + off, hw, mean, k, bias[ch]);
        continue;
      }
      for (c0 = 0; c0 < hw; c0 += CPU_EW_BF_CHUNK) {
        size_t e = hw - c0 < CPU_EW_BF_CHUNK ? hw - c0 : CPU_EW_BF_CHUNK;
        cpu_ew_widen(dt, x, off + c0, buf, e);
        cpu_ew_affine(buf, out, e, mean, k, bias[ch]);
        cpu_ew_narrow(dt, out, y, off + c0, e);
      }
    }
  }
}

static void cpu_ew_bn_bwd_planes(int nt, int n, int c, size_t hw, tt_dtype dt, const void *x, const void *dy,
                                 const float *gamma, const float *save_mean, const float *save_invstd, void *dx,
                                 float *dgamma, float *dbias, float beta_dx, float beta_param) {
  const size_t m = (size_t)n * hw;
  ptrdiff_t ch;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (ch = 0; ch < c; ch++) {
    float bx[CPU_EW_BF_CHUNK], bg[CPU_EW_BF_CHUNK], bo[CPU_EW_BF_CHUNK];
    double sdy = 0.0, sdyx = 0.0;
    float mean = save_mean[ch], invstd = save_invstd[ch];
    size_t c0;
    int i;
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * (size_t)c + (size_t)ch) * hw;
      if (dt == TT_BF16) {
        cpu_ew_bf_bwd_sums((const uint16_t *)x + off, (const uint16_t *)dy + off, hw, mean, &sdy, &sdyx);
        continue;
      }
      for (c0 = 0; c0 < hw; c0 += (dt == TT_F32 ? hw : CPU_EW_BF_CHUNK)) {
        size_t e = dt == TT_F32 ? hw : (hw - c0 < CPU_EW_BF_CHUNK ? hw - c0 : CPU_EW_BF_CHUNK);
        cpu_ew_bwd_sums(cpu_ew_view(dt, x, off + c0, bx, e), cpu_ew_view(dt, dy, off + c0, bg, e), e, mean, &sdy, &sdyx);
      }
    }
    sdyx *= invstd; /* sum of dy * xhat */
    if (dbias) dbias[ch] = tt_ref_beta_f32(dbias[ch], (float)sdy, beta_param);
    if (dgamma) dgamma[ch] = tt_ref_beta_f32(dgamma[ch], (float)sdyx, beta_param);
    if (!dx) continue;
    {
      float a = gamma[ch] * invstd, mdy = (float)(sdy / (double)m), k = (float)(sdyx / (double)m) * invstd;
      for (i = 0; i < n; i++) {
        size_t off = ((size_t)i * (size_t)c + (size_t)ch) * hw;
        if (dt == TT_F32) {
          cpu_ew_bwd_dx((const float *)x + off, (const float *)dy + off, (float *)dx + off, hw, mean, a, mdy, k, beta_dx);
          continue;
        }
        if (dt == TT_BF16) {
          cpu_ew_bf_bwd_dx((const uint16_t *)x + off, (const uint16_t *)dy + off, (uint16_t *)dx + off, hw, mean, a, mdy, k,
                           beta_dx);
          continue;
        }
        for (c0 = 0; c0 < hw; c0 += CPU_EW_BF_CHUNK) {
          size_t e = hw - c0 < CPU_EW_BF_CHUNK ? hw - c0 : CPU_EW_BF_CHUNK;
          cpu_ew_widen(dt, x, off + c0, bx, e);
          cpu_ew_widen(dt, dy, off + c0, bg, e);
          if (beta_dx != 0.0f) cpu_ew_widen(dt, dx, off + c0, bo, e);
          cpu_ew_bwd_dx(bx, bg, bo, e, mean, a, mdy, k, beta_dx);
          cpu_ew_narrow(dt, bo, dx, off + c0, e);
        }
      }
    }
  }
}

/* ---- batch norm on rows: hw == 1, x [rows, c] row-major, which is how an NHWC activation
 * [N, H, W, C] comes (the executor passes it as n = N*H*W, c, hw = 1: backend.h's layouts).
 * Threads take fixed blocks of cpu_ew_rows_per_block(c) rows; a block reads its rows
 * contiguously (all c channels, in column chunks of CPU_EW_BF_CHUNK) into its own fp32 partial
 * vectors [c]; the partials are then added per channel in double, in block order. The blocks
 * depend on the shape only, so the bits do not depend on the thread count. The partials are the
 * only scratch: 2 * blocks * c floats, the planned workspace (tt_cpu_bn_workspace), or malloc'd
 * for a caller that passes less. The apply passes need none (their per-channel constants are
 * made per column chunk on the stack). ---- */

/* rows per block: about 64 Ki values a block (256 rows at c = 256), at least 16 rows */
static size_t cpu_ew_rows_per_block(int c) {
  size_t r = (size_t)65536 / (size_t)c;
  return r > 256 ? 256 : (r < 16 ? 16 : r);
}

static size_t cpu_ew_rows_blocks(size_t rows, int c) { return (rows + cpu_ew_rows_per_block(c) - 1) / cpu_ew_rows_per_block(c); }

size_t tt_cpu_bn_workspace(const tt_op_desc *op) {
  const tt_bn_desc *d = &op->u.bn;
  if ((op->kind != TT_OP_BN_FWD_TRAIN && op->kind != TT_OP_BN_BWD) || d->hw != 1 || d->c <= 1 || d->n <= 0) return 0;
  return 2 * cpu_ew_rows_blocks((size_t)d->n, d->c) * (size_t)d->c * sizeof(float);
}

/* ps += r - shift, pt += (r - shift)^2, per channel */
static CPU_EW_CLONES void cpu_ew_row_sum2(float *ps, float *pt, const float *r, const float *shift, size_t w) {
  size_t j;
#pragma omp simd
  for (j = 0; j < w; j++) {
    float d = r[j] - shift[j];
    ps[j] += d;
    pt[j] += d * d;
  }
}

static CPU_EW_CLONES void cpu_ew_row_sqdev(float *ps, const float *r, const float *mean, size_t w) {
  size_t j;
#pragma omp simd
  for (j = 0; j < w; j++) {
    float d = r[j] - mean[j];
    ps[j] += d * d;
  }
}

/* o = (r - mean) * k + sh, per channel: the forward's apply (cpu_ew_affine's expression) */
static CPU_EW_CLONES void cpu_ew_row_affine(const float *r, float *o, const float *mean, const float *k, const float *sh,
                                            size_t w) {
  size_t j;
#pragma omp simd
  for (j = 0; j < w; j++) o[j] = (r[j] - mean[j]) * k[j] + sh[j];
}

static CPU_EW_CLONES void cpu_ew_row_bwd_sums(float *ps, float *pt, const float *r, const float *g, const float *mean,
                                              size_t w) {
  size_t j;
#pragma omp simd
  for (j = 0; j < w; j++) {
    ps[j] += g[j];
    pt[j] += g[j] * (r[j] - mean[j]);
  }
}

/* o = beta*o + a * (g - mdy - (r - mean) * k), per channel (cpu_ew_bwd_dx's expression) */
static CPU_EW_CLONES void cpu_ew_row_bwd_dx(const float *r, const float *g, float *o, const float *mean, const float *a,
                                            const float *mdy, const float *k, float beta, size_t w) {
  size_t j;
  if (beta == 0.0f) {
#pragma omp simd
    for (j = 0; j < w; j++) o[j] = a[j] * (g[j] - mdy[j] - (r[j] - mean[j]) * k[j]);
  } else {
#pragma omp simd
    for (j = 0; j < w; j++) o[j] = beta * o[j] + a[j] * (g[j] - mdy[j] - (r[j] - mean[j]) * k[j]);
  }
}

/* the same row spans on bf16 rows, widened and rounded in the loop (as the planes' bf16 spans) */
static CPU_EW_CLONES void cpu_ew_bf_row_sum2(float *ps, float *pt, const uint16_t *r, const float *shift, size_t w) {
  size_t j;
#pragma omp simd
  for (j = 0; j < w; j++) {
    float v, d;
    CPU_EW_BF_LD(r, j, v);
    d = v - shift[j];
    ps[j] += d;
    pt[j] += d * d;
  }
}

static CPU_EW_CLONES void cpu_ew_bf_row_sqdev(float *ps, const uint16_t *r, const float *mean, size_t w) {
  size_t j;
#pragma omp simd
  for (j = 0; j < w; j++) {
    float v, d;
    CPU_EW_BF_LD(r, j, v);
    d = v - mean[j];
    ps[j] += d * d;
  }
}

static CPU_EW_CLONES void cpu_ew_bf_row_affine(const uint16_t *r, uint16_t *o, const float *mean, const float *k,
                                               const float *sh, size_t w) {
  size_t j;
#pragma omp simd
  for (j = 0; j < w; j++) {
    float v, y;
    CPU_EW_BF_LD(r, j, v);
    y = (v - mean[j]) * k[j] + sh[j];
    CPU_EW_BF_ST(o, j, y);
  }
}

static CPU_EW_CLONES void cpu_ew_bf_row_bwd_sums(float *ps, float *pt, const uint16_t *r, const uint16_t *g,
                                                 const float *mean, size_t w) {
  size_t j;
#pragma omp simd
  for (j = 0; j < w; j++) {
    float v, d;
    CPU_EW_BF_LD(r, j, v);
    CPU_EW_BF_LD(g, j, d);
    ps[j] += d;
    pt[j] += d * (v - mean[j]);
  }
}

static CPU_EW_CLONES void cpu_ew_bf_row_bwd_dx(const uint16_t *r, const uint16_t *g, uint16_t *o, const float *mean,
                                               const float *a, const float *mdy, const float *k, float beta, size_t w) {
  size_t j;
  if (beta == 0.0f) {
#pragma omp simd
    for (j = 0; j < w; j++) {
      float v, d, y;
      CPU_EW_BF_LD(r, j, v);
      CPU_EW_BF_LD(g, j, d);
      y = a[j] * (d - mdy[j] - (v - mean[j]) * k[j]);
      CPU_EW_BF_ST(o, j, y);
    }
  } else {
#pragma omp simd
    for (j = 0; j < w; j++) {
      float v, d, p, y;
      CPU_EW_BF_LD(r, j, v);
      CPU_EW_BF_LD(g, j, d);
      CPU_EW_BF_LD(o, j, p);
      y = beta * p + a[j] * (d - mdy[j] - (v - mean[j]) * k[j]);
      CPU_EW_BF_ST(o, j, y);
    }
  }
}

/* What one pass over the rows does, and with what. */
typedef struct cpu_ew_rows_args {
  int kind;          /* 0: shifted sums (shift: row 0) into part[blk] and part[nblk + blk]; 1: (x - mean)^2 into
                        part[blk]; 2: dy and dy * (x - mean) into part[blk], part[nblk + blk]; 3: the forward's
                        apply y = (x - mean) * (invstd * gamma) + bias; 4: dx = beta*dx + gamma*invstd *
                        (dy - mdy - (x - mean) * kk) */
  size_t rows;
  int c;
  tt_dtype dt;
  const void *x, *dy;
  void *out;         /* y (3), dx (4) */
  float *part;       /* 2 * nblk vectors of c floats (0-2) */
  const float *mean; /* [c] (1, 3, 4) */
  const float *invstd; /* [c] (3, 4); kind 3 with NULL: 1/sqrt(running_var + eps) */
  const float *running_var;
  float eps;
  const float *gamma, *bias; /* [c] (3, 4) */
  const float *mdy, *kk;     /* [c] (4) */
  float beta;                /* (4) */
} cpu_ew_rows_args;

static float cpu_ew_ld1(tt_dtype dt, const void *p, size_t i) {
  if (dt == TT_F32) return ((const float *)p)[i];
  return dt == TT_BF16 ? tt_bf16_to_f32(((const uint16_t *)p)[i]) : tt_ref_h2f(((const uint16_t *)p)[i]);
}

static void cpu_ew_rows_pass(int nt, const cpu_ew_rows_args *A) {
  const size_t rb = cpu_ew_rows_per_block(A->c), nblk = cpu_ew_rows_blocks(A->rows, A->c), cc = (size_t)A->c;
  const int kind = A->kind;
  const tt_dtype dt = A->dt;
  ptrdiff_t blk;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (blk = 0; blk < (ptrdiff_t)nblk; blk++) {
    float bx[CPU_EW_BF_CHUNK], bg[CPU_EW_BF_CHUNK], bo[CPU_EW_BF_CHUNK], k1[CPU_EW_BF_CHUNK];
    const size_t r0 = (size_t)blk * rb, r1 = r0 + rb < A->rows ? r0 + rb : A->rows;
    float *ps = A->part ? A->part + (size_t)blk * cc : NULL, *pt = A->part ? A->part + (nblk + (size_t)blk) * cc : NULL;
    size_t i, j, j0;
    if (kind <= 2) {
      memset(ps, 0, cc * sizeof *ps);
      if (kind != 1) memset(pt, 0, cc * sizeof *pt);
    }
    for (j0 = 0; j0 < cc; j0 += CPU_EW_BF_CHUNK) {
      const size_t w = cc - j0 < CPU_EW_BF_CHUNK ? cc - j0 : CPU_EW_BF_CHUNK;
      /* the chunk's per-channel constants: k1 = shift (0), k1 = invstd * gamma (3), k1 = gamma * invstd (4) */
      if (kind == 0) {
        const float *sh = cpu_ew_view(dt, A->x, j0, k1, w); /* row 0 */
        if (sh != k1) memcpy(k1, sh, w * sizeof *k1);
      } else if (kind == 3) {
        for (j = 0; j < w; j++) {
          float is = A->invstd ? A->invstd[j0 + j] : (float)(1.0 / sqrt((double)A->running_var[j0 + j] + (double)A->eps));
          k1[j] = is * A->gamma[j0 + j]; /* as the planes' k = invstd * gamma */
        }
      } else if (kind == 4) {
        for (j = 0; j < w; j++) k1[j] = A->gamma[j0 + j] * A->invstd[j0 + j];
      }
      if (dt == TT_BF16) { /* the fused bf16 spans */
        const uint16_t *xh = (const uint16_t *)A->x, *gh = (const uint16_t *)A->dy;
        uint16_t *oh = (uint16_t *)A->out;
        for (i = r0; i < r1; i++) {
          const size_t off = i * cc + j0;
          switch (kind) {
            case 0: cpu_ew_bf_row_sum2(ps + j0, pt + j0, xh + off, k1, w); break;
            case 1: cpu_ew_bf_row_sqdev(ps + j0, xh + off, A->mean + j0, w); break;
            case 2: cpu_ew_bf_row_bwd_sums(ps + j0, pt + j0, xh + off, gh + off, A->mean + j0, w); break;
            case 3: cpu_ew_bf_row_affine(xh + off, oh + off, A->mean + j0, k1, A->bias + j0, w); break;
            default:
              cpu_ew_bf_row_bwd_dx(xh + off, gh + off, oh + off, A->mean + j0, k1, A->mdy + j0, A->kk + j0, A->beta, w);
              break;
          }
        }
        continue;
      }
      for (i = r0; i < r1; i++) {
        const size_t off = i * cc + j0;
        const float *r = cpu_ew_view(dt, A->x, off, bx, w);
        float *o;
        switch (kind) {
          case 0: cpu_ew_row_sum2(ps + j0, pt + j0, r, k1, w); break;
          case 1: cpu_ew_row_sqdev(ps + j0, r, A->mean + j0, w); break;
          case 2: cpu_ew_row_bwd_sums(ps + j0, pt + j0, r, cpu_ew_view(dt, A->dy, off, bg, w), A->mean + j0, w); break;
          case 3:
            o = dt == TT_F32 ? (float *)A->out + off : bo;
            cpu_ew_row_affine(r, o, A->mean + j0, k1, A->bias + j0, w);
            if (dt != TT_F32) cpu_ew_narrow(dt, bo, A->out, off, w);
            break;
          default:
            o = dt == TT_F32 ? (float *)A->out + off : bo;
            if (dt != TT_F32 && A->beta != 0.0f) cpu_ew_widen(dt, A->out, off, bo, w);
            cpu_ew_row_bwd_dx(r, cpu_ew_view(dt, A->dy, off, bg, w), o, A->mean + j0, k1, A->mdy + j0, A->kk + j0, A->beta,
                              w);
            if (dt != TT_F32) cpu_ew_narrow(dt, bo, A->out, off, w);
            break;
        }
      }
    }
  }
}

/* channel j's partial sums over the nblk vectors at part, in block order */
static double cpu_ew_rows_sum(const float *part, size_t nblk, int c, int j) {
  double s = 0.0;
  size_t b;
  for (b = 0; b < nblk; b++) s += part[b * (size_t)c + (size_t)j];
  return s;
}

/* the partial vectors: the workspace when it holds them, else malloc'd (*mem to free) */
static float *cpu_ew_rows_part(tt_backend *b, const char *what, size_t rows, int c, void *ws, size_t ws_bytes, void **mem) {
  size_t bytes = 2 * cpu_ew_rows_blocks(rows, c) * (size_t)c * sizeof(float);
  *mem = NULL;
  if (ws && ws_bytes >= bytes) return (float *)ws;
  if (!(*mem = malloc(bytes)))
    tt_ref_fail(b, "%s (%zu rows x %d channels, NHWC): could not allocate %zu bytes of per-block partial sums "
                   "(kernels/cpu/cpu_elementwise.c); pass the workspace op_workspace answers, or free host memory",
                what, rows, c, bytes);
  return (float *)*mem;
}

static void cpu_ew_rows_init(cpu_ew_rows_args *A, int kind, size_t rows, int c, tt_dtype dt, const void *x) {
  memset(A, 0, sizeof *A);
  A->kind = kind, A->rows = rows, A->c = c, A->dt = dt, A->x = x;
}

static int cpu_ew_bn_fwd_rows(tt_backend *b, int nt, size_t rows, int c, tt_dtype dt, const void *x, const float *gamma,
                              const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                              float *save_mean, float *save_invstd, int update_running, int mode, void *ws,
                              size_t ws_bytes) {
  cpu_ew_rows_args A;
  if (mode == TT_CPU_BN_BATCH) { /* one pass shifted by row 0 (cpu_ew_need_sqdev), a second one if needed */
    const size_t nblk = cpu_ew_rows_blocks(rows, c);
    void *mem;
    float *part = cpu_ew_rows_part(b, "bn_fwd_train", rows, c, ws, ws_bytes, &mem), *part2;
    int j, exact = 0;
    if (!part) return -1;
    part2 = part + nblk * (size_t)c;
    cpu_ew_rows_init(&A, 0, rows, c, dt, x);
    A.part = part;
    cpu_ew_rows_pass(nt, &A);
    for (j = 0; j < c && !exact; j++)
      exact = cpu_ew_need_sqdev(cpu_ew_rows_sum(part, nblk, c, j), cpu_ew_rows_sum(part2, nblk, c, j), rows);
    for (j = 0; j < c; j++) {
      double sd = cpu_ew_rows_sum(part, nblk, c, j), q = cpu_ew_rows_sum(part2, nblk, c, j);
      double mean_d = (double)cpu_ew_ld1(dt, x, (size_t)j) + sd / (double)rows;
      if (exact)
        save_mean[j] = (float)mean_d; /* what tt_bn_channel_stats keeps of it; the exact pass's mean */
      else
        tt_bn_channel_stats(mean_d, q - sd * (sd / (double)rows), rows, eps, momentum, update_running, save_mean + j,
                            save_invstd + j, update_running ? running_mean + j : NULL,
                            update_running ? running_var + j : NULL);
    }
    if (exact) { /* some channel's shift was far from its mean: the exact squared deviations, all channels */
      cpu_ew_rows_init(&A, 1, rows, c, dt, x);
      A.part = part, A.mean = save_mean;
      cpu_ew_rows_pass(nt, &A);
      for (j = 0; j < c; j++)
        tt_bn_channel_stats((double)save_mean[j], cpu_ew_rows_sum(part, nblk, c, j), rows, eps, momentum, update_running,
                            save_mean + j, save_invstd + j, update_running ? running_mean + j : NULL,
                            update_running ? running_var + j : NULL);
    }
    free(mem);
  }
  /* the one apply every mode shares */
  cpu_ew_rows_init(&A, 3, rows, c, dt, x);
  A.out = y, A.gamma = gamma, A.bias = bias, A.eps = eps;
  if (mode == TT_CPU_BN_RUNNING)
    A.mean = running_mean, A.invstd = NULL, A.running_var = running_var;
  else
    A.mean = save_mean, A.invstd = save_invstd;
  cpu_ew_rows_pass(nt, &A);
  return 0;
}

static int cpu_ew_bn_bwd_rows(tt_backend *b, int nt, size_t rows, int c, tt_dtype dt, const void *x, const void *dy,
                              const float *gamma, const float *save_mean, const float *save_invstd, void *dx, float *dgamma,
                              float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  const size_t nblk = cpu_ew_rows_blocks(rows, c);
  cpu_ew_rows_args A;
  void *mem;
  float *part = cpu_ew_rows_part(b, "bn_bwd", rows, c, ws, ws_bytes, &mem), *part2;
  int j;
  if (!part) return -1;
  part2 = part + nblk * (size_t)c;
  cpu_ew_rows_init(&A, 2, rows, c, dt, x);
  A.dy = dy, A.part = part, A.mean = save_mean;
  cpu_ew_rows_pass(nt, &A);
  for (j = 0; j < c; j++) {
    float invstd = save_invstd[j];
    double sdy = cpu_ew_rows_sum(part, nblk, c, j), sdyx = cpu_ew_rows_sum(part2, nblk, c, j) * invstd; /* dy * xhat */
    if (dbias) dbias[j] = tt_ref_beta_f32(dbias[j], (float)sdy, beta_param);
    if (dgamma) dgamma[j] = tt_ref_beta_f32(dgamma[j], (float)sdyx, beta_param);
    /* channel j's column of block 0 is read: keep mean(dy) and mean(dy * xhat) * invstd there */
    part[j] = (float)(sdy / (double)rows);
    part2[j] = (float)(sdyx / (double)rows) * invstd;
  }
  if (dx) {
    cpu_ew_rows_init(&A, 4, rows, c, dt, x);
    A.dy = dy, A.out = dx, A.mean = save_mean, A.invstd = save_invstd, A.gamma = gamma, A.mdy = part, A.kk = part2;
    A.beta = beta_dx;
    cpu_ew_rows_pass(nt, &A);
  }
  free(mem);
  return 0;
}

/* ---- entries (cpu_internal.h) ---- */

int tt_cpu_bn_fwd_loops(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                        float *save_mean, float *save_invstd, int update_running, int mode, void *ws, size_t ws_bytes) {
  const size_t m = (size_t)n * (size_t)hw;
  int nt = m * (size_t)c > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
  if (hw == 1 && c == 1) n = 1, hw = (int)m; /* [rows, 1] is one plane: no per-row calls of width 1 */
  if (hw == 1)
    return cpu_ew_bn_fwd_rows(b, nt, m, c, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean,
                              save_invstd, update_running, mode, ws, ws_bytes);
  cpu_ew_bn_fwd_planes(nt, n, c, (size_t)hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean,
                       save_invstd, update_running, mode);
  return 0;
}

int tt_cpu_bn_bwd_loops(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                        const float *save_mean, const float *save_invstd, void *dx, float *dgamma, float *dbias,
                        float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  const size_t m = (size_t)n * (size_t)hw;
  int nt = m * (size_t)c > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
  if (hw == 1 && c == 1) n = 1, hw = (int)m; /* as the forward */
  if (hw == 1)
    return cpu_ew_bn_bwd_rows(b, nt, m, c, dt, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                              beta_param, ws, ws_bytes);
  cpu_ew_bn_bwd_planes(nt, n, c, (size_t)hw, dt, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                       beta_param);
  return 0;
}
