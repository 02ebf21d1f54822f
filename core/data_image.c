/* core/data_image.c — image folders (one subfolder per class) and list files ("path label"
 * per line). Every image is decoded once at start with stb_image, on several threads, to
 * the recipe's channel count, resized so the shorter side fits and centre-cropped to h x w,
 * and stored as NCHW uint8. Unreadable files are skipped, counted and warned about.
 * (A packed, memory-mapped format that avoids decoding at every start is future work.) */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "data.h"
#include "fileio.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* stb is compiled here, file-static, so a program that also links its own stb does not
 * collide; its own warnings are not ours to fix. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-function" /* file-static stb: unused parts */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wshadow"
#endif
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#include <stb/stb_image.h>
#define STB_IMAGE_RESIZE_STATIC
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#define DATA_REASON_MAX 160
#define DATA_MAX_THREADS 16

typedef struct data_item {
  char *path;
  int label;
} data_item;

typedef struct data_items {
  data_item *v;
  int n, cap;
} data_items;

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

static void data_items_free(data_items *a) {
  int i;
  for (i = 0; i < a->n; i++) free(a->v[i].path);
  free(a->v);
  memset(a, 0, sizeof *a);
}

/* ---- Decoding one file ---- */

/* stb_image decodes some truncated files "successfully" (missing rows become grey or
 * zero). Catch the common cases from the container: PNG must end with an IEND chunk, JPEG
 * with an EOI marker (trailing padding allowed), BMP must be as long as its header says. */
static const char *data_check_complete(const unsigned char *b, size_t n) {
  size_t i, lo;
  if (n >= 8 && b[0] == 0x89 && b[1] == 'P' && b[2] == 'N' && b[3] == 'G') {
    lo = n > 64 ? n - 64 : 8;
    for (i = n >= 4 ? n - 4 : 0; i + 1 > lo; i--)
      if (memcmp(b + i, "IEND", 4) == 0) return NULL;
    return "truncated PNG: no IEND chunk at the end";
  }
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) {
    /* Inside entropy-coded data 0xFF is always stuffed as FF 00, so FF D9 near the end
     * can only be the real end-of-image marker. */
    lo = n > 1024 ? n - 1024 : 2;
    for (i = n - 2; i + 1 > lo; i--)
      if (b[i] == 0xFF && b[i + 1] == 0xD9) return NULL;
    return "truncated JPEG: no end-of-image marker";
  }
  if (n >= 14 && b[0] == 'B' && b[1] == 'M') {
    uint32_t size = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
    if (size > n) return "truncated BMP: shorter than its header says";
  }
  return NULL;
}

/* Whether path can be read as an image file; if not, writes why and returns -1. A dangling
 * symbolic link, a directory, a named pipe or a device in a class folder or a list is skipped
 * and named like a corrupt image, never silently passed over nor waited on. */
static int data_check_kind(const char *path, char *reason) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    snprintf(reason, DATA_REASON_MAX, "cannot open: %s", strerror(errno));
    return -1;
  }
  if (S_ISLNK(st.st_mode) && stat(path, &st) != 0) {
    int e = errno;
    char target[96]; /* long targets are cut: the reason fits DATA_REASON_MAX */
    ssize_t k = readlink(path, target, sizeof target - 1);
    target[k > 0 ? k : 0] = 0;
    if (e == ENOENT)
      snprintf(reason, DATA_REASON_MAX, "dangling symbolic link to '%s'", target);
    else
      snprintf(reason, DATA_REASON_MAX, "symbolic link to '%s': %.40s", target, strerror(e));
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(reason, DATA_REASON_MAX, "%s, not an image file", tt_file_kind(st.st_mode));
    return -1;
  }
  return 0;
}

/* tt_read_file's message without its leading "PATH: " (the warning names the path already). */
static void data_reason_from(const char *path, const tt_err *e, char *reason) {
  size_t n = strlen(path);
  const char *m = e->msg;
  if (strncmp(m, path, n) == 0 && m[n] == ':' && m[n + 1] == ' ') m += n + 2;
  snprintf(reason, DATA_REASON_MAX, "%.*s", DATA_REASON_MAX - 1, m);
}

