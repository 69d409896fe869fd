#include "server/store/sqlite_job_store.h"

#include <sqlite3.h>

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "server/store/query_sql.h"
#include "server/store/sqlite_util.h"

namespace attnaudit::server {
namespace {

using store_internal::kRecordColumns;
using store_internal::kTerminalStates;
using store_internal::Micros;
using store_internal::Stmt;

// The current schema, created whole on an empty file (and, IF NOT EXISTS,
// the tables an older file lacks). auto_vacuum must be
// set before the first table exists so that Prune can hand freed pages
// back to the file system.
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS results (
  job_id        TEXT PRIMARY KEY NOT NULL,
  tenant        TEXT NOT NULL DEFAULT 'default',
  state         TEXT NOT NULL,
  verdict       INTEGER NOT NULL DEFAULT 0,
  priority      INTEGER NOT NULL DEFAULT 1,
  model         TEXT NOT NULL DEFAULT '',
  layer         INTEGER NOT NULL DEFAULT -1,
  engine        TEXT NOT NULL DEFAULT '',
  created_us    INTEGER NOT NULL DEFAULT 0,
  started_us    INTEGER NOT NULL DEFAULT 0,
  finished_us   INTEGER NOT NULL DEFAULT 0,
  error_code    INTEGER NOT NULL DEFAULT 0,
  error_message TEXT NOT NULL DEFAULT '',
  report        BLOB,
  backend       TEXT NOT NULL DEFAULT '',
  step          INTEGER NOT NULL DEFAULT -1,
  run           TEXT NOT NULL DEFAULT '',
  diagnosis     TEXT NOT NULL DEFAULT '',
  replica       TEXT NOT NULL DEFAULT '',
  seq           INTEGER NOT NULL DEFAULT 0,
  bytes         INTEGER NOT NULL DEFAULT 0,
  tenant_seq    INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS counters (
  name  TEXT PRIMARY KEY NOT NULL,
  value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS secrets (
  name  TEXT PRIMARY KEY NOT NULL,
  value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS pair_sides (
  job_id         TEXT PRIMARY KEY NOT NULL,
  tenant         TEXT NOT NULL,
  run            TEXT NOT NULL,
  layer          INTEGER NOT NULL,
  role           INTEGER NOT NULL,
  step           INTEGER NOT NULL DEFAULT -1,
  weight_version TEXT NOT NULL DEFAULT '',
  snapshot       BLOB NOT NULL,
  report         BLOB NOT NULL,
  expires_us     INTEGER NOT NULL,
  put_seq        INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS pair_side_rows (
  job_id     TEXT NOT NULL,
  request_id TEXT NOT NULL,
  position   INTEGER NOT NULL,
  tenant     TEXT NOT NULL,
  run        TEXT NOT NULL,
  layer      INTEGER NOT NULL,
  role       INTEGER NOT NULL,
  PRIMARY KEY (job_id, request_id, position)
);
CREATE TABLE IF NOT EXISTS pairs (
  seq                    INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant                 TEXT NOT NULL,
  run                    TEXT NOT NULL,
  layer                  INTEGER NOT NULL,
  rollout_job            TEXT NOT NULL,
  trainer_job            TEXT NOT NULL,
  rollout_step           INTEGER NOT NULL,
  trainer_step           INTEGER NOT NULL,
  rollout_weight_version TEXT NOT NULL,
  trainer_weight_version TEXT NOT NULL,
  verdict                INTEGER NOT NULL,
  report                 BLOB,
  replica                TEXT NOT NULL,
  joined_us              INTEGER NOT NULL,
  UNIQUE (rollout_job, trainer_job)
);
CREATE TABLE IF NOT EXISTS pair_request_ids (
  seq        INTEGER NOT NULL,
  request_id TEXT NOT NULL,
  PRIMARY KEY (seq, request_id)
);
)sql";

constexpr const char* kIndexes = R"sql(
CREATE INDEX IF NOT EXISTS results_by_finished ON results(finished_us, job_id);
CREATE INDEX IF NOT EXISTS results_by_created ON results(created_us, job_id);
CREATE INDEX IF NOT EXISTS results_by_state ON results(state);
CREATE INDEX IF NOT EXISTS results_by_seq ON results(seq);
CREATE INDEX IF NOT EXISTS results_by_tenant_seq
  ON results(tenant, tenant_seq);
CREATE INDEX IF NOT EXISTS pair_side_rows_by_row
  ON pair_side_rows(tenant, run, layer, request_id, position);
CREATE INDEX IF NOT EXISTS pair_sides_by_expires ON pair_sides(expires_us);
CREATE INDEX IF NOT EXISTS pair_sides_by_put ON pair_sides(put_seq);
CREATE INDEX IF NOT EXISTS pairs_by_joined ON pairs(joined_us, seq);
CREATE INDEX IF NOT EXISTS pair_request_ids_by_id
  ON pair_request_ids(request_id);
)sql";

// The counter of a tenant's own numbering (tenant_seq).
std::string TenantCounter(absl::string_view tenant) {
  return absl::StrCat("tseq:", tenant);
}

// Version 1 had no tenant: its rows belonged to the one token holder, now
// tenant "default".
constexpr const char* kMigrateV1 =
    "ALTER TABLE results ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'";

// Version 2 -> 3: the query labels, the replica and the result feed's seq,
// numbered for existing results in the order they finished.
constexpr const char* kMigrateV2 = R"sql(
ALTER TABLE results ADD COLUMN backend TEXT NOT NULL DEFAULT '';
ALTER TABLE results ADD COLUMN step INTEGER NOT NULL DEFAULT -1;
ALTER TABLE results ADD COLUMN run TEXT NOT NULL DEFAULT '';
ALTER TABLE results ADD COLUMN diagnosis TEXT NOT NULL DEFAULT '';
ALTER TABLE results ADD COLUMN replica TEXT NOT NULL DEFAULT '';
ALTER TABLE results ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
WITH ordered AS (
  SELECT job_id, ROW_NUMBER() OVER (ORDER BY finished_us, job_id) AS n
  FROM results WHERE state IN ('DONE','FAILED','CANCELLED'))
UPDATE results SET seq = (SELECT n FROM ordered
                          WHERE ordered.job_id = results.job_id)
WHERE state IN ('DONE','FAILED','CANCELLED');
INSERT INTO counters(name, value)
  SELECT 'seq', COALESCE(MAX(seq), 0) FROM results;
)sql";

// Version 3 -> 4: every tenant's own numbering of its results (in feed
// order), and its counter.
constexpr const char* kMigrateV3 = R"sql(
ALTER TABLE results ADD COLUMN tenant_seq INTEGER NOT NULL DEFAULT 0;
WITH ordered AS (
  SELECT job_id, ROW_NUMBER() OVER (PARTITION BY tenant ORDER BY seq) AS n
  FROM results WHERE seq > 0)
UPDATE results SET tenant_seq = (SELECT n FROM ordered
                                 WHERE ordered.job_id = results.job_id)
WHERE seq > 0;
INSERT OR REPLACE INTO counters(name, value)
  SELECT 'tseq:' || tenant, MAX(tenant_seq) FROM results WHERE seq > 0
  GROUP BY tenant;
)sql";

class StmtRow final : public store_internal::RowReader {
 public:
  explicit StmtRow(const Stmt& st) : st_(st) {}
  std::string Text(int col) const override { return st_.Text(col); }
  int64_t Int(int col) const override { return st_.Int(col); }

