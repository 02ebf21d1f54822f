/* kernels/cpu/cpu_conv.c — convolution on oneDNN: forward, backward-data, backward-weights.
 *
 * The primitives choose their layouts (format "any"): on AVX-512 the direct JIT kernels want
 * nChw16c activations and blocked weights (channels-last where channel counts are not
 * multiples of 16: cpu_conv_act_tag). (With plain NCHW oneDNN falls back to its
 * im2col + gemm convolution, which allocates its packing buffers on every call outside the
 * scratchpad, so plain layouts are never forced.)
 *
 * Layout (backend.h's tt_layout; the planner's choice, core/compile/lower.c): this backend lists
 * NHWC, so the activations between convolutions come channels-last, and a call whose x and y are
 * both NHWC runs its primitive on them as they are, with no reorder. NHWC rather than the blocked
 * nChw16c that format "any" picks for fp32 on AVX-512: no padding (every buffer keeps NCHW's bytes,
 * so the planner's counts stand; nChw16c pads 24 channels to 32), batch norm, pooling, concat and
 * the elementwise ops run on NHWC without new entry points, oneDNN's bf16 primitives on AMX pick
 * NHWC themselves, and on this CPU (oneDNN 2.6.3, avx512_core_amx) every ResNet-50 shape gets a
 * JIT or brgemm kernel on NHWC in fp32 and bf16 (jit_1x1, brgconv_1x1, jit, brgconv; ONEDNN_VERBOSE),
 * never the gemm fallback. Measured: docs/measured.md. Where oneDNN runs AVX-512, the planner
 * also gives fp32 groups of 16-multiple channels the blocked nChw16c (TT_LAYOUT_NCHW16C), so that
 * the 3x3 stride-1 convolutions between them run oneDNN's Winograd kernels (cpu_conv_wino), which
 * take that layout only. Where oneDNN has no AVX-512 (and so no Winograd), the 3x3 stride-1 fp32
 * NHWC calls run our own Winograd instead (cpu_conv_wg.c). A call whose layouts differ (the first
 * convolution reads the NCHW image; one before flatten or dropout writes NCHW) keeps the rule
 * above, and the caller's tensors are reordered into workspace copies and back, a chunk of
 * samples at a time (cpu_internal.h); weights once per
 * call; the weight and bias gradients through fp32 copies that later chunks add to. fp16
 * storage converts to fp32 around the same fp32 primitives (oneDNN 2.6 has f16 convolution
 * only on AVX512-FP16 CPUs, and its f16 reorders are scalar). bf16 runs oneDNN's bf16
 * primitives (tt_cpu_compute_type): x, w, y, dx and dy in bf16, accumulation inside in fp32,
 * the bias in fp32, and the weight and bias gradients written in fp32 (the backward-weights
 * primitive's fp32 diff_weights), so no gradient is ever rounded to bf16.
 *
 * Chunk size: the samples whose staged copies (every activation copy of the call, in the
 * primitive's layout plus any fp32 plain copy) fit in the backend's chunk_bytes, at least one, at
 * most the batch, measured on the whole batch's primitive; the chunk's primitive and the
 * remainder's are built with the call.
 */
#include <stdio.h>

#include "cpu_internal.h"

static int cpu_conv_check(tt_backend *b, const char *op, const tt_conv_desc *d, tt_dtype dt) {
  if (tt_ref_dt_check(b, op, dt)) return -1;
  if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->k <= 0 || d->r <= 0 || d->s <= 0 || d->stride_h <= 0 ||
      d->stride_w <= 0 || d->pad_h < 0 || d->pad_w < 0 || d->groups <= 0)
    return tt_ref_fail(b, "%s: bad conv desc (n=%d c=%d h=%d w=%d k=%d r=%d s=%d stride=%dx%d pad=%dx%d groups=%d)", op,
                       d->n, d->c, d->h, d->w, d->k, d->r, d->s, d->stride_h, d->stride_w, d->pad_h, d->pad_w, d->groups);
  if (d->c % d->groups || d->k % d->groups)
    return tt_ref_fail(b, "%s: channels c=%d and k=%d must be divisible by groups=%d", op, d->c, d->k, d->groups);
  if ((d->layout_x != TT_LAYOUT_NCHW && d->layout_x != TT_LAYOUT_NHWC && d->layout_x != TT_LAYOUT_NCHW16C) ||
      (d->layout_y != TT_LAYOUT_NCHW && d->layout_y != TT_LAYOUT_NHWC && d->layout_y != TT_LAYOUT_NCHW16C))
    return tt_ref_fail(b, "%s: unknown layout (x %d, y %d; 0 NCHW, 1 NHWC, 2 nChw16c)", op, d->layout_x, d->layout_y);
  if ((d->layout_x == TT_LAYOUT_NCHW16C && d->c % 16) || (d->layout_y == TT_LAYOUT_NCHW16C && d->k % 16))
    return tt_ref_fail(b, "%s: nChw16c with %d input and %d output channels; the layout takes multiples of 16 only", op,
                       d->c, d->k);
  if (d->layout_w != TT_FILTER_KCRS) /* backend.h: only a backend whose filter_krsc is 1 is given KRSC */
    return tt_ref_fail(b, "%s: filter layout %d: the CPU backend reads KCRS filters only (layout_w 0)", op, d->layout_w);
  if (d->h + 2 * d->pad_h < d->r || d->w + 2 * d->pad_w < d->s ||
      d->p != (d->h + 2 * d->pad_h - d->r) / d->stride_h + 1 || d->q != (d->w + 2 * d->pad_w - d->s) / d->stride_w + 1)
    return tt_ref_fail(b, "%s: output %dx%d does not match input %dx%d, kernel %dx%d, stride %dx%d, pad %dx%d", op, d->p,
                       d->q, d->h, d->w, d->r, d->s, d->stride_h, d->stride_w, d->pad_h, d->pad_w);
  return 0;
}

