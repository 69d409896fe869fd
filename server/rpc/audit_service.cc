// Audit, WatchResults, GetCapabilities, the service's lifecycle, and the
// admission of interactive jobs shared with audit_stream.cc.
#include "server/rpc/audit_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/fingerprint/fingerprint.h"
#include "proto/codec/codec.h"
#include "server/common/log.h"
#include "server/rpc/logged_reactor.h"
#include "server/rpc/rpc_internal.h"
#include "server/rpc/status_util.h"

namespace attnaudit::server {
namespace {

using rpc_internal::AdmitInteractive;
using rpc_internal::CallDeadline;
using rpc_internal::DecodeAuditRequest;
using rpc_internal::DecodedAudit;
using rpc_internal::PriorityFromProto;

// Holds one call's request and response. The service registers these for
// Audit and Submit so that the request object is its own, non-const
// allocation: the handler may then move the tensor bytes out of it
// (const_cast on an object that was not created const is well defined),
// which saves a copy of every snapshot.
template <typename Req, typename Resp>
class OwnedMessageAllocator : public grpc::MessageAllocator<Req, Resp> {
 public:
  grpc::MessageHolder<Req, Resp>* AllocateMessages() override {
    return new Holder();
  }

 private:
  class Holder : public grpc::MessageHolder<Req, Resp> {
   public:
    Holder() {
      this->set_request(&request_);
      this->set_response(&response_);
    }
    void Release() override { delete this; }

   private:
    Req request_;
    Resp response_;
  };
};

// ---- Audit -----------------------------------------------------------------

class AuditCall final : public LoggedUnaryReactor {
 public:
  AuditCall(AuditServiceImpl* svc, grpc::CallbackServerContext* context,
            v1::AuditResponse* response)
      : LoggedUnaryReactor("Audit", context),
        svc_(svc),
        context_(context),
        response_(response) {}

  void Start(v1::AuditRequest* request) {
    if (grpc::Status auth = svc_->auth().Check(*context_); !auth.ok()) {
      Done(auth);
      return;
    }
    const int64_t bytes = static_cast<int64_t>(request->ByteSizeLong());
    svc_->metrics()->AddBytesReceived(bytes);
    log().set_bytes(bytes);
    absl::StatusOr<PriorityClass> priority =
        PriorityFromProto(request->priority(), PriorityClass::kInteractive);
    if (!priority.ok()) return Reject(priority.status());
    absl::StatusOr<DecodedAudit> audit = DecodeAuditRequest(request);
    if (!audit.ok()) return Reject(audit.status());
    job_id_ = NewJobId('a');
    log().set_job_id(job_id_);
    absl::Duration retry_after;
    absl::Status admitted = AdmitInteractive(
        svc_, job_id_, *std::move(audit), *priority, bytes,
        CallDeadline(*context_), response_,
        [this](const grpc::Status& status) { Done(status); }, &retry_after);
    if (!admitted.ok()) {
      if (admitted.code() == absl::StatusCode::kResourceExhausted) {
        AddRetryAfter(context_, retry_after);
      }
      Done(ToGrpcStatus(admitted));
      return;
    }
    // The handler has not returned yet, so OnDone cannot have run: `this`
    // is alive even if the job already finished.
    submitted_.store(true);
    if (cancelled_.load()) svc_->scheduler()->Cancel(job_id_).IgnoreError();
  }

  void OnCancel() override {
    // At the deadline the scheduler's timer ends the job DEADLINE_EXCEEDED.
    if (rpc_internal::CancelledByDeadline(*context_)) return;
    cancelled_.store(true);
    if (submitted_.load()) svc_->scheduler()->Cancel(job_id_).IgnoreError();
  }

 private:
  // Refuses the request before a job exists (counted as a rejection).
  void Reject(const absl::Status& status) {
    rpc_internal::CountRefusal(svc_, status,
                               Metrics::InvalidInput::kAuditRequest);
    Done(ToGrpcStatus(status));
  }

