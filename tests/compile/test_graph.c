/* tests/compile/test_graph.c — the build stage on its own: small recipes (parsed from text) ->
 * forward graph. Output shapes per layer kind, the parameters each kind owns (names, shapes,
 * roles), FLOPs, and the shape errors, each naming the recipe file and the layer's line. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/compile/graph.h"
#include "core/compile/recipe.h"
#include "tests/tt_test.h"

/* Parses `text` (messages name `path`) and builds its graph. 0: built (release with done());
 * 1: the build failed, err says why; -1: the parse failed (a mistake in the test). */
static int build(const char *path, const char *text, tt_model *m, tt_graph *g, tt_err *err) {
  err->msg[0] = 0;
  if (tt_recipe_parse(path, text, m, err, NULL, NULL)) return -1;
  if (tt_graph_build(m, g, err)) {
    tt_model_free(m);
    return 1;
  }
  return 0;
}

static void done(tt_model *m, tt_graph *g) {
  tt_graph_free(g);
  tt_model_free(m);
}

static const tt_node *node(const tt_graph *g, const char *name) {
  int i;
  for (i = 0; i < g->nnodes; i++)
    if (!strcmp(g->model->layers[i].name, name)) return &g->nodes[i];
  return NULL;
}

static const tt_param *param(const tt_graph *g, const char *name) {
  int i;
  for (i = 0; i < g->nparams; i++)
    if (!strcmp(g->params[i].name, name)) return &g->params[i];
  return NULL;
}

/* Is node `name` c x h x w? */
static int shape_is(const tt_graph *g, const char *name, int c, int h, int w) {
  const tt_node *n = node(g, name);
  return n && n->c == c && n->h == h && n->w == w;
}

static const char *shape_of(const tt_graph *g, const char *name, char *buf, size_t cap) {
  const tt_node *n = node(g, name);
  if (!n) snprintf(buf, cap, "no node '%s'", name);
  else snprintf(buf, cap, "%s is %dx%dx%d", name, n->c, n->h, n->w);
  return buf;
}

/* Does parameter `name` exist with this shape (ndim values of s)? */
static int param_is(const tt_graph *g, const char *name, int ndim, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
  const tt_param *p = param(g, name);
  int64_t s[4];
  size_t numel = 1;
  int i;
  s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
  if (!p || p->ndim != ndim) return 0;
  for (i = 0; i < ndim; i++) {
    if (p->shape[i] != s[i]) return 0;
    numel *= (size_t)s[i];
  }
  return p->numel == numel;
}

/* 1-based line of the first line of text that starts with `prefix`; 0 when none does. */
static int line_of(const char *text, const char *prefix) {
  const char *p = text;
  int line = 1;
  size_t n = strlen(prefix);
  for (;;) {
    const char *nl;
    if (!strncmp(p, prefix, n)) return line;
    nl = strchr(p, '\n');
    if (!nl) return 0;
    p = nl + 1;
    line++;
  }
}

/* The build must fail with exactly "PATH:LINE: HEAD: WHAT", LINE being the line of the section
 * that starts with `section`. Each call gives its own PATH, so a failure says which one. */
static void expect_error(const char *path, const char *text, const char *section, const char *head, const char *what) {
  tt_model m;
  tt_graph g;
  tt_err err;
  char want[1024];
  int line = line_of(text, section), rc = build(path, text, &m, &g, &err);
  TT_CHECK(line > 0, "no line starts with '%s'", section);
  snprintf(want, sizeof want, "%s:%d: %s: %s", path, line, head, what);
  if (rc == 0) {
    TT_CHECK(0, "built; want the error \"%s\"", want);
    done(&m, &g);
    return;
  }
  TT_CHECK(rc == 1, "the recipe did not parse: %s", err.msg);
  TT_CHECK(!strcmp(err.msg, want), "error\n    \"%s\"\n  want\n    \"%s\"", err.msg, want);
}

