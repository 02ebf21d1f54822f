/* tests/runtime/test_train.c — the train stage end to end on CPU (synthetic data, a few seconds):
 *   - a run stopped mid-epoch and resumed ends bit-identical to an uninterrupted run
 *     (weights, batch-norm statistics and optimizer state), with gradient accumulation,
 *     dropout, batch norm and nesterov momentum in play;
 *   - the learning-rate schedules (tt_lr_at) and that the schedule spans --epochs;
 *   - metrics.jsonl is one JSON object per line with the documented fields;
 *   - a truncated state file and a checkpoint of another recipe are refused with messages
 *     naming the file / the tensor and both shapes, and a good checkpoint still resumes;
 *   - tt_parse_size. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/data/data.h"
#include "core/app/metrics.h"
#include "core/compile/model.h"
#include "core/compile/recipe.h"
#include "core/base/safetensors.h"
#include "core/tinytrain.h"
#include "core/app/cli.h"
#include "core/app/train.h"
#include "tests/tt_test.h"

static int write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(text, f);
  return fclose(f);
}

/* The synthetic set has 1024 training images: batch 32 = 16 x 2 accumulation gives 32 optimizer
 * steps per epoch. Batch norm, dropout (the mask depends on the step), nesterov momentum with
 * weight decay, and a warm-up + cosine schedule: everything a resume must restore. */
static const char *recipe_fmt =
    "[net]\n"
    "input = 1x16x16\n"
    "classes = 10\n"
    "[train]\n"
    "batch = 32\n"
    "micro_batch = 16\n"
    "epochs = %d\n"
    "optimizer = sgd\n"
    "lr = 0.05\n"
    "momentum = 0.9\n"
    "nesterov = true\n"
    "weight_decay = 5e-4\n"
    "schedule = cosine\n"
    "warmup_epochs = 0.5\n"
    "seed = 7\n"
    "log_every = 5\n"
    "[data]\n"
    "format = synthetic\n"
    "mean = 0.5\n"
    "std = 0.25\n"
    "[conv conv1]\n"
    "filters = 8\n"
    "size = 3\n"
    "bias = false\n"
    "[bn bn1]\n"
    "activation = relu\n"
    "[maxpool pool1]\n"
    "size = 2\n"
    "[conv conv2]\n"
    "filters = %d\n"
    "size = 3\n"
    "[bn bn2]\n"
    "activation = relu\n"
    "[maxpool pool2]\n"
    "size = 2\n"
    "[flatten]\n"
    "[linear fc1]\n"
    "out = 32\n"
    "activation = relu\n"
    "[dropout]\n"
    "p = 0.3\n"
    "[linear fc2]\n"
    "out = 10\n";

static int write_recipe(const char *path, int epochs, int conv2_filters) {
  char text[4096];
  snprintf(text, sizeof text, recipe_fmt, epochs, conv2_filters);
  return write_file(path, text);
}

/* The same recipe under fp16 autocast: the loss scaler and its one-step-late overflow outcome
 * (core/runtime/lossscale.h) are part of what a resume must restore. */
static int write_recipe_prec(const char *path, int epochs, const char *prec) {
  char text[4096], out[4200];
  snprintf(text, sizeof text, recipe_fmt, epochs, 16);
  const char *at = strstr(text, "seed = 7\n");
  if (!at) return -1;
  at += strlen("seed = 7\n");
  snprintf(out, sizeof out, "%.*sprecision = %s\n%s", (int)(at - text), text, prec, at);
  return write_file(path, out);
}
static int write_recipe_fp16(const char *path, int epochs) { return write_recipe_prec(path, epochs, "fp16"); }

/* The recipe above with line `from` replaced by `to`, twice (from2 may be NULL). */
static int write_recipe_edit(const char *path, int epochs, const char *from, const char *to, const char *from2,
                             const char *to2) {
  char text[4096], out[4096];
  snprintf(text, sizeof text, recipe_fmt, epochs, 16);
  for (int pass = 0; pass < 2; pass++) {
    const char *f = pass ? from2 : from, *t = pass ? to2 : to;
    char *at = f ? strstr(text, f) : NULL;
    if (!f) continue;
    if (!at) return -1;
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, t, at + strlen(f));
    snprintf(text, sizeof text, "%s", out);
  }
  return write_file(path, text);
}

/* No batch norm, no dropout, fp32: k micro-batches of m train like one of k*m but for the
 * order of fp32 sums, so runs under different micro-batches can be compared. */
static const char *recipe_plain_text =
    "[net]\ninput = 1x16x16\nclasses = 10\n"
    "[train]\nbatch = 32\nepochs = 2\nlr = 0.05\nmomentum = 0.9\nseed = 7\nlog_every = 5\nprecision = fp32\n"
    "[data]\nformat = synthetic\nmean = 0.5\nstd = 0.25\n"
    "[conv conv1]\nfilters = 8\nsize = 3\nactivation = relu\n[maxpool]\nsize = 2\n"
    "[conv conv2]\nfilters = 8\nsize = 3\nactivation = relu\n[flatten]\n[linear fc]\nout = 10\n";

static int train_micro_batch;        /* o.micro_batch of the next train() calls; 0: the recipe's */
static tt_run_precision train_precision; /* o.precision of the next train() calls; AUTO: the recipe's */
static const char *train_ckpt_every; /* o.checkpoint_every of the next train() calls; NULL: the recipe's */

static int train(const char *recipe, const char *out, const char *resume, long long max_steps, int epochs,
                 tt_run_result *res, char *err, size_t errsize) {
  tt_run_opts o = tt_run_opts_default();
  o.recipe = recipe;
  o.micro_batch = train_micro_batch;
  o.precision = train_precision;
  o.checkpoint_every = train_ckpt_every;
  o.device = TT_DEVICE_CPU;
  o.threads = 2;
  o.quiet = 1;
  o.progress = 0;
  o.out_dir = out;
  o.resume_dir = resume;
  o.max_steps = max_steps;
  o.epochs = epochs;
  err[0] = 0;
  return tt_train(&o, res, err, errsize);
}

/* Compares every tensor of file a with the same-named tensor of b, byte for byte, that both
 * hold the same set of names, and (with_meta) that their metadata (step, epoch, seed...) is the same. Returns the number of tensors compared, or -1 with why set.
 * *opt_tensors counts names ending in ".opt_m" / ".opt_v". */
static int compare_st(const char *a, const char *b, int with_meta, int *opt_tensors, char *why, size_t whysize) {
  tt_err e;
  tt_st_file *fa = NULL, *fb = NULL;
  int n = -1;
  *opt_tensors = 0;
  if (tt_st_open(a, &fa, &e)) {
    snprintf(why, whysize, "%s", e.msg);
    goto out;
  }
  if (tt_st_open(b, &fb, &e)) {
    snprintf(why, whysize, "%s", e.msg);
    goto out;
  }
  if (tt_st_count(fa) != tt_st_count(fb)) {
    snprintf(why, whysize, "%s has %d tensors, %s has %d", a, tt_st_count(fa), b, tt_st_count(fb));
    goto out;
  }
  for (int i = 0; i < tt_st_count(fa); i++) {
    const tt_st_tensor *ta = tt_st_at(fa, i), *tb = tt_st_get(fb, ta->name);
    if (!tb) {
      snprintf(why, whysize, "tensor '%s' is missing from %s", ta->name, b);
      goto out;
    }
    int same = !strcmp(ta->dtype, tb->dtype) && ta->ndim == tb->ndim && ta->bytes == tb->bytes;
    for (int d = 0; same && d < ta->ndim; d++) same = ta->shape[d] == tb->shape[d];
    if (!same) {
      snprintf(why, whysize, "tensor '%s' has a different dtype or shape", ta->name);
      goto out;
    }
    if (memcmp(ta->data, tb->data, ta->bytes)) {
      size_t k = 0, cnt = ta->bytes / 4;
      float va = 0, vb = 0;
      for (k = 0; k < cnt; k++) {
        memcpy(&va, (const char *)ta->data + 4 * k, 4);
        memcpy(&vb, (const char *)tb->data + 4 * k, 4);
        if (memcmp(&va, &vb, 4)) break;
      }
      snprintf(why, whysize, "tensor '%s' differs: element %zu is %.9g vs %.9g", ta->name, k, (double)va, (double)vb);
      goto out;
    }
    size_t L = strlen(ta->name);
    if (L > 6 && (!strcmp(ta->name + L - 6, ".opt_m") || !strcmp(ta->name + L - 6, ".opt_v"))) (*opt_tensors)++;
  }
  for (int i = 0; with_meta && i < tt_st_meta_count(fa); i++) {
    const char *key, *va, *vb;
    tt_st_meta_at(fa, i, &key, &va);
    vb = tt_st_meta(fb, key);
    if (!vb || strcmp(va, vb)) {
      snprintf(why, whysize, "metadata '%s' is '%s' in %s but '%s' in %s", key, va, a, vb ? vb : "(absent)", b);
      goto out;
    }
  }
  if (with_meta && tt_st_meta_count(fa) != tt_st_meta_count(fb)) {
    snprintf(why, whysize, "%s and %s hold different numbers of metadata keys", a, b);
    goto out;
  }
  n = tt_st_count(fa);
out:
  if (fa) tt_st_close(fa);
  if (fb) tt_st_close(fb);
  return n;
}

