// JobService: the life of an audit job, from admission to its stored
// result, behind one interface without gRPC types: an RPC layer adapts it
// (proto <-> these types, absl::Status -> grpc::Status, streaming) and a
// composition root creates, starts and shuts it down (server/app). Its
// unit tests drive it directly (tests/unit/server/jobs). It composes the
// parts of this folder: admission.h, durable_registry.h, result_feed.h,
// fleet_handoff.h, audit_result_writer.h, open_calls.h, upload_ledger.h.
//
//   JobServiceOptions options;  options.replica_id = "r1"; ...
//   ATTNAUDIT_ASSIGN_OR_RETURN(std::unique_ptr<JobService> jobs,
//       JobService::Create(options, formats, scheduler, spool, store,
//                          metrics, job_id_key));
//   ATTNAUDIT_RETURN_IF_ERROR(jobs->Start(&subscriber));
//   ... jobs->Submit(...), jobs->Get(...), jobs->RunInteractive(...) ...
//   jobs->StartDraining(); jobs->Drain(timeout);
//   ... the scheduler destroyed (its workers joined) ...
//   jobs->Shutdown();
//
// Two kinds of jobs:
//   interactive  (Audit, AuditStream) RunInteractive: admitted, run, and
//                answered from the job's completion; its result is kept
//                (stored, or journalled until the store takes it) before
//                the answer, unless options.store_audit_results is false.
//   durable      (Submit) Submit: validated, spooled (fsync), scheduled and
//                recorded QUEUED in one decision, THEN acknowledged. Its
//                result is committed to the store before its spool entry
//                is removed, so a crash anywhere leaves exactly one of the
//                two and the job gets exactly one result; a commit the
//                store refuses is retried until it succeeds (the job stays
//                visible as RUNNING meanwhile). ResumeSpool re-runs, at
//                start-up, the spooled jobs an earlier run left unfinished.
//   In a fleet (a store shared by several replicas, JobStore::shared())
//   a replica's unfinished jobs are taken over by another within about a
//   lease when it dies or retires (fleet_handoff.h), and a job cancelled
//   or finished elsewhere is stopped here.
//
// Results: every stored result of every replica reaches the
// ResultSubscriber given to Start, once and in the store's order (the
// result feed, result_feed.h); an interactive result that is not stored
// reaches it too, unnumbered. WatchBacklog reads what a resumed watch
// missed.
//
// Tenants: a job belongs to its caller's tenant. Get, Cancel, List and
// WatchBacklog see only the caller's tenant's jobs unless it reads (or
// cancels) all; another tenant's job is NOT_FOUND exactly as an unknown
// one. Permissions to call at all are the caller's business (an RPC layer
// checks them per RPC); the override permission, which depends on the
// audit asked for, is checked here.
//
// Errors are absl::Status naming the field a caller can fix
// ("idempotency_key: ...", "snapshot.q: ...", "timeout: ..."):
//   InvalidArgument    bad input (counted as invalid input);
//   PermissionDenied   an audit that overrides the policy without the
//                      override permission; Cancel of another tenant's
//                      job without admin;
//   NotFound           an unknown (or invisible) job id;
//   ResourceExhausted  a full queue, budget or quota, a full disk, with a
//                      retry hint where retrying can help;
//   Unavailable        draining, or storage that failed (never a path);
//   Aborted            an idempotent Submit racing another with its key.
//
// Ownership: the scheduler, spool, store, metrics and the journal named in
// the options are not owned and must outlive the service. Thread safety:
// every method may be called from any thread; Submit, Get, Cancel, List,
// WatchBacklog and ResumeSpool block (disk, store) and belong on a
// BlockingExecutor (blocking_executor.h) or a thread of their own, never
// on a thread that must not wait.
#ifndef ATTNAUDIT_SERVER_JOBS_JOBS_H_
#define ATTNAUDIT_SERVER_JOBS_JOBS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "core/audit/options.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"
#include "server/auth/tenants.h"
#include "server/jobs/admission.h"
#include "server/jobs/open_calls.h"
#include "server/jobs/result_journal.h"
#include "server/jobs/upload_ledger.h"
#include "server/metrics/metrics.h"
#include "server/pairs/joiner.h"
#include "server/scheduler/job.h"
#include "server/scheduler/scheduler.h"
#include "server/spool/spool.h"
#include "server/store/job_ids.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

