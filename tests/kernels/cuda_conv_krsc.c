/* tests/kernels/cuda_conv_krsc.c — test_cuda's KRSC weight copies (issue 41, item 2; backend.h
 * tt_cast_seg.rs, tt_conv_desc.layout_w, filter_krsc): cast_multi writing a filter KRSC equals the
 * transpose then the cast, bit for bit, on the CUDA backend and on the reference; all-NHWC
 * convolutions reading the stored KRSC copy equal the per-call copy of the KCRS one, bit for bit,
 * through both cuDNN APIs, with workspaces smaller by the filter's bytes and no transpose launched;
 * a 16-bit NHWC training step planned with the KRSC casts equals one planned without
 * (TINYTRAIN_KRSC_CAST=0), bit for bit. Registered and run by tests/kernels/test_cuda.c. */
#include "tests/kernels/cuda_test.h"

#include <math.h>
#include <stdlib.h>

#include "core/base/knobs.h"

#if defined(TT_HAVE_CUDA) && defined(TT_CUDA_EMULATION)

/* A CUDA backend whose convolutions take API api (a tt_cuda_conv_api); NULL with a check failed. */
static tt_backend *test_krsc_backend(int api) {
  tt_backend_knobs k;
  size_t reserve = 0;
  char msg[512];
  tt_backend_knobs_default(&k);
  k.cuda_conv_api = api;
  tt_backend *b = tt_cuda_backend_create(&reserve, &k, msg, sizeof msg);
  TT_CHECK(b != NULL, "a CUDA backend with TINYTRAIN_CUDA_CONV_API %d: %s", api, msg);
  return b;
}

/* src [k, cg, rs] (KCRS) into dst [k, rs, cg] (KRSC), fp32 on the host. */
static void test_krsc_host(const float *src, float *dst, int k, int cg, int rs) {
  for (int i = 0; i < k; i++)
    for (int l = 0; l < cg; l++)
      for (int j = 0; j < rs; j++) dst[((size_t)i * rs + j) * cg + l] = src[((size_t)i * cg + l) * rs + j];
}

/* The KRSC cast: five filters (3x3, 1x1 (the same order both ways), 7x7 with 3 channels, 1x3,
 * and 5 filters of 1 channel) and two plain tensors between them, one misaligned, in one
 * cast_multi to fp16 and to bf16, on the CUDA backend and the reference: each KRSC segment equals
 * the host's transpose of the fp32 filter cast by `cast`, and the plain ones `cast`'s bits. */
