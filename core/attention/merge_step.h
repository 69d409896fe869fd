// The arithmetic of one merge step of partial attention states, written
// once for the CPU and the GPU (core/arithmetic/host_device.h): the CPU's
// merge routine (merge.cc: MergeInto, MergeStates; its SIMD lanes repeat
// Element's operations in order, merge_test holds them to its bits) and
// the CUDA kernels (kernels/) call these same functions, so the replay P
// folds its unit states with the same arithmetic on every target.
// docs/DESIGN.md §2 and docs/NUMERICS.md ("The merge routine") define the
// routine:
//   M   = max_i lse_i      (NaN and +inf count as -inf; M = 0 if all -inf)
//   w_i = exp(lse_i - M)
//   out = sum_i w_i out_i / sum_i w_i      (fp32, states of weight 0 skipped)
//   lse = M + ln sum_i w_i
//
// Every product, sum and quotient is one correctly rounded fp32 operation:
// on the host the core is compiled with -ffp-contract=off, and on the
// device Mul/Add/Div use the _rn intrinsics, which nvcc never fuses into an
// FMA. exp and log are core/arithmetic/scalar_exp.h's, built from such
// operations, not the platform's math library (glibc and CUDA's libdevice
// differ by an ulp now and then): a merge has the same bits on every
// target (docs/NUMERICS.md, "CPU and GPU").
//
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_CORE_ATTENTION_MERGE_STEP_H_
#define ATTNAUDIT_CORE_ATTENTION_MERGE_STEP_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"
#include "core/arithmetic/rounded_ops.h"
#include "core/arithmetic/scalar_exp.h"

namespace attnaudit {
namespace merge_step {

using F = rounded::Ops<float>;

// NaN and +inf LSEs are empty states.
ATTNAUDIT_HOST_DEVICE inline float SanitizeLse(float lse) {
  return (lse != lse || lse == -F::NegInf()) ? F::NegInf() : lse;
}

// The weights of merging state b into accumulator a. m == -inf: both are
// empty (the result is out 0, lse -inf).
struct PairWeights {
  float m;
  float wa;
  float wb;
  float total;
};

// exp(lse - m) for lse <= m: 0 for an empty state; the state at the max
// gets exactly 1, which is ExpNonPositive(0), without its polynomial.
ATTNAUDIT_HOST_DEVICE inline float Weight(float lse, float m) {
  if (lse == F::NegInf()) return 0.0f;
  return lse == m ? 1.0f : rounded::ExpNonPositive(F::Sub(lse, m));
}

ATTNAUDIT_HOST_DEVICE inline PairWeights Weights(float acc_lse,
                                                 float next_lse) {
  const float a = SanitizeLse(acc_lse);
  const float b = SanitizeLse(next_lse);
  PairWeights w;
  w.m = F::Fmax(a, b);
  if (w.m == F::NegInf()) {
    w.wa = w.wb = w.total = 0.0f;
    return w;
  }
  // Weight(a, m) and Weight(b, m) with one exp, for the state below the
  // max (both at the max: ExpNonPositive(0) is exactly 1; an empty one:
  // ExpNonPositive(-inf) is 0), chosen by selects rather than branches: in
  // P's merge tree either side is the max about half the time, and a
  // mispredicted branch per merge cost the CPU pass more than the exp.
  const bool a_top = a == w.m;
  const float e = rounded::ExpNonPositive(F::Sub(a_top ? b : a, w.m));
  w.wa = a_top ? 1.0f : e;
  w.wb = a_top ? e : 1.0f;
  w.total = F::Add(w.wa, w.wb);
  return w;
}

// Element's cases for weights w with a finite w.m, for loops that decide
// them once per pair rather than per element: the accumulator takes part
// when its weight is not 0, the next state when its weight is not 0 or the
// accumulator does not take part.
ATTNAUDIT_HOST_DEVICE inline bool UsesAcc(const PairWeights& w) {
  return w.wa != 0.0f;
}
ATTNAUDIT_HOST_DEVICE inline bool UsesNext(const PairWeights& w) {
  return w.wb != 0.0f || w.wa == 0.0f;
}

// One element of the merged out. A state of weight 0 takes no part (0 * NaN
// would be NaN); the sum starts at +0 as the n-way routine's does.
ATTNAUDIT_HOST_DEVICE inline float Element(const PairWeights& w, float acc,
                                           float next) {
  if (w.m == F::NegInf()) return 0.0f;
  if (w.wa != 0.0f && w.wb != 0.0f) {
    return F::Div(F::Add(F::Add(0.0f, F::Mul(w.wa, acc)), F::Mul(w.wb, next)),
                  w.total);
  }
  if (w.wa != 0.0f) return F::Div(F::Add(0.0f, F::Mul(w.wa, acc)), w.total);
  return F::Div(F::Add(0.0f, F::Mul(w.wb, next)), w.total);
}

ATTNAUDIT_HOST_DEVICE inline float Lse(const PairWeights& w) {
  return w.m == F::NegInf() ? F::NegInf()
                            : F::Add(w.m, rounded::LogPositive(w.total));
}

}  // namespace merge_step
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_MERGE_STEP_H_
