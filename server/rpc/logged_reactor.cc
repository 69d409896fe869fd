#include "server/rpc/logged_reactor.h"

#include "absl/time/clock.h"
#include "server/log/log.h"

namespace attnaudit::server {

CallLog::CallLog(const char* method, const grpc::CallbackServerContext* context)
    : method_(method), start_(absl::Now()) {
  if (spdlog::should_log(spdlog::level::debug)) peer_ = context->peer();
}

void CallLog::Emit() const {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  LogLine line(spdlog::level::debug, "rpc");
  line.Kv("method", method_);
  line.Kv("peer", peer_);
  if (!job_id_.empty()) line.Kv("job_id", job_id_);
  if (bytes_ >= 0) line.Kv("bytes", bytes_);
  line.Kv("code", static_cast<int64_t>(code_));
  if (code_ != grpc::StatusCode::OK) line.Kv("error", message_);
  line.Kv("ms", absl::ToDoubleMilliseconds(absl::Now() - start_));
}

}  // namespace attnaudit::server
