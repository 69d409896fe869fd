// Submit, GetResult and Cancel: the unary calls whose work blocks (spool
// fsync, SQLite) and so runs on the BlockingExecutor (PostBlocking), never
// on a gRPC reaction thread. A Submit is acknowledged only once its spool
// entry is durable (durable_jobs.cc explains the exactly-once rule).
//
// Tenants: a Submit's job belongs to the caller's tenant and its
// idempotency key is scoped to it. GetResult and Cancel answer NOT_FOUND,
// word for word as for an unknown id, for a job the caller may not see;
// a caller that may see a job but not cancel it gets PERMISSION_DENIED.
#include "server/rpc/blocking_calls.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/validate/validate.h"
#include "server/log/log.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/conversions.h"
#include "server/rpc/durable_jobs.h"
#include "server/rpc/logged_reactor.h"
#include "server/rpc/rpc_methods.h"
#include "server/rpc/status_util.h"
#include "server/store/job_ids.h"

namespace attnaudit::server {
namespace rpc_internal {

grpc::ServerUnaryReactor* PostBlocking(
    AuditServiceImpl* svc, const char* method,
    grpc::CallbackServerContext* context, uint32_t needed,
    const Precheck& precheck, BlockingWork work,
    std::shared_ptr<google::protobuf::Message> response,
    grpc::ByteBuffer* response_buffer) {
  auto* call = new LoggedUnaryReactor(method, context);
  svc->CountRequest();
  absl::StatusOr<Principal> principal =
      Authorize(svc, *context, needed, method);
  if (!principal.ok()) {
    call->Done(ToGrpcStatus(principal.status()));
    return call;
  }
  if (absl::Status s = precheck(*principal, &call->log()); !s.ok()) {
    call->Done(ToGrpcStatus(s));
    return call;
  }
  const bool posted = svc->executor()->Post(
      [call, context, work = std::move(work), caller = *std::move(principal),
       response = std::move(response), response_buffer] {
        absl::Duration retry_after = absl::ZeroDuration();
        absl::Status s = work(caller, &call->log(), &retry_after);
        if (s.code() == absl::StatusCode::kResourceExhausted ||
            (s.code() == absl::StatusCode::kUnavailable &&
             retry_after > absl::ZeroDuration())) {
          AddRetryAfter(context, retry_after);
        }
        if (!s.ok()) return call->Done(ToGrpcStatus(s));
        call->Done(SerializeResponse(*response, response_buffer));
      });
  if (!posted) {
    AddRetryAfter(context, absl::Milliseconds(100));
    call->Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "server busy: too many Submit/GetResult/Cancel "
                            "calls waiting; retry after ~100 ms"));
  }
  return call;
}

}  // namespace rpc_internal

namespace {

using rpc_internal::DecodeAuditRequest;
using rpc_internal::DecodedAudit;
using rpc_internal::JobLabelsOf;
using rpc_internal::MaySee;
using rpc_internal::StorageError;

constexpr size_t kMaxIdempotencyKey = 128;

// What a Submit request asks for, checked before anything is decoded.
struct SubmitPlan {
  PriorityClass priority = PriorityClass::kSampled;
  absl::Time created;
  absl::Time deadline = absl::InfiniteFuture();
  std::string key;  // idempotency key; empty: none
  std::string job_id;
};

// InvalidArgument errors are invalid input (one accounting across RPCs:
// Metrics::CountInvalidInput).
absl::Status CountInvalid(AuditServiceImpl* svc, absl::Status s) {
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    svc->metrics()->CountInvalidInput(Metrics::InvalidInput::kAuditRequest);
  }
  return s;
}

