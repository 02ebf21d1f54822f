/* tests/kernels/cuda_conv_graph.c — test_cuda's convolutions through cuDNN's graph (backend) API
 * (kernels/cuda/cuda_conv_graph.cu, TINYTRAIN_CUDA_CONV_API): against the reference through both
 * APIs, the setup's choice among the heuristics' candidates, the legacy fallback per shape, misuse
 * refused with the op's name, and a training step equal to the legacy path's.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#include <math.h>

#ifdef TT_HAVE_CUDA

/* A CUDA backend whose convolutions take API api (a tt_cuda_conv_api); NULL with a check failed. */
static tt_backend *test_api_backend_log(int api, int find, int log) {
  tt_backend_knobs k;
  size_t reserve = 0;
  char msg[512];
  tt_backend *b;
  tt_backend_knobs_default(&k);
  k.cuda_conv_api = api, k.cuda_find = find, k.cuda_conv_log = log;
  b = tt_cuda_backend_create(&reserve, &k, msg, sizeof msg);
  TT_CHECK(b != NULL, "a CUDA backend with TINYTRAIN_CUDA_CONV_API %d: %s", api, msg);
  return b;
}
static tt_backend *test_api_backend(int api, int find) { return test_api_backend_log(api, find, 0); }

static void test_conv_desc_set(tt_conv_desc *d, const int *c) {
  memset(d, 0, sizeof *d);
  d->n = c[0], d->c = c[1], d->h = c[2], d->w = c[3], d->k = c[4], d->r = c[5], d->s = c[6], d->stride_h = c[7];
  d->stride_w = c[8], d->pad_h = c[9], d->pad_w = c[10], d->groups = c[11];
  d->p = (d->h + 2 * d->pad_h - d->r) / d->stride_h + 1, d->q = (d->w + 2 * d->pad_w - d->s) / d->stride_w + 1;
}

/* All-NHWC convolutions on `gpu` (set by the caller to a backend of one API) against the reference's
 * NCHW: forward with bias, backward-data into dx (beta 1) and overwriting it (beta 0), backward-
 * filter into dw and db (beta 1). want_graph: every call must run on the graph API (checked by the
 * backend's answer, and under the emulation by cudnnBackendExecute's count), or none. */
