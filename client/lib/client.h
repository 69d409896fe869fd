// attnaudit::client: a C++ client of attnaudit-server (attnaudit.v1
// .AuditService), used by the CLI's remote commands and the load generator.
//
//   ClientOptions options;  options.address = "localhost:50051";
//   ATTNAUDIT_ASSIGN_OR_RETURN(auto client, Client::Connect(options));
//   ATTNAUDIT_ASSIGN_OR_RETURN(AuditReport report, client->Audit(snapshot));
//
// Audit picks the unary call for snapshots that fit comfortably under the
// server's receive limit and the AuditStream call (header + chunks) for
// larger ones; the limit and chunk size come from GetCapabilities (asked
// once, cached). Every call carries a deadline (ClientOptions::timeout
// unless the call says otherwise) and, when configured, the bearer token.
//
// Retries: gRPC's own retry policy, set in the channel's service config
// (RetryServiceConfig): Audit (unary), GetResult, Cancel, ListResults,
// ListPairs, GetCapabilities and WatchResults are tried again on
// RESOURCE_EXHAUSTED and UNAVAILABLE; Submit only on RESOURCE_EXHAUSTED, an
// admission refusal that created no job (an UNAVAILABLE Submit without an
// idempotency key may have been stored, so resending it could make a second
// job); AuditStream never (its chunks are not buffered for a resend). The next
// attempt waits the server's grpc-retry-pushback-ms trailer when it sends
// one (a negative one: no retry), else gRPC's jittered backoff; and gRPC
// throttles retries on a channel whose calls keep failing.
//
// Errors: the gRPC status as absl::Status with the same code and message.
// RESOURCE_EXHAUSTED answers carry the server's retry hint, readable with
// RetryAfter(status). Thread safety: a Client may be used from many threads
// at once (gRPC channels and stubs are thread-safe; the capabilities cache
// is locked).
#ifndef ATTNAUDIT_CLIENT_LIB_CLIENT_H_
#define ATTNAUDIT_CLIENT_LIB_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnaudit/v1/service.grpc.pb.h"
#include "core/audit/audit.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "grpcpp/generic/generic_stub.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace attnaudit::client {

struct ClientOptions {
  // HOST:PORT, or any gRPC target; calls are balanced round-robin over
  // every address it resolves to (a fleet: dns:///NAME:PORT of a headless
  // Service, or ipv4:IP:PORT,IP:PORT).
  std::string address = "localhost:50051";
  // TLS: on when `tls` or any of the files is set. ca: PEM roots that sign
  // the server's certificate (empty: the system roots). cert/key: the
  // client's certificate for mTLS. server_name: override the name checked
  // against the certificate (tests with self-signed certificates).
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  // Sent as "authorization: Bearer <token>" on every call when non-empty.
  std::string auth_token;
  // Deadline of each call unless the call gives one.
  absl::Duration timeout = absl::Seconds(120);
  // Largest message the client accepts (reports are small).
  int64_t max_receive_message_bytes = int64_t{1} << 30;
  // Audit: snapshots whose unary request exceeds this use AuditStream.
  // 0: the smaller of 8 MiB (past which streaming is faster) and 3/4 of the
  // server's max_receive_message_bytes.
  int64_t stream_threshold_bytes = 0;
  // AuditStream chunk size; 0: the server's recommended_chunk_bytes.
  int64_t chunk_bytes = 0;
  // Attempts per call under the retry policy (see the top comment; gRPC
  // caps it at 5). 1: no retries (a load generator that counts refusals).
  int max_attempts = 4;
};

// The channel's service config: the retry policy described at the top,
// with `max_attempts` attempts per call (clamped to 2..5; below 2 the
// config has no retry policy).
std::string RetryServiceConfig(int max_attempts);

// Per-call settings of Audit and Submit.
struct CallOptions {
  std::optional<absl::Duration> timeout;  // default: ClientOptions::timeout
  v1::Priority priority = v1::PRIORITY_UNSPECIFIED;
  v1::AuditOptions audit_options;
};

struct SubmitOptions : CallOptions {
  std::string idempotency_key;
  // The job's own timeout on the server (waiting + running); 0: none.
  absl::Duration job_timeout = absl::ZeroDuration();
};