// Step 1: the request's own fields (priority, key, timeout, presence of
// the snapshot) and the job id (an idempotent one is the caller tenant's).
absl::StatusOr<SubmitPlan> PlanSubmit(const AuditServiceImpl& svc,
                                      const Principal& caller,
                                      const v1::SubmitRequest& request) {
  SubmitPlan plan;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      plan.priority, rpc_internal::PriorityFromProto(request.priority(),
                                                     PriorityClass::kSampled));
  plan.key = request.idempotency_key();
  if (plan.key.size() > kMaxIdempotencyKey) {
    return absl::InvalidArgumentError(
        absl::StrCat("idempotency_key: ", plan.key.size(),
                     " bytes; at most 128 are allowed"));
  }
  plan.created = absl::Now();
  if (request.has_timeout()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        const absl::Duration timeout,
        rpc_internal::DurationFromProto(request.timeout(), "timeout"));
    if (timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("timeout: must be positive");
    }
    plan.deadline = plan.created + timeout;
  } else if (svc.options().default_submit_timeout != absl::InfiniteDuration()) {
    plan.deadline = plan.created + svc.options().default_submit_timeout;
  }
  if (!request.has_snapshot()) {
    return absl::InvalidArgumentError("snapshot: missing");
  }
  if (plan.key.empty()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(plan.job_id, NewJobId('s'));
  } else {
    plan.job_id = svc.job_id_key().IdempotentJobId(caller.tenant, plan.key);
  }
  return plan;
}

// Step 2: decodes and validates the request (bad input creates no job) and
// checks admission (advisory; Submit re-checks).
absl::StatusOr<DecodedAudit> DecodeAndAdmit(AuditServiceImpl* svc,
                                            const Principal& caller,
                                            const SubmitPlan& plan,
                                            v1::SubmitRequest* request,
                                            absl::Duration* retry_after) {
  absl::StatusOr<DecodedAudit> audit = DecodeAuditRequest(request);
  if (!audit.ok()) return CountInvalid(svc, audit.status());
  ATTNAUDIT_RETURN_IF_ERROR(
      rpc_internal::CheckOverridePermission(caller, *audit));
  if (absl::StatusOr<ResolvedLayout> layout =
          ValidateSnapshot(audit->snapshot, svc->options().limits);
      !layout.ok()) {
    return CountInvalid(svc, PrefixStatus("snapshot.", layout.status()));
  }
  AdmissionQuery query;
  query.priority = plan.priority;
  query.bytes = rpc_internal::SnapshotTensorBytes(audit->snapshot);
  query.tenant = caller.tenant;
  query.quota = caller.quota;
  query.deadline = plan.deadline;
  if (svc->store()->shared() &&
      (caller.quota.max_jobs > 0 || caller.quota.max_bytes > 0)) {
    // A fleet's quota counts the tenant's jobs on every replica; the
    // scheduler adds this replica's own.
    absl::StatusOr<TenantUsage> others =
        svc->store()->OthersUsage(caller.tenant, svc->options().replica_id);
    if (!others.ok()) {
      *retry_after = absl::Seconds(1);
      return StorageError("result store", others.status());
    }
    query.held_jobs += others->jobs;
    query.held_bytes += others->bytes;
  }
  ATTNAUDIT_RETURN_IF_ERROR(svc->admission()->Check(query, retry_after));
  return audit;
}

// Step 3: writes the spool entry (fsync). *deduplicated when an idempotent
// Submit with the same key already spooled it.
absl::Status SpoolSubmit(AuditServiceImpl* svc, const Principal& caller,
                         const SubmitPlan& plan, const Labels& labels,
                         const std::string& payload, bool* deduplicated,
                         absl::Duration* retry_after) {
  SpoolMetadata meta;
  meta.priority = static_cast<int32_t>(plan.priority);
  meta.created = plan.created;
  meta.deadline = plan.deadline;
  meta.model = labels.model;
  meta.layer = labels.layer;
  meta.engine = labels.engine;
  meta.tenant = caller.tenant;
  absl::Status s = svc->spool()->Put(plan.job_id, meta, payload);
  if (s.code() == absl::StatusCode::kAlreadyExists && !plan.key.empty()) {
    *deduplicated = true;
    return absl::OkStatus();
  }
  if (s.ok()) return s;
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    *retry_after = absl::Seconds(1);
  }
  return StorageError("could not store the job", s);
}

