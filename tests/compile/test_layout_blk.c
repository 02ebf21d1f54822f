/* tests/compile/test_layout_blk.c — the blocked nChw16c layout (backend.h's TT_LAYOUT_NCHW16C;
 * core/compile/lower_layout.c's lower_blocked, kernels/cpu/cpu_bn_blk.c, cpu_conv.c's Winograd):
 *   - planning: on a backend that lists the layout (forced here with TINYTRAIN_LAYOUT=nchw16c's
 *     knob, so the rules are tested on any CPU), fp32 groups of 16-multiple channels around a 3x3
 *     convolution are blocked; a group with 24 channels, one a pooling reads, the image, the
 *     classifier stay as before; fp16/bf16, int8 saves, a backend without bn_blk, the reference
 *     backend and a net with no 3x3 between blocked groups plan none; no buffer grows;
 *   - batch norm: every bn_blk kind against the reference's plain entries on the same values in
 *     NCHW (within float rounding), bn_apply's y bit for bit the training forward's, the same bits
 *     on 1 and 2 threads, and bad calls refused with a message;
 *   - training: 4 fp32 steps in nChw16c end with the weights of the NHWC and reference runs
 *     (within 2e-4 relative: Winograd's rounding and the summation order). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/knobs.h"
#include "core/base/safetensors.h"
#include "core/compile/dispatch.h"
#include "core/compile/graph.h"
#include "core/compile/program.h"
#include "core/compile/recipe.h"
#include "core/tinytrain.h"
#include "kernels/backend.h"
#include "kernels/kernel_math.h"
#include "tests/tt_test.h"
#include "tests/compile/layout_train.h"

/* c1 reads the image and writes a blocked group {c1, b1, c2, b2, a, r} (16 channels; c2 a 3x3 read
 * and written blocked: Winograd's); c3 writes 24 channels: NHWC; c4's group (32) is read by the
 * max pooling p: NHWC; p its own NHWC group; c5's group (32) is read only by the global average
 * pooling: blocked; g, fl and fc NCHW. */
static const char *blk_recipe =
    "[net]\ninput = 3x12x12\nclasses = 5\n"
    "[train]\nbatch = 8\nepochs = 1\noptimizer = sgd\nlr = 0.05\nmomentum = 0.9\nseed = 7\n"
    "[data]\nformat = synthetic\nmean = 0.5\nstd = 0.25\n"
    "[conv c1]\nfilters = 16\nsize = 3\npad = 1\nbias = false\n[bn b1]\nactivation = relu\n"
    "[conv c2]\nfilters = 16\nsize = 3\npad = 1\nbias = false\n[bn b2]\n[add a]\nfrom = b2, b1\n[relu r]\n"
    "[conv c3]\nfilters = 24\nsize = 3\npad = 1\nbias = false\n[bn b3]\nactivation = relu\n"
    "[conv c4]\nfilters = 32\nsize = 3\npad = 1\nbias = false\n[bn b4]\nactivation = relu\n"
    "[maxpool p]\nsize = 2\n"
    "[conv c5]\nfilters = 32\nsize = 3\npad = 1\n[bn b5]\nactivation = relu\n"
    "[gap g]\n[flatten fl]\n[linear fc]\nout = 5\n";

/* no 3x3 between groups that could be blocked: c1 (3x3) reads the image, c2 is 1x1 */
static const char *blk_recipe_1x1 =
    "[net]\ninput = 3x8x8\nclasses = 5\n"
    "[train]\nbatch = 8\nepochs = 1\noptimizer = sgd\nlr = 0.05\nseed = 7\n"
    "[data]\nformat = synthetic\n"
    "[conv c1]\nfilters = 16\nsize = 3\npad = 1\n[bn b1]\nactivation = relu\n"
    "[conv c2]\nfilters = 16\nsize = 1\n[bn b2]\nactivation = relu\n[gap g]\n[flatten fl]\n[linear fc]\nout = 5\n";

