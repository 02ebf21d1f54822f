/* tests/compile/test_recipe.c — the recipe parser: example recipes (structure and parameter counts
 * against torchvision), defaults, blocks, warnings, malformed files and a seeded
 * random-mutation run. Run from the repository root (it reads examples/ and tests/). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/compile/recipe.h"
#include "tests/tt_test.h"

typedef struct warnings {
  int n;
  char first[1024];
} warnings;

static void collect_warning(void *ud, const char *line) {
  warnings *w = (warnings *)ud;
  if (!w->n) snprintf(w->first, sizeof w->first, "%s", line);
  w->n++;
}

static int find_layer(const tt_model *m, const char *name) {
  int i;
  for (i = 0; i < m->nlayers; i++)
    if (!strcmp(m->layers[i].name, name)) return i;
  return -1;
}

/* Walks the layers computing shapes and counts weights the way torchvision counts
 * parameters (running statistics are buffers, not parameters). Returns -1 and says why on
 * a shape mismatch, so the examples are checked to be well-formed too. */
static long long count_params(const tt_model *m, int *out_c, char *why, size_t whysz) {
  int *c = (int *)calloc((size_t)m->nlayers, sizeof(int));
  int *h = (int *)calloc((size_t)m->nlayers, sizeof(int));
  int *w = (int *)calloc((size_t)m->nlayers, sizeof(int));
  int *tok = (int *)calloc((size_t)m->nlayers, sizeof(int));
  long long total = 0;
  int i, j, ok = 1;
  for (i = 0; i < m->nlayers && ok; i++) {
    const tt_layer *L = &m->layers[i];
    int in = L->ninputs ? L->inputs[0] : 0;
    int ci = c[in], hi = h[in], wi = w[in];
    c[i] = ci, h[i] = hi, w[i] = wi;
    switch (L->kind) {
      case TT_L_INPUT:
        c[i] = m->in_c, h[i] = m->in_h, w[i] = m->in_w;
        break;
      case TT_L_CONV: {
        int g = L->groups == -1 ? ci : L->groups;
        if (ci % g || L->filters % g) {
          snprintf(why, whysz, "%s: groups %d do not divide %d -> %d", L->name, g, ci, L->filters);
          ok = 0;
          break;
        }
        total += (long long)L->filters * (ci / g) * L->kh * L->kw + (L->bias ? L->filters : 0);
        c[i] = L->filters;
        h[i] = (hi + 2 * L->ph - L->kh) / L->sh + 1;
        w[i] = (wi + 2 * L->pw - L->kw) / L->sw + 1;
        break;
      }
      case TT_L_BN: total += 2LL * ci; break;
      case TT_L_MAXPOOL:
      case TT_L_AVGPOOL:
        h[i] = (hi + 2 * L->ph - L->kh) / L->sh + 1;
        w[i] = (wi + 2 * L->pw - L->kw) / L->sw + 1;
        break;
      case TT_L_GAP: h[i] = w[i] = 1; break;
      case TT_L_FLATTEN: c[i] = ci * hi * wi, h[i] = w[i] = 1; break;
      case TT_L_LINEAR:
        if (tok[in]) { /* per token: [t, in] -> [t, out] */
          total += (long long)L->filters * wi + (L->bias ? L->filters : 0);
          w[i] = L->filters, tok[i] = 1;
          break;
        }
        total += (long long)L->filters * ci * hi * wi + (L->bias ? L->filters : 0);
        c[i] = L->filters, h[i] = w[i] = 1;
        break;
      /* token tensors [t, f] as c = t, h = 1, w = f (as the graph stage has them) */
      case TT_L_PATCH_EMBED: {
        int t = (hi / L->kh) * (wi / L->kw) + (L->class_token ? 1 : 0);
        total += (long long)L->filters * ci * L->kh * L->kw + (L->bias ? L->filters : 0) + (L->class_token ? L->filters : 0) +
                 (L->pos_embed ? (long long)t * L->filters : 0);
        c[i] = t, h[i] = 1, w[i] = L->filters, tok[i] = 1;
        break;
      }
      case TT_L_LAYERNORM: total += 2LL * (tok[in] ? wi : ci); tok[i] = tok[in]; break;
      case TT_L_ATTENTION: total += 4LL * wi * wi + (L->bias ? 4LL * wi : 0); tok[i] = 1; break;
      case TT_L_TOKEN: c[i] = wi, h[i] = w[i] = 1; break;
      case TT_L_GELU:
      case TT_L_DROPOUT:
      case TT_L_RELU:
      case TT_L_SILU: tok[i] = tok[in]; break;
      case TT_L_ADD:
        tok[i] = tok[in];
        for (j = 1; j < L->ninputs; j++)
          if (c[L->inputs[j]] != ci || h[L->inputs[j]] != hi || w[L->inputs[j]] != wi) {
            snprintf(why, whysz, "%s: input %s is %dx%dx%d, %s is %dx%dx%d", L->name, m->layers[in].name, ci, hi, wi,
                     m->layers[L->inputs[j]].name, c[L->inputs[j]], h[L->inputs[j]], w[L->inputs[j]]);
            ok = 0;
          }
        break;
      case TT_L_CONCAT:
        for (j = 1; j < L->ninputs; j++) c[i] += c[L->inputs[j]];
        break;
      default: break;
    }
    if (ok && (h[i] < 1 || w[i] < 1)) {
      snprintf(why, whysz, "%s: empty output", L->name);
      ok = 0;
    }
  }
  *out_c = m->nlayers ? c[m->nlayers - 1] * h[m->nlayers - 1] * w[m->nlayers - 1] : 0;
  free(c), free(h), free(w), free(tok);
  return ok ? total : -1;
}

