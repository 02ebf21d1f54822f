/* core/data/data.c — the tt_dataset_load dispatcher from a recipe's [data] section to the
 * readers (data_idx.c, data_image.c, data_npy.c), and the deterministic synthetic set. The
 * readers use dataset.c and crop.c, never this file, so the calls run one way. */
#include "dataset.h"
#include "decode.h"
#include "../base/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/kernel_math.h"

/* Learnable but not trivial: each class is a bright rectangle at a class-dependent place
 * and channel mix, over uniform noise. */
int tt_dataset_synthetic(int n, int c, int h, int w, int classes, uint64_t seed, tt_dataset *ds, tt_err *err) {
  int i, ch, y, x;
  uint64_t s = seed ^ 0x5EEDDA7A5EEDDA7Aull;
  memset(ds, 0, sizeof *ds);
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || classes <= 0)
    return tt_fail(err, "synthetic data: bad shape n=%d c=%d h=%d w=%d classes=%d; check the [input] shape", n,
                   c, h, w, classes);
  ds->images = (uint8_t *)tt_malloc((size_t)n * c * h * w, "synthetic images", err);
  ds->labels = (int32_t *)tt_malloc(sizeof(int32_t) * (size_t)n, "synthetic labels", err);
  if (!ds->images || !ds->labels) {
    tt_dataset_free(ds);
    return -1;
  }
  ds->n = n;
  ds->c = c;
  ds->h = h;
  ds->w = w;
  ds->classes = classes;
  for (i = 0; i < n; i++) {
    int lab = (int)(tt_splitmix_next(&s) % (uint64_t)classes);
    int y0 = (lab * 3) % (h > 2 ? h / 2 : 1), x0 = (lab * 5) % (w > 2 ? w / 2 : 1);
    uint8_t *img = ds->images + (size_t)i * c * h * w;
    ds->labels[i] = lab;
    for (ch = 0; ch < c; ch++)
      for (y = 0; y < h; y++)
        for (x = 0; x < w; x++) {
          int v = (int)(tt_splitmix_next(&s) & 127);
          int inside = y >= y0 && y < y0 + (h + 1) / 2 && x >= x0 && x < x0 + (w + 1) / 2;
          if (inside && ((lab + ch) % 2 == 0 || c == 1)) v += 128;
          img[((size_t)ch * h + y) * w + x] = (uint8_t)v;
        }
  }
  return 0;
}

/* The reader for cfg->format, for the train or test split: the set is loaded in memory (idx,
 * synthetic, npy mapped) or scanned for streaming (folder, list: [data]'s pixel limit and
 * failure share set on it). 0, or -1 with err naming the recipe line or the file at fault. */
int tt_dataset_load(const tt_data_cfg *cfg, int train, int c, int h, int w, tt_dataset *ds, tt_err *err,
                    tt_warn_fn warn, void *ud) {
  const char *path = train ? cfg->train : cfg->test;
  const char *labels = train ? cfg->train_labels : cfg->test_labels;
  const char *key = train ? "train" : "test";
  memset(ds, 0, sizeof *ds);
  if (c <= 0 || h <= 0 || w <= 0)
    return tt_fail(err, "dataset: bad input shape %dx%dx%d; check the [input] section", c, h, w);
  if (cfg->format == TT_DATA_SYNTHETIC) /* [data] synthetic_size sets the training split's images */
    return tt_dataset_synthetic(train ? (cfg->synthetic_size > 0 ? cfg->synthetic_size : TT_SYNTHETIC_TRAIN) : 256, c,
                                h, w, cfg->classes > 0 ? cfg->classes : 10, train ? 1 : 2, ds, err);
  if (cfg->format == TT_DATA_NONE)
    return tt_fail(err, "[data] (recipe line %d): no format given; set format = idx, folder, list, npy or synthetic",
                   cfg->line);
  if (!path[0])
    return tt_fail(err, "[data] (recipe line %d): no %s path; set %s = ... in the recipe", cfg->line, key, key);
  switch (cfg->format) {
  case TT_DATA_IDX:
    if (!labels[0])
      return tt_fail(err, "[data] (recipe line %d): idx format needs %s_labels = <labels file>", cfg->line, key);
    return tt_dataset_load_idx(path, labels, c, h, w, ds, err);
  case TT_DATA_NPY:
    if (!labels[0])
      return tt_fail(err, "[data] (recipe line %d): npy format needs %s_labels = <labels .npy file>", cfg->line, key);
    return tt_dataset_load_npy(path, labels, c, h, w, cfg->classes, ds, err);
  case TT_DATA_FOLDER:
  case TT_DATA_LIST: { /* streaming: the loader decodes each batch */
    int rc = cfg->format == TT_DATA_FOLDER ? tt_dataset_scan_folder(path, c, h, w, ds, err, warn, ud)
                                           : tt_dataset_scan_list(path, c, h, w, cfg->classes, ds, err, warn, ud);
    ds->max_pixels = tt_max_pixels(cfg->max_megapixels);
    ds->max_failed = cfg->max_failed, ds->max_failed_set = cfg->max_failed_set;
    return rc;
  }
  default: break;
  }
  return tt_fail(err, "[data] (recipe line %d): unknown format %d; use idx, folder, list, npy or synthetic", cfg->line,
                 (int)cfg->format);
}

