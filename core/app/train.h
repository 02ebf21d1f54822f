/* core/app/train.h — the parts of the train stage that tests check on their own; tt_train and
 * tt_evaluate themselves are public (tinytrain.h). */
#ifndef TT_TRAIN_H
#define TT_TRAIN_H
#include "../data/data.h"
#include "../runtime/exec.h"
#include "../runtime/lossscale.h"
#include "../compile/model.h"

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

#ifdef __cplusplus
}
#endif
#endif
