/* tests/kernels/cuda_offload.c — planned host offload of the optimizer state (issue 42 item 2,
 * core/compile/offload.h): training with the state in pinned host memory, streamed through the
 * device window, is bit for bit training without; a checkpoint crosses between the two; the
 * policy search offloads only where the device budget needs it and the host budget allows it.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA
#include "core/compile/offload.h"
#include "core/runtime/checkpoint.h"

/* Six 256 x 256 linear layers (65536 values each: the state of each is 512 KiB in fp32 for Adam),
 * so the state is most of the device's bytes and the window (two slots of one tensor's state) is
 * a third of it. */
static const char offload_text[] = "[net]\ninput = 1x16x16\nclasses = 10\n[train]\nbatch = 6\n[flatten]\n"
                                   "[linear fc1]\nout = 256\n[relu]\n[linear fc2]\nout = 256\n[relu]\n"
                                   "[linear fc3]\nout = 256\n[relu]\n[linear fc4]\nout = 256\n[relu]\n"
                                   "[linear fc5]\nout = 256\n[relu]\n[linear fc6]\nout = 256\n[relu]\n[linear fc]\nout = 10\n";

/* The test net on be, planned with the optimizer state on the host (offload 1) or in the arena. */
static int offload_open(test_net *t, tt_backend *be, int offload, tt_opt_kind opt, int fmt, tt_err *err) {
  tt_policy pol;
  memset(t, 0, sizeof *t);
  if (tt_recipe_parse("offload.recipe", offload_text, &t->m, err, NULL, NULL)) return -1;
  t->m.train.optimizer = opt, t->m.train.optimizer_state = fmt;
  if (opt == TT_OPT_SGD) t->m.train.momentum = 0.9f;
  if (tt_graph_build(&t->m, &t->g, err)) return -1;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 6, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1;
  pol.offload = offload;
  if (tt_lower(&t->g, &pol, be, &t->p, err) || tt_program_plan(&t->p, err)) return -1;
  t->have_p = 1;
  if (tt_exec_create(&t->x, &t->g, &t->p, NULL, be, 11, err)) return -1;
  t->have_x = 1;
  return tt_exec_init_params(&t->x, 11, err);
}

/* Weights (role 0) and optimizer state (roles 2, 3) of every trainable parameter, byte for byte. */
static void offload_same(test_net *a, test_net *b, const char *when) {
  test_same_params(a, b, 3, when, "the state offloaded");
}

