// JobStore: the record of every durable job and its result, the contract
// both stores keep:
//   SqliteJobStore    <data_dir>/results.db, one process (the default);
//   PostgresJobStore  a PostgreSQL database shared by a fleet of replicas.
// OpenJobStore picks one from --store ("sqlite" or a postgresql:// URL).
//
// States: QUEUED -> RUNNING -> DONE | FAILED | CANCELLED. DONE means an
// audit report exists (whatever its verdict, INVALID included); FAILED an
// error (error_code/error_message); CANCELLED a client cancel or an
// expired deadline (error_code says which). Terminal rows never change:
// PutResult on a terminal row is a no-op that returns false, so one job
// never has two results, whichever replica (or retry) stores it.
//
// The result feed: every terminal row gets a sequence number `seq` when it
// becomes terminal, 1, 2, 3, ... in commit order, never reused (a counter
// row, not MAX(seq): pruning must not recycle numbers). A reader that has
// seen every row up to N and asks ResultsAfter(N) misses nothing and sees
// nothing twice; the replicas' cancel hand-off and the watchers of every
// tenant are built on it. Each terminal row also gets `tenant_seq`, its
// place among its own tenant's results (1, 2, 3, ... per tenant, in the
// same commit order): the cursors a tenant sees (WatchResults'
// resume_after, JobResult.cursor, ListResults' pages) are these, so a
// tenant's cursors say nothing about how many results other tenants have.
//
// Admission (RecordAdmitted): a Submit's row is created in the same
// transaction that asks the scheduler to take the job, and commits only
// when it did; another replica creating the same job waits for that
// decision. So an idempotency key never names a row whose job nobody
// runs, and, with the tenant's usage read under a lock of the tenant, a
// fleet decides one tenant's admissions one at a time (fleet-wide quotas).
//
// Durability: every write is one transaction, committed durably before it
// returns (SQLite synchronous=FULL; PostgreSQL's default synchronous
// commit). Errors: Unavailable when the database cannot be reached (the
// caller retries; nothing is half-written), Internal for other database
// failures, InvalidArgument for bad arguments, NotFound from Get,
// FailedPrecondition when the schema on disk is newer than this server.
//
// Thread safety: every method of every implementation is thread-safe.
#ifndef ATTNAUDIT_SERVER_STORE_JOB_STORE_H_
#define ATTNAUDIT_SERVER_STORE_JOB_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"

namespace attnaudit::server {

// Stored as text ("QUEUED", ...). Values are not persisted.
enum class JobState : int {
  kQueued = 0,
  kRunning = 1,
  kDone = 2,
  kFailed = 3,
  kCancelled = 4,
};
// "QUEUED", "RUNNING", "DONE", "FAILED", "CANCELLED": the text stored.
// Spelled here rather than taken from attnaudit.v1.JobState's generated
// names: stored rows must not change when the wire contract renames a
// value, and the store knows no wire types.
absl::string_view JobStateName(JobState s);
bool ParseJobState(absl::string_view name, JobState* out);
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
  // The snapshot's labels that queries filter on.
  std::string model;
  int64_t layer = -1;  // -1: unknown
  std::string engine;
  std::string backend;
  int64_t step = -1;  // -1: unknown
  std::string run;
  // The top diagnosis hypothesis of a DRIFT report ("" when none).
  std::string diagnosis;
  // The replica that accepted (or last claimed) the job.
  std::string replica;
  absl::Time created = absl::UnixEpoch();   // accepted (Submit)
  absl::Time started = absl::UnixEpoch();   // RUNNING; epoch if never
  absl::Time finished = absl::UnixEpoch();  // terminal; epoch if not yet
  int error_code = 0;                       // absl::StatusCode value
  std::string error_message;
  std::string report;  // opaque (the serialised report proto); may be empty
  // Snapshot bytes of the job (its tensors), recorded with the QUEUED row:
  // a fleet's tenant quotas count them across replicas.
  int64_t bytes = 0;
  // Set by the store: the row's place in the result feed, and among its
  // tenant's results (0 until terminal). Ignored on writes.
  int64_t seq = 0;
  int64_t tenant_seq = 0;
};

// What one tenant holds queued or running.
struct TenantUsage {
  int64_t jobs = 0;
  int64_t bytes = 0;
};

// An acknowledged job as a fleet store keeps it for another replica to
// take over: its row, its deadline and its request bytes (the Submit
// request exactly as spooled). ClaimStranded leaves `payload` empty and
// says how long it is (ReadPayload reads it).
struct StoredJob {
  ResultRecord record;
  absl::Time deadline = absl::InfiniteFuture();
  std::string payload;
  int64_t payload_bytes = 0;
};

