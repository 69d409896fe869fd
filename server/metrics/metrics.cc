#include "server/metrics/metrics.h"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/diagnosis/diagnosis.h"
#include "core/pairs/pairs.h"
#include "server/metrics/metrics_impl.h"

namespace attnaudit::server {
namespace metrics_internal {

// Upper bounds 1, 2 and 5 times each power of ten from 10^lo_exp up to
// `hi` (one of them). Parsed from decimal text so that each bound is the
// double nearest its decimal spelling and renders back as written.
std::vector<double> OneTwoFive(int lo_exp, double hi) {
  std::vector<double> bounds;
  for (int e = lo_exp; e < 30; ++e) {
    for (int m : {1, 2, 5}) {
      double v = 0;
      if (!absl::SimpleAtod(absl::StrCat(m, "e", e), &v)) continue;
      if (v > hi * (1 + 1e-12)) return bounds;
      bounds.push_back(v);
    }
  }
  return bounds;
}

// Drift buckets, one set per quantity, over the range that matters for it
// (docs/OPERATIONS.md "Drift histogram buckets" has the reasoning):
//   out |diff|   1e-7 .. 5: fp32 replay vs fp64 (~1e-7) to a wrong output
//   lse |diff|   1e-7 .. 10: fp32 rounding to a base-2/ln mix-up (~4)
//   log-prob     1e-6 .. 20 nats: fp32 log-softmax to a wrong token
//   ULP          0, 1 .. 1e6: bit-exact, bf16/f16 rounding (a few), an f32
//                output of a bf16 engine (1e3..1e5)
const std::vector<double>& DriftBuckets(DriftFamily family) {
  static const auto* buckets = [] {
    auto* b = new std::array<std::vector<double>, kNumDriftFamilies>;
    (*b)[kOutMaxAbs] = OneTwoFive(-7, 5);
    (*b)[kLseMaxAbs] = OneTwoFive(-7, 10);
    (*b)[kLogprobAbsDiff] = OneTwoFive(-6, 20);
    (*b)[kOutMaxUlp] = OneTwoFive(0, 1e6);
    (*b)[kOutMaxUlp].insert((*b)[kOutMaxUlp].begin(), 0.0);  // bit-exact
    return b;
  }();
  return (*buckets)[family];
}
}  // namespace metrics_internal

namespace {

using metrics_internal::kLogprobAbsDiff;
using metrics_internal::kLseMaxAbs;
using metrics_internal::kNumDriftFamilies;
using metrics_internal::kNumOutcomes;
using metrics_internal::kNumStages;
using metrics_internal::kNumVerdicts;
using metrics_internal::kOutMaxAbs;
using metrics_internal::kOutMaxUlp;
using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

constexpr const char* kStageNames[kNumStages] = {"validate", "reference",
                                                 "replay", "compare"};
constexpr const char* kOutcomeNames[kNumOutcomes] = {
    "ok", "failed", "cancelled", "deadline_exceeded", "unavailable"};
constexpr Verdict kVerdicts[] = {Verdict::kPass, Verdict::kDrift,
                                 Verdict::kInvalid, Verdict::kInconclusive};
// The verdicts a (model, layer) or a comparison can have.
constexpr Verdict kAuditedVerdicts[] = {Verdict::kPass, Verdict::kDrift,
                                        Verdict::kInconclusive};
constexpr const char* kTruncatedLabelNames[] = {
    "model", "engine", "backend", "request_id", "run", "weight_version"};
constexpr const char* kPairSideNames[] = {"joined", "waiting", "dropped",
                                          "failed"};
constexpr const char* kCallEndNames[] = {"credentials", "upload_idle"};

const Histogram::BucketBoundaries& SecondsBuckets() {
  static const auto* b = new Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
      0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
  return *b;
}

// A family registered on `r` with its name and help text.
prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& r,
                                                       const char* name,
                                                       const char* help) {
  return BuildCounter().Name(name).Help(help).Register(r);
}
prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& r,
                                                   const char* name,
                                                   const char* help) {
  return BuildGauge().Name(name).Help(help).Register(r);
}
prometheus::Family<Histogram>& HistogramFamily(prometheus::Registry& r,
                                               const char* name,
                                               const char* help) {
  return BuildHistogram().Name(name).Help(help).Register(r);
}

