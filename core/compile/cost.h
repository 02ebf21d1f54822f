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
  double flops_fp32, flops_fp16; /* FLOP/s */
  double bytes_per_s;            /* memory bandwidth */
  double op_overhead_s;          /* per step launch / dispatch cost */
  /* the named cards of `plan --gpu` (0 / NULL for the generic card and the CPU): */
  const char *key;               /* what --gpu takes: "t4", "gtx1650", ... */
  size_t memory_bytes;           /* the card's memory: --vram when none is given */
  size_t reserve_bytes;          /* CUDA context + cuDNN/cuBLAS handles + the libraries' margin, estimated */
  int sm;                        /* compute capability x 10 (75: sm_75) */
  int bf16;                      /* the device computes bf16 natively (--precision auto picks it) */
  double flops_bf16;             /* FLOP/s in bf16; 0: the fp16 rate where bf16 is native, else fp32's */
  double bf16_ew_bytes_per_s;    /* bytes/s of the bf16 ops the backend converts per element through fp32 (all
                                  * but convolution, linear and pooling on the CPU); 0: bytes_per_s */
  double bf16_vec_bytes_per_s;   /* bytes/s of the bf16 elementwise layers it converts in vectorised chunks
                                  * (ReLU, ReLU6, add, dropout, global average pooling on the CPU); 0: the
                                  * rate above */
} tt_device_profile;

/* Documented targets: `plan --device cuda` without a GPU plans for a generic CUDA card (the
 * cost model only ranks candidates; memory is exact); the CPU (train and plan without a GPU)
 * uses the CPU profile. */
const tt_device_profile *tt_profile_cuda_generic(void);
const tt_device_profile *tt_profile_cpu(void);
/* The CPU when oneDNN computes bf16 natively there (AVX512_BF16, AMX): bf16 at twice fp32's rate. */
const tt_device_profile *tt_profile_cpu_bf16(void);
/* The CPU when bf16 is native but slower than fp32 (AVX512_BF16 without AMX on Intel): bf16 at
 * half fp32's rate. */
const tt_device_profile *tt_profile_cpu_bf16_slow(void);
/* The peak FLOP/s the cost model assumes for ops in dt. */
double tt_profile_peak(const tt_device_profile *p, tt_dtype dt);
/* `plan --gpu KEY`: the named card's profile, NULL when KEY names none. tt_profile_gpu_list
 * writes the keys, comma-separated, for messages. */
const tt_device_profile *tt_profile_gpu(const char *key);
const char *tt_profile_gpu_list(void);

/* Exposed for tests and the --max-batch report. */
double tt_predict_ms(const tt_program *p, const tt_device_profile *prof);
/* Milliseconds per effective batch (every micro-step and the update); *recompute_ms (may be
 * NULL) gets the part spent recomputing. */
double tt_cost_predict_ms(const tt_program *p, const tt_device_profile *prof, double *recompute_ms);
/* Milliseconds of step `step` of p, run once. */
double tt_cost_step_ms(const tt_program *p, int step, const tt_device_profile *prof);

/* Host-to-device link bandwidth the cost model charges the window copies at, bytes/s, for a
 * device profile: the named cards' PCIe generation and width (public figures: about 80% of the
 * link's peak, what pinned copies reach), 12e9 for the generic card; 0 for the CPU profiles
 * (the CPU backend has nothing to offload to). */
double tt_offload_link_bytes_per_s(const tt_device_profile *prof);

/* Seconds the update phase of p spends copying its offloaded state (and offload 2's fp32
 * masters) on prof's link: every such host buffer in and out once per optimizer step, serialised with the update (conservative: the
 * executor overlaps the next tensor's copy in with the current update, which this ignores).
 * 0 for a program without offload. */
double tt_offload_cost_s(const tt_program *p, const tt_device_profile *prof);

#ifdef __cplusplus
}
#endif
#endif
