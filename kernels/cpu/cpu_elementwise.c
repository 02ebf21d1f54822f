/* kernels/cpu/cpu_elementwise.c — the elementwise ops the CPU backend runs itself: ReLU and
 * ReLU6 forward and backward, add and accumulate, dropout, input normalisation, the fp32 <-> bf16
 * casts (the weight copies of a bf16 step) and the compact saves' ReLU/ReLU6 bit masks, in fp32
 * and bf16, vectorised (cpu_vec.h); GELU (erf and tanh) forward and backward with dx overwritten
 * in fp32 as oneDNN's eltwise primitive. fp16, and every case not named here, goes to the
 * reference loops (kernels/ref), which also check the arguments and word the refusals.
 *
 * Why not oneDNN for ReLU: its eltwise ReLU (vmaxps against 0) turns NaN into 0, where ours and
 * PyTorch's propagate it. Why not the reference loops: they are scalar (the baseline x86-64 build
 * has SSE2 only, and a ReLU written with a branch mispredicts on every other element). The
 * compact-save loops matter in fp32 as much: as the reference's scalar loops they took about
 * three quarters of a LeNet step on one thread (perf, a loaded machine).
 *
 * Bit for bit the reference's results: the same float expressions per element; bf16 runs the
 * fp32 spans over stack chunks widened from bf16 and rounded back (cpu_vec.h: tt_bf16_from_f32's
 * rule, vectorised).
 *
 * GELU on oneDNN needs no workspace: act_fwd/act_bwd have none to give. With dx added into it
 * runs the reference loop.
 */
#include <math.h>
#include <stdio.h>

#include "cpu_internal.h"
#include "cpu_vec.h"

/* ---- spans: n elements from the given pointers ---- */

CPU_VEC_FN(cpu_ew_relu_span, (const float *x, float *y, size_t n), (x, y, n), {
  size_t i;
  CPU_VEC_SIMD
  for (i = 0; i < n; i++) {
    float v = x[i];
    y[i] = (v > 0.0f || v != v) ? v : 0.0f; /* tt_act_value(TT_ACT_RELU) */
  }
})

CPU_VEC_FN(cpu_ew_relu6_span, (const float *x, float *y, size_t n), (x, y, n), {
  size_t i;
  CPU_VEC_SIMD
  for (i = 0; i < n; i++) {
    float v = x[i];
    y[i] = v != v ? v : (v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v));
  }
})

/* dx = beta*dx + (s > 0 ? g : 0): ReLU's backward from its output s */
CPU_VEC_FN(cpu_ew_relu_bwd_span, (const float *s, const float *g, float *dx, size_t n, float beta),
           (s, g, dx, n, beta), {
  size_t i;
  if (beta == 0.0f) {
    CPU_VEC_SIMD
    for (i = 0; i < n; i++) dx[i] = s[i] > 0.0f ? g[i] : 0.0f;
  } else {
    CPU_VEC_SIMD
    for (i = 0; i < n; i++) dx[i] = beta * dx[i] + (s[i] > 0.0f ? g[i] : 0.0f);
  }
})

/* dx = beta*dx + (0 < s < 6 ? g : 0): ReLU6's */
CPU_VEC_FN(cpu_ew_relu6_bwd_span, (const float *s, const float *g, float *dx, size_t n, float beta),
           (s, g, dx, n, beta), {
  size_t i;
  if (beta == 0.0f) {
    CPU_VEC_SIMD
    for (i = 0; i < n; i++) dx[i] = (s[i] > 0.0f && s[i] < 6.0f) ? g[i] : 0.0f;
  } else {
    CPU_VEC_SIMD
    for (i = 0; i < n; i++) dx[i] = beta * dx[i] + ((s[i] > 0.0f && s[i] < 6.0f) ? g[i] : 0.0f);
  }
})

