/* tests/data/test_data.c — datasets (IDX, folders, list files, synthetic) and the loader.
 * Build: gcc -std=c11 -O2 -Wall -Wextra -pthread -I. tests/data/test_data.c core/data*.c core/data/loader.c
 *        core/base/fileio.c core/base/util.c -lz -lm -o /tmp/test_data */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "core/data/data.h"
#include "core/base/fileio.h"
#include "tests/tt_test.h"

#include "tests/tt_stb_write.h"
#include "tests/tt_image_write.h"
#include <fcntl.h>
#include <sys/resource.h>
#ifdef TT_HAVE_TURBOJPEG
#include <turbojpeg.h>

/* whether this build runs under AddressSanitizer (gcc defines __SANITIZE_ADDRESS__; clang has
 * __has_feature) */
#if defined(__SANITIZE_ADDRESS__)
#define TT_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TT_TEST_UNDER_ASAN 1
#endif
#endif
#ifndef TT_TEST_UNDER_ASAN
#define TT_TEST_UNDER_ASAN 0
#endif
#endif

#define FMNIST "/usr/share/datasets/fashion-mnist/"

static int write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  if (n) fwrite(p, 1, n, f);
  fclose(f);
  return 0;
}

static int exists(const char *p) { return access(p, R_OK) == 0; }

typedef struct warns {
  int n;
  char last[1400];
  char all[8192];
} warns;

static void on_warn(void *ud, const char *line) {
  warns *w = (warns *)ud;
  w->n++;
  snprintf(w->last, sizeof w->last, "%s", line);
  if (strlen(w->all) + strlen(line) + 2 < sizeof w->all) {
    strcat(w->all, line);
    strcat(w->all, "\n");
  }
}

/* A small IDX file pair written by hand: n images h x w and n_labels labels. */
static void write_idx(const char *img, const char *lab, int n, int h, int w, int n_labels, int magic_img) {
  unsigned char hdr[16];
  size_t i, bytes = (size_t)n * h * w;
  unsigned char *px = (unsigned char *)malloc(bytes + 1);
  unsigned char *lb = (unsigned char *)malloc((size_t)n_labels + 1);
  FILE *f;
  for (i = 0; i < bytes; i++) px[i] = (unsigned char)(i * 7);
  for (i = 0; i < (size_t)n_labels; i++) lb[i] = (unsigned char)(i % 3);
  hdr[0] = hdr[1] = 0, hdr[2] = 8, hdr[3] = (unsigned char)magic_img;
  hdr[4] = 0, hdr[5] = 0, hdr[6] = (unsigned char)(n >> 8), hdr[7] = (unsigned char)n;
  hdr[8] = hdr[9] = hdr[10] = 0, hdr[11] = (unsigned char)h;
  hdr[12] = hdr[13] = hdr[14] = 0, hdr[15] = (unsigned char)w;
  f = fopen(img, "wb");
  fwrite(hdr, 1, 16, f);
  fwrite(px, 1, bytes, f);
  fclose(f);
  hdr[3] = 1;
  hdr[6] = (unsigned char)(n_labels >> 8), hdr[7] = (unsigned char)n_labels;
  f = fopen(lab, "wb");
  fwrite(hdr, 1, 8, f);
  fwrite(lb, 1, (size_t)n_labels, f);
  fclose(f);
  free(px);
  free(lb);
}

static int gunzip_to(const char *src, const char *dst) {
  gzFile g = gzopen(src, "rb");
  FILE *f;
  char buf[65536];
  int k;
  if (!g) return -1;
  f = fopen(dst, "wb");
  while ((k = gzread(g, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)k, f);
  fclose(f);
  gzclose(g);
  return 0;
}

static void test_idx_small(void) {
  tt_dataset ds;
  tt_err err;
  int rc;
  TT_TEST_BEGIN("idx_small_raw_and_errors");
  write_idx(tt_test_path("a-img"), tt_test_path("a-lab"), 5, 4, 3, 5, 3);
  rc = tt_dataset_load_idx(tt_test_path("a-img"), tt_test_path("a-lab"), 1, 4, 3, &ds, &err);
  TT_CHECK(rc == 0, "small idx: %s", err.msg);
  if (rc == 0) {
    TT_CHECK(ds.n == 5 && ds.c == 1 && ds.h == 4 && ds.w == 3 && ds.classes == 3, "shape %d %d %d %d cls %d", ds.n,
             ds.c, ds.h, ds.w, ds.classes);
    TT_CHECK(ds.images[13] == (unsigned char)(13 * 7) && ds.labels[4] == 1, "content");
    tt_dataset_free(&ds);
  }
  /* shape mismatch names both shapes */
  rc = tt_dataset_load_idx(tt_test_path("a-img"), tt_test_path("a-lab"), 1, 28, 28, &ds, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, "1x4x3") && strstr(err.msg, "1x28x28") && strstr(err.msg, "a-img"),
           "shape mismatch msg: %s", err.msg);
  /* count mismatch */
  write_idx(tt_test_path("b-img"), tt_test_path("b-lab"), 5, 4, 3, 4, 3);
  rc = tt_dataset_load_idx(tt_test_path("b-img"), tt_test_path("b-lab"), 1, 4, 3, &ds, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, "5 images") && strstr(err.msg, "4 labels"), "count mismatch: %s", err.msg);
  /* wrong magic: labels file given as images, and a 4-dim magic */
  rc = tt_dataset_load_idx(tt_test_path("a-lab"), tt_test_path("a-lab"), 1, 4, 3, &ds, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, "magic") && strstr(err.msg, "a-lab"), "wrong magic: %s", err.msg);
  write_idx(tt_test_path("c-img"), tt_test_path("c-lab"), 5, 4, 3, 5, 4);
  rc = tt_dataset_load_idx(tt_test_path("c-img"), tt_test_path("c-lab"), 1, 4, 3, &ds, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, "magic"), "4-dim magic: %s", err.msg);
  {
    const char *junk = "GIF89a not idx at all";
    write_bytes(tt_test_path("junk"), junk, strlen(junk));
    rc = tt_dataset_load_idx(tt_test_path("junk"), tt_test_path("a-lab"), 1, 4, 3, &ds, &err);
    TT_CHECK(rc != 0 && strstr(err.msg, "magic") && strstr(err.msg, "junk"), "junk: %s", err.msg);
  }
  /* truncated pixels and labels */
  {
    void *p;
    size_t n;
    tt_read_file(tt_test_path("a-img"), &p, &n, &err);
    write_bytes(tt_test_path("t-img"), p, n - 7);
    free(p);
    rc = tt_dataset_load_idx(tt_test_path("t-img"), tt_test_path("a-lab"), 1, 4, 3, &ds, &err);
    TT_CHECK(rc != 0 && strstr(err.msg, "truncated") && strstr(err.msg, "t-img") && strstr(err.msg, "60 bytes"),
             "truncated images: %s", err.msg);
    tt_read_file(tt_test_path("a-lab"), &p, &n, &err);
    write_bytes(tt_test_path("t-lab"), p, n - 1);
    write_bytes(tt_test_path("t-hdr"), p, 6);
    free(p);
    rc = tt_dataset_load_idx(tt_test_path("a-img"), tt_test_path("t-lab"), 1, 4, 3, &ds, &err);
    TT_CHECK(rc != 0 && strstr(err.msg, "truncated") && strstr(err.msg, "t-lab"), "truncated labels: %s", err.msg);
    rc = tt_dataset_load_idx(tt_test_path("a-img"), tt_test_path("t-hdr"), 1, 4, 3, &ds, &err);
    TT_CHECK(rc != 0 && strstr(err.msg, "truncated") && strstr(err.msg, "t-hdr"), "truncated header: %s", err.msg);
  }
  rc = tt_dataset_load_idx(tt_test_path("missing"), tt_test_path("a-lab"), 1, 4, 3, &ds, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, "missing"), "missing file: %s", err.msg);
  TT_TEST_END();
}

