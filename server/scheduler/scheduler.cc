// Scheduler: construction, admission, cancellation, drain and stats. The
// dispatch/worker/timer machinery is in dispatch.cc.
#include "server/scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/status_macros.h"
#include "server/scheduler/scheduler_impl.h"

namespace attnaudit::server {

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    SchedulerOptions options) {
  if (options.devices.empty()) {
    return absl::InvalidArgumentError("devices: the pool needs >= 1 device");
  }
  absl::flat_hash_set<std::string> names;
  for (size_t i = 0; i < options.devices.size(); ++i) {
    if (options.devices[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", i, "]: null device"));
    }
    if (!names.insert(options.devices[i]->name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", i, "]: duplicate device name \"",
                       options.devices[i]->name(), "\""));
    }
  }
  for (int c = 0; c < kNumPriorityClasses; ++c) {
    if (options.max_queued[c] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_queued[", PriorityClassName(static_cast<PriorityClass>(c)),
          "]: must be >= 1, got ", options.max_queued[c]));
    }
  }
  if (options.max_queued_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_queued_bytes: must be >= 1, got ", options.max_queued_bytes));
  }
  if (options.interactive_reserved_bytes < 0 ||
      options.interactive_reserved_bytes >= options.max_queued_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "interactive_reserved_bytes: must be in [0, max_queued_bytes), got ",
        options.interactive_reserved_bytes));
  }
  if (options.initial_run_estimate <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("initial_run_estimate: must be positive");
  }
  if (!(options.expiry_lead >= 0 && options.expiry_lead <= 1)) {
    return absl::InvalidArgumentError("expiry_lead: must be in [0, 1]");
  }
  if (!(options.wait_safety >= 1 && options.wait_safety <= 100)) {
    return absl::InvalidArgumentError("wait_safety: must be in [1, 100]");
  }
  if (!(options.gang_backfill_runs >= 0 && options.gang_backfill_runs <= 1e6)) {
    return absl::InvalidArgumentError(
        "gang_backfill_runs: must be in [0, 1e6]");
  }
  auto impl =
      std::make_unique<scheduler_internal::SchedulerImpl>(std::move(options));
  impl->Start();
  return std::unique_ptr<Scheduler>(std::move(impl));
}

namespace scheduler_internal {

SchedulerImpl::SchedulerImpl(SchedulerOptions options)
    : max_queued_(options.max_queued),
      max_queued_bytes_(options.max_queued_bytes),
      interactive_reserved_bytes_(options.interactive_reserved_bytes),
      expiry_lead_(options.expiry_lead),
      wait_safety_(options.wait_safety),
      gang_backfill_runs_(options.gang_backfill_runs),
      sampled_promote_after_(options.sampled_promote_after),
      listener_(options.listener),
      devices_(std::move(options.devices)),
      run_estimate_seconds_(
          absl::ToDoubleSeconds(options.initial_run_estimate)) {
  absl::MutexLock lock(&mu_);
  for (const auto& d : devices_) {
    auto slot = std::make_unique<Slot>();
    slot->device = d.get();
    slot->kind = d->kind();
    slot->name = d->name();
    slot->job_memory_bytes = d->Describe().job_memory_bytes;
    if (std::find(kinds_.begin(), kinds_.end(), slot->kind) == kinds_.end()) {
      kinds_.push_back(slot->kind);
    }
    slots_.push_back(std::move(slot));
  }
}

void SchedulerImpl::Start() {
  absl::MutexLock lock(&mu_);
  if (listener_ != nullptr) {
    for (int c = 0; c < kNumPriorityClasses; ++c) {
      listener_->OnQueueChanged(static_cast<PriorityClass>(c), 0, 0);
    }
    listener_->OnInFlightChanged(0);
  }
  NotifyDevicesLocked();
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i]->thread =
        std::thread([this, i] { WorkerLoop(static_cast<int>(i)); });
  }
  timer_ = std::thread([this] { TimerLoop(); });
}

