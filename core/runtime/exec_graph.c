/* core/runtime/exec_graph.c — the training micro-step replayed as a backend graph (exec_graph.h;
 * backend.h graph_*; TINYTRAIN_CUDA_GRAPH). Added for issue 41 (item 5).
 *
 * Why a replay equals the eager micro-step: every call's pointers are base + offset in the one
 * arena, allocated at setup, and the batch arrives in the same persistent input buffers; the calls'
 * other arguments are the same every micro-step of a kind (the parameter gradients' beta is 0 for
 * micro-step 0, 1 after: one graph per kind) except the loss's gradient scale and the dropout and
 * attention seeds, which the recorded calls read from device memory (graph_values: the scale, and
 * the micro-step's seed base, to which each call adds its node: kernel_math.h tt_seed_at). What
 * varies otherwise keeps the step eager: a partial batch's loss count, the per-call hooks
 * (profile, sync mode, the all-reduce's after_step).
 *
 * Offloaded activations' copies (offload_exec.c) are recorded with the compute work: each copy
 * forks the copy stream into the recording (it waits on an event recorded on the compute stream)
 * and is joined back by compute's wait on it (WAIT after a copy out; an IN's copy at once), which
 * the runtime requires of every recorded part before its end (cudaErrorStreamCaptureUnjoined).
 * So the parts split only where every copy begun is joined (exec_graph_open), and a micro-step
 * whose copies are not all joined by its end stays eager. */
#include "exec_graph.h"

#include <stdio.h>
#include <string.h>

/* How step i of p changes the number of the offloaded activations' copies begun and not yet joined
 * back into the compute stream (offload.c's steps, offload_exec.c's calls): +1 for a copy out (OUT:
 * the copy stream forks off after mark), -1 for its WAIT (compute waits for done: joined); +1 for a
 * MARK (the event a copy in will wait on), -1 for its IN (the copy, which compute waits for at
 * once). offload.c places each WAIT after its OUT and each IN after its MARK, so the running sum
 * from step 0 is 0 exactly at the boundaries where every copy begun is joined. */
static int exec_graph_open(const tt_program *p, int i) {
  int d = 0;
  for (int k = p->step_call[i]; k < p->step_call[i + 1]; k++) {
    const tt_call *c = &p->calls[k];
    if (c->fn != TT_CALL_OFFLOAD || c->skip != TT_CALL_RUNS) continue;
    d += c->mode == TT_OFF_OUT || c->mode == TT_OFF_MARK ? 1 : c->mode == TT_OFF_WAIT || c->mode == TT_OFF_IN ? -1 : 0;
  }
  return d;
}

const char *tt_exec_graph_refusal(const tt_exec *x, const tt_program *p, int n) {
  const tt_backend *be = x->be;
  if (!x->graph_on || x->graph_state[0] < 0 || !be->graph_begin || !be->graph_end || !be->graph_values ||
      !be->graph_launch || !be->graph_destroy || be->host_memory)
    return "";
  if (p != x->train) return "not the training program";
  if (n != p->policy.micro_batch) return "a partial batch (its loss counts fewer samples)";
  if (x->profile || x->sync_each) return "TINYTRAIN_PROFILE or TINYTRAIN_CUDA_SYNC looks at every call";
  if (x->after_step || x->ranks > 1) return "multi-process training hooks every step";
  int open = 0;
  for (int i = 0; p->n_act_offloaded && i < p->micro_end && open >= 0; i++) open += exec_graph_open(p, i);
  if (open)
    return "an offloaded activation's copy is not joined back into the compute stream within the micro-step (its "
           "copy out not waited for, or its copy in's mark without the copy): a recording cannot end with it";
  return NULL;
}

int tt_exec_graph_parts(const tt_exec *x, const tt_program *p, int bounds[3]) {
  int open = 0;
  bounds[0] = 0;
  for (int i = 0; x->in_ev && x->in_last >= 0 && i < p->micro_end; i++) {
    if (i > x->in_last && !open) {
      bounds[1] = i, bounds[2] = p->micro_end;
      return 2;
    }
    open += exec_graph_open(p, i);
  }
  bounds[1] = p->micro_end;
  return 1;
}

void tt_exec_graph_free(tt_exec *x) {
  for (int k = 0; k < 2; k++) {
    for (int s = 0; s < 2; s++) {
      if (x->graph[k][s]) x->be->graph_destroy(x->be, x->graph[k][s]);
      x->graph[k][s] = NULL;
    }
    if (x->graph_state[k] > 1) x->graph_state[k] = 1;
  }
}

/* Records the micro-step's parts into x->graph[key]. 0, or -1 when recording failed (why in
 * x->graph_note; nothing recorded ran, no graph is kept). */
static int exec_graph_record(tt_exec *x, const tt_program *p, int key, tt_exec_range_fn run, void *r) {
  tt_backend *be = x->be;
  int bounds[3], n = tt_exec_graph_parts(x, p, bounds);
  tt_err e;
  for (int s = 0; s < n; s++) {
    void *g = NULL;
    if (be->graph_begin(be)) {
      snprintf(x->graph_note, sizeof x->graph_note, "%s", be->last_error(be));
      return -1;
    }
    x->graph_capturing = 1;
    int rc = run(r, bounds[s], bounds[s + 1], &e);
    x->graph_capturing = 0;
    int erc = be->graph_end(be, &g);
    if (rc || erc) { /* the call's own error first: it says which call could not be recorded */
      snprintf(x->graph_note, sizeof x->graph_note, "%.480s", rc ? e.msg : be->last_error(be)); /* the note is 512 bytes */
      if (g) be->graph_destroy(be, g);
      for (int t = 0; t < s; t++) be->graph_destroy(be, x->graph[key][t]), x->graph[key][t] = NULL;
      return -1;
    }
    x->graph[key][s] = g;
  }
  return 0;
}

int tt_exec_graph_micro(tt_exec *x, const tt_program *p, int micro_index, float grad_scale, uint64_t seed_base,
                        tt_exec_range_fn run, void *r, tt_err *err) {
  tt_backend *be = x->be;
  int key = micro_index > 0, bounds[3], n = tt_exec_graph_parts(x, p, bounds);
  if (x->graph_state[key] == 0) { /* the warm-up: lazy library work happens outside any recording */
    x->graph_state[key] = 1;
    return run(r, 0, p->micro_end, err);
  }
  if (x->graph_state[key] == 1) {
    if (exec_graph_record(x, p, key, run, r)) {
      tt_exec_graph_free(x);
      x->graph_state[0] = x->graph_state[1] = -1;
      fprintf(stderr, "tinytrain: note: the training micro-step runs eagerly (TINYTRAIN_CUDA_GRAPH): it could not be "
                      "recorded as a graph: %s\n", x->graph_note);
      return run(r, 0, p->micro_end, err);
    }
    x->graph_state[key] = 2;
  }
  if (be->graph_values(be, grad_scale, seed_base))
    return tt_fail(err, "setting the recorded micro-step's loss scale and seed on %s failed: %s", be->name,
                   be->last_error(be));
  for (int s = 0; s < n; s++) {
    if (be->graph_launch(be, x->graph[key][s]))
      return tt_fail(err, "launching the recorded micro-step on %s failed: %s", be->name, be->last_error(be));
    /* after the part holding the batch's last use (the first of two, or the only one when no
     * step after the last use has every copy joined): the next batch may come in */
    if (x->in_ev && x->in_last >= bounds[s] && x->in_last < bounds[s + 1] && be->event_record(be, x->in_ev))
      return tt_fail(err, "recording the batch's last use failed: %s", be->last_error(be));
  }
  return 0;
}
