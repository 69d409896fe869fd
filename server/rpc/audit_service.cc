// Audit, WatchResults, GetCapabilities and the service's lifecycle: the
// reactors parse and authorize, the JobService runs the jobs.
#include "server/rpc/audit_service.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/fingerprint/fingerprint.h"
#include "proto/codec/codec.h"
#include "server/jobs/label_bounds.h"
#include "server/log/log.h"
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
using rpc_internal::DecodeAuditRequest;
using rpc_internal::ParseRequest;
using rpc_internal::PeekRequestField;
using rpc_internal::PriorityFromProto;
using rpc_internal::SerializeResponse;

// ---- Audit -----------------------------------------------------------------

// An OpenCall once its job is admitted: a token file reload that revokes
// its credential cancels the job and answers the reload's status.
class AuditCall final : public LoggedUnaryReactor, public OpenCall {
 public:
  AuditCall(AuditServiceImpl* svc, grpc::CallbackServerContext* context,
            grpc::ByteBuffer* response)
      : LoggedUnaryReactor("Audit", context),
        svc_(svc),
        context_(context),
        response_(response) {}

  void Start(const grpc::ByteBuffer* raw) {
    svc_->CountRequest();
    absl::StatusOr<Principal> principal =
        Authorize(svc_, *context_, PermissionOf("Audit"), "Audit");
    if (!principal.ok()) return Done(ToGrpcStatus(principal.status()));
    principal_ = *principal;
    credentials_ = rpc_internal::CredentialsOf(*context_);
    const int64_t bytes = static_cast<int64_t>(raw->Length());
    svc_->metrics()->AddBytesReceived(bytes);
    log().set_bytes(bytes);
    if (!Precheck(*principal, *raw, bytes)) return;
    if (absl::Status s = ParseRequest(raw, &request_); !s.ok()) {
      return Reject(s);
    }
    absl::StatusOr<PriorityClass> priority =
        PriorityFromProto(request_.priority(), PriorityClass::kInteractive);
    if (!priority.ok()) return Reject(priority.status());
    InteractiveJob job;
    job.caller = *principal;
    job.priority = *priority;
    job.deadline = CallDeadline(*context_);
    absl::StatusOr<AuditWork> work = Decode(bytes);
    if (!work.ok()) return Reject(work.status());
    job.work = *std::move(work);
    request_.Clear();  // its tensor bytes moved into the snapshot
    absl::StatusOr<std::string> id = NewJobId('a');
    if (!id.ok()) return Done(ToGrpcStatus(id.status()));
    job_id_ = *std::move(id);
    job.job_id = job_id_;
    log().set_job_id(job_id_);
    // Registered before the job can be queued, so a token file reload from
    // now on reaches this call (one between admission and registration
    // would miss a queued job). The handler has not returned yet, so
    // OnDone cannot have run, and it unregisters.
    svc_->open_calls()->Add(this);
    registered_ = true;
    absl::Duration retry_after;
    absl::Status admitted = svc_->jobs()->RunInteractive(
        std::move(job),
        [this](InteractiveAnswer answer) {
          // The response belongs to the call, which may be gone once
          // answered: nothing reads it after Answer.
          Answer(AnswerToProto(std::move(answer), &response_msg_));
        },
        &retry_after);
    if (!admitted.ok()) {
      if (admitted.code() == absl::StatusCode::kResourceExhausted) {
        AddRetryAfter(context_, retry_after);
      }
      Done(ToGrpcStatus(admitted));
      return;
    }
    submitted_.store(true);
    bool revoked = false;
    {
      absl::MutexLock lock(&mu_);
      revoked = ended_.has_value();  // a reload came before the job existed
    }
    if (cancelled_.load() || revoked) svc_->jobs()->StopInteractive(job_id_);
  }

  // OpenCall: runs under the registry's lock (this call is alive).
  bool Recheck(const Authenticator& auth) override {
    absl::StatusOr<Principal> now = Reauthorize(auth, credentials_, principal_,
                                                PermissionOf("Audit"), "Audit");
    if (now.ok()) return false;
    {
      absl::MutexLock lock(&mu_);
      if (ended_.has_value()) return false;
      ended_ = ToGrpcStatus(now.status());
    }
    // The job answers (Answer) with ended_.
    svc_->jobs()->StopInteractive(job_id_);
    return true;
  }

  void OnDone() override {
    if (registered_) svc_->open_calls()->Remove(this);
    LoggedUnaryReactor::OnDone();  // deletes this
  }

  void OnCancel() override {
    // At the deadline the scheduler's timer ends the job DEADLINE_EXCEEDED.
    if (rpc_internal::CancelledByDeadline(*context_)) return;
    cancelled_.store(true);
    if (submitted_.load()) svc_->jobs()->StopInteractive(job_id_);
  }

