/* kernels/cpu/cpu_bn_blk.c — batch norm on nChw16c activations (backend.h's bn_blk), fp32.
 *
 * x [n, c/16, hw, 16]: a unit (sample i, channel block b) is a contiguous slab of hw rows of 16
 * channels, one 512-bit vector a row. The planner gives this layout only to fp32 programs on a
 * CPU whose oneDNN has AVX-512 (the Winograd convolutions, cpu_conv.c), so every loop here is a
 * span over rows of exactly 16 lanes in cpu_vec.h's per-ISA copies.
 *
 * The expressions are cpu_bn.c's row loops' (the same one-pass shifted sums with the same
 * fallback to an exact second pass, the same apply y = (x - mean) * (invstd * gamma) + bias, the
 * same backward constants), so the two layouts agree to float rounding, not bit for bit: the sums
 * are grouped differently. Order: each unit sums its rows in chunks of CPU_BNB_ROWS in float, the
 * chunks added in double; the units' doubles are added in sample order per channel. Units are
 * shared among threads, but what a unit computes does not depend on which thread takes it, so
 * the bits depend on the shape only, never on the thread count.
 *
 * Workspace (tt_cpu_bn_blk_workspace, op_workspace's answer for a blk desc; the training forward
 * and the backward): the units' two partial sums per channel in double, then c doubles and 2c
 * floats of per-channel constants. Evaluation and the recomputed forward need none: a unit makes
 * its 16 channels' constants itself. Nothing is allocated during a call.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_vec.h"

#define CPU_BNB 16        /* channels in a block: one row */
#define CPU_BNB_ROWS 512  /* rows summed in float lanes before going to double */
#define CPU_BNB_SHIFT_SAMPLES 32
#define CPU_BNB_SHIFT_MAX 8.0 /* cpu_bn.c's CPU_BN_SHIFT_MAX: the rule for the exact second pass */

/* ---- spans over nr rows of 16 channels; per-channel constants [16] ---- */

/* ps += r - shift, pt += (r - shift)^2 */
CPU_VEC_FN(cpu_bnb_sum2, (float *ps, float *pt, const float *r, size_t nr, const float *shift), (ps, pt, r, nr, shift), {
  float s[CPU_BNB], t[CPU_BNB]; /* locals: ps and pt could alias r, which would keep them in memory */
  size_t i;
  int j;
  for (j = 0; j < CPU_BNB; j++) s[j] = ps[j], t[j] = pt[j];
  for (i = 0; i < nr; i++, r += CPU_BNB) {
    CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) {
      float d = r[j] - shift[j];
      s[j] += d;
      t[j] += d * d;
    }
  }
  for (j = 0; j < CPU_BNB; j++) ps[j] = s[j], pt[j] = t[j];
})

/* ps += (r - mean)^2 */
CPU_VEC_FN(cpu_bnb_sqdev, (float *ps, const float *r, size_t nr, const float *mean), (ps, r, nr, mean), {
  float s[CPU_BNB]; /* a local, as above */
  size_t i;
  int j;
  for (j = 0; j < CPU_BNB; j++) s[j] = ps[j];
  for (i = 0; i < nr; i++, r += CPU_BNB) {
    CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) {
      float d = r[j] - mean[j];
      s[j] += d * d;
    }
  }
  for (j = 0; j < CPU_BNB; j++) ps[j] = s[j];
})

/* o = (r - mean) * k + sh; relu: then max with 0, NaN kept (cpu_bn.c's CPU_BN_RELU_OUT);
 * sc not NULL: o = relu(that + sc) (bn_fwd_train_add_relu; o may be sc exactly) */
CPU_VEC_FN(cpu_bnb_affine, (const float *r, const float *sc, float *o, size_t nr, const float *mean, const float *k,
                            const float *sh, int relu),
           (r, sc, o, nr, mean, k, sh, relu), {
  size_t i;
  int j;
  for (i = 0; i < nr; i++, r += CPU_BNB, o += CPU_BNB) {
    if (sc) {
      CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) {
        float y = (r[j] - mean[j]) * k[j] + sh[j] + sc[j];
        o[j] = ((y > 0.0f) | (y != y)) ? y : 0.0f;
      }
      sc += CPU_BNB;
    } else if (relu) {
      CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) {
        float y = (r[j] - mean[j]) * k[j] + sh[j];
        o[j] = ((y > 0.0f) | (y != y)) ? y : 0.0f;
      }
    } else {
      CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) o[j] = (r[j] - mean[j]) * k[j] + sh[j];
    }
  }
})