CPU_VEC_FN(cpu_ew_add_span, (const float *a, const float *b, float *y, size_t n), (a, b, y, n), {
  size_t i;
  CPU_VEC_SIMD
  for (i = 0; i < n; i++) y[i] = a[i] + b[i];
})


/* The kinds of cpu_ew_run */
#define CPU_EW_RELU 0
#define CPU_EW_RELU6 1
#define CPU_EW_RELU_BWD 2
#define CPU_EW_RELU6_BWD 3
#define CPU_EW_ADD 4
#define CPU_EW_ACC 5

/* one kind over m elements of fp32 */
static void cpu_ew_span(int kind, const float *p0, const float *p1, float *out, size_t m, float beta) {
  switch (kind) {
    case CPU_EW_RELU: cpu_ew_relu_span(p0, out, m); break;
    case CPU_EW_RELU6: cpu_ew_relu6_span(p0, out, m); break;
    case CPU_EW_RELU_BWD: cpu_ew_relu_bwd_span(p0, p1, out, m, beta); break;
    case CPU_EW_RELU6_BWD: cpu_ew_relu6_bwd_span(p0, p1, out, m, beta); break;
    case CPU_EW_ADD: cpu_ew_add_span(p0, p1, out, m); break;
    default: cpu_vec_acc_span(p0, out, m, beta); break;
  }
}

/* One kind over count elements of dt (fp32 or bf16; p1 NULL where the kind has no second
 * input), the threads' shares in parallel. bf16 runs the fp32 span over chunks of
 * CPU_VEC_CHUNK widened on the stack and rounds back (out is read too when the kind adds into
 * it: beta != 0). */
static void cpu_ew_run(tt_backend *b, int kind, size_t count, tt_dtype dt, const void *p0, const void *p1, void *out,
                       float beta) {
  int nt = tt_cpu_threads_for(b, count);
  int reads_out = (kind == CPU_EW_RELU_BWD || kind == CPU_EW_RELU6_BWD || kind == CPU_EW_ACC) && beta != 0.0f;
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi, c0;
    cpu_vec_my_share(count, &lo, &hi);
    if (dt == TT_F32) {
      if (hi > lo)
        cpu_ew_span(kind, (const float *)p0 + lo, p1 ? (const float *)p1 + lo : NULL, (float *)out + lo, hi - lo, beta);
    } else {
      float a[CPU_VEC_CHUNK], g[CPU_VEC_CHUNK], o[CPU_VEC_CHUNK];
      for (c0 = lo; c0 < hi; c0 += CPU_VEC_CHUNK) {
        size_t m = cpu_vec_chunk(c0, hi);
        cpu_vec_bf_widen((const uint16_t *)p0 + c0, a, m);
        if (p1) cpu_vec_bf_widen((const uint16_t *)p1 + c0, g, m);
        if (reads_out) cpu_vec_bf_widen((const uint16_t *)out + c0, o, m);
        cpu_ew_span(kind, a, g, o, m, beta);
        cpu_vec_bf_round(o, (uint16_t *)out + c0, m);
      }
    }
  }
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
  dnnl_primitive_desc_t pd;
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
  /* both directions' op descs (plain structs); backward's primitive wants the forward's as a hint */
  if (TT_CPU_DNNL(b, c->what, dnnl_eltwise_forward_desc_init(&fd, dnnl_forward_training, alg, &md, 0.0f, 0.0f)) ||
      TT_CPU_DNNL(b, c->what, dnnl_eltwise_backward_desc_init(&bwd, alg, &md, &md, 0.0f, 0.0f)))
    return -1;
  if (fwd) {
    if (tt_cpu_pd(bd, &fd, NULL, &pd) || tt_cpu_add_stage(bd, v, pd)) return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, TT_F32, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &md, TT_F32, 1) < 0)
      return -1;
    return 0;
  }
  if (tt_cpu_add_bwd_stage(bd, v, &fd, &bwd)) return -1;
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &md, TT_F32, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &md, TT_F32, 1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &md, TT_F32, 2) < 0)
    return -1;
  return 0;
}

