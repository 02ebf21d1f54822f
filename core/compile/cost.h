/* core/compile/cost.h — the cost model: device profiles and the predicted time of a Program.
 * It only ranks candidate policies (the policy search, the recompute search); memory figures
 * never depend on it. */
#ifndef TT_COST_H
#define TT_COST_H
#include "program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_device_profile {
  const char *name;
  double flops_fp32, flops_fp16; /* sustained FLOP/s */
  double bytes_per_s;            /* memory bandwidth */
  double op_overhead_s;          /* per step launch / dispatch cost */
} tt_device_profile;

/* Documented targets: without a GPU, `plan --vram` plans for a generic CUDA card (the cost
 * model only ranks candidates; memory is exact); training on the CPU uses the CPU profile. */
const tt_device_profile *tt_profile_cuda_generic(void);
const tt_device_profile *tt_profile_cpu(void);

/* Exposed for tests and the --max-batch report. */
double tt_predict_ms(const tt_program *p, const tt_device_profile *prof);
/* Milliseconds per effective batch (every micro-step and the update); *recompute_ms (may be
 * NULL) gets the part spent recomputing. */
double tt_cost_predict_ms(const tt_program *p, const tt_device_profile *prof, double *recompute_ms);

#ifdef __cplusplus
}
#endif
#endif
