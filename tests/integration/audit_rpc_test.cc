// Audit and AuditStream against an in-process server on loopback: the
// report equals the offline pipeline's, snapshots past the unary limit go
// through the stream, bad input is INVALID_ARGUMENT naming the field, and
// the stream protocol's violations are refused with their place. Also
// GetCapabilities, health with real service names, reflection and the
// bearer token.
#include <spdlog/sinks/ringbuffer_sink.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "client/lib/memfd_snapshot.h"
#include "core/audit/audit.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "proto/codec/stream.h"
#include "server/log/log.h"
#include "sim/simulator.h"
#include "tests/integration/test_server.h"

namespace attnaudit::testing {
namespace {

AuditReport Offline(const Snapshot& snapshot) {
  AuditOptions options;
  options.threads = 1;
  absl::StatusOr<AuditReport> r = RunAudit(snapshot, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : AuditReport();
}

// The service must return exactly what the offline pipeline computes (same
// code, same inputs after a lossless round trip through the wire).
void ExpectSameReport(const AuditReport& got, const AuditReport& want) {
  EXPECT_EQ(got.verdict, want.verdict);
  ASSERT_EQ(got.comparisons.size(), want.comparisons.size());
  for (size_t i = 0; i < want.comparisons.size(); ++i) {
    const ComparisonResult& g = got.comparisons[i];
    const ComparisonResult& w = want.comparisons[i];
    EXPECT_EQ(g.comparison, w.comparison);
    EXPECT_EQ(g.verdict, w.verdict);
    EXPECT_EQ(g.out.max_abs, w.out.max_abs) << ComparisonName(w.comparison);
    EXPECT_EQ(g.out.max_ulp, w.out.max_ulp);
    EXPECT_EQ(g.lse.max_abs, w.lse.max_abs);
    EXPECT_EQ(g.out.worst.head, w.out.worst.head);
  }
  EXPECT_EQ(got.labels.model, want.labels.model);
  EXPECT_EQ(got.labels.step, want.labels.step);
}

class AuditRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = StartServer(TestOptions(MakeTempDir("audit_rpc")));
    ASSERT_NE(t_, nullptr);
  }
  std::unique_ptr<TestServer> t_;
};

TEST_F(AuditRpcTest, UnaryAuditMatchesTheOfflinePipeline) {
  const Snapshot snapshot = SmallSnapshot(7);
  absl::StatusOr<AuditReport> report =
      t_->client->Audit(snapshot, {}, client::Transport::kUnary);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectSameReport(*report, Offline(snapshot));
  EXPECT_EQ(report->verdict, Verdict::kPass);
}

TEST_F(AuditRpcTest, StreamedAuditMatchesTheOfflinePipeline) {
  const Snapshot snapshot = SmallSnapshot(8, Fault::kStalePage, 256);
  absl::StatusOr<AuditReport> report =
      t_->client->Audit(snapshot, {}, client::Transport::kStream);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectSameReport(*report, Offline(snapshot));
  // The injected stale page is engine drift the verdict must catch.
  EXPECT_EQ(report->verdict, Verdict::kDrift);
}

// Context-parallel snapshots run as a gang of CPU workers (2 here): W = 2
// gets a worker per rank, W = 3 runs its ranks in turns on the two. The
// report -- the CP section included -- is the offline pipeline's.
TEST(AuditRpcCpTest, ContextParallelSnapshotsMatchTheOfflinePipeline) {
  server::AuditServerOptions options = TestOptions(MakeTempDir("audit_cp"));
  options.cpu_workers = 2;
  std::unique_ptr<TestServer> t = StartServer(std::move(options));
  ASSERT_NE(t, nullptr);
  for (int64_t world : {2, 3}) {
    SynthOptions o;
    o.preset = "qwen3-8b";
    o.batch = 2;
    o.context = 90;
    o.vocab = 16;
    o.seed = static_cast<uint64_t>(world);
    o.cp_world_size = world;
    o.cp_sharding = CpSharding::kTokenInterleaved;
    o.cp_interleave = 3;
    o.cp_fault = world == 3 ? CpFault::kStaleRankPage : CpFault::kNone;
    absl::StatusOr<Snapshot> snapshot = Synthesize(o);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    for (CpStrategy strategy : {CpStrategy::kRing, CpStrategy::kPartials}) {
      AuditOptions audit;
      audit.cp_strategy = strategy;
      client::CallOptions call;
      AuditOptionsToProto(audit, &call.audit_options);
      absl::StatusOr<AuditReport> got =
          t->client->Audit(*snapshot, call, client::Transport::kUnary);
      ASSERT_TRUE(got.ok()) << got.status();
      audit.threads = 1;
      absl::StatusOr<AuditReport> want = RunAudit(*snapshot, audit);
      ASSERT_TRUE(want.ok()) << want.status();
      ExpectSameReport(*got, *want);
      const CpReport& g = got->cp;
      const CpReport& w = want->cp;
      ASSERT_TRUE(g.present);
      EXPECT_EQ(g.strategy, w.strategy);
      EXPECT_EQ(g.shard_tokens, w.shard_tokens);
      EXPECT_EQ(g.steps, w.steps);
      EXPECT_EQ(g.workers, 2);  // the gang
      EXPECT_EQ(g.execution, strategy == CpStrategy::kRing && world == 2
                                 ? "thread_per_rank"
                                 : "lockstep");
      EXPECT_TRUE(g.deterministic_matches_replay);
      EXPECT_EQ(g.engine_order.out.max_abs, w.engine_order.out.max_abs);
      EXPECT_EQ(g.deterministic.lse.max_abs, w.deterministic.lse.max_abs);
      ASSERT_EQ(g.ranks.size(), w.ranks.size());
      for (size_t k = 0; k < w.ranks.size(); ++k) {
        EXPECT_EQ(g.ranks[k].rank, w.ranks[k].rank);
        EXPECT_EQ(g.ranks[k].check.verdict, w.ranks[k].check.verdict);
        EXPECT_EQ(g.ranks[k].check.out.max_abs, w.ranks[k].check.out.max_abs);
        EXPECT_EQ(g.ranks[k].check.lse.max_abs, w.ranks[k].check.lse.max_abs);
      }
      EXPECT_EQ(g.combine.verdict, w.combine.verdict);
      EXPECT_EQ(g.combine.out.max_abs, w.combine.out.max_abs);
      EXPECT_EQ(got->provenance.timings.cp_rank_compute_seconds.size(),
                static_cast<size_t>(world));
      EXPECT_EQ(got->verdict, world == 3 ? Verdict::kDrift : Verdict::kPass);
    }
  }
}

TEST_F(AuditRpcTest, InvalidSnapshotIsInvalidArgumentNamingTheField) {
  Snapshot snapshot = SmallSnapshot(9);
  snapshot.block_table.mutable_data<int32_t>()[0] = 999;  // no such page
  for (client::Transport transport :
       {client::Transport::kUnary, client::Transport::kStream}) {
    absl::StatusOr<AuditReport> report =
        t_->client->Audit(snapshot, {}, transport);
    ASSERT_FALSE(report.ok());
    EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(
        absl::StartsWith(report.status().message(), "snapshot.block_table"))
        << report.status();
  }
}

// Snapshots handed over in a sealed memfd (server/memfd): the same report
// as the offline pipeline; the server's kept mapping sees what the client
// writes next; invalid content is named; a server without the switch
// refuses the field, and a request may not carry both forms.
std::unique_ptr<TestServer> MemfdServer(const std::string& name) {
  server::AuditServerOptions options = TestOptions(MakeTempDir(name));
  options.accept_memfd_snapshots = true;
  return StartServer(std::move(options));
}

TEST(AuditRpcMemfdTest, MemfdAuditMatchesTheOfflinePipeline) {
  std::unique_ptr<TestServer> t = MemfdServer("audit_rpc_memfd");
  ASSERT_NE(t, nullptr);
  absl::StatusOr<v1::Capabilities> caps = t->client->Capabilities();
  ASSERT_TRUE(caps.ok());
  EXPECT_TRUE(caps->accepts_memfd_snapshots());
  const Snapshot snapshot = SmallSnapshot(11, Fault::kStalePage, 256);
  absl::StatusOr<AuditReport> report =
      t->client->Audit(snapshot, {}, client::Transport::kMemfd);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectSameReport(*report, Offline(snapshot));
  EXPECT_EQ(report->verdict, Verdict::kDrift);
}

TEST(AuditRpcMemfdTest, OneMemfdRewrittenBetweenAuditsIsReadAfresh) {
  std::unique_ptr<TestServer> t = MemfdServer("audit_rpc_memfd_reuse");
  ASSERT_NE(t, nullptr);
  const Snapshot clean = SmallSnapshot(12, Fault::kNone, 256);
  const Snapshot stale = SmallSnapshot(12, Fault::kStalePage, 256);
  const Snapshot longer = SmallSnapshot(13, Fault::kNone, 512);
  absl::StatusOr<std::unique_ptr<client::MemfdSnapshot>> memfd =
      client::MemfdSnapshot::Create(clean);
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  for (const Snapshot* s : {&clean, &stale, &clean, &longer}) {
    ASSERT_TRUE((*memfd)->Write(*s).ok());
    v1::AuditRequest request;
    (*memfd)->Describe(&request);
    absl::StatusOr<v1::AuditResponse> response = t->client->AuditUnary(request);
    ASSERT_TRUE(response.ok()) << response.status();
    absl::StatusOr<AuditReport> report = ReportFromProto(response->report());
    ASSERT_TRUE(report.ok());
    ExpectSameReport(*report, Offline(*s));
  }
}

TEST(AuditRpcMemfdTest, InvalidContentIsNamed) {
  std::unique_ptr<TestServer> t = MemfdServer("audit_rpc_memfd_invalid");
  ASSERT_NE(t, nullptr);
  Snapshot snapshot = SmallSnapshot(14);
  snapshot.block_table.mutable_data<int32_t>()[0] = 999;  // no such page
  absl::StatusOr<AuditReport> report =
      t->client->Audit(snapshot, {}, client::Transport::kMemfd);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(report.status().message(), "block_table"))
      << report.status();
  // A memfd that holds no snapshot at all.
  absl::StatusOr<std::unique_ptr<client::MemfdSnapshot>> memfd =
      client::MemfdSnapshot::Create(SmallSnapshot(15));
  ASSERT_TRUE(memfd.ok());
  v1::AuditRequest request;
  (*memfd)->Describe(&request);
  request.mutable_snapshot_memfd()->set_bytes(3);  // a cut encoding
  absl::StatusOr<v1::AuditResponse> cut = t->client->AuditUnary(request);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(cut.status().message(), "snapshot_memfd"))
      << cut.status();
}

