// Shared by the remote subcommands (remote_commands.cc) and the load
// generator (bench_command.cc): the connection flags every remote command
// takes, and how a failed call is reported. Header-only so the CLI target
// needs no extra source file. Not thread-safe (parse once per command).
//
// Connection flags (all optional):
//   --addr HOST:PORT        server (default localhost:50051)
//   --timeout DUR           deadline of each call (default 120s; 30s, 2m, or
//                           plain seconds)
//   --tls                   use TLS with the system roots
//   --tls-ca FILE           PEM roots for the server's certificate (TLS)
//   --tls-cert FILE --tls-key FILE   client certificate (mTLS)
//   --tls-server-name NAME  name to verify instead of the address's host
//   --auth-token-file FILE  bearer token sent as "authorization: Bearer ..."
#ifndef ATTNAUDIT_CLIENT_CLI_REMOTE_COMMON_H_
#define ATTNAUDIT_CLIENT_CLI_REMOTE_COMMON_H_

#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli/args.h"
#include "client/lib/client.h"

namespace attnaudit::cli {

inline const std::set<std::string>& ConnectionValueFlags() {
  static const auto* flags = new std::set<std::string>{
      "addr",     "timeout", "tls-ca", "tls-cert", "tls-key",
      "tls-server-name", "auth-token-file"};
  return *flags;
}

inline constexpr char kConnectionHelp[] =
    "connection: --addr HOST:PORT (localhost:50051) --timeout DUR (120s)\n"
    "            --tls --tls-ca FILE --tls-cert FILE --tls-key FILE\n"
    "            --tls-server-name NAME --auth-token-file FILE\n";

// value_flags/bool_flags of a command plus the connection flags.
inline std::set<std::string> WithConnectionFlags(std::set<std::string> own) {
  own.insert(ConnectionValueFlags().begin(), ConnectionValueFlags().end());
  return own;
}
inline std::set<std::string> WithConnectionBoolFlags(
    std::set<std::string> own) {
  own.insert("tls");
  own.insert("help");
  return own;
}

// "30s", "2m", "1h30m" or plain seconds ("2.5").
inline absl::StatusOr<absl::Duration> ParseCliDuration(
    const std::string& flag, const std::string& value) {
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(value, &seconds) && seconds >= 0) {
    return absl::Seconds(seconds);
  }
  if (absl::ParseDuration(value, &d) && d >= absl::ZeroDuration()) return d;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, ": '", value, "' is not a duration (e.g. 30s, 2m, 10)"));
}

inline absl::StatusOr<client::ClientOptions> ClientOptionsFromArgs(
    const Args& args) {
  client::ClientOptions o;
  o.address = args.Get("addr", "localhost:50051");
  if (args.Has("timeout")) {
    absl::StatusOr<absl::Duration> t =
        ParseCliDuration("timeout", args.Get("timeout"));
    if (!t.ok()) return t.status();
    if (*t <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--timeout: must be positive");
    }
    o.timeout = *t;
  }
  o.tls = args.Has("tls");
  o.tls_ca = args.Get("tls-ca");
  o.tls_cert = args.Get("tls-cert");
  o.tls_key = args.Get("tls-key");
  o.tls_server_name = args.Get("tls-server-name");
  if (args.Has("auth-token-file")) {
    std::ifstream in(args.Get("auth-token-file"));
    std::string line;
    if (!in || !std::getline(in, line)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth-token-file: cannot read ", args.Get("auth-token-file")));
    }
    o.auth_token = std::string(absl::StripAsciiWhitespace(line));
  }
  return o;
}

inline absl::StatusOr<std::unique_ptr<client::Client>> ConnectFromArgs(
    const Args& args) {
  absl::StatusOr<client::ClientOptions> options = ClientOptionsFromArgs(args);
  if (!options.ok()) return options.status();
  return client::Client::Connect(*options);
}

// "INVALID_ARGUMENT: snapshot.q: ..." plus the retry hint when there is one.
inline std::string DescribeError(const absl::Status& status) {
  std::string out = absl::StrCat(absl::StatusCodeToString(status.code()),
                                 ": ", status.message());
  const absl::Duration retry = client::RetryAfter(status);
  if (retry > absl::ZeroDuration()) {
    absl::StrAppend(&out, " (server suggests retrying after ",
                    absl::FormatDuration(retry), ")");
  }
  return out;
}

}  // namespace attnaudit::cli

#endif  // ATTNAUDIT_CLIENT_CLI_REMOTE_COMMON_H_
