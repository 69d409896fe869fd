// Submit, GetResult, Cancel and the completion of durable jobs: the
// durable half of the service (the spool resume is spool_resume.cc). Everything
// here that touches the disk runs on the BlockingExecutor (or a scheduler
// worker / the resume thread), never on a gRPC reaction thread.
//
// Exactly-once results: a Submit is acknowledged only after its spool
// entry is durable; a job's terminal result is committed to the store
// BEFORE its spool entry is removed; PutResult never overwrites a terminal
// row. So a crash anywhere leaves either the spool entry (the job is re-run
// on the next start) or the result (the entry is dropped on the next start),
// and a job never gets two results.
#include <memory>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/validate/validate.h"
#include "proto/codec/codec.h"
#include "server/common/log.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/logged_reactor.h"
#include "server/rpc/rpc_internal.h"
#include "server/rpc/status_util.h"

namespace attnaudit::rpc {
namespace {

using server::JobState;
using server::PriorityClass;
using server::RejectReason;
using server::ResultRecord;

constexpr size_t kMaxIdempotencyKey = 128;

server::JobState StateOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return JobState::kDone;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      return JobState::kCancelled;
    default:
      return JobState::kFailed;
  }
}

// The completion of a durable (Submit or resumed) job.
void CompleteDurable(AuditServiceImpl* svc, const server::JobOutcome& outcome,
                     const Labels& labels, absl::Time created,
                     absl::Time started) {
  if (outcome.status.code() == absl::StatusCode::kUnavailable) {
    // Drain or shutdown: not a result. The spool entry stays and the next
    // start resumes the job.
    ATTNAUDIT_LOG(kInfo, "job left spooled for the next start")
        .Kv("job_id", outcome.job_id);
    return;
  }
  ResultRecord rec = TerminalRecord(outcome.job_id, outcome.priority,
                                    outcome.labels, created, outcome.status);
  if (outcome.ran && started != absl::InfinitePast()) rec.started = started;
  v1::AuditReport report;
  if (outcome.status.ok()) {
    rec.verdict = static_cast<int>(outcome.report.verdict);
    ReportToProto(outcome.report, &report);
    report.SerializeToString(&rec.report);
  }
  absl::StatusOr<bool> put = svc->store()->PutResult(rec);
  if (!put.ok()) {
    // The entry stays: the job runs again after a restart and PutResult
    // keeps it to one result.
    ATTNAUDIT_LOG(kError, "result store write failed; job stays spooled")
        .Kv("job_id", outcome.job_id)
        .Kv("status", put.status());
    return;
  }
  if (absl::Status s = svc->spool()->Remove(outcome.job_id); !s.ok()) {
    ATTNAUDIT_LOG(kWarn, "spool remove failed")
        .Kv("job_id", outcome.job_id)
        .Kv("status", s);
  }
  if (*put && svc->watch_hub()->HasWatchers()) {
    v1::JobResult result =
        OutcomeToJobResult(outcome, labels, created, started);
    if (outcome.status.ok()) *result.mutable_report() = std::move(report);
    PublishResult(svc, std::move(result));
  }
}

}  // namespace

ResultRecord TerminalRecord(const std::string& job_id, PriorityClass priority,
                            const server::JobLabels& labels, absl::Time created,
                            const absl::Status& status) {
  ResultRecord rec;
  rec.job_id = job_id;
  rec.state = StateOf(status);
  rec.priority = static_cast<int32_t>(priority);
  rec.model = labels.model;
  rec.layer = labels.layer;
  rec.engine = labels.engine;
  rec.created = created;
  rec.finished = absl::Now();
  rec.error_code = static_cast<int>(status.code());
  rec.error_message = std::string(status.message());
  return rec;
}

