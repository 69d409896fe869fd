// Internal helpers of the RPC layer shared by audit_service.cc (Audit,
// WatchResults, GetCapabilities), audit_stream.cc (AuditStream),
// durable_jobs.cc (Submit, GetResult, Cancel, job completion),
// spool_resume.cc and conversions.cc. Not a public interface.
#ifndef ATTNAUDIT_SERVER_RPC_RPC_INTERNAL_H_
#define ATTNAUDIT_SERVER_RPC_RPC_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "attnaudit/v1/service.pb.h"
#include "core/snapshot/snapshot.h"
#include "google/protobuf/timestamp.pb.h"
#include "server/rpc/audit_service.h"
#include "server/scheduler/job.h"
#include "server/store/result_store.h"

namespace attnaudit::rpc {

// Wire priority -> scheduling class; PRIORITY_UNSPECIFIED -> `def`.
// InvalidArgument "priority: ..." for values the contract does not know.
absl::StatusOr<server::PriorityClass> PriorityFromProto(
    int priority, server::PriorityClass def);
v1::Priority PriorityToProto(server::PriorityClass c);
v1::JobState JobStateToProto(server::JobState s);

void LabelsToProto(const Labels& labels, v1::Labels* msg);
server::JobLabels JobLabelsOf(const Labels& labels);

void TimeToProto(absl::Time t, google::protobuf::Timestamp* msg);
// The call's deadline as absl::Time (InfiniteFuture when it has none).
absl::Time CallDeadline(const grpc::CallbackServerContext& context);

// A stored record as the wire's JobResult (parses the stored report).
v1::JobResult RecordToJobResult(const server::ResultRecord& record);

// Completion of an interactive (Audit/AuditStream) job: the response is
// filled when the status is OK; called exactly once.
using Finisher = std::function<void(const grpc::Status&)>;

// Schedules an interactive audit. On an admission error returns it (with
// *retry_after set when retrying can help) and `finish` is never called;
// otherwise `finish` runs once, from the job's completion.
absl::Status AdmitInteractive(AuditServiceImpl* svc, const std::string& job_id,
                              Snapshot snapshot, AuditOptions options,
                              server::PriorityClass priority, int64_t bytes,
                              absl::Time deadline, v1::AuditResponse* response,
                              Finisher finish, absl::Duration* retry_after);

// Publishes a finished job to the watchers.
void PublishResult(AuditServiceImpl* svc, v1::JobResult result);

// The JobResult of a finished job (without the report).
v1::JobResult OutcomeToJobResult(const server::JobOutcome& outcome,
                                 const Labels& labels, absl::Time submitted,
                                 absl::Time started);

// Sum of the bytes of every present tensor (the memory a job holds).
int64_t SnapshotTensorBytes(const Snapshot& snapshot);

// Applies the server-side settings to a request's audit options.
void ApplyServerOptions(const AuditServiceImpl& svc, AuditOptions* options);

// ---- Durable (Submit and resumed) jobs: durable_jobs.cc.

// A terminal store record: DONE for OK, CANCELLED for Cancelled and
// DeadlineExceeded, FAILED otherwise; finished now.
server::ResultRecord TerminalRecord(const std::string& job_id,
                                    server::PriorityClass priority,
                                    const server::JobLabels& labels,
                                    absl::Time created,
                                    const absl::Status& status);
server::ResultRecord QueuedRecord(const std::string& job_id,
                                  server::PriorityClass priority,
                                  const server::JobLabels& labels,
                                  absl::Time created);
// Stores a terminal result for a job that will not run (corrupt entry,
// expired, cancelled before it was re-queued), then drops its spool entry
// and publishes it. Blocking (SQLite, fsync).
void FailSpooledJob(AuditServiceImpl* svc, const server::ResultRecord& rec);
// A job whose completion commits the result to the store before removing
// the spool entry (and which marks RUNNING in the store when it starts).
std::unique_ptr<server::Job> MakeDurableJob(
    AuditServiceImpl* svc, const std::string& job_id,
    server::PriorityClass priority, absl::Time deadline, absl::Time created,
    Snapshot snapshot, AuditOptions options);

}  // namespace attnaudit::rpc

#endif  // ATTNAUDIT_SERVER_RPC_RPC_INTERNAL_H_