/* The GELU call for (kind, act, count), or NULL when it would need workspace (the act entries
 * have none) or failed to build (then the loops run: the error is not the caller's). */
static const tt_cpu_call *cpu_ew_gelu_call(tt_backend *b, tt_op_kind kind, tt_act a, size_t count) {
  tt_op_desc op;
  const tt_cpu_call *c;
  memset(&op, 0, sizeof op);
  op.kind = kind, op.dt = TT_F32;
  op.u.act.count = count, op.u.act.act = a;
  c = tt_cpu_dnnl_get(b, &op, tt_cpu_gelu_build);
  return c && c->ws_bytes == 0 ? c : NULL;
}

static int cpu_ew_gelu_fwd(tt_backend *b, tt_act a, size_t count, const float *x, float *y) {
  const tt_cpu_call *c = cpu_ew_gelu_call(b, TT_OP_ACT_FWD, a, count);
  void *ptrs[2];
  if (!c) return tt_ref_act_fwd(b, a, count, TT_F32, x, y);
  ptrs[0] = (void *)x, ptrs[1] = y;
  return tt_cpu_run(b, c, ptrs, NULL, 0, 0.0f, 0.0f);
}

static int cpu_ew_gelu_bwd(tt_backend *b, tt_act a, size_t count, const float *x, const float *dy, float *dx) {
  const tt_cpu_call *c = cpu_ew_gelu_call(b, TT_OP_ACT_BWD, a, count);
  void *ptrs[3];
  if (!c) return tt_ref_act_bwd(b, a, count, TT_F32, x, dy, dx, 0.0f);
  ptrs[0] = (void *)dy, ptrs[1] = (void *)x, ptrs[2] = dx;
  return tt_cpu_run(b, c, ptrs, NULL, 0, 0.0f, 0.0f);
}

int tt_cpu_act_fwd(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *x, void *y) {
  if (dt == TT_F32 && (a == TT_ACT_GELU_ERF || a == TT_ACT_GELU_TANH) && count && x && y)
    return cpu_ew_gelu_fwd(b, a, count, (const float *)x, (float *)y);
  if ((dt != TT_F32 && dt != TT_BF16) || (a != TT_ACT_RELU && a != TT_ACT_RELU6) || !x || !y)
    return tt_ref_act_fwd(b, a, count, dt, x, y);
  cpu_ew_run(b, a == TT_ACT_RELU ? CPU_EW_RELU : CPU_EW_RELU6, count, dt, x, NULL, y, 0.0f);
  return 0;
}

int tt_cpu_act_bwd(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *saved, const void *dy, void *dx,
                   float beta) {
  if (dt == TT_F32 && (a == TT_ACT_GELU_ERF || a == TT_ACT_GELU_TANH) && count && saved && dy && dx && beta == 0.0f)
    return cpu_ew_gelu_bwd(b, a, count, (const float *)saved, (const float *)dy, (float *)dx);
  if ((dt != TT_F32 && dt != TT_BF16) || (a != TT_ACT_RELU && a != TT_ACT_RELU6) || !saved || !dy || !dx ||
      (dx == dy && beta != 0.0f))
    return tt_ref_act_bwd(b, a, count, dt, saved, dy, dx, beta);
  cpu_ew_run(b, a == TT_ACT_RELU ? CPU_EW_RELU_BWD : CPU_EW_RELU6_BWD, count, dt, saved, dy, dx, beta);
  return 0;
}

int tt_cpu_add(tt_backend *b, size_t count, tt_dtype dt, const void *a, const void *b2, void *y) {
  if ((dt != TT_F32 && dt != TT_BF16) || !a || !b2 || !y) return tt_ref_add(b, count, dt, a, b2, y);
  cpu_ew_run(b, CPU_EW_ADD, count, dt, a, b2, y, 0.0f);
  return 0;
}

