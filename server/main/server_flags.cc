// Each server flag is one ATTNAUDIT_SERVER_FLAG row below: its absl
// definition (type, default, help) and the function that stores its value
// in the ServerConfig. ParseServerFlags sets the absl flags from argv, runs
// every row's function over a fresh ServerConfig, then checks ranges and
// combinations. Nothing else lists the flags, so a new flag is one row
// (and its row in docs/OPERATIONS.md's table, which
// tests/docs/check_flags_documented.py compares with --help).
#include "server/main/server_flags.h"

#include <algorithm>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "server/device_pool/device_selection.h"

namespace attnaudit::server {
namespace {

// A server flag: its absl flag and how its value reaches the configuration.
struct ServerFlag {
  const absl::CommandLineFlag* flag;
  std::function<void(ServerConfig&)> apply;
};

// The server's flags in definition order, which is the --help order. Only
// these are accepted: other libraries may register absl flags of their own.
// Filled during static initialization of this file (one thread), read-only
// afterwards.
std::vector<ServerFlag>& Registry() {
  static auto* flags = new std::vector<ServerFlag>;
  return *flags;
}

// Adds `flag` to the registry with `apply`, which stores the flag's value:
// (const T&, AuditServerOptions&) for a setting of the server, or
// (const T&, ServerConfig&) for one of the process (--log-level).
template <typename T, typename Apply>
bool Register(const absl::Flag<T>& flag, Apply apply) {
  Registry().push_back(
      {&absl::GetFlagReflectionHandle(flag), [&flag, apply](ServerConfig& c) {
         if constexpr (std::is_invocable_v<Apply, const T&,
                                           AuditServerOptions&>) {
           apply(absl::GetFlag(flag), c.options);
         } else {
           apply(absl::GetFlag(flag), c);
         }
       }});
  return true;
}

}  // namespace
}  // namespace attnaudit::server

