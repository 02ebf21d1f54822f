/* core/train.h — the parts of the train stage that tests check on their own; tt_train and
 * tt_evaluate themselves are public (tinytrain.h). */
#ifndef TT_TRAIN_H
#define TT_TRAIN_H
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The learning rate at a fractional epoch: linear warm-up from lr/100 over warmup_epochs, then
 * the recipe's schedule: constant, step (times gamma every step_epochs) or cosine down to
 * min_lr at t->epochs. */
double tt_lr_at(const tt_train_cfg *t, double epoch);

#ifdef __cplusplus
}
#endif
#endif