int tt_cpu_accumulate(tt_backend *b, size_t count, tt_dtype dt, const void *x, void *y, float beta) {
  if ((dt != TT_F32 && dt != TT_BF16) || !x || !y) return tt_ref_accumulate(b, count, dt, x, y, beta);
  if (beta == 0.0f) { /* a copy: bf16's widen and round give the same bits back (a NaN's quiet bit aside) */
    if (x != y) cpu_vec_copy(tt_cpu_threads_for(b, count), count, tt_dtype_size(dt), x, y);
    return 0;
  }
  cpu_ew_run(b, CPU_EW_ACC, count, dt, x, NULL, y, beta);
  return 0;
}

/* ---- cast ---- */

/* count elements from x (sdt) into dst (ddt): fp32 -> bf16 rounds, bf16 -> fp32 widens, bf16 ->
 * bf16 copies; a share per thread */
static void cpu_ew_bf16_copy(tt_backend *b, size_t count, tt_dtype sdt, const void *x, tt_dtype ddt, void *dst) {
  int nt = tt_cpu_threads_for(b, count);
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi;
    cpu_vec_my_share(count, &lo, &hi);
    if (hi > lo) {
      if (sdt == ddt)
        memcpy((uint16_t *)dst + lo, (const uint16_t *)x + lo, (hi - lo) * sizeof(uint16_t));
      else if (sdt == TT_F32)
        cpu_vec_bf_round((const float *)x + lo, (uint16_t *)dst + lo, hi - lo);
      else
        cpu_vec_bf_widen((const uint16_t *)x + lo, (float *)dst + lo, hi - lo);
    }
  }
}

int tt_cpu_cast(tt_backend *b, size_t count, tt_dtype src_dt, const void *src, tt_dtype dst_dt, void *dst) {
  int to_bf = src_dt == TT_F32 && dst_dt == TT_BF16, from_bf = src_dt == TT_BF16 && dst_dt == TT_F32;
  if ((!to_bf && !from_bf) || !count || !src || !dst || src == dst) /* the reference checks and says why */
    return tt_ref_cast(b, count, src_dt, src, dst_dt, dst);
  cpu_ew_bf16_copy(b, count, src_dt, src, dst_dt, dst);
  return 0;
}

/* backend.h's cast_multi: the segments one by one, each as tt_cpu_cast casts it; a KRSC segment
 * (tt_cast_seg.rs > 0) by the reference's transposing loop, whose rounding is cast's. */
int tt_cpu_cast_multi(tt_backend *b, const tt_cast_seg *segs, int nseg, tt_dtype src_dt, tt_dtype dst_dt) {
  return tt_ref_cast_multi_with(b, tt_cpu_cast, segs, nseg, src_dt, dst_dt);
}

/* ---- lossy saved copies (backend.h save_compress / save_restore) ----
 * The bf16 format of an fp32 or bf16 tensor as our loops, split over the threads: the rounding
 * is cast's (cpu_vec_bf_round, tt_bf16_from_f32's bits), a bf16 tensor's copy a plain copy. The
 * other formats and dtypes (fp16, int8 with its per-channel scale) are the reference's loops. */

int tt_cpu_save_compress(tt_backend *b, int f, int n, int c, int hw, tt_dtype dt, const void *x, void *dst) {
  size_t count = (size_t)n * c * hw;
  if (f != TT_SAVE_BF16 || (dt != TT_F32 && dt != TT_BF16) || n <= 0 || c <= 0 || hw <= 0 || !x || !dst)
    return tt_ref_save_compress(b, f, n, c, hw, dt, x, dst); /* the reference checks and says why */
  cpu_ew_bf16_copy(b, count, dt, x, TT_BF16, dst);
  return 0;
}

