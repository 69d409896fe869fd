// The real attnaudit-server as a child process, for the load and chaos
// tests: started with flags on 127.0.0.1 with kernel-picked ports (read
// from its start-up log lines), its memory read from /proc, stopped with
// any signal. The binary comes from $ATTNAUDIT_SERVER_BIN (ctest sets it).
//
// Every wait is bounded. Not thread-safe (one test thread drives it).
#ifndef ATTNAUDIT_TESTS_LOAD_SERVER_PROCESS_H_
#define ATTNAUDIT_TESTS_LOAD_SERVER_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnaudit::testing {

class ServerProcess {
 public:
  // Starts the server with `flags` (--listen and --metrics-listen are
  // added: 127.0.0.1:0) and waits until it logged both ports. Its stderr
  // goes to `log_path`.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      std::vector<std::string> flags, const std::string& log_path,
      absl::Duration timeout = absl::Seconds(30));
  ~ServerProcess();  // SIGKILL if still running

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const;
  pid_t pid() const { return pid_; }

  // Resident and peak resident memory (VmRSS, VmHWM), bytes; -1 when gone.
  int64_t RssBytes() const;
  int64_t PeakRssBytes() const;

  // Sends `signal`; Wait reaps the process and returns its exit status
  // (128 + signal when killed), -1 on timeout.
  void Signal(int signal);
  int Wait(absl::Duration timeout = absl::Seconds(60));

  // GET /metrics over plain HTTP (the test starts it without TLS), with a
  // bearer token when one is given. The body, or the whole response when
  // `with_head`.
  absl::StatusOr<std::string> Scrape(const std::string& token = "",
                                     bool with_head = false) const;

  std::string Log() const;

 private:
  ServerProcess() = default;
  int64_t StatusField(const char* field) const;

  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string log_path_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
};

// The value of a metric line `name{labels} value` in a scrape (0 if
// absent); `labels` is the exact label text, e.g. `reason="queue_full"`.
double MetricValue(const std::string& scrape, const std::string& name,
                   const std::string& labels = "");

}  // namespace attnaudit::testing

#endif  // ATTNAUDIT_TESTS_LOAD_SERVER_PROCESS_H_
