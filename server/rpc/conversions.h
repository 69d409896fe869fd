// Conversions between the wire, the scheduler and the store
// (conversions.cc): priorities, job states, labels, times and durations,
// results, and the decoding of an Audit or Submit request into a snapshot
// and audit options. Internal to server/rpc.
#ifndef ATTNAUDIT_SERVER_RPC_CONVERSIONS_H_
#define ATTNAUDIT_SERVER_RPC_CONVERSIONS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "attnaudit/v1/service.pb.h"
#include "core/audit/options.h"
#include "core/snapshot/snapshot.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"
#include "server/auth/tenants.h"
#include "server/memfd/memfd_snapshots.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/label_bounds.h"
#include "server/scheduler/job.h"
#include "server/spool/spool.h"
#include "server/store/job_store.h"

namespace attnaudit::server::rpc_internal {

// Wire priority -> scheduling class; PRIORITY_UNSPECIFIED -> `def`.
// InvalidArgument "priority: ..." for values the contract does not know.
absl::StatusOr<PriorityClass> PriorityFromProto(int priority,
                                                PriorityClass def);
v1::Priority PriorityToProto(PriorityClass c);
v1::JobState JobStateToProto(JobState s);
// The terminal state of a job that ended with `status`: DONE for OK,
// CANCELLED for Cancelled and DeadlineExceeded, FAILED otherwise.
JobState TerminalStateOf(const absl::Status& status);

void LabelsToProto(const Labels& labels, v1::Labels* msg);
JobLabels JobLabelsOf(const Labels& labels);
JobLabels JobLabelsOf(const ResultRecord& record);
JobLabels JobLabelsOf(const SpoolMetadata& metadata);

void TimeToProto(absl::Time t, google::protobuf::Timestamp* msg);
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
// tenant's results get seq instead (CursorFor).
v1::JobResult RecordToJobResult(const ResultRecord& record);
// The cursor `caller` sees for a stored result: the feed's seq when it
// reads all, else the result's place among its tenant's.
int64_t CursorFor(const Principal& caller, const ResultRecord& record);
// The JobResult of a finished job (without the report).
v1::JobResult OutcomeToJobResult(const JobOutcome& outcome,
                                 const Labels& labels, absl::Time submitted,
                                 absl::Time started);

// Sum of the bytes of every present tensor (the memory a job holds).
int64_t SnapshotTensorBytes(const Snapshot& snapshot);

// The decoded body of an Audit or Submit request.
struct DecodedAudit {
  Snapshot snapshot;
  AuditOptions options;
  // Label values DecodeAuditRequest cut to their bound.
  LabelTruncations truncated;
};
// Decodes the snapshot, moving its tensor bytes out of `request` (whose
// snapshot is left unusable), bounds its labels (label_bounds.h) and
// decodes the audit options. InvalidArgument naming the field: "snapshot:
// missing", "snapshot.q: ...", "options.tolerances...".
absl::StatusOr<DecodedAudit> DecodeAuditRequest(v1::AuditRequest* request);

// PERMISSION_DENIED when the audit departs from the verdict policy
// (OverridesPolicy) and `caller` lacks the override permission.
absl::Status CheckOverridePermission(const Principal& caller,
                                     const DecodedAudit& audit);
absl::StatusOr<DecodedAudit> DecodeAuditRequest(v1::SubmitRequest* request);
// The audit of a request whose snapshot lies in a memfd (snapshot_memfd),
// read in place through `memfds` (null: the server does not accept them,
// FailedPrecondition); *bytes becomes the snapshot's size. InvalidArgument
// when `snapshot` is set too, or as MemfdSnapshots::Open.
absl::StatusOr<DecodedAudit> DecodeMemfdAuditRequest(
    MemfdSnapshots* memfds, const v1::AuditRequest& request, int64_t* bytes);
// Adds a fresh request's truncated labels to the metrics.
void CountTruncatedLabels(AuditServiceImpl* svc, const LabelTruncations& t);

}  // namespace attnaudit::server::rpc_internal

#endif  // ATTNAUDIT_SERVER_RPC_CONVERSIONS_H_
