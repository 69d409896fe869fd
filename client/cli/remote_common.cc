#include "client/cli/remote_common.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/cli/cli_flags.h"
#include "client/cli/commands.h"
#include "transport/credentials/credential_files.h"

namespace attnaudit::client::cli_internal {
namespace {

// An enum value's name without its prefix: JOB_STATE_DONE -> DONE.
std::string WithoutPrefix(const std::string& name, absl::string_view prefix) {
  return std::string(absl::StripPrefix(name, prefix));
}

}  // namespace

void AddConnectionFlags(CLI::App* command, ConnectionFlags* flags) {
  CLI::App* group = command->add_option_group(
      "Connection", "where the server is and how to reach it");
  group->add_option("--addr", flags->addr, "server HOST:PORT")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& value) { return CheckAddress(value); }, "HOST:PORT"));
  group
      ->add_option("--timeout", flags->timeout,
                   "deadline of each call (default 120s)")
      ->check(DurationValidator())
      ->check(CLI::Validator(
          [](std::string& value) {
            return CliDuration(value) > absl::ZeroDuration()
                       ? std::string()
                       : std::string("must be positive");
          },
          ""));
  group->add_flag("--tls", flags->tls, "use TLS with the system roots");
  group->add_option("--tls-ca", flags->tls_ca,
                    "PEM roots of the server's certificate (implies TLS)");
  group->add_option("--tls-cert", flags->tls_cert,
                    "PEM client certificate (mTLS; with --tls-key)");
  group->add_option("--tls-key", flags->tls_key, "PEM key of --tls-cert");
  group->add_option("--tls-server-name", flags->tls_server_name,
                    "name to verify instead of the address's host");
  group->add_option("--auth-token-file", flags->auth_token_file,
                    "file whose first line is the bearer token");
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectionFlags& flags) {
  ClientOptions o;
  o.address = flags.addr;
  if (!flags.timeout.empty()) {
    o.timeout = CliDuration(flags.timeout);
    if (o.timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--timeout: must be positive");
    }
  }
  o.tls = flags.tls;
  o.tls_ca = flags.tls_ca;
  o.tls_cert = flags.tls_cert;
  o.tls_key = flags.tls_key;
  o.tls_server_name = flags.tls_server_name;
  if (flags.max_attempts > 0) o.max_attempts = flags.max_attempts;
  if (!flags.auth_token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadTokenFile("auth-token-file", flags.auth_token_file);
    if (!token.ok()) return token.status();
    o.auth_token = *std::move(token);
  }
  return Client::Connect(o);
}

void AddPriorityFlag(CLI::App* command, std::string* priority) {
  command
      ->add_option("--priority", *priority,
                   "scheduling class: interactive or sampled")
      ->check(CLI::IsMember({"interactive", "sampled"}, CLI::ignore_case));
}

v1::Priority PriorityOf(const std::string& flag_value) {
  v1::Priority p = v1::PRIORITY_UNSPECIFIED;
  if (!flag_value.empty()) {
    v1::Priority_Parse(
        absl::StrCat("PRIORITY_", absl::AsciiStrToUpper(flag_value)), &p);
  }
  return p;
}

std::string DescribeError(const absl::Status& status) {
  std::string out = absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                                 status.message());
  const absl::Duration retry = RetryAfter(status);
  if (retry > absl::ZeroDuration()) {
    absl::StrAppend(&out, " (server suggests retrying after ",
                    absl::FormatDuration(retry), ")");
  }
  return out;
}

std::string TransportHint(const ConnectionFlags& flags,
                          const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable) return "";
  const bool tls = flags.tls || !flags.tls_ca.empty();
  // OpenSSL writes "wrong version number", BoringSSL WRONG_VERSION_NUMBER.
  std::string m = absl::AsciiStrToLower(status.message());
  absl::c_replace(m, '_', ' ');
  // A TLS server closes a plaintext client's connection at its first bytes;
  // a plaintext server answers a TLS client's hello with no TLS record.
  if (!tls && (absl::StrContains(m, "socket closed") ||
               absl::StrContains(m, "connection reset"))) {
    return "the server closed the connection: if it serves TLS, add --tls "
           "(system roots) or --tls-ca FILE";
  }
  if (tls && absl::StrContains(m, "wrong version number")) {
    return "the server does not speak TLS: leave out --tls and --tls-ca";
  }
  if (tls && absl::StrContains(m, "certificate verify failed")) {
    return "the server's certificate is not signed by a CA this client "
           "trusts: --tls-ca FILE names the CA bundle";
  }
  return "";
}