// Stores a terminal result for a job that will not run (corrupt entry,
// expired, refused on resume) and drops its spool entry.
void FailSpooledJob(AuditServiceImpl* svc, const ResultRecord& rec) {
  absl::StatusOr<bool> put = svc->store()->PutResult(rec);
  if (!put.ok()) {
    ATTNAUDIT_LOG(kError, "result store write failed; job stays spooled")
        .Kv("job_id", rec.job_id)
        .Kv("status", put.status());
    return;
  }
  if (absl::Status s = svc->spool()->Remove(rec.job_id); !s.ok()) {
    ATTNAUDIT_LOG(kWarn, "spool remove failed")
        .Kv("job_id", rec.job_id)
        .Kv("status", s);
  }
  if (*put && svc->watch_hub()->HasWatchers()) {
    PublishResult(svc, RecordToJobResult(rec));
  }
}

std::unique_ptr<server::Job> MakeDurableJob(
    AuditServiceImpl* svc, const std::string& job_id, PriorityClass priority,
    absl::Time deadline, absl::Time created, Snapshot snapshot,
    AuditOptions options) {
  auto job = std::make_unique<server::Job>();
  job->id = job_id;
  job->priority = priority;
  job->deadline = deadline;
  job->labels = JobLabelsOf(snapshot.labels);
  Labels labels = snapshot.labels;
  job->bytes = SnapshotTensorBytes(snapshot);
  job->snapshot = std::move(snapshot);
  ApplyServerOptions(*svc, &options);
  job->options = std::move(options);
  auto started = std::make_shared<absl::Time>(absl::InfinitePast());
  job->on_start = [svc, started](const server::Job& j, absl::string_view) {
    *started = absl::Now();
    absl::StatusOr<bool> marked = svc->store()->MarkRunning(j.id, *started);
    if (!marked.ok()) {
      ATTNAUDIT_LOG(kWarn, "result store MarkRunning failed")
          .Kv("job_id", j.id)
          .Kv("status", marked.status());
    }
  };
  job->on_done = [svc, labels = std::move(labels), created,
                  started](const server::JobOutcome& outcome) {
    CompleteDurable(svc, outcome, labels, created, *started);
  };
  return job;
}

ResultRecord QueuedRecord(const std::string& job_id, PriorityClass priority,
                          const server::JobLabels& labels, absl::Time created) {
  ResultRecord rec;
  rec.job_id = job_id;
  rec.state = JobState::kQueued;
  rec.priority = static_cast<int32_t>(priority);
  rec.model = labels.model;
  rec.layer = labels.layer;
  rec.engine = labels.engine;
  rec.created = created;
  return rec;
}

