/* kernels/backend.h — the narrow table that execution calls.
 *
 * Kernels know raw pointers, shapes, dtypes and (on CUDA) a stream; never graphs.
 * Layout is NCHW everywhere, except where a conv or pool desc names another (tt_layout below),
 * which only a backend that lists that layout in its `layouts` field (or, for fp16/bf16
 * programs, in `layouts_16bit`) is ever given. "Activation" tensors (x, y, dx, dy) and conv/linear weight
 * copies are in the op's dtype `dt` (fp32 or fp16). Everything that must stay exact is fp32:
 * parameter gradients (dw, db), batch-norm parameters, running and saved statistics,
 * optimizer state, loss and metrics.
 *
 * `beta` on a gradient output: 0 overwrites it, 1 adds into it. Fan-out in the graph
 * (residual connections) and accumulation over micro-batches both use beta = 1.
 *
 * Every function returns 0 on success and non-zero on failure (the backend records a
 * message retrievable with last_error). Workspace: the planner asks *_workspace() for the
 * bytes an op needs and gives the op a planned buffer of at least that size; the op never
 * allocates. A query that cannot answer (a bad shape, a library failure) returns TT_WS_ERROR
 * with the reason in last_error; never a size, since 0 would plan no workspace at all.
 */
#ifndef TT_BACKEND_H
#define TT_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* TT_BF16: bfloat16 (the high half of an fp32; fp32 -> bf16 rounds to nearest even). A backend
 * that does not compute in a dtype fails the call with a message naming it. */
typedef enum { TT_F32 = 0, TT_F16 = 1, TT_BF16 = 2 } tt_dtype;

static inline size_t tt_dtype_size(tt_dtype dt) { return dt == TT_F32 ? 4u : 2u; }
/* A dtype's name for messages and reports ("fp32", "fp16", "bf16"; NULL outside tt_dtype). */
static inline const char *tt_dtype_name(tt_dtype dt) {
  return dt == TT_F32 ? "fp32" : dt == TT_F16 ? "fp16" : dt == TT_BF16 ? "bf16" : NULL;
}

/* IEEE half <-> float, round to nearest even; used by the CPU backend and by tests. */
uint16_t tt_f32_to_f16(float f);
float tt_f16_to_f32(uint16_t h);

/* The memory order of a 4-D activation tensor of logical shape [n, c, h, w] (and of its
 * gradient, which always shares it). NCHW (0) is every backend's and the default of every
 * zeroed desc; NHWC (channels-last, [n, h, w, c], no padding) is what the oneDNN backend's
 * convolutions run on without reordering (kernels/cpu/cpu_conv.c says why NHWC and not the
 * padded nChw16c). NCHW16C (oneDNN's nChw16c: [n, c/16, h, w, 16], channel 16*b + l of pixel
 * (y, x) at ((n*(c/16) + b)*h*w + y*w + x)*16 + l) only where c is a multiple of 16, so it has no
 * padding either: what oneDNN's AVX-512 Winograd convolutions read (fp32). Weights are never
 * reordered by a layout: always PyTorch's [k, c/g, r, s], except a 16-bit weight copy the planner
 * stores KRSC (tt_filter_layout below). */
typedef enum { TT_LAYOUT_NCHW = 0, TT_LAYOUT_NHWC = 1, TT_LAYOUT_NCHW16C = 2 } tt_layout;
/* The memory order of a convolution filter of logical shape [k, c/g, r, s]: KCRS (0) is PyTorch's
 * and every master weight's; KRSC ([k, r, s, c/g], channels fastest) is what cuDNN's channels-last
 * kernels read, and only a 16-bit weight copy is ever stored so (tt_conv_desc.layout_w). */
typedef enum { TT_FILTER_KCRS = 0, TT_FILTER_KRSC = 1 } tt_filter_layout;
static inline const char *tt_layout_name(int l) {
  return l == TT_LAYOUT_NHWC ? "NHWC" : l == TT_LAYOUT_NCHW ? "NCHW" : l == TT_LAYOUT_NCHW16C ? "nChw16c" : "?";
}

typedef struct tt_conv_desc {
  int n, c, h, w;      /* input  x: [n, c, h, w]            */
  int k, r, s;         /* filter w: [k, c/groups, r, s]     */
  int stride_h, stride_w, pad_h, pad_w, groups;
  int p, q;            /* output y: [n, k, p, q]            */
  int layout_x, layout_y; /* tt_layout of x/dx and of y/dy (0: NCHW); a convolution is where the
                        * layout may change (the network input is NCHW, its first conv's y NHWC) */
  int layout_w;        /* tt_filter_layout of w as forward and backward-data read it (0: KCRS). KRSC
                        * only on a backend whose filter_krsc is 1, only with x and y NHWC, and only
                        * for a 16-bit weight copy the cast wrote so (tt_cast_seg.rs); backward-filter
                        * ignores it (dw is always the fp32 KCRS gradient) */
} tt_conv_desc;

typedef struct tt_pool_desc {
  int n, c, h, w;      /* input  x: [n, c, h, w]            */
  int kh, kw, stride_h, stride_w, pad_h, pad_w;
  int p, q;            /* output y: [n, c, p, q]            */
  int layout;          /* tt_layout of x, y, dx and dy (0: NCHW). Global average pooling over an
                        * NHWC tensor is an average pool with the whole h x w window. */
  int y_nchw;          /* 1: y and dy are NCHW while x and dx are `layout` NHWC (the layout changes
                        * inside the pooling: pool_fwd and pool_bwd through their workspace; pool_argmax
                        * ignores it, its winners are NHWC as x; pool_bwd_idx reads dy NCHW, fp32 and
                        * bf16), only on a backend whose pool_y_nchw is 1; 0: y and dy are `layout` too */
} tt_pool_desc;

/* GELU as PyTorch names its two forms: "none" (exact, erf) and "tanh" (the approximation). */
typedef enum { TT_ACT_RELU = 0, TT_ACT_RELU6 = 1, TT_ACT_SILU = 2, TT_ACT_GELU_ERF = 3, TT_ACT_GELU_TANH = 4 } tt_act;
typedef enum { TT_POOL_MAX = 0, TT_POOL_AVG = 1 } tt_pool_mode;
typedef enum { TT_WS_FWD = 0, TT_WS_BWD_DATA = 1, TT_WS_BWD_FILTER = 2 } tt_ws_kind;

/* What a failed *_workspace query returns (see above). */
#define TT_WS_ERROR ((size_t)-1)

/* ---- set-up: the calls a Program makes, described by shape ----
 * Lowering asks op_workspace() for every backend call a step will make (kind, dtype, shapes
 * at the planned batch) and gives the step a planned workspace of the largest answer; the
 * executor hands the calls of all its Programs to prepare() once, before the first step, so a
 * backend builds what it needs (oneDNN primitives, cuDNN algorithm choices) outside the step
 * loop. A call whose shape was never prepared still works: the backend may prepare it then
 * (and allocate doing so), which the executor never lets happen. */
typedef enum {
  TT_OP_CONV_FWD = 0,
  TT_OP_CONV_BWD_DATA,
  TT_OP_CONV_BWD_FILTER,
  TT_OP_LINEAR_FWD,
  TT_OP_LINEAR_BWD_DATA,
  TT_OP_LINEAR_BWD_FILTER,
  TT_OP_BN_FWD_TRAIN,
  TT_OP_BN_FWD_INFER,
  TT_OP_BN_BWD,
  TT_OP_POOL_FWD,
  TT_OP_POOL_BWD,
  TT_OP_ACT_FWD,
  TT_OP_ACT_BWD,
  TT_OP_LN_FWD,   /* transformer ops (see "transformer ops" below) */
  TT_OP_LN_BWD,
  TT_OP_ATTN_FWD,
  TT_OP_ATTN_BWD,
  TT_OP_KIND_COUNT
} tt_op_kind;

