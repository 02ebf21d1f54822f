/* kernels/cuda/cuda_conv.cu — convolution through cuDNN (legacy convolution API).
 *
 * Per shape (tt_conv_desc + dtype) a cache slot holds the tensor/filter/convolution
 * descriptors and, per direction, the algorithm: the first of cudnnGet*Algorithm_v7's
 * heuristic ranking that succeeds and whose workspace (cudnnGet*WorkspaceSize, exact) is at
 * most st->ws_cap; if none fits, the one with the least workspace. *_workspace() returns the
 * bytes of that choice (plus, for fp16 and bf16 backward-filter, a 16-bit copy of dw: cuDNN writes
 * dw in the tensor dtype, and the backend accumulates it into the fp32 gradient). If the planned
 * buffer turns out smaller at run time the choice is redone within ws_bytes.
 *
 * fp32 uses CUDNN_FMA_MATH (no TF32, so results match the CPU backend to ~1e-5) unless the session
 * turned TF32 on (tt_cuda_set_tf32, compute capability 8.0 and newer only): then CUDNN_DEFAULT_MATH
 * for the ranking, and each algorithm runs with the math type cuDNN ranked it with (TF32 tensor
 * cores where it has them), as PyTorch's torch.backends.cudnn.allow_tf32 = True does; fp16 stores
 * half, computes in fp32 (PSEUDO_HALF) and may use tensor cores. bf16 likewise: x, w and y
 * CUDNN_DATA_BFLOAT16 with a FLOAT compute type (cuDNN's PSEUDO_BFLOAT16 configuration, the one
 * bf16 configuration of the legacy convolution API, which needs compute capability 8.0: older
 * devices are refused here with a message rather than by cuDNN); as for fp16, each algorithm
 * runs with the math type cuDNN ranked it with (tensor-op math where it has it). The weight gradient of a bf16 convolution
 * is cuDNN's bf16 dw (accumulated in fp32 inside cuDNN, rounded once to bf16), widened into the
 * fp32 gradient: what PyTorch's autocast gets for the bf16 copy of a weight. Bias add and bias
 * gradient are the backend's own kernels.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cuda_internal.h"

static size_t cuda_conv_round(size_t v) { return (v + 255u) & ~(size_t)255u; }

/* fp16 and bf16: 16-bit tensors, fp32 compute, tensor cores allowed */
static int cuda_conv_16bit(tt_dtype dt) { return dt == TT_F16 || dt == TT_BF16; }

/* The math type a convolution's descriptor is ranked with: tensor-op math for 16-bit tensors;
 * for fp32 CUDNN_DEFAULT_MATH (TF32 allowed, cuDNN 8 and newer) when TF32 is on, else
 * CUDNN_FMA_MATH (true fp32). */
static cudnnMathType_t cuda_conv_base_math(tt_backend *b, tt_dtype dt) {
  return cuda_conv_16bit(dt) ? CUDNN_TENSOR_OP_MATH : tt_cuda_st(b)->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

static int cuda_conv_check(tt_backend *b, const char *op, const tt_conv_desc *d, tt_dtype dt) {
  if (!d) return tt_cuda_fail(b, "%s: NULL conv desc", op);
  if (tt_cuda_lib_dt_check(b, op, dt, "convolutions", "cuDNN's bf16 configuration")) return -1;
  if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->k <= 0 || d->r <= 0 || d->s <= 0 || d->stride_h <= 0 ||
      d->stride_w <= 0 || d->pad_h < 0 || d->pad_w < 0 || d->groups <= 0 || d->c % d->groups || d->k % d->groups)
    return tt_cuda_fail(b, "%s: bad conv desc (n=%d c=%d h=%d w=%d k=%d r=%d s=%d groups=%d)", op, d->n, d->c, d->h,
                        d->w, d->k, d->r, d->s, d->groups);
  if ((d->layout_x != TT_LAYOUT_NCHW && d->layout_x != TT_LAYOUT_NHWC) ||
      (d->layout_y != TT_LAYOUT_NCHW && d->layout_y != TT_LAYOUT_NHWC))
    return tt_cuda_fail(b, "%s: layouts x %d, y %d: the CUDA backend takes NCHW (0) and NHWC (1)", op, d->layout_x,
                        d->layout_y);
  /* a stored KRSC filter: what cuDNN's channels-last kernels read, so only where x and y are NHWC */
  if (d->layout_w != TT_FILTER_KCRS &&
      (d->layout_w != TT_FILTER_KRSC || d->layout_x != TT_LAYOUT_NHWC || d->layout_y != TT_LAYOUT_NHWC))
    return tt_cuda_fail(b, "%s: filter layout %d with x %s, y %s: the CUDA backend takes a KCRS filter (0), or a KRSC one (1) "
                        "when x and y are both NHWC", op, d->layout_w, tt_layout_name(d->layout_x), tt_layout_name(d->layout_y));
  if (d->p != (d->h + 2 * d->pad_h - d->r) / d->stride_h + 1 || d->q != (d->w + 2 * d->pad_w - d->s) / d->stride_w + 1 ||
      d->p <= 0 || d->q <= 0)
    return tt_cuda_fail(b, "%s: output %dx%d does not match input %dx%d, filter %dx%d, stride %dx%d, pad %dx%d", op,
                        d->p, d->q, d->h, d->w, d->r, d->s, d->stride_h, d->stride_w, d->pad_h, d->pad_w);
  return 0;
}

int tt_cuda_conv_cache_create(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  int i;
  st->conv = (tt_cuda_conv_slot *)calloc(TT_CUDA_CONV_SLOTS, sizeof *st->conv);
  if (!st->conv) return tt_cuda_fail(b, "out of host memory for the convolution cache");
  for (i = 0; i < TT_CUDA_CONV_SLOTS; i++) {
    tt_cuda_conv_slot *s = &st->conv[i];
    CUDNN_CHECK(b, cudnnCreateTensorDescriptor(&s->x));
    CUDNN_CHECK(b, cudnnCreateTensorDescriptor(&s->y));
    CUDNN_CHECK(b, cudnnCreateFilterDescriptor(&s->w));
    CUDNN_CHECK(b, cudnnCreateTensorDescriptor(&s->yt));
    CUDNN_CHECK(b, cudnnCreateFilterDescriptor(&s->wn));
    CUDNN_CHECK(b, cudnnCreateConvolutionDescriptor(&s->conv));
    st->nconv = i + 1;
  }
  return tt_cuda_conv_graph_create(b);
}

