// CallbackQueueWaker: keeps gRPC's callback-API threads polling while the
// server is idle, so that the first call after a quiet second is not held
// back by up to 100 ms.
//
// Why. gRPC C++ 1.51 (Debian 12) runs callback-API work, the server's
// reactors included, from one process-wide completion queue polled by a
// few "nexting" threads (two on a 2- or 3-core machine). A thread that gets
// no event for 1 s sleeps 100 ms before it polls again, and threads that
// went idle together sleep together: a request that lands in that window
// waits for them, so the first call after an idle second, and the tail of
// a slow steady rate, pay up to 100 ms (docs/PERF.md, "Idle wake-ups",
// has the figures).
//
// How. Every `period` a callback-API unary call goes to the server's own
// health service over an in-process channel: its completion is an event
// on that queue, so some nexting thread always has had one within the
// last period and none reaches its 1 s timeout while another sleeps. The
// health service is gRPC's, so the call is not counted, logged or billed
// as a request of attnaudit.v1.AuditService (the reclaimer's idle test
// reads only those).
//
// Owns one thread. The destructor stops it and waits for the call in
// flight. Destroy the waker before the server shuts down: gRPC crashes on
// an in-process call to a server that is shut down. Not copyable.
#ifndef ATTNAUDIT_SERVER_RPC_CALLBACK_QUEUE_WAKER_H_
#define ATTNAUDIT_SERVER_RPC_CALLBACK_QUEUE_WAKER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attnaudit::server {

class CallbackQueueWaker {
 public:
  // Starts pinging through `channel` (the server's InProcessChannel).
  CallbackQueueWaker(std::shared_ptr<grpc::Channel> channel,
                     absl::Duration period);
  ~CallbackQueueWaker();
  CallbackQueueWaker(const CallbackQueueWaker&) = delete;
  CallbackQueueWaker& operator=(const CallbackQueueWaker&) = delete;

  // Pings completed so far (for tests).
  int64_t pings() const;

 private:
  void Run();
  // One health check through the callback API; returns when it completed.
  void Ping();

  const std::shared_ptr<grpc::Channel> channel_;
  const absl::Duration period_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t pings_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_CALLBACK_QUEUE_WAKER_H_