SchedulerImpl::~SchedulerImpl() {
  Drain(absl::ZeroDuration()).IgnoreError();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& slot : slots_) {
      slot->cv.SignalAll();
      threads.push_back(std::move(slot->thread));
    }
    timer_cv_.SignalAll();
  }
  for (auto& t : threads) t.join();
  timer_.join();
}

int SchedulerImpl::GangCapacityLocked(const std::string& kind,
                                      bool healthy_only) const {
  int best = 0;
  for (const std::string& k : kinds_) {
    if (!kind.empty() && k != kind) continue;
    int n = 0;
    for (const auto& slot : slots_) {
      n += slot->kind == k && (!healthy_only || slot->health.ok());
    }
    best = std::max(best, n);
  }
  return best;
}

std::string SchedulerImpl::FailuresLocked(const std::string& kind) const {
  std::string out;
  for (const auto& slot : slots_) {
    if (slot->health.ok() || (!kind.empty() && slot->kind != kind)) continue;
    absl::StrAppend(&out, out.empty() ? "" : "; ", slot->name,
                    " failed: ", slot->health.message());
  }
  return out;
}

int64_t SchedulerImpl::ClassBudget(PriorityClass c) const {
  return c == PriorityClass::kInteractive
             ? max_queued_bytes_
             : max_queued_bytes_ - interactive_reserved_bytes_;
}

int64_t SchedulerImpl::AheadLocked(PriorityClass c) const {
  int64_t ahead = 0;
  for (int k = 0; k <= static_cast<int>(c); ++k) {
    ahead += static_cast<int64_t>(queues_[k].size());
  }
  return ahead;
}

double SchedulerImpl::MeasuredDrainRateLocked() const {
  // A few gaps are noise: nothing is measured until there are three.
  if (drain_gaps_.size() >= 3 && drain_gap_sum_ > 0) {
    return static_cast<double>(drain_gaps_.size()) / drain_gap_sum_;
  }
  return 0;
}

double SchedulerImpl::DrainRateLocked() const {
  const double measured = MeasuredDrainRateLocked();
  if (measured > 0) return measured;
  return static_cast<double>(slots_.size()) / run_estimate_seconds_;
}

absl::Duration SchedulerImpl::HintLocked(double jobs) const {
  const double seconds = std::max(jobs, 1.0) / DrainRateLocked();
  return absl::Seconds(std::min(60.0, std::max(0.001, seconds)));
}

double SchedulerImpl::ClassDrainRateLocked(PriorityClass c) const {
  int64_t higher = 0;
  for (int k = 0; k < static_cast<int>(c); ++k) {
    higher += drain_class_count_[k];
  }
  // Until the rate is measured, no share is known; and however busy the
  // classes above, the estimate stays finite (at most 10x).
  const double share_higher = MeasuredDrainRateLocked() > 0
                                  ? static_cast<double>(higher) /
                                        static_cast<double>(drain_gaps_.size())
                                  : 0.0;
  return DrainRateLocked() * std::max(0.1, 1.0 - share_higher);
}

void SchedulerImpl::RecordDispatchLocked(absl::Time now, bool saturated,
                                         PriorityClass c) {
  // The gap since the previous dispatch is one service interval of the
  // pool only when this job was waiting for the device that just freed up.
  if (saturated && last_dispatch_ != absl::InfinitePast()) {
    const double gap = absl::ToDoubleSeconds(now - last_dispatch_);
    drain_gaps_.push_back({gap, c});
    drain_gap_sum_ += gap;
    ++drain_class_count_[static_cast<int>(c)];
    if (static_cast<int>(drain_gaps_.size()) > kDrainWindow) {
      drain_gap_sum_ -= drain_gaps_.front().seconds;
      --drain_class_count_[static_cast<int>(drain_gaps_.front().priority)];
      drain_gaps_.pop_front();
    }
  }
  last_dispatch_ = now;
}

