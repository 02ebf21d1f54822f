/* tests/test_cuda.c — the CUDA backend against the reference CPU backend (kernels/ref/).
 *
 * Without CUDA in the build, or without a device, every group prints a SKIP line and the
 * test exits 0. Built against the host emulation instead (build/tests/test_cuda_emu, with
 * TT_CUDA_EMULATION; tests/cuda_emu) it runs on any machine: the backend's own sources, its
 * kernels on emulated threads, cuDNN and cuBLAS as reference loops that check their argument
 * contracts; the comparisons below are the same (the last group at a smaller batch), and the
 * launch count is printed. With a GPU, or emulated:
 *   - each op on random inputs, CUDA vs CPU. Tolerance: max|cuda - cpu| <= tol * max|cpu| + 1e-7,
 *     tol = 1e-5 (fp32 elementwise, norm, pooling, loss, optimizers), 1e-4 (fp32 conv and
 *     GEMM: cuDNN FMA math and cuBLAS without TF32), 1e-2 (fp16 everywhere: both sides round
 *     to half, the accumulation orders differ);
 *   - a whole training step (forward, loss, backward, SGD and AdamW) of
 *     tests/fixtures/small_cnn.recipe, CUDA vs CPU: loss and every gradient / parameter within
 *     1e-4 (fp32) or 3e-2 (fp16) of max|cpu|, plus an absolute floor where a value is only
 *     rounding noise (a gradient whose true value is zero; see test_cmp_params);
 *   - no device allocation after setup (tt_cuda_alloc_count unchanged over steps);
 *   - measured device memory (NVML used bytes) after steps vs the reserve + arena.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/runtime/exec.h"
#include "core/compile/recipe.h"
#include "core/compile/policy.h"
#include "tests/tt_test.h"

#ifdef TT_HAVE_CUDA
#include "core/tinytrain.h"
#include "kernels/cuda/tt_cuda.h"
#endif
#ifdef TT_CUDA_EMULATION
#include "tests/cuda_emu/tt_emu.h"
#endif

static const char *test_groups[] = {"cuda_elementwise", "cuda_dropout_mask", "cuda_loss_optim", "cuda_sum_squares_and_clip", "cuda_batchnorm",
                                    "cuda_pooling", "cuda_conv", "cuda_linear", "cuda_bf16_cast", "cuda_bf16_conv_linear_sm80",
                                    "cuda_layernorm", "cuda_attention", "cuda_tokens", "cuda_step_fp32", "cuda_step_fp16",
                                    "cuda_no_allocation_and_peak", "cuda_staging_copies", "cuda_blocking_waits", "cuda_nccl_one_rank",
                                    "cuda_tf32", "cuda_conv_workspace_cap", "cuda_update_multi",
                                    "cuda_precision_auto_sm75_sm80", "cuda_nhwc_ops", "cuda_step_bf16_nhwc"};
#define TEST_NGROUPS ((int)(sizeof test_groups / sizeof test_groups[0]))

#ifdef TT_HAVE_CUDA

/* ------------------------------------ harness ----------------------------------------- */

static tt_backend *cpu, *gpu;
static unsigned char *garena;
static size_t goff, gcap;
static int side; /* 0 cpu, 1 cuda */
static uint64_t cuda_rng = 88172645463325252ull;

static float test_rand(float lo, float hi) {
  uint64_t x = tt_test_xorshift(&cuda_rng);
  return lo + (hi - lo) * (float)((x >> 11) * (1.0 / 9007199254740992.0));
}

/* bf16 on the reference side: kernels/ref computes bf16 itself (TEST_REF_BF16 1), so both sides
 * take the same bf16 inputs and each rounds its own result. TEST_REF_BF16 0 instead holds a bf16
 * tensor's reference copy as fp32 with the same bf16-rounded values and lets the reference compute
 * in fp32 on them, bounding the CUDA side against fp32 arithmetic. Either way, after each comparison
 * the reference copy takes the CUDA side's values, so the next op starts from equal inputs. */
#ifndef TEST_REF_BF16
#define TEST_REF_BF16 1
#endif
static const tt_dtype test_dts[3] = {TT_F32, TT_F16, TT_BF16};
static tt_dtype test_cdt(tt_dtype dt) { return dt == TT_BF16 && !TEST_REF_BF16 ? TT_F32 : dt; }
static const char *test_dt_name(tt_dtype dt) { return dt == TT_F32 ? "fp32" : dt == TT_F16 ? "fp16" : "bf16"; }
/* the dtype a call takes on the current side (the reference's for bf16: test_cdt) */
#define SD(dt_) (side ? (dt_) : test_cdt(dt_))

/* fp32 -> bf16 on the host: round to nearest even (a tie carries into the kept half only when it
 * is odd), a NaN to 0x7fff (the device's canonical NaN); bf16 -> fp32: the bits shifted. */
static uint16_t test_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float test_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* A tensor on both sides: g on the device in dt, c on the host in cdt (test_cdt(dt)). */
typedef struct tt2 {
  void *c, *g;
  size_t count, bytes, cbytes; /* bytes of g, of c */
  tt_dtype dt, cdt;
} tt2;

static void *test_galloc(size_t bytes) {
  size_t o = (goff + 255u) & ~(size_t)255u;
  if (o + bytes > gcap) {
    fprintf(stderr, "test arena exhausted\n");
    exit(1); /* test harness only */
  }
  goff = o + bytes;
  return garena + o;
}

/* Element i of the host copy := v rounded to t's dtype. */
static void test_put(tt2 *t, size_t i, float v) {
  if (t->dt == TT_F16)
    ((uint16_t *)t->c)[i] = tt_f32_to_f16(v);
  else if (t->dt == TT_BF16 && t->cdt == TT_BF16)
    ((uint16_t *)t->c)[i] = test_f32_to_bf16(v);
  else if (t->dt == TT_BF16)
    ((float *)t->c)[i] = test_bf16_to_f32(test_f32_to_bf16(v));
  else
    ((float *)t->c)[i] = v;
}
/* The device copy := the host copy (converted to dt where the two differ). */
static void test_push(tt2 *t) {
  const void *src = t->c;
  uint16_t *tmp = NULL;
  if (t->cdt != t->dt) { /* bf16 held as fp32 on the host: exact, the values are bf16 */
    tmp = (uint16_t *)malloc(t->bytes ? t->bytes : 1);
    for (size_t i = 0; i < t->count; i++) tmp[i] = test_f32_to_bf16(((const float *)t->c)[i]);
    src = tmp;
  }
  if (gpu->upload(gpu, t->g, src, t->bytes)) printf("  upload failed: %s\n", gpu->last_error(gpu));
  free(tmp);
}

/* A tensor on both backends with the same contents (random in [lo, hi]). */
static tt2 mk(size_t count, tt_dtype dt, float lo, float hi) {
  tt2 t;
  t.count = count, t.dt = dt, t.cdt = test_cdt(dt), t.bytes = count * tt_dtype_size(dt);
  t.cbytes = count * tt_dtype_size(t.cdt);
  t.c = malloc(t.cbytes ? t.cbytes : 1);
  t.g = test_galloc(t.bytes ? t.bytes : 1);
  for (size_t i = 0; i < count; i++) test_put(&t, i, test_rand(lo, hi));
  test_push(&t);
  return t;
}
static tt2 mk_raw(size_t bytes, const void *host) {
  tt2 t;
  t.count = bytes, t.dt = t.cdt = TT_F32, t.bytes = t.cbytes = bytes;
  t.c = malloc(bytes);
  memcpy(t.c, host, bytes);
  t.g = test_galloc(bytes);
  if (gpu->upload(gpu, t.g, t.c, bytes)) printf("  upload failed: %s\n", gpu->last_error(gpu));
  return t;
}
static void fr(tt2 *t) { free(t->c); }