static void test_graph_api_dt(tt_dtype dt, int want_graph) {
  /* n c h w k r s sh sw ph pw groups: 3x3, 3x3 stride 2 with groups, 1x1, 7x7 stride 2 (a stem),
   * 1x3 (asymmetric) */
  static const int cfg[5][12] = {{2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1}, {2, 8, 9, 9, 16, 3, 3, 2, 2, 1, 1, 2},
                                 {3, 16, 5, 5, 8, 1, 1, 1, 1, 0, 0, 1}, {2, 4, 15, 15, 8, 7, 7, 2, 2, 3, 3, 1},
                                 {2, 6, 8, 8, 6, 1, 3, 1, 1, 0, 1, 1}};
  for (int k = 0; k < 5 && !tt_test_current_failed; k++) {
    tt_conv_desc d, dn;
    goff = 0;
    test_conv_desc_set(&d, cfg[k]);
    dn = d, dn.layout_x = dn.layout_y = TT_LAYOUT_NHWC;
    int hw = d.h * d.w, pq = d.p * d.q;
    size_t wn = (size_t)d.k * (d.c / d.groups) * d.r * d.s, wsz[2] = {0, 0};
    for (int wk = 0; wk < 3; wk++) {
      size_t a = cpu->conv_workspace(cpu, &d, test_cdt(dt), (tt_ws_kind)wk), bq = gpu->conv_workspace(gpu, &dn, dt, (tt_ws_kind)wk);
      TT_CHECK(a != TT_WS_ERROR && bq != TT_WS_ERROR, "conv_workspace %s: cpu %s / cuda %s", test_dt_name(dt),
               a == TT_WS_ERROR ? cpu->last_error(cpu) : "ok", bq == TT_WS_ERROR ? gpu->last_error(gpu) : "ok");
      if (a == TT_WS_ERROR || bq == TT_WS_ERROR) return;
      wsz[0] = a > wsz[0] ? a : wsz[0];
      wsz[1] = bq > wsz[1] ? bq : wsz[1];
#ifdef TT_CUDA_EMULATION /* tt_cuda_conv_api_used: linked backends only (not in the dlopen table) */
      tt_op_desc od;
      memset(&od, 0, sizeof od);
      od.kind = (tt_op_kind)(TT_OP_CONV_FWD + wk), od.dt = dt, od.u.conv = dn, od.accumulate = wk == 1;
      int api = tt_cuda_conv_api_used(gpu, &od, NULL, NULL);
      TT_CHECK(api == want_graph, "%s config %d direction %d: served by the %s API (want the %s)", test_dt_name(dt), k, wk,
               api == 1 ? "graph" : api == 0 ? "legacy" : "no", want_graph ? "graph" : "legacy");
#endif
    }
    tt2 x = mk((size_t)d.n * d.c * hw, dt, -1, 1), w = mk(wn, dt, -0.5f, 0.5f), bias = mk(d.k, dt, -1, 1);
    tt2 y = mk((size_t)d.n * d.k * pq, dt, 0, 0), dy = mk((size_t)d.n * d.k * pq, dt, -1, 1);
    tt2 dx = mk((size_t)d.n * d.c * hw, dt, -1, 1), dw = mk(wn, TT_F32, -1, 1), db = mk(d.k, TT_F32, -1, 1);
    test_push_nhwc(&x, d.n, d.c, hw), test_push_nhwc(&dx, d.n, d.c, hw), test_push_nhwc(&dy, d.n, d.k, pq);
    tt2 ws;
    ws.c = malloc(wsz[0] + 1), ws.g = test_galloc(wsz[1] + 1);
#ifdef TT_CUDA_EMULATION
    size_t ex0 = tt_emu_graph_executes();
#endif
#define WS (side ? ws.g : ws.c), (side ? wsz[1] : wsz[0])
    BOTH(B->conv_fwd(B, side ? &dn : &d, SD(dt), P(x), P(w), P(bias), P(y), WS));
    cmp_nhwc("graph_api conv_fwd (bias)", y, d.n, d.k, pq, tol_mm(dt));
    BOTH(B->conv_bwd_data(B, side ? &dn : &d, SD(dt), P(dy), P(w), P(dx), 1.0f, WS));
    cmp_nhwc("graph_api conv_bwd_data beta=1", dx, d.n, d.c, hw, tol_mm(dt));
    BOTH(B->conv_bwd_data(B, side ? &dn : &d, SD(dt), P(dy), P(w), P(dx), 0.0f, WS));
    cmp_nhwc("graph_api conv_bwd_data beta=0", dx, d.n, d.c, hw, tol_mm(dt));
    BOTH(B->conv_bwd_filter(B, side ? &dn : &d, SD(dt), P(x), P(dy), PF(dw), PF(db), 1.0f, WS));
    cmp("graph_api conv_bwd_filter dw beta=1", dw, tol_mm(dt));
    cmp("graph_api conv_bwd_filter db beta=1", db, tol_mm(dt));
#undef WS
#ifdef TT_CUDA_EMULATION
    TT_CHECK(tt_emu_graph_executes() - ex0 == (want_graph ? 4u : 0u),
             "%s config %d: %zu cudnnBackendExecute calls for 4 convolutions (want %d)", test_dt_name(dt), k,
             tt_emu_graph_executes() - ex0, want_graph ? 4 : 0);
#endif
    free(ws.c);
    fr(&x), fr(&w), fr(&bias), fr(&y), fr(&dy), fr(&dx), fr(&dw), fr(&db);
    if (tt_test_current_failed) printf("  (graph_api conv config %d, %s, %s API)\n", k, test_dt_name(dt), want_graph ? "graph" : "legacy");
  }
}

