/* kernels/cpu/cpu_transformer.c — the transformer ops on the CPU backend: layer norm and GELU
 * as oneDNN primitives (fp32), attention as threaded OpenBLAS products over the caller's own
 * strided layouts (fp32); fp16, and the cases a primitive cannot take, run the reference loops
 * (kernels/ref/ref_transformer.c, ref_elementwise.c).
 *
 * Layer norm: x [rows, f] plain (tag ab), statistics [rows], gamma/beta [f] as oneDNN's
 * separate scale and shift (dnnl_use_scale | dnnl_use_shift). oneDNN keeps the variance where
 * backend.h keeps 1/sqrt(var + eps):
 *   forward (always forward_training, so inference and training share one call): mean and
 *     variance land in the workspace; save_mean is the mean, save_invstd = 1/sqrt(var + eps);
 *   backward: the workspace gets var' = 1/invstd^2 and the primitive runs with eps = 0, so it
 *     normalises with 1/sqrt(var') = invstd (to rounding) and ln_bwd needs no eps (backend.h
 *     gives it none; the TT_OP_LN_BWD key drops it).
 * dx added into (beta_dx != 0) and dgamma/dbeta go through fp32 workspace copies combined by
 * the call runner (cpu_dnnl.c), as every oneDNN output here.
 *
 * GELU (both forms) forward and backward-with-dx-overwritten run oneDNN's eltwise primitive,
 * which needs no workspace: act_fwd/act_bwd have none to give. With dx added into they run the
 * reference loop.
 *
 * Attention (fp32): per (sample, head) task over OpenMP threads, as the reference does, but the
 * OpenBLAS products read q, k, v and write o and dqkv in place through their row strides (3f and
 * f) instead of packed copies, and the softmax's exponentials, which cost more than the products
 * at ViT's head widths when libm computes them one call per element, are a polynomial the
 * compiler vectorises (cpu_tf_exp; AVX-512/AVX2/baseline clones). Forward and the fused
 * backward's rebuild share the one row function, so kept and rebuilt probabilities are equal bit
 * for bit here too. Results equal the reference's to rounding (tests/test_cpu_vs_ref.c); the
 * workspace is the reference's answer (a superset: per thread [t, t] scores, or two [t, t] and
 * a row in backward). fp16 runs the reference loops. Tasks are (sample, head) pairs, so fewer
 * pairs than threads leaves threads idle (batch-1 evaluation); the products stay single-threaded
 * inside a task (OpenBLAS allocates per threaded call).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>

#include "cpu_internal.h"

/* ---- layer norm ---- */

/* The workspace offset of the TT_CPU_WS tensor that stage 0 passes as arg. */
static size_t cpu_tf_ws_off(const tt_cpu_call *c, int arg) {
  const tt_cpu_variant *v = &c->v[0];
  int k;
  for (k = 0; k < v->s[0].nt; k++)
    if (v->s[0].arg[k] == arg) return v->t[v->s[0].t[k]].off;
  return (size_t)-1;
}

