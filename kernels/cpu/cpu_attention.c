/* kernels/cpu/cpu_attention.c — attention on the CPU backend (fp32) as threaded OpenBLAS
 * products over the caller's own strided layouts; fp16 runs the reference loops
 * (kernels/ref/ref_attention.c).
 *
 * Per (sample, head) task over OpenMP threads, as the reference does, but the OpenBLAS products
 * read q, k, v and write o and dqkv in place through their row strides (3f and f) instead of
 * packed copies, and the softmax's exponentials, which cost more than the products at ViT's head
 * widths when libm computes them one call per element, are a polynomial the compiler vectorises
 * (cpu_attn_exp; cpu_vec.h's per-ISA copies). Forward and the fused backward's rebuild share the one
 * row function, so kept and rebuilt probabilities are equal bit for bit here too. Results equal
 * the reference's to rounding (tests/test_cpu_vs_ref.c); the workspace is the reference's answer
 * (a superset: per thread [t, t] scores, or two [t, t] and a row in backward). Tasks are
 * (sample, head) pairs, so fewer pairs than threads leaves threads idle (batch-1 evaluation);
 * the products stay single-threaded inside a task (OpenBLAS allocates per threaded call).
 */
#include <cblas.h>
#include <math.h>

#include "cpu_internal.h"
#include "cpu_vec.h"

/* exp(x) for x <= 0 in plain float arithmetic the compiler vectorises (libm's expf is a call
 * per element): x = n ln2 + r with |r| <= ln2/2, exp(r) by the degree-6 Taylor-like minimax
 * polynomial of Cephes' expf, times 2^n built in the exponent bits: within 8e-8 relative of exp
 * over [-87, 0] (measured against double exp in steps of 1e-4). Below about -87.7 (where n
 * would be -127, the subnormal range) it returns 0: probabilities that small are zero to any
 * tolerance. The softmax rows use it in forward and in the rebuild alike,
 * so the fused backward still sees the forward's probabilities bit for bit. */
static inline float cpu_attn_exp(float x) {
  float n, r, p, s;
  int32_t e;
  uint32_t bits;
  x = x < -88.0f ? -88.0f : x; /* clamped: n = -127 there, and 2^n is zeroed below */
  /* n = round(x / ln2) by the 1.5 * 2^23 trick (exact for |n| < 2^22; no libm call) */
  n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  r = x - n * 0.693359375f;    /* ln2 split in two: hi exact in float */
  r = r - n * -2.12194440e-4f; /* lo */
  p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  e = (int32_t)n + 127;
  e = e > 0 ? e : 0;
  bits = (uint32_t)e << 23;
  memcpy(&s, &bits, 4);
  return p * s; /* e <= 0: s = 0 */
}

/* One softmax row: on entry row[0..jend) holds the scaled scores; on exit row[j] =
 * exp(row[j] - lse) for j < jend and 0 for jend <= j < t. lse_in: use it (the rebuild);
 * else compute lse = max + log(sum exp(row - max)) and return it. */
CPU_VEC_FN_RET(float, cpu_attn_softmax_row, (float *row, int jend, int t, const float *lse_in),
               (row, jend, t, lse_in), {
  float l;
  int j;
  if (lse_in) {
    l = *lse_in;
  } else {
    float m = row[0], sum = 0.0f;
    _Pragma("omp simd reduction(max : m)")
    for (j = 0; j < jend; j++) m = row[j] > m ? row[j] : m;
    _Pragma("omp simd reduction(+ : sum)")
    for (j = 0; j < jend; j++) sum += cpu_attn_exp(row[j] - m);
    l = m + logf(sum);
  }
  CPU_VEC_SIMD
  for (j = 0; j < jend; j++) row[j] = cpu_attn_exp(row[j] - l);
  for (j = jend; j < t; j++) row[j] = 0.0f;
  return l;
})

/* dS = P * (dPd * keep - D) and Pd = P * keep over one row (keep_scale: 1/(1-p) or 0 per
 * element, or NULL for no dropout). */
CPU_VEC_FN(cpu_attn_ds_row, (float *p, float *dp, const float *keep_scale, float dr, int t),
           (p, dp, keep_scale, dr, t), {
  int j;
  if (!keep_scale) {
    CPU_VEC_SIMD
    for (j = 0; j < t; j++) dp[j] = p[j] * (dp[j] - dr);
    return;
  }
  CPU_VEC_SIMD
  for (j = 0; j < t; j++) {
    dp[j] = p[j] * (dp[j] * keep_scale[j] - dr);
    p[j] *= keep_scale[j];
  }
})