/* test_cuda's NHWC convolution comparisons through both APIs: legacy, then graph (=graph: a shape
 * the graph API did not serve would fail), fp32, fp16 and bf16 (bf16 on an emulated sm_80; on a
 * GPU from compute capability 8.0). */
void test_conv_graph_api(void) {
  tt_backend *g0 = gpu;
  int old_cc = 0;
  TT_TEST_BEGIN("cuda_conv_graph_api_vs_ref");
#ifdef TT_CUDA_EMULATION
  old_cc = tt_emu_set_compute_capability(80);
#endif
  for (int api = 0; api < 2 && !tt_test_current_failed; api++) {
    tt_backend *b = test_api_backend(api ? TT_CUDA_CONV_API_GRAPH : TT_CUDA_CONV_API_LEGACY, 1);
    if (!b) break;
    gpu = b;
    for (int di = 0; di < 3 && !tt_test_current_failed; di++) {
      if (test_dts[di] == TT_BF16 && tt_cuda_compute_capability(b) < 80) continue;
      test_graph_api_dt(test_dts[di], api);
    }
    gpu = g0;
    b->destroy(b);
  }
#ifdef TT_CUDA_EMULATION
  tt_emu_set_compute_capability(old_cc);
#endif
  (void)old_cc;
  TT_TEST_END();
}

#ifdef TT_CUDA_EMULATION
/* A 3x3 forward call's desc (all-NHWC, fp32). */
static tt_op_desc test_graph_op(void) {
  static const int c[12] = {2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1};
  tt_op_desc od;
  memset(&od, 0, sizeof od);
  od.kind = TT_OP_CONV_FWD, od.dt = TT_F32;
  test_conv_desc_set(&od.u.conv, c);
  od.u.conv.layout_x = od.u.conv.layout_y = TT_LAYOUT_NHWC;
  return od;
}

/* The setup's choice (the emulated engines' fake times decide it; tt_emu_graph_engine_ms): for a
 * 3x3 fp32 forward the emulated heuristic mode A ranks engines 4 (FFT: over the workspace cap),
 * 1, 0, 2, 7, 6, 5; the candidates are the first four within the cap (1, 0, 2, 7), the heuristic's
 * first (1) runs until tune times them and the fastest (7, WINOGRAD_NONFUSED) runs from then on,
 * with the plan's workspace room for every candidate. Mode A withheld: FALLBACK's first (0, no
 * workspace). Both withheld: auto runs the shape on the legacy API, graph refuses it naming the
 * shape and the knob. */
