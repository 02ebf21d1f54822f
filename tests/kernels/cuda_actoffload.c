/* tests/kernels/cuda_actoffload.c — saved activations in pinned host memory (issue 42 item 2,
 * core/compile/offload.c's steps): training with every saved value copied out in forward and
 * back before backward is bit for bit training without, on a small CNN and the fashion ResNet,
 * fp32 and fp16. Under the emulation a stream's work runs only when something waits for it
 * (emu_stream.cc), so a copy back that compute did not wait for, or a copy out whose source was
 * reused before it ran, reads stale bytes and fails the comparison. And the policy search's
 * choice at several budgets. Registered and run by tests/kernels/test_cuda.c. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA
#include "core/compile/offload.h"
#include "core/compile/recompute.h"

/* recipe (a file) on be at micro-batch mb and dtype dt, every saved value offloaded (all 1) or none;
 * prof (may be NULL: one-step windows) places the copies' windows. */
static int actoff_open(test_net *t, tt_backend *be, const char *recipe, tt_dtype dt, int mb, int all, unsigned char *sel,
                       const tt_device_profile *prof, tt_err *err) {
  tt_policy pol;
  memset(t, 0, sizeof *t);
  if (tt_recipe_load(recipe, &t->m, err, NULL, NULL) || tt_graph_build(&t->m, &t->g, err)) return -1;
  memset(sel, all ? 1 : 0, (size_t)t->g.nnodes);
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = mb, pol.accum_steps = 1, pol.act_dtype = dt, pol.inplace = 1, pol.training = 1;
  pol.offload_sel = all ? sel : NULL, pol.offload_profile = prof;
  if (tt_lower(&t->g, &pol, be, &t->p, err) || tt_program_plan(&t->p, err)) return -1;
  t->have_p = 1;
  if (tt_exec_create(&t->x, &t->g, &t->p, NULL, be, 7, err)) return -1;
  t->have_x = 1;
  return tt_exec_init_params(&t->x, 7, err);
}

/* Every trainable parameter's weights and momentum, byte for byte. */
static void actoff_same(test_net *a, test_net *b, const char *when) {
  test_same_params(a, b, 2, when, "the activations offloaded");
}

/* Whether every offloaded value's window is the widest (offload.c's offload_windows): each WAIT
 * with only offload steps between it and the loss, each MARK with only offload steps between the
 * loss and it. */
static int actoff_widest(const tt_program *p) {
  int loss = -1, n = 0;
  for (int i = 0; i < p->micro_end && loss < 0; i++)
    if (p->steps[i].op == TT_S_LOSS) loss = i;
  for (int i = 0; i < p->micro_end; i++) {
    const tt_step *s = &p->steps[i];
    if (s->op != TT_S_OFFLOAD || (s->arg != TT_OFF_WAIT && s->arg != TT_OFF_MARK)) continue;
    int a = s->arg == TT_OFF_WAIT ? i + 1 : loss + 1, b = s->arg == TT_OFF_WAIT ? loss : i;
    for (int j = a; j < b; j++)
      if (p->steps[j].op != TT_S_OFFLOAD) return 0;
    n++;
  }
  return loss > 0 && n == 2 * p->n_act_offloaded;
}

