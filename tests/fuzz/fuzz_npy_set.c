/* tests/fuzz/fuzz_npy_set.c — libFuzzer target: a whole format = npy set (tt_dataset_load_npy:
 * PREFIX-images.npy, PREFIX-labels.npy and PREFIX-classes.json together, written to files)
 * from one input: bytes 0-1 and 2-3 the images and labels files' lengths (little-endian), byte
 * 4 the [net] classes (low 3 bits; 0: not given), whether a classes JSON follows (bit 3) and
 * whether the same trailing bytes are also the set's manifest, s-set.json (bit 4), then the
 * images file, the labels file and the JSON. The recipe's input is taken from the
 * images header when it parses, so inputs get past the shape check. A loaded set must have
 * every label in range of its classes and names, and its images are read whole. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

static void cleanup(void) {
  static const char *const names[4] = {"s-images.npy", "s-labels.npy", "s-classes.json", "s-set.json"};
  char path[128];
  int i;
  for (i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  rmdir(dir);
}

static void put(const char *name, const uint8_t *p, size_t n) {
  char path[128];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  f = fopen(path, "wb");
  if (!f) abort();
  if (n) fwrite(p, 1, n, f);
  fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char img[128], lab[128], json[128];
  size_t ni, nl, rest;
  int classes, c = 1, h = 2, w = 2, i;
  tt_npy_info info;
  char why[TT_DECODE_REASON_MAX];
  tt_dataset ds;
  tt_err err;
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "/tmp/tt_fuzz_npy_set_XXXXXX");
    if (!mkdtemp(dir)) abort();
    atexit(cleanup);
  }
  if (size < 5) return 0;
  ni = (size_t)data[0] | ((size_t)data[1] << 8);
  nl = (size_t)data[2] | ((size_t)data[3] << 8);
  classes = data[4] & 7;
  rest = size - 5;
  if (ni > rest) ni = rest;
  if (nl > rest - ni) nl = rest - ni;
  snprintf(img, sizeof img, "%s/s-images.npy", dir);
  snprintf(lab, sizeof lab, "%s/s-labels.npy", dir);
  snprintf(json, sizeof json, "%s/s-classes.json", dir);
  put("s-images.npy", data + 5, ni);
  put("s-labels.npy", data + 5 + ni, nl);
  if (data[4] & 8) put("s-classes.json", data + 5 + ni + nl, rest - ni - nl);
  else unlink(json);
  if (data[4] & 16) put("s-set.json", data + 5 + ni + nl, rest - ni - nl);
  else {
    char set[128];
    snprintf(set, sizeof set, "%s/s-set.json", dir);
    unlink(set);
  }
  if (tt_npy_parse_header(data + 5, ni, &info, why) == 0 && (info.ndim == 3 || info.ndim == 4) &&
      info.shape[1] >= 1 && info.shape[1] <= 64 && info.shape[2] >= 1 && info.shape[2] <= 64) {
    h = (int)info.shape[1], w = (int)info.shape[2];
    c = info.ndim == 4 ? (int)(info.shape[3] >= 1 && info.shape[3] <= 4 ? info.shape[3] : 1) : 1;
  }
  err.msg[0] = 0;
  if (tt_dataset_load_npy(img, lab, c, h, w, classes, &ds, &err) != 0) {
    if (!err.msg[0]) __builtin_trap(); /* a refusal always says why */
    return 0;
  }
  {
    volatile unsigned sum = 0;
    size_t k, n = (size_t)ds.n * c * h * w;
    for (k = 0; k < n; k++) sum += ds.images[k];
    (void)sum;
  }
  for (i = 0; i < ds.n; i++) {
    if (ds.labels[i] < 0 || (ds.classes > 0 && ds.labels[i] >= ds.classes)) __builtin_trap();
  }
  if (ds.class_names) { /* names: exactly [net] classes when given, and one for every label */
    if (classes > 0 && ds.classes != classes) __builtin_trap();
    for (i = 0; i < ds.classes; i++)
      if (!ds.class_names[i]) __builtin_trap();
  }
  tt_dataset_free(&ds);
  return 0;
}
