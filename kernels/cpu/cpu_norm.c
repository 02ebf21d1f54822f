/* kernels/cpu/cpu_norm.c — batch norm (our vectorised loops, cpu_elementwise.c) and pooling
 * on oneDNN (fp32, and bf16 where oneDNN computes it: tt_cpu_compute_type; dx overwritten);
 * fp16 pooling and an accumulating pooling dx run the reference loops (see cpu_backend.c), in
 * NCHW or NHWC (the state's nhwc_pool: the pooling loops walk a channel's plane c apart).
 *
 * Pooling: max takes the first maximum, average divides by the whole window (PyTorch's
 * count_include_pad), as the reference. The forward runs for inference (no workspace kept).
 * Max pooling's backward needs the forward's workspace (where each maximum was): it re-runs
 * the training forward into workspace regions first, in the same step, so nothing lives from
 * the forward to the backward step beyond what the Program already keeps (x). oneDNN's JIT
 * pooling on plain NCHW: 1.2 against 10 ms forward, 8 against 132 ms backward (the reference
 * finds each window's maximum again per input element) for 128x32x28x28, one thread.
 */
#include <math.h>
#include <stdio.h>

#include "cpu_internal.h"

/* ---------------------------------- batch norm ---------------------------------------- */

/* fp32, bf16 and fp16: the vectorised loops of cpu_elementwise.c (oneDNN 2.6's plain-layout
 * batch norm ran 6-8x slower than they do: 9.9 against 1.6 ms forward, 19.3 against 2.3 ms
 * backward for 128x32x28x28 on one thread); anything else (or a bad argument) goes to the
 * reference, which checks and reports. Workspace: the NHWC rows' per-block partial sums
 * (tt_cpu_bn_workspace, answered by op_workspace), none otherwise. */
static int cpu_bn_loops_dt(tt_dtype dt) { return dt == TT_F32 || dt == TT_BF16 || dt == TT_F16; }

int tt_cpu_bn_fwd_train(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                        float eps, float *save_mean, float *save_invstd, int update_running, void *ws, size_t ws_bytes) {
  if (!cpu_bn_loops_dt(dt) || n <= 0 || c <= 0 || hw <= 0 || !x || !gamma || !bias || !y || !save_mean || !save_invstd ||
      (update_running && (!running_mean || !running_var)))
    return tt_ref_bn_fwd_train(b, n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean,
                               save_invstd, update_running, ws, ws_bytes); /* checks and reports */
  return tt_cpu_bn_fwd_loops(b, n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean,
                             save_invstd, update_running, TT_CPU_BN_BATCH, ws, ws_bytes);
}

int tt_cpu_bn_fwd_infer(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, const float *running_mean, const float *running_var, float eps,
                        void *y, void *ws, size_t ws_bytes) {
  if (!cpu_bn_loops_dt(dt) || n <= 0 || c <= 0 || hw <= 0 || !x || !gamma || !bias || !running_mean || !running_var || !y)
    return tt_ref_bn_fwd_infer(b, n, c, hw, dt, x, gamma, bias, running_mean, running_var, eps, y, ws, ws_bytes);
  return tt_cpu_bn_fwd_loops(b, n, c, hw, dt, x, gamma, bias, y, (float *)running_mean, (float *)running_var, 0.0f, eps,
                             NULL, NULL, 0, TT_CPU_BN_RUNNING, NULL, 0);
}

/* The training forward's normalisation with given statistics: the same loops in
 * TT_CPU_BN_SAVED mode, so y is bit for bit what bn_fwd_train wrote from the same x and
 * statistics (that mode needs no workspace). */
int tt_cpu_bn_apply(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                    const float *bias, const float *save_mean, const float *save_invstd, void *y) {
  if (!cpu_bn_loops_dt(dt) || n <= 0 || c <= 0 || hw <= 0 || !x || !gamma || !bias || !save_mean || !save_invstd || !y)
    return tt_ref_bn_apply(b, n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, y); /* checks and reports */
  return tt_cpu_bn_fwd_loops(b, n, c, hw, dt, x, gamma, bias, y, NULL, NULL, 0.0f, 0.0f, (float *)save_mean,
                             (float *)save_invstd, 0, TT_CPU_BN_SAVED, NULL, 0);
}

int tt_cpu_bn_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                  const float *gamma, const float *save_mean, const float *save_invstd, void *dx, float *dgamma,
                  float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  if (!cpu_bn_loops_dt(dt) || n <= 0 || c <= 0 || hw <= 0 || !x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_ref_bn_bwd(b, n, c, hw, dt, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param, ws,
                         ws_bytes);
  return tt_cpu_bn_bwd_loops(b, n, c, hw, dt, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                             beta_param, ws, ws_bytes);
}

/* ----------------------------------- pooling ------------------------------------------ */

