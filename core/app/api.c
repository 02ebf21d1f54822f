/* core/app/api.c — the step-level API (tinytrain.h, tt_net_*): a recipe opened for training once,
 * then fed the caller's batches. The optimizer step and the loss scaling are core/runtime/step.c's,
 * the same tt_train runs, so a run through this API is the run of the command line. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/checkpoint.h"
#include "../runtime/finetune.h"
#include "../runtime/session.h"
#include "../runtime/step.h"
#include "../tinytrain.h"
#include "train.h"
#include "api_int.h"

struct tt_net {
  tt_session *s;
  tt_opt_hparams hp;
  tt_loss_scale ls;
  long long step;
  double lr;
  int mb, accum, batch, emb, classes;
  int train;                /* 0: opened for prediction only (no training program) */
  size_t numel;             /* values per sample */
  /* host buffers: a short last micro-batch padded with repeats (allocated at its first use),
   * labels (zeros for predict), the logits */
  uint8_t *pad_u8;
  float *pad_f32, *logits;
  int32_t *pad_lab;
  int most;                 /* samples the padding buffers hold: the larger micro-batch */
  tt_err err;
};

/* Formats the message into n->err (read back by tt_net_error) and returns -1. */
static int net_fail(tt_net *n, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int net_fail(tt_net *n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(n->err.msg, sizeof n->err.msg, fmt, ap);
  va_end(ap);
  return -1;
}

/* The handles open now. A call on a handle that is not among them (NULL, closed, or never
 * returned by tt_net_open) is refused with -1 before anything reads it, and tt_net_error says
 * so; closing one twice is a no-op. Not caught: a closed handle whose address a later
 * tt_net_open happened to return again (it then names that net). A short list under a lock:
 * handles are few, and each call does far more than a scan of them. */
static pthread_mutex_t net_live_lock = PTHREAD_MUTEX_INITIALIZER;
static const tt_net **net_live_list;
static int net_live_n, net_live_cap;

/* Index of n in the live list, or -1; the caller holds net_live_lock. */
static int net_live_find(const tt_net *n) {
  for (int k = 0; k < net_live_n; k++)
    if (net_live_list[k] == n) return k;
  return -1;
}

/* Whether n is an open handle (NULL is not); takes the lock for the scan only. */
static int net_live(const tt_net *n) {
  if (!n) return 0;
  pthread_mutex_lock(&net_live_lock);
  int k = net_live_find(n);
  pthread_mutex_unlock(&net_live_lock);
  return k >= 0;
}

/* add (1) or remove (0) n; adding returns -1 when out of memory */
static int net_live_set(const tt_net *n, int add) {
  int rc = 0;
  pthread_mutex_lock(&net_live_lock);
  int k = net_live_find(n);
  if (add && k < 0) {
    if (net_live_n == net_live_cap) {
      int cap = net_live_cap ? 2 * net_live_cap : 8;
      const tt_net **l = (const tt_net **)realloc((void *)net_live_list, sizeof(*l) * (size_t)cap);
      if (l) net_live_list = l, net_live_cap = cap;
    }
    if (net_live_n < net_live_cap) net_live_list[net_live_n++] = n;
    else rc = -1;
  } else if (!add && k >= 0) {
    net_live_list[k] = net_live_list[--net_live_n];
    if (!net_live_n) free((void *)net_live_list), net_live_list = NULL, net_live_cap = 0;
  }
  pthread_mutex_unlock(&net_live_lock);
  return rc;
}

#define NET_ENTER(n) do { if (!net_live(n)) return -1; } while (0)

/* The largest learning rate tt_net_set_lr takes: beyond it a step only overflows the weights. */
#define NET_MAX_LR 1e3

/* -1 with a message when one of count * numel floats is NaN or infinite */
static int net_check_finite(tt_net *n, const float *f, int count, const char *what) {
  size_t total = (size_t)count * n->numel;
  for (size_t k = 0; k < total; k++)
    if (!isfinite(f[k]))
      return net_fail(n, "%s: value %zu of sample %zu is %g; images must be finite", what, k % n->numel, k / n->numel,
                      (double)f[k]);
  return 0;
}

/* The buffers every net needs from the start: the label padding (for the larger of the
 * training and evaluation micro-batches) and one evaluation micro-batch of logits
 * [emb, classes]. The image padding is allocated later, only if a short batch comes. */
static int net_alloc(tt_net *n, tt_err *err) {
  n->most = n->mb > n->emb ? n->mb : n->emb;
  n->pad_lab = (int32_t *)tt_calloc((size_t)n->most, sizeof(int32_t), "padded labels", err);
  n->logits = (float *)tt_malloc(tt_size_mul((size_t)n->emb, (size_t)n->classes * sizeof(float)), "logits", err);
  return n->pad_lab && n->logits ? 0 : -1;
}

/* Closes the session and frees the buffers and n; NULL is a no-op. Does not touch the live
 * list: tt_net_close removes n from it first. */
static void net_free(tt_net *n) {
  if (!n) return;
  if (n->s) tt_session_close(n->s);
  free(n->pad_u8), free(n->pad_f32), free(n->pad_lab), free(n->logits);
  free(n);
}

/* Opens for training (see tt_net_open_mode). */
int tt_net_open(tt_net **out, const tt_run_opts *o, char *errbuf, size_t errsize) {
  return tt_net_open_mode(out, o, 1, errbuf, errsize);
}

/* The recipe's [data] settings, owned by the net; valid until tt_net_close. */
const tt_data_cfg *tt_net_data_cfg(const tt_net *net) { return &net->s->model.data; }

/* Opens the recipe of o as a session (train: with the training program, else evaluation
 * only), initialises the parameters from the recipe's seed and registers the handle. On
 * success *out owns everything (tt_net_close); on failure *out is NULL, everything is freed
 * and errbuf (errsize bytes, may be NULL) holds the message. */
int tt_net_open_mode(tt_net **out, const tt_run_opts *o, int train, char *errbuf, size_t errsize) {
  tt_err err;
  err.msg[0] = 0;
  tt_net *n = NULL;
  if (!out || !o) {
    tt_fail(&err, "tt_net_open: %s is NULL", out ? "the options (o)" : "out");
    goto fail;
  }
  *out = NULL;
  n = (tt_net *)tt_calloc(1, sizeof(tt_net), "tt_net", &err);
  if (!n) goto fail;
  if (tt_session_open(&n->s, o, train ? TT_SESSION_TRAIN : TT_SESSION_EVAL, &err)) goto fail;
  {
    const tt_session *s = n->s;
    n->mb = s->sched.policy.micro_batch, n->accum = s->sched.policy.accum_steps, n->batch = n->mb * n->accum;
    n->train = train;
    n->emb = s->sched.eval.policy.micro_batch, n->classes = s->model.classes;
    n->numel = (size_t)s->model.in_c * s->model.in_h * s->model.in_w;
    tt_step_hparams(&s->model.train, &n->hp);
    n->lr = s->model.train.lr;
    tt_loss_scale_init(&n->ls, s->sched.policy.act_dtype == TT_F16);
  }
  if (net_alloc(n, &err) || tt_exec_init_params(&n->s->x, n->s->model.train.seed, &err)) goto fail;
  if (net_live_set(n, 1)) {
    tt_fail(&err, "out of memory for the list of open nets");
    goto fail;
  }
  *out = n;
  return 0;
fail:
  if (errbuf && errsize) snprintf(errbuf, errsize, "%s", err.msg[0] ? err.msg : "unknown error");
  net_free(n);
  return -1;
}

/* Frees an open net; a NULL, closed or unknown handle is ignored. */
void tt_net_close(tt_net *n) {
  if (!net_live(n)) return; /* NULL, or closed already */
  net_live_set(n, 0);
  net_free(n);
}

/* The last failure's message of n (valid until the next call on n), or a fixed string
 * saying why n is not a usable handle. */
const char *tt_net_error(const tt_net *n) {
  if (!n) return "no tt_net: the handle is NULL (did tt_net_open fail? its err says why)";
  if (!net_live(n)) return "not an open tt_net: the handle was closed, or never returned by tt_net_open";
  return n->err.msg;
}

/* Fills *i with the plan and shape of n; all zero when n is not open. The strings point into
 * the net and live as long as it. */
void tt_net_info_get(const tt_net *n, tt_net_info *i) {
  if (!i) return;
  memset(i, 0, sizeof *i);
  if (!net_live(n)) return;
  const tt_session *s = n->s;
  i->arena_bytes = s->x.arena_bytes;
  i->micro_batch = n->mb, i->accum_steps = n->accum, i->batch = n->batch, i->eval_batch = n->emb;
  i->fp16 = s->sched.policy.act_dtype == TT_F16;
  i->precision = tt_dtype_name(s->sched.policy.act_dtype);
  i->classes = n->classes, i->channels = s->model.in_c, i->height = s->model.in_h, i->width = s->model.in_w;
  i->steps = n->step, i->lr = n->lr;
  i->device = s->be->name, i->name = s->model.name;
}

/* Samples [from, from + cnt) of the caller's batch as one full micro-batch of `full`: the
 * caller's memory itself when cnt == full (labels absent: zeros), else copied and padded by
 * repeating them. */
static int net_chunk(tt_net *n, const uint8_t *u8, const float *f32, const int32_t *lab, int from, int cnt, int full,
                     const uint8_t **cu8, const float **cf32, const int32_t **clab) {
  size_t v = n->numel;
  *cu8 = u8 ? u8 + (size_t)from * v : NULL;
  *cf32 = f32 ? f32 + (size_t)from * v : NULL;
  *clab = lab ? lab + from : n->pad_lab;
  if (cnt == full) {
    if (!lab) memset(n->pad_lab, 0, sizeof(int32_t) * (size_t)full);
    return 0;
  }
  if (u8 && !n->pad_u8 &&
      !(n->pad_u8 = (uint8_t *)tt_malloc(tt_size_mul((size_t)n->most, v), "padded batch", &n->err)))
    return -1;
  if (f32 && !n->pad_f32 &&
      !(n->pad_f32 = (float *)tt_malloc(tt_size_mul((size_t)n->most, v * sizeof(float)), "padded batch", &n->err)))
    return -1;
  for (int k = 0; k < full; k++) {
    int src = from + k % cnt;
    if (u8) memcpy(n->pad_u8 + (size_t)k * v, u8 + (size_t)src * v, v);
    if (f32) memcpy(n->pad_f32 + (size_t)k * v, f32 + (size_t)src * v, v * sizeof(float));
    n->pad_lab[k] = lab ? lab[src] : 0;
  }
  if (u8) *cu8 = n->pad_u8;
  if (f32) *cf32 = n->pad_f32;
  *clab = n->pad_lab;
  return 0;
}

/* -1 with a message naming the first label outside [0, classes); 0 when all are valid. */
static int net_check_labels(tt_net *n, const int32_t *labels, int count) {
  for (int k = 0; k < count; k++)
    if (labels[k] < 0 || labels[k] >= n->classes)
      return net_fail(n, "label %d of sample %d is outside [0, %d) set by [net] classes", labels[k], k, n->classes);
  return 0;
}

/* One optimizer step over count samples (1 .. batch), u8 or f32 images [count, c, h, w] and
 * their labels: micro-steps of mb samples (the last one padded), then the update at the
 * current lr. The gradient scale is loss scale / count, so the update sees the mean over the
 * caller's real samples, not over the padding. *out (may be NULL) gets the step's mean loss
 * and accuracy and the counters. 0, or -1 with the message in n->err. */
static int net_train(tt_net *n, const uint8_t *u8, const float *f32, const int32_t *labels, int count,
                     tt_step_stats *out) {
  NET_ENTER(n);
  if (!n->train) return net_fail(n, "train_step: this net was opened for prediction only");
  if (!(u8 || f32) || !labels) return net_fail(n, "train_step: images and labels are required");
  if (count < 1 || count > n->batch)
    return net_fail(n, "train_step: %d samples; the plan takes 1 to %d (micro-batch %d x %d accumulation); split the "
                    "batch or open with a larger budget", count, n->batch, n->mb, n->accum);
  if (net_check_labels(n, labels, count)) return -1;
  if (f32 && net_check_finite(n, f32, count, "train_step_f32")) return -1;
  tt_exec *x = &n->s->x;
  float used = n->ls.scale; /* the scale this step's gradients carry */
  float gscale = used / (float)count;
  float sv[2];
  if (tt_exec_stats(x, NULL, 1, &n->err)) return -1;
  for (int a = 0; a * n->mb < count; a++) {
    int cnt = count - a * n->mb < n->mb ? count - a * n->mb : n->mb;
    const uint8_t *cu8;
    const float *cf32;
    const int32_t *clab;
    if (net_chunk(n, u8, f32, labels, a * n->mb, cnt, n->mb, &cu8, &cf32, &clab) ||
        tt_exec_micro_step_n(x, 1, cu8, cf32, clab, cnt, a, (uint64_t)n->step, gscale, &n->err)) return -1;
  }
  /* the loss before the update: a non-finite one (inputs of 1e38, a learning rate that diverged)
   * would put NaN into every weight, so the step stops there and the net keeps its weights */
  if (tt_exec_stats(x, sv, 1, &n->err)) return -1;
  if (!isfinite(sv[0]))
    return net_fail(n, "train_step: the loss is %g: this step updated nothing; the net diverged (its inputs or learning "
                    "rate): load weights saved before (tt_net_load) and lower the rate or the inputs' range", (double)sv[0]);
  if (tt_step_update(x, &n->hp, &n->ls, n->step, n->lr, used, &n->err)) return -1;
  n->step++;
  /* and the update's result: a finite loss can still carry gradients that overflow (inputs of
   * 1e38) and leave NaN or infinite weights, which no later call should take for a net */
  int finite = 1;
  if (tt_exec_params_finite(x, &finite, &n->err)) return -1;
  if (!finite)
    return net_fail(n, "train_step: the update made the weights non-finite (NaN or infinite): the net diverged; load "
                    "weights saved before (tt_net_load) and lower the learning rate or the inputs' range");
  if (out) {
    out->loss = sv[0] / (double)count, out->accuracy = sv[1] / (double)count;
    out->step = n->step, out->skipped = n->ls.skipped;
  }
  return 0;
}

/* uint8 images, normalised on the device as the recipe's [data] mean and std say. */
int tt_net_train_step(tt_net *n, const uint8_t *images, const int32_t *labels, int count, tt_step_stats *st) {
  return net_train(n, images, NULL, labels, count, st);
}

/* fp32 images, already normalised by the caller: used as given (checked finite). */
int tt_net_train_step_f32(tt_net *n, const float *images, const int32_t *labels, int count, tt_step_stats *st) {
  return net_train(n, NULL, images, labels, count, st);
}

/* The k largest of p[0..classes) into cls/pr, best first (ties: the lower class). */
/* O(k x classes x k); k is small (top-5) and classes a few thousand at most. */
static void net_topk(const float *p, int classes, int k, int32_t *cls, float *pr) {
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int c = 0; c < classes; c++) {
      int taken = 0;
      for (int q = 0; q < j && !taken; q++) taken = cls[q] == c;
      if (!taken && (best < 0 || p[c] > p[best])) best = c;
    }
    cls[j] = best;
    if (pr) pr[j] = p[best];
  }
}

