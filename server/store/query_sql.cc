#include "server/store/query_sql.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace attnaudit::server::store_internal {
namespace {

class Builder {
 public:
  explicit Builder(char placeholder) : placeholder_(placeholder) {}

  void Int(const char* column, int64_t v, const char* op = " = ") {
    SqlParam p;
    p.is_int = true;
    p.i = v;
    Add(column, op, std::move(p));
  }
  void Text(const char* column, const std::string& v) {
    SqlParam p;
    p.s = v;
    Add(column, " = ", std::move(p));
  }
  void Raw(absl::string_view sql) { absl::StrAppend(&sql_.tail, sql); }
  std::string Next() { return Placeholder(sql_.params.size() + 1); }
  void Bind(SqlParam p) { sql_.params.push_back(std::move(p)); }
  QuerySql Take() { return std::move(sql_); }

 private:
  std::string Placeholder(size_t n) const {
    return absl::StrCat(std::string(1, placeholder_), n);
  }
  void Add(const char* column, const char* op, SqlParam p) {
    absl::StrAppend(&sql_.tail, " AND ", column, op,
                    Placeholder(sql_.params.size() + 1));
    sql_.params.push_back(std::move(p));
  }

  const char placeholder_;
  QuerySql sql_;
};

}  // namespace

absl::Status CheckTerminal(const ResultRecord& r) {
  if (r.job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  if (!IsTerminal(r.state)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: PutResult needs DONE, FAILED or CANCELLED, got ",
                     JobStateName(r.state)));
  }
  return absl::OkStatus();
}

int64_t Micros(absl::Time t) {
  if (t == absl::InfiniteFuture()) return INT64_MAX;
  if (t == absl::InfinitePast()) return INT64_MIN;
  return absl::ToUnixMicros(t);
}

absl::Time FromMicros(int64_t us) {
  if (us == INT64_MAX) return absl::InfiniteFuture();
  if (us == INT64_MIN) return absl::InfinitePast();
  return absl::FromUnixMicros(us);
}

absl::StatusOr<QuerySql> BuildQuerySql(const ResultQuery& q, char placeholder) {
  if (q.limit < 1 || q.limit > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, 10000], got ", q.limit));
  }
  if (q.tenant_cursor && !q.tenant.has_value()) {
    return absl::InvalidArgumentError(
        "tenant_cursor: a tenant's numbering needs the tenant");
  }
  // Within one tenant both numberings are commit order.
  const char* cursor = q.tenant_cursor ? "tenant_seq" : "seq";
  Builder b(placeholder);
  b.Raw(" WHERE 1 = 1");
  if (q.tenant) b.Text("tenant", *q.tenant);
  if (q.verdict) b.Int("verdict", *q.verdict);
  if (q.state) b.Text("state", std::string(JobStateName(*q.state)));
  if (q.model) b.Text("model", *q.model);
  if (q.layer) b.Int("layer", *q.layer);
  if (q.engine) b.Text("engine", *q.engine);
  if (q.backend) b.Text("backend", *q.backend);
  if (q.step) b.Int("step", *q.step);
  if (q.run) b.Text("run", *q.run);
  if (q.diagnosis) b.Text("diagnosis", *q.diagnosis);
  if (q.results_only) {
    b.Raw(absl::StrCat(" AND state IN ", kTerminalStates));
    if (q.finished_since) {
      b.Int("finished_us", Micros(*q.finished_since), " >= ");
    }
    if (q.finished_until) {
      b.Int("finished_us", Micros(*q.finished_until), " < ");
    }
    if (q.before_seq > 0) b.Int(cursor, q.before_seq, " < ");
    b.Raw(absl::StrCat(" ORDER BY ", cursor, " DESC"));
  } else {
    b.Raw(" ORDER BY created_us DESC, job_id DESC");
  }
  b.Raw(absl::StrCat(" LIMIT ", b.Next()));
  SqlParam limit;
  limit.is_int = true;
  limit.i = q.limit;
  b.Bind(std::move(limit));
  return b.Take();
}

