/* tests/data/test_stream.c — streaming image data sets (the loader decodes each batch), the
 * decoders (TurboJPEG or stb_image) on committed corrupt, truncated and over-the-limit files
 * (tests/fixtures/images/), and the pixel limit. Run from the repository root. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/data/data.h"
#include "core/base/fileio.h"
#include "tests/tt_test.h"

#include "tests/tt_stb_write.h"

#define FX "tests/fixtures/images/"

typedef struct warns {
  int n;
  char all[8192];
} warns;

static void on_warn(void *ud, const char *line) {
  warns *w = (warns *)ud;
  w->n++;
  if (strlen(w->all) + strlen(line) + 2 < sizeof w->all) {
    strcat(w->all, line);
    strcat(w->all, "\n");
  }
}

/* root/c0..c2: 37 noisy images, JPEG and PNG, of several sizes (so the resize and, for the
 * larger JPEGs, TurboJPEG's DCT scaling are exercised). */
static void make_noise_folder(const char *root, int n) {
  unsigned char *px = (unsigned char *)malloc(160 * 120 * 3);
  uint64_t s = 42;
  int i, k;
  char p[1024];
  mkdir(root, 0755);
  for (k = 0; k < 3; k++) {
    snprintf(p, sizeof p, "%s/c%d", root, k);
    mkdir(p, 0755);
  }
  for (i = 0; i < n; i++) {
    int w = 24 + (i % 5) * 30, h = 20 + (i % 3) * 40, j;
    for (j = 0; j < w * h * 3; j++) px[j] = (unsigned char)((tt_splitmix_next(&s) & 127) + (j / (3 * w)) * 64 / h);
    snprintf(p, sizeof p, "%s/c%d/img%02d.%s", root, i % 3, i, i % 2 ? "png" : "jpg");
    if (i % 2)
      stbi_write_png(p, w, h, 3, px, w * 3);
    else
      stbi_write_jpg(p, w, h, 3, px, 90);
  }
  free(px);
}

typedef struct epoch_dump {
  uint8_t *img;
  int32_t *lab;
  int nb, total;
} epoch_dump;

static const tt_crop *g_crop; /* the crop run_epoch gives its loaders (NULL: none) */

/* One epoch of batches concatenated; returns 0, or the tt_loader_next code that stopped it. */
static int run_epoch(const tt_dataset *ds, int batch, int shuffle, int threads, int epoch, int start, warns *w,
                     epoch_dump *d, int *skipped) {
  tt_loader *l;
  tt_err err;
  const uint8_t *im;
  const int32_t *lb;
  int cnt, rc;
  size_t per = (size_t)ds->c * ds->h * ds->w;
  double wait;
  memset(d, 0, sizeof *d);
  if (tt_loader_create(&l, ds, batch, shuffle, shuffle ? 2 : 0, shuffle, 77, threads, &err) != 0) {
    printf("# loader: %s\n", err.msg);
    return -2;
  }
  if (w) tt_loader_set_warn(l, on_warn, w);
  if (g_crop) tt_loader_set_crop(l, g_crop);
  d->nb = tt_loader_batches(l);
  d->img = (uint8_t *)calloc((size_t)d->nb * batch, per);
  d->lab = (int32_t *)calloc((size_t)d->nb * batch, sizeof(int32_t));
  tt_loader_start_epoch(l, epoch, start);
  while ((rc = tt_loader_next(l, &im, &lb, &cnt, &wait)) == 0) {
    memcpy(d->img + (size_t)d->total * per, im, (size_t)cnt * per);
    memcpy(d->lab + d->total, lb, sizeof(int32_t) * (size_t)cnt);
    d->total += cnt;
    tt_loader_release(l);
  }
  if (skipped) *skipped = tt_loader_skipped(l);
  tt_loader_destroy(l);
  return rc == 1 ? 0 : rc;
}

static void free_dump(epoch_dump *d) {
  free(d->img);
  free(d->lab);
}

/* Streaming gives, bit for bit, the batches of the same data set decoded into memory first:
 * shuffled and augmented (two epochs, a resumed one, 1 or 3 threads) and in evaluation order. */
