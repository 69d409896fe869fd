// The per-element part of the drift statistics (core/drift/drift.h,
// ComputeDrift), host and device: how one (candidate, baseline) pair enters
// the statistics, its ULP distance in the comparison's dtype, and the
// max_rel floor. The GPU reduction (kernels/drift_kernels.cu) applies these
// to every element and reduces the results; the unit tests run them on the
// CPU in element order and must reproduce core's ComputeDrift exactly.
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_KERNELS_MATH_DRIFT_ELEMENT_H_
#define ATTNAUDIT_KERNELS_MATH_DRIFT_ELEMENT_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"
#include "kernels/math/scalar.h"
#include "kernels/math/widen.h"

#ifndef ATTNAUDIT_DEVICE_CODE
#include <cmath>
#endif

namespace attnaudit {
namespace kmath {

ATTNAUDIT_HOST_DEVICE inline bool IsNan(double x) { return x != x; }
ATTNAUDIT_HOST_DEVICE inline bool IsInf(double x) {
  return !IsNan(x) && x - x != 0.0;
}
ATTNAUDIT_HOST_DEVICE inline double Abs(double x) { return x < 0 ? -x : x; }
ATTNAUDIT_HOST_DEVICE inline double MaxFinite() {
  return BitsAsDouble(0x7fefffffffffffffull);
}

enum PairKind : int { kPairValue = 0, kPairAgree = 1, kPairMismatch = 2 };

// How a pair enters the statistics; *abs_diff for kPairValue. Equal values
// (equal infinities included) are a value with diff 0; both NaN agree and
// carry no value; any other pair with a NaN/Inf side is a mismatch.
ATTNAUDIT_HOST_DEVICE inline int ClassifyPair(double c, double r,
                                              double* abs_diff) {
  if (c == r) {
    *abs_diff = 0;
    return kPairValue;
  }
  if (IsNan(c) || IsInf(c) || IsNan(r) || IsInf(r)) {
    return IsNan(c) && IsNan(r) ? kPairAgree : kPairMismatch;
  }
  const double d = Abs(Ops<double>::Sub(c, r));
  *abs_diff = d <= MaxFinite() ? d : MaxFinite();
  return kPairValue;
}

// core/tensor dtype's small formats (f16, fp8), as core encodes them from
// a double: round to nearest even at the format's quantum, saturating fp8.
// Device code cannot read core/tensor/dtype_traits.h's table; FormatOf,
// SmallestNormal and ElemBytes (widen.h) are its copy, which
// kernel_math_test keeps equal to it.
struct SmallFormat {
  int ebits;
  int mbits;
  int bias;
  bool has_inf;
  double max_finite;
  bool saturate;
};

ATTNAUDIT_HOST_DEVICE inline SmallFormat FormatOf(int dtype) {
  if (dtype == kElemF16) return {5, 10, 15, true, 65504.0, false};
  if (dtype == kElemF8E4M3) return {4, 3, 7, false, 448.0, true};
  return {5, 2, 15, true, 57344.0, true};  // e5m2
}

ATTNAUDIT_HOST_DEVICE inline double Ldexp(double x, int e) {
#ifdef ATTNAUDIT_DEVICE_CODE
  return ldexp(x, e);
#else
  return std::ldexp(x, e);
#endif
}

ATTNAUDIT_HOST_DEVICE inline uint32_t EncodeSmall(double f,
                                                  const SmallFormat& fmt) {
  const uint32_t sign_bit = 1u << (fmt.ebits + fmt.mbits);
  const uint32_t sign = (DoubleBits(f) >> 63) != 0 ? sign_bit : 0u;
  const uint32_t exp_all = (1u << fmt.ebits) - 1;
  const uint32_t mant_all = (1u << fmt.mbits) - 1;
  const uint32_t max_code =
      fmt.has_inf ? (((1u << fmt.ebits) - 2) << fmt.mbits) | mant_all
                  : (exp_all << fmt.mbits) | (mant_all - 1);
  if (IsNan(f)) return sign | (exp_all << fmt.mbits) | mant_all;
  const double a = Abs(f);
  const uint32_t inf_code = fmt.has_inf ? (exp_all << fmt.mbits) : 0u;
  if (IsInf(a))
    return sign | (fmt.has_inf && !fmt.saturate ? inf_code : max_code);
  if (a == 0.0) return sign;
  int e2 = 0;
#ifdef ATTNAUDIT_DEVICE_CODE
  frexp(a, &e2);
#else
  std::frexp(a, &e2);
#endif
  int exponent = e2 - 1;
  const int min_exp = 1 - fmt.bias;
  if (exponent < min_exp) exponent = min_exp;
  const double quantum = Ldexp(1.0, exponent - fmt.mbits);
  double q = Ops<double>::Rint(Ops<double>::Div(a, quantum));
  const double implicit = Ldexp(1.0, fmt.mbits);
  if (q >= 2 * implicit) {
    exponent += 1;
    q = implicit;
  }
  const double value = Ops<double>::Mul(q, Ldexp(1.0, exponent - fmt.mbits));
  if (value > fmt.max_finite) {
    if (fmt.saturate || !fmt.has_inf) return sign | max_code;
    return sign | inf_code;
  }
  if (q < implicit) return sign | static_cast<uint32_t>(q);
  const uint32_t exp_field = static_cast<uint32_t>(exponent + fmt.bias);
  return sign | (exp_field << fmt.mbits) | static_cast<uint32_t>(q - implicit);
}

// f32 -> bf16 code, round to nearest even (NaN kept quiet), as core's.
ATTNAUDIT_HOST_DEVICE inline uint32_t Bf16Code(float f) {
  uint32_t bits;
#ifdef ATTNAUDIT_DEVICE_CODE
  bits = __float_as_uint(f);
#else
  std::memcpy(&bits, &f, sizeof bits);
#endif
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x40u;
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

ATTNAUDIT_HOST_DEVICE inline int64_t OrderedCode(uint64_t code, int sign_bit) {
  const uint64_t sign = uint64_t{1} << sign_bit;
  const int64_t magnitude = static_cast<int64_t>(code & (sign - 1));
  return (code & sign) ? -magnitude : magnitude;
}

// The code of x rounded to `dtype`, ordered like the values.
ATTNAUDIT_HOST_DEVICE inline int64_t OrderedIn(double x, int dtype) {
  switch (dtype) {
    case kElemF64:
      return OrderedCode(DoubleBits(x), 63);
    case kElemBF16:
      return OrderedCode(Bf16Code(static_cast<float>(x)), 15);
    case kElemF16:
      return OrderedCode(EncodeSmall(x, FormatOf(dtype)), 15);
    case kElemF8E4M3:
    case kElemF8E5M2:
      return OrderedCode(EncodeSmall(x, FormatOf(dtype)), 7);
    default: {
      const float f = static_cast<float>(x);
      uint32_t bits;
#ifdef ATTNAUDIT_DEVICE_CODE
      bits = __float_as_uint(f);
#else
      std::memcpy(&bits, &f, sizeof bits);
#endif
      return OrderedCode(bits, 31);
    }
  }
}

// ULP distance of two finite values in `dtype` (as a double, as core's
// statistics hold it).
ATTNAUDIT_HOST_DEVICE inline double UlpIn(double a, double b, int dtype) {
  const uint64_t ua = static_cast<uint64_t>(OrderedIn(a, dtype));
  const uint64_t ub = static_cast<uint64_t>(OrderedIn(b, dtype));
  const int64_t sa = static_cast<int64_t>(ua);
  const int64_t sb = static_cast<int64_t>(ub);
  return static_cast<double>(sa > sb ? ua - ub : ub - ua);
}

// The max_rel denominator floor: the dtype's smallest normal value.
ATTNAUDIT_HOST_DEVICE inline double SmallestNormal(int dtype) {
  switch (dtype) {
    case kElemF16:
      return Ldexp(1.0, -14);
    case kElemBF16:
      return Ldexp(1.0, -126);
    case kElemF8E4M3:
      return Ldexp(1.0, -6);
    case kElemF8E5M2:
      return Ldexp(1.0, -14);
    case kElemF64:
      return BitsAsDouble(0x0010000000000000ull);
    default:
      return Ldexp(1.0, -126);
  }
}

}  // namespace kmath
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_MATH_DRIFT_ELEMENT_H_