// NaN would land in the lowest bucket (every `le` comparison is false) and
// +Inf would poison _sum forever: both are recorded as a large finite value,
// i.e. in the +Inf bucket.
double Sanitize(double v) {
  if (std::isnan(v) || std::isinf(v)) return 1e9;
  return v;
}

int OutcomeIndex(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kCancelled:
      return 2;
    case absl::StatusCode::kDeadlineExceeded:
      return 3;
    case absl::StatusCode::kUnavailable:
      return 4;
    default:
      return 1;
  }
}

}  // namespace

Metrics::Impl::KindSeries& Metrics::Impl::Kind(absl::string_view kind) {
  auto it = kinds.find(kind);
  if (it != kinds.end()) return it->second;
  KindSeries& s = kinds[std::string(kind)];
  const std::string k(kind);
  for (int i = 0; i < kNumStages; ++i) {
    s.stages[i] = &stage_duration->Add(
        {{"stage", kStageNames[i]}, {"device_kind", k}}, SecondsBuckets());
  }
  s.job = &job_duration->Add({{"device_kind", k}}, SecondsBuckets());
  s.idle = &devices->Add({{"kind", k}, {"state", "idle"}});
  s.busy = &devices->Add({{"kind", k}, {"state", "busy"}});
  s.failed = &devices->Add({{"kind", k}, {"state", "failed"}});
  return s;
}

prometheus::Counter& Metrics::Impl::LayerAudits(const std::string& model,
                                                const std::string& layer,
                                                const std::string& verdict) {
  auto key = [&](absl::string_view v) {
    return absl::StrCat(model, "\x1f", layer, "\x1f", v);
  };
  auto it = layer_audit_series.find(key(verdict));
  if (it != layer_audit_series.end()) return *it->second;
  // Every verdict of a new (model, layer) starts together, at zero: a DRIFT
  // series born at 1 would hide that audit from rate() (a counter's first
  // sample is no increase). Only the very first audit of the pair is.
  for (Verdict v : kAuditedVerdicts) {
    const std::string name(VerdictName(v));
    layer_audit_series[key(name)] = &layer_audits->Add(
        {{"model", model}, {"layer", layer}, {"verdict", name}});
  }
  return *layer_audit_series[key(verdict)];
}

prometheus::Counter* Metrics::Impl::PairVerdicts(const std::string& layer,
                                                 absl::string_view verdict) {
  auto key = [&](absl::string_view v) { return absl::StrCat(layer, "\x1f", v); };
  auto it = pair_verdict_series.find(key(verdict));
  if (it != pair_verdict_series.end()) return it->second;
  const absl::string_view first = PairVerdictName(PairVerdict::kConsistent);
  if (pair_verdict_series.contains(key(first))) return nullptr;  // unknown
  // A new layer's verdicts start together at zero, as LayerAudits' do.
  for (int v = 0; v <= static_cast<int>(PairVerdict::kBothDrift); ++v) {
    const std::string name(PairVerdictName(static_cast<PairVerdict>(v)));
    pair_verdict_series[key(name)] =
        &pair_verdicts->Add({{"layer", layer}, {"verdict", name}});
  }
  it = pair_verdict_series.find(key(verdict));
  return it == pair_verdict_series.end() ? nullptr : it->second;
}

std::array<Histogram*, kNumDriftFamilies>& Metrics::Impl::Drift(
    Comparison c, const std::string& model, const std::string& layer) {
  const std::string key =
      absl::StrCat(static_cast<int>(c), "\x1f", model, "\x1f", layer);
  auto it = drift_series.find(key);
  if (it != drift_series.end()) return it->second;
  std::array<Histogram*, kNumDriftFamilies>& s = drift_series[key];
  const prometheus::Labels labels = {
      {"comparison", std::string(ComparisonName(c))},
      {"model", model},
      {"layer", layer}};
  for (int f = 0; f < kNumDriftFamilies; ++f) {
    s[f] = &drift[f]->Add(labels,
                          metrics_internal::DriftBuckets(
                              static_cast<metrics_internal::DriftFamily>(f)));
  }
  return s;
}

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

