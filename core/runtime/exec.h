/* core/runtime/exec.h — execute a planned Program on a backend: one arena allocation at setup,
 * then every pointer is base + offset and nothing is allocated in the step. */
#ifndef TT_EXEC_H
#define TT_EXEC_H
#include <stdio.h>

#include "../compile/program.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Staging slots for the batch: the loader's images and labels are copied into one, which goes
 * to the device on the backend's copy stream; a slot is refilled only after the event recorded
 * after its copy has completed. Three let the host run up to two micro-steps ahead. */
#define TT_EXEC_STAGE_SLOTS 3

typedef struct tt_exec {
  const tt_graph *g;
  const tt_program *train; /* may be NULL for an evaluation-only executor */
  const tt_program *eval;  /* may be NULL */
  tt_backend *be;
  unsigned char *base;     /* the arena, on the backend's device */
  size_t arena_bytes;
  size_t persistent_bytes;
  uint64_t seed;           /* dropout masks: hash(seed, step, micro-step, node) */
  int rank, ranks;         /* multi-process training (core/runtime/dist.h): 0, 0 for one process */
  /* While set, called after every step of a micro-step with the step's index (core/runtime/dist.c:
   * a bucket's all-reduce starts once backward has written its last gradient); NULL otherwise. */
  int (*after_step)(void *ud, int step, tt_err *err);
  void *after_step_ud;
  /* host_alloc'ed at setup: the batch staging ring (images, then labels at stage_labels_off) */
  unsigned char *stage[TT_EXEC_STAGE_SLOTS];
  void *stage_ev[TT_EXEC_STAGE_SLOTS]; /* recorded after slot k's copy */
  size_t stage_bytes, stage_labels_off;
  int stage_next;
  /* The training program's input buffers are persistent where batches are staged (lower.c): with
   * the backend's event_record and upload_after, in_ev is recorded after step in_last (the last of
   * the micro-step reading the uint8 batch or the labels) and the next batch's copy waits for it
   * alone, so it runs while the rest of the step computes. NULL: every copy waits for all the
   * compute queued before it (upload_async). */
  void *in_ev;
  int in_last;
  int32_t *host_flag;      /* the overflow flag read back (host_alloc'ed) */
  /* The *_MULTI calls' pointer tables (exec_bind_multi, setup only): per program (0 training, 1
   * evaluation) seg_at[k][i] is where call i's segments start, in useg (UPDATE_MULTI: the training
   * program's), fseg (CHECK_FINITE_MULTI: the training program's) or cseg[k] (CAST_MULTI). NULL
   * where a program has no such call. */
  tt_update_seg *useg;
  int useg_held;           /* some tensor of useg holds its optimizer state in bf16 or int8: the
                            * UPDATE_MULTI call goes to the backend's *_update_held */
  tt_cast_seg *cseg[2];
  tt_finite_seg *fseg;
  tt_finite_seg *pseg;     /* every parameter's fp32 buffer, for tt_exec_params_finite's one call (setup;
                            * NULL where the backend has no check_finite_multi) */
  int npseg;
  int *seg_at[2];
  uint16_t *f16_input;     /* float input to an fp16 program on a device: converted here first
                            * (allocated at its first use, kept; the CPU converts in place) */
  void *flag_ev;           /* recorded after that read-back */
  /* From the knobs (core/base/knobs.h) at creation. On the CUDA backend, TINYTRAIN_CUDA_SYNC=1 waits for
   * the device after every backend call and names the call, step and layer whose work failed.
   * TINYTRAIN_PROFILE=1 (on CUDA also TINYTRAIN_CUDA_PROFILE=1) times each Program step (on CUDA
   * by a pair of timed events around it, read at the training step's end: no wait per step; on
   * the CPU its wall time) and prints a per-step table at tt_exec_destroy (stderr). */
  int sync_each, profile;
  int timed;                 /* the profile reads the backend's timers (backend.h timer_*), no sync per step */
  size_t profile_step;       /* TINYTRAIN_CUDA_PROFILE_STEP (1-based; 0 none): that step inside the */
  int prof_range;            /* backend's profiler range (profiler_range), open now */
  struct tt_exec_prof *prof; /* [train steps + 1 (the update)], then [eval steps] */
  /* planned host offload (core/runtime/offload_exec.c): the training program's pinned host region
   * (host_alloc'ed at setup, train->host_bytes), the window slots' events, the offloaded update
   * calls in run order and the next one's position during tt_exec_update */
  unsigned char *host;
  void *off_ev[2];
  int *off_calls;
  int n_off, off_k;
  int *mcopy;          /* offload 2: per parameter, the training program's persistent copy of its host
                        * master (-1: none); the evaluation program's copies map onto these */
  void **act_ev;       /* offloaded activations (offload.c's steps): mark[k] at 2k, done[k] at 2k + 1 */
  int n_act_ev;
  /* The training micro-step as a backend graph (exec_graph.c): graph_on from TINYTRAIN_CUDA_GRAPH
   * at creation (a test may change it before the first step). Per kind (0: micro-step 0, 1: later
   * ones) graph_state is 0 before its first micro-step, 1 after that eager warm-up, 2 once recorded
   * (graph[kind][part], the parts of tt_exec_graph_parts), -1 when recording failed (eager from then
   * on; graph_note says why). graph_capturing: set while a part is being recorded. */
  int graph_on, graph_capturing;
  int graph_state[2];
  void *graph[2][2];
  char graph_note[512];
} tt_exec;
/* The profile table (TINYTRAIN_PROFILE): steps by total time, most expensive first; nothing
 * when the profile is off. */