// A replica's last heartbeat and the store's clock when it was read.
struct ReplicaBeat {
  absl::Time written = absl::InfinitePast();
  absl::Time now = absl::InfinitePast();
};

// The job RecordAdmitted records: its QUEUED row and, in a store shared
// by a fleet, its deadline and request bytes.
struct AdmittedJob {
  ResultRecord record;
  absl::Time deadline = absl::InfiniteFuture();
  absl::string_view payload;
  // Read the tenant's usage on other replicas (under the tenant's lock)
  // and hand it to `admit`; false: `admit` gets zeros.
  bool count_tenant = false;
};

struct ResultQuery {
  // Exact matches; unset matches any.
  absl::optional<std::string> tenant;
  absl::optional<int> verdict;
  absl::optional<JobState> state;
  absl::optional<std::string> model;
  absl::optional<int64_t> layer;
  absl::optional<std::string> engine;
  absl::optional<std::string> backend;
  absl::optional<int64_t> step;
  absl::optional<std::string> run;
  absl::optional<std::string> diagnosis;
  // results_only: terminal rows only, newest result first (seq
  // descending), optionally only those with seq < before_seq (the next
  // page after a page that ended at before_seq) and finished in
  // [finished_since, finished_until). Otherwise every row, newest created
  // first (the finished_* and before_seq bounds are ignored).
  // With tenant_cursor (and `tenant` set), results are ordered and paged
  // by tenant_seq instead (the same order): before_seq bounds tenant_seq.
  bool results_only = false;
  bool tenant_cursor = false;
  absl::optional<absl::Time> finished_since;
  absl::optional<absl::Time> finished_until;
  int64_t before_seq = 0;       // 0: no bound
  int limit = 100;              // 1..10000 rows
  bool include_report = false;  // leave `report` empty when false
};

// --- Train-rollout pairs (server/pairs joins them; both stores keep them).

// One side of a pair waiting for its counterpart: an audited snapshot
// labelled rollout or trainer (Labels.role), with its (request id, query
// position) rows. Sides of one tenant, run and layer of the other role
// that share a row are counterparts.
struct PairSide {
  std::string job_id;  // the side's audit (its result's job id); unique
  std::string tenant = "default";
  std::string run;     // non-empty
  int64_t layer = -1;  // >= 0
  int role = 0;        // SnapshotRole wire value: 1 rollout, 2 trainer
  int64_t step = -1;   // -1: unknown
  std::string weight_version;
  // (request id, query position) of each row of the snapshot; non-empty,
  // at most kMaxPairSideRows.
  std::vector<std::pair<std::string, int64_t>> rows;
  std::string snapshot;  // opaque (the serialised snapshot)
  std::string report;    // opaque (its serialised audit report)
  // Kept until then; a side expired is never returned and Prune deletes it.
  absl::Time expires = absl::InfinitePast();
};
inline constexpr size_t kMaxPairSideRows = 4096;

// A joined pair as the store keeps it.
struct PairRecord {
  std::string tenant = "default";
  std::string run;
  int64_t layer = -1;
  std::string rollout_job;  // the two sides' job ids: unique together
  std::string trainer_job;
  int64_t rollout_step = -1;
  int64_t trainer_step = -1;
  std::string rollout_weight_version;
  std::string trainer_weight_version;
  int verdict = 0;  // PairVerdict wire value; 0: no common row
  // The distinct request ids of its rows (PairQuery::request_id); read
  // back sorted.
  std::vector<std::string> request_ids;
  std::string report;  // opaque (the serialised pair report); may be empty
  std::string replica;  // the replica that joined it
  absl::Time joined = absl::UnixEpoch();
  // Set by the store: 1, 2, 3, ... in commit order, for paging. Ignored on
  // writes.
  int64_t seq = 0;
};

struct PairQuery {
  // Exact matches; unset matches any. `step` matches either side's step;
  // `request_id` any of request_ids.
  absl::optional<std::string> tenant;
  absl::optional<std::string> run;
  absl::optional<int64_t> layer;
  absl::optional<int> verdict;
  absl::optional<int64_t> step;
  absl::optional<std::string> request_id;
  // Joined in [joined_since, joined_until).
  absl::optional<absl::Time> joined_since;
  absl::optional<absl::Time> joined_until;
  // Newest first (seq descending), only seq < before_seq when > 0.
  int64_t before_seq = 0;
  int limit = 100;              // 1..10000 rows
  bool include_report = false;  // leave `report` empty when false
};