void Metrics::Impl::RegisterVerdicts(prometheus::Registry& r) {
  GaugeFamily(r, "attnaudit_build_info",
              "Build information; the value is always 1.")
      .Add({{"version", options.version}})
      .Set(1);
  auto& audit_family = CounterFamily(
      r, "attnaudit_audits_total",
      "Audits completed, by overall verdict and whether the request "
      "overrode the verdict policy.");
  auto& cmp = CounterFamily(r, "attnaudit_comparison_verdicts_total",
                            "Comparison results, by comparison and verdict.");
  auto& diagnosis_family = CounterFamily(
      r, "attnaudit_diagnoses_total",
      "Drifting audits, by the hypothesis their diagnosis ranked first.");
  for (const std::string& h : HypothesisNames()) {
    diagnoses[h] = &diagnosis_family.Add({{"hypothesis", h}});
  }
  layer_audits = &CounterFamily(
      r, "attnaudit_layer_audits_total",
      "Audits completed, by model, layer and verdict (PASS, DRIFT or "
      "INCONCLUSIVE).");
  for (Verdict v : kVerdicts) {
    const std::string name(VerdictName(v));
    for (int o = 0; o < 2; ++o) {
      audits[static_cast<int>(v)][o] = &audit_family.Add(
          {{"verdict", name}, {"overridden", o == 1 ? "true" : "false"}});
    }
  }
  for (Verdict v : kAuditedVerdicts) {
    const std::string name(VerdictName(v));
    for (int c = 0; c < kNumComparisons; ++c) {
      comparison_verdicts[c][static_cast<int>(v)] =
          &cmp.Add({{"comparison",
                     std::string(ComparisonName(static_cast<Comparison>(c)))},
                    {"verdict", name}});
    }
  }
}

void Metrics::Impl::RegisterDrift(prometheus::Registry& r) {
  const char* names[kNumDriftFamilies][2] = {
      {"attnaudit_drift_out_max_abs",
       "Largest |candidate - baseline| of the attention output per audit."},
      {"attnaudit_drift_out_max_ulp",
       "Largest ULP distance of the attention output (output dtype)."},
      {"attnaudit_drift_lse_max_abs",
       "Largest |candidate - baseline| of the log-sum-exp (natural log)."},
      {"attnaudit_drift_logprob_abs_diff",
       "Largest |candidate - baseline| of the selected-token log-probs."}};
  for (int f = 0; f < kNumDriftFamilies; ++f) {
    drift[f] = &HistogramFamily(r, names[f][0], names[f][1]);
  }
}

void Metrics::Impl::RegisterQueues(prometheus::Registry& r) {
  auto& depth = GaugeFamily(r, "attnaudit_queue_depth",
                            "Jobs waiting in the scheduler queue, by class.");
  auto& capacity = GaugeFamily(r, "attnaudit_queue_capacity",
                               "Maximum jobs the class queue holds.");
  auto& wait =
      HistogramFamily(r, "attnaudit_queue_wait_seconds",
                      "Time from admission until a device took the job.");
  auto& completed = CounterFamily(r, "attnaudit_jobs_completed_total",
                                  "Jobs finished, by class and outcome.");
  for (int c = 0; c < kNumPriorityClasses; ++c) {
    const std::string cls(PriorityClassLabel(static_cast<PriorityClass>(c)));
    queue_depth[c] = &depth.Add({{"class", cls}});
    queue_capacity[c] = &capacity.Add({{"class", cls}});
    queue_capacity[c]->Set(static_cast<double>(options.queue_capacity[c]));
    queue_wait[c] = &wait.Add({{"class", cls}}, SecondsBuckets());
    for (int o = 0; o < kNumOutcomes; ++o) {
      jobs_completed[c][o] =
          &completed.Add({{"class", cls}, {"outcome", kOutcomeNames[o]}});
    }
  }
  queued_bytes = &GaugeFamily(r, "attnaudit_queued_bytes",
                              "Bytes of all queued jobs (memory budget use).")
                      .Add({});
}

