/* tests/kernels/cuda_step.c — test_cuda's whole training steps, CUDA vs CPU (fp32, fp16, bf16 NHWC), the copies' overlap, cudnnFind.
 * Registered and run by tests/kernels/test_cuda.c; helpers in tests/kernels/cuda_test.h. */
#include "tests/kernels/cuda_test.h"

#ifdef TT_HAVE_CUDA

/* ----------------------------------- training step ------------------------------------ */


int test_net_open(test_net *t, const char *recipe, tt_backend *be, tt_dtype dt, int mb, int accum, int eval_mb,
                         tt_opt_kind opt, tt_err *err) {
  tt_policy pol;
  memset(t, 0, sizeof *t);
  /* a path, or (with a newline in it) the recipe's text */
  if (strchr(recipe, '\n') ? tt_recipe_parse("test.recipe", recipe, &t->m, err, NULL, NULL)
                           : tt_recipe_load(recipe, &t->m, err, NULL, NULL))
    return -1;
  t->m.train.optimizer = opt; /* decides which optimizer state the program holds */
  if (tt_graph_build(&t->m, &t->g, err)) return -1;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = mb, pol.accum_steps = accum, pol.act_dtype = dt, pol.inplace = 1, pol.training = 1;
  if (tt_lower(&t->g, &pol, be, &t->p, err) || tt_program_plan(&t->p, err)) return -1;
  t->have_p = 1;
  if (eval_mb > 0) {
    pol.training = 0, pol.micro_batch = eval_mb, pol.accum_steps = 1;
    if (tt_lower(&t->g, &pol, be, &t->ev, err) || tt_program_plan(&t->ev, err)) return -1;
    t->have_ev = 1;
  }
  if (tt_exec_create(&t->x, &t->g, &t->p, t->have_ev ? &t->ev : NULL, be, 11, err)) return -1;
  t->have_x = 1;
  return tt_exec_init_params(&t->x, 11, err);
}

void test_net_close(test_net *t) {
  if (t->have_x) tt_exec_destroy(&t->x);
  if (t->have_p) tt_program_free(&t->p);
  if (t->have_ev) tt_program_free(&t->ev);
  tt_graph_free(&t->g);
  tt_model_free(&t->m);
}

/* Which elements of each parameter had a gradient at rounding-noise level at some step
 * (test_cmp_params marks them; NULL rows until a parameter has one). */

void test_noise_free(test_noise *nz) {
  for (int i = 0; i < nz->nparams; i++) free(nz->noisy[i]);
  free(nz->noisy);
  nz->noisy = NULL, nz->nparams = 0;
}

/* The scale of a step's gradients: the largest |cpu gradient| over every trainable parameter. */
double test_grad_scale(test_net *a) {
  float *h = NULL;
  double g = 0;
  tt_err err;
  for (int i = 0; i < a->g.nparams; i++) {
    const tt_param *p = &a->g.params[i];
    if (!p->trainable) continue;
    h = (float *)realloc(h, p->numel * sizeof(float));
    if (tt_exec_param_get(&a->x, i, 1, h, &err)) continue; /* test_cmp_params reports it */
    for (size_t k = 0; k < p->numel; k++)
      if (fabs(h[k]) > g) g = fabs(h[k]);
  }
  free(h);
  return g;
}

/* Compares role (0 value, 1 grad) of every trainable param (and running stats for values),
 * element by element: |cuda - cpu| <= tol * max|cpu| of the tensor + a floor.
 *   Gradients: floor = tol * the net's gradient scale (test_grad_scale). A gradient whose true
 *   value is zero — a conv bias followed by batch norm — is rounding noise on both sides, noise
 *   of the size of the terms it sums (the step's gradients), not of its own values; relative to
 *   its own max it would compare noise with noise. Elements at that noise level are marked in nz.
 *   Values: floor = 1e-7, plus adam_floor for marked elements: Adam(W) moves an element by about
 *   lr per step whatever the gradient's size, with the sign of the noise; and for batch-norm
 *   running statistics, which follow the (noisy) bias before them by momentum * its shift. */
void test_cmp_params(test_net *a, test_net *b, int role, double tol, double adam_floor, test_noise *nz,
                            const char *when) {
  float *ha = NULL, *hb = NULL;
  double scale = role == 1 ? test_grad_scale(a) : 0.0;
  tt_err err;
  if (nz && !nz->noisy) {
    nz->nparams = a->g.nparams;
    nz->noisy = (unsigned char **)calloc((size_t)nz->nparams, sizeof *nz->noisy);
  }
  for (int i = 0; i < a->g.nparams; i++) {
    const tt_param *p = &a->g.params[i];
    double mr = 0, worst = -1, floor_g = tol * scale;
    size_t wk = 0;
    if (role == 1 && !p->trainable) continue;
    ha = (float *)realloc(ha, p->numel * sizeof(float));
    hb = (float *)realloc(hb, p->numel * sizeof(float));
    if (tt_exec_param_get(&a->x, i, role, ha, &err) || tt_exec_param_get(&b->x, i, role, hb, &err)) {
      TT_CHECK(0, "param_get %s: %s", p->name, err.msg);
      break;
    }
    for (size_t k = 0; k < p->numel; k++)
      if (fabs(ha[k]) > mr) mr = fabs(ha[k]);
    for (size_t k = 0; k < p->numel; k++) {
      double d = fabs((double)ha[k] - hb[k]), allow = tol * mr;
      int noisy = (nz && nz->noisy[i] && nz->noisy[i][k]) || !p->trainable;
      if (role == 1) {
        allow += floor_g;
        if (nz && fabs(ha[k]) <= floor_g) {
          if (!nz->noisy[i]) nz->noisy[i] = (unsigned char *)calloc(p->numel, 1);
          nz->noisy[i][k] = 1;
        }
      } else {
        allow += 1e-7 + (noisy ? adam_floor : 0.0);
      }
      if (!(d <= allow) && (worst < 0 || d - allow > worst || d != d)) worst = d != d ? INFINITY : d - allow, wk = k;
    }
    TT_CHECK(worst < 0, "%s %s%s: at %zu |cuda - cpu| = |%.7g - %.7g| > %.0e * max|cpu| %.3g + floor %.3g", when,
             role ? "grad." : "", p->name, wk, (double)hb[wk], (double)ha[wk], tol, mr,
             role == 1 ? floor_g : 1e-7 + ((nz && nz->noisy[i] && nz->noisy[i][wk]) || !p->trainable ? adam_floor : 0.0));
  }
  free(ha), free(hb);
}

/* The input of a's first node for a micro-batch of 6 ([6, c, h, w], *cnt floats), uniform in
 * [-2, 2) from test_rand; the caller frees it. */
static float *test_rand_input(const test_net *a, size_t *cnt) {
  const tt_node *in = &a->g.nodes[0];
  *cnt = (size_t)6 * in->c * in->h * in->w;
  float *input = (float *)malloc(*cnt * sizeof(float));
  for (size_t i = 0; i < *cnt; i++) input[i] = test_rand(-2, 2);
  return input;
}

