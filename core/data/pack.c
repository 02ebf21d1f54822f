/* core/data/pack.c — `tinytrain pack`: decodes an image folder (or list file) once into fixed-size
 * uint8 records, written as standard .npy files that numpy, PyTorch and format = npy read:
 *   PREFIX-images.npy  (N, H, W, C) uint8, each image resized so its shorter side fits H x W
 *                      and centre-cropped (the transform of the folder reader, tt_image_decode)
 *   PREFIX-labels.npy  (N,) int32
 *   PREFIX-classes.json the class names, a JSON array of strings
 *   PREFIX-set.json    the manifest: what the other three must be (tt_npy_set_hash)
 * Memory stays bounded: images are decoded and written a chunk at a time. The four files are
 * written into a temporary directory beside them (DIR/.NAME.pack-XXXXXX) and renamed into
 * place when all are complete, the manifest first and the images file last (a reader refuses
 * files that disagree with the manifest, so a kill between renames leaves no mixed set that
 * is read); the next pack of the prefix removes
 * what an interrupted one left. A PREFIX that is an existing directory means
 * DIR/<SOURCE's base name>. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "data.h"
#include "../base/fileio.h"
#include "../compile/recipe.h"
#include "../base/safetensors.h"
/* tt_pack is public: only a definition that sees its TT_API declaration is exported */
#include "../tinytrain.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PACK_CHUNK 64
#define PACK_HEADER 128 /* bytes of a .npy header as written here (a multiple of 64) */

/* A version 1.0 .npy header of exactly PACK_HEADER bytes. */
static void pack_npy_header(char *h, const char *descr, const long long *shape, int ndim) {
  char dict[PACK_HEADER];
  int n, i;
  n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (i = 0; i < ndim; i++) /* as numpy writes it: (5,) and (2, 3) */
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld%s", shape[i], i + 1 < ndim ? ", " : ndim == 1 ? "," : "");
  snprintf(dict + n, sizeof dict - (size_t)n, "), }");
  memcpy(h, "\x93NUMPY\x01\x00", 8);
  h[8] = (char)((PACK_HEADER - 10) & 0xff);
  h[9] = (char)((PACK_HEADER - 10) >> 8);
  memset(h + 10, ' ', PACK_HEADER - 10);
  memcpy(h + 10, dict, strlen(dict));
  h[PACK_HEADER - 1] = '\n';
}

/* Decodes ds a chunk at a time into PREFIX-images.npy (HWC records); the labels of the images
 * kept go to labels (n entries), their count to *kept. */
static int pack_images(const tt_dataset *ds, const char *prefix, int32_t *labels, int *kept, tt_warn_fn warn, void *ud,
                       tt_err *err) {
  char path[TT_PATH_MAX * 2 + 128], head[PACK_HEADER];
  size_t per = (size_t)ds->c * ds->h * ds->w, hw = (size_t)ds->h * ds->w, j;
  uint8_t *chw = (uint8_t *)tt_malloc(per * PACK_CHUNK, "pack chunk", err);
  uint8_t *hwc = (uint8_t *)tt_malloc(per, "pack record", err);
  char *reasons = (char *)tt_malloc((size_t)TT_DECODE_REASON_MAX * PACK_CHUNK, "pack status", err);
  long long shape[4] = {0, ds->h, ds->w, ds->c};
  tt_atomic_file f;
  int start, k, ch, rc = -1, failed = 0;
  snprintf(path, sizeof path, "%s-images.npy", prefix);
  *kept = 0;
  pack_npy_header(head, "|u1", shape, 4); /* the count is written again at the end */
  if (!chw || !hwc || !reasons || tt_atomic_open(&f, path, err) || tt_atomic_write(&f, head, PACK_HEADER, err)) goto done;
  for (start = 0, rc = 0; start < ds->n && rc == 0; start += PACK_CHUNK) {
    int cnt = ds->n - start < PACK_CHUNK ? ds->n - start : PACK_CHUNK;
    tt_dataset_decode_range(ds, start, cnt, chw, reasons);
    for (k = 0; k < cnt && rc == 0; k++) {
      const char *r = reasons + (size_t)TT_DECODE_REASON_MAX * k;
      if (r[0]) { /* the loader's rule: the first few named, then counted; over the share, stop */
        if (tt_data_count_failure(ds, &failed, ds->paths[start + k], r, warn, ud, err) != 0) {
          tt_atomic_discard(&f);
          rc = -1;
        }
        continue;
      }
      for (j = 0; j < hw; j++)
        for (ch = 0; ch < ds->c; ch++) hwc[j * ds->c + ch] = chw[per * k + (size_t)ch * hw + j];
      rc = tt_atomic_write(&f, hwc, per, err);
      labels[(*kept)++] = ds->labels[start + k];
    }
  }
  if (rc) goto done; /* the writer removed its temporary file */
  rc = -1;
  if (*kept == 0) {
    tt_atomic_discard(&f);
    tt_fail(err, "%s: none of its %d images could be decoded (see the warnings)", ds->source, ds->n);
    goto done;
  }
  shape[0] = *kept;
  pack_npy_header(head, "|u1", shape, 4);
  rc = tt_atomic_write_at(&f, head, PACK_HEADER, 0, err) || tt_atomic_commit(&f, err) ? -1 : 0;
done:
  free(chw);
  free(hwc);
  free(reasons);
  return rc;
}

