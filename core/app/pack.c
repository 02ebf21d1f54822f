/* core/app/pack.c — the command `tinytrain pack` (tt_pack in tinytrain.h): scans an image folder
 * or list file (or a recipe's [data] train and test sets) and writes each as .npy files through
 * tt_pack_set (core/data/pack_set.c, which documents the files and how they are put in place).
 * A PREFIX that is an existing directory means DIR/<SOURCE's base name>. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "../data/dataset.h"
#include "../data/decode.h"
#include "../base/fileio.h"
#include "../compile/recipe.h"
/* tt_pack is public: only a definition that sees its TT_API declaration is exported */
#include "../tinytrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the command: tinytrain pack ---- */

/* Scans SOURCE: a directory is a folder data set, anything else a list file. */
static int pack_scan(const char *src, int c, int h, int w, int max_classes, int max_mp, const tt_data_cfg *cfg,
                     tt_dataset *ds, tt_err *err) {
  char why[TT_DECODE_REASON_MAX];
  int is_dir = access(src, F_OK) == 0 && tt_file_check_kind(src, why) != 0;
  int rc = is_dir ? tt_dataset_scan_folder(src, c, h, w, ds, err, tt_warn_stderr, NULL)
                  : tt_dataset_scan_list(src, c, h, w, max_classes, ds, err, tt_warn_stderr, NULL);
  ds->max_pixels = tt_max_pixels(max_mp);
  if (cfg) ds->max_failed = cfg->max_failed, ds->max_failed_set = cfg->max_failed_set; /* else the default share */
  return rc;
}

/* Packs ds through tt_pack_set under prefix (images, labels, class names when the set has
 * them, set description) and prints one line saying what was written. 0 or -1. */
static int pack_write(FILE *out, const char *src, const tt_dataset *ds, const char *prefix, tt_err *err) {
  int kept = 0;
  if (tt_pack_set(ds, prefix, &kept, tt_warn_stderr, NULL, err)) return -1;
  fprintf(out, "%s: %d images of %dx%dx%d packed (%d skipped) into %s-images.npy, %s-labels.npy%s%s%s, %s-set.json\n", src,
         kept, ds->h, ds->w, ds->c, ds->n - kept + ds->skipped, prefix, prefix, ds->class_names ? ", " : "",
         ds->class_names ? prefix : "", ds->class_names ? "-classes.json" : "", prefix);
  return 0;
}

/* PATH without a trailing slash, as an output prefix. */
static void pack_prefix(char *out, size_t size, const char *path) {
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') n--;
  snprintf(out, size, "%.*s", (int)n, path);
}

/* tinytrain pack RECIPE: the [data] train (and test) sets at the recipe's input size. */
/* The lines of recipe's [data] section that a packed set keeps (mean, std, hflip, crops, ...: all
 * but format and the sources), as they stand in the file, so that the printed section replaces
 * the old one whole and trains the same model; nothing when the file cannot be read again. */
static void pack_data_rest(FILE *out, const char *recipe) {
  static const char *const dropped[] = {"format", "train", "test", "train_labels", "test_labels", NULL};
  void *data = NULL;
  size_t n = 0;
  tt_err err;
  int in_data = 0;
  if (tt_read_file(recipe, &data, &n, &err)) return;
  for (char *line = (char *)data, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    const char *t = line + strspn(line, " \t");
    size_t klen = strcspn(t, " \t=");
    int keep = 1;
    if (*t == '[') {
      in_data = !strncmp(t, "[data]", 6);
      continue;
    }
    if (!in_data || !*t || *t == '#' || *t == ';' || !strchr(t, '=')) continue;
    for (int k = 0; dropped[k]; k++)
      if (strlen(dropped[k]) == klen && !strncmp(t, dropped[k], klen)) keep = 0;
    if (keep) fprintf(out, "%s\n", t);
  }
  free(data);
}

