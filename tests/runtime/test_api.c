/* tests/runtime/test_api.c — the step-level API (tinytrain.h, tt_net_*), on the CPU:
 *   - a run driven through tt_net_train_step on the batches the command line's loader makes
 *     ends bit-identical to tt_train's run (batch norm, dropout, accumulation 4, nesterov,
 *     warm-up + cosine), and the progress callback is told of the logged interval;
 *   - predict's argmax accuracy equals evaluate's, probabilities sum to 1, top-k agrees;
 *   - a batch that is not a multiple of the micro-batch (its last one padded) trains like the
 *     same batch in whole micro-batches;
 *   - misuse (too large a batch, a bad label, a bad recipe) is refused with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/data/data.h"
#include "core/compile/recipe.h"
#include "core/base/safetensors.h"
#include "core/app/cli.h"
#include "core/tinytrain.h"
#include "tests/tt_test.h"

static const char *api_recipe =
    "[net]\ninput = 1x16x16\nclasses = 10\n"
    "[train]\nbatch = 32\nepochs = 1\noptimizer = sgd\nlr = 0.05\nmomentum = 0.9\nnesterov = true\n"
    "weight_decay = 5e-4\nschedule = cosine\nwarmup_epochs = 0.5\nseed = 7\nlog_every = 5\n"
    "[data]\nformat = synthetic\nmean = 0.5\nstd = 0.25\ncrop_pad = 2\nhflip = true\n"
    "[conv conv1]\nfilters = 8\nsize = 3\nbias = false\n[bn bn1]\nactivation = relu\n[maxpool pool1]\nsize = 2\n"
    "[flatten]\n[linear fc1]\nout = 32\nactivation = relu\n[dropout]\np = 0.3\n[linear fc2]\nout = 10\n";

/* no batch norm, no dropout: a padded micro-batch trains exactly like whole ones */
static const char *plain_recipe =
    "[net]\ninput = 1x8x8\nclasses = 4\n[train]\nbatch = 32\noptimizer = sgd\nlr = 0.1\nseed = 3\n"
    "[conv c1]\nfilters = 4\nsize = 3\nactivation = relu\n[maxpool p1]\nsize = 2\n[flatten]\n[linear fc]\nout = 4\n";


static void cpu_opts(tt_run_opts *o, const char *recipe) {
  tt_run_opts_init(o);
  o->recipe = recipe, o->device = TT_DEVICE_CPU, o->threads = 1, o->quiet = 1;
}

/* Every tensor of a equals b's bit for bit (names, shapes, bytes); 0 when so, else prints why. */
static int same_weights(const char *a, const char *b, double tol, char *why, size_t n) {
  tt_st_file *fa = NULL, *fb = NULL;
  tt_err err;
  int rc = -1;
  if (tt_st_open(a, &fa, &err) || tt_st_open(b, &fb, &err)) {
    snprintf(why, n, "%.400s", err.msg);
    goto done;
  }
  if (tt_st_count(fa) != tt_st_count(fb)) {
    snprintf(why, n, "%d tensors against %d", tt_st_count(fa), tt_st_count(fb));
    goto done;
  }
  for (int i = 0; i < tt_st_count(fa); i++) {
    const tt_st_tensor *ta = tt_st_at(fa, i), *tb = tt_st_get(fb, ta->name);
    if (!tb || tb->bytes != ta->bytes) {
      snprintf(why, n, "%s: absent or of another size", ta->name);
      goto done;
    }
    const float *x = (const float *)ta->data, *y = (const float *)tb->data;
    for (size_t k = 0; k < ta->bytes / 4; k++)
      if (tol == 0.0 ? memcmp(x + k, y + k, 4) != 0 : fabs(x[k] - y[k]) > tol * (1.0 + fabs(x[k]))) {
        snprintf(why, n, "%s[%zu]: %.9g against %.9g", ta->name, k, x[k], y[k]);
        goto done;
      }
  }
  rc = 0;
done:
  if (fa) tt_st_close(fa);
  if (fb) tt_st_close(fb);
  return rc;
}

