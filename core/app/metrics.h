/* core/app/metrics.h — what a training run reports: one JSON object per line in metrics.jsonl, the
 * progress line on the terminal (rewritten in place on a tty), the per-epoch and closing text,
 * and the history chart.svg is drawn from. train.c decides what happened; this file says it. */
#ifndef TT_METRICS_H
#define TT_METRICS_H
#include <stddef.h>
#include <stdio.h>

#include "../runtime/lossscale.h"
#include "../compile/model.h"
#include "../base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_metrics {
  FILE *out;                  /* progress and summary text */
  int quiet;                  /* 1: say nothing (errors are the caller's) */
  int in_place;               /* the progress line is rewritten in place, not appended */
  int epochs, steps_per_epoch;/* of this run, for the progress line */
  size_t arena_bytes;         /* for the progress line and the summary */
  long long end_step;         /* the step the run ends at (epochs x steps, or --max-steps): the run's ETA */
  int cols;                   /* the terminal's width when in place (0 unknown): the line is cut to it */
  int fp16_note;              /* this epoch skipped fp16 steps: the progress line says so */
  int line_open;              /* an in-place line is on the terminal without its newline */
  double t_run0;              /* tt_now() at tt_metrics_start */
  double last_draw, last_line;/* when the in-place line was last drawn, when a plain line was last printed */
  double last_loss;           /* of the last logged interval; NaN before the first */
  double last_acc, best_acc;  /* test accuracy of the last evaluation and the best (history carried on resume) */
  int last_acc_epoch, best_acc_epoch; /* 1-based; 0 none */
  FILE *jsonl;                /* metrics.jsonl; NULL until tt_metrics_open */
  char path[TT_PATH_MAX + 64]; /* its path, for messages */
  struct metrics_hist *hist;  /* per-epoch points of the chart (metrics.c) */
} tt_metrics;

/* The running figures of the epoch in progress that the lines are made from. The trainer adds
 * to wait, loss_sum, images and log_images; the metrics functions read them and restart the
 * logging interval. */
typedef struct tt_epoch_meter {
  int epoch;                  /* 0-based */
  double t0;                  /* tt_now() when the epoch started */
  double wait;                /* seconds spent waiting for the loader this epoch */
  double loss_sum;            /* summed per-image training loss of the logged intervals */
  long long images;           /* trained this epoch */
  long long steps;            /* optimizer steps this process ran this epoch (for the ETA) */
  double log_t0;              /* start of the current logging interval */
  long long log_images;       /* trained in it */
  int skipped_before;         /* fp16 updates skipped before this epoch */
} tt_epoch_meter;

/* progress: -1 auto (a terminal gets the line rewritten in place), 0 plain lines, 1 in place. */
void tt_metrics_init(tt_metrics *m, FILE *out, int quiet, int progress);
/* A line of text for the person watching, unless quiet. */
void tt_metrics_say(tt_metrics *m, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Opens dir/metrics.jsonl. A fresh run (resume_dir NULL) writes it afresh. A resumed run
 * carries over resume_dir/metrics.jsonl (dir's own, or the run's it resumes with --out
 * elsewhere) up to the checkpoint's step, drops the lines written after that checkpoint (they
 * would repeat) and a line cut short by a kill, adds {"event": "resume", "epoch", "step"}
 * (written atomically), then appends; its eval lines seed the chart's history. Called only
 * once every check of the resume passed: a refused resume leaves the file as it was. */
int tt_metrics_open(tt_metrics *m, const char *dir, const char *resume_dir, long long step, int epoch, tt_err *err);
void tt_metrics_close(tt_metrics *m);
/* The run's first step is about to run: the clock of the elapsed time and the ETA starts, and
 * end_step is the step it will stop at. */
void tt_metrics_start(tt_metrics *m, long long end_step);
/* After each optimizer step (step_in_epoch k, 0-based; `step` done in all): on a terminal the
 * progress line is redrawn, at most 4 times a second; in a file or pipe a plain line is printed
 * when none was for 30 s, so that no run stays silent between log_every steps. */
void tt_metrics_step(tt_metrics *m, const tt_epoch_meter *e, int step_in_epoch, long long step, double running_loss);
/* Whether tt_metrics_step would draw now (a caller reads what the line shows only then). */
int tt_metrics_due(const tt_metrics *m);
/* Ends an in-place line with its newline, so that what is printed next starts a line of its own
 * (tt_metrics_say and tt_metrics_close do it themselves). */
void tt_metrics_end_line(tt_metrics *m);

void tt_metrics_epoch_begin(tt_epoch_meter *e, int epoch, long long skipped_before);
/* A logging interval ended at optimizer step `step` (step_in_epoch, 0-based): its "train" line
 * and the progress line. loss and accuracy are the interval's means per image. Every line
 * writer returns -1 with err naming the file when the line could not be written (disk full). */
int tt_metrics_train(tt_metrics *m, tt_epoch_meter *e, int step_in_epoch, long long step, double loss, double accuracy,
                     double lr, const tt_loss_scale *ls, tt_err *err);
/* The epoch was evaluated: its "eval" line, its summary line and its point of the chart.
 * train_loss is null when this process trained none of the epoch's images. */
int tt_metrics_eval(tt_metrics *m, const tt_epoch_meter *e, long long step, double test_loss, double test_acc,
                    tt_err *err);
/* The epoch ended and there is no test split: an "epoch" line with train_loss, its summary
 * line and its point of the chart. */
int tt_metrics_epoch(tt_metrics *m, const tt_epoch_meter *e, long long step, tt_err *err);
/* dir/chart.svg from the history so far: per-epoch losses and accuracy, and per logged interval
 * the training loss and the learning rate. */
int tt_metrics_chart(const tt_metrics *m, const char *dir, const char *title, tt_err *err);
/* The closing text: the final and best test accuracy with their epochs, the time, steps, images
 * and images per second of this process's run (seconds, steps, images), the arena and the
 * process's peak resident memory (getrusage), fp16 skipped steps if any, and where the run's
 * files are. */
void tt_metrics_summary(tt_metrics *m, const char *dir, const tt_loss_scale *ls, double seconds, long long steps,
                        long long images);

#ifdef __cplusplus
}
#endif
#endif
