// Structured, level-filtered logging for the server: one line per event on
// stderr, "key=value" pairs after a timestamp, the level and a message:
//
//   2024-05-01T12:00:00.123Z level=info msg="grpc listening"
//   addr=localhost:50051
//
//   ATTNAUDIT_LOG(kInfo, "grpc listening").Kv("addr", addr);
//   ATTNAUDIT_LOG(kDebug, "rpc").Kv("method", "Audit").Kv("ms", 12.5);
//
// The macro evaluates nothing (not even the Kv arguments) when the level is
// filtered out, so debug lines on the request path cost one atomic load when
// disabled. A line is formatted into its own buffer and written with a
// single write under a mutex, so concurrent lines never interleave.
// Thread-safe. Values are quoted (with \" and \\ escaped, control characters
// replaced) when they contain spaces, quotes, '=' or are empty.
//
// Never log secrets: tokens, keys and snapshot contents stay out of logs by
// convention; the server logs only file paths and sizes for TLS material.
#ifndef ATTNAUDIT_SERVER_COMMON_LOG_H_
#define ATTNAUDIT_SERVER_COMMON_LOG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnaudit::log {

enum class Level : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Process-wide minimum level (default kInfo).
void SetLevel(Level level);
Level GetLevel();
bool Enabled(Level level);

// "debug", "info", "warn"/"warning", "error" (case-insensitive);
// InvalidArgument naming "--log-level" otherwise.
absl::StatusOr<Level> ParseLevel(absl::string_view name);
absl::string_view LevelName(Level level);

// Where lines go; stderr by default. Tests may capture with a sink that is
// called under the logging mutex (it must not log itself).
using Sink = void (*)(absl::string_view line, void* arg);
void SetSink(Sink sink, void* arg);  // nullptr restores stderr

// One log line, written when it goes out of scope.
class Line {
 public:
  Line(Level level, absl::string_view msg);
  ~Line();
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;

  Line& Kv(absl::string_view key, absl::string_view value);
  Line& Kv(absl::string_view key, const std::string& value) {
    return Kv(key, absl::string_view(value));
  }
  Line& Kv(absl::string_view key, const char* value) {
    return Kv(key, absl::string_view(value ? value : ""));
  }
  Line& Kv(absl::string_view key, int64_t value);
  Line& Kv(absl::string_view key, int value) {
    return Kv(key, static_cast<int64_t>(value));
  }
  Line& Kv(absl::string_view key, uint64_t value);
  Line& Kv(absl::string_view key, double value);
  Line& Kv(absl::string_view key, bool value);
  // "code=INVALID_ARGUMENT err=\"...\"" (nothing for OK beyond code=OK).
  Line& Kv(absl::string_view key, const absl::Status& status);

 private:
  std::string buf_;
};

// Appends `value` to `out`, quoted and escaped when needed (exposed for
// tests).
void AppendValue(absl::string_view value, std::string* out);

}  // namespace attnaudit::log

// The `else` binds the temporary to the statement, so the line is written at
// the end of the full expression.
#define ATTNAUDIT_LOG(level, msg)                                   \
  if (!::attnaudit::log::Enabled(::attnaudit::log::Level::level)) { \
  } else                                                            \
    ::attnaudit::log::Line(::attnaudit::log::Level::level, (msg))

#endif  // ATTNAUDIT_SERVER_COMMON_LOG_H_