static std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / 1048576.0);
}

static void Reject(SubmitRejection* rejection, RejectReason reason,
                   absl::Duration retry_after) {
  if (rejection != nullptr) {
    rejection->reason = reason;
    rejection->retry_after = retry_after;
  }
}

absl::Status SchedulerImpl::CheckJobLocked(const Job& job,
                                           SubmitRejection* rejection) const {
  if (job.id.empty()) {
    Reject(rejection, RejectReason::kInvalidArgument, absl::ZeroDuration());
    return absl::InvalidArgumentError("id: empty job id");
  }
  if (job.gang_size < 1) {
    Reject(rejection, RejectReason::kInvalidArgument, absl::ZeroDuration());
    return absl::InvalidArgumentError(
        absl::StrCat("gang_size: must be >= 1, got ", job.gang_size));
  }
  const int available = GangCapacityLocked(job.device_kind, false);
  if (available < job.gang_size) {
    Reject(rejection, RejectReason::kInvalidArgument, absl::ZeroDuration());
    return absl::FailedPreconditionError(absl::StrCat(
        "gang_size: job needs ", job.gang_size, " device(s) of kind \"",
        job.device_kind.empty() ? "any" : job.device_kind,
        "\" but the pool has ", available));
  }
  const int healthy = GangCapacityLocked(job.device_kind, true);
  if (healthy < job.gang_size) {
    Reject(rejection, RejectReason::kDevicesFailed, absl::ZeroDuration());
    return absl::UnavailableError(
        absl::StrCat("job needs ", job.gang_size, " device(s) of kind \"",
                     job.device_kind.empty() ? "any" : job.device_kind,
                     "\" but only ", healthy, " of the pool's are healthy (",
                     FailuresLocked(job.device_kind), ")"));
  }
  if (entries_.contains(job.id)) {
    Reject(rejection, RejectReason::kInvalidArgument, absl::ZeroDuration());
    return absl::AlreadyExistsError(
        absl::StrCat("id: job ", job.id, " is already queued or running"));
  }
  if (job.deadline <= absl::Now()) {
    Reject(rejection, RejectReason::kDeadline, absl::ZeroDuration());
    return absl::DeadlineExceededError(
        absl::StrCat("deadline: job ", job.id, " expired before admission"));
  }
  return absl::OkStatus();
}

absl::Status SchedulerImpl::CheckTenantLocked(
    const AdmissionQuery& q, SubmitRejection* rejection) const {
  if (q.quota.max_jobs <= 0 && q.quota.max_bytes <= 0) {
    return absl::OkStatus();
  }
  TenantUsage use;
  if (auto it = tenants_.find(q.tenant); it != tenants_.end()) {
    use = it->second;
  }
  use.jobs += q.held_jobs;
  use.bytes += q.held_bytes;
  const bool jobs_full = q.quota.max_jobs > 0 && use.jobs >= q.quota.max_jobs;
  const bool bytes_full =
      q.quota.max_bytes > 0 && use.bytes + q.bytes > q.quota.max_bytes;
  if (!jobs_full && !bytes_full) return absl::OkStatus();
  if (bytes_full && q.bytes > q.quota.max_bytes) {
    Reject(rejection, RejectReason::kTooLarge, absl::ZeroDuration());
    return absl::ResourceExhaustedError(
        absl::StrCat("job of ", Mib(q.bytes), " exceeds the tenant's quota of ",
                     Mib(q.quota.max_bytes), " in flight"));
  }
  // One of the tenant's jobs must finish first.
  const absl::Duration retry = HintLocked(1);
  Reject(rejection, RejectReason::kTenantQuota, retry);
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant quota: ",
      jobs_full ? absl::StrCat(use.jobs, " of ", q.quota.max_jobs, " jobs")
                : absl::StrCat(Mib(use.bytes), " of ", Mib(q.quota.max_bytes)),
      " in flight; retry after ~", absl::ToInt64Milliseconds(retry), " ms"));
}