void test_conv_graph_api_choice(void) {
  TT_TEST_BEGIN("cuda_conv_graph_api_choice");
  tt_op_desc od = test_graph_op();
  long long eng = -1;
  size_t ws = 0, ws_before = 0;
  tt_backend *b = test_api_backend_log(TT_CUDA_CONV_API_AUTO, 1, 1);
  char text[4096] = "";
  if (b) {
    TT_CHECK(tt_cuda_conv_api_used(b, &od, &eng, &ws_before) == 1 && eng == 1,
             "before tune: engine %lld (want the heuristic's first, 1): %s", eng, b->last_error(b));
    TT_CHECK(b->prepare(b, &od, 1) == 0, "prepare: %s", b->last_error(b));
    size_t scratch = (size_t)16 << 20;
    void *s = b->arena_alloc(b, scratch);
    TT_CHECK(s != NULL, "scratch");
    FILE *f = tmpfile(); /* TINYTRAIN_CUDA_CONV_LOG's line, on stderr, read back */
    int saved = dup(2);
    fflush(stderr);
    if (f) dup2(fileno(f), 2);
    TT_CHECK(s && b->tune(b, &od, 1, s, scratch) == 0, "tune: %s", b->last_error(b));
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    if (f) rewind(f), text[fread(text, 1, sizeof text - 1, f)] = 0, fclose(f);
    TT_CHECK(strstr(text, "graph API (cudnnBackend*), engine 7 (heuristic mode A, 4 candidates)") &&
                 strstr(text, "the fastest of the candidates timed"),
             "TINYTRAIN_CUDA_CONV_LOG after tune: '%s' (want the graph API, engine 7, mode A, 4 candidates, timed)", text);
    TT_CHECK(tt_cuda_conv_api_used(b, &od, &eng, &ws) == 1, "after tune: %s", b->last_error(b));
    double best = tt_emu_graph_engine_ms(0, 1);
    long long want = 1;
    for (int e = 0; e < 8; e++) /* the fastest of the candidates 1, 0, 2, 7 */
      if ((e == 0 || e == 2 || e == 7) && tt_emu_graph_engine_ms(0, e) < best) best = tt_emu_graph_engine_ms(0, e), want = e;
    TT_CHECK(eng == want && want == 7, "after tune: engine %lld runs (want the fastest candidate, %lld)", eng, want);
    TT_CHECK(ws == ws_before, "the planned workspace changed from %zu to %zu bytes after tune", ws_before, ws);
    if (s) b->arena_free(b, s);
    b->destroy(b);
  }
  unsigned old = tt_emu_graph_offer(~(1u << 3)); /* CUDNN_HEUR_MODE_A withheld */
  b = test_api_backend(TT_CUDA_CONV_API_AUTO, 1);
  if (b) {
    TT_CHECK(tt_cuda_conv_api_used(b, &od, &eng, &ws) == 1 && eng == 0, "mode A withheld: engine %lld (want FALLBACK's 0): %s",
             eng, b->last_error(b));
    b->destroy(b);
  }
  tt_emu_graph_offer(0u); /* nothing offered */
  b = test_api_backend(TT_CUDA_CONV_API_AUTO, 1);
  if (b) {
    TT_CHECK(tt_cuda_conv_api_used(b, &od, &eng, &ws) == 0, "auto, no engine: the shape should run on the legacy API");
    b->destroy(b);
  }
  b = test_api_backend(TT_CUDA_CONV_API_GRAPH, 1);
  if (b) {
    size_t q = b->conv_workspace(b, &od.u.conv, TT_F32, TT_WS_FWD);
    TT_CHECK(q == TT_WS_ERROR && strstr(b->last_error(b), "TINYTRAIN_CUDA_CONV_API") && strstr(b->last_error(b), "n=2 c=8 9x9"),
             "graph, no engine: workspace %zu, message '%s' (want a refusal naming the shape and the knob)", q, b->last_error(b));
    b->destroy(b);
  }
  tt_emu_graph_offer(old);
  TT_TEST_END();
}

/* Misuse refused with the op's name: a call whose workspace is smaller than its plan needs (the
 * pointer's allocation is too small, whatever ws_bytes claims) fails in cudnnBackendExecute, and the
 * backend's message names conv_fwd, the graph API and the workspace. (The emulator's own refusals,
 * an unfinalized plan executed among them, are tested by test_cuda_emu_self's cuda_emu_graph_api.) */
void test_conv_graph_api_misuse(void) {
  TT_TEST_BEGIN("cuda_conv_graph_api_misuse");
  tt_op_desc od = test_graph_op();
  const tt_conv_desc *d = &od.u.conv;
  tt_backend *b = test_api_backend(TT_CUDA_CONV_API_GRAPH, 0);
  if (b) {
    size_t need = b->conv_workspace(b, d, TT_F32, TT_WS_FWD);
    size_t xb = (size_t)d->n * d->c * d->h * d->w * 4, wb = (size_t)d->k * d->c * d->r * d->s * 4;
    size_t yb = (size_t)d->n * d->k * d->p * d->q * 4;
    void *x = b->arena_alloc(b, xb), *w = b->arena_alloc(b, wb), *y = b->arena_alloc(b, yb);
    void *small = b->arena_alloc(b, wb + 256); /* the filter copy fits, cuDNN's part does not */
    TT_CHECK(need != TT_WS_ERROR && need > wb + 256 && x && w && y && small, "setup: workspace %zu: %s", need, b->last_error(b));
    if (x && w && y && small) {
      int old = tt_emu_set_quiet(1);
      b->zero(b, x, xb), b->zero(b, w, wb);
      int rc = b->conv_fwd(b, d, TT_F32, x, w, NULL, y, small, need);
      const char *m = b->last_error(b);
      TT_CHECK(rc != 0 && strstr(m, "conv_fwd") && strstr(m, "graph API") && strstr(m, "smaller than the plan's"),
               "a workspace smaller than the plan's: rc %d, '%s' (want a refusal naming conv_fwd, the graph API, the workspace)", rc, m);
      tt_emu_clear_sticky();
      tt_emu_set_quiet(old);
    }
    b->arena_free(b, small), b->arena_free(b, x), b->arena_free(b, w), b->arena_free(b, y);
    b->destroy(b);
  }
  TT_TEST_END();
}