static const char *cpu_conv_name(tt_op_kind k) {
  return k == TT_OP_CONV_FWD ? "conv_fwd" : (k == TT_OP_CONV_BWD_DATA ? "conv_bwd_data" : "conv_bwd_filter");
}

/* The memory descs of one chunk of nb samples: the caller's (plain) and the primitive's
 * ("any"), for x, w, bias and y. */
typedef struct cpu_conv_mds {
  dnnl_memory_desc_t x, w, b, y;         /* plain: nchw, (g)oihw, x, nchw */
  dnnl_memory_desc_t xa, wa, ya;         /* any, in the compute type */
  dnnl_memory_desc_t wg;                 /* any, fp32: the weight gradient */
  dnnl_dims_t strides, pad_l, pad_r;
  int wino; /* try the Winograd algorithm first (cpu_conv_wino) */
} cpu_conv_mds;

/* The activation layout the primitives get: oneDNN's choice ("any": nChw16c on AVX-512, and
 * plain NCHW input for first layers of 1 to 7 channels) unless a channel count is not a
 * multiple of 16, where channels-last (NHWC) is faster: nChw16c pads 24 channels to 32, and
 * both the kernels and the reorders pay for it. Measured, one thread, 128x24x28x28 3x3:
 * forward 8.3 against 6.2 ms, backward-data 8.4 against 6.0, backward-weights 8.6 against 6.5;
 * with multiples of 16 the blocked layout is as fast or faster (ResNet-50's shapes). */
static dnnl_format_tag_t cpu_conv_act_tag(const tt_conv_desc *d) {
  /* nChw16c on either side (the planner's blocked groups, fp32 on AVX-512: lower_layout.c): the
   * primitive runs blocked when both channel counts allow it, so the blocked side is never
   * reordered (and a blocked 3x3 may run as Winograd: cpu_conv_wino); a first layer of under 8
   * channels keeps oneDNN's choice (plain x, blocked y: its first-layer kernel) */
  if (d->layout_x == TT_LAYOUT_NCHW16C || d->layout_y == TT_LAYOUT_NCHW16C) {
    if (d->c % 16 == 0 && d->k % 16 == 0 && d->groups == 1) return dnnl_nChw16c;
    if (d->c < 8) return dnnl_format_tag_any;
    return dnnl_nhwc;
  }
  /* activations the planner keeps channels-last: the primitive runs on them as they are */
  if (d->layout_x == TT_LAYOUT_NHWC && d->layout_y == TT_LAYOUT_NHWC) return dnnl_nhwc;
  /* one side channels-last (the convolution before a flatten reads an NHWC group and writes NCHW):
   * NHWC for both, one reorder instead of the blocked layout's two. oneDNN 2.6 runs NHWC as fast as
   * its blocked layouts on AVX2 and AVX-512 (LeNet's 64x32x14x14 -> 64, 3x3, one thread: AVX2
   * forward 3.62 against 3.63 ms, backward-weights 3.84 against 3.84; AVX-512 2.27 against 2.38 and
   * 2.14 against 2.26). Not for inputs of fewer than 8 channels: oneDNN has no NHWC kernel for them
   * (its reference loops: 1 s); their first-layer JIT kernels take plain NCHW x and a blocked y.
   * (Plain x for their backward-weights too would pick oneDNN's gemm form, 2 against 3 ms on one
   * idle thread, but that form runs a parallel region per image: beside another busy process a
   * call took up to 2 s. So "any" stays, and AVX2 pads the 1 channel to 8 there.) */
  if ((d->layout_x == TT_LAYOUT_NHWC || d->layout_y == TT_LAYOUT_NHWC) && d->c >= 8 && d->groups == 1) return dnnl_nhwc;
  return d->c >= 8 && (d->c % 16 || d->k % 16) ? dnnl_nhwc : dnnl_format_tag_any;
}

/* The caller's memory order of an activation (tt_layout). */
static dnnl_format_tag_t cpu_conv_user_tag(int layout) {
  return layout == TT_LAYOUT_NHWC ? dnnl_nhwc : layout == TT_LAYOUT_NCHW16C ? dnnl_nChw16c : dnnl_nchw;
}

/* Whether a call is one for oneDNN's Winograd convolution (F(4x4, 3x3); AVX-512, fp32 only in
 * oneDNN 2.6): x and y both nChw16c (the layout is planned for it), 3x3, stride 1, pad 1,
 * ungrouped, computed in fp32. It cuts the multiplications of a 3x3 by 2.25x and ran 1.5 to 2x
 * faster than the direct kernels on every 3x3 of the small ResNet and ResNet-50 here, forward,
 * backward-data and backward-weights (a scratch program on the 2-core Xeon, avx512_core_bf16,
 * 2 threads, best of 5 calls: 128x32x28x28 forward 3.6 against 5.9 ms direct nChw16c and 6.2 to
 * 8.5 NHWC; 16x64x56x56 backward-data 5.3 against 11.9 and 11.5; 16x512x7x7 forward 9.0 against
 * 9.5). It rounds differently from a direct convolution: its transforms add and subtract
 * products before the sums (about 1e-6 relative error in fp32 here, against about 1e-7 direct).
 * Where oneDNN refuses the shape, the call runs direct (cpu_conv_pd). */
static int cpu_conv_wino(const tt_conv_desc *d, dnnl_data_type_t ct) {
  return d->layout_x == TT_LAYOUT_NCHW16C && d->layout_y == TT_LAYOUT_NCHW16C && ct == dnnl_f32 && d->r == 3 &&
         d->s == 3 && d->stride_h == 1 && d->stride_w == 1 && d->pad_h == 1 && d->pad_w == 1 && d->groups == 1;
}

