// CallbackQueueWaker against a real in-process gRPC server: it keeps
// calling the health service, counts completed pings, and its destructor
// does not wait out the period. An in-process channel must not outlive its
// server's serving (gRPC crashes on one to a shut-down server), which is
// why AuditServer destroys the waker before it shuts gRPC down. (What it is
// for, the latency of a call after a quiet second, is measured by `make
// bench-idle`, not asserted here: timings do not belong in tests.)
#include "server/rpc/callback_queue_waker.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

// A server with no port, gRPC's health service and, as attnaudit's, a
// callback-API service (gRPC refuses a server without one it polls):
// reachable only through its in-process channel.
struct HealthOnlyServer {
  HealthOnlyServer() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(&unused_callback_service);
    server = builder.BuildAndStart();
  }
  grpc::CallbackGenericService unused_callback_service;  // outlives server
  std::unique_ptr<grpc::Server> server;
};

// Polls until waker.pings() >= n, for at most 30 s.
bool WaitForPings(const CallbackQueueWaker& waker, int64_t n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (waker.pings() < n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(CallbackQueueWakerTest, KeepsPingingTheServersHealthService) {
  HealthOnlyServer s;
  ASSERT_NE(s.server, nullptr);
  {
    CallbackQueueWaker waker(
        s.server->InProcessChannel(grpc::ChannelArguments()),
        absl::Milliseconds(2));
    EXPECT_TRUE(WaitForPings(waker, 5)) << "pings: " << waker.pings();
  }  // the destructor stops the thread
  s.server->Shutdown();
}

// Stopping interrupts the wait between pings: with an hour's period the
// destructor still returns at once (a hang here fails by ctest's timeout).
TEST(CallbackQueueWakerTest, TheDestructorDoesNotWaitOutThePeriod) {
  HealthOnlyServer s;
  ASSERT_NE(s.server, nullptr);
  {
    CallbackQueueWaker waker(
        s.server->InProcessChannel(grpc::ChannelArguments()), absl::Hours(1));
    EXPECT_EQ(waker.pings(), 0);
  }
  s.server->Shutdown();
}

}  // namespace
}  // namespace attnaudit::server
