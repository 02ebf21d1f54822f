/* tests/compile/test_layout.c — activations in the layout the oneDNN convolutions want (lower.c's
 * lower_layouts, backend.h's `layouts`):
 *   - planning: on the oneDNN backend (its default; TINYTRAIN_LAYOUT=nhwc) the tensors between convolutions are NHWC (a residual trunk
 *     through add, pooling, concat, batch norm and ReLU; global average pooling reads NHWC), the
 *     input, a linear layer's output, what flatten reads and a dropout's group stay NCHW; no
 *     buffer grows (no padding); the reference backend and TINYTRAIN_LAYOUT=nchw plan NCHW only,
 *     with no TT_SF_NHWC step;
 *   - training: the same steps on the oneDNN backend in NHWC (TINYTRAIN_LAYOUT=nhwc), in NCHW
 *     and on the reference backend end with the same weights (within 2e-4 relative: only the
 *     summation order differs), fp32 and fp16; and the weights files hold PyTorch's layout in
 *     both (they agree). Comparisons of activations with the reference go through these
 *     weights, which no layout changes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/knobs.h"
#include "core/base/safetensors.h"
#include "core/compile/graph.h"
#include "core/compile/program.h"
#include "core/compile/recipe.h"
#include "core/tinytrain.h"
#include "kernels/backend.h"
#include "kernels/kernel_math.h"
#include "tests/tt_test.h"
#include "tests/compile/layout_train.h"

/* c1 reads the image (NCHW) and writes NHWC; b1 (with its ReLU, a node of its own), p1, c2, b2,
 * cat (concat of b2 and p1), c3, a (add of c3 and cat) and r2 are NHWC, joined through add and
 * concat; d (dropout: its mask is defined on NCHW indices) keeps its group NCHW, so c5 writes
 * NCHW from an NHWC input and c6 NHWC from an NCHW one; ap, r3 NHWC; g (global average pool)
 * reads NHWC and writes [N, c]; fl and fc NCHW. */
static const char *layout_recipe =
    "[net]\ninput = 3x12x12\nclasses = 5\n"
    "[train]\nbatch = 8\nepochs = 1\noptimizer = sgd\nlr = 0.05\nmomentum = 0.9\nseed = 11\n"
    "[data]\nformat = synthetic\nmean = 0.5\nstd = 0.25\n"
    "[conv c1]\nfilters = 8\nsize = 3\npad = 1\nbias = false\n"
    "[bn b1]\nactivation = relu\n"
    "[maxpool p1]\nsize = 2\n"
    "[conv c2]\nfilters = 8\nsize = 3\npad = 1\n"
    "[bn b2]\n"
    "[concat cat]\nfrom = b2, p1\n"
    "[conv c3]\nfilters = 16\nsize = 1\n"
    "[add a]\nfrom = c3, cat\n"
    "[relu r2]\n"
    "[conv c5]\nfilters = 16\nsize = 3\npad = 1\n"
    "[dropout d]\np = 0.2\n"
    "[conv c6]\nfilters = 16\nsize = 3\npad = 1\n"
    "[avgpool ap]\nsize = 2\n"
    "[relu r3]\n"
    "[gap g]\n"
    "[flatten fl]\n"
    "[linear fc]\nout = 5\n";

/* c1 reads the image and writes NHWC; b1 and p1 NHWC (p1 read by a convolution); c2 writes NCHW
 * for d (dropout), so p2 reads NCHW and, though only a convolution reads it, writes NCHW too (a
 * pooling changes the layout only from NHWC to NCHW); c3 writes NHWC, b3 NHWC, and p3 ends that
 * group: it reads NHWC and writes NCHW for the flatten (tt_pool_desc.y_nchw). */
static const char *pool_recipe =
    "[net]\ninput = 3x16x16\nclasses = 5\n"
    "[train]\nbatch = 8\nepochs = 1\noptimizer = sgd\nlr = 0.05\nmomentum = 0.9\nseed = 5\n"
    "[data]\nformat = synthetic\nmean = 0.5\nstd = 0.25\n"
    "[conv c1]\nfilters = 8\nsize = 3\npad = 1\nbias = false\n[bn b1]\nactivation = relu\n[maxpool p1]\nsize = 2\n"
    "[conv c2]\nfilters = 8\nsize = 3\npad = 1\n[dropout d]\np = 0.2\n[avgpool p2]\nsize = 2\n"
    "[conv c3]\nfilters = 12\nsize = 3\npad = 1\nbias = false\n[bn b3]\nactivation = relu\n[maxpool p3]\nsize = 2\n"
    "[flatten fl]\n[linear fc]\nout = 5\n";

