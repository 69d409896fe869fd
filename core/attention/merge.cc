#include "core/attention/merge.h"

#include <cmath>
#include <limits>
#include <memory>

#include "core/attention/merge_step.h"

namespace attnaudit {

// The arithmetic is merge_step.h's, shared with the CUDA kernels; these
// are its CPU loops.
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
    const float wi = F::Exp(F::Sub(li, m));
    if (wi == 0.0f) continue;
    total = F::Add(total, wi);
    w[live] = wi;
    src[live] = outs[i];
    ++live;
  }
  for (int64_t j = 0; j < d; ++j) {
    float acc = 0.0f;
    for (int i = 0; i < live; ++i) acc = F::Add(acc, F::Mul(w[i], src[i][j]));
    out[j] = F::Div(acc, total);
  }
  *lse = F::Add(m, F::Log(total));
}

// Exactly MergeStates' arithmetic for n = 2 (accumulator starting at +0,
// zero-weight states skipped).
void MergeInto(float* acc_out, float* acc_lse, const float* next_out,
               float next_lse, int64_t d) {
  merge_step::MergePair(acc_out, acc_lse, next_out, next_lse, d);
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
