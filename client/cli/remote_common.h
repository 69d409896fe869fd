// Shared by the remote subcommands (remote_commands.cc) and the load
// generator (bench_command.cc): the connection flags every remote command
// takes, how a failed call is reported, and small printing helpers. Header-only
// so the CLI target needs no extra source file. Not thread-safe (parse once per
// command).
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

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
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
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/args.h"
#include "client/cli/commands.h"
#include "client/lib/client.h"
#include "core/audit/audit.h"
#include "proto/codec/codec.h"

namespace attnaudit::cli {

inline const std::set<std::string>& ConnectionValueFlags() {
  static const auto* flags = new std::set<std::string>{
      "addr",    "timeout",         "tls-ca",         "tls-cert",
      "tls-key", "tls-server-name", "auth-token-file"};
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
  std::string out = absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                                 status.message());
  const absl::Duration retry = client::RetryAfter(status);
  if (retry > absl::ZeroDuration()) {
    absl::StrAppend(&out, " (server suggests retrying after ",
                    absl::FormatDuration(retry), ")");
  }
  return out;
}

// ---- Shared by the remote subcommands.

// Parses the command's own flags plus the connection flags; prints usage
// on error. Returns false when the command should exit with *code.
inline bool ParseCommand(const char* name, const char* help, Args* args,
                         const Argv& argv, int* code) {
  if (absl::Status st = args->Parse(argv); !st.ok()) {
    std::cerr << "attnaudit " << name << ": " << st.message() << "\n"
              << help << kConnectionHelp;
    *code = kExitError;
    return false;
  }
  if (args->Has("help")) {
    std::cout << help << kConnectionHelp;
    *code = 0;
    return false;
  }
  return true;
}

inline int Fail(const char* name, const absl::Status& status) {
  std::cerr << "attnaudit " << name << ": " << DescribeError(status) << "\n";
  return kExitError;
}

inline absl::StatusOr<v1::Priority> ParsePriority(const Args& args) {
  if (!args.Has("priority")) return v1::PRIORITY_UNSPECIFIED;
  const std::string p = absl::AsciiStrToLower(args.Get("priority"));
  if (p == "interactive") return v1::PRIORITY_INTERACTIVE;
  if (p == "sampled") return v1::PRIORITY_SAMPLED;
  return absl::InvalidArgumentError(
      absl::StrCat("--priority: '", args.Get("priority"),
                   "' is not interactive or sampled"));
}

inline absl::Status ParseTolerances(const Args& args,
                                    v1::AuditOptions* options) {
  AuditOptions core;
  core.compute_kv_fingerprint = args.Has("kv-fingerprint");
  for (auto [flag, field] :
       {std::pair<const char*, double*>{"out-tol", &core.tolerances.out_abs},
        {"lse-tol", &core.tolerances.lse_abs},
        {"logprob-tol", &core.tolerances.logprob_abs}}) {
    absl::StatusOr<double> v = args.GetDouble(flag, 0);
    if (!v.ok()) return v.status();
    if (*v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " must be >= 0"));
    }
    *field = *v;
  }
  AuditOptionsToProto(core, options);
  return absl::OkStatus();
}

inline std::string ToJson(const google::protobuf::Message& message,
                          bool pretty) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options)
           .ok()) {
    return "{}";
  }
  return out;
}

// A one-line progress bar on stderr, redrawn in place on a terminal and
// printed every 10% otherwise (logs stay readable).
class ProgressBar {
 public:
  explicit ProgressBar(size_t total)
      : total_(total), tty_(isatty(STDERR_FILENO) != 0), start_(absl::Now()) {}
  void Update(size_t done, int64_t bytes, size_t failed) {
    const double frac = total_ ? static_cast<double>(done) / total_ : 1.0;
    const int decile = static_cast<int>(frac * 10);
    if (!tty_ && decile == last_decile_ && done != total_) return;
    last_decile_ = decile;
    const int width = 30;
    const int fill = static_cast<int>(frac * width);
    const double secs = absl::ToDoubleSeconds(absl::Now() - start_);
    std::string bar = absl::StrFormat(
        "[%s%s] %zu/%zu files  %.1f MiB  %.1f MiB/s%s", std::string(fill, '#'),
        std::string(width - fill, '.'), done, total_, bytes / 1048576.0,
        secs > 0 ? bytes / 1048576.0 / secs : 0.0,
        failed ? absl::StrCat("  ", failed, " failed") : std::string());
    std::fprintf(stderr, tty_ ? "\r%s" : "%s\n", bar.c_str());
    if (tty_ && done == total_) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  size_t total_;
  bool tty_;
  absl::Time start_;
  int last_decile_ = -1;
};

inline const char* StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_QUEUED:
      return "QUEUED";
    case v1::JOB_STATE_RUNNING:
      return "RUNNING";
    case v1::JOB_STATE_DONE:
      return "DONE";
    case v1::JOB_STATE_FAILED:
      return "FAILED";
    case v1::JOB_STATE_CANCELLED:
      return "CANCELLED";
    default:
      return "UNSPECIFIED";
  }
}

inline const char* VerdictText(int v) {
  switch (v) {
    case v1::VERDICT_PASS:
      return "PASS";
    case v1::VERDICT_DRIFT:
      return "DRIFT";
    case v1::VERDICT_INVALID:
      return "INVALID";
    default:
      return "-";
  }
}

}  // namespace attnaudit::cli

#endif  // ATTNAUDIT_CLIENT_CLI_REMOTE_COMMON_H_