// Drops the spool entry of a Submit that will not run here.
void DropSpooled(AuditServiceImpl* svc, const std::string& job_id) {
  if (absl::Status r = svc->spool()->Remove(job_id); !r.ok()) {
    ATTNAUDIT_LOG(warn, "spool remove failed")
        .Kv("job_id", job_id)
        .Kv("status", r);
  }
}

// Step 4: admission and the job's row as one decision
// (JobStore::RecordAdmitted): the store creates the QUEUED row (in a fleet
// with the request bytes, `payload`, so another replica can take the job
// over if this one never comes back) in the transaction that hands the
// spooled job to the scheduler, and commits it only when the scheduler
// took the job. So the Submit is acknowledged only once both hold; a job
// the scheduler refuses leaves no row another replica could deduplicate
// against, and a replica given the same key meanwhile waits
// for this decision: it then finds the row (the job runs here) or creates
// its own (this replica refused it). In a fleet with a quota the store
// also counts the tenant's jobs on the other replicas under the tenant's
// lock, and the scheduler adds them to the tenant's jobs here.
absl::Status ScheduleSubmit(AuditServiceImpl* svc, const Principal& caller,
                            const SubmitPlan& plan, DecodedAudit audit,
                            absl::string_view payload, bool* deduplicated,
                            absl::Duration* retry_after) {
  const bool shared = svc->store()->shared();
  AdmittedJob row;
  row.record = rpc_internal::QueuedRecord(
      plan.job_id, caller.tenant, plan.priority,
      JobLabelsOf(audit.snapshot.labels), plan.created);
  row.record.replica = svc->options().replica_id;
  row.record.bytes = rpc_internal::SnapshotTensorBytes(audit.snapshot);
  row.deadline = plan.deadline;
  row.payload = shared ? payload : absl::string_view();
  row.count_tenant =
      shared && (caller.quota.max_jobs > 0 || caller.quota.max_bytes > 0);
  auto recorded = std::make_shared<absl::Notification>();
  std::unique_ptr<Job> job = rpc_internal::MakeDurableJob(
      svc, plan.job_id, caller.tenant, caller.quota, plan.priority,
      plan.deadline, plan.created, std::move(audit), recorded);
  bool scheduled = false;
  absl::Status refusal;
  absl::StatusOr<bool> created =
      svc->store()->RecordAdmitted(row, [&](const TenantUsage& elsewhere) {
        job->held_jobs_elsewhere = elsewhere.jobs;
        job->held_bytes_elsewhere = elsewhere.bytes;
        refusal = svc->admission()->Submit(std::move(job), retry_after);
        scheduled = refusal.ok();
        return refusal;
      });
  recorded->Notify();  // the job may mark itself RUNNING now
  if (created.ok() && *created) return absl::OkStatus();
  if (!scheduled) {
    svc->durable()->Forget(plan.job_id);
    DropSpooled(svc, plan.job_id);
  }
  if (created.ok()) {  // the job has its row already: it runs there
    *deduplicated = true;
    return absl::OkStatus();
  }
  if (!refusal.ok()) return refusal;
  if (scheduled) {
    // The COMMIT failed after the scheduler took the job: it runs here
    // (spooled) and its result creates its row, but the answer cannot
    // promise what the store did not confirm.
    ATTNAUDIT_LOG(warn, "job scheduled but its row not confirmed")
        .Kv("job_id", plan.job_id)
        .Kv("status", created.status());
  }
  *retry_after = absl::Seconds(1);
  return StorageError("result store", created.status());
}

// Whether the idempotent job `job_id` is known already.
bool KnownJob(AuditServiceImpl* svc, const std::string& job_id) {
  return svc->durable()->Get(job_id).has_value() ||
         svc->store()->Get(job_id).ok() || svc->spool()->Contains(job_id);
}