static void test_stream_equals_memory(void) {
  tt_dataset mem, st;
  tt_err err;
  epoch_dump a = {0}, b = {0}, c = {0};
  const char *root = tt_test_path("noise");
  size_t per = (size_t)3 * 20 * 24;
  int rc, e;
  TT_TEST_BEGIN("stream_equals_in_memory");
  make_noise_folder(root, 37);
  rc = tt_dataset_scan_folder(root, 3, 20, 24, &st, &err, NULL, NULL);
  TT_CHECK(rc == 0 && st.n == 37 && !st.images && st.paths && st.classes == 3, "scan: %s", err.msg);
  TT_CHECK(rc != 0 || (st.class_names && !strcmp(st.class_names[0], "c0") && !strcmp(st.class_names[2], "c2")),
           "class names");
  if (rc != 0) return;
  rc = tt_dataset_load_folder(root, 3, 20, 24, &mem, &err, NULL, NULL);
  TT_CHECK(rc == 0 && mem.n == 37 && mem.images, "decode all: %s", err.msg);
  if (rc != 0) return;
  for (e = 0; e < 2; e++) {
    TT_CHECK(run_epoch(&mem, 8, 1, 2, e, 0, NULL, &a, NULL) == 0, "memory epoch %d", e);
    TT_CHECK(run_epoch(&st, 8, 1, e ? 3 : 1, e, 0, NULL, &b, NULL) == 0, "streaming epoch %d", e);
    TT_CHECK(a.total == 32 && b.total == 32 && memcmp(a.img, b.img, 32 * per) == 0 &&
                 memcmp(a.lab, b.lab, 32 * sizeof(int32_t)) == 0,
             "epoch %d: streaming batches differ from the in-memory ones (%d, %d images)", e, a.total, b.total);
    if (e == 1) { /* resumed at batch 2: the tail of the same epoch */
      TT_CHECK(run_epoch(&st, 8, 1, 2, e, 2, NULL, &c, NULL) == 0 && c.total == 16 &&
                   memcmp(c.img, a.img + 16 * per, 16 * per) == 0,
               "resumed streaming epoch differs");
      free_dump(&c);
    }
    free_dump(&a);
    free_dump(&b);
  }
  TT_CHECK(run_epoch(&mem, 5, 0, 1, 0, 0, NULL, &a, NULL) == 0 && run_epoch(&st, 5, 0, 2, 0, 0, NULL, &b, NULL) == 0,
           "eval epochs");
  TT_CHECK(a.total == 37 && b.total == 37 && memcmp(a.img, b.img, 37 * per) == 0 &&
               memcmp(b.img, mem.images, 37 * per) == 0,
           "evaluation order: streaming differs");
  free_dump(&a);
  free_dump(&b);
  tt_dataset_free(&mem);
  tt_dataset_free(&st);
  TT_TEST_END();
}

/* A corrupt image met while streaming is warned about once with its path, counted, and
 * replaced by the next image of the data set; a set where nothing decodes stops the loader. */
static void test_stream_corrupt(void) {
  tt_dataset st;
  tt_err err;
  warns w;
  epoch_dump a;
  FILE *f;
  int rc, skipped = -1;
  uint8_t want[3 * 8 * 8];
  char why[TT_DECODE_REASON_MAX];
  TT_TEST_BEGIN("stream_corrupt_replaced");
  f = fopen(tt_test_path("mixed.list"), "w");
  fprintf(f, "noise/c0/img00.jpg 0\n%s/" FX "corrupt.jpg 1\nnoise/c1/img01.png 2\nnoise/c2/img02.jpg 0\n",
          getcwd(why, sizeof why));
  fclose(f);
  rc = tt_dataset_scan_list(tt_test_path("mixed.list"), 3, 8, 8, 0, &st, &err, NULL, NULL);
  TT_CHECK(rc == 0 && st.n == 4 && st.classes == 3, "scan: %s", err.msg);
  if (rc != 0) return;
  st.max_failed = 0.5f, st.max_failed_set = 1; /* one of four may fail (the default allows 1%) */
  memset(&w, 0, sizeof w);
  TT_CHECK(run_epoch(&st, 4, 0, 2, 0, 0, &w, &a, &skipped) == 0 && a.total == 4, "epoch");
  TT_CHECK(skipped == 1 && w.n == 1 && strstr(w.all, "corrupt.jpg: skipped (") && strstr(w.all, "replaced"),
           "skipped %d, warnings:\n%s", skipped, w.all);
  TT_CHECK(tt_image_decode_file(st.paths[2], 3, 8, 8, 0, want, why) == 0, "decode: %s", why);
  TT_CHECK(a.lab[1] == 2 && memcmp(a.img + 192, want, 192) == 0 && memcmp(a.img + 384, want, 192) == 0,
           "position 1 should hold the next image (label 2), got label %d", a.lab[1]);
  free_dump(&a);
  tt_dataset_free(&st);
  /* nothing decodes: the loader says so instead of producing batches */
  f = fopen(tt_test_path("allbad.list"), "w");
  fprintf(f, "%s/" FX "corrupt.png 0\n%s/" FX "truncated.jpg 1\n", getcwd(why, sizeof why), getcwd(why, sizeof why));
  fclose(f);
  rc = tt_dataset_scan_list(tt_test_path("allbad.list"), 3, 8, 8, 0, &st, &err, NULL, NULL);
  TT_CHECK(rc == 0 && st.n == 2, "scan: %s", err.msg);
  if (rc == 0) {
    st.max_failed = 1, st.max_failed_set = 1; /* every image may fail: the loader's own stop */
    memset(&w, 0, sizeof w);
    TT_CHECK(run_epoch(&st, 2, 0, 1, 0, 0, &w, &a, &skipped) == -1 && skipped == 2 && w.n == 2,
             "all bad: skipped %d, %d warnings", skipped, w.n);
    free_dump(&a);
    tt_dataset_free(&st);
  }
  TT_TEST_END();
}