static void test_examples(void) {
  static const struct {
    const char *path, *name;
    long long params; /* torchvision's count, or ours for the Fashion-MNIST nets */
  } ex[] = {
      {"examples/fashion_mnist/lenet.recipe", "lenet", 825066},
      {"examples/fashion_mnist/resnet.recipe", "resnet", 392242},
      /* embed 1024 + 64 + 64 (class token) + 50 x 64; per block 2 x 128 (layer norms) + 4 x 64^2 +
       * 4 x 64 (attention) + 64 x 128 + 128 + 128 x 64 + 64 (MLP); encoder.ln 128; head 650 */
      {"examples/fashion_mnist/vit.recipe", "vit", 139018},
      {"examples/imagenet/resnet18.recipe", "resnet18", 11689512},
      {"examples/imagenet/resnet50.recipe", "resnet50", 25557032},
      {"examples/imagenet/vgg16.recipe", "vgg16", 138357544},
      {"examples/imagenet/mobilenet_v2.recipe", "mobilenet_v2", 3504872},
      {"tests/fixtures/small_cnn.recipe", "small_cnn", -1},
  };
  size_t i;
  for (i = 0; i < sizeof ex / sizeof ex[0]; i++) {
    tt_model m;
    tt_err err;
    warnings w;
    char tname[200], why[600] = "";
    int rc, cls = 0, j, k;
    long long p;
    snprintf(tname, sizeof tname, "recipe_example_%s", ex[i].name);
    TT_TEST_BEGIN(tname);
    memset(&w, 0, sizeof w);
    rc = tt_recipe_load(ex[i].path, &m, &err, collect_warning, &w);
    TT_CHECK(rc == 0, "%s", err.msg);
    if (rc == 0) {
      TT_CHECK(w.n == 0, "%d warnings, first: %s", w.n, w.first);
      TT_CHECK(!strcmp(m.name, ex[i].name), "name '%s'", m.name);
      TT_CHECK(m.layers[0].kind == TT_L_INPUT && !strcmp(m.layers[0].name, "input"), "layers[0] is not the input");
      for (j = 1; j < m.nlayers; j++) {
        TT_CHECK(m.layers[j].ninputs >= 1, "%s has no input", m.layers[j].name);
        for (k = 0; k < m.layers[j].ninputs; k++) TT_CHECK(m.layers[j].inputs[k] < j, "%s reads a later layer", m.layers[j].name);
      }
      p = count_params(&m, &cls, why, sizeof why);
      TT_CHECK(p >= 0, "shape error: %s", why);
      TT_CHECK(cls == m.classes, "last layer gives %d outputs, classes = %d", cls, m.classes);
      if (ex[i].params > 0) {
        double rel = (double)(p - ex[i].params) / (double)ex[i].params;
        TT_CHECK(rel < 0.005 && rel > -0.005, "%lld parameters, expected %lld", p, ex[i].params);
        printf("  %-14s %3d layers  %11lld parameters (reference %lld)\n", ex[i].name, m.nlayers, p, ex[i].params);
      }
      tt_model_free(&m);
    }
    TT_TEST_END();
  }
}