absl::Status SchedulerImpl::CheckCapacityLocked(
    const AdmissionQuery& q, SubmitRejection* rejection) const {
  const int c = static_cast<int>(q.priority);
  if (static_cast<int64_t>(queues_[c].size()) >= max_queued_[c]) {
    // Room appears once the jobs above this class and one of its own left.
    const absl::Duration retry = HintLocked(static_cast<double>(
        AheadLocked(q.priority) - static_cast<int64_t>(queues_[c].size()) + 1));
    Reject(rejection, RejectReason::kQueueFull, retry);
    return absl::ResourceExhaustedError(absl::StrCat(
        "queue ", PriorityClassName(q.priority), " full (", max_queued_[c],
        " jobs); retry after ~", absl::ToInt64Milliseconds(retry), " ms"));
  }
  const int64_t class_over =
      class_bytes_[c] + q.bytes - ClassBudget(q.priority);
  const int64_t total_over = queued_bytes_ + q.bytes - max_queued_bytes_;
  if (class_over > 0 || total_over > 0) {
    const int64_t jobs = AheadLocked(q.priority);
    const double per_job =
        jobs > 0 ? static_cast<double>(queued_bytes_) / jobs : 1.0;
    const absl::Duration retry = HintLocked(
        std::ceil(static_cast<double>(std::max(class_over, total_over)) /
                  std::max(per_job, 1.0)));
    Reject(rejection, RejectReason::kMemoryBudget, retry);
    return absl::ResourceExhaustedError(
        absl::StrCat("memory budget for queued ", PriorityClassName(q.priority),
                     " jobs exhausted (", Mib(class_bytes_[c]), " of ",
                     Mib(ClassBudget(q.priority)), " queued in the class, ",
                     Mib(queued_bytes_), " of ", Mib(max_queued_bytes_),
                     " in all; job needs ", Mib(q.bytes), "); retry after ~",
                     absl::ToInt64Milliseconds(retry), " ms"));
  }
  return absl::OkStatus();
}

absl::Status SchedulerImpl::CheckWaitLocked(const AdmissionQuery& q,
                                            SubmitRejection* rejection) const {
  if (q.deadline == absl::InfiniteFuture()) return absl::OkStatus();
  const int64_t ahead = AheadLocked(q.priority);
  if (ahead == 0) return absl::OkStatus();  // nothing to wait for: try it
  const double wait = wait_safety_ * static_cast<double>(ahead) /
                      ClassDrainRateLocked(q.priority);
  const double left = absl::ToDoubleSeconds(q.deadline - absl::Now());
  if (wait + run_estimate_seconds_ <= left) return absl::OkStatus();
  // Retrying helps once enough of the queue ahead has drained.
  const double excess = wait + run_estimate_seconds_ - left;
  const absl::Duration retry =
      absl::Seconds(std::min(60.0, std::max(0.001, excess)));
  Reject(rejection, RejectReason::kWouldExpire, retry);
  return absl::ResourceExhaustedError(absl::StrCat(
      "queue ", PriorityClassName(q.priority), ": ", ahead,
      " job(s) ahead need ~", static_cast<int64_t>(wait * 1000),
      " ms, past the deadline in ", static_cast<int64_t>(left * 1000),
      " ms; retry after ~", absl::ToInt64Milliseconds(retry), " ms"));
}

