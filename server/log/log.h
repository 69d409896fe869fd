// The server's log: spdlog's process-wide default logger, configured once at
// start-up, writing one line per event in a `key=value` format:
//
//   2024-05-01T12:00:00.123Z level=info msg="grpc listening"
//   addr=localhost:50051
//
//   ATTNAUDIT_LOG(info, "grpc listening").Kv("addr", addr);
//   ATTNAUDIT_LOG(debug, "rpc").Kv("method", "Audit").Kv("ms", 12.5);
//
// spdlog provides the levels, the sink (stderr; one write per line under its
// mutex, so concurrent lines never interleave), the UTC timestamp and the
// level filter. What is ours is the line format: the message and values are
// quoted (with \" and \\ escaped, control characters replaced) when they
// contain spaces, quotes, '=' or are empty, so a line stays machine-readable.
// `severity` is a spdlog level name: debug, info, warn or err.
//
// The macro evaluates nothing (not even the Kv arguments) when the level is
// filtered out, so debug lines on the request path cost one atomic load when
// disabled. Thread-safe.
//
// Never log secrets: tokens, keys and snapshot contents stay out of logs;
// the server logs only file paths and sizes for TLS material.
#ifndef ATTNAUDIT_SERVER_LOG_LOG_H_
#define ATTNAUDIT_SERVER_LOG_LOG_H_

#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnaudit::server {

// "debug", "info", "warn"/"warning", "error" (case-insensitive), through
// spdlog's own level names; InvalidArgument naming "--log-level" otherwise.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name);

// Makes the default spdlog logger write the format above to `sink` (stderr
// when null) at `level` and above. Safe while other threads log (the
// previous logger is kept alive); tests pass a sink that captures lines.
void ConfigureLogging(spdlog::level::level_enum level,
                      spdlog::sink_ptr sink = nullptr);

// One log line, handed to spdlog when it goes out of scope.
class LogLine {
 public:
  LogLine(spdlog::level::level_enum level, absl::string_view msg);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  LogLine& Kv(absl::string_view key, absl::string_view value);
  LogLine& Kv(absl::string_view key, const std::string& value) {
    return Kv(key, absl::string_view(value));
  }
  LogLine& Kv(absl::string_view key, const char* value) {
    return Kv(key, absl::string_view(value ? value : ""));
  }
  LogLine& Kv(absl::string_view key, int64_t value);
  LogLine& Kv(absl::string_view key, int value) {
    return Kv(key, static_cast<int64_t>(value));
  }
  LogLine& Kv(absl::string_view key, uint64_t value);
  LogLine& Kv(absl::string_view key, double value);
  LogLine& Kv(absl::string_view key, bool value);
  // "key=INVALID_ARGUMENT error=\"...\"" (just key=OK for OK).
  LogLine& Kv(absl::string_view key, const absl::Status& status);

 private:
  const spdlog::level::level_enum level_;
  std::string buf_;
};

// Appends `value` to `out`, quoted and escaped when needed (exposed for
// tests).
void AppendLogValue(absl::string_view value, std::string* out);

}  // namespace attnaudit::server

// The `else` binds the temporary to the statement, so the line is written at
// the end of the full expression.
#define ATTNAUDIT_LOG(severity, msg)                      \
  if (!::spdlog::should_log(::spdlog::level::severity)) { \
  } else                                                  \
    ::attnaudit::server::LogLine(::spdlog::level::severity, (msg))

#endif  // ATTNAUDIT_SERVER_LOG_LOG_H_