/* keep_scale[j] of row i of task: 1/(1-p) where kept, else 0 (the reference's rule). */
static void cpu_attn_keep_row(float *ks, uint64_t seed, uint64_t base, int t, uint32_t thr, float dscale, int all_drop) {
  int j;
  for (j = 0; j < t; j++)
    ks[j] = (!all_drop && (uint32_t)(tt_dropout_hash(seed, base + (uint64_t)j) >> 32) >= thr) ? dscale : 0.0f;
}

static int cpu_attn_fast(const tt_attn_desc *d, tt_dtype dt) {
  return dt == TT_F32 && d && d->n >= 1 && d->t >= 1 && d->heads >= 1 && d->d >= 1 && d->p >= 0.0f && d->p <= 1.0f &&
         isfinite(d->scale);
}

/* Dropout parameters as the reference's (ref_attention.c). */
static void cpu_attn_drop(float p, uint32_t *thr, float *dscale, int *all_drop) {
  *all_drop = p >= 1.0f;
  *thr = *all_drop ? 0u : (uint32_t)((double)p * 4294967296.0);
  *dscale = *all_drop ? 0.0f : 1.0f / (1.0f - p);
}

static int cpu_attn_thread(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* Checks the workspace (the reference's answer for the forward, bwd 0, or the backward, bwd 1)
 * and sets each of the nt threads' share of it in floats (*per) and the dropout parameters:
 * 0, or -1 with the error set. */
static int cpu_attn_setup(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, int bwd, int nt, const void *ws,
                          size_t ws_bytes, size_t *per, uint32_t *thr, float *dscale, int *all_drop) {
  size_t need = tt_ref_attn_workspace(b, d, dt, bwd);
  if (need == TT_WS_ERROR) return -1;
  if (!ws || ws_bytes < need)
    return tt_ref_fail(b, "%s: workspace too small: needs %zu bytes (op_workspace of %s), given %zu%s",
                       bwd ? "attn_bwd" : "attn_fwd", need, bwd ? "TT_OP_ATTN_BWD" : "TT_OP_ATTN_FWD", ws_bytes,
                       ws ? "" : " (NULL)");
  *per = need / sizeof(float) / (size_t)nt;
  cpu_attn_drop(d->p, thr, dscale, all_drop);
  return 0;
}

/* Scratch per thread: the reference's answer (op_workspace is the reference's) split evenly;
 * forward uses S [t, t] and a keep row [t]; backward P, dP [t, t] and a keep row. */
int tt_cpu_attn_fwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, void *o, float *lse,
                    void *probs, uint64_t seed, void *ws, size_t ws_bytes) {
  ptrdiff_t task, ntask;
  size_t per;
  int nt = tt_ref_threads(b), all_drop;
  uint32_t thr;
  float dscale;
  if (!cpu_attn_fast(d, dt) || !qkv || !o) return tt_ref_attn_fwd(b, d, dt, qkv, o, lse, probs, seed, ws, ws_bytes);
  if (cpu_attn_setup(b, d, dt, 0, nt, ws, ws_bytes, &per, &thr, &dscale, &all_drop)) return -1;
  ntask = (ptrdiff_t)d->n * d->heads;
#pragma omp parallel for schedule(static) num_threads(nt) if (ntask > 1 && (double)ntask * d->t * d->t * d->d > 1e5)
  for (task = 0; task < ntask; task++) {
    int s = (int)(task / d->heads), h = (int)(task % d->heads), t = d->t, dd = d->d, i, j;
    size_t f = (size_t)d->heads * dd, ld = 3 * f;
    float *sm = (float *)ws + (size_t)cpu_attn_thread() * per, *ks = sm + (size_t)t * t;
    const float *q = (const float *)qkv + (size_t)s * t * ld + (size_t)h * dd, *k = q + f, *v = q + 2 * f;
    float *ob = (float *)o + (size_t)s * t * f + (size_t)h * dd;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, dd, d->scale, q, (int)ld, k, (int)ld, 0.0f, sm, t);
    for (i = 0; i < t; i++) {
      float l = cpu_attn_softmax_row(sm + (size_t)i * t, d->causal ? i + 1 : t, t, NULL);
      if (lse) lse[(size_t)task * t + i] = l;
    }
    if (probs) memcpy((float *)probs + (size_t)task * t * t, sm, (size_t)t * t * sizeof(float));
    if (d->p > 0.0f)
      for (i = 0; i < t; i++) {
        float *row = sm + (size_t)i * t;
        cpu_attn_keep_row(ks, seed, ((uint64_t)task * t + (uint64_t)i) * t, t, thr, dscale, all_drop);
        for (j = 0; j < t; j++) row[j] *= ks[j];
      }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, dd, t, 1.0f, sm, t, v, (int)ld, 0.0f, ob, (int)f);
  }
  return 0;
}

