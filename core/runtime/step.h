/* core/runtime/step.h — what one optimizer step and one evaluation pass are, shared by the
 * recipe-driven run (core/app/train.c) and the step-level C API (core/app/api.c), so that both
 * train alike. An optimizer step is the update that ends k micro-steps (k = the policy's
 * accumulation steps); the fp16 overflow outcome of a step reaches the host one step late. */
#ifndef TT_STEP_H
#define TT_STEP_H
#include "../compile/model.h"
#include "../data/data.h"
#include "exec.h"
#include "lossscale.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The optimizer settings of the recipe's [train] (lr its base rate). */
void tt_step_hparams(const tt_train_cfg *tc, tt_opt_hparams *hp);
/* Records the last step's overflow outcome in the loss scaler (the host learns of it one step
 * late; the update itself was skipped on the device). */
int tt_step_settle(tt_exec *x, tt_loss_scale *ls, tt_err *err);
/* The update that ends optimizer step `step` (0-based, the steps done before it) at rate lr,
 * after micro-steps whose gradients carry the loss scale `used`. */
int tt_step_update(tt_exec *x, tt_opt_hparams *hp, tt_loss_scale *ls, long long step, double lr, float used,
                   tt_err *err);
/* Evaluates every batch of ld (an evaluation loader): mean loss and accuracy, and the count. */
int tt_step_eval_pass(tt_exec *x, tt_loader *ld, double *loss, double *acc, long long *count, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
