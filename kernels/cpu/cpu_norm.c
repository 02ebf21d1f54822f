/* kernels/cpu/cpu_norm.c — batch norm and pooling on oneDNN (fp32, dx overwritten); fp16
 * storage and an accumulating dx run the reference loops (see cpu_backend.c).
 *
 * Batch norm: x [n, c, hw] as oneDNN's nchw [n, c, hw, 1], scale and shift separate (gamma,
 * beta fp32).
 * The training forward writes the batch mean straight into save_mean and the biased variance
 * into the workspace; our loop turns it into save_invstd = 1/sqrt(var + eps) and moves the
 * running statistics as PyTorch does (unbiased variance, as tt_bn_channel_stats). Backward
 * gets the variance back from save_invstd (var = 1/invstd² - eps, in double) into the
 * workspace, and writes dgamma and dbeta through fp32 copies so beta_param applies.
 *
 * Pooling: max takes the first maximum, average divides by the whole window (PyTorch's
 * count_include_pad), as the reference. The forward runs for inference (no workspace kept).
 * Max pooling's backward needs the forward's workspace (where each maximum was): it re-runs
 * the training forward into workspace regions first, in the same step, so nothing lives from
 * the forward to the backward step beyond what the Program already keeps (x).
 */
#include <math.h>
#include <stdio.h>

#include "cpu_internal.h"

/* ---------------------------------- batch norm ---------------------------------------- */

/* Pointer indices: forward training x, y, save_mean, gamma, beta; inference x, y,
 * running_mean, running_var, gamma, beta; backward x, dy, save_mean, gamma, dx, dgamma, dbeta. */
int tt_cpu_bn_build(tt_cpu_build *bd, const tt_op_desc *op) {
  tt_backend *b = bd->b;
  tt_cpu_call *c = bd->c;
  const tt_bn_desc *n = &op->u.bn;
  tt_cpu_variant *v = &c->v[0];
  int64_t dd[4], cd[1];
  dnnl_memory_desc_t data, ch;
  dnnl_batch_normalization_desc_t bnd;
  dnnl_primitive_desc_t pd, hint;
  unsigned flags = dnnl_use_scale | dnnl_use_shift;
  int t;
  snprintf(c->what, sizeof c->what, "%s (n=%d, c=%d, hw=%d, eps=%g)",
           op->kind == TT_OP_BN_BWD ? "bn_bwd" : (op->kind == TT_OP_BN_FWD_TRAIN ? "bn_fwd_train" : "bn_fwd_infer"), n->n,
           n->c, n->hw, (double)n->eps);
  if (n->n <= 0 || n->c <= 0 || n->hw <= 0) return tt_ref_fail(b, "%s: bad shape", c->what);
  c->nb = n->n, c->nv = 1;
  v->nb = n->n;
  /* as [n, c, hw, 1] nchw: oneDNN 2.6 has its vectorised plain-layout batch norm for 4-D and
   * 5-D tensors only (3-D ncw gets its scalar reference) */
  dd[0] = n->n, dd[1] = n->c, dd[2] = n->hw, dd[3] = 1;
  cd[0] = n->c;
  if (tt_cpu_md(b, c->what, &data, 4, dd, dnnl_nchw) || tt_cpu_md(b, c->what, &ch, 1, cd, dnnl_x)) return -1;
  if (op->kind == TT_OP_BN_FWD_INFER) {
    if (TT_CPU_DNNL(b, c->what, dnnl_batch_normalization_forward_desc_init(&bnd, dnnl_forward_inference, &data, n->eps,
                                                                            flags | dnnl_use_global_stats)) ||
        tt_cpu_pd(bd, &bnd, NULL, &pd) || tt_cpu_add_stage(bd, v, pd))
      return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &data, 0, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &data, 0, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_MEAN, TT_CPU_PARAM_IN, &ch, 0, 2) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_VARIANCE, TT_CPU_PARAM_IN, &ch, 0, 3) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SCALE, TT_CPU_PARAM_IN, &ch, 0, 4) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SHIFT, TT_CPU_PARAM_IN, &ch, 0, 5) < 0)
      return -1;
    return 0;
  }
  if (TT_CPU_DNNL(b, c->what, dnnl_batch_normalization_forward_desc_init(&bnd, dnnl_forward_training, &data, n->eps, flags)) ||
      tt_cpu_pd(bd, &bnd, NULL, &pd))
    return -1;
  if (op->kind == TT_OP_BN_FWD_TRAIN) {
    if (tt_cpu_add_stage(bd, v, pd)) return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &data, 0, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &data, 0, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_MEAN, TT_CPU_PARAM_OUT, &ch, 0, 2) < 0 ||
        (t = tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_VARIANCE, TT_CPU_WS, NULL, 0, -1)) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SCALE, TT_CPU_PARAM_IN, &ch, 0, 3) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SHIFT, TT_CPU_PARAM_IN, &ch, 0, 4) < 0)
      return -1;
    c->aux[0] = t;
    return 0;
  }
  hint = pd;
  {
    dnnl_batch_normalization_desc_t bb;
    int rc = TT_CPU_DNNL(b, c->what, dnnl_batch_normalization_backward_desc_init(&bb, dnnl_backward, &data, &data, n->eps, flags));
    if (!rc) rc = tt_cpu_pd(bd, &bb, hint, &pd);
    dnnl_primitive_desc_destroy(hint);
    if (rc || tt_cpu_add_stage(bd, v, pd)) return -1;
  }
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &data, 0, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &data, 0, 1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_MEAN, TT_CPU_PARAM_IN, &ch, 0, 2) < 0 ||
      (t = tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_VARIANCE, TT_CPU_WS, NULL, 0, -1)) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SCALE, TT_CPU_PARAM_IN, &ch, 0, 3) < 0 ||
      /* oneDNN 2.6 wants the shift as an input of the backward too, though no value of it is
       * read (dbeta = sum dy): a workspace region stands in for it */
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SHIFT, TT_CPU_WS, NULL, 0, -1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &data, 0, 4) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SCALE, TT_CPU_GRAD_OUT, &ch, 0, 5) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SHIFT, TT_CPU_GRAD_OUT, &ch, 0, 6) < 0)
    return -1;
  c->aux[0] = t;
  return 0;
}

