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
 * (profile, sync mode, the all-reduce's after_step). */
#include "exec_graph.h"

#include <stdio.h>
#include <string.h>

const char *tt_exec_graph_refusal(const tt_exec *x, const tt_program *p, int n) {
  const tt_backend *be = x->be;
  if (!x->graph_on || x->graph_state[0] < 0 || !be->graph_begin || !be->graph_end || !be->graph_values ||
      !be->graph_launch || !be->graph_destroy || be->host_memory)
    return "";
  if (p != x->train) return "not the training program";
  if (n != p->policy.micro_batch) return "a partial batch (its loss counts fewer samples)";
  if (x->profile || x->sync_each) return "TINYTRAIN_PROFILE or TINYTRAIN_CUDA_SYNC looks at every call";
  if (x->after_step || x->ranks > 1) return "multi-process training hooks every step";
  if (p->n_act_offloaded) return "offloaded activations copy on the copy stream between the steps";
  return NULL;
}

/* The parts a recording splits into: bounds[0..n], n 1 or 2 (returned). */
static int exec_graph_parts(const tt_exec *x, const tt_program *p, int bounds[3]) {
  bounds[0] = 0;
  if (x->in_ev && x->in_last >= 0 && x->in_last + 1 < p->micro_end) {
    bounds[1] = x->in_last + 1, bounds[2] = p->micro_end;
    return 2;
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
  int bounds[3], n = exec_graph_parts(x, p, bounds);
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
  int key = micro_index > 0, bounds[3], n = exec_graph_parts(x, p, bounds);
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
    if (s + 1 < n && be->event_record(be, x->in_ev)) /* the batch's last use: the next batch may come in */
      return tt_fail(err, "recording the batch's last use failed: %s", be->last_error(be));
  }
  return 0;
}