/* The committed fixtures: good files decode; truncated, corrupt and over-the-limit ones fail
 * with a reason, the last from the header. */
static void test_decoder_fixtures(void) {
  static const struct {
    const char *file, *reason;
  } bad[] = {{"truncated.jpg", "truncated JPEG"},
             {"truncated.png", "truncated PNG"},
             {"corrupt.jpg", ""},
             {"corrupt.png", ""},
             {"huge_header.png", "20000x20000 = 400000000 pixels, over the limit of 64000000"},
             {"huge_header.jpg", "30000x30000 = 900000000 pixels, over the limit of 64000000"}};
  uint8_t out[3 * 12 * 16];
  char why[TT_DECODE_REASON_MAX];
  size_t i;
  TT_TEST_BEGIN("decoder_fixtures");
  printf("# JPEG decoder: %s\n", tt_image_jpeg_decoder());
  TT_CHECK(tt_image_decode_file(FX "good.jpg", 3, 12, 16, 0, out, why) == 0, "good.jpg: %s", why);
  TT_CHECK(tt_image_decode_file(FX "good.png", 3, 12, 16, 0, out, why) == 0, "good.png: %s", why);
  TT_CHECK(tt_image_decode_file(FX "good.jpg", 1, 6, 6, 0, out, why) == 0, "good.jpg grey: %s", why);
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char p[256];
    snprintf(p, sizeof p, FX "%s", bad[i].file);
    memset(why, 0, sizeof why);
    TT_CHECK(tt_image_decode_file(p, 3, 12, 16, 0, out, why) != 0 && why[0] && strstr(why, bad[i].reason),
             "%s: decoded, or the reason '%s' lacks '%s'", bad[i].file, why, bad[i].reason);
  }
  /* the limit is the caller's: a 16x12 image is over a 100-pixel limit, for both decoders */
  TT_CHECK(tt_image_decode_file(FX "good.jpg", 3, 12, 16, 100, out, why) != 0 &&
               strstr(why, "16x12 = 192 pixels, over the limit of 100"),
           "jpeg limit: %s", why);
  TT_CHECK(tt_image_decode_file(FX "good.png", 3, 12, 16, 100, out, why) != 0 &&
               strstr(why, "16x12 = 192 pixels, over the limit of 100"),
           "png limit: %s", why);
  TT_CHECK(tt_image_decode_file(FX "good.png", 3, 12, 16, 192, out, why) == 0, "png at the limit: %s", why);
  TT_TEST_END();
}

/* A large JPEG (DCT-domain downscaled by TurboJPEG) still decodes to its content: the left
 * half dark, the right half bright, after the resize. */
static void test_jpeg_downscale(void) {
  unsigned char *px = (unsigned char *)malloc(640 * 480 * 3);
  uint8_t out[3 * 32 * 32];
  char why[TT_DECODE_REASON_MAX];
  int x, y, ok = 1;
  TT_TEST_BEGIN("jpeg_downscaled_decode");
  for (y = 0; y < 480; y++)
    for (x = 0; x < 640; x++) memset(px + ((size_t)y * 640 + x) * 3, x < 320 ? 20 : 230, 3);
  stbi_write_jpg(tt_test_path("big.jpg"), 640, 480, 3, px, 90);
  free(px);
  TT_CHECK(tt_image_decode_file(tt_test_path("big.jpg"), 3, 32, 32, 0, out, why) == 0, "%s", why);
  for (y = 0; y < 32; y++)
    for (x = 0; x < 32; x++) {
      int v = out[(size_t)y * 32 + x];
      if ((x < 14 && v > 40) || (x > 17 && v < 210)) ok = 0;
    }
  TT_CHECK(ok, "downscaled content wrong: row 0 = %d %d ... %d %d", out[0], out[1], out[30], out[31]);
  TT_TEST_END();
}

