// Exact widening of one K/V element to float (and, for f64 pages, to
// double), host and device: the kernels' twin of the CPU core's widening
// (core/tensor/dtype.h; core/simd WidenRow). bf16, f16 and fp8 are subsets
// of f32, so widening is exact and every platform agrees; an f64 element
// is rounded to float for P (as the CPU's sweep buffers hold it) and kept
// exact for R. dtype codes are core's DType numbers. Pure; thread-safe.
#ifndef ATTNAUDIT_KERNELS_MATH_WIDEN_H_
#define ATTNAUDIT_KERNELS_MATH_WIDEN_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"
#include "kernels/math/scalar.h"

namespace attnaudit {
namespace kmath {

// core/tensor/dtype.h DType values (its numbering is the wire's).
enum ElemType : int {
  kElemF32 = 1,
  kElemF16 = 2,
  kElemBF16 = 3,
  kElemF8E4M3 = 4,
  kElemF8E5M2 = 5,
  kElemF64 = 6,
};

ATTNAUDIT_HOST_DEVICE constexpr int ElemBytes(int dtype) {
  switch (dtype) {
    case kElemF32:
      return 4;
    case kElemF16:
    case kElemBF16:
      return 2;
    case kElemF8E4M3:
    case kElemF8E5M2:
      return 1;
    case kElemF64:
      return 8;
    default:
      return 0;
  }
}

ATTNAUDIT_HOST_DEVICE inline float Bf16Bits(uint16_t h) {
  return BitsAsFloat(static_cast<uint32_t>(h) << 16);
}

ATTNAUDIT_HOST_DEVICE inline float F16Bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float v =
        Ops<float>::Mul(static_cast<float>(man), 5.9604644775390625e-8f);
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return BitsAsFloat(sign | 0x7f800000u | (man << 13));
  return BitsAsFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

// OCP e4m3fn: no infinities; 0x7f / 0xff are NaN.
ATTNAUDIT_HOST_DEVICE inline float F8E4M3Bits(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v >> 7) << 31;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t man = v & 0x7u;
  if ((v & 0x7fu) == 0x7fu) return BitsAsFloat(sign | 0x7fc00000u);
  if (exp == 0) {  // man * 2^-9
    const float x = Ops<float>::Mul(static_cast<float>(man), 0.001953125f);
    return sign != 0 ? -x : x;
  }
  return BitsAsFloat(sign | ((exp + 120u) << 23) | (man << 20));
}

// OCP e5m2: the top byte of an IEEE half.
ATTNAUDIT_HOST_DEVICE inline float F8E5M2Bits(uint8_t v) {
  return F16Bits(static_cast<uint16_t>(static_cast<uint16_t>(v) << 8));
}

// Element i of a buffer of `dtype` as float (f64 rounded to nearest).
ATTNAUDIT_HOST_DEVICE inline float WidenToFloat(const void* base, int dtype,
                                                int64_t i) {
  switch (dtype) {
    case kElemF32:
      return static_cast<const float*>(base)[i];
    case kElemF16:
      return F16Bits(static_cast<const uint16_t*>(base)[i]);
    case kElemBF16:
      return Bf16Bits(static_cast<const uint16_t*>(base)[i]);
    case kElemF8E4M3:
      return F8E4M3Bits(static_cast<const uint8_t*>(base)[i]);
    case kElemF8E5M2:
      return F8E5M2Bits(static_cast<const uint8_t*>(base)[i]);
    default:
      return static_cast<float>(static_cast<const double*>(base)[i]);
  }
}

// The N elements held in four little-endian 32-bit words (16 bytes of a
// 4-, 2- or 1-byte dtype: N = 4, 8 or 16), widened as WidenToFloat widens
// them, into f; true when one is not finite. The GPU pass widens its pages
// 16 bytes at a time this way.
template <int N>
ATTNAUDIT_HOST_DEVICE inline bool WidenWords(const uint32_t (&words)[4],
                                             int dtype, float (&f)[N]) {
  static_assert(N == 4 || N == 8 || N == 16, "16 bytes of a 4/2/1-byte type");
  constexpr int kPerWord = N / 4;
  constexpr int kBits = 32 / kPerWord;
  bool bad = false;
  for (int e = 0; e < N; ++e) {
    const uint32_t word = words[e / kPerWord];
    const uint32_t bits = kPerWord == 1 ? word
                                        : (word >> ((e % kPerWord) * kBits)) &
                                              ((1u << kBits) - 1u);
    if (N == 4) {
      f[e] = BitsAsFloat(bits);
    } else if (N == 8) {
      f[e] = dtype == kElemBF16 ? Bf16Bits(static_cast<uint16_t>(bits))
                                : F16Bits(static_cast<uint16_t>(bits));
    } else {
      f[e] = dtype == kElemF8E4M3 ? F8E4M3Bits(static_cast<uint8_t>(bits))
                                  : F8E5M2Bits(static_cast<uint8_t>(bits));
    }
    bad |= !Ops<float>::IsFinite(f[e]);
  }
  return bad;
}

// Element i as double: exact for every dtype (f64 as stored).
ATTNAUDIT_HOST_DEVICE inline double WidenToDouble(const void* base, int dtype,
                                                  int64_t i) {
  if (dtype == kElemF64) return static_cast<const double*>(base)[i];
  return static_cast<double>(WidenToFloat(base, dtype, i));
}

}  // namespace kmath
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_MATH_WIDEN_H_
