/* tests/runtime/test_finetune.c — fine-tuning on the CPU:
 *   - weights of a 10-class model loaded into a 3-class one (tt_net_load_matching, and
 *     `train --init` through tt_train): everything but the classifier takes the file's values,
 *     the classifier keeps its fresh initialisation, and the report says so;
 *   - freeze = true: the frozen layers' weights are unchanged after training, the plan has no
 *     gradient or optimizer state for them (and is smaller by exactly that), the others train. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/safetensors.h"
#include "core/runtime/session.h"
#include "core/tinytrain.h"
#include "tests/tt_test.h"

#define FT_RECIPE(classes, freeze)                                                                                    \
  "[net]\ninput = 1x8x8\nclasses = " classes "\n[train]\nbatch = 16\noptimizer = sgd\nlr = 0.1\nmomentum = 0.9\n" \
  "seed = 4\n[data]\nformat = synthetic\n[conv conv1]\nfilters = 4\nsize = 3\nbias = false\n" freeze           \
  "[bn bn1]\nactivation = relu\n" freeze "[maxpool]\nsize = 2\n[flatten]\n[linear fc1]\nout = 16\n"             \
  "activation = relu\n[linear fc2]\nout = " classes "\n"


static tt_net *ft_open(const char *text, char *err, size_t n) {
  tt_run_opts o;
  tt_run_opts_init(&o);
  o.recipe = "ft", o.recipe_text = text, o.device = TT_DEVICE_CPU, o.threads = 1;
  tt_net *net = NULL;
  if (tt_net_open(&net, &o, err, n)) return NULL;
  return net;
}

static int ft_train(tt_net *net, int steps) {
  uint8_t img[16 * 64];
  int32_t lab[16];
  tt_test_rng r = {9};
  for (int s = 0; s < steps; s++) {
    for (int i = 0; i < 16 * 64; i++) img[i] = (uint8_t)tt_test_rng_int(&r, 0, 255);
    for (int i = 0; i < 16; i++) lab[i] = tt_test_rng_int(&r, 0, 2);
    if (tt_net_train_step(net, img, lab, 16, NULL)) return -1;
  }
  return 0;
}

/* Whether tensor `name` holds the same bytes in files a and b (-1: absent from one). */
static int ft_same(const char *a, const char *b, const char *name) {
  tt_st_file *fa = NULL, *fb = NULL;
  tt_err e;
  int rc = -1;
  if (tt_st_open(a, &fa, &e) == 0 && tt_st_open(b, &fb, &e) == 0) {
    const tt_st_tensor *ta = tt_st_get(fa, name), *tb = tt_st_get(fb, name);
    if (ta && tb) rc = ta->bytes == tb->bytes && memcmp(ta->data, tb->data, ta->bytes) == 0;
  }
  if (fa) tt_st_close(fa);
  if (fb) tt_st_close(fb);
  return rc;
}

static const char *const ft_body[] = {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                                      "fc1.weight", "fc1.bias", NULL};

