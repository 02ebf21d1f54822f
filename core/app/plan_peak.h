/* core/app/plan_peak.h — `plan`'s prediction of the process's peak memory: host RSS on the CPU
 * backends, device bytes on a CUDA card. */
#ifndef TT_PLAN_PEAK_H
#define TT_PLAN_PEAK_H
#include "../runtime/session.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The libraries' share of a CPU training process's peak RSS, bytes, measured (docs/plan.md, "The
 * process's peak"): the executable and the shared libraries' pages it touches (oneDNN, OpenBLAS,
 * zlib, the C and OpenMP runtimes), the threads' stacks and the host's own small structures
 * (recipe, graph, programs, call lists), plus, on the oneDNN backend, its primitives and their
 * JIT code: a constant per backend and, on oneDNN, TT_PEAK_PER_CONV_ONEDNN for each distinct
 * convolution configuration. Fitted on a 2-core AMX Xeon, native (bf16) and held to AVX2 (fp32),
 * over the fashion LeNet, ResNet and ViT, to the smallest largest error (implied share 16.5 to
 * 23.1 MiB on oneDNN, 10.2 to 13.1 on the reference backend, which has no JIT code);
 * tests/runtime/test_peak.sh holds the prediction to TT_PEAK_TOLERANCE. */
#define TT_PEAK_BASE_ONEDNN ((size_t)35 * 524288u)    /* 17.5 MiB */
#define TT_PEAK_PER_CONV_ONEDNN ((size_t)5 * 131072u) /* 0.625 MiB */
#define TT_PEAK_BASE_REF ((size_t)12 * 1048576u)
/* The tolerance the prediction is held to: a fraction of the measured peak. */
#define TT_PEAK_TOLERANCE 0.03

/* The parts of the prediction for a training run (train: one process, evaluation and checkpoints
 * included), bytes. On a CUDA target: arena + reserve (the device); host parts are not predicted. */
typedef struct tt_peak {
  int device;             /* 1: the bytes are the device's (a CUDA target); 0: host RSS */
  size_t arena;           /* the one allocation: persistent + the larger transient region of training and evaluation */
  size_t eval_extra;      /* of which evaluation's transient region adds beyond training's (0: it fits within) */
  size_t loaders;         /* the training loader (ring, staging images, order) and the evaluation loader's */
  size_t eval_loader;     /* of which the evaluation loader's (one thread, the evaluation batch) */
  size_t dataset;         /* the sets held in memory (idx, synthetic: images and int32 labels) */
  int dataset_known;      /* 0: npy (mapped: resident as read, up to the files' size) or a count not readable */
  size_t ckpt_staging;    /* a checkpoint write's staging buffer (tt_checkpoint_staging_bytes) */
  int conv_configs;       /* distinct convolution configurations (oneDNN's primitives grow with them) */
  size_t per_conv;        /* the libraries' bytes per configuration (TT_PEAK_PER_CONV_ONEDNN, 0 on the reference backend) */
  size_t baseline;        /* TT_PEAK_BASE_* (+ per convolution configuration; host), or the reserve (device) */
  size_t total;
  const char *baseline_what; /* "oneDNN backend", "reference backend", "reserve" */
} tt_peak;

/* Fills pk for session s (planned for training). Never fails: a part it cannot know (an unreadable
 * data file) counts 0 with dataset_known = 0. */
void tt_plan_peak(const tt_session *s, tt_peak *pk);

#ifdef __cplusplus
}
#endif
#endif
