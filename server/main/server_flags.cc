#include "server/main/server_flags.h"

#include <functional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/status_macros.h"

namespace attnaudit::server {
namespace {

absl::Status FlagError(const std::string& flag, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", what));
}

struct FlagDef {
  std::string name;
  std::string help;
  // Formats the current value (used for the defaults in --help).
  std::function<std::string(const ServerFlags&)> show;
  std::function<absl::Status(const std::string&, ServerFlags*)> set;
};

FlagDef StringFlag(std::string name, std::string help,
                   std::string ServerFlags::*field) {
  return FlagDef{name, std::move(help),
                 [field](const ServerFlags& f) {
                   return (f.*field).empty() ? std::string("\"\"") : f.*field;
                 },
                 [field](const std::string& v, ServerFlags* f) {
                   f->*field = v;
                   return absl::OkStatus();
                 }};
}

FlagDef IntFlag(std::string name, std::string help, int64_t ServerFlags::*field,
                int64_t min, int64_t max) {
  return FlagDef{
      name, std::move(help),
      [field](const ServerFlags& f) { return absl::StrCat(f.*field); },
      [name, field, min, max](const std::string& v, ServerFlags* f) {
        int64_t x = 0;
        if (!absl::SimpleAtoi(v, &x)) {
          return FlagError(name, absl::StrCat("'", v, "' is not an integer"));
        }
        if (x < min || x > max) {
          return FlagError(
              name, absl::StrCat(x, " is outside [", min, ", ", max, "]"));
        }
        f->*field = x;
        return absl::OkStatus();
      }};
}

FlagDef SizeFlag(std::string name, std::string help,
                 int64_t ServerFlags::*field, int64_t min, int64_t max) {
  return FlagDef{
      name, std::move(help),
      [field](const ServerFlags& f) { return FormatByteSize(f.*field); },
      [name, field, min, max](const std::string& v, ServerFlags* f) {
        ATTNAUDIT_ASSIGN_OR_RETURN(int64_t x, ParseByteSize(name, v));
        if (x < min || x > max) {
          return FlagError(name, absl::StrCat(x, " bytes is outside [", min,
                                              ", ", max, "]"));
        }
        f->*field = x;
        return absl::OkStatus();
      }};
}

FlagDef DurationFlag(std::string name, std::string help,
                     absl::Duration ServerFlags::*field) {
  return FlagDef{
      name, std::move(help),
      [field](const ServerFlags& f) { return FormatDurationFlag(f.*field); },
      [name, field](const std::string& v, ServerFlags* f) {
        ATTNAUDIT_ASSIGN_OR_RETURN(absl::Duration d,
                                   ParseDurationFlag(name, v));
        f->*field = d;
        return absl::OkStatus();
      }};
}

constexpr int64_t kMaxGrpcMessage = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxInt = int64_t{1} << 40;

const std::vector<FlagDef>& Table() {
  static const auto* table = new std::vector<FlagDef>{
      StringFlag("listen", "gRPC address HOST:PORT (port 0 picks a free port)",
                 &ServerFlags::listen),
      StringFlag("metrics-listen",
                 "Prometheus /metrics address HOST:PORT (\"\" disables it)",
                 &ServerFlags::metrics_listen),
      StringFlag("data-dir", "spool and result store directory",
                 &ServerFlags::data_dir),
      IntFlag("cpu-workers",
              "concurrent CPU audit jobs (0: one per 16 cores, or cores / "
              "threads-per-job)",
              &ServerFlags::cpu_workers, 0, 4096),
      IntFlag("threads-per-job",
              "threads one audit uses (0: all cores / cpu-workers)",
              &ServerFlags::threads_per_job, 0, 4096),
      SizeFlag("max-message-bytes",
               "largest unary request; bigger snapshots use AuditStream "
               "(never unlimited)",
               &ServerFlags::max_message_bytes, 4096, kMaxGrpcMessage),
      IntFlag("queue-interactive",
              "queued INTERACTIVE jobs (Audit/AuditStream) before "
              "RESOURCE_EXHAUSTED",
              &ServerFlags::queue_interactive, 1, kMaxInt),
      IntFlag("queue-sampled",
              "queued SAMPLED jobs (Submit) before RESOURCE_EXHAUSTED",
              &ServerFlags::queue_sampled, 1, kMaxInt),
      SizeFlag("memory-budget-bytes",
               "snapshot bytes of queued jobs (and, separately, of stream "
               "uploads in progress)",
               &ServerFlags::memory_budget_bytes, 4096, int64_t{1} << 50),
      DurationFlag("retention-age",
                   "drop stored results older than this "
                   "(0: keep forever)",
                   &ServerFlags::retention_age),
      IntFlag("retention-count", "keep at most this many results (0: no cap)",
              &ServerFlags::retention_count, 0, kMaxInt),
      DurationFlag("drain-delay",
                   "on SIGTERM, wait this long NOT_SERVING before refusing "
                   "work (lets load balancers notice)",
                   &ServerFlags::drain_delay),
      DurationFlag("drain-timeout",
                   "on SIGTERM, wait at most this long for in-flight jobs",
                   &ServerFlags::drain_timeout),
      StringFlag("log-level",
                 "debug, info, warn or error (debug: one line "
                 "per request)",
                 &ServerFlags::log_level),
      StringFlag("tls-cert", "PEM server certificate chain (enables TLS)",
                 &ServerFlags::tls_cert),
      StringFlag("tls-key", "PEM private key of --tls-cert",
                 &ServerFlags::tls_key),
      StringFlag("tls-client-ca",
                 "PEM CA bundle; clients must present a certificate it "
                 "signed (mTLS)",
                 &ServerFlags::tls_client_ca),
      StringFlag("auth-token-file",
                 "file holding a bearer token; calls must send metadata "
                 "\"authorization: Bearer TOKEN\" (health is exempt)",
                 &ServerFlags::auth_token_file),
      DurationFlag("keepalive-time",
                   "server pings an idle connection this often",
                   &ServerFlags::keepalive_time),
      DurationFlag("keepalive-timeout",
                   "close a connection whose ping is unanswered this long",
                   &ServerFlags::keepalive_timeout),
      DurationFlag("keepalive-min-ping-interval",
                   "least interval between client pings the server accepts",
                   &ServerFlags::keepalive_min_ping_interval),
      DurationFlag("max-connection-age",
                   "close connections after this age so clients rebalance "
                   "(0: never)",
                   &ServerFlags::max_connection_age),
      DurationFlag("max-connection-age-grace",
                   "time given to calls on an aged connection",
                   &ServerFlags::max_connection_age_grace),
      DurationFlag("max-connection-idle",
                   "close connections idle this long (0: never)",
                   &ServerFlags::max_connection_idle),
      IntFlag("metrics-max-models",
              "distinct model label values on drift metrics before "
              "\"other\"",
              &ServerFlags::metrics_max_models, 1, 1000),
      IntFlag("metrics-max-layers",
              "distinct layer label values on drift metrics before "
              "\"other\"",
              &ServerFlags::metrics_max_layers, 1, 1000),
  };
  return *table;
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(const std::string& flag,
                                      const std::string& value) {
  std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  int64_t mul = 1;
  struct Suffix {
    const char* text;
    int shift;
  };
  for (const Suffix& s :
       {Suffix{"kib", 10}, Suffix{"mib", 20}, Suffix{"gib", 30},
        Suffix{"k", 10}, Suffix{"m", 20}, Suffix{"g", 30}}) {
    if (absl::EndsWith(v, s.text)) {
      v.resize(v.size() - std::char_traits<char>::length(s.text));
      mul = int64_t{1} << s.shift;
      break;
    }
  }
  int64_t x = 0;
  if (!absl::SimpleAtoi(v, &x) || x < 0) {
    return FlagError(flag, absl::StrCat("'", value,
                                        "' is not a size (e.g. 268435456, "
                                        "256MiB)"));
  }
  if (x > (int64_t{1} << 62) / mul) {
    return FlagError(flag, absl::StrCat("'", value, "' is too large"));
  }
  return x * mul;
}

absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag,
                                                 const std::string& value) {
  std::string v(absl::StripAsciiWhitespace(value));
  absl::Duration d;
  if (v == "0") return absl::ZeroDuration();
  if (!v.empty() && v.back() == 'd') {
    int64_t days = 0;
    if (absl::SimpleAtoi(v.substr(0, v.size() - 1), &days) && days >= 0 &&
        days < 100000) {
      return absl::Hours(24 * days);
    }
  } else if (absl::ParseDuration(v, &d) && d >= absl::ZeroDuration() &&
             d != absl::InfiniteDuration()) {
    return d;
  }
  return FlagError(flag, absl::StrCat("'", value,
                                      "' is not a duration (e.g. 30s, 5m, "
                                      "1h30m, 7d)"));
}

std::string FormatByteSize(int64_t bytes) {
  if (bytes > 0 && bytes % (int64_t{1} << 30) == 0) {
    return absl::StrCat(bytes >> 30, "GiB");
  }
  if (bytes > 0 && bytes % (int64_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, "MiB");
  }
  if (bytes > 0 && bytes % (int64_t{1} << 10) == 0) {
    return absl::StrCat(bytes >> 10, "KiB");
  }
  return absl::StrCat(bytes);
}

std::string FormatDurationFlag(absl::Duration d) {
  if (d == absl::ZeroDuration()) return "0";
  const absl::Duration day = absl::Hours(24);
  if (d % day == absl::ZeroDuration()) {
    return absl::StrCat(absl::IDivDuration(d, day, &d), "d");
  }
  return absl::FormatDuration(d);
}

std::string ServerHelpText() {
  std::string out =
      "usage: attnaudit-server [--flag VALUE | --flag=VALUE]...\n\n"
      "The attnaudit audit service (gRPC attnaudit.v1.AuditService, "
      "grpc.health.v1,\nreflection) with Prometheus metrics. Every flag is "
      "optional.\n\nflags (default in brackets):\n";
  const ServerFlags defaults;
  for (const FlagDef& f : Table()) {
    absl::StrAppendFormat(&out, "  --%-28s %s [%s]\n", f.name, f.help,
                          f.show(defaults));
  }
  absl::StrAppendFormat(&out, "  --%-28s %s\n", "help",
                        "print this text and exit");
  absl::StrAppend(&out,
                  "\nSizes: 1048576, 1MiB, 4G. Durations: 30s, 5m, 1h30m, 7d."
                  "\nSIGTERM/SIGINT: health NOT_SERVING, stop admitting, "
                  "drain up to\n--drain-timeout, stop. See docs/OPERATIONS.md."
                  "\n");
  return out;
}

absl::StatusOr<ServerFlags> ParseServerFlags(
    const std::vector<std::string>& argv) {
  ServerFlags flags;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      flags.help = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg,
                       "' (flags are --name VALUE; see "
                       "--help)"));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool inline_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      inline_value = true;
    }
    const FlagDef* def = nullptr;
    for (const FlagDef& f : Table()) {
      if (f.name == name) def = &f;
    }
    if (def == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (!inline_value) {
      if (i + 1 >= argv.size()) return FlagError(name, "needs a value");
      value = argv[++i];
    }
    ATTNAUDIT_RETURN_IF_ERROR(def->set(value, &flags));
  }
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return FlagError(flags.tls_cert.empty() ? "tls-cert" : "tls-key",
                     "--tls-cert and --tls-key go together");
  }
  if (!flags.tls_client_ca.empty() && flags.tls_cert.empty()) {
    return FlagError("tls-client-ca", "needs --tls-cert and --tls-key");
  }
  if (flags.listen.empty()) return FlagError("listen", "must not be empty");
  if (flags.data_dir.empty()) {
    return FlagError("data-dir", "must not be empty");
  }
  return flags;
}

}  // namespace attnaudit::server
