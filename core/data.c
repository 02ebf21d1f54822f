/* core/data.c — the tt_dataset_load dispatcher from a recipe's [data] section to the
 * readers (data_idx.c, data_image.c), and the deterministic synthetic set. */
#include "data.h"

#include <stdlib.h>
#include <string.h>

#include "../kernels/kernel_math.h"

void tt_dataset_free(tt_dataset *ds) {
  int i;
  if (!ds) return;
  if (ds->paths)
    for (i = 0; i < ds->n; i++) free(ds->paths[i]);
  if (ds->class_names)
    for (i = 0; i < ds->classes; i++) free(ds->class_names[i]);
  free(ds->paths);
  free(ds->class_names);
  free(ds->images);
  free(ds->labels);
  memset(ds, 0, sizeof *ds);
}

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

int tt_dataset_load(const tt_data_cfg *cfg, int train, int c, int h, int w, tt_dataset *ds, tt_err *err,
                    tt_warn_fn warn, void *ud) {
  const char *path = train ? cfg->train : cfg->test;
  const char *labels = train ? cfg->train_labels : cfg->test_labels;
  const char *key = train ? "train" : "test";
  memset(ds, 0, sizeof *ds);
  if (c <= 0 || h <= 0 || w <= 0)
    return tt_fail(err, "dataset: bad input shape %dx%dx%d; check the [input] section", c, h, w);
  if (cfg->format == TT_DATA_SYNTHETIC)
    return tt_dataset_synthetic(train ? 1024 : 256, c, h, w, cfg->classes > 0 ? cfg->classes : 10, train ? 1 : 2, ds, err);
  if (cfg->format == TT_DATA_NONE)
    return tt_fail(err, "[data] (recipe line %d): no format given; set format = idx, folder, list or synthetic",
                   cfg->line);
  if (!path[0])
    return tt_fail(err, "[data] (recipe line %d): no %s path; set %s = ... in the recipe", cfg->line, key, key);
  switch (cfg->format) {
  case TT_DATA_IDX:
    if (!labels[0])
      return tt_fail(err, "[data] (recipe line %d): idx format needs %s_labels = <labels file>", cfg->line, key);
    return tt_dataset_load_idx(path, labels, c, h, w, ds, err);
  case TT_DATA_FOLDER:
  case TT_DATA_LIST: { /* streaming: the loader decodes each batch */
    int rc = cfg->format == TT_DATA_FOLDER ? tt_dataset_scan_folder(path, c, h, w, ds, err, warn, ud)
                                           : tt_dataset_scan_list(path, c, h, w, ds, err, warn, ud);
    ds->max_pixels = cfg->max_megapixels > 0 ? (long long)cfg->max_megapixels * 1000000 : 0;
    return rc;
  }
  default: break;
  }
  return tt_fail(err, "[data] (recipe line %d): unknown format %d; use idx, folder, list or synthetic", cfg->line,
                 (int)cfg->format);
}