/* A CPU backend whose knobs ask for TINYTRAIN_LAYOUT=layout (-1: the default). */
static tt_backend *blk_backend(int layout, int threads) {
  tt_backend_knobs k;
  tt_backend_knobs_default(&k);
  k.layout = layout;
  return tt_cpu_backend_create_knobs(threads, &k);
}

/* Lowers text on be at micro-batch 4 in dtype dt with compressed saves fmt; 0 on success. */
static int blk_lower(tt_backend *be, const char *text, tt_dtype dt, int fmt, tt_model *m, tt_graph *g, tt_program *p,
                     tt_err *e) {
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 4, pol.accum_steps = 1, pol.act_dtype = dt, pol.training = 1, pol.inplace = 1, pol.compress = fmt;
  memset(m, 0, sizeof *m);
  memset(g, 0, sizeof *g);
  memset(p, 0, sizeof *p);
  if (tt_recipe_parse("blk.recipe", text, m, e, NULL, NULL) || tt_graph_build(m, g, e) || tt_lower(g, &pol, be, p, e) ||
      tt_program_plan(p, e))
    return -1;
  return 0;
}

static void blk_free(tt_model *m, tt_graph *g, tt_program *p) {
  tt_program_free(p);
  tt_graph_free(g);
  tt_model_free(m);
}

/* The forward step of node v in p (NULL: none). */
static const tt_step *blk_fwd_step(const tt_program *p, int v) {
  for (int si = 0; si < p->nsteps; si++)
    if (p->steps[si].op == TT_S_FWD && p->steps[si].node == v) return &p->steps[si];
  return NULL;
}