/* Lowers a recipe (NULL: layout_recipe) on be at micro-batch 4, compact saves on where compact is 1;
 * 0 on success. */
static int layout_lower_text(tt_backend *be, const char *text, int compact, tt_model *m, tt_graph *g, tt_program *p,
                             tt_err *e) {
  tt_policy pol;
  memset(&pol, 0, sizeof pol);
  pol.micro_batch = 4, pol.accum_steps = 1, pol.act_dtype = TT_F32, pol.training = 1, pol.inplace = 1, pol.compact = compact;
  memset(m, 0, sizeof *m);
  memset(g, 0, sizeof *g);
  memset(p, 0, sizeof *p);
  if (tt_recipe_parse("layout.recipe", text ? text : layout_recipe, m, e, NULL, NULL) || tt_graph_build(m, g, e) ||
      tt_lower(g, &pol, be, p, e) || tt_program_plan(p, e))
    return -1;
  return 0;
}
static int layout_lower(tt_backend *be, tt_model *m, tt_graph *g, tt_program *p, tt_err *e) {
  return layout_lower_text(be, NULL, 0, m, g, p, e);
}

static void test_plan_layouts(void) {
  TT_TEST_BEGIN("layout_plan_cpu_nhwc_between_convs");
  { /* NHWC is the default, and nChw16c where oneDNN runs AVX-512 (its Winograd convolutions:
     * test_layout_blk.c); TINYTRAIN_LAYOUT=nchw asks for plain NCHW (cpu_backend.c says why) */
    tt_backend *dflt = tt_cpu_backend_create(1);
    unsigned want = (1u << TT_LAYOUT_NHWC) | (strstr(tt_cpu_backend_info(), "avx512_core") ? 1u << TT_LAYOUT_NCHW16C : 0u);
    TT_CHECK(dflt && dflt->layouts == want, "the oneDNN backend lists layouts %u without TINYTRAIN_LAYOUT, expected %u (%s)",
             dflt ? dflt->layouts : 0u, want, tt_cpu_backend_info());
    if (dflt) dflt->destroy(dflt);
  }
  tt_backend_knobs kn;
  tt_backend_knobs_default(&kn);
  kn.layout = TT_LAYOUT_NHWC; /* TINYTRAIN_LAYOUT=nhwc */
  tt_backend *be = tt_cpu_backend_create_knobs(1, &kn);
  tt_model m;
  tt_graph g;
  tt_program p;
  tt_err e;
  TT_CHECK(be && (be->layouts & (1u << TT_LAYOUT_NHWC)), "the oneDNN backend does not list NHWC");
  if (be && !layout_lower(be, &m, &g, &p, &e)) {
    static const char *nhwc[] = {"c1", "b1", "p1", "c2", "b2", "cat", "c3", "a", "r2", "c6", "ap", "r3"};
    static const char *nchw[] = {"input", "c5", "d", "g", "fl", "fc"};
    for (size_t i = 0; i < sizeof nhwc / sizeof nhwc[0]; i++) {
      int v = node_of(&m, nhwc[i]);
      TT_CHECK(v >= 0 && p.layout[v] == TT_LAYOUT_NHWC, "%s: %s, expected NHWC", nhwc[i], v >= 0 ? tt_layout_name(p.layout[v]) : "absent");
    }
    for (size_t i = 0; i < sizeof nchw / sizeof nchw[0]; i++) {
      int v = node_of(&m, nchw[i]);
      TT_CHECK(v >= 0 && p.layout[v] == TT_LAYOUT_NCHW, "%s: %s, expected NCHW", nchw[i], v >= 0 ? tt_layout_name(p.layout[v]) : "absent");
    }
    /* the list and b1's ReLU */
    TT_CHECK(p.n_nhwc == (int)(sizeof nhwc / sizeof nhwc[0]) + 1, "%d NHWC nodes, expected %d", p.n_nhwc,
             (int)(sizeof nhwc / sizeof nhwc[0]) + 1);
    /* c1 (image in), c5 (NHWC in, NCHW out), c6 (NCHW in, NHWC out); c2, c3 stay NHWC */
    TT_CHECK(p.n_layout_convs == 3, "%d layout-changing convolutions, expected 3", p.n_layout_convs);
    int conv_seen = 0, bn_nhwc = 0, gap_pool = 0;
    for (int si = 0; si < p.nsteps; si++) {
      const tt_step *s = &p.steps[si];
      if (s->op != TT_S_FWD && s->op != TT_S_BWD) continue;
      if (s->kind == TT_L_CONV && s->node == node_of(&m, "c5")) {
        conv_seen++;
        TT_CHECK(s->a.conv.layout_x == TT_LAYOUT_NHWC && s->a.conv.layout_y == TT_LAYOUT_NCHW, "c5: desc layouts %d -> %d",
                 s->a.conv.layout_x, s->a.conv.layout_y);
      }
      if (s->kind == TT_L_BN) bn_nhwc += (s->flags & TT_SF_NHWC) != 0;
      if (s->kind == TT_L_GAP) gap_pool += (s->flags & TT_SF_NHWC) != 0;
      if (s->kind == TT_L_MAXPOOL) TT_CHECK(s->a.pool.layout == TT_LAYOUT_NHWC, "p1: pool desc layout %d", s->a.pool.layout);
    }
    TT_CHECK(conv_seen >= 2, "c5's forward and backward steps not found (%d)", conv_seen);
    TT_CHECK(bn_nhwc == 4, "%d batch-norm steps flagged NHWC, expected 4 (2 forward, 2 backward)", bn_nhwc);
    TT_CHECK(gap_pool == 2, "%d gap steps flagged NHWC (their input), expected 2", gap_pool);
    /* the same plan in NCHW: every value buffer has the same bytes (NHWC has no padding) */
    tt_program q;
    tt_model m2;
    tt_graph g2;
    kn.layout = TT_LAYOUT_NCHW; /* TINYTRAIN_LAYOUT=nchw */
    tt_backend *plain = tt_cpu_backend_create_knobs(1, &kn);
    TT_CHECK(plain && plain->layouts == 0, "TINYTRAIN_LAYOUT=nchw: the backend still lists layouts %u", plain ? plain->layouts : 0u);
    if (plain && !layout_lower(plain, &m2, &g2, &q, &e)) {
      TT_CHECK(q.n_nhwc == 0 && q.n_layout_convs == 0, "TINYTRAIN_LAYOUT=nchw planned %d NHWC nodes", q.n_nhwc);
      for (int v = 0; v < g.nnodes; v++)
        if (p.value_buf[v] >= 0 && q.value_buf[v] >= 0)
          TT_CHECK(p.bufs[p.value_buf[v]].bytes == q.bufs[q.value_buf[v]].bytes, "%s: %zu bytes in NHWC, %zu in NCHW",
                   m.layers[v].name, p.bufs[p.value_buf[v]].bytes, q.bufs[q.value_buf[v]].bytes);
      for (int si = 0; si < q.nsteps; si++) TT_CHECK(!(q.steps[si].flags & TT_SF_NHWC), "an NCHW plan has an NHWC step");
      tt_program_free(&q);
      tt_graph_free(&g2);
      tt_model_free(&m2);
    } else if (plain) {
      TT_CHECK(0, "lowering in NCHW: %s", e.msg);
    }
    if (plain) plain->destroy(plain);
    tt_program_free(&p);
    tt_graph_free(&g);
    tt_model_free(&m);
  } else if (be) {
    TT_CHECK(0, "lowering: %s", e.msg);
  }
  if (be) be->destroy(be);
  TT_TEST_END();

  TT_TEST_BEGIN("layout_plan_ref_nchw_only");
  tt_backend *ref = tt_ref_backend_create(1);
  TT_CHECK(ref && ref->layouts == 0, "the reference backend lists layouts");
  if (ref && !layout_lower(ref, &m, &g, &p, &e)) {
    TT_CHECK(p.n_nhwc == 0, "the reference backend got %d NHWC nodes", p.n_nhwc);
    tt_program_free(&p);
    tt_graph_free(&g);
    tt_model_free(&m);
  } else if (ref) {
    TT_CHECK(0, "lowering: %s", e.msg);
  }
  if (ref) ref->destroy(ref);
  /* the reference loops refuse a layout they do not run, naming it */
  if ((ref = tt_ref_backend_create(1))) {
    tt_conv_desc d;
    memset(&d, 0, sizeof d);
    d.n = 1, d.c = 2, d.h = d.w = 4, d.k = 2, d.r = d.s = 1, d.stride_h = d.stride_w = 1, d.groups = 1, d.p = d.q = 4;
    d.layout_y = TT_LAYOUT_NHWC;
    TT_CHECK(ref->conv_workspace(ref, &d, TT_F32, TT_WS_FWD) == TT_WS_ERROR && strstr(ref->last_error(ref), "NHWC"),
             "ref conv_workspace of an NHWC desc: '%s'", ref->last_error(ref));
    ref->destroy(ref);
  }
  TT_TEST_END();
}