// ATTNAUDIT_SERVER_FLAG(Type, name, default, help, apply): the absl flag
// FLAGS_name (--name, --help shows `help` and `default`), registered with
// `apply` in the order of the rows.
#define ATTNAUDIT_SERVER_FLAG(Type, name, default_value, help, apply) \
  ABSL_FLAG(Type, name, default_value, help);                         \
  [[maybe_unused]] static const bool attnaudit_server_flag_##name =   \
      ::attnaudit::server::Register(FLAGS_##name, apply)

using attnaudit::server::AuditServerOptions;
using attnaudit::server::ByteSize;
using attnaudit::server::DeviceSelection;
using attnaudit::server::FlagDuration;
using attnaudit::server::ParseDeviceSelection;
using attnaudit::server::PriorityClass;
using attnaudit::server::ServerConfig;

// Endpoints and storage.
ATTNAUDIT_SERVER_FLAG(std::string, listen, "localhost:50051",
                      "gRPC address HOST:PORT (port 0 picks a free port)",
                      [](const std::string& v, AuditServerOptions& o) {
                        o.listen = v;
                      });
ATTNAUDIT_SERVER_FLAG(
    std::string, metrics_listen, "localhost:9464",
    "Prometheus /metrics address HOST:PORT (\"\" disables it)",
    [](const std::string& v, AuditServerOptions& o) { o.metrics_listen = v; });
ATTNAUDIT_SERVER_FLAG(std::string, data_dir, "./var/attnaudit",
                      "spool and result store directory",
                      [](const std::string& v, AuditServerOptions& o) {
                        o.data_dir = v;
                      });
ATTNAUDIT_SERVER_FLAG(
    std::string, store, "sqlite",
    "where jobs and results live: sqlite (<data-dir>/results.db, one "
    "process) or postgresql://USER[:PASSWORD]@HOST:PORT/DB[?PARAMS] "
    "(a fleet of replicas sharing one PostgreSQL database)",
    [](const std::string& v, AuditServerOptions& o) { o.store_url = v; });
ATTNAUDIT_SERVER_FLAG(
    std::string, replica_id, "",
    "this replica's name in a fleet, stored as the owner of the jobs "
    "it accepts and shown in results (default: the host name)",
    [](const std::string& v, AuditServerOptions& o) { o.replica_id = v; });
ATTNAUDIT_SERVER_FLAG(
    bool, store_audit_results, true,
    "store Audit/AuditStream results like Submit's (GetResult, "
    "ListResults, resumable watches); false: only stream them to "
    "watchers",
    [](bool v, AuditServerOptions& o) { o.store_audit_results = v; });
ATTNAUDIT_SERVER_FLAG(
    ByteSize, result_journal_bytes, ByteSize{int64_t{256} << 20},
    "Audit results the store cannot take (an outage) are kept in "
    "<data-dir>/journal, fsync'd, up to this many bytes, and stored "
    "when it is back; past it an Audit is answered without a job id",
    [](ByteSize v, AuditServerOptions& o) {
      o.result_journal_bytes = v.bytes;
    });
ATTNAUDIT_SERVER_FLAG(
    FlagDuration, pair_wait, FlagDuration{absl::Minutes(10)},
    "train-rollout pairs: an audited snapshot labelled rollout or "
    "trainer waits this long in the store for its counterpart "
    "(ListPairs); 0: no pairs",
    [](FlagDuration v, AuditServerOptions& o) { o.pair_wait = v.value; });
ATTNAUDIT_SERVER_FLAG(
    ByteSize, pair_max_side_bytes, ByteSize{int64_t{64} << 20},
    "a pair side whose snapshot is larger is not kept for its "
    "counterpart (counted in attnaudit_pair_sides_total{outcome=dropped})",
    [](ByteSize v, AuditServerOptions& o) {
      o.pair_max_side_bytes = v.bytes;
    });
ATTNAUDIT_SERVER_FLAG(
    FlagDuration, fleet_lease, FlagDuration{absl::Seconds(15)},
    "with a postgresql:// store: a replica silent this long is gone, "
    "and another takes over its unfinished jobs",
    [](FlagDuration v, AuditServerOptions& o) { o.fleet_lease = v.value; });
// Execution.
ATTNAUDIT_SERVER_FLAG(
    int64_t, cpu_workers, 0,
    "concurrent CPU audit jobs (0: one per 16 cores, or cores / "
    "threads-per-job)",
    [](int64_t v, AuditServerOptions& o) {
      o.cpu_workers = static_cast<int>(v);
    });
ATTNAUDIT_SERVER_FLAG(int64_t, threads_per_job, 0,
                      "threads one audit uses (0: all cores / cpu-workers)",
                      [](int64_t v, AuditServerOptions& o) {
                        o.threads_per_job = static_cast<int>(v);
                      });
ATTNAUDIT_SERVER_FLAG(
    std::string, devices, "cpu",
    "devices to drive: cpu (the CPU workers), all (one worker per "
    "visible GPU; the CPU workers when there is none or the build has "
    "no CUDA backend), or GPUs by ordinal: cuda:0,cuda:1",
    [](const std::string& v, AuditServerOptions& o) {
      // A bad value is CheckCombinations' error; this never stores it.
      o.device_selection = ParseDeviceSelection(v).value_or(DeviceSelection{});
    });
ATTNAUDIT_SERVER_FLAG(
    ByteSize, gpu_memory_pool_bytes, ByteSize{0},
    "device memory each GPU worker reserves for its jobs (0: three "
    "quarters of the GPU's free memory at start-up); a snapshot that "
    "does not fit runs on the CPU backend",
    [](ByteSize v, AuditServerOptions& o) {
      o.gpu_memory_pool_bytes = v.bytes;
    });
// Admission control.
ATTNAUDIT_SERVER_FLAG(
    ByteSize, max_message_bytes, ByteSize{int64_t{256} << 20},
    "largest unary request; bigger snapshots use AuditStream (never "
    "unlimited)",
    [](ByteSize v, AuditServerOptions& o) { o.max_message_bytes = v.bytes; });
ATTNAUDIT_SERVER_FLAG(
    int64_t, queue_interactive, 64,
    "queued INTERACTIVE jobs (Audit/AuditStream) before "
    "RESOURCE_EXHAUSTED",
    [](int64_t v, AuditServerOptions& o) {
      o.queue_capacity[static_cast<int>(PriorityClass::kInteractive)] = v;
    });
ATTNAUDIT_SERVER_FLAG(
    int64_t, queue_sampled, 1024,
    "queued SAMPLED jobs (Submit) before RESOURCE_EXHAUSTED",
    [](int64_t v, AuditServerOptions& o) {
      o.queue_capacity[static_cast<int>(PriorityClass::kSampled)] = v;
    });
ATTNAUDIT_SERVER_FLAG(
    ByteSize, memory_budget_bytes, ByteSize{int64_t{8} << 30},
    "snapshot bytes of queued jobs (and, separately, of stream uploads "
    "in progress)",
    [](ByteSize v, AuditServerOptions& o) { o.memory_budget_bytes = v.bytes; });
ATTNAUDIT_SERVER_FLAG(
    double, interactive_reserve, 0.25,
    "share of --memory-budget-bytes only INTERACTIVE calls may use "
    "(SAMPLED work cannot take it)",
    [](double v, AuditServerOptions& o) { o.interactive_reserve = v; });
ATTNAUDIT_SERVER_FLAG(
    FlagDuration, sampled_promote_after, FlagDuration{},
    "a SAMPLED job queued this long runs before newer INTERACTIVE ones "
    "(0: never; INTERACTIVE always first)",
    [](FlagDuration v, AuditServerOptions& o) {
      // The scheduler spells "never" as an infinite wait.
      o.sampled_promote_after =
          v.value == absl::ZeroDuration() ? absl::InfiniteDuration() : v.value;
    });
ATTNAUDIT_SERVER_FLAG(
    double, gang_backfill_runs, 2.0,
    "how long a CP gang waiting for GPUs lets later jobs use the idle "
    "ones, in run estimates, before it holds them as they free up",
    [](double v, AuditServerOptions& o) { o.gang_backfill_runs = v; });
ATTNAUDIT_SERVER_FLAG(
    bool, cp_ring_gang_always, false,
    "give every CP ring job a gang of min(W, GPUs) GPUs (default: one "
    "GPU, a gang only when the job would not fit one GPU's pool)",
    [](bool v, AuditServerOptions& o) { o.cp_ring_gang_always = v; });
ATTNAUDIT_SERVER_FLAG(
    double, upload_tenant_share, 0.5,
    "share of the stream-upload budget (--memory-budget-bytes) one "
    "tenant may hold, so others' uploads keep being admitted (with no "
    "token file there is one tenant, and it may hold all)",
    [](double v, AuditServerOptions& o) { o.upload_tenant_share = v; });
ATTNAUDIT_SERVER_FLAG(
    FlagDuration, upload_idle_timeout, FlagDuration{absl::Seconds(30)},
    "an AuditStream that receives less than --upload-min-rate x this "
    "long of its bytes in this long is ended DEADLINE_EXCEEDED and its "
    "reservation freed",
    [](FlagDuration v, AuditServerOptions& o) {
      o.upload_idle_timeout = v.value;
    });
ATTNAUDIT_SERVER_FLAG(
    ByteSize, upload_min_rate, ByteSize{int64_t{1} << 20},
    "bytes per second an AuditStream must deliver, measured over "
    "--upload-idle-timeout (messages without bytes do not count)",
    [](ByteSize v, AuditServerOptions& o) { o.upload_min_rate = v.bytes; });
ATTNAUDIT_SERVER_FLAG(
    int64_t, tenant_max_jobs, 0,
    "queued + running jobs one tenant may hold (0: no limit; a token "
    "file line may set its own)",
    [](int64_t v, AuditServerOptions& o) { o.tenant_quota.max_jobs = v; });
ATTNAUDIT_SERVER_FLAG(
    ByteSize, tenant_max_bytes, ByteSize{0},
    "snapshot bytes of one tenant's queued + running jobs (0: no "
    "limit)",
    [](ByteSize v, AuditServerOptions& o) {
      o.tenant_quota.max_bytes = v.bytes;
    });
// Result store retention.
ATTNAUDIT_SERVER_FLAG(FlagDuration, retention_age,
                      FlagDuration{absl::Hours(24 * 7)},
                      "drop stored results older than this (0: keep forever)",
                      [](FlagDuration v, AuditServerOptions& o) {
                        o.retention_age = v.value;
                      });
ATTNAUDIT_SERVER_FLAG(int64_t, retention_count, 100000,
                      "keep at most this many results (0: no cap)",
                      [](int64_t v, AuditServerOptions& o) {
                        o.retention_count = v;
                      });
// Lifecycle.
ATTNAUDIT_SERVER_FLAG(
    FlagDuration, drain_delay, FlagDuration{absl::ZeroDuration()},
    "on SIGTERM, wait this long NOT_SERVING before refusing work (lets "
    "load balancers notice)",
    [](FlagDuration v, AuditServerOptions& o) { o.drain_delay = v.value; });
ATTNAUDIT_SERVER_FLAG(FlagDuration, drain_timeout,
                      FlagDuration{absl::Seconds(30)},
                      "on SIGTERM, wait at most this long for in-flight jobs",
                      [](FlagDuration v, AuditServerOptions& o) {
                        o.drain_timeout = v.value;
                      });
ATTNAUDIT_SERVER_FLAG(
    std::string, log_level, "info",
    "debug, info, warn or error (debug: one line per request)",
    [](const std::string& v, ServerConfig& c) { c.log_level = v; });
// Security.
ATTNAUDIT_SERVER_FLAG(std::string, tls_cert, "",
                      "PEM server certificate chain (enables TLS)",
                      [](const std::string& v, AuditServerOptions& o) {
                        o.tls.cert = v;
                      });
ATTNAUDIT_SERVER_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert",
                      [](const std::string& v, AuditServerOptions& o) {
                        o.tls.key = v;
                      });
