// Internal: the Scheduler implementation's state. Not part of the public
// interface (include server/scheduler/scheduler.h instead).
//
// Every job Submit accepted has one Entry in entries_ until its completion
// is delivered. A queued entry is also in queues_[class] (FIFO by seq); a
// running one is assigned to the slot of its gang leader. Entries with a
// finite deadline are in queued_deadlines_ while queued and in
// running_deadlines_ while running. Every entry counts against its tenant's
// usage (tenants_) from EnqueueLocked until it is taken out of entries_.
#ifndef ATTNAUDIT_SERVER_SCHEDULER_SCHEDULER_IMPL_H_
#define ATTNAUDIT_SERVER_SCHEDULER_SCHEDULER_IMPL_H_

#include <array>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/scheduler/scheduler.h"

namespace attnaudit::server {
namespace scheduler_internal {

struct Entry {
  std::unique_ptr<Job> job;
  uint64_t seq = 0;
  absl::Time enqueued;
  bool running = false;
  std::vector<int> gang;  // slots held while running; gang[0] leads
  // A gang job that could not be placed: when dispatch first found it so
  // (for backfill); InfinitePast otherwise.
  absl::Time blocked_since = absl::InfinitePast();
  // It already ran once on a device that failed (it runs at most twice).
  bool retried = false;
  // Why `job->cancelled` was set (first reason wins): kCancelled,
  // kDeadlineExceeded or kUnavailable; kOk while not set.
  absl::StatusCode stop_code = absl::StatusCode::kOk;
};

// A completion to deliver outside the lock.
struct Completion {
  std::unique_ptr<Job> job;
  JobOutcome outcome;
};

// What one run of a job produced, taken outside the lock.
struct RunResult {
  absl::StatusOr<AuditReport> result =
      absl::UnknownError("the job did not run");
  bool ran = false;
  absl::Duration run = absl::ZeroDuration();
  absl::Duration queue_wait = absl::ZeroDuration();
  std::vector<absl::Status> health;  // of the gang's devices, after the run
};

class SchedulerImpl : public Scheduler {
 public:
  explicit SchedulerImpl(SchedulerOptions options);
  ~SchedulerImpl() override;

  void Start();

  absl::Status Submit(std::unique_ptr<Job> job,
                      SubmitRejection* rejection) override;
  absl::Status SubmitWhenAdmitted(std::unique_ptr<Job> job,
                                  absl::Time wait_until) override;
  absl::Status CheckAdmission(const AdmissionQuery& query,
                              SubmitRejection* rejection) const override;
  absl::Status Cancel(absl::string_view job_id) override;
  absl::Status CancelOwned(absl::string_view job_id,
                           absl::string_view tenant) override;
  absl::StatusOr<std::string> OwnerOf(absl::string_view job_id) const override;
  absl::Status Drain(absl::Duration timeout) override;
  SchedulerStats Stats() const override;
  std::vector<DeviceInfo> Devices() const override;

 private:
  struct Slot {
    Device* device = nullptr;
    std::string kind;
    std::string name;
    int64_t job_memory_bytes = 0;  // Describe()'s, at creation
    bool busy = false;             // running a job or reserved for a gang
    absl::Status health;           // not OK: out of the pool for good
    Entry* assigned = nullptr;  // set for the leader until its worker takes it
    absl::CondVar cv;
    std::thread thread;
  };

