/* kernels/ref/ref_loss_optim.c — softmax cross-entropy, the optimizer updates and the
 * loss-scale overflow check (check_finite).
 *
 * softmax_ce reduces per-sample losses in fixed blocks of REF_LO_BLOCK samples whose
 * partial sums are added in block order, so stats do not depend on the thread count.
 * Optimizer updates are elementwise, fp32, PyTorch torch.optim semantics. check_finite
 * tests the exponent bits, so it holds under -ffast-math too. sum_squares (for clip_norm) sums
 * in double over fixed blocks, so it too is independent of the thread count.
 */
#include <math.h>

#include "ref_internal.h"

#define REF_LO_BLOCK 16   /* samples per partial sum */
#define REF_LO_BLOCKS 64  /* blocks per parallel pass (partials live on the stack) */

int tt_ref_softmax_ce(tt_backend *b, int n, int classes, tt_dtype dt, const void *logits, const int32_t *labels,
                      float smoothing, float grad_scale, void *dlogits, float *stats) {
  int i, nt = tt_ref_threads(b);
  double loss_total = 0.0, correct_total = 0.0;
  (void)nt;
  if (tt_ref_dt_check(b, "softmax_ce", dt)) return -1;
  if (n <= 0 || classes <= 0) return tt_ref_fail(b, "softmax_ce: bad shape n=%d classes=%d", n, classes);
  if (!logits || !labels || !stats) return tt_ref_fail(b, "softmax_ce: NULL logits, labels or stats");
  if (!(smoothing >= 0.0f && smoothing <= 1.0f))
    return tt_ref_fail(b, "softmax_ce: label smoothing %g is outside [0, 1]", (double)smoothing);
  for (i = 0; i < n; i++)
    if (labels[i] < 0 || labels[i] >= classes)
      return tt_ref_fail(b, "softmax_ce: label %d of sample %d is outside [0, %d)", (int)labels[i], i, classes);

  for (i = 0; i < n; i += REF_LO_BLOCK * REF_LO_BLOCKS) {
    double part_loss[REF_LO_BLOCKS], part_correct[REF_LO_BLOCKS];
    int nblk = (n - i + REF_LO_BLOCK - 1) / REF_LO_BLOCK, blk;
    if (nblk > REF_LO_BLOCKS) nblk = REF_LO_BLOCKS;
#pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)nblk * REF_LO_BLOCK * classes > TT_REF_PAR_MIN)
    for (blk = 0; blk < nblk; blk++) {
      int s0 = i + blk * REF_LO_BLOCK, s1 = s0 + REF_LO_BLOCK, smp, j;
      double bl = 0.0, bc = 0.0;
      if (s1 > n) s1 = n;
      for (smp = s0; smp < s1; smp++) {
        size_t off = (size_t)smp * classes;
        float mx = tt_ref_ld(dt, logits, off);
        int arg = 0, y = labels[smp];
        double sum = 0.0, zsum = 0.0, lse, inv;
        float on = 1.0f - smoothing, off_t = smoothing / (float)classes;
        for (j = 1; j < classes; j++) {
          float v = tt_ref_ld(dt, logits, off + j);
          if (v > mx) {
            mx = v;
            arg = j;
          }
        }
        for (j = 0; j < classes; j++) {
          float v = tt_ref_ld(dt, logits, off + j);
          sum += exp((double)v - (double)mx);
          zsum += v;
        }
        lse = (double)mx + log(sum);
        /* loss = sum_j target_j * (lse - z_j), target = (1-s)*onehot + s/classes */
        bl += (double)on * (lse - (double)tt_ref_ld(dt, logits, off + y)) + (double)off_t * ((double)classes * lse - zsum);
        bc += arg == y ? 1.0 : 0.0;
        if (dlogits) {
          inv = 1.0 / sum;
          for (j = 0; j < classes; j++) {
            float p = (float)(exp((double)tt_ref_ld(dt, logits, off + j) - (double)mx) * inv);
            float t = off_t + (j == y ? on : 0.0f);
            tt_ref_st(dt, dlogits, off + j, (p - t) * grad_scale);
          }
        }
      }
      part_loss[blk] = bl;
      part_correct[blk] = bc;
    }
    for (blk = 0; blk < nblk; blk++) {
      loss_total += part_loss[blk];
      correct_total += part_correct[blk];
    }
  }
  stats[0] += (float)loss_total;
  stats[1] += (float)correct_total;
  return 0;
}

