#include "core/audit/audit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/attention/merge.h"
#include "core/attention/row_slack.h"
#include "core/attention/unit_states.h"
#include "core/audit/cp_stage.h"
#include "core/audit/verdict_steps.h"
#include "core/backend/backend.h"
#include "core/common/parallel.h"
#include "core/common/status_macros.h"
#include "core/diagnosis/diagnosis.h"
#include "core/drift/drift.h"
#include "core/engine/arithmetic.h"
#include "core/fingerprint/fingerprint.h"
#include "core/rope/rope.h"
#include "core/rope_check/rope_check.h"
#include "core/verdict/statistical.h"

namespace attnaudit {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool IsCancelled(const AuditOptions& options) {
  return options.cancelled != nullptr && options.cancelled->load();
}

// One side of a comparison: dense out/lse/log-probs, any of them absent.
struct Side {
  std::vector<double> out, lse, logprobs;
  bool has_out = false, has_lse = false, has_logprobs = false;
};

// The largest finite |v[i]|, 0 when there is none. Eight running maxima
// of selects, with no branch: one would be a chain of dependent max
// operations (a max is exact in any order).
double MaxAbs(const std::vector<double>& v) {
  constexpr double kLargest = std::numeric_limits<double>::max();
  constexpr size_t kLanes = 8;
  double m[kLanes] = {};
  auto fold = [&](size_t lane, double x) {
    const double a = std::fabs(x) <= kLargest ? std::fabs(x) : 0.0;
    m[lane] = a > m[lane] ? a : m[lane];
  };
  size_t i = 0;
  for (; i + kLanes <= v.size(); i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) fold(k, v[i + k]);
  }
  for (; i < v.size(); ++i) fold(0, v[i]);
  return *std::max_element(m, m + kLanes);
}

std::vector<double> RoundedCopy(const std::vector<double>& v, DType dtype) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = dtype == DType::kF64
                 ? v[i]
                 : RoundToDType(static_cast<float>(v[i]), dtype);
  }
  return out;
}

// Log-probs of every side that has an output and needs them (the engine's
// own log-probs, when sent, are used as they are), in one pass over
// lm_head, which also yields its row norms.
absl::Status ComputeLogprobs(const Snapshot& s, std::vector<Side*> sides,
                             const std::vector<int64_t>& out_shape, int threads,
                             LmHeadNorms* norms) {
  const bool can = s.lm_head.present() && s.selected_token_ids.present();
  std::vector<Side*> todo;
  std::vector<DenseView> views;
  for (Side* side : sides) {
    if (!can || side == nullptr || !side->has_out) continue;
    todo.push_back(side);
    views.push_back({side->out.data(), out_shape});
  }
  const uint8_t* mask =
      s.active_mask.present() ? s.active_mask.data<uint8_t>() : nullptr;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      std::vector<std::vector<double>> logprobs,
      SelectedLogprobsForEach(views, s.lm_head, s.selected_token_ids, mask,
                              s.logprob_temperature, threads, norms));
  for (size_t i = 0; i < todo.size(); ++i) {
    todo[i]->logprobs = std::move(logprobs[i]);
    todo[i]->has_logprobs = true;
  }
  return absl::OkStatus();
}

struct CompareContext {
  Backend& backend;
  const Snapshot& snapshot;
  const SnapshotDims& dims;
  DType output_dtype;
  ToleranceInputs tolerance_inputs;
  const AuditOptions& options;
  const std::vector<double>* reference_out;  // R, for the noise units
  // Rows whose scores may differ from the engine's by a rotated element at
  // a rounding boundary (PreparedAttention::row_score_uncertainty).
  RowScoreInputs row_scores;
  const std::vector<uint8_t>* row_query_ambiguous = nullptr;
  // Those rows' bounds from their own keys, for the rows a comparison
  // finds beyond its scalar tolerance (null: none pending).
  RowSlackCache* row_slack = nullptr;
};

