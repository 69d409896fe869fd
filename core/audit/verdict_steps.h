// The audit's verdict steps after its comparisons: the emulated engine
// (E-M), the convex-hull check, INCONCLUSIVE, and the report's notes of the
// request's overrides and of what the audit could not see
// (docs/NUMERICS.md, "The convex hull", "Inconclusive", "Overrides", "The
// emulated engine"). Internal to the audit pipeline (audit.cc); each step
// writes only its own fields of the report.
//
// Thread-compatible: one audit's steps run on its own thread.
#ifndef ATTNAUDIT_CORE_AUDIT_VERDICT_STEPS_H_
#define ATTNAUDIT_CORE_AUDIT_VERDICT_STEPS_H_

#include <vector>

#include "absl/status/status.h"
#include "core/attention/attention.h"
#include "core/audit/options.h"
#include "core/backend/backend.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "core/verdict/verdict.h"

namespace attnaudit {
namespace audit_internal {

// What the verdict steps read of one audit (borrowed; the audit outlives
// the steps).
struct VerdictInputs {
  Backend& backend;
  const Snapshot& snapshot;
  const PreparedAttention& prepared;
  const std::vector<double>& reference_out;  // R [B, Sq, Hq, D]
  const std::vector<double>* engine_out;     // E, null when not sent
  // The comparisons' common inputs (the engine's arithmetic, the
  // magnitudes); `comparison` is set per use.
  const ToleranceInputs& tolerance_inputs;
  const AuditOptions& options;
  DType output_dtype;
  int threads;
};

// The dtype the engine's queries are in when it attends: its rotated q's.
DType ModelDType(const Snapshot& s);

// Adds the E-M comparison when the engine's arithmetic has an emulated
// engine (core/emulate); otherwise says why not in the sensitivity notes
// when it rounds its scores. When E-M drifts, *emulated_out receives M
// [B, Sq, Hq, D] (the diagnosis scores its hypotheses against it);
// otherwise it is left empty. Errors: Cancelled.
absl::Status EmulationStep(const VerdictInputs& in, AuditReport* report,
                           std::vector<double>* emulated_out);

// Fills report->hull; an element outside the hull makes every engine
// comparison DRIFT, with the hull's reason.
void HullStep(const VerdictInputs& in, AuditReport* report);

// Marks INCONCLUSIVE each engine comparison that passed but verifies
// nothing a PASS promises (InconclusiveReasons), with the report's reasons,
// unless E-M passed with a tolerance that verifies the output.
void ConclusionStep(const VerdictInputs& in, AuditReport* report);

// report->overrides: the request's departures from the policy.
void NoteOverrides(const VerdictInputs& in, AuditReport* report);

// report->provenance.sensitivity: an undeclared engine's widest envelope,
// attnaudit's own RoPE without the engine's table.
void NoteSensitivity(const VerdictInputs& in, AuditReport* report);

}  // namespace audit_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_AUDIT_VERDICT_STEPS_H_