/* A clip argument's checks (backend.h, tt_clip). */
static int ref_lo_clip_bad(tt_backend *b, const char *op, const tt_clip *clip) {
  char msg[256];
  return tt_clip_error(op, clip, msg, sizeof msg) ? tt_ref_fail(b, "%s", msg) : 0;
}

int tt_ref_sgd_update(tt_backend *b, size_t count, float *w, const float *g, float *m, float lr, float momentum,
                      int nesterov, float weight_decay, float grad_scale, const tt_clip *clip, const int32_t *skip) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (count && (!w || !g)) return tt_ref_fail(b, "sgd_update: NULL w or g");
  if (momentum != 0.0f && count && !m) return tt_ref_fail(b, "sgd_update: momentum %g needs a momentum buffer", (double)momentum);
  if (ref_lo_clip_bad(b, "sgd_update", clip)) return -1;
  if (skip && *skip) return 0; /* an overflow: the update is skipped */
  if (clip) grad_scale = tt_clip_grad_scale(grad_scale, clip->sumsq, clip->max_norm);
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
  for (i = 0; i < n; i++) tt_sgd_elem((size_t)i, w, g, m, lr, momentum, nesterov, weight_decay, grad_scale);
  return 0;
}

int tt_ref_adam_update(tt_backend *b, size_t count, float *w, const float *g, float *m, float *v, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int decoupled, int t,
                       float grad_scale, const tt_clip *clip, const int32_t *skip) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  int nt = tt_ref_threads(b);
  (void)nt;
  if (count && (!w || !g || !m || !v)) return tt_ref_fail(b, "adam_update: NULL w, g, m or v");
  if (t < 1) return tt_ref_fail(b, "adam_update: step t=%d must be >= 1", t);
  if (ref_lo_clip_bad(b, "adam_update", clip)) return -1;
  if (skip && *skip) return 0; /* an overflow: the update is skipped */
  if (clip) grad_scale = tt_clip_grad_scale(grad_scale, clip->sumsq, clip->max_norm);
  tt_adam_consts k = tt_adam_make_consts(lr, beta1, beta2, weight_decay, decoupled, t);
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TT_REF_PAR_MIN)
  for (i = 0; i < n; i++) tt_adam_elem((size_t)i, w, g, m, v, beta1, beta2, eps, weight_decay, decoupled, k, grad_scale);
  return 0;
}

/* ---- updates with the state held in bf16 or int8 (backend.h sgd_update_held) ----
 * Each tensor in blocks of TT_STATE_BLOCK values (the int8 blocks; bf16 uses the same as units of
 * work): the block's state decoded into fp32 on the stack, updated by the fp32 element update
 * (tt_sgd_elem, tt_adam_elem: the same arithmetic as fp32 state), and coded back, in one pass
 * per block. Blocks are independent, so the result does not depend on the thread count. */

/* The checks every held update makes of its tensors; 0 or -1 with the reason recorded. */
static int ref_lo_held_bad(tt_backend *b, const char *op, const tt_update_seg *segs, int nseg, int adam, float momentum) {
  if (nseg < 0 || (nseg && !segs)) return tt_ref_fail(b, "%s: %d tensors at %p", op, nseg, (const void *)segs);
  for (int i = 0; i < nseg; i++) {
    const tt_update_seg *sg = &segs[i];
    if (!sg->count) continue;
    if (!sg->w || !sg->g || (adam && (!sg->m || !sg->v)) || (!adam && momentum != 0.0f && !sg->m))
      return tt_ref_fail(b, "%s: tensor %d of %d: NULL w, g or optimizer state", op, i, nseg);
    if (sg->state < TT_STATE_F32 || sg->state > TT_STATE_INT8)
      return tt_ref_fail(b, "%s: tensor %d of %d: unknown state format %d", op, i, nseg, sg->state);
  }
  return 0;
}