static void test_blk_plan(void) {
  TT_TEST_BEGIN("layout_blk_plan_groups");
  tt_backend *be = blk_backend(TT_LAYOUT_NCHW16C, 1), *nhwc = blk_backend(TT_LAYOUT_NHWC, 1);
  tt_model m, m2;
  tt_graph g, g2;
  tt_program p, q;
  tt_err e;
  TT_CHECK(be && nhwc, "no CPU backend");
  TT_CHECK(be && (be->layouts & (1u << TT_LAYOUT_NCHW16C)) && be->bn_blk, "TINYTRAIN_LAYOUT=nchw16c: the layout not listed");
  TT_CHECK(nhwc && !(nhwc->layouts & (1u << TT_LAYOUT_NCHW16C)), "TINYTRAIN_LAYOUT=nhwc lists nChw16c");
  if (be && nhwc && !blk_lower(be, blk_recipe, TT_F32, 0, &m, &g, &p, &e)) {
    static const char *names[] = {"c1", "b1", "c2", "b2", "a", "r", "c3", "b3", "c4", "b4", "p", "c5", "b5", "g", "fc"};
    static const int want[] = {2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 2, 2, 0, 0};
    for (int i = 0; i < (int)(sizeof want / sizeof want[0]); i++) {
      int v = node_of(&m, names[i]);
      TT_CHECK(v >= 0 && p.layout[v] == want[i], "%s is %s, expected %s", names[i], v >= 0 ? tt_layout_name(p.layout[v]) : "absent",
               tt_layout_name(want[i]));
    }
    TT_CHECK(p.n_blocked > 0 && p.blocked_bytes > 0, "n_blocked %d, %zu bytes", p.n_blocked, p.blocked_bytes);
    const tt_step *s1 = blk_fwd_step(&p, node_of(&m, "c1")), *s2 = blk_fwd_step(&p, node_of(&m, "c2"));
    const tt_step *s4 = blk_fwd_step(&p, node_of(&m, "c4")), *sb = blk_fwd_step(&p, node_of(&m, "b2"));
    const tt_step *sg = blk_fwd_step(&p, node_of(&m, "g"));
    TT_CHECK(s1 && s1->a.conv.layout_x == TT_LAYOUT_NCHW && s1->a.conv.layout_y == TT_LAYOUT_NCHW16C, "c1: %d -> %d",
             s1 ? s1->a.conv.layout_x : -1, s1 ? s1->a.conv.layout_y : -1);
    TT_CHECK(s2 && s2->a.conv.layout_x == TT_LAYOUT_NCHW16C && s2->a.conv.layout_y == TT_LAYOUT_NCHW16C, "c2: %d -> %d",
             s2 ? s2->a.conv.layout_x : -1, s2 ? s2->a.conv.layout_y : -1);
    TT_CHECK(s4 && s4->a.conv.layout_x == TT_LAYOUT_NHWC && s4->a.conv.layout_y == TT_LAYOUT_NHWC, "c4: %d -> %d",
             s4 ? s4->a.conv.layout_x : -1, s4 ? s4->a.conv.layout_y : -1);
    TT_CHECK(sb && (sb->flags & TT_SF_NCHW16C) && !(sb->flags & TT_SF_NHWC), "b2's step flags %d", sb ? sb->flags : -1);
    TT_CHECK(sg && (sg->flags & TT_SF_NCHW16C), "the global average pooling does not read nChw16c (flags %d)", sg ? sg->flags : -1);
    /* the batch-norm calls carry blk, the pooling over the blocked tensor is an NHWC pool of 16 channels */
    tt_call calls[TT_STEP_MAX_CALLS];
    int nc = sb ? tt_step_calls(&p, sb, 4, calls) : 0;
    TT_CHECK(nc >= 1 && calls[0].op.u.bn.blk == 16 && calls[0].op.u.bn.n == 4 && calls[0].op.u.bn.hw == 144,
             "b2's call: blk %d n %d hw %d", nc ? calls[0].op.u.bn.blk : -1, nc ? calls[0].op.u.bn.n : -1,
             nc ? calls[0].op.u.bn.hw : -1);
    nc = sg ? tt_step_calls(&p, sg, 4, calls) : 0;
    TT_CHECK(nc == 1 && calls[0].op.kind == TT_OP_POOL_FWD && calls[0].op.u.pool.n == 8 && calls[0].op.u.pool.c == 16 &&
                 calls[0].op.u.pool.layout == TT_LAYOUT_NHWC,
             "g's call: kind %d n %d c %d layout %d", nc ? (int)calls[0].op.kind : -1, nc ? calls[0].op.u.pool.n : -1,
             nc ? calls[0].op.u.pool.c : -1, nc ? calls[0].op.u.pool.layout : -1);
    /* no buffer grows: every value's bytes as in the NHWC plan */
    if (!blk_lower(nhwc, blk_recipe, TT_F32, 0, &m2, &g2, &q, &e)) {
      TT_CHECK(q.n_blocked == 0, "the NHWC plan has %d blocked nodes", q.n_blocked);
      for (int v = 0; v < g.nnodes; v++)
        if (p.value_buf[v] >= 0 && q.value_buf[v] >= 0)
          TT_CHECK(p.bufs[p.value_buf[v]].bytes == q.bufs[q.value_buf[v]].bytes, "%s: %zu bytes blocked, %zu NHWC",
                   m.layers[v].name, p.bufs[p.value_buf[v]].bytes, q.bufs[q.value_buf[v]].bytes);
      blk_free(&m2, &g2, &q);
    } else {
      TT_CHECK(0, "lowering in NHWC: %s", e.msg);
    }
    blk_free(&m, &g, &p);
  } else if (be && nhwc) {
    TT_CHECK(0, "lowering: %s", e.msg);
  }
  /* none: 16-bit activations, int8 saves, no bn_blk, no 3x3 between blocked groups, the reference */
  static const struct {
    const char *why;
    tt_dtype dt;
    int fmt, no_bnblk, ref, text1x1;
  } none[] = {{"bf16", TT_BF16, 0, 0, 0, 0}, {"fp16", TT_F16, 0, 0, 0, 0}, {"int8 saves", TT_F32, TT_SAVE_INT8, 0, 0, 0},
              {"no bn_blk", TT_F32, 0, 1, 0, 0}, {"the reference backend", TT_F32, 0, 0, 1, 0},
              {"no 3x3 between blocked groups", TT_F32, 0, 0, 0, 1}};
  for (size_t i = 0; be && i < sizeof none / sizeof none[0]; i++) {
    tt_backend *b = none[i].ref ? tt_ref_backend_create(1) : be;
    int (*keep)(tt_backend *, const struct tt_bn_blk_args *) = be->bn_blk;
    if (!b) continue;
    if (none[i].no_bnblk) be->bn_blk = NULL;
    if (!blk_lower(b, none[i].text1x1 ? blk_recipe_1x1 : blk_recipe, none[i].dt, none[i].fmt, &m, &g, &p, &e)) {
      TT_CHECK(p.n_blocked == 0, "%s: %d blocked nodes", none[i].why, p.n_blocked);
      for (int si = 0; si < p.nsteps; si++) TT_CHECK(!(p.steps[si].flags & TT_SF_NCHW16C), "%s: a blocked step", none[i].why);
      blk_free(&m, &g, &p);
    } else {
      TT_CHECK(0, "%s: lowering: %s", none[i].why, e.msg);
    }
    be->bn_blk = keep;
    if (none[i].ref) b->destroy(b);
  }
  if (be) be->destroy(be);
  if (nhwc) nhwc->destroy(nhwc);
  TT_TEST_END();
}