int tt_cpu_save_restore(tt_backend *b, int f, int n, int c, int hw, tt_dtype dt, const void *src, void *x) {
  size_t count = (size_t)n * c * hw;
  if (f != TT_SAVE_BF16 || (dt != TT_F32 && dt != TT_BF16) || n <= 0 || c <= 0 || hw <= 0 || !x || !src)
    return tt_ref_save_restore(b, f, n, c, hw, dt, src, x);
  cpu_ew_bf16_copy(b, count, TT_BF16, src, dt, x);
  return 0;
}

/* ---- dropout (kernel_math.h: tt_dropout_hash; thresholds as the reference's) ---- */

/* y[i] = keep(first + i) ? x[i] * scale : 0 */
CPU_VEC_FN(cpu_ew_dropout_span, (const float *x, float *y, size_t n, uint64_t first, uint64_t seed, uint32_t thr,
                                 float scale, int all_drop),
           (x, y, n, first, seed, thr, scale, all_drop), {
  size_t i;
  if (all_drop) {
    for (i = 0; i < n; i++) y[i] = 0.0f;
    return;
  }
  CPU_VEC_SIMD
  for (i = 0; i < n; i++) {
    int keep = (uint32_t)(tt_dropout_hash(seed, first + i) >> 32) >= thr;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
})

/* y = x + beta*y (beta 0: y = x, never reading y), written as tt_ref_st_beta adds (v += beta*old),
 * the operand order the reference's dropout and mask backward use; cpu_vec_acc_span is
 * accumulate's beta*y + x (the same sum, kept apart so each op's code stays the reference's) */
CPU_VEC_FN(cpu_ew_beta_span, (const float *x, float *y, size_t n, float beta), (x, y, n, beta), {
  size_t i;
  if (beta == 0.0f) {
    for (i = 0; i < n; i++) y[i] = x[i];
  } else {
    CPU_VEC_SIMD
    for (i = 0; i < n; i++) y[i] = x[i] + beta * y[i];
  }
})

static int cpu_ew_dropout_params(tt_backend *b, const char *op, float p, uint32_t *thr, float *scale, int *all_drop) {
  if (!(p >= 0.0f && p <= 1.0f)) return tt_ref_fail(b, "%s: dropout probability %g is outside [0, 1]", op, (double)p);
  *all_drop = p >= 1.0f;
  *thr = *all_drop ? 0u : (uint32_t)((double)p * 4294967296.0);
  *scale = *all_drop ? 0.0f : 1.0f / (1.0f - p);
  return 0;
}

/* o[i] = bit i of mask ? g[i] : 0 over n <= CPU_VEC_CHUNK elements starting at a word boundary */
CPU_VEC_FN(cpu_ew_unmask_span, (const uint32_t *mask, const float *g, float *o, size_t n), (mask, g, o, n), {
  size_t w, nw = (n + 31u) / 32u;
  for (w = 0; w < nw; w++) { /* a word at a time: the loop over its bits vectorises */
    size_t e = n - w * 32u < 32u ? n - w * 32u : 32u, j;
    const float *gp = g + w * 32u;
    float *op = o + w * 32u;
    uint32_t m = mask[w];
    CPU_VEC_SIMD
    for (j = 0; j < e; j++) op[j] = ((m >> j) & 1u) ? gp[j] : 0.0f;
  }
})

/* What cpu_ew_gate_run applies to each element: dropout's keep-and-scale (mask NULL), or the
 * compact save's ReLU/ReLU6 bit mask (act_bwd_mask). */
typedef struct cpu_ew_gate {
  const uint32_t *mask; /* the mask words from element 0, or NULL: dropout */
  uint64_t seed;
  uint32_t thr;
  float scale;
  int all_drop;
} cpu_ew_gate;

/* out[0..m) = the gate over in[0..m), elements c0.. of the tensor (c0 a multiple of 32) */
static void cpu_ew_gate_span(const cpu_ew_gate *G, const float *in, float *out, size_t m, size_t c0) {
  if (G->mask)
    cpu_ew_unmask_span(G->mask + c0 / 32u, in, out, m);
  else
    cpu_ew_dropout_span(in, out, m, c0, G->seed, G->thr, G->scale, G->all_drop);
}

/* out = beta*out + gate(in) over count elements of dt (fp32 or bf16; beta 0 overwrites). The
 * threads' shares are multiples of 64 elements, so no two share a mask word. */
static void cpu_ew_gate_run(tt_backend *b, const cpu_ew_gate *G, size_t count, tt_dtype dt, const void *in, void *out,
                            float beta) {
  int nt = tt_cpu_threads_for(b, count);
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi, c0;
    float a[CPU_VEC_CHUNK], o[CPU_VEC_CHUNK];
    cpu_vec_my_share(count, &lo, &hi);
    for (c0 = lo; c0 < hi; c0 += CPU_VEC_CHUNK) {
      size_t m = cpu_vec_chunk(c0, hi);
      if (dt == TT_F32) {
        if (beta == 0.0f) {
          cpu_ew_gate_span(G, (const float *)in + c0, (float *)out + c0, m, c0);
        } else {
          cpu_ew_gate_span(G, (const float *)in + c0, a, m, c0);
          cpu_ew_beta_span(a, (float *)out + c0, m, beta);
        }
        continue;
      }
      cpu_vec_bf_widen((const uint16_t *)in + c0, a, m);
      if (beta == 0.0f) {
        cpu_ew_gate_span(G, a, o, m, c0);
      } else {
        cpu_ew_gate_span(G, a, a, m, c0);
        cpu_vec_bf_widen((const uint16_t *)out + c0, o, m);
        cpu_ew_beta_span(a, o, m, beta);
      }
      cpu_vec_bf_round(o, (uint16_t *)out + c0, m);
    }
  }
}