/* The legacy Find's workspace bound (issue 41: "cudnnFind*Ex is given at most the workspace of the
 * heuristic's first pick"): Find is given the planned workspace, the largest any call of the plan
 * asked for. A 3x3 fp32 NCHW forward whose heuristic choice (PRECOMP_GEMM) needs 1312 bytes, planned
 * beside a backward-filter whose choice needs about 2.4 MB: the emulated Find times its algorithms in
 * the reverse of its ranking, so within 1312 bytes it would pick WINOGRAD (6), within the planned
 * workspace FFT_TILING (5, about 1.8 MB), which then runs in the planned buffer. */
void test_conv_find_planned_ws(void) {
  static const int ca[12] = {2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1}, cb[12] = {2, 16, 64, 64, 16, 3, 3, 1, 1, 1, 1, 1};
  tt_op_desc ops[2];
  TT_TEST_BEGIN("cuda_conv_find_planned_workspace");
  memset(ops, 0, sizeof ops);
  ops[0].kind = TT_OP_CONV_FWD, ops[0].dt = TT_F32, ops[1].kind = TT_OP_CONV_BWD_FILTER, ops[1].dt = TT_F32;
  test_conv_desc_set(&ops[0].u.conv, ca), test_conv_desc_set(&ops[1].u.conv, cb);
  tt_backend *b = test_api_backend(TT_CUDA_CONV_API_LEGACY, 1);
  if (b) {
    const tt_conv_desc *d = &ops[0].u.conv;
    size_t own = b->op_workspace(b, &ops[0]), other = b->op_workspace(b, &ops[1]), scratch = (size_t)16 << 20;
    size_t planned = own > other ? own : other;
    size_t xb = (size_t)d->n * d->c * d->h * d->w * 4, wb = (size_t)d->k * d->c * d->r * d->s * 4;
    size_t yb = (size_t)d->n * d->k * d->p * d->q * 4;
    void *s = b->arena_alloc(b, scratch), *x = b->arena_alloc(b, xb), *w = b->arena_alloc(b, wb), *y = b->arena_alloc(b, yb);
    void *ws = b->arena_alloc(b, planned);
    TT_CHECK(own != TT_WS_ERROR && other != TT_WS_ERROR && own < 4096 && other > ((size_t)2 << 20) && s && x && w && y && ws,
             "setup: workspaces %zu and %zu: %s", own, other, b->last_error(b));
    if (s && x && w && y && ws) {
      TT_CHECK(b->prepare(b, ops, 2) == 0 && b->tune(b, ops, 2, s, scratch) == 0, "prepare and tune: %s", b->last_error(b));
      b->zero(b, x, xb), b->zero(b, w, wb);
      tt_emu_conv_algos_used(0, 1);
      TT_CHECK(b->conv_fwd(b, d, TT_F32, x, w, NULL, y, ws, planned) == 0, "conv_fwd in the planned workspace: %s", b->last_error(b));
      unsigned used = tt_emu_conv_algos_used(0, 1);
      size_t after = b->op_workspace(b, &ops[0]);
      TT_CHECK(used == 1u << 5, "the forward ran algorithms %x (want FFT_TILING, bit 5: Find within the planned %zu bytes)", used, planned);
      TT_CHECK(after > own && after <= planned, "the forward's workspace after Find: %zu (heuristic %zu, planned %zu)", after, own, planned);
    }
    b->arena_free(b, s), b->arena_free(b, x), b->arena_free(b, w), b->arena_free(b, y), b->arena_free(b, ws);
    b->destroy(b);
  }
  TT_TEST_END();
}

