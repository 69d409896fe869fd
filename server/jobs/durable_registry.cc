#include "server/jobs/durable_registry.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "server/log/log.h"

namespace attnaudit::server {

DurableJobs::DurableJobs(Commit commit, Options options)
    : commit_(std::move(commit)), options_(options) {
  retry_thread_ = std::thread([this] { RetryLoop(); });
}

DurableJobs::~DurableJobs() { Shutdown(); }

void DurableJobs::Add(const ResultRecord& queued) {
  absl::MutexLock lock(&mu_);
  Entry& e = jobs_[queued.job_id];
  e.live = queued;
  e.live.state = JobState::kQueued;
}

void DurableJobs::MarkRunning(absl::string_view job_id, absl::Time started) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.finished) return;
  it->second.live.state = JobState::kRunning;
  it->second.live.started = started;
}

void DurableJobs::Finish(ResultRecord result, std::function<void()> on_stored) {
  const std::string id = result.job_id;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = jobs_[id];
    if (e.finished) return;  // a second result for one job: keep the first
    if (e.live.job_id.empty()) e.live = result;  // not registered before
    e.live.state = JobState::kRunning;
    e.finished = true;
    e.result = std::move(result);
    e.on_stored = std::move(on_stored);
    e.committing = true;
    ++pending_;
  }
  TryCommit(id);
}

void DurableJobs::TryCommit(const std::string& job_id) {
  ResultRecord result;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    result = it->second.result;
  }
  absl::StatusOr<bool> stored = commit_(result);
  std::function<void()> on_stored;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    Entry& e = it->second;
    e.committing = false;
    if (!stored.ok()) {
      ++e.attempts;
      const absl::Duration backoff = std::min(
          options_.max_retry,
          options_.first_retry * (int64_t{1} << std::min(e.attempts - 1, 20)));
      e.next_try = absl::Now() + backoff;
      if (e.attempts == 1 || e.attempts % 10 == 0) {
        ATTNAUDIT_LOG(err, "result not stored; retrying (job stays spooled)")
            .Kv("job_id", job_id)
            .Kv("attempts", static_cast<int64_t>(e.attempts))
            .Kv("retry_in_s", absl::ToDoubleSeconds(backoff))
            .Kv("status", stored.status());
      }
      wake_.Signal();
      return;
    }
    if (e.attempts > 0) {
      ATTNAUDIT_LOG(info, "result stored after retries")
          .Kv("job_id", job_id)
          .Kv("attempts", static_cast<int64_t>(e.attempts));
    }
    if (*stored) on_stored = std::move(e.on_stored);
    jobs_.erase(it);
    --pending_;
  }
  if (on_stored) on_stored();
}

void DurableJobs::Forget(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.finished) return;
  jobs_.erase(it);
}

absl::optional<ResultRecord> DurableJobs::Get(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::nullopt;
  return it->second.live;
}

int64_t DurableJobs::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

void DurableJobs::RetryLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    std::vector<std::string> due;
    for (auto& [id, e] : jobs_) {
      if (!e.finished || e.committing) continue;
      if (e.next_try <= now) {
        e.committing = true;
        due.push_back(id);
      } else {
        next = std::min(next, e.next_try);
      }
    }
    if (due.empty()) {
      wake_.WaitWithDeadline(&mu_, next);
      continue;
    }
    mu_.Unlock();
    for (const std::string& id : due) TryCommit(id);
    mu_.Lock();
  }
}

void DurableJobs::Shutdown() {
  absl::MutexLock join(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_.Signal();
  }
  if (retry_thread_.joinable()) retry_thread_.join();
}

}  // namespace attnaudit::server
