#include "client/lib/client.h"

#include <google/protobuf/util/time_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/lib/memfd_snapshot.h"
#include "client/lib/zero_copy_stream.h"
#include "proto/codec/codec.h"
#include "proto/codec/stream.h"
#include "proto/codec/tensor_paths.h"
#include "transport/credentials/credential_files.h"

namespace attnaudit::client {
namespace {

constexpr char kRetryPayload[] = "type.attnaudit.dev/retry-after-ms";
constexpr int64_t kFallbackReceiveLimit = int64_t{4} << 20;  // gRPC default
constexpr int64_t kStreamAbove = int64_t{8} << 20;
// A unary request is kept for a resend up to this size (gRPC's default is
// 256 KiB): a bit more than the largest one Audit picks unary for.
constexpr int kRetryBufferBytes = 16 << 20;

// grpc::Status -> absl::Status, keeping the retry hint as a payload.
absl::Status ToAbsl(const grpc::Status& status,
                    const grpc::ClientContext& context) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   status.error_message());
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
      status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    const auto& trailers = context.GetServerTrailingMetadata();
    auto it = trailers.find("retry-after-ms");
    if (it == trailers.end()) it = trailers.find("grpc-retry-pushback-ms");
    if (it != trailers.end()) {
      out.SetPayload(kRetryPayload, absl::Cord(absl::string_view(
                                        it->second.data(), it->second.size())));
    }
  }
  return out;
}

}  // namespace

std::string RetryServiceConfig(int max_attempts) {
  if (max_attempts < 2) return "{}";
  const int attempts = std::min(max_attempts, 5);
  auto names = [](std::initializer_list<const char*> methods) {
    std::string out;
    for (const char* m : methods) {
      absl::StrAppend(&out, out.empty() ? "" : ",",
                      R"({"service":"attnaudit.v1.AuditService","method":")", m,
                      R"("})");
    }
    return out;
  };
  auto policy = [attempts](const char* codes) {
    return absl::StrCat(R"("retryPolicy":{"maxAttempts":)", attempts,
                        R"(,"initialBackoff":"0.2s","maxBackoff":"5s",)",
                        R"("backoffMultiplier":2,"retryableStatusCodes":[)",
                        codes, "]}");
  };
  return absl::StrCat(
      R"({"methodConfig":[{"name":[)",
      names({"Audit", "GetResult", "Cancel", "ListResults", "ListPairs",
             "GetCapabilities", "WatchResults"}),
      "],", policy(R"("RESOURCE_EXHAUSTED","UNAVAILABLE")"), R"(},{"name":[)",
      names({"Submit"}), "],", policy(R"("RESOURCE_EXHAUSTED")"), "}],",
      // gRPC stops retrying while more than half of a
      // channel's recent calls failed: an overloaded server
      // is not sent a storm of resends.
      R"("retryThrottling":{"maxTokens":10,"tokenRatio":0.5}})");
}

absl::Duration RetryAfter(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryPayload);
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms) ||
      ms < 0) {
    return absl::ZeroDuration();
  }
  return absl::Milliseconds(ms);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("--addr: must not be empty");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  const bool tls = options.tls || !options.tls_ca.empty() ||
                   !options.tls_cert.empty() || !options.tls_key.empty();
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca.empty()) {
      absl::StatusOr<std::string> ca = ReadPemFile("tls-ca", options.tls_ca);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    if (options.tls_cert.empty() != options.tls_key.empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert: --tls-cert and --tls-key go together");
    }
    if (!options.tls_cert.empty()) {
      absl::StatusOr<std::string> cert =
          ReadPemFile("tls-cert", options.tls_cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPemFile("tls-key", options.tls_key);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(options.max_receive_message_bytes, INT32_MAX)));
  args.SetMaxSendMessageSize(-1);  // the server enforces its own limit
  // A fleet's address resolves to several replicas (dns:///NAME:PORT of a
  // headless Service, or an ipv4:A,B list): spread the calls over all of
  // them. One address: the same as gRPC's default pick_first.
  args.SetLoadBalancingPolicyName("round_robin");
  args.SetServiceConfigJSON(RetryServiceConfig(options.max_attempts));
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, options.max_attempts >= 2 ? 1 : 0);
  args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, kRetryBufferBytes);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.address, creds, args);
  return std::unique_ptr<Client>(new Client(options, std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::AuditService::NewStub(channel_)),
      generic_stub_(std::make_unique<grpc::GenericStub>(channel_)) {}

void Client::Prepare(grpc::ClientContext* context,
                     std::optional<absl::Duration> timeout) const {
  const absl::Duration t = timeout.value_or(options_.timeout);
  if (t != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + t));
  }
  if (!options_.auth_token.empty()) {
    context->AddMetadata("authorization",
                         absl::StrCat("Bearer ", options_.auth_token));
  }
}