int FailRemote(const char* name, const ConnectionFlags& flags,
               const absl::Status& status) {
  std::cerr << "attnaudit " << name << ": server " << flags.addr << ": "
            << DescribeError(status) << "\n";
  const std::string hint = TransportHint(flags, status);
  if (!hint.empty()) std::cerr << "  hint: " << hint << "\n";
  return kExitError;
}

int FailLocal(const char* name, const absl::Status& status) {
  std::cerr << "attnaudit " << name << ": " << status.message() << "\n";
  return kExitError;
}

namespace {

// "" when `port` is a decimal port number 1..65535.
std::string CheckPort(absl::string_view port, absl::string_view addr) {
  int value = 0;
  if (port.empty()) {
    return absl::StrCat("'", addr, "' has an empty port: expected HOST:PORT");
  }
  if (!absl::c_all_of(port, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &value) || value < 1 || value > 65535) {
    return absl::StrCat("'", addr, "': the port '", port,
                        "' is not a number in 1..65535");
  }
  return "";
}

}  // namespace

std::string CheckAddress(const std::string& addr) {
  absl::string_view a = addr;
  if (a.empty()) return "empty: expected HOST:PORT, e.g. localhost:50051";
  // gRPC targets with a scheme: unix sockets have no port; ipv4:/ipv6:
  // lists are gRPC's to parse. dns: names a host, which needs the port.
  for (absl::string_view scheme :
       {"unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:"}) {
    if (absl::StartsWith(a, scheme)) return "";
  }
  if (absl::ConsumePrefix(&a, "dns:")) {
    if (absl::ConsumePrefix(&a, "//")) {  // dns://AUTHORITY/HOST:PORT
      const size_t slash = a.find('/');
      a = slash == absl::string_view::npos ? "" : a.substr(slash + 1);
    }
  }
  if (absl::StartsWith(a, "[")) {  // [v6]:port
    const size_t close = a.find(']');
    if (close == absl::string_view::npos) {
      return absl::StrCat("'", addr, "': an IPv6 host needs a closing ']'");
    }
    if (a.substr(close + 1).empty()) {
      return absl::StrCat("'", addr,
                          "' has no port: expected [HOST]:PORT, "
                          "e.g. [::1]:50051");
    }
    if (a[close + 1] != ':') {
      return absl::StrCat("'", addr, "': expected ':' and the port after ']'");
    }
    return CheckPort(a.substr(close + 2), addr);
  }
  const size_t colon = a.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::StrCat("'", addr, "' has no port: expected HOST:PORT, e.g. ",
                        a.empty() ? absl::string_view("localhost") : a,
                        ":50051 (without a port "
                        "gRPC would dial 443)");
  }
  if (a.find(':') != colon) {
    return absl::StrCat("'", addr, "': bracket an IPv6 host, e.g. [::1]:50051");
  }
  if (colon == 0) {
    return absl::StrCat("'", addr,
                        "' has no host: expected HOST:PORT, e.g. "
                        "localhost",
                        a);
  }
  return CheckPort(a.substr(colon + 1), addr);
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
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

std::string StateName(v1::JobState state) {
  return WithoutPrefix(v1::JobState_Name(state), "JOB_STATE_");
}

std::string VerdictText(int verdict) {
  if (!v1::Verdict_IsValid(verdict) || verdict == v1::VERDICT_UNSPECIFIED) {
    return "-";
  }
  return WithoutPrefix(v1::Verdict_Name(static_cast<v1::Verdict>(verdict)),
                       "VERDICT_");
}

ProgressBar::ProgressBar(size_t total)
    : total_(total), tty_(isatty(STDERR_FILENO) != 0), start_(absl::Now()) {}

void ProgressBar::Update(size_t done, int64_t bytes, size_t failed) {
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

}  // namespace attnaudit::client::cli_internal