void test_cast_krsc(void) {
  TT_TEST_BEGIN("cuda_cast_krsc");
  enum { NS = 7 };
  static const int shape[NS][3] = {{16, 8, 9}, {0, 0, 0}, {8, 16, 1}, {4, 3, 49}, {0, 0, 0}, {6, 6, 3}, {5, 1, 9}};
  size_t cnt[NS], off[NS], total = 0;
  for (int i = 0; i < NS; i++) {
    cnt[i] = shape[i][0] ? (size_t)shape[i][0] * shape[i][1] * shape[i][2] : (size_t)(37 + 113 * i);
    off[i] = total + (i == 4 ? 1 : 0); /* tensor 4 one element off: the element-by-element path */
    total += (cnt[i] + 64) / 64 * 64 + 64;
  }
  float *h = (float *)malloc(total * sizeof(float)), *t = (float *)malloc(total * sizeof(float));
  uint16_t *got = (uint16_t *)malloc(total * 2), *want = (uint16_t *)malloc(total * 2), *ref = (uint16_t *)malloc(total * 2);
  uint16_t *cref = (uint16_t *)malloc(total * 2);
  float *cs = (float *)malloc(total * sizeof(float));
  goff = 0;
  float *src = (float *)test_galloc(total * sizeof(float)), *srct = (float *)test_galloc(total * sizeof(float));
  uint16_t *d1 = (uint16_t *)test_galloc(total * 2), *d2 = (uint16_t *)test_galloc(total * 2);
  for (size_t i = 0; i < total; i++) h[i] = test_rand(-3.0f, 3.0f) * (i % 5 ? 1.0f : 1e-4f);
  memcpy(t, h, total * sizeof(float));
  for (int i = 0; i < NS; i++)
    if (shape[i][0]) test_krsc_host(h + off[i], t + off[i], shape[i][0], shape[i][1], shape[i][2]);
  TT_CHECK(gpu->upload(gpu, src, h, total * sizeof(float)) == 0 && gpu->upload(gpu, srct, t, total * sizeof(float)) == 0,
           "upload: %s", gpu->last_error(gpu));
  for (int c = 0; c < 2 && !tt_test_current_failed; c++) {
    tt_dtype dt = c ? TT_BF16 : TT_F16;
    tt_cast_seg sg[NS], sc[NS];
    memset(sg, 0, sizeof sg);
    for (int i = 0; i < NS; i++) {
      sg[i].src = src + off[i], sg[i].dst = d1 + off[i], sg[i].count = cnt[i];
      if (shape[i][0]) sg[i].k = shape[i][0], sg[i].rs = shape[i][2];
      sc[i] = sg[i], sc[i].src = cs + off[i], sc[i].dst = cref + off[i];
    }
    TT_CHECK(gpu->zero(gpu, d1, total * 2) == 0 && gpu->zero(gpu, d2, total * 2) == 0, "zero: %s", gpu->last_error(gpu));
    TT_CHECK(gpu->cast_multi(gpu, sg, NS, TT_F32, dt) == 0, "cast_multi (KRSC): %s", gpu->last_error(gpu));
    /* the old way: the fp32 filter transposed (here, on the host), then cast */
    TT_CHECK(gpu->cast(gpu, total, TT_F32, srct, dt, d2) == 0, "cast: %s", gpu->last_error(gpu));
    TT_CHECK(gpu->download(gpu, got, d1, total * 2) == 0 && gpu->download(gpu, want, d2, total * 2) == 0, "download: %s",
             gpu->last_error(gpu));
    /* the reference backend's cast_multi on the host, the same segments */
    memcpy(cs, h, total * sizeof(float));
    memset(cref, 0, total * 2);
    TT_CHECK(cpu->cast_multi && cpu->cast_multi(cpu, sc, NS, TT_F32, dt) == 0, "reference cast_multi (KRSC): %s",
             cpu->last_error(cpu));
    TT_CHECK(cpu->cast(cpu, total, TT_F32, t, dt, ref) == 0, "reference cast: %s", cpu->last_error(cpu));
    for (int i = 0; i < NS && !tt_test_current_failed; i++)
      for (size_t e = 0; e < cnt[i]; e++) {
        size_t at = off[i] + e;
        if (got[at] != want[at] || cref[at] != ref[at] || got[at] != ref[at]) {
          TT_CHECK(0, "%s tensor %d (%s) element %zu: cast_multi 0x%04x, transpose then cast 0x%04x; reference 0x%04x, 0x%04x",
                   tt_dtype_name(dt), i, shape[i][0] ? "KRSC" : "plain", e, got[at], want[at], cref[at], ref[at]);
          break;
        }
      }
  }
  /* a segment that is not whole filters is refused, naming the tensor */
  tt_cast_seg bad;
  memset(&bad, 0, sizeof bad);
  bad.src = src, bad.dst = d1, bad.count = 10, bad.k = 3, bad.rs = 3;
  TT_CHECK(gpu->cast_multi(gpu, &bad, 1, TT_F32, TT_F16) != 0 && strstr(gpu->last_error(gpu), "tensor 0 of 1"),
           "a KRSC segment of 10 elements as k=3, r*s=3 was not refused by name: %s", gpu->last_error(gpu));
  free(h), free(t), free(got), free(want), free(ref), free(cref), free(cs);
  TT_TEST_END();
}