/* What every held update does before its tensors: the checks, the skip of an overflowed step and
 * the clip folded into *grad_scale. -1: bad arguments (recorded); 1: skip the update; 0: go on. */
static int ref_lo_held_begin(tt_backend *b, const char *op, const tt_update_seg *segs, int nseg, int adam, float momentum,
                             const tt_clip *clip, const int32_t *skip, float *grad_scale) {
  if (ref_lo_held_bad(b, op, segs, nseg, adam, momentum) || ref_lo_clip_bad(b, op, clip)) return -1;
  if (skip && *skip) return 1; /* an overflow: the update is skipped */
  if (clip) *grad_scale = tt_clip_grad_scale(*grad_scale, clip->sumsq, clip->max_norm);
  return 0;
}

int tt_ref_sgd_update_held(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float momentum, int nesterov,
                           float weight_decay, float grad_scale, const tt_clip *clip, const int32_t *skip) {
  int nt = tt_ref_threads(b);
  (void)nt;
  int go = ref_lo_held_begin(b, "sgd_update_held", segs, nseg, 0, momentum, clip, skip, &grad_scale);
  if (go) return go < 0 ? -1 : 0;
  for (int i = 0; i < nseg; i++) {
    const tt_update_seg *sg = &segs[i];
    float wd = sg->decay ? weight_decay : 0.0f;
    ptrdiff_t nblk = (ptrdiff_t)tt_state_blocks(sg->count), blk;
#pragma omp parallel for schedule(static) num_threads(nt) if (sg->count > TT_REF_PAR_MIN)
    for (blk = 0; blk < nblk; blk++) {
      size_t j0 = (size_t)blk * TT_STATE_BLOCK, n = sg->count - j0 < TT_STATE_BLOCK ? sg->count - j0 : TT_STATE_BLOCK;
      float mt[TT_STATE_BLOCK], *m = momentum != 0.0f ? mt : NULL; /* no momentum: no state */
      if (m) tt_state_load(sg->state, 1, sg->m, sg->count, j0, n, mt);
      for (size_t k = 0; k < n; k++) tt_sgd_elem(k, sg->w + j0, sg->g + j0, m, lr, momentum, nesterov, wd, grad_scale);
      if (m) tt_state_store(sg->state, 1, sg->m, sg->count, j0, n, mt);
    }
  }
  return 0;
}

int tt_ref_adam_update_held(tt_backend *b, const tt_update_seg *segs, int nseg, float lr, float beta1, float beta2,
                            float eps, float weight_decay, int decoupled, int t, float grad_scale, const tt_clip *clip,
                            const int32_t *skip) {
  int nt = tt_ref_threads(b), go;
  (void)nt;
  if (t < 1) return tt_ref_fail(b, "adam_update_held: step t=%d must be >= 1", t);
  go = ref_lo_held_begin(b, "adam_update_held", segs, nseg, 1, 0.0f, clip, skip, &grad_scale);
  if (go) return go < 0 ? -1 : 0;
  for (int i = 0; i < nseg; i++) {
    const tt_update_seg *sg = &segs[i];
    float wd = sg->decay ? weight_decay : 0.0f;
    tt_adam_consts k = tt_adam_make_consts(lr, beta1, beta2, wd, decoupled, t); /* as adam_update makes them */
    ptrdiff_t nblk = (ptrdiff_t)tt_state_blocks(sg->count), blk;
#pragma omp parallel for schedule(static) num_threads(nt) if (sg->count > TT_REF_PAR_MIN)
    for (blk = 0; blk < nblk; blk++) {
      size_t j0 = (size_t)blk * TT_STATE_BLOCK, n = sg->count - j0 < TT_STATE_BLOCK ? sg->count - j0 : TT_STATE_BLOCK;
      float mt[TT_STATE_BLOCK], vt[TT_STATE_BLOCK];
      tt_state_load(sg->state, 1, sg->m, sg->count, j0, n, mt);
      tt_state_load(sg->state, 0, sg->v, sg->count, j0, n, vt);
      for (size_t e = 0; e < n; e++)
        tt_adam_elem(e, sg->w + j0, sg->g + j0, mt, vt, beta1, beta2, eps, wd, decoupled, k, grad_scale);
      tt_state_store(sg->state, 1, sg->m, sg->count, j0, n, mt);
      tt_state_store(sg->state, 0, sg->v, sg->count, j0, n, vt);
    }
  }
  return 0;
}

