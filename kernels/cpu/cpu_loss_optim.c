/* kernels/cpu/cpu_loss_optim.c — the loss and optimizer ops the CPU backend runs itself: the
 * overflow check, vectorised in fp32 and bf16 (cpu_vec.h). Softmax cross-entropy, the optimizer
 * updates and the sum of squares stay the reference's in every dtype (cpu_backend.c's table):
 * softmax_ce's cost is the exp per logit (double), the same in fp32 and bf16, and its tensors
 * are [batch, classes].
 */
#include "cpu_internal.h"
#include "cpu_vec.h"

/* ---- overflow check: any exponent field all ones (inf or NaN), as the reference tests it ---- */

CPU_VEC_FN_RET(int, cpu_lo_any_nonfinite32, (const float *x, size_t n), (x, n), {
  size_t i;
  uint32_t bad = 0;
  _Pragma("omp simd reduction(| : bad)")
  for (i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, 4);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  return bad != 0;
})

CPU_VEC_FN_RET(int, cpu_lo_any_nonfinite16, (const uint16_t *u, size_t n), (u, n), {
  size_t i;
  uint32_t bad = 0;
  _Pragma("omp simd reduction(| : bad)")
  for (i = 0; i < n; i++) bad |= (u[i] & 0x7f80u) == 0x7f80u;
  return bad != 0;
})

int tt_cpu_check_finite(tt_backend *b, size_t count, tt_dtype dt, const void *x, int32_t *flag) {
  int bad = 0, nt;
  if ((dt != TT_F32 && dt != TT_BF16) || !count || !x || !flag) return tt_ref_check_finite(b, count, dt, x, flag);
  nt = tt_cpu_threads_for(b, count);
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : bad)
  {
    size_t lo, hi;
    cpu_vec_my_share(count, &lo, &hi);
    if (hi > lo)
      bad |= dt == TT_F32 ? cpu_lo_any_nonfinite32((const float *)x + lo, hi - lo)
                          : cpu_lo_any_nonfinite16((const uint16_t *)x + lo, hi - lo);
  }
  if (bad) flag[0] = 1;
  return 0;
}

/* check_finite over each segment in turn, each split among the threads (backend.h check_finite_multi). */
int tt_cpu_check_finite_multi(tt_backend *b, const tt_finite_seg *segs, int nseg, tt_dtype dt, int32_t *flag) {
  if (nseg < 0 || (nseg && !segs)) return tt_ref_check_finite_multi(b, segs, nseg, dt, flag); /* its message */
  for (int i = 0; i < nseg; i++)
    if (tt_cpu_check_finite(b, segs[i].count, dt, segs[i].x, flag)) return -1;
  return 0;
}