static int progress_calls;
static long long progress_step;
static void on_progress(void *ud, const tt_progress *p) {
  (void)ud;
  progress_calls++;
  progress_step = p->step;
}

/* The command line's run: tt_train stopped by max_steps with its checkpoint. */
static int cli_run(const char *recipe, int steps, tt_run_result *res, char *err, size_t errsize) {
  tt_run_opts o;
  cpu_opts(&o, recipe);
  char out[128];
  snprintf(out, sizeof out, "%s/cli", tt_test_dir());
  o.out_dir = out, o.micro_batch = 8, o.max_steps = steps, o.on_progress = on_progress;
  FILE *devnull = fopen("/dev/null", "w");
  o.out = devnull;
  int rc = tt_train(&o, res, err, errsize);
  if (devnull) fclose(devnull);
  return rc;
}

/* The same steps through the API, on the batches the loader gives the command line. */
static int api_run(tt_net *net, const char *recipe, int steps, char *err, size_t errsize) {
  tt_model m;
  tt_dataset ds;
  tt_loader *tl = NULL;
  tt_err e;
  tt_net_info info;
  memset(&ds, 0, sizeof ds);
  tt_net_info_get(net, &info);
  if (tt_recipe_load(recipe, &m, &e, NULL, NULL)) return snprintf(err, errsize, "%s", e.msg), -1;
  int rc = -1;
  size_t numel = (size_t)info.channels * info.height * info.width;
  uint8_t *img = (uint8_t *)malloc(numel * info.batch);
  int32_t *lab = (int32_t *)malloc(sizeof(int32_t) * info.batch);
  if (tt_dataset_load(&m.data, 1, m.in_c, m.in_h, m.in_w, &ds, &e, NULL, NULL) ||
      tt_loader_create(&tl, &ds, info.micro_batch, 1, m.data.crop_pad, m.data.hflip, m.train.seed, 2, &e)) {
    snprintf(err, errsize, "%s", e.msg);
    goto done;
  }
  tt_loader_start_epoch(tl, 0, 0);
  int per_epoch = tt_loader_batches(tl) / info.accum_steps;
  for (int k = 0; k < steps; k++) {
    for (int a = 0; a < info.accum_steps; a++) {
      const uint8_t *bi;
      const int32_t *bl;
      int cnt;
      if (tt_loader_next(tl, &bi, &bl, &cnt, NULL)) goto done;
      memcpy(img + (size_t)a * info.micro_batch * numel, bi, numel * cnt);
      memcpy(lab + (size_t)a * info.micro_batch, bl, sizeof(int32_t) * cnt);
      tt_loader_release(tl);
    }
    tt_step_stats st;
    if (tt_net_set_lr(net, tt_net_lr_at(net, (double)k / per_epoch)) ||
        tt_net_train_step(net, img, lab, info.batch, &st)) {
      snprintf(err, errsize, "%s", tt_net_error(net));
      goto done;
    }
    if (!(st.loss > 0.0 && st.loss < 100.0) || st.accuracy < 0.0 || st.accuracy > 1.0 || st.step != k + 1) {
      snprintf(err, errsize, "step %d: loss %g accuracy %g step %lld", k, st.loss, st.accuracy, st.step);
      goto done;
    }
  }
  rc = 0;
done:
  if (tl) tt_loader_destroy(tl);
  tt_dataset_free(&ds);
  tt_model_free(&m);
  free(img);
  free(lab);
  return rc;
}

