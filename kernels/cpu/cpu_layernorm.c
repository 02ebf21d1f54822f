/* kernels/cpu/cpu_layernorm.c — layer norm on the CPU backend as oneDNN primitives (fp32); fp16,
 * and the cases a primitive cannot take, run the reference loops (kernels/ref/ref_layernorm.c).
 *
 * x [rows, f] plain (tag ab), statistics [rows], gamma/beta [f] as oneDNN's separate scale and
 * shift (dnnl_use_scale | dnnl_use_shift). oneDNN keeps the variance where backend.h keeps
 * 1/sqrt(var + eps):
 *   forward (always forward_training, so inference and training share one call): mean and
 *     variance land in the workspace; save_mean is the mean, save_invstd = 1/sqrt(var + eps);
 *   backward: the workspace gets var' = 1/invstd^2 and the primitive runs with eps = 0, so it
 *     normalises with 1/sqrt(var') = invstd (to rounding) and ln_bwd needs no eps (backend.h
 *     gives it none; the TT_OP_LN_BWD key drops it).
 * dx added into (beta_dx != 0) and dgamma/dbeta go through fp32 workspace copies combined by
 * the call runner (cpu_dnnl.c), as every oneDNN output here.
 */
#include <math.h>
#include <stdio.h>

#include "cpu_internal.h"


/* The workspace offset of the TT_CPU_WS tensor that stage 0 passes as arg. */
static size_t cpu_ln_ws_off(const tt_cpu_call *c, int arg) {
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
  dnnl_primitive_desc_t pd;
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
  if (TT_CPU_DNNL(b, c->what, dnnl_layer_normalization_backward_desc_init(&bwd, dnnl_backward, &md, &md, &ms, 0.0f, flags)) ||
      tt_cpu_add_bwd_stage(bd, v, &fd, &bwd))
    return -1;
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

static void cpu_ln_ln_op(tt_op_desc *op, tt_op_kind kind, int rows, int f, float eps, int accumulate) {
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
  cpu_ln_ln_op(&op, TT_OP_LN_FWD, rows, f, eps, 0);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_ln_build))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = (void *)gamma, ptrs[2] = (void *)beta, ptrs[3] = y;
  if (tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, 0.0f)) return -1;
  if (!save_mean) return 0;
  om = cpu_ln_ws_off(c, DNNL_ARG_MEAN), ov = cpu_ln_ws_off(c, DNNL_ARG_VARIANCE);
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
  cpu_ln_ln_op(&op, TT_OP_LN_BWD, rows, f, 0.0f, beta_dx != 0.0f);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_ln_build))) return -1;
  if (ws_bytes < c->ws_bytes || !ws)
    return tt_ref_fail(b, "%s: workspace too small: needs %zu bytes, given %zu%s", c->what, c->ws_bytes, ws_bytes,
                       ws ? "" : " (NULL)");
  var = (float *)((char *)ws + cpu_ln_ws_off(c, DNNL_ARG_VARIANCE));
  for (r = 0; r < rows; r++) {
    double is = save_invstd[r];
    var[r] = (float)(1.0 / (is * is));
  }
  ptrs[0] = (void *)x, ptrs[1] = (void *)dy, ptrs[2] = (void *)save_mean, ptrs[3] = (void *)gamma, ptrs[4] = dx;
  ptrs[5] = dgamma, ptrs[6] = dbeta;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, beta_dx, beta_param);
}
