// The audit report: verdict, drift statistics per comparison and quantity,
// and provenance. The core's model of proto/attnaudit/v1/report.proto.
// Plain values; no invariants beyond those documented per field.
#ifndef ATTNAUDIT_CORE_REPORT_REPORT_H_
#define ATTNAUDIT_CORE_REPORT_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/snapshot/snapshot.h"
#include "core/tensor/dtype.h"

namespace attnaudit {

enum class Verdict : int {
  kUnspecified = 0,
  kPass = 1,
  kDrift = 2,
  kInvalid = 3,
  // Nothing drifted, but the audit could not verify what a PASS promises
  // (AuditReport::inconclusive_reasons say why). Never a PASS.
  kInconclusive = 4,
};

// Which two results are compared: candidate vs baseline.
enum class Comparison : int {
  kEngineVsReference = 0,  // E vs R: engine drift, the production signal
  kReplayVsReference = 1,  // P vs R: replay consistency
  kEngineVsReplay = 2,     // E vs P: kernel numerics vs cache/layout faults
  // E vs M: the engine against its declared arithmetic replayed
  // (core/emulate), for engines that round their scores to 16 bits.
  kEngineVsEmulation = 3,
};
constexpr int kNumComparisons = 4;

enum class Quantity : int { kOut = 0, kLse = 1, kLogprob = 2 };

absl::string_view VerdictName(Verdict v);  // "PASS", "DRIFT", ...
// The graver of two verdicts: INVALID > DRIFT > INCONCLUSIVE > PASS >
// UNSPECIFIED.
Verdict WorseVerdict(Verdict a, Verdict b);
absl::string_view ComparisonName(Comparison c);       // "engine_vs_reference"
absl::string_view ComparisonShortName(Comparison c);  // "E-R"
absl::string_view QuantityName(Quantity q);           // "out", "lse", "logprob"

// A position in [B, Sq, Hq, D]; trailing indices are -1 when the quantity
// has fewer dimensions (lse: d = -1; logprob: h = d = -1).
struct Location {
  int64_t batch = -1;
  int64_t query = -1;
  int64_t head = -1;
  int64_t dim = -1;
};

// Statistics of diff = candidate - baseline over `count` elements.
struct DriftStats {
  int64_t count = 0;
  double max_abs = 0;
  double mean_abs = 0;
  double rms = 0;
  double max_rel = 0;  // |diff| / max(|baseline|, tiny)
  double p99_abs = 0;  // exact order statistic (nearest rank), no size limit
  // ULP distance in `ulp_dtype` (the output dtype for out, f32 for lse and
  // log-probs).
  DType ulp_dtype = DType::kF32;
  double max_ulp = 0;
  double mean_ulp = 0;
  double tolerance = 0;        // absolute tolerance applied
  int64_t over_tolerance = 0;  // elements with |diff| > tolerance
  int64_t candidate_nan = 0;
  int64_t candidate_inf = 0;
  int64_t baseline_nan = 0;
  int64_t baseline_inf = 0;
  // Elements where the two sides differ and at least one is NaN/Inf: a NaN
  // on one side only, an infinity against a finite value, or opposite
  // infinities (both NaN, or equal infinities, agree). They are not in the
  // value statistics (`count`) and make the comparison DRIFT.
  int64_t nonfinite_mismatch = 0;
  Location first_nonfinite_mismatch;  // first such element, row-major
  Location worst;  // argmax |diff| (first in row-major order on ties)
  double worst_candidate = 0;
  double worst_baseline = 0;
};

// Log-prob agreement in the RL frameworks' terms; log r = lp_ref - lp_cand,
// where "ref" is the baseline of the comparison (the trainer's stand-in) and
// "cand" the candidate (the rollout's). Definitions in docs/NUMERICS.md.
struct LogprobAgreement {
  int64_t count = 0;         // active tokens
  double mean_abs_diff = 0;  // mean |lp_cand - lp_ref|
  double max_abs_diff = 0;
  double k1_kl = 0;       // mean(lp_cand - lp_ref)
  double k3_kl = 0;       // mean(r - 1 - log r)
  double ratio_mean = 0;  // r = exp(lp_ref - lp_cand)
  double ratio_min = 0;
  double ratio_max = 0;
  double ratio_std = 0;
};

struct HeadSummary {
  int64_t head = 0;
  double max_abs = 0;
  double mean_abs = 0;
  double max_ulp = 0;
};

// One group of elements the statistical detector tested (docs/NUMERICS.md,
// "Statistical detector"): every out element of the snapshot, of one row
// (b, s), or of one query head. z = diff / (the element's noise unit).
struct StatisticalGroup {
  std::string scope;  // "all", "row" or "head"
  Location where;     // row: batch and query; head: head; all: all -1
  int64_t count = 0;  // elements
  double rms = 0;     // sqrt(mean z^2)
  double mean = 0;    // mean z
  // mean z * sign(reference): below 0 the candidate is smaller in
  // magnitude than the baseline (e.g. truncation instead of rounding).
  double bias = 0;
  double rms_limit = 0;   // the group fires above it ...
  double mean_limit = 0;  // ... or when |mean| or |bias| exceeds this
  bool fired = false;
};

struct StatisticalResult {
  bool computed = false;
  double noise_epsilon = 0;  // epsilon of the noise unit (NUMERICS.md)
  double clean_rms = 0;      // rms a correct engine stays under on average
  int64_t groups = 0;        // groups tested
  int64_t fired_groups = 0;
  // Per scope, the group closest to (or furthest over) its limits.
  std::vector<StatisticalGroup> worst;
};

struct ComparisonResult {
  Comparison comparison = Comparison::kEngineVsReference;
  Verdict verdict = Verdict::kUnspecified;
  bool has_out = false;
  DriftStats out;
  bool has_lse = false;
  DriftStats lse;
  bool has_logprob = false;
  DriftStats logprob;
  LogprobAgreement logprob_agreement;
  std::vector<HeadSummary> worst_heads;  // by out max_abs, descending
  // The statistical detector on out (absent when out was not compared or
  // the test is off); when it fires, the comparison DRIFTs with a reason
  // that starts "statistical:".
  bool has_statistical = false;
  StatisticalResult statistical;
  std::vector<std::string> reasons;  // why DRIFT, one line each
};

struct StageTimings {
  double validate_seconds = 0;
  // The fused R + P pass is timed once and split 2/3 (reference) and 1/3
  // (replay): an apportionment, not two measurements.
  double reference_seconds = 0;
  double replay_seconds = 0;
  double compare_seconds = 0;
  double total_seconds = 0;
  // Context-parallel snapshots: the CP replay's wall clock, and per rank
  // the seconds it computed and spent on the transport (fills included).
  double cp_seconds = 0;
  std::vector<double> cp_rank_compute_seconds;    // [W]
  std::vector<double> cp_rank_transport_seconds;  // [W]
  double diagnosis_seconds = 0;  // 0 unless the diagnosis ran (on DRIFT)
};

// Where a diagnosis places a fault; fields that do not apply are -1 or
// empty.
struct DiagnosisLocation {
  int64_t row = -1;    // batch row b
  int64_t query = -1;  // query s; -1: every query of the row
  // Query heads the hypothesis explains; empty: every head examined.
  std::vector<int64_t> heads;
  int64_t logical_block = -1;
  // The page as the engine numbers it: its page id when the snapshot sent
  // page_ids, else its index in k_pages.
  int64_t page = -1;
  // The block (and page) read in its place: duplicate and swapped pages.
  int64_t other_logical_block = -1;
  int64_t other_page = -1;
  int32_t cp_rank = -1;
};

// E against R (before) and against the attention recomputed under the
// hypothesis (after), over the cells the diagnosis examined. rms is in the
// statistical detector's noise units.
struct DiagnosisEvidence {
  double out_max_abs = 0;
  double out_rms_noise = 0;
  double lse_max_abs = 0;
};

// One hypothesis that explains (part of) a drift. docs/DIAGNOSIS.md lists
// the hypotheses and how each is scored.
struct Diagnosis {
  std::string hypothesis;  // bounded name, e.g. "stale-page", "unexplained"
  std::string detail;      // the variant, e.g. "-1" (a RoPE shift)
  double score = 0;        // [0, 1]: share of the excess drift removed
  bool explains = false;   // what is left is within the engine's noise
  DiagnosisEvidence before;
  DiagnosisEvidence after;
  DiagnosisLocation location;
  std::string summary;  // one sentence in plain words
};

// How the diagnosis went (it runs only when an audit DRIFTs).
struct DiagnosisRun {
  bool ran = false;
  bool complete = false;   // false: stopped at its time limit
  int64_t hypotheses = 0;  // variants evaluated
  int64_t rows = 0;        // batch rows examined
  std::string note;        // why it did not run or stopped, or how it scored
};

struct Provenance {
  std::string backend = "cpu";
  int threads = 0;
  double softmax_scale = 0;
  DType output_dtype = DType::kInvalid;
  int64_t max_merged_blocks = 0;  // largest k over all queries
  // [B][Sq][k]: ascending logical blocks with >= 1 visible key: the leaves
  // of the replay's merge tree, in index order. Empty when the option to
  // include them is off.
  std::vector<std::vector<std::vector<int32_t>>> merge_orders;
  // [B][active blocks]: CP rank owning each logical block.
  std::vector<std::vector<int32_t>> block_owners;
  std::string kv_fingerprint;      // attnaudit v1 digest, when computed
  std::string prefix_fingerprint;  // recomputed, when the prefix is enabled
  std::string rope_fingerprint;
  // The definitions of kv_fingerprint (kFingerprintVersion).
  std::string fingerprint_version;
  // The scheme that produced prefix_fingerprint (PrefixSchemeName:
  // "attnaudit.kv.v1" or "rl_kernel_compat"); empty without a prefix.
  std::string prefix_fingerprint_scheme;
  StageTimings timings;
  // The engine precision profile the tolerances used
  // (core/engine/arithmetic.h), e.g. "flash-decoding", "conservative".
  std::string engine_profile;
  // Where the audit's RoPE values came from when it rotated: "config",
  // "engine inv_freq", "engine rows" (rows for some positions, the rest
  // from inv_freq or the config), or "" when it rotated nothing.
  std::string rope_source;
  // "measured", "preset", "declared" or "undeclared", and the
  // declaration's evidence line (EnginePrecision::evidence).
  std::string precision_source;
  std::string precision_evidence;
  // What this audit could not see and why, one line each.
  std::vector<std::string> sensitivity;
};

// The engine output against the convex hull of its visible V rows
// (docs/NUMERICS.md, "The convex hull").
struct HullCheck {
  bool present = false;  // the snapshot carried an engine output
  int64_t checked = 0;
  int64_t outside = 0;
  Location worst;  // the element farthest outside its widened bounds
  double worst_value = 0;
  double worst_low = 0;
  double worst_high = 0;
};

// One context-parallel check: a candidate against a baseline over out and
// lse, with its verdict and the reasons for a DRIFT.
struct CpCheck {
  Verdict verdict = Verdict::kUnspecified;
  bool has_out = false;
  DriftStats out;
  bool has_lse = false;
  DriftStats lse;
  std::vector<std::string> reasons;
};

// One rank's engine partial against the reference partial over its shard.
struct CpRankCheck {
  int64_t rank = 0;
  CpCheck check;
  int64_t tokens = 0;         // the rank's keys, all rows
  int64_t empty_queries = 0;  // (b, s, h) that see none of its keys
};

// The context-parallel section (docs/NUMERICS.md, "Context parallelism"):
// present when the snapshot's CP world size is > 1.
struct CpReport {
  bool present = false;
  std::string strategy;          // "ring" or "partials": what ran
  bool strategy_chosen = false;  // the request said auto
  int64_t world_size = 1;
  CpSharding sharding = CpSharding::kNone;
  int64_t interleave_size = 1;
  // [B][W]: each rank's local length (keys it holds) per row.
  std::vector<std::vector<int64_t>> shard_tokens;
  int64_t rounds = 0;
  int64_t steps = 0;
  int64_t workers = 0;    // ranks that could run at once
  std::string execution;  // "lockstep" / "thread_per_rank"
  // Our CP replay, combined in the engine's order (ring rounds or rank
  // order) and in P's unit tree, each against R.
  CpCheck engine_order;
  CpCheck deterministic;
  // The deterministic combine equals the single-rank replay P bit for bit
  // (out and lse). Always true unless something is broken.
  bool deterministic_matches_replay = false;
  // With cp.rank_out/rank_lse: every rank's partial against the reference
  // partial over its shard, and the engine's final out/lse against our
  // merge of the engine's own partials (the combine step alone).
  std::vector<CpRankCheck> ranks;
  bool has_combine = false;
  CpCheck combine;
  // Why the CP replay did not run (empty when it ran), e.g. its unit
  // states would exceed AuditOptions::max_cp_state_bytes.
  std::string skipped;
};

// One RoPE check (docs/NUMERICS.md, "RoPE checks"): the rolling check of
// this step's pre-RoPE q ("q") or keys ("k") against what the engine
// attended with, or the engine's RoPE table against the config ("table").
struct RopeCheckResult {
  std::string what;  // "q", "k" or "table"
  Verdict verdict = Verdict::kUnspecified;
  int64_t count = 0;       // elements compared
  int64_t mismatches = 0;  // over their tolerance
  double max_abs = 0;      // max |engine - attnaudit|
  double max_ulp = 0;      // in ULPs of the rotation dtype (table: f32)
  // table: the largest angle error, radians; q/k: the angle that would
  // explain the worst element's pair.
  double max_angle_error = 0;
  double tolerance = 0;  // the tolerance at the worst element
  // q/k: (b, s, h, d); table: batch = -1, query = the position's row,
  // head = -1, dim = the rotary pair.
  Location worst;
  std::vector<std::string> reasons;  // one line each when DRIFT
};

struct AuditReport {
  Verdict verdict = Verdict::kUnspecified;
  std::string invalid_reason;  // the validation error, when INVALID
  SnapshotDims dims;
  Labels labels;
  std::vector<ComparisonResult> comparisons;
  Provenance provenance;
  CpReport cp;
  // Ranked, best first (docs/DIAGNOSIS.md); empty unless DRIFT.
  std::vector<Diagnosis> diagnoses;
  DiagnosisRun diagnosis_run;
  // The rolling RoPE check and the RoPE table check, when the snapshot
  // carried their inputs; a DRIFT among them makes the report DRIFT.
  std::vector<RopeCheckResult> rope_checks;
  // Why the verdict is INCONCLUSIVE, one line each.
  std::vector<std::string> inconclusive_reasons;
  // The request's departures from the policy, one line each; any makes the
  // report "overridden" in metrics and the CLI.
  std::vector<std::string> overrides;
  HullCheck hull;

  const ComparisonResult* Find(Comparison c) const;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_REPORT_REPORT_H_