TEST_F(AuditRpcTest, MemfdSnapshotsNeedTheSwitchAndComeAlone) {
  absl::StatusOr<v1::Capabilities> caps = t_->client->Capabilities();
  ASSERT_TRUE(caps.ok());
  EXPECT_FALSE(caps->accepts_memfd_snapshots());
  const Snapshot snapshot = SmallSnapshot(16);
  absl::StatusOr<AuditReport> report =
      t_->client->Audit(snapshot, {}, client::Transport::kMemfd);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StrContains(report.status().message(), "--accept-memfd-snapshots"))
      << report.status();
  absl::StatusOr<std::unique_ptr<client::MemfdSnapshot>> memfd =
      client::MemfdSnapshot::Create(snapshot);
  ASSERT_TRUE(memfd.ok());
  v1::AuditRequest both;
  (*memfd)->Describe(&both);
  SnapshotToProto(snapshot, both.mutable_snapshot());
  absl::StatusOr<v1::AuditResponse> r = t_->client->AuditUnary(both);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "snapshot_memfd"))
      << r.status();
}

TEST_F(AuditRpcTest, UnknownEnumIsInvalidArgumentNamingTheField) {
  v1::AuditRequest request;
  SnapshotToProto(SmallSnapshot(10), request.mutable_snapshot());
  request.mutable_snapshot()->mutable_rope()->set_style(
      static_cast<v1::RopeStyle>(7));
  grpc::ClientContext context;
  v1::AuditResponse response;
  grpc::Status s = t_->stub->Audit(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "snapshot.rope.style"))
      << s.error_message();

  request.set_priority(static_cast<v1::Priority>(9));
  grpc::ClientContext context2;
  s = t_->stub->Audit(&context2, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "priority"))
      << s.error_message();

  grpc::ClientContext context3;
  s = t_->stub->Audit(&context3, v1::AuditRequest(), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "snapshot: missing");
}

