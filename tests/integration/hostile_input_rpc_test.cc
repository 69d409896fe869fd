// Requests no generated client would send: bytes that do not decode are
// INVALID_ARGUMENT naming the field and byte on every RPC (never
// UNIMPLEMENTED with an empty message), a few thousand mutated requests
// leave the server healthy and get only documented codes, and label values
// of any length or charset come back bounded (with the truncation marker)
// and keep /metrics small.
#include <grpcpp/generic/generic_stub.h>

#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "server/jobs/label_bounds.h"
#include "tests/integration/test_server.h"

namespace attnaudit::testing {
namespace {

constexpr char kService[] = "/attnaudit.v1.AuditService/";

std::string Method(const char* name) { return absl::StrCat(kService, name); }

// A streaming call of `method` with raw messages: writes them, half-closes,
// reads whatever comes back, returns the final status.
grpc::Status RawStreamCall(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& method,
                           const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&context, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  auto next = [&] {
    return cq.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + kWait)) ==
               grpc::CompletionQueue::GOT_EVENT &&
           ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool open = next();
  for (const std::string& m : messages) {
    if (!open) break;
    grpc::Slice slice(m);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    open = next();
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    next();
  }
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(4));
  next();
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  next();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = StartServer(TestOptions(MakeTempDir("hostile")));
    ASSERT_NE(t_, nullptr);
  }
  void ExpectUndecodable(const grpc::Status& s, const std::string& prefix) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << s.error_message();
    EXPECT_TRUE(absl::StartsWith(s.error_message(), prefix))
        << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "cannot decode"))
        << s.error_message();
  }
  std::unique_ptr<TestServer> t_;
};

TEST_F(HostileInputTest, UndecodableBytesAreInvalidArgumentOnEveryRpc) {
  // Wire type 7 does not exist.
  for (const char* m :
       {"Audit", "Submit", "GetResult", "Cancel", "GetCapabilities"}) {
    ExpectUndecodable(RawUnaryCall(t_->channel, Method(m), "\x0f"),
                      "request: cannot decode: invalid wire type 7");
  }
  ExpectUndecodable(
      RawStreamCall(t_->channel, Method("WatchResults"), {"\x0f"}),
      "request: cannot decode");
  ExpectUndecodable(RawStreamCall(t_->channel, Method("AuditStream"), {"\x0f"}),
                    "request: cannot decode");
  // A job id that is not UTF-8.
  ExpectUndecodable(
      RawUnaryCall(t_->channel, Method("GetResult"),
                   "\x0a\x03"
                   "ab\xff"),
      "job_id: cannot decode: a string field that is not valid UTF-8");
  // A Submit cut off in the middle of its snapshot.
  v1::SubmitRequest submit;
  SnapshotToProto(SmallSnapshot(1), submit.mutable_snapshot());
  const std::string bytes = submit.SerializeAsString();
  ExpectUndecodable(RawUnaryCall(t_->channel, Method("Submit"),
                                 bytes.substr(0, bytes.size() / 2)),
                    "snapshot.");
  // An AuditStream whose second message is a cut-off chunk.
  v1::AuditStreamMessage chunk;
  chunk.mutable_chunk()->set_data(std::string(100, 'x'));
  const std::string c = chunk.SerializeAsString();
  v1::AuditStreamMessage header;
  header.mutable_header();
  ExpectUndecodable(
      RawStreamCall(t_->channel, Method("AuditStream"),
                    {header.SerializeAsString(), c.substr(0, 50)}),
      "chunk.data: cannot decode");
  // Nothing of this created a job or hurt the server.
  grpc::Status health;
  EXPECT_EQ(HealthCheck(t_->channel, "attnaudit.v1.AuditService", &health), 1);
  EXPECT_TRUE(t_->client->Audit(SmallSnapshot(2)).ok());
}

