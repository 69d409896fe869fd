// Vectorised exp for the attention inner loops: e[i] = exp(x[i]) for
// x <= 0 (softmax arguments are shifted by their running max). One Highway
// source (core/simd/simd-inl.h, ExpNonPositive) compiled for every SIMD
// target, dispatched at run time: a Cody-Waite reduction x = k ln2 + r, a
// Taylor polynomial for e^r on |r| <= ln2/2 (degree 13 in fp64, 7 in
// fp32; truncation error < 0.05 ulp) and an exact scaling by 2^k.
// Accuracy: within 2 ulp of the correctly rounded result, and the same bits
// on every target (tests/unit/core/simd/simd_targets_test.cc checks both).
// Any x below the underflow threshold, including -inf, gives +0; NaN stays
// NaN. x and e may alias.
//
// SoftCap: x[i] = cap * tanh(x[i] / cap) (cap > 0), the logit soft-cap,
// with the vector tanh of core/simd/simd-inl.h (expm1 by the same
// reduction, e / (e + 2)): within 3 ulp of the correctly rounded tanh, the
// same bits on every target and in the GPU's scalar twin
// (kernels/math/tanh.h); +-0, the sign and NaN are kept.
// Pure; thread-safe.
#ifndef ATTNAUDIT_CORE_ATTENTION_VEXP_H_
#define ATTNAUDIT_CORE_ATTENTION_VEXP_H_

#include <cstdint>

namespace attnaudit {

void ExpNonPositiveF64(const double* x, int64_t n, double* e);
void ExpNonPositiveF32(const float* x, int64_t n, float* e);
void SoftCapF64(double cap, double* x, int64_t n);
void SoftCapF32(float cap, float* x, int64_t n);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_VEXP_H_
