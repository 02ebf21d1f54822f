/* tests/kernels/cuda_graph.c — test_cuda's micro-step replayed as a CUDA graph (core/runtime/exec_graph.c,
 * kernels/cuda/cuda_graph.cu; TINYTRAIN_CUDA_GRAPH): equal to the eager step bit for bit, dropout and
 * attention masks included, allocating nothing, and falling back to the eager step when the step holds
 * something a capture refuses. Registered and run by tests/kernels/test_cuda.c; helpers in
 * tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA
#include "core/runtime/exec_graph.h"
#include "kernels/kernel_math.h"

/* The seeded calls of test_cuda_graph_seeds: dropout forward and backward (seed sd) and attention
 * forward and backward (seed sa) of x, dy, qkv and dout into the outputs given. 0 or -1. */
static int test_seed_calls(tt_dtype dt, const tt_attn_desc *ad, uint64_t sd, uint64_t sa, const tt2 *x, const tt2 *dy,
                           const tt2 *qkv, const tt2 *dout, void *y, void *dx, void *o, float *lse, void *dqkv, void *ws,
                           size_t wsb) {
  if (gpu->dropout_fwd(gpu, x->count, dt, 0.25f, sd, x->g, y) || gpu->dropout_bwd(gpu, dy->count, dt, 0.25f, sd, dy->g, dx, 0.0f) ||
      gpu->attn_fwd(gpu, ad, dt, qkv->g, o, lse, NULL, sa, NULL, 0) ||
      gpu->attn_bwd(gpu, ad, dt, qkv->g, o, dout->g, lse, NULL, sa, dqkv, 0.0f, ws, wsb))
    return -1;
  return 0;
}

/* Dropout and attention recorded into a graph draw their masks from the base each replay is given
 * (backend.h graph_values, kernel_math.h tt_seed_at; the calls' seed argument while recording is
 * their number): every replay's outputs equal the eager calls' with seed tt_seed_at(base, number)
 * bit for bit, and a replay with another base draws other masks (fp32 and fp16: dropout forward and
 * backward, attention forward and backward with dropout on the probabilities). */
void test_cuda_graph_seeds(void) {
  TT_TEST_BEGIN("cuda_graph_seeds");
  for (int di = 0; di < 2; di++) {
    tt_dtype dt = test_dts[di];
    tt_attn_desc ad;
    memset(&ad, 0, sizeof ad);
    ad.n = 2, ad.t = 19, ad.heads = 2, ad.d = 16, ad.p = 0.25f, ad.scale = 0.25f;
    size_t n = 3001, nq = (size_t)ad.n * ad.t * 3 * ad.heads * ad.d, no = (size_t)ad.n * ad.t * ad.heads * ad.d;
    size_t nl = (size_t)ad.n * ad.heads * ad.t, es = tt_dtype_size(dt);
    const uint32_t kd = 7, ka = 40012; /* the calls' numbers (an executor's nodes) */
    goff = 0;
    tt2 x = mk(n, dt, -1, 1), dy = mk(n, dt, -1, 1), qkv = mk(nq, dt, -2, 2), dout = mk(no, dt, -1, 1);
    /* [0] the replay's outputs, [1] the eager calls'; their sizes in bytes */
    size_t bytes[4] = {n * es, n * es, no * es, nq * es};
    void *out[2][4], *ws = test_galloc(nl * sizeof(float));
    float *lse[2];
    unsigned char *h[2][4], *prev[4];
    for (int s2 = 0; s2 < 2; s2++) {
      lse[s2] = (float *)test_galloc(nl * sizeof(float));
      for (int k = 0; k < 4; k++) out[s2][k] = test_galloc(bytes[k]), h[s2][k] = (unsigned char *)malloc(bytes[k]);
    }
    for (int k = 0; k < 4; k++) prev[k] = (unsigned char *)calloc(1, bytes[k]);
    void *g = NULL;
    TT_CHECK(gpu->graph_begin(gpu) == 0, "graph_begin: %s", gpu->last_error(gpu));
    int rc = test_seed_calls(dt, &ad, kd, ka, &x, &dy, &qkv, &dout, out[0][0], out[0][1], out[0][2], lse[0], out[0][3], ws,
                             nl * sizeof(float));
    TT_CHECK(rc == 0, "recording the calls: %s", gpu->last_error(gpu));
    TT_CHECK(gpu->graph_end(gpu, &g) == 0 && g, "graph_end: %s", gpu->last_error(gpu));
    for (int r = 0; g && r < 3; r++) {
      static const char *names[4] = {"dropout_fwd y", "dropout_bwd dx", "attn_fwd o", "attn_bwd dqkv"};
      uint64_t base = 0x243F6A8885A308D3ull * (uint64_t)(r + 1);
      TT_CHECK(gpu->graph_values(gpu, 1.0f, base) == 0 && gpu->graph_launch(gpu, g) == 0, "replay %d: %s", r,
               gpu->last_error(gpu));
      TT_CHECK(test_seed_calls(dt, &ad, tt_seed_at(base, kd), tt_seed_at(base, ka), &x, &dy, &qkv, &dout, out[1][0], out[1][1],
                               out[1][2], lse[1], out[1][3], ws, nl * sizeof(float)) == 0,
               "the eager calls: %s", gpu->last_error(gpu));
      for (int k = 0; k < 4; k++) {
        for (int s2 = 0; s2 < 2; s2++) gpu->download(gpu, h[s2][k], out[s2][k], bytes[k]);
        TT_CHECK(memcmp(h[0][k], h[1][k], bytes[k]) == 0, "%s replay %d: %s differs from the eager call's", test_dt_name(dt), r,
                 names[k]);
        TT_CHECK(memcmp(h[0][k], prev[k], bytes[k]) != 0, "%s replay %d: %s equals the replay before's (the base did not "
                 "reach the mask)", test_dt_name(dt), r, names[k]);
        memcpy(prev[k], h[0][k], bytes[k]);
      }
    }
    if (g) gpu->graph_destroy(gpu, g);
    for (int k = 0; k < 4; k++) free(h[0][k]), free(h[1][k]), free(prev[k]);
    fr(&x), fr(&dy), fr(&qkv), fr(&dout);
  }
  TT_TEST_END();
}
#endif