typedef struct tt_linear_desc { int n, in, out; } tt_linear_desc; /* x [n, in], w [out, in], y [n, out] */
/* x [n, c, hw]; blk 16: x is [n, c/16, hw, 16] (TT_LAYOUT_NCHW16C), run by bn_blk only */
typedef struct tt_bn_desc { int n, c, hw; float eps; int blk; } tt_bn_desc;
typedef struct tt_act_desc { size_t count; tt_act act; } tt_act_desc;
typedef struct tt_ln_desc { int rows, f; float eps; } tt_ln_desc; /* x [rows, f] */
/* Scaled dot-product attention over a fused QKV tensor (the layout of PyTorch's
 * nn.MultiheadAttention in_proj output):
 *   qkv [n, t, 3, heads, d]  (per token: q for all heads, then k, then v; f = heads*d)
 *   o   [n, t, heads, d]     (o = softmax(scale * q k^T [+ causal mask]) v, per sample and head)
 *   lse [n, heads, t] fp32   (per query row: max + log(sum exp) of the scaled scores: all that
 *                             backward needs to rebuild the probabilities, flash-style)
 *   probs [n, heads, t, t]   (optional, dt: the softmax probabilities before dropout)
 * causal: key j > query i is masked out. p: dropout on the probabilities (training only): the
 * probability at flat index ((s*heads + h)*t + i)*t + j of [n, heads, t, t] is kept iff
 * tt_dropout_hash(seed, that index) passes, as the dropout op decides (kernel_math.h). */
typedef struct tt_attn_desc { int n, t, heads, d, causal; float scale, p; } tt_attn_desc;

/* One backend call. Zero the whole struct before filling it (backends compare descs bytewise). */
typedef struct tt_op_desc {
  tt_op_kind kind;
  tt_dtype dt;
  int bias;       /* conv/linear: forward adds a bias; backward-filter computes its gradient */
  int accumulate; /* backward-data, bn, pool and act backward: dx is added into (beta != 0) */
  tt_pool_mode pool_mode;
  union {
    tt_conv_desc conv;
    tt_pool_desc pool;
    tt_linear_desc linear;
    tt_bn_desc bn;
    tt_act_desc act;
    tt_ln_desc ln;
    tt_attn_desc attn;
  } u;
} tt_op_desc;

/* Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_(params, max_norm) after
 * the loss scale is taken out: the updates read the sum of squares of the accumulated gradients
 * from the device (sum_squares wrote it earlier in the same stream order, so the host never waits
 * for it) and use the gradient g * grad_scale * coef with
 *   norm = sqrt(*sumsq) * grad_scale,  coef = min(1, max_norm / (norm + 1e-6))
 * (tt_clip_grad_scale in kernel_math.h). Passed by the host, read at the call. */
typedef struct tt_clip {
  const float *sumsq; /* device (arena) fp32: the sum of squares of every raw gradient accumulator */
  float max_norm;     /* > 0 */
} tt_clip;

/* How an optimizer's state (SGD's momentum, Adam's m and v) is held ([train] optimizer_state):
 * F32: count floats. BF16: count bf16 values (round to nearest even on store). INT8: blockwise
 * dynamic quantization, blocks of TT_STATE_BLOCK values in index order (the last one short): the
 * count one-byte codes, zero padding to a 4-byte boundary, then one fp32 scale per block (the
 * block's largest magnitude after the update; 0 for an all-zero block). The first moment and
 * momentum (signed) are int8 codes c in [-127, 127] of sqrt(|x| / scale): x = sign(c) (c/127)^2
 * scale. Adam's second moment (never negative) is uint8 codes c in [0, 255] of (v / scale)^(1/4):
 * v = (c/255)^4 scale. The square-root companding keeps relative precision across the block's
 * range where a linear absmax code flushes everything below scale/254 to zero; for v it is linear
 * in sqrt(v), the quantity the update divides by, and its smallest non-zero value is
 * scale/255^4 (about 2e-10 of the block's largest), so a small v never turns into a zero
 * denominator while its m is not zero. kernel_math.h (tt_state_*) holds the coding, once. */
typedef enum { TT_STATE_F32 = 0, TT_STATE_BF16 = 1, TT_STATE_INT8 = 2 } tt_state_fmt;
#define TT_STATE_BLOCK 2048 /* values per int8 block (8 KiB of fp32 state): one fp32 scale each */
static inline size_t tt_state_blocks(size_t count) { return (count + TT_STATE_BLOCK - 1) / TT_STATE_BLOCK; }
/* Bytes of the int8 codes of count values with their padding: where the scales start. */
static inline size_t tt_state_codes_bytes(size_t count) { return (count + 3u) / 4u * 4u; }
/* Bytes of count values of state held as f. */
static inline size_t tt_state_bytes(tt_state_fmt f, size_t count) {
  return f == TT_STATE_INT8 ? tt_state_codes_bytes(count) + 4u * tt_state_blocks(count)
                            : count * (f == TT_STATE_BF16 ? 2u : 4u);
}
static inline const char *tt_state_fmt_name(tt_state_fmt f) {
  return f == TT_STATE_F32 ? "fp32" : f == TT_STATE_BF16 ? "bf16" : f == TT_STATE_INT8 ? "int8" : NULL;
}

/* One parameter tensor of a many-tensor optimizer update (sgd_update_multi, adam_update_multi,
 * sgd_update_held, adam_update_held): count fp32 values at w, its gradient g, its state m (NULL
 * for SGD without momentum) and v (Adam), held as `state` says (tt_state_fmt; the *_multi entries
 * take TT_STATE_F32 only: fp32 floats); decay 0 updates it with weight decay 0 ([train] decay
 * leaves it out), 1 with the call's. */
typedef struct tt_update_seg {
  float *w;
  const float *g;
  void *m, *v;
  size_t count;
  int decay;
  int state; /* tt_state_fmt of m and v; 0 (fp32) in a zeroed seg */
} tt_update_seg;

/* One tensor of cast_multi: count elements from src (src_dt) to dst (dst_dt). rs == 0 (a zeroed
 * seg): element i into element i. rs > 0: src is a KCRS filter [k, cg, rs] (cg = count / (k*rs),
 * which must divide exactly) and dst is written KRSC [k, rs, cg]: dst[(i*rs + j)*cg + l] is
 * src[(i*cg + l)*rs + j] converted as cast converts it (tt_filter_layout; the 16-bit weight copy
 * of an all-NHWC convolution, so that no convolution call transposes its filter). */
typedef struct tt_cast_seg {
  const void *src;
  void *dst;
  size_t count;
  int k, rs; /* the KRSC transpose's filters and taps per filter (r*s); rs 0: none */
} tt_cast_seg;

/* One tensor of check_finite_multi: count values of the call's dtype at x. */
typedef struct tt_finite_seg {
  const void *x;
  size_t count;
} tt_finite_seg;

/* What a backend's creation takes from the knobs (core/base/knobs.c reads every TINYTRAIN_*
 * variable once and hands these down; kernels/ reads no environment). tt_backend_knobs_default
 * gives what a backend does when nobody sets anything. */
typedef struct tt_backend_knobs {
  int layout;             /* TINYTRAIN_LAYOUT: -1 the backend's default (CPU: NHWC between convolutions;
                           * CUDA: NCHW for 16-bit), else TT_LAYOUT_NCHW or TT_LAYOUT_NHWC */
  size_t cpu_chunk_bytes; /* TINYTRAIN_CPU_CHUNK_BYTES: the CPU's chunk of a batched loop; 0 its default */
  int conv_matmul;        /* TINYTRAIN_CONV_MATMUL: 1 (default) 1x1 bf16 NHWC backward convolutions as matmuls */
  int conv_bwdw;          /* TINYTRAIN_CONV_BWDW: 0 bf16 (default), 1 fp32 */
  int conv_wg;            /* TINYTRAIN_CONV_WINOGRAD: 0 auto (default: the CPU's 3x3 fp32 NHWC convolutions by our
                           * Winograd where oneDNN has no AVX-512), 1 on, 2 off */
  int cuda_find;          /* TINYTRAIN_CUDA_FIND: 1 (default) time the convolution algorithms at setup */
  int cuda_bn_resident;   /* TINYTRAIN_CUDA_BN_RESIDENT: 1 (default) the held-on-chip batch norm */
  int cuda_deterministic; /* TINYTRAIN_CUDA_DETERMINISTIC: 1 deterministic cuDNN algorithms only */
  int cuda_conv_log;      /* TINYTRAIN_CUDA_CONV_LOG: 1 one stderr line per convolution shape and direction */
  int cuda_conv_api;      /* TINYTRAIN_CUDA_CONV_API: a tt_cuda_conv_api (default legacy) */
  int cuda_stack;         /* TINYTRAIN_CUDA_STACK: 1 (default) sets the per-thread stack limit to what our kernels
                           * need before the libraries load; 0 leaves the driver's default */
  int cpu_isa;            /* TINYTRAIN_CPU_ISA: -1 unset (the process's hold, native if none yet), else a
                           * TT_CPU_ISA_* (tt_cpu_isa_hold) */
} tt_backend_knobs;

