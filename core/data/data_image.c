/* core/data/data_image.c — image folders (one subfolder per class) and list files ("path label"
 * per line). A scan keeps paths and labels only (a streaming data set: the loader decodes
 * each batch, core/data/decode.c); tt_dataset_decode_all decodes every image into memory instead,
 * on several threads (small sets and the tests). What is not a regular file is skipped at
 * the scan, a corrupt image when it is decoded; each is counted and warned about. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "dataset.h"
#include "decode.h"
#include "../base/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define DATA_MAX_THREADS 16

/* One scanned entry: its path (owned, malloc'd) and its class label. */
typedef struct data_item {
  char *path;
  int label;
} data_item;

/* A growable array of scanned entries (n used of cap); data_items_free frees the paths too. */
typedef struct data_items {
  data_item *v;
  int n, cap;
} data_items;

/* Appends a copy of path with its label, doubling the array when full (256 first). Returns
 * 0, or -1 with err (out of memory); the array is unchanged on failure. */
static int data_items_push(data_items *a, const char *path, int label, tt_err *err) {
  size_t len = strlen(path);
  char *copy;
  if (a->n == a->cap) {
    int cap = a->cap ? a->cap * 2 : 256;
    data_item *v = (data_item *)realloc(a->v, sizeof(data_item) * (size_t)cap);
    if (!v) return tt_fail(err, "out of host memory listing %d images", a->n);
    a->v = v;
    a->cap = cap;
  }
  copy = (char *)tt_malloc(len + 1, "image path", err);
  if (!copy) return -1;
  memcpy(copy, path, len + 1);
  a->v[a->n].path = copy;
  a->v[a->n].label = label;
  a->n++;
  return 0;
}

/* Frees every path and the array, and leaves *a empty (safe to free twice). */
static void data_items_free(data_items *a) {
  int i;
  for (i = 0; i < a->n; i++) free(a->v[i].path);
  free(a->v);
  memset(a, 0, sizeof *a);
}

/* ---- From the scanned entries to a streaming data set ---- */

/* Says "PATH: WHAT (REASON)" through warn when there is one (folder and list scans). */
static void data_warn(tt_warn_fn warn, void *ud, const char *path, const char *what, const char *reason) {
  if (warn) {
    char line[4400];
    snprintf(line, sizeof line, "%s: %s (%s)", path, what, reason);
    warn(ud, line);
  }
}

/* Whether a file name ends in an image extension the decoders read (any case), as torchvision's
 * ImageFolder picks its files: a folder's README or notes are not samples. */
static int data_image_name(const char *path) {
  static const char *const ext[] = {"jpg", "jpeg", "png", "bmp", "pgm", "ppm", "pnm", NULL};
  const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
  int i;
  if (!dot || (slash && dot < slash)) return 0;
  for (i = 0; ext[i]; i++)
    if (!strcasecmp(dot + 1, ext[i])) return 1;
  return 0;
}

/* Moves the entries that are regular files (or links to one) into ds as a streaming data set:
 * paths and labels only, nothing decoded. The rest (a directory, a pipe, a device, a dangling
 * link; with by_name, a file whose name has no image extension) is counted in ds->skipped and
 * warned about. `where` names the folder or list file.
 * Shared by the folder and list scans, so both skip, count and warn alike. */
static int data_items_to_dataset(data_items *items, int classes, const char *where, int by_name, int c, int h, int w,
                                 tt_dataset *ds, tt_err *err, tt_warn_fn warn, void *ud) {
  int i, k = 0;
  memset(ds, 0, sizeof *ds);
  if (items->n == 0)
    return tt_fail(err, "%s: no image files found; put PNG/JPEG/BMP files there (one subfolder per class)",
                   where);
  ds->paths = (char **)tt_calloc((size_t)items->n, sizeof(char *), "image paths", err);
  ds->labels = (int32_t *)tt_malloc(sizeof(int32_t) * (size_t)items->n, "labels", err);
  if (!ds->paths || !ds->labels) {
    tt_dataset_free(ds);
    return -1;
  }
  for (i = 0; i < items->n; i++) {
    char why[TT_DECODE_REASON_MAX];
    if (tt_file_check_kind(items->v[i].path, why) != 0 ||
        (by_name && !data_image_name(items->v[i].path) &&
         snprintf(why, sizeof why, "not an image file name: .jpg, .jpeg, .png, .bmp, .pgm, .ppm or .pnm") > 0)) {
      ds->skipped++;
      data_warn(warn, ud, items->v[i].path, "skipped", why);
      continue;
    }
    ds->paths[k] = items->v[i].path;
    items->v[i].path = NULL;
    ds->labels[k++] = items->v[i].label;
  }
  ds->n = k;
  ds->c = c;
  ds->h = h;
  ds->w = w;
  ds->classes = classes;
  snprintf(ds->source, sizeof ds->source, "%s", where);
  if (k == 0) {
    tt_dataset_free(ds);
    return tt_fail(err, "%s: none of its %d entries is an image file; check the files (see the warnings)", where,
                   items->n);
  }
  return 0;
}