static void test_names_and_blocks(void) {
  tt_model m;
  tt_err err;
  int i, j;
  TT_TEST_BEGIN("recipe_block_names");
  if (tt_recipe_load("examples/imagenet/resnet50.recipe", &m, &err, NULL, NULL) == 0) {
    static const char *const want[] = {"conv1", "bn1", "bn1.relu", "maxpool", "layer1.0.conv1", "layer1.0.downsample.0",
                                       "layer1.0.downsample.1", "layer1.2.conv3", "layer3.5.bn3", "layer4.2.relu1", "fc"};
    for (j = 0; j < (int)(sizeof want / sizeof want[0]); j++) TT_CHECK(find_layer(&m, want[j]) >= 0, "no layer '%s'", want[j]);
    TT_CHECK(find_layer(&m, "layer3.6.conv1") < 0, "layer3 has 6 blocks, found layer3.6");
    /* $param substitution and from = in */
    i = find_layer(&m, "layer3.0.conv2");
    TT_CHECK(i > 0 && m.layers[i].filters == 256 && m.layers[i].sh == 2 && m.layers[i].ph == 1, "layer3.0.conv2 wrong");
    i = find_layer(&m, "layer2.0.downsample.0");
    j = find_layer(&m, "layer1.2.relu1");
    TT_CHECK(i > 0 && j > 0 && m.layers[i].inputs[0] == j, "layer2.0.downsample.0 does not read the block input");
    i = find_layer(&m, "layer2.1.add1");
    TT_CHECK(i > 0 && m.layers[i].ninputs == 2 && m.layers[i].inputs[1] == find_layer(&m, "layer2.0.relu1"),
             "layer2.1.add1 inputs wrong");
    TT_CHECK(m.layers[find_layer(&m, "layer1.0.conv2")].sh == 1, "stride default not substituted");
    tt_model_free(&m);
  } else {
    TT_CHECK(0, "%s", err.msg);
  }
  if (tt_recipe_load("examples/imagenet/mobilenet_v2.recipe", &m, &err, NULL, NULL) == 0) {
    i = find_layer(&m, "features.16.conv.1.0");
    TT_CHECK(i > 0 && m.layers[i].groups == -1 && m.layers[i].filters == 960, "depthwise conv features.16.conv.1.0 wrong");
    TT_CHECK(find_layer(&m, "features.5.add1") > 0 && find_layer(&m, "features.4.add1") < 0, "residual placement wrong");
    tt_model_free(&m);
  } else {
    TT_CHECK(0, "%s", err.msg);
  }
  TT_TEST_END();

  TT_TEST_BEGIN("recipe_blocks_nested_repeat");
  {
    const char *text =
        "[net]\ninput = 3x8x8\nclasses = 4\n[train]\nbatch = 2\n"
        "[block unit]\nparams = c, k = 3\n[conv c]\nfilters = $c\nsize = ${k}\n[relu]\n[end]\n"
        "[block pair]\nparams = c\n[unit a]\nc = $c\n[unit b]\nc = $c\nk = 1\n[add]\nfrom = in, b\n[end]\n"
        "[conv stem]\nfilters = 5\nsize = 3\n"
        "[pair p]\nc = 5\nrepeat = 3\n"
        "[conv side]\nfrom = p.1\nfilters = 5\nsize = 1\n"
        "[concat]\nfrom = p, side, stem\n[gap]\n[linear]\nout = 4\n";
    int a, b;
    if (tt_recipe_parse("mem/nested.recipe", text, &m, &err, NULL, NULL) == 0) {
      TT_CHECK(m.nlayers == 1 + 1 + 3 * 5 + 1 + 1 + 1 + 1, "nlayers %d", m.nlayers);
      i = find_layer(&m, "p.2.b.c");
      TT_CHECK(i > 0 && m.layers[i].kh == 1 && m.layers[i].filters == 5, "p.2.b.c wrong");
      i = find_layer(&m, "p.0.a.c");
      TT_CHECK(i > 0 && m.layers[i].kh == 3 && m.layers[i].inputs[0] == find_layer(&m, "stem"), "p.0.a.c wrong");
      a = find_layer(&m, "p.1.add1");
      b = find_layer(&m, "side");
      TT_CHECK(a > 0 && b > 0 && m.layers[b].inputs[0] == a, "'from = p.1' should name the instance output");
      i = find_layer(&m, "concat1");
      TT_CHECK(i > 0 && m.layers[i].ninputs == 3 && m.layers[i].inputs[0] == find_layer(&m, "p.2.add1"), "group name 'p'");
      i = find_layer(&m, "p.1.add1");
      TT_CHECK(i > 0 && m.layers[i].inputs[0] == find_layer(&m, "p.0.add1"), "repeat does not chain");
      TT_CHECK(find_layer(&m, "p.0.a.relu1") > 0 && find_layer(&m, "linear1") > 0 && find_layer(&m, "gap1") > 0, "default names");
      tt_model_free(&m);
    } else {
      TT_CHECK(0, "%s", err.msg);
    }
  }
  TT_TEST_END();
}

