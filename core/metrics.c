/* core/metrics.c — see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chart.h"
#include "model.h"

#define METRICS_HIST_MAX 4096 /* epochs a chart holds; later ones are written to metrics.jsonl only */

typedef struct metrics_hist {
  double epoch[METRICS_HIST_MAX], train_loss[METRICS_HIST_MAX], test_loss[METRICS_HIST_MAX], test_acc[METRICS_HIST_MAX];
  int n;
} metrics_hist;

/* Rebuilds the chart history from the eval lines (epoch lines without a test split) of an
 * existing metrics.jsonl (resume). */
static void metrics_hist_read(metrics_hist *h, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[1024];
  while (fgets(line, sizeof line, f) && h->n < METRICS_HIST_MAX) {
    int eval = strstr(line, "\"event\": \"eval\"") != NULL;
    if (!eval && !strstr(line, "\"event\": \"epoch\"")) continue;
    const char *e = strstr(line, "\"epoch\": "), *l = strstr(line, "\"loss\": "), *a = strstr(line, "\"accuracy\": ");
    const char *tl = strstr(line, "\"train_loss\": ");
    if (!e || (eval && (!l || !a))) continue;
    h->epoch[h->n] = atof(e + 9);
    h->test_loss[h->n] = eval ? atof(l + 8) : NAN;
    h->test_acc[h->n] = eval ? atof(a + 12) : NAN;
    h->train_loss[h->n] = tl ? atof(tl + 14) : NAN;
    h->n++;
  }
  fclose(f);
}

void tt_metrics_init(tt_metrics *m, FILE *out, int quiet, int progress) {
  memset(m, 0, sizeof *m);
  m->out = out;
  m->quiet = quiet;
  m->in_place = progress == 1 || (progress < 0 && isatty(fileno(out)));
}

void tt_metrics_say(const tt_metrics *m, const char *fmt, ...) {
  if (m->quiet) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(m->out, fmt, ap);
  va_end(ap);
  fflush(m->out);
}