// A row whose slack decides something (one of its elements is beyond the
// scalar tolerance) is held to the bound from its own keys' weights
// (BoundRowSlack) where that is smaller: the row's shared bound counts a
// heavy key at full weight, which can hide a real bug on the row. Rows
// within the scalar tolerance are left alone (their bound changes nothing).
void TightenRows(const CompareContext& ctx, const Side& candidate,
                 const Side& baseline, const Tolerances& tol,
                 RowTolerances* rows) {
  if (ctx.row_slack == nullptr) return;
  const int64_t n = ctx.dims.batch * ctx.dims.queries * ctx.dims.q_heads;
  const int64_t dim = ctx.dims.head_dim;
  const bool out = !rows->out.empty() && candidate.has_out && baseline.has_out;
  const bool lse = !rows->lse.empty() && candidate.has_lse && baseline.has_lse;
  for (int64_t r = 0; r < n; ++r) {
    const bool widened = (!rows->out.empty() && rows->out[r] > 0) ||
                         (!rows->lse.empty() && rows->lse[r] > 0);
    if (!widened) continue;  // no slack of its own to tighten
    bool over = false;
    for (int64_t i = 0; out && !over && i < dim; ++i) {
      over = std::fabs(candidate.out[r * dim + i] - baseline.out[r * dim + i]) >
             tol.out_abs;
    }
    over = over ||
           (lse && std::fabs(candidate.lse[r] - baseline.lse[r]) > tol.lse_abs);
    if (!over) continue;
    const RowSlackBound own = ctx.row_slack->Get(r);
    if (!own.bounded) continue;
    if (!rows->out.empty()) rows->out[r] = std::min(rows->out[r], own.out);
    if (!rows->lse.empty()) rows->lse[r] = std::min(rows->lse[r], own.lse);
  }
}

// The statistical detector on out (core/verdict/statistical.h).
void StatisticalStep(const CompareContext& ctx, Comparison which,
                     const Side& candidate, const Side& baseline,
                     ComparisonResult* result) {
  if (!ctx.options.statistical_test || !candidate.has_out ||
      !baseline.has_out) {
    return;
  }
  StatisticalInputs si;
  si.comparison = which;
  si.output_dtype = ctx.output_dtype;
  si.kv_dtype = ctx.tolerance_inputs.kv_dtype;
  si.max_context = ctx.tolerance_inputs.max_context;
  si.max_merged_blocks = ctx.tolerance_inputs.max_merged_blocks;
  si.max_abs_lse_reference = ctx.tolerance_inputs.max_abs_lse_reference;
  ToleranceInputs ti = ctx.tolerance_inputs;
  ti.comparison = which;
  si.score_error = ComparisonScoreError(ti);
  if (which != Comparison::kReplayVsReference) {
    si.probability_epsilon = ti.engine.probability_epsilon;
    si.score_error += ti.rope_score_noise;
    const OutputLean lean = ExpectedOutputLean(ti.engine);
    si.shrink_ulps = lean.ulps;
    si.shrink_relative = lean.relative;
    si.shrink_known = lean.known;
  }
  const SnapshotDims& d = ctx.dims;
  // A row whose own q has an ambiguous rotated element carries a bias of
  // up to a flip's effect on all its scores, which the detector's noise
  // model (independent roundings) does not describe and its tolerance
  // already bounds: such (b, s, h) cells are left out of the test. They
  // are a few of thousands; a bug that moves many rows still shows in the
  // rest. A key's flip moves one score of many and is not excluded: with
  // thousands of ambiguous keys every row would be, and the detector
  // silenced.
  if (which != Comparison::kReplayVsReference &&
      ctx.row_query_ambiguous != nullptr &&
      static_cast<int64_t>(ctx.row_query_ambiguous->size()) ==
          d.batch * d.queries * d.q_heads) {
    si.excluded_cells = ctx.row_query_ambiguous->data();
  }
  result->statistical = RunStatisticalTest(
      candidate.out.data(), baseline.out.data(), ctx.reference_out->data(),
      d.batch, d.queries, d.q_heads, d.head_dim, si);
  result->has_statistical = result->statistical.computed;
}

