// Scheduler: construction, admission, cancellation, drain and stats. The
// dispatch/worker/timer machinery is in dispatch.cc.
#include "server/scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  if (options.initial_run_estimate <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("initial_run_estimate: must be positive");
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

int SchedulerImpl::GangCapacityLocked(const std::string& kind) const {
  int best = 0;
  for (const std::string& k : kinds_) {
    if (!kind.empty() && k != kind) continue;
    int n = 0;
    for (const auto& slot : slots_) n += slot->kind == k;
    best = std::max(best, n);
  }
  return best;
}

absl::Duration SchedulerImpl::RetryAfterLocked(PriorityClass priority) const {
  // A slot in this class frees up once everything ahead of its tail (all
  // queued jobs of this and higher classes) has been dispatched; the pool
  // drains about devices / run_estimate jobs per second.
  int64_t ahead = 0;
  for (int c = 0; c <= static_cast<int>(priority); ++c) {
    ahead += static_cast<int64_t>(queues_[c].size());
  }
  const double waves =
      std::ceil(static_cast<double>(std::max<int64_t>(ahead, 1)) /
                static_cast<double>(slots_.size()));
  const double seconds =
      std::min(60.0, std::max(0.001, waves * run_estimate_seconds_));
  return absl::Seconds(seconds);
}

static std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / 1048576.0);
}

absl::Status SchedulerImpl::AdmitLocked(PriorityClass priority, int64_t bytes,
                                        const Job* job,
                                        SubmitRejection* rejection) const {
  auto reject = [&](RejectReason reason, absl::Duration retry_after) {
    if (rejection != nullptr) {
      rejection->reason = reason;
      rejection->retry_after = retry_after;
    }
  };
  if (draining_) {
    reject(RejectReason::kDraining, absl::ZeroDuration());
    return absl::UnavailableError("scheduler is draining; not accepting jobs");
  }
  const int c = static_cast<int>(priority);
  if (c < 0 || c >= kNumPriorityClasses) {
    reject(RejectReason::kInvalidArgument, absl::ZeroDuration());
    return absl::InvalidArgumentError(
        absl::StrCat("priority: unknown class ", c));
  }
  if (bytes < 0) {
    reject(RejectReason::kInvalidArgument, absl::ZeroDuration());
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: must be >= 0, got ", bytes));
  }
  if (job != nullptr) {
    if (job->id.empty()) {
      reject(RejectReason::kInvalidArgument, absl::ZeroDuration());
      return absl::InvalidArgumentError("id: empty job id");
    }
    if (job->gang_size < 1) {
      reject(RejectReason::kInvalidArgument, absl::ZeroDuration());
      return absl::InvalidArgumentError(
          absl::StrCat("gang_size: must be >= 1, got ", job->gang_size));
    }
    const int available = GangCapacityLocked(job->device_kind);
    if (available < job->gang_size) {
      reject(RejectReason::kInvalidArgument, absl::ZeroDuration());
      return absl::FailedPreconditionError(absl::StrCat(
          "gang_size: job needs ", job->gang_size, " device(s) of kind \"",
          job->device_kind.empty() ? "any" : job->device_kind,
          "\" but the pool has ", available));
    }
    if (entries_.contains(job->id)) {
      reject(RejectReason::kInvalidArgument, absl::ZeroDuration());
      return absl::AlreadyExistsError(
          absl::StrCat("id: job ", job->id, " is already queued or running"));
    }
    if (job->deadline <= absl::Now()) {
      reject(RejectReason::kDeadline, absl::ZeroDuration());
      return absl::DeadlineExceededError(
          absl::StrCat("deadline: job ", job->id, " expired before admission"));
    }
  }
  if (bytes > max_queued_bytes_) {
    reject(RejectReason::kTooLarge, absl::ZeroDuration());
    return absl::ResourceExhaustedError(absl::StrCat(
        "job of ", bytes, " bytes exceeds the queued-memory budget of ",
        max_queued_bytes_, " bytes"));
  }
  if (static_cast<int64_t>(queues_[c].size()) >= max_queued_[c]) {
    const absl::Duration retry = RetryAfterLocked(priority);
    reject(RejectReason::kQueueFull, retry);
    return absl::ResourceExhaustedError(absl::StrCat(
        "queue ", PriorityClassName(priority), " full (", max_queued_[c],
        " jobs); retry after ~", absl::ToInt64Milliseconds(retry), " ms"));
  }
  if (queued_bytes_ + bytes > max_queued_bytes_) {
    const absl::Duration retry = RetryAfterLocked(priority);
    reject(RejectReason::kMemoryBudget, retry);
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory budget for queued jobs exhausted (", Mib(queued_bytes_), " of ",
        Mib(max_queued_bytes_), " queued, job needs ", Mib(bytes),
        "); retry after ~", absl::ToInt64Milliseconds(retry), " ms"));
  }
  return absl::OkStatus();
}

