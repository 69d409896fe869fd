// The merge routine's CPU loops (merge.h): the weights and the LSE are
// merge_step.h's scalar functions, shared with the CUDA kernels; the
// element loops run over Highway vectors, one source for every SIMD
// target, dispatched at run time (core/simd/dispatch.h). Each lane does
// merge_step::Element's operations in its order, every one a correctly
// rounded fp32 operation (the core is built with -ffp-contract=off), so
// the bits are the scalar routine's on every target. Scalar loops would be
// compiled for the portable build's baseline (SSE2) on every machine.
// clang-format off: foreach_target.h must come first, before the
// headers it re-includes for every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/attention/merge.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <cmath>
#include <limits>
#include <memory>

#include "core/attention/merge.h"
#include "core/attention/merge_step.h"
#include "core/simd/dispatch.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using merge_step::F;

// acc[j] <- merge_step::Element(w, acc[j], next[j]) for j < d, w.m finite.
void PairElements(const merge_step::PairWeights& w, float* acc,
                  const float* next, int64_t d) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const bool use_acc = merge_step::UsesAcc(w);
  const bool use_next = merge_step::UsesNext(w);
  const auto wa = hn::Set(df, w.wa);
  const auto wb = hn::Set(df, w.wb);
  const auto total = hn::Set(df, w.total);
  int64_t j = 0;
  for (; j + N <= d; j += N) {
    auto sum = hn::Zero(df);
    if (use_acc) sum = hn::Add(sum, hn::Mul(wa, hn::LoadU(df, acc + j)));
    if (use_next) sum = hn::Add(sum, hn::Mul(wb, hn::LoadU(df, next + j)));
    hn::StoreU(hn::Div(sum, total), df, acc + j);
  }
  for (; j < d; ++j) acc[j] = merge_step::Element(w, acc[j], next[j]);
}

void MergePairImpl(float* acc_out, float* acc_lse, const float* next_out,
                   float next_lse, int64_t d) {
  const merge_step::PairWeights w = merge_step::Weights(*acc_lse, next_lse);
  if (w.m == F::NegInf()) {
    for (int64_t j = 0; j < d; ++j) acc_out[j] = 0.0f;
  } else {
    PairElements(w, acc_out, next_out, d);
  }
  *acc_lse = merge_step::Lse(w);
}

// out[j] = (sum over i < live of w[i] * src[i][j], from +0, in i order) /
// total. Each vector of j reads every source before it writes out, so out
// may alias a source.
void WeightedSumImpl(const float* w, const float* const* src, int live,
                     float total, int64_t d, float* out) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto t = hn::Set(df, total);
  int64_t j = 0;
  for (; j + N <= d; j += N) {
    auto acc = hn::Zero(df);
    for (int i = 0; i < live; ++i) {
      acc = hn::Add(acc, hn::Mul(hn::Set(df, w[i]), hn::LoadU(df, src[i] + j)));
    }
    hn::StoreU(hn::Div(acc, t), df, out + j);
  }
  for (; j < d; ++j) {
    float acc = 0.0f;
    for (int i = 0; i < live; ++i) acc = F::Add(acc, F::Mul(w[i], src[i][j]));
    out[j] = F::Div(acc, total);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {

ATTNAUDIT_SIMD_EXPORT(MergePairImpl);
ATTNAUDIT_SIMD_EXPORT(WeightedSumImpl);

void MergeStates(const float* const* outs, const float* lses, int n, int64_t d,
                 float* out, float* lse) {
  using merge_step::F;
  using merge_step::SanitizeLse;
  float m = F::NegInf();
  for (int i = 0; i < n; ++i) m = F::Fmax(m, SanitizeLse(lses[i]));
  if (m == F::NegInf()) {
    for (int64_t j = 0; j < d; ++j) out[j] = 0.0f;
    *lse = F::NegInf();
    return;
  }
  // Only states with a non-zero weight take part: an empty state (lse -inf,
  // NaN or +inf) contributes nothing even when its out holds NaN or inf
  // (0 * NaN is NaN), and neither does one whose weight underflows.
  // Weights first so `out` may alias outs[0].
  constexpr int kStack = 64;
  float w_stack[kStack];
  const float* src_stack[kStack];
  std::unique_ptr<float[]> w_heap;
  std::unique_ptr<const float*[]> src_heap;
  float* w = w_stack;
  const float** src = src_stack;
  if (n > kStack) {
    w_heap.reset(new float[n]);
    src_heap.reset(new const float*[n]);
    w = w_heap.get();
    src = src_heap.get();
  }
  float total = 0.0f;
  int live = 0;
  for (int i = 0; i < n; ++i) {
    const float li = SanitizeLse(lses[i]);
    if (li == F::NegInf()) continue;
    const float wi = merge_step::Weight(li, m);
    if (wi == 0.0f) continue;
    total = F::Add(total, wi);
    w[live] = wi;
    src[live] = outs[i];
    ++live;
  }
  ATTNAUDIT_SIMD_DISPATCH(WeightedSumImpl)(w, src, live, total, d, out);
  *lse = F::Add(m, rounded::LogPositive(total));
}

// Exactly MergeStates' arithmetic for n = 2 (accumulator starting at +0,
// zero-weight states skipped).
void MergeInto(float* acc_out, float* acc_lse, const float* next_out,
               float next_lse, int64_t d) {
  ATTNAUDIT_SIMD_DISPATCH(MergePairImpl)
  (acc_out, acc_lse, next_out, next_lse, d);
}

void MergeIntoReference(double* acc_out, double* acc_lse,
                        const double* next_out, double next_lse, int64_t d) {
  constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
  auto sanitize = [](double lse) {
    return (std::isnan(lse) || lse == std::numeric_limits<double>::infinity())
               ? kNegInfD
               : lse;
  };
  const double a = sanitize(*acc_lse);
  const double b = sanitize(next_lse);
  const double m = std::fmax(a, b);
  if (m == kNegInfD) {
    for (int64_t j = 0; j < d; ++j) acc_out[j] = 0.0;
    *acc_lse = kNegInfD;
    return;
  }
  const double wa = a == kNegInfD ? 0.0 : std::exp(a - m);
  const double wb = b == kNegInfD ? 0.0 : std::exp(b - m);
  const double total = wa + wb;
  // A state of weight 0 takes no part (0 * inf would be NaN). One loop per
  // case, so each is a plain loop the compiler vectorises; the sums are
  // x + y with the absent side exactly 0.0, as in the two-sided form.
  if (wa != 0.0 && wb != 0.0) {
    for (int64_t j = 0; j < d; ++j) {
      acc_out[j] = (wa * acc_out[j] + wb * next_out[j]) / total;
    }
  } else if (wa != 0.0) {
    for (int64_t j = 0; j < d; ++j)
      acc_out[j] = (wa * acc_out[j] + 0.0) / total;
  } else {
    for (int64_t j = 0; j < d; ++j) {
      acc_out[j] = (0.0 + wb * next_out[j]) / total;
    }
  }
  *acc_lse = m + std::log(total);
}

}  // namespace attnaudit
#endif  // HWY_ONCE
