#include "server/rpc/fleet_handoff.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "server/common/log.h"

namespace attnaudit::server {

FleetHandoff::FleetHandoff(JobStore* store, Options options, Adopt adopt,
                           std::function<bool()> draining)
    : store_(store),
      options_(std::move(options)),
      adopt_(std::move(adopt)),
      draining_(std::move(draining)) {}

FleetHandoff::~FleetHandoff() { Stop(/*retire=*/false); }

absl::Status FleetHandoff::Start() {
  if (absl::Status s = store_->Heartbeat(options_.replica); !s.ok()) return s;
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void FleetHandoff::Stop(bool retire) {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
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

void FleetHandoff::Round() {
  absl::Status beat = store_->Heartbeat(options_.replica);
  absl::StatusOr<std::vector<StoredJob>> jobs = std::vector<StoredJob>();
  if (beat.ok() && !draining_()) {
    jobs = store_->ClaimStranded(options_.replica, options_.lease,
                                 options_.claims_per_round);
  }
  const absl::Status s = beat.ok() ? jobs.status() : beat;
  if (!s.ok()) {
    if (!failing_) {
      ATTNAUDIT_LOG(warn, "fleet: heartbeat or claim failed; retrying")
          .Kv("status", s);
    }
    failing_ = true;
    return;
  }
  failing_ = false;
  for (StoredJob& job : *jobs) {
    ATTNAUDIT_LOG(info, "fleet: took over a stranded job")
        .Kv("job_id", job.record.job_id);
    {
      absl::MutexLock lock(&mu_);
      ++claimed_;
    }
    adopt_(std::move(job));
  }
}

void FleetHandoff::Loop() {
  // At least five heartbeats per lease; and at least one claim round a
  // second, so a retired replica's jobs move on at once.
  const absl::Duration period = std::min(options_.lease / 5, absl::Seconds(1));
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]()
                          ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), period)) return;
    }
    Round();
  }
}

}  // namespace attnaudit::server
