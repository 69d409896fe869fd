#include "server/main/server_flags.h"

#include <algorithm>
#include <string>
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

using attnaudit::server::ByteSize;
using attnaudit::server::FlagDuration;

// Endpoints and storage.
ABSL_FLAG(std::string, listen, "localhost:50051",
          "gRPC address HOST:PORT (port 0 picks a free port)");
ABSL_FLAG(std::string, metrics_listen, "localhost:9464",
          "Prometheus /metrics address HOST:PORT (\"\" disables it)");
ABSL_FLAG(std::string, data_dir, "./var/attnaudit",
          "spool and result store directory");
ABSL_FLAG(std::string, store, "sqlite",
          "where jobs and results live: sqlite (<data-dir>/results.db, one "
          "process) or postgresql://USER[:PASSWORD]@HOST:PORT/DB[?PARAMS] "
          "(a fleet of replicas sharing one PostgreSQL database)");
ABSL_FLAG(bool, store_audit_results, true,
          "store Audit/AuditStream results like Submit's (GetResult, "
          "ListResults, resumable watches); false: only stream them to "
          "watchers");
ABSL_FLAG(ByteSize, result_journal_bytes, ByteSize{int64_t{256} << 20},
          "Audit results the store cannot take (an outage) are kept in "
          "<data-dir>/journal, fsync'd, up to this many bytes, and stored "
          "when it is back; past it an Audit is answered without a job id");
ABSL_FLAG(FlagDuration, fleet_lease, FlagDuration{absl::Seconds(15)},
          "with a postgresql:// store: a replica silent this long is gone, "
          "and another takes over its unfinished jobs");
ABSL_FLAG(std::string, replica_id, "",
          "this replica's name in a fleet, stored as the owner of the jobs "
          "it accepts and shown in results (default: the host name)");
// Execution.
ABSL_FLAG(int64_t, cpu_workers, 0,
          "concurrent CPU audit jobs (0: one per 16 cores, or cores / "
          "threads-per-job)");
ABSL_FLAG(int64_t, threads_per_job, 0,
          "threads one audit uses (0: all cores / cpu-workers)");
ABSL_FLAG(std::string, devices, "cpu",
          "devices to drive: cpu (the CPU workers), all (one worker per "
          "visible GPU; the CPU workers when there is none or the build has "
          "no CUDA backend), or GPUs by ordinal: cuda:0,cuda:1");
ABSL_FLAG(ByteSize, gpu_memory_pool_bytes, ByteSize{0},
          "device memory each GPU worker reserves for its jobs (0: three "
          "quarters of the GPU's free memory at start-up); a snapshot that "
          "does not fit runs on the CPU backend");
// Admission control.
ABSL_FLAG(ByteSize, max_message_bytes, ByteSize{int64_t{256} << 20},
          "largest unary request; bigger snapshots use AuditStream (never "
          "unlimited)");
ABSL_FLAG(int64_t, queue_interactive, 64,
          "queued INTERACTIVE jobs (Audit/AuditStream) before "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, queue_sampled, 1024,
          "queued SAMPLED jobs (Submit) before RESOURCE_EXHAUSTED");
ABSL_FLAG(ByteSize, memory_budget_bytes, ByteSize{int64_t{8} << 30},
          "snapshot bytes of queued jobs (and, separately, of stream uploads "
          "in progress)");
ABSL_FLAG(double, interactive_reserve, 0.25,
          "share of --memory-budget-bytes only INTERACTIVE calls may use "
          "(SAMPLED work cannot take it)");
ABSL_FLAG(FlagDuration, sampled_promote_after, FlagDuration{},
          "a SAMPLED job queued this long runs before newer INTERACTIVE ones "
          "(0: never; INTERACTIVE always first)");
ABSL_FLAG(double, gang_backfill_runs, 2.0,
          "how long a CP gang waiting for GPUs lets later jobs use the idle "
          "ones, in run estimates, before it holds them as they free up");