static void test_api_equals_cli(tt_net **keep) {
  TT_TEST_BEGIN("api_train_equals_cli");
  char recipe[128], err[1200], cli_w[160], api_w[160], why[512];
  snprintf(recipe, sizeof recipe, "%s/api.recipe", tt_test_dir());
  FILE *f = fopen(recipe, "w");
  fputs(api_recipe, f);
  fclose(f);
  tt_run_result res;
  memset(&res, 0x5a, sizeof res);
  int rc = cli_run(recipe, 7, &res, err, sizeof err);
  TT_CHECK(rc == 0, "tt_train: %s", err);
  /* stopped by max_steps: 7 steps, no signal; an accuracy only if an epoch ended and evaluated */
  TT_CHECK(rc || (res.steps_done == 7 && res.stop_signal == 0 &&
                  (isnan(res.final_accuracy) || (res.final_accuracy >= 0.0 && res.final_accuracy <= 1.0))),
           "tt_run_result: %lld steps, accuracy %g, signal %d (want 7, NaN or a fraction, 0)", res.steps_done,
           res.final_accuracy, res.stop_signal);
  TT_CHECK(progress_calls == 1 && progress_step == 5, "progress callback: %d calls, last at step %lld (want 1, 5)",
           progress_calls, progress_step);
  tt_run_opts o;
  cpu_opts(&o, recipe);
  o.micro_batch = 8;
  tt_net *net = NULL;
  rc = tt_net_open(&net, &o, err, sizeof err);
  TT_CHECK(rc == 0, "tt_net_open: %s", err);
  if (rc) return;
  tt_net_info info;
  tt_net_info_get(net, &info);
  TT_CHECK(info.micro_batch == 8 && info.accum_steps == 4 && info.batch == 32 &&
               (!strcmp(info.precision, "fp32") || !strcmp(info.precision, "bf16")) && /* auto: bf16 where native */
           info.arena_bytes > 0 && info.classes == 10, "plan: micro-batch %d x %d, %s, arena %zu", info.micro_batch,
           info.accum_steps, info.precision, info.arena_bytes);
  rc = api_run(net, recipe, 7, err, sizeof err);
  TT_CHECK(rc == 0, "API run: %s", err);
  snprintf(cli_w, sizeof cli_w, "%s/cli/weights.safetensors", tt_test_dir());
  snprintf(api_w, sizeof api_w, "%s/api.safetensors", tt_test_dir());
  TT_CHECK(tt_net_save(net, api_w) == 0, "save: %s", tt_net_error(net));
  TT_CHECK(same_weights(cli_w, api_w, 0.0, why, sizeof why) == 0, "API run differs from tt_train's: %s", why);
  TT_TEST_END();
  *keep = net;
}

/* Opens a net of o's recipe at precision (2: fp16, TT_PRECISION_BF16), named what, with the
 * weights file w, and checks that it plans that precision and that predicting the n images
 * (256 pixels each) and predicting them as normalised floats ((x / 255 - 0.5) / 0.25) give
 * probabilities (n x C) within tol. */
static void half_predict(tt_run_opts *o, int precision, const char *what, double tol, const char *w, const uint8_t *images,
                         int n, int C) {
  char err[1200];
  tt_net *b = NULL;
  o->precision = precision;
  if (tt_net_open(&b, o, err, sizeof err) != 0) {
    TT_CHECK(0, "open %s: %s", what, err);
    return;
  }
  size_t cnt = (size_t)n * 256;
  float *fx = (float *)malloc(sizeof(float) * cnt), *p1 = (float *)malloc(sizeof(float) * n * C),
        *p2 = (float *)malloc(sizeof(float) * n * C);
  for (size_t i = 0; i < cnt; i++) fx[i] = (images[i] / 255.0f - 0.5f) / 0.25f;
  tt_net_info in;
  tt_net_info_get(b, &in);
  TT_CHECK(precision == 2 ? in.fp16 : !in.fp16 && !strcmp(in.precision, what), "precision %s asked, %s planned", what,
           in.precision);
  TT_CHECK(tt_net_load(b, w) == 0 && tt_net_predict(b, images, n, p1) == 0 && tt_net_predict_f32(b, fx, n, p2) == 0,
           "%s load + predict: %s", what, tt_net_error(b));
  double worst = 0;
  for (size_t i = 0; i < (size_t)n * C; i++) worst = fmax(worst, fabs(p2[i] - p1[i]));
  TT_CHECK(worst < tol, "%s: predict_f32 differs from predict by %g", what, worst);
  free(fx), free(p1), free(p2);
  tt_net_close(b);
}

