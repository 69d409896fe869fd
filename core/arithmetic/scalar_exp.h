// exp of a non-positive argument and log of a positive one, one element at
// a time, built from the correctly rounded operations of rounded_ops.h
// alone, so the host and the GPU (core/arithmetic/host_device.h) return the
// same bits -- where the platforms' expf/logf (glibc, CUDA's libdevice)
// differ by an ulp now and then.
//   - ExpNonPositive: the scalar twin of the CPU core's vector
//     ExpNonPositive (core/simd/simd-inl.h; core/attention/vexp.h), the
//     same Cody-Waite reduction, Taylor polynomial and two-step scaling by
//     2^k, operation for operation (tests/unit/kernels/kernel_math_test.cc
//     checks the bits). Every softmax weight and every merge weight of P.
//     Below the underflow threshold (-inf included) +0; NaN stays NaN.
//   - LogPositive: fp32 ln x through fp64 (x = 2^k m, ln m = 2 atanh(s),
//     s = (m - 1) / (m + 1)), rounded once to fp32: P's unit and merge
//     LSEs (docs/NUMERICS.md, "CPU and GPU").
// Pure; thread-safe.
#ifndef ATTNAUDIT_CORE_ARITHMETIC_SCALAR_EXP_H_
#define ATTNAUDIT_CORE_ARITHMETIC_SCALAR_EXP_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"
#include "core/arithmetic/rounded_ops.h"

