/* core/app/train.c — the train stage: data, resume or initialise, the run directory, the epochs
 * and their steps, learning-rate schedule, evaluation, checkpoints (at the end of each epoch,
 * every checkpoint_every, and when a signal asks the run to stop). What the run reports
 * (metrics.jsonl, the progress line, the summary text, the chart) is metrics.c's. Everything
 * it needs is set up before the first step; the step loop allocates nothing. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../compile/recipe.h"
#include "../runtime/checkpoint.h"
#include "../data/data.h"
#include "../runtime/dist.h"
#include "../base/fileio.h"
#include "../runtime/finetune.h"
#include "metrics.h"
#include "../runtime/session.h"
#include "../runtime/step.h"
#include "../tinytrain.h"
#include "train.h"
#include "run_recipe.h"

/* Options with every field zero (no recipe, defaults from the recipe and the device) except
 * progress = -1, which means "decide from whether the output is a terminal". */
tt_run_opts tt_run_opts_default(void) {
  tt_run_opts o;
  memset(&o, 0, sizeof o);
  o.progress = -1;
  return o;
}

/* The same defaults written through a pointer, for callers that would rather not receive a
 * struct by value; NULL is a no-op. */
void tt_run_opts_init(tt_run_opts *o) {
  if (o) *o = tt_run_opts_default();
}

const char *tt_version(void) { return TT_VERSION; }

/* What a run reports when it got nowhere: nothing evaluated, no step. */
static void train_result_clear(tt_run_result *res) {
  if (!res) return;
  memset(res, 0, sizeof *res);
  res->final_accuracy = res->final_loss = NAN;
}

/* Whether a checkpoint is due once `step` optimizer steps are done in total: a
 * step interval, when set, wins over a time interval (seconds since the last save); with
 * neither set, never. */
int tt_train_checkpoint_due(long long every_steps, double every_seconds, long long step, double seconds_since) {
  if (every_steps > 0) return step % every_steps == 0;
  return every_seconds > 0 && seconds_since >= every_seconds;
}

/* fp16 updates skipped in a row (overflowing gradients) after which the run stops: the loss scale
 * has then been halved past 1 long since, so the gradients overflow unscaled */
#define TRAIN_SKIPS_MAX 32

/* ---- SIGINT, SIGTERM, SIGHUP and SIGPIPE: stop at the next step boundary with a checkpoint ----
 * SIGHUP (a closed terminal or ssh connection) and SIGPIPE (stdout piped into `head`, which has
 * exited) used to end the run at once, losing up to checkpoint_every of work; they are stop
 * requests like the others. After SIGPIPE the writes to the dead pipe fail with EPIPE, which
 * the progress output ignores. */

/* The signal that asked the run to stop, 0 while none did. With train_poll, the only
 * process-wide state in the library: a signal handler can reach nothing else. The handler only
 * sets it, on a thread that runs no step (below); the step loop reads it between steps. */
static volatile sig_atomic_t train_stop_signal;

static void train_on_signal(int sig) { train_stop_signal = sig; }

/* The stop signals that run train_on_signal during the run (their disposition was the default)
 * and that the step loop takes when they wait pending, blocked on the thread that called tt_train:
 * those the run blocked itself (train_signals_install; pending when no thread of its own could be
 * made to take them), and SIGPIPE, raised on this thread alone by its own write to a dead pipe.
 * A signal the caller had blocked already is left to the caller's way of taking it. */
static sigset_t train_poll;

#define TRAIN_NSIG 4
typedef struct train_signals {
  struct sigaction old[TRAIN_NSIG];
  int installed[TRAIN_NSIG];
  sigset_t blocked; /* the stop signals this run blocked (the caller had not): unblocked at the end */
  int thread;       /* train_signal_thread runs */
  pthread_t tid;
} train_signals;

static const int train_signal_nums[TRAIN_NSIG] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

/* The name the stop message gives a signal. */
static const char *train_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : sig == SIGPIPE ? "SIGPIPE" : "a signal";
}

/* 1 when set holds none of the stop signals (POSIX has no emptiness test; glibc's
 * sigisemptyset needs _GNU_SOURCE, which the amalgamation's users may not define). */
static int train_sigset_none(const sigset_t *set) {
  for (int i = 0; i < TRAIN_NSIG; i++)
    if (sigismember(set, train_signal_nums[i]) == 1) return 0;
  return 1;
}

/* The thread that takes the stop signals the run blocked elsewhere: it unblocks them and sleeps,
 * so the handler (or, after SA_RESETHAND, the default action of a second Ctrl-C) runs here.
 * Cancelled at the end of the run (pause is a cancellation point). */
static void *train_signal_thread(void *arg) {
  pthread_sigmask(SIG_UNBLOCK, (const sigset_t *)arg, NULL);
  for (;;) pause();
  return NULL;
}

/* Blocks (how = SIG_BLOCK) or unblocks set in every thread of OpenMP's pool that a step may use:
 * a team as large as the pool may grow. Threads the pool makes later inherit the mask of the
 * thread that makes them, the caller's. */
static void train_team_mask(int how, const sigset_t *set) {
#ifdef _OPENMP
  int n = omp_get_num_procs() > omp_get_max_threads() ? omp_get_num_procs() : omp_get_max_threads();
#pragma omp parallel num_threads(n)
  pthread_sigmask(how, set, NULL);
#else
  (void)how, (void)set;
#endif
}

/* Handlers only where the disposition is the default: an ignored signal (the SIGINT of a
 * background job) stays ignored, and an application's own handler stays its own. SA_RESETHAND:
 * a second Ctrl-C takes the default action at once (a step that hangs can still be killed; the
 * checkpoints on disk stay loadable, every write being atomic).
 * Issue 40 (Ctrl-C crashed the run): oneDNN's f32 GEMM on AVX2 (its JIT kernel avx_gemm_f32,
 * behind the linear layers and some convolutions) runs with the stack pointer inside a heap
 * workspace. A signal handled on that thread has its frame (1 to 11 KB of saved registers)
 * written just below the stack pointer, over the heap chunk in front of the workspace, and
 * glibc aborts in a later free, however little the handler does. So the signals that run the
 * handler are blocked on the calling thread and in OpenMP's pool, and one thread of the run's
 * own takes them. The command line blocks them in every thread before it makes one (main.c
 * main_route_signals); then they are already blocked here and its thread takes them. Where the
 * thread cannot be made, nothing takes them and the step loop takes them pending. */