absl::Status SchedulerImpl::AdmitLocked(const AdmissionQuery& q, const Job* job,
                                        bool for_resume,
                                        SubmitRejection* rejection) const {
  if (draining_) {
    Reject(rejection, RejectReason::kDraining, absl::ZeroDuration());
    return absl::UnavailableError("scheduler is draining; not accepting jobs");
  }
  const int c = static_cast<int>(q.priority);
  if (c < 0 || c >= kNumPriorityClasses) {
    Reject(rejection, RejectReason::kInvalidArgument, absl::ZeroDuration());
    return absl::InvalidArgumentError(
        absl::StrCat("priority: unknown class ", c));
  }
  if (q.bytes < 0 || q.quota.max_jobs < 0 || q.quota.max_bytes < 0) {
    Reject(rejection, RejectReason::kInvalidArgument, absl::ZeroDuration());
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes/quota: must be >= 0, got bytes ", q.bytes, ", max_jobs ",
        q.quota.max_jobs, ", max_bytes ", q.quota.max_bytes));
  }
  if (job != nullptr) {
    ATTNAUDIT_RETURN_IF_ERROR(CheckJobLocked(*job, rejection));
  }
  if (q.bytes > ClassBudget(q.priority)) {
    Reject(rejection, RejectReason::kTooLarge, absl::ZeroDuration());
    return absl::ResourceExhaustedError(absl::StrCat(
        "job of ", q.bytes, " bytes exceeds the queued-memory budget of ",
        ClassBudget(q.priority), " bytes for ", PriorityClassName(q.priority),
        " jobs"));
  }
  ATTNAUDIT_RETURN_IF_ERROR(CheckTenantLocked(q, rejection));
  ATTNAUDIT_RETURN_IF_ERROR(CheckCapacityLocked(q, rejection));
  if (!for_resume) ATTNAUDIT_RETURN_IF_ERROR(CheckWaitLocked(q, rejection));
  return absl::OkStatus();
}

static AdmissionQuery QueryOf(const Job& job) {
  AdmissionQuery q;
  q.priority = job.priority;
  q.bytes = job.bytes;
  q.tenant = job.tenant;
  q.quota = job.quota;
  q.deadline = job.deadline;
  q.held_jobs = job.held_jobs_elsewhere;
  q.held_bytes = job.held_bytes_elsewhere;
  return q;
}

absl::Status SchedulerImpl::CheckAdmission(const AdmissionQuery& query,
                                           SubmitRejection* rejection) const {
  absl::ReaderMutexLock lock(&mu_);
  return AdmitLocked(query, nullptr, /*for_resume=*/false, rejection);
}

absl::Status SchedulerImpl::Submit(std::unique_ptr<Job> job,
                                   SubmitRejection* rejection) {
  if (job == nullptr) return absl::InvalidArgumentError("job: null");
  SubmitRejection why;
  absl::MutexLock lock(&mu_);
  absl::Status s = AdmitLocked(QueryOf(*job), job.get(), false, &why);
  if (!s.ok()) {
    if (rejection != nullptr) *rejection = why;
    if (listener_ != nullptr) listener_->OnRejected(why.reason);
    return s;  // the lock is released before `job` is destroyed
  }
  EnqueueLocked(std::move(job));
  return absl::OkStatus();
}

absl::Status SchedulerImpl::SubmitWhenAdmitted(std::unique_ptr<Job> job,
                                               absl::Time wait_until) {
  if (job == nullptr) return absl::InvalidArgumentError("job: null");
  SubmitRejection why;
  absl::MutexLock lock(&mu_);
  while (true) {
    absl::Status s = AdmitLocked(QueryOf(*job), job.get(), true, &why);
    if (s.ok()) break;
    const bool waitable = why.reason == RejectReason::kQueueFull ||
                          why.reason == RejectReason::kMemoryBudget ||
                          why.reason == RejectReason::kTenantQuota;
    if (!waitable || absl::Now() >= wait_until) {
      if (listener_ != nullptr) listener_->OnRejected(why.reason);
      return s;
    }
    space_cv_.WaitWithDeadline(&mu_, wait_until);
  }
  EnqueueLocked(std::move(job));
  return absl::OkStatus();
}