static void test_conv_shapes(void) {
  static const char text[] =
      "[net]\ninput = 4x32x32\nclasses = 10\n[train]\nbatch = 2\n"
      "[conv a]\nfilters = 8\nsize = 3\n"                                /* default pad (3-1)/2 = 1 */
      "[conv b]\nfilters = 8\nsize = 5\npad = 0\n"                       /* 32 - 5 + 1 = 28 */
      "[conv c]\nfilters = 16\nsize = 3\nstride = 2\n"                   /* (28 + 2 - 3) / 2 + 1 = 14 */
      "[conv d]\nfilters = 16\nsize = 3x5\nstride = 1x2\npad = 0x1\n"    /* 12 x ((14 + 2 - 5) / 2 + 1 = 6) */
      "[conv e]\nfilters = 32\nsize = 1\ngroups = 4\n"                   /* 16 / 4 = 4 channels per group */
      "[conv f]\nfilters = 64\nsize = 3\ngroups = depthwise\nbias = false\n" /* groups = 32 input channels */
      "[gap]\n[linear]\nout = 10\n";
  tt_model m;
  tt_graph g;
  tt_err err;
  char s[128], s2[128];
  TT_TEST_BEGIN("graph_conv_shapes");
  if (build("mem/conv.recipe", text, &m, &g, &err) != 0) {
    TT_CHECK(0, "%s", err.msg);
    TT_TEST_END();
    return;
  }
  TT_CHECK(g.nnodes == 9 && shape_is(&g, "input", 4, 32, 32), "nnodes %d, %s", g.nnodes, shape_of(&g, "input", s, sizeof s));
  TT_CHECK(shape_is(&g, "a", 8, 32, 32), "padding 1 keeps the size: %s", shape_of(&g, "a", s, sizeof s));
  TT_CHECK(shape_is(&g, "b", 8, 28, 28), "no padding: %s", shape_of(&g, "b", s, sizeof s));
  TT_CHECK(shape_is(&g, "c", 16, 14, 14), "stride 2: %s", shape_of(&g, "c", s, sizeof s));
  TT_CHECK(shape_is(&g, "d", 16, 12, 6), "HxW size, stride and pad: %s", shape_of(&g, "d", s, sizeof s));
  TT_CHECK(shape_is(&g, "e", 32, 12, 6) && node(&g, "e")->groups == 4, "groups = 4: %s, groups %d", shape_of(&g, "e", s, sizeof s),
           node(&g, "e") ? node(&g, "e")->groups : -1);
  TT_CHECK(shape_is(&g, "f", 64, 12, 6) && node(&g, "f")->groups == 32, "depthwise: %s, groups %d", shape_of(&g, "f", s, sizeof s),
           node(&g, "f") ? node(&g, "f")->groups : -1);
  TT_CHECK(node(&g, "a")->groups == 1, "default groups %d", node(&g, "a")->groups);
  TT_CHECK(param_is(&g, "a.weight", 4, 8, 4, 3, 3) && param_is(&g, "d.weight", 4, 16, 16, 3, 5), "conv weight [k, c, r, s]");
  TT_CHECK(param_is(&g, "e.weight", 4, 32, 4, 1, 1), "grouped conv weight [k, c/g, r, s]");
  TT_CHECK(param_is(&g, "f.weight", 4, 64, 1, 3, 3) && node(&g, "f")->bias == -1 && !param(&g, "f.bias"),
           "depthwise weight [k, 1, r, s], no bias");
  TT_CHECK(shape_is(&g, "gap1", 64, 1, 1) && shape_is(&g, "linear1", 10, 1, 1), "gap and linear: %s, %s",
           shape_of(&g, "gap1", s, sizeof s), shape_of(&g, "linear1", s2, sizeof s2));
  done(&m, &g);
  TT_TEST_END();
}

static void test_pool_flatten_linear(void) {
  static const char text[] =
      "[net]\ninput = 3x17x17\nclasses = 5\n[train]\nbatch = 2\n"
      "[maxpool p1]\nsize = 3\nstride = 2\n"       /* (17 - 3) / 2 + 1 = 8 */
      "[avgpool p2]\nsize = 2\npad = 1\n"          /* stride = size: (8 + 2 - 2) / 2 + 1 = 5 */
      "[maxpool p3]\nsize = 3\nstride = 1\npad = 1\n" /* 5 */
      "[avgpool p4]\nsize = 2x1\n"                 /* stride 2x1: 2 x 5 */
      "[flatten]\n"                                /* 3 * 2 * 5 = 30 */
      "[linear fc]\nout = 5\n";
  tt_model m;
  tt_graph g;
  tt_err err;
  char s[128];
  TT_TEST_BEGIN("graph_pool_flatten_linear_shapes");
  if (build("mem/pool.recipe", text, &m, &g, &err) != 0) {
    TT_CHECK(0, "%s", err.msg);
    TT_TEST_END();
    return;
  }
  TT_CHECK(shape_is(&g, "p1", 3, 8, 8), "maxpool stride 2: %s", shape_of(&g, "p1", s, sizeof s));
  TT_CHECK(shape_is(&g, "p2", 3, 5, 5), "avgpool, stride = size, pad 1: %s", shape_of(&g, "p2", s, sizeof s));
  TT_CHECK(shape_is(&g, "p3", 3, 5, 5), "maxpool stride 1 pad 1: %s", shape_of(&g, "p3", s, sizeof s));
  TT_CHECK(shape_is(&g, "p4", 3, 2, 5), "HxW window: %s", shape_of(&g, "p4", s, sizeof s));
  TT_CHECK(shape_is(&g, "flatten1", 30, 1, 1) && node(&g, "flatten1")->flops == 0.0, "flatten: %s",
           shape_of(&g, "flatten1", s, sizeof s));
  TT_CHECK(shape_is(&g, "fc", 5, 1, 1), "linear: %s", shape_of(&g, "fc", s, sizeof s));
  TT_CHECK(param_is(&g, "fc.weight", 2, 5, 30, 0, 0) && param_is(&g, "fc.bias", 1, 5, 0, 0, 0), "linear weight [out, in], bias [out]");
  TT_CHECK(g.nparams == 2, "pooling and flatten own no parameters: %d", g.nparams);
  TT_CHECK(node(&g, "p1")->flops == 3.0 * 8 * 8 * 3 * 3, "maxpool FLOPs %g", node(&g, "p1")->flops);
  done(&m, &g);
  TT_TEST_END();
}