void Metrics::Impl::RegisterJobs(prometheus::Registry& r) {
  stage_duration =
      &HistogramFamily(r, "attnaudit_job_stage_duration_seconds",
                       "Time per audit stage, by stage and device kind.");
  job_duration = &HistogramFamily(r, "attnaudit_job_duration_seconds",
                                  "Device run time per job, by device kind.");
  received_bytes = &CounterFamily(r, "attnaudit_received_bytes_total",
                                  "Snapshot bytes received over RPC.")
                        .Add({});
  auto& truncated =
      CounterFamily(r, "attnaudit_labels_truncated_total",
                    "Label values cut to the length bound, by label.");
  for (size_t i = 0; i < labels_truncated.size(); ++i) {
    labels_truncated[i] = &truncated.Add({{"label", kTruncatedLabelNames[i]}});
  }
  pair_verdicts = &CounterFamily(
      r, "attnaudit_pair_verdicts_total",
      "Row pairs of the train-rollout pairs this replica joined, by layer "
      "and pair verdict.");
  auto& sides = CounterFamily(
      r, "attnaudit_pair_sides_total",
      "Audited snapshots with a pair role, by what became of them: joined, "
      "waiting (kept for a counterpart), dropped, failed.");
  for (size_t i = 0; i < pair_sides.size(); ++i) {
    pair_sides[i] = &sides.Add({{"outcome", kPairSideNames[i]}});
  }
  auto& ended = CounterFamily(
      r, "attnaudit_calls_ended_total",
      "Calls the server ended in progress, by reason: credentials (revoked "
      "or changed by a token file reload), upload_idle (an AuditStream "
      "silent past --upload-idle-timeout).");
  for (size_t i = 0; i < calls_ended.size(); ++i) {
    calls_ended[i] = &ended.Add({{"reason", kCallEndNames[i]}});
  }
  store_up = &GaugeFamily(r, "attnaudit_store_up",
                          "1 while the job store answers (its result feed "
                          "is read at least every 200 ms), 0 while it does "
                          "not.")
                  .Add({});
  store_up->Set(1);
  jobs_taken_over =
      &CounterFamily(r, "attnaudit_fleet_jobs_taken_over_total",
                     "Unfinished jobs of a replica that was gone (or "
                     "drained) that this replica claimed and ran.")
           .Add({});
  auto& rejection_family = CounterFamily(r, "attnaudit_rejections_total",
                                         "Requests refused, by reason.");
  for (int i = 0; i < kNumRejectReasons; ++i) {
    rejections[i] = &rejection_family.Add(
        {{"reason",
          std::string(RejectReasonLabel(static_cast<RejectReason>(i)))}});
  }
  inflight =
      &GaugeFamily(r, "attnaudit_inflight_jobs", "Jobs running on a device.")
           .Add({});
  devices = &GaugeFamily(r, "attnaudit_devices",
                         "Devices in the pool, by kind and state.");
  absl::MutexLock lock(&mu);
  Kind("cpu");
  for (const std::string& kind : options.device_kinds) Kind(kind);
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(
    const MetricsOptions& options) {
  if (options.max_models < 1 || options.max_layers < 1) {
    return absl::InvalidArgumentError("max_models/max_layers: must be >= 1");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->models = std::make_unique<LabelBounder>(options.max_models);
  impl->layers = std::make_unique<LabelBounder>(options.max_layers);
  // prometheus-cpp reports misuse with exceptions; none may escape.
  try {
    impl->registry = std::make_shared<prometheus::Registry>();
    impl->RegisterVerdicts(*impl->registry);
    impl->RegisterDrift(*impl->registry);
    impl->RegisterQueues(*impl->registry);
    impl->RegisterJobs(*impl->registry);
    impl->RegisterCp(*impl->registry);
    impl->RegisterRopeChecks(*impl->registry);
    impl->RegisterDevices(*impl->registry);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("metrics registration failed: ", e.what()));
  }
  std::unique_ptr<Metrics> metrics(new Metrics(std::move(impl)));
  metrics->impl_->listener =
      std::make_unique<metrics_internal::MetricsListener>(metrics.get());
  return metrics;
}

void Metrics::Impl::RegisterCp(prometheus::Registry& r) {
  auto& family = CounterFamily(
      r, "attnaudit_cp_checks_total",
      "Checks of context-parallel audits, by check, rank and verdict.");
  const std::string verdicts[2] = {std::string(VerdictName(Verdict::kPass)),
                                   std::string(VerdictName(Verdict::kDrift))};
  const int ranks = std::max(0, options.max_cp_ranks);
  cp_rank_checks.resize(static_cast<size_t>(ranks) + 1);
  for (int k = 0; k <= ranks; ++k) {
    const std::string rank = k < ranks ? absl::StrCat(k) : "other";
    for (int v = 0; v < 2; ++v) {
      cp_rank_checks[k][v] = &family.Add(
          {{"check", "rank"}, {"rank", rank}, {"verdict", verdicts[v]}});
    }
  }
  const char* checks[3] = {"engine_order", "deterministic", "combine"};
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 2; ++v) {
      cp_checks[c][v] = &family.Add(
          {{"check", checks[c]}, {"rank", "all"}, {"verdict", verdicts[v]}});
    }
  }
}