static void train_signals_install(train_signals *t) {
  sigset_t cur;
  train_stop_signal = 0;
  sigemptyset(&train_poll);
  sigemptyset(&t->blocked);
  t->thread = 0;
  pthread_sigmask(SIG_BLOCK, NULL, &cur);
  for (int i = 0; i < TRAIN_NSIG; i++) {
    int s = train_signal_nums[i];
    t->installed[i] = 0;
    if (sigaction(s, NULL, &t->old[i]) != 0) continue;
    if ((t->old[i].sa_flags & SA_SIGINFO) || t->old[i].sa_handler != SIG_DFL) continue;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = train_on_signal;
    sigemptyset(&sa.sa_mask);
    /* SIGPIPE comes again with every write to the dead pipe: it keeps the handler */
    sa.sa_flags = SA_RESTART | (s == SIGPIPE ? 0 : SA_RESETHAND);
    t->installed[i] = sigaction(s, &sa, NULL) == 0;
    if (!t->installed[i]) continue;
    /* taken pending between steps: what this run blocks, and SIGPIPE, which a write of this thread
     * to a dead pipe raises on it alone (blocked here by the command line, main.c) */
    if (!sigismember(&cur, s)) sigaddset(&t->blocked, s), sigaddset(&train_poll, s);
    else if (s == SIGPIPE) sigaddset(&train_poll, s);
  }
  if (train_sigset_none(&t->blocked)) return; /* none, or the caller routes them (the command line) */
  pthread_sigmask(SIG_BLOCK, &t->blocked, NULL);
  train_team_mask(SIG_BLOCK, &t->blocked);
  pthread_attr_t at;
  if (pthread_attr_init(&at)) return;
  pthread_attr_setstacksize(&at, 256 * 1024); /* a signal frame with AVX-512 and AMX state is about 11 KB */
  t->thread = pthread_create(&t->tid, &at, train_signal_thread, &t->blocked) == 0;
  pthread_attr_destroy(&at);
}

/* The signal that asks the run to stop, or 0: the handler's flag, else one of train_poll
 * pending on this thread (taken here, between steps, as the handler would have). */
static int train_stop_requested(void) {
  int sig = train_stop_signal;
  if (sig || train_sigset_none(&train_poll)) return sig;
  struct timespec now = {0, 0}; /* none pending: -1 at once */
  int got = sigtimedwait(&train_poll, NULL, &now);
  if (got > 0) train_stop_signal = got;
  return train_stop_signal;
}

/* Ends what train_signals_install began: its thread, the stop signals it blocked (one that came
 * after the last step's check is taken here, as it would have been by the handler, and the run
 * ends as it was going to), and the dispositions it replaced, and only those. */
static void train_signals_restore(train_signals *t) {
  if (t->thread) pthread_cancel(t->tid), pthread_join(t->tid, NULL);
  struct timespec now = {0, 0};
  int blocked = !train_sigset_none(&t->blocked);
  if (blocked)
    while (sigtimedwait(&t->blocked, NULL, &now) > 0) {
    }
  for (int i = 0; i < TRAIN_NSIG; i++)
    if (t->installed[i]) sigaction(train_signal_nums[i], &t->old[i], NULL);
  if (blocked) {
    train_team_mask(SIG_UNBLOCK, &t->blocked);
    pthread_sigmask(SIG_UNBLOCK, &t->blocked, NULL);
  }
  sigemptyset(&train_poll);
}

/* The learning rate at a fractional epoch: a linear warm-up from lr/100 to lr over
 * warmup_epochs, then constant, step (times gamma every step_epochs, counted from epoch 0,
 * warm-up included) or cosine from lr down to min_lr over the epochs after the warm-up. */
