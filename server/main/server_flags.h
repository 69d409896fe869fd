// Command-line flags of attnaudit-server, defined with absl/flags
// (server_flags.cc): each flag's type, default and help text live in its
// ABSL_FLAG, and --help is generated from those definitions.
//
// Spelling: the documented flags use dashes (--max-message-bytes), as the
// CLI's do; absl flag names cannot hold a dash, so a flag's dashes are read
// as underscores (--max_message_bytes is the same flag) and --help prints
// the dashed form. `--flag VALUE` and `--flag=VALUE` both work. Unknown
// flags, malformed values and values out of range are InvalidArgument
// naming the flag. Not thread-safe (parse once at startup).
//
// Value syntax: sizes accept an integer with an optional binary suffix
// (K/KiB, M/MiB, G/GiB: 256MiB); durations accept absl's syntax (30s, 5m,
// 1h30m) plus a whole-day form (7d); 0 turns off a duration where the help
// says so.
#ifndef ATTNAUDIT_SERVER_MAIN_SERVER_FLAGS_H_
#define ATTNAUDIT_SERVER_MAIN_SERVER_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attnaudit::server {

// The parsed flags (server/main/main.cc turns them into AuditServerOptions).
struct ServerFlags {
  // Endpoints and storage.
  std::string listen;
  std::string metrics_listen;
  std::string data_dir;
  std::string store;       // "sqlite" or a postgresql:// URL
  std::string replica_id;  // "": the host name
  bool store_audit_results = true;
  int64_t result_journal_bytes = 0;
  absl::Duration fleet_lease = absl::Seconds(15);

  // Execution. 0 means "derived from the machine" (see --help).
  int64_t cpu_workers = 0;
  int64_t threads_per_job = 0;
  // "cpu", "all" or "cuda:0,cuda:1" (server/device_pool/device_selection.h
  // parses it; ParseServerFlags has checked it does).
  std::string devices;
  int64_t gpu_memory_pool_bytes = 0;  // per GPU worker; 0: 3/4 of free

  // Admission control.
  int64_t max_message_bytes = 0;
  int64_t queue_interactive = 0;
  int64_t queue_sampled = 0;
  int64_t memory_budget_bytes = 0;
  double interactive_reserve = 0;
  absl::Duration sampled_promote_after;  // 0: never
  double gang_backfill_runs = 0;
  bool cp_ring_gang_always = false;
  double upload_tenant_share = 0;
  absl::Duration upload_idle_timeout;
  int64_t upload_min_rate = 0;
  int64_t tenant_max_jobs = 0;
  int64_t tenant_max_bytes = 0;

  // Result store retention.
  absl::Duration retention_age;
  int64_t retention_count = 0;

  // Lifecycle.
  absl::Duration drain_delay;
  absl::Duration drain_timeout;
  std::string log_level;

  // Security. Empty paths mean "off".
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string auth_token_file;
  std::string metrics_tls_cert;
  std::string metrics_tls_key;
  std::string metrics_token_file;

  // Connections (Kubernetes: a finite connection age rebalances clients
  // behind an L4 Service).
  absl::Duration keepalive_time;
  absl::Duration keepalive_timeout;
  absl::Duration keepalive_min_ping_interval;
  absl::Duration max_connection_age;
  absl::Duration max_connection_age_grace;
  absl::Duration max_connection_idle;
  // While idle, how often gRPC's callback threads get an event
  // (server/rpc/callback_queue_waker.h). 0: never.
  absl::Duration callback_wake_period;
  int64_t max_concurrent_streams = 0;
  // Snapshots named as sealed memfds by clients on this machine.
  bool accept_memfd_snapshots = false;

  // Metrics: distinct label values kept before "other" is reported.
  int64_t metrics_max_models = 0;
  int64_t metrics_max_layers = 0;

  bool help = false;  // --help was given; print ServerHelpText() and exit 0
};

// Parses argv (without the program name), starting from every flag's
// default, so the result depends on `argv` alone. Checks ranges: positive
// queue sizes, 4 KiB <= max-message-bytes <= 2 GiB - 1 (gRPC's int limit;
// never unlimited), 0 <= interactive-reserve < 1, TLS cert and key
// together (also for /metrics), a client CA only with TLS.
absl::StatusOr<ServerFlags> ParseServerFlags(
    const std::vector<std::string>& argv);

// The --help text: usage and one entry per flag with its default.
std::string ServerHelpText();

// Flag value types with their own syntax (see the file comment). absl
// parses and prints them through these overloads.
struct ByteSize {
  int64_t bytes = 0;
};
struct FlagDuration {
  absl::Duration value;  // never negative or infinite
};
bool AbslParseFlag(absl::string_view text, ByteSize* out, std::string* error);
std::string AbslUnparseFlag(ByteSize size);  // 268435456 -> "256MiB"
bool AbslParseFlag(absl::string_view text, FlagDuration* out,
                   std::string* error);
std::string AbslUnparseFlag(FlagDuration d);  // 7 days -> "7d"

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_MAIN_SERVER_FLAGS_H_
