// The diagnosis: for a snapshot that DRIFTs, which known bug explains the
// engine's output E, and where (docs/DIAGNOSIS.md).
//
// Each hypothesis of a fixed catalogue (LSE base, RoPE position / style /
// K rotation, softmax scale, soft-cap, GQA mapping, sliding window, sinks,
// fp8 scales, dropped / stale / duplicated / swapped pages, CP shards and
// combine, and a reduced-precision intermediate) recomputes attention the
// way the buggy engine would, and is scored by how much of E's drift from
// R it removes, in the statistical detector's noise units
// (core/verdict/statistical.h), per query head and query. Hypotheses that
// do not apply to the snapshot are skipped; "unexplained" is a valid
// answer.
//
// Cost: the diagnosis examines the few batch rows that drift most.
// Page hypotheses fold per-unit partial states (core/attention/
// unit_states.h) computed once per examined row (leave-one-block-out and
// substitution re-merge states; nothing is recomputed per candidate).
// Global hypotheses are screened on one row and the KV heads that drift
// most, and only the best are recomputed on every examined row. A time
// limit bounds the whole; what ran is reported.
//
// Thread-compatible: Diagnose reads its inputs and writes only its result;
// concurrent calls with distinct inputs are safe.
#ifndef ATTNAUDIT_CORE_DIAGNOSIS_DIAGNOSIS_H_
#define ATTNAUDIT_CORE_DIAGNOSIS_DIAGNOSIS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"
#include "core/verdict/verdict.h"

namespace attnaudit {

struct DiagnosisOptions {
  // Wall-clock limit; the diagnosis stops between hypotheses once past it
  // and reports what it has (DiagnosisRun.complete = false). <= 0: none.
  double max_seconds = 10.0;
  int max_rows = 2;         // batch rows examined (those that drift most)
  int screen_kv_heads = 1;  // KV heads of the screening row
  int confirm = 3;          // global variants recomputed on every row
  int max_diagnoses = 5;    // entries reported
  int threads = 1;
  const std::atomic<bool>* cancelled = nullptr;
};

// Everything the audit already has. All pointers are borrowed and must stay
// valid for the call. engine_out / engine_lse are dense [B,Sq,Hq,D] and
// [B,Sq,Hq] (the LSE already converted to natural log); either may be
// empty. reference_* are R exactly as the audit computed it.
struct DiagnosisInputs {
  const Snapshot* snapshot = nullptr;
  const ResolvedLayout* layout = nullptr;
  const PreparedAttention* prepared = nullptr;
  const std::vector<double>* reference_out = nullptr;
  const std::vector<double>* reference_lse = nullptr;
  const std::vector<double>* engine_out = nullptr;
  const std::vector<double>* engine_lse = nullptr;
  // The E-R tolerance inputs (dtypes, merge depth, magnitudes).
  ToleranceInputs tolerance_inputs;
  ToleranceOverrides tolerance_overrides;
  // engine_out is E - M + R (the declared arithmetic's rounding taken out,
  // docs/DIAGNOSIS.md, "Against the emulated engine"): what is left of a
  // precision difference is not the engine's, and a located page account
  // cannot be told from the rounding E - M keeps, so only recomputed
  // hypotheses are tried (no reduced-precision, page or CP hypotheses).
  bool engine_arithmetic_removed = false;
};

struct DiagnosisResult {
  std::vector<Diagnosis> diagnoses;  // ranked, best first
  DiagnosisRun run;
};

// InvalidArgument when an input is missing or has the wrong size;
// Cancelled when options.cancelled.
absl::StatusOr<DiagnosisResult> Diagnose(const DiagnosisInputs& inputs,
                                         const DiagnosisOptions& options);

// Every hypothesis name a Diagnosis can carry (a bounded label set for
// metrics), "unexplained" included: the rows of
// ATTNAUDIT_DIAGNOSIS_HYPOTHESES (diagnosis_internal.h), in their order.
const std::vector<std::string>& HypothesisNames();

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_DIAGNOSIS_DIAGNOSIS_H_
