/* tests/kernels/cuda_moffload.c — planned host offload of the fp32 master weights (policy.offload 2,
 * core/compile/offload.h): fp16 training with the trainable weights' masters and the optimizer state
 * in pinned host memory (each weight read through a persistent 16-bit copy, recast after its update)
 * is bit for bit training without offload, evaluation included; a checkpoint crosses between the
 * two; the steps allocate nothing. Registered and run by tests/kernels/test_cuda.c; helpers in
 * tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA
#include "core/runtime/checkpoint.h"
#include "kernels/cuda/tt_cuda.h"

#ifdef TT_CUDA_EMULATION
#define MOFF_CASES 2 /* the KRSC case needs the emulation's sm_80 NHWC convolutions (cuda_conv_krsc.c's too) */
#define MOFF_ALLOCS() (tt_emu_allocations() + tt_cuda_alloc_count(gpu))
#else
#define MOFF_CASES 1
#define MOFF_ALLOCS() tt_cuda_alloc_count(gpu)
#endif

/* The small CNN (convolutions with and without bias, grouped and depthwise, batch norm, two linear
 * layers) on be in fp16, micro-batch 6 with 2 accumulation steps, AdamW, planned at offload level
 * `lvl`, with an evaluation program of batch 6 planned beside it as policy.c's policy_eval plans it
 * (the same level where it is 2). */
static int moff_open(test_net *t, tt_backend *be, int lvl, tt_err *err) {
  tt_policy pol;
  memset(t, 0, sizeof *t);
  if (tt_recipe_load("tests/fixtures/small_cnn.recipe", &t->m, err, NULL, NULL)) return -1;
  t->m.train.optimizer = TT_OPT_ADAMW;
  if (tt_graph_build(&t->m, &t->g, err)) return -1;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 6, pol.accum_steps = 2, pol.act_dtype = TT_F16, pol.inplace = 1, pol.training = 1, pol.offload = lvl;
  if (tt_lower(&t->g, &pol, be, &t->p, err) || tt_program_plan(&t->p, err)) return -1;
  t->have_p = 1;
  pol.training = 0, pol.accum_steps = 1, pol.offload = lvl == 2 ? 2 : 0;
  if (tt_lower(&t->g, &pol, be, &t->ev, err) || tt_program_plan(&t->ev, err)) return -1;
  t->have_ev = 1;
  if (tt_exec_create(&t->x, &t->g, &t->p, &t->ev, be, 11, err)) return -1;
  t->have_x = 1;
  return tt_exec_init_params(&t->x, 11, err);
}

/* Every parameter's master (role 0) and the trainable ones' optimizer state (2, 3), byte for byte. */
static void moff_same(test_net *a, test_net *b, const char *when) {
  test_same_params(a, b, 3, when, "the masters offloaded");
}

/* Optimizer steps [from, to) of every net: two micro-steps each (different batches), the update,
 * then one evaluation batch whose loss statistics must be the same bits in every net. */
static void moff_steps(test_net **nets, int nn, int from, int to) {
  tt_err err;
  const tt_node *in = &nets[0]->g.nodes[0];
  size_t cnt = (size_t)6 * in->c * in->h * in->w;
  float *input = (float *)malloc(cnt * sizeof(float));
  uint8_t *img = (uint8_t *)malloc(cnt);
  int32_t labels[6] = {0, 4, 2, 1, 3, 2};
  tt_opt_hparams hp;
  memset(&hp, 0, sizeof hp);
  hp.kind = TT_OPT_ADAMW, hp.lr = 0.01f, hp.beta1 = 0.9f, hp.beta2 = 0.999f, hp.eps = 1e-8f, hp.weight_decay = 0.01f;
  for (int step = from; step < to && !tt_test_current_failed; step++) {
    float st[2], st0[2] = {0, 0};
    for (int mi = 0; mi < 2; mi++) {
      uint64_t r = 99991ull * (uint64_t)(2 * step + mi + 1);
      for (size_t k = 0; k < cnt; k++) r = r * 6364136223846793005ull + 1442695040888963407ull, input[k] = (float)((r >> 40) % 2001) / 1000.0f - 1.0f;
      for (int j = 0; j < nn; j++)
        TT_CHECK(tt_exec_micro_step_f32(&nets[j]->x, input, labels, mi, (uint64_t)step, 1.0f / 12, &err) == 0, "step %d.%d: %s", step, mi,
                 err.msg);
    }
    for (size_t k = 0; k < cnt; k++) img[k] = (uint8_t)(k * 37u + (unsigned)step * 11u);
    for (int j = 0; j < nn && !tt_test_current_failed; j++) {
      TT_CHECK(tt_exec_update(&nets[j]->x, &hp, step + 1, 1.0f, NULL, &err) == 0 && tt_exec_stats(&nets[j]->x, NULL, 1, &err) == 0 &&
                   tt_exec_eval(&nets[j]->x, img, labels, 6, &err) == 0 && tt_exec_stats(&nets[j]->x, st, 1, &err) == 0,
               "step %d, net %d: %s", step, j, err.msg);
      if (j == 0) memcpy(st0, st, sizeof st);
      TT_CHECK(memcmp(st, st0, sizeof st) == 0, "step %d: net %d's evaluation loss %.9g (%.9g) differs from %.9g (%.9g)", step, j,
               (double)st[0], (double)st[1], (double)st0[0], (double)st0[1]);
    }
  }
  free(input), free(img);
}

