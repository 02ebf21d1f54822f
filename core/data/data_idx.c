/* core/data/data_idx.c — IDX files (the MNIST family, gzip or raw). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "dataset.h"
#include "../base/fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* Reads exactly n bytes; gzread also reads uncompressed files transparently. Returns the
 * number of bytes read (less than n if the file ends early), or -1 on a decode error. */
static long long data_gzread_all(gzFile f, void *buf, size_t n) {
  unsigned char *p = (unsigned char *)buf;
  size_t got = 0;
  while (got < n) {
    size_t want = n - got;
    int k;
    /* gzread takes an unsigned count and returns an int: at most 1 GiB per call */
    if (want > (1u << 30)) want = 1u << 30;
    k = gzread(f, p + got, (unsigned)want);
    if (k < 0) return -1;
    if (k == 0) break;
    got += (size_t)k;
  }
  return (long long)got;
}

/* An IDX header field: 32-bit big-endian, read byte by byte (any host byte order). */
static uint32_t data_be32(const unsigned char *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Opens an IDX file, checks the magic (type 0x08 = unsigned byte, ndims as expected) and
 * returns the dimensions.
 * dims gets want_dims sizes (host order). On success the returned handle owns the descriptor
 * (gzclose) and stands at the first data byte; on failure NULL with err set, nothing open. */
static gzFile data_idx_open(const char *path, int want_dims, uint32_t *dims, tt_err *err) {
  unsigned char hdr[16];
  long long got;
  int i, nd;
  gzFile f;
  /* gzopen would open a named pipe and wait for a writer forever: open and check the file
   * first, then hand the descriptor to zlib (gzclose closes it). */
  int fd = tt_open_regular(path, "check [data] paths in the recipe", err);
  if (fd < 0) return NULL;
  f = gzdopen(fd, "rb");
  if (!f) {
    close(fd);
    tt_fail(err, "%s: cannot open (out of host memory for the decompressor)", path);
    return NULL;
  }
  got = data_gzread_all(f, hdr, 4);
  if (got != 4) {
    gzclose(f);
    tt_fail(err, "%s: truncated: expected a 4-byte IDX magic number, found %lld bytes; re-download the file",
            path, got < 0 ? 0 : got);
    return NULL;
  }
  nd = hdr[3];
  if (hdr[0] != 0 || hdr[1] != 0 || hdr[2] != 0x08 || nd != want_dims) {
    gzclose(f);
    tt_fail(err,
            "%s: bad IDX magic %02x %02x %02x %02x: expected 00 00 08 %02x (unsigned bytes, %d dims, %s); "
            "is this the right file?",
            path, hdr[0], hdr[1], hdr[2], hdr[3], want_dims, want_dims,
            want_dims == 1 ? "a labels file" : "an images file");
    return NULL;
  }
  got = data_gzread_all(f, hdr + 4, (size_t)nd * 4);
  if (got != (long long)nd * 4) {
    gzclose(f);
    tt_fail(err, "%s: truncated: expected %d dimension sizes in the IDX header; re-download the file", path,
            nd);
    return NULL;
  }
  for (i = 0; i < nd; i++) dims[i] = data_be32(hdr + 4 + 4 * i);
  return f;
}

/* An IDX pair (images n x h x w unsigned bytes, labels n unsigned bytes; gzip or raw) read
 * whole into memory as a one-channel set, classes = the largest label + 1. 0, or -1 with err
 * naming the file (shape, count, truncation, corrupt compression) and ds freed. */
int tt_dataset_load_idx(const char *images_path, const char *labels_path, int c, int h, int w,
                        tt_dataset *ds, tt_err *err) {
  uint32_t idims[3], ldims[1];
  gzFile fi, fl;
  size_t per, total;
  long long got;
  int i, maxl = -1;
  unsigned char *lab8;
  memset(ds, 0, sizeof *ds);
  fi = data_idx_open(images_path, 3, idims, err);
  if (!fi) return -1;
  if (c != 1 || (int)idims[1] != h || (int)idims[2] != w) {
    gzclose(fi);
    return tt_fail(err,
                   "%s: images are 1x%ux%u (c x h x w) but the recipe's input is %dx%dx%d; "
                   "set the [input] shape to 1x%ux%u",
                   images_path, idims[1], idims[2], c, h, w, idims[1], idims[2]);
  }
  fl = data_idx_open(labels_path, 1, ldims, err);
  if (!fl) {
    gzclose(fi);
    return -1;
  }
  /* the count must also fit ds->n, an int */
  if (idims[0] != ldims[0] || idims[0] == 0 || idims[0] > 0x7fffffffu) {
    gzclose(fi);
    gzclose(fl);
    return tt_fail(err, "%s has %u images but %s has %u labels; they must match (and be > 0)", images_path,
                   idims[0], labels_path, ldims[0]);
  }
  ds->n = (int)idims[0];
  ds->c = 1;
  ds->h = h;
  ds->w = w;
  per = (size_t)h * (size_t)w;
  total = per * (size_t)ds->n;
  ds->images = (uint8_t *)tt_malloc(total, "IDX images", err);
  ds->labels = (int32_t *)tt_malloc(sizeof(int32_t) * (size_t)ds->n, "IDX labels", err);
  lab8 = (unsigned char *)tt_malloc((size_t)ds->n, "IDX labels", err);
  if (!ds->images || !ds->labels || !lab8) {
    free(lab8);
    gzclose(fi);
    gzclose(fl);
    tt_dataset_free(ds);
    return -1;
  }
  got = data_gzread_all(fi, ds->images, total);
  if (got != (long long)total) {
    if (got < 0)
      tt_fail(err, "%s: corrupt compressed data (%s); re-download the file", images_path,
              gzerror(fi, &i));
    else
      tt_fail(err, "%s: truncated: expected %zu bytes of pixels (%d images of %dx%d), found %lld; re-download the file",
              images_path, total, ds->n, h, w, got);
    goto fail;
  }
  got = data_gzread_all(fl, lab8, (size_t)ds->n);
  if (got != (long long)ds->n) {
    if (got < 0)
      tt_fail(err, "%s: corrupt compressed data (%s); re-download the file", labels_path, gzerror(fl, &i));
    else
      tt_fail(err, "%s: truncated: expected %d labels, found %lld; re-download the file", labels_path, ds->n,
              got);
    goto fail;
  }
  for (i = 0; i < ds->n; i++) {
    ds->labels[i] = lab8[i];
    if (lab8[i] > maxl) maxl = lab8[i];
  }
  /* IDX stores no class count: a set whose highest classes are absent counts fewer */
  ds->classes = maxl + 1;
  free(lab8);
  gzclose(fi);
  gzclose(fl);
  return 0;
fail:
  free(lab8);
  gzclose(fi);
  gzclose(fl);
  tt_dataset_free(ds);
  return -1;
}

/* The image count an IDX images file's header states (what tt_dataset_load_idx would hold in
 * memory: count x h x w bytes and an int32 label each), read without the data: for `plan`'s
 * prediction of the process's memory. 0, or -1 with err naming the file. */
int tt_dataset_idx_count(const char *images_path, int *n, tt_err *err) {
  uint32_t dims[3];
  gzFile f = data_idx_open(images_path, 3, dims, err);
  if (!f) return -1;
  gzclose(f);
  if (dims[0] > 0x7fffffffu) return tt_fail(err, "%s: %u images are more than one set may hold", images_path, dims[0]);
  *n = (int)dims[0];
  return 0;
}