void test_actoffload(void) {
  const struct { const char *recipe; int mb; } nets[2] = {{"examples/fashion_mnist/lenet.recipe", 4}, {test_resnet_recipe(), 2}};
  static const tt_dtype dts[2] = {TT_F32, TT_F16};
  TT_TEST_BEGIN("cuda_actoffload_bit_for_bit");
  /* LeNet in fp32 and fp16, the fashion ResNet in fp16 (its fp32 run added 10 s of emulation and
   * no other step kind), 2 steps each: the second update reads the first's momentum. fp32 with
   * one-step windows; fp16 with the widest (a card whose compute takes no time, so every copy out
   * is waited for just before the loss and every copy in marked just after it): the values and
   * slots live longest, and a lifetime or event out of place shows as stale bytes */
  tt_device_profile instant = *tt_profile_gpu("gtx1650");
  instant.flops_fp32 = instant.flops_fp16 = instant.bytes_per_s = 1e30, instant.op_overhead_s = 0.0;
  for (int n = 0; n < 2 && !tt_test_current_failed; n++)
    for (int d = n; d < 2 && !tt_test_current_failed; d++) {
      /* under the sanitizers fp16 only and one step: the same copies (run_tests.py's 600 s) */
      if (n == 0 && d == 0 && tt_test_sanitized()) continue;
      tt_err err;
      test_net a, b;
      unsigned char sa[512], sb[512];
      char what[160];
      memset(&b, 0, sizeof b);
      snprintf(what, sizeof what, "%s %s", nets[n].recipe, test_dt_name(dts[d]));
      const tt_device_profile *prof = dts[d] == TT_F16 ? &instant : NULL;
      int ok = actoff_open(&a, gpu, nets[n].recipe, dts[d], nets[n].mb, 0, sa, NULL, &err) == 0 &&
               actoff_open(&b, gpu, nets[n].recipe, dts[d], nets[n].mb, 1, sb, prof, &err) == 0;
      TT_CHECK(ok, "%s: %s", what, err.msg);
      if (ok) {
        TT_CHECK(b.p.n_act_offloaded > 2 && a.p.n_act_offloaded == 0 && b.p.host_bytes >= b.p.act_offload_bytes,
                 "%s: %d activations offloaded (%zu host bytes)", what, b.p.n_act_offloaded, b.p.host_bytes);
        TT_CHECK(!prof == !actoff_widest(&b.p), "%s: the windows are %s the widest", what, prof ? "not" : "");
        size_t cnt = (size_t)nets[n].mb * a.g.nodes[0].c * a.g.nodes[0].h * a.g.nodes[0].w;
        float *input = (float *)malloc(cnt * sizeof(float));
        int32_t labels[4] = {3, 1, 7, 0};
        tt_opt_hparams hp;
        memset(&hp, 0, sizeof hp);
        hp.kind = TT_OPT_SGD, hp.lr = 0.05f, hp.momentum = 0.9f, hp.weight_decay = 5e-4f;
        for (int step = 0; step < (tt_test_sanitized() ? 1 : 2) && !tt_test_current_failed; step++) {
          uint64_t r = 7919ull * (uint64_t)(step + 1);
          for (size_t k = 0; k < cnt; k++) r = r * 6364136223846793005ull + 1442695040888963407ull, input[k] = (float)((r >> 40) % 2001) / 1000.0f - 1.0f;
          test_net *both[2] = {&a, &b};
          for (int j = 0; j < 2; j++)
            TT_CHECK(tt_exec_micro_step_f32(&both[j]->x, input, labels, 0, (uint64_t)step, 1.0f / nets[n].mb, &err) == 0 &&
                         tt_exec_update(&both[j]->x, &hp, step + 1, 1.0f, NULL, &err) == 0,
                     "%s step %d: %s", what, step, err.msg);
        }
        free(input);
        actoff_same(&a, &b, what);
      }
      test_net_close(&a);
      test_net_close(&b);
    }
  TT_TEST_END();
}

/* One policy search of the fashion ResNet at micro-batch 32 (fp32, recompute auto) for a gtx1650's
 * link at a device and a host budget: 0 and the result, or -1. */
static int actoff_search(test_net *t, size_t vram, size_t host, tt_policy_result *r) {
  tt_policy_opts o;
  tt_err e;
  memset(&o, 0, sizeof o);
  o.vram_bytes = vram, o.micro_batch = 32, o.precision = TT_PREC_FP32, o.recompute = TT_RECOMP_AUTO, o.inplace = 1;
  o.profile = tt_profile_gpu("gtx1650"), o.host_bytes = host;
  return tt_policy_search(&t->g, gpu, &o, r, &e);
}

/* The per-tensor search on the fashion ResNet (micro-batch 32, fp32, a gtx1650's compute) for a
 * third of its saved bytes, at link bytes/s and a host budget: how many values it offloads and
 * their bytes (*bytes). */