const char* const kRopeCheckNames[3] = {"q", "k", "table"};

void Metrics::Impl::RegisterRopeChecks(prometheus::Registry& r) {
  auto& family = CounterFamily(
      r, "attnaudit_rope_checks_total",
      "RoPE checks (the rolling check of q and keys, the engine's table), "
      "by check and verdict.");
  for (int c = 0; c < 3; ++c) {
    rope_checks[c][0] =
        &family.Add({{"check", kRopeCheckNames[c]},
                     {"verdict", std::string(VerdictName(Verdict::kPass))}});
    rope_checks[c][1] =
        &family.Add({{"check", kRopeCheckNames[c]},
                     {"verdict", std::string(VerdictName(Verdict::kDrift))}});
  }
}

void Metrics::Impl::ObserveRopeChecks(
    const std::vector<RopeCheckResult>& checks) {
  for (const RopeCheckResult& check : checks) {
    for (int c = 0; c < 3; ++c) {
      if (check.what != kRopeCheckNames[c]) continue;
      if (check.verdict == Verdict::kPass) rope_checks[c][0]->Increment();
      if (check.verdict == Verdict::kDrift) rope_checks[c][1]->Increment();
    }
  }
}

void Metrics::Impl::RegisterDevices(prometheus::Registry& r) {
  auto& jobs = CounterFamily(r, "attnaudit_device_jobs_total",
                             "Jobs run, by device of the pool.");
  auto& busy = CounterFamily(r, "attnaudit_device_busy_seconds_total",
                             "Seconds spent running jobs, by device.");
  auto& memory = GaugeFamily(
      r, "attnaudit_device_memory_bytes",
      "Device memory held when the device's last job ended (a GPU: its "
      "pool's bytes in use plus its NCCL communicators' buffers), by "
      "device.");
  auto series = [&](const std::string& name) {
    return DeviceSeries{&jobs.Add({{"device", name}}),
                        &busy.Add({{"device", name}}),
                        &memory.Add({{"device", name}})};
  };
  for (const std::string& name : options.device_names) {
    if (name != "other" && !device_series.contains(name)) {
      device_series[name] = series(name);
    }
  }
  other_device = series("other");
}

