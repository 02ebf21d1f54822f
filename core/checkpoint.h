/* core/checkpoint.h — weights.safetensors and state.safetensors (see checkpoint.c). */
#ifndef TT_CHECKPOINT_H
#define TT_CHECKPOINT_H
#include "exec.h"
#include "lossscale.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_ckpt_state {
  long long step;          /* optimizer steps done */
  int epoch;               /* epoch in progress (0-based) */
  /* Training images of that epoch already consumed: a whole number of effective batches.
   * Counted in images, not micro-batches, so that a run resumed under another policy (another
   * --vram, hence another micro-batch) continues at the same image of the epoch. */
  long long images_in_epoch;
  tt_loss_scale loss_scale;
  unsigned long long seed;
  int micro_batch, accum_steps;
} tt_ckpt_state;

/* Writes dir/weights.safetensors and dir/state.safetensors, each atomically. */
int tt_checkpoint_save(tt_exec *x, const char *dir, const tt_ckpt_state *st, tt_err *err);
/* Loads parameters (and with_state: optimizer state and counters) from a file. Every tensor
 * is checked before anything is changed; a missing or mismatched tensor is an error naming it.
 * Older state files that count the position in micro-batches ('batch_in_epoch') are read and
 * converted. */
int tt_checkpoint_load(tt_exec *x, const char *file, int with_state, tt_ckpt_state *st, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
