// Internal: the Scheduler implementation's state. Not part of the public
// interface (include server/scheduler/scheduler.h instead).
//
// Every job Submit accepted has one Entry in entries_ until its completion
// is delivered. A queued entry is also in queues_[class] (FIFO by seq); a
// running one is assigned to the slot of its gang leader. Entries with a
// finite deadline are in deadlines_ while queued or running.
#ifndef ATTNAUDIT_SERVER_SCHEDULER_SCHEDULER_IMPL_H_
#define ATTNAUDIT_SERVER_SCHEDULER_SCHEDULER_IMPL_H_

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
  // Why `job->cancelled` was set (first reason wins): kCancelled,
  // kDeadlineExceeded or kUnavailable; kOk while not set.
  absl::StatusCode stop_code = absl::StatusCode::kOk;
};

// A completion to deliver outside the lock.
struct Completion {
  std::unique_ptr<Job> job;
  JobOutcome outcome;
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
  absl::Status CheckAdmission(PriorityClass priority, int64_t bytes,
                              SubmitRejection* rejection) const override;
  absl::Status Cancel(absl::string_view job_id) override;
  absl::Status Drain(absl::Duration timeout) override;
  SchedulerStats Stats() const override;
  std::vector<DeviceInfo> Devices() const override;

 private:
  struct Slot {
    Device* device = nullptr;
    std::string kind;
    std::string name;
    bool busy = false;          // running a job or reserved for a gang
    Entry* assigned = nullptr;  // set for the leader until its worker takes it
    absl::CondVar cv;
    std::thread thread;
  };

  // Admission rules without side effects. `job` may be null (CheckAdmission).
  absl::Status AdmitLocked(PriorityClass priority, int64_t bytes,
                           const Job* job, SubmitRejection* rejection) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Duration RetryAfterLocked(PriorityClass priority) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Most devices a gang of this kind ("" = any single kind) can get.
  int GangCapacityLocked(const std::string& kind) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool IdleLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return entries_.empty() && pending_deliveries_ == 0;
  }
  void EnqueueLocked(std::unique_ptr<Job> job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a queued entry; returns its completion with `status`.
  Completion RemoveQueuedLocked(Entry* e, absl::Status status, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DispatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* NextHeadLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopRunningLocked(Entry* e, absl::StatusCode code)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseDeadlineLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyQueueLocked(PriorityClass c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyDevicesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Deliver(Completion c);  // without the lock
  void WorkerLoop(int slot);
  void TimerLoop();

  const std::array<int64_t, kNumPriorityClasses> max_queued_;
  const int64_t max_queued_bytes_;
  const absl::Duration sampled_promote_after_;
  SchedulerListener* const listener_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::string> kinds_;  // distinct, in pool order

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> entries_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Entry*> queues_[kNumPriorityClasses] ABSL_GUARDED_BY(mu_);
  std::set<std::tuple<absl::Time, uint64_t, Entry*>> deadlines_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Completions taken out of entries_ whose on_done has not returned yet.
  int64_t pending_deliveries_ ABSL_GUARDED_BY(mu_) = 0;
  double run_estimate_seconds_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_cv_;  // deadlines_ changed or stopping_
  absl::CondVar space_cv_;  // a queue entry left (SubmitWhenAdmitted)
  absl::CondVar idle_cv_;   // entries_ or pending_deliveries_ shrank
  std::thread timer_;
};

}  // namespace scheduler_internal
}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_SCHEDULER_SCHEDULER_IMPL_H_
