/* core/runtime/lossscale.h — dynamic loss scaling for fp16 autocast, decided once per effective batch:
 * start at 65536; after `growth_interval` (2000) consecutive clean steps double; on inf/NaN
 * halve and skip the update (never below 1). Plain data so it checkpoints as is.
 *
 * The host learns of an overflow one step late, and the update is skipped all the same. A
 * training step's update kernels read the overflow flag on the device, so an overflowing step
 * changes no parameter, momentum or Adam moment wherever it runs, with no host-device
 * synchronisation. The flag is read back asynchronously and recorded (tt_loss_scale_record)
 * just before the *next* step's update is issued, after that step's micro-steps were queued:
 *   - the step after an overflow still runs at the old scale (its micro-steps were queued
 *     before the host knew); if it overflows too it is skipped as well;
 *   - an overflowing step sets the scale to half the scale *it ran with*, or leaves a lower
 *     current scale alone, so two steps that overflowed at the same scale halve it once;
 *   - Adam's step counter t (applied updates + 1) is exact: every earlier step's outcome is
 *     known when an update is issued, and a skipped update does not use its own t;
 *   - the outcome not yet recorded (pending) is part of the checkpoint, so a resumed run makes
 *     the same decisions as the run that was not interrupted.
 * With scale_used equal to the current scale (a caller that waits for the flag) this is
 * exactly the synchronous rule: tt_loss_scale_update. */
#ifndef TT_LOSSSCALE_H
#define TT_LOSSSCALE_H
#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_loss_scale {
  float scale;
  int clean_steps;      /* consecutive steps without overflow since the last change */
  int growth_interval;
  long long skipped;    /* total skipped updates */
  /* the last step, whose outcome is not recorded yet: pending 0 none, 1 one; its flag is on the
   * device (pending_overflow -1) or known (0 or 1, read at a checkpoint); the scale it ran with */
  int pending, pending_overflow;
  float pending_scale;
} tt_loss_scale;

void tt_loss_scale_init(tt_loss_scale *s, int enabled); /* disabled: scale 1, never changes */
/* Records the outcome of one effective batch run at the current scale; returns 1 if its update
 * is skipped. */
int tt_loss_scale_update(tt_loss_scale *s, int overflow);
/* Records the outcome of an effective batch that ran at scale_used (the rule above). */
int tt_loss_scale_record(tt_loss_scale *s, int overflow, float scale_used);

#ifdef __cplusplus
}
#endif
#endif
