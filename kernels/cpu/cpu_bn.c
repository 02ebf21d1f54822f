/* kernels/cpu/cpu_bn.c — batch norm on the CPU backend: our vectorised loops in fp32, bf16 and
 * fp16 storage (computed in fp32, rounded once on store); anything else (or a bad argument) goes
 * to the reference, which checks and reports.
 *
 * Why not oneDNN: 2.6's plain-layout batch norm (ncsp) ran 6-8x slower than these loops (9.9
 * against 1.6 ms forward, 19.3 against 2.3 ms backward for 128x32x28x28 on one thread). Why not
 * the reference loops: they are scalar. The spans are cpu_vec.h's per-ISA copies over fixed shares.
 *
 * Results agree with the reference's to float rounding: sums are taken in float over blocks
 * (CPU_BN_BLOCK elements of a plane, or a row block's partial vector in NHWC) in vector lanes,
 * the blocks added in double, in an order fixed by the shape and the machine's vector width (so
 * bit-identical run to run on one machine, for any thread count). bf16 storage runs the fp32
 * expressions in spans that widen and round inside the vectorised loop (the same body, written
 * once: CPU_VEC_TWINS); fp16 runs the fp32 spans on chunks widened on the stack.
 *
 * bn_fwd_train_relu and bn_bwd_relu (backend.h) are these loops with the ReLU folded in: forward
 * applied before the store, backward into each read of dy with the mask recomputed from x and the
 * forward's constants, so the ReLU's own passes (read and write y; read y and dy, write dx) are gone.
 *
 * x [n, c, hw]: per channel over planes when hw > 1 (NCHW), by fixed blocks of rows when
 * hw == 1 (NHWC as [N*H*W, c, 1]). Workspace: the NHWC rows' per-block partial sums
 * (tt_cpu_bn_workspace, answered by op_workspace), none otherwise.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_internal.h"
#include "cpu_vec.h"

#define CPU_BN_BLOCK 4096 /* floats summed in vector lanes before going to double */

/* ---- the spans, fp32 and bf16 storage from one body each (bf16 widened and rounded in the loop:
 * no stack round trip); fp16 runs the fp32 forms on chunks widened on the stack ---- */

/* Planes (n elements of a channel's plane): sums in float over CPU_BN_BLOCK blocks, into doubles. */

/* sums of d = x - shift and of d^2, added into *s and *q (one pass for the statistics) */
#define CPU_BN_SUM2(sfx, T, LD, ST)                                                          \
  CPU_VEC_FN(cpu_bn_sum2_##sfx, (const T *x, size_t n, float shift, double *s, double *q), (x, n, shift, s, q), { \
    size_t i0, i;                                                                            \
    for (i0 = 0; i0 < n; i0 += CPU_BN_BLOCK) {                                               \
      size_t e = n - i0 < CPU_BN_BLOCK ? n - i0 : CPU_BN_BLOCK;                              \
      float a = 0.0f, b = 0.0f;                                                              \
      _Pragma("omp simd reduction(+ : a, b)") for (i = 0; i < e; i++) {                     \
        float v, d;                                                                          \
        LD(x, i0 + i, v);                                                                    \
        d = v - shift;                                                                       \
        a += d;                                                                              \
        b += d * d;                                                                          \
      }                                                                                      \
      *s += a;                                                                               \
      *q += b;                                                                               \
    }                                                                                        \
  })
CPU_VEC_TWINS(CPU_BN_SUM2)

/* sum of (x - m)^2 */
#define CPU_BN_SQDEV(sfx, T, LD, ST)                                                         \
  CPU_VEC_FN_RET(double, cpu_bn_sqdev_##sfx, (const T *x, size_t n, float m), (x, n, m), {   \
    double acc = 0.0;                                                                        \
    size_t i0, i;                                                                            \
    for (i0 = 0; i0 < n; i0 += CPU_BN_BLOCK) {                                               \
      size_t e = n - i0 < CPU_BN_BLOCK ? n - i0 : CPU_BN_BLOCK;                              \
      float a = 0.0f;                                                                        \
      _Pragma("omp simd reduction(+ : a)") for (i = 0; i < e; i++) {                        \
        float v, d;                                                                          \
        LD(x, i0 + i, v);                                                                    \
        d = v - m;                                                                           \
        a += d * d;                                                                          \
      }                                                                                      \
      acc += a;                                                                              \
    }                                                                                        \
    return acc;                                                                              \
  })
CPU_VEC_TWINS(CPU_BN_SQDEV)

/* The apply's output y with the ReLU after the batch norm folded in (RELU 1: backend.h
 * bn_fwd_train_relu): act_fwd(RELU)'s rule (a NaN kept, anything else not > 0 as +0) applied
 * before the store, which gives the bits the ReLU gives on the stored y (rounding keeps the sign
 * and a NaN, and a positive that rounds to zero rounds to +0). RELU is a literal 0 or 1. */
#define CPU_BN_RELU_OUT(RELU, y)                              \
  do {                                                        \
    if (RELU) y = (((y) > 0.0f) | ((y) != (y))) ? (y) : 0.0f; \
  } while (0)

/* y = (x - m) * k + sh (then the ReLU: CPU_BN_RELU_OUT) */
#define CPU_BN_AFFINE_(name, T, LD, ST, POS, RELU)                                               \
  CPU_VEC_FN(name, (const T *x, T *y, size_t n, float m, float k, float sh), (x, y, n, m, k, sh), { \
    size_t i;                                                                                \
    CPU_VEC_SIMD for (i = 0; i < n; i++) {                                                   \
      float v, o;                                                                            \
      LD(x, i, v);                                                                           \
      o = (v - m) * k + sh;                                                                  \
      CPU_BN_RELU_OUT(RELU, o);                                                              \
      ST(y, i, o);                                                                           \
    }                                                                                        \
  })

/* The backward's dy, with the ReLU's backward folded in (RELU 1: backend.h bn_bwd_relu): d =
 * element j of g, or 0 where the forward's output for v, (v - mean) * fk + fb (the apply's
 * expression) stored as T, is not > 0. POS(y): whether y stored as T is > 0 (bf16: rounded as
 * CPU_VEC_ST_BF16 rounds; a NaN is not). RELU is a literal 0 or 1. */
#define CPU_BN_POS_F32(y) ((y) > 0.0f)
#define CPU_BN_POS_BF16(y) cpu_bn_pos_bf16(y)
static inline int cpu_bn_pos_bf16(float y) {
  uint32_t u;
  memcpy(&u, &y, 4);
  return u - 0x8001u <= 0x7f800000u - 0x8001u; /* rounds to a bf16 in (0, inf]: bits 0x8001 to 0x7f800000 */
}
#define CPU_BN_DY(LD, POS, RELU, g, j, v, mean, fk, fb, d)        \
  do {                                                             \
    LD(g, j, d);                                                   \
    if (RELU) d = POS(((v) - (mean)) * (fk) + (fb)) ? d : 0.0f;    \
  } while (0)

/* sums of d and of d * (x - m); d: dy, or with RELU the ReLU's backward folded in (CPU_BN_DY, with
 * the forward's k and bias fk, fb) */
#define CPU_BN_BWD_SUMS_(name, T, LD, ST, POS, RELU)                                                    \
  CPU_VEC_FN(name, (const T *x, const T *dy, size_t n, float m, float fk, float fb, double *sdy, double *sdyx), \
             (x, dy, n, m, fk, fb, sdy, sdyx), {                                                    \
    size_t i0, i;                                                                            \
    for (i0 = 0; i0 < n; i0 += CPU_BN_BLOCK) {                                               \
      size_t e = n - i0 < CPU_BN_BLOCK ? n - i0 : CPU_BN_BLOCK;                              \
      float a = 0.0f, b = 0.0f;                                                              \
      _Pragma("omp simd reduction(+ : a, b)") for (i = 0; i < e; i++) {                     \
        float v, g;                                                                          \
        LD(x, i0 + i, v);                                                                    \
        CPU_BN_DY(LD, POS, RELU, dy, i0 + i, v, m, fk, fb, g);                               \
        a += g;                                                                              \
        b += g * (v - m);                                                                    \
      }                                                                                      \
      *sdy += a;                                                                             \
      *sdyx += b;                                                                            \
    }                                                                                        \
  })

