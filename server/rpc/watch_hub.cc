#include "server/rpc/watch_hub.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/rpc/status_util.h"

namespace attnaudit::server {

bool MatchesFilter(const v1::ResultFilter& filter,
                   const v1::JobResult& result) {
  const v1::Labels& labels = result.labels();
  if (!filter.model().empty() && labels.model() != filter.model()) return false;
  if (filter.has_layer() &&
      (!labels.has_layer() || labels.layer() != filter.layer())) {
    return false;
  }
  if (!filter.engine().empty() && labels.engine() != filter.engine()) {
    return false;
  }
  if (!filter.backend().empty() && labels.backend() != filter.backend()) {
    return false;
  }
  if (filter.verdicts_size() > 0) {
    if (result.state() != v1::JOB_STATE_DONE || !result.has_report()) {
      return false;
    }
    bool any = false;
    for (int v : filter.verdicts()) any |= v == result.report().verdict();
    if (!any) return false;
  }
  return true;
}

WatchReactor::WatchReactor(WatchHub* hub, OpenCalls* calls,
                           v1::ResultFilter filter, size_t buffer,
                           Principal principal, Credentials credentials)
    : hub_(hub),
      calls_(calls),
      filter_(std::move(filter)),
      buffer_(buffer < 1 ? 1 : buffer),
      principal_(std::move(principal)),
      credentials_(std::move(credentials)),
      reads_all_(principal_.ReadsAll()) {
  const bool added = hub_->Add(this);
  calls_->Add(this);
  absl::MutexLock lock(&mu_);
  if (!added) {
    FinishLocked(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down"));
    return;
  }
  // Registered first, so the metadata promises every later result. A Push
  // or Close may have come in between: Close has finished the call (which
  // sends the metadata itself); a queued result is written now.
  if (finished_ || finishing_) return;
  StartSendInitialMetadata();
  metadata_started_ = true;
  if (!queue_.empty() && !writing_) {
    writing_ = true;
    StartWrite(&queue_.front()->wire);
  }
}

void WatchReactor::FinishLocked(const grpc::Status& status) {
  if (finished_ || finishing_) return;
  if (writing_) {
    finishing_ = true;
    final_status_ = status;
    return;
  }
  finished_ = true;
  Finish(status);
}

bool WatchReactor::Recheck(const Authenticator& auth) {
  absl::StatusOr<Principal> now =
      Reauthorize(auth, credentials_, principal_, kPermRead, "WatchResults");
  absl::MutexLock lock(&mu_);
  if (finished_ || finishing_) return false;
  if (!now.ok()) {
    FinishLocked(ToGrpcStatus(now.status()));
    return true;
  }
  reads_all_ = now->ReadsAll();
  return false;
}

void WatchReactor::Push(const std::shared_ptr<const PublishedResult>& result) {
  if (!MatchesFilter(filter_, result->result)) return;
  absl::MutexLock lock(&mu_);
  if (!reads_all_ && result->tenant != principal_.tenant) return;
  if (finished_ || finishing_) return;
  if (queue_.size() >= buffer_) {
    // Nothing more will be written: free the backlog now, except the
    // message being written, which gRPC still reads until OnWriteDone.
    queue_.erase(writing_ ? queue_.begin() + 1 : queue_.begin(), queue_.end());
    FinishLocked(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("watcher too slow: ", buffer_,
                     " results were waiting to be sent, so this watch was "
                     "dropped; reconnect and use GetResult to catch up")));
    return;
  }
  queue_.push_back(result);
  if (metadata_started_ && !writing_) {
    writing_ = true;
    StartWrite(&queue_.front()->wire);
  }
}

void WatchReactor::Close(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  FinishLocked(status);
}

void WatchReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  if (!queue_.empty()) queue_.pop_front();
  if (!ok) {
    // The stream is broken (client gone or call cancelled).
    if (!finished_) {
      finished_ = true;
      Finish(finishing_ ? final_status_
                        : grpc::Status(grpc::StatusCode::CANCELLED,
                                       "watch stream broken"));
    }
    return;
  }
  if (finishing_) {
    if (!finished_) {
      finished_ = true;
      Finish(final_status_);
    }
    return;
  }
  if (finished_) return;
  if (!queue_.empty()) {
    writing_ = true;
    StartWrite(&queue_.front()->wire);
  }
}

void WatchReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
}

void WatchReactor::OnDone() {
  calls_->Remove(this);
  hub_->Remove(this);
  delete this;
}

bool WatchHub::HasWatchers() const {
  absl::MutexLock lock(&mu_);
  return !watchers_.empty();
}

size_t WatchHub::watchers() const {
  absl::MutexLock lock(&mu_);
  return watchers_.size();
}

bool WatchHub::Add(WatchReactor* w) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  watchers_.insert(w);
  return true;
}

void WatchHub::Remove(WatchReactor* w) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(w);
}

void WatchHub::Publish(v1::JobResult result, std::string tenant) {
  auto published = std::make_shared<PublishedResult>();
  bool own = false;
  if (!grpc::SerializationTraits<v1::JobResult>::Serialize(
           result, &published->wire, &own)
           .ok()) {
    return;  // cannot happen for a message we built
  }
  published->result = std::move(result);
  published->tenant = std::move(tenant);
  std::shared_ptr<const PublishedResult> shared = std::move(published);
  absl::MutexLock lock(&mu_);
  for (WatchReactor* w : watchers_) w->Push(shared);
}

void WatchHub::Close(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (WatchReactor* w : watchers_) w->Close(status);
}

}  // namespace attnaudit::server
