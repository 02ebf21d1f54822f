/* tests/runtime/test_equiv.c — the equivalences the scheduler's techniques hold (DESIGN.md, "Equivalences
 * the tests hold"):
 *   1. checkpointed training == plain training, bit-exact on CPU fp32 (batch norm + dropout);
 *   2. k accumulated micro-batches of m == one batch of k*m (no batch norm; SGD and Adam);
 *   1b. the same in bf16 autocast (bit-exact too: the same kernels on the same bf16 values);
 *   3. fp16 and bf16 autocast track fp32 on Fashion-MNIST: tests/runtime/test_precision.c;
 *   4. the dynamic loss scaler, alone and with an injected overflow;
 *   5. a tiny Vision Transformer on the ref and cpu backends: recompute == plain (bit-exact), the
 *      fused attention form == kept probabilities, k x m accumulation == k*m, and training
 *      reduces the loss.
 * 1, 2 and 4 also with [train] clip_norm and the decay rule. Helpers shared with test_policy and
 * test_precision: tests/compile/policy_util.h. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/data/data.h"
#include "core/runtime/exec.h"
#include "core/compile/graph.h"
#include "core/runtime/lossscale.h"
#include "core/compile/recipe.h"
#include "core/compile/program.h"
#include "core/compile/policy.h"
#include "kernels/backend.h"
#include "tests/tt_test.h"
#include "tests/compile/policy_util.h"

/* Every non-cut node recomputed (what recompute = all does). */
static void rec_all(const tt_graph *g, unsigned char *rec) {
  int n = g->nnodes;
  int *unit_of = (int *)malloc(sizeof(int) * (size_t)n);
  memset(rec, 0, (size_t)n);
  tt_recompute_units(g, unit_of);
  for (int v = 1; v < n - 1; v++)
    if (unit_of[v + 1] == unit_of[v]) rec[v] = 1;
  free(unit_of);
}

static int count_flag(const tt_program *p, int flag) {
  int c = 0;
  for (int i = 0; i < p->nsteps; i++) c += (p->steps[i].flags & flag) != 0;
  return c;
}

/* All parameter state (value, gradient, optimizer states where present), concatenated. */
static size_t state_floats(const tt_graph *g) {
  size_t t = 0;
  for (int i = 0; i < g->nparams; i++) t += 4 * g->params[i].numel;
  return t;
}
static int snapshot(tt_exec *x, float *out, int roles, tt_err *e) {
  const tt_graph *g = x->g;
  size_t off = 0;
  for (int i = 0; i < g->nparams; i++)
    for (int role = 0; role < roles; role++) {
      size_t n = g->params[i].numel;
      if (tt_exec_param_get(x, i, role, out + off, e)) memset(out + off, 0, n * sizeof(float));
      off += n;
    }
  return 0;
}

/* max|a-b| / max|b| over one tensor */
static double rel_err(const float *a, const float *b, size_t n) {
  double md = 0.0, mb = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (isnan(d)) d = INFINITY;
    if (d > md) md = d;
    if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
  }
  return mb > 0.0 ? md / mb : md;
}

/* The true gradient norm the last update clipped with: the clip step's sum of squares (of the
 * raw accumulators) times grad_unscale; -1 when the program has no clip step. */
static double last_clip_norm(tt_exec *x, const tt_program *p, float unscale) {
  for (int i = p->micro_end; i < p->nsteps; i++)
    if (p->steps[i].op == TT_S_CLIP) {
      float v = 0.0f;
      if (x->be->download(x->be, &v, tt_exec_ptr(x, p, p->steps[i].out[TT_CLIP_SUMSQ]), sizeof v)) return -1.0;
      return sqrt((double)v) * unscale;
    }
  return -1.0;
}
static double clip_norm_min; /* the smallest last_clip_norm of the runs since it was reset (1e300) */

/* ======================================================================== 1. checkpointing */

/* A stem, then residual blocks with batch norm and dropout inside (so recomputing a block
 * re-runs both), max-pool, linear. Deep enough that saved activations outweigh the CPU
 * backend's im2col workspace, so checkpointing shrinks the arena. */

#define CK_MB 8
#define CK_ACCUM 2
#define CK_STEPS 3

static int ck_compact; /* ck_run plans with compact saves (policy.compact) */
static const unsigned char *ck_sel; /* and with policy.compact_sel (the per-tensor search's; NULL: every value) */
static tt_dtype ck_dt = TT_F32; /* ck_run's activation dtype */
static int ck_accum = CK_ACCUM; /* ck_run's micro-steps per update (1: its gradients may be transient) */

/* Runs CK_STEPS optimizer steps (under the sanitizers 2: the first, which starts the momentum, and
 * one that uses it; the code paths of every later step); writes the final state and loss
 * statistics. */
static int ck_run(const net *n, tt_backend *be, const unsigned char *rec, const uint8_t *imgs, const int32_t *labs,
                  float *state, float stats[2], tt_program *prog_out, tt_err *e) {
  tt_program p;
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = CK_MB, pol.accum_steps = ck_accum, pol.act_dtype = ck_dt, pol.inplace = 1;
  pol.recompute = (unsigned char *)rec, pol.training = 1, pol.compact = ck_compact;
  pol.compact_sel = rec ? ck_sel : NULL; /* the plain run: no compact saves unless ck_compact */
  if (tt_lower(&n->g, &pol, be, &p, e)) return -1;
  if (tt_program_plan(&p, e)) {
    tt_program_free(&p);
    return -1;
  }
  tt_exec x;
  if (tt_exec_create(&x, &n->g, &p, NULL, be, 99, e)) {
    tt_program_free(&p);
    return -1;
  }
  int rc = tt_exec_init_params(&x, 1234, e);
  if (!rc) rc = tt_exec_stats(&x, NULL, 1, e); /* the arena is not zeroed */
  tt_opt_hparams hp;
  memset(&hp, 0, sizeof hp);
  hp.kind = TT_OPT_SGD, hp.lr = 0.05f, hp.momentum = 0.9f, hp.weight_decay = 5e-4f, hp.nesterov = 1;
  hp.clip_norm = n->m.train.clip_norm; /* the recipe's, with its decay rule in the program */
  size_t per = (size_t)CK_MB * 144;
  const int nsteps = tt_test_sanitized() ? 2 : CK_STEPS;
  for (int s = 0; s < nsteps && !rc; s++) {
    for (int k = 0; k < ck_accum && !rc; k++) {
      int b = s * ck_accum + k;
      rc = tt_exec_micro_step(&x, imgs + (size_t)b * per, labs + (size_t)b * CK_MB, k, (uint64_t)s,
                              1.0f / (float)(CK_MB * ck_accum), e);
    }
    int of = 0;
    if (!rc) rc = tt_exec_update(&x, &hp, s + 1, 1.0f, &of, e);
    double cn = hp.clip_norm > 0.0f && !rc ? last_clip_norm(&x, &p, 1.0f) : 1e300;
    if (cn < clip_norm_min) clip_norm_min = cn;
  }
  if (!rc) rc = snapshot(&x, state, 4, e);
  if (!rc) rc = tt_exec_stats(&x, stats, 0, e);
  tt_exec_destroy(&x);
  if (prog_out && !rc) *prog_out = p;
  else tt_program_free(&p);
  return rc;
}

/* Trains with recompute set rec and compares with the plain run (state s_plain, loss
 * statistics st_plain, program pp): some node dropped, recompute steps in the program, a
 * smaller arena, and every parameter, gradient and optimizer state bit for bit. */
static int ck_no_smaller; /* the variant's arena need not be smaller than plain's (ck_check_variant) */