/* The pool desc of node name's forward step in p (NULL: none). */
static const tt_pool_desc *pool_fwd_desc(const tt_program *p, const tt_model *m, const char *name) {
  for (int si = 0; si < p->nsteps; si++)
    if (p->steps[si].op == TT_S_FWD && p->steps[si].node == node_of(m, name)) return &p->steps[si].a.pool;
  return NULL;
}

/* Where a pooling ends an NHWC group (pool_recipe, the CPU backend's pool_y_nchw): p3 reads NHWC
 * and writes NCHW, p1 stays NHWC, p2 (NCHW input) NCHW; the same layouts when the policy offers
 * compact saves (so a compact plan computes the same bits: test_equiv), where p1 and p3 save
 * their winners; on a backend without pool_y_nchw c3, b3 and p3 are NCHW as before. */
static void test_pool_ends(void) {
  TT_TEST_BEGIN("layout_plan_pool_ends_nhwc_group");
  tt_backend *be = tt_cpu_backend_create(1);
  tt_model m;
  tt_graph g;
  tt_program p;
  tt_err e;
  TT_CHECK(be && be->pool_y_nchw == 1, "the CPU backend does not list pool_y_nchw");
  for (int form = 0; be && form < 3; form++) { /* 0: as planned; 1: compact saves offered; 2: no pool_y_nchw */
    be->pool_y_nchw = form != 2;
    if (layout_lower_text(be, pool_recipe, form == 1, &m, &g, &p, &e)) {
      TT_CHECK(0, "lowering (form %d): %s", form, e.msg);
      break;
    }
    static const char *names[] = {"c1", "b1", "p1", "c2", "p2", "c3", "b3", "p3"};
    static const unsigned char want[3][8] = {{1, 1, 1, 0, 0, 1, 1, 0}, {1, 1, 1, 0, 0, 1, 1, 0}, {1, 1, 1, 0, 0, 0, 0, 0}};
    for (int i = 0; i < 8; i++) {
      int v = node_of(&m, names[i]);
      TT_CHECK(v >= 0 && p.layout[v] == (want[form][i] ? TT_LAYOUT_NHWC : TT_LAYOUT_NCHW), "form %d: %s is %s", form, names[i],
               v >= 0 ? tt_layout_name(p.layout[v]) : "absent");
    }
    const tt_pool_desc *d1 = pool_fwd_desc(&p, &m, "p1"), *d2 = pool_fwd_desc(&p, &m, "p2"), *d3 = pool_fwd_desc(&p, &m, "p3");
    TT_CHECK(d1 && d2 && d3, "form %d: a pooling's forward step is missing", form);
    if (d1 && d2 && d3) {
      TT_CHECK(d1->layout == TT_LAYOUT_NHWC && !d1->y_nchw && d2->layout == TT_LAYOUT_NCHW && !d2->y_nchw,
               "form %d: p1 layout %d y_nchw %d, p2 layout %d y_nchw %d", form, d1->layout, d1->y_nchw, d2->layout, d2->y_nchw);
      TT_CHECK(d3->layout == (form == 2 ? TT_LAYOUT_NCHW : TT_LAYOUT_NHWC) && d3->y_nchw == (form != 2),
               "form %d: p3 layout %d y_nchw %d", form, d3->layout, d3->y_nchw);
    }
    TT_CHECK(p.n_layout_pools == (form != 2), "form %d: %d layout-changing poolings", form, p.n_layout_pools);
    if (form == 1) { /* p1 and p3 (NHWC into NCHW: pool_bwd_idx reads the NCHW dy) save their winners */
      int c1 = 0, c3 = 0;
      for (int si = 0; si < p.nsteps; si++)
        if (p.steps[si].op == TT_S_FWD && (p.steps[si].flags & TT_SF_COMPACT))
          c1 += p.steps[si].node == node_of(&m, "p1"), c3 += p.steps[si].node == node_of(&m, "p3");
      TT_CHECK(c1 == 1 && c3 == 1, "compact saves: p1 %d, p3 %d (expected 1 each)", c1, c3);
    }
    tt_program_free(&p);
    tt_graph_free(&g);
    tt_model_free(&m);
  }
  if (be) be->destroy(be);
  TT_TEST_END();
}