static void test_defaults(void) {
  tt_model m;
  tt_err err;
  warnings w;
  const char *text = "[net]\ninput = 3x32x32\nclasses = 10\n[train]\nbatch = 64\n"
                     "[conv]\nfilters = 8\nsize = 3x5\n[bn]\n[maxpool]\nsize = 3\n[avgpool]\nsize = 2\npad = 1\n"
                     "[dropout]\n[flatten]\n[linear]\nout = 10\nbias = false\n";
  TT_TEST_BEGIN("recipe_defaults");
  memset(&w, 0, sizeof w);
  if (tt_recipe_parse("some/dir/net.recipe", text, &m, &err, collect_warning, &w) == 0) {
    const tt_layer *c = &m.layers[1];
    TT_CHECK(w.n == 0, "warning: %s", w.first);
    TT_CHECK(!strcmp(m.name, "net") && m.in_c == 3 && m.in_h == 32 && m.in_w == 32 && m.classes == 10, "net");
    TT_CHECK(m.train.batch == 64 && m.train.micro_batch == 0 && m.train.eval_batch == 0 && m.train.epochs == 1, "batch/epochs");
    TT_CHECK(m.train.optimizer == TT_OPT_SGD && m.train.lr == 0.01f && m.train.momentum == 0.9f && !m.train.nesterov, "sgd");
    TT_CHECK(m.train.weight_decay == 0 && m.train.beta1 == 0.9f && m.train.beta2 == 0.999f && m.train.adam_eps == 1e-8f, "adam");
    TT_CHECK(m.train.schedule == TT_LR_CONSTANT && m.train.warmup_epochs == 0 && m.train.step_epochs == 30 &&
                 m.train.gamma == 0.1f && m.train.min_lr == 0,
             "schedule");
    TT_CHECK(m.train.label_smoothing == 0 && m.train.seed == 1 && m.train.precision == TT_PREC_AUTO &&
                 m.train.recompute == TT_RECOMP_AUTO && m.train.log_every == 100,
             "misc train");
    TT_CHECK(m.data.format == TT_DATA_NONE && m.data.mean[0] == 0 && m.data.std[3] == 1 && !m.data.hflip && !m.data.crop_pad, "data");
    TT_CHECK(!strcmp(c->name, "conv1") && c->kh == 3 && c->kw == 5 && c->ph == 1 && c->pw == 2 && c->sh == 1 && c->sw == 1 &&
                 c->groups == 1 && c->bias == 1 && c->line == 6 && c->inputs[0] == 0,
             "conv defaults");
    TT_CHECK(!strcmp(m.layers[2].name, "bn1") && m.layers[2].eps == 1e-5f && m.layers[2].momentum == 0.1f, "bn defaults");
    TT_CHECK(m.layers[3].sh == 3 && m.layers[3].ph == 0 && !strcmp(m.layers[3].name, "maxpool1"), "maxpool defaults");
    TT_CHECK(m.layers[4].sh == 2 && m.layers[4].pw == 1, "avgpool");
    TT_CHECK(m.layers[5].p == 0.5f && !strcmp(m.layers[5].name, "dropout1"), "dropout");
    TT_CHECK(m.layers[7].kind == TT_L_LINEAR && m.layers[7].filters == 10 && !m.layers[7].bias, "linear");
    tt_model_free(&m);
  } else {
    TT_CHECK(0, "%s", err.msg);
  }
  TT_TEST_END();

  TT_TEST_BEGIN("recipe_settings_and_paths");
  {
    const char *t2 = "[net]\ninput = 3x8x8\nclasses = 2\n"
                     "[train]\nbatch = 32\nmicro_batch = 8\noptimizer = adamw\nlr = 3e-4\nbeta2 = 0.98\neps = 1e-6\n"
                     "schedule = cosine\nmin_lr = 1e-5\nprecision = bf16\nrecompute = all\nseed = 18446744073709551615\n"
                     "[data]\nformat = folder\ntrain = imagenet/train\ntest = /abs/val\nmean = 0.5, 0.25, 0.125\nstd = 0.5\n"
                     "hflip = yes\ncrop_pad = 4\n[gap]\n[linear]\nout = 2\n";
    if (tt_recipe_parse("some/dir/x.recipe", t2, &m, &err, NULL, NULL) == 0) {
      TT_CHECK(m.train.micro_batch == 8 && m.train.optimizer == TT_OPT_ADAMW && m.train.lr == 3e-4f && m.train.beta2 == 0.98f &&
                   m.train.adam_eps == 1e-6f && m.train.schedule == TT_LR_COSINE && m.train.min_lr == 1e-5f,
               "train values");
      TT_CHECK(m.train.precision == TT_PREC_BF16 && m.train.recompute == TT_RECOMP_ALL && m.train.seed == 18446744073709551615ULL,
               "precision/recompute/seed");
      TT_CHECK(!strcmp(m.data.train, "some/dir/imagenet/train") && !strcmp(m.data.test, "/abs/val"), "paths '%s' '%s'",
               m.data.train, m.data.test);
      TT_CHECK(m.data.mean[1] == 0.25f && m.data.mean[2] == 0.125f && m.data.std[2] == 0.5f && m.data.hflip && m.data.crop_pad == 4 &&
                   m.data.format == TT_DATA_FOLDER && m.data.line == 16,
               "data values");
      tt_model_free(&m);
    } else {
      TT_CHECK(0, "%s", err.msg);
    }
  }
  TT_TEST_END();
}