/* The run's classes: a test folder missing a class is mapped by name; names for a set without
 * them come from class_names or are numbers. */
static void test_classes(void) {
  tt_dataset tr, te;
  tt_data_cfg cfg;
  tt_err err;
  int rc, i, ok = 1;
  TT_TEST_BEGIN("classes_by_name");
  memset(&cfg, 0, sizeof cfg);
  mkdir(tt_test_path("te"), 0755);
  if (rename(tt_test_path("noise/c0"), tt_test_path("te/c0")) != 0 ||
      rename(tt_test_path("noise/c2"), tt_test_path("te/c2")) != 0) {
    TT_CHECK(0, "cannot make the test folder");
    return;
  }
  /* training: c1 only, named up to 3 classes; the test folder c0, c2 */
  rc = tt_dataset_scan_folder(tt_test_path("noise"), 3, 8, 8, &tr, &err, NULL, NULL);
  TT_CHECK(rc == 0 && tt_dataset_name_classes(&cfg, 3, &tr, &err) == 0 && tr.classes == 3 &&
               !strcmp(tr.class_names[0], "c1") && !strcmp(tr.class_names[2], "2"),
           "training names: %s", err.msg);
  if (rc != 0) return;
  rc = tt_dataset_scan_folder(tt_test_path("te"), 3, 8, 8, &te, &err, NULL, NULL);
  TT_CHECK(rc == 0 && tt_dataset_map_classes(&te, &tr, &err) != 0 && strstr(err.msg, "te/c0: a test class"),
           "c0 is not a training class: %s", err.msg);
  if (rc == 0) tt_dataset_free(&te);
  free(tr.class_names[0]);
  tr.class_names[0] = (char *)malloc(3);
  strcpy(tr.class_names[0], "c2"); /* now training has c2 (index 0) and c0 (index 1) */
  free(tr.class_names[1]);
  tr.class_names[1] = (char *)malloc(3);
  strcpy(tr.class_names[1], "c0");
  rc = tt_dataset_scan_folder(tt_test_path("te"), 3, 8, 8, &te, &err, NULL, NULL);
  TT_CHECK(rc == 0 && tt_dataset_map_classes(&te, &tr, &err) == 0 && te.classes == 3, "map: %s", err.msg);
  for (i = 0; rc == 0 && i < te.n; i++) /* c0's files hold even indices img00, img03...: by path */
    if (te.labels[i] != (strstr(te.paths[i], "/c0/") ? 1 : 0)) ok = 0;
  TT_CHECK(ok, "test labels not mapped by name");
  if (rc == 0) tt_dataset_free(&te);
  tt_dataset_free(&tr);
  /* a list: names from class_names, which must count [net] classes */
  memset(&tr, 0, sizeof tr);
  strcpy(cfg.class_names, " shirt , shoe,bag ");
  TT_CHECK(tt_dataset_name_classes(&cfg, 3, &tr, &err) == 0 && !strcmp(tr.class_names[0], "shirt") &&
               !strcmp(tr.class_names[1], "shoe") && !strcmp(tr.class_names[2], "bag"),
           "class_names: %s", err.msg);
  tt_dataset_free(&tr);
  TT_CHECK(tt_dataset_name_classes(&cfg, 4, &tr, &err) != 0 && strstr(err.msg, "3 names but [net] classes = 4"),
           "count: %s", err.msg);
  tt_dataset_free(&tr);
  TT_TEST_END();
}