struct JobServiceOptions {
  // This replica's name: the owner stored with the jobs it accepts.
  std::string replica_id;
  // Sizes Submit validates before spooling; every job runs under them.
  ValidationLimits limits;
  // AuditOptions::threads of every job (0: the device's default).
  int threads_per_job = 0;
  // How CP ring jobs on GPUs get gangs (admission.h).
  Admission::RingGang ring_gang = Admission::RingGang::kWhenNeeded;
  // Stream uploads in progress (upload_ledger.h): the budget of all of
  // them together (at least 1 byte) and one tenant's share of it.
  int64_t upload_budget_bytes = int64_t{4} << 30;
  double upload_tenant_share = 0.5;
  // Open calls whose client has been silent this long are ended; they are
  // looked for every quarter of it (10 ms to 1 s).
  absl::Duration upload_idle_timeout = absl::Seconds(30);
  // A Submit without a timeout gets this one (InfiniteDuration: none).
  absl::Duration default_submit_timeout = absl::InfiniteDuration();
  // Interactive results are stored like Submit's; false: only published.
  bool store_audit_results = true;
  // How often the result feed looks for other replicas' results.
  absl::Duration feed_poll_interval = absl::Milliseconds(200);
  // A fleet: a replica silent this long is gone, and its unfinished jobs
  // are taken over, up to fleet_claim_bytes of payload a round.
  absl::Duration fleet_lease = absl::Seconds(15);
  int64_t fleet_claim_bytes = int64_t{256} << 20;
  // Interactive results the store cannot take are kept here until it can
  // (result_journal.h; not owned, outlives the service); null: not kept.
  ResultJournal* result_journal = nullptr;
  // Every audited job's snapshot is offered to it (server/pairs; not
  // owned, outlives the service); null: no train-rollout pairs.
  PairJoiner* pair_joiner = nullptr;
};

// A job's work: the snapshot and how to audit it.
struct AuditWork {
  Snapshot snapshot;  // labels as the client sent them: bounded here
  AuditOptions options;
  // What the scheduler's budgets count for the job (its tensors' bytes,
  // or what an interactive call received).
  int64_t bytes = 0;
};

// The formats the lifecycle keeps jobs in and treats as opaque bytes:
// a Submit's request as received, spooled and decoded again by a restart
// or by the replica that takes the job over; and a finished audit's report
// as the store keeps it. A server gives the wire's (the serialised
// attnaudit.v1 request and report).
struct JobFormats {
  // A spooled request's work; its error is the job's terminal status
  // (client-safe: InvalidArgument naming the field, DataLoss).
  std::function<absl::StatusOr<AuditWork>(const std::string& payload)>
      decode_payload;
  std::function<std::string(const AuditReport& report)> encode_report;
};

// An interactive (Audit, AuditStream) job.
struct InteractiveJob {
  // A fresh NewJobId('a') (server/store/job_ids.h), chosen by the caller
  // so that its call is known by it before the job can run.
  std::string job_id;
  Principal caller;
  AuditWork work;
  PriorityClass priority = PriorityClass::kInteractive;
  absl::Time deadline = absl::InfiniteFuture();
};

