// The one pass over lm_head behind SelectedLogprobsForEach (logprobs.cc):
// each row is widened once and dotted with every hidden vector, and its
// norms are taken on the way. Per-target code in logits.cc. Not a public
// API.
#ifndef ATTNAUDIT_CORE_DRIFT_LOGITS_INTERNAL_H_
#define ATTNAUDIT_CORE_DRIFT_LOGITS_INTERNAL_H_

#include <cstdint>

#include "core/tensor/dtype.h"

namespace attnaudit {
namespace drift_internal {

// For lm_head rows v in [v0, v1) (row v starts at head + v * hidden
// elements of `dtype`): logits[h * ld + v] = hidden_h . row_v in fp64, for
// the num_hidden vectors hidden ([num_hidden][hidden], contiguous), in
// virtual-lane order (the same bits on every SIMD target); and the largest
// L1 and L2 norm among those rows into *max_l1, *max_l2 (not reset).
void LogitRows(const void* head, DType dtype, int64_t hidden, int64_t v0,
               int64_t v1, const double* hiddens, int64_t num_hidden,
               double* logits, int64_t ld, double* max_l1, double* max_l2);

}  // namespace drift_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_DRIFT_LOGITS_INTERNAL_H_