void SchedulerImpl::EnqueueLocked(std::unique_ptr<Job> job) {
  auto entry = std::make_unique<Entry>();
  Entry* e = entry.get();
  e->seq = next_seq_++;
  e->enqueued = absl::Now();
  job->options.cancelled = &job->cancelled;
  const PriorityClass c = job->priority;
  const absl::Time deadline = job->deadline;
  queued_bytes_ += job->bytes;
  class_bytes_[static_cast<int>(c)] += job->bytes;
  TenantUsage& use = tenants_[job->tenant];
  ++use.jobs;
  use.bytes += job->bytes;
  e->job = std::move(job);
  entries_[e->job->id] = std::move(entry);
  queues_[static_cast<int>(c)][e->seq] = e;
  if (deadline != absl::InfiniteFuture()) {
    queued_deadlines_.emplace(deadline, e->seq, e);
    timer_cv_.Signal();  // it may be due before the timer's next wake-up
  }
  NotifyQueueLocked(c);
  DispatchLocked();
}

void SchedulerImpl::EraseDeadlineLocked(Entry* e) {
  if (e->job->deadline == absl::InfiniteFuture()) return;
  const auto key = std::make_tuple(e->job->deadline, e->seq, e);
  queued_deadlines_.erase(key);
  running_deadlines_.erase(key);
}

std::unique_ptr<Job> SchedulerImpl::ReleaseEntryLocked(Entry* e) {
  EraseDeadlineLocked(e);
  std::unique_ptr<Job> job = std::move(e->job);
  auto it = tenants_.find(job->tenant);
  if (it != tenants_.end()) {
    it->second.bytes -= job->bytes;
    if (--it->second.jobs <= 0) tenants_.erase(it);
  }
  entries_.erase(job->id);  // destroys *e
  ++pending_deliveries_;
  idle_cv_.SignalAll();
  space_cv_.SignalAll();  // tenant room for SubmitWhenAdmitted
  return job;
}

Completion SchedulerImpl::RemoveQueuedLocked(Entry* e, absl::Status status,
                                             absl::Time now) {
  const PriorityClass c = e->job->priority;
  queues_[static_cast<int>(c)].erase(e->seq);
  queued_bytes_ -= e->job->bytes;
  class_bytes_[static_cast<int>(c)] -= e->job->bytes;
  Completion done;
  done.outcome.job_id = e->job->id;
  done.outcome.priority = c;
  done.outcome.status = std::move(status);
  done.outcome.timings.queue_wait = now - e->enqueued;
  done.outcome.labels = e->job->labels;
  done.outcome.tenant = e->job->tenant;
  done.job = ReleaseEntryLocked(e);
  NotifyQueueLocked(c);
  return done;
}

void SchedulerImpl::StopRunningLocked(Entry* e, absl::StatusCode code) {
  if (e->stop_code == absl::StatusCode::kOk) e->stop_code = code;
  e->job->cancelled.store(true, std::memory_order_relaxed);
}

static absl::Status NotQueuedOrRunning(absl::string_view job_id) {
  return absl::NotFoundError(
      absl::StrCat("job ", job_id, " is not queued or running"));
}

absl::Status SchedulerImpl::CancelLocked(absl::string_view job_id, Entry* entry,
                                         Completion* done) {
  if (entry->running) {
    StopRunningLocked(entry, absl::StatusCode::kCancelled);
    return absl::OkStatus();
  }
  *done = RemoveQueuedLocked(entry,
                             absl::CancelledError(absl::StrCat(
                                 "job ", job_id, " cancelled while queued")),
                             absl::Now());
  // The removed job may have been a head that could not be placed.
  DispatchLocked();
  return absl::OkStatus();
}

absl::Status SchedulerImpl::Cancel(absl::string_view job_id) {
  Completion done;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(job_id);
    if (it == entries_.end()) return NotQueuedOrRunning(job_id);
    ATTNAUDIT_RETURN_IF_ERROR(CancelLocked(job_id, it->second.get(), &done));
  }
  if (done.job != nullptr) Deliver(std::move(done));
  return absl::OkStatus();
}