 private:
  const Stmt& st_;
};

// Every row `st` yields; the report is the column after kRecordColumns.
absl::StatusOr<std::vector<ResultRecord>> ReadRows(Stmt& st, bool with_report) {
  std::vector<ResultRecord> out;
  while (true) {
    absl::StatusOr<bool> row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) return out;
    out.push_back(store_internal::RecordFromColumns(StmtRow(st)));
    if (with_report) {
      out.back().report = st.Blob(store_internal::kNumRecordColumns);
    }
  }
}

}  // namespace

SqliteJobStore::SqliteJobStore(std::string path, const StoreOptions& options,
                               sqlite3* db)
    : path_(std::move(path)), options_(options), db_(db) {}

SqliteJobStore::~SqliteJobStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close_v2(db_);
}

absl::Status SqliteJobStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::InternalError(
        absl::StrCat("results.db: ", err != nullptr ? err : "exec failed"));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

template <typename Body>
absl::Status SqliteJobStore::InTransaction(Body body) {
  ATTNAUDIT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status s = body();
  if (!s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  return Exec("COMMIT");
}

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(
    const std::string& data_dir, const StoreOptions& options) {
  if (data_dir.empty()) return absl::InvalidArgumentError("data_dir: empty");
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat(data_dir, ": create_directories failed: ", ec.message()));
  }
  const std::string path = data_dir + "/results.db";
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = absl::InternalError(
        absl::StrCat(path, ": open failed: ",
                     db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
    sqlite3_close_v2(db);
    return s;
  }
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(path, options, db));
  absl::MutexLock lock(&store->mu_);
  sqlite3_busy_timeout(
      db, static_cast<int>(absl::ToInt64Milliseconds(options.busy_timeout)));
  // Before anything writes page 1; a no-op on an existing database.
  ATTNAUDIT_RETURN_IF_ERROR(store->Exec("PRAGMA auto_vacuum=INCREMENTAL"));
  {
    // journal_mode answers with the mode actually in effect.
    Stmt st(db, "PRAGMA journal_mode=WAL");
    absl::StatusOr<bool> row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row || st.Text(0) != "wal") {
      return absl::InternalError(
          absl::StrCat(path, ": could not enable WAL journal mode"));
    }
  }
  ATTNAUDIT_RETURN_IF_ERROR(store->Exec(
      options.sync ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=OFF"));
  ATTNAUDIT_RETURN_IF_ERROR(store->MigrateLocked());
  return store;
}

absl::Status SqliteJobStore::MigrateLocked() {
  int64_t version = 0;
  {
    Stmt st(db_, "PRAGMA user_version");
    absl::StatusOr<bool> row = st.Step();
    if (!row.ok()) return row.status();
    version = *row ? st.Int(0) : 0;
  }
  if (version > kSqliteSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "results.db: schema version ", version, " is newer than this server (",
        kSqliteSchemaVersion, "); run a newer attnaudit-server"));
  }
  return InTransaction([&]() -> absl::Status {
    if (version == 0) {
      ATTNAUDIT_RETURN_IF_ERROR(Exec(kSchema));
      ATTNAUDIT_RETURN_IF_ERROR(
          Exec("INSERT OR IGNORE INTO counters(name, value) VALUES('seq', 0)"));
    } else {
      // The tables of the current version that older files lack (version
      // 4 -> 5 adds the pair tables, nothing else).
      ATTNAUDIT_RETURN_IF_ERROR(Exec(kSchema));
      if (version == 1) ATTNAUDIT_RETURN_IF_ERROR(Exec(kMigrateV1));
      if (version <= 2) ATTNAUDIT_RETURN_IF_ERROR(Exec(kMigrateV2));
      if (version <= 3) ATTNAUDIT_RETURN_IF_ERROR(Exec(kMigrateV3));
    }
    ATTNAUDIT_RETURN_IF_ERROR(Exec(kIndexes));
    return Exec(
        absl::StrCat("PRAGMA user_version = ", kSqliteSchemaVersion).c_str());
  });
}

