/* core/runtime/checkpoint.h — weights.safetensors and state.safetensors (see checkpoint.c). */
#ifndef TT_CHECKPOINT_H
#define TT_CHECKPOINT_H
#include "exec.h"
#include "lossscale.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ranges a state file's counters must lie in (the recipe allows at most 1000000 epochs). */
#define CKPT_STEPS_MAX 1000000000000LL /* 10^12 optimizer steps */
#define CKPT_EPOCHS_MAX 1000000LL
#define CKPT_IMAGES_MAX 2147483647LL   /* images into one epoch */
/* tt_checkpoint_save's status when a tensor holds NaN or an infinity: nothing was written, the
 * checkpoint already on disk (the last good one) stays as it was. */
#define TT_CKPT_NOT_FINITE (-3)

typedef struct tt_ckpt_state {
  long long step;            /* optimizer steps done */
  int epoch;                 /* epoch in progress (0-based) */
  /* Training images of that epoch already consumed: a whole number of effective batches.
   * Counted in images, not micro-batches, so that a run resumed under another policy (another
   * --vram, hence another micro-batch) continues at the same image of the epoch. It may equal
   * the epoch's size: the steps are done and only the epoch's evaluation is left (a stop by a
   * signal on the last step). */
  long long images_in_epoch;
  tt_loss_scale loss_scale;
  unsigned long long seed;
  int micro_batch, accum_steps; /* the policy that wrote it (their product is the recipe's batch) */
  char optimizer[16];        /* [train] optimizer ("sgd", "adam", "adamw"); "" when a state file has none (older) */
  /* The run's class names (the training set's; not owned): saved in both files' metadata under
   * TT_META_CLASSES. On loading a state file, when set and the file has names too, they must
   * be the same (an error naming the first difference); loading leaves these two fields. */
  const char *const *classes;
  int nclasses;
} tt_ckpt_state;

/* The host staging buffer a checkpoint write takes (bytes): its tensors pass one at a time, so
 * the largest tensor of the file as its program p (the one owning the parameters' buffers) holds
 * it, fp32 values or optimizer state in its format (int8 codes and scales together, rounded up
 * to 4). with_state: the state file's tensors (needs the training program), else the weights
 * file's. `plan` counts it; the write allocates exactly this much once per file. */
size_t tt_checkpoint_staging_bytes(const tt_program *p, const tt_graph *g, int with_state);
/* Writes dir/state.safetensors and then dir/weights.safetensors, each atomically (a temporary
 * file renamed over the old one), streamed tensor by tensor through one staging buffer of
 * tt_checkpoint_staging_bytes. A NaN or infinity in any tensor discards the temporary file before
 * the rename: TT_CKPT_NOT_FINITE, the files on disk untouched. */
int tt_checkpoint_save(tt_exec *x, const char *dir, const tt_ckpt_state *st, tt_err *err);
/* Writes the weights alone to path (atomically), with metadata meta (key, value, ..., NULL;
 * NULL: format = tinytrain and the recipe's name). */
int tt_checkpoint_save_weights(tt_exec *x, const char *path, const char *const *meta, tt_err *err);
/* Loads parameters (and with_state: optimizer state and counters into st) from a file, read a
 * tensor at a time (the header first: tt_st_open_lazy), so the host holds one tensor. The
 * counters are checked first (each present, an integer, in its range: a message names the file
 * and the key), then every tensor (a missing or mismatched one is an error naming it); nothing
 * is changed before all of it passed. A state file whose Adam second moment (.opt_v) holds a
 * negative value is refused, naming the tensor. NaN or infinite values are loaded, with one warning
 * through warn (may be NULL) naming the file and the first such tensor. Older state files
 * that count the position in micro-batches ('batch_in_epoch') are read and converted. */
int tt_checkpoint_load(tt_exec *x, const char *file, int with_state, tt_ckpt_state *st, tt_warn_fn warn, void *ud,
                       tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