static size_t test_krsc_round(size_t v) { return (v + 255u) & ~(size_t)255u; }

/* One shape, fp16, all-NHWC on backend g (either API): forward and backward-data (beta 0 and 1)
 * with the KCRS filter and the per-call copy, then with the KRSC copy stored: the same bits, each
 * KRSC call in a workspace exactly its (smaller) query and launching no transpose. */
static void test_conv_krsc_shape(tt_backend *g, const char *api, const int *c) {
  tt_conv_desc dn, dk;
  memset(&dn, 0, sizeof dn);
  dn.n = c[0], dn.c = c[1], dn.h = c[2], dn.w = c[3], dn.k = c[4], dn.r = c[5], dn.s = c[6], dn.stride_h = dn.stride_w = c[7];
  dn.pad_h = dn.pad_w = c[8], dn.groups = c[9];
  dn.p = (dn.h + 2 * dn.pad_h - dn.r) / dn.stride_h + 1, dn.q = (dn.w + 2 * dn.pad_w - dn.s) / dn.stride_w + 1;
  dn.layout_x = dn.layout_y = TT_LAYOUT_NHWC;
  dk = dn, dk.layout_w = TT_FILTER_KRSC;
  const tt_dtype dt = TT_F16;
  int cg = dn.c / dn.groups, rs = dn.r * dn.s;
  size_t wn = (size_t)dn.k * cg * rs, xn = (size_t)dn.n * dn.c * dn.h * dn.w, yn = (size_t)dn.n * dn.k * dn.p * dn.q;
  size_t wsn[2], wsk[2];
  for (int wk = 0; wk < 3; wk++) {
    size_t a = g->conv_workspace(g, &dn, dt, (tt_ws_kind)wk), b = g->conv_workspace(g, &dk, dt, (tt_ws_kind)wk);
    TT_CHECK(a != TT_WS_ERROR && b != TT_WS_ERROR, "%s: conv_workspace: %s", api, g->last_error(g));
    if (a == TT_WS_ERROR || b == TT_WS_ERROR) return;
    /* forward and backward-data: no filter copy in front; backward-filter: the same (dw as written) */
    size_t less = wk == TT_WS_BWD_FILTER ? 0 : test_krsc_round(wn * 2);
    TT_CHECK(a - b == less && a >= b, "%s %dx%d c%d k%d direction %d: workspace KCRS %zu, KRSC %zu (want %zu less)", api, dn.r,
             dn.s, dn.c, dn.k, wk, a, b, less);
    if (wk < 2) wsn[wk] = a, wsk[wk] = b;
  }
  /* host values: fp16 x, dy, the filter KCRS and its KRSC transpose; dx's start for beta 1 */
  uint16_t *hx = (uint16_t *)malloc(xn * 2), *hdy = (uint16_t *)malloc(yn * 2), *hw = (uint16_t *)malloc(wn * 2);
  uint16_t *hwk = (uint16_t *)malloc(wn * 2), *hdx = (uint16_t *)malloc(xn * 2);
  uint16_t *o1 = (uint16_t *)malloc((xn > yn ? xn : yn) * 2), *o2 = (uint16_t *)malloc((xn > yn ? xn : yn) * 2);
  for (size_t i = 0; i < xn; i++) hx[i] = tt_f32_to_f16(test_rand(-1, 1)), hdx[i] = tt_f32_to_f16(test_rand(-1, 1));
  for (size_t i = 0; i < yn; i++) hdy[i] = tt_f32_to_f16(test_rand(-1, 1));
  for (size_t i = 0; i < wn; i++) hw[i] = tt_f32_to_f16(test_rand(-0.5f, 0.5f));
  for (int i = 0; i < dn.k; i++)
    for (int l = 0; l < cg; l++)
      for (int j = 0; j < rs; j++) hwk[((size_t)i * rs + j) * cg + l] = hw[((size_t)i * cg + l) * rs + j];
  goff = 0;
  void *x = test_galloc(xn * 2), *dy = test_galloc(yn * 2), *w = test_galloc(wn * 2), *wk = test_galloc(wn * 2);
  void *y1 = test_galloc(yn * 2), *y2 = test_galloc(yn * 2), *dx1 = test_galloc(xn * 2), *dx2 = test_galloc(xn * 2);
  size_t wsmax = wsn[0] > wsn[1] ? wsn[0] : wsn[1];
  void *ws = test_galloc(wsmax + 256);
  TT_CHECK(g->upload(g, x, hx, xn * 2) == 0 && g->upload(g, dy, hdy, yn * 2) == 0 && g->upload(g, w, hw, wn * 2) == 0 &&
               g->upload(g, wk, hwk, wn * 2) == 0,
           "upload: %s", g->last_error(g));
  TT_CHECK(g->conv_fwd(g, &dn, dt, x, w, NULL, y1, ws, wsn[0]) == 0, "%s conv_fwd (KCRS): %s", api, g->last_error(g));
  size_t t0 = tt_emu_kernel_launches("cuda_ew_transpose_k");
  TT_CHECK(g->conv_fwd(g, &dk, dt, x, wk, NULL, y2, ws, wsk[0]) == 0, "%s conv_fwd (KRSC): %s", api, g->last_error(g));
  TT_CHECK(tt_emu_kernel_launches("cuda_ew_transpose_k") == t0, "%s conv_fwd with a KRSC filter launched a transpose", api);
  TT_CHECK(g->download(g, o1, y1, yn * 2) == 0 && g->download(g, o2, y2, yn * 2) == 0, "download: %s", g->last_error(g));
  TT_CHECK(!memcmp(o1, o2, yn * 2), "%s %dx%d: forward with the stored KRSC filter differs from the per-call copy", api, dn.r,
           dn.s);
  for (int beta = 0; beta < 2 && !tt_test_current_failed; beta++) {
    TT_CHECK(g->upload(g, dx1, hdx, xn * 2) == 0 && g->upload(g, dx2, hdx, xn * 2) == 0, "upload: %s", g->last_error(g));
    TT_CHECK(g->conv_bwd_data(g, &dn, dt, dy, w, dx1, (float)beta, ws, wsn[1]) == 0, "%s conv_bwd_data (KCRS): %s", api,
             g->last_error(g));
    t0 = tt_emu_kernel_launches("cuda_ew_transpose_k");
    TT_CHECK(g->conv_bwd_data(g, &dk, dt, dy, wk, dx2, (float)beta, ws, wsk[1]) == 0, "%s conv_bwd_data (KRSC): %s", api,
             g->last_error(g));
    TT_CHECK(tt_emu_kernel_launches("cuda_ew_transpose_k") == t0, "%s conv_bwd_data with a KRSC filter launched a transpose", api);
    TT_CHECK(g->download(g, o1, dx1, xn * 2) == 0 && g->download(g, o2, dx2, xn * 2) == 0, "download: %s", g->last_error(g));
    TT_CHECK(!memcmp(o1, o2, xn * 2), "%s %dx%d beta %d: backward-data with the stored KRSC filter differs from the per-call copy",
             api, dn.r, dn.s, beta);
  }
  /* a KRSC filter where x or y is NCHW is refused, naming the op */
  tt_conv_desc bad = dk;
  bad.layout_y = TT_LAYOUT_NCHW;
  TT_CHECK(g->conv_fwd(g, &bad, dt, x, wk, NULL, y2, ws, wsmax) != 0 && strstr(g->last_error(g), "conv_fwd") &&
               strstr(g->last_error(g), "KRSC"),
           "%s: a KRSC filter with y NCHW was not refused: %s", api, g->last_error(g));
  free(hx), free(hdy), free(hw), free(hwk), free(hdx), free(o1), free(o2);
}

