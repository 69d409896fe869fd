// The per-element terms of ComputeDrift (drift.cc) for runs of pairs whose
// sides are all finite, in SIMD: |diff|, the ULP distance and the largest
// relative error. ComputeDrift keeps everything that depends on order (the
// sums, the first worst element, the counts) in its scalar loop, so the
// statistics have the same bits as the element-by-element definition
// (docs/NUMERICS.md, "Drift statistics"). Per-target code in
// pair_terms.cc. Not a public API.
#ifndef ATTNAUDIT_CORE_DRIFT_PAIR_TERMS_INTERNAL_H_
#define ATTNAUDIT_CORE_DRIFT_PAIR_TERMS_INTERNAL_H_

#include <cstdint>

#include "core/tensor/dtype.h"

namespace attnaudit {
namespace drift_internal {

// Whether FinitePairTerms encodes ULPs in `ulp_dtype` (f32 and bf16, the
// dtypes of outputs, LSEs and log-probs; others take the scalar path).
bool HasVectorUlp(DType ulp_dtype);

// For the n pairs (c[i], r[i]): returns false, writing nothing, when a
// side of some pair is NaN or Inf. Otherwise, for every i < n,
//   abs_diff[i] = min(|c[i] - r[i]|, DBL_MAX)  (finite values can differ
//                                               by more than DBL_MAX)
//   ulps[i]     = UlpDistance(c[i], r[i], ulp_dtype) (0 for equal pairs)
// and *max_rel = max(*max_rel, abs_diff[i] / max(|r[i]|, tiny)) over i.
// Requires HasVectorUlp(ulp_dtype); abs_diff and ulps may not alias c, r.
// Element-wise IEEE operations only, so every SIMD target gives the bits
// of the scalar definition.
bool FinitePairTerms(const double* c, const double* r, int64_t n,
                     DType ulp_dtype, double tiny, double* abs_diff,
                     double* ulps, double* max_rel);

}  // namespace drift_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_DRIFT_PAIR_TERMS_INTERNAL_H_