static void test_idx_fashion(void) {
  tt_data_cfg cfg;
  tt_dataset gz, raw;
  tt_err err;
  int rc, i, bad = 0, hist[10] = {0};
  if (!exists(FMNIST "t10k-images-idx3-ubyte.gz") || !exists(FMNIST "t10k-labels-idx1-ubyte.gz")) {
    TT_SKIP("idx_fashion_mnist", "no " FMNIST "t10k-*-ubyte.gz; install the dataset to run this check");
    return;
  }
  TT_TEST_BEGIN("idx_fashion_mnist");
  memset(&cfg, 0, sizeof cfg);
  cfg.format = TT_DATA_IDX;
  strcpy(cfg.test, FMNIST "t10k-images-idx3-ubyte.gz");
  strcpy(cfg.test_labels, FMNIST "t10k-labels-idx1-ubyte.gz");
  rc = tt_dataset_load(&cfg, 0, 1, 28, 28, &gz, &err, NULL, NULL);
  TT_CHECK(rc == 0, "load gz: %s", err.msg);
  if (rc != 0) return;
  TT_CHECK(gz.n == 10000 && gz.c == 1 && gz.h == 28 && gz.w == 28 && gz.classes == 10, "shape %d %dx%dx%d cls %d",
           gz.n, gz.c, gz.h, gz.w, gz.classes);
  for (i = 0; i < gz.n; i++) {
    if (gz.labels[i] < 0 || gz.labels[i] > 9) bad++;
    else hist[gz.labels[i]]++;
  }
  TT_CHECK(bad == 0 && hist[0] == 1000 && hist[9] == 1000, "labels: bad %d, class0 %d", bad, hist[0]);
  /* raw (uncompressed) copy: same bytes */
  gunzip_to(cfg.test, tt_test_path("raw-img"));
  gunzip_to(cfg.test_labels, tt_test_path("raw-lab"));
  strcpy(cfg.test, tt_test_path("raw-img"));
  strcpy(cfg.test_labels, tt_test_path("raw-lab"));
  rc = tt_dataset_load(&cfg, 0, 1, 28, 28, &raw, &err, NULL, NULL);
  TT_CHECK(rc == 0, "load raw: %s", err.msg);
  if (rc == 0) {
    TT_CHECK(raw.n == gz.n && memcmp(raw.images, gz.images, (size_t)gz.n * 784) == 0 &&
                 memcmp(raw.labels, gz.labels, sizeof(int32_t) * (size_t)gz.n) == 0,
             "raw and gz differ");
    tt_dataset_free(&raw);
  }
  /* a truncated gzip file: error names the file */
  {
    void *p;
    size_t n;
    if (tt_read_file(FMNIST "t10k-images-idx3-ubyte.gz", &p, &n, &err) == 0) {
      write_bytes(tt_test_path("cut-img.gz"), p, n / 2);
      free(p);
      strcpy(cfg.test, tt_test_path("cut-img.gz"));
      rc = tt_dataset_load(&cfg, 0, 1, 28, 28, &raw, &err, NULL, NULL);
      TT_CHECK(rc != 0 && strstr(err.msg, "cut-img.gz") && (strstr(err.msg, "truncated") || strstr(err.msg, "corrupt")),
               "truncated gz: %s", err.msg);
    }
  }
  /* wrong shape from the recipe: message gives both shapes */
  strcpy(cfg.test, FMNIST "t10k-images-idx3-ubyte.gz");
  rc = tt_dataset_load(&cfg, 0, 3, 32, 32, &raw, &err, NULL, NULL);
  TT_CHECK(rc != 0 && strstr(err.msg, "1x28x28") && strstr(err.msg, "3x32x32"), "shape msg: %s", err.msg);
  tt_dataset_free(&gz);
  TT_TEST_END();
}

/* ---- folders and list files ---- */

static const unsigned char class_rgb[3][3] = {{220, 30, 30}, {30, 200, 40}, {20, 40, 230}};

static void solid(unsigned char *px, int w, int h, const unsigned char *rgb) {
  int i;
  for (i = 0; i < w * h; i++) memcpy(px + 3 * i, rgb, 3);
}

static void cut_copy(const char *src, const char *dst, double frac) {
  void *p;
  size_t n;
  tt_err err;
  if (tt_read_file(src, &p, &n, &err) == 0) {
    write_bytes(dst, p, (size_t)(n * frac));
    free(p);
  }
}

/* root/{a_red,b_green,c_blue}: 9 good images (PNG, BMP, JPEG of various sizes) and 4 bad
 * files (corrupt, truncated PNG, truncated JPEG, text). */
static void make_folder(const char *root) {
  static const char *cls[3] = {"a_red", "b_green", "c_blue"};
  unsigned char *px = (unsigned char *)malloc(64 * 48 * 3);
  char p[1024], q[1024];
  int k;
  mkdir(root, 0755);
  for (k = 0; k < 3; k++) {
    snprintf(p, sizeof p, "%s/%s", root, cls[k]);
    mkdir(p, 0755);
    solid(px, 64, 48, class_rgb[k]);
    snprintf(p, sizeof p, "%s/%s/img0.png", root, cls[k]);
    stbi_write_png(p, 64, 48, 3, px, 64 * 3);
    solid(px, 20, 30, class_rgb[k]);
    snprintf(p, sizeof p, "%s/%s/img1.bmp", root, cls[k]);
    stbi_write_bmp(p, 20, 30, 3, px);
    solid(px, 16, 16, class_rgb[k]);
    snprintf(p, sizeof p, "%s/%s/img2.jpg", root, cls[k]);
    stbi_write_jpg(p, 16, 16, 3, px, 95);
  }
  /* bad files, all in class b */
  snprintf(p, sizeof p, "%s/b_green/bad_corrupt.png", root);
  write_bytes(p, "\x89PNG\r\n\x1a\n garbage garbage garbage IEND....", 40);
  {
    /* a noisy image so that compression keeps it big enough to cut in the middle */
    int i;
    for (i = 0; i < 64 * 48 * 3; i++) px[i] = (unsigned char)((i * 2654435761u) >> 24);
    snprintf(q, sizeof q, "%s/noise.png", tt_test_dir());
    stbi_write_png(q, 64, 48, 3, px, 64 * 3);
    snprintf(p, sizeof p, "%s/b_green/bad_trunc.png", root);
    cut_copy(q, p, 0.6);
    snprintf(q, sizeof q, "%s/noise.jpg", tt_test_dir());
    stbi_write_jpg(q, 64, 48, 3, px, 95);
    snprintf(p, sizeof p, "%s/b_green/bad_trunc.jpg", root);
    cut_copy(q, p, 0.6);
  }
  snprintf(p, sizeof p, "%s/b_green/notes.txt", root);
  write_bytes(p, "this is not an image\n", 21);
  free(px);
}

static void check_colors(const tt_dataset *ds, int tol, const char *what) {
  int i, ch, bad = -1;
  size_t per = (size_t)ds->c * ds->h * ds->w, hw = (size_t)ds->h * ds->w, j;
  for (i = 0; i < ds->n && bad < 0; i++)
    for (ch = 0; ch < 3 && bad < 0; ch++)
      for (j = 0; j < hw; j++) {
        int v = ds->images[per * i + ch * hw + j], want = class_rgb[ds->labels[i]][ch];
        if (abs(v - want) > tol) {
          bad = i;
          break;
        }
      }
  TT_CHECK(bad < 0, "%s: image %d (label %d) has the wrong colour", what, bad, bad >= 0 ? ds->labels[bad] : -1);
}

static void test_folder(void) {
  tt_dataset ds;
  tt_err err;
  warns w;
  int rc, i, count[3] = {0, 0, 0};
  const char *root = tt_test_path("folder");
  TT_TEST_BEGIN("folder_decode_skip_resize");
  make_folder(root);
  memset(&w, 0, sizeof w);
  /* 3 of its 12 images fail to decode: at the default max_failed (0.01) that stops the decode
   * (the loader's rule, in memory too), under a share of 0.25 they are skipped */
  rc = tt_dataset_load_folder(root, 3, 8, 8, &ds, &err, on_warn, &w);
  TT_CHECK(rc == -1 && strstr(err.msg, "folder: 1 of its 12 images failed to decode, over max_failed = 0.01") &&
               w.n == 2 && strstr(w.all, "notes.txt: skipped (") && strstr(w.all, ": skipped ("),
           "default share: rc %d, %d warnings: %s\n%s", rc, w.n, err.msg, w.all);
  memset(&w, 0, sizeof w);
  rc = tt_dataset_scan_folder(root, 3, 8, 8, &ds, &err, on_warn, &w);
  ds.max_failed = 0.25f, ds.max_failed_set = 1;
  if (rc == 0) rc = tt_dataset_decode_all(&ds, &err, on_warn, &w);
  TT_CHECK(rc == 0, "folder load: %s", err.msg);
  if (rc != 0) return;
  TT_CHECK(ds.n == 9 && ds.skipped == 4 && ds.classes == 3 && ds.c == 3 && ds.h == 8 && ds.w == 8,
           "n %d skipped %d classes %d", ds.n, ds.skipped, ds.classes);
  TT_CHECK(w.n == 4 && strstr(w.all, "bad_corrupt.png: skipped (") && strstr(w.all, "bad_trunc.png: skipped (") &&
               strstr(w.all, "bad_trunc.jpg: skipped (") && strstr(w.all, "notes.txt: skipped ("),
           "warnings (%d):\n%s", w.n, w.all);
  TT_CHECK(strstr(w.all, "truncated JPEG") != NULL, "truncated JPEG reason missing:\n%s", w.all);
  for (i = 0; i < ds.n; i++)
    if (ds.labels[i] >= 0 && ds.labels[i] < 3) count[ds.labels[i]]++;
  TT_CHECK(count[0] == 3 && count[1] == 3 && count[2] == 3, "per class %d %d %d", count[0], count[1], count[2]);
  check_colors(&ds, 12, "rgb");
  tt_dataset_free(&ds);
  /* grey decode: one channel */
  memset(&w, 0, sizeof w);
  rc = tt_dataset_scan_folder(root, 1, 5, 7, &ds, &err, on_warn, &w);
  ds.max_failed = 0.25f, ds.max_failed_set = 1;
  if (rc == 0) rc = tt_dataset_decode_all(&ds, &err, on_warn, &w);
  TT_CHECK(rc == 0 && ds.n == 9 && ds.c == 1 && ds.h == 5 && ds.w == 7, "grey: %s", err.msg);
  if (rc == 0) tt_dataset_free(&ds);
  TT_TEST_END();
}