// Sends `messages` on AuditStream and returns the call's status.
grpc::Status SendStream(v1::AuditService::Stub* stub,
                        const std::vector<v1::AuditStreamMessage>& messages) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1::AuditResponse response;
  auto writer = stub->AuditStream(&context, &response);
  for (const v1::AuditStreamMessage& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

TEST_F(AuditRpcTest, StreamProtocolViolationsAreRefusedWithTheirPlace) {
  const Snapshot snapshot = SmallSnapshot(11);
  v1::AuditStreamMessage header;
  std::vector<const Tensor*> streamed =
      BuildAuditStreamHeader(snapshot, 1024, header.mutable_header());
  ASSERT_FALSE(streamed.empty());
  AuditStreamChunker chunker(streamed, 64 << 10);
  std::vector<v1::AuditStreamMessage> chunks;
  v1::AuditStreamMessage chunk;
  while (chunker.Next(chunk.mutable_chunk()->mutable_data())) {
    chunks.push_back(chunk);
  }
  ASSERT_GE(chunks.size(), 2u);

  {  // The whole, correct stream works (the control for the cases below).
    std::vector<v1::AuditStreamMessage> all = {header};
    all.insert(all.end(), chunks.begin(), chunks.end());
    EXPECT_TRUE(SendStream(t_->stub.get(), all).ok());
  }
  {  // A chunk before the header.
    grpc::Status s = SendStream(t_->stub.get(), {chunks[0]});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StartsWith(s.error_message(), "chunk"))
        << s.error_message();
  }
  {  // A byte length that disagrees with the tensor's shape.
    v1::AuditStreamMessage bad = header;
    bad.mutable_header()->mutable_manifest(0)->set_byte_length(
        bad.header().manifest(0).byte_length() + 2);
    grpc::Status s = SendStream(t_->stub.get(), {bad});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(
        absl::StartsWith(s.error_message(), "header.manifest[0].byte_length"))
        << s.error_message();
  }
  {  // Half-closed before every announced byte arrived.
    grpc::Status s = SendStream(t_->stub.get(), {header, chunks[0]});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StrContains(s.error_message(), "stream ended after"))
        << s.error_message();
  }
  {  // More bytes than announced.
    std::vector<v1::AuditStreamMessage> all = {header};
    all.insert(all.end(), chunks.begin(), chunks.end());
    all.push_back(chunks[0]);
    grpc::Status s = SendStream(t_->stub.get(), all);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StartsWith(s.error_message(), "chunk"))
        << s.error_message();
  }
  {  // A second header.
    grpc::Status s = SendStream(t_->stub.get(), {header, header});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StartsWith(s.error_message(), "header"))
        << s.error_message();
  }
  {  // Nothing at all.
    grpc::Status s = SendStream(t_->stub.get(), {});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
}