  AuditServiceImpl* const svc_;
  grpc::CallbackServerContext* const context_;
  v1::AuditResponse* const response_;
  std::string job_id_;
  std::atomic<bool> submitted_{false};
  std::atomic<bool> cancelled_{false};
};

// A WatchResults call refused before it starts.
class RejectedWatch final : public grpc::ServerWriteReactor<v1::JobResult> {
 public:
  explicit RejectedWatch(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Capabilities.devices and .backends: each device as the pool described
// it at start-up, with its state now.
void DescribeDevices(const std::vector<DeviceInfo>& devices,
                     const ServiceOptions& o, v1::Capabilities* caps) {
  bool have_cuda = false;
  for (const DeviceInfo& d : devices) {
    v1::Device* dev = caps->add_devices();
    dev->set_id(d.name);
    const bool gpu = d.kind == "cuda";
    have_cuda |= gpu;
    dev->set_kind(gpu ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU);
    dev->set_name(gpu ? "CUDA device" : "CPU worker");
    for (const DeviceDescription& desc : o.device_descriptions) {
      if (desc.name != d.name) continue;
      dev->set_name(desc.model);
      dev->set_memory_bytes(desc.memory_bytes);
      dev->set_compute_capability(desc.compute_capability);
    }
    dev->set_state(d.busy ? v1::DEVICE_STATE_BUSY : v1::DEVICE_STATE_IDLE);
  }
  v1::Backend* cpu = caps->add_backends();
  cpu->set_name("cpu");
  cpu->set_available(true);
  v1::Backend* cuda = caps->add_backends();
  cuda->set_name("cuda");
  cuda->set_available(have_cuda);
  std::string detail = !o.cuda_built ? "not built in"
                       : have_cuda   ? ""
                                     : "no GPU worker in the pool";
  if (!o.devices_note.empty()) {
    detail = detail.empty() ? o.devices_note
                            : absl::StrCat(detail, "; ", o.devices_note);
  }
  cuda->set_detail(detail);
}

// Bytes a chunk message adds around its data (AuditStreamMessage.chunk.data:
// two tags and two length varints, 12 bytes at most) with room to spare.
constexpr int64_t kChunkFramingBytes = 64;

// The chunk size to advertise: the configured one, capped so that a chunk
// message fits under the receive limit (a client that follows the advice
// must never be refused RESOURCE_EXHAUSTED for it).
int64_t RecommendedChunkBytes(const ServiceOptions& o) {
  return std::max<int64_t>(1,
                           std::min(o.recommended_chunk_bytes,
                                    o.max_message_bytes - kChunkFramingBytes));
}

// Capabilities.limits: what validation, the queues and gRPC enforce.
void DescribeLimits(const ServiceOptions& o, v1::Limits* l) {
  l->set_max_receive_message_bytes(o.max_message_bytes);
  l->set_max_stream_bytes(o.max_stream_bytes);
  l->set_recommended_chunk_bytes(RecommendedChunkBytes(o));
  l->set_max_tensor_bytes(o.limits.max_tensor_bytes);
  l->set_max_batch(o.limits.max_batch);
  l->set_max_queries(o.limits.max_queries);
  l->set_max_heads(o.limits.max_heads);
  l->set_max_head_dim(o.limits.max_head_dim);
  l->set_max_page_size(o.limits.max_page_size);
  l->set_max_blocks(o.limits.max_blocks);
  l->set_max_context(o.limits.max_context);
  l->set_max_cp_world_size(o.limits.max_cp_world_size);
  l->set_max_vocab(o.limits.max_vocab);
  l->set_interactive_queue_capacity(
      o.queue_capacity[static_cast<int>(PriorityClass::kInteractive)]);
  l->set_sampled_queue_capacity(
      o.queue_capacity[static_cast<int>(PriorityClass::kSampled)]);
  l->set_queued_bytes_budget(o.queued_bytes_budget);
}

}  // namespace

namespace rpc_internal {
namespace {

// The end of an interactive job: the call's answer (the report, or the
// error; an INVALID verdict is INVALID_ARGUMENT naming the field) and, when
// someone watches, the published result.
grpc::Status FinishInteractive(AuditServiceImpl* svc, const JobOutcome& outcome,
                               const Labels& labels, absl::Time submitted,
                               absl::Time started,
                               v1::AuditResponse* response) {
  grpc::Status status;
  if (!outcome.status.ok()) {
    status = ToGrpcStatus(outcome.status);
  } else if (outcome.report.verdict == Verdict::kInvalid) {
    svc->metrics()->CountInvalidInput(Metrics::InvalidInput::kAuditVerdict);
    status =
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("snapshot.", outcome.report.invalid_reason));
  } else {
    ReportToProto(outcome.report, response->mutable_report());
  }
  if (svc->watch_hub()->HasWatchers()) {
    v1::JobResult result =
        OutcomeToJobResult(outcome, labels, submitted, started);
    if (response->has_report()) {
      *result.mutable_report() = response->report();
    } else if (outcome.status.ok()) {
      ReportToProto(outcome.report, result.mutable_report());
    }
    PublishResult(svc, std::move(result));
  }
  return status;
}

}  // namespace

void CountRefusal(AuditServiceImpl* svc, const absl::Status& status,
                  Metrics::InvalidInput where) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      svc->metrics()->CountInvalidInput(where);
      break;
    case absl::StatusCode::kUnavailable:
      svc->metrics()->CountRejection(RejectReason::kDraining);
      break;
    case absl::StatusCode::kResourceExhausted:
      svc->metrics()->CountRejection(RejectReason::kTooLarge);
      break;
    default:
      break;
  }
}

absl::Status AdmitInteractive(AuditServiceImpl* svc, const std::string& job_id,
                              DecodedAudit audit, PriorityClass priority,
                              int64_t bytes, absl::Time deadline,
                              v1::AuditResponse* response, Finisher finish,
                              absl::Duration* retry_after) {
  *retry_after = absl::ZeroDuration();
  if (svc->draining()) {
    svc->metrics()->CountRejection(RejectReason::kDraining);
    return absl::UnavailableError("server is draining; retry elsewhere");
  }
  auto job = std::make_unique<Job>();
  job->id = job_id;
  job->priority = priority;
  job->deadline = deadline;
  job->labels = JobLabelsOf(audit.snapshot.labels);
  job->bytes = bytes;
  Labels labels = audit.snapshot.labels;
  job->snapshot = std::move(audit.snapshot);
  ApplyServerOptions(*svc, &audit.options);
  job->options = std::move(audit.options);
  ApplyGang(*svc, job.get());
  const absl::Time submitted = absl::Now();
  // Written by on_start on the worker, read by on_done on the same worker.
  auto started = std::make_shared<absl::Time>(absl::InfinitePast());
  job->on_start = [started](const Job&, absl::string_view) {
    *started = absl::Now();
  };
  job->on_done = [svc, response, finish = std::move(finish),
                  labels = std::move(labels), submitted,
                  started](const JobOutcome& outcome) {
    finish(
        FinishInteractive(svc, outcome, labels, submitted, *started, response));
  };
  SubmitRejection why;
  absl::Status s = svc->scheduler()->Submit(std::move(job), &why);
  if (!s.ok()) *retry_after = why.retry_after;
  return s;
}

void PublishResult(AuditServiceImpl* svc, v1::JobResult result) {
  svc->watch_hub()->Publish(
      std::make_shared<const v1::JobResult>(std::move(result)));
}

}  // namespace rpc_internal

