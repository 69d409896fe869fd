// The SchedulerListener that feeds Metrics, and LabelBounder.
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "server/metrics/metrics_impl.h"

namespace attnaudit::server {
namespace metrics_internal {

void MetricsListener::OnQueueChanged(PriorityClass c, int64_t depth,
                                     int64_t queued_bytes) {
  m_->SetQueueDepth(c, depth);
  m_->SetQueuedBytes(queued_bytes);
}

void MetricsListener::OnInFlightChanged(int64_t in_flight) {
  m_->SetInFlight(in_flight);
}

void MetricsListener::OnDevicesChanged(absl::string_view kind, int busy,
                                       int failed, int total) {
  m_->SetDevices(kind, busy, failed, total);
}

void MetricsListener::OnRejected(RejectReason reason) {
  m_->CountRejection(reason);
}

void MetricsListener::OnStarted(const Job& job, absl::string_view device_kind,
                                absl::Duration queue_wait) {
  m_->ObserveQueueWait(job.priority, queue_wait);
}

void MetricsListener::OnFinished(const JobOutcome& outcome) {
  m_->CountJob(outcome.priority, outcome.status);
  if (outcome.ran) {
    m_->ObserveJobDuration(outcome.device_kind, outcome.timings.run);
    const auto& probe = m_->options().device_memory;
    m_->ObserveDeviceJob(outcome.device_name, outcome.timings.run,
                         probe ? probe(outcome.device_name) : 0);
  }
  if (outcome.status.ok()) {
    m_->ObserveStages(outcome.report.provenance.timings, outcome.device_kind);
    m_->ObserveReport(outcome.report, outcome.labels);
  }
}

}  // namespace metrics_internal

struct LabelBounder::Impl {
  explicit Impl(int max) : max_values(max) {}
  const int max_values;
  absl::Mutex mu;
  absl::flat_hash_set<std::string> seen ABSL_GUARDED_BY(mu);
};

LabelBounder::LabelBounder(int max_values)
    : impl_(std::make_shared<Impl>(max_values)) {}

std::string LabelBounder::Bound(const std::string& value) {
  absl::MutexLock lock(&impl_->mu);
  if (impl_->seen.contains(value)) return value;
  if (static_cast<int>(impl_->seen.size()) < impl_->max_values) {
    impl_->seen.insert(value);
    return value;
  }
  return "other";
}

}  // namespace attnaudit::server