ATTNAUDIT_SERVER_FLAG(
    std::string, tls_client_ca, "",
    "PEM CA bundle; clients must present a certificate it signed "
    "(mTLS)",
    [](const std::string& v, AuditServerOptions& o) { o.tls.client_ca = v; });
ATTNAUDIT_SERVER_FLAG(
    std::string, auth_token_file, "",
    "tenants and permissions: token:/cert: lines, or one bearer token "
    "(docs/SECURITY.md); re-read on SIGHUP (health is exempt)",
    [](const std::string& v, AuditServerOptions& o) { o.auth_token_file = v; });
ATTNAUDIT_SERVER_FLAG(std::string, metrics_tls_cert, "",
                      "PEM certificate chain: serve /metrics over HTTPS",
                      [](const std::string& v, AuditServerOptions& o) {
                        o.metrics_tls_cert = v;
                      });
ATTNAUDIT_SERVER_FLAG(std::string, metrics_tls_key, "",
                      "PEM private key of --metrics-tls-cert",
                      [](const std::string& v, AuditServerOptions& o) {
                        o.metrics_tls_key = v;
                      });
ATTNAUDIT_SERVER_FLAG(std::string, metrics_token_file, "",
                      "file holding a bearer token /metrics scrapes must send",
                      [](const std::string& v, AuditServerOptions& o) {
                        o.metrics_token_file = v;
                      });
