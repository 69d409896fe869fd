// Submit, GetResult and Cancel: the unary calls whose work blocks (spool
// fsync, SQLite) and so runs on the BlockingExecutor (PostBlocking), never
// on a gRPC reaction thread. Each parses its request, hands it to the
// JobService (server/jobs/jobs.h: a Submit is acknowledged only once its
// spool entry is durable and its row committed; tenants see only their
// own jobs) and maps the answer to the wire.
#include "server/rpc/blocking_calls.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/conversions.h"
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

// InvalidArgument errors are invalid input (one accounting across RPCs:
// Metrics::CountInvalidInput).
absl::Status CountInvalid(AuditServiceImpl* svc, absl::Status s) {
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    svc->metrics()->CountInvalidInput(Metrics::InvalidInput::kAuditRequest);
  }
  return s;
}

// The request's own fields and its work as a SubmitJob; the JobService
// checks the rest (idempotency key, timeout, validation, admission).
absl::Status SubmitJobOf(const Principal& caller, v1::SubmitRequest* request,
                         SubmitJob* job) {
  job->caller = caller;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      job->priority, rpc_internal::PriorityFromProto(request->priority(),
                                                     PriorityClass::kSampled));
  job->idempotency_key = request->idempotency_key();
  if (request->has_timeout()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        job->timeout,
        rpc_internal::DurationFromProto(request->timeout(), "timeout"));
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(job->work,
                             rpc_internal::DecodeAuditRequest(request));
  return absl::OkStatus();
}

// The body of Submit, on the executor. Fills *response on OK.
absl::Status DoSubmit(AuditServiceImpl* svc, const Principal& caller,
                      const grpc::ByteBuffer* raw, v1::SubmitResponse* response,
                      CallLog* log, absl::Duration* retry_after) {
  // The bytes as received are both the durable copy and what is parsed.
  std::string payload = rpc_internal::TakeRequestBytes(raw);
  svc->metrics()->AddBytesReceived(static_cast<int64_t>(payload.size()));
  log->set_bytes(static_cast<int64_t>(payload.size()));
  SubmitJob job;
  {
    v1::SubmitRequest request;
    ATTNAUDIT_RETURN_IF_ERROR(
        CountInvalid(svc, rpc_internal::ParseRequestBytes(payload, &request)));
    ATTNAUDIT_RETURN_IF_ERROR(
        CountInvalid(svc, SubmitJobOf(caller, &request, &job)));
  }  // the parsed request is freed: its tensor bytes moved into the job
  job.payload = std::move(payload);
  SubmitAnswer answer;
  absl::Status s = svc->jobs()->Submit(std::move(job), &answer);
  if (!answer.job_id.empty()) log->set_job_id(answer.job_id);
  *retry_after = answer.retry_after;
  if (!s.ok()) return s;
  response->set_job_id(answer.job_id);
  response->set_deduplicated(answer.deduplicated);
  return absl::OkStatus();
}

absl::Status DoGetResult(AuditServiceImpl* svc, const Principal& caller,
                         const std::string& job_id, v1::JobResult* response) {
  ATTNAUDIT_ASSIGN_OR_RETURN(ResultRecord rec,
                             svc->jobs()->Get(caller, job_id));
  *response = rpc_internal::RecordToJobResult(rec);
  // In the caller's numbering (0 for a job not stored yet).
  response->set_cursor(CursorFor(caller, rec));
  return absl::OkStatus();
}

absl::Status DoCancel(AuditServiceImpl* svc, const Principal& caller,
                      const std::string& job_id, v1::CancelResponse* response) {
  ATTNAUDIT_ASSIGN_OR_RETURN(JobState state,
                             svc->jobs()->Cancel(caller, job_id));
  response->set_state(rpc_internal::JobStateToProto(state));
  return absl::OkStatus();
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
        svc->jobs()->CountRefusal(valid, Metrics::InvalidInput::kOtherRequest);
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
