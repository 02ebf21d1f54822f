/* tests/compile/layout_train.h — what test_layout.c and test_layout_blk.c share: a few training
 * steps on the CPU in a given layout, and the distance between two weights files. Static: each
 * test binary includes it once. */
#ifndef TT_TESTS_LAYOUT_TRAIN_H
#define TT_TESTS_LAYOUT_TRAIN_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/safetensors.h"
#include "core/compile/model.h"
#include "core/tinytrain.h"
#include "tests/tt_test.h"

/* The layer named name in m (-1: none). */
static int node_of(const tt_model *m, const char *name) {
  for (int i = 0; i < m->nlayers; i++)
    if (!strcmp(m->layers[i].name, name)) return i;
  return -1;
}

/* Trains `steps` steps of the recipe on the CPU (backend: "onednn" or "ref"; layout: NULL or
 * "nchw", "nhwc", "nchw16c") into tt_test_dir()/<tag>; 0 on success. */
static int layout_train(const char *recipe, const char *backend, const char *layout, tt_run_precision prec, const char *tag,
                        int steps, char *err, size_t errsize) {
  tt_run_opts o;
  tt_run_result res;
  char out[128];
  snprintf(out, sizeof out, "%s/%s", tt_test_dir(), tag);
  tt_run_opts_init(&o);
  o.recipe = recipe, o.device = TT_DEVICE_CPU, o.threads = 2, o.quiet = 1;
  o.out_dir = out, o.micro_batch = 8, o.max_steps = steps, o.precision = prec, o.recompute = TT_RECOMPUTE_NONE;
  FILE *devnull = fopen("/dev/null", "w");
  o.out = devnull;
  setenv("TINYTRAIN_CPU_BACKEND", backend, 1);
  if (layout) setenv("TINYTRAIN_LAYOUT", layout, 1);
  else unsetenv("TINYTRAIN_LAYOUT");
  int rc = tt_train(&o, &res, err, errsize);
  unsetenv("TINYTRAIN_CPU_BACKEND");
  unsetenv("TINYTRAIN_LAYOUT");
  if (devnull) fclose(devnull);
  return rc;
}

/* The largest |a - b| / (1 + max |a| of the tensor) over every tensor of two weights files; < 0
 * when they do not hold the same tensors. */
static double weights_diff(const char *a, const char *b, char *where, size_t n) {
  tt_st_file *fa = NULL, *fb = NULL;
  tt_err err;
  double worst = -1.0;
  snprintf(where, n, "bit for bit");
  if (tt_st_open(a, &fa, &err) || tt_st_open(b, &fb, &err)) {
    snprintf(where, n, "%.200s", err.msg);
    goto done;
  }
  if (tt_st_count(fa) != tt_st_count(fb)) {
    snprintf(where, n, "%d tensors against %d", tt_st_count(fa), tt_st_count(fb));
    goto done;
  }
  worst = 0.0;
  for (int i = 0; i < tt_st_count(fa); i++) {
    const tt_st_tensor *ta = tt_st_at(fa, i), *tb = tt_st_get(fb, ta->name);
    if (!tb || tb->bytes != ta->bytes) {
      snprintf(where, n, "%s: absent or of another size", ta->name);
      worst = -1.0;
      goto done;
    }
    const float *x = (const float *)ta->data, *y = (const float *)tb->data;
    double mx = 0.0;
    for (size_t k = 0; k < ta->bytes / 4; k++) mx = fmax(mx, fabs(x[k]));
    for (size_t k = 0; k < ta->bytes / 4; k++) {
      double d = fabs((double)x[k] - (double)y[k]) / (1.0 + mx);
      if (d > worst) {
        worst = d;
        snprintf(where, n, "%s[%zu]: %.9g against %.9g", ta->name, k, x[k], y[k]);
      }
    }
  }
done:
  if (fa) tt_st_close(fa);
  if (fb) tt_st_close(fb);
  return worst;
}

#endif
