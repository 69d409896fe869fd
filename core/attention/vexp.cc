// Dispatching entry points for the vectorised exp and soft-cap of
// core/simd/simd-inl.h (the fused pass calls the per-target versions
// directly).
// clang-format off: foreach_target.h must come first, before the
// headers it re-includes for every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/attention/vexp.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include "core/attention/vexp.h"
#include "core/simd/dispatch.h"
#include "core/simd/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

void ExpF64Impl(const double* x, int64_t n, double* e) {
  ExpNonPositiveArray(DF64(), x, n, e);
}

void ExpF32Impl(const float* x, int64_t n, float* e) {
  ExpNonPositiveArray(DF32(), x, n, e);
}

void SoftCapF64Impl(double cap, double* x, int64_t n) {
  SoftCapArray(DF64(), cap, x, n);
}

void SoftCapF32Impl(float cap, float* x, int64_t n) {
  SoftCapArray(DF32(), cap, x, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {

ATTNAUDIT_SIMD_EXPORT(ExpF64Impl);
ATTNAUDIT_SIMD_EXPORT(ExpF32Impl);
ATTNAUDIT_SIMD_EXPORT(SoftCapF64Impl);
ATTNAUDIT_SIMD_EXPORT(SoftCapF32Impl);

void ExpNonPositiveF64(const double* x, int64_t n, double* e) {
  ATTNAUDIT_SIMD_DISPATCH(ExpF64Impl)(x, n, e);
}

void ExpNonPositiveF32(const float* x, int64_t n, float* e) {
  ATTNAUDIT_SIMD_DISPATCH(ExpF32Impl)(x, n, e);
}

void SoftCapF64(double cap, double* x, int64_t n) {
  ATTNAUDIT_SIMD_DISPATCH(SoftCapF64Impl)(cap, x, n);
}

void SoftCapF32(float cap, float* x, int64_t n) {
  ATTNAUDIT_SIMD_DISPATCH(SoftCapF32Impl)(cap, x, n);
}

}  // namespace attnaudit
#endif  // HWY_ONCE
