/* core/runtime/exec_prof.h — exec.c's per-step hooks (exec_prof.c): the sync mode's check and
 * the profile's rows. Internal to core/runtime. */
#ifndef TT_EXEC_PROF_H
#define TT_EXEC_PROF_H
#include "exec.h"

/* One row of the profile. With the backend's timers (backend.h timer_*), ev[0] and ev[1] are
 * recorded around the step's calls and read by exec_prof_flush at the step's end (pending: a
 * pair recorded but not read yet), so no wait falls between the steps; else the host's clock
 * around a synchronised step. */
typedef struct tt_exec_prof {
  double seconds;
  long count;
  void *ev[2];
  int pending;
} tt_exec_prof;

/* The host's monotonic clock, in seconds. */
double tt_exec_now(void);
/* A step's kind as the profile and the sync mode name it ("forward", "update", ...). */
const char *tt_exec_step_op_name(const tt_step *s);
/* TINYTRAIN_CUDA_SYNC: waits for the device after `what` of step s and names it if the device failed. */
int tt_exec_sync_point(tt_exec *x, const tt_program *p, const tt_step *s, const char *what, tt_err *err);
/* The profile row of program p's step (-1: the training program's update); NULL when the profile is off. */
tt_exec_prof *tt_exec_prof_slot(tt_exec *x, const tt_program *p, int step);
/* Reads every timer pair recorded since the last flush into its row (waits for the last one's work). */
int tt_exec_prof_flush(tt_exec *x, tt_err *err);
/* Starts row pf's clock (its first timer event, or the host's clock into *t0). */
int tt_exec_prof_begin(tt_exec *x, tt_exec_prof *pf, double *t0, tt_err *err);
/* Stops row pf's clock: records its second event (read at the next flush), or adds the host time since t0. */
int tt_exec_prof_end(tt_exec *x, tt_exec_prof *pf, double t0, tt_err *err);
/* TINYTRAIN_CUDA_PROFILE_STEP: opens (on = 1) or closes the backend's profiler range, once each. */
int tt_exec_profiler(tt_exec *x, int on, tt_err *err);

#endif