/* dx = beta*dx + a * (d - mdy - (x - m) * k), k = invstd * mean(d * xhat); d as above, with the
 * forward's k = a */
#define CPU_BN_BWD_DX_(name, T, LD, ST, POS, RELU)                                                  \
  CPU_VEC_FN(name, (const T *x, const T *dy, T *dx, size_t n, float m, float a, float mdy, float k, float fb, \
                    float beta),                                                                              \
             (x, dy, dx, n, m, a, mdy, k, fb, beta), {                                                        \
    size_t i;                                                                                \
    if (beta == 0.0f) {                                                                      \
      CPU_VEC_SIMD for (i = 0; i < n; i++) {                                                 \
        float v, g, o;                                                                       \
        LD(x, i, v);                                                                         \
        CPU_BN_DY(LD, POS, RELU, dy, i, v, m, a, fb, g);                                     \
        o = a * (g - mdy - (v - m) * k);                                                     \
        ST(dx, i, o);                                                                        \
      }                                                                                      \
    } else {                                                                                 \
      CPU_VEC_SIMD for (i = 0; i < n; i++) {                                                 \
        float v, g, p, o;                                                                    \
        LD(x, i, v);                                                                         \
        CPU_BN_DY(LD, POS, RELU, dy, i, v, m, a, fb, g);                                     \
        LD(dx, i, p);                                                                        \
        o = beta * p + a * (g - mdy - (v - m) * k);                                          \
        ST(dx, i, o);                                                                        \
      }                                                                                      \
    }                                                                                        \
  })

/* Rows (w channels of each of nr rows ld apart; per-channel constants in arrays; ps, pt: a row
 * block's fp32 partial sums per channel, rows added in order). A call takes a block of rows: at
 * c = 32 a row is two vectors, and a call per row cost more than its arithmetic. */

/* ps += r - shift, pt += (r - shift)^2, per channel */
#define CPU_BN_ROW_SUM2(sfx, T, LD, ST)                                                      \
  CPU_VEC_FN(cpu_bn_row_sum2_##sfx, (float *ps, float *pt, const T *r, size_t ld, size_t nr, const float *shift, \
                                     size_t w),                                                                  \
             (ps, pt, r, ld, nr, shift, w), {                                                                    \
    size_t i, j;                                                                             \
    for (i = 0; i < nr; i++, r += ld) {                                                      \
      CPU_VEC_SIMD for (j = 0; j < w; j++) {                                                 \
        float v, d;                                                                          \
        LD(r, j, v);                                                                         \
        d = v - shift[j];                                                                    \
        ps[j] += d;                                                                          \
        pt[j] += d * d;                                                                      \
      }                                                                                      \
    }                                                                                        \
  })
CPU_VEC_TWINS(CPU_BN_ROW_SUM2)

/* ps += (r - mean)^2, per channel */
#define CPU_BN_ROW_SQDEV(sfx, T, LD, ST)                                                     \
  CPU_VEC_FN(cpu_bn_row_sqdev_##sfx, (float *ps, const T *r, size_t ld, size_t nr, const float *mean, size_t w), \
             (ps, r, ld, nr, mean, w), {                                                                         \
    size_t i, j;                                                                             \
    for (i = 0; i < nr; i++, r += ld) {                                                      \
      CPU_VEC_SIMD for (j = 0; j < w; j++) {                                                 \
        float v, d;                                                                          \
        LD(r, j, v);                                                                         \
        d = v - mean[j];                                                                     \
        ps[j] += d * d;                                                                      \
      }                                                                                      \
    }                                                                                        \
  })
CPU_VEC_TWINS(CPU_BN_ROW_SQDEV)

/* x rounded to T and widened back (bf16: CPU_VEC_ST_BF16's rounding; fp32: x). A statement. */
#define CPU_BN_RT_F32(f) (void)0
#define CPU_BN_RT_BF16(f)                                                                                          \
  do {                                                                                                             \
    uint32_t u_;                                                                                                   \
    memcpy(&u_, &(f), 4);                                                                                          \
    u_ = ((u_ & 0x7fffffffu) > 0x7f800000u ? (u_ | 0x400000u) : (u_ + 0x7fffu + ((u_ >> 16) & 1u))) & 0xffff0000u; \
    memcpy(&(f), &u_, 4);                                                                                          \
  } while (0)

/* y = relu(round(round((x - m) * k + sh) + s)) (backend.h bn_fwd_train_add_relu: the apply
 * rounded to T as bn_fwd_train stores it, plus the shortcut in fp32 rounded to T as add stores it,
 * then the ReLU, exact on a value already in T); y may be s exactly (each s read before its y is
 * written). Planes: scalar constants. */
#define CPU_BN_AFFINE_ADD_RELU_(name, T, LD, ST, RT)                                                        \
  CPU_VEC_FN(name, (const T *x, const T *sc, T *y, size_t n, float m, float k, float sh), (x, sc, y, n, m, k, sh), { \
    size_t i;                                                                                               \
    CPU_VEC_SIMD for (i = 0; i < n; i++) {                                                                  \
      float v, t, a;                                                                                        \
      LD(x, i, v);                                                                                          \
      LD(sc, i, a);                                                                                         \
      t = (v - m) * k + sh;                                                                                 \
      RT(t);                                                                                                \
      t = t + a;                                                                                            \
      CPU_BN_RELU_OUT(1, t);                                                                                \
      ST(y, i, t);                                                                                          \
    }                                                                                                       \
  })
CPU_BN_AFFINE_ADD_RELU_(cpu_bn_affine_add_relu_f32, float, CPU_VEC_LD_F32, CPU_VEC_ST_F32, CPU_BN_RT_F32)
CPU_BN_AFFINE_ADD_RELU_(cpu_bn_affine_add_relu_bf16, uint16_t, CPU_VEC_LD_BF16, CPU_VEC_ST_BF16, CPU_BN_RT_BF16)

/* Rows: per-channel constants (the same as above). */
#define CPU_BN_ROW_AFFINE_ADD_RELU_(name, T, LD, ST, RT)                                                   \
  CPU_VEC_FN(name, (const T *r, const T *sc, T *o, size_t ld, size_t nr, const float *mean, const float *k, \
                    const float *sh, size_t w),                                                            \
             (r, sc, o, ld, nr, mean, k, sh, w), {                                                         \
    size_t i, j;                                                                                           \
    for (i = 0; i < nr; i++, r += ld, sc += ld, o += ld) {                                                 \
      CPU_VEC_SIMD for (j = 0; j < w; j++) {                                                               \
        float v, t, a;                                                                                     \
        LD(r, j, v);                                                                                       \
        LD(sc, j, a);                                                                                      \
        t = (v - mean[j]) * k[j] + sh[j];                                                                  \
        RT(t);                                                                                             \
        t = t + a;                                                                                         \
        CPU_BN_RELU_OUT(1, t);                                                                             \
        ST(o, j, t);                                                                                       \
      }                                                                                                    \
    }                                                                                                      \
  })
CPU_BN_ROW_AFFINE_ADD_RELU_(cpu_bn_row_affine_add_relu_f32, float, CPU_VEC_LD_F32, CPU_VEC_ST_F32, CPU_BN_RT_F32)
CPU_BN_ROW_AFFINE_ADD_RELU_(cpu_bn_row_affine_add_relu_bf16, uint16_t, CPU_VEC_LD_BF16, CPU_VEC_ST_BF16, CPU_BN_RT_BF16)

/* fp16: apply outputs y [w] made add_relu's (shortcut a): rounded, a added, rounded, the ReLU */
static void cpu_bn_add_relu_f16(float *y, const float *a, size_t w) {
  size_t j;
  for (j = 0; j < w; j++) {
    float t = tt_ref_h2f(tt_ref_f2h(y[j])) + a[j];
    t = tt_ref_h2f(tt_ref_f2h(t));
    CPU_BN_RELU_OUT(1, t);
    y[j] = t;
  }
}