/* stb_image 2.27 itself rejects a PNG cut inside its data and a baseline JPEG cut anywhere
 * ("expected marker"), but decodes a PNG cut just before its IEND chunk and a BMP cut
 * short (missing rows read as zeros). The container checks in data_image.c catch those. */
/* A list decoded into memory at 3x8x8 with a max_failed share (tt_dataset_load_list's default
 * of 0.01 stops at the first failure of a small list). */
static int load_list_share(const char *path, float share, tt_dataset *ds, tt_err *err, warns *w) {
  int rc = tt_dataset_scan_list(path, 3, 8, 8, 0, ds, err, on_warn, w);
  ds->max_failed = share, ds->max_failed_set = 1;
  return rc ? rc : tt_dataset_decode_all(ds, err, on_warn, w);
}

/* Writes LIST (in the test dir) naming the damaged file BAD, then the image GOOD, both label 0,
 * and checks that it loads at max_failed 0.5 with BAD skipped and a warning holding WANT. */
static void one_of_two_skipped(const char *list, const char *bad, const char *good, const char *want) {
  tt_dataset ds;
  tt_err err;
  warns w;
  int rc;
  FILE *f = fopen(tt_test_path(list), "w");
  fprintf(f, "%s 0\n%s 0\n", bad, good);
  fclose(f);
  memset(&w, 0, sizeof w);
  rc = load_list_share(tt_test_path(list), 0.5f, &ds, &err, &w); /* 1 of 2 fails */
  TT_CHECK(rc == 0 && ds.n == 1 && ds.skipped == 1 && strstr(w.all, want), "%s: %s %s", list, err.msg, w.all);
  if (rc == 0) tt_dataset_free(&ds);
}

static void test_truncation_claims(void) {
  tt_dataset ds;
  tt_err err;
  warns w;
  FILE *f;
  int rc;
  TT_TEST_BEGIN("folder_truncated_files");
  /* a list with only the truncated files: every one skipped -> error naming the list */
  f = fopen(tt_test_path("bad.list"), "w");
  fprintf(f, "folder/b_green/bad_trunc.png 0\nfolder/b_green/bad_trunc.jpg 1\n");
  fclose(f);
  memset(&w, 0, sizeof w);
  rc = tt_dataset_load_list(tt_test_path("bad.list"), 3, 8, 8, &ds, &err, on_warn, &w);
  TT_CHECK(rc != 0 && strstr(err.msg, "bad.list: 1 of its 2 images failed to decode, over max_failed = 0.01") && w.n == 1,
           "all-bad list: rc %d, %d warnings: %s", rc, w.n, err.msg);
  /* 8 of 9 fail under max_failed = 0.8: the first 5 named, then one line that counts, and the
   * 8th failure (over 7.2) stops the decode with an error naming the list */
  f = fopen(tt_test_path("bad8.list"), "w");
  for (rc = 0; rc < 8; rc++) fprintf(f, "folder/b_green/bad_trunc.%s 0\n", rc % 2 ? "jpg" : "png");
  fprintf(f, "folder/a_red/img0.png 0\n");
  fclose(f);
  memset(&w, 0, sizeof w);
  rc = tt_dataset_scan_list(tt_test_path("bad8.list"), 3, 8, 8, 0, &ds, &err, on_warn, &w);
  ds.max_failed = 0.8f, ds.max_failed_set = 1;
  if (rc == 0) rc = tt_dataset_decode_all(&ds, &err, on_warn, &w);
  TT_CHECK(rc == -1 && strstr(err.msg, "bad8.list: 8 of its 9 images failed to decode, over max_failed = 0.8") &&
               w.n == 6 && strstr(w.last, "bad8.list: more images fail to decode; counted, not listed"),
           "max_failed in memory: rc %d, %d warnings: %s\n%s", rc, w.n, err.msg, w.all);
  TT_CHECK(ds.n == 0 && !ds.paths && !ds.images, "the set is freed on the error");
  /* a PNG without its final IEND chunk (stb alone decodes it) */
  {
    void *p;
    size_t n;
    if (tt_read_file(tt_test_path("folder/a_red/img0.png"), &p, &n, &err) == 0) {
      write_bytes(tt_test_path("noiend.png"), p, n - 12);
      free(p);
    }
  }
  one_of_two_skipped("png.list", "noiend.png", "folder/a_red/img0.png", "noiend.png: skipped (truncated PNG");
  /* a BMP cut short is caught by its header's size */
  cut_copy(tt_test_path("folder/a_red/img1.bmp"), tt_test_path("cut.bmp"), 0.7);
  one_of_two_skipped("bmp.list", "cut.bmp", "folder/a_red/img1.bmp", "cut.bmp: skipped (truncated BMP");
  TT_TEST_END();
}

static void test_folder_errors(void) {
  tt_dataset ds;
  tt_err err;
  int rc;
  TT_TEST_BEGIN("folder_errors");
  mkdir(tt_test_path("empty"), 0755);
  rc = tt_dataset_load_folder(tt_test_path("empty"), 3, 8, 8, &ds, &err, NULL, NULL);
  TT_CHECK(rc != 0 && strstr(err.msg, tt_test_path("empty")) && strstr(err.msg, "subfolder"), "empty: %s", err.msg);
  mkdir(tt_test_path("empty2"), 0755);
  mkdir(tt_test_path("empty2/cls"), 0755);
  rc = tt_dataset_load_folder(tt_test_path("empty2"), 3, 8, 8, &ds, &err, NULL, NULL);
  TT_CHECK(rc != 0 && strstr(err.msg, tt_test_path("empty2")), "no files: %s", err.msg);
  rc = tt_dataset_load_folder(tt_test_path("nope"), 3, 8, 8, &ds, &err, NULL, NULL);
  TT_CHECK(rc != 0 && strstr(err.msg, tt_test_path("nope")), "missing: %s", err.msg);
  TT_TEST_END();
}

static void test_resize_crop(void) {
  /* 40x20: left half black, right half white. Centre crop keeps columns 10..29, so the
   * 10x10 result is black on the left five columns, white on the right five. */
  unsigned char px[40 * 20];
  tt_dataset ds;
  tt_err err;
  int x, y, rc, ok = 1;
  FILE *f;
  TT_TEST_BEGIN("folder_resize_centre_crop");
  for (y = 0; y < 20; y++)
    for (x = 0; x < 40; x++) px[y * 40 + x] = x < 20 ? 0 : 255;
  stbi_write_png(tt_test_path("half.png"), 40, 20, 1, px, 40);
  f = fopen(tt_test_path("half.list"), "w");
  fprintf(f, "half.png 0\n");
  fclose(f);
  rc = tt_dataset_load_list(tt_test_path("half.list"), 1, 10, 10, &ds, &err, NULL, NULL);
  TT_CHECK(rc == 0, "%s", err.msg);
  if (rc != 0) return;
  for (y = 0; y < 10; y++)
    for (x = 0; x < 10; x++) {
      int v = ds.images[y * 10 + x];
      if (x <= 3 && v > 20) ok = 0;
      if (x >= 6 && v < 235) ok = 0;
    }
  TT_CHECK(ok, "crop: row 0 = %d %d %d %d %d %d %d %d %d %d", ds.images[0], ds.images[1], ds.images[2], ds.images[3],
           ds.images[4], ds.images[5], ds.images[6], ds.images[7], ds.images[8], ds.images[9]);
  tt_dataset_free(&ds);
  TT_TEST_END();
}

