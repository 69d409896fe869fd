// What the service tells operators and clients, seen through the RPCs:
// one accounting of invalid input whichever RPC carried it, a client's
// deadline counted as the outcome deadline_exceeded (not cancelled), a
// recommended chunk size a client can follow under a small receive limit,
// and WatchResults announcing itself with initial metadata at registration.
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "tests/integration/test_server.h"

namespace attnaudit::testing {
namespace {

using LabelMap = std::map<std::string, std::string>;

// The value of the counter or gauge series `name{labels}` (exact label
// set), or -1 when there is none.
double MetricValue(const server::Metrics& metrics, const std::string& name,
                   const LabelMap& labels) {
  for (const auto& family : metrics.registry()->Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      LabelMap got;
      for (const auto& l : m.label) got[l.name] = l.value;
      if (got != labels) continue;
      return family.type == prometheus::MetricType::Counter ? m.counter.value
                                                            : m.gauge.value;
    }
  }
  return -1;
}

double Outcome(const TestServer& t, const std::string& outcome) {
  return MetricValue(*t.server->metrics(), "attnaudit_jobs_completed_total",
                     {{"class", "interactive"}, {"outcome", outcome}});
}
double InvalidAudits(const TestServer& t) {
  return MetricValue(*t.server->metrics(), "attnaudit_audits_total",
                     {{"verdict", "INVALID"}, {"overridden", "false"}});
}
double InvalidRejections(const TestServer& t) {
  return MetricValue(*t.server->metrics(), "attnaudit_rejections_total",
                     {{"reason", "invalid_argument"}});
}

// A snapshot that decodes but fails validation: a negative window.
Snapshot InvalidSnapshot(int64_t tag) {
  Snapshot s = SmallSnapshot(tag);
  s.sliding_window = -1;
  return s;
}

// ---- Client deadlines: outcome deadline_exceeded --------------------------

class DeadlineOutcomeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gate_ = std::make_shared<GateState>();
    server::AuditServerOptions options = TestOptions(MakeTempDir("deadline"));
    options.devices.push_back(std::make_unique<GateDevice>(gate_, 0));
    t_ = StartServer(std::move(options));
    ASSERT_NE(t_, nullptr);
  }
  void TearDown() override {
    if (gate_ != nullptr) gate_->Open();
    for (std::thread& th : threads_) th.join();
  }
  // An Audit with the client deadline `timeout`, on a thread.
  void AuditAsync(int64_t tag, absl::Duration timeout, absl::Status* status) {
    threads_.emplace_back([this, tag, timeout, status] {
      client::CallOptions call;
      call.timeout = timeout;
      *status = t_->client->Audit(SmallSnapshot(tag), call).status();
    });
  }
  // Jobs that ended, whatever the outcome.
  double Finished() {
    double n = 0;
    for (const char* o :
         {"ok", "failed", "cancelled", "deadline_exceeded", "unavailable"}) {
      n += Outcome(*t_, o);
    }
    return n;
  }

  std::shared_ptr<GateState> gate_;
  std::unique_ptr<TestServer> t_;
  std::vector<std::thread> threads_;
};

TEST_F(DeadlineOutcomeTest,
       QueuedAuditPastItsClientDeadlineIsDeadlineExceeded) {
  absl::Status blocker, late;
  AuditAsync(1, absl::Minutes(2), &blocker);
  ASSERT_TRUE(gate_->WaitStarted(1));  // the only device is held
  AuditAsync(2, absl::Milliseconds(1500), &late);
  ASSERT_TRUE(WaitFor([&] { return Finished() >= 1; }));
  EXPECT_EQ(Outcome(*t_, "deadline_exceeded"), 1);
  EXPECT_EQ(Outcome(*t_, "cancelled"), 0);
  threads_.back().join();
  threads_.pop_back();
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
}

TEST_F(DeadlineOutcomeTest,
       RunningAuditPastItsClientDeadlineIsDeadlineExceeded) {
  absl::Status late;
  AuditAsync(1, absl::Milliseconds(1500), &late);
  ASSERT_TRUE(gate_->WaitStarted(1));  // running, held at the gate
  // The deadline stops the device (the gate sees the job's cancel flag).
  ASSERT_TRUE(WaitFor([&] { return Finished() >= 1; }));
  EXPECT_EQ(Outcome(*t_, "deadline_exceeded"), 1);
  EXPECT_EQ(Outcome(*t_, "cancelled"), 0);
  EXPECT_EQ(gate_->cancelled_runs(), 1);
}

TEST_F(DeadlineOutcomeTest, ClientCancelLongBeforeTheDeadlineIsCancelled) {
  absl::Status blocker;
  AuditAsync(1, absl::Minutes(2), &blocker);
  ASSERT_TRUE(gate_->WaitStarted(1));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::minutes(2));
  v1::AuditRequest request;
  SnapshotToProto(SmallSnapshot(2), request.mutable_snapshot());
  std::thread call([&] {
    v1::AuditResponse response;
    t_->stub->Audit(&context, request, &response).error_code();
  });
  ASSERT_TRUE(WaitFor([&] {
    return t_->server->scheduler()->Stats().queued[static_cast<int>(
               server::PriorityClass::kInteractive)] == 1;
  }));
  context.TryCancel();
  call.join();
  ASSERT_TRUE(WaitFor([&] { return Finished() >= 1; }));
  EXPECT_EQ(Outcome(*t_, "cancelled"), 1);
  EXPECT_EQ(Outcome(*t_, "deadline_exceeded"), 0);
}

