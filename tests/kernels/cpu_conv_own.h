/* tests/kernels/cpu_conv_own.h — test_cpu_vs_ref.c's checks of the convolution algorithms the
 * CPU backend runs itself instead of oneDNN: column blocks (cpu_conv_col.c) and Winograd
 * F(4x4, 3x3) (cpu_conv_wg.c). Included once, by test_cpu_vs_ref.c, after its helpers (R, C, vec,
 * vr_dup, perm_nhwc, ws_for, cmp, mkconv, conv_op, conv_case), which these use. */
#ifndef TT_TEST_CPU_CONV_OWN_H
#define TT_TEST_CPU_CONV_OWN_H

/* conv_bwd_filter on NHWC x and dy (xh, dyh; the oneDNN backend C, desc dn) against the reference
 * on NCHW (x, dy; R, desc d), each into copies of dw0 and db0 with beta, a bias gradient, each with
 * exactly the workspace it asks for; tag names the comparison. Returns C's dw (the caller frees it),
 * its workspace in *ws (the caller frees it) and that workspace's bytes in *wsb. */
static float *bwd_filter_nhwc_vs_ref(const tt_conv_desc *dn, const tt_conv_desc *d, const float *xh, const float *dyh,
                                     const float *x, const float *dy, const float *dw0, const float *db0, int beta,
                                     const char *tag, void **ws, size_t *wsb) {
  size_t wn = (size_t)d->k * d->c * d->r * d->s, wr;
  char what[64];
  float *dwc = vr_dup(dw0, wn), *dwr = vr_dup(dw0, wn), *dbc = vr_dup(db0, (size_t)d->k), *dbr = vr_dup(db0, (size_t)d->k);
  tt_op_desc on = conv_op(TT_OP_CONV_BWD_FILTER, dn, TT_F32, 1, 0), orr = conv_op(TT_OP_CONV_BWD_FILTER, d, TT_F32, 1, 0);
  void *wsr = ws_for(R, &orr, &wr);
  *ws = ws_for(C, &on, wsb);
  TT_CHECK(!C->conv_bwd_filter(C, dn, TT_F32, xh, dyh, dwc, dbc, (float)beta, *ws, *wsb), "%s: %s", tag, C->last_error(C));
  TT_CHECK(!R->conv_bwd_filter(R, d, TT_F32, x, dy, dwr, dbr, (float)beta, wsr, wr), "ref: %s", R->last_error(R));
  snprintf(what, sizeof what, "%s dw%s", tag, beta ? " (beta 1)" : "");
  cmp(what, dwc, dwr, wn, TT_F32);
  snprintf(what, sizeof what, "%s db%s", tag, beta ? " (beta 1)" : "");
  cmp(what, dbc, dbr, (size_t)d->k, TT_F32);
  free(wsr), free(dwr), free(dbc), free(dbr);
  return dwc;
}

/* A first layer's fp32 backward weights as column blocks and sgemm (cpu_conv_col.c), forced on
 * whatever oneDNN runs here (by itself only below AVX-512): selected for one input channel only
 * (not 3, not 8); against the reference, dy NCHW and NHWC, with a bias, beta 0 and 1: 40 samples
 * of 12x12 (5760 rows: blocks of 2048, 2048 and 1664 on 2 threads, so a thread sums two, and a
 * block splits at sample and output-row boundaries), a 7x7 stride-2 pad-3 stem and a 3x3 layer
 * over 12 channels; bit for bit run to run and at every ISA level of our loops (NHWC); a short
 * workspace refused naming the op. */