/* ps += d, pt += d * (r - mean), d = g, or with relu 0 where the forward's output
 * (r - mean) * fk + fb is not > 0 (bn_bwd_relu) */
CPU_VEC_FN(cpu_bnb_bwd_sums, (float *ps, float *pt, const float *r, const float *g, size_t nr, const float *mean,
                              const float *fk, const float *fb, int relu),
           (ps, pt, r, g, nr, mean, fk, fb, relu), {
  float s[CPU_BNB], t[CPU_BNB]; /* locals, as above */
  size_t i;
  int j;
  for (j = 0; j < CPU_BNB; j++) s[j] = ps[j], t[j] = pt[j];
  for (i = 0; i < nr; i++, r += CPU_BNB, g += CPU_BNB) {
    if (relu) {
      CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) {
        float d = ((r[j] - mean[j]) * fk[j] + fb[j]) > 0.0f ? g[j] : 0.0f;
        s[j] += d;
        t[j] += d * (r[j] - mean[j]);
      }
    } else {
      CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) {
        s[j] += g[j];
        t[j] += g[j] * (r[j] - mean[j]);
      }
    }
  }
  for (j = 0; j < CPU_BNB; j++) ps[j] = s[j], pt[j] = t[j];
})

/* o = beta * o + a * (d - mdy - (r - mean) * k), d as above (o may be g exactly) */
CPU_VEC_FN(cpu_bnb_bwd_dx, (const float *r, const float *g, float *o, size_t nr, const float *mean, const float *a,
                            const float *mdy, const float *k, const float *fb, float beta, int relu),
           (r, g, o, nr, mean, a, mdy, k, fb, beta, relu), {
  size_t i;
  int j;
  for (i = 0; i < nr; i++, r += CPU_BNB, g += CPU_BNB, o += CPU_BNB) {
    float d[CPU_BNB];
    if (relu) {
      CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) d[j] = ((r[j] - mean[j]) * a[j] + fb[j]) > 0.0f ? g[j] : 0.0f;
    } else {
      CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) d[j] = g[j];
    }
    if (beta == 0.0f) { /* o not read (it may hold anything, NaN included) */
      CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) o[j] = a[j] * (d[j] - mdy[j] - (r[j] - mean[j]) * k[j]);
    } else {
      CPU_VEC_SIMD for (j = 0; j < CPU_BNB; j++) o[j] = beta * o[j] + a[j] * (d[j] - mdy[j] - (r[j] - mean[j]) * k[j]);
    }
  }
})

/* ---- passes over the units ---- */

/* One pass's arguments: kind 0 shifted sums, 1 squared deviations, 2 apply, 3 backward sums,
 * 4 backward dx. Per-channel arrays are [c] (a unit reads its block's 16). */
typedef struct cpu_bnb_pass {
  int kind, relu;
  size_t units, cb, hw;
  const float *x, *sc, *g;
  float *o;
  const float *mean;   /* kinds 1 to 4 */
  const float *invstd; /* kinds 2 to 4; kind 2 with NULL: 1 / sqrt(running_var + eps) */
  const float *running_var, *gamma, *bias;
  const float *shift;  /* kind 0 */
  const float *mdy, *kk; /* kind 4: mean(dy) and mean(dy * xhat) * invstd */
  float eps, beta;
  double *part; /* kinds 0, 1, 3: [units][16] and, kinds 0 and 3, [units][16] after */
} cpu_bnb_pass;

/* Unit u (sample u / cb, block u % cb): its slab at u * hw * 16; its channels from (u % cb) * 16.
 * k = invstd * gamma per channel, made here (the same float product in every pass, so the
 * recomputed ReLU mask and bn_apply see the training forward's constants). */