// Connections.
ATTNAUDIT_SERVER_FLAG(FlagDuration, keepalive_time,
                      FlagDuration{absl::Minutes(2)},
                      "server pings an idle connection this often",
                      [](FlagDuration v, AuditServerOptions& o) {
                        o.connection.keepalive_time = v.value;
                      });
ATTNAUDIT_SERVER_FLAG(FlagDuration, keepalive_timeout,
                      FlagDuration{absl::Seconds(20)},
                      "close a connection whose ping is unanswered this long",
                      [](FlagDuration v, AuditServerOptions& o) {
                        o.connection.keepalive_timeout = v.value;
                      });
ATTNAUDIT_SERVER_FLAG(FlagDuration, keepalive_min_ping_interval,
                      FlagDuration{absl::Seconds(30)},
                      "least interval between client pings the server accepts",
                      [](FlagDuration v, AuditServerOptions& o) {
                        o.connection.keepalive_min_ping_interval = v.value;
                      });
ATTNAUDIT_SERVER_FLAG(
    FlagDuration, max_connection_age, FlagDuration{absl::Minutes(30)},
    "close connections after this age so clients rebalance (0: never)",
    [](FlagDuration v, AuditServerOptions& o) {
      o.connection.max_connection_age = v.value;
    });
ATTNAUDIT_SERVER_FLAG(FlagDuration, max_connection_age_grace,
                      FlagDuration{absl::Minutes(5)},
                      "time given to calls on an aged connection",
                      [](FlagDuration v, AuditServerOptions& o) {
                        o.connection.max_connection_age_grace = v.value;
                      });