/* ---- batch norm: bn_blk against the reference's plain entries ---- */

#define BN_N 2
#define BN_C 32
#define BN_HW 600 /* more than one 512-row chunk per unit (cpu_bn_blk.c) */
#define BN_CNT ((size_t)BN_N * BN_C * BN_HW)

/* NCHW index of blocked index i (c a multiple of 16) */
static size_t blk_to_nchw(size_t i, int c, int hw) {
  size_t l = i % 16, p = (i / 16) % (size_t)hw, nb = i / 16 / (size_t)hw, b = nb % (size_t)(c / 16), n = nb / (size_t)(c / 16);
  return (n * (size_t)c + b * 16 + l) * (size_t)hw + p;
}
static void to_blk(const float *nchw, float *blk) {
  for (size_t i = 0; i < BN_CNT; i++) blk[i] = nchw[blk_to_nchw(i, BN_C, BN_HW)];
}
/* worst |a - r| / (1 + |r|) of blocked a against NCHW r */
static double blk_diff(const float *a, const float *r) {
  double w = 0.0;
  for (size_t i = 0; i < BN_CNT; i++) {
    double d = fabs((double)a[i] - r[blk_to_nchw(i, BN_C, BN_HW)]) / (1.0 + fabs(r[blk_to_nchw(i, BN_C, BN_HW)]));
    if (!(d <= w)) w = d; /* NaN counts */
  }
  return w;
}
static double vec_diff(const float *a, const float *r, int n) {
  double w = 0.0;
  for (int i = 0; i < n; i++) {
    double d = fabs((double)a[i] - r[i]) / (1.0 + fabs(r[i]));
    if (!(d <= w)) w = d;
  }
  return w;
}