TEST(AuditRpcLimitsTest, SnapshotPastTheUnaryLimitIsStreamed) {
  server::AuditServerOptions options = TestOptions(MakeTempDir("limit"));
  options.max_message_bytes = 64 << 10;
  client::ClientOptions client_options;
  client_options.chunk_bytes = 32 << 10;  // chunks under the limit
  std::unique_ptr<TestServer> t =
      StartServer(std::move(options), client_options);
  ASSERT_NE(t, nullptr);
  const Snapshot snapshot = SmallSnapshot(12);
  ASSERT_GT(snapshot.k_pages.bytes().size() + snapshot.v_pages.bytes().size(),
            size_t{64} << 10);

  // The unary call cannot carry it: gRPC's own receive limit answers.
  absl::StatusOr<AuditReport> unary =
      t->client->Audit(snapshot, {}, client::Transport::kUnary);
  ASSERT_FALSE(unary.ok());
  EXPECT_EQ(unary.status().code(), absl::StatusCode::kResourceExhausted);

  // Auto picks the stream from GetCapabilities' limit, and it works.
  absl::StatusOr<client::Transport> chosen =
      t->client->ChooseTransport(static_cast<int64_t>(
          snapshot.k_pages.bytes().size() + snapshot.v_pages.bytes().size()));
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(*chosen, client::Transport::kStream);
  absl::StatusOr<AuditReport> report = t->client->Audit(snapshot);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectSameReport(*report, Offline(snapshot));
}