/* Forward passes over count samples: with labels, adds to the loss statistics; with probs or
 * classes, the softmax of each sample (all of it, or its top k). */
static int net_forward(tt_net *n, const uint8_t *u8, const float *f32, const int32_t *labels, int count, float *probs,
                       int k, int32_t *classes, float *kprobs) {
  if (!(u8 || f32)) return net_fail(n, "no images given");
  if (count < 0) return net_fail(n, "a negative count of samples (%d)", count);
  if (labels && net_check_labels(n, labels, count)) return -1;
  if (f32 && net_check_finite(n, f32, count, "predict_f32")) return -1;
  int C = n->classes;
  for (int from = 0; from < count; from += n->emb) {
    int cnt = count - from < n->emb ? count - from : n->emb;
    const uint8_t *cu8;
    const float *cf32;
    const int32_t *clab;
    if (net_chunk(n, u8, f32, labels, from, cnt, n->emb, &cu8, &cf32, &clab) ||
        tt_exec_micro_step_n(&n->s->x, 0, cu8, cf32, clab, cnt, 0, 0, 0.0f, &n->err)) return -1;
    if (!probs && !classes) continue;
    if (tt_exec_logits(&n->s->x, cnt, n->logits, &n->err)) return -1;
    for (int i = 0; i < cnt; i++) {
      float *l = n->logits + (size_t)i * C, mx = l[0];
      double sum = 0.0;
      for (int c = 1; c < C; c++) mx = l[c] > mx ? l[c] : mx;
      for (int c = 0; c < C; c++) sum += (l[c] = expf(l[c] - mx));
      for (int c = 0; c < C; c++) l[c] = (float)(l[c] / sum);
      if (probs) memcpy(probs + (size_t)(from + i) * C, l, (size_t)C * sizeof(float));
      if (classes) net_topk(l, C, k, classes + (size_t)(from + i) * k, kprobs ? kprobs + (size_t)(from + i) * k : NULL);
    }
  }
  return 0;
}