static int cpu_conv_mds_init(tt_cpu_build *bd, const tt_conv_desc *d, int nb, dnnl_data_type_t ct, cpu_conv_mds *m) {
  tt_backend *b = bd->b;
  const char *what = bd->c->what;
  int64_t xd[4], yd[4], wd[5], bdim[1];
  int G = d->groups, wn;
  dnnl_format_tag_t wtag;
  xd[0] = nb, xd[1] = d->c, xd[2] = d->h, xd[3] = d->w;
  yd[0] = nb, yd[1] = d->k, yd[2] = d->p, yd[3] = d->q;
  if (G > 1) {
    wd[0] = G, wd[1] = d->k / G, wd[2] = d->c / G, wd[3] = d->r, wd[4] = d->s;
    wn = 5, wtag = dnnl_goihw;
  } else {
    wd[0] = d->k, wd[1] = d->c, wd[2] = d->r, wd[3] = d->s;
    wn = 4, wtag = dnnl_oihw;
  }
  bdim[0] = d->k;
  m->wino = cpu_conv_wino(d, ct);
  /* oneDNN's rule is (h + pad_l + pad_r - r) / stride + 1 == p in integers, which pad_r = pad_l
   * meets exactly when p follows PyTorch's floor formula (checked above) */
  m->strides[0] = d->stride_h, m->strides[1] = d->stride_w;
  m->pad_l[0] = m->pad_r[0] = d->pad_h, m->pad_l[1] = m->pad_r[1] = d->pad_w;
  if (tt_cpu_md(b, what, &m->x, 4, xd, cpu_conv_user_tag(d->layout_x)) ||
      tt_cpu_md(b, what, &m->y, 4, yd, cpu_conv_user_tag(d->layout_y)) ||
      tt_cpu_md(b, what, &m->w, wn, wd, wtag) || tt_cpu_md(b, what, &m->b, 1, bdim, dnnl_x) ||
      tt_cpu_md_dt(b, what, &m->xa, 4, xd, cpu_conv_act_tag(d), ct) ||
      tt_cpu_md_dt(b, what, &m->ya, 4, yd, cpu_conv_act_tag(d), ct) ||
      tt_cpu_md_dt(b, what, &m->wa, wn, wd, dnnl_format_tag_any, ct) || tt_cpu_md(b, what, &m->wg, wn, wd, dnnl_format_tag_any))
    return -1;
  return 0;
}

/* A primitive desc as tt_cpu_pd makes it (user scratchpad), without a message on failure: 0, or
 * non-zero where oneDNN has no implementation (the caller then takes the direct algorithm). */
static int cpu_conv_pd_quiet(tt_cpu_build *bd, const void *op_desc, const_dnnl_primitive_desc_t hint,
                             dnnl_primitive_desc_t *pd) {
  dnnl_primitive_attr_t attr = NULL;
  dnnl_status_t st;
  *pd = NULL;
  if (dnnl_primitive_attr_create(&attr) != dnnl_success) return -1;
  st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, op_desc, attr, tt_cpu_st(bd->b)->eng, hint);
  dnnl_primitive_attr_destroy(attr);
  if (st != dnnl_success) *pd = NULL;
  return st != dnnl_success;
}

/* The forward primitive desc (also the backward ones' hint): Winograd where m->wino and oneDNN
 * has it for the shape (else m->wino is cleared), direct otherwise. */
static int cpu_conv_fwd_pd(tt_cpu_build *bd, cpu_conv_mds *m, int bias, dnnl_primitive_desc_t *pd) {
  dnnl_convolution_desc_t cd;
  if (m->wino) {
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_winograd, &m->xa, &m->wa,
                                           bias ? &m->b : NULL, &m->ya, m->strides, m->pad_l, m->pad_r) == dnnl_success &&
        !cpu_conv_pd_quiet(bd, &cd, NULL, pd))
      return 0;
    m->wino = 0;
  }
  if (TT_CPU_DNNL(bd->b, bd->c->what,
                  dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &m->xa, &m->wa,
                                                     bias ? &m->b : NULL, &m->ya, m->strides, m->pad_l, m->pad_r)))
    return -1;
  return tt_cpu_pd(bd, &cd, NULL, pd);
}

/* The backward desc of op's kind (backward-data or backward-weights) for algorithm alg. */
static dnnl_status_t cpu_conv_bwd_desc(const tt_op_desc *op, const cpu_conv_mds *m, dnnl_alg_kind_t alg,
                                       dnnl_convolution_desc_t *cd) {
  if (op->kind == TT_OP_CONV_BWD_DATA)
    return dnnl_convolution_backward_data_desc_init(cd, alg, &m->xa, &m->wa, &m->ya, m->strides, m->pad_l, m->pad_r);
  return dnnl_convolution_backward_weights_desc_init(cd, alg, &m->xa, &m->wg, op->bias ? &m->b : NULL, &m->ya, m->strides,
                                                     m->pad_l, m->pad_r);
}

/* A backward primitive desc with the forward's as its hint: Winograd where the hint is
 * (m->wino) and oneDNN has it for this direction, else direct with a direct hint. */