struct StoreOptions {
  // Prune(): delete terminal rows finished more than max_age ago
  // (InfiniteDuration: keep), then all but the newest max_results terminal
  // rows (0: no limit). Queued/running rows are never pruned.
  absl::Duration max_age = absl::Hours(24 * 7);
  int64_t max_results = 1000000;
  // How long a call waits for a busy database (SQLite busy_timeout;
  // PostgreSQL connect_timeout and statement lock waits).
  absl::Duration busy_timeout = absl::Seconds(5);
  // Tests only: SQLite synchronous=OFF.
  bool sync = true;
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Records an accepted job as QUEUED (record.state and seq are ignored).
  // Returns true when the row was created, false when the job already had
  // a row (of any state): across a fleet this is the claim that makes an
  // idempotency key name one job.
  virtual absl::StatusOr<bool> RecordQueued(const ResultRecord& record) = 0;

  // RecordQueued, and in a store shared by a fleet also the job's
  // deadline and request bytes, in the same transaction, so that another
  // replica can run the job if this one never comes back (ClaimStranded).
  // The payload goes when the job's result is stored. A store of one
  // process keeps no payload (the local spool has it).
  virtual absl::StatusOr<bool> RecordQueuedWithPayload(
      const ResultRecord& record, absl::Time deadline,
      absl::string_view payload) = 0;

  // Admission and the job's row as one decision (see the file comment):
  // in one transaction, creates the row (RecordQueuedWithPayload's), runs
  // `admit` with the tenant's usage elsewhere (job.count_tenant) and
  // commits only when `admit` returns OK. A caller creating the same job
  // at once waits for this one's decision. Returns true when the job was
  // admitted and recorded; false when it already had a row (`admit` did
  // not run); `admit`'s error when it refused (nothing is recorded); a
  // store error otherwise -- possibly after `admit` accepted (a failed
  // COMMIT), which the caller knows from its own `admit`. `admit` runs on
  // the calling thread, must be quick, and must not call the store.
  using Admit = std::function<absl::Status(const TenantUsage& elsewhere)>;
  virtual absl::StatusOr<bool> RecordAdmitted(const AdmittedJob& job,
                                              const Admit& admit) = 0;

  // QUEUED -> RUNNING at `started`. Returns false (no change) when the row
  // is missing or not QUEUED.
  virtual absl::StatusOr<bool> MarkRunning(absl::string_view job_id,
                                           absl::Time started) = 0;

  // Stores the terminal result (record.state must be DONE, FAILED or
  // CANCELLED, else InvalidArgument) and gives it the next seq. Inserts
  // the row or updates a QUEUED/RUNNING one (keeping its replica), in one
  // transaction. Returns true when this call made the job terminal, false
  // when it already was (nothing changed).
  virtual absl::StatusOr<bool> PutResult(const ResultRecord& record) = 0;
  // PutResult of each record, all in one transaction (one commit, one
  // fsync, for a writer with many results at once); the i-th answer is
  // PutResult's for records[i]. On an error nothing is stored.
  virtual absl::StatusOr<std::vector<bool>> PutResults(
      const std::vector<ResultRecord>& records) = 0;

  // NotFound when the job has no row. The report is included.
  virtual absl::StatusOr<ResultRecord> Get(absl::string_view job_id) = 0;

  virtual absl::StatusOr<std::vector<ResultRecord>> Query(
      const ResultQuery& query) = 0;

  // Terminal rows with seq > after_seq, in seq order, at most `limit`
  // (1..10000), reports included: the result feed.
  virtual absl::StatusOr<std::vector<ResultRecord>> ResultsAfter(
      int64_t after_seq, int limit) = 0;
  // The seq of the newest terminal row ever stored (0: none yet).
  virtual absl::StatusOr<int64_t> LastSeq() = 0;
  // The same two in one tenant's numbering: its terminal rows with
  // tenant_seq > after, in tenant_seq order (reports included), and its
  // newest tenant_seq ever stored (0: none yet).
  virtual absl::StatusOr<std::vector<ResultRecord>> TenantResultsAfter(
      absl::string_view tenant, int64_t after, int limit) = 0;
  virtual absl::StatusOr<int64_t> LastTenantSeq(absl::string_view tenant) = 0;

  // Job ids in QUEUED or RUNNING state, oldest first; with `replica`
  // non-empty only that replica's.
  virtual absl::StatusOr<std::vector<std::string>> Unfinished(
      absl::string_view replica) = 0;

  // Applies the retention policy relative to `now` (to results, and to
  // pairs by max_age and max_results the same way, by `joined`), and
  // deletes the pair sides expired at `now`; returns the results, pairs
  // and sides deleted (a side's rows and a pair's request ids go with it
  // and are not counted).
  virtual absl::StatusOr<int64_t> Prune(absl::Time now) = 0;

