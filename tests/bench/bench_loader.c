/* tests/bench/bench_loader.c — the data loader alone: images per second (and per loader thread)
 * to decode (or read from a packed .npy set), random-resized-crop, flip and normalise batches.
 * Prints one JSON line; never passes or fails. tests/bench/loader_vs_torch.py runs it.
 *
 *   build/bench/bench_loader SOURCE [SIZE] [BATCH] [THREADS] [BATCHES] [CROP]
 *
 * SOURCE: an image folder (one subfolder per class), or PREFIX-images.npy (labels from
 * PREFIX-labels.npy). SIZE: the square input (224). BATCH (64), THREADS (2), BATCHES timed after
 * one warm-up batch (20; fewer if an epoch is shorter). CROP: rrc (RandomResizedCrop, the
 * default), fit (the shorter side fits, centre crop: no random crop). The flip is on; the
 * consumer normalises each batch to float (mean/std, as the CPU backend does after its upload),
 * which is counted in the time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data/data.h"

/* VmHWM of /proc/self/status (KiB): unlike getrusage's ru_maxrss it starts afresh at exec, so
 * a parent's size (Python with PyTorch loaded) does not show. -1 where there is none. */
static long bench_hwm_kib(void) {
  char line[256];
  long v = -1;
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "VmHWM:", 6)) v = atol(line + 6);
  fclose(f);
  return v;
}

static int bench_load(const char *src, int size, tt_dataset *ds, tt_err *err) {
  size_t n = strlen(src);
  if (n > 11 && !strcmp(src + n - 11, "-images.npy")) {
    char lab[TT_PATH_MAX + 16];
    snprintf(lab, sizeof lab, "%.*s-labels.npy", (int)(n - 11), src);
    return tt_dataset_load_npy(src, lab, 3, size, size, 0, ds, err);
  }
  return tt_dataset_scan_folder(src, 3, size, size, ds, err, tt_warn_stderr, NULL);
}

int main(int argc, char **argv) {
  const char *src = argc > 1 ? argv[1] : NULL;
  int size = argc > 2 ? atoi(argv[2]) : 224, batch = argc > 3 ? atoi(argv[3]) : 64;
  int threads = argc > 4 ? atoi(argv[4]) : 2, nb = argc > 5 ? atoi(argv[5]) : 20;
  const char *mode = argc > 6 ? argv[6] : "rrc";
  static const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  tt_dataset ds;
  tt_loader *l = NULL;
  tt_crop crop;
  tt_err err;
  float *x;
  double t0 = 0, wait = 0, sum = 0;
  int b, images = 0;
  if (!src || size < 1 || batch < 1 || threads < 1 || nb < 1) {
    fprintf(stderr, "usage: bench_loader SOURCE [SIZE] [BATCH] [THREADS] [BATCHES] [rrc|fit]\n");
    return 2;
  }
  if (bench_load(src, size, &ds, &err) || tt_loader_create(&l, &ds, batch, 1, 0, 1, 1, threads, &err)) {
    fprintf(stderr, "bench_loader: %s\n", err.msg);
    return 1;
  }
  memset(&crop, 0, sizeof crop);
  if (!strcmp(mode, "rrc")) crop.mode = TT_CROP_RANDOM_RESIZED;
  tt_loader_set_crop(l, &crop);
  tt_loader_set_warn(l, tt_warn_stderr, NULL);
  if (nb > tt_loader_batches(l) - 1) nb = tt_loader_batches(l) - 1;
  x = (float *)malloc(sizeof(float) * (size_t)batch * 3 * size * size);
  tt_loader_start_epoch(l, 0, 0);
  for (b = 0; b <= nb; b++) {
    const uint8_t *img;
    const int32_t *lab;
    int cnt, ch;
    double w;
    size_t hw = (size_t)size * size, i, k;
    if (b == 1) t0 = tt_now(); /* after one warm-up batch: the threads are running */
    if (tt_loader_next(l, &img, &lab, &cnt, &w) != 0) break;
    for (k = 0; k < (size_t)cnt; k++)
      for (ch = 0; ch < 3; ch++) {
        const uint8_t *p = img + (k * 3 + ch) * hw;
        float *q = x + (k * 3 + ch) * hw, s = 1.0f / (255.0f * stdv[ch]), o = mean[ch] / stdv[ch];
        for (i = 0; i < hw; i++) q[i] = p[i] * s - o;
      }
    sum += x[0];
    tt_loader_release(l);
    if (b >= 1) images += cnt, wait += w;
  }
  {
    double dt = tt_now() - t0;
    printf("{\"source\": \"%s\", \"images\": %d, \"seconds\": %.4f, \"images_per_s\": %.1f, \"threads\": %d, "
           "\"images_per_s_per_thread\": %.1f, \"consumer_wait_share\": %.3f, \"skipped\": %d, \"peak_rss_kib\": %ld, "
           "\"check\": %.3f}\n",
           src, images, dt, images / (dt + 1e-12), threads, images / (dt + 1e-12) / threads, wait / (dt + 1e-12),
           tt_loader_skipped(l), bench_hwm_kib(), sum);
  }
  free(x);
  tt_loader_destroy(l);
  tt_dataset_free(&ds);
  return 0;
}
