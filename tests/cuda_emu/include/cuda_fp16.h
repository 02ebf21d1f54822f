/* tests/cuda_emu/include/cuda_fp16.h — __half for the host emulation of the CUDA backend.
 *
 * IEEE binary16 stored in 16 bits; conversions round to nearest even, bit for bit what the
 * device's cvt.rn.f16.f32 does (including subnormals, overflow to infinity from 65520 up and a
 * canonical NaN, 0x7fff, for any NaN). Written independently of the CPU backend's
 * tt_f32_to_f16 so that the emulated test compares two implementations (tests/cuda_emu/
 * emu_selftest.cc checks all 65536 halves and the rounding boundaries against it).
 */
#ifndef TT_EMU_CUDA_FP16_H
#define TT_EMU_CUDA_FP16_H
#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

static inline float tt_emu_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  float f;
  if (e == 0x1f) {
    bits = m ? 0x7fffffffu : (sign | 0x7f800000u); /* the device gives a canonical NaN */
  } else if (e == 0) {
    if (!m) {
      bits = sign;
    } else { /* subnormal: m * 2^-24, exact in float */
      f = (float)m * (1.0f / 16777216.0f);
      memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  }
  memcpy(&f, &bits, 4);
  return f;
}

/* Rounds the magnitude mant * 2^exp2 (0 < mant < 2^62) to a half, nearest even; no sign. */
static inline uint16_t tt_emu_round_half(uint64_t mant, int exp2) {
  int e, ulp, shift;
  uint64_t q, rem = 0, halfway = 1;
  if (!mant) return 0;
  e = exp2 + 63 - __builtin_clzll(mant); /* the value lies in [2^e, 2^(e+1)) */
  if (e > 15) return 0x7c00u;
  ulp = e >= -14 ? e - 10 : -24; /* the half's last place: normal, or subnormal 2^-24 */
  shift = ulp - exp2;              /* low bits of mant below that place */
  if (shift >= 64) return 0;       /* below half the smallest subnormal */
  if (shift <= 0) {
    q = mant << -shift; /* exact: q < 2^11 */
  } else {
    q = mant >> shift;
    rem = mant & (((uint64_t)1 << shift) - 1);
    halfway = (uint64_t)1 << (shift - 1);
  }
  if (shift > 0 && (rem > halfway || (rem == halfway && (q & 1)))) q++;
  if (e < -14) return (uint16_t)q; /* subnormal; q == 0x400 is the smallest normal, same bits */
  if (q == 2048) q = 1024, e++;    /* rounded up to the next binade */
  if (e > 15) return 0x7c00u;
  return (uint16_t)(((uint32_t)(e + 15) << 10) | (uint32_t)(q - 1024));
}

static inline uint16_t tt_emu_f2h(float f) {
  uint32_t x, ax, sign;
  memcpy(&x, &f, 4);
  sign = (x >> 16) & 0x8000u;
  ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fffu; /* NaN */
  if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x00800000u) return (uint16_t)(sign | tt_emu_round_half(ax, -149)); /* float subnormal */
  return (uint16_t)(sign | tt_emu_round_half((ax & 0x7fffffu) | 0x800000u, (int)(ax >> 23) - 150));
}

static inline uint16_t tt_emu_d2h(double d) {
  uint64_t x, ax;
  uint16_t sign;
  memcpy(&x, &d, 8);
  sign = (uint16_t)((x >> 48) & 0x8000u);
  ax = x & 0x7fffffffffffffffull;
  if (ax > 0x7ff0000000000000ull) return 0x7fffu;
  if (ax == 0x7ff0000000000000ull) return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x0010000000000000ull) return (uint16_t)(sign | tt_emu_round_half(ax, -1074));
  return (uint16_t)(sign | tt_emu_round_half((ax & 0xfffffffffffffull) | 0x10000000000000ull, (int)(ax >> 52) - 1075));
}

struct __half_raw {
  unsigned short x;
};

struct __half {
  unsigned short __x;
  __half() = default;
  __half(const __half_raw &r) : __x(r.x) {}
  __half(float f) : __x(tt_emu_f2h(f)) {}
  __half(double d) : __x(tt_emu_d2h(d)) {}
  __half &operator=(float f) {
    __x = tt_emu_f2h(f);
    return *this;
  }
  operator float() const { return tt_emu_h2f(__x); }
  operator __half_raw() const {
    __half_raw r;
    r.x = __x;
    return r;
  }
};

struct __half2 {
  __half x, y;
};

static inline __half tt_emu_half_bits(unsigned short b) {
  __half h;
  h.__x = b;
  return h;
}
static inline float __half2float(__half h) { return tt_emu_h2f(h.__x); }
static inline __half __float2half_rn(float f) { return tt_emu_half_bits(tt_emu_f2h(f)); }
static inline __half __float2half(float f) { return tt_emu_half_bits(tt_emu_f2h(f)); }
static inline __half __double2half(double d) { return tt_emu_half_bits(tt_emu_d2h(d)); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline short __half_as_short(__half h) { return (short)h.__x; }
static inline __half __ushort_as_half(unsigned short b) { return tt_emu_half_bits(b); }
static inline __half __short_as_half(short b) { return tt_emu_half_bits((unsigned short)b); }
static inline float __low2float(__half2 v) { return __half2float(v.x); }
static inline float __high2float(__half2 v) { return __half2float(v.y); }
static inline __half2 __floats2half2_rn(float a, float b) {
  __half2 r;
  r.x = __float2half_rn(a), r.y = __float2half_rn(b);
  return r;
}
static inline __half2 __float2half2_rn(float a) { return __floats2half2_rn(a, a); }
/* Arithmetic rounds once: the exact result of two halves fits in a double. */
static inline __half __hadd(__half a, __half b) { return __double2half((double)__half2float(a) + __half2float(b)); }
static inline __half __hsub(__half a, __half b) { return __double2half((double)__half2float(a) - __half2float(b)); }
static inline __half __hmul(__half a, __half b) { return __double2half((double)__half2float(a) * __half2float(b)); }
static inline __half __hneg(__half a) { return tt_emu_half_bits((unsigned short)(a.__x ^ 0x8000u)); }
static inline __half __habs(__half a) { return tt_emu_half_bits((unsigned short)(a.__x & 0x7fffu)); }
static inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
static inline int __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u ? ((a.__x & 0x8000u) ? -1 : 1) : 0; }
static inline bool __hlt(__half a, __half b) { return __half2float(a) < __half2float(b); }
static inline bool __hgt(__half a, __half b) { return __half2float(a) > __half2float(b); }
static inline bool __heq(__half a, __half b) { return __half2float(a) == __half2float(b); }

#endif
