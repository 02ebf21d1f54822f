/* core/app/run_recipe.c — the run directory's copy of its recipe (run_recipe.h, cli.h). */
#include "run_recipe.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/fileio.h"
#include "cli.h"

/* The header's value of key ("# lr: 0.1" -> "0.1"), copied into v; 0 when found. */
static int run_recipe_header(const char *text, const char *key, char *v, size_t n) {
  char want[64];
  snprintf(want, sizeof want, "# %s: ", key);
  for (const char *p = text; p && *p == '#'; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, want, strlen(want))) {
      p += strlen(want);
      size_t k = strcspn(p, "\n");
      snprintf(v, n, "%.*s", (int)(k < n ? k : n - 1), p);
      return 0;
    }
  return -1;
}

/* The recipe's text after the copy's header. */
static const char *run_recipe_body(const char *text) {
  const char *p = strstr(text, "\n# --- recipe ---\n");
  return p ? p + 18 : text;
}

/* Writes dir/TT_RUN_RECIPE atomically: a header ("# from:", "# epochs:", "# lr:") then the
 * recipe's text exactly as run (o->recipe_text, or the file o->recipe). On a resume the old
 * copy's header is compared first and a changed lr or epoch count is warned about, since
 * either changes the schedule from this step on. Returns 0, or -1 with err. */
int tt_run_recipe_keep(const char *dir, const tt_run_opts *o, const tt_model *m, int epochs, int resuming, tt_err *err) {
  char path[TT_PATH_MAX + 32], from[PATH_MAX], head[PATH_MAX + 512];
  void *old = NULL, *src = NULL;
  size_t n = 0;
  tt_err ignore;
  snprintf(path, sizeof path, "%s/%s", dir, TT_RUN_RECIPE);
  if (resuming && tt_read_file(path, &old, &n, &ignore) == 0) { /* what this resume changed */
    char v[64], w[TT_PATH_MAX + 256];
    if (!run_recipe_header((const char *)old, "lr", v, sizeof v) && (float)strtod(v, NULL) != m->train.lr) {
      snprintf(w, sizeof w, "tinytrain: warning: %s: [train] lr changed since the run started: %g before, %g now "
               "(the schedule continues from this step with the new rate)", dir, (double)(float)strtod(v, NULL),
               (double)m->train.lr);
      tt_warn_stderr(NULL, w);
    }
    if (!run_recipe_header((const char *)old, "epochs", v, sizeof v) && atoi(v) != epochs) {
      snprintf(w, sizeof w, "tinytrain: warning: %s: epochs changed since the run started: %s before, %d now%s", dir, v,
               epochs, m->train.schedule != TT_LR_CONSTANT ? " (the lr schedule is stretched to the new length)" : "");
      tt_warn_stderr(NULL, w);
    }
  }
  const char *text = o->recipe_text;
  if (!text) {
    if (tt_read_file(o->recipe, &src, &n, err)) {
      free(old);
      return -1;
    }
    text = (const char *)src;
  } else if (old && !strcmp(run_recipe_body((const char *)old), text)) {
    text = run_recipe_body((const char *)old); /* resumed from this copy */
  }
  if (!o->recipe || !realpath(o->recipe, from)) snprintf(from, sizeof from, "%s", m->path);
  /* and the options that shaped the plan, which `--resume DIR` takes back unless given again */
  int hn = snprintf(head, sizeof head,
                    "# tinytrain: the recipe of this run, copied at its start; `tinytrain --resume %s` reads it\n"
                    "# from: %s\n# epochs: %d\n# lr: %.9g\n# vram: %zu\n# device: %d\n# threads: %d\n"
                    "# micro_batch: %d\n# precision: %d\n# recompute: %d\n# tf32: %d\n# --- recipe ---\n",
                    dir, from, epochs, (double)m->train.lr, o->vram_bytes, (int)o->device, o->threads, o->micro_batch,
                    (int)o->precision, (int)o->recompute, (int)o->tf32);
  const void *chunks[2] = {head, text};
  size_t sizes[2] = {(size_t)hn, strlen(text)};
  int rc = tt_write_file_atomic(path, chunks, sizes, 2, err);
  free(old);
  free(src);
  return rc;
}

