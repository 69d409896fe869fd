// Audit, WatchResults, GetCapabilities, the service's lifecycle, and the
// admission of interactive jobs shared with audit_stream.cc.
#include "server/rpc/audit_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/fingerprint/fingerprint.h"
#include "proto/codec/codec.h"
#include "server/common/log.h"
#include "server/rpc/admission.h"
#include "server/rpc/blocking_calls.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/conversions.h"
#include "server/rpc/durable_jobs.h"
#include "server/rpc/interactive_jobs.h"
#include "server/rpc/logged_reactor.h"
#include "server/rpc/rpc_methods.h"
#include "server/rpc/status_util.h"

namespace attnaudit::server {
namespace {

using rpc_internal::AdmitInteractive;
using rpc_internal::Authorize;
using rpc_internal::CallDeadline;
using rpc_internal::CountTruncatedLabels;
using rpc_internal::DecodeAuditRequest;
using rpc_internal::DecodedAudit;
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
    int64_t job_bytes = bytes;
    absl::StatusOr<DecodedAudit> audit = Decode(&job_bytes);
    if (!audit.ok()) return Reject(audit.status());
    request_.Clear();  // its tensor bytes moved into the snapshot
    CountTruncatedLabels(svc_, audit->truncated);
    absl::StatusOr<std::string> id = NewJobId('a');
    if (!id.ok()) return Done(ToGrpcStatus(id.status()));
    job_id_ = *std::move(id);
    log().set_job_id(job_id_);
    // Registered before the job can be queued, so a token file reload from
    // now on reaches this call (one between admission and registration
    // would miss a queued job). The handler has not returned yet, so
    // OnDone cannot have run, and it unregisters.
    svc_->open_calls()->Add(this);
    registered_ = true;
    absl::Duration retry_after;
    absl::Status admitted = AdmitInteractive(
        svc_, *principal, job_id_, *std::move(audit), *priority, job_bytes,
        CallDeadline(*context_), &response_msg_,
        [this](const grpc::Status& status) { Answer(status); }, &retry_after);
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
    if (cancelled_.load() || revoked) {
      svc_->scheduler()->Cancel(job_id_).IgnoreError();
    }
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
    svc_->scheduler()->Cancel(job_id_).IgnoreError();
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
    if (submitted_.load()) svc_->scheduler()->Cancel(job_id_).IgnoreError();
  }

 private:
  // The snapshot and options of request_: inline, or read in place from
  // the memfd it names (then *bytes becomes the snapshot's size, which the
  // scheduler's budgets count like an inline snapshot's).
  absl::StatusOr<DecodedAudit> Decode(int64_t* bytes) {
    if (!request_.has_snapshot_memfd()) return DecodeAuditRequest(&request_);
    return rpc_internal::DecodeMemfdAuditRequest(svc_->memfd_snapshots(),
                                                 request_, bytes);
  }

  // Refuses the request before a job exists (counted as a rejection).
  void Reject(const absl::Status& status) {
    svc_->admission()->CountRefusal(status,
                                    Metrics::InvalidInput::kAuditRequest);
    Done(ToGrpcStatus(status));
  }