/* Decodes path into out ([c, h, w]); on failure writes the reason and returns -1. */
static int data_decode_one(const char *path, int c, int h, int w, uint8_t *out, char *reason) {
  void *buf = NULL;
  size_t size = 0;
  tt_err e;
  unsigned char *px, *hwc;
  int iw, ih, comp, ch, y, x;
  const char *why;
  if (data_check_kind(path, reason) != 0) return -1;
  /* the reason comes from the failure itself, not from errno, which nothing here promised to
   * keep (a refused pipe or a short read leaves errno as it was) */
  if (tt_read_file(path, &buf, &size, &e) != 0) {
    data_reason_from(path, &e, reason);
    return -1;
  }
  if (size == 0 || size > 0x7fffffff) {
    free(buf);
    snprintf(reason, DATA_REASON_MAX, size ? "file too large" : "empty file");
    return -1;
  }
  why = data_check_complete((const unsigned char *)buf, size);
  if (why) {
    free(buf);
    snprintf(reason, DATA_REASON_MAX, "%s", why);
    return -1;
  }
  px = stbi_load_from_memory((const stbi_uc *)buf, (int)size, &iw, &ih, &comp, c);
  free(buf);
  if (!px) {
    const char *r = stbi_failure_reason();
    snprintf(reason, DATA_REASON_MAX, "%s", r ? r : "cannot decode");
    return -1;
  }
  if (iw == w && ih == h) {
    hwc = px;
  } else {
    /* Region of the source with the target's aspect ratio, centred: the shorter side
     * fits, the longer one is cropped. */
    float s0 = 0.f, t0 = 0.f, s1 = 1.f, t1 = 1.f;
    double src_aspect = (double)iw / ih, dst_aspect = (double)w / h;
    if (src_aspect > dst_aspect) {
      double keep = dst_aspect / src_aspect;
      s0 = (float)((1.0 - keep) / 2);
      s1 = (float)(s0 + keep);
    } else if (src_aspect < dst_aspect) {
      double keep = src_aspect / dst_aspect;
      t0 = (float)((1.0 - keep) / 2);
      t1 = (float)(t0 + keep);
    }
    hwc = (unsigned char *)malloc((size_t)h * w * c);
    if (!hwc) {
      stbi_image_free(px);
      snprintf(reason, DATA_REASON_MAX, "out of host memory resizing");
      return -1;
    }
    if (!stbir_resize_region(px, iw, ih, 0, hwc, w, h, 0, STBIR_TYPE_UINT8, c, STBIR_ALPHA_CHANNEL_NONE, 0,
                             STBIR_EDGE_CLAMP, STBIR_EDGE_CLAMP, STBIR_FILTER_DEFAULT, STBIR_FILTER_DEFAULT,
                             STBIR_COLORSPACE_LINEAR, NULL, s0, t0, s1, t1)) {
      stbi_image_free(px);
      free(hwc);
      snprintf(reason, DATA_REASON_MAX, "resize from %dx%d failed", iw, ih);
      return -1;
    }
    stbi_image_free(px);
  }
  for (ch = 0; ch < c; ch++)
    for (y = 0; y < h; y++)
      for (x = 0; x < w; x++) out[((size_t)ch * h + y) * w + x] = hwc[((size_t)y * w + x) * c + ch];
  if (hwc == px)
    stbi_image_free(px);
  else
    free(hwc);
  return 0;
}

/* ---- Decoding all files on several threads ---- */

typedef struct data_job {
  const data_items *items;
  int c, h, w;
  uint8_t *images;  /* [items->n, c, h, w] */
  char *reasons;    /* [items->n][DATA_REASON_MAX]; "" = decoded */
  int next;         /* next item to claim, under mu */
  pthread_mutex_t mu;
} data_job;

static void *data_worker(void *arg) {
  data_job *j = (data_job *)arg;
  size_t per = (size_t)j->c * j->h * j->w;
  for (;;) {
    int i;
    pthread_mutex_lock(&j->mu);
    i = j->next++;
    pthread_mutex_unlock(&j->mu);
    if (i >= j->items->n) break;
    if (data_decode_one(j->items->v[i].path, j->c, j->h, j->w, j->images + per * i,
                        j->reasons + (size_t)DATA_REASON_MAX * i) != 0 &&
        !j->reasons[(size_t)DATA_REASON_MAX * i])
      strcpy(j->reasons + (size_t)DATA_REASON_MAX * i, "cannot decode");
  }
  return NULL;
}