static int actoff_choose(const tt_graph *g, double link, double host, double need, double *bytes) {
  tt_save_forms f;
  tt_err e;
  memset(&f, 0, sizeof f);
  f.link = link, f.host_left = host;
  unsigned char *dec = (unsigned char *)calloc((size_t)g->nnodes, 1);
  int n = 0;
  *bytes = 0.0;
  if (dec && tt_recompute_search_tensors(g, 32, TT_F32, tt_profile_gpu("gtx1650"), &f, need, dec, NULL, &e) >= -1)
    for (int v = 0; v < g->nnodes; v++)
      if (dec[v] == TT_DEC_OFFLOAD) n++, *bytes += 32.0 * (double)tt_node_numel(&g->nodes[v]) * 4.0;
  free(dec);
  return n;
}

/* ResNet-50 at micro-batch 16 in fp16 on a gtx1650's profile (issue 42: "an offloaded ResNet-50
 * plan's predicted step within 15% of the same plan without offload at a budget where both fit"):
 * at 80% of the arena the search plans without a budget, its plan offloads saved values (the
 * windows hide the copies behind the compute around them); the same policy without the offloads
 * (whose arena is larger: it fits the budget of the plain plan) is predicted at most 15% faster,
 * and the same policy with one-step windows is predicted slower than with the placed windows. */
void test_actoffload_windows(void) {
  TT_TEST_BEGIN("cuda_actoffload_windows_resnet50");
  test_net t;
  tt_err err;
  memset(&t, 0, sizeof t);
  int ok = tt_recipe_load("examples/imagenet/resnet50.recipe", &t.m, &err, NULL, NULL) == 0 && tt_graph_build(&t.m, &t.g, &err) == 0;
  TT_CHECK(ok, "%s", err.msg);
  tt_policy_opts o;
  memset(&o, 0, sizeof o);
  o.micro_batch = 16, o.precision = TT_PREC_FP16, o.recompute = TT_RECOMP_AUTO, o.inplace = 1;
  o.profile = tt_profile_gpu("gtx1650"), o.host_bytes = (size_t)8 << 30;
  tt_policy_result r;
  size_t plain = 0;
  if (ok && tt_policy_search(&t.g, gpu, &o, &r, &err) == 0) {
    TT_CHECK(r.train.n_act_offloaded == 0, "no budget: %d activations offloaded", r.train.n_act_offloaded);
    plain = r.train.arena_bytes;
    tt_policy_result_free(&r);
  }
  TT_CHECK(plain > 0, "the plan without a budget: %s", err.msg);
  o.vram_bytes = plain / 10 * 8;
  if (plain && tt_policy_search(&t.g, gpu, &o, &r, &err) == 0) {
    const tt_program *p = &r.train;
    double ms = tt_predict_ms(p, o.profile), ms_keep = 0.0, ms_narrow = 0.0;
    size_t arena_keep = 0;
    tt_program q;
    tt_policy pol = r.policy;
    pol.offload_sel = NULL; /* the same plan, every offloaded value kept on the device */
    if (tt_lower(&t.g, &pol, gpu, &q, &err) == 0 && tt_program_plan(&q, &err) == 0) {
      ms_keep = tt_predict_ms(&q, o.profile), arena_keep = q.arena_bytes;
      tt_program_free(&q);
    }
    pol = r.policy, pol.offload_profile = NULL; /* one-step windows */
    if (tt_lower(&t.g, &pol, gpu, &q, &err) == 0 && tt_program_plan(&q, &err) == 0) {
      ms_narrow = tt_predict_ms(&q, o.profile);
      tt_program_free(&q);
    }
    TT_CHECK(p->n_act_offloaded > 0 && p->arena_bytes <= o.vram_bytes, "--vram %.1f MiB: %d offloaded, arena %.1f MiB",
             o.vram_bytes / 1048576.0, p->n_act_offloaded, p->arena_bytes / 1048576.0);
    TT_CHECK(ms_keep > 0.0 && ms <= 1.15 * ms_keep && arena_keep > p->arena_bytes,
             "offloaded %.1f ms against %.1f kept (%.1f%%), arena %.1f against %.1f MiB", ms, ms_keep,
             100.0 * (ms / ms_keep - 1.0), p->arena_bytes / 1048576.0, arena_keep / 1048576.0);
    TT_CHECK(ms_narrow > ms, "one-step windows %.1f ms, placed windows %.1f ms", ms_narrow, ms);
    printf("  resnet50 b16 fp16 gtx1650, --vram %.1f MiB: %d values offloaded, %.1f ms (kept: %.1f ms, +%.1f%%; one-step "
           "windows %.1f ms), arena %.1f MiB (kept %.1f)\n", o.vram_bytes / 1048576.0, p->n_act_offloaded, ms, ms_keep,
           100.0 * (ms / ms_keep - 1.0), ms_narrow, p->arena_bytes / 1048576.0, arena_keep / 1048576.0);
    tt_policy_result_free(&r);
  } else if (plain) {
    TT_CHECK(0, "--vram %zu: %s", o.vram_bytes, err.msg);
  }
  tt_graph_free(&t.g);
  tt_model_free(&t.m);
  TT_TEST_END();
}

