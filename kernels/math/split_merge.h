// The pass's second step, host and device: what turns the first step's
// stored results into one row's R and P (kernels/attention_kernels.h).
//
// The first step stores
//   - P: every unit's fp32 state (out, lse) and whether the row saw the
//     unit at all (a unit with no visible key has no state);
//   - R, split-KV only: each split's fp64 online-softmax state (m, l, acc),
//     started afresh.
// The second step, per (query row, element):
//   - P: merges the present unit states in the contract's tree over the
//     unit indices (core/attention/merge_tree.h) in two phases: the roots
//     of aligned blocks of TreeBlockUnits units, one thread each, then the
//     tree over those roots -- which is the same tree, so P has the CPU's
//     bits for every block size and every split, with a chain of about
//     2 sqrt(units) dependent merges instead of units;
//   - R: rescales each split's state to the largest m and sums them in
//     split order: M = max m_s, l = sum l_s a_s, acc = sum acc_s a_s with
//     a_s = RescaleFactor(m_s, M). R's association changes with the split,
//     so R is within a few fp64 roundings of the CPU's (the contract's
//     1e-12), not its bits.
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_KERNELS_MATH_SPLIT_MERGE_H_
#define ATTNAUDIT_KERNELS_MATH_SPLIT_MERGE_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"
#include "core/attention/merge_step.h"
#include "core/attention/merge_tree.h"
#include "kernels/math/scalar.h"
#include "kernels/math/unit_state.h"

namespace attnaudit {
namespace kmath {

// One element's unit tree: 2^16 leaves per phase, so two phases take
// rows of up to 2^32 units.
constexpr int kUnitTreeLevels = 17;
using UnitTree = merge_tree::ElementTree<kUnitTreeLevels>;

// Units per first-phase block: the least power of two whose square is at
// least max_units, so both phases walk about sqrt(max_units) leaves.
ATTNAUDIT_HOST_DEVICE inline int64_t TreeBlockUnits(int64_t max_units) {
  int64_t c = 1;
  while (c * c < max_units) c *= 2;
  return c;
}

// R's combine of `splits` partial states, in split order. m(s), l(s) and
// acc(s) read split s's state (an empty split: m = -inf, l = 0, acc = 0).
template <typename M, typename L, typename Acc>
ATTNAUDIT_HOST_DEVICE inline void CombineReferenceSplits(int64_t splits, M m,
                                                         L l, Acc acc,
                                                         double* m_out,
                                                         double* l_out,
                                                         double* acc_out) {
  using F = Ops<double>;
  double top = F::NegInf();
  for (int64_t s = 0; s < splits; ++s) top = MaxStep(top, m(s));
  double total = 0.0;
  double sum = 0.0;
  for (int64_t s = 0; s < splits; ++s) {
    const double ms = m(s);
    if (ms == F::NegInf()) continue;
    const double a = RescaleFactor(ms, top);
    total = F::Fma(l(s), a, total);
    sum = F::Fma(acc(s), a, sum);
  }
  *m_out = top;
  *l_out = total;
  *acc_out = sum;
}

// How many blocks share one row's runs: enough that the grid fills
// `target_blocks` (a few waves of the device's multiprocessors), never more
// than the longest row has runs. 1 = the one-block pass.
ATTNAUDIT_HOST_DEVICE inline int64_t SplitsFor(int64_t base_blocks,
                                               int64_t max_row_runs,
                                               int64_t target_blocks) {
  if (base_blocks <= 0 || max_row_runs <= 1) return 1;
  int64_t splits = (target_blocks + base_blocks - 1) / base_blocks;
  if (splits > max_row_runs) splits = max_row_runs;
  return splits < 1 ? 1 : splits;
}

// Device bytes a split-KV pass needs beyond the one-block pass's, for
// `queries` (rows x positions x query heads): R's per-split states (D + 2
// doubles each) when R runs. (P's unit states are stored either way.)
ATTNAUDIT_HOST_DEVICE inline int64_t SplitExtraBytes(int64_t splits,
                                                     int64_t queries,
                                                     int64_t head_dim,
                                                     bool reference) {
  return reference ? splits * queries * (head_dim + 2) * 8 : 0;
}

// The runs [*first, *last) of split `split` of a row whose runs are
// [row_first, row_last), `splits` splits of ceil(n / splits) runs each
// (trailing splits may be empty).
ATTNAUDIT_HOST_DEVICE inline void SplitRuns(int32_t row_first, int32_t row_last,
                                            int64_t splits, int64_t split,
                                            int32_t* first, int32_t* last) {
  const int64_t n = row_last - row_first;
  const int64_t per = (n + splits - 1) / splits;
  int64_t lo = row_first + split * per;
  int64_t hi = lo + per;
  if (lo > row_last) lo = row_last;
  if (hi > row_last) hi = row_last;
  *first = static_cast<int32_t>(lo);
  *last = static_cast<int32_t>(hi);
}

}  // namespace kmath
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_MATH_SPLIT_MERGE_H_