absl::Status SchedulerImpl::CancelOwned(absl::string_view job_id,
                                        absl::string_view tenant) {
  Completion done;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(job_id);
    if (it == entries_.end() || it->second->job->tenant != tenant) {
      return NotQueuedOrRunning(job_id);
    }
    ATTNAUDIT_RETURN_IF_ERROR(CancelLocked(job_id, it->second.get(), &done));
  }
  if (done.job != nullptr) Deliver(std::move(done));
  return absl::OkStatus();
}

absl::StatusOr<std::string> SchedulerImpl::OwnerOf(
    absl::string_view job_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = entries_.find(job_id);
  if (it == entries_.end()) return NotQueuedOrRunning(job_id);
  return it->second->job->tenant;
}

absl::Status SchedulerImpl::Drain(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<Completion> dropped;
  int64_t unfinished = 0;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    space_cv_.SignalAll();  // SubmitWhenAdmitted waiters now fail
    while (!IdleLocked() && absl::Now() < deadline) {
      idle_cv_.WaitWithDeadline(&mu_, deadline);
    }
    if (IdleLocked()) return absl::OkStatus();
    unfinished = static_cast<int64_t>(entries_.size());
    const absl::Time now = absl::Now();
    for (auto& queue : queues_) {
      while (!queue.empty()) {
        dropped.push_back(RemoveQueuedLocked(
            queue.begin()->second,
            absl::UnavailableError("scheduler drained before the job started"),
            now));
      }
    }
    for (auto& kv : entries_) {
      StopRunningLocked(kv.second.get(), absl::StatusCode::kUnavailable);
    }
  }
  for (auto& c : dropped) Deliver(std::move(c));
  {
    absl::MutexLock lock(&mu_);
    while (!IdleLocked()) idle_cv_.Wait(&mu_);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("drain: ", unfinished, " job(s) had not finished within ",
                   absl::FormatDuration(timeout), "; they ended UNAVAILABLE"));
}

SchedulerStats SchedulerImpl::Stats() const {
  absl::ReaderMutexLock lock(&mu_);
  SchedulerStats s;
  for (int c = 0; c < kNumPriorityClasses; ++c) {
    s.queued[c] = static_cast<int64_t>(queues_[c].size());
  }
  s.max_queued = max_queued_;
  s.class_queued_bytes = class_bytes_;
  s.queued_bytes = queued_bytes_;
  s.max_queued_bytes = max_queued_bytes_;
  s.interactive_reserved_bytes = interactive_reserved_bytes_;
  s.in_flight = in_flight_;
  s.expired_in_queue = expired_in_queue_;
  s.drain_rate = MeasuredDrainRateLocked();
  s.devices_total = static_cast<int>(slots_.size());
  for (const auto& slot : slots_) {
    s.devices_busy += slot->busy;
    s.devices_failed += !slot->health.ok();
  }
  s.draining = draining_;
  return s;
}

std::vector<DeviceInfo> SchedulerImpl::Devices() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<DeviceInfo> out;
  for (const auto& slot : slots_) {
    out.push_back(DeviceInfo{
        slot->name, slot->kind, slot->busy, !slot->health.ok(),
        std::string(slot->health.message()), slot->job_memory_bytes});
  }
  return out;
}

void SchedulerImpl::NotifyQueueLocked(PriorityClass c) {
  if (listener_ == nullptr) return;
  listener_->OnQueueChanged(
      c, static_cast<int64_t>(queues_[static_cast<int>(c)].size()),
      queued_bytes_);
}

void SchedulerImpl::NotifyDevicesLocked() {
  if (listener_ == nullptr) return;
  for (const std::string& kind : kinds_) {
    int busy = 0, failed = 0, total = 0;
    for (const auto& slot : slots_) {
      if (slot->kind != kind) continue;
      ++total;
      if (!slot->health.ok()) {
        ++failed;
      } else {
        busy += slot->busy;
      }
    }
    listener_->OnDevicesChanged(kind, busy, failed, total);
  }
}

}  // namespace scheduler_internal
}  // namespace attnaudit::server