ATTNAUDIT_SERVER_FLAG(FlagDuration, max_connection_idle,
                      FlagDuration{absl::Minutes(15)},
                      "close connections idle this long (0: never)",
                      [](FlagDuration v, AuditServerOptions& o) {
                        o.connection.max_connection_idle = v.value;
                      });
ATTNAUDIT_SERVER_FLAG(
    FlagDuration, callback_wake_period, FlagDuration{absl::Milliseconds(250)},
    "while idle, give gRPC's callback threads an event this often, so "
    "the first call after a quiet second is not held up to 100 ms "
    "(0: never)",
    [](FlagDuration v, AuditServerOptions& o) {
      o.callback_wake_period = v.value;
    });
ATTNAUDIT_SERVER_FLAG(
    int64_t, max_concurrent_streams, 64,
    "calls open at once per connection (bounds the memory of requests "
    "being received: this x --max-message-bytes per connection)",
    [](int64_t v, AuditServerOptions& o) {
      o.connection.max_concurrent_streams = static_cast<int>(v);
    });
ATTNAUDIT_SERVER_FLAG(
    bool, accept_memfd_snapshots, false,
    "Audit reads snapshots that clients on this machine name as "
    "sealed memfds (AuditRequest.snapshot_memfd), in place",
    [](bool v, AuditServerOptions& o) { o.accept_memfd_snapshots = v; });
// Metrics.
ATTNAUDIT_SERVER_FLAG(
    int64_t, metrics_max_models, 4,
    "distinct model label values on drift metrics before \"other\"",
    [](int64_t v, AuditServerOptions& o) {
      o.metrics_max_models = static_cast<int>(v);
    });
ATTNAUDIT_SERVER_FLAG(
    int64_t, metrics_max_layers, 16,
    "distinct layer label values on drift metrics before \"other\"",
    [](int64_t v, AuditServerOptions& o) {
      o.metrics_max_layers = static_cast<int>(v);
    });

namespace attnaudit::server {
namespace {

constexpr int64_t kMaxGrpcMessage = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxCount = int64_t{1} << 40;

// "max_message_bytes" -> "max-message-bytes", the documented spelling.
std::string Dashed(absl::string_view name) {
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

absl::Status FlagError(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", Dashed(flag), ": ", what));
}

// Why `address` cannot be listened on, or "" when it can: HOST:PORT or
// [V6]:PORT with a port 0..65535 (0: the kernel picks), or a Unix socket
// (unix:PATH, unix-abstract:NAME). gRPC would take a missing port as 443.
std::string ListenAddressError(absl::string_view address) {
  if (address.empty()) return "must not be empty";
  if (absl::StartsWith(address, "unix:") ||
      absl::StartsWith(address, "unix-abstract:")) {
    return "";
  }
  size_t colon = address.rfind(':');
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return "'[' without ']'";
    colon = close + 1 < address.size() && address[close + 1] == ':'
                ? close + 1
                : absl::string_view::npos;
  } else if (colon != absl::string_view::npos && address.find(':') != colon) {
    return absl::StrCat("'", address,
                        "': an IPv6 host goes in brackets: [HOST]:PORT");
  }
  if (colon == absl::string_view::npos) {
    return absl::StrCat("'", address, "' has no port: expected HOST:PORT");
  }
  const absl::string_view port = address.substr(colon + 1);
  int value = 0;
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &value) || value > 65535) {
    return absl::StrCat("'", address, "': the port '", port,
                        "' is not a number from 0 to 65535");
  }
  if (colon == 0) {
    return absl::StrCat("'", address, "' has no host: expected HOST:PORT");
  }
  return "";
}

// One of the server's flags by its name, dashes read as underscores.
absl::CommandLineFlag* FindServerFlag(absl::string_view arg_name) {
  const std::string name = absl::StrReplaceAll(arg_name, {{"-", "_"}});
  for (const ServerFlag& known : Registry()) {
    if (known.flag->Name() == name) return absl::FindCommandLineFlag(name);
  }
  return nullptr;
}

