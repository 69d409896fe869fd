// Scheduler: dispatch to the device pool, the worker threads (one per
// device), the deadline timer thread, and delivery of completions.
#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/scheduler/scheduler_impl.h"

namespace attnaudit::server {
namespace scheduler_internal {

Entry* SchedulerImpl::NextHeadLocked(absl::Time now) {
  const auto& interactive =
      queues_[static_cast<int>(PriorityClass::kInteractive)];
  const auto& sampled = queues_[static_cast<int>(PriorityClass::kSampled)];
  Entry* i = interactive.empty() ? nullptr : interactive.begin()->second;
  Entry* s = sampled.empty() ? nullptr : sampled.begin()->second;
  if (i != nullptr && s != nullptr &&
      sampled_promote_after_ != absl::InfiniteDuration() &&
      s->enqueued + sampled_promote_after_ <= now) {
    return s;  // aged: goes before the interactive head
  }
  return i != nullptr ? i : s;
}

void SchedulerImpl::DispatchLocked(bool freed_device) {
  if (stopping_) return;
  const absl::Time now = absl::Now();
  bool changed = false;
  while (true) {
    Entry* head = NextHeadLocked(now);
    if (head == nullptr) break;
    const Job& job = *head->job;
    // Idle devices of one kind, enough for the gang. Jobs without a kind
    // take the first kind (in pool order) that has enough idle devices.
    std::vector<int> gang;
    for (const std::string& kind : kinds_) {
      if (!job.device_kind.empty() && kind != job.device_kind) continue;
      gang.clear();
      for (size_t i = 0;
           i < slots_.size() && static_cast<int>(gang.size()) < job.gang_size;
           ++i) {
        if (!slots_[i]->busy && slots_[i]->kind == kind) {
          gang.push_back(static_cast<int>(i));
        }
      }
      if (static_cast<int>(gang.size()) == job.gang_size) break;
    }
    // The head waits for its devices; nothing behind it overtakes it.
    if (static_cast<int>(gang.size()) != job.gang_size) break;

    const PriorityClass c = job.priority;
    queues_[static_cast<int>(c)].erase(head->seq);
    queued_bytes_ -= job.bytes;
    class_bytes_[static_cast<int>(c)] -= job.bytes;
    if (job.deadline != absl::InfiniteFuture()) {
      const auto key = std::make_tuple(job.deadline, head->seq, head);
      queued_deadlines_.erase(key);
      running_deadlines_.insert(key);
    }
    // Only the first job placed on the freed device waited for it.
    RecordDispatchLocked(now, freed_device && !changed && head->enqueued < now,
                         c);
    head->running = true;
    head->gang = gang;
    for (int g : gang) slots_[g]->busy = true;
    slots_[gang[0]]->assigned = head;
    slots_[gang[0]]->cv.Signal();
    ++in_flight_;
    space_cv_.SignalAll();
    NotifyQueueLocked(c);
    changed = true;
  }
  if (changed) {
    if (listener_ != nullptr) listener_->OnInFlightChanged(in_flight_);
    NotifyDevicesLocked();
  }
}

static absl::Status StopStatus(absl::StatusCode code, const std::string& id,
                               bool ran) {
  const char* when = ran ? "while running" : "before it started";
  switch (code) {
    case absl::StatusCode::kCancelled:
      return absl::CancelledError(
          absl::StrCat("job ", id, " cancelled ", when));
    case absl::StatusCode::kDeadlineExceeded:
      return absl::DeadlineExceededError(
          absl::StrCat("job ", id, ": deadline passed ", when));
    default:
      return absl::UnavailableError(
          absl::StrCat("job ", id, ": scheduler drained ", when));
  }
}

void SchedulerImpl::WorkerLoop(int index) {
  mu_.Lock();
  Slot* slot = slots_[index].get();
  while (true) {
    while (slot->assigned == nullptr && !stopping_) slot->cv.Wait(&mu_);
    if (slot->assigned == nullptr) break;  // stopping
    Entry* e = slot->assigned;
    slot->assigned = nullptr;
    Job* job = e->job.get();
    std::vector<Device*> gang;
    for (int g : e->gang) gang.push_back(slots_[g]->device);
    const absl::Duration queue_wait = absl::Now() - e->enqueued;
    mu_.Unlock();

    absl::StatusOr<AuditReport> result =
        absl::UnknownError("the job did not run");
    bool ran = false;
    absl::Duration run = absl::ZeroDuration();
    // A job stopped between dispatch and here never runs.
    if (!job->cancelled.load(std::memory_order_relaxed)) {
      if (job->on_start) job->on_start(*job, slot->name);
      if (listener_ != nullptr)
        listener_->OnStarted(*job, slot->kind, queue_wait);
      const absl::Time t0 = absl::Now();
      result = gang.size() == 1
                   ? gang[0]->Run(job->snapshot, job->options)
                   : gang[0]->RunGang(gang, job->snapshot, job->options);
      run = absl::Now() - t0;
      ran = true;
    }

    mu_.Lock();
    Completion done;
    JobOutcome& out = done.outcome;
    out.job_id = job->id;
    out.priority = job->priority;
    out.ran = ran;
    out.device_kind = slot->kind;
    out.device_name = slot->name;
    out.labels = job->labels;
    out.timings.queue_wait = queue_wait;
    out.timings.run = run;
    if (e->stop_code != absl::StatusCode::kOk) {
      out.status = StopStatus(e->stop_code, job->id, ran);
    } else if (!result.ok()) {
      out.status = result.status();
    } else {
      out.report = *std::move(result);
    }
    out.tenant = job->tenant;
    if (ran) {
      // Exponential moving average for retry hints and deadline checks;
      // the timer's next wake-up depends on it.
      run_estimate_seconds_ =
          0.8 * run_estimate_seconds_ + 0.2 * absl::ToDoubleSeconds(run);
      timer_cv_.Signal();
    }
    for (int g : e->gang) slots_[g]->busy = false;
    --in_flight_;
    done.job = ReleaseEntryLocked(e);
    if (listener_ != nullptr) listener_->OnInFlightChanged(in_flight_);
    NotifyDevicesLocked();
    DispatchLocked(/*freed_device=*/true);
    mu_.Unlock();
    Deliver(std::move(done));
    mu_.Lock();
  }
  mu_.Unlock();
}

absl::Time SchedulerImpl::ExpireLocked(absl::Time now,
                                       std::vector<Completion>* expired) {
  // A queued job leaves once it could not finish even if started now.
  const absl::Duration lead =
      absl::Seconds(expiry_lead_ * run_estimate_seconds_);
  while (!queued_deadlines_.empty() &&
         std::get<0>(*queued_deadlines_.begin()) - lead <= now) {
    Entry* e = std::get<2>(*queued_deadlines_.begin());
    const absl::Duration waited = now - e->enqueued;
    const absl::Duration left = e->job->deadline - now;
    ++expired_in_queue_;
    expired->push_back(RemoveQueuedLocked(
        e,
        absl::DeadlineExceededError(absl::StrCat(
            "job ", e->job->id, ": deadline ",
            left > absl::ZeroDuration()
                ? absl::StrCat("could no longer be met (",
                               absl::ToInt64Milliseconds(left),
                               " ms left, a run takes ~",
                               absl::ToInt64Milliseconds(
                                   absl::Seconds(run_estimate_seconds_)),
                               " ms)")
                : std::string("expired"),
            " after ", absl::ToInt64Milliseconds(waited), " ms in queue ",
            PriorityClassName(e->job->priority), "; it never ran")),
        now));
  }
  while (!running_deadlines_.empty() &&
         std::get<0>(*running_deadlines_.begin()) <= now) {
    Entry* e = std::get<2>(*running_deadlines_.begin());
    running_deadlines_.erase(running_deadlines_.begin());
    StopRunningLocked(e, absl::StatusCode::kDeadlineExceeded);
  }
  absl::Time next = absl::InfiniteFuture();
  if (!queued_deadlines_.empty()) {
    next = std::get<0>(*queued_deadlines_.begin()) - lead;
  }
  if (!running_deadlines_.empty()) {
    next = std::min(next, std::get<0>(*running_deadlines_.begin()));
  }
  return next;
}

void SchedulerImpl::TimerLoop() {
  mu_.Lock();
  while (!stopping_) {
    std::vector<Completion> expired;
    const absl::Time next = ExpireLocked(absl::Now(), &expired);
    if (!expired.empty()) {
      DispatchLocked();  // an expired head may have blocked others
      mu_.Unlock();
      for (auto& c : expired) Deliver(std::move(c));
      mu_.Lock();
      continue;
    }
    timer_cv_.WaitWithDeadline(&mu_, next);
  }
  mu_.Unlock();
}

void SchedulerImpl::Deliver(Completion c) {
  if (listener_ != nullptr) listener_->OnFinished(c.outcome);
  if (c.job->on_done) c.job->on_done(c.outcome);
  c.job.reset();  // frees the snapshot before Drain can return
  absl::MutexLock lock(&mu_);
  --pending_deliveries_;
  idle_cv_.SignalAll();
}

}  // namespace scheduler_internal
}  // namespace attnaudit::server
