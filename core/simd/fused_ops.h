// The core's exact multiply-add (ExactMulAdd in core/simd/simd-inl.h) over
// arrays, dispatched to the target in use: out[i] = a[i] * b[i] + c[i]
// with one rounding, as C's fma computes it. For the tests that hold every
// target to the fused operation's bits (the SSE4 target emulates it) and
// for benchmarks of that emulation; the hot loops inline the building
// block instead. Non-finite operands give what fma gives (NaN payloads
// aside). Pure; thread-safe.
#ifndef ATTNAUDIT_CORE_SIMD_FUSED_OPS_H_
#define ATTNAUDIT_CORE_SIMD_FUSED_OPS_H_

#include <cstdint>

namespace attnaudit {

void ExactMulAddArray(const double* a, const double* b, const double* c,
                      int64_t n, double* out);
void ExactMulAddArray(const float* a, const float* b, const float* c, int64_t n,
                      float* out);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_SIMD_FUSED_OPS_H_
