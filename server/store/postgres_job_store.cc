#include "server/store/postgres_job_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "server/store/query_sql.h"

namespace attnaudit::server {
namespace {

using store_internal::kRecordColumns;
using store_internal::kTerminalStates;
using store_internal::Micros;

// Any fixed number: the advisory lock that serialises migrations.
constexpr int64_t kMigrationLock = 0x617474'6e61'7564;

constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE attnaudit_jobs (
  job_id        TEXT PRIMARY KEY,
  tenant        TEXT NOT NULL DEFAULT 'default',
  state         TEXT NOT NULL,
  verdict       INTEGER NOT NULL DEFAULT 0,
  priority      INTEGER NOT NULL DEFAULT 1,
  model         TEXT NOT NULL DEFAULT '',
  layer         BIGINT NOT NULL DEFAULT -1,
  engine        TEXT NOT NULL DEFAULT '',
  backend       TEXT NOT NULL DEFAULT '',
  step          BIGINT NOT NULL DEFAULT -1,
  run           TEXT NOT NULL DEFAULT '',
  diagnosis     TEXT NOT NULL DEFAULT '',
  replica       TEXT NOT NULL DEFAULT '',
  created_us    BIGINT NOT NULL DEFAULT 0,
  started_us    BIGINT NOT NULL DEFAULT 0,
  finished_us   BIGINT NOT NULL DEFAULT 0,
  error_code    INTEGER NOT NULL DEFAULT 0,
  error_message TEXT NOT NULL DEFAULT '',
  report        BYTEA,
  seq           BIGINT NOT NULL DEFAULT 0,
  bytes         BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX attnaudit_jobs_by_seq ON attnaudit_jobs(seq);
CREATE INDEX attnaudit_jobs_by_created ON attnaudit_jobs(created_us, job_id);
CREATE INDEX attnaudit_jobs_by_finished ON attnaudit_jobs(finished_us, job_id);
CREATE INDEX attnaudit_jobs_unfinished ON attnaudit_jobs(replica, created_us)
  WHERE state IN ('QUEUED', 'RUNNING');
CREATE INDEX attnaudit_jobs_unfinished_by_tenant ON attnaudit_jobs(tenant)
  WHERE state IN ('QUEUED', 'RUNNING');
CREATE TABLE attnaudit_counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
INSERT INTO attnaudit_counters(name, value) VALUES('seq', 0);
CREATE TABLE attnaudit_secrets (name TEXT PRIMARY KEY, value BYTEA NOT NULL);
CREATE TABLE attnaudit_payloads (
  job_id      TEXT PRIMARY KEY,
  deadline_us BIGINT NOT NULL,
  payload     BYTEA NOT NULL
);
-- Tensor bytes do not compress: storing them out of line without trying
-- (pglz) makes a W1 payload's insert ten times faster.
ALTER TABLE attnaudit_payloads ALTER COLUMN payload SET STORAGE EXTERNAL;
CREATE TABLE attnaudit_replicas (
  replica      TEXT PRIMARY KEY,
  heartbeat_us BIGINT NOT NULL
);
)sql";

// Version 1 -> 2: every tenant's own numbering of its results (in feed
// order), and its counter.
constexpr const char* kSchemaV2 = R"sql(
ALTER TABLE attnaudit_jobs ADD COLUMN tenant_seq BIGINT NOT NULL DEFAULT 0;
WITH ordered AS (
  SELECT job_id, ROW_NUMBER() OVER (PARTITION BY tenant ORDER BY seq) AS n
  FROM attnaudit_jobs WHERE seq > 0)
UPDATE attnaudit_jobs j SET tenant_seq = o.n FROM ordered o
WHERE o.job_id = j.job_id;
INSERT INTO attnaudit_counters(name, value)
  SELECT 'tseq:' || tenant, MAX(tenant_seq) FROM attnaudit_jobs
  WHERE seq > 0 GROUP BY tenant
  ON CONFLICT(name) DO UPDATE SET value = excluded.value;
CREATE INDEX attnaudit_jobs_by_tenant_seq
  ON attnaudit_jobs(tenant, tenant_seq);
)sql";

// Version 2 -> 3: the train-rollout pairs. A side waits for its
// counterpart with its (request id, position) rows (deleted with it); a
// joined pair keeps its request ids (deleted with it), numbered by a
// counter row like the result feed (commit order, never reused).
constexpr const char* kSchemaV3 = R"sql(
CREATE TABLE attnaudit_pair_sides (
  job_id         TEXT PRIMARY KEY,
  tenant         TEXT NOT NULL,
  run            TEXT NOT NULL,
  layer          BIGINT NOT NULL,
  role           INTEGER NOT NULL,
  step           BIGINT NOT NULL DEFAULT -1,
  weight_version TEXT NOT NULL DEFAULT '',
  snapshot       BYTEA NOT NULL,
  report         BYTEA NOT NULL,
  expires_us     BIGINT NOT NULL,
  put_seq        BIGSERIAL
);
CREATE INDEX attnaudit_pair_sides_by_expires
  ON attnaudit_pair_sides(expires_us);
-- Tensor bytes, as the payloads: out of line, uncompressed.
ALTER TABLE attnaudit_pair_sides ALTER COLUMN snapshot SET STORAGE EXTERNAL;
CREATE TABLE attnaudit_pair_side_rows (
  job_id     TEXT NOT NULL
             REFERENCES attnaudit_pair_sides(job_id) ON DELETE CASCADE,
  request_id TEXT NOT NULL,
  position   BIGINT NOT NULL,
  tenant     TEXT NOT NULL,
  run        TEXT NOT NULL,
  layer      BIGINT NOT NULL,
  role       INTEGER NOT NULL
);
CREATE UNIQUE INDEX attnaudit_pair_side_rows_by_job
  ON attnaudit_pair_side_rows(job_id, request_id, position);
CREATE INDEX attnaudit_pair_side_rows_by_row
  ON attnaudit_pair_side_rows(tenant, run, layer, request_id, position);
CREATE TABLE attnaudit_pairs (
  seq                    BIGINT PRIMARY KEY,
  tenant                 TEXT NOT NULL,
  run                    TEXT NOT NULL,
  layer                  BIGINT NOT NULL,
  rollout_job            TEXT NOT NULL,
  trainer_job            TEXT NOT NULL,
  rollout_step           BIGINT NOT NULL,
  trainer_step           BIGINT NOT NULL,
  rollout_weight_version TEXT NOT NULL,
  trainer_weight_version TEXT NOT NULL,
  verdict                INTEGER NOT NULL,
  report                 BYTEA,
  replica                TEXT NOT NULL,
  joined_us              BIGINT NOT NULL
);
CREATE UNIQUE INDEX attnaudit_pairs_by_jobs
  ON attnaudit_pairs(rollout_job, trainer_job);
CREATE INDEX attnaudit_pairs_by_joined ON attnaudit_pairs(joined_us, seq);
CREATE TABLE attnaudit_pair_request_ids (
  seq        BIGINT NOT NULL REFERENCES attnaudit_pairs(seq) ON DELETE CASCADE,
  request_id TEXT NOT NULL
);
CREATE UNIQUE INDEX attnaudit_pair_request_ids_by_seq
  ON attnaudit_pair_request_ids(seq, request_id);
CREATE INDEX attnaudit_pair_request_ids_by_id
  ON attnaudit_pair_request_ids(request_id);
INSERT INTO attnaudit_counters(name, value) VALUES('pair_seq', 0);
)sql";

