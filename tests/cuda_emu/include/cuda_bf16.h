/* tests/cuda_emu/include/cuda_bf16.h — __nv_bfloat16 for the host emulation of the CUDA backend.
 *
 * bfloat16 is the high half of an fp32: widening is a 16-bit shift (exact); narrowing rounds to
 * nearest even on the dropped 16 bits, what the device's cvt.rn.bf16.f32 (sm_80 and newer) and
 * the toolkit header's integer fallback (sm_75) both do: fp32 subnormals round like any other
 * value (bf16 has fp32's exponent range), values past the largest bf16 round to infinity, and any
 * NaN becomes the canonical 0x7fff. tests/cuda_emu/emu_selftest.cc checks the rounding against
 * an independent nearest-neighbour computation in double, ties and boundaries included.
 */
#ifndef TT_EMU_CUDA_BF16_H
#define TT_EMU_CUDA_BF16_H
#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

static inline float tt_emu_bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t tt_emu_f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu; /* NaN: canonical, as on the device */
  /* add just under half of the dropped part's range, plus the kept part's lowest bit: a tie
   * carries into the kept bits only when they are odd (round half to even) */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(tt_emu_f2bf(f)) {}
  __nv_bfloat16 &operator=(float f) {
    __x = tt_emu_f2bf(f);
    return *this;
  }
  operator float() const { return tt_emu_bf2f(__x); }
  operator __nv_bfloat16_raw() const {
    __nv_bfloat16_raw r;
    r.x = __x;
    return r;
  }
};

struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

static inline __nv_bfloat16 tt_emu_bf16_bits(unsigned short b) {
  __nv_bfloat16 h;
  h.__x = b;
  return h;
}
static inline float __bfloat162float(__nv_bfloat16 h) { return tt_emu_bf2f(h.__x); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return tt_emu_bf16_bits(tt_emu_f2bf(f)); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return tt_emu_bf16_bits(tt_emu_f2bf(f)); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return tt_emu_bf16_bits(b); }
static inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
static inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  __nv_bfloat162 r;
  r.x = __float2bfloat16_rn(a), r.y = __float2bfloat16_rn(b);
  return r;
}

#endif
