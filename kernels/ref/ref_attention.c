/* kernels/ref/ref_attention.c — fused-QKV scaled dot-product attention (nn.MultiheadAttention's
 * core), forward and backward; the reference form the CPU backend also runs.
 *
 * Every value goes through tt_ref_ld / tt_ref_st (or tt_ref_to_f32), so a tensor dtype is read
 * and written in one place (ref.h) and everything is computed in fp32, reductions in double.
 * Determinism: the loop over (sample, head) pairs is parallel with schedule(static) and each
 * pair's sums are serial inside its task, so results do not depend on the thread count.
 *
 * Attention, per (sample s, head h), with t tokens and head width d (f = heads*d):
 *   Q, K, V [t, d] (rows of qkv [n, t, 3, heads, d] at stride 3f), packed into fp32 scratch;
 *   S = scale * Q K^T (cblas_sgemm), causal: S[i, j] = -inf for j > i;
 *   lse[i] = m + log(sum_j exp(S[i, j] - m)), m = max_j S[i, j];  P = exp(S - lse)
 *   (P is computed from lse, not as exp(S - m) / sum, so the fused backward, which rebuilds P
 *   from Q, K and lse with the same sgemm, gets bit for bit the forward's P);
 *   Pd = P * keep / (1 - p) with keep from tt_dropout_hash(seed, ((s*heads + h)*t + i)*t + j);
 *   O = Pd V.
 * Backward: dPd = dO V^T; dP = dPd * keep / (1 - p); dS = P * (dP - D) with
 *   D[i] = sum_j P[i, j] dP[i, j] = sum_j Pd[i, j] (dO V^T)[i, j] = rowsum(dO * O)[i]
 * (dropout included, since O = Pd V); dQ = scale dS K, dK = scale dS^T Q, dV = Pd^T dO.
 * Scratch (tt_ref_attn_workspace): per thread, fp32 [t, d] blocks and [t, t] blocks; the
 * OpenMP loop over the n*heads (s, h) pairs gives thread k the k-th slice.
 */
#include <cblas.h>
#include <math.h>

#include "ref_internal.h"