static void ck_check_variant(const net *n, tt_backend *be, const unsigned char *rec, const char *vn, const uint8_t *imgs,
                             const int32_t *labs, const float *s_plain, const float *st_plain, const tt_program *pp) {
  tt_err e;
  tt_program pr;
  size_t sf = state_floats(&n->g);
  float *s_rec = (float *)calloc(sf, sizeof(float)), st_rec[2];
  int nrec = 0;
  for (int v = 0; v < n->g.nnodes; v++) nrec += rec[v];
  TT_CHECK(nrec > 0, "%s: the plan recomputes no node", vn);
  if (ck_run(n, be, rec, imgs, labs, s_rec, st_rec, &pr, &e)) {
    TT_CHECK(0, "%s run: %s", vn, e.msg);
    free(s_rec);
    return;
  }
  int nrs = count_flag(&pr, TT_SF_RECOMPUTE), napply = count_flag(&pr, TT_SF_BN_APPLY), bn_rec = 0, bn_train = 0;
  for (int i = 0; i < pr.nsteps; i++) { /* recomputed batch norms: from saved statistics, or re-run whole */
    const tt_step *st = &pr.steps[i];
    if (st->op != TT_S_FWD || st->kind != TT_L_BN || !(st->flags & TT_SF_RECOMPUTE)) continue;
    bn_rec++;
    if (!(st->flags & TT_SF_BN_APPLY)) bn_train++;
    else {
      int mb = st->in[TT_BN_APPLY_MEAN];
      const tt_step *w = NULL; /* the forward step that wrote them */
      for (int j = 0; j < i && !w; j++)
        if (pr.steps[j].op == TT_S_FWD && pr.steps[j].node == st->node && !(pr.steps[j].flags & TT_SF_RECOMPUTE))
          w = &pr.steps[j];
      TT_CHECK(w && w->op == TT_S_FWD && w->node == st->node && !(w->flags & TT_SF_RECOMPUTE) &&
                   w->out[TT_BN_SAVE_MEAN] == mb && w->out[TT_BN_SAVE_INVSTD] == st->in[TT_BN_APPLY_INVSTD] && st->nout == 1,
               "%s: batch norm '%s' rebuilt from statistics other than its forward's", vn, st->name);
    }
  }
  printf("  %s: %d nodes marked, %d recompute steps (%d batch norms: %d from saved stats), arena %zu B vs plain %zu B\n", vn,
         nrec, nrs, bn_rec, napply, pr.arena_bytes, pp->arena_bytes);
  TT_CHECK(nrs > 0, "%s: the program has no TT_SF_RECOMPUTE step", vn);
  /* issue 26: with bn_apply every recomputed batch norm reuses the forward's statistics (its running
   * statistics then updated once, by the forward: the parameter comparison below holds them) */
  TT_CHECK(!be->bn_apply || bn_train == 0, "%s: %d of %d recomputed batch norms re-ran the training forward", vn, bn_train,
           bn_rec);
  TT_CHECK(napply == pr.n_bn_applied, "%s: %d TT_SF_BN_APPLY steps, n_bn_applied %d", vn, napply, pr.n_bn_applied);
  /* dropping every value backward reads, op by op, cascades: the first backward step recomputes
   * the whole forward pass from the image (no kept value to start from), so only "no larger",
   * but for the alignment of the rebuilt batch norms' statistics, which sit with the persistent
   * buffers (lower.c: small, long-lived; [c] floats each, aligned to the backend's 256 bytes) */
  size_t kept_stats = 0;
  for (int i = 0; i < pr.nbufs; i++)
    if (pr.bufs[i].persistent && pr.bufs[i].cls == TT_BC_ACTIVATIONS) kept_stats += (pr.bufs[i].bytes + pr.align - 1) / pr.align * pr.align;
  if (ck_no_smaller)
    TT_CHECK(pr.arena_bytes <= pp->arena_bytes + kept_stats, "%s: arena %zu is larger than plain %zu (+ %zu B of kept statistics)",
             vn, pr.arena_bytes, pp->arena_bytes, kept_stats);
  else
    TT_CHECK(pr.arena_bytes < pp->arena_bytes, "%s: arena %zu is not smaller than plain %zu", vn, pr.arena_bytes,
             pp->arena_bytes);
  TT_CHECK(memcmp(st_plain, st_rec, sizeof st_rec) == 0, "%s: loss statistics differ: %.9g/%g vs %.9g/%g", vn,
           (double)st_plain[0], (double)st_plain[1], (double)st_rec[0], (double)st_rec[1]);
  size_t off = 0;
  for (int i = 0; i < n->g.nparams; i++) {
    for (int role = 0; role < 4; role++) {
      size_t k = n->g.params[i].numel;
      if (memcmp(s_plain + off, s_rec + off, k * sizeof(float))) {
        TT_CHECK(0, "%s: parameter '%s' role %d differs (rel %.3g)", vn, n->g.params[i].name, role,
                 rel_err(s_rec + off, s_plain + off, k));
      }
      off += k;
    }
  }
  /* the running statistics did move (so the comparison above means something) */
  for (int i = 0; i < n->g.nparams; i++)
    if (n->g.params[i].role == TT_PR_BN_MEAN) {
      size_t o2 = 0;
      for (int j = 0; j < i; j++) o2 += 4 * n->g.params[j].numel;
      int moved = 0;
      for (size_t k = 0; k < n->g.params[i].numel; k++) moved |= s_plain[o2 + k] != 0.0f;
      TT_CHECK(moved, "running mean of '%s' never moved", n->g.params[i].name);
    }
  tt_program_free(&pr);
  free(s_rec);
}

/* The comparisons' inputs: CK_STEPS x CK_ACCUM micro-batches of CK_MB 12x12 images and labels
 * in [0, 5), the same bytes for every case (seed 42). */
static void ck_data(uint8_t **imgs, int32_t **labs) {
  int nb = CK_STEPS * CK_ACCUM;
  size_t per = (size_t)CK_MB * 144;
  tt_test_rng r = {42};
  *imgs = (uint8_t *)malloc(per * nb);
  *labs = (int32_t *)malloc(sizeof(int32_t) * CK_MB * nb);
  for (size_t i = 0; i < per * nb; i++) (*imgs)[i] = (uint8_t)(tt_test_rng_next(&r) & 0xff);
  for (int i = 0; i < CK_MB * nb; i++) (*labs)[i] = (int32_t)(tt_test_rng_next(&r) % 5);
}

/* Asserts that a one-hop plan (tt_recompute_add_cheap, local 0) dropped what it should: some
 * values, only memory-bound ones, and in conv -> BN -> ReLU the ReLU's value with the
 * convolution's output kept (the form issue 26 asks for); a local plan (local 1): some values,
 * a convolution's output among them on a net with residual blocks or in a chain; the policy
 * search's choice (local 2): some conv -> BN -> ReLU keeping the convolution's output alone. */
static void ck_check_cheap(const tt_graph *g, const unsigned char *rec, int local, int marked) {
  unsigned char *reads = (unsigned char *)calloc((size_t)g->nnodes, 1);
  int relu_kept_conv = 0, convs = 0;
  tt_recompute_bwd_reads_all(g, reads);
  if (marked < 0) { /* count the values dropped that backward reads */
    marked = 0;
    for (int v = 1; v < g->nnodes; v++)
      if (rec[v] && reads[v]) marked++;
  }
  for (int v = 1; v < g->nnodes; v++) {
    const tt_node *x = &g->nodes[v];
    if (rec[v] && reads[v] && (x->kind == TT_L_CONV || x->kind == TT_L_LINEAR)) convs++;
    if (x->kind != TT_L_RELU || g->nodes[x->in[0]].kind != TT_L_BN) continue;
    int bn = x->in[0], c = g->nodes[bn].in[0];
    if (g->nodes[c].kind == TT_L_CONV && rec[v] && rec[bn] && !rec[c]) relu_kept_conv++;
  }
  TT_CHECK(marked > 0, "%s plan dropped nothing (%d)", local ? "local" : "one-hop", marked);
  if (local == 2)
    TT_CHECK(relu_kept_conv > 0, "the chosen plan keeps no conv -> BN -> ReLU as the conv output alone");
  else if (!local) TT_CHECK(convs == 0 && relu_kept_conv > 0, "one-hop plan: %d conv/linear outputs dropped, %d conv -> BN -> ReLU "
                       "with only the conv output kept", convs, relu_kept_conv);
  else TT_CHECK(convs > 0, "local plan dropped no convolution's or linear layer's output");
  if (getenv("CK_DEBUG"))
    for (int v = 1; v < g->nnodes; v++)
      if (rec[v]) printf("    dropped %s%s\n", g->model->layers[v].name, reads[v] ? "" : " (unread)");
  printf("  %s plan: %d values dropped, %d conv/linear outputs, %d conv -> BN -> ReLU keep only the conv output\n",
         local == 2 ? "chosen" : local ? "local" : "one-hop", marked, convs, relu_kept_conv);
  free(reads);
}

/* The plain run of recipe text, then each variant's plan (0: the test's every-non-cut-node
 * plan, 1: sqrt(n), 2: the scheduler's `all`, 3: the scheduler's cheapest plan freeing a
 * quarter of the plain program's transient bytes) against it. */
