// Calls that stay open, against hostile or revoked callers (docs/SECURITY.md
// "Open calls"): a token file reload ends the watches, streams and audits
// of a revoked credential and re-filters a watcher whose permissions
// changed; uploads in progress count against their tenant's quota and
// share of the upload budget, so one tenant's silent streams cannot block
// another tenant's; a stream that stays silent is ended.
#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/codec/stream.h"
#include "server/metrics/metrics.h"
#include "tests/integration/test_server.h"

namespace attnaudit::testing {
namespace {

// An AuditStream call that sent its header (announcing a SmallSnapshot's
// tensors) and then nothing: what a squatter holds open.
class HeldStream {
 public:
  HeldStream(v1::AuditService::Stub* stub, const std::string& token,
             bool send_header = true) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    context_.AddMetadata("authorization", "Bearer " + token);
    writer_ = stub->AuditStream(&context_, &response_);
    if (!send_header) return;
    const Snapshot snapshot = SmallSnapshot(1);
    v1::AuditStreamMessage header;
    BuildAuditStreamHeader(snapshot, 1024, header.mutable_header());
    writer_->Write(header);
  }
  ~HeldStream() {
    if (!finished_) context_.TryCancel();
    if (!finished_) writer_->Finish().IgnoreError();
  }
  // One message without bytes (an empty chunk); false once the call ended.
  bool WriteEmptyChunk() {
    v1::AuditStreamMessage empty;
    empty.mutable_chunk();
    return writer_->Write(empty);
  }
  // The call's status once the server ended it (blocks until then).
  grpc::Status Finish() {
    finished_ = true;
    return writer_->Finish();
  }

 private:
  grpc::ClientContext context_;
  v1::AuditResponse response_;
  std::unique_ptr<grpc::ClientWriter<v1::AuditStreamMessage>> writer_;
  bool finished_ = false;
};

// A whole AuditStream of a SmallSnapshot as `token`.
grpc::Status WholeStream(v1::AuditService::Stub* stub,
                         const std::string& token) {
  const Snapshot snapshot = SmallSnapshot(2);
  v1::AuditStreamMessage header;
  std::vector<const Tensor*> tensors =
      BuildAuditStreamHeader(snapshot, 1024, header.mutable_header());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  context.AddMetadata("authorization", "Bearer " + token);
  v1::AuditResponse response;
  auto writer = stub->AuditStream(&context, &response);
  writer->Write(header);
  AuditStreamChunker chunker(tensors, 64 << 10);
  v1::AuditStreamMessage chunk;
  while (chunker.Next(chunk.mutable_chunk()->mutable_data())) {
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

// The labels.step of each result a watch received, in order.
std::vector<int64_t> Steps(WatchThread& watch) {
  std::vector<int64_t> steps;
  for (const v1::JobResult& r : watch.results()) {
    steps.push_back(r.labels().step());
  }
  return steps;
}

int64_t CallsEnded(server::AuditServer* s, const std::string& reason) {
  const std::string text = s->metrics()->RenderText();
  const std::string key =
      absl::StrCat("attnaudit_calls_ended_total{reason=\"", reason, "\"} ");
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + key.size()));
}

class RevocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = MakeTempDir("open_calls_reload");
    file_ = dir + "/tokens";
    Write(
        "token:tok-a     fleet-a  audit,read\n"
        "token:tok-b     fleet-b  audit\n"
        "token:tok-watch ops      audit,read_all\n");
    server::AuditServerOptions o = TestOptions(dir + "/data");
    o.auth_token_file = file_;
    client::ClientOptions co;
    co.auth_token = "tok-a";
    t_ = StartServer(std::move(o), co);
    ASSERT_NE(t_, nullptr);
  }
  void Write(const std::string& text) { std::ofstream(file_) << text; }
  size_t Watchers() { return t_->server->service()->watch_hub()->watchers(); }

  std::string file_;
  std::unique_ptr<TestServer> t_;
};

// The attack: a read_all watch opened before its token was removed kept
// receiving every result after the reload.
TEST_F(RevocationTest, ARevokedCredentialLosesItsOpenWatch) {
  auto watcher = ConnectAs(t_->address, "tok-watch");
  WatchThread watch(watcher.get(), 1000);
  ASSERT_TRUE(WaitFor([&] { return Watchers() == 1; }));
  Write("token:tok-a fleet-a audit,read\n");
  ASSERT_TRUE(t_->server->ReloadCredentials().ok());
  watch.Join();
  EXPECT_EQ(watch.status().code(), absl::StatusCode::kUnauthenticated)
      << watch.status();
  EXPECT_TRUE(absl::StrContains(watch.status().message(), "reloaded"))
      << watch.status();
  EXPECT_EQ(CallsEnded(t_->server.get(), "credentials"), 1);
  // A client's own watch whose credential still holds goes on.
  WatchThread own(t_->client.get(), 1);
  ASSERT_TRUE(WaitFor([&] { return Watchers() == 1; }));
  ASSERT_TRUE(t_->server->ReloadCredentials().ok());
  ASSERT_TRUE(t_->client->Audit(SmallSnapshot(3)).ok());
  own.Join();
  EXPECT_TRUE(own.status().ok()) << own.status();
  EXPECT_EQ(Steps(own), std::vector<int64_t>{3});
}