ABSL_FLAG(bool, cp_ring_gang_always, false,
          "give every CP ring job a gang of min(W, GPUs) GPUs (default: one "
          "GPU, a gang only when the job would not fit one GPU's pool)");
ABSL_FLAG(double, upload_tenant_share, 0.5,
          "share of the stream-upload budget (--memory-budget-bytes) one "
          "tenant may hold, so others' uploads keep being admitted (with no "
          "token file there is one tenant, and it may hold all)");
ABSL_FLAG(FlagDuration, upload_idle_timeout, FlagDuration{absl::Seconds(30)},
          "an AuditStream that receives less than --upload-min-rate x this "
          "long of its bytes in this long is ended DEADLINE_EXCEEDED and its "
          "reservation freed");
ABSL_FLAG(ByteSize, upload_min_rate, ByteSize{int64_t{1} << 20},
          "bytes per second an AuditStream must deliver, measured over "
          "--upload-idle-timeout (messages without bytes do not count)");
ABSL_FLAG(int64_t, tenant_max_jobs, 0,
          "queued + running jobs one tenant may hold (0: no limit; a token "
          "file line may set its own)");
ABSL_FLAG(ByteSize, tenant_max_bytes, ByteSize{0},
          "snapshot bytes of one tenant's queued + running jobs (0: no "
          "limit)");
// Result store retention.
ABSL_FLAG(FlagDuration, retention_age, FlagDuration{absl::Hours(24 * 7)},
          "drop stored results older than this (0: keep forever)");
ABSL_FLAG(int64_t, retention_count, 100000,
          "keep at most this many results (0: no cap)");
// Lifecycle.
ABSL_FLAG(FlagDuration, drain_delay, FlagDuration{absl::ZeroDuration()},
          "on SIGTERM, wait this long NOT_SERVING before refusing work (lets "
          "load balancers notice)");
ABSL_FLAG(FlagDuration, drain_timeout, FlagDuration{absl::Seconds(30)},
          "on SIGTERM, wait at most this long for in-flight jobs");
ABSL_FLAG(std::string, log_level, "info",
          "debug, info, warn or error (debug: one line per request)");
// Security.
ABSL_FLAG(std::string, tls_cert, "",
          "PEM server certificate chain (enables TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; clients must present a certificate it signed "
          "(mTLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "tenants and permissions: token:/cert: lines, or one bearer token "
          "(docs/SECURITY.md); re-read on SIGHUP (health is exempt)");
ABSL_FLAG(std::string, metrics_tls_cert, "",
          "PEM certificate chain: serve /metrics over HTTPS");
ABSL_FLAG(std::string, metrics_tls_key, "",
          "PEM private key of --metrics-tls-cert");
ABSL_FLAG(std::string, metrics_token_file, "",
          "file holding a bearer token /metrics scrapes must send");
// Connections.
ABSL_FLAG(FlagDuration, keepalive_time, FlagDuration{absl::Minutes(2)},
          "server pings an idle connection this often");
ABSL_FLAG(FlagDuration, keepalive_timeout, FlagDuration{absl::Seconds(20)},
          "close a connection whose ping is unanswered this long");
ABSL_FLAG(FlagDuration, keepalive_min_ping_interval,
          FlagDuration{absl::Seconds(30)},
          "least interval between client pings the server accepts");
ABSL_FLAG(FlagDuration, max_connection_age, FlagDuration{absl::Minutes(30)},
          "close connections after this age so clients rebalance (0: never)");
ABSL_FLAG(FlagDuration, max_connection_age_grace,
          FlagDuration{absl::Minutes(5)},
          "time given to calls on an aged connection");
ABSL_FLAG(FlagDuration, max_connection_idle, FlagDuration{absl::Minutes(15)},
          "close connections idle this long (0: never)");
