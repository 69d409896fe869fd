#include "server/store/result_store.h"

#include <sqlite3.h>

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "server/store/sqlite_util.h"

namespace attnaudit::server {
namespace {

using store_internal::Stmt;

// Schema version 2 (1 + the tenant column). auto_vacuum must be set before
// the first table exists so that Prune can hand freed pages back to the
// file system.
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
  report        BLOB
);
CREATE INDEX IF NOT EXISTS results_by_finished ON results(finished_us, job_id);
CREATE INDEX IF NOT EXISTS results_by_created ON results(created_us, job_id);
CREATE INDEX IF NOT EXISTS results_by_state ON results(state);
)sql";

// Version 1 had no tenant: its rows belonged to the one token holder, now
// tenant "default".
constexpr const char* kMigrateV1 =
    "ALTER TABLE results ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'";

constexpr const char* kColumns =
    "job_id, state, verdict, priority, model, layer, engine, created_us, "
    "started_us, finished_us, error_code, error_message, tenant";

constexpr const char* kTerminal = "('DONE','FAILED','CANCELLED')";

int64_t Micros(absl::Time t) {
  if (t == absl::InfiniteFuture()) return INT64_MAX;
  if (t == absl::InfinitePast()) return INT64_MIN;
  return absl::ToUnixMicros(t);
}

bool ParseState(absl::string_view s, JobState* out) {
  for (JobState st : {JobState::kQueued, JobState::kRunning, JobState::kDone,
                      JobState::kFailed, JobState::kCancelled}) {
    if (JobStateName(st) == s) {
      *out = st;
      return true;
    }
  }
  return false;
}

// Reads the kColumns (+ report when with_report) of the current row.
ResultRecord ReadRow(const Stmt& st, bool with_report) {
  ResultRecord r;
  r.job_id = st.Text(0);
  ParseState(st.Text(1), &r.state);
  r.verdict = static_cast<int>(st.Int(2));
  r.priority = static_cast<int32_t>(st.Int(3));
  r.model = st.Text(4);
  r.layer = st.Int(5);
  r.engine = st.Text(6);
  r.created = absl::FromUnixMicros(st.Int(7));
  r.started = absl::FromUnixMicros(st.Int(8));
  r.finished = absl::FromUnixMicros(st.Int(9));
  r.error_code = static_cast<int>(st.Int(10));
  r.error_message = st.Text(11);
  r.tenant = st.Text(12);
  if (with_report) r.report = st.Blob(13);
  return r;
}

}  // namespace

absl::string_view JobStateName(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kDone:
      return "DONE";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

bool IsTerminal(JobState s) {
  return s == JobState::kDone || s == JobState::kFailed ||
         s == JobState::kCancelled;
}

ResultStore::ResultStore(std::string path, const StoreOptions& options,
                         sqlite3* db)
    : path_(std::move(path)), options_(options), db_(db) {}

ResultStore::~ResultStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close_v2(db_);
}

absl::Status ResultStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::InternalError(
        absl::StrCat("results.db: ", err != nullptr ? err : "exec failed"));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ResultStore>> ResultStore::Open(
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
  std::unique_ptr<ResultStore> store(new ResultStore(path, options, db));
  absl::MutexLock lock(&store->mu_);
  sqlite3_busy_timeout(
      db, static_cast<int>(absl::ToInt64Milliseconds(options.busy_timeout)));
  // Before anything writes page 1; a no-op on an existing database.
  absl::Status s = store->Exec("PRAGMA auto_vacuum=INCREMENTAL");
  if (!s.ok()) return s;
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
  s = store->Exec(options.sync ? "PRAGMA synchronous=FULL"
                               : "PRAGMA synchronous=OFF");
  if (s.ok()) s = store->MigrateLocked();
  if (!s.ok()) return s;
  return store;
}

absl::Status ResultStore::MigrateLocked() {
  int64_t version = 0;
  {
    Stmt st(db_, "PRAGMA user_version");
    absl::StatusOr<bool> row = st.Step();
    if (!row.ok()) return row.status();
    version = *row ? st.Int(0) : 0;
  }
  if (version > 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("results.db: schema version ", version,
                     " is newer than this server (2)"));
  }
  ATTNAUDIT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status s = Exec(kSchema);
  if (s.ok() && version == 1) s = Exec(kMigrateV1);
  if (s.ok()) s = Exec("PRAGMA user_version = 2");
  if (!s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  return Exec("COMMIT");
}

