/* core/runtime/session.h — one recipe opened for planning, training or evaluation: the model,
 * its graph, the backend, the schedule and (unless only planning) the executor. */
#ifndef TT_SESSION_H
#define TT_SESSION_H
#include <stdio.h>

#include "exec.h"
#include "../compile/policy.h"
#include "../tinytrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a session is opened for. EVAL lowers only the evaluation program; TRAIN schedules and
 * allocates both programs; PLAN schedules for the target device (a CUDA card even without a
 * GPU here, unless --device cpu) and allocates nothing. */
typedef enum tt_session_mode { TT_SESSION_EVAL = 0, TT_SESSION_TRAIN = 1, TT_SESSION_PLAN = 2 } tt_session_mode;

typedef struct tt_session {
  tt_model model;
  tt_graph graph;
  tt_backend *be;
  tt_policy_result sched;
  tt_policy_opts policy_opts;  /* what tt_policy_search was given (TRAIN, PLAN): tt_policy_explain takes it too */
  tt_exec x;
  int have_exec;
  int target_cuda;       /* planning for a CUDA device */
  const tt_device_profile *profile; /* the cost model's device: the CPU, the GPU here, or the card planned for */
  const char *target;    /* what the plan is for, in words (the plan's first line) */
  int reserve_measured;  /* the reserve was measured on a GPU, not estimated */
  int device_free_known; /* device_free_bytes was read on a GPU (after the context and handles) */
  size_t device_free_bytes;
  int budget_clamped;    /* --vram less the reserve was more than the device had free */
  size_t library_bytes;  /* device memory cuDNN/cuBLAS took after the arena (warm-up), training only */
  size_t lib_margin;     /* CUDA here: the device memory the plan keeps for the libraries beside the measured
                          * reserve: tt_cuda_library_margin, or after a re-plan what the warm-up measured plus
                          * TT_REPLAN_SLACK_BYTES, rounded up to TT_REPLAN_ROUND_BYTES */
  int replanned;         /* 1: the plan was made again from the measured library bytes (docs/plan.md) */
  char replan_text[320]; /* what the re-plan did or why there was none, one line ("" where it does not apply) */
  double plan_ms;        /* schedule + plan wall time */
  size_t vram_bytes;
  int ranks;             /* processes the recipe's batch is shared among (core/runtime/dist.h); the plan is per rank */
  int tf32_asked;        /* [train] tf32 / --tf32: TF32 wanted for fp32 convolutions and GEMMs */
  int tf32_cli;          /* the choice came from --tf32 (tt_run_opts.tf32), not the recipe */
  int tf32_used;         /* 1: the device here (or the card planned for) computes them in TF32 */
  size_t conv_ws_cap;    /* CUDA here: the cuDNN workspace cap the plan was made with (0: none known) */
  size_t conv_ws_default;/* the backend's default cap (TT_CUDA_CONV_WS_DEFAULT_CAP or 1/64 of the card) */
  size_t conv_ws_max;    /* the largest workspace buffer of the training program, bytes */
  /* The GPU here (train, or plan with a GPU and no --gpu): the generic card's speeds with this
   * device's compute capability (0: the CUDA library did not report one) and, from sm_80, native
   * bf16; profile points at it. */
  int gpu_cc;
  tt_device_profile gpu_here;
  char gpu_here_name[96];
} tt_session;

/* The re-plan after the warm-up (docs/plan.md#re-planning-after-the-warm-up): the library margin
 * becomes the measured library bytes plus this slack (what a larger micro-batch's convolutions may
 * still load), rounded up to the second figure, so that a few MiB of difference between two runs
 * of one card seldom change the plan. */
#define TT_REPLAN_SLACK_BYTES ((size_t)32 << 20)
#define TT_REPLAN_ROUND_BYTES ((size_t)16 << 20)

int tt_session_open(tt_session **out, const tt_run_opts *o, tt_session_mode mode, tt_err *err);
void tt_session_print_summary(const tt_session *s, FILE *out);
/* The chosen policy in one line, the same words in `plan` and at the start of `train`
 * ("micro-batch 8 x 1 accumulation steps = effective batch 8; fp32; 2 in-place ops; ...") */
void tt_session_policy_text(const tt_session *s, char *buf, size_t n);
/* Which activation precision the plan uses and why, in one line (the plan's "precision" line):
 * as asked, or what `auto` picked on this device (bf16 where native, else fp16 or fp32). */
void tt_session_precision_text(const tt_session *s, char *buf, size_t n);
/* Whether fp32 convolutions and GEMMs use TF32, and why, in one line (the plan's and the run
 * header's "tf32" line); "" where the target is the CPU. */
void tt_session_tf32_text(const tt_session *s, char *buf, size_t n);
/* The cuDNN workspace cap and what the plan gave the largest workspace, in one line; "" where no
 * CUDA backend made the plan. */
void tt_session_workspace_text(const tt_session *s, char *buf, size_t n);
void tt_session_close(tt_session *s);

#ifdef __cplusplus
}
#endif

#ifdef TT_HAVE_CUDA
/* the CUDA backend's creation, device queries and TT_CUDA_LIBRARY_MARGIN_BYTES */
#include "../../kernels/cuda/tt_cuda.h"
#endif
#endif
