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
 * Attention (fp32): per (sample, head) task, as the reference does, but the products read q, k,
 * v and write o in place through their row strides (3f and f) instead of packed copies, the
 * softmax runs in fp32 vector loops, and dropout's keep test is one pass. Results equal the
 * reference to rounding (tests/test_cpu_vs_ref.c); per-thread scratch as the reference's.
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
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, 0, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SCALE, TT_CPU_PARAM_IN, &mp, 0, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SHIFT, TT_CPU_PARAM_IN, &mp, 0, 2) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &md, 0, 3) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_MEAN, TT_CPU_WS, NULL, 0, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_VARIANCE, TT_CPU_WS, NULL, 0, 0) < 0)
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
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, 0, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &md, 0, 1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_MEAN, TT_CPU_ACT_IN, &ms, 0, 2) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_VARIANCE, TT_CPU_WS, NULL, 0, 0) < 0 ||
      (ts = tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SCALE, TT_CPU_PARAM_IN, &mp, 0, 3)) < 0 ||
      /* oneDNN 2.6 counts the shift among backward's inputs with dnnl_use_shift though it never
       * reads it (dy does not depend on beta); ln_bwd has no beta, so gamma stands in */
      tt_cpu_share_tensor(bd, v, 0, DNNL_ARG_SHIFT, ts) ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &md, 0, 4) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SCALE, TT_CPU_GRAD_OUT, &mp, 0, 5) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SHIFT, TT_CPU_GRAD_OUT, &mp, 0, 6) < 0)
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
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, 0, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &md, 0, 1) < 0)
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
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &md, 0, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, 0, 1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &md, 0, 2) < 0)
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