static int cpu_conv_bwd_pd(tt_cpu_build *bd, const tt_op_desc *op, cpu_conv_mds *m, dnnl_primitive_desc_t *pd) {
  int bias = op->kind == TT_OP_CONV_BWD_FILTER && op->bias, rc;
  dnnl_primitive_desc_t hint = NULL;
  dnnl_convolution_desc_t cd;
  if (cpu_conv_fwd_pd(bd, m, bias, &hint)) return -1;
  if (m->wino) {
    rc = cpu_conv_bwd_desc(op, m, dnnl_convolution_winograd, &cd) != dnnl_success || cpu_conv_pd_quiet(bd, &cd, hint, pd);
    dnnl_primitive_desc_destroy(hint);
    if (!rc) return 0;
    m->wino = 0; /* refused for this direction: direct, with a direct hint */
    if (cpu_conv_fwd_pd(bd, m, bias, &hint)) return -1;
  }
  rc = TT_CPU_DNNL(bd->b, bd->c->what, cpu_conv_bwd_desc(op, m, dnnl_convolution_direct, &cd));
  if (!rc) rc = tt_cpu_pd(bd, &cd, hint, pd);
  dnnl_primitive_desc_destroy(hint);
  return rc;
}

static int cpu_conv_bwdw_f32(tt_backend *b, const tt_op_desc *op);

/* Describes the primitives of one chunk of nb samples into v. Pointer indices: forward
 * x, w, bias, y; backward-data dy, w, dx; backward-weights x, dy, dw, db. */
static int cpu_conv_variant(tt_cpu_build *bd, const tt_op_desc *op, int nb, tt_cpu_variant *v) {
  tt_backend *b = bd->b;
  const tt_conv_desc *d = &op->u.conv;
  tt_dtype half = op->dt; /* the caller's dtype (named for the calls below) */
  cpu_conv_mds m;
  dnnl_primitive_desc_t pd = NULL;
  v->nb = nb;
  if (cpu_conv_mds_init(bd, d, nb, cpu_conv_bwdw_f32(b, op) ? dnnl_f32 : tt_cpu_compute_type(op->dt), &m)) return -1;
  if (op->kind == TT_OP_CONV_FWD) {
    if (cpu_conv_fwd_pd(bd, &m, op->bias, &pd) || tt_cpu_add_stage(bd, v, pd)) return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &m.x, half, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WEIGHTS, TT_CPU_PARAM_IN, &m.w, half, 1) < 0 ||
        (op->bias && tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_BIAS, TT_CPU_PARAM_IN, &m.b, half, 2) < 0) ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &m.y, half, 3) < 0)
      return -1;
    return 0;
  }
  if (cpu_conv_bwd_pd(bd, op, &m, &pd) || tt_cpu_add_stage(bd, v, pd)) return -1;
  if (op->kind == TT_OP_CONV_BWD_DATA) {
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &m.y, half, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WEIGHTS, TT_CPU_PARAM_IN, &m.w, half, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_SRC, TT_CPU_ACT_OUT, &m.x, half, 2) < 0)
      return -1;
    return 0;
  }
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &m.x, half, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_DST, TT_CPU_ACT_IN, &m.y, half, 1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_WEIGHTS, TT_CPU_GRAD_OUT, &m.w, TT_F32, 2) < 0 ||
      (op->bias && tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DIFF_BIAS, TT_CPU_GRAD_OUT, &m.b, TT_F32, 3) < 0))
    return -1;
  return 0;
}

/* Whether op runs as a matmul (tt_cpu_call.mm): a backward convolution in bf16 (oneDNN's bf16
 * primitives: tt_cpu_compute_type) that is 1x1, stride 1, unpadded, ungrouped, with x and y both
 * NHWC, is a product of [rows, channels] matrices with rows = n*h*w:
 *   backward data     dx[rows, c] = dy[rows, k] · w[k, c]
 *   backward weights  dw[k, c]    = dyᵀ[k, rows] · x[rows, c]  (dy seen as [k, rows], tag ba)
 * and oneDNN 2.6's brgemm matmul (brg:avx512_core_amx_bf16) beats its AMX backward convolutions
 * (jit:avx512_core_amx_bf16) there. Measured on the shared 2-core AMX machine (scratch program,
 * ResNet-50's 1x1 stride-1 shapes at batch 16, medians of alternating runs, loaded): backward
 * weights 3 to 19x faster on 6 of 8 shapes (the k < c ones most: 216 -> 28 ms at 56x56 256->64),
 * equal or 0.8x on the other two; backward data 1.1 to 1.7x on 6 of 8, 0.74 and 0.92 on two; the
 * forward (brgconv_1x1) is as fast as matmul or faster, and fp32 (jit_1x1:avx512_core) within
 * noise of matmul, so both stay convolutions. The choice is made when the call is built, so the
 * workspace query sizes the path that runs. TINYTRAIN_CONV_MATMUL=0 turns it off
 * (tt_cpu_state.conv_matmul). */
static int cpu_conv_mm(tt_backend *b, const tt_op_desc *op) {
  const tt_conv_desc *d = &op->u.conv;
  return tt_cpu_st(b)->conv_matmul && (op->kind == TT_OP_CONV_BWD_DATA || op->kind == TT_OP_CONV_BWD_FILTER) &&
         tt_cpu_compute_type(op->dt) == dnnl_bf16 && d->r == 1 && d->s == 1 && d->stride_h == 1 && d->stride_w == 1 &&
         d->pad_h == 0 && d->pad_w == 0 && d->groups == 1 && d->layout_x == TT_LAYOUT_NHWC &&
         d->layout_y == TT_LAYOUT_NHWC;
}

