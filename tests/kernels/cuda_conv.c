/* tests/kernels/cuda_conv.c — test_cuda's convolution (fp32, fp16, bf16; NHWC), TF32 and the workspace cap.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA

/* Whether gpu refuses bf16 convolutions and GEMMs (a device below compute capability 8.0: cuDNN's
 * bf16 configuration needs 8.0); a refusal must say why. */
int test_bf16_lib_refused(void) {
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


void test_conv(void) {
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

void test_conv_dt(tt_dtype dt) {
  /* n c h w k r s sh sw ph pw groups */
  int cfg[5][12] = {{4, 3, 16, 16, 8, 3, 3, 1, 1, 1, 1, 1}, {2, 8, 15, 15, 16, 3, 3, 2, 2, 1, 1, 2},
                    {3, 8, 9, 9, 8, 3, 3, 1, 1, 1, 1, 8}, {2, 6, 8, 8, 6, 1, 3, 1, 1, 0, 1, 1},
                    {8, 16, 7, 7, 32, 1, 1, 1, 1, 0, 0, 1}};
  {
    for (int k = 0; k < 5; k++) {
      tt_conv_desc d;
      int *c = cfg[k];
      goff = 0;
      memset(&d, 0, sizeof d); /* backend.h: zero the whole desc (layout_w 0: KCRS) */
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
void test_nhwc_dt(tt_dtype dt) {
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
    /* the row kernels' statistics: 16-byte vectors where C is whole vectors (16), else scalar (7) */
    const char *rows_k = C % (int)(16 / tt_dtype_size(dt)) ? "cuda_bn_rows_stats_k" : "cuda_bnr_stats_k";
    size_t rows0 = tt_emu_kernel_launches(rows_k), plane0 = tt_emu_kernel_launches("cuda_bn_stats_k");
#endif
    BOTH(B->bn_fwd_train(B, BNN, SD(dt), P(x), PF(g), PF(bb), P(y), PF(rm), PF(rv), 0.1f, 1e-5f, PF(sm), PF(si), 1, WS));
#ifdef TT_CUDA_EMULATION /* hw == 1 takes the row kernels (coalesced over channels), not the per-channel ones */
    TT_CHECK(tt_emu_kernel_launches(rows_k) == rows0 + 1 && tt_emu_kernel_launches("cuda_bn_stats_k") == plane0,
             "bn_fwd_train on [%d, %d, 1]: %zu %s and %zu per-channel statistics launches (want 1 and 0)", R, C,
             tt_emu_kernel_launches(rows_k) - rows0, rows_k, tt_emu_kernel_launches("cuda_bn_stats_k") - plane0);
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

void test_nhwc_ops(void) {
  tt_backend *g0 = gpu, *g80 = NULL;
  int old_cc = 0;
  TT_TEST_BEGIN("cuda_nhwc_ops");
#ifdef TT_CUDA_EMULATION
  { /* bf16 convolutions need sm_80: a second backend on the emulated sm_80, which stays the emulated
     * device's capability for the test (as cuda_bf16_conv_linear_sm80) */
    size_t reserve = 0;
    char msg[512];
    old_cc = tt_emu_set_compute_capability(80);
    g80 = tt_cuda_backend_create(&reserve, NULL, msg, sizeof msg);
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


/* ---------------------------------------- TF32 --------------------------------------------- */

#ifdef TT_CUDA_EMULATION
/* The math types the emulated libraries saw (cudnn.h, cublas_v2.h): */
#define TEST_CUDNN_FMA_MATH 3
#define TEST_CUBLAS_DEFAULT_MATH 0
#define TEST_CUBLAS_TF32_TENSOR_OP_MATH 3

/* Downloads a device fp32 tensor. */
float *test_dl(tt2 t) {
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
void test_tf32_run(int on, int want_tf32, const tt_conv_desc *d, tt2 x, tt2 w, tt2 y, tt2 dy, tt2 dw,
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

int test_differs(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], 4)) return 1;
  return 0;
}
int test_same(const float *a, const float *b, size_t n) { return !test_differs(a, b, n); }

tt_backend *test_sm80_backend(int *old) {
  size_t reserve = 0;
  char msg[512];
  tt_backend *g80;
  *old = tt_emu_set_compute_capability(80);
  g80 = tt_cuda_backend_create(&reserve, NULL, msg, sizeof msg);
  TT_CHECK(g80 != NULL, "a backend on the emulated sm_80: %s", msg);
  return g80;
}

/* TF32 (tt_cuda_set_tf32, docs/gpu.md#tf32): a backend starts in true fp32 (cuDNN FMA math, cuBLAS
 * default math), as every CUDA-vs-CPU comparison in this file needs; on the emulated sm_80 TF32 on
 * makes fp32 convolutions and GEMMs read their operands rounded to TF32 (results differ from fp32,
 * within TF32's error of the reference), off gives the fp32 bits back; on the sm_75 it is never
 * used. Every other backend refuses the call. */
void test_tf32(void) {
  tt_backend *g75 = gpu, *g80;
  int old;
  TT_TEST_BEGIN("cuda_tf32");
  TT_CHECK(tt_cuda_set_tf32(cpu, 1) == -1, "tt_cuda_set_tf32 on the reference backend should fail");
  g80 = test_sm80_backend(&old);
  tt_emu_set_compute_capability(old);
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
void test_conv_ws_cap(void) {
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

#endif
