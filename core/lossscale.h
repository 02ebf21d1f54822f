/* core/lossscale.h — dynamic loss scaling for fp16 autocast, decided once per effective batch:
 * start at 65536; after `growth_interval` (2000) consecutive clean steps double; on inf/NaN
 * halve and skip the update (never below 1). Plain data so it checkpoints as is. */
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
} tt_loss_scale;

void tt_loss_scale_init(tt_loss_scale *s, int enabled); /* disabled: scale 1, never changes */
/* Records the outcome of one effective batch; returns 1 if the update must be skipped. */
int tt_loss_scale_update(tt_loss_scale *s, int overflow);

#ifdef __cplusplus
}
#endif
#endif