absl::StatusOr<bool> SqliteJobStore::InsertQueuedLocked(const ResultRecord& r) {
  Stmt st(db_,
          "INSERT INTO results(job_id, state, priority, model, layer, engine, "
          "created_us, tenant, backend, step, run, replica, bytes) "
          "VALUES(?1, 'QUEUED', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, "
          "?12) "
          "ON CONFLICT(job_id) DO NOTHING");
  st.Bind(1, r.job_id).Bind(2, int64_t{r.priority}).Bind(3, r.model);
  st.Bind(4, r.layer).Bind(5, r.engine).Bind(6, Micros(r.created));
  st.Bind(7, r.tenant).Bind(8, r.backend).Bind(9, r.step).Bind(10, r.run);
  st.Bind(11, r.replica).Bind(12, r.bytes);
  absl::StatusOr<bool> done = st.Step();
  if (!done.ok()) return done.status();
  return sqlite3_changes(db_) == 1;
}

absl::StatusOr<bool> SqliteJobStore::RecordQueued(const ResultRecord& r) {
  if (r.job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  absl::MutexLock lock(&mu_);
  return InsertQueuedLocked(r);
}

absl::StatusOr<bool> SqliteJobStore::RecordAdmitted(const AdmittedJob& job,
                                                    const Admit& admit) {
  if (job.record.job_id.empty()) {
    return absl::InvalidArgumentError("job_id: empty");
  }
  absl::MutexLock lock(&mu_);
  bool created = false;
  absl::Status s = InTransaction([&]() -> absl::Status {
    ATTNAUDIT_ASSIGN_OR_RETURN(created, InsertQueuedLocked(job.record));
    // A row already there: roll back (nothing was written) and say so.
    if (!created) return absl::AlreadyExistsError("known job");
    return admit(TenantUsage());
  });
  if (!created && s.code() == absl::StatusCode::kAlreadyExists) return false;
  if (!s.ok()) return s;
  return true;
}

absl::StatusOr<bool> SqliteJobStore::MarkRunning(absl::string_view job_id,
                                                 absl::Time started) {
  absl::MutexLock lock(&mu_);
  Stmt st(db_,
          "UPDATE results SET state = 'RUNNING', started_us = ?2 "
          "WHERE job_id = ?1 AND state = 'QUEUED'");
  st.Bind(1, job_id).Bind(2, Micros(started));
  absl::StatusOr<bool> done = st.Step();
  if (!done.ok()) return done.status();
  return sqlite3_changes(db_) == 1;
}

absl::StatusOr<int64_t> SqliteJobStore::BumpCounterLocked(
    const std::string& name, int64_t delta) {
  Stmt st(db_,
          "INSERT INTO counters(name, value) VALUES(?1, ?2) "
          "ON CONFLICT(name) DO UPDATE SET value = value + ?2 "
          "RETURNING value");
  st.Bind(1, name).Bind(2, delta);
  absl::StatusOr<bool> row = st.Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::InternalError("results.db: no counter " + name);
  return st.Int(0);
}

absl::StatusOr<std::string> SqliteJobStore::TenantCounterOfLocked(
    const ResultRecord& r) {
  Stmt st(db_, "SELECT tenant FROM results WHERE job_id = ?1");
  st.Bind(1, r.job_id);
  absl::StatusOr<bool> row = st.Step();
  if (!row.ok()) return row.status();
  return TenantCounter(*row ? st.Text(0) : r.tenant);
}

absl::StatusOr<bool> SqliteJobStore::WriteResultLocked(const ResultRecord& r,
                                                       int64_t seq,
                                                       int64_t tenant_seq) {
  Stmt st(db_,
          "INSERT INTO results(job_id, state, verdict, priority, model, "
          "layer, engine, created_us, started_us, finished_us, error_code, "
          "error_message, report, tenant, backend, step, run, diagnosis, "
          "replica, seq, tenant_seq) "
          "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, "
          "?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21) "
          "ON CONFLICT(job_id) DO UPDATE SET state = excluded.state, "
          "verdict = excluded.verdict, model = excluded.model, "
          "layer = excluded.layer, engine = excluded.engine, "
          "backend = excluded.backend, step = excluded.step, "
          "run = excluded.run, diagnosis = excluded.diagnosis, "
          "started_us = CASE WHEN results.started_us = 0 "
          "THEN excluded.started_us ELSE results.started_us END, "
          "finished_us = excluded.finished_us, "
          "error_code = excluded.error_code, "
          "error_message = excluded.error_message, "
          "report = excluded.report, seq = excluded.seq, "
          "tenant_seq = excluded.tenant_seq "
          "WHERE results.state IN ('QUEUED', 'RUNNING')");
  st.Bind(1, r.job_id).Bind(2, JobStateName(r.state));
  st.Bind(3, int64_t{r.verdict}).Bind(4, int64_t{r.priority});
  st.Bind(5, r.model).Bind(6, r.layer).Bind(7, r.engine);
  st.Bind(8, Micros(r.created)).Bind(9, Micros(r.started));
  st.Bind(10, Micros(r.finished)).Bind(11, int64_t{r.error_code});
  st.Bind(12, r.error_message).BindBlob(13, r.report).Bind(14, r.tenant);
  st.Bind(15, r.backend).Bind(16, r.step).Bind(17, r.run);
  st.Bind(18, r.diagnosis).Bind(19, r.replica).Bind(20, seq);
  st.Bind(21, tenant_seq);
  absl::StatusOr<bool> done = st.Step();
  if (!done.ok()) return done.status();
  return sqlite3_changes(db_) == 1;
}

absl::StatusOr<bool> SqliteJobStore::PutResultLocked(const ResultRecord& r) {
  // The next numbers are taken from the counters and the row is created or
  // moved from QUEUED/RUNNING to terminal; a terminal row is left as it
  // is, and then the counters go back (no gap). The row's own tenant
  // numbers it (an update keeps the row's tenant).
  ATTNAUDIT_ASSIGN_OR_RETURN(const std::string counter,
                             TenantCounterOfLocked(r));
  ATTNAUDIT_ASSIGN_OR_RETURN(const int64_t seq, BumpCounterLocked("seq", 1));
  ATTNAUDIT_ASSIGN_OR_RETURN(const int64_t tenant_seq,
                             BumpCounterLocked(counter, 1));
  ATTNAUDIT_ASSIGN_OR_RETURN(const bool stored,
                             WriteResultLocked(r, seq, tenant_seq));
  if (stored) return true;
  ATTNAUDIT_RETURN_IF_ERROR(BumpCounterLocked("seq", -1).status());
  ATTNAUDIT_RETURN_IF_ERROR(BumpCounterLocked(counter, -1).status());
  return false;
}

absl::StatusOr<bool> SqliteJobStore::PutResult(const ResultRecord& r) {
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<bool> stored, PutResults({r}));
  return stored.front();
}