/* Whether a bf16 backward-weights convolution computes in fp32 instead (bf16 x and dy widened
 * into fp32 workspace copies by our loops, as fp16 always is): only under TINYTRAIN_CONV_BWDW=f32,
 * for the layers with 64 or more input channels and 256 or more of them or a stride.
 * Why a knob and not the default: oneDNN 2.6's AMX bf16 backward-weights kernel
 * (jit:avx512_core_amx_bf16) is the fast one on idle cores and a slow one on cores shared with
 * other busy work. On the idle 2-core AMX Xeon (2026-12-06, ONEDNN_VERBOSE, ResNet-50 batch 16,
 * NHWC) it took 3.6 ms on 3x3 256->256 14x14 against the fp32 kernel's 11.2, 4.9 against 17.0
 * on stride-2 128->128 56x56, 11.8 against 18.3 on stride-2 512->512 14x14, and the bf16
 * ResNet-50 step was 780 to 818 ms against 851 to 877 (bench_step, 3 alternating rounds); with
 * one busy loop beside it (and libgomp's short spin, which tinytrain sets on a busy machine) the
 * same calls took 58, 60 and 75 ms against the fp32 kernel's 23, 37 and 36, and the step 2190
 * to 2260 against 1750 to 1771 ms. That fits an earlier session's 200 to 250 ms a call, measured
 * on an AMX machine while it was shared. The choice is fixed, not made by the load, so that the
 * same command gives the same bits every time (the two routes round differently). On a CPU with
 * AVX512_BF16 and no AMX (oneDNN's jit_bf16:avx512_core_bf16, 2-core AMD EPYC) bf16 was faster
 * too: ResNet-50 batch 16 bf16 steps 1205 against 1357 ms. TINYTRAIN_CONV_MATMUL=0 turns this
 * route off as well. */
static int cpu_conv_bwdw_f32(tt_backend *b, const tt_op_desc *op) {
  const tt_conv_desc *d = &op->u.conv;
  return tt_cpu_st(b)->bwdw_f32 && op->kind == TT_OP_CONV_BWD_FILTER &&
         tt_cpu_compute_type(op->dt) == dnnl_bf16 &&
         !cpu_conv_mm(b, op) && d->groups == 1 && d->c >= 64 && (d->c >= 256 || d->stride_h > 1 || d->stride_w > 1);
}

/* The matmul form of a backward 1x1 convolution (cpu_conv_mm) for nb samples; the same
 * pointer indices as the convolution's (backward-data dy, w, dx; backward-weights x, dy, dw; the
 * bias gradient is our loop after the run: tt_cpu_conv_bwd_filter). */
static int cpu_conv_mm_variant(tt_cpu_build *bd, const tt_op_desc *op, int nb, tt_cpu_variant *v) {
  tt_backend *b = bd->b;
  const tt_conv_desc *d = &op->u.conv;
  const char *what = bd->c->what;
  dnnl_data_type_t ct = tt_cpu_compute_type(op->dt);
  int64_t rows = (int64_t)nb * d->h * d->w, d0[2], d1[2], d2[2];
  dnnl_memory_desc_t m0, m1, m2, p0, p1, p2; /* the caller's (fp32 descs, tt_cpu_add_tensor), the primitive's */
  dnnl_matmul_desc_t md;
  dnnl_primitive_desc_t pd;
  v->nb = nb;
  if (op->kind == TT_OP_CONV_BWD_DATA) {
    d0[0] = rows, d0[1] = d->k;  /* dy, NHWC */
    d1[0] = d->k, d1[1] = d->c;  /* w, oihw with 1x1 */
    d2[0] = rows, d2[1] = d->c;  /* dx, NHWC */
    if (tt_cpu_md(b, what, &m0, 2, d0, dnnl_ab) || tt_cpu_md(b, what, &m1, 2, d1, dnnl_ab) ||
        tt_cpu_md(b, what, &m2, 2, d2, dnnl_ab) || tt_cpu_md_dt(b, what, &p0, 2, d0, dnnl_ab, ct) ||
        tt_cpu_md_dt(b, what, &p1, 2, d1, dnnl_ab, ct) || tt_cpu_md_dt(b, what, &p2, 2, d2, dnnl_ab, ct))
      return -1;
    if (TT_CPU_DNNL(b, what, dnnl_matmul_desc_init(&md, &p0, &p1, NULL, &p2)) || tt_cpu_pd(bd, &md, NULL, &pd) ||
        tt_cpu_add_stage(bd, v, pd))
      return -1;
    if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &m0, op->dt, 0) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WEIGHTS, TT_CPU_PARAM_IN, &m1, op->dt, 1) < 0 ||
        tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_ACT_OUT, &m2, op->dt, 2) < 0)
      return -1;
    return 0;
  }
  d0[0] = d->k, d0[1] = rows; /* dy as [k, rows] (NHWC dy transposed: tag ba) */
  d1[0] = rows, d1[1] = d->c; /* x, NHWC */
  d2[0] = d->k, d2[1] = d->c; /* dw, fp32 */
  if (tt_cpu_md(b, what, &m0, 2, d0, dnnl_ba) || tt_cpu_md(b, what, &m1, 2, d1, dnnl_ab) ||
      tt_cpu_md(b, what, &m2, 2, d2, dnnl_ab) || tt_cpu_md_dt(b, what, &p0, 2, d0, dnnl_ba, ct) ||
      tt_cpu_md_dt(b, what, &p1, 2, d1, dnnl_ab, ct))
    return -1;
  if (TT_CPU_DNNL(b, what, dnnl_matmul_desc_init(&md, &p0, &p1, NULL, &m2)) || tt_cpu_pd(bd, &md, NULL, &pd) ||
      tt_cpu_add_stage(bd, v, pd))
    return -1;
  if (tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_SRC, TT_CPU_ACT_IN, &m0, op->dt, 1) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_WEIGHTS, TT_CPU_ACT_IN, &m1, op->dt, 0) < 0 ||
      tt_cpu_add_tensor(bd, v, 0, DNNL_ARG_DST, TT_CPU_GRAD_OUT, &m2, TT_F32, 2) < 0)
    return -1;
  return 0;
}

