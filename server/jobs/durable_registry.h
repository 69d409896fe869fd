// DurableJobs: the durable (Submit and resumed) jobs between their
// acknowledgement and the commit of their result, kept in memory.
//
// Why: the result store is the record of jobs, but a write to it can fail
// (a full or failing disk). The job must then stay visible -- GetResult
// answers its live state (QUEUED, RUNNING; RUNNING also while a finished
// job's result waits to be stored) instead of NOT_FOUND -- and its result
// must be stored as soon as the disk takes it again, without a restart.
// So every durable job is registered here when it is acknowledged (or
// resumed); a finished job's result is committed at once through `commit`,
// and when that fails it stays here and a retry thread tries again with
// exponential backoff (first_retry, doubling up to max_retry). The spool
// entry stays until the commit succeeds, so a crash meanwhile re-runs the
// job on the next start, and it still gets exactly one result (the store
// never replaces a terminal row).
//
// Thread safety: all methods are thread-safe. `commit` and `on_stored` run
// without the lock, on the finishing thread or the retry thread, never
// twice at once for one job.
#ifndef ATTNAUDIT_SERVER_JOBS_DURABLE_REGISTRY_H_
#define ATTNAUDIT_SERVER_JOBS_DURABLE_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

class DurableJobs {
 public:
  // Stores one terminal result (store, then spool entry): true when the
  // row is new, false when the job already had a terminal result, or the
  // error that kept it from being stored.
  using Commit = std::function<absl::StatusOr<bool>(const ResultRecord&)>;

  struct Options {
    absl::Duration first_retry = absl::Milliseconds(250);
    absl::Duration max_retry = absl::Seconds(30);
  };

  DurableJobs(Commit commit, Options options);
  ~DurableJobs();  // Shutdown()
  DurableJobs(const DurableJobs&) = delete;
  DurableJobs& operator=(const DurableJobs&) = delete;

  // An acknowledged job, QUEUED (record.state is ignored).
  void Add(const ResultRecord& queued);
  void MarkRunning(absl::string_view job_id, absl::Time started);
  // The job finished with `result` (terminal): commits it now and, when
  // that fails, keeps it and retries. `on_stored` runs once, after the
  // commit, when the row was new (e.g. to publish it to watchers).
  void Finish(ResultRecord result, std::function<void()> on_stored);
  // The job ended without a result (the scheduler drained): it stays in
  // the spool for the next start.
  void Forget(absl::string_view job_id);

  // The live record of a registered job: QUEUED or RUNNING (RUNNING also
  // while its finished result waits to be stored). nullopt when the job is
  // not registered (unknown, or its result is in the store).
  absl::optional<ResultRecord> Get(absl::string_view job_id) const;
  // Results waiting to be stored.
  int64_t pending() const;

  // Stops the retry thread; results still pending stay unstored (their
  // jobs run again on the next start). Idempotent.
  void Shutdown();

 private:
  struct Entry {
    ResultRecord live;      // QUEUED or RUNNING
    bool finished = false;  // `result` waits to be stored
    ResultRecord result;
    std::function<void()> on_stored;
    int attempts = 0;
    absl::Time next_try = absl::InfiniteFuture();
    bool committing = false;
  };

  // Tries to store the entry of `job_id` (taken out of the lock); erases
  // it on success, schedules the next try on failure.
  void TryCommit(const std::string& job_id);
  void RetryLoop();

  const Commit commit_;
  const Options options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar wake_;
  std::thread retry_thread_;
  absl::Mutex join_mu_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_JOBS_DURABLE_REGISTRY_H_