 private:
  // The work of request_: inline (its bytes: the request's, `bytes`), or
  // read in place from the memfd it names (its bytes: the snapshot's
  // size, which the scheduler's budgets count like an inline snapshot's).
  absl::StatusOr<AuditWork> Decode(int64_t bytes) {
    if (request_.has_snapshot_memfd()) {
      return rpc_internal::DecodeMemfdAuditRequest(svc_->memfd_snapshots(),
                                                   request_);
    }
    absl::StatusOr<AuditWork> work = DecodeAuditRequest(&request_);
    if (work.ok()) work->bytes = bytes;
    return work;
  }

  // Refuses the request before a job exists (counted as a rejection).
  void Reject(const absl::Status& status) {
    svc_->jobs()->CountRefusal(status, Metrics::InvalidInput::kAuditRequest);
    Done(ToGrpcStatus(status));
  }

  // Admission checked before the request is parsed: under overload most
  // refused calls would otherwise be parsed (a copy of every byte, on a
  // gRPC thread) only to be refused. The priority is read from the raw
  // bytes; RunInteractive checks again. False when the call is answered.
  bool Precheck(const Principal& principal, const grpc::ByteBuffer& raw,
                int64_t bytes) {
    absl::StatusOr<PriorityClass> priority = PriorityFromProto(
        static_cast<int>(PeekRequestField(raw, 3).value_or(0)),
        PriorityClass::kInteractive);
    if (!priority.ok()) return true;  // decoding will name the field
    AdmissionQuery query;
    query.priority = *priority;
    query.bytes = bytes;
    query.tenant = principal.tenant;
    query.quota = principal.quota;
    query.deadline = CallDeadline(*context_);
    absl::Duration retry_after;
    absl::Status s = svc_->jobs()->CheckAdmission(query, &retry_after);
    if (s.ok()) return true;
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      AddRetryAfter(context_, retry_after);
    }
    Done(ToGrpcStatus(s));
    return false;
  }

  // The job's answer: the report, serialised into the call's response, or
  // why a reload ended the call.
  void Answer(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_.has_value()) status = *ended_;
    }
    if (!status.ok()) return Done(status);
    grpc::Status serialized = SerializeResponse(response_msg_, response_);
    Done(serialized.ok() ? status : serialized);
  }

  AuditServiceImpl* const svc_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;
  v1::AuditRequest request_;
  v1::AuditResponse response_msg_;
  std::string job_id_;
  std::atomic<bool> submitted_{false};
  std::atomic<bool> cancelled_{false};
  Principal principal_;      // set in Start, then read-only
  Credentials credentials_;  // likewise
  bool registered_ = false;  // in svc_->open_calls()
  absl::Mutex mu_;
  absl::optional<grpc::Status> ended_ ABSL_GUARDED_BY(mu_);
};

// A WatchResults call refused before it starts.
class RejectedWatch final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
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
    dev->set_state(d.failed ? v1::DEVICE_STATE_UNAVAILABLE
                   : d.busy ? v1::DEVICE_STATE_BUSY
                            : v1::DEVICE_STATE_IDLE);
    dev->set_failure(d.failure);
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

// ---- The service -----------------------------------------------------------

JobFormats WireJobFormats() {
  JobFormats formats;
  formats.decode_payload = &rpc_internal::DecodeSubmitPayload;
  formats.encode_report = [](const AuditReport& report) {
    v1::AuditReport wire;
    ReportToProto(report, &wire);
    return wire.SerializeAsString();
  };
  return formats;
}

PairFormats WirePairFormats() {
  PairFormats formats;
  formats.encode_snapshot = [](const Snapshot& snapshot) {
    v1::Snapshot wire;
    SnapshotToProto(snapshot, &wire);
    return wire.SerializeAsString();
  };
  formats.decode_snapshot =
      [](const std::string& bytes) -> absl::StatusOr<Snapshot> {
    v1::Snapshot wire;
    if (!wire.ParseFromString(bytes)) {
      return absl::DataLossError("a stored pair side's snapshot is corrupt");
    }
    return SnapshotFromProto(&wire);
  };
  formats.encode_report = WireJobFormats().encode_report;
  formats.decode_report =
      [](const std::string& bytes) -> absl::StatusOr<AuditReport> {
    v1::AuditReport wire;
    if (!wire.ParseFromString(bytes)) {
      return absl::DataLossError("a stored pair side's report is corrupt");
    }
    return ReportFromProto(wire);
  };
  formats.encode_pair = [](const PairReport& report) {
    v1::PairReport wire;
    PairReportToProto(report, &wire);
    return wire.SerializeAsString();
  };
  return formats;
}

AuditServiceImpl::AuditServiceImpl(ServiceOptions options, JobService* jobs,
                                   Metrics* metrics, BlockingExecutor* executor,
                                   const Authenticator* auth)
    : options_(std::move(options)),
      jobs_(jobs),
      metrics_(metrics),
      executor_(executor),
      auth_(auth) {}