// The drift statistics of out, LSE and log-probs (and the log-prob
// agreement) of one comparison.
absl::Status DriftStep(const CompareContext& ctx, Comparison which,
                       const Side& candidate, const Side& baseline,
                       ComparisonResult* result) {
  ToleranceInputs ti = ctx.tolerance_inputs;
  ti.comparison = which;
  const Tolerances tol = ComputeTolerances(ti, ctx.options.tolerances);
  // The rows with an ambiguous rotated element get their own slack on top
  // of the reported tolerance; the elements over are counted again with it.
  RowTolerances rows =
      ComputeRowTolerances(ti, ctx.row_scores, ctx.options.tolerances);
  TightenRows(ctx, candidate, baseline, tol, &rows);
  auto recount = [](const std::vector<double>& c, const std::vector<double>& b,
                    const std::vector<double>& extra, const uint8_t* mask,
                    DriftStats* stats) {
    if (extra.empty() || c.size() != b.size()) return;
    stats->over_tolerance = CountOverRowTolerance(
        c.data(), b.data(), static_cast<int64_t>(c.size()), stats->tolerance,
        extra, mask);
  };
  const SnapshotDims& d = ctx.dims;
  const std::vector<int64_t> out_shape{d.batch, d.queries, d.q_heads,
                                       d.head_dim};
  const std::vector<int64_t> lse_shape{d.batch, d.queries, d.q_heads};
  const std::vector<int64_t> lp_shape{d.batch, d.queries};
  if (candidate.has_out && baseline.has_out) {
    DriftOptions o;
    o.ulp_dtype = ctx.output_dtype;
    o.tolerance = tol.out_abs;
    ATTNAUDIT_ASSIGN_OR_RETURN(
        result->out,
        ctx.backend.ComputeDrift({candidate.out.data(), out_shape},
                                 {baseline.out.data(), out_shape}, o));
    recount(candidate.out, baseline.out, rows.out, nullptr, &result->out);
    result->has_out = true;
  }
  if (candidate.has_lse && baseline.has_lse) {
    DriftOptions o;
    o.ulp_dtype = DType::kF32;
    o.tolerance = tol.lse_abs;
    ATTNAUDIT_ASSIGN_OR_RETURN(
        result->lse,
        ctx.backend.ComputeDrift({candidate.lse.data(), lse_shape},
                                 {baseline.lse.data(), lse_shape}, o));
    recount(candidate.lse, baseline.lse, rows.lse, nullptr, &result->lse);
    result->has_lse = true;
  }
  if (candidate.has_logprobs && baseline.has_logprobs) {
    const uint8_t* mask = ctx.snapshot.active_mask.present()
                              ? ctx.snapshot.active_mask.data<uint8_t>()
                              : nullptr;
    DriftOptions o;
    o.ulp_dtype = DType::kF32;
    o.tolerance = tol.logprob_abs;
    o.active_mask = mask;
    ATTNAUDIT_ASSIGN_OR_RETURN(
        result->logprob,
        ctx.backend.ComputeDrift({candidate.logprobs.data(), lp_shape},
                                 {baseline.logprobs.data(), lp_shape}, o));
    recount(candidate.logprobs, baseline.logprobs, rows.logprob, mask,
            &result->logprob);
    result->has_logprob = true;
    result->logprob_agreement =
        CompareLogprobs({candidate.logprobs.data(), lp_shape},
                        {baseline.logprobs.data(), lp_shape}, mask);
  }
  return absl::OkStatus();
}

// The heads of out with the largest |diff|.
void WorstHeadsStep(const CompareContext& ctx, const Side& candidate,
                    const Side& baseline, ComparisonResult* result) {
  if (!candidate.has_out || !baseline.has_out) return;
  const SnapshotDims& d = ctx.dims;
  const std::vector<int64_t> out_shape{d.batch, d.queries, d.q_heads,
                                       d.head_dim};
  result->worst_heads = WorstHeads({candidate.out.data(), out_shape},
                                   {baseline.out.data(), out_shape},
                                   ctx.output_dtype, ctx.options.worst_heads);
}

// The independent parts of one comparison: each writes its own fields of
// the result, so the parts of every comparison may run at once.
enum ComparePart { kDriftPart, kWorstHeadsPart, kStatisticalPart, kParts };

absl::Status ComparePartOf(const CompareContext& ctx, ComparePart part,
                           Comparison which, const Side& candidate,
                           const Side& baseline, ComparisonResult* result) {
  switch (part) {
    case kDriftPart:
      return DriftStep(ctx, which, candidate, baseline, result);
    case kWorstHeadsPart:
      WorstHeadsStep(ctx, candidate, baseline, result);
      return absl::OkStatus();
    case kStatisticalPart:
    case kParts:
      break;
  }
  StatisticalStep(ctx, which, candidate, baseline, result);
  return absl::OkStatus();
}

Side EngineSide(const Snapshot& s) {
  Side e;
  const EngineOutput& eng = s.engine;
  if (eng.out.present()) {
    e.out.resize(static_cast<size_t>(eng.out.num_elements()));
    ConvertToDouble(eng.out.raw(), eng.out.dtype(), eng.out.num_elements(),
                    e.out.data());
    e.has_out = true;
  }
  if (eng.lse.present()) {
    e.lse.resize(static_cast<size_t>(eng.lse.num_elements()));
    ConvertToDouble(eng.lse.raw(), eng.lse.dtype(), eng.lse.num_elements(),
                    e.lse.data());
    if (eng.lse_base == LseBase::k2) {
      for (double& x : e.lse) x = LseFromBase2(x);  // convert at the edge
    }
    e.has_lse = true;
  }
  if (eng.logprobs.present()) {
    e.logprobs.resize(static_cast<size_t>(eng.logprobs.num_elements()));
    ConvertToDouble(eng.logprobs.raw(), eng.logprobs.dtype(),
                    eng.logprobs.num_elements(), e.logprobs.data());
    e.has_logprobs = true;
  }
  return e;
}