/* ---- The run's classes ---- */

/* n class names into ds->class_names: the first n comma-separated names of text (each
 * trimmed), or "0" .. "n-1" when text is NULL (the caller checks the count). 0, or -1 with
 * err when out of memory (what was made is freed with the set). */
static int data_set_names(tt_dataset *ds, int n, const char *text, tt_err *err) {
  int i;
  char **v = (char **)tt_calloc((size_t)n, sizeof(char *), "class names", err);
  if (!v) return -1;
  for (i = 0; i < n; i++) {
    char num[16];
    const char *name = num;
    size_t len;
    if (text) { /* the i-th comma-separated name, spaces around it dropped */
      const char *e;
      while (*text == ' ' || *text == '\t') text++;
      e = strchr(text, ',');
      len = e ? (size_t)(e - text) : strlen(text);
      name = text;
      text = e ? e + 1 : text + len;
      while (len > 0 && (name[len - 1] == ' ' || name[len - 1] == '\t')) len--;
    } else {
      snprintf(num, sizeof num, "%d", i);
      len = strlen(num);
    }
    v[i] = (char *)tt_malloc(len + 1, "class name", err);
    if (!v[i]) {
      ds->class_names = v, ds->classes = n; /* freed with the data set */
      return -1;
    }
    memcpy(v[i], name, len);
    v[i][len] = 0;
  }
  ds->class_names = v;
  ds->classes = n;
  return 0;
}

/* Gives the training set its `classes` names (folder names first, then numbers; else [data]
 * class_names; else "0", "1", ...). 0, or -1 with err when class_names has the wrong count. */
int tt_dataset_name_classes(const tt_data_cfg *cfg, int classes, tt_dataset *ds, tt_err *err) {
  int i, given = 0;
  if (ds->class_names) { /* a folder: its subfolders, more numbered up to [net] classes */
    char **v;
    if (ds->classes >= classes) return 0;
    v = (char **)realloc(ds->class_names, sizeof(char *) * (size_t)classes);
    if (!v) return tt_fail(err, "out of host memory naming %d classes", classes);
    ds->class_names = v;
    for (i = ds->classes; i < classes; i++) {
      char num[16];
      snprintf(num, sizeof num, "%d", i);
      v[i] = (char *)tt_malloc(strlen(num) + 1, "class name", err);
      if (!v[i]) return -1;
      strcpy(v[i], num);
      ds->classes = i + 1;
    }
    return 0;
  }
  if (cfg->class_names[0]) {
    const char *p;
    for (p = cfg->class_names, given = 1; *p; p++) given += *p == ',';
    if (given != classes)
      return tt_fail(err, "[data] (recipe line %d): class_names lists %d names but [net] classes = %d; give one name "
                     "per class", cfg->line, given, classes);
  }
  return data_set_names(ds, classes, given ? cfg->class_names : NULL, err);
}

/* Relabels a test folder by the training set's class order (names matched exactly) and drops
 * its own names; a set with no names is left alone. 0, or -1 with err naming a class missing. */
int tt_dataset_map_classes(tt_dataset *test, const tt_dataset *train, tt_err *err) {
  int *map, i, k;
  if (!test->class_names) return 0; /* labels are indices already (list, idx, synthetic) */
  if (!train->class_names)
    return tt_fail(err, "%s: a test folder needs a training set with class names to be mapped to", test->source);
  map = (int *)tt_malloc(sizeof(int) * (size_t)test->classes, "class map", err);
  if (!map) return -1;
  for (k = 0; k < test->classes; k++) {
    for (i = 0; i < train->classes && strcmp(test->class_names[k], train->class_names[i]); i++) {}
    if (i == train->classes) {
      tt_fail(err, "%s/%s: a test class the training set %s does not have; remove it from the test set or add it "
              "to training", test->source, test->class_names[k], train->source[0] ? train->source : "");
      free(map);
      return -1;
    }
    map[k] = i;
  }
  for (i = 0; i < test->n; i++) test->labels[i] = map[test->labels[i]];
  free(map);
  for (k = 0; k < test->classes; k++) free(test->class_names[k]);
  free(test->class_names);
  test->class_names = NULL;
  test->classes = train->classes;
  return 0;
}

/* The same against a weights or state file's class names (predict, eval); a file without
 * names leaves the test set as it is. */
int tt_dataset_map_classes_from(tt_dataset *test, const char *weights, tt_err *err) {
  tt_dataset train;
  int rc;
  if (!test->class_names) return 0;
  memset(&train, 0, sizeof train);
  snprintf(train.source, sizeof train.source, "of %s", weights);
  rc = tt_st_file_names(weights, TT_META_CLASSES, &train.class_names, &train.classes, err);
  if (!rc && train.class_names) rc = tt_dataset_map_classes(test, &train, err); /* older files have no names:
                                                                                * the test folder's own order is all there is */
  free(train.class_names); /* one allocation (tt_st_names_parse) */
  return rc;
}