static int pack_recipe(FILE *out, const char *recipe, tt_err *err) {
  tt_model *m = (tt_model *)tt_calloc(1, sizeof *m, "model", err);
  tt_dataset tr, te;
  char ptr[TT_PATH_MAX], pte[TT_PATH_MAX];
  int rc = -1;
  memset(&tr, 0, sizeof tr);
  memset(&te, 0, sizeof te);
  if (!m || tt_recipe_load(recipe, m, err, tt_warn_stderr, NULL)) goto done;
  if (m->data.format != TT_DATA_FOLDER && m->data.format != TT_DATA_LIST) {
    tt_fail(err, "%s: [data] is not format = folder or list; pack reads image folders and list files", recipe);
    goto done;
  }
  pack_prefix(ptr, sizeof ptr, m->data.train);
  if (pack_scan(m->data.train, m->in_c, m->in_h, m->in_w, m->classes, m->data.max_megapixels, &m->data, &tr, err) ||
      tt_dataset_name_classes(&m->data, m->classes, &tr, err) || pack_write(out, m->data.train, &tr, ptr, err))
    goto done;
  if (m->data.test[0]) {
    pack_prefix(pte, sizeof pte, m->data.test);
    if (pack_scan(m->data.test, m->in_c, m->in_h, m->in_w, m->classes, m->data.max_megapixels, &m->data, &te, err) ||
        tt_dataset_map_classes(&te, &tr, err))
      goto done;
    te.class_names = tr.class_names, te.classes = tr.classes; /* the run's names, borrowed */
    rc = pack_write(out, m->data.test, &te, pte, err);
    te.class_names = NULL;
    if (rc) goto done;
  }
  fprintf(out, "\nto read them, the whole of %s's [data]:\n[data]\nformat = npy\ntrain = %s-images.npy\n"
              "train_labels = %s-labels.npy\n", recipe, ptr, ptr);
  if (m->data.test[0]) fprintf(out, "test = %s-images.npy\ntest_labels = %s-labels.npy\n", pte, pte);
  pack_data_rest(out, recipe);
  rc = 0;
done:
  tt_dataset_free(&tr);
  tt_dataset_free(&te);
  if (m) tt_model_free(m);
  free(m);
  return rc;
}

/* `tinytrain pack`: with prefix NULL, source is a recipe and its [data] sets are packed next
 * to them; otherwise source is a folder or list file packed at prefix with c x h x w (0 for
 * each: 3 x 224 x 224). Reports go to out (NULL: stdout). Returns 0, or -1 with the message
 * in errbuf (errsize bytes; may be NULL). */
int tt_pack(const char *source, const char *prefix, int c, int h, int w, int max_megapixels, FILE *out, char *errbuf,
            size_t errsize) {
  tt_err err;
  tt_dataset ds;
  int rc;
  err.msg[0] = 0;
  /* bounds: a record of at most 16384 x 16384 x 4 (the command line's --size and --channels) */
  if (!source || c < 0 || c > 4 || h < 0 || h > 16384 || w < 0 || w > 16384 || max_megapixels < 0) {
    if (errbuf && errsize)
      snprintf(errbuf, errsize, "tt_pack: %s", !source ? "no source given"
               : "c must be 1 to 4, h and w 1 to 16384, max_megapixels >= 0 (0 for each: the default)");
    return -1;
  }
  if (!out) out = stdout;
  if (!prefix) {
    rc = pack_recipe(out, source, &err);
  } else {
    char pre[TT_PATH_MAX];
    memset(&ds, 0, sizeof ds);
    struct stat st;
    pack_prefix(pre, sizeof pre, prefix);
    if (stat(pre, &st) == 0 && S_ISDIR(st.st_mode)) { /* a directory: DIR/<SOURCE's base name> */
      char src[TT_PATH_MAX];
      const char *b;
      pack_prefix(src, sizeof src, source);
      b = strrchr(src, '/') ? strrchr(src, '/') + 1 : src;
      if (strlen(pre) + strlen(b) + 2 > sizeof pre) {
        tt_fail(&err, "%.400s/%.400s: output prefix too long", pre, b);
        rc = -1;
        goto out;
      }
      strcat(pre, "/");
      strcat(pre, b);
    }
    rc = pack_scan(source, c > 0 ? c : 3, h > 0 ? h : 224, w > 0 ? w : 224, 0, max_megapixels, NULL, &ds, &err) ||
         pack_write(out, source, &ds, pre, &err);
    tt_dataset_free(&ds);
  }
out:
  if (rc && errbuf && errsize) snprintf(errbuf, errsize, "%s", err.msg);
  return rc ? -1 : 0;
}