#if defined(TT_HAVE_CUDA) && defined(TT_CUDA_EMULATION)

/* Every parameter's value, gradient and optimizer state (roles 0..3) of a and b, byte for byte
 * (where both executors hold the role). Returns the number of tensors that differ. */
static int test_graph_cmp(test_net *a, test_net *b, const char *when) {
  int bad = 0;
  tt_err e1, e2;
  for (int i = 0; i < a->g.nparams; i++) {
    size_t n = a->g.params[i].numel;
    float *ha = (float *)malloc(n * sizeof(float)), *hb = (float *)malloc(n * sizeof(float));
    for (int role = 0; role < 4; role++) {
      if (tt_exec_param_state(&a->x, i, role) != TT_STATE_F32) continue; /* held formats: not these recipes */
      int ra = tt_exec_param_get(&a->x, i, role, ha, &e1), rb = tt_exec_param_get(&b->x, i, role, hb, &e2);
      TT_CHECK(ra == rb, "%s: param %d role %d readable on one side only (%s / %s)", when, i, role, ra ? e1.msg : "",
               rb ? e2.msg : "");
      if (ra || rb) continue;
      if (memcmp(ha, hb, n * sizeof(float))) {
        size_t k = 0;
        while (k < n && !memcmp(ha + k, hb + k, sizeof(float))) k++;
        TT_CHECK(0, "%s: param %d ('%s') role %d differs at element %zu: eager %.9g, graph %.9g", when, i,
                 a->g.params[i].name, role, k, ha[k], hb[k]);
        bad++;
      }
    }
    free(ha);
    free(hb);
  }
  return bad;
}

/* test_net_open, with every saved value offloaded to pinned host memory (core/compile/offload.c)
 * when offload is 1 (one-step windows) or 2 (the widest: a card whose compute takes no time, so
 * every copy out is waited for just before the loss and every copy in marked just after it, as in
 * cuda_actoffload.c). The selection and the profile stay alive with the program. */
