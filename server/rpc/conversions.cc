// Conversions between the wire, the scheduler and the store, shared by the
// RPC layer (rpc_internal.h).
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/codec/tensor_paths.h"
#include "server/rpc/rpc_internal.h"

namespace attnaudit::rpc {

using server::JobState;
using server::PriorityClass;
using server::ResultRecord;

absl::StatusOr<PriorityClass> PriorityFromProto(int priority,
                                                PriorityClass def) {
  switch (priority) {
    case v1::PRIORITY_UNSPECIFIED:
      return def;
    case v1::PRIORITY_INTERACTIVE:
      return PriorityClass::kInteractive;
    case v1::PRIORITY_SAMPLED:
      return PriorityClass::kSampled;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("priority: unknown value ", priority));
  }
}

v1::Priority PriorityToProto(PriorityClass c) {
  return c == PriorityClass::kInteractive ? v1::PRIORITY_INTERACTIVE
                                          : v1::PRIORITY_SAMPLED;
}

v1::JobState JobStateToProto(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return v1::JOB_STATE_QUEUED;
    case JobState::kRunning:
      return v1::JOB_STATE_RUNNING;
    case JobState::kDone:
      return v1::JOB_STATE_DONE;
    case JobState::kFailed:
      return v1::JOB_STATE_FAILED;
    case JobState::kCancelled:
      return v1::JOB_STATE_CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

void LabelsToProto(const Labels& labels, v1::Labels* msg) {
  msg->set_model(labels.model);
  if (labels.layer >= 0) msg->set_layer(labels.layer);
  msg->set_engine(labels.engine);
  msg->set_backend(labels.backend);
  if (labels.step >= 0) msg->set_step(labels.step);
  for (const std::string& id : labels.request_ids) msg->add_request_ids(id);
}

server::JobLabels JobLabelsOf(const Labels& labels) {
  server::JobLabels out;
  out.model = labels.model;
  out.layer = labels.layer;
  out.engine = labels.engine;
  return out;
}

void TimeToProto(absl::Time t, google::protobuf::Timestamp* msg) {
  const int64_t nanos = absl::ToUnixNanos(t);
  int64_t secs = nanos / 1000000000;
  int64_t rem = nanos % 1000000000;
  if (rem < 0) {
    rem += 1000000000;
    --secs;
  }
  msg->set_seconds(secs);
  msg->set_nanos(static_cast<int32_t>(rem));
}

absl::Time CallDeadline(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  // gRPC reports "no deadline" as a time far in the future.
  if (deadline >= std::chrono::system_clock::time_point::max() -
                      std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

v1::JobResult RecordToJobResult(const ResultRecord& record) {
  v1::JobResult r;
  r.set_job_id(record.job_id);
  r.set_state(JobStateToProto(record.state));
  if (record.state == JobState::kDone && !record.report.empty()) {
    if (!r.mutable_report()->ParseFromString(record.report)) {
      r.clear_report();
      r.set_state(v1::JOB_STATE_FAILED);
      r.mutable_error()->set_code(
          static_cast<int>(absl::StatusCode::kDataLoss));
      r.mutable_error()->set_message("stored report is corrupt");
    }
  }
  if (record.error_code != 0) {
    r.mutable_error()->set_code(record.error_code);
    r.mutable_error()->set_message(record.error_message);
  }
  r.set_priority(PriorityToProto(static_cast<PriorityClass>(record.priority)));
  if (r.has_report() && r.report().has_labels()) {
    *r.mutable_labels() = r.report().labels();
  } else {
    v1::Labels* l = r.mutable_labels();
    l->set_model(record.model);
    if (record.layer >= 0) l->set_layer(record.layer);
    l->set_engine(record.engine);
  }
  TimeToProto(record.created, r.mutable_submit_time());
  if (record.started != absl::UnixEpoch()) {
    TimeToProto(record.started, r.mutable_start_time());
  }
  if (record.finished != absl::UnixEpoch()) {
    TimeToProto(record.finished, r.mutable_finish_time());
  }
  return r;
}

int64_t SnapshotTensorBytes(const Snapshot& snapshot) {
  int64_t total = 0;
  for (absl::string_view path : SnapshotTensorPaths()) {
    const Tensor* t = FindSnapshotTensor(snapshot, path);
    if (t != nullptr && t->present()) {
      total += static_cast<int64_t>(t->bytes().size());
    }
  }
  return total;
}

void ApplyServerOptions(const AuditServiceImpl& svc, AuditOptions* options) {
  options->threads = svc.options().threads_per_job;
  options->limits = svc.options().limits;
}

v1::JobResult OutcomeToJobResult(const server::JobOutcome& outcome,
                                 const Labels& labels, absl::Time submitted,
                                 absl::Time started) {
  v1::JobResult r;
  r.set_job_id(outcome.job_id);
  switch (outcome.status.code()) {
    case absl::StatusCode::kOk:
      r.set_state(v1::JOB_STATE_DONE);
      break;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      r.set_state(v1::JOB_STATE_CANCELLED);
      break;
    default:
      r.set_state(v1::JOB_STATE_FAILED);
      break;
  }
  if (!outcome.status.ok()) {
    r.mutable_error()->set_code(static_cast<int>(outcome.status.code()));
    r.mutable_error()->set_message(std::string(outcome.status.message()));
  }
  r.set_priority(PriorityToProto(outcome.priority));
  LabelsToProto(labels, r.mutable_labels());
  TimeToProto(submitted, r.mutable_submit_time());
  if (outcome.ran && started != absl::InfinitePast()) {
    TimeToProto(started, r.mutable_start_time());
  }
  TimeToProto(absl::Now(), r.mutable_finish_time());
  return r;
}

void PublishResult(AuditServiceImpl* svc, v1::JobResult result) {
  svc->watch_hub()->Publish(
      std::make_shared<const v1::JobResult>(std::move(result)));
}

}  // namespace attnaudit::rpc
