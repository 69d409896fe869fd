// Internal helpers of the RPC layer shared by audit_service.cc (Audit,
// WatchResults, GetCapabilities), audit_stream.cc (AuditStream),
// blocking_calls.cc (Submit, GetResult, Cancel), durable_jobs.cc (durable
// job completion), spool_resume.cc, call_auth.cc (authentication, raw
// messages, client-safe storage errors) and conversions.cc. Not a public
// interface.
#ifndef ATTNAUDIT_SERVER_RPC_RPC_INTERNAL_H_
#define ATTNAUDIT_SERVER_RPC_RPC_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "attnaudit/v1/service.pb.h"
#include "core/audit/audit.h"
#include "core/snapshot/snapshot.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "server/auth/tenants.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/label_bounds.h"
#include "server/rpc/logged_reactor.h"
#include "server/scheduler/job.h"
#include "server/spool/spool.h"
#include "server/store/job_store.h"

namespace attnaudit::server::rpc_internal {

// ---- Calls: call_auth.cc.

// Parses a raw request into *msg and releases the request's bytes (the
// buffer belongs to this call; it is emptied so that a large request is
// not held twice while its audit runs). InvalidArgument naming the field
// and byte where decoding stopped when the bytes are not a valid message.
absl::Status ParseRequest(const grpc::ByteBuffer* request,
                          google::protobuf::Message* msg);
// Top-level varint field `number` of a raw request, read without parsing
// or copying it (proto/codec/wire_check.h PeekVarintField).
absl::optional<uint64_t> PeekRequestField(const grpc::ByteBuffer& request,
                                          int number);

// The request's bytes in one piece, releasing the buffer (Submit spools
// exactly what it received), and their parse.
std::string TakeRequestBytes(const grpc::ByteBuffer* request);
absl::Status ParseRequestBytes(absl::string_view bytes,
                               google::protobuf::Message* msg);
// Serialises a response message into the call's response buffer.
grpc::Status SerializeResponse(const google::protobuf::Message& msg,
                               grpc::ByteBuffer* response);

// Authenticates the call (bearer token, mTLS identity) and checks that the
// principal holds `needed` (0: any valid identity). UNAUTHENTICATED, or
// PERMISSION_DENIED naming the permission ("Submit needs the submit
// permission"), counted as a rejection.
absl::StatusOr<Principal> Authorize(AuditServiceImpl* svc,
                                    const grpc::CallbackServerContext& context,
                                    uint32_t needed, const char* method);

// How the call identified itself: its authorization metadata and the
// identities of its verified client certificate (kept by open calls to
// re-check them when the token file is reloaded).
Credentials CredentialsOf(const grpc::CallbackServerContext& context);

// Whether `principal` may see a job of `owner` (its own, or it reads all).
bool MaySee(const Principal& principal, absl::string_view owner);

// The client-facing form of a storage failure (spool, result store): the
// full status, which names files, goes to the log with `what`; the caller
// gets RESOURCE_EXHAUSTED "the server's disk is full" for a full disk and
// UNAVAILABLE otherwise, never a path.
absl::Status StorageError(absl::string_view what, const absl::Status& status);

// ---- Conversions between the wire, the scheduler and the store:
// conversions.cc.

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
// report).
v1::JobResult RecordToJobResult(const ResultRecord& record);
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
absl::StatusOr<DecodedAudit> DecodeAuditRequest(v1::SubmitRequest* request);
// The audit of a request whose snapshot lies in a memfd (snapshot_memfd),
// read in place through `memfds` (null: the server does not accept them,
// FailedPrecondition); *bytes becomes the snapshot's size. InvalidArgument
// when `snapshot` is set too, or as MemfdSnapshots::Open.
absl::StatusOr<DecodedAudit> DecodeMemfdAuditRequest(
    MemfdSnapshots* memfds, const v1::AuditRequest& request, int64_t* bytes);
// Adds a fresh request's truncated labels to the metrics.
void CountTruncatedLabels(AuditServiceImpl* svc, const LabelTruncations& t);

// Applies the server-side settings to a request's audit options.
void ApplyServerOptions(const AuditServiceImpl& svc, AuditOptions* options);

// ---- Accounting of refused requests: audit_service.cc.

// Counts a request refused with `status` by the RPC layer itself (the
// scheduler counts its own refusals): INVALID_ARGUMENT as invalid input
// found `where` (Metrics::CountInvalidInput: one accounting across RPCs),
// UNAVAILABLE as draining, RESOURCE_EXHAUSTED as too_large. Other codes
// are not refusals of the request and are not counted.
void CountRefusal(AuditServiceImpl* svc, const absl::Status& status,
                  Metrics::InvalidInput where);

// A context-parallel snapshot (cp.world_size W > 1) runs as a gang of
// min(W, GPU workers) GPU workers when the pool has GPUs, else of min(W, CPU
// workers) CPU workers: all W ranks when the pool has them, the ranks in
// turns on the workers it has otherwise (a gang never exceeds the pool, so
// it is always admitted and placed once enough workers are idle). Other
// jobs keep a gang of 1.
void ApplyGang(const AuditServiceImpl& svc, Job* job);

// ---- Interactive jobs: audit_service.cc.

// Completion of an interactive (Audit/AuditStream) job: the response is
// filled when the status is OK; called exactly once.
using Finisher = std::function<void(const grpc::Status&)>;

// Schedules an interactive audit owned by `principal`. On an admission
// error returns it (with *retry_after set when retrying can help) and
// `finish` is never called; otherwise `finish` runs once, from the job's
// completion.
absl::Status AdmitInteractive(AuditServiceImpl* svc, const Principal& principal,
                              const std::string& job_id, DecodedAudit audit,
                              PriorityClass priority, int64_t bytes,
                              absl::Time deadline, v1::AuditResponse* response,
                              Finisher finish, absl::Duration* retry_after);

// ---- Unary calls whose work blocks: blocking_calls.cc.

// The blocking body of a call for an authorized caller: fills the response
// on OK; sets *retry_after for a RESOURCE_EXHAUSTED answer when retrying
// can help.
using BlockingWork = std::function<absl::Status(
    const Principal& caller, CallLog* log, absl::Duration* retry_after)>;
// Cheap checks run in the reaction once the caller is authorized (a job
// id's syntax, draining); an error answers the call at once.
using Precheck =
    std::function<absl::Status(const Principal& caller, CallLog* log)>;

// Starts a unary call whose work blocks (disk, SQLite): authorizes the
// caller for `needed`, then `precheck`, then runs `work` on the
// BlockingExecutor and finishes the call with its status (and the retry
// hint). On OK `response` is serialised into `response_buffer`. A full
// executor queue answers RESOURCE_EXHAUSTED "server busy" with a 100 ms
// hint.
grpc::ServerUnaryReactor* PostBlocking(
    AuditServiceImpl* svc, const char* method,
    grpc::CallbackServerContext* context, uint32_t needed,
    const Precheck& precheck, BlockingWork work,
    std::shared_ptr<google::protobuf::Message> response,
    grpc::ByteBuffer* response_buffer);

// ---- Durable (Submit and resumed) jobs: durable_jobs.cc.

// A terminal store record (state from TerminalStateOf(status)), finished
// now. Status messages are stored and shown to the job's owner: callers
// pass client-safe ones (no paths).
ResultRecord TerminalRecord(const std::string& job_id,
                            const std::string& tenant, PriorityClass priority,
                            const JobLabels& labels, absl::Time created,
                            const absl::Status& status);
// The stored record of a finished job: TerminalRecord plus its start, and
// for an audit that ran its verdict, serialised report and top diagnosis.
ResultRecord OutcomeRecord(const JobOutcome& outcome, absl::Time created,
                           absl::Time started);
// The same for a job the store already knows (its labels and times).
ResultRecord TerminalRecord(const ResultRecord& known,
                            const absl::Status& status);
ResultRecord QueuedRecord(const std::string& job_id, const std::string& tenant,
                          PriorityClass priority, const JobLabels& labels,
                          absl::Time created);
// Stores a terminal result for a job that will not run (corrupt entry,
// expired, cancelled before it was re-queued), then drops its spool entry
// and publishes it. Blocking (SQLite, fsync); retried when the store fails.
void FailSpooledJob(AuditServiceImpl* svc, const ResultRecord& rec);
// The commit behind DurableJobs: stores `rec`, then removes the job's
// spool entry. True when the row is new.
absl::StatusOr<bool> CommitResult(AuditServiceImpl* svc,
                                  const ResultRecord& rec);
// A job whose completion commits the result to the store before removing
// the spool entry (and which marks RUNNING in the store when it starts).
// Registers the job with DurableJobs.
std::unique_ptr<Job> MakeDurableJob(AuditServiceImpl* svc,
                                    const std::string& job_id,
                                    const std::string& tenant,
                                    const TenantQuota& quota,
                                    PriorityClass priority, absl::Time deadline,
                                    absl::Time created, DecodedAudit audit);

}  // namespace attnaudit::server::rpc_internal

#endif  // ATTNAUDIT_SERVER_RPC_RPC_INTERNAL_H_