TEST_F(RevocationTest, AWatcherFollowsItsChangedPermissions) {
  auto watcher = ConnectAs(t_->address, "tok-watch");
  auto b = ConnectAs(t_->address, "tok-b");
  WatchThread watch(watcher.get(), 1);
  ASSERT_TRUE(WaitFor([&] { return Watchers() == 1; }));
  // read_all -> read: from now on only its own tenant's results.
  Write(
      "token:tok-b     fleet-b  audit\n"
      "token:tok-watch ops      audit,read\n");
  ASSERT_TRUE(t_->server->ReloadCredentials().ok());
  ASSERT_TRUE(b->Audit(SmallSnapshot(4)).ok());
  absl::StatusOr<AuditReport> own = watcher->Audit(SmallSnapshot(5));
  ASSERT_TRUE(own.ok()) << own.status();
  watch.Join();
  // The one result it saw is ops's own (fleet-b's finished first).
  EXPECT_EQ(Steps(watch), std::vector<int64_t>{5});
  EXPECT_EQ(CallsEnded(t_->server.get(), "credentials"), 0);

  // read lost: the watch ends PERMISSION_DENIED.
  WatchThread again(watcher.get(), 1000);
  ASSERT_TRUE(WaitFor([&] { return Watchers() == 1; }));
  Write("token:tok-watch ops audit\n");
  ASSERT_TRUE(t_->server->ReloadCredentials().ok());
  again.Join();
  EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied)
      << again.status();
}

TEST_F(RevocationTest, ARevokedCredentialLosesItsUploadInProgress) {
  HeldStream held(t_->stub.get(), "tok-a");
  ASSERT_TRUE(WaitFor([&] {
    return t_->server->service()->uploads()->TenantUse("fleet-a").calls == 1;
  }));
  Write("token:tok-b fleet-b audit\n");
  ASSERT_TRUE(t_->server->ReloadCredentials().ok());
  const grpc::Status s = held.Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << s.error_message();
  EXPECT_TRUE(
      WaitFor([&] { return t_->server->service()->uploading_bytes() == 0; }));
}

// A unary Audit whose job waits in the queue: a reload that revokes its
// credential cancels the job and answers UNAUTHENTICATED.
TEST(RevocationQueueTest, ARevokedCredentialLosesItsQueuedAudit) {
  const std::string dir = MakeTempDir("open_calls_queued");
  const std::string file = dir + "/tokens";
  std::ofstream(file)
      << "token:tok-a fleet-a audit\ntoken:tok-b fleet-b audit\n";
  auto gate = std::make_shared<GateState>();
  server::AuditServerOptions o = TestOptions(dir + "/data");
  o.auth_token_file = file;
  o.devices.push_back(std::make_unique<GateDevice>(gate, 0));
  client::ClientOptions co;
  co.auth_token = "tok-b";
  auto t = StartServer(std::move(o), co);
  ASSERT_NE(t, nullptr);
  auto a = ConnectAs(t->address, "tok-a");
  absl::Status running, queued;
  std::thread first(
      [&] { running = t->client->Audit(SmallSnapshot(1)).status(); });
  ASSERT_TRUE(gate->WaitStarted(1));
  std::thread second([&] { queued = a->Audit(SmallSnapshot(2)).status(); });
  ASSERT_TRUE(
      WaitFor([&] { return t->server->scheduler()->Stats().queued[0] == 1; }));
  std::ofstream(file) << "token:tok-b fleet-b audit\n";
  ASSERT_TRUE(t->server->ReloadCredentials().ok());
  second.join();
  EXPECT_EQ(queued.code(), absl::StatusCode::kUnauthenticated) << queued;
  gate->Open();
  first.join();
  EXPECT_TRUE(running.ok()) << running;
}

class UploadTest : public ::testing::Test {
 protected:
  void Start(absl::Duration idle_timeout) {
    const std::string dir = MakeTempDir("open_calls_upload");
    server::AuditServerOptions o = TestOptions(dir + "/data");
    // Room for ~29 SmallSnapshot uploads; one tenant may hold half.
    o.memory_budget_bytes = int64_t{8} << 20;
    o.upload_idle_timeout = idle_timeout;
    o.auth_tokens =
        "token:tok-a fleet-a audit max_jobs=4 max_bytes=256MiB\n"
        "token:tok-b fleet-b audit\n"
        "token:tok-c fleet-c audit\n"
        "token:tok-d fleet-d audit\n";
    client::ClientOptions co;
    co.auth_token = "tok-b";
    t_ = StartServer(std::move(o), co);
    ASSERT_NE(t_, nullptr);
  }
  server::UploadLedger::Use Use(const std::string& tenant) {
    return t_->server->service()->uploads()->TenantUse(tenant);
  }