/* The calling thread's index in its OpenMP team (0 without OpenMP): which scratch slice it owns. */
static int ref_attn_omp_thread(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* Per-thread scratch in floats: fwd Q, K, V, O [t, d] and S [t, t]; bwd Q, K, V, dO, dQ, dK,
 * dV [t, d] and two [t, t] (P then Pd, dP then dS). Each part rounded to 64 bytes. */
static size_t ref_attn_thread_floats(const tt_attn_desc *d, int bwd) {
  size_t td = tt_ref_round_floats((size_t)d->t * d->d), tt = tt_ref_round_floats((size_t)d->t * d->t);
  return bwd ? 7 * td + 2 * tt : 4 * td + tt;
}

static int ref_attn_check(tt_backend *b, const char *op, const tt_attn_desc *d, tt_dtype dt) {
  if (!d) return tt_ref_fail(b, "%s: NULL attention desc", op);
  if (d->n < 1 || d->t < 1 || d->heads < 1 || d->d < 1)
    return tt_ref_fail(b, "%s: bad shape n=%d t=%d heads=%d d=%d (all must be >= 1; f = heads*d, so f %% heads == 0)",
                       op, d->n, d->t, d->heads, d->d);
  if (!(d->p >= 0.0f && d->p <= 1.0f))
    return tt_ref_fail(b, "%s: attention dropout probability %g is outside [0, 1]", op, (double)d->p);
  if (!(d->scale == d->scale) || d->scale == INFINITY || d->scale == -INFINITY)
    return tt_ref_fail(b, "%s: attention scale %g is not finite", op, (double)d->scale);
  return tt_ref_dt_check(b, op, dt);
}

size_t tt_ref_attn_workspace(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, int bwd) {
  if (ref_attn_check(b, bwd ? "attn_bwd workspace" : "attn_fwd workspace", d, dt)) return TT_WS_ERROR;
  return (size_t)tt_ref_threads(b) * ref_attn_thread_floats(d, bwd) * sizeof(float);
}

/* Checks that ws holds every thread's share; *per: one thread's share in floats. */
static int ref_attn_ws(tt_backend *b, const char *op, const tt_attn_desc *d, int bwd, const void *ws, size_t ws_bytes,
                       size_t *per) {
  size_t need;
  *per = ref_attn_thread_floats(d, bwd);
  need = (size_t)tt_ref_threads(b) * *per * sizeof(float);
  if (!ws || ws_bytes < need)
    return tt_ref_fail(b, "%s: workspace too small: needs %zu bytes (op_workspace of TT_OP_ATTN_%s), given %zu%s", op,
                       need, bwd ? "BWD" : "FWD", ws_bytes, ws ? "" : " (NULL)");
  return 0;
}

/* Packs rows [t, d] of one head of qkv (part 0 = q, 1 = k, 2 = v) into fp32 q, k and v. */
static void ref_attn_pack(tt_dtype dt, const void *qkv, const tt_attn_desc *d, int s, int h, float *q, float *k,
                          float *v) {
  float *dst[3] = {q, k, v};
  size_t f = (size_t)d->heads * d->d, i, c, part;
  for (part = 0; part < 3; part++)
    for (i = 0; i < (size_t)d->t; i++) {
      size_t off = (((size_t)s * d->t + i) * 3 + part) * f + (size_t)h * d->d;
      for (c = 0; c < (size_t)d->d; c++) dst[part][i * d->d + c] = tt_ref_ld(dt, qkv, off + c);
    }
}

/* Dropout threshold and scale on the probabilities, as the dropout op (ref_elementwise.c). */
typedef struct ref_attn_drop {
  uint32_t thr; /* an entry is dropped when its hash's high 32 bits are below thr */
  float scale;  /* a kept entry's factor, 1 / (1 - p) */
  int all;      /* p >= 1: everything dropped */
} ref_attn_drop;

static ref_attn_drop ref_attn_drop_of(float p) {
  ref_attn_drop r;
  r.all = p >= 1.0f;
  r.thr = r.all ? 0u : (uint32_t)((double)p * 4294967296.0);
  r.scale = r.all ? 0.0f : 1.0f / (1.0f - p);
  return r;
}

/* Whether probability entry idx (over all tasks' [t, t] blocks) is kept under seed. */
static int ref_attn_keep(const ref_attn_drop *dr, uint64_t seed, uint64_t idx) {
  return !dr->all && (uint32_t)(tt_dropout_hash(seed, idx) >> 32) >= dr->thr;
}

/* S = scale * Q K^T into s [t, t], then P = exp(S - lse) in place (masked entries 0). When
 * lse_in is NULL the row statistics are computed here and written to lse_out (may be NULL). */
static void ref_attn_probs(const tt_attn_desc *d, const float *q, const float *k, float *s, const float *lse_in,
                           float *lse_out) {
  int t = d->t, i, j;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d->d, d->scale, q, d->d, k, d->d, 0.0f, s, t);
  for (i = 0; i < t; i++) {
    float *row = s + (size_t)i * t, l;
    int jend = d->causal ? i + 1 : t;
    if (lse_in) {
      l = lse_in[i];
    } else {
      float m = row[0];
      double sum = 0.0;
      for (j = 1; j < jend; j++) m = row[j] > m ? row[j] : m;
      for (j = 0; j < jend; j++) sum += exp((double)row[j] - (double)m);
      l = (float)((double)m + log(sum));
      if (lse_out) lse_out[i] = l;
    }
    for (j = 0; j < jend; j++) row[j] = expf(row[j] - l);
    for (; j < t; j++) row[j] = 0.0f;
  }
}