  // --- Train-rollout pairs.
  //
  // Keeps `side` (replacing a side with its job_id: a retry) and, in the
  // same transaction, returns its counterparts that have not expired at
  // `now`: the other role's sides of the same tenant, run and layer that
  // share a (request id, position) row, oldest first (in the order they
  // were put; a retried side counts as put again), snapshot and report
  // included (their `rows` left empty: the snapshot holds them), at most
  // `limit` (1..1000). Sides put at once, on any replica, are serialised
  // per (tenant, run, layer): of two counterparts the later one finds the
  // earlier, so every pair is found once at least.
  // InvalidArgument for a side without run, layer, role or rows.
  virtual absl::StatusOr<std::vector<PairSide>> PutPairSide(
      const PairSide& side, absl::Time now, int limit) = 0;
  // Stores a joined pair (seq is assigned). false: a pair of the same two
  // jobs was stored already (nothing changed), so a join retried or made
  // by two replicas is kept and counted once.
  virtual absl::StatusOr<bool> PutPair(const PairRecord& pair) = 0;
  virtual absl::StatusOr<std::vector<PairRecord>> QueryPairs(
      const PairQuery& query) = 0;

  // The value stored under `name`; when there is none, stores `candidate`
  // and returns it. Replicas agree on shared secrets through it (the
  // idempotency key's HMAC secret): the first to ask wins.
  virtual absl::StatusOr<std::string> SharedSecret(
      absl::string_view name, absl::string_view candidate) = 0;

  // --- The fleet's hand-off (stores that are shared(); the SQLite store
  // answers OK / nothing).
  //
  // A replica is alive while its heartbeat, written with the database's
  // clock (so replicas' clocks need not agree), is younger than the lease.
  // Heartbeats (and ReadHeartbeat, Retire) use a connection of their own,
  // so calls in progress on the others never delay them.
  virtual absl::Status Heartbeat(absl::string_view replica) = 0;
  // The replica's last heartbeat; NotFound when it has none (never wrote
  // one, or retired; always in a store of one process).
  virtual absl::StatusOr<ReplicaBeat> ReadHeartbeat(
      absl::string_view replica) = 0;
  // The replica is going away (drain): its unfinished jobs may be claimed
  // at once.
  virtual absl::Status Retire(absl::string_view replica) = 0;
  // Takes over unfinished jobs (with a payload) whose replica is gone:
  // retired (no heartbeat at all), or, unless `retired_only`, silent (no
  // heartbeat within `lease`). Oldest first; each becomes `replica`'s,
  // QUEUED again. At most `limit` jobs whose payloads add up to at most
  // `max_bytes` (but the first always, whatever its size). Payloads are
  // not read (StoredJob::payload_bytes says their size): the caller reads
  // each with ReadPayload once the claim committed. Replicas claiming at
  // once never get the same job (row locks, SKIP LOCKED).
  virtual absl::StatusOr<std::vector<StoredJob>> ClaimStranded(
      absl::string_view replica, absl::Duration lease, int limit,
      int64_t max_bytes, bool retired_only) = 0;
  // The stored payload of an unfinished job (a replica restarting without
  // its local spool). NotFound when there is none.
  virtual absl::StatusOr<StoredJob> ReadPayload(absl::string_view job_id) = 0;

  // What `tenant` holds queued or running on replicas other than
  // `replica` (a fleet's quotas are fleet-wide; each replica counts its
  // own jobs itself). A store of one process: nothing.
  virtual absl::StatusOr<TenantUsage> OthersUsage(
      absl::string_view tenant, absl::string_view replica) = 0;

  // Whether other processes write to the same store (a fleet).
  virtual bool shared() const = 0;
  // For logs: "sqlite:<path>" or the URL without its password.
  virtual std::string description() const = 0;
};

// Where the store lives, from --store.
struct StoreConfig {
  // "sqlite" (the default: <data_dir>/results.db) or
  // "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB[?PARAMS]" (also
  // "postgres://").
  std::string url = "sqlite";
  std::string data_dir;
  StoreOptions options;
};

// Opens (creating or migrating the schema of) the store `config` names.
// InvalidArgument naming "--store" for a URL that is neither form; the
// store's own errors otherwise.
absl::StatusOr<std::unique_ptr<JobStore>> OpenJobStore(
    const StoreConfig& config);

// The URL with any password replaced by "***", for logs and errors.
std::string RedactStoreUrl(absl::string_view url);

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_STORE_JOB_STORE_H_