// A retried Submit is answered with its job only once the job has a row
// that GetResult finds. A job spooled by an earlier run that died before
// the row's commit has none until the start-up resume reaches it (which,
// with a long spool, can be well after the retry): the row is created here
// from the spool entry, so the acknowledged job is never reported unknown.
absl::Status RecordDeduplicated(AuditServiceImpl* svc, const SubmitPlan& plan,
                                absl::Duration* retry_after) {
  absl::StatusOr<ResultRecord> stored = svc->store()->Get(plan.job_id);
  if (stored.ok()) return absl::OkStatus();
  if (stored.status().code() != absl::StatusCode::kNotFound) {
    *retry_after = absl::Seconds(1);
    return StorageError("result store", stored.status());
  }
  absl::optional<ResultRecord> row = svc->durable()->Get(plan.job_id);
  if (!row.has_value()) {
    absl::StatusOr<SpoolMetadata> meta =
        svc->spool()->ReadMetadata(plan.job_id);
    if (!meta.ok()) {
      // Finished and pruned meanwhile, or unreadable: the resume decides.
      *retry_after = absl::Seconds(1);
      return absl::UnavailableError(
          "idempotency_key: the job with this key is being resumed; retry");
    }
    row = rpc_internal::QueuedRecord(
        plan.job_id, meta->tenant, static_cast<PriorityClass>(meta->priority),
        rpc_internal::JobLabelsOf(*meta), meta->created);
  }
  row->replica = svc->options().replica_id;
  absl::StatusOr<bool> recorded = svc->store()->RecordQueued(*row);
  if (recorded.ok()) return absl::OkStatus();
  *retry_after = absl::Seconds(1);
  return StorageError("result store", recorded.status());
}

