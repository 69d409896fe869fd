#include "core/audit/audit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/attention/merge.h"
#include "core/common/parallel.h"
#include "core/common/status_macros.h"
#include "core/diagnosis/diagnosis.h"
#include "core/drift/drift.h"
#include "core/fingerprint/fingerprint.h"
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

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
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
  const Snapshot& snapshot;
  const SnapshotDims& dims;
  DType output_dtype;
  ToleranceInputs tolerance_inputs;
  const AuditOptions& options;
  const std::vector<double>* reference_out;  // R, for the noise units
};

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
  const SnapshotDims& d = ctx.dims;
  result->statistical = RunStatisticalTest(
      candidate.out.data(), baseline.out.data(), ctx.reference_out->data(),
      d.batch, d.queries, d.q_heads, d.head_dim, si);
  result->has_statistical = result->statistical.computed;
}

absl::StatusOr<ComparisonResult> Compare(const CompareContext& ctx,
                                         Comparison which,
                                         const Side& candidate,
                                         const Side& baseline) {
  ComparisonResult result;
  result.comparison = which;
  ToleranceInputs ti = ctx.tolerance_inputs;
  ti.comparison = which;
  const Tolerances tol = ComputeTolerances(ti, ctx.options.tolerances);
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
        result.out, ComputeDrift({candidate.out.data(), out_shape},
                                 {baseline.out.data(), out_shape}, o));
    result.has_out = true;
    result.worst_heads = WorstHeads({candidate.out.data(), out_shape},
                                    {baseline.out.data(), out_shape},
                                    ctx.output_dtype, ctx.options.worst_heads);
  }
  if (candidate.has_lse && baseline.has_lse) {
    DriftOptions o;
    o.ulp_dtype = DType::kF32;
    o.tolerance = tol.lse_abs;
    ATTNAUDIT_ASSIGN_OR_RETURN(
        result.lse, ComputeDrift({candidate.lse.data(), lse_shape},
                                 {baseline.lse.data(), lse_shape}, o));
    result.has_lse = true;
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
        result.logprob, ComputeDrift({candidate.logprobs.data(), lp_shape},
                                     {baseline.logprobs.data(), lp_shape}, o));
    result.has_logprob = true;
    result.logprob_agreement =
        CompareLogprobs({candidate.logprobs.data(), lp_shape},
                        {baseline.logprobs.data(), lp_shape}, mask);
  }
  StatisticalStep(ctx, which, candidate, baseline, &result);
  DecideComparison(&result);
  return result;
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

