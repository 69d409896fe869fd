// Vectorised exp for the attention inner loops: e[i] = exp(x[i]) for
// x <= 0 (softmax arguments are shifted by their running max). One Highway
// source (core/simd/simd-inl.h, ExpNonPositive) compiled for every SIMD
// target, dispatched at run time: a Cody-Waite reduction x = k ln2 + r, a
// Taylor polynomial for e^r on |r| <= ln2/2 (degree 13 in fp64, 7 in
// fp32; truncation error < 0.05 ulp) and an exact scaling by 2^k.
// Accuracy: within 2 ulp of the correctly rounded result, and the same bits
// on every target (tests/unit/core/attention/vexp_test.cc checks both).
// Any x below the underflow threshold, including -inf, gives +0; NaN stays
// NaN. x and e may alias. Pure; thread-safe.
#ifndef ATTNAUDIT_CORE_ATTENTION_VEXP_H_
#define ATTNAUDIT_CORE_ATTENTION_VEXP_H_

#include <cstdint>

namespace attnaudit {

void ExpNonPositiveF64(const double* x, int64_t n, double* e);
void ExpNonPositiveF32(const float* x, int64_t n, float* e);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_VEXP_H_
