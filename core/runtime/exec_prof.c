/* core/runtime/exec_prof.c — the execute stage's hooks around each Program step: the
 * TINYTRAIN_CUDA_SYNC check, the TINYTRAIN_PROFILE clock (the backend's timer pairs, or the
 * host's clock around a synchronised step), the TINYTRAIN_CUDA_PROFILE_STEP range, and the
 * profile's table. Split from exec.c, which calls these from its step loop. */
#include "exec_prof.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>



double tt_exec_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *tt_exec_step_op_name(const tt_step *s) {
  switch (s->op) {
    case TT_S_LOAD_INPUT: return "load_input";
    case TT_S_CAST: return "cast";
    case TT_S_FWD: return "forward";
    case TT_S_BWD: return "backward";
    case TT_S_LOSS: return "loss";
    case TT_S_CHECK: return "overflow_check";
    case TT_S_UPDATE: return "update";
    case TT_S_CLIP: return "clip_norm";
    case TT_S_OFFLOAD: return "offload";
    default: return "step";
  }
}

/* TINYTRAIN_CUDA_SYNC: waits for the device after `what` of step s and names it if the device failed. */
int tt_exec_sync_point(tt_exec *x, const tt_program *p, const tt_step *s, const char *what, tt_err *err) {
  if (!x->sync_each || !x->be->sync(x->be)) return 0;
  return tt_fail(err, "TINYTRAIN_CUDA_SYNC: the device failed in %s of step %d (%s of layer '%s', %s program): %s", what,
                 (int)(s - p->steps), tt_exec_step_op_name(s), s->name ? s->name : "-", p == x->eval ? "evaluation" : "training",
                 x->be->last_error(x->be));
}

tt_exec_prof *tt_exec_prof_slot(tt_exec *x, const tt_program *p, int step) {
  if (!x->prof) return NULL;
  int ntrain = x->train ? x->train->nsteps + 1 : 0;
  return p == x->train ? &x->prof[step < 0 ? ntrain - 1 : step] : &x->prof[ntrain + step];
}

/* Reads every pair recorded since the last flush into its row (waiting for the last one's work). */
int tt_exec_prof_flush(tt_exec *x, tt_err *err) {
  int rows = (x->train ? x->train->nsteps + 1 : 0) + (x->eval ? x->eval->nsteps : 0);
  for (int i = 0; x->prof && x->timed && i < rows; i++) {
    tt_exec_prof *e = &x->prof[i];
    float ms = 0.0f;
    if (!e->pending) continue;
    e->pending = 0;
    if (x->be->timer_elapsed(x->be, e->ev[0], e->ev[1], &ms))
      return tt_fail(err, "TINYTRAIN_PROFILE: reading a step's device time failed: %s", x->be->last_error(x->be));
    e->seconds += ms * 1e-3, e->count++;
  }
  return 0;
}

/* Starts row pf's clock: its first timer event (a row still pending is read first, so a step that
 * runs twice before the step's end, as under accumulation, waits then), or the host's clock. */
int tt_exec_prof_begin(tt_exec *x, tt_exec_prof *pf, double *t0, tt_err *err) {
  tt_backend *be = x->be;
  if (!x->timed) return *t0 = tt_exec_now(), 0;
  if (pf->pending && tt_exec_prof_flush(x, err)) return -1;
  for (int k = 0; k < 2; k++)
    if (!pf->ev[k] && !(pf->ev[k] = be->timer_create(be)))
      return tt_fail(err, "TINYTRAIN_PROFILE: creating a timer failed: %s", be->last_error(be));
  if (be->event_record(be, pf->ev[0])) return tt_fail(err, "TINYTRAIN_PROFILE: %s", be->last_error(be));
  return 0;
}

int tt_exec_prof_end(tt_exec *x, tt_exec_prof *pf, double t0, tt_err *err) {
  if (!x->timed) return pf->seconds += tt_exec_now() - t0, pf->count++, 0;
  if (x->be->event_record(x->be, pf->ev[1])) return tt_fail(err, "TINYTRAIN_PROFILE: %s", x->be->last_error(x->be));
  pf->pending = 1;
  return 0;
}