static void cpu_norm_bn_op(tt_op_desc *op, tt_op_kind kind, int n, int c, int hw, float eps) {
  memset(op, 0, sizeof *op);
  op->kind = kind, op->dt = TT_F32;
  op->u.bn.n = n, op->u.bn.c = c, op->u.bn.hw = hw, op->u.bn.eps = eps;
}

int tt_cpu_bn_fwd_train(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                        float eps, float *save_mean, float *save_invstd, int update_running, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *cl;
  void *ptrs[5];
  const float *var;
  size_t m = (size_t)n * (size_t)hw;
  int ch;
  if (dt != TT_F32)
    return tt_ref_bn_fwd_train(b, n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean,
                               save_invstd, update_running, ws, ws_bytes);
  if (!x || !gamma || !bias || !y || !save_mean || !save_invstd)
    return tt_ref_fail(b, "bn_fwd_train: NULL x, gamma, bias, y, save_mean or save_invstd");
  if (update_running && (!running_mean || !running_var))
    return tt_ref_fail(b, "bn_fwd_train: update_running set but running_mean or running_var is NULL");
  cpu_norm_bn_op(&op, TT_OP_BN_FWD_TRAIN, n, c, hw, eps);
  if (!(cl = tt_cpu_get(b, &op))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = y, ptrs[2] = save_mean, ptrs[3] = (void *)gamma, ptrs[4] = (void *)bias;
  if (tt_cpu_run(b, cl, ptrs, ws, ws_bytes, 0.0f, 0.0f)) return -1;
  var = (const float *)tt_cpu_ws_tensor(cl, cl->aux[0], ws); /* biased batch variance [c] */
  for (ch = 0; ch < c; ch++) {
    double v = var[ch];
    save_invstd[ch] = (float)(1.0 / sqrt(v + (double)eps));
    if (update_running) {
      double unbiased = m > 1 ? v * (double)m / (double)(m - 1) : v;
      running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * save_mean[ch];
      running_var[ch] = (1.0f - momentum) * running_var[ch] + momentum * (float)unbiased;
    }
  }
  return 0;
}

int tt_cpu_bn_fwd_infer(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, const float *running_mean, const float *running_var, float eps,
                        void *y, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *cl;
  void *ptrs[6];
  if (dt != TT_F32) return tt_ref_bn_fwd_infer(b, n, c, hw, dt, x, gamma, bias, running_mean, running_var, eps, y, ws, ws_bytes);
  if (!x || !gamma || !bias || !running_mean || !running_var || !y)
    return tt_ref_fail(b, "bn_fwd_infer: NULL x, gamma, bias, running_mean, running_var or y");
  cpu_norm_bn_op(&op, TT_OP_BN_FWD_INFER, n, c, hw, eps);
  if (!(cl = tt_cpu_get(b, &op))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = y, ptrs[2] = (void *)running_mean, ptrs[3] = (void *)running_var;
  ptrs[4] = (void *)gamma, ptrs[5] = (void *)bias;
  return tt_cpu_run(b, cl, ptrs, ws, ws_bytes, 0.0f, 0.0f);
}

int tt_cpu_bn_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                  const float *gamma, const float *save_mean, const float *save_invstd, void *dx, float *dgamma,
                  float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *cl;
  void *ptrs[7];
  float *var;
  int ch;
  if (dt != TT_F32 || beta_dx != 0.0f || !dx)
    return tt_ref_bn_bwd(b, n, c, hw, dt, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param, ws,
                         ws_bytes);
  if (!x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_ref_fail(b, "bn_bwd: NULL x, dy, gamma, save_mean or save_invstd");
  /* oneDNN wants (variance, eps) where we keep invstd = 1/sqrt(var + eps), and this call is
   * not told eps: the primitive is built with eps = 0 and given 1/invstd^2, which is the same
   * pair to one rounding (cpu_be_key drops the eps of backward calls accordingly) */
  cpu_norm_bn_op(&op, TT_OP_BN_BWD, n, c, hw, 0.0f);
  if (!(cl = tt_cpu_get(b, &op))) return -1;
  if (ws_bytes < cl->ws_bytes || !ws)
    return tt_ref_fail(b, "%s: workspace too small: needs %zu bytes, given %zu", cl->what, cl->ws_bytes, ws_bytes);
  var = (float *)tt_cpu_ws_tensor(cl, cl->aux[0], ws);
  for (ch = 0; ch < c; ch++) {
    double is = save_invstd[ch];
    var[ch] = (float)(1.0 / (is * is));
  }
  ptrs[0] = (void *)x, ptrs[1] = (void *)dy, ptrs[2] = (void *)save_mean, ptrs[3] = (void *)gamma, ptrs[4] = dx;
  ptrs[5] = dgamma, ptrs[6] = dbias;
  return tt_cpu_run(b, cl, ptrs, ws, ws_bytes, 0.0f, beta_param);
}

/* ----------------------------------- pooling ------------------------------------------ */

/* Pointer indices: x, y (forward); x, dy, dx (backward; x unused by average pooling). */
int tt_cpu_pool_build(tt_cpu_build *bd, const tt_op_desc *op) {
  tt_backend *b = bd->b;
  tt_cpu_call *c = bd->c;
  const tt_pool_desc *d = &op->u.pool;
  tt_cpu_variant *v = &c->v[0];
  int64_t xd[4], yd[4];
  dnnl_memory_desc_t mx, my;
  dnnl_dims_t strides, kernel, dil, pad;
  dnnl_alg_kind_t alg = op->pool_mode == TT_POOL_MAX ? dnnl_pooling_max : dnnl_pooling_avg_include_padding;
  dnnl_pooling_v2_desc_t fd, bwd;
  dnnl_primitive_desc_t fpd, bpd;
  char msg[256];
  int t;
  snprintf(c->what, sizeof c->what, "%s %s (n=%d, %dx%dx%d -> %dx%d, kernel %dx%d, stride %dx%d, pad %dx%d)",
           op->kind == TT_OP_POOL_FWD ? "pool_fwd" : "pool_bwd", op->pool_mode == TT_POOL_MAX ? "max" : "avg", d->n, d->c,
           d->h, d->w, d->p, d->q, d->kh, d->kw, d->stride_h, d->stride_w, d->pad_h, d->pad_w);
  if (tt_pool_desc_error(c->what, d, op->pool_mode, op->dt, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg);
  c->nb = d->n, c->nv = 1;
  v->nb = d->n;
  xd[0] = d->n, xd[1] = d->c, xd[2] = d->h, xd[3] = d->w;
  yd[0] = d->n, yd[1] = d->c, yd[2] = d->p, yd[3] = d->q;
  strides[0] = d->stride_h, strides[1] = d->stride_w, kernel[0] = d->kh, kernel[1] = d->kw;
  dil[0] = dil[1] = 0, pad[0] = d->pad_h, pad[1] = d->pad_w;
  if (tt_cpu_md(b, c->what, &mx, 4, xd, dnnl_nchw) || tt_cpu_md(b, c->what, &my, 4, yd, dnnl_nchw)) return -1;
  if (op->kind == TT_OP_POOL_FWD) {
    if (TT_CPU_DNNL(b, c->what, dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_inference, alg, &mx, &my, strides, kernel,
                                                                   dil, pad, pad)) ||
        tt_cpu_pd(bd, &fd, NULL, &fpd) || tt_cpu_add_stage(bd, v, fpd))
      return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &mx, 0, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &my, 0, 1) < 0)
      return -1;
    return 0;
  }
  if (TT_CPU_DNNL(b, c->what, dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_training, alg, &mx, &my, strides, kernel,
                                                                 dil, pad, pad)) ||
      TT_CPU_DNNL(b, c->what, dnnl_pooling_v2_backward_desc_init(&bwd, alg, &mx, &my, strides, kernel, dil, pad, pad)) ||
      tt_cpu_pd(bd, &fd, NULL, &fpd))
    return -1;
  if (op->pool_mode == TT_POOL_AVG) { /* no workspace: the backward alone */
    int rc = tt_cpu_pd(bd, &bwd, fpd, &bpd);
    dnnl_primitive_desc_destroy(fpd);
    if (rc || tt_cpu_add_stage(bd, v, bpd)) return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &my, 0, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &mx, 0, 2) < 0)
      return -1;
    return 0;
  }
  /* max: the training forward again (y and the workspace into regions), then the backward */
  if (tt_cpu_pd(bd, &bwd, fpd, &bpd)) {
    dnnl_primitive_desc_destroy(fpd);
    return -1;
  }
  if (tt_cpu_add_stage(bd, v, fpd)) {
    dnnl_primitive_desc_destroy(bpd);
    return -1;
  }
  if (tt_cpu_add_stage(bd, v, bpd)) return -1;
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &mx, 0, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_WS, NULL, 0, -1) < 0 ||
      (t = tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WORKSPACE, TT_CPU_WS, NULL, 0, -1)) < 0 ||
      tt_cpu_add_tensor(bd, v, 1, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &my, 0, 1) < 0 ||
      tt_cpu_share_tensor(bd, v, 1, DNNL_ARG_WORKSPACE, t) ||
      tt_cpu_add_tensor(bd, v, 1, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &mx, 0, 2) < 0)
    return -1;
  return 0;
}

