// attnaudit-server: the audit service. Flags: `attnaudit-server --help`
// (server_flags.h: they build the AuditServerOptions the server starts
// with); operations: docs/OPERATIONS.md.
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
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "server/app/audit_server.h"
#include "server/device_pool/device_selection.h"
#include "server/log/log.h"
#include "server/main/server_flags.h"
#include "server/store/job_store.h"

namespace attnaudit::server {
namespace {

constexpr int kExitUsage = 2;

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
void WarnAboutExposure(const AuditServerOptions& options) {
  if (!LoopbackOnly(options.listen) && options.auth_token_file.empty()) {
    ATTNAUDIT_LOG(warn,
                  "OPEN SERVER: gRPC listens beyond this machine with "
                  "authentication off: anyone who reaches this port can "
                  "submit audits, read every result and cancel jobs; set "
                  "--auth-token-file (and --tls-cert) outside a trusted "
                  "network")
        .Kv("listen", options.listen)
        .Kv("tls", options.tls.cert.empty() ? "off" : "on");
  }
  if (!options.metrics_listen.empty() &&
      !LoopbackOnly(options.metrics_listen) &&
      options.metrics_token_file.empty()) {
    ATTNAUDIT_LOG(warn,
                  "/metrics listens beyond this machine without a token: "
                  "anyone who reaches it reads model names and drift "
                  "figures; set --metrics-token-file (and --metrics-tls-cert)")
        .Kv("metrics_listen", options.metrics_listen);
  }
  if (!options.auth_token_file.empty() && options.tls.cert.empty()) {
    ATTNAUDIT_LOG(warn,
                  "bearer token auth without TLS: tokens cross the network "
                  "in plaintext; use --tls-cert outside a trusted network");
  }
  if (!options.metrics_token_file.empty() && options.metrics_tls_cert.empty()) {
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
  // "Memory after a burst"). Small allocations are served from per-thread
  // caches, so one arena costs no measurable contention here.
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
void LogEndpoints(const AuditServer& server) {
  const AuditServerOptions& o = server.options();
  ATTNAUDIT_LOG(info, "grpc listening")
      .Kv("addr", ListeningAddress(o.listen, server.port()))
      .Kv("tls", o.tls.cert.empty()
                     ? "off"
                     : (o.tls.client_ca.empty() ? "on" : "mutual"))
      .Kv("auth", o.auth_token_file.empty() ? "off" : "bearer")
      .Kv("max_message_bytes", o.max_message_bytes)
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
          .Kv("requested", DeviceSelectionText(o.device_selection))
          .Kv("using", kind)
          .Kv("workers", workers);
    } else {
      // e.g. --devices all on a machine without a GPU: say what runs.
      ATTNAUDIT_LOG(info, "devices")
          .Kv("requested", DeviceSelectionText(o.device_selection))
          .Kv("using", kind)
          .Kv("workers", workers)
          .Kv("note", server.devices_note());
    }
  }
  if (o.metrics_listen.empty()) {
    ATTNAUDIT_LOG(info, "metrics endpoint disabled");
  } else {
    ATTNAUDIT_LOG(info, "metrics listening")
        .Kv("addr",
            absl::StrCat(Host(o.metrics_listen), ":", server.metrics_port()))
        .Kv("path", "/metrics")
        .Kv("tls", o.metrics_tls_cert.empty() ? "off" : "on")
        .Kv("auth", o.metrics_token_file.empty() ? "off" : "bearer");
  }
  std::error_code ec;
  const std::filesystem::path data = std::filesystem::absolute(o.data_dir, ec);
  ATTNAUDIT_LOG(info, "data dir")
      .Kv("path", data.string())
      .Kv("spool", (data / "spool").string())
      .Kv("store", o.store_url == "sqlite" ? (data / "results.db").string()
                                           : RedactStoreUrl(o.store_url));
}

// Waits for SIGTERM/SIGINT (re-reading the token file on each SIGHUP),
// then runs the drain; a second signal during the drain exits at once.
void ServeUntilSignalled(const sigset_t& stop_signals,
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
      .Kv("drain_timeout_s",
          absl::ToDoubleSeconds(server->options().drain_timeout));
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
  absl::StatusOr<ServerConfig> config = ParseServerFlags(args);
  if (!config.ok()) return UsageError(config.status());
  if (config->help) {
    std::fputs(ServerHelpText().c_str(), stdout);
    return 0;
  }
  if (config->version) {
    std::printf("attnaudit-server %s\n", ATTNAUDIT_VERSION);
    return 0;
  }
  absl::StatusOr<spdlog::level::level_enum> level =
      ParseLogLevel(config->log_level);
  if (!level.ok()) return UsageError(level.status());
  ConfigureLogging(*level);
  const sigset_t stop_signals = PrepareProcess();
  RouteProtobufLogs();
  WarnAboutExposure(config->options);

  ATTNAUDIT_LOG(info, "attnaudit-server starting")
      .Kv("version", ServerVersion())
      .Kv("pid", static_cast<int64_t>(getpid()));
  absl::StatusOr<std::unique_ptr<AuditServer>> server =
      AuditServer::Start(std::move(config->options));
  if (!server.ok()) {
    ATTNAUDIT_LOG(err, "start-up failed").Kv("status", server.status());
    return 1;
  }
  LogEndpoints(**server);
  ServeUntilSignalled(stop_signals, *std::move(server));
  return 0;
}

}  // namespace
}  // namespace attnaudit::server

int main(int argc, char** argv) {
  return attnaudit::server::Main(
      std::vector<std::string>(argv + 1, argv + argc));
}
