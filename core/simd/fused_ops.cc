// Dispatching entry points for ExactMulAdd over arrays (fused_ops.h).
// clang-format off: foreach_target.h must come first, before the
// headers it re-includes for every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/simd/fused_ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <cmath>

#include "core/simd/dispatch.h"
#include "core/simd/fused_ops.h"
#include "core/simd/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

template <typename T>
void MulAddArray(const T* a, const T* b, const T* c, int64_t n, T* out) {
  const hn::ScalableTag<T> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(ExactMulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i),
                           hn::LoadU(d, c + i)),
               d, out + i);
  }
  // The tail through the same vector code, padded.
  if (i < n) {
    HWY_ALIGN T la[hn::MaxLanes(d)] = {};
    HWY_ALIGN T lb[hn::MaxLanes(d)] = {};
    HWY_ALIGN T lc[hn::MaxLanes(d)] = {};
    for (int64_t j = i; j < n; ++j) {
      la[j - i] = a[j];
      lb[j - i] = b[j];
      lc[j - i] = c[j];
    }
    HWY_ALIGN T lo[hn::MaxLanes(d)];
    hn::Store(ExactMulAdd(hn::Load(d, la), hn::Load(d, lb), hn::Load(d, lc)), d,
              lo);
    for (int64_t j = i; j < n; ++j) out[j] = lo[j - i];
  }
}

void MulAddF64Impl(const double* a, const double* b, const double* c, int64_t n,
                   double* out) {
  MulAddArray(a, b, c, n, out);
}

void MulAddF32Impl(const float* a, const float* b, const float* c, int64_t n,
                   float* out) {
  MulAddArray(a, b, c, n, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {

ATTNAUDIT_SIMD_EXPORT(MulAddF64Impl);
ATTNAUDIT_SIMD_EXPORT(MulAddF32Impl);

void ExactMulAddArray(const double* a, const double* b, const double* c,
                      int64_t n, double* out) {
  ATTNAUDIT_SIMD_DISPATCH(MulAddF64Impl)(a, b, c, n, out);
}

void ExactMulAddArray(const float* a, const float* b, const float* c, int64_t n,
                      float* out) {
  ATTNAUDIT_SIMD_DISPATCH(MulAddF32Impl)(a, b, c, n, out);
}

}  // namespace attnaudit
#endif  // HWY_ONCE
