// AuditStream: the client-streaming audit (header, then chunks assembled
// straight into the tensor buffers by proto/codec/stream.h), admitted like
// Audit once the last byte arrived.
//
// The call is an OpenCall (open_calls.h): a token file reload that revokes
// its credential, or a client that delivers too few bytes for a whole
// upload_idle_timeout (upload_progress.h: bytes count, messages do not),
// ends it from another thread. Who may Finish is therefore decided under mu_:
//   reading     a read is pending, or OnReadDone runs (in_reaction_);
//               an outside end finishes at once when no reaction runs,
//               else the reaction finishes at its next step;
//   admitting   the job is being submitted: the reaction cancels it after;
//   submitted   the job answers the call: an outside end cancels the job,
//               and Answer sends the outside status instead.
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "proto/codec/chunk_view.h"
#include "proto/codec/codec.h"
#include "proto/codec/stream.h"
#include "server/jobs/upload_progress.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/conversions.h"
#include "server/rpc/logged_reactor.h"
#include "server/rpc/rpc_methods.h"
#include "server/rpc/status_util.h"
#include "server/store/job_ids.h"

namespace attnaudit::server {
namespace {

using rpc_internal::AnswerToProto;
using rpc_internal::Authorize;
using rpc_internal::CallDeadline;
using rpc_internal::ParseRequest;
using rpc_internal::PriorityFromProto;
using rpc_internal::SerializeResponse;

class AuditStreamCall final : public grpc::ServerReadReactor<grpc::ByteBuffer>,
                              public OpenCall {
 public:
  AuditStreamCall(AuditServiceImpl* svc, grpc::CallbackServerContext* context,
                  grpc::ByteBuffer* response)
      : svc_(svc),
        context_(context),
        response_(response),
        log_("AuditStream", context),
        assembler_(svc->options().max_stream_bytes),
        progress_(svc->options().upload_idle_timeout,
                  svc->options().upload_min_rate, absl::Now()) {}

  void Begin() {
    svc_->CountRequest();
    absl::StatusOr<Principal> principal =
        Authorize(svc_, *context_, PermissionOf("AuditStream"), "AuditStream");
    if (!principal.ok()) return FinishOnce(ToGrpcStatus(principal.status()));
    principal_ = *std::move(principal);
    credentials_ = rpc_internal::CredentialsOf(*context_);
    if (svc_->draining()) {
      svc_->metrics()->CountRejection(RejectReason::kDraining);
      return FinishOnce(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is draining"));
    }
    svc_->open_calls()->Add(this);
    registered_ = true;
    absl::MutexLock lock(&mu_);
    StartRead(&raw_);
  }

  // OpenCall: runs under the registry's lock (this call is alive).
  bool Recheck(const Authenticator& auth) override {
    absl::StatusOr<Principal> now =
        Reauthorize(auth, credentials_, principal_, PermissionOf("AuditStream"),
                    "AuditStream");
    return !now.ok() && EndFromOutside(ToGrpcStatus(now.status()));
  }
  bool EndIfIdle(absl::Time now) override {
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kReading || in_reaction_ ||
          !progress_.Stalled(now)) {
        return false;
      }
    }
    return EndFromOutside(grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("AuditStream: less than ", svc_->options().upload_min_rate,
                     " bytes a second over ",
                     absl::FormatDuration(svc_->options().upload_idle_timeout),
                     " (the server's --upload-min-rate and "
                     "--upload-idle-timeout); the upload was abandoned and "
                     "its reservation freed")));
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (ended_.has_value()) return FinishOnce(*ended_);
      in_reaction_ = true;
    }
    if (!ok) return EndOfStream();
    if (assembler_.begun() && AppendPlainChunk()) return;
    // Paths of a message that does not decode start at the message
    // ("header.manifest[1].field_path: ..."), as the header's do.
    if (absl::Status s = ParseRequest(&raw_, &message_); !s.ok()) {
      return Fail(s);
    }
    if (message_.has_header()) return OnHeader();
    if (message_.has_chunk()) return OnChunk();
    Fail(absl::InvalidArgumentError(
        "kind: a message must hold a header or a chunk"));
  }

  void OnCancel() override {
    // At the deadline the scheduler's timer ends the job DEADLINE_EXCEEDED
    // (an upload still in progress ends at its next read, which fails).
    if (rpc_internal::CancelledByDeadline(*context_)) return;
    cancelled_.store(true);
    if (submitted_.load()) svc_->jobs()->StopInteractive(job_id_);
  }

  void OnDone() override {
    if (registered_) svc_->open_calls()->Remove(this);
    if (reserved_ > 0) svc_->uploads()->Release(principal_.tenant, reserved_);
    log_.Emit();
    delete this;
  }

 private:
  void OnHeader() {
    const int64_t header_bytes = static_cast<int64_t>(message_.ByteSizeLong());
    svc_->metrics()->AddBytesReceived(header_bytes);
    v1::AuditStreamHeader* header = message_.mutable_header();
    if (assembler_.begun()) {
      return Fail(absl::InvalidArgumentError(
          "header: a second header; an AuditStream call has exactly one"));
    }
    absl::StatusOr<PriorityClass> priority =
        PriorityFromProto(header->priority(), PriorityClass::kInteractive);
    if (!priority.ok()) return Fail(PrefixStatus("header.", priority.status()));
    priority_ = *priority;
    absl::StatusOr<AuditOptions> options =
        AuditOptionsFromProto(header->options());
    if (!options.ok()) {
      return Fail(PrefixStatus("header.options.", options.status()));
    }
    options_ = *std::move(options);
    // The manifest is checked against the stream limit before anything is
    // reserved or any chunk is read.
    if (absl::Status s = assembler_.Begin(header); !s.ok()) return Fail(s);
    const int64_t total = assembler_.bytes_expected() + header_bytes;
    log_.set_bytes(total);
    Progressed(header_bytes, total);
    // Admission before a single chunk is read: the queue and budget
    // (advisory; RunInteractive re-checks) and the budget of uploads in
    // progress. The tenant's other uploads count against its quota too.
    const UploadLedger::Use held =
        svc_->uploads()->TenantUse(principal_.tenant);
    AdmissionQuery query;
    query.priority = priority_;
    query.bytes = total;
    query.tenant = principal_.tenant;
    query.quota = principal_.quota;
    query.deadline = CallDeadline(*context_);
    query.held_jobs = held.calls;
    query.held_bytes = held.bytes;
    absl::Duration retry_after;
    if (absl::Status s = svc_->jobs()->CheckAdmission(query, &retry_after);
        !s.ok()) {
      if (s.code() == absl::StatusCode::kResourceExhausted) {
        AddRetryAfter(context_, retry_after);
      }
      return FinishOnce(ToGrpcStatus(s));
    }
    RejectReason refused = RejectReason::kMemoryBudget;
    if (absl::Status s = svc_->uploads()->Reserve(principal_.tenant, total,
                                                  principal_.quota, &refused);
        !s.ok()) {
      svc_->metrics()->CountRejection(refused);
      if (refused == RejectReason::kTooLarge) {
        return FinishOnce(ToGrpcStatus(s));  // retrying cannot help
      }
      AddRetryAfter(context_, absl::Milliseconds(250));
      return FinishOnce(ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat(s.message(), "; retry after ~250 ms"))));
    }
    reserved_ = total;
    message_.Clear();
    ContinueReading();
  }

  // The reaction's last step when the upload goes on.
  void ContinueReading() {
    absl::MutexLock lock(&mu_);
    in_reaction_ = false;
    if (ended_.has_value()) return FinishOnce(*ended_);
    StartRead(&raw_);
  }

  // Ends the call from another thread (see the file comment); false when
  // it is ending anyway.
  bool EndFromOutside(const grpc::Status& status) {
    Phase phase;
    {
      absl::MutexLock lock(&mu_);
      if (ended_.has_value() || finished_.load()) return false;
      ended_ = status;
      phase = phase_;
      // A pending read completes (not ok) after Finish; OnReadDone then
      // returns at once.
      if (phase == Phase::kReading && !in_reaction_) FinishOnce(status);
    }
    if (phase == Phase::kSubmitted) svc_->jobs()->StopInteractive(job_id_);
    return true;
  }

  // The common chunk message, appended straight from gRPC's receive slices
  // (chunk_view.h): one copy of the bytes instead of two. False when the
  // message has another shape; protobuf parses it then.
  bool AppendPlainChunk() {
    slices_.clear();
    if (!raw_.Valid() || !raw_.Dump(&slices_).ok()) return false;
    pieces_.clear();
    for (const grpc::Slice& slice : slices_) {
      pieces_.emplace_back(reinterpret_cast<const char*>(slice.begin()),
                           slice.size());
    }
    if (!FindChunkData(pieces_, &data_)) return false;
    int64_t bytes = 0;
    for (absl::string_view range : data_) {
      bytes += static_cast<int64_t>(range.size());
      if (absl::Status s = assembler_.Append(range); !s.ok()) {
        Fail(s);
        return true;
      }
    }
    svc_->metrics()->AddBytesReceived(bytes);
    Progressed(bytes);
    slices_.clear();
    raw_.Clear();
    ContinueReading();
    return true;
  }

  // Bytes that advance the upload (its header, chunks' data; with the
  // header, the upload's whole size).
  void Progressed(int64_t bytes, int64_t total = -1) {
    absl::MutexLock lock(&mu_);
    progress_.Add(bytes);
    if (total >= 0) progress_.Expect(total);
  }

  void OnChunk() {
    const std::string& data = message_.chunk().data();
    svc_->metrics()->AddBytesReceived(static_cast<int64_t>(data.size()));
    Progressed(static_cast<int64_t>(data.size()));
    if (absl::Status s = assembler_.Append(data); !s.ok()) return Fail(s);
    message_.Clear();
    ContinueReading();
  }

  void EndOfStream() {
    if (cancelled_.load() || context_->IsCancelled()) {
      return FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED,
                                     "call cancelled during the upload"));
    }
    if (absl::Status s = assembler_.Finish(); !s.ok()) {
      return Fail(s);  // "stream ended after X of Y bytes"
    }
    absl::StatusOr<Snapshot> snapshot =
        SnapshotFromProto(assembler_.mutable_snapshot());
    if (!snapshot.ok()) {
      return Fail(PrefixStatus("header.snapshot.", snapshot.status()));
    }
    InteractiveJob job;
    job.caller = principal_;
    job.priority = priority_;
    job.deadline = CallDeadline(*context_);
    job.work.snapshot = *std::move(snapshot);
    job.work.options = std::move(options_);
    job.work.bytes = reserved_;
    absl::StatusOr<std::string> id = NewJobId('a');
    if (!id.ok()) return FinishOnce(ToGrpcStatus(id.status()));
    job_id_ = *std::move(id);
    job.job_id = job_id_;
    log_.set_job_id(job_id_);
    {
      absl::MutexLock lock(&mu_);
      if (ended_.has_value()) return FinishOnce(*ended_);
      phase_ = Phase::kAdmitting;
    }
    absl::Duration retry_after;
    absl::Status admitted = svc_->jobs()->RunInteractive(
        std::move(job),
        [this](InteractiveAnswer answer) {
          Answer(AnswerToProto(std::move(answer), &response_msg_));
        },
        &retry_after);
    // Queued (or refused): the scheduler's budget accounts for the bytes
    // from here on.
    svc_->uploads()->Release(principal_.tenant, reserved_);
    reserved_ = 0;
    if (!admitted.ok()) {
      if (admitted.code() == absl::StatusCode::kResourceExhausted) {
        AddRetryAfter(context_, retry_after);
      }
      return FinishOnce(ToGrpcStatus(admitted));
    }
    // No read is pending and Finish comes only from the job, so OnDone
    // cannot run before this line.
    bool ended = false;
    {
      absl::MutexLock lock(&mu_);
      phase_ = Phase::kSubmitted;
      ended = ended_.has_value();
    }
    submitted_.store(true);
    if (cancelled_.load() || ended) svc_->jobs()->StopInteractive(job_id_);
  }

  // The job's answer: the report, serialised into the call's response, or
  // why the call was ended from outside.
  void Answer(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_.has_value()) status = *ended_;
    }
    if (!status.ok()) return FinishOnce(status);
    grpc::Status serialized = SerializeResponse(response_msg_, response_);
    FinishOnce(serialized.ok() ? status : serialized);
  }

  void Fail(const absl::Status& status) {
    svc_->jobs()->CountRefusal(status, Metrics::InvalidInput::kAuditRequest);
    FinishOnce(ToGrpcStatus(status));
  }

  void FinishOnce(const grpc::Status& status) {
    if (finished_.exchange(true)) return;
    log_.set_status(status);
    Finish(status);
  }

  AuditServiceImpl* const svc_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;
  v1::AuditResponse response_msg_;
  CallLog log_;
  Principal principal_;
  grpc::ByteBuffer raw_;
  std::vector<grpc::Slice> slices_;        // raw_'s, for the fast path
  std::vector<absl::string_view> pieces_;  // their bytes
  std::vector<absl::string_view> data_;    // a chunk's data within them
  v1::AuditStreamMessage message_;
  AuditStreamAssembler assembler_;
  PriorityClass priority_ = PriorityClass::kInteractive;
  AuditOptions options_;
  int64_t reserved_ = 0;
  std::string job_id_;
  std::atomic<bool> submitted_{false};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
  Credentials credentials_;  // set in Begin, then read-only
  bool registered_ = false;  // in svc_->open_calls()

  enum class Phase { kReading, kAdmitting, kSubmitted };
  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kReading;
  bool in_reaction_ ABSL_GUARDED_BY(mu_) = false;
  UploadProgress progress_ ABSL_GUARDED_BY(mu_);
  // Set when the call was ended from outside (EndFromOutside).
  absl::optional<grpc::Status> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* AuditServiceImpl::AuditStream(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  auto* call = new AuditStreamCall(this, context, response);
  call->Begin();
  return call;
}

}  // namespace attnaudit::server