static void ck_compare(const char *name, const char *text, const int *variants, int nvar, tt_backend *be) {
  static const char *const names[10] = {"recompute all (every non-cut node)", "sqrt plan", "scheduler's recompute all",
                                       "scheduler's cheapest plan freeing a quarter", "per-op plan freeing a quarter",
                                       "per-op plan dropping every value backward reads",
                                       "one-hop memory-bound ops (BN, ReLU, add, pool, dropout from kept values)",
                                       "per-op plan cascading inside units (convolutions too)",
                                       "the policy search's plan at the one-hop plan's arena",
                                       "per-tensor decisions, every one (recompute; masks and max-pool indices)"};
  tt_err e;
  net n;
  if (net_open(&n, name, text, NULL, &e)) {
    TT_CHECK(0, "%s", e.msg);
    return;
  }
  size_t sf = state_floats(&n.g);
  uint8_t *imgs;
  int32_t *labs;
  ck_data(&imgs, &labs);
  float *s_plain = (float *)calloc(sf, sizeof(float)), st_plain[2];
  unsigned char *rec = (unsigned char *)calloc((size_t)n.g.nnodes * 2, 1), *sel = rec + n.g.nnodes;
  tt_program pp;
  if (ck_run(&n, be, NULL, imgs, labs, s_plain, st_plain, &pp, &e) == 0) {
    for (int k = 0; k < nvar; k++) {
      int vr = variants[k];
      if (vr == 9) { /* issue 42: the per-tensor search's decisions, exact forms only */
        tt_save_forms f = {be->act_mask != NULL, be->pool_argmax != NULL, 0, 0.0};
        int r9 = tt_recompute_search_tensors(&n.g, CK_MB, ck_dt, tt_profile_cpu(), &f, -1.0, rec, NULL, &e), nsel = 0;
        for (int v = 0; v < n.g.nnodes; v++) sel[v] = rec[v] == TT_DEC_COMPRESS, rec[v] = rec[v] == TT_DEC_RECOMPUTE, nsel += sel[v];
        printf("  per-tensor decisions: %d values, %d of them kept as masks or indices\n", r9, nsel);
        TT_CHECK(r9 > 0 && nsel > 0, "per-tensor search: %d values, %d compressed", r9, nsel);
        ck_compact = 1, ck_sel = sel;
      } else if (vr == 0) rec_all(&n.g, rec);
      else if (vr == 1) tt_recompute_sqrt(&n.g, rec);
      else if (vr == 2) TT_CHECK(tt_recompute_all(&n.g, rec, &e) == 0, "%s", e.msg);
      else if (vr == 8) {
        /* the policy search, given as budget the arena of the one-hop plan, which is below the plain
         * one: whatever it picks must fit and, being as small, drop memory-bound values with the
         * convolution's output kept (the form it had no way to plan before issue 26's second part) */
        tt_program q;
        memset(rec, 0, (size_t)n.g.nnodes);
        int r8 = tt_recompute_add_cheap(&n.g, CK_MB, ck_dt, tt_profile_cpu(), -1.0, 0, rec, NULL, &e);
        if (r8 > 0 && !build_prog_cx(&n.g, be, CK_MB, CK_ACCUM, ck_dt, rec, 1, 1, 0, &q, &e)) {
          tt_policy_opts o;
          tt_policy_result r;
          memset(&o, 0, sizeof o);
          o.vram_bytes = q.arena_bytes, o.micro_batch = CK_MB, o.precision = ck_dt == TT_F32 ? TT_PREC_FP32 : TT_PREC_BF16;
          o.inplace = 1, o.profile = tt_profile_cpu();
          TT_CHECK(q.arena_bytes < pp.arena_bytes, "one-hop arena %zu not below plain %zu", q.arena_bytes, pp.arena_bytes);
          if (tt_policy_search(&n.g, be, &o, &r, &e) == 0) {
            TT_CHECK(r.train.arena_bytes <= q.arena_bytes, "chosen arena %zu over the budget %zu", r.train.arena_bytes,
                     q.arena_bytes);
            memcpy(rec, r.recompute, (size_t)n.g.nnodes);
            printf("  policy search at --vram %zu B: arena %zu B, predicted %.3f ms\n", q.arena_bytes, r.train.arena_bytes,
                   r.predicted_step_ms);
            tt_policy_result_free(&r);
            ck_check_cheap(&n.g, rec, 2, -1);
          } else {
            TT_CHECK(0, "policy search at the one-hop plan's arena: %s", e.msg);
          }
          tt_program_free(&q);
        } else {
          TT_CHECK(0, "one-hop plan: %d, %s", r8, e.msg);
        }
      } else if (vr >= 6) {
        memset(rec, 0, (size_t)n.g.nnodes);
        int r6 = tt_recompute_add_cheap(&n.g, CK_MB, ck_dt, tt_profile_cpu(), -1.0, vr == 7, rec, NULL, &e);
        ck_check_cheap(&n.g, rec, vr == 7, r6);
      } else if (vr >= 4) {
        double need = vr == 4 ? 0.25 * (double)pp.transient_bytes : 1e300;
        int r4 = tt_recompute_search_ops(&n.g, CK_MB, ck_dt, tt_profile_cpu(), need, rec, &e);
        TT_CHECK(vr == 4 ? r4 > 0 : r4 == -1, "per-op search: %d", r4);
      } else {
        double need = 0.25 * (double)pp.transient_bytes;
        TT_CHECK(tt_recompute_search(&n.g, CK_MB, ck_dt, tt_profile_cpu(), need, rec, &e) > 0, "no plan frees %.0f B",
                 need);
      }
      ck_no_smaller = vr == 5;
      ck_check_variant(&n, be, rec, names[vr], imgs, labs, s_plain, st_plain, &pp);
      ck_no_smaller = 0, ck_compact = 0, ck_sel = NULL;
    }
    tt_program_free(&pp);
  } else {
    TT_CHECK(0, "plain run: %s", e.msg);
  }
  free(rec);
  free(s_plain);
  free(imgs);
  free(labs);
  net_close(&n);
}

static void test_checkpoint_equals_plain(tt_backend *be) {
  static const int variants[] = {0, 1, 2, 4, 5, 6, 7, 9};
  TT_TEST_BEGIN("checkpointed training == plain training, bit-exact (fp32, batch norm + dropout; segments, per-op, per-tensor)");
  ck_compare("bn_dropout.recipe", TT_TEST_RECIPE_BN, variants, 8, be);
  /* at a larger micro-batch, where activations dominate even more */
  {
    tt_err e;
    net n;
    unsigned char *rec = NULL;
    if (net_open(&n, "bn_dropout.recipe", TT_TEST_RECIPE_BN, NULL, &e) == 0 && (rec = (unsigned char *)calloc((size_t)n.g.nnodes, 1))) {
      tt_program a, b;
      rec_all(&n.g, rec);
      if (!build_prog(&n.g, be, 128, 1, TT_F32, NULL, 1, &a, &e)) {
        if (!build_prog(&n.g, be, 128, 1, TT_F32, rec, 1, &b, &e)) {
          printf("  micro-batch 128: arena plain %zu B, recompute all %zu B\n", a.arena_bytes, b.arena_bytes);
          TT_CHECK(b.arena_bytes < a.arena_bytes, "mb 128: recompute arena %zu not below plain %zu", b.arena_bytes,
                   a.arena_bytes);
          tt_program_free(&b);
        }
        tt_program_free(&a);
      }
    }
    free(rec);
    net_close(&n);
  }
  TT_TEST_END();
}

/* The same with clip_norm (on in every step: the norm stays above it) and the decay rule
 * skipping batch norm and biases: the sum of squares reads the accumulators after the
 * recomputed backward as after the plain one. */
static void test_checkpoint_clip_decay_equals_plain(tt_backend *be) {
  static const int variants[] = {0, 2, 4};
  char text[4096];
  const char *key = "seed = 7\n", *at = strstr(TT_TEST_RECIPE_BN, key);
  TT_TEST_BEGIN("checkpointed training == plain training with clip_norm and decay = weights, bit-exact (fp32)");
  snprintf(text, sizeof text, "%.*s%sclip_norm = 0.05\ndecay = weights\n%s", (int)(at - TT_TEST_RECIPE_BN),
           TT_TEST_RECIPE_BN, key, at + strlen(key));
  clip_norm_min = 1e300;
  ck_compare("bn_dropout_clip.recipe", text, variants, 3, be);
  printf("  smallest gradient norm of the steps %.4f (clip_norm 0.05)\n", clip_norm_min);
  TT_CHECK(clip_norm_min > 0.05 && clip_norm_min < 1e300, "a step was not clipped (norm %.4g)", clip_norm_min);
  TT_TEST_END();
}

/* A plain chain (no residual connections): every layer is its own unit, so dropping "the
 * inside of each unit" dropped nothing; segments of layers between checkpoints do. */
static const char *RECIPE_CHAIN =
    "[net]\ninput = 1x12x12\nclasses = 5\n"
    "[train]\nbatch = 16\nmicro_batch = 8\noptimizer = sgd\nlr = 0.05\nmomentum = 0.9\nweight_decay = 5e-4\nseed = 7\n"
    "[conv c1]\nfilters = 8\nsize = 3\nbias = false\n[bn n1]\n[relu r1]\n"
    "[conv c2]\nfilters = 8\nsize = 3\nbias = false\n[bn n2]\n[relu r2]\n[dropout d1]\np = 0.3\n"
    "[conv c3]\nfilters = 8\nsize = 3\nbias = false\n[bn n3]\n[relu r3]\n"
    "[conv c4]\nfilters = 8\nsize = 3\n[relu r4]\n[dropout d2]\np = 0.2\n"
    "[conv c5]\nfilters = 8\nsize = 3\nbias = false\n[bn n5]\n[relu r5]\n"
    "[maxpool p1]\nsize = 2\n"
    "[conv c6]\nfilters = 8\nsize = 3\n[relu r6]\n"
    "[flatten]\n"
    "[linear fc1]\nout = 16\n[relu r7]\n"
    "[linear fc]\nout = 5\n";

/* bf16 autocast: recompute re-runs the same bf16 kernels on the same bf16 inputs (weight copies
 * are made from the same fp32 masters, batch norm's statistics stay fp32), so checkpointed
 * training still equals plain training bit for bit. */
static void test_checkpoint_equals_plain_bf16(tt_backend *be) {
  static const int variants[] = {0, 1, 4};
  static const int chain_variants[] = {2, 3};
  TT_TEST_BEGIN("checkpointed training == plain training, bit-exact in bf16 (batch norm + dropout; a chain)");
  ck_dt = TT_BF16;
  ck_compare("bn_dropout.recipe", TT_TEST_RECIPE_BN, variants, 3, be);
  ck_compare("chain.recipe", RECIPE_CHAIN, chain_variants, 2, be);
  ck_dt = TT_F32;
  TT_TEST_END();
}

static void test_checkpoint_chain_equals_plain(tt_backend *be) {
  static const int variants[] = {2, 3, 1, 4, 5, 6, 8, 9};
  TT_TEST_BEGIN("checkpointed training == plain training on a chain, bit-exact (the scheduler's plans, fp32; segments, per-op, per-tensor)");
  ck_compare("chain.recipe", RECIPE_CHAIN, variants, 8, be);
  TT_TEST_END();
}

/* Issue 26: compact saves (a ReLU's 1-bit mask, a max pool's uint8 index, kept for backward
 * in place of the tensor where nothing else keeps it) train bit for bit as the full tensors do,
 * alone and together with the scheduler's recompute set; dropout stores no mask either way. */