// Sets `flag` from `value`. absl reports "Illegal value '...' specified for
// flag '...'" followed by the parser's own reason, if any; the reason is
// what the user needs.
absl::Status SetFlag(absl::CommandLineFlag& flag, absl::string_view value) {
  std::string error;
  if (flag.ParseFrom(value, &error)) return absl::OkStatus();
  const size_t reason = error.find("; ");
  if (reason != std::string::npos) {
    return FlagError(flag.Name(), error.substr(reason + 2));
  }
  return FlagError(
      flag.Name(),
      absl::StrCat("'", value, "' is not ",
                   flag.IsOfType<int64_t>() ? "an integer" : "a valid value"));
}

// Every server flag back to its default.
void ResetFlags() {
  for (const ServerFlag& known : Registry()) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(known.flag->Name());
    std::string ignored;
    flag->ParseFrom(flag->DefaultValue(), &ignored);
  }
}

// Applies argv to the flags; sets *help for --help / -h / -help.
absl::Status ApplyArgs(const std::vector<std::string>& argv, bool* help,
                       bool* version) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      *help = true;
      continue;
    }
    if (arg == "--version") {
      *version = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg,
                       "' (flags are --name VALUE, switches --name; see "
                       "--help)"));
    }
    absl::string_view name = absl::string_view(arg).substr(2);
    const size_t eq = name.find('=');
    const bool inline_value = eq != absl::string_view::npos;
    if (inline_value) name = name.substr(0, eq);
    absl::CommandLineFlag* flag = FindServerFlag(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    // A switch (bool) is on by its name alone; --name=false turns it off.
    const bool is_switch = flag->IsOfType<bool>();
    if (!inline_value && !is_switch && i + 1 >= argv.size()) {
      return FlagError(flag->Name(), "needs a value");
    }
    const absl::string_view value =
        inline_value ? absl::string_view(arg).substr(2 + eq + 1)
        : is_switch  ? absl::string_view("true")
                     : absl::string_view(argv[++i]);
    if (absl::Status s = SetFlag(*flag, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The configuration the flags' current values make.
ServerConfig BuildConfig() {
  ServerConfig config;
  for (const ServerFlag& known : Registry()) known.apply(config);
  return config;
}

// An integer flag's value, or a size flag's bytes, as CheckRanges needs it.
int64_t AsInt(int64_t value) { return value; }
int64_t AsInt(ByteSize size) { return size.bytes; }

struct Range {
  absl::string_view flag;
  int64_t value, min, max;
};

// `flag`'s value (before any narrowing into the options) and its bounds.
template <typename T>
Range InRange(const absl::Flag<T>& flag, int64_t min, int64_t max) {
  return Range{absl::GetFlagReflectionHandle(flag).Name(),
               AsInt(absl::GetFlag(flag)), min, max};
}

// The integer flags within their bounds, read from the flags themselves:
// the options narrow some of them to int.
absl::Status CheckRanges() {
  for (const Range& r : {
           InRange(FLAGS_cpu_workers, 0, 4096),
           InRange(FLAGS_threads_per_job, 0, 4096),
           InRange(FLAGS_max_message_bytes, 4096, kMaxGrpcMessage),
           InRange(FLAGS_queue_interactive, 1, kMaxCount),
           InRange(FLAGS_queue_sampled, 1, kMaxCount),
           InRange(FLAGS_memory_budget_bytes, 4096, int64_t{1} << 50),
           InRange(FLAGS_retention_count, 0, kMaxCount),
           InRange(FLAGS_tenant_max_jobs, 0, kMaxCount),
           InRange(FLAGS_max_concurrent_streams, 1, 1 << 20),
           InRange(FLAGS_tenant_max_bytes, 0, int64_t{1} << 50),
           InRange(FLAGS_result_journal_bytes, 1 << 20, int64_t{1} << 50),
           InRange(FLAGS_pair_max_side_bytes, 1 << 20, int64_t{1} << 40),
           InRange(FLAGS_upload_min_rate, 1, int64_t{1} << 40),
           InRange(FLAGS_gpu_memory_pool_bytes, 0, int64_t{1} << 50),
           InRange(FLAGS_metrics_max_models, 1, 1000),
           InRange(FLAGS_metrics_max_layers, 1, 1000),
       }) {
    if (r.value < r.min || r.value > r.max) {
      return FlagError(r.flag, absl::StrCat(r.value, " is outside [", r.min,
                                            ", ", r.max, "]"));
    }
  }
  return absl::OkStatus();
}

// The shares, factors and windows of admission control.
absl::Status CheckAdmission(const AuditServerOptions& o) {
  if (!(o.interactive_reserve >= 0 && o.interactive_reserve < 1)) {
    return FlagError("interactive-reserve",
                     absl::StrCat(o.interactive_reserve, " is outside [0, 1)"));
  }
  if (!(o.gang_backfill_runs >= 0 && o.gang_backfill_runs <= 1e6)) {
    return FlagError(
        "gang-backfill-runs",
        absl::StrCat(o.gang_backfill_runs, " is outside [0, 1e6]"));
  }
  if (!(o.upload_tenant_share > 0 && o.upload_tenant_share <= 1)) {
    return FlagError("upload-tenant-share",
                     absl::StrCat(o.upload_tenant_share, " is outside (0, 1]"));
  }
  if (o.upload_idle_timeout < absl::Seconds(1)) {
    return FlagError("upload-idle-timeout", "must be at least 1s");
  }
  return absl::OkStatus();
}

// TLS files come in pairs; a client CA only makes sense with TLS.
absl::Status CheckTls(const AuditServerOptions& o) {
  if (o.metrics_tls_cert.empty() != o.metrics_tls_key.empty()) {
    return FlagError(
        o.metrics_tls_cert.empty() ? "metrics-tls-cert" : "metrics-tls-key",
        "--metrics-tls-cert and --metrics-tls-key go together");
  }
  if (o.tls.cert.empty() != o.tls.key.empty()) {
    return FlagError(o.tls.cert.empty() ? "tls-cert" : "tls-key",
                     "--tls-cert and --tls-key go together");
  }
  if (!o.tls.client_ca.empty() && o.tls.cert.empty()) {
    return FlagError("tls-client-ca", "needs --tls-cert and --tls-key");
  }
  return absl::OkStatus();
}

// Where the server runs: devices, endpoints, storage and fleet identity.
absl::Status CheckPlacement(const AuditServerOptions& o) {
  // The options hold the parsed selection (the CPU workers when the text
  // is bad), so the text is parsed again for its error.
  if (absl::StatusOr<DeviceSelection> d =
          ParseDeviceSelection(absl::GetFlag(FLAGS_devices));
      !d.ok()) {
    return FlagError("devices", d.status().message());
  }
  if (std::string e = ListenAddressError(o.listen); !e.empty()) {
    return FlagError("listen", e);
  }
  if (!o.metrics_listen.empty()) {
    if (std::string e = ListenAddressError(o.metrics_listen); !e.empty()) {
      return FlagError("metrics-listen", e);
    }
  }
  if (o.data_dir.empty()) return FlagError("data-dir", "must not be empty");
  if (o.store_url != "sqlite" &&
      !absl::StartsWith(o.store_url, "postgresql://") &&
      !absl::StartsWith(o.store_url, "postgres://")) {
    return FlagError("store",
                     "must be sqlite or a postgresql://USER@HOST:PORT/DB URL");
  }
  if (o.pair_wait < absl::ZeroDuration() || o.pair_wait > absl::Hours(24)) {
    return FlagError("pair-wait", "must be in [0, 24h]");
  }
  if (o.fleet_lease < absl::Seconds(1)) {
    return FlagError("fleet-lease", "must be at least 1s");
  }
  if (o.replica_id.size() > 128) {
    return FlagError("replica-id", "at most 128 characters");
  }
  return absl::OkStatus();
}

// Checks on the built options (the integer ranges are CheckRanges'), in
// the order that decides which error a command line with several gets.
absl::Status CheckCombinations(const AuditServerOptions& o) {
  if (absl::Status s = CheckAdmission(o); !s.ok()) return s;
  if (absl::Status s = CheckTls(o); !s.ok()) return s;
  return CheckPlacement(o);
}

}  // namespace

bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error) {
  std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  int64_t mul = 1;
  for (const auto& [suffix, shift] :
       {std::pair<absl::string_view, int>{"kib", 10},
        {"mib", 20},
        {"gib", 30},
        {"k", 10},
        {"m", 20},
        {"g", 30}}) {
    if (absl::EndsWith(v, suffix)) {
      v.resize(v.size() - suffix.size());
      mul = int64_t{1} << shift;
      break;
    }
  }
  int64_t x = 0;
  if (!absl::SimpleAtoi(v, &x) || x < 0) {
    *error =
        absl::StrCat("'", text, "' is not a size (e.g. 268435456, 256MiB)");
    return false;
  }
  if (x > (int64_t{1} << 62) / mul) {
    *error = absl::StrCat("'", text, "' is too large");
    return false;
  }
  out->bytes = x * mul;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) {
  for (const auto& [suffix, shift] :
       {std::pair<const char*, int>{"GiB", 30}, {"MiB", 20}, {"KiB", 10}}) {
    const int64_t unit = int64_t{1} << shift;
    if (size.bytes > 0 && size.bytes % unit == 0) {
      return absl::StrCat(size.bytes / unit, suffix);
    }
  }
  return absl::StrCat(size.bytes);
}

bool AbslParseFlag(absl::string_view text, FlagDuration* out,
                   std::string* error) {
  const absl::string_view v = absl::StripAsciiWhitespace(text);
  absl::string_view day_count = v;
  int64_t days = 0;
  absl::Duration d;
  if (v == "0") {
    out->value = absl::ZeroDuration();
    return true;
  }
  if (absl::ConsumeSuffix(&day_count, "d") &&
      absl::SimpleAtoi(day_count, &days) && days >= 0 && days < 100000) {
    out->value = absl::Hours(24 * days);
    return true;
  }
  if (absl::ParseDuration(v, &d) && d >= absl::ZeroDuration() &&
      d != absl::InfiniteDuration()) {
    out->value = d;
    return true;
  }
  *error =
      absl::StrCat("'", text, "' is not a duration (e.g. 30s, 5m, 1h30m, 7d)");
  return false;
}

std::string AbslUnparseFlag(FlagDuration d) {
  if (d.value == absl::ZeroDuration()) return "0";
  const absl::Duration day = absl::Hours(24);
  if (d.value % day == absl::ZeroDuration()) {
    return absl::StrCat(absl::IDivDuration(d.value, day, &d.value), "d");
  }
  return absl::FormatDuration(d.value);
}

absl::StatusOr<ServerConfig> ParseServerFlags(
    const std::vector<std::string>& argv) {
  ResetFlags();
  bool help = false;
  bool version = false;
  if (absl::Status s = ApplyArgs(argv, &help, &version); !s.ok()) return s;
  if (absl::Status s = CheckRanges(); !s.ok()) return s;
  ServerConfig config = BuildConfig();
  config.help = help;
  config.version = version;
  if (absl::Status s = CheckCombinations(config.options); !s.ok()) return s;
  return config;
}

std::string ServerHelpText() {
  std::string out =
      "usage: attnaudit-server [--flag VALUE | --flag=VALUE]...\n\n"
      "The attnaudit audit service (gRPC attnaudit.v1.AuditService, "
      "grpc.health.v1,\nreflection) with Prometheus metrics. Every flag is "
      "optional.\n\nflags (default in brackets):\n";
  for (const ServerFlag& known : Registry()) {
    const std::string def = known.flag->DefaultValue();
    absl::StrAppendFormat(&out, "  --%-28s %s [%s]\n",
                          Dashed(known.flag->Name()), known.flag->Help(),
                          def.empty() ? "\"\"" : def);
  }
  absl::StrAppendFormat(&out, "  --%-28s %s\n", "help",
                        "print this text and exit");
  absl::StrAppendFormat(&out, "  --%-28s %s\n", "version",
                        "print the version and exit");
  absl::StrAppend(&out,
                  "\nSizes: 1048576, 1MiB, 4G. Durations: 30s, 5m, 1h30m, 7d."
                  "\nSIGTERM/SIGINT: health NOT_SERVING, stop admitting, "
                  "drain up to\n--drain-timeout, stop. See docs/OPERATIONS.md."
                  "\n");
  return out;
}

}  // namespace attnaudit::server