/* Pointer indices: forward x, gamma, beta, y; backward x, dy, mean, gamma, dx, dgamma, dbeta. */
int tt_cpu_ln_build(tt_cpu_build *bd, const tt_op_desc *op) {
  tt_backend *b = bd->b;
  tt_cpu_call *c = bd->c;
  const tt_ln_desc *l = &op->u.ln;
  tt_cpu_variant *v = &c->v[0];
  int64_t dd[2], ds[1], dp[1];
  dnnl_memory_desc_t md, ms, mp;
  dnnl_layer_normalization_desc_t fd, bwd;
  dnnl_primitive_desc_t fpd = NULL, pd;
  unsigned flags = dnnl_use_scale | dnnl_use_shift;
  int fwd = op->kind == TT_OP_LN_FWD, ts;
  snprintf(c->what, sizeof c->what, "%s (rows=%d, f=%d, fp32)", fwd ? "ln_fwd" : "ln_bwd", l->rows, l->f);
  if (l->rows <= 0 || l->f <= 0) return tt_ref_fail(b, "%s: bad shape", c->what);
  if (op->dt != TT_F32) return tt_ref_fail(b, "%s: internal error: oneDNN layer norm is fp32 only", c->what);
  c->nb = l->rows, c->nv = 1;
  v->nb = l->rows;
  dd[0] = l->rows, dd[1] = l->f, ds[0] = l->rows, dp[0] = l->f;
  if (tt_cpu_md(b, c->what, &md, 2, dd, dnnl_ab) || tt_cpu_md(b, c->what, &ms, 1, ds, dnnl_a) ||
      tt_cpu_md(b, c->what, &mp, 1, dp, dnnl_a))
    return -1;
  if (TT_CPU_DNNL(b, c->what,
                  dnnl_layer_normalization_forward_desc_init(&fd, dnnl_forward_training, &md, &ms, fwd ? l->eps : 0.0f, flags)))
    return -1;
  if (fwd) {
    if (tt_cpu_pd(bd, &fd, NULL, &pd) || tt_cpu_add_stage(bd, v, pd)) return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, TT_F32, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SCALE, TT_CPU_PARAM_IN, &mp, TT_F32, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SHIFT, TT_CPU_PARAM_IN, &mp, TT_F32, 2) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &md, TT_F32, 3) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_MEAN, TT_CPU_WS, NULL, TT_F32, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_VARIANCE, TT_CPU_WS, NULL, TT_F32, 0) < 0)
      return -1;
    return 0;
  }
  /* backward needs the forward's primitive desc as its hint */
  if (tt_cpu_pd(bd, &fd, NULL, &fpd)) return -1;
  if (TT_CPU_DNNL(b, c->what, dnnl_layer_normalization_backward_desc_init(&bwd, dnnl_backward, &md, &md, &ms, 0.0f, flags)) ||
      tt_cpu_pd(bd, &bwd, fpd, &pd)) {
    dnnl_primitive_desc_destroy(fpd);
    return -1;
  }
  dnnl_primitive_desc_destroy(fpd);
  if (tt_cpu_add_stage(bd, v, pd)) return -1;
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, TT_F32, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &md, TT_F32, 1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_MEAN, TT_CPU_ACT_IN, &ms, TT_F32, 2) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_VARIANCE, TT_CPU_WS, NULL, TT_F32, 0) < 0 ||
      (ts = tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SCALE, TT_CPU_PARAM_IN, &mp, TT_F32, 3)) < 0 ||
      /* oneDNN 2.6 counts the shift among backward's inputs with dnnl_use_shift though it never
       * reads it (dy does not depend on beta); ln_bwd has no beta, so gamma stands in */
      tt_cpu_share_tensor(bd, v, 0, DNNL_ARG_SHIFT, ts) ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &md, TT_F32, 4) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SCALE, TT_CPU_GRAD_OUT, &mp, TT_F32, 5) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SHIFT, TT_CPU_GRAD_OUT, &mp, TT_F32, 6) < 0)
    return -1;
  return 0;
}

static void cpu_tf_ln_op(tt_op_desc *op, tt_op_kind kind, int rows, int f, float eps, int accumulate) {
  memset(op, 0, sizeof *op);
  op->kind = kind, op->dt = TT_F32, op->accumulate = accumulate;
  op->u.ln.rows = rows, op->u.ln.f = f, op->u.ln.eps = kind == TT_OP_LN_FWD ? eps : 0.0f;
}