static void test_blk_bn(void) {
  TT_TEST_BEGIN("layout_blk_bn_cpu_equals_ref");
  tt_backend *cpu = blk_backend(TT_LAYOUT_NCHW16C, 2), *cpu1 = blk_backend(TT_LAYOUT_NCHW16C, 1), *ref = tt_ref_backend_create(1);
  float *x = (float *)malloc(BN_CNT * 4), *dy = (float *)malloc(BN_CNT * 4), *s = (float *)malloc(BN_CNT * 4);
  float *xb = (float *)malloc(BN_CNT * 4), *dyb = (float *)malloc(BN_CNT * 4), *sb = (float *)malloc(BN_CNT * 4);
  float *y = (float *)malloc(BN_CNT * 4), *yb = (float *)malloc(BN_CNT * 4), *yb2 = (float *)malloc(BN_CNT * 4);
  float *dx = (float *)malloc(BN_CNT * 4), *dxb = (float *)malloc(BN_CNT * 4), *ds = (float *)malloc(BN_CNT * 4);
  float *dsb = (float *)malloc(BN_CNT * 4), *gb = (float *)malloc(BN_CNT * 4);
  uint32_t *mask = (uint32_t *)calloc(BN_CNT / 32 + 1, 4);
  tt_op_desc wop; /* the workspace the planner would give: op_workspace's answer for a blocked desc */
  memset(&wop, 0, sizeof wop);
  wop.kind = TT_OP_BN_FWD_TRAIN, wop.dt = TT_F32, wop.u.bn.n = BN_N, wop.u.bn.c = BN_C, wop.u.bn.hw = BN_HW, wop.u.bn.blk = 16;
  size_t wsb = cpu ? cpu->op_workspace(cpu, &wop) : 0;
  void *ws = malloc(wsb ? wsb : 1);
  float gamma[BN_C], bias[BN_C], st[2][8][BN_C]; /* per side: rmean, rvar, smean, sinvstd, dgamma, dbias */
  for (size_t i = 0; i < BN_CNT; i++) {
    x[i] = (float)((i * 2654435761u) % 1000) / 250.0f - 1.5f + 0.05f * (float)((i / BN_HW) % BN_C);
    dy[i] = (float)((i * 40503u) % 997) / 500.0f - 1.0f, s[i] = (float)((i * 7919u) % 991) / 400.0f - 1.2f;
  }
  for (int j = 0; j < BN_C; j++) gamma[j] = 1.0f + 0.02f * j, bias[j] = 0.05f * j - 0.4f;
  to_blk(x, xb), to_blk(dy, dyb), to_blk(s, sb);
  TT_CHECK(wsb > 0 && wsb != TT_WS_ERROR, "op_workspace of a blocked batch norm: %zu", wsb);
  int ok = wsb > 0 && wsb != TT_WS_ERROR && cpu && cpu1 && ref && x && dy && s && xb && dyb && sb && y && yb && yb2 && dx && dxb && ds && dsb && gb && mask && ws;
  TT_CHECK(ok, "setup");
  for (int relu = 0; ok && relu < 3; relu++) { /* 0 plain, 1 ReLU, 2 add + ReLU */
    /* forward: reference bn_fwd_train (then add, relu) against bn_blk */
    for (int k = 0; k < 2; k++)
      for (int j = 0; j < BN_C; j++) st[k][0][j] = 0.1f * j, st[k][1][j] = 1.0f + 0.01f * j, st[k][4][j] = 0.25f, st[k][5][j] = -0.5f;
    int rc = ref->bn_fwd_train(ref, BN_N, BN_C, BN_HW, TT_F32, x, gamma, bias, y, st[1][0], st[1][1], 0.1f, 1e-5f, st[1][2],
                               st[1][3], 1, NULL, 0);
    if (!rc && relu == 2) rc = ref->add(ref, BN_CNT, TT_F32, y, s, y);
    if (!rc && relu) rc = ref->act_fwd(ref, TT_ACT_RELU, BN_CNT, TT_F32, y, y);
    TT_CHECK(rc == 0, "reference forward: %s", ref->last_error(ref));
    tt_bn_blk_args a;
    memset(&a, 0, sizeof a);
    a.kind = relu == 2 ? TT_BNB_FWD_ADD_RELU : TT_BNB_FWD_TRAIN, a.relu = relu != 0, a.n = BN_N, a.c = BN_C, a.hw = BN_HW;
    a.dt = TT_F32, a.eps = 1e-5f, a.momentum = 0.1f, a.update_running = 1, a.x = xb, a.s = relu == 2 ? sb : NULL;
    a.gamma = gamma, a.bias = bias, a.running_mean = st[0][0], a.running_var = st[0][1], a.save_mean = st[0][2];
    a.save_invstd = st[0][3], a.out = yb, a.ws = ws, a.ws_bytes = wsb;
    rc = cpu->bn_blk(cpu, &a);
    TT_CHECK(rc == 0, "bn_blk forward (relu %d): %s", relu, cpu->last_error(cpu));
    double wy = blk_diff(yb, y), wst = 0.0;
    for (int q = 0; q < 4; q++) wst = fmax(wst, vec_diff(st[0][q], st[1][q], BN_C));
    printf("  forward (%s): y %.3g, statistics %.3g\n", relu == 2 ? "add + ReLU" : relu ? "ReLU" : "plain", wy, wst);
    TT_CHECK(wy <= 1e-5 && wst <= 1e-5, "forward (relu %d): y differs by %.3g, statistics by %.3g", relu, wy, wst);
    /* one thread: the same bits (units do not depend on the thread that takes them) */
    float st1[4][BN_C];
    memcpy(st1[0], st[0][0], sizeof st1[0]), memcpy(st1[1], st[0][1], sizeof st1[1]);
    a.out = yb2, a.running_mean = st1[0], a.running_var = st1[1], a.save_mean = st1[2], a.save_invstd = st1[3];
    a.update_running = 0;
    rc = cpu1->bn_blk(cpu1, &a);
    TT_CHECK(rc == 0 && !memcmp(yb, yb2, BN_CNT * 4) && !memcmp(st1[2], st[0][2], sizeof st1[2]) &&
                 !memcmp(st1[3], st[0][3], sizeof st1[3]),
             "forward (relu %d): 1 and 2 threads give other bits", relu);
    if (relu == 0) { /* bn_apply from the saved statistics: bit for bit the training forward's y */
      tt_bn_blk_args ap = a;
      ap.kind = TT_BNB_APPLY, ap.relu = 0, ap.save_mean = st[0][2], ap.save_invstd = st[0][3], ap.out = yb2;
      rc = cpu->bn_blk(cpu, &ap);
      TT_CHECK(rc == 0 && !memcmp(yb, yb2, BN_CNT * 4), "apply: not the training forward's bits (%s)", cpu->last_error(cpu));
      /* inference from the running statistics (y, the plain forward's, is not needed after this) */
      rc = ref->bn_fwd_infer(ref, BN_N, BN_C, BN_HW, TT_F32, x, gamma, bias, st[1][0], st[1][1], 1e-5f, y, NULL, 0);
      ap.kind = TT_BNB_FWD_INFER, ap.running_mean = st[1][0], ap.running_var = st[1][1];
      if (!rc) rc = cpu->bn_blk(cpu, &ap);
      TT_CHECK(rc == 0 && blk_diff(yb2, y) <= 1e-5, "inference: %.3g (%s)", blk_diff(yb2, y), cpu->last_error(cpu));
    }
    /* backward into dx (added into: beta 1) and the parameter gradients (beta 1) */
    for (size_t i = 0; i < BN_CNT; i++) dx[i] = 0.5f;
    for (size_t i = 0; i < BN_CNT; i++) dxb[i] = 0.5f, ds[i] = 0.25f, dsb[i] = 0.25f;
    memcpy(gb, dy, BN_CNT * 4);
    /* reference: the ReLU's backward on its output y (relu(bn(x)) or relu(bn(x) + s): the forward's,
     * still in y), into ds for the shortcut, then bn_bwd */
    if (relu) rc = ref->act_bwd(ref, TT_ACT_RELU, BN_CNT, TT_F32, y, gb, gb, 0.0f);
    if (!rc && relu == 2) rc = ref->accumulate(ref, BN_CNT, TT_F32, gb, ds, 1.0f);
    if (!rc)
      rc = ref->bn_bwd(ref, BN_N, BN_C, BN_HW, TT_F32, x, gb, gamma, st[1][2], st[1][3], dx, st[1][4], st[1][5], 1.0f, 1.0f,
                       NULL, 0);
    TT_CHECK(rc == 0, "reference backward: %s", ref->last_error(ref));
    memcpy(gb, dyb, BN_CNT * 4);
    tt_bn_blk_args b;
    memset(&b, 0, sizeof b);
    b.kind = relu == 2 ? TT_BNB_BWD_ADD_RELU : TT_BNB_BWD, b.relu = relu == 1, b.n = BN_N, b.c = BN_C, b.hw = BN_HW;
    b.dt = TT_F32, b.x = xb, b.dy = gb, b.gamma = gamma, b.bias = relu == 1 ? bias : NULL, b.save_mean = st[0][2];
    b.save_invstd = st[0][3], b.out = dxb, b.dgamma = st[0][4], b.dbias = st[0][5], b.beta_dx = 1.0f, b.beta_param = 1.0f;
    b.ws = ws, b.ws_bytes = wsb;
    if (relu == 2) {
      b.ds = dsb, b.beta_s = 1.0f;
      if (cpu->act_mask(cpu, TT_ACT_RELU, BN_CNT, TT_F32, yb, mask)) TT_CHECK(0, "act_mask: %s", cpu->last_error(cpu));
      b.mask = mask; /* the 1-bit form (the y form is the same call's other branch: cpu_bn_blk.c) */
    }
    rc = cpu->bn_blk(cpu, &b);
    TT_CHECK(rc == 0, "bn_blk backward (relu %d): %s", relu, cpu->last_error(cpu));
    double wdx = blk_diff(dxb, dx), wds = relu == 2 ? blk_diff(dsb, ds) : 0.0;
    double wp = fmax(vec_diff(st[0][4], st[1][4], BN_C), vec_diff(st[0][5], st[1][5], BN_C));
    printf("  backward (%s): dx %.3g, ds %.3g, dgamma and dbias %.3g\n", relu == 2 ? "add + ReLU" : relu ? "ReLU" : "plain", wdx,
           wds, wp);
    TT_CHECK(wdx <= 1e-5 && wds <= 1e-6 && wp <= 2e-5, "backward (relu %d): dx %.3g, ds %.3g, parameters %.3g", relu, wdx, wds,
             wp);
    if (relu == 1) { /* no dx (frozen layers before it): the same parameter gradients, nothing else written */
      float pg[2][BN_C];
      memcpy(gb, dyb, BN_CNT * 4);
      for (int j = 0; j < BN_C; j++) pg[0][j] = pg[1][j] = 0.0f;
      b.out = NULL, b.dgamma = pg[0], b.dbias = pg[1], b.beta_param = 0.0f;
      rc = cpu->bn_blk(cpu, &b);
      int same = 1;
      for (int j = 0; j < BN_C; j++) /* st[0][4..5] = 0.25 and -0.5 plus the same sums (beta 1) */
        same &= fabs((double)pg[0][j] + 0.25 - st[0][4][j]) <= 1e-5 * (1.0 + fabs(st[0][4][j])) &&
                fabs((double)pg[1][j] - 0.5 - st[0][5][j]) <= 1e-5 * (1.0 + fabs(st[0][5][j]));
      TT_CHECK(rc == 0 && same, "backward without dx: rc %d (%s), parameter gradients %s", rc, cpu->last_error(cpu),
               same ? "equal" : "differ");
    }
  }
  /* refusals, each naming what is wrong */
  if (ok) {
    tt_bn_blk_args a;
    memset(&a, 0, sizeof a);
    a.kind = TT_BNB_FWD_TRAIN, a.n = BN_N, a.c = 24, a.hw = BN_HW, a.dt = TT_F32, a.x = xb, a.gamma = gamma, a.bias = bias;
    a.save_mean = st[0][2], a.save_invstd = st[0][3], a.out = yb, a.ws = ws, a.ws_bytes = wsb;
    TT_CHECK(cpu->bn_blk(cpu, &a) != 0 && strstr(cpu->last_error(cpu), "multiple of 16"), "c = 24: '%s'", cpu->last_error(cpu));
    a.c = BN_C, a.dt = TT_BF16;
    TT_CHECK(cpu->bn_blk(cpu, &a) != 0 && strstr(cpu->last_error(cpu), "fp32"), "bf16: '%s'", cpu->last_error(cpu));
    a.dt = TT_F32, a.ws_bytes = wsb / 2;
    TT_CHECK(cpu->bn_blk(cpu, &a) != 0 && strstr(cpu->last_error(cpu), "workspace"), "short workspace: '%s'", cpu->last_error(cpu));
    a.ws_bytes = wsb, a.out = NULL;
    TT_CHECK(cpu->bn_blk(cpu, &a) != 0 && strstr(cpu->last_error(cpu), "NULL"), "no y: '%s'", cpu->last_error(cpu));
  }
  free(x), free(dy), free(s), free(xb), free(dyb), free(sb), free(y), free(yb), free(yb2), free(dx), free(dxb), free(ds);
  free(dsb), free(gb), free(mask), free(ws);
  if (cpu) cpu->destroy(cpu);
  if (cpu1) cpu1->destroy(cpu1);
  if (ref) ref->destroy(ref);
  TT_TEST_END();
}