void tt_cuda_conv_cache_forget(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  int i;
  for (i = 0; st->conv && i < st->nconv; i++) memset(st->conv[i].have, 0, sizeof st->conv[i].have);
  tt_cuda_conv_graph_forget(b); /* the graph-API candidates were chosen under the same cap and math */
}

void tt_cuda_conv_cache_destroy(tt_backend *b) {
  tt_cuda_state *st = tt_cuda_st(b);
  int i;
  tt_cuda_conv_graph_destroy(b);
  if (!st->conv) return;
  for (i = 0; i < TT_CUDA_CONV_SLOTS; i++) {
    tt_cuda_conv_slot *s = &st->conv[i];
    /* teardown: a failure here cannot be acted on */
    if (s->x) (void)cudnnDestroyTensorDescriptor(s->x);
    if (s->y) (void)cudnnDestroyTensorDescriptor(s->y);
    if (s->w) (void)cudnnDestroyFilterDescriptor(s->w);
    if (s->yt) (void)cudnnDestroyTensorDescriptor(s->yt);
    if (s->wn) (void)cudnnDestroyFilterDescriptor(s->wn);
    if (s->conv) (void)cudnnDestroyConvolutionDescriptor(s->conv);
  }
  free(st->conv);
  st->conv = NULL;
  st->nconv = 0;
}

/* layout_w is not compared: a slot's descriptors and algorithm choices are the same for a stored
 * KRSC filter and a KCRS one copied to KRSC; only the call's workspace front differs (cuda_conv_extra
 * of the call's own desc). */
static int cuda_conv_same(const tt_conv_desc *a, const tt_conv_desc *c) {
  return a->n == c->n && a->c == c->c && a->h == c->h && a->w == c->w && a->k == c->k && a->r == c->r && a->s == c->s &&
         a->stride_h == c->stride_h && a->stride_w == c->stride_w && a->pad_h == c->pad_h && a->pad_w == c->pad_w &&
         a->groups == c->groups && a->p == c->p && a->q == c->q && a->layout_x == c->layout_x && a->layout_y == c->layout_y;
}

/* cuDNN's format of an activation tensor in tt_layout l (backend.h): NHWC is channels-last with
 * no padding, CUDNN_TENSOR_NHWC's packed strides. */
static cudnnTensorFormat_t cuda_conv_format(int l) { return l == TT_LAYOUT_NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW; }

/* How direction `which` of a convolution is presented to cuDNN. cuDNN's legacy API serves only
 * some (x, y, filter) format combinations; on the first H100 run (cuDNN 9.19, fp16 and bf16,
 * every ResNet-50 shape, tests/gpu/cudnn_probe.c in docs/gpu.md) its heuristics offered:
 *   forward:          any x and y with a KCRS filter; a KRSC (NHWC) filter only with x NHWC;
 *   backward-data:    the filter in dy's format, and a KRSC filter only with x NHWC;
 *   backward-filter:  the filter in x's format, and a KRSC filter only with dy NHWC.
 * So: all-NHWC runs with a KRSC filter (cuDNN's channels-last kernels): the stored one where the
 * desc says so (layout_w: the 16-bit weight copy the cast wrote KRSC), else a KRSC copy of the KCRS
 * filter transposed into the workspace on every call; a layout-
 * changing convolution runs with the KCRS filter, except where no combination serves it, which
 * transposes dy into x's layout first (backward-data of NCHW -> NHWC, backward-filter of
 * NHWC -> NCHW) and is then all-NCHW or all-NHWC. The emulated cuDNN (tests/cuda_emu) refuses
 * the combinations cuDNN refused, so CI sees what the GPU saw. */
typedef struct cuda_conv_view {
  int dy_t;   /* dy transposed into x's layout (workspace) */
  int w_nhwc; /* the filter as cuDNN reads it is KRSC (for backward-filter, dw written so) */
  int w_t;    /* forward and backward-data: that KRSC filter is a copy of the KCRS one in the workspace
               * (0 where the stored filter is KRSC already: layout_w) */
} cuda_conv_view;
static cuda_conv_view cuda_conv_view_of(const tt_conv_desc *d, tt_ws_kind which) {
  cuda_conv_view v;
  int xn = d->layout_x == TT_LAYOUT_NHWC, yn = d->layout_y == TT_LAYOUT_NHWC;
  v.dy_t = (which == TT_WS_BWD_DATA && !xn && yn) || (which == TT_WS_BWD_FILTER && xn && !yn);
  v.w_nhwc = xn && (v.dy_t ? xn : yn);
  v.w_t = v.w_nhwc && which != TT_WS_BWD_FILTER && d->layout_w != TT_FILTER_KRSC;
  return v;
}