/* pool_fwd and pool_bwd with y_nchw on the CPU backend (x and dx NHWC, y and dy NCHW) against
 * the reference on NCHW: max pooling bit for bit (fp32, bf16), average within rounding; fp16 (the
 * reference loops inside) too; the compact save's winners and pool_bwd_idx from the NCHW dy bit for
 * bit (fp32, bf16; fp16 refused, as lowering never asks); a short workspace refused naming it, and
 * the reference backend refusing y_nchw. */
static void test_pool_y_nchw(void) {
  TT_TEST_BEGIN("layout_pool_y_nchw_cpu_equals_ref");
  tt_backend *cpu = tt_cpu_backend_create(2), *ref = tt_ref_backend_create(1);
  tt_pool_desc d;
  memset(&d, 0, sizeof d);
  d.n = 3, d.c = 20, d.h = 9, d.w = 10, d.kh = d.kw = 2, d.stride_h = d.stride_w = 2, d.p = 4, d.q = 5;
  const size_t xn = (size_t)d.n * d.c * d.h * d.w, yn = (size_t)d.n * d.c * d.p * d.q, hw = (size_t)d.h * d.w;
  static const tt_dtype dts[3] = {TT_F32, TT_BF16, TT_F16};
  for (int k = 0; k < 3 && cpu && ref; k++)
    for (int mode = 0; mode < 2; mode++) {
      tt_dtype dt = dts[k];
      size_t es = tt_dtype_size(dt);
      char *x = (char *)malloc(xn * es), *xh = (char *)malloc(xn * es), *dy = (char *)malloc(yn * es);
      char *y[2] = {(char *)malloc(yn * es), (char *)malloc(yn * es)}, *dx[2] = {(char *)malloc(xn * es), (char *)malloc(xn * es)};
      for (size_t i = 0; i < xn; i++) { /* values with ties; x NCHW, xh its NHWC copy */
        float v = (float)((i * 2654435761u) % 97) / 8.0f - 6.0f, g = (float)((i * 40503u) % 89) / 16.0f - 2.5f;
        size_t n = i / (d.c * hw), c = i / hw % d.c, j = i % hw, ih = (n * hw + j) * d.c + c;
        uint16_t hv = dt == TT_F16 ? tt_f32_to_f16(v) : tt_bf16_from_f32(v), hg = dt == TT_F16 ? tt_f32_to_f16(g) : tt_bf16_from_f32(g);
        if (es == 4) memcpy(x + i * 4, &v, 4), memcpy(xh + ih * 4, &v, 4);
        else memcpy(x + i * 2, &hv, 2), memcpy(xh + ih * 2, &hv, 2);
        if (i < yn) memcpy(dy + i * es, es == 4 ? (void *)&g : (void *)&hg, es);
      }
      tt_pool_desc dh = d;
      dh.layout = TT_LAYOUT_NHWC, dh.y_nchw = 1;
      tt_op_desc of, ob;
      memset(&of, 0, sizeof of);
      of.kind = TT_OP_POOL_FWD, of.dt = dt, of.pool_mode = (tt_pool_mode)mode, of.u.pool = dh;
      ob = of, ob.kind = TT_OP_POOL_BWD;
      size_t wf = cpu->op_workspace(cpu, &of), wb = cpu->op_workspace(cpu, &ob);
      void *ws = malloc((wf > wb ? wf : wb) + 1);
      int rc = cpu->pool_fwd(cpu, &dh, (tt_pool_mode)mode, dt, xh, y[0], ws, wf) ||
               cpu->pool_bwd(cpu, &dh, (tt_pool_mode)mode, dt, xh, dy, dx[0], 0.0f, ws, wb);
      TT_CHECK(!rc, "%s %s: %s", tt_dtype_name(dt), mode ? "avg" : "max", cpu->last_error(cpu));
      rc = ref->pool_fwd(ref, &d, (tt_pool_mode)mode, dt, x, y[1], NULL, 0) ||
           ref->pool_bwd(ref, &d, (tt_pool_mode)mode, dt, x, dy, dx[1], 0.0f, NULL, 0);
      TT_CHECK(!rc, "ref %s: %s", tt_dtype_name(dt), ref->last_error(ref));
      double worst = 0.0;
      for (size_t i = 0; i < yn + xn; i++) { /* y as is (both NCHW); dx: the CPU's NHWC against the reference's NCHW */
        size_t n = (i - yn) / (d.c * hw), c = (i - yn) / hw % d.c, j = (i - yn) % hw;
        const char *a = i < yn ? y[0] + i * es : dx[0] + ((n * hw + j) * d.c + c) * es, *r = i < yn ? y[1] + i * es : dx[1] + (i - yn) * es;
        float fa, fr;
        uint16_t ha, hr;
        if (es == 4) memcpy(&fa, a, 4), memcpy(&fr, r, 4);
        else memcpy(&ha, a, 2), memcpy(&hr, r, 2), fa = dt == TT_F16 ? tt_f16_to_f32(ha) : tt_bf16_to_f32(ha), fr = dt == TT_F16 ? tt_f16_to_f32(hr) : tt_bf16_to_f32(hr);
        worst = fmax(worst, fabs((double)fa - fr) / (1.0 + fabs(fr)));
        if (mode == TT_POOL_MAX && k < 2 && memcmp(a, r, es)) worst = fmax(worst, 1.0); /* our max loops: the reference's bits */
      }
      TT_CHECK(worst <= (mode ? 1e-2 : 0.0), "%s %s: y or dx differ from the reference by %.3g", tt_dtype_name(dt),
               mode ? "avg" : "max", worst);
      if (mode == TT_POOL_MAX) { /* the compact save's winners (NHWC, as x) and its backward from the NCHW dy */
        uint8_t *ic = (uint8_t *)malloc(yn), *ir = (uint8_t *)malloc(yn);
        int wrc = cpu->pool_argmax(cpu, &dh, dt, xh, ic) || cpu->pool_bwd_idx(cpu, &dh, dt, ic, dy, dx[0], 0.0f);
        if (k < 2) {
          TT_CHECK(!wrc, "%s winners: %s", tt_dtype_name(dt), cpu->last_error(cpu));
          TT_CHECK(!ref->pool_argmax(ref, &d, dt, x, ir) && !ref->pool_bwd_idx(ref, &d, dt, ir, dy, dx[1], 0.0f), "ref winners: %s",
                   ref->last_error(ref));
          size_t bad = 0;
          for (size_t i = 0; i < xn; i++) { /* dx: the CPU's NHWC against the reference's NCHW, bit for bit */
            size_t n = i / (d.c * hw), c = i / hw % d.c, j = i % hw;
            bad += memcmp(dx[0] + ((n * hw + j) * d.c + c) * es, dx[1] + i * es, es) != 0;
          }
          TT_CHECK(bad == 0, "%s: pool_bwd_idx from an NCHW dy differs from the reference at %zu of %zu", tt_dtype_name(dt), bad, xn);
        } else {
          TT_CHECK(wrc && strstr(cpu->last_error(cpu), "y_nchw"), "fp16 pool_bwd_idx took y_nchw: %s", cpu->last_error(cpu));
        }
        free(ic), free(ir);
      }
      if (k == 0 && mode == 0) {
        TT_CHECK(cpu->pool_fwd(cpu, &dh, TT_POOL_MAX, dt, xh, y[0], ws, wf - 1) && strstr(cpu->last_error(cpu), "workspace"),
                 "a short workspace was not refused: %s", cpu->last_error(cpu));
        TT_CHECK(ref->pool_fwd(ref, &dh, TT_POOL_MAX, dt, xh, y[1], NULL, 0) && strstr(ref->last_error(ref), "y_nchw"),
                 "the reference took y_nchw: %s", ref->last_error(ref));
      }
      free(ws), free(x), free(xh), free(dy), free(y[0]), free(y[1]), free(dx[0]), free(dx[1]);
    }
  if (cpu) cpu->destroy(cpu);
  if (ref) ref->destroy(ref);
  TT_TEST_END();
}