static void test_list(void) {
  tt_dataset ds;
  tt_err err;
  warns w;
  FILE *f;
  int rc;
  TT_TEST_BEGIN("list_file");
  f = fopen(tt_test_path("train.list"), "w");
  fprintf(f, "# comment\n\nfolder/a_red/img0.png 0\n  folder/c_blue/img2.jpg   2  \r\n");
  fprintf(f, "%s 1\nfolder/b_green/notes.txt 1\n", tt_test_path("folder/b_green/img1.bmp"));
  fclose(f);
  memset(&w, 0, sizeof w);
  {
    tt_data_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.format = TT_DATA_LIST;
    strcpy(cfg.train, tt_test_path("train.list"));
    cfg.max_failed = 0.5f, cfg.max_failed_set = 1; /* 1 of its 4 images fails */
    rc = tt_dataset_load(&cfg, 1, 3, 6, 6, &ds, &err, on_warn, &w);
  }
  TT_CHECK(rc == 0, "list: %s", err.msg);
  if (rc != 0) return;
  /* tt_dataset_load streams a list: paths and labels only, the text file found at decoding */
  TT_CHECK(!ds.images && ds.paths && ds.n == 4 && ds.skipped == 0 && w.n == 0, "streaming list: n %d images %p",
           ds.n, (void *)ds.images);
  rc = tt_dataset_decode_all(&ds, &err, on_warn, &w);
  TT_CHECK(rc == 0 && ds.images && !ds.paths, "decode_all: %s", err.msg);
  if (rc != 0) return;
  TT_CHECK(ds.n == 3 && ds.skipped == 1 && ds.classes == 3 && w.n == 1, "n %d skipped %d classes %d warns %d", ds.n,
           ds.skipped, ds.classes, w.n);
  TT_CHECK(ds.labels[0] == 0 && ds.labels[1] == 2 && ds.labels[2] == 1, "labels %d %d %d", ds.labels[0], ds.labels[1],
           ds.labels[2]);
  check_colors(&ds, 12, "list");
  tt_dataset_free(&ds);
  f = fopen(tt_test_path("badlabel.list"), "w");
  fprintf(f, "folder/a_red/img0.png 0\nfolder/a_red/img1.bmp cat\n");
  fclose(f);
  rc = tt_dataset_load_list(tt_test_path("badlabel.list"), 3, 6, 6, &ds, &err, NULL, NULL);
  TT_CHECK(rc != 0 && strstr(err.msg, "badlabel.list:2:"), "bad label: %s", err.msg);
  f = fopen(tt_test_path("nolabel.list"), "w");
  fprintf(f, "folder/a_red/img0.png\n");
  fclose(f);
  rc = tt_dataset_load_list(tt_test_path("nolabel.list"), 3, 6, 6, &ds, &err, NULL, NULL);
  TT_CHECK(rc != 0 && strstr(err.msg, "nolabel.list:1:"), "no label: %s", err.msg);
  TT_TEST_END();
}

/* ---- special files: named pipes, directories, dangling links ---- */

static void test_fifo_inputs(void) {
  tt_dataset ds;
  tt_err err;
  warns w;
  FILE *f;
  int rc;
  TT_TEST_BEGIN("special_files_refused_at_once");
  if (mkfifo(tt_test_path("pipe"), 0644) != 0) {
    TT_SKIP("special_files_refused_at_once", "mkfifo failed");
    return;
  }
  tt_test_arm_alarm(20);
  write_idx(tt_test_path("f-img"), tt_test_path("f-lab"), 5, 4, 3, 5, 3);
  rc = tt_dataset_load_idx(tt_test_path("pipe"), tt_test_path("f-lab"), 1, 4, 3, &ds, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, tt_test_path("pipe")) && strstr(err.msg, "named pipe"), "idx images: %s",
           err.msg);
  rc = tt_dataset_load_idx(tt_test_path("f-img"), tt_test_path("pipe"), 1, 4, 3, &ds, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, tt_test_path("pipe")) && strstr(err.msg, "named pipe"), "idx labels: %s",
           err.msg);
  rc = tt_dataset_load_idx(tt_test_path("folder"), tt_test_path("f-lab"), 1, 4, 3, &ds, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, "a directory"), "idx directory: %s", err.msg);
  rc = tt_dataset_load_list(tt_test_path("pipe"), 3, 8, 8, &ds, &err, NULL, NULL);
  TT_CHECK(rc != 0 && strstr(err.msg, tt_test_path("pipe")) && strstr(err.msg, "named pipe"), "list file: %s",
           err.msg);
  /* entries of a list: each skipped with its own reason, the good one kept */
  mkdir(tt_test_path("adir"), 0755);
  if (symlink("no-such-target.png", tt_test_path("dangling.png")) != 0) TT_CHECK(0, "symlink failed");
  f = fopen(tt_test_path("special.list"), "w");
  fprintf(f, "pipe 0\nadir 1\nmissing.png 1\ndangling.png 2\nfolder/a_red/img0.png 0\n");
  fclose(f);
  memset(&w, 0, sizeof w);
  rc = tt_dataset_load_list(tt_test_path("special.list"), 3, 8, 8, &ds, &err, on_warn, &w);
  TT_CHECK(rc == 0 && ds.n == 1 && ds.skipped == 4 && w.n == 4, "list entries: rc %d n %d skipped %d: %s\n%s", rc,
           ds.n, ds.skipped, err.msg, w.all);
  TT_CHECK(strstr(w.all, "/pipe: skipped (a named pipe (FIFO), not an image file)") &&
               strstr(w.all, "/adir: skipped (a directory, not an image file)") &&
               strstr(w.all, "/missing.png: skipped (cannot open: No such file or directory)") &&
               strstr(w.all, "/dangling.png: skipped (dangling symbolic link to 'no-such-target.png')"),
           "list reasons:\n%s", w.all);
  if (rc == 0) tt_dataset_free(&ds);
  alarm(0);
  TT_TEST_END();
}

/* In a folder data set, what is not a regular file in a class folder is counted as skipped
 * and named with its reason; at the top, what is not a class folder is named and ignored. */
static void test_folder_special(void) {
  char root[1024], p[1024];
  tt_dataset ds;
  tt_err err;
  warns w;
  int rc;
  TT_TEST_BEGIN("folder_special_entries_named");
  tt_test_path_in(root, "special");
  mkdir(root, 0755);
  mkdir(tt_test_path("special/cls"), 0755);
  mkdir(tt_test_path("special/cls/nested"), 0755);
  snprintf(p, sizeof p, "%s/folder/a_red/img0.png", tt_test_dir());
  if (symlink(p, tt_test_path("special/cls/good.png")) != 0 ||
      symlink("gone.png", tt_test_path("special/cls/link.png")) != 0 ||
      symlink("gone", tt_test_path("special/cls2")) != 0 || mkfifo(tt_test_path("special/cls/pipe.png"), 0644) != 0 ||
      mkfifo(tt_test_path("special/toppipe"), 0644) != 0) {
    TT_SKIP("folder_special_entries_named", "symlink or mkfifo failed");
    return;
  }
  write_bytes(tt_test_path("special/readme.txt"), "classes are subfolders\n", 23);
  write_bytes(tt_test_path("special/cls/.hidden"), "x", 1);
  tt_test_arm_alarm(20);
  memset(&w, 0, sizeof w);
  rc = tt_dataset_load_folder(root, 3, 8, 8, &ds, &err, on_warn, &w);
  alarm(0);
  TT_CHECK(rc == 0 && ds.n == 1 && ds.skipped == 3 && ds.classes == 1 && w.n == 6,
           "rc %d n %d skipped %d classes %d warnings %d: %s\n%s", rc, ds.n, ds.skipped, ds.classes, w.n, err.msg,
           w.all);
  TT_CHECK(strstr(w.all, "/cls/link.png: skipped (dangling symbolic link to 'gone.png')") &&
               strstr(w.all, "/cls/nested: skipped (a directory, not an image file)") &&
               strstr(w.all, "/cls/pipe.png: skipped (a named pipe (FIFO), not an image file)") &&
               strstr(w.all, "/cls2: ignored (dangling symbolic link to 'gone'; not a class subfolder)") &&
               strstr(w.all, "/toppipe: ignored (a named pipe (FIFO), not an image file; not a class subfolder)") &&
               strstr(w.all, "/readme.txt: ignored (a regular file; not a class subfolder)") && !strstr(w.all, "hidden"),
           "warnings:\n%s", w.all);
  if (rc == 0) tt_dataset_free(&ds);
  TT_TEST_END();
}

/* ---- synthetic data and the loader ---- */