/* TINYTRAIN_CUDA_PROFILE_STEP: opens (on = 1) or closes the backend's profiler range, once each. */
int tt_exec_profiler(tt_exec *x, int on, tt_err *err) {
  if (!x->be->profiler_range || x->prof_range == on) return 0;
  x->prof_range = on;
  if (x->be->profiler_range(x->be, on))
    return tt_fail(err, "TINYTRAIN_CUDA_PROFILE_STEP: the profiler's %s failed: %s", on ? "start" : "stop",
                   x->be->last_error(x->be));
  return 0;
}

static void exec_prof_rows(const tt_exec *x, const tt_program *p, int base, int nrows, const tt_exec_prof **rows,
                           const char **names, const char **ops, const char **prog, int *n) {
  for (int i = 0; i < nrows; i++) {
    const tt_exec_prof *e = &x->prof[base + i];
    if (!e->count) continue;
    rows[*n] = e;
    if (i < p->nsteps) names[*n] = p->steps[i].name ? p->steps[i].name : "-", ops[*n] = tt_exec_step_op_name(&p->steps[i]);
    else names[*n] = "(all parameters)", ops[*n] = "optimizer update";
    prog[*n] = p == x->eval ? "eval" : "train";
    (*n)++;
  }
}

void tt_exec_profile_print(const tt_exec *x, FILE *out) {
  if (!x->prof) return;
  int ntrain = x->train ? x->train->nsteps + 1 : 0, neval = x->eval ? x->eval->nsteps : 0, n = 0;
  int cap = ntrain + neval;
  const tt_exec_prof **rows = (const tt_exec_prof **)calloc((size_t)cap + 1, sizeof *rows);
  const char **names = (const char **)calloc((size_t)cap + 1, sizeof *names);
  const char **ops = (const char **)calloc((size_t)cap + 1, sizeof *ops);
  const char **prog = (const char **)calloc((size_t)cap + 1, sizeof *prog);
  if (!rows || !names || !ops || !prog) {
    free(rows), free(names), free(ops), free(prog);
    return;
  }
  if (x->train) exec_prof_rows(x, x->train, 0, ntrain, rows, names, ops, prog, &n);
  if (x->eval) exec_prof_rows(x, x->eval, ntrain, neval, rows, names, ops, prog, &n);
  double total = 0;
  for (int i = 0; i < n; i++) total += rows[i]->seconds;
  for (int i = 1; i < n; i++) /* by total time, most expensive first (insertion sort: a few hundred rows) */
    for (int j = i; j > 0 && rows[j]->seconds > rows[j - 1]->seconds; j--) {
      const tt_exec_prof *t = rows[j]; rows[j] = rows[j - 1], rows[j - 1] = t;
      const char *a = names[j]; names[j] = names[j - 1], names[j - 1] = a;
      a = ops[j], ops[j] = ops[j - 1], ops[j - 1] = a;
      a = prog[j], prog[j] = prog[j - 1], prog[j - 1] = a;
    }
  fprintf(out, "TINYTRAIN_PROFILE: %d Program steps on %s, %.3f s in all (%s)\n", n, x->be->name, total,
          x->be->host_memory ? "host wall time of each step"
          : x->timed ? "device time between events around each step, read at the step's end; a step's idle gaps count"
                     : "each step synchronised: device time with launch latency");
  fprintf(out, "%-6s %-18s %-24s %8s %12s %10s %6s\n", "prog", "op", "layer", "calls", "total ms", "mean us", "%");
  for (int i = 0; i < n; i++)
    fprintf(out, "%-6s %-18s %-24s %8ld %12.3f %10.1f %6.2f\n", prog[i], ops[i], names[i], rows[i]->count,
            rows[i]->seconds * 1e3, rows[i]->seconds * 1e6 / (double)rows[i]->count,
            total > 0 ? 100.0 * rows[i]->seconds / total : 0.0);
  free(rows), free(names), free(ops), free(prog);
}