/* TINYTRAIN_CPU_ISA's values, in its choice order: the highest ISA the CPU backend's own loops
 * and oneDNN use. native: the CPU's (our loops' AVX-512F, AVX2 or baseline copy; oneDNN's own
 * pick, ONEDNN_MAX_CPU_ISA honoured); avx2: our AVX2 copy, oneDNN held to AVX2; baseline: our
 * baseline copy (SSE2), oneDNN held to SSE4.1 (its lowest). */
typedef enum { TT_CPU_ISA_NATIVE = 0, TT_CPU_ISA_AVX2 = 1, TT_CPU_ISA_BASELINE = 2 } tt_cpu_isa;
/* TINYTRAIN_CUDA_CONV_API's values, in its choice order: auto, all-NHWC convolutions through cuDNN's
 * graph API where it offers an engine, the legacy API elsewhere; graph, the same but a shape the
 * graph API does not serve is an error; legacy, every convolution on the legacy API (the default
 * until a GPU run has checked the graph path: docs/gpu.md). */
typedef enum { TT_CUDA_CONV_API_AUTO = 0, TT_CUDA_CONV_API_GRAPH = 1, TT_CUDA_CONV_API_LEGACY = 2 } tt_cuda_conv_api;

static inline void tt_backend_knobs_default(tt_backend_knobs *k) {
  k->layout = -1, k->cpu_chunk_bytes = 0, k->conv_matmul = 1, k->conv_bwdw = 0, k->conv_wg = 0;
  k->cuda_find = 1, k->cuda_bn_resident = 1, k->cuda_deterministic = 0, k->cpu_isa = -1, k->cuda_conv_log = 0;
  k->cuda_conv_api = TT_CUDA_CONV_API_LEGACY;
  k->cuda_stack = 1;
}

typedef struct tt_backend tt_backend;
struct tt_bn_blk_args; /* bn_blk's arguments, defined after the table */
/* The signatures of the op entries that every backend implements as named functions (the
 * semantics stand at the struct's fields below); the TT_BACKEND_DECLARE_* macros after the
 * struct declare one family of them for a backend prefix, so the backends' internal headers
 * do not repeat the parameter lists. */
typedef size_t tt_conv_workspace_fn(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, tt_ws_kind which);
typedef int tt_conv_fwd_fn(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *x, const void *w,
                           const void *bias, void *y, void *ws, size_t ws_bytes);
typedef int tt_conv_bwd_data_fn(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *dy,
                                const void *w, void *dx, float beta, void *ws, size_t ws_bytes);
typedef int tt_conv_bwd_filter_fn(tt_backend *b, const tt_conv_desc *d, tt_dtype dt, const void *x,
                                  const void *dy, float *dw, float *db, float beta, void *ws, size_t ws_bytes);
typedef size_t tt_linear_workspace_fn(tt_backend *b, int n, int in, int out, tt_dtype dt, tt_ws_kind which);
typedef int tt_linear_fwd_fn(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *x, const void *w,
                             const void *bias, void *y, void *ws, size_t ws_bytes);
typedef int tt_linear_bwd_data_fn(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *dy,
                                  const void *w, void *dx, float beta, void *ws, size_t ws_bytes);
typedef int tt_linear_bwd_filter_fn(tt_backend *b, int n, int in, int out, tt_dtype dt, const void *x,
                                    const void *dy, float *dw, float *db, float beta, void *ws,
                                    size_t ws_bytes);
typedef int tt_bn_fwd_train_fn(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x,
                               const float *gamma, const float *bias, void *y, float *running_mean,
                               float *running_var, float momentum, float eps, float *save_mean,
                               float *save_invstd, int update_running, void *ws, size_t ws_bytes);
typedef int tt_bn_fwd_infer_fn(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x,
                               const float *gamma, const float *bias, const float *running_mean,
                               const float *running_var, float eps, void *y, void *ws, size_t ws_bytes);
typedef int tt_bn_bwd_fn(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                         const float *gamma, const float *save_mean, const float *save_invstd, void *dx,
                         float *dgamma, float *dbias, float beta_dx, float beta_param, void *ws,
                         size_t ws_bytes);
typedef int tt_pool_fwd_fn(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x,
                           void *y, void *ws, size_t ws_bytes);
typedef int tt_pool_bwd_fn(tt_backend *b, const tt_pool_desc *d, tt_pool_mode mode, tt_dtype dt, const void *x,
                           const void *dy, void *dx, float beta, void *ws, size_t ws_bytes);
typedef int tt_pool_argmax_fn(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const void *x, uint8_t *idx);
typedef int tt_pool_bwd_idx_fn(tt_backend *b, const tt_pool_desc *d, tt_dtype dt, const uint8_t *idx,
                               const void *dy, void *dx, float beta);
typedef int tt_gap_fwd_fn(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, void *y);
typedef int tt_gap_bwd_fn(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *dy, void *dx,
                          float beta);
typedef int tt_act_fwd_fn(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *x, void *y);
typedef int tt_act_bwd_fn(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *saved, const void *dy,
                          void *dx, float beta);
typedef int tt_act_mask_fn(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const void *y, uint32_t *mask);
typedef int tt_act_bwd_mask_fn(tt_backend *b, tt_act a, size_t count, tt_dtype dt, const uint32_t *mask,
                               const void *dy, void *dx, float beta);
typedef int tt_add_fn(tt_backend *b, size_t count, tt_dtype dt, const void *a, const void *b2, void *y);
typedef int tt_accumulate_fn(tt_backend *b, size_t count, tt_dtype dt, const void *x, void *y, float beta);
typedef int tt_dropout_fwd_fn(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *x,
                              void *y);
typedef int tt_dropout_bwd_fn(tt_backend *b, size_t count, tt_dtype dt, float p, uint64_t seed, const void *dy,
                              void *dx, float beta);
typedef int tt_cast_fn(tt_backend *b, size_t count, tt_dtype src_dt, const void *src, tt_dtype dst_dt,
                       void *dst);
typedef int tt_normalize_u8_fn(tt_backend *b, int n, int c, int hw, const uint8_t *src, const float *mean,
                               const float *std, tt_dtype dt, void *dst);
typedef int tt_check_finite_fn(tt_backend *b, size_t count, tt_dtype dt, const void *x, int32_t *flag);
typedef int tt_check_finite_multi_fn(tt_backend *b, const tt_finite_seg *segs, int nseg, tt_dtype dt, int32_t *flag);
typedef int tt_channel_copy_fn(tt_backend *b, int n, int hw, tt_dtype dt, const void *src, int src_c,
                               int src_off, void *dst, int dst_c, int dst_off, int nc, float beta);
typedef int tt_save_compress_fn(tt_backend *b, int f, int n, int c, int hw, tt_dtype dt, const void *x,
                                void *dst);
typedef int tt_save_restore_fn(tt_backend *b, int f, int n, int c, int hw, tt_dtype dt, const void *src,
                               void *x);
typedef int tt_ln_fwd_fn(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const float *gamma,
                         const float *beta, float eps, void *y, float *save_mean, float *save_invstd, void *ws,
                         size_t ws_bytes);
typedef int tt_ln_bwd_fn(tt_backend *b, int rows, int f, tt_dtype dt, const void *x, const void *dy,
                         const float *gamma, const float *save_mean, const float *save_invstd, void *dx,
                         float *dgamma, float *dbeta, float beta_dx, float beta_param, void *ws,
                         size_t ws_bytes);
typedef int tt_attn_fwd_fn(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, void *o,
                           float *lse, void *probs, uint64_t seed, void *ws, size_t ws_bytes);
typedef int tt_attn_bwd_fn(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, const void *qkv, const void *o,
                           const void *dout, const float *lse, const void *probs, uint64_t seed, void *dqkv,
                           float beta, void *ws, size_t ws_bytes);
typedef int tt_tokens_fwd_fn(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *x,
                             const float *cls_tok, const float *pos, void *y);
typedef int tt_tokens_bwd_fn(tt_backend *b, int n, int f, int hw, int cls, tt_dtype dt, const void *dy,
                             void *dx, float *dcls, float *dpos, float beta_dx, float beta_param);
typedef int tt_token_pool_fwd_fn(tt_backend *b, int n, int t, int f, int mode, tt_dtype dt, const void *x,
                                 void *y);
