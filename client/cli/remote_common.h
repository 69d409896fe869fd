// Shared by the remote subcommands (remote_commands.cc) and the load
// generator (bench_command.cc): the connection flags every remote command
// takes, how a failed call is reported, and small printing helpers. Not
// thread-safe except where noted (one command runs per process).
//
// Connection flags (all optional):
//   --addr HOST:PORT        server (default localhost:50051); the port is
//                           required (gRPC would dial 443 without one), an
//                           IPv6 host is bracketed ([::1]:50051); gRPC's
//                           dns:, ipv4:, ipv6: and unix: targets also work
//   --timeout DUR           deadline of each call (default 120s; 30s, 2m, or
//                           plain seconds)
//   --tls                   use TLS with the system roots
//   --tls-ca FILE           PEM roots for the server's certificate (TLS)
//   --tls-cert FILE --tls-key FILE   client certificate (mTLS)
//   --tls-server-name NAME  name to verify instead of the address's host
//   --auth-token-file FILE  bearer token sent as "authorization: Bearer ..."
#ifndef ATTNAUDIT_CLIENT_CLI_REMOTE_COMMON_H_
#define ATTNAUDIT_CLIENT_CLI_REMOTE_COMMON_H_

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnaudit/v1/service.pb.h"
#include "client/lib/client.h"
#include "google/protobuf/message.h"

namespace attnaudit::client::cli_internal {

struct ConnectionFlags {
  std::string addr = "localhost:50051";
  std::string timeout;  // empty: the client's default
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  std::string auth_token_file;
  // ClientOptions::max_attempts; 0: the client's default (not a flag).
  int max_attempts = 0;
};
// Declares the connection flags on `command` (in their own help group).
void AddConnectionFlags(CLI::App* command, ConnectionFlags* flags);
// --addr's check (a usage error names what is wrong): "" when `addr` is a
// HOST:PORT (or a gRPC target with a scheme), else the problem, e.g.
// "'localhost' has no port: expected HOST:PORT, e.g. localhost:50051".
std::string CheckAddress(const std::string& addr);
// Connects as the flags say (reads the token and PEM files). Its errors are
// local (a file or flag), to be reported with FailLocal.
absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectionFlags& flags);

// --priority interactive|sampled (either case); PRIORITY_UNSPECIFIED when
// absent.
void AddPriorityFlag(CLI::App* command, std::string* priority);
v1::Priority PriorityOf(const std::string& flag_value);

// "INVALID_ARGUMENT: snapshot.q: ..." plus the retry hint when there is one.
std::string DescribeError(const absl::Status& status);
// What a connection failure suggests about TLS: a plaintext client refused
// by a TLS server, a TLS client at a plaintext server, an untrusted
// certificate; "" otherwise.
std::string TransportHint(const ConnectionFlags& flags,
                          const absl::Status& status);
// A call to the server failed: prints "attnaudit NAME: server ADDR:
// <DescribeError>" to stderr, and TransportHint's hint on a line of its
// own; returns kExitError.
int FailRemote(const char* name, const ConnectionFlags& flags,
               const absl::Status& status);
// A local problem, no server involved (a file that cannot be read or
// decoded, a flag that cannot be used): prints "attnaudit NAME: <message>"
// without a status code, which would read as the server's answer; returns
// kExitError.
int FailLocal(const char* name, const absl::Status& status);

// proto3 JSON with the field names of the .proto files.
std::string ToJson(const google::protobuf::Message& message, bool pretty);

// QUEUED, RUNNING, DONE, FAILED, CANCELLED (the enum value's name without
// its JOB_STATE_ prefix).
std::string StateName(v1::JobState state);
// PASS, DRIFT, INVALID, or "-" when there is none.
std::string VerdictText(int verdict);

// A one-line progress bar on stderr, redrawn in place on a terminal and
// printed every 10% otherwise (logs stay readable).
class ProgressBar {
 public:
  explicit ProgressBar(size_t total);
  void Update(size_t done, int64_t bytes, size_t failed);

 private:
  size_t total_;
  bool tty_;
  absl::Time start_;
  int last_decile_ = -1;
};

// Follows the pages of a List call (ListResults, ListPairs) until `limit`
// rows (0: all) or the last page: `call(request)` reads a page (a StatusOr
// of the response), `rows(response)` its rows, and `emit` gets each row.
template <typename Request, typename Call, typename Rows, typename Emit>
absl::Status ForEachPage(Request request, int64_t limit, const Call& call,
                         const Rows& rows, const Emit& emit) {
  constexpr int64_t kMaxPageSize = 1000;
  int64_t emitted = 0;
  while (true) {
    const int64_t left = limit == 0 ? kMaxPageSize : limit - emitted;
    request.set_page_size(
        static_cast<int32_t>(std::min<int64_t>(left, kMaxPageSize)));
    auto page = call(request);
    if (!page.ok()) return page.status();
    for (const auto& row : rows(*page)) {
      emit(row);
      ++emitted;
    }
    if (page->next_page_token().empty() || (limit > 0 && emitted >= limit)) {
      return absl::OkStatus();
    }
    request.set_page_token(page->next_page_token());
  }
}

}  // namespace attnaudit::client::cli_internal

#endif  // ATTNAUDIT_CLIENT_CLI_REMOTE_COMMON_H_