// The advisory locks of tenants' admissions: (kTenantLockClass,
// hashtext(tenant)), a space apart from the migration's one-key lock.
constexpr int kTenantLockClass = 0x6174;
// The advisory locks that serialise pair sides: (kPairLockClass,
// hashtext(PairGroup(...))), one per tenant, run and layer (a collision
// only serialises two groups more than needed).
constexpr int kPairLockClass = 0x7061;

// The lock key of a tenant, run and layer: each part length-prefixed, so
// no two groups spell the same key.
std::string PairGroup(const PairSide& side) {
  return absl::StrCat(side.tenant.size(), ":", side.tenant, side.run.size(),
                      ":", side.run, side.layer);
}

// A PostgreSQL array literal of texts ({"a","b\"c"}) for a $n::text[].
std::string TextArray(const std::vector<std::string>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.push_back('"');
    for (const char c : values[i]) {
      if (c == '"' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
    out.push_back('"');
  }
  out.push_back('}');
  return out;
}

std::string IntArray(const std::vector<int64_t>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out.push_back(',');
    absl::StrAppend(&out, values[i]);
  }
  out.push_back('}');
  return out;
}

// The database's clock in microseconds: leases compare heartbeats written
// by different machines, so one clock decides.
constexpr const char* kDbNowUs =
    "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT";

// "08xxx" connection exceptions, admin shutdowns and "cannot connect now"
// mean the database is away, not that the statement was wrong.
bool IsUnavailable(const char* sqlstate) {
  if (sqlstate == nullptr) return true;
  const absl::string_view s(sqlstate);
  return absl::StartsWith(s, "08") || absl::StartsWith(s, "57P") ||
         s == "53300";  // too many connections
}

}  // namespace

class PostgresJobStore::Rows {
 public:
  explicit Rows(PGresult* r) : r_(r) {}
  Rows(Rows&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  Rows& operator=(Rows&&) = delete;
  ~Rows() { PQclear(r_); }

  PGresult* get() const { return r_; }

  int rows() const { return PQntuples(r_); }
  std::string Text(int row, int col) const {
    return std::string(PQgetvalue(r_, row, col), PQgetlength(r_, row, col));
  }
  int64_t Int(int row, int col) const {
    int64_t v = 0;
    return absl::SimpleAtoi(Text(row, col), &v) ? v : 0;
  }
  std::string Bytes(int row, int col) const {
    if (PQgetisnull(r_, row, col)) return "";
    size_t n = 0;
    unsigned char* raw = PQunescapeBytea(
        reinterpret_cast<const unsigned char*>(PQgetvalue(r_, row, col)), &n);
    if (raw == nullptr) return "";
    std::string out(reinterpret_cast<const char*>(raw), n);
    PQfreemem(raw);
    return out;
  }
  // A column of a binary-format result, as it came.
  std::string Raw(int row, int col) const {
    return std::string(PQgetvalue(r_, row, col), PQgetlength(r_, row, col));
  }
  int64_t changed() const {
    int64_t v = 0;
    return absl::SimpleAtoi(PQcmdTuples(r_), &v) ? v : 0;
  }

 private:
  PGresult* r_;
};

namespace {

class ResultRow final : public store_internal::RowReader {
 public:
  ResultRow(const PostgresJobStore::Rows& rows, int row)
      : rows_(rows), row_(row) {}
  std::string Text(int col) const override { return rows_.Text(row_, col); }
  int64_t Int(int col) const override { return rows_.Int(row_, col); }

 private:
  const PostgresJobStore::Rows& rows_;
  const int row_;
};

PostgresJobStore::Param Text(absl::string_view v) {
  return {std::string(v), false};
}
PostgresJobStore::Param Int(int64_t v) { return {absl::StrCat(v), false}; }
PostgresJobStore::Param Bytes(absl::string_view v) {
  return {std::string(v), true};
}

}  // namespace

PostgresJobStore::PostgresJobStore(std::string url, const StoreOptions& options)
    : url_(std::move(url)),
      redacted_url_(RedactStoreUrl(url_)),
      options_(options) {}

PostgresJobStore::~PostgresJobStore() {
  {
    absl::MutexLock lock(&beat_mu_);
    if (beat_.conn != nullptr) PQfinish(beat_.conn);
  }
  absl::MutexLock lock(&pool_mu_);
  for (const std::unique_ptr<Session>& session : idle_) {
    if (session->conn != nullptr) PQfinish(session->conn);
  }
}

PostgresJobStore::Lease::~Lease() {
  if (session_ != nullptr) store_->Release(std::move(session_));
}

PostgresJobStore::Lease PostgresJobStore::Acquire() {
  absl::MutexLock lock(&pool_mu_);
  auto available = [this]() ABSL_SHARED_LOCKS_REQUIRED(pool_mu_) {
    return !idle_.empty() || sessions_ < kMaxSessions;
  };
  pool_mu_.Await(absl::Condition(&available));
  if (idle_.empty()) {
    ++sessions_;
    return Lease(this, std::make_unique<Session>());
  }
  std::unique_ptr<Session> session = std::move(idle_.back());
  idle_.pop_back();
  return Lease(this, std::move(session));
}

void PostgresJobStore::Release(std::unique_ptr<Session> session) {
  absl::MutexLock lock(&pool_mu_);
  idle_.push_back(std::move(session));
}

absl::StatusOr<std::unique_ptr<PostgresJobStore>> PostgresJobStore::Open(
    const std::string& url, const StoreOptions& options) {
  std::unique_ptr<PostgresJobStore> store(new PostgresJobStore(url, options));
  {
    Lease lease = store->Acquire();
    ATTNAUDIT_RETURN_IF_ERROR(store->Connect(*lease));
    ATTNAUDIT_RETURN_IF_ERROR(store->Migrate(*lease));
  }
  return store;
}

absl::Status PostgresJobStore::Connect(Session& db) {
  if (db.conn != nullptr && PQstatus(db.conn) == CONNECTION_OK) {
    return absl::OkStatus();
  }
  if (db.conn != nullptr) PQfinish(db.conn);
  const std::string timeout = absl::StrCat(
      std::max<int64_t>(1, absl::ToInt64Seconds(options_.busy_timeout)));
  // Ours first: the URL's own settings, expanded from "dbname", win.
  const char* keys[] = {"connect_timeout", "application_name", "dbname",
                        nullptr};
  const char* values[] = {timeout.c_str(), "attnaudit-server", url_.c_str(),
                          nullptr};
  db.conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (db.conn == nullptr || PQstatus(db.conn) != CONNECTION_OK) {
    std::string why =
        db.conn != nullptr ? PQerrorMessage(db.conn) : "no memory";
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) {
      why.pop_back();
    }
    if (db.conn != nullptr) PQfinish(db.conn);
    db.conn = nullptr;
    return absl::UnavailableError(
        absl::StrCat("result store ", redacted_url_, " unreachable: ", why));
  }
  // NOTICEs ("relation already exists, skipping") are not errors; libpq
  // would print them on stderr.
  PQsetNoticeProcessor(
      db.conn, [](void*, const char*) {}, nullptr);
  const std::string lock_timeout = absl::StrCat(
      "SET lock_timeout = ", absl::ToInt64Milliseconds(options_.busy_timeout));
  return Run(db, lock_timeout, {}).status();
}

