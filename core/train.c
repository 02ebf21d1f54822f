/* core/train.c — the train stage: epochs, learning-rate schedule, evaluation, checkpoints,
 * metrics, progress. Everything it needs is set up before the first step; the step loop
 * allocates nothing. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chart.h"
#include "checkpoint.h"
#include "data.h"
#include "fileio.h"
#include "session.h"
#include "tinytrain.h"
#include "train.h"

void tt_run_opts_init(tt_run_opts *o) {
  memset(o, 0, sizeof *o);
  o->progress = -1;
}

double tt_lr_at(const tt_train_cfg *t, double epoch) {
  double base = t->lr;
  if (t->warmup_epochs > 0 && epoch < t->warmup_epochs)
    return base * (0.01 + 0.99 * epoch / t->warmup_epochs); /* linear warm-up from lr/100 */
  switch (t->schedule) {
    case TT_SCHED_STEP: {
      int k = t->step_epochs > 0 ? (int)floor(epoch / t->step_epochs) : 0;
      return base * pow(t->gamma, k);
    }
    case TT_SCHED_COSINE: {
      double span = t->epochs - t->warmup_epochs;
      double f = span > 0 ? (epoch - t->warmup_epochs) / span : 1.0;
      if (f > 1.0) f = 1.0;
      if (f < 0.0) f = 0.0;
      return t->min_lr + (base - t->min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * f));
    }
    default:
      return base;
  }
}

typedef struct train_hist {
  double epoch[4096], train_loss[4096], test_loss[4096], test_acc[4096];
  int n;
} train_hist;

/* Rebuilds the chart history from the eval lines of an existing metrics.jsonl (resume). */
static void train_hist_read(train_hist *h, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[1024];
  while (fgets(line, sizeof line, f) && h->n < 4096) {
    if (!strstr(line, "\"event\": \"eval\"")) continue;
    const char *e = strstr(line, "\"epoch\": "), *l = strstr(line, "\"loss\": "), *a = strstr(line, "\"accuracy\": ");
    const char *tl = strstr(line, "\"train_loss\": ");
    if (!e || !l || !a) continue;
    h->epoch[h->n] = atof(e + 9);
    h->test_loss[h->n] = atof(l + 8);
    h->test_acc[h->n] = atof(a + 12);
    h->train_loss[h->n] = tl ? atof(tl + 14) : NAN;
    h->n++;
  }
  fclose(f);
}

static int train_evaluate(tt_session *s, tt_loader *ld, double *loss, double *acc, tt_err *err) {
  float st[2];
  if (tt_exec_stats(&s->x, NULL, 1, err)) return -1;
  tt_loader_start_epoch(ld, 0, 0);
  long long n = 0;
  for (;;) {
    const uint8_t *img;
    const int32_t *lab;
    int cnt;
    double w;
    int r = tt_loader_next(ld, &img, &lab, &cnt, &w);
    if (r == 1) break;
    if (r < 0) return tt_fail(err, "the test-data loader failed");
    int rc = tt_exec_eval(&s->x, img, lab, cnt, err);
    tt_loader_release(ld);
    if (rc) return -1;
    n += cnt;
  }
  if (tt_exec_stats(&s->x, st, 1, err)) return -1;
  *loss = n ? st[0] / (double)n : 0.0;
  *acc = n ? st[1] / (double)n : 0.0;
  return 0;
}

static void train_say(const tt_run_opts *o, FILE *out, const char *fmt, ...) {
  if (o->quiet) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(out, fmt, ap);
  va_end(ap);
  fflush(out);
}

typedef struct train_res {
  tt_session *s;
  tt_dataset train_ds, test_ds;
  tt_loader *tl, *el;
  FILE *metrics;
  train_hist *hist;
} train_res;

