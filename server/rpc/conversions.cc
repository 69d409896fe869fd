// Conversions between the wire, the scheduler and the store, shared by the
// RPC layer (conversions.h).
#include "server/rpc/conversions.h"

#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/audit/audit.h"
#include "core/common/status_macros.h"
#include "proto/codec/codec.h"
#include "proto/codec/tensor_paths.h"
#include "server/rpc/status_util.h"

namespace attnaudit::server::rpc_internal {
namespace {

using google::protobuf::util::TimeUtil;

// A decoded snapshot with the request's options; its labels bounded.
absl::StatusOr<DecodedAudit> WithOptions(Snapshot snapshot,
                                         const v1::AuditOptions& options) {
  absl::StatusOr<AuditOptions> audit_options = AuditOptionsFromProto(options);
  if (!audit_options.ok()) {
    return PrefixStatus("options.", audit_options.status());
  }
  DecodedAudit audit{std::move(snapshot), *std::move(audit_options), {}};
  audit.truncated = BoundLabels(&audit.snapshot.labels);
  return audit;
}

absl::StatusOr<DecodedAudit> DecodeAudit(bool has_snapshot,
                                         v1::Snapshot* snapshot,
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

JobState TerminalStateOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return JobState::kDone;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      return JobState::kCancelled;
    default:
      return JobState::kFailed;
  }
}

void LabelsToProto(const Labels& labels, v1::Labels* msg) {
  msg->set_model(labels.model);
  if (labels.layer >= 0) msg->set_layer(labels.layer);
  msg->set_engine(labels.engine);
  msg->set_backend(labels.backend);
  if (labels.step >= 0) msg->set_step(labels.step);
  for (const std::string& id : labels.request_ids) msg->add_request_ids(id);
  msg->set_run(labels.run);
}

JobLabels JobLabelsOf(const Labels& labels) {
  return JobLabels{labels.model,   labels.layer, labels.engine,
                   labels.backend, labels.step,  labels.run};
}

JobLabels JobLabelsOf(const ResultRecord& record) {
  return JobLabels{record.model,   record.layer, record.engine,
                   record.backend, record.step,  record.run};
}

JobLabels JobLabelsOf(const SpoolMetadata& metadata) {
  JobLabels labels;  // the spool keeps no backend, step or run
  labels.model = metadata.model;
  labels.layer = metadata.layer;
  labels.engine = metadata.engine;
  return labels;
}

void TimeToProto(absl::Time t, google::protobuf::Timestamp* msg) {
  *msg = TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
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

int64_t CursorFor(const Principal& caller, const ResultRecord& record) {
  return caller.ReadsAll() ? record.seq : record.tenant_seq;
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

v1::JobResult OutcomeToJobResult(const JobOutcome& outcome,
                                 const Labels& labels, absl::Time submitted,
                                 absl::Time started) {
  v1::JobResult r;
  r.set_job_id(outcome.job_id);
  r.set_state(JobStateToProto(TerminalStateOf(outcome.status)));
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

absl::Status CheckOverridePermission(const Principal& caller,
                                     const DecodedAudit& audit) {
  if (caller.Has(kPermOverride) ||
      !OverridesPolicy(audit.snapshot, audit.options)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      "options: tolerance overrides, the statistical test off and precision "
      "fields past every profile's range need the override permission");
}

absl::StatusOr<DecodedAudit> DecodeAuditRequest(v1::AuditRequest* request) {
  // Asked before mutable_snapshot(), which creates the field.
  const bool has_snapshot = request->has_snapshot();
  return DecodeAudit(has_snapshot, request->mutable_snapshot(),
                     request->options());
}

absl::StatusOr<DecodedAudit> DecodeMemfdAuditRequest(
    MemfdSnapshots* memfds, const v1::AuditRequest& request, int64_t* bytes) {
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
  *bytes = ref.bytes();
  return WithOptions(std::move(snapshot), request.options());
}

absl::StatusOr<DecodedAudit> DecodeAuditRequest(v1::SubmitRequest* request) {
  const bool has_snapshot = request->has_snapshot();
  return DecodeAudit(has_snapshot, request->mutable_snapshot(),
                     request->options());
}

void CountTruncatedLabels(AuditServiceImpl* svc, const LabelTruncations& t) {
  if (t.total() == 0) return;
  Metrics* m = svc->metrics();
  m->CountTruncatedLabel("model", t.model);
  m->CountTruncatedLabel("engine", t.engine);
  m->CountTruncatedLabel("backend", t.backend);
  m->CountTruncatedLabel("request_id", t.request_ids);
  m->CountTruncatedLabel("run", t.run);
}

}  // namespace attnaudit::server::rpc_internal