static const char *meta_of(const char *file, const char *key, char *buf, size_t size) {
  tt_err e;
  tt_st_file *f = NULL;
  buf[0] = 0;
  if (tt_st_open(file, &f, &e)) return buf;
  const char *v = tt_st_meta(f, key);
  snprintf(buf, size, "%s", v ? v : "");
  tt_st_close(f);
  return buf;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int have_python3(void) { return system("python3 -c 'import json' >/dev/null 2>&1") == 0; }

/* metrics.jsonl: every line a JSON object with "event"; eval lines with epoch, step, loss and
 * accuracy in [0, 1]; train lines with lr; eval epochs expected_evals = 1..N, the steps of train
 * lines strictly increasing. Run by python3 (json.loads). */
static const char *metrics_checker =
    "import json, math, sys\n"
    "path, nevals, steps_per_epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
    "evals, last_train = [], 0\n"
    "for no, line in enumerate(open(path), 1):\n"
    "    where = '%s:%d' % (path, no)\n"
    "    try:\n"
    "        d = json.loads(line)\n"
    "    except ValueError as e:\n"
    "        sys.exit('%s: not JSON (%s): %r' % (where, e, line))\n"
    "    if not isinstance(d, dict) or 'event' not in d:\n"
    "        sys.exit('%s: not an object with \"event\": %r' % (where, line))\n"
    "    for k in ('loss', 'accuracy', 'lr'):\n"
    "        if k in d and not (isinstance(d[k], (int, float)) and math.isfinite(d[k])):\n"
    "            sys.exit('%s: %s is %r' % (where, k, d.get(k)))\n"
    "    if 'accuracy' in d and not 0.0 <= d['accuracy'] <= 1.0:\n"
    "        sys.exit('%s: accuracy %r outside [0, 1]' % (where, d['accuracy']))\n"
    "    if d['event'] == 'eval':\n"
    "        for k in ('epoch', 'step', 'loss', 'accuracy'):\n"
    "            if k not in d:\n"
    "                sys.exit('%s: eval line without %r' % (where, k))\n"
    "        evals.append((d['epoch'], d['step']))\n"
    "    elif d['event'] == 'train':\n"
    "        for k in ('epoch', 'step', 'loss', 'lr'):\n"
    "            if k not in d:\n"
    "                sys.exit('%s: train line without %r' % (where, k))\n"
    "        if d['step'] <= last_train:\n"
    "            sys.exit('%s: train step %d after %d' % (where, d['step'], last_train))\n"
    "        if not d['lr'] >= 0:\n"
    "            sys.exit('%s: lr %r' % (where, d['lr']))\n"
    "        last_train = d['step']\n"
    "want = [(e, e * steps_per_epoch) for e in range(1, nevals + 1)]\n"
    "if evals != want:\n"
    "    sys.exit('%s: eval (epoch, step) pairs %r, expected %r' % (path, evals, want))\n";

static void check_metrics(const char *name, const char *metrics, int nevals, int steps_per_epoch) {
  char py[1024], cmd[4096];
  TT_TEST_BEGIN(name);
  if (!have_python3()) {
    TT_SKIP(name, "python3 not found");
    return;
  }
  tt_test_path_in(py, "check_metrics.py");
  TT_CHECK(write_file(py, metrics_checker) == 0, "cannot write %s", py);
  snprintf(cmd, sizeof cmd, "python3 '%s' '%s' %d %d 2>&1", py, metrics, nevals, steps_per_epoch);
  FILE *p = popen(cmd, "r");
  char out[2048] = "";
  size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
  out[got] = 0;
  int rc = p ? pclose(p) : -1;
  char *nl = strchr(out, '\n');
  if (nl) *nl = 0;
  TT_CHECK(rc == 0, "%s", out[0] ? out : "python3 failed");
  TT_TEST_END();
}

static int copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  char buf[65536];
  size_t n;
  int rc = a && b ? 0 : -1;
  while (!rc && (n = fread(buf, 1, sizeof buf, a)) > 0)
    if (fwrite(buf, 1, n, b) != n) rc = -1;
  if (a) fclose(a);
  if (b && fclose(b)) rc = -1;
  return rc;
}

static void test_lr_schedules(void) {
  tt_train_cfg c;
  const double lr = 0.1;
  TT_TEST_BEGIN("lr_schedules");
  /* constant */
  memset(&c, 0, sizeof c);
  c.lr = (float)lr, c.epochs = 10, c.schedule = TT_LR_CONSTANT;
  for (double e = 0; e < 12; e += 0.37) TT_CHECK(tt_lr_at(&c, e) == (double)c.lr, "constant: lr(%g) = %g", e, tt_lr_at(&c, e));
  /* step: x gamma every step_epochs */
  c.schedule = TT_LR_STEP, c.gamma = 0.1f, c.step_epochs = 30, c.epochs = 90;
  double L = c.lr, g = c.gamma;
  TT_CHECK(fabs(tt_lr_at(&c, 0) - L) < 1e-12, "step: lr(0) = %g", tt_lr_at(&c, 0));
  TT_CHECK(fabs(tt_lr_at(&c, 29.99) - L) < 1e-12, "step: lr(29.99) = %g", tt_lr_at(&c, 29.99));
  TT_CHECK(fabs(tt_lr_at(&c, 30) - L * g) < 1e-9, "step: lr(30) = %g, want %g", tt_lr_at(&c, 30), L * g);
  TT_CHECK(fabs(tt_lr_at(&c, 59.5) - L * g) < 1e-9, "step: lr(59.5) = %g", tt_lr_at(&c, 59.5));
  TT_CHECK(fabs(tt_lr_at(&c, 65) - L * g * g) < 1e-10, "step: lr(65) = %g, want %g", tt_lr_at(&c, 65), L * g * g);
  c.gamma = 0.5f, c.step_epochs = 2;
  TT_CHECK(fabs(tt_lr_at(&c, 5) - L * 0.25) < 1e-9, "step (gamma 0.5, every 2): lr(5) = %g", tt_lr_at(&c, 5));
  /* cosine from lr to min_lr over the run */
  c.schedule = TT_LR_COSINE, c.epochs = 10, c.min_lr = 0.001f;
  double M = c.min_lr;
  TT_CHECK(fabs(tt_lr_at(&c, 0) - L) < 1e-9, "cosine: lr(0) = %g, want %g", tt_lr_at(&c, 0), L);
  TT_CHECK(fabs(tt_lr_at(&c, 5) - 0.5 * (L + M)) < 1e-9, "cosine: lr(5) = %g, want %g", tt_lr_at(&c, 5), 0.5 * (L + M));
  TT_CHECK(fabs(tt_lr_at(&c, 2.5) - (M + (L - M) * 0.5 * (1 + cos(3.14159265358979323846 / 4)))) < 1e-9, "cosine: lr(2.5) = %g",
           tt_lr_at(&c, 2.5));
  TT_CHECK(fabs(tt_lr_at(&c, 10) - M) < 1e-9, "cosine: lr(10) = %g, want min_lr %g", tt_lr_at(&c, 10), M);
  TT_CHECK(fabs(tt_lr_at(&c, 12) - M) < 1e-9, "cosine: lr(12) = %g, past the end want min_lr", tt_lr_at(&c, 12));
  for (double e = 0.1; e <= 10; e += 0.1)
    TT_CHECK(tt_lr_at(&c, e) <= tt_lr_at(&c, e - 0.1) + 1e-15, "cosine: not decreasing at %g", e);
  /* linear warm-up from lr/100 to lr, continuous at the boundary, with each schedule */
  for (int s = 0; s < 3; s++) {
    memset(&c, 0, sizeof c);
    c.lr = (float)lr, c.epochs = 10, c.schedule = (tt_lr_schedule)s, c.warmup_epochs = 2.0f, c.gamma = 0.1f;
    c.step_epochs = 30, c.min_lr = 0.0f;
    L = c.lr;
    TT_CHECK(fabs(tt_lr_at(&c, 0) - L / 100) < 1e-12, "warm-up (schedule %d): lr(0) = %g, want lr/100 = %g", s,
             tt_lr_at(&c, 0), L / 100);
    TT_CHECK(fabs(tt_lr_at(&c, 1) - L * (0.01 + 0.99 * 0.5)) < 1e-12, "warm-up (schedule %d): lr(1) = %g", s,
             tt_lr_at(&c, 1));
    TT_CHECK(tt_lr_at(&c, 0.5) < tt_lr_at(&c, 1.0) && tt_lr_at(&c, 1.0) < tt_lr_at(&c, 1.5),
             "warm-up (schedule %d): not increasing", s);
    TT_CHECK(fabs(tt_lr_at(&c, 2) - L) < 1e-9, "warm-up (schedule %d): lr at warmup_epochs = %g, want lr %g", s,
             tt_lr_at(&c, 2), L);
    double before = tt_lr_at(&c, 2 - 1e-9), after = tt_lr_at(&c, 2 + 1e-9);
    TT_CHECK(fabs(before - after) < 1e-6 * L, "warm-up (schedule %d): jump at the boundary %g -> %g", s, before, after);
  }
  TT_TEST_END();
}