/* Staged bytes per sample of a variant's activation tensors. */
static size_t cpu_conv_staged_per_sample(const tt_cpu_variant *v) {
  size_t bytes = 0;
  int i;
  for (i = 0; i < v->nt; i++) {
    const tt_cpu_tensor *t = &v->t[i];
    if (t->role != TT_CPU_ACT_IN && t->role != TT_CPU_ACT_OUT) continue;
    if (t->reorder || t->bf_combine) bytes += t->prim_bytes;
    if (t->plain_copy) bytes += t->plain_bytes;
  }
  return bytes / (size_t)v->nb;
}

int tt_cpu_conv_build(tt_cpu_build *bd, const tt_op_desc *op) {
  const tt_conv_desc *d = &op->u.conv;
  tt_cpu_call *c = bd->c;
  tt_cpu_build trial_bd = *bd;
  tt_cpu_variant *trial;
  size_t per;
  int nb, i;
  snprintf(c->what, sizeof c->what, "%s (n=%d, %dx%dx%d -> %dx%dx%d, kernel %dx%d, stride %dx%d, pad %dx%d, groups %d, %s, %s -> %s)",
           cpu_conv_name(op->kind), d->n, d->c, d->h, d->w, d->k, d->p, d->q, d->r, d->s, d->stride_h, d->stride_w,
           d->pad_h, d->pad_w, d->groups, tt_dtype_name(op->dt) ? tt_dtype_name(op->dt) : "unknown dtype",
           tt_layout_name(d->layout_x), tt_layout_name(d->layout_y));
  if (cpu_conv_check(bd->b, c->what, d, op->dt)) return -1;
  c->mm = cpu_conv_mm(bd->b, op);
  if (c->mm) {
    size_t len = strlen(c->what);
    snprintf(c->what + len, sizeof c->what - len, " as a matmul");
  } else if (cpu_conv_bwdw_f32(bd->b, op)) {
    size_t len = strlen(c->what);
    snprintf(c->what + len, sizeof c->what - len, " computed in fp32");
  }
  /* the whole batch's primitive, only measured, tells the staged bytes per sample */
  trial = &c->v[1];
  trial_bd.create = 0;
  i = c->mm ? cpu_conv_mm_variant(&trial_bd, op, d->n, trial) : cpu_conv_variant(&trial_bd, op, d->n, trial);
  per = i ? 0 : cpu_conv_staged_per_sample(trial);
  for (i = 0; i < trial->ns; i++)
    if (trial->s[i].pd) dnnl_primitive_desc_destroy(trial->s[i].pd);
  memset(trial, 0, sizeof *trial);
  nb = per ? (int)(tt_cpu_st(bd->b)->chunk_bytes / per) : d->n;
  if (nb < 1) nb = 1;
  if (nb > d->n) nb = d->n;
  c->nb = nb;
  c->nv = d->n % nb ? 2 : 1;
  if (c->mm) {
    if (cpu_conv_mm_variant(bd, op, nb, &c->v[0])) return -1;
    if (c->nv == 2 && cpu_conv_mm_variant(bd, op, d->n % nb, &c->v[1])) return -1;
    return 0;
  }
  if (cpu_conv_variant(bd, op, nb, &c->v[0])) return -1;
  if (c->nv == 2 && cpu_conv_variant(bd, op, d->n % nb, &c->v[1])) return -1;
  return 0;
}

/* ---- table entries ---- */

static void cpu_conv_op(tt_op_desc *op, tt_op_kind kind, const tt_conv_desc *d, tt_dtype dt, int bias, int accumulate) {
  memset(op, 0, sizeof *op);
  op->kind = kind, op->dt = dt, op->bias = bias, op->accumulate = accumulate;
  op->u.conv = *d;
}

/* ---- backward 1x1 strided convolutions: the sampled pixels as a stride-1 matmul ---- */

/* Whether op is a backward 1x1 convolution with a stride (no padding, ungrouped, bf16 computed in
 * bf16, x and y NHWC): ResNet's downsample convolutions. Its output pixel (i, j) reads input
 * pixel (i*stride_h, j*stride_w) alone, so on the sampled pixels it is the stride-1 1x1
 * convolution *inner (h = p, w = q), which runs as a matmul (cpu_conv_mm): backward weights
 * gathers x's sampled pixels into the workspace first, backward data writes them there and
 * scatters into dx (the pixels between get 0, or keep their value when dx is added into).
 * oneDNN 2.6's AMX backward convolutions are slow there: in a ResNet-50 bf16 step at batch 16 on
 * this 2-core AMX machine the three stride-2 downsample convolutions took 40, 31 and 27 ms a
 * backward (164 to 245 GFLOP/s) where the stride-1 1x1 matmuls reach about 600.
 * TINYTRAIN_CONV_MATMUL=0 turns it off with the rest. */
static int cpu_conv_strided_mm(tt_backend *b, const tt_op_desc *op, tt_conv_desc *inner) {
  const tt_conv_desc *d = &op->u.conv;
  if (!tt_cpu_st(b)->conv_matmul || (op->kind != TT_OP_CONV_BWD_DATA && op->kind != TT_OP_CONV_BWD_FILTER) ||
      tt_cpu_compute_type(op->dt) != dnnl_bf16 || d->r != 1 || d->s != 1 || (d->stride_h == 1 && d->stride_w == 1) ||
      d->stride_h < 1 || d->stride_w < 1 || d->pad_h != 0 || d->pad_w != 0 || d->groups != 1 ||
      d->layout_x != TT_LAYOUT_NHWC || d->layout_y != TT_LAYOUT_NHWC || d->p < 1 || d->q < 1 ||
      (d->p - 1) * d->stride_h >= d->h || (d->q - 1) * d->stride_w >= d->w)
    return 0;
  *inner = *d;
  inner->h = d->p, inner->w = d->q, inner->stride_h = inner->stride_w = 1;
  return 1;
}