absl::Status SchedulerImpl::CheckAdmission(PriorityClass priority,
                                           int64_t bytes,
                                           SubmitRejection* rejection) const {
  absl::ReaderMutexLock lock(&mu_);
  return AdmitLocked(priority, bytes, nullptr, rejection);
}

absl::Status SchedulerImpl::Submit(std::unique_ptr<Job> job,
                                   SubmitRejection* rejection) {
  if (job == nullptr) return absl::InvalidArgumentError("job: null");
  SubmitRejection why;
  absl::MutexLock lock(&mu_);
  absl::Status s = AdmitLocked(job->priority, job->bytes, job.get(), &why);
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
    absl::Status s = AdmitLocked(job->priority, job->bytes, job.get(), &why);
    if (s.ok()) break;
    const bool waitable = why.reason == RejectReason::kQueueFull ||
                          why.reason == RejectReason::kMemoryBudget;
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
  e->job = std::move(job);
  entries_[e->job->id] = std::move(entry);
  queues_[static_cast<int>(c)][e->seq] = e;
  if (deadline != absl::InfiniteFuture()) {
    const bool earliest =
        deadlines_.empty() || deadline < std::get<0>(*deadlines_.begin());
    deadlines_.emplace(deadline, e->seq, e);
    if (earliest) timer_cv_.Signal();
  }
  NotifyQueueLocked(c);
  DispatchLocked();
}

void SchedulerImpl::EraseDeadlineLocked(Entry* e) {
  if (e->job->deadline != absl::InfiniteFuture()) {
    deadlines_.erase(std::make_tuple(e->job->deadline, e->seq, e));
  }
}

Completion SchedulerImpl::RemoveQueuedLocked(Entry* e, absl::Status status,
                                             absl::Time now) {
  const PriorityClass c = e->job->priority;
  queues_[static_cast<int>(c)].erase(e->seq);
  queued_bytes_ -= e->job->bytes;
  Completion done;
  done.outcome.job_id = e->job->id;
  done.outcome.priority = c;
  done.outcome.status = std::move(status);
  done.outcome.timings.queue_wait = now - e->enqueued;
  done.outcome.labels = e->job->labels;
  EraseDeadlineLocked(e);
  done.job = std::move(e->job);
  entries_.erase(done.job->id);  // destroys *e
  ++pending_deliveries_;
  idle_cv_.SignalAll();
  space_cv_.SignalAll();
  NotifyQueueLocked(c);
  return done;
}

void SchedulerImpl::StopRunningLocked(Entry* e, absl::StatusCode code) {
  if (e->stop_code == absl::StatusCode::kOk) e->stop_code = code;
  e->job->cancelled.store(true, std::memory_order_relaxed);
}

absl::Status SchedulerImpl::Cancel(absl::string_view job_id) {
  Completion done;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(job_id);
    if (it == entries_.end()) {
      return absl::NotFoundError(
          absl::StrCat("job ", job_id, " is not queued or running"));
    }
    Entry* e = it->second.get();
    if (e->running) {
      StopRunningLocked(e, absl::StatusCode::kCancelled);
      return absl::OkStatus();
    }
    done = RemoveQueuedLocked(e,
                              absl::CancelledError(absl::StrCat(
                                  "job ", job_id, " cancelled while queued")),
                              absl::Now());
    // The removed job may have been a head that could not be placed.
    DispatchLocked();
  }
  Deliver(std::move(done));
  return absl::OkStatus();
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
  s.queued_bytes = queued_bytes_;
  s.max_queued_bytes = max_queued_bytes_;
  s.in_flight = in_flight_;
  s.devices_total = static_cast<int>(slots_.size());
  for (const auto& slot : slots_) s.devices_busy += slot->busy;
  s.draining = draining_;
  return s;
}

std::vector<DeviceInfo> SchedulerImpl::Devices() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<DeviceInfo> out;
  for (const auto& slot : slots_) {
    out.push_back(DeviceInfo{slot->name, slot->kind, slot->busy});
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
    int busy = 0, total = 0;
    for (const auto& slot : slots_) {
      if (slot->kind != kind) continue;
      ++total;
      busy += slot->busy;
    }
    listener_->OnDevicesChanged(kind, busy, total);
  }
}

}  // namespace scheduler_internal
}  // namespace attnaudit::server
