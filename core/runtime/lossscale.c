/* core/runtime/lossscale.c — the dynamic loss scale (the rules are in lossscale.h). */
#include "lossscale.h"

/* Enabled (fp16 autocast): scale 2^16, growth every 2000 clean steps. Disabled: scale 1 and
 * growth_interval 0, which tt_loss_scale_record reads as "never scale, never skip". */
void tt_loss_scale_init(tt_loss_scale *s, int enabled) {
  /* 2^16 and 2000 steps: the usual AMP defaults; fp32 runs keep scale 1 and never change it */
  s->scale = enabled ? 65536.0f : 1.0f;
  s->clean_steps = 0;
  s->growth_interval = enabled ? 2000 : 0;
  s->skipped = 0;
  s->pending = 0, s->pending_overflow = -1, s->pending_scale = s->scale;
}

/* Records one effective batch's outcome, run at scale_used. Returns 1 when it overflowed (its
 * update was skipped and counted in skipped), else 0. The scale stays within [1, 2^24]: the
 * range checkpoint.c accepts when reading it back. */
int tt_loss_scale_record(tt_loss_scale *s, int overflow, float scale_used) {
  if (s->growth_interval == 0) return 0; /* fp32: no scaling, a NaN step is not skipped */
  if (overflow) {
    /* half of the scale the step ran with, not of the current one: the step after an overflow
     * was queued at the old scale, and two overflows at one scale must halve it once */
    float half = scale_used > 1.0f ? scale_used * 0.5f : 1.0f;
    if (half < s->scale) s->scale = half;
    s->clean_steps = 0;
    s->skipped++;
    return 1;
  }
  if (++s->clean_steps >= s->growth_interval) {
    /* fp16 gradients overflow past 65504, so a scale above 2^24 is never useful */
    if (s->scale < 16777216.0f) s->scale *= 2.0f;
    s->clean_steps = 0;
  }
  return 0;
}

/* The synchronous rule: the outcome of a step run at the current scale. */
int tt_loss_scale_update(tt_loss_scale *s, int overflow) { return tt_loss_scale_record(s, overflow, s->scale); }