ABSL_FLAG(FlagDuration, callback_wake_period,
          FlagDuration{absl::Milliseconds(250)},
          "while idle, give gRPC's callback threads an event this often, so "
          "the first call after a quiet second is not held up to 100 ms "
          "(0: never)");
ABSL_FLAG(int64_t, max_concurrent_streams, 64,
          "calls open at once per connection (bounds the memory of requests "
          "being received: this x --max-message-bytes per connection)");
ABSL_FLAG(bool, accept_memfd_snapshots, false,
          "Audit reads snapshots that clients on this machine name as "
          "sealed memfds (AuditRequest.snapshot_memfd), in place");
// Metrics.
ABSL_FLAG(int64_t, metrics_max_models, 4,
          "distinct model label values on drift metrics before \"other\"");
ABSL_FLAG(int64_t, metrics_max_layers, 16,
          "distinct layer label values on drift metrics before \"other\"");

namespace attnaudit::server {
namespace {

constexpr int64_t kMaxGrpcMessage = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxCount = int64_t{1} << 40;

// The server's flags in --help order. Only these are accepted: other
// libraries may register absl flags of their own.
const std::vector<absl::string_view>& FlagNames() {
  static const auto* names = new std::vector<absl::string_view>{
      absl::GetFlagReflectionHandle(FLAGS_listen).Name(),
      absl::GetFlagReflectionHandle(FLAGS_metrics_listen).Name(),
      absl::GetFlagReflectionHandle(FLAGS_data_dir).Name(),
      absl::GetFlagReflectionHandle(FLAGS_store).Name(),
      absl::GetFlagReflectionHandle(FLAGS_replica_id).Name(),
      absl::GetFlagReflectionHandle(FLAGS_store_audit_results).Name(),
      absl::GetFlagReflectionHandle(FLAGS_result_journal_bytes).Name(),
      absl::GetFlagReflectionHandle(FLAGS_fleet_lease).Name(),
      absl::GetFlagReflectionHandle(FLAGS_cpu_workers).Name(),
      absl::GetFlagReflectionHandle(FLAGS_threads_per_job).Name(),
      absl::GetFlagReflectionHandle(FLAGS_devices).Name(),
      absl::GetFlagReflectionHandle(FLAGS_gpu_memory_pool_bytes).Name(),
      absl::GetFlagReflectionHandle(FLAGS_max_message_bytes).Name(),
      absl::GetFlagReflectionHandle(FLAGS_queue_interactive).Name(),
      absl::GetFlagReflectionHandle(FLAGS_queue_sampled).Name(),
      absl::GetFlagReflectionHandle(FLAGS_memory_budget_bytes).Name(),
      absl::GetFlagReflectionHandle(FLAGS_interactive_reserve).Name(),
      absl::GetFlagReflectionHandle(FLAGS_sampled_promote_after).Name(),
      absl::GetFlagReflectionHandle(FLAGS_gang_backfill_runs).Name(),
      absl::GetFlagReflectionHandle(FLAGS_cp_ring_gang_always).Name(),
      absl::GetFlagReflectionHandle(FLAGS_upload_tenant_share).Name(),
      absl::GetFlagReflectionHandle(FLAGS_upload_idle_timeout).Name(),
      absl::GetFlagReflectionHandle(FLAGS_upload_min_rate).Name(),
      absl::GetFlagReflectionHandle(FLAGS_tenant_max_jobs).Name(),
      absl::GetFlagReflectionHandle(FLAGS_tenant_max_bytes).Name(),
      absl::GetFlagReflectionHandle(FLAGS_retention_age).Name(),
      absl::GetFlagReflectionHandle(FLAGS_retention_count).Name(),
      absl::GetFlagReflectionHandle(FLAGS_drain_delay).Name(),
      absl::GetFlagReflectionHandle(FLAGS_drain_timeout).Name(),
      absl::GetFlagReflectionHandle(FLAGS_log_level).Name(),
      absl::GetFlagReflectionHandle(FLAGS_tls_cert).Name(),
      absl::GetFlagReflectionHandle(FLAGS_tls_key).Name(),
      absl::GetFlagReflectionHandle(FLAGS_tls_client_ca).Name(),
      absl::GetFlagReflectionHandle(FLAGS_auth_token_file).Name(),
      absl::GetFlagReflectionHandle(FLAGS_metrics_tls_cert).Name(),
      absl::GetFlagReflectionHandle(FLAGS_metrics_tls_key).Name(),
      absl::GetFlagReflectionHandle(FLAGS_metrics_token_file).Name(),
      absl::GetFlagReflectionHandle(FLAGS_keepalive_time).Name(),
      absl::GetFlagReflectionHandle(FLAGS_keepalive_timeout).Name(),
      absl::GetFlagReflectionHandle(FLAGS_keepalive_min_ping_interval).Name(),
      absl::GetFlagReflectionHandle(FLAGS_max_connection_age).Name(),
      absl::GetFlagReflectionHandle(FLAGS_max_connection_age_grace).Name(),
      absl::GetFlagReflectionHandle(FLAGS_max_connection_idle).Name(),
      absl::GetFlagReflectionHandle(FLAGS_callback_wake_period).Name(),
      absl::GetFlagReflectionHandle(FLAGS_max_concurrent_streams).Name(),
      absl::GetFlagReflectionHandle(FLAGS_accept_memfd_snapshots).Name(),
      absl::GetFlagReflectionHandle(FLAGS_metrics_max_models).Name(),
      absl::GetFlagReflectionHandle(FLAGS_metrics_max_layers).Name(),
  };
  return *names;
}

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
  for (absl::string_view known : FlagNames()) {
    if (known == name) return absl::FindCommandLineFlag(known);
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
  for (absl::string_view name : FlagNames()) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string ignored;
    flag->ParseFrom(flag->DefaultValue(), &ignored);
  }
}

// Applies argv to the flags; sets *help for --help / -h / -help.
absl::Status ApplyArgs(const std::vector<std::string>& argv, bool* help) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      *help = true;
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

ServerFlags ReadFlags() {
  ServerFlags f;
  f.listen = absl::GetFlag(FLAGS_listen);
  f.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  f.data_dir = absl::GetFlag(FLAGS_data_dir);
  f.store = absl::GetFlag(FLAGS_store);
  f.replica_id = absl::GetFlag(FLAGS_replica_id);
  f.store_audit_results = absl::GetFlag(FLAGS_store_audit_results);
  f.result_journal_bytes = absl::GetFlag(FLAGS_result_journal_bytes).bytes;
  f.fleet_lease = absl::GetFlag(FLAGS_fleet_lease).value;
  f.cpu_workers = absl::GetFlag(FLAGS_cpu_workers);
  f.threads_per_job = absl::GetFlag(FLAGS_threads_per_job);
  f.devices = absl::GetFlag(FLAGS_devices);
  f.gpu_memory_pool_bytes = absl::GetFlag(FLAGS_gpu_memory_pool_bytes).bytes;
  f.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes).bytes;
  f.queue_interactive = absl::GetFlag(FLAGS_queue_interactive);
  f.queue_sampled = absl::GetFlag(FLAGS_queue_sampled);
  f.memory_budget_bytes = absl::GetFlag(FLAGS_memory_budget_bytes).bytes;
  f.interactive_reserve = absl::GetFlag(FLAGS_interactive_reserve);
  f.sampled_promote_after = absl::GetFlag(FLAGS_sampled_promote_after).value;
  f.gang_backfill_runs = absl::GetFlag(FLAGS_gang_backfill_runs);
  f.cp_ring_gang_always = absl::GetFlag(FLAGS_cp_ring_gang_always);
  f.upload_tenant_share = absl::GetFlag(FLAGS_upload_tenant_share);
  f.upload_idle_timeout = absl::GetFlag(FLAGS_upload_idle_timeout).value;
  f.upload_min_rate = absl::GetFlag(FLAGS_upload_min_rate).bytes;
  f.tenant_max_jobs = absl::GetFlag(FLAGS_tenant_max_jobs);
  f.tenant_max_bytes = absl::GetFlag(FLAGS_tenant_max_bytes).bytes;
  f.retention_age = absl::GetFlag(FLAGS_retention_age).value;
  f.retention_count = absl::GetFlag(FLAGS_retention_count);
  f.drain_delay = absl::GetFlag(FLAGS_drain_delay).value;
  f.drain_timeout = absl::GetFlag(FLAGS_drain_timeout).value;
  f.log_level = absl::GetFlag(FLAGS_log_level);
  f.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  f.tls_key = absl::GetFlag(FLAGS_tls_key);
  f.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  f.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  f.metrics_tls_cert = absl::GetFlag(FLAGS_metrics_tls_cert);
  f.metrics_tls_key = absl::GetFlag(FLAGS_metrics_tls_key);
  f.metrics_token_file = absl::GetFlag(FLAGS_metrics_token_file);
  f.keepalive_time = absl::GetFlag(FLAGS_keepalive_time).value;
  f.keepalive_timeout = absl::GetFlag(FLAGS_keepalive_timeout).value;
  f.keepalive_min_ping_interval =
      absl::GetFlag(FLAGS_keepalive_min_ping_interval).value;
  f.max_connection_age = absl::GetFlag(FLAGS_max_connection_age).value;
  f.max_connection_age_grace =
      absl::GetFlag(FLAGS_max_connection_age_grace).value;
  f.max_connection_idle = absl::GetFlag(FLAGS_max_connection_idle).value;
  f.callback_wake_period = absl::GetFlag(FLAGS_callback_wake_period).value;
  f.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  f.accept_memfd_snapshots = absl::GetFlag(FLAGS_accept_memfd_snapshots);
  f.metrics_max_models = absl::GetFlag(FLAGS_metrics_max_models);
  f.metrics_max_layers = absl::GetFlag(FLAGS_metrics_max_layers);
  return f;
}

