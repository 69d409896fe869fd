// PostgresJobStore: the JobStore of a fleet, a PostgreSQL database (15 or
// newer) that every replica of one deployment shares (`--store
// postgresql://...`). Tables are prefixed "attnaudit_" so the database may
// hold other things; attnaudit_schema holds the schema version.
//
// Schema: Open applies the migrations this server knows under a
// transaction-scoped advisory lock, so replicas starting together migrate
// once; a database whose version is newer than kPostgresSchemaVersion is
// refused (FailedPrecondition) -- roll the fleet forward, not back.
//
// Result feed: PutResult takes seq from a counter row inside its
// transaction; the row stays locked until commit, so seq order is commit
// order fleet-wide (terminal writes are serialised: a few per audit, not a
// bottleneck next to the audit itself).
//
// Pairs (PutPairSide): sides of one tenant, run and layer are put one at
// a time fleet-wide, under a transaction-scoped advisory lock of their
// group, so of two counterparts put at once the later finds the earlier.
// Tables: attnaudit_pair_sides and attnaudit_pair_side_rows (deleted with
// their side), attnaudit_pairs (seq from a counter row, as the feed) and
// attnaudit_pair_request_ids (deleted with their pair); since version 3.
//
// Connections: a pool of up to kMaxSessions libpq connections, one per
// call in progress, plus one of its own for heartbeats (Heartbeat,
// ReadHeartbeat, Retire), so a replica's heartbeat never waits for its
// other calls (a Submit's payload, a claim). A call that finds its
// connection broken (the server restarted, the network dropped) returns
// Unavailable and the next call on that connection reconnects; nothing is
// retried inside a call, so a write is never applied twice behind the
// caller's back.
//
// Admission (RecordAdmitted): one transaction inserts the payload, takes
// the tenant's advisory lock (job.count_tenant), reads the tenant's usage
// on other replicas, inserts the row and runs `admit`; the lock and the
// uncommitted row make concurrent admissions of the same tenant, or of the
// same job, wait for this one's COMMIT or ROLLBACK (at most
// StoreOptions::busy_timeout: lock_timeout).
//
// Thread safety: all methods are thread-safe.
#ifndef ATTNAUDIT_SERVER_STORE_POSTGRES_JOB_STORE_H_
#define ATTNAUDIT_SERVER_STORE_POSTGRES_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/store/job_store.h"

struct pg_conn;

namespace attnaudit::server {

inline constexpr int kPostgresSchemaVersion = 3;

class PostgresJobStore final : public JobStore {
 public:
  // Connects to `url` (a libpq connection URI) and migrates the schema.
  // Unavailable when the server cannot be reached; the message names the
  // URL without its password.
  static absl::StatusOr<std::unique_ptr<PostgresJobStore>> Open(
      const std::string& url, const StoreOptions& options = {});
  ~PostgresJobStore() override;
  PostgresJobStore(const PostgresJobStore&) = delete;
  PostgresJobStore& operator=(const PostgresJobStore&) = delete;

  absl::StatusOr<bool> RecordQueued(const ResultRecord& record) override;
  absl::StatusOr<bool> RecordQueuedWithPayload(
      const ResultRecord& record, absl::Time deadline,
      absl::string_view payload) override;
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
  absl::StatusOr<std::vector<PairSide>> PutPairSide(const PairSide& side,
                                                    absl::Time now,
                                                    int limit) override;
  absl::StatusOr<bool> PutPair(const PairRecord& pair) override;
  absl::StatusOr<std::vector<PairRecord>> QueryPairs(
      const PairQuery& query) override;
  absl::StatusOr<std::string> SharedSecret(
      absl::string_view name, absl::string_view candidate) override;
  absl::Status Heartbeat(absl::string_view replica) override;
  absl::StatusOr<ReplicaBeat> ReadHeartbeat(absl::string_view replica) override;
  absl::Status Retire(absl::string_view replica) override;
  absl::StatusOr<std::vector<StoredJob>> ClaimStranded(
      absl::string_view replica, absl::Duration lease, int limit,
      int64_t max_bytes, bool retired_only) override;
  absl::StatusOr<StoredJob> ReadPayload(absl::string_view job_id) override;
  absl::StatusOr<TenantUsage> OthersUsage(absl::string_view tenant,
                                          absl::string_view replica) override;
  bool shared() const override { return true; }
  std::string description() const override { return redacted_url_; }