static void offload_steps(test_net **nets, int nn, tt_opt_kind opt, int from, int to) {
  tt_err err;
  size_t cnt = (size_t)6 * 1 * 16 * 16;
  float *input = (float *)malloc(cnt * sizeof(float));
  int32_t labels[6] = {0, 4, 2, 1, 3, 9};
  tt_opt_hparams hp;
  memset(&hp, 0, sizeof hp);
  if (opt == TT_OPT_SGD) hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f, hp.nesterov = 1, hp.weight_decay = 5e-4f;
  else hp.kind = TT_OPT_ADAMW, hp.lr = 0.01f, hp.beta1 = 0.9f, hp.beta2 = 0.999f, hp.eps = 1e-8f, hp.weight_decay = 0.01f;
  for (int step = from; step < to && !tt_test_current_failed; step++) {
    uint64_t r = 99991ull * (uint64_t)(step + 1);
    for (size_t k = 0; k < cnt; k++) r = r * 6364136223846793005ull + 1442695040888963407ull, input[k] = (float)((r >> 40) % 2001) / 1000.0f - 1.0f;
    for (int j = 0; j < nn; j++)
      TT_CHECK(tt_exec_micro_step_f32(&nets[j]->x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0 &&
                   tt_exec_update(&nets[j]->x, &hp, step + 1, 1.0f, NULL, &err) == 0,
               "step %d: %s", step, err.msg);
  }
  free(input);
}

/* Three steps with the state offloaded against three without, for SGD with momentum, AdamW and
 * AdamW with int8 state; then a checkpoint of each after step 2 loaded into the other form, which
 * takes step 3 bit for bit as the run it came from. */
void test_offload(void) {
  tt_err err;
  static const struct { tt_opt_kind opt; int fmt; const char *name; } cases[3] = {
      {TT_OPT_SGD, TT_OSTATE_FP32, "sgd momentum"}, {TT_OPT_ADAMW, TT_OSTATE_FP32, "adamw"}, {TT_OPT_ADAMW, TT_OSTATE_INT8, "adamw int8"}};
  TT_TEST_BEGIN("cuda_offload_bit_for_bit");
  for (int c = 0; c < 3 && !tt_test_current_failed; c++) {
    /* under the sanitizers SGD and int8 AdamW: fp32 AdamW's offloaded stream is SGD's with two states */
    if (c == 1 && tt_test_sanitized()) continue;
    test_net a, b, ra, rb;
    memset(&b, 0, sizeof b), memset(&ra, 0, sizeof ra), memset(&rb, 0, sizeof rb); /* closed whatever was opened */
    int ok = offload_open(&a, gpu, 0, cases[c].opt, cases[c].fmt, &err) == 0;
    TT_CHECK(ok, "%s, in the arena: %s", cases[c].name, err.msg);
    int okb = ok && offload_open(&b, gpu, 1, cases[c].opt, cases[c].fmt, &err) == 0;
    TT_CHECK(!ok || okb, "%s, offloaded: %s", cases[c].name, err.msg);
    if (okb) {
      int nstate = cases[c].opt == TT_OPT_SGD ? 14 : 28; /* 14 trainable tensors, 1 or 2 states each */
      TT_CHECK(b.p.n_offloaded == nstate && b.p.host_bytes > 0 && a.p.n_offloaded == 0, "%s: %d buffers offloaded (want %d), %zu host bytes",
               cases[c].name, b.p.n_offloaded, nstate, b.p.host_bytes);
      TT_CHECK(b.p.persistent_bytes + b.p.host_bytes >= a.p.persistent_bytes && b.p.arena_bytes < a.p.arena_bytes,
               "%s: arena %zu offloaded against %zu (persistent %zu + host %zu against %zu)", cases[c].name, b.p.arena_bytes,
               a.p.arena_bytes, b.p.persistent_bytes, b.p.host_bytes, a.p.persistent_bytes);
      test_net *both[2] = {&a, &b};
      offload_steps(both, 2, cases[c].opt, 0, 2);
      offload_same(&a, &b, "after 2 steps");
      /* resume across the two forms: each one's checkpoint into the other */
      char dir[64];
      snprintf(dir, sizeof dir, "/tmp/tt_offload_%d_%d", (int)getpid(), c);
      tt_ckpt_state st;
      memset(&st, 0, sizeof st);
      st.micro_batch = 6, st.accum_steps = 1, st.step = 2;
      tt_loss_scale_init(&st.loss_scale, 0);
      snprintf(st.optimizer, sizeof st.optimizer, "%s", cases[c].opt == TT_OPT_SGD ? "sgd" : "adamw");
      int okr = !tt_test_current_failed && offload_open(&ra, gpu, 1, cases[c].opt, cases[c].fmt, &err) == 0 &&
                offload_open(&rb, gpu, 0, cases[c].opt, cases[c].fmt, &err) == 0;
      TT_CHECK(okr, "%s: the resumed nets: %s", cases[c].name, err.msg);
      if (okr) {
        test_ckpt_cross(&a, &b, &ra, &rb, dir, &st);
        offload_same(&a, &ra, "the arena run's checkpoint loaded offloaded");
        offload_same(&b, &rb, "the offloaded run's checkpoint loaded into the arena");
        test_net *all[4] = {&a, &b, &ra, &rb};
        offload_steps(all, 4, cases[c].opt, 2, 3);
        offload_same(&a, &b, "after 3 steps");
        offload_same(&a, &ra, "step 3 resumed offloaded from the arena run");
        offload_same(&a, &rb, "step 3 resumed in the arena from the offloaded run");
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        TT_CHECK(system(cmd) == 0, "%s", cmd);
      }
    }
    test_net_close(&a);
    test_net_close(&b);
    test_net_close(&ra);
    test_net_close(&rb);
  }
  TT_TEST_END();
}

/* One policy search of the test net (AdamW, fp32, no recompute) on be for a gtx1650's link at a
 * device budget and a host budget: 0 and the result, or -1 (refused). */
static int offload_search(test_net *t, tt_backend *be, size_t vram, size_t host, tt_policy_result *r) {
  tt_policy_opts o;
  tt_err e;
  memset(&o, 0, sizeof o);
  o.vram_bytes = vram, o.reserve_bytes = 0, o.precision = TT_PREC_FP32, o.recompute = TT_RECOMP_NONE, o.inplace = 1;
  o.profile = tt_profile_gpu("gtx1650"), o.host_bytes = host;
  return tt_policy_search(&t->g, be, &o, r, &e);
}

/* The search's choice at several budgets: none (no offload: the copies cost time for nothing), the
 * arena plan's own size (fits without), halfway between the two plans (offload, which alone fits),
 * there with a host budget one byte short (refused), under the offloaded plan (refused), and on
 * the CPU backend 1 MiB under its own plan (refused where offload would fit: it computes in host
 * memory, nothing to offload to). */
void test_offload_plan(void) {
  tt_err err;
  TT_TEST_BEGIN("cuda_offload_plan_budgets");
  test_net a, b;
  memset(&b, 0, sizeof b);
  int ok = offload_open(&a, gpu, 0, TT_OPT_ADAMW, TT_OSTATE_FP32, &err) == 0 && offload_open(&b, gpu, 1, TT_OPT_ADAMW, TT_OSTATE_FP32, &err) == 0;
  TT_CHECK(ok, "%s", err.msg);
  if (ok) {
    size_t dev = a.p.arena_bytes, off = b.p.arena_bytes, mid = (dev + off) / 2, host = b.p.host_bytes;
    TT_CHECK(off + ((size_t)1 << 20) < dev, "offloaded arena %zu, arena %zu: want at least 1 MiB apart", off, dev);
    tt_policy_result r;
    size_t cpu_dev = 0; /* the CPU backend's own plan without a budget */
    TT_CHECK(offload_search(&a, cpu, 0, (size_t)1 << 30, &r) == 0, "the CPU backend's plan without a budget");
    if (!tt_test_current_failed) cpu_dev = r.train.arena_bytes, tt_policy_result_free(&r);
    struct { size_t vram, host; int cpu, want; const char *what; } cases[6] = {
        {0, (size_t)1 << 30, 0, 0, "no budget"},
        {dev, (size_t)1 << 30, 0, 0, "the arena plan's size"},
        {mid, (size_t)1 << 30, 0, 1, "between the two plans"},
        {mid, host - 1, 0, -1, "between, host budget one byte short"},
        {off - ((size_t)256 << 10), (size_t)1 << 30, 0, -1, "under the offloaded plan"},
        {cpu_dev - ((size_t)1 << 20), (size_t)1 << 30, 1, -1, "1 MiB under the CPU's own plan, on the CPU backend"}};
    for (int k = 0; k < 6; k++) {
      int rc = offload_search(&a, cases[k].cpu ? cpu : gpu, cases[k].vram, cases[k].host, &r);
      if (cases[k].want < 0) {
        TT_CHECK(rc != 0, "%s (--vram %zu): planned, want a refusal", cases[k].what, cases[k].vram);
      } else {
        TT_CHECK(rc == 0, "%s (--vram %zu): refused", cases[k].what, cases[k].vram);
        if (rc == 0) {
          TT_CHECK((r.train.n_offloaded > 0) == cases[k].want && (!cases[k].want || r.train.host_bytes == host),
                   "%s: %d buffers offloaded (%zu host bytes), want %s", cases[k].what, r.train.n_offloaded, r.train.host_bytes,
                   cases[k].want ? "all 28" : "none");
          TT_CHECK(!cases[k].vram || r.train.persistent_bytes + r.train.transient_bytes <= cases[k].vram, "%s: arena over the budget",
                   cases[k].what);
        }
      }
      if (rc == 0) tt_policy_result_free(&r);
    }
  }
  test_net_close(&a);
  test_net_close(&b);
  TT_TEST_END();
}
#endif