/* pack then format = npy: the same images as decoding the folder (in memory), by the loader. */
static void test_pack_npy(void) {
  tt_dataset st, mem, np;
  tt_err err;
  epoch_dump a = {0}, b = {0};
  int rc, kept = 0;
  char pre[1024], img[1100], lab[1100];
  size_t per = (size_t)3 * 20 * 24;
  TT_TEST_BEGIN("pack_then_npy");
  snprintf(pre, sizeof pre, "%s", tt_test_path("packed"));
  snprintf(img, sizeof img, "%s-images.npy", pre);
  snprintf(lab, sizeof lab, "%s-labels.npy", pre);
  rc = tt_dataset_scan_folder(tt_test_path("noise"), 3, 20, 24, &st, &err, NULL, NULL);
  TT_CHECK(rc == 0 && tt_pack_set(&st, pre, &kept, NULL, NULL, &err) == 0 && kept == 37, "pack: %s", err.msg);
  if (rc == 0) tt_dataset_free(&st);
  rc = tt_dataset_load_npy(img, lab, 3, 20, 24, 3, &np, &err);
  TT_CHECK(rc == 0 && np.n == 37 && np.hwc && np.map && np.class_names && !strcmp(np.class_names[1], "c1"),
           "load npy: %s", err.msg);
  if (rc != 0) return;
  TT_CHECK(tt_dataset_load_folder(tt_test_path("noise"), 3, 20, 24, &mem, &err, NULL, NULL) == 0, "%s", err.msg);
  TT_CHECK(run_epoch(&mem, 6, 0, 1, 0, 0, NULL, &a, NULL) == 0 && run_epoch(&np, 6, 0, 2, 0, 0, NULL, &b, NULL) == 0 &&
               a.total == 37 && b.total == 37 && memcmp(a.img, b.img, 37 * per) == 0 &&
               memcmp(a.lab, b.lab, 37 * sizeof(int32_t)) == 0,
           "npy batches differ from the folder decoded in memory");
  free_dump(&a);
  free_dump(&b);
  TT_CHECK(run_epoch(&mem, 8, 1, 1, 2, 0, NULL, &a, NULL) == 0 && run_epoch(&np, 8, 1, 3, 2, 0, NULL, &b, NULL) == 0 &&
               memcmp(a.img, b.img, 32 * per) == 0,
           "npy shuffled and augmented batches differ");
  free_dump(&a);
  free_dump(&b);
  tt_dataset_free(&mem);
  tt_dataset_free(&np);
  rc = tt_dataset_load_npy(img, lab, 3, 24, 24, 3, &np, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, "packed-images.npy: images are 20x24x3") && strstr(err.msg, "3x24x24"),
           "shape mismatch: %s", err.msg);
  rc = tt_dataset_load_npy(img, lab, 3, 20, 24, 2, &np, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, "packed-labels.npy: label 2 at index ") && strstr(err.msg, "not in [0, 2)"), "label range: %s",
           err.msg);
  TT_TEST_END();
}

static void copy_to(const char *from, const char *to) {
  void *p = NULL;
  size_t n = 0;
  tt_err err;
  FILE *f;
  if (tt_read_file(from, &p, &n, &err) != 0) return;
  f = fopen(to, "wb");
  if (f) {
    fwrite(p, 1, n, f);
    fclose(f);
  }
  free(p);
}

/* A pack killed between its renames: PREFIX-set.json is renamed first, so new files beside old
 * ones disagree with it and the set is refused, naming the files; simulated by packing two
 * different sets under one prefix and putting one old file back. Without the manifest (a set
 * numpy made) nothing is checked. */
static void test_pack_whole_or_not(void) {
  tt_dataset st, np;
  tt_err err;
  int rc, kept = 0, i;
  char pre[1024], img[1100], lab[1100], cls[1100], set[1100], old[1200];
  static const struct { const char *file; int b_count; const char *why; } cases[] = {
      {"labels", 37, "the labels differ"},   /* B's labels the same size as A's: only the content tells */
      {"images", 37, "the images differ"},   /* the old images (in another order) beside new labels */
      {"classes", 37, "the class names differ"},
  };
  TT_TEST_BEGIN("pack_set_whole_or_not_at_all");
  snprintf(pre, sizeof pre, "%s", tt_test_path("whole"));
  snprintf(img, sizeof img, "%s-images.npy", pre);
  snprintf(lab, sizeof lab, "%s-labels.npy", pre);
  snprintf(cls, sizeof cls, "%s-classes.json", pre);
  snprintf(set, sizeof set, "%s-set.json", pre);
  for (i = 0; i < 3; i++) {
    const char *part = !strcmp(cases[i].file, "labels") ? lab : !strcmp(cases[i].file, "images") ? img : cls;
    /* set A, whose one file is kept aside */
    rc = tt_dataset_scan_folder(tt_test_path("noise"), 3, 20, 24, &st, &err, NULL, NULL);
    TT_CHECK(rc == 0 && tt_pack_set(&st, pre, &kept, NULL, NULL, &err) == 0, "pack A: %s", err.msg);
    if (rc == 0) tt_dataset_free(&st);
    snprintf(old, sizeof old, "%s.old", part);
    copy_to(part, old);
    /* set B: other labels (each one class on), fewer images, or other names */
    rc = tt_dataset_scan_folder(tt_test_path("noise"), 3, 20, 24, &st, &err, NULL, NULL);
    if (rc == 0) {
      int j;
      for (j = 0; j < st.n; j++) st.labels[j] = (st.labels[j] + 1) % 3;
      if (i == 1) { /* the same images, the first moved last */
        char *first = st.paths[0];
        memmove(st.paths, st.paths + 1, sizeof(char *) * (size_t)(st.n - 1));
        st.paths[st.n - 1] = first;
      }
      if (i == 2) st.class_names[0][0] = 'x';
    }
    TT_CHECK(rc == 0 && tt_pack_set(&st, pre, &kept, NULL, NULL, &err) == 0 && kept == cases[i].b_count, "pack B: %s",
             err.msg);
    if (rc == 0) tt_dataset_free(&st);
    rc = tt_dataset_load_npy(img, lab, 3, 20, 24, 3, &np, &err);
    TT_CHECK(rc == 0 && np.n == cases[i].b_count, "set B whole: %s", err.msg);
    if (rc == 0) tt_dataset_free(&np);
    /* the kill: one of A's files beside B's */
    rename(old, part);
    rc = tt_dataset_load_npy(img, lab, 3, 20, 24, 3, &np, &err);
    TT_CHECK(rc != 0 && strstr(err.msg, "whole-set.json: ") && strstr(err.msg, "whole-images.npy, ") &&
                 strstr(err.msg, cases[i].why) && strstr(err.msg, "re-run tinytrain pack"),
             "%s of A beside B: rc %d: %s", cases[i].file, rc, err.msg);
    if (rc == 0) tt_dataset_free(&np);
  }
  /* no manifest (numpy's sets, older packs): read as it is */
  unlink(set);
  unlink(cls);
  rc = tt_dataset_load_npy(img, lab, 3, 20, 24, 3, &np, &err);
  TT_CHECK(rc == 0 && np.n == 37, "without a manifest: %s", err.msg);
  if (rc == 0) tt_dataset_free(&np);
  TT_TEST_END();
}

