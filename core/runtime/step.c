/* core/runtime/step.c — one optimizer step and one evaluation pass (step.h). */
#include <string.h>

#include "step.h"

/* Copies the optimizer's settings from the recipe into hp (zeroed first, so fields the
 * recipe does not set are 0). hp->lr starts at the base rate; tt_step_update overwrites it
 * with the scheduled rate of each step. */
void tt_step_hparams(const tt_train_cfg *tc, tt_opt_hparams *hp) {
  memset(hp, 0, sizeof *hp);
  hp->kind = tc->optimizer, hp->momentum = tc->momentum, hp->weight_decay = tc->weight_decay, hp->beta1 = tc->beta1;
  hp->beta2 = tc->beta2, hp->eps = tc->adam_eps, hp->nesterov = tc->nesterov;
  hp->lr = tc->lr;
  hp->clip_norm = tc->clip_norm;
}

/* Does nothing when no outcome is pending. Otherwise uses the outcome restored from a
 * checkpoint when there is one (pending_overflow 0 or 1), else reads the device's flag
 * (a synchronisation), records it at the scale that step ran with, and clears pending.
 * Returns 0, or -1 when the read-back fails. */
int tt_step_settle(tt_exec *x, tt_loss_scale *ls, tt_err *err) {
  int of = ls->pending_overflow;
  if (!ls->pending) return 0;
  if (of < 0 && tt_exec_overflow(x, &of, err)) return -1;
  tt_loss_scale_record(ls, of, ls->pending_scale);
  ls->pending = 0, ls->pending_overflow = -1;
  return 0;
}

/* Issues the optimizer update (gradients unscaled by 1 / used) with Adam's counter t = the
 * applied updates so far + 1, which is exact because the previous outcome is settled first.
 * When loss scaling is on, this step's outcome is left pending for the next call. 0 or -1. */
int tt_step_update(tt_exec *x, tt_opt_hparams *hp, tt_loss_scale *ls, long long step, double lr, float used,
                    tt_err *err) {
  hp->lr = (float)lr;
  if (tt_step_settle(x, ls, err)) return -1; /* every earlier outcome known: Adam's t is exact */
  if (tt_exec_update(x, hp, (int)(step - ls->skipped) + 1, 1.0f / used, NULL, err)) return -1;
  /* this step's overflow flag stays on the device; the next update (or a checkpoint) reads it */
  if (ls->growth_interval) ls->pending = 1, ls->pending_overflow = -1, ls->pending_scale = used;
  return 0;
}

/* Runs the evaluation program over one epoch of ld from its start and returns the mean loss
 * and accuracy over *count images (0 for both when the loader yields none). Each batch is
 * released back to the loader as soon as tt_exec_eval has taken it. Returns 0, or -1 with the loader's or
 * the executor's error. */
int tt_step_eval_pass(tt_exec *x, tt_loader *ld, double *loss, double *acc, long long *count, tt_err *err) {
  float st[2];
  /* the evaluation program sums loss and correct counts on the device: reset the sums, run
   * every batch, then read them back once (one host-device synchronisation per pass) */
  if (tt_exec_stats(x, NULL, 1, err)) return -1;
  tt_loader_start_epoch(ld, 0, 0);
  long long n = 0;
  for (;;) {
    const uint8_t *img;
    const int32_t *lab;
    int cnt;
    double w;
    int r = tt_loader_next(ld, &img, &lab, &cnt, &w);
    if (r == 1) break;
    if (r < 0) return tt_loader_error(ld)[0] ? tt_fail(err, "%s", tt_loader_error(ld)) : tt_fail(err, "the test-data loader failed");
    int rc = tt_exec_eval(x, img, lab, cnt, err);
    tt_loader_release(ld);
    if (rc) return -1;
    n += cnt;
  }
  if (tt_exec_stats(x, st, 1, err)) return -1;
  *loss = n ? st[0] / (double)n : 0.0;
  *acc = n ? st[1] / (double)n : 0.0;
  if (count) *count = n;
  return 0;
}
