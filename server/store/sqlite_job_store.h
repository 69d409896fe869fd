// SqliteJobStore: the JobStore of one process, <data_dir>/results.db (WAL
// journal) -- the embedded default (`--store sqlite`). The spool entry of a
// job is removed only after its terminal result committed here, so after
// any crash a job whose result exists is never re-run.
//
// Durability: every write is one transaction. PRAGMA synchronous=FULL: in
// WAL mode NORMAL may lose the last commits on power loss (not on a
// process crash); because the spool entry is deleted right after the
// commit, a lost commit would lose an acknowledged job, so we pay one WAL
// fsync per commit (small rows; negligible next to an audit).
//
// Schema: PRAGMA user_version holds its version (kSqliteSchemaVersion);
// older files are migrated at Open, a newer one is refused
// (FailedPrecondition) so an old server never writes rows it misreads.
// Tables: results (a job's row and its result), counters (seq and each
// tenant's tseq), secrets; since version 5 the train-rollout pairs:
// pair_sides (a side waiting for its counterpart, with its snapshot and
// report) and pair_side_rows (its (request id, position) rows), pairs (the
// joined pairs, seq AUTOINCREMENT) and pair_request_ids.
//
// Thread safety: all methods are thread-safe (one connection, serialised
// by a mutex). Errors: Internal("results.db: <sqlite message>") for SQLite
// failures, InvalidArgument for bad arguments.
#ifndef ATTNAUDIT_SERVER_STORE_SQLITE_JOB_STORE_H_
#define ATTNAUDIT_SERVER_STORE_SQLITE_JOB_STORE_H_

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
#include "server/store/job_store.h"

struct sqlite3;

namespace attnaudit::server {

inline constexpr int kSqliteSchemaVersion = 5;

class SqliteJobStore final : public JobStore {
 public:
  // Opens (creating when missing) <data_dir>/results.db and its schema.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(
      const std::string& data_dir, const StoreOptions& options = {});
  ~SqliteJobStore() override;
  SqliteJobStore(const SqliteJobStore&) = delete;
  SqliteJobStore& operator=(const SqliteJobStore&) = delete;

  absl::StatusOr<bool> RecordQueued(const ResultRecord& record) override;
  absl::StatusOr<bool> RecordQueuedWithPayload(
      const ResultRecord& record, absl::Time deadline,
      absl::string_view payload) override {
    return RecordQueued(record);  // one process: the spool holds it
  }
  // One process: nothing elsewhere to count (job.count_tenant is moot) and
  // no payload kept. Other calls wait for the decision (one connection).
  absl::StatusOr<bool> RecordAdmitted(const AdmittedJob& job,
                                      const Admit& admit) override;
  absl::StatusOr<bool> MarkRunning(absl::string_view job_id,
                                   absl::Time started) override;
  absl::StatusOr<bool> PutResult(const ResultRecord& record) override;
  absl::StatusOr<std::vector<bool>> PutResults(
      const std::vector<ResultRecord>& records) override;
  absl::StatusOr<ResultRecord> Get(absl::string_view job_id) override;
  absl::StatusOr<std::vector<ResultRecord>> Query(
      const ResultQuery& query) override;
  absl::StatusOr<std::vector<ResultRecord>> ResultsAfter(int64_t after_seq,
                                                         int limit) override;
  absl::StatusOr<int64_t> LastSeq() override;
  absl::StatusOr<std::vector<ResultRecord>> TenantResultsAfter(
      absl::string_view tenant, int64_t after, int limit) override;
  absl::StatusOr<int64_t> LastTenantSeq(absl::string_view tenant) override;
  absl::StatusOr<std::vector<std::string>> Unfinished(
      absl::string_view replica) override;
  absl::StatusOr<int64_t> Prune(absl::Time now) override;
  // The one connection serialises sides: a side always sees every side put
  // before it.
  absl::StatusOr<std::vector<PairSide>> PutPairSide(const PairSide& side,
                                                    absl::Time now,
                                                    int limit) override;
  absl::StatusOr<bool> PutPair(const PairRecord& pair) override;
  absl::StatusOr<std::vector<PairRecord>> QueryPairs(
      const PairQuery& query) override;
  absl::StatusOr<std::string> SharedSecret(
      absl::string_view name, absl::string_view candidate) override;
  absl::Status Heartbeat(absl::string_view) override {
    return absl::OkStatus();
  }
  absl::StatusOr<ReplicaBeat> ReadHeartbeat(absl::string_view) override {
    return absl::NotFoundError("results.db keeps no heartbeats");
  }
  absl::Status Retire(absl::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<StoredJob>> ClaimStranded(absl::string_view,
                                                       absl::Duration, int,
                                                       int64_t, bool) override {
    return std::vector<StoredJob>();
  }
  absl::StatusOr<StoredJob> ReadPayload(absl::string_view job_id) override {
    return absl::NotFoundError("results.db keeps no payloads");
  }
  absl::StatusOr<TenantUsage> OthersUsage(absl::string_view,
                                          absl::string_view) override {
    return TenantUsage();
  }
  bool shared() const override { return false; }
  std::string description() const override { return "sqlite:" + path_; }

  const std::string& path() const { return path_; }

 private:
  SqliteJobStore(std::string path, const StoreOptions& options, sqlite3* db);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` inside BEGIN IMMEDIATE .. COMMIT (ROLLBACK on error).
  template <typename Body>
  absl::Status InTransaction(Body body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates the schema or brings an older one to the current version.
  absl::Status MigrateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Inserts the QUEUED row unless the job has one; whether it did.
  absl::StatusOr<bool> InsertQueuedLocked(const ResultRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves counter `name` by `delta` (creating it at 0); its new value.
  absl::StatusOr<int64_t> BumpCounterLocked(const std::string& name,
                                            int64_t delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The counter numbering `record`'s job among its tenant's results: that
  // of the tenant of its row, or of record.tenant for a new row.
  absl::StatusOr<std::string> TenantCounterOfLocked(const ResultRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PutResult's work inside a transaction: whether the row changed (a
  // terminal row is left alone and its numbers given back).
  absl::StatusOr<bool> PutResultLocked(const ResultRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The terminal write of PutResult with numbers seq and tenant_seq;
  // whether the row changed.
  absl::StatusOr<bool> WriteResultLocked(const ResultRecord& record,
                                         int64_t seq, int64_t tenant_seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a statement with integer parameters ?1, ?2, ...; rows changed.
  absl::StatusOr<int64_t> ChangeLocked(const std::string& sql,
                                       const std::vector<int64_t>& params)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PutPairSide's work inside a transaction: keeps the side, returns its
  // counterparts.
  absl::StatusOr<std::vector<PairSide>> PutPairSideLocked(const PairSide& side,
                                                          absl::Time now,
                                                          int limit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prune's pair sides and pairs (inside its transaction); rows deleted.
  absl::StatusOr<int64_t> PrunePairsLocked(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const StoreOptions options_;
  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_STORE_SQLITE_JOB_STORE_H_
