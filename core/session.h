/* core/session.h — one recipe opened for planning, training or evaluation: the model,
 * its graph, the backend, the schedule and (unless only planning) the executor. */
#ifndef TT_SESSION_H
#define TT_SESSION_H
#include <stdio.h>

#include "exec.h"
#include "sched.h"
#include "tinytrain.h"

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
  tt_schedule_result sched;
  tt_sched_opts sched_opts;  /* what tt_schedule was given (TRAIN, PLAN): tt_sched_explain takes it too */
  tt_exec x;
  int have_exec;
  int target_cuda;       /* planning for a CUDA device */
  int reserve_measured;  /* the reserve was measured on a GPU, not estimated */
  double plan_ms;        /* schedule + plan wall time */
  size_t vram_bytes;
} tt_session;

int tt_session_open(tt_session **out, const tt_run_opts *o, tt_session_mode mode, tt_err *err);
void tt_session_print_summary(const tt_session *s, FILE *out);
void tt_session_close(tt_session *s);

#ifdef TT_HAVE_CUDA
/* kernels/cuda: NULL with err set when there is no usable GPU. reserve_bytes receives the
 * device memory the context and library handles took (cudaMemGetInfo before and after). */
tt_backend *tt_cuda_backend_create(size_t *reserve_bytes, char *errbuf, size_t errsize);
int tt_cuda_device_count(void);
/* "CUDA runtime 13.0, cuDNN 9.19.0, cuBLAS 13.1.0" (kernels/cuda/tt_cuda.h has the rest) */
const char *tt_cuda_info(void);
#endif

#ifdef __cplusplus
}
#endif
#endif
