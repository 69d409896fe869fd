// The client's retry policy (gRPC's, from the channel's service config)
// against a scripted in-process AuditService: which calls are resent on
// which codes, and that the server's grpc-retry-pushback-ms trailer
// decides whether and when.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "attnaudit/v1/service.grpc.pb.h"
#include "client/lib/client.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace attnaudit::client {
namespace {

// Answers the first `failures` attempts of GetResult and Submit with
// `code` and, when `pushback` is set, that grpc-retry-pushback-ms trailer;
// later attempts succeed. Records when each attempt arrived.
class ScriptedService final : public v1::AuditService::Service {
 public:
  void Script(grpc::StatusCode code, int failures, std::string pushback) {
    absl::MutexLock lock(&mu_);
    code_ = code;
    failures_ = failures;
    pushback_ = std::move(pushback);
    arrivals_.clear();
  }
  std::vector<absl::Time> Arrivals() {
    absl::MutexLock lock(&mu_);
    return arrivals_;
  }

  grpc::Status GetResult(grpc::ServerContext* context,
                         const v1::GetResultRequest* request,
                         v1::JobResult* response) override {
    response->set_job_id(request->job_id());
    return Attempt(context);
  }
  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitRequest*,
                      v1::SubmitResponse* response) override {
    response->set_job_id("s1");
    return Attempt(context);
  }

 private:
  grpc::Status Attempt(grpc::ServerContext* context) {
    absl::MutexLock lock(&mu_);
    arrivals_.push_back(absl::Now());
    if (static_cast<int>(arrivals_.size()) > failures_) {
      return grpc::Status::OK;
    }
    if (!pushback_.empty()) {
      context->AddTrailingMetadata("grpc-retry-pushback-ms", pushback_);
    }
    return grpc::Status(code_, "scripted refusal");
  }

  absl::Mutex mu_;
  grpc::StatusCode code_ = grpc::StatusCode::OK;
  int failures_ = 0;
  std::string pushback_;
  std::vector<absl::Time> arrivals_;
};

class RetryPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<Client> Connect(int max_attempts = 4) {
    ClientOptions options;
    options.address = address_;
    options.timeout = absl::Seconds(60);
    options.max_attempts = max_attempts;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  ScriptedService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(RetryPolicyTest, APositivePushbackIsWaitedAndTheCallResent) {
  // Far above the policy's backoff (0.2 s initial, jittered below it), so
  // the gap shows which of the two set the wait.
  service_.Script(grpc::StatusCode::RESOURCE_EXHAUSTED, 1, "1500");
  std::unique_ptr<Client> client = Connect();
  absl::StatusOr<v1::JobResult> result = client->GetResult("j1");
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<absl::Time> arrivals = service_.Arrivals();
  ASSERT_EQ(arrivals.size(), 2u);
  // gRPC's timer and the two arrival stamps are a few ms apart at most
  // (1.49985 s was seen); backoff alone would have resent within 0.2 s.
  EXPECT_GE(arrivals[1] - arrivals[0], absl::Milliseconds(1400));
}

TEST_F(RetryPolicyTest, ANegativePushbackEndsTheCallAtOnce) {
  service_.Script(grpc::StatusCode::RESOURCE_EXHAUSTED, 1, "-1");
  std::unique_ptr<Client> client = Connect();
  absl::StatusOr<v1::JobResult> result = client->GetResult("j1");
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(service_.Arrivals().size(), 1u);
}

TEST_F(RetryPolicyTest, UnavailableIsRetriedWithBackoffForReads) {
  service_.Script(grpc::StatusCode::UNAVAILABLE, 2, "");
  std::unique_ptr<Client> client = Connect();
  absl::StatusOr<v1::JobResult> result = client->GetResult("j1");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(service_.Arrivals().size(), 3u);
}

TEST_F(RetryPolicyTest, AttemptsStopAtMaxAttempts) {
  service_.Script(grpc::StatusCode::UNAVAILABLE, 10, "1");
  std::unique_ptr<Client> client = Connect(/*max_attempts=*/3);
  absl::StatusOr<v1::JobResult> result = client->GetResult("j1");
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_.Arrivals().size(), 3u);
}

TEST_F(RetryPolicyTest, SubmitIsResentOnlyAfterAnAdmissionRefusal) {
  std::unique_ptr<Client> client = Connect();
  // RESOURCE_EXHAUSTED created no job: resent.
  service_.Script(grpc::StatusCode::RESOURCE_EXHAUSTED, 1, "1");
  absl::StatusOr<v1::SubmitResponse> queued =
      client->SubmitProto(v1::SubmitRequest());
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(service_.Arrivals().size(), 2u);
  // UNAVAILABLE may have stored the job: never resent, even with a hint.
  service_.Script(grpc::StatusCode::UNAVAILABLE, 1, "1");
  absl::StatusOr<v1::SubmitResponse> refused =
      client->SubmitProto(v1::SubmitRequest());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_.Arrivals().size(), 1u);
}

TEST_F(RetryPolicyTest, OneAttemptMeansNoRetriesAndTheHintIsStillRead) {
  service_.Script(grpc::StatusCode::RESOURCE_EXHAUSTED, 1, "250");
  std::unique_ptr<Client> client = Connect(/*max_attempts=*/1);
  absl::StatusOr<v1::JobResult> result = client->GetResult("j1");
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(service_.Arrivals().size(), 1u);
  EXPECT_EQ(RetryAfter(result.status()), absl::Milliseconds(250));
}

TEST(RetryServiceConfigTest, BelowTwoAttemptsThereIsNoPolicy) {
  EXPECT_EQ(RetryServiceConfig(1), "{}");
  EXPECT_NE(RetryServiceConfig(9).find(R"("maxAttempts":5)"),
            std::string::npos);
}

// Every RPC has a policy, named once, except a client stream (its messages
// are not buffered for a resend): a new RPC must choose its codes here and
// in the Python client (tests/python/test_retry.py checks that one).
TEST(RetryServiceConfigTest, NamesEveryRpcButClientStreamsOnce) {
  const std::string config = RetryServiceConfig(4);
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::AuditService::service_full_name());
  ASSERT_NE(service, nullptr);
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* m = service->method(i);
    const std::string entry = absl::StrCat(R"("method":")", m->name(), R"(")");
    size_t count = 0;
    for (size_t at = config.find(entry); at != std::string::npos;
         at = config.find(entry, at + 1)) {
      ++count;
    }
    EXPECT_EQ(count, m->client_streaming() ? 0u : 1u) << m->name();
  }
}

}  // namespace
}  // namespace attnaudit::client