/* ---- Decoding all files on several threads (tt_dataset_decode_all) ---- */

typedef struct data_job {
  const tt_dataset *ds;
  int start, count; /* the samples [start, start + count) */
  uint8_t *images;  /* [count, c, h, w] */
  char *reasons;    /* [count][TT_DECODE_REASON_MAX]; "" = decoded */
  int next;         /* next item to claim, under mu */
  pthread_mutex_t mu;
} data_job;

/* A decode thread of tt_dataset_decode_range: claims the next sample under j->mu and decodes
 * it into its own image and reason slot, so the threads share nothing else and the bytes do
 * not depend on which thread decoded what. */
static void *data_worker(void *arg) {
  data_job *j = (data_job *)arg;
  const tt_dataset *ds = j->ds;
  size_t per = (size_t)ds->c * ds->h * ds->w;
  for (;;) {
    int i;
    pthread_mutex_lock(&j->mu);
    i = j->next++;
    pthread_mutex_unlock(&j->mu);
    if (i >= j->count) break;
    tt_image_decode_file(ds->paths[j->start + i], ds->c, ds->h, ds->w, ds->max_pixels, j->images + per * i,
                         j->reasons + (size_t)TT_DECODE_REASON_MAX * i);
  }
  return NULL;
}

/* Decodes samples [start, start + count) on up to one thread per core (at most
 * DATA_MAX_THREADS, on this thread when none starts); every result is written, "" or why. */
void tt_dataset_decode_range(const tt_dataset *ds, int start, int count, uint8_t *images, char *reasons) {
  pthread_t th[DATA_MAX_THREADS];
  data_job job;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int nth = ncpu > 0 ? (int)ncpu : 2, started = 0, i;
  memset(&job, 0, sizeof job);
  job.ds = ds, job.start = start, job.count = count, job.images = images, job.reasons = reasons;
  if (nth > DATA_MAX_THREADS) nth = DATA_MAX_THREADS;
  if (nth > count) nth = count;
  pthread_mutex_init(&job.mu, NULL);
  for (i = 0; i < nth; i++)
    if (pthread_create(&th[started], NULL, data_worker, &job) == 0) started++;
  if (started == 0) data_worker(&job); /* no threads available: decode here */
  for (i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&job.mu);
}

/* Counts one failure of ds and applies the loader's rule (names the first few, then counts;
 * fails over the set's max_failed share) for the decoders that run outside a loader. */
int tt_data_count_failure(const tt_dataset *ds, int *failed, const char *path, const char *why, tt_warn_fn warn,
                          void *ud, tt_err *err) {
  double share = ds->max_failed_set ? ds->max_failed : TT_DEFAULT_MAX_FAILED;
  ++*failed;
  if (*failed <= TT_LOADER_WARN_FIRST) {
    data_warn(warn, ud, path, "skipped", why);
  } else if (*failed == TT_LOADER_WARN_FIRST + 1 && warn) {
    char line[TT_PATH_MAX + 160];
    snprintf(line, sizeof line, "%s: more images fail to decode; counted, not listed", ds->source);
    warn(ud, line);
  }
  if (*failed > share * ds->n)
    return tt_fail(err,
                   "%s: %d of its %d images failed to decode, over max_failed = %g of the set ([data]); stopping: fix or "
                   "remove the files (the first are named above) or raise max_failed",
                   ds->source, *failed, ds->n, share);
  return 0;
}

#define DATA_DECODE_CHUNK 256 /* decoded, then counted, a chunk at a time: a set over its share stops early */

/* Turns a streaming set into an in-memory one: decodes DATA_DECODE_CHUNK samples at a time,
 * keeps the ones that decode (compacting images and labels), frees the paths. Returns 0, or
 * -1 with err when more than the max_failed share fails or nothing decodes. */
