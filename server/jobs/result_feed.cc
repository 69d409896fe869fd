#include "server/jobs/result_feed.h"

#include <utility>
#include <vector>

#include "server/log/log.h"

namespace attnaudit::server {

ResultFeed::ResultFeed(JobStore* store, Options options, OnResult on_result,
                       OnHealth on_health)
    : store_(store),
      options_(options),
      on_result_(std::move(on_result)),
      on_health_(std::move(on_health)) {}

ResultFeed::~ResultFeed() { Stop(); }

void ResultFeed::Start(int64_t after_seq) {
  {
    absl::MutexLock lock(&mu_);
    last_seq_ = after_seq;
  }
  thread_ = std::thread([this] { Loop(); });
}

void ResultFeed::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

void ResultFeed::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t ResultFeed::last_seq() const {
  absl::MutexLock lock(&mu_);
  return last_seq_;
}

bool ResultFeed::DrainOnce() {
  while (true) {
    int64_t after;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return true;
      after = last_seq_;
    }
    absl::StatusOr<std::vector<ResultRecord>> rows =
        store_->ResultsAfter(after, options_.batch);
    if (on_health_ != nullptr) on_health_(rows.ok());
    if (!rows.ok()) {
      if (!failing_) {
        ATTNAUDIT_LOG(warn, "result feed: the store cannot be read; retrying")
            .Kv("status", rows.status());
      }
      failing_ = true;
      return false;
    }
    if (failing_) {
      ATTNAUDIT_LOG(info, "result feed: the store is back");
    }
    failing_ = false;
    for (const ResultRecord& r : *rows) {
      on_result_(r);
      absl::MutexLock lock(&mu_);
      last_seq_ = r.seq;
    }
    if (static_cast<int>(rows->size()) < options_.batch) return true;
  }
}

void ResultFeed::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto woken_or_stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return woken_ || stopping_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&woken_or_stopping),
                           options_.poll_interval);
      if (stopping_) return;
      woken_ = false;
    }
    DrainOnce();
  }
}

}  // namespace attnaudit::server