/* Pointer indices: x, y (forward); x, dy, dx (backward; x unused by average pooling). */
int tt_cpu_pool_build(tt_cpu_build *bd, const tt_op_desc *op) {
  tt_backend *b = bd->b;
  tt_cpu_call *c = bd->c;
  const tt_pool_desc *d = &op->u.pool;
  tt_cpu_variant *v = &c->v[0];
  int64_t xd[4], yd[4];
  dnnl_memory_desc_t mx, my;   /* the caller's, fp32 plain */
  dnnl_memory_desc_t px, py;   /* the primitive's: plain, in the compute type (bf16 runs bf16 pooling) */
  dnnl_data_type_t ct = tt_cpu_compute_type(op->dt);
  dnnl_format_tag_t tag = d->layout == TT_LAYOUT_NHWC ? dnnl_nhwc : dnnl_nchw; /* the caller's, kept by the primitive */
  dnnl_dims_t strides, kernel, dil, pad;
  dnnl_alg_kind_t alg = op->pool_mode == TT_POOL_MAX ? dnnl_pooling_max : dnnl_pooling_avg_include_padding;
  dnnl_pooling_v2_desc_t fd, bwd;
  dnnl_primitive_desc_t fpd, bpd;
  char msg[256];
  int t;
  snprintf(c->what, sizeof c->what, "%s %s (n=%d, %dx%dx%d -> %dx%d, kernel %dx%d, stride %dx%d, pad %dx%d, %s)",
           op->kind == TT_OP_POOL_FWD ? "pool_fwd" : "pool_bwd", op->pool_mode == TT_POOL_MAX ? "max" : "avg", d->n, d->c,
           d->h, d->w, d->p, d->q, d->kh, d->kw, d->stride_h, d->stride_w, d->pad_h, d->pad_w, tt_layout_name(d->layout));
  if (tt_ref_dt_check(b, c->what, op->dt)) return -1;
  if (tt_pool_desc_error(c->what, d, op->pool_mode, TT_F32, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg); /* dtype checked above */
  c->nb = d->n, c->nv = 1;
  v->nb = d->n;
  xd[0] = d->n, xd[1] = d->c, xd[2] = d->h, xd[3] = d->w;
  yd[0] = d->n, yd[1] = d->c, yd[2] = d->p, yd[3] = d->q;
  strides[0] = d->stride_h, strides[1] = d->stride_w, kernel[0] = d->kh, kernel[1] = d->kw;
  dil[0] = dil[1] = 0, pad[0] = d->pad_h, pad[1] = d->pad_w;
  if (tt_cpu_md(b, c->what, &mx, 4, xd, tag) || tt_cpu_md(b, c->what, &my, 4, yd, tag) ||
      tt_cpu_md_dt(b, c->what, &px, 4, xd, tag, ct) || tt_cpu_md_dt(b, c->what, &py, 4, yd, tag, ct))
    return -1;
  if (op->kind == TT_OP_POOL_FWD) {
    if (TT_CPU_DNNL(b, c->what, dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_inference, alg, &px, &py, strides, kernel,
                                                                   dil, pad, pad)) ||
        tt_cpu_pd(bd, &fd, NULL, &fpd) || tt_cpu_add_stage(bd, v, fpd))
      return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &mx, op->dt, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &my, op->dt, 1) < 0)
      return -1;
    return 0;
  }
  if (TT_CPU_DNNL(b, c->what, dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_training, alg, &px, &py, strides, kernel,
                                                                 dil, pad, pad)) ||
      TT_CPU_DNNL(b, c->what, dnnl_pooling_v2_backward_desc_init(&bwd, alg, &px, &py, strides, kernel, dil, pad, pad)) ||
      tt_cpu_pd(bd, &fd, NULL, &fpd))
    return -1;
  if (op->pool_mode == TT_POOL_AVG) { /* no workspace: the backward alone */
    int rc = tt_cpu_pd(bd, &bwd, fpd, &bpd);
    dnnl_primitive_desc_destroy(fpd);
    if (rc || tt_cpu_add_stage(bd, v, bpd)) return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &my, op->dt, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &mx, op->dt, 2) < 0)
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
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &mx, op->dt, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_WS, NULL, TT_F32, -1) < 0 ||
      (t = tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WORKSPACE, TT_CPU_WS, NULL, TT_F32, -1)) < 0 ||
      tt_cpu_add_tensor(bd, v, 1, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &my, op->dt, 1) < 0 ||
      tt_cpu_share_tensor(bd, v, 1, DNNL_ARG_WORKSPACE, t) ||
      tt_cpu_add_tensor(bd, v, 1, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &mx, op->dt, 2) < 0)
    return -1;
  return 0;
}

static void cpu_norm_pool_op(tt_op_desc *op, tt_op_kind kind, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt) {
  memset(op, 0, sizeof *op);
  op->kind = kind, op->dt = dt, op->pool_mode = mode;
  if (d) op->u.pool = *d;
}

int tt_cpu_pool_fwd(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x, void *y,
                    void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[2];
  char msg[256];
  cpu_norm_pool_op(&op, TT_OP_POOL_FWD, d, mode, dt);
  if (!tt_cpu_uses_dnnl(&op)) return tt_ref_pool_fwd(b, d, mode, dt, x, y, ws, ws_bytes);
  if (tt_ref_dt_check(b, "pool_fwd", dt)) return -1;
  if (tt_pool_desc_error("pool_fwd", d, mode, TT_F32, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg); /* dtype checked above */
  if (!x || !y) return tt_ref_fail(b, "pool_fwd: NULL x or y");
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
  cpu_norm_pool_op(&op, TT_OP_POOL_BWD, d, mode, dt);
  if (!tt_cpu_uses_dnnl(&op) || beta != 0.0f) return tt_ref_pool_bwd(b, d, mode, dt, x, dy, dx, beta, ws, ws_bytes);
  if (tt_ref_dt_check(b, "pool_bwd", dt)) return -1;
  if (tt_pool_desc_error("pool_bwd", d, mode, TT_F32, msg, sizeof msg)) return tt_ref_fail(b, "%s", msg); /* dtype checked above */
  if ((mode == TT_POOL_MAX && !x) || !dy || !dx) return tt_ref_fail(b, "pool_bwd: NULL x (max), dy or dx");
  if (!(c = tt_cpu_get(b, &op))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = (void *)dy, ptrs[2] = dx;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, 0.0f);
}
