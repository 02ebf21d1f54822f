/* core/data/data_npy.c — format = npy: images N x H x W x C uint8 (or N x H x W for one channel)
 * in a standard .npy file, memory-mapped (never read whole), and labels N int32, int64 or
 * uint8 in another, as numpy.save writes them (tinytrain pack writes such pairs too). The
 * header is checked fully: magic and version, dtype (little-endian), fortran_order, shape,
 * and the file's size against the shape, at open (a regular file, checked on the descriptor
 * opened). A file that shrinks under a running job (truncated by another process) would make
 * the next read of a page past its new end raise SIGBUS; so the descriptor is kept, the loader
 * checks the file's size on it before each batch it reads from the mapping
 * (tt_dataset_check_map), and a fault that still lands while it reads (the file shrank between
 * the check and the read) is caught by a SIGBUS handler that jumps back to the reading thread
 * (tt_map_guard_enter): either way the job ends with an error naming the file. What remains:
 * a file rewritten in place at the same size is read as it is (mixed records), and the handler
 * is process-wide (installed at the first guarded read; a fault outside a guarded read, or a
 * SIGBUS sent by kill, goes to the handler that was there before, by default killing the
 * process). Replace such files by writing new ones and renaming them over the old, as pack does. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "dataset.h"
#include "decode.h"
#include "../base/fileio.h"
#include "../base/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NPY_WHY(...) snprintf(why, TT_DECODE_REASON_MAX, __VA_ARGS__)
#define NPY_HEADER_MAX 65536

/* Skips the whitespace numpy may put in a header dict; returns the first other byte (or e). */
static const char *npy_ws(const char *p, const char *e) {
  while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

/* A quoted string at p (' or "); copies it into out. Returns the position after it, or NULL. */
static const char *npy_string(const char *p, const char *e, char *out, size_t size) {
  char q;
  size_t n = 0;
  if (p >= e || (*p != '\'' && *p != '"')) return NULL;
  q = *p++;
  while (p < e && *p != q) {
    if (n + 1 >= size) return NULL;
    out[n++] = *p++;
  }
  if (p >= e) return NULL;
  out[n] = 0;
  return p + 1;
}

/* Parses a dtype descr ('|u1', '<i4', ...) into info->kind and itemsize: little-endian or
 * byte-order-free integers only: unsigned of 1 or 2 bytes, signed of 1, 2, 4 or 8. 0, or -1 with why. */
static int npy_descr(const char *descr, tt_npy_info *info, char *why) {
  const char *d = descr;
  char kind;
  int size;
  if ((d[0] == '<' || d[0] == '|' || d[0] == '=') && d[1]) d++;
  else if (d[0] == '>') {
    NPY_WHY("dtype '%.20s' is big-endian; save it as little-endian (arr.astype(arr.dtype.newbyteorder('<')))", d);
    return -1;
  }
  kind = d[0];
  size = atoi(d + 1);
  if ((kind == 'u' && (size == 1 || size == 2)) || (kind == 'i' && (size == 1 || size == 2 || size == 4 || size == 8))) {
    if (!(d[1] >= '1' && d[1] <= '8' && d[2] == 0)) goto bad;
    info->kind = kind;
    info->itemsize = size;
    return 0;
  }
bad:
  NPY_WHY("dtype '%.20s' is not an integer type this reader knows (uint8, uint16, int8 ... int64)", descr);
  return -1;
}

/* (d0, d1, ...) with an optional trailing comma. */
static const char *npy_shape(const char *p, const char *e, tt_npy_info *info, char *why) {
  if (p >= e || *p != '(') return NULL;
  p = npy_ws(p + 1, e);
  info->ndim = 0;
  while (p < e && *p != ')') {
    long long v = 0;
    if (*p < '0' || *p > '9') return NULL;
    while (p < e && *p >= '0' && *p <= '9') {
      v = v * 10 + (*p++ - '0');
      if (v > (1LL << 40)) {
        NPY_WHY("a dimension of the shape is over 2^40");
        return NULL;
      }
    }
    if (info->ndim == 4) {
      NPY_WHY("more than 4 dimensions");
      return NULL;
    }
    info->shape[info->ndim++] = v;
    p = npy_ws(p, e);
    if (p < e && *p == ',') p = npy_ws(p + 1, e);
  }
  return p < e ? p + 1 : NULL;
}

/* The header's dict: {'descr': ..., 'fortran_order': ..., 'shape': (...), } */
static int npy_dict(const char *p, const char *e, tt_npy_info *info, char *why) {
  int seen = 0;
  p = npy_ws(p, e);
  if (p >= e || *p++ != '{') return NPY_WHY("the header is not a Python dict"), -1;
  for (;;) {
    char key[32], val[32];
    p = npy_ws(p, e);
    if (p < e && *p == '}') break;
    if (!(p = npy_string(p, e, key, sizeof key))) return NPY_WHY("a key of the header dict is not a short string"), -1;
    p = npy_ws(p, e);
    if (p >= e || *p++ != ':') return NPY_WHY("no ':' after '%s' in the header", key), -1;
    p = npy_ws(p, e);
    if (!strcmp(key, "descr")) {
      if (!(p = npy_string(p, e, val, sizeof val))) return NPY_WHY("'descr' is not a simple dtype string (a structured dtype?)"), -1;
      if (npy_descr(val, info, why)) return -1;
      seen |= 1;
    } else if (!strcmp(key, "fortran_order")) {
      if (e - p >= 5 && !memcmp(p, "False", 5)) p += 5;
      else if (e - p >= 4 && !memcmp(p, "True", 4)) return NPY_WHY("fortran_order is True; save a C-ordered array (np.ascontiguousarray)"), -1;
      else return NPY_WHY("fortran_order is neither True nor False"), -1;
      seen |= 2;
    } else if (!strcmp(key, "shape")) {
      why[0] = 0;
      if (!(p = npy_shape(p, e, info, why))) return why[0] ? -1 : (NPY_WHY("'shape' is not a tuple of integers"), -1);
      seen |= 4;
    } else {
      return NPY_WHY("unknown key '%s' in the header", key), -1;
    }
    p = npy_ws(p, e);
    if (p < e && *p == ',') p++;
    else if (p >= e || *p != '}') return NPY_WHY("expected ',' or '}' in the header dict"), -1;
  }
  if (seen != 7) return NPY_WHY("the header lacks '%s'", !(seen & 1) ? "descr" : !(seen & 2) ? "fortran_order" : "shape"), -1;
  return 0;
}

int tt_npy_parse_header(const void *data, size_t size, tt_npy_info *info, char *why) {
  const unsigned char *b = (const unsigned char *)data;
  size_t start, hlen;
  long long i, count = 1;
  memset(info, 0, sizeof *info);
  why[0] = 0;
  if (size < 10 || memcmp(b, "\x93NUMPY", 6) != 0) return NPY_WHY("not a .npy file (no \\x93NUMPY magic)"), -1;
  if (b[6] < 1 || b[6] > 3) return NPY_WHY("format version %d.%d, not 1, 2 or 3", b[6], b[7]), -1;
  if (b[6] == 1) {
    hlen = (size_t)b[8] | ((size_t)b[9] << 8);
    start = 10;
  } else {
    if (size < 12) return NPY_WHY("truncated header"), -1;
    hlen = (size_t)b[8] | ((size_t)b[9] << 8) | ((size_t)b[10] << 16) | ((size_t)b[11] << 24);
    start = 12;
  }
  if (hlen > NPY_HEADER_MAX) return NPY_WHY("header of %zu bytes, over the %d this reader takes", hlen, NPY_HEADER_MAX), -1;
  if (start + hlen > size) return NPY_WHY("truncated header (%zu bytes announced)", hlen), -1;
  if (npy_dict((const char *)b + start, (const char *)b + start + hlen, info, why)) return -1;
  for (i = 0; i < info->ndim; i++) {
    if (info->shape[i] && count > (1LL << 50) / info->shape[i]) return NPY_WHY("the shape has over 2^50 elements"), -1;
    count *= info->shape[i];
  }
  info->count = count;
  info->data_offset = start + hlen;
  return 0;
}

/* Reads a file's header (and, for labels, everything) and checks its size against the shape. */
static int npy_open(const char *path, tt_npy_info *info, int *fd_out, size_t *file_size, tt_err *err) {
  char why[TT_DECODE_REASON_MAX];
  unsigned char head[NPY_HEADER_MAX + 12];
  struct stat st;
  ssize_t got;
  int fd;
  if (tt_file_check_kind(path, why) != 0) return tt_fail(err, "%s: %s; check [data] paths", path, why);
  fd = tt_open_regular(path, "check [data] paths", err); /* fstat of what was opened: a regular file */
  if (fd < 0) return -1;
  got = pread(fd, head, sizeof head, 0);
  if (got < 0 || fstat(fd, &st) != 0) {
    close(fd);
    return tt_fail(err, "%s: cannot read (%s)", path, strerror(errno));
  }
  if (tt_npy_parse_header(head, (size_t)got, info, why) != 0) {
    close(fd);
    return tt_fail(err, "%s: %s", path, why);
  }
  if ((unsigned long long)st.st_size != info->data_offset + (unsigned long long)info->count * info->itemsize) {
    close(fd);
    return tt_fail(err, "%s: is %lld bytes, but its header's shape needs %llu; is it truncated or still being written?",
                   path, (long long)st.st_size,
                   (unsigned long long)(info->data_offset + (unsigned long long)info->count * info->itemsize));
  }
  *fd_out = fd;
  *file_size = (size_t)st.st_size;
  return 0;
}

/* Label i of a little-endian integer array (itemsize bytes each), sign-extended for 'i'
 * kinds: read byte by byte, so any alignment and any host byte order give the same value. */
static long long npy_label_at(const unsigned char *p, const tt_npy_info *li, long long i) {
  const unsigned char *q = p + (size_t)i * li->itemsize;
  unsigned long long v = 0;
  int k;
  for (k = li->itemsize - 1; k >= 0; k--) v = (v << 8) | q[k];
  if (li->kind == 'i' && li->itemsize < 8 && (v >> (li->itemsize * 8 - 1)) & 1) v |= ~0ULL << (li->itemsize * 8);
  return (long long)v;
}

/* Reads the labels file (n entries, each in [0, classes) when classes > 0) into ds->labels
 * as int32. 0, or -1 with err naming the file and the first bad entry. */
static int npy_labels(const char *path, long long n, int classes, tt_dataset *ds, tt_err *err) {
  tt_npy_info li;
  int fd;
  size_t size;
  long long i;
  unsigned char *buf;
  if (npy_open(path, &li, &fd, &size, err)) return -1;
  if (li.ndim != 1 || li.shape[0] != n) {
    close(fd);
    return tt_fail(err, "%s: labels of shape (%lld%s) for %lld images; expected shape (%lld,)", path,
                   li.ndim ? li.shape[0] : 0, li.ndim == 1 ? "," : ", ...", n, n);
  }
  buf = (unsigned char *)tt_malloc(size - li.data_offset + 1, "npy labels", err);
  ds->labels = (int32_t *)tt_malloc(sizeof(int32_t) * (size_t)(n ? n : 1), "labels", err);
  if (!buf || !ds->labels || pread(fd, buf, size - li.data_offset, (off_t)li.data_offset) != (ssize_t)(size - li.data_offset)) {
    free(buf);
    close(fd);
    return buf && ds->labels ? tt_fail(err, "%s: cannot read the labels", path) : -1;
  }
  close(fd);
  for (i = 0; i < n; i++) {
    long long v = npy_label_at(buf, &li, i);
    if (v < 0 || (classes > 0 && v >= classes)) {
      free(buf);
      return tt_fail(err, "%s: label %lld at index %lld is not in [0, %d) ([net] classes); fix the labels or classes",
                     path, v, i, classes);
    }
    ds->labels[i] = (int32_t)v;
  }
  free(buf);
  return 0;
}

/* PREFIX-classes.json next to PREFIX-images.npy (as tinytrain pack writes): the class names. */
static int npy_class_names(const char *images_path, tt_dataset *ds, tt_err *err) {
  char p[TT_PATH_MAX + 32];
  size_t n = strlen(images_path), k = strlen("-images.npy");
  void *buf = NULL;
  size_t size = 0;
  char **names = NULL, **v;
  int count = 0, i;
  if (n < k || strcmp(images_path + n - k, "-images.npy") != 0 || n - k + 14 >= sizeof p) return 0;
  snprintf(p, sizeof p, "%.*s-classes.json", (int)(n - k), images_path);
  if (access(p, F_OK) != 0) return 0;
  if (tt_read_file(p, &buf, &size, err) != 0) return -1;
  {
    char *text = (char *)realloc(buf, size + 1);
    if (!text) {
      free(buf);
      return tt_fail(err, "out of host memory reading %s", p);
    }
    text[size] = 0;
    i = tt_st_names_parse(p, text, &names, &count, err);
    free(text);
    if (i) return -1;
  }
  v = (char **)tt_calloc((size_t)(count ? count : 1), sizeof(char *), "class names", err); /* one per name */
  for (i = 0; v && i < count; i++) {
    v[i] = (char *)tt_malloc(strlen(names[i]) + 1, "class name", err);
    if (v[i]) strcpy(v[i], names[i]);
  }
  free(names);
  if (!v) return -1;
  {
    int classes = ds->classes, k;
    long long j;
    ds->class_names = v;
    ds->classes = count;
    for (i = 0; i < count; i++)
      if (!v[i]) return -1;
    /* the names are checked here, at load, against [net] classes and every label: fewer names
     * than the labels use made tt_dataset_map_classes read past the table, and a name twice
     * silently mapped two classes onto one */
    if (classes > 0 && count != classes)
      return tt_fail(err, "%s: names %d classes but [net] classes = %d; give one name per class", p, count, classes);
    for (i = 0; i < count; i++)
      for (k = i + 1; k < count; k++)
        if (!strcmp(v[i], v[k]))
          return tt_fail(err, "%s: the class name '%s' appears twice (classes %d and %d); class names must be unique",
                         p, v[i], i, k);
    for (j = 0; j < ds->n; j++)
      if (ds->labels[j] >= count)
        return tt_fail(err, "%s: names %d classes but label %d (index %lld of the labels file) needs %d; give one name "
                       "per class", p, count, (int)ds->labels[j], j, (int)ds->labels[j] + 1);
  }
  return 0;
}

/* ---- PREFIX-set.json: the set whole or not at all ---- */

/* FNV-1a (64-bit) of p[0, n) continued from h: the manifest's hash, cheap and stable across
 * hosts; it detects files that do not belong together, not tampering. */
static uint64_t set_fnv(uint64_t h, const unsigned char *p, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
#define SET_FNV0 0xcbf29ce484222325ull
#define SET_SAMPLES 64

/* FNV-1a of a whole (small) file; *bytes its size. */
static int set_file_hash(const char *path, uint64_t *hash, unsigned long long *bytes, tt_err *err) {
  void *buf = NULL;
  size_t n = 0;
  if (tt_read_file(path, &buf, &n, err)) return -1;
  *hash = set_fnv(SET_FNV0, (const unsigned char *)buf, n);
  *bytes = n;
  free(buf);
  return 0;
}

/* The digest of a packed set as the manifest records it: sizes, the labels and classes
 * files hashed whole, the images file by its header and SET_SAMPLES records spread over it
 * (first and last included), so checking a large set reads a few pages, not the file. */
int tt_npy_set_hash(const char *images, const char *labels, const char *classes, tt_npy_set_digest *d, tt_err *err) {
  tt_npy_info ii;
  int fd;
  size_t size, per;
  long long i, n;
  unsigned char *rec;
  memset(d, 0, sizeof *d);
  if (npy_open(images, &ii, &fd, &size, err)) return -1;
  n = ii.ndim >= 1 ? ii.shape[0] : 0;
  per = n > 0 ? (size - ii.data_offset) / (size_t)n : 0;
  d->count = n;
  d->images_bytes = size;
  rec = (unsigned char *)tt_malloc(per > ii.data_offset ? per : ii.data_offset, "set digest", err);
  if (!rec) {
    close(fd);
    return -1;
  }
  /* the header and SET_SAMPLES records spread over the file (first and last included): read
   * with pread, so a set of any size is checked in as many reads */
  d->images_hash = SET_FNV0;
  for (i = -1; i < (n < SET_SAMPLES ? n : SET_SAMPLES); i++) {
    long long r = i < 0 ? -1 : n <= SET_SAMPLES ? i : i * (n - 1) / (SET_SAMPLES - 1);
    size_t len = r < 0 ? ii.data_offset : per;
    off_t at = r < 0 ? 0 : (off_t)(ii.data_offset + (size_t)r * per);
    if (pread(fd, rec, len, at) != (ssize_t)len) {
      free(rec);
      close(fd);
      return tt_fail(err, "%s: cannot read (%s)", images, strerror(errno));
    }
    d->images_hash = set_fnv(d->images_hash, rec, len);
  }
  free(rec);
  close(fd);
  if (set_file_hash(labels, &d->labels_hash, &d->labels_bytes, err)) return -1;
  d->has_classes = classes != NULL;
  if (classes && set_file_hash(classes, &d->classes_hash, &d->classes_bytes, err)) return -1;
  return 0;
}

/* The manifest line for d, as pack writes it and set_value reads it back. */
int tt_npy_set_format(const tt_npy_set_digest *d, char *out, size_t size) {
  char cl[40];
  if (d->has_classes) snprintf(cl, sizeof cl, "\"%016llx\"", (unsigned long long)d->classes_hash);
  else snprintf(cl, sizeof cl, "null");
  return snprintf(out, size,
                  "{\"tinytrain_set\": 1, \"count\": %lld, \"images_bytes\": %llu, \"images_sample_fnv1a\": \"%016llx\", "
                  "\"labels_bytes\": %llu, \"labels_fnv1a\": \"%016llx\", \"classes_fnv1a\": %s}\n",
                  d->count, d->images_bytes, (unsigned long long)d->images_hash, d->labels_bytes,
                  (unsigned long long)d->labels_hash, cl);
}

/* The value after "key": in a manifest as tt_npy_set_format writes it (quotes dropped). */
static int set_value(const char *text, const char *key, char *out, size_t size) {
  char k[40];
  const char *p, *e;
  snprintf(k, sizeof k, "\"%s\": ", key);
  if (!(p = strstr(text, k))) return -1;
  p += strlen(k);
  if (*p == '"') p++;
  for (e = p; *e && *e != '"' && *e != ',' && *e != '}' && *e != '\n'; e++) {}
  if ((size_t)(e - p) >= size) return -1;
  memcpy(out, p, (size_t)(e - p));
  out[e - p] = 0;
  return 0;
}

/* PREFIX-set.json beside PREFIX-images.npy (tinytrain pack writes it, first of the four files):
 * the other files must be the set it describes, or a pack was interrupted between its renames. */
static int npy_check_set(const char *images_path, const char *labels_path, tt_err *err) {
  char pre[TT_PATH_MAX], p[TT_PATH_MAX + 32], lab[TT_PATH_MAX + 32], cls[TT_PATH_MAX + 32], mine[512];
  size_t n = strlen(images_path), k = strlen("-images.npy"), size = 0;
  void *buf = NULL;
  tt_npy_set_digest d;
  struct stat a, b;
  const char *what = NULL;
  int own_labels;
  static const char *const keys[6] = {"count", "images_bytes", "images_sample_fnv1a", "labels_bytes", "labels_fnv1a",
                                      "classes_fnv1a"};
  int i;
  if (n < k || strcmp(images_path + n - k, "-images.npy") != 0 || n - k >= sizeof pre) return 0;
  snprintf(pre, sizeof pre, "%.*s", (int)(n - k), images_path);
  snprintf(p, sizeof p, "%s-set.json", pre);
  if (access(p, F_OK) != 0) return 0; /* numpy's sets, and older packs: nothing to check against */
  snprintf(lab, sizeof lab, "%s-labels.npy", pre);
  snprintf(cls, sizeof cls, "%s-classes.json", pre);
  /* a labels file other than the set's own (the recipe's choice) is not the manifest's to judge */
  own_labels = stat(labels_path, &a) == 0 && stat(lab, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  if (tt_read_file(p, &buf, &size, err)) return -1;
  if (tt_npy_set_hash(images_path, labels_path, access(cls, F_OK) == 0 ? cls : NULL, &d, err)) {
    free(buf);
    return -1;
  }
  tt_npy_set_format(&d, mine, sizeof mine);
  for (i = 0; i < 6 && !what; i++) {
    char want[64], have[64];
    if (set_value((const char *)buf, keys[i], want, sizeof want) || !strstr((const char *)buf, "\"tinytrain_set\": 1")) {
      what = "it is not a manifest this version reads";
      break;
    }
    set_value(mine, keys[i], have, sizeof have);
    if (strcmp(want, have) != 0 && !(i >= 3 && i <= 4 && !own_labels))
      what = i <= 2 ? "the images differ" : i <= 4 ? "the labels differ" : "the class names differ";
  }
  free(buf);
  if (what)
    return tt_fail(err, "%s: %s-images.npy, %s-labels.npy and %s-classes.json are not the set it describes (%s): a pack "
                   "was interrupted while it renamed them, or a file was replaced; re-run tinytrain pack (or remove %s if "
                   "the files were replaced on purpose)", p, pre, pre, pre, what, p);
  return 0;
}

/* Opens and checks the images file, maps it read-only (ds->images points into the mapping,
 * [n, h, w, c]: ds->hwc), then reads the labels, the class names and checks the manifest.
 * 0, or -1 with err and ds freed; on success the mapping and its descriptor are ds's. */
int tt_dataset_load_npy(const char *images_path, const char *labels_path, int c, int h, int w, int classes,
                        tt_dataset *ds, tt_err *err) {
  tt_npy_info ii;
  int fd, ic;
  size_t size;
  void *map;
  memset(ds, 0, sizeof *ds);
  if (npy_open(images_path, &ii, &fd, &size, err)) return -1;
  ic = ii.ndim == 4 ? (int)ii.shape[3] : 1;
  if (ii.kind != 'u' || ii.itemsize != 1 || (ii.ndim != 4 && ii.ndim != 3) || ii.shape[0] < 1 || ii.shape[0] > 0x7fffffff) {
    close(fd);
    return tt_fail(err, "%s: expected uint8 images of shape (N, H, W, C) or (N, H, W), N >= 1; found dtype %c%d with %d "
                   "dimensions", images_path, ii.kind, ii.itemsize, ii.ndim);
  }
  if (ii.shape[1] != h || ii.shape[2] != w || ic != c) {
    close(fd);
    return tt_fail(err, "%s: images are %lldx%lldx%d (H x W x C) but the recipe's input is %dx%dx%d (C x H x W); pack "
                   "them at the input size or change [net] input", images_path, ii.shape[1], ii.shape[2], ic, c, h, w);
  }
  map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    return tt_fail(err, "%s: cannot memory-map (%s)", images_path, strerror(errno));
  }
  ds->map = map;
  ds->map_fd = fd; /* kept: tt_dataset_check_map looks at the file's size on it */
  ds->map_bytes = size;
  ds->images = (uint8_t *)map + ii.data_offset;
  ds->hwc = 1;
  ds->n = (int)ii.shape[0];
  ds->c = c, ds->h = h, ds->w = w;
  ds->classes = classes;
  snprintf(ds->source, sizeof ds->source, "%s", images_path);
  if (npy_labels(labels_path, ii.shape[0], classes, ds, err) || npy_class_names(images_path, ds, err) ||
      npy_check_set(images_path, labels_path, err)) {
    tt_dataset_free(ds);
    return -1;
  }
  return 0;
}

/* ---- A file that shrinks under the mapping ---- */

/* One fstat on the kept descriptor: 0 when the file still holds every mapped byte (or ds is
 * not mapped), else -1 with err naming it. */
int tt_dataset_check_map(const tt_dataset *ds, tt_err *err) {
  struct stat st;
  if (!ds->map) return 0;
  if (fstat(ds->map_fd, &st) != 0) return tt_fail(err, "%s: cannot check its size (%s)", ds->source, strerror(errno));
  if ((unsigned long long)st.st_size < ds->map_bytes)
    return tt_fail(err, "%s: the file shrank to %lld bytes while this run read it (%zu at open: truncated or rewritten by "
                   "another process); stopping. Replace a packed set by renaming new files over it (as tinytrain pack "
                   "does), never by rewriting it in place", ds->source, (long long)st.st_size, ds->map_bytes);
  return 0;
}

/* The reading thread's guard: where to jump, and the mapping a fault must fall in. */
static __thread sigjmp_buf *volatile map_jump; /* __thread: the amalgamation is also C++ (nvcc) */
static __thread const char *volatile map_lo, *volatile map_hi;
static struct sigaction map_old; /* the SIGBUS action before ours */
static pthread_once_t map_once = PTHREAD_ONCE_INIT;

/* The process-wide SIGBUS handler: a fault inside the calling thread's guarded mapping jumps
 * back to its tt_map_guard_enter caller's sigsetjmp; anything else goes to the previous action
 * (or the default, re-raised), as if this handler were not there. */
static void map_on_sigbus(int sig, siginfo_t *si, void *uc) {
  const char *a = (const char *)si->si_addr;
  if (map_jump && si->si_code > 0 && a >= map_lo && a < map_hi) { /* a fault (not a kill) in the guarded mapping */
    sigjmp_buf *j = map_jump;
    map_jump = NULL;
    siglongjmp(*j, 1);
  }
  /* not ours: the action there was before */
  if ((map_old.sa_flags & SA_SIGINFO) && map_old.sa_sigaction) {
    map_old.sa_sigaction(sig, si, uc);
    return;
  }
  if (map_old.sa_handler != SIG_DFL && map_old.sa_handler != SIG_IGN) {
    map_old.sa_handler(sig);
    return;
  }
  sigaction(SIGBUS, &map_old, NULL); /* the default: returning re-runs the faulting access, */
  if (si->si_code <= 0) raise(SIGBUS); /* which faults again; a sent signal is sent again */
}

/* Installs map_on_sigbus once per process (pthread_once), keeping the previous action. */
static void map_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = map_on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &map_old);
}

/* Arms this thread's guard for ds's mapping; the signal fences keep the compiler from
 * moving the stores past the reads they protect (the handler runs on this thread). */
void tt_map_guard_enter(const tt_dataset *ds, sigjmp_buf *jump) {
  pthread_once(&map_once, map_install);
  map_lo = (const char *)ds->map;
  map_hi = (const char *)ds->map + ds->map_bytes;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  map_jump = jump;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

/* Disarms this thread's guard: a fault from now on is not this thread's to catch. */
void tt_map_guard_leave(void) {
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  map_jump = NULL;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}
