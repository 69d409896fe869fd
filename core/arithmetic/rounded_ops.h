// Correctly rounded scalar operations in float and double, host and
// device alike (core/arithmetic/host_device.h): the one spelling of IEEE
// arithmetic that the CPU merge routine (core/attention/merge_step.h) and
// the CUDA kernels' per-block math (kernels/math/) share. Each is one IEEE
// operation: nvcc never contracts the _rn intrinsics into an FMA, and the
// host is compiled with -ffp-contract=off, so a formula spelled with these
// functions rounds the same way everywhere. Fma is the one fused operation
// (as the CPU core's ExactMulAdd). The math library functions (exp, log)
// are the platform's: glibc on the host, CUDA's on the device (the soft-cap's
// tanh is the core's own, kernels/math/tanh.h).
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_CORE_ARITHMETIC_ROUNDED_OPS_H_
#define ATTNAUDIT_CORE_ARITHMETIC_ROUNDED_OPS_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"

#ifndef ATTNAUDIT_DEVICE_CODE
#include <cmath>
#include <cstring>
#include <limits>
#endif

namespace attnaudit {
namespace rounded {

template <typename T>
struct Ops;

template <>
struct Ops<float> {
  ATTNAUDIT_HOST_DEVICE static float Mul(float a, float b) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
  }
  ATTNAUDIT_HOST_DEVICE static float Add(float a, float b) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
  }
  ATTNAUDIT_HOST_DEVICE static float Sub(float a, float b) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
  }
  ATTNAUDIT_HOST_DEVICE static float Div(float a, float b) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
  }
  ATTNAUDIT_HOST_DEVICE static float Fma(float a, float b, float c) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
  }
  ATTNAUDIT_HOST_DEVICE static float Exp(float x) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return expf(x);
#else
    return std::exp(x);
#endif
  }
  ATTNAUDIT_HOST_DEVICE static float Log(float x) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return logf(x);
#else
    return std::log(x);
#endif
  }
  // Round to nearest, ties to even (the current rounding mode).
  ATTNAUDIT_HOST_DEVICE static float Rint(float x) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return rintf(x);
#else
    return std::nearbyint(x);
#endif
  }
  ATTNAUDIT_HOST_DEVICE static float NegInf() {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __int_as_float(static_cast<int>(0xff800000u));
#else
    return -std::numeric_limits<float>::infinity();
#endif
  }
  ATTNAUDIT_HOST_DEVICE static float Fmax(float a, float b) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return fmaxf(a, b);
#else
    return std::fmax(a, b);
#endif
  }
  ATTNAUDIT_HOST_DEVICE static bool IsFinite(float x) {
    return x - x == 0.0f;  // NaN for Inf and NaN
  }
};

template <>
struct Ops<double> {
  ATTNAUDIT_HOST_DEVICE static double Mul(double a, double b) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
  }
  ATTNAUDIT_HOST_DEVICE static double Add(double a, double b) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
  }
  ATTNAUDIT_HOST_DEVICE static double Sub(double a, double b) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
  }
  ATTNAUDIT_HOST_DEVICE static double Div(double a, double b) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
  }
  ATTNAUDIT_HOST_DEVICE static double Fma(double a, double b, double c) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __fma_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
  }
  ATTNAUDIT_HOST_DEVICE static double Exp(double x) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return exp(x);
#else
    return std::exp(x);
#endif
  }
  ATTNAUDIT_HOST_DEVICE static double Log(double x) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return log(x);
#else
    return std::log(x);
#endif
  }
  ATTNAUDIT_HOST_DEVICE static double Rint(double x) {
#ifdef ATTNAUDIT_DEVICE_CODE
    return rint(x);
#else
    return std::nearbyint(x);
#endif
  }
  ATTNAUDIT_HOST_DEVICE static double NegInf() {
#ifdef ATTNAUDIT_DEVICE_CODE
    return __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
#else
    return -std::numeric_limits<double>::infinity();
#endif
  }
  ATTNAUDIT_HOST_DEVICE static bool IsFinite(double x) { return x - x == 0.0; }
};

// Bit casts, host and device.
ATTNAUDIT_HOST_DEVICE inline float BitsAsFloat(uint32_t bits) {
#ifdef ATTNAUDIT_DEVICE_CODE
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}
ATTNAUDIT_HOST_DEVICE inline double BitsAsDouble(uint64_t bits) {
#ifdef ATTNAUDIT_DEVICE_CODE
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}
ATTNAUDIT_HOST_DEVICE inline uint32_t FloatBits(float x) {
#ifdef ATTNAUDIT_DEVICE_CODE
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}
ATTNAUDIT_HOST_DEVICE inline uint64_t DoubleBits(double x) {
#ifdef ATTNAUDIT_DEVICE_CODE
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}

// The running max of the CPU kernels (std::max(a, b) = a < b ? b : a, in
// key order): a NaN score never replaces the max, and a NaN first value
// stays, exactly as on the CPU.
template <typename T>
ATTNAUDIT_HOST_DEVICE inline T MaxStep(T acc, T x) {
  return acc < x ? x : acc;
}

}  // namespace rounded
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ARITHMETIC_ROUNDED_OPS_H_