// The body of Submit, on the executor. Fills *response on OK.
absl::Status DoSubmit(AuditServiceImpl* svc, const Principal& caller,
                      const grpc::ByteBuffer* raw, v1::SubmitResponse* response,
                      CallLog* log, absl::Duration* retry_after) {
  // The bytes as received are both the durable copy and what is parsed.
  std::string payload = rpc_internal::TakeRequestBytes(raw);
  svc->metrics()->AddBytesReceived(static_cast<int64_t>(payload.size()));
  log->set_bytes(static_cast<int64_t>(payload.size()));
  v1::SubmitRequest request;
  ATTNAUDIT_RETURN_IF_ERROR(
      CountInvalid(svc, rpc_internal::ParseRequestBytes(payload, &request)));
  absl::StatusOr<SubmitPlan> plan = PlanSubmit(*svc, caller, request);
  if (!plan.ok()) return CountInvalid(svc, plan.status());
  log->set_job_id(plan->job_id);
  response->set_job_id(plan->job_id);
  const bool idempotent = !plan->key.empty();
  if (idempotent && !svc->BeginIdempotentSubmit(plan->job_id)) {
    return absl::AbortedError(
        "idempotency_key: a Submit with this key is in progress; retry");
  }
  auto end_submit = absl::MakeCleanup([svc, idempotent, &plan] {
    if (idempotent) svc->EndIdempotentSubmit(plan->job_id);
  });
  if (idempotent && KnownJob(svc, plan->job_id)) {
    ATTNAUDIT_RETURN_IF_ERROR(RecordDeduplicated(svc, *plan, retry_after));
    response->set_deduplicated(true);
    return absl::OkStatus();
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(
      DecodedAudit audit,
      DecodeAndAdmit(svc, caller, *plan, &request, retry_after));
  rpc_internal::CountTruncatedLabels(svc, audit.truncated);
  bool deduplicated = false;
  ATTNAUDIT_RETURN_IF_ERROR(SpoolSubmit(svc, caller, *plan,
                                        audit.snapshot.labels, payload,
                                        &deduplicated, retry_after));
  if (deduplicated) {
    ATTNAUDIT_RETURN_IF_ERROR(RecordDeduplicated(svc, *plan, retry_after));
    response->set_deduplicated(true);
    return absl::OkStatus();
  }
  // On disk now: free the copy, unless a fleet store keeps it too.
  if (!svc->store()->shared()) std::string().swap(payload);
  // Admission and the row (ScheduleSubmit) before the answer.
  ATTNAUDIT_RETURN_IF_ERROR(ScheduleSubmit(svc, caller, *plan, std::move(audit),
                                           payload, &deduplicated,
                                           retry_after));
  response->set_deduplicated(deduplicated);
  return absl::OkStatus();
}

absl::Status UnknownJob(const std::string& job_id) {
  return absl::NotFoundError(
      absl::StrCat("job_id: no stored job '", job_id,
                   "' (unknown, pruned, or an Audit call's job)"));
}

absl::Status DoGetResult(AuditServiceImpl* svc, const Principal& caller,
                         const std::string& job_id, v1::JobResult* response) {
  // A job between acknowledgement and the commit of its result.
  if (absl::optional<ResultRecord> live = svc->durable()->Get(job_id);
      live.has_value()) {
    if (!MaySee(caller, live->tenant)) return UnknownJob(job_id);
    *response = rpc_internal::RecordToJobResult(*live);
    return absl::OkStatus();
  }
  // An Audit's result journalled here while the store was away.
  if (ResultJournal* journal = svc->result_journal();
      journal != nullptr && journal->Contains(job_id)) {
    absl::StatusOr<ResultRecord> kept = journal->Read(job_id);
    if (kept.ok()) {
      if (!MaySee(caller, kept->tenant)) return UnknownJob(job_id);
      *response = rpc_internal::RecordToJobResult(*kept);
      return absl::OkStatus();
    }
  }
  absl::StatusOr<ResultRecord> rec = svc->store()->Get(job_id);
  if (rec.status().code() == absl::StatusCode::kNotFound ||
      (rec.ok() && !MaySee(caller, rec->tenant))) {
    return UnknownJob(job_id);
  }
  if (!rec.ok()) return StorageError("result store", rec.status());
  *response = rpc_internal::RecordToJobResult(*rec);
  response->set_cursor(rpc_internal::CursorFor(caller, *rec));
  return absl::OkStatus();
}

// The owner of a queued, running, finishing or stored job; NotFound when
// there is none.
absl::StatusOr<std::string> OwnerOf(AuditServiceImpl* svc,
                                    const std::string& job_id) {
  if (absl::StatusOr<std::string> o = svc->scheduler()->OwnerOf(job_id);
      o.ok()) {
    return o;
  }
  if (absl::optional<ResultRecord> live = svc->durable()->Get(job_id);
      live.has_value()) {
    return live->tenant;
  }
  absl::StatusOr<ResultRecord> rec = svc->store()->Get(job_id);
  if (!rec.ok()) return rec.status();
  return rec->tenant;
}

// Why a job the store knows was cancelled, by its stored state: running
// or queued on a replica (in a fleet, possibly another one), or spooled
// here and not yet resumed.
absl::Status CancelledWhile(const AuditServiceImpl& svc,
                            const ResultRecord& rec) {
  const std::string where =
      rec.replica.empty() ? "" : absl::StrCat(" on replica ", rec.replica);
  if (rec.state == JobState::kRunning) {
    return absl::CancelledError(absl::StrCat("cancelled while it ran", where));
  }
  if (!rec.replica.empty() && rec.replica != svc.options().replica_id) {
    return absl::CancelledError(
        absl::StrCat("cancelled while it was queued", where));
  }
  return absl::CancelledError("cancelled before it was scheduled");
}

// Cancel of a job the scheduler no longer holds: a finishing job keeps
// running to its result; a stored one keeps its state; one that is
// spooled but not yet resumed is recorded cancelled.
absl::Status CancelUnscheduled(AuditServiceImpl* svc, const std::string& job_id,
                               v1::CancelResponse* response) {
  if (svc->durable()->Get(job_id).has_value()) {
    response->set_state(v1::JOB_STATE_RUNNING);  // its result is being stored
    return absl::OkStatus();
  }
  absl::StatusOr<ResultRecord> rec = svc->store()->Get(job_id);
  if (!rec.ok()) return StorageError("result store", rec.status());
  if (IsTerminal(rec->state)) {
    response->set_state(rpc_internal::JobStateToProto(rec->state));
    return absl::OkStatus();
  }
  // Known but not in this scheduler: spooled and not (yet) resumed, or
  // queued or running on another replica of a fleet. Record the
  // cancellation; the replica that has the job stops its copy when the
  // result feed brings it, and its own result is refused by PutResult, so
  // the job keeps exactly this one.
  rpc_internal::FailSpooledJob(
      svc, rpc_internal::TerminalRecord(*rec, CancelledWhile(*svc, *rec)));
  response->set_state(v1::JOB_STATE_CANCELLED);
  return absl::OkStatus();
}

absl::Status DoCancel(AuditServiceImpl* svc, const Principal& caller,
                      const std::string& job_id, v1::CancelResponse* response) {
  absl::StatusOr<std::string> owner = OwnerOf(svc, job_id);
  if (owner.status().code() == absl::StatusCode::kNotFound ||
      (owner.ok() && !MaySee(caller, *owner))) {
    return absl::NotFoundError(absl::StrCat(
        "job_id: no queued, running or stored job '", job_id, "'"));
  }
  if (!owner.ok()) return StorageError("result store", owner.status());
  if (*owner != caller.tenant && !caller.CancelsAll()) {
    svc->metrics()->CountRejection(RejectReason::kPermissionDenied);
    return absl::PermissionDeniedError(
        "Cancel of another tenant's job needs the admin permission");
  }
  absl::Status cancelled = svc->scheduler()->Cancel(job_id);
  if (cancelled.ok()) {
    response->set_state(v1::JOB_STATE_CANCELLED);
    return absl::OkStatus();
  }
  if (cancelled.code() != absl::StatusCode::kNotFound) return cancelled;
  return CancelUnscheduled(svc, job_id, response);
}

// A call about one job (GetResult, Cancel): the request is parsed and the
// id, which goes into the call's log line, must be valid; then `body`
// runs on the executor.
template <typename Request, typename Response>
grpc::ServerUnaryReactor* PostJobCall(
    AuditServiceImpl* svc, const char* method, uint32_t needed,
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* raw_response,
    absl::Status (*body)(AuditServiceImpl*, const Principal&,
                         const std::string&, Response*)) {
  auto request = std::make_shared<Request>();
  auto response = std::make_shared<Response>();
  return rpc_internal::PostBlocking(
      svc, method, context, needed,
      [svc, raw, request](const Principal&, CallLog* log) {
        absl::Status valid = rpc_internal::ParseRequest(raw, request.get());
        if (valid.ok()) {
          log->set_job_id(request->job_id());
          valid = ValidateJobId(request->job_id());
        }
        svc->admission()->CountRefusal(valid,
                                       Metrics::InvalidInput::kOtherRequest);
        return valid;
      },
      [svc, request, response, body](const Principal& caller, CallLog*,
                                     absl::Duration*) {
        return body(svc, caller, request->job_id(), response.get());
      },
      response, raw_response);
}

}  // namespace