int tt_cpu_attn_bwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, const void *o,
                    const void *dout, const float *lse, const void *probs, uint64_t seed, void *dqkv, float beta,
                    void *ws, size_t ws_bytes) {
  ptrdiff_t task, ntask;
  size_t per;
  int nt = tt_ref_threads(b), all_drop;
  uint32_t thr;
  float dscale;
  if (!cpu_attn_fast(d, dt) || !qkv || !o || !dout || !dqkv || (!probs && !lse) || dqkv == qkv || dqkv == dout ||
      dqkv == o)
    return tt_ref_attn_bwd(b, d, dt, qkv, o, dout, lse, probs, seed, dqkv, beta, ws, ws_bytes);
  if (cpu_attn_setup(b, d, dt, 1, nt, ws, ws_bytes, &per, &thr, &dscale, &all_drop)) return -1;
  ntask = (ptrdiff_t)d->n * d->heads;
#pragma omp parallel for schedule(static) num_threads(nt) if (ntask > 1 && (double)ntask * d->t * d->t * d->d > 1e5)
  for (task = 0; task < ntask; task++) {
    int s = (int)(task / d->heads), h = (int)(task % d->heads), t = d->t, dd = d->d, i, c, part;
    size_t f = (size_t)d->heads * dd, ld = 3 * f, tt = (size_t)t * t;
    float *pm = (float *)ws + (size_t)cpu_attn_thread() * per, *dp = pm + tt, *ks = dp + tt;
    const float *q = (const float *)qkv + (size_t)s * t * ld + (size_t)h * dd, *k = q + f, *v = q + 2 * f;
    const float *go = (const float *)dout + (size_t)s * t * f + (size_t)h * dd;
    const float *ob = (const float *)o + (size_t)s * t * f + (size_t)h * dd;
    float *gq = (float *)dqkv + (size_t)s * t * ld + (size_t)h * dd, *gk = gq + f, *gv = gq + 2 * f;
    if (probs) {
      memcpy(pm, (const float *)probs + (size_t)task * tt, tt * sizeof(float));
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, dd, d->scale, q, (int)ld, k, (int)ld, 0.0f, pm, t);
      for (i = 0; i < t; i++) cpu_attn_softmax_row(pm + (size_t)i * t, d->causal ? i + 1 : t, t, lse + (size_t)task * t + i);
    }
    /* dPd = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, dd, 1.0f, go, (int)f, v, (int)ld, 0.0f, dp, t);
    for (i = 0; i < t; i++) {
      double dsum = 0.0;
      for (c = 0; c < dd; c++) dsum += (double)go[(size_t)i * f + c] * ob[(size_t)i * f + c];
      if (d->p > 0.0f) cpu_attn_keep_row(ks, seed, ((uint64_t)task * t + (uint64_t)i) * t, t, thr, dscale, all_drop);
      cpu_attn_ds_row(pm + (size_t)i * t, dp + (size_t)i * t, d->p > 0.0f ? ks : NULL, (float)dsum, t);
    }
    /* beta == 0 overwrites: zero the block first so no old NaN survives a 0 * NaN */
    if (beta == 0.0f)
      for (i = 0; i < t; i++)
        for (part = 0; part < 3; part++) memset(gq + (size_t)i * ld + (size_t)part * f, 0, (size_t)dd * sizeof(float));
    /* dV = Pd^T dO, dQ = scale dS K, dK = scale dS^T Q */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, dd, t, 1.0f, pm, t, go, (int)f, beta, gv, (int)ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, dd, t, d->scale, dp, t, k, (int)ld, beta, gq, (int)ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, dd, t, d->scale, dp, t, q, (int)ld, beta, gk, (int)ld);
  }
  return 0;
}