namespace {

// The body of Submit, on the executor. Fills *response on OK.
absl::Status DoSubmit(AuditServiceImpl* svc, v1::SubmitRequest* request,
                      v1::SubmitResponse* response, CallLog* log,
                      absl::Duration* retry_after) {
  const int64_t wire_bytes = static_cast<int64_t>(request->ByteSizeLong());
  svc->metrics()->AddBytesReceived(wire_bytes);
  log->set_bytes(wire_bytes);
  auto invalid = [svc](absl::Status s) {
    svc->metrics()->CountRejection(RejectReason::kInvalidArgument);
    return s;
  };

  absl::StatusOr<PriorityClass> priority =
      PriorityFromProto(request->priority(), PriorityClass::kSampled);
  if (!priority.ok()) return invalid(priority.status());
  const std::string& key = request->idempotency_key();
  if (key.size() > kMaxIdempotencyKey) {
    return invalid(absl::InvalidArgumentError(absl::StrCat(
        "idempotency_key: ", key.size(), " bytes; at most 128 are allowed")));
  }
  const absl::Time created = absl::Now();
  absl::Time deadline = absl::InfiniteFuture();
  if (request->has_timeout()) {
    const absl::Duration timeout =
        absl::Seconds(request->timeout().seconds()) +
        absl::Nanoseconds(request->timeout().nanos());
    if (timeout <= absl::ZeroDuration()) {
      return invalid(absl::InvalidArgumentError("timeout: must be positive"));
    }
    deadline = created + timeout;
  } else if (svc->options().default_submit_timeout !=
             absl::InfiniteDuration()) {
    deadline = created + svc->options().default_submit_timeout;
  }
  if (!request->has_snapshot()) {
    return invalid(absl::InvalidArgumentError("snapshot: missing"));
  }

  const std::string job_id = key.empty() ? NewJobId('s') : IdempotentJobId(key);
  log->set_job_id(job_id);
  response->set_job_id(job_id);
  if (!key.empty()) {
    if (!svc->BeginIdempotentSubmit(job_id)) {
      return absl::AbortedError(
          "idempotency_key: a Submit with this key is in progress; retry");
    }
  }
  auto end_submit = absl::MakeCleanup([svc, &key, &job_id] {
    if (!key.empty()) svc->EndIdempotentSubmit(job_id);
  });
  if (!key.empty()) {
    absl::StatusOr<ResultRecord> existing = svc->store()->Get(job_id);
    if (existing.ok() || svc->spool()->Contains(job_id)) {
      response->set_deduplicated(true);
      return absl::OkStatus();
    }
  }

  // The durable copy is the request as received (before its bytes move).
  std::string payload;
  if (!request->SerializeToString(&payload)) {
    return absl::InternalError("could not serialise the request");
  }
  absl::StatusOr<Snapshot> snapshot =
      SnapshotFromProto(request->mutable_snapshot());
  if (!snapshot.ok()) {
    return invalid(PrefixStatus("snapshot.", snapshot.status()));
  }
  absl::StatusOr<AuditOptions> options =
      AuditOptionsFromProto(request->options());
  if (!options.ok()) {
    return invalid(PrefixStatus("options.", options.status()));
  }
  // Bad input creates no job (service.proto): validate before spooling.
  if (absl::StatusOr<ResolvedLayout> layout =
          ValidateSnapshot(*snapshot, svc->options().limits);
      !layout.ok()) {
    return invalid(PrefixStatus("snapshot.", layout.status()));
  }
  const int64_t bytes = SnapshotTensorBytes(*snapshot);
  server::SubmitRejection why;
  if (absl::Status s = svc->scheduler()->CheckAdmission(*priority, bytes, &why);
      !s.ok()) {
    svc->metrics()->CountRejection(why.reason);
    *retry_after = why.retry_after;
    return s;
  }

  server::SpoolMetadata meta;
  meta.priority = static_cast<int32_t>(*priority);
  meta.created = created;
  meta.deadline = deadline;
  meta.model = snapshot->labels.model;
  meta.layer = snapshot->labels.layer;
  meta.engine = snapshot->labels.engine;
  if (absl::Status s = svc->spool()->Put(job_id, meta, payload); !s.ok()) {
    if (s.code() == absl::StatusCode::kAlreadyExists && !key.empty()) {
      response->set_deduplicated(true);
      return absl::OkStatus();
    }
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      *retry_after = absl::Seconds(1);
    }
    ATTNAUDIT_LOG(kError, "spool write failed")
        .Kv("job_id", job_id)
        .Kv("status", s);
    return s;
  }
  std::string().swap(payload);  // on disk now; free the copy

  const server::JobLabels labels = JobLabelsOf(snapshot->labels);
  std::unique_ptr<server::Job> job =
      MakeDurableJob(svc, job_id, *priority, deadline, created,
                     *std::move(snapshot), *std::move(options));
  if (absl::Status s = svc->scheduler()->Submit(std::move(job), &why);
      !s.ok()) {
    if (absl::Status r = svc->spool()->Remove(job_id); !r.ok()) {
      ATTNAUDIT_LOG(kWarn, "spool remove failed")
          .Kv("job_id", job_id)
          .Kv("status", r);
    }
    *retry_after = why.retry_after;
    return s;
  }
  // Insert-or-ignore: harmless if the job already finished.
  absl::StatusOr<bool> recorded = svc->store()->RecordQueued(
      QueuedRecord(job_id, *priority, labels, created));
  if (!recorded.ok()) {
    ATTNAUDIT_LOG(kWarn, "result store RecordQueued failed")
        .Kv("job_id", job_id)
        .Kv("status", recorded.status());
  }
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
  if (!rec.ok()) {
    if (rec.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat(
          "job_id: no queued, running or stored job '", job_id, "'"));
    }
    return rec.status();
  }
  if (server::IsTerminal(rec->state)) {
    response->set_state(JobStateToProto(rec->state));
    return absl::OkStatus();
  }
  // Known but not in the scheduler: spooled and not (yet) resumed. Record
  // the cancellation; if the resume admits it anyway, its own result is
  // refused by PutResult, so the job keeps exactly this one.
  server::JobLabels labels;
  labels.model = rec->model;
  labels.layer = rec->layer;
  labels.engine = rec->engine;
  FailSpooledJob(
      svc, TerminalRecord(
               job_id, static_cast<PriorityClass>(rec->priority), labels,
               rec->created,
               absl::CancelledError("cancelled before it was scheduled")));
  absl::StatusOr<ResultRecord> now = svc->store()->Get(job_id);
  response->set_state(now.ok() ? JobStateToProto(now->state)
                               : v1::JOB_STATE_CANCELLED);
  return absl::OkStatus();
}

}  // namespace