static void ck_compact_case(const char *name, const char *text, tt_backend *be, int min_masks, int min_idx) {
  tt_err e;
  net n;
  if (net_open(&n, name, text, NULL, &e)) {
    TT_CHECK(0, "%s", e.msg);
    return;
  }
  size_t sf = state_floats(&n.g);
  uint8_t *imgs;
  int32_t *labs;
  ck_data(&imgs, &labs);
  float *s0 = (float *)calloc(sf, sizeof(float)), *s1 = (float *)calloc(sf, sizeof(float)), st0[2], st1[2];
  unsigned char *rec = (unsigned char *)calloc((size_t)n.g.nnodes, 1);
  tt_program p0, p1;
  ck_compact = 0;
  int rc = ck_run(&n, be, NULL, imgs, labs, s0, st0, &p0, &e);
  TT_CHECK(rc == 0, "plain run: %s", e.msg);
  for (int variant = 0; variant < 2 && rc == 0; variant++) {
    if (variant == 1) TT_CHECK(tt_recompute_all(&n.g, rec, &e) == 0, "%s", e.msg);
    ck_compact = 1;
    if (ck_run(&n, be, variant ? rec : NULL, imgs, labs, s1, st1, &p1, &e)) {
      TT_CHECK(0, "compact run: %s", e.msg);
      break;
    }
    int masks = 0, idx = 0, dropout_bufs = 0;
    for (int i = 0; i < p1.nsteps; i++) {
      const tt_step *st = &p1.steps[i];
      if (st->op == TT_S_FWD && (st->flags & TT_SF_COMPACT)) {
        size_t count = (size_t)CK_MB * tt_node_numel(&n.g.nodes[st->node]);
        size_t want = st->kind == TT_L_MAXPOOL ? count : (count + 31) / 32 * 4;
        TT_CHECK(p1.bufs[st->out[TT_FWD_COMPACT]].bytes == want, "%s: compact save of '%s' is %zu B, not %zu", name,
                 st->name, p1.bufs[st->out[TT_FWD_COMPACT]].bytes, want);
        if (st->kind == TT_L_MAXPOOL) idx++;
        else masks++;
      }
      if (st->kind == TT_L_DROPOUT)
        for (int k = 0; k < st->nout; k++) dropout_bufs += st->out[k] >= 0 && k > 0;
    }
    printf("  %s%s: %d ReLU masks, %d max-pool indices (%zu B for %zu B); peak live %zu B vs %zu B without\n", name,
           variant ? " + recompute all" : "", masks, idx, p1.compact_bytes, p1.compact_full_bytes, p1.peak_live_bytes,
           p0.peak_live_bytes);
    if (!variant) {
      TT_CHECK(masks >= min_masks && idx >= min_idx, "%s: %d masks (want >= %d), %d indices (want >= %d)", name, masks,
               min_masks, idx, min_idx);
      TT_CHECK(p1.peak_live_bytes < p0.peak_live_bytes, "%s: peak live %zu B not below %zu B", name, p1.peak_live_bytes,
               p0.peak_live_bytes);
    }
    TT_CHECK(dropout_bufs == 0, "%s: dropout stores a mask", name);
    TT_CHECK(memcmp(st0, st1, sizeof st0) == 0, "%s: loss statistics differ", name);
    TT_CHECK(memcmp(s0, s1, sf * sizeof(float)) == 0, "%s%s: trained state differs from the plain run's", name,
             variant ? " + recompute" : "");
    tt_program_free(&p1);
  }
  if (rc == 0) tt_program_free(&p0);
  ck_compact = 0;
  free(rec);
  free(s0);
  free(s1);
  free(imgs);
  free(labs);
  net_close(&n);
}

static void test_compact_equals_plain(tt_backend *be) {
  TT_TEST_BEGIN("compact saves (ReLU masks, max-pool indices) == full tensors, bit-exact (fp32)");
  ck_compact_case("bn_dropout.recipe", TT_TEST_RECIPE_BN, be, 1, 1);
  ck_compact_case("chain.recipe", RECIPE_CHAIN, be, 3, 1);
  TT_TEST_END();
}

/* Issue 14: on plain chains (LeNet, VGG-16) --recompute all recomputed no layer, since every
 * layer was a unit of its own and only the inside of a unit was dropped. Now the plan says
 * which layers it recomputes, and the arena shrinks. */
static void test_recompute_all_chains(tt_backend *be) {
  static const char *const paths[2] = {"examples/fashion_mnist/lenet.recipe", "examples/imagenet/vgg16.recipe"};
  TT_TEST_BEGIN("--recompute all on chains (LeNet, VGG-16) recomputes layers and lowers the arena");
  for (int i = 0; i < 2; i++) {
    tt_err e;
    net n;
    tt_policy_result r[2];
    if (net_open(&n, NULL, NULL, paths[i], &e)) {
      TT_CHECK(0, "%s", e.msg);
      continue;
    }
    int ok = 0;
    for (int k = 0; k < 2; k++) {
      tt_policy_opts o;
      memset(&o, 0, sizeof o);
      o.inplace = 1, o.precision = TT_PREC_FP16, o.recompute = k ? TT_RECOMP_ALL : TT_RECOMP_NONE;
      if (tt_policy_search(&n.g, be, &o, &r[k], &e)) {
        TT_CHECK(0, "%s: %s", paths[i], e.msg);
        break;
      }
      ok++;
    }
    if (ok == 2) {
      int layers = 0;
      for (int v = 0; v < n.g.nnodes; v++) layers += r[1].recompute[v];
      printf("  %s mb %d: recompute none %.1f MiB; all %.1f MiB, %d layers marked, %d recompute steps, %d of %d units\n",
             paths[i], r[1].policy.micro_batch, r[0].train.arena_bytes / 1048576.0, r[1].train.arena_bytes / 1048576.0,
             layers, r[1].train.n_recomputed_steps, r[1].recomputed_units, r[1].nunits);
      TT_CHECK(layers > 0 && r[1].train.n_recomputed_steps > 0 && r[1].recomputed_units > 0, "%s: nothing recomputed",
               paths[i]);
      TT_CHECK(r[1].train.arena_bytes < r[0].train.arena_bytes, "%s: recompute all %zu B, not below none %zu B", paths[i],
               r[1].train.arena_bytes, r[0].train.arena_bytes);
    }
    for (int k = 0; k < ok; k++) tt_policy_result_free(&r[k]);
    net_close(&n);
  }
  TT_TEST_END();
}

/* ======================================================================== 2. accumulation */

static const char *RECIPE_NOBN_FMT =
    "[net]\ninput = 2x10x10\nclasses = 6\n"
    "[train]\nbatch = 16\noptimizer = %s\nlr = %s\n%s"
    "[conv c1]\nfilters = 6\nsize = 3\n"
    "[relu r1]\n"
    "[conv c2]\nfilters = 6\nsize = 3\n"
    "[relu r2]\n"
    "[add a1]\nfrom = r2, r1\n"
    "[maxpool p1]\nsize = 2\n"
    "[flatten]\n"
    "[linear fc1]\nout = 12\n"
    "[relu r3]\n"
    "[linear fc2]\nout = 6\n";

/* nsteps optimizer steps with micro-batch mb x accum over the same data; final state. */
static int acc_run(const net *n, tt_backend *be, int mb, int accum, tt_dtype dt, const float *in, const int32_t *labs,
                   int nsteps, const tt_opt_hparams *hp, float *state, tt_err *e) {
  tt_program p;
  if (build_prog(&n->g, be, mb, accum, dt, NULL, 1, &p, e)) return -1;
  tt_exec x;
  if (tt_exec_create(&x, &n->g, &p, NULL, be, 5, e)) {
    tt_program_free(&p);
    return -1;
  }
  int rc = tt_exec_init_params(&x, 77, e);
  size_t per = tt_node_numel(&n->g.nodes[0]);
  int eff = mb * accum;
  for (int s = 0; s < nsteps && !rc; s++) {
    for (int k = 0; k < accum && !rc; k++) {
      size_t b0 = (size_t)s * eff + (size_t)k * mb;
      rc = tt_exec_micro_step_f32(&x, in + b0 * per, labs + b0, k, (uint64_t)s, 1.0f / eff, e);
    }
    int of = 0;
    if (!rc) rc = tt_exec_update(&x, hp, s + 1, 1.0f, &of, e);
    double cn = hp->clip_norm > 0.0f && !rc ? last_clip_norm(&x, &p, 1.0f) : 1e300;
    if (cn < clip_norm_min) clip_norm_min = cn;
  }
  if (!rc) snapshot(&x, state, 1, e);
  tt_exec_destroy(&x);
  tt_program_free(&p);
  return rc;
}

