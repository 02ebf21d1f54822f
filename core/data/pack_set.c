/* core/data/pack_set.c — the library part of `tinytrain pack` (the command, tt_pack, is
 * core/app/pack.c): tt_pack_set decodes a scanned image folder (or list file) once into
 * fixed-size uint8 records, written as standard .npy files that numpy, PyTorch and format = npy
 * read:
 *   PREFIX-images.npy  (N, H, W, C) uint8, each image resized so its shorter side fits H x W
 *                      and centre-cropped (the transform of the folder reader, tt_image_decode)
 *   PREFIX-labels.npy  (N,) int32
 *   PREFIX-classes.json the class names, a JSON array of strings
 *   PREFIX-set.json    the manifest: what the other three must be (tt_npy_set_hash)
 * Memory stays bounded: images are decoded and written a chunk at a time. The four files are
 * written into a temporary directory beside them (DIR/.NAME.pack-XXXXXX) and renamed into
 * place when all are complete, the manifest first and the images file last (a reader refuses
 * files that disagree with the manifest, so a kill between renames leaves no mixed set that
 * is read); the next pack of the prefix removes what an interrupted one left. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "dataset.h"
#include "decode.h"
#include "../base/fileio.h"
#include "../base/safetensors.h"

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

/* PREFIX-labels.npy: the kept labels as (n,) little-endian int32, written atomically (a
 * temporary file renamed). 0, or -1 with err. */
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

/* PREFIX-classes.json: the class names as a JSON array, when the set has names (none: nothing
 * written, 0). 0, or -1 with err. */
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

/* Writes ds into the four files of PREFIX through a temporary directory beside them, then
 * renames them into place in the manifest's order. Returns 0 with *kept images written, or -1
 * with err and the old set (if any) left readable. */
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