int tt_ref_attn_fwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, void *o, float *lse,
                    void *probs, uint64_t seed, void *ws, size_t ws_bytes) {
  ptrdiff_t task, ntask;
  int nt = tt_ref_threads(b);
  size_t per;
  (void)nt;
  if (ref_attn_check(b, "attn_fwd", d, dt)) return -1;
  if (!qkv || !o) return tt_ref_fail(b, "attn_fwd: NULL qkv or o");
  if (ref_attn_ws(b, "attn_fwd", d, 0, ws, ws_bytes, &per)) return -1;
  const ref_attn_drop drop = ref_attn_drop_of(d->p);
  ntask = (ptrdiff_t)d->n * d->heads;
#pragma omp parallel for schedule(static) num_threads(nt) if (ntask > 1 && (double)ntask * d->t * d->t * d->d > 1e5)
  for (task = 0; task < ntask; task++) {
    int s = (int)(task / d->heads), h = (int)(task % d->heads), t = d->t, i, j;
    size_t td = tt_ref_round_floats((size_t)t * d->d), f = (size_t)d->heads * d->d, c;
    float *q = (float *)ws + (size_t)ref_attn_omp_thread() * per, *k = q + td, *v = k + td, *ob = v + td, *sm = ob + td;
    float *lrow = lse ? lse + (size_t)task * t : NULL;
    ref_attn_pack(dt, qkv, d, s, h, q, k, v);
    ref_attn_probs(d, q, k, sm, NULL, lrow);
    if (probs) {
      size_t base = (size_t)task * t * t;
      for (i = 0; i < t * t; i++) tt_ref_st(dt, probs, base + (size_t)i, sm[i]);
    }
    if (d->p > 0.0f) {
      uint64_t base = (uint64_t)task * t * t;
      for (i = 0; i < t; i++)
        for (j = 0; j < t; j++) {
          uint64_t idx = base + (uint64_t)i * t + j;
          sm[(size_t)i * t + j] = ref_attn_keep(&drop, seed, idx) ? sm[(size_t)i * t + j] * drop.scale : 0.0f;
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d->d, t, 1.0f, sm, t, v, d->d, 0.0f, ob, d->d);
    for (i = 0; i < t; i++) {
      size_t off = ((size_t)s * t + i) * f + (size_t)h * d->d;
      for (c = 0; c < (size_t)d->d; c++) tt_ref_st(dt, o, off + c, ob[(size_t)i * d->d + c]);
    }
  }
  return 0;
}

int tt_ref_attn_bwd(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, const void *o,
                    const void *dout, const float *lse, const void *probs, uint64_t seed, void *dqkv, float beta,
                    void *ws, size_t ws_bytes) {
  ptrdiff_t task, ntask;
  int nt = tt_ref_threads(b);
  size_t per;
  (void)nt;
  if (ref_attn_check(b, "attn_bwd", d, dt)) return -1;
  if (!qkv || !o || !dout || !dqkv) return tt_ref_fail(b, "attn_bwd: NULL qkv, o, dout or dqkv");
  if (!probs && !lse) return tt_ref_fail(b, "attn_bwd: needs the forward's probs or its lse (both NULL)");
  if (dqkv == qkv || dqkv == dout || dqkv == o) return tt_ref_fail(b, "attn_bwd: dqkv may not alias qkv, o or dout");
  if (ref_attn_ws(b, "attn_bwd", d, 1, ws, ws_bytes, &per)) return -1;
  const ref_attn_drop drop = ref_attn_drop_of(d->p);
  ntask = (ptrdiff_t)d->n * d->heads;
#pragma omp parallel for schedule(static) num_threads(nt) if (ntask > 1 && (double)ntask * d->t * d->t * d->d > 1e5)
  for (task = 0; task < ntask; task++) {
    int s = (int)(task / d->heads), h = (int)(task % d->heads), t = d->t, dd = d->d, i, j, part;
    size_t td = tt_ref_round_floats((size_t)t * dd), tt = tt_ref_round_floats((size_t)t * t);
    size_t f = (size_t)d->heads * dd, c;
    float *q = (float *)ws + (size_t)ref_attn_omp_thread() * per, *k = q + td, *v = k + td, *go = v + td;
    float *gq = go + td, *gk = gq + td, *gv = gk + td, *pm = gv + td, *dp = pm + tt;
    const float *outs[3];
    ref_attn_pack(dt, qkv, d, s, h, q, k, v);
    for (i = 0; i < t; i++) {
      size_t off = ((size_t)s * t + i) * f + (size_t)h * dd;
      for (c = 0; c < (size_t)dd; c++) go[(size_t)i * dd + c] = tt_ref_ld(dt, dout, off + c);
    }
    /* P: the stored forward probabilities, or rebuilt from Q, K and lse */
    if (probs) {
      size_t base = (size_t)task * t * t;
      for (i = 0; i < t * t; i++) pm[i] = tt_ref_ld(dt, probs, base + (size_t)i);
    } else {
      ref_attn_probs(d, q, k, pm, lse + (size_t)task * t, NULL);
    }
    /* dPd = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, dd, 1.0f, go, dd, v, dd, 0.0f, dp, t);
    for (i = 0; i < t; i++) {
      size_t off = ((size_t)s * t + i) * f + (size_t)h * dd;
      double dsum = 0.0;
      float dr;
      for (c = 0; c < (size_t)dd; c++) dsum += (double)go[(size_t)i * dd + c] * tt_ref_ld(dt, o, off + c);
      dr = (float)dsum; /* D[i] = rowsum(dO * O) */
      for (j = 0; j < t; j++) {
        size_t e = (size_t)i * t + j;
        float keep_scale = 1.0f;
        if (d->p > 0.0f) {
          uint64_t idx = (uint64_t)task * t * t + e;
          keep_scale = ref_attn_keep(&drop, seed, idx) ? drop.scale : 0.0f;
        }
        dp[e] = pm[e] * (dp[e] * keep_scale - dr); /* dS */
        pm[e] *= keep_scale;                       /* Pd */
      }
    }
    /* dV = Pd^T dO, dQ = scale dS K, dK = scale dS^T Q */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, dd, t, 1.0f, pm, t, go, dd, 0.0f, gv, dd);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, dd, t, d->scale, dp, t, k, dd, 0.0f, gq, dd);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, dd, t, d->scale, dp, t, q, dd, 0.0f, gk, dd);
    outs[0] = gq;
    outs[1] = gk;
    outs[2] = gv;
    for (i = 0; i < t; i++)
      for (part = 0; part < 3; part++) {
        size_t off = (((size_t)s * t + i) * 3 + (size_t)part) * f + (size_t)h * dd;
        for (c = 0; c < (size_t)dd; c++) tt_ref_st_beta(dt, dqkv, off + c, outs[part][(size_t)i * dd + c], beta);
      }
  }
  return 0;
}