static int train_body(tt_run_opts *o, train_res *R, FILE *out, tt_err *err) {
  char dir[TT_PATH_MAX], path[TT_PATH_MAX + 64];
  if (tt_session_open(&R->s, o, TT_SESSION_TRAIN, err)) return -1;
  tt_session *s = R->s;
  const tt_model *m = &s->model;
  const tt_train_cfg *tc = &m->train;
  int in_place = o->progress == 1 || (o->progress < 0 && isatty(fileno(out)));
  if (!o->quiet) tt_session_print_summary(s, out);

  if (m->data.format == TT_DATA_NONE) {
    tt_fail(err, "%s: has no [data] section; add one with format and train/test paths to train", m->path);
    return -1;
  }
  if (tt_dataset_load(&m->data, 1, m->in_c, m->in_h, m->in_w, &R->train_ds, err, tt_warn_stderr, NULL) ||
      tt_dataset_load(&m->data, 0, m->in_c, m->in_h, m->in_w, &R->test_ds, err, tt_warn_stderr, NULL))
    return -1;
  if (R->train_ds.skipped || R->test_ds.skipped)
    train_say(o, out, "data: skipped %d training and %d test images that could not be read (listed above)\n",
              R->train_ds.skipped, R->test_ds.skipped);
  for (int k = 0; k < R->train_ds.n; k++)
    if (R->train_ds.labels[k] < 0 || R->train_ds.labels[k] >= m->classes) {
      tt_fail(err, "%s: training label %d of image %d is outside [0, %d) set by [net] classes", m->data.train,
              R->train_ds.labels[k], k, m->classes);
      return -1;
    }
  int mb = s->sched.policy.micro_batch, accum = s->sched.policy.accum_steps;
  if (R->train_ds.n < mb * accum) {
    tt_fail(err, "%s: %d training images are fewer than one effective batch of %d", m->data.train, R->train_ds.n, mb * accum);
    return -1;
  }
  int loader_threads = 2;
  if (tt_loader_create(&R->tl, &R->train_ds, mb, 1, m->data.crop_pad, m->data.hflip, tc->seed, loader_threads, err) ||
      tt_loader_create(&R->el, &R->test_ds, s->sched.eval.policy.micro_batch, 0, 0, 0, tc->seed, 1, err))
    return -1;

  tt_ckpt_state st;
  memset(&st, 0, sizeof st);
  tt_loss_scale_init(&st.loss_scale, s->sched.policy.act_dtype == TT_F16);
  st.seed = tc->seed;
  if (o->resume_dir) {
    snprintf(path, sizeof path, "%s/state.safetensors", o->resume_dir);
    if (tt_checkpoint_load(&s->x, path, 1, &st, err)) return -1;
    if (st.micro_batch * st.accum_steps != tc->batch) {
      tt_fail(err, "%s: was written with effective batch %d but %s has batch %d", path, st.micro_batch * st.accum_steps,
              m->path, tc->batch);
      return -1;
    }
    train_say(o, out, "resumed from %s at step %lld (epoch %d, batch %d)\n", path, st.step, st.epoch + 1, st.batch_in_epoch);
  } else if (tt_exec_init_params(&s->x, tc->seed, err)) {
    return -1;
  }

  /* run directory: --out, else the resumed run's own directory, else runs/<name>. Made only
   * now, so that a refused checkpoint leaves no empty directory behind. */
  if (o->out_dir) snprintf(dir, sizeof dir, "%s", o->out_dir);
  else if (o->resume_dir) snprintf(dir, sizeof dir, "%s", o->resume_dir);
  else snprintf(dir, sizeof dir, "runs/%s", m->name);
  if (tt_mkdirs(dir, err)) return -1;
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  R->hist = (train_hist *)tt_calloc(1, sizeof(train_hist), "metrics history", err);
  if (!R->hist) return -1;
  train_hist *hist = R->hist;
  if (o->resume_dir) train_hist_read(hist, path);
  R->metrics = fopen(path, o->resume_dir ? "a" : "w");
  if (!R->metrics) {
    tt_fail(err, "%s: cannot write metrics: %s", path, strerror(errno));
    return -1;
  }
  FILE *metrics = R->metrics;

  tt_loader *tl = R->tl, *el = R->el;
  int epochs = o->epochs > 0 ? o->epochs : tc->epochs;
  tt_train_cfg sched_cfg = *tc; /* the schedule (cosine length) spans the epochs of this run, --epochs included */
  sched_cfg.epochs = epochs;
  int batches = tt_loader_batches(tl);
  int steps_per_epoch = batches / accum;
  if (steps_per_epoch < 1) {
    tt_fail(err, "%s: one epoch has fewer images than one effective batch", m->path);
    return -1;
  }
  tt_opt_hparams hp;
  memset(&hp, 0, sizeof hp);
  hp.kind = tc->optimizer, hp.momentum = tc->momentum, hp.weight_decay = tc->weight_decay, hp.beta1 = tc->beta1;
  hp.beta2 = tc->beta2, hp.eps = tc->adam_eps, hp.nesterov = tc->nesterov;
  int log_every = tc->log_every > 0 ? tc->log_every : 100;
  double final_loss = 0.0, final_acc = 0.0;
  int stopped = 0;
  /* the arena is not zeroed: clear the loss/accuracy sums before the first step accumulates */
  if (tt_exec_stats(&s->x, NULL, 1, err)) return -1;
  if (o->max_steps > 0 && st.step >= o->max_steps) stopped = 1; /* resumed at the limit already: no step */
  for (int epoch = st.epoch; epoch < epochs && !stopped; epoch++) {
    int start_batch = epoch == st.epoch ? st.batch_in_epoch : 0;
    tt_loader_start_epoch(tl, epoch, start_batch);
    double t0 = tt_now(), wait = 0.0, ep_loss = 0.0, log_loss = 0.0, log_correct = 0.0, log_t0 = t0;
    long long ep_images = 0, log_images = 0;
    int step_in_epoch = start_batch / accum;
    int skipped_before = (int)st.loss_scale.skipped;
    for (; step_in_epoch < steps_per_epoch; step_in_epoch++) {
      double lr = tt_lr_at(&sched_cfg, (double)epoch + (double)step_in_epoch / steps_per_epoch);
      float gscale = st.loss_scale.scale / (float)(mb * accum);
      for (int k = 0; k < accum; k++) {
        const uint8_t *img;
        const int32_t *lab;
        int cnt;
        double w = 0.0;
        int r = tt_loader_next(tl, &img, &lab, &cnt, &w);
        if (r != 0) {
          tt_fail(err, "the training-data loader ended early (epoch %d, step %d)", epoch + 1, step_in_epoch);
          return -1;
        }
        wait += w;
        int e = tt_exec_micro_step(&s->x, img, lab, k, (uint64_t)st.step, gscale, err);
        tt_loader_release(tl);
        if (e) return -1;
      }
      int overflow = 0;
      hp.lr = (float)lr;
      if (tt_exec_update(&s->x, &hp, (int)(st.step - st.loss_scale.skipped) + 1, 1.0f / st.loss_scale.scale, &overflow,
                         err))
        return -1;
      tt_loss_scale_update(&st.loss_scale, overflow);
      st.step++;
      ep_images += (long long)mb * accum;
      log_images += (long long)mb * accum;
      if (st.step % log_every == 0 || step_in_epoch == steps_per_epoch - 1) {
        float sv[2];
        if (tt_exec_stats(&s->x, sv, 1, err)) return -1;
        double l = log_images ? sv[0] / (double)log_images : 0.0;
        if (!isfinite(l) && s->sched.policy.act_dtype == TT_F32) {
          tt_fail(err, "the training loss became %g at step %lld; lower [train] lr in %s", l, st.step, m->path);
          return -1;
        }
        log_loss = l;
        log_correct = log_images ? sv[1] / (double)log_images : 0.0;
        ep_loss += sv[0];
        double now = tt_now();
        fprintf(metrics,
                "{\"event\": \"train\", \"epoch\": %d, \"step\": %lld, \"loss\": %.6g, \"accuracy\": %.6g, \"lr\": %.6g, "
                "\"images_per_s\": %.1f, \"data_wait\": %.4f, \"loss_scale\": %.9g, \"skipped\": %lld}\n",
                epoch + 1, st.step, l, log_correct, lr, log_images / (now - log_t0 + 1e-9), wait / (now - t0 + 1e-9),
                (double)st.loss_scale.scale, st.loss_scale.skipped);
        fflush(metrics);
        log_images = 0;
        log_t0 = now;
        if (!o->quiet) {
          double el = now - t0;
          char line[256];
          snprintf(line, sizeof line, "epoch %d/%d  step %d/%d  loss %.4f  %.0f img/s  data wait %.0f%%  arena %.1f MiB%s",
                   epoch + 1, epochs, step_in_epoch + 1, steps_per_epoch, log_loss, ep_images / (el + 1e-9),
                   100.0 * wait / (el + 1e-9), s->x.arena_bytes / 1048576.0,
                   st.loss_scale.skipped > skipped_before ? "  (fp16 overflow: steps skipped)" : "");
          if (in_place) fprintf(out, "\r\033[K%s", line);
          else fprintf(out, "%s\n", line);
          fflush(out);
        }
      }
      if (o->max_steps > 0 && st.step >= o->max_steps) {
        stopped = 1;
        st.epoch = epoch;
        st.batch_in_epoch = (step_in_epoch + 1) * accum;
        if (step_in_epoch + 1 == steps_per_epoch) st.epoch = epoch + 1, st.batch_in_epoch = 0;
        break;
      }
    }
    if (stopped && st.batch_in_epoch != 0) break; /* mid-epoch stop: checkpoint below, no evaluation */
    /* end of epoch: evaluate, checkpoint, chart */
    double tl_loss, tacc;
    if (train_evaluate(s, el, &tl_loss, &tacc, err)) return -1;
    double epoch_train_loss = ep_images ? ep_loss / (double)ep_images : 0.0;
    final_loss = tl_loss, final_acc = tacc;
    fprintf(metrics, "{\"event\": \"eval\", \"epoch\": %d, \"step\": %lld, \"loss\": %.6g, \"accuracy\": %.6g, "
                     "\"train_loss\": %.6g, \"seconds\": %.2f}\n",
            epoch + 1, st.step, tl_loss, tacc, epoch_train_loss, tt_now() - t0);
    fflush(metrics);
    if (in_place && !o->quiet) fprintf(out, "\n");
    train_say(o, out, "epoch %d/%d  test accuracy %.2f%%  test loss %.4f  (%.1f s)\n", epoch + 1, epochs, 100.0 * tacc,
              tl_loss, tt_now() - t0);
    if (hist->n < 4096) {
      hist->epoch[hist->n] = epoch + 1;
      hist->train_loss[hist->n] = epoch_train_loss;
      hist->test_loss[hist->n] = tl_loss;
      hist->test_acc[hist->n] = tacc;
      hist->n++;
    }
    if (!stopped) st.epoch = epoch + 1, st.batch_in_epoch = 0;
    st.micro_batch = mb, st.accum_steps = accum;
    if (tt_checkpoint_save(&s->x, dir, &st, err)) return -1;
    snprintf(path, sizeof path, "%s/chart.svg", dir);
    if (tt_chart_svg(path, hist->epoch, hist->train_loss, hist->test_loss, hist->test_acc, hist->n, m->name, err)) return -1;
  }
  if (stopped) {
    st.micro_batch = mb, st.accum_steps = accum;
    if (tt_checkpoint_save(&s->x, dir, &st, err)) return -1;
  }
  o->final_accuracy = final_acc;
  o->final_loss = final_loss;
  o->steps_done = st.step;
  if (st.loss_scale.skipped) train_say(o, out, "fp16: %lld optimizer steps skipped on overflow; final loss scale %g\n",
                                       st.loss_scale.skipped, (double)st.loss_scale.scale);
  train_say(o, out, "run directory: %s (weights.safetensors, state.safetensors, metrics.jsonl, chart.svg)\n", dir);
  return 0;
}