typedef int tt_token_pool_bwd_fn(tt_backend *b, int n, int t, int f, int mode, tt_dtype dt, const void *dy,
                                 void *dx, float beta);
typedef int tt_softmax_ce_fn(tt_backend *b, int n, int classes, tt_dtype dt, const void *logits,
                             const int32_t *labels, float smoothing, float grad_scale, void *dlogits,
                             float *stats);
typedef int tt_sgd_update_fn(tt_backend *b, size_t count, float *w, const float *g, float *m, float lr,
                             float momentum, int nesterov, float weight_decay, float grad_scale,
                             const tt_clip *clip, const int32_t *skip);
typedef int tt_adam_update_fn(tt_backend *b, size_t count, float *w, const float *g, float *m, float *v,
                              float lr, float beta1, float beta2, float eps, float weight_decay, int decoupled,
                              int t, float grad_scale, const tt_clip *clip, const int32_t *skip);
typedef int tt_sum_squares_fn(tt_backend *b, size_t count, const float *g, float *acc);

struct tt_backend {
  const char *name;  /* "cpu", "ref", "cuda" */
  void *impl;        /* backend-private state */
  size_t align;      /* every planned buffer starts at a multiple of this many bytes */
  int host_memory;   /* 1: the arena is host memory, so a step may read the caller's host buffers
                      * directly (the CPU backends: the executor normalises the loader's uint8
                      * batch straight into the input, with no staging copy) */
  void (*destroy)(tt_backend *b);
  const char *(*last_error)(tt_backend *b);

  /* ---- memory: the one arena per device, host<->device copies ---- */
  void *(*arena_alloc)(tt_backend *b, size_t bytes); /* NULL on failure */
  void (*arena_free)(tt_backend *b, void *p);
  /* Complete when they return: upload's src may be reused at once, download's dst holds the
   * bytes; ordered after the work queued so far. For setup, checkpoints and tests, not the step. */
  int (*upload)(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes);
  int (*download)(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes);
  int (*zero)(tt_backend *b, void *p, size_t bytes);
  int (*sync)(tt_backend *b);

  /* ---- staging and the copy stream (CUDA: one copy stream beside the compute stream) ----
   * host_alloc: host memory the device copies from and to without staging (page-locked,
   * cudaHostAlloc, on CUDA; ordinary memory on the CPU); allocated at setup only; NULL on
   * failure. Events order the copy stream against the host and the compute stream; created at
   * setup. event_sync waits on the host for the work before the event's latest record (at once
   * for an event never recorded). */
  void *(*host_alloc)(tt_backend *b, size_t bytes);
  void (*host_free)(tt_backend *b, void *p);
  void *(*event_create)(tt_backend *b); /* NULL on failure */
  void (*event_destroy)(tt_backend *b, void *ev);
  int (*event_sync)(tt_backend *b, void *ev);
  /* Copies bytes from host_alloc'ed src to dst on the copy stream, after the work queued on the
   * compute stream so far (dst may be storage that work still uses); compute work queued after
   * the call waits for the copy. Then records `done` (may be NULL): src must stay untouched until
   * event_sync(done) has returned. */
  int (*upload_async)(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes, void *done);
  /* Copies bytes from src to host_alloc'ed dst on the copy stream, after the work queued on the
   * compute stream so far; compute work queued after the call waits for the copy (so it may
   * overwrite src). dst holds the bytes once event_sync(done) has returned. */
  int (*download_async)(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes, void *done);

  /* ---- workspace queries (bytes; 0 when none is needed; TT_WS_ERROR on failure) ---- */
  tt_conv_workspace_fn *conv_workspace;
  tt_linear_workspace_fn *linear_workspace;

  /* ---- convolution: y = conv(x, w) + bias; bias may be NULL. w, bias in dt. ---- */
  tt_conv_fwd_fn *conv_fwd;
  /* dx = beta*dx + conv_transpose(dy, w) */
  tt_conv_bwd_data_fn *conv_bwd_data;
  /* dw = beta*dw + dW(x, dy); db = beta*db + sum(dy) (db may be NULL). dw, db fp32. */
  tt_conv_bwd_filter_fn *conv_bwd_filter;

  /* ---- linear: x [n, in], w [out, in] (PyTorch layout), bias [out], y [n, out] ---- */
  tt_linear_fwd_fn *linear_fwd;
  tt_linear_bwd_data_fn *linear_bwd_data;
  tt_linear_bwd_filter_fn *linear_bwd_filter;

  /* ---- batch norm over (n, hw) per channel; gamma, beta, stats fp32 [c] ----
   * Training: normalise with batch statistics, write save_mean and save_invstd; when
   * update_running is non-zero, running = (1-momentum)*running + momentum*batch (running_var
   * uses the unbiased batch variance, as PyTorch does). Recompute passes update_running = 0. */
  tt_bn_fwd_train_fn *bn_fwd_train;
  tt_bn_fwd_infer_fn *bn_fwd_infer;
  /* dx = beta_dx*dx + ...; dgamma/dbias = beta_param*d + ... */
  tt_bn_bwd_fn *bn_bwd;

  /* ---- pooling; max backward finds the arg-max from x (first maximum in the window);
   * average counts padding in the divisor (PyTorch's count_include_pad = True) ---- */
  tt_pool_fwd_fn *pool_fwd;
  tt_pool_bwd_fn *pool_bwd;
  /* global average pool: x [n, c, hw] -> y [n, c] */
  tt_gap_fwd_fn *gap_fwd;
  tt_gap_bwd_fn *gap_bwd;

  /* ---- elementwise (count elements) ---- */
  /* y = act(x); y may equal x (in place). */
  tt_act_fwd_fn *act_fwd;
  /* dx = beta*dx + dy * act'(.). `saved` is y for RELU and RELU6 (so the forward may run in
   * place) and x for SILU. dx may equal dy when beta == 0. */
  tt_act_bwd_fn *act_bwd;
  /* y = a + b2; y may equal a or b2. */
  tt_add_fn *add;
  /* y = beta*y + x (gradient routing for add/flatten/fan-out) */
  tt_accumulate_fn *accumulate;
  /* Inverted dropout with a counter-based mask: element i is kept iff
   * hash(seed, i) >= p * 2^32, kept values scaled by 1/(1-p). The same seed gives the same
   * mask, so backward and recompute regenerate it and no mask is stored. (While a graph is being
   * recorded, seed is the call's number: graph_begin below.) */
  tt_dropout_fwd_fn *dropout_fwd;
  tt_dropout_bwd_fn *dropout_bwd;
  /* Channel-block copy for concat: for each sample, channels [src_off, src_off+nc) of src
   * (src_c channels in all) go to channels [dst_off, dst_off+nc) of dst (dst_c channels);
   * dst = beta*dst + src on the copied block. */
  tt_channel_copy_fn *channel_copy;
  tt_cast_fn *cast;

  /* ---- input: uint8 images [n, c, hw] -> dt, (v/255 - mean[c]) / std[c] ---- */
  tt_normalize_u8_fn *normalize_u8;

  /* ---- loss: softmax cross-entropy with label smoothing, computed in fp32 ----
   * logits [n, classes] in dt, labels int32 [n]. Target = (1-s)*onehot + s/classes.
   * stats[0] += sum of per-sample losses, stats[1] += number of correct top-1 predictions.
   * If dlogits is non-NULL: dlogits = (softmax - target) * grad_scale (written, dt).
   * Execution passes grad_scale = loss_scale / effective_batch. */
  tt_softmax_ce_fn *softmax_ce;

  /* ---- optimizer updates, in place, all fp32; the gradient used is g * gs, gs = grad_scale, or
   * with clip (NULL: none) grad_scale times the clipping coefficient (tt_clip above) ----
   * skip: NULL, or the int32 flag check_finite wrote earlier in the same stream order: when it
   * is non-zero the update changes nothing (w, m and v keep their values). So an fp16 overflow
   * skips the update on the device and the host need not wait for the flag before issuing it.
   * SGD (PyTorch semantics): d = g*gs + wd*w; m = momentum*m + d; step = nesterov ? d + momentum*m : m;
   * w -= lr*step. m may be NULL when momentum == 0. */
  tt_sgd_update_fn *sgd_update;
  /* Adam (decoupled == 0: wd added to the gradient) and AdamW (decoupled == 1:
   * w -= lr*wd*w), bias-corrected with step t (1-based). */
  tt_adam_update_fn *adam_update;
  /* flag[0] = 1 if any of x[0..count) is inf or NaN (flag is not cleared; execution zeroes it). */
  tt_check_finite_fn *check_finite;

