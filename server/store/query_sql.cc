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