absl::StatusOr<bool> ResultStore::RecordQueued(const ResultRecord& r) {
  if (r.job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  absl::MutexLock lock(&mu_);
  Stmt st(db_,
          "INSERT INTO results(job_id, state, priority, model, layer, engine, "
          "created_us, tenant) VALUES(?1, 'QUEUED', ?2, ?3, ?4, ?5, ?6, ?7) "
          "ON CONFLICT(job_id) DO NOTHING");
  st.Bind(1, r.job_id).Bind(2, int64_t{r.priority}).Bind(3, r.model);
  st.Bind(4, r.layer).Bind(5, r.engine).Bind(6, Micros(r.created));
  st.Bind(7, r.tenant);
  absl::StatusOr<bool> done = st.Step();
  if (!done.ok()) return done.status();
  return sqlite3_changes(db_) == 1;
}

absl::StatusOr<bool> ResultStore::MarkRunning(absl::string_view job_id,
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

absl::StatusOr<bool> ResultStore::PutResult(const ResultRecord& r) {
  if (r.job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  if (!IsTerminal(r.state)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: PutResult needs DONE, FAILED or CANCELLED, got ",
                     JobStateName(r.state)));
  }
  absl::MutexLock lock(&mu_);
  // One statement, hence one transaction: the row is created or moved from
  // QUEUED/RUNNING to terminal; a terminal row is left as it is, which
  // sqlite3_changes() reports as 0.
  Stmt st(db_,
          "INSERT INTO results(job_id, state, verdict, priority, model, layer, "
          "engine, created_us, started_us, finished_us, error_code, "
          "error_message, report, tenant) "
          "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) "
          "ON CONFLICT(job_id) DO UPDATE SET state = excluded.state, "
          "verdict = excluded.verdict, model = excluded.model, "
          "layer = excluded.layer, engine = excluded.engine, "
          "started_us = CASE WHEN results.started_us = 0 "
          "THEN excluded.started_us ELSE results.started_us END, "
          "finished_us = excluded.finished_us, "
          "error_code = excluded.error_code, "
          "error_message = excluded.error_message, report = excluded.report "
          "WHERE results.state IN ('QUEUED', 'RUNNING')");
  st.Bind(1, r.job_id).Bind(2, JobStateName(r.state));
  st.Bind(3, int64_t{r.verdict}).Bind(4, int64_t{r.priority});
  st.Bind(5, r.model).Bind(6, r.layer).Bind(7, r.engine);
  st.Bind(8, Micros(r.created)).Bind(9, Micros(r.started));
  st.Bind(10, Micros(r.finished)).Bind(11, int64_t{r.error_code});
  st.Bind(12, r.error_message).BindBlob(13, r.report).Bind(14, r.tenant);
  absl::StatusOr<bool> done = st.Step();
  if (!done.ok()) return done.status();
  return sqlite3_changes(db_) == 1;
}

absl::StatusOr<ResultRecord> ResultStore::Get(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  const std::string sql = absl::StrCat(
      "SELECT ", kColumns, ", report FROM results WHERE job_id = ?1");
  Stmt st(db_, sql.c_str());
  st.Bind(1, job_id);
  absl::StatusOr<bool> row = st.Step();
  if (!row.ok()) return row.status();
  if (!*row)
    return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return ReadRow(st, /*with_report=*/true);
}

absl::StatusOr<std::vector<ResultRecord>> ResultStore::Query(
    const ResultQuery& q) {
  if (q.limit < 1 || q.limit > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, 10000], got ", q.limit));
  }
  std::string sql =
      absl::StrCat("SELECT ", kColumns, q.include_report ? ", report" : "",
                   " FROM results WHERE 1");
  int n = 0;
  if (q.verdict) absl::StrAppend(&sql, " AND verdict = ?", ++n);
  if (q.state) absl::StrAppend(&sql, " AND state = ?", ++n);
  if (q.model) absl::StrAppend(&sql, " AND model = ?", ++n);
  if (q.layer) absl::StrAppend(&sql, " AND layer = ?", ++n);
  if (q.engine) absl::StrAppend(&sql, " AND engine = ?", ++n);
  if (q.finished_since) {
    absl::StrAppend(&sql, " AND state IN ", kTerminal, " AND finished_us >= ?",
                    ++n, " ORDER BY finished_us ASC, job_id ASC");
  } else {
    absl::StrAppend(&sql, " ORDER BY created_us DESC, job_id DESC");
  }
  absl::StrAppend(&sql, " LIMIT ?", ++n);

  absl::MutexLock lock(&mu_);
  Stmt st(db_, sql.c_str());
  int i = 0;
  if (q.verdict) st.Bind(++i, int64_t{*q.verdict});
  if (q.state) st.Bind(++i, JobStateName(*q.state));
  if (q.model) st.Bind(++i, *q.model);
  if (q.layer) st.Bind(++i, *q.layer);
  if (q.engine) st.Bind(++i, *q.engine);
  if (q.finished_since) st.Bind(++i, Micros(*q.finished_since));
  st.Bind(++i, int64_t{q.limit});
  std::vector<ResultRecord> out;
  while (true) {
    absl::StatusOr<bool> row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back(ReadRow(st, q.include_report));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ResultStore::Unfinished() {
  absl::MutexLock lock(&mu_);
  Stmt st(db_,
          "SELECT job_id FROM results WHERE state IN ('QUEUED', 'RUNNING') "
          "ORDER BY created_us, job_id");
  std::vector<std::string> out;
  while (true) {
    absl::StatusOr<bool> row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back(st.Text(0));
  }
  return out;
}

absl::StatusOr<int64_t> ResultStore::Prune(absl::Time now) {
  absl::MutexLock lock(&mu_);
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  int64_t deleted = 0;
  s = [&]() -> absl::Status {
    if (options_.max_age != absl::InfiniteDuration()) {
      const std::string sql =
          absl::StrCat("DELETE FROM results WHERE state IN ", kTerminal,
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
          kTerminal,
          " ORDER BY finished_us DESC, job_id DESC LIMIT -1 OFFSET ?1)");
      Stmt st(db_, sql.c_str());
      st.Bind(1, options_.max_results);
      absl::StatusOr<bool> done = st.Step();
      if (!done.ok()) return done.status();
      deleted += sqlite3_changes(db_);
    }
    return absl::OkStatus();
  }();
  if (!s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  s = Exec("COMMIT");
  if (!s.ok()) return s;
  // Hand the freed pages back (cheap; no-op when nothing was freed).
  if (deleted > 0) Exec("PRAGMA incremental_vacuum").IgnoreError();
  return deleted;
}

}  // namespace attnaudit::server