static void test_add_concat(void) {
  static const char text[] =
      "[net]\ninput = 4x8x8\nclasses = 3\n[train]\nbatch = 2\n"
      "[conv a]\nfilters = 4\nsize = 3\n"
      "[conv b]\nfrom = input\nfilters = 6\nsize = 1\n"
      "[add sum]\nfrom = input, a\n"
      "[concat cat]\nfrom = sum, b, a\n"
      "[gap]\n[linear]\nout = 3\n";
  tt_model m;
  tt_graph g;
  tt_err err;
  char s[128];
  TT_TEST_BEGIN("graph_add_concat_shapes");
  if (build("mem/join.recipe", text, &m, &g, &err) != 0) {
    TT_CHECK(0, "%s", err.msg);
    TT_TEST_END();
    return;
  }
  TT_CHECK(shape_is(&g, "sum", 4, 8, 8) && node(&g, "sum")->nin == 2, "add: %s", shape_of(&g, "sum", s, sizeof s));
  TT_CHECK(shape_is(&g, "cat", 4 + 6 + 4, 8, 8) && node(&g, "cat")->nin == 3, "concat adds channels: %s",
           shape_of(&g, "cat", s, sizeof s));
  TT_CHECK(node(&g, "sum")->flops == 4.0 * 8 * 8 && node(&g, "cat")->flops == 0.0, "add %g, concat %g FLOPs", node(&g, "sum")->flops,
           node(&g, "cat")->flops);
  TT_CHECK(node(&g, "input")->nconsumers == 3 && node(&g, "a")->nconsumers == 2 && node(&g, "linear1")->nconsumers == 0,
           "consumers: input %d, a %d", node(&g, "input")->nconsumers, node(&g, "a")->nconsumers);
  done(&m, &g);
  TT_TEST_END();
}

static const char params_text[] =
    "[net]\ninput = 3x8x8\nclasses = 2\n[train]\nbatch = 2\n"
    "[conv conv1]\nfilters = 4\nsize = 3\n"
    "[bn bn1]\nactivation = relu\n"
    "[conv dw]\nfilters = 8\nsize = 3\ngroups = depthwise\nbias = false\n"
    "[gap]\n[linear fc]\nout = 2\n";

