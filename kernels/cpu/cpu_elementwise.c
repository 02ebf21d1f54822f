/* kernels/cpu/cpu_elementwise.c — the fp32 elementwise ops and batch-norm loops the CPU
 * backend runs itself, vectorised; bf16 ReLU, ReLU6, add and accumulate run the same fp32 spans
 * over chunks widened from bf16 and rounded back (tt_bf16_from_f32's rule, vectorised), so they
 * give the reference's bits; fp16, bf16 batch norm and the rest go to the reference loops.
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
 * agree to float rounding: sums are taken in float over blocks of TT_CPU_EW_BLOCK elements in
 * vector lanes, the blocks added in double, in an order fixed by the shape and the machine's
 * vector width (so bit-identical run to run on one machine, for any thread count: a channel
 * is one thread's).
 */
#include <math.h>

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

/* What each thread runs: kind 0 relu, 1 relu6, 2 relu bwd, 3 relu6 bwd, 4 add, 5 accumulate. */
static void cpu_ew_run(tt_backend *b, int kind, size_t count, const float *p0, const float *p1, float *out, float beta) {
  int nt = count > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi;
#ifdef _OPENMP
    cpu_ew_share(count, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
#else
    cpu_ew_share(count, 0, 1, &lo, &hi);
#endif
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
#ifdef _OPENMP
    cpu_ew_share(count, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
#else
    cpu_ew_share(count, 0, 1, &lo, &hi);
#endif
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
  if (dt == TT_BF16) {
    cpu_ew_run_bf16(b, 5, count, (const uint16_t *)x, NULL, (uint16_t *)y, beta);
    return 0;
  }
  cpu_ew_run(b, 5, count, (const float *)x, NULL, (float *)y, beta);
  return 0;
}

/* ------------------------------- batch-norm rows -------------------------------------- */

/* sum of x[0..n) */
static CPU_EW_CLONES double cpu_ew_sum(const float *x, size_t n) {
  double acc = 0.0;
  size_t i0, i;
  for (i0 = 0; i0 < n; i0 += TT_CPU_EW_BLOCK) {
    size_t e = n - i0 < TT_CPU_EW_BLOCK ? n - i0 : TT_CPU_EW_BLOCK;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (i = 0; i < e; i++) s += x[i0 + i];
    acc += s;
  }
  return acc;
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

/* Batch norm over rows: hw == 1, x [rows, c] row-major, which is how an NHWC activation
 * [N, H, W, C] comes (the executor passes it as n = N*H*W, c, hw = 1: backend.h's layouts). A
 * per-channel walk would stride by c through memory once per channel; instead each thread takes
 * blocks of CPU_EW_CB channels and walks the rows once per pass, reading CPU_EW_CB contiguous
 * values (a cache line) from each. Per channel the sums run over the rows in order, in fp32
 * blocks of TT_CPU_EW_BLOCK rows added into double, so the bits do not depend on the thread
 * count. */
#define CPU_EW_CB 16

static void cpu_ew_bn_fwd_rows(int nt, size_t rows, int c, const float *x, const float *gamma, const float *bias, float *y,
                               float *running_mean, float *running_var, float momentum, float eps, float *save_mean,
                               float *save_invstd, int update_running, int inference) {
  ptrdiff_t blk, nblk = (c + CPU_EW_CB - 1) / CPU_EW_CB;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (blk = 0; blk < nblk; blk++) {
    const int c0 = (int)blk * CPU_EW_CB, w = c - c0 < CPU_EW_CB ? c - c0 : CPU_EW_CB;
    float mean[CPU_EW_CB], k[CPU_EW_CB], sh[CPU_EW_CB];
    size_t i0, i;
    int j;
    if (inference == 2) { /* bn_apply: the training forward's statistics, given */
      for (j = 0; j < w; j++) mean[j] = save_mean[c0 + j], k[j] = save_invstd[c0 + j];
    } else if (inference) {
      for (j = 0; j < w; j++) mean[j] = running_mean[c0 + j], k[j] = (float)(1.0 / sqrt((double)running_var[c0 + j] + (double)eps));
    } else {
      double s[CPU_EW_CB], sq[CPU_EW_CB];
      for (j = 0; j < CPU_EW_CB; j++) s[j] = sq[j] = 0.0;
      for (i0 = 0; i0 < rows; i0 += TT_CPU_EW_BLOCK) {
        size_t e = rows - i0 < TT_CPU_EW_BLOCK ? rows - i0 : TT_CPU_EW_BLOCK;
        float ps[CPU_EW_CB] = {0};
        for (i = 0; i < e; i++) {
          const float *r = x + (i0 + i) * (size_t)c + c0;
#pragma omp simd
          for (j = 0; j < w; j++) ps[j] += r[j];
        }
        for (j = 0; j < w; j++) s[j] += ps[j];
      }
      for (j = 0; j < w; j++) mean[j] = (float)(s[j] / (double)rows);
      for (i0 = 0; i0 < rows; i0 += TT_CPU_EW_BLOCK) {
        size_t e = rows - i0 < TT_CPU_EW_BLOCK ? rows - i0 : TT_CPU_EW_BLOCK;
        float ps[CPU_EW_CB] = {0};
        for (i = 0; i < e; i++) {
          const float *r = x + (i0 + i) * (size_t)c + c0;
#pragma omp simd
          for (j = 0; j < w; j++) {
            float d = r[j] - mean[j];
            ps[j] += d * d;
          }
        }
        for (j = 0; j < w; j++) sq[j] += ps[j];
      }
      for (j = 0; j < w; j++) {
        tt_bn_channel_stats(s[j] / (double)rows, sq[j], rows, eps, momentum, update_running, save_mean + c0 + j,
                            save_invstd + c0 + j, update_running ? running_mean + c0 + j : NULL,
                            update_running ? running_var + c0 + j : NULL);
        mean[j] = save_mean[c0 + j], k[j] = save_invstd[c0 + j];
      }
    }
    for (j = 0; j < w; j++) k[j] *= gamma[c0 + j], sh[j] = bias[c0 + j];
    for (i = 0; i < rows; i++) {
      const float *r = x + i * (size_t)c + c0;
      float *o = y + i * (size_t)c + c0;
#pragma omp simd
      for (j = 0; j < w; j++) o[j] = (r[j] - mean[j]) * k[j] + sh[j];
    }
  }
}

static void cpu_ew_bn_bwd_rows(int nt, size_t rows, int c, const float *x, const float *dy, const float *gamma,
                               const float *save_mean, const float *save_invstd, float *dx, float *dgamma, float *dbias,
                               float beta_dx, float beta_param) {
  ptrdiff_t blk, nblk = (c + CPU_EW_CB - 1) / CPU_EW_CB;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (blk = 0; blk < nblk; blk++) {
    const int c0 = (int)blk * CPU_EW_CB, w = c - c0 < CPU_EW_CB ? c - c0 : CPU_EW_CB;
    float mean[CPU_EW_CB], a[CPU_EW_CB], mdy[CPU_EW_CB], k[CPU_EW_CB];
    double sdy[CPU_EW_CB], sdyx[CPU_EW_CB];
    size_t i0, i;
    int j;
    for (j = 0; j < CPU_EW_CB; j++) sdy[j] = sdyx[j] = 0.0, mean[j] = j < w ? save_mean[c0 + j] : 0.0f;
    for (i0 = 0; i0 < rows; i0 += TT_CPU_EW_BLOCK) {
      size_t e = rows - i0 < TT_CPU_EW_BLOCK ? rows - i0 : TT_CPU_EW_BLOCK;
      float ps[CPU_EW_CB] = {0}, pt[CPU_EW_CB] = {0};
      for (i = 0; i < e; i++) {
        const float *r = x + (i0 + i) * (size_t)c + c0, *g = dy + (i0 + i) * (size_t)c + c0;
#pragma omp simd
        for (j = 0; j < w; j++) {
          ps[j] += g[j];
          pt[j] += g[j] * (r[j] - mean[j]);
        }
      }
      for (j = 0; j < w; j++) sdy[j] += ps[j], sdyx[j] += pt[j];
    }
    for (j = 0; j < w; j++) {
      float invstd = save_invstd[c0 + j];
      sdyx[j] *= invstd; /* sum of dy * xhat */
      if (dbias) dbias[c0 + j] = tt_ref_beta_f32(dbias[c0 + j], (float)sdy[j], beta_param);
      if (dgamma) dgamma[c0 + j] = tt_ref_beta_f32(dgamma[c0 + j], (float)sdyx[j], beta_param);
      a[j] = gamma[c0 + j] * invstd, mdy[j] = (float)(sdy[j] / (double)rows), k[j] = (float)(sdyx[j] / (double)rows) * invstd;
    }
    if (!dx) continue;
    for (i = 0; i < rows; i++) {
      const float *r = x + i * (size_t)c + c0, *g = dy + i * (size_t)c + c0;
      float *o = dx + i * (size_t)c + c0;
      if (beta_dx == 0.0f) {
#pragma omp simd
        for (j = 0; j < w; j++) o[j] = a[j] * (g[j] - mdy[j] - (r[j] - mean[j]) * k[j]);
      } else {
#pragma omp simd
        for (j = 0; j < w; j++) o[j] = beta_dx * o[j] + a[j] * (g[j] - mdy[j] - (r[j] - mean[j]) * k[j]);
      }
    }
  }
}

/* The same row loops for fp16 and bf16 storage: each row's block of channels widened to fp32 (the
 * reference's arithmetic), the result rounded once when stored. The reference's per-channel
 * walk would stride by c through the whole tensor once per channel. */
static void cpu_ew_ld_row(tt_dtype dt, const void *p, size_t off, int w, float *o) {
  int j;
  if (dt == TT_BF16) {
    const uint16_t *h = (const uint16_t *)p + off;
    for (j = 0; j < w; j++) o[j] = tt_bf16_to_f32(h[j]);
  } else {
    const uint16_t *h = (const uint16_t *)p + off;
    for (j = 0; j < w; j++) o[j] = tt_ref_h2f(h[j]);
  }
}

static void cpu_ew_st_row(tt_dtype dt, void *p, size_t off, int w, const float *v) {
  int j;
  uint16_t *h = (uint16_t *)p + off;
  if (dt == TT_BF16)
    for (j = 0; j < w; j++) h[j] = tt_bf16_from_f32(v[j]);
  else
    for (j = 0; j < w; j++) h[j] = tt_ref_f2h(v[j]);
}

int tt_cpu_bn_rows_half(tt_backend *b, int rows, int c, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                        const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                        float *save_mean, float *save_invstd, int update_running, int inference, void *dx, float *dgamma,
                        float *dbias, float beta_dx, float beta_param) {
  ptrdiff_t blk, nblk = (c + CPU_EW_CB - 1) / CPU_EW_CB;
  const size_t m = (size_t)rows;
  int nt = m * (size_t)c > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (blk = 0; blk < nblk; blk++) {
    const int c0 = (int)blk * CPU_EW_CB, w = c - c0 < CPU_EW_CB ? c - c0 : CPU_EW_CB;
    float mean[CPU_EW_CB], k[CPU_EW_CB], sh[CPU_EW_CB], r[CPU_EW_CB], g[CPU_EW_CB], o[CPU_EW_CB];
    double s[CPU_EW_CB], sq[CPU_EW_CB];
    size_t i;
    int j;
    for (j = 0; j < CPU_EW_CB; j++) s[j] = sq[j] = 0.0, mean[j] = k[j] = sh[j] = 0.0f;
    if (!dy) { /* forward */
      if (inference == 2) { /* bn_apply: the training forward's statistics, given */
        for (j = 0; j < w; j++) mean[j] = save_mean[c0 + j], k[j] = save_invstd[c0 + j];
      } else if (inference) {
        for (j = 0; j < w; j++)
          mean[j] = running_mean[c0 + j], k[j] = (float)(1.0 / sqrt((double)running_var[c0 + j] + (double)eps));
      } else {
        for (i = 0; i < m; i++) {
          cpu_ew_ld_row(dt, x, i * (size_t)c + c0, w, r);
          for (j = 0; j < w; j++) s[j] += r[j];
        }
        for (j = 0; j < w; j++) mean[j] = (float)(s[j] / (double)m);
        for (i = 0; i < m; i++) {
          cpu_ew_ld_row(dt, x, i * (size_t)c + c0, w, r);
          for (j = 0; j < w; j++) sq[j] += (double)((r[j] - mean[j]) * (r[j] - mean[j]));
        }
        for (j = 0; j < w; j++) {
          tt_bn_channel_stats(s[j] / (double)m, sq[j], m, eps, momentum, update_running, save_mean + c0 + j,
                              save_invstd + c0 + j, update_running ? running_mean + c0 + j : NULL,
                              update_running ? running_var + c0 + j : NULL);
          mean[j] = save_mean[c0 + j], k[j] = save_invstd[c0 + j];
        }
      }
      for (j = 0; j < w; j++) k[j] *= gamma[c0 + j], sh[j] = bias[c0 + j];
      for (i = 0; i < m; i++) {
        cpu_ew_ld_row(dt, x, i * (size_t)c + c0, w, r);
        for (j = 0; j < w; j++) o[j] = (r[j] - mean[j]) * k[j] + sh[j];
        cpu_ew_st_row(dt, y, i * (size_t)c + c0, w, o);
      }
      continue;
    }
    /* backward: s = sum dy, sq = sum dy * (x - mean) */
    for (j = 0; j < w; j++) mean[j] = save_mean[c0 + j];
    for (i = 0; i < m; i++) {
      cpu_ew_ld_row(dt, x, i * (size_t)c + c0, w, r);
      cpu_ew_ld_row(dt, dy, i * (size_t)c + c0, w, g);
      for (j = 0; j < w; j++) s[j] += g[j], sq[j] += (double)(g[j] * (r[j] - mean[j]));
    }
    for (j = 0; j < w; j++) {
      float invstd = save_invstd[c0 + j];
      sq[j] *= invstd; /* sum of dy * xhat */
      if (dbias) dbias[c0 + j] = tt_ref_beta_f32(dbias[c0 + j], (float)s[j], beta_param);
      if (dgamma) dgamma[c0 + j] = tt_ref_beta_f32(dgamma[c0 + j], (float)sq[j], beta_param);
      k[j] = gamma[c0 + j] * invstd;                                        /* a */
      sh[j] = (float)(s[j] / (double)m);                                    /* mean dy */
      o[j] = (float)(sq[j] / (double)m) * invstd;                           /* mean(dy * xhat) * invstd */
    }
    if (!dx) continue;
    {
      float kk[CPU_EW_CB], prev[CPU_EW_CB];
      for (j = 0; j < w; j++) kk[j] = o[j];
      for (i = 0; i < m; i++) {
        cpu_ew_ld_row(dt, x, i * (size_t)c + c0, w, r);
        cpu_ew_ld_row(dt, dy, i * (size_t)c + c0, w, g);
        if (beta_dx != 0.0f) cpu_ew_ld_row(dt, dx, i * (size_t)c + c0, w, prev);
        for (j = 0; j < w; j++) {
          float v = k[j] * (g[j] - sh[j] - (r[j] - mean[j]) * kk[j]);
          o[j] = beta_dx != 0.0f ? v + beta_dx * prev[j] : v;
        }
        cpu_ew_st_row(dt, dx, i * (size_t)c + c0, w, o);
      }
    }
  }
  return 0;
}

int tt_cpu_bn_fwd_loops(tt_backend *b, int n, int c, int hw, const float *x, const float *gamma, const float *bias,
                        float *y, float *running_mean, float *running_var, float momentum, float eps, float *save_mean,
                        float *save_invstd, int update_running, int inference) {
  ptrdiff_t ch;
  const size_t m = (size_t)n * (size_t)hw;
  int nt = m * (size_t)c > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
  (void)nt;
  if (hw == 1) {
    cpu_ew_bn_fwd_rows(nt, m, c, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                       update_running, inference);
    return 0;
  }
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (ch = 0; ch < c; ch++) {
    float mean, invstd;
    int i;
    if (inference == 2) { /* bn_apply: the training forward's statistics, given */
      mean = save_mean[ch];
      invstd = save_invstd[ch];
    } else if (inference) {
      mean = running_mean[ch];
      invstd = (float)(1.0 / sqrt((double)running_var[ch] + (double)eps));
    } else {
      double s = 0.0, sq = 0.0;
      for (i = 0; i < n; i++) s += cpu_ew_sum(x + ((size_t)i * c + ch) * hw, (size_t)hw);
      mean = (float)(s / (double)m);
      for (i = 0; i < n; i++) sq += cpu_ew_sqdev(x + ((size_t)i * c + ch) * hw, (size_t)hw, mean);
      tt_bn_channel_stats(s / (double)m, sq, m, eps, momentum, update_running, save_mean + ch, save_invstd + ch,
                          update_running ? running_mean + ch : NULL, update_running ? running_var + ch : NULL);
      mean = save_mean[ch];
      invstd = save_invstd[ch];
    }
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * c + ch) * hw;
      cpu_ew_affine(x + off, y + off, (size_t)hw, mean, invstd * gamma[ch], bias[ch]);
    }
  }
  return 0;
}

int tt_cpu_bn_bwd_loops(tt_backend *b, int n, int c, int hw, const float *x, const float *dy, const float *gamma,
                        const float *save_mean, const float *save_invstd, float *dx, float *dgamma, float *dbias,
                        float beta_dx, float beta_param) {
  ptrdiff_t ch;
  const size_t m = (size_t)n * (size_t)hw;
  int nt = m * (size_t)c > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
  (void)nt;
  if (hw == 1) {
    cpu_ew_bn_bwd_rows(nt, m, c, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param);
    return 0;
  }
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (ch = 0; ch < c; ch++) {
    double sdy = 0.0, sdyx = 0.0;
    float mean = save_mean[ch], invstd = save_invstd[ch];
    int i;
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * c + ch) * hw;
      cpu_ew_bwd_sums(x + off, dy + off, (size_t)hw, mean, &sdy, &sdyx);
    }
    sdyx *= invstd; /* sum of dy * xhat */
    if (dbias) dbias[ch] = tt_ref_beta_f32(dbias[ch], (float)sdy, beta_param);
    if (dgamma) dgamma[ch] = tt_ref_beta_f32(dgamma[ch], (float)sdyx, beta_param);
    if (!dx) continue;
    {
      float a = gamma[ch] * invstd, mdy = (float)(sdy / (double)m), k = (float)(sdyx / (double)m) * invstd;
      for (i = 0; i < n; i++) {
        size_t off = ((size_t)i * c + ch) * hw;
        cpu_ew_bwd_dx(x + off, dy + off, dx + off, (size_t)hw, mean, a, mdy, k, beta_dx);
      }
    }
  }
  return 0;
}
