// Admission control, deadlines, cancellation, priorities and draining,
// seen through the RPCs. The pool is one GateDevice, so the test decides
// when the device is busy and the queue order is observable.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "tests/integration/test_server.h"

namespace attnaudit::testing {
namespace {

using server::PriorityClass;

class SchedulingRpcTest : public ::testing::Test {
 protected:
  void Start(int64_t interactive_queue = 64) {
    gate_ = std::make_shared<GateState>();
    server::AuditServerOptions options = TestOptions(MakeTempDir("sched"));
    options.devices.push_back(std::make_unique<GateDevice>(gate_, 0));
    options.queue_capacity = {interactive_queue, 64};
    t_ = StartServer(std::move(options));
    ASSERT_NE(t_, nullptr);
  }
  void TearDown() override {
    if (gate_ != nullptr) gate_->Open();  // let every remaining job finish
    for (std::thread& th : threads_) th.join();
  }
  // Runs an Audit on a thread; its status lands in *status.
  void AuditAsync(int64_t tag, absl::Status* status) {
    threads_.emplace_back([this, tag, status] {
      *status = t_->client->Audit(SmallSnapshot(tag)).status();
    });
  }
  int64_t Queued(PriorityClass c) {
    return t_->server->scheduler()->Stats().queued[static_cast<int>(c)];
  }
  v1::JobResult WaitFinished(const std::string& id) {
    return testing::WaitFinished(t_->client.get(), id);
  }