static void test_synthetic(void) {
  tt_data_cfg cfg;
  tt_dataset a, b;
  tt_err err;
  int rc1, rc2;
  TT_TEST_BEGIN("synthetic");
  memset(&cfg, 0, sizeof cfg);
  cfg.format = TT_DATA_SYNTHETIC;
  rc1 = tt_dataset_load(&cfg, 1, 3, 16, 16, &a, &err, NULL, NULL);
  rc2 = tt_dataset_load(&cfg, 1, 3, 16, 16, &b, &err, NULL, NULL);
  TT_CHECK(rc1 == 0 && rc2 == 0, "%s", err.msg);
  if (rc1 || rc2) return;
  TT_CHECK(a.n == 1024 && a.classes == 10 && memcmp(a.images, b.images, (size_t)a.n * 3 * 256) == 0 &&
               memcmp(a.labels, b.labels, sizeof(int32_t) * 1024) == 0,
           "not deterministic or wrong size (%d)", a.n);
  tt_dataset_free(&b);
  rc2 = tt_dataset_load(&cfg, 0, 3, 16, 16, &b, &err, NULL, NULL);
  TT_CHECK(rc2 == 0 && b.n == 256 && memcmp(a.images, b.images, 256) != 0, "test split");
  tt_dataset_free(&b);
  /* [data] synthetic_size: the training split's size (a benchmark's steps in one epoch); the
   * images are drawn in order, so the default set is its first 1024; the test split keeps 256 */
  cfg.synthetic_size = 1500;
  rc2 = tt_dataset_load(&cfg, 1, 3, 16, 16, &b, &err, NULL, NULL);
  TT_CHECK(rc2 == 0 && b.n == 1500 && !memcmp(a.images, b.images, (size_t)1024 * 3 * 256) &&
               !memcmp(a.labels, b.labels, sizeof(int32_t) * 1024),
           "synthetic_size = 1500: n %d, rc %d (%s)", b.n, rc2, rc2 ? err.msg : "");
  if (!rc2) tt_dataset_free(&b);
  rc2 = tt_dataset_load(&cfg, 0, 3, 16, 16, &b, &err, NULL, NULL);
  TT_CHECK(rc2 == 0 && b.n == 256, "synthetic_size changed the test split: n %d", b.n);
  if (!rc2) tt_dataset_free(&b);
  tt_dataset_free(&a);
  TT_TEST_END();
}

/* Every batch of one epoch, concatenated: images then labels then counts. */
typedef struct epoch_dump {
  uint8_t *img;
  int32_t *lab;
  int *cnt;
  int nb;
} epoch_dump;

static int run_epoch(const tt_dataset *ds, int batch, int shuffle, int pad, int flip, int threads, int epoch,
                     int start, epoch_dump *d) {
  tt_loader *l;
  tt_err err;
  const uint8_t *im;
  const int32_t *lb;
  int cnt, b = 0, rc;
  size_t per = (size_t)ds->c * ds->h * ds->w;
  double wait;
  if (tt_loader_create(&l, ds, batch, shuffle, pad, flip, 1234, threads, &err) != 0) {
    printf("# loader: %s\n", err.msg);
    return -1;
  }
  d->nb = tt_loader_batches(l);
  d->img = (uint8_t *)calloc((size_t)d->nb * batch, per);
  d->lab = (int32_t *)calloc((size_t)d->nb * batch, sizeof(int32_t));
  d->cnt = (int *)calloc((size_t)d->nb, sizeof(int));
  tt_loader_start_epoch(l, epoch, start);
  for (b = start; (rc = tt_loader_next(l, &im, &lb, &cnt, &wait)) == 0; b++) {
    memcpy(d->img + (size_t)b * batch * per, im, (size_t)cnt * per);
    memcpy(d->lab + (size_t)b * batch, lb, sizeof(int32_t) * (size_t)cnt);
    d->cnt[b] = cnt;
    tt_loader_release(l);
  }
  tt_loader_destroy(l);
  return rc == 1 && b == d->nb ? 0 : -1;
}

static void free_dump(epoch_dump *d) {
  free(d->img);
  free(d->lab);
  free(d->cnt);
}

/* Index of the dataset image equal to p, or -1. */
static int find_image(const tt_dataset *ds, const uint8_t *p) {
  size_t per = (size_t)ds->c * ds->h * ds->w;
  int i;
  for (i = 0; i < ds->n; i++)
    if (memcmp(ds->images + per * i, p, per) == 0) return i;
  return -1;
}

static void test_loader(void) {
  tt_dataset ds;
  tt_err err;
  epoch_dump a, b, c, e, plain, flip, crop;
  int i, j, seen_bad = 0, *seen;
  size_t per;
  TT_TEST_BEGIN("loader_determinism_and_order");
  if (tt_dataset_synthetic(203, 3, 8, 8, 10, 7, &ds, &err) != 0) {
    TT_CHECK(0, "%s", err.msg);
    return;
  }
  per = (size_t)3 * 8 * 8;
  TT_CHECK(run_epoch(&ds, 16, 1, 2, 1, 1, 3, 0, &a) == 0, "epoch with 1 thread");
  TT_CHECK(run_epoch(&ds, 16, 1, 2, 1, 3, 3, 0, &b) == 0, "epoch with 3 threads");
  TT_CHECK(a.nb == 12 && b.nb == 12, "train batches %d (want 203/16 = 12, last partial dropped)", a.nb);
  TT_CHECK(memcmp(a.img, b.img, (size_t)12 * 16 * per) == 0 && memcmp(a.lab, b.lab, sizeof(int32_t) * 192) == 0,
           "1 and 3 threads give different batches");
  /* resume at batch 5: the same bytes as batches 5.. of the full epoch */
  TT_CHECK(run_epoch(&ds, 16, 1, 2, 1, 2, 3, 5, &c) == 0, "resumed epoch");
  TT_CHECK(memcmp(a.img + (size_t)5 * 16 * per, c.img + (size_t)5 * 16 * per, (size_t)7 * 16 * per) == 0 &&
               memcmp(a.lab + 80, c.lab + 80, sizeof(int32_t) * 112) == 0,
           "start_batch 5 differs from skipping 5 batches");
  /* another epoch: another order */
  TT_CHECK(run_epoch(&ds, 16, 1, 2, 1, 2, 4, 0, &e) == 0, "epoch 4");
  TT_CHECK(memcmp(a.lab, e.lab, sizeof(int32_t) * 192) != 0, "epochs 3 and 4 have the same order");
  free_dump(&a);
  free_dump(&b);
  free_dump(&c);
  free_dump(&e);
  /* without augmentation every sample appears at most once (exactly once when not shuffled) */
  seen = (int *)calloc((size_t)ds.n, sizeof(int));
  TT_CHECK(run_epoch(&ds, 16, 1, 0, 0, 3, 3, 0, &plain) == 0, "plain epoch");
  for (i = 0; i < 192; i++) {
    int k = find_image(&ds, plain.img + per * i);
    if (k < 0 || seen[k] || ds.labels[k] != plain.lab[i]) seen_bad++;
    else seen[k] = 1;
  }
  TT_CHECK(seen_bad == 0, "%d samples repeated or not from the dataset in a shuffled epoch", seen_bad);
  free(seen);
  TT_CHECK(run_epoch(&ds, 16, 0, 0, 0, 2, 0, 0, &c) == 0, "eval epoch");
  TT_CHECK(c.nb == 13 && c.cnt[12] == 11 && memcmp(c.img, ds.images, (size_t)ds.n * per) == 0,
           "eval: %d batches, last %d, in dataset order", c.nb, c.nb ? c.cnt[c.nb - 1] : -1);
  free_dump(&c);
  TT_TEST_END();

  TT_TEST_BEGIN("loader_augmentation");
  {
    int flipped = 0, same = 0, other = 0, shifted = 0, unshifted = 0, badcrop = 0;
    /* same seed and epoch: same order, so position j holds the same sample in all three */
    TT_CHECK(run_epoch(&ds, 16, 1, 0, 1, 2, 3, 0, &flip) == 0, "flip epoch");
    TT_CHECK(run_epoch(&ds, 16, 1, 2, 0, 2, 3, 0, &crop) == 0, "crop epoch");
    for (i = 0; i < 192; i++) {
      const uint8_t *o = plain.img + per * i, *f = flip.img + per * i, *cr = crop.img + per * i;
      int mirror = 1, ch, y, x, dx, dy, found = 0;
      for (ch = 0; ch < 3; ch++)
        for (y = 0; y < 8; y++)
          for (x = 0; x < 8; x++)
            if (f[(ch * 8 + y) * 8 + x] != o[(ch * 8 + y) * 8 + 7 - x]) mirror = 0;
      if (memcmp(o, f, per) == 0) same++;
      else if (mirror) flipped++;
      else other++;
      for (dy = -2; dy <= 2 && !found; dy++)
        for (dx = -2; dx <= 2 && !found; dx++) {
          int ok = 1;
          for (ch = 0; ch < 3 && ok; ch++)
            for (y = 0; y < 8 && ok; y++)
              for (x = 0; x < 8 && ok; x++) {
                int sy = y + dy, sx = x + dx;
                int want = (sy < 0 || sy > 7 || sx < 0 || sx > 7) ? 0 : o[(ch * 8 + sy) * 8 + sx];
                if (cr[(ch * 8 + y) * 8 + x] != want) ok = 0;
              }
          if (ok) {
            found = 1;
            if (dx || dy) shifted++;
            else unshifted++;
          }
        }
      if (!found) badcrop++;
    }
    TT_CHECK(other == 0 && flipped > 60 && same > 60, "flip: %d flipped, %d unchanged, %d neither", flipped, same,
             other);
    TT_CHECK(badcrop == 0 && shifted > 120 && unshifted > 0, "crop: %d shifted, %d unshifted, %d not a crop", shifted,
             unshifted, badcrop);
    TT_CHECK(memcmp(plain.lab, flip.lab, sizeof(int32_t) * 192) == 0, "augmentation changed the order");
    free_dump(&flip);
    free_dump(&crop);
  }
  free_dump(&plain);
  TT_TEST_END();

  TT_TEST_BEGIN("loader_no_alloc_and_misuse");
  {
    tt_loader *l;
    const uint8_t *im;
    const int32_t *lb;
    int cnt, rc, nb = 0;
    uint64_t before, after;
    double wait, total_wait = 0;
    TT_CHECK(tt_loader_create(&l, &ds, 16, 1, 2, 1, 99, 3, &err) == 0, "%s", err.msg);
    TT_CHECK(tt_loader_next(l, &im, &lb, &cnt, &wait) == -1, "next before start_epoch must fail");
    before = tt_host_alloc_count();
    for (j = 0; j < 3; j++) {
      tt_loader_start_epoch(l, j, 0);
      while ((rc = tt_loader_next(l, &im, &lb, &cnt, &wait)) == 0) {
        total_wait += wait;
        nb++;
        tt_loader_release(l);
      }
      TT_CHECK(rc == 1, "epoch end rc %d", rc);
    }
    after = tt_host_alloc_count();
    TT_CHECK(after == before, "%llu allocations during 3 epochs", (unsigned long long)(after - before));
    TT_CHECK(nb == 36 && total_wait >= 0, "batches %d", nb);
    tt_loader_start_epoch(l, 5, 0);
    TT_CHECK(tt_loader_next(l, &im, &lb, &cnt, &wait) == 0, "next");
    TT_CHECK(tt_loader_next(l, &im, &lb, &cnt, &wait) == -1, "next without release must fail");
    TT_CHECK(tt_loader_start_epoch(l, 5, 13) == -1, "start_batch past the end must fail");
    tt_loader_destroy(l); /* mid-epoch, workers busy: must not hang */
    TT_CHECK(tt_loader_create(&l, &ds, 500, 1, 0, 0, 1, 1, &err) != 0 && strstr(err.msg, "203"),
             "batch larger than the dataset: %s", err.msg);
  }
  TT_TEST_END();
  tt_dataset_free(&ds);
}


