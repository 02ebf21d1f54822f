/* tests/kernels/cuda_elementwise.c — test_cuda's element-wise ops (activations, adds, casts, scales) and the dropout mask.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA

void test_elementwise(void) {
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

void test_dropout(void) {
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

#endif