  // Admission checked before the request is parsed: under overload most
  // refused calls would otherwise be parsed (a copy of every byte, on a
  // gRPC thread) only to be refused. The priority is read from the raw
  // bytes; AdmitInteractive checks again. False when the call is answered.
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
    absl::Status s = svc_->admission()->Check(query, &retry_after);
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

namespace rpc_internal {
namespace {

// The end of an interactive job: the call's answer (the report, or the
// error; an INVALID verdict is INVALID_ARGUMENT naming the field).
grpc::Status FinishInteractive(AuditServiceImpl* svc, const JobOutcome& outcome,
                               v1::AuditResponse* response) {
  if (!outcome.status.ok()) return ToGrpcStatus(outcome.status);
  if (outcome.report.verdict == Verdict::kInvalid) {
    svc->metrics()->CountInvalidInput(Metrics::InvalidInput::kAuditVerdict);
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("snapshot.", outcome.report.invalid_reason));
  }
  ReportToProto(outcome.report, response->mutable_report());
  response->set_job_id(outcome.job_id);
  return grpc::Status::OK;
}

// The end of an interactive job once FinishInteractive has its answer.
// Its result is kept like a Submit's (GetResult, ListResults, the
// watchers' feed) by the result writer, off this worker. A report is
// answered only once its result is kept (stored, or journalled until the
// store takes it), so its job id can be read back; otherwise the answer
// has no job id and says why. An error answer waits for
// nothing: its job's record is kept on the side. With
// --store-audit-results=false results are only published to the current
// watchers.
void AnswerInteractive(AuditServiceImpl* svc, ResultRecord record,
                       grpc::Status status, v1::AuditResponse* response,
                       const Finisher& finish) {
  record.replica = svc->options().replica_id;
  if (!svc->options().store_audit_results) {
    if (status.ok()) {
      response->clear_job_id();
      response->set_not_stored_reason(
          "the server runs with --store-audit-results=false");
    }
    finish(status);
    svc->PublishUnstored(std::move(record));
    return;
  }
  if (!status.ok()) {
    finish(status);
    svc->audit_results()->Add(std::move(record),
                              [svc](const ResultRecord& r, bool kept) {
                                if (!kept) svc->PublishUnstored(r);
                              });
    return;
  }
  svc->audit_results()->Add(
      std::move(record),
      [svc, response, finish](const ResultRecord& r, bool kept) {
        if (!kept) {
          response->clear_job_id();
          response->set_not_stored_reason(
              "the result store and this replica's result journal could not "
              "take the result (see the server's log)");
          svc->PublishUnstored(r);
        }
        finish(grpc::Status::OK);
      });
}

}  // namespace

absl::Status AdmitInteractive(AuditServiceImpl* svc, const Principal& principal,
                              const std::string& job_id, DecodedAudit audit,
                              PriorityClass priority, int64_t bytes,
                              absl::Time deadline, v1::AuditResponse* response,
                              Finisher finish, absl::Duration* retry_after) {
  *retry_after = absl::ZeroDuration();
  ATTNAUDIT_RETURN_IF_ERROR(
      rpc_internal::CheckOverridePermission(principal, audit));
  ATTNAUDIT_RETURN_IF_ERROR(svc->admission()->RefuseIfDraining());
  auto job = std::make_unique<Job>();
  job->id = job_id;
  job->priority = priority;
  job->deadline = deadline;
  job->labels = JobLabelsOf(audit.snapshot.labels);
  job->bytes = bytes;
  job->tenant = principal.tenant;
  job->quota = principal.quota;
  job->snapshot = std::move(audit.snapshot);
  job->options = std::move(audit.options);
  svc->admission()->Shape(job.get());
  const absl::Time submitted = absl::Now();
  // Written by on_start on the worker, read by on_done on the same worker.
  auto started = std::make_shared<absl::Time>(absl::InfinitePast());
  job->on_start = [started](const Job&, absl::string_view) {
    *started = absl::Now();
  };
  job->on_done = [svc, response, finish = std::move(finish), submitted,
                  started](const JobOutcome& outcome) {
    // The response belongs to the call, which may be gone once answered:
    // nothing reads it after `finish`.
    grpc::Status status = FinishInteractive(svc, outcome, response);
    AnswerInteractive(svc, OutcomeRecord(outcome, submitted, *started),
                      std::move(status), response, finish);
  };
  return svc->admission()->Submit(std::move(job), retry_after);
}

}  // namespace rpc_internal

// ---- The service
// ----------------------------------------------------------------