static void test_conv_col(void) {
  tt_cpu_state *st = tt_cpu_st(C);
  int keep = st->conv_col;
  st->conv_col = 1;
  TT_TEST_BEGIN("cpu_vs_ref:conv_col_selection_and_nhwc");
  for (int c = 3; c <= 8; c += 5) {
    tt_conv_desc big = mkconv(2, c, 12, 12, 16, 3, 3, 1, 1, 1, 1, 1);
    tt_op_desc ob = conv_op(TT_OP_CONV_BWD_FILTER, &big, TT_F32, 0, 0);
    TT_CHECK(tt_cpu_conv_is_matmul(C, &ob) == 0, "%d input channels ran as column blocks", c);
  }
  /* n c h w k r s stride pad: 25 taps (12 + 12 + 1) and 49 (4 x 12 + 1) over 32 and 16 channels, and
   * 9 taps (one at a time) over 12 channels (8 in a vector, 4 in scalar sums) */
  static const int shapes[3][9] = {{40, 1, 12, 12, 32, 5, 5, 1, 2}, {6, 1, 13, 11, 16, 7, 7, 2, 3}, {9, 1, 10, 9, 12, 3, 3, 1, 1}};
  for (int i = 0; i < 3; i++) {
    const int *v = shapes[i];
    tt_conv_desc d = mkconv(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[7], v[8], v[8], 1);
    tt_op_desc op = conv_op(TT_OP_CONV_BWD_FILTER, &d, TT_F32, 1, 0);
    TT_CHECK(tt_cpu_conv_is_matmul(C, &op) == 1, "c %d: not run as column blocks", d.c);
    /* x and dy NHWC, against the reference on NCHW */
    size_t xn = (size_t)d.n * d.c * d.h * d.w, yn = (size_t)d.n * d.k * d.p * d.q, wn = (size_t)d.k * d.c * d.r * d.s;
    float *x = vec(xn, 1.0f), *dy = vec(yn, 1.0f), *dw0 = vec(wn, 1.0f), *db0 = vec((size_t)d.k, 1.0f);
    float *xh = (float *)perm_nhwc(x, d.n, d.c, d.h * d.w, 4, 1), *dyh = (float *)perm_nhwc(dy, d.n, d.k, d.p * d.q, 4, 1);
    tt_conv_desc dn = d;
    dn.layout_x = dn.layout_y = TT_LAYOUT_NHWC;
    for (int beta = 0; beta < 2; beta++) {
      size_t wc;
      void *wsc;
      float *dwc = bwd_filter_nhwc_vs_ref(&dn, &d, xh, dyh, x, dy, dw0, db0, beta, "NHWC", &wsc, &wc);
      if (beta == 0) {
        float *dw2 = vr_dup(dw0, wn);
        TT_CHECK(!C->conv_bwd_filter(C, &dn, TT_F32, xh, dyh, dw2, NULL, 0.0f, wsc, wc) && !memcmp(dw2, dwc, wn * 4),
                 "NHWC: not bit-identical run to run");
        int held = tt_cpu_vec_level; /* every copy of cpu_conv_col_acc this CPU runs: the same bits */
        for (int l = CPU_VEC_BASE; l <= tt_cpu_vec_cpu_level(); l++) {
          tt_cpu_vec_level = l;
          TT_CHECK(!C->conv_bwd_filter(C, &dn, TT_F32, xh, dyh, dw2, NULL, 0.0f, wsc, wc) && !memcmp(dw2, dwc, wn * 4),
                   "NHWC: other bits at ISA level %d than at level %d", l, held);
        }
        tt_cpu_vec_level = held;
        int rc = C->conv_bwd_filter(C, &dn, TT_F32, xh, dyh, dw2, NULL, 0.0f, wsc, wc - 1);
        TT_CHECK(rc != 0 && strstr(C->last_error(C), "conv_bwd_filter") && strstr(C->last_error(C), "workspace"),
                 "a short workspace was not refused: %s", C->last_error(C));
        free(dw2);
      }
      free(wsc), free(dwc);
    }
    free(x), free(dy), free(dw0), free(db0), free(xh), free(dyh);
  }
  TT_TEST_END();
  for (int i = 0; i < 3; i++) { /* x and dy NCHW: conv_case's checks */
    const int *v = shapes[i];
    conv_case(C, i == 2 ? "conv_col_3x3_k12_c1" : i ? "conv_col_7x7_s2_p3_c1" : "conv_col_5x5_p2_c1",
              mkconv(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[7], v[8], v[8], 1), TT_F32, 1);
  }
  st->conv_col = keep;
}
/* 3x3 stride-1 fp32 NHWC convolutions by Winograd F(4x4, 3x3) (cpu_conv_wg.c), forced on whatever
 * oneDNN runs here (by itself only below AVX-512; skipped where the CPU has no AVX2 and FMA or our
 * loops are held below AVX2): selected for its shapes only; the three directions against the
 * reference on NCHW, with a bias, beta 0 and 1, over images whose sides are not multiples of 4
 * (partial tiles), a 1x1 image, output channels that are not a multiple of 16 (the 8-wide kernel)
 * and enough tiles for several blocks in each direction; bit for bit run to run and on 1 and 3
 * threads; a short workspace refused naming the op. */