static void test_accumulation(tt_backend *be) {
  /* 2, 3: with clip_norm (every step clipped: checked) and the decay rule, adamw's default and a
   * list on sgd; the norm is of the accumulated gradient, so k x m still equals k*m */
  const char *opts[4] = {"sgd", "adam", "adamw, clip_norm, decay = weights", "sgd, clip_norm, decay = *.weight, fc2.bias"};
  const char *extra[4] = {"momentum = 0.9\nweight_decay = 5e-4\n", "weight_decay = 1e-4\n",
                          "weight_decay = 0.05\nclip_norm = 0.05\n",
                          "momentum = 0.9\nweight_decay = 5e-4\nclip_norm = 0.05\ndecay = *.weight, fc2.bias\n"};
  for (int o = 0; o < 4; o++) {
    char name[160];
    snprintf(name, sizeof name, "accumulation: 4 micro-batches of 4 == one batch of 16 (fp32, %s)", opts[o]);
    TT_TEST_BEGIN(name);
    char text[2048];
    snprintf(text, sizeof text, RECIPE_NOBN_FMT, o == 2 ? "adamw" : o == 1 ? "adam" : "sgd", o == 1 || o == 2 ? "0.001" : "0.05",
             extra[o]);
    tt_err e;
    net n;
    if (net_open(&n, "nobn.recipe", text, NULL, &e)) {
      TT_CHECK(0, "%s", e.msg);
      TT_TEST_END();
      continue;
    }
    const int steps = 3, eff = 16;
    size_t per = tt_node_numel(&n.g.nodes[0]);
    float *in = (float *)malloc(sizeof(float) * per * eff * steps);
    int32_t *labs = (int32_t *)malloc(sizeof(int32_t) * eff * steps);
    tt_test_rng r = {1000 + (uint64_t)o};
    for (size_t i = 0; i < per * eff * steps; i++) in[i] = (float)(tt_test_rng_unit(&r) * 2 - 1);
    for (int i = 0; i < eff * steps; i++) labs[i] = (int32_t)(tt_test_rng_next(&r) % 6);
    tt_opt_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.kind = o == 2 ? TT_OPT_ADAMW : o == 1 ? TT_OPT_ADAM : TT_OPT_SGD;
    hp.lr = o == 1 || o == 2 ? 1e-3f : 0.05f, hp.momentum = 0.9f, hp.weight_decay = n.m.train.weight_decay;
    hp.beta1 = 0.9f, hp.beta2 = 0.999f, hp.eps = 1e-8f, hp.clip_norm = n.m.train.clip_norm;
    clip_norm_min = 1e300;
    size_t sf = state_floats(&n.g);
    float *a = (float *)calloc(sf, sizeof(float)), *b = (float *)calloc(sf, sizeof(float));
    float *init = (float *)calloc(sf, sizeof(float));
    double worst = 0.0;
    for (int ns = 1; ns <= steps; ns += steps - 1) { /* after 1 and after 3 optimizer steps */
      if (acc_run(&n, be, 4, 4, TT_F32, in, labs, ns, &hp, a, &e) || acc_run(&n, be, 16, 1, TT_F32, in, labs, ns, &hp, b, &e) ||
          acc_run(&n, be, 16, 1, TT_F32, in, labs, 0, &hp, init, &e)) {
        TT_CHECK(0, "%s", e.msg);
        break;
      }
      size_t off = 0;
      for (int i = 0; i < n.g.nparams; i++) {
        size_t k = n.g.params[i].numel;
        double re = rel_err(a + off, b + off, k);
        if (re > worst) worst = re;
        TT_CHECK(re <= 1e-5, "after %d steps '%s' differs: max|a-b|/max|b| = %.3g", ns, n.g.params[i].name, re);
        /* and the step did change it */
        TT_CHECK(memcmp(b + off, init + off, k * sizeof(float)) != 0, "'%s' did not change", n.g.params[i].name);
        off += k;
      }
    }
    printf("  %s: worst per-tensor relative difference %.3g\n", opts[o], worst);
    if (hp.clip_norm > 0.0f) {
      printf("  smallest gradient norm of the steps %.4f (clip_norm %g)\n", clip_norm_min, (double)hp.clip_norm);
      TT_CHECK(clip_norm_min > hp.clip_norm && clip_norm_min < 1e300, "a step was not clipped (norm %.4g)", clip_norm_min);
    }
    free(a);
    free(b);
    free(init);
    free(in);
    free(labs);
    net_close(&n);
    TT_TEST_END();
  }
}

/* ======================================================================== 4. loss scaler */

static void test_loss_scale_unit(void) {
  TT_TEST_BEGIN("loss scaler: 65536 start, x2 after 2000 clean steps, x0.5 and skip on overflow, floor 1, disabled");
  tt_loss_scale s;
  tt_loss_scale_init(&s, 1);
  TT_CHECK(s.scale == 65536.0f, "start %g", (double)s.scale);
  for (int i = 0; i < 1999; i++) TT_CHECK(tt_loss_scale_update(&s, 0) == 0, "clean step skipped");
  TT_CHECK(s.scale == 65536.0f, "grew before 2000 clean steps: %g", (double)s.scale);
  tt_loss_scale_update(&s, 0);
  TT_CHECK(s.scale == 131072.0f, "after 2000 clean steps %g", (double)s.scale);
  TT_CHECK(tt_loss_scale_update(&s, 1) == 1, "overflow not skipped");
  TT_CHECK(s.scale == 65536.0f && s.skipped == 1, "after overflow %g, skipped %lld", (double)s.scale, s.skipped);
  /* an overflow resets the clean-step count */
  for (int i = 0; i < 1500; i++) tt_loss_scale_update(&s, 0);
  tt_loss_scale_update(&s, 1);
  for (int i = 0; i < 1999; i++) tt_loss_scale_update(&s, 0);
  TT_CHECK(s.scale == 32768.0f, "clean count not reset by overflow: %g", (double)s.scale);
  tt_loss_scale_update(&s, 0);
  TT_CHECK(s.scale == 65536.0f, "did not grow 2000 steps after the overflow: %g", (double)s.scale);
  for (int i = 0; i < 40; i++) TT_CHECK(tt_loss_scale_update(&s, 1) == 1, "overflow not skipped");
  TT_CHECK(s.scale == 1.0f, "floor: %g", (double)s.scale);
  TT_CHECK(s.skipped == 42, "skipped %lld", s.skipped);
  tt_loss_scale d;
  tt_loss_scale_init(&d, 0);
  TT_CHECK(d.scale == 1.0f, "disabled start %g", (double)d.scale);
  int any = 0;
  for (int i = 0; i < 5000; i++) any |= tt_loss_scale_update(&d, i % 3 == 0);
  TT_CHECK(!any && d.scale == 1.0f && d.skipped == 0, "disabled: skip %d scale %g skipped %lld", any, (double)d.scale,
           d.skipped);
  TT_TEST_END();

  /* learned one step late (core/runtime/lossscale.h): outcomes recorded with the scale each step ran at */
  TT_TEST_BEGIN("loss scaler one step late: two overflows at one scale halve it once, both skipped; the same as "
                "the synchronous rule when the scale used is the current one");
  tt_loss_scale a, b;
  tt_loss_scale_init(&a, 1);
  tt_loss_scale_init(&b, 1);
  /* steps n and n+1 both ran at 65536 (n+1 was queued before n's overflow was known) */
  TT_CHECK(tt_loss_scale_record(&a, 1, 65536.0f) == 1 && a.scale == 32768.0f, "first overflow: %g", (double)a.scale);
  TT_CHECK(tt_loss_scale_record(&a, 1, 65536.0f) == 1 && a.scale == 32768.0f && a.skipped == 2,
           "second overflow at the same scale: scale %g skipped %lld", (double)a.scale, a.skipped);
  /* a step that ran at the lowered scale and overflows halves again */
  TT_CHECK(tt_loss_scale_record(&a, 1, 32768.0f) == 1 && a.scale == 16384.0f, "overflow at the new scale: %g",
           (double)a.scale);
  /* with scale_used == current scale, record is update, step for step */
  tt_test_rng rr = {5};
  int same = 1;
  tt_loss_scale_init(&a, 1);
  for (int i = 0; i < 20000; i++) {
    int of = tt_test_rng_next(&rr) % 997 == 0;
    same &= tt_loss_scale_record(&a, of, a.scale) == tt_loss_scale_update(&b, of);
    same &= a.scale == b.scale && a.clean_steps == b.clean_steps && a.skipped == b.skipped;
  }
  TT_CHECK(same, "record(scale used = current) differs from update: %g/%lld vs %g/%lld", (double)a.scale, a.skipped,
           (double)b.scale, b.skipped);
  TT_TEST_END();
}