static void test_train_layouts(void) {
  char recipe[128], err[1024], a[192], b[192], where[256];
  snprintf(recipe, sizeof recipe, "%s/layout.recipe", tt_test_dir());
  FILE *f = fopen(recipe, "w");
  if (!f) {
    TT_CHECK(0, "cannot write %s", recipe);
    return;
  }
  fputs(layout_recipe, f);
  fclose(f);
  static const struct {
    tt_run_precision prec;
    const char *name;
    double tol;
  } runs[] = {{TT_PRECISION_FP32, "fp32", 2e-4}, {TT_PRECISION_FP16, "fp16", 2e-3}};
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
    char name[96], tn[3][32];
    snprintf(name, sizeof name, "layout_train_nhwc_equals_nchw_and_ref_%s", runs[r].name);
    TT_TEST_BEGIN(name);
    snprintf(tn[0], sizeof tn[0], "nhwc_%s", runs[r].name);
    snprintf(tn[1], sizeof tn[1], "nchw_%s", runs[r].name);
    snprintf(tn[2], sizeof tn[2], "ref_%s", runs[r].name);
    int ok = !layout_train(recipe, "onednn", "nhwc", runs[r].prec, tn[0], 4, err, sizeof err);
    TT_CHECK(ok, "oneDNN NHWC run: %s", err);
    if (ok) {
      ok = !layout_train(recipe, "onednn", "nchw", runs[r].prec, tn[1], 4, err, sizeof err);
      TT_CHECK(ok, "oneDNN NCHW run: %s", err);
    }
    if (ok) {
      ok = !layout_train(recipe, "ref", NULL, runs[r].prec, tn[2], 4, err, sizeof err);
      TT_CHECK(ok, "reference run: %s", err);
    }
    if (ok) {
      snprintf(a, sizeof a, "%s/%s/weights.safetensors", tt_test_dir(), tn[0]);
      for (int k = 1; k < 3; k++) {
        snprintf(b, sizeof b, "%s/%s/weights.safetensors", tt_test_dir(), tn[k]);
        double d = weights_diff(a, b, where, sizeof where);
        printf("  %s: NHWC against %s after 4 steps: worst relative difference %.3g (%s)\n", runs[r].name,
               k == 1 ? "oneDNN NCHW" : "the reference", d, where);
        TT_CHECK(d >= 0.0 && d <= runs[r].tol, "%s: NHWC against %s: %.3g > %.1g at %s", runs[r].name,
                 k == 1 ? "NCHW" : "the reference", d, runs[r].tol, where);
      }
    }
    TT_TEST_END();
  }
  /* pool_recipe: p3 pools NHWC into NCHW (y_nchw) on the CPU backend; 4 fp32 steps against the reference */
  TT_TEST_BEGIN("layout_train_pool_ends_equals_ref");
  snprintf(recipe, sizeof recipe, "%s/layout_pool.recipe", tt_test_dir());
  f = fopen(recipe, "w");
  if (f) fputs(pool_recipe, f), fclose(f);
  int ok = f && !layout_train(recipe, "onednn", NULL, TT_PRECISION_FP32, "pool_nhwc", 4, err, sizeof err);
  TT_CHECK(ok, "oneDNN run: %s", f ? err : "cannot write the recipe");
  if (ok) ok = !layout_train(recipe, "ref", NULL, TT_PRECISION_FP32, "pool_ref", 4, err, sizeof err);
  TT_CHECK(ok, "reference run: %s", err);
  if (ok) {
    snprintf(a, sizeof a, "%s/pool_nhwc/weights.safetensors", tt_test_dir());
    snprintf(b, sizeof b, "%s/pool_ref/weights.safetensors", tt_test_dir());
    double d = weights_diff(a, b, where, sizeof where);
    printf("  pooling into NCHW: against the reference after 4 steps: worst relative difference %.3g (%s)\n", d, where);
    TT_CHECK(d >= 0.0 && d <= 2e-4, "against the reference: %.3g > 2e-4 at %s", d, where);
  }
  TT_TEST_END();
}