/* The strided form's chunk (samples gathered at a time, so the staging stays within the chunk
 * budget as the convolutions' does), its buffer's bytes (64-aligned) and the inner calls'
 * workspace (the chunk's and the remainder's, the larger). TT_WS_ERROR on failure. */
static size_t cpu_conv_strided_plan(tt_backend *b, const tt_op_desc *op, const tt_conv_desc *inner, int *nb,
                                    size_t *buf) {
  const tt_conv_desc *d = &op->u.conv;
  size_t per = (size_t)d->p * d->q * d->c * 2, need = 0;
  tt_op_desc io;
  int k, n = (int)(tt_cpu_st(b)->chunk_bytes / per);
  if (n < 1) n = 1;
  if (n > d->n) n = d->n;
  *nb = n;
  *buf = ((size_t)n * per + 63) / 64 * 64;
  for (k = 0; k < 2; k++) {
    tt_conv_desc id = *inner;
    size_t s;
    id.n = k ? d->n % n : n;
    if (!id.n) continue;
    cpu_conv_op(&io, op->kind, &id, op->dt, op->kind == TT_OP_CONV_BWD_FILTER ? op->bias : 0, 0);
    s = b->op_workspace(b, &io);
    if (s == TT_WS_ERROR) return TT_WS_ERROR;
    if (s > need) need = s;
  }
  return need;
}

size_t tt_cpu_conv_strided_workspace(tt_backend *b, const tt_op_desc *op) {
  tt_conv_desc inner;
  size_t buf, need;
  int nb;
  if (!cpu_conv_strided_mm(b, op, &inner)) return 0;
  need = cpu_conv_strided_plan(b, op, &inner, &nb, &buf);
  return need == TT_WS_ERROR ? TT_WS_ERROR : buf + need;
}

/* Backward of a strided 1x1 convolution through *inner (cpu_conv_strided_mm); x and dw for
 * backward weights (db may be NULL), w and dx for backward data; 16-bit elements throughout. */
static int cpu_conv_strided_run(tt_backend *b, const tt_op_desc *op, const tt_conv_desc *inner, const void *x,
                                const void *dy, const void *w, void *dx, float *dw, float *db, float beta, void *ws,
                                size_t ws_bytes) {
  const tt_conv_desc *d = &op->u.conv;
  int nb, n0;
  size_t buf, need = cpu_conv_strided_plan(b, op, inner, &nb, &buf), row = (size_t)d->c * 2;
  size_t xs = (size_t)d->h * d->w * row, ss = (size_t)d->p * d->q * row, ys = (size_t)d->p * d->q * d->k * 2;
  if (need == TT_WS_ERROR) return -1;
  if (!ws || ws_bytes < buf + need)
    return tt_ref_fail(b, "%s (1x1, stride %dx%d, as a matmul of the sampled pixels): workspace of %zu bytes, needs %zu; "
                       "pass what op_workspace answers", cpu_conv_name(op->kind), d->stride_h, d->stride_w, ws_bytes,
                       buf + need);
  for (n0 = 0; n0 < d->n; n0 += nb) {
    tt_conv_desc id = *inner;
    ptrdiff_t r, rows;
    int nt;
    id.n = d->n - n0 < nb ? d->n - n0 : nb;
    rows = (ptrdiff_t)id.n * d->h; /* input rows (sample, i) of this chunk */
    nt = tt_cpu_threads_for(b, (size_t)id.n * xs);
    (void)nt;
    if (op->kind == TT_OP_CONV_BWD_FILTER) {
      /* gather: sampled pixel (s, i, j) of x into [s, i, j] of the buffer, c channels each */
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
      for (r = 0; r < (ptrdiff_t)id.n * d->p; r++) {
        const char *src = (const char *)x + (size_t)(n0 + r / d->p) * xs + (size_t)(r % d->p) * d->stride_h * d->w * row;
        char *dst = (char *)ws + (size_t)r * d->q * row;
        int j;
        for (j = 0; j < d->q; j++) memcpy(dst + (size_t)j * row, src + (size_t)j * d->stride_w * row, row);
      }
      if (tt_cpu_conv_bwd_filter(b, &id, op->dt, ws, (const char *)dy + (size_t)n0 * ys, dw, db, n0 ? 1.0f : beta,
                                 (char *)ws + buf, ws_bytes - buf))
        return -1;
      continue;
    }
    if (tt_cpu_conv_bwd_data(b, &id, op->dt, (const char *)dy + (size_t)n0 * ys, w, ws, 0.0f, (char *)ws + buf,
                             ws_bytes - buf))
      return -1;
    /* scatter: each input row (s, i) of dx; sampled pixels take the buffer's value (added in
     * fp32 and rounded once when dx is added into), the others 0 or their own value */
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (r = 0; r < rows; r++) {
      int s = (int)(r / d->h), i = (int)(r % d->h), j, ch, sampled = i % d->stride_h == 0 && i / d->stride_h < d->p;
      uint16_t *o = (uint16_t *)((char *)dx + (size_t)(n0 + s) * xs + (size_t)i * d->w * row);
      const uint16_t *v = (const uint16_t *)((const char *)ws + (size_t)s * ss + (size_t)(i / d->stride_h) * d->q * row);
      for (j = 0; j < d->w; j++, o += d->c) {
        int hit = sampled && j % d->stride_w == 0 && j / d->stride_w < d->q;
        const uint16_t *vj = v + (size_t)(j / d->stride_w) * d->c;
        if (!hit) {
          if (beta == 0.0f) memset(o, 0, row);
        } else if (beta == 0.0f) {
          memcpy(o, vj, row);
        } else {
          for (ch = 0; ch < d->c; ch++) o[ch] = tt_bf16_from_f32(tt_bf16_to_f32(o[ch]) + tt_bf16_to_f32(vj[ch]));
        }
      }
    }
  }
  return 0;
}


