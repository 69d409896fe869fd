// Internal: the state behind Metrics (families, pre-created series, caches
// of the lazily created model/layer and device-kind series).
#ifndef ATTNAUDIT_SERVER_METRICS_METRICS_IMPL_H_
#define ATTNAUDIT_SERVER_METRICS_METRICS_IMPL_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/metrics.h"

namespace attnaudit::server {
namespace metrics_internal {

// Drift quantities with a histogram family each.
enum DriftFamily : int {
  kOutMaxAbs = 0,
  kOutMaxUlp = 1,
  kLseMaxAbs = 2,
  kLogprobAbsDiff = 3,
  kNumDriftFamilies = 4,
};

// Bucket upper bounds of a drift family: 1-2-5 steps over the range that
// matters for its quantity (metrics.cc; docs/OPERATIONS.md).
const std::vector<double>& DriftBuckets(DriftFamily family);

constexpr int kNumStages = 4;  // validate, reference, replay, compare
constexpr int kNumOutcomes =
    5;  // ok, failed, cancelled, deadline_exceeded, unavailable
constexpr int kNumVerdicts = 5;  // indexed by Verdict; 0 unused

class MetricsListener : public SchedulerListener {
 public:
  explicit MetricsListener(Metrics* metrics) : m_(metrics) {}
  void OnQueueChanged(PriorityClass c, int64_t depth,
                      int64_t queued_bytes) override;
  void OnInFlightChanged(int64_t in_flight) override;
  void OnDevicesChanged(absl::string_view kind, int busy, int failed,
                        int total) override;
  void OnRejected(RejectReason reason) override;
  void OnStarted(const Job& job, absl::string_view device_kind,
                 absl::Duration queue_wait) override;
  void OnFinished(const JobOutcome& outcome) override;

 private:
  Metrics* m_;
};

}  // namespace metrics_internal

struct Metrics::Impl {
  MetricsOptions options;
  std::shared_ptr<prometheus::Registry> registry;

  // attnaudit_audits_total by [verdict][overridden: 0 "false", 1 "true"].
  std::array<std::array<prometheus::Counter*, 2>,
             metrics_internal::kNumVerdicts>
      audits{};
  // attnaudit_diagnoses_total by hypothesis: every name of the catalogue
  // (core/diagnosis), registered at start-up.
  absl::flat_hash_map<std::string, prometheus::Counter*> diagnoses;
  std::array<std::array<prometheus::Counter*, metrics_internal::kNumVerdicts>,
             kNumComparisons>
      comparison_verdicts{};
  std::array<prometheus::Family<prometheus::Histogram>*,
             metrics_internal::kNumDriftFamilies>
      drift{};
  std::array<prometheus::Gauge*, kNumPriorityClasses> queue_depth{};
  std::array<prometheus::Gauge*, kNumPriorityClasses> queue_capacity{};
  prometheus::Gauge* queued_bytes = nullptr;
  std::array<prometheus::Histogram*, kNumPriorityClasses> queue_wait{};
  prometheus::Family<prometheus::Histogram>* stage_duration = nullptr;
  prometheus::Family<prometheus::Histogram>* job_duration = nullptr;
  std::array<std::array<prometheus::Counter*, metrics_internal::kNumOutcomes>,
             kNumPriorityClasses>
      jobs_completed{};
  prometheus::Counter* received_bytes = nullptr;
  // attnaudit_labels_truncated_total, in kTruncatedLabelNames order.
  std::array<prometheus::Counter*, 6> labels_truncated{};
  std::array<prometheus::Counter*, 4> pair_sides{};
  // attnaudit_calls_ended_total, by Metrics::CallEnd.
  std::array<prometheus::Counter*, 2> calls_ended{};
  prometheus::Gauge* store_up = nullptr;
  prometheus::Counter* jobs_taken_over = nullptr;
  std::array<prometheus::Counter*, kNumRejectReasons> rejections{};
  prometheus::Gauge* inflight = nullptr;
  prometheus::Family<prometheus::Gauge>* devices = nullptr;
  // attnaudit_cp_checks_total: [rank or "other"][PASS, DRIFT] and
  // [engine_order, deterministic, combine][PASS, DRIFT].
  std::vector<std::array<prometheus::Counter*, 2>> cp_rank_checks;
  std::array<std::array<prometheus::Counter*, 2>, 3> cp_checks{};
  // attnaudit_rope_checks_total: [q, k, table][PASS, DRIFT].
  std::array<std::array<prometheus::Counter*, 2>, 3> rope_checks{};
  // attnaudit_device_*{device}: one entry per pool device, then "other".
  struct DeviceSeries {
    prometheus::Counter* jobs = nullptr;
    prometheus::Counter* busy_seconds = nullptr;
    prometheus::Gauge* memory = nullptr;
  };
  absl::flat_hash_map<std::string, DeviceSeries> device_series;
  DeviceSeries other_device;

  std::unique_ptr<LabelBounder> models;
  std::unique_ptr<LabelBounder> layers;
  std::unique_ptr<metrics_internal::MetricsListener> listener;

  // Series created on first use, keyed by their label values.
  struct KindSeries {
    std::array<prometheus::Histogram*, metrics_internal::kNumStages> stages{};
    prometheus::Histogram* job = nullptr;
    prometheus::Gauge* idle = nullptr;
    prometheus::Gauge* busy = nullptr;
    prometheus::Gauge* failed = nullptr;
  };
  absl::Mutex mu;
  absl::flat_hash_map<
      std::string,
      std::array<prometheus::Histogram*, metrics_internal::kNumDriftFamilies>>
      drift_series ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, KindSeries> kinds ABSL_GUARDED_BY(mu);
  // attnaudit_layer_audits_total: keyed by model, layer and verdict (the
  // bounded labels of the drift histograms), created on first use.
  prometheus::Family<prometheus::Counter>* layer_audits = nullptr;
  absl::flat_hash_map<std::string, prometheus::Counter*> layer_audit_series
      ABSL_GUARDED_BY(mu);
  // attnaudit_pair_verdicts_total: keyed by bounded layer and verdict.
  prometheus::Family<prometheus::Counter>* pair_verdicts = nullptr;
  absl::flat_hash_map<std::string, prometheus::Counter*> pair_verdict_series
      ABSL_GUARDED_BY(mu);

  // Metrics::Create's steps: the families and their fixed series (none of
  // these throws for our constant names and labels, but prometheus-cpp
  // reports misuse with exceptions: Create catches them).
  void RegisterVerdicts(prometheus::Registry& r);
  void RegisterDrift(prometheus::Registry& r);
  void RegisterQueues(prometheus::Registry& r);
  void RegisterJobs(prometheus::Registry& r);
  void RegisterCp(prometheus::Registry& r);
  void RegisterRopeChecks(prometheus::Registry& r);
  void RegisterDevices(prometheus::Registry& r);
  // Counts the checks of a report's CP section.
  void ObserveCp(const CpReport& cp);
  void ObserveRopeChecks(const std::vector<RopeCheckResult>& checks);

  // Creates (or finds) the per-kind series. Family::Add may throw only for
  // invalid label names, and ours are constants.
  KindSeries& Kind(absl::string_view kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The layer's series of `verdict`; nullptr for an unknown verdict name.
  prometheus::Counter* PairVerdicts(const std::string& layer,
                                    absl::string_view verdict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  prometheus::Counter& LayerAudits(const std::string& model,
                                   const std::string& layer,
                                   const std::string& verdict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::array<prometheus::Histogram*, metrics_internal::kNumDriftFamilies>&
  Drift(Comparison c, const std::string& model, const std::string& layer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_METRICS_METRICS_IMPL_H_