int tt_cpu_dropout_fwd(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *x, void *y) {
  cpu_ew_gate G;
  if ((dt != TT_F32 && dt != TT_BF16) || !count || !x || !y) return tt_ref_dropout_fwd(b, count, dt, p, seed, x, y);
  memset(&G, 0, sizeof G);
  G.seed = seed;
  if (cpu_ew_dropout_params(b, "dropout_fwd", p, &G.thr, &G.scale, &G.all_drop)) return -1;
  cpu_ew_gate_run(b, &G, count, dt, x, y, 0.0f);
  return 0;
}

int tt_cpu_dropout_bwd(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *dy, void *dx,
                       float beta) {
  cpu_ew_gate G;
  if ((dt != TT_F32 && dt != TT_BF16) || !count || !dy || !dx || (dx == dy && beta != 0.0f))
    return tt_ref_dropout_bwd(b, count, dt, p, seed, dy, dx, beta);
  memset(&G, 0, sizeof G);
  G.seed = seed;
  if (cpu_ew_dropout_params(b, "dropout_bwd", p, &G.thr, &G.scale, &G.all_drop)) return -1;
  cpu_ew_gate_run(b, &G, count, dt, dy, dx, beta);
  return 0;
}

/* ---- input normalisation: uint8 [n, c, hw] -> (v/255 - mean[c]) / std[c] in dt ---- */

CPU_VEC_FN(cpu_ew_norm_span, (const uint8_t *s, float *d, size_t n, float m, float sd), (s, d, n, m, sd), {
  size_t i;
  CPU_VEC_SIMD
  for (i = 0; i < n; i++) d[i] = ((float)s[i] / 255.0f - m) / sd;
})