static void cpu_bnb_unit(const cpu_bnb_pass *P, size_t u) {
  const size_t off = u * P->hw * CPU_BNB, co = (u % P->cb) * CPU_BNB;
  const float *r = P->x + off;
  float k[CPU_BNB];
  size_t r0;
  int j;
  if (P->kind >= 2)
    for (j = 0; j < CPU_BNB; j++) {
      float is = P->invstd ? P->invstd[co + j] : (float)(1.0 / sqrt((double)P->running_var[co + j] + (double)P->eps));
      k[j] = is * P->gamma[co + j];
    }
  if (P->kind == 2) {
    cpu_bnb_affine(r, P->sc ? P->sc + off : NULL, P->o + off, P->hw, P->mean + co, k, P->bias + co, P->relu);
    return;
  }
  if (P->kind == 4) {
    cpu_bnb_bwd_dx(r, P->g + off, P->o + off, P->hw, P->mean + co, k, P->mdy + co, P->kk + co,
                   P->relu ? P->bias + co : NULL, P->beta, P->relu);
    return;
  }
  {
    double s[CPU_BNB] = {0}, q[CPU_BNB] = {0};
    for (r0 = 0; r0 < P->hw; r0 += CPU_BNB_ROWS) {
      const size_t nr = P->hw - r0 < CPU_BNB_ROWS ? P->hw - r0 : CPU_BNB_ROWS;
      float ps[CPU_BNB] = {0}, pt[CPU_BNB] = {0};
      const float *rr = r + r0 * CPU_BNB;
      if (P->kind == 0) cpu_bnb_sum2(ps, pt, rr, nr, P->shift + co);
      else if (P->kind == 1) cpu_bnb_sqdev(ps, rr, nr, P->mean + co);
      else cpu_bnb_bwd_sums(ps, pt, rr, P->g + off + r0 * CPU_BNB, nr, P->mean + co, k, P->relu ? P->bias + co : NULL,
                            P->relu);
      for (j = 0; j < CPU_BNB; j++) s[j] += ps[j], q[j] += pt[j];
    }
    memcpy(P->part + u * CPU_BNB, s, sizeof s);
    if (P->kind != 1) memcpy(P->part + (P->units + u) * CPU_BNB, q, sizeof q);
  }
}

static void cpu_bnb_run(int nt, const cpu_bnb_pass *P) {
  long u, units = (long)P->units;
  _Pragma("omp parallel for num_threads(nt) schedule(static)") for (u = 0; u < units; u++) cpu_bnb_unit(P, (size_t)u);
}

/* channel ch's sum over the samples of part ([units][16], after `second` units more), in sample order */
static double cpu_bnb_total(const cpu_bnb_pass *P, int second, size_t n, size_t ch) {
  double t = 0.0;
  size_t i, b = ch / CPU_BNB, l = ch % CPU_BNB;
  for (i = 0; i < n; i++) t += P->part[((second ? P->units : 0) + i * P->cb + b) * CPU_BNB + l];
  return t;
}

/* Workspace bytes of a training forward or backward of n samples of c channels (the header). */
static size_t cpu_bnb_ws(int n, int c) {
  size_t nn = (size_t)(n > 0 ? n : 0), cc = (size_t)(c > 0 ? c : 0);
  return 2u * nn * cc * sizeof(double) + cc * sizeof(double) + 2u * cc * sizeof(float);
}

size_t tt_cpu_bn_blk_workspace(const tt_op_desc *op) { return cpu_bnb_ws(op->u.bn.n, op->u.bn.c); }