int tt_cpu_ln_fwd(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const float *gamma, const float *beta,
                  float eps, void *y, float *save_mean, float *save_invstd, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[4];
  size_t om, ov;
  int r;
  if (dt != TT_F32 || rows <= 0 || f <= 0 || !x || !gamma || !beta || !y || !(eps >= 0.0f) ||
      (save_mean == NULL) != (save_invstd == NULL))
    return tt_ref_ln_fwd(b, rows, f, dt, x, gamma, beta, eps, y, save_mean, save_invstd, ws, ws_bytes);
  cpu_tf_ln_op(&op, TT_OP_LN_FWD, rows, f, eps, 0);
  if (!(c = tt_cpu_get(b, &op))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = (void *)gamma, ptrs[2] = (void *)beta, ptrs[3] = y;
  if (tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, 0.0f)) return -1;
  if (!save_mean) return 0;
  om = cpu_tf_ws_off(c, DNNL_ARG_MEAN), ov = cpu_tf_ws_off(c, DNNL_ARG_VARIANCE);
  for (r = 0; r < rows; r++) {
    save_mean[r] = ((const float *)((const char *)ws + om))[r];
    save_invstd[r] = (float)(1.0 / sqrt((double)((const float *)((const char *)ws + ov))[r] + (double)eps));
  }
  return 0;
}

int tt_cpu_ln_bwd(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                  const float *save_mean, const float *save_invstd, void *dx, float *dgamma, float *dbeta,
                  float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[7];
  float *var;
  int r;
  /* dx NULL (parameter gradients only) and dx aliasing dy run the loops */
  if (dt != TT_F32 || rows <= 0 || f <= 0 || !x || !dy || !gamma || !save_mean || !save_invstd || !dx || dx == dy)
    return tt_ref_ln_bwd(b, rows, f, dt, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, beta_dx, beta_param, ws,
                         ws_bytes);
  cpu_tf_ln_op(&op, TT_OP_LN_BWD, rows, f, 0.0f, beta_dx != 0.0f);
  if (!(c = tt_cpu_get(b, &op))) return -1;
  if (ws_bytes < c->ws_bytes || !ws)
    return tt_ref_fail(b, "%s: workspace too small: needs %zu bytes, given %zu%s", c->what, c->ws_bytes, ws_bytes,
                       ws ? "" : " (NULL)");
  var = (float *)((char *)ws + cpu_tf_ws_off(c, DNNL_ARG_VARIANCE));
  for (r = 0; r < rows; r++) {
    double is = save_invstd[r];
    var[r] = (float)(1.0 / (is * is));
  }
  ptrs[0] = (void *)x, ptrs[1] = (void *)dy, ptrs[2] = (void *)save_mean, ptrs[3] = (void *)gamma, ptrs[4] = dx;
  ptrs[5] = dgamma, ptrs[6] = dbeta;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, beta_dx, beta_param);
}

/* ---- GELU ---- */

/* Pointer indices: forward x, y; backward dy, x, dx. */
int tt_cpu_gelu_build(tt_cpu_build *bd, const tt_op_desc *op) {
  tt_backend *b = bd->b;
  tt_cpu_call *c = bd->c;
  tt_cpu_variant *v = &c->v[0];
  int64_t dd[1];
  dnnl_memory_desc_t md;
  dnnl_eltwise_desc_t fd, bwd;
  dnnl_primitive_desc_t fpd = NULL, pd;
  dnnl_alg_kind_t alg = op->u.act.act == TT_ACT_GELU_TANH ? dnnl_eltwise_gelu_tanh : dnnl_eltwise_gelu_erf;
  int fwd = op->kind == TT_OP_ACT_FWD;
  snprintf(c->what, sizeof c->what, "%s GELU (%s, count=%zu, fp32)", fwd ? "act_fwd" : "act_bwd",
           op->u.act.act == TT_ACT_GELU_TANH ? "tanh" : "erf", op->u.act.count);
  if (op->u.act.count == 0 || op->dt != TT_F32 || (op->u.act.act != TT_ACT_GELU_ERF && op->u.act.act != TT_ACT_GELU_TANH))
    return tt_ref_fail(b, "%s: internal error: not a oneDNN GELU call", c->what);
  c->nb = 1, c->nv = 1;
  v->nb = 1;
  dd[0] = (int64_t)op->u.act.count;
  if (tt_cpu_md(b, c->what, &md, 1, dd, dnnl_a)) return -1;
  if (TT_CPU_DNNL(b, c->what, dnnl_eltwise_forward_desc_init(&fd, dnnl_forward_training, alg, &md, 0.0f, 0.0f))) return -1;
  if (fwd) {
    if (tt_cpu_pd(bd, &fd, NULL, &pd) || tt_cpu_add_stage(bd, v, pd)) return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, TT_F32, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &md, TT_F32, 1) < 0)
      return -1;
    return 0;
  }
  if (tt_cpu_pd(bd, &fd, NULL, &fpd)) return -1;
  if (TT_CPU_DNNL(b, c->what, dnnl_eltwise_backward_desc_init(&bwd, alg, &md, &md, 0.0f, 0.0f)) ||
      tt_cpu_pd(bd, &bwd, fpd, &pd)) {
    dnnl_primitive_desc_destroy(fpd);
    return -1;
  }
  dnnl_primitive_desc_destroy(fpd);
  if (tt_cpu_add_stage(bd, v, pd)) return -1;
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &md, TT_F32, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, TT_F32, 1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &md, TT_F32, 2) < 0)
    return -1;
  return 0;
}