TEST(AuditRpcLimitsTest, StreamOverTheStreamLimitIsRefusedBeforeItsChunks) {
  server::AuditServerOptions options = TestOptions(MakeTempDir("streamlimit"));
  options.memory_budget_bytes = 64 << 10;  // also caps max_stream_bytes
  std::unique_ptr<TestServer> t = StartServer(std::move(options));
  ASSERT_NE(t, nullptr);
  const Snapshot snapshot = SmallSnapshot(13);
  v1::AuditStreamMessage header;
  BuildAuditStreamHeader(snapshot, 1024, header.mutable_header());
  grpc::Status s = SendStream(t->stub.get(), {header});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "header.manifest"))
      << s.error_message();
}

TEST_F(AuditRpcTest, CapabilitiesDescribeTheServer) {
  absl::StatusOr<v1::Capabilities> caps = t_->client->Capabilities();
  ASSERT_TRUE(caps.ok()) << caps.status();
  EXPECT_EQ(caps->api_version(), "attnaudit.v1");
  EXPECT_FALSE(caps->version().empty());
  EXPECT_EQ(caps->limits().max_receive_message_bytes(), int64_t{256} << 20);
  EXPECT_GT(caps->limits().recommended_chunk_bytes(), 0);
  EXPECT_EQ(caps->limits().interactive_queue_capacity(), 64);
  EXPECT_EQ(caps->limits().sampled_queue_capacity(), 1024);
  ASSERT_EQ(caps->devices_size(), 1);
  EXPECT_EQ(caps->devices(0).kind(), v1::DEVICE_KIND_CPU);
  ASSERT_GE(caps->backends_size(), 1);
  EXPECT_EQ(caps->backends(0).name(), "cpu");
  EXPECT_TRUE(caps->backends(0).available());
}

// --devices all: GPU workers where there are GPUs; otherwise the CPU
// workers, and GetCapabilities says why (as the start-up log does).
TEST(AuditRpcDevicesTest, AllWithoutAGpuSaysSoInCapabilities) {
  server::AuditServerOptions options = TestOptions(MakeTempDir("devall"));
  options.device_selection.mode = server::DeviceSelection::Mode::kAll;
  options.cpu_workers = 1;
  options.threads_per_job = 1;
  std::unique_ptr<TestServer> t = StartServer(std::move(options));
  ASSERT_NE(t, nullptr);
  absl::StatusOr<v1::Capabilities> caps = t->client->Capabilities();
  ASSERT_TRUE(caps.ok()) << caps.status();
  ASSERT_GE(caps->devices_size(), 1);
  ASSERT_EQ(caps->backends_size(), 2);
  const v1::Backend& cuda = caps->backends(1);
  EXPECT_EQ(cuda.name(), "cuda");
  if (caps->devices(0).kind() == v1::DEVICE_KIND_GPU) {
    EXPECT_TRUE(cuda.available());
    EXPECT_FALSE(caps->devices(0).compute_capability().empty());
    EXPECT_GT(caps->devices(0).memory_bytes(), 0);
    return;
  }
  ASSERT_EQ(caps->devices_size(), 1);
  EXPECT_EQ(caps->devices(0).id(), "cpu:0");
  EXPECT_EQ(caps->devices(0).name(), "CPU worker");
  EXPECT_FALSE(cuda.available());
  EXPECT_TRUE(absl::StrContains(cuda.detail(), "--devices all: "))
      << cuda.detail();
  EXPECT_TRUE(absl::StrContains(cuda.detail(), "running on 1 CPU worker"))
      << cuda.detail();
  EXPECT_TRUE(absl::StrContains(cuda.detail(), t->server->devices_note()))
      << t->server->devices_note();
}