static void test_predict(tt_net *net) {
  TT_TEST_BEGIN("api_predict_agrees_with_evaluate");
  tt_dataset ds;
  tt_err e;
  tt_data_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.format = TT_DATA_SYNTHETIC, cfg.classes = 10;
  int rc = tt_dataset_load(&cfg, 0, 1, 16, 16, &ds, &e, NULL, NULL);
  TT_CHECK(rc == 0, "test split: %s", e.msg);
  if (rc) return;
  int n = 250, C = 10, k = 3; /* not a multiple of the evaluation batch */
  float *probs = (float *)malloc(sizeof(float) * n * C), *kp = (float *)malloc(sizeof(float) * n * k);
  int32_t *kc = (int32_t *)malloc(sizeof(int32_t) * n * k);
  double loss = -1, acc = -1;
  TT_CHECK(tt_net_evaluate(net, ds.images, ds.labels, n, &loss, &acc) == 0, "evaluate: %s", tt_net_error(net));
  TT_CHECK(tt_net_predict(net, ds.images, n, probs) == 0, "predict: %s", tt_net_error(net));
  TT_CHECK(tt_net_topk(net, ds.images, n, k, kc, kp) == 0, "topk: %s", tt_net_error(net));
  int correct = 0;
  for (int i = 0; i < n; i++) {
    const float *p = probs + (size_t)i * C;
    int best = 0;
    double sum = 0;
    for (int c = 0; c < C; c++) sum += p[c], best = p[c] > p[best] ? c : best;
    correct += best == ds.labels[i];
    TT_CHECK(fabs(sum - 1.0) < 1e-4, "sample %d: probabilities sum to %g", i, sum);
    TT_CHECK(kc[i * k] == best && kp[i * k] == p[best] && kp[i * k] >= kp[i * k + 1] && kp[i * k + 1] >= kp[i * k + 2],
             "sample %d: top-%d %d (%g) %d (%g), argmax %d (%g)", i, k, kc[i * k], kp[i * k], kc[i * k + 1], kp[i * k + 1],
             best, p[best]);
    if (tt_test_current_failed) break;
  }
  TT_CHECK(fabs((double)correct / n - acc) < 1e-9, "predict's accuracy %d/%d, evaluate's %g", correct, n, acc);
  { /* the same images as normalised floats (the recipe's mean 0.5, std 0.25) predict alike */
    size_t cnt = (size_t)n * 256;
    float *fx = (float *)malloc(sizeof(float) * cnt), *p2 = (float *)malloc(sizeof(float) * n * C);
    for (size_t i = 0; i < cnt; i++) fx[i] = (ds.images[i] / 255.0f - 0.5f) / 0.25f;
    TT_CHECK(tt_net_predict_f32(net, fx, n, p2) == 0, "predict_f32: %s", tt_net_error(net));
    double worst = 0;
    for (size_t i = 0; i < (size_t)n * C; i++) worst = fmax(worst, fabs(p2[i] - probs[i]));
    TT_CHECK(worst < 1e-4, "predict_f32 differs from predict by %g", worst);
    free(fx), free(p2);
  }
  TT_CHECK(acc > 0.2 && loss > 0.0, "after 7 steps: accuracy %g loss %g", acc, loss);
  /* a second net loading the saved weights predicts the same probabilities, bit for bit, at the
   * same micro-batch (docs/api.md: another batch size may round otherwise; oneDNN's AVX2 kernels
   * do, by up to 2.2e-8, issue 40) */
  char w[160], err[1200];
  snprintf(w, sizeof w, "%s/api.safetensors", tt_test_dir());
  tt_run_opts o;
  char recipe[128];
  snprintf(recipe, sizeof recipe, "%s/api.recipe", tt_test_dir());
  cpu_opts(&o, recipe);
  o.micro_batch = 8; /* the first net's */
  tt_net *b = NULL;
  if (tt_net_open(&b, &o, err, sizeof err) == 0) {
    float *p2 = (float *)malloc(sizeof(float) * n * C);
    TT_CHECK(tt_net_load(b, w) == 0 && tt_net_predict(b, ds.images, n, p2) == 0, "load + predict: %s", tt_net_error(b));
    TT_CHECK(memcmp(p2, probs, sizeof(float) * n * C) == 0, "a net loading the saved weights predicts otherwise");
    free(p2);
    tt_net_close(b);
  } else {
    TT_CHECK(0, "open: %s", err);
  }
  /* an fp16 net and a bf16 one (TT_PRECISION_BF16): float input is converted to fp16 or bf16 the
   * way pixels are normalised into it; bf16 probabilities differ more: each input rounds to bf16
   * (8 bits) from a slightly different fp32 value */
  half_predict(&o, 2, "fp16", 2e-3, w, ds.images, n, C);
  half_predict(&o, TT_PRECISION_BF16, "bf16", 2e-2, w, ds.images, n, C);
  free(probs), free(kp), free(kc);
  tt_dataset_free(&ds);
  TT_TEST_END();
}