/* The stored KRSC filter against the per-call copy, on the legacy API and on the graph API:
 * 3x3, 3x3 stride 2 with groups, 1x1, 7x7 stride 2 (a stem's shape), 5x5. */
void test_conv_krsc(void) {
  TT_TEST_BEGIN("cuda_conv_krsc_filter");
  static const int cfg[5][10] = {{2, 8, 9, 9, 16, 3, 3, 1, 1, 1}, {2, 8, 9, 9, 16, 3, 3, 2, 1, 2}, {3, 16, 5, 5, 8, 1, 1, 1, 0, 1},
                                 {2, 8, 15, 15, 8, 7, 7, 2, 3, 1}, {1, 8, 7, 7, 8, 5, 5, 1, 2, 1}};
  const int apis[2] = {TT_CUDA_CONV_API_LEGACY, TT_CUDA_CONV_API_GRAPH};
  cuda_rng = 0x3c6ef372fe94f82bull;
  for (int a = 0; a < 2 && !tt_test_current_failed; a++) {
    tt_backend *g = test_krsc_backend(apis[a]);
    if (!g) break;
    TT_CHECK(g->filter_krsc == 1, "the CUDA backend does not list filter_krsc");
    size_t e0 = tt_emu_graph_executes();
    for (int k = 0; k < 5 && !tt_test_current_failed; k++) test_conv_krsc_shape(g, a ? "graph API" : "legacy API", cfg[k]);
    size_t ran = tt_emu_graph_executes() - e0;
    TT_CHECK(a ? ran > 0 : ran == 0, "%s: %zu graph-API executions", a ? "graph" : "legacy", ran);
    g->destroy(g);
  }
  TT_TEST_END();
}