/* A .npy file as numpy writes it, or damaged: header text hdr, then body bytes of data. */
static void write_npy(const char *path, int version, const char *hdr, const void *data, size_t body) {
  FILE *f = fopen(path, "wb");
  size_t n = strlen(hdr), pad = (64 - (n + 1 + (version == 1 ? 10 : 12)) % 64) % 64, i;
  unsigned char pre[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)version, 0};
  size_t hl = n + pad + 1;
  pre[8] = (unsigned char)hl, pre[9] = (unsigned char)(hl >> 8);
  fwrite(pre, 1, version == 1 ? 10 : 12, f);
  fwrite(hdr, 1, n, f);
  for (i = 0; i < pad; i++) fputc(' ', f);
  fputc('\n', f);
  fwrite(data, 1, body, f);
  fclose(f);
}

static void test_npy_headers(void) {
  static const struct {
    int version;
    const char *hdr;
    size_t body;
    const char *want; /* in the error, or NULL: accepted */
  } cases[] = {
      {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 3), }", 12, NULL},
      {2, "{\"descr\":\"u1\",\"fortran_order\":False,\"shape\":(2,2,3,1)}", 12, NULL},
      {1, "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2, 3), }", 12, "fortran_order is True"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 3), }", 48, "dtype '<f4'"},
      {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 3), }", 11, "needs"},
      {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 3, 1, 1), }", 12, "more than 4"},
      {1, "{'descr': '|u1', 'shape': (2, 2, 3), }", 12, "lacks 'fortran_order'"},
      {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 3), 'x': 1}", 12, "unknown key 'x'"},
      {3, "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,), }", 8, "structured"},
  };
  uint8_t px[64];
  int64_t lab64[2] = {1, 0};
  tt_dataset ds;
  tt_err err;
  size_t i;
  TT_TEST_BEGIN("npy_headers");
  for (i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 9);
  {
    const char *lh = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
    write_npy(tt_test_path("l.npy"), 1, lh, lab64, sizeof lab64);
  }
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc;
    write_npy(tt_test_path("x.npy"), cases[i].version, cases[i].hdr, px, cases[i].body);
    rc = tt_dataset_load_npy(tt_test_path("x.npy"), tt_test_path("l.npy"), 1, 2, 3, 2, &ds, &err);
    if (!cases[i].want) {
      TT_CHECK(rc == 0 && ds.n == 2 && ds.labels[0] == 1 && ds.images[7] == 63, "case %zu refused: %s", i, err.msg);
      if (rc == 0) tt_dataset_free(&ds);
    } else {
      TT_CHECK(rc != 0 && strstr(err.msg, "x.npy: ") && strstr(err.msg, cases[i].want), "case %zu: '%s' lacks '%s'", i,
               err.msg, cases[i].want);
    }
  }
  TT_TEST_END();
}

/* RandomResizedCrop boxes: inside the image, area and aspect in their ranges, spread out, the
 * fallback when no draw fits; Resize + CenterCrop takes the centre. */