/* ---- image formats (issue 21): PNM ours, PNG through libpng, BMP top-down, CMYK JPEG ---- */

static long max_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

/* Decodes path to 3 x h x w; 0 with the first pixel's colour in rgb, else -1 with reason. */
static int decode_rgb(const char *path, int h, int w, long long max_pixels, unsigned char *rgb, char *reason) {
  uint8_t *out = (uint8_t *)malloc((size_t)3 * h * w);
  int rc = tt_image_decode_file(path, 3, h, w, max_pixels, out, reason);
  if (rc == 0) rgb[0] = out[0], rgb[1] = out[(size_t)h * w], rgb[2] = out[(size_t)2 * h * w];
  free(out);
  return rc;
}

static int near_rgb(const unsigned char *a, int r, int g, int b) {
  return abs(a[0] - r) <= 3 && abs(a[1] - g) <= 3 && abs(a[2] - b) <= 3;
}

/* A valid grey PNG 1 pixel wide and 2^25 tall, and 2^25 x 1 (inside the default pixel limit): they
 * decode to 28 x 28 (issue 40: stb_image_resize asserted and aborted the process), fitted and
 * with a random crop. */
static void test_one_pixel_sides(void) {
  TT_TEST_BEGIN("image_one_pixel_wide_or_high");
  const int big = tt_test_sanitized() ? 1 << 21 : 1 << 25;
  unsigned char *px = (unsigned char *)malloc((size_t)big);
  uint8_t out[28 * 28];
  char reason[TT_DECODE_REASON_MAX];
  memset(px, 200, (size_t)big);
  for (int k = 0; k < 2; k++) {
    const char *path = tt_test_path(k ? "wide.png" : "tall.png");
    TT_CHECK(tt_write_png(path, k ? big : 1, k ? 1 : big, 1, 8, 0, px) == 0, "writing %s", path);
    int rc = tt_image_decode_file(path, 1, 28, 28, (long long)big, out, reason);
    TT_CHECK(rc == 0 && out[0] == 200 && out[28 * 28 - 1] == 200, "%s: rc %d (%s), pixels %d %d", path, rc, rc ? reason : "",
             out[0], out[28 * 28 - 1]);
    tt_crop crop;
    memset(&crop, 0, sizeof crop);
    crop.mode = TT_CROP_RANDOM_RESIZED, crop.key = 7, crop.scale[0] = 0.08f, crop.scale[1] = 1.0f;
    crop.ratio[0] = 0.75f, crop.ratio[1] = 4.0f / 3.0f;
    rc = tt_image_decode_file_crop(path, 1, 28, 28, (long long)big, &crop, out, reason);
    TT_CHECK(rc == 0 && out[0] == 200, "%s with a random crop: rc %d (%s)", path, rc, rc ? reason : "");
  }
  free(px);
  TT_TEST_END();
}

static void test_pnm(void) {
  char reason[TT_DECODE_REASON_MAX];
  unsigned char rgb[3];
  unsigned s16[4 * 3 * 3], s8[4 * 3];
  int i;
  TT_TEST_BEGIN("image_pnm_8_16_bit_and_bad_headers");
  for (i = 0; i < 12; i++) s16[3 * i] = 65535, s16[3 * i + 1] = 0, s16[3 * i + 2] = 32768; /* (255, 0, 128) */
  for (i = 0; i < 12; i++) s8[i] = 200;
  tt_write_pnm(tt_test_path("p6_16.ppm"), 6, 4, 3, 65535, s16);
  TT_CHECK(decode_rgb(tt_test_path("p6_16.ppm"), 3, 4, 0, rgb, reason) == 0 && near_rgb(rgb, 255, 0, 128),
           "16-bit P6: %s (%d %d %d)", reason, rgb[0], rgb[1], rgb[2]);
  tt_write_pnm(tt_test_path("p3_16.ppm"), 3, 4, 3, 65535, s16);
  TT_CHECK(decode_rgb(tt_test_path("p3_16.ppm"), 3, 4, 0, rgb, reason) == 0 && near_rgb(rgb, 255, 0, 128),
           "16-bit P3: %s", reason);
  tt_write_pnm(tt_test_path("p5.pgm"), 5, 4, 3, 255, s8);
  TT_CHECK(decode_rgb(tt_test_path("p5.pgm"), 3, 4, 0, rgb, reason) == 0 && near_rgb(rgb, 200, 200, 200),
           "8-bit P5: %s", reason);
  tt_write_pnm(tt_test_path("p2.pgm"), 2, 4, 3, 1000, s8); /* maxval 1000: 200 -> 51 */
  TT_CHECK(decode_rgb(tt_test_path("p2.pgm"), 3, 4, 0, rgb, reason) == 0 && near_rgb(rgb, 51, 51, 51),
           "P2 maxval 1000: %s (%d)", reason, rgb[0]);
  {
    static const struct { const char *text; const char *why; } bad[] = {
        {"P5\n4 3\n0\n", "maxval 0"},
        {"P5\n4 3\n70000\n", "maxval over 65535"},
        {"P5\n4 3\n4294967296\n", "maxval over 65535"},
        {"P6\n99999 99999\n255\n", "over the limit"},
        {"P5\n4 3\n255\n", "truncated PNM"},
        {"P5\n4 3\n255\nabc", "truncated PNM"},
        {"P5\n4 3", "truncated or malformed PNM header"},
        {"P6\n4 3\n65535\n\x01\x02", "truncated PNM"},
        {"P2\n2 1\n255\n7", "truncated PNM"},
        {"P2\n2 1\n255\n7 300\n", "over the header's maxval"},
    };
    for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
      write_bytes(tt_test_path("bad.pgm"), bad[i].text, strlen(bad[i].text));
      reason[0] = 0;
      TT_CHECK(decode_rgb(tt_test_path("bad.pgm"), 3, 4, 0, rgb, reason) != 0 && strstr(reason, bad[i].why),
               "bad PNM %d ('%s'): want '%s', got '%s'", i, bad[i].text, bad[i].why, reason);
    }
  }
  TT_TEST_END();
}