// How an interactive job ended, for its caller.
struct InteractiveAnswer {
  // OK with `report`; the job's error; InvalidArgument
  // "snapshot.<reason>" when the audit found the snapshot INVALID.
  absl::Status status;
  AuditReport report;
  // The id GetResult reads the result back by; empty when the result was
  // not kept, and then `not_stored_reason` says why.
  std::string job_id;
  std::string not_stored_reason;
};
// Called exactly once per admitted job: from the job's completion, or for
// a report once its result is kept, from the result writer's thread.
using InteractiveDone = std::function<void(InteractiveAnswer answer)>;

// A durable (Submit) job.
struct SubmitJob {
  Principal caller;
  PriorityClass priority = PriorityClass::kSampled;
  // Empty: none. At most kMaxIdempotencyKey bytes; the same key of the
  // same tenant names the same job (on every replica of a fleet).
  std::string idempotency_key;
  // Must be positive; none: options.default_submit_timeout.
  absl::optional<absl::Duration> timeout;
  AuditWork work;
  // The request as received (JobFormats): what the spool keeps.
  std::string payload;
};
inline constexpr size_t kMaxIdempotencyKey = 128;

// What Submit says. `job_id` is set as soon as it is known (also when
// Submit then fails); `retry_after` goes with ResourceExhausted (and some
// Unavailable) errors when retrying can help.
struct SubmitAnswer {
  std::string job_id;
  bool deduplicated = false;  // the key's job existed already
  absl::Duration retry_after = absl::ZeroDuration();
};

// The most stored results one resumed watch replays.
inline constexpr int64_t kMaxWatchBacklog = 10000;

// Where published results go (for a server: its WatchResults fan-out).
// Called on the result feed's thread (Stored) and on the threads that
// finish interactive jobs (Unstored); must not block.
class ResultSubscriber {
 public:
  virtual ~ResultSubscriber() = default;
  // Once, from Start: results published from now on come after `seq`.
  virtual void StartAfter(int64_t seq) = 0;
  // A stored result of any replica, in seq order, exactly once.
  virtual void Stored(const ResultRecord& record) = 0;
  // An interactive job's result that was not stored (seq 0).
  virtual void Unstored(const ResultRecord& record) = 0;
};

// The cursor `caller` sees for a stored result: the feed's seq when it
// reads all, else the result's place among its tenant's (tenant_seq).
int64_t CursorFor(const Principal& caller, const ResultRecord& record);

class JobService {
 public:
  // FailedPrecondition naming the missing part when a dependency or a
  // format is missing.
  static absl::StatusOr<std::unique_ptr<JobService>> Create(
      JobServiceOptions options, JobFormats formats, Scheduler* scheduler,
      Spool* spool, JobStore* store, Metrics* metrics, JobIdKey job_id_key);
  virtual ~JobService() = default;

  // --- Start-up, in this order.
  // Follows the store's result feed into `subscriber` (not owned; may be
  // null; outlives the service) from the store's newest result on, and in
  // a fleet starts the hand-off. The store's error when it cannot be read
  // ("result store (<its description>): ..."); FailedPrecondition naming
  // --replica-id when a live replica of the fleet uses this one's id.
  virtual absl::Status Start(ResultSubscriber* subscriber) = 0;
  // Re-runs every spooled job without a terminal result accepted before
  // `accepted_before` (what this run accepted is scheduled already), and
  // closes the store's unfinished rows whose job is lost. Blocking: run it
  // on a thread of its own once serving. Stops early when `stop` is set or
  // the service drains. Returns the number of jobs re-run.
  virtual int64_t ResumeSpool(const std::atomic<bool>& stop,
                              absl::Time accepted_before) = 0;