TEST_F(HostileInputTest, MutatedRequestsGetDocumentedCodesAndLeaveItHealthy) {
  // Valid requests of each unary RPC, then random byte edits of them.
  v1::AuditRequest audit;
  SnapshotToProto(SmallSnapshot(3, Fault::kNone, 16), audit.mutable_snapshot());
  v1::SubmitRequest submit;
  *submit.mutable_snapshot() = audit.snapshot();
  submit.set_idempotency_key("fuzz");
  v1::GetResultRequest get;
  get.set_job_id("s0000000000000000000000");
  v1::CancelRequest cancel;
  cancel.set_job_id("s0000000000000000000000");
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"Audit", audit.SerializeAsString()},
      {"Submit", submit.SerializeAsString()},
      {"GetResult", get.SerializeAsString()},
      {"Cancel", cancel.SerializeAsString()},
      {"GetCapabilities", ""}};
  const std::set<grpc::StatusCode> documented = {
      grpc::StatusCode::OK,        grpc::StatusCode::INVALID_ARGUMENT,
      grpc::StatusCode::NOT_FOUND, grpc::StatusCode::RESOURCE_EXHAUSTED,
      grpc::StatusCode::ABORTED,   grpc::StatusCode::FAILED_PRECONDITION};
  std::mt19937 rng(2024);
  int undecodable = 0;
  const int kRequests = 1000;
  for (int i = 0; i < kRequests; ++i) {
    const auto& [method, good] = seeds[i % seeds.size()];
    std::string bytes = good;
    for (int e = 1 + static_cast<int>(rng() % 3); e > 0 && !bytes.empty();
         --e) {
      if (rng() % 4 == 0) {
        bytes.resize(rng() % bytes.size());
      } else {
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
      }
    }
    const grpc::Status s =
        RawUnaryCall(t_->channel, Method(method.c_str()), bytes);
    EXPECT_TRUE(documented.count(s.error_code()))
        << method << ": " << s.error_code() << " " << s.error_message();
    EXPECT_NE(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      EXPECT_FALSE(s.error_message().empty());
      undecodable += absl::StrContains(s.error_message(), "cannot decode");
    }
  }
  EXPECT_GT(undecodable, kRequests / 10);
  grpc::Status health;
  EXPECT_EQ(HealthCheck(t_->channel, "", &health), 1);
  EXPECT_TRUE(t_->client->Audit(SmallSnapshot(4)).ok());
}

TEST(HostileLabelsTest, LabelsAreBoundedBeforeReportsStoreAndMetrics) {
  server::AuditServerOptions o = TestOptions(MakeTempDir("labels"));
  o.metrics_max_models = 4;
  auto t = StartServer(std::move(o));
  ASSERT_NE(t, nullptr);
  Snapshot s = SmallSnapshot(1);
  s.labels.model = std::string(1 << 20, 'm');         // 1 MiB
  s.labels.engine = "vllm \"quoted\"\n\x01\xc3\xa9";  // UTF-8, not ASCII
  absl::StatusOr<AuditReport> report = t->client->Audit(s);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->labels.model.size(), server::kMaxLabelBytes);
  EXPECT_TRUE(absl::EndsWith(report->labels.model, server::kTruncationMarker));
  EXPECT_EQ(report->labels.engine, "vllm _quoted_____");
  // The durable path stores the bounded value too.
  absl::StatusOr<v1::SubmitResponse> sub = t->client->Submit(s);
  ASSERT_TRUE(sub.ok()) << sub.status();
  const v1::JobResult r = WaitFinished(t->client.get(), sub->job_id());
  EXPECT_EQ(r.labels().model().size(), server::kMaxLabelBytes);
  EXPECT_EQ(r.report().labels().model(), report->labels.model);

  // Many distinct (long) models: the series stay bounded, /metrics small.
  for (int i = 0; i < 40; ++i) {
    Snapshot m = SmallSnapshot(10 + i, Fault::kNone, 16);
    m.labels.model = absl::StrCat(i, std::string(4096, 'q'));
    ASSERT_TRUE(t->client->Audit(m).ok());
  }
  const std::string text = t->server->metrics()->RenderText();
  EXPECT_LT(text.size(), 400u << 10) << text.size();
  std::set<std::string> models;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "attnaudit_drift_out_max_abs_count")) continue;
    const size_t at = line.find("model=\"");
    if (at == absl::string_view::npos) continue;
    const absl::string_view rest = line.substr(at + 7);
    models.insert(std::string(rest.substr(0, rest.find('"'))));
  }
  EXPECT_LE(models.size(), 5u);  // 4 + "other"
  EXPECT_TRUE(models.count("other"));
  EXPECT_TRUE(absl::StrContains(
      text, "attnaudit_labels_truncated_total{label=\"model\"} 42"))
      << "2 + 40 truncated models";
  // A watch filter with the full long name matches its bounded jobs.
  v1::ResultFilter filter;
  filter.set_model(s.labels.model);
  std::vector<std::string> seen;
  std::thread watch([&] {
    t->client
        ->Watch(
            filter,
            [&](const v1::JobResult& jr) {
              seen.push_back(jr.job_id());
              return false;
            },
            kWait)
        .IgnoreError();
  });
  ASSERT_TRUE(WaitFor(
      [&] { return t->server->service()->watch_hub()->watchers() == 1; }));
  ASSERT_TRUE(t->client->Audit(s).ok());
  watch.join();
  EXPECT_EQ(seen.size(), 1u);
}

}  // namespace
}  // namespace attnaudit::testing
