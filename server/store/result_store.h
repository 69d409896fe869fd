// ResultStore: the embedded SQLite database of jobs and their results,
// <data_dir>/results.db (WAL journal). GetResult/WatchResults answer from
// it; the spool entry of a job is removed only after its terminal result
// committed here, so after any crash a job whose result exists is never
// re-run (on resume: Get(id) is terminal -> just Spool::Remove(id)).
//
// States: QUEUED -> RUNNING -> DONE | FAILED | CANCELLED. DONE means an
// audit report exists (whatever its verdict, INVALID included); FAILED an
// error (error_code/error_message); CANCELLED a client cancel or an
// expired deadline (error_code says which). Terminal rows never change:
// PutResult on a terminal row is a no-op that returns false, so one job
// never has two results.
//
// Durability: every write is one transaction. PRAGMA synchronous=FULL: in
// WAL mode NORMAL may lose the last commits on power loss (not on a
// process crash); because the spool entry is deleted right after the
// commit, a lost commit would lose an acknowledged job, so we pay one WAL
// fsync per commit (small rows; negligible next to an audit).
//
// Thread safety: all methods are thread-safe (one connection, serialised
// by a mutex). Errors: Internal("results.db: <sqlite message>") for SQLite
// failures, InvalidArgument for bad arguments.
#ifndef ATTNAUDIT_SERVER_STORE_RESULT_STORE_H_
#define ATTNAUDIT_SERVER_STORE_RESULT_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"

struct sqlite3;

namespace attnaudit::server {

// Stored as text ("QUEUED", ...). Values are not persisted.
enum class JobState : int {
  kQueued = 0,
  kRunning = 1,
  kDone = 2,
  kFailed = 3,
  kCancelled = 4,
};
// "QUEUED", "RUNNING", "DONE", "FAILED", "CANCELLED": the text stored in
// results.db. Spelled here rather than taken from attnaudit.v1.JobState's
// generated names: stored rows must not change when the wire contract
// renames a value, and the store knows no wire types.
absl::string_view JobStateName(JobState s);
bool IsTerminal(JobState s);

struct ResultRecord {
  std::string job_id;
  // Owner (server/auth tenant). Rows stored before tenants existed belong
  // to "default".
  std::string tenant = "default";
  JobState state = JobState::kQueued;
  // attnaudit::Verdict value (0 unspecified, 1 PASS, 2 DRIFT, 3 INVALID);
  // 0 unless DONE.
  int verdict = 0;
  int32_t priority = 1;  // PriorityClass value
  std::string model;
  int64_t layer = -1;
  std::string engine;
  absl::Time created = absl::UnixEpoch();   // accepted (Submit)
  absl::Time started = absl::UnixEpoch();   // RUNNING; epoch if never
  absl::Time finished = absl::UnixEpoch();  // terminal; epoch if not yet
  int error_code = 0;                       // absl::StatusCode value
  std::string error_message;
  std::string report;  // opaque (the serialised report proto); may be empty
};

struct ResultQuery {
  absl::optional<int> verdict;     // exact match
  absl::optional<JobState> state;  // exact match
  absl::optional<std::string> model;
  absl::optional<int64_t> layer;
  absl::optional<std::string> engine;
  // Only rows finished at or after `since` (terminal rows only when set).
  absl::optional<absl::Time> finished_since;
  // Ordered by (finished, job_id) ascending when finished_since is set,
  // otherwise newest created first. At most `limit` rows (1..10000).
  int limit = 100;
  bool include_report = false;  // leave `report` empty when false
};

struct StoreOptions {
  // Prune(): delete terminal rows finished more than max_age ago
  // (InfiniteDuration: keep), then all but the newest max_results terminal
  // rows (0: no limit). Queued/running rows are never pruned.
  absl::Duration max_age = absl::Hours(24 * 7);
  int64_t max_results = 1000000;
  // PRAGMA busy_timeout.
  absl::Duration busy_timeout = absl::Seconds(5);
  // Tests only: synchronous=OFF.
  bool sync = true;
};

class ResultStore {
 public:
  // Opens (creating when missing) <data_dir>/results.db and its schema.
  static absl::StatusOr<std::unique_ptr<ResultStore>> Open(
      const std::string& data_dir, const StoreOptions& options = {});
  ~ResultStore();
  ResultStore(const ResultStore&) = delete;
  ResultStore& operator=(const ResultStore&) = delete;

  // Records an accepted job as QUEUED (record.state is ignored). Returns
  // true when the row was created, false when the job already had a row
  // (of any state: resume re-records queued jobs harmlessly).
  absl::StatusOr<bool> RecordQueued(const ResultRecord& record);

  // QUEUED -> RUNNING at `started`. Returns false (no change) when the row
  // is missing or not QUEUED.
  absl::StatusOr<bool> MarkRunning(absl::string_view job_id,
                                   absl::Time started);

  // Stores the terminal result (record.state must be DONE, FAILED or
  // CANCELLED, else InvalidArgument). Inserts the row or updates a
  // QUEUED/RUNNING one, in one transaction. Returns true when this call
  // made the job terminal, false when it already was (nothing changed).
  absl::StatusOr<bool> PutResult(const ResultRecord& record);

  // NotFound when the job has no row. The report is included.
  absl::StatusOr<ResultRecord> Get(absl::string_view job_id);

  absl::StatusOr<std::vector<ResultRecord>> Query(const ResultQuery& query);

  // Job ids in QUEUED or RUNNING state (e.g. to reconcile with the spool
  // after a restart), oldest first.
  absl::StatusOr<std::vector<std::string>> Unfinished();

  // Applies the retention policy relative to `now`; returns rows deleted.
  absl::StatusOr<int64_t> Prune(absl::Time now);

  const std::string& path() const { return path_; }

 private:
  ResultStore(std::string path, const StoreOptions& options, sqlite3* db);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates the schema or brings an older one to the current version.
  absl::Status MigrateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const StoreOptions options_;
  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_STORE_RESULT_STORE_H_