namespace attnaudit {
namespace rounded {

// p * 2^k for integral k in [-150, 0] (exp) or [0, 56] (tanh's expm1) as
// two exact power-of-two scalings, so a subnormal result rounds once.
ATTNAUDIT_HOST_DEVICE inline float ScaleByPow2(float p, float k) {
  using F = Ops<float>;
  const int32_t ki = static_cast<int32_t>(k);
  const int32_t k1 = ki >> 1;  // arithmetic: floor(k / 2)
  const int32_t k2 = ki - k1;
  const float s1 = BitsAsFloat(static_cast<uint32_t>(k1 + 127) << 23);
  const float s2 = BitsAsFloat(static_cast<uint32_t>(k2 + 127) << 23);
  return F::Mul(F::Mul(p, s1), s2);
}

ATTNAUDIT_HOST_DEVICE inline double ScaleByPow2(double p, double k) {
  using F = Ops<double>;
  const int64_t ki = static_cast<int64_t>(k);
  const int64_t k1 = ki >> 1;
  const int64_t k2 = ki - k1;
  const double s1 = BitsAsDouble(static_cast<uint64_t>(k1 + 1023) << 52);
  const double s2 = BitsAsDouble(static_cast<uint64_t>(k2 + 1023) << 52);
  return F::Mul(F::Mul(p, s1), s2);
}

// x = k ln2 + r, |r| <= ln2/2: the core's ReduceLn2, for exp and tanh.
// Returns r; k goes to *k.
ATTNAUDIT_HOST_DEVICE inline float ReduceLn2(float x, float* k) {
  using F = Ops<float>;
  *k = F::Rint(F::Mul(x, 1.44269504f));
  const float r = F::Fma(-*k, 0.693359375f, x);
  return F::Fma(-*k, -2.12194440e-4f, r);
}

ATTNAUDIT_HOST_DEVICE inline double ReduceLn2(double x, double* k) {
  using F = Ops<double>;
  *k = F::Rint(F::Mul(x, 1.4426950408889634));
  const double r = F::Fma(-*k, 6.93147180369123816490e-01, x);
  return F::Fma(-*k, 1.90821492927058770002e-10, r);
}

// fp32: degree 7, within 2 ulp.
ATTNAUDIT_HOST_DEVICE inline float ExpNonPositive(float x) {
  using F = Ops<float>;
  if (x != x) return x;
  const float underflow = -103.98f;
  if (x < underflow) return 0.0f;
  float k;
  const float r = ReduceLn2(x, &k);
  float p = 1.0f / 5040.0f;
  p = F::Fma(p, r, 1.0f / 720.0f);
  p = F::Fma(p, r, 1.0f / 120.0f);
  p = F::Fma(p, r, 1.0f / 24.0f);
  p = F::Fma(p, r, 1.0f / 6.0f);
  p = F::Fma(p, r, 0.5f);
  p = F::Fma(p, r, 1.0f);
  p = F::Fma(p, r, 1.0f);
  return ScaleByPow2(p, k);
}

// fp64: degree 13, within 2 ulp.
ATTNAUDIT_HOST_DEVICE inline double ExpNonPositive(double x) {
  using F = Ops<double>;
  if (x != x) return x;
  const double underflow = -745.2;
  if (x < underflow) return 0.0;
  double k;
  const double r = ReduceLn2(x, &k);
  double p = 1.0 / 6227020800.0;
  p = F::Fma(p, r, 1.0 / 479001600.0);
  p = F::Fma(p, r, 1.0 / 39916800.0);
  p = F::Fma(p, r, 1.0 / 3628800.0);
  p = F::Fma(p, r, 1.0 / 362880.0);
  p = F::Fma(p, r, 1.0 / 40320.0);
  p = F::Fma(p, r, 1.0 / 5040.0);
  p = F::Fma(p, r, 1.0 / 720.0);
  p = F::Fma(p, r, 1.0 / 120.0);
  p = F::Fma(p, r, 1.0 / 24.0);
  p = F::Fma(p, r, 1.0 / 6.0);
  p = F::Fma(p, r, 0.5);
  p = F::Fma(p, r, 1.0);
  p = F::Fma(p, r, 1.0);
  return ScaleByPow2(p, k);
}

// ln x for fp32 x: NaN and x < 0 give NaN, +-0 gives -inf, +inf gives
// +inf; every other x (subnormals too) within half an ulp and a hair of
// the exact value.
ATTNAUDIT_HOST_DEVICE inline float LogPositive(float x) {
  using F = Ops<double>;
  if (x != x) return x;
  if (x == 0.0f) return Ops<float>::NegInf();
  if (x < 0.0f) return BitsAsFloat(0x7fc00000u);  // quiet NaN
  if (x == -Ops<float>::NegInf()) return x;
  // x is a normal double: its exponent and its mantissa in [1, 2), the
  // mantissa then moved to [sqrt(1/2), sqrt(2)) so |s| <= 0.1716.
  const uint64_t bits = DoubleBits(static_cast<double>(x));
  double k =
      static_cast<double>(static_cast<int64_t>((bits >> 52) & 0x7ff) - 1023);
  double m =
      BitsAsDouble((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  // A select, not a branch: a merge's weight sum lands on either side of
  // sqrt(2) at random in P's merge tree.
  const bool high = m > 1.4142135623730951;
  m = high ? F::Mul(m, 0.5) : m;
  k = high ? F::Add(k, 1.0) : k;
  const double s = F::Div(F::Sub(m, 1.0), F::Add(m, 1.0));
  const double s2 = F::Mul(s, s);
  // 2 atanh(s) = 2s (1 + s^2/3 + s^4/5 + ...): the terms from s^14 on are
  // below 2^-40 of the sum.
  double p = 1.0 / 13.0;
  p = F::Fma(p, s2, 1.0 / 11.0);
  p = F::Fma(p, s2, 1.0 / 9.0);
  p = F::Fma(p, s2, 1.0 / 7.0);
  p = F::Fma(p, s2, 1.0 / 5.0);
  p = F::Fma(p, s2, 1.0 / 3.0);
  const double two_s = F::Add(s, s);
  const double log_m = F::Fma(two_s, F::Mul(s2, p), two_s);
  return static_cast<float>(F::Fma(k, 0.6931471805599453, log_m));
}

}  // namespace rounded
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ARITHMETIC_SCALAR_EXP_H_
