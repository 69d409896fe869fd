#include "server/rpc/callback_queue_waker.h"

#include <grpcpp/generic/generic_stub.h>

#include <memory>
#include <utility>

#include "absl/synchronization/notification.h"

namespace attnaudit::server {
namespace {

constexpr char kHealthCheck[] = "/grpc.health.v1.Health/Check";

}  // namespace

CallbackQueueWaker::CallbackQueueWaker(std::shared_ptr<grpc::Channel> channel,
                                       absl::Duration period)
    : channel_(std::move(channel)), period_(period) {
  thread_ = std::thread([this] { Run(); });
}

CallbackQueueWaker::~CallbackQueueWaker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

int64_t CallbackQueueWaker::pings() const {
  absl::MutexLock lock(&mu_);
  return pings_;
}

void CallbackQueueWaker::Run() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period_)) return;
    }
    Ping();
  }
}

void CallbackQueueWaker::Ping() {
  grpc::GenericStub stub(channel_);
  grpc::ClientContext context;
  // Bounded, so that a stuck server cannot hold the destructor.
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  // An empty HealthCheckRequest (service ""); a default ByteBuffer would
  // be no message at all, which gRPC refuses.
  grpc::Slice nothing;
  const grpc::ByteBuffer request(&nothing, 1);
  grpc::ByteBuffer response;
  // Shared: the callback may still be inside Notify() when this returns.
  auto done = std::make_shared<absl::Notification>();
  stub.UnaryCall(&context, kHealthCheck, grpc::StubOptions(), &request,
                 &response, [done](const grpc::Status&) { done->Notify(); });
  done->WaitForNotification();
  absl::MutexLock lock(&mu_);
  ++pings_;
}

}  // namespace attnaudit::server