int tt_dataset_decode_all(tt_dataset *ds, tt_err *err, tt_warn_fn warn, void *ud) {
  data_job job;
  int i, k = 0, n = ds->n, start, failed = 0, rc = 0;
  size_t per = (size_t)ds->c * ds->h * ds->w;
  if (ds->images || !ds->paths) return 0; /* in memory already */
  memset(&job, 0, sizeof job);
  job.images = (uint8_t *)tt_malloc(per * (size_t)n, "decoded images", err);
  job.reasons = (char *)tt_calloc((size_t)DATA_DECODE_CHUNK, TT_DECODE_REASON_MAX, "decode status", err);
  if (!job.images || !job.reasons) {
    free(job.images);
    free(job.reasons);
    return -1;
  }
  for (start = 0; start < n && rc == 0; start += DATA_DECODE_CHUNK) {
    int cnt = n - start < DATA_DECODE_CHUNK ? n - start : DATA_DECODE_CHUNK;
    tt_dataset_decode_range(ds, start, cnt, job.images + per * (size_t)start, job.reasons);
    for (i = start; i < start + cnt && rc == 0; i++) { /* in data set order, so the output is reproducible */
      const char *r = job.reasons + (size_t)TT_DECODE_REASON_MAX * (i - start);
      if (r[0]) {
        /* the same rule as the loader's: the first few named, then counted, stop over the share */
        if (tt_data_count_failure(ds, &failed, ds->paths[i], r, warn, ud, err) != 0) rc = -1;
        continue;
      }
      if (k != i) memmove(job.images + per * k, job.images + per * i, per);
      ds->labels[k++] = ds->labels[i];
    }
  }
  free(job.reasons);
  ds->skipped += failed;
  if (rc) {
    free(job.images);
    tt_dataset_free(ds);
    return -1;
  }
  for (i = 0; i < n; i++) free(ds->paths[i]);
  free(ds->paths);
  ds->paths = NULL;
  ds->images = job.images;
  ds->n = k;
  if (k == 0) {
    tt_fail(err, "%s: none of its %d image files could be decoded; check the files (see the warnings)", ds->source,
            n + ds->skipped - failed);
    tt_dataset_free(ds);
    return -1;
  }
  if (k < n) {
    uint8_t *shrunk = (uint8_t *)realloc(job.images, per * (size_t)k);
    if (shrunk) ds->images = shrunk;
  }
  return 0;
}

/* ---- Folders ---- */

static int data_cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names of the entries of dir, whatever their kind (the caller looks at each);
 * hidden entries (".", "..", ".DS_Store", ...) are ignored. */
static int data_list_dir(const char *dir, char ***out, int *count, tt_err *err) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char **v = NULL;
  int n = 0, cap = 0;
  *out = NULL;
  *count = 0;
  if (!d) return tt_fail(err, "%s: cannot open directory (%s); check [data] paths in the recipe", dir, strerror(errno));
  while ((e = readdir(d)) != NULL) {
    size_t len;
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      char **nv;
      int ncap = cap ? cap * 2 : 64;
      nv = (char **)realloc(v, sizeof(char *) * (size_t)ncap);
      if (!nv) break;
      v = nv;
      cap = ncap;
    }
    len = strlen(e->d_name);
    v[n] = (char *)malloc(len + 1);
    if (!v[n]) break;
    memcpy(v[n], e->d_name, len + 1);
    n++;
  }
  closedir(d);
  if (e != NULL) { /* stopped early: out of memory */
    int i;
    for (i = 0; i < n; i++) free(v[i]);
    free(v);
    return tt_fail(err, "%s: out of host memory listing the directory", dir);
  }
  if (n > 1) qsort(v, (size_t)n, sizeof(char *), data_cmp_str);
  *out = v;
  *count = n;
  return 0;
}

/* The class subfolders of root (sorted). Every other entry is warned about: a file, a
 * dangling link or a pipe at the top is not a class, and saying so beats a silent miss. */
static int data_list_classes(const char *root, char ***out, int *count, tt_err *err, tt_warn_fn warn,
                             void *ud) {
  char **v;
  int n, i, k = 0;
  if (data_list_dir(root, &v, &n, err) != 0) return -1;
  for (i = 0; i < n; i++) {
    char full[4096], why[TT_DECODE_REASON_MAX];
    struct stat st;
    if (snprintf(full, sizeof full, "%s/%s", root, v[i]) < (int)sizeof full && stat(full, &st) == 0 &&
        S_ISDIR(st.st_mode)) {
      v[k++] = v[i];
      continue;
    }
    if (tt_file_check_kind(full, why) == 0) snprintf(why, sizeof why, "a regular file");
    if (warn) {
      char line[4400];
      snprintf(line, sizeof line, "%s: ignored (%s; not a class subfolder)", full, why);
      warn(ud, line);
    }
    free(v[i]);
  }
  *out = v;
  *count = k;
  return 0;
}