int tt_ref_check_finite(tt_backend *b, size_t count, tt_dtype dt, const void *x, int32_t *flag) {
  ptrdiff_t i, n = (ptrdiff_t)count;
  int bad = 0, nt = tt_ref_threads(b);
  (void)nt;
  if (tt_ref_dt_check(b, "check_finite", dt)) return -1;
  if (!flag || (count && !x)) return tt_ref_fail(b, "check_finite: NULL x or flag");
  if (dt == TT_F32) {
    const float *xs = (const float *)x;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad) if (n > TT_REF_PAR_MIN)
    for (i = 0; i < n; i++) {
      uint32_t u; /* exponent all ones = inf or NaN (immune to -ffast-math) */
      memcpy(&u, xs + i, 4);
      bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
  } else { /* the exponent field all ones: fp16 has 5 exponent bits, bf16 fp32's 8 */
    const uint16_t *u = (const uint16_t *)x;
    uint16_t e = dt == TT_BF16 ? 0x7f80u : 0x7c00u;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad) if (n > TT_REF_PAR_MIN)
    for (i = 0; i < n; i++) bad |= (u[i] & e) == e;
  }
  if (bad) flag[0] = 1;
  return 0;
}

/* check_finite over each segment in turn (backend.h check_finite_multi). */
int tt_ref_check_finite_multi(tt_backend *b, const tt_finite_seg *segs, int nseg, tt_dtype dt, int32_t *flag) {
  if (nseg < 0 || (nseg && !segs)) return tt_ref_fail(b, "check_finite_multi: %d tensors at %p", nseg, (const void *)segs);
  for (int i = 0; i < nseg; i++)
    if (tt_ref_check_finite(b, segs[i].count, dt, segs[i].x, flag)) return -1;
  return 0;
}

/* Fixed blocks of REF_LO_SS_BLOCK values, each summed in double in index order, the block sums
 * added in block order: the result depends on count only, not on the thread count. */
#define REF_LO_SS_BLOCK 4096

int tt_ref_sum_squares(tt_backend *b, size_t count, const float *g, float *acc) {
  int nt = tt_ref_threads(b);
  double total = 0.0;
  (void)nt;
  if (!acc || (count && !g)) return tt_ref_fail(b, "sum_squares: NULL g or acc");
  for (size_t i = 0; i < count; i += (size_t)REF_LO_SS_BLOCK * REF_LO_BLOCKS) {
    double part[REF_LO_BLOCKS];
    size_t left = count - i;
    ptrdiff_t nblk = (ptrdiff_t)((left + REF_LO_SS_BLOCK - 1) / REF_LO_SS_BLOCK), blk;
    if (nblk > REF_LO_BLOCKS) nblk = REF_LO_BLOCKS;
#pragma omp parallel for schedule(static) num_threads(nt) if (left > TT_REF_PAR_MIN)
    for (blk = 0; blk < nblk; blk++) {
      size_t j0 = i + (size_t)blk * REF_LO_SS_BLOCK, j1 = j0 + REF_LO_SS_BLOCK, j;
      double sq = 0.0;
      if (j1 > count) j1 = count;
      for (j = j0; j < j1; j++) sq += (double)g[j] * (double)g[j];
      part[blk] = sq;
    }
    for (blk = 0; blk < nblk; blk++) total += part[blk];
  }
  acc[0] += (float)total;
  return 0;
}