/* ---- training ---- */

static void test_blk_train(void) {
  TT_TEST_BEGIN("layout_blk_train_equals_nhwc_and_ref");
  char recipe[128], err[1024], a[192], b[192], where[256];
  snprintf(recipe, sizeof recipe, "%s/blk.recipe", tt_test_dir());
  FILE *f = fopen(recipe, "w");
  if (f) fputs(blk_recipe, f), fclose(f);
  int ok = f && !layout_train(recipe, "onednn", "nchw16c", TT_PRECISION_FP32, "blk", 4, err, sizeof err);
  TT_CHECK(ok, "oneDNN nChw16c run: %s", f ? err : "cannot write the recipe");
  if (ok) ok = !layout_train(recipe, "onednn", "nhwc", TT_PRECISION_FP32, "blk_nhwc", 4, err, sizeof err);
  TT_CHECK(ok, "oneDNN NHWC run: %s", err);
  if (ok) ok = !layout_train(recipe, "ref", NULL, TT_PRECISION_FP32, "blk_ref", 4, err, sizeof err);
  TT_CHECK(ok, "reference run: %s", err);
  if (ok) {
    snprintf(a, sizeof a, "%s/blk/weights.safetensors", tt_test_dir());
    for (int k = 0; k < 2; k++) {
      snprintf(b, sizeof b, "%s/%s/weights.safetensors", tt_test_dir(), k ? "blk_ref" : "blk_nhwc");
      double d = weights_diff(a, b, where, sizeof where);
      printf("  nChw16c against %s after 4 steps: worst relative difference %.3g (%s)\n", k ? "the reference" : "NHWC", d, where);
      TT_CHECK(d >= 0.0 && d <= 2e-4, "against %s: %.3g > 2e-4 at %s", k ? "the reference" : "NHWC", d, where);
    }
  }
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
    TT_TEST("blk_plan", "compile layout", test_blk_plan),
    TT_TEST("blk_bn", "compile layout kernels cpu", test_blk_bn),
    TT_TEST("blk_train", "compile layout", test_blk_train),
};

int main(int argc, char **argv) {
  tt_cpu_isa_hold(tt_knobs_get()->be.cpu_isa, NULL, 0); /* TINYTRAIN_CPU_ISA, for the backends made without knobs */
  return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL);
}
