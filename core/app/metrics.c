/* core/app/metrics.c — see metrics.h. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* struct winsize, TIOCGWINSZ */
#endif
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "chart.h"
#include "../base/fileio.h"
#include "../compile/model.h"

#define METRICS_HIST_MAX 4096 /* epochs a chart holds; later ones are written to metrics.jsonl only */
#define METRICS_STEPS_MAX 4096 /* logged intervals a chart holds: beyond, every other one is dropped */
#define METRICS_DRAW_S 0.25    /* the in-place line is redrawn at most 4 times a second */
#define METRICS_QUIET_S 30.0   /* a plain line at least this often */

typedef struct metrics_hist {
  double epoch[METRICS_HIST_MAX], train_loss[METRICS_HIST_MAX], test_loss[METRICS_HIST_MAX], test_acc[METRICS_HIST_MAX];
  int n;
  /* per logged interval: fractional epoch, training loss, learning rate; every `stride`-th kept */
  double sx[METRICS_STEPS_MAX], sloss[METRICS_STEPS_MAX], slr[METRICS_STEPS_MAX];
  int ns, stride, skip;
} metrics_hist;

/* One logged interval for the chart. When the arrays are full every other point is dropped and
 * only every second interval is kept from then on, so a long run's chart still spans it all. */
static void metrics_hist_step(metrics_hist *h, double x, double loss, double lr) {
  if (h->stride < 1) h->stride = 1;
  if (h->skip > 0) {
    h->skip--;
    return;
  }
  if (h->ns >= METRICS_STEPS_MAX) {
    for (int i = 0; i < h->ns / 2; i++)
      h->sx[i] = h->sx[2 * i], h->sloss[i] = h->sloss[2 * i], h->slr[i] = h->slr[2 * i];
    h->ns /= 2, h->stride *= 2;
  }
  h->sx[h->ns] = x, h->sloss[h->ns] = loss, h->slr[h->ns] = lr;
  h->ns++;
  h->skip = h->stride - 1;
}

/* One epoch point for the chart (NaN where a value is absent); past METRICS_HIST_MAX epochs
 * the chart stops growing while metrics.jsonl keeps every line. */
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

/* Tracks the last and the best test accuracy (1-based epochs) for the summary; NaN is ignored. */
static void metrics_note_acc(tt_metrics *m, int epoch, double acc) {
  if (!isfinite(acc)) return;
  m->last_acc = acc, m->last_acc_epoch = epoch;
  if (!m->best_acc_epoch || acc > m->best_acc) m->best_acc = acc, m->best_acc_epoch = epoch;
}

/* A chart point from an eval line (or an epoch line of a run without a test split), or from a
 * train line (per logged interval: x is the step over the steps of an epoch). */
static void metrics_hist_line(tt_metrics *m, const char *line) {
  metrics_hist *h = m->hist;
  int eval = strstr(line, "\"event\": \"eval\"") != NULL, epoch = strstr(line, "\"event\": \"epoch\"") != NULL;
  if (strstr(line, "\"event\": \"train\"") && m->steps_per_epoch > 0)
    metrics_hist_step(h, metrics_field(line, "step") / m->steps_per_epoch, metrics_field(line, "loss"),
                      metrics_field(line, "lr"));
  if (!eval && !epoch) return;
  if (eval) metrics_note_acc(m, (int)metrics_field(line, "epoch"), metrics_field(line, "accuracy"));
  metrics_hist_add(h, metrics_field(line, "epoch"), metrics_field(line, "train_loss"),
                   eval ? metrics_field(line, "loss") : NAN, eval ? metrics_field(line, "accuracy") : NAN);
}

/* Prepares m to print to out: in place (a redrawn line with a bar) when progress is 1, or -1
 * and out is a terminal, plain lines otherwise; quiet prints nothing but errors. Opens no file:
 * tt_metrics_open does, once the run directory is known. */