static void test_parse_size(void) {
  struct {
    const char *s;
    size_t want;
  } good[] = {{"512M", 512ull << 20}, {"4G", 4ull << 30}, {"4GiB", 4ull << 30}, {"3.5G", 3584ull << 20},
              {"1024", 1024},        {"2T", 2ull << 40}, {"64K", 65536},       {"1.5GB", 1536ull << 20}};
  const char *bad[] = {"", "4X", "-1G", "G", "4GX", "M4", "0", "nan", "inf", "1e30G", "4 G",
                       /* issue 21 item 16: hex, spaces, exponents, overflow, a bare dot */
                       "0x10G", " 4G", "4G ", "1.8e19", "1e3", "18446744073709551616", "16777216T", "4.", ".5G", "+4G",
                       "4Gi"};
  TT_TEST_BEGIN("parse_size");
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    size_t b = 12345;
    int rc = tt_parse_size(good[i].s, &b);
    TT_CHECK(rc == 0 && b == good[i].want, "'%s': rc %d, %zu bytes, want %zu", good[i].s, rc, b, good[i].want);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t b = 0;
    TT_CHECK(tt_parse_size(bad[i], &b) != 0, "'%s' accepted as %zu bytes", bad[i], b);
  }
  TT_TEST_END();
}

/* ---- helpers for the checkpoint, signal and metrics tests ---- */

/* Copies the safetensors file src to dst with metadata `key` set to value (value NULL: the key
 * removed; key NULL: the metadata as it is) and, when nan_tensor names a tensor, its first
 * value made NaN. */
static int rewrite_st(const char *src, const char *dst, const char *key, const char *value, const char *nan_tensor,
                      char *why, size_t whysize) {
  tt_err e;
  tt_st_file *f = NULL;
  if (tt_st_open(src, &f, &e)) {
    snprintf(why, whysize, "%s", e.msg);
    return -1;
  }
  int n = tt_st_count(f), nm = tt_st_meta_count(f), k = 0, found = 0;
  tt_st_tensor *t = (tt_st_tensor *)calloc((size_t)n + 1, sizeof *t);
  const char **kv = (const char **)calloc(2 * (size_t)nm + 3, sizeof *kv);
  float *patched = NULL;
  for (int i = 0; i < nm; i++) {
    const char *mk, *mv;
    tt_st_meta_at(f, i, &mk, &mv);
    if (key && !strcmp(mk, key)) {
      found = 1;
      if (!value) continue;
      mv = value;
    }
    kv[k++] = mk, kv[k++] = mv;
  }
  if (key && value && !found) kv[k++] = key, kv[k++] = value;
  kv[k] = NULL;
  for (int i = 0; i < n; i++) {
    t[i] = *tt_st_at(f, i);
    if (nan_tensor && !strcmp(t[i].name, nan_tensor)) {
      patched = (float *)malloc(t[i].bytes);
      memcpy(patched, t[i].data, t[i].bytes);
      patched[0] = NAN;
      t[i].data = patched;
    }
  }
  int rc = tt_st_write(dst, t, n, kv, &e);
  if (rc) snprintf(why, whysize, "%s", e.msg);
  free(patched);
  free(kv);
  free(t);
  tt_st_close(f);
  return rc;
}

/* The whole file in a malloc'ed string (NULL if it cannot be read). */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *p = (char *)malloc((size_t)n + 1);
  size_t got = p ? fread(p, 1, (size_t)n, f) : 0;
  fclose(f);
  if (p) p[got] = 0;
  return p;
}

static int count_substr(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; p && (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

/* The largest "step" of the train lines of a metrics.jsonl so far (0 when none). */
static long long metrics_max_step(const char *path) {
  char *text = slurp(path);
  long long best = 0;
  for (const char *p = text; p && (p = strstr(p, "\"event\": \"train\"")) != NULL; p++) {
    const char *q = strstr(p, "\"step\": ");
    if (q && atoll(q + 8) > best) best = atoll(q + 8);
  }
  free(text);
  return best;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Waits until the child's metrics.jsonl shows step >= want; 0, or -1 when the child ended first
 * or 60 s passed. */
static int wait_for_step(pid_t pid, const char *metrics, long long want) {
  for (double t0 = now_s(); now_s() - t0 < 60;) {
    if (metrics_max_step(metrics) >= want) return 0;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return -1;
    sleep_ms(2);
  }
  return -1;
}

/* Waits up to 60 s for the child; on a timeout kills it and returns -1. */
static int wait_child(pid_t pid, int *status) {
  for (double t0 = now_s(); now_s() - t0 < 60; sleep_ms(5))
    if (waitpid(pid, status, WNOHANG) == pid) return 0;
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return -1;
}

/* Trains in a child process (for signals: the parent must survive what the child gets). The
 * child exits as the command line would: 128 + the signal for TT_STOPPED. */
static pid_t train_child(const char *recipe, const char *out, int epochs) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid != 0) return pid;
  signal(SIGINT, SIG_DFL); /* however the test itself was started */
  signal(SIGTERM, SIG_DFL);
  tt_run_result r;
  char e[1500];
  int rc = train(recipe, out, NULL, 0, epochs, &r, e, sizeof e);
  _exit(rc == TT_STOPPED ? 128 + r.stop_signal : rc ? 1 : 0);
}

/* ---- signals in child processes ----
 * libgomp's thread pool does not survive a fork, so both children are started before this
 * process trains anything itself; what they left is checked afterwards. */

typedef struct child_run {
  char dir[1024];
  int started, ended, status; /* status from waitpid */
  long long logged;           /* the largest step metrics.jsonl showed when the signal was sent */
} child_run;

/* Trains recipe for `epochs` in a child; once its metrics.jsonl shows step `at`, sends sig. */
static void child_signal(child_run *c, const char *recipe, const char *name, int epochs, long long at, int sig) {
  char met[1100];
  memset(c, 0, sizeof *c);
  tt_test_path_in(c->dir, name);
  snprintf(met, sizeof met, "%s/metrics.jsonl", c->dir);
  pid_t pid = train_child(recipe, c->dir, epochs);
  if (pid <= 0) return;
  c->started = wait_for_step(pid, met, at) == 0;
  c->logged = metrics_max_step(met);
  kill(pid, sig);
  c->ended = wait_child(pid, &c->status) == 0;
}

/* A burst of stop signals at a run of the library whose caller routes no signals (issue 40: the
 * SIGINT test's child aborted with SIGABRT). oneDNN's AVX2 f32 GEMM runs with the stack pointer
 * inside a heap workspace, so a handler run on a thread inside a step wrote its signal frame over
 * the heap. tt_train itself now keeps the stop signals off its compute threads (train.c
 * train_signals_install). The net is one large linear layer (the GEMM), oneDNN is held to AVX2
 * in the child, and SIGPIPE keeps its handler, so every signal of the burst is handled while the
 * run finishes its step: each child must end with the stop's own status, 128 + SIGPIPE. */
#define BURST_RUNS 5
static pid_t burst_child(const char *recipe, const char *out) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid != 0) return pid;
  setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1); /* read once, at oneDNN's first use: this child's */
  signal(SIGPIPE, SIG_DFL);
  /* one thread, not train()'s two: with two, the run before the fix survived the burst (its
   * GEMM then runs another kernel); with one it aborted every time */
  tt_run_opts o = tt_run_opts_default();
  tt_run_result r;
  char e[1500];
  o.recipe = recipe, o.device = TT_DEVICE_CPU, o.threads = 1, o.quiet = 1, o.progress = 0;
  o.out_dir = out, o.max_steps = 5000;
  int rc = tt_train(&o, &r, e, sizeof e);
  _exit(rc == TT_STOPPED ? 128 + r.stop_signal : rc ? 1 : 0);
}

static void burst_runs(const char *recipe, int status[BURST_RUNS]) {
  char dir[1024], met[1100];
  for (int i = 0; i < BURST_RUNS; i++) {
    char name[32];
    snprintf(name, sizeof name, "burst%d", i);
    tt_test_path_in(dir, name);
    snprintf(met, sizeof met, "%s/metrics.jsonl", dir);
    status[i] = -1;
    pid_t pid = burst_child(recipe, dir);
    if (pid <= 0) continue;
    if (wait_for_step(pid, met, 1) == 0)
      for (int k = 0; k < 3000 && kill(pid, SIGPIPE) == 0; k++) {
      }
    if (wait_child(pid, &status[i])) status[i] = -2;
  }
}

static void test_signal_burst(const int status[BURST_RUNS]) {
  TT_TEST_BEGIN("signal_burst_library");
  for (int i = 0; i < BURST_RUNS; i++) {
    int st = status[i];
    TT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGPIPE,
             "run %d of %d: %s exit %d, signal %d; want exit %d (stopped by SIGPIPE)", i + 1, BURST_RUNS,
             st == -1 ? "not started;" : st == -2 ? "did not end within 60 s;" : "", st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1,
             st >= 0 && WIFSIGNALED(st) ? WTERMSIG(st) : 0, 128 + SIGPIPE);
  }
  TT_TEST_END();
}

/* SIGINT: a checkpoint at the next step boundary, exit status 130, and the checkpoint resumes
 * to the very state of a run that was never stopped. */