/* Checks a's shape, dtype and the operands its kind reads; 0 or the backend's failure. */
static int cpu_bnb_check(tt_backend *b, const tt_bn_blk_args *a, size_t ws_need) {
  static const char *const names[] = {"fwd_train", "fwd_add_relu", "fwd_infer", "apply", "bwd", "bwd_add_relu"};
  const char *nm = a->kind >= 0 && a->kind <= TT_BNB_BWD_ADD_RELU ? names[a->kind] : "?";
  int fwd = a->kind <= TT_BNB_APPLY;
  if (a->kind < 0 || a->kind > TT_BNB_BWD_ADD_RELU)
    return tt_ref_fail(b, "bn_blk: unknown kind %d (tt_bn_blk_kind; kernels/cpu/cpu_bn_blk.c)", a->kind);
  if (a->dt != TT_F32)
    return tt_ref_fail(b, "bn_blk %s: %s activations; nChw16c batch norm takes fp32 only (the planner gives the layout "
                          "to fp32 programs only)", nm, tt_dtype_name(a->dt) ? tt_dtype_name(a->dt) : "unknown");
  if (a->n <= 0 || a->hw <= 0 || a->c <= 0 || a->c % CPU_BNB)
    return tt_ref_fail(b, "bn_blk %s: bad shape n=%d c=%d hw=%d (c must be a positive multiple of 16 for nChw16c)", nm, a->n,
                       a->c, a->hw);
  if (!a->x || !a->gamma || (fwd && (!a->out || !a->bias)) || (!fwd && !a->dy) ||
      (a->kind != TT_BNB_FWD_INFER && (!a->save_mean || !a->save_invstd)) ||
      (a->kind == TT_BNB_FWD_INFER && (!a->running_mean || !a->running_var)) ||
      (a->kind == TT_BNB_FWD_ADD_RELU && !a->s) || (a->kind == TT_BNB_BWD && a->relu && !a->bias) ||
      (a->kind == TT_BNB_BWD_ADD_RELU && !a->y && !a->mask) ||
      (a->update_running && a->kind <= TT_BNB_FWD_ADD_RELU && (!a->running_mean || !a->running_var)))
    return tt_ref_fail(b, "bn_blk %s (%dx%dx%d): an operand its kind reads or writes is NULL (backend.h's tt_bn_blk_args)", nm,
                       a->n, a->c, a->hw);
  if (ws_need && (!a->ws || a->ws_bytes < ws_need))
    return tt_ref_fail(b, "bn_blk %s (%dx%dx%d): workspace of %zu bytes given, %zu needed; pass what op_workspace answers "
                          "for the op (kernels/cpu/cpu_bn_blk.c)", nm, a->n, a->c, a->hw, a->ws ? a->ws_bytes : (size_t)0,
                       ws_need);
  return 0;
}

/* The training forward's statistics into save_mean and save_invstd (and the running ones):
 * shifted one-pass sums, the exact pass where cpu_bn.c's rule asks for it. sq [c], shift and
 * mean [c]: the workspace's constants. */
static void cpu_bnb_stats(int nt, const tt_bn_blk_args *a, cpu_bnb_pass *P, double *sq, float *shift, float *mean) {
  const size_t n = (size_t)a->n, c = (size_t)a->c, hw = (size_t)a->hw, m = n * hw;
  const size_t ns = m < CPU_BNB_SHIFT_SAMPLES ? m : CPU_BNB_SHIFT_SAMPLES;
  size_t ch, s;
  int exact = 0;
  /* the shift: the float mean of ns of the channel's values spread evenly over it (cpu_bn.c's rule) */
  for (ch = 0; ch < c; ch++) {
    float sum = 0.0f;
    for (s = 0; s < ns; s++) {
      const size_t e = s * m / ns, i = e / hw, p = e % hw;
      sum += a->x[((i * P->cb + ch / CPU_BNB) * hw + p) * CPU_BNB + ch % CPU_BNB];
    }
    shift[ch] = sum / (float)ns;
  }
  P->kind = 0, P->shift = shift;
  cpu_bnb_run(nt, P);
  for (ch = 0; ch < c; ch++) {
    double sd = cpu_bnb_total(P, 0, n, ch), q = cpu_bnb_total(P, 1, n, ch), md = sd / (double)m;
    double var = q / (double)m - md * md;
    if (!(var > 0.0) || md * md > CPU_BNB_SHIFT_MAX * var) exact = 1;
    mean[ch] = (float)((double)shift[ch] + md);
    sq[ch] = q - sd * (sd / (double)m);
  }
  if (exact) { /* the squared deviations from the (float) mean, for every channel */
    P->kind = 1, P->mean = mean;
    cpu_bnb_run(nt, P);
    for (ch = 0; ch < c; ch++) sq[ch] = cpu_bnb_total(P, 0, n, ch);
  }
  for (ch = 0; ch < c; ch++) {
    /* exact: the float mean the deviations were taken from (cpu_bn.c's rows do the same) */
    double mean_d = exact ? (double)mean[ch] : (double)shift[ch] + cpu_bnb_total(P, 0, n, ch) / (double)m;
    tt_bn_channel_stats(mean_d, sq[ch], m, a->eps, a->momentum, a->update_running, a->save_mean + ch, a->save_invstd + ch,
                        a->update_running ? a->running_mean + ch : NULL, a->update_running ? a->running_var + ch : NULL);
  }
}