size_t tt_cpu_conv_workspace(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which) {
  tt_op_desc op;
  if (!d) return tt_ref_fail(b, "conv_workspace: NULL conv desc"), TT_WS_ERROR;
  if (cpu_conv_check(b, "conv_workspace", d, dt)) return TT_WS_ERROR;
  if (which != TT_WS_FWD && which != TT_WS_BWD_DATA && which != TT_WS_BWD_FILTER)
    return tt_ref_fail(b, "conv_workspace: unknown workspace kind %d", (int)which), TT_WS_ERROR;
  /* the most any call of this kind may need: with a bias, adding into dx */
  cpu_conv_op(&op, which == TT_WS_FWD ? TT_OP_CONV_FWD : (which == TT_WS_BWD_DATA ? TT_OP_CONV_BWD_DATA : TT_OP_CONV_BWD_FILTER),
              d, dt, 1, 1);
  return b->op_workspace(b, &op);
}

int tt_cpu_conv_fwd(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *x, const void *w,
                    const void *bias, void *y, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  const tt_cpu_call *c;
  void *ptrs[4];
  if (!d) return tt_ref_fail(b, "conv_fwd: NULL conv desc");
  if (!x || !w || !y) return tt_ref_fail(b, "conv_fwd: NULL x, w or y");
  cpu_conv_op(&op, TT_OP_CONV_FWD, d, dt, bias != NULL, 0);
  if (cpu_conv_check(b, "conv_fwd", d, dt)) return -1;
  if (tt_cpu_conv_wg(b, &op))
    return tt_cpu_conv_wg_fwd(b, d, (const float *)x, (const float *)w, (const float *)bias, (float *)y, ws, ws_bytes);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_conv_build))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = (void *)w, ptrs[2] = (void *)bias, ptrs[3] = y;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, 0.0f);
}

int tt_cpu_conv_bwd_data(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *dy, const void *w,
                         void *dx, float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  tt_conv_desc inner;
  const tt_cpu_call *c;
  void *ptrs[3];
  if (!d) return tt_ref_fail(b, "conv_bwd_data: NULL conv desc");
  if (!dy || !w || !dx) return tt_ref_fail(b, "conv_bwd_data: NULL dy, w or dx");
  cpu_conv_op(&op, TT_OP_CONV_BWD_DATA, d, dt, 0, beta != 0.0f);
  if (cpu_conv_check(b, "conv_bwd_data", d, dt)) return -1;
  if (tt_cpu_conv_wg(b, &op)) return tt_cpu_conv_wg_bwd_data(b, d, (const float *)dy, (const float *)w, (float *)dx, beta, ws, ws_bytes);
  if (cpu_conv_strided_mm(b, &op, &inner)) return cpu_conv_strided_run(b, &op, &inner, NULL, dy, w, dx, NULL, NULL, beta, ws, ws_bytes);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_conv_build))) return -1;
  ptrs[0] = (void *)dy, ptrs[1] = (void *)w, ptrs[2] = dx;
  return tt_cpu_run(b, c, ptrs, ws, ws_bytes, beta, 0.0f);
}

int tt_cpu_conv_bwd_filter(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *x, const void *dy,
                           float *dw, float *db, float beta, void *ws, size_t ws_bytes) {
  tt_op_desc op;
  tt_conv_desc inner;
  const tt_cpu_call *c;
  void *ptrs[4];
  if (!d) return tt_ref_fail(b, "conv_bwd_filter: NULL conv desc");
  if (!x || !dy || !dw) return tt_ref_fail(b, "conv_bwd_filter: NULL x, dy or dw");
  cpu_conv_op(&op, TT_OP_CONV_BWD_FILTER, d, dt, db != NULL, 0);
  if (cpu_conv_check(b, "conv_bwd_filter", d, dt)) return -1;
  if (tt_cpu_conv_wg(b, &op))
    return tt_cpu_conv_wg_bwd_filter(b, d, (const float *)x, (const float *)dy, dw, db, beta, ws, ws_bytes);
  if (tt_cpu_conv_col(b, &op)) return tt_cpu_conv_col_bwd_filter(b, d, (const float *)x, (const float *)dy, dw, db, beta, ws, ws_bytes);
  if (cpu_conv_strided_mm(b, &op, &inner)) return cpu_conv_strided_run(b, &op, &inner, x, dy, NULL, NULL, dw, db, beta, ws, ws_bytes);
  if (!(c = tt_cpu_dnnl_get(b, &op, tt_cpu_conv_build))) return -1;
  ptrs[0] = (void *)x, ptrs[1] = (void *)dy, ptrs[2] = dw, ptrs[3] = db;
  if (tt_cpu_run(b, c, ptrs, ws, ws_bytes, 0.0f, beta)) return -1;
  /* the matmul form has no bias gradient: db sums dy [n*p*q, k] (NHWC) per channel, in fixed order */
  if (c->mm && db) tt_ref_channel_sum(b, d->n * d->p * d->q, d->k, 1, dt, dy, db, beta);
  return 0;
}

int tt_cpu_conv_is_matmul(tt_backend *b, const tt_op_desc *op) {
  tt_conv_desc inner;
  if (cpu_conv_strided_mm(b, op, &inner)) return 1; /* the sampled pixels' matmul */
  if (op->kind == TT_OP_CONV_BWD_FILTER && tt_cpu_conv_col(b, op)) return 1; /* column blocks (cpu_conv_col.c) */
  if (tt_cpu_conv_wg(b, op)) return 0; /* Winograd (cpu_conv_wg.c): transforms around 36 products, not one matmul */
  const tt_cpu_call *c = tt_cpu_dnnl_get(b, op, tt_cpu_conv_build);
  return c ? c->mm : -1;
}