absl::StatusOr<PostgresJobStore::Rows> PostgresJobStore::Run(
    Session& db, const std::string& sql, const std::vector<Param>& params,
    bool binary_results) {
  ATTNAUDIT_RETURN_IF_ERROR(Connect(db));
  std::vector<const char*> values;
  std::vector<int> lengths;
  std::vector<int> formats;
  for (const Param& p : params) {
    values.push_back(p.value.data());
    lengths.push_back(static_cast<int>(p.value.size()));
    formats.push_back(p.binary ? 1 : 0);
  }
  // Without parameters PQexec, which also runs a script of several
  // statements (the schema).
  Rows r(params.empty() ? PQexec(db.conn, sql.c_str())
                        : PQexecParams(db.conn, sql.c_str(),
                                       static_cast<int>(params.size()), nullptr,
                                       values.data(), lengths.data(),
                                       formats.data(), binary_results ? 1 : 0));
  const ExecStatusType st = PQresultStatus(r.get());
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
  const char* sqlstate = r.get() != nullptr
                             ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE)
                             : nullptr;
  std::string why = r.get() != nullptr ? PQresultErrorMessage(r.get())
                                       : PQerrorMessage(db.conn);
  while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) {
    why.pop_back();
  }
  if (PQstatus(db.conn) != CONNECTION_OK || IsUnavailable(sqlstate)) {
    PQfinish(db.conn);
    db.conn = nullptr;  // the next call reconnects
    return absl::UnavailableError(
        absl::StrCat("result store ", redacted_url_, " unavailable: ", why));
  }
  return absl::InternalError(absl::StrCat("result store: ", why));
}

template <typename Body>
absl::Status PostgresJobStore::InTransaction(Session& db, Body body) {
  ATTNAUDIT_RETURN_IF_ERROR(Run(db, "BEGIN", {}).status());
  absl::Status s = body();
  if (!s.ok()) {
    if (db.conn != nullptr) Run(db, "ROLLBACK", {}).IgnoreError();
    return s;
  }
  return Run(db, "COMMIT", {}).status();
}

absl::Status PostgresJobStore::Migrate(Session& db) {
  return InTransaction(db, [&]() -> absl::Status {
    ATTNAUDIT_RETURN_IF_ERROR(
        Run(db, "SELECT pg_advisory_xact_lock($1)", {Int(kMigrationLock)})
            .status());
    ATTNAUDIT_RETURN_IF_ERROR(Run(db,
                                  "CREATE TABLE IF NOT EXISTS attnaudit_schema "
                                  "(version INTEGER NOT NULL)",
                                  {})
                                  .status());
    ATTNAUDIT_ASSIGN_OR_RETURN(
        Rows v, Run(db, "SELECT MAX(version) FROM attnaudit_schema", {}));
    const int64_t version = v.rows() > 0 ? v.Int(0, 0) : 0;
    if (version > kPostgresSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "result store ", redacted_url_, ": schema version ", version,
          " is newer than this server (", kPostgresSchemaVersion,
          "); run a newer attnaudit-server"));
    }
    if (version < 1) ATTNAUDIT_RETURN_IF_ERROR(Run(db, kSchemaV1, {}).status());
    if (version < 2) ATTNAUDIT_RETURN_IF_ERROR(Run(db, kSchemaV2, {}).status());
    if (version < 3) ATTNAUDIT_RETURN_IF_ERROR(Run(db, kSchemaV3, {}).status());
    if (version == kPostgresSchemaVersion) return absl::OkStatus();
    ATTNAUDIT_RETURN_IF_ERROR(
        Run(db, "DELETE FROM attnaudit_schema", {}).status());
    return Run(db, "INSERT INTO attnaudit_schema(version) VALUES($1)",
               {Int(kPostgresSchemaVersion)})
        .status();
  });
}

absl::StatusOr<std::vector<ResultRecord>> PostgresJobStore::Records(
    Session& db, const std::string& sql, const std::vector<Param>& params,
    bool with_report) {
  ATTNAUDIT_ASSIGN_OR_RETURN(Rows rows, Run(db, sql, params));
  std::vector<ResultRecord> out;
  out.reserve(rows.rows());
  for (int i = 0; i < rows.rows(); ++i) {
    out.push_back(store_internal::RecordFromColumns(ResultRow(rows, i)));
    if (with_report) {
      out.back().report = rows.Bytes(i, store_internal::kNumRecordColumns);
    }
  }
  return out;
}

absl::StatusOr<int64_t> PostgresJobStore::Change(
    Session& db, const std::string& sql, const std::vector<Param>& params) {
  ATTNAUDIT_ASSIGN_OR_RETURN(Rows rows, Run(db, sql, params));
  return rows.changed();
}