static void test_overflow_injection(tt_backend *be, int clip) {
  TT_TEST_BEGIN(clip ? "fp16 overflow with clip_norm: update skipped and parameters unchanged, then a clean step updates"
                     : "fp16 overflow: update skipped and parameters unchanged, then a clean step updates");
  char text[2048];
  snprintf(text, sizeof text, RECIPE_NOBN_FMT, "sgd", "0.05",
           clip ? "momentum = 0.9\nweight_decay = 1e-3\nclip_norm = 0.05\ndecay = weights\n" : "momentum = 0.9\n");
  tt_err e;
  net n;
  if (net_open(&n, "nobn16.recipe", text, NULL, &e)) {
    TT_CHECK(0, "%s", e.msg);
    TT_TEST_END();
    return;
  }
  tt_program p;
  tt_exec x;
  int mb = 8;
  if (build_prog(&n.g, be, mb, 1, TT_F16, NULL, 1, &p, &e) || tt_exec_create(&x, &n.g, &p, NULL, be, 3, &e) ||
      tt_exec_init_params(&x, 3, &e)) {
    TT_CHECK(0, "%s", e.msg);
    net_close(&n);
    TT_TEST_END();
    return;
  }
  int has_check = 0;
  for (int i = p.micro_end; i < p.nsteps; i++) has_check |= p.steps[i].op == TT_S_CHECK;
  TT_CHECK(has_check, "the fp16 program has no overflow check");
  size_t per = tt_node_numel(&n.g.nodes[0]);
  float *in = (float *)malloc(sizeof(float) * per * mb);
  int32_t labs[8];
  tt_test_rng r = {9};
  for (size_t i = 0; i < per * mb; i++) in[i] = (float)(tt_test_rng_unit(&r) - 0.5);
  for (int i = 0; i < mb; i++) labs[i] = (int32_t)(tt_test_rng_next(&r) % 6);
  size_t sf = state_floats(&n.g);
  float *before = (float *)calloc(sf, sizeof(float)), *after = (float *)calloc(sf, sizeof(float));
  tt_opt_hparams hp;
  memset(&hp, 0, sizeof hp);
  hp.kind = TT_OPT_SGD, hp.lr = 0.05f, hp.momentum = 0.9f;
  hp.weight_decay = n.m.train.weight_decay, hp.clip_norm = n.m.train.clip_norm;
  tt_loss_scale ls;
  tt_loss_scale_init(&ls, 1);
  int of = 0, t = 1;
  /* (a) inf written into one gradient accumulator after backward */
  snapshot(&x, before, 1, &e);
  int rc = tt_exec_micro_step_f32(&x, in, labs, 0, 0, ls.scale / mb, &e);
  int wparam = -1;
  for (int i = 0; i < n.g.nparams; i++)
    if (n.g.params[i].trainable) wparam = i;
  float *g = (float *)malloc(sizeof(float) * n.g.params[wparam].numel);
  if (!rc) rc = tt_exec_param_get(&x, wparam, 1, g, &e);
  if (!rc) {
    g[0] = INFINITY;
    rc = tt_exec_param_set(&x, wparam, 1, g, &e);
  }
  if (!rc) rc = tt_exec_update(&x, &hp, t, 1.0f / ls.scale, &of, &e);
  TT_CHECK(!rc, "%s", e.msg);
  TT_CHECK(of == 1, "inf in a gradient: overflow = %d", of);
  TT_CHECK(tt_loss_scale_update(&ls, of) == 1 && ls.scale == 32768.0f, "scaler: %g", (double)ls.scale);
  snapshot(&x, after, 1, &e);
  TT_CHECK(memcmp(before, after, sf * sizeof(float)) == 0, "parameters changed on a skipped update (injected grad)");
  /* (b) an input that becomes inf in fp16 */
  float *big = (float *)malloc(sizeof(float) * per * mb);
  memcpy(big, in, sizeof(float) * per * mb);
  big[3] = 1e30f;
  of = 0;
  rc = tt_exec_micro_step_f32(&x, big, labs, 0, 1, ls.scale / mb, &e);
  if (!rc) rc = tt_exec_update(&x, &hp, t, 1.0f / ls.scale, &of, &e);
  TT_CHECK(!rc, "%s", e.msg);
  TT_CHECK(of == 1, "1e30 input (fp16 inf): overflow = %d", of);
  tt_loss_scale_update(&ls, of);
  snapshot(&x, after, 1, &e);
  TT_CHECK(memcmp(before, after, sf * sizeof(float)) == 0, "parameters changed on a skipped update (inf input)");
  /* (c) a clean step updates every trainable parameter */
  of = 1;
  rc = tt_exec_micro_step_f32(&x, in, labs, 0, 2, ls.scale / mb, &e);
  if (!rc) rc = tt_exec_update(&x, &hp, t, 1.0f / ls.scale, &of, &e);
  TT_CHECK(!rc, "%s", e.msg);
  TT_CHECK(of == 0, "clean step: overflow = %d", of);
  snapshot(&x, after, 1, &e);
  size_t off = 0;
  for (int i = 0; i < n.g.nparams; i++) {
    size_t k = n.g.params[i].numel;
    int changed = memcmp(before + off, after + off, k * sizeof(float)) != 0;
    int finite = 1;
    for (size_t j = 0; j < k; j++) finite &= isfinite(after[off + j]) != 0;
    if (n.g.params[i].trainable) TT_CHECK(changed && finite, "'%s' changed %d finite %d after a clean step", n.g.params[i].name, changed, finite);
    off += k;
  }
  /* (d) without waiting (what a training loop does): an inf gradient, the update issued with no
   * overflow out-parameter, the parameters still unchanged, and the flag read back afterwards */
  snapshot(&x, before, 1, &e);
  rc = tt_exec_micro_step_f32(&x, in, labs, 0, 3, ls.scale / mb, &e);
  if (!rc) rc = tt_exec_param_get(&x, wparam, 1, g, &e);
  if (!rc) {
    g[1] = NAN;
    rc = tt_exec_param_set(&x, wparam, 1, g, &e);
  }
  if (!rc) rc = tt_exec_update(&x, &hp, t, 1.0f / ls.scale, NULL, &e);
  of = 0;
  if (!rc) rc = tt_exec_overflow(&x, &of, &e);
  TT_CHECK(!rc, "%s", e.msg);
  TT_CHECK(of == 1, "NaN gradient, flag read back later: overflow = %d", of);
  snapshot(&x, after, 1, &e);
  TT_CHECK(memcmp(before, after, sf * sizeof(float)) == 0, "parameters changed on an update skipped on the device");
  /* (e) the next clean step, also without waiting, updates and reads back 0 */
  rc = tt_exec_micro_step_f32(&x, in, labs, 0, 4, ls.scale / mb, &e);
  if (!rc) rc = tt_exec_update(&x, &hp, t, 1.0f / ls.scale, NULL, &e);
  of = 1;
  if (!rc) rc = tt_exec_overflow(&x, &of, &e);
  TT_CHECK(!rc && of == 0, "clean step read back %d: %s", of, e.msg);
  snapshot(&x, after, 1, &e);
  TT_CHECK(memcmp(before, after, sf * sizeof(float)) != 0, "a clean step after a skipped one changed nothing");
  free(g);
  free(big);
  free(in);
  free(before);
  free(after);
  tt_exec_destroy(&x);
  tt_program_free(&p);
  net_close(&n);
  TT_TEST_END();
}

/* ======================================================================== 5-7. scheduler */
/* ======================================================================== 5. the Vision Transformer */

/* A tiny ViT: 8x8 images in 4x4 patches (4 tokens + the class token, 8 wide), two pre-norm blocks
 * of 2-head attention (dropout on the probabilities, as vit_drop) and a GELU MLP with dropout,
 * the class token's layer norm into a 4-way head. */
static const char *VIT_FMT =
    "[net]\ninput = 1x8x8\nclasses = 4\n"
    "[train]\nbatch = 8\noptimizer = adamw\nlr = 0.003\nweight_decay = 0.05\n"
    "[block enc]\n"
    "[layernorm ln_1]\neps = 1e-6\n"
    "[attention self_attention]\nheads = 2\ndropout = %s\n"
    "[add res1]\nfrom = in, self_attention\n"
    "[layernorm ln_2]\neps = 1e-6\n"
    "[linear mlp.0]\nout = 16\n"
    "[gelu mlp.1]\napproximate = %s\n"
    "[dropout mlp.2]\np = %s\n"
    "[linear mlp.3]\nout = 8\n"
    "[add res2]\nfrom = res1, mlp.3\n"
    "[end]\n"
    "[patch_embed embed]\nsize = 4\ndim = 8\n"
    "[enc layers]\nrepeat = 2\n"
    "[layernorm ln]\neps = 1e-6\n"
    "[token]\nmode = %s\n"
    "[linear head]\nout = 4\n";

#define VIT_STEPS 3
#define VIT_PER 64 /* 1x8x8 */

typedef struct vit_cfg {
  int mb, accum, fused, steps;
  const unsigned char *rec;
  int fp16; /* autocast: activations fp16, layer norm statistics, lse and the loss fp32 */
} vit_cfg;

/* cfg.steps AdamW steps of mb x accum from the same seeds; the final state (roles values,
 * gradients, m, v) and the last step's loss statistics. */
static int vit_run(const net *n, tt_backend *be, const vit_cfg *cf, const float *in, const int32_t *labs, float *state,
                   float stats[2], int *nrec_steps, tt_err *e) {
  tt_program p;
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = cf->mb, pol.accum_steps = cf->accum, pol.act_dtype = cf->fp16 ? TT_F16 : TT_F32, pol.inplace = 1;
  pol.recompute = (unsigned char *)cf->rec, pol.training = 1, pol.attn_fused = cf->fused;
  if (tt_lower(&n->g, &pol, be, &p, e)) return -1;
  if (tt_program_plan(&p, e)) {
    tt_program_free(&p);
    return -1;
  }
  if (nrec_steps) *nrec_steps = count_flag(&p, TT_SF_RECOMPUTE);
  tt_exec x;
  if (tt_exec_create(&x, &n->g, &p, NULL, be, 7, e)) {
    tt_program_free(&p);
    return -1;
  }
  int rc = tt_exec_init_params(&x, 2024, e), eff = cf->mb * cf->accum;
  tt_opt_hparams hp;
  memset(&hp, 0, sizeof hp);
  hp.kind = TT_OPT_ADAMW, hp.lr = 3e-3f, hp.weight_decay = 0.05f, hp.beta1 = 0.9f, hp.beta2 = 0.999f, hp.eps = 1e-8f;
  for (int s = 0; s < cf->steps && !rc; s++) {
    if (!rc) rc = tt_exec_stats(&x, NULL, 1, e);
    for (int k = 0; k < cf->accum && !rc; k++) {
      size_t b0 = (size_t)s * eff + (size_t)k * cf->mb;
      rc = tt_exec_micro_step_f32(&x, in + b0 * VIT_PER, labs + b0, k, (uint64_t)s, 1.0f / eff, e);
    }
    int of = 0;
    if (!rc) rc = tt_exec_update(&x, &hp, s + 1, 1.0f, &of, e);
  }
  if (!rc && state) rc = snapshot(&x, state, 4, e);
  if (!rc && stats) rc = tt_exec_stats(&x, stats, 0, e);
  tt_exec_destroy(&x);
  tt_program_free(&p);
  return rc;
}

static void vit_data(int count, float **in, int32_t **labs, uint64_t seed) {
  tt_test_rng r = {seed};
  *in = (float *)malloc(sizeof(float) * VIT_PER * (size_t)count);
  *labs = (int32_t *)malloc(sizeof(int32_t) * (size_t)count);
  for (size_t i = 0; i < (size_t)VIT_PER * count; i++) (*in)[i] = (float)(tt_test_rng_unit(&r) * 2 - 1);
  for (int i = 0; i < count; i++) (*labs)[i] = (int32_t)(tt_test_rng_next(&r) % 4);
}

/* Per parameter and role, max|a-b|/max|b| <= tol (0: bit-exact); the worst into *worst.
 * vit_skip_kbias: leave out the key third of every in_proj_bias. Its gradient is zero in exact
 * arithmetic (a key bias adds q.b_k to a whole row of scores, which softmax ignores), so it is
 * rounding noise of 1e-9, which Adam's m/sqrt(v) turns into lr-sized steps that differ with the
 * summation order (PyTorch's too); they change nothing else, for the same reason. */
