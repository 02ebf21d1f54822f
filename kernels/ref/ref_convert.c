/* kernels/ref/ref_convert.c — the reference backend's fp16/bf16 <-> fp32 conversions (the scalar
 * forms are inline in ref.h): whole tensors, threaded, and the library's public wrappers. */
#include "ref_internal.h"

void tt_ref_to_f32(tt_backend *b, tt_dtype dt, const void *src, float *dst, size_t count) {
  if (dt == TT_F32) {
    if ((const void *)dst != src) memcpy(dst, src, count * sizeof(float));
    return;
  }
  {
    const uint16_t *s = (const uint16_t *)src;
    ptrdiff_t i, cnt = (ptrdiff_t)count;
    int nt = tt_ref_threads(b);
    (void)nt;
    if (dt == TT_BF16) {
#pragma omp parallel for schedule(static) num_threads(nt) if (cnt > TT_REF_PAR_MIN)
      for (i = 0; i < cnt; i++) dst[i] = tt_bf16_to_f32(s[i]);
      return;
    }
#pragma omp parallel for schedule(static) num_threads(nt) if (cnt > TT_REF_PAR_MIN)
    for (i = 0; i < cnt; i++) dst[i] = tt_ref_h2f(s[i]);
  }
}

void tt_ref_from_f32(tt_backend *b, tt_dtype dt, const float *src, void *dst, size_t count) {
  if (dt == TT_F32) {
    if ((const void *)src != dst) memcpy(dst, src, count * sizeof(float));
    return;
  }
  {
    uint16_t *d = (uint16_t *)dst;
    ptrdiff_t i, cnt = (ptrdiff_t)count;
    int nt = tt_ref_threads(b);
    (void)nt;
    if (dt == TT_BF16) {
#pragma omp parallel for schedule(static) num_threads(nt) if (cnt > TT_REF_PAR_MIN)
      for (i = 0; i < cnt; i++) d[i] = tt_bf16_from_f32(src[i]);
      return;
    }
#pragma omp parallel for schedule(static) num_threads(nt) if (cnt > TT_REF_PAR_MIN)
    for (i = 0; i < cnt; i++) d[i] = tt_ref_f2h(src[i]);
  }
}

uint16_t tt_f32_to_f16(float f) { return tt_ref_f2h(f); }
float tt_f16_to_f32(uint16_t h) { return tt_ref_h2f(h); }
