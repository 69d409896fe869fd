// Scheduler: dispatch to the device pool, the worker threads (one per
// device), the deadline timer thread, and delivery of completions.
#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/log/log.h"
#include "server/scheduler/scheduler_impl.h"

namespace attnaudit::server {
namespace scheduler_internal {

Entry* SchedulerImpl::PromotedHeadLocked(absl::Time now) {
  const auto& interactive =
      queues_[static_cast<int>(PriorityClass::kInteractive)];
  const auto& sampled = queues_[static_cast<int>(PriorityClass::kSampled)];
  if (interactive.empty() || sampled.empty() ||
      sampled_promote_after_ == absl::InfiniteDuration()) {
    return nullptr;
  }
  Entry* s = sampled.begin()->second;
  return s->enqueued + sampled_promote_after_ <= now ? s : nullptr;
}

static bool Holds(const std::vector<std::string>& held,
                  const std::string& kind) {
  return std::find(held.begin(), held.end(), kind) != held.end();
}

bool SchedulerImpl::AnyUsableIdleLocked(
    const std::vector<std::string>& held) const {
  for (const auto& slot : slots_) {
    if (!slot->busy && slot->health.ok() && !Holds(held, slot->kind)) {
      return true;
    }
  }
  return false;
}

std::vector<int> SchedulerImpl::FindDevicesLocked(
    const Job& job, const std::vector<std::string>& held) const {
  // Jobs without a kind take the first kind (in pool order) that has
  // enough idle devices.
  std::vector<int> gang;
  for (const std::string& kind : kinds_) {
    if (!job.device_kind.empty() && kind != job.device_kind) continue;
    if (Holds(held, kind)) continue;
    gang.clear();
    for (size_t i = 0;
         i < slots_.size() && static_cast<int>(gang.size()) < job.gang_size;
         ++i) {
      const Slot& slot = *slots_[i];
      if (!slot.busy && slot.health.ok() && slot.kind == kind) {
        gang.push_back(static_cast<int>(i));
      }
    }
    if (static_cast<int>(gang.size()) == job.gang_size) return gang;
  }
  return {};
}

void SchedulerImpl::PlaceLocked(Entry* e, std::vector<int> gang,
                                DispatchPass* pass) {
  const Job& job = *e->job;
  const PriorityClass c = job.priority;
  queues_[static_cast<int>(c)].erase(e->seq);
  queued_bytes_ -= job.bytes;
  class_bytes_[static_cast<int>(c)] -= job.bytes;
  if (job.deadline != absl::InfiniteFuture()) {
    const auto key = std::make_tuple(job.deadline, e->seq, e);
    queued_deadlines_.erase(key);
    running_deadlines_.insert(key);
  }
  // Only the first job placed on the freed device waited for it.
  RecordDispatchLocked(
      pass->now,
      pass->freed_device && !pass->changed && e->enqueued < pass->now, c);
  e->running = true;
  e->blocked_since = absl::InfinitePast();
  e->gang = std::move(gang);
  for (int g : e->gang) slots_[g]->busy = true;
  slots_[e->gang[0]]->assigned = e;
  slots_[e->gang[0]]->cv.Signal();
  ++in_flight_;
  space_cv_.SignalAll();
  NotifyQueueLocked(c);
  pass->changed = true;
}

void SchedulerImpl::TryPlaceLocked(Entry* e, DispatchPass* pass) {
  const Job& job = *e->job;
  std::vector<int> gang = FindDevicesLocked(job, pass->held);
  if (!gang.empty()) {
    PlaceLocked(e, std::move(gang), pass);
    return;
  }
  // A single job that does not fit found no idle device of its kind, so
  // nothing later of that kind fits either: it is overtaken by nothing.
  if (job.gang_size == 1) return;
  // A gang waits for devices to free up; jobs behind it may use the idle
  // ones until its backfill window closes, then they are held for it.
  if (e->blocked_since == absl::InfinitePast()) e->blocked_since = pass->now;
  const absl::Duration window =
      absl::Seconds(gang_backfill_runs_ * run_estimate_seconds_);
  if (pass->now - e->blocked_since < window) return;
  for (const std::string& kind : kinds_) {
    if (job.device_kind.empty() || kind == job.device_kind) {
      if (!Holds(pass->held, kind)) pass->held.push_back(kind);
    }
  }
}

void SchedulerImpl::DispatchLocked(bool freed_device) {
  if (stopping_) return;
  DispatchPass pass;
  pass.now = absl::Now();
  pass.freed_device = freed_device;
  if (Entry* promoted = PromotedHeadLocked(pass.now)) {
    TryPlaceLocked(promoted, &pass);
  }
  for (auto& queue : queues_) {
    for (auto it = queue.begin();
         it != queue.end() && AnyUsableIdleLocked(pass.held);) {
      Entry* e = it->second;
      ++it;  // placing `e` erases it from the queue
      TryPlaceLocked(e, &pass);
    }
  }
  if (pass.changed) {
    if (listener_ != nullptr) listener_->OnInFlightChanged(in_flight_);
    NotifyDevicesLocked();
  }
}

bool SchedulerImpl::TakeOutFailedLocked(
    const std::vector<int>& gang, const std::vector<absl::Status>& health) {
  bool any = false;
  for (size_t i = 0; i < gang.size(); ++i) {
    Slot& slot = *slots_[gang[i]];
    if (slot.health.ok() && i < health.size() && !health[i].ok()) {
      slot.health = health[i];
      ATTNAUDIT_LOG(err, "device failed; taken out of the pool")
          .Kv("device", slot.name)
          .Kv("kind", slot.kind)
          .Kv("status", slot.health);
      if (listener_ != nullptr) {
        listener_->OnDeviceFailed(slot.name, slot.kind, slot.health);
      }
    }
    any = any || !slot.health.ok();
  }
  return any;
}

void SchedulerImpl::RequeueLocked(Entry* e) {
  const Job& job = *e->job;
  const PriorityClass c = job.priority;
  for (int g : e->gang) slots_[g]->busy = false;
  e->gang.clear();
  e->running = false;
  e->retried = true;
  --in_flight_;
  // Its old seq puts it back at the head of its class: it was admitted
  // before everything still queued there.
  queues_[static_cast<int>(c)][e->seq] = e;
  queued_bytes_ += job.bytes;
  class_bytes_[static_cast<int>(c)] += job.bytes;
  if (job.deadline != absl::InfiniteFuture()) {
    const auto key = std::make_tuple(job.deadline, e->seq, e);
    running_deadlines_.erase(key);
    queued_deadlines_.insert(key);
    timer_cv_.Signal();
  }
  NotifyQueueLocked(c);
}

void SchedulerImpl::FailUnplaceableLocked(std::vector<Completion>* done) {
  const absl::Time now = absl::Now();
  for (auto& queue : queues_) {
    for (auto it = queue.begin(); it != queue.end();) {
      Entry* e = it->second;
      ++it;  // RemoveQueuedLocked erases `e`
      const Job& job = *e->job;
      if (GangCapacityLocked(job.device_kind, true) >= job.gang_size) continue;
      done->push_back(RemoveQueuedLocked(
          e,
          absl::UnavailableError(
              absl::StrCat("job ", job.id, " needs ", job.gang_size,
                           " healthy device(s) of kind \"",
                           job.device_kind.empty() ? "any" : job.device_kind,
                           "\"; too few are left (",
                           FailuresLocked(job.device_kind), "); it never ran")),
          now));
    }
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
    RunResult r;
    r.queue_wait = absl::Now() - e->enqueued;
    const bool first_start = !e->retried;
    mu_.Unlock();
    RunJob(*slot, gang, job, first_start, &r);
    mu_.Lock();
    std::vector<Completion> done = FinishRunLocked(e, *slot, std::move(r));
    mu_.Unlock();
    for (Completion& c : done) Deliver(std::move(c));
    mu_.Lock();
  }
  mu_.Unlock();
}

void SchedulerImpl::RunJob(const Slot& slot, const std::vector<Device*>& gang,
                           Job* job, bool first_start, RunResult* r) {
  // A job stopped between dispatch and here never runs.
  if (job->cancelled.load(std::memory_order_relaxed)) return;
  if (job->on_start) job->on_start(*job, slot.name);
  // Its queue wait is observed once: a retry's would count the failed run.
  if (listener_ != nullptr && first_start) {
    listener_->OnStarted(*job, slot.kind, r->queue_wait);
  }
  const absl::Time t0 = absl::Now();
  r->result = gang.size() == 1
                  ? gang[0]->Run(job->snapshot, job->options)
                  : gang[0]->RunGang(gang, job->snapshot, job->options);
  r->run = absl::Now() - t0;
  r->ran = true;
  for (Device* d : gang) r->health.push_back(d->Health());
}

std::vector<Completion> SchedulerImpl::FinishRunLocked(Entry* e,
                                                       const Slot& slot,
                                                       RunResult r) {
  std::vector<Completion> done;
  const Job& job = *e->job;
  if (r.ran) {
    // Exponential moving average for retry hints and deadline checks;
    // the timer's next wake-up depends on it.
    run_estimate_seconds_ =
        0.8 * run_estimate_seconds_ + 0.2 * absl::ToDoubleSeconds(r.run);
    timer_cv_.Signal();
  }
  const bool lost = TakeOutFailedLocked(e->gang, r.health);
  const bool may_retry = lost && !r.result.ok() &&
                         e->stop_code == absl::StatusCode::kOk && !e->retried;
  if (may_retry && GangCapacityLocked(job.device_kind, true) >= job.gang_size) {
    ATTNAUDIT_LOG(warn, "job failed on a failed device; it runs once more")
        .Kv("job_id", job.id)
        .Kv("status", r.result.status());
    RequeueLocked(e);
  } else {
    if (may_retry) {
      r.result = absl::UnavailableError(absl::StrCat(
          r.result.status().message(), " (", FailuresLocked(job.device_kind),
          "; no healthy device is left to run it again)"));
    }
    done.push_back(CompleteRunLocked(e, slot, std::move(r)));
  }
  if (lost) FailUnplaceableLocked(&done);
  if (listener_ != nullptr) listener_->OnInFlightChanged(in_flight_);
  NotifyDevicesLocked();
  DispatchLocked(/*freed_device=*/true);
  return done;
}

Completion SchedulerImpl::CompleteRunLocked(Entry* e, const Slot& slot,
                                            RunResult r) {
  const Job& job = *e->job;
  Completion done;
  JobOutcome& out = done.outcome;
  out.job_id = job.id;
  out.priority = job.priority;
  out.ran = r.ran;
  out.device_kind = slot.kind;
  out.device_name = slot.name;
  out.labels = job.labels;
  out.timings.queue_wait = r.queue_wait;
  out.timings.run = r.run;
  if (e->stop_code != absl::StatusCode::kOk) {
    out.status = StopStatus(e->stop_code, job.id, r.ran);
  } else if (!r.result.ok()) {
    out.status = r.result.status();
  } else {
    out.report = *std::move(r.result);
  }
  out.tenant = job.tenant;
  for (int g : e->gang) slots_[g]->busy = false;
  --in_flight_;
  done.job = ReleaseEntryLocked(e);
  return done;
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
  c.outcome.snapshot = &c.job->snapshot;
  if (listener_ != nullptr) listener_->OnFinished(c.outcome);
  if (c.job->on_done) c.job->on_done(c.outcome);
  c.job.reset();  // frees the snapshot before Drain can return
  absl::MutexLock lock(&mu_);
  --pending_deliveries_;
  idle_cv_.SignalAll();
}

}  // namespace scheduler_internal
}  // namespace attnaudit::server