/* Which parameters the level-2 plan must hold on the host: trainable, read through a 16-bit copy. */
static void moff_check_plan(test_net *a, test_net *b, const char *what) {
  int want = 0, casts = 0, host_ok = 1;
  for (int i = 0; i < b->g.nparams; i++) {
    const tt_param *pr = &b->g.params[i];
    int host = b->p.bufs[b->p.param_buf[i]].host, should = pr->trainable && pr->half_copy;
    want += should;
    if (host != should) host_ok = 0;
  }
  for (int i = 0; i < b->p.micro_end; i++) casts += b->p.steps[i].op == TT_S_CAST;
  TT_CHECK(want > 0 && b->p.n_masters_offloaded == want && host_ok && a->p.n_masters_offloaded == 0,
           "%s: %d masters offloaded, want %d (the trainable 16-bit-copied ones, each host: %d)", what, b->p.n_masters_offloaded, want,
           host_ok);
  TT_CHECK(casts == 0 && b->p.persistent_bytes < a->p.persistent_bytes, "%s: %d casts in the micro-step; persistent %zu against %zu",
           what, casts, b->p.persistent_bytes, a->p.persistent_bytes);
}

/* NCHW on the shared device, then NHWC with KRSC weight copies (cast transposed by cast_multi) on a
 * backend of its own: 2 optimizer steps of 2 micro-steps offloaded (level 2) against the same plan
 * without offload, then each one's checkpoint loaded into a fresh net of the other form, 1 step
 * more: masters, state and evaluation loss the same bits throughout, and no device or pinned
 * allocation during the steps, evaluation or the loads. */
void test_moffload(void) {
  tt_err err;
  TT_TEST_BEGIN("cuda_moffload_bit_for_bit");
  for (int c = 0; c < MOFF_CASES && !tt_test_current_failed; c++) {
    const char *what = c ? "nhwc krsc" : "nchw";
    tt_backend *be = gpu;
    if (c) {
      tt_backend_knobs k;
      size_t reserve = 0;
      char msg[512];
      tt_backend_knobs_default(&k);
      be = tt_cuda_backend_create(&reserve, &k, msg, sizeof msg);
      TT_CHECK(be != NULL, "a second CUDA backend: %s", msg);
      if (!be) break;
      be->layouts_16bit = 1u << TT_LAYOUT_NHWC; /* read when lowering, as TINYTRAIN_LAYOUT=nhwc */
    }
    test_net a, b, ra, rb;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b), memset(&ra, 0, sizeof ra), memset(&rb, 0, sizeof rb);
    int ok = moff_open(&a, be, 0, &err) == 0;
    TT_CHECK(ok, "%s, in the arena: %s", what, err.msg);
    ok = ok && moff_open(&b, be, 2, &err) == 0;
    TT_CHECK(ok || tt_test_current_failed, "%s, masters offloaded: %s", what, err.msg);
    if (ok) {
      moff_check_plan(&a, &b, what);
      if (c) TT_CHECK(b.p.n_krsc > 0 && a.p.n_krsc == b.p.n_krsc, "%s: KRSC copies %d and %d", what, a.p.n_krsc, b.p.n_krsc);
      size_t allocs = MOFF_ALLOCS() + tt_cuda_alloc_count(be);
      test_net *both[2] = {&a, &b};
      moff_steps(both, 2, 0, 2);
      moff_same(&a, &b, "after 2 steps");
      TT_CHECK(MOFF_ALLOCS() + tt_cuda_alloc_count(be) == allocs, "%s: the steps allocated %zu times", what,
               MOFF_ALLOCS() + tt_cuda_alloc_count(be) - allocs);
      char dir[64];
      snprintf(dir, sizeof dir, "/tmp/tt_moffload_%d_%d", (int)getpid(), c);
      tt_ckpt_state st;
      memset(&st, 0, sizeof st);
      st.micro_batch = 6, st.accum_steps = 2, st.step = 2;
      tt_loss_scale_init(&st.loss_scale, 1);
      snprintf(st.optimizer, sizeof st.optimizer, "adamw");
      int okr = !tt_test_current_failed && moff_open(&ra, be, 2, &err) == 0 && moff_open(&rb, be, 0, &err) == 0;
      TT_CHECK(okr || tt_test_current_failed, "%s: the resumed nets: %s", what, err.msg);
      if (okr) {
        size_t allocs_r = MOFF_ALLOCS() + tt_cuda_alloc_count(be);
        test_ckpt_cross(&a, &b, &ra, &rb, dir, &st);
        moff_same(&a, &ra, "the arena run's checkpoint loaded offloaded");
        moff_same(&b, &rb, "the offloaded run's checkpoint loaded into the arena");
        test_net *all[4] = {&a, &b, &ra, &rb};
        moff_steps(all, 4, 2, 3);
        moff_same(&a, &b, "after 3 steps");
        moff_same(&a, &ra, "step 3 resumed offloaded from the arena run");
        moff_same(&a, &rb, "step 3 resumed in the arena from the offloaded run");
        TT_CHECK(MOFF_ALLOCS() + tt_cuda_alloc_count(be) == allocs_r, "%s: the loads and steps allocated %zu times", what,
                 MOFF_ALLOCS() + tt_cuda_alloc_count(be) - allocs_r);
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        TT_CHECK(system(cmd) == 0, "%s", cmd);
      }
    }
    test_net_close(&a), test_net_close(&b), test_net_close(&ra), test_net_close(&rb);
    if (c) be->destroy(be);
  }
  TT_TEST_END();
}
#endif
