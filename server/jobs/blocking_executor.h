// BlockingExecutor: a small fixed pool of threads for the RPC layer's
// blocking I/O (spooling a Submit with fsync, SQLite reads and writes), so
// gRPC's reaction threads never block: gRPC's callback API runs reactions
// on a few shared threads, and one that waits on the disk stalls every
// call behind it.
//
// Why not the compute pool the audits run on: a task there that waits for
// fsync (milliseconds to seconds on a busy disk) holds a core's worth of
// audit capacity idle, and a burst of Submits would queue behind running
// audits (or they behind it), coupling ingest latency to audit load. I/O
// threads mostly sleep in the kernel, so a few cost next to nothing. And
// the I/O queue must be bounded with an immediate "no" (the caller answers
// RESOURCE_EXHAUSTED "server busy"), which neither gRPC nor a task arena
// offers. This is that: a bounded FIFO in front of a few threads.
//
// The queue is bounded: Post refuses work (returns false) when `max_queued`
// tasks are waiting or after Shutdown, and the caller answers the RPC
// RESOURCE_EXHAUSTED / UNAVAILABLE itself. Tasks run in FIFO order.
// Thread-safe. Shutdown (also run by the destructor) lets queued tasks run
// to completion, then joins the threads; a task must not call Shutdown.
#ifndef ATTNAUDIT_SERVER_JOBS_BLOCKING_EXECUTOR_H_
#define ATTNAUDIT_SERVER_JOBS_BLOCKING_EXECUTOR_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace attnaudit::server {

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

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_JOBS_BLOCKING_EXECUTOR_H_