void tt_exec_profile_print(const tt_exec *x, FILE *out);

/* weight_decay applies to the parameters the program's update steps mark (TT_SF_DECAY, from
 * [train] decay). clip_norm > 0 clips the gradient by its global L2 norm; the training program
 * must then have been lowered with [train] clip_norm > 0 (it holds the sum-of-squares step), and
 * may use another value here (a schedule of it, a test). */
typedef struct tt_opt_hparams {
  tt_opt_kind kind;
  float lr, momentum, weight_decay, beta1, beta2, eps;
  int nesterov;
  float clip_norm;
} tt_opt_hparams;

/* Allocates the arena: persistent region of the training program (or the evaluation program
 * alone), then the larger of the two transient regions; they never run at the same time. Then
 * hands every backend call the programs make to the backend's prepare (oneDNN primitives are
 * built there), so the steps allocate nothing. */
int tt_exec_create(tt_exec *x, const tt_graph *g, const tt_program *train, const tt_program *eval, tt_backend *be,
                   uint64_t seed, tt_err *err);
void tt_exec_destroy(tt_exec *x);

/* Initialises parameters on the host from the seed (conv: He normal, fan_out, as torchvision;
 * linear: PyTorch's default uniform(+-1/sqrt(fan_in)); biases uniform(+-1/sqrt(fan_in));
 * batch norm gamma 1, beta 0, running mean 0, var 1), zeroes optimizer state, uploads. */
int tt_exec_init_params(tt_exec *x, uint64_t seed, tt_err *err);

/* One micro-step: upload the batch, forward, loss, backward. grad_scale multiplies dlogits
 * (loss_scale / effective_batch). micro_index 0 overwrites the gradient accumulators. */
int tt_exec_micro_step(tt_exec *x, const uint8_t *images, const int32_t *labels, int micro_index, uint64_t step,
                       float grad_scale, tt_err *err);
/* For tests: the same micro-step with the input given as normalised floats [batch, c, h, w]
 * (fp32; converted when the program is fp16) instead of uint8 pixels. */
int tt_exec_micro_step_f32(tt_exec *x, const float *input, const int32_t *labels, int micro_index, uint64_t step,
                           float grad_scale, tt_err *err);
