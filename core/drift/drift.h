// Drift statistics between a candidate and a baseline result, and the
// selected-token log-prob computation that feeds the log-prob comparison.
// Definitions: docs/NUMERICS.md ("Drift statistics"). All functions are
// pure and thread-safe; they allocate O(count) scratch at most (the exact
// p99 needs a copy of |diff|).
#ifndef ATTNAUDIT_CORE_DRIFT_DRIFT_H_
#define ATTNAUDIT_CORE_DRIFT_DRIFT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/report/report.h"
#include "core/tensor/tensor.h"

namespace attnaudit {

// Dense row-major values with their logical shape: [B,Sq,Hq,D] for out,
// [B,Sq,Hq] for lse, [B,Sq] for log-probs. Doubles hold every value of
// every narrower dtype exactly.
struct DenseView {
  const double* values = nullptr;
  std::vector<int64_t> shape;
  int64_t size() const;
};

struct DriftOptions {
  DType ulp_dtype = DType::kF32;  // both sides are rounded to it for ULPs
  double tolerance = 0;           // absolute; counts over_tolerance
  // Optional [B, Sq] mask (1 = active). When set, only elements whose
  // (b, s) is active are counted. Used for log-probs.
  const uint8_t* active_mask = nullptr;
};

// diff = candidate - baseline. Elements where both are equal (including
// equal infinities) have diff 0; an element where exactly one side is NaN
// counts in *_nan and is excluded from the value statistics, as are
// non-finite diffs (counted in *_inf). Such pairs (NaN or Inf on one side
// only, or opposite infinities) are also counted in nonfinite_mismatch, which
// makes the comparison DRIFT. Shapes must match (caller's contract; checked,
// returns InvalidArgument otherwise), rank <= 4.
absl::StatusOr<DriftStats> ComputeDrift(const DenseView& candidate,
                                        const DenseView& baseline,
                                        const DriftOptions& options);

// Per-query-head summaries over [B,Sq,Hq,D] out tensors, the `top_n` heads
// with the largest max_abs first.
std::vector<HeadSummary> WorstHeads(const DenseView& candidate,
                                    const DenseView& baseline, DType ulp_dtype,
                                    int top_n);

// Selected-token log-probs from an attention output: hidden = out[b, s]
// flattened head-major to Hq*D (values as given, i.e. already rounded to the
// output dtype by the caller), logits = hidden . lm_head^T in fp64,
// log_softmax(logits / temperature)[token]. Returns [B*Sq]; inactive tokens
// (mask 0) get 0. lm_head is [V, Hq*D]; token ids must lie in [0, V).
absl::StatusOr<std::vector<double>> SelectedLogprobs(const DenseView& out,
                                                     const Tensor& lm_head,
                                                     const Tensor& token_ids,
                                                     const uint8_t* active_mask,
                                                     double temperature);

// The largest L1 and L2 norms of lm_head's rows: they bound how far a
// logit moves per unit of output drift (the log-prob tolerance uses them).
struct LmHeadNorms {
  double max_row_l1 = 0;
  double max_row_l2 = 0;
};

// SelectedLogprobs for several outputs of the same shape at once, in one
// pass over lm_head (each row is read and widened once for all of them, on
// up to `threads` threads), with lm_head's row norms into *norms (may be
// null). Returns one vector per output, each what SelectedLogprobs would
// return for it. With no outputs it only computes the norms (lm_head may
// then be absent: zero norms).
absl::StatusOr<std::vector<std::vector<double>>> SelectedLogprobsForEach(
    const std::vector<DenseView>& outs, const Tensor& lm_head,
    const Tensor& token_ids, const uint8_t* active_mask, double temperature,
    int threads, LmHeadNorms* norms);

// RL-framework agreement metrics for candidate (rollout) vs baseline
// (trainer stand-in) log-probs over active tokens; see report.h.
LogprobAgreement CompareLogprobs(const DenseView& candidate,
                                 const DenseView& baseline,
                                 const uint8_t* active_mask);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_DRIFT_DRIFT_H_
