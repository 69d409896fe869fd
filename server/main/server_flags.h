// Command-line flags of attnaudit-server, defined with absl/flags in
// server_flags.cc, and the server configuration they build. Each flag is
// written once there: its type, default and help text (--help is generated
// from them) together with where its value goes in the configuration
// (AuditServerOptions, server/app/audit_server.h) and how it is converted
// (sizes to bytes, "0: never" durations, the --devices syntax, ...).
//
// Spelling: the documented flags use dashes (--max-message-bytes), as the
// CLI's do; absl flag names cannot hold a dash, so a flag's dashes are read
// as underscores (--max_message_bytes is the same flag) and --help prints
// the dashed form. `--flag VALUE` and `--flag=VALUE` both work. Unknown
// flags, malformed values and values out of range are InvalidArgument
// naming the flag.
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
#include "server/app/audit_server.h"

namespace attnaudit::server {

// The configuration of one attnaudit-server process, built once from its
// command line by ParseServerFlags. A plain value that its holder owns;
// main.cc hands `options` to AuditServer::Start.
struct ServerConfig {
  // Everything the server runs with: the flags' values, converted, and
  // AuditServerOptions' own defaults for what no flag sets.
  AuditServerOptions options;
  // --log-level, unparsed: it configures the process's logging, not the
  // server (main.cc applies it before anything logs).
  std::string log_level;
  bool help = false;     // --help: print ServerHelpText() and exit 0
  bool version = false;  // --version: print the version and exit 0
};

// Parses argv (without the program name), starting from every flag's
// default, so the result depends on `argv` alone. Checks ranges: positive
// queue sizes, 4 KiB <= max-message-bytes <= 2 GiB - 1 (gRPC's int limit;
// never unlimited), 0 <= interactive-reserve < 1, TLS cert and key
// together (also for /metrics), a client CA only with TLS. Errors are
// InvalidArgument, "--flag: why". Not thread-safe: it sets the process's
// absl flags (parse once, at start-up, or serially in tests).
absl::StatusOr<ServerConfig> ParseServerFlags(
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