/* A micro-step of the training program (train = 1) or a forward pass of the evaluation program
 * (train = 0) on a batch given as uint8 images or normalised fp32 input (the other NULL), each
 * holding the program's full planned batch, of which only the first n count: the loss and its
 * statistics, and in training the gradient (the logits' gradient past n is zeroed; batch norm's
 * batch statistics still see every sample). The step-level API pads a short batch with repeats. */
int tt_exec_micro_step_n(tt_exec *x, int train, const uint8_t *images, const float *input, const int32_t *labels, int n,
                         int micro_index, uint64_t step, float grad_scale, tt_err *err);
/* The evaluation program's logits of the last forward pass, first n samples, as fp32 [n, classes]. */
int tt_exec_logits(tt_exec *x, int n, float *out, tt_err *err);
/* The update phase. grad_unscale multiplies every gradient (1/loss_scale). Under fp16 the
 * overflow check runs first and every update reads its flag on the device: if any gradient is
 * inf/NaN no parameter or optimizer state moves. t is the 1-based optimizer step (Adam bias
 * correction). The flag is read back without waiting: with overflow non-NULL this waits for it
 * and sets *overflow (tests, tools); a training loop passes NULL and asks tt_exec_overflow later. */
int tt_exec_update(tt_exec *x, const tt_opt_hparams *h, int t, float grad_unscale, int *overflow, tt_err *err);
/* Whether the last tt_exec_update found an overflow (0 for fp32): waits for its flag's read-back,
 * which by the time the next step's micro-steps are queued is long done. Call it before the next
 * tt_exec_update, which reads the flag back into the same place. */
int tt_exec_overflow(tt_exec *x, int *overflow, tt_err *err);
/* Runs every convolution and matmul step of both programs once, on whatever the arena holds,
 * so that the libraries behind them (cuDNN, cuBLAS) load their kernels now, before the session
 * measures what they took; then waits for the device. They write only activations, activation
 * gradients, workspaces and gradient accumulators, which every step overwrites before reading:
 * weights, statistics and optimizer state are untouched. Call before the first step. */
int tt_exec_warmup(tt_exec *x, tt_err *err);
/* Forward-only evaluation of n <= eval micro-batch samples; adds to the loss statistics. A
 * final partial batch (n smaller) still runs every op at the planned batch, so the backend
 * sees only the shapes it prepared; the loss counts the first n. */
int tt_exec_eval(tt_exec *x, const uint8_t *images, const int32_t *labels, int n, tt_err *err);
/* stats[0] = summed loss, stats[1] = correct predictions since the last zero. */
int tt_exec_stats(tt_exec *x, float stats[2], int zero, tt_err *err);
/* Whether every parameter value (the fp32 masters and the batch-norm statistics) is finite, checked
 * on the device (one check_finite_multi over every parameter, or where the backend lacks it one
 * check_finite per parameter, into the loss-statistics buffer, read back: a
 * synchronisation), *finite 1 or 0. The loss statistics are zero afterwards: call it after reading
 * them. For the C API, which must not let a step that poisoned the weights look like success. */
int tt_exec_params_finite(tt_exec *x, int *finite, tt_err *err);

/* Host copies of a parameter (role: 0 value, 1 gradient, 2 first optimizer state,
 * 3 second optimizer state); numel floats. Used by checkpoints and tests. */
/* The tt_state_fmt parameter param's buffer of role is held in: that of its optimizer state
 * (roles 2, 3: [train] optimizer_state), TT_STATE_F32 for the others. tt_exec_param_get and _set
 * copy the buffer as held: tt_state_bytes(format, numel) bytes (backend.h). */
int tt_exec_param_state(const tt_exec *x, int param, int role);
int tt_exec_param_get(tt_exec *x, int param, int role, float *host, tt_err *err);
int tt_exec_param_set(tt_exec *x, int param, int role, const float *host, tt_err *err);

/* Device pointer of a buffer of the training (prog == x->train) or evaluation program. */
void *tt_exec_ptr(const tt_exec *x, const tt_program *prog, int buf);

uint64_t tt_hash64(uint64_t a, uint64_t b);

#ifdef __cplusplus
}
#endif
#endif