  /* ---- set-up (see tt_op_desc above) ----
   * op_workspace: bytes of planned workspace the call needs (0: none; TT_WS_ERROR, with the
   * reason in last_error, when it cannot answer); the same answer as
   * conv_workspace/linear_workspace for those kinds. prepare: builds what the calls need;
   * may allocate; returns non-zero with last_error set when a call cannot be built. */
  size_t (*op_workspace)(tt_backend *b, const tt_op_desc *op);
  int (*prepare)(tt_backend *b, const tt_op_desc *ops, int nops);

  /* ---- compact saves: what backward needs in its smallest exact form (optional: a backend
   * that leaves them NULL gets plans that save the full tensors) ----
   * act_mask: bit i of mask (uint32 words, bit i%32 of word i/32; tt_act_mask_bytes) = 1 iff
   * act_bwd would pass dy through at y[i] (RELU: y > 0; RELU6: 0 < y < 6); bits past count are
   * zero. act_bwd_mask: act_bwd with the mask in place of y, bit for bit the same dx. */
  tt_act_mask_fn *act_mask;
  tt_act_bwd_mask_fn *act_bwd_mask;
  /* Max pooling: idx[n, c, p, q] (uint8; in the desc's layout) = the winner's in-window position (kh*kw <= 256),
   * (ih - oh*sh + ph) * kw + (iw - ow*sw + pw), the first maximum as pool_bwd finds it.
   * pool_bwd_idx: max pool_bwd from idx in place of x, bit for bit the same dx. */
  tt_pool_argmax_fn *pool_argmax;
  tt_pool_bwd_idx_fn *pool_bwd_idx;
  /* lossy saved copies (tt_save_fmt below; optional, like the compact entries) */
  tt_save_compress_fn *save_compress;
  tt_save_restore_fn *save_restore;

  /* ---- transformer ops. Token tensors are [n, t, f] row-major (f fastest); a linear layer over
   * tokens is linear_fwd with n*t rows. A backend may leave these NULL: the planner then refuses
   * a recipe that uses them on that backend, naming the layer. ----
   * Layer norm over the last dimension (PyTorch's nn.LayerNorm(f)): y = (x - mean) * invstd *
   * gamma + beta per row, invstd = 1/sqrt(biased var + eps); gamma, beta fp32 [f]; save_mean and
   * save_invstd fp32 [rows], written when non-NULL (training), read by backward. */
  tt_ln_fwd_fn *ln_fwd;
  /* dx = beta_dx*dx + ...; dgamma, dbeta = beta_param*d + ... (fp32 [f]) */
  tt_ln_bwd_fn *ln_bwd;
  /* Attention (tt_attn_desc above). lse may be NULL when evaluating; probs NULL keeps only lse
   * (the fused form: no [t, t] tensor is stored). seed: the dropout stream of this step (while a
   * graph is being recorded, the call's number: graph_begin below). */
  tt_attn_fwd_fn *attn_fwd;
  /* dqkv = beta*dqkv + d(qkv) from do. probs: the forward's, or NULL to rebuild them from qkv
   * and lse. o is the forward's output (the fused backward needs rowsum(do * o)). */
  tt_attn_bwd_fn *attn_bwd;
  /* Patch tokens: a patch convolution's output x [n, f, hw] (NCHW) becomes y [n, t, f] with
   * t = hw + cls: token cls + i = x[:, :, i] + pos[cls + i]; with cls == 1, token 0 is
   * cls_tok + pos[0]. cls_tok fp32 [f] (NULL iff cls == 0); pos fp32 [t, f] or NULL. */
  tt_tokens_fwd_fn *tokens_fwd;
  /* dx = beta_dx*dx + ...; dcls, dpos = beta_param*d + sums over the batch (each may be NULL). */
  tt_tokens_bwd_fn *tokens_bwd;
  /* Token pooling x [n, t, f] -> y [n, f]: mode 0 takes token 0 (the class token), mode 1 the
   * mean over the t tokens. Backward: dx = beta*dx + the routed dy (mode 0: zero, or untouched
   * when beta == 1, at tokens 1..t-1). */
  tt_token_pool_fwd_fn *token_pool_fwd;
  tt_token_pool_bwd_fn *token_pool_bwd;
  /* Global-norm clipping: acc[0] += sum of g[i]^2 over count fp32 values (acc fp32, in the
   * arena). Deterministic: the same inputs give the same bits (the summation order depends on
   * count only). Partial sums are combined in double precision (the CUDA kernel sums each
   * thread's few values in fp32), rounded to fp32 once when added. */
  tt_sum_squares_fn *sum_squares;

  /* ---- the whole optimizer step in few launches (optional: NULL makes the executor call
   * sgd_update / adam_update once per tensor, as the ref and cpu backends do) ----
   * Every tensor of segs[0..nseg) updated as sgd_update / adam_update would update it alone,
   * bit for bit, with weight_decay where segs[i].decay, else 0; same skip and clip semantics.
   * The tensors do not overlap. Added for issue 22: the CUDA backend runs up to 64 tensors per
   * launch from a table passed by value (no device memory, no upload), where one launch per
   * tensor cost a launch latency each (161 for a ResNet-50). */
  int (*sgd_update_multi)(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float momentum, int nesterov,
                          float weight_decay, float grad_scale, const tt_clip *clip, const int32_t *skip);
  int (*adam_update_multi)(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float beta1, float beta2,
                           float eps, float weight_decay, int decoupled, int t, float grad_scale, const tt_clip *clip,
                           const int32_t *skip);

  /* ---- layouts (last, so positional tables that end before it leave it 0) ----
   * Bit (1 << l) set: conv and pool descs may name tt_layout l for activations (NCHW, bit 0, is
   * implied). 0: NCHW only (the reference backend; the CUDA backend for fp32, see layouts_16bit):
   * the planner never gives another.
   * A backend that lists NHWC must also take an NHWC tensor in the ops that see only channels
   * and elements: batch norm, channel_copy and save_compress/restore are called on it as
   * [n*h*w, c, 1] (the same per-channel reduction), elementwise ops by count. One that lists
   * NCHW16C must also fill bn_blk (the planner gives the layout only then, only to fp32 programs,
   * only to channel counts that are multiples of 16, and never to a pooling's or concat's tensors). */
  unsigned layouts;

  /* ---- batch norm from given statistics (optional, after `layouts` so that tables ending
   * before it leave it NULL) ----
   * y = (x - save_mean) * (save_invstd * gamma) + bias per channel, save_mean and save_invstd
   * fp32 [c] as bn_fwd_train wrote them; x, y in dt [n, c, hw] (every dtype bn_fwd_train takes);
   * no workspace; y may not overlap x. Bit for bit the y that bn_fwd_train wrote from the same x
   * and statistics on this backend (it runs the training forward's own normalisation code), so a
   * recomputed batch norm (issue 26) reads x once and writes y once instead of recomputing the
   * batch statistics (two more passes over x); running statistics are not touched. NULL: lowering
   * recomputes batch norm with bn_fwd_train (update_running 0), as before. */
  int (*bn_apply)(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma, const float *bias,
                  const float *save_mean, const float *save_invstd, void *y);
  /* ---- many casts in one call (optional, after `layouts` so that positional tables ending
   * before it leave it NULL: the executor then calls cast once per segment) ----
   * Every segment as cast(b, segs[i].count, src_dt, segs[i].src, dst_dt, segs[i].dst) would write
   * it, bit for bit; the segments do not overlap each other's dst, and no src is any dst. Added for
   * issue 22: under fp16/bf16 autocast the training program casts every fp32 master weight to its
   * 16-bit copy at the start of each micro-step (core/compile/lower.c), and the CUDA backend makes
   * those casts one launch (up to 100 tensors per launch, the table passed by value) where one per
   * weight cost a launch latency each. A segment with rs > 0 is written KRSC (tt_cast_seg). */
  int (*cast_multi)(tt_backend *b, const tt_cast_seg *segs, int nseg, tt_dtype src_dt, tt_dtype dst_dt);