/* Decodes every item into ds, drops the failures (warning once per file, in list order so
 * the output is reproducible). `where` names the folder or list file for errors. */
static int data_decode_all(const data_items *items, int classes, const char *where, int c, int h, int w,
                           tt_dataset *ds, tt_err *err, tt_warn_fn warn, void *ud) {
  data_job job;
  pthread_t th[DATA_MAX_THREADS];
  int nth, started = 0, i, k = 0;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  size_t per = (size_t)c * h * w;
  memset(ds, 0, sizeof *ds);
  memset(&job, 0, sizeof job);
  if (items->n == 0)
    return tt_fail(err, "%s: no image files found; put PNG/JPEG/BMP files there (one subfolder per class)",
                   where);
  job.items = items;
  job.c = c;
  job.h = h;
  job.w = w;
  job.images = (uint8_t *)tt_malloc(per * (size_t)items->n, "decoded images", err);
  job.reasons = (char *)tt_calloc((size_t)items->n, DATA_REASON_MAX, "decode status", err);
  ds->labels = (int32_t *)tt_malloc(sizeof(int32_t) * (size_t)items->n, "labels", err);
  if (!job.images || !job.reasons || !ds->labels) {
    free(job.images);
    free(job.reasons);
    free(ds->labels);
    ds->labels = NULL;
    return -1;
  }
  pthread_mutex_init(&job.mu, NULL);
  nth = ncpu > 0 ? (int)ncpu : 2;
  if (nth > DATA_MAX_THREADS) nth = DATA_MAX_THREADS;
  if (nth > items->n) nth = items->n;
  for (i = 0; i < nth; i++)
    if (pthread_create(&th[started], NULL, data_worker, &job) == 0) started++;
  if (started == 0) data_worker(&job); /* no threads available: decode here */
  for (i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&job.mu);

  ds->c = c;
  ds->h = h;
  ds->w = w;
  ds->classes = classes;
  for (i = 0; i < items->n; i++) {
    const char *r = job.reasons + (size_t)DATA_REASON_MAX * i;
    if (r[0]) {
      ds->skipped++;
      if (warn) {
        char line[1400];
        snprintf(line, sizeof line, "%s: skipped (%s)", items->v[i].path, r);
        warn(ud, line);
      }
      continue;
    }
    if (k != i) memmove(job.images + per * k, job.images + per * i, per);
    ds->labels[k++] = items->v[i].label;
  }
  free(job.reasons);
  if (k == 0) {
    free(job.images);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
    return tt_fail(err, "%s: none of its %d image files could be decoded; check the files (see the warnings)",
                   where, items->n);
  }
  ds->n = k;
  ds->images = job.images;
  if (k < items->n) {
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
    char full[4096], why[DATA_REASON_MAX];
    struct stat st;
    if (snprintf(full, sizeof full, "%s/%s", root, v[i]) < (int)sizeof full && stat(full, &st) == 0 &&
        S_ISDIR(st.st_mode)) {
      v[k++] = v[i];
      continue;
    }
    if (data_check_kind(full, why) == 0) snprintf(why, sizeof why, "a regular file");
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

static void data_free_names(char **v, int n) {
  int i;
  for (i = 0; i < n; i++) free(v[i]);
  free(v);
}

int tt_dataset_load_folder(const char *dir, int c, int h, int w, tt_dataset *ds, tt_err *err, tt_warn_fn warn,
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
  rc = data_decode_all(&items, nclasses, dir, c, h, w, ds, err, warn, ud);
done:
  data_free_names(classes, nclasses);
  data_items_free(&items);
  return rc;
}

/* ---- List files ---- */

int tt_dataset_load_list(const char *list_path, int c, int h, int w, tt_dataset *ds, tt_err *err,
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
  rc = data_decode_all(&items, maxl + 1, list_path, c, h, w, ds, err, warn, ud);
done:
  free(buf);
  data_items_free(&items);
  return rc;
}

int tt_image_decode(const char *path, int c, int h, int w, uint8_t *out, tt_err *err) {
  char reason[DATA_REASON_MAX];
  if (data_decode_one(path, c, h, w, out, reason)) return tt_fail(err, "%s: %s", path, reason);
  return 0;
}

int tt_dir_entries(const char *dir, char ***names, int *n, tt_err *err) { return data_list_dir(dir, names, n, err); }

void tt_dir_entries_free(char **names, int n) { data_free_names(names, n); }
