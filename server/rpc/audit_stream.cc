// AuditStream: the client-streaming audit (header, then chunks assembled
// straight into the tensor buffers by proto/codec/stream.h), admitted like
// Audit once the last byte arrived.
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/codec/chunk_view.h"
#include "proto/codec/codec.h"
#include "proto/codec/stream.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/logged_reactor.h"
#include "server/rpc/rpc_internal.h"
#include "server/rpc/status_util.h"

namespace attnaudit::server {
namespace {

using rpc_internal::AdmitInteractive;
using rpc_internal::Authorize;
using rpc_internal::CallDeadline;
using rpc_internal::CountTruncatedLabels;
using rpc_internal::DecodedAudit;
using rpc_internal::ParseRequest;
using rpc_internal::PriorityFromProto;
using rpc_internal::SerializeResponse;

class AuditStreamCall final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  AuditStreamCall(AuditServiceImpl* svc, grpc::CallbackServerContext* context,
                  grpc::ByteBuffer* response)
      : svc_(svc),
        context_(context),
        response_(response),
        log_("AuditStream", context),
        assembler_(svc->options().max_stream_bytes) {}

  void Begin() {
    svc_->CountRequest();
    absl::StatusOr<Principal> principal =
        Authorize(svc_, *context_, kPermAudit, "AuditStream");
    if (!principal.ok()) return FinishOnce(ToGrpcStatus(principal.status()));
    principal_ = *std::move(principal);
    if (svc_->draining()) {
      svc_->metrics()->CountRejection(RejectReason::kDraining);
      return FinishOnce(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is draining"));
    }
    StartRead(&raw_);
  }

  void OnReadDone(bool ok) override {
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
    if (submitted_.load()) svc_->scheduler()->Cancel(job_id_).IgnoreError();
  }

  void OnDone() override {
    if (reserved_ > 0) svc_->ReleaseUpload(reserved_);
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
    // Admission before a single chunk is read: the queue and budget
    // (advisory; Submit re-checks) and the budget of uploads in progress.
    SubmitRejection why;
    AdmissionQuery query;
    query.priority = priority_;
    query.bytes = total;
    query.tenant = principal_.tenant;
    query.quota = principal_.quota;
    query.deadline = CallDeadline(*context_);
    if (absl::Status s = svc_->scheduler()->CheckAdmission(query, &why);
        !s.ok()) {
      svc_->metrics()->CountRejection(why.reason);
      if (s.code() == absl::StatusCode::kResourceExhausted) {
        AddRetryAfter(context_, why.retry_after);
      }
      return FinishOnce(ToGrpcStatus(s));
    }
    if (!svc_->ReserveUpload(total)) {
      svc_->metrics()->CountRejection(RejectReason::kMemoryBudget);
      AddRetryAfter(context_, absl::Milliseconds(250));
      return FinishOnce(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("upload budget: ", total,
                       " more bytes would exceed the ",
                       svc_->options().upload_budget_bytes,
                       " bytes of uploads in progress; retry after ~250 ms")));
    }
    reserved_ = total;
    message_.Clear();
    StartRead(&raw_);
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
    slices_.clear();
    raw_.Clear();
    StartRead(&raw_);
    return true;
  }

  void OnChunk() {
    const std::string& data = message_.chunk().data();
    svc_->metrics()->AddBytesReceived(static_cast<int64_t>(data.size()));
    if (absl::Status s = assembler_.Append(data); !s.ok()) return Fail(s);
    message_.Clear();
    StartRead(&raw_);
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
    DecodedAudit audit{*std::move(snapshot), std::move(options_), {}};
    audit.truncated = BoundLabels(&audit.snapshot.labels);
    CountTruncatedLabels(svc_, audit.truncated);
    absl::StatusOr<std::string> id = NewJobId('a');
    if (!id.ok()) return FinishOnce(ToGrpcStatus(id.status()));
    job_id_ = *std::move(id);
    log_.set_job_id(job_id_);
    absl::Duration retry_after;
    absl::Status admitted = AdmitInteractive(
        svc_, principal_, job_id_, std::move(audit), priority_, reserved_,
        CallDeadline(*context_), &response_msg_,
        [this](const grpc::Status& status) { Answer(status); }, &retry_after);
    // Queued (or refused): the scheduler's budget accounts for the bytes
    // from here on.
    svc_->ReleaseUpload(reserved_);
    reserved_ = 0;
    if (!admitted.ok()) {
      if (admitted.code() == absl::StatusCode::kResourceExhausted) {
        AddRetryAfter(context_, retry_after);
      }
      return FinishOnce(ToGrpcStatus(admitted));
    }
    // No read is pending and Finish comes only from the job, so OnDone
    // cannot run before this line.
    submitted_.store(true);
    if (cancelled_.load()) svc_->scheduler()->Cancel(job_id_).IgnoreError();
  }

  // The job's answer: the report, serialised into the call's response.
  void Answer(const grpc::Status& status) {
    if (!status.ok()) return FinishOnce(status);
    grpc::Status serialized = SerializeResponse(response_msg_, response_);
    FinishOnce(serialized.ok() ? status : serialized);
  }

  void Fail(const absl::Status& status) {
    rpc_internal::CountRefusal(svc_, status,
                               Metrics::InvalidInput::kAuditRequest);
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
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* AuditServiceImpl::AuditStream(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  auto* call = new AuditStreamCall(this, context, response);
  call->Begin();
  return call;
}

}  // namespace attnaudit::server