// On DRIFT: which known bug explains E, and where (docs/DIAGNOSIS.md).
absl::Status DiagnosisStep(const Snapshot& s, const ResolvedLayout& layout,
                           const PreparedAttention& prepared,
                           const Side& reference, const Side& engine,
                           const CompareContext& ctx, int threads,
                           AuditReport* report) {
  if (report->verdict != Verdict::kDrift || !ctx.options.diagnose) {
    return absl::OkStatus();
  }
  const Clock::time_point t = Clock::now();
  const std::vector<double> none;
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
  DiagnosisOptions o;
  o.max_seconds = ctx.options.diagnosis_max_seconds;
  o.threads = threads;
  o.cancelled = ctx.options.cancelled;
  ATTNAUDIT_ASSIGN_OR_RETURN(DiagnosisResult result, Diagnose(in, o));
  report->diagnoses = std::move(result.diagnoses);
  report->diagnosis_run = std::move(result.run);
  report->provenance.timings.diagnosis_seconds = SecondsSince(t);
  if (ctx.options.on_stage) {
    ctx.options.on_stage("diagnosis",
                         report->provenance.timings.diagnosis_seconds);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AuditReport> AuditSnapshot(const Snapshot& snapshot,
                                          const AuditOptions& options) {
  const Clock::time_point start = Clock::now();
  const int threads = ResolveThreads(options.threads);
  AuditReport report;
  report.labels = snapshot.labels;
  auto stage_done = [&](const char* name, double seconds) {
    if (options.on_stage) options.on_stage(name, seconds);
  };

  // validate
  Clock::time_point t = Clock::now();
  // K/V values are checked finite by the fused pass (one read of the cache).
  ATTNAUDIT_ASSIGN_OR_RETURN(
      ResolvedLayout layout,
      ValidateSnapshot(snapshot, options.limits, ValueScan::kSkipKv));
  std::string prefix_digest;
  ATTNAUDIT_RETURN_IF_ERROR(
      VerifyPrefixFingerprint(snapshot, layout, &prefix_digest));
  report.dims = layout.dims;
  const SnapshotDims& d = layout.dims;
  report.provenance.timings.validate_seconds = SecondsSince(t);
  stage_done("validate", report.provenance.timings.validate_seconds);
  if (IsCancelled(options)) return absl::CancelledError("audit cancelled");

  // reference + replay (one fused pass)
  t = Clock::now();
  ATTNAUDIT_ASSIGN_OR_RETURN(PreparedAttention prepared,
                             PrepareAttention(snapshot, layout, threads));
  AttentionRunOptions run;
  run.threads = threads;
  run.record_merge_orders = options.include_merge_orders;
  run.cancelled = options.cancelled;
  ATTNAUDIT_ASSIGN_OR_RETURN(AttentionResults results,
                             ComputeAttention(prepared, run));
  if (results.kv_non_finite) {
    // Name the first non-finite K/V value exactly as validation would.
    ATTNAUDIT_RETURN_IF_ERROR(
        ValidateSnapshot(snapshot, options.limits, ValueScan::kAll).status());
  }
  const double attention_seconds = SecondsSince(t);
  // R and P share the pass; attribute it in proportion to their arithmetic
  // (fp64 vs fp32), documented in docs/ARCHITECTURE.md.
  report.provenance.timings.reference_seconds = attention_seconds * 2.0 / 3.0;
  report.provenance.timings.replay_seconds = attention_seconds / 3.0;
  stage_done("reference", report.provenance.timings.reference_seconds);
  stage_done("replay", report.provenance.timings.replay_seconds);
  for (double x : results.reference_lse) {
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(
          "q: finite inputs overflow attention: the full logical-KV reference "
          "produced a non-finite LSE");
    }
  }
  for (double x : results.reference_out) {
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(
          "q: finite inputs overflow attention: the full logical-KV reference "
          "produced a non-finite output");
    }
  }
  // The fp64 reference survives inputs (e.g. q near FLT_MAX) whose scores
  // or sums no fp32 engine can represent; the fp32 replay is the witness
  // (seed harness: "produced non-finite" is a rejection, not drift).
  for (double x : results.replay_lse) {
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(
          "q: finite inputs overflow fp32 attention: the paged replay "
          "produced a non-finite LSE");
    }
  }
  for (double x : results.replay_out) {
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(
          "q: finite inputs overflow fp32 attention or the output dtype: the "
          "paged replay produced a non-finite output");
    }
  }

  // compare
  t = Clock::now();
  const DType out_dtype = prepared.output_dtype;
  const std::vector<int64_t> out_shape{d.batch, d.queries, d.q_heads,
                                       d.head_dim};
  Side reference;
  reference.out = std::move(results.reference_out);
  reference.lse = std::move(results.reference_lse);
  reference.has_out = reference.has_lse = true;
  Side replay;
  replay.out = std::move(results.replay_out);
  replay.lse = std::move(results.replay_lse);
  replay.has_out = replay.has_lse = true;
  Side engine = EngineSide(snapshot);
  LmHeadNorms norms;
  {
    // The reference log-prob reads the reference output as the trainer
    // would hold it: rounded once to the output dtype. The three sides'
    // log-probs are independent; compute them concurrently.
    Side rounded_reference;
    rounded_reference.out = RoundedCopy(reference.out, out_dtype);
    rounded_reference.has_out = true;
    ATTNAUDIT_RETURN_IF_ERROR(ComputeLogprobs(
        snapshot,
        {&rounded_reference, &replay, engine.has_logprobs ? nullptr : &engine},
        out_shape, threads, &norms));
    reference.logprobs = std::move(rounded_reference.logprobs);
    reference.has_logprobs = rounded_reference.has_logprobs;
  }

  CompareContext ctx{snapshot, d, out_dtype, {}, options, &reference.out};
  ctx.tolerance_inputs.output_dtype = out_dtype;
  ctx.tolerance_inputs.kv_dtype = snapshot.k_pages.dtype();
  ctx.tolerance_inputs.max_merged_blocks =
      std::max<int64_t>(1, results.max_merged_blocks);
  ctx.tolerance_inputs.max_context =
      std::max<int64_t>(1, results.max_visible_keys);
  ctx.tolerance_inputs.max_abs_out_reference = MaxAbs(reference.out);
  ctx.tolerance_inputs.max_abs_lse_reference = MaxAbs(reference.lse);
  ctx.tolerance_inputs.lm_head_max_row_l1 = norms.max_row_l1;
  ctx.tolerance_inputs.lm_head_max_row_l2 = norms.max_row_l2;
  ctx.tolerance_inputs.logprob_temperature = snapshot.logprob_temperature;

  const bool have_engine = engine.has_out || engine.has_lse;
  if (options.engine_vs_reference && have_engine) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        ComparisonResult r,
        Compare(ctx, Comparison::kEngineVsReference, engine, reference));
    report.comparisons.push_back(std::move(r));
  }
  if (options.replay_vs_reference) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        ComparisonResult r,
        Compare(ctx, Comparison::kReplayVsReference, replay, reference));
    report.comparisons.push_back(std::move(r));
  }
  if (options.engine_vs_replay && have_engine) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        ComparisonResult r,
        Compare(ctx, Comparison::kEngineVsReplay, engine, replay));
    report.comparisons.push_back(std::move(r));
  }
  report.verdict = CombineVerdicts(report.comparisons);
  report.provenance.timings.compare_seconds = SecondsSince(t);
  stage_done("compare", report.provenance.timings.compare_seconds);
  ATTNAUDIT_RETURN_IF_ERROR(DiagnosisStep(snapshot, layout, prepared, reference,
                                          engine, ctx, threads, &report));

  // provenance
  Provenance& prov = report.provenance;
  prov.backend = "cpu";
  prov.threads = threads;
  prov.softmax_scale = prepared.softmax_scale;
  prov.output_dtype = out_dtype;
  prov.max_merged_blocks = results.max_merged_blocks;
  prov.merge_orders = std::move(results.merge_orders);
  prov.block_owners = layout.block_owners;
  prov.prefix_fingerprint = prefix_digest;
  prov.rope_fingerprint = RopeIdentityFingerprint(snapshot);
  prov.fingerprint_version = kFingerprintVersion;
  if (options.compute_kv_fingerprint) {
    prov.kv_fingerprint = KvCacheFingerprint(snapshot, layout);
  }
  prov.timings.total_seconds = SecondsSince(start);
  return report;
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