/* Finds or fills the slot for (d, dt). */
static tt_cuda_conv_slot *cuda_conv_slot(tt_backend *b, const tt_conv_desc *d, tt_dtype dt) {
  tt_cuda_state *st = tt_cuda_st(b);
  tt_cuda_conv_slot *s = NULL, *lru = NULL;
  cudnnDataType_t ct = dt == TT_F16 ? CUDNN_DATA_HALF : dt == TT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  cudnnStatus_t e;
  int i, on, oc, oh, ow;
  for (i = 0; i < st->nconv; i++) {
    tt_cuda_conv_slot *c = &st->conv[i];
    if (c->used && c->dt == dt && cuda_conv_same(&c->d, d)) {
      c->last_use = ++st->tick;
      return c;
    }
    if (!lru || !c->used || (lru->used && c->last_use < lru->last_use)) lru = c;
  }
  s = lru;
  if (!s) {
    tt_cuda_fail(b, "conv: no convolution cache");
    return NULL;
  }
  s->used = 0;
  memset(s->have, 0, sizeof s->have);
#define CUDA_CONV_TRY(call)                                                                  \
  do {                                                                                       \
    e = (call);                                                                              \
    if (e != CUDNN_STATUS_SUCCESS) {                                                         \
      tt_cuda_fail(b, "%s failed: %s", #call, cudnnGetErrorString(e));                       \
      return NULL;                                                                           \
    }                                                                                        \
  } while (0)
  /* x/dx and y/dy in the desc's layouts (a convolution is where the layout changes); the filter
   * as stored, [k, c/g, r, s], and as a transposed copy [k, r, s, c/g]; dy in the other layout.
   * Which of them a direction runs with: cuda_conv_view. */
  CUDA_CONV_TRY(cudnnSetTensor4dDescriptor(s->x, cuda_conv_format(d->layout_x), ct, d->n, d->c, d->h, d->w));
  CUDA_CONV_TRY(cudnnSetTensor4dDescriptor(s->y, cuda_conv_format(d->layout_y), ct, d->n, d->k, d->p, d->q));
  CUDA_CONV_TRY(cudnnSetFilter4dDescriptor(s->w, ct, CUDNN_TENSOR_NCHW, d->k, d->c / d->groups, d->r, d->s));
  CUDA_CONV_TRY(cudnnSetTensor4dDescriptor(s->yt, cuda_conv_format(d->layout_y == TT_LAYOUT_NHWC ? TT_LAYOUT_NCHW : TT_LAYOUT_NHWC),
                                           ct, d->n, d->k, d->p, d->q));
  CUDA_CONV_TRY(cudnnSetFilter4dDescriptor(s->wn, ct, CUDNN_TENSOR_NHWC, d->k, d->c / d->groups, d->r, d->s));
  CUDA_CONV_TRY(cudnnSetConvolution2dDescriptor(s->conv, d->pad_h, d->pad_w, d->stride_h, d->stride_w, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDA_CONV_TRY(cudnnSetConvolutionGroupCount(s->conv, d->groups));
  CUDA_CONV_TRY(cudnnSetConvolutionMathType(s->conv, cuda_conv_base_math(b, dt)));
  CUDA_CONV_TRY(cudnnGetConvolution2dForwardOutputDim(s->conv, s->x, s->w, &on, &oc, &oh, &ow));
#undef CUDA_CONV_TRY
  if (on != d->n || oc != d->k || oh != d->p || ow != d->q) {
    tt_cuda_fail(b, "conv: cuDNN output shape [%d, %d, %d, %d] differs from the desc's [%d, %d, %d, %d]", on, oc, oh, ow,
                 d->n, d->k, d->p, d->q);
    return NULL;
  }
  s->d = *d;
  s->dt = dt;
  s->used = 1;
  s->last_use = ++st->tick;
  return s;
}

/* Math type an algorithm may run with: fp32 with tensor cores (TF32) only when TF32 is on. */
static int cuda_conv_math_ok(tt_backend *b, tt_dtype dt, cudnnMathType_t m) {
  return cuda_conv_16bit(dt) || tt_cuda_st(b)->tf32 || (m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
}

/* Whether an algorithm runs with the math type cuDNN ranked it with (16-bit tensors, and fp32
 * under TF32), or with the base math type (fp32 without TF32: FMA, never tensor cores). */
static int cuda_conv_ranked_math(tt_backend *b, tt_dtype dt) { return cuda_conv_16bit(dt) || tt_cuda_st(b)->tf32; }

/* Chooses the algorithm of direction `which` for slot s among those needing <= limit bytes.
 * Writes *algo, *math, *bytes; 0 on success. */
static int cuda_conv_choose(tt_backend *b, tt_cuda_conv_slot *s, tt_ws_kind which, size_t limit, int *algo,
                            cudnnMathType_t *math, size_t *bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  int nret = 0, i, best = -1, least = -1;
  size_t best_ws = 0, least_ws = 0;
  cudnnMathType_t best_m = CUDNN_DEFAULT_MATH, least_m = CUDNN_DEFAULT_MATH;
  cudnnMathType_t base = cuda_conv_base_math(b, s->dt);
  int ranked = cuda_conv_ranked_math(b, s->dt);
  const cuda_conv_view v = cuda_conv_view_of(&s->d, which);
  cudnnTensorDescriptor_t yd = v.dy_t ? s->yt : s->y; /* dy as cuDNN reads it (cuda_conv_view) */
  cudnnFilterDescriptor_t wd = v.w_nhwc ? s->wn : s->w;
  CUDNN_CHECK(b, cudnnSetConvolutionMathType(s->conv, base));
  if (which == TT_WS_FWD) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDNN_CHECK(b, cudnnGetConvolutionForwardAlgorithm_v7(st->dnn, s->x, wd, s->conv, yd,
                                                          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &nret, perf));
    for (i = 0; i < nret; i++) {
      size_t ws = 0;
      if (perf[i].status != CUDNN_STATUS_SUCCESS || !cuda_conv_math_ok(b, s->dt, perf[i].mathType) ||
          (st->deterministic && perf[i].determinism != CUDNN_DETERMINISTIC))
        continue;
      CUDNN_CHECK(b, cudnnSetConvolutionMathType(s->conv, ranked ? perf[i].mathType : base));
      if (cudnnGetConvolutionForwardWorkspaceSize(st->dnn, s->x, wd, s->conv, yd, perf[i].algo, &ws) !=
          CUDNN_STATUS_SUCCESS)
        continue;
      if (least < 0 || ws < least_ws) least = (int)perf[i].algo, least_ws = ws, least_m = perf[i].mathType;
      if (best < 0 && ws <= limit) best = (int)perf[i].algo, best_ws = ws, best_m = perf[i].mathType;
    }
  } else if (which == TT_WS_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDNN_CHECK(b, cudnnGetConvolutionBackwardDataAlgorithm_v7(st->dnn, wd, yd, s->conv, s->x,
                                                               CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &nret, perf));
    for (i = 0; i < nret; i++) {
      size_t ws = 0;
      if (perf[i].status != CUDNN_STATUS_SUCCESS || !cuda_conv_math_ok(b, s->dt, perf[i].mathType) ||
          (st->deterministic && perf[i].determinism != CUDNN_DETERMINISTIC))
        continue;
      CUDNN_CHECK(b, cudnnSetConvolutionMathType(s->conv, ranked ? perf[i].mathType : base));
      if (cudnnGetConvolutionBackwardDataWorkspaceSize(st->dnn, wd, yd, s->conv, s->x, perf[i].algo, &ws) !=
          CUDNN_STATUS_SUCCESS)
        continue;
      if (least < 0 || ws < least_ws) least = (int)perf[i].algo, least_ws = ws, least_m = perf[i].mathType;
      if (best < 0 && ws <= limit) best = (int)perf[i].algo, best_ws = ws, best_m = perf[i].mathType;
    }
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_CHECK(b, cudnnGetConvolutionBackwardFilterAlgorithm_v7(st->dnn, s->x, yd, s->conv, wd,
                                                                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &nret, perf));
    for (i = 0; i < nret; i++) {
      size_t ws = 0;
      if (perf[i].status != CUDNN_STATUS_SUCCESS || !cuda_conv_math_ok(b, s->dt, perf[i].mathType) ||
          (st->deterministic && perf[i].determinism != CUDNN_DETERMINISTIC))
        continue;
      CUDNN_CHECK(b, cudnnSetConvolutionMathType(s->conv, ranked ? perf[i].mathType : base));
      if (cudnnGetConvolutionBackwardFilterWorkspaceSize(st->dnn, s->x, yd, s->conv, wd, perf[i].algo, &ws) !=
          CUDNN_STATUS_SUCCESS)
        continue;
      if (least < 0 || ws < least_ws) least = (int)perf[i].algo, least_ws = ws, least_m = perf[i].mathType;
      if (best < 0 && ws <= limit) best = (int)perf[i].algo, best_ws = ws, best_m = perf[i].mathType;
    }
  }
  if (best < 0) best = least, best_ws = least_ws, best_m = least_m;
  if (best < 0)
    return tt_cuda_fail(b, "conv: cuDNN has no %s algorithm for n=%d c=%d %dx%d k=%d %dx%d groups=%d (%s)",
                        which == TT_WS_FWD ? "forward" : which == TT_WS_BWD_DATA ? "backward-data" : "backward-filter",
                        s->d.n, s->d.c, s->d.h, s->d.w, s->d.k, s->d.r, s->d.s, s->d.groups,
                        tt_cuda_dtype_name(s->dt));
  *algo = best;
  *math = ranked ? best_m : base;
  *bytes = best_ws;
  return 0;
}

/* Bytes of the filter and of y in dtype dt, each rounded to 256. */
static size_t cuda_conv_wbytes(const tt_conv_desc *d, tt_dtype dt) {
  return cuda_conv_round((size_t)d->k * (d->c / d->groups) * d->r * d->s * tt_dtype_size(dt));
}
static size_t cuda_conv_ybytes(const tt_conv_desc *d, tt_dtype dt) {
  return cuda_conv_round((size_t)d->n * d->k * d->p * d->q * tt_dtype_size(dt));
}

/* Extra bytes the backend itself needs in front of cuDNN's workspace, in this order:
 *   the filter: forward and backward-data, its KRSC copy (cuda_conv_view; none where the stored
 *     filter is KRSC); backward-filter, dw as cuDNN writes it when that is not the fp32 KCRS
 *     gradient itself (16-bit, or KRSC);
 *   dy transposed into x's layout, when the view says so. */
static size_t cuda_conv_extra(const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which) {
  cuda_conv_view v = cuda_conv_view_of(d, which);
  size_t e = 0;
  if (which == TT_WS_BWD_FILTER ? (cuda_conv_16bit(dt) || v.w_nhwc) : v.w_t) e += cuda_conv_wbytes(d, dt);
  if (v.dy_t) e += cuda_conv_ybytes(d, dt);
  return e;
}

/* Slot + algorithm for a run with ws_bytes available; *cudnn_ws receives cuDNN's part. */
static tt_cuda_conv_slot *cuda_conv_prepare(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which,
                                            size_t avail, int *algo, size_t *cudnn_ws) {
  tt_cuda_state *st = tt_cuda_st(b);
  tt_cuda_conv_slot *s = cuda_conv_slot(b, d, dt);
  cudnnMathType_t m;
  cudnnStatus_t e;
  if (!s) return NULL;
  if (!s->have[which]) {
    if (cuda_conv_choose(b, s, which, st->ws_cap, &s->algo[which], &s->math[which], &s->cudnn_ws[which])) return NULL;
    s->have[which] = 1;
  }
  *algo = s->algo[which];
  *cudnn_ws = s->cudnn_ws[which];
  m = s->math[which];
  if (*cudnn_ws > avail) { /* the planned buffer is smaller than what was asked: choose within it */
    if (cuda_conv_choose(b, s, which, avail, algo, &m, cudnn_ws)) return NULL;
    if (*cudnn_ws > avail) {
      tt_cuda_fail(b, "conv: workspace too small: needs %zu bytes, given %zu", *cudnn_ws, avail);
      return NULL;
    }
  }
  e = cudnnSetConvolutionMathType(s->conv, m);
  if (e != CUDNN_STATUS_SUCCESS) {
    tt_cuda_fail(b, "cudnnSetConvolutionMathType failed: %s", cudnnGetErrorString(e));
    return NULL;
  }
  return s;
}

/* ---------------------- cudnnFind*Ex at setup, allocation-free ---------------------------
 * The heuristic ranking (cuda_conv_choose) sized every convolution's planned workspace. At setup,
 * with the arena allocated and nothing of a step live, each (shape, dtype, direction) the programs
 * use is timed by cudnnFind*Ex on operands carved out of the arena's transient region: x, w and y
 * (or dy, dx, dw) at the shape's sizes, filled with a constant (0x3c bytes: finite normal values in
 * fp32, fp16 and bf16, so no algorithm is timed on NaNs or subnormals), and a workspace of exactly
 * the bytes the heuristic choice needs, which the planned buffer holds: cuDNN skips an algorithm
 * needing more (a status other than success, or a memory above the workspace), so whatever it picks
 * runs in the plan. The fastest result that succeeded, within that workspace, with a math type the
 * backend allows (no TF32 unless it is on) and, with TINYTRAIN_CUDA_DETERMINISTIC=1, deterministic,
 * replaces the heuristic choice. cuDNN allocates nothing for the Ex variants (the caller gives every
 * buffer); a shape whose operands do not fit the region keeps the heuristic choice. */
typedef struct cuda_conv_found {
  cudnnStatus_t status;
  int algo;
  float time;
  size_t memory;
  cudnnDeterminism_t det;
  cudnnMathType_t math;
} cuda_conv_found;

template <typename Perf>
static int cuda_conv_found_copy(const Perf *perf, int n, cuda_conv_found *out) {
  for (int i = 0; i < n; i++) {
    out[i].status = perf[i].status, out[i].algo = (int)perf[i].algo, out[i].time = perf[i].time;
    out[i].memory = perf[i].memory, out[i].det = perf[i].determinism, out[i].math = perf[i].mathType;
  }
  return n;
}

/* extra: the call's own front part of its workspace (cuda_conv_extra of its desc). */
static int cuda_conv_find_one(tt_backend *b, tt_cuda_conv_slot *s, tt_ws_kind which, size_t planned, size_t extra, char *scratch,
                              size_t scratch_bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  const tt_conv_desc *d = &s->d;
  size_t es = tt_dtype_size(s->dt);
  size_t xb = cuda_conv_round((size_t)d->n * d->c * d->h * d->w * es);
  size_t wb = cuda_conv_round((size_t)d->k * (d->c / d->groups) * d->r * d->s * es);
  size_t yb = cuda_conv_round((size_t)d->n * d->k * d->p * d->q * es);
  size_t off = 0, i;
  /* cuDNN's part of the planned workspace: the largest buffer the plan gives a step's calls, less
   * this call's own front part (not only the heuristic choice's bytes: Find may pick one needing
   * more, which the planned buffer still holds); at least the heuristic choice's */
  size_t limit = planned > extra ? (planned - extra) & ~(size_t)255u : 0;
  if (limit < s->cudnn_ws[which]) limit = s->cudnn_ws[which];
  cuda_conv_found found[16];
  int n = 0, best = -1;
  char *x, *w, *y, *ws;
  cudnnMathType_t base = cuda_conv_base_math(b, s->dt);
  const cuda_conv_view v = cuda_conv_view_of(&s->d, which);
  cudnnTensorDescriptor_t yd = v.dy_t ? s->yt : s->y; /* dy as cuDNN reads it (cuda_conv_view) */
  cudnnFilterDescriptor_t wd = v.w_nhwc ? s->wn : s->w;
  if (xb + wb + yb + cuda_conv_round(limit) > scratch_bytes) /* the workspace the scratch leaves, if that is enough */
    limit = scratch_bytes > xb + wb + yb + 256 ? (scratch_bytes - xb - wb - yb - 256) & ~(size_t)255u : 0;
  if (limit < s->cudnn_ws[which]) return 0; /* keeps the heuristic choice */
  x = scratch + off, off += xb;
  w = scratch + off, off += wb;
  y = scratch + off, off += yb;
  ws = limit ? scratch + off : NULL;
  CUDA_CHECK(b, cudaMemsetAsync(scratch, 0x3c, xb + wb + yb, st->compute));
  CUDNN_CHECK(b, cudnnSetConvolutionMathType(s->conv, base));
  if (which == TT_WS_FWD) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDNN_CHECK(b, cudnnFindConvolutionForwardAlgorithmEx(st->dnn, s->x, x, wd, w, s->conv, yd, y,
                                                          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf, ws, limit));
    n = cuda_conv_found_copy(perf, n, found);
  } else if (which == TT_WS_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDNN_CHECK(b, cudnnFindConvolutionBackwardDataAlgorithmEx(st->dnn, wd, w, yd, y, s->conv, s->x, x,
                                                               CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf, ws, limit));
    n = cuda_conv_found_copy(perf, n, found);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_CHECK(b, cudnnFindConvolutionBackwardFilterAlgorithmEx(st->dnn, s->x, x, yd, y, s->conv, wd, w,
                                                                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf, ws,
                                                                 limit));
    n = cuda_conv_found_copy(perf, n, found);
  }
  for (i = 0; i < (size_t)n; i++) { /* cuDNN sorts by time; take the least time that qualifies all the same */
    const cuda_conv_found *f = &found[i];
    if (f->status != CUDNN_STATUS_SUCCESS || f->memory > limit || f->time < 0.0f || !cuda_conv_math_ok(b, s->dt, f->math) ||
        (st->deterministic && f->det != CUDNN_DETERMINISTIC))
      continue;
    if (best < 0 || f->time < found[best].time) best = (int)i;
  }
  if (best < 0) return 0;
  s->algo[which] = found[best].algo;
  s->math[which] = cuda_conv_ranked_math(b, s->dt) ? found[best].math : base;
  s->cudnn_ws[which] = found[best].memory;
  st->conv_found++;
  return 0;
}

/* ---------------------- TINYTRAIN_CUDA_CONV_LOG -----------------------------------------
 * One stderr line per (shape, dtype, direction) at setup, once its algorithm is final: the API
 * (the legacy one, cudnnConvolution*), the algorithm (cuDNN's enum value and name), the math type
 * it runs with, its cuDNN workspace against the planned one, and how it was chosen with the time
 * that took (cudnnFind*Ex over the arena's transient region, or the heuristic ranking). What the
 * lease needs to see which engines the convolutions got without a profiler (issue 41). */
static const char *cuda_conv_algo_name(tt_ws_kind which, int a) {
  static const char *const fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
                                    "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char *const bwd_data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char *const bwd_filter[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  if (a < 0) return "?";
  if (which == TT_WS_FWD) return a < 8 ? fwd[a] : "?";
  if (which == TT_WS_BWD_DATA) return a < 6 ? bwd_data[a] : "?";
  return a < 7 ? bwd_filter[a] : "?";
}

static const char *cuda_conv_math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "DEFAULT_MATH";
    case CUDNN_TENSOR_OP_MATH: return "TENSOR_OP_MATH";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "TENSOR_OP_MATH_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH: return "FMA_MATH";
    default: return "?";
  }
}

