/* tests/kernels/cuda_bn.c — test_cuda's batch norm: training and inference forms, bn_apply, ReLU-fused,
 * add-and-ReLU-fused and held-on-chip forms.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA

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
void test_batchnorm(void) {
  TT_TEST_BEGIN("cuda_batchnorm");
  /* the last two: each channel split over several blocks (16-byte vectors crossing planes; odd hw) */
  /* then NHWC rows ([rows, c, 1]): c 3 to 2048, odd multiples of a vector (24, 40), ones not (20, 3);
   * 2048 and 1024 channels held on chip (cuda_bn_chip.cu's rows form) where it is on */
  int shapes[13][3] = {{8, 16, 49}, {3, 5, 1024}, {64, 7, 1}, {16, 3, 1100}, {2, 3, 4099}, {4200, 24, 1},
                       {600, 40, 1}, {2100, 64, 1}, {200, 256, 1}, {24, 2048, 1}, {300, 20, 1}, {500, 3, 1},
                       {300, 1024, 1}};
  /* twice: with the held-on-chip form (where a shape fits: the first two), then with it off, so
   * that the two-pass and flat forms meet the CPU on the same shapes */
  const size_t res_cap = tt_cuda_set_bn_resident(gpu, (size_t)-1);
  for (int di = 0; di < 6; di++) {
    tt_dtype dt = test_dts[di % 3];
    tt_cuda_set_bn_resident(gpu, di < 3 ? res_cap : 0);
    if (di == 3) printf("  cuda_batchnorm: the held-on-chip form off from here (tt_cuda_set_bn_resident 0)\n");
    for (int s = 0; s < 13; s++) {
      if (test_san_skip_dt(di, s)) continue;
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
void test_bn_relu_fused(void) {
  int shapes[9][3] = {{8, 16, 49}, {3, 5, 1024}, {64, 7, 1}, {16, 3, 1100}, {2, 3, 4099}, {4, 6, 9}, {2100, 64, 1},
                      {600, 40, 1}, {24, 2048, 1}};
  TT_TEST_BEGIN("cuda_bn_relu_fused");
  TT_CHECK(gpu->bn_fwd_train_relu && gpu->bn_bwd_relu, "the CUDA backend's table lists no fused batch norm + ReLU");
  if (!gpu->bn_fwd_train_relu || !gpu->bn_bwd_relu) {
    TT_TEST_END();
    return;
  }
  for (int di = 0; di < 3; di++)
    for (int s = 0; s < 9; s++)
      for (int tiny = 0; tiny < 2; tiny++) {
        if (test_san_skip_dt(di, s)) continue;
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

/* The held-on-chip batch norm (cuda_bn_chip.cu, one read of x and dy where a block's channels fit
 * its shared memory) against the two-pass forms on the same device (tt_cuda_set_bn_resident(gpu,
 * 0) turns it off): the statistics and dgamma/dbias to rounding (the sums are grouped
 * differently), y bit for bit the two-pass normalisation of its own statistics (bn_apply), dx
 * within the element-wise tolerance, dx computed in place over dy bit for bit the out-of-place dx.
 * Shapes: groups of 8, 4, 2 and 1 channels a block (7x7, 3x3, 14x14, 32x32), a 112x112 plane
 * whose backward fills 50,176 bytes (fp16; fp32 backward does not fit a T4's 64 KiB: two-pass),
 * and shapes it refuses (channels not a multiple of the group). NHWC rows (hw 1, cuda_bnc_*): 2048
 * and 1024 channels (a block for every two multiprocessors or more; 1500 rows: 48,000 bytes, the
 * forward on chip and the backward two-pass), 256 channels in fp32 (32 blocks) but not in fp16
 * (16), 8 channels (one block: refused). Under the emulation the launches show which form ran, against the rule
 * restated here. */
void test_bn_resident(void) {
  int shapes[10][3] = {{8, 16, 49}, {5, 24, 9}, {2, 6, 196}, {3, 5, 1024}, {1, 4, 12544}, {2, 3, 4099}, {16, 8, 1},
                       {24, 2048, 1}, {1500, 1024, 1}, {100, 256, 1}};
  const size_t cap = tt_cuda_set_bn_resident(gpu, (size_t)-1);
  TT_TEST_BEGIN("cuda_bn_resident");
  TT_CHECK(cap >= 50176, "the held-on-chip batch norm's cap is %zu bytes (want at least 50,176: a T4's opt-in less static)",
           cap);
  for (int di = 0; di < 3; di++)
    for (int s = 0; s < 10; s++) {
      if (test_san_skip_dt(di, s)) continue;
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
        size_t cf0 = tt_emu_kernel_launches("cuda_bnc_fwd_k"), cb0 = tt_emu_kernel_launches("cuda_bnc_bwd_k"), rf, rb;
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
          if (HW == 1) { /* NHWC rows: 2 columns of 16 bytes a block, at least one block for every two of
                          * the emulated device's 40 multiprocessors */
            int cv = C % (int)(16 / es) ? 0 : C / (int)(16 / es), tc = cv < 2 ? cv : 2;
            fits = cv && 2 * ((cv + tc - 1) / tc) >= 40;
            wf = !f && fits && (size_t)N * tc * 16 <= cap, wb = !f && fits && 2 * (size_t)N * tc * 16 <= cap;
          }
          const char *kf = HW == 1 ? "cuda_bnc_fwd_k" : "cuda_bn_res_fwd_k", *kb = HW == 1 ? "cuda_bnc_bwd_k" : "cuda_bn_res_bwd_k";
          rf = tt_emu_kernel_launches(kf) - (HW == 1 ? cf0 : rf0), rb = tt_emu_kernel_launches(kb) - (HW == 1 ? cb0 : rb0);
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


/* Batch norm, add and ReLU as one call (backend.h bn_fwd_train_add_relu, bn_bwd_add_relu) on the
 * device, bit for bit the calls they stand for on the same device: bn_fwd_train, add, act_fwd(RELU)
 * (and in place on the shortcut, y == s); act_bwd(RELU) (or act_bwd_mask from act_mask), accumulate
 * into the shortcut's gradient and into bn_bwd's dy, bn_bwd. Every form of the kernels: with the
 * held-on-chip form and without it (two-pass, flat at 49, rows at hw 1: an NHWC tensor as the
 * backends get it), fp32, fp16, bf16, the betas 0 and 1, ds == dy, dx == dy. */
static void bn_add_relu_case(tt_dtype dt, int N, int C, int HW) {
  size_t cnt = (size_t)N * C * HW, nb = cnt * tt_dtype_size(dt), fb = (size_t)C * sizeof(float), wsb;
  tt_op_desc od;
  memset(&od, 0, sizeof od);
  od.kind = TT_OP_BN_BWD, od.dt = dt, od.u.bn.n = N, od.u.bn.c = C, od.u.bn.hw = HW, od.u.bn.eps = 1e-5f;
  wsb = gpu->op_workspace(gpu, &od);
  void *ws = test_galloc(wsb ? wsb : 1);
  tt2 x = mk(cnt, dt, -2, 3), sc = mk(cnt, dt, -1.5f, 1), dy = mk(cnt, dt, -1, 1), dx0 = mk(cnt, dt, -1, 1);
  tt2 ds0 = mk(cnt, dt, -1, 1), g = mk(C, TT_F32, 0.5f, 1.5f), bb = mk(C, TT_F32, -1, 1), stat = mk(6 * (size_t)C, TT_F32, 0.5f, 1);
  void *t = test_galloc(nb), *y1 = test_galloc(nb), *y2 = test_galloc(nb), *y3 = test_galloc(nb), *d = test_galloc(nb);
  void *gb = test_galloc(nb), *dx1 = test_galloc(nb), *dx2 = test_galloc(nb), *ds1 = test_galloc(nb), *ds2 = test_galloc(nb);
  void *dyc = test_galloc(nb);
  uint32_t *mask = (uint32_t *)test_galloc(tt_act_mask_bytes(cnt));
  float *st = (float *)test_galloc(12 * fb); /* rm, rv, sm, si, dg, db for the two forms */
  unsigned char *h1 = (unsigned char *)malloc(nb), *h2 = (unsigned char *)malloc(nb), *h3 = (unsigned char *)malloc(nb);
  const float *G = (const float *)g.g, *Bb = (const float *)bb.g;
  int zeros = 0, ok = h1 && h2 && h3 && !gpu->upload(gpu, st, stat.c, 6 * fb) && !gpu->upload(gpu, st + 6 * C, stat.c, 6 * fb);
  ok = ok && !gpu->download(gpu, h1, sc.g, nb) && !gpu->upload(gpu, y3, h1, nb) &&
       !gpu->bn_fwd_train(gpu, N, C, HW, dt, x.g, G, Bb, t, st, st + C, 0.1f, 1e-5f, st + 2 * C, st + 3 * C, 1, ws, wsb) &&
       !gpu->add(gpu, cnt, dt, t, sc.g, y1) && !gpu->act_fwd(gpu, TT_ACT_RELU, cnt, dt, y1, y1) &&
       !gpu->bn_fwd_train_add_relu(gpu, N, C, HW, dt, x.g, G, Bb, sc.g, y2, st + 6 * C, st + 7 * C, 0.1f, 1e-5f, st + 8 * C,
                                   st + 9 * C, 1, ws, wsb) &&
       !gpu->bn_fwd_train_add_relu(gpu, N, C, HW, dt, x.g, G, Bb, y3, y3, NULL, NULL, 0.1f, 1e-5f, st + 8 * C, st + 9 * C, 0,
                                   ws, wsb);
  TT_CHECK(ok, "fused bn+add %s %dx%dx%d forward: %s", test_dt_name(dt), N, C, HW, gpu->last_error(gpu));
  if (ok) {
    TT_CHECK(!gpu->download(gpu, h1, y1, nb) && !gpu->download(gpu, h2, y2, nb) && !gpu->download(gpu, h3, y3, nb) &&
                 !memcmp(h1, h2, nb) && !memcmp(h1, h3, nb),
             "bn_fwd_train_add_relu %s %dx%dx%d: y (or y in place on s) differs from bn_fwd_train, add, act_fwd(RELU)",
             test_dt_name(dt), N, C, HW);
    for (size_t i = 0; i < cnt; i++) zeros += test_get(h1, dt, i) == 0.0f;
    TT_CHECK(zeros > 0 && (size_t)zeros < cnt, "bn+add %s %dx%dx%d: %d of %zu outputs zero: the ReLU is not exercised",
             test_dt_name(dt), N, C, HW, zeros, cnt);
    TT_CHECK(!gpu->download(gpu, h1, st, 4 * fb) && !gpu->download(gpu, h2, st + 6 * C, 4 * fb) && !memcmp(h1, h2, 4 * fb),
             "bn_fwd_train_add_relu %s %dx%dx%d: statistics differ from bn_fwd_train's", test_dt_name(dt), N, C, HW);
    ok = !gpu->act_mask(gpu, TT_ACT_RELU, cnt, dt, y1, mask);
  }
  for (int form = 0; form < 4 && ok; form++) /* 0: y; 1: y, ds == dy; 2: the mask; 3: y, dx == dy (beta_dx 0) */
    for (int beta = 0; beta < 2 && ok; beta++) {
      float bs = form == 1 ? 0.0f : (float)beta, bd = form == 3 ? 0.0f : (float)beta;
      ok = !gpu->download(gpu, h1, dx0.g, nb) && !gpu->upload(gpu, dx1, h1, nb) && !gpu->upload(gpu, dx2, h1, nb) &&
           !gpu->download(gpu, h1, ds0.g, nb) && !gpu->upload(gpu, ds1, h1, nb) && !gpu->upload(gpu, ds2, h1, nb) &&
           !gpu->download(gpu, h1, dy.g, nb) && !gpu->upload(gpu, dyc, h1, nb) &&
           !gpu->upload(gpu, st + 4 * C, stat.c, 2 * fb) && !gpu->upload(gpu, st + 10 * C, stat.c, 2 * fb) &&
           !gpu->act_bwd(gpu, TT_ACT_RELU, cnt, dt, y1, dy.g, d, 0.0f) && !gpu->accumulate(gpu, cnt, dt, d, ds1, bs) &&
           !gpu->accumulate(gpu, cnt, dt, d, gb, 0.0f) &&
           !gpu->bn_bwd(gpu, N, C, HW, dt, x.g, gb, G, st + 2 * C, st + 3 * C, dx1, st + 4 * C, st + 5 * C, bd, (float)beta,
                        ws, wsb) &&
           !gpu->bn_bwd_add_relu(gpu, N, C, HW, dt, x.g, form == 2 ? NULL : y1, form == 2 ? mask : NULL, dyc, G, st + 2 * C,
                                 st + 3 * C, form == 3 ? dyc : dx2, form == 1 ? dyc : ds2, st + 10 * C, st + 11 * C, bd, bs,
                                 (float)beta, ws, wsb);
      TT_CHECK(ok, "fused bn+add %s %dx%dx%d backward form %d: %s", test_dt_name(dt), N, C, HW, form, gpu->last_error(gpu));
      if (!ok) break;
      TT_CHECK(!gpu->download(gpu, h1, dx1, nb) && !gpu->download(gpu, h2, form == 3 ? dyc : dx2, nb) && !memcmp(h1, h2, nb),
               "bn_bwd_add_relu %s %dx%dx%d form %d beta %d: dx differs from act_bwd, accumulate, bn_bwd", test_dt_name(dt),
               N, C, HW, form, beta);
      TT_CHECK(!gpu->download(gpu, h1, ds1, nb) && !gpu->download(gpu, h2, form == 1 ? dyc : ds2, nb) && !memcmp(h1, h2, nb),
               "bn_bwd_add_relu %s %dx%dx%d form %d beta %d: ds differs from the add backward's accumulate", test_dt_name(dt),
               N, C, HW, form, beta);
      TT_CHECK(!gpu->download(gpu, h1, st + 4 * C, 2 * fb) && !gpu->download(gpu, h2, st + 10 * C, 2 * fb) &&
                   !memcmp(h1, h2, 2 * fb),
               "bn_bwd_add_relu %s %dx%dx%d form %d beta %d: dgamma or dbias differ", test_dt_name(dt), N, C, HW, form, beta);
    }
  free(h1), free(h2), free(h3);
  fr(&x), fr(&sc), fr(&dy), fr(&dx0), fr(&ds0), fr(&g), fr(&bb), fr(&stat);
}

void test_bn_add_relu_fused(void) {
  int shapes[8][3] = {{8, 16, 49}, {3, 5, 1024}, {64, 7, 1}, {16, 3, 1100}, {4, 6, 9}, {2100, 64, 1}, {600, 40, 1},
                      {24, 2048, 1}};
  const size_t res_cap = tt_cuda_set_bn_resident(gpu, (size_t)-1);
  TT_TEST_BEGIN("cuda_bn_add_relu_fused");
  TT_CHECK(gpu->bn_fwd_train_add_relu && gpu->bn_bwd_add_relu, "the CUDA backend's table lists no fused batch norm + add + ReLU");
  /* with the held-on-chip form in every dtype, then without it in fp16 only (the two-pass, flat and
   * row kernels take the dtype as a template; test_cuda_emu's time budget: this case runs twice in
   * `ninja test`, also under --only kernels) */
  for (int di = 0; di < 4 && gpu->bn_fwd_train_add_relu && gpu->bn_bwd_add_relu; di++) {
    tt_cuda_set_bn_resident(gpu, di < 3 ? res_cap : 0);
    for (int s = 0; s < 8; s++) {
      if (test_san_skip_dt(di < 3 ? di : 1, s)) continue;
      goff = 0;
      bn_add_relu_case(di < 3 ? test_dts[di] : TT_F16, shapes[s][0], shapes[s][1], shapes[s][2]);
    }
  }
  tt_cuda_set_bn_resident(gpu, res_cap);
  TT_TEST_END();
}

/* Batch norm on NHWC rows ([rows, c, 1]: cuda_bn_rows.cu's 16-byte forms where c is whole vectors
 * and every tensor 16-byte aligned, else the scalar row kernels) on the device: under the
 * emulation the launches show which form ran, against the rule restated here; the same call twice
 * gives the same bits (statistics, y, dx, dgamma, dbias, and the workspace's partial sums:
 * fixed-order partials); views one element
 * off alignment (the scalar form) agree with the aligned call to rounding (the mean 1e-5 of the
 * channel's std, invstd 1e-5 of itself, dgamma and dbias 1e-5 of their largest, 1e-4 in 16 bits; the backward from the aligned call's statistics;
 * y and dx within the element-wise tolerance). C from 3 to 2048,
 * odd multiples of a vector (24, 40), rows over several splits (4200). The comparisons with the
 * CPU are cuda_batchnorm's, which runs these shapes too. */
static int bn_rows_run(tt_dtype dt, int R, int C, const void *x, const void *dy, const float *g, const float *bb, void *y,
                       void *dx, float *st, const float *bst, void *ws, size_t wsb) {
  /* st: this call's mean, invstd, dgamma, dbias; bst: the mean and invstd the backward takes (the
   * ReLU's mask recomputed from other statistics could flip an element near 0) */
  return !gpu->bn_fwd_train(gpu, R, C, 1, dt, x, g, bb, y, NULL, NULL, 0.1f, 1e-5f, st, st + C, 0, ws, wsb) &&
         !gpu->bn_bwd_relu(gpu, R, C, 1, dt, x, dy, g, bb, bst, bst + C, dx, st + 2 * C, st + 3 * C, 0.0f, 0.0f, ws, wsb) &&
         !gpu->sync(gpu);
}

void test_bn_rows(void) {
  int shapes[7][2] = {{4200, 24}, {600, 40}, {2100, 64}, {200, 256}, {24, 2048}, {500, 3}, {300, 20}};
  const size_t res_cap = tt_cuda_set_bn_resident(gpu, 0); /* the two-pass forms (24 x 2048 fits on chip) */
  TT_TEST_BEGIN("cuda_bn_nhwc_rows");
  for (int di = 0; di < 3; di++)
    for (int s = 0; s < 7; s++) {
      if (test_san_skip_dt(di, s)) continue;
      tt_dtype dt = test_dts[di];
      int R = shapes[s][0], C = shapes[s][1], vec = C % (int)(16 / tt_dtype_size(dt)) == 0;
      (void)vec; /* read by the emulator-only launch counts below */
      size_t es = tt_dtype_size(dt), cnt = (size_t)R * C, nb = cnt * es, fb = 4 * (size_t)C * sizeof(float), wsb;
      size_t span = (nb + 2 * es + 255) & ~(size_t)255;
      tt_op_desc od;
      unsigned char *h[2], *hw[2], *off;
      float *st[3], *hs[3];
      void *ws, *y[3], *dx[3], *xo, *dyo;
      int ok = 1;
      goff = 0;
      memset(&od, 0, sizeof od);
      od.kind = TT_OP_BN_BWD, od.dt = dt, od.u.bn.n = R, od.u.bn.c = C, od.u.bn.hw = 1, od.u.bn.eps = 1e-5f;
      wsb = gpu->op_workspace(gpu, &od);
      ws = test_galloc(wsb ? wsb : 1);
      tt2 x = mk(cnt, dt, -2, 3), dy = mk(cnt, dt, -1, 1), g = mk(C, TT_F32, 0.5f, 1.5f), bb = mk(C, TT_F32, -1, 1);
      off = (unsigned char *)test_galloc(4 * span); /* x, dy, y, dx one element past 16-byte alignment */
      xo = off + es, dyo = off + span + es, y[2] = off + 2 * span + es, dx[2] = off + 3 * span + es;
      h[0] = (unsigned char *)malloc(nb), h[1] = (unsigned char *)malloc(nb);
      hw[0] = (unsigned char *)malloc(wsb), hw[1] = (unsigned char *)malloc(wsb);
      for (int k = 0; k < 3; k++) {
        st[k] = (float *)test_galloc(fb), hs[k] = (float *)malloc(fb);
        if (k < 2) y[k] = test_galloc(nb), dx[k] = test_galloc(nb);
        ok = ok && hs[k];
      }
      ok = ok && h[0] && h[1] && hw[0] && hw[1] && !gpu->download(gpu, h[0], x.g, nb) && !gpu->upload(gpu, xo, h[0], nb) &&
           !gpu->download(gpu, h[0], dy.g, nb) && !gpu->upload(gpu, dyo, h[0], nb);
      for (int k = 0; k < 3 && ok; k++) { /* k = 0, 1: aligned, twice; 2: off alignment */
#ifdef TT_CUDA_EMULATION
        const char *names[4] = {"cuda_bnr_stats_k", "cuda_bnr_bwd_stats_k", "cuda_bnr_norm_k", "cuda_bnr_dx_k"};
        size_t n0[4];
        for (int q = 0; q < 4; q++) n0[q] = tt_emu_kernel_launches(names[q]);
#endif
        ok = bn_rows_run(dt, R, C, k < 2 ? x.g : xo, k < 2 ? dy.g : dyo, (const float *)g.g, (const float *)bb.g, y[k], dx[k],
                         st[k], st[k < 2 ? k : 0], ws, wsb) &&
             !gpu->download(gpu, hs[k], st[k], fb) && (k == 2 || !gpu->download(gpu, hw[k], ws, wsb));
        TT_CHECK(ok, "bn rows %s %dx%d (%s): %s", test_dt_name(dt), R, C, k < 2 ? "aligned" : "off alignment",
                 gpu->last_error(gpu));
#ifdef TT_CUDA_EMULATION
        for (int q = 0; q < 4 && ok; q++) { /* the vector form exactly where c is whole vectors and all is aligned */
          size_t got = tt_emu_kernel_launches(names[q]) - n0[q], want = (size_t)(vec && k < 2);
          TT_CHECK(got == want, "bn rows %s %dx%d (%s): %zu launches of %s, want %zu", test_dt_name(dt), R, C,
                   k < 2 ? "aligned" : "off alignment", got, names[q], want);
        }
#endif
      }
      if (ok) { /* the second aligned call: the same bits */
        TT_CHECK(!memcmp(hs[0], hs[1], fb), "bn rows %s %dx%d: statistics, dgamma or dbias differ between two runs",
                 test_dt_name(dt), R, C);
        /* the workspace's partial sums (double) too, which the fp32 results could hide a change in */
        TT_CHECK(!memcmp(hw[0], hw[1], wsb), "bn rows %s %dx%d: the partial sums differ between two runs", test_dt_name(dt),
                 R, C);
        for (int t = 0; t < 2; t++)
          TT_CHECK(!gpu->download(gpu, h[0], t ? dx[0] : y[0], nb) && !gpu->download(gpu, h[1], t ? dx[1] : y[1], nb) &&
                       !memcmp(h[0], h[1], nb),
                   "bn rows %s %dx%d: %s differs between two runs", test_dt_name(dt), R, C, t ? "dx" : "y");
      }
      if (ok) { /* off alignment (the scalar form) against the aligned call: to rounding */
        double worst = 0.0, big[2] = {1e-3, 1e-3};
        for (int k = 2 * C; k < 4 * C; k++)
          if (fabs((double)hs[0][k]) > big[k >= 3 * C]) big[k >= 3 * C] = fabs((double)hs[0][k]);
        for (int k = 0; k < 4 * C; k++) { /* the mean against the channel's std, invstd relative */
          double d = fabs((double)hs[0][k] - hs[2][k]);
          d = k < C ? d * hs[0][C + k] : d / (k < 2 * C ? fabs((double)hs[0][k]) : big[k >= 3 * C]);
          if (d > worst) worst = d;
        }
        TT_CHECK(worst <= (dt == TT_F32 ? 1e-5 : 1e-4), "bn rows %s %dx%d: statistics, dgamma or dbias off alignment "
                 "differ from the aligned call's by %.3g", test_dt_name(dt), R, C, worst);
        for (int t = 0; t < 2; t++) {
          double wd = 0.0, mr = 0.0;
          TT_CHECK(!gpu->download(gpu, h[0], t ? dx[0] : y[0], nb) && !gpu->download(gpu, h[1], t ? dx[2] : y[2], nb),
                   "download");
          for (size_t k = 0; k < cnt; k++) {
            double a = test_get(h[0], dt, k), d = fabs((double)test_get(h[1], dt, k) - a);
            if (fabs(a) > mr) mr = fabs(a);
            if (d > wd) wd = d;
          }
          TT_CHECK(wd <= tol_ew(dt) * mr + 1e-6, "bn rows %s %dx%d: %s off alignment differs from the aligned call's by "
                   "%.3g (max %.3g)", test_dt_name(dt), R, C, t ? "dx" : "y", wd, mr);
        }
      }
      for (int k = 0; k < 3; k++) free(hs[k]);
      free(h[0]), free(h[1]), free(hw[0]), free(hw[1]), fr(&x), fr(&dy), fr(&g), fr(&bb);
    }
  tt_cuda_set_bn_resident(gpu, res_cap);
  TT_TEST_END();
}

#ifdef TT_CUDA_EMULATION
/* The held-on-chip batch norm's cap follows the device's opt-in shared memory per block
 * (cudaDevAttrMaxSharedMemoryPerBlockOptin, tt_cuda_norm_setup): on the emulated sm_75, 80, 86, 90
 * and 120 a new backend's cap is that architecture's limit (64, 163, 99, 227, 99 KiB) less at most
 * 4 KiB of the kernels' static shared memory; and on sm_90 a [1, 1, 40000] fp32 plane (160,000
 * bytes) takes the held-on-chip form, which the emulation launches only after the kernel's
 * cudaFuncSetAttribute opt-in for that much, while sm_75 takes the two-pass forms. */
void test_bn_res_cap(void) {
  static const int ccs[5] = {75, 80, 86, 90, 120}, kib[5] = {64, 163, 99, 227, 99};
  TT_TEST_BEGIN("cuda_bn_resident_cap_per_arch");
  for (int k = 0; k < 5; k++) {
    int old = tt_emu_set_compute_capability(ccs[k]);
    size_t reserve = 0, cap = 0, optin = (size_t)kib[k] * 1024;
    char msg[512] = "";
    tt_backend *b = tt_cuda_backend_create(&reserve, NULL, msg, sizeof msg);
    TT_CHECK(b != NULL, "a backend on the emulated sm_%d: %s", ccs[k], msg);
    if (b) cap = tt_cuda_set_bn_resident(b, (size_t)-1);
    TT_CHECK(!b || (cap <= optin && cap + 4096 >= optin), "sm_%d: the held-on-chip cap is %zu bytes; want the opt-in "
             "limit %zu less the kernels' static shared memory", ccs[k], cap, optin);
    if (b && (ccs[k] == 75 || ccs[k] == 90)) {
      const int hw = 40000;
      tt_op_desc od;
      size_t wsb, r0 = tt_emu_kernel_launches("cuda_bn_res_fwd_k");
      unsigned char *a;
      memset(&od, 0, sizeof od);
      od.kind = TT_OP_BN_BWD, od.dt = TT_F32, od.u.bn.n = 1, od.u.bn.c = 1, od.u.bn.hw = hw, od.u.bn.eps = 1e-5f;
      wsb = (b->op_workspace(b, &od) + 255) & ~(size_t)255;
      a = (unsigned char *)b->arena_alloc(b, 2 * (size_t)hw * 4 + wsb + 256);
      int ok = a && !b->zero(b, a, 2 * (size_t)hw * 4 + wsb + 256);
      float *pr = (float *)(a + 2 * (size_t)hw * 4 + wsb); /* gamma, bias, mean, invstd */
      ok = ok && !b->bn_fwd_train(b, 1, 1, hw, TT_F32, a, pr, pr + 1, a + (size_t)hw * 4, NULL, NULL, 0.1f, 1e-5f, pr + 2,
                                  pr + 3, 0, a + 2 * (size_t)hw * 4, wsb) && !b->sync(b);
      TT_CHECK(ok, "sm_%d: bn_fwd_train on [1, 1, %d] fp32: %s", ccs[k], hw, b->last_error(b));
      TT_CHECK(tt_emu_kernel_launches("cuda_bn_res_fwd_k") - r0 == (ccs[k] == 90),
               "sm_%d: %zu held-on-chip launches for a 160,000-byte plane, want %d", ccs[k],
               tt_emu_kernel_launches("cuda_bn_res_fwd_k") - r0, ccs[k] == 90);
      if (a) b->arena_free(b, a);
    }
    if (b) b->destroy(b);
    tt_emu_set_compute_capability(old);
  }
  TT_TEST_END();
}
#endif
#endif
