/* core/runtime/dist.h — data-parallel training over several processes (one per GPU, or CPU processes
 * sharing the cores), launched by mpirun: MPI starts them and all-reduces on the CPU; NCCL
 * all-reduces between GPUs, bootstrapped over MPI (kernels/cuda/cuda_nccl.cu).
 *
 * The launch is process-wide (MPI can be initialised once per process), so this is the one
 * module with process state besides the stop signal: rank, size and the communicators.
 * Without mpirun (no OMPI_COMM_WORLD_SIZE / PMI_SIZE in the environment) nothing is
 * initialised and every function is a no-op for one process: size 1, rank 0. */
#ifndef TT_DIST_H
#define TT_DIST_H
#include <stddef.h>

#include "exec.h"
#include "../compile/model.h"
#include "../base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Joins the launch when started by mpirun (MPI_Init, errors returned rather than fatal);
 * otherwise one process. Idempotent. Fails when mpirun started several processes but this
 * build has no MPI. */
int tt_dist_init(tt_err *err);
/* This process's rank and the number of processes (0 and 1 without mpirun; known once
 * tt_dist_init has run; the command line reads them through core/app/cli.h), the rank among
 * the processes of this machine (it picks the GPU) and their number. */
int tt_dist_rank(void);
int tt_dist_size(void);
int tt_dist_local_rank(void);
int tt_dist_local_size(void);
/* CPU threads for one process when --threads was not given: its share of the cores this
 * process may run on (all of them for one process). */
int tt_dist_threads(void);
/* Once before the process exits: MPI_Finalize, or after a failure with more than one process
 * MPI_Abort, which ends every process of the job. Nothing without mpirun. */
void tt_dist_end(int failed);

/* The recipe's batch is the global batch: micro-batch x accumulation x ranks. Divides
 * model->train.batch by ranks (the scheduler then plans one rank's share under one rank's
 * budget), or fails naming the recipe when it does not divide. */
int tt_dist_per_rank_batch(tt_model *model, int ranks, tt_err *err);

/* The gradient sum over the ranks, in fp32, in place, once per optimizer step, in buckets:
 * runs of gradient accumulators that lie end to end in the arena (core/compile/lower.c plans them so;
 * the buckets are spans of the arena, nothing is copied). During the last micro-step of a step
 * (between begin and end), each bucket's all-reduce starts as soon as backward has written
 * the last gradient in it, overlapping the rest of backward (NCCL on its own stream; MPI
 * non-blocking on the CPU); end starts any left and waits (CPU) or makes the device's next work
 * wait (GPU). Before the update, and so before the fp16 overflow check: an inf/NaN on any rank
 * reaches every rank's sum, and every rank skips the step. create gives NULL for one process,
 * and begin/end do nothing with NULL. */
typedef struct tt_dist_buckets tt_dist_buckets;
int tt_dist_buckets_create(tt_dist_buckets **out, tt_exec *x, tt_err *err);
void tt_dist_buckets_destroy(tt_dist_buckets *d);
void tt_dist_allreduce_begin(tt_dist_buckets *d);
int tt_dist_allreduce_end(tt_dist_buckets *d, tt_err *err);
/* How many buckets a training program's gradients make (for the plan). */
int tt_dist_bucket_count(const tt_program *p);
/* Rank 0's parameters to every rank: all of them (stats_only 0: after initialisation or a
 * resume), or only the batch-norm running statistics (stats_only 1: before an evaluation, as
 * PyTorch DDP broadcasts its buffers from rank 0). */
int tt_dist_broadcast_params(tt_exec *x, int stats_only, tt_err *err);
/* Sums n doubles over the ranks in place (loss sums, counts); the largest of an int (the stop signal). */
int tt_dist_sum(double *v, int n, tt_err *err);
int tt_dist_max(int *v, tt_err *err);

/* What the ranks must agree on, checked once at the start (tt_dist_agree): each a name for
 * the message and a value (a number, or a hash: then `hash` says of what, e.g. "the recipe's
 * text"). Every rank calls it with the same fields in the same order; when any rank's value
 * differs from rank 0's, every rank fails with the same message naming the first such rank and
 * field. */
typedef struct tt_dist_field {
  const char *name;
  unsigned long long value;
  const char *hash; /* NULL: value is a number, printed */
} tt_dist_field;
int tt_dist_agree(const tt_dist_field *f, int n, tt_err *err);
/* The watchdog's limit: seconds a host collective may wait for the other ranks before this
 * rank prints a line naming the collective and the rank(s) it waited for and ends (mpirun then
 * ends the job). TINYTRAIN_DIST_TIMEOUT (core/base/knobs.h), default 300, 0 none. */
double tt_dist_timeout(void);

/* Seconds spent in the gradient all-reduce (waiting for the slowest rank included) and bytes
 * all-reduced per optimizer step, since the process started. */
double tt_dist_allreduce_seconds(void);
size_t tt_dist_grad_bytes(const tt_program *p);

#ifdef TT_HAVE_CUDA
/* The CUDA backend's hooks (core/runtime/session.c): before the backend is created, the GPU this
 * process uses (by local rank); after it, the NCCL communicator, whose device memory is
 * measured and added to *reserve. No-ops for one process. */
int tt_dist_cuda_select(tt_err *err);
int tt_dist_cuda_attach(tt_backend *be, size_t *reserve, tt_err *err);
#endif

#ifdef __cplusplus
}
#endif
#endif