/* probs: [count, classes] softmax probabilities, one row per image, written by the caller's
 * allocation. 0, or -1 with the message in tt_net_error. */
int tt_net_predict(tt_net *n, const uint8_t *images, int count, float *probs) {
  NET_ENTER(n);
  if (!probs) return net_fail(n, "predict: probs is NULL");
  return net_forward(n, images, NULL, NULL, count, probs, 0, NULL, NULL);
}

int tt_net_predict_f32(tt_net *n, const float *images, int count, float *probs) {
  NET_ENTER(n);
  if (!probs) return net_fail(n, "predict: probs is NULL");
  return net_forward(n, NULL, images, NULL, count, probs, 0, NULL, NULL);
}

/* classes: [count, k] class indices, best first; probs (may be NULL): their probabilities. */
int tt_net_topk(tt_net *n, const uint8_t *images, int count, int k, int32_t *classes, float *probs) {
  NET_ENTER(n);
  if (!classes) return net_fail(n, "topk: classes is NULL");
  if (k < 1 || k > n->classes) return net_fail(n, "topk: k = %d; the model has %d classes", k, n->classes);
  return net_forward(n, images, NULL, NULL, count, NULL, k, classes, probs);
}

/* Mean loss and accuracy over count labelled images, in evaluation mode (no dropout, batch
 * norm running statistics); loss and acc may be NULL; both 0 for count 0. */