template <typename Request, typename Response>
absl::StatusOr<Response> Client::Unary(
    grpc::Status (v1::AuditService::Stub::*rpc)(grpc::ClientContext*,
                                                const Request&, Response*),
    const Request& request, std::optional<absl::Duration> timeout) {
  grpc::ClientContext context;
  Prepare(&context, timeout);
  Response response;
  grpc::Status s = (stub_.get()->*rpc)(&context, request, &response);
  if (!s.ok()) return ToAbsl(s, context);
  return response;
}

bool Client::WaitForConnected(absl::Duration timeout) {
  return channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout));
}

absl::StatusOr<v1::Capabilities> Client::Capabilities(bool refresh) {
  if (!refresh) {
    absl::MutexLock lock(&caps_mu_);
    if (caps_.has_value()) return *caps_;
  }
  absl::StatusOr<v1::Capabilities> caps =
      Unary(&v1::AuditService::Stub::GetCapabilities,
            v1::GetCapabilitiesRequest(), std::nullopt);
  if (!caps.ok()) return caps.status();
  absl::MutexLock lock(&caps_mu_);
  caps_ = *caps;
  return caps;
}

absl::StatusOr<Transport> Client::ChooseTransport(int64_t request_bytes) {
  int64_t threshold = options_.stream_threshold_bytes;
  if (threshold <= 0) {
    absl::StatusOr<v1::Capabilities> caps = Capabilities();
    if (!caps.ok()) return caps.status();
    const int64_t limit = caps->limits().max_receive_message_bytes() > 0
                              ? caps->limits().max_receive_message_bytes()
                              : kFallbackReceiveLimit;
    // Headroom for framing and the non-tensor fields; and past ~8 MiB the
    // stream is faster even when unary would fit (its chunks pipeline the
    // client's serialisation, the transfer and the server's parsing;
    // measured on loopback, docs/perf-history.md).
    threshold = std::min(limit / 4 * 3, kStreamAbove);
  }
  return request_bytes > threshold ? Transport::kStream : Transport::kUnary;
}

absl::StatusOr<AuditReport> Client::Audit(const Snapshot& snapshot,
                                          const CallOptions& call,
                                          Transport transport) {
  if (transport == Transport::kAuto) {
    int64_t bytes = 4096;  // the scalar fields and framing, generously
    for (absl::string_view path : SnapshotTensorPaths()) {
      const Tensor* t = FindSnapshotTensor(snapshot, path);
      if (t != nullptr) bytes += static_cast<int64_t>(t->bytes().size());
    }
    absl::StatusOr<Transport> chosen = ChooseTransport(bytes);
    if (!chosen.ok()) return chosen.status();
    transport = *chosen;
  }
  absl::StatusOr<v1::AuditResponse> response;
  if (transport == Transport::kStream) {
    response = AuditStream(snapshot, call);
  } else if (transport == Transport::kMemfd) {
    absl::StatusOr<std::unique_ptr<MemfdSnapshot>> memfd =
        MemfdSnapshot::Create(snapshot);
    if (!memfd.ok()) return memfd.status();
    v1::AuditRequest request;
    (*memfd)->Describe(&request);
    *request.mutable_options() = call.audit_options;
    request.set_priority(call.priority);
    response = AuditUnary(request, call);
  } else {
    v1::AuditRequest request;
    SnapshotToProto(snapshot, request.mutable_snapshot());
    *request.mutable_options() = call.audit_options;
    request.set_priority(call.priority);
    response = AuditUnary(request, call);
  }
  if (!response.ok()) return response.status();
  return ReportFromProto(response->report());
}

absl::StatusOr<v1::AuditResponse> Client::AuditUnary(
    const v1::AuditRequest& request, const CallOptions& call) {
  return Unary(&v1::AuditService::Stub::Audit, request, call.timeout);
}