AuditServiceImpl::AuditServiceImpl(ServiceOptions options, Scheduler* scheduler,
                                   Spool* spool, JobStore* store,
                                   Metrics* metrics, BlockingExecutor* executor,
                                   const Authenticator* auth,
                                   JobIdKey job_id_key)
    : options_(std::move(options)),
      scheduler_(scheduler),
      spool_(spool),
      store_(store),
      metrics_(metrics),
      executor_(executor),
      auth_(auth),
      job_id_key_(std::move(job_id_key)),
      admission_(scheduler, metrics,
                 Admission::Options{options_.threads_per_job, options_.limits,
                                    options_.ring_gang}),
      durable_(
          [this](const ResultRecord& rec) {
            return rpc_internal::CommitResult(this, rec);
          },
          DurableJobs::Options{}),
      feed_(
          store,
          ResultFeed::Options{options_.feed_poll_interval, /*batch=*/256},
          [this](const ResultRecord& rec) { OnStoredResult(rec); },
          [this](bool up) {
            metrics_->SetStoreUp(up);
            if (up) audit_results_.StoreAnswered();
          }),
      uploads_(std::max<int64_t>(1, options_.upload_budget_bytes),
               options_.upload_tenant_share),
      audit_results_(
          AuditResultWriter::Options{},
          [this](const std::vector<ResultRecord>& records) {
            return StoreAuditResults(records);
          },
          options_.result_journal) {
  // Idle uploads are found within a quarter of the timeout (at most 1 s).
  const absl::Duration period =
      std::clamp(options_.upload_idle_timeout / 4, absl::Milliseconds(10),
                 absl::Seconds(1));
  open_calls_.StartSweeper(period, [this](int64_t ended) {
    metrics_->CountCallsEnded(Metrics::CallEnd::kUploadIdle, ended);
  });
}

AuditServiceImpl::~AuditServiceImpl() = default;

absl::Status AuditServiceImpl::StoreAuditResults(
    const std::vector<ResultRecord>& records) {
  absl::StatusOr<std::vector<bool>> put = store_->PutResults(records);
  if (!put.ok()) return put.status();
  feed_.Wake();
  return absl::OkStatus();
}

void AuditServiceImpl::PublishUnstored(const ResultRecord& record) {
  if (!hub_.HasWatchers()) return;
  hub_.Publish(rpc_internal::RecordToJobResult(record), record.tenant);
}

absl::Status AuditServiceImpl::StartFeed() {
  absl::StatusOr<int64_t> last = store_->LastSeq();
  if (!last.ok()) return last.status();
  hub_.SetLastSeq(*last);
  feed_.Start(*last);
  return absl::OkStatus();
}

absl::Status AuditServiceImpl::StartHandoff() {
  if (!store_->shared()) return absl::OkStatus();
  FleetHandoff::Options handoff;
  handoff.replica = options_.replica_id;
  handoff.lease = options_.fleet_lease;
  handoff.claim_bytes = options_.fleet_claim_bytes;
  handoff_ = std::make_unique<FleetHandoff>(
      store_, std::move(handoff),
      [this](StoredJob job) {
        metrics_->CountJobsTakenOver();
        AdoptStoredJob(std::move(job));
      },
      [this] { return draining(); });
  return handoff_->Start();
}

void AuditServiceImpl::OnStoredResult(const ResultRecord& record) {
  hub_.Publish(record.seq, record.tenant_seq, record.tenant,
               [&record] { return rpc_internal::RecordToJobResult(record); });
  if (!store_->shared()) return;
  // Another replica cancelled this replica's job, or finished it after
  // taking it over: stop this copy (its own result would be refused).
  if (absl::Status s = scheduler_->Cancel(record.job_id); s.ok()) {
    ATTNAUDIT_LOG(info, "job ended elsewhere in the fleet; stopped here")
        .Kv("job_id", record.job_id)
        .Kv("state", JobStateName(record.state));
  }
}

namespace {

// A resumed watch's numbering: the feed's (a watcher that reads every
// tenant's results) or one tenant's.
struct CursorSpace {
  bool feed = true;
  std::string tenant;