static void test_crop_boxes(void) {
  tt_crop cr;
  double b[4];
  int k, outside = 0, bad_area = 0, bad_ratio = 0, small = 0, large = 0;
  TT_TEST_BEGIN("random_resized_crop_boxes");
  memset(&cr, 0, sizeof cr);
  cr.mode = TT_CROP_RANDOM_RESIZED; /* ImageNet defaults */
  for (k = 0; k < 2000; k++) {
    double bw, bh, area;
    cr.key = tt_mix64((uint64_t)k);
    tt_crop_box(&cr, 500, 375, 224, 224, b);
    bw = b[2] - b[0], bh = b[3] - b[1], area = bw * bh / (500.0 * 375);
    if (b[0] < 0 || b[1] < 0 || b[2] > 500 || b[3] > 375 || bw < 1 || bh < 1) outside++;
    if (area < 0.075 || area > 1.0) bad_area++;
    if (bw / bh < 0.74 || bw / bh > 1.35) bad_ratio++;
    small += area < 0.3;
    large += area > 0.8;
  }
  TT_CHECK(outside == 0 && bad_area == 0 && bad_ratio < 20 && small > 400 && large > 40,
           "outside %d, area out of range %d, ratio out of range %d, small %d, large %d", outside, bad_area, bad_ratio,
           small, large);
  /* no draw can fit: the centre crop clamped to the ratio */
  cr.scale[0] = 0.9f, cr.scale[1] = 1, cr.ratio[0] = cr.ratio[1] = 1;
  tt_crop_box(&cr, 1000, 10, 10, 10, b);
  TT_CHECK(b[0] == 495 && b[1] == 0 && b[2] == 505 && b[3] == 10, "fallback box %g %g %g %g", b[0], b[1], b[2], b[3]);
  memset(&cr, 0, sizeof cr);
  cr.mode = TT_CROP_RESIZE_CENTER, cr.resize = 256;
  tt_crop_box(&cr, 512, 400, 224, 224, b); /* scale 0.64: a 350 x 350 centre box */
  TT_CHECK(fabs(b[0] - 81) < 1e-9 && fabs(b[1] - 25) < 1e-9 && fabs(b[2] - 431) < 1e-9 && fabs(b[3] - 375) < 1e-9,
           "resize box %g %g %g %g", b[0], b[1], b[2], b[3]);
  TT_TEST_END();
}

/* The crops through the decoder and the loader: the evaluation transform takes the centre, a
 * random crop is the same for any thread count and on resume, and differs from no crop. */
static void test_crop_pipeline(void) {
  unsigned char px[40 * 40];
  uint8_t out[10 * 10];
  char why[TT_DECODE_REASON_MAX];
  tt_crop cr;
  tt_dataset syn, st;
  tt_err err;
  epoch_dump a = {0}, b = {0}, c = {0};
  int x, y, white = 1, dark = 0, rc;
  TT_TEST_BEGIN("crop_pipeline");
  for (y = 0; y < 40; y++)
    for (x = 0; x < 40; x++) px[y * 40 + x] = (x >= 5 && x < 35 && y >= 5 && y < 35) ? 255 : 0;
  stbi_write_png(tt_test_path("sq.png"), 40, 40, 1, px, 40);
  memset(&cr, 0, sizeof cr);
  cr.mode = TT_CROP_RESIZE_CENTER, cr.resize = 20; /* 40 -> 20, centre 10 x 10: inside the white square */
  TT_CHECK(tt_image_decode_file_crop(tt_test_path("sq.png"), 1, 10, 10, 0, &cr, out, why) == 0, "%s", why);
  for (x = 0; x < 100; x++) white &= out[x] > 230;
  TT_CHECK(white, "resize + centre crop is not the centre: corner %d", out[0]);
  TT_CHECK(tt_image_decode_file_crop(tt_test_path("sq.png"), 1, 10, 10, 0, NULL, out, why) == 0, "%s", why);
  dark = out[0] < 30 && out[99] < 30;
  TT_CHECK(dark, "fit: corners %d %d should be dark", out[0], out[99]);
  /* in memory: random resized crops, the same whatever the threads, on resume too */
  memset(&cr, 0, sizeof cr);
  cr.mode = TT_CROP_RANDOM_RESIZED;
  rc = tt_dataset_synthetic(50, 3, 16, 16, 4, 3, &syn, &err);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (rc != 0) return;
  TT_CHECK(run_epoch(&syn, 8, 1, 1, 1, 0, NULL, &a, NULL) == 0, "plain");
  g_crop = &cr;
  TT_CHECK(run_epoch(&syn, 8, 1, 1, 1, 0, NULL, &b, NULL) == 0 && run_epoch(&syn, 8, 1, 3, 1, 2, NULL, &c, NULL) == 0,
           "rrc epochs");
  TT_CHECK(memcmp(a.img, b.img, 48 * 768) != 0 && memcmp(a.lab, b.lab, 48 * sizeof(int32_t)) == 0,
           "the crop changed nothing, or changed the order");
  TT_CHECK(c.total == 32 && memcmp(b.img + 16 * 768, c.img, 32 * 768) == 0, "resumed with 3 threads differs");
  free_dump(&a);
  free_dump(&b);
  free_dump(&c);
  tt_dataset_free(&syn);
  /* streaming: the crop is drawn on the full decoded image */
  mkdir(tt_test_path("sq"), 0755);
  mkdir(tt_test_path("sq/a"), 0755);
  for (x = 0; x < 12; x++) {
    char p[64];
    snprintf(p, sizeof p, "sq/a/%02d.png", x);
    stbi_write_png(tt_test_path(p), 40, 40, 1, px, 40);
  }
  rc = tt_dataset_scan_folder(tt_test_path("sq"), 1, 10, 10, &st, &err, NULL, NULL);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (rc == 0) {
    TT_CHECK(run_epoch(&st, 4, 1, 1, 0, 0, NULL, &a, NULL) == 0 && run_epoch(&st, 4, 1, 2, 0, 0, NULL, &b, NULL) == 0 &&
                 a.total == 12 && memcmp(a.img, b.img, 1200) == 0,
             "streaming crops differ between 1 and 2 threads");
    for (x = 0, dark = 0; x < 12; x++) dark += memcmp(a.img, a.img + 100 * x, 100) != 0;
    TT_CHECK(dark > 6, "the same image gave the same crop at %d of 12 positions", 12 - dark);
    free_dump(&a);
    free_dump(&b);
    tt_dataset_free(&st);
  }
  g_crop = NULL;
  TT_TEST_END();
}