/* o = (r - mean) * k + sh, per channel: the forward's apply (cpu_bn_affine's expression; then the
 * ReLU: CPU_BN_RELU_OUT) */
#define CPU_BN_ROW_AFFINE_(name, T, LD, ST, POS, RELU)                                          \
  CPU_VEC_FN(name, (const T *r, T *o, size_t ld, size_t nr, const float *mean, const float *k, const float *sh, \
                    size_t w),                                                                                 \
             (r, o, ld, nr, mean, k, sh, w), {                                                                 \
    size_t i, j;                                                                             \
    for (i = 0; i < nr; i++, r += ld, o += ld) {                                             \
      CPU_VEC_SIMD for (j = 0; j < w; j++) {                                                 \
        float v, y;                                                                          \
        LD(r, j, v);                                                                         \
        y = (v - mean[j]) * k[j] + sh[j];                                                    \
        CPU_BN_RELU_OUT(RELU, y);                                                            \
        ST(o, j, y);                                                                         \
      }                                                                                      \
    }                                                                                        \
  })

/* ps += d, pt += d * (r - mean), per channel (d: CPU_BN_DY) */
#define CPU_BN_ROW_BWD_SUMS_(name, T, LD, ST, POS, RELU)                                                        \
  CPU_VEC_FN(name, (float *ps, float *pt, const T *r, const T *g, size_t ld, size_t nr, const float *mean,   \
                    const float *fk, const float *fb, size_t w),                                            \
             (ps, pt, r, g, ld, nr, mean, fk, fb, w), {                                                     \
    size_t i, j;                                                                                            \
    for (i = 0; i < nr; i++, r += ld, g += ld) {                                                            \
      CPU_VEC_SIMD for (j = 0; j < w; j++) {                                                                \
        float v, d;                                                                                         \
        LD(r, j, v);                                                                                        \
        CPU_BN_DY(LD, POS, RELU, g, j, v, mean[j], fk[j], fb[j], d);                                        \
        ps[j] += d;                                                                                         \
        pt[j] += d * (v - mean[j]);                                                                         \
      }                                                                                                     \
    }                                                                                                       \
  })

/* o = beta*o + a * (d - mdy - (r - mean) * k), per channel (cpu_bn_bwd_dx's expression; d:
 * CPU_BN_DY, k = a, the forward's invstd * gamma, when RELU) */