  // --- Jobs.
  // The advisory admission check (queues, budgets, quotas, deadline)
  // before a request's bytes are read or decoded: ResourceExhausted with
  // *retry_after, counted under its reason. RunInteractive checks again.
  virtual absl::Status CheckAdmission(const AdmissionQuery& query,
                                      absl::Duration* retry_after) = 0;
  // Schedules an interactive job. On error (the override permission,
  // draining, admission; *retry_after set when retrying can help) `done`
  // is never called; otherwise it is called once with the answer.
  virtual absl::Status RunInteractive(InteractiveJob job, InteractiveDone done,
                                      absl::Duration* retry_after) = 0;
  // Stops an interactive job whose call ended early (the client went away,
  // or lost its credential): it answers Cancelled, or whatever it had.
  virtual void StopInteractive(const std::string& job_id) = 0;
  // Accepts a durable job (see the file comment): OK once it is spooled,
  // scheduled and recorded, or deduplicated.
  virtual absl::Status Submit(SubmitJob job, SubmitAnswer* answer) = 0;
  // The job as the caller may see it: live (QUEUED, RUNNING, also while a
  // finished result waits to be stored), journalled here, or stored.
  // NotFound "job_id: ..." for an unknown or invisible job.
  virtual absl::StatusOr<ResultRecord> Get(const Principal& caller,
                                           const std::string& job_id) = 0;
  // Cancels a queued or running job, or records a spooled or another
  // replica's job cancelled; the state the job is in now (CANCELLED,
  // RUNNING while a finished result is being stored, or its terminal
  // state). NotFound as Get; PermissionDenied for another tenant's job
  // without admin.
  virtual absl::StatusOr<JobState> Cancel(const Principal& caller,
                                          const std::string& job_id) = 0;
  // Stored results matching `query`, restricted to the caller's tenant
  // (and numbered by it) unless it reads all.
  virtual absl::StatusOr<std::vector<ResultRecord>> List(
      const Principal& caller, ResultQuery query) = 0;
  // Stored train-rollout pairs matching `query`, restricted to the
  // caller's tenant unless it reads all.
  virtual absl::StatusOr<std::vector<PairRecord>> ListPairs(
      const Principal& caller, PairQuery query) = 0;
  // The stored results a watch resumed after cursor `after` (in the
  // caller's numbering) missed, up to the feed's seq `until`, oldest
  // first. InvalidArgument for a cursor beyond the newest stored result;
  // OutOfRange when results after it were pruned, or more than
  // kMaxWatchBacklog were stored after it.
  virtual absl::StatusOr<std::vector<ResultRecord>> WatchBacklog(
      const Principal& caller, int64_t after, int64_t until) = 0;

  // --- Calls in progress and uploads.
  // The calls to end from outside (credentials reloaded, stalled uploads);
  // its sweeper runs from Create until the service goes.
  virtual OpenCalls* open_calls() = 0;
  virtual UploadLedger* uploads() = 0;
  // The token file was reloaded: every open call re-checks its
  // credentials against `auth` (counted).
  virtual void RecheckOpenCalls(const Authenticator& auth) = 0;

  // --- Shutdown, in this order.
  // From now on work is refused Unavailable "server is draining".
  virtual void StartDraining() = 0;
  virtual bool draining() const = 0;
  // Drains: refuses new work, lets queued and running jobs finish up to
  // `timeout` (the scheduler's status: what is left stays spooled), stops
  // taking other replicas' jobs and retires this one's, stops the result
  // feed, and sends the interactive results still to come to the journal.
  virtual absl::Status Drain(absl::Duration timeout) = 0;
  // Once the scheduler's workers are joined: stops retrying refused
  // results (their jobs run again on the next start) and keeps the
  // interactive results still queued (their answers are given). The
  // subscriber is not called after it returns. Idempotent.
  virtual void Shutdown() = 0;

  // --- State.
  // Scheduler::Devices (what Capabilities describes).
  virtual std::vector<DeviceInfo> Devices() const = 0;
  // Durable results waiting to be stored (the store refused them).
  virtual int64_t results_pending() const = 0;
  // Counts a request refused before it reached the service (a request
  // that does not decode): Admission::CountRefusal.
  virtual void CountRefusal(const absl::Status& status,
                            Metrics::InvalidInput where) = 0;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_JOBS_JOBS_H_