static int pack_labels(const char *prefix, const int32_t *labels, int n, tt_err *err) {
  char path[TT_PATH_MAX * 2 + 128], head[PACK_HEADER];
  long long shape[1] = {n};
  unsigned char *b = (unsigned char *)tt_malloc((size_t)n * 4 + 1, "pack labels", err);
  int i, rc;
  if (!b) return -1;
  snprintf(path, sizeof path, "%s-labels.npy", prefix);
  pack_npy_header(head, "<i4", shape, 1);
  for (i = 0; i < n; i++) { /* little-endian whatever the host */
    uint32_t v = (uint32_t)labels[i];
    b[4 * i] = (unsigned char)v, b[4 * i + 1] = (unsigned char)(v >> 8);
    b[4 * i + 2] = (unsigned char)(v >> 16), b[4 * i + 3] = (unsigned char)(v >> 24);
  }
  {
    const void *chunks[2] = {head, b};
    size_t sizes[2] = {PACK_HEADER, (size_t)n * 4};
    rc = tt_write_file_atomic(path, chunks, sizes, 2, err);
  }
  free(b);
  return rc;
}

static int pack_classes(const char *prefix, const tt_dataset *ds, tt_err *err) {
  char path[TT_PATH_MAX * 2 + 128];
  tt_strbuf b;
  int rc;
  if (!ds->class_names) return 0;
  memset(&b, 0, sizeof b);
  tt_st_names_format(&b, (const char *const *)ds->class_names, ds->classes);
  tt_strbuf_put(&b, "\n", 1);
  snprintf(path, sizeof path, "%s-classes.json", prefix);
  if (b.oom) {
    free(b.p);
    return tt_fail(err, "out of host memory writing %s", path);
  }
  {
    const void *chunks[1] = {b.p};
    size_t sizes[1] = {b.n};
    rc = tt_write_file_atomic(path, chunks, sizes, 1, err);
  }
  free(b.p);
  return rc;
}

/* Renamed in this order: the manifest first, so that from then until the last rename the files
 * disagree with it and a reader refuses them (a killed pack leaves no set that looks whole but
 * is mixed); the images last, as before. */
#define PACK_FILES 4
static const char *const pack_suffix[PACK_FILES] = {"-set.json", "-labels.npy", "-classes.json", "-images.npy"};

/* PREFIX-set.json: the manifest of the three files just written under prefix. */
static int pack_manifest(const char *prefix, int has_classes, tt_err *err) {
  char img[TT_PATH_MAX * 2 + 128], lab[TT_PATH_MAX * 2 + 128], set[TT_PATH_MAX * 2 + 128], text[512];
  tt_npy_set_digest d;
  snprintf(img, sizeof img, "%s-images.npy", prefix);
  snprintf(lab, sizeof lab, "%s-labels.npy", prefix);
  snprintf(set, sizeof set, "%s-set.json", prefix);
  if (tt_npy_set_hash(img, lab, NULL, &d, err)) return -1;
  if (has_classes) {
    char names[TT_PATH_MAX * 2 + 128];
    tt_npy_set_digest c;
    snprintf(names, sizeof names, "%s-classes.json", prefix);
    if (tt_npy_set_hash(img, lab, names, &c, err)) return -1;
    d = c;
  }
  {
    const void *chunks[1] = {text};
    size_t sizes[1] = {(size_t)tt_npy_set_format(&d, text, sizeof text)};
    return tt_write_file_atomic(set, chunks, sizes, 1, err);
  }
}

/* Splits prefix into its directory (dir, "." when none) and base name. */
static void pack_split(const char *prefix, char *dir, char *base) {
  const char *slash = strrchr(prefix, '/');
  if (!slash) {
    strcpy(dir, ".");
    strcpy(base, prefix);
  } else {
    snprintf(dir, TT_PATH_MAX, "%.*s", slash == prefix ? 1 : (int)(slash - prefix), prefix);
    strcpy(base, slash + 1);
  }
}

/* Removes a temporary directory of this prefix's (its files, then itself). */
static void pack_remove_tmpdir(const char *tmpdir, const char *base) {
  char p[TT_PATH_MAX * 2 + 64];
  int i;
  for (i = 0; i < PACK_FILES; i++) {
    snprintf(p, sizeof p, "%s/%s%s", tmpdir, base, pack_suffix[i]);
    unlink(p);
    snprintf(p, sizeof p, "%s/%s%s.tmp", tmpdir, base, pack_suffix[i]);
    unlink(p);
  }
  rmdir(tmpdir);
}

/* What an interrupted pack of this prefix left behind: its temporary directories
 * (DIR/.BASE.pack-XXXXXX) and the .tmp files of older versions (PREFIX-images.npy.tmp, ...). */
