// A rounding-boundary row's slack bounded from its own keys' weights.
//
// PreparedAttention::row_score_uncertainty bounds a row's slack by the
// largest shift any of its scores may take (its ambiguous q elements times
// the largest |k| of the KV head, a sink's included), which a heavy key
// that takes no weight can make many times what a flip can do to the row:
// wide enough to hide a real bug. This reads the row's visible keys once,
// takes each key's own shift bound η_j (its ambiguous q elements' gaps
// times its |k|, plus what its own ambiguous rotated elements move its
// score) and R's weights p_j, and
// bounds, with no approximation (docs/NUMERICS.md, "Rounding-boundary
// rows"):
//
//   |ΔLSE|   <= Λ = Σ_j p_j e^{η_j + A} η_j               (A = Σ_j p_j η_j)
//   |Δout_i| <= Σ_j p_j (η_j + Λ) e^{η_j + Λ} |v_j,i − out_i|
//
// over the keys and a sink (η 0, v 0): along the shift a weight is at
// most p_j e^{η_j + A} (Jensen on the normaliser), p'_j = p_j e^{u_j −
// ΔLSE}, and both weight sets sum to one. A key of no weight adds nothing
// however large its η. The audit computes it only for the rows a
// comparison finds beyond its scalar tolerance (a read of a row's keys per
// row; most rows never need it).
//
// Pure; thread-safe for concurrent calls on one PreparedAttention.
#ifndef ATTNAUDIT_CORE_ATTENTION_ROW_SLACK_H_
#define ATTNAUDIT_CORE_ATTENTION_ROW_SLACK_H_

#include <cstdint>
#include <map>
#include <mutex>

#include "core/attention/attention.h"

namespace attnaudit {

struct RowSlackBound {
  // False where the bound does not apply (no slack pending for the row, or
  // a soft-capped layer, whose scores are not linear in q): keep the
  // row's bound from PreparedAttention.
  bool bounded = false;
  double lse = 0;  // nats, on the LSE the engine reports (keys or + sinks)
  double out = 0;  // on every element of the row's output
};

// The bound for (b, s, h) row `row` of `p` after FinishRowSlack.
RowSlackBound BoundRowSlack(const PreparedAttention& p, int64_t row);

// BoundRowSlack once per row, on demand: the comparisons of one audit,
// which run in parallel, share it. Borrows `p` (which must outlive it and
// not change). Thread-safe.
class RowSlackCache {
 public:
  explicit RowSlackCache(const PreparedAttention& p) : p_(p) {}
  RowSlackBound Get(int64_t row);

 private:
  const PreparedAttention& p_;
  std::mutex mu_;
  std::map<int64_t, RowSlackBound> memo_;  // guarded by mu_
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_ROW_SLACK_H_