AuditServiceImpl::~AuditServiceImpl() = default;

void AuditServiceImpl::LoadBacklog(WatchReactor* watcher,
                                   const Principal& caller, int64_t after,
                                   int64_t until) {
  const bool posted = executor_->Post([this, watcher, caller, after, until] {
    absl::StatusOr<std::vector<ResultRecord>> backlog =
        jobs_->WatchBacklog(caller, after, until);
    if (!backlog.ok()) {
      return watcher->FailBacklog(ToGrpcStatus(backlog.status()));
    }
    std::vector<std::shared_ptr<const PublishedResult>> published;
    published.reserve(backlog->size());
    for (const ResultRecord& r : *backlog) {
      published.push_back(WatchHub::Prepare(rpc_internal::RecordToJobResult(r),
                                            r.tenant, r.seq, r.tenant_seq));
    }
    watcher->DeliverBacklog(published);
  });
  if (!posted) {
    watcher->FailBacklog(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     "server busy: the watch's backlog could not be read; "
                     "retry after ~100 ms"));
  }
}

void AuditServiceImpl::CloseWatchers() {
  hub_.Close(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "server is shutting down; reconnect to another "
                          "replica"));
}

grpc::ServerUnaryReactor* AuditServiceImpl::Audit(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* call = new AuditCall(this, context, response);
  call->Start(request);
  return call;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* AuditServiceImpl::WatchResults(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  CountRequest();
  absl::StatusOr<Principal> principal =
      Authorize(this, *context, PermissionOf("WatchResults"), "WatchResults");
  if (!principal.ok()) {
    return new RejectedWatch(ToGrpcStatus(principal.status()));
  }
  v1::WatchResultsRequest req;
  if (absl::Status s = ParseRequest(request, &req); !s.ok()) {
    return new RejectedWatch(ToGrpcStatus(s));
  }
  for (int v : req.filter().verdicts()) {
    if (!v1::Verdict_IsValid(v) || v == v1::VERDICT_UNSPECIFIED) {
      const absl::Status invalid = absl::InvalidArgumentError(
          absl::StrCat("filter.verdicts: unknown value ", v));
      jobs_->CountRefusal(invalid, Metrics::InvalidInput::kOtherRequest);
      return new RejectedWatch(ToGrpcStatus(invalid));
    }
  }
  // Results carry bounded labels; a filter value is bounded the same way,
  // so a long name still matches its own jobs.
  v1::ResultFilter filter = req.filter();
  BoundLabelValue(filter.mutable_model());
  BoundLabelValue(filter.mutable_engine());
  BoundLabelValue(filter.mutable_backend());
  ATTNAUDIT_LOG(debug, "rpc")
      .Kv("method", "WatchResults")
      .Kv("peer", context->peer())
      .Kv("tenant", principal->tenant);
  absl::optional<int64_t> resume_after;
  if (req.has_resume_after()) {
    if (req.resume_after() < 0) {
      const absl::Status invalid =
          absl::InvalidArgumentError("resume_after: must not be negative");
      jobs_->CountRefusal(invalid, Metrics::InvalidInput::kOtherRequest);
      return new RejectedWatch(ToGrpcStatus(invalid));
    }
    resume_after = req.resume_after();
  }
  const Principal caller = *principal;
  return new WatchReactor(
      &hub_, jobs_->open_calls(), std::move(filter), options_.watcher_buffer,
      *std::move(principal), rpc_internal::CredentialsOf(*context),
      resume_after,
      [this, caller](WatchReactor* w, int64_t after, int64_t until) {
        LoadBacklog(w, caller, after, until);
      });
}

grpc::ServerUnaryReactor* AuditServiceImpl::GetCapabilities(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* call = new LoggedUnaryReactor("GetCapabilities", context);
  CountRequest();
  absl::StatusOr<Principal> principal = Authorize(
      this, *context, PermissionOf("GetCapabilities"), "GetCapabilities");
  if (!principal.ok()) {
    call->Done(ToGrpcStatus(principal.status()));
    return call;
  }
  v1::GetCapabilitiesRequest req;
  if (absl::Status s = ParseRequest(request, &req); !s.ok()) {
    call->Done(ToGrpcStatus(s));
    return call;
  }
  v1::Capabilities caps;
  caps.set_version(options_.version);
  caps.set_api_version("attnaudit.v1");
  caps.set_fingerprint_version(kFingerprintVersion);
  DescribeDevices(jobs_->Devices(), options_, &caps);
  DescribeLimits(options_, caps.mutable_limits());
  caps.set_accepts_memfd_snapshots(options_.memfd_snapshots != nullptr);
  call->Done(SerializeResponse(caps, response));
  return call;
}

}  // namespace attnaudit::server
