// tanh(x), one element at a time: the scalar twin of the CPU core's vector
// Tanh (core/simd/simd-inl.h), operation for operation, so it returns the
// same bits (tests/unit/kernels/kernel_math_test.cc checks it against the
// core): tanh(|x|) = e / (e + 2), e = expm1(2|x|) by exp's Cody-Waite
// reduction and a Taylor polynomial, with the sign of x; |x| from the
// threshold on, where tanh rounds to 1, gives +-1; NaN stays NaN. Within 3
// ulp of the correctly rounded result. The GPU kernels use it for the
// logit soft-cap, so the device caps scores as the CPU does.
// Pure; thread-safe.
#ifndef ATTNAUDIT_KERNELS_MATH_TANH_H_
#define ATTNAUDIT_KERNELS_MATH_TANH_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"
#include "kernels/math/exp.h"
#include "kernels/math/scalar.h"

namespace attnaudit {
namespace kmath {

ATTNAUDIT_HOST_DEVICE inline double Tanh(double x) {
  using F = Ops<double>;
  if (x != x) return x;
  const uint64_t sign = DoubleBits(x) & (uint64_t{1} << 63);
  const double magnitude = BitsAsDouble(DoubleBits(x) & ~(uint64_t{1} << 63));
  const double one_from = 19.1;  // 1 - tanh(19.1) < 2^-54
  double t = 1.0;
  if (magnitude < one_from) {
    double k;
    const double r = ReduceLn2(F::Add(magnitude, magnitude), &k);
    double p = 1.0 / 87178291200.0;
    p = F::Fma(p, r, 1.0 / 6227020800.0);
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
    const double expm1_r = F::Fma(r, F::Mul(r, p), r);
    const double two_k = ScaleByPow2(1.0, k);
    const double e = F::Fma(two_k, expm1_r, F::Sub(two_k, 1.0));
    t = F::Div(e, F::Add(e, 2.0));
  }
  return BitsAsDouble(DoubleBits(t) | sign);
}

ATTNAUDIT_HOST_DEVICE inline float Tanh(float x) {
  using F = Ops<float>;
  if (x != x) return x;
  const uint32_t sign = FloatBits(x) & 0x80000000u;
  const float magnitude = BitsAsFloat(FloatBits(x) & 0x7fffffffu);
  const float one_from = 9.1f;  // 1 - tanh(9.1) < 2^-25
  float t = 1.0f;
  if (magnitude < one_from) {
    float k;
    const float r = ReduceLn2(F::Add(magnitude, magnitude), &k);
    float p = 1.0f / 362880.0f;
    p = F::Fma(p, r, 1.0f / 40320.0f);
    p = F::Fma(p, r, 1.0f / 5040.0f);
    p = F::Fma(p, r, 1.0f / 720.0f);
    p = F::Fma(p, r, 1.0f / 120.0f);
    p = F::Fma(p, r, 1.0f / 24.0f);
    p = F::Fma(p, r, 1.0f / 6.0f);
    p = F::Fma(p, r, 0.5f);
    const float expm1_r = F::Fma(r, F::Mul(r, p), r);
    const float two_k = ScaleByPow2(1.0f, k);
    const float e = F::Fma(two_k, expm1_r, F::Sub(two_k, 1.0f));
    t = F::Div(e, F::Add(e, 2.0f));
  }
  return BitsAsFloat(FloatBits(t) | sign);
}

}  // namespace kmath
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_MATH_TANH_H_