  std::unique_ptr<TestServer> t_;
};

// The attack: a tenant with max_jobs=4 opened 18 streams announcing large
// snapshots and sent nothing more; another tenant's stream failed with
// "upload budget" for as long as they stayed open.
TEST_F(UploadTest, SilentStreamsOfOneTenantCannotBlockAnother) {
  Start(absl::Seconds(30));
  std::vector<std::unique_ptr<HeldStream>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<HeldStream>(t_->stub.get(), "tok-a"));
  }
  ASSERT_TRUE(WaitFor([&] { return Use("fleet-a").calls == 4; }));
  for (int i = 4; i < 18; ++i) {
    HeldStream extra(t_->stub.get(), "tok-a");
    const grpc::Status s = extra.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << i;
    EXPECT_TRUE(absl::StrContains(s.error_message(), "tenant quota"))
        << s.error_message();
  }
  EXPECT_EQ(Use("fleet-a").calls, 4);
  EXPECT_TRUE(WholeStream(t_->stub.get(), "tok-b").ok());

  // A tenant without a quota takes at most its share of the budget.
  std::vector<std::unique_ptr<HeldStream>> greedy;
  grpc::Status refused;
  for (int i = 0; i < 40 && refused.ok(); ++i) {
    greedy.push_back(std::make_unique<HeldStream>(t_->stub.get(), "tok-c"));
    const int64_t want = i + 1;
    if (!WaitFor([&] { return Use("fleet-c").calls == want; },
                 absl::Seconds(2))) {
      refused = greedy.back()->Finish();
    }
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "one tenant may"))
      << refused.error_message();
  EXPECT_LE(Use("fleet-c").bytes,
            t_->server->service()->uploads()->tenant_limit());
  EXPECT_TRUE(WholeStream(t_->stub.get(), "tok-b").ok());
}

TEST_F(UploadTest, SilentStreamsAreEndedAndTheirReservationFreed) {
  Start(absl::Seconds(1));
  HeldStream after_header(t_->stub.get(), "tok-a");
  HeldStream before_header(t_->stub.get(), "tok-a", /*send_header=*/false);
  ASSERT_TRUE(WaitFor([&] { return Use("fleet-a").calls == 1; }));
  for (HeldStream* held : {&after_header, &before_header}) {
    const grpc::Status s = held->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "--upload-idle-timeout"))
        << s.error_message();
  }
  EXPECT_TRUE(
      WaitFor([&] { return t_->server->service()->uploading_bytes() == 0; }));
  // Counted when the server ends the call, which the client may see first.
  EXPECT_TRUE(WaitFor([&] {
    return CallsEnded(t_->server.get(), "upload_idle") == 2;
  })) << CallsEnded(t_->server.get(), "upload_idle");
  // A stream that keeps sending is not idle, however long it takes.
  EXPECT_TRUE(WholeStream(t_->stub.get(), "tok-a").ok());
}

// Two tenants fill the upload budget with streams that send
// an empty chunk every 200 ms (the idle timeout is 1 s); a third tenant's
// upload must get in once they are ended for delivering no bytes.
TEST_F(UploadTest, TricklingEmptyChunksCannotHoldTheUploadBudget) {
  Start(absl::Seconds(1));
  std::vector<std::unique_ptr<HeldStream>> squat;
  for (const char* token : {"tok-c", "tok-d"}) {
    for (int i = 0; i < 40; ++i) {
      auto held = std::make_unique<HeldStream>(t_->stub.get(), token);
      if (!held->WriteEmptyChunk()) break;  // refused: its share is full
      squat.push_back(std::move(held));
    }
  }
  ASSERT_TRUE(WaitFor(
      [&] { return Use("fleet-c").calls > 4 && Use("fleet-d").calls > 4; }));
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop.load()) {
      for (auto& held : squat) held->WriteEmptyChunk();
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  // Before: refused for as long as the squatters trickled. Now: once a
  // window of 1 s passed without their bytes, they are ended.
  EXPECT_TRUE(WaitFor([&] {
    return WholeStream(t_->stub.get(), "tok-b").ok();
  })) << "another tenant's upload never got in";
  EXPECT_TRUE(WaitFor(
      [&] { return Use("fleet-c").calls == 0 && Use("fleet-d").calls == 0; }));
  stop.store(true);
  trickle.join();
  // Each squatter was ended for delivering no bytes, or refused at once
  // (past its tenant's share: its own first write could not tell).
  int ended = 0;
  for (auto& held : squat) {
    const grpc::Status s = held->Finish();
    ended += s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
        << s.error_code() << " " << s.error_message();
  }
  EXPECT_GE(ended, 10);  // the streams that held both tenants' shares
}

}  // namespace
}  // namespace attnaudit::testing
