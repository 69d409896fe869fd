// Conversions between the wire and the job lifecycle (conversions.cc):
// priorities, job states, times and durations, stored results, the
// decoding of an Audit or Submit request into the work of a job, and an
// interactive job's answer as the call's response. Pure functions,
// thread-safe; internal to server/rpc.
#ifndef ATTNAUDIT_SERVER_RPC_CONVERSIONS_H_
#define ATTNAUDIT_SERVER_RPC_CONVERSIONS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "attnaudit/v1/service.pb.h"
#include "core/snapshot/snapshot.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"
#include "server/jobs/jobs.h"
#include "server/memfd/memfd_snapshots.h"
#include "server/scheduler/job.h"
#include "server/store/job_store.h"

namespace attnaudit::server::rpc_internal {

// Wire priority -> scheduling class; PRIORITY_UNSPECIFIED -> `def`.
// InvalidArgument "priority: ..." for values the contract does not know.
absl::StatusOr<PriorityClass> PriorityFromProto(int priority,
                                                PriorityClass def);
v1::Priority PriorityToProto(PriorityClass c);
v1::JobState JobStateToProto(JobState s);

void TimeToProto(absl::Time t, google::protobuf::Timestamp* msg);
// A request's timestamp; InvalidArgument naming `field` outside the range
// google.protobuf.Timestamp allows (0001-01-01 .. 9999-12-31).
absl::StatusOr<absl::Time> TimeFromProto(const google::protobuf::Timestamp& t,
                                         absl::string_view field);
// A text filter of a List call, bounded as stored labels are (label_bounds.h)
// so that a long name still matches its own jobs; nullopt when empty.
absl::optional<std::string> TextFilter(std::string value);
// A request's google.protobuf.Duration; InvalidArgument naming `field` when
// it is not a well-formed Duration (seconds and nanos in range, one sign).
absl::StatusOr<absl::Duration> DurationFromProto(
    const google::protobuf::Duration& msg, absl::string_view field);
// The call's deadline as absl::Time (InfiniteFuture when it has none).
absl::Time CallDeadline(const grpc::CallbackServerContext& context);
// Whether a cancelled call was cancelled by its deadline. gRPC does not say
// why a call was cancelled, and the client's cancellation at its deadline
// reaches the server slightly before the server's copy of that deadline
// (which counts from when the server read the headers), so a cancellation
// less than kDeadlineSlack before the deadline is taken for the deadline.
// The interactive calls then leave their job to the scheduler's deadline
// timer, which ends it DEADLINE_EXCEEDED within that slack.
inline constexpr absl::Duration kDeadlineSlack = absl::Seconds(1);
bool CancelledByDeadline(const grpc::CallbackServerContext& context);

// A stored (or live) record as the wire's JobResult (parses the stored
// report). Its cursor is the record's tenant_seq: callers that read every
// tenant's results get seq instead (CursorFor, server/jobs/jobs.h).
v1::JobResult RecordToJobResult(const ResultRecord& record);

// Sum of the bytes of every present tensor (the memory a job holds).
int64_t SnapshotTensorBytes(const Snapshot& snapshot);

// Decodes the snapshot, moving its tensor bytes out of `request` (whose
// snapshot is left unusable), and the audit options, into a job's work
// (its bytes: SnapshotTensorBytes). The labels are left as sent: the
// JobService bounds and counts them. InvalidArgument naming the field:
// "snapshot: missing", "snapshot.q: ...", "options.tolerances...".
absl::StatusOr<AuditWork> DecodeAuditRequest(v1::AuditRequest* request);
absl::StatusOr<AuditWork> DecodeAuditRequest(v1::SubmitRequest* request);
// The work of a request whose snapshot lies in a memfd (snapshot_memfd),
// read in place through `memfds` (null: the server does not accept them,
// FailedPrecondition); its bytes are the snapshot's size. InvalidArgument
// when `snapshot` is set too, or as MemfdSnapshots::Open.
absl::StatusOr<AuditWork> DecodeMemfdAuditRequest(
    MemfdSnapshots* memfds, const v1::AuditRequest& request);
// A spooled payload (a serialised SubmitRequest) as its work; DataLoss
// when it does not parse (JobFormats::decode_payload).
absl::StatusOr<AuditWork> DecodeSubmitPayload(const std::string& payload);

// An interactive job's answer as the call's: on OK the report and the job
// id (or why the result was not kept) fill `response`; else the status.
grpc::Status AnswerToProto(InteractiveAnswer answer,
                           v1::AuditResponse* response);

}  // namespace attnaudit::server::rpc_internal

#endif  // ATTNAUDIT_SERVER_RPC_CONVERSIONS_H_
