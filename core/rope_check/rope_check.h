// The RoPE checks (docs/NUMERICS.md, "RoPE checks"): RoPE bugs are
// invisible to attention on the main path (post-RoPE q and K, rotated
// consistently), so they are checked on their own.
//
// - The rolling check: the snapshot's pre_rope.q / pre_rope.k (what the
//   engine rotated at this step) rotated by attnaudit under the declared
//   RoPE (its cast point, the engine's table where sent) against q and the
//   cache entries of this step's tokens. Over sampled steps every cached
//   key's rotation is checked once, with no engine change.
// - The table check: the engine's own RoPE table (rope_table.inv_freq and
//   cos/sin rows) against the model's definition, computed in fp64.
//
// Each element may differ by what a correct engine's own arithmetic allows
// (one ulp of the rotation dtype, the engine's libm at long positions:
// RopeTable::AngleUncertainty); more is a finding. On a finding,
// DiagnoseRopeChecks names the RoPE bug that explains it (position offset,
// style, theta, scaling ignored, partial rotary, rotation missing or
// doubled), fitted on the check's own vectors.
//
// Pure functions of a validated snapshot; thread-safe.
#ifndef ATTNAUDIT_CORE_ROPE_CHECK_ROPE_CHECK_H_
#define ATTNAUDIT_CORE_ROPE_CHECK_ROPE_CHECK_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"

namespace attnaudit {

// The checks the snapshot carries inputs for ("q", "k", "table"), each
// PASS or DRIFT; empty when it carries none. Errors only for an internal
// inconsistency (the snapshot must be valid).
absl::StatusOr<std::vector<RopeCheckResult>> RunRopeChecks(
    const Snapshot& snapshot, const ResolvedLayout& layout);

// For the drifting checks: the RoPE hypotheses that explain them, best
// first (hypothesis names in RopeHypothesisNames()).
std::vector<Diagnosis> DiagnoseRopeChecks(
    const Snapshot& snapshot, const ResolvedLayout& layout,
    const std::vector<RopeCheckResult>& checks);

// Every hypothesis name DiagnoseRopeChecks can report.
const std::vector<std::string>& RopeHypothesisNames();

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ROPE_CHECK_ROPE_CHECK_H_