// ---- RPCs
// ----------------------------------------------------------------------

grpc::ServerUnaryReactor* AuditServiceImpl::Submit(
    grpc::CallbackServerContext* context, const v1::SubmitRequest* request,
    v1::SubmitResponse* response) {
  auto* call = new LoggedUnaryReactor("Submit", context);
  if (grpc::Status auth = auth_.Check(*context); !auth.ok()) {
    call->Done(auth);
    return call;
  }
  if (draining()) {
    metrics_->CountRejection(RejectReason::kDraining);
    call->Done(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "server is draining; retry elsewhere"));
    return call;
  }
  // The request comes from this service's allocator (audit_service.cc), so
  // its bytes may be moved out.
  auto* mutable_request = const_cast<v1::SubmitRequest*>(request);
  const bool posted =
      executor_->Post([this, call, context, mutable_request, response] {
        absl::Duration retry_after;
        absl::Status s = DoSubmit(this, mutable_request, response, &call->log(),
                                  &retry_after);
        if (s.code() == absl::StatusCode::kResourceExhausted) {
          AddRetryAfter(context, retry_after);
        }
        if (!s.ok()) response->Clear();
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

grpc::ServerUnaryReactor* AuditServiceImpl::GetResult(
    grpc::CallbackServerContext* context, const v1::GetResultRequest* request,
    v1::JobResult* response) {
  auto* call = new LoggedUnaryReactor("GetResult", context);
  if (grpc::Status auth = auth_.Check(*context); !auth.ok()) {
    call->Done(auth);
    return call;
  }
  call->log().set_job_id(request->job_id());
  if (absl::Status s = server::ValidateJobId(request->job_id()); !s.ok()) {
    call->Done(ToGrpcStatus(s));
    return call;
  }
  const bool posted = executor_->Post([this, call, request, response] {
    absl::StatusOr<ResultRecord> rec = store_->Get(request->job_id());
    if (!rec.ok()) {
      call->Done(
          ToGrpcStatus(rec.status().code() == absl::StatusCode::kNotFound
                           ? absl::NotFoundError(absl::StrCat(
                                 "job_id: no stored job '", request->job_id(),
                                 "' (unknown, pruned, or an Audit call's job)"))
                           : rec.status()));
      return;
    }
    *response = RecordToJobResult(*rec);
    call->Done(grpc::Status::OK);
  });
  if (!posted) {
    AddRetryAfter(context, absl::Milliseconds(100));
    call->Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "server busy; retry after ~100 ms"));
  }
  return call;
}

grpc::ServerUnaryReactor* AuditServiceImpl::Cancel(
    grpc::CallbackServerContext* context, const v1::CancelRequest* request,
    v1::CancelResponse* response) {
  auto* call = new LoggedUnaryReactor("Cancel", context);
  if (grpc::Status auth = auth_.Check(*context); !auth.ok()) {
    call->Done(auth);
    return call;
  }
  call->log().set_job_id(request->job_id());
  if (absl::Status s = server::ValidateJobId(request->job_id()); !s.ok()) {
    call->Done(ToGrpcStatus(s));
    return call;
  }
  const bool posted = executor_->Post([this, call, request, response] {
    call->Done(ToGrpcStatus(DoCancel(this, request->job_id(), response)));
  });
  if (!posted) {
    AddRetryAfter(context, absl::Milliseconds(100));
    call->Done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "server busy; retry after ~100 ms"));
  }
  return call;
}

}  // namespace attnaudit::rpc
