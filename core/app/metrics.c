/* core/app/metrics.c — see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chart.h"
#include "../base/fileio.h"
#include "../compile/model.h"

#define METRICS_HIST_MAX 4096 /* epochs a chart holds; later ones are written to metrics.jsonl only */

typedef struct metrics_hist {
  double epoch[METRICS_HIST_MAX], train_loss[METRICS_HIST_MAX], test_loss[METRICS_HIST_MAX], test_acc[METRICS_HIST_MAX];
  int n;
} metrics_hist;

static void metrics_hist_add(metrics_hist *h, double epoch, double train_loss, double test_loss, double test_acc) {
  if (h->n >= METRICS_HIST_MAX) return;
  h->epoch[h->n] = epoch;
  h->train_loss[h->n] = train_loss;
  h->test_loss[h->n] = test_loss;
  h->test_acc[h->n] = test_acc;
  h->n++;
}

/* The number after "key": in a line, or NaN where the key is absent or its value is null. */
static double metrics_field(const char *line, const char *key) {
  char pat[48];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = strstr(line, pat);
  if (!p || !strncmp(p + strlen(pat), "null", 4)) return NAN;
  return atof(p + strlen(pat));
}

/* A chart point from an eval line (or an epoch line of a run without a test split). */
static void metrics_hist_line(metrics_hist *h, const char *line) {
  int eval = strstr(line, "\"event\": \"eval\"") != NULL, epoch = strstr(line, "\"event\": \"epoch\"") != NULL;
  if (!eval && !epoch) return;
  metrics_hist_add(h, metrics_field(line, "epoch"), metrics_field(line, "train_loss"),
                   eval ? metrics_field(line, "loss") : NAN, eval ? metrics_field(line, "accuracy") : NAN);
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

/* The lines of src (a resumed run's metrics.jsonl) up to the checkpoint's step, then a resume
 * line: a line with a later step was written after the checkpoint and is about to be written
 * again; a line without its newline was cut by a kill. Written atomically over m->path. */
static int metrics_carry(tt_metrics *m, const char *src, long long step, int epoch, tt_err *err) {
  void *text = NULL;
  size_t len = 0;
  tt_strbuf b;
  memset(&b, 0, sizeof b);
  if (access(src, F_OK) == 0 && tt_read_file(src, &text, &len, err)) return -1;
  for (char *line = (char *)text, *end = (char *)text + len; line && line < end;) {
    char *nl = (char *)memchr(line, '\n', (size_t)(end - line));
    if (!nl) break;
    *nl = 0;
    double s = metrics_field(line, "step");
    if (!(s > (double)step)) {
      tt_strbuf_printf(&b, "%s\n", line);
      metrics_hist_line(m->hist, line);
    }
    line = nl + 1;
  }
  free(text);
  tt_strbuf_printf(&b, "{\"event\": \"resume\", \"epoch\": %d, \"step\": %lld}\n", epoch + 1, step);
  if (b.oom) {
    free(b.p);
    return tt_fail(err, "%s: out of host memory carrying the metrics over", src);
  }
  const void *chunk = b.p;
  size_t size = b.n;
  int rc = tt_write_file_atomic(m->path, &chunk, &size, 1, err);
  free(b.p);
  return rc;
}

int tt_metrics_open(tt_metrics *m, const char *dir, const char *resume_dir, long long step, int epoch, tt_err *err) {
  snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", dir);
  m->hist = (metrics_hist *)tt_calloc(1, sizeof(metrics_hist), "metrics history", err);
  if (!m->hist) return -1;
  if (resume_dir) {
    char src[sizeof m->path];
    snprintf(src, sizeof src, "%s/metrics.jsonl", resume_dir);
    if (metrics_carry(m, src, step, epoch, err)) return -1;
  }
  m->jsonl = fopen(m->path, resume_dir ? "a" : "w");
  if (!m->jsonl) return tt_fail(err, "%s: cannot write metrics: %s", m->path, strerror(errno));
  return 0;
}

void tt_metrics_close(tt_metrics *m) {
  if (m->jsonl) fclose(m->jsonl);
  free(m->hist);
  m->jsonl = NULL;
  m->hist = NULL;
}

/* A line that did not reach the file is an error: metrics.jsonl must not have silent gaps. */
static int metrics_flushed(tt_metrics *m, int printed, tt_err *err) {
  if (printed >= 0 && fflush(m->jsonl) == 0 && !ferror(m->jsonl)) return 0;
  return tt_fail(err, "%s: cannot write a metrics line (%s); free disk space, then continue with --resume (the last "
                 "checkpoint is intact)", m->path, strerror(errno ? errno : EIO));
}

void tt_metrics_epoch_begin(tt_epoch_meter *e, int epoch, long long skipped_before) {
  memset(e, 0, sizeof *e);
  e->epoch = epoch;
  e->t0 = e->log_t0 = tt_now();
  e->skipped_before = (int)skipped_before;
}

int tt_metrics_train(tt_metrics *m, tt_epoch_meter *e, int step_in_epoch, long long step, double loss, double accuracy,
                     double lr, const tt_loss_scale *ls, tt_err *err) {
  double now = tt_now();
  errno = 0;
  int printed =
      fprintf(m->jsonl,
              "{\"event\": \"train\", \"epoch\": %d, \"step\": %lld, \"loss\": %.6g, \"accuracy\": %.6g, \"lr\": %.6g, "
              "\"images_per_s\": %.1f, \"data_wait\": %.4f, \"loss_scale\": %.9g, \"skipped\": %lld}\n",
              e->epoch + 1, step, loss, accuracy, lr, e->log_images / (now - e->log_t0 + 1e-9),
              e->wait / (now - e->t0 + 1e-9), (double)ls->scale, ls->skipped);
  if (metrics_flushed(m, printed, err)) return -1;
  e->log_images = 0;
  e->log_t0 = now;
  if (m->quiet) return 0;
  double el = now - e->t0;
  char line[256];
  snprintf(line, sizeof line, "epoch %d/%d  step %d/%d  loss %.4f  %.0f img/s  data wait %.0f%%  arena %.1f MiB%s",
           e->epoch + 1, m->epochs, step_in_epoch + 1, m->steps_per_epoch, loss, e->images / (el + 1e-9),
           100.0 * e->wait / (el + 1e-9), m->arena_bytes / 1048576.0,
           ls->skipped > e->skipped_before ? "  (fp16 overflow: steps skipped)" : "");
  if (m->in_place) fprintf(m->out, "\r\033[K%s", line);
  else fprintf(m->out, "%s\n", line);
  fflush(m->out);
  return 0;
}

/* "null" when this process trained no image of the epoch (resumed with only its evaluation left). */
static void metrics_train_loss(const tt_epoch_meter *e, char *buf, size_t size) {
  if (e->images) snprintf(buf, size, "%.6g", e->loss_sum / (double)e->images);
  else snprintf(buf, size, "null");
}

int tt_metrics_eval(tt_metrics *m, const tt_epoch_meter *e, long long step, double test_loss, double test_acc,
                    tt_err *err) {
  char tl[32];
  metrics_train_loss(e, tl, sizeof tl);
  errno = 0;
  int printed = fprintf(m->jsonl, "{\"event\": \"eval\", \"epoch\": %d, \"step\": %lld, \"loss\": %.6g, \"accuracy\": %.6g, "
                                  "\"train_loss\": %s, \"seconds\": %.2f}\n",
                        e->epoch + 1, step, test_loss, test_acc, tl, tt_now() - e->t0);
  if (metrics_flushed(m, printed, err)) return -1;
  if (m->in_place && !m->quiet) fprintf(m->out, "\n");
  tt_metrics_say(m, "epoch %d/%d  test accuracy %.2f%%  test loss %.4f  (%.1f s)\n", e->epoch + 1, m->epochs,
                 100.0 * test_acc, test_loss, tt_now() - e->t0);
  metrics_hist_add(m->hist, e->epoch + 1, e->images ? e->loss_sum / (double)e->images : NAN, test_loss, test_acc);
  return 0;
}

int tt_metrics_epoch(tt_metrics *m, const tt_epoch_meter *e, long long step, tt_err *err) {
  char tl[32];
  metrics_train_loss(e, tl, sizeof tl);
  errno = 0;
  int printed = fprintf(m->jsonl, "{\"event\": \"epoch\", \"epoch\": %d, \"step\": %lld, \"train_loss\": %s, \"seconds\": %.2f}\n",
                        e->epoch + 1, step, tl, tt_now() - e->t0);
  if (metrics_flushed(m, printed, err)) return -1;
  if (m->in_place && !m->quiet) fprintf(m->out, "\n");
  tt_metrics_say(m, "epoch %d/%d  train loss %s  (%.1f s)\n", e->epoch + 1, m->epochs, tl, tt_now() - e->t0);
  metrics_hist_add(m->hist, e->epoch + 1, e->images ? e->loss_sum / (double)e->images : NAN, NAN, NAN);
  return 0;
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