absl::StatusOr<std::vector<bool>> SqliteJobStore::PutResults(
    const std::vector<ResultRecord>& records) {
  for (const ResultRecord& r : records) {
    ATTNAUDIT_RETURN_IF_ERROR(store_internal::CheckTerminal(r));
  }
  absl::MutexLock lock(&mu_);
  std::vector<bool> stored;
  ATTNAUDIT_RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
    stored.clear();
    for (const ResultRecord& r : records) {
      ATTNAUDIT_ASSIGN_OR_RETURN(const bool one, PutResultLocked(r));
      stored.push_back(one);
    }
    return absl::OkStatus();
  }));
  return stored;
}

absl::StatusOr<ResultRecord> SqliteJobStore::Get(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  const std::string sql = absl::StrCat(
      "SELECT ", kRecordColumns, ", report FROM results WHERE job_id = ?1");
  Stmt st(db_, sql.c_str());
  st.Bind(1, job_id);
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<ResultRecord> rows,
                             ReadRows(st, /*with_report=*/true));
  if (rows.empty()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  }
  return std::move(rows.front());
}

absl::StatusOr<std::vector<ResultRecord>> SqliteJobStore::Query(
    const ResultQuery& q) {
  ATTNAUDIT_ASSIGN_OR_RETURN(store_internal::QuerySql where,
                             store_internal::BuildQuerySql(q, '?'));
  const std::string sql = absl::StrCat("SELECT ", kRecordColumns,
                                       q.include_report ? ", report" : "",
                                       " FROM results", where.tail);
  absl::MutexLock lock(&mu_);
  Stmt st(db_, sql.c_str());
  for (size_t i = 0; i < where.params.size(); ++i) {
    const store_internal::SqlParam& p = where.params[i];
    if (p.is_int) {
      st.Bind(static_cast<int>(i + 1), p.i);
    } else {
      st.Bind(static_cast<int>(i + 1), p.s);
    }
  }
  return ReadRows(st, q.include_report);
}