int tt_train(tt_run_opts *o, char *errbuf, size_t errsize) {
  tt_err err;
  err.msg[0] = 0;
  train_res R;
  memset(&R, 0, sizeof R);
  int rc = train_body(o, &R, o->out ? o->out : stdout, &err);
  if (R.metrics) fclose(R.metrics);
  free(R.hist);
  if (R.tl) tt_loader_destroy(R.tl);
  if (R.el) tt_loader_destroy(R.el);
  tt_dataset_free(&R.train_ds);
  tt_dataset_free(&R.test_ds);
  if (R.s) tt_session_close(R.s);
  if (rc && errbuf) snprintf(errbuf, errsize, "%s", err.msg[0] ? err.msg : "unknown error");
  return rc;
}

int tt_evaluate(tt_run_opts *o, const char *weights, char *errbuf, size_t errsize) {
  tt_err err;
  err.msg[0] = 0;
  tt_session *s = NULL;
  tt_dataset ds;
  memset(&ds, 0, sizeof ds);
  tt_loader *el = NULL;
  int rc = -1;
  FILE *out = o->out ? o->out : stdout;
  if (tt_session_open(&s, o, TT_SESSION_EVAL, &err)) goto done;
  if (s->model.data.format == TT_DATA_NONE) {
    tt_fail(&err, "%s: has no [data] section with a test split", s->model.path);
    goto done;
  }
  if (tt_checkpoint_load(&s->x, weights, 0, NULL, &err)) goto done;
  if (tt_dataset_load(&s->model.data, 0, s->model.in_c, s->model.in_h, s->model.in_w, &ds, &err, tt_warn_stderr, NULL)) goto done;
  if (tt_loader_create(&el, &ds, s->sched.eval.policy.micro_batch, 0, 0, 0, 1, 1, &err)) goto done;
  double loss, acc;
  if (train_evaluate(s, el, &loss, &acc, &err)) goto done;
  o->final_accuracy = acc, o->final_loss = loss;
  fprintf(out, "accuracy %.4f (%.2f%%) loss %.4f on %d test images\n", acc, 100.0 * acc, loss, ds.n);
  rc = 0;
done:
  if (el) tt_loader_destroy(el);
  tt_dataset_free(&ds);
  if (s) tt_session_close(s);
  if (rc && errbuf) snprintf(errbuf, errsize, "%s", err.msg[0] ? err.msg : "unknown error");
  return rc;
}