static void test_sigint(const child_run *c, const char *recipe) {
  char dC[1024], a[1100], b[1100], m[64], why[1024], err[1500];
  tt_run_result r;
  int st = c->status;
  tt_test_path_in(dC, "C");
  TT_TEST_BEGIN("sigint_checkpoint_resume");
  TT_CHECK(c->started, "the child showed no training step within 60 s");
  TT_CHECK(c->ended, "the child did not stop within 60 s of SIGINT");
  TT_CHECK(c->ended && WIFEXITED(st) && WEXITSTATUS(st) == 130, "the child ended with exit %d, signal %d; want exit 130",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  snprintf(b, sizeof b, "%s/state.safetensors", c->dir);
  long long S = atoll(meta_of(b, "step", m, sizeof m));
  TT_CHECK(S >= 5 && S < 200 * 32, "the checkpoint after SIGINT says step '%s'", m);
  TT_CHECK(atoll(meta_of(b, "images_in_epoch", m, sizeof m)) == (S % 32 ? S % 32 : 32) * 32,
           "images_in_epoch '%s' at step %lld", m, S);
  if (S < 5 || S >= 200 * 32) return;
  long long T = S + 40;
  int rc = train(recipe, c->dir, c->dir, T, 200, &r, err, sizeof err);
  TT_CHECK(rc == 0 && r.steps_done == T, "resuming after SIGINT: rc %d, %lld steps: %s", rc, r.steps_done, err);
  int rc2 = train(recipe, dC, NULL, T, 200, &r, err, sizeof err);
  TT_CHECK(rc2 == 0, "the uninterrupted run: %s", err);
  if (rc == 0 && rc2 == 0) {
    int nopt;
    snprintf(a, sizeof a, "%s/state.safetensors", c->dir), snprintf(b, sizeof b, "%s/state.safetensors", dC);
    TT_CHECK(compare_st(a, b, 1, &nopt, why, sizeof why) > 0, "interrupted by SIGINT vs uninterrupted: %s", why);
  }
  TT_TEST_END();
  snprintf(a, sizeof a, "%s/metrics.jsonl", c->dir);
  check_metrics("sigint_metrics_jsonl", a, (int)(T / 32), 32);
}

/* A signal on the last step of an epoch records the epoch's steps as done but not evaluated
 * (images_in_epoch = the epoch's size). Made here from the checkpoint at the end of epoch 1:
 * the resumed run evaluates epoch 1 (train_loss null: it trained none of its images), then
 * ends exactly where the uninterrupted run did. */
static void test_pending_evaluation(const char *recipe, const char *dA) {
  char d[1024], d2[1024], st[1100], st2[1100], a[1100], why[1024], err[1500];
  tt_run_result r;
  TT_TEST_BEGIN("resume_pending_evaluation");
  tt_test_path_in(d, "Pend"), tt_test_path_in(d2, "Pend2");
  int rc = train(recipe, d, NULL, 32, 0, &r, err, sizeof err);
  TT_CHECK(rc == 0, "one epoch: %s", err);
  mkdir(d2, 0755);
  snprintf(st, sizeof st, "%s/state.safetensors", d), snprintf(st2, sizeof st2, "%s/state.safetensors", d2);
  snprintf(a, sizeof a, "%s/pend.safetensors", tt_test_dir());
  rc = rc ? rc : rewrite_st(st, a, "epoch", "0", NULL, why, sizeof why) ||
                     rewrite_st(a, st2, "images_in_epoch", "1024", NULL, why, sizeof why);
  TT_CHECK(rc == 0, "cannot write the pending state: %s %s", why, err);
  rc = rc ? rc : train(recipe, d2, d2, 0, 0, &r, err, sizeof err);
  TT_CHECK(rc == 0 && r.steps_done == 64, "resumed with the evaluation of epoch 1 pending: rc %d, %lld steps: %s", rc,
           r.steps_done, err);
  snprintf(a, sizeof a, "%s/metrics.jsonl", d2);
  char *text = slurp(a);
  TT_CHECK(rc || (text && strstr(text, "{\"event\": \"eval\", \"epoch\": 1, \"step\": 32,") &&
                  strstr(text, "\"train_loss\": null")),
           "want the eval line of epoch 1 with train_loss null: %s", text ? text : "");
  free(text);
  int nopt;
  snprintf(a, sizeof a, "%s/state.safetensors", dA);
  TT_CHECK(rc || compare_st(a, st2, 1, &nopt, why, sizeof why) > 0, "vs the uninterrupted run: %s", why);
  TT_TEST_END();
}

/* kill -9 after step 25 of a recipe with checkpoint_every = 10 (128 steps per epoch): the last
 * periodic checkpoint resumes, and metrics.jsonl loses the lines written after it (no step
 * twice). */
static void test_kill9(const child_run *c, const char *recipe) {
  char a[1100], b[1100], m[64], err[1500];
  tt_run_result r;
  TT_TEST_BEGIN("kill9_checkpoint_every");
  TT_CHECK(c->started, "the child showed no step 25 within 60 s");
  snprintf(a, sizeof a, "%s/metrics.jsonl", c->dir);
  snprintf(b, sizeof b, "%s/state.safetensors", c->dir);
  long long S = atoll(meta_of(b, "step", m, sizeof m));
  TT_CHECK(S >= 10 && S % 10 == 0, "after kill -9 at step %lld (128 steps per epoch, checkpoint_every = 10) the "
           "state says step '%s'; want a checkpoint every 10 steps", c->logged, m);
  if (S < 10) return;
  TT_CHECK(atoi(meta_of(b, "epoch", m, sizeof m)) == S / 128, "epoch '%s' at step %lld", m, S);
  long long T = S + 30;
  int rc = train(recipe, c->dir, c->dir, T, 50, &r, err, sizeof err);
  TT_CHECK(rc == 0 && r.steps_done == T, "resuming after kill -9: rc %d, %lld steps: %s", rc, r.steps_done, err);
  char *text = slurp(a);
  char want[128];
  snprintf(want, sizeof want, "{\"event\": \"resume\", \"epoch\": %lld, \"step\": %lld}", S / 128 + 1, S);
  TT_CHECK(text && count_substr(text, want) == 1, "metrics.jsonl has no line %s", want);
  free(text);
  TT_TEST_END();
  check_metrics("kill9_metrics_no_repeats", a, (int)(T / 128), 128);
}

/* ---- a checkpoint under one micro-batch resumed under another: the position is in images ---- */

/* Largest |a - b| over every tensor of two files, relative to the largest |a|; -1 on error. */
static double max_rel_diff(const char *a, const char *b, char *why, size_t whysize) { /* why: 1024 bytes */
  tt_err e;
  tt_st_file *fa = NULL, *fb = NULL;
  double d = 0, big = 1e-12;
  if (tt_st_open(a, &fa, &e) || tt_st_open(b, &fb, &e)) {
    snprintf(why, whysize, "%s", e.msg);
    if (fa) tt_st_close(fa);
    return -1;
  }
  for (int i = 0; i < tt_st_count(fa); i++) {
    const tt_st_tensor *ta = tt_st_at(fa, i), *tb = tt_st_get(fb, ta->name);
    if (!tb || tb->bytes != ta->bytes) {
      snprintf(why, whysize, "tensor %s missing or of another size in %.900s", ta->name, b);
      d = -1;
      break;
    }
    for (size_t k = 0; k < ta->bytes / 4; k++) {
      float x, y;
      memcpy(&x, (const char *)ta->data + 4 * k, 4), memcpy(&y, (const char *)tb->data + 4 * k, 4);
      if (fabs((double)x) > big) big = fabs((double)x);
      if (fabs((double)x - y) > d || x != x || y != y) d = (x != x || y != y) ? 1e30 : fabs((double)x - y);
    }
  }
  tt_st_close(fa), tt_st_close(fb);
  return d < 0 ? -1 : d / big;
}

static void test_policy_change(const char *recipe_plain) {
  char dC[1024], d1[1024], d2[1024], a[1100], b[1100], why[1024], err[1500];
  tt_run_result r;
  tt_test_path_in(dC, "P_cont"), tt_test_path_in(d1, "P_16_32"), tt_test_path_in(d2, "P_32_8");
  TT_TEST_BEGIN("resume_policy_change");
  train_micro_batch = 32;
  int rc = train(recipe_plain, dC, NULL, 0, 1, &r, err, sizeof err);
  TT_CHECK(rc == 0, "continuous run, micro-batch 32: %s", err);
  /* one epoch: 13 steps at micro-batch 16 (x2), the rest at 32 (x1); 13 at 32, the rest at 8 (x4) */
  const char *dirs[2] = {d1, d2};
  const int before[2] = {16, 32}, after[2] = {32, 8};
  for (int i = 0; i < 2 && rc == 0; i++) {
    train_micro_batch = before[i];
    int r1 = train(recipe_plain, dirs[i], NULL, 13, 1, &r, err, sizeof err);
    TT_CHECK(r1 == 0, "13 steps at micro-batch %d: %s", before[i], err);
    train_micro_batch = after[i];
    int r2 = r1 ? -1 : train(recipe_plain, dirs[i], dirs[i], 0, 1, &r, err, sizeof err);
    TT_CHECK(r1 || r2 == 0, "resumed at micro-batch %d: %s", after[i], err);
    TT_CHECK(r1 || r2 || r.steps_done == 32, "micro-batch %d -> %d: the resumed run ended at step %lld, want 32 (one "
             "epoch): it started at the wrong point of the epoch", before[i], after[i], r.steps_done);
    if (r1 || r2) continue;
    snprintf(a, sizeof a, "%s/state.safetensors", dC), snprintf(b, sizeof b, "%s/state.safetensors", dirs[i]);
    double d = max_rel_diff(a, b, why, sizeof why);
    /* the same images in the same steps: only the order of fp32 sums differs */
    TT_CHECK(d >= 0 && d < 1e-4, "micro-batch %d -> %d vs 32 throughout: the states differ by %g of the largest (%s)",
             before[i], after[i], d, d < 0 ? why : "want < 1e-4: the same images in the same steps");
  }
  train_micro_batch = 0;
  /* fp32, then resumed under fp16 autocast: the loss scale becomes fp16's (65536, doubling
   * after 2000 clean steps), not fp32's fixed 1 */
  char d3[1024], m[64];
  tt_test_path_in(d3, "P_fp16");
  train_precision = TT_PRECISION_FP32;
  int r1 = train(recipe_plain, d3, NULL, 5, 1, &r, err, sizeof err);
  train_precision = TT_PRECISION_FP16;
  int r2 = r1 ? -1 : train(recipe_plain, d3, d3, 8, 1, &r, err, sizeof err);
  train_precision = TT_PRECISION_AUTO;
  TT_CHECK(r1 == 0 && r2 == 0, "fp32 for 5 steps, then fp16: %s", err);
  snprintf(b, sizeof b, "%s/state.safetensors", d3);
  TT_CHECK(r2 || (atoi(meta_of(b, "loss_scale_growth_interval", m, sizeof m)) == 2000 &&
                  atof(meta_of(b, "loss_scale", m, sizeof m)) >= 1024),
           "resumed under fp16 from an fp32 checkpoint: loss scale %s, growth interval %s; want fp16's dynamic scale",
           meta_of(b, "loss_scale", m, sizeof m), meta_of(b, "loss_scale_growth_interval", why, sizeof why));
  TT_TEST_END();
}

/* ---- damaged metadata: refused naming the file and the key; metrics.jsonl untouched ---- */

static void test_bad_metadata(const char *recipe, const char *dA) {
  static const struct {
    const char *key, *value;
  } bad[] = {{"epoch", "-1"},           {"epoch", "4294967296"},  {"epoch", "99"},        {"step", "-5"},
             {"step", "1000000000000000"}, {"step", ""},          {"step", "12x"},        {"images_in_epoch", "-32"},
             {"images_in_epoch", "99999999999"}, {"images_in_epoch", ""}, {"images_in_epoch", "33"},
             {"images_in_epoch", "1056"}, {"loss_scale", "0"},     {"loss_scale", "nan"},  {"loss_scale", "inf"},
             {"loss_scale", ""},         {"loss_scale", "-65536"}, {"seed", ""},           {"seed", "-1"},
             {"micro_batch", "0"},       {"accum_steps", "-2"},    {"skipped_steps", "65"},
             {"loss_scale_clean_steps", "-1"}, {"loss_scale_growth_interval", ""}};
  char d[1024], src[1100], dst[1100], met[1100], why[1024], err[1500];
  tt_run_result r;
  TT_TEST_BEGIN("resume_bad_metadata");
  snprintf(src, sizeof src, "%s/metrics.jsonl", dA);
  char *metrics0 = slurp(src);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "M%zu", i);
    tt_test_path_in(d, name);
    mkdir(d, 0755);
    snprintf(src, sizeof src, "%s/state.safetensors", dA), snprintf(dst, sizeof dst, "%s/state.safetensors", d);
    if (rewrite_st(src, dst, bad[i].key, bad[i].value, NULL, why, sizeof why)) {
      TT_CHECK(0, "cannot write %s: %s", dst, why);
      continue;
    }
    snprintf(src, sizeof src, "%s/metrics.jsonl", dA), snprintf(met, sizeof met, "%s/metrics.jsonl", d);
    copy_file(src, met);
    int rc = train(recipe, NULL, d, 0, 3, &r, err, sizeof err);
    char key[64];
    snprintf(key, sizeof key, "'%s'", bad[i].key);
    TT_CHECK(rc != 0, "%s = '%s' was accepted (resumed to step %lld)", bad[i].key, bad[i].value, r.steps_done);
    TT_CHECK(rc == 0 || (strstr(err, dst) && strstr(err, key)), "%s = '%s': the message names neither %s nor %s: %s",
             bad[i].key, bad[i].value, dst, key, err);
    char *now = slurp(met);
    TT_CHECK(now && metrics0 && !strcmp(now, metrics0), "%s = '%s': the refused resume changed %s", bad[i].key,
             bad[i].value, met);
    free(now);
  }
  free(metrics0);
  TT_TEST_END();
}