  int64_t Of(const ResultRecord& r) const {
    return feed ? r.seq : r.tenant_seq;
  }
};

grpc::Status Pruned(int64_t after) {
  return grpc::Status(
      grpc::StatusCode::OUT_OF_RANGE,
      absl::StrCat("resume_after: results after cursor ", after,
                   " were pruned by the retention policy; read what is left "
                   "with ListResults, then watch again"));
}

// The backlog of a watch resumed after `after` up to the feed's `until`,
// read from `store` (blocking), or why the watch must end. Refuses a
// cursor beyond the newest stored result (it would drop live results
// silently) and more than kMaxWatchBacklog results, with messages that
// count nothing beyond the caller's own numbering.
absl::StatusOr<std::vector<std::shared_ptr<const PublishedResult>>> ReadBacklog(
    JobStore* store, const CursorSpace& space, int64_t after, int64_t until,
    grpc::Status* refusal) {
  absl::StatusOr<int64_t> newest =
      space.feed ? store->LastSeq() : store->LastTenantSeq(space.tenant);
  if (!newest.ok()) return newest.status();
  if (after > *newest) {
    *refusal = grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("resume_after: cursor ", after,
                     " is beyond the newest stored result (", *newest,
                     "); resume from a JobResult.cursor this service sent"));
    return std::vector<std::shared_ptr<const PublishedResult>>();
  }
  std::vector<std::shared_ptr<const PublishedResult>> backlog;
  for (int64_t next = after; next < *newest;) {
    absl::StatusOr<std::vector<ResultRecord>> rows =
        space.feed ? store->ResultsAfter(next, 1000)
                   : store->TenantResultsAfter(space.tenant, next, 1000);
    if (!rows.ok()) return rows.status();
    for (const ResultRecord& r : *rows) {
      if (r.seq > until) return backlog;  // live from here on
      if (space.Of(r) != next + 1) {
        *refusal = Pruned(next);
        return backlog;
      }
      if (static_cast<int64_t>(backlog.size()) == kMaxWatchBacklog) {
        *refusal = grpc::Status(
            grpc::StatusCode::OUT_OF_RANGE,
            absl::StrCat("resume_after: more than ", kMaxWatchBacklog,
                         " results were stored after cursor ", after,
                         ", more than a watch replays; read them with "
                         "ListResults, then watch again"));
        return backlog;
      }
      next = space.Of(r);
      backlog.push_back(WatchHub::Prepare(rpc_internal::RecordToJobResult(r),
                                          r.tenant, r.seq, r.tenant_seq));
    }
    if (rows->empty()) break;
  }
  return backlog;
}

}  // namespace

void AuditServiceImpl::LoadBacklog(WatchReactor* watcher,
                                   const Principal& caller, int64_t after,
                                   int64_t until) {
  CursorSpace space;
  space.feed = caller.ReadsAll();
  space.tenant = caller.tenant;
  const bool posted = executor_->Post([this, watcher, space, after, until] {
    grpc::Status refusal;
    absl::StatusOr<std::vector<std::shared_ptr<const PublishedResult>>>
        backlog = ReadBacklog(store_, space, after, until, &refusal);
    if (!backlog.ok()) {
      return watcher->FailBacklog(ToGrpcStatus(
          rpc_internal::StorageError("result store", backlog.status())));
    }
    if (!refusal.ok()) {
      if (refusal.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        metrics_->CountInvalidInput(Metrics::InvalidInput::kOtherRequest);
      }
      return watcher->FailBacklog(refusal);
    }
    watcher->DeliverBacklog(*backlog);
  });
  if (!posted) {
    watcher->FailBacklog(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     "server busy: the watch's backlog could not be read; "
                     "retry after ~100 ms"));
  }
}

void AuditServiceImpl::RecheckOpenCalls() {
  metrics_->CountCallsEnded(Metrics::CallEnd::kCredentials,
                            open_calls_.RecheckAll(*auth_));
}

void AuditServiceImpl::StartDraining() { admission_.StartDraining(); }

void AuditServiceImpl::CloseWatchers() {
  hub_.Close(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "server is shutting down; reconnect to another "
                          "replica"));
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
      admission_.CountRefusal(invalid, Metrics::InvalidInput::kOtherRequest);
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
      admission_.CountRefusal(invalid, Metrics::InvalidInput::kOtherRequest);
      return new RejectedWatch(ToGrpcStatus(invalid));
    }
    resume_after = req.resume_after();
  }
  const Principal caller = *principal;
  return new WatchReactor(
      &hub_, &open_calls_, std::move(filter), options_.watcher_buffer,
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
  DescribeDevices(scheduler_->Devices(), options_, &caps);
  DescribeLimits(options_, caps.mutable_limits());
  caps.set_accepts_memfd_snapshots(options_.memfd_snapshots != nullptr);
  call->Done(SerializeResponse(caps, response));
  return call;
}

}  // namespace attnaudit::server