static void test_params(void) {
  static const struct {
    const char *name;
    int node; /* layer index: input, conv1, bn1, bn1.relu, dw, gap1, fc */
    tt_param_role role;
    int trainable, half_copy, fan_in, fan_out;
  } want[] = {
      {"conv1.weight", 1, TT_PR_WEIGHT, 1, 1, 27, 36},       {"conv1.bias", 1, TT_PR_BIAS, 1, 1, 27, 36},
      {"bn1.weight", 2, TT_PR_BN_GAMMA, 1, 0, 0, 0},         {"bn1.bias", 2, TT_PR_BN_BETA, 1, 0, 0, 0},
      {"bn1.running_mean", 2, TT_PR_BN_MEAN, 0, 0, 0, 0},    {"bn1.running_var", 2, TT_PR_BN_VAR, 0, 0, 0, 0},
      {"dw.weight", 4, TT_PR_WEIGHT, 1, 1, 9, 18},           {"fc.weight", 6, TT_PR_WEIGHT, 1, 1, 8, 2},
      {"fc.bias", 6, TT_PR_BIAS, 1, 1, 8, 2},
  };
  tt_model m;
  tt_graph g;
  tt_err err;
  int i;
  TT_TEST_BEGIN("graph_params");
  if (build("mem/params.recipe", params_text, &m, &g, &err) != 0) {
    TT_CHECK(0, "%s", err.msg);
    TT_TEST_END();
    return;
  }
  TT_CHECK(g.nnodes == 7 && g.nparams == 9, "%d nodes, %d parameters (want 7, 9)", g.nnodes, g.nparams);
  for (i = 0; i < (int)(sizeof want / sizeof want[0]) && i < g.nparams; i++) {
    const tt_param *p = &g.params[i];
    TT_CHECK(!strcmp(p->name, want[i].name) && p->node == want[i].node && p->role == want[i].role &&
                 p->trainable == want[i].trainable && p->half_copy == want[i].half_copy && p->fan_in == want[i].fan_in &&
                 p->fan_out == want[i].fan_out,
             "parameter %d: %s node %d role %d trainable %d half %d fan %d/%d; want %s", i, p->name, p->node, (int)p->role,
             p->trainable, p->half_copy, p->fan_in, p->fan_out, want[i].name);
  }
  TT_CHECK(param_is(&g, "conv1.weight", 4, 4, 3, 3, 3) && param_is(&g, "conv1.bias", 1, 4, 0, 0, 0), "conv1 shapes");
  TT_CHECK(param_is(&g, "bn1.weight", 1, 4, 0, 0, 0) && param_is(&g, "bn1.bias", 1, 4, 0, 0, 0) &&
               param_is(&g, "bn1.running_mean", 1, 4, 0, 0, 0) && param_is(&g, "bn1.running_var", 1, 4, 0, 0, 0),
           "batch-norm gamma, beta, running statistics [c]");
  TT_CHECK(param_is(&g, "dw.weight", 4, 8, 1, 3, 3), "depthwise with channel multiplier 2: [8, 1, 3, 3]");
  TT_CHECK(param_is(&g, "fc.weight", 2, 2, 8, 0, 0) && param_is(&g, "fc.bias", 1, 2, 0, 0, 0), "linear [out, in] and [out]");
  {
    const tt_node *c = node(&g, "conv1"), *b = node(&g, "bn1"), *d = node(&g, "dw"), *f = node(&g, "fc");
    TT_CHECK(c && c->weight == 0 && c->bias == 1 && c->gamma == -1, "conv1 parameter ids");
    TT_CHECK(b && b->gamma == 2 && b->beta == 3 && b->rmean == 4 && b->rvar == 5 && b->weight == -1, "bn1 parameter ids");
    TT_CHECK(d && d->weight == 6 && d->bias == -1 && f && f->weight == 7 && f->bias == 8, "dw and fc parameter ids");
    TT_CHECK(node(&g, "bn1.relu") && node(&g, "bn1.relu")->weight == -1 && node(&g, "bn1.relu")->gamma == -1, "relu owns nothing");
  }
  /* running statistics are not trained: 108 + 4 + 4 + 4 + 72 + 16 + 2 */
  TT_CHECK(g.trainable_numel == 210, "trainable_numel %zu (want 210)", g.trainable_numel);
  done(&m, &g);
  TT_TEST_END();
}

static void test_flops(void) {
  tt_model m;
  tt_graph g;
  tt_err err;
  double sum = 0;
  int i;
  TT_TEST_BEGIN("graph_flops");
  if (build("mem/params.recipe", params_text, &m, &g, &err) != 0) {
    TT_CHECK(0, "%s", err.msg);
    TT_TEST_END();
    return;
  }
  /* conv: 2 (multiply-add) x outputs (4x8x8) x inputs per output (3x3x3) */
  TT_CHECK(node(&g, "conv1")->flops == 2.0 * 4 * 8 * 8 * 27, "conv1 FLOPs %g (want %g)", node(&g, "conv1")->flops, 2.0 * 4 * 8 * 8 * 27);
  /* depthwise: each output reads one input channel's 3x3 window */
  TT_CHECK(node(&g, "dw")->flops == 2.0 * 8 * 8 * 8 * 9, "depthwise FLOPs %g (want %g)", node(&g, "dw")->flops, 2.0 * 8 * 8 * 8 * 9);
  TT_CHECK(node(&g, "fc")->flops == 2.0 * 8 * 2, "linear FLOPs %g", node(&g, "fc")->flops);
  for (i = 0; i < g.nnodes; i++) sum += g.nodes[i].flops;
  TT_CHECK(g.flops_per_sample == sum && sum == 13824 + 2048 + 256 + 9216 + 512 + 32, "flops_per_sample %g, sum of nodes %g",
           g.flops_per_sample, sum);
  done(&m, &g);
  TT_TEST_END();
}

#define NET(in, classes) "[net]\ninput = " in "\nclasses = " classes "\n[train]\nbatch = 2\n"