// ---- The service
// ----------------------------------------------------------------

struct AuditServiceImpl::Allocators {
  OwnedMessageAllocator<v1::AuditRequest, v1::AuditResponse> audit;
  OwnedMessageAllocator<v1::SubmitRequest, v1::SubmitResponse> submit;
};

AuditServiceImpl::AuditServiceImpl(ServiceOptions options, Scheduler* scheduler,
                                   Spool* spool, ResultStore* store,
                                   Metrics* metrics, BlockingExecutor* executor)
    : options_(std::move(options)),
      scheduler_(scheduler),
      spool_(spool),
      store_(store),
      metrics_(metrics),
      executor_(executor),
      auth_(options_.auth_token),
      allocators_(std::make_unique<Allocators>()) {
  SetMessageAllocatorFor_Audit(&allocators_->audit);
  SetMessageAllocatorFor_Submit(&allocators_->submit);
}

AuditServiceImpl::~AuditServiceImpl() = default;

void AuditServiceImpl::StartDraining() { draining_.store(true); }

void AuditServiceImpl::CloseWatchers() {
  hub_.Close(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "server is shutting down; reconnect to another "
                          "replica"));
}

bool AuditServiceImpl::ReserveUpload(int64_t bytes) {
  int64_t current = uploading_bytes_.load();
  do {
    if (current + bytes > options_.upload_budget_bytes) return false;
  } while (!uploading_bytes_.compare_exchange_weak(current, current + bytes));
  return true;
}

