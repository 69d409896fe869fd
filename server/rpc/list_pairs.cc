// ListPairs: the caller's stored train-rollout pairs (server/pairs), newest
// first: the request becomes a store query that JobService::ListPairs
// reads on the BlockingExecutor.
//
// Paging: pairs are ordered by the store's pair number (commit order), so
// a page token is the number of the page's last pair ("p<seq>") and the
// next page holds the matching pairs with smaller numbers -- stable while
// new pairs are joined. The numbers are the store's, shared by every
// tenant (unlike ListResults' per-tenant cursors): a token says how many
// pairs the whole server had joined by then, not what they were.
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

using rpc_internal::TextFilter;
using rpc_internal::TimeFromProto;

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;

absl::Status PageOf(const v1::ListPairsRequest& r, PairQuery* q) {
  if (r.page_size() < 0 || r.page_size() > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: must be in [0, ", kMaxPageSize, "], got ", r.page_size()));
  }
  q->limit = r.page_size() == 0 ? kDefaultPageSize : r.page_size();
  if (r.page_token().empty()) return absl::OkStatus();
  int64_t seq = 0;
  if (r.page_token()[0] != 'p' ||
      !absl::SimpleAtoi(absl::string_view(r.page_token()).substr(1), &seq) ||
      seq <= 0) {
    return absl::InvalidArgumentError(
        "page_token: not a token from a previous ListPairs response");
  }
  q->before_seq = seq;
  return absl::OkStatus();
}

// The request as a store query (InvalidArgument naming the field).
absl::StatusOr<PairQuery> QueryOf(const v1::ListPairsRequest& r) {
  PairQuery q;
  q.include_report = true;
  q.run = TextFilter(r.run());
  q.request_id = TextFilter(r.request_id());
  if (r.has_layer()) q.layer = r.layer();
  if (r.has_step()) q.step = r.step();
  if (r.verdict() != v1::PAIR_VERDICT_UNSPECIFIED) {
    if (!v1::PairVerdict_IsValid(r.verdict())) {
      return absl::InvalidArgumentError(
          absl::StrCat("verdict: unknown value ", r.verdict()));
    }
    q.verdict = static_cast<int>(r.verdict());
  }
  if (r.has_joined_after()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(q.joined_since,
                               TimeFromProto(r.joined_after(), "joined_after"));
  }
  if (r.has_joined_before()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        q.joined_until, TimeFromProto(r.joined_before(), "joined_before"));
  }
  ATTNAUDIT_RETURN_IF_ERROR(PageOf(r, &q));
  return q;
}

v1::PairResult PairToProto(const PairRecord& p) {
  v1::PairResult out;
  out.set_rollout_job_id(p.rollout_job);
  out.set_trainer_job_id(p.trainer_job);
  out.set_run(p.run);
  if (p.layer >= 0) out.set_layer(p.layer);
  if (p.rollout_step >= 0) out.set_rollout_step(p.rollout_step);
  if (p.trainer_step >= 0) out.set_trainer_step(p.trainer_step);
  out.set_rollout_weight_version(p.rollout_weight_version);
  out.set_trainer_weight_version(p.trainer_weight_version);
  // A report that does not parse (never written so) leaves the verdict.
  if (!out.mutable_report()->ParseFromString(p.report)) {
    out.clear_report();
    out.mutable_report()->set_verdict(static_cast<v1::PairVerdict>(p.verdict));
  }
  rpc_internal::TimeToProto(p.joined, out.mutable_join_time());
  out.set_replica(p.replica);
  return out;
}

absl::Status DoListPairs(AuditServiceImpl* svc, const Principal& caller,
                         const v1::ListPairsRequest& request,
                         v1::ListPairsResponse* response) {
  absl::StatusOr<PairQuery> query = QueryOf(request);
  if (!query.ok()) {
    svc->jobs()->CountRefusal(query.status(),
                              Metrics::InvalidInput::kOtherRequest);
    return query.status();
  }
  const int limit = query->limit;
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<PairRecord> rows,
                             svc->jobs()->ListPairs(caller, *std::move(query)));
  for (const PairRecord& p : rows) *response->add_pairs() = PairToProto(p);
  if (static_cast<int>(rows.size()) == limit && !rows.empty()) {
    response->set_next_page_token(absl::StrCat("p", rows.back().seq));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* AuditServiceImpl::ListPairs(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* raw_response) {
  auto request = std::make_shared<v1::ListPairsRequest>();
  auto response = std::make_shared<v1::ListPairsResponse>();
  return rpc_internal::PostBlocking(
      this, "ListPairs", context, PermissionOf("ListPairs"),
      [this, raw, request](const Principal&, CallLog*) {
        absl::Status s = rpc_internal::ParseRequest(raw, request.get());
        jobs_->CountRefusal(s, Metrics::InvalidInput::kOtherRequest);
        return s;
      },
      [this, request, response](const Principal& caller, CallLog*,
                                absl::Duration*) {
        return DoListPairs(this, caller, *request, response.get());
      },
      response, raw_response);
}

}  // namespace attnaudit::server
