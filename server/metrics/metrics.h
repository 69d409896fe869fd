// Metrics: the service's Prometheus metrics (a prometheus-cpp registry).
// RenderText() is what /metrics serves (server/metrics_http).
//
// Families (base units, counters end in _total; every label set known in
// advance is created at start-up so dashboards show zeros):
//   attnaudit_build_info{version}                      gauge = 1
//   attnaudit_audits_total{verdict,overridden}         counter (PASS, DRIFT,
//       INVALID, INCONCLUSIVE; overridden "true" when the request departed
//       from the verdict policy: AuditReport::overrides)
//   attnaudit_layer_audits_total{model,layer,verdict}  counter: PASS, DRIFT
//       and INCONCLUSIVE audits per layer (bounded labels as the drift
//       histograms; a series appears when first observed)
//   attnaudit_comparison_verdicts_total{comparison,verdict}   counter
//   attnaudit_diagnoses_total{hypothesis}              counter: the top
//       diagnosis of each drifting audit (core/diagnosis HypothesisNames())
//   attnaudit_drift_out_max_abs{comparison,model,layer}       histogram
//   attnaudit_drift_out_max_ulp{comparison,model,layer}       histogram
//   attnaudit_drift_lse_max_abs{comparison,model,layer}       histogram
//   attnaudit_drift_logprob_abs_diff{comparison,model,layer}  histogram
//       (the max |lp_candidate - lp_baseline| of the comparison)
//   attnaudit_queue_depth{class}                       gauge
//   attnaudit_queue_capacity{class}                    gauge
//   attnaudit_queued_bytes                             gauge
//   attnaudit_queue_wait_seconds{class}                histogram
//   attnaudit_job_stage_duration_seconds{stage,device_kind}  histogram
//       stage: validate, reference, replay, compare
//   attnaudit_job_duration_seconds{device_kind}        histogram (device run)
//   attnaudit_jobs_completed_total{class,outcome}      counter; outcome: ok,
//       failed, cancelled, deadline_exceeded, unavailable
//   attnaudit_received_bytes_total                     counter
//   attnaudit_rejections_total{reason}                 counter (reasons of
//                                                      RejectReasonLabel)
// Invalid input is counted once, the same way whichever RPC carried it
// (CountInvalidInput below; docs/OPERATIONS.md "Invalid input").
// Drift histogram buckets are 1-2-5 steps over each quantity's range
// (metrics_internal::DriftBuckets).
//   attnaudit_inflight_jobs                            gauge
//   attnaudit_devices{kind,state}                      gauge; state: idle,
//   busy,
//                                                      failed
//   attnaudit_device_jobs_total{device}                counter: jobs run
//   attnaudit_device_busy_seconds_total{device}        counter: run time
//   attnaudit_device_memory_bytes{device}              gauge: device memory
//       the last job held at its end, with a GPU's NCCL communicators'
//       buffers (GPU workers; 0 for CPU workers)
//       device: a name of the pool ("cpu:0", "cuda:1"), "other" for any
//       other (bounded by the pool); a gang job counts on its leader
//   attnaudit_cp_checks_total{check,rank,verdict}      counter: the checks of
//       context-parallel reports; check: rank (one rank's partial), combine,
//       engine_order, deterministic; rank: "0".."max_cp_ranks-1" or "other"
//       for rank checks, "all" for the others; verdict: PASS, DRIFT
//   attnaudit_rope_checks_total{check,verdict}        counter: the RoPE
//       checks of reports (docs/NUMERICS.md "RoPE checks"); check: q, k,
//       table; verdict: PASS, DRIFT
//   attnaudit_labels_truncated_total{label}            counter; label: model,
//       engine, backend, request_id, run, weight_version (values cut at the
//       RPC layer's bound)
//   attnaudit_pair_verdicts_total{layer,verdict}       counter: the row pairs
//       of the train-rollout pairs this replica joined (server/pairs);
//       layer bounded like the drift histograms'; verdict: consistent,
//       within-noise, inputs-differ, stale-prefix-kv, rollout-drift,
//       trainer-drift, both-drift
//   attnaudit_pair_sides_total{outcome}                counter: audited
//       snapshots labelled with a pair role; outcome: joined (a counterpart
//       was waiting), waiting (kept for one), dropped (the joiner's queue
//       or the side's size bound was full), failed (the store or the
//       comparison failed; logged)
//   attnaudit_store_up                                 gauge: 1 while the
//       job store answers the result feed's reads, 0 while it does not
//   attnaudit_fleet_jobs_taken_over_total              counter: jobs of a
//       gone (or drained) replica that this one claimed
//   attnaudit_calls_ended_total{reason}                counter; reason:
//       credentials (a token file reload revoked or changed the call's
//       principal), upload_idle (an AuditStream upload went silent)
// class: interactive, sampled. comparison: engine_vs_reference,
// replay_vs_reference, engine_vs_replay. Drift histograms of a (model,
// layer) pair appear when first observed.
//
// Bounded labels: the first `max_models` distinct model names and the first
// `max_layers` distinct layers observed keep their value; later ones are
// reported as "other" (empty model / layer < 0 as "unknown"). Worst case
// 4 families x 3 comparisons x (max_models+2) x (max_layers+2) series sets.
//
// Thread safety: all methods are thread-safe. Errors: Create refuses bad
// bounds (InvalidArgument) and converts prometheus-cpp's exceptions to
// Internal; nothing else throws or fails.
#ifndef ATTNAUDIT_SERVER_METRICS_METRICS_H_
#define ATTNAUDIT_SERVER_METRICS_METRICS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/report/report.h"
#include "server/scheduler/job.h"
#include "server/scheduler/scheduler.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace attnaudit::server {