/* A training step of the small CNN in fp16 NHWC (every convolution but the first all-NHWC) through
 * the graph API equals the legacy path's: under the emulation every engine computes as the legacy
 * algorithms do (in double, rounded once), so the stated tolerance is the rounding of fp32
 * summation order only, 1e-6 of each tensor's largest element (on a GPU the engines differ: fp16's
 * step tolerance, 3e-2 as in cuda_step_bf16_nhwc, would apply; the test counts the emulation's
 * cudnnBackendExecute calls, so it runs under the emulation only). */
void test_step_graph_api(void) {
  const double tol = 1e-6;
  const char *recipe = "tests/fixtures/small_cnn.recipe";
  tt_err err;
  test_net a, b;
  int rc[2];
  TT_TEST_BEGIN("cuda_step_graph_api_nhwc");
  cuda_rng = 0x6a09e667f3bcc908ull;
  tt_backend *gl = test_api_backend(TT_CUDA_CONV_API_LEGACY, 1), *gg = test_api_backend(TT_CUDA_CONV_API_GRAPH, 1);
  if (!gl || !gg) {
    if (gl) gl->destroy(gl);
    if (gg) gg->destroy(gg);
    TT_TEST_END();
    return;
  }
  gl->layouts_16bit = gg->layouts_16bit = 1u << TT_LAYOUT_NHWC; /* read when lowering, as TINYTRAIN_LAYOUT=nhwc */
  size_t ex0 = tt_emu_graph_executes();
  rc[0] = test_net_open(&a, recipe, gl, TT_F16, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc[0] == 0, "legacy: %s", err.msg);
  size_t ex1 = tt_emu_graph_executes();
  rc[1] = test_net_open(&b, recipe, gg, TT_F16, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc[1] == 0, "graph: %s", err.msg);
  if (!rc[0] && !rc[1]) {
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
      for (int k = 0; k < 2; k++) {
        size_t e0 = tt_emu_graph_executes();
        tt_exec_stats(&nets[k]->x, NULL, 1, &err);
        TT_CHECK(tt_exec_micro_step_f32(&nets[k]->x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "step (%s): %s",
                 k ? "graph" : "legacy", err.msg);
        tt_exec_stats(&nets[k]->x, stats[k], 1, &err);
        size_t ran = tt_emu_graph_executes() - e0;
        TT_CHECK(k ? ran > 0 : ran == 0, "step %d, %s: %zu graph-API executions", step, k ? "graph" : "legacy", ran);
      }
      printf("  fp16 NHWC step %d: loss legacy %.7f, graph API %.7f\n", step, sa[0] / 6, sb[0] / 6);
      TT_CHECK(fabs(sa[0] - sb[0]) <= tol * fabs(sa[0]), "loss: legacy %.9g, graph %.9g", sa[0], sb[0]);
      test_cmp_params(&a, &b, 1, tol, 0.0, NULL, "graph API against legacy: gradient");
      for (int k = 0; k < 2; k++)
        TT_CHECK(tt_exec_update(&nets[k]->x, &hp, step + 1, 1.0f, &ov[k], &err) == 0, "update (%d): %s", k, err.msg);
      test_cmp_params(&a, &b, 0, tol, 0.0, NULL, "graph API against legacy: after SGD");
    }
    free(input);
  }
  TT_CHECK(ex1 == ex0, "the legacy program's setup ran %zu graph-API executions", ex1 - ex0);
  test_net_close(&a);
  test_net_close(&b);
  gl->destroy(gl);
  gg->destroy(gg);
  TT_TEST_END();
}
#endif

#endif