absl::StatusOr<bool> PostgresJobStore::RecordQueued(const ResultRecord& r) {
  if (r.job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  Lease lease = Acquire();
  Session& db = *lease;
  return RecordQueuedOn(db, r);
}

absl::StatusOr<bool> PostgresJobStore::RecordQueuedWithPayload(
    const ResultRecord& r, absl::Time deadline, absl::string_view payload) {
  if (r.job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  Lease lease = Acquire();
  Session& db = *lease;
  bool created = false;
  absl::Status s = InTransaction(db, [&]() -> absl::Status {
    ATTNAUDIT_ASSIGN_OR_RETURN(created, RecordQueuedOn(db, r));
    if (!created) return absl::OkStatus();
    return Run(db,
               "INSERT INTO attnaudit_payloads(job_id, deadline_us, payload) "
               "VALUES($1, $2, $3) ON CONFLICT(job_id) DO NOTHING",
               {Text(r.job_id), Int(Micros(deadline)), Bytes(payload)})
        .status();
  });
  if (!s.ok()) return s;
  return created;
}

absl::StatusOr<bool> PostgresJobStore::RecordQueuedOn(Session& db,
                                                      const ResultRecord& r) {
  ATTNAUDIT_ASSIGN_OR_RETURN(
      int64_t n,
      Change(
          db,
          "INSERT INTO attnaudit_jobs(job_id, state, priority, model, layer, "
          "engine, created_us, tenant, backend, step, run, replica, bytes) "
          "VALUES($1, 'QUEUED', $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, "
          "$12) ON CONFLICT(job_id) DO NOTHING",
          {Text(r.job_id), Int(r.priority), Text(r.model), Int(r.layer),
           Text(r.engine), Int(Micros(r.created)), Text(r.tenant),
           Text(r.backend), Int(r.step), Text(r.run), Text(r.replica),
           Int(r.bytes)}));
  return n == 1;
}

absl::Status PostgresJobStore::AdmitOn(Session& db, const AdmittedJob& job,
                                       const Admit& admit, bool* created) {
  const ResultRecord& r = job.record;
  // First: a concurrent admission of the same job waits here until this
  // one's decision, and then finds its row (or creates its own).
  ATTNAUDIT_RETURN_IF_ERROR(
      Run(db,
          "INSERT INTO attnaudit_payloads(job_id, deadline_us, payload) "
          "VALUES($1, $2, $3) ON CONFLICT(job_id) DO NOTHING",
          {Text(r.job_id), Int(Micros(job.deadline)), Bytes(job.payload)})
          .status());
  TenantUsage elsewhere;
  if (job.count_tenant) {
    // Held until COMMIT: the tenant's next admission, on any replica,
    // counts this one's row.
    ATTNAUDIT_RETURN_IF_ERROR(
        Run(db, "SELECT pg_advisory_xact_lock($1::int4, hashtext($2::text))",
            {Int(kTenantLockClass), Text(r.tenant)})
            .status());
    ATTNAUDIT_ASSIGN_OR_RETURN(
        Rows rows,
        Run(db,
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM attnaudit_jobs "
            "WHERE tenant = $1 AND replica <> $2 "
            "AND state IN ('QUEUED', 'RUNNING')",
            {Text(r.tenant), Text(r.replica)}));
    if (rows.rows() == 1) {
      elsewhere.jobs = rows.Int(0, 0);
      elsewhere.bytes = rows.Int(0, 1);
    }
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(*created, RecordQueuedOn(db, r));
  // A row already there: roll back (the payload insert too).
  if (!*created) return absl::AlreadyExistsError("known job");
  return admit(elsewhere);
}

absl::StatusOr<bool> PostgresJobStore::RecordAdmitted(const AdmittedJob& job,
                                                      const Admit& admit) {
  if (job.record.job_id.empty()) {
    return absl::InvalidArgumentError("job_id: empty");
  }
  Lease lease = Acquire();
  Session& db = *lease;
  bool created = false;
  absl::Status s = InTransaction(
      db, [&]() -> absl::Status { return AdmitOn(db, job, admit, &created); });
  if (!created && s.code() == absl::StatusCode::kAlreadyExists) return false;
  if (!s.ok()) return s;
  return true;
}

absl::StatusOr<bool> PostgresJobStore::MarkRunning(absl::string_view job_id,
                                                   absl::Time started) {
  Lease lease = Acquire();
  Session& db = *lease;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      int64_t n,
      Change(db,
             "UPDATE attnaudit_jobs SET state = 'RUNNING', "
             "started_us = $2 WHERE job_id = $1 AND state = 'QUEUED'",
             {Text(job_id), Int(Micros(started))}));
  return n == 1;
}

absl::StatusOr<bool> PostgresJobStore::PutResultOn(Session& db,
                                                   const ResultRecord& r) {
  // The counter row stays locked until COMMIT: seq order is commit order.
  ATTNAUDIT_RETURN_IF_ERROR(Run(db, "SAVEPOINT put", {}).status());
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows next, Run(db,
                     "UPDATE attnaudit_counters SET value = value + 1 "
                     "WHERE name = 'seq' RETURNING value",
                     {}));
  if (next.rows() != 1) return absl::InternalError("result store: no seq");
  // Numbered among the results of the row's own tenant (an update keeps
  // the row's tenant).
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows tenant_next,
      Run(db,
          "INSERT INTO attnaudit_counters AS c(name, value) VALUES('tseq:' "
          "|| COALESCE((SELECT tenant FROM attnaudit_jobs WHERE job_id = "
          "$1), $2::text), 1) ON CONFLICT(name) DO UPDATE SET value = "
          "c.value + 1 "
          "RETURNING value",
          {Text(r.job_id), Text(r.tenant)}));
  if (tenant_next.rows() != 1) {
    return absl::InternalError("result store: no tenant seq");
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(
      int64_t n,
      Change(db,
             "INSERT INTO attnaudit_jobs AS j(job_id, state, verdict, "
             "priority, model, layer, engine, created_us, started_us, "
             "finished_us, error_code, error_message, report, tenant, backend, "
             "step, run, diagnosis, replica, seq, tenant_seq) VALUES($1, $2, "
             "$3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, "
             "$17, $18, $19, $20, $21) ON CONFLICT(job_id) DO UPDATE SET "
             "state = excluded.state, verdict = excluded.verdict, "
             "model = excluded.model, layer = excluded.layer, "
             "engine = excluded.engine, backend = excluded.backend, "
             "step = excluded.step, run = excluded.run, "
             "diagnosis = excluded.diagnosis, "
             "started_us = CASE WHEN j.started_us = 0 THEN excluded.started_us "
             "ELSE j.started_us END, finished_us = excluded.finished_us, "
             "error_code = excluded.error_code, "
             "error_message = excluded.error_message, "
             "report = excluded.report, seq = excluded.seq, "
             "tenant_seq = excluded.tenant_seq "
             "WHERE j.state IN ('QUEUED', 'RUNNING')",
             {Text(r.job_id),
              Text(JobStateName(r.state)),
              Int(r.verdict),
              Int(r.priority),
              Text(r.model),
              Int(r.layer),
              Text(r.engine),
              Int(Micros(r.created)),
              Int(Micros(r.started)),
              Int(Micros(r.finished)),
              Int(r.error_code),
              Text(r.error_message),
              Bytes(r.report),
              Text(r.tenant),
              Text(r.backend),
              Int(r.step),
              Text(r.run),
              Text(r.diagnosis),
              Text(r.replica),
              Int(next.Int(0, 0)),
              Int(tenant_next.Int(0, 0))}));
  if (n != 1) {
    // Terminal already: nothing changes, and the numbers go back.
    ATTNAUDIT_RETURN_IF_ERROR(
        Run(db, "ROLLBACK TO SAVEPOINT put", {}).status());
    return false;
  }
  // The payload was kept for a hand-off; a finished job needs none.
  ATTNAUDIT_RETURN_IF_ERROR(
      Run(db, "DELETE FROM attnaudit_payloads WHERE job_id = $1",
          {Text(r.job_id)})
          .status());
  ATTNAUDIT_RETURN_IF_ERROR(Run(db, "RELEASE SAVEPOINT put", {}).status());
  return true;
}

absl::StatusOr<bool> PostgresJobStore::PutResult(const ResultRecord& r) {
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<bool> stored, PutResults({r}));
  return stored.front();
}

