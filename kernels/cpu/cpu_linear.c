/* kernels/cpu/cpu_linear.c — linear layers on oneDNN matmul.
 *
 * x [n, in], w [out, in] (PyTorch's layout), bias [out], y [n, out], all row-major; each product
 * is one matmul over the caller's own layouts, a transpose being a strided view:
 *   forward         y  = x  · wᵀ + bias   (w seen as [in, out], tag ba)
 *   backward data   dx = dy · w
 *   backward weights dw = dyᵀ · x         (dy seen as [out, n], tag ba); db sums dy per feature
 * (our loop, fixed order: tt_ref_channel_sum). Matmul, not inner product: oneDNN 2.6's inner
 * product runs its gemm, which allocates packing buffers on every call; matmul's brgemm kernels
 * take everything from the scratchpad. fp16 storage converts to fp32 workspace copies; bf16 runs
 * bf16 matmuls (tt_cpu_compute_type) on the caller's bf16 tensors, fp32 bias, and the weight
 * gradient written in fp32 (matmul's f32 destination).
 */
#include <stdio.h>

#include "cpu_internal.h"

static const char *cpu_lin_name(tt_op_kind k) {
  return k == TT_OP_LINEAR_FWD ? "linear_fwd" : (k == TT_OP_LINEAR_BWD_DATA ? "linear_bwd_data" : "linear_bwd_filter");
}

/* Pointer indices: forward x, w, bias, y; backward-data dy, w, dx; backward-weights dy, x, dw. */
int tt_cpu_linear_build(tt_cpu_build *bd, const tt_op_desc *op) {
  tt_backend *b = bd->b;
  tt_cpu_call *c = bd->c;
  const tt_linear_desc *l = &op->u.linear;
  tt_cpu_variant *v = &c->v[0];
  tt_dtype half = op->dt; /* the caller's dtype */
  dnnl_data_type_t ct = tt_cpu_compute_type(op->dt);
  int64_t d0[2], d1[2], d2[2], db[2];
  dnnl_memory_desc_t m0, m1, m2, mb; /* the caller's (fp32 plain) */
  dnnl_memory_desc_t p0, p1, p2;     /* the primitive's, in the compute type */
  dnnl_matmul_desc_t md;
  dnnl_primitive_desc_t pd;
  snprintf(c->what, sizeof c->what, "%s (n=%d, in=%d, out=%d, %s)", cpu_lin_name(op->kind), l->n, l->in, l->out,
           tt_dtype_name(op->dt) ? tt_dtype_name(op->dt) : "unknown dtype");
  if (l->n <= 0 || l->in <= 0 || l->out <= 0) return tt_ref_fail(b, "%s: bad shape", c->what);
  if (tt_ref_dt_check(b, c->what, op->dt)) return -1;
  c->nb = l->n, c->nv = 1;
  v->nb = l->n;
  if (op->kind == TT_OP_LINEAR_FWD) {
    d0[0] = l->n, d0[1] = l->in;   /* x */
    d1[0] = l->in, d1[1] = l->out; /* w as [in, out] */
    d2[0] = l->n, d2[1] = l->out;  /* y */
    db[0] = 1, db[1] = l->out;
    if (tt_cpu_md(b, c->what, &m0, 2, d0, dnnl_ab) || tt_cpu_md(b, c->what, &m1, 2, d1, dnnl_ba) ||
        tt_cpu_md(b, c->what, &m2, 2, d2, dnnl_ab) || tt_cpu_md(b, c->what, &mb, 2, db, dnnl_ab) ||
        tt_cpu_md_dt(b, c->what, &p0, 2, d0, dnnl_ab, ct) || tt_cpu_md_dt(b, c->what, &p1, 2, d1, dnnl_ba, ct) ||
        tt_cpu_md_dt(b, c->what, &p2, 2, d2, dnnl_ab, ct))
      return -1;
    if (TT_CPU_DNNL(b, c->what, dnnl_matmul_desc_init(&md, &p0, &p1, op->bias ? &mb : NULL, &p2)) ||
        tt_cpu_pd(bd, &md, NULL, &pd) || tt_cpu_add_stage(bd, v, pd))
      return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &m0, half, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WEIGHTS, TT_CPU_PARAM_IN, &m1, half, 1) < 0 ||
        (op->bias && tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_BIAS, TT_CPU_PARAM_IN, &mb, half, 2) < 0) ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &m2, half, 3) < 0)
      return -1;
    return 0;
  }
  if (op->kind == TT_OP_LINEAR_BWD_DATA) {
    d0[0] = l->n, d0[1] = l->out;  /* dy */
    d1[0] = l->out, d1[1] = l->in; /* w */
    d2[0] = l->n, d2[1] = l->in;   /* dx */
    if (tt_cpu_md(b, c->what, &m0, 2, d0, dnnl_ab) || tt_cpu_md(b, c->what, &m1, 2, d1, dnnl_ab) ||
        tt_cpu_md(b, c->what, &m2, 2, d2, dnnl_ab) || tt_cpu_md_dt(b, c->what, &p0, 2, d0, dnnl_ab, ct) ||
        tt_cpu_md_dt(b, c->what, &p1, 2, d1, dnnl_ab, ct) || tt_cpu_md_dt(b, c->what, &p2, 2, d2, dnnl_ab, ct))
      return -1;
    if (TT_CPU_DNNL(b, c->what, dnnl_matmul_desc_init(&md, &p0, &p1, NULL, &p2)) || tt_cpu_pd(bd, &md, NULL, &pd) ||
        tt_cpu_add_stage(bd, v, pd))
      return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &m0, half, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WEIGHTS, TT_CPU_PARAM_IN, &m1, half, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &m2, half, 2) < 0)
      return -1;
    return 0;
  }
  d0[0] = l->out, d0[1] = l->n;  /* dy as [out, n] */
  d1[0] = l->n, d1[1] = l->in;   /* x */
  d2[0] = l->out, d2[1] = l->in; /* dw */
  if (tt_cpu_md(b, c->what, &m0, 2, d0, dnnl_ba) || tt_cpu_md(b, c->what, &m1, 2, d1, dnnl_ab) ||
      tt_cpu_md(b, c->what, &m2, 2, d2, dnnl_ab) || tt_cpu_md_dt(b, c->what, &p0, 2, d0, dnnl_ba, ct) ||
      tt_cpu_md_dt(b, c->what, &p1, 2, d1, dnnl_ab, ct))
    return -1;
  /* dw in fp32 (m2) whatever the compute type */
  if (TT_CPU_DNNL(b, c->what, dnnl_matmul_desc_init(&md, &p0, &p1, NULL, &m2)) || tt_cpu_pd(bd, &md, NULL, &pd) ||
      tt_cpu_add_stage(bd, v, pd))
    return -1;
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &m0, half, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WEIGHTS, TT_CPU_ACT_IN, &m1, half, 1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_GRAD_OUT, &m2, TT_F32, 2) < 0)
    return -1;
  return 0;
}