  /* ---- the batch's copy ordered by an event, not by all the compute work (optional; NULL: the
   * executor uses upload_async). Added for issue 22: upload_async waits for every kernel queued
   * before it, so the next batch's copy could not overlap the current step; the training program's
   * input buffers are persistent on a backend that stages (lower.c), and the copy of batch k+1 into
   * them waits only for step k's last reader of them (the loss, which reads the labels). ----
   * event_record: records ev (event_create's) on the compute stream, after the work queued so far.
   * upload_after: as upload_async (src host_alloc'ed; compute work queued after the call waits for
   * the copy; `done` recorded after it), but the copy waits only for the latest record of `after`
   * made by event_record before this call (none, or NULL: for nothing), so dst must be storage that
   * no compute work queued after that record touches (the caller's guarantee). */
  int (*event_record)(tt_backend *b, void *ev);
  int (*upload_after)(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes, void *after, void *done);

  /* ---- tune (optional; after prepare, once, at setup): the backend may time the calls of ops
   * (as prepare gets them) on scratch, device memory of scratch_bytes that holds nothing (the
   * arena's transient region before the first step), and change a call's implementation to a
   * faster one as long as the workspace it was planned with (op_workspace's answer) still
   * suffices. Added for issue 22: the CUDA backend's cudnnFind*Ex per convolution, allocation-free
   * (TINYTRAIN_CUDA_FIND=0 turns it off). ---- */
  int (*tune)(tt_backend *b, const tt_op_desc *ops, int nops, void *scratch, size_t scratch_bytes);

  /* ---- layouts for 16-bit activations (last, so positional tables that end before it leave it
   * 0) ----
   * Bits as in `layouts`, added to them when the program's activations are fp16 or bf16 (its
   * policy's act_dtype); an fp32 program gets `layouts` alone. The CUDA backend lists NHWC here
   * (and never in `layouts`) only under TINYTRAIN_LAYOUT=nhwc: on the first H100 run its 16-bit
   * NHWC programs were slower than NCHW (tt_cuda_layouts_16bit, tt_cuda.h). A backend listing a layout
   * here takes it in the same ops as one listed in `layouts` (conv and pool descs; batch norm,
   * channel_copy and save_compress/restore on [n*h*w, c, 1]), in the 16-bit dtypes at least. */
  unsigned layouts_16bit;

  /* ---- batch norm and ReLU as one call (optional, last, so positional tables that end before
   * them leave them NULL: the executor then runs the two ops apart) ----
   * For a batch norm whose output goes only through a ReLU (an in-place one in the forward).
   * bn_fwd_train_relu: bn_fwd_train's arguments; y = relu(batch norm of x), bit for bit what
   * bn_fwd_train then act_fwd(TT_ACT_RELU) on y in place write (NaN kept, negatives and -0 as +0),
   * statistics and running statistics as bn_fwd_train; the same workspace.
   * bn_bwd_relu: bn_bwd's arguments and the forward's bias (fp32 [c]); dy is the gradient of the
   * ReLU's output, and the ReLU's backward is folded in: where batch norm's output for x (from
   * save_mean, save_invstd, gamma and bias, computed as the forward computed it, then rounded to
   * dt) is not > 0 dy counts as 0, so dx, dgamma and dbias are bit for bit those of
   * act_bwd(TT_ACT_RELU, y, dy) with beta 0 then bn_bwd; the same workspace as bn_bwd.
   * Added for issue 22: the ReLU's passes over the activation (read y and write it forward;
   * read y and dy and write dx backward) disappear, and the backward reads no y at all. */
  int (*bn_fwd_train_relu)(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                           const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                           float eps, float *save_mean, float *save_invstd, int update_running, void *ws,
                           size_t ws_bytes);
  int (*bn_bwd_relu)(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                     const float *gamma, const float *bias, const float *save_mean, const float *save_invstd, void *dx,
                     float *dgamma, float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes);
  /* ---- optimizer updates with the state held in bf16 or int8 (tt_state_fmt; optional, before
   * plan_caps: NULL makes the planner refuse [train] optimizer_state other than fp32) ----
   * Every tensor of segs[0..nseg) updated as sgd_update / adam_update (or their _multi forms)
   * would update it with fp32 state, weight_decay where segs[i].decay, same skip and clip
   * semantics, with its state held as segs[i].state: each value's m (and v) is decoded to fp32,
   * the update computed in fp32 exactly as the fp32 one, and the result stored back (bf16:
   * rounded to nearest even; int8: each TT_STATE_BLOCK block requantized with its new largest
   * magnitude, in the same pass). A TT_STATE_F32 tensor is updated bit for bit as sgd_update
   * would. Added for issue 42: AdamW's moments in int8 take 2.0 bytes per parameter in place of 8. */
  int (*sgd_update_held)(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float momentum, int nesterov,
                         float weight_decay, float grad_scale, const tt_clip *clip, const int32_t *skip);
  int (*adam_update_held)(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float beta1, float beta2,
                          float eps, float weight_decay, int decoupled, int t, float grad_scale, const tt_clip *clip,
                          const int32_t *skip);
  /* Planning only: the optional calls (core/compile/program.h TT_CAP_*) lowering's call list may
   * assume beyond the entry points this table fills. `plan`'s stand-in for a card that is not here
   * (the reference backend, core/runtime/session.c) lists the CUDA backend's, so the plan shows the
   * calls the card will run; never run there. 0 in every real backend (the tables leave it out). */
  int plan_caps;

  /* ---- batch norm, add and ReLU as one call (optional, last, so positional tables that end before
   * them, at plan_caps, leave them NULL: the executor then runs the three ops apart) ----
   * For a residual block's last batch norm, whose output goes only into an add with the shortcut s,
   * whose output goes only into a ReLU (torchvision's bn2/bn3 -> add(., identity) -> relu).
   * bn_fwd_train_add_relu: bn_fwd_train's arguments and s (dt [n, c, hw], as x and y; the shortcut,
   * the add's other input); per element, in this order and rounding exactly there:
   *   t = batch norm of x, computed as bn_fwd_train computes it, rounded to dt (bn_fwd_train's y);
   *   u = (float)t + (float)s in fp32, rounded to dt once (add's y);
   *   y = relu(u) (act_fwd(TT_ACT_RELU): NaN kept, negatives and -0 as +0; exact in dt).
   * So y is bit for bit what bn_fwd_train into t, add(t, s) and act_fwd(TT_ACT_RELU) write (fp32:
   * the roundings are no-ops); save_mean, save_invstd and the running statistics as bn_fwd_train;
   * the same workspace (op_workspace of the TT_OP_BN_FWD_TRAIN desc). y may be s's storage exactly
   * (in place on the shortcut: each s[i] is read before y[i] is written); y overlaps x nowhere and
   * s overlaps x nowhere (s is not written unless it is y).
   * bn_bwd_add_relu: bn_bwd's arguments plus the ReLU's saved output y (dt [n, c, hw]) or, when
   * mask is non-NULL, its 1-bit mask (tt_act_mask's, bit i for element i in memory order; y is then
   * not read and may be NULL); dy is the gradient of the ReLU's output (the block's output). With
   *   g = y[i] > 0 (mask: bit i set) ? dy[i] : 0     (act_bwd / act_bwd_mask with beta 0),
   * ds = beta_s*ds + g, bit for bit what accumulate(g, ds, beta_s) writes: the add's backward into
   * the shortcut's gradient (beta_s 1 where that gradient already holds a partial sum; ds NULL: the
   * shortcut needs none); dx, dgamma and dbias bit for bit bn_bwd's from dy = g, with beta_dx and
   * beta_param as bn_bwd takes them; the same workspace as bn_bwd (the TT_OP_BN_BWD desc's).
   * dy is consumed: the call may overwrite any of its elements with that element's g (a backend
   * may mask dy in place, then run bn_bwd's own launches on it), so the caller must need dy no
   * more (the plan let it die at the ReLU's step). Aliasing: dx may be dy's storage exactly; ds may
   * be dy's storage exactly when beta_s == 0 (g recomputed from a g already written is g again);
   * dx and ds overlap each other nowhere, and neither overlaps x, y or mask. Added for issue 41 (item 4): the intermediate batch norm and add
   * outputs are never stored, the add's and the ReLU's passes disappear forward, and backward the
   * ReLU's and the add's passes fold into bn_bwd's. */
  int (*bn_fwd_train_add_relu)(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                               const float *bias, const void *s, void *y, float *running_mean, float *running_var,
                               float momentum, float eps, float *save_mean, float *save_invstd, int update_running,
                               void *ws, size_t ws_bytes);
  int (*bn_bwd_add_relu)(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *y,
                         const uint32_t *mask, void *dy, const float *gamma, const float *save_mean,
                         const float *save_invstd, void *dx, void *ds, float *dgamma, float *dbias, float beta_dx,
                         float beta_s, float beta_param, void *ws, size_t ws_bytes);
  /* ---- the profile's device clock (optional, after plan_caps; NULL: TINYTRAIN_PROFILE waits for
   * the device around each Program step and reads the host's clock). Added for issue 41: a wait
   * per step cost the launch latency of every step and hid the overlap the profile should show.
   * timer_create: an event that event_record records and event_destroy frees, and that can be
   * timed (NULL on failure). timer_elapsed: *ms between the latest records of start and end,
   * waiting on the host for end's work (both must have been recorded, start before end). */
  void *(*timer_create)(tt_backend *b);
  int (*timer_elapsed)(tt_backend *b, void *start, void *end, float *ms);
  /* ---- a profiler's range (optional; NULL: TINYTRAIN_CUDA_PROFILE_STEP does nothing). Added for
   * issue 41: `ncu --profile-from-start off` and `nsys --capture-range=cudaProfilerApi` record
   * only the work launched between start (on != 0) and stop (on == 0): one training step. ---- */
  int (*profiler_range)(tt_backend *b, int on);