/* A state file from before positions were counted in images ('batch_in_epoch' in micro-batches
 * of its micro_batch) resumes to the same end as the run that was never stopped. */
static void test_old_state(const char *recipe, const char *dA, const char *state13) {
  char d[1024], dst[1100], a[1100], why[1024], err[1500];
  tt_run_result r;
  TT_TEST_BEGIN("resume_old_state_file");
  tt_test_path_in(d, "Old");
  mkdir(d, 0755);
  snprintf(dst, sizeof dst, "%s/state.safetensors", d);
  snprintf(a, sizeof a, "%s/old1.safetensors", tt_test_dir());
  int rc = rewrite_st(state13, a, "images_in_epoch", NULL, NULL, why, sizeof why) ||
           rewrite_st(a, dst, "batch_in_epoch", "26", NULL, why, sizeof why);
  TT_CHECK(rc == 0, "cannot write the old-style state file: %s", why);
  if (rc == 0) {
    rc = train(recipe, d, d, 0, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0 && r.steps_done == 64, "resuming an old state file (batch_in_epoch = 26 at micro-batch 16): rc %d, "
             "%lld steps: %s", rc, r.steps_done, err);
    int nopt;
    snprintf(a, sizeof a, "%s/state.safetensors", dA);
    TT_CHECK(rc || compare_st(a, dst, 1, &nopt, why, sizeof why) > 0, "resumed from an old state file: %s", why);
  }
  TT_TEST_END();
}

/* Sends stderr to the file `log` until stderr_restore; returns the saved descriptor. */
static int stderr_to(const char *log) {
  fflush(stderr);
  int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 2);
  close(fd);
  return saved;
}

static void stderr_restore(int saved) {
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
}

/* The C API refuses an empty or root run directory, for --out and --resume alike, before
 * anything is written (issue 21: '' meant "/" once "/state.safetensors" was appended). */
static void test_run_dir_refused(const char *recipe) {
  static const char *const bad[4] = {"", "/", "//", "/tmp/.."};
  char err[1500];
  TT_TEST_BEGIN("run_dir_empty_or_root_refused");
  for (int k = 0; k < 4; k++)
    for (int resume = 0; resume < 2; resume++) {
      int rc = train(recipe, resume ? NULL : bad[k], resume ? bad[k] : NULL, 1, 0, NULL, err, sizeof err);
      TT_CHECK(rc != 0 && strstr(err, resume ? "--resume" : "--out") &&
                   (strstr(err, "empty") || strstr(err, "root directory")),
               "%s '%s': rc %d, err '%s'", resume ? "resume" : "out", bad[k], rc, err);
    }
  TT_TEST_END();
}

/* NaN weights are evaluated with a warning naming the file and the tensor; a state whose step
 * does not match its epoch and position resumes with a warning. */
static void test_nan_weights(const char *recipe, const char *dA) {
  char src[1100], dst[1100], log[1100], why[1024], err[1500];
  TT_TEST_BEGIN("eval_nan_weights_warns");
  snprintf(src, sizeof src, "%s/weights.safetensors", dA);
  snprintf(dst, sizeof dst, "%s/nan_weights.safetensors", tt_test_dir());
  tt_test_path_in(log, "nan_stderr.txt");
  TT_CHECK(rewrite_st(src, dst, NULL, NULL, "fc2.weight", why, sizeof why) == 0, "%s", why);
  tt_run_opts o;
  tt_run_opts_init(&o);
  o.recipe = recipe, o.device = TT_DEVICE_CPU, o.threads = 2, o.quiet = 1;
  FILE *devnull = fopen("/dev/null", "w");
  o.out = devnull;
  int saved = stderr_to(log);
  int rc = tt_evaluate(&o, dst, NULL, err, sizeof err);
  stderr_restore(saved);
  if (devnull) fclose(devnull);
  char *text = slurp(log);
  TT_CHECK(rc == 0, "evaluating NaN weights: %s", err);
  TT_CHECK(text && strstr(text, dst) && strstr(text, "fc2.weight") && strstr(text, "NaN"),
           "no warning naming %s and fc2.weight on stderr: '%s'", dst, text ? text : "");
  free(text);
  TT_TEST_END();

  TT_TEST_BEGIN("resume_step_mismatch_warns");
  char d[1024];
  tt_run_result r;
  tt_test_path_in(d, "Steps");
  mkdir(d, 0755);
  snprintf(src, sizeof src, "%s/state.safetensors", dA), snprintf(dst, sizeof dst, "%s/state.safetensors", d);
  TT_CHECK(rewrite_st(src, dst, "step", "60", NULL, why, sizeof why) == 0, "%s", why);
  saved = stderr_to(log);
  rc = train(recipe, d, d, 60, 0, &r, err, sizeof err); /* at the step limit already: only the checks */
  stderr_restore(saved);
  text = slurp(log);
  TT_CHECK(rc == 0, "step 60 at the end of epoch 2 (64 steps): %s", err);
  TT_CHECK(text && strstr(text, dst) && strstr(text, "step 60") && strstr(text, "makes 64 steps"),
           "no warning naming %s, its step 60 and the 64 its position makes: '%s'", dst, text ? text : "");
  free(text);
  TT_TEST_END();
}

/* ---- metrics.jsonl after a resume: cut back to the checkpoint's step ---- */