static int test_graph_open(test_net *t, const char *recipe, tt_backend *be, tt_dtype dt, int mb, int accum, int offload,
                           tt_err *err) {
  static unsigned char all[4096];
  static tt_device_profile instant;
  tt_policy pol;
  if (!offload) return test_net_open(t, recipe, be, dt, mb, accum, 0, TT_OPT_SGD, err);
  instant = *tt_profile_gpu("gtx1650");
  instant.flops_fp32 = instant.flops_fp16 = instant.bytes_per_s = 1e30, instant.op_overhead_s = 0.0;
  memset(all, 1, sizeof all);
  memset(t, 0, sizeof *t);
  if (tt_recipe_load(recipe, &t->m, err, NULL, NULL)) return -1;
  t->m.train.optimizer = TT_OPT_SGD;
  if (tt_graph_build(&t->m, &t->g, err)) return -1;
  if (t->g.nnodes > (int)sizeof all) return tt_fail(err, "%d nodes: more than the test's selection holds", t->g.nnodes);
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = mb, pol.accum_steps = accum, pol.act_dtype = dt, pol.inplace = 1, pol.training = 1;
  pol.offload_sel = all, pol.offload_profile = offload == 2 ? &instant : NULL;
  if (tt_lower(&t->g, &pol, be, &t->p, err) || tt_program_plan(&t->p, err)) return -1;
  t->have_p = 1;
  if (tt_exec_create(&t->x, &t->g, &t->p, NULL, be, 11, err)) return -1;
  t->have_x = 1;
  return tt_exec_init_params(&t->x, 11, err);
}

/* Runs nupd updates of accum micro-steps each on a (eager) and b (graph), with a different loss
 * scale every update (fp16's dynamic scaling, as the recorded loss must read it from device
 * memory), and compares them after every update. A backend whose table is `be` (the GPU's, or a
 * test's copy of it) runs b. Both plans offload their saved values as test_graph_open's offload says. */
static int test_graph_run(const char *recipe, tt_dtype dt, int mb, int accum, int nupd, tt_backend *be, int offload,
                          const char *what) {
  tt_err err;
  test_net a, b;
  int seeded = 0; /* the dropout and attention calls of b's micro-step */
  int rc = test_graph_open(&a, recipe, gpu, dt, mb, accum, offload, &err);
  TT_CHECK(rc == 0, "%s eager: %s", what, err.msg);
  int rc2 = test_graph_open(&b, recipe, be, dt, mb, accum, offload, &err);
  TT_CHECK(rc2 == 0, "%s graph: %s", what, err.msg);
  if (!rc && !rc2 && offload)
    TT_CHECK(b.p.n_act_offloaded > 2 && a.p.n_act_offloaded == b.p.n_act_offloaded, "%s: %d activations offloaded",
             what, b.p.n_act_offloaded);
  if (!rc && !rc2) {
    const tt_node *in = &a.g.nodes[0];
    size_t img = (size_t)mb * in->c * in->h * in->w;
    int nb = nupd * accum;
    uint8_t *images = (uint8_t *)malloc((size_t)nb * img);
    int32_t *labels = (int32_t *)malloc((size_t)nb * mb * sizeof(int32_t));
    size_t g0, nodes0, nodes1;
    tt_opt_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.05f, hp.momentum = 0.9f, hp.weight_decay = 1e-4f;
    for (size_t i = 0; i < (size_t)nb * img; i++) images[i] = (uint8_t)test_rand(0, 255.9f);
    for (int i = 0; i < nb * mb; i++) labels[i] = (i * 7 + i / mb) % a.m.classes;
    a.x.graph_on = 0, b.x.graph_on = 1;
    for (int k = 0; k < b.p.step_call[b.p.micro_end]; k++) {
      int fn = b.p.calls[k].fn;
      seeded += b.p.calls[k].skip == TT_CALL_RUNS && (fn == TT_CALL_DROPOUT_FWD || fn == TT_CALL_DROPOUT_BWD ||
                                                       fn == TT_OP_ATTN_FWD || fn == TT_OP_ATTN_BWD);
    }
    const char *why = tt_exec_graph_refusal(&b.x, &b.p, mb);
    TT_CHECK(why == NULL, "%s: the step is refused a graph: %s", what, why ? why : "");
    g0 = tt_emu_graph_launches(&nodes0);
    size_t allocs = tt_emu_allocations(), be_allocs = tt_cuda_alloc_count(gpu);
    for (int u = 0; u < nupd; u++) {
      float scale = dt == TT_F16 ? (float)(256 << (u % 3)) : 1.0f; /* a new loss scale each update */
      for (int k = 0; k < accum; k++) {
        int j = u * accum + k;
        for (int side2 = 0; side2 < 2; side2++) {
          test_net *t = side2 ? &b : &a;
          TT_CHECK(tt_exec_micro_step(&t->x, images + (size_t)j * img, labels + (size_t)j * mb, k, (uint64_t)u,
                                      scale / (float)(mb * accum), &err) == 0,
                   "%s %s micro-step %d: %s", what, side2 ? "graph" : "eager", j, err.msg);
        }
      }
      for (int side2 = 0; side2 < 2; side2++) {
        int ov = 0;
        test_net *t = side2 ? &b : &a;
        TT_CHECK(tt_exec_update(&t->x, &hp, u + 1, 1.0f / scale, &ov, &err) == 0, "%s update %d: %s", what, u, err.msg);
      }
      char when[96];
      snprintf(when, sizeof when, "%s after update %d", what, u);
      if (test_graph_cmp(&a, &b, when)) break;
    }
    size_t launches = tt_emu_graph_launches(&nodes1) - g0;
    printf("  %s: %d micro-steps (%d dropout and attention calls each); %zu graph launches replayed %zu recorded "
           "operations; graph state %d/%d%s%s\n", what, nb, seeded, launches, nodes1 - nodes0, b.x.graph_state[0],
           b.x.graph_state[1], b.x.graph_note[0] ? "; note: " : "", b.x.graph_note);
    TT_CHECK(tt_emu_allocations() == allocs && tt_cuda_alloc_count(gpu) == be_allocs,
             "%s: the steps allocated (%zu device/pinned allocations, %zu backend ones)", what, tt_emu_allocations() - allocs,
             tt_cuda_alloc_count(gpu) - be_allocs);
    if (be == gpu) {
      /* micro-steps of each kind: the first eager, then replays (2 parts each: split after the batch's last use) */
      int bounds[3], parts = tt_exec_graph_parts(&b.x, &b.p, bounds);
      TT_CHECK(parts == 2, "%s: the micro-step is recorded in %d part(s), want 2 (split after the batch's last use)", what,
               parts);
      size_t want = (size_t)parts * (size_t)(nb - (accum > 1 ? 2 : 1));
      TT_CHECK(b.x.graph_state[0] == 2 && (accum < 2 || b.x.graph_state[1] == 2) && launches == want,
               "%s: graph state %d/%d, %zu graph launches (want 2/2, %zu): the step was not replayed (%s)", what,
               b.x.graph_state[0], b.x.graph_state[1], launches, want, b.x.graph_note);
    } else {
      TT_CHECK(b.x.graph_state[0] == -1 && b.x.graph_state[1] == -1 && strstr(b.x.graph_note, "cudaStreamSynchronize") &&
                   launches == 0,
               "%s: graph state %d/%d, %zu launches, note '%s' (want -1/-1, none, a note naming cudaStreamSynchronize)",
               what, b.x.graph_state[0], b.x.graph_state[1], launches, b.x.graph_note);
    }
    free(images);
    free(labels);
  }
  test_net_close(&a);
  test_net_close(&b);
  return seeded;
}