TEST_F(AuditRpcTest, HealthUsesRealServiceNames) {
  grpc::Status s;
  EXPECT_EQ(HealthCheck(t_->channel, "", &s), 1) << s.error_message();
  EXPECT_EQ(HealthCheck(t_->channel, "attnaudit.v1.AuditService", &s), 1)
      << s.error_message();
  EXPECT_EQ(HealthCheck(t_->channel, "no.such.Service", &s), -1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AuditRpcTest, ReflectionListsTheService) {
  grpc::Status s;
  const std::string services = ReflectionListServices(t_->channel, &s);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(absl::StrContains(services, "attnaudit.v1.AuditService"));
  EXPECT_TRUE(absl::StrContains(services, "grpc.health.v1.Health"));
}

TEST(AuditRpcAuthTest, BearerTokenIsRequiredExceptForHealth) {
  server::AuditServerOptions options = TestOptions(MakeTempDir("auth"));
  options.auth_tokens = "s3cret-token";
  std::unique_ptr<TestServer> t = StartServer(std::move(options));
  ASSERT_NE(t, nullptr);
  const Snapshot snapshot = SmallSnapshot(14);

  absl::StatusOr<AuditReport> denied = t->client->Audit(snapshot);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE(absl::StrContains(denied.status().message(), "s3cret"));
  absl::StatusOr<v1::SubmitResponse> submit = t->client->Submit(snapshot);
  EXPECT_EQ(submit.status().code(), absl::StatusCode::kUnauthenticated);
  absl::StatusOr<AuditReport> streamed =
      t->client->Audit(snapshot, {}, client::Transport::kStream);
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kUnauthenticated);

  client::ClientOptions wrong;
  wrong.address = t->address;
  wrong.auth_token = "s3cret-tokeX";
  auto wrong_client = client::Client::Connect(wrong);
  ASSERT_TRUE(wrong_client.ok());
  EXPECT_EQ((*wrong_client)->Capabilities().status().code(),
            absl::StatusCode::kUnauthenticated);

  client::ClientOptions right = wrong;
  right.auth_token = "s3cret-token";
  auto right_client = client::Client::Connect(right);
  ASSERT_TRUE(right_client.ok());
  absl::StatusOr<AuditReport> report = (*right_client)->Audit(snapshot);
  EXPECT_TRUE(report.ok()) << report.status();

  grpc::Status s;  // probes carry no token
  EXPECT_EQ(HealthCheck(t->channel, "attnaudit.v1.AuditService", &s), 1);
}

// The bearer token, right or wrong, never reaches a log line, even with
// one line per call (debug).
TEST(AuditRpcAuthTest, TokensNeverReachTheLog) {
  server::AuditServerOptions options = TestOptions(MakeTempDir("authlog"));
  options.auth_tokens = "s3cret-token";
  std::unique_ptr<TestServer> t = StartServer(std::move(options));
  ASSERT_NE(t, nullptr);
  auto lines = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  server::ConfigureLogging(spdlog::level::debug, lines);
  const Snapshot snapshot = SmallSnapshot(15);
  for (const char* token : {"", "s3cret-tokeX", "s3cret-token"}) {
    client::ClientOptions o;
    o.address = t->address;
    o.auth_token = token;
    auto c = client::Client::Connect(o);
    ASSERT_TRUE(c.ok());
    (*c)->Audit(snapshot).IgnoreError();
    (*c)->Submit(snapshot).IgnoreError();
    (*c)->GetResult("s-no-such-job").IgnoreError();
    (*c)->Cancel("bad id!").IgnoreError();
  }
  // Each call's line is written when the call is done on the server, which
  // may be just after the client has its answer.
  auto logged = [&lines] {
    int calls = 0;
    for (const std::string& line : lines->last_formatted()) {
      calls += absl::StrContains(line, " msg=rpc method=") ? 1 : 0;
    }
    return calls;
  };
  EXPECT_TRUE(WaitFor([&] { return logged() >= 12; })) << logged();
  server::ConfigureLogging(spdlog::level::warn);
  for (const std::string& line : lines->last_formatted()) {
    EXPECT_FALSE(absl::StrContains(line, "s3cret")) << line;
  }
}

TEST(AuditRpcShutdownTest, ShutdownTurnsHealthNotServingBeforeItStops) {
  server::AuditServerOptions options = TestOptions(MakeTempDir("shutdown"));
  options.drain_delay = absl::Seconds(2);
  std::unique_ptr<TestServer> t = StartServer(std::move(options));
  ASSERT_NE(t, nullptr);
  grpc::Status s;
  ASSERT_EQ(HealthCheck(t->channel, "attnaudit.v1.AuditService", &s), 1);
  std::thread stopper([&] { t->server->Shutdown(); });
  // During the drain delay the server still answers, NOT_SERVING.
  EXPECT_TRUE(WaitFor([&] {
    grpc::Status st;
    return HealthCheck(t->channel, "attnaudit.v1.AuditService", &st) == 2;
  }));
  EXPECT_EQ(HealthCheck(t->channel, "", &s), 2);
  stopper.join();
}

}  // namespace
}  // namespace attnaudit::testing