#define P(t) (side ? (t).g : (t).c)
#define PF(t) ((float *)P(t))
/* Runs expr (which uses B and P()) on the CPU, then on CUDA. */
#define BOTH(expr)                                                                             \
  do {                                                                                         \
    for (side = 0; side < 2; side++) {                                                         \
      tt_backend *B = side ? gpu : cpu;                                                        \
      int rc_ = (expr);                                                                        \
      TT_CHECK(rc_ == 0, "%s: %s: %s", side ? "cuda" : "cpu", #expr, B->last_error(B));        \
    }                                                                                          \
  } while (0)

static float test_get(const void *p, tt_dtype dt, size_t i) {
  if (dt == TT_F16) return tt_f16_to_f32(((const uint16_t *)p)[i]);
  if (dt == TT_BF16) return test_bf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

/* Compares the host copy of t with h, the device's values in t's dtype (and order); relative to
 * max|cpu|. */
static int cmp_host(const char *what, tt2 t, const void *h, double tol) {
  double md = 0, mr = 0;
  size_t worst = 0;
  int ok;
  for (size_t i = 0; i < t.count; i++) {
    double a = test_get(t.c, t.cdt, i), b = test_get(h, t.dt, i), d = a == b ? 0.0 : fabs(a - b);
    if (fabs(a) > mr && isfinite(a)) mr = fabs(a); /* equal infinities count as equal */
    if (d > md || d != d) md = d, worst = i;
  }
  ok = md <= tol * mr + 1e-7;
  TT_CHECK(ok, "%s (%s): max |cuda - cpu| %.3g > %.1g * max|cpu| %.3g (at %zu: cpu %.7g cuda %.7g)", what,
           test_dt_name(t.dt), md, tol, mr, worst, test_get(t.c, t.cdt, worst), test_get(h, t.dt, worst));
  if (t.cdt != t.dt) /* the reference copy takes the device's values (see test_cdt) */
    for (size_t i = 0; i < t.count; i++) ((float *)t.c)[i] = test_get(h, t.dt, i);
  return ok;
}

/* Compares the two sides of t; relative to max|cpu|. */
static int cmp(const char *what, tt2 t, double tol) {
  void *h = malloc(t.bytes ? t.bytes : 1);
  int ok;
  if (gpu->download(gpu, h, t.g, t.bytes)) {
    TT_CHECK(0, "%s: download failed: %s", what, gpu->last_error(gpu));
    free(h);
    return 0;
  }
  ok = cmp_host(what, t, h, tol);
  free(h);
  return ok;
}

/* n images of c x hw elements of es bytes: NCHW -> NHWC (to_nhwc) or back. */
static void test_permute(const void *src, void *dst, int n, int c, int hw, size_t es, int to_nhwc) {
  for (int s = 0; s < n; s++)
    for (int ch = 0; ch < c; ch++)
      for (int k = 0; k < hw; k++) {
        size_t a = ((size_t)s * c + ch) * hw + k, b = ((size_t)s * hw + k) * c + ch;
        memcpy((char *)dst + (to_nhwc ? b : a) * es, (const char *)src + (to_nhwc ? a : b) * es, es);
      }
}

/* The NHWC tests: the host copy (the reference's operand) stays NCHW, the device copy is the same
 * values channels-last. test_push_nhwc uploads it so; cmp_nhwc compares the device's NHWC result
 * with the reference's NCHW one. */
static void test_push_nhwc(tt2 *t, int n, int c, int hw) {
  void *tmp = malloc(t->cbytes ? t->cbytes : 1);
  tt2 u = *t;
  test_permute(t->c, tmp, n, c, hw, tt_dtype_size(t->cdt), 1);
  u.c = tmp;
  test_push(&u);
  free(tmp);
}
static tt2 mk_nhwc(int n, int c, int hw, tt_dtype dt, float lo, float hi) {
  tt2 t = mk((size_t)n * c * hw, dt, lo, hi);
  test_push_nhwc(&t, n, c, hw);
  return t;
}
static int cmp_nhwc(const char *what, tt2 t, int n, int c, int hw, double tol) {
  void *h = malloc(t.bytes ? t.bytes : 1), *h2 = malloc(t.bytes ? t.bytes : 1);
  int ok = 0;
  if (gpu->download(gpu, h, t.g, t.bytes)) {
    TT_CHECK(0, "%s: download failed: %s", what, gpu->last_error(gpu));
  } else {
    test_permute(h, h2, n, c, hw, tt_dtype_size(t.dt), 0);
    ok = cmp_host(what, t, h2, tol);
  }
  free(h), free(h2);
  return ok;
}

/* Compares the two sides of a byte tensor (masks, indices) exactly. */
static void cmp_bytes(const char *what, tt2 t) {
  unsigned char *h = (unsigned char *)malloc(t.bytes ? t.bytes : 1);
  if (gpu->download(gpu, h, t.g, t.bytes)) {
    TT_CHECK(0, "%s: download failed: %s", what, gpu->last_error(gpu));
  } else {
    size_t i = 0;
    while (i < t.bytes && h[i] == ((unsigned char *)t.c)[i]) i++;
    TT_CHECK(i == t.bytes, "%s: byte %zu differs (cpu %u cuda %u)", what, i, i < t.bytes ? ((unsigned char *)t.c)[i] : 0,
             i < t.bytes ? h[i] : 0);
  }
  free(h);
}

/* bf16 against fp32 arithmetic on equal inputs: one bf16 step (2^-8 relative) at most, for an
 * element-wise result; conv and GEMM as fp16 */
static double tol_ew(tt_dtype dt) { return dt == TT_F16 ? 1e-2 : dt == TT_BF16 ? 5e-3 : 1e-5; }
static double tol_mm(tt_dtype dt) { return dt == TT_F32 ? 1e-4 : 1e-2; }

/* -------------------------------------- ops ------------------------------------------- */

static void test_elementwise(void) {
  TT_TEST_BEGIN("cuda_elementwise");
  for (int di = 0; di < 3; di++) {
    tt_dtype dt = test_dts[di];
    /* odd, many blocks; under the sanitizers (tt_test_sanitized) a tenth, the same kernels and
     * tails (the grid-stride loops' block cap is far above either) */
    size_t n = tt_test_sanitized() ? 10007 : 100003;
    goff = 0;
    for (int a = 0; a < 5; a++) { /* ReLU, ReLU6, SiLU, GELU (erf), GELU (tanh) */
      int from_x = a == TT_ACT_SILU || a == TT_ACT_GELU_ERF || a == TT_ACT_GELU_TANH; /* backward reads x, not y */
      static const char *an[5] = {"relu", "relu6", "silu", "gelu erf", "gelu tanh"};
      char what[64];
      tt2 x = mk(n, dt, -8, 8), y = mk(n, dt, 0, 1), dy = mk(n, dt, -1, 1), dx = mk(n, dt, -1, 1);
      BOTH(B->act_fwd(B, (tt_act)a, n, SD(dt), P(x), P(y)));
      snprintf(what, sizeof what, "act_fwd %s", an[a]);
      cmp(what, y, tol_ew(dt));
      BOTH(B->act_bwd(B, (tt_act)a, n, SD(dt), from_x ? P(x) : P(y), P(dy), P(dx), 1.0f));
      snprintf(what, sizeof what, "act_bwd %s beta=1", an[a]);
      cmp(what, dx, tol_ew(dt));
      BOTH(B->act_bwd(B, (tt_act)a, n, SD(dt), from_x ? P(x) : P(y), P(dy), P(dx), 0.0f));
      snprintf(what, sizeof what, "act_bwd %s beta=0", an[a]);
      cmp(what, dx, tol_ew(dt));
      if (!from_x) { /* compact saves: the 1-bit mask, and backward from it equal to backward from y */
        size_t mb = tt_act_mask_bytes(n);
        unsigned char *z = (unsigned char *)calloc(mb, 1);
        tt2 m = mk_raw(mb, z), dx2 = mk(n, dt, -1, 1);
        free(z);
        BOTH(B->act_mask(B, (tt_act)a, n, SD(dt), P(y), (uint32_t *)P(m)));
        cmp_bytes("act_mask", m);
        memcpy(dx2.c, dx.c, dx.cbytes);
        test_push(&dx2);
        BOTH(B->act_bwd_mask(B, (tt_act)a, n, SD(dt), (const uint32_t *)P(m), P(dy), P(dx2), 1.0f));
        BOTH(B->act_bwd(B, (tt_act)a, n, SD(dt), P(y), P(dy), P(dx), 1.0f));
        /* before cmp: for bf16 it gives the reference copy the device's values */
        TT_CHECK(memcmp(dx.c, dx2.c, dx.cbytes) == 0, "cpu act_bwd_mask != act_bwd bit for bit");
        cmp("act_bwd_mask beta=1", dx2, tol_ew(dt));
        BOTH(B->act_bwd_mask(B, (tt_act)a, n, SD(dt), (const uint32_t *)P(m), P(dy), P(dx2), 0.0f));
        cmp("act_bwd_mask beta=0", dx2, tol_ew(dt));
        fr(&m), fr(&dx2);
      }
      BOTH(B->act_fwd(B, (tt_act)a, n, SD(dt), P(x), P(x))); /* in place */
      cmp("act_fwd in place", x, tol_ew(dt));
      fr(&x), fr(&y), fr(&dy), fr(&dx);
    }
    for (int f = TT_SAVE_FP16; f <= TT_SAVE_INT8; f++) { /* lossy saved copies: the same bytes, the same restore */
      int N = 3, C = 5, HW = 37;
      size_t cnt = (size_t)N * C * HW, sb = tt_saved_bytes((tt_save_fmt)f, (size_t)N, (size_t)C, (size_t)HW);
      unsigned char *z = (unsigned char *)calloc(sb, 1);
      tt2 x = mk(cnt, dt, -3, 3), q = mk_raw(sb, z), back = mk(cnt, dt, 0, 0);
      free(z);
      BOTH(B->save_compress(B, f, N, C, HW, SD(dt), P(x), P(q)));
      /* int8 of fp16 x: rounding of x*inv may differ; bf16 x is fp32 with the same values on the
       * reference side, so its bytes are fp32's */
      if (f != TT_SAVE_INT8 || dt != TT_F16) cmp_bytes("save_compress", q);
      BOTH(B->save_restore(B, f, N, C, HW, SD(dt), P(q), P(back)));
      cmp("save_restore", back, f == TT_SAVE_INT8 ? 2e-2 : tol_ew(dt));
      /* and the restore is close to x on the CPU: half an int8 step, or the 16-bit rounding */
      double md = 0, mx = 0;
      for (size_t i = 0; i < cnt; i++) {
        double a = test_get(x.c, x.cdt, i), b = test_get(back.c, back.cdt, i);
        if (fabs(a - b) > md) md = fabs(a - b);
        if (fabs(a) > mx) mx = fabs(a);
      }
      /* (the restored copy compared is the device's: in bf16 its own rounding, 2^-9, comes on top) */
      TT_CHECK(md <= ((f == TT_SAVE_INT8 ? 0.5 / 127 + 1e-6 : (f == TT_SAVE_BF16 ? 1.0 / 256 : 1.0 / 2048)) +
                      (dt == TT_BF16 ? 1.0 / 512 : 0.0)) * mx * 1.01,
               "save format %d: restored differs by %.3g of max %.3g", f, md, mx);
      fr(&x), fr(&q), fr(&back);
    }
    {
      tt2 a = mk(n, dt, -1, 1), b2 = mk(n, dt, -1, 1), y = mk(n, dt, -1, 1);
      BOTH(B->add(B, n, SD(dt), P(a), P(b2), P(y)));
      cmp("add", y, tol_ew(dt));
      BOTH(B->accumulate(B, n, SD(dt), P(a), P(y), 1.0f));
      cmp("accumulate beta=1", y, tol_ew(dt));
      BOTH(B->accumulate(B, n, SD(dt), P(b2), P(y), 0.0f));
      cmp("accumulate beta=0", y, tol_ew(dt));
      { /* pointers one element past a 16-byte boundary: the kernels' narrower vectors and tails */
#define ES tt_dtype_size(SD(dt)) /* an element of the side's copy */
        BOTH(B->add(B, n - 3, SD(dt), (char *)P(a) + ES, (char *)P(b2) + ES, (char *)P(y) + ES));
        cmp("add (unaligned)", y, tol_ew(dt));
        BOTH(B->accumulate(B, n - 5, SD(dt), (char *)P(a) + 2 * ES, (char *)P(y) + 2 * ES, 1.0f));
#undef ES
        cmp("accumulate beta=1 (unaligned)", y, tol_ew(dt));
      }
      fr(&a), fr(&b2), fr(&y);
    }
    {
      int N = 3, HW = 37, SC = 5, DC = 7;
      tt2 s = mk((size_t)N * SC * HW, dt, -1, 1), d = mk((size_t)N * DC * HW, dt, -1, 1);
      BOTH(B->channel_copy(B, N, HW, SD(dt), P(s), SC, 1, P(d), DC, 3, 4, 0.0f));
      cmp("channel_copy beta=0", d, tol_ew(dt));
      BOTH(B->channel_copy(B, N, HW, SD(dt), P(s), SC, 0, P(d), DC, 0, 3, 1.0f));
      cmp("channel_copy beta=1", d, tol_ew(dt));
      fr(&s), fr(&d);
    }
    if (dt != TT_BF16) { /* bf16's casts: cuda_bf16_cast, bit for bit against the host's rounding */
      tt2 s = mk(n, dt, -70000, 70000), d = mk(n, dt == TT_F16 ? TT_F32 : TT_F16, 0, 0);
      BOTH(B->cast(B, n, SD(dt), P(s), d.dt, P(d)));
      cmp("cast", d, 0.0); /* exact: both round to nearest even */
      fr(&s), fr(&d);
    }
    {
      int N = 4, C = 3, HW = 1000;
      uint8_t *px = (uint8_t *)malloc((size_t)N * C * HW);
      float mean[3] = {0.5f, 0.4f, 0.3f}, sd[3] = {0.25f, 0.2f, 0.3f};
      for (int i = 0; i < N * C * HW; i++) px[i] = (uint8_t)(test_rand(0, 256));
      tt2 s = mk_raw((size_t)N * C * HW, px), d = mk((size_t)N * C * HW, dt, 0, 0);
      BOTH(B->normalize_u8(B, N, C, HW, (const uint8_t *)P(s), mean, sd, SD(dt), P(d)));
      cmp("normalize_u8", d, tol_ew(dt));
      fr(&s), fr(&d), free(px);
    }
    if (dt != TT_BF16) { /* bf16: cuda_bf16_cast */
      tt2 x = mk(n, dt, -1, 1);
      int32_t zero[2] = {0, 0}, got[2] = {7, 7};
      tt2 flag = mk_raw(2 * sizeof(int32_t), zero);
      BOTH(B->check_finite(B, n, SD(dt), P(x), (int32_t *)P(flag)));
      gpu->download(gpu, got, flag.g, sizeof got);
      TT_CHECK(got[0] == 0 && ((int32_t *)flag.c)[0] == 0, "check_finite: finite input flagged (cuda %d)", got[0]);
      if (dt == TT_F16)
        ((uint16_t *)x.c)[n - 5] = 0x7c00u; /* +inf */
      else
        ((float *)x.c)[n / 2] = NAN;
      gpu->upload(gpu, x.g, x.c, x.bytes);
      BOTH(B->check_finite(B, n, SD(dt), P(x), (int32_t *)P(flag)));
      gpu->download(gpu, got, flag.g, sizeof got);
      TT_CHECK(got[0] == 1 && ((int32_t *)flag.c)[0] == 1, "check_finite: inf/NaN not flagged (cuda %d)", got[0]);
      fr(&x), fr(&flag);
    }
  }
  TT_TEST_END();
}

static void test_dropout(void) {
  TT_TEST_BEGIN("cuda_dropout_mask");
  for (int di = 0; di < 3; di++) {
    tt_dtype dt = test_dts[di];
    size_t n = 200001;
    goff = 0;
    float ps[3] = {0.0f, 0.3f, 1.0f};
    for (int k = 0; k < 3; k++) {
      tt2 x = mk(n, dt, -1, 1), y = mk(n, dt, 0, 0), dx = mk(n, dt, -1, 1);
      uint64_t seed = 0x1234567890abcdefull + (uint64_t)k;
      BOTH(B->dropout_fwd(B, n, SD(dt), ps[k], seed, P(x), P(y)));
      /* bf16: the reference keeps x*scale in fp32; a mask difference would still be a whole value */
      cmp("dropout_fwd (same mask bit for bit)", y, dt == TT_BF16 ? tol_ew(dt) : 0.0);
      BOTH(B->dropout_bwd(B, n, SD(dt), ps[k], seed, P(x), P(dx), 1.0f));
      cmp("dropout_bwd beta=1", dx, tol_ew(dt));
      fr(&x), fr(&y), fr(&dx);
    }
  }
  TT_TEST_END();
}

static void test_loss_optim(void) {
  TT_TEST_BEGIN("cuda_loss_optim");
  for (int di = 0; di < 3; di++) {
    tt_dtype dt = test_dts[di];
    /* {5, 1500}: past the kernel's register cache; {4100, 3}: more samples than the grid has
     * warps (512 blocks of 8), so warps take several */
    int shapes[5][2] = {{6, 5}, {257, 10}, {33, 1000}, {5, 1500}, {4100, 3}};
    const int nshapes = di == 0 ? 5 : 4; /* the last (slow to emulate: 4100 warps) in fp32 only */
    goff = 0;
    for (int s = 0; s < nshapes; s++) {
      int N = shapes[s][0], K = shapes[s][1];
      int32_t *lab = (int32_t *)malloc(sizeof(int32_t) * N);
      float st0[2] = {1.5f, 2.0f};
      for (int i = 0; i < N; i++) lab[i] = (int32_t)test_rand(0, (float)K) % K;
      tt2 lg = mk((size_t)N * K, dt, -6, 6), l = mk_raw(sizeof(int32_t) * N, lab), st = mk_raw(sizeof st0, st0);
      tt2 dl = mk((size_t)N * K, dt, 0, 0);
      BOTH(B->softmax_ce(B, N, K, SD(dt), P(lg), (const int32_t *)P(l), 0.1f, 0.37f, P(dl), PF(st)));
      st.count = 2;
      cmp("softmax_ce stats", st, 1e-5);
      cmp("softmax_ce dlogits", dl, tol_ew(dt));
      BOTH(B->softmax_ce(B, N, K, SD(dt), P(lg), (const int32_t *)P(l), 0.0f, 1.0f, NULL, PF(st)));
      cmp("softmax_ce stats (no dlogits)", st, 1e-5);
      fr(&lg), fr(&l), fr(&st), fr(&dl), free(lab);
    }
  }
  {
    size_t n = 50021;
    goff = 0;
    for (int k = 0; k < 4; k++) {
      tt2 w = mk(n, TT_F32, -1, 1), g = mk(n, TT_F32, -1, 1), m = mk(n, TT_F32, -0.1f, 0.1f), v = mk(n, TT_F32, 0, 0.01f);
      BOTH(B->sgd_update(B, n, PF(w), PF(g), PF(m), 0.1f, k ? 0.9f : 0.0f, k == 2, k ? 5e-4f : 0.0f, 0.5f, NULL, NULL));
      cmp("sgd_update w", w, 1e-5);
      if (k) cmp("sgd_update m", m, 1e-5);
      BOTH(B->adam_update(B, n, PF(w), PF(g), PF(m), PF(v), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, k & 1, k + 1, 0.25f,
                          NULL, NULL));
      cmp("adam_update w", w, 1e-5);
      cmp("adam_update m", m, 1e-5);
      cmp("adam_update v", v, 1e-5);
      fr(&w), fr(&g), fr(&m), fr(&v);
    }
    /* a set overflow flag in device memory: both backends leave w, m and v as they were */
    {
      int32_t one = 1;
      tt2 w = mk(n, TT_F32, -1, 1), g = mk(n, TT_F32, -1, 1), m = mk(n, TT_F32, -0.1f, 0.1f), v = mk(n, TT_F32, 0, 0.01f);
      tt2 w0 = mk(n, TT_F32, 0, 0), flag = mk_raw(sizeof one, &one);
      memcpy(w0.c, w.c, n * sizeof(float));
      BOTH(B->sgd_update(B, n, PF(w), PF(g), PF(m), 0.1f, 0.9f, 1, 5e-4f, 0.5f, NULL, (const int32_t *)P(flag)));
      BOTH(B->adam_update(B, n, PF(w), PF(g), PF(m), PF(v), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 2, 0.25f,
                          NULL, (const int32_t *)P(flag)));
      cmp("update with the overflow flag set: w", w, 0.0);
      TT_CHECK(!memcmp(w.c, w0.c, n * sizeof(float)), "the CPU backend moved w despite the flag");
      fr(&w), fr(&g), fr(&m), fr(&v), fr(&w0), fr(&flag);
    }
  }
  TT_TEST_END();
}

/* The whole optimizer step in few launches (backend.h: sgd_update_multi, adam_update_multi): 70
 * tensors of odd sizes (one empty), every other one without weight decay, updated by the multi
 * calls and, from the same starting values, by sgd_update / adam_update per tensor (weight decay 0
 * where a tensor has none): the same bits, in 2 launches (64 tensors per launch) where the per-
 * tensor path takes 69. Then with a clip argument, and with the overflow flag set (nothing moves). */
#ifdef TT_CUDA_EMULATION
#define TEST_NSEG 70
static void test_update_multi(void) {
  TT_TEST_BEGIN("cuda_update_multi");
  size_t cnt[TEST_NSEG], total = 0, off[TEST_NSEG];
  float *st[2][4]; /* [path][w, g, m, v] on the device */
  float *h0[4], *h1 = NULL;
  tt_update_seg segs[2][TEST_NSEG];
  goff = 0;
  for (int i = 0; i < TEST_NSEG; i++) {
    cnt[i] = i == 5 ? 0 : (size_t)(1 + (i * 977) % 1500);
    off[i] = total;
    total += (cnt[i] + 63) / 64 * 64; /* 256-byte aligned tensors, as the arena places them */
  }
  for (int k = 0; k < 4; k++) {
    h0[k] = (float *)malloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) h0[k][i] = k == 3 ? test_rand(0, 0.01f) : test_rand(-1, 1);
    for (int pth = 0; pth < 2; pth++) st[pth][k] = (float *)test_galloc(total * sizeof(float));
  }
  h1 = (float *)malloc(total * sizeof(float));
  int32_t one = 1;
  float sumsq = 4.0f;
  int32_t *dflag = (int32_t *)test_galloc(sizeof one);
  float *dsumsq = (float *)test_galloc(sizeof sumsq);
  TT_CHECK(gpu->upload(gpu, dflag, &one, sizeof one) == 0 && gpu->upload(gpu, dsumsq, &sumsq, sizeof sumsq) == 0, "upload: %s",
           gpu->last_error(gpu));
  for (int pth = 0; pth < 2; pth++)
    for (int i = 0; i < TEST_NSEG; i++) {
      tt_update_seg *u = &segs[pth][i];
      u->w = st[pth][0] + off[i], u->g = st[pth][1] + off[i], u->m = st[pth][2] + off[i], u->v = st[pth][3] + off[i];
      u->count = cnt[i], u->decay = i % 2 == 0;
    }
  for (int c = 0; c < 6 && !tt_test_current_failed; c++) {
    /* c: 0 sgd, 1 sgd nesterov + clip, 2 adam, 3 adamw + clip, 4 sgd flag set, 5 adamw flag set */
    int adam = c == 2 || c == 3 || c == 5, flagged = c >= 4;
    tt_clip clip;
    clip.sumsq = dsumsq, clip.max_norm = 0.5f;
    const tt_clip *cl = (c == 1 || c == 3) ? &clip : NULL;
    const int32_t *skip = flagged ? dflag : NULL;
    for (int pth = 0; pth < 2; pth++)
      for (int k = 0; k < 4; k++)
        TT_CHECK(gpu->upload(gpu, st[pth][k], h0[k], total * sizeof(float)) == 0, "upload: %s", gpu->last_error(gpu));
    tt_emu_counts e0, e1, e2;
    tt_emu_get_counts(&e0);
    int rc = adam ? gpu->adam_update_multi(gpu, segs[0], TEST_NSEG, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, c != 2, 3, 0.5f, cl, skip)
                  : gpu->sgd_update_multi(gpu, segs[0], TEST_NSEG, 0.1f, 0.9f, c == 1, 5e-3f, 0.5f, cl, skip);
    TT_CHECK(rc == 0, "multi (case %d): %s", c, gpu->last_error(gpu));
    tt_emu_get_counts(&e1);
    for (int i = 0; i < TEST_NSEG; i++) {
      const tt_update_seg *u = &segs[1][i];
      float wd = u->decay ? (adam ? 0.05f : 5e-3f) : 0.0f;
      rc = adam ? gpu->adam_update(gpu, u->count, u->w, u->g, u->m, u->v, 1e-3f, 0.9f, 0.999f, 1e-8f, wd, c != 2, 3, 0.5f, cl, skip)
                : gpu->sgd_update(gpu, u->count, u->w, u->g, u->m, 0.1f, 0.9f, c == 1, wd, 0.5f, cl, skip);
      TT_CHECK(rc == 0, "per tensor (case %d, tensor %d): %s", c, i, gpu->last_error(gpu));
    }
    tt_emu_get_counts(&e2);
    TT_CHECK(e1.launches - e0.launches == 2 && e2.launches - e1.launches == TEST_NSEG - 1,
             "case %d: %zu launches for the multi call (want 2), %zu per tensor", c, e1.launches - e0.launches,
             e2.launches - e1.launches);
    for (int k = 0; k < 4 && !tt_test_current_failed; k++) {
      float *a = (float *)malloc(total * sizeof(float));
      TT_CHECK(gpu->download(gpu, a, st[0][k], total * sizeof(float)) == 0 &&
                   gpu->download(gpu, h1, st[1][k], total * sizeof(float)) == 0, "download: %s", gpu->last_error(gpu));
      for (int i = 0; i < TEST_NSEG; i++) {
        TT_CHECK(!memcmp(a + off[i], h1 + off[i], cnt[i] * sizeof(float)),
                 "case %d: tensor %d's %c differs between the multi call and the per-tensor update", c, i, "wgmv"[k]);
        if (tt_test_current_failed) break;
      }
      if (k != 1) { /* the state moved (or, flag set, did not) */
        int same = !memcmp(a, h0[k], total * sizeof(float));
        TT_CHECK(flagged ? same : (k == 3 && !adam) || !same, "case %d: %c %s", c, "wgmv"[k],
                 flagged ? "moved despite the overflow flag" : "did not move");
      }
      free(a);
    }
  }
  for (int k = 0; k < 4; k++) free(h0[k]);
  free(h1);
  TT_TEST_END();
}
/* The weight casts of a step in one launch (backend.h: cast_multi): 130 fp32 tensors of odd sizes
 * (one empty; the last 10 past the 120 a launch takes), each cast alone by cast and all together
 * by cast_multi, to fp16 and to bf16: the same bits, in 2 launches where cast takes 129; then with
 * one tensor misaligned (the element-by-element path), the same bits again. */
#define TEST_NCAST 130
static void test_cast_multi(void) {
  TT_TEST_BEGIN("cuda_cast_multi");
  size_t cnt[TEST_NCAST], off[TEST_NCAST], total = 0;
  tt_cast_seg segs[TEST_NCAST];
  goff = 0;
  for (int i = 0; i < TEST_NCAST; i++) {
    cnt[i] = i == 7 ? 0 : (size_t)(1 + (i * 613) % 2100);
    off[i] = total;
    total += (cnt[i] + 64) / 64 * 64; /* 256-byte aligned tensors, as the arena places them, and one spare */
  }
  float *h = (float *)malloc(total * sizeof(float));
  uint16_t *a = (uint16_t *)malloc(total * 2), *want = (uint16_t *)malloc(total * 2);
  for (size_t i = 0; i < total; i++) h[i] = test_rand(-70000.0f, 70000.0f) * (i % 3 ? 1e-3f : 1.0f); /* fp16 overflow too */
  float *src = (float *)test_galloc(total * sizeof(float));
  uint16_t *d1 = (uint16_t *)test_galloc(total * 2), *d2 = (uint16_t *)test_galloc(total * 2);
  TT_CHECK(gpu->cast_multi != NULL, "the CUDA backend has no cast_multi");
  TT_CHECK(gpu->upload(gpu, src, h, total * sizeof(float)) == 0, "upload: %s", gpu->last_error(gpu));
  for (int c = 0; c < 4 && gpu->cast_multi && !tt_test_current_failed; c++) {
    tt_dtype dt = c % 2 ? TT_BF16 : TT_F16;
    int shift = c >= 2; /* tensor 3 starts one element further: neither side 16-byte aligned */
    for (int i = 0; i < TEST_NCAST; i++) {
      size_t o = off[i] + (shift && i == 3 ? 1 : 0);
      segs[i].src = src + o, segs[i].dst = d1 + o, segs[i].count = cnt[i];
    }
    TT_CHECK(gpu->zero(gpu, d1, total * 2) == 0 && gpu->zero(gpu, d2, total * 2) == 0, "zero: %s", gpu->last_error(gpu));
    size_t m0 = tt_emu_kernel_launches("cuda_ew_cast_multi_k");
    TT_CHECK(gpu->cast_multi(gpu, segs, TEST_NCAST, TT_F32, dt) == 0, "cast_multi: %s", gpu->last_error(gpu));
    size_t m1 = tt_emu_kernel_launches("cuda_ew_cast_multi_k"), s0 = tt_emu_kernel_launches("cuda_ew_cast_k");
    for (int i = 0; i < TEST_NCAST; i++)
      TT_CHECK(gpu->cast(gpu, cnt[i], TT_F32, segs[i].src, dt, d2 + ((uint16_t *)segs[i].dst - d1)) == 0, "cast: %s",
               gpu->last_error(gpu));
    size_t s1 = tt_emu_kernel_launches("cuda_ew_cast_k");
    TT_CHECK(m1 - m0 == 2 && s1 - s0 == TEST_NCAST - 1, "case %d: %zu cast_multi launches (want 2), %zu cast launches (want %d)",
             c, m1 - m0, s1 - s0, TEST_NCAST - 1);
    TT_CHECK(gpu->download(gpu, a, d1, total * 2) == 0 && gpu->download(gpu, want, d2, total * 2) == 0, "download: %s",
             gpu->last_error(gpu));
    /* every element, the gaps between tensors included (both zero there: nothing written past a tensor) */
    for (size_t i = 0; i < total && !tt_test_current_failed; i++)
      TT_CHECK(a[i] == want[i], "case %d (%s%s): element %zu: cast_multi 0x%04x, cast 0x%04x", c, tt_dtype_name(dt),
               shift ? ", misaligned" : "", i, a[i], want[i]);
  }
  free(h), free(a), free(want);
  TT_TEST_END();
}
#endif

/* sum_squares against the reference (the += contract, a start that is not zero), repeated runs
 * bit for bit (no atomics), one count past the partial-sum grid's cap; then the updates with a
 * clip argument: a clipping one, one whose norm is under max_norm (the unclipped update, bit for
 * bit), and one with the overflow flag set (nothing moves). */
static void test_sum_squares_clip(void) {
  TT_TEST_BEGIN("cuda_sum_squares_and_clip");
  const size_t counts[] = {1, 255, 4099, 300001, 4194304 + 4099}; /* the last: more than 1024 blocks of 4096 */
  goff = 0;
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    size_t n = counts[c];
    float start = 0.5f, first = 0.0f, again = 0.0f;
    tt2 g = mk(n, TT_F32, -1, 1), acc = mk_raw(sizeof start, &start);
    BOTH(B->sum_squares(B, n, PF(g), PF(acc)));
    acc.count = 1;
    cmp("sum_squares", acc, 1e-6);
    double want = start;
    for (size_t i = 0; i < n; i++) want += (double)((float *)g.c)[i] * ((float *)g.c)[i];
    TT_CHECK(fabs(((float *)acc.c)[0] - want) <= 1e-6 * want, "sum_squares (cpu) %.9g, the double sum %.9g",
             (double)((float *)acc.c)[0], want);
    /* determinism: a second run gives the same bits. Under the sanitizers not for the largest
     * count (4 million emulated elements a run): its one run above already went through the
     * capped grid's loop, and the plain build checks the bits */
    if (tt_test_sanitized() && n > ((size_t)1 << 22)) {
      TT_SKIP("cuda_sum_squares_and_clip: sum_squares deterministic at n = 4198403",
              "under sanitizers: the second run repeats the first's code path; the plain build compares the bits");
      fr(&g), fr(&acc);
      continue;
    }
    TT_CHECK(gpu->download(gpu, &first, acc.g, sizeof first) == 0 && gpu->zero(gpu, acc.g, sizeof(float)) == 0 &&
                 gpu->upload(gpu, acc.g, &start, sizeof start) == 0 && gpu->sum_squares(gpu, n, (const float *)g.g, (float *)acc.g) == 0 &&
                 gpu->download(gpu, &again, acc.g, sizeof again) == 0,
             "sum_squares again: %s", gpu->last_error(gpu));
    TT_CHECK(!memcmp(&first, &again, sizeof first), "sum_squares n=%zu is not deterministic: %.9g then %.9g", n,
             (double)first, (double)again);
    fr(&g), fr(&acc);
  }
  {
    size_t n = 50021;
    goff = 0;
    for (int k = 0; k < 3; k++) {
      tt2 w = mk(n, TT_F32, -1, 1), g = mk(n, TT_F32, -1, 1), m = mk(n, TT_F32, -0.1f, 0.1f), v = mk(n, TT_F32, 0, 0.01f);
      tt2 w2 = mk(n, TT_F32, 0, 0), m2 = mk(n, TT_F32, 0, 0), v2 = mk(n, TT_F32, 0, 0);
      float zero = 0.0f;
      int32_t one = 1;
      tt2 ss = mk_raw(sizeof zero, &zero), flag = mk_raw(sizeof one, &one);
      BOTH(B->sum_squares(B, n, PF(g), PF(ss)));
      /* grad_scale 0.5: the true norm is half the raw one */
      double norm = 0.5 * sqrt((double)((float *)ss.c)[0]);
      tt_clip cl;
      cl.max_norm = (float)(k == 1 ? 10.0 * norm : 0.3 * norm);
      memcpy(w2.c, w.c, n * 4), memcpy(m2.c, m.c, n * 4), memcpy(v2.c, v.c, n * 4);
      gpu->upload(gpu, w2.g, w.c, n * 4), gpu->upload(gpu, m2.g, m.c, n * 4), gpu->upload(gpu, v2.g, v.c, n * 4);
      float *w0 = (float *)malloc(n * 4), *m0 = (float *)malloc(n * 4);
      memcpy(w0, w.c, n * 4), memcpy(m0, m.c, n * 4);
      const int32_t *skip = NULL;
      BOTH((cl.sumsq = PF(ss), skip = k == 2 ? (const int32_t *)P(flag) : NULL,
            B->sgd_update(B, n, PF(w), PF(g), PF(m), 0.1f, 0.9f, 1, 5e-4f, 0.5f, &cl, skip)));
      cmp("sgd_update with clip: w", w, 1e-5);
      cmp("sgd_update with clip: m", m, 1e-5);
      BOTH((cl.sumsq = PF(ss), skip = k == 2 ? (const int32_t *)P(flag) : NULL,
            B->adam_update(B, n, PF(w2), PF(g), PF(m2), PF(v2), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 2, 0.5f, &cl, skip)));
      cmp("adam_update with clip: w", w2, 1e-5);
      cmp("adam_update with clip: v", v2, 1e-5);
      /* the CPU side by hand: k 0 scales every gradient by coef (SGD with nesterov momentum in
       * double), k 1 is bit for bit the update without clip, k 2 (overflow flag) moves nothing */
      if (k == 0) {
        double coef = cl.max_norm / (norm + 1e-6), worst = 0.0;
        TT_CHECK(coef < 0.31 && coef > 0.29, "clip coefficient %.6f, expected 0.3", coef);
        for (size_t i = 0; i < n; i++) {
          double d = ((float *)g.c)[i] * 0.5 * coef + 5e-4 * w0[i], mv = 0.9 * m0[i] + d;
          double want = w0[i] - 0.1 * (d + 0.9 * mv), diff = fabs(((float *)w.c)[i] - want);
          if (diff > worst) worst = diff;
        }
        TT_CHECK(worst <= 1e-6, "sgd_update with clip: max |w - by hand| %.3g", worst);
      } else if (k == 1) {
        float *mm = (float *)malloc(n * 4);
        memcpy(mm, m0, n * 4);
        TT_CHECK(cpu->sgd_update(cpu, n, w0, (const float *)g.c, mm, 0.1f, 0.9f, 1, 5e-4f, 0.5f, NULL, NULL) == 0, "%s",
                 cpu->last_error(cpu));
        TT_CHECK(!memcmp(w0, w.c, n * 4) && !memcmp(mm, m.c, n * 4), "a norm under max_norm changed the update");
        free(mm);
      } else {
        TT_CHECK(!memcmp(w0, w.c, n * 4) && !memcmp(m0, m.c, n * 4), "the overflow flag did not skip the clipped update");
      }
      free(w0), free(m0);
      fr(&w), fr(&g), fr(&m), fr(&v), fr(&w2), fr(&m2), fr(&v2), fr(&ss), fr(&flag);
    }
  }
  TT_TEST_END();
}

/* The device's bn_apply: the table's, or (emulated: the backend's sources linked in) the function
 * itself while cuda_backend.cu's table does not list it; a GPU build reaches the backend only
 * through its table (libtinytrain_cuda.so). */
typedef int (*bn_apply_fn)(tt_backend *, int, int, int, tt_dtype, const void *, const float *, const float *,
                           const float *, const float *, void *);
static bn_apply_fn cuda_bn_apply_fn(void) {
#ifdef TT_CUDA_EMULATION
  return gpu->bn_apply ? gpu->bn_apply : tt_cuda_bn_apply;
#else
  return gpu->bn_apply;
#endif
}
static void test_batchnorm(void) {
  TT_TEST_BEGIN("cuda_batchnorm");
  /* the last two: each channel split over several blocks (16-byte vectors crossing planes; odd hw) */
  int shapes[5][3] = {{8, 16, 49}, {3, 5, 1024}, {64, 7, 1}, {16, 3, 1100}, {2, 3, 4099}};
  /* twice: with the held-on-chip form (where a shape fits: the first two), then with it off, so
   * that the two-pass and flat forms meet the CPU on the same shapes */
  const size_t res_cap = tt_cuda_set_bn_resident(gpu, (size_t)-1);
  for (int di = 0; di < 6; di++) {
    tt_dtype dt = test_dts[di % 3];
    tt_cuda_set_bn_resident(gpu, di < 3 ? res_cap : 0);
    if (di == 3) printf("  cuda_batchnorm: the held-on-chip form off from here (tt_cuda_set_bn_resident 0)\n");
    for (int s = 0; s < 5; s++) {
      int N = shapes[s][0], C = shapes[s][1], HW = shapes[s][2];
      size_t cnt = (size_t)N * C * HW, wsb;
      void *ws;
      tt_op_desc od;
      goff = 0;
      memset(&od, 0, sizeof od);
      od.kind = TT_OP_BN_BWD, od.dt = dt, od.u.bn.n = N, od.u.bn.c = C, od.u.bn.hw = HW, od.u.bn.eps = 1e-5f;
      wsb = gpu->op_workspace(gpu, &od); /* bn_fwd_train's is the same */
      ws = test_galloc(wsb ? wsb : 1);
#define WS side ? ws : NULL, side ? wsb : 0
      tt2 x = mk(cnt, dt, -2, 3), y = mk(cnt, dt, 0, 0), g = mk(C, TT_F32, 0.5f, 1.5f), bb = mk(C, TT_F32, -1, 1);
      tt2 rm = mk(C, TT_F32, -0.1f, 0.1f), rv = mk(C, TT_F32, 0.9f, 1.1f), sm = mk(C, TT_F32, 0, 0),
          si = mk(C, TT_F32, 0, 0);
      tt2 dy = mk(cnt, dt, -1, 1), dx = mk(cnt, dt, -1, 1), dg = mk(C, TT_F32, -1, 1), db = mk(C, TT_F32, -1, 1);
      BOTH(B->bn_fwd_train(B, N, C, HW, SD(dt), P(x), PF(g), PF(bb), P(y), PF(rm), PF(rv), 0.1f, 1e-5f, PF(sm), PF(si), 1, WS));
      cmp("bn_fwd_train y", y, tol_ew(dt));
      cmp("bn_fwd_train save_mean", sm, 1e-5);
      cmp("bn_fwd_train save_invstd", si, 1e-5);
      cmp("bn_fwd_train running_mean", rm, 1e-5);
      cmp("bn_fwd_train running_var (unbiased)", rv, 1e-5);
      bn_apply_fn gapply = cuda_bn_apply_fn();
      if (!gapply && s == 0 && di == 0) printf("  bn_apply: not in the CUDA backend's table yet (not compared)\n");
      if (gapply) { /* bn_apply from the statistics just saved: the CPU's within tolerance, and on the device
         * bit for bit the training forward's y (y.g, untouched by cmp) */
        tt2 y2 = mk(cnt, dt, 0, 0);
        size_t yb = cnt * tt_dtype_size(dt);
        unsigned char *h1 = (unsigned char *)malloc(yb), *h2 = (unsigned char *)malloc(yb);
        BOTH((side ? gapply : B->bn_apply)(B, N, C, HW, SD(dt), P(x), PF(g), PF(bb), PF(sm), PF(si), P(y2)));
        TT_CHECK(h1 && h2 && !gpu->download(gpu, h1, y.g, yb) && !gpu->download(gpu, h2, y2.g, yb), "bn_apply: download");
        TT_CHECK(h1 && h2 && memcmp(h1, h2, yb) == 0, "bn_apply %s %dx%dx%d: not bit for bit the training forward's y",
                 test_dt_name(dt), N, C, HW);
        cmp("bn_apply", y2, tol_ew(dt));
        free(h1), free(h2), fr(&y2);
      }
      BOTH(B->bn_bwd(B, N, C, HW, SD(dt), P(x), P(dy), PF(g), PF(sm), PF(si), P(dx), PF(dg), PF(db), 1.0f, 1.0f, WS));
      cmp("bn_bwd dx", dx, tol_ew(dt));
      cmp("bn_bwd dgamma", dg, dt != TT_F32 ? 1e-3 : 1e-5);
      cmp("bn_bwd dbias", db, dt != TT_F32 ? 1e-3 : 1e-5);
      BOTH(B->bn_bwd(B, N, C, HW, SD(dt), P(x), P(dy), PF(g), PF(sm), PF(si), P(dx), PF(dg), PF(db), 0.0f, 0.0f, WS));
      cmp("bn_bwd dx beta=0", dx, tol_ew(dt));
      if (HW == 49) { /* the flat forms (planes not whole 16-byte vectors) against the per-channel
                       * kernels: the same calls on copies of x and dy one element off 16-byte
                       * alignment, which the flat forms refuse. The statistics and dx's sums are
                       * grouped differently there (within rounding); the normalisation is the same
                       * arithmetic, bit for bit, given the same statistics (bn_apply on both) */
        size_t es = tt_dtype_size(dt), nb = cnt * es, span = (nb + 2 * es + 255) & ~(size_t)255;
        unsigned char *base = (unsigned char *)test_galloc(5 * span + 2 * C * sizeof(float));
        void *xo = base + es, *dyo = base + span + es, *yo = base + 2 * span + es, *dxo = base + 3 * span + es;
        void *ya = base + 4 * span; /* aligned: bn_apply's flat form */
        float *smo = (float *)(base + 5 * span), *sio = smo + C, *hs = (float *)malloc(4 * (size_t)C * sizeof(float));
        unsigned char *hx = (unsigned char *)malloc(nb), *hdy = (unsigned char *)malloc(nb);
        unsigned char *h1 = (unsigned char *)malloc(nb), *h2 = (unsigned char *)malloc(nb);
        int ok = hs && hx && hdy && h1 && h2 && !gpu->download(gpu, hx, x.g, nb) && !gpu->download(gpu, hdy, dy.g, nb) &&
                 !gpu->upload(gpu, xo, hx, nb) && !gpu->upload(gpu, dyo, hdy, nb) &&
                 !gpu->bn_fwd_train(gpu, N, C, HW, dt, xo, (const float *)g.g, (const float *)bb.g, yo, NULL, NULL, 0.1f,
                                    1e-5f, smo, sio, 0, ws, wsb) &&
                 !gpu->bn_bwd(gpu, N, C, HW, dt, xo, dyo, (const float *)g.g, smo, sio, dxo, NULL, NULL, 0.0f, 0.0f, ws, wsb);
        TT_CHECK(ok, "bn %s %dx%dx%d off alignment: %s", test_dt_name(dt), N, C, HW, gpu->last_error(gpu));
        if (ok) {
          double worst = 0.0, mr = 0.0;
          TT_CHECK(!gpu->download(gpu, hs, sm.g, (size_t)C * 4) && !gpu->download(gpu, hs + C, si.g, (size_t)C * 4) &&
                       !gpu->download(gpu, hs + 2 * C, smo, (size_t)C * 4) && !gpu->download(gpu, hs + 3 * C, sio, (size_t)C * 4),
                   "download statistics");
          for (int k = 0; k < 2 * C; k++) {
            double d = fabs((double)hs[k] - hs[2 * C + k]) / (fabs((double)hs[2 * C + k]) + 1e-3);
            if (d > worst) worst = d;
          }
          TT_CHECK(worst <= 1e-5, "bn_fwd_train %s %dx%dx%d: the flat statistics differ from the per-channel ones by %.3g",
                   test_dt_name(dt), N, C, HW, worst);
          ok = gapply && !gapply(gpu, N, C, HW, dt, x.g, (const float *)g.g, (const float *)bb.g, smo, sio, ya);
          TT_CHECK(!gapply || ok, "bn_apply: %s", gpu->last_error(gpu));
          if (ok)
            TT_CHECK(!gpu->download(gpu, h1, ya, nb) && !gpu->download(gpu, h2, yo, nb) && !memcmp(h1, h2, nb),
                     "bn %s %dx%dx%d: the flat normalisation differs from the per-channel kernel's on the same statistics",
                     test_dt_name(dt), N, C, HW);
          TT_CHECK(!gpu->download(gpu, h1, dx.g, nb) && !gpu->download(gpu, h2, dxo, nb), "download dx");
          worst = 0.0;
          for (size_t k = 0; k < cnt; k++) {
            double a = test_get(h2, dt, k), d = fabs((double)test_get(h1, dt, k) - a);
            if (fabs(a) > mr) mr = fabs(a);
            if (d > worst) worst = d;
          }
          TT_CHECK(worst <= tol_ew(dt) * mr + 1e-6, "bn_bwd %s %dx%dx%d: dx of the flat form differs from the per-channel "
                   "kernels' by %.3g (max %.3g)", test_dt_name(dt), N, C, HW, worst, mr);
        }
        free(hs), free(hx), free(hdy), free(h1), free(h2);
      }
      BOTH(B->bn_fwd_infer(B, N, C, HW, SD(dt), P(x), PF(g), PF(bb), PF(rm), PF(rv), 1e-5f, P(y), NULL, 0));
      cmp("bn_fwd_infer", y, tol_ew(dt));
      fr(&x), fr(&y), fr(&g), fr(&bb), fr(&rm), fr(&rv), fr(&sm), fr(&si), fr(&dy), fr(&dx), fr(&dg), fr(&db);
#undef WS
    }
  }
  tt_cuda_set_bn_resident(gpu, res_cap);
  TT_TEST_END();
}