/* A captured micro-step equals the eager one bit for bit: the small CNN (convolutions through
 * cuDNN, the classifier through cuBLAS) in fp32 and fp16 over 3 updates of 2 micro-steps (both
 * kinds of micro-step recorded and replayed), and the fashion ResNet (batch norm, residual adds)
 * over 2 updates of 2; the steps allocate nothing (the emulation counts every allocation). */
void test_cuda_graph_equal(void) {
  TT_TEST_BEGIN("cuda_graph_step_equals_eager");
  cuda_rng = 0x5eed00c0ffeeull;
  test_graph_run("tests/fixtures/small_cnn.recipe", TT_F32, 6, 2, 3, gpu, 0, "small CNN fp32");
  test_graph_run("tests/fixtures/small_cnn.recipe", TT_F16, 6, 2, 3, gpu, 0, "small CNN fp16");
  /* under the sanitizers the miniature ResNet (test_resnet_recipe): the same kinds of calls */
  test_graph_run(test_resnet_recipe(), TT_F32, 2, 2, 2, gpu, 0, tt_test_sanitized() ? "miniature ResNet fp32" : "fashion ResNet fp32");
  test_graph_run(test_resnet_recipe(), TT_F16, 2, 2, 2, gpu, 0, tt_test_sanitized() ? "miniature ResNet fp16" : "fashion ResNet fp16");
  TT_TEST_END();
}

/* A CNN with dropout after a convolution and in the classifier, and a one-block ViT with dropout on
 * the attention probabilities and in the MLP (recipe texts: test_net_open). */
static const char test_graph_dropout_cnn[] =
    "[net]\ninput = 2x8x8\nclasses = 5\n[train]\nbatch = 6\noptimizer = sgd\nlr = 0.1\nmomentum = 0.9\n"
    "[conv conv1]\nfilters = 4\nsize = 3\npad = 1\n[relu relu1]\n[dropout drop1]\np = 0.25\n"
    "[conv conv2]\nfilters = 4\nsize = 3\nstride = 2\npad = 1\n[relu relu2]\n[flatten flatten1]\n"
    "[linear fc1]\nout = 16\n[relu relu3]\n[dropout drop2]\np = 0.5\n[linear fc2]\nout = 5\n";
