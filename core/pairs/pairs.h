// Train-rollout pairs: a rollout snapshot (the engine's decode step) and a
// trainer snapshot (the same tokens recomputed by the trainer) hold rows
// keyed by (request id, query position). ComparePairs joins the rows both
// hold and, for each pair, compares
//   - the outputs: bitwise equal?, max |diff|, and that in ulps of the
//     rollout's output dtype at the largest output;
//   - the inputs: q, and K and V over the common prefix of keys and over
//     its newest key (ulps, the same way);
//   - the inputs' effect: the fp64 reference attention (core/attention) on
//     each side's q/K/V with the rollout's parameters (and its RoPE, for
//     pre-RoPE queries), max |diff|: the output difference the inputs alone
//     explain.
// With each side's audit report (optional), each pair gets one verdict
// (PairVerdict, in order of gravity; the rules: docs/PYTHON.md, "The
// trainer's side and train–rollout pairs", and attnaudit.pairs' module
// docstring). The Python client's attnaudit.pairs applies the same rules:
// the two must agree verdict for verdict.
//
// Both snapshots must be valid, decode (Sq = 1), with post-RoPE keys (q:
// both post-RoPE or both pre-RoPE; it is compared as stored), not fp8,
// carry engine.out and labels.request_ids, and hold the same heads.
// Errors: InvalidArgument whose message starts with the field, ending with
// the side, e.g. "labels.request_ids: empty; rows are paired by request id
// (rollout snapshot)". Ownership: the report owns its values; nothing is
// borrowed past the call. Thread-safe: pure functions of their inputs.
#ifndef ATTNAUDIT_CORE_PAIRS_PAIRS_H_
#define ATTNAUDIT_CORE_PAIRS_PAIRS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {

// Each side's q, K and V come from a projection rounded once to their dtype
// (0.5 ulp) and a RoPE of up to three rounded ops (bf16 engines: 1.5 ulps):
// two correct sides fed the same hidden state differ by at most 3 ulps.
inline constexpr double kInputRoundingUlps = 3.0;

// One pair's verdict, later is graver.
enum class PairVerdict : int {
  kConsistent = 0,     // outputs bitwise equal
  kWithinNoise = 1,    // both kernels' rounding explains the difference
  kInputsDiffer = 2,   // q or the newest K/V differ beyond rounding
  kStalePrefixKv = 3,  // only the older prefix's K/V differ
  kRolloutDrift = 4,   // the rollout's own audit DRIFTs
  kTrainerDrift = 5,   // the trainer's own audit DRIFTs
  kBothDrift = 6,
};
// "consistent", "within-noise", "inputs-differ", "stale-prefix-kv",
// "rollout-drift", "trainer-drift", "both-drift".
absl::string_view PairVerdictName(PairVerdict verdict);

// One (request id, position) both snapshots hold. out_*: trainer output vs
// rollout output; q_ulps / kv_ulps: the largest input difference in ulps of
// its dtype (kv over the common prefix of keys_compared keys;
// newest_kv_ulps over its last key, made in the same forward as q);
// input_effect: max |diff| of the fp64 outputs of the two inputs; noise:
// the tolerance it is judged against.
struct RowPair {
  std::string request_id;
  int64_t position = 0;
  int64_t rollout_row = 0;
  int64_t trainer_row = 0;
  bool out_bitwise = false;
  double out_max_abs = 0;
  double out_max_ulps = 0;
  double q_ulps = 0;
  double kv_ulps = 0;
  double newest_kv_ulps = 0;
  int64_t keys_compared = 0;
  double input_effect = 0;
  double noise = 0;
  PairVerdict verdict = PairVerdict::kConsistent;

  // "q and K/V", "q", "K/V" (those beyond rounding, else those not bitwise
  // equal) or "" (bitwise equal inputs).
  std::string InputsDiffering() const;
};

// The pairs of one layer's two snapshots.
struct PairReport {
  int64_t layer = -1;  // the rollout's labels.layer; -1: none
  std::vector<RowPair> rows;
  // Each side's audit verdict; kUnspecified when no report was given.
  Verdict rollout_verdict = Verdict::kUnspecified;
  Verdict trainer_verdict = Verdict::kUnspecified;
  // The top diagnosis "hypothesis: summary"; empty when none.
  std::string rollout_diagnosis;
  std::string trainer_diagnosis;
  int64_t unmatched_rollout = 0;  // rows the trainer does not hold
  int64_t unmatched_trainer = 0;  // rows the rollout does not hold

  // The gravest row's verdict; nullopt without rows.
  std::optional<PairVerdict> verdict() const;
};

// Pairs the rows of two snapshots (see above). A report may be nullptr: no
// side is then called drifting on its account, and without either report
// the noise of a row is 4 ulps of its largest rollout output. `threads`
// bounds the reference pass (0: all cores).
absl::StatusOr<PairReport> ComparePairs(const Snapshot& rollout,
                                        const Snapshot& trainer,
                                        const AuditReport* rollout_report,
                                        const AuditReport* trainer_report,
                                        int threads = 0);

// The (request id, query position) of each row of a snapshot ComparePairs
// would take (the checks above; errors name the field and end with
// " (<side> snapshot)"): what a store joins the two sides by.
using PairRowKey = std::pair<std::string, int64_t>;
absl::StatusOr<std::vector<PairRowKey>> PairRowKeys(const Snapshot& snapshot,
                                                    const char* side);

// The verdict of one pair from its numbers (the rules above); rollout and
// trainer are the sides' audit verdicts (kUnspecified: none).
PairVerdict RowVerdict(Verdict rollout, Verdict trainer, bool bitwise,
                       double effect, double noise, double q_ulps,
                       double kv_ulps, double newest_kv_ulps);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_PAIRS_PAIRS_H_
