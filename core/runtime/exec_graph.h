/* core/runtime/exec_graph.h — the training micro-step replayed as a backend graph (exec_graph.c),
 * for the executor (exec.c) alone. */
#ifndef TT_EXEC_GRAPH_H
#define TT_EXEC_GRAPH_H
#include "exec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs steps [from, to) of the micro-step whose state is r (exec.c's exec_range). */
typedef int (*tt_exec_range_fn)(void *r, int from, int to, tt_err *err);

/* Whether the micro-step of p with loss count n may go through tt_exec_graph_micro: NULL when it
 * may, else why not (a static string; "" when the graph is simply off: the knob, the backend). */
const char *tt_exec_graph_refusal(const tt_exec *x, const tt_program *p, int n);

/* The parts a recording of p's micro-step splits into: bounds[0] = 0 < bounds[1] (< bounds[2]) =
 * micro_end, their number (1 or 2) returned. Where the batch's last-use event exists (in_ev), two:
 * split at the first step after in_last at which every offloaded activation's copy begun is joined
 * back into the compute stream (a recorded part must end joined), the event recorded between the
 * two launches; one when no such step is left (the event then recorded after it). */
int tt_exec_graph_parts(const tt_exec *x, const tt_program *p, int bounds[3]);

/* Runs the training micro-step whose state is r (all of p's steps before micro_end, through run)
 * as a graph: the first micro-step of each kind (micro_index 0, which overwrites the gradient
 * accumulators, or a later one, which adds to them) eagerly — the warm-up, in which the libraries
 * do what they do once —, the second recorded (graph_begin .. graph_end, in the parts of
 * tt_exec_graph_parts, the batch's last-use event recorded after the part holding in_last) and then
 * launched, every later one launched, after graph_values(grad_scale, seed_base): seed_base is the
 * micro-step's dropout base (exec.c; kernel_math.h tt_seed_at), from which the recorded dropout and
 * attention calls draw the eager step's masks. When recording fails (a call
 * refused while recording) nothing of the recorded work has run: the micro-step runs eagerly, the
 * graph stays off for this executor, and a note on stderr says why (x->graph_note). 0 or -1. */
int tt_exec_graph_micro(tt_exec *x, const tt_program *p, int micro_index, float grad_scale, uint64_t seed_base,
                        tt_exec_range_fn run, void *r, tt_err *err);

/* Frees the recorded graphs (tt_exec_destroy); the executor records again at its next use. */
void tt_exec_graph_free(tt_exec *x);

#ifdef __cplusplus
}
#endif
#endif