static void pack_remove_stale(const char *dir, const char *base, const char *prefix, tt_warn_fn warn, void *ud) {
  char lead[TT_PATH_MAX + 16], p[TT_PATH_MAX * 2 + 64];
  int i;
  snprintf(lead, sizeof lead, ".%s.pack-", base);
  {
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
      if (strncmp(de->d_name, lead, strlen(lead)) != 0 || strlen(de->d_name) != strlen(lead) + 6) continue;
      snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
      pack_remove_tmpdir(p, base);
      if (warn) {
        char line[TT_PATH_MAX * 2 + 160];
        snprintf(line, sizeof line, "%s: removed, left behind by an interrupted pack", p);
        warn(ud, line);
      }
    }
    if (d) closedir(d);
  }
  for (i = 0; i < PACK_FILES; i++) {
    snprintf(p, sizeof p, "%s%s.tmp", prefix, pack_suffix[i]);
    if (unlink(p) == 0 && warn) {
      char line[TT_PATH_MAX * 2 + 160];
      snprintf(line, sizeof line, "%s: removed, left behind by an interrupted pack", p);
      warn(ud, line);
    }
  }
}

/* The prefix's directory must be a writable directory, and the prefix itself nothing but a
 * regular file or nothing (a device such as /dev/null is refused). */
static int pack_check_prefix(const char *prefix, const char *dir, tt_err *err) {
  struct stat st;
  if (lstat(prefix, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
    return tt_fail(err, "%s: is %s; give an output prefix DIR/NAME in a directory (the files are NAME-images.npy, ...)",
                   prefix, tt_file_kind(st.st_mode));
  if (stat(dir, &st) != 0)
    return tt_fail(err, "%s: the output directory %s does not exist (%s); create it first", prefix, dir, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return tt_fail(err, "%s: %s is %s, not a directory", prefix, dir, tt_file_kind(st.st_mode));
  if (access(dir, W_OK) != 0)
    return tt_fail(err, "%s: the output directory %s is not writable (%s); choose another prefix", prefix, dir,
                   strerror(errno));
  return 0;
}

int tt_pack_set(const tt_dataset *ds, const char *prefix, int *kept, tt_warn_fn warn, void *ud, tt_err *err) {
  char dir[TT_PATH_MAX], base[TT_PATH_MAX], tmpdir[TT_PATH_MAX + 32], tmpprefix[TT_PATH_MAX * 2 + 32];
  char from[TT_PATH_MAX * 2 + 64], to[TT_PATH_MAX + 32];
  int32_t *labels;
  int rc, i;
  if (strlen(prefix) >= TT_PATH_MAX) return tt_fail(err, "%s: output prefix too long", prefix);
  pack_split(prefix, dir, base);
  if (!base[0]) return tt_fail(err, "%s: the output prefix needs a name after the directory (DIR/NAME)", prefix);
  if (pack_check_prefix(prefix, dir, err)) return -1;
  pack_remove_stale(dir, base, prefix, warn, ud);
  /* the set is written into a fresh directory beside the target, then renamed in, the manifest
   * first and the images last: a kill leaves the old set, or files that disagree with the new
   * manifest (refused by the reader), plus a temporary directory that the next run removes */
  snprintf(tmpdir, sizeof tmpdir, "%s/.%s.pack-XXXXXX", dir, base);
  if (!mkdtemp(tmpdir)) return tt_fail(err, "%s: cannot create a temporary directory in %s (%s)", prefix, dir, strerror(errno));
  snprintf(tmpprefix, sizeof tmpprefix, "%s/%s", tmpdir, base);
  labels = (int32_t *)tt_malloc(sizeof(int32_t) * (size_t)(ds->n ? ds->n : 1), "pack labels", err);
  rc = labels ? 0 : -1;
  if (!rc) rc = pack_images(ds, tmpprefix, labels, kept, warn, ud, err);
  if (!rc) rc = pack_labels(tmpprefix, labels, *kept, err);
  if (!rc) rc = pack_classes(tmpprefix, ds, err);
  if (!rc) rc = pack_manifest(tmpprefix, ds->class_names != NULL, err);
  free(labels);
  for (i = 0; i < PACK_FILES && !rc; i++) {
    snprintf(from, sizeof from, "%s%s", tmpprefix, pack_suffix[i]);
    snprintf(to, sizeof to, "%s%s", prefix, pack_suffix[i]);
    if (i == 2 && !ds->class_names) {
      unlink(to); /* an older set's names must not describe this one */
      continue;
    }
    if (rename(from, to) != 0) rc = tt_fail(err, "%s: cannot rename %s over it (%s)", to, from, strerror(errno));
  }
  pack_remove_tmpdir(tmpdir, base);
  return rc;
}

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
  fprintf(out, "\nto read them, in %s's [data]:\nformat = npy\ntrain = %s-images.npy\ntrain_labels = %s-labels.npy\n", recipe,
         ptr, ptr);
  if (m->data.test[0]) fprintf(out, "test = %s-images.npy\ntest_labels = %s-labels.npy\n", pte, pte);
  rc = 0;
done:
  tt_dataset_free(&tr);
  tt_dataset_free(&te);
  if (m) tt_model_free(m);
  free(m);
  return rc;
}

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