/* The search's choice. Per tensor: a link far faster than the card's compute offloads values (the
 * copies cost less than any recompute), a slow one none, no link none, and a host budget bounds
 * the bytes offloaded. The whole search: no device budget offloads nothing (the copies cost time
 * for nothing); a tight one with --host-mem 0 nothing, and with a host budget a plan within both
 * budgets. */
void test_actoffload_plan(void) {
  TT_TEST_BEGIN("cuda_actoffload_plan_budgets");
  test_net t;
  tt_err err;
  memset(&t, 0, sizeof t);
  int ok = tt_recipe_load("examples/fashion_mnist/resnet.recipe", &t.m, &err, NULL, NULL) == 0 && tt_graph_build(&t.m, &t.g, &err) == 0;
  TT_CHECK(ok, "%s", err.msg);
  double all = 0.0, b;
  unsigned char *reads = ok ? (unsigned char *)calloc((size_t)t.g.nnodes, 1) : NULL;
  if (reads) {
    tt_recompute_bwd_reads_all(&t.g, reads);
    for (int v = 1; v < t.g.nnodes - 1; v++)
      if (reads[v]) all += 32.0 * (double)tt_node_numel(&t.g.nodes[v]) * 4.0;
    free(reads);
  }
  if (ok) {
    int fast = actoff_choose(&t.g, 1e15, 1e12, all / 3, &b), slow = actoff_choose(&t.g, 1e6, 1e12, all / 3, &b);
    TT_CHECK(fast > 0 && slow == 0, "a third of %.1f MiB: %d offloaded over a 1e15 B/s link, %d over 1e6 B/s", all / 1048576.0, fast, slow);
    TT_CHECK(actoff_choose(&t.g, 0.0, 1e12, all / 3, &b) == 0, "no link: offloaded");
    int some = actoff_choose(&t.g, 1e15, all / 10, all / 3, &b);
    TT_CHECK(some > 0 && b <= all / 10, "host budget %.1f MiB: %d offloaded, %.1f MiB", all / 10 / 1048576.0, some, b / 1048576.0);
  }
  tt_policy_result r;
  size_t free_arena = 0;
  if (ok && actoff_search(&t, 0, (size_t)1 << 30, &r) == 0) {
    TT_CHECK(r.train.n_act_offloaded == 0, "no budget: %d activations offloaded", r.train.n_act_offloaded);
    free_arena = r.train.arena_bytes;
    tt_policy_result_free(&r);
  }
  TT_CHECK(free_arena > 0, "the plan without a budget");
  size_t tight = free_arena / 10 * 7;
  if (free_arena && actoff_search(&t, tight, 0, &r) == 0) {
    TT_CHECK(r.train.n_act_offloaded == 0 && r.train.host_bytes == 0, "--host-mem 0: %d offloaded", r.train.n_act_offloaded);
    tt_policy_result_free(&r);
  }
  size_t host = (size_t)8 << 20;
  if (free_arena && actoff_search(&t, tight, host, &r) == 0) {
    TT_CHECK(r.train.host_bytes <= host && r.train.persistent_bytes + r.train.transient_bytes <= tight,
             "--vram %zu --host-mem %zu: %zu pinned bytes, arena %zu", tight, host, r.train.host_bytes, r.train.arena_bytes);
    tt_policy_result_free(&r);
  }
  tt_graph_free(&t.g);
  tt_model_free(&t.m);
  TT_TEST_END();
}
#endif