static void test_errors(void) {
  TT_TEST_BEGIN("graph_error_add_mismatch");
  expect_error("mem/add1.recipe", NET("3x8x8", "2") "[conv a]\nfilters = 4\nsize = 3\n[add]\nfrom = a, input\n[gap]\n[linear]\nout = 2\n",
               "[add]", "[add add1]", "input 'input' is 3x8x8 but 'a' is 4x8x8; add needs equal shapes");
  expect_error("mem/add2.recipe",
               NET("3x8x8", "2") "[conv a]\nfilters = 3\nsize = 3\nstride = 2\n[add sum]\nfrom = input, a\n[gap]\n[linear]\nout = 2\n",
               "[add sum]", "[add sum]", "input 'a' is 3x4x4 but 'input' is 3x8x8; add needs equal shapes");
  TT_TEST_END();

  TT_TEST_BEGIN("graph_error_concat_spatial");
  expect_error("mem/concat.recipe",
               NET("3x8x8", "2") "[conv a]\nfilters = 4\nsize = 3\nstride = 2\n[concat]\nfrom = input, a\n[gap]\n[linear]\nout = 2\n",
               "[concat]", "[concat concat1]", "input 'a' is 4x4x4 but 'input' is 3x8x8; concat needs equal height and width");
  TT_TEST_END();

  TT_TEST_BEGIN("graph_error_window_too_large");
  expect_error("mem/window1.recipe", NET("1x5x5", "2") "[conv big]\nfilters = 2\nsize = 7\npad = 0\n[flatten]\n[linear]\nout = 2\n",
               "[conv big]", "[conv big]", "a 7x7 window with pad 0x0 does not fit the 5x5 input");
  expect_error("mem/window2.recipe", NET("1x5x5", "2") "[conv big]\nfilters = 2\nsize = 8\npad = 1\n[flatten]\n[linear]\nout = 2\n",
               "[conv big]", "[conv big]", "a 8x8 window with pad 1x1 does not fit the 5x5 input");
  expect_error("mem/window3.recipe",
               NET("1x9x5", "2") "[conv ok]\nfilters = 2\nsize = 3\n[maxpool]\nsize = 6\nstride = 1\n[flatten]\n[linear]\nout = 2\n",
               "[maxpool]", "[maxpool maxpool1]", "a 6x6 window does not fit the 9x5 input");
  /* A stride larger than the overhang hid these (C division truncates toward zero, so they gave
   * 1x1); PyTorch refuses both, and so does the build now. */
  expect_error("mem/window4.recipe",
               NET("1x3x3", "2") "[conv c]\nfilters = 2\nsize = 4\nstride = 2\npad = 0\n[flatten]\n[linear]\nout = 2\n",
               "[conv c]", "[conv c]", "a 4x4 window with pad 0x0 does not fit the 3x3 input");
  expect_error("mem/window5.recipe", NET("1x5x5", "2") "[maxpool]\nsize = 6\n[flatten]\n[linear]\nout = 2\n", "[maxpool]",
               "[maxpool maxpool1]", "a 6x6 window does not fit the 5x5 input");
  expect_error("mem/window6.recipe", NET("1x5x5", "2") "[avgpool]\nsize = 6\npad = 0x3\n[flatten]\n[linear]\nout = 2\n",
               "[avgpool]", "[avgpool avgpool1]", "a 6x6 window with pad 0x3 does not fit the 5x5 input");
  TT_TEST_END();

  TT_TEST_BEGIN("graph_window_rounds_down");
  {
    /* what still fits: floor((4 - 3) / 2) + 1 = 1 and floor((5 - 2) / 2) + 1 = 2, as in PyTorch */
    tt_model m;
    tt_graph g;
    tt_err err;
    char s[128];
    if (build("mem/floor.recipe", NET("1x4x4", "2") "[conv c]\nfilters = 2\nsize = 3\nstride = 2\npad = 0\n"
                                  "[maxpool p]\nsize = 1\nstride = 1\n[flatten]\n[linear]\nout = 2\n", &m, &g, &err) != 0) {
      TT_CHECK(0, "%s", err.msg);
    } else {
      TT_CHECK(shape_is(&g, "c", 2, 1, 1), "%s", shape_of(&g, "c", s, sizeof s));
      done(&m, &g);
    }
    if (build("mem/floor2.recipe", NET("1x5x5", "2") "[maxpool p]\nsize = 2\n[flatten]\n[linear]\nout = 2\n", &m, &g, &err) != 0) {
      TT_CHECK(0, "%s", err.msg);
    } else {
      TT_CHECK(shape_is(&g, "p", 1, 2, 2), "%s", shape_of(&g, "p", s, sizeof s));
      done(&m, &g);
    }
  }
  TT_TEST_END();

  /* Shapes are computed in 64 bits and every tensor holds at most 2^31 - 1 values per image
   * (the kernels count in ints): before, these wrapped to zero or negative sizes and an arena
   * of 1.8e19 bytes while plan exited 0. */
  TT_TEST_BEGIN("graph_error_sizes_overflow");
  expect_error("mem/huge_input.recipe", NET("4x65536x65536", "10") "[flatten]\n[linear]\nout = 10\n", "[net]", "[net]",
               "input = 4x65536x65536 is 17179869184 values per image; an image must hold 1 to 2147483647 (the kernels "
               "count in 32 bits); use a smaller input");
  expect_error("mem/huge_conv.recipe", NET("4x256x256", "10") "[conv c]\nfilters = 32768\nsize = 3\n[gap]\n[linear]\nout = 10\n",
               "[conv c]", "[conv c]",
               "its output 32768x256x256 is 2147483648 values per image, more than the 2147483647 one tensor may hold "
               "(the kernels count in 32 bits); make the layer smaller");
  expect_error("mem/huge_pad.recipe",
               NET("1x2048x2048", "10") "[conv c]\nfilters = 1024\nsize = 1\npad = 4096\n[gap]\n[linear]\nout = 10\n",
               "[conv c]", "[conv c]",
               "its output 1024x10240x10240 is 107374182400 values per image, more than the 2147483647 one tensor may "
               "hold (the kernels count in 32 bits); make the layer smaller");
  expect_error("mem/huge_concat.recipe",
               NET("4x32x32", "10") "[conv a]\nfilters = 1048576\nsize = 1\n[conv b]\nfrom = input\nfilters = 1048576\n"
                                    "size = 1\n[concat cat]\nfrom = a, b\n[gap]\n[linear]\nout = 10\n",
               "[concat cat]", "[concat cat]",
               "its output 2097152x32x32 is 2147483648 values per image, more than the 2147483647 one tensor may hold "
               "(the kernels count in 32 bits); make the layer smaller");
  expect_error("mem/huge_filter.recipe",
               NET("4x16x16", "10") "[conv c]\nfilters = 1048576\nsize = 4096\n[gap]\n[linear]\nout = 10\n", "[conv c]",
               "[conv c]",
               "its filter's fan-in (67108864) or fan-out (17592186044416) is more than 2147483647; use a smaller size, "
               "fewer filters or more groups");
  TT_TEST_END();

  TT_TEST_BEGIN("graph_error_groups");
  expect_error("mem/groups1.recipe", NET("4x8x8", "2") "[conv g]\nfilters = 6\nsize = 1\ngroups = 4\n[gap]\n[linear]\nout = 2\n",
               "[conv g]", "[conv g]", "groups = 4 must divide the input channels (4) and filters (6)");
  expect_error("mem/groups2.recipe", NET("3x8x8", "2") "[conv g]\nfilters = 4\nsize = 1\ngroups = 2\n[gap]\n[linear]\nout = 2\n",
               "[conv g]", "[conv g]", "groups = 2 must divide the input channels (3) and filters (4)");
  expect_error("mem/groups3.recipe",
               NET("3x8x8", "2") "[conv g]\nfilters = 4\nsize = 3\ngroups = depthwise\n[gap]\n[linear]\nout = 2\n", "[conv g]",
               "[conv g]", "groups = 3 must divide the input channels (3) and filters (4)");
  TT_TEST_END();

  TT_TEST_BEGIN("graph_error_pool_pad_linear_classes_unused");
  expect_error("mem/pad.recipe", NET("1x8x8", "2") "[maxpool]\nsize = 2\npad = 2\n[flatten]\n[linear]\nout = 2\n", "[maxpool]",
               "[maxpool maxpool1]", "size and stride must be positive and pad at most half the size");
  expect_error("mem/flat.recipe", NET("4x8x8", "2") "[linear fc]\nout = 2\n", "[linear fc]", "[linear fc]",
               "input is 4x8x8; add a [flatten] or [gap] layer before a linear layer");
  expect_error("mem/classes.recipe", NET("4x8x8", "3") "[gap]\n[linear fc]\nout = 2\n", "[linear fc]", "[linear fc]",
               "the last layer gives 2x1x1 values but [net] classes = 3; end with a linear layer of out = 3");
  expect_error("mem/unused.recipe", NET("4x8x8", "2") "[conv side]\nfilters = 2\nsize = 1\n[gap]\nfrom = input\n[linear]\nout = 2\n",
               "[conv side]", "[conv side]", "its output is never used; connect it with from = ... or remove it");
  TT_TEST_END();
}