/* Frees an array of n names from data_list_dir or data_list_classes. */
static void data_free_names(char **v, int n) {
  int i;
  for (i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* A folder set: the entries of each class subfolder (sorted, so labels and order do not
 * depend on the file system) become streaming samples labelled by the subfolder's index
 * (data_items_to_dataset drops what is not a regular image file, with a warning);
 * ds->class_names keeps the subfolder names. Returns 0, or -1 with err (no class folders). */
int tt_dataset_scan_folder(const char *dir, int c, int h, int w, tt_dataset *ds, tt_err *err, tt_warn_fn warn,
                           void *ud) {
  char **classes = NULL;
  int nclasses = 0, k, rc = -1;
  data_items items;
  memset(&items, 0, sizeof items);
  memset(ds, 0, sizeof *ds);
  if (data_list_classes(dir, &classes, &nclasses, err, warn, ud) != 0) return -1;
  if (nclasses == 0) {
    tt_fail(err, "%s: no class subfolders; put the images of each class in their own subfolder", dir);
    goto done;
  }
  for (k = 0; k < nclasses; k++) /* a class's name goes into the weights' JSON metadata, which is UTF-8 */
    if (!tt_utf8_valid(classes[k])) {
      char shown[256];
      size_t m = 0;
      for (const unsigned char *q = (const unsigned char *)classes[k]; *q && m + 5 < sizeof shown; q++)
        m += (size_t)snprintf(shown + m, sizeof shown - m, *q < 0x80 && *q >= 0x20 ? "%c" : "\\x%02x", *q);
      tt_fail(err, "%s: the class folder '%s' is not named in UTF-8 (a Latin-1 name?); class names go into the "
              "weights' JSON metadata: rename the folder in UTF-8", dir, shown);
      goto done;
    }
  for (k = 0; k < nclasses; k++) {
    char sub[4096];
    char **files = NULL;
    int nfiles = 0, i;
    if (snprintf(sub, sizeof sub, "%s/%s", dir, classes[k]) >= (int)sizeof sub) {
      tt_fail(err, "%s/%s: path too long (limit 4095 bytes); use shorter names", dir, classes[k]);
      goto done;
    }
    /* every entry becomes an item: what is not a regular file is skipped with its reason */
    if (data_list_dir(sub, &files, &nfiles, err) != 0) goto done;
    if (!nfiles && warn) { /* still a class (labels keep the folders' order), but say so: often a mistake */
      char w[4200];
      snprintf(w, sizeof w, "%s: warning: the class folder is empty: class %d ('%s') has no images", sub, k, classes[k]);
      warn(ud, w);
    }
    for (i = 0; i < nfiles; i++) {
      char full[4096];
      if (snprintf(full, sizeof full, "%s/%s", sub, files[i]) >= (int)sizeof full) {
        tt_fail(err, "%s/%s: path too long (limit 4095 bytes); use shorter names", sub, files[i]);
        data_free_names(files, nfiles);
        goto done;
      }
      if (data_items_push(&items, full, k, err) != 0) {
        data_free_names(files, nfiles);
        goto done;
      }
    }
    data_free_names(files, nfiles);
  }
  rc = data_items_to_dataset(&items, nclasses, dir, 1, c, h, w, ds, err, warn, ud);
  if (rc == 0) { /* the class names go with the data set */
    ds->class_names = classes;
    classes = NULL;
    nclasses = 0;
  }
done:
  data_free_names(classes, nclasses);
  data_items_free(&items);
  return rc;
}

/* ---- List files ---- */

/* A list file: each line "path label" becomes a streaming sample (blank lines and '#' lines
 * skipped), a relative path taken from the list file's directory. Returns 0, or -1 with err
 * naming file:line (a bad line, a negative label, a label >= max_classes when max_classes > 0). */
int tt_dataset_scan_list(const char *list_path, int c, int h, int w, int max_classes, tt_dataset *ds, tt_err *err,
                         tt_warn_fn warn, void *ud) {
  void *buf = NULL;
  size_t size = 0;
  char *text, *line, *next;
  char base[4096];
  const char *slash;
  int lineno = 0, maxl = -1, rc = -1;
  data_items items;
  memset(&items, 0, sizeof items);
  memset(ds, 0, sizeof *ds);
  if (tt_read_file(list_path, &buf, &size, err) != 0) return -1;
  slash = strrchr(list_path, '/');
  if (slash) {
    size_t n = (size_t)(slash - list_path);
    if (n >= sizeof base) n = sizeof base - 1;
    memcpy(base, list_path, n);
    base[n] = 0;
  } else {
    strcpy(base, ".");
  }
  text = (char *)buf;
  for (line = text; line && *line; line = next) {
    char *end, *lab, *stop, full[4096];
    long v;
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    lineno++;
    end = line + strlen(line);
    while (end > line && (end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t')) *--end = 0;
    while (*line == ' ' || *line == '\t') line++;
    if (!*line || *line == '#') continue;
    lab = end;
    while (lab > line && lab[-1] != ' ' && lab[-1] != '\t') lab--;
    if (lab == line) {
      tt_fail(err, "%s:%d: expected \"path label\", found only \"%s\"; add the class index after the path",
              list_path, lineno, line);
      goto done;
    }
    errno = 0;
    v = strtol(lab, &stop, 10);
    if (*stop || errno || v < 0 || v > 1000000) {
      tt_fail(err, "%s:%d: expected a class index (integer >= 0) at the end of the line, found \"%s\"", list_path,
              lineno, lab);
      goto done;
    }
    if (max_classes > 0 && v >= max_classes) {
      tt_fail(err, "%s:%d: label %ld is not below [net] classes = %d; fix the label or raise classes", list_path,
              lineno, v, max_classes);
      goto done;
    }
    end = lab;
    while (end > line && (end[-1] == ' ' || end[-1] == '\t')) end--;
    *end = 0;
    if ((line[0] == '/' ? snprintf(full, sizeof full, "%s", line)
                        : snprintf(full, sizeof full, "%s/%s", base, line)) >= (int)sizeof full) {
      tt_fail(err, "%s:%d: path too long (limit 4095 bytes); use a shorter path", list_path, lineno);
      goto done;
    }
    if (data_items_push(&items, full, (int)v, err) != 0) goto done;
    if ((int)v > maxl) maxl = (int)v;
  }
  if (items.n == 0) {
    tt_fail(err, "%s: no entries; write one \"path label\" line per image", list_path);
    goto done;
  }
  rc = data_items_to_dataset(&items, maxl + 1, list_path, 0, c, h, w, ds, err, warn, ud);
done:
  free(buf);
  data_items_free(&items);
  return rc;
}

/* predict's decode: the evaluation crop of cfg ([data] resize or fit) and its pixel limit;
 * out is the caller's [c, h, w] buffer. */
int tt_image_decode_eval(const char *path, const tt_data_cfg *cfg, int c, int h, int w, uint8_t *out, tt_err *err) {
  char reason[TT_DECODE_REASON_MAX];
  tt_crop crop;
  tt_crop_from_cfg(cfg, 0, &crop);
  if (tt_image_decode_file_crop(path, c, h, w, tt_max_pixels(cfg->max_megapixels), &crop, out, reason))
    return tt_fail(err, "%s: %s", path, reason);
  return 0;
}

int tt_dir_entries(const char *dir, char ***names, int *n, tt_err *err) { return data_list_dir(dir, names, n, err); }

void tt_dir_entries_free(char **names, int n) { data_free_names(names, n); }

/* ---- Scanned and decoded into memory ---- */

/* A folder set scanned, then decoded into memory (tt_dataset_decode_all). */
int tt_dataset_load_folder(const char *dir, int c, int h, int w, tt_dataset *ds, tt_err *err, tt_warn_fn warn,
                           void *ud) {
  if (tt_dataset_scan_folder(dir, c, h, w, ds, err, warn, ud) != 0) return -1;
  return tt_dataset_decode_all(ds, err, warn, ud);
}

/* A list set scanned (labels unbounded), then decoded into memory. */
int tt_dataset_load_list(const char *list_path, int c, int h, int w, tt_dataset *ds, tt_err *err,
                         tt_warn_fn warn, void *ud) {
  if (tt_dataset_scan_list(list_path, c, h, w, 0, ds, err, warn, ud) != 0) return -1;
  return tt_dataset_decode_all(ds, err, warn, ud);
}