// Whether only E-M saw the drift: an engine declared with coarse
// arithmetic (16-bit scores) has a wide E-R tolerance, and a bug that stays
// inside it shows against M, the engine's arithmetic replayed.
bool OnlyEmulationDrifted(const AuditReport& report,
                          const std::vector<double>& emulated_out) {
  if (emulated_out.empty()) return false;
  const ComparisonResult* er = report.Find(Comparison::kEngineVsReference);
  return er == nullptr || er->verdict != Verdict::kDrift;
}

// E - M + R: the engine's output with its declared arithmetic's rounding
// taken out (M is that arithmetic on the snapshot's inputs), put back on
// R. A hypothesis is a change to R in fp64; on E' it is scored with the
// noise of an engine that only rounds its output.
std::vector<double> WithoutEmulatedRounding(const std::vector<double>& e,
                                            const std::vector<double>& m,
                                            const std::vector<double>& r) {
  std::vector<double> out(e.size());
  for (size_t i = 0; i < e.size(); ++i) out[i] = e[i] - m[i] + r[i];
  return out;
}

// On DRIFT: which known bug explains E, and where (docs/DIAGNOSIS.md).
absl::Status DiagnosisStep(const Snapshot& s, const ResolvedLayout& layout,
                           const PreparedAttention& prepared,
                           const Side& reference, const Side& engine,
                           const std::vector<double>& emulated_out,
                           const CompareContext& ctx, int threads,
                           AuditReport* report) {
  if (report->verdict != Verdict::kDrift || !ctx.options.diagnose) {
    return absl::OkStatus();
  }
  const Clock::time_point t = Clock::now();
  const std::vector<double> none;
  const bool against_emulation =
      engine.has_out && OnlyEmulationDrifted(*report, emulated_out);
  const std::vector<double> shifted =
      against_emulation
          ? WithoutEmulatedRounding(engine.out, emulated_out, reference.out)
          : std::vector<double>();
  DiagnosisInputs in;
  in.snapshot = &s;
  in.layout = &layout;
  in.prepared = &prepared;
  in.reference_out = &reference.out;
  in.reference_lse = &reference.lse;
  in.engine_out = engine.has_out ? &engine.out : &none;
  in.engine_lse = engine.has_lse ? &engine.lse : &none;
  in.tolerance_inputs = ctx.tolerance_inputs;
  in.tolerance_overrides = ctx.options.tolerances;
  if (against_emulation) {
    // M has no LSE: the engine's, rounded by its coarse scores, would be
    // held to the replay's tolerance, so the hypotheses go on out alone.
    in.engine_out = &shifted;
    in.engine_lse = &none;
    in.engine_arithmetic_removed = true;
    in.tolerance_inputs.engine =
        ReplayArithmetic(prepared.dims.head_dim, s.logit_softcap > 0);
  }
  DiagnosisOptions o;
  o.max_seconds = ctx.options.diagnosis_max_seconds;
  o.threads = threads;
  o.cancelled = ctx.options.cancelled;
  ATTNAUDIT_ASSIGN_OR_RETURN(DiagnosisResult result, Diagnose(in, o));
  report->diagnoses = std::move(result.diagnoses);
  report->diagnosis_run = std::move(result.run);
  if (against_emulation) {
    report->diagnosis_run.note = absl::StrCat(
        "scored against the emulated engine, out only (only E-M drifted)",
        report->diagnosis_run.note.empty() ? "" : "; ",
        report->diagnosis_run.note);
  }
  report->provenance.timings.diagnosis_seconds = SecondsSince(t);
  if (ctx.options.on_stage) {
    ctx.options.on_stage("diagnosis",
                         report->provenance.timings.diagnosis_seconds);
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// One audit's state as it moves through the stages below.
struct AuditRun {
  AuditRun(const Snapshot& s, const AuditOptions& o)
      : snapshot(s),
        options(o),
        backend(o.backend != nullptr ? o.backend : &CpuBackendInstance()),
        start(Clock::now()) {}

  const Snapshot& snapshot;
  const AuditOptions& options;
  // Where R, P, the CP replay and the drift statistics run.
  Backend* backend;
  int threads = 1;
  Clock::time_point start;
  AuditReport report;
  ResolvedLayout layout;
  std::string prefix_digest;
  PreparedAttention prepared;
  AttentionResults results;
  Side reference, replay, engine;
  // M, the emulated engine's output, when E-M drifted (else empty).
  std::vector<double> emulated_out;
  LmHeadNorms norms;
  // CP snapshots: the single pass's unit states (R's, for the ranks'
  // reference partials) and why the CP replay is skipped, if it is.
  UnitStates unit_states;
  bool keep_unit_states = false;
  std::string cp_skipped;
  // The rounding-boundary rows' own bounds (set when any row has slack).
  std::unique_ptr<RowSlackCache> row_slack;

  void StageDone(const char* name, double seconds) const {
    if (options.on_stage) options.on_stage(name, seconds);
  }
};

// validate: everything but the K/V values (the fused pass checks those
// while it reads the cache), then the prefix fingerprint.
absl::Status ValidateStage(AuditRun* run) {
  const Clock::time_point t = Clock::now();
  ATTNAUDIT_ASSIGN_OR_RETURN(
      run->layout,
      ValidateSnapshot(run->snapshot, run->options.limits, ValueScan::kSkipKv));
  ATTNAUDIT_RETURN_IF_ERROR(
      VerifyPrefixFingerprint(run->snapshot, run->layout, &run->prefix_digest));
  run->report.dims = run->layout.dims;
  run->report.provenance.timings.validate_seconds = SecondsSince(t);
  run->StageDone("validate", run->report.provenance.timings.validate_seconds);
  if (IsCancelled(run->options)) {
    return absl::CancelledError("audit cancelled");
  }
  return absl::OkStatus();
}

// InvalidArgument when any value is not finite.
absl::Status RequireFinite(const std::vector<double>& values,
                           absl::string_view message) {
  for (double x : values) {
    if (!std::isfinite(x)) return absl::InvalidArgumentError(message);
  }
  return absl::OkStatus();
}

// The fp64 reference survives inputs (e.g. q near FLT_MAX) whose scores or
// sums no fp32 engine can represent; the fp32 replay is the witness
// ("produced non-finite" is a rejection, not drift, as in the RL-Kernel
// harness: docs/RL_KERNEL_HARNESS.md).
absl::Status CheckAttentionFinite(const AttentionResults& r) {
  ATTNAUDIT_RETURN_IF_ERROR(RequireFinite(
      r.reference_lse,
      "q: finite inputs overflow attention: the full logical-KV reference "
      "produced a non-finite LSE"));
  ATTNAUDIT_RETURN_IF_ERROR(RequireFinite(
      r.reference_out,
      "q: finite inputs overflow attention: the full logical-KV reference "
      "produced a non-finite output"));
  ATTNAUDIT_RETURN_IF_ERROR(RequireFinite(
      r.replay_lse,
      "q: finite inputs overflow fp32 attention: the paged replay produced a "
      "non-finite LSE"));
  return RequireFinite(
      r.replay_out,
      "q: finite inputs overflow fp32 attention or the output dtype: the "
      "paged replay produced a non-finite output");
}

// CP snapshots: the ranks' reference partials come from R's unit states of
// the single pass (no second read of the KV for them), when they fit.
void PlanCpUnitStates(AuditRun* run) {
  if (run->snapshot.cp.world_size <= 1) return;
  const bool with_reference =
      audit_internal::CpNeedsReferenceStates(run->snapshot);
  const int64_t bytes =
      audit_internal::CpStateBytes(run->prepared, with_reference);
  if (bytes > run->options.max_cp_state_bytes) {
    run->cp_skipped = absl::StrCat("the CP replay's unit states need ", bytes,
                                   " bytes, over the limit of ",
                                   run->options.max_cp_state_bytes);
  } else if (with_reference) {
    run->unit_states.has_reference = true;
    run->keep_unit_states = true;
  }
}

// reference + replay: RoPE and scales, then the fused pass (the audit's one
// read of the cache).
absl::Status AttentionStage(AuditRun* run) {
  const Clock::time_point t = Clock::now();
  ATTNAUDIT_ASSIGN_OR_RETURN(
      run->prepared,
      PrepareAttention(run->snapshot, run->layout, run->threads));
  AttentionRunOptions options;
  options.threads = run->threads;
  options.record_merge_orders = run->options.include_merge_orders;
  options.cancelled = run->options.cancelled;
  PlanCpUnitStates(run);
  if (run->keep_unit_states) options.unit_states = &run->unit_states;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      run->results, run->backend->ComputeAttention(run->prepared, options));
  FinishRowSlack(run->results, run->threads, &run->prepared);
  if (!run->prepared.row_score_uncertainty.empty()) {
    run->row_slack = std::make_unique<RowSlackCache>(run->prepared);
  }
  if (run->results.kv_non_finite) {
    // Name the first non-finite K/V value exactly as validation would.
    ATTNAUDIT_RETURN_IF_ERROR(
        ValidateSnapshot(run->snapshot, run->options.limits, ValueScan::kAll)
            .status());
  }
  // R and P share the pass; attribute it in proportion to their arithmetic
  // (fp64 vs fp32), documented in docs/ARCHITECTURE.md.
  const double seconds = SecondsSince(t);
  StageTimings& timings = run->report.provenance.timings;
  timings.reference_seconds = seconds * 2.0 / 3.0;
  timings.replay_seconds = seconds / 3.0;
  run->StageDone("reference", timings.reference_seconds);
  run->StageDone("replay", timings.replay_seconds);
  ATTNAUDIT_RETURN_IF_ERROR(CheckAttentionFinite(run->results));
  AttentionResults& r = run->results;
  run->reference.out = std::move(r.reference_out);
  run->reference.lse = std::move(r.reference_lse);
  run->reference.has_out = run->reference.has_lse = true;
  run->replay.out = std::move(r.replay_out);
  run->replay.lse = std::move(r.replay_lse);
  run->replay.has_out = run->replay.has_lse = true;
  run->engine = EngineSide(run->snapshot);
  return absl::OkStatus();
}

std::vector<int64_t> OutShape(const SnapshotDims& d) {
  return {d.batch, d.queries, d.q_heads, d.head_dim};
}

// The selected-token log-probs of every side, in one pass over lm_head.
// The reference's reads the reference output as the trainer would hold it:
// rounded once to the output dtype.
absl::Status LogprobStage(AuditRun* run) {
  Side rounded_reference;
  rounded_reference.out =
      RoundedCopy(run->reference.out, run->prepared.output_dtype);
  rounded_reference.has_out = true;
  Side* engine = run->engine.has_logprobs ? nullptr : &run->engine;
  ATTNAUDIT_RETURN_IF_ERROR(
      ComputeLogprobs(run->snapshot, {&rounded_reference, &run->replay, engine},
                      OutShape(run->layout.dims), run->threads, &run->norms));
  run->reference.logprobs = std::move(rounded_reference.logprobs);
  run->reference.has_logprobs = rounded_reference.has_logprobs;
  return absl::OkStatus();
}

CompareContext MakeCompareContext(const AuditRun& run) {
  const DType out_dtype = run.prepared.output_dtype;
  CompareContext ctx{*run.backend,       run.snapshot, run.layout.dims,
                     out_dtype,          {},           run.options,
                     &run.reference.out, {},           nullptr};
  ToleranceInputs& ti = ctx.tolerance_inputs;
  ti.output_dtype = out_dtype;
  ti.kv_dtype = run.snapshot.k_pages.dtype();
  ti.max_merged_blocks = std::max<int64_t>(1, run.results.max_merged_blocks);
  ti.max_context = std::max<int64_t>(1, run.results.max_visible_keys);
  ti.max_abs_out_reference = MaxAbs(run.reference.out);
  ti.max_abs_lse_reference = MaxAbs(run.reference.lse);
  ti.lm_head_max_row_l1 = run.norms.max_row_l1;
  ti.lm_head_max_row_l2 = run.norms.max_row_l2;
  ti.logprob_temperature = run.snapshot.logprob_temperature;
  ti.cp_world_size = run.snapshot.cp.world_size;
  const Snapshot& s = run.snapshot;
  ti.engine = ResolveEngineArithmetic(
      s.precision, audit_internal::ModelDType(s), s.k_pages.dtype(),
      run.layout.dims.head_dim, s.logit_softcap > 0);
  ti.replay = ReplayArithmetic(run.layout.dims.head_dim, s.logit_softcap > 0);
  ti.rope_score_uncertainty = run.prepared.rope_score_uncertainty;
  ti.rope_score_noise = run.prepared.rope_score_noise;
  ti.value_max = run.prepared.value_max;
  if (!run.prepared.row_score_uncertainty.empty()) {
    ctx.row_scores.row_score_uncertainty = &run.prepared.row_score_uncertainty;
    ctx.row_scores.row_value_max = &run.prepared.row_value_max;
    ctx.row_scores.q_heads = run.layout.dims.q_heads;
    ctx.row_scores.kv_heads = run.layout.dims.kv_heads;
    ctx.row_query_ambiguous = &run.prepared.row_query_ambiguous;
    ctx.row_slack = run.row_slack.get();
  }
  return ctx;
}

// compare: E-R, P-R and E-P as requested, then the verdict.
absl::Status CompareStage(AuditRun* run) {
  const Clock::time_point t = Clock::now();
  ATTNAUDIT_RETURN_IF_ERROR(LogprobStage(run));
  const CompareContext ctx = MakeCompareContext(*run);
  const bool have_engine = run->engine.has_out || run->engine.has_lse;
  struct Wanted {
    bool requested;
    Comparison which;
    const Side& candidate;
    const Side& baseline;
  };
  const Wanted wanted[] = {
      {run->options.engine_vs_reference && have_engine,
       Comparison::kEngineVsReference, run->engine, run->reference},
      {run->options.replay_vs_reference, Comparison::kReplayVsReference,
       run->replay, run->reference},
      {run->options.engine_vs_replay && have_engine,
       Comparison::kEngineVsReplay, run->engine, run->replay},
  };
  std::vector<const Wanted*> requested;
  for (const Wanted& w : wanted) {
    if (w.requested) requested.push_back(&w);
  }
  // The comparisons' parts are independent; they run in parallel on a
  // backend that serves concurrent calls (core/backend/backend.h).
  const int threads =
      run->backend->capabilities().concurrent_calls ? run->threads : 1;
  const int64_t tasks = static_cast<int64_t>(requested.size()) * kParts;
  std::vector<ComparisonResult> results(requested.size());
  std::vector<absl::Status> statuses(static_cast<size_t>(tasks));
  ParallelFor(tasks, threads, [&](int64_t t) {
    const size_t i = static_cast<size_t>(t / kParts);
    const Wanted& w = *requested[i];
    statuses[static_cast<size_t>(t)] =
        ComparePartOf(ctx, static_cast<ComparePart>(t % kParts), w.which,
                      w.candidate, w.baseline, &results[i]);
  });
  for (const absl::Status& st : statuses) ATTNAUDIT_RETURN_IF_ERROR(st);
  for (size_t i = 0; i < results.size(); ++i) {
    results[i].comparison = requested[i]->which;
    DecideComparison(&results[i]);
    run->report.comparisons.push_back(std::move(results[i]));
  }
  const audit_internal::VerdictInputs verdict{
      *run->backend,
      run->snapshot,
      run->prepared,
      run->reference.out,
      run->engine.has_out ? &run->engine.out : nullptr,
      ctx.tolerance_inputs,
      run->options,
      ctx.output_dtype,
      run->threads};
  ATTNAUDIT_RETURN_IF_ERROR(
      audit_internal::EmulationStep(verdict, &run->report, &run->emulated_out));
  audit_internal::HullStep(verdict, &run->report);
  audit_internal::ConclusionStep(verdict, &run->report);
  run->report.verdict = CombineVerdicts(run->report.comparisons);
  audit_internal::NoteOverrides(verdict, &run->report);
  audit_internal::NoteSensitivity(verdict, &run->report);
  run->report.provenance.timings.compare_seconds = SecondsSince(t);
  run->StageDone("compare", run->report.provenance.timings.compare_seconds);
  return absl::OkStatus();
}

// CP snapshots: the replay on the ranks (the strategy's own work), its two
// combines, and the per-rank and combine attributions.
absl::Status CpStage(AuditRun* run) {
  if (run->snapshot.cp.world_size <= 1) return absl::OkStatus();
  if (IsCancelled(run->options)) return absl::CancelledError("audit cancelled");
  const CompareContext ctx = MakeCompareContext(*run);
  const Side& e = run->engine;
  audit_internal::CpStageInputs in{
      *run->backend,
      run->snapshot,
      run->prepared,
      run->keep_unit_states ? &run->unit_states : nullptr,
      run->reference.out,
      run->reference.lse,
      run->replay.out,
      run->replay.lse,
      e.has_out ? &e.out : nullptr,
      e.has_lse ? &e.lse : nullptr,
      ctx.tolerance_inputs,
      run->options,
      run->threads,
      run->cp_skipped};
  ATTNAUDIT_RETURN_IF_ERROR(audit_internal::RunCpStage(in, &run->report));
  run->report.verdict =
      audit_internal::WithCpVerdict(run->report.cp, run->report.verdict);
  run->StageDone("cp", run->report.provenance.timings.cp_seconds);
  return absl::OkStatus();
}

// The RoPE checks (core/rope_check): their own findings; any DRIFT makes
// the report DRIFT.
absl::Status RopeCheckStage(AuditRun* run) {
  ATTNAUDIT_ASSIGN_OR_RETURN(run->report.rope_checks,
                             RunRopeChecks(run->snapshot, run->layout));
  for (const RopeCheckResult& c : run->report.rope_checks) {
    if (c.verdict == Verdict::kDrift) {
      run->report.verdict = WorseVerdict(run->report.verdict, Verdict::kDrift);
    }
  }
  return absl::OkStatus();
}

// On DRIFT: which known bug explains E (when a comparison or the CP replay
// drifted), and which RoPE bug explains a drifting RoPE check; the RoPE
// checks' findings lead (they are fitted on the very vectors that moved).
absl::Status DiagnosisStage(AuditRun* run) {
  AuditReport& report = run->report;
  bool attention_drift =
      report.cp.present && audit_internal::WithCpVerdict(
                               report.cp, Verdict::kPass) == Verdict::kDrift;
  for (const ComparisonResult& c : report.comparisons) {
    attention_drift |= c.verdict == Verdict::kDrift;
  }
  if (attention_drift) {
    const CompareContext ctx = MakeCompareContext(*run);
    ATTNAUDIT_RETURN_IF_ERROR(DiagnosisStep(
        run->snapshot, run->layout, run->prepared, run->reference, run->engine,
        run->emulated_out, ctx, run->threads, &report));
  }
  if (report.verdict != Verdict::kDrift || !run->options.diagnose) {
    return absl::OkStatus();
  }
  std::vector<Diagnosis> rope =
      DiagnoseRopeChecks(run->snapshot, run->layout, report.rope_checks);
  if (rope.empty()) return absl::OkStatus();
  if (!attention_drift) {
    report.diagnosis_run.ran = true;
    report.diagnosis_run.complete = true;
    report.diagnosis_run.hypotheses = static_cast<int64_t>(rope.size());
    report.diagnoses.clear();
  }
  report.diagnoses.insert(report.diagnoses.begin(), rope.begin(), rope.end());
  return absl::OkStatus();
}

// Where attnaudit's RoPE values came from, when it rotated q or K.
std::string RopeSourceName(const Snapshot& s) {
  if (s.rope.q_state != RopeState::kPreRope &&
      s.rope.k_state != RopeState::kPreRope) {
    return "";
  }
  // A table of another width is not rotated with (RopeTable::Create).
  const bool fits =
      EngineTableFitsRotaryDim(s.rope_table, s.rope, s.q.dim(s.q.rank() - 1));
  if (fits && s.rope_table.positions.present()) return "engine rows";
  if (fits && s.rope_table.inv_freq.present()) return "engine inv_freq";
  return "config";
}

void FillProvenance(AuditRun* run) {
  Provenance& prov = run->report.provenance;
  prov.backend = run->backend->name();
  prov.threads = run->threads;
  prov.softmax_scale = run->prepared.softmax_scale;
  prov.output_dtype = run->prepared.output_dtype;
  prov.max_merged_blocks = run->results.max_merged_blocks;
  prov.merge_orders = std::move(run->results.merge_orders);
  prov.block_owners = run->layout.block_owners;
  prov.prefix_fingerprint = run->prefix_digest;
  prov.rope_fingerprint = RopeIdentityFingerprint(run->snapshot);
  prov.fingerprint_version = kFingerprintVersion;
  if (!run->prefix_digest.empty()) {
    prov.prefix_fingerprint_scheme =
        std::string(PrefixSchemeName(run->snapshot.prefix.scheme));
  }
  prov.engine_profile =
      std::string(EngineProfileName(run->snapshot.precision.profile));
  prov.precision_source =
      std::string(PrecisionSourceName(run->snapshot.precision));
  prov.precision_evidence = run->snapshot.precision.evidence;
  prov.rope_source = RopeSourceName(run->snapshot);
  if (run->options.compute_kv_fingerprint) {
    prov.kv_fingerprint = KvCacheFingerprint(run->snapshot, run->layout);
  }
  prov.timings.total_seconds = SecondsSince(run->start);
}

}  // namespace