static const char test_graph_dropout_vit[] =
    "[net]\ninput = 2x12x12\nclasses = 5\n[train]\nbatch = 4\noptimizer = sgd\nlr = 0.01\n"
    "[patch_embed embed]\nsize = 4\ndim = 8\nclass_token = true\npos_embed = true\n"
    "[layernorm ln_1]\n[attention attn]\nheads = 2\ndropout = 0.2\n[add res1]\nfrom = attn, embed\n"
    "[layernorm ln_2]\n[linear mlp.0]\nout = 16\n[gelu mlp.1]\n[dropout mlp.drop]\np = 0.1\n[linear mlp.2]\nout = 8\n"
    "[add res2]\nfrom = mlp.2, res1\n[layernorm ln]\n[token]\nmode = class\n[linear head]\nout = 5\n";

/* Dropout and attention no longer keep the step eager: their recorded kernels read the micro-step's
 * seed base from device memory (graph_values), so each replay draws the masks the eager step draws
 * for that step and micro-step (different each one) and the weights stay equal bit for bit: the
 * CNN and the ViT above in fp32 and fp16 over 3 updates of 2 micro-steps. */
void test_cuda_graph_dropout(void) {
  TT_TEST_BEGIN("cuda_graph_dropout_attention_equal_eager");
  cuda_rng = 0x5eed00c0ffeeull;
  static const struct { const char *recipe, *what; tt_dtype dt; int mb, min_seeded; } runs[4] = {
      {test_graph_dropout_cnn, "CNN with dropout fp32", TT_F32, 6, 4},
      {test_graph_dropout_cnn, "CNN with dropout fp16", TT_F16, 6, 4},
      {test_graph_dropout_vit, "ViT with attention dropout fp32", TT_F32, 4, 4},
      {test_graph_dropout_vit, "ViT with attention dropout fp16", TT_F16, 4, 4}};
  for (int k = 0; k < 4; k++) {
    int seeded = test_graph_run(runs[k].recipe, runs[k].dt, runs[k].mb, 2, 3, gpu, 0, runs[k].what);
    TT_CHECK(seeded >= runs[k].min_seeded, "%s: %d dropout and attention calls in the micro-step (want %d or more)",
             runs[k].what, seeded, runs[k].min_seeded);
  }
  TT_TEST_END();
}

/* A backend call that waits for the device inside the step: the capture refuses it. */
static tt_softmax_ce_fn *test_graph_real_ce;
static int test_graph_sync_ce(tt_backend *b, int n, int classes, tt_dtype dt, const void *logits, const int32_t *labels,
                              float smoothing, float grad_scale, void *dlogits, float *stats) {
  if (b->sync(b)) return -1;
  return test_graph_real_ce(b, n, classes, dt, logits, labels, smoothing, grad_scale, dlogits, stats);
}

/* When the step holds a call a capture refuses (here a host synchronisation before the loss), the
 * recording fails, the micro-step runs eagerly with a note, later ones too, and the weights equal
 * the eager executor's bit for bit. */
void test_cuda_graph_refused(void) {
  tt_backend synced = *gpu; /* the same device state, one entry wrapped */
  TT_TEST_BEGIN("cuda_graph_refused_falls_back");
  test_graph_real_ce = gpu->softmax_ce;
  synced.softmax_ce = test_graph_sync_ce;
  cuda_rng = 0x5eed00c0ffeeull;
  int quiet = tt_emu_set_quiet(1); /* the refusal's message is checked below, not printed */
  size_t g0 = tt_emu_graph_launches(NULL);
  /* a test_net keeps its backend pointer: synced outlives it (closed inside test_graph_run) */
  test_graph_run("tests/fixtures/small_cnn.recipe", TT_F32, 6, 2, 2, &synced, 0, "small CNN, a sync in the step");
  tt_emu_set_quiet(quiet);
  TT_CHECK(tt_emu_graph_launches(NULL) == g0, "a refused recording still launched %zu graphs", tt_emu_graph_launches(NULL) - g0);
  TT_CHECK(strstr(tt_emu_last_violation(), "capture was invalidated") != NULL, "the emulation's last message: '%s'",
           tt_emu_last_violation());
  TT_TEST_END();
}