static int vit_skip_kbias;
static int vit_compare(const tt_graph *g, const char *what, const float *a, const float *b, int roles, double tol, double *worst) {
  size_t off = 0;
  int bad = 0;
  for (int i = 0; i < g->nparams; i++)
    for (int role = 0; role < 4; role++) {
      size_t k = g->params[i].numel;
      if (role < roles) {
        const char *nm = g->params[i].name;
        size_t L = strlen(nm);
        double re = rel_err(a + off, b + off, k);
        if (vit_skip_kbias && L > 12 && !strcmp(nm + L - 12, "in_proj_bias")) { /* q and v thirds only */
          double r1 = rel_err(a + off, b + off, k / 3), r2 = rel_err(a + off + 2 * (k / 3), b + off + 2 * (k / 3), k / 3);
          re = r1 > r2 ? r1 : r2;
        }
        if (re > *worst) *worst = re;
        if (tol == 0.0 ? memcmp(a + off, b + off, k * sizeof(float)) != 0 : re > tol) {
          if (!bad) TT_CHECK(0, "%s: '%s' role %d differs: max|a-b|/max|b| = %.3g", what, g->params[i].name, role, re);
          bad = 1;
        }
      }
      off += k;
    }
  return bad;
}

static void test_vit(tt_backend *be) {
  char name[192], text[2048];
  tt_err e;
  net n;
  /* attention dropout and MLP dropout on; erf GELU; class token */
  snprintf(text, sizeof text, VIT_FMT, "0.1", "none", "0.1", "class");
  if (net_open(&n, "vit.recipe", text, NULL, &e)) {
    snprintf(name, sizeof name, "vit (%s): recipe", be->name);
    TT_TEST_BEGIN(name);
    TT_CHECK(0, "%s", e.msg);
    TT_TEST_END();
    return;
  }
  size_t sf = state_floats(&n.g);
  float *in, *a = (float *)calloc(sf, sizeof(float)), *b = (float *)calloc(sf, sizeof(float)), sa[2], sb[2];
  int32_t *labs;
  vit_data(8 * VIT_STEPS, &in, &labs, 31);
  unsigned char *rec = (unsigned char *)calloc((size_t)n.g.nnodes, 1);
  vit_cfg plain = {4, 2, 0, VIT_STEPS, NULL, 0};

  /* 1. recompute (every non-cut node, then the scheduler's `all`: whole transformer blocks) ==
   * plain, bit-exact: the same kernels on the same inputs, dropout masks regenerated */
  snprintf(name, sizeof name, "vit (%s): checkpointed training == plain, bit-exact (fp32, attention + MLP dropout)", be->name);
  TT_TEST_BEGIN(name);
  if (vit_run(&n, be, &plain, in, labs, a, sa, NULL, &e)) {
    TT_CHECK(0, "plain: %s", e.msg);
  } else {
    for (int variant = 0; variant < 2; variant++) {
      if (variant == 0) rec_all(&n.g, rec);
      else TT_CHECK(tt_recompute_all(&n.g, rec, &e) == 0, "%s", e.msg);
      int nrec = 0, nrs = 0, attn_rec = 0;
      for (int v = 0; v < n.g.nnodes; v++) nrec += rec[v], attn_rec += rec[v] && n.g.nodes[v].kind == TT_L_ATTENTION;
      vit_cfg c = plain;
      c.rec = rec;
      double worst = 0.0;
      if (vit_run(&n, be, &c, in, labs, b, sb, &nrs, &e)) {
        TT_CHECK(0, "recompute: %s", e.msg);
        continue;
      }
      printf("  variant %d: %d nodes marked (%d attention), %d recompute steps\n", variant, nrec, attn_rec, nrs);
      TT_CHECK(nrs > 0 && attn_rec > 0, "variant %d: no attention recomputed (%d steps)", variant, nrs);
      TT_CHECK(memcmp(sa, sb, sizeof sa) == 0, "variant %d: loss statistics %.9g vs %.9g", variant, (double)sa[0], (double)sb[0]);
      vit_compare(&n.g, variant ? "scheduler's all" : "every non-cut node", b, a, 4, 0.0, &worst);
    }
  }
  TT_TEST_END();

  /* 2. the fused form (probabilities rebuilt from lse) == kept probabilities: the same loss and
   * gradients within 1e-5 (the same dropout mask, from the same hash) */
  snprintf(name, sizeof name, "vit (%s): fused attention == kept probabilities (loss, every gradient and state, 1e-5)", be->name);
  TT_TEST_BEGIN(name);
  {
    vit_cfg c = plain;
    c.fused = 1;
    double worst = 0.0;
    if (vit_run(&n, be, &c, in, labs, b, sb, NULL, &e)) {
      TT_CHECK(0, "fused: %s", e.msg);
    } else {
      TT_CHECK(fabs((double)sa[0] - sb[0]) <= 1e-5 * fabs((double)sa[0]) && sa[1] == sb[1], "loss %.9g vs %.9g", (double)sa[0],
               (double)sb[0]);
      vit_compare(&n.g, "fused", b, a, 4, 1e-5, &worst);
      printf("  worst per-tensor relative difference %.3g\n", worst);
      /* and with recompute on top: fused + whole blocks recomputed == plain */
      TT_CHECK(tt_recompute_all(&n.g, rec, &e) == 0, "%s", e.msg);
      c.rec = rec;
      if (vit_run(&n, be, &c, in, labs, b, sb, NULL, &e)) TT_CHECK(0, "fused + recompute: %s", e.msg);
      else vit_compare(&n.g, "fused + recompute", b, a, 4, 1e-5, &worst);
    }
  }
  TT_TEST_END();
  free(in);
  free(labs);
  net_close(&n);

  /* 3. k x m accumulation == one batch of k*m (no dropout: its masks follow the micro-step;
   * layer norm is per token, so nothing else depends on the batch split); tanh GELU, mean pooling */
  snprintf(name, sizeof name, "vit (%s): accumulation 4 x 2 == 1 x 8 (AdamW, values within 1e-5 but the key biases)", be->name);
  TT_TEST_BEGIN(name);
  snprintf(text, sizeof text, VIT_FMT, "0", "tanh", "0", "mean");
  if (net_open(&n, "vit_nodrop.recipe", text, NULL, &e)) {
    TT_CHECK(0, "%s", e.msg);
  } else {
    sf = state_floats(&n.g);
    float *c1 = (float *)calloc(sf, sizeof(float)), *c2 = (float *)calloc(sf, sizeof(float));
    vit_data(8 * VIT_STEPS, &in, &labs, 77);
    vit_cfg k4 = {2, 4, 0, VIT_STEPS, NULL, 0}, k1 = {8, 1, 0, VIT_STEPS, NULL, 0};
    double worst = 0.0;
    if (vit_run(&n, be, &k4, in, labs, c1, NULL, NULL, &e) || vit_run(&n, be, &k1, in, labs, c2, NULL, NULL, &e)) {
      TT_CHECK(0, "%s", e.msg);
    } else {
      vit_skip_kbias = 1;
      vit_compare(&n.g, "accumulated", c1, c2, 1, 1e-5, &worst);
      vit_skip_kbias = 0;
      printf("  worst per-tensor relative difference %.3g (key biases left out: their gradient is 0 up to rounding)\n", worst);
    }
    /* 4. training reduces the loss: 40 steps on one fixed batch of 8 (memorising it) */
    vit_cfg one = {8, 1, 0, 1, NULL, 0};
    float *rep = (float *)malloc(sizeof(float) * VIT_PER * 8 * 40);
    int32_t *rl = (int32_t *)malloc(sizeof(int32_t) * 8 * 40);
    for (int s = 0; s < 40; s++) {
      memcpy(rep + (size_t)s * 8 * VIT_PER, in, sizeof(float) * 8 * VIT_PER);
      memcpy(rl + s * 8, labs, sizeof(int32_t) * 8);
    }
    float first[2], last[2];
    vit_cfg many = one;
    many.steps = 40;
    if (vit_run(&n, be, &one, rep, rl, NULL, first, NULL, &e) || vit_run(&n, be, &many, rep, rl, NULL, last, NULL, &e)) {
      TT_CHECK(0, "%s", e.msg);
    } else {
      printf("  loss on a fixed batch: step 1 %.4f, step 40 %.4f (accuracy %g/8)\n", first[0] / 8, last[0] / 8, (double)last[1]);
      TT_CHECK(last[0] < 0.5f * first[0], "40 AdamW steps on one batch: loss %.4f -> %.4f, not halved", first[0] / 8,
               last[0] / 8);
    }
    free(rep), free(rl), free(c1), free(c2);
    TT_TEST_END();

    /* 5. fp16 autocast tracks fp32: the same 3 steps, the loss within 1% and every parameter
     * within 1% of its tensor's largest value (layer norm statistics, softmax/lse and the loss
     * stay fp32; activations and the projections' weights are fp16) */
    snprintf(name, sizeof name, "vit (%s): fp16 autocast tracks fp32 (loss and parameters within 1%%)", be->name);
    TT_TEST_BEGIN(name);
    {
      vit_cfg h = k1, f = k1;
      h.fp16 = 1;
      float s32[2], s16[2];
      double worst = 0.0;
      c1 = (float *)calloc(sf, sizeof(float)), c2 = (float *)calloc(sf, sizeof(float));
      if (vit_run(&n, be, &f, in, labs, c1, s32, NULL, &e) || vit_run(&n, be, &h, in, labs, c2, s16, NULL, &e)) {
        TT_CHECK(0, "%s", e.msg);
      } else {
        printf("  loss fp32 %.6f fp16 %.6f\n", s32[0] / 8, s16[0] / 8);
        TT_CHECK(fabs((double)s16[0] - s32[0]) <= 0.01 * fabs((double)s32[0]), "loss fp16 %.6f vs fp32 %.6f", s16[0] / 8,
                 s32[0] / 8);
        vit_skip_kbias = 1;
        vit_compare(&n.g, "fp16 values", c2, c1, 1, 1e-2, &worst);
        vit_skip_kbias = 0;
        printf("  worst per-tensor relative difference %.3g\n", worst);
      }
      free(c1), free(c2);
    }
    free(in), free(labs);
    net_close(&n);
  }
  TT_TEST_END();
  free(rec);
  free(a);
  free(b);
}