int tt_net_evaluate(tt_net *n, const uint8_t *images, const int32_t *labels, int count, double *loss, double *acc) {
  float sv[2];
  NET_ENTER(n);
  if (!labels) return net_fail(n, "evaluate: labels are required");
  if (tt_exec_stats(&n->s->x, NULL, 1, &n->err) || net_forward(n, images, NULL, labels, count, NULL, 0, NULL, NULL) ||
      tt_exec_stats(&n->s->x, sv, 1, &n->err))
    return -1;
  if (loss) *loss = count ? sv[0] / (double)count : 0.0;
  if (acc) *acc = count ? sv[1] / (double)count : 0.0;
  return 0;
}

/* The rate the next train steps use, in [0, NET_MAX_LR]; the caller owns the schedule (see
 * tt_net_lr_at for the recipe's). */
int tt_net_set_lr(tt_net *n, double lr) {
  NET_ENTER(n);
  if (!(lr >= 0.0 && lr <= NET_MAX_LR))
    return net_fail(n, "set_lr: the learning rate must be in [0, %g], not %g", NET_MAX_LR, lr);
  n->lr = lr;
  return 0;
}

/* The recipe's scheduled learning rate at a fractional epoch; NaN for a bad handle or epoch. */
double tt_net_lr_at(const tt_net *n, double epoch) {
  if (!net_live(n) || !isfinite(epoch)) return NAN;
  return tt_lr_at(&n->s->model.train, epoch);
}