#define CPU_BN_ROW_BWD_DX_(name, T, LD, ST, POS, RELU)                                                      \
  CPU_VEC_FN(name, (const T *r, const T *g, T *o, size_t ld, size_t nr, const float *mean, const float *a,  \
                    const float *mdy, const float *k, const float *fb, float beta, size_t w),               \
             (r, g, o, ld, nr, mean, a, mdy, k, fb, beta, w), {                                             \
    size_t i, j;                                                                                            \
    for (i = 0; i < nr; i++, r += ld, g += ld, o += ld) {                                                   \
      if (beta == 0.0f) {                                                                                   \
        CPU_VEC_SIMD for (j = 0; j < w; j++) {                                                              \
          float v, d, y;                                                                                    \
          LD(r, j, v);                                                                                      \
          CPU_BN_DY(LD, POS, RELU, g, j, v, mean[j], a[j], fb[j], d);                                       \
          y = a[j] * (d - mdy[j] - (v - mean[j]) * k[j]);                                                   \
          ST(o, j, y);                                                                                      \
        }                                                                                                   \
      } else {                                                                                              \
        CPU_VEC_SIMD for (j = 0; j < w; j++) {                                                              \
          float v, d, p, y;                                                                                 \
          LD(r, j, v);                                                                                      \
          CPU_BN_DY(LD, POS, RELU, g, j, v, mean[j], a[j], fb[j], d);                                       \
          LD(o, j, p);                                                                                      \
          y = beta * p + a[j] * (d - mdy[j] - (v - mean[j]) * k[j]);                                        \
          ST(o, j, y);                                                                                      \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
  })

/* each with and without the ReLU (base_relu_*), in fp32 and bf16 storage (base_f32, base_bf16) */
#define CPU_BN_FOUR(DEF, base)                                                    \
  DEF(base##_f32, float, CPU_VEC_LD_F32, CPU_VEC_ST_F32, CPU_BN_POS_F32, 0)       \
  DEF(base##_relu_f32, float, CPU_VEC_LD_F32, CPU_VEC_ST_F32, CPU_BN_POS_F32, 1)  \
  DEF(base##_bf16, uint16_t, CPU_VEC_LD_BF16, CPU_VEC_ST_BF16, CPU_BN_POS_BF16, 0) \
  DEF(base##_relu_bf16, uint16_t, CPU_VEC_LD_BF16, CPU_VEC_ST_BF16, CPU_BN_POS_BF16, 1)
CPU_BN_FOUR(CPU_BN_AFFINE_, cpu_bn_affine)
CPU_BN_FOUR(CPU_BN_ROW_AFFINE_, cpu_bn_row_affine)
CPU_BN_FOUR(CPU_BN_BWD_SUMS_, cpu_bn_bwd_sums)
CPU_BN_FOUR(CPU_BN_BWD_DX_, cpu_bn_bwd_dx)
CPU_BN_FOUR(CPU_BN_ROW_BWD_SUMS_, cpu_bn_row_bwd_sums)
CPU_BN_FOUR(CPU_BN_ROW_BWD_DX_, cpu_bn_row_bwd_dx)

/* ---- batch norm on planes: hw > 1, x [n, c, hw] (NCHW). A channel is one thread's: its n
 * planes are walked in order, in chunks of CPU_VEC_CHUNK (fp16/bf16, widened) or whole
 * (fp32, the span functions' CPU_BN_BLOCK blocks), so the bits depend on the shape only. ---- */


/* One-pass statistics. Shifted by a sample of the channel (cpu_bn_plane_shift), the sums of
 * d = x - shift and of d^2 are small where x has a large mean and a small spread, so fp32 blocks
 * keep them; then mean = shift + sum d / m and the squared deviations sq = sum d^2 - (sum d)^2 / m
 * (double). That cancels when the shift is far from the mean against the spread: where
 * (mean - shift)^2 > CPU_BN_SHIFT_MAX * var (a rare outlier for a first value), or var <= 0, the
 * caller takes a second pass over (x - mean)^2 instead, as the two-pass loops did. Either way
 * the choice depends on the data only (never on the thread count). */
#define CPU_BN_SHIFT_MAX 8.0

static float cpu_bn_ld1(tt_dtype dt, const void *p, size_t i) {
  if (dt == TT_F32) return ((const float *)p)[i];
  return dt == TT_BF16 ? tt_bf16_to_f32(((const uint16_t *)p)[i]) : tt_ref_h2f(((const uint16_t *)p)[i]);
}

/* The shift: the float mean of CPU_BN_SHIFT_SAMPLES of the channel's m values spread evenly over
 * it (all of them when m is smaller), summed in sample order. It lies within a fraction of a
 * spread of the mean almost always. The channel's first value, the shift before, was more than
 * CPU_BN_SHIFT_MAX^0.5 spreads off in some channel of most wide layers (about 0.5% of a normal
 * channel's values are), which sent every channel of the call through the exact second pass: a
 * third read of x. It depends on the data only. Planes: channel ch of x [n, c, hw]. */
#define CPU_BN_SHIFT_SAMPLES 32
#define CPU_BN_SHIFT_STACK 2048 /* channels whose rows' shifts are made once, on the stack (8 KiB) */
static float cpu_bn_plane_shift(tt_dtype dt, const void *x, int n, int c, size_t hw, int ch) {
  const size_t m = (size_t)n * hw, ns = m < CPU_BN_SHIFT_SAMPLES ? m : CPU_BN_SHIFT_SAMPLES;
  float sum = 0.0f;
  size_t s;
  for (s = 0; s < ns; s++) {
    const size_t e = s * m / ns; /* the channel's element e: plane e / hw, position e % hw */
    sum += cpu_bn_ld1(dt, x, ((e / hw) * (size_t)c + (size_t)ch) * hw + e % hw);
  }
  return sum / (float)ns;
}

/* whether the one-pass sq of m values with shifted sum s and square sum q needs the exact pass */
static int cpu_bn_need_sqdev(double s, double q, size_t m) {
  double md = s / (double)m, var = q / (double)m - md * md;
  return !(var > 0.0) || md * md > CPU_BN_SHIFT_MAX * var;
}

/* The channel's shifted sums over its planes (the pass over x), or, when mean is not NULL, the
 * sum of (x - mean)^2 into *s (the exact second pass). */
static void cpu_bn_plane_sums(tt_dtype dt, const void *x, int n, int c, size_t hw, int ch, float shift, const float *mean,
                              float *buf, double *s, double *q) {
  size_t c0;
  int i;
  *s = 0.0, *q = 0.0;
  for (i = 0; i < n; i++) {
    size_t off = ((size_t)i * (size_t)c + (size_t)ch) * hw;
    if (dt == TT_BF16) {
      const uint16_t *h = (const uint16_t *)x + off;
      if (mean)
        *s += cpu_bn_sqdev_bf16(h, hw, *mean);
      else
        cpu_bn_sum2_bf16(h, hw, shift, s, q);
      continue;
    }
    for (c0 = 0; c0 < hw; c0 += (dt == TT_F32 ? hw : CPU_VEC_CHUNK)) {
      size_t e = dt == TT_F32 ? hw : (hw - c0 < CPU_VEC_CHUNK ? hw - c0 : CPU_VEC_CHUNK);
      const float *v = cpu_vec_view(dt, x, off + c0, buf, e);
      if (mean)
        *s += cpu_bn_sqdev_f32(v, e, *mean);
      else
        cpu_bn_sum2_f32(v, e, shift, s, q);
    }
  }
}

/* The per-channel mean and invstd (not yet times gamma) the forward normalises with.
 * mode TT_CPU_BN_BATCH: batch statistics, written to save_mean/save_invstd (and the running ones
 * moved when update_running); TT_CPU_BN_RUNNING: from the running statistics; TT_CPU_BN_SAVED:
 * save_mean/save_invstd as given (the training forward's own floats, so the same bits). */
static void cpu_bn_given(int mode, int ch, const float *running_mean, const float *running_var, float eps,
                            const float *save_mean, const float *save_invstd, float *mean, float *invstd) {
  if (mode == TT_CPU_BN_RUNNING) {
    *mean = running_mean[ch];
    *invstd = (float)(1.0 / sqrt((double)running_var[ch] + (double)eps));
  } else {
    *mean = save_mean[ch];
    *invstd = save_invstd[ch];
  }
}

static void cpu_bn_fwd_planes(int nt, int n, int c, size_t hw, tt_dtype dt, const void *x, const float *gamma,
                                 const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                                 float eps, float *save_mean, float *save_invstd, int update_running, int mode,
                                 int relu, const void *sc) {
  const size_t m = (size_t)n * hw;
  ptrdiff_t ch;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (ch = 0; ch < c; ch++) {
    float buf[CPU_VEC_CHUNK], out[CPU_VEC_CHUNK];
    float mean, invstd, k;
    size_t c0;
    int i;
    if (mode == TT_CPU_BN_BATCH) {
      float shift = cpu_bn_plane_shift(dt, x, n, c, hw, (int)ch);
      double s, q, mean_d, sq;
      cpu_bn_plane_sums(dt, x, n, c, hw, (int)ch, shift, NULL, buf, &s, &q);
      mean_d = (double)shift + s / (double)m;
      sq = q - s * (s / (double)m);
      if (cpu_bn_need_sqdev(s, q, m)) {
        mean = (float)mean_d;
        cpu_bn_plane_sums(dt, x, n, c, hw, (int)ch, 0.0f, &mean, buf, &sq, &q);
      }
      tt_bn_channel_stats(mean_d, sq, m, eps, momentum, update_running, save_mean + ch, save_invstd + ch,
                          update_running ? running_mean + ch : NULL, update_running ? running_var + ch : NULL);
    }
    cpu_bn_given(mode, (int)ch, running_mean, running_var, eps, save_mean, save_invstd, &mean, &invstd);
    k = invstd * gamma[ch]; /* the one apply every mode shares: y = (x - mean) * k + bias */
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * (size_t)c + (size_t)ch) * hw;
      if (dt == TT_F32) {
        if (sc)
          cpu_bn_affine_add_relu_f32((const float *)x + off, (const float *)sc + off, (float *)y + off, hw, mean, k, bias[ch]);
        else
          (relu ? cpu_bn_affine_relu_f32 : cpu_bn_affine_f32)((const float *)x + off, (float *)y + off, hw, mean, k, bias[ch]);
        continue;
      }
      if (dt == TT_BF16) {
        if (sc)
          cpu_bn_affine_add_relu_bf16((const uint16_t *)x + off, (const uint16_t *)sc + off, (uint16_t *)y + off, hw, mean, k,
                                      bias[ch]);
        else
          (relu ? cpu_bn_affine_relu_bf16 : cpu_bn_affine_bf16)((const uint16_t *)x + off, (uint16_t *)y + off, hw, mean, k,
                                                                bias[ch]);
        continue;
      }
      for (c0 = 0; c0 < hw; c0 += CPU_VEC_CHUNK) {
        size_t e = hw - c0 < CPU_VEC_CHUNK ? hw - c0 : CPU_VEC_CHUNK;
        cpu_vec_widen(dt, x, off + c0, buf, e);
        if (sc) { /* fp16: the apply, then add_relu's roundings on the chunk (buf takes the shortcut) */
          cpu_bn_affine_f32(buf, out, e, mean, k, bias[ch]);
          cpu_vec_widen(dt, sc, off + c0, buf, e);
          cpu_bn_add_relu_f16(out, buf, e);
        } else
          (relu ? cpu_bn_affine_relu_f32 : cpu_bn_affine_f32)(buf, out, e, mean, k, bias[ch]);
        cpu_vec_narrow(dt, out, y, off + c0, e);
      }
    }
  }
}

/* dy's chunk g [w] masked as the ReLU's backward would pass it, in fp16 storage: where the
 * forward's output for r (fp32), (r - mean) * fk + fb rounded to fp16 as the apply stored it, is
 * not > 0, g is 0. The constants are arrays over the chunk (inc 1) or one value (inc 0). */
static void cpu_bn_mask_f16(const float *r, float *g, const float *mean, const float *fk, const float *fb, size_t inc,
                            size_t w) {
  size_t j;
  for (j = 0; j < w; j++) {
    float y = (r[j] - mean[j * inc]) * fk[j * inc] + fb[j * inc];
    if (!(tt_ref_h2f(tt_ref_f2h(y)) > 0.0f)) g[j] = 0.0f;
  }
}

/* The backward on planes; bias not NULL: the ReLU's backward folded in (backend.h bn_bwd_relu). */
static void cpu_bn_bwd_planes(int nt, int n, int c, size_t hw, tt_dtype dt, const void *x, const void *dy,
                                 const float *gamma, const float *bias, const float *save_mean, const float *save_invstd,
                                 void *dx, float *dgamma, float *dbias, float beta_dx, float beta_param) {
  const size_t m = (size_t)n * hw;
  const int relu = bias != NULL;
  ptrdiff_t ch;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (ch = 0; ch < c; ch++) {
    float bx[CPU_VEC_CHUNK], bg[CPU_VEC_CHUNK], bo[CPU_VEC_CHUNK];
    double sdy = 0.0, sdyx = 0.0;
    const float mean = save_mean[ch], invstd = save_invstd[ch], fk = invstd * gamma[ch], fb = relu ? bias[ch] : 0.0f;
    size_t c0;
    int i;
    for (i = 0; i < n; i++) {
      size_t off = ((size_t)i * (size_t)c + (size_t)ch) * hw;
      if (dt == TT_BF16) {
        (relu ? cpu_bn_bwd_sums_relu_bf16 : cpu_bn_bwd_sums_bf16)((const uint16_t *)x + off, (const uint16_t *)dy + off, hw,
                                                                  mean, fk, fb, &sdy, &sdyx);
        continue;
      }
      if (dt == TT_F32) {
        (relu ? cpu_bn_bwd_sums_relu_f32 : cpu_bn_bwd_sums_f32)((const float *)x + off, (const float *)dy + off, hw, mean,
                                                                fk, fb, &sdy, &sdyx);
        continue;
      }
      for (c0 = 0; c0 < hw; c0 += CPU_VEC_CHUNK) { /* fp16: widened chunks, the mask applied to them */
        size_t e = hw - c0 < CPU_VEC_CHUNK ? hw - c0 : CPU_VEC_CHUNK;
        cpu_vec_widen(dt, x, off + c0, bx, e);
        cpu_vec_widen(dt, dy, off + c0, bg, e);
        if (relu) cpu_bn_mask_f16(bx, bg, &mean, &fk, &fb, 0, e);
        cpu_bn_bwd_sums_f32(bx, bg, e, mean, fk, fb, &sdy, &sdyx);
      }
    }
    sdyx *= invstd; /* sum of dy * xhat */
    if (dbias) dbias[ch] = tt_ref_beta_f32(dbias[ch], (float)sdy, beta_param);
    if (dgamma) dgamma[ch] = tt_ref_beta_f32(dgamma[ch], (float)sdyx, beta_param);
    if (!dx) continue;
    {
      float a = gamma[ch] * invstd, mdy = (float)(sdy / (double)m), k = (float)(sdyx / (double)m) * invstd;
      for (i = 0; i < n; i++) {
        size_t off = ((size_t)i * (size_t)c + (size_t)ch) * hw;
        if (dt == TT_F32) {
          (relu ? cpu_bn_bwd_dx_relu_f32 : cpu_bn_bwd_dx_f32)((const float *)x + off, (const float *)dy + off,
                                                              (float *)dx + off, hw, mean, a, mdy, k, fb, beta_dx);
          continue;
        }
        if (dt == TT_BF16) {
          (relu ? cpu_bn_bwd_dx_relu_bf16 : cpu_bn_bwd_dx_bf16)((const uint16_t *)x + off, (const uint16_t *)dy + off,
                                                                (uint16_t *)dx + off, hw, mean, a, mdy, k, fb, beta_dx);
          continue;
        }
        for (c0 = 0; c0 < hw; c0 += CPU_VEC_CHUNK) {
          size_t e = hw - c0 < CPU_VEC_CHUNK ? hw - c0 : CPU_VEC_CHUNK;
          cpu_vec_widen(dt, x, off + c0, bx, e);
          cpu_vec_widen(dt, dy, off + c0, bg, e);
          if (relu) cpu_bn_mask_f16(bx, bg, &mean, &fk, &fb, 0, e);
          if (beta_dx != 0.0f) cpu_vec_widen(dt, dx, off + c0, bo, e);
          cpu_bn_bwd_dx_f32(bx, bg, bo, e, mean, a, mdy, k, fb, beta_dx);
          cpu_vec_narrow(dt, bo, dx, off + c0, e);
        }
      }
    }
  }
}

/* ---- batch norm on rows: hw == 1, x [rows, c] row-major, which is how an NHWC activation
 * [N, H, W, C] comes (the executor passes it as n = N*H*W, c, hw = 1: backend.h's layouts).
 * Threads take fixed blocks of cpu_bn_rows_per_block(c) rows; a block reads its rows
 * contiguously (all c channels, in column chunks of CPU_VEC_CHUNK) into its own fp32 partial
 * vectors [c]; the partials are then added per channel in double, in block order. The blocks
 * depend on the shape only, so the bits do not depend on the thread count. The partials are the
 * only scratch: 2 * blocks * c floats, the planned workspace (tt_cpu_bn_workspace), or malloc'd
 * for a caller that passes less. The apply passes need none (their per-channel constants are
 * made per column chunk on the stack). ---- */

/* rows per block: about 64 Ki values a block (256 rows at c = 256), at least 16 rows */
static size_t cpu_bn_rows_per_block(int c) {
  size_t r = (size_t)65536 / (size_t)c;
  return r > 256 ? 256 : (r < 16 ? 16 : r);
}

static size_t cpu_bn_rows_blocks(size_t rows, int c) { return (rows + cpu_bn_rows_per_block(c) - 1) / cpu_bn_rows_per_block(c); }

size_t tt_cpu_bn_workspace(const tt_op_desc *op) {
  const tt_bn_desc *d = &op->u.bn;
  if ((op->kind != TT_OP_BN_FWD_TRAIN && op->kind != TT_OP_BN_BWD) || d->hw != 1 || d->c <= 1 || d->n <= 0) return 0;
  return 2 * cpu_bn_rows_blocks((size_t)d->n, d->c) * (size_t)d->c * sizeof(float);
}

/* One pass over the rows, per kind (below); the arguments of every kind. */
typedef struct cpu_bn_rows_args {
  int kind;          /* 0: shifted sums (shift: cpu_bn_rows_shift) into part[blk] and part[nblk + blk]; 1: (x - mean)^2
                        into part[blk]; 2: dy and dy * (x - mean) into part[blk], part[nblk + blk]; 3: the forward's
                        apply y = (x - mean) * (invstd * gamma) + bias; 4: dx = beta*dx + gamma*invstd *
                        (dy - mdy - (x - mean) * kk) */
  int relu;          /* a ReLU after this batch norm: kind 3 applies it (bn_fwd_train_relu); kinds 2 and 4 take dy
                        as its output's gradient (bn_bwd_relu; needs bias) */
  size_t rows;
  int c;
  tt_dtype dt;
  const void *x, *dy;
  const void *s;     /* kind 3: the shortcut added before the ReLU (bn_fwd_train_add_relu; relu set too), or NULL */
  void *out;         /* y (3), dx (4) */
  float *part;       /* 2 * nblk vectors of c floats (0-2) */
  const float *shift; /* [c] (0): cpu_bn_rows_shift's, made once; NULL: each block makes its chunk's */
  const float *mean; /* [c] (1-4) */
  const float *invstd; /* [c] (2 with relu, 3, 4); kind 3 with NULL: 1/sqrt(running_var + eps) */
  const float *running_var;
  float eps;
  const float *gamma, *bias; /* [c] (3, 4; 2 with relu) */
  const float *mdy, *kk;     /* [c] (4) */
  float beta;                /* (4) */
} cpu_bn_rows_args;

/* The one-pass sums' shift of channels j0..j0+w of x [rows, c] (cpu_bn_plane_shift's rule over rows) */
static void cpu_bn_rows_shift(tt_dtype dt, const void *x, size_t rows, int c, size_t j0, size_t w, float *shift) {
  const size_t ns = rows < CPU_BN_SHIFT_SAMPLES ? rows : CPU_BN_SHIFT_SAMPLES;
  size_t s, j;
  for (j = 0; j < w; j++) shift[j] = 0.0f;
  for (s = 0; s < ns; s++) {
    const size_t row = s * rows / ns;
    for (j = 0; j < w; j++) shift[j] += cpu_bn_ld1(dt, x, row * (size_t)c + j0 + j);
  }
  for (j = 0; j < w; j++) shift[j] /= (float)ns;
}

/* The block's rows [r0, r1) and channels [j0, j0 + w) through kind's spans in fp32 or bf16 storage:
 * one call for all the rows. k1: the chunk's per-channel constant (shift, or invstd * gamma). */
#define CPU_BN_ROWS_SPANS(sfx, T)                                                                                    \
  do {                                                                                                               \
    /* dy and out are NULL in the statistics passes (kinds 0, 1): no pointer is formed from NULL */                \
    const T *xr = (const T *)A->x + off, *gr = A->dy ? (const T *)A->dy + off : NULL;                                \
    T *orow = A->out ? (T *)A->out + off : NULL;                                                                     \
    const float *mn = A->mean + j0, *fb = A->bias ? A->bias + j0 : NULL;                                             \
    switch (kind) {                                                                                                  \
      case 0: cpu_bn_row_sum2_##sfx(ps + j0, pt + j0, xr, cc, nr, k1, w); break;                                     \
      case 1: cpu_bn_row_sqdev_##sfx(ps + j0, xr, cc, nr, mn, w); break;                                             \
      case 2:                                                                                                        \
        (A->relu ? cpu_bn_row_bwd_sums_relu_##sfx : cpu_bn_row_bwd_sums_##sfx)(ps + j0, pt + j0, xr, gr, cc, nr, mn, \
                                                                               k1, fb, w);                          \
        break;                                                                                                       \
      case 3:                                                                                                        \
        if (A->s)                                                                                                    \
          cpu_bn_row_affine_add_relu_##sfx(xr, (const T *)A->s + off, orow, cc, nr, mn, k1, fb, w);                  \
        else                                                                                                         \
          (A->relu ? cpu_bn_row_affine_relu_##sfx : cpu_bn_row_affine_##sfx)(xr, orow, cc, nr, mn, k1, fb, w);       \
        break;                                                                                                       \
      default:                                                                                                       \
        (A->relu ? cpu_bn_row_bwd_dx_relu_##sfx : cpu_bn_row_bwd_dx_##sfx)(xr, gr, orow, cc, nr, mn, k1, A->mdy + j0, \
                                                                           A->kk + j0, fb, A->beta, w);              \
        break;                                                                                                       \
    }                                                                                                                \
  } while (0)

static void cpu_bn_rows_pass(int nt, const cpu_bn_rows_args *A) {
  const size_t rb = cpu_bn_rows_per_block(A->c), nblk = cpu_bn_rows_blocks(A->rows, A->c), cc = (size_t)A->c;
  const int kind = A->kind;
  const tt_dtype dt = A->dt;
  ptrdiff_t blk;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (blk = 0; blk < (ptrdiff_t)nblk; blk++) {
    float bx[CPU_VEC_CHUNK], bg[CPU_VEC_CHUNK], bo[CPU_VEC_CHUNK], k1[CPU_VEC_CHUNK];
    const size_t r0 = (size_t)blk * rb, r1 = r0 + rb < A->rows ? r0 + rb : A->rows, nr = r1 - r0;
    float *ps = A->part ? A->part + (size_t)blk * cc : NULL, *pt = A->part ? A->part + (nblk + (size_t)blk) * cc : NULL;
    size_t i, j, j0;
    if (kind <= 2) {
      memset(ps, 0, cc * sizeof *ps);
      if (kind != 1) memset(pt, 0, cc * sizeof *pt);
    }
    for (j0 = 0; j0 < cc; j0 += CPU_VEC_CHUNK) {
      const size_t w = cc - j0 < CPU_VEC_CHUNK ? cc - j0 : CPU_VEC_CHUNK;
      /* the chunk's per-channel constants: k1 = shift (0), k1 = invstd * gamma (3, 4 and the ReLU's mask in 2) */
      if (kind == 0) {
        if (A->shift)
          memcpy(k1, A->shift + j0, w * sizeof *k1);
        else
          cpu_bn_rows_shift(dt, A->x, A->rows, A->c, j0, w, k1);
      } else if (kind == 3 || kind == 4 || (kind == 2 && A->relu)) {
        for (j = 0; j < w; j++) {
          float is = A->invstd ? A->invstd[j0 + j] : (float)(1.0 / sqrt((double)A->running_var[j0 + j] + (double)A->eps));
          k1[j] = is * A->gamma[j0 + j]; /* as the planes' k = invstd * gamma */
        }
      }
      if (dt != TT_F16) { /* fp32 and bf16: the spans take the block's rows in place */
        const size_t off = r0 * cc + j0;
        if (dt == TT_BF16)
          CPU_BN_ROWS_SPANS(bf16, uint16_t);
        else
          CPU_BN_ROWS_SPANS(f32, float);
        continue;
      }
      for (i = r0; i < r1; i++) { /* fp16: a row's chunk at a time, widened on the stack */
        const size_t off = i * cc + j0;
        const float *r = cpu_vec_view(dt, A->x, off, bx, w);
        switch (kind) {
          case 0: cpu_bn_row_sum2_f32(ps + j0, pt + j0, r, cc, 1, k1, w); break;
          case 1: cpu_bn_row_sqdev_f32(ps + j0, r, cc, 1, A->mean + j0, w); break;
          case 2:
            cpu_vec_widen(dt, A->dy, off, bg, w);
            if (A->relu) cpu_bn_mask_f16(r, bg, A->mean + j0, k1, A->bias + j0, 1, w);
            cpu_bn_row_bwd_sums_f32(ps + j0, pt + j0, r, bg, cc, 1, A->mean + j0, k1, NULL, w);
            break;
          case 3:
            if (A->s) { /* the apply, then add_relu's roundings on the chunk */
              cpu_bn_row_affine_f32(r, bo, cc, 1, A->mean + j0, k1, A->bias + j0, w);
              cpu_bn_add_relu_f16(bo, cpu_vec_view(dt, A->s, off, bg, w), w);
            } else
              (A->relu ? cpu_bn_row_affine_relu_f32 : cpu_bn_row_affine_f32)(r, bo, cc, 1, A->mean + j0, k1, A->bias + j0, w);
            cpu_vec_narrow(dt, bo, A->out, off, w);
            break;
          default:
            cpu_vec_widen(dt, A->dy, off, bg, w);
            if (A->relu) cpu_bn_mask_f16(r, bg, A->mean + j0, k1, A->bias + j0, 1, w);
            if (A->beta != 0.0f) cpu_vec_widen(dt, A->out, off, bo, w);
            cpu_bn_row_bwd_dx_f32(r, bg, bo, cc, 1, A->mean + j0, k1, A->mdy + j0, A->kk + j0, NULL, A->beta, w);
            cpu_vec_narrow(dt, bo, A->out, off, w);
            break;
        }
      }
    }
  }
}

/* channel j's partial sums over the nblk vectors at part, in block order */
static double cpu_bn_rows_sum(const float *part, size_t nblk, int c, int j) {
  double s = 0.0;
  size_t b;
  for (b = 0; b < nblk; b++) s += part[b * (size_t)c + (size_t)j];
  return s;
}

/* the partial vectors: the workspace when it holds them, else malloc'd (*mem to free) */
static float *cpu_bn_rows_part(tt_backend *b, const char *what, size_t rows, int c, void *ws, size_t ws_bytes, void **mem) {
  size_t bytes = 2 * cpu_bn_rows_blocks(rows, c) * (size_t)c * sizeof(float);
  *mem = NULL;
  if (ws && ws_bytes >= bytes) return (float *)ws;
  if (!(*mem = malloc(bytes)))
    tt_ref_fail(b, "%s (%zu rows x %d channels, NHWC): could not allocate %zu bytes of per-block partial sums "
                   "(kernels/cpu/cpu_bn.c); pass the workspace op_workspace answers, or free host memory",
                what, rows, c, bytes);
  return (float *)*mem;
}

static void cpu_bn_rows_init(cpu_bn_rows_args *A, int kind, size_t rows, int c, tt_dtype dt, const void *x) {
  memset(A, 0, sizeof *A);
  A->kind = kind, A->rows = rows, A->c = c, A->dt = dt, A->x = x;
}

static int cpu_bn_fwd_rows(tt_backend *b, int nt, size_t rows, int c, tt_dtype dt, const void *x, const float *gamma,
                              const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                              float *save_mean, float *save_invstd, int update_running, int mode, int relu,
                              const void *sc, void *ws, size_t ws_bytes) {
  cpu_bn_rows_args A;
  if (mode == TT_CPU_BN_BATCH) { /* one pass shifted by a sample mean (cpu_bn_need_sqdev), a second one if needed */
    const size_t nblk = cpu_bn_rows_blocks(rows, c);
    void *mem;
    float *part = cpu_bn_rows_part(b, "bn_fwd_train", rows, c, ws, ws_bytes, &mem), *part2;
    /* the pass's shifts (the same floats the means add back): made once here for up to
     * CPU_BN_SHIFT_STACK channels (the samples are spread over the tensor, a cache miss each),
     * else by each block for its chunk */
    float shift[CPU_BN_SHIFT_STACK];
    int j, exact = 0;
    if (!part) return -1;
    part2 = part + nblk * (size_t)c;
    cpu_bn_rows_init(&A, 0, rows, c, dt, x);
    A.part = part;
    if (c <= CPU_BN_SHIFT_STACK) cpu_bn_rows_shift(dt, x, rows, c, 0, (size_t)c, shift), A.shift = shift;
    cpu_bn_rows_pass(nt, &A);
    for (j = 0; j < c && !exact; j++)
      exact = cpu_bn_need_sqdev(cpu_bn_rows_sum(part, nblk, c, j), cpu_bn_rows_sum(part2, nblk, c, j), rows);
    for (j = 0; j < c; j++) {
      double sd = cpu_bn_rows_sum(part, nblk, c, j), q = cpu_bn_rows_sum(part2, nblk, c, j), mean_d;
      if (c > CPU_BN_SHIFT_STACK && j % CPU_BN_SHIFT_STACK == 0)
        cpu_bn_rows_shift(dt, x, rows, c, (size_t)j, c - j < CPU_BN_SHIFT_STACK ? (size_t)(c - j) : CPU_BN_SHIFT_STACK, shift);
      mean_d = (double)shift[j % CPU_BN_SHIFT_STACK] + sd / (double)rows;
      if (exact)
        save_mean[j] = (float)mean_d; /* what tt_bn_channel_stats keeps of it; the exact pass's mean */
      else
        tt_bn_channel_stats(mean_d, q - sd * (sd / (double)rows), rows, eps, momentum, update_running, save_mean + j,
                            save_invstd + j, update_running ? running_mean + j : NULL,
                            update_running ? running_var + j : NULL);
    }
    if (exact) { /* some channel's shift was far from its mean: the exact squared deviations, all channels */
      cpu_bn_rows_init(&A, 1, rows, c, dt, x);
      A.part = part, A.mean = save_mean;
      cpu_bn_rows_pass(nt, &A);
      for (j = 0; j < c; j++)
        tt_bn_channel_stats((double)save_mean[j], cpu_bn_rows_sum(part, nblk, c, j), rows, eps, momentum, update_running,
                            save_mean + j, save_invstd + j, update_running ? running_mean + j : NULL,
                            update_running ? running_var + j : NULL);
    }
    free(mem);
  }
  /* the one apply every mode shares */
  cpu_bn_rows_init(&A, 3, rows, c, dt, x);
  A.out = y, A.gamma = gamma, A.bias = bias, A.eps = eps, A.relu = relu, A.s = sc;
  if (mode == TT_CPU_BN_RUNNING)
    A.mean = running_mean, A.invstd = NULL, A.running_var = running_var;
  else
    A.mean = save_mean, A.invstd = save_invstd;
  cpu_bn_rows_pass(nt, &A);
  return 0;
}

static int cpu_bn_bwd_rows(tt_backend *b, int nt, size_t rows, int c, tt_dtype dt, const void *x, const void *dy,
                              const float *gamma, const float *bias, const float *save_mean, const float *save_invstd,
                              void *dx, float *dgamma, float *dbias, float beta_dx, float beta_param, void *ws,
                              size_t ws_bytes) {
  const size_t nblk = cpu_bn_rows_blocks(rows, c);
  cpu_bn_rows_args A;
  void *mem;
  float *part = cpu_bn_rows_part(b, "bn_bwd", rows, c, ws, ws_bytes, &mem), *part2;
  int j;
  if (!part) return -1;
  part2 = part + nblk * (size_t)c;
  cpu_bn_rows_init(&A, 2, rows, c, dt, x);
  A.dy = dy, A.part = part, A.mean = save_mean, A.relu = bias != NULL;
  A.invstd = save_invstd, A.gamma = gamma, A.bias = bias; /* the ReLU's mask, when relu */
  cpu_bn_rows_pass(nt, &A);
  for (j = 0; j < c; j++) {
    float invstd = save_invstd[j];
    double sdy = cpu_bn_rows_sum(part, nblk, c, j), sdyx = cpu_bn_rows_sum(part2, nblk, c, j) * invstd; /* dy * xhat */
    if (dbias) dbias[j] = tt_ref_beta_f32(dbias[j], (float)sdy, beta_param);
    if (dgamma) dgamma[j] = tt_ref_beta_f32(dgamma[j], (float)sdyx, beta_param);
    /* channel j's column of block 0 is read: keep mean(dy) and mean(dy * xhat) * invstd there */
    part[j] = (float)(sdy / (double)rows);
    part2[j] = (float)(sdyx / (double)rows) * invstd;
  }
  if (dx) {
    cpu_bn_rows_init(&A, 4, rows, c, dt, x);
    A.dy = dy, A.out = dx, A.mean = save_mean, A.invstd = save_invstd, A.gamma = gamma, A.mdy = part, A.kk = part2;
    A.beta = beta_dx, A.relu = bias != NULL, A.bias = bias;
    cpu_bn_rows_pass(nt, &A);
  }
  free(mem);
  return 0;
}

/* ---- entries (cpu_internal.h) ---- */

int tt_cpu_bn_fwd_loops(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, void *y, float *running_mean, float *running_var, float momentum, float eps,
                        float *save_mean, float *save_invstd, int update_running, int mode, int relu, const void *sc,
                        void *ws, size_t ws_bytes) {
  const size_t m = (size_t)n * (size_t)hw;
  int nt = m * (size_t)c > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
  if (hw == 1 && c == 1) n = 1, hw = (int)m; /* [rows, 1] is one plane: no per-row calls of width 1 */
  if (hw == 1)
    return cpu_bn_fwd_rows(b, nt, m, c, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean,
                              save_invstd, update_running, mode, relu, sc, ws, ws_bytes);
  cpu_bn_fwd_planes(nt, n, c, (size_t)hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean,
                       save_invstd, update_running, mode, relu, sc);
  return 0;
}

int tt_cpu_bn_bwd_loops(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy, const float *gamma,
                        const float *bias, const float *save_mean, const float *save_invstd, void *dx, float *dgamma,
                        float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  const size_t m = (size_t)n * (size_t)hw;
  int nt = m * (size_t)c > TT_REF_PAR_MIN ? tt_cpu_st(b)->ref.threads : 1;
  if (hw == 1 && c == 1) n = 1, hw = (int)m; /* as the forward */
  if (hw == 1)
    return cpu_bn_bwd_rows(b, nt, m, c, dt, x, dy, gamma, bias, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                              beta_param, ws, ws_bytes);
  cpu_bn_bwd_planes(nt, n, c, (size_t)hw, dt, x, dy, gamma, bias, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                       beta_param);
  return 0;
}

/* ---- the table entries: checked here, the loops above ---- */

/* fp32, bf16 and fp16 run the loops; anything else (or a bad argument) goes to the reference,
 * which checks and reports. */
static int cpu_bn_loops_dt(tt_dtype dt) { return dt == TT_F32 || dt == TT_BF16 || dt == TT_F16; }


/* The training forward's entries (bn_fwd_train; with relu the ReLU folded in, with sc the shortcut
 * added first): a bad argument goes to the reference, which checks and reports it. */
static int cpu_bn_fwd_train_entry(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                                  const float *bias, const void *sc, void *y, float *running_mean, float *running_var,
                                  float momentum, float eps, float *save_mean, float *save_invstd, int update_running,
                                  int relu, void *ws, size_t ws_bytes) {
  if (!cpu_bn_loops_dt(dt) || n <= 0 || c <= 0 || hw <= 0 || !x || !gamma || !bias || !y || !save_mean || !save_invstd ||
      (update_running && (!running_mean || !running_var)))
    return tt_ref_bn_fwd_train(b, n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean,
                               save_invstd, update_running, ws, ws_bytes);
  return tt_cpu_bn_fwd_loops(b, n, c, hw, dt, x, gamma, bias, y, running_mean, running_var, momentum, eps, save_mean,
                             save_invstd, update_running, TT_CPU_BN_BATCH, relu, sc, ws, ws_bytes);
}

int tt_cpu_bn_fwd_train(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                        float eps, float *save_mean, float *save_invstd, int update_running, void *ws, size_t ws_bytes) {
  return cpu_bn_fwd_train_entry(b, n, c, hw, dt, x, gamma, bias, NULL, y, running_mean, running_var, momentum, eps,
                                save_mean, save_invstd, update_running, 0, ws, ws_bytes);
}

/* backend.h's bn_fwd_train_relu: the ReLU applied in the apply pass before the store
 * (CPU_BN_RELU_OUT): y bit for bit bn_fwd_train then act_fwd(RELU) in place, without the ReLU's pass. */
int tt_cpu_bn_fwd_train_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                             const float *bias, void *y, float *running_mean, float *running_var, float momentum,
                             float eps, float *save_mean, float *save_invstd, int update_running, void *ws,
                             size_t ws_bytes) {
  return cpu_bn_fwd_train_entry(b, n, c, hw, dt, x, gamma, bias, NULL, y, running_mean, running_var, momentum, eps,
                                save_mean, save_invstd, update_running, 1, ws, ws_bytes);
}

/* backend.h's bn_fwd_train_add_relu: one apply pass that adds the shortcut s and applies the ReLU
 * with the three calls' roundings (CPU_BN_AFFINE_ADD_RELU_): y bit for bit bn_fwd_train, add and
 * act_fwd(RELU), without their two passes over the block's output. */
int tt_cpu_bn_fwd_train_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                                 const float *bias, const void *s, void *y, float *running_mean, float *running_var,
                                 float momentum, float eps, float *save_mean, float *save_invstd, int update_running,
                                 void *ws, size_t ws_bytes) {
  if (!s)
    return tt_ref_fail(b, "bn_fwd_train_add_relu (%dx%dx%d): no shortcut tensor s to add; pass the add's other input "
                          "(kernels/cpu/cpu_bn.c)", n, c, hw);
  return cpu_bn_fwd_train_entry(b, n, c, hw, dt, x, gamma, bias, s, y, running_mean, running_var, momentum, eps, save_mean,
                                save_invstd, update_running, 1, ws, ws_bytes);
}

/* backend.h's bn_bwd_add_relu: dy masked in place by the ReLU's saved output (or its 1-bit mask),
 * the shortcut's gradient accumulated from it, then bn_bwd on it: the backend's own act_bwd,
 * accumulate and bn_bwd, so bit for bit the unfused calls (the contract lets the call consume dy). */
int tt_cpu_bn_bwd_add_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *y,
                           const uint32_t *mask, void *dy, const float *gamma, const float *save_mean,
                           const float *save_invstd, void *dx, void *ds, float *dgamma, float *dbias, float beta_dx,
                           float beta_s, float beta_param, void *ws, size_t ws_bytes) {
  const size_t count = (size_t)(n > 0 ? n : 0) * (size_t)(c > 0 ? c : 0) * (size_t)(hw > 0 ? hw : 0);
  int rc;
  if ((!y && !mask) || !dy)
    return tt_ref_fail(b, "bn_bwd_add_relu (%dx%dx%d): %s is NULL; pass the ReLU's saved output or its mask, and dy "
                          "(kernels/cpu/cpu_bn.c)", n, c, hw, dy ? "both y and mask" : "dy");
  rc = mask ? b->act_bwd_mask(b, TT_ACT_RELU, count, dt, mask, dy, dy, 0.0f)
            : b->act_bwd(b, TT_ACT_RELU, count, dt, y, dy, dy, 0.0f); /* g, in dy's storage */
  if (!rc && ds && ds != dy) rc = b->accumulate(b, count, dt, dy, ds, beta_s);
  if (!rc) rc = b->bn_bwd(b, n, c, hw, dt, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param, ws,
                          ws_bytes);
  return rc;
}

int tt_cpu_bn_fwd_infer(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                        const float *bias, const float *running_mean, const float *running_var, float eps,
                        void *y, void *ws, size_t ws_bytes) {
  if (!cpu_bn_loops_dt(dt) || n <= 0 || c <= 0 || hw <= 0 || !x || !gamma || !bias || !running_mean || !running_var || !y)
    return tt_ref_bn_fwd_infer(b, n, c, hw, dt, x, gamma, bias, running_mean, running_var, eps, y, ws, ws_bytes);
  return tt_cpu_bn_fwd_loops(b, n, c, hw, dt, x, gamma, bias, y, (float *)running_mean, (float *)running_var, 0.0f, eps,
                             NULL, NULL, 0, TT_CPU_BN_RUNNING, 0, NULL, NULL, 0);
}

/* The training forward's normalisation with given statistics: the same loops in
 * TT_CPU_BN_SAVED mode, so y is bit for bit what bn_fwd_train wrote from the same x and
 * statistics (that mode needs no workspace). */
int tt_cpu_bn_apply(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const float *gamma,
                    const float *bias, const float *save_mean, const float *save_invstd, void *y) {
  if (!cpu_bn_loops_dt(dt) || n <= 0 || c <= 0 || hw <= 0 || !x || !gamma || !bias || !save_mean || !save_invstd || !y)
    return tt_ref_bn_apply(b, n, c, hw, dt, x, gamma, bias, save_mean, save_invstd, y); /* checks and reports */
  return tt_cpu_bn_fwd_loops(b, n, c, hw, dt, x, gamma, bias, y, NULL, NULL, 0.0f, 0.0f, (float *)save_mean,
                             (float *)save_invstd, 0, TT_CPU_BN_SAVED, 0, NULL, NULL, 0);
}

int tt_cpu_bn_bwd(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                  const float *gamma, const float *save_mean, const float *save_invstd, void *dx, float *dgamma,
                  float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  if (!cpu_bn_loops_dt(dt) || n <= 0 || c <= 0 || hw <= 0 || !x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_ref_bn_bwd(b, n, c, hw, dt, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param, ws,
                         ws_bytes);
  return tt_cpu_bn_bwd_loops(b, n, c, hw, dt, x, dy, gamma, NULL, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                             beta_param, ws, ws_bytes);
}

/* backend.h's bn_bwd_relu: bn_bwd's loops with the ReLU's backward folded into every read of dy
 * (the mask recomputed from x, save_mean, save_invstd, gamma and bias as the forward's apply
 * computed and stored y), so dx, dgamma and dbias are bit for bit those of act_bwd(RELU) with
 * beta 0 then bn_bwd, and the ReLU's pass over y, dy and dx is gone. In place (dx == dy) as bn_bwd. */
int tt_cpu_bn_bwd_relu(tt_backend *b, int n, int c, int hw, tt_dtype dt, const void *x, const void *dy,
                       const float *gamma, const float *bias, const float *save_mean, const float *save_invstd, void *dx,
                       float *dgamma, float *dbias, float beta_dx, float beta_param, void *ws, size_t ws_bytes) {
  if (!bias)
    return tt_ref_fail(b, "bn_bwd_relu (%dx%dx%d): no bias (the forward's beta [c], fp32) to recompute the ReLU's mask "
                          "from; pass the batch norm's bias (kernels/cpu/cpu_bn.c)", n, c, hw);
  if (!cpu_bn_loops_dt(dt) || n <= 0 || c <= 0 || hw <= 0 || !x || !dy || !gamma || !save_mean || !save_invstd)
    return tt_ref_bn_bwd(b, n, c, hw, dt, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbias, beta_dx, beta_param, ws,
                         ws_bytes); /* checks and reports the bad argument */
  return tt_cpu_bn_bwd_loops(b, n, c, hw, dt, x, dy, gamma, bias, save_mean, save_invstd, dx, dgamma, dbias, beta_dx,
                             beta_param, ws, ws_bytes);
}
