// The one merge routine for partial attention states (out, lse), shared by
// the CPU replay, the CP rings and the GPU kernels: its arithmetic is
// written once, host and device, in merge_step.h. docs/DESIGN.md §2:
//   M   = max_i lse_i      (NaN and +inf count as -inf; M = 0 if all -inf)
//   w_i = exp(lse_i - M)
//   out = sum_i w_i out_i / sum_i w_i      (fp32)
//   lse = M + ln sum_i w_i
// No state, or only -inf states: out = 0, lse = -inf. LSEs are natural-log;
// base-2 inputs are converted at the edge (LseFromBase2), never here.
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_CORE_ATTENTION_MERGE_H_
#define ATTNAUDIT_CORE_ATTENTION_MERGE_H_

#include <cstdint>

namespace attnaudit {

// Merges n states of dimension d: outs[i] points at d floats.
// `out` may alias outs[0].
void MergeStates(const float* const* outs, const float* lses, int n, int64_t d,
                 float* out, float* lse);

// Two-state form used by the merge tree (merge_tree.h): (acc_out, acc_lse)
// <- merge(acc, next). Same arithmetic as MergeStates with n = 2.
void MergeInto(float* acc_out, float* acc_lse, const float* next_out,
               float next_lse, int64_t d);

// The REFERENCE side's merge, not the replay's routine: the same formulas
// in fp64 for R's per-unit states (core/attention/unit_states.h), e.g. the
// reference partial of one CP rank, folded over its units in ascending
// order. Its rounding (~1e-16 relative per step) is far below every
// tolerance; no replay result may go through it.
void MergeIntoReference(double* acc_out, double* acc_lse,
                        const double* next_out, double next_lse, int64_t d);

// lse_e = lse_2 * ln 2.
inline double LseFromBase2(double lse2) {
  return lse2 * 0.693147180559945309417232121458176568;
}

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_MERGE_H_
