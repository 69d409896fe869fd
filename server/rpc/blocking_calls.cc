// Submit, GetResult and Cancel: the unary calls whose work blocks (spool
// fsync, SQLite) and so runs on the BlockingExecutor (PostBlocking), never
// on a gRPC reaction thread. A Submit is acknowledged only once its spool
// entry is durable (durable_jobs.cc explains the exactly-once rule).
#include <memory>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/validate/validate.h"
#include "server/common/log.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/job_ids.h"
#include "server/rpc/logged_reactor.h"
#include "server/rpc/rpc_internal.h"
#include "server/rpc/status_util.h"

namespace attnaudit::server {
namespace rpc_internal {

grpc::ServerUnaryReactor* PostBlocking(AuditServiceImpl* svc,
                                       const char* method,
                                       grpc::CallbackServerContext* context,
                                       const Precheck& precheck,
                                       BlockingWork work) {
  auto* call = new LoggedUnaryReactor(method, context);
  if (grpc::Status auth = svc->auth().Check(*context); !auth.ok()) {
    call->Done(auth);
    return call;
  }
  if (absl::Status s = precheck(&call->log()); !s.ok()) {
    call->Done(ToGrpcStatus(s));
    return call;
  }
  const bool posted =
      svc->executor()->Post([call, context, work = std::move(work)] {
        absl::Duration retry_after = absl::ZeroDuration();
        absl::Status s = work(&call->log(), &retry_after);
        if (s.code() == absl::StatusCode::kResourceExhausted) {
          AddRetryAfter(context, retry_after);
        }
        call->Done(ToGrpcStatus(s));
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
// the snapshot) and the job id.
absl::StatusOr<SubmitPlan> PlanSubmit(const AuditServiceImpl& svc,
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
  plan.job_id = plan.key.empty() ? NewJobId('s') : IdempotentJobId(plan.key);
  return plan;
}

// Step 2: serialises the request as received into *payload (the durable
// copy, before its bytes move), then decodes and validates it (bad input
// creates no job) and checks admission (advisory; Submit re-checks).
absl::StatusOr<DecodedAudit> DecodeAndAdmit(AuditServiceImpl* svc,
                                            const SubmitPlan& plan,
                                            v1::SubmitRequest* request,
                                            std::string* payload,
                                            absl::Duration* retry_after) {
  if (!request->SerializeToString(payload)) {
    return absl::InternalError("could not serialise the request");
  }
  absl::StatusOr<DecodedAudit> audit = DecodeAuditRequest(request);
  if (!audit.ok()) return CountInvalid(svc, audit.status());
  if (absl::StatusOr<ResolvedLayout> layout =
          ValidateSnapshot(audit->snapshot, svc->options().limits);
      !layout.ok()) {
    return CountInvalid(svc, PrefixStatus("snapshot.", layout.status()));
  }
  SubmitRejection why;
  if (absl::Status s = svc->scheduler()->CheckAdmission(
          plan.priority, rpc_internal::SnapshotTensorBytes(audit->snapshot),
          &why);
      !s.ok()) {
    svc->metrics()->CountRejection(why.reason);
    *retry_after = why.retry_after;
    return s;
  }
  return audit;
}

// Step 3: writes the spool entry (fsync). *deduplicated when an idempotent
// Submit with the same key already spooled it.
absl::Status SpoolSubmit(AuditServiceImpl* svc, const SubmitPlan& plan,
                         const Labels& labels, const std::string& payload,
                         bool* deduplicated, absl::Duration* retry_after) {
  SpoolMetadata meta;
  meta.priority = static_cast<int32_t>(plan.priority);
  meta.created = plan.created;
  meta.deadline = plan.deadline;
  meta.model = labels.model;
  meta.layer = labels.layer;
  meta.engine = labels.engine;
  absl::Status s = svc->spool()->Put(plan.job_id, meta, payload);
  if (s.code() == absl::StatusCode::kAlreadyExists && !plan.key.empty()) {
    *deduplicated = true;
    return absl::OkStatus();
  }
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    *retry_after = absl::Seconds(1);
  }
  if (!s.ok()) {
    ATTNAUDIT_LOG(err, "spool write failed")
        .Kv("job_id", plan.job_id)
        .Kv("status", s);
  }
  return s;
}

// Step 4: hands the spooled job to the scheduler (dropping the entry if it
// is refused) and records it QUEUED in the store.
absl::Status ScheduleSubmit(AuditServiceImpl* svc, const SubmitPlan& plan,
                            DecodedAudit audit, absl::Duration* retry_after) {
  const JobLabels labels = JobLabelsOf(audit.snapshot.labels);
  SubmitRejection why;
  if (absl::Status s = svc->scheduler()->Submit(
          rpc_internal::MakeDurableJob(svc, plan.job_id, plan.priority,
                                       plan.deadline, plan.created,
                                       std::move(audit)),
          &why);
      !s.ok()) {
    if (absl::Status r = svc->spool()->Remove(plan.job_id); !r.ok()) {
      ATTNAUDIT_LOG(warn, "spool remove failed")
          .Kv("job_id", plan.job_id)
          .Kv("status", r);
    }
    *retry_after = why.retry_after;
    return s;
  }
  // Insert-or-ignore: harmless if the job already finished.
  absl::StatusOr<bool> recorded =
      svc->store()->RecordQueued(rpc_internal::QueuedRecord(
          plan.job_id, plan.priority, labels, plan.created));
  if (!recorded.ok()) {
    ATTNAUDIT_LOG(warn, "result store RecordQueued failed")
        .Kv("job_id", plan.job_id)
        .Kv("status", recorded.status());
  }
  return absl::OkStatus();
}

// The body of Submit, on the executor. Fills *response on OK.
absl::Status DoSubmit(AuditServiceImpl* svc, v1::SubmitRequest* request,
                      v1::SubmitResponse* response, CallLog* log,
                      absl::Duration* retry_after) {
  const int64_t wire_bytes = static_cast<int64_t>(request->ByteSizeLong());
  svc->metrics()->AddBytesReceived(wire_bytes);
  log->set_bytes(wire_bytes);
  absl::StatusOr<SubmitPlan> plan = PlanSubmit(*svc, *request);
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
  if (idempotent && (svc->store()->Get(plan->job_id).ok() ||
                     svc->spool()->Contains(plan->job_id))) {
    response->set_deduplicated(true);
    return absl::OkStatus();
  }
  std::string payload;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      DecodedAudit audit,
      DecodeAndAdmit(svc, *plan, request, &payload, retry_after));
  bool deduplicated = false;
  ATTNAUDIT_RETURN_IF_ERROR(SpoolSubmit(svc, *plan, audit.snapshot.labels,
                                        payload, &deduplicated, retry_after));
  response->set_deduplicated(deduplicated);
  if (deduplicated) return absl::OkStatus();
  std::string().swap(payload);  // on disk now; free the copy
  return ScheduleSubmit(svc, *plan, std::move(audit), retry_after);
}

absl::Status DoGetResult(AuditServiceImpl* svc, const std::string& job_id,
                         v1::JobResult* response) {
  absl::StatusOr<ResultRecord> rec = svc->store()->Get(job_id);
  if (rec.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(
        absl::StrCat("job_id: no stored job '", job_id,
                     "' (unknown, pruned, or an Audit call's job)"));
  }
  ATTNAUDIT_RETURN_IF_ERROR(rec.status());
  *response = rpc_internal::RecordToJobResult(*rec);
  return absl::OkStatus();
}

absl::Status DoCancel(AuditServiceImpl* svc, const std::string& job_id,
                      v1::CancelResponse* response) {
  absl::Status cancelled = svc->scheduler()->Cancel(job_id);
  if (cancelled.ok()) {
    response->set_state(v1::JOB_STATE_CANCELLED);
    return absl::OkStatus();
  }
  if (cancelled.code() != absl::StatusCode::kNotFound) return cancelled;
  absl::StatusOr<ResultRecord> rec = svc->store()->Get(job_id);
  if (rec.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(
        "job_id: no queued, running or stored job '", job_id, "'"));
  }
  ATTNAUDIT_RETURN_IF_ERROR(rec.status());
  if (IsTerminal(rec->state)) {
    response->set_state(rpc_internal::JobStateToProto(rec->state));
    return absl::OkStatus();
  }
  // Known but not in the scheduler: spooled and not (yet) resumed. Record
  // the cancellation; if the resume admits it anyway, its own result is
  // refused by PutResult, so the job keeps exactly this one.
  rpc_internal::FailSpooledJob(
      svc, rpc_internal::TerminalRecord(
               *rec, absl::CancelledError("cancelled before it was "
                                          "scheduled")));
  absl::StatusOr<ResultRecord> now = svc->store()->Get(job_id);
  response->set_state(now.ok() ? rpc_internal::JobStateToProto(now->state)
                               : v1::JOB_STATE_CANCELLED);
  return absl::OkStatus();
}

// A call about one job (GetResult, Cancel): the id goes into the call's log
// line and must be valid, then `body` runs on the executor. `job_id` is a
// field of the request, which gRPC keeps alive until the call finishes.
template <typename Response>
grpc::ServerUnaryReactor* PostJobCall(
    AuditServiceImpl* svc, const char* method,
    grpc::CallbackServerContext* context, const std::string& job_id,
    Response* response,
    absl::Status (*body)(AuditServiceImpl*, const std::string&, Response*)) {
  return rpc_internal::PostBlocking(
      svc, method, context,
      [svc, &job_id](CallLog* log) {
        log->set_job_id(job_id);
        absl::Status valid = ValidateJobId(job_id);
        rpc_internal::CountRefusal(svc, valid,
                                   Metrics::InvalidInput::kOtherRequest);
        return valid;
      },
      [svc, &job_id, response, body](CallLog*, absl::Duration*) {
        return body(svc, job_id, response);
      });
}

}  // namespace

grpc::ServerUnaryReactor* AuditServiceImpl::Submit(
    grpc::CallbackServerContext* context, const v1::SubmitRequest* request,
    v1::SubmitResponse* response) {
  // The request comes from this service's allocator (audit_service.cc), so
  // its bytes may be moved out.
  auto* mutable_request = const_cast<v1::SubmitRequest*>(request);
  return rpc_internal::PostBlocking(
      this, "Submit", context,
      [this](CallLog*) {
        if (!draining()) return absl::OkStatus();
        metrics_->CountRejection(RejectReason::kDraining);
        return absl::UnavailableError("server is draining; retry elsewhere");
      },
      [this, mutable_request, response](CallLog* log,
                                        absl::Duration* retry_after) {
        absl::Status s =
            DoSubmit(this, mutable_request, response, log, retry_after);
        if (!s.ok()) response->Clear();
        return s;
      });
}

grpc::ServerUnaryReactor* AuditServiceImpl::GetResult(
    grpc::CallbackServerContext* context, const v1::GetResultRequest* request,
    v1::JobResult* response) {
  return PostJobCall(this, "GetResult", context, request->job_id(), response,
                     &DoGetResult);
}

grpc::ServerUnaryReactor* AuditServiceImpl::Cancel(
    grpc::CallbackServerContext* context, const v1::CancelRequest* request,
    v1::CancelResponse* response) {
  return PostJobCall(this, "Cancel", context, request->job_id(), response,
                     &DoCancel);
}

}  // namespace attnaudit::server
