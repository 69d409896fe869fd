// BlockingExecutor: a small fixed pool of threads for the RPC layer's
// blocking work (spooling a Submit with fsync, SQLite reads and writes), so
// gRPC's reaction threads never block (docs/DESIGN.md §4: "reactions
// should be fast").
//
// The queue is bounded: Post refuses work (returns false) when `max_queued`
// tasks are waiting or after Shutdown, and the caller answers the RPC
// RESOURCE_EXHAUSTED / UNAVAILABLE itself. Tasks run in FIFO order.
// Thread-safe. Shutdown (also run by the destructor) lets queued tasks run
// to completion, then joins the threads; a task must not call Shutdown.
#ifndef ATTNAUDIT_SERVER_RPC_BLOCKING_EXECUTOR_H_
#define ATTNAUDIT_SERVER_RPC_BLOCKING_EXECUTOR_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace attnaudit::rpc {

class BlockingExecutor {
 public:
  BlockingExecutor(int threads, size_t max_queued);
  ~BlockingExecutor();
  BlockingExecutor(const BlockingExecutor&) = delete;
  BlockingExecutor& operator=(const BlockingExecutor&) = delete;

  // Queues `task`; false (and `task` is dropped unrun) when the queue is
  // full or the executor is shut down.
  bool Post(std::function<void()> task);

  // Stops accepting, runs what is queued, joins. Idempotent.
  void Shutdown();

  size_t queued() const;

 private:
  void Loop();

  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
  absl::Mutex join_mu_;  // serialises concurrent Shutdown calls
};

}  // namespace attnaudit::rpc

#endif  // ATTNAUDIT_SERVER_RPC_BLOCKING_EXECUTOR_H_