/* Bit for bit: the small CNN's fp16 NHWC training steps planned with the KRSC casts and without
 * (TINYTRAIN_KRSC_CAST=0), on the legacy API and on the graph API: the same loss, gradients and
 * weights after SGD; the KRSC plan has KRSC copies, its micro-step launches fewer transposes by
 * its forward and backward-data calls that read one, and its workspaces hold no filter copies
 * (the largest convolution workspace no larger, the sum smaller). */
void test_step_krsc(void) {
  const char *recipe = "tests/fixtures/small_cnn.recipe";
  tt_err err;
  TT_TEST_BEGIN("cuda_step_krsc_nhwc");
  for (int api = 0; api < 2 && !tt_test_current_failed; api++) {
    test_net a, b;
    int rc[2];
    cuda_rng = 0xbb67ae8584caa73bull;
    tt_backend *ga = test_krsc_backend(api ? TT_CUDA_CONV_API_GRAPH : TT_CUDA_CONV_API_LEGACY);
    tt_backend *gb = test_krsc_backend(api ? TT_CUDA_CONV_API_GRAPH : TT_CUDA_CONV_API_LEGACY);
    if (!ga || !gb) {
      if (ga) ga->destroy(ga);
      if (gb) gb->destroy(gb);
      break;
    }
    ga->layouts_16bit = gb->layouts_16bit = 1u << TT_LAYOUT_NHWC; /* read when lowering, as TINYTRAIN_LAYOUT=nhwc */
    setenv("TINYTRAIN_KRSC_CAST", "0", 1);
    TT_CHECK(tt_knobs_init(&err) == 0, "TINYTRAIN_KRSC_CAST=0: %s", err.msg);
    rc[0] = test_net_open(&a, recipe, ga, TT_F16, 6, 1, 0, TT_OPT_SGD, &err);
    TT_CHECK(rc[0] == 0, "KCRS copies: %s", err.msg);
    unsetenv("TINYTRAIN_KRSC_CAST");
    tt_knobs_init(&err);
    rc[1] = test_net_open(&b, recipe, gb, TT_F16, 6, 1, 0, TT_OPT_SGD, &err);
    TT_CHECK(rc[1] == 0, "KRSC copies: %s", err.msg);
    if (!rc[0] && !rc[1]) {
      int reads = 0;
      size_t wsa = 0, wsb = 0;
      for (int i = 0; i < b.p.ncalls; i++) {
        const tt_call *c = &b.p.calls[i];
        reads += c->skip == TT_CALL_RUNS && (c->fn == TT_OP_CONV_FWD || c->fn == TT_OP_CONV_BWD_DATA) &&
                 c->op.u.conv.layout_w == TT_FILTER_KRSC;
      }
      for (int i = 0; i < a.p.nbufs; i++) wsa += a.p.bufs[i].cls == TT_BC_WORKSPACE ? a.p.bufs[i].bytes : 0;
      for (int i = 0; i < b.p.nbufs; i++) wsb += b.p.bufs[i].cls == TT_BC_WORKSPACE ? b.p.bufs[i].bytes : 0;
      TT_CHECK(a.p.n_krsc == 0 && b.p.n_krsc > 0 && reads >= 2 * b.p.n_krsc - 1,
               "KRSC copies: %d without, %d with (%d calls read them)", a.p.n_krsc, b.p.n_krsc, reads);
      TT_CHECK(wsb < wsa, "workspaces: %zu bytes with KRSC copies, %zu without", wsb, wsa);
      const tt_node *in = &a.g.nodes[0];
      size_t cnt = (size_t)6 * in->c * in->h * in->w;
      float *input = (float *)malloc(cnt * sizeof(float)), sa[2], sb[2];
      int32_t labels[6] = {0, 4, 2, 1, 3, 2};
      tt_opt_hparams hp;
      memset(&hp, 0, sizeof hp);
      hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f, hp.weight_decay = 5e-4f;
      for (size_t i = 0; i < cnt; i++) input[i] = test_rand(-1, 1);
      for (int step = 0; step < 2 && !tt_test_current_failed; step++) {
        int ov[2];
        test_net *nets[2] = {&a, &b};
        float *stats[2] = {sa, sb};
        size_t tr[2];
        for (int k = 0; k < 2; k++) {
          size_t t0 = tt_emu_kernel_launches("cuda_ew_transpose_k");
          tt_exec_stats(&nets[k]->x, NULL, 1, &err);
          TT_CHECK(tt_exec_micro_step_f32(&nets[k]->x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "step (%s): %s",
                   k ? "KRSC" : "KCRS", err.msg);
          tt_exec_stats(&nets[k]->x, stats[k], 1, &err);
          tr[k] = tt_emu_kernel_launches("cuda_ew_transpose_k") - t0;
        }
        printf("  fp16 NHWC %s API step %d: loss KCRS copies %.7f, KRSC %.7f; transposes %zu, %zu\n", api ? "graph" : "legacy",
               step, sa[0] / 6, sb[0] / 6, tr[0], tr[1]);
        TT_CHECK(sa[0] == sb[0], "loss: KCRS copies %.9g, KRSC %.9g", sa[0], sb[0]);
        TT_CHECK(tr[0] == tr[1] + (size_t)reads, "transposes: %zu with KCRS copies, %zu with KRSC (want %d fewer)", tr[0], tr[1],
                 reads);
        test_cmp_params(&a, &b, 1, 0.0, 0.0, NULL, "KRSC copies against KCRS: gradient");
        for (int k = 0; k < 2; k++)
          TT_CHECK(tt_exec_update(&nets[k]->x, &hp, step + 1, 1.0f, &ov[k], &err) == 0, "update (%d): %s", k, err.msg);
        test_cmp_params(&a, &b, 0, 0.0, 0.0, NULL, "KRSC copies against KCRS: after SGD");
      }
      free(input);
    }
    test_net_close(&a);
    test_net_close(&b);
    ga->destroy(ga);
    gb->destroy(gb);
  }
  TT_TEST_END();
}

#endif