/* Without accumulation the weight gradients are transient (lower.c): each lives from the backward
 * op that writes it to the update, sharing storage with freed activations. Training must be the
 * same bits as with the persistent accumulators (forced here by train.ranks = 2, which a
 * multi-process run sets; nothing else of the run reads it), in fp32, bf16 and fp16 (whose
 * overflow check then runs per gradient), plain and with every non-cut node recomputed; and the
 * arena smaller. */
static void test_transient_grads(tt_backend *be) {
  static const tt_dtype dts[3] = {TT_F32, TT_BF16, TT_F16};
  TT_TEST_BEGIN("transient weight gradients (accumulation 1) == persistent accumulators, bit-exact (fp32, bf16, fp16; "
                "plain and recomputed)");
  tt_err e;
  net n;
  if (net_open(&n, "bn_dropout.recipe", TT_TEST_RECIPE_BN, NULL, &e)) {
    TT_CHECK(0, "%s", e.msg);
    TT_TEST_END();
    return;
  }
  size_t sf = state_floats(&n.g);
  uint8_t *imgs;
  int32_t *labs;
  ck_data(&imgs, &labs);
  float *sa = (float *)calloc(sf, sizeof(float)), *sb = (float *)calloc(sf, sizeof(float)), sta[2], stb[2];
  unsigned char *rec = (unsigned char *)calloc((size_t)n.g.nnodes, 1);
  rec_all(&n.g, rec);
  ck_accum = 1;
  for (int d = 0; d < 3; d++)
    for (int r = 0; r < 2; r++) {
      tt_program pa, pb;
      ck_dt = dts[d];
      n.m.train.ranks = 2; /* persistent accumulators */
      int ra = ck_run(&n, be, r ? rec : NULL, imgs, labs, sa, sta, &pa, &e);
      TT_CHECK(ra == 0, "%s, persistent: %s", tt_dtype_name(ck_dt), e.msg);
      n.m.train.ranks = 1;
      int rb = ck_run(&n, be, r ? rec : NULL, imgs, labs, sb, stb, &pb, &e);
      TT_CHECK(rb == 0, "%s, transient: %s", tt_dtype_name(ck_dt), e.msg);
      if (ra || rb) {
        if (!ra) tt_program_free(&pa);
        if (!rb) tt_program_free(&pb);
        continue;
      }
      int ngrad = 0, trans = 0, bwd_first = 1;
      for (int k = 0; k < pb.nparams; k++) {
        int gb = pb.grad_buf[k];
        if (gb < 0) continue;
        ngrad++;
        trans += !pb.bufs[gb].persistent;
        /* live from a backward step of the micro-step to an update */
        bwd_first &= pb.bufs[gb].first < pb.micro_end && pb.steps[pb.bufs[gb].first].op == TT_S_BWD &&
                     pb.steps[pb.bufs[gb].last].op == TT_S_UPDATE;
        TT_CHECK(pa.bufs[pa.grad_buf[k]].persistent, "persistent run: gradient %d transient", k);
      }
      TT_CHECK(pa.transient_grads == 0 && pb.transient_grads == ngrad && trans == ngrad && ngrad > 0,
               "%s: %d of %d gradients transient (program says %d; persistent run %d)", tt_dtype_name(ck_dt), trans,
               ngrad, pb.transient_grads, pa.transient_grads);
      TT_CHECK(bwd_first, "%s: a transient gradient is not live from a backward step to an update", tt_dtype_name(ck_dt));
      /* the lower bound falls; the arena, a heuristic's packing, may not (fp32 recomputed here:
       * 614144 B against 606976), so tt_policy_plan, which the policy search plans with, keeps
       * the gradients persistent where that packs smaller */
      TT_CHECK(pb.peak_live_bytes < pa.peak_live_bytes, "%s%s: lower bound %zu B with transient gradients, not below %zu B",
               tt_dtype_name(ck_dt), r ? " recomputed" : "", pb.peak_live_bytes, pa.peak_live_bytes);
      {
        tt_policy pol;
        tt_program pc;
        memset(&pol, 0, sizeof pol);
        pol.micro_batch = CK_MB, pol.accum_steps = 1, pol.act_dtype = ck_dt, pol.inplace = 1, pol.training = 1;
        pol.recompute = r ? rec : NULL;
        if (tt_policy_plan(&n.g, &pol, be, &pc, &e) == 0) {
          TT_CHECK(pc.arena_bytes <= pa.arena_bytes && pc.arena_bytes <= pb.arena_bytes &&
                       pol.grads_persistent == (pc.transient_grads == 0) && pc.policy.grads_persistent == pol.grads_persistent,
                   "%s%s: tt_policy_plan's arena %zu B (gradients %s), persistent %zu B, transient %zu B", tt_dtype_name(ck_dt),
                   r ? " recomputed" : "", pc.arena_bytes, pol.grads_persistent ? "persistent" : "transient", pa.arena_bytes,
                   pb.arena_bytes);
          tt_program_free(&pc);
        } else {
          TT_CHECK(0, "tt_policy_plan: %s", e.msg);
        }
      }
      TT_CHECK(memcmp(sa, sb, sf * sizeof(float)) == 0 && memcmp(sta, stb, sizeof sta) == 0,
               "%s%s: the state after training differs (loss %.9g against %.9g)", tt_dtype_name(ck_dt),
               r ? " recomputed" : "", (double)stb[0], (double)sta[0]);
      printf("  %s%s: arena (lower bound) %zu (%zu) B persistent, %zu (%zu) B transient, %d gradients; loss sum %.6f\n",
             tt_dtype_name(ck_dt), r ? ", recompute all" : "", pa.arena_bytes, pa.peak_live_bytes, pb.arena_bytes,
             pb.peak_live_bytes, ngrad, (double)stb[0]);
      tt_program_free(&pa);
      tt_program_free(&pb);
    }
  ck_accum = CK_ACCUM, ck_dt = TT_F32;
  n.m.train.ranks = 0;
  /* a program planned for one micro-step refuses a second (its gradients are overwritten, not added) */
  {
    tt_program p;
    tt_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.micro_batch = CK_MB, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.inplace = 1, pol.training = 1;
    if (tt_lower(&n.g, &pol, be, &p, &e) == 0 && tt_program_plan(&p, &e) == 0) {
      tt_exec x;
      if (tt_exec_create(&x, &n.g, &p, NULL, be, 99, &e) == 0) {
        int rc = tt_exec_init_params(&x, 1234, &e);
        if (!rc) rc = tt_exec_micro_step(&x, imgs, labs, 0, 0, 1.0f / CK_MB, &e);
        TT_CHECK(rc == 0, "micro-step 0: %s", e.msg);
        rc = tt_exec_micro_step(&x, imgs, labs, 1, 0, 1.0f / CK_MB, &e);
        TT_CHECK(rc != 0 && strstr(e.msg, "transient"), "micro-step 1 of a 1-step plan: rc %d, '%s'", rc, rc ? e.msg : "");
        tt_exec_destroy(&x);
      } else {
        TT_CHECK(0, "%s", e.msg);
      }
      tt_program_free(&p);
    } else {
      TT_CHECK(0, "%s", e.msg);
    }
  }
  free(rec), free(sa), free(sb), free(imgs), free(labs);
  net_close(&n);
  TT_TEST_END();
}

static tt_backend *be; /* the CPU backend, threads as the machine has (main) */
static void test_checkpoint_equals_plain_be(void) { test_checkpoint_equals_plain(be); }
static void test_checkpoint_clip_decay_be(void) { test_checkpoint_clip_decay_equals_plain(be); }
static void test_checkpoint_chain_be(void) { test_checkpoint_chain_equals_plain(be); }
static void test_checkpoint_bf16_be(void) { test_checkpoint_equals_plain_bf16(be); }
static void test_transient_grads_be(void) { test_transient_grads(be); }
static void test_compact_be(void) { test_compact_equals_plain(be); }
static void test_recompute_all_chains_be(void) { test_recompute_all_chains(be); }
static void test_accumulation_be(void) { test_accumulation(be); }
static void test_overflow_be(void) { test_overflow_injection(be, 0); }
static void test_overflow_clip_be(void) { test_overflow_injection(be, 1); }
/* the tiny ViT on the oneDNN backend, then on the reference */
static void test_vit_both(void) {
  test_vit(be);
  tt_backend *ref = tt_ref_backend_create(1);
  if (ref) {
    test_vit(ref);
    ref->destroy(ref);
  }
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("loss_scale_unit", "runtime equiv lossscale", test_loss_scale_unit),
  TT_TEST("checkpoint_equals_plain", "runtime equiv recompute", test_checkpoint_equals_plain_be),
  TT_TEST("checkpoint_clip_decay", "runtime equiv recompute optim", test_checkpoint_clip_decay_be),
  TT_TEST("checkpoint_chain", "runtime equiv recompute", test_checkpoint_chain_be),
  TT_TEST("checkpoint_bf16", "runtime equiv recompute bf16", test_checkpoint_bf16_be),
  TT_TEST("transient_grads", "runtime equiv", test_transient_grads_be),
  TT_TEST("compact_equals_plain", "runtime equiv recompute", test_compact_be),
  TT_TEST("recompute_all_chains", "runtime equiv recompute", test_recompute_all_chains_be),
  TT_TEST("accumulation", "runtime equiv accumulation", test_accumulation_be),
  TT_TEST("overflow_injection", "runtime equiv lossscale", test_overflow_be),
  TT_TEST("overflow_injection_clip", "runtime equiv lossscale optim", test_overflow_clip_be),
  TT_TEST("vit", "runtime equiv vit", test_vit_both),
};

int main(int argc, char **argv) {
  return tt_test_main_cpu(argc, argv, tests, TT_TEST_COUNT(tests), &be, 0, "test_equiv");
}
