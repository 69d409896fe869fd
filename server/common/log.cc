#include "server/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnaudit::log {
namespace {

std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
std::mutex g_mu;
Sink g_sink = nullptr;
void* g_sink_arg = nullptr;

bool NeedsQuotes(absl::string_view v) {
  if (v.empty()) return true;
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' ||
        static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return true;
    }
  }
  return false;
}

void WriteAll(absl::string_view s) {
  const char* p = s.data();
  size_t left = s.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // stderr is gone; logging must never take the server down
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

void SetLevel(Level level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}
Level GetLevel() {
  return static_cast<Level>(g_level.load(std::memory_order_relaxed));
}
bool Enabled(Level level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

absl::StatusOr<Level> ParseLevel(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  if (n == "debug") return Level::kDebug;
  if (n == "info") return Level::kInfo;
  if (n == "warn" || n == "warning") return Level::kWarn;
  if (n == "error") return Level::kError;
  return absl::InvalidArgumentError(absl::StrCat(
      "--log-level: '", name, "' is not one of debug, info, warn, error"));
}

absl::string_view LevelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

void SetSink(Sink sink, void* arg) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_sink = sink;
  g_sink_arg = arg;
}

void AppendValue(absl::string_view value, std::string* out) {
  if (!NeedsQuotes(value)) {
    out->append(value.data(), value.size());
    return;
  }
  out->push_back('"');
  for (char c : value) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (c == '\n') {
      out->append("\\n");
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out->push_back('?');
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

Line::Line(Level level, absl::string_view msg) {
  buf_.reserve(160);
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const int64_t millis = std::chrono::duration_cast<std::chrono::milliseconds>(
                             now.time_since_epoch())
                             .count() %
                         1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  absl::StrAppendFormat(&buf_, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                        tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                        tm.tm_hour, tm.tm_min, tm.tm_sec,
                        static_cast<int>(millis));
  absl::StrAppend(&buf_, " level=", LevelName(level), " msg=");
  AppendValue(msg, &buf_);
}

Line::~Line() {
  buf_.push_back('\n');
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_sink != nullptr) {
    g_sink(buf_, g_sink_arg);
  } else {
    WriteAll(buf_);
  }
}

Line& Line::Kv(absl::string_view key, absl::string_view value) {
  buf_.push_back(' ');
  buf_.append(key.data(), key.size());
  buf_.push_back('=');
  AppendValue(value, &buf_);
  return *this;
}

Line& Line::Kv(absl::string_view key, int64_t value) {
  absl::StrAppend(&buf_, " ", key, "=", value);
  return *this;
}

Line& Line::Kv(absl::string_view key, uint64_t value) {
  absl::StrAppend(&buf_, " ", key, "=", value);
  return *this;
}

Line& Line::Kv(absl::string_view key, double value) {
  absl::StrAppendFormat(&buf_, " %s=%.6g", key, value);
  return *this;
}

Line& Line::Kv(absl::string_view key, bool value) {
  absl::StrAppend(&buf_, " ", key, "=", value ? "true" : "false");
  return *this;
}

Line& Line::Kv(absl::string_view key, const absl::Status& status) {
  absl::StrAppend(&buf_, " ", key, "=",
                  absl::StatusCodeToString(status.code()));
  if (!status.ok()) {
    buf_.append(" error=");
    AppendValue(status.message(), &buf_);
  }
  return *this;
}

}  // namespace attnaudit::log