/* The GELU call for (kind, act, count), or NULL when it would need workspace (the act entries
 * have none) or failed to build (then the loops run: the error is not the caller's). */
static const tt_cpu_call *cpu_tf_gelu_call(tt_backend *b, tt_op_kind kind, tt_act a, size_t count) {
  tt_op_desc op;
  const tt_cpu_call *c;
  memset(&op, 0, sizeof op);
  op.kind = kind, op.dt = TT_F32;
  op.u.act.count = count, op.u.act.act = a;
  c = tt_cpu_get(b, &op);
  return c && c->ws_bytes == 0 ? c : NULL;
}

int tt_cpu_gelu_fwd(tt_backend *b, tt_act a, size_t count, const float *x, float *y) {
  const tt_cpu_call *c = cpu_tf_gelu_call(b, TT_OP_ACT_FWD, a, count);
  void *ptrs[2];
  if (!c) return tt_ref_act_fwd(b, a, count, TT_F32, x, y);
  ptrs[0] = (void *)x, ptrs[1] = y;
  return tt_cpu_run(b, c, ptrs, NULL, 0, 0.0f, 0.0f);
}

int tt_cpu_gelu_bwd(tt_backend *b, tt_act a, size_t count, const float *x, const float *dy, float *dx) {
  const tt_cpu_call *c = cpu_tf_gelu_call(b, TT_OP_ACT_BWD, a, count);
  void *ptrs[3];
  if (!c) return tt_ref_act_bwd(b, a, count, TT_F32, x, dy, dx, 0.0f);
  ptrs[0] = (void *)dy, ptrs[1] = (void *)x, ptrs[2] = dx;
  return tt_cpu_run(b, c, ptrs, NULL, 0, 0.0f, 0.0f);
}

/* ---- attention (fp32) ---- */

#if defined(__GNUC__) && !defined(__CUDACC__) && (defined(__x86_64__) || defined(__i386__))
#define CPU_TF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_TF_CLONES
#endif

/* exp(x) for x <= 0 in plain float arithmetic the compiler vectorises (libm's expf is a call
 * per element): x = n ln2 + r with |r| <= ln2/2, exp(r) by the degree-6 Taylor-like minimax
 * polynomial of Cephes' expf, times 2^n built in the exponent bits: within 8e-8 relative of exp
 * over [-87, 0] (measured against double exp in steps of 1e-4). Below about -87.7 (where n
 * would be -127, the subnormal range) it returns 0: probabilities that small are zero to any
 * tolerance. The softmax rows use it in forward and in the rebuild alike,
 * so the fused backward still sees the forward's probabilities bit for bit. */
