// Command-line flags of attnaudit-server. Spelled with dashes like the CLI's
// (--max-message-bytes); `--flag VALUE` and `--flag=VALUE` both work, and
// --help prints every flag with its default, generated from the same table
// the parser uses, so the two never disagree. Unknown flags and malformed
// values are InvalidArgument naming the flag. Not thread-safe (parse once at
// startup).
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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnaudit::server {

struct ServerFlags {
  // Endpoints and storage.
  std::string listen = "localhost:50051";
  std::string metrics_listen = "localhost:9464";
  std::string data_dir = "./var/attnaudit";

  // Execution. 0 means "derived from the machine" (see --help).
  int64_t cpu_workers = 0;
  int64_t threads_per_job = 0;

  // Admission control.
  int64_t max_message_bytes = int64_t{256} << 20;
  int64_t queue_interactive = 64;
  int64_t queue_sampled = 1024;
  int64_t memory_budget_bytes = int64_t{8} << 30;

  // Result store retention.
  absl::Duration retention_age = absl::Hours(24 * 7);
  int64_t retention_count = 100000;

  // Lifecycle.
  absl::Duration drain_delay = absl::ZeroDuration();
  absl::Duration drain_timeout = absl::Seconds(30);
  std::string log_level = "info";

  // Security. Empty paths mean "off".
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string auth_token_file;

  // Connections (Kubernetes: a finite connection age rebalances clients
  // behind an L4 Service).
  absl::Duration keepalive_time = absl::Minutes(2);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  absl::Duration keepalive_min_ping_interval = absl::Seconds(30);
  absl::Duration max_connection_age = absl::Minutes(30);
  absl::Duration max_connection_age_grace = absl::Minutes(5);
  absl::Duration max_connection_idle = absl::Minutes(15);

  // Metrics: distinct label values kept before "other" is reported.
  int64_t metrics_max_models = 4;
  int64_t metrics_max_layers = 16;

  bool help = false;  // --help was given; print HelpText() and exit 0
};

// Parses argv (without the program name). Checks ranges: positive queue
// sizes, 4 KiB <= max-message-bytes <= 2 GiB - 1 (gRPC's int limit; never
// unlimited), TLS cert and key together, a client CA only with TLS.
absl::StatusOr<ServerFlags> ParseServerFlags(
    const std::vector<std::string>& argv);

// The --help text: usage and one entry per flag with its default.
std::string ServerHelpText();

// Value parsers (exposed for tests). `flag` names the flag in errors.
absl::StatusOr<int64_t> ParseByteSize(const std::string& flag,
                                      const std::string& value);
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag,
                                                 const std::string& value);
std::string FormatByteSize(int64_t bytes);         // 268435456 -> "256MiB"
std::string FormatDurationFlag(absl::Duration d);  // 7 days -> "7d"

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_MAIN_SERVER_FLAGS_H_