grpc::ServerUnaryReactor* AuditServiceImpl::Submit(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto msg = std::make_shared<v1::SubmitResponse>();
  return rpc_internal::PostBlocking(
      this, "Submit", context, PermissionOf("Submit"),
      [this](const Principal&, CallLog*) {
        if (!draining()) return absl::OkStatus();
        metrics_->CountRejection(RejectReason::kDraining);
        return absl::UnavailableError("server is draining; retry elsewhere");
      },
      [this, request, msg](const Principal& caller, CallLog* log,
                           absl::Duration* retry_after) {
        absl::Status s =
            DoSubmit(this, caller, request, msg.get(), log, retry_after);
        if (!s.ok()) msg->Clear();
        return s;
      },
      msg, response);
}

grpc::ServerUnaryReactor* AuditServiceImpl::GetResult(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return PostJobCall<v1::GetResultRequest, v1::JobResult>(
      this, "GetResult", PermissionOf("GetResult"), context, request, response,
      &DoGetResult);
}

grpc::ServerUnaryReactor* AuditServiceImpl::Cancel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return PostJobCall<v1::CancelRequest, v1::CancelResponse>(
      this, "Cancel", PermissionOf("Cancel"), context, request, response,
      &DoCancel);
}

}  // namespace attnaudit::server
