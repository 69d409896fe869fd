#include "server/rpc/watch_hub.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/rpc/conversions.h"
#include "server/rpc/rpc_methods.h"
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
                           Principal principal, Credentials credentials,
                           absl::optional<int64_t> resume_after,
                           const BacklogLoader& load_backlog)
    : hub_(hub),
      calls_(calls),
      filter_(std::move(filter)),
      buffer_(buffer < 1 ? 1 : buffer),
      principal_(std::move(principal)),
      credentials_(std::move(credentials)),
      resume_after_(resume_after.has_value() ? *resume_after : -1),
      resume_in_feed_order_(principal_.ReadsAll()),
      reads_all_(principal_.ReadsAll()) {
  {
    // Before registering, so that no live result is written ahead of a
    // backlog that may precede it. (The hub calls Push with its lock held,
    // so mu_ is never held while taking the hub's lock.)
    absl::MutexLock lock(&mu_);
    backlog_pending_ = resume_after_ >= 0 && load_backlog != nullptr;
  }
  int64_t live_after = 0;
  const bool added = hub_->Add(this, &live_after);
  calls_->Add(this);
  bool load = false;
  {
    absl::MutexLock lock(&mu_);
    if (!added) {
      backlog_pending_ = false;
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "server is shutting down"));
      return;
    }
    // Always loaded when resuming: the loader also refuses a cursor beyond
    // the newest stored result, which would silently drop live results.
    load = backlog_pending_ && !finished_ && !finishing_;
    backlog_pending_ = load;
    // Registered first, so the metadata promises every later result. A
    // Push or Close may have come in between: Close has finished the call
    // (which sends the metadata itself); a queued result is written now.
    if (finished_ || finishing_) return;
    StartSendInitialMetadata();
    metadata_started_ = true;
    StartNextWriteLocked();
  }
  if (load) load_backlog(this, resume_after_, live_after);
}

bool WatchReactor::WantsLocked(const PublishedResult& result) const {
  const int64_t cursor = resume_in_feed_order_ ? result.seq : result.tenant_seq;
  if (result.seq > 0 && cursor <= resume_after_) return false;
  if (!reads_all_ && result.tenant != principal_.tenant) return false;
  return MatchesFilter(filter_, result.result);
}

void WatchReactor::StartNextWriteLocked() {
  if (!metadata_started_ || writing_ || backlog_pending_ || finished_ ||
      queue_.empty()) {
    return;
  }
  writing_ = true;
  // Each result with the cursor of the principal's numbering now.
  StartWrite(reads_all_ ? &queue_.front()->wire_all : &queue_.front()->wire);
}

bool WatchReactor::EndBacklogLocked() {
  backlog_pending_ = false;
  if (done_) return true;
  StartNextWriteLocked();
  return false;
}

void WatchReactor::DeliverBacklog(
    const std::vector<std::shared_ptr<const PublishedResult>>& backlog) {
  bool remove = false;
  {
    absl::MutexLock lock(&mu_);
    if (!finished_ && !finishing_) {
      // Older than every queued live result: they go in front, in order.
      std::vector<std::shared_ptr<const PublishedResult>> wanted;
      for (const auto& r : backlog) {
        if (WantsLocked(*r)) wanted.push_back(r);
      }
      queue_.insert(queue_.begin(), wanted.begin(), wanted.end());
    }
    remove = EndBacklogLocked();
  }
  if (remove) delete this;
}

void WatchReactor::FailBacklog(const grpc::Status& status) {
  bool remove = false;
  {
    absl::MutexLock lock(&mu_);
    queue_.clear();
    FinishLocked(status);
    remove = EndBacklogLocked();
  }
  if (remove) delete this;
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
      Reauthorize(auth, credentials_, principal_, PermissionOf("WatchResults"),
                  "WatchResults");
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
  absl::MutexLock lock(&mu_);
  if (!WantsLocked(*result)) return;
  if (finished_ || finishing_) return;
  if (queue_.size() >= buffer_) {
    // Nothing more will be written: free the backlog now, except the
    // message being written, which gRPC still reads until OnWriteDone.
    queue_.erase(writing_ ? queue_.begin() + 1 : queue_.begin(), queue_.end());
    FinishLocked(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("watcher too slow: ", buffer_,
                     " results were waiting to be sent, so this watch was "
                     "dropped; watch again with resume_after set to the "
                     "last cursor you saw")));
    return;
  }
  queue_.push_back(result);
  StartNextWriteLocked();
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
  StartNextWriteLocked();
}

void WatchReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
}

void WatchReactor::OnDone() {
  calls_->Remove(this);
  hub_->Remove(this);
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    if (backlog_pending_) return;  // the backlog's end deletes it
  }
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

bool WatchHub::Add(WatchReactor* w, int64_t* live_after) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  watchers_.insert(w);
  *live_after = last_seq_;
  return true;
}

void WatchHub::SetLastSeq(int64_t seq) {
  absl::MutexLock lock(&mu_);
  last_seq_ = seq;
}

void WatchHub::Remove(WatchReactor* w) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(w);
}

std::shared_ptr<const PublishedResult> WatchHub::Prepare(v1::JobResult result,
                                                         std::string tenant,
                                                         int64_t seq,
                                                         int64_t tenant_seq) {
  auto published = std::make_shared<PublishedResult>();
  bool own = false;
  // Cannot fail for a message we built; an empty message would be sent.
  result.set_cursor(tenant_seq);
  grpc::SerializationTraits<v1::JobResult>::Serialize(result, &published->wire,
                                                      &own)
      .IgnoreError();
  result.set_cursor(seq);
  grpc::SerializationTraits<v1::JobResult>::Serialize(
      result, &published->wire_all, &own)
      .IgnoreError();
  published->result = std::move(result);
  published->tenant = std::move(tenant);
  published->seq = seq;
  published->tenant_seq = tenant_seq;
  return published;
}

void WatchHub::Publish(v1::JobResult result, std::string tenant) {
  std::shared_ptr<const PublishedResult> shared =
      Prepare(std::move(result), std::move(tenant), 0, 0);
  absl::MutexLock lock(&mu_);
  for (WatchReactor* w : watchers_) w->Push(shared);
}

void WatchHub::Publish(int64_t seq, int64_t tenant_seq,
                       const std::string& tenant,
                       const std::function<v1::JobResult()>& make) {
  absl::MutexLock lock(&mu_);
  // Under the hub lock: a watcher registering now either gets this result
  // live or counts it in its backlog, never both and never neither.
  if (seq > last_seq_) last_seq_ = seq;
  if (watchers_.empty()) return;
  std::shared_ptr<const PublishedResult> shared =
      Prepare(make(), tenant, seq, tenant_seq);
  for (WatchReactor* w : watchers_) w->Push(shared);
}

void WatchHub::Stored(const ResultRecord& record) {
  Publish(record.seq, record.tenant_seq, record.tenant,
          [&record] { return rpc_internal::RecordToJobResult(record); });
}

void WatchHub::Unstored(const ResultRecord& record) {
  if (!HasWatchers()) return;
  Publish(rpc_internal::RecordToJobResult(record), record.tenant);
}

void WatchHub::Close(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (WatchReactor* w : watchers_) w->Close(status);
}

}  // namespace attnaudit::server