static void test_png_variants(void) {
  char reason[TT_DECODE_REASON_MAX];
  unsigned char rgb[3], px16[9 * 7 * 8], px8[9 * 7 * 4];
  int i;
  TT_TEST_BEGIN("image_png_16bit_interlaced_tall");
  for (i = 0; i < 9 * 7; i++) { /* RGBA 16: (0x2000, 0xFFFF, 0x8000, opaque) -> (32, 255, 128) */
    unsigned char *q = px16 + 8 * i;
    q[0] = 0x20, q[1] = 0, q[2] = 0xFF, q[3] = 0xFF, q[4] = 0x80, q[5] = 0, q[6] = 0xFF, q[7] = 0xFF;
    px8[4 * i] = 10, px8[4 * i + 1] = 20, px8[4 * i + 2] = 240, px8[4 * i + 3] = 255;
  }
  tt_write_png(tt_test_path("rgba16.png"), 9, 7, 4, 16, 0, px16);
  TT_CHECK(decode_rgb(tt_test_path("rgba16.png"), 7, 9, 0, rgb, reason) == 0 && near_rgb(rgb, 32, 255, 128),
           "16-bit RGBA: %s (%d %d %d)", reason, rgb[0], rgb[1], rgb[2]);
  tt_write_png(tt_test_path("rgba16i.png"), 9, 7, 4, 16, 1, px16);
  TT_CHECK(decode_rgb(tt_test_path("rgba16i.png"), 7, 9, 0, rgb, reason) == 0 && near_rgb(rgb, 32, 255, 128),
           "16-bit interlaced: %s", reason);
  tt_write_png(tt_test_path("rgba8i.png"), 9, 7, 4, 8, 1, px8);
  TT_CHECK(decode_rgb(tt_test_path("rgba8i.png"), 7, 9, 0, rgb, reason) == 0 && near_rgb(rgb, 10, 20, 240),
           "8-bit interlaced: %s", reason);
  {
    /* 1 x 17M pixels (stb_image refused over 2^24 rows as "unknown image type") */
    uint32_t hh = 17 * 1000 * 1000;
    size_t n = (size_t)hh * 2, i2;
    unsigned char *raw = (unsigned char *)malloc(n);
    uLongf zn = compressBound((uLong)n);
    unsigned char *z = (unsigned char *)malloc(zn);
    for (i2 = 0; i2 < n; i2 += 2) raw[i2] = 0, raw[i2 + 1] = 77;
    compress2(z, &zn, raw, (uLong)n, 1);
    tt_write_png_stream(tt_test_path("tall.png"), 1, hh, 8, 0, 0, z, zn);
    free(raw);
    free(z);
    reason[0] = 0;
    TT_CHECK(decode_rgb(tt_test_path("tall.png"), 4, 4, 0, rgb, reason) == 0 && near_rgb(rgb, 77, 77, 77),
             "1 x 17M PNG: %s", reason);
  }
  TT_TEST_END();
}

/* A 1x1 PNG whose IDAT inflates to 384 MiB: memory stays at the header's size. */
static void test_png_bomb(void) {
  char reason[TT_DECODE_REASON_MAX];
  unsigned char rgb[3], *zero = (unsigned char *)calloc(1, 1 << 20), *z;
  size_t cap = 2u << 20;
  z_stream zs;
  long before, after;
  int i;
  TT_TEST_BEGIN("image_png_bomb_bounded");
  memset(&zs, 0, sizeof zs);
  z = (unsigned char *)malloc(cap);
  deflateInit(&zs, 9);
  zs.next_out = z, zs.avail_out = (uInt)cap;
  for (i = 0; i < 384; i++) {
    zs.next_in = zero, zs.avail_in = 1 << 20;
    deflate(&zs, i == 383 ? Z_FINISH : Z_NO_FLUSH);
  }
  tt_write_png_stream(tt_test_path("bomb.png"), 1, 1, 8, 0, 0, z, zs.total_out);
  deflateEnd(&zs);
  free(z);
  free(zero);
  before = max_rss_kib();
  reason[0] = 0;
  i = decode_rgb(tt_test_path("bomb.png"), 2, 2, 0, rgb, reason);
  after = max_rss_kib();
  TT_CHECK(after - before < 64 * 1024, "decoding a 1x1 PNG bomb grew the peak memory by %ld MiB (rc %d: %s)",
           (after - before) / 1024, i, reason);
  TT_TEST_END();
}

static void test_bmp_jpeg_variants(void) {
  char reason[TT_DECODE_REASON_MAX];
  unsigned char rgb[3], px[2 * 2 * 3] = {250, 0, 0, 250, 0, 0, 0, 0, 250, 0, 0, 250};
  TT_TEST_BEGIN("image_bmp_top_down_cmyk_jpeg");
  tt_write_bmp(tt_test_path("topdown.bmp"), 2, 2, px, 1);
  reason[0] = 0;
  TT_CHECK(decode_rgb(tt_test_path("topdown.bmp"), 2, 2, 0, rgb, reason) == 0 && near_rgb(rgb, 250, 0, 0),
           "top-down BMP: %s (%d %d %d)", reason, rgb[0], rgb[1], rgb[2]);
#ifdef TT_HAVE_TURBOJPEG
  {
    unsigned char cmyk[16 * 16 * 4], *jpg = NULL;
    unsigned long jn = 0;
    tjhandle tj = tjInitCompress();
    int i;
    for (i = 0; i < 256; i++) cmyk[4 * i] = 255, cmyk[4 * i + 1] = 0, cmyk[4 * i + 2] = 0, cmyk[4 * i + 3] = 255;
    if (tj && tjCompress2(tj, cmyk, 16, 0, 16, TJPF_CMYK, &jpg, &jn, TJSAMP_444, 95, 0) == 0) {
      tt_crop crop;
      uint8_t out[3 * 8 * 8];
      write_bytes(tt_test_path("cmyk.jpg"), jpg, jn);
      reason[0] = 0;
      TT_CHECK(decode_rgb(tt_test_path("cmyk.jpg"), 8, 8, 0, rgb, reason) == 0 && abs(rgb[0] - 255) < 12 &&
                   rgb[1] < 12 && rgb[2] < 12,
               "CMYK JPEG: %s (%d %d %d)", reason, rgb[0], rgb[1], rgb[2]);
      memset(&crop, 0, sizeof crop);
      crop.mode = TT_CROP_RANDOM_RESIZED, crop.key = 7;
      TT_CHECK(tt_image_decode_file_crop(tt_test_path("cmyk.jpg"), 3, 8, 8, 0, &crop, out, reason) == 0,
               "CMYK JPEG, random crop: %s", reason);
    }
    tjFree(jpg);
    if (tj) tjDestroy(tj);
  }
#endif
  TT_TEST_END();
}

