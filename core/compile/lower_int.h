/* core/compile/lower_int.h — lowering's internal interface between lower.c and the files its
 * passes live in (lower_passes.c, lower_layout.c, krsc.c). Not for other modules. */
#ifndef TT_LOWER_INT_H
#define TT_LOWER_INT_H
#include "program.h"

#ifdef __cplusplus
extern "C" {
#endif

/* First and last step of every buffer; persistent ones span the whole program. */
void tt_lower_liveness(tt_program *p);
/* A transient gradient no step of the micro-step writes becomes persistent (zeroed at set-up, never
 * written); counts the transient ones left into p->transient_grads. Needs tt_lower_liveness's ranges. */
void tt_lower_grads_unwritten(tt_program *p);
/* A forward add proposed to write over an input read later proposes a dead input instead. */
void tt_lower_retarget_add(tt_program *p);

/* lower_layout.c: p->layout[v] for every node v of g (canon: lower.c's views, each node's value's
 * owner), and p's layout counts (n_nhwc, nhwc_bytes, n_layout_convs, n_layout_pools); see the file. 0, or -1 with
 * err set (out of host memory). */
int tt_lower_layouts(const tt_graph *g, const tt_policy *pol, const tt_backend *be, const int *canon, tt_program *p,
                     tt_err *err);

/* krsc.c: krsc[param] = 1 where parameter param's 16-bit copy is to be cast KRSC: a 4-D conv weight
 * with a half copy, in a 16-bit program, on a backend with TT_CAP_FILTER_KRSC and TT_CAP_CAST_MULTI
 * in caps, knob (TINYTRAIN_KRSC_CAST) on, and every node that reads the parameter a convolution
 * reading it as its filter with x and y NHWC (layout, per node as lower.c plans it; canon, lower.c's
 * views); 0 everywhere else. krsc: g->nparams bytes. */
void tt_krsc_plan(const tt_graph *g, const tt_policy *pol, int caps, int knob, const unsigned char *layout,
                  const int *canon, unsigned char *krsc);
/* Counts p's KRSC copies into p->n_krsc and checks the decision held through lowering: every step
 * reading a KRSC copy is a convolution reading it as its filter with layout_w KRSC, and every such
 * convolution's filter is a KRSC copy. 0, or -1 with an internal error naming the step and buffer. */
int tt_krsc_check(tt_program *p, tt_err *err);

#ifdef __cplusplus
}
#endif
#endif