int tt_metrics_open(tt_metrics *m, const char *dir, int resume, tt_err *err) {
  char path[TT_PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  m->hist = (metrics_hist *)tt_calloc(1, sizeof(metrics_hist), "metrics history", err);
  if (!m->hist) return -1;
  if (resume) metrics_hist_read(m->hist, path);
  m->jsonl = fopen(path, resume ? "a" : "w");
  if (!m->jsonl) return tt_fail(err, "%s: cannot write metrics: %s", path, strerror(errno));
  return 0;
}

void tt_metrics_close(tt_metrics *m) {
  if (m->jsonl) fclose(m->jsonl);
  free(m->hist);
  m->jsonl = NULL;
  m->hist = NULL;
}

void tt_metrics_epoch_begin(tt_epoch_meter *e, int epoch, long long skipped_before) {
  memset(e, 0, sizeof *e);
  e->epoch = epoch;
  e->t0 = e->log_t0 = tt_now();
  e->skipped_before = (int)skipped_before;
}

void tt_metrics_train(tt_metrics *m, tt_epoch_meter *e, int step_in_epoch, long long step, double loss, double accuracy,
                      double lr, const tt_loss_scale *ls) {
  double now = tt_now();
  fprintf(m->jsonl,
          "{\"event\": \"train\", \"epoch\": %d, \"step\": %lld, \"loss\": %.6g, \"accuracy\": %.6g, \"lr\": %.6g, "
          "\"images_per_s\": %.1f, \"data_wait\": %.4f, \"loss_scale\": %.9g, \"skipped\": %lld}\n",
          e->epoch + 1, step, loss, accuracy, lr, e->log_images / (now - e->log_t0 + 1e-9), e->wait / (now - e->t0 + 1e-9),
          (double)ls->scale, ls->skipped);
  fflush(m->jsonl);
  e->log_images = 0;
  e->log_t0 = now;
  if (m->quiet) return;
  double el = now - e->t0;
  char line[256];
  snprintf(line, sizeof line, "epoch %d/%d  step %d/%d  loss %.4f  %.0f img/s  data wait %.0f%%  arena %.1f MiB%s",
           e->epoch + 1, m->epochs, step_in_epoch + 1, m->steps_per_epoch, loss, e->images / (el + 1e-9),
           100.0 * e->wait / (el + 1e-9), m->arena_bytes / 1048576.0,
           ls->skipped > e->skipped_before ? "  (fp16 overflow: steps skipped)" : "");
  if (m->in_place) fprintf(m->out, "\r\033[K%s", line);
  else fprintf(m->out, "%s\n", line);
  fflush(m->out);
}

void tt_metrics_eval(tt_metrics *m, const tt_epoch_meter *e, long long step, double test_loss, double test_acc) {
  double train_loss = e->images ? e->loss_sum / (double)e->images : 0.0;
  fprintf(m->jsonl, "{\"event\": \"eval\", \"epoch\": %d, \"step\": %lld, \"loss\": %.6g, \"accuracy\": %.6g, "
                    "\"train_loss\": %.6g, \"seconds\": %.2f}\n",
          e->epoch + 1, step, test_loss, test_acc, train_loss, tt_now() - e->t0);
  fflush(m->jsonl);
  if (m->in_place && !m->quiet) fprintf(m->out, "\n");
  tt_metrics_say(m, "epoch %d/%d  test accuracy %.2f%%  test loss %.4f  (%.1f s)\n", e->epoch + 1, m->epochs,
                 100.0 * test_acc, test_loss, tt_now() - e->t0);
  metrics_hist *h = m->hist;
  if (h->n < METRICS_HIST_MAX) {
    h->epoch[h->n] = e->epoch + 1;
    h->train_loss[h->n] = train_loss;
    h->test_loss[h->n] = test_loss;
    h->test_acc[h->n] = test_acc;
    h->n++;
  }
}

void tt_metrics_epoch(tt_metrics *m, const tt_epoch_meter *e, long long step) {
  double train_loss = e->images ? e->loss_sum / (double)e->images : 0.0;
  fprintf(m->jsonl, "{\"event\": \"epoch\", \"epoch\": %d, \"step\": %lld, \"train_loss\": %.6g, \"seconds\": %.2f}\n",
          e->epoch + 1, step, train_loss, tt_now() - e->t0);
  fflush(m->jsonl);
  if (m->in_place && !m->quiet) fprintf(m->out, "\n");
  tt_metrics_say(m, "epoch %d/%d  train loss %.4f  (%.1f s)\n", e->epoch + 1, m->epochs, train_loss, tt_now() - e->t0);
  metrics_hist *h = m->hist;
  if (h->n < METRICS_HIST_MAX) {
    h->epoch[h->n] = e->epoch + 1;
    h->train_loss[h->n] = train_loss;
    h->test_loss[h->n] = NAN;
    h->test_acc[h->n] = NAN;
    h->n++;
  }
}

int tt_metrics_chart(const tt_metrics *m, const char *dir, const char *title, tt_err *err) {
  char path[TT_PATH_MAX + 64];
  const metrics_hist *h = m->hist;
  snprintf(path, sizeof path, "%s/chart.svg", dir);
  return tt_chart_svg(path, h->epoch, h->train_loss, h->test_loss, h->test_acc, h->n, title, err);
}

void tt_metrics_summary(const tt_metrics *m, const char *dir, const tt_loss_scale *ls) {
  if (ls->skipped)
    tt_metrics_say(m, "fp16: %lld optimizer steps skipped on overflow; final loss scale %g\n", ls->skipped,
                   (double)ls->scale);
  tt_metrics_say(m, "run directory: %s (weights.safetensors, state.safetensors, metrics.jsonl, chart.svg)\n", dir);
}