absl::StatusOr<std::vector<bool>> PostgresJobStore::PutResults(
    const std::vector<ResultRecord>& records) {
  for (const ResultRecord& r : records) {
    ATTNAUDIT_RETURN_IF_ERROR(store_internal::CheckTerminal(r));
  }
  Lease lease = Acquire();
  Session& db = *lease;
  std::vector<bool> stored;
  ATTNAUDIT_RETURN_IF_ERROR(InTransaction(db, [&]() -> absl::Status {
    for (const ResultRecord& r : records) {
      ATTNAUDIT_ASSIGN_OR_RETURN(const bool one, PutResultOn(db, r));
      stored.push_back(one);
    }
    return absl::OkStatus();
  }));
  return stored;
}

absl::StatusOr<ResultRecord> PostgresJobStore::Get(absl::string_view job_id) {
  Lease lease = Acquire();
  Session& db = *lease;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      std::vector<ResultRecord> rows,
      Records(db,
              absl::StrCat("SELECT ", kRecordColumns,
                           ", report FROM attnaudit_jobs "
                           "WHERE job_id = $1"),
              {Text(job_id)}, /*with_report=*/true));
  if (rows.empty()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  }
  return std::move(rows.front());
}

absl::StatusOr<std::vector<ResultRecord>> PostgresJobStore::Query(
    const ResultQuery& q) {
  ATTNAUDIT_ASSIGN_OR_RETURN(store_internal::QuerySql where,
                             store_internal::BuildQuerySql(q, '$'));
  std::vector<Param> params;
  for (const store_internal::SqlParam& p : where.params) {
    params.push_back(p.is_int ? Int(p.i) : Text(p.s));
  }
  Lease lease = Acquire();
  Session& db = *lease;
  return Records(db,
                 absl::StrCat("SELECT ", kRecordColumns,
                              q.include_report ? ", report" : "",
                              " FROM attnaudit_jobs", where.tail),
                 params, q.include_report);
}

absl::StatusOr<std::vector<ResultRecord>> PostgresJobStore::ResultsAfter(
    int64_t after_seq, int limit) {
  if (limit < 1 || limit > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, 10000], got ", limit));
  }
  Lease lease = Acquire();
  Session& db = *lease;
  return Records(db,
                 absl::StrCat("SELECT ", kRecordColumns,
                              ", report FROM attnaudit_jobs WHERE seq > $1 "
                              "ORDER BY seq LIMIT $2"),
                 {Int(after_seq), Int(limit)}, /*with_report=*/true);
}

absl::StatusOr<int64_t> PostgresJobStore::LastSeq() {
  Lease lease = Acquire();
  Session& db = *lease;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows rows,
      Run(db, "SELECT value FROM attnaudit_counters WHERE name = 'seq'", {}));
  return rows.rows() > 0 ? rows.Int(0, 0) : 0;
}

absl::StatusOr<std::vector<ResultRecord>> PostgresJobStore::TenantResultsAfter(
    absl::string_view tenant, int64_t after, int limit) {
  if (limit < 1 || limit > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, 10000], got ", limit));
  }
  Lease lease = Acquire();
  Session& db = *lease;
  return Records(db,
                 absl::StrCat("SELECT ", kRecordColumns,
                              ", report FROM attnaudit_jobs WHERE tenant = $1 "
                              "AND tenant_seq > $2 ORDER BY tenant_seq "
                              "LIMIT $3"),
                 {Text(tenant), Int(after), Int(limit)}, /*with_report=*/true);
}

absl::StatusOr<int64_t> PostgresJobStore::LastTenantSeq(
    absl::string_view tenant) {
  Lease lease = Acquire();
  Session& db = *lease;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows rows,
      Run(db,
          "SELECT value FROM attnaudit_counters WHERE name = 'tseq:' "
          "|| $1::text",
          {Text(tenant)}));
  return rows.rows() > 0 ? rows.Int(0, 0) : 0;
}

absl::StatusOr<std::vector<std::string>> PostgresJobStore::Unfinished(
    absl::string_view replica) {
  Lease lease = Acquire();
  Session& db = *lease;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows rows,
      Run(db,
          "SELECT job_id FROM attnaudit_jobs "
          "WHERE state IN ('QUEUED', 'RUNNING') "
          "AND ($1 = '' OR replica = $1) ORDER BY created_us, job_id",
          {Text(replica)}));
  std::vector<std::string> out;
  for (int i = 0; i < rows.rows(); ++i) out.push_back(rows.Text(i, 0));
  return out;
}

