// Per-call structured logging and the unary reactor every unary RPC of the
// service uses: Done(status) finishes the call exactly once, OnDone writes
// one debug line (method, peer, job id, bytes, code, duration) and deletes
// the reactor. The line never includes request contents or metadata values
// (tokens stay out of logs). Thread-safe: Done may be called from any
// thread (e.g. a scheduler worker).
#ifndef ATTNAUDIT_SERVER_RPC_LOGGED_REACTOR_H_
#define ATTNAUDIT_SERVER_RPC_LOGGED_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace attnaudit::server {

class CallLog {
 public:
  CallLog(const char* method, const grpc::CallbackServerContext* context);
  void set_job_id(std::string id) { job_id_ = std::move(id); }
  void set_bytes(int64_t bytes) { bytes_ = bytes; }
  void set_status(const grpc::Status& status) {
    code_ = status.error_code();
    message_ = status.error_message();
  }
  // Writes the line at debug level (one atomic load when debug is off).
  void Emit() const;

 private:
  const char* method_;
  std::string peer_;  // captured only when debug logging is on
  absl::Time start_;
  std::string job_id_;
  int64_t bytes_ = -1;
  grpc::StatusCode code_ = grpc::StatusCode::OK;
  std::string message_;
};

class LoggedUnaryReactor : public grpc::ServerUnaryReactor {
 public:
  LoggedUnaryReactor(const char* method,
                     const grpc::CallbackServerContext* context)
      : log_(method, context) {}

  // Finishes the call; later calls are ignored.
  void Done(const grpc::Status& status) {
    if (finished_.exchange(true)) return;
    log_.set_status(status);
    Finish(status);
  }
  void OnDone() override {
    log_.Emit();
    delete this;
  }
  CallLog& log() { return log_; }

 private:
  CallLog log_;
  std::atomic<bool> finished_{false};
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_LOGGED_REACTOR_H_
