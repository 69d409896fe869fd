#include "server/jobs/blocking_executor.h"

#include <utility>

namespace attnaudit::server {

BlockingExecutor::BlockingExecutor(int threads, size_t max_queued)
    : max_queued_(max_queued == 0 ? 1 : max_queued) {
  if (threads < 1) threads = 1;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

BlockingExecutor::~BlockingExecutor() { Shutdown(); }

bool BlockingExecutor::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || tasks_.size() >= max_queued_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

size_t BlockingExecutor::queued() const {
  absl::MutexLock lock(&mu_);
  return tasks_.size();
}

void BlockingExecutor::Shutdown() {
  absl::MutexLock join_lock(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void BlockingExecutor::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](BlockingExecutor* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return self->stopping_ || !self->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace attnaudit::server
