/* kernels/ref/ref.h — what the reference backend lends the other host backends (the oneDNN
 * CPU backend, kernels/cpu/): its state and error buffer, fp16 and bf16 conversion, host memory, and the
 * plain loops the CPU backend runs as they are. Public to kernels/ only; everything else of the
 * reference backend (convolution and linear on OpenBLAS, their workspaces, the threaded sgemm)
 * is in ref_internal.h.
 *
 * Threading: OpenMP with schedule(static) and an explicit num_threads on every loop, so a
 * given backend (thread count) gives bit-identical results run after run.
 *
 * A backend whose impl starts with a tt_ref_state (the oneDNN backend's does) may call every
 * tt_ref_ function here with its own tt_backend: they read only the thread count and the
 * error buffer.
 */
#ifndef TT_REF_H
#define TT_REF_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../backend.h"
#include "../kernel_math.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_ref_state {
  int threads; /* OpenMP thread count, >= 1 (OpenBLAS runs single-threaded inside them) */
  char err[1024]; /* last error message, one line */
  int nhwc_pool; /* 1: the pooling loops also take NHWC descs (the CPU backend's, for what oneDNN does not
                  * run there: fp16, an accumulating dx, the compact index entries); 0 in the reference
                  * backend itself, which runs NCHW only and refuses another layout */
} tt_ref_state;

/* ---- ref_state.c: the state, the failure helper and the checks every op runs; it calls no
 * other file of kernels/ref/ ---- */
/* Fills st for `threads` (<= 0: all cores). */
void tt_ref_state_init(tt_ref_state *st, int threads);
/* Records a message in the backend (prefixed by nothing; callers name the op) and returns -1. */
int tt_ref_fail(tt_backend *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static inline int tt_ref_threads(tt_backend *b) { return ((tt_ref_state *)b->impl)->threads; }

/* Loops shorter than this run on one thread: the fork/join costs more than the work. */
#define TT_REF_PAR_MIN 32768

/* IEEE half <-> float, inline for the hot loops; tt_f16_to_f32 / tt_f32_to_f16 wrap these.
 * f32 -> f16 rounds to nearest even; overflow (|f| >= 65520) gives inf; NaN stays a quiet NaN
 * keeping the top payload bits; values below half the smallest subnormal become signed zero. */
static inline float tt_ref_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  float f;
  if (e == 0) {
    f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
    return sign ? -f : f;
  }
  if (e == 31)
    bits = sign | 0x7f800000u | (m << 13);
  else
    bits = sign | ((e + 112u) << 23) | (m << 13);
  memcpy(&f, &bits, 4);
  return f;
}
static inline uint16_t tt_ref_f2h(float f) {
  uint32_t x, ax, sign, h;
  memcpy(&x, &f, 4);
  sign = (x >> 16) & 0x8000u;
  ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) /* inf or NaN */
    return (uint16_t)(sign | (ax > 0x7f800000u ? (0x7e00u | ((ax >> 13) & 0x3ffu)) : 0x7c00u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
  if (ax < 0x38800000u) {                                     /* half subnormal or zero */
    uint32_t e = ax >> 23, mant, shift, rem, halfway;
    if (ax <= 0x33000000u) return (uint16_t)sign; /* <= 2^-25: ties to even zero */
    mant = (ax & 0x7fffffu) | 0x800000u;
    shift = 126u - e; /* 14..24 */
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1u);
    halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  h = (ax >> 13) - (112u << 10);
  {
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  }
  return (uint16_t)(sign | h);
}

/* Load/store one element of a dt tensor as fp32 (fp16 and bf16 round to nearest even on
 * store). Callers check dt first (tt_ref_dt_check): anything not fp16 or bf16 is read as fp32. */
static inline float tt_ref_ld(tt_dtype dt, const void *p, size_t i) {
  return dt == TT_F16 ? tt_ref_h2f(((const uint16_t *)p)[i])
                      : dt == TT_BF16 ? tt_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static inline void tt_ref_st(tt_dtype dt, void *p, size_t i, float v) {
  if (dt == TT_F16 || dt == TT_BF16) /* both 16-bit words */
    ((uint16_t *)p)[i] = dt == TT_F16 ? tt_ref_f2h(v) : tt_bf16_from_f32(v);
  else
    ((float *)p)[i] = v;
}
/* The dtype check of every host op (ref_state.c): fp32, fp16 and bf16 are computed (16-bit types widen to
 * fp32 per element); anything else fails with "<op>: unknown dtype N (fp32, fp16 or bf16)". */
int tt_ref_dt_check(tt_backend *b, const char *op, tt_dtype dt);
/* The outputs [*o0, *o1] (inclusive; empty when *o0 > *o1) along one pooling axis whose windows
 * contain input position i: o*stride - pad <= i <= o*stride - pad + k - 1, 0 <= o < out. Shared by
 * the reference's and the CPU backend's gathers, so both sum the same windows. */
static inline void tt_ref_pool_covering(int i, int pad, int k, int stride, int out, int *o0, int *o1) {
  int a = i + pad - k + 1;
  *o0 = a <= 0 ? 0 : (a + stride - 1) / stride;
  *o1 = (i + pad) / stride;
  if (*o1 > out - 1) *o1 = out - 1;
}
/* Gradient-output store: beta == 0 overwrites (never 0*old, which would keep a NaN). */
static inline void tt_ref_st_beta(tt_dtype dt, void *p, size_t i, float v, float beta) {
  if (beta != 0.0f) v += beta * tt_ref_ld(dt, p, i);
  tt_ref_st(dt, p, i, v);
}
static inline float tt_ref_beta_f32(float old, float v, float beta) {
  return beta != 0.0f ? beta * old + v : v;
}

/* ref_convert.c: converts count elements of a dt tensor (fp32, fp16, bf16) into fp32 dst (a plain copy for fp32). */
void tt_ref_to_f32(tt_backend *b, tt_dtype dt, const void *src, float *dst, size_t count);
/* Converts count fp32 elements into dt dst. */
void tt_ref_from_f32(tt_backend *b, tt_dtype dt, const float *src, void *dst, size_t count);

/* Dropout masks, activation derivatives and optimizer element updates are in
 * kernels/kernel_math.h, shared with the CUDA backend. */

/* ---- host memory and staging (ref_backend.c): the arena is host memory, copies are memmove
 * and done when they return, events are one immutable token ---- */
void *tt_ref_arena_alloc(tt_backend *b, size_t bytes);
void tt_ref_arena_free(tt_backend *b, void *p);
int tt_ref_upload(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes);
int tt_ref_download(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes);
int tt_ref_zero(tt_backend *b, void *p, size_t bytes);
int tt_ref_sync(tt_backend *b);
void *tt_ref_host_alloc(tt_backend *b, size_t bytes);
void tt_ref_host_free(tt_backend *b, void *p);
void *tt_ref_event_create(tt_backend *b);
void tt_ref_event_destroy(tt_backend *b, void *ev);
int tt_ref_event_sync(tt_backend *b, void *ev);
int tt_ref_upload_async(tt_backend *b, void *dst_dev, const void *src_host, size_t bytes, void *done);
int tt_ref_download_async(tt_backend *b, void *dst_host, const void *src_dev, size_t bytes, void *done);

/* ref_elementwise.c: out[ch] = beta*out[ch] + sum over (n, hw) of t[n, ch, hw]; fp32 out. */
void tt_ref_channel_sum(tt_backend *b, int n, int c, size_t hw, tt_dtype dt, const void *t, float *out, float beta);


/* The reference answer to op_workspace (ref_backend.c): conv and linear as their own queries,
 * attention its per-thread scratch, else 0. The CPU backend answers so for the ops it runs on
 * the reference loops. */
size_t tt_ref_op_workspace(tt_backend *b, const tt_op_desc *op);

/* ---- ops, one table entry each (see backend.h for semantics) ---- */
/* ref_bn.c */
TT_BACKEND_DECLARE_BN(tt_ref)
int tt_ref_bn_apply(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma, const float *bias,
                    const float *save_mean, const float *save_invstd, void *y);
/* batch norm + add + ReLU as one call (backend.h bn_fwd_train_add_relu, bn_bwd_add_relu): the
 * reference's own loops composed per element, bit for bit bn_fwd_train, add, act_fwd(RELU) and
 * act_bwd(RELU) (or act_bwd_mask), accumulate, bn_bwd */
int tt_ref_bn_fwd_train_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                                 const float *bias, const void *s, void *y, float *running_mean, float *running_var,
                                 float momentum, float eps, float *save_mean, float *save_invstd, int update_running,
                                 void *ws, size_t ws_bytes);
int tt_ref_bn_bwd_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *y,
                           const uint32_t *mask, void *dy, const float *gamma, const float *save_mean,
                           const float *save_invstd, void *dx, void *ds, float *dgamma, float *dbias, float beta_dx,
                           float beta_s, float beta_param, void *ws, size_t ws_bytes);