double tt_lr_at(const tt_train_cfg *t, double epoch) {
  double base = t->lr;
  if (t->warmup_epochs > 0 && epoch < t->warmup_epochs)
    return base * (0.01 + 0.99 * epoch / t->warmup_epochs); /* linear warm-up from lr/100 */
  switch (t->schedule) {
    case TT_LR_STEP: {
      int k = t->step_epochs > 0 ? (int)floor(epoch / t->step_epochs) : 0;
      return base * pow(t->gamma, k);
    }
    case TT_LR_COSINE: {
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

/* Mean loss and accuracy over the test split. Under mpirun each rank evaluates its shard and
 * the means are recombined weighted by each shard's image count, so every rank returns the
 * figures of the whole split. 0 or -1. */
static int train_evaluate(tt_session *s, tt_loader *ld, double *loss, double *acc, tt_err *err) {
  long long n = 0;
  if (tt_step_eval_pass(&s->x, ld, loss, acc, &n, err)) return -1;
  if (tt_dist_size() <= 1) return 0;
  double sum[3] = {*loss * (double)n, *acc * (double)n, (double)n}; /* each rank evaluated its shard: the sums of all */
  if (tt_dist_sum(sum, 3, err)) return -1;
  *loss = sum[2] > 0 ? sum[0] / sum[2] : 0.0;
  *acc = sum[2] > 0 ? sum[1] / sum[2] : 0.0;
  return 0;
}

/* Everything one tt_train call holds; tt_train releases it whatever state the run reached. */
typedef struct train_run {
  const tt_run_opts *o;
  tt_run_result *res;            /* the caller's, or NULL */
  tt_session *s;
  tt_dataset train_ds, test_ds;
  tt_loader *tl, *el;            /* training and test batches; el is NULL without a test split */
  tt_metrics mt;
  tt_ckpt_state st;              /* step, position and loss scale: what a checkpoint holds */
  char dir[TT_PATH_MAX];         /* the run directory */
  int lock_fd;                   /* dir/.lock, flock'ed for the life of the run (rank 0); -1 none */
  char resumed_from[TT_PATH_MAX + 64]; /* the state file resumed from, for messages */
  int mb, accum, batch;          /* micro-batch, accumulation steps, effective batch (global: x ranks) */
  int rank, ranks;               /* this process and the processes (core/runtime/dist.h); only rank 0 writes */
  tt_dist_buckets *bk;           /* the gradient all-reduce's buckets; NULL for one process */
  int epochs, steps_per_epoch, log_every;
  tt_train_cfg lr_cfg;        /* the recipe's, spanning the epochs of this run */
  tt_opt_hparams hp;
  long long ckpt_steps;          /* checkpoint_every: steps, or seconds of wall time */
  double ckpt_seconds;
  double last_save;              /* tt_now() at the last checkpoint (or the start) */
  int skips_in_row;              /* fp16: consecutive skipped updates recorded (TRAIN_SKIPS_MAX ends the run) */
  long long saved_step;          /* step of the checkpoint on disk; -1 none yet */
  int stop_signal;               /* the signal this run stopped for */
  double final_loss, final_acc;  /* of the last evaluation */
} train_run;

/* Loads both splits (the test split when the recipe has one), checks them against the recipe
 * and the schedule, and starts the loaders. */
static int train_data(train_run *R, tt_err *err) {
  const tt_model *m = &R->s->model;
  if (m->data.format == TT_DATA_NONE)
    return tt_fail(err, "%s: has no [data] section; add one with format and train/test paths to train", m->path);
  int has_test = m->data.format == TT_DATA_SYNTHETIC || m->data.test[0];
  if (tt_dataset_load(&m->data, 1, m->in_c, m->in_h, m->in_w, &R->train_ds, err, tt_warn_stderr, NULL) ||
      (has_test && tt_dataset_load(&m->data, 0, m->in_c, m->in_h, m->in_w, &R->test_ds, err, tt_warn_stderr, NULL)))
    return -1;
  if (tt_dataset_name_classes(&m->data, m->classes, &R->train_ds, err) ||
      (has_test && tt_dataset_map_classes(&R->test_ds, &R->train_ds, err))) /* the run's classes: training's */
    return -1;
  if (!has_test)
    tt_metrics_say(&R->mt, "data: %s has no test split ([data] test = ...): training without evaluation\n", m->path);
  if (R->train_ds.skipped || R->test_ds.skipped)
    tt_metrics_say(&R->mt, "data: skipped %d training and %d test images that could not be read (listed above)\n",
                   R->train_ds.skipped, R->test_ds.skipped);
  for (int k = 0; k < R->train_ds.n; k++)
    if (R->train_ds.labels[k] < 0 || R->train_ds.labels[k] >= m->classes)
      return tt_fail(err, "%s: training label %d of image %d is outside [0, %d) set by [net] classes", m->data.train,
                     R->train_ds.labels[k], k, m->classes);
  if (R->train_ds.n < R->batch)
    return tt_fail(err, "%s: %d training images are fewer than one effective batch of %d", m->data.train, R->train_ds.n,
                   R->batch);
  int loader_threads = m->data.loader_threads > 0 ? m->data.loader_threads : TT_LOADER_THREADS;
  const tt_train_cfg *tc = &m->train;
  if (tt_loader_create(&R->tl, &R->train_ds, R->mb, 1, m->data.crop_pad, m->data.hflip, tc->seed, loader_threads, err))
    return -1;
  if (has_test && tt_loader_create(&R->el, &R->test_ds, R->s->sched.eval.policy.micro_batch, 0, 0, 0, tc->seed, 1, err))
    return -1;
  tt_loader_shard(R->tl, R->rank, R->ranks); /* every rank its share of the same order */
  if (R->el) tt_loader_shard(R->el, R->rank, R->ranks);
  tt_loader_set_warn(R->tl, tt_warn_stderr, NULL); /* a streaming set's corrupt images, as met */
  if (R->el) tt_loader_set_warn(R->el, tt_warn_stderr, NULL);
  tt_crop crop[2]; /* [data] random_resized_crop (training), resize (evaluation) */
  tt_crop_from_cfg(&m->data, 1, &crop[0]), tt_crop_from_cfg(&m->data, 0, &crop[1]);
  tt_loader_set_crop(R->tl, &crop[0]);
  if (R->el) tt_loader_set_crop(R->el, &crop[1]);
  return 0;
}

/* The run's length, learning-rate schedule, optimizer settings, logging and checkpoint intervals. */
static int train_loop_setup(train_run *R, tt_err *err) {
  const tt_model *m = &R->s->model;
  const tt_train_cfg *tc = &m->train;
  R->epochs = R->o->epochs > 0 ? R->o->epochs : tc->epochs;
  R->lr_cfg = *tc; /* the schedule (cosine length) spans the epochs of this run, --epochs included */
  R->lr_cfg.epochs = R->epochs;
  R->steps_per_epoch = tt_loader_batches(R->tl) / R->accum;
  if (R->steps_per_epoch < 1) return tt_fail(err, "%s: one epoch has fewer images than one effective batch", m->path);
  tt_step_hparams(tc, &R->hp);
  R->log_every = tc->log_every > 0 ? tc->log_every : 100;
  R->ckpt_steps = tc->checkpoint_steps, R->ckpt_seconds = tc->checkpoint_seconds;
  if (R->o->checkpoint_every && tt_parse_interval(R->o->checkpoint_every, &R->ckpt_steps, &R->ckpt_seconds))
    return tt_fail(err, "checkpoint_every '%.40s': expected optimizer steps (500), a wall time (30s, 10m, 1h) or 0",
                   R->o->checkpoint_every);
  const tt_graph *g = R->s->x.g;
  int trainable = 0;
  for (int i = 0; i < g->nparams && !trainable; i++) trainable = g->params[i].trainable;
  if (!trainable && R->rank == 0) {
    char w[TT_PATH_MAX + 300];
    snprintf(w, sizeof w, "%s: warning: every layer is frozen (freeze = true): training changes no weight, only "
             "batch-norm running statistics; remove freeze from the layers to train", m->path);
    tt_warn_stderr(NULL, w);
  }
  R->mt.epochs = R->epochs, R->mt.steps_per_epoch = R->steps_per_epoch;
  R->mt.arena_bytes = R->s->x.arena_bytes;
  /* the arena is not zeroed: clear the loss/accuracy sums before the first step accumulates */
  return tt_exec_stats(&R->s->x, NULL, 1, err);
}

/* The optimizer's recipe name, stored in the state file and compared on resume. */
static const char *train_opt_name(tt_opt_kind k) {
  return k == TT_OPT_SGD ? "sgd" : k == TT_OPT_ADAM ? "adam" : k == TT_OPT_ADAMW ? "adamw" : "?";
}

/* A resumed state against this run: the effective batch, the position against the size of an
 * epoch, the step count against the position (a warning), and the loss scale against this
 * run's precision (a policy change may switch fp16 autocast on or off). */
static int train_resume_check(train_run *R, tt_err *err) {
  const tt_model *m = &R->s->model;
  tt_ckpt_state *st = &R->st;
  const char *path = R->resumed_from;
  long long per_epoch = (long long)R->steps_per_epoch * R->batch;
  if (st->seed != m->train.seed)
    return tt_fail(err, "%s: was written with [train] seed = %llu but %s has seed = %llu (the data order and dropout "
                   "would change mid-run); set seed = %llu in the recipe to continue it, or start a new run from its "
                   "weights with --init %s/weights.safetensors", path, st->seed, m->path, m->train.seed, st->seed,
                   R->o->resume_dir);
  const char *opt = train_opt_name(m->train.optimizer);
  if (st->optimizer[0] && strcmp(st->optimizer, opt))
    return tt_fail(err, "%s: was written with [train] optimizer = %s but %s has optimizer = %s (its optimizer state "
                   "does not carry over); set optimizer = %s in the recipe to continue it, or start a new run from its "
                   "weights with --init %s/weights.safetensors", path, st->optimizer, m->path, opt, st->optimizer,
                   R->o->resume_dir);
  if (st->micro_batch * st->accum_steps != R->batch)
    return tt_fail(err, "%s: was written with effective batch %d but %s has batch %d", path,
                   st->micro_batch * st->accum_steps, m->path, R->batch);
  if (st->images_in_epoch > per_epoch)
    return tt_fail(err, "%s: metadata 'images_in_epoch' = %lld is past the end of an epoch (%lld images of %s); was "
                   "the training set changed? Resume with the data it was written with",
                   path, st->images_in_epoch, per_epoch, m->data.train[0] ? m->data.train : "synthetic data");
  long long want = (long long)st->epoch * R->steps_per_epoch + st->images_in_epoch / R->batch;
  if (st->step != want) {
    char w[TT_PATH_MAX + 400];
    snprintf(w, sizeof w, "%s: warning: step %lld, but epoch %d at image %lld makes %lld steps of %d per epoch; was "
             "the training set changed since it was written? Continuing from step %lld",
             path, st->step, st->epoch + 1, st->images_in_epoch, want, R->steps_per_epoch, st->step);
    tt_warn_stderr(NULL, w);
  }
  int fp16 = R->s->sched.policy.act_dtype == TT_F16;
  if (fp16 != (st->loss_scale.growth_interval > 0)) {
    long long skipped = st->loss_scale.skipped;
    tt_loss_scale_init(&st->loss_scale, fp16);
    st->loss_scale.skipped = skipped;
    tt_metrics_say(&R->mt, "resume: the checkpoint was written %s fp16 autocast, this run %s it: loss scale %g\n",
                   fp16 ? "without" : "with", fp16 ? "uses" : "does not use", (double)st->loss_scale.scale);
  }
  return 0;
}

/* --init W: what matches of W over the fresh parameters (core/runtime/finetune.c), reported. */
static int train_init_from(train_run *R, tt_err *err) {
  tt_strbuf rep;
  if (!R->o->init_weights) return 0;
  memset(&rep, 0, sizeof rep);
  int rc = tt_finetune_load(&R->s->x, R->o->init_weights, &rep, NULL, err);
  if (!rc) tt_metrics_say(&R->mt, "%s\n", rep.p);
  free(rep.p);
  return rc;
}

/* FNV-1a, 64 bits. */
static unsigned long long train_hash(unsigned long long h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

/* Under mpirun, before the first collective that depends on them: the ranks agree on what
 * must be the same everywhere (a rank with another --max-steps or another data folder would
 * otherwise hang the job, or train another run silently). Fails on every rank, naming the
 * first rank and field that differ from rank 0's. */
static int train_agree(train_run *R, tt_err *err) {
  if (R->ranks <= 1) return 0;
  const tt_run_opts *o = R->o;
  const tt_model *m = &R->s->model;
  unsigned long long h0 = 14695981039346656037ULL, recipe = h0, classes = h0, every = h0;
  if (o->recipe_text) {
    recipe = train_hash(h0, o->recipe_text, strlen(o->recipe_text));
  } else if (o->recipe) {
    void *text = NULL;
    size_t n = 0;
    if (tt_read_file(o->recipe, &text, &n, err)) return -1;
    recipe = train_hash(h0, text, n);
    free(text);
  }
  for (int c = 0; c < R->train_ds.classes; c++) {
    const char *nm = R->train_ds.class_names && R->train_ds.class_names[c] ? R->train_ds.class_names[c] : "";
    classes = train_hash(classes, nm, strlen(nm) + 1);
  }
  if (o->checkpoint_every) every = train_hash(h0, o->checkpoint_every, strlen(o->checkpoint_every));
  const tt_dist_field f[] = {
      {"the recipe's text", recipe, "the recipe files differ"},
      {"--max-steps", (unsigned long long)o->max_steps, NULL},
      {"--epochs (the run's epochs)", (unsigned long long)R->epochs, NULL},
      {"the micro-batch (--micro-batch, --vram)", (unsigned long long)R->mb, NULL},
      {"the accumulation steps", (unsigned long long)R->accum, NULL},
      {"--precision", (unsigned long long)o->precision, NULL},
      {"the precision planned (--vram)", (unsigned long long)R->s->sched.policy.act_dtype, NULL},
      {"--recompute", (unsigned long long)o->recompute, NULL},
      {"--vram", (unsigned long long)o->vram_bytes, NULL},
      {"--checkpoint-every", every, "another interval"},
      {"the number of training images", (unsigned long long)R->train_ds.n, NULL},
      {"the number of test images", (unsigned long long)R->test_ds.n, NULL},
      {"the class list", classes, "other class names"},
      {"[train] seed", (unsigned long long)m->train.seed, NULL},
      {"--resume's state step (-1: not resuming)", (unsigned long long)(o->resume_dir ? R->st.step : -1), NULL},
  };
  return tt_dist_agree(f, (int)(sizeof f / sizeof f[0]), err);
}

/* The starting state: the resumed run's checkpoint, or freshly initialised parameters. */
static int train_resume_or_init(train_run *R, tt_err *err) {
  const tt_model *m = &R->s->model;
  const tt_train_cfg *tc = &m->train;
  tt_ckpt_state *st = &R->st;
  memset(st, 0, sizeof *st);
  tt_loss_scale_init(&st->loss_scale, R->s->sched.policy.act_dtype == TT_F16);
  st->seed = tc->seed;
  st->classes = (const char *const *)R->train_ds.class_names, st->nclasses = R->train_ds.classes; /* saved, checked */
  snprintf(st->optimizer, sizeof st->optimizer, "%s", train_opt_name(tc->optimizer));
  R->saved_step = -1;
  if (!R->o->resume_dir)
    return tt_exec_init_params(&R->s->x, tc->seed, err) || train_init_from(R, err) || train_agree(R, err) ||
                   tt_dist_broadcast_params(&R->s->x, 0, err) ? -1 : 0;
  snprintf(R->resumed_from, sizeof R->resumed_from, "%s/state.safetensors", R->o->resume_dir);
  if (tt_checkpoint_load(&R->s->x, R->resumed_from, 1, st, tt_warn_stderr, NULL, err) || train_resume_check(R, err) ||
      train_agree(R, err) || tt_dist_broadcast_params(&R->s->x, 0, err))
    return -1;
  snprintf(st->optimizer, sizeof st->optimizer, "%s", train_opt_name(tc->optimizer));
  R->saved_step = st->step;
  tt_metrics_say(&R->mt, "resumed from %s at step %lld (epoch %d, image %lld of %lld)%s\n", R->resumed_from, st->step,
                 st->epoch + 1, st->images_in_epoch, (long long)R->steps_per_epoch * R->batch,
                 st->micro_batch != R->mb ? "; the position is in images, so the new micro-batch starts there" : "");
  return 0;
}

/* Whether dir holds file name. */
static int train_dir_has(const char *dir, const char *name) {
  char p[TT_PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

/* Whether a and b are the same directory (same device and inode: symbolic links and
 * different spellings of one path compare equal); 0 when either cannot be stat'ed. */
static int train_same_dir(const char *a, const char *b) {
  struct stat sa, sb;
  if (stat(a, &sa) || stat(b, &sb)) return 0;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* runs/<name>, or the first of runs/<name>-2, -3, ... that does not exist yet: a recipe run
 * again never overwrites the run before it. mkdir decides, so two runs started at once
 * cannot pick the same directory. */
static int train_fresh_dir(train_run *R, tt_err *err) {
  const char *name = R->s->model.name;
  if (tt_mkdirs("runs", err)) return -1;
  for (int k = 1; k <= 100000; k++) {
    if (k == 1) snprintf(R->dir, sizeof R->dir, "runs/%s", name);
    else snprintf(R->dir, sizeof R->dir, "runs/%s-%d", name, k);
    if (mkdir(R->dir, 0755) == 0) {
      if (k > 1) tt_metrics_say(&R->mt, "runs/%s holds an earlier run: this one writes to %s\n", name, R->dir);
      return 0;
    }
    if (errno != EEXIST) return tt_fail(err, "%s: cannot create the run directory (%s); use --out DIR", R->dir, strerror(errno));
  }
  return tt_fail(err, "runs/%s-2 to -100000 all exist; clean up runs/ or use --out DIR", name);
}

/* Temporary files of writes that a kill interrupted (fileio.c writes <file>.tmp, then renames). */
static void train_remove_stale(train_run *R) {
  static const char *const names[4] = {"state.safetensors", "weights.safetensors", "metrics.jsonl", "chart.svg"};
  char p[TT_PATH_MAX + 64];
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s/%s.tmp", R->dir, names[i]);
    if (unlink(p) == 0) tt_metrics_say(&R->mt, "removed %s, left behind by an interrupted write\n", p);
  }
}

/* --out '' or --resume '' would mean the current directory or "/" once "/state.safetensors" is
 * appended; "/" itself is no run directory either. */
static int train_check_dir(const char *opt, const char *dir, tt_err *err) {
  struct stat a, b;
  if (!dir) return 0;
  if (!dir[0]) return tt_fail(err, "%s '': the run directory is empty; name a directory (e.g. %s runs/mine)", opt, opt);
  int root = 1;
  for (const char *c = dir; *c && root; c++) root = *c == '/';
  if (!root && stat(dir, &a) == 0 && stat("/", &b) == 0) root = a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  if (root) return tt_fail(err, "%s %s: is the root directory; name a directory of its own for the run (e.g. %s runs/mine)",
                           opt, dir, opt);
  return 0;
}

/* dir/.lock, flock'ed for the life of the run and holding this process's id: a second run on
 * the same directory is refused, naming the process that holds it. The lock goes with the
 * process (a killed run leaves the file, not the lock). */
static int train_lock(train_run *R, tt_err *err) {
  char p[TT_PATH_MAX + 16], held[32] = "";
  snprintf(p, sizeof p, "%s/.lock", R->dir);
  /* never through a link, and only a regular file: a link planted in a shared run directory
   * would have the truncate and write below land on its target (issue 40) */
  int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  struct stat st;
  if (fd < 0 && errno == ELOOP)
    return tt_fail(err, "%s is a symbolic link; a run's lock file must be a regular file: remove it", p);
  if (fd < 0) return tt_fail(err, "%s: cannot create the run's lock file (%s); check the directory's permissions", p, strerror(errno));
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return tt_fail(err, "%s is not a regular file; a run's lock file must be one: remove it", p);
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    ssize_t n = pread(fd, held, sizeof held - 1, 0);
    held[n > 0 ? n : 0] = 0;
    held[strcspn(held, "\n")] = 0;
    close(fd);
    if (e == EWOULDBLOCK)
      return tt_fail(err, "%s: another run is using this directory (process %s holds %s); wait for it to end or stop "
                     "it, or choose another --out", R->dir, held[0] ? held : "unknown", p);
    return tt_fail(err, "%s: cannot lock (%s)", p, strerror(e));
  }
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
    close(fd);
    return tt_fail(err, "%s: cannot write the process id (%s)", p, strerror(errno));
  }
  R->lock_fd = fd;
  return 0;
}

/* The run directory: --out, else the resumed run's own directory, else a fresh runs/<name>.
 * Made only now, after every check of the resume, so that a refused run leaves no directory
 * behind and a refused resume leaves metrics.jsonl as it was. */
static int train_run_dir(train_run *R, tt_err *err) {
  const tt_run_opts *o = R->o;
  if (R->rank) return 0; /* rank 0 writes the run directory */
  if (o->out_dir) {
    snprintf(R->dir, sizeof R->dir, "%s", o->out_dir);
    int existed = access(R->dir, F_OK) == 0;
    if (tt_mkdirs(R->dir, err) || train_lock(R, err)) return -1; /* the lock first: a run in progress is named */
    int same = o->resume_dir && train_same_dir(o->out_dir, o->resume_dir);
    if (!same && train_dir_has(R->dir, "state.safetensors"))
      return tt_fail(err, "%s: holds an earlier run (state.safetensors); continue it with --resume %s, or choose "
                     "another --out, or remove it first", R->dir, R->dir);
    /* the state file is written before the weights: weights without one are not a run of this
     * version that can be continued */
    if (!same && train_dir_has(R->dir, "weights.safetensors"))
      return tt_fail(err, "%s: holds weights.safetensors but no state.safetensors, so it cannot be resumed; start from "
                     "them with --init %s/weights.safetensors and another --out, or remove them first", R->dir, R->dir);
    if (!same && existed && train_dir_has(R->dir, "metrics.jsonl"))
      tt_metrics_say(&R->mt, "%s: holds a run stopped before its first checkpoint (metrics.jsonl, no state): "
                     "starting it afresh there\n", R->dir);
  } else if (o->resume_dir) {
    snprintf(R->dir, sizeof R->dir, "%s", o->resume_dir);
    if (train_lock(R, err)) return -1;
  } else if (train_fresh_dir(R, err) || train_lock(R, err)) {
    return -1;
  }
  train_remove_stale(R);
  /* a re-planned run keeps its micro-batch as if given (--micro-batch): a resume plans with it, so
   * the resumed steps are those of the run not interrupted (docs/plan.md#re-planning-after-the-warm-up) */
  tt_run_opts kept = *o;
  if (R->s->replanned) kept.micro_batch = R->mb;
  if (tt_run_recipe_keep(R->dir, &kept, &R->s->model, R->epochs, o->resume_dir != NULL, err)) return -1; /* for --resume DIR alone */
  R->last_save = tt_now();
  return tt_metrics_open(&R->mt, R->dir, o->resume_dir, R->st.step, R->st.epoch, err);
}

/* Records the previous step's overflow outcome in the loss scaler (core/runtime/lossscale.h: the host
 * learns of an overflow one step late; the update itself was skipped on the device). */
static int train_record_pending(train_run *R, tt_err *err) {
  return tt_step_settle(&R->s->x, &R->st.loss_scale, err);
}

/* Before a checkpoint: the pending outcome is read (waiting is fine here) but not recorded, so
 * the checkpoint holds exactly the state a run that goes on would have. */
static int train_resolve_pending(train_run *R, tt_err *err) {
  tt_loss_scale *ls = &R->st.loss_scale;
  if (ls->pending && ls->pending_overflow < 0 && tt_exec_overflow(&R->s->x, &ls->pending_overflow, err)) return -1;
  return 0;
}

/* Writes both checkpoint files for the state as it stands. */
static int train_save(train_run *R, tt_err *err) {
  /* accum_steps: the micro-batches of a step over all ranks, so a resume on another number of
   * ranks sees the same effective batch */
  R->st.micro_batch = R->mb, R->st.accum_steps = R->accum * R->ranks;
  if (train_resolve_pending(R, err)) return -1;
  int rc = R->rank == 0 ? tt_checkpoint_save(&R->s->x, R->dir, &R->st, err) : 0;
  if (rc == TT_CKPT_NOT_FINITE) { /* diverged: the last good checkpoint stays, and the run ends here */
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    if (R->saved_step >= 0)
      return tt_fail(err, "step %lld: %s; the last good checkpoint, of step %lld, is kept in %s to resume from", R->st.step,
                     why, R->saved_step, R->dir);
    return tt_fail(err, "step %lld: %s; no checkpoint had been written yet", R->st.step, why);
  }
  if (rc) return -1;
  R->saved_step = R->st.step;
  R->last_save = tt_now();
  return 0;
}

/* One optimizer step (step_in_epoch k of epoch): accum micro-steps, then the update. The
 * micro-steps are queued at the scale known now; the previous step's overflow outcome is
 * recorded only then, so the host never waits for the device in the step (core/runtime/lossscale.h). */
static int train_step(train_run *R, int epoch, int k, double lr, tt_epoch_meter *e, tt_err *err) {
  tt_ckpt_state *st = &R->st;
  float used = st->loss_scale.scale; /* the scale this step's gradients carry */
  float gscale = used / (float)R->batch;
  for (int a = 0; a < R->accum; a++) {
    const uint8_t *img;
    const int32_t *lab;
    int cnt;
    double w = 0.0;
    if (tt_loader_next(R->tl, &img, &lab, &cnt, &w) != 0)
      return tt_loader_error(R->tl)[0] ? tt_fail(err, "%s", tt_loader_error(R->tl))
                                       : tt_fail(err, "the training-data loader ended early (epoch %d, step %d)", epoch + 1, k);
    e->wait += w;
    if (a == R->accum - 1) tt_dist_allreduce_begin(R->bk); /* its backward starts the buckets */
    int rc = tt_exec_micro_step(&R->s->x, img, lab, a, (uint64_t)st->step, gscale, err);
    tt_loader_release(R->tl);
    if (rc) return -1;
  }
  if (tt_dist_allreduce_end(R->bk, err)) return -1; /* summed over the ranks, before the overflow check */
  long long skipped = st->loss_scale.skipped;
  if (tt_step_update(&R->s->x, &R->hp, &st->loss_scale, st->step, lr, used, err)) return -1;
  /* fp16: the outcome just recorded was the step before's. From 2^16 the scale reaches 1 in 16
   * halvings; TRAIN_SKIPS_MAX overflows in a row are a run that does not recover (issue 40) */
  R->skips_in_row = st->loss_scale.skipped > skipped ? R->skips_in_row + 1 : st->loss_scale.pending ? 0 : R->skips_in_row;
  if (R->skips_in_row >= TRAIN_SKIPS_MAX)
    return tt_fail(err, "step %lld: %d fp16 steps in a row overflowed (the loss scale is down to %g) and were skipped: the "
                   "run is not recovering; lower [train] lr in %s, or train in bf16 or fp32", st->step, R->skips_in_row,
                   (double)st->loss_scale.scale, R->s->model.path);
  st->step++;
  e->steps++;
  e->images += R->batch;
  e->log_images += R->batch;
  return 0;
}

/* Tells the caller's progress callback (tt_run_opts.on_progress), if any. */
static void train_progress(train_run *R, int eval, int epoch, double loss, double acc, double lr) {
  if (!R->o->on_progress) return;
  tt_progress p;
  memset(&p, 0, sizeof p);
  p.eval = eval, p.epoch = epoch, p.epochs = R->epochs, p.step = R->st.step, p.steps_per_epoch = R->steps_per_epoch;
  p.loss = loss, p.accuracy = acc, p.lr = lr;
  R->o->on_progress(R->o->progress_ud, &p);
}

/* Ends a logging interval: reads and clears the device's loss/accuracy sums, then the lines.
 * notify: tell the progress callback too (the log_every intervals and the ends of epochs; not
 * the extra intervals at the run's first and last step, so the callback's cadence stays as
 * documented). */
static int train_log(train_run *R, tt_epoch_meter *e, int k, double lr, int notify, tt_err *err) {
  float f[2];
  if (tt_exec_stats(&R->s->x, f, 1, err)) return -1;
  double sv[2] = {f[0], f[1]}; /* every rank's sums: e->log_images counts the global batch */
  if (tt_dist_sum(sv, 2, err)) return -1;
  double l = e->log_images ? sv[0] / (double)e->log_images : 0.0;
  /* every precision (issue 40: bf16 and fp16 runs went on to write NaN weights); an fp16 step
   * whose gradients overflow is skipped, but a non-finite loss is the forward's own */
  if (!isfinite(l))
    return tt_fail(err, "the training loss became %g at step %lld: the run diverged; lower [train] lr in %s (the last "
                   "good checkpoint%s is kept)", l, R->st.step, R->s->model.path, R->saved_step >= 0 ? "" : ", if any,");
  double acc = e->log_images ? sv[1] / (double)e->log_images : 0.0;
  e->loss_sum += sv[0];
  if (R->rank) return e->log_images = 0, 0;
  if (notify) train_progress(R, 0, e->epoch, l, acc, lr);
  return tt_metrics_train(&R->mt, e, k, R->st.step, l, acc, lr, &R->st.loss_scale, err);
}

/* After step k of epoch: the position a checkpoint records, then whether to stop (a signal,
 * --max-steps) or to write a checkpoint because checkpoint_every says so. A signal on the
 * last step of an epoch records the whole epoch as done but not evaluated: the resumed run
 * evaluates it. --max-steps there goes on to the evaluation, as every epoch's end does. */
static int train_after_step(train_run *R, int epoch, int k, int *stopped, tt_err *err) {
  tt_ckpt_state *st = &R->st;
  int last = k + 1 == R->steps_per_epoch;
  st->epoch = epoch, st->images_in_epoch = (long long)(k + 1) * R->batch;
  int sig = train_stop_requested();
  if (tt_dist_max(&sig, err)) return -1; /* a signal to any rank stops every rank at this step */
  if (sig) {
    R->stop_signal = sig;
    *stopped = 1;
  } else if (R->o->max_steps > 0 && st->step >= R->o->max_steps) {
    *stopped = 1;
    if (last) st->epoch = epoch + 1, st->images_in_epoch = 0;
  } else if (!last && tt_train_checkpoint_due(R->ckpt_steps, R->ckpt_seconds, st->step, tt_now() - R->last_save)) {
    return train_save(R, err);
  }
  return 0;
}

/* The steps of one epoch from where the state says it stands, until its end or a stop. */
static int train_epoch(train_run *R, int epoch, tt_epoch_meter *e, int *stopped, tt_err *err) {
  tt_ckpt_state *st = &R->st;
  long long start = epoch == st->epoch ? st->images_in_epoch : 0;
  if (tt_loader_start_epoch(R->tl, epoch, (int)(start / ((long long)R->mb * R->ranks))))
    return tt_fail(err, "epoch %d cannot start at image %lld of %d", epoch + 1, start, R->train_ds.n);
  tt_metrics_epoch_begin(e, epoch, st->loss_scale.skipped);
  for (int k = (int)(start / R->batch); k < R->steps_per_epoch && !*stopped; k++) {
    double lr = tt_lr_at(&R->lr_cfg, (double)epoch + (double)k / R->steps_per_epoch);
    if (train_step(R, epoch, k, lr, e, err)) return -1;
    /* besides every log_every steps and the epoch's end: the run's first step and its last
     * (--max-steps), so that every run, however short, reports a loss */
    int regular = st->step % R->log_every == 0 || k == R->steps_per_epoch - 1;
    int at_max = R->o->max_steps > 0 && st->step >= R->o->max_steps;
    if ((regular || st->step == 1 || at_max) && train_log(R, e, k, lr, regular, err)) return -1;
    if (train_after_step(R, epoch, k, stopped, err)) return -1;
    if (*stopped && e->log_images && train_log(R, e, k, lr, 0, err)) return -1; /* a signal: the loss so far */
    { /* the line's loss: the running mean since the last logged interval, read only when the line is
       * drawn (a synchronisation at most 4 times a second) and in one process (no sum over ranks) */
      double running = NAN;
      float f[2];
      if (R->ranks == 1 && e->log_images && tt_metrics_due(&R->mt) && !tt_exec_stats(&R->s->x, f, 0, err))
        running = f[0] / (double)e->log_images;
      tt_metrics_step(&R->mt, e, k, st->step, running);
    }
  }
  return 0;
}

/* End of epoch: evaluate (when there is a test split), report, checkpoint, chart. */
static int train_end_epoch(train_run *R, int epoch, const tt_epoch_meter *e, tt_err *err) {
  if (R->el) {
    double loss, acc;
    /* batch-norm running statistics: rank 0's (PyTorch DDP's rule) */
    if (tt_dist_broadcast_params(&R->s->x, 1, err) || train_evaluate(R->s, R->el, &loss, &acc, err)) return -1;
    R->final_loss = loss, R->final_acc = acc;
    if (R->rank == 0) train_progress(R, 1, epoch, loss, acc, R->hp.lr);
    if (R->rank == 0 && tt_metrics_eval(&R->mt, e, R->st.step, loss, acc, err)) return -1;
  } else if (R->rank == 0 && tt_metrics_epoch(&R->mt, e, R->st.step, err)) {
    return -1;
  }
  R->st.epoch = epoch + 1, R->st.images_in_epoch = 0;
  if (train_save(R, err)) return -1;
  return R->rank ? 0 : tt_metrics_chart(&R->mt, R->dir, R->s->model.name, err);
}

/* A signal stopped the run after its checkpoint: TT_STOPPED, and where to continue. */
static int train_stopped(train_run *R, tt_err *err) {
  if (R->res) R->res->stop_signal = R->stop_signal;
  tt_fail(err, "stopped by %s at step %lld (epoch %d, image %lld); the checkpoint is in %s: continue with: tinytrain --resume %s",
          train_signal_name(R->stop_signal), R->st.step,
          R->st.epoch + 1, R->st.images_in_epoch, R->dir, R->dir);
  return TT_STOPPED;
}

/* Under mpirun: the processes, each one's share of the cores, and only rank 0 speaks. */
static int train_open(train_run *R, tt_err *err) {
  tt_run_opts so = *R->o;
  if (tt_dist_init(err)) return -1;
  R->rank = tt_dist_rank(), R->ranks = tt_dist_size();
  so.ranks = R->ranks;
  if (R->ranks > 1 && !so.threads) so.threads = tt_dist_threads();
  if (R->rank) R->mt.quiet = 1;
  if (tt_session_open(&R->s, &so, TT_SESSION_TRAIN, err) || tt_dist_buckets_create(&R->bk, &R->s->x, err)) return -1;
  R->mb = R->s->sched.policy.micro_batch, R->accum = R->s->sched.policy.accum_steps;
  R->batch = R->mb * R->accum * R->ranks;
  R->s->x.rank = R->rank, R->s->x.ranks = R->ranks; /* dropout masks follow the global micro-batch */
  if (!R->mt.quiet) tt_session_print_summary(R->s, R->mt.out);
  return 0;
}

/* The share of the training time the gradient all-reduce took (waiting for the slowest rank included). */
static void train_dist_summary(train_run *R, double seconds) {
  if (R->ranks <= 1) return;
  double ar = tt_dist_allreduce_seconds(), mib = tt_dist_grad_bytes(R->s->x.train) / 1048576.0;
  if (!strcmp(R->s->be->name, "cuda")) /* the host only queues them: NCCL's time is the device's */
    tt_metrics_say(&R->mt, "dist: %d ranks; %.2f MiB of fp32 gradients all-reduced per step on NCCL's stream\n", R->ranks, mib);
  else
    tt_metrics_say(&R->mt, "dist: %d ranks; %.2f MiB of fp32 gradients all-reduced per step; all-reduce %.2f s of %.2f s "
                   "(%.1f%%) on rank 0\n", R->ranks, mib, ar, seconds, seconds > 0 ? 100.0 * ar / seconds : 0.0);
}

/* The run proper, in order: options, processes, data, schedule, starting state, run
 * directory, then the epochs from where the state stands until the last one, max_steps or a
 * signal. Leaves every resource in R for tt_train to release. Returns 0, TT_STOPPED after a
 * signal (with the checkpoint written), or -1 with err set. */
static int train_body(train_run *R, tt_err *err) {
  const tt_run_opts *o = R->o;
  if (train_check_dir("--out", o->out_dir, err) || train_check_dir("--resume", o->resume_dir, err)) return -1;
  if (train_open(R, err)) return -1;
  if (train_data(R, err) || train_loop_setup(R, err) || train_resume_or_init(R, err) || train_run_dir(R, err)) return -1;
  int stopped = o->max_steps > 0 && R->st.step >= o->max_steps; /* resumed at the limit already: no step */
  if (o->resume_dir && R->st.epoch >= R->epochs)
    tt_metrics_say(&R->mt, "%s: the run is complete (%d epochs, step %lld): nothing to train; to train further, give more "
                   "epochs: tinytrain --resume %s --epochs %d\n", R->dir, R->epochs, R->st.step, R->dir, R->epochs + 1);
  long long step0 = R->st.step, end_step = (long long)R->epochs * R->steps_per_epoch;
  if (o->max_steps > 0 && o->max_steps < end_step) end_step = o->max_steps;
  tt_metrics_start(&R->mt, end_step);
  double t_train = tt_now();
  for (int epoch = R->st.epoch; epoch < R->epochs && !stopped; epoch++) {
    tt_epoch_meter e;
    if (train_epoch(R, epoch, &e, &stopped, err)) return -1;
    if (stopped && R->st.epoch == epoch) break; /* stopped inside the epoch: checkpoint below, no evaluation */
    if (train_end_epoch(R, epoch, &e, err)) return -1;
    int sig = train_stop_requested(); /* during the evaluation: on any rank, then every rank stops */
    if (tt_dist_max(&sig, err)) return -1;
    if (sig && epoch + 1 < R->epochs) R->stop_signal = sig, stopped = 1;
  }
  if (stopped && R->saved_step != R->st.step && train_save(R, err)) return -1;
  if (train_record_pending(R, err)) return -1; /* the run is over: the summary counts the last step too */
  if (R->res) R->res->final_accuracy = R->final_acc, R->res->final_loss = R->final_loss, R->res->steps_done = R->st.step;
  double seconds = tt_now() - t_train;
  /* after any stop (a signal inside the first epoch included), with the steps logged since the last epoch's end */
  if (R->rank == 0 && tt_metrics_chart(&R->mt, R->dir, R->s->model.name, err)) return -1;
  train_dist_summary(R, seconds);
  int bad_train = R->tl ? tt_loader_skipped(R->tl) : 0, bad_test = R->el ? tt_loader_skipped(R->el) : 0;
  if (bad_train || bad_test) /* met while streaming: each warned about once, with its path, when first met */
    tt_metrics_say(&R->mt, "data: %d training and %d test images failed to decode while streaming and were replaced by "
                           "the next image of their set (listed above)\n", bad_train, bad_test);
  tt_metrics_summary(&R->mt, R->dir, &R->st.loss_scale, seconds, R->st.step - step0, (R->st.step - step0) * R->batch);
  return R->stop_signal ? train_stopped(R, err) : 0;
}

/* Trains the recipe of o to the end (see train_body) and fills res (may be NULL; NaN figures
 * when nothing was evaluated). SIGINT and SIGTERM handlers are installed for the call only
 * and only where the disposition was the default. Returns 0, TT_STOPPED, or -1 with the
 * message in errbuf (errsize bytes; may be NULL). */
int tt_train(const tt_run_opts *o, tt_run_result *res, char *errbuf, size_t errsize) {
  tt_err err;
  err.msg[0] = 0;
  train_result_clear(res);
  if (!o) {
    if (errbuf && errsize) snprintf(errbuf, errsize, "tt_train: no options given (tt_run_opts is NULL)");
    return -1;
  }
  train_run R;
  memset(&R, 0, sizeof R);
  R.o = o, R.res = res;
  R.lock_fd = -1;
  R.final_loss = R.final_acc = NAN;
  train_result_clear(res);
  tt_metrics_init(&R.mt, o->out ? o->out : stdout, o->quiet, o->progress);
  train_signals sig;
  train_signals_install(&sig);
  int rc = train_body(&R, &err);
  train_signals_restore(&sig);
  tt_metrics_close(&R.mt);
  if (R.tl) tt_loader_destroy(R.tl);
  if (R.el) tt_loader_destroy(R.el);
  tt_dataset_free(&R.train_ds);
  tt_dataset_free(&R.test_ds);
  tt_dist_buckets_destroy(R.bk);
  if (R.s) tt_session_close(R.s);
  if (R.lock_fd >= 0) close(R.lock_fd); /* releases the lock */
  if (rc && errbuf) snprintf(errbuf, errsize, "%s", err.msg[0] ? err.msg : "unknown error");
  return rc;
}

/* Loads weights into the recipe's evaluation program and reports accuracy and loss on its
 * test split (printed by rank 0 to o->out or stdout, and into res). A test folder's classes
 * are mapped by the class names stored in the weights, so the folder order need not match
 * training's. Returns 0, or -1 with the message in errbuf. */
int tt_evaluate(const tt_run_opts *o, const char *weights, tt_run_result *res, char *errbuf, size_t errsize) {
  tt_err err;
  err.msg[0] = 0;
  tt_session *s = NULL;
  tt_dataset ds;
  memset(&ds, 0, sizeof ds);
  tt_loader *el = NULL;
  int rc = -1;
  if (!o || !weights) {
    if (errbuf && errsize) snprintf(errbuf, errsize, "tt_evaluate: %s", o ? "no weights file given" : "no options given (tt_run_opts is NULL)");
    return -1;
  }
  FILE *out = o->out ? o->out : stdout;
  train_result_clear(res);
  if (tt_dist_init(&err) || tt_session_open(&s, o, TT_SESSION_EVAL, &err)) goto done;
  if (s->model.data.format == TT_DATA_NONE) {
    tt_fail(&err, "%s: has no [data] section with a test split", s->model.path);
    goto done;
  }
  if (tt_checkpoint_load(&s->x, weights, 0, NULL, tt_warn_stderr, NULL, &err)) goto done;
  if (tt_dataset_load(&s->model.data, 0, s->model.in_c, s->model.in_h, s->model.in_w, &ds, &err, tt_warn_stderr, NULL) ||
      tt_dataset_map_classes_from(&ds, weights, &err)) /* a test folder by the weights' class names */
    goto done;
  if (tt_loader_create(&el, &ds, s->sched.eval.policy.micro_batch, 0, 0, 0, 1, 1, &err)) goto done;
  tt_loader_shard(el, tt_dist_rank(), tt_dist_size());
  tt_loader_set_warn(el, tt_warn_stderr, NULL);
  tt_crop crop;
  tt_crop_from_cfg(&s->model.data, 0, &crop);
  tt_loader_set_crop(el, &crop);
  double loss, acc;
  if (train_evaluate(s, el, &loss, &acc, &err)) goto done;
  if (res) res->final_accuracy = acc, res->final_loss = loss;
  if (tt_dist_rank() == 0) fprintf(out, "accuracy %.4f (%.2f%%) loss %.4f on %d test images\n", acc, 100.0 * acc, loss, ds.n);
  rc = 0;
done:
  if (el) tt_loader_destroy(el);
  tt_dataset_free(&ds);
  if (s) tt_session_close(s);
  if (rc && errbuf) snprintf(errbuf, errsize, "%s", err.msg[0] ? err.msg : "unknown error");
  return rc;
}