static double cuda_conv_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* The line for slot s's direction `which`; how: what chose the algorithm; planned: the cuDNN
 * workspace the plan holds for it (the heuristic choice's); ms: the time choosing took. */
static void cuda_conv_log(tt_backend *b, const tt_cuda_conv_slot *s, tt_ws_kind which, const char *how, size_t planned, double ms) {
  static const char *const dir[] = {"fwd", "bwd-data", "bwd-filter"};
  const tt_conv_desc *d = &s->d;
  fprintf(stderr,
          "TINYTRAIN_CUDA_CONV_LOG: %-10s %s n%d c%d %dx%d -> k%d %dx%d, filter %dx%d stride %d,%d pad %d,%d groups %d, %s->%s: "
          "legacy API (cudnnConvolution*%s), algo %d %s, math %s, workspace %zu bytes (planned %zu), %s, %.1f ms\n",
          dir[which], tt_dtype_name(s->dt), d->n, d->c, d->h, d->w, d->k, d->p, d->q, d->r, d->s, d->stride_h,
          d->stride_w, d->pad_h, d->pad_w, d->groups, d->layout_x == TT_LAYOUT_NHWC ? "NHWC" : "NCHW",
          d->layout_y == TT_LAYOUT_NHWC ? "NHWC" : "NCHW",
          tt_cuda_st(b)->knobs.cuda_conv_api != TT_CUDA_CONV_API_LEGACY && d->layout_x == TT_LAYOUT_NHWC &&
                  d->layout_y == TT_LAYOUT_NHWC
              ? "; the graph API offered no engine for this shape"
              : "",
          s->algo[which], cuda_conv_algo_name(which, s->algo[which]),
          cuda_conv_math_name(s->math[which]), s->cudnn_ws[which], planned, how, ms);
}

int tt_cuda_conv_find(tt_backend *b, const tt_op_desc *ops, int nops, void *scratch, size_t scratch_bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  int i, j, algo;
  size_t need, planned = 0;
  st->conv_found = 0;
  /* TINYTRAIN_CUDA_FIND=0, the documented off switch: the heuristic choices stay (and are logged) */
  if (!st->knobs.cuda_find && !st->knobs.cuda_conv_log) return 0;
  if (nops < 0 || (nops && !ops)) return tt_cuda_fail(b, "tune: %d calls at %p", nops, (const void *)ops);
  if (!scratch) scratch_bytes = 0;
  if (tt_cuda_conv_graph_tune(b, ops, nops, scratch, scratch_bytes)) return -1;
  for (i = 0; i < nops; i++) { /* the planned workspace: the largest any call asked for (backend.h) */
    size_t w = b->op_workspace(b, &ops[i]);
    if (w != TT_WS_ERROR && w > planned) planned = w;
  }
  for (i = 0; i < nops; i++) {
    const tt_op_desc *o = &ops[i];
    tt_ws_kind which;
    tt_cuda_conv_slot *s;
    tt_cuda_conv_graph *g = NULL;
    int seen = 0;
    if (o->kind != TT_OP_CONV_FWD && o->kind != TT_OP_CONV_BWD_DATA && o->kind != TT_OP_CONV_BWD_FILTER) continue;
    if (tt_cuda_conv_graph_get(b, &o->u.conv, o->dt, (tt_ws_kind)(o->kind - TT_OP_CONV_FWD), o->accumulate, &g)) return -1;
    if (g) continue; /* the graph API's (timed above) */
    for (j = 0; j < i && !seen; j++) /* calls repeat (the same shape in many blocks): time each once */
      seen = ops[j].kind == o->kind && ops[j].dt == o->dt && cuda_conv_same(&ops[j].u.conv, &o->u.conv);
    if (seen) continue;
    which = (tt_ws_kind)(o->kind - TT_OP_CONV_FWD);
    if (cuda_conv_check(b, "tune", &o->u.conv, o->dt)) return -1;
    /* the slot and the heuristic choice the plan sized the workspace with */
    double t0 = cuda_conv_ms();
    if (!(s = cuda_conv_prepare(b, &o->u.conv, o->dt, which, (size_t)-1, &algo, &need))) return -1;
    int found = st->conv_found;
    if (st->knobs.cuda_find &&
        cuda_conv_find_one(b, s, which, planned, cuda_conv_extra(&o->u.conv, o->dt, which), (char *)scratch, scratch_bytes))
      return -1;
    if (st->knobs.cuda_conv_log) {
      if (st->knobs.cuda_find) CUDA_CHECK(b, cudaStreamSynchronize(st->compute)); /* the time Find took, whole */
      cuda_conv_log(b, s, which, !st->knobs.cuda_find ? "heuristic ranking (TINYTRAIN_CUDA_FIND=0)"
                              : st->conv_found > found ? "timed by cudnnFind*Ex within the planned workspace"
                                                       : "heuristic ranking (Find timed nothing within the workspace, or the operands did not fit its scratch)",
                    need, cuda_conv_ms() - t0);
    }
  }
  CUDA_CHECK(b, cudaStreamSynchronize(st->compute)); /* the scratch's fill and cuDNN's runs are done */
  return 0;
}

/* The planned workspace of a call (acc: backward-data adds into dx); TT_WS_ERROR on a failure. */
static size_t cuda_conv_ws(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which, int acc) {
  int algo;
  size_t ws = 0;
  tt_cuda_conv_graph *g = NULL;
  /* a failure is TT_WS_ERROR with the reason recorded, never 0 (backend.h) */
  if (cuda_conv_check(b, "conv_workspace", d, dt)) return TT_WS_ERROR;
  if (which != TT_WS_FWD && which != TT_WS_BWD_DATA && which != TT_WS_BWD_FILTER)
    return tt_cuda_fail(b, "conv_workspace: unknown workspace kind %d", (int)which), TT_WS_ERROR;
  if (tt_cuda_conv_graph_get(b, d, dt, which, acc, &g)) return TT_WS_ERROR;
  if (g) return tt_cuda_conv_graph_workspace(g, which != TT_WS_BWD_FILTER && d->layout_w == TT_FILTER_KRSC); /* room for every candidate tune may pick */
  if (!cuda_conv_prepare(b, d, dt, which, (size_t)-1, &algo, &ws)) return TT_WS_ERROR;
  return ws ? cuda_conv_round(ws) + cuda_conv_extra(d, dt, which) : cuda_conv_extra(d, dt, which);
}

size_t tt_cuda_conv_workspace(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which) {
  size_t a = cuda_conv_ws(b, d, dt, which, 0), c;
  if (a == TT_WS_ERROR || which != TT_WS_BWD_DATA) return a;
  c = cuda_conv_ws(b, d, dt, which, 1); /* either beta: a graph is built for one */
  return c == TT_WS_ERROR ? c : a > c ? a : c;
}

size_t tt_cuda_conv_op_workspace(tt_backend *b, const tt_op_desc *op) {
  return cuda_conv_ws(b, &op->u.conv, op->dt, (tt_ws_kind)(op->kind - TT_OP_CONV_FWD), op->accumulate);
}

int tt_cuda_conv_prepare(tt_backend *b, const tt_op_desc *ops, int nops) {
  for (int i = 0; i < nops; i++)
    if ((ops[i].kind == TT_OP_CONV_FWD || ops[i].kind == TT_OP_CONV_BWD_DATA || ops[i].kind == TT_OP_CONV_BWD_FILTER) &&
        tt_cuda_conv_op_workspace(b, &ops[i]) == TT_WS_ERROR)
      return -1;
  return 0;
}

/* The KRSC copy of w [k, c/g, r, s] into wt (cuda_conv_view's w_t). */
static int cuda_conv_w_nhwc(tt_backend *b, const char *op, const tt_conv_desc *d, tt_dtype dt, const void *w, void *wt) {
  return tt_cuda_transpose(b, op, d->k, d->c / d->groups, d->r * d->s, dt, w, dt, wt, 0.0f);
}
/* dy in the other layout into dyt: [n, k, pq] <-> [n, pq, k]. */
static int cuda_conv_dy_t(tt_backend *b, const char *op, const tt_conv_desc *d, tt_dtype dt, const void *dy, void *dyt) {
  if (d->layout_y == TT_LAYOUT_NHWC) return tt_cuda_transpose(b, op, d->n, d->p * d->q, d->k, dt, dy, dt, dyt, 0.0f);
  return tt_cuda_transpose(b, op, d->n, d->k, d->p * d->q, dt, dy, dt, dyt, 0.0f);
}

int tt_cuda_conv_fwd(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *x, const void *w,
                     const void *bias, void *y, void *ws, size_t ws_bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  tt_cuda_conv_slot *s;
  int algo;
  size_t need, extra = cuda_conv_extra(d, dt, TT_WS_FWD);
  float one = 1.0f, zero = 0.0f;
  cuda_conv_view v;
  if (cuda_conv_check(b, "conv_fwd", d, dt)) return -1;
  if (!x || !w || !y) return tt_cuda_fail(b, "conv_fwd: NULL x, w or y");
  if (!ws) ws_bytes = 0;
  tt_cuda_conv_graph *g = NULL;
  if (tt_cuda_conv_graph_get(b, d, dt, TT_WS_FWD, 0, &g)) return -1;
  if (g) { /* all-NHWC through the graph API; the bias below as on the legacy path */
    if (tt_cuda_conv_graph_run(b, g, "conv_fwd", x, w, y, 0.0f, d->layout_w == TT_FILTER_KRSC, ws, ws_bytes)) return -1;
    return bias ? tt_cuda_add_bias(b, "conv_fwd", d->n * d->p * d->q, d->k, 1, dt, bias, y) : 0;
  }
  if (ws_bytes < extra)
    return tt_cuda_fail(b, "conv_fwd: workspace too small: needs at least %zu bytes, given %zu", extra, ws_bytes);
  v = cuda_conv_view_of(d, TT_WS_FWD);
  s = cuda_conv_prepare(b, d, dt, TT_WS_FWD, ws_bytes - extra, &algo, &need);
  if (!s) return -1;
  if (v.w_t) { /* workspace: [KRSC filter | cuDNN's] (a stored KRSC filter is read in place) */
    if (cuda_conv_w_nhwc(b, "conv_fwd", d, dt, w, ws)) return -1;
    w = ws;
  }
  CUDNN_CHECK(b, cudnnConvolutionForward(st->dnn, &one, s->x, x, v.w_nhwc ? s->wn : s->w, w, s->conv,
                                         (cudnnConvolutionFwdAlgo_t)algo, need ? (char *)ws + extra : NULL, need, &zero,
                                         s->y, y));
  /* NHWC y: the bias is per channel of [n*p*q, k, 1] (channels fastest) */
  if (bias && d->layout_y == TT_LAYOUT_NHWC) return tt_cuda_add_bias(b, "conv_fwd", d->n * d->p * d->q, d->k, 1, dt, bias, y);
  if (bias) return tt_cuda_add_bias(b, "conv_fwd", d->n, d->k, (size_t)d->p * d->q, dt, bias, y);
  return 0;
}

int tt_cuda_conv_bwd_data(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *dy, const void *w,
                          void *dx, float beta, void *ws, size_t ws_bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  tt_cuda_conv_slot *s;
  int algo;
  size_t need, extra = cuda_conv_extra(d, dt, TT_WS_BWD_DATA);
  float one = 1.0f;
  char *at;
  cuda_conv_view v;
  if (cuda_conv_check(b, "conv_bwd_data", d, dt)) return -1;
  if (!dy || !w || !dx) return tt_cuda_fail(b, "conv_bwd_data: NULL dy, w or dx");
  if (!ws) ws_bytes = 0;
  tt_cuda_conv_graph *g = NULL;
  if (tt_cuda_conv_graph_get(b, d, dt, TT_WS_BWD_DATA, beta != 0.0f, &g)) return -1;
  if (g) return tt_cuda_conv_graph_run(b, g, "conv_bwd_data", dy, w, dx, beta, d->layout_w == TT_FILTER_KRSC, ws, ws_bytes);
  if (ws_bytes < extra)
    return tt_cuda_fail(b, "conv_bwd_data: workspace too small: needs at least %zu bytes, given %zu", extra, ws_bytes);
  v = cuda_conv_view_of(d, TT_WS_BWD_DATA);
  s = cuda_conv_prepare(b, d, dt, TT_WS_BWD_DATA, ws_bytes - extra, &algo, &need);
  if (!s) return -1;
  at = (char *)ws; /* workspace: [KRSC filter][dy transposed] | cuDNN's (a stored KRSC filter is read in place) */
  if (v.w_t) {
    if (cuda_conv_w_nhwc(b, "conv_bwd_data", d, dt, w, at)) return -1;
    w = at, at += cuda_conv_wbytes(d, dt);
  }
  if (v.dy_t) {
    if (cuda_conv_dy_t(b, "conv_bwd_data", d, dt, dy, at)) return -1;
    dy = at;
  }
  CUDNN_CHECK(b, cudnnConvolutionBackwardData(st->dnn, &one, v.w_nhwc ? s->wn : s->w, w, v.dy_t ? s->yt : s->y, dy,
                                              s->conv, (cudnnConvolutionBwdDataAlgo_t)algo,
                                              need ? (char *)ws + extra : NULL, need, &beta, s->x, dx));
  return 0;
}

int tt_cuda_conv_bwd_filter(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *x, const void *dy,
                            float *dw, float *db, float beta, void *ws, size_t ws_bytes) {
  tt_cuda_state *st = tt_cuda_st(b);
  tt_cuda_conv_slot *s;
  int algo;
  size_t need, extra = cuda_conv_extra(d, dt, TT_WS_BWD_FILTER);
  float one = 1.0f, zero = 0.0f;
  const void *dyc = dy;
  char *dwt = NULL;
  cuda_conv_view v;
  if (cuda_conv_check(b, "conv_bwd_filter", d, dt)) return -1;
  if (!x || !dy || !dw) return tt_cuda_fail(b, "conv_bwd_filter: NULL x, dy or dw");
  if (!ws) ws_bytes = 0;
  tt_cuda_conv_graph *g = NULL;
  if (tt_cuda_conv_graph_get(b, d, dt, TT_WS_BWD_FILTER, 0, &g)) return -1;
  if (g) { /* all-NHWC through the graph API; the bias gradient below as on the legacy path */
    if (tt_cuda_conv_graph_run(b, g, "conv_bwd_filter", x, dy, dw, beta, 0, ws, ws_bytes)) return -1;
    return db ? tt_cuda_channel_sum(b, "conv_bwd_filter", d->n * d->p * d->q, d->k, 1, dt, dy, db, beta) : 0;
  }
  if (ws_bytes < extra)
    return tt_cuda_fail(b, "conv_bwd_filter: workspace too small: needs at least %zu bytes, given %zu", extra, ws_bytes);
  v = cuda_conv_view_of(d, TT_WS_BWD_FILTER);
  s = cuda_conv_prepare(b, d, dt, TT_WS_BWD_FILTER, ws_bytes - extra, &algo, &need);
  if (!s) return -1;
  /* workspace: [dw as cuDNN writes it: dt, KCRS or KRSC][dy transposed] | cuDNN's */
  if (cuda_conv_16bit(dt) || v.w_nhwc) dwt = (char *)ws;
  if (v.dy_t) {
    char *at = (char *)ws + (dwt ? cuda_conv_wbytes(d, dt) : 0);
    if (cuda_conv_dy_t(b, "conv_bwd_filter", d, dt, dy, at)) return -1;
    dyc = at;
  }
  if (!dwt) { /* fp32, KCRS: cuDNN accumulates into dw itself */
    CUDNN_CHECK(b, cudnnConvolutionBackwardFilter(st->dnn, &one, s->x, x, v.dy_t ? s->yt : s->y, dyc, s->conv,
                                                  (cudnnConvolutionBwdFilterAlgo_t)algo, need ? (char *)ws + extra : NULL,
                                                  need, &beta, s->w, dw));
  } else {
    /* cuDNN writes dw in the tensor dtype (fp16, bf16 or fp32) and filter format into the front
     * of the workspace; it is accumulated into the fp32 KCRS dw (transposed back from KRSC). */
    size_t wcount = (size_t)d->k * (d->c / d->groups) * d->r * d->s;
    CUDNN_CHECK(b, cudnnConvolutionBackwardFilter(st->dnn, &one, s->x, x, v.dy_t ? s->yt : s->y, dyc, s->conv,
                                                  (cudnnConvolutionBwdFilterAlgo_t)algo, need ? (char *)ws + extra : NULL,
                                                  need, &zero, v.w_nhwc ? s->wn : s->w, dwt));
    if (v.w_nhwc) {
      if (tt_cuda_transpose(b, "conv_bwd_filter", d->k, d->r * d->s, d->c / d->groups, dt, dwt, TT_F32, dw, beta)) return -1;
    } else if (tt_cuda_accum_to_f32(b, "conv_bwd_filter", wcount, dt, dwt, dw, beta)) {
      return -1;
    }
  }
  if (db && d->layout_y == TT_LAYOUT_NHWC) /* dy [n*p*q, k, 1] */
    return tt_cuda_channel_sum(b, "conv_bwd_filter", d->n * d->p * d->q, d->k, 1, dt, dy, db, beta);
  if (db) return tt_cuda_channel_sum(b, "conv_bwd_filter", d->n, d->k, (size_t)d->p * d->q, dt, dy, db, beta);
  return 0;
}