/* count 20 as micro-batches 8 + 8 + 4 (padded) against 5 x 4 */
static void test_partial_batch(void) {
  TT_TEST_BEGIN("api_partial_batch");
  char err[1200], wa[160], wb[160], why[512];
  tt_net *a = NULL, *b = NULL;
  tt_run_opts o;
  cpu_opts(&o, "plain");
  o.recipe_text = plain_recipe;
  o.micro_batch = 8;
  int rc = tt_net_open(&a, &o, err, sizeof err);
  o.micro_batch = 4;
  if (rc == 0) rc = tt_net_open(&b, &o, err, sizeof err);
  TT_CHECK(rc == 0, "open from text: %s", err);
  if (rc) {
    tt_net_close(a);
    return;
  }
  int n = 20;
  uint8_t img[20 * 64];
  int32_t lab[20];
  tt_test_rng r = {11};
  for (int i = 0; i < n * 64; i++) img[i] = (uint8_t)tt_test_rng_int(&r, 0, 255);
  for (int i = 0; i < n; i++) lab[i] = i % 4;
  tt_step_stats sa, sb;
  for (int step = 0; step < 3; step++) { /* three steps: a stale gradient past the batch would show */
    TT_CHECK(tt_net_train_step(a, img, lab, n, &sa) == 0, "8+8+4: %s", tt_net_error(a));
    TT_CHECK(tt_net_train_step(b, img, lab, n, &sb) == 0, "5x4: %s", tt_net_error(b));
  }
  TT_CHECK(fabs(sa.loss - sb.loss) < 1e-5 && sa.accuracy == sb.accuracy, "loss %g / %g, accuracy %g / %g", sa.loss,
           sb.loss, sa.accuracy, sb.accuracy);
  snprintf(wa, sizeof wa, "%s/a.safetensors", tt_test_dir());
  snprintf(wb, sizeof wb, "%s/b.safetensors", tt_test_dir());
  TT_CHECK(tt_net_save(a, wa) == 0 && tt_net_save(b, wb) == 0, "save failed");
  TT_CHECK(same_weights(wa, wb, 1e-5, why, sizeof why) == 0, "a padded micro-batch trains otherwise: %s", why);
  /* saving onto something that is not a regular file (a pipe here; /dev/null alike) is refused,
   * and leaves it as it was: the atomic write's rename would replace it */
  {
    char fifo[160];
    struct stat st;
    snprintf(fifo, sizeof fifo, "%s/pipe", tt_test_dir());
    if (mkfifo(fifo, 0644) == 0) {
      TT_CHECK(tt_net_save(b, fifo) != 0 && strstr(tt_net_error(b), "not a regular file"), "save onto a pipe: '%s'",
               tt_net_error(b));
      TT_CHECK(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the pipe was replaced by the save");
    }
  }
  /* misuse */
  TT_CHECK(tt_net_train_step(b, img, lab, 33, &sb) != 0 && strstr(tt_net_error(b), "1 to 32"),
           "33 samples for a batch of 32: '%s'", tt_net_error(b));
  lab[3] = 4;
  TT_CHECK(tt_net_train_step(b, img, lab, n, &sb) != 0 && strstr(tt_net_error(b), "sample 3"),
           "label 4 of 4 classes: '%s'", tt_net_error(b));
  tt_net_close(a);
  tt_net_close(b);
  o.recipe_text = "[net]\ninput = 1x8x8\nclasses = 4\n[conv c]\nfilters = x\n";
  TT_CHECK(tt_net_open(&a, &o, err, sizeof err) != 0 && a == NULL && strstr(err, "plain:"),
           "a bad recipe text: '%s'", err);
  TT_TEST_END();
}

/* tinytrain.h's version and the options' defaults. */
static void test_surface(void) {
  TT_TEST_BEGIN("api_version_and_defaults");
  char nums[64];
  snprintf(nums, sizeof nums, "%d.%d.%d", TT_VERSION_MAJOR, TT_VERSION_MINOR, TT_VERSION_PATCH);
  TT_CHECK(!strcmp(tt_version(), TT_VERSION) && !strcmp(nums, TT_VERSION), "tt_version() '%s', TT_VERSION '%s', numbers %s",
           tt_version(), TT_VERSION, nums);
  tt_run_opts a = tt_run_opts_default(), b;
  memset(&b, 0x5a, sizeof b);
  tt_run_opts_init(&b);
  TT_CHECK(a.progress == -1 && a.device == TT_DEVICE_AUTO && a.precision == TT_PRECISION_AUTO &&
               a.recompute == TT_RECOMPUTE_AUTO && !a.recipe && !a.recipe_text && !a.vram_bytes && !a.epochs &&
               !a.max_steps && !a.out && !a.on_progress && !a.quiet && !a.ranks,
           "tt_run_opts_default: progress %d, device %d, precision %d, recompute %d, vram %zu", a.progress, (int)a.device,
           (int)a.precision, (int)a.recompute, a.vram_bytes);
  TT_CHECK(b.progress == a.progress && b.device == a.device && !b.recipe && !b.out_dir && !b.checkpoint_every &&
               !b.vram_bytes && !b.out && !b.threads,
           "tt_run_opts_init differs from tt_run_opts_default");
  TT_TEST_END();
}

/* issue 21 item 9: every public call refuses misuse with -1 and a message instead of crashing
 * or poisoning the weights */
static void test_refuses_misuse(void) {
  TT_TEST_BEGIN("api_refuses_misuse");
  char err[1200];
  tt_net *net = (tt_net *)1;
  tt_run_opts o;
  cpu_opts(&o, "plain");
  o.recipe_text = plain_recipe;
  o.micro_batch = 4;
  /* NULL handles, options, outputs */
  TT_CHECK(tt_net_open(NULL, &o, err, sizeof err) != 0 && strstr(err, "out is NULL"), "open(NULL out): '%s'", err);
  TT_CHECK(tt_net_open(&net, NULL, err, sizeof err) != 0 && net == (tt_net *)1, "open(NULL options): '%s'", err);
  TT_CHECK(tt_net_open(&net, NULL, NULL, 0) != 0, "open(NULL options, NULL err)");
  o.precision = 7;
  TT_CHECK(tt_net_open(&net, &o, err, sizeof err) != 0 && strstr(err, "precision 7"), "precision 7: '%s'", err);
  o.precision = 0;
  uint8_t img[8 * 64];
  float imf[8 * 64];
  int32_t lab[8], cls[8];
  float probs[8 * 4];
  double loss, acc;
  tt_step_stats st;
  tt_net_info info;
  for (int i = 0; i < 8 * 64; i++) img[i] = (uint8_t)(i * 7), imf[i] = (float)(i % 64) / 64.0f;
  for (int i = 0; i < 8; i++) lab[i] = i % 4;
  TT_CHECK(tt_net_train_step(NULL, img, lab, 8, &st) == -1, "train_step(NULL net)");
  TT_CHECK(tt_net_predict(NULL, img, 1, probs) == -1 && tt_net_topk(NULL, img, 1, 1, cls, NULL) == -1 &&
               tt_net_evaluate(NULL, img, lab, 1, &loss, &acc) == -1 && tt_net_set_lr(NULL, 0.1) == -1 &&
               tt_net_save(NULL, "x") == -1 && tt_net_load(NULL, "x") == -1 &&
               tt_net_load_matching(NULL, "x", NULL, 0) == -1 && tt_net_predict_f32(NULL, imf, 1, probs) == -1 &&
               tt_net_train_step_f32(NULL, imf, lab, 1, &st) == -1,
           "a call on a NULL net did not return -1");
  TT_CHECK(tt_net_error(NULL) && strstr(tt_net_error(NULL), "NULL"), "tt_net_error(NULL): '%s'", tt_net_error(NULL));
  TT_CHECK(isnan(tt_net_lr_at(NULL, 0.5)), "lr_at(NULL) is not NaN");
  tt_net_info_get(NULL, &info);
  TT_CHECK(info.classes == 0 && info.batch == 0, "info_get(NULL) left values");
  tt_net_close(NULL);
  /* the library-level calls */
  TT_CHECK(tt_train(NULL, NULL, err, sizeof err) == -1 && strstr(err, "NULL"), "tt_train(NULL): '%s'", err);
  TT_CHECK(tt_plan(NULL, 0, 0, NULL, err, sizeof err) == -1 && strstr(err, "NULL"), "tt_plan(NULL): '%s'", err);
  TT_CHECK(tt_evaluate(NULL, "w", NULL, err, sizeof err) == -1 && tt_evaluate(&o, NULL, NULL, err, sizeof err) == -1,
           "tt_evaluate(NULL): '%s'", err);
  const char *in1[] = {NULL};
  TT_CHECK(tt_predict(&o, "w", NULL, 1, 1, 0, err, sizeof err) == -1 &&
               tt_predict(&o, "w", in1, 1, 1, 0, err, sizeof err) == -1 && strstr(err, "NULL") &&
               tt_predict(&o, NULL, in1, 1, 1, 0, NULL, 0) == -1,
           "tt_predict with NULLs: '%s'", err);
  size_t b;
  long long stp;
  double sec;
  TT_CHECK(tt_parse_size(NULL, &b) == -1 && tt_parse_size("4G", NULL) == -1, "tt_parse_size(NULL)");
  TT_CHECK(tt_parse_interval("10m", NULL, &sec) == -1 && tt_parse_interval("10m", &stp, NULL) == -1,
           "tt_parse_interval(NULL outputs)");
  tt_run_opts_init(NULL);
  /* tt_pack: a width of 100,000 is refused before anything is read or written */
  char pre[160];
  snprintf(pre, sizeof pre, "%s/huge", tt_test_dir());
  TT_CHECK(tt_pack(tt_test_dir(), pre, 3, 224, 100000, 0, NULL, err, sizeof err) == -1 && strstr(err, "16384"),
           "pack w = 100000: '%s'", err);
  TT_CHECK(tt_pack(tt_test_dir(), pre, 5, 0, 0, 0, NULL, err, sizeof err) == -1 && tt_pack(NULL, pre, 0, 0, 0, 0, NULL, NULL, 0) == -1,
           "pack c = 5 or a NULL source accepted");
  /* an open net: bad arguments leave it as it was */
  int rc = tt_net_open(&net, &o, err, sizeof err);
  TT_CHECK(rc == 0, "open: %s", err);
  if (rc) return;
  char w0[160], w1[160], why[512];
  snprintf(w0, sizeof w0, "%s/misuse0.safetensors", tt_test_dir());
  snprintf(w1, sizeof w1, "%s/misuse1.safetensors", tt_test_dir());
  TT_CHECK(tt_net_save(net, w0) == 0, "save: %s", tt_net_error(net));
  imf[5] = NAN;
  TT_CHECK(tt_net_train_step_f32(net, imf, lab, 8, &st) == -1 && strstr(tt_net_error(net), "finite"),
           "a NaN image trained: '%s'", tt_net_error(net));
  imf[5] = INFINITY;
  TT_CHECK(tt_net_predict_f32(net, imf, 8, probs) == -1 && strstr(tt_net_error(net), "finite"),
           "an infinite image predicted: '%s'", tt_net_error(net));
  imf[5] = 0.5f;
  double bad_lr[] = {1e300, NAN, -0.1, INFINITY, 1001.0};
  for (size_t i = 0; i < sizeof bad_lr / sizeof bad_lr[0]; i++)
    TT_CHECK(tt_net_set_lr(net, bad_lr[i]) == -1 && strstr(tt_net_error(net), "learning rate"), "set_lr(%g) accepted",
             bad_lr[i]);
  tt_net_info_get(net, &info);
  TT_CHECK(fabs(info.lr - 0.1) < 1e-6, "a refused lr changed the lr to %g", info.lr);
  TT_CHECK(tt_net_topk(net, img, 1, 0, cls, NULL) == -1 && tt_net_topk(net, img, 1, 5, cls, NULL) == -1, "topk k out of range");
  TT_CHECK(tt_net_predict(net, img, -1, probs) == -1 && tt_net_train_step(net, img, lab, 0, &st) == -1, "count out of range");
  lab[2] = -1;
  TT_CHECK(tt_net_evaluate(net, img, lab, 8, &loss, &acc) == -1 && strstr(tt_net_error(net), "sample 2"),
           "label -1: '%s'", tt_net_error(net));
  lab[2] = 2;
  TT_CHECK(tt_net_save(net, NULL) == -1 && tt_net_load(net, NULL) == -1 && tt_net_predict(net, img, 1, NULL) == -1,
           "NULL path or probs accepted");
  TT_CHECK(tt_net_save(net, w1) == 0 && same_weights(w0, w1, 0.0, why, sizeof why) == 0,
           "refused calls changed the weights: %s", why);
  TT_CHECK(tt_net_train_step_f32(net, imf, lab, 8, &st) == 0 && isfinite(st.loss), "a good step after: %s",
           tt_net_error(net));
  { /* issue 40: finite inputs of 1e38 make the net diverge: a step says so (non-zero) within a few
     * steps instead of returning 0 with NaN weights, and a failed step updates nothing */
    int rc1 = 0, k;
    for (int i = 0; i < 8 * 64; i++) imf[i] = 1e38f;
    for (k = 0; k < 4 && !rc1; k++) rc1 = tt_net_train_step_f32(net, imf, lab, 8, &st);
    TT_CHECK(rc1 == -1 && (strstr(tt_net_error(net), "diverged")), "4 steps on inputs of 1e38 all returned 0, or: '%s'",
             tt_net_error(net));
    TT_CHECK(tt_net_save(net, w0) == 0 && tt_net_train_step_f32(net, imf, lab, 8, &st) == -1 && tt_net_save(net, w1) == 0 &&
                 same_weights(w0, w1, 0.0, why, sizeof why) == 0,
             "a failed step changed the weights: %s", why);
  }
  /* a closed handle: refused, and a second close is a no-op */
  tt_net_close(net);
  tt_net_close(net);
  TT_CHECK(tt_net_train_step(net, img, lab, 8, &st) == -1 && strstr(tt_net_error(net), "closed"),
           "a closed net: '%s'", tt_net_error(net));
  TT_TEST_END();
}

/* the run through the API, then predictions from the net it kept */
static void test_api_run_and_predict(void) {
  tt_net *net = NULL;
  test_api_equals_cli(&net);
  if (net) test_predict(net);
  tt_net_close(net);
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("surface", "runtime api", test_surface),
  TT_TEST("api_equals_cli", "runtime api predict", test_api_run_and_predict),
  TT_TEST("partial_batch", "runtime api", test_partial_batch),
  TT_TEST("refuses_misuse", "runtime api", test_refuses_misuse),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