/* Batch norm and ReLU as one call (backend.h bn_fwd_train_relu, bn_bwd_relu) on the device, bit
 * for bit the two calls they stand for on the same device: bn_fwd_train then act_fwd(RELU) in
 * place; act_bwd(RELU) then bn_bwd. The shapes of cuda_batchnorm (per-channel kernels with 16-,
 * 8- and 2-byte vectors, several blocks a channel, the rows form for hw == 1, the flat form at
 * 49) and hw 9 (1-element vectors); beta_dx 0 and 1; and gamma 1e-8, where many outputs are
 * tiny enough to round to +0 or -0 in fp16 (the ReLU's backward then passes nothing: the fused
 * backward must round before it tests). */
static void test_bn_relu_fused(void) {
  int shapes[6][3] = {{8, 16, 49}, {3, 5, 1024}, {64, 7, 1}, {16, 3, 1100}, {2, 3, 4099}, {4, 6, 9}};
  TT_TEST_BEGIN("cuda_bn_relu_fused");
  TT_CHECK(gpu->bn_fwd_train_relu && gpu->bn_bwd_relu, "the CUDA backend's table lists no fused batch norm + ReLU");
  if (!gpu->bn_fwd_train_relu || !gpu->bn_bwd_relu) {
    TT_TEST_END();
    return;
  }
  for (int di = 0; di < 3; di++)
    for (int s = 0; s < 6; s++)
      for (int tiny = 0; tiny < 2; tiny++) {
        tt_dtype dt = test_dts[di];
        int N = shapes[s][0], C = shapes[s][1], HW = shapes[s][2], zeros = 0;
        size_t cnt = (size_t)N * C * HW, nb = cnt * tt_dtype_size(dt), wsb, fb = (size_t)C * sizeof(float);
        tt_op_desc od;
        void *ws, *y1, *y2, *t, *dx1, *dx2;
        float *st; /* 12 per-channel vectors: rm, rv, sm, si, dg, db for the two forms */
        unsigned char *h1 = (unsigned char *)malloc(nb), *h2 = (unsigned char *)malloc(nb);
        goff = 0;
        memset(&od, 0, sizeof od);
        od.kind = TT_OP_BN_BWD, od.dt = dt, od.u.bn.n = N, od.u.bn.c = C, od.u.bn.hw = HW, od.u.bn.eps = 1e-5f;
        wsb = gpu->op_workspace(gpu, &od);
        ws = test_galloc(wsb ? wsb : 1);
        tt2 x = mk(cnt, dt, -2, 3), dy = mk(cnt, dt, -1, 1), dx0 = mk(cnt, dt, -1, 1);
        tt2 g = mk(C, TT_F32, tiny ? 1e-8f : 0.5f, tiny ? 1e-8f : 1.5f), bb = mk(C, TT_F32, tiny ? 0.0f : -1.0f, tiny ? 0.0f : 1.0f);
        tt2 stat = mk(6 * (size_t)C, TT_F32, 0.5f, 1.0f);
        y1 = test_galloc(nb), y2 = test_galloc(nb), t = test_galloc(nb), dx1 = test_galloc(nb), dx2 = test_galloc(nb);
        st = (float *)test_galloc(12 * fb);
        int ok = h1 && h2 && !gpu->upload(gpu, st, stat.c, 6 * fb) && !gpu->upload(gpu, st + 6 * C, stat.c, 6 * fb);
        ok = ok && !gpu->bn_fwd_train(gpu, N, C, HW, dt, x.g, (const float *)g.g, (const float *)bb.g, y1, st, st + C, 0.1f,
                                      1e-5f, st + 2 * C, st + 3 * C, 1, ws, wsb) &&
             !gpu->act_fwd(gpu, TT_ACT_RELU, cnt, dt, y1, y1) &&
             !gpu->bn_fwd_train_relu(gpu, N, C, HW, dt, x.g, (const float *)g.g, (const float *)bb.g, y2, st + 6 * C,
                                     st + 7 * C, 0.1f, 1e-5f, st + 8 * C, st + 9 * C, 1, ws, wsb);
        TT_CHECK(ok, "fused bn %s %dx%dx%d forward: %s", test_dt_name(dt), N, C, HW, gpu->last_error(gpu));
        if (ok) {
          TT_CHECK(!gpu->download(gpu, h1, y1, nb) && !gpu->download(gpu, h2, y2, nb) && !memcmp(h1, h2, nb),
                   "bn_fwd_train_relu %s %dx%dx%d%s: y differs from bn_fwd_train then act_fwd(RELU)", test_dt_name(dt), N, C,
                   HW, tiny ? " (gamma 1e-8)" : "");
          for (size_t i = 0; i < cnt; i++) zeros += test_get(h1, dt, i) == 0.0f;
          TT_CHECK(!gpu->download(gpu, h1, st, 4 * fb) && !gpu->download(gpu, h2, st + 6 * C, 4 * fb) &&
                       !memcmp(h1, h2, 4 * fb),
                   "bn_fwd_train_relu %s %dx%dx%d: statistics differ from bn_fwd_train's", test_dt_name(dt), N, C, HW);
        }
        for (int beta = 0; beta < 2 && ok; beta++) {
          ok = !gpu->download(gpu, h1, dx0.g, nb) && !gpu->upload(gpu, dx1, h1, nb) && !gpu->upload(gpu, dx2, h1, nb) &&
               !gpu->upload(gpu, st + 4 * C, stat.c, 2 * fb) && !gpu->upload(gpu, st + 10 * C, stat.c, 2 * fb) &&
               !gpu->act_bwd(gpu, TT_ACT_RELU, cnt, dt, y1, dy.g, t, 0.0f) &&
               !gpu->bn_bwd(gpu, N, C, HW, dt, x.g, t, (const float *)g.g, st + 2 * C, st + 3 * C, dx1, st + 4 * C,
                            st + 5 * C, (float)beta, (float)beta, ws, wsb) &&
               !gpu->bn_bwd_relu(gpu, N, C, HW, dt, x.g, dy.g, (const float *)g.g, (const float *)bb.g, st + 8 * C,
                                 st + 9 * C, dx2, st + 10 * C, st + 11 * C, (float)beta, (float)beta, ws, wsb);
          TT_CHECK(ok, "fused bn %s %dx%dx%d backward: %s", test_dt_name(dt), N, C, HW, gpu->last_error(gpu));
          if (!ok) break;
          TT_CHECK(!gpu->download(gpu, h1, dx1, nb) && !gpu->download(gpu, h2, dx2, nb) && !memcmp(h1, h2, nb),
                   "bn_bwd_relu %s %dx%dx%d%s beta %d: dx differs from act_bwd(RELU) then bn_bwd", test_dt_name(dt), N, C, HW,
                   tiny ? " (gamma 1e-8)" : "", beta);
          TT_CHECK(!gpu->download(gpu, h1, st + 4 * C, 2 * fb) && !gpu->download(gpu, h2, st + 10 * C, 2 * fb) &&
                       !memcmp(h1, h2, 2 * fb),
                   "bn_bwd_relu %s %dx%dx%d beta %d: dgamma or dbias differ from act_bwd(RELU) then bn_bwd", test_dt_name(dt),
                   N, C, HW, beta);
        }
        /* the ReLU zeroed some outputs and passed others (and gamma 1e-8 in fp16 rounds most to 0) */
        TT_CHECK((zeros > 0 && (size_t)zeros < cnt) || (tiny && dt == TT_F16 && zeros > 0),
                 "bn %s %dx%dx%d%s: %d of %zu outputs zero: the inputs do not exercise the ReLU", test_dt_name(dt), N, C, HW,
                 tiny ? " (gamma 1e-8)" : "", zeros, cnt);
        free(h1), free(h2), fr(&x), fr(&dy), fr(&dx0), fr(&g), fr(&bb), fr(&stat);
      }
  TT_TEST_END();
}

/* The held-on-chip batch norm (cuda_norm.cu, one read of x and dy where a block's channels fit
 * its shared memory) against the two-pass forms on the same device (tt_cuda_set_bn_resident(gpu,
 * 0) turns it off): the statistics and dgamma/dbias to rounding (the sums are grouped
 * differently), y bit for bit the two-pass normalisation of its own statistics (bn_apply), dx
 * within the element-wise tolerance, dx computed in place over dy bit for bit the out-of-place dx.
 * Shapes: groups of 8, 4, 2 and 1 channels a block (7x7, 3x3, 14x14, 32x32), a 112x112 plane
 * whose backward fills 50,176 of the 64,512 bytes (fp16; fp32 backward does not fit: two-pass),
 * and shapes it refuses (channels not a multiple of the group; hw 1). Under the emulation the
 * launches show which form ran, against the rule restated here. */
static void test_bn_resident(void) {
  int shapes[7][3] = {{8, 16, 49}, {5, 24, 9}, {2, 6, 196}, {3, 5, 1024}, {1, 4, 12544}, {2, 3, 4099}, {16, 8, 1}};
  const size_t cap = tt_cuda_set_bn_resident(gpu, (size_t)-1);
  TT_TEST_BEGIN("cuda_bn_resident");
  TT_CHECK(cap >= 50176, "the held-on-chip batch norm's cap is %zu bytes (want at least 50,176: a T4's opt-in less static)",
           cap);
  for (int di = 0; di < 3; di++)
    for (int s = 0; s < 7; s++) {
      tt_dtype dt = test_dts[di];
      int N = shapes[s][0], C = shapes[s][1], HW = shapes[s][2];
      size_t es = tt_dtype_size(dt), cnt = (size_t)N * C * HW, nb = cnt * es, wsb, fb = (size_t)C * sizeof(float);
      size_t pl = (size_t)HW * es, gr = 16;
      tt_op_desc od;
      void *ws, *y[2], *dx[2], *dxi;
      float *st[2]; /* rm, rv, sm, si, dg, db per form */
      unsigned char *h1 = (unsigned char *)malloc(nb), *h2 = (unsigned char *)malloc(nb), *hdx = (unsigned char *)malloc(nb);
      float *hs = (float *)malloc(12 * fb);
      int ok = h1 && h2 && hdx && hs;
      while (pl % gr) gr >>= 1; /* gcd(plane bytes, 16) */
      gr = 16 / gr;             /* channels per block */
      goff = 0;
      memset(&od, 0, sizeof od);
      od.kind = TT_OP_BN_BWD, od.dt = dt, od.u.bn.n = N, od.u.bn.c = C, od.u.bn.hw = HW, od.u.bn.eps = 1e-5f;
      wsb = gpu->op_workspace(gpu, &od);
      ws = test_galloc(wsb ? wsb : 1);
      tt2 x = mk(cnt, dt, -2, 3), dy = mk(cnt, dt, -1, 1), dx0 = mk(cnt, dt, -1, 1), g = mk(C, TT_F32, 0.5f, 1.5f);
      tt2 bb = mk(C, TT_F32, -1, 1), stat = mk(6 * (size_t)C, TT_F32, 0.5f, 1.0f);
      dxi = test_galloc(nb);
      for (int f = 0; f < 2 && ok; f++) { /* f = 0: held on chip (where it applies), 1: two-pass */
        y[f] = test_galloc(nb), dx[f] = test_galloc(nb), st[f] = (float *)test_galloc(6 * fb);
        tt_cuda_set_bn_resident(gpu, f ? 0 : cap);
#ifdef TT_CUDA_EMULATION
        size_t rf0 = tt_emu_kernel_launches("cuda_bn_res_fwd_k"), rb0 = tt_emu_kernel_launches("cuda_bn_res_bwd_k");
#endif
        ok = !gpu->upload(gpu, st[f], stat.c, 6 * fb) && !gpu->download(gpu, hdx, dx0.g, nb) &&
             !gpu->upload(gpu, dx[f], hdx, nb) &&
             !gpu->bn_fwd_train(gpu, N, C, HW, dt, x.g, (const float *)g.g, (const float *)bb.g, y[f], st[f], st[f] + C,
                                0.1f, 1e-5f, st[f] + 2 * C, st[f] + 3 * C, 1, ws, wsb) &&
             !gpu->bn_bwd(gpu, N, C, HW, dt, x.g, dy.g, (const float *)g.g, st[f] + 2 * C, st[f] + 3 * C, dx[f],
                          st[f] + 4 * C, st[f] + 5 * C, 1.0f, 1.0f, ws, wsb) &&
             !gpu->sync(gpu);
        TT_CHECK(ok, "bn %s %dx%dx%d (%s): %s", test_dt_name(dt), N, C, HW, f ? "two-pass" : "held on chip",
                 gpu->last_error(gpu));
#ifdef TT_CUDA_EMULATION
        if (ok) { /* which form ran: the rule of cuda_bn_res_geometry, restated */
          int fits = HW > 1 && C % (int)gr == 0 && gr <= 8;
          int wf = !f && fits && (size_t)N * gr * pl <= cap, wb = !f && fits && 2 * (size_t)N * gr * pl <= cap;
          size_t rf = tt_emu_kernel_launches("cuda_bn_res_fwd_k") - rf0, rb = tt_emu_kernel_launches("cuda_bn_res_bwd_k") - rb0;
          TT_CHECK(rf == (size_t)wf && rb == (size_t)wb,
                   "bn %s %dx%dx%d (%s): %zu and %zu held-on-chip launches forward and backward, want %d and %d",
                   test_dt_name(dt), N, C, HW, f ? "turned off" : "on", rf, rb, wf, wb);
        }
#endif
      }
      tt_cuda_set_bn_resident(gpu, cap);
      if (ok) { /* the statistics (and running ones) and dgamma/dbias to rounding */
        double worst = 0.0, wg = 0.0, gmax = 1e-3;
        TT_CHECK(!gpu->download(gpu, hs, st[0], 6 * fb) && !gpu->download(gpu, hs + 6 * C, st[1], 6 * fb), "download");
        for (int k = 4 * C; k < 6 * C; k++)
          if (fabs((double)hs[6 * C + k]) > gmax) gmax = fabs((double)hs[6 * C + k]);
        for (int k = 0; k < 6 * C; k++) { /* dgamma, dbias: sums of signed terms, against their largest */
          double d = fabs((double)hs[k] - hs[6 * C + k]) / (k < 4 * C ? fabs((double)hs[6 * C + k]) + 1e-3 : gmax);
          if (k < 4 * C && d > worst) worst = d;
          if (k >= 4 * C && d > wg) wg = d;
        }
        TT_CHECK(worst <= 1e-5, "bn_fwd_train %s %dx%dx%d: statistics differ between the forms by %.3g", test_dt_name(dt), N,
                 C, HW, worst);
        TT_CHECK(wg <= (dt == TT_F32 ? 1e-5 : 1e-4), "bn_bwd %s %dx%dx%d: dgamma or dbias differ between the forms by %.3g",
                 test_dt_name(dt), N, C, HW, wg);
        /* y: the two-pass normalisation (bn_apply) of the held-on-chip statistics, bit for bit */
        ok = !cuda_bn_apply_fn()(gpu, N, C, HW, dt, x.g, (const float *)g.g, (const float *)bb.g, st[0] + 2 * C,
                               st[0] + 3 * C, y[1]) &&
             !gpu->download(gpu, h1, y[0], nb) && !gpu->download(gpu, h2, y[1], nb);
        TT_CHECK(ok && !memcmp(h1, h2, nb), "bn_fwd_train %s %dx%dx%d: y held on chip is not the two-pass normalisation of "
                 "its statistics", test_dt_name(dt), N, C, HW);
        /* dx to rounding (its sums differ to rounding) */
        ok = !gpu->download(gpu, h1, dx[0], nb) && !gpu->download(gpu, h2, dx[1], nb);
        if (ok) {
          double wd = 0.0, mr = 0.0;
          for (size_t k = 0; k < cnt; k++) {
            double a = test_get(h2, dt, k), d = fabs((double)test_get(h1, dt, k) - a);
            if (fabs(a) > mr) mr = fabs(a);
            if (d > wd) wd = d;
          }
          TT_CHECK(wd <= tol_ew(dt) * mr + 1e-6, "bn_bwd %s %dx%dx%d: dx differs between the forms by %.3g (max %.3g)",
                   test_dt_name(dt), N, C, HW, wd, mr);
        }
        /* in place over dy (backend.h allows dx == dy), beta 0: bit for bit the out-of-place call */
        ok = !gpu->download(gpu, hdx, dy.g, nb) && !gpu->upload(gpu, dxi, hdx, nb) &&
             !gpu->bn_bwd(gpu, N, C, HW, dt, x.g, dy.g, (const float *)g.g, st[0] + 2 * C, st[0] + 3 * C, dx[1], NULL, NULL,
                          0.0f, 0.0f, ws, wsb) &&
             !gpu->bn_bwd(gpu, N, C, HW, dt, x.g, dxi, (const float *)g.g, st[0] + 2 * C, st[0] + 3 * C, dxi, NULL, NULL,
                          0.0f, 0.0f, ws, wsb) &&
             !gpu->download(gpu, h1, dx[1], nb) && !gpu->download(gpu, h2, dxi, nb);
        TT_CHECK(ok && !memcmp(h1, h2, nb), "bn_bwd %s %dx%dx%d: dx in place over dy differs from dx apart (%s)",
                 test_dt_name(dt), N, C, HW, ok ? "values" : gpu->last_error(gpu));
      }
      free(h1), free(h2), free(hdx), free(hs), fr(&x), fr(&dy), fr(&dx0), fr(&g), fr(&bb), fr(&stat);
    }
  TT_TEST_END();
}

static void test_pooling(void) {
  TT_TEST_BEGIN("cuda_pooling");
  /* n c h w kh kw sh sw ph pw */
  /* the last five: planes the tiled kernels (cuda_norm.cu) split into several row bands, with
   * 16-byte loads from a band start off a 32-byte boundary (40x200) and 2-byte ones (21x201),
   * rows wider than a block's 256 threads (20x300, 5x260 at stride 1: the backward's gather
   * steps its column with a carry), and a plane too wide for any band (3x1400: the untiled
   * kernels) */
  int cfg[9][10] = {{2, 3, 28, 28, 2, 2, 2, 2, 0, 0}, {2, 4, 15, 13, 3, 3, 2, 2, 1, 1},
                    {1, 2, 9, 9, 3, 3, 1, 1, 1, 1},   {3, 2, 8, 10, 2, 3, 2, 1, 1, 0},
                    {1, 2, 40, 200, 3, 3, 2, 2, 1, 1}, {2, 1, 21, 201, 3, 3, 2, 2, 1, 1},
                    {1, 2, 20, 300, 3, 3, 2, 2, 1, 1}, {1, 1, 5, 260, 3, 3, 1, 1, 1, 1},
                    {1, 1, 3, 1400, 3, 3, 2, 2, 1, 1}};
  for (int di = 0; di < 3; di++) {
    tt_dtype dt = test_dts[di];
    for (int k = 0; k < 9; k++)
      for (int mode = 0; mode < 2; mode++) {
        tt_pool_desc d;
        int *c = cfg[k];
        goff = 0;
        d.n = c[0], d.c = c[1], d.h = c[2], d.w = c[3], d.kh = c[4], d.kw = c[5], d.stride_h = c[6], d.stride_w = c[7];
        d.pad_h = c[8], d.pad_w = c[9], d.layout = TT_LAYOUT_NCHW;
        d.p = (d.h + 2 * d.pad_h - d.kh) / d.stride_h + 1, d.q = (d.w + 2 * d.pad_w - d.kw) / d.stride_w + 1;
        size_t xin = (size_t)d.n * d.c * d.h * d.w, yout = (size_t)d.n * d.c * d.p * d.q;
        /* coarse values so that windows have ties: first-max must agree */
        tt2 x = mk(xin, dt, 0, 0), y = mk(yout, dt, 0, 0), dy = mk(yout, dt, -1, 1), dx = mk(xin, dt, -1, 1);
        for (size_t i = 0; i < xin; i++) test_put(&x, i, (float)(int)test_rand(-3, 3));
        test_push(&x);
        BOTH(B->pool_fwd(B, &d, (tt_pool_mode)mode, SD(dt), P(x), P(y), NULL, 0));
        cmp(mode ? "avgpool fwd" : "maxpool fwd", y, tol_ew(dt));
        BOTH(B->pool_bwd(B, &d, (tt_pool_mode)mode, SD(dt), P(x), P(dy), P(dx), 1.0f, NULL, 0));
        cmp(mode ? "avgpool bwd" : "maxpool bwd (first max)", dx, tol_ew(dt));
        if (mode == TT_POOL_MAX) { /* compact save: the uint8 in-window index */
          unsigned char *z = (unsigned char *)calloc(yout, 1);
          tt2 idx = mk_raw(yout, z), dx2 = mk(xin, dt, -1, 1);
          free(z);
          BOTH(B->pool_argmax(B, &d, SD(dt), P(x), (uint8_t *)P(idx)));
          cmp_bytes("pool_argmax", idx);
          BOTH(B->pool_bwd(B, &d, TT_POOL_MAX, SD(dt), P(x), P(dy), P(dx), 0.0f, NULL, 0));
          BOTH(B->pool_bwd_idx(B, &d, SD(dt), (const uint8_t *)P(idx), P(dy), P(dx2), 0.0f));
          TT_CHECK(memcmp(dx.c, dx2.c, dx.cbytes) == 0, "cpu pool_bwd_idx != pool_bwd bit for bit (k=%d)", k);
          cmp("pool_bwd_idx", dx2, tol_ew(dt)); /* after the memcmp (cmp changes a bf16 reference copy) */
          fr(&idx), fr(&dx2);
        }
        fr(&x), fr(&y), fr(&dy), fr(&dx);
      }
    {
      int N = 5, C = 7, HW = 49;
      goff = 0;
      tt2 x = mk((size_t)N * C * HW, dt, -1, 1), y = mk((size_t)N * C, dt, 0, 0), dx = mk((size_t)N * C * HW, dt, -1, 1);
      BOTH(B->gap_fwd(B, N, C, HW, SD(dt), P(x), P(y)));
      cmp("gap_fwd", y, tol_ew(dt));
      BOTH(B->gap_bwd(B, N, C, HW, SD(dt), P(y), P(dx), 1.0f));
      cmp("gap_bwd", dx, tol_ew(dt));
      fr(&x), fr(&y), fr(&dx);
    }
  }
  TT_TEST_END();
}