/* Batch norm on an NHWC tensor as [rows, c, 1] (the CPU backend's row loops, fp32, fp16, bf16)
 * against the reference's per-channel loops on the same call: forward statistics, y, running
 * statistics, and backward dx (added into, beta 1), dgamma, dbeta. c = 37: a partial block of 16. */
static void test_bn_rows(void) {
  TT_TEST_BEGIN("layout_bn_rows_cpu_equals_ref");
  const int rows = 300, c = 37;
  const size_t cnt = (size_t)rows * c;
  tt_backend *cpu = tt_cpu_backend_create(2), *ref = tt_ref_backend_create(1);
  float *xf = (float *)malloc(cnt * 4), *dyf = (float *)malloc(cnt * 4);
  void *buf[2][4];
  float stat[2][8][64];
  for (size_t i = 0; i < cnt; i++)
    xf[i] = (float)((i * 2654435761u) % 1000) / 250.0f - 1.0f + 0.3f * (float)(i % c), dyf[i] = (float)((i * 40503u) % 997) / 500.0f - 1.0f;
  static const tt_dtype dts[3] = {TT_F32, TT_F16, TT_BF16};
  static const double tol[3] = {1e-5, 2e-3, 2e-2};
  for (int k = 0; k < 3 && cpu && ref; k++) {
    tt_dtype dt = dts[k];
    size_t es = tt_dtype_size(dt);
    for (int be = 0; be < 2; be++) {
      for (int j = 0; j < 4; j++) buf[be][j] = malloc(cnt * es);
      for (size_t i = 0; i < cnt; i++) {
        if (dt == TT_F32) ((float *)buf[be][0])[i] = xf[i], ((float *)buf[be][1])[i] = dyf[i], ((float *)buf[be][3])[i] = 0.5f;
        else {
          uint16_t hx, hdy, h5;
          if (dt == TT_F16) hx = tt_f32_to_f16(xf[i]), hdy = tt_f32_to_f16(dyf[i]), h5 = tt_f32_to_f16(0.5f);
          else hx = tt_bf16_from_f32(xf[i]), hdy = tt_bf16_from_f32(dyf[i]), h5 = tt_bf16_from_f32(0.5f);
          ((uint16_t *)buf[be][0])[i] = hx, ((uint16_t *)buf[be][1])[i] = hdy, ((uint16_t *)buf[be][3])[i] = h5;
        }
      }
      for (int j = 0; j < c; j++) {
        stat[be][0][j] = 1.0f + 0.01f * j, stat[be][1][j] = 0.1f * j; /* gamma, beta */
        stat[be][2][j] = 0.0f, stat[be][3][j] = 1.0f;                 /* running mean, var */
        stat[be][6][j] = 0.25f, stat[be][7][j] = -0.5f;               /* dgamma, dbeta: beta_param 1 adds */
      }
      tt_backend *B = be ? ref : cpu;
      int rc = B->bn_fwd_train(B, rows, c, 1, dt, buf[be][0], stat[be][0], stat[be][1], buf[be][2], stat[be][2], stat[be][3],
                               0.1f, 1e-5f, stat[be][4], stat[be][5], 1, NULL, 0);
      if (!rc)
        rc = B->bn_bwd(B, rows, c, 1, dt, buf[be][0], buf[be][1], stat[be][0], stat[be][4], stat[be][5], buf[be][3],
                       stat[be][6], stat[be][7], 1.0f, 1.0f, NULL, 0);
      TT_CHECK(rc == 0, "%s %s: %s", be ? "ref" : "cpu", tt_dtype_name(dt), B->last_error(B));
    }
    double worst = 0.0;
    for (int j = 2; j < 4; j++) /* y, dx */
      for (size_t i = 0; i < cnt; i++) {
        float a = dt == TT_F32 ? ((float *)buf[0][j])[i] : dt == TT_F16 ? tt_f16_to_f32(((uint16_t *)buf[0][j])[i]) : tt_bf16_to_f32(((uint16_t *)buf[0][j])[i]);
        float r = dt == TT_F32 ? ((float *)buf[1][j])[i] : dt == TT_F16 ? tt_f16_to_f32(((uint16_t *)buf[1][j])[i]) : tt_bf16_to_f32(((uint16_t *)buf[1][j])[i]);
        worst = fmax(worst, fabs((double)a - r) / (1.0 + fabs(r)));
      }
    for (int s = 2; s < 8; s++)
      for (int j = 0; j < c; j++) worst = fmax(worst, fabs((double)stat[0][s][j] - stat[1][s][j]) / (1.0 + fabs(stat[1][s][j])));
    printf("  %s: rows loops against the reference: worst relative difference %.3g\n", tt_dtype_name(dt), worst);
    TT_CHECK(worst <= tol[k], "%s: batch norm on rows differs from the reference by %.3g > %.1g", tt_dtype_name(dt), worst, tol[k]);
    for (int be = 0; be < 2; be++)
      for (int j = 0; j < 4; j++) free(buf[be][j]);
  }
  free(xf);
  free(dyf);
  if (cpu) cpu->destroy(cpu);
  if (ref) ref->destroy(ref);
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("plan_layouts", "compile layout", test_plan_layouts),
  TT_TEST("bn_rows", "compile layout", test_bn_rows),
  TT_TEST("train_layouts", "compile layout", test_train_layouts),
  TT_TEST("pool_ends", "compile layout", test_pool_ends),
  TT_TEST("pool_y_nchw", "compile layout kernels cpu", test_pool_y_nchw),
};

int main(int argc, char **argv) {
  tt_cpu_isa_hold(tt_knobs_get()->be.cpu_isa, NULL, 0); /* TINYTRAIN_CPU_ISA, for the backends made without knobs */
  return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL);
}