/* A run that wrote the lines of steps 15 and 20 but whose checkpoint on disk is at step 13 (the
 * one at 20 never landed, and a write killed half-way left a large .tmp): the resume drops
 * those lines, which it writes again, marks itself, so steps only go forward, and removes the
 * stale .tmp. */
static void test_metrics_cut(const char *recipe) {
  char d[1024], st[1100], saved[1100], met[1100], err[1500];
  tt_run_result r;
  TT_TEST_BEGIN("metrics_cut_on_resume");
  tt_test_path_in(d, "Cut"), tt_test_path_in(saved, "cut13.safetensors");
  snprintf(st, sizeof st, "%s/state.safetensors", d), snprintf(met, sizeof met, "%s/metrics.jsonl", d);
  int rc = train(recipe, d, NULL, 13, 0, &r, err, sizeof err);
  TT_CHECK(rc == 0 && copy_file(st, saved) == 0, "13 steps: %s", err);
  rc = rc ? rc : train(recipe, d, d, 20, 0, &r, err, sizeof err);
  TT_CHECK(rc == 0 && metrics_max_step(met) == 20, "resumed to step 20: %s", err);
  TT_CHECK(rc || copy_file(saved, st) == 0, "cannot put the step-13 state back");
  char tmp[1100]; /* a chart the kill cut short: this resume stops mid-epoch and writes no chart to replace it */
  snprintf(tmp, sizeof tmp, "%s/chart.svg.tmp", d);
  FILE *f = fopen(tmp, "w");
  for (int i = 0; f && i < 100000; i++) fputs("half-written ", f);
  if (f) fclose(f);
  rc = rc ? rc : train(recipe, d, d, 25, 0, &r, err, sizeof err);
  TT_CHECK(rc == 0 && r.steps_done == 25, "resumed from step 13 again: %s", err);
  TT_CHECK(access(tmp, F_OK) != 0, "the stale %s is still there after the resume", tmp);
  char *text = slurp(met);
  TT_CHECK(rc || (text && count_substr(text, "\"event\": \"resume\", \"epoch\": 1, \"step\": 13}") == 2),
           "want two resume lines at step 13: %s", text ? text : "");
  free(text);
  TT_TEST_END();
  if (rc == 0) check_metrics("metrics_cut_no_repeats", met, 0, 32);
}

/* ---- small units: intervals, when a checkpoint is due, a metrics line on a full disk ---- */