/* Whether gpu refuses bf16 convolutions and GEMMs (a device below compute capability 8.0: cuDNN's
 * bf16 configuration needs 8.0); a refusal must say why. */
static int test_bf16_lib_refused(void) {
  tt_conv_desc d;
  char msg[512];
  size_t a, l;
  memset(&d, 0, sizeof d);
  d.n = 2, d.c = 3, d.h = d.w = 8, d.k = 4, d.r = d.s = 3, d.stride_h = d.stride_w = 1, d.pad_h = d.pad_w = 1;
  d.groups = 1, d.p = d.q = 8;
  a = gpu->conv_workspace(gpu, &d, TT_BF16, TT_WS_FWD);
  snprintf(msg, sizeof msg, "%s", a == TT_WS_ERROR ? gpu->last_error(gpu) : "");
  l = gpu->linear_workspace(gpu, 4, 8, 2, TT_BF16, TT_WS_FWD);
  if (a != TT_WS_ERROR && l != TT_WS_ERROR) return 0;
  TT_CHECK(a == TT_WS_ERROR && l == TT_WS_ERROR, "bf16: conv (%s) and linear (%s) disagree on this device", msg,
           l == TT_WS_ERROR ? gpu->last_error(gpu) : "accepted");
  TT_CHECK(strstr(msg, "compute capability 8.0") && strstr(gpu->last_error(gpu), "compute capability 8.0"),
           "a bf16 refusal without its reason: '%s' / '%s'", msg, gpu->last_error(gpu));
  return 1;
}

static void test_conv_dt(tt_dtype dt);
static void test_linear_dt(tt_dtype dt);

static void test_conv(void) {
  TT_TEST_BEGIN("cuda_conv");
  for (int di = 0; di < 3; di++) {
    if (test_dts[di] == TT_BF16 && test_bf16_lib_refused()) {
      printf("  bf16 convolutions: refused below compute capability 8.0, as expected%s\n",
#ifdef TT_CUDA_EMULATION
             " (cuda_bf16_conv_linear_sm80 runs them at an emulated 8.0)"
#else
             ""
#endif
      );
      continue;
    }
    test_conv_dt(test_dts[di]);
    if (tt_test_current_failed) break;
  }
  TT_TEST_END();
}

static void test_conv_dt(tt_dtype dt) {
  /* n c h w k r s sh sw ph pw groups */
  int cfg[5][12] = {{4, 3, 16, 16, 8, 3, 3, 1, 1, 1, 1, 1}, {2, 8, 15, 15, 16, 3, 3, 2, 2, 1, 1, 2},
                    {3, 8, 9, 9, 8, 3, 3, 1, 1, 1, 1, 8}, {2, 6, 8, 8, 6, 1, 3, 1, 1, 0, 1, 1},
                    {8, 16, 7, 7, 32, 1, 1, 1, 1, 0, 0, 1}};
  {
    for (int k = 0; k < 5; k++) {
      tt_conv_desc d;
      int *c = cfg[k];
      goff = 0;
      d.n = c[0], d.c = c[1], d.h = c[2], d.w = c[3], d.k = c[4], d.r = c[5], d.s = c[6], d.stride_h = c[7];
      d.stride_w = c[8], d.pad_h = c[9], d.pad_w = c[10], d.groups = c[11];
      d.layout_x = d.layout_y = TT_LAYOUT_NCHW;
      d.p = (d.h + 2 * d.pad_h - d.r) / d.stride_h + 1, d.q = (d.w + 2 * d.pad_w - d.s) / d.stride_w + 1;
      size_t xin = (size_t)d.n * d.c * d.h * d.w, yout = (size_t)d.n * d.k * d.p * d.q;
      size_t wn = (size_t)d.k * (d.c / d.groups) * d.r * d.s;
      size_t wsz[2] = {0, 0};
      for (int wk = 0; wk < 3; wk++) {
        size_t a = cpu->conv_workspace(cpu, &d, test_cdt(dt), (tt_ws_kind)wk), bq = gpu->conv_workspace(gpu, &d, dt, (tt_ws_kind)wk);
        TT_CHECK(a != TT_WS_ERROR && bq != TT_WS_ERROR, "conv_workspace %s: cpu %s / cuda %s", test_dt_name(dt),
                 a == TT_WS_ERROR ? cpu->last_error(cpu) : "ok", bq == TT_WS_ERROR ? gpu->last_error(gpu) : "ok");
        if (a == TT_WS_ERROR || bq == TT_WS_ERROR) return;
        wsz[0] = a > wsz[0] ? a : wsz[0];
        wsz[1] = bq > wsz[1] ? bq : wsz[1];
      }
      tt2 x = mk(xin, dt, -1, 1), w = mk(wn, dt, -0.5f, 0.5f), bias = mk(d.k, dt, -1, 1), y = mk(yout, dt, 0, 0);
      tt2 dy = mk(yout, dt, -1, 1), dx = mk(xin, dt, -1, 1), dw = mk(wn, TT_F32, -1, 1), db = mk(d.k, TT_F32, -1, 1);
      tt2 ws;
      ws.c = malloc(wsz[0] + 1), ws.g = test_galloc(wsz[1] + 1);
#define WS (side ? ws.g : ws.c), (side ? wsz[1] : wsz[0])
      BOTH(B->conv_fwd(B, &d, SD(dt), P(x), P(w), P(bias), P(y), WS));
      cmp("conv_fwd", y, tol_mm(dt));
      BOTH(B->conv_bwd_data(B, &d, SD(dt), P(dy), P(w), P(dx), 1.0f, WS));
      cmp("conv_bwd_data beta=1", dx, tol_mm(dt));
      BOTH(B->conv_bwd_data(B, &d, SD(dt), P(dy), P(w), P(dx), 0.0f, WS));
      cmp("conv_bwd_data beta=0", dx, tol_mm(dt));
      BOTH(B->conv_bwd_filter(B, &d, SD(dt), P(x), P(dy), PF(dw), PF(db), 1.0f, WS));
      cmp("conv_bwd_filter dw beta=1", dw, tol_mm(dt));
      cmp("conv_bwd_filter db beta=1", db, tol_mm(dt));
      BOTH(B->conv_bwd_filter(B, &d, SD(dt), P(x), P(dy), PF(dw), NULL, 0.0f, WS));
      cmp("conv_bwd_filter dw beta=0", dw, tol_mm(dt));
#undef WS
      free(ws.c);
      fr(&x), fr(&w), fr(&bias), fr(&y), fr(&dy), fr(&dx), fr(&dw), fr(&db);
      if (tt_test_current_failed) {
        printf("  (conv config %d, %s)\n", k, test_dt_name(dt));
        break;
      }
    }
  }
}

/* NHWC activations (backend.h's layouts_16bit: what the planner gives the CUDA backend for fp16
 * and bf16 programs under TINYTRAIN_LAYOUT=nhwc), each against the reference's NCHW on the same
 * values: convolutions whose x and y layouts are NCHW -> NHWC (a network's first), NHWC -> NHWC
 * and NHWC -> NCHW (forward with bias, backward data added into, backward filter with the bias
 * gradient added into); max and
 * average pooling (the index of the compact save in NHWC order too) and global average pooling
 * as the whole-window average the planner makes of it; batch norm called as [n*h*w, c, 1]. */
static void test_nhwc_dt(tt_dtype dt) {
  /* n c h w k r s sh sw ph pw groups */
  int cfg[3][12] = {{3, 3, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1}, {2, 8, 9, 9, 16, 3, 3, 2, 2, 1, 1, 2}, {4, 16, 5, 5, 8, 1, 1, 1, 1, 0, 0, 1}};
  int lay[3][2] = {{TT_LAYOUT_NCHW, TT_LAYOUT_NHWC}, {TT_LAYOUT_NHWC, TT_LAYOUT_NHWC}, {TT_LAYOUT_NHWC, TT_LAYOUT_NCHW}};
  for (int k = 0; k < 3 && !tt_test_current_failed; k++) {
    tt_conv_desc d, dn;
    int *c = cfg[k];
    goff = 0;
    memset(&d, 0, sizeof d);
    d.n = c[0], d.c = c[1], d.h = c[2], d.w = c[3], d.k = c[4], d.r = c[5], d.s = c[6], d.stride_h = c[7];
    d.stride_w = c[8], d.pad_h = c[9], d.pad_w = c[10], d.groups = c[11];
    d.p = (d.h + 2 * d.pad_h - d.r) / d.stride_h + 1, d.q = (d.w + 2 * d.pad_w - d.s) / d.stride_w + 1;
    dn = d; /* the device's: the layouts of lay[k]; the reference's (d) NCHW */
    dn.layout_x = lay[k][0], dn.layout_y = lay[k][1];
    int hw = d.h * d.w, pq = d.p * d.q, xn = dn.layout_x == TT_LAYOUT_NHWC, yn = dn.layout_y == TT_LAYOUT_NHWC;
    size_t wn = (size_t)d.k * (d.c / d.groups) * d.r * d.s, wsz[2] = {0, 0};
    for (int wk = 0; wk < 3; wk++) {
      size_t a = cpu->conv_workspace(cpu, &d, test_cdt(dt), (tt_ws_kind)wk), bq = gpu->conv_workspace(gpu, &dn, dt, (tt_ws_kind)wk);
      TT_CHECK(a != TT_WS_ERROR && bq != TT_WS_ERROR, "conv_workspace %s %s -> %s: cpu %s / cuda %s", test_dt_name(dt),
               tt_layout_name(dn.layout_x), tt_layout_name(dn.layout_y), a == TT_WS_ERROR ? cpu->last_error(cpu) : "ok",
               bq == TT_WS_ERROR ? gpu->last_error(gpu) : "ok");
      if (a == TT_WS_ERROR || bq == TT_WS_ERROR) return;
      wsz[0] = a > wsz[0] ? a : wsz[0];
      wsz[1] = bq > wsz[1] ? bq : wsz[1];
    }
    tt2 x = mk((size_t)d.n * d.c * hw, dt, -1, 1), w = mk(wn, dt, -0.5f, 0.5f), bias = mk(d.k, dt, -1, 1);
    tt2 y = mk((size_t)d.n * d.k * pq, dt, 0, 0), dy = mk((size_t)d.n * d.k * pq, dt, -1, 1);
    tt2 dx = mk((size_t)d.n * d.c * hw, dt, -1, 1), dw = mk(wn, TT_F32, -1, 1), db = mk(d.k, TT_F32, -1, 1);
    if (xn) test_push_nhwc(&x, d.n, d.c, hw), test_push_nhwc(&dx, d.n, d.c, hw);
    if (yn) test_push_nhwc(&dy, d.n, d.k, pq);
    tt2 ws;
    ws.c = malloc(wsz[0] + 1), ws.g = test_galloc(wsz[1] + 1);
    char what[96];
#define WS (side ? ws.g : ws.c), (side ? wsz[1] : wsz[0])
#define CMPL(name_, t_, isn_, ch_, hw_, tol_)                                                                     \
  (snprintf(what, sizeof what, "%s %s -> %s", name_, tt_layout_name(dn.layout_x), tt_layout_name(dn.layout_y)), \
   (isn_) ? cmp_nhwc(what, t_, d.n, ch_, hw_, tol_) : cmp(what, t_, tol_))
    BOTH(B->conv_fwd(B, side ? &dn : &d, SD(dt), P(x), P(w), P(bias), P(y), WS));
    CMPL("conv_fwd (bias)", y, yn, d.k, pq, tol_mm(dt));
    BOTH(B->conv_bwd_data(B, side ? &dn : &d, SD(dt), P(dy), P(w), P(dx), 1.0f, WS));
    CMPL("conv_bwd_data beta=1", dx, xn, d.c, hw, tol_mm(dt));
    BOTH(B->conv_bwd_filter(B, side ? &dn : &d, SD(dt), P(x), P(dy), PF(dw), PF(db), 1.0f, WS));
    CMPL("conv_bwd_filter dw beta=1", dw, 0, 0, 0, tol_mm(dt));
    CMPL("conv_bwd_filter db beta=1", db, 0, 0, 0, tol_mm(dt));
#undef CMPL
#undef WS
    free(ws.c);
    fr(&x), fr(&w), fr(&bias), fr(&y), fr(&dy), fr(&dx), fr(&dw), fr(&db);
    if (tt_test_current_failed) printf("  (NHWC conv config %d, %s)\n", k, test_dt_name(dt));
  }
  /* pooling: n c h w kh kw sh sw ph pw; the last the whole window (global average pooling) */
  int pcfg[3][10] = {{2, 3, 8, 8, 2, 2, 2, 2, 0, 0}, {2, 5, 9, 7, 3, 3, 2, 2, 1, 1}, {3, 6, 5, 5, 5, 5, 1, 1, 0, 0}};
  for (int k = 0; k < 3 && !tt_test_current_failed; k++)
    for (int mode = 0; mode < 2; mode++) {
      tt_pool_desc d, dn;
      int *c = pcfg[k];
      goff = 0;
      memset(&d, 0, sizeof d);
      d.n = c[0], d.c = c[1], d.h = c[2], d.w = c[3], d.kh = c[4], d.kw = c[5], d.stride_h = c[6], d.stride_w = c[7];
      d.pad_h = c[8], d.pad_w = c[9], d.layout = TT_LAYOUT_NCHW;
      d.p = (d.h + 2 * d.pad_h - d.kh) / d.stride_h + 1, d.q = (d.w + 2 * d.pad_w - d.kw) / d.stride_w + 1;
      dn = d, dn.layout = TT_LAYOUT_NHWC;
      int hw = d.h * d.w, pq = d.p * d.q;
      size_t xin = (size_t)d.n * d.c * hw, yout = (size_t)d.n * d.c * pq;
      tt2 x = mk(xin, dt, 0, 0), y = mk(yout, dt, 0, 0), dy = mk_nhwc(d.n, d.c, pq, dt, -1, 1), dx = mk_nhwc(d.n, d.c, hw, dt, -1, 1);
      for (size_t i = 0; i < xin; i++) test_put(&x, i, (float)(int)test_rand(-3, 3)); /* ties: the first maximum */
      test_push_nhwc(&x, d.n, d.c, hw);
      BOTH(B->pool_fwd(B, side ? &dn : &d, (tt_pool_mode)mode, SD(dt), P(x), P(y), NULL, 0));
      cmp_nhwc(mode ? "NHWC avgpool fwd" : "NHWC maxpool fwd", y, d.n, d.c, pq, tol_ew(dt));
      BOTH(B->pool_bwd(B, side ? &dn : &d, (tt_pool_mode)mode, SD(dt), P(x), P(dy), P(dx), 1.0f, NULL, 0));
      cmp_nhwc(mode ? "NHWC avgpool bwd" : "NHWC maxpool bwd", dx, d.n, d.c, hw, tol_ew(dt));
      if (mode == TT_POOL_MAX) { /* the compact save's index, in the desc's layout */
        unsigned char *z = (unsigned char *)calloc(yout, 1), *hi = (unsigned char *)malloc(yout), *hn = (unsigned char *)malloc(yout);
        tt2 idx = mk_raw(yout, z), dx2 = mk_nhwc(d.n, d.c, hw, dt, -1, 1);
        BOTH(B->pool_argmax(B, side ? &dn : &d, SD(dt), P(x), (uint8_t *)P(idx)));
        TT_CHECK(!gpu->download(gpu, hi, idx.g, yout), "download idx");
        test_permute(hi, hn, d.n, d.c, pq, 1, 0);
        TT_CHECK(memcmp(hn, idx.c, yout) == 0, "NHWC pool_argmax (%s, config %d): the index differs from the reference's",
                 test_dt_name(dt), k);
        BOTH(B->pool_bwd_idx(B, side ? &dn : &d, SD(dt), (const uint8_t *)P(idx), P(dy), P(dx2), 0.0f));
        cmp_nhwc("NHWC pool_bwd_idx", dx2, d.n, d.c, hw, tol_ew(dt));
        free(z), free(hi), free(hn), fr(&idx), fr(&dx2);
      }
      fr(&x), fr(&y), fr(&dy), fr(&dx);
    }
  /* batch norm: the reference per channel over [N, C, HW]; the device on the NHWC tensor as
   * [N*HW, C, 1]. N*HW = 1200 rows: the channel split over several blocks */
  for (int s = 0; s < 2 && !tt_test_current_failed; s++) {
    int N = s ? 12 : 3, C = s ? 7 : 16, HW = s ? 100 : 9, R = N * HW;
    size_t cnt = (size_t)N * C * HW, wsb;
    void *ws;
    tt_op_desc od;
    goff = 0;
    memset(&od, 0, sizeof od);
    od.kind = TT_OP_BN_BWD, od.dt = dt, od.u.bn.n = R, od.u.bn.c = C, od.u.bn.hw = 1, od.u.bn.eps = 1e-5f;
    wsb = gpu->op_workspace(gpu, &od);
    ws = test_galloc(wsb ? wsb : 1);
#define WS side ? ws : NULL, side ? wsb : 0
#define BNN side ? R : N, C, side ? 1 : HW
    tt2 x = mk_nhwc(N, C, HW, dt, -2, 3), y = mk(cnt, dt, 0, 0), g = mk(C, TT_F32, 0.5f, 1.5f), bb = mk(C, TT_F32, -1, 1);
    tt2 rm = mk(C, TT_F32, -0.1f, 0.1f), rv = mk(C, TT_F32, 0.9f, 1.1f), sm = mk(C, TT_F32, 0, 0), si = mk(C, TT_F32, 0, 0);
    tt2 dy = mk_nhwc(N, C, HW, dt, -1, 1), dx = mk_nhwc(N, C, HW, dt, -1, 1), dg = mk(C, TT_F32, -1, 1), db = mk(C, TT_F32, -1, 1);
#ifdef TT_CUDA_EMULATION
    size_t rows0 = tt_emu_kernel_launches("cuda_bn_rows_stats_k"), plane0 = tt_emu_kernel_launches("cuda_bn_stats_k");
#endif
    BOTH(B->bn_fwd_train(B, BNN, SD(dt), P(x), PF(g), PF(bb), P(y), PF(rm), PF(rv), 0.1f, 1e-5f, PF(sm), PF(si), 1, WS));
#ifdef TT_CUDA_EMULATION /* hw == 1 takes the row kernels (coalesced over channels), not the per-channel ones */
    TT_CHECK(tt_emu_kernel_launches("cuda_bn_rows_stats_k") == rows0 + 1 && tt_emu_kernel_launches("cuda_bn_stats_k") == plane0,
             "bn_fwd_train on [%d, %d, 1]: %zu row and %zu per-channel statistics launches (want 1 and 0)", R, C,
             tt_emu_kernel_launches("cuda_bn_rows_stats_k") - rows0, tt_emu_kernel_launches("cuda_bn_stats_k") - plane0);
#endif
    cmp_nhwc("NHWC bn_fwd_train y", y, N, C, HW, tol_ew(dt));
    cmp("NHWC bn_fwd_train save_mean", sm, 1e-5);
    cmp("NHWC bn_fwd_train save_invstd", si, 1e-5);
    cmp("NHWC bn_fwd_train running_var", rv, 1e-5);
    if (gpu->bn_apply) { /* and on the device bit for bit the training forward's y (backend.h) */
      tt2 y2 = mk(cnt, dt, 0, 0);
      size_t yb = cnt * tt_dtype_size(dt);
      unsigned char *h1 = (unsigned char *)malloc(yb), *h2 = (unsigned char *)malloc(yb);
      BOTH(B->bn_apply(B, BNN, SD(dt), P(x), PF(g), PF(bb), PF(sm), PF(si), P(y2)));
      TT_CHECK(h1 && h2 && !gpu->download(gpu, h1, y.g, yb) && !gpu->download(gpu, h2, y2.g, yb) && !memcmp(h1, h2, yb),
               "NHWC bn_apply %s [%d, %d, 1]: not bit for bit the training forward's y", test_dt_name(dt), R, C);
      cmp_nhwc("NHWC bn_apply", y2, N, C, HW, tol_ew(dt));
      free(h1), free(h2), fr(&y2);
    }
    BOTH(B->bn_bwd(B, BNN, SD(dt), P(x), P(dy), PF(g), PF(sm), PF(si), P(dx), PF(dg), PF(db), 1.0f, 1.0f, WS));
    cmp_nhwc("NHWC bn_bwd dx", dx, N, C, HW, tol_ew(dt));
    cmp("NHWC bn_bwd dgamma", dg, dt != TT_F32 ? 1e-3 : 1e-5);
    cmp("NHWC bn_bwd dbias", db, dt != TT_F32 ? 1e-3 : 1e-5);
    BOTH(B->bn_fwd_infer(B, BNN, SD(dt), P(x), PF(g), PF(bb), PF(rm), PF(rv), 1e-5f, P(y), NULL, 0));
    cmp_nhwc("NHWC bn_fwd_infer", y, N, C, HW, tol_ew(dt));
#undef BNN
#undef WS
    fr(&x), fr(&y), fr(&g), fr(&bb), fr(&rm), fr(&rv), fr(&sm), fr(&si), fr(&dy), fr(&dx), fr(&dg), fr(&db);
  }
}

static void test_nhwc_ops(void) {
  tt_backend *g0 = gpu, *g80 = NULL;
  int old_cc = 0;
  TT_TEST_BEGIN("cuda_nhwc_ops");
#ifdef TT_CUDA_EMULATION
  { /* bf16 convolutions need sm_80: a second backend on the emulated sm_80, which stays the emulated
     * device's capability for the test (as cuda_bf16_conv_linear_sm80) */
    size_t reserve = 0;
    char msg[512];
    old_cc = tt_emu_set_compute_capability(80);
    g80 = tt_cuda_backend_create(&reserve, msg, sizeof msg);
    TT_CHECK(g80 != NULL, "a backend on the emulated sm_80: %s", msg);
    if (g80) gpu = g80;
  }
#endif
  { /* NCHW by default (cuda_backend.cu says why); NHWC for 16-bit under TINYTRAIN_LAYOUT=nhwc */
    const char *lay = getenv("TINYTRAIN_LAYOUT");
    unsigned want = lay && !strcmp(lay, "nhwc") ? 1u << TT_LAYOUT_NHWC : 0u;
    TT_CHECK(gpu->layouts == 0 && gpu->layouts_16bit == want,
             "the CUDA backend lists layouts %u, layouts_16bit %u (want NCHW for fp32, %s for 16-bit)", gpu->layouts,
             gpu->layouts_16bit, want ? "NHWC under TINYTRAIN_LAYOUT=nhwc" : "NCHW by default");
  }
  for (int di = 1; di < 3 && !tt_test_current_failed; di++) {
    if (test_dts[di] == TT_BF16 && test_bf16_lib_refused()) {
      printf("  NHWC bf16: refused below compute capability 8.0 (fp16 tested)\n");
      continue;
    }
    test_nhwc_dt(test_dts[di]);
  }
  TT_CHECK(gpu->sync(gpu) == 0, "sync: %s", gpu->last_error(gpu));
  gpu = g0;
  if (g80) g80->destroy(g80);
#ifdef TT_CUDA_EMULATION
  tt_emu_set_compute_capability(old_cc);
#else
  (void)old_cc;
#endif
  TT_TEST_END();
}

static void test_linear(void) {
  TT_TEST_BEGIN("cuda_linear");
  for (int di = 0; di < 3; di++) {
    if (test_dts[di] == TT_BF16 && test_bf16_lib_refused()) {
      printf("  bf16 GEMMs: refused below compute capability 8.0, as expected\n");
      continue;
    }
    test_linear_dt(test_dts[di]);
    if (tt_test_current_failed) {
      printf("  (linear, %s)\n", test_dt_name(test_dts[di]));
      break;
    }
  }
  TT_TEST_END();
}

