// The audit pipeline's context-parallel stage (internal to core/audit; see
// audit.h): for a snapshot with cp.world_size > 1, after the single-rank
// pass, it replays the snapshot with the requested CP strategy
// (core/cp/replay), combines the ranks' unit states in the engine's order
// and in P's unit tree, compares both with R, and -- when the
// snapshot carries the engine's per-rank partials -- checks every rank's
// partial against the reference partial over its shard and the engine's
// combine step against our merge of the engine's own partials. It fills
// AuditReport::cp and the CP timings. docs/NUMERICS.md, "Context
// parallelism", states the semantics and the attribution rule.
#ifndef ATTNAUDIT_CORE_AUDIT_CP_STAGE_H_
#define ATTNAUDIT_CORE_AUDIT_CP_STAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/attention/attention.h"
#include "core/attention/unit_states.h"
#include "core/audit/options.h"
#include "core/backend/backend.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "core/verdict/verdict.h"

namespace attnaudit {
namespace audit_internal {

// Whether the single-rank pass must keep R's unit states for the stage
// (the reference partials of the ranks, when the snapshot has partials).
bool CpNeedsReferenceStates(const Snapshot& snapshot);

// Bytes of unit states the stage needs: the replay's P states, plus the
// single pass's P and R states when with_reference (saturating).
int64_t CpStateBytes(const PreparedAttention& prepared, bool with_reference);

struct CpStageInputs {
  Backend& backend;  // runs the replay and the drift statistics
  const Snapshot& snapshot;
  const PreparedAttention& prepared;
  // R's unit states from the single pass; null unless
  // CpNeedsReferenceStates and within the memory limit.
  const UnitStates* single_states;
  const std::vector<double>& reference_out;  // R
  const std::vector<double>& reference_lse;
  const std::vector<double>& replay_out;  // P
  const std::vector<double>& replay_lse;
  // The engine's final out and lse (natural log); null when absent.
  const std::vector<double>* engine_out;
  const std::vector<double>* engine_lse;
  // The inputs of the main comparisons' tolerances (P-R's are used for
  // our CP replays against R).
  ToleranceInputs tolerance_inputs;
  const AuditOptions& options;
  int threads;
  // Non-empty: the replay is skipped for this reason.
  std::string skipped;
};

// Fills report->cp and the CP timings. Cancelled when the audit is;
// other errors are internal.
absl::Status RunCpStage(const CpStageInputs& in, AuditReport* report);

// DRIFT when any CP check of the report drifted, else `verdict`.
Verdict WithCpVerdict(const CpReport& cp, Verdict verdict);

}  // namespace audit_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_AUDIT_CP_STAGE_H_