// kMemfd: the snapshot in a sealed memfd that the server reads in place
// (client/lib/memfd_snapshot.h); only for a server on this machine started
// with --accept-memfd-snapshots. kAuto never picks it.
enum class Transport { kAuto, kUnary, kStream, kMemfd };

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);

  // Cached after the first successful call unless `refresh`.
  absl::StatusOr<v1::Capabilities> Capabilities(bool refresh = false);

  // Audits `snapshot`: its bytes are copied into the unary request, or read
  // straight from it into the stream's chunks. A snapshot that fails the
  // server's validation is InvalidArgument naming the field.
  absl::StatusOr<AuditReport> Audit(const Snapshot& snapshot,
                                    const CallOptions& call = {},
                                    Transport transport = Transport::kAuto);
  // The unary call with a prepared request (load generation: build once,
  // send many times; a const request may be shared by threads).
  absl::StatusOr<v1::AuditResponse> AuditUnary(const v1::AuditRequest& request,
                                               const CallOptions& call = {});
  // The streaming call: tensors of at least `min_streamed_bytes` bytes are
  // streamed in chunks, smaller ones sent inline in the header. `snapshot`
  // is only read (it may be shared by threads).
  absl::StatusOr<v1::AuditResponse> AuditStream(
      const Snapshot& snapshot, const CallOptions& call = {},
      int64_t min_streamed_bytes = 64 << 10);
  // Which transport Audit would use for a request of this many bytes.
  absl::StatusOr<Transport> ChooseTransport(int64_t request_bytes);

  absl::StatusOr<v1::SubmitResponse> Submit(const Snapshot& snapshot,
                                            const SubmitOptions& call = {});
  absl::StatusOr<v1::SubmitResponse> SubmitProto(
      const v1::SubmitRequest& request,
      std::optional<absl::Duration> timeout = std::nullopt);
  absl::StatusOr<v1::JobResult> GetResult(const std::string& job_id);
  absl::StatusOr<v1::JobState> Cancel(const std::string& job_id);

  // Streams finished results matching `filter` to `on_result` until it
  // returns false, `duration` passes (the call's deadline; InfiniteDuration:
  // none), or the server ends the stream. Returns OK when on_result
  // stopped it or the duration ran out, else the stream's status.
  absl::Status Watch(const v1::ResultFilter& filter,
                     const std::function<bool(const v1::JobResult&)>& on_result,
                     absl::Duration duration = absl::InfiniteDuration());
  // The same with a whole request (resume_after: continue after the last
  // cursor a previous watch saw, on any replica of a fleet).
  absl::Status Watch(const v1::WatchResultsRequest& request,
                     const std::function<bool(const v1::JobResult&)>& on_result,
                     absl::Duration duration = absl::InfiniteDuration());
  // One page of stored results (ListResults).
  absl::StatusOr<v1::ListResultsResponse> ListResults(
      const v1::ListResultsRequest& request);
  // One page of stored train-rollout pairs (ListPairs).
  absl::StatusOr<v1::ListPairsResponse> ListPairs(
      const v1::ListPairsRequest& request);

  // Blocks until the channel is connected or `timeout` passes.
  bool WaitForConnected(absl::Duration timeout);

  const ClientOptions& options() const { return options_; }

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);
  void Prepare(grpc::ClientContext* context,
               std::optional<absl::Duration> timeout) const;
  // One unary call of `rpc` with the deadline and the token (client.cc).
  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(
      grpc::Status (v1::AuditService::Stub::*rpc)(grpc::ClientContext*,
                                                  const Request&, Response*),
      const Request& request, std::optional<absl::Duration> timeout);

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AuditService::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_stub_;  // zero-copy AuditStream
  absl::Mutex caps_mu_;
  std::optional<v1::Capabilities> caps_ ABSL_GUARDED_BY(caps_mu_);
};

// The request Client::Submit sends (for callers that keep it to resend, as
// `attnaudit submit` does on RESOURCE_EXHAUSTED, or send it with
// SubmitProto).
v1::SubmitRequest MakeSubmitRequest(const Snapshot& snapshot,
                                    const SubmitOptions& call);

// The server's retry hint of a RESOURCE_EXHAUSTED or UNAVAILABLE status
// (its "retry-after-ms" trailer, else a positive "grpc-retry-pushback-ms"),
// or zero.
absl::Duration RetryAfter(const absl::Status& status);

}  // namespace attnaudit::client

#endif  // ATTNAUDIT_CLIENT_LIB_CLIENT_H_