absl::StatusOr<std::vector<ResultRecord>> SqliteJobStore::ResultsAfter(
    int64_t after_seq, int limit) {
  if (limit < 1 || limit > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, 10000], got ", limit));
  }
  const std::string sql = absl::StrCat(
      "SELECT ", kRecordColumns,
      ", report FROM results WHERE seq > ?1 ORDER BY seq LIMIT ?2");
  absl::MutexLock lock(&mu_);
  Stmt st(db_, sql.c_str());
  st.Bind(1, after_seq).Bind(2, int64_t{limit});
  return ReadRows(st, /*with_report=*/true);
}

absl::StatusOr<int64_t> SqliteJobStore::LastSeq() {
  absl::MutexLock lock(&mu_);
  Stmt st(db_, "SELECT value FROM counters WHERE name = 'seq'");
  absl::StatusOr<bool> row = st.Step();
  if (!row.ok()) return row.status();
  return *row ? st.Int(0) : 0;
}

absl::StatusOr<std::vector<ResultRecord>> SqliteJobStore::TenantResultsAfter(
    absl::string_view tenant, int64_t after, int limit) {
  if (limit < 1 || limit > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, 10000], got ", limit));
  }
  const std::string sql = absl::StrCat(
      "SELECT ", kRecordColumns,
      ", report FROM results WHERE tenant = ?1 AND tenant_seq > ?2 "
      "ORDER BY tenant_seq LIMIT ?3");
  absl::MutexLock lock(&mu_);
  Stmt st(db_, sql.c_str());
  st.Bind(1, tenant).Bind(2, after).Bind(3, int64_t{limit});
  return ReadRows(st, /*with_report=*/true);
}

absl::StatusOr<int64_t> SqliteJobStore::LastTenantSeq(
    absl::string_view tenant) {
  absl::MutexLock lock(&mu_);
  Stmt st(db_, "SELECT value FROM counters WHERE name = ?1");
  st.Bind(1, TenantCounter(tenant));
  absl::StatusOr<bool> row = st.Step();
  if (!row.ok()) return row.status();
  return *row ? st.Int(0) : 0;
}