void Metrics::Impl::ObserveCp(const CpReport& cp) {
  if (!cp.present || !cp.skipped.empty()) return;
  auto count = [](std::array<prometheus::Counter*, 2>& c, Verdict v) {
    if (v == Verdict::kPass) c[0]->Increment();
    if (v == Verdict::kDrift) c[1]->Increment();
  };
  count(cp_checks[0], cp.engine_order.verdict);
  count(cp_checks[1], cp.deterministic.verdict);
  if (cp.has_combine) count(cp_checks[2], cp.combine.verdict);
  const int64_t other = static_cast<int64_t>(cp_rank_checks.size()) - 1;
  for (const CpRankCheck& r : cp.ranks) {
    const int64_t k = r.rank >= 0 && r.rank < other ? r.rank : other;
    count(cp_rank_checks[k], r.check.verdict);
  }
}

void Metrics::ObserveReport(const AuditReport& report,
                            const JobLabels& labels) {
  if (report.verdict == Verdict::kUnspecified) return;
  Impl& m = *impl_;
  const int v = static_cast<int>(report.verdict);
  const int overridden = report.overrides.empty() ? 0 : 1;
  if (v > 0 && v < kNumVerdicts && m.audits[v][overridden] != nullptr)
    m.audits[v][overridden]->Increment();
  m.ObserveCp(report.cp);
  m.ObserveRopeChecks(report.rope_checks);
  if (!report.diagnoses.empty()) {
    auto it = m.diagnoses.find(report.diagnoses[0].hypothesis);
    if (it != m.diagnoses.end()) it->second->Increment();
  }

  const std::string& raw_model =
      labels.model.empty() ? report.labels.model : labels.model;
  const int64_t raw_layer =
      labels.layer >= 0 ? labels.layer : report.labels.layer;
  const std::string model =
      raw_model.empty() ? "unknown" : m.models->Bound(raw_model);
  const std::string layer =
      raw_layer < 0 ? "unknown" : m.layers->Bound(absl::StrCat(raw_layer));

  absl::MutexLock lock(&m.mu);
  if (report.verdict == Verdict::kPass || report.verdict == Verdict::kDrift ||
      report.verdict == Verdict::kInconclusive) {
    m.LayerAudits(model, layer, std::string(VerdictName(report.verdict)))
        .Increment();
  }
  for (const ComparisonResult& cr : report.comparisons) {
    const int c = static_cast<int>(cr.comparison);
    if (c < 0 || c >= kNumComparisons) continue;
    const int cv = static_cast<int>(cr.verdict);
    if (cv > 0 && cv < kNumVerdicts &&
        m.comparison_verdicts[c][cv] != nullptr) {
      m.comparison_verdicts[c][cv]->Increment();
    }
    auto& h = m.Drift(cr.comparison, model, layer);
    if (cr.has_out) {
      h[kOutMaxAbs]->Observe(Sanitize(cr.out.max_abs));
      h[kOutMaxUlp]->Observe(Sanitize(cr.out.max_ulp));
    }
    if (cr.has_lse) h[kLseMaxAbs]->Observe(Sanitize(cr.lse.max_abs));
    if (cr.has_logprob)
      h[kLogprobAbsDiff]->Observe(Sanitize(cr.logprob.max_abs));
  }
}

void Metrics::ObserveStages(const StageTimings& t,
                            absl::string_view device_kind) {
  absl::MutexLock lock(&impl_->mu);
  auto& s = impl_->Kind(device_kind).stages;
  // A stage that did not run (e.g. after validation failed) reports 0 s;
  // observing it would drag the histogram towards zero.
  const double seconds[kNumStages] = {t.validate_seconds, t.reference_seconds,
                                      t.replay_seconds, t.compare_seconds};
  for (int i = 0; i < kNumStages; ++i) {
    if (seconds[i] > 0) s[i]->Observe(seconds[i]);
  }
}

void Metrics::ObserveQueueWait(PriorityClass c, absl::Duration wait) {
  impl_->queue_wait[static_cast<int>(c)]->Observe(absl::ToDoubleSeconds(wait));
}