bool OverridesPolicy(const Snapshot& snapshot, const AuditOptions& options) {
  const ToleranceOverrides& t = options.tolerances;
  return t.out_abs > 0 || t.lse_abs > 0 || t.logprob_abs > 0 ||
         !options.statistical_test ||
         !PrecisionOverrides(snapshot.precision).empty();
}

absl::StatusOr<AuditReport> AuditSnapshot(const Snapshot& snapshot,
                                          const AuditOptions& options) {
  AuditRun run(snapshot, options);
  run.threads = ResolveThreads(options.threads);
  run.report.labels = snapshot.labels;
  ATTNAUDIT_RETURN_IF_ERROR(ValidateStage(&run));
  ATTNAUDIT_RETURN_IF_ERROR(AttentionStage(&run));
  ATTNAUDIT_RETURN_IF_ERROR(CompareStage(&run));
  ATTNAUDIT_RETURN_IF_ERROR(CpStage(&run));
  ATTNAUDIT_RETURN_IF_ERROR(RopeCheckStage(&run));
  ATTNAUDIT_RETURN_IF_ERROR(DiagnosisStage(&run));
  FillProvenance(&run);
  return std::move(run.report);
}

absl::StatusOr<AuditReport> RunAudit(const Snapshot& snapshot,
                                     const AuditOptions& options) {
  absl::StatusOr<AuditReport> report = AuditSnapshot(snapshot, options);
  if (report.ok() ||
      report.status().code() != absl::StatusCode::kInvalidArgument) {
    return report;
  }
  AuditReport invalid;
  invalid.verdict = Verdict::kInvalid;
  invalid.invalid_reason = std::string(report.status().message());
  invalid.labels = snapshot.labels;
  invalid.dims = DimsOf(snapshot);
  return invalid;
}

}  // namespace attnaudit