  /* ---- the micro-step as a graph (optional, last, so positional tables leave them NULL: the
   * executor then runs every call eagerly). Added for issue 41 (item 5): the CUDA backend captures
   * the compute stream's work into a CUDA graph and replays it with one launch. ----
   * graph_begin: from now on the calls' device work is recorded, not run, until graph_end; the
   * calls made in between must be the same each replay (pointers and arguments are frozen), except
   * the loss's gradient scale and the dropout seeds, which the recorded calls read from device
   * memory (graph_values): while recording, softmax_ce's grad_scale argument is ignored, and the
   * seed argument of dropout_fwd, dropout_bwd, attn_fwd and attn_bwd is the call's number k (less
   * than 2^32), the recorded kernel drawing with tt_seed_at(base, k) (kernel_math.h). The saved
   * activations' copies are recorded too: an event_record made while recording belongs to the
   * recording, and download_after and upload_after after it are recorded after the work before it
   * (the copy stream forked into the recording); every such copy must be joined back before
   * graph_end (event_wait on download_after's `done`; upload_after joins itself), or graph_end
   * fails. Such an event orders nothing outside the recording.
   * graph_end: stops recording; 0 with *graph an executable graph of everything recorded, or -1
   * (last_error says why: a call made while recording did what a graph cannot hold, such as a host
   * synchronisation or an allocation) with *graph NULL; none of the recorded work ran either way,
   * and the backend is eager again.
   * graph_values: queues, on the compute stream, the write of grad_scale and seed_base into the
   * device values the recorded loss (softmax_ce) and the recorded dropout and attention calls read
   * (one launch): call it before each graph_launch.
   * graph_launch: queues one replay of graph on the compute stream (ordered as a call there).
   * graph_destroy: frees graph (a replay already queued still runs). */
  int (*graph_begin)(tt_backend *b);
  int (*graph_end)(tt_backend *b, void **graph);
  int (*graph_values)(tt_backend *b, float grad_scale, uint64_t seed_base);
  int (*graph_launch)(tt_backend *b, void *graph);
  void (*graph_destroy)(tt_backend *b, void *graph);

  /* ---- saved activations in pinned host memory (optional, last; NULL: the planner never offloads
   * an activation). Added for issue 42 (item 2): a value is copied out in forward while the compute
   * stream goes on, and only the step that would overwrite its storage waits. ----
   * download_after: copies bytes from src (device) to host_alloc'ed dst on the copy stream after the
   * latest record of `after` (event_record's; NULL: after nothing), without making the compute
   * stream wait; records `done` (may be NULL) on the copy stream after the copy. src must stay
   * unchanged until compute waits for `done` (event_wait) before overwriting it.
   * event_wait: compute work queued after the call waits for the latest record of ev (on either
   * stream) made before it; no host wait. */
  int (*download_after)(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes, void *after, void *done);
  int (*event_wait)(tt_backend *b, void *ev);

  /* ---- check_finite over many tensors in one call (every backend here has it; NULL: the
   * executor calls check_finite once per segment). Added for issue 41 (item 5): transient weight
   * gradients are no one region, and one launch per gradient cost the fp16 overflow check a launch
   * latency per parameter tensor (the fashion ResNet's 50, a ResNet-50's 161). ----
   * flag[0] = 1 if any of segs[i].x[0..segs[i].count) is inf or NaN, for every i (flag is not
   * cleared), as check_finite on each segment would set it; empty segments are allowed. */
  tt_check_finite_multi_fn *check_finite_multi;

  /* ---- KRSC weight copies (optional, after check_finite_multi: positional tables leave it 0) ----
   * 1: conv_fwd and conv_bwd_data take a KRSC filter (tt_conv_desc.layout_w) when x and y are NHWC,
   * reading it in place, and cast_multi writes KRSC segments (tt_cast_seg.rs). The planner then has
   * the cast of a 16-bit weight copy whose every reader is such a convolution write it KRSC
   * (core/compile/krsc.c), so no call transposes the filter into its workspace. Added for issue 41
   * (item 2): the CUDA backend, whose channels-last cuDNN kernels read KRSC. */
  int filter_krsc;

  /* ---- pooling that changes the layout (optional, last: positional tables leave it 0) ----
   * 1: pool_fwd and pool_bwd take tt_pool_desc.y_nchw (x and dx NHWC, y and dy NCHW; their
   * workspace, op_workspace's answer, holds the NHWC copy of y or dy), and so do pool_argmax and,
   * in fp32 and bf16, pool_bwd_idx. The planner then lets a pooling end an NHWC group: LeNet's
   * last pooling, read by the flatten, pools the NHWC activations and writes NCHW, where without
   * it the convolution before it wrote NCHW and the batch norm and the pooling ran NCHW (three
   * reorders of 4 times the pooled bytes a step). Added for issue 40 (the CPU backend). */
  int pool_y_nchw;

  /* ---- batch norm on nChw16c activations (optional, last: positional tables leave it NULL;
   * NULL: the planner never gives TT_LAYOUT_NCHW16C) ----
   * Every batch-norm call of a program whose activations are nChw16c (tt_bn_desc.blk 16), in
   * one entry taking tt_bn_blk_args: the kinds and their semantics are the plain entries' (named
   * below), on x [n, c/16, hw, 16] in fp32 (the only dtype the layout is planned for; another
   * fails the call). Statistics per channel in a fixed order whatever the thread count. A 1-bit
   * mask (kind TT_BNB_BWD_ADD_RELU) is in memory order, as act_mask writes it. Added for issue 40
   * (item 3: layouts planned per CPU): the CPU backend's Winograd convolutions. */
  int (*bn_blk)(tt_backend *b, const struct tt_bn_blk_args *a);
};

/* The kinds of bn_blk and the plain entry each one is: */
typedef enum {
  TT_BNB_FWD_TRAIN = 0, /* bn_fwd_train; relu 1: bn_fwd_train_relu */
  TT_BNB_FWD_ADD_RELU,  /* bn_fwd_train_add_relu (s: the shortcut) */
  TT_BNB_FWD_INFER,     /* bn_fwd_infer (mean, var: the running statistics) */
  TT_BNB_APPLY,         /* bn_apply (mean, invstd: the saved statistics) */
  TT_BNB_BWD,           /* bn_bwd; relu 1: bn_bwd_relu (bias read) */
  TT_BNB_BWD_ADD_RELU   /* bn_bwd_add_relu (y or mask; dy consumed; ds, beta_s) */
} tt_bn_blk_kind;

typedef struct tt_bn_blk_args {
  int kind, relu;
  int n, c, hw; /* x, y, s, dx, dy, ds: fp32 [n, c/16, hw, 16] */
  tt_dtype dt;
  float eps, momentum;
  int update_running;
  const float *x, *s, *y;
  const uint32_t *mask;
  float *dy; /* read; TT_BNB_BWD_ADD_RELU may overwrite it with the masked gradient */
  const float *gamma, *bias;
  float *running_mean, *running_var; /* TT_BNB_FWD_TRAIN, _ADD_RELU: moved when update_running */
  float *save_mean, *save_invstd;    /* forward: written; TT_BNB_APPLY and backward: read */
  float *out;                        /* y forward, dx backward (NULL: no dx, the parameters' gradients only) */
  float *ds, *dgamma, *dbias;
  float beta_dx, beta_s, beta_param;
  void *ws; /* the op_workspace answer for the call's desc (training forward and backward) */
  size_t ws_bytes;
} tt_bn_blk_args;