absl::Status CheckRanges(const ServerFlags& f) {
  struct Range {
    const char* flag;
    int64_t value, min, max;
  };
  for (const Range& r : {
           Range{"cpu-workers", f.cpu_workers, 0, 4096},
           Range{"threads-per-job", f.threads_per_job, 0, 4096},
           Range{"max-message-bytes", f.max_message_bytes, 4096,
                 kMaxGrpcMessage},
           Range{"queue-interactive", f.queue_interactive, 1, kMaxCount},
           Range{"queue-sampled", f.queue_sampled, 1, kMaxCount},
           Range{"memory-budget-bytes", f.memory_budget_bytes, 4096,
                 int64_t{1} << 50},
           Range{"retention-count", f.retention_count, 0, kMaxCount},
           Range{"tenant-max-jobs", f.tenant_max_jobs, 0, kMaxCount},
           Range{"max-concurrent-streams", f.max_concurrent_streams, 1,
                 1 << 20},
           Range{"tenant-max-bytes", f.tenant_max_bytes, 0, int64_t{1} << 50},
           Range{"result-journal-bytes", f.result_journal_bytes, 1 << 20,
                 int64_t{1} << 50},
           Range{"upload-min-rate", f.upload_min_rate, 1, int64_t{1} << 40},
           Range{"gpu-memory-pool-bytes", f.gpu_memory_pool_bytes, 0,
                 int64_t{1} << 50},
           Range{"metrics-max-models", f.metrics_max_models, 1, 1000},
           Range{"metrics-max-layers", f.metrics_max_layers, 1, 1000},
       }) {
    if (r.value < r.min || r.value > r.max) {
      return FlagError(r.flag, absl::StrCat(r.value, " is outside [", r.min,
                                            ", ", r.max, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCombinations(const ServerFlags& f) {
  if (!(f.interactive_reserve >= 0 && f.interactive_reserve < 1)) {
    return FlagError("interactive-reserve",
                     absl::StrCat(f.interactive_reserve, " is outside [0, 1)"));
  }
  if (!(f.gang_backfill_runs >= 0 && f.gang_backfill_runs <= 1e6)) {
    return FlagError(
        "gang-backfill-runs",
        absl::StrCat(f.gang_backfill_runs, " is outside [0, 1e6]"));
  }
  if (!(f.upload_tenant_share > 0 && f.upload_tenant_share <= 1)) {
    return FlagError("upload-tenant-share",
                     absl::StrCat(f.upload_tenant_share, " is outside (0, 1]"));
  }
  if (f.upload_idle_timeout < absl::Seconds(1)) {
    return FlagError("upload-idle-timeout", "must be at least 1s");
  }
  if (f.metrics_tls_cert.empty() != f.metrics_tls_key.empty()) {
    return FlagError(
        f.metrics_tls_cert.empty() ? "metrics-tls-cert" : "metrics-tls-key",
        "--metrics-tls-cert and --metrics-tls-key go together");
  }
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return FlagError(f.tls_cert.empty() ? "tls-cert" : "tls-key",
                     "--tls-cert and --tls-key go together");
  }
  if (!f.tls_client_ca.empty() && f.tls_cert.empty()) {
    return FlagError("tls-client-ca", "needs --tls-cert and --tls-key");
  }
  if (absl::StatusOr<DeviceSelection> d = ParseDeviceSelection(f.devices);
      !d.ok()) {
    return FlagError("devices", d.status().message());
  }
  if (std::string e = ListenAddressError(f.listen); !e.empty()) {
    return FlagError("listen", e);
  }
  if (!f.metrics_listen.empty()) {
    if (std::string e = ListenAddressError(f.metrics_listen); !e.empty()) {
      return FlagError("metrics-listen", e);
    }
  }
  if (f.data_dir.empty()) return FlagError("data-dir", "must not be empty");
  if (f.store != "sqlite" && !absl::StartsWith(f.store, "postgresql://") &&
      !absl::StartsWith(f.store, "postgres://")) {
    return FlagError("store",
                     "must be sqlite or a postgresql://USER@HOST:PORT/DB URL");
  }
  if (f.fleet_lease < absl::Seconds(1)) {
    return FlagError("fleet-lease", "must be at least 1s");
  }
  if (f.replica_id.size() > 128) {
    return FlagError("replica-id", "at most 128 characters");
  }
  return absl::OkStatus();
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

absl::StatusOr<ServerFlags> ParseServerFlags(
    const std::vector<std::string>& argv) {
  ResetFlags();
  bool help = false;
  if (absl::Status s = ApplyArgs(argv, &help); !s.ok()) return s;
  ServerFlags flags = ReadFlags();
  flags.help = help;
  if (absl::Status s = CheckRanges(flags); !s.ok()) return s;
  if (absl::Status s = CheckCombinations(flags); !s.ok()) return s;
  return flags;
}

std::string ServerHelpText() {
  std::string out =
      "usage: attnaudit-server [--flag VALUE | --flag=VALUE]...\n\n"
      "The attnaudit audit service (gRPC attnaudit.v1.AuditService, "
      "grpc.health.v1,\nreflection) with Prometheus metrics. Every flag is "
      "optional.\n\nflags (default in brackets):\n";
  for (absl::string_view name : FlagNames()) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    const std::string def = flag->DefaultValue();
    absl::StrAppendFormat(&out, "  --%-28s %s [%s]\n", Dashed(name),
                          flag->Help(), def.empty() ? "\"\"" : def);
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

}  // namespace attnaudit::server