static void test_warnings(void) {
  tt_model m;
  tt_err err;
  warnings w;
  /* issue 14: an unknown key inside a layer section is an error (a typo such as 'dilation' or
   * 'padding' would silently change the model); this test used to expect warnings for the
   * conv's 'foo' and the block body's 'width'. Issue 25: so is one in [net], [train] and [data],
   * with the key meant when it is near (or the usual name elsewhere: learning_rate). */
  const char *text = "[net]\ninput = 1x4x4\nclasses = 2\nname = x\n[train]\nbatch = 4\nbatches = 8\n"
                     "[block b]\nparams = c\n[conv x]\nfilters = $c\nsize = 1\n[end]\n"
                     "[conv conv1]\nfilters = 2\nsize = 1\n[b b1]\nc = 2\nrepeat = 2\n[flatten]\n[linear]\nout = 2\n";
  TT_TEST_BEGIN("recipe_unknown_key_is_an_error");
  TT_CHECK(tt_recipe_parse("w.recipe", text, &m, &err, NULL, NULL) != 0 &&
               strstr(err.msg, "w.recipe:4: unknown key 'name' in [net]; the keys of [net] are: input, classes"),
           "[net] name: %s", err.msg);
  static const struct { const char *text, *want; } unknown[] = {
      {"[net]\ninput = 1x4x4\nclasses = 2\n[train]\nbatch = 4\nepoch = 3\n[linear]\nout = 2\n",
       "w.recipe:6: unknown key 'epoch' in [train]; did you mean 'epochs'?"},
      {"[net]\ninput = 1x4x4\nclasses = 2\n[train]\nbatch = 4\nlearning_rate = 0.1\n[linear]\nout = 2\n",
       "w.recipe:6: unknown key 'learning_rate' in [train]; did you mean 'lr'?"},
      {"[net]\ninput = 1x4x4\nclasses = 2\n[train]\nbatch = 4\n[data]\nformat = synthetic\nhflips = true\n[linear]\nout = 2\n",
       "w.recipe:8: unknown key 'hflips' in [data]; did you mean 'hflip'?"},
      {"[net]\ninput = 1x4x4\nclass = 2\n[train]\nbatch = 4\n[linear]\nout = 2\n",
       "w.recipe:3: unknown key 'class' in [net]; did you mean 'classes'?"},
  };
  for (size_t k = 0; k < sizeof unknown / sizeof unknown[0]; k++)
    TT_CHECK(tt_recipe_parse("w.recipe", unknown[k].text, &m, &err, NULL, NULL) != 0 && strstr(err.msg, unknown[k].want),
             "want '%s', got: %s", unknown[k].want, err.msg);
  TT_CHECK(tt_recipe_parse("w.recipe", strstr(text, "[train]"), &m, &err, NULL, NULL) != 0 &&
               !strncmp(err.msg, "w.recipe:1: ", 12),
           "a recipe without [net] must fail at line 1: %s", err.msg);
  TT_TEST_END();

  TT_TEST_BEGIN("recipe_unknown_layer_key_is_an_error");
  {
    static const struct {
      const char *text, *want;
    } bad[] = {
        {"[net]\ninput = 1x4x4\nclasses = 2\n[train]\nbatch = 4\n[conv conv1]\nfilters = 2\nsize = 3\ndilation = 2\n"
         "[flatten]\n[linear]\nout = 2\n",
         "w.recipe:9: unknown key 'dilation' in [conv conv1]; the keys of conv are: filters, size, stride, pad"},
        {"[net]\ninput = 1x4x4\nclasses = 2\n[train]\nbatch = 4\n[maxpool]\nsize = 2\npadding = 1\n"
         "[flatten]\n[linear]\nout = 2\n",
         "w.recipe:8: unknown key 'padding' in [maxpool maxpool1]"},
        {"[net]\ninput = 1x4x4\nclasses = 2\n[train]\nbatch = 4\n[bn]\npad = 1\n[flatten]\n[linear]\nout = 2\n",
         "w.recipe:7: unknown key 'pad' in [bn bn1]"},
        {"[net]\ninput = 1x4x4\nclasses = 2\n[train]\nbatch = 4\n[block b]\nparams = c\n[conv x]\nfilters = $c\n"
         "size = 1\nwidth = 3\n[end]\n[b b1]\nc = 2\n[flatten]\n[linear]\nout = 2\n",
         "w.recipe:11: unknown key 'width' in [conv b1.x]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      int rc = tt_recipe_parse("w.recipe", bad[i].text, &m, &err, NULL, NULL);
      TT_CHECK(rc != 0, "case %zu parsed; want the error %s", i, bad[i].want);
      if (rc == 0) tt_model_free(&m);
      else TT_CHECK(!strncmp(err.msg, bad[i].want, strlen(bad[i].want)), "case %zu: %s\n  want: %s", i, err.msg, bad[i].want);
    }
  }
  TT_TEST_END();

  TT_TEST_BEGIN("recipe_mean_std_scale_warns");
  {
    static const struct {
      const char *data, *want; /* want NULL: no warning */
    } cases[] = {
        {"mean = 125.3, 123.0, 113.9\nstd = 0.247, 0.243, 0.261\n",
         "w.recipe:7: warning: 'mean' = 125.3 looks like the 0-255 pixel scale, but pixels are normalised on [0, 1]; "
         "use mean = 0.4914, 0.4824, 0.4467"},
        {"mean = 0.4914\nstd = 63\n", "w.recipe:8: warning: 'std' = 63 looks like the 0-255 pixel scale, but pixels are "
                                      "normalised on [0, 1]; use std = 0.2471"},
        {"mean = -0.5\n", "w.recipe:7: warning: 'mean' = -0.5 is outside [0, 1]"},
        {"mean = 0.5, 0.4, 0.3\nstd = 0.2, 0.25, 1\n", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      char t[512];
      snprintf(t, sizeof t, "[net]\ninput = 3x4x4\nclasses = 2\n[train]\nbatch = 4\n[data]\n%sformat = synthetic\n"
                            "[flatten]\n[linear]\nout = 2\n", cases[i].data);
      memset(&w, 0, sizeof w);
      int rc = tt_recipe_parse("w.recipe", t, &m, &err, collect_warning, &w);
      TT_CHECK(rc == 0, "case %zu: %s", i, err.msg);
      if (rc) continue;
      tt_model_free(&m);
      if (!cases[i].want) TT_CHECK(w.n == 0, "case %zu: unexpected warning %s", i, w.first);
      else
        TT_CHECK(w.n == 1 && !strncmp(w.first, cases[i].want, strlen(cases[i].want)), "case %zu: %d warnings, first: %s\n"
                 "  want: %s", i, w.n, w.first, cases[i].want);
    }
  }
  TT_TEST_END();

  /* [data] synthetic_size: read for format = synthetic, a warning elsewhere, bounded */
  TT_TEST_BEGIN("recipe_synthetic_size");
  {
    static const char *const head = "[net]\ninput = 1x4x4\nclasses = 2\n[train]\nbatch = 4\n[data]\n";
    char t[512];
    snprintf(t, sizeof t, "%sformat = synthetic\nsynthetic_size = 6144\n[flatten]\n[linear]\nout = 2\n", head);
    memset(&w, 0, sizeof w);
    int rc = tt_recipe_parse("s.recipe", t, &m, &err, collect_warning, &w);
    TT_CHECK(rc == 0 && m.data.synthetic_size == 6144 && w.n == 0, "rc %d size %d warnings %d: %s", rc,
             rc ? 0 : m.data.synthetic_size, w.n, rc ? err.msg : w.first);
    if (!rc) tt_model_free(&m);
    snprintf(t, sizeof t, "%sformat = synthetic\nsynthetic_size = 0\n[flatten]\n[linear]\nout = 2\n", head);
    rc = tt_recipe_parse("s.recipe", t, &m, &err, NULL, NULL);
    TT_CHECK(rc != 0 && strstr(err.msg, "s.recipe:8") && strstr(err.msg, "synthetic_size"), "size 0 accepted: %s",
             rc ? err.msg : "rc 0");
    if (!rc) tt_model_free(&m);
    snprintf(t, sizeof t, "%sformat = idx\ntrain = a\ntrain_labels = b\nsynthetic_size = 9\n[flatten]\n[linear]\n"
                          "out = 2\n", head);
    memset(&w, 0, sizeof w);
    rc = tt_recipe_parse("s.recipe", t, &m, &err, collect_warning, &w);
    TT_CHECK(rc == 0 && w.n == 1 && strstr(w.first, "s.recipe:10") && strstr(w.first, "synthetic only"),
             "format = idx with synthetic_size: rc %d, %d warnings: %s", rc, w.n, rc ? err.msg : w.first);
    if (!rc) tt_model_free(&m);
  }
  TT_TEST_END();

  TT_TEST_BEGIN("recipe_open_error");
  TT_CHECK(tt_recipe_load("tests/recipes_bad/does-not-exist.recipe", &m, &err, NULL, NULL) != 0, "loaded a missing file");
  TT_CHECK(strstr(err.msg, "tests/recipes_bad/does-not-exist.recipe") && strstr(err.msg, "No such file"), "message: %s", err.msg);
  TT_CHECK(m.layers == NULL && m.nlayers == 0, "model not cleared");
  TT_TEST_END();
}

/* "PATH:LINE: ..." with LINE a positive decimal number. */
static int has_location(const char *msg, const char *path, int *line) {
  size_t n = strlen(path);
  const char *p;
  int v = 0;
  if (strncmp(msg, path, n) || msg[n] != ':') return 0;
  p = msg + n + 1;
  if (*p < '0' || *p > '9') return 0;
  while (*p >= '0' && *p <= '9') v = v * 10 + (*p++ - '0');
  if (line) *line = v;
  return *p == ':' && p[1] == ' ' && v > 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_bad_files(void) {
  const char *dir = "tests/recipes_bad";
  DIR *d = opendir(dir);
  char *names[256];
  int n = 0, i;
  struct dirent *de;
  TT_TEST_BEGIN("recipe_bad_files");
  TT_CHECK(d != NULL, "cannot open %s", dir);
  while (d && (de = readdir(d)) != NULL && n < 256) {
    size_t l = strlen(de->d_name);
    if (l > 7 && !strcmp(de->d_name + l - 7, ".recipe")) names[n++] = strdup(de->d_name);
  }
  if (d) closedir(d);
  qsort(names, (size_t)n, sizeof names[0], cmp_str);
  TT_CHECK(n >= 12, "only %d malformed recipes", n);
  for (i = 0; i < n; i++) {
    char path[512], head[512] = "", want_msg[512] = "";
    int want_line = 1, got_line = 0;
    tt_model m;
    tt_err err;
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    /* "# expect-line: N" on the first line, optionally "# expect: TEXT" on the second;
     * a file without them (the empty one) expects line 1. */
    f = fopen(path, "rb");
    if (f) {
      if (fgets(head, sizeof head, f)) sscanf(head, "# expect-line: %d", &want_line);
      if (fgets(head, sizeof head, f) && !strncmp(head, "# expect: ", 10)) {
        snprintf(want_msg, sizeof want_msg, "%s", head + 10);
        want_msg[strcspn(want_msg, "\r\n")] = 0;
      }
      fclose(f);
    }
    err.msg[0] = 0;
    if (tt_recipe_load(path, &m, &err, NULL, NULL) == 0) {
      TT_CHECK(0, "%s parsed", path);
      tt_model_free(&m);
      continue;
    }
    TT_CHECK(has_location(err.msg, path, &got_line), "no '%s:LINE:' in: %s", path, err.msg);
    TT_CHECK(got_line == want_line, "%s: error at line %d, expected %d: %s", names[i], got_line, want_line, err.msg);
    TT_CHECK(!want_msg[0] || strstr(err.msg, want_msg), "%s: message lacks '%s': %s", names[i], want_msg, err.msg);
    TT_CHECK(m.layers == NULL, "model not cleared after an error");
    if (getenv("TT_VERBOSE")) printf("  %s\n", err.msg);
  }
  for (i = 0; i < n; i++) free(names[i]);
  TT_TEST_END();
}

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  long n;
  char *t;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  t = (char *)malloc((size_t)n + 1);
  if (t && fread(t, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (t) t[n] = 0;
  fclose(f);
  return t;
}

/* One random edit: delete, duplicate or corrupt a character, or delete, duplicate or
 * swap a line. The text stays NUL-terminated; corrupt bytes are never NUL. */
static size_t mutate(char *t, size_t len, size_t cap, uint64_t *rng) {
  static const char pick[] = "[]=$#,x. \n{}-0123456789abcdefgz";
  size_t pos = len ? (size_t)(tt_test_xorshift(rng) % len) : 0;
  unsigned op = (unsigned)(tt_test_xorshift(rng) % 7);
  if (!len) op = 1;
  if (op == 0) { /* delete a character */
    memmove(t + pos, t + pos + 1, len - pos);
    return len - 1;
  }
  if (op == 1 && len + 1 < cap) { /* duplicate or insert a character */
    memmove(t + pos + 1, t + pos, len - pos + 1);
    if (len && tt_test_xorshift(rng) % 2) t[pos] = t[pos + 1];
    else t[pos] = pick[tt_test_xorshift(rng) % (sizeof pick - 1)];
    return len + 1;
  }
  if (op == 2) { /* corrupt a character with any non-NUL byte or a syntax character */
    t[pos] = (tt_test_xorshift(rng) % 2) ? (char)(1 + tt_test_xorshift(rng) % 255)
                                         : pick[tt_test_xorshift(rng) % (sizeof pick - 1)];
    return len;
  }
  {
    size_t a = pos, b, la;
    while (a > 0 && t[a - 1] != '\n') a--;
    b = pos;
    while (b < len && t[b] != '\n') b++;
    if (b < len) b++;
    la = b - a;
    if (op == 3 || op == 6) { /* delete the line */
      memmove(t + a, t + b, len - b + 1);
      return len - la;
    }
    if ((op == 4) && len + la < cap) { /* duplicate the line */
      memmove(t + b, t + a, len - a + 1);
      return len + la;
    }
    if (op == 5 && b < len) { /* swap it with the next line */
      size_t c = b, lb;
      char tmp[8192];
      while (c < len && t[c] != '\n') c++;
      if (c < len) c++;
      lb = c - b;
      if (la + lb < sizeof tmp) {
        memcpy(tmp, t + b, lb);
        memcpy(tmp + lb, t + a, la);
        memcpy(t + a, tmp, la + lb);
      }
    }
  }
  return len;
}

static void test_mutations(void) {
  static const char *const paths[] = {"examples/fashion_mnist/lenet.recipe", "examples/fashion_mnist/resnet.recipe",
                                      "examples/imagenet/resnet18.recipe", "examples/imagenet/resnet50.recipe",
                                      "examples/imagenet/vgg16.recipe", "examples/imagenet/mobilenet_v2.recipe",
                                      "tests/fixtures/small_cnn.recipe"};
  const int per_file = 1500;
  uint64_t rng = 0x9E3779B97F4A7C15ULL;
  int f, it, parsed = 0, failed = 0;
  TT_TEST_BEGIN("recipe_random_mutations");
  for (f = 0; f < (int)(sizeof paths / sizeof paths[0]); f++) {
    char *orig = read_all(paths[f]);
    size_t olen, cap;
    char *t;
    TT_CHECK(orig != NULL, "cannot read %s", paths[f]);
    if (!orig) continue;
    olen = strlen(orig);
    cap = olen * 2 + 64;
    t = (char *)malloc(cap);
    for (it = 0; it < per_file; it++) {
      size_t len = olen;
      int k, nmut = 1 + (int)(tt_test_xorshift(&rng) % 4), line = 0, i, j;
      tt_model m;
      tt_err err;
      memcpy(t, orig, olen + 1);
      for (k = 0; k < nmut; k++) len = mutate(t, len, cap, &rng);
      t[len] = 0;
      err.msg[0] = 0;
      if (tt_recipe_parse("fuzz/x.recipe", t, &m, &err, NULL, NULL) == 0) {
        parsed++;
        TT_CHECK(m.nlayers >= 2 && m.layers[0].kind == TT_L_INPUT, "parsed model without layers");
        for (i = 1; i < m.nlayers; i++)
          for (j = 0; j < m.layers[i].ninputs; j++)
            TT_CHECK(m.layers[i].inputs[j] >= 0 && m.layers[i].inputs[j] < i, "layer %s reads layer %d", m.layers[i].name,
                     m.layers[i].inputs[j]);
        tt_model_free(&m);
      } else {
        failed++;
        TT_CHECK(has_location(err.msg, "fuzz/x.recipe", &line), "error without 'path:line:': %s", err.msg);
        TT_CHECK(m.layers == NULL, "model not cleared");
      }
    }
    free(t);
    free(orig);
  }
  printf("  mutations: %d parsed, %d rejected with path:line\n", parsed, failed);
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("examples", "compile recipe", test_examples),
  TT_TEST("names_and_blocks", "compile recipe", test_names_and_blocks),
  TT_TEST("defaults", "compile recipe", test_defaults),
  TT_TEST("warnings", "compile recipe", test_warnings),
  TT_TEST("bad_files", "compile recipe", test_bad_files),
  TT_TEST("mutations", "compile recipe", test_mutations),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