static void cpu_norm_pool_op(tt_op_desc *op, tt_op_kind kind, const tt_pool_desc *d, tt_pool_mode mode) {
  memset(op, 0, sizeof *op);
  op->kind = kind, op->dt = TT_F32, op->pool_mode = mode;
  op->u.pool = *d;
}

int tt_cpu_pool_fwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, void *y,
                    void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[2];
  char msg[256];
  if (dt != TT_F32) return tt_ref_pool_fwd(b, d, mode, dt, x, y, ws, ws_bytes);
  if (tt_pool_desc_error("pool_fwd", d, mode, dt, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg);
  if (!x || !y) return tt_ref_fail(b, "pool_fwd: NULL x or y");
  cpu_norm_pool_op(&op, TT_OP_POOL_FWD, d, mode);
  if (!(c = tt_cpu_get(b, &op))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = y;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, 0.0f);
}

int tt_cpu_pool_bwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x,
                    const void *dy, void *dx, float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[3];
  char msg[256];
  if (dt != TT_F32 || beta != 0.0f) return tt_ref_pool_bwd(b, d, mode, dt, x, dy, dx, beta, ws, ws_bytes);
  if (tt_pool_desc_error("pool_bwd", d, mode, dt, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg);
  if ((mode == TT_POOL_MAX && !x) || !dy || !dx) return tt_ref_fail(b, "pool_bwd: NULL x (max), dy or dx");
  cpu_norm_pool_op(&op, TT_OP_POOL_BWD, d, mode);
  if (!(c = tt_cpu_get(b, &op))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = (void *)dy, ptrs[2] = dx;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, 0.0f);
}