/* One header value as a bounded integer into *v; 0 when present and in [lo, hi]. */
static int run_recipe_int(const char *text, const char *key, long long lo, long long hi, long long *v) {
  char s[64], *end;
  if (run_recipe_header(text, key, s, sizeof s)) return -1;
  long long x = strtoll(s, &end, 10);
  if (end == s || *end || x < lo || x > hi) return -1;
  *v = x;
  return 0;
}

int tt_run_options_load(const char *dir, tt_run_opts *saved, unsigned *have) {
  char path[TT_PATH_MAX + 32];
  void *data = NULL;
  size_t n = 0;
  long long v;
  tt_err err;
  *have = 0;
  snprintf(path, sizeof path, "%s/%s", dir, TT_RUN_RECIPE);
  if (tt_read_file(path, &data, &n, &err)) return -1;
  const char *t = (const char *)data;
  /* an earlier tinytrain's copy has none of these lines: nothing taken back */
  if (!run_recipe_int(t, "vram", 0, LLONG_MAX, &v)) saved->vram_bytes = (size_t)v, *have |= TT_RUN_OPT_VRAM;
  if (!run_recipe_int(t, "device", TT_DEVICE_AUTO, TT_DEVICE_CUDA, &v)) saved->device = (tt_device)v, *have |= TT_RUN_OPT_DEVICE;
  if (!run_recipe_int(t, "threads", 0, 1000000, &v)) saved->threads = (int)v, *have |= TT_RUN_OPT_THREADS;
  if (!run_recipe_int(t, "micro_batch", 0, 1000000000, &v)) saved->micro_batch = (int)v, *have |= TT_RUN_OPT_MICRO_BATCH;
  if (!run_recipe_int(t, "precision", TT_PRECISION_AUTO, TT_PRECISION_BF16, &v))
    saved->precision = (tt_run_precision)v, *have |= TT_RUN_OPT_PRECISION;
  if (!run_recipe_int(t, "recompute", TT_RECOMPUTE_AUTO, TT_RECOMPUTE_ALL, &v))
    saved->recompute = (tt_run_recompute)v, *have |= TT_RUN_OPT_RECOMPUTE;
  if (!run_recipe_int(t, "tf32", TT_TF32_RECIPE, TT_TF32_OFF, &v)) saved->tf32 = (tt_run_tf32)v, *have |= TT_RUN_OPT_TF32;
  free(data);
  return 0;
}

/* Reads a run directory's recipe copy for `--resume DIR` without a recipe: *text gets the
 * recipe's text without the header (the caller frees it), from the path it was copied from.
 * Returns 0, or -1 with the message in errbuf (errsize bytes). */
int tt_run_recipe_load(const char *dir, char **text, char *from, size_t fromsize, char *errbuf, size_t errsize) {
  char path[TT_PATH_MAX + 32];
  void *data = NULL;
  size_t n = 0;
  tt_err err;
  snprintf(path, sizeof path, "%s/%s", dir, TT_RUN_RECIPE);
  if (tt_read_file(path, &data, &n, &err)) {
    struct stat st;
    if (lstat(path, &st) == 0) /* there, but a FIFO, a directory, a link or unreadable: say that */
      snprintf(errbuf, errsize, "--resume %s: %s; it should be the recipe copy the run wrote: give the recipe instead: "
               "tinytrain --resume %s RECIPE", dir, err.msg, dir);
    else
      snprintf(errbuf, errsize, "--resume %s: the run directory has no %s (a run of an older tinytrain?): give its recipe: "
               "tinytrain --resume %s RECIPE", dir, TT_RUN_RECIPE, dir);
    return -1;
  }
  if (run_recipe_header((const char *)data, "from", from, fromsize)) {
    snprintf(errbuf, errsize, "%s: not a recipe copy tinytrain wrote (no '# from:' line)", path);
    free(data);
    return -1;
  }
  const char *body = run_recipe_body((const char *)data);
  memmove(data, body, strlen(body) + 1);
  *text = (char *)data;
  return 0;
}
