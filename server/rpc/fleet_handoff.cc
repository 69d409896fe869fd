#include "server/rpc/fleet_handoff.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/log.h"

namespace attnaudit::server {

absl::Duration FleetHandoff::PeriodOf(absl::Duration lease) {
  // At least five heartbeats per lease; and at least one claim round a
  // second, so a retired replica's jobs move on at once.
  return std::min(lease / 5, absl::Seconds(1));
}

FleetHandoff::FleetHandoff(JobStore* store, Options options, Adopt adopt,
                           std::function<bool()> draining)
    : store_(store),
      options_(std::move(options)),
      period_(PeriodOf(options_.lease)),
      adopt_(std::move(adopt)),
      draining_(std::move(draining)) {}

FleetHandoff::~FleetHandoff() { Stop(/*retire=*/false); }

absl::Status FleetHandoff::CheckReplicaIdFree() {
  absl::StatusOr<ReplicaBeat> first = store_->ReadHeartbeat(options_.replica);
  if (first.status().code() == absl::StatusCode::kNotFound) {
    return absl::OkStatus();
  }
  if (!first.ok()) return first.status();
  if (first->now - first->written >= options_.lease) return absl::OkStatus();
  // Fresh: this id's last process may have just died (a restart), or
  // another one may be running. A live one writes again within a period.
  absl::SleepFor(3 * period_);
  absl::StatusOr<ReplicaBeat> again = store_->ReadHeartbeat(options_.replica);
  if (again.status().code() == absl::StatusCode::kNotFound) {
    return absl::OkStatus();  // it retired meanwhile
  }
  if (!again.ok()) return again.status();
  if (again->written == first->written) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--replica-id ", options_.replica,
      ": a live replica of this fleet uses this id (its heartbeat moved ",
      absl::FormatDuration(again->written - first->written),
      " while this one started); every replica needs its own"));
}

absl::Status FleetHandoff::Start() {
  if (absl::Status s = CheckReplicaIdFree(); !s.ok()) return s;
  if (absl::Status s = store_->Heartbeat(options_.replica); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    healthy_since_ = options_.now();
    ++heartbeats_;
  }
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  claim_thread_ = std::thread([this] { ClaimLoop(); });
  return absl::OkStatus();
}

void FleetHandoff::Stop(bool retire) {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (claim_thread_.joinable()) claim_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (retire) {
    if (absl::Status s = store_->Retire(options_.replica); !s.ok()) {
      ATTNAUDIT_LOG(warn,
                    "fleet: could not retire; others claim this "
                    "replica's jobs after the lease")
          .Kv("status", s);
    }
  }
}

int64_t FleetHandoff::claimed() const {
  absl::MutexLock lock(&mu_);
  return claimed_;
}

int64_t FleetHandoff::heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}

bool FleetHandoff::WaitPeriod() {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]()
                      ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
  return mu_.AwaitWithTimeout(absl::Condition(&stopping), period_);
}

void FleetHandoff::Beat() {
  const absl::Status s = store_->Heartbeat(options_.replica);
  absl::MutexLock lock(&mu_);
  if (!s.ok()) {
    healthy_since_ = absl::InfiniteFuture();
    if (!beat_failing_) {
      ATTNAUDIT_LOG(warn, "fleet: heartbeat failed; retrying").Kv("status", s);
    }
    beat_failing_ = true;
    return;
  }
  ++heartbeats_;
  if (healthy_since_ == absl::InfiniteFuture()) {
    healthy_since_ = options_.now();
  }
  beat_failing_ = false;
}

void FleetHandoff::HeartbeatLoop() {
  while (!WaitPeriod()) Beat();
}

bool FleetHandoff::HealthyForALease() const {
  absl::MutexLock lock(&mu_);
  return healthy_since_ != absl::InfiniteFuture() &&
         options_.now() - healthy_since_ >= options_.lease;
}

bool FleetHandoff::AdoptClaimed(const StoredJob& claimed) {
  absl::StatusOr<StoredJob> job = store_->ReadPayload(claimed.record.job_id);
  if (job.status().code() == absl::StatusCode::kNotFound) {
    return true;  // finished (or cancelled) since: nothing to run
  }
  if (!job.ok()) {
    ATTNAUDIT_LOG(warn, "fleet: a claimed job's payload cannot be read yet")
        .Kv("job_id", claimed.record.job_id)
        .Kv("status", job.status());
    return false;
  }
  ATTNAUDIT_LOG(info, "fleet: took over a stranded job")
      .Kv("job_id", claimed.record.job_id)
      .Kv("bytes", job->payload_bytes);
  adopt_(*std::move(job));
  return true;
}

void FleetHandoff::ClaimRound() {
  // Jobs claimed before whose payloads could not be read: ours, first.
  std::vector<StoredJob> retry;
  retry.swap(pending_);
  for (StoredJob& job : retry) {
    if (!AdoptClaimed(job)) pending_.push_back(std::move(job));
  }
  if (!pending_.empty() || draining_()) return;
  // Retired replicas' jobs at once; silent ones' only once this replica's
  // own heartbeats have held for a lease (see the file comment).
  absl::StatusOr<std::vector<StoredJob>> jobs = store_->ClaimStranded(
      options_.replica, options_.lease, options_.claims_per_round,
      options_.claim_bytes, /*retired_only=*/!HealthyForALease());
  if (!jobs.ok()) {
    if (!claim_failing_) {
      ATTNAUDIT_LOG(warn, "fleet: claim failed; retrying")
          .Kv("status", jobs.status());
    }
    claim_failing_ = true;
    return;
  }
  claim_failing_ = false;
  {
    absl::MutexLock lock(&mu_);
    claimed_ += static_cast<int64_t>(jobs->size());
  }
  for (StoredJob& job : *jobs) {
    if (!AdoptClaimed(job)) pending_.push_back(std::move(job));
  }
}

void FleetHandoff::ClaimLoop() {
  while (!WaitPeriod()) ClaimRound();
}

}  // namespace attnaudit::server