/* Saved activations offloaded to pinned host memory no longer keep the step eager: their copies
 * are recorded with it, forked into the copy stream and joined back within each recorded part (the
 * emulation refuses an unjoined part as the runtime does, and replays a forked copy as late as its
 * dependencies allow, so a copy compute did not wait for reads or leaves stale bytes). The small CNN
 * with every saved value offloaded, in fp32 with one-step windows and in fp16 with the widest (each
 * copy out waited for just before the loss, each copy in marked just after it), over 3 updates of 2
 * micro-steps: every replay runs and the weights equal the eager executor's bit for bit. */
void test_cuda_graph_actoffload(void) {
  TT_TEST_BEGIN("cuda_graph_actoffload_equal_eager");
  cuda_rng = 0x5eed00c0ffeeull;
  test_graph_run("tests/fixtures/small_cnn.recipe", TT_F32, 6, 2, 3, gpu, 1, "small CNN offloaded fp32");
  test_graph_run("tests/fixtures/small_cnn.recipe", TT_F16, 6, 2, 3, gpu, 2, "small CNN offloaded fp16 (widest windows)");
  TT_TEST_END();
}
#endif

#ifdef TT_HAVE_CUDA
/* A made-up micro-step of one call a step: kinds[i] is step i's call (the TT_OFF_* mode of an
 * offload call, -1 another call). */
static void test_parts_program(tt_program *p, tt_call *calls, int *step_call, const int *kinds, int n) {
  memset(p, 0, sizeof *p);
  memset(calls, 0, (size_t)n * sizeof *calls);
  for (int i = 0; i < n; i++) {
    calls[i].fn = kinds[i] >= 0 ? TT_CALL_OFFLOAD : TT_CALL_ADD, calls[i].mode = kinds[i] >= 0 ? kinds[i] : 0;
    calls[i].skip = TT_CALL_RUNS, step_call[i] = i;
  }
  step_call[n] = n;
  p->calls = calls, p->step_call = step_call, p->nsteps = p->ncalls = p->micro_end = n, p->n_act_offloaded = 1;
}

/* Where a recording splits (tt_exec_graph_parts) and when it is refused, on made-up micro-steps:
 * after the batch's last use, at the first step where every activation copy begun is joined (a copy
 * out waited for, a copy in's mark followed by the copy): a copy out waited for after the last use
 * moves the split past its wait, a mark before that wait past the copy in; a copy out never waited
 * for keeps the micro-step in one part and is refused a graph with its own reason. */
void test_cuda_graph_offload_parts(void) {
  enum { F = -1, O = TT_OFF_OUT, W = TT_OFF_WAIT, M = TT_OFF_MARK, I = TT_OFF_IN };
  static const struct { int kinds[9], in_last, parts, split, refused; } cases[4] = {
      {{F, O, F, W, F, M, F, I, F}, 4, 2, 5, 0},  /* waited for before the last use: split right after it */
      {{F, O, F, F, W, M, F, I, F}, 3, 2, 5, 0},  /* waited for after it: split after the wait */
      {{F, O, F, F, M, F, W, I, F}, 3, 2, 8, 0},  /* a mark before the wait: split after its copy in */
      {{F, O, F, F, F, M, F, I, F}, 3, 1, 9, 1}}; /* never waited for: one part, refused */
  TT_TEST_BEGIN("cuda_graph_offload_parts");
  for (int k = 0; k < 4; k++) {
    tt_program p;
    tt_call calls[9];
    int step_call[10], bounds[3] = {-1, -1, -1};
    tt_exec x;
    test_parts_program(&p, calls, step_call, cases[k].kinds, 9);
    memset(&x, 0, sizeof x);
    x.be = gpu, x.train = &p, x.graph_on = 1, x.in_ev = &x, x.in_last = cases[k].in_last;
    int n = tt_exec_graph_parts(&x, &p, bounds);
    TT_CHECK(n == cases[k].parts && bounds[0] == 0 && bounds[1] == cases[k].split && (n == 1 || bounds[2] == 9),
             "case %d: %d part(s), bounds %d %d %d (want %d, split at %d)", k, n, bounds[0], bounds[1], bounds[2],
             cases[k].parts, cases[k].split);
    const char *why = tt_exec_graph_refusal(&x, &p, p.policy.micro_batch);
    TT_CHECK(cases[k].refused ? why && strstr(why, "not joined back") : why == NULL, "case %d: refusal '%s'", k,
             why ? why : "(none)");
  }
  TT_TEST_END();
}
#endif