static void test_linear_dt(tt_dtype dt) {
  int cfg[3][3] = {{6, 32, 5}, {64, 400, 120}, {33, 257, 10}};
  {
    for (int k = 0; k < 3; k++) {
      int N = cfg[k][0], IN = cfg[k][1], OUT = cfg[k][2];
      size_t wsz[2] = {0, 0};
      goff = 0;
      for (int wk = 0; wk < 3; wk++) {
        size_t a = cpu->linear_workspace(cpu, N, IN, OUT, test_cdt(dt), (tt_ws_kind)wk);
        size_t bq = gpu->linear_workspace(gpu, N, IN, OUT, dt, (tt_ws_kind)wk);
        TT_CHECK(a != TT_WS_ERROR && bq != TT_WS_ERROR, "linear_workspace %s: cpu %s / cuda %s", test_dt_name(dt),
                 a == TT_WS_ERROR ? cpu->last_error(cpu) : "ok", bq == TT_WS_ERROR ? gpu->last_error(gpu) : "ok");
        if (a == TT_WS_ERROR || bq == TT_WS_ERROR) return;
        wsz[0] = a > wsz[0] ? a : wsz[0];
        wsz[1] = bq > wsz[1] ? bq : wsz[1];
      }
      tt2 x = mk((size_t)N * IN, dt, -1, 1), w = mk((size_t)OUT * IN, dt, -0.2f, 0.2f), bias = mk(OUT, dt, -1, 1);
      tt2 y = mk((size_t)N * OUT, dt, 0, 0), dy = mk((size_t)N * OUT, dt, -1, 1), dx = mk((size_t)N * IN, dt, -1, 1);
      tt2 dw = mk((size_t)OUT * IN, TT_F32, -1, 1), db = mk(OUT, TT_F32, -1, 1);
      tt2 ws;
      ws.c = malloc(wsz[0] + 1), ws.g = test_galloc(wsz[1] + 1);
#define WS (side ? ws.g : ws.c), (side ? wsz[1] : wsz[0])
      BOTH(B->linear_fwd(B, N, IN, OUT, SD(dt), P(x), P(w), P(bias), P(y), WS));
      cmp("linear_fwd", y, tol_mm(dt));
      BOTH(B->linear_bwd_data(B, N, IN, OUT, SD(dt), P(dy), P(w), P(dx), 1.0f, WS));
      cmp("linear_bwd_data beta=1", dx, tol_mm(dt));
      BOTH(B->linear_bwd_filter(B, N, IN, OUT, SD(dt), P(x), P(dy), PF(dw), PF(db), 1.0f, WS));
      cmp("linear_bwd_filter dw beta=1", dw, tol_mm(dt));
      cmp("linear_bwd_filter db beta=1", db, tol_mm(dt));
      BOTH(B->linear_bwd_filter(B, N, IN, OUT, SD(dt), P(x), P(dy), PF(dw), PF(db), 0.0f, WS));
      cmp("linear_bwd_filter dw beta=0", dw, tol_mm(dt));
#undef WS
      free(ws.c);
      fr(&x), fr(&w), fr(&bias), fr(&y), fr(&dy), fr(&dx), fr(&dw), fr(&db);
    }
  }
}

/* ------------------------------------- bf16 ------------------------------------------- */

/* The dtype's bits of v (fp32: v's own; fp16, bf16: the host's nearest-even rounding). */
static uint32_t test_encode(tt_dtype dt, float v) {
  uint32_t u;
  if (dt == TT_F16) return tt_f32_to_f16(v);
  if (dt == TT_BF16) return test_f32_to_bf16(v);
  memcpy(&u, &v, 4);
  return u;
}
static float test_decode(tt_dtype dt, const void *p, size_t i) { return test_get(p, dt, i); }

/* cast between fp32, fp16 and bf16, all six directions, bit for bit against the host's rounding
 * (fp32 -> bf16: test_f32_to_bf16; fp32 -> fp16: tt_f32_to_f16; fp16 <-> bf16 through fp32, which
 * holds both exactly, so one rounding); a NaN must stay a NaN. Sources: every fp16 and bf16 bit
 * pattern; for fp32, the bf16 ties and their neighbours, subnormals, the overflow boundary,
 * infinities, NaN and random bit patterns. Aligned (16-byte vectors) and one element off (the
 * element loop), an odd count (the tail). Then check_finite on bf16: the bf16 exponent, not
 * fp16's (0x7c00 is a finite bf16). */
static void test_bf16_cast(void) {
  const size_t n = 70001;
  const tt_dtype dts[3] = {TT_F32, TT_F16, TT_BF16};
  void *src[3], *dev_src[3], *dev_dst, *got;
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  TT_TEST_BEGIN("cuda_bf16_cast");
  goff = 0;
  for (int t = 0; t < 3; t++) {
    src[t] = malloc(n * 4);
    dev_src[t] = test_galloc(n * 4 + 16);
  }
  dev_dst = test_galloc(n * 4 + 16);
  got = malloc(n * 4 + 16);
  {
    float *f = (float *)src[0];
    const float edge[] = {0.0f, -0.0f, 1e-45f, -1e-45f, 1.1754942e-38f, 1.17549435e-38f, 3.3961776e38f, 3.40282347e38f,
                          -3.40282347e38f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, 65519.99f, 5.9604645e-08f,
                          2.9802322e-08f, 1.00390625f, 1.01171875f, -1.00390625f};
    size_t ne = sizeof edge / sizeof edge[0];
    for (size_t i = 0; i < n; i++) {
      uint32_t u = (uint32_t)tt_test_xorshift(&rng), r = (uint32_t)(i % 4);
      if (i < ne) {
        f[i] = edge[i];
        continue;
      }
      if (r == 0) u = (u & 0xffff0000u) | 0x8000u;              /* a bf16 tie */
      else if (r == 1) u = ((u & 0xffff0000u) | 0x8000u) + 1u;  /* just above */
      else if (r == 2) u = ((u & 0xffff0000u) | 0x8000u) - 1u;  /* just below */
      memcpy(&f[i], &u, 4);
    }
    for (size_t i = 0; i < n; i++) ((uint16_t *)src[1])[i] = (uint16_t)(i * 7919u); /* every pattern (7919 is odd) */
    for (size_t i = 0; i < n; i++) ((uint16_t *)src[2])[i] = (uint16_t)(i * 7919u);
  }
  for (int off = 0; off < 2; off++)
    for (int si = 0; si < 3; si++)
      for (int di = 0; di < 3; di++) {
        tt_dtype sdt = dts[si], ddt = dts[di];
        size_t ss = tt_dtype_size(sdt), ds = tt_dtype_size(ddt), cnt = n - (size_t)off, bad = 0, first = 0;
        if (sdt == ddt) continue;
        if (gpu->upload(gpu, dev_src[si], src[si], n * ss) ||
            gpu->cast(gpu, cnt, sdt, (char *)dev_src[si] + off * ss, ddt, (char *)dev_dst + off * ds) ||
            gpu->download(gpu, got, dev_dst, n * ds)) {
          TT_CHECK(0, "cast %s -> %s: %s", test_dt_name(sdt), test_dt_name(ddt), gpu->last_error(gpu));
          continue;
        }
        for (size_t i = (size_t)off; i < n; i++) {
          float v = test_decode(sdt, src[si], i), r = test_decode(ddt, got, i);
          uint32_t want = test_encode(ddt, v), have = ds == 2 ? ((uint16_t *)got)[i] : ((uint32_t *)got)[i];
          int ok = v != v ? r != r : have == want;
          if (!ok && !bad++) first = i;
        }
        TT_CHECK(bad == 0, "cast %s -> %s (%s): %zu elements differ from the host's rounding; first at %zu: %.9g -> 0x%x, "
                 "expected 0x%x", test_dt_name(sdt), test_dt_name(ddt), off ? "one element off" : "aligned", bad, first,
                 test_decode(sdt, src[si], first), ds == 2 ? ((uint16_t *)got)[first] : ((uint32_t *)got)[first],
                 test_encode(ddt, test_decode(sdt, src[si], first)));
      }
  { /* check_finite in bf16 */
    uint16_t *b = (uint16_t *)src[2];
    int32_t zero = 0, flag = 7;
    int32_t *dflag = (int32_t *)test_galloc(sizeof zero);
    for (size_t i = 0; i < n; i++) b[i] = test_f32_to_bf16((float)(i % 1000) - 500.0f);
    b[3] = 0x7c00u, b[4] = 0xfc00u, b[5] = 0x7f7fu; /* finite bf16 (fp16's inf pattern), the largest finite */
    for (int k = 0; k < 3; k++) {
      if (k == 1) b[n - 2] = 0x7f80u;  /* +inf */
      if (k == 2) b[n - 2] = 0x4000u, b[17] = 0xffc1u; /* a NaN */
      gpu->upload(gpu, dev_src[2], b, n * 2);
      gpu->upload(gpu, dflag, &zero, sizeof zero);
      TT_CHECK(gpu->check_finite(gpu, n, TT_BF16, dev_src[2], dflag) == 0, "check_finite bf16: %s", gpu->last_error(gpu));
      gpu->download(gpu, &flag, dflag, sizeof flag);
      TT_CHECK(flag == (k ? 1 : 0), "check_finite bf16 (%s): flag %d", k == 0 ? "finite, 0x7c00 included" : k == 1 ? "+inf" : "NaN",
               flag);
    }
  }
  for (int t = 0; t < 3; t++) free(src[t]);
  free(got);
  TT_TEST_END();
}

#ifdef TT_CUDA_EMULATION
/* The emulated device is an sm_75, where the backend refuses bf16 convolutions and GEMMs; a second
 * backend on the device emulated as sm_80 runs them against the reference (the ops' buffers are
 * in the first backend's arena: one device, one address space). */
static void test_bf16_sm80(void) {
  size_t reserve = 0;
  char msg[512];
  tt_backend *g75 = gpu, *g80;
  int old;
  TT_TEST_BEGIN("cuda_bf16_conv_linear_sm80");
  TT_CHECK(test_bf16_lib_refused(), "the emulated sm_75 should refuse bf16 convolutions and GEMMs");
  old = tt_emu_set_compute_capability(80);
  g80 = tt_cuda_backend_create(&reserve, msg, sizeof msg);
  TT_CHECK(g80 != NULL, "a backend on the emulated sm_80: %s", msg);
  if (g80) {
    TT_CHECK(tt_cuda_compute_capability(g75) == 75 && tt_cuda_compute_capability(g80) == 80 &&
                 tt_cuda_compute_capability(cpu) == 0 && tt_cuda_compute_capability(NULL) == 0,
             "tt_cuda_compute_capability: %d, %d, cpu %d", tt_cuda_compute_capability(g75), tt_cuda_compute_capability(g80),
             tt_cuda_compute_capability(cpu));
    gpu = g80;
    TT_CHECK(!test_bf16_lib_refused(), "the emulated sm_80 refuses bf16: %s", gpu->last_error(gpu));
    test_conv_dt(TT_BF16);
    if (!tt_test_current_failed) test_linear_dt(TT_BF16);
    TT_CHECK(gpu->sync(gpu) == 0, "sync: %s", gpu->last_error(gpu));
    gpu = g75;
    g80->destroy(g80);
  }
  tt_emu_set_compute_capability(old);
  TT_TEST_END();
}

/* `plan --precision auto` on the GPU here asks its compute capability (tt_cuda_compute_capability):
 * an emulated sm_75 plans fp16 with loss scaling, an emulated sm_80 bf16, and the plan's precision
 * line names the capability. (test_cuda_emu links a session built with TT_HAVE_CUDA, so tt_plan
 * opens the emulated device.) */
static void test_precision_auto_cc(void) {
  static const char *recipe =
      "[net]\ninput = 3x32x32\nclasses = 10\n[train]\nbatch = 64\noptimizer = sgd\nlr = 0.05\nseed = 1\n"
      "[data]\nformat = synthetic\n"
      "[conv c1]\nfilters = 64\nsize = 3\nbias = false\n[bn b1]\nactivation = relu\n"
      "[conv c2]\nfilters = 64\nsize = 3\nbias = false\n[bn b2]\nactivation = relu\n[maxpool p1]\nsize = 2\n"
      "[conv c3]\nfilters = 128\nsize = 3\nbias = false\n[bn b3]\nactivation = relu\n[gap pool]\n[linear fc]\nout = 10\n";
  static const int ccs[2] = {75, 80};
  static const char *want_dt[2] = {"\"precision\": \"fp16\"", "\"precision\": \"bf16\""};
  static const char *want_why[2] = {"fp16 with dynamic loss scaling (auto: GPU sm_75 has no native bf16",
                                    "bf16 (auto: GPU sm_80 computes bf16 natively"};
  TT_TEST_BEGIN("cuda_precision_auto_sm75_sm80");
  for (int k = 0; k < 2; k++) {
    int old = tt_emu_set_compute_capability(ccs[k]);
    tt_run_opts o;
    char err[1024] = "", text[16384] = "";
    FILE *f = tmpfile();
    int rc = -1;
    tt_run_opts_init(&o);
    o.recipe_text = recipe, o.device = TT_DEVICE_CUDA, o.quiet = 1;
    if (f) {
      rc = tt_plan(&o, 1, 0, f, err, sizeof err);
      rewind(f);
      text[fread(text, 1, sizeof text - 1, f)] = 0;
      fclose(f);
    }
    tt_emu_set_compute_capability(old);
    TT_CHECK(rc == 0, "sm_%d: plan failed: %s", ccs[k], err);
    if (rc) continue;
    TT_CHECK(strstr(text, want_dt[k]) != NULL, "sm_%d: the plan's precision is not %s:\n%.2000s", ccs[k], want_dt[k], text);
    TT_CHECK(strstr(text, want_why[k]) != NULL, "sm_%d: the precision line does not say '%s':\n%.2000s", ccs[k],
             want_why[k], text);
    TT_CHECK(strstr(text, "\"target\": \"cuda\"") != NULL, "sm_%d: not planned for the GPU here:\n%.2000s", ccs[k], text);
    {
      const char *why = strstr(text, "\"precision_why\": \"");
      if (why) printf("  emulated sm_%d: precision %.*s\n", ccs[k], (int)strcspn(why + 18, "\""), why + 18);
    }
  }
  TT_TEST_END();
}
#endif

/* ---------------------------------------- TF32 --------------------------------------------- */

#ifdef TT_CUDA_EMULATION
/* The math types the emulated libraries saw (cudnn.h, cublas_v2.h): */
#define TEST_CUDNN_FMA_MATH 3
#define TEST_CUBLAS_DEFAULT_MATH 0
#define TEST_CUBLAS_TF32_TENSOR_OP_MATH 3

/* Downloads a device fp32 tensor. */
static float *test_dl(tt2 t) {
  float *h = (float *)malloc(t.bytes ? t.bytes : 1);
  if (gpu->download(gpu, h, t.g, t.bytes)) {
    TT_CHECK(0, "download: %s", gpu->last_error(gpu));
    memset(h, 0, t.bytes);
  }
  return h;
}

/* One fp32 convolution forward, backward-filter and a GEMM on `gpu` with TF32 set to `on`:
 * writes y, dw, ly (downloaded) and checks the math types the emulated cuDNN and cuBLAS ran with
 * (want_tf32: whether the device should have rounded to TF32). */
static void test_tf32_run(int on, int want_tf32, const tt_conv_desc *d, tt2 x, tt2 w, tt2 y, tt2 dy, tt2 dw,
                          tt2 lx, tt2 lw, tt2 ly, int N, int IN, int OUT, float **yh, float **dwh, float **lyh) {
  int r = tt_cuda_set_tf32(gpu, on), tf = -1, m;
  size_t wsz = 0;
  void *ws;
  TT_CHECK(r == want_tf32, "tt_cuda_set_tf32(%d) on sm_%d returned %d (%s)", on, tt_cuda_compute_capability(gpu), r,
           r < 0 ? gpu->last_error(gpu) : "");
  for (int wk = 0; wk < 3; wk++) {
    size_t q = gpu->conv_workspace(gpu, d, TT_F32, (tt_ws_kind)wk);
    TT_CHECK(q != TT_WS_ERROR, "conv_workspace: %s", gpu->last_error(gpu));
    if (q != TT_WS_ERROR && q > wsz) wsz = q;
  }
  if (gpu->linear_workspace(gpu, N, IN, OUT, TT_F32, TT_WS_FWD) > wsz) wsz = gpu->linear_workspace(gpu, N, IN, OUT, TT_F32, TT_WS_FWD);
  ws = test_galloc(wsz + 1);
  TT_CHECK(gpu->conv_fwd(gpu, d, TT_F32, x.g, w.g, NULL, y.g, ws, wsz) == 0, "conv_fwd: %s", gpu->last_error(gpu));
  m = tt_emu_last_conv_math(&tf);
  TT_CHECK(want_tf32 ? (m != TEST_CUDNN_FMA_MATH && tf == 1) : (m == TEST_CUDNN_FMA_MATH && tf == 0),
           "tf32 %d on sm_%d: the forward convolution ran with cuDNN math type %d (TF32 rounding %d)", on,
           tt_cuda_compute_capability(gpu), m, tf);
  TT_CHECK(gpu->conv_bwd_filter(gpu, d, TT_F32, x.g, dy.g, (float *)dw.g, NULL, 0.0f, ws, wsz) == 0, "conv_bwd_filter: %s",
           gpu->last_error(gpu));
  m = tt_emu_last_conv_math(&tf);
  TT_CHECK(want_tf32 ? (m != TEST_CUDNN_FMA_MATH && tf == 1) : (m == TEST_CUDNN_FMA_MATH && tf == 0),
           "tf32 %d: backward-filter ran with cuDNN math type %d (TF32 rounding %d)", on, m, tf);
  TT_CHECK(gpu->linear_fwd(gpu, N, IN, OUT, TT_F32, lx.g, lw.g, NULL, ly.g, ws, wsz) == 0, "linear_fwd: %s",
           gpu->last_error(gpu));
  m = tt_emu_last_gemm_math(&tf);
  TT_CHECK(want_tf32 ? (m == TEST_CUBLAS_TF32_TENSOR_OP_MATH && tf == 1)
                     : ((m == TEST_CUBLAS_DEFAULT_MATH || (on && m == TEST_CUBLAS_TF32_TENSOR_OP_MATH)) && tf == 0),
           "tf32 %d on sm_%d: the GEMM ran with cuBLAS math mode %d (TF32 rounding %d)", on, tt_cuda_compute_capability(gpu),
           m, tf);
  *yh = test_dl(y), *dwh = test_dl(dw), *lyh = test_dl(ly);
}

static int test_differs(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], 4)) return 1;
  return 0;
}
static int test_same(const float *a, const float *b, size_t n) { return !test_differs(a, b, n); }

/* TF32 (tt_cuda_set_tf32, docs/gpu.md#tf32): a backend starts in true fp32 (cuDNN FMA math, cuBLAS
 * default math), as every CUDA-vs-CPU comparison in this file needs; on the emulated sm_80 TF32 on
 * makes fp32 convolutions and GEMMs read their operands rounded to TF32 (results differ from fp32,
 * within TF32's error of the reference), off gives the fp32 bits back; on the sm_75 it is never
 * used. Every other backend refuses the call. */
static void test_tf32(void) {
  size_t reserve = 0;
  char msg[512];
  tt_backend *g75 = gpu, *g80;
  int old;
  TT_TEST_BEGIN("cuda_tf32");
  TT_CHECK(tt_cuda_set_tf32(cpu, 1) == -1, "tt_cuda_set_tf32 on the reference backend should fail");
  old = tt_emu_set_compute_capability(80);
  g80 = tt_cuda_backend_create(&reserve, msg, sizeof msg);
  tt_emu_set_compute_capability(old);
  TT_CHECK(g80 != NULL, "a backend on the emulated sm_80: %s", msg);
  for (int dev = 0; dev < 2 && g80 && !tt_test_current_failed; dev++) {
    /* the emulated libraries read the device's compute capability at each call */
    tt_emu_set_compute_capability(dev ? 80 : old);
    tt_conv_desc d;
    int N = 16, IN = 96, OUT = 24;
    float *y0, *dw0, *ly0, *y1, *dw1, *ly1, *y2, *dw2, *ly2;
    gpu = dev ? g80 : g75;
    goff = 0;
    memset(&d, 0, sizeof d);
    d.n = 2, d.c = 4, d.h = d.w = 10, d.k = 8, d.r = d.s = 3, d.stride_h = d.stride_w = 1, d.pad_h = d.pad_w = 1;
    d.groups = 1, d.p = d.q = 10;
    size_t xin = (size_t)d.n * d.c * d.h * d.w, yout = (size_t)d.n * d.k * d.p * d.q, wn = (size_t)d.k * d.c * 9;
    tt2 x = mk(xin, TT_F32, -1, 1), w = mk(wn, TT_F32, -1, 1), y = mk(yout, TT_F32, 0, 0), dy = mk(yout, TT_F32, -1, 1);
    tt2 dw = mk(wn, TT_F32, 0, 0), lx = mk((size_t)N * IN, TT_F32, -1, 1), lw = mk((size_t)OUT * IN, TT_F32, -1, 1);
    tt2 ly = mk((size_t)N * OUT, TT_F32, 0, 0);
    size_t mark = goff;
    test_tf32_run(0, 0, &d, x, w, y, dy, dw, lx, lw, ly, N, IN, OUT, &y0, &dw0, &ly0);
    goff = mark;
    test_tf32_run(1, dev == 1, &d, x, w, y, dy, dw, lx, lw, ly, N, IN, OUT, &y1, &dw1, &ly1);
    goff = mark;
    test_tf32_run(0, 0, &d, x, w, y, dy, dw, lx, lw, ly, N, IN, OUT, &y2, &dw2, &ly2);
    TT_CHECK(test_same(y0, y2, yout) && test_same(dw0, dw2, wn) && test_same(ly0, ly2, (size_t)N * OUT),
             "sm_%d: TF32 off again should give the first fp32 bits back", dev ? 80 : 75);
    if (dev) {
      TT_CHECK(test_differs(y0, y1, yout) && test_differs(dw0, dw1, wn) && test_differs(ly0, ly1, (size_t)N * OUT),
               "sm_80 with TF32 on: the convolution, its weight gradient and the GEMM should differ from fp32 (operands "
               "rounded to 10 mantissa bits)");
      /* TF32 against the reference: each product's operands carry 2^-11 relative error */
      {
        size_t cw = cpu->conv_workspace(cpu, &d, TT_F32, TT_WS_FWD);
        void *cws = malloc(cw + 1);
        TT_CHECK(cw != TT_WS_ERROR && cpu->conv_fwd(cpu, &d, TT_F32, x.c, w.c, NULL, y.c, cws, cw) == 0, "reference conv_fwd: %s",
                 cpu->last_error(cpu));
        free(cws);
      }
      {
        double md = 0, mr = 0;
        for (size_t i = 0; i < yout; i++) {
          double a = ((float *)y.c)[i];
          if (fabs(a) > mr) mr = fabs(a);
          if (fabs(a - y1[i]) > md) md = fabs(a - y1[i]);
        }
        TT_CHECK(md <= 5e-3 * mr && md > 1e-7 * mr, "sm_80 TF32 conv: max |tf32 - ref| %.3g of max %.3g", md, mr);
      }
    } else {
      TT_CHECK(test_same(y0, y1, yout) && test_same(ly0, ly1, (size_t)N * OUT), "sm_75: TF32 asked should change nothing");
    }
    free(y0), free(dw0), free(ly0), free(y1), free(dw1), free(ly1), free(y2), free(dw2), free(ly2);
    fr(&x), fr(&w), fr(&y), fr(&dy), fr(&dw), fr(&lx), fr(&lw), fr(&ly);
  }
  tt_emu_set_compute_capability(old);
  TT_CHECK(tt_cuda_set_tf32(g75, 0) == 0, "sm_75: TF32 off: %s", g75->last_error(g75));
  gpu = g75;
  if (g80) g80->destroy(g80);
  TT_TEST_END();
}

/* The cuDNN workspace cap from the budget (tt_policy_widen_workspace, tt_cuda_set_conv_workspace_cap).
 * The emulated cuDNN ranks an FFT algorithm first whose workspace is over 72 MiB, more than the
 * default cap: LeNet's convolutions plan a small workspace by default, the FFT one when the budget
 * leaves room for it, and the default again when the room is too small (the plan kept). */