absl::StatusOr<int64_t> PostgresJobStore::Prune(absl::Time now) {
  Lease lease = Acquire();
  Session& db = *lease;
  int64_t deleted = 0;
  ATTNAUDIT_RETURN_IF_ERROR(InTransaction(db, [&]() -> absl::Status {
    if (options_.max_age != absl::InfiniteDuration()) {
      ATTNAUDIT_ASSIGN_OR_RETURN(
          int64_t n,
          Change(db,
                 absl::StrCat("DELETE FROM attnaudit_jobs WHERE state "
                              "IN ",
                              kTerminalStates, " AND finished_us < $1"),
                 {Int(Micros(now - options_.max_age))}));
      deleted += n;
    }
    if (options_.max_results > 0) {
      ATTNAUDIT_ASSIGN_OR_RETURN(
          int64_t n,
          Change(
              db,
              absl::StrCat("DELETE FROM attnaudit_jobs WHERE job_id IN "
                           "(SELECT job_id FROM attnaudit_jobs WHERE state IN ",
                           kTerminalStates,
                           " ORDER BY finished_us DESC, job_id DESC "
                           "OFFSET $1)"),
              {Int(options_.max_results)}));
      deleted += n;
    }
    ATTNAUDIT_ASSIGN_OR_RETURN(const int64_t pairs, PrunePairsOn(db, now));
    deleted += pairs;
    return absl::OkStatus();
  }));
  return deleted;
}

absl::StatusOr<int64_t> PostgresJobStore::PrunePairsOn(Session& db,
                                                       absl::Time now) {
  // Sides expired at `now` (their rows go with them: ON DELETE CASCADE).
  ATTNAUDIT_ASSIGN_OR_RETURN(
      int64_t deleted,
      Change(db, "DELETE FROM attnaudit_pair_sides WHERE expires_us <= $1",
             {Int(Micros(now))}));
  // Pairs by the results' retention (their request ids go with them).
  if (options_.max_age != absl::InfiniteDuration()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        int64_t n,
        Change(db, "DELETE FROM attnaudit_pairs WHERE joined_us < $1",
               {Int(Micros(now - options_.max_age))}));
    deleted += n;
  }
  if (options_.max_results > 0) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        int64_t n,
        Change(db,
               "DELETE FROM attnaudit_pairs WHERE seq IN (SELECT seq FROM "
               "attnaudit_pairs ORDER BY joined_us DESC, seq DESC OFFSET $1)",
               {Int(options_.max_results)}));
    deleted += n;
  }
  return deleted;
}

absl::StatusOr<std::vector<PairSide>> PostgresJobStore::PutPairSideOn(
    Session& db, const PairSide& side, absl::Time now, int limit) {
  // Held until COMMIT: sides of one tenant, run and layer are put one at a
  // time fleet-wide, so of two counterparts the later sees the earlier
  // (each statement below reads what committed before it began).
  ATTNAUDIT_RETURN_IF_ERROR(
      Run(db, "SELECT pg_advisory_xact_lock($1::int4, hashtext($2::text))",
          {Int(kPairLockClass), Text(PairGroup(side))})
          .status());
  // A retry replaces the side (its rows go with it) and counts as put now.
  ATTNAUDIT_RETURN_IF_ERROR(
      Run(db, "DELETE FROM attnaudit_pair_sides WHERE job_id = $1",
          {Text(side.job_id)})
          .status());
  ATTNAUDIT_RETURN_IF_ERROR(
      Run(db,
          "INSERT INTO attnaudit_pair_sides(job_id, tenant, run, layer, role, "
          "step, weight_version, snapshot, report, expires_us) VALUES($1, $2, "
          "$3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT(job_id) DO UPDATE SET "
          "tenant = excluded.tenant, run = excluded.run, "
          "layer = excluded.layer, role = excluded.role, "
          "step = excluded.step, weight_version = excluded.weight_version, "
          "snapshot = excluded.snapshot, report = excluded.report, "
          "expires_us = excluded.expires_us, put_seq = excluded.put_seq",
          {Text(side.job_id), Text(side.tenant), Text(side.run),
           Int(side.layer), Int(side.role), Int(side.step),
           Text(side.weight_version), Bytes(side.snapshot), Bytes(side.report),
           Int(Micros(side.expires))})
          .status());
  std::vector<std::string> request_ids;
  std::vector<int64_t> positions;
  request_ids.reserve(side.rows.size());
  positions.reserve(side.rows.size());
  for (const auto& [request_id, position] : side.rows) {
    request_ids.push_back(request_id);
    positions.push_back(position);
  }
  // All rows in one statement (a row named twice is kept once).
  ATTNAUDIT_RETURN_IF_ERROR(
      Run(db,
          "INSERT INTO attnaudit_pair_side_rows(job_id, request_id, position, "
          "tenant, run, layer, role) SELECT $1::text, u.r, u.p, $2::text, "
          "$3::text, $4::bigint, $5::integer FROM unnest($6::text[], "
          "$7::bigint[]) AS u(r, p) ON CONFLICT DO NOTHING",
          {Text(side.job_id), Text(side.tenant), Text(side.run),
           Int(side.layer), Int(side.role), Text(TextArray(request_ids)),
           Text(IntArray(positions))})
          .status());
  // The other role's sides sharing a row, alive at `now`, in the order
  // they were put. In binary (the snapshots once, not as hex text): the
  // numbers as text.
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows rows,
      Run(db,
          "SELECT job_id, tenant, run, layer::text, role::text, step::text, "
          "weight_version, expires_us::text, snapshot, report "
          "FROM attnaudit_pair_sides WHERE job_id IN (SELECT o.job_id FROM "
          "attnaudit_pair_side_rows m JOIN attnaudit_pair_side_rows o "
          "ON o.tenant = m.tenant AND o.run = m.run AND o.layer = m.layer "
          "AND o.request_id = m.request_id AND o.position = m.position "
          "WHERE m.job_id = $1 AND o.role <> m.role) "
          "AND expires_us > $2 ORDER BY put_seq LIMIT $3",
          {Text(side.job_id), Int(Micros(now)), Int(limit)},
          /*binary_results=*/true));
  std::vector<PairSide> found;
  found.reserve(rows.rows());
  for (int i = 0; i < rows.rows(); ++i) {
    PairSide s;
    s.job_id = rows.Raw(i, 0);
    s.tenant = rows.Raw(i, 1);
    s.run = rows.Raw(i, 2);
    s.layer = rows.Int(i, 3);
    s.role = static_cast<int>(rows.Int(i, 4));
    s.step = rows.Int(i, 5);
    s.weight_version = rows.Raw(i, 6);
    s.expires = store_internal::FromMicros(rows.Int(i, 7));
    s.snapshot = rows.Raw(i, 8);
    s.report = rows.Raw(i, 9);
    found.push_back(std::move(s));
  }
  return found;
}