 public:
  // One bound parameter: text, or bytes (binary format).
  struct Param {
    std::string value;
    bool binary = false;
  };
  class Rows;  // an owned PGresult, read as text

 private:
  // One connection of the pool; it reconnects lazily after a failure.
  struct Session {
    pg_conn* conn = nullptr;
  };
  // A session taken from the pool for one call, given back at its end.
  class Lease {
   public:
    Lease(PostgresJobStore* store, std::unique_ptr<Session> session)
        : store_(store), session_(std::move(session)) {}
    Lease(Lease&&) = default;
    ~Lease();
    Session& operator*() { return *session_; }

   private:
    PostgresJobStore* store_;
    std::unique_ptr<Session> session_;
  };

  PostgresJobStore(std::string url, const StoreOptions& options);
  // Waits for an idle session (opening one while fewer than kMaxSessions
  // exist).
  Lease Acquire();
  void Release(std::unique_ptr<Session> session);
  // (Re)connects when `db` has no healthy connection.
  absl::Status Connect(Session& db);
  // Runs one statement; rows come back as text, or with `binary_results`
  // as bytes (a payload: no hex text twice its size).
  absl::StatusOr<Rows> Run(Session& db, const std::string& sql,
                           const std::vector<Param>& params,
                           bool binary_results = false);
  // Runs `body` between BEGIN and COMMIT; ROLLBACK when it fails.
  template <typename Body>
  absl::Status InTransaction(Session& db, Body body);
  absl::Status Migrate(Session& db);
  absl::StatusOr<std::vector<ResultRecord>> Records(
      Session& db, const std::string& sql, const std::vector<Param>& params,
      bool with_report);
  absl::StatusOr<bool> RecordQueuedOn(Session& db, const ResultRecord& record);
  // A job's row, deadline and payload; NotFound without a payload.
  absl::StatusOr<StoredJob> ReadStored(Session& db, absl::string_view job_id);
  // The stranded jobs ClaimStranded may take (locked until COMMIT): ids
  // and payload sizes, within `limit` and `max_bytes`.
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> PickStranded(
      Session& db, absl::string_view replica, absl::Duration lease, int limit,
      int64_t max_bytes, bool retired_only);
  // PutResult's work inside a transaction (a savepoint of its own, rolled
  // back for a terminal row: its numbers are given back).
  absl::StatusOr<bool> PutResultOn(Session& db, const ResultRecord& record);
  // RecordAdmitted's transaction body; *created as RecordQueuedOn.
  absl::Status AdmitOn(Session& db, const AdmittedJob& job, const Admit& admit,
                       bool* created);
  // PutPairSide's transaction body: the side kept, its counterparts.
  absl::StatusOr<std::vector<PairSide>> PutPairSideOn(Session& db,
                                                      const PairSide& side,
                                                      absl::Time now,
                                                      int limit);
  // Prune's pair sides and pairs (inside its transaction); rows deleted.
  absl::StatusOr<int64_t> PrunePairsOn(Session& db, absl::Time now);
  // Rows changed by a statement that returned no rows.
  absl::StatusOr<int64_t> Change(Session& db, const std::string& sql,
                                 const std::vector<Param>& params);

  const std::string url_;
  const std::string redacted_url_;
  const StoreOptions options_;
  // Calls run in parallel on up to kMaxSessions connections (a Submit's
  // payload insert need not hold up GetResult or the result feed).
  static constexpr int kMaxSessions = 4;
  absl::Mutex pool_mu_;
  std::vector<std::unique_ptr<Session>> idle_ ABSL_GUARDED_BY(pool_mu_);
  int sessions_ ABSL_GUARDED_BY(pool_mu_) = 0;
  // The heartbeats' own connection.
  absl::Mutex beat_mu_;
  Session beat_ ABSL_GUARDED_BY(beat_mu_);
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_STORE_POSTGRES_JOB_STORE_H_