static void test_intervals(void) {
  long long st = -1;
  double sec = -1;
  TT_TEST_BEGIN("checkpoint_every_values");
  TT_CHECK(tt_parse_interval("500", &st, &sec) == 0 && st == 500 && sec == 0, "'500': %lld steps, %g s", st, sec);
  TT_CHECK(tt_parse_interval("10m", &st, &sec) == 0 && st == 0 && sec == 600, "'10m': %lld steps, %g s", st, sec);
  TT_CHECK(tt_parse_interval("10min", &st, &sec) == 0 && sec == 600, "'10min': %g s", sec);
  TT_CHECK(tt_parse_interval("30s", &st, &sec) == 0 && sec == 30, "'30s': %g s", sec);
  TT_CHECK(tt_parse_interval("1.5h", &st, &sec) == 0 && sec == 5400, "'1.5h': %g s", sec);
  TT_CHECK(tt_parse_interval("0", &st, &sec) == 0 && st == 0 && sec == 0, "'0': %lld steps, %g s", st, sec);
  const char *bad[] = {"", "-5", "1e3", "0x10", "5 m", "5d", "1.5", "m", "10mm", "..5s", "99999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    TT_CHECK(tt_parse_interval(bad[i], &st, &sec) != 0, "'%s' accepted", bad[i]);
  TT_CHECK(tt_train_checkpoint_due(10, 0, 20, 0) && !tt_train_checkpoint_due(10, 0, 21, 1e9), "every 10 steps");
  TT_CHECK(tt_train_checkpoint_due(0, 600, 7, 600.5) && !tt_train_checkpoint_due(0, 600, 7, 599), "every 600 s");
  TT_CHECK(!tt_train_checkpoint_due(0, 0, 10, 1e9), "0 is never");
  TT_TEST_END();
}

static void test_metrics_disk_full(void) {
  tt_metrics mt;
  tt_epoch_meter e;
  tt_loss_scale ls;
  tt_err err;
  TT_TEST_BEGIN("metrics_disk_full_is_an_error");
  if (access("/dev/full", W_OK) != 0) {
    TT_SKIP("metrics_disk_full_is_an_error", "no /dev/full");
    return;
  }
  tt_metrics_init(&mt, stdout, 1, 0);
  snprintf(mt.path, sizeof mt.path, "/dev/full");
  mt.jsonl = fopen("/dev/full", "w");
  tt_loss_scale_init(&ls, 0);
  tt_metrics_epoch_begin(&e, 0, 0);
  err.msg[0] = 0;
  int rc = tt_metrics_train(&mt, &e, 0, 1, 2.3, 0.1, 0.01, &ls, &err);
  TT_CHECK(rc != 0, "a train line written to /dev/full reported success");
  TT_CHECK(rc == 0 || (strstr(err.msg, "/dev/full") && strstr(err.msg, "space")), "message: %s", err.msg);
  rc = tt_metrics_eval(&mt, &e, 1, 2.3, 0.1, &err);
  TT_CHECK(rc != 0, "an eval line written to /dev/full reported success");
  tt_metrics_close(&mt);
  TT_TEST_END();
}

/* ---- a recipe without a test split trains (README), synthetic data honours classes ---- */

static void put_be32(FILE *f, unsigned v) {
  unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
  fwrite(b, 1, 4, f);
}

/* n 8x8 idx images of 4 classes (a bright quarter per class) and their labels. */
static int write_idx(const char *images, const char *labels, int n) {
  FILE *fi = fopen(images, "wb"), *fl = fopen(labels, "wb");
  if (!fi || !fl) return -1;
  put_be32(fi, 0x803), put_be32(fi, (unsigned)n), put_be32(fi, 8), put_be32(fi, 8);
  put_be32(fl, 0x801), put_be32(fl, (unsigned)n);
  uint64_t s = 3;
  for (int i = 0; i < n; i++) {
    int c = i % 4;
    for (int p = 0; p < 64; p++) {
      int y = p / 8, x = p % 8, in = (y / 4) * 2 + x / 4 == c;
      fputc((int)(tt_splitmix_next(&s) % 100) + (in ? 150 : 0), fi);
    }
    fputc(c, fl);
  }
  return fclose(fi) | fclose(fl);
}

static void test_no_test_split(void) {
  char rec[1024], img[1024], lab[1024], d[1024], out[1024], text[4096], err[1500];
  TT_TEST_BEGIN("train_without_test_split");
  tt_test_path_in(rec, "notest.recipe"), tt_test_path_in(img, "notest-images-idx3-ubyte");
  tt_test_path_in(lab, "notest-labels-idx1-ubyte"), tt_test_path_in(d, "NoTest"), tt_test_path_in(out, "notest.out");
  snprintf(text, sizeof text,
           "[net]\ninput = 1x8x8\nclasses = 4\n[train]\nbatch = 32\nepochs = 2\nlr = 0.05\nlog_every = 4\n"
           "[data]\nformat = idx\ntrain = %s\ntrain_labels = %s\nmean = 0.4\nstd = 0.3\n"
           "[conv conv1]\nfilters = 4\nsize = 3\nactivation = relu\n[flatten]\n[linear fc]\nout = 4\n",
           img, lab);
  TT_CHECK(write_idx(img, lab, 256) == 0 && write_file(rec, text) == 0, "cannot write the idx files");
  tt_run_opts o;
  tt_run_opts_init(&o);
  o.recipe = rec, o.device = TT_DEVICE_CPU, o.threads = 2, o.progress = 0, o.out_dir = d;
  o.out = fopen(out, "w");
  tt_run_result res;
  int rc = tt_train(&o, &res, err, sizeof err);
  if (o.out) fclose(o.out);
  TT_CHECK(rc == 0, "a recipe without 'test' did not train: %s", err);
  char *said = slurp(out), met[1100], *lines;
  snprintf(met, sizeof met, "%s/metrics.jsonl", d);
  lines = slurp(met);
  TT_CHECK(rc || (said && count_substr(said, "no test split") == 1), "want 'no test split' said once: %s",
           said ? said : "");
  TT_CHECK(rc || (lines && count_substr(lines, "\"event\": \"epoch\"") == 2 && !strstr(lines, "\"event\": \"eval\"")),
           "metrics.jsonl: want 2 epoch lines and no eval line: %s", lines ? lines : "");
  TT_CHECK(rc || (isnan(res.final_accuracy) && isnan(res.final_loss) && res.steps_done == 16),
           "final accuracy %g (want NaN: never evaluated), %lld steps", res.final_accuracy, res.steps_done);
  free(said), free(lines);
  TT_TEST_END();
}

static void test_synthetic_classes(void) {
  char rec[1024], d[1024], err[1500], text[1024];
  tt_run_result r;
  TT_TEST_BEGIN("synthetic_honours_classes");
  tt_test_path_in(rec, "syn3.recipe"), tt_test_path_in(d, "Syn3");
  snprintf(text, sizeof text, "[net]\ninput = 1x8x8\nclasses = 3\n[train]\nbatch = 32\n[data]\nformat = synthetic\n"
                              "[flatten]\n[linear fc]\nout = 3\n");
  write_file(rec, text);
  int rc = train(rec, d, NULL, 4, 0, &r, err, sizeof err);
  TT_CHECK(rc == 0, "synthetic data with classes = 3: %s", err);
  tt_model mdl;
  tt_err e;
  snprintf(text, sizeof text, "[net]\ninput = 1x8x8\nclasses = 20\n[train]\nbatch = 32\n[data]\nformat = synthetic\n"
                              "[flatten]\n[linear fc]\nout = 20\n");
  if (tt_recipe_parse("syn20.recipe", text, &mdl, &e, NULL, NULL) == 0) {
    tt_dataset ds;
    if (tt_dataset_load(&mdl.data, 1, 1, 8, 8, &ds, &e, NULL, NULL) == 0) {
      int hi = 0, lo = 99;
      for (int i = 0; i < ds.n; i++) hi = ds.labels[i] > hi ? ds.labels[i] : hi, lo = ds.labels[i] < lo ? ds.labels[i] : lo;
      TT_CHECK(lo == 0 && hi == 19, "classes = 20: labels from %d to %d", lo, hi);
      tt_dataset_free(&ds);
    } else {
      TT_CHECK(0, "%s", e.msg);
    }
    tt_model_free(&mdl);
  } else {
    TT_CHECK(0, "%s", e.msg);
  }
  TT_TEST_END();
}

/* The runs: signals, resumed == continuous (fp32, fp16, AdamW, bf16), --epochs, metrics.jsonl,
 * damaged and foreign checkpoints, and what a run refuses. One function: later checks reuse the
 * first runs' directories. */
static void test_runs(void) {
  char recipe[1024], recipe1[1024], recipe_wide[1024], dA[1024], dB[1024], dO[1024], dT[1024], dE[1024], dW[1024];
  char recipe_k9[1024], recipe_plain[1024], state13[1100];
  char a[1100], b[1100], why[1024], err[1500], m[64];
  tt_run_result r;
  tt_test_path_in(recipe, "syn.recipe"), tt_test_path_in(recipe1, "syn1.recipe");
  tt_test_path_in(recipe_wide, "syn_wide.recipe"), tt_test_path_in(recipe_k9, "syn_k9.recipe");
  tt_test_path_in(recipe_plain, "plain.recipe"), tt_test_path_in(state13, "state13.safetensors");
  tt_test_path_in(dA, "A"), tt_test_path_in(dB, "B"), tt_test_path_in(dO, "O");
  tt_test_path_in(dT, "T"), tt_test_path_in(dE, "E"), tt_test_path_in(dW, "W");
  if (write_recipe(recipe, 2, 16) || write_recipe(recipe1, 1, 16) || write_recipe(recipe_wide, 2, 12) ||
      write_recipe_edit(recipe_k9, 50, "batch = 32\nmicro_batch = 16\n", "batch = 8\nmicro_batch = 8\n",
                        "log_every = 5\n", "log_every = 1\ncheckpoint_every = 10\n") ||
      write_file(recipe_plain, recipe_plain_text)) {
    printf("FAIL setup: cannot write recipes under %s\n", tt_test_dir());
    tt_test_failures++;
    return;
  }
  const int steps_per_epoch = 32, k = 13; /* 13: mid-epoch, not a multiple of 32 */

  /* ---- signals: the children first, before this process uses OpenMP ---- */
  child_run c_int, c_k9;
  child_signal(&c_int, recipe, "S", 200, 5, SIGINT);
  child_signal(&c_k9, recipe_k9, "K", 50, 25, SIGKILL);
  int burst[BURST_RUNS];
  char recipe_gemm[1024];
  tt_test_path_in(recipe_gemm, "gemm.recipe");
  if (write_file(recipe_gemm, "[net]\ninput = 3x32x32\nclasses = 10\n[train]\nbatch = 128\nepochs = 200\n"
                              "[data]\nformat = synthetic\n[flatten]\n[linear fc1]\nout = 1024\n[relu]\n"
                              "[linear fc]\nout = 10\n") == 0)
    burst_runs(recipe_gemm, burst);
  else
    for (int i = 0; i < BURST_RUNS; i++) burst[i] = -1;
  test_sigint(&c_int, recipe);
  test_kill9(&c_k9, recipe_k9);
  test_signal_burst(burst);

  /* ---- resumed == continuous ---- */
  TT_TEST_BEGIN("resume_bit_exact");
  int rcA = train(recipe, dA, NULL, 0, 0, &r, err, sizeof err);
  TT_CHECK(rcA == 0, "run A: %s", err);
  TT_CHECK(rcA || r.steps_done == 2 * steps_per_epoch, "run A did %lld steps, want %d", r.steps_done,
           2 * steps_per_epoch);
  double accA = r.final_accuracy, lossA = r.final_loss;
  int rcB = train(recipe, dB, NULL, k, 0, &r, err, sizeof err);
  TT_CHECK(rcB == 0, "run B (max_steps %d): %s", k, err);
  TT_CHECK(rcB || r.steps_done == k, "run B stopped after %lld steps, want %d", r.steps_done, k);
  snprintf(b, sizeof b, "%s/state.safetensors", dB);
  TT_CHECK(atoi(meta_of(b, "step", m, sizeof m)) == k, "B's state says step '%s', want %d", m, k);
  /* the position is counted in images (issue 14 item 8), no longer in micro-batches (batch_in_epoch = 2k) */
  TT_CHECK(atoi(meta_of(b, "images_in_epoch", m, sizeof m)) == 32 * k, "B's state says images_in_epoch '%s', want %d",
           m, 32 * k);
  TT_CHECK(atoi(meta_of(b, "epoch", m, sizeof m)) == 0, "B's state says epoch '%s', want 0", m);
  TT_CHECK(copy_file(b, state13) == 0, "cannot copy %s", b);
  if (rcB == 0) {
    /* resuming at the step limit already reached does no step and leaves the state as it was */
    rcB = train(recipe, dB, dB, k, 0, &r, err, sizeof err);
    TT_CHECK(rcB == 0, "resuming B with max_steps %d: %s", k, err);
    TT_CHECK(rcB || r.steps_done == k, "resuming at step %d with max_steps %d ended at step %lld", k, k, r.steps_done);
    TT_CHECK(atoi(meta_of(b, "step", m, sizeof m)) == k, "B's state says step '%s' after a no-op resume, want %d", m, k);
  }
  if (rcB == 0) {
    rcB = train(recipe, dB, dB, 0, 0, &r, err, sizeof err);
    TT_CHECK(rcB == 0, "resuming B: %s", err);
    TT_CHECK(rcB || r.steps_done == 2 * steps_per_epoch, "resumed B ended at step %lld, want %d", r.steps_done,
             2 * steps_per_epoch);
    TT_CHECK(rcB || (r.final_accuracy == accA && r.final_loss == lossA),
             "final test accuracy/loss %.6f/%.6f after resume vs %.6f/%.6f continuous", r.final_accuracy, r.final_loss,
             accA, lossA);
  }
  if (rcA == 0 && rcB == 0) {
    int nopt = 0, n;
    snprintf(a, sizeof a, "%s/weights.safetensors", dA), snprintf(b, sizeof b, "%s/weights.safetensors", dB);
    n = compare_st(a, b, 1, &nopt, why, sizeof why);
    TT_CHECK(n > 0, "weights: %s", why);
    TT_CHECK(n < 0 || n == 15, "weights.safetensors holds %d tensors, want 15 (conv1 1, bn 4+4, conv2 2, fc 2+2)", n);
    snprintf(a, sizeof a, "%s/state.safetensors", dA), snprintf(b, sizeof b, "%s/state.safetensors", dB);
    n = compare_st(a, b, 1, &nopt, why, sizeof why);
    TT_CHECK(n > 0, "state: %s", why);
    TT_CHECK(n < 0 || nopt == 11, "state.safetensors holds %d momentum tensors, want 11 (one per trainable tensor)", nopt);
  }
  TT_TEST_END();

  /* fp16: the same, with the loss scale, its clean-step count and the last step's pending overflow
   * outcome in the state's metadata */
  TT_TEST_BEGIN("resume_bit_exact_fp16");
  {
    char r16[1024], d16a[1024], d16b[1024];
    tt_test_path_in(r16, "syn16.recipe"), tt_test_path_in(d16a, "A16"), tt_test_path_in(d16b, "B16");
    int rc = write_recipe_fp16(r16, 1);
    TT_CHECK(rc == 0, "cannot write %s", r16);
    if (!rc) rc = train(r16, d16a, NULL, 0, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0, "fp16 run A: %s", err);
    double acc16 = r.final_accuracy;
    if (!rc) rc = train(r16, d16b, NULL, k, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0, "fp16 run B (max_steps %d): %s", k, err);
    snprintf(b, sizeof b, "%s/state.safetensors", d16b);
    TT_CHECK(rc || strcmp(meta_of(b, "loss_scale_pending", m, sizeof m), "-1") != 0,
             "B stopped after an fp16 step but its state has no pending overflow outcome ('%s')", m);
    if (!rc) rc = train(r16, d16b, d16b, 0, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0, "resuming fp16 B: %s", err);
    TT_CHECK(rc || r.final_accuracy == acc16, "fp16 accuracy %.6f after resume vs %.6f", r.final_accuracy, acc16);
    if (!rc) {
      int nopt = 0;
      snprintf(a, sizeof a, "%s/state.safetensors", d16a);
      int n = compare_st(a, b, 1, &nopt, why, sizeof why);
      TT_CHECK(n > 0, "fp16 state: %s", why);
      printf("  fp16: loss scale %s, %s skipped, pending '%s' at the end\n", meta_of(a, "loss_scale", m, sizeof m),
             meta_of(a, "skipped_steps", why, sizeof why), meta_of(a, "loss_scale_pending", err, sizeof err));
    }
  }
  TT_TEST_END();

  /* adamw with clip_norm and the default decay rule (weights only): neither keeps state, so the
   * state file holds what it held, and the resumed run ends bit for bit where the continuous one
   * does */
  TT_TEST_BEGIN("resume_bit_exact_adamw_clip_norm_decay");
  {
    char rc_[1024], dca[1024], dcb[1024];
    tt_test_path_in(rc_, "syn_clip.recipe"), tt_test_path_in(dca, "AC"), tt_test_path_in(dcb, "BC");
    int rc = write_recipe_edit(rc_, 1, "optimizer = sgd\nlr = 0.05\nmomentum = 0.9\nnesterov = true\n",
                               "optimizer = adamw\nlr = 0.002\n", "weight_decay = 5e-4\n",
                               "weight_decay = 0.05\nclip_norm = 0.2\n");
    TT_CHECK(rc == 0, "cannot write %s", rc_);
    if (!rc) rc = train(rc_, dca, NULL, 0, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0, "adamw + clip_norm run A: %s", err);
    double accc = r.final_accuracy;
    if (!rc) rc = train(rc_, dcb, NULL, k, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0, "adamw + clip_norm run B (max_steps %d): %s", k, err);
    if (!rc) rc = train(rc_, dcb, dcb, 0, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0, "resuming adamw + clip_norm B: %s", err);
    TT_CHECK(rc || r.final_accuracy == accc, "accuracy %.6f after resume vs %.6f", r.final_accuracy, accc);
    if (!rc) {
      int nopt = 0, n;
      snprintf(a, sizeof a, "%s/state.safetensors", dca), snprintf(b, sizeof b, "%s/state.safetensors", dcb);
      n = compare_st(a, b, 1, &nopt, why, sizeof why);
      TT_CHECK(n > 0, "adamw + clip_norm state: %s", why);
      TT_CHECK(n < 0 || nopt == 22, "state.safetensors holds %d Adam tensors, want 22 (m and v per trainable tensor)", nopt);
    }
  }
  TT_TEST_END();

  /* bf16 (recipe key precision = bf16): stopped after k steps and resumed equals the continuous
   * run bit for bit, with no loss scale in the state (bf16 runs unscaled) */
  TT_TEST_BEGIN("resume_bit_exact_bf16");
  {
    char rb[1024], dba[1024], dbb[1024];
    tt_test_path_in(rb, "synbf16.recipe"), tt_test_path_in(dba, "Abf16"), tt_test_path_in(dbb, "Bbf16");
    int rc = write_recipe_prec(rb, 1, "bf16");
    TT_CHECK(rc == 0, "cannot write %s", rb);
    if (!rc) rc = train(rb, dba, NULL, 0, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0, "bf16 run A: %s", err);
    double accb = r.final_accuracy;
    if (!rc) rc = train(rb, dbb, NULL, k, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0, "bf16 run B (max_steps %d): %s", k, err);
    if (!rc) rc = train(rb, dbb, dbb, 0, 0, &r, err, sizeof err);
    TT_CHECK(rc == 0, "resuming bf16 B: %s", err);
    TT_CHECK(rc || r.final_accuracy == accb, "bf16 accuracy %.6f after resume vs %.6f", r.final_accuracy, accb);
    if (!rc) {
      int nopt = 0;
      snprintf(a, sizeof a, "%s/state.safetensors", dba), snprintf(b, sizeof b, "%s/state.safetensors", dbb);
      int n = compare_st(a, b, 1, &nopt, why, sizeof why);
      TT_CHECK(n > 0, "bf16 state: %s", why);
      snprintf(a, sizeof a, "%s/weights.safetensors", dba), snprintf(b, sizeof b, "%s/weights.safetensors", dbb);
      n = compare_st(a, b, 0, &nopt, why, sizeof why);
      TT_CHECK(n > 0, "bf16 weights: %s", why);
      snprintf(a, sizeof a, "%s/state.safetensors", dba);
      TT_CHECK(atof(meta_of(a, "loss_scale", m, sizeof m)) == 1.0, "bf16 run has loss scale %s, want 1 (none)", m);
    }
  }
  TT_TEST_END();

  /* --epochs (o.epochs) overrides the recipe's epochs, and the cosine schedule spans it: a 1-epoch
   * recipe run for 2 epochs trains exactly like the 2-epoch recipe. */
  TT_TEST_BEGIN("epochs_override_schedule");
  int rcO = train(recipe1, dO, NULL, 0, 2, &r, err, sizeof err);
  TT_CHECK(rcO == 0, "run with epochs = 2 over a 1-epoch recipe: %s", err);
  if (rcO == 0 && rcA == 0) {
    int nopt = 0;
    snprintf(a, sizeof a, "%s/weights.safetensors", dA), snprintf(b, sizeof b, "%s/weights.safetensors", dO);
    TT_CHECK(compare_st(a, b, 0, &nopt, why, sizeof why) > 0, "recipe epochs = 2 vs recipe epochs = 1 with --epochs 2: %s",
             why);
  }
  TT_TEST_END();

  /* ---- metrics.jsonl ---- */
  snprintf(a, sizeof a, "%s/metrics.jsonl", dA), snprintf(b, sizeof b, "%s/metrics.jsonl", dB);
  if (rcA == 0) check_metrics("metrics_jsonl", a, 2, steps_per_epoch);
  if (rcB == 0) check_metrics("metrics_jsonl_resumed", b, 2, steps_per_epoch);

  /* ---- damaged and foreign checkpoints ---- */
  TT_TEST_BEGIN("resume_truncated_state");
  if (rcA == 0) {
    char s[1100], t[1100];
    mkdir(dT, 0755);
    snprintf(s, sizeof s, "%s/weights.safetensors", dA), snprintf(t, sizeof t, "%s/weights.safetensors", dT);
    TT_CHECK(copy_file(s, t) == 0, "cannot copy %s", s);
    snprintf(s, sizeof s, "%s/state.safetensors", dA), snprintf(t, sizeof t, "%s/state.safetensors", dT);
    TT_CHECK(copy_file(s, t) == 0, "cannot copy %s", s);
    struct stat sb;
    TT_CHECK(stat(t, &sb) == 0 && truncate(t, sb.st_size / 2) == 0, "cannot truncate %s", t);
    char out[1100];
    snprintf(out, sizeof out, "%s/out", dT);
    int rc = train(recipe, out, dT, 0, 3, &r, err, sizeof err);
    TT_CHECK(rc != 0, "resuming from a state file cut to half its size succeeded");
    TT_CHECK(rc == 0 || strstr(err, t), "the message does not name %s: %s", t, err);
    TT_CHECK(rc == 0 || !strchr(err, '\n'), "the message is not one line: %s", err);
    TT_CHECK(rc == 0 || stat(out, &sb) != 0, "the refused resume left a run directory %s behind", out);
    /* the good checkpoint it was copied from still resumes: one more epoch */
    rc = train(recipe, dE, dA, 0, 3, &r, err, sizeof err);
    TT_CHECK(rc == 0, "resuming from the intact checkpoint %s: %s", dA, err);
    TT_CHECK(rc || r.steps_done == 3 * steps_per_epoch, "resumed run ended at step %lld, want %d", r.steps_done,
             3 * steps_per_epoch);
    TT_CHECK(rc || (r.final_accuracy > 0.0 && r.final_accuracy <= 1.0), "accuracy %g", r.final_accuracy);
  } else {
    TT_CHECK(0, "needs run A");
  }
  TT_TEST_END();

  TT_TEST_BEGIN("resume_other_recipe");
  if (rcA == 0) {
    int rc = train(recipe_wide, dW, dA, 0, 0, &r, err, sizeof err);
    TT_CHECK(rc != 0, "a checkpoint with conv2 16 filters resumed into a recipe with 12");
    TT_CHECK(rc == 0 || strstr(err, "conv2.weight"), "the message does not name the tensor conv2.weight: %s", err);
    TT_CHECK(rc == 0 || (strstr(err, "16x8x3x3") && strstr(err, "12x8x3x3")),
             "the message does not give both shapes 16x8x3x3 and 12x8x3x3: %s", err);
    TT_CHECK(rc == 0 || strstr(err, "state.safetensors"), "the message does not name the file: %s", err);
    struct stat sb;
    TT_CHECK(rc == 0 || stat(dW, &sb) != 0, "the refused resume left a run directory %s behind", dW);
  } else {
    TT_CHECK(0, "needs run A");
  }
  TT_TEST_END();

  if (rcA == 0) {
    test_bad_metadata(recipe, dA);
    test_old_state(recipe, dA, state13);
    test_nan_weights(recipe, dA);
    test_pending_evaluation(recipe, dA);
  }
  test_run_dir_refused(recipe);
  test_policy_change(recipe_plain);
  test_metrics_cut(recipe);
  test_metrics_disk_full();
  test_no_test_split();
  test_synthetic_classes();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("lr_schedules", "runtime train", test_lr_schedules),
  TT_TEST("parse_size", "runtime train", test_parse_size),
  TT_TEST("intervals", "runtime train", test_intervals),
  TT_TEST("runs", "runtime train resume checkpoint", test_runs),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