struct MetricsOptions {
  // attnaudit_build_info{version}.
  std::string version = "unknown";
  int max_models = 4;
  int max_layers = 16;
  // Rank label values of attnaudit_cp_checks_total: ranks below this keep
  // their index, the rest count as "other".
  int max_cp_ranks = 8;
  // Device kinds whose attnaudit_devices / duration series are created at
  // start-up ("cpu" always is).
  std::vector<std::string> device_kinds = {"cpu"};
  // The pool's device names: the attnaudit_device_* series (created at
  // start-up; any other name is reported as "other").
  std::vector<std::string> device_names;
  // The memory a device holds (Device::memory_in_use_bytes), read when a
  // job finishes on it. May be empty (the gauge stays 0). Called from the
  // scheduler's threads while the pool exists.
  std::function<int64_t(absl::string_view device)> device_memory;
  // attnaudit_queue_capacity{class}, indexed by PriorityClass.
  std::array<int64_t, kNumPriorityClasses> queue_capacity = {0, 0};
};

class Metrics {
 public:
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(
      const MetricsOptions& options);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Feeds the verdict counters and the drift histograms from one report
  // (a report with verdict UNSPECIFIED is ignored). `labels` selects the
  // model/layer series (bounded as above).
  void ObserveReport(const AuditReport& report, const JobLabels& labels);
  // Stage durations from report.provenance.timings; stages with 0 s (not
  // run) are skipped.
  void ObserveStages(const StageTimings& timings,
                     absl::string_view device_kind);
  void ObserveQueueWait(PriorityClass c, absl::Duration wait);
  void ObserveJobDuration(absl::string_view device_kind, absl::Duration run);
  void CountJob(PriorityClass c, const absl::Status& status);
  void CountRejection(RejectReason reason);

  // Where the RPC layer found invalid input, i.e. answered INVALID_ARGUMENT.
  enum class InvalidInput {
    // Audit, AuditStream or Submit refused before any audit ran: a bad
    // request field, a snapshot that does not decode, or (Submit, which
    // validates before spooling) one that fails validation.
    kAuditRequest,
    // An Audit/AuditStream job whose validate stage reported INVALID
    // (ObserveReport has counted the INVALID audit).
    kAuditVerdict,
    // A request that asked for no audit (GetResult, Cancel, WatchResults).
    kOtherRequest,
  };
  // One accounting across RPCs: every INVALID_ARGUMENT answer counts once
  // in attnaudit_rejections_total{reason="invalid_argument"}, and every
  // audit request answered INVALID_ARGUMENT counts once in
  // attnaudit_audits_total{verdict="INVALID"} (kAuditRequest here,
  // kAuditVerdict through ObserveReport), so the same invalid snapshot
  // counts alike sent to Audit, AuditStream or Submit.
  void CountInvalidInput(InvalidInput where);
  void AddBytesReceived(int64_t bytes);
  // `n` values of `label` ("model", "engine", "backend", "request_id",
  // "run", "weight_version") were truncated; other names are ignored.
  void CountTruncatedLabel(absl::string_view label, int64_t n = 1);
  // Calls the server ended while they were open (server/jobs/open_calls.h).
  enum class CallEnd { kCredentials = 0, kUploadIdle = 1 };
  void CountCallsEnded(CallEnd why, int64_t n = 1);
  void SetStoreUp(bool up);
  void CountJobsTakenOver(int64_t n = 1);
  // `n` row pairs of `layer` (-1: unknown) got `verdict`, a
  // PairVerdictName; other names are ignored.
  void CountPairVerdicts(int64_t layer, absl::string_view verdict,
                         int64_t n = 1);
  enum class PairSide { kJoined = 0, kWaiting = 1, kDropped = 2, kFailed = 3 };
  void CountPairSide(PairSide outcome);
  void SetQueueDepth(PriorityClass c, int64_t depth);
  void SetQueuedBytes(int64_t bytes);
  void SetInFlight(int64_t jobs);
  // Of `total` devices of `kind`: `busy` running, `failed` out of the pool,
  // the rest idle.
  void SetDevices(absl::string_view kind, int busy, int failed, int total);
  const MetricsOptions& options() const;
  // One job finished on `device` after `run`; the device holds
  // `memory_bytes` of device memory now.
  void ObserveDeviceJob(absl::string_view device, absl::Duration run,
                        int64_t memory_bytes);

  // A SchedulerListener that drives the metrics above: queue depth/bytes,
  // in-flight, devices, rejections, queue wait, and on finish the job
  // count, run duration, stage durations and (for OK outcomes) the report.
  // Owned by this Metrics; pass it as SchedulerOptions::listener.
  SchedulerListener* scheduler_listener();

  // The registry (e.g. for the RPC layer's own families). Families added
  // to it are rendered and served too.
  std::shared_ptr<prometheus::Registry> registry() const;

  // The registry in the Prometheus text format.
  std::string RenderText() const;

 private:
  struct Impl;
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Model/layer label values after bounding; exposed for tests.
// Thread-safe.
class LabelBounder {
 public:
  explicit LabelBounder(int max_values);
  // The value itself while fewer than max_values distinct values were
  // seen (or it was seen before), else "other".
  std::string Bound(const std::string& value);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_METRICS_METRICS_H_
