// attnaudit-server: the audit service. Flags: `attnaudit-server --help`
// (server_flags.h); operations: docs/OPERATIONS.md.
//
// Signals: SIGTERM, SIGINT and SIGHUP are blocked in every thread and taken
// by sigwait here, so everything runs on the main thread, outside any
// signal handler. SIGHUP re-reads the token file (a bad file keeps the
// tenants in force and is logged). The first SIGTERM/SIGINT starts the
// graceful drain (AuditServer::Shutdown); a second one during the drain
// exits at once (exit code 1; spooled jobs are resumed on the next start).
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "server/app/audit_server.h"
#include "server/common/log.h"
#include "server/device_pool/device_selection.h"
#include "server/main/server_flags.h"
#include "server/store/job_store.h"

namespace attnaudit::server {
namespace {

constexpr int kExitUsage = 2;

AuditServerOptions ToOptions(const ServerFlags& f) {
  AuditServerOptions o;
  o.listen = f.listen;
  o.metrics_listen = f.metrics_listen;
  o.data_dir = f.data_dir;
  o.store_url = f.store;
  o.replica_id = f.replica_id;
  o.store_audit_results = f.store_audit_results;
  o.result_journal_bytes = f.result_journal_bytes;
  o.fleet_lease = f.fleet_lease;
  o.cpu_workers = static_cast<int>(f.cpu_workers);
  o.threads_per_job = static_cast<int>(f.threads_per_job);
  // ParseServerFlags has checked the syntax.
  o.device_selection =
      ParseDeviceSelection(f.devices).value_or(DeviceSelection{});
  o.gpu_memory_pool_bytes = f.gpu_memory_pool_bytes;
  o.max_message_bytes = f.max_message_bytes;
  o.queue_capacity = {f.queue_interactive, f.queue_sampled};
  o.memory_budget_bytes = f.memory_budget_bytes;
  o.interactive_reserve = f.interactive_reserve;
  o.sampled_promote_after = f.sampled_promote_after == absl::ZeroDuration()
                                ? absl::InfiniteDuration()
                                : f.sampled_promote_after;
  o.gang_backfill_runs = f.gang_backfill_runs;
  o.cp_ring_gang_always = f.cp_ring_gang_always;
  o.upload_tenant_share = f.upload_tenant_share;
  o.upload_idle_timeout = f.upload_idle_timeout;
  o.upload_min_rate = f.upload_min_rate;
  o.tenant_quota = TenantQuota{f.tenant_max_jobs, f.tenant_max_bytes};
  o.retention_age = f.retention_age;
  o.retention_count = f.retention_count;
  o.drain_delay = f.drain_delay;
  o.drain_timeout = f.drain_timeout;
  o.tls.cert = f.tls_cert;
  o.tls.key = f.tls_key;
  o.tls.client_ca = f.tls_client_ca;
  o.auth_token_file = f.auth_token_file;
  o.metrics_tls_cert = f.metrics_tls_cert;
  o.metrics_tls_key = f.metrics_tls_key;
  o.metrics_token_file = f.metrics_token_file;
  o.connection.keepalive_time = f.keepalive_time;
  o.connection.keepalive_timeout = f.keepalive_timeout;
  o.connection.keepalive_min_ping_interval = f.keepalive_min_ping_interval;
  o.connection.max_connection_age = f.max_connection_age;
  o.connection.max_connection_age_grace = f.max_connection_age_grace;
  o.connection.max_connection_idle = f.max_connection_idle;
  o.connection.max_concurrent_streams =
      static_cast<int>(f.max_concurrent_streams);
  o.accept_memfd_snapshots = f.accept_memfd_snapshots;
  o.callback_wake_period = f.callback_wake_period;
  o.metrics_max_models = static_cast<int>(f.metrics_max_models);
  o.metrics_max_layers = static_cast<int>(f.metrics_max_layers);
  return o;
}

// Whether `listen` is reachable from this machine only.
bool LoopbackOnly(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:") ||
      absl::StartsWith(listen, "unix-abstract:")) {
    return true;
  }
  const size_t colon = listen.rfind(':');
  const std::string host =
      colon == std::string::npos ? listen : listen.substr(0, colon);
  return host == "localhost" || host == "[::1]" ||
         absl::StartsWith(host, "127.");
}

// Warnings about a server open to the network, and about secrets that
// would cross it in clear text.
void WarnAboutExposure(const ServerFlags& flags) {
  if (!LoopbackOnly(flags.listen) && flags.auth_token_file.empty()) {
    ATTNAUDIT_LOG(warn,
                  "OPEN SERVER: gRPC listens beyond this machine with "
                  "authentication off: anyone who reaches this port can "
                  "submit audits, read every result and cancel jobs; set "
                  "--auth-token-file (and --tls-cert) outside a trusted "
                  "network")
        .Kv("listen", flags.listen)
        .Kv("tls", flags.tls_cert.empty() ? "off" : "on");
  }
  if (!flags.metrics_listen.empty() && !LoopbackOnly(flags.metrics_listen) &&
      flags.metrics_token_file.empty()) {
    ATTNAUDIT_LOG(warn,
                  "/metrics listens beyond this machine without a token: "
                  "anyone who reaches it reads model names and drift "
                  "figures; set --metrics-token-file (and --metrics-tls-cert)")
        .Kv("metrics_listen", flags.metrics_listen);
  }
  if (!flags.auth_token_file.empty() && flags.tls_cert.empty()) {
    ATTNAUDIT_LOG(warn,
                  "bearer token auth without TLS: tokens cross the network "
                  "in plaintext; use --tls-cert outside a trusted network");
  }
  if (!flags.metrics_token_file.empty() && flags.metrics_tls_cert.empty()) {
    ATTNAUDIT_LOG(warn,
                  "/metrics token without TLS: the scrape token crosses the "
                  "network in plaintext; add --metrics-tls-cert");
  }
}

// protobuf logs a request it cannot parse (e.g. invalid UTF-8) at ERROR on
// stderr, so any client could flood the log; the RPC layer answers those
// requests itself, so protobuf's lines go to the debug level.
void RouteProtobufLogs() {
  google::protobuf::SetLogHandler(+[](google::protobuf::LogLevel level,
                                      const char* file, int line,
                                      const std::string& message) {
    if (level == google::protobuf::LOGLEVEL_FATAL) {
      ATTNAUDIT_LOG(err, "protobuf").Kv("message", message);
      return;
    }
    ATTNAUDIT_LOG(debug, "protobuf")
        .Kv("file", file)
        .Kv("line", static_cast<int64_t>(line))
        .Kv("message", message);
  });
}

// Process-wide settings made before any thread exists, so every thread
// inherits the signal mask. Returns the stop signals to sigwait on.
sigset_t PrepareProcess() {
  // Snapshot buffers are large (tens to hundreds of MiB) and short-lived.
  // By default glibc serves each from a fresh mmap and unmaps it on free,
  // so every request pays a page fault per 4 KiB of the snapshot again;
  // keeping them in the heap for reuse measured about 1.7x faster ingest
  // over loopback (docs/PERF.md). Freed memory is retained while the server
  // is busy and handed back by AuditServer's reclaimer (malloc_trim) once
  // it is idle.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // One heap for every thread. malloc_trim returns the free pages inside
  // every arena but not the free top of a thread arena (glibc shrinks that
  // only on a free() past M_TRIM_THRESHOLD, which is high for the reason
  // above), and freed snapshot buffers end up exactly there: with the
  // default arenas, ~130 MiB of a 340 MiB burst stayed resident after the
  // trim; with one, RSS went back to its pre-burst size (docs/PERF.md,
  // "Overload"). Small allocations are served from per-thread caches, so
  // one arena costs no measurable contention here.
  mallopt(M_ARENA_MAX, 1);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigset_t blocked = stop_signals;
  sigaddset(&blocked, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return stop_signals;
}

std::string Host(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// The address clients dial: HOST:PORT with the port gRPC bound (the flag
// may say :0), or a Unix socket's address as given (it has no port).
std::string ListeningAddress(const std::string& listen, int port) {
  if (absl::StartsWith(listen, "unix:") ||
      absl::StartsWith(listen, "unix-abstract:")) {
    return listen;
  }
  return absl::StrCat(Host(listen), ":", port);
}

// One line per endpoint (the e2e test and operators read the ports here).
void LogEndpoints(const ServerFlags& flags, const AuditServer& server) {
  ATTNAUDIT_LOG(info, "grpc listening")
      .Kv("addr", ListeningAddress(flags.listen, server.port()))
      .Kv("tls", flags.tls_cert.empty()
                     ? "off"
                     : (flags.tls_client_ca.empty() ? "on" : "mutual"))
      .Kv("auth", flags.auth_token_file.empty() ? "off" : "bearer")
      .Kv("max_message_bytes", flags.max_message_bytes)
      .Kv("health", "grpc.health.v1 (\"\", attnaudit.v1.AuditService)")
      .Kv("reflection", true);
  {
    std::vector<std::string> names;
    std::string kind = "cpu";
    for (const DeviceInfo& d : server.scheduler()->Devices()) {
      names.push_back(d.name);
      kind = d.kind;
    }
    const std::string workers = absl::StrJoin(names, ",");
    if (server.devices_note().empty()) {
      ATTNAUDIT_LOG(info, "devices")
          .Kv("requested", flags.devices)
          .Kv("using", kind)
          .Kv("workers", workers);
    } else {
      // e.g. --devices all on a machine without a GPU: say what runs.
      ATTNAUDIT_LOG(info, "devices")
          .Kv("requested", flags.devices)
          .Kv("using", kind)
          .Kv("workers", workers)
          .Kv("note", server.devices_note());
    }
  }
  if (flags.metrics_listen.empty()) {
    ATTNAUDIT_LOG(info, "metrics endpoint disabled");
  } else {
    ATTNAUDIT_LOG(info, "metrics listening")
        .Kv("addr", absl::StrCat(Host(flags.metrics_listen), ":",
                                 server.metrics_port()))
        .Kv("path", "/metrics")
        .Kv("tls", flags.metrics_tls_cert.empty() ? "off" : "on")
        .Kv("auth", flags.metrics_token_file.empty() ? "off" : "bearer");
  }
  std::error_code ec;
  const std::filesystem::path data =
      std::filesystem::absolute(flags.data_dir, ec);
  ATTNAUDIT_LOG(info, "data dir")
      .Kv("path", data.string())
      .Kv("spool", (data / "spool").string())
      .Kv("store", flags.store == "sqlite" ? (data / "results.db").string()
                                           : RedactStoreUrl(flags.store));
}

// Waits for SIGTERM/SIGINT (re-reading the token file on each SIGHUP),
// then runs the drain; a second signal during the drain exits at once.
void ServeUntilSignalled(const sigset_t& stop_signals, const ServerFlags& flags,
                         std::unique_ptr<AuditServer> server) {
  sigset_t waited = stop_signals;
  sigaddset(&waited, SIGHUP);
  int signal_number = 0;
  while (sigwait(&waited, &signal_number) == 0 && signal_number == SIGHUP) {
    absl::Status s = server->ReloadCredentials();
    if (s.ok()) {
      ATTNAUDIT_LOG(info, "token file reloaded")
          .Kv("principals", static_cast<int64_t>(server->principals()));
    } else {
      ATTNAUDIT_LOG(err, "token file reload failed; previous tenants stay")
          .Kv("status", s);
    }
  }
  ATTNAUDIT_LOG(info, "signal received; draining")
      .Kv("signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT")
      .Kv("drain_timeout_s", absl::ToDoubleSeconds(flags.drain_timeout));
  std::thread([stop_signals] {
    int again = 0;
    sigwait(&stop_signals, &again);
    ATTNAUDIT_LOG(warn, "second signal; exiting without finishing the drain");
    std::_Exit(1);
  }).detach();
  const absl::Time begin = absl::Now();
  server->Shutdown();
  server.reset();
  ATTNAUDIT_LOG(info, "attnaudit-server stopped")
      .Kv("shutdown_s", absl::ToDoubleSeconds(absl::Now() - begin));
}

int UsageError(const absl::Status& status) {
  std::fprintf(stderr, "attnaudit-server: %s\n",
               std::string(status.message()).c_str());
  return kExitUsage;
}

int Main(const std::vector<std::string>& args) {
  absl::StatusOr<ServerFlags> flags = ParseServerFlags(args);
  if (!flags.ok()) return UsageError(flags.status());
  if (flags->help) {
    std::fputs(ServerHelpText().c_str(), stdout);
    return 0;
  }
  absl::StatusOr<spdlog::level::level_enum> level =
      ParseLogLevel(flags->log_level);
  if (!level.ok()) return UsageError(level.status());
  ConfigureLogging(*level);
  const sigset_t stop_signals = PrepareProcess();
  RouteProtobufLogs();
  WarnAboutExposure(*flags);

  ATTNAUDIT_LOG(info, "attnaudit-server starting")
      .Kv("version", ServerVersion())
      .Kv("pid", static_cast<int64_t>(getpid()));
  absl::StatusOr<std::unique_ptr<AuditServer>> server =
      AuditServer::Start(ToOptions(*flags));
  if (!server.ok()) {
    ATTNAUDIT_LOG(err, "start-up failed").Kv("status", server.status());
    return 1;
  }
  LogEndpoints(*flags, **server);
  ServeUntilSignalled(stop_signals, *flags, *std::move(server));
  return 0;
}

}  // namespace
}  // namespace attnaudit::server

int main(int argc, char** argv) {
  return attnaudit::server::Main(
      std::vector<std::string>(argv + 1, argv + argc));
}
