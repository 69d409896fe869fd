#include "core/attention/merge.h"

#include <cmath>
#include <limits>
#include <memory>

namespace attnaudit {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float Sanitize(float lse) {
  return (std::isnan(lse) || lse == std::numeric_limits<float>::infinity())
             ? kNegInf
             : lse;
}

}  // namespace

void MergeStates(const float* const* outs, const float* lses, int n, int64_t d,
                 float* out, float* lse) {
  float m = kNegInf;
  for (int i = 0; i < n; ++i) m = std::fmax(m, Sanitize(lses[i]));
  if (m == kNegInf) {
    for (int64_t j = 0; j < d; ++j) out[j] = 0.0f;
    *lse = kNegInf;
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
    const float li = Sanitize(lses[i]);
    if (li == kNegInf) continue;
    const float wi = std::exp(li - m);
    if (wi == 0.0f) continue;
    total += wi;
    w[live] = wi;
    src[live] = outs[i];
    ++live;
  }
  for (int64_t j = 0; j < d; ++j) {
    float acc = 0.0f;
    for (int i = 0; i < live; ++i) acc += w[i] * src[i][j];
    out[j] = acc / total;
  }
  *lse = m + std::log(total);
}

// Exactly MergeStates' arithmetic for n = 2 (accumulator starting at +0,
// zero-weight states skipped), with the branch hoisted out of the loop.
void MergeInto(float* acc_out, float* acc_lse, const float* next_out,
               float next_lse, int64_t d) {
  const float a = Sanitize(*acc_lse);
  const float b = Sanitize(next_lse);
  const float m = std::fmax(a, b);
  if (m == kNegInf) {
    for (int64_t j = 0; j < d; ++j) acc_out[j] = 0.0f;
    *acc_lse = kNegInf;
    return;
  }
  const float wa = a == kNegInf ? 0.0f : std::exp(a - m);
  const float wb = b == kNegInf ? 0.0f : std::exp(b - m);
  const float total = wa + wb;
  if (wa != 0.0f && wb != 0.0f) {
    for (int64_t j = 0; j < d; ++j) {
      acc_out[j] = ((0.0f + wa * acc_out[j]) + wb * next_out[j]) / total;
    }
  } else if (wa != 0.0f) {
    for (int64_t j = 0; j < d; ++j) {
      acc_out[j] = (0.0f + wa * acc_out[j]) / total;
    }
  } else {
    for (int64_t j = 0; j < d; ++j) {
      acc_out[j] = (0.0f + wb * next_out[j]) / total;
    }
  }
  *acc_lse = m + std::log(total);
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
  for (int64_t j = 0; j < d; ++j) {
    const double x = wa != 0.0 ? wa * acc_out[j] : 0.0;
    const double y = wb != 0.0 ? wb * next_out[j] : 0.0;
    acc_out[j] = (x + y) / total;
  }
  *acc_lse = m + std::log(total);
}

}  // namespace attnaudit