  std::shared_ptr<GateState> gate_;
  std::unique_ptr<TestServer> t_;
  std::vector<std::thread> threads_;
};

TEST_F(SchedulingRpcTest,
       FullQueueIsRefusedAndTheNextRequestAfterADrainIsAccepted) {
  Start(/*interactive_queue=*/1);
  absl::Status running, queued;
  AuditAsync(1, &running);
  ASSERT_TRUE(gate_->WaitStarted(1));  // the device is busy
  AuditAsync(2, &queued);
  ASSERT_TRUE(
      WaitFor([&] { return Queued(PriorityClass::kInteractive) == 1; }));

  // The queue of one is full: refused at once, with a retry hint trailer.
  absl::StatusOr<AuditReport> refused = t_->client->Audit(SmallSnapshot(3));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_GT(client::RetryAfter(refused.status()), absl::ZeroDuration());
  // The hint goes out twice: as gRPC's standard grpc-retry-pushback-ms,
  // which the clients' retry policy waits for, and as retry-after-ms for
  // clients that read it themselves (a plain stub: no retries).
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    v1::AuditRequest request;
    SnapshotToProto(SmallSnapshot(6), request.mutable_snapshot());
    v1::AuditResponse response;
    grpc::Status s = v1::AuditService::NewStub(t_->channel)
                         ->Audit(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    const auto& trailers = context.GetServerTrailingMetadata();
    auto pushback = trailers.find("grpc-retry-pushback-ms");
    auto after = trailers.find("retry-after-ms");
    ASSERT_NE(pushback, trailers.end());
    ASSERT_NE(after, trailers.end());
    EXPECT_EQ(std::string(pushback->second.data(), pushback->second.size()),
              std::string(after->second.data(), after->second.size()));
  }
  // The stream is refused before its chunks, the same way.
  absl::StatusOr<AuditReport> refused_stream =
      t_->client->Audit(SmallSnapshot(4), {}, client::Transport::kStream);
  EXPECT_EQ(refused_stream.status().code(),
            absl::StatusCode::kResourceExhausted);

  gate_->Open();
  for (std::thread& th : threads_) th.join();
  threads_.clear();
  EXPECT_TRUE(running.ok()) << running;
  EXPECT_TRUE(queued.ok()) << queued;
  // The queue drained: the next request is accepted.
  absl::StatusOr<AuditReport> accepted = t_->client->Audit(SmallSnapshot(5));
  EXPECT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(gate_->started(), (std::vector<int64_t>{1, 2, 5}));
}

TEST_F(SchedulingRpcTest, ExpiredQueuedJobFailsDeadlineExceededWithoutRunning) {
  Start();
  absl::Status blocker;
  AuditAsync(1, &blocker);
  ASSERT_TRUE(gate_->WaitStarted(1));

  // Submit with its own timeout: expires in the queue, on the timer.
  client::SubmitOptions call;
  call.job_timeout = absl::Milliseconds(200);
  absl::StatusOr<v1::SubmitResponse> job =
      t_->client->Submit(SmallSnapshot(2), call);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::JobResult expired = WaitFinished(job->job_id());
  EXPECT_EQ(expired.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(expired.error().code(),
            static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_FALSE(expired.has_start_time());

  // A unary Audit whose deadline passes while it waits.
  client::CallOptions short_call;
  short_call.timeout = absl::Milliseconds(300);
  absl::StatusOr<AuditReport> late =
      t_->client->Audit(SmallSnapshot(3), short_call);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(
      WaitFor([&] { return Queued(PriorityClass::kInteractive) == 0; }));

  // The device was held the whole time: neither job ever reached it.
  EXPECT_EQ(gate_->started(), (std::vector<int64_t>{1}));
  gate_->Open();
}

TEST_F(SchedulingRpcTest, CancelFreesQueuedAndRunningJobs) {
  Start();
  absl::StatusOr<v1::SubmitResponse> running =
      t_->client->Submit(SmallSnapshot(1));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(gate_->WaitStarted(1));
  absl::StatusOr<v1::SubmitResponse> queued =
      t_->client->Submit(SmallSnapshot(2));
  ASSERT_TRUE(queued.ok()) << queued.status();
  ASSERT_TRUE(WaitFor([&] { return Queued(PriorityClass::kSampled) == 1; }));

  absl::StatusOr<v1::JobState> state = t_->client->Cancel(queued->job_id());
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Queued(PriorityClass::kSampled), 0);  // freed at once
  const v1::JobResult q = WaitFinished(queued->job_id());
  EXPECT_EQ(q.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_FALSE(q.has_start_time());

  state = t_->client->Cancel(running->job_id());
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::JOB_STATE_CANCELLED);
  const v1::JobResult r = WaitFinished(running->job_id());
  EXPECT_EQ(r.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(gate_->cancelled_runs(), 1);  // the device saw the flag
  // Cancelling a finished job changes nothing and reports its state.
  state = t_->client->Cancel(running->job_id());
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(gate_->started(), (std::vector<int64_t>{1}));
}

TEST_F(SchedulingRpcTest, ClientCancelFreesTheQueuedAuditJob) {
  Start();
  absl::Status blocker;
  AuditAsync(1, &blocker);
  ASSERT_TRUE(gate_->WaitStarted(1));
  grpc::ClientContext context;
  v1::AuditRequest request;
  SnapshotToProto(SmallSnapshot(2), request.mutable_snapshot());
  grpc::Status status;
  std::thread call([&] {
    v1::AuditResponse response;
    status = t_->stub->Audit(&context, request, &response);
  });
  ASSERT_TRUE(
      WaitFor([&] { return Queued(PriorityClass::kInteractive) == 1; }));
  context.TryCancel();
  call.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(
      WaitFor([&] { return Queued(PriorityClass::kInteractive) == 0; }));
  gate_->Open();
  for (std::thread& th : threads_) th.join();
  threads_.clear();
  EXPECT_EQ(gate_->started(), (std::vector<int64_t>{1}));
}

TEST_F(SchedulingRpcTest, InteractiveAuditsRunBeforeQueuedSampledJobs) {
  Start();
  absl::StatusOr<v1::SubmitResponse> blocker =
      t_->client->Submit(SmallSnapshot(100));
  ASSERT_TRUE(blocker.ok());
  ASSERT_TRUE(gate_->WaitStarted(1));
  std::vector<std::string> sampled;
  for (int64_t tag : {1, 2}) {
    absl::StatusOr<v1::SubmitResponse> r =
        t_->client->Submit(SmallSnapshot(tag));
    ASSERT_TRUE(r.ok()) << r.status();
    sampled.push_back(r->job_id());
  }
  absl::Status interactive;
  AuditAsync(3, &interactive);
  ASSERT_TRUE(WaitFor([&] {
    return Queued(PriorityClass::kInteractive) == 1 &&
           Queued(PriorityClass::kSampled) == 2;
  }));
  gate_->Open();
  for (std::thread& th : threads_) th.join();
  threads_.clear();
  EXPECT_TRUE(interactive.ok()) << interactive;
  for (const std::string& id : sampled) {
    EXPECT_EQ(WaitFinished(id).state(), v1::JOB_STATE_DONE);
  }
  EXPECT_EQ(gate_->started(), (std::vector<int64_t>{100, 3, 1, 2}));
}

TEST_F(SchedulingRpcTest, PriorityCanBeChosenPerRequest) {
  Start();
  absl::StatusOr<v1::SubmitResponse> blocker =
      t_->client->Submit(SmallSnapshot(100));
  ASSERT_TRUE(blocker.ok());
  ASSERT_TRUE(gate_->WaitStarted(1));
  absl::StatusOr<v1::SubmitResponse> sampled =
      t_->client->Submit(SmallSnapshot(1));
  client::SubmitOptions urgent;
  urgent.priority = v1::PRIORITY_INTERACTIVE;
  absl::StatusOr<v1::SubmitResponse> interactive =
      t_->client->Submit(SmallSnapshot(2), urgent);
  ASSERT_TRUE(sampled.ok() && interactive.ok());
  ASSERT_TRUE(WaitFor([&] {
    return Queued(PriorityClass::kInteractive) == 1 &&
           Queued(PriorityClass::kSampled) == 1;
  }));
  gate_->Open();
  EXPECT_EQ(WaitFinished(sampled->job_id()).state(), v1::JOB_STATE_DONE);
  const v1::JobResult r = WaitFinished(interactive->job_id());
  EXPECT_EQ(r.priority(), v1::PRIORITY_INTERACTIVE);
  EXPECT_EQ(gate_->started(), (std::vector<int64_t>{100, 2, 1}));
}

TEST_F(SchedulingRpcTest, DrainingRefusesNewWorkWithUnavailable) {
  Start();
  t_->server->service()->StartDraining();
  const Snapshot snapshot = SmallSnapshot(1);
  EXPECT_EQ(t_->client->Audit(snapshot).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(t_->client->Audit(snapshot, {}, client::Transport::kStream)
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(t_->client->Submit(snapshot).status().code(),
            absl::StatusCode::kUnavailable);
  // Reads still work while draining.
  EXPECT_TRUE(t_->client->Capabilities(/*refresh=*/true).ok());
  EXPECT_TRUE(gate_->started().empty());
}

}  // namespace
}  // namespace attnaudit::testing