absl::Status CheckPairSide(const PairSide& side, int limit) {
  if (side.job_id.empty()) {
    return absl::InvalidArgumentError("side.job_id: empty");
  }
  if (side.run.empty()) return absl::InvalidArgumentError("side.run: empty");
  if (side.layer < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("side.layer: must be >= 0, got ", side.layer));
  }
  if (side.role != 1 && side.role != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "side.role: must be 1 (rollout) or 2 (trainer), got ", side.role));
  }
  if (side.rows.empty()) return absl::InvalidArgumentError("side.rows: empty");
  if (side.rows.size() > kMaxPairSideRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "side.rows: ", side.rows.size(), " rows, at most ", kMaxPairSideRows));
  }
  if (limit < 1 || limit > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, 1000], got ", limit));
  }
  return absl::OkStatus();
}

absl::Status CheckPair(const PairRecord& pair) {
  if (pair.rollout_job.empty()) {
    return absl::InvalidArgumentError("pair.rollout_job: empty");
  }
  if (pair.trainer_job.empty()) {
    return absl::InvalidArgumentError("pair.trainer_job: empty");
  }
  return absl::OkStatus();
}

absl::StatusOr<QuerySql> BuildPairQuerySql(
    const PairQuery& q, char placeholder, absl::string_view request_ids_table) {
  if (q.limit < 1 || q.limit > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, 10000], got ", q.limit));
  }
  Builder b(placeholder);
  b.Raw(" WHERE 1 = 1");
  if (q.tenant) b.Text("tenant", *q.tenant);
  if (q.run) b.Text("run", *q.run);
  if (q.layer) b.Int("layer", *q.layer);
  if (q.verdict) b.Int("verdict", *q.verdict);
  if (q.step) {
    // Either side's step: one parameter, named twice.
    const std::string step = b.Next();
    b.Raw(absl::StrCat(" AND (rollout_step = ", step,
                       " OR trainer_step = ", step, ")"));
    SqlParam p;
    p.is_int = true;
    p.i = *q.step;
    b.Bind(std::move(p));
  }
  if (q.request_id) {
    b.Raw(absl::StrCat(" AND seq IN (SELECT seq FROM ", request_ids_table,
                       " WHERE request_id = ", b.Next(), ")"));
    SqlParam p;
    p.s = *q.request_id;
    b.Bind(std::move(p));
  }
  if (q.joined_since) b.Int("joined_us", Micros(*q.joined_since), " >= ");
  if (q.joined_until) b.Int("joined_us", Micros(*q.joined_until), " < ");
  if (q.before_seq > 0) b.Int("seq", q.before_seq, " < ");
  b.Raw(absl::StrCat(" ORDER BY seq DESC LIMIT ", b.Next()));
  SqlParam limit;
  limit.is_int = true;
  limit.i = q.limit;
  b.Bind(std::move(limit));
  return b.Take();
}

PairRecord PairFromColumns(const RowReader& row) {
  PairRecord p;
  p.seq = row.Int(0);
  p.tenant = row.Text(1);
  p.run = row.Text(2);
  p.layer = row.Int(3);
  p.rollout_job = row.Text(4);
  p.trainer_job = row.Text(5);
  p.rollout_step = row.Int(6);
  p.trainer_step = row.Int(7);
  p.rollout_weight_version = row.Text(8);
  p.trainer_weight_version = row.Text(9);
  p.verdict = static_cast<int>(row.Int(10));
  p.replica = row.Text(11);
  p.joined = absl::FromUnixMicros(row.Int(12));
  return p;
}

ResultRecord RecordFromColumns(const RowReader& row) {
  ResultRecord r;
  r.job_id = row.Text(0);
  ParseJobState(row.Text(1), &r.state);
  r.verdict = static_cast<int>(row.Int(2));
  r.priority = static_cast<int32_t>(row.Int(3));
  r.model = row.Text(4);
  r.layer = row.Int(5);
  r.engine = row.Text(6);
  r.backend = row.Text(7);
  r.step = row.Int(8);
  r.run = row.Text(9);
  r.diagnosis = row.Text(10);
  r.replica = row.Text(11);
  r.created = absl::FromUnixMicros(row.Int(12));
  r.started = absl::FromUnixMicros(row.Int(13));
  r.finished = absl::FromUnixMicros(row.Int(14));
  r.error_code = static_cast<int>(row.Int(15));
  r.error_message = row.Text(16);
  r.tenant = row.Text(17);
  r.seq = row.Int(18);
  r.bytes = row.Int(19);
  r.tenant_seq = row.Int(20);
  return r;
}

}  // namespace attnaudit::server::store_internal