// ---- Invalid input: one accounting across RPCs ----------------------------

class AccountingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = StartServer(TestOptions(MakeTempDir("accounting")));
    ASSERT_NE(t_, nullptr);
  }
  // Each call answers INVALID_ARGUMENT and moves both counters by one.
  void ExpectOneInvalidAudit(const std::string& rpc,
                             const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << rpc << ": " << status;
    ++want_;
    EXPECT_EQ(InvalidAudits(*t_), want_) << rpc;
    EXPECT_EQ(InvalidRejections(*t_), want_ + other_) << rpc;
  }
  std::unique_ptr<TestServer> t_;
  double want_ = 0;   // expected INVALID audits
  double other_ = 0;  // expected invalid requests that asked for no audit
};

TEST_F(AccountingTest, TheSameInvalidSnapshotCountsAlikeOnEveryRpc) {
  ASSERT_EQ(InvalidAudits(*t_), 0);
  ASSERT_EQ(InvalidRejections(*t_), 0);
  // Audit and AuditStream: the validate stage of the job finds it.
  ExpectOneInvalidAudit(
      "Audit",
      t_->client->Audit(InvalidSnapshot(1), {}, client::Transport::kUnary)
          .status());
  ExpectOneInvalidAudit(
      "AuditStream",
      t_->client->Audit(InvalidSnapshot(2), {}, client::Transport::kStream)
          .status());
  // Submit validates before spooling.
  ExpectOneInvalidAudit("Submit",
                        t_->client->Submit(InvalidSnapshot(3)).status());
  // A request the decoder refuses (no snapshot at all) counts the same.
  {
    grpc::ClientContext context;
    v1::AuditRequest request;
    v1::AuditResponse response;
    const grpc::Status s = t_->stub->Audit(&context, request, &response);
    ExpectOneInvalidAudit(
        "Audit without a snapshot",
        absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                     s.error_message()));
  }
  // Requests that asked for no audit: rejections only.
  EXPECT_EQ(t_->client->GetResult("not a job id!").status().code(),
            absl::StatusCode::kInvalidArgument);
  ++other_;
  EXPECT_EQ(InvalidAudits(*t_), want_);
  EXPECT_EQ(InvalidRejections(*t_), want_ + other_);
  // Valid audits do not move either counter.
  ASSERT_TRUE(t_->client->Audit(SmallSnapshot(4)).ok());
  EXPECT_EQ(InvalidAudits(*t_), want_);
  EXPECT_EQ(InvalidRejections(*t_), want_ + other_);
}

// ---- Capabilities a client can follow -------------------------------------

TEST(CapabilitiesRpcTest, RecommendedChunkFitsUnderASmallReceiveLimit) {
  server::AuditServerOptions options = TestOptions(MakeTempDir("chunk"));
  options.max_message_bytes = 256 << 10;  // below the 4 MiB default chunk
  std::unique_ptr<TestServer> t = StartServer(std::move(options));
  ASSERT_NE(t, nullptr);
  absl::StatusOr<v1::Capabilities> caps = t->client->Capabilities();
  ASSERT_TRUE(caps.ok()) << caps.status();
  const int64_t chunk = caps->limits().recommended_chunk_bytes();
  EXPECT_GT(chunk, 0);
  EXPECT_LT(chunk, caps->limits().max_receive_message_bytes());
  // The client follows the advice (chunk_bytes 0) and streams a snapshot
  // larger than the limit: every chunk message is accepted.
  const Snapshot big = SmallSnapshot(1, Fault::kNone, /*context=*/512);
  v1::AuditRequest request;
  SnapshotToProto(big, request.mutable_snapshot());
  ASSERT_GT(static_cast<int64_t>(request.ByteSizeLong()), 256 << 10);
  absl::StatusOr<AuditReport> report =
      t->client->Audit(big, {}, client::Transport::kStream);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->verdict, Verdict::kPass);
}

// ---- WatchResults: live once the initial metadata arrives ----------------

TEST(WatchRpcTest, InitialMetadataArrivesAtRegistrationBeforeAnyResult) {
  std::unique_ptr<TestServer> t =
      StartServer(TestOptions(MakeTempDir("watch")));
  ASSERT_NE(t, nullptr);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  v1::WatchResultsRequest request;
  std::unique_ptr<grpc::ClientReader<v1::JobResult>> reader =
      t->stub->WatchResults(&context, request);
  std::atomic<bool> live{false};
  // Without metadata at registration this blocks until the first result
  // (or the 60 s deadline): no result is published before the check below.
  std::thread wait([&] {
    reader->WaitForInitialMetadata();
    live.store(true);
  });
  const bool announced = WaitFor([&] { return live.load(); });
  if (!announced) context.TryCancel();
  wait.join();
  ASSERT_TRUE(announced) << "no initial metadata before the first result";
  // Live means registered: a result published now reaches this watch.
  absl::StatusOr<AuditReport> report = t->client->Audit(SmallSnapshot(7));
  ASSERT_TRUE(report.ok()) << report.status();
  v1::JobResult result;
  ASSERT_TRUE(reader->Read(&result));
  EXPECT_EQ(result.state(), v1::JOB_STATE_DONE);
  EXPECT_EQ(result.labels().step(), 7);
  context.TryCancel();
  reader->Finish().error_code();
}

}  // namespace
}  // namespace attnaudit::testing