absl::StatusOr<v1::AuditResponse> Client::AuditStream(
    const Snapshot& snapshot, const CallOptions& call,
    int64_t min_streamed_bytes) {
  int64_t chunk = options_.chunk_bytes;
  if (chunk <= 0) {
    absl::StatusOr<v1::Capabilities> caps = Capabilities();
    chunk = caps.ok() && caps->limits().recommended_chunk_bytes() > 0
                ? caps->limits().recommended_chunk_bytes()
                : kDefaultStreamChunkBytes;
  }
  v1::AuditStreamMessage first;
  v1::AuditStreamHeader* header = first.mutable_header();
  AuditStreamChunker chunker(
      BuildAuditStreamHeader(snapshot, min_streamed_bytes, header), chunk);
  *header->mutable_options() = call.audit_options;
  header->set_priority(call.priority);

  grpc::ClientContext context;
  Prepare(&context, call.timeout);
  v1::AuditResponse response;
  // Chunks go out as slices over the tensors' own bytes (no copy).
  grpc::Status s = client_internal::ZeroCopyAuditStream(
      generic_stub_.get(), &context, first, &chunker, &response);
  if (!s.ok()) return ToAbsl(s, context);
  return response;
}

v1::SubmitRequest MakeSubmitRequest(const Snapshot& snapshot,
                                    const SubmitOptions& call) {
  v1::SubmitRequest request;
  SnapshotToProto(snapshot, request.mutable_snapshot());
  *request.mutable_options() = call.audit_options;
  request.set_priority(call.priority);
  request.set_idempotency_key(call.idempotency_key);
  if (call.job_timeout > absl::ZeroDuration()) {
    *request.mutable_timeout() =
        google::protobuf::util::TimeUtil::NanosecondsToDuration(
            absl::ToInt64Nanoseconds(call.job_timeout));
  }
  return request;
}

absl::StatusOr<v1::SubmitResponse> Client::Submit(const Snapshot& snapshot,
                                                  const SubmitOptions& call) {
  return SubmitProto(MakeSubmitRequest(snapshot, call), call.timeout);
}

absl::StatusOr<v1::SubmitResponse> Client::SubmitProto(
    const v1::SubmitRequest& request, std::optional<absl::Duration> timeout) {
  return Unary(&v1::AuditService::Stub::Submit, request, timeout);
}

absl::StatusOr<v1::JobResult> Client::GetResult(const std::string& job_id) {
  v1::GetResultRequest request;
  request.set_job_id(job_id);
  return Unary(&v1::AuditService::Stub::GetResult, request, std::nullopt);
}

absl::StatusOr<v1::JobState> Client::Cancel(const std::string& job_id) {
  v1::CancelRequest request;
  request.set_job_id(job_id);
  absl::StatusOr<v1::CancelResponse> response =
      Unary(&v1::AuditService::Stub::Cancel, request, std::nullopt);
  if (!response.ok()) return response.status();
  return response->state();
}

absl::StatusOr<v1::ListResultsResponse> Client::ListResults(
    const v1::ListResultsRequest& request) {
  return Unary(&v1::AuditService::Stub::ListResults, request, std::nullopt);
}

absl::StatusOr<v1::ListPairsResponse> Client::ListPairs(
    const v1::ListPairsRequest& request) {
  return Unary(&v1::AuditService::Stub::ListPairs, request, std::nullopt);
}

absl::Status Client::Watch(
    const v1::ResultFilter& filter,
    const std::function<bool(const v1::JobResult&)>& on_result,
    absl::Duration duration) {
  v1::WatchResultsRequest request;
  *request.mutable_filter() = filter;
  return Watch(request, on_result, duration);
}

absl::Status Client::Watch(
    const v1::WatchResultsRequest& request,
    const std::function<bool(const v1::JobResult&)>& on_result,
    absl::Duration duration) {
  grpc::ClientContext context;
  Prepare(&context, duration);
  std::unique_ptr<grpc::ClientReader<v1::JobResult>> reader =
      stub_->WatchResults(&context, request);
  v1::JobResult result;
  bool stopped = false;
  while (reader->Read(&result)) {
    if (!on_result(result)) {
      stopped = true;
      context.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (stopped) return absl::OkStatus();
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      duration != absl::InfiniteDuration()) {
    return absl::OkStatus();
  }
  return ToAbsl(s, context);
}

}  // namespace attnaudit::client
