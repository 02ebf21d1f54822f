/* tests/kernels/cuda_graph.c — test_cuda's micro-step replayed as a CUDA graph (core/runtime/exec_graph.c,
 * kernels/cuda/cuda_graph.cu; TINYTRAIN_CUDA_GRAPH): equal to the eager step bit for bit, allocating nothing,
 * and falling back to the eager step when the step holds something a capture refuses.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

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

/* Runs nupd updates of accum micro-steps each on a (eager) and b (graph), with a different loss
 * scale every update (fp16's dynamic scaling, as the recorded loss must read it from device
 * memory), and compares them after every update. A backend whose table is `be` (the GPU's, or a
 * test's copy of it) runs b. */
static void test_graph_run(const char *recipe, tt_dtype dt, int mb, int accum, int nupd, tt_backend *be, const char *what) {
  tt_err err;
  test_net a, b;
  int rc = test_net_open(&a, recipe, gpu, dt, mb, accum, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "%s eager: %s", what, err.msg);
  int rc2 = test_net_open(&b, recipe, be, dt, mb, accum, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc2 == 0, "%s graph: %s", what, err.msg);
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
    printf("  %s: %d micro-steps; %zu graph launches replayed %zu recorded operations; graph state %d/%d%s%s\n", what, nb,
           launches, nodes1 - nodes0, b.x.graph_state[0], b.x.graph_state[1], b.x.graph_note[0] ? "; note: " : "",
           b.x.graph_note);
    TT_CHECK(tt_emu_allocations() == allocs && tt_cuda_alloc_count(gpu) == be_allocs,
             "%s: the steps allocated (%zu device/pinned allocations, %zu backend ones)", what, tt_emu_allocations() - allocs,
             tt_cuda_alloc_count(gpu) - be_allocs);
    if (be == gpu) {
      /* micro-steps of each kind: the first eager, then replays (2 parts each: split at the batch's last use) */
      int parts = b.x.in_ev && b.x.in_last + 1 < b.p.micro_end ? 2 : 1;
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
}

/* A captured micro-step equals the eager one bit for bit: the small CNN (convolutions through
 * cuDNN, the classifier through cuBLAS) in fp32 and fp16 over 3 updates of 2 micro-steps (both
 * kinds of micro-step recorded and replayed), and the fashion ResNet (batch norm, residual adds)
 * over 2 updates of 2; the steps allocate nothing (the emulation counts every allocation). */
void test_cuda_graph_equal(void) {
  TT_TEST_BEGIN("cuda_graph_step_equals_eager");
  cuda_rng = 0x5eed00c0ffeeull;
  test_graph_run("tests/fixtures/small_cnn.recipe", TT_F32, 6, 2, 3, gpu, "small CNN fp32");
  test_graph_run("tests/fixtures/small_cnn.recipe", TT_F16, 6, 2, 3, gpu, "small CNN fp16");
  /* under the sanitizers the ResNet in fp16 only, at micro-batch 1 (the same calls as fp32 at
   * micro-batch 2 on fewer bytes; the sanitized test_cuda_emu must end inside run_tests.py's 600 s) */
  if (!tt_test_sanitized()) test_graph_run("examples/fashion_mnist/resnet.recipe", TT_F32, 2, 2, 2, gpu, "fashion ResNet fp32");
  test_graph_run("examples/fashion_mnist/resnet.recipe", TT_F16, tt_test_sanitized() ? 1 : 2, 2, 2, gpu, "fashion ResNet fp16");
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
  test_graph_run("tests/fixtures/small_cnn.recipe", TT_F32, 6, 2, 2, &synced, "small CNN, a sync in the step");
  tt_emu_set_quiet(quiet);
  TT_CHECK(tt_emu_graph_launches(NULL) == g0, "a refused recording still launched %zu graphs", tt_emu_graph_launches(NULL) - g0);
  TT_CHECK(strstr(tt_emu_last_violation(), "capture was invalidated") != NULL, "the emulation's last message: '%s'",
           tt_emu_last_violation());
  TT_TEST_END();
}

#endif