/* ref_pool.c: max and average pooling, the compact max-pool winners, global average pooling */
TT_BACKEND_DECLARE_POOL(tt_ref)
/* ref_elementwise.c (check_finite: ref_loss_optim.c) */
TT_BACKEND_DECLARE_ELEMENTWISE(tt_ref)
/* backend.h's cast_multi: each segment as `cast` casts it, a KRSC one (tt_cast_seg.rs > 0) transposed
 * while converting; _with takes the plain casts' function (the CPU backend passes its own). */
int tt_ref_cast_multi(tt_backend *b, const tt_cast_seg *segs, int nseg, tt_dtype src_dt, tt_dtype dst_dt);
int tt_ref_cast_multi_with(tt_backend *b, tt_cast_fn *cast, const tt_cast_seg *segs, int nseg, tt_dtype src_dt, tt_dtype dst_dt);
TT_BACKEND_DECLARE_SAVE_COPY(tt_ref)
/* ref_layernorm.c, ref_attention.c */
size_t tt_ref_ln_workspace(tt_backend *b, int rows, int f, tt_dtype dt); /* 0, or TT_WS_ERROR on a bad call */
TT_BACKEND_DECLARE_LN_ATTN(tt_ref)
/* ref_attention.c. Attention's workspace (bwd 0: TT_OP_ATTN_FWD, 1: TT_OP_ATTN_BWD) is
 * per-thread fp32 scratch, so it depends on the backend's thread count; TT_WS_ERROR (with the
 * reason recorded) on a bad desc. */
size_t tt_ref_attn_workspace(tt_backend *b, const tt_attn_desc *d, tt_dtype dt, int bwd);
/* ref_tokens.c: patch tokens (class token, position embedding) and token pooling */
TT_BACKEND_DECLARE_TOKENS(tt_ref)
/* ref_loss_optim.c */
TT_BACKEND_DECLARE_LOSS_OPTIM(tt_ref)

#ifdef __cplusplus
}
#endif
#endif
