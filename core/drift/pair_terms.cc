// Per-target drift terms (see pair_terms_internal.h).
// clang-format off: foreach_target.h must come first, before the
// headers it re-includes for every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/drift/pair_terms.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/drift/pair_terms_internal.h"
#include "core/simd/dispatch.h"
#include "core/simd/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

using DI64 = hn::RebindToSigned<DF64>;
using VI64 = hn::Vec<DI64>;

// The sign-magnitude code of x rounded to f32 (kBf16: then to bf16, as
// FloatToBf16 rounds a finite or infinite float), mapped onto a line
// (negative codes below zero, +0 and -0 the same point): the steps of
// UlpDistance. x is finite, so the float is finite or +-inf, never NaN.
template <bool kBf16>
HWY_INLINE VI64 OrderedCode(VF64 x) {
  const hn::Rebind<float, DF64> df;
  const hn::Rebind<uint32_t, DF64> du32;
  const hn::Rebind<uint64_t, DF64> du64;
  const DI64 di;
  auto bits = hn::BitCast(du32, hn::DemoteTo(df, x));
  if constexpr (kBf16) {
    const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du32, 1u));
    bits =
        hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du32, 0x7fffu), odd)));
  }
  constexpr int64_t kSign = int64_t{1} << (kBf16 ? 15 : 31);
  const VI64 code = hn::BitCast(di, hn::PromoteTo(du64, bits));
  const VI64 magnitude = hn::And(code, hn::Set(di, kSign - 1));
  const auto negative = hn::Ne(hn::And(code, hn::Set(di, kSign)), hn::Zero(di));
  return hn::IfThenElse(negative, hn::Sub(hn::Zero(di), magnitude), magnitude);
}

// One vector of pairs; the caller checked that they are finite.
template <bool kBf16>
HWY_INLINE void TermsOfVector(VF64 c, VF64 r, VF64 tiny, VF64* max_rel,
                              double* abs_diff, double* ulps) {
  const DF64 d;
  const VF64 ad = hn::Min(hn::Abs(hn::Sub(c, r)),
                          hn::Set(d, std::numeric_limits<double>::max()));
  *max_rel = hn::Max(*max_rel, hn::Div(ad, hn::Max(hn::Abs(r), tiny)));
  const VI64 a = OrderedCode<kBf16>(c);
  const VI64 b = OrderedCode<kBf16>(r);
  const VI64 steps = hn::IfThenElse(hn::Lt(a, b), hn::Sub(b, a), hn::Sub(a, b));
  hn::StoreU(ad, d, abs_diff);
  hn::StoreU(hn::ConvertTo(d, steps), d, ulps);
}

template <bool kBf16>
bool Terms(const double* c, const double* r, int64_t n, double tiny,
           double* abs_diff, double* ulps, double* max_rel) {
  const DF64 d;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(DF64()));
  const int64_t full = n / N * N;
  // The tail, padded with equal zero pairs (finite, no drift), so that it
  // takes the vector path too.
  HWY_ALIGN double c_tail[N] = {};
  HWY_ALIGN double r_tail[N] = {};
  std::copy(c + full, c + n, c_tail);
  std::copy(r + full, r + n, r_tail);
  auto finite = [&](int64_t i) {
    return hn::AllTrue(d, hn::IsFinite(hn::LoadU(d, c + i))) &&
           hn::AllTrue(d, hn::IsFinite(hn::LoadU(d, r + i)));
  };
  bool all_finite = hn::AllTrue(d, hn::IsFinite(hn::Load(d, c_tail))) &&
                    hn::AllTrue(d, hn::IsFinite(hn::Load(d, r_tail)));
  for (int64_t i = 0; all_finite && i < full; i += N) all_finite = finite(i);
  if (!all_finite) return false;
  const VF64 tiny_v = hn::Set(d, tiny);
  VF64 rel = hn::Set(d, *max_rel);
  for (int64_t i = 0; i < full; i += N) {
    TermsOfVector<kBf16>(hn::LoadU(d, c + i), hn::LoadU(d, r + i), tiny_v, &rel,
                         abs_diff + i, ulps + i);
  }
  if (full < n) {
    HWY_ALIGN double ad_tail[N];
    HWY_ALIGN double ulp_tail[N];
    TermsOfVector<kBf16>(hn::Load(d, c_tail), hn::Load(d, r_tail), tiny_v, &rel,
                         ad_tail, ulp_tail);
    std::copy(ad_tail, ad_tail + (n - full), abs_diff + full);
    std::copy(ulp_tail, ulp_tail + (n - full), ulps + full);
  }
  *max_rel = hn::GetLane(hn::MaxOfLanes(d, rel));
  return true;
}

bool FinitePairTermsImpl(const double* c, const double* r, int64_t n,
                         DType ulp_dtype, double tiny, double* abs_diff,
                         double* ulps, double* max_rel) {
  return ulp_dtype == DType::kBF16
             ? Terms<true>(c, r, n, tiny, abs_diff, ulps, max_rel)
             : Terms<false>(c, r, n, tiny, abs_diff, ulps, max_rel);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {
namespace drift_internal {

ATTNAUDIT_SIMD_EXPORT(FinitePairTermsImpl);

bool HasVectorUlp(DType ulp_dtype) {
  return ulp_dtype == DType::kF32 || ulp_dtype == DType::kBF16;
}

bool FinitePairTerms(const double* c, const double* r, int64_t n,
                     DType ulp_dtype, double tiny, double* abs_diff,
                     double* ulps, double* max_rel) {
  if (!HasVectorUlp(ulp_dtype)) return false;
  return ATTNAUDIT_SIMD_DISPATCH(FinitePairTermsImpl)(c, r, n, ulp_dtype, tiny,
                                                      abs_diff, ulps, max_rel);
}

}  // namespace drift_internal
}  // namespace attnaudit
#endif  // HWY_ONCE