void AuditServiceImpl::ReleaseUpload(int64_t bytes) {
  uploading_bytes_.fetch_sub(bytes);
}

bool AuditServiceImpl::BeginIdempotentSubmit(const std::string& job_id) {
  absl::MutexLock lock(&submit_mu_);
  return submitting_.insert(job_id).second;
}

void AuditServiceImpl::EndIdempotentSubmit(const std::string& job_id) {
  absl::MutexLock lock(&submit_mu_);
  submitting_.erase(job_id);
}

grpc::ServerUnaryReactor* AuditServiceImpl::Audit(
    grpc::CallbackServerContext* context, const v1::AuditRequest* request,
    v1::AuditResponse* response) {
  auto* call = new AuditCall(this, context, response);
  // The request comes from OwnedMessageAllocator (see above).
  call->Start(const_cast<v1::AuditRequest*>(request));
  return call;
}

grpc::ServerWriteReactor<v1::JobResult>* AuditServiceImpl::WatchResults(
    grpc::CallbackServerContext* context,
    const v1::WatchResultsRequest* request) {
  if (grpc::Status auth = auth_.Check(*context); !auth.ok()) {
    return new RejectedWatch(auth);
  }
  for (int v : request->filter().verdicts()) {
    if (!v1::Verdict_IsValid(v) || v == v1::VERDICT_UNSPECIFIED) {
      const absl::Status invalid = absl::InvalidArgumentError(
          absl::StrCat("filter.verdicts: unknown value ", v));
      rpc_internal::CountRefusal(this, invalid,
                                 Metrics::InvalidInput::kOtherRequest);
      return new RejectedWatch(ToGrpcStatus(invalid));
    }
  }
  ATTNAUDIT_LOG(debug, "rpc")
      .Kv("method", "WatchResults")
      .Kv("peer", context->peer());
  return new WatchReactor(&hub_, request->filter(), options_.watcher_buffer);
}

grpc::ServerUnaryReactor* AuditServiceImpl::GetCapabilities(
    grpc::CallbackServerContext* context,
    const v1::GetCapabilitiesRequest* request, v1::Capabilities* response) {
  auto* call = new LoggedUnaryReactor("GetCapabilities", context);
  if (grpc::Status auth = auth_.Check(*context); !auth.ok()) {
    call->Done(auth);
    return call;
  }
  response->set_version(options_.version);
  response->set_api_version("attnaudit.v1");
  response->set_fingerprint_version(kFingerprintVersion);
  DescribeDevices(scheduler_->Devices(), options_, response);
  DescribeLimits(options_, response->mutable_limits());
  call->Done(grpc::Status::OK);
  return call;
}

}  // namespace attnaudit::server
