/* tests/kernels/cuda_bf16.c — test_cuda's bf16: the casts, sm_80's convolutions and GEMMs, the precision chosen per device.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA

/* ------------------------------------- bf16 ------------------------------------------- */

/* The dtype's bits of v (fp32: v's own; fp16, bf16: the host's nearest-even rounding). */
uint32_t test_encode(tt_dtype dt, float v) {
  uint32_t u;
  if (dt == TT_F16) return tt_f32_to_f16(v);
  if (dt == TT_BF16) return test_f32_to_bf16(v);
  memcpy(&u, &v, 4);
  return u;
}
float test_decode(tt_dtype dt, const void *p, size_t i) { return test_get(p, dt, i); }

/* cast between fp32, fp16 and bf16, all six directions, bit for bit against the host's rounding
 * (fp32 -> bf16: test_f32_to_bf16; fp32 -> fp16: tt_f32_to_f16; fp16 <-> bf16 through fp32, which
 * holds both exactly, so one rounding); a NaN must stay a NaN. Sources: every fp16 and bf16 bit
 * pattern; for fp32, the bf16 ties and their neighbours, subnormals, the overflow boundary,
 * infinities, NaN and random bit patterns. Aligned (16-byte vectors) and one element off (the
 * element loop), an odd count (the tail). Then check_finite on bf16: the bf16 exponent, not
 * fp16's (0x7c00 is a finite bf16). */
void test_bf16_cast(void) {
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
void test_bf16_sm80(void) {
  tt_backend *g75 = gpu, *g80;
  int old;
  TT_TEST_BEGIN("cuda_bf16_conv_linear_sm80");
  TT_CHECK(test_bf16_lib_refused(), "the emulated sm_75 should refuse bf16 convolutions and GEMMs");
  g80 = test_sm80_backend(&old);
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
void test_precision_auto_cc(void) {
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

#endif