  // Admission rules without side effects. `job` may be null
  // (CheckAdmission). `for_resume`: SubmitWhenAdmitted (no kWouldExpire).
  absl::Status AdmitLocked(const AdmissionQuery& q, const Job* job,
                           bool for_resume, SubmitRejection* rejection) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The steps of AdmitLocked, in its order; OK or the refusal.
  absl::Status CheckJobLocked(const Job& job, SubmitRejection* rejection) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckTenantLocked(const AdmissionQuery& q,
                                 SubmitRejection* rejection) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckCapacityLocked(const AdmissionQuery& q,
                                   SubmitRejection* rejection) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckWaitLocked(const AdmissionQuery& q,
                               SubmitRejection* rejection) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Bytes class `c` may have queued (its budget).
  int64_t ClassBudget(PriorityClass c) const;
  // Queued jobs that go before a new job of class `c` (its class and the
  // ones above it).
  int64_t AheadLocked(PriorityClass c) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Jobs dispatched per second: the measured drain rate (see scheduler.h,
  // Retry hints), or devices / run estimate until enough was measured.
  double DrainRateLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The measured part of it: saturated dispatches per second over the
  // window, 0 until three gaps are in it.
  double MeasuredDrainRateLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The rate at which the queue ahead of a new job of class `c` drains:
  // DrainRateLocked() less the share of recent saturated dispatches that
  // went to classes above c (they keep arriving and overtake it).
  double ClassDrainRateLocked(PriorityClass c) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // How long until `jobs` more jobs have left the queue (1 ms .. 60 s).
  absl::Duration HintLocked(double jobs) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Records a dispatch for the drain rate; `saturated` when it took a job
  // that had waited for a device that just freed up.
  void RecordDispatchLocked(absl::Time now, bool saturated, PriorityClass c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Most devices a gang of this kind ("" = any single kind) can get, of
  // all or of the healthy ones.
  int GangCapacityLocked(const std::string& kind, bool healthy_only) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // "cuda:0 failed: ...; ..." for the failed devices of `kind` ("" = all).
  std::string FailuresLocked(const std::string& kind) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool IdleLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return entries_.empty() && pending_deliveries_ == 0;
  }
  void EnqueueLocked(std::unique_ptr<Job> job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a queued entry; returns its completion with `status`.
  Completion RemoveQueuedLocked(Entry* e, absl::Status status, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `freed_device`: called because a device just became idle.
  void DispatchLocked(bool freed_device = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One DispatchLocked walk: when it runs, why, what it placed so far and
  // the kinds whose idle devices are held for a waiting gang.
  struct DispatchPass {
    absl::Time now;
    bool freed_device = false;
    bool changed = false;
    std::vector<std::string> held;
  };
  // The SAMPLED head when it has waited sampled_promote_after, else null.
  Entry* PromotedHeadLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places queued `e` on idle devices if it fits; otherwise, for a gang,
  // starts or ends its backfill window (pass->held).
  void TryPlaceLocked(Entry* e, DispatchPass* pass)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Idle healthy slots of one kind for `job`'s gang (empty when none fits),
  // skipping held kinds.
  std::vector<int> FindDevicesLocked(const Job& job,
                                     const std::vector<std::string>& held) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void PlaceLocked(Entry* e, std::vector<int> gang, DispatchPass* pass)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether some healthy idle device is of a kind not in `held`.
  bool AnyUsableIdleLocked(const std::vector<std::string>& held) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // After a run: takes the gang's devices whose `health` is not OK out of
  // the pool; true when any device of the gang is out.
  bool TakeOutFailedLocked(const std::vector<int>& gang,
                           const std::vector<absl::Status>& health)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts running `e` back at the head of its class to run once more.
  void RequeueLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes Unavailable every queued job the healthy devices can no
  // longer hold.
  void FailUnplaceableLocked(std::vector<Completion>* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopRunningLocked(Entry* e, absl::StatusCode code)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseDeadlineLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `e`'s job out of entries_ (and its tenant's usage); destroys *e.
  std::unique_ptr<Job> ReleaseEntryLocked(Entry* e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The timer's steps: drops queued jobs that can no longer make their
  // deadline, stops running ones past it; returns the next wake-up time.
  absl::Time ExpireLocked(absl::Time now, std::vector<Completion>* expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CancelLocked(absl::string_view job_id, Entry* e,
                            Completion* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyQueueLocked(PriorityClass c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyDevicesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Deliver(Completion c);  // without the lock
  void WorkerLoop(int slot);
  // Runs `job` on `gang` (led by `slot`) without the lock, then asks the
  // gang's devices for their health. `first_start`: not a retry after a
  // device failure (the listener hears of the start then only).
  void RunJob(const Slot& slot, const std::vector<Device*>& gang, Job* job,
              bool first_start, RunResult* r) ABSL_LOCKS_EXCLUDED(mu_);
  // After a run: the run estimate, failed devices out of the pool, the job
  // completed or run once more, dispatch. Returns what to deliver.
  std::vector<Completion> FinishRunLocked(Entry* e, const Slot& slot,
                                          RunResult r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the gang and takes `e` out with its outcome.
  Completion CompleteRunLocked(Entry* e, const Slot& slot, RunResult r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  const std::array<int64_t, kNumPriorityClasses> max_queued_;
  const int64_t max_queued_bytes_;
  const int64_t interactive_reserved_bytes_;
  const double expiry_lead_;
  const double wait_safety_;
  const double gang_backfill_runs_;
  const absl::Duration sampled_promote_after_;
  SchedulerListener* const listener_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::string> kinds_;  // distinct, in pool order

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> entries_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Entry*> queues_[kNumPriorityClasses] ABSL_GUARDED_BY(mu_);
  using DeadlineSet = std::set<std::tuple<absl::Time, uint64_t, Entry*>>;
  DeadlineSet queued_deadlines_ ABSL_GUARDED_BY(mu_);
  DeadlineSet running_deadlines_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<int64_t, kNumPriorityClasses> class_bytes_ ABSL_GUARDED_BY(mu_) = {
      0, 0};
  struct TenantUsage {
    int64_t jobs = 0;
    int64_t bytes = 0;
  };
  absl::flat_hash_map<std::string, TenantUsage> tenants_ ABSL_GUARDED_BY(mu_);
  int64_t expired_in_queue_ ABSL_GUARDED_BY(mu_) = 0;
  // Drain rate: gaps between saturated dispatches (seconds) and the class
  // each took, newest last; the sum of the gaps and the count per class.
  struct DrainGap {
    double seconds;
    PriorityClass priority;
  };
  std::deque<DrainGap> drain_gaps_ ABSL_GUARDED_BY(mu_);
  double drain_gap_sum_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<int64_t, kNumPriorityClasses> drain_class_count_
      ABSL_GUARDED_BY(mu_) = {};
  absl::Time last_dispatch_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Completions taken out of entries_ whose on_done has not returned yet.
  int64_t pending_deliveries_ ABSL_GUARDED_BY(mu_) = 0;
  double run_estimate_seconds_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_cv_;  // deadlines or the run estimate changed, stopping_
  absl::CondVar space_cv_;  // a queue entry left (SubmitWhenAdmitted)
  absl::CondVar idle_cv_;   // entries_ or pending_deliveries_ shrank
  std::thread timer_;
};

}  // namespace scheduler_internal
}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_SCHEDULER_SCHEDULER_IMPL_H_
