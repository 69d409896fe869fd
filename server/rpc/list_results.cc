// ListResults: the caller's stored results, newest first, as summaries:
// the request becomes a store query, JobService::List reads it on the
// BlockingExecutor (the store may be a remote database).
//
// Paging: results are ordered by their cursor (commit order), so a page
// token is the cursor of the page's last row ("c<cursor>"), and the next
// page is every matching row with a smaller cursor -- stable while new
// results arrive (they have larger cursors) and across replicas.
//
// Tenants: a caller sees its own tenant's results unless it reads all
// (JobService::List restricts the query), and its cursors and page tokens count
// its own tenant's results (tenant_seq; the feed's seq for a caller that reads
// all), so they reveal nothing of other tenants' volume.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/blocking_calls.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/conversions.h"
#include "server/rpc/rpc_methods.h"

namespace attnaudit::server {
namespace {

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;

using rpc_internal::TextFilter;
using rpc_internal::TimeFromProto;

// The request as a store query (InvalidArgument naming the field).
absl::StatusOr<ResultQuery> QueryOf(const v1::ListResultsRequest& r) {
  ResultQuery q;
  q.results_only = true;
  q.include_report = true;  // summaries are read from the report
  q.model = TextFilter(r.model());
  q.engine = TextFilter(r.engine());
  q.backend = TextFilter(r.backend());
  q.run = TextFilter(r.run());
  q.diagnosis = TextFilter(r.diagnosis());
  if (r.has_layer()) q.layer = r.layer();
  if (r.has_step()) q.step = r.step();
  if (r.verdict() != v1::VERDICT_UNSPECIFIED) {
    if (!v1::Verdict_IsValid(r.verdict())) {
      return absl::InvalidArgumentError(
          absl::StrCat("verdict: unknown value ", r.verdict()));
    }
    q.verdict = static_cast<int>(r.verdict());
  }
  switch (r.state()) {
    case v1::JOB_STATE_UNSPECIFIED:
      break;
    case v1::JOB_STATE_DONE:
      q.state = JobState::kDone;
      break;
    case v1::JOB_STATE_FAILED:
      q.state = JobState::kFailed;
      break;
    case v1::JOB_STATE_CANCELLED:
      q.state = JobState::kCancelled;
      break;
    default:
      return absl::InvalidArgumentError(
          "state: only DONE, FAILED or CANCELLED (results are finished jobs)");
  }
  if (r.has_finished_after()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        q.finished_since, TimeFromProto(r.finished_after(), "finished_after"));
  }
  if (r.has_finished_before()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        q.finished_until,
        TimeFromProto(r.finished_before(), "finished_before"));
  }
  if (r.page_size() < 0 || r.page_size() > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: must be in [0, ", kMaxPageSize, "], got ", r.page_size()));
  }
  q.limit = r.page_size() == 0 ? kDefaultPageSize : r.page_size();
  if (!r.page_token().empty()) {
    int64_t cursor = 0;
    if (r.page_token()[0] != 'c' ||
        !absl::SimpleAtoi(absl::string_view(r.page_token()).substr(1),
                          &cursor) ||
        cursor <= 0) {
      return absl::InvalidArgumentError(
          "page_token: not a token from a previous ListResults response");
    }
    q.before_seq = cursor;
  }
  return q;
}

void Brief(const v1::DriftStats& s, v1::DriftBrief* out) {
  out->set_max_abs(s.max_abs());
  out->set_rms(s.rms());
  out->set_tolerance(s.tolerance());
}

v1::ResultSummary Summarize(const Principal& caller,
                            const ResultRecord& record) {
  const v1::JobResult full = rpc_internal::RecordToJobResult(record);
  v1::ResultSummary s;
  s.set_job_id(full.job_id());
  s.set_state(full.state());
  *s.mutable_labels() = full.labels();
  s.mutable_labels()->clear_request_ids();  // [B] ids: GetResult has them
  s.set_replica(record.replica);
  s.set_cursor(CursorFor(caller, record));
  if (full.has_submit_time()) *s.mutable_submit_time() = full.submit_time();
  if (full.has_start_time()) *s.mutable_start_time() = full.start_time();
  if (full.has_finish_time()) *s.mutable_finish_time() = full.finish_time();
  if (full.has_error()) *s.mutable_error() = full.error();
  if (!full.has_report()) return s;
  const v1::AuditReport& report = full.report();
  s.set_verdict(report.verdict());
  for (const v1::ComparisonResult& c : report.comparisons()) {
    if (c.comparison() == v1::COMPARISON_ENGINE_VS_REFERENCE) {
      Brief(c.out(), s.mutable_engine_out());
      Brief(c.lse(), s.mutable_engine_lse());
      s.set_logprob_max_abs(c.logprob().max_abs());
    } else if (c.comparison() == v1::COMPARISON_REPLAY_VS_REFERENCE) {
      Brief(c.out(), s.mutable_replay_out());
      Brief(c.lse(), s.mutable_replay_lse());
    }
  }
  if (!report.diagnoses().empty()) {
    const v1::Diagnosis& top = report.diagnoses(0);
    s.set_diagnosis(top.hypothesis());
    s.set_diagnosis_summary(top.summary());
    *s.mutable_diagnosis_location() = top.location();
  }
  s.set_audit_seconds(report.provenance().timings().total_seconds());
  return s;
}

absl::Status DoListResults(AuditServiceImpl* svc, const Principal& caller,
                           const v1::ListResultsRequest& request,
                           v1::ListResultsResponse* response) {
  absl::StatusOr<ResultQuery> query = QueryOf(request);
  if (!query.ok()) {
    svc->jobs()->CountRefusal(query.status(),
                              Metrics::InvalidInput::kOtherRequest);
    return query.status();
  }
  const int limit = query->limit;
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<ResultRecord> rows,
                             svc->jobs()->List(caller, *std::move(query)));
  for (const ResultRecord& r : rows) {
    *response->add_results() = Summarize(caller, r);
  }
  if (static_cast<int>(rows.size()) == limit && !rows.empty()) {
    response->set_next_page_token(
        absl::StrCat("c", CursorFor(caller, rows.back())));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* AuditServiceImpl::ListResults(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* raw_response) {
  auto request = std::make_shared<v1::ListResultsRequest>();
  auto response = std::make_shared<v1::ListResultsResponse>();
  return rpc_internal::PostBlocking(
      this, "ListResults", context, PermissionOf("ListResults"),
      [this, raw, request](const Principal&, CallLog*) {
        absl::Status s = rpc_internal::ParseRequest(raw, request.get());
        jobs_->CountRefusal(s, Metrics::InvalidInput::kOtherRequest);
        return s;
      },
      [this, request, response](const Principal& caller, CallLog*,
                                absl::Duration*) {
        return DoListResults(this, caller, *request, response.get());
      },
      response, raw_response);
}

}  // namespace attnaudit::server
