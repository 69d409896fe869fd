#include "server/log/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace attnaudit::server {
namespace {

// spdlog spells the warning level "warning"; our format keeps the short
// names the --log-level flag takes (level=warn).
absl::string_view ShortLevelName(spdlog::level::level_enum level) {
  if (level == spdlog::level::warn) return "warn";
  const spdlog::string_view_t name = spdlog::level::to_string_view(level);
  return absl::string_view(name.data(), name.size());
}

// The %* flag of the pattern: the level as ShortLevelName spells it.
class LevelFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const absl::string_view name = ShortLevelName(msg.level);
    dest.append(name.data(), name.data() + name.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<LevelFlag>();
  }
};

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

}  // namespace

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(
    absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  // from_str knows every spdlog name ("warning", "warn", "error", "err")
  // and answers `off` for anything else; the flag offers four levels.
  const spdlog::level::level_enum level = spdlog::level::from_str(lower);
  if (level == spdlog::level::debug || level == spdlog::level::info ||
      level == spdlog::level::warn || level == spdlog::level::err) {
    return level;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--log-level: '", name, "' is not one of debug, info, warn, error"));
}

void ConfigureLogging(spdlog::level::level_enum level, spdlog::sink_ptr sink) {
  if (sink == nullptr) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto formatter = std::make_unique<spdlog::pattern_formatter>(
      spdlog::pattern_time_type::utc);
  formatter->add_flag<LevelFlag>('*').set_pattern(
      "%Y-%m-%dT%H:%M:%S.%eZ level=%* msg=%v");
  sink->set_formatter(std::move(formatter));
  auto logger = std::make_shared<spdlog::logger>("attnaudit", std::move(sink));
  logger->set_level(level);
  // Lines are rare except at debug level; write each at once so a crash
  // loses none.
  logger->flush_on(spdlog::level::trace);
  // Another thread may be inside a call through the previous logger
  // (spdlog::default_logger_raw() holds no reference): keep every replaced
  // logger alive. Reconfiguring is rare (start-up; tests).
  static absl::Mutex retired_mu(absl::kConstInit);
  static auto* retired = new std::vector<std::shared_ptr<spdlog::logger>>();
  absl::MutexLock lock(&retired_mu);
  retired->push_back(spdlog::default_logger());
  spdlog::set_default_logger(std::move(logger));
}

void AppendLogValue(absl::string_view value, std::string* out) {
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

LogLine::LogLine(spdlog::level::level_enum level, absl::string_view msg)
    : level_(level) {
  buf_.reserve(160);
  AppendLogValue(msg, &buf_);
}

LogLine::~LogLine() {
  spdlog::default_logger_raw()->log(
      level_, spdlog::string_view_t(buf_.data(), buf_.size()));
}

LogLine& LogLine::Kv(absl::string_view key, absl::string_view value) {
  buf_.push_back(' ');
  buf_.append(key.data(), key.size());
  buf_.push_back('=');
  AppendLogValue(value, &buf_);
  return *this;
}

LogLine& LogLine::Kv(absl::string_view key, int64_t value) {
  absl::StrAppend(&buf_, " ", key, "=", value);
  return *this;
}

LogLine& LogLine::Kv(absl::string_view key, uint64_t value) {
  absl::StrAppend(&buf_, " ", key, "=", value);
  return *this;
}

LogLine& LogLine::Kv(absl::string_view key, double value) {
  absl::StrAppendFormat(&buf_, " %s=%.6g", key, value);
  return *this;
}

LogLine& LogLine::Kv(absl::string_view key, bool value) {
  absl::StrAppend(&buf_, " ", key, "=", value ? "true" : "false");
  return *this;
}

LogLine& LogLine::Kv(absl::string_view key, const absl::Status& status) {
  absl::StrAppend(&buf_, " ", key, "=",
                  absl::StatusCodeToString(status.code()));
  if (!status.ok()) {
    buf_.append(" error=");
    AppendLogValue(status.message(), &buf_);
  }
  return *this;
}

}  // namespace attnaudit::server