absl::StatusOr<std::vector<std::string>> SqliteJobStore::Unfinished(
    absl::string_view replica) {
  absl::MutexLock lock(&mu_);
  Stmt st(db_,
          "SELECT job_id FROM results WHERE state IN ('QUEUED', 'RUNNING') "
          "AND (?1 = '' OR replica = ?1) ORDER BY created_us, job_id");
  st.Bind(1, replica);
  std::vector<std::string> out;
  while (true) {
    absl::StatusOr<bool> row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back(st.Text(0));
  }
  return out;
}

absl::StatusOr<int64_t> SqliteJobStore::Prune(absl::Time now) {
  absl::MutexLock lock(&mu_);
  int64_t deleted = 0;
  ATTNAUDIT_RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
    if (options_.max_age != absl::InfiniteDuration()) {
      const std::string sql =
          absl::StrCat("DELETE FROM results WHERE state IN ", kTerminalStates,
                       " AND finished_us < ?1");
      Stmt st(db_, sql.c_str());
      st.Bind(1, Micros(now - options_.max_age));
      absl::StatusOr<bool> done = st.Step();
      if (!done.ok()) return done.status();
      deleted += sqlite3_changes(db_);
    }
    if (options_.max_results > 0) {
      const std::string sql = absl::StrCat(
          "DELETE FROM results WHERE job_id IN (SELECT job_id FROM results "
          "WHERE state IN ",
          kTerminalStates,
          " ORDER BY finished_us DESC, job_id DESC LIMIT -1 OFFSET ?1)");
      Stmt st(db_, sql.c_str());
      st.Bind(1, options_.max_results);
      absl::StatusOr<bool> done = st.Step();
      if (!done.ok()) return done.status();
      deleted += sqlite3_changes(db_);
    }
    ATTNAUDIT_ASSIGN_OR_RETURN(const int64_t pairs, PrunePairsLocked(now));
    deleted += pairs;
    return absl::OkStatus();
  }));
  // Hand the freed pages back (cheap; no-op when nothing was freed).
  if (deleted > 0) Exec("PRAGMA incremental_vacuum").IgnoreError();
  return deleted;
}

absl::StatusOr<int64_t> SqliteJobStore::ChangeLocked(
    const std::string& sql, const std::vector<int64_t>& params) {
  Stmt st(db_, sql.c_str());
  for (size_t i = 0; i < params.size(); ++i) {
    st.Bind(static_cast<int>(i + 1), params[i]);
  }
  absl::StatusOr<bool> done = st.Step();
  if (!done.ok()) return done.status();
  return sqlite3_changes(db_);
}

absl::StatusOr<int64_t> SqliteJobStore::PrunePairsLocked(absl::Time now) {
  int64_t deleted = 0;
  // Sides expired at `now`, their rows first.
  ATTNAUDIT_RETURN_IF_ERROR(
      ChangeLocked("DELETE FROM pair_side_rows WHERE job_id IN (SELECT "
                   "job_id FROM pair_sides WHERE expires_us <= ?1)",
                   {Micros(now)})
          .status());
  ATTNAUDIT_ASSIGN_OR_RETURN(
      int64_t sides,
      ChangeLocked("DELETE FROM pair_sides WHERE expires_us <= ?1",
                   {Micros(now)}));
  deleted += sides;
  // Pairs by the results' retention: joined too long ago, then all but the
  // newest max_results; their request ids with them.
  if (options_.max_age != absl::InfiniteDuration()) {
    const int64_t cutoff = Micros(now - options_.max_age);
    ATTNAUDIT_RETURN_IF_ERROR(
        ChangeLocked("DELETE FROM pair_request_ids WHERE seq IN (SELECT seq "
                     "FROM pairs WHERE joined_us < ?1)",
                     {cutoff})
            .status());
    ATTNAUDIT_ASSIGN_OR_RETURN(
        int64_t n,
        ChangeLocked("DELETE FROM pairs WHERE joined_us < ?1", {cutoff}));
    deleted += n;
  }
  if (options_.max_results > 0) {
    constexpr const char* kOld =
        "(SELECT seq FROM pairs ORDER BY joined_us DESC, seq DESC "
        "LIMIT -1 OFFSET ?1)";
    ATTNAUDIT_RETURN_IF_ERROR(
        ChangeLocked(
            absl::StrCat("DELETE FROM pair_request_ids WHERE seq IN ", kOld),
            {options_.max_results})
            .status());
    ATTNAUDIT_ASSIGN_OR_RETURN(
        int64_t n,
        ChangeLocked(absl::StrCat("DELETE FROM pairs WHERE seq IN ", kOld),
                     {options_.max_results}));
    deleted += n;
  }
  return deleted;
}