/* Declares the named entries of one op family for backend prefix P (tt_ref, tt_cpu, tt_cuda):
 * TT_BACKEND_DECLARE_BN(tt_cpu) declares tt_cpu_bn_fwd_train and its kin. */
/* the convolution and linear entries */
#define TT_BACKEND_DECLARE_CONV_LINEAR(P) \
  tt_conv_workspace_fn P##_conv_workspace; tt_conv_fwd_fn P##_conv_fwd; tt_conv_bwd_data_fn P##_conv_bwd_data; \
  tt_conv_bwd_filter_fn P##_conv_bwd_filter; tt_linear_workspace_fn P##_linear_workspace; \
  tt_linear_fwd_fn P##_linear_fwd; tt_linear_bwd_data_fn P##_linear_bwd_data; \
  tt_linear_bwd_filter_fn P##_linear_bwd_filter;
/* batch norm */
#define TT_BACKEND_DECLARE_BN(P) \
  tt_bn_fwd_train_fn P##_bn_fwd_train; tt_bn_fwd_infer_fn P##_bn_fwd_infer; tt_bn_bwd_fn P##_bn_bwd;
/* max and average pooling, the compact max-pool winners, global average pooling */
#define TT_BACKEND_DECLARE_POOL(P) \
  tt_pool_fwd_fn P##_pool_fwd; tt_pool_bwd_fn P##_pool_bwd; tt_pool_argmax_fn P##_pool_argmax; \
  tt_pool_bwd_idx_fn P##_pool_bwd_idx; tt_gap_fwd_fn P##_gap_fwd; tt_gap_bwd_fn P##_gap_bwd;
/* activations, add, accumulate, dropout, casts, input normalisation, the finite check */
#define TT_BACKEND_DECLARE_ELEMENTWISE(P) \
  tt_act_fwd_fn P##_act_fwd; tt_act_bwd_fn P##_act_bwd; tt_act_mask_fn P##_act_mask; \
  tt_act_bwd_mask_fn P##_act_bwd_mask; tt_add_fn P##_add; tt_accumulate_fn P##_accumulate; \
  tt_dropout_fwd_fn P##_dropout_fwd; tt_dropout_bwd_fn P##_dropout_bwd; tt_cast_fn P##_cast; \
  tt_normalize_u8_fn P##_normalize_u8; tt_check_finite_fn P##_check_finite; \
  tt_check_finite_multi_fn P##_check_finite_multi;
/* channel copies and the compressed saves */
#define TT_BACKEND_DECLARE_SAVE_COPY(P) \
  tt_channel_copy_fn P##_channel_copy; tt_save_compress_fn P##_save_compress; \
  tt_save_restore_fn P##_save_restore;
/* layer norm and attention */
#define TT_BACKEND_DECLARE_LN_ATTN(P) \
  tt_ln_fwd_fn P##_ln_fwd; tt_ln_bwd_fn P##_ln_bwd; tt_attn_fwd_fn P##_attn_fwd; tt_attn_bwd_fn P##_attn_bwd;
/* patch tokens and token pooling */
#define TT_BACKEND_DECLARE_TOKENS(P) \
  tt_tokens_fwd_fn P##_tokens_fwd; tt_tokens_bwd_fn P##_tokens_bwd; tt_token_pool_fwd_fn P##_token_pool_fwd; \
  tt_token_pool_bwd_fn P##_token_pool_bwd;
/* the loss, the optimiser updates and the squared-gradient sum */
#define TT_BACKEND_DECLARE_LOSS_OPTIM(P) \
  tt_softmax_ce_fn P##_softmax_ce; tt_sgd_update_fn P##_sgd_update; tt_adam_update_fn P##_adam_update; \
  tt_sum_squares_fn P##_sum_squares; \
  int P##_sgd_update_held(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float momentum, int nesterov, \
                          float weight_decay, float grad_scale, const tt_clip *clip, const int32_t *skip); \
  int P##_adam_update_held(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float beta1, float beta2, \
                           float eps, float weight_decay, int decoupled, int t, float grad_scale, const tt_clip *clip, \
                           const int32_t *skip);


/* Lossy saved copies, for backward only ([train] compress_saved): a convolution's input x
 * [n, c, hw] in dt stored as fp16, bf16 (round to nearest even) or int8 with a per-channel scale
 * (max |x| over n and hw / 127; the fp32 scales follow the values at a 4-byte boundary);
 * save_restore writes back an approximation of x in dt. The forward pass never reads them. */
typedef enum { TT_SAVE_EXACT = 0, TT_SAVE_FP16, TT_SAVE_BF16, TT_SAVE_INT8 } tt_save_fmt;
static inline size_t tt_saved_bytes(tt_save_fmt f, size_t n, size_t c, size_t hw) {
  size_t count = n * c * hw;
  return f == TT_SAVE_INT8 ? (count + 3u) / 4u * 4u + 4u * c : 2u * count;
}

/* Bytes of an activation mask of count elements: whole uint32 words. */
static inline size_t tt_act_mask_bytes(size_t count) { return (count + 31u) / 32u * 4u; }

/* The CPU backend (oneDNN primitives, the reference loops for the rest). threads <= 0 means
 * all cores. tt_cpu_backend_create is the one with the default knobs; k NULL: the defaults.
 * NULL also when k's cpu_isa asks for another hold than the process's (tt_cpu_isa_hold says why). */
tt_backend *tt_cpu_backend_create(int threads);
tt_backend *tt_cpu_backend_create_knobs(int threads, const tt_backend_knobs *k);
/* The reference backend (plain C loops and OpenBLAS): the truth the others are tested against. */
tt_backend *tt_ref_backend_create(int threads);
/* "oneDNN 2.6.3, avx512_core": what the CPU backend runs on (version, effective ISA). */
const char *tt_cpu_backend_info(void);
/* The level the CPU backend's own vectorised loops run at: "avx512f", "avx2" or "baseline"
 * (followed by a note in parentheses when TINYTRAIN_CPU_ISA=avx2 asked for more than the CPU has). */
const char *tt_cpu_backend_loops(void);
/* Whether backend b runs convolution op (a CONV_* op) by tinytrain's own Winograd F(4x4, 3x3)
 * (the oneDNN backend below AVX-512, kernels/cpu/cpu_conv_wg.c): 1 or 0; 0 for any other backend.
 * `plan` counts its calls. */
int tt_cpu_backend_conv_winograd(tt_backend *b, const tt_op_desc *op);
/* Holds this process's CPU code to isa (a TT_CPU_ISA_*; -1: native unless held already): our
 * loops' copy and oneDNN's highest ISA (dnnl_set_max_cpu_isa; with `native` oneDNN is left
 * alone, so ONEDNN_MAX_CPU_ISA works as oneDNN documents it; with avx2 or baseline the call
 * takes precedence over that variable, as oneDNN documents too). A level above the CPU's runs
 * the CPU's own (tt_cpu_backend_loops notes it). One hold per process: the first call fixes it
 * (every CPU backend's creation and ISA query makes one, -1 unless its knobs say), a later
 * call asking for another is refused; so is one that comes after the embedding program fixed
 * oneDNN's ISA above isa. 0, or -1 with why in err (cap bytes; err may be NULL). */
int tt_cpu_isa_hold(int isa, char *err, size_t cap);
/* oneDNN's threading runtime, from the library loaded: "OpenMP" (its threads are libgomp's, the
 * ones OMP_WAIT_POLICY / GOMP_SPINCOUNT govern, as they do the reference loops'), "TBB",
 * "thread pool", "sequential" or "unknown". */
const char *tt_cpu_backend_threading(void);
/* 1 when the CPU computes bf16 natively (oneDNN's effective ISA has AVX512_BF16 or AMX; it
 * honours ONEDNN_MAX_CPU_ISA), else 0: what --precision auto asks on the CPU. */
int tt_cpu_backend_bf16_native(void);
/* 1 when native bf16 is also faster than fp32 in oneDNN's kernels here (AMX; AVX512_BF16 without
 * AMX on a CPU that is not Intel's), else 0: the CPU cost model's bf16 rate follows it. */
int tt_cpu_backend_bf16_fast(void);

#ifdef __cplusplus
}
#endif
#endif