absl::StatusOr<std::vector<PairSide>> PostgresJobStore::PutPairSide(
    const PairSide& side, absl::Time now, int limit) {
  ATTNAUDIT_RETURN_IF_ERROR(store_internal::CheckPairSide(side, limit));
  Lease lease = Acquire();
  Session& db = *lease;
  std::vector<PairSide> found;
  ATTNAUDIT_RETURN_IF_ERROR(InTransaction(db, [&]() -> absl::Status {
    ATTNAUDIT_ASSIGN_OR_RETURN(found, PutPairSideOn(db, side, now, limit));
    return absl::OkStatus();
  }));
  return found;
}

absl::StatusOr<bool> PostgresJobStore::PutPair(const PairRecord& p) {
  ATTNAUDIT_RETURN_IF_ERROR(store_internal::CheckPair(p));
  Lease lease = Acquire();
  Session& db = *lease;
  bool known = false;
  absl::Status s = InTransaction(db, [&]() -> absl::Status {
    // The counter row stays locked until COMMIT: seq order is commit
    // order, and a pair stored meanwhile by another replica is seen below.
    ATTNAUDIT_ASSIGN_OR_RETURN(
        Rows next, Run(db,
                       "UPDATE attnaudit_counters SET value = value + 1 "
                       "WHERE name = 'pair_seq' RETURNING value",
                       {}));
    if (next.rows() != 1)
      return absl::InternalError("result store: no pair seq");
    const int64_t seq = next.Int(0, 0);
    ATTNAUDIT_ASSIGN_OR_RETURN(
        int64_t n,
        Change(db,
               "INSERT INTO attnaudit_pairs(seq, tenant, run, layer, "
               "rollout_job, trainer_job, rollout_step, trainer_step, "
               "rollout_weight_version, trainer_weight_version, verdict, "
               "report, replica, joined_us) VALUES($1, $2, $3, $4, $5, $6, "
               "$7, $8, $9, $10, $11, $12, $13, $14) "
               "ON CONFLICT(rollout_job, trainer_job) DO NOTHING",
               {Int(seq), Text(p.tenant), Text(p.run), Int(p.layer),
                Text(p.rollout_job), Text(p.trainer_job), Int(p.rollout_step),
                Int(p.trainer_step), Text(p.rollout_weight_version),
                Text(p.trainer_weight_version), Int(p.verdict), Bytes(p.report),
                Text(p.replica), Int(Micros(p.joined))}));
    if (n != 1) {
      // Known: roll back, and the number goes back.
      known = true;
      return absl::AlreadyExistsError("known pair");
    }
    return Run(db,
               "INSERT INTO attnaudit_pair_request_ids(seq, request_id) "
               "SELECT $1::bigint, u.r FROM unnest($2::text[]) AS u(r) "
               "ON CONFLICT DO NOTHING",
               {Int(seq), Text(TextArray(p.request_ids))})
        .status();
  });
  if (known && s.code() == absl::StatusCode::kAlreadyExists) return false;
  if (!s.ok()) return s;
  return true;
}