/* ---- table entries ---- */

static void cpu_lin_op(tt_op_desc *op, tt_op_kind kind, int n, int in, int out, tt_dtype dt, int bias, int accumulate) {
  memset(op, 0, sizeof *op);
  op->kind = kind, op->dt = dt, op->bias = bias, op->accumulate = accumulate;
  op->u.linear.n = n, op->u.linear.in = in, op->u.linear.out = out;
}

size_t tt_cpu_linear_workspace(tt_backend *b, int n, int in, int out, tt_dtype dt, tt_ws_kind which) {
  tt_op_desc op;
  if (n <= 0 || in <= 0 || out <= 0)
    return tt_ref_fail(b, "linear_workspace: bad shape n=%d in=%d out=%d", n, in, out), TT_WS_ERROR;
  if (tt_ref_dt_check(b, "linear_workspace", dt)) return TT_WS_ERROR;
  if (which != TT_WS_FWD && which != TT_WS_BWD_DATA && which != TT_WS_BWD_FILTER)
    return tt_ref_fail(b, "linear_workspace: unknown workspace kind %d", (int)which), TT_WS_ERROR;
  /* the most any call of this kind may need: with a bias, adding into dx */
  cpu_lin_op(&op, which == TT_WS_FWD ? TT_OP_LINEAR_FWD : (which == TT_WS_BWD_DATA ? TT_OP_LINEAR_BWD_DATA : TT_OP_LINEAR_BWD_FILTER),
             n, in, out, dt, 1, 1);
  return b->op_workspace(b, &op);
}

int tt_cpu_linear_fwd(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *x, const void *w,
                      const void *bias, void *y, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[4];
  if (!x || !w || !y) return tt_ref_fail(b, "linear_fwd: NULL x, w or y");
  cpu_lin_op(&op, TT_OP_LINEAR_FWD, n, in, out, dt, bias != NULL, 0);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_linear_build))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = (void *)w, ptrs[2] = (void *)bias, ptrs[3] = y;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, 0.0f);
}

int tt_cpu_linear_bwd_data(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *dy, const void *w,
                           void *dx, float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[3];
  if (!dy || !w || !dx) return tt_ref_fail(b, "linear_bwd_data: NULL dy, w or dx");
  cpu_lin_op(&op, TT_OP_LINEAR_BWD_DATA, n, in, out, dt, 0, beta != 0.0f);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_linear_build))) return -1;
  ptrs[0] = (void *)dy, ptrs[1] = (void *)w, ptrs[2] = dx;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, beta, 0.0f);
}

int tt_cpu_linear_bwd_filter(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *x, const void *dy,
                             float *dw, float *db, float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[3];
  if (!x || !dy || !dw) return tt_ref_fail(b, "linear_bwd_filter: NULL x, dy or dw");
  cpu_lin_op(&op, TT_OP_LINEAR_BWD_FILTER, n, in, out, dt, db != NULL, 0);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_linear_build))) return -1;
  ptrs[0] = (void *)dy, ptrs[1] = (void *)x, ptrs[2] = dw;
  if (tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, beta)) return -1;
  if (db) tt_ref_channel_sum(b, n, out, 1, dt, dy, db, beta);
  return 0;
}