static void test_conv_ws_cap(void) {
  tt_err err;
  tt_model m;
  tt_graph g;
  tt_policy_opts o;
  size_t dflt, cap, wsmax, old;
  TT_TEST_BEGIN("cuda_conv_workspace_cap");
  {
    tt_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = 2, d.c = 8, d.h = d.w = 16, d.k = 8, d.r = d.s = 3, d.stride_h = d.stride_w = 1, d.pad_h = d.pad_w = 1;
    d.groups = 1, d.p = d.q = 16;
    size_t small = gpu->conv_workspace(gpu, &d, TT_F32, TT_WS_FWD);
    old = tt_cuda_set_conv_workspace_cap(gpu, (size_t)256 << 20);
    size_t big = gpu->conv_workspace(gpu, &d, TT_F32, TT_WS_FWD);
    size_t back = tt_cuda_set_conv_workspace_cap(gpu, 0);
    size_t again = gpu->conv_workspace(gpu, &d, TT_F32, TT_WS_FWD);
    TT_CHECK(old > 0 && old <= TT_CUDA_CONV_WS_DEFAULT_CAP && back == ((size_t)256 << 20),
             "caps: default %zu, then %zu", old, back);
    TT_CHECK(small <= old && big > TT_CUDA_CONV_WS_DEFAULT_CAP && again == small,
             "forward workspace: %zu under the default cap, %zu under 256 MiB (the FFT's), %zu back at the default", small,
             big, again);
  }
  memset(&g, 0, sizeof g);
  if (tt_recipe_load("examples/fashion_mnist/lenet.recipe", &m, &err, NULL, NULL) || tt_graph_build(&m, &g, &err)) {
    TT_CHECK(0, "lenet: %s", err.msg);
    TT_TEST_END();
    return;
  }
  for (int k = 0; k < 3; k++) {
    tt_policy_result r;
    memset(&o, 0, sizeof o);
    o.vram_bytes = (size_t)1 << 30, o.micro_batch = 8, o.eval_batch = 8, o.precision = TT_PREC_FP32;
    o.recompute = TT_RECOMP_NONE, o.inplace = 1, o.profile = tt_profile_cuda_generic();
    if (tt_policy_search(&g, gpu, &o, &r, &err)) {
      TT_CHECK(0, "policy search: %s", err.msg);
      break;
    }
    size_t arena0 = r.train.persistent_bytes +
                    (r.train.transient_bytes > r.eval.transient_bytes ? r.train.transient_bytes : r.eval.transient_bytes);
    /* k 0: a roomy budget; 1: 2 MiB of room; 2: 40 MiB of room, less than the FFT workspace needs */
    size_t budget = k == 0 ? r.budget_bytes : arena0 + (k == 1 ? ((size_t)2 << 20) : ((size_t)40 << 20));
    int rc = tt_policy_widen_workspace(&g, gpu, &r, budget, tt_cuda_set_conv_workspace_cap, &cap, &dflt, &wsmax, &err);
    size_t arena1 = r.train.persistent_bytes +
                    (r.train.transient_bytes > r.eval.transient_bytes ? r.train.transient_bytes : r.eval.transient_bytes);
    TT_CHECK(rc == 0, "widen: %s", err.msg);
    TT_CHECK(arena1 <= budget, "budget %zu: the widened plan's arena %zu is over it", budget, arena1);
    if (k == 0)
      TT_CHECK(cap > dflt && wsmax > TT_CUDA_CONV_WS_DEFAULT_CAP && arena1 > arena0,
               "a roomy budget: cap %zu (default %zu), largest workspace %zu: the FFT algorithm should be planned", cap,
               dflt, wsmax);
    else
      TT_CHECK(wsmax <= dflt && (k == 1 || (cap == dflt && arena1 == arena0)),
               "%s: cap %zu (default %zu), largest workspace %zu, arena %zu -> %zu", k == 1 ? "2 MiB of room" : "40 MiB of room",
               cap, dflt, wsmax, arena0, arena1);
    TT_CHECK(tt_cuda_set_conv_workspace_cap(gpu, 0) == cap, "the backend's cap is not the one the plan was made with");
    tt_policy_result_free(&r);
  }
  tt_graph_free(&g);
  tt_model_free(&m);
  TT_TEST_END();
}
#endif

/* --------------------------------- transformer ops ------------------------------------ */

/* The planned workspace of an op on each side (the reference's may be 0). */
static void test_op_ws(const tt_op_desc *od, size_t *wsz, void **wsp) {
  wsz[0] = cpu->op_workspace(cpu, od);
  wsz[1] = gpu->op_workspace(gpu, od);
  TT_CHECK(wsz[0] != TT_WS_ERROR && wsz[1] != TT_WS_ERROR, "op_workspace(kind %d): %s / %s", (int)od->kind,
           cpu->last_error(cpu), gpu->last_error(gpu));
  if (wsz[0] == TT_WS_ERROR) wsz[0] = 0;
  if (wsz[1] == TT_WS_ERROR) wsz[1] = 0;
  wsp[0] = malloc(wsz[0] + 1);
  wsp[1] = test_galloc(wsz[1] + 1);
}