/* The transformer layers: a token tensor [t, f] is the node shape c = t, h = 1, w = f. */
static void test_vit(void) {
  static const char text[] =
      "[net]\ninput = 3x8x12\nclasses = 5\n[train]\nbatch = 2\n"
      "[patch_embed embed]\nsize = 4\ndim = 16\n"            /* 2 x 3 = 6 patches + class token */
      "[layernorm ln_1]\neps = 1e-6\n"
      "[attention self_attention]\nheads = 4\n"
      "[add res1]\nfrom = embed, self_attention\n"
      "[linear mlp.0]\nout = 32\n"                              /* per token: [7, 16] -> [7, 32] */
      "[gelu mlp.1]\napproximate = tanh\n"
      "[linear mlp.3]\nout = 16\n"
      "[add res2]\nfrom = res1, mlp.3\n"
      "[token pool]\nmode = class\n"
      "[linear heads.head]\nout = 5\n";
  tt_model m;
  tt_graph g;
  tt_err err;
  char buf[128];
  TT_TEST_BEGIN("graph_vit_shapes_params_flops");
  if (build("mem/vit.recipe", text, &m, &g, &err) != 0) {
    TT_CHECK(0, "build failed: %s", err.msg);
    TT_TEST_END();
    return;
  }
  TT_CHECK(shape_is(&g, "embed", 7, 1, 16) && node(&g, "embed")->tokens && node(&g, "embed")->cls, "%s",
           shape_of(&g, "embed", buf, sizeof buf));
  TT_CHECK(shape_is(&g, "ln_1", 7, 1, 16) && node(&g, "ln_1")->tokens, "%s", shape_of(&g, "ln_1", buf, sizeof buf));
  TT_CHECK(shape_is(&g, "self_attention", 7, 1, 16), "%s", shape_of(&g, "self_attention", buf, sizeof buf));
  TT_CHECK(shape_is(&g, "mlp.0", 7, 1, 32) && node(&g, "mlp.0")->tokens, "%s", shape_of(&g, "mlp.0", buf, sizeof buf));
  TT_CHECK(shape_is(&g, "res2", 7, 1, 16) && node(&g, "res2")->cls, "%s", shape_of(&g, "res2", buf, sizeof buf));
  TT_CHECK(shape_is(&g, "pool", 16, 1, 1) && !node(&g, "pool")->tokens, "%s", shape_of(&g, "pool", buf, sizeof buf));
  /* PyTorch's names and shapes (ndim 3 for the class token and position embedding) */
  TT_CHECK(param_is(&g, "embed.weight", 4, 16, 3, 4, 4), "embed.weight");
  TT_CHECK(param_is(&g, "embed.bias", 1, 16, 0, 0, 0), "embed.bias");
  TT_CHECK(param_is(&g, "embed.class_token", 3, 1, 1, 16, 0), "embed.class_token");
  TT_CHECK(param_is(&g, "embed.pos_embedding", 3, 1, 7, 16, 0), "embed.pos_embedding");
  TT_CHECK(param_is(&g, "ln_1.weight", 1, 16, 0, 0, 0) && param_is(&g, "ln_1.bias", 1, 16, 0, 0, 0), "ln_1");
  TT_CHECK(param_is(&g, "self_attention.in_proj_weight", 2, 48, 16, 0, 0), "in_proj_weight");
  TT_CHECK(param_is(&g, "self_attention.in_proj_bias", 1, 48, 0, 0, 0), "in_proj_bias");
  TT_CHECK(param_is(&g, "self_attention.out_proj.weight", 2, 16, 16, 0, 0), "out_proj.weight");
  TT_CHECK(param_is(&g, "self_attention.out_proj.bias", 1, 16, 0, 0, 0), "out_proj.bias");
  TT_CHECK(param_is(&g, "mlp.0.weight", 2, 32, 16, 0, 0) && param_is(&g, "mlp.3.weight", 2, 16, 32, 0, 0), "mlp weights");
  TT_CHECK(param_is(&g, "heads.head.weight", 2, 5, 16, 0, 0), "head");
  /* roles: only weight matrices are TT_PR_WEIGHT (the AdamW default decays them alone) */
  {
    const tt_param *p;
    TT_CHECK((p = param(&g, "self_attention.in_proj_weight")) && p->role == TT_PR_WEIGHT && p->half_copy, "in_proj role");
    TT_CHECK((p = param(&g, "self_attention.out_proj.weight")) && p->role == TT_PR_WEIGHT, "out_proj role");
    TT_CHECK((p = param(&g, "self_attention.out_proj.bias")) && p->role == TT_PR_BIAS, "out_proj.bias role");
    TT_CHECK((p = param(&g, "ln_1.weight")) && p->role == TT_PR_LN_GAMMA && !p->half_copy, "ln gamma role");
    TT_CHECK((p = param(&g, "ln_1.bias")) && p->role == TT_PR_LN_BETA, "ln beta role");
    TT_CHECK((p = param(&g, "embed.class_token")) && p->role == TT_PR_CLS_TOKEN && !p->half_copy, "class token role");
    TT_CHECK((p = param(&g, "embed.pos_embedding")) && p->role == TT_PR_POS_EMBED, "pos role");
    TT_CHECK((p = param(&g, "embed.weight")) && p->role == TT_PR_WEIGHT, "patch weight role");
  }
  /* FLOPs: the in-proj 2*t*f*3f + scores and values 2*2*t*t*f + out-proj 2*t*f*f; per-token linear 2*t*in*out */
  {
    double t = 7, f = 16;
    TT_CHECK(node(&g, "self_attention")->flops == 2 * t * f * 3 * f + 4 * t * t * f + 2 * t * f * f, "attention flops %g",
             node(&g, "self_attention")->flops);
    TT_CHECK(node(&g, "mlp.0")->flops == 2 * t * 16 * 32, "mlp.0 flops %g", node(&g, "mlp.0")->flops);
    TT_CHECK(node(&g, "embed")->flops == 2.0 * 16 * 6 * 48 + 7 * 16, "embed flops %g", node(&g, "embed")->flops);
  }
  done(&m, &g);
  TT_TEST_END();

  TT_TEST_BEGIN("graph_vit_torchvision_names");
  static const char tv[] =
      "[net]\ninput = 3x8x8\nclasses = 2\n[train]\nbatch = 2\n"
      "[patch_embed embed]\nsize = 4\ndim = 8\nconv_name = conv_proj\nclass_token_name = class_token\n"
      "pos_embedding_name = encoder.pos_embedding\n"
      "[token]\nmode = mean\n[linear heads.head]\nout = 2\n";
  if (build("mem/tv.recipe", tv, &m, &g, &err) != 0) {
    TT_CHECK(0, "build failed: %s", err.msg);
  } else {
    TT_CHECK(param_is(&g, "conv_proj.weight", 4, 8, 3, 4, 4) && param_is(&g, "conv_proj.bias", 1, 8, 0, 0, 0), "conv_proj");
    TT_CHECK(param_is(&g, "class_token", 3, 1, 1, 8, 0), "class_token");
    TT_CHECK(param_is(&g, "encoder.pos_embedding", 3, 1, 5, 8, 0), "encoder.pos_embedding");
    done(&m, &g);
  }
  TT_TEST_END();

  TT_TEST_BEGIN("graph_vit_errors");
  expect_error("mem/v1.recipe", NET("1x28x28", "2") "[patch_embed e]\nsize = 5\ndim = 8\n[token]\n[linear]\nout = 2\n",
               "[patch_embed e]", "[patch_embed e]",
               "the 28x28 input is not a multiple of the patch size 5; use a size that divides both (or change [net] input)");
  expect_error("mem/v2.recipe",
               NET("1x8x8", "2") "[patch_embed e]\nsize = 4\ndim = 10\n[attention a]\nheads = 4\n[token]\n[linear]\nout = 2\n",
               "[attention a]", "[attention a]",
               "the token width 10 is not a multiple of heads = 4; use a number of heads that divides 10");
  expect_error("mem/v3.recipe",
               NET("1x8x8", "2") "[patch_embed e]\nsize = 4\ndim = 8\nclass_token = false\n[token t]\nmode = class\n[linear]\nout = 2\n",
               "[token t]", "[token t]",
               "mode = class needs a class token at token 0 (class_token = true on the [patch_embed]); use mode = mean");
  expect_error("mem/v4.recipe", NET("4x8x8", "2") "[attention a]\nheads = 2\n[gap]\n[linear]\nout = 2\n", "[attention a]",
               "[attention a]", "its input 4x8x8 is not a token tensor; attention needs tokens (a [patch_embed] before it)");
  expect_error("mem/v5.recipe", NET("1x8x8", "2") "[patch_embed e]\nsize = 4\ndim = 8\n[bn b]\n[token]\n[linear]\nout = 2\n",
               "[bn b]", "[bn b]",
               "its input 'e' is a token tensor [5 tokens x 8]; bn takes images (use [layernorm] for normalisation, [token] "
               "to pool the tokens)");
  expect_error("mem/v6.recipe", NET("1x8x8", "2") "[patch_embed e]\nsize = 4\ndim = 2\n", "[patch_embed e]", "[patch_embed e]",
               "the last layer gives a token tensor [5 tokens x 2]; pool it with [token] (mode = class or mean) and end "
               "with a linear layer of out = 2");
  expect_error("mem/v7.recipe",
               NET("1x8x8", "2") "[patch_embed e]\nsize = 4\ndim = 8\nclass_token_name = head.weight\n[token]\n"
                                 "[linear head]\nout = 2\n",
               "[patch_embed e]", "[patch_embed e]",
               "its parameter name 'head.weight' is also the name of a parameter of layer 'head'; choose another "
               "conv_name, class_token_name or pos_embedding_name");
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("conv_shapes", "compile graph", test_conv_shapes),
  TT_TEST("pool_flatten_linear", "compile graph", test_pool_flatten_linear),
  TT_TEST("add_concat", "compile graph", test_add_concat),
  TT_TEST("params", "compile graph", test_params),
  TT_TEST("flops", "compile graph", test_flops),
  TT_TEST("errors", "compile graph", test_errors),
  TT_TEST("vit", "compile graph", test_vit),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