static void test_other_classes(void) {
  TT_TEST_BEGIN("finetune_other_class_count");
  char err[1200], w10[128], w3[128], fresh[128], rep[2048];
  snprintf(w10, sizeof w10, "%s/w10.safetensors", tt_test_dir());
  snprintf(w3, sizeof w3, "%s/w3.safetensors", tt_test_dir());
  snprintf(fresh, sizeof fresh, "%s/fresh.safetensors", tt_test_dir());
  tt_net *a = ft_open(FT_RECIPE("10", ""), err, sizeof err), *b = NULL, *c = NULL;
  TT_CHECK(a && ft_train(a, 3) == 0 && tt_net_save(a, w10) == 0, "10 classes: %s", a ? tt_net_error(a) : err);
  b = ft_open(FT_RECIPE("3", ""), err, sizeof err);
  c = ft_open(FT_RECIPE("3", ""), err, sizeof err);
  TT_CHECK(b && c && tt_net_save(c, fresh) == 0, "3 classes: %s", err);
  if (!a || !b || !c) goto done;
  TT_CHECK(tt_net_load_matching(b, w10, rep, sizeof rep) == 0, "load_matching: %s", tt_net_error(b));
  TT_CHECK(strstr(rep, "loaded 7 of the recipe's 9") && strstr(rep, "fc2.weight (shape [10, 16] there, [3, 16] here)") &&
           strstr(rep, "freshly initialised 2: fc2.weight, fc2.bias"), "report: %s", rep);
  TT_CHECK(tt_net_save(b, w3) == 0, "save: %s", tt_net_error(b));
  for (int i = 0; ft_body[i]; i++) TT_CHECK(ft_same(w3, w10, ft_body[i]) == 1, "%s was not loaded", ft_body[i]);
  TT_CHECK(ft_same(w3, fresh, "fc2.weight") == 1 && ft_same(w3, fresh, "fc2.bias") == 1,
           "the classifier is not the fresh initialisation");
  TT_CHECK(ft_same(w3, w10, "conv1.weight") == 1 && ft_same(fresh, w10, "conv1.weight") == 0,
           "conv1.weight: the test cannot tell loaded from fresh");
  /* train --init through tt_train: the run reports it and starts from the same weights */
  {
    tt_run_opts o;
    char out[160], text[2048], log[160];
    tt_run_opts_init(&o);
    snprintf(out, sizeof out, "%s/run", tt_test_dir());
    snprintf(log, sizeof log, "%s/run.log", tt_test_dir());
    snprintf(text, sizeof text, "%s", FT_RECIPE("3", ""));
    o.recipe = "ft", o.recipe_text = text, o.device = TT_DEVICE_CPU, o.threads = 1, o.init_weights = w10;
    o.out_dir = out, o.max_steps = 1;
    FILE *f = fopen(log, "w");
    o.out = f;
    int rc = tt_train(&o, NULL, err, sizeof err);
    fclose(f);
    TT_CHECK(rc == 0, "train --init: %s", err);
    char buf[8192] = "";
    f = fopen(log, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    TT_CHECK(strstr(buf, "init: ") && strstr(buf, "freshly initialised 2: fc2.weight, fc2.bias"), "train --init said: %s", buf);
    o.init_weights = fresh; /* nothing matching at all: an error */
    snprintf(text, sizeof text, "%s", FT_RECIPE("3", ""));
    char *at = strstr(text, "conv1");
    memcpy(at, "convA", 5); /* another name */
    at = strstr(text, "bn1"), memcpy(at, "bnA", 3);
    at = strstr(text, "fc1"), memcpy(at, "fcA", 3);
    at = strstr(text, "fc2"), memcpy(at, "fcB", 3);
    snprintf(out, sizeof out, "%s/run2", tt_test_dir());
    o.out = fopen("/dev/null", "w");
    rc = tt_train(&o, NULL, err, sizeof err);
    fclose(o.out);
    TT_CHECK(rc != 0 && strstr(err, "no tensor matches"), "weights matching nothing: rc %d '%s'", rc, err);
  }
done:
  tt_net_close(a), tt_net_close(b), tt_net_close(c);
  TT_TEST_END();
}

/* A PyTorch-style state dict: fp16 and bf16 tensors convert, an int64 counter that names no
 * parameter (num_batches_tracked) is reported unused, not an error. */
static void test_state_dict_dtypes(void) {
  TT_TEST_BEGIN("finetune_state_dict_dtypes");
  char err[1200], path[128], rep[2048];
  snprintf(path, sizeof path, "%s/sd.safetensors", tt_test_dir());
  uint16_t w16[16 * 64], b16[16];
  int64_t nbt = 7;
  for (int i = 0; i < 16 * 64; i++) w16[i] = tt_f32_to_f16(0.25f);
  for (int i = 0; i < 16; i++) b16[i] = 0x3f80; /* bf16 1.0 */
  tt_st_tensor t[3];
  memset(t, 0, sizeof t);
  t[0].name = "fc1.weight", t[0].dtype = "F16", t[0].ndim = 2, t[0].shape[0] = 16, t[0].shape[1] = 64;
  t[0].data = w16, t[0].bytes = sizeof w16;
  t[1].name = "fc1.bias", t[1].dtype = "BF16", t[1].ndim = 1, t[1].shape[0] = 16, t[1].data = b16, t[1].bytes = sizeof b16;
  t[2].name = "bn1.num_batches_tracked", t[2].dtype = "I64", t[2].ndim = 0, t[2].data = &nbt, t[2].bytes = 8;
  tt_err e;
  int rc = tt_st_write(path, t, 3, NULL, &e);
  TT_CHECK(rc == 0, "write: %s", e.msg);
  tt_net *n = ft_open(FT_RECIPE("3", ""), err, sizeof err);
  TT_CHECK(n != NULL, "open: %s", err);
  if (!n || rc) {
    tt_net_close(n);
    return;
  }
  TT_CHECK(tt_net_load_matching(n, path, rep, sizeof rep) == 0, "load: %s", tt_net_error(n));
  TT_CHECK(strstr(rep, "loaded 2 of") && strstr(rep, "1 tensors of the file name no parameter here (bn1.num_batches_tracked)"),
           "report: %s", rep);
  char out[128];
  snprintf(out, sizeof out, "%s/sd_out.safetensors", tt_test_dir());
  tt_st_file *f = NULL;
  if (tt_net_save(n, out) == 0 && tt_st_open(out, &f, &e) == 0) {
    const tt_st_tensor *w = tt_st_get(f, "fc1.weight"), *b = tt_st_get(f, "fc1.bias");
    float wv, bv;
    memcpy(&wv, (const char *)w->data + 4 * 37, 4);
    memcpy(&bv, (const char *)b->data + 4 * 5, 4);
    TT_CHECK(wv == 0.25f && bv == 1.0f, "fc1.weight[37] %g (want 0.25 from fp16), fc1.bias[5] %g (want 1 from bf16)", wv, bv);
    tt_st_close(f);
  } else {
    TT_CHECK(0, "save: %s", tt_net_error(n));
  }
  tt_net_close(n);
  TT_TEST_END();
}

static void test_freeze(void) {
  TT_TEST_BEGIN("freeze_keeps_weights_and_plans_no_gradient");
  char err[1200], w0[128], w1[128];
  snprintf(w0, sizeof w0, "%s/f0.safetensors", tt_test_dir());
  snprintf(w1, sizeof w1, "%s/f1.safetensors", tt_test_dir());
  tt_net *n = ft_open(FT_RECIPE("3", "freeze = true\n"), err, sizeof err);
  TT_CHECK(n != NULL, "open: %s", err);
  if (!n) return;
  TT_CHECK(tt_net_save(n, w0) == 0 && ft_train(n, 4) == 0 && tt_net_save(n, w1) == 0, "train: %s", tt_net_error(n));
  const char *frozen[] = {"conv1.weight", "bn1.weight", "bn1.bias"};
  for (int i = 0; i < 3; i++) TT_CHECK(ft_same(w0, w1, frozen[i]) == 1, "frozen %s changed in training", frozen[i]);
  TT_CHECK(ft_same(w0, w1, "fc1.weight") == 0 && ft_same(w0, w1, "fc2.bias") == 0, "the other layers did not train");
  TT_CHECK(ft_same(w0, w1, "bn1.running_mean") == 0, "a frozen batch norm's running statistics should still update");
  tt_net_close(n);
  /* the plans with and without freeze: no gradient or momentum for the frozen weights */
  tt_session *s[2] = {NULL, NULL};
  tt_err e;
  for (int k = 0; k < 2; k++) {
    tt_run_opts o;
    tt_run_opts_init(&o);
    o.recipe = "ft", o.recipe_text = k ? FT_RECIPE("3", "freeze = true\n") : FT_RECIPE("3", ""), o.device = TT_DEVICE_CPU;
    o.threads = 1;
    TT_CHECK(tt_session_open(&s[k], &o, TT_SESSION_PLAN, &e) == 0, "plan: %s", e.msg);
  }
  if (s[0] && s[1]) {
    const tt_program *p0 = &s[0]->sched.train, *p1 = &s[1]->sched.train;
    size_t frozen = s[1]->graph.frozen_numel * sizeof(float); /* conv1 4x1x3x3 + bn1 2x4 */
    TT_CHECK(frozen == (36 + 8) * sizeof(float), "frozen_numel %zu", s[1]->graph.frozen_numel);
    for (int i = 0; i < s[1]->graph.nparams; i++) {
      const tt_param *pr = &s[1]->graph.params[i];
      int is_frozen = !strncmp(pr->name, "conv1.", 6) || !strcmp(pr->name, "bn1.weight") || !strcmp(pr->name, "bn1.bias");
      int want = p0->grad_buf[i] >= 0 && !is_frozen; /* running statistics have none either way */
      TT_CHECK((p1->grad_buf[i] >= 0) == want && (p1->m_buf[i] >= 0) == want && (p0->m_buf[i] >= 0) == (p0->grad_buf[i] >= 0),
               "%s: gradient buffer %d, momentum %d", pr->name, p1->grad_buf[i], p1->m_buf[i]);
    }
    /* nothing trainable at or before maxpool: no backward step runs there (fc1 leaves dx out) */
    int bwd[2] = {0, 0}, fc = 0;
    for (int k = 0; k < 2; k++) {
      const tt_program *p = k ? p1 : p0;
      for (int i = 0; i < p->nsteps; i++) {
        const tt_step *st = &p->steps[i];
        const char *nm = st->op == TT_S_BWD && st->node >= 0 ? s[k]->model.layers[st->node].name : "";
        bwd[k] += !strncmp(nm, "conv1", 5) || !strncmp(nm, "bn1", 3) || !strncmp(nm, "maxpool", 7);
        if (k && !strcmp(nm, "fc1")) fc = st->out[TT_BWD_DX] < 0 && st->out[TT_BWD_DW] >= 0;
      }
    }
    TT_CHECK(bwd[0] >= 3 && bwd[1] == 0 && fc, "backward steps in the frozen prefix: %d unfrozen, %d frozen (want 0); "
             "fc1 leaves dx out: %d", bwd[0], bwd[1], fc);
    TT_CHECK(p0->class_bytes[TT_BC_GRADS] - p1->class_bytes[TT_BC_GRADS] == frozen &&
             p0->class_bytes[TT_BC_OPTIMIZER] - p1->class_bytes[TT_BC_OPTIMIZER] == frozen,
             "gradients %zu -> %zu, optimizer %zu -> %zu, frozen %zu bytes", p0->class_bytes[TT_BC_GRADS],
             p1->class_bytes[TT_BC_GRADS], p0->class_bytes[TT_BC_OPTIMIZER], p1->class_bytes[TT_BC_OPTIMIZER], frozen);
  }
  tt_session_close(s[0]), tt_session_close(s[1]);
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("other_classes", "runtime finetune", test_other_classes),
  TT_TEST("state_dict_dtypes", "runtime finetune", test_state_dict_dtypes),
  TT_TEST("freeze", "runtime finetune", test_freeze),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
