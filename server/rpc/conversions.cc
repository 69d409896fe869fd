// Conversions between the wire, the scheduler and the store, shared by the
// RPC layer (conversions.h).
#include "server/rpc/conversions.h"

#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "proto/codec/codec.h"
#include "proto/codec/tensor_paths.h"
#include "server/jobs/label_bounds.h"
#include "server/rpc/status_util.h"

namespace attnaudit::server::rpc_internal {
namespace {

using google::protobuf::util::TimeUtil;

// A decoded snapshot with the request's options.
absl::StatusOr<AuditWork> WithOptions(Snapshot snapshot,
                                      const v1::AuditOptions& options) {
  absl::StatusOr<AuditOptions> audit_options = AuditOptionsFromProto(options);
  if (!audit_options.ok()) {
    return PrefixStatus("options.", audit_options.status());
  }
  AuditWork work;
  work.bytes = SnapshotTensorBytes(snapshot);
  work.snapshot = std::move(snapshot);
  work.options = *std::move(audit_options);
  return work;
}

absl::StatusOr<AuditWork> DecodeAudit(bool has_snapshot, v1::Snapshot* snapshot,
                                      const v1::AuditOptions& options) {
  if (!has_snapshot) return absl::InvalidArgumentError("snapshot: missing");
  absl::StatusOr<Snapshot> decoded = SnapshotFromProto(snapshot);
  if (!decoded.ok()) return PrefixStatus("snapshot.", decoded.status());
  return WithOptions(*std::move(decoded), options);
}

}  // namespace

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

void TimeToProto(absl::Time t, google::protobuf::Timestamp* msg) {
  *msg = TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

absl::StatusOr<absl::Time> TimeFromProto(const google::protobuf::Timestamp& t,
                                         absl::string_view field) {
  // The range google.protobuf.Timestamp allows: 0001-01-01 .. 9999-12-31.
  if (t.seconds() < -62135596800 || t.seconds() > 253402300799 ||
      t.nanos() < 0 || t.nanos() > 999999999) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": not a valid timestamp"));
  }
  return absl::FromUnixNanos(TimeUtil::TimestampToNanoseconds(t));
}

absl::optional<std::string> TextFilter(std::string value) {
  if (value.empty()) return absl::nullopt;
  BoundLabelValue(&value);
  return value;
}

absl::StatusOr<absl::Duration> DurationFromProto(
    const google::protobuf::Duration& msg, absl::string_view field) {
  // TimeUtil converts only well-formed Durations (its checks are debug
  // assertions), so a hostile value is refused here first.
  const bool in_range = msg.seconds() >= TimeUtil::kDurationMinSeconds &&
                        msg.seconds() <= TimeUtil::kDurationMaxSeconds &&
                        msg.nanos() > -1000000000 && msg.nanos() < 1000000000;
  const bool one_sign = (msg.seconds() <= 0 && msg.nanos() <= 0) ||
                        (msg.seconds() >= 0 && msg.nanos() >= 0);
  if (!in_range || !one_sign) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": not a valid google.protobuf.Duration (seconds ",
                     msg.seconds(), ", nanos ", msg.nanos(), ")"));
  }
  // Microseconds: the whole Duration range fits in an int64 (nanoseconds
  // would overflow past ~292 years).
  return absl::Microseconds(TimeUtil::DurationToMicroseconds(msg));
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

bool CancelledByDeadline(const grpc::CallbackServerContext& context) {
  const absl::Time deadline = CallDeadline(context);
  return deadline != absl::InfiniteFuture() &&
         absl::Now() + kDeadlineSlack >= deadline;
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
    l->set_backend(record.backend);
    if (record.step >= 0) l->set_step(record.step);
    l->set_run(record.run);
  }
  r.set_cursor(record.tenant_seq);  // CursorFor: the feed's for read_all
  r.set_replica(record.replica);
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

absl::StatusOr<AuditWork> DecodeAuditRequest(v1::AuditRequest* request) {
  // Asked before mutable_snapshot(), which creates the field.
  const bool has_snapshot = request->has_snapshot();
  return DecodeAudit(has_snapshot, request->mutable_snapshot(),
                     request->options());
}

absl::StatusOr<AuditWork> DecodeAuditRequest(v1::SubmitRequest* request) {
  const bool has_snapshot = request->has_snapshot();
  return DecodeAudit(has_snapshot, request->mutable_snapshot(),
                     request->options());
}

absl::StatusOr<AuditWork> DecodeMemfdAuditRequest(
    MemfdSnapshots* memfds, const v1::AuditRequest& request) {
  if (request.has_snapshot()) {
    return absl::InvalidArgumentError(
        "snapshot_memfd: set together with snapshot; send one of them");
  }
  if (memfds == nullptr) {
    return absl::FailedPreconditionError(
        "snapshot_memfd: this server does not read snapshots from memfds "
        "(start it with --accept-memfd-snapshots)");
  }
  const v1::MemfdSnapshot& ref = request.snapshot_memfd();
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Snapshot snapshot,
      memfds->Open({ref.path(), ref.bytes(), ref.boot_id(), ref.inode()}));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      AuditWork work, WithOptions(std::move(snapshot), request.options()));
  // The scheduler's budgets count it like an inline snapshot's bytes.
  work.bytes = ref.bytes();
  return work;
}

absl::StatusOr<AuditWork> DecodeSubmitPayload(const std::string& payload) {
  v1::SubmitRequest request;
  if (!request.ParseFromString(payload)) {
    return absl::DataLossError("spool entry does not hold a SubmitRequest");
  }
  return DecodeAuditRequest(&request);
}

grpc::Status AnswerToProto(InteractiveAnswer answer,
                           v1::AuditResponse* response) {
  if (!answer.status.ok()) return ToGrpcStatus(answer.status);
  ReportToProto(answer.report, response->mutable_report());
  response->set_job_id(answer.job_id);
  response->set_not_stored_reason(answer.not_stored_reason);
  return grpc::Status::OK;
}

}  // namespace attnaudit::server::rpc_internal