absl::StatusOr<std::vector<PairSide>> SqliteJobStore::PutPairSideLocked(
    const PairSide& side, absl::Time now, int limit) {
  // A retry replaces the side: its rows go, then it is put again (last).
  {
    Stmt st(db_, "DELETE FROM pair_side_rows WHERE job_id = ?1");
    st.Bind(1, side.job_id);
    ATTNAUDIT_RETURN_IF_ERROR(st.Step().status());
  }
  {
    Stmt st(db_, "DELETE FROM pair_sides WHERE job_id = ?1");
    st.Bind(1, side.job_id);
    ATTNAUDIT_RETURN_IF_ERROR(st.Step().status());
  }
  {
    Stmt st(db_,
            "INSERT INTO pair_sides(job_id, tenant, run, layer, role, step, "
            "weight_version, snapshot, report, expires_us, put_seq) "
            "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
            "(SELECT COALESCE(MAX(put_seq), 0) + 1 FROM pair_sides))");
    st.Bind(1, side.job_id).Bind(2, side.tenant).Bind(3, side.run);
    st.Bind(4, side.layer).Bind(5, int64_t{side.role}).Bind(6, side.step);
    st.Bind(7, side.weight_version).BindBlob(8, side.snapshot);
    st.BindBlob(9, side.report).Bind(10, Micros(side.expires));
    ATTNAUDIT_RETURN_IF_ERROR(st.Step().status());
  }
  {
    // A row named twice is kept once.
    Stmt st(db_,
            "INSERT INTO pair_side_rows(job_id, request_id, position, tenant, "
            "run, layer, role) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7) "
            "ON CONFLICT DO NOTHING");
    for (const auto& [request_id, position] : side.rows) {
      st.Reset();
      st.Bind(1, side.job_id).Bind(2, request_id).Bind(3, position);
      st.Bind(4, side.tenant).Bind(5, side.run).Bind(6, side.layer);
      st.Bind(7, int64_t{side.role});
      ATTNAUDIT_RETURN_IF_ERROR(st.Step().status());
    }
  }
  // The other role's sides of the same tenant, run and layer sharing a
  // row, alive at `now`, in the order they were put.
  Stmt st(db_,
          "SELECT job_id, tenant, run, layer, role, step, weight_version, "
          "expires_us, snapshot, report FROM pair_sides WHERE job_id IN ("
          "SELECT o.job_id FROM pair_side_rows m JOIN pair_side_rows o "
          "ON o.tenant = m.tenant AND o.run = m.run AND o.layer = m.layer "
          "AND o.request_id = m.request_id AND o.position = m.position "
          "WHERE m.job_id = ?1 AND o.role <> m.role) "
          "AND expires_us > ?2 ORDER BY put_seq LIMIT ?3");
  st.Bind(1, side.job_id).Bind(2, Micros(now)).Bind(3, int64_t{limit});
  std::vector<PairSide> found;
  while (true) {
    ATTNAUDIT_ASSIGN_OR_RETURN(const bool row, st.Step());
    if (!row) break;
    PairSide s;
    s.job_id = st.Text(0);
    s.tenant = st.Text(1);
    s.run = st.Text(2);
    s.layer = st.Int(3);
    s.role = static_cast<int>(st.Int(4));
    s.step = st.Int(5);
    s.weight_version = st.Text(6);
    s.expires = store_internal::FromMicros(st.Int(7));
    s.snapshot = st.Blob(8);
    s.report = st.Blob(9);
    found.push_back(std::move(s));
  }
  return found;
}

absl::StatusOr<std::vector<PairSide>> SqliteJobStore::PutPairSide(
    const PairSide& side, absl::Time now, int limit) {
  ATTNAUDIT_RETURN_IF_ERROR(store_internal::CheckPairSide(side, limit));
  absl::MutexLock lock(&mu_);
  std::vector<PairSide> found;
  ATTNAUDIT_RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
    ATTNAUDIT_ASSIGN_OR_RETURN(found, PutPairSideLocked(side, now, limit));
    return absl::OkStatus();
  }));
  return found;
}