absl::StatusOr<std::vector<PairRecord>> PostgresJobStore::QueryPairs(
    const PairQuery& q) {
  ATTNAUDIT_ASSIGN_OR_RETURN(
      store_internal::QuerySql where,
      store_internal::BuildPairQuerySql(q, '$', "attnaudit_pair_request_ids"));
  std::vector<Param> params;
  for (const store_internal::SqlParam& p : where.params) {
    params.push_back(p.is_int ? Int(p.i) : Text(p.s));
  }
  Lease lease = Acquire();
  Session& db = *lease;
  std::vector<PairRecord> out;
  // One snapshot for the pairs and their request ids.
  ATTNAUDIT_RETURN_IF_ERROR(InTransaction(db, [&]() -> absl::Status {
    ATTNAUDIT_RETURN_IF_ERROR(
        Run(db, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY", {})
            .status());
    ATTNAUDIT_ASSIGN_OR_RETURN(
        Rows rows, Run(db,
                       absl::StrCat("SELECT ", store_internal::kPairColumns,
                                    q.include_report ? ", report" : "",
                                    " FROM attnaudit_pairs", where.tail),
                       params));
    out.clear();
    std::vector<int64_t> seqs;
    for (int i = 0; i < rows.rows(); ++i) {
      out.push_back(store_internal::PairFromColumns(ResultRow(rows, i)));
      if (q.include_report) {
        out.back().report = rows.Bytes(i, store_internal::kNumPairColumns);
      }
      seqs.push_back(out.back().seq);
    }
    if (seqs.empty()) return absl::OkStatus();
    ATTNAUDIT_ASSIGN_OR_RETURN(
        Rows ids, Run(db,
                      "SELECT seq, request_id FROM attnaudit_pair_request_ids "
                      "WHERE seq = ANY($1::bigint[])",
                      {Text(IntArray(seqs))}));
    absl::flat_hash_map<int64_t, PairRecord*> by_seq;
    for (PairRecord& p : out) by_seq[p.seq] = &p;
    for (int i = 0; i < ids.rows(); ++i) {
      auto it = by_seq.find(ids.Int(i, 0));
      if (it != by_seq.end()) it->second->request_ids.push_back(ids.Text(i, 1));
    }
    // Sorted by bytes, as the SQLite store reads them.
    for (PairRecord& p : out) {
      std::sort(p.request_ids.begin(), p.request_ids.end());
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::string> PostgresJobStore::SharedSecret(
    absl::string_view name, absl::string_view candidate) {
  Lease lease = Acquire();
  Session& db = *lease;
  ATTNAUDIT_RETURN_IF_ERROR(
      Run(db,
          "INSERT INTO attnaudit_secrets(name, value) VALUES($1, $2) "
          "ON CONFLICT(name) DO NOTHING",
          {Text(name), Bytes(candidate)})
          .status());
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows rows, Run(db, "SELECT value FROM attnaudit_secrets WHERE name = $1",
                     {Text(name)}));
  if (rows.rows() != 1) return absl::InternalError("result store: no secret");
  return rows.Bytes(0, 0);
}

absl::Status PostgresJobStore::Heartbeat(absl::string_view replica) {
  absl::MutexLock lock(&beat_mu_);
  return Run(beat_,
             absl::StrCat("INSERT INTO attnaudit_replicas(replica, "
                          "heartbeat_us) VALUES($1, ",
                          kDbNowUs,
                          ") ON CONFLICT(replica) DO UPDATE SET "
                          "heartbeat_us = excluded.heartbeat_us"),
             {Text(replica)})
      .status();
}

absl::StatusOr<ReplicaBeat> PostgresJobStore::ReadHeartbeat(
    absl::string_view replica) {
  absl::MutexLock lock(&beat_mu_);
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows rows,
      Run(beat_,
          absl::StrCat("SELECT heartbeat_us, ", kDbNowUs,
                       " FROM attnaudit_replicas WHERE replica = $1"),
          {Text(replica)}));
  if (rows.rows() != 1) {
    return absl::NotFoundError(
        absl::StrCat("replica ", replica, ": no heartbeat"));
  }
  ReplicaBeat beat;
  beat.written = absl::FromUnixMicros(rows.Int(0, 0));
  beat.now = absl::FromUnixMicros(rows.Int(0, 1));
  return beat;
}

absl::Status PostgresJobStore::Retire(absl::string_view replica) {
  absl::MutexLock lock(&beat_mu_);
  return Run(beat_, "DELETE FROM attnaudit_replicas WHERE replica = $1",
             {Text(replica)})
      .status();
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>>
PostgresJobStore::PickStranded(Session& db, absl::string_view replica,
                               absl::Duration lease, int limit,
                               int64_t max_bytes, bool retired_only) {
  // Locked until COMMIT; another claimer skips them rather than wait. The
  // payloads' sizes come from their headers (octet_length reads no bytes
  // of a value stored out of line).
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows rows,
      Run(db,
          absl::StrCat(
              "SELECT j.job_id, octet_length(p.payload) FROM attnaudit_jobs j "
              "JOIN attnaudit_payloads p ON p.job_id = j.job_id "
              "WHERE j.state IN ('QUEUED', 'RUNNING') AND j.replica <> $1 "
              "AND NOT EXISTS (SELECT 1 FROM attnaudit_replicas r WHERE "
              "r.replica = j.replica AND ($4::boolean OR r.heartbeat_us > ",
              kDbNowUs,
              " - $2)) ORDER BY j.created_us, j.job_id LIMIT $3 "
              "FOR UPDATE OF j SKIP LOCKED"),
          {Text(replica), Int(absl::ToInt64Microseconds(lease)), Int(limit),
           Text(retired_only ? "true" : "false")}));
  std::vector<std::pair<std::string, int64_t>> picked;
  int64_t bytes = 0;
  for (int i = 0; i < rows.rows(); ++i) {
    const int64_t size = rows.Int(i, 1);
    if (!picked.empty() && bytes + size > max_bytes) break;
    bytes += size;
    picked.emplace_back(rows.Text(i, 0), size);
  }
  return picked;
}

absl::StatusOr<std::vector<StoredJob>> PostgresJobStore::ClaimStranded(
    absl::string_view replica, absl::Duration lease, int limit,
    int64_t max_bytes, bool retired_only) {
  if (limit < 1) return std::vector<StoredJob>();
  Lease session = Acquire();
  Session& db = *session;
  std::vector<StoredJob> claimed;
  ATTNAUDIT_RETURN_IF_ERROR(InTransaction(db, [&]() -> absl::Status {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        auto picked,
        PickStranded(db, replica, lease, limit, max_bytes, retired_only));
    for (const auto& [id, size] : picked) {
      ATTNAUDIT_ASSIGN_OR_RETURN(
          std::vector<ResultRecord> rows,
          Records(db,
                  absl::StrCat("UPDATE attnaudit_jobs SET replica = $2, "
                               "state = 'QUEUED', started_us = 0 WHERE "
                               "job_id = $1 RETURNING ",
                               kRecordColumns),
                  {Text(id), Text(replica)}, /*with_report=*/false));
      ATTNAUDIT_ASSIGN_OR_RETURN(
          Rows deadline,
          Run(db,
              "SELECT deadline_us FROM attnaudit_payloads WHERE job_id = $1",
              {Text(id)}));
      if (rows.size() != 1 || deadline.rows() != 1) continue;
      StoredJob job;
      job.record = std::move(rows.front());
      const int64_t deadline_us = deadline.Int(0, 0);
      job.deadline = deadline_us == INT64_MAX
                         ? absl::InfiniteFuture()
                         : absl::FromUnixMicros(deadline_us);
      job.payload_bytes = size;
      claimed.push_back(std::move(job));
    }
    return absl::OkStatus();
  }));
  return claimed;
}

absl::StatusOr<StoredJob> PostgresJobStore::ReadPayload(
    absl::string_view job_id) {
  Lease lease = Acquire();
  Session& db = *lease;
  return ReadStored(db, job_id);
}

absl::StatusOr<StoredJob> PostgresJobStore::ReadStored(
    Session& db, absl::string_view job_id) {
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<ResultRecord> rows,
                             Records(db,
                                     absl::StrCat("SELECT ", kRecordColumns,
                                                  ", NULL FROM attnaudit_jobs "
                                                  "WHERE job_id = $1"),
                                     {Text(job_id)}, /*with_report=*/false));
  ATTNAUDIT_ASSIGN_OR_RETURN(Rows deadline,
                             Run(db,
                                 "SELECT deadline_us FROM attnaudit_payloads "
                                 "WHERE job_id = $1",
                                 {Text(job_id)}));
  // In binary: the bytes once, not as hex text twice their size.
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows payload,
      Run(db, "SELECT payload FROM attnaudit_payloads WHERE job_id = $1",
          {Text(job_id)}, /*binary_results=*/true));
  if (rows.size() != 1 || deadline.rows() != 1 || payload.rows() != 1) {
    return absl::NotFoundError(
        absl::StrCat("job ", job_id, ": no stored payload"));
  }
  StoredJob job;
  job.record = std::move(rows.front());
  const int64_t deadline_us = deadline.Int(0, 0);
  job.deadline = deadline_us == INT64_MAX ? absl::InfiniteFuture()
                                          : absl::FromUnixMicros(deadline_us);
  job.payload = payload.Raw(0, 0);
  job.payload_bytes = static_cast<int64_t>(job.payload.size());
  return job;
}

absl::StatusOr<TenantUsage> PostgresJobStore::OthersUsage(
    absl::string_view tenant, absl::string_view replica) {
  Lease lease = Acquire();
  Session& db = *lease;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      Rows rows,
      Run(db,
          "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM attnaudit_jobs "
          "WHERE tenant = $1 AND replica <> $2 "
          "AND state IN ('QUEUED', 'RUNNING')",
          {Text(tenant), Text(replica)}));
  TenantUsage use;
  if (rows.rows() == 1) {
    use.jobs = rows.Int(0, 0);
    use.bytes = rows.Int(0, 1);
  }
  return use;
}

}  // namespace attnaudit::server