/* A JPEG crop decoded alone (the box's rows and iMCU columns) gives the pixels a whole decode
 * gives: the same result as cropping the whole decoded image. */
static void test_jpeg_box_decode(void) {
  unsigned char *px = (unsigned char *)malloc(120 * 90 * 3);
  uint8_t *full = (uint8_t *)malloc(3 * 90 * 120), *a = (uint8_t *)malloc(3 * 128 * 128), *b = (uint8_t *)malloc(3 * 128 * 128);
  char why[TT_DECODE_REASON_MAX];
  tt_crop cr;
  uint64_t s = 9;
  int i, k, same = 0, mode;
  TT_TEST_BEGIN("jpeg_crop_decode_exact");
  for (i = 0; i < 120 * 90 * 3; i++) px[i] = (unsigned char)(tt_splitmix_next(&s) & 255);
  stbi_write_jpg(tt_test_path("box.jpg"), 120, 90, 3, px, 85);
  TT_CHECK(tt_image_decode_file(tt_test_path("box.jpg"), 3, 90, 120, 0, full, why) == 0, "%s", why);
  for (mode = 0, k = 0; mode < 2; mode++)
    for (i = 0; i < 20; i++, k++) {
      memset(&cr, 0, sizeof cr);
      cr.mode = mode ? TT_CROP_RESIZE_CENTER : TT_CROP_RANDOM_RESIZED, cr.resize = 140 + i, cr.key = tt_mix64((uint64_t)i);
      if (tt_image_decode_file_crop(tt_test_path("box.jpg"), 3, 128, 128, 0, &cr, a, why) != 0 ||
          tt_image_crop_resize(full, 120, 90, 3, 0, &cr, 128, 128, b) != 0)
        continue;
      same += memcmp(a, b, 3 * 128 * 128) == 0;
    }
  TT_CHECK(same == 40, "%d of 40 crops equal to the crop of the whole decode", same);
  free(px);
  free(full);
  free(a);
  free(b);
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("stream_equals_memory", "data stream", test_stream_equals_memory),
  TT_TEST("stream_corrupt", "data stream", test_stream_corrupt),
  TT_TEST("decoder_fixtures", "data stream", test_decoder_fixtures),
  TT_TEST("jpeg_downscale", "data stream", test_jpeg_downscale),
  TT_TEST("pack_npy", "data stream", test_pack_npy),
  TT_TEST("pack_whole_or_not", "data stream", test_pack_whole_or_not),
  TT_TEST("npy_headers", "data stream", test_npy_headers),
  TT_TEST("classes", "data stream", test_classes),
  TT_TEST("crop_boxes", "data stream", test_crop_boxes),
  TT_TEST("crop_pipeline", "data stream", test_crop_pipeline),
  TT_TEST("jpeg_box_decode", "data stream", test_jpeg_box_decode),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
