/* core/train.h — the parts of the train stage that tests check on their own; tt_train and
 * tt_evaluate themselves are public (tinytrain.h). */
#ifndef TT_TRAIN_H
#define TT_TRAIN_H
#include "data.h"
#include "exec.h"
#include "lossscale.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The learning rate at a fractional epoch: linear warm-up from lr/100 over warmup_epochs, then
 * the recipe's schedule: constant, step (times gamma every step_epochs) or cosine down to
 * min_lr at t->epochs. */
double tt_lr_at(const tt_train_cfg *t, double epoch);

/* Whether checkpoint_every asks for a checkpoint after optimizer step `step`: every_steps > 0
 * counts steps; otherwise every_seconds > 0 counts the wall time since the last checkpoint;
 * both 0 never (the ends of epochs and stops still write theirs). */
int tt_train_checkpoint_due(long long every_steps, double every_seconds, long long step, double seconds_since);

/* ---- shared by tt_train and the step-level API (core/step.c) ---- */

/* The optimizer settings of the recipe's [train] (lr its base rate). */
void tt_train_hparams(const tt_train_cfg *tc, tt_opt_hparams *hp);
/* Records the last step's overflow outcome in the loss scaler (the host learns of it one step
 * late; the update itself was skipped on the device). */
int tt_train_settle(tt_exec *x, tt_loss_scale *ls, tt_err *err);
/* The update that ends optimizer step `step` (0-based, the steps done before it) at rate lr,
 * after micro-steps whose gradients carry the loss scale `used`. */
int tt_train_update(tt_exec *x, tt_opt_hparams *hp, tt_loss_scale *ls, long long step, double lr, float used,
                    tt_err *err);
/* Evaluates every batch of ld (an evaluation loader): mean loss and accuracy, and the count. */
int tt_train_eval_pass(tt_exec *x, tt_loader *ld, double *loss, double *acc, long long *count, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
