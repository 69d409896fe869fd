// Internal to server/store: what both stores' SQL shares -- the column
// lists of a ResultRecord row and a PairRecord row, the WHERE / ORDER BY /
// LIMIT of a ResultQuery and a PairQuery with their parameters, and the
// argument checks, so the two stores answer a query with the same rows in
// the same order (the conformance suite checks it).
#ifndef ATTNAUDIT_SERVER_STORE_QUERY_SQL_H_
#define ATTNAUDIT_SERVER_STORE_QUERY_SQL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/store/job_store.h"

namespace attnaudit::server::store_internal {

// Every column of a row but the report, in the order RecordFromColumns
// reads them; the report (when read) follows as the last column.
inline constexpr const char* kRecordColumns =
    "job_id, state, verdict, priority, model, layer, engine, backend, step, "
    "run, diagnosis, replica, created_us, started_us, finished_us, "
    "error_code, error_message, tenant, seq, bytes, tenant_seq";
inline constexpr int kNumRecordColumns = 21;
inline constexpr const char* kTerminalStates = "('DONE','FAILED','CANCELLED')";

// One row of a result, as text / integers.
struct RowReader {
  virtual ~RowReader() = default;
  virtual std::string Text(int col) const = 0;
  virtual int64_t Int(int col) const = 0;
};

// A bound parameter: an integer or a text.
struct SqlParam {
  bool is_int = false;
  int64_t i = 0;
  std::string s;
};

// The SQL after "SELECT <columns> FROM <table>" of `query`, with its
// parameters numbered from 1 ("?1" for SQLite, "$1" for PostgreSQL:
// `placeholder` is '?' or '$'). InvalidArgument for a limit out of range,
// or tenant_cursor without a tenant.
struct QuerySql {
  std::string tail;
  std::vector<SqlParam> params;
};
absl::StatusOr<QuerySql> BuildQuerySql(const ResultQuery& query,
                                       char placeholder);

// PutResult's argument check: a job id and a terminal state, else
// InvalidArgument naming the field.
absl::Status CheckTerminal(const ResultRecord& record);

// --- Train-rollout pairs.

// Every column of a pair row but its report and request ids, in the order
// PairFromColumns reads them; the report (when read) follows.
inline constexpr const char* kPairColumns =
    "seq, tenant, run, layer, rollout_job, trainer_job, rollout_step, "
    "trainer_step, rollout_weight_version, trainer_weight_version, verdict, "
    "replica, joined_us";
inline constexpr int kNumPairColumns = 13;

// PutPairSide's argument check (the side, and a limit in [1, 1000]) and
// PutPair's: InvalidArgument naming the field ("side.run: empty").
absl::Status CheckPairSide(const PairSide& side, int limit);
absl::Status CheckPair(const PairRecord& pair);

// The SQL after "SELECT <kPairColumns> FROM <pairs table>" of `query`, its
// parameters numbered from 1 as BuildQuerySql's; `request_ids_table` is
// the table of (seq, request_id) a request id filter reads.
// InvalidArgument for a limit out of range.
absl::StatusOr<QuerySql> BuildPairQuerySql(const PairQuery& query,
                                           char placeholder,
                                           absl::string_view request_ids_table);

// Fills a pair from the kPairColumns values (request ids and report are
// the caller's).
PairRecord PairFromColumns(const RowReader& row);

// Microseconds since the epoch as stored (infinite times saturate).
int64_t Micros(absl::Time t);
// Its inverse (INT64_MAX / INT64_MIN: the infinite times).
absl::Time FromMicros(int64_t us);

// Fills a record from the kRecordColumns values (as text / integers the
// caller read from its row).
ResultRecord RecordFromColumns(const RowReader& row);

}  // namespace attnaudit::server::store_internal

#endif  // ATTNAUDIT_SERVER_STORE_QUERY_SQL_H_