static void test_conv_wg(void) {
  tt_cpu_state *st = tt_cpu_st(C);
  int keep = st->conv_wg;
  st->conv_wg = 1;
  TT_TEST_BEGIN("cpu_vs_ref:conv_winograd");
  {
    tt_conv_desc on = mkconv(2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1);
    on.layout_x = on.layout_y = TT_LAYOUT_NHWC;
    tt_op_desc o = conv_op(TT_OP_CONV_FWD, &on, TT_F32, 0, 0);
    if (!tt_cpu_conv_wg(C, &o)) {
      printf("  SKIP: no AVX2 and FMA here, or our loops held below AVX2\n");
      st->conv_wg = keep;
      TT_TEST_END();
      return;
    }
    /* not selected: 12 channels, stride 2, 5x5, groups 2, bf16, NCHW x */
    tt_conv_desc off[5] = {mkconv(2, 12, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1), mkconv(2, 16, 8, 8, 16, 3, 3, 2, 2, 1, 1, 1),
                           mkconv(2, 16, 8, 8, 16, 5, 5, 1, 1, 2, 2, 1), mkconv(2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 2), on};
    for (int i = 0; i < 5; i++) {
      if (i < 4) off[i].layout_x = off[i].layout_y = TT_LAYOUT_NHWC;
      else off[i].layout_x = TT_LAYOUT_NCHW;
      tt_op_desc oo = conv_op(TT_OP_CONV_BWD_FILTER, &off[i], TT_F32, 0, 0);
      TT_CHECK(!tt_cpu_conv_wg(C, &oo), "case %d: selected for Winograd", i);
    }
    o.dt = TT_BF16;
    TT_CHECK(!tt_cpu_conv_wg(C, &o), "bf16 selected for Winograd");
  }
  /* n c h w k */
  static const int shapes[4][5] = {{2, 8, 9, 7, 8}, {3, 16, 5, 6, 24}, {20, 8, 16, 16, 16}, {2, 64, 1, 1, 8}};
  tt_backend *other[2] = {tt_cpu_backend_create(1), tt_cpu_backend_create(3)};
  for (int t = 0; t < 2; t++)
    if (other[t]) tt_cpu_st(other[t])->conv_wg = 1;
  for (int i = 0; i < 4 && !tt_test_current_failed; i++) {
    const int *v = shapes[i];
    tt_conv_desc d = mkconv(v[0], v[1], v[2], v[3], v[4], 3, 3, 1, 1, 1, 1, 1), dn = d;
    dn.layout_x = dn.layout_y = TT_LAYOUT_NHWC;
    size_t xn = (size_t)d.n * d.c * d.h * d.w, yn = (size_t)d.n * d.k * d.p * d.q, wn = (size_t)d.k * d.c * 9;
    float *x = vec(xn, 1.0f), *w = vec(wn, 0.5f), *bv = vec((size_t)d.k, 0.5f), *dy = vec(yn, 1.0f);
    float *dx0 = vec(xn, 1.0f), *dw0 = vec(wn, 1.0f), *db0 = vec((size_t)d.k, 1.0f);
    float *xh = (float *)perm_nhwc(x, d.n, d.c, d.h * d.w, 4, 1), *dyh = (float *)perm_nhwc(dy, d.n, d.k, d.p * d.q, 4, 1);
    tt_op_desc of = conv_op(TT_OP_CONV_FWD, &dn, TT_F32, 1, 0), ofr = conv_op(TT_OP_CONV_FWD, &d, TT_F32, 1, 0);
    TT_CHECK(tt_cpu_conv_wg(C, &of), "shape %d: not selected", i);
    size_t wc, wr;
    void *wsc = ws_for(C, &of, &wc), *wsr = ws_for(R, &ofr, &wr);
    float *yc = vec(yn, 1.0f), *yr = vec(yn, 1.0f), *yb;
    TT_CHECK(!C->conv_fwd(C, &dn, TT_F32, xh, w, bv, yc, wsc, wc), "conv_fwd: %s", C->last_error(C));
    TT_CHECK(!R->conv_fwd(R, &d, TT_F32, x, w, bv, yr, wsr, wr), "ref: %s", R->last_error(R));
    yb = (float *)perm_nhwc(yc, d.n, d.k, d.p * d.q, 4, 0);
    cmp("y", yb, yr, yn, TT_F32);
    for (int t = 0; t < 2; t++) { /* 1 and 3 threads: the same bits */
      float *y2 = vec(yn, 1.0f);
      size_t w2b;
      void *ws2 = other[t] ? ws_for(other[t], &of, &w2b) : NULL;
      TT_CHECK(other[t] && !other[t]->conv_fwd(other[t], &dn, TT_F32, xh, w, bv, y2, ws2, w2b) && !memcmp(y2, yc, yn * 4),
               "conv_fwd on %d threads: other bits than on 2", t ? 3 : 1);
      free(y2), free(ws2);
    }
    int rc = C->conv_fwd(C, &dn, TT_F32, xh, w, bv, yc, wsc, wc - 1);
    TT_CHECK(rc != 0 && strstr(C->last_error(C), "conv_fwd") && strstr(C->last_error(C), "workspace"),
             "a short workspace was not refused: %s", C->last_error(C));
    free(wsc), free(wsr), free(yc), free(yr), free(yb);
    for (int beta = 0; beta < 2; beta++) {
      tt_op_desc od = conv_op(TT_OP_CONV_BWD_DATA, &dn, TT_F32, 0, beta), odr = conv_op(TT_OP_CONV_BWD_DATA, &d, TT_F32, 0, beta);
      tt_op_desc ow = conv_op(TT_OP_CONV_BWD_FILTER, &dn, TT_F32, 1, 0);
      float *dxr = vr_dup(dx0, xn), *dxc = (float *)perm_nhwc(dx0, d.n, d.c, d.h * d.w, 4, 1), *dxb;
      wsc = ws_for(C, &od, &wc), wsr = ws_for(R, &odr, &wr);
      TT_CHECK(!C->conv_bwd_data(C, &dn, TT_F32, dyh, w, dxc, (float)beta, wsc, wc), "conv_bwd_data: %s", C->last_error(C));
      TT_CHECK(!R->conv_bwd_data(R, &d, TT_F32, dy, w, dxr, (float)beta, wsr, wr), "ref: %s", R->last_error(R));
      dxb = (float *)perm_nhwc(dxc, d.n, d.c, d.h * d.w, 4, 0);
      cmp(beta ? "dx (beta 1)" : "dx", dxb, dxr, xn, TT_F32);
      free(wsc), free(wsr);
      float *dwc = bwd_filter_nhwc_vs_ref(&dn, &d, xh, dyh, x, dy, dw0, db0, beta, "conv_bwd_filter", &wsc, &wc);
      if (beta == 0) {
        float *dw2 = vr_dup(dw0, wn);
        TT_CHECK(!C->conv_bwd_filter(C, &dn, TT_F32, xh, dyh, dw2, NULL, 0.0f, wsc, wc) && !memcmp(dw2, dwc, wn * 4),
                 "conv_bwd_filter: not bit-identical run to run");
        for (int t = 0; t < 2; t++) {
          size_t w2b;
          void *ws2 = other[t] ? ws_for(other[t], &ow, &w2b) : NULL;
          float *dw3 = vr_dup(dw0, wn);
          TT_CHECK(other[t] && !other[t]->conv_bwd_filter(other[t], &dn, TT_F32, xh, dyh, dw3, NULL, 0.0f, ws2, w2b) &&
                       !memcmp(dw3, dwc, wn * 4),
                   "conv_bwd_filter on %d threads: other bits than on 2", t ? 3 : 1);
          free(ws2), free(dw3);
        }
        rc = C->conv_bwd_filter(C, &dn, TT_F32, xh, dyh, dw2, NULL, 0.0f, wsc, wc - 1);
        TT_CHECK(rc != 0 && strstr(C->last_error(C), "conv_bwd_filter") && strstr(C->last_error(C), "workspace"),
                 "a short workspace was not refused: %s", C->last_error(C));
        free(dw2);
      }
      free(wsc), free(dxr), free(dxc), free(dxb), free(dwc);
    }
    free(x), free(w), free(bv), free(dy), free(dx0), free(dw0), free(db0), free(xh), free(dyh);
  }
  for (int t = 0; t < 2; t++)
    if (other[t]) other[t]->destroy(other[t]);
  TT_TEST_END();
  st->conv_wg = keep;
}
#endif