absl::StatusOr<bool> SqliteJobStore::PutPair(const PairRecord& p) {
  ATTNAUDIT_RETURN_IF_ERROR(store_internal::CheckPair(p));
  absl::MutexLock lock(&mu_);
  bool stored = false;
  ATTNAUDIT_RETURN_IF_ERROR(InTransaction([&]() -> absl::Status {
    {
      // Known: nothing written. Asked first, as an insert that does
      // nothing still takes an AUTOINCREMENT number (seq has no gaps).
      Stmt known(db_,
                 "SELECT 1 FROM pairs WHERE rollout_job = ?1 AND "
                 "trainer_job = ?2");
      known.Bind(1, p.rollout_job).Bind(2, p.trainer_job);
      ATTNAUDIT_ASSIGN_OR_RETURN(const bool row, known.Step());
      if (row) return absl::OkStatus();
    }
    Stmt st(db_,
            "INSERT INTO pairs(tenant, run, layer, rollout_job, trainer_job, "
            "rollout_step, trainer_step, rollout_weight_version, "
            "trainer_weight_version, verdict, report, replica, joined_us) "
            "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)");
    st.Bind(1, p.tenant).Bind(2, p.run).Bind(3, p.layer);
    st.Bind(4, p.rollout_job).Bind(5, p.trainer_job);
    st.Bind(6, p.rollout_step).Bind(7, p.trainer_step);
    st.Bind(8, p.rollout_weight_version).Bind(9, p.trainer_weight_version);
    st.Bind(10, int64_t{p.verdict}).BindBlob(11, p.report);
    st.Bind(12, p.replica).Bind(13, Micros(p.joined));
    ATTNAUDIT_RETURN_IF_ERROR(st.Step().status());
    stored = true;
    const int64_t seq = sqlite3_last_insert_rowid(db_);
    Stmt ids(db_,
             "INSERT INTO pair_request_ids(seq, request_id) VALUES(?1, ?2) "
             "ON CONFLICT DO NOTHING");
    for (const std::string& id : p.request_ids) {
      ids.Reset();
      ids.Bind(1, seq).Bind(2, id);
      ATTNAUDIT_RETURN_IF_ERROR(ids.Step().status());
    }
    return absl::OkStatus();
  }));
  return stored;
}

absl::StatusOr<std::vector<PairRecord>> SqliteJobStore::QueryPairs(
    const PairQuery& q) {
  ATTNAUDIT_ASSIGN_OR_RETURN(
      store_internal::QuerySql where,
      store_internal::BuildPairQuerySql(q, '?', "pair_request_ids"));
  const std::string sql = absl::StrCat("SELECT ", store_internal::kPairColumns,
                                       q.include_report ? ", report" : "",
                                       " FROM pairs", where.tail);
  absl::MutexLock lock(&mu_);
  Stmt st(db_, sql.c_str());
  for (size_t i = 0; i < where.params.size(); ++i) {
    const store_internal::SqlParam& p = where.params[i];
    if (p.is_int) {
      st.Bind(static_cast<int>(i + 1), p.i);
    } else {
      st.Bind(static_cast<int>(i + 1), p.s);
    }
  }
  std::vector<PairRecord> out;
  while (true) {
    ATTNAUDIT_ASSIGN_OR_RETURN(const bool row, st.Step());
    if (!row) break;
    out.push_back(store_internal::PairFromColumns(StmtRow(st)));
    if (q.include_report) {
      out.back().report = st.Blob(store_internal::kNumPairColumns);
    }
  }
  Stmt ids(db_,
           "SELECT request_id FROM pair_request_ids WHERE seq = ?1 "
           "ORDER BY request_id");
  for (PairRecord& p : out) {
    ids.Reset();
    ids.Bind(1, p.seq);
    while (true) {
      ATTNAUDIT_ASSIGN_OR_RETURN(const bool row, ids.Step());
      if (!row) break;
      p.request_ids.push_back(ids.Text(0));
    }
  }
  return out;
}

absl::StatusOr<std::string> SqliteJobStore::SharedSecret(
    absl::string_view name, absl::string_view candidate) {
  absl::MutexLock lock(&mu_);
  {
    Stmt put(db_,
             "INSERT INTO secrets(name, value) VALUES(?1, ?2) "
             "ON CONFLICT(name) DO NOTHING");
    put.Bind(1, name).BindBlob(2, candidate);
    absl::StatusOr<bool> done = put.Step();
    if (!done.ok()) return done.status();
  }
  Stmt get(db_, "SELECT value FROM secrets WHERE name = ?1");
  get.Bind(1, name);
  absl::StatusOr<bool> row = get.Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::InternalError("results.db: secret vanished");
  return get.Blob(0);
}

}  // namespace attnaudit::server
