/* core/compile/lower_int.h — lowering's internal interface between lower.c and the files its
 * passes live in (lower_passes.c). Not for other modules. */
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

#ifdef __cplusplus
}
#endif
#endif