/* Writes the weights (no optimizer state) as safetensors at path, atomically. */
int tt_net_save(tt_net *n, const char *path) {
  NET_ENTER(n);
  if (!path) return net_fail(n, "save: no path");
  return tt_checkpoint_save_weights(&n->s->x, path, NULL, &n->err);
}

/* Loads weights saved by tt_net_save (or a checkpoint's weights file); names and shapes must
 * all match. The optimizer state and step counter are left as they are. */
int tt_net_load(tt_net *n, const char *path) {
  NET_ENTER(n);
  if (!path) return net_fail(n, "load: no path");
  return tt_checkpoint_load(&n->s->x, path, 0, NULL, tt_warn_stderr, NULL, &n->err);
}

/* Loads what matches by name and shape (fine-tuning) and copies the report, truncated to
 * reportsize, into report (may be NULL). */
int tt_net_load_matching(tt_net *n, const char *path, char *report, size_t reportsize) {
  tt_strbuf rep;
  NET_ENTER(n);
  if (!path) return net_fail(n, "load_matching: no path");
  memset(&rep, 0, sizeof rep);
  int rc = tt_finetune_load(&n->s->x, path, &rep, NULL, &n->err);
  if (!rc && report && reportsize) snprintf(report, reportsize, "%s", rep.p);
  free(rep.p);
  return rc;
}