int tt_cpu_normalize_u8(tt_backend *b, int n, int c, int hw, const uint8_t *src, const float *mean, const float *std,
                        tt_dtype dt, void *dst) {
  ptrdiff_t pl, npl = (ptrdiff_t)n * c;
  int nt;
  if ((dt != TT_F32 && dt != TT_BF16) || n <= 0 || c <= 0 || hw <= 0 || !src || !mean || !std || !dst)
    return tt_ref_normalize_u8(b, n, c, hw, src, mean, std, dt, dst);
  nt = tt_cpu_threads_for(b, (size_t)npl * (size_t)hw);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (pl = 0; pl < npl; pl++) {
    int ch = (int)(pl % c);
    size_t off = (size_t)pl * (size_t)hw, k0;
    float o[CPU_VEC_CHUNK];
    if (dt == TT_F32) {
      cpu_ew_norm_span(src + off, (float *)dst + off, (size_t)hw, mean[ch], std[ch]);
      continue;
    }
    for (k0 = 0; k0 < (size_t)hw; k0 += CPU_VEC_CHUNK) {
      size_t m = (size_t)hw - k0 < CPU_VEC_CHUNK ? (size_t)hw - k0 : CPU_VEC_CHUNK;
      cpu_ew_norm_span(src + off + k0, o, m, mean[ch], std[ch]);
      cpu_vec_bf_round(o, (uint16_t *)dst + off + k0, m);
    }
  }
  return 0;
}

/* ---- compact saves: ReLU / ReLU6 bit masks (backend.h: act_mask, act_bwd_mask) ----
 * Elementwise, so any layout; each thread's share is a multiple of 64 elements, so threads never
 * share a mask word. Bit i = (ReLU: y > 0; ReLU6: 0 < y < 6), NaN never passes, as tt_act_grad. */

/* mask words of n <= CPU_VEC_CHUNK elements of y (the last word's bits past n are zero) */
CPU_VEC_FN(cpu_ew_mask_span, (const float *y, uint32_t *mask, size_t n, int relu6), (y, mask, n, relu6), {
  size_t w, nw = (n + 31u) / 32u;
  for (w = 0; w < nw; w++) {
    size_t e = n - w * 32u < 32u ? n - w * 32u : 32u, j;
    const float *p = y + w * 32u;
    uint32_t m = 0;
    if (relu6) {
      _Pragma("omp simd reduction(| : m)")
      for (j = 0; j < e; j++) m |= (uint32_t)(p[j] > 0.0f && p[j] < 6.0f) << j;
    } else {
      _Pragma("omp simd reduction(| : m)")
      for (j = 0; j < e; j++) m |= (uint32_t)(p[j] > 0.0f) << j;
    }
    mask[w] = m;
  }
})

int tt_cpu_act_mask(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *y, uint32_t *mask) {
  int nt;
  if ((dt != TT_F32 && dt != TT_BF16) || (a != TT_ACT_RELU && a != TT_ACT_RELU6) || !count || !y || !mask)
    return tt_ref_act_mask(b, a, count, dt, y, mask); /* the reference checks and says why */
  nt = tt_cpu_threads_for(b, count);
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t lo, hi, c0;
    float t[CPU_VEC_CHUNK];
    cpu_vec_my_share(count, &lo, &hi);
    for (c0 = lo; c0 < hi; c0 += CPU_VEC_CHUNK) {
      size_t m = hi - c0 < CPU_VEC_CHUNK ? hi - c0 : CPU_VEC_CHUNK;
      const float *src = (const float *)y + c0;
      if (dt == TT_BF16) {
        cpu_vec_bf_widen((const uint16_t *)y + c0, t, m);
        src = t;
      }
      cpu_ew_mask_span(src, mask + c0 / 32u, m, a == TT_ACT_RELU6);
    }
  }
  return 0;
}

int tt_cpu_act_bwd_mask(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const uint32_t *mask, const void *dy,
                        void *dx, float beta) {
  cpu_ew_gate G;
  if ((dt != TT_F32 && dt != TT_BF16) || (a != TT_ACT_RELU && a != TT_ACT_RELU6) || !count || !mask || !dy || !dx ||
      (dx == dy && beta != 0.0f))
    return tt_ref_act_bwd_mask(b, a, count, dt, mask, dy, dx, beta);
  memset(&G, 0, sizeof G);
  G.mask = mask;
  cpu_ew_gate_run(b, &G, count, dt, dy, dx, beta);
  return 0;
}