int tt_cpu_bn_blk(tt_backend *b, const tt_bn_blk_args *a) {
  const int bwd = a && (a->kind == TT_BNB_BWD || a->kind == TT_BNB_BWD_ADD_RELU);
  const int train = a && (a->kind == TT_BNB_FWD_TRAIN || a->kind == TT_BNB_FWD_ADD_RELU);
  cpu_bnb_pass P;
  size_t c, m, ch;
  int nt;
  if (!a) return tt_ref_fail(b, "bn_blk: NULL arguments");
  if (cpu_bnb_check(b, a, train || bwd ? cpu_bnb_ws(a->n, a->c) : 0)) return -1;
  c = (size_t)a->c, m = (size_t)a->n * (size_t)a->hw;
  nt = tt_cpu_threads_for(b, m * c);
  memset(&P, 0, sizeof P);
  P.units = (size_t)a->n * (c / CPU_BNB), P.cb = c / CPU_BNB, P.hw = (size_t)a->hw, P.x = a->x, P.gamma = a->gamma;
  P.eps = a->eps;
  /* the workspace: the units' sums [2][units][16] doubles, then sq [c] doubles, then two [c] floats */
  double *sq = train || bwd ? (double *)a->ws + 2 * P.units * CPU_BNB : NULL;
  float *f0 = sq ? (float *)(sq + c) : NULL, *f1 = f0 ? f0 + c : NULL;
  P.part = (double *)a->ws;
  if (bwd) {
    int rc = 0;
    if (a->kind == TT_BNB_BWD_ADD_RELU) { /* the ReLU's backward into dy, the shortcut's gradient, then plain bn_bwd */
      rc = a->mask ? b->act_bwd_mask(b, TT_ACT_RELU, m * c, TT_F32, a->mask, a->dy, a->dy, 0.0f)
                   : b->act_bwd(b, TT_ACT_RELU, m * c, TT_F32, a->y, a->dy, a->dy, 0.0f);
      if (!rc && a->ds && a->ds != a->dy) rc = b->accumulate(b, m * c, TT_F32, a->dy, a->ds, a->beta_s);
    }
    if (rc) return rc;
    P.relu = a->kind == TT_BNB_BWD && a->relu;
    P.kind = 3, P.g = a->dy, P.mean = a->save_mean, P.invstd = a->save_invstd, P.bias = P.relu ? a->bias : NULL;
    cpu_bnb_run(nt, &P);
    for (ch = 0; ch < c; ch++) {
      float invstd = a->save_invstd[ch];
      double sdy = cpu_bnb_total(&P, 0, (size_t)a->n, ch), sdyx = cpu_bnb_total(&P, 1, (size_t)a->n, ch) * invstd;
      if (a->dbias) a->dbias[ch] = tt_ref_beta_f32(a->dbias[ch], (float)sdy, a->beta_param);
      if (a->dgamma) a->dgamma[ch] = tt_ref_beta_f32(a->dgamma[ch], (float)sdyx, a->beta_param);
      f0[ch] = (float)(sdy / (double)m);
      f1[ch] = (float)(sdyx / (double)m) * invstd;
    }
    if (a->out) { /* NULL: the input needs no gradient (frozen layers before it), only the parameters do */
      P.kind = 4, P.o = a->out, P.mdy = f0, P.kk = f1, P.beta = a->beta_dx;
      cpu_bnb_run(nt, &P);
    }
    return 0;
  }
  if (train) {
    cpu_bnb_stats(nt, a, &P, sq, f0, f1);
    P.mean = a->save_mean, P.invstd = a->save_invstd;
  } else if (a->kind == TT_BNB_FWD_INFER) { /* the running statistics (evaluation) */
    P.mean = a->running_mean, P.invstd = NULL, P.running_var = a->running_var;
  } else { /* the saved ones (a recomputed forward) */
    P.mean = a->save_mean, P.invstd = a->save_invstd;
  }
  P.kind = 2, P.o = a->out, P.sc = a->kind == TT_BNB_FWD_ADD_RELU ? a->s : NULL, P.relu = a->relu, P.bias = a->bias;
  cpu_bnb_run(nt, &P);
  return 0;
}