void Metrics::ObserveJobDuration(absl::string_view device_kind,
                                 absl::Duration run) {
  absl::MutexLock lock(&impl_->mu);
  impl_->Kind(device_kind).job->Observe(absl::ToDoubleSeconds(run));
}

void Metrics::CountJob(PriorityClass c, const absl::Status& status) {
  impl_->jobs_completed[static_cast<int>(c)][OutcomeIndex(status)]->Increment();
}

void Metrics::CountRejection(RejectReason reason) {
  const int i = static_cast<int>(reason);
  if (i >= 0 && i < kNumRejectReasons) impl_->rejections[i]->Increment();
}

void Metrics::CountInvalidInput(InvalidInput where) {
  CountRejection(RejectReason::kInvalidArgument);
  if (where == InvalidInput::kAuditRequest) {
    impl_->audits[static_cast<int>(Verdict::kInvalid)][0]->Increment();
  }
}

void Metrics::AddBytesReceived(int64_t bytes) {
  if (bytes > 0) impl_->received_bytes->Increment(static_cast<double>(bytes));
}

void Metrics::CountTruncatedLabel(absl::string_view label, int64_t n) {
  if (n <= 0) return;
  for (size_t i = 0; i < impl_->labels_truncated.size(); ++i) {
    if (label == kTruncatedLabelNames[i]) {
      impl_->labels_truncated[i]->Increment(static_cast<double>(n));
    }
  }
}

void Metrics::CountPairVerdicts(int64_t layer, absl::string_view verdict,
                                int64_t n) {
  if (n <= 0) return;
  Impl& m = *impl_;
  const std::string bounded =
      layer < 0 ? "unknown" : m.layers->Bound(absl::StrCat(layer));
  absl::MutexLock lock(&m.mu);
  prometheus::Counter* c = m.PairVerdicts(bounded, verdict);
  if (c != nullptr) c->Increment(static_cast<double>(n));
}

void Metrics::CountPairSide(PairSide outcome) {
  impl_->pair_sides[static_cast<int>(outcome)]->Increment();
}

void Metrics::SetStoreUp(bool up) { impl_->store_up->Set(up ? 1 : 0); }

void Metrics::CountJobsTakenOver(int64_t n) {
  if (n > 0) impl_->jobs_taken_over->Increment(static_cast<double>(n));
}

void Metrics::CountCallsEnded(CallEnd why, int64_t n) {
  if (n > 0) {
    impl_->calls_ended[static_cast<int>(why)]->Increment(
        static_cast<double>(n));
  }
}

void Metrics::SetQueueDepth(PriorityClass c, int64_t depth) {
  impl_->queue_depth[static_cast<int>(c)]->Set(static_cast<double>(depth));
}

void Metrics::SetQueuedBytes(int64_t bytes) {
  impl_->queued_bytes->Set(static_cast<double>(bytes));
}

void Metrics::SetInFlight(int64_t jobs) {
  impl_->inflight->Set(static_cast<double>(jobs));
}

void Metrics::SetDevices(absl::string_view kind, int busy, int failed,
                         int total) {
  absl::MutexLock lock(&impl_->mu);
  Impl::KindSeries& s = impl_->Kind(kind);
  s.busy->Set(busy);
  s.failed->Set(failed);
  s.idle->Set(total - busy - failed);
}

const MetricsOptions& Metrics::options() const { return impl_->options; }

void Metrics::ObserveDeviceJob(absl::string_view device, absl::Duration run,
                               int64_t memory_bytes) {
  auto it = impl_->device_series.find(device);
  const Impl::DeviceSeries& s =
      it != impl_->device_series.end() ? it->second : impl_->other_device;
  s.jobs->Increment();
  s.busy_seconds->Increment(std::max(0.0, absl::ToDoubleSeconds(run)));
  s.memory->Set(static_cast<double>(memory_bytes));
}

SchedulerListener* Metrics::scheduler_listener() {
  return impl_->listener.get();
}

std::shared_ptr<prometheus::Registry> Metrics::registry() const {
  return impl_->registry;
}

std::string Metrics::RenderText() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace attnaudit::server
