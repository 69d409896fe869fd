#include "server/rpc/audit_result_writer.h"

#include <utility>

#include "server/common/log.h"

namespace attnaudit::server {

AuditResultWriter::AuditResultWriter(size_t capacity, Sink write, Sink overflow)
    : capacity_(capacity < 1 ? 1 : capacity),
      write_(std::move(write)),
      overflow_(std::move(overflow)),
      thread_([this] { Loop(); }) {}

AuditResultWriter::~AuditResultWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void AuditResultWriter::Add(ResultRecord record) {
  {
    absl::MutexLock lock(&mu_);
    if (queue_.size() < capacity_) {
      queue_.push_back(std::move(record));
      return;
    }
    if (overflowed_++ == 0) {
      ATTNAUDIT_LOG(warn,
                    "Audit results arrive faster than the store takes them; "
                    "the excess is streamed to watchers, not stored");
    }
  }
  overflow_(std::move(record));
}

int64_t AuditResultWriter::overflowed() const {
  absl::MutexLock lock(&mu_);
  return overflowed_;
}

void AuditResultWriter::Loop() {
  while (true) {
    ResultRecord next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    write_(std::move(next));
  }
}

}  // namespace attnaudit::server