void test_step(tt_dtype dt, const char *name) {
  const char *recipe = "tests/fixtures/small_cnn.recipe";
  /* its own fixed stream, so that a test added before it does not change its inputs. In fp16
   * the comparison is borderline for some inputs: from 9 seeds, 2 put one conv weight gradient
   * element past 3e-2 (0.028 vs 0.019), with the batch-norm kernels before and after their
   * rewrite alike (the same values), so it is the fp16 path's rounding, not a kernel: kept as
   * a known limit of this tolerance (docs/gpu.md) */
  cuda_rng = 88172645463325252ull;
  double tol = dt == TT_F16 ? 3e-2 : 1e-4;
  tt_err err;
  TT_TEST_BEGIN(name);
  for (int opt = 0; opt < 2; opt++) {
    tt_opt_kind kind = opt ? TT_OPT_ADAMW : TT_OPT_SGD;
    test_net a, b;
    int rc = test_net_open(&a, recipe, cpu, dt, 6, 1, 0, kind, &err);
    TT_CHECK(rc == 0, "cpu: %s", err.msg);
    int rc2 = test_net_open(&b, recipe, gpu, dt, 6, 1, 0, kind, &err);
    TT_CHECK(rc2 == 0, "cuda: %s", err.msg);
    if (!rc && !rc2) {
      size_t cnt;
      float *input = test_rand_input(&a, &cnt), sa[2], sb[2];
      int32_t labels[6] = {0, 4, 2, 1, 3, 2};
      tt_opt_hparams hp;
      test_noise nz = {NULL, 0};
      test_cmp_params(&a, &b, 0, 0.0, 0.0, NULL, "initial");
      for (int step = 0; step < 2; step++) {
        int ova = 0, ovb = 0;
        tt_exec_stats(&a.x, NULL, 1, &err);
        tt_exec_stats(&b.x, NULL, 1, &err);
        TT_CHECK(tt_exec_micro_step_f32(&a.x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "cpu step: %s",
                 err.msg);
#ifdef TT_CUDA_EMULATION
        size_t cm0 = tt_emu_kernel_launches("cuda_ew_cast_multi_k"), c0 = tt_emu_kernel_launches("cuda_ew_cast_k");
#endif
        TT_CHECK(tt_exec_micro_step_f32(&b.x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "cuda step: %s",
                 err.msg);
#ifdef TT_CUDA_EMULATION
        if (dt != TT_F32) { /* the weight casts of the micro-step: one launch (cast_multi), none per weight */
          int ncast = 0;
          for (int i = 0; i < b.p.micro_end; i++) ncast += b.p.steps[i].op == TT_S_CAST;
          size_t cm = tt_emu_kernel_launches("cuda_ew_cast_multi_k") - cm0, cs = tt_emu_kernel_launches("cuda_ew_cast_k") - c0;
          TT_CHECK(ncast > 1 && cm == 1 && cs == 0,
                   "%d weight casts in the micro-step took %zu cast_multi and %zu cast launches (want 1 and 0)", ncast, cm, cs);
        }
#endif
        tt_exec_stats(&a.x, sa, 1, &err);
        tt_exec_stats(&b.x, sb, 1, &err);
        TT_CHECK(fabs(sa[0] - sb[0]) <= tol * fabs(sa[0]) + 1e-6 && sa[1] == sb[1], "loss/correct: cpu %.7g/%g cuda %.7g/%g",
                 sa[0], sa[1], sb[0], sb[1]);
        printf("  %s %s step %d: loss cpu %.7f cuda %.7f\n", dt == TT_F16 ? "fp16" : "fp32", opt ? "adamw" : "sgd", step,
               sa[0] / 6, sb[0] / 6);
        test_cmp_params(&a, &b, 1, tol, 0.0, &nz, "gradient");
        memset(&hp, 0, sizeof hp);
        if (!opt)
          hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f, hp.nesterov = 1, hp.weight_decay = 5e-4f;
        else
          hp.kind = TT_OPT_ADAMW, hp.lr = 0.01f, hp.beta1 = 0.9f, hp.beta2 = 0.999f, hp.eps = 1e-8f, hp.weight_decay = 0.01f;
        TT_CHECK(tt_exec_update(&a.x, &hp, step + 1, 1.0f, &ova, &err) == 0, "cpu update: %s", err.msg);
        TT_CHECK(tt_exec_update(&b.x, &hp, step + 1, 1.0f, &ovb, &err) == 0, "cuda update: %s", err.msg);
        TT_CHECK(ova == ovb, "overflow flags differ: cpu %d cuda %d", ova, ovb);
        /* AdamW divides by sqrt(v): an element whose gradient is noise moves by about +-lr a step
         * on either side, so after step+1 steps the two may be 2*lr*(step+1) apart */
        test_cmp_params(&a, &b, 0, opt && tol > 1e-2 ? 1e-2 : tol, opt ? 2.0 * hp.lr * (step + 1) : 0.0, &nz,
                        opt ? "after AdamW" : "after SGD");
      }
      test_noise_free(&nz);
      free(input);
    }
    test_net_close(&a);
    test_net_close(&b);
  }
  TT_TEST_END();
}

/* Optimizer state held in bf16 and int8 through whole training steps on the device (issue 42): a
 * net whose fc1.weight (768 x 96) holds its state as bf16 or int8 trains 2 steps of SGD (momentum)
 * and of AdamW on the CPU and on CUDA from the same weights and batch. The CUDA update is one
 * update_multi call, which goes to the held entry (exec.c); the weights agree after each step: the
 * first update computes from zero state in fp32 on both sides, the second from stored state, where
 * a value whose gradients differ in their last bits may round to the neighbouring code (bf16 2^-8,
 * int8 up to 2 scale/127 of its block), so the second step's tolerance adds lr times that step
 * (test_cmp_held). Under the emulation, fc1.weight's update is one held-state launch a step. */
static int test_net_open_held(test_net *t, tt_backend *be, int fmt, tt_opt_kind opt, tt_err *err) {
  static const char text[] = "[net]\ninput = 3x16x16\nclasses = 10\n[train]\nbatch = 6\n[conv c1]\nfilters = 3\nsize = 3\n"
                             "[relu]\n[flatten]\n[linear fc1]\nout = 96\n[relu]\n[linear fc]\nout = 10\n";
  tt_policy pol;
  memset(t, 0, sizeof *t);
  if (tt_recipe_parse("held.recipe", text, &t->m, err, NULL, NULL)) return -1;
  t->m.train.optimizer = opt, t->m.train.optimizer_state = fmt;
  if (tt_graph_build(&t->m, &t->g, err)) return -1;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 6, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1;
  if (tt_lower(&t->g, &pol, be, &t->p, err) || tt_program_plan(&t->p, err)) return -1;
  t->have_p = 1;
  if (tt_exec_create(&t->x, &t->g, &t->p, NULL, be, 11, err)) return -1;
  t->have_x = 1;
  return tt_exec_init_params(&t->x, 11, err);
}

/* Every trainable parameter's values: |cuda - cpu| <= 1e-4 max|cpu| + 1e-7 + flip (absolute).
 * adam_lr > 0 (AdamW): Adam moves an element by about lr a step whatever its gradient's size, so an
 * element whose gradient is at the two sides' rounding noise may differ by up to 2 lr a step; at
 * most one element in 1000 may take that wider bound. */
static void test_cmp_held(test_net *a, test_net *b, double flip, double adam_lr, int step) {
  tt_err err;
  for (int i = 0; i < a->g.nparams && !tt_test_current_failed; i++) {
    size_t n = a->g.params[i].numel, wide = 0, at = 0;
    float *ha = (float *)malloc(n * 4), *hb = (float *)malloc(n * 4);
    double mx = 0, worst = 0;
    TT_CHECK(tt_exec_param_get(&a->x, i, 0, ha, &err) == 0 && tt_exec_param_get(&b->x, i, 0, hb, &err) == 0, "%s", err.msg);
    for (size_t k = 0; k < n; k++) mx = fmax(mx, fabs(ha[k]));
    double bound = 1e-4 * mx + 1e-7 + flip;
    for (size_t k = 0; k < n; k++) {
      double d = fabs((double)hb[k] - ha[k]);
      if (d > bound) wide++;
      if (d > worst) worst = d, at = k;
    }
    TT_CHECK(adam_lr > 0 ? wide * 1000 <= n + 999 && worst <= 2.0 * adam_lr * (step + 1) + bound : worst <= bound,
             "after update %d, %s[%zu]: cuda %.8g cpu %.8g (bound %.3g; %zu of %zu elements past it)", step + 1,
             a->g.params[i].name, at, hb[at], ha[at], bound, wide, n);
    free(ha), free(hb);
  }
}

void test_step_held(void) {
  tt_err err;
  cuda_rng = 7755331ull;
  TT_TEST_BEGIN("cuda_step_held_state");
  for (int c = 0; c < 4 && !tt_test_current_failed; c++) {
    int fmt = c % 2 ? TT_STATE_INT8 : TT_STATE_BF16, adam = c / 2;
    test_net a, b;
    int rc = test_net_open_held(&a, cpu, fmt, adam ? TT_OPT_ADAMW : TT_OPT_SGD, &err);
    TT_CHECK(rc == 0, "cpu: %s", err.msg);
    int rc2 = rc ? -1 : test_net_open_held(&b, gpu, fmt, adam ? TT_OPT_ADAMW : TT_OPT_SGD, &err);
    TT_CHECK(rc2 == 0, "cuda: %s", err.msg);
    int held = 0;
    for (int i = 0; !rc2 && i < b.p.nbufs; i++) held += b.p.bufs[i].state == fmt;
    TT_CHECK(rc2 || held == 1 + adam, "%d buffers held as %s (want fc1.weight's state: %d)", held,
             tt_state_fmt_name((tt_state_fmt)fmt), 1 + adam);
    if (!rc && !rc2 && !tt_test_current_failed) {
      size_t cnt;
      float *input = test_rand_input(&a, &cnt);
      int32_t labels[6] = {0, 4, 2, 1, 3, 9};
      tt_opt_hparams hp;
      memset(&hp, 0, sizeof hp);
      if (!adam) hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f, hp.nesterov = 1, hp.weight_decay = 5e-4f;
      else hp.kind = TT_OPT_ADAMW, hp.lr = 0.01f, hp.beta1 = 0.9f, hp.beta2 = 0.999f, hp.eps = 1e-8f, hp.weight_decay = 0.01f;
#ifdef TT_CUDA_EMULATION
      size_t k0 = tt_emu_kernel_launches("cuda_lo_held_k");
#endif
      double gmax = 0.0;
      for (int step = 0; step < 2; step++) {
        TT_CHECK(tt_exec_micro_step_f32(&a.x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0 &&
                     tt_exec_micro_step_f32(&b.x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0,
                 "micro-step: %s", err.msg);
        if (!step) gmax = test_grad_scale(&a);
        TT_CHECK(tt_exec_update(&a.x, &hp, step + 1, 1.0f, NULL, &err) == 0 && tt_exec_update(&b.x, &hp, step + 1, 1.0f, NULL, &err) == 0,
                 "update: %s", err.msg);
        /* the neighbouring code of a stored moment moves the next step's weight by at most lr x the
         * code step x (SGD) the largest momentum, about the largest gradient, or (AdamW) ~1 */
        double code = fmt == TT_STATE_INT8 ? 2.0 / 127.0 : 1.0 / 256.0;
        double flip = step ? 2.0 * hp.lr * code * (adam ? 1.0 : gmax) : 0.0;
        /* and the gradients' own difference (1e-4 of the largest, as cuda_step_fp32 allows), which
         * SGD carries into the weights times lr (1 + momentum) per step */
        flip += adam ? 0.0 : 2.0 * hp.lr * 1e-4 * gmax * (step + 1);
        test_cmp_held(&a, &b, flip, adam ? hp.lr : 0.0, step);
      }
#ifdef TT_CUDA_EMULATION
      TT_CHECK(tt_emu_kernel_launches("cuda_lo_held_k") - k0 == 2, "%zu held-state launches in 2 steps (want 2: fc1.weight)",
               tt_emu_kernel_launches("cuda_lo_held_k") - k0);
#endif
      free(input);
    }
    test_net_close(&a); /* its flags say what was made, also when the open failed part way */
    if (!rc) test_net_close(&b);
  }
  TT_TEST_END();
}

#ifdef TT_CUDA_EMULATION
/* The call list's batch norm + ReLU pairs (calls.c's fusion table): a net of three batch norms
 * with `activation = relu` trains on the device bit for bit as with TINYTRAIN_FUSE=0 (2 steps of
 * SGD at micro-batch 6, fp32 and fp16: loss, every parameter and gradient, running statistics),
 * and the fused run launches no ReLU kernel of its own where the other launches six a micro-step. */
void test_step_bn_relu_fused(void) {
  static const char *text =
      "[net]\ninput = 3x8x8\nclasses = 5\n[train]\nbatch = 6\noptimizer = sgd\nlr = 0.1\nmomentum = 0.9\n"
      "[conv c1]\nfilters = 16\nsize = 3\nbias = false\n[bn b1]\nactivation = relu\n"
      "[conv c2]\nfilters = 16\nsize = 3\nbias = false\n[bn b2]\nactivation = relu\n[maxpool p1]\nsize = 2\n"
      "[conv c3]\nfilters = 16\nsize = 3\nbias = false\n[bn b3]\nactivation = relu\n[gap pool]\n[linear fc]\nout = 5\n";
  char path[] = "/tmp/tt_fuse_XXXXXX";
  int fd = mkstemp(path);
  TT_TEST_BEGIN("cuda_step_bn_relu_fused");
  TT_CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text), "writing %s", path);
  if (fd >= 0) close(fd);
  for (int di = 0; di < 2 && fd >= 0; di++) {
    tt_dtype dt = di ? TT_F16 : TT_F32;
    test_net a, b;
    tt_err err;
    int rc;
    size_t act[2][2];
    cuda_rng = 88172645463325252ull;
    setenv("TINYTRAIN_FUSE", "0", 1); /* read by lowering from the knobs (core/base/knobs.h) */
    tt_knobs_init(&err);
    rc = test_net_open(&a, path, gpu, dt, 6, 1, 0, TT_OPT_SGD, &err);
    unsetenv("TINYTRAIN_FUSE");
    tt_knobs_init(&err);
    TT_CHECK(rc == 0, "unfused: %s", err.msg);
    int rc2 = test_net_open(&b, path, gpu, dt, 6, 1, 0, TT_OPT_SGD, &err);
    TT_CHECK(rc2 == 0, "fused: %s", err.msg);
    if (!rc && !rc2) {
      size_t cnt;
      float *input = test_rand_input(&a, &cnt), sa[2], sb[2], *ha = NULL, *hb = NULL;
      int32_t labels[6] = {0, 4, 2, 1, 3, 2};
      tt_opt_hparams hp;
      memset(&hp, 0, sizeof hp);
      hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f;
      TT_CHECK(a.p.n_fused == 0 && b.p.n_fused > 0, "fused pairs in the call lists: unfused %d, fused %d", a.p.n_fused,
               b.p.n_fused);
      for (int step = 0; step < 2; step++) {
        int ova = 0, ovb = 0;
        test_net *nets[2] = {&a, &b};
        for (int k = 0; k < 2; k++) {
          size_t f0 = tt_emu_kernel_launches("cuda_ew_act_fwd_k"), b0 = tt_emu_kernel_launches("cuda_ew_act_bwd_k");
          tt_exec_stats(&nets[k]->x, NULL, 1, &err);
          TT_CHECK(tt_exec_micro_step_f32(&nets[k]->x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "%s step: %s",
                   k ? "fused" : "unfused", err.msg);
          TT_CHECK(gpu->sync(gpu) == 0, "%s", gpu->last_error(gpu));
          act[k][0] = tt_emu_kernel_launches("cuda_ew_act_fwd_k") - f0, act[k][1] = tt_emu_kernel_launches("cuda_ew_act_bwd_k") - b0;
        }
        TT_CHECK(act[0][0] == 3 && act[0][1] == 3 && act[1][0] == 0 && act[1][1] == 0,
                 "ReLU launches forward/backward: unfused %zu/%zu (want 3/3), fused %zu/%zu (want 0/0)", act[0][0], act[0][1],
                 act[1][0], act[1][1]);
        tt_exec_stats(&a.x, sa, 1, &err);
        tt_exec_stats(&b.x, sb, 1, &err);
        TT_CHECK(!memcmp(sa, sb, sizeof sa), "%s step %d: loss %.9g/%g unfused, %.9g/%g fused", test_dt_name(dt), step,
                 sa[0], sa[1], sb[0], sb[1]);
        for (int role = 1; role >= 0; role--) {
          for (int i = 0; i < a.g.nparams; i++) {
            const tt_param *pp = &a.g.params[i];
            if (role == 1 && !pp->trainable) continue;
            ha = (float *)realloc(ha, pp->numel * sizeof(float)), hb = (float *)realloc(hb, pp->numel * sizeof(float));
            TT_CHECK(ha && hb && !tt_exec_param_get(&a.x, i, role, ha, &err) && !tt_exec_param_get(&b.x, i, role, hb, &err) &&
                         !memcmp(ha, hb, pp->numel * sizeof(float)),
                     "%s step %d: %s%s differs with the fusion", test_dt_name(dt), step, role ? "grad." : "", pp->name);
          }
          if (role == 1) {
            TT_CHECK(tt_exec_update(&a.x, &hp, step + 1, 1.0f, &ova, &err) == 0, "update: %s", err.msg);
            TT_CHECK(tt_exec_update(&b.x, &hp, step + 1, 1.0f, &ovb, &err) == 0, "update: %s", err.msg);
          }
        }
      }
      free(ha), free(hb), free(input);
    }
    test_net_close(&a);
    test_net_close(&b);
  }
  if (fd >= 0) unlink(path);
  TT_TEST_END();
}
#endif

#ifdef TT_CUDA_EMULATION
/* Running calls of kind fn in a program's list. */
static int step_count_calls(const tt_program *p, int fn) {
  int n = 0;
  for (int i = 0; i < p->ncalls; i++) n += p->calls[i].fn == fn && p->calls[i].skip == TT_CALL_RUNS;
  return n;
}

/* A small ResNet (a stem, two identity blocks and a downsampling block, torchvision's BasicBlock:
 * bn2 -> add(., identity) -> relu) trained 2 steps of SGD at micro-batch 6 on backend be with
 * TINYTRAIN_FUSE=0 and =1: loss, every parameter and gradient bit for bit the same; the fused list
 * has the identity blocks' batch norm + add + ReLU as one call each way (the downsampling block's
 * too where the plan allows: there the batch norm next to the add is the shortcut's, and bn2's
 * output is the other input), and on the device the fused run launches an add kernel only for the
 * blocks it left apart. */
static void step_bn_add_relu_case(const char *path, tt_backend *be, tt_dtype dt) {
  test_net a, b;
  tt_err err;
  int rc, rc2, is_gpu = be == gpu;
  cuda_rng = 88172645463325252ull;
  setenv("TINYTRAIN_FUSE", "0", 1); /* read by lowering from the knobs (core/base/knobs.h) */
  tt_knobs_init(&err);
  rc = test_net_open(&a, path, be, dt, 6, 1, 0, TT_OPT_SGD, &err);
  unsetenv("TINYTRAIN_FUSE");
  tt_knobs_init(&err);
  TT_CHECK(rc == 0, "%s %s unfused: %s", be->name, test_dt_name(dt), err.msg);
  rc2 = test_net_open(&b, path, be, dt, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc2 == 0, "%s %s fused: %s", be->name, test_dt_name(dt), err.msg);
  if (!rc && !rc2) {
    size_t cnt;
    float *input = test_rand_input(&a, &cnt), sa[2], sb[2], *ha = NULL, *hb = NULL;
    int32_t labels[6] = {0, 4, 2, 1, 3, 2};
    tt_opt_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f;
    int nf = step_count_calls(&b.p, TT_CALL_BN_ADD_RELU_FWD);
    TT_CHECK(step_count_calls(&a.p, TT_CALL_BN_ADD_RELU_FWD) == 0 && step_count_calls(&a.p, TT_CALL_BN_ADD_RELU_BWD) == 0 &&
                 nf >= 2 && step_count_calls(&b.p, TT_CALL_BN_ADD_RELU_BWD) >= 2,
             "%s %s: bn_fwd_train_add_relu/bn_bwd_add_relu calls: unfused %d/%d (want 0/0), fused %d/%d (want 2 or 3 each)", be->name,
             test_dt_name(dt), step_count_calls(&a.p, TT_CALL_BN_ADD_RELU_FWD), step_count_calls(&a.p, TT_CALL_BN_ADD_RELU_BWD),
             step_count_calls(&b.p, TT_CALL_BN_ADD_RELU_FWD), step_count_calls(&b.p, TT_CALL_BN_ADD_RELU_BWD));
    for (int step = 0; step < 2; step++) {
      int ova = 0, ovb = 0;
      size_t adds[2];
      test_net *nets[2] = {&a, &b};
      for (int k = 0; k < 2; k++) {
        size_t a0 = tt_emu_kernel_launches("cuda_ew_add_k");
        tt_exec_stats(&nets[k]->x, NULL, 1, &err);
        TT_CHECK(tt_exec_micro_step_f32(&nets[k]->x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "%s step: %s",
                 k ? "fused" : "unfused", err.msg);
        TT_CHECK(be->sync(be) == 0, "%s", be->last_error(be));
        adds[k] = tt_emu_kernel_launches("cuda_ew_add_k") - a0;
      }
      if (is_gpu)
        TT_CHECK(adds[0] == 3 && adds[1] == 3 - (size_t)nf, "%s add launches a micro-step: unfused %zu (want 3), fused %zu (want %d)",
                 test_dt_name(dt), adds[0], adds[1], 3 - nf);
      tt_exec_stats(&a.x, sa, 1, &err);
      tt_exec_stats(&b.x, sb, 1, &err);
      TT_CHECK(!memcmp(sa, sb, sizeof sa), "%s %s step %d: loss %.9g/%g unfused, %.9g/%g fused", be->name, test_dt_name(dt),
               step, sa[0], sa[1], sb[0], sb[1]);
      for (int role = 1; role >= 0; role--) {
        for (int i = 0; i < a.g.nparams; i++) {
          const tt_param *pp = &a.g.params[i];
          if (role == 1 && !pp->trainable) continue;
          ha = (float *)realloc(ha, pp->numel * sizeof(float)), hb = (float *)realloc(hb, pp->numel * sizeof(float));
          TT_CHECK(ha && hb && !tt_exec_param_get(&a.x, i, role, ha, &err) && !tt_exec_param_get(&b.x, i, role, hb, &err) &&
                       !memcmp(ha, hb, pp->numel * sizeof(float)),
                   "%s %s step %d: %s%s differs with the fusion", be->name, test_dt_name(dt), step, role ? "grad." : "",
                   pp->name);
        }
        if (role == 1) {
          TT_CHECK(tt_exec_update(&a.x, &hp, step + 1, 1.0f, &ova, &err) == 0, "update: %s", err.msg);
          TT_CHECK(tt_exec_update(&b.x, &hp, step + 1, 1.0f, &ovb, &err) == 0, "update: %s", err.msg);
        }
      }
    }
    free(ha), free(hb), free(input);
  }
  test_net_close(&a); /* its flags say what was made, also when the open failed part way */
  if (!rc) test_net_close(&b);
}

/* The whole-network check of bn_fwd_train_add_relu and bn_bwd_add_relu: step_bn_add_relu_case on
 * the reference backend (fp32, bf16) and the emulated device (fp32, fp16). */
void test_step_bn_add_relu_fused(void) {
  static const char *text =
      "[net]\ninput = 3x8x8\nclasses = 5\n[train]\nbatch = 6\noptimizer = sgd\nlr = 0.1\nmomentum = 0.9\n"
      "[block basic]\nparams = c\n[conv conv1]\nfilters = $c\nsize = 3\nbias = false\n[bn bn1]\nactivation = relu\n"
      "[conv conv2]\nfilters = $c\nsize = 3\nbias = false\n[bn bn2]\n[add]\nfrom = bn2, in\n[relu]\n[end]\n"
      "[block down]\nparams = c\n[conv conv1]\nfilters = $c\nsize = 3\nstride = 2\nbias = false\n[bn bn1]\n"
      "activation = relu\n[conv conv2]\nfilters = $c\nsize = 3\nbias = false\n[bn bn2]\n[conv downsample.0]\n"
      "from = in\nfilters = $c\nsize = 1\nstride = 2\nbias = false\n[bn downsample.1]\n[add]\n"
      "from = bn2, downsample.1\n[relu]\n[end]\n"
      "[conv stem]\nfilters = 8\nsize = 3\nbias = false\n[bn stem_bn]\nactivation = relu\n"
      "[basic layer1]\nc = 8\nrepeat = 2\n[down layer2]\nc = 16\n[gap pool]\n[linear fc]\nout = 5\n";
  char path[] = "/tmp/tt_fuse_add_XXXXXX";
  int fd = mkstemp(path);
  TT_TEST_BEGIN("cuda_step_bn_add_relu_fused");
  TT_CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text), "writing %s", path);
  if (fd >= 0) close(fd);
  if (fd >= 0) {
    step_bn_add_relu_case(path, cpu, TT_F32);
    step_bn_add_relu_case(path, cpu, TT_BF16);
    step_bn_add_relu_case(path, gpu, TT_F32);
    step_bn_add_relu_case(path, gpu, TT_F16);
    unlink(path);
  }
  TT_TEST_END();
}
#endif

#ifdef TT_CUDA_EMULATION
/* A bf16 training program on the CUDA backend under layouts_16bit NHWC (TINYTRAIN_LAYOUT=nhwc)
 * plans NHWC between convolutions and trains as the NCHW program on the same backend and as the
 * reference does: the small CNN (a conv with bias at the layout change, grouped and depthwise
 * convs, batch norm, add, concat, max and average pooling, global average pooling, then flatten and
 * linear layers in NCHW), 2 steps of SGD
 * at micro-batch 6 on the emulated sm_80 (bf16 convolutions need 8.0). An fp32 program on the same
 * backend stays NCHW. */
void test_step_bf16_nhwc(void) {
  const char *recipe = "tests/fixtures/small_cnn.recipe";
  /* NHWC against NCHW on the same backend: the fp16 step test's 3e-2 (the same kernels but for the
   * layout: only summation orders differ). Against the reference, 1e-1: bf16 keeps 8 significant
   * bits (fp16 11), and the first conv's weight gradient, at the end of the bf16 backward chain,
   * differs from the reference's by up to ~19% of its largest element in the CUDA NCHW program as
   * well (3e-2 fails there: a bf16 property, not the layout's) */
  const double tol = 3e-2, tol_ref = 1e-1;
  size_t reserve = 0;
  char msg[512];
  tt_err err;
  test_net r, a, b;
  int old, rc[3];
  tt_backend *g80;
  TT_TEST_BEGIN("cuda_step_bf16_nhwc");
  cuda_rng = 88172645463325252ull;
  old = tt_emu_set_compute_capability(80);
  g80 = tt_cuda_backend_create(&reserve, NULL, msg, sizeof msg); /* sm_80 stays emulated for the test */
  TT_CHECK(g80 != NULL, "a backend on the emulated sm_80: %s", msg);
  if (!g80) {
    tt_emu_set_compute_capability(old);
    TT_TEST_END();
    return;
  }
  { /* fp32 on CUDA: NCHW throughout */
    tt_model m;
    tt_graph g;
    tt_program p;
    tt_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.micro_batch = 6, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1;
    int ok = !tt_recipe_load(recipe, &m, &err, NULL, NULL);
    ok = ok && !tt_graph_build(&m, &g, &err);
    ok = ok && !tt_lower(&g, &pol, g80, &p, &err);
    TT_CHECK(ok, "fp32 lowering on CUDA: %s", err.msg);
    if (ok) {
      TT_CHECK(p.n_nhwc == 0 && p.n_layout_convs == 0, "fp32 on CUDA planned %d NHWC activations", p.n_nhwc);
      tt_program_free(&p);
    }
    tt_graph_free(&g);
    tt_model_free(&m);
  }
  rc[0] = test_net_open(&r, recipe, cpu, TT_BF16, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc[0] == 0, "reference: %s", err.msg);
  /* layouts_16bit is read when lowering only: program a plans NHWC, as under TINYTRAIN_LAYOUT=nhwc,
   * program b NCHW, the default */
  g80->layouts_16bit = 1u << TT_LAYOUT_NHWC;
  rc[1] = test_net_open(&a, recipe, g80, TT_BF16, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc[1] == 0, "cuda NHWC: %s", err.msg);
  g80->layouts_16bit = 0;
  rc[2] = test_net_open(&b, recipe, g80, TT_BF16, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc[2] == 0, "cuda NCHW: %s", err.msg);
  if (!rc[0] && !rc[1] && !rc[2]) {
    int nhwc_steps = 0, conv_nhwc = 0, first_conv_changes = 0;
    for (int i = 0; i < a.p.nsteps; i++) {
      const tt_step *st = &a.p.steps[i];
      nhwc_steps += (st->flags & TT_SF_NHWC) != 0;
      if (st->kind == TT_L_CONV && st->op == TT_S_FWD) {
        conv_nhwc += st->a.conv.layout_y == TT_LAYOUT_NHWC;
        if (st->name && !strcmp(st->name, "conv1"))
          first_conv_changes = st->a.conv.layout_x == TT_LAYOUT_NCHW && st->a.conv.layout_y == TT_LAYOUT_NHWC;
      }
    }
    printf("  bf16 on CUDA: %d NHWC activations, %d layout-changing convolutions, %d NHWC steps\n", a.p.n_nhwc,
           a.p.n_layout_convs, nhwc_steps);
    TT_CHECK(a.p.n_nhwc > 0 && a.p.n_layout_convs >= 1 && nhwc_steps > 0 && conv_nhwc >= 4 && first_conv_changes,
             "bf16 on CUDA: %d NHWC activations, %d layout changes, %d NHWC steps, %d NHWC conv outputs, conv1 %s",
             a.p.n_nhwc, a.p.n_layout_convs, nhwc_steps, conv_nhwc, first_conv_changes ? "NCHW -> NHWC" : "not NCHW -> NHWC");
    TT_CHECK(b.p.n_nhwc == 0, "layouts_16bit 0: %d NHWC activations", b.p.n_nhwc);
    size_t cnt;
    float *input = test_rand_input(&a, &cnt), sr[2], sa[2], sb[2];
    int32_t labels[6] = {0, 4, 2, 1, 3, 2};
    tt_opt_hparams hp;
    test_noise nz = {NULL, 0}, nz2 = {NULL, 0};
    memset(&hp, 0, sizeof hp);
    hp.kind = TT_OPT_SGD, hp.lr = 0.1f, hp.momentum = 0.9f, hp.nesterov = 1, hp.weight_decay = 5e-4f;
    for (int step = 0; step < 2 && !tt_test_current_failed; step++) {
      int ov[3];
      test_net *nets[3] = {&r, &a, &b};
      float *stats[3] = {sr, sa, sb};
      for (int k = 0; k < 3; k++) {
        tt_exec_stats(&nets[k]->x, NULL, 1, &err);
        TT_CHECK(tt_exec_micro_step_f32(&nets[k]->x, input, labels, 0, (uint64_t)step, 1.0f / 6, &err) == 0, "step (%d): %s",
                 k, err.msg);
        tt_exec_stats(&nets[k]->x, stats[k], 1, &err);
      }
      printf("  bf16 step %d: loss reference %.6f, cuda NHWC %.6f, cuda NCHW %.6f\n", step, sr[0] / 6, sa[0] / 6, sb[0] / 6);
      TT_CHECK(fabs(sr[0] - sa[0]) <= tol * fabs(sr[0]) && fabs(sb[0] - sa[0]) <= tol * fabs(sb[0]),
               "loss: reference %.7g, NHWC %.7g, NCHW %.7g", sr[0], sa[0], sb[0]);
      test_cmp_params(&r, &b, 1, tol_ref, 0.0, NULL, "NCHW against the reference: gradient");
      test_cmp_params(&r, &a, 1, tol_ref, 0.0, &nz, "NHWC against the reference: gradient");
      test_cmp_params(&b, &a, 1, tol, 0.0, &nz2, "NHWC against NCHW: gradient");
      for (int k = 0; k < 3; k++)
        TT_CHECK(tt_exec_update(&nets[k]->x, &hp, step + 1, 1.0f, &ov[k], &err) == 0, "update (%d): %s", k, err.msg);
      test_cmp_params(&r, &a, 0, tol_ref, 0.0, &nz, "NHWC against the reference: after SGD");
      test_cmp_params(&b, &a, 0, tol, 0.0, &nz2, "NHWC against NCHW: after SGD");
    }
    test_noise_free(&nz), test_noise_free(&nz2);
    free(input);
  }
  test_net_close(&r);
  test_net_close(&a);
  test_net_close(&b);
  g80->destroy(g80);
  tt_emu_set_compute_capability(old);
  TT_TEST_END();
}
#endif

#ifdef TT_CUDA_EMULATION
/* The next batch's copy overlaps the step (backend.h: event_record, upload_after; exec.c): the
 * training program's input buffers are persistent on the CUDA backend (transient on the CPU), and
 * the copy of batch k+1 waits only for step k's last reader of them (the loss), not for the whole
 * step. The emulated device runs queued work only when something waits for it, and then only what
 * that wait depends on: after steps 2 and 3 are queued back to back, waiting for batch 3's copy
 * must have run step 2's forward pass and loss but not its backward (fewer emulated threads than
 * one whole micro-step), where a copy ordered after all the compute work would have run all of it.
 * Then every step must have read its own batch: the summed loss of 4 different batches equals the
 * CPU backend's. */
void test_batch_overlap(void) {
  tt_err err;
  test_net a, b;
  TT_TEST_BEGIN("cuda_batch_copy_overlaps_the_step");
  int rc = test_net_open(&a, "tests/fixtures/small_cnn.recipe", cpu, TT_F32, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc == 0, "cpu: %s", err.msg);
  int rc2 = test_net_open(&b, "tests/fixtures/small_cnn.recipe", gpu, TT_F32, 6, 1, 0, TT_OPT_SGD, &err);
  TT_CHECK(rc2 == 0, "cuda: %s", err.msg);
  if (!rc && !rc2) {
    const tt_node *in = &a.g.nodes[0];
    size_t img = (size_t)6 * in->c * in->h * in->w;
    uint8_t *images = (uint8_t *)malloc(4 * img);
    int32_t labels[4 * 6];
    float sa[2], sb[2];
    tt_emu_counts e0, e1, e2, e3, e4;
    for (size_t i = 0; i < 4 * img; i++) images[i] = (uint8_t)test_rand(0, 255.9f);
    for (int i = 0; i < 24; i++) labels[i] = (i * 7 + i / 6) % 5;
    TT_CHECK(b.p.bufs[b.p.input_u8].persistent && b.p.bufs[b.p.labels].persistent && b.x.in_ev && b.x.in_last >= 0,
             "the CUDA training program's input buffers are not persistent, or no copy event (in_ev %p)", b.x.in_ev);
    TT_CHECK(!a.p.bufs[a.p.input_u8].persistent, "the CPU program's uint8 batch is persistent (it is read in place there)");
    tt_exec_stats(&a.x, NULL, 1, &err);
    tt_exec_stats(&b.x, NULL, 1, &err);
    for (int k = 0; k < 2; k++) TT_CHECK(tt_exec_micro_step(&a.x, images + k * img, labels + 6 * k, 0, (uint64_t)k, 1.0f / 6, &err) == 0, "cpu: %s", err.msg);
    TT_CHECK(tt_exec_micro_step(&b.x, images, labels, 0, 0, 1.0f / 6, &err) == 0 && gpu->sync(gpu) == 0, "cuda step 0: %s", err.msg);
    tt_emu_get_counts(&e0);
    TT_CHECK(tt_exec_micro_step(&b.x, images + img, labels + 6, 0, 1, 1.0f / 6, &err) == 0 && gpu->sync(gpu) == 0,
             "cuda step 1: %s", err.msg);
    tt_emu_get_counts(&e1);
    size_t per_step = e1.threads - e0.threads;
    tt_emu_get_counts(&e2);
    TT_CHECK(tt_exec_micro_step(&b.x, images + 2 * img, labels + 12, 0, 2, 1.0f / 6, &err) == 0, "cuda step 2: %s", err.msg);
    int slot = b.x.stage_next; /* the staging slot batch 3 goes through */
    TT_CHECK(tt_exec_micro_step(&b.x, images + 3 * img, labels + 18, 0, 3, 1.0f / 6, &err) == 0, "cuda step 3: %s", err.msg);
    TT_CHECK(gpu->event_sync(gpu, b.x.stage_ev[slot]) == 0, "waiting for batch 3's copy: %s", gpu->last_error(gpu));
    tt_emu_get_counts(&e3);
    TT_CHECK(gpu->sync(gpu) == 0, "sync: %s", gpu->last_error(gpu));
    tt_emu_get_counts(&e4);
    printf("  one micro-step: %zu emulated threads; done when batch 3 had been copied: %zu; both steps: %zu\n", per_step,
           e3.threads - e2.threads, e4.threads - e2.threads);
    TT_CHECK(per_step > 0 && e3.threads - e2.threads > 0 && e3.threads - e2.threads < per_step,
             "batch 3's copy completed after %zu emulated threads of step 2 (of %zu): it %s", e3.threads - e2.threads, per_step,
             e3.threads - e2.threads >= per_step ? "waited for the whole step" : "did not wait for step 2's forward pass");
    TT_CHECK(e4.threads - e2.threads == 2 * per_step, "steps 2 and 3 ran %zu threads, want %zu", e4.threads - e2.threads,
             2 * per_step);
    for (int k = 2; k < 4; k++) TT_CHECK(tt_exec_micro_step(&a.x, images + k * img, labels + 6 * k, 0, (uint64_t)k, 1.0f / 6, &err) == 0, "cpu: %s", err.msg);
    TT_CHECK(tt_exec_stats(&a.x, sa, 0, &err) == 0 && tt_exec_stats(&b.x, sb, 0, &err) == 0, "stats: %s", err.msg);
    TT_CHECK(fabs(sa[0] - sb[0]) <= 1e-4 * fabs(sa[0]) && sa[1] == sb[1], "4 batches' loss/correct: cpu %.7g/%g cuda %.7g/%g",
             sa[0], sa[1], sb[0], sb[1]);
    free(images);
  }
  test_net_close(&a);
  test_net_close(&b);
  TT_TEST_END();
}
#endif

#ifdef TT_CUDA_EMULATION
/* cudnnFind*Ex at setup (backend.h's tune; cuda_conv.cu): a net's executor times each convolution
 * direction over the arena's transient region, and the emulated cuDNN times its algorithms in the
 * reverse of its heuristic ranking, so a timed choice differs from the heuristic one somewhere.
 * Checked: TINYTRAIN_CUDA_FIND=0 makes no Find call, the default makes some; a micro-step then runs
 * other algorithms than the heuristic ones, each within its planned workspace (the emulation fails
 * a call whose workspace is short) and on operands Find left intact (the emulated Find writes NaN
 * over its output operand: had it been live data the loss would show it), with the CPU's loss; and
 * on a backend created with TINYTRAIN_CUDA_DETERMINISTIC=1 no non-deterministic algorithm runs (the
 * emulation's backward-data 0, backward-filter 0 and 3). */
float test_find_step(tt_backend *be, unsigned used[3], tt_err *err) {
  test_net t;
  float st[2] = {-1, -1};
  cuda_rng = 88172645463325252ull; /* the same input for every backend */
  int rc = test_net_open(&t, "tests/fixtures/small_cnn.recipe", be, TT_F32, 6, 1, 0, TT_OPT_SGD, err);
  TT_CHECK(rc == 0, "%s: %s", be->name, err->msg);
  if (!rc) {
    size_t cnt;
    float *input = test_rand_input(&t, &cnt);
    int32_t labels[6] = {0, 4, 2, 1, 3, 2};
    for (int d = 0; d < 3; d++) tt_emu_conv_algos_used(d, 1);
    tt_exec_stats(&t.x, NULL, 1, err);
    TT_CHECK(tt_exec_micro_step_f32(&t.x, input, labels, 0, 0, 1.0f / 6, err) == 0 && tt_exec_stats(&t.x, st, 1, err) == 0,
             "%s step: %s", be->name, err->msg);
    for (int d = 0; d < 3; d++) used[d] = tt_emu_conv_algos_used(d, 1);
    free(input);
  }
  test_net_close(&t);
  return st[0];
}

void test_conv_find(void) {
  tt_err err;
  unsigned uc[3], uh[3], uf[3], ud[3];
  TT_TEST_BEGIN("cuda_conv_find");
  float lc = test_find_step(cpu, uc, &err);
  tt_cuda_set_tf32(gpu, 0); /* forgets the algorithms earlier tests' executors timed for these shapes */
  size_t f0 = tt_emu_conv_find_calls(), f1 = f0;
  float lh = 0.0f;
  { /* a backend created with TINYTRAIN_CUDA_FIND=0 (its knob) */
    size_t reserve = 0;
    char msg[256];
    tt_backend_knobs kf;
    tt_backend_knobs_default(&kf);
    kf.cuda_find = 0;
    tt_backend *gf = tt_cuda_backend_create(&reserve, &kf, msg, sizeof msg);
    TT_CHECK(gf != NULL, "a backend without Find: %s", msg);
    f0 = tt_emu_conv_find_calls();
    if (gf) lh = test_find_step(gf, uh, &err);
    f1 = tt_emu_conv_find_calls();
    if (gf) gf->destroy(gf);
  }
  float lf = test_find_step(gpu, uf, &err);
  size_t f2 = tt_emu_conv_find_calls();
  printf("  algorithms run (bits per direction fwd/bwd-data/bwd-filter): heuristic %x/%x/%x, timed %x/%x/%x; %zu Find calls\n",
         uh[0], uh[1], uh[2], uf[0], uf[1], uf[2], f2 - f1);
  TT_CHECK(f1 == f0 && f2 > f1, "Find calls: %zu with TINYTRAIN_CUDA_FIND=0 (want 0), %zu by default (want some)", f1 - f0,
           f2 - f1);
  TT_CHECK(uh[0] != uf[0] || uh[1] != uf[1] || uh[2] != uf[2], "the timed choices are the heuristic ones everywhere");
  TT_CHECK(fabs(lh - lc) <= 1e-4 * fabs(lc) && fabs(lf - lc) <= 1e-4 * fabs(lc), "loss: cpu %.7g, heuristic %.7g, timed %.7g",
           lc, lh, lf);
  {
    size_t reserve = 0;
    char msg[256];
    tt_backend_knobs kd;
    tt_backend_knobs_default(&kd);
    kd.cuda_deterministic = 1; /* TINYTRAIN_CUDA_DETERMINISTIC=1 */
    tt_backend *gd = tt_cuda_backend_create(&reserve, &kd, msg, sizeof msg);
    TT_CHECK(gd != NULL, "a deterministic backend: %s", msg);
    if (gd) {
      float ld = test_find_step(gd, ud, &err);
      printf("  deterministic: %x/%x/%x\n", ud[0], ud[1], ud[2]);
      TT_CHECK(ud[2] && ud[1] && !(ud[1] & 1u) && !(ud[2] & (1u | 8u)),
               "TINYTRAIN_CUDA_DETERMINISTIC=1 ran non-deterministic algorithms: bwd-data %x, bwd-filter %x", ud[1], ud[2]);
      TT_CHECK(fabs(ld - lc) <= 1e-4 * fabs(lc), "deterministic loss %.7g, cpu %.7g", ld, lc);
      gd->destroy(gd);
    }
  }
  TT_TEST_END();
}

/* TINYTRAIN_CUDA_CONV_LOG=1 (the backend's knob; cuda_conv.cu): at setup one stderr line per
 * convolution shape, dtype and direction, naming the API, the algorithm, the math type, the
 * workspace and how long choosing took; with Find and without. The lines are read back through a
 * temporary file standing in for stderr. */
static int test_conv_log_run(int find, char *text, size_t cap, tt_err *err) {
  size_t reserve = 0;
  char msg[256];
  unsigned used[3];
  tt_backend_knobs k;
  tt_backend_knobs_default(&k);
  k.cuda_conv_log = 1, k.cuda_find = find;
  tt_backend *g = tt_cuda_backend_create(&reserve, &k, msg, sizeof msg);
  TT_CHECK(g != NULL, "a backend with the log: %s", msg);
  if (!g) return -1;
  FILE *f = tmpfile();
  int saved = dup(2);
  fflush(stderr);
  if (f) dup2(fileno(f), 2);
  test_find_step(g, used, err);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  g->destroy(g);
  text[0] = 0;
  if (f) {
    rewind(f);
    text[fread(text, 1, cap - 1, f)] = 0;
    fclose(f);
  }
  return f ? 0 : -1;
}

void test_conv_log(void) {
  tt_err err;
  static char text[32768];
  TT_TEST_BEGIN("cuda_conv_log");
  for (int find = 1; find >= 0; find--) {
    if (test_conv_log_run(find, text, sizeof text, &err)) continue;
    int lines = 0, dirs[3] = {0, 0, 0}, dup = 0;
    for (char *l = text, *e; l && *l; l = e ? e + 1 : NULL) {
      e = strchr(l, '\n');
      if (e) *e = 0;
      if (strncmp(l, "TINYTRAIN_CUDA_CONV_LOG: ", 25)) continue;
      if (lines < 3) printf("  %s\n", l);
      lines++;
      dirs[0] += !strncmp(l + 25, "fwd ", 4), dirs[1] += !strncmp(l + 25, "bwd-data ", 9);
      dirs[2] += !strncmp(l + 25, "bwd-filter ", 11);
      TT_CHECK(strstr(l, "legacy API") && strstr(l, ", algo ") && strstr(l, ", math ") && strstr(l, " workspace ") &&
                   strstr(l, " ms") && strstr(l, find ? "cudnnFind" : "TINYTRAIN_CUDA_FIND=0"),
               "find %d: a line without API, algorithm, math, workspace, time or how: %s", find, l);
      /* once per shape and direction: no line repeats up to the time it took */
      char key[512];
      snprintf(key, sizeof key, "%.*s", (int)(strstr(l, ": legacy") ? strstr(l, ": legacy") - l : 0), l);
      for (char *m = text; m < l && !dup; m += strlen(m) + 1)
        dup = key[0] && !strncmp(m, key, strlen(key)) && m[strlen(key)] == ':';
    }
    printf("  find %d: %d lines (fwd %d, bwd-data %d, bwd-filter %d)\n", find, lines, dirs[0], dirs[1], dirs[2]);
    TT_CHECK(dirs[0] > 0 && dirs[1] > 0 && dirs[2] > 0 && dirs[0] + dirs[1] + dirs[2] == lines,
             "find %d: lines per direction %d/%d/%d of %d", find, dirs[0], dirs[1], dirs[2], lines);
    TT_CHECK(!dup, "find %d: a shape and direction logged twice", find);
  }
  TT_TEST_END();
}
#endif

#endif