static inline float cpu_tf_exp(float x) {
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
static CPU_TF_CLONES float cpu_tf_softmax_row(float *row, int jend, int t, const float *lse_in) {
  float l;
  int j;
  if (lse_in) {
    l = *lse_in;
  } else {
    float m = row[0], sum = 0.0f;
#pragma omp simd reduction(max : m)
    for (j = 0; j < jend; j++) m = row[j] > m ? row[j] : m;
#pragma omp simd reduction(+ : sum)
    for (j = 0; j < jend; j++) sum += cpu_tf_exp(row[j] - m);
    l = m + logf(sum);
  }
#pragma omp simd
  for (j = 0; j < jend; j++) row[j] = cpu_tf_exp(row[j] - l);
  for (j = jend; j < t; j++) row[j] = 0.0f;
  return l;
}

/* dS = P * (dPd * keep - D) and Pd = P * keep over one row (keep_scale: 1/(1-p) or 0 per
 * element, or NULL for no dropout). */
static CPU_TF_CLONES void cpu_tf_ds_row(float *p, float *dp, const float *keep_scale, float dr, int t) {
  int j;
  if (!keep_scale) {
#pragma omp simd
    for (j = 0; j < t; j++) dp[j] = p[j] * (dp[j] - dr);
    return;
  }
#pragma omp simd
  for (j = 0; j < t; j++) {
    dp[j] = p[j] * (dp[j] * keep_scale[j] - dr);
    p[j] *= keep_scale[j];
  }
}

/* keep_scale[j] of row i of task: 1/(1-p) where kept, else 0 (the reference's rule). */
static void cpu_tf_keep_row(float *ks, uint64_t seed, uint64_t base, int t, uint32_t thr, float dscale, int all_drop) {
  int j;
  for (j = 0; j < t; j++)
    ks[j] = (!all_drop && (uint32_t)(tt_dropout_hash(seed, base + (uint64_t)j) >> 32) >= thr) ? dscale : 0.0f;
}

static int cpu_tf_attn_fast(const tt_attn_desc *d, tt_dtype dt) {
  return dt == TT_F32 && d && d->n >= 1 && d->t >= 1 && d->heads >= 1 && d->d >= 1 && d->p >= 0.0f && d->p <= 1.0f &&
         isfinite(d->scale);
}

/* Dropout parameters as the reference's (ref_transformer.c). */
static void cpu_tf_drop(float p, uint32_t *thr, float *dscale, int *all_drop) {
  *all_drop = p >= 1.0f;
  *thr = *all_drop ? 0u : (uint32_t)((double)p * 4294967296.0);
  *dscale = *all_drop ? 0.0f : 1.0f / (1.0f - p);
}

static int cpu_tf_thread(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* Scratch per thread: the reference's answer (op_workspace is the reference's) split evenly;
 * forward uses S [t, t] and a keep row [t]; backward P, dP [t, t] and a keep row. */
int tt_cpu_attn_fwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, void *o, float *lse,
                    void *probs, uint64_t seed, void *ws, size_t ws_bytes) {
  ptrdiff_t task, ntask;
  size_t need, per;
  int nt = tt_ref_threads(b), all_drop;
  uint32_t thr;
  float dscale;
  if (!cpu_tf_attn_fast(d, dt) || !qkv || !o) return tt_ref_attn_fwd(b, d, dt, qkv, o, lse, probs, seed, ws, ws_bytes);
  need = tt_ref_attn_workspace(b, d, dt, 0);
  if (need == TT_WS_ERROR) return -1;
  if (!ws || ws_bytes < need)
    return tt_ref_fail(b, "attn_fwd: workspace too small: needs %zu bytes (op_workspace of TT_OP_ATTN_FWD), given %zu%s",
                       need, ws_bytes, ws ? "" : " (NULL)");
  per = need / sizeof(float) / (size_t)nt;
  cpu_tf_drop(d->p, &thr, &dscale, &all_drop);
  ntask = (ptrdiff_t)d->n * d->heads;
#pragma omp parallel for schedule(static) num_threads(nt) if (ntask > 1 && (double)ntask * d->t * d->t * d->d > 1e5)
  for (task = 0; task < ntask; task++) {
    int s = (int)(task / d->heads), h = (int)(task % d->heads), t = d->t, dd = d->d, i, j;
    size_t f = (size_t)d->heads * dd, ld = 3 * f;
    float *sm = (float *)ws + (size_t)cpu_tf_thread() * per, *ks = sm + (size_t)t * t;
    const float *q = (const float *)qkv + (size_t)s * t * ld + (size_t)h * dd, *k = q + f, *v = q + 2 * f;
    float *ob = (float *)o + (size_t)s * t * f + (size_t)h * dd;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, dd, d->scale, q, (int)ld, k, (int)ld, 0.0f, sm, t);
    for (i = 0; i < t; i++) {
      float l = cpu_tf_softmax_row(sm + (size_t)i * t, d->causal ? i + 1 : t, t, NULL);
      if (lse) lse[(size_t)task * t + i] = l;
    }
    if (probs) memcpy((float *)probs + (size_t)task * t * t, sm, (size_t)t * t * sizeof(float));
    if (d->p > 0.0f)
      for (i = 0; i < t; i++) {
        float *row = sm + (size_t)i * t;
        cpu_tf_keep_row(ks, seed, ((uint64_t)task * t + (uint64_t)i) * t, t, thr, dscale, all_drop);
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
  size_t need, per;
  int nt = tt_ref_threads(b), all_drop;
  uint32_t thr;
  float dscale;
  if (!cpu_tf_attn_fast(d, dt) || !qkv || !o || !dout || !dqkv || (!probs && !lse) || dqkv == qkv || dqkv == dout ||
      dqkv == o)
    return tt_ref_attn_bwd(b, d, dt, qkv, o, dout, lse, probs, seed, dqkv, beta, ws, ws_bytes);
  need = tt_ref_attn_workspace(b, d, dt, 1);
  if (need == TT_WS_ERROR) return -1;
  if (!ws || ws_bytes < need)
    return tt_ref_fail(b, "attn_bwd: workspace too small: needs %zu bytes (op_workspace of TT_OP_ATTN_BWD), given %zu%s",
                       need, ws_bytes, ws ? "" : " (NULL)");
  per = need / sizeof(float) / (size_t)nt;
  cpu_tf_drop(d->p, &thr, &dscale, &all_drop);
  ntask = (ptrdiff_t)d->n * d->heads;
#pragma omp parallel for schedule(static) num_threads(nt) if (ntask > 1 && (double)ntask * d->t * d->t * d->d > 1e5)
  for (task = 0; task < ntask; task++) {
    int s = (int)(task / d->heads), h = (int)(task % d->heads), t = d->t, dd = d->d, i, c, part;
    size_t f = (size_t)d->heads * dd, ld = 3 * f, tt = (size_t)t * t;
    float *pm = (float *)ws + (size_t)cpu_tf_thread() * per, *dp = pm + tt, *ks = dp + tt;
    const float *q = (const float *)qkv + (size_t)s * t * ld + (size_t)h * dd, *k = q + f, *v = q + 2 * f;
    const float *go = (const float *)dout + (size_t)s * t * f + (size_t)h * dd;
    const float *ob = (const float *)o + (size_t)s * t * f + (size_t)h * dd;
    float *gq = (float *)dqkv + (size_t)s * t * ld + (size_t)h * dd, *gk = gq + f, *gv = gq + 2 * f;
    if (probs) {
      memcpy(pm, (const float *)probs + (size_t)task * tt, tt * sizeof(float));
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, dd, d->scale, q, (int)ld, k, (int)ld, 0.0f, pm, t);
      for (i = 0; i < t; i++) cpu_tf_softmax_row(pm + (size_t)i * t, d->causal ? i + 1 : t, t, lse + (size_t)task * t + i);
    }
    /* dPd = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, dd, 1.0f, go, (int)f, v, (int)ld, 0.0f, dp, t);
    for (i = 0; i < t; i++) {
      double dsum = 0.0;
      for (c = 0; c < dd; c++) dsum += (double)go[(size_t)i * f + c] * ob[(size_t)i * f + c];
      if (d->p > 0.0f) cpu_tf_keep_row(ks, seed, ((uint64_t)task * t + (uint64_t)i) * t, t, thr, dscale, all_drop);
      cpu_tf_ds_row(pm + (size_t)i * t, dp + (size_t)i * t, d->p > 0.0f ? ks : NULL, (float)dsum, t);
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