/* A file is refused from its size before it is read (two sparse 4 GiB files took 8.2 GB). */
static void test_image_file_bound(void) {
  char reason[TT_DECODE_REASON_MAX];
  unsigned char rgb[3];
  long before, after;
  int fd, rc1, rc2;
  static const unsigned char px[4] = {1, 2, 3, 4};
  TT_TEST_BEGIN("image_size_checked_before_reading");
  tt_write_png(tt_test_path("big.png"), 2, 2, 1, 8, 0, px);
  fd = open(tt_test_path("big.png"), O_WRONLY);
  rc1 = fd >= 0 ? ftruncate(fd, 1LL << 32) : -1; /* sparse: costs no disk */
  if (fd >= 0) close(fd);
  fd = open(tt_test_path("zeros.jpg"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  rc2 = fd >= 0 ? ftruncate(fd, 1LL << 32) : -1;
  if (fd >= 0) close(fd);
  if (rc1 != 0 || rc2 != 0) {
    TT_SKIP("image_size_checked_before_reading", "cannot make a sparse file here");
    return;
  }
  before = max_rss_kib();
  reason[0] = 0;
  rc1 = decode_rgb(tt_test_path("big.png"), 2, 2, 0, rgb, reason);
  TT_CHECK(rc1 != 0 && strstr(reason, "file of 4294967296 bytes, over the"), "4 GiB PNG of 2x2: %s", reason);
  reason[0] = 0;
  rc2 = decode_rgb(tt_test_path("zeros.jpg"), 2, 2, 0, rgb, reason);
  TT_CHECK(rc2 != 0 && strstr(reason, "not a PNG, JPEG, BMP or PGM/PPM"), "4 GiB of zeros: %s", reason);
  after = max_rss_kib();
  TT_CHECK(after - before < 64 * 1024, "refusing the big files grew the peak memory by %ld MiB", (after - before) / 1024);
  unlink(tt_test_path("big.png"));
  unlink(tt_test_path("zeros.jpg"));
  TT_TEST_END();
}

/* A symbolic link planted at the temporary name must not make a write overwrite its target. */
static void test_atomic_symlink(void) {
  tt_err err;
  char tmp[1200], victim[1100], out[1100];
  void *p = NULL;
  size_t n = 0;
  const void *chunks[1] = {"new\n"};
  size_t sizes[1] = {4};
  TT_TEST_BEGIN("atomic_write_ignores_planted_symlink");
  snprintf(victim, sizeof victim, "%s", tt_test_path("victim"));
  snprintf(out, sizeof out, "%s", tt_test_path("set-images.npy"));
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  write_bytes(victim, "precious\n", 9);
  unlink(tmp);
  TT_CHECK(symlink(victim, tmp) == 0, "cannot plant the link");
  TT_CHECK(tt_write_file_atomic(out, chunks, sizes, 1, &err) == 0, "write: %s", err.msg);
  TT_CHECK(tt_read_file(victim, &p, &n, &err) == 0 && n == 9 && !memcmp(p, "precious\n", 9),
           "the link's target was overwritten (%zu bytes)", n);
  free(p);
  p = NULL;
  TT_CHECK(tt_read_file(out, &p, &n, &err) == 0 && n == 4 && !memcmp(p, "new\n", 4), "the output: %zu bytes", n);
  free(p);
  TT_CHECK(access(tmp, F_OK) != 0, "the temporary name is still there");
  TT_TEST_END();
}

/* A .npy file of version 1.0 (header padded to 64 bytes) with raw data. */
static void write_npy(const char *path, const char *descr, const char *shape, const void *data, size_t n) {
  char head[128];
  int k = snprintf(head + 10, sizeof head - 10, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
  FILE *f = fopen(path, "wb");
  memcpy(head, "\x93NUMPY\x01\x00", 8);
  memset(head + 10 + k, ' ', sizeof head - 10 - (size_t)k);
  head[127] = '\n';
  head[8] = 118, head[9] = 0;
  fwrite(head, 1, 128, f);
  fwrite(data, 1, n, f);
  fclose(f);
}

/* format = npy, an images file truncated under a running job: the loader's check before each
 * batch ends it with an error naming the file, and a fault while reading the mapping (the file
 * shrank after the check) jumps back to the reader instead of killing the process with SIGBUS;
 * a fault outside a guarded read, or a SIGBUS sent by kill, still ends the process. */
static void test_npy_shrinks(void) {
  enum { N = 8, PER = 4 * 4 * 3 };
  static unsigned char px[N * PER];
  static const int32_t lab[N] = {0, 1, 0, 1, 0, 1, 0, 1};
  char img[1100];
  tt_dataset ds;
  tt_loader *l = NULL;
  tt_err err;
  const uint8_t *bi;
  const int32_t *bl;
  int i, cnt, rc;
  TT_TEST_BEGIN("npy_file_shrinks_under_the_loader");
  for (i = 0; i < N * PER; i++) px[i] = (unsigned char)(i * 7);
  snprintf(img, sizeof img, "%s", tt_test_path("shrink-images.npy"));
  write_npy(img, "|u1", "(8, 4, 4, 3)", px, sizeof px);
  write_npy(tt_test_path("shrink-labels.npy"), "<i4", "(8,)", lab, sizeof lab);
  rc = tt_dataset_load_npy(img, tt_test_path("shrink-labels.npy"), 3, 4, 4, 2, &ds, &err);
  TT_CHECK(rc == 0, "load: %s", err.msg);
  if (rc) return;
  TT_CHECK(tt_loader_create(&l, &ds, 2, 1, 0, 0, 1, 2, &err) == 0, "loader: %s", err.msg);
  if (!l) return;
  tt_loader_start_epoch(l, 0, 0);
  for (i = 0; (rc = tt_loader_next(l, &bi, &bl, &cnt, NULL)) == 0; i++) tt_loader_release(l);
  TT_CHECK(rc == 1 && i == 4 && !tt_loader_error(l)[0], "epoch 0: rc %d after %d batches", rc, i);
  TT_CHECK(truncate(img, 0) == 0, "truncate");
  tt_loader_start_epoch(l, 1, 0);
  rc = tt_loader_next(l, &bi, &bl, &cnt, NULL);
  TT_CHECK(rc == -1 && strstr(tt_loader_error(l), "shrink-images.npy: the file shrank to 0 bytes while this run read it"),
           "epoch 1: rc %d, '%s'", rc, tt_loader_error(l));
  tt_loader_destroy(l);
  /* the guard itself: a read of the truncated mapping returns to its sigsetjmp */
  {
    sigjmp_buf jump;
    volatile int faulted = 0;
    volatile unsigned char v = 0;
    if (sigsetjmp(jump, 1) == 0) {
      tt_map_guard_enter(&ds, &jump);
      v = ds.images[PER * 5];
      tt_map_guard_leave();
    } else {
      faulted = 1;
    }
    (void)v;
    TT_CHECK(faulted, "a read past the new end did not fault into the guard");
  }
  {
    int kind;
    for (kind = 0; kind < 2; kind++) { /* unguarded fault; a kill -BUS during a guarded read */
      pid_t pid = fork();
      int st = 0;
      if (pid == 0) {
        sigjmp_buf jump;
        volatile unsigned char v;
        alarm(10);
        if (kind == 0) {
          v = ds.images[PER * 5];
        } else if (sigsetjmp(jump, 1) == 0) {
          tt_map_guard_enter(&ds, &jump);
          kill(getpid(), SIGBUS);
          tt_map_guard_leave();
        }
        (void)v;
        _exit(0);
      }
      waitpid(pid, &st, 0);
      /* the fault goes to the handler that was there before the guard's: by default the process
       * dies of SIGBUS; under AddressSanitizer that handler is ASan's, which reports the fault and
       * exits non-zero */
      TT_CHECK((WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) || (TT_TEST_UNDER_ASAN && WIFEXITED(st) && WEXITSTATUS(st) != 0),
               "%s: the child was not ended by SIGBUS (status 0x%x)",
               kind ? "kill -BUS" : "unguarded fault", st);
    }
  }
  tt_dataset_free(&ds);
  TT_TEST_END();
}

/* PREFIX-classes.json is checked against [net] classes and every label; duplicates refused. */
static void test_npy_classes(void) {
  static const unsigned char px[2 * 2 * 2] = {0};
  static const int32_t lab[2] = {0, 2};
  static const struct { const char *json; int classes; const char *why; } cases[] = {
      {"[\"a\", \"b\"]", 0, "names 2 classes but label 2"},
      {"[\"a\", \"b\"]", 3, "names 2 classes but [net] classes = 3"},
      {"[\"a\", \"b\", \"a\"]", 3, "'a' appears twice"},
      {"[\"a\", \"b\", \"c\"]", 3, NULL},
  };
  tt_dataset ds;
  tt_err err;
  int i, rc;
  TT_TEST_BEGIN("npy_classes_json_checked");
  write_npy(tt_test_path("s-images.npy"), "|u1", "(2, 2, 2)", px, sizeof px);
  write_npy(tt_test_path("s-labels.npy"), "<i4", "(2,)", lab, sizeof lab);
  for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    write_bytes(tt_test_path("s-classes.json"), cases[i].json, strlen(cases[i].json));
    err.msg[0] = 0;
    rc = tt_dataset_load_npy(tt_test_path("s-images.npy"), tt_test_path("s-labels.npy"), 1, 2, 2, cases[i].classes, &ds,
                             &err);
    if (cases[i].why)
      TT_CHECK(rc != 0 && strstr(err.msg, "s-classes.json") && strstr(err.msg, cases[i].why), "%s: %s", cases[i].json,
               err.msg);
    else
      TT_CHECK(rc == 0 && ds.classes == 3, "%s: %s", cases[i].json, err.msg);
    if (rc == 0) tt_dataset_free(&ds);
  }
  /* the images file must be a regular file of the size its header says */
  write_npy(tt_test_path("s-images.npy"), "|u1", "(3, 2, 2)", px, sizeof px);
  rc = tt_dataset_load_npy(tt_test_path("s-images.npy"), tt_test_path("s-labels.npy"), 1, 2, 2, 3, &ds, &err);
  TT_CHECK(rc != 0 && strstr(err.msg, "truncated"), "short images file: %s", err.msg);
  TT_TEST_END();
}

/* The registry (tests/tt_test.h): --list prints it, --only NAME|TAG runs part of it. */
static const tt_test_case tests[] = {
  TT_TEST("png_bomb", "data", test_png_bomb), /* first: it measures the peak memory */
  TT_TEST("image_file_bound", "data", test_image_file_bound),
  TT_TEST("pnm", "data", test_pnm),
  TT_TEST("png_variants", "data", test_png_variants),
  TT_TEST("bmp_jpeg_variants", "data", test_bmp_jpeg_variants),
  TT_TEST("atomic_symlink", "data", test_atomic_symlink),
  TT_TEST("npy_classes", "data", test_npy_classes),
  TT_TEST("npy_shrinks", "data", test_npy_shrinks),
  TT_TEST("idx_small", "data", test_idx_small),
  TT_TEST("idx_fashion", "data", test_idx_fashion),
  TT_TEST("folder", "data", test_folder),
  TT_TEST("truncation_claims", "data", test_truncation_claims),
  TT_TEST("folder_errors", "data", test_folder_errors),
  TT_TEST("resize_crop", "data", test_resize_crop),
  TT_TEST("list", "data", test_list),
  TT_TEST("fifo_inputs", "data", test_fifo_inputs),
  TT_TEST("folder_special", "data", test_folder_special),
  TT_TEST("synthetic", "data", test_synthetic),
  TT_TEST("loader", "data", test_loader),
  TT_TEST("one_pixel_sides", "data decode", test_one_pixel_sides),
};

int main(int argc, char **argv) { return tt_test_main(argc, argv, tests, TT_TEST_COUNT(tests), NULL, NULL); }