void tt_metrics_init(tt_metrics *m, FILE *out, int quiet, int progress) {
  memset(m, 0, sizeof *m);
  m->out = out;
  m->quiet = quiet;
  m->in_place = progress == 1 || (progress < 0 && isatty(fileno(out)));
  m->last_loss = NAN;
  m->t_run0 = m->last_line = tt_now();
  struct winsize ws;
  if (m->in_place && isatty(fileno(out)) && ioctl(fileno(out), TIOCGWINSZ, &ws) == 0) m->cols = ws.ws_col;
}

/* Ends an in-place progress line so that the next output starts on a line of its own. */
void tt_metrics_end_line(tt_metrics *m) {
  if (!m->line_open) return;
  fputc('\n', m->out);
  fflush(m->out);
  m->line_open = 0;
}

/* printf to the run's output unless quiet, after ending any in-place line; flushed at once, so
 * the line is out before any later message on stderr. */
void tt_metrics_say(tt_metrics *m, const char *fmt, ...) {
  if (m->quiet) return;
  tt_metrics_end_line(m);
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
      metrics_hist_line(m, line);
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

/* Opens dir/metrics.jsonl for the run's lines. A resumed run first carries over the old run's
 * lines up to the checkpoint's step (and feeds them to the chart) and appends after them; a
 * fresh run truncates. Returns 0, or -1 with err. */
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

/* Ends the progress line, closes metrics.jsonl and frees the chart history; safe to call on
 * an m that was never opened, and twice. */
void tt_metrics_close(tt_metrics *m) {
  tt_metrics_end_line(m); /* an error message after it starts a line of its own */
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

/* Resets the per-epoch counters and clocks; skipped_before is the loss scaler's skip count at
 * the epoch's start, to tell whether this epoch skipped fp16 steps. */
void tt_metrics_epoch_begin(tt_epoch_meter *e, int epoch, long long skipped_before) {
  memset(e, 0, sizeof *e);
  e->epoch = epoch;
  e->t0 = e->log_t0 = tt_now();
  e->skipped_before = (int)skipped_before;
}

/* h:mm:ss, or m:ss under an hour; "?" when unknown. */
static void metrics_hms(char *buf, size_t size, double s) {
  if (!isfinite(s) || s < 0 || s > 1e8) {
    snprintf(buf, size, "?");
    return;
  }
  long t = (long)(s + 0.5) % 100000000L; /* s <= 1e8 above: for the compiler */
  if (t >= 3600) snprintf(buf, size, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(buf, size, "%ld:%02ld", t / 60, t % 60);
}

/* The progress line after step k of the epoch: in place (with a bar, cut to the terminal's
 * width) or as a plain line. The loss is the last logged interval's. */
static void metrics_show(tt_metrics *m, const tt_epoch_meter *e, int k, long long step, double now) {
  double el = now - e->t0, per = e->steps ? el / (double)e->steps : NAN;
  char loss[32], run[32], eta_e[32], eta_r[32], line[512], bar[24];
  if (isfinite(m->last_loss)) snprintf(loss, sizeof loss, "%.4f", m->last_loss);
  else snprintf(loss, sizeof loss, "-");
  metrics_hms(run, sizeof run, now - m->t_run0);
  metrics_hms(eta_e, sizeof eta_e, (m->steps_per_epoch - (k + 1)) * per);
  metrics_hms(eta_r, sizeof eta_r, m->end_step > step ? (double)(m->end_step - step) * per : 0.0);
  const char *fp16 = m->fp16_note ? "  (fp16 overflow: steps skipped)" : "";
  if (m->in_place) {
    int w = (int)(sizeof bar - 4), fill = m->steps_per_epoch > 0 ? (int)((long long)(k + 1) * w / m->steps_per_epoch) : 0;
    bar[0] = '[';
    for (int i = 0; i < w; i++) bar[1 + i] = i < fill ? '#' : '-';
    bar[w + 1] = ']', bar[w + 2] = 0;
    snprintf(line, sizeof line, "epoch %d/%d %s %d/%d  loss %s  %.0f img/s  data wait %.0f%%  %s elapsed  ETA %s epoch, "
             "%s run%s", e->epoch + 1, m->epochs, bar, k + 1, m->steps_per_epoch, loss, e->images / (el + 1e-9),
             100.0 * e->wait / (el + 1e-9), run, eta_e, eta_r, fp16);
    if (m->cols > 1 && (int)strlen(line) >= m->cols) line[m->cols - 1] = 0; /* a wrapped line cannot be redrawn */
    fprintf(m->out, "\r\033[K%s", line);
    m->line_open = 1;
    m->last_draw = now;
  } else {
    fprintf(m->out, "epoch %d/%d  step %d/%d  loss %s  %.0f img/s  data wait %.0f%%  arena %.1f MiB  elapsed %s  "
            "ETA %s epoch, %s run%s\n", e->epoch + 1, m->epochs, k + 1, m->steps_per_epoch, loss, e->images / (el + 1e-9),
            100.0 * e->wait / (el + 1e-9), m->arena_bytes / 1048576.0, run, eta_e, eta_r, fp16);
  }
  m->last_line = now;
  fflush(m->out);
}

/* Starts the run's clock (ETA and elapsed time count from here, after setup and data loading)
 * and sets the step the run will end at, for the run's ETA. */
void tt_metrics_start(tt_metrics *m, long long end_step) {
  m->end_step = end_step;
  m->t_run0 = m->last_line = tt_now();
  m->last_draw = 0;
}

int tt_metrics_due(const tt_metrics *m) {
  double now = tt_now();
  if (m->quiet) return 0;
  return m->in_place ? (!m->line_open || now - m->last_draw >= METRICS_DRAW_S) : now - m->last_line >= METRICS_QUIET_S;
}

/* Redraws the progress after a step, rate-limited: in place at most every METRICS_DRAW_S
 * seconds, a plain line at most every METRICS_QUIET_S, so that printing costs the run little.
 * running_loss (NaN: none): the mean loss of the steps since the last logged interval, shown in
 * place of that interval's once it is known (the line no longer shows one value for up to
 * log_every steps). */
void tt_metrics_step(tt_metrics *m, const tt_epoch_meter *e, int step_in_epoch, long long step, double running_loss) {
  if (!tt_metrics_due(m)) return;
  if (isfinite(running_loss)) m->last_loss = running_loss;
  metrics_show(m, e, step_in_epoch, step, tt_now());
}

/* Writes one "train" line (the logged interval's mean loss and accuracy, lr, throughput and
 * loss scale) to metrics.jsonl, adds it to the chart and shows the progress. Returns 0, or -1
 * when the line could not be written (a full disk), which stops the run. */
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
  m->last_loss = loss;
  if (m->hist && m->steps_per_epoch > 0) metrics_hist_step(m->hist, (double)step / m->steps_per_epoch, loss, lr);
  if (m->quiet) return 0;
  m->fp16_note = ls->skipped > e->skipped_before;
  metrics_show(m, e, step_in_epoch, step, now);
  return 0;
}

/* "null" when this process trained no image of the epoch (resumed with only its evaluation left). */
static void metrics_train_loss(const tt_epoch_meter *e, char *buf, size_t size) {
  if (e->images) snprintf(buf, size, "%.6g", e->loss_sum / (double)e->images);
  else snprintf(buf, size, "null");
}

/* Writes the epoch's "eval" line (test loss and accuracy, the epoch's training loss) and prints
 * the epoch's summary line. 0, or -1 when the line could not be written. */
int tt_metrics_eval(tt_metrics *m, const tt_epoch_meter *e, long long step, double test_loss, double test_acc,
                    tt_err *err) {
  char tl[32];
  metrics_train_loss(e, tl, sizeof tl);
  errno = 0;
  int printed = fprintf(m->jsonl, "{\"event\": \"eval\", \"epoch\": %d, \"step\": %lld, \"loss\": %.6g, \"accuracy\": %.6g, "
                                  "\"train_loss\": %s, \"seconds\": %.2f}\n",
                        e->epoch + 1, step, test_loss, test_acc, tl, tt_now() - e->t0);
  if (metrics_flushed(m, printed, err)) return -1;
  tt_metrics_say(m, "epoch %d/%d  test accuracy %.2f%%  test loss %.4f  (%.1f s)\n", e->epoch + 1, m->epochs,
                 100.0 * test_acc, test_loss, tt_now() - e->t0);
  metrics_hist_add(m->hist, e->epoch + 1, e->images ? e->loss_sum / (double)e->images : NAN, test_loss, test_acc);
  metrics_note_acc(m, e->epoch + 1, test_acc);
  return 0;
}

/* The "epoch" line of a run without a test split: the epoch's training loss only. */
int tt_metrics_epoch(tt_metrics *m, const tt_epoch_meter *e, long long step, tt_err *err) {
  char tl[32];
  metrics_train_loss(e, tl, sizeof tl);
  errno = 0;
  int printed = fprintf(m->jsonl, "{\"event\": \"epoch\", \"epoch\": %d, \"step\": %lld, \"train_loss\": %s, \"seconds\": %.2f}\n",
                        e->epoch + 1, step, tl, tt_now() - e->t0);
  if (metrics_flushed(m, printed, err)) return -1;
  tt_metrics_say(m, "epoch %d/%d  train loss %s  (%.1f s)\n", e->epoch + 1, m->epochs, tl, tt_now() - e->t0);
  metrics_hist_add(m->hist, e->epoch + 1, e->images ? e->loss_sum / (double)e->images : NAN, NAN, NAN);
  return 0;
}

/* Writes dir/chart.svg from the history gathered so far (atomic, like every output file).
 * Returns 0 (also when there is nothing to draw), or -1 with err. */
int tt_metrics_chart(const tt_metrics *m, const char *dir, const char *title, tt_err *err) {
  char path[TT_PATH_MAX + 64];
  const metrics_hist *h = m->hist;
  snprintf(path, sizeof path, "%s/chart.svg", dir);
  if (!h) return 0; /* stopped before metrics.jsonl was opened: nothing to draw */
  tt_chart_steps st = {h->sx, h->sloss, h->slr, h->ns};
  return tt_chart_svg_steps(path, h->epoch, h->train_loss, h->test_loss, h->test_acc, h->n, &st, title, err);
}

/* Prints the end-of-run summary: skipped fp16 steps, final and best test accuracy, time and
 * throughput, memory (the planned arena and the process's peak RSS) and the run directory. */
void tt_metrics_summary(tt_metrics *m, const char *dir, const tt_loss_scale *ls, double seconds, long long steps,
                        long long images) {
  char t[32];
  struct rusage ru;
  if (ls->skipped)
    tt_metrics_say(m, "fp16: %lld optimizer steps skipped on overflow; final loss scale %g\n", ls->skipped,
                   (double)ls->scale);
  if (m->last_acc_epoch)
    tt_metrics_say(m, "test accuracy: final %.2f%% (epoch %d), best %.2f%% (epoch %d)\n", 100.0 * m->last_acc,
                   m->last_acc_epoch, 100.0 * m->best_acc, m->best_acc_epoch);
  else
    tt_metrics_say(m, "test accuracy: none (no epoch of this run was evaluated)\n");
  metrics_hms(t, sizeof t, seconds);
  tt_metrics_say(m, "time: %s (%.1f s) for %lld steps, %lld images: %.0f img/s\n", t, seconds, steps, images,
                 seconds > 0 ? (double)images / seconds : 0.0);
  /* ru_maxrss is in KiB on Linux */
  double rss = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss / 1024.0 : NAN;
  tt_metrics_say(m, "peak memory: arena %.1f MiB (planned, one allocation), process peak RSS %.1f MiB\n",
                 m->arena_bytes / 1048576.0, rss);
  tt_metrics_say(m, "run directory: %s (weights.safetensors, state.safetensors, metrics.jsonl, chart.svg)\n", dir);
}