static void test_layernorm(void) {
  TT_TEST_BEGIN("cuda_layernorm");
  /* rows x f: a ViT-ish row, one over the register cache (1030 > 1024: re-read path), several
   * splits of the dgamma partials (600 rows > 256), a tiny odd one */
  int shapes[4][2] = {{37, 64}, {5, 1030}, {600, 96}, {3, 7}};
  for (int di = 0; di < 3; di++) { /* fp32, fp16, bf16 */
    tt_dtype dt = test_dts[di];
    for (int k = 0; k < 4; k++) {
      int R = shapes[k][0], F = shapes[k][1];
      size_t cnt = (size_t)R * F, wsz[2];
      void *wsp[2];
      tt_op_desc od;
      goff = 0;
      memset(&od, 0, sizeof od);
      od.kind = TT_OP_LN_FWD, od.dt = dt, od.u.ln.rows = R, od.u.ln.f = F, od.u.ln.eps = 1e-6f;
      TT_CHECK(gpu->op_workspace(gpu, &od) == 0, "ln_fwd asks for a workspace");
      od.kind = TT_OP_LN_BWD;
      test_op_ws(&od, wsz, wsp);
#define WS wsp[side], wsz[side]
      tt2 x = mk(cnt, dt, -2, 3), y = mk(cnt, dt, 0, 0), g = mk(F, TT_F32, 0.5f, 1.5f), bb = mk(F, TT_F32, -1, 1);
      tt2 sm = mk(R, TT_F32, 0, 0), si = mk(R, TT_F32, 0, 0);
      tt2 dy = mk(cnt, dt, -1, 1), dx = mk(cnt, dt, -1, 1), dg = mk(F, TT_F32, -1, 1), db = mk(F, TT_F32, -1, 1);
      BOTH(B->ln_fwd(B, R, F, dt, P(x), PF(g), PF(bb), 1e-6f, P(y), NULL, NULL, NULL, 0)); /* evaluation: no saves */
      cmp("ln_fwd y (no saves)", y, tol_ew(dt));
      BOTH(B->ln_fwd(B, R, F, dt, P(x), PF(g), PF(bb), 1e-6f, P(y), PF(sm), PF(si), NULL, 0));
      cmp("ln_fwd y", y, tol_ew(dt));
      cmp("ln_fwd save_mean", sm, 1e-5);
      cmp("ln_fwd save_invstd", si, 1e-5);
      BOTH(B->ln_bwd(B, R, F, dt, P(x), P(dy), PF(g), PF(sm), PF(si), P(dx), PF(dg), PF(db), 1.0f, 1.0f, WS));
      cmp("ln_bwd dx beta=1", dx, tol_ew(dt) * 10);
      cmp("ln_bwd dgamma beta=1", dg, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      cmp("ln_bwd dbeta beta=1", db, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      BOTH(B->ln_bwd(B, R, F, dt, P(x), P(dy), PF(g), PF(sm), PF(si), P(dx), PF(dg), PF(db), 0.0f, 0.0f, WS));
      cmp("ln_bwd dx beta=0", dx, tol_ew(dt) * 10);
      cmp("ln_bwd dgamma beta=0", dg, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      cmp("ln_bwd dbeta beta=0", db, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      BOTH(B->ln_bwd(B, R, F, dt, P(x), P(dy), PF(g), PF(sm), PF(si), P(dx), NULL, NULL, 0.0f, 0.0f, WS));
      cmp("ln_bwd dx only", dx, tol_ew(dt) * 10);
      { /* twice on the GPU: the parameter sums are deterministic, bit for bit */
        float *h1 = (float *)malloc(4 * (size_t)F), *h2 = (float *)malloc(4 * (size_t)F);
        gpu->ln_bwd(gpu, R, F, dt, x.g, dy.g, (float *)g.g, (float *)sm.g, (float *)si.g, NULL, (float *)dg.g, NULL, 0.0f,
                    0.0f, wsp[1], wsz[1]);
        gpu->download(gpu, h1, dg.g, 4 * (size_t)F);
        gpu->ln_bwd(gpu, R, F, dt, x.g, dy.g, (float *)g.g, (float *)sm.g, (float *)si.g, NULL, (float *)dg.g, NULL, 0.0f,
                    0.0f, wsp[1], wsz[1]);
        gpu->download(gpu, h2, dg.g, 4 * (size_t)F);
        TT_CHECK(memcmp(h1, h2, 4 * (size_t)F) == 0, "ln_bwd dgamma differs between two runs");
        free(h1), free(h2);
      }
#undef WS
      free(wsp[0]);
      fr(&x), fr(&y), fr(&g), fr(&bb), fr(&sm), fr(&si), fr(&dy), fr(&dx), fr(&dg), fr(&db);
    }
  }
  { /* a workspace too small is refused with a message naming the op */
    float dummy = 0;
    (void)dummy;
    TT_CHECK(gpu->ln_bwd(gpu, 4, 8, TT_F32, garena, garena, (float *)garena, (float *)garena, (float *)garena, NULL,
                         (float *)garena, NULL, 0.0f, 0.0f, garena, 1) != 0 &&
                 strstr(gpu->last_error(gpu), "ln_bwd"),
             "ln_bwd with a 1-byte workspace: %s", gpu->last_error(gpu));
  }
  TT_TEST_END();
}

static void test_attention(void) {
  TT_TEST_BEGIN("cuda_attention");
  /* n, t, heads, d, causal, dropout p x 100: each head-dimension class (32, 64, 128; d below the
   * class too), t not a multiple of any tile, causal, dropout */
  int cfg[6][6] = {{2, 37, 2, 16, 0, 0}, {2, 37, 2, 16, 1, 20}, {1, 50, 3, 64, 0, 10},
                   {1, 45, 2, 128, 1, 0}, {1, 20, 1, 40, 0, 0}, {1, 33, 2, 100, 1, 30}};
  for (int di = 0; di < 3; di++) { /* fp32, fp16, bf16 */
    tt_dtype dt = test_dts[di];
    for (int k = 0; k < 6; k++) {
      tt_attn_desc ad;
      tt_op_desc od;
      size_t wsz[2], nq, no, nl, np, fws;
      void *wsp[2];
      uint64_t seed = 0x5eed0000ull + (uint64_t)k;
      double tol = dt == TT_BF16 ? 5e-2 : dt == TT_F16 ? 1e-2 : 1e-4;
      memset(&ad, 0, sizeof ad);
      ad.n = cfg[k][0], ad.t = cfg[k][1], ad.heads = cfg[k][2], ad.d = cfg[k][3], ad.causal = cfg[k][4];
      ad.p = cfg[k][5] / 100.0f, ad.scale = 1.0f / sqrtf((float)ad.d);
      goff = 0;
      memset(&od, 0, sizeof od);
      od.kind = TT_OP_ATTN_FWD, od.dt = dt, od.u.attn = ad;
      TT_CHECK(gpu->op_workspace(gpu, &od) == 0, "attn_fwd asks for a workspace");
      fws = cpu->op_workspace(cpu, &od); /* the reference's scratch */
      TT_CHECK(fws != TT_WS_ERROR, "reference attn_fwd workspace: %s", cpu->last_error(cpu));
      od.kind = TT_OP_ATTN_BWD;
      test_op_ws(&od, wsz, wsp);
      if (fws != TT_WS_ERROR && fws > wsz[0]) { /* one buffer serves both directions */
        free(wsp[0]);
        wsz[0] = fws, wsp[0] = malloc(fws + 1);
      }
#define WS wsp[side], wsz[side]
      nq = (size_t)ad.n * ad.t * 3 * ad.heads * ad.d, no = (size_t)ad.n * ad.t * ad.heads * ad.d;
      nl = (size_t)ad.n * ad.heads * ad.t, np = nl * ad.t;
      tt2 qkv = mk(nq, dt, -2, 2), o = mk(no, dt, 0, 0), lse = mk(nl, TT_F32, 0, 0), pr = mk(np, dt, -1, -1);
      tt2 dout = mk(no, dt, -1, 1), dqkv = mk(nq, dt, -1, 1);
      BOTH(B->attn_fwd(B, &ad, dt, P(qkv), P(o), NULL, NULL, seed, WS)); /* evaluation: o only */
      cmp("attn_fwd o (no lse)", o, tol);
      BOTH(B->attn_fwd(B, &ad, dt, P(qkv), P(o), PF(lse), NULL, seed, WS));
      cmp("attn_fwd o", o, tol);
      cmp("attn_fwd lse", lse, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      BOTH(B->attn_bwd(B, &ad, dt, P(qkv), P(o), P(dout), PF(lse), NULL, seed, P(dqkv), 1.0f, WS));
      cmp("attn_bwd dqkv beta=1 (from lse)", dqkv, tol);
      BOTH(B->attn_bwd(B, &ad, dt, P(qkv), P(o), P(dout), PF(lse), NULL, seed, P(dqkv), 0.0f, WS));
      cmp("attn_bwd dqkv beta=0 (from lse)", dqkv, tol);
      BOTH(B->attn_fwd(B, &ad, dt, P(qkv), P(o), PF(lse), P(pr), seed, WS)); /* the kept-probabilities form */
      cmp("attn_fwd probs", pr, tol);
      cmp("attn_fwd o (with probs)", o, tol);
      BOTH(B->attn_bwd(B, &ad, dt, P(qkv), P(o), P(dout), NULL, P(pr), seed, P(dqkv), 0.0f, WS));
      cmp("attn_bwd dqkv (from probs)", dqkv, dt == TT_BF16 ? 8e-2 : dt == TT_F16 ? 2e-2 : 1e-4);
      if (k == 1) { /* deterministic: two backward runs give the same bits */
        unsigned char *h1 = (unsigned char *)malloc(dqkv.bytes), *h2 = (unsigned char *)malloc(dqkv.bytes);
        gpu->attn_bwd(gpu, &ad, dt, qkv.g, o.g, dout.g, (float *)lse.g, NULL, seed, dqkv.g, 0.0f, wsp[1], wsz[1]);
        gpu->download(gpu, h1, dqkv.g, dqkv.bytes);
        gpu->attn_bwd(gpu, &ad, dt, qkv.g, o.g, dout.g, (float *)lse.g, NULL, seed, dqkv.g, 0.0f, wsp[1], wsz[1]);
        gpu->download(gpu, h2, dqkv.g, dqkv.bytes);
        TT_CHECK(memcmp(h1, h2, dqkv.bytes) == 0, "attn_bwd differs between two runs");
        free(h1), free(h2);
      }
#undef WS
      free(wsp[0]);
      fr(&qkv), fr(&o), fr(&lse), fr(&pr), fr(&dout), fr(&dqkv);
    }
  }
  { /* a head dimension over the kernel's limit is refused by the workspace query, with the reason */
    tt_op_desc od;
    memset(&od, 0, sizeof od);
    od.kind = TT_OP_ATTN_FWD, od.dt = TT_F32, od.u.attn.n = 1, od.u.attn.t = 4, od.u.attn.heads = 1, od.u.attn.d = 200;
    TT_CHECK(gpu->op_workspace(gpu, &od) == TT_WS_ERROR && strstr(gpu->last_error(gpu), "head dimension 200"),
             "attn d=200: workspace query did not refuse (%s)", gpu->last_error(gpu));
  }
  TT_TEST_END();
}

static void test_tokens(void) {
  TT_TEST_BEGIN("cuda_tokens");
  /* n, f, hw, cls, pos: ViT-ish with class token, no class token without position embedding
   * (tiles partly outside in both directions) */
  int cfg[3][5] = {{2, 40, 49, 1, 1}, {3, 33, 10, 0, 0}, {1, 70, 65, 1, 0}};
  for (int di = 0; di < 3; di++) { /* fp32, fp16, bf16 */
    tt_dtype dt = test_dts[di];
    for (int k = 0; k < 3; k++) {
      int N = cfg[k][0], F = cfg[k][1], HW = cfg[k][2], CLS = cfg[k][3], T = HW + CLS;
      goff = 0;
      tt2 x = mk((size_t)N * F * HW, dt, -1, 1), y = mk((size_t)N * T * F, dt, 0, 0), ct = mk(F, TT_F32, -1, 1);
      tt2 pos = mk((size_t)T * F, TT_F32, -1, 1), dy = mk((size_t)N * T * F, dt, -1, 1), dx = mk((size_t)N * F * HW, dt, -1, 1);
      tt2 dct = mk(F, TT_F32, -1, 1), dpos = mk((size_t)T * F, TT_F32, -1, 1);
      const float *cp = CLS ? PF(ct) : NULL;
      BOTH(B->tokens_fwd(B, N, F, HW, CLS, dt, P(x), CLS ? PF(ct) : NULL, cfg[k][4] ? PF(pos) : NULL, P(y)));
      cmp("tokens_fwd", y, tol_ew(dt));
      (void)cp;
      BOTH(B->tokens_bwd(B, N, F, HW, CLS, dt, P(dy), P(dx), CLS ? PF(dct) : NULL, PF(dpos), 1.0f, 1.0f));
      cmp("tokens_bwd dx beta=1", dx, tol_ew(dt));
      cmp("tokens_bwd dpos beta=1", dpos, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      if (CLS) cmp("tokens_bwd dcls beta=1", dct, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      BOTH(B->tokens_bwd(B, N, F, HW, CLS, dt, P(dy), P(dx), CLS ? PF(dct) : NULL, NULL, 0.0f, 0.0f));
      cmp("tokens_bwd dx beta=0", dx, tol_ew(dt));
      if (CLS) cmp("tokens_bwd dcls beta=0", dct, dt == TT_BF16 ? 8e-3 : dt == TT_F16 ? 1e-3 : 1e-5);
      fr(&x), fr(&y), fr(&ct), fr(&pos), fr(&dy), fr(&dx), fr(&dct), fr(&dpos);
    }
    for (int mode = 0; mode < 2; mode++) {
      int N = 3, T = 37, F = 40;
      goff = 0;
      tt2 x = mk((size_t)N * T * F, dt, -1, 1), y = mk((size_t)N * F, dt, 0, 0), dy = mk((size_t)N * F, dt, -1, 1);
      tt2 dx = mk((size_t)N * T * F, dt, -1, 1);
      BOTH(B->token_pool_fwd(B, N, T, F, mode, dt, P(x), P(y)));
      cmp(mode ? "token_pool_fwd mean" : "token_pool_fwd class", y, tol_ew(dt));
      BOTH(B->token_pool_bwd(B, N, T, F, mode, dt, P(dy), P(dx), 1.0f));
      cmp(mode ? "token_pool_bwd mean beta=1" : "token_pool_bwd class beta=1", dx, tol_ew(dt));
      BOTH(B->token_pool_bwd(B, N, T, F, mode, dt, P(dy), P(dx), 0.0f));
      cmp(mode ? "token_pool_bwd mean beta=0" : "token_pool_bwd class beta=0", dx, tol_ew(dt));
      fr(&x), fr(&y), fr(&dy), fr(&dx);
    }
  }
  TT_TEST_END();
}

/* ----------------------------------- training step ------------------------------------ */

typedef struct test_net {
  tt_model m;
  tt_graph g;
  tt_program p, ev;
  tt_exec x;
  int have_x, have_p, have_ev;
} test_net;

static int test_net_open(test_net *t, const char *recipe, tt_backend *be, tt_dtype dt, int mb, int accum, int eval_mb,
                         tt_opt_kind opt, tt_err *err) {
  tt_policy pol;
  memset(t, 0, sizeof *t);
  if (tt_recipe_load(recipe, &t->m, err, NULL, NULL)) return -1;
  t->m.train.optimizer = opt; /* decides which optimizer state the program holds */
  if (tt_graph_build(&t->m, &t->g, err)) return -1;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = mb, pol.accum_steps = accum, pol.act_dtype = dt, pol.inplace = 1, pol.training = 1;
  if (tt_lower(&t->g, &pol, be, &t->p, err) || tt_program_plan(&t->p, err)) return -1;
  t->have_p = 1;
  if (eval_mb > 0) {
    pol.training = 0, pol.micro_batch = eval_mb, pol.accum_steps = 1;
    if (tt_lower(&t->g, &pol, be, &t->ev, err) || tt_program_plan(&t->ev, err)) return -1;
    t->have_ev = 1;
  }
  if (tt_exec_create(&t->x, &t->g, &t->p, t->have_ev ? &t->ev : NULL, be, 11, err)) return -1;
  t->have_x = 1;
  return tt_exec_init_params(&t->x, 11, err);
}

static void test_net_close(test_net *t) {
  if (t->have_x) tt_exec_destroy(&t->x);
  if (t->have_p) tt_program_free(&t->p);
  if (t->have_ev) tt_program_free(&t->ev);
  tt_graph_free(&t->g);
  tt_model_free(&t->m);
}

/* Which elements of each parameter had a gradient at rounding-noise level at some step
 * (test_cmp_params marks them; NULL rows until a parameter has one). */
typedef struct test_noise {
  unsigned char **noisy; /* [nparams][numel] */
  int nparams;
} test_noise;

static void test_noise_free(test_noise *nz) {
  for (int i = 0; i < nz->nparams; i++) free(nz->noisy[i]);
  free(nz->noisy);
  nz->noisy = NULL, nz->nparams = 0;
}

/* The scale of a step's gradients: the largest |cpu gradient| over every trainable parameter. */
static double test_grad_scale(test_net *a) {
  float *h = NULL;
  double g = 0;
  tt_err err;
  for (int i = 0; i < a->g.nparams; i++) {
    const tt_param *p = &a->g.params[i];
    if (!p->trainable) continue;
    h = (float *)realloc(h, p->numel * sizeof(float));
    if (tt_exec_param_get(&a->x, i, 1, h, &err)) continue; /* test_cmp_params reports it */
    for (size_t k = 0; k < p->numel; k++)
      if (fabs(h[k]) > g) g = fabs(h[k]);
  }
  free(h);
  return g;
}

/* Compares role (0 value, 1 grad) of every trainable param (and running stats for values),
 * element by element: |cuda - cpu| <= tol * max|cpu| of the tensor + a floor.
 *   Gradients: floor = tol * the net's gradient scale (test_grad_scale). A gradient whose true
 *   value is zero — a conv bias followed by batch norm — is rounding noise on both sides, noise
 *   of the size of the terms it sums (the step's gradients), not of its own values; relative to
 *   its own max it would compare noise with noise. Elements at that noise level are marked in nz.
 *   Values: floor = 1e-7, plus adam_floor for marked elements: Adam(W) moves an element by about
 *   lr per step whatever the gradient's size, with the sign of the noise; and for batch-norm
 *   running statistics, which follow the (noisy) bias before them by momentum * its shift. */
static void test_cmp_params(test_net *a, test_net *b, int role, double tol, double adam_floor, test_noise *nz,
                            const char *when) {
  float *ha = NULL, *hb = NULL;
  double scale = role == 1 ? test_grad_scale(a) : 0.0;
  tt_err err;
  if (nz && !nz->noisy) {
    nz->nparams = a->g.nparams;
    nz->noisy = (unsigned char **)calloc((size_t)nz->nparams, sizeof *nz->noisy);
  }
  for (int i = 0; i < a->g.nparams; i++) {
    const tt_param *p = &a->g.params[i];
    double mr = 0, worst = -1, floor_g = tol * scale;
    size_t wk = 0;
    if (role == 1 && !p->trainable) continue;
    ha = (float *)realloc(ha, p->numel * sizeof(float));
    hb = (float *)realloc(hb, p->numel * sizeof(float));
    if (tt_exec_param_get(&a->x, i, role, ha, &err) || tt_exec_param_get(&b->x, i, role, hb, &err)) {
      TT_CHECK(0, "param_get %s: %s", p->name, err.msg);
      break;
    }
    for (size_t k = 0; k < p->numel; k++)
      if (fabs(ha[k]) > mr) mr = fabs(ha[k]);
    for (size_t k = 0; k < p->numel; k++) {
      double d = fabs((double)ha[k] - hb[k]), allow = tol * mr;
      int noisy = (nz && nz->noisy[i] && nz->noisy[i][k]) || !p->trainable;
      if (role == 1) {
        allow += floor_g;
        if (nz && fabs(ha[k]) <= floor_g) {
          if (!nz->noisy[i]) nz->noisy[i] = (unsigned char *)calloc(p->numel, 1);
          nz->noisy[i][k] = 1;
        }
      } else {
        allow += 1e-7 + (noisy ? adam_floor : 0.0);
      }
      if (!(d <= allow) && (worst < 0 || d - allow > worst || d != d)) worst = d != d ? INFINITY : d - allow, wk = k;
    }
    TT_CHECK(worst < 0, "%s %s%s: at %zu |cuda - cpu| = |%.7g - %.7g| > %.0e * max|cpu| %.3g + floor %.3g", when,
             role ? "grad." : "", p->name, wk, (double)hb[wk], (double)ha[wk], tol, mr,
             role == 1 ? floor_g : 1e-7 + ((nz && nz->noisy[i] && nz->noisy[i][wk]) || !p->trainable ? adam_floor : 0.0));
  }
  free(ha), free(hb);
}

static void test_step(tt_dtype dt, const char *name) {
  const char *recipe = "tests/fixtures/small_cnn.recipe";
  /* its own fixed stream, so that a test added before it does not change its inputs. In fp16
   * the comparison is borderline for some inputs: from 9 seeds, 2 put one conv weight gradient
   * element past 3e-2 (0.028 vs 0.019), with the batch-norm kernels before and after their
   * rewrite alike (the same values), so it is the fp16 path's rounding, not a kernel: kept as
   * a known limit of this tolerance (docs/gpu.md) */
  cuda_rng = 88172645463325252ull;
  double tol = dt == TT_F16 ? 3e-2 : 1e-4;
  tt_err err;
  TT_TEST_BEGIN(name);
  for (int opt = 0; opt < 2; opt++) {
    tt_opt_kind kind = opt ? TT_OPT_ADAMW : TT_OPT_SGD;
    test_net a, b;
    int rc = test_net_open(&a, recipe, cpu, dt, 6, 1, 0, kind, &err);
    TT_CHECK(rc == 0, "cpu: %s", err.msg);
    int rc2 = test_net_open(&b, recipe, gpu, dt, 6, 1, 0, kind, &err);
    TT_CHECK(rc2 == 0, "cuda: %s", err.msg);
    if (!rc && !rc2) {
      const tt_node *in = &a.g.nodes[0];
      size_t cnt = (size_t)6 * in->c * in->h * in->w;
      float *input = (float *)malloc(cnt * sizeof(float)), sa[2], sb[2];
      int32_t labels[6] = {0, 4, 2, 1, 3, 2};
      tt_opt_hparams hp;
      test_noise nz = {NULL, 0};
      for (size_t i = 0; i < cnt; i++) input[i] = test_rand(-2, 2);
      test_cmp_params(&a, &b, 0, 0.0, 0.0, NULL, "initial");
      for (int step = 0; step < 2; step++) {
        int ova = 0, ovb = 0;
        tt_exec_stats(&a.x, NULL, 1, &err);
        tt_exec_stats(&b.x, NULL, 1, &err);
        TT_CHECK(tt_exec_micro_step_f32(&a.x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "cpu step: %s",
                 err.msg);
#ifdef TT_CUDA_EMULATION
        size_t cm0 = tt_emu_kernel_launches("cuda_ew_cast_multi_k"), c0 = tt_emu_kernel_launches("cuda_ew_cast_k");
#endif
        TT_CHECK(tt_exec_micro_step_f32(&b.x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "cuda step: %s",
                 err.msg);
#ifdef TT_CUDA_EMULATION
        if (dt != TT_F32) { /* the weight casts of the micro-step: one launch (cast_multi), none per weight */
          int ncast = 0;
          for (int i = 0; i < b.p.micro_end; i++) ncast += b.p.steps[i].op == TT_S_CAST;
          size_t cm = tt_emu_kernel_launches("cuda_ew_cast_multi_k") - cm0, cs = tt_emu_kernel_launches("cuda_ew_cast_k") - c0;
          TT_CHECK(ncast > 1 && cm == 1 && cs == 0,
                   "%d weight casts in the micro-step took %zu cast_multi and %zu cast launches (want 1 and 0)", ncast, cm, cs);
        }
#endif
        tt_exec_stats(&a.x, sa, 1, &err);
        tt_exec_stats(&b.x, sb, 1, &err);
        TT_CHECK(fabs(sa[0] - sb[0]) <= tol * fabs(sa[0]) + 1e-6 && sa[1] == sb[1], "loss/correct: cpu %.7g/%g cuda %.7g/%g",
                 sa[0], sa[1], sb[0], sb[1]);
        printf("  %s %s step %d: loss cpu %.7f cuda %.7f\n", dt == TT_F16 ? "fp16" : "fp32", opt ? "adamw" : "sgd", step,
               sa[0] / 6, sb[0] / 6);
        test_cmp_params(&a, &b, 1, tol, 0.0, &nz, "gradient");
        memset(&hp, 0, sizeof hp);
        if (!opt)
          hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f, hp.nesterov = 1, hp.weight_decay = 5e-4f;
        else
          hp.kind = TT_OPT_ADAMW, hp.lr = 0.01f, hp.beta1 = 0.9f, hp.beta2 = 0.999f, hp.eps = 1e-8f, hp.weight_decay = 0.01f;
        TT_CHECK(tt_exec_update(&a.x, &hp, step + 1, 1.0f, &ova, &err) == 0, "cpu update: %s", err.msg);
        TT_CHECK(tt_exec_update(&b.x, &hp, step + 1, 1.0f, &ovb, &err) == 0, "cuda update: %s", err.msg);
        TT_CHECK(ova == ovb, "overflow flags differ: cpu %d cuda %d", ova, ovb);
        /* AdamW divides by sqrt(v): an element whose gradient is noise moves by about +-lr a step
         * on either side, so after step+1 steps the two may be 2*lr*(step+1) apart */
        test_cmp_params(&a, &b, 0, opt && tol > 1e-2 ? 1e-2 : tol, opt ? 2.0 * hp.lr * (step + 1) : 0.0, &nz,
                        opt ? "after AdamW" : "after SGD");
      }
      test_noise_free(&nz);
      free(input);
    }
    test_net_close(&a);
    test_net_close(&b);
  }
  TT_TEST_END();
}

#ifdef TT_CUDA_EMULATION
/* The executor's batch norm + ReLU pairs (exec.c exec_fuse_table): a net of three batch norms
 * with `activation = relu` trains on the device bit for bit as with TINYTRAIN_FUSE=0 (2 steps of
 * SGD at micro-batch 6, fp32 and fp16: loss, every parameter and gradient, running statistics),
 * and the fused run launches no ReLU kernel of its own where the other launches six a micro-step. */
static void test_step_bn_relu_fused(void) {
  static const char *text =
      "[net]\ninput = 3x8x8\nclasses = 5\n[train]\nbatch = 6\noptimizer = sgd\nlr = 0.1\nmomentum = 0.9\n"
      "[conv c1]\nfilters = 16\nsize = 3\nbias = false\n[bn b1]\nactivation = relu\n"
      "[conv c2]\nfilters = 16\nsize = 3\nbias = false\n[bn b2]\nactivation = relu\n[maxpool p1]\nsize = 2\n"
      "[conv c3]\nfilters = 16\nsize = 3\nbias = false\n[bn b3]\nactivation = relu\n[gap pool]\n[linear fc]\nout = 5\n";
  char path[] = "/tmp/tt_fuse_XXXXXX";
  int fd = mkstemp(path);
  TT_TEST_BEGIN("cuda_step_bn_relu_fused");
  TT_CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text), "writing %s", path);
  if (fd >= 0) close(fd);
  for (int di = 0; di < 2 && fd >= 0; di++) {
    tt_dtype dt = di ? TT_F16 : TT_F32;
    test_net a, b;
    tt_err err;
    int rc;
    size_t act[2][2];
    cuda_rng = 88172645463325252ull;
    setenv("TINYTRAIN_FUSE", "0", 1);
    rc = test_net_open(&a, path, gpu, dt, 6, 1, 0, TT_OPT_SGD, &err);
    unsetenv("TINYTRAIN_FUSE");
    TT_CHECK(rc == 0, "unfused: %s", err.msg);
    int rc2 = test_net_open(&b, path, gpu, dt, 6, 1, 0, TT_OPT_SGD, &err);
    TT_CHECK(rc2 == 0, "fused: %s", err.msg);
    if (!rc && !rc2) {
      const tt_node *in = &a.g.nodes[0];
      size_t cnt = (size_t)6 * in->c * in->h * in->w;
      float *input = (float *)malloc(cnt * sizeof(float)), sa[2], sb[2], *ha = NULL, *hb = NULL;
      int32_t labels[6] = {0, 4, 2, 1, 3, 2};
      tt_opt_hparams hp;
      memset(&hp, 0, sizeof hp);
      hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f;
      for (size_t i = 0; i < cnt; i++) input[i] = test_rand(-2, 2);
      TT_CHECK(a.x.fuse == NULL && b.x.fuse != NULL, "fusion table: unfused %p, fused %p", (void *)a.x.fuse,
               (void *)b.x.fuse);
      for (int step = 0; step < 2; step++) {
        int ova = 0, ovb = 0;
        test_net *nets[2] = {&a, &b};
        for (int k = 0; k < 2; k++) {
          size_t f0 = tt_emu_kernel_launches("cuda_ew_act_fwd_k"), b0 = tt_emu_kernel_launches("cuda_ew_act_bwd_k");
          tt_exec_stats(&nets[k]->x, NULL, 1, &err);
          TT_CHECK(tt_exec_micro_step_f32(&nets[k]->x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "%s step: %s",
                   k ? "fused" : "unfused", err.msg);
          TT_CHECK(gpu->sync(gpu) == 0, "%s", gpu->last_error(gpu));
          act[k][0] = tt_emu_kernel_launches("cuda_ew_act_fwd_k") - f0, act[k][1] = tt_emu_kernel_launches("cuda_ew_act_bwd_k") - b0;
        }
        TT_CHECK(act[0][0] == 3 && act[0][1] == 3 && act[1][0] == 0 && act[1][1] == 0,
                 "ReLU launches forward/backward: unfused %zu/%zu (want 3/3), fused %zu/%zu (want 0/0)", act[0][0], act[0][1],
                 act[1][0], act[1][1]);
        tt_exec_stats(&a.x, sa, 1, &err);
        tt_exec_stats(&b.x, sb, 1, &err);
        TT_CHECK(!memcmp(sa, sb, sizeof sa), "%s step %d: loss %.9g/%g unfused, %.9g/%g fused", test_dt_name(dt), step,
                 sa[0], sa[1], sb[0], sb[1]);
        for (int role = 1; role >= 0; role--) {
          for (int i = 0; i < a.g.nparams; i++) {
            const tt_param *pp = &a.g.params[i];
            if (role == 1 && !pp->trainable) continue;
            ha = (float *)realloc(ha, pp->numel * sizeof(float)), hb = (float *)realloc(hb, pp->numel * sizeof(float));
            TT_CHECK(ha && hb && !tt_exec_param_get(&a.x, i, role, ha, &err) && !tt_exec_param_get(&b.x, i, role, hb, &err) &&
                         !memcmp(ha, hb, pp->numel * sizeof(float)),
                     "%s step %d: %s%s differs with the fusion", test_dt_name(dt), step, role ? "grad." : "", pp->name);
          }
          if (role == 1) {
            TT_CHECK(tt_exec_update(&a.x, &hp, step + 1, 1.0f, &ova, &err) == 0, "update: %s", err.msg);
            TT_CHECK(tt_exec_update(&b.x, &hp, step + 1, 1.0f, &ovb, &err) == 0, "update: %s", err.msg);
          }
        }
      }
      free(ha), free(hb), free(input);
    }
    test_net_close(&a);
    test_net_close(&b);
  }
  if (fd >= 0) unlink(path);
  TT_TEST_END();
}
#endif

#ifdef TT_CUDA_EMULATION
/* A bf16 training program on the CUDA backend under layouts_16bit NHWC (TINYTRAIN_LAYOUT=nhwc)
 * plans NHWC between convolutions and trains as the NCHW program on the same backend and as the
 * reference does: the small CNN (a conv with bias at the layout change, grouped and depthwise
 * convs, batch norm, add, concat, max and average pooling, global average pooling, then flatten and
 * linear layers in NCHW), 2 steps of SGD
 * at micro-batch 6 on the emulated sm_80 (bf16 convolutions need 8.0). An fp32 program on the same
 * backend stays NCHW. */
static void test_step_bf16_nhwc(void) {
  const char *recipe = "tests/fixtures/small_cnn.recipe";
  /* NHWC against NCHW on the same backend: the fp16 step test's 3e-2 (the same kernels but for the
   * layout: only summation orders differ). Against the reference, 1e-1: bf16 keeps 8 significant
   * bits (fp16 11), and the first conv's weight gradient, at the end of the bf16 backward chain,
   * differs from the reference's by up to ~19% of its largest element in the CUDA NCHW program as
   * well (3e-2 fails there: a bf16 property, not the layout's) */
  const double tol = 3e-2, tol_ref = 1e-1;
  size_t reserve = 0;
  char msg[512];
  tt_err err;
  test_net r, a, b;
  int old, rc[3];
  tt_backend *g80;
  TT_TEST_BEGIN("cuda_step_bf16_nhwc");
  cuda_rng = 88172645463325252ull;
  old = tt_emu_set_compute_capability(80);
  g80 = tt_cuda_backend_create(&reserve, msg, sizeof msg); /* sm_80 stays emulated for the test */
  TT_CHECK(g80 != NULL, "a backend on the emulated sm_80: %s", msg);
  if (!g80) {
    tt_emu_set_compute_capability(old);
    TT_TEST_END();
    return;
  }
  { /* fp32 on CUDA: NCHW throughout */
    tt_model m;
    tt_graph g;
    tt_program p;
    tt_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.micro_batch = 6, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1;
    int ok = !tt_recipe_load(recipe, &m, &err, NULL, NULL);
    ok = ok && !tt_graph_build(&m, &g, &err);
    ok = ok && !tt_lower(&g, &pol, g80, &p, &err);
    TT_CHECK(ok, "fp32 lowering on CUDA: %s", err.msg);
    if (ok) {
      TT_CHECK(p.n_nhwc == 0 && p.n_layout_convs == 0, "fp32 on CUDA planned %d NHWC activations", p.n_nhwc);
      tt_program_free(&p);
    }
    tt_graph_free(&g);
    tt_model_free(&m);
  }
  rc[0] = test_net_open(&r, recipe, cpu, TT_BF16, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc[0] == 0, "reference: %s", err.msg);
  /* layouts_16bit is read when lowering only: program a plans NHWC, as under TINYTRAIN_LAYOUT=nhwc,
   * program b NCHW, the default */
  g80->layouts_16bit = 1u << TT_LAYOUT_NHWC;
  rc[1] = test_net_open(&a, recipe, g80, TT_BF16, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc[1] == 0, "cuda NHWC: %s", err.msg);
  g80->layouts_16bit = 0;
  rc[2] = test_net_open(&b, recipe, g80, TT_BF16, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc[2] == 0, "cuda NCHW: %s", err.msg);
  if (!rc[0] && !rc[1] && !rc[2]) {
    int nhwc_steps = 0, conv_nhwc = 0, first_conv_changes = 0;
    for (int i = 0; i < a.p.nsteps; i++) {
      const tt_step *st = &a.p.steps[i];
      nhwc_steps += (st->flags & TT_SF_NHWC) != 0;
      if (st->kind == TT_L_CONV && st->op == TT_S_FWD) {
        conv_nhwc += st->a.conv.layout_y == TT_LAYOUT_NHWC;
        if (st->name && !strcmp(st->name, "conv1"))
          first_conv_changes = st->a.conv.layout_x == TT_LAYOUT_NCHW && st->a.conv.layout_y == TT_LAYOUT_NHWC;
      }
    }
    printf("  bf16 on CUDA: %d NHWC activations, %d layout-changing convolutions, %d NHWC steps\n", a.p.n_nhwc,
           a.p.n_layout_convs, nhwc_steps);
    TT_CHECK(a.p.n_nhwc > 0 && a.p.n_layout_convs >= 1 && nhwc_steps > 0 && conv_nhwc >= 4 && first_conv_changes,
             "bf16 on CUDA: %d NHWC activations, %d layout changes, %d NHWC steps, %d NHWC conv outputs, conv1 %s",
             a.p.n_nhwc, a.p.n_layout_convs, nhwc_steps, conv_nhwc, first_conv_changes ? "NCHW -> NHWC" : "not NCHW -> NHWC");
    TT_CHECK(b.p.n_nhwc == 0, "layouts_16bit 0: %d NHWC activations", b.p.n_nhwc);
    const tt_node *in = &a.g.nodes[0];
    size_t cnt = (size_t)6 * in->c * in->h * in->w;
    float *input = (float *)malloc(cnt * sizeof(float)), sr[2], sa[2], sb[2];
    int32_t labels[6] = {0, 4, 2, 1, 3, 2};
    tt_opt_hparams hp;
    test_noise nz = {NULL, 0}, nz2 = {NULL, 0};
    for (size_t i = 0; i < cnt; i++) input[i] = test_rand(-2, 2);
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f, hp.nesterov = 1, hp.weight_decay = 5e-4f;
    for (int step = 0; step < 2 && !tt_test_current_failed; step++) {
      int ov[3];
      test_net *nets[3] = {&r, &a, &b};
      float *stats[3] = {sr, sa, sb};
      for (int k = 0; k < 3; k++) {
        tt_exec_stats(&nets[k]->x, NULL, 1, &err);
        TT_CHECK(tt_exec_micro_step_f32(&nets[k]->x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "step (%d): %s",
                 k, err.msg);
        tt_exec_stats(&nets[k]->x, stats[k], 1, &err);
      }
      printf("  bf16 step %d: loss reference %.6f, cuda NHWC %.6f, cuda NCHW %.6f\n", step, sr[0] / 6, sa[0] / 6, sb[0] / 6);
      TT_CHECK(fabs(sr[0] - sa[0]) <= tol * fabs(sr[0]) && fabs(sb[0] - sa[0]) <= tol * fabs(sb[0]),
               "loss: reference %.7g, NHWC %.7g, NCHW %.7g", sr[0], sa[0], sb[0]);
      test_cmp_params(&r, &b, 1, tol_ref, 0.0, NULL, "NCHW against the reference: gradient");
      test_cmp_params(&r, &a, 1, tol_ref, 0.0, &nz, "NHWC against the reference: gradient");
      test_cmp_params(&b, &a, 1, tol, 0.0, &nz2, "NHWC against NCHW: gradient");
      for (int k = 0; k < 3; k++)
        TT_CHECK(tt_exec_update(&nets[k]->x, &hp, step + 1, 1.0f, &ov[k], &err) == 0, "update (%d): %s", k, err.msg);
      test_cmp_params(&r, &a, 0, tol_ref, 0.0, &nz, "NHWC against the reference: after SGD");
      test_cmp_params(&b, &a, 0, tol, 0.0, &nz2, "NHWC against NCHW: after SGD");
    }
    test_noise_free(&nz), test_noise_free(&nz2);
    free(input);
  }
  test_net_close(&r);
  test_net_close(&a);
  test_net_close(&b);
  g80->destroy(g80);
  tt_emu_set_compute_capability(old);
  TT_TEST_END();
}
#endif

#ifdef TT_CUDA_EMULATION
/* The next batch's copy overlaps the step (backend.h: event_record, upload_after; exec.c): the
 * training program's input buffers are persistent on the CUDA backend (transient on the CPU), and
 * the copy of batch k+1 waits only for step k's last reader of them (the loss), not for the whole
 * step. The emulated device runs queued work only when something waits for it, and then only what
 * that wait depends on: after steps 2 and 3 are queued back to back, waiting for batch 3's copy
 * must have run step 2's forward pass and loss but not its backward (fewer emulated threads than
 * one whole micro-step), where a copy ordered after all the compute work would have run all of it.
 * Then every step must have read its own batch: the summed loss of 4 different batches equals the
 * CPU backend's. */
static void test_batch_overlap(void) {
  tt_err err;
  test_net a, b;
  TT_TEST_BEGIN("cuda_batch_copy_overlaps_the_step");
  int rc = test_net_open(&a, "tests/fixtures/small_cnn.recipe", cpu, TT_F32, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "cpu: %s", err.msg);
  int rc2 = test_net_open(&b, "tests/fixtures/small_cnn.recipe", gpu, TT_F32, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc2 == 0, "cuda: %s", err.msg);
  if (!rc && !rc2) {
    const tt_node *in = &a.g.nodes[0];
    size_t img = (size_t)6 * in->c * in->h * in->w;
    uint8_t *images = (uint8_t *)malloc(4 * img);
    int32_t labels[4 * 6];
    float sa[2], sb[2];
    tt_emu_counts e0, e1, e2, e3, e4;
    for (size_t i = 0; i < 4 * img; i++) images[i] = (uint8_t)test_rand(0, 255.9f);
    for (int i = 0; i < 24; i++) labels[i] = (i * 7 + i / 6) % 5;
    TT_CHECK(b.p.bufs[b.p.input_u8].persistent && b.p.bufs[b.p.labels].persistent && b.x.in_ev && b.x.in_last >= 0,
             "the CUDA training program's input buffers are not persistent, or no copy event (in_ev %p)", b.x.in_ev);
    TT_CHECK(!a.p.bufs[a.p.input_u8].persistent, "the CPU program's uint8 batch is persistent (it is read in place there)");
    tt_exec_stats(&a.x, NULL, 1, &err);
    tt_exec_stats(&b.x, NULL, 1, &err);
    for (int k = 0; k < 2; k++) TT_CHECK(tt_exec_micro_step(&a.x, images + k * img, labels + 6 * k, 0, (uint64_t)k, 1.0f / 6, &err) == 0, "cpu: %s", err.msg);
    TT_CHECK(tt_exec_micro_step(&b.x, images, labels, 0, 0, 1.0f / 6, &err) == 0 && gpu->sync(gpu) == 0, "cuda step 0: %s", err.msg);
    tt_emu_get_counts(&e0);
    TT_CHECK(tt_exec_micro_step(&b.x, images + img, labels + 6, 0, 1, 1.0f / 6, &err) == 0 && gpu->sync(gpu) == 0,
             "cuda step 1: %s", err.msg);
    tt_emu_get_counts(&e1);
    size_t per_step = e1.threads - e0.threads;
    tt_emu_get_counts(&e2);
    TT_CHECK(tt_exec_micro_step(&b.x, images + 2 * img, labels + 12, 0, 2, 1.0f / 6, &err) == 0, "cuda step 2: %s", err.msg);
    int slot = b.x.stage_next; /* the staging slot batch 3 goes through */
    TT_CHECK(tt_exec_micro_step(&b.x, images + 3 * img, labels + 18, 0, 3, 1.0f / 6, &err) == 0, "cuda step 3: %s", err.msg);
    TT_CHECK(gpu->event_sync(gpu, b.x.stage_ev[slot]) == 0, "waiting for batch 3's copy: %s", gpu->last_error(gpu));
    tt_emu_get_counts(&e3);
    TT_CHECK(gpu->sync(gpu) == 0, "sync: %s", gpu->last_error(gpu));
    tt_emu_get_counts(&e4);
    printf("  one micro-step: %zu emulated threads; done when batch 3 had been copied: %zu; both steps: %zu\n", per_step,
           e3.threads - e2.threads, e4.threads - e2.threads);
    TT_CHECK(per_step > 0 && e3.threads - e2.threads > 0 && e3.threads - e2.threads < per_step,
             "batch 3's copy completed after %zu emulated threads of step 2 (of %zu): it %s", e3.threads - e2.threads, per_step,
             e3.threads - e2.threads >= per_step ? "waited for the whole step" : "did not wait for step 2's forward pass");
    TT_CHECK(e4.threads - e2.threads == 2 * per_step, "steps 2 and 3 ran %zu threads, want %zu", e4.threads - e2.threads,
             2 * per_step);
    for (int k = 2; k < 4; k++) TT_CHECK(tt_exec_micro_step(&a.x, images + k * img, labels + 6 * k, 0, (uint64_t)k, 1.0f / 6, &err) == 0, "cpu: %s", err.msg);
    TT_CHECK(tt_exec_stats(&a.x, sa, 0, &err) == 0 && tt_exec_stats(&b.x, sb, 0, &err) == 0, "stats: %s", err.msg);
    TT_CHECK(fabs(sa[0] - sb[0]) <= 1e-4 * fabs(sa[0]) && sa[1] == sb[1], "4 batches' loss/correct: cpu %.7g/%g cuda %.7g/%g",
             sa[0], sa[1], sb[0], sb[1]);
    free(images);
  }
  test_net_close(&a);
  test_net_close(&b);
  TT_TEST_END();
}
#endif

#ifdef TT_CUDA_EMULATION
/* cudnnFind*Ex at setup (backend.h's tune; cuda_conv.cu): a net's executor times each convolution
 * direction over the arena's transient region, and the emulated cuDNN times its algorithms in the
 * reverse of its heuristic ranking, so a timed choice differs from the heuristic one somewhere.
 * Checked: TINYTRAIN_CUDA_FIND=0 makes no Find call, the default makes some; a micro-step then runs
 * other algorithms than the heuristic ones, each within its planned workspace (the emulation fails
 * a call whose workspace is short) and on operands Find left intact (the emulated Find writes NaN
 * over its output operand: had it been live data the loss would show it), with the CPU's loss; and
 * on a backend created with TINYTRAIN_CUDA_DETERMINISTIC=1 no non-deterministic algorithm runs (the
 * emulation's backward-data 0, backward-filter 0 and 3). */
static float test_find_step(tt_backend *be, unsigned used[3], tt_err *err) {
  test_net t;
  float st[2] = {-1, -1};
  cuda_rng = 88172645463325252ull; /* the same input for every backend */
  int rc = test_net_open(&t, "tests/fixtures/small_cnn.recipe", be, TT_F32, 6, 1, 0, TT_OPT_SGD, err);
  TT_CHECK(rc == 0, "%s: %s", be->name, err->msg);
  if (!rc) {
    const tt_node *in = &t.g.nodes[0];
    size_t cnt = (size_t)6 * in->c * in->h * in->w;
    float *input = (float *)malloc(cnt * sizeof(float));
    int32_t labels[6] = {0, 4, 2, 1, 3, 2};
    for (size_t i = 0; i < cnt; i++) input[i] = test_rand(-2, 2);
    for (int d = 0; d < 3; d++) tt_emu_conv_algos_used(d, 1);
    tt_exec_stats(&t.x, NULL, 1, err);
    TT_CHECK(tt_exec_micro_step_f32(&t.x, input, labels, 0, 0, 1.0f / 6, err) == 0 && tt_exec_stats(&t.x, st, 1, err) == 0,
             "%s step: %s", be->name, err->msg);
    for (int d = 0; d < 3; d++) used[d] = tt_emu_conv_algos_used(d, 1);
    free(input);
  }
  test_net_close(&t);
  return st[0];
}

static void test_conv_find(void) {
  tt_err err;
  unsigned uc[3], uh[3], uf[3], ud[3];
  TT_TEST_BEGIN("cuda_conv_find");
  float lc = test_find_step(cpu, uc, &err);
  tt_cuda_set_tf32(gpu, 0); /* forgets the algorithms earlier tests' executors timed for these shapes */
  setenv("TINYTRAIN_CUDA_FIND", "0", 1);
  size_t f0 = tt_emu_conv_find_calls();
  float lh = test_find_step(gpu, uh, &err);
  size_t f1 = tt_emu_conv_find_calls();
  unsetenv("TINYTRAIN_CUDA_FIND");
  float lf = test_find_step(gpu, uf, &err);
  size_t f2 = tt_emu_conv_find_calls();
  printf("  algorithms run (bits per direction fwd/bwd-data/bwd-filter): heuristic %x/%x/%x, timed %x/%x/%x; %zu Find calls\n",
         uh[0], uh[1], uh[2], uf[0], uf[1], uf[2], f2 - f1);
  TT_CHECK(f1 == f0 && f2 > f1, "Find calls: %zu with TINYTRAIN_CUDA_FIND=0 (want 0), %zu by default (want some)", f1 - f0,
           f2 - f1);
  TT_CHECK(uh[0] != uf[0] || uh[1] != uf[1] || uh[2] != uf[2], "the timed choices are the heuristic ones everywhere");
  TT_CHECK(fabs(lh - lc) <= 1e-4 * fabs(lc) && fabs(lf - lc) <= 1e-4 * fabs(lc), "loss: cpu %.7g, heuristic %.7g, timed %.7g",
           lc, lh, lf);
  {
    size_t reserve = 0;
    char msg[256];
    setenv("TINYTRAIN_CUDA_DETERMINISTIC", "1", 1);
    tt_backend *gd = tt_cuda_backend_create(&reserve, msg, sizeof msg);
    unsetenv("TINYTRAIN_CUDA_DETERMINISTIC");
    TT_CHECK(gd != NULL, "a deterministic backend: %s", msg);
    if (gd) {
      float ld = test_find_step(gd, ud, &err);
      printf("  deterministic: %x/%x/%x\n", ud[0], ud[1], ud[2]);
      TT_CHECK(ud[2] && ud[1] && !(ud[1] & 1u) && !(ud[2] & (1u | 8u)),
               "TINYTRAIN_CUDA_DETERMINISTIC=1 ran non-deterministic algorithms: bwd-data %x, bwd-filter %x", ud[1], ud[2]);
      TT_CHECK(fabs(ld - lc) <= 1e-4 * fabs(lc), "deterministic loss %.7g, cpu %.7g", ld, lc);
      gd->destroy(gd);
    }
  }
  TT_TEST_END();
}
#endif

/* No cudaMalloc after setup, and the device holds what the plan says (+ lazily loaded
 * kernel modules, which CUDA 12+ loads on first launch: allowed up to 256 MiB, printed). */
#ifdef TT_CUDA_EMULATION
#define TEST_PEAK_MB 4 /* emulated threads are slow; the allocation count and the peak do not need more */
#else
#define TEST_PEAK_MB 32
#endif
#define TEST_PEAK_EVAL (2 * TEST_PEAK_MB)
static void test_no_alloc_and_peak(void) {
  tt_err err;
  test_net t;
  TT_TEST_BEGIN("cuda_no_allocation_and_peak");
  size_t used0 = 0, used1 = 0, total = 0;
  TT_CHECK(tt_cuda_mem_used(gpu, &used0, &total) == 0, "mem_used: %s", gpu->last_error(gpu));
  int rc = test_net_open(&t, "examples/fashion_mnist/lenet.recipe", gpu, TT_F16, TEST_PEAK_MB, 2, TEST_PEAK_EVAL,
                         TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (!rc) {
    const tt_node *in = &t.g.nodes[0];
    size_t img = (size_t)in->c * in->h * in->w;
    uint8_t *images = (uint8_t *)malloc(TEST_PEAK_EVAL * img);
    int32_t labels[TEST_PEAK_EVAL];
    size_t allocs0 = tt_cuda_alloc_count(gpu);
    tt_opt_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.01f, hp.momentum = 0.9f;
    for (size_t i = 0; i < TEST_PEAK_EVAL * img; i++) images[i] = (uint8_t)test_rand(0, 256);
    for (int i = 0; i < TEST_PEAK_EVAL; i++) labels[i] = i % t.m.classes;
    /* under the sanitizers 2 steps: the first and one after an evaluation, every path of the
     * later ones (LeNet's emulated convolutions take about 15 s a step under ASan) */
    const int nsteps = tt_test_sanitized() ? 2 : 3;
    for (int step = 0; step < nsteps && !rc; step++) {
      int ov = 0;
      for (int k = 0; k < 2 && !rc; k++)
        rc = tt_exec_micro_step(&t.x, images + (size_t)k * TEST_PEAK_MB * img, labels + k * TEST_PEAK_MB, k,
                                (uint64_t)step, 1024.0f / TEST_PEAK_EVAL, &err);
      if (!rc) rc = tt_exec_update(&t.x, &hp, step + 1, 1.0f / 1024, &ov, &err);
      if (!rc) rc = tt_exec_eval(&t.x, images, labels, TEST_PEAK_EVAL, &err);
    }
    TT_CHECK(rc == 0, "%s", err.msg);
    TT_CHECK(gpu->sync(gpu) == 0, "sync: %s", gpu->last_error(gpu));
    TT_CHECK(tt_cuda_alloc_count(gpu) == allocs0, "cudaMalloc called %zu times during the steps",
             tt_cuda_alloc_count(gpu) - allocs0);
    TT_CHECK(tt_cuda_mem_used(gpu, &used1, &total) == 0, "mem_used: %s", gpu->last_error(gpu));
    {
      double grown = used1 > used0 ? (double)(used1 - used0) : 0.0, arena = (double)t.x.arena_bytes;
      printf("  device used grew %.2f MiB over steps; arena %.2f MiB (plan); excess %.2f MiB\n", grown / 1048576.0,
             arena / 1048576.0, (grown - arena) / 1048576.0);
      TT_CHECK(grown <= arena + 256.0 * 1048576.0, "device memory grew %.1f MiB for an arena of %.1f MiB",
               grown / 1048576.0, arena / 1048576.0);
    }
    free(images);
  }
  test_net_close(&t);
  TT_TEST_END();
}

/* Page-locked staging and the copy stream (backend.h): a copy from a host_alloc'ed buffer is
 * complete when event_sync on its event returns (the buffer may be refilled then), a kernel
 * queued after upload_async sees the bytes, and download_async fills page-locked memory by its
 * event. */
static void test_staging(void) {
  TT_TEST_BEGIN("cuda_staging_copies");
  const size_t n = (size_t)3 << 20; /* floats */
  float *h = (float *)gpu->host_alloc(gpu, n * sizeof(float)), *back = (float *)gpu->host_alloc(gpu, n * sizeof(float));
  void *ev = gpu->event_create(gpu), *ev2 = gpu->event_create(gpu);
  TT_CHECK(h && back && ev && ev2, "host_alloc / event_create: %s", gpu->last_error(gpu));
  if (h && back && ev && ev2) {
    goff = 0;
    float *d = (float *)test_galloc(n * sizeof(float)), *d2 = (float *)test_galloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)i;
    TT_CHECK(gpu->event_sync(gpu, ev) == 0, "event_sync on an event never recorded: %s", gpu->last_error(gpu));
    TT_CHECK(gpu->upload_async(gpu, d, h, n * sizeof(float), ev) == 0, "%s", gpu->last_error(gpu));
    /* queued after the copy on the compute stream: must see the uploaded values */
    TT_CHECK(gpu->accumulate(gpu, n, TT_F32, d, d2, 0.0f) == 0, "%s", gpu->last_error(gpu));
    TT_CHECK(gpu->event_sync(gpu, ev) == 0, "%s", gpu->last_error(gpu));
    for (size_t i = 0; i < n; i++) h[i] = -1.0f; /* the slot refilled after its event */
    TT_CHECK(gpu->download_async(gpu, back, d2, n * sizeof(float), ev2) == 0, "%s", gpu->last_error(gpu));
    TT_CHECK(gpu->event_sync(gpu, ev2) == 0, "%s", gpu->last_error(gpu));
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
      if (back[i] != (float)i) bad = i;
    TT_CHECK(bad == n, "element %zu came back %g, want %g", bad, bad < n ? (double)back[bad] : 0.0, (double)bad);
  }
  if (ev) gpu->event_destroy(gpu, ev);
  if (ev2) gpu->event_destroy(gpu, ev2);
  if (h) gpu->host_free(gpu, h);
  if (back) gpu->host_free(gpu, back);
  TT_TEST_END();
}

#ifdef TT_CUDA_EMULATION
/* The reserve holds the context: with a device chosen by local rank first (multi-process
 * training), nothing may create the context before the backend reads NVML's baseline, or each
 * rank's reserve misses it (0.3-0.6 GiB on a card; 300 MiB emulated). NVML's init is balanced by
 * its shutdown, also when NVML does not know the device. Must run before anything creates the
 * emulated context. */
static void test_emu_reserve_order(void) {
  char why[512] = "";
  size_t reserve = 0;
  TT_TEST_BEGIN("cuda_reserve_holds_the_context");
  TT_CHECK(!tt_emu_context_exists(), "the emulated context exists before the test");
  TT_CHECK(tt_cuda_select_device(0, why, sizeof why) == 0, "select_device: %s", why);
  TT_CHECK(!tt_emu_context_exists(), "tt_cuda_select_device created the context: the reserve's NVML baseline misses it");
  tt_backend *b = tt_cuda_backend_create(&reserve, why, sizeof why);
  TT_CHECK(b != NULL, "create: %s", why);
  TT_CHECK(tt_emu_nvml_baseline_context() == 0, "NVML's baseline was read after the context existed");
  TT_CHECK(reserve >= ((size_t)300 << 20), "reserve %.1f MiB lacks the emulated 300 MiB context", reserve / 1048576.0);
  if (b) b->destroy(b);
  TT_CHECK(tt_emu_nvml_open_count() == 0, "%d nvmlInit calls not shut down", tt_emu_nvml_open_count());
  setenv("TT_EMU_NVML", "nodevice", 1); /* NVML loads, the device is not found: the fallback, NVML shut down */
  b = tt_cuda_backend_create(&reserve, why, sizeof why);
  TT_CHECK(b != NULL, "create without the NVML device: %s", why);
  TT_CHECK(tt_emu_nvml_open_count() == 0, "nvmlInit not shut down after the device was not found (%d open)",
           tt_emu_nvml_open_count());
  if (b) b->destroy(b);
  unsetenv("TT_EMU_NVML");
  TT_TEST_END();
}

/* A driver older than the runtime is not "no GPU": the probe says which driver, which runtime
 * and the driver needed, so --device auto can warn instead of silently training on the CPU. */
static void test_emu_old_driver(void) {
  char why[512];
  TT_TEST_BEGIN("cuda_old_driver_named");
  int q = tt_emu_set_quiet(1);
  setenv("TT_EMU_DRIVER", "12040", 1);
  int n = tt_cuda_probe(why, sizeof why);
  TT_CHECK(n == 0, "probe found %d devices under a driver for CUDA 12.4", n);
  TT_CHECK(strstr(why, "too old") && strstr(why, "CUDA 12.4") && strstr(why, "runtime 13.") && strstr(why, ">= 580") == NULL &&
               strstr(why, "580"), "the message: '%s'", why);
  setenv("TT_EMU_DRIVER", "0", 1); /* no driver at all (libcuda missing): quietly no GPU */
  n = tt_cuda_probe(why, sizeof why);
  TT_CHECK(n == 0 && why[0] == 0, "probe without a driver: %d devices, '%s'", n, why);
  unsetenv("TT_EMU_DRIVER");
  n = tt_cuda_probe(why, sizeof why);
  TT_CHECK(n == 1 && why[0] == 0, "probe with a current driver: %d devices, '%s'", n, why);
  TT_CHECK(strstr(tt_cuda_info(), "driver ") != NULL, "--version's CUDA line names no driver: %s", tt_cuda_info());
  tt_emu_set_quiet(q);
  TT_TEST_END();
}

/* TINYTRAIN_CUDA_SYNC=1: a kernel that faults (asynchronously: seen at the next synchronisation)
 * is named with its call, step and layer; TINYTRAIN_CUDA_PROFILE=1 times every step. */
static void test_emu_sync_and_profile(void) {
  tt_err err;
  test_net t;
  tt_emu_counts c;
  char nbuf[32];
  TT_TEST_BEGIN("cuda_sync_mode_names_the_op");
  setenv("TINYTRAIN_CUDA_SYNC", "1", 1);
  int rc = test_net_open(&t, "tests/fixtures/small_cnn.recipe", gpu, TT_F32, 4, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (!rc) {
    const tt_node *in = &t.g.nodes[0];
    size_t img = (size_t)in->c * in->h * in->w;
    uint8_t *images = (uint8_t *)malloc(4 * img);
    int32_t labels[4] = {0, 1, 0, 1};
    for (size_t i = 0; i < 4 * img; i++) images[i] = (uint8_t)test_rand(0, 256);
    TT_CHECK(t.x.sync_each == 1, "TINYTRAIN_CUDA_SYNC=1 did not turn the sync mode on");
    TT_CHECK(gpu->sync(gpu) == 0, "sync: %s", gpu->last_error(gpu));
    tt_emu_get_counts(&c);
    snprintf(nbuf, sizeof nbuf, "%zu", c.launches + 3);
    setenv("TT_EMU_FAULT_LAUNCH", nbuf, 1);
    int q = tt_emu_set_quiet(1);
    rc = tt_exec_micro_step(&t.x, images, labels, 0, 0, 1.0f, &err);
    TT_CHECK(rc != 0 && strstr(err.msg, "TINYTRAIN_CUDA_SYNC") && strstr(err.msg, "injected fault") &&
                 strstr(err.msg, "of layer '"), "the fault's message: %s", rc ? err.msg : "(no failure)");
    if (rc) printf("  %s\n", err.msg);
    unsetenv("TT_EMU_FAULT_LAUNCH");
    tt_emu_clear_sticky();
    tt_emu_set_quiet(q);
    free(images);
  }
  test_net_close(&t);
  unsetenv("TINYTRAIN_CUDA_SYNC");
  TT_TEST_END();

  TT_TEST_BEGIN("cuda_profile_table");
  setenv("TINYTRAIN_CUDA_PROFILE", "1", 1);
  rc = test_net_open(&t, "tests/fixtures/small_cnn.recipe", gpu, TT_F32, 4, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (!rc) {
    const tt_node *in = &t.g.nodes[0];
    size_t img = (size_t)in->c * in->h * in->w;
    uint8_t *images = (uint8_t *)calloc(4, img);
    int32_t labels[4] = {0, 1, 0, 1};
    tt_opt_hparams hp;
    int ov = 0;
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.01f;
    rc = tt_exec_micro_step(&t.x, images, labels, 0, 0, 1.0f, &err);
    if (!rc) rc = tt_exec_update(&t.x, &hp, 1, 1.0f, &ov, &err);
    TT_CHECK(rc == 0, "%s", err.msg);
    FILE *f = tmpfile();
    char text[8192] = "";
    if (f) {
      tt_exec_profile_print(&t.x, f);
      rewind(f);
      text[fread(text, 1, sizeof text - 1, f)] = 0;
      fclose(f);
    }
    TT_CHECK(strstr(text, "TINYTRAIN_PROFILE") && strstr(text, "forward") && strstr(text, "backward") &&
                 strstr(text, "optimizer update"), "the table:\n%s", text);
    free(t.x.prof); /* printed above: not again at close */
    t.x.prof = NULL;
    free(images);
  }
  test_net_close(&t);
  unsetenv("TINYTRAIN_CUDA_PROFILE");
  TT_TEST_END();
}
#endif

#if defined(TT_HAVE_NCCL) && !defined(TT_CUDA_EMULATION)
/* One rank through NCCL (kernels/cuda/cuda_nccl.cu, as a 1-process run under mpirun would): the
 * communicator from a unique id, an all-reduce of a bucket (a sum over one rank: unchanged), the
 * join, a broadcast from rank 0, and the memory NCCL took. */
static void test_nccl_one_rank(void) {
  unsigned char id[TT_CUDA_NCCL_ID_BYTES];
  size_t taken = 0, n = 4096;
  TT_TEST_BEGIN("cuda_nccl_one_rank");
  float *host = (float *)malloc(n * sizeof(float)), *back = (float *)malloc(n * sizeof(float));
  float *dev = (float *)gpu->arena_alloc(gpu, n * sizeof(float));
  TT_CHECK(host && back && dev, "allocation failed: %s", gpu->last_error(gpu));
  if (host && back && dev) {
    for (size_t i = 0; i < n; i++) host[i] = test_rand(-1, 1);
    int rc = tt_cuda_nccl_id(gpu, id) || tt_cuda_nccl_init(gpu, id, 1, 0, &taken);
    TT_CHECK(rc == 0, "communicator: %s", gpu->last_error(gpu));
    if (!rc) {
      rc = gpu->upload(gpu, dev, host, n * sizeof(float)) || tt_cuda_nccl_allreduce_async(gpu, dev, n) ||
           tt_cuda_nccl_join(gpu) || tt_cuda_nccl_group(gpu, 0) || tt_cuda_nccl_broadcast(gpu, dev, n, 0) ||
           tt_cuda_nccl_group(gpu, 1) || gpu->sync(gpu) || gpu->download(gpu, back, dev, n * sizeof(float));
      TT_CHECK(rc == 0, "all-reduce / broadcast: %s", gpu->last_error(gpu));
      TT_CHECK(rc || !memcmp(host, back, n * sizeof(float)), "one rank's all-reduce and broadcast changed the data");
      printf("  NCCL took %.1f MiB of device memory\n", taken / 1048576.0);
    }
  }
  if (dev) gpu->arena_free(gpu, dev);
  free(host), free(back);
  TT_TEST_END();
}
#endif

int main(void) {
  tt_err err;
  size_t reserve = 0, allocs;
  int ndev = tt_cuda_device_count();
  if (ndev <= 0) {
    /* the backend's own message says why (no driver, no device) */
    gpu = tt_cuda_backend_create(&reserve, err.msg, sizeof err.msg);
    if (gpu) { /* cannot happen with no device; be safe */
      gpu->destroy(gpu);
      snprintf(err.msg, sizeof err.msg, "no CUDA device");
    }
    for (int i = 0; i < TEST_NGROUPS; i++) printf("SKIP %s: %s\n", test_groups[i], err.msg);
    return 0;
  }
#ifdef TT_CUDA_EMULATION
  test_emu_reserve_order(); /* first: before anything creates the emulated context */
  test_emu_old_driver();
#endif
  gpu = tt_cuda_backend_create(&reserve, err.msg, sizeof err.msg);
  if (!gpu) {
    printf("FAIL cuda_create: %s\n", err.msg);
    return 1;
  }
  printf("  %s; reserve (context + handles) %.1f MiB\n", tt_cuda_info(), reserve / 1048576.0);
  cpu = tt_ref_backend_create(0); /* the truth: the plain loops */
  if (getenv("TT_CUDA_TEST_ONLY") && !strcmp(getenv("TT_CUDA_TEST_ONLY"), "nccl")) { /* tests/gpu/acceptance.sh step 8 */
#if defined(TT_HAVE_NCCL) && !defined(TT_CUDA_EMULATION)
    test_nccl_one_rank();
#else
    printf("SKIP cuda_nccl_one_rank: built without NCCL\n");
#endif
    cpu->destroy(cpu);
    gpu->destroy(gpu);
    TT_TEST_EXIT();
  }
#ifdef TT_CUDA_EMULATION
  gcap = (size_t)80 << 20; /* the ops and their workspaces (cuBLAS 4 MiB on this sm_75, cuDNN up to 64 MiB); the emulation flips the protection of every page at each sync, so no larger */
#else
  gcap = (size_t)160 << 20; /* the ops and their workspaces (cuBLAS: 32 MiB on Hopper and newer, cuDNN: up to 64 MiB) */
#endif
  garena = (unsigned char *)gpu->arena_alloc(gpu, gcap);
  if (!garena) {
    printf("FAIL cuda_arena: %s\n", gpu->last_error(gpu));
    return 1;
  }
  test_staging(); /* allocates page-locked memory: before the allocation count below */
#ifdef TT_CUDA_EMULATION
  { /* host waits block rather than spin: the device's scheduling flag and the host-wait events' */
    void *ev = gpu->event_create(gpu);
    TT_TEST_BEGIN("cuda_blocking_waits");
    TT_CHECK((tt_emu_device_flags() & 0x07u) == 0x04u, "device flags 0x%x: not cudaDeviceScheduleBlockingSync",
             tt_emu_device_flags());
    TT_CHECK(ev && (tt_emu_event_flags(ev) & 0x01u), "event_create's flags 0x%x lack cudaEventBlockingSync",
             ev ? tt_emu_event_flags(ev) : 0u);
    if (ev) gpu->event_destroy(gpu, ev);
    TT_TEST_END();
  }
#else
  printf("SKIP cuda_blocking_waits: checked under the emulation (tt_emu_device_flags)\n");
#endif
  allocs = tt_cuda_alloc_count(gpu);
  if (getenv("TT_CUDA_TEST_ONLY") && !strcmp(getenv("TT_CUDA_TEST_ONLY"), "kernels")) {
    /* tests/gpu/acceptance.sh step 6: racecheck over our own kernels in a process that launches
     * no cuDNN or cuBLAS kernel (the H100's racecheck failed inside LeNet's run even when its
     * filter matched none of our kernels) */
#ifdef TT_CUDA_EMULATION
    tt_emu_counts c0, c1;
    tt_emu_get_counts(&c0);
#endif
    /* attention first: the most shared memory and barriers, and the one the H100's racecheck
     * (2026-11-27, 35 s cap) did not reach after the others had run clean */
    test_attention();
    test_elementwise();
    test_dropout();
    test_loss_optim();
    test_sum_squares_clip();
    test_batchnorm();
    test_bn_relu_fused();
    test_bn_resident();
    test_pooling();
    test_bf16_cast();
    test_layernorm();
    test_tokens();
#ifdef TT_CUDA_EMULATION
    tt_emu_get_counts(&c1);
    TT_TEST_BEGIN("cuda_op_tests_launch_no_library_kernel");
    TT_CHECK(c1.blas_calls == c0.blas_calls && c1.dnn_calls == c0.dnn_calls,
             "the op tests called cuBLAS %zu and cuDNN %zu times: racecheck's run of them would not be ours alone",
             c1.blas_calls - c0.blas_calls, c1.dnn_calls - c0.dnn_calls);
    TT_TEST_END();
#endif
    gpu->arena_free(gpu, garena);
    cpu->destroy(cpu);
    gpu->destroy(gpu);
    TT_TEST_EXIT();
  }
  test_elementwise();
  test_dropout();
  test_loss_optim();
  test_sum_squares_clip();
#ifdef TT_CUDA_EMULATION
  test_update_multi();
  test_cast_multi();
#else
  printf("SKIP cuda_update_multi: counts launches under the emulation (tt_emu_get_counts)\n");
  printf("SKIP cuda_cast_multi: counts launches under the emulation (tt_emu_kernel_launches)\n");
#endif
  test_batchnorm();
  test_bn_relu_fused();
  test_bn_resident();
  test_pooling();
  test_conv();
  test_nhwc_ops();
  test_linear();
  test_bf16_cast();
#ifdef TT_CUDA_EMULATION
  test_bf16_sm80();
  test_precision_auto_cc();
#else
  printf("SKIP cuda_precision_auto_sm75_sm80: the emulation's devices (on a GPU, `tinytrain plan` shows the pick)\n");
  printf("SKIP cuda_bf16_conv_linear_sm80: the emulation's second device (on a GPU, cuda_conv and cuda_linear run bf16 from sm_80)\n");
#endif
#ifdef TT_CUDA_EMULATION
  test_tf32();
  test_conv_ws_cap();
#else
  printf("SKIP cuda_tf32: the emulation's sm_80 device shows the math types (docs/gpu.md#tf32)\n");
  printf("SKIP cuda_conv_workspace_cap: the emulation's FFT workspace sizes\n");
#endif
  test_layernorm();
  test_attention();
  test_tokens();
  TT_TEST_BEGIN("cuda_ops_allocate_nothing");
  TT_CHECK(tt_cuda_alloc_count(gpu) == allocs, "ops called cudaMalloc %zu times", tt_cuda_alloc_count(gpu) - allocs);
  TT_CHECK(gpu->sync(gpu) == 0, "sync after the op tests: %s", gpu->last_error(gpu));
  TT_TEST_END();
  gpu->arena_free(gpu, garena);
  test_step(TT_F32, "cuda_step_fp32");
  test_step(TT_F16, "cuda_step_fp16");
#ifdef TT_CUDA_EMULATION
  test_step_bf16_nhwc();
  test_step_bn_relu_fused();
  test_batch_overlap();
  test_conv_find();
#else
  printf("SKIP cuda_step_bf16_nhwc: runs on the emulation's sm_80 device\n");
  printf("SKIP cuda_conv_find: the emulated cuDNN's timings (on a GPU, cudnnFind*Ex runs at every setup)\n");
  printf("SKIP cuda_batch_copy_overlaps_the_step: the emulation's lazy streams show what a copy waited for\n");
#endif
  test_no_alloc_and_peak();
#if defined(TT_HAVE_NCCL) && !defined(TT_CUDA_EMULATION)
  test_nccl_one_rank(); /* last: the communicator stays with the backend */
#endif
#ifdef TT_CUDA_EMULATION
  test_emu_sync_and_profile();
#endif
  cpu->destroy(cpu);
  gpu->destroy(gpu);
#ifdef TT_CUDA_EMULATION
  {
    tt_emu_counts c;
    tt_emu_get_counts(&c);
    printf("  cuda emulation: %zu kernel launches (%zu threads), %zu cuBLAS and %zu cuDNN calls, %zu copies\n",
           c.launches, c.threads, c.blas_calls, c.dnn_calls, c.copies);
  }
#endif
  TT_TEST_EXIT();
}

#else

int main(void) {
  (void)tt_test_failures, (void)tt_test_current_failed, (void)tt_test_current_name;
  for (int i = 0; i < TEST_NGROUPS; i++) printf("SKIP %s: built without CUDA (configure found no nvcc/cuDNN)\n", test_groups[i]);
  return 0;
}
#endif
