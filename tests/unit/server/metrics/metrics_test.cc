// Metrics: the golden list of families, initial zero series, drift
// histograms and bounded labels, the scheduler listener, and `promtool
// check metrics` on the exposition.
#include "server/metrics/metrics.h"

#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/scheduler/scheduler.h"
#include "tests/unit/server/scheduler/test_devices.h"

namespace attnaudit::server {
namespace {

// The labels metrics read; the store-only ones (backend, step, run) stay
// at their defaults.
JobLabels Labels(std::string model, int64_t layer, std::string engine) {
  JobLabels labels;
  labels.model = std::move(model);
  labels.layer = layer;
  labels.engine = std::move(engine);
  return labels;
}

StageTimings Timings(double validate, double reference, double replay,
                     double compare, double total) {
  StageTimings t;
  t.validate_seconds = validate;
  t.reference_seconds = reference;
  t.replay_seconds = replay;
  t.compare_seconds = compare;
  t.total_seconds = total;
  return t;
}

using ::testing::HasSubstr;
using ::testing::Not;
using LabelMap = std::map<std::string, std::string>;

std::unique_ptr<Metrics> MakeMetrics(MetricsOptions options = {}) {
  auto m = Metrics::Create(options);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

// The series of family `name` whose labels are exactly `labels`, or null.
const prometheus::ClientMetric* Find(
    const std::vector<prometheus::MetricFamily>& families,
    const std::string& name, const LabelMap& labels) {
  for (const auto& f : families) {
    if (f.name != name) continue;
    for (const auto& m : f.metric) {
      LabelMap got;
      for (const auto& l : m.label) got[l.name] = l.value;
      if (got == labels) return &m;
    }
  }
  return nullptr;
}

double Value(const Metrics& metrics, const std::string& name,
             const LabelMap& labels) {
  const auto families = metrics.registry()->Collect();
  const prometheus::ClientMetric* m = Find(families, name, labels);
  if (m == nullptr) {
    ADD_FAILURE() << "no series " << name;
    return std::numeric_limits<double>::quiet_NaN();
  }
  for (const auto& f : families) {
    if (f.name != name) continue;
    switch (f.type) {
      case prometheus::MetricType::Counter:
        return m->counter.value;
      case prometheus::MetricType::Gauge:
        return m->gauge.value;
      case prometheus::MetricType::Histogram:
        return static_cast<double>(m->histogram.sample_count);
      default:
        break;
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// Cumulative count of the bucket with upper bound `le` (+Inf allowed).
uint64_t Bucket(const Metrics& metrics, const std::string& name,
                const LabelMap& labels, double le) {
  const auto families = metrics.registry()->Collect();
  const prometheus::ClientMetric* m = Find(families, name, labels);
  if (m == nullptr) {
    ADD_FAILURE() << "no series " << name;
    return 0;
  }
  for (const auto& b : m->histogram.bucket) {
    if (b.upper_bound == le) return b.cumulative_count;
  }
  ADD_FAILURE() << "no bucket le=" << le;
  return 0;
}

// Per-device series exist for the pool's devices from the start; a name
// outside the pool lands on "other", so the label set stays bounded.
TEST(MetricsTest, PerDeviceSeriesAreBoundedByThePool) {
  MetricsOptions o;
  o.device_names = {"cuda:0", "cuda:1"};
  auto metrics = MakeMetrics(o);
  EXPECT_EQ(
      Value(*metrics, "attnaudit_device_jobs_total", {{"device", "cuda:1"}}),
      0.0);
  metrics->ObserveDeviceJob("cuda:1", absl::Milliseconds(1500), 4096);
  metrics->ObserveDeviceJob("cuda:1", absl::Milliseconds(500), 1024);
  metrics->ObserveDeviceJob("cuda:7", absl::Seconds(2), 8);
  const LabelMap one = {{"device", "cuda:1"}};
  EXPECT_EQ(Value(*metrics, "attnaudit_device_jobs_total", one), 2.0);
  EXPECT_DOUBLE_EQ(Value(*metrics, "attnaudit_device_busy_seconds_total", one),
                   2.0);
  EXPECT_EQ(Value(*metrics, "attnaudit_device_memory_bytes", one), 1024.0);
  EXPECT_EQ(
      Value(*metrics, "attnaudit_device_jobs_total", {{"device", "cuda:0"}}),
      0.0);
  const LabelMap other = {{"device", "other"}};
  EXPECT_EQ(Value(*metrics, "attnaudit_device_jobs_total", other), 1.0);
  EXPECT_EQ(Find(metrics->registry()->Collect(), "attnaudit_device_jobs_total",
                 {{"device", "cuda:7"}}),
            nullptr);
}

TEST(MetricsTest, ExactlyTheDocumentedFamilies) {
  auto metrics = MakeMetrics();
  auto families = [&] {
    std::map<std::string, prometheus::MetricType> got;
    for (const auto& f : metrics->registry()->Collect()) got[f.name] = f.type;
    return got;
  };
  // Drift series carry model/layer labels, unknown until a report arrives.
  EXPECT_EQ(families().count("attnaudit_drift_out_max_abs"), 0u);
  AuditReport pass;
  pass.verdict = Verdict::kPass;
  pass.comparisons.emplace_back();
  metrics->ObserveReport(pass, Labels("m", 0, ""));
  // Pair verdicts carry a layer label too.
  EXPECT_EQ(families().count("attnaudit_pair_verdicts_total"), 0u);
  metrics->CountPairVerdicts(0, "consistent");
  const auto got = families();
  using T = prometheus::MetricType;
  const std::map<std::string, prometheus::MetricType> want = {
      {"attnaudit_build_info", T::Gauge},
      {"attnaudit_audits_total", T::Counter},
      {"attnaudit_comparison_verdicts_total", T::Counter},
      {"attnaudit_diagnoses_total", T::Counter},
      {"attnaudit_layer_audits_total", T::Counter},
      {"attnaudit_drift_out_max_abs", T::Histogram},
      {"attnaudit_drift_out_max_ulp", T::Histogram},
      {"attnaudit_drift_lse_max_abs", T::Histogram},
      {"attnaudit_drift_logprob_abs_diff", T::Histogram},
      {"attnaudit_queue_depth", T::Gauge},
      {"attnaudit_queue_capacity", T::Gauge},
      {"attnaudit_queued_bytes", T::Gauge},
      {"attnaudit_queue_wait_seconds", T::Histogram},
      {"attnaudit_job_stage_duration_seconds", T::Histogram},
      {"attnaudit_job_duration_seconds", T::Histogram},
      {"attnaudit_jobs_completed_total", T::Counter},
      {"attnaudit_received_bytes_total", T::Counter},
      {"attnaudit_rejections_total", T::Counter},
      {"attnaudit_labels_truncated_total", T::Counter},
      {"attnaudit_calls_ended_total", T::Counter},
      {"attnaudit_store_up", T::Gauge},
      {"attnaudit_fleet_jobs_taken_over_total", T::Counter},
      {"attnaudit_inflight_jobs", T::Gauge},
      {"attnaudit_devices", T::Gauge},
      {"attnaudit_device_jobs_total", T::Counter},
      {"attnaudit_device_busy_seconds_total", T::Counter},
      {"attnaudit_device_memory_bytes", T::Gauge},
      {"attnaudit_cp_checks_total", T::Counter},
      {"attnaudit_rope_checks_total", T::Counter},
      {"attnaudit_pair_verdicts_total", T::Counter},
      {"attnaudit_pair_sides_total", T::Counter},
  };
  EXPECT_EQ(got, want);
}

TEST(MetricsTest, PairVerdictsStartTogetherPerBoundedLayer) {
  MetricsOptions o;
  o.max_layers = 1;
  auto metrics = MakeMetrics(o);
  const std::string family = "attnaudit_pair_verdicts_total";
  metrics->CountPairVerdicts(3, "trainer-drift", 2);
  EXPECT_EQ(Value(*metrics, family, {{"layer", "3"}, {"verdict", "trainer-drift"}}),
            2);
  // Every verdict of the layer exists from its first pair, at zero.
  EXPECT_EQ(Value(*metrics, family, {{"layer", "3"}, {"verdict", "consistent"}}),
            0);
  EXPECT_EQ(
      Value(*metrics, family, {{"layer", "3"}, {"verdict", "stale-prefix-kv"}}),
      0);
  // Past max_layers a layer counts as "other"; -1 as "unknown".
  metrics->CountPairVerdicts(4, "consistent");
  EXPECT_EQ(
      Value(*metrics, family, {{"layer", "other"}, {"verdict", "consistent"}}),
      1);
  metrics->CountPairVerdicts(-1, "both-drift");
  EXPECT_EQ(
      Value(*metrics, family, {{"layer", "unknown"}, {"verdict", "both-drift"}}),
      1);
  // A name that is no pair verdict is ignored.
  metrics->CountPairVerdicts(3, "bogus");
  EXPECT_EQ(Find(metrics->registry()->Collect(), family,
                 {{"layer", "3"}, {"verdict", "bogus"}}),
            nullptr);
  metrics->CountPairSide(Metrics::PairSide::kWaiting);
  EXPECT_EQ(Value(*metrics, "attnaudit_pair_sides_total",
                  {{"outcome", "waiting"}}),
            1);
}

TEST(MetricsTest, CallsEndedAreCountedByReason) {
  auto metrics = MakeMetrics(MetricsOptions());
  const std::string family = "attnaudit_calls_ended_total";
  EXPECT_EQ(Value(*metrics, family, {{"reason", "upload_idle"}}), 0);
  metrics->CountCallsEnded(Metrics::CallEnd::kUploadIdle, 2);
  metrics->CountCallsEnded(Metrics::CallEnd::kCredentials);
  EXPECT_EQ(Value(*metrics, family, {{"reason", "upload_idle"}}), 2);
  EXPECT_EQ(Value(*metrics, family, {{"reason", "credentials"}}), 1);
}

TEST(MetricsTest, TheStoreGaugeAndTakeOversFollowTheirCalls) {
  auto metrics = MakeMetrics(MetricsOptions());
  EXPECT_EQ(Value(*metrics, "attnaudit_store_up", {}), 1);  // until told
  metrics->SetStoreUp(false);
  EXPECT_EQ(Value(*metrics, "attnaudit_store_up", {}), 0);
  metrics->SetStoreUp(true);
  EXPECT_EQ(Value(*metrics, "attnaudit_store_up", {}), 1);
  metrics->CountJobsTakenOver(3);
  metrics->CountJobsTakenOver(0);
  EXPECT_EQ(Value(*metrics, "attnaudit_fleet_jobs_taken_over_total", {}), 3);
  metrics->CountTruncatedLabel("run", 2);
  EXPECT_EQ(
      Value(*metrics, "attnaudit_labels_truncated_total", {{"label", "run"}}),
      2);
}

// RoPE checks by check and verdict; a report's diagnosis from a drifting
// RoPE check is a bounded hypothesis label.
TEST(MetricsTest, RopeChecksAreCountedByCheckAndVerdict) {
  auto metrics = MakeMetrics(MetricsOptions());
  const std::string family = "attnaudit_rope_checks_total";
  EXPECT_EQ(Value(*metrics, family, {{"check", "k"}, {"verdict", "DRIFT"}}), 0);
  AuditReport r;
  r.verdict = Verdict::kDrift;
  for (const char* what : {"q", "k", "table"}) {
    RopeCheckResult c;
    c.what = what;
    c.verdict = std::string(what) == "k" ? Verdict::kDrift : Verdict::kPass;
    r.rope_checks.push_back(c);
  }
  Diagnosis d;
  d.hypothesis = "k-rope-twice";
  r.diagnoses.push_back(d);
  metrics->ObserveReport(r, Labels("m", 0, ""));
  EXPECT_EQ(Value(*metrics, family, {{"check", "q"}, {"verdict", "PASS"}}), 1);
  EXPECT_EQ(Value(*metrics, family, {{"check", "k"}, {"verdict", "DRIFT"}}), 1);
  EXPECT_EQ(Value(*metrics, family, {{"check", "table"}, {"verdict", "PASS"}}),
            1);
  EXPECT_EQ(Value(*metrics, "attnaudit_diagnoses_total",
                  {{"hypothesis", "k-rope-twice"}}),
            1);
}

// CP checks by check, rank and verdict; ranks past max_cp_ranks are "other".
TEST(MetricsTest, CpChecksAreCountedByRankWithTheRestAsOther) {
  MetricsOptions options;
  options.max_cp_ranks = 2;
  auto metrics = MakeMetrics(options);
  const std::string family = "attnaudit_cp_checks_total";
  EXPECT_EQ(Value(*metrics, family,
                  {{"check", "rank"}, {"rank", "1"}, {"verdict", "DRIFT"}}),
            0);
  AuditReport r;
  r.verdict = Verdict::kDrift;
  r.cp.present = true;
  r.cp.engine_order.verdict = Verdict::kPass;
  r.cp.deterministic.verdict = Verdict::kPass;
  r.cp.has_combine = true;
  r.cp.combine.verdict = Verdict::kDrift;
  for (int64_t k = 0; k < 4; ++k) {
    CpRankCheck rank;
    rank.rank = k;
    rank.check.verdict = k == 1 || k == 3 ? Verdict::kDrift : Verdict::kPass;
    r.cp.ranks.push_back(rank);
  }
  metrics->ObserveReport(r, Labels("m", 0, ""));
  auto value = [&](const std::string& check, const std::string& rank,
                   const std::string& verdict) {
    return Value(*metrics, family,
                 {{"check", check}, {"rank", rank}, {"verdict", verdict}});
  };
  EXPECT_EQ(value("rank", "0", "PASS"), 1);
  EXPECT_EQ(value("rank", "1", "DRIFT"), 1);
  EXPECT_EQ(value("rank", "other", "PASS"), 1);
  EXPECT_EQ(value("rank", "other", "DRIFT"), 1);
  EXPECT_EQ(value("combine", "all", "DRIFT"), 1);
  EXPECT_EQ(value("engine_order", "all", "PASS"), 1);
  EXPECT_EQ(value("deterministic", "all", "PASS"), 1);
  EXPECT_EQ(Find(metrics->registry()->Collect(), family,
                 {{"check", "rank"}, {"rank", "2"}, {"verdict", "PASS"}}),
            nullptr);
}

TEST(MetricsTest, KnownLabelSetsStartAtZero) {
  MetricsOptions options;
  options.version = "1.2.3";
  options.device_kinds = {"cpu", "cuda"};
  options.queue_capacity = {64, 1024};
  auto metrics = MakeMetrics(options);
  EXPECT_EQ(Value(*metrics, "attnaudit_build_info", {{"version", "1.2.3"}}), 1);
  for (const char* v : {"PASS", "DRIFT", "INVALID", "INCONCLUSIVE"}) {
    for (const char* o : {"false", "true"}) {
      EXPECT_EQ(Value(*metrics, "attnaudit_audits_total",
                      {{"verdict", v}, {"overridden", o}}),
                0);
    }
  }
  for (const char* c : {"engine_vs_reference", "replay_vs_reference",
                        "engine_vs_replay", "engine_vs_emulation"}) {
    for (const char* v : {"PASS", "DRIFT", "INCONCLUSIVE"}) {
      EXPECT_EQ(Value(*metrics, "attnaudit_comparison_verdicts_total",
                      {{"comparison", c}, {"verdict", v}}),
                0);
    }
  }
  for (const char* r : {"queue_full", "memory_budget", "invalid_argument",
                        "deadline", "cancelled", "draining", "too_large"}) {
    EXPECT_EQ(Value(*metrics, "attnaudit_rejections_total", {{"reason", r}}), 0)
        << r;
  }
  for (const char* cls : {"interactive", "sampled"}) {
    EXPECT_EQ(Value(*metrics, "attnaudit_queue_depth", {{"class", cls}}), 0);
    EXPECT_EQ(Value(*metrics, "attnaudit_queue_wait_seconds", {{"class", cls}}),
              0);
    for (const char* o :
         {"ok", "failed", "cancelled", "deadline_exceeded", "unavailable"}) {
      EXPECT_EQ(Value(*metrics, "attnaudit_jobs_completed_total",
                      {{"class", cls}, {"outcome", o}}),
                0);
    }
  }
  EXPECT_EQ(Value(*metrics, "attnaudit_queue_capacity", {{"class", "sampled"}}),
            1024);
  for (const char* kind : {"cpu", "cuda"}) {
    for (const char* stage : {"validate", "reference", "replay", "compare"}) {
      EXPECT_EQ(Value(*metrics, "attnaudit_job_stage_duration_seconds",
                      {{"stage", stage}, {"device_kind", kind}}),
                0);
    }
    EXPECT_EQ(Value(*metrics, "attnaudit_devices",
                    {{"kind", kind}, {"state", "idle"}}),
              0);
  }
  EXPECT_EQ(Value(*metrics, "attnaudit_inflight_jobs", {}), 0);
  EXPECT_EQ(Value(*metrics, "attnaudit_received_bytes_total", {}), 0);
}

AuditReport DriftReport() {
  AuditReport r;
  r.verdict = Verdict::kDrift;
  ComparisonResult er;
  er.comparison = Comparison::kEngineVsReference;
  er.verdict = Verdict::kDrift;
  er.has_out = true;
  er.out.max_abs = 2e-3;  // in (1e-3, 2e-3]
  er.out.max_ulp = 3;     // in (2, 5]
  er.has_lse = true;
  er.lse.max_abs = 4e-6;  // in (2e-6, 5e-6]
  er.has_logprob = true;
  er.logprob.max_abs = 3.2;  // in (2, 5]
  ComparisonResult pr;
  pr.comparison = Comparison::kReplayVsReference;
  pr.verdict = Verdict::kPass;
  pr.has_out = true;
  pr.out.max_abs = 0;
  pr.out.max_ulp = 0;
  r.comparisons = {er, pr};
  return r;
}

TEST(MetricsTest, ReportFeedsVerdictsAndDriftBuckets) {
  auto metrics = MakeMetrics();
  JobLabels labels = Labels("llama", 5, "vllm");
  metrics->ObserveReport(DriftReport(), labels);
  EXPECT_EQ(Value(*metrics, "attnaudit_audits_total",
                  {{"verdict", "DRIFT"}, {"overridden", "false"}}),
            1);
  EXPECT_EQ(
      Value(*metrics, "attnaudit_comparison_verdicts_total",
            {{"comparison", "engine_vs_reference"}, {"verdict", "DRIFT"}}),
      1);
  EXPECT_EQ(Value(*metrics, "attnaudit_comparison_verdicts_total",
                  {{"comparison", "replay_vs_reference"}, {"verdict", "PASS"}}),
            1);
  const LabelMap er = {{"comparison", "engine_vs_reference"},
                       {"model", "llama"},
                       {"layer", "5"}};
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_out_max_abs", er, 1e-3), 0u);
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_out_max_abs", er, 2e-3), 1u);
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_out_max_ulp", er, 2), 0u);
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_out_max_ulp", er, 5), 1u);
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_lse_max_abs", er, 2e-6), 0u);
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_lse_max_abs", er, 5e-6), 1u);
  // 3.2 nats lands in (2, 5]: a p99 read from these buckets is at most 5
  // (the old 1-then-10 buckets put it anywhere up to 10).
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_logprob_abs_diff", er, 2), 0u);
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_logprob_abs_diff", er, 5), 1u);
  const LabelMap pr = {{"comparison", "replay_vs_reference"},
                       {"model", "llama"},
                       {"layer", "5"}};
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_out_max_ulp", pr, 0),
            1u);  // exact
  // No lse in P-R: the series exists but saw nothing.
  EXPECT_EQ(Value(*metrics, "attnaudit_drift_lse_max_abs", pr), 0);
  // Unspecified verdicts are ignored.
  metrics->ObserveReport(AuditReport(), labels);
  EXPECT_EQ(Value(*metrics, "attnaudit_drift_out_max_abs", er), 1);
}

TEST(MetricsTest, VerdictsAreCountedPerModelAndLayer) {
  MetricsOptions options;
  options.max_layers = 2;
  auto metrics = MakeMetrics(options);
  AuditReport pass;
  pass.verdict = Verdict::kPass;
  metrics->ObserveReport(DriftReport(), Labels("llama", 5, ""));
  metrics->ObserveReport(pass, Labels("llama", 5, ""));
  metrics->ObserveReport(pass, Labels("llama", 5, ""));
  metrics->ObserveReport(pass, Labels("llama", 7, ""));
  metrics->ObserveReport(DriftReport(), Labels("llama", 9, ""));
  auto count = [&](const char* layer, const char* verdict) {
    return Value(*metrics, "attnaudit_layer_audits_total",
                 {{"model", "llama"}, {"layer", layer}, {"verdict", verdict}});
  };
  EXPECT_EQ(count("5", "DRIFT"), 1);
  EXPECT_EQ(count("5", "PASS"), 2);
  EXPECT_EQ(count("7", "PASS"), 1);
  EXPECT_EQ(count("other", "DRIFT"), 1);  // layer 9: past max_layers
}

TEST(MetricsTest, NonFiniteDriftLandsInTheInfBucket) {
  auto metrics = MakeMetrics();
  AuditReport r = DriftReport();
  r.comparisons[0].out.max_abs = std::numeric_limits<double>::quiet_NaN();
  r.comparisons[0].lse.max_abs = std::numeric_limits<double>::infinity();
  metrics->ObserveReport(r, Labels("m", 0, ""));
  const LabelMap er = {
      {"comparison", "engine_vs_reference"}, {"model", "m"}, {"layer", "0"}};
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_out_max_abs", er, 5), 0u);
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_out_max_abs", er,
                   std::numeric_limits<double>::infinity()),
            1u);
  EXPECT_EQ(Bucket(*metrics, "attnaudit_drift_lse_max_abs", er, 10), 0u);
  const auto families = metrics->registry()->Collect();
  const auto* m = Find(families, "attnaudit_drift_lse_max_abs", er);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(std::isfinite(m->histogram.sample_sum));
}

// The bounds a drift family's histogram really has (from the registry).
std::vector<double> BoundsOf(const std::string& family) {
  auto metrics = MakeMetrics();
  metrics->ObserveReport(DriftReport(), Labels("m", 1, ""));
  const auto families = metrics->registry()->Collect();
  const prometheus::ClientMetric* m = Find(
      families, family,
      {{"comparison", "engine_vs_reference"}, {"model", "m"}, {"layer", "1"}});
  std::vector<double> bounds;
  if (m == nullptr) {
    ADD_FAILURE() << "no series " << family;
    return bounds;
  }
  for (const auto& b : m->histogram.bucket) {
    if (std::isfinite(b.upper_bound)) bounds.push_back(b.upper_bound);
  }
  return bounds;
}

// 1-2-5 steps: each bound is 1, 2 or 5 times a power of ten, and the
// ratio of neighbours alternates 2, 2.5, 2 (no decade is skipped).
void ExpectOneTwoFive(const std::vector<double>& bounds, double lo, double hi) {
  ASSERT_GE(bounds.size(), 3u);
  EXPECT_DOUBLE_EQ(bounds.front(), lo);
  EXPECT_DOUBLE_EQ(bounds.back(), hi);
  for (size_t i = 0; i < bounds.size(); ++i) {
    const double mantissa =
        bounds[i] / std::pow(10.0, std::floor(std::log10(bounds[i]) + 1e-9));
    EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 ||
                std::abs(mantissa - 2) < 1e-9 || std::abs(mantissa - 5) < 1e-9)
        << bounds[i];
    if (i == 0) continue;
    const double ratio = bounds[i] / bounds[i - 1];
    EXPECT_TRUE(std::abs(ratio - 2) < 1e-9 || std::abs(ratio - 2.5) < 1e-9)
        << bounds[i - 1] << " -> " << bounds[i];
  }
}

TEST(MetricsTest, DriftBucketsAreOneTwoFiveOverEachQuantitysRange) {
  ExpectOneTwoFive(BoundsOf("attnaudit_drift_out_max_abs"), 1e-7, 5);
  ExpectOneTwoFive(BoundsOf("attnaudit_drift_lse_max_abs"), 1e-7, 10);
  ExpectOneTwoFive(BoundsOf("attnaudit_drift_logprob_abs_diff"), 1e-6, 20);
  std::vector<double> ulp = BoundsOf("attnaudit_drift_out_max_ulp");
  ASSERT_FALSE(ulp.empty());
  EXPECT_EQ(ulp.front(), 0);  // bit-exact results
  ulp.erase(ulp.begin());
  ExpectOneTwoFive(ulp, 1, 1e6);
}

// An INCONCLUSIVE audit, and one whose request overrode the policy, are
// counted apart.
TEST(MetricsTest, InconclusiveAndOverriddenAuditsAreCountedApart) {
  auto metrics = MakeMetrics();
  const JobLabels labels = Labels("llama", 5, "vllm");
  AuditReport inconclusive = DriftReport();
  inconclusive.verdict = Verdict::kInconclusive;
  inconclusive.comparisons[0].verdict = Verdict::kInconclusive;
  metrics->ObserveReport(inconclusive, labels);
  AuditReport overridden = DriftReport();
  overridden.verdict = Verdict::kPass;
  overridden.overrides = {"tolerances.out_abs 0.1 (E-R policy 0.004)"};
  metrics->ObserveReport(overridden, labels);
  EXPECT_EQ(Value(*metrics, "attnaudit_audits_total",
                  {{"verdict", "INCONCLUSIVE"}, {"overridden", "false"}}),
            1);
  EXPECT_EQ(Value(*metrics, "attnaudit_audits_total",
                  {{"verdict", "PASS"}, {"overridden", "true"}}),
            1);
  EXPECT_EQ(Value(*metrics, "attnaudit_audits_total",
                  {{"verdict", "PASS"}, {"overridden", "false"}}),
            0);
  EXPECT_EQ(Value(*metrics, "attnaudit_comparison_verdicts_total",
                  {{"comparison", "engine_vs_reference"},
                   {"verdict", "INCONCLUSIVE"}}),
            1);
  EXPECT_EQ(
      Value(*metrics, "attnaudit_layer_audits_total",
            {{"model", "llama"}, {"layer", "5"}, {"verdict", "INCONCLUSIVE"}}),
      1);
}

TEST(MetricsTest, InvalidInputIsCountedOnceWhereverItWasFound) {
  auto metrics = MakeMetrics();
  auto invalid_audits = [&] {
    return Value(*metrics, "attnaudit_audits_total",
                 {{"verdict", "INVALID"}, {"overridden", "false"}});
  };
  auto invalid_rejections = [&] {
    return Value(*metrics, "attnaudit_rejections_total",
                 {{"reason", "invalid_argument"}});
  };
  // Refused before any audit (Audit/AuditStream/Submit): both counters.
  metrics->CountInvalidInput(Metrics::InvalidInput::kAuditRequest);
  EXPECT_EQ(invalid_audits(), 1);
  EXPECT_EQ(invalid_rejections(), 1);
  // The validate stage of an Audit job: the report counts the audit, the
  // refusal counts the rejection; together once each.
  AuditReport invalid;
  invalid.verdict = Verdict::kInvalid;
  metrics->ObserveReport(invalid, JobLabels{});
  metrics->CountInvalidInput(Metrics::InvalidInput::kAuditVerdict);
  EXPECT_EQ(invalid_audits(), 2);
  EXPECT_EQ(invalid_rejections(), 2);
  // A request that asked for no audit: a rejection only.
  metrics->CountInvalidInput(Metrics::InvalidInput::kOtherRequest);
  EXPECT_EQ(invalid_audits(), 2);
  EXPECT_EQ(invalid_rejections(), 3);
}

TEST(MetricsTest, ModelAndLayerLabelsAreBounded) {
  MetricsOptions options;
  options.max_models = 2;
  options.max_layers = 1;
  auto metrics = MakeMetrics(options);
  for (const char* model : {"a", "b", "c", "a", ""}) {
    metrics->ObserveReport(DriftReport(), Labels(model, 1, ""));
  }
  metrics->ObserveReport(DriftReport(), Labels("b", 2, ""));
  metrics->ObserveReport(DriftReport(), Labels("b", -1, ""));
  auto count = [&](const char* model, const char* layer) {
    return Value(*metrics, "attnaudit_drift_out_max_abs",
                 {{"comparison", "engine_vs_reference"},
                  {"model", model},
                  {"layer", layer}});
  };
  EXPECT_EQ(count("a", "1"), 2);
  EXPECT_EQ(count("b", "1"), 1);
  EXPECT_EQ(count("other", "1"), 1);  // "c": past max_models
  EXPECT_EQ(count("unknown", "1"), 1);
  EXPECT_EQ(count("b", "other"), 1);  // layer 2: past max_layers
  EXPECT_EQ(count("b", "unknown"), 1);
  // Labels fall back to the report's own when the job has none.
  AuditReport r = DriftReport();
  r.labels.model = "a";
  r.labels.layer = 1;
  metrics->ObserveReport(r, JobLabels{});
  EXPECT_EQ(count("a", "1"), 3);

  LabelBounder bounder(1);
  EXPECT_EQ(bounder.Bound("x"), "x");
  EXPECT_EQ(bounder.Bound("y"), "other");
  EXPECT_EQ(bounder.Bound("x"), "x");
}

TEST(MetricsTest, SchedulerListenerDrivesQueueJobAndDeviceMetrics) {
  auto metrics = MakeMetrics();
  testing::Gate gate;
  SchedulerOptions so;
  so.devices = testing::GateDevices(1, &gate);
  so.max_queued = {1, 1};
  so.listener = metrics->scheduler_listener();
  auto scheduler = Scheduler::Create(std::move(so));
  ASSERT_TRUE(scheduler.ok());
  testing::Recorder rec;
  ASSERT_TRUE(
      (*scheduler)
          ->Submit(testing::MakeJob("a", PriorityClass::kInteractive, &rec, 10))
          .ok());
  gate.WaitStarted(1);
  EXPECT_EQ(Value(*metrics, "attnaudit_inflight_jobs", {}), 1);
  EXPECT_EQ(Value(*metrics, "attnaudit_devices",
                  {{"kind", "cpu"}, {"state", "busy"}}),
            1);
  ASSERT_TRUE(
      (*scheduler)
          ->Submit(testing::MakeJob("b", PriorityClass::kInteractive, &rec, 20))
          .ok());
  EXPECT_EQ(
      Value(*metrics, "attnaudit_queue_depth", {{"class", "interactive"}}), 1);
  EXPECT_EQ(Value(*metrics, "attnaudit_queued_bytes", {}), 20);
  EXPECT_FALSE(
      (*scheduler)
          ->Submit(testing::MakeJob("c", PriorityClass::kInteractive, &rec))
          .ok());
  EXPECT_EQ(
      Value(*metrics, "attnaudit_rejections_total", {{"reason", "queue_full"}}),
      1);
  ASSERT_TRUE((*scheduler)->Cancel("b").ok());
  gate.Open();
  rec.Wait("a");
  const LabelMap interactive = {{"class", "interactive"}};
  EXPECT_EQ(Value(*metrics, "attnaudit_jobs_completed_total",
                  {{"class", "interactive"}, {"outcome", "ok"}}),
            1);
  EXPECT_EQ(Value(*metrics, "attnaudit_jobs_completed_total",
                  {{"class", "interactive"}, {"outcome", "cancelled"}}),
            1);
  EXPECT_EQ(Value(*metrics, "attnaudit_queue_wait_seconds", interactive), 1);
  EXPECT_EQ(Value(*metrics, "attnaudit_job_duration_seconds",
                  {{"device_kind", "cpu"}}),
            1);
  EXPECT_EQ(Value(*metrics, "attnaudit_audits_total",
                  {{"verdict", "PASS"}, {"overridden", "false"}}),
            1);
  EXPECT_EQ(Value(*metrics, "attnaudit_inflight_jobs", {}), 0);
  EXPECT_EQ(Value(*metrics, "attnaudit_queue_depth", interactive), 0);
  EXPECT_EQ(Value(*metrics, "attnaudit_queued_bytes", {}), 0);
  EXPECT_EQ(Value(*metrics, "attnaudit_devices",
                  {{"kind", "cpu"}, {"state", "idle"}}),
            1);
  EXPECT_EQ(Value(*metrics, "attnaudit_devices",
                  {{"kind", "cpu"}, {"state", "failed"}}),
            0);
  metrics->AddBytesReceived(1234);
  EXPECT_EQ(Value(*metrics, "attnaudit_received_bytes_total", {}), 1234);
}

TEST(MetricsTest, FailedDevicesAreNeitherIdleNorBusy) {
  auto metrics = MakeMetrics();
  metrics->SetDevices("cuda", /*busy=*/2, /*failed=*/1, /*total=*/8);
  EXPECT_EQ(Value(*metrics, "attnaudit_devices",
                  {{"kind", "cuda"}, {"state", "busy"}}),
            2);
  EXPECT_EQ(Value(*metrics, "attnaudit_devices",
                  {{"kind", "cuda"}, {"state", "failed"}}),
            1);
  EXPECT_EQ(Value(*metrics, "attnaudit_devices",
                  {{"kind", "cuda"}, {"state", "idle"}}),
            5);
}

TEST(MetricsTest, StagesThatDidNotRunAreNotObserved) {
  auto metrics = MakeMetrics();
  metrics->ObserveStages(Timings(0.002, 0, 0, 0, 0.002), "cuda");
  metrics->ObserveStages(Timings(0.001, 0.02, 0.03, 0.004, 0.055), "cuda");
  const LabelMap validate = {{"stage", "validate"}, {"device_kind", "cuda"}};
  const LabelMap replay = {{"stage", "replay"}, {"device_kind", "cuda"}};
  EXPECT_EQ(Value(*metrics, "attnaudit_job_stage_duration_seconds", validate),
            2);
  EXPECT_EQ(Value(*metrics, "attnaudit_job_stage_duration_seconds", replay), 1);
  EXPECT_EQ(
      Bucket(*metrics, "attnaudit_job_stage_duration_seconds", replay, 0.025),
      0u);
  EXPECT_EQ(
      Bucket(*metrics, "attnaudit_job_stage_duration_seconds", replay, 0.05),
      1u);
}

// Runs `promtool check metrics` on `text`; returns its exit code and output,
// or -1 when promtool is not installed.
int Promtool(const std::string& text, std::string* output) {
  if (system("command -v promtool >/dev/null 2>&1") != 0) return -1;
  char path[] = "/tmp/metrics_test_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return -2;
  close(fd);
  std::ofstream(path) << text;
  const std::string cmd =
      absl::StrCat("promtool check metrics < ", path, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  char buf[512];
  while (p != nullptr && fgets(buf, sizeof(buf), p) != nullptr) *output += buf;
  const int status = p != nullptr ? pclose(p) : -1;
  unlink(path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -3;
}

TEST(MetricsPromtoolTest, RegistryPassesPromtoolCheckMetrics) {
  MetricsOptions options;
  options.device_kinds = {"cpu", "cuda"};
  auto metrics = MakeMetrics(options);
  metrics->ObserveReport(DriftReport(), Labels("llama", 5, "vllm"));
  metrics->ObserveStages(Timings(0.001, 0.01, 0.01, 0.002, 0.023), "cpu");
  std::string out;
  const int rc = Promtool(metrics->RenderText(), &out);
  if (rc == -1) GTEST_SKIP() << "promtool not found on PATH; lint skipped";
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "") << "promtool findings";
}

TEST(MetricsTest, BadBoundsAreInvalidArguments) {
  MetricsOptions zero;
  zero.max_models = 0;
  EXPECT_EQ(Metrics::Create(zero).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnaudit::server
