// Helpers of the integration tests: an in-process AuditServer on
// 127.0.0.1 with a kernel-picked port and a temporary data dir, a client
// connected to it, small synthetic snapshots, a device whose runs wait at a
// gate the test opens (to hold the pool busy deterministically), and raw
// calls to grpc.health.v1 and reflection through gRPC's generic stub (their
// generated stubs are not installed on Debian).
//
// Every wait has a deadline; state is polled (WaitFor) or awaited on a
// mutex condition, never assumed after a fixed sleep.
#ifndef ATTNAUDIT_TESTS_INTEGRATION_TEST_SERVER_H_
#define ATTNAUDIT_TESTS_INTEGRATION_TEST_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnaudit/v1/service.grpc.pb.h"
#include "client/lib/client.h"
#include "core/snapshot/snapshot.h"
#include "server/app/audit_server.h"
#include "server/scheduler/device.h"
#include "sim/simulator.h"

namespace attnaudit::testing {

// Bound of every wait in these tests.
inline constexpr absl::Duration kWait = absl::Seconds(30);

// A llama3-8b-shaped decode snapshot with 64 tokens of context and a
// 16-entry vocabulary (~280 KiB). labels.step = `tag` identifies the job
// in GateState::started().
Snapshot SmallSnapshot(int64_t tag, Fault fault = Fault::kNone,
                       int64_t context = 64);

// A fresh directory under $TEST_TMPDIR or /tmp, removed when the test
// program exits.
std::string MakeTempDir(const std::string& name);
int CountFiles(const std::string& dir, const std::string& suffix);

// Shared by GateDevices: the order in which jobs reached a device (by
// labels.step) and whether runs may proceed.
class GateState {
 public:
  void Open();
  bool WaitStarted(size_t n, absl::Duration timeout = kWait);
  std::vector<int64_t> started();
  int cancelled_runs();

  // GateDevice::Run: records, then waits for Open or the job's cancel flag.
  absl::Status Pass(int64_t tag, const std::atomic<bool>* cancelled);

 private:
  absl::Mutex mu_;
  bool open_ = false;
  std::vector<int64_t> started_;
  int cancelled_runs_ = 0;
};

// A CPU device that waits at the gate, then runs the real audit.
class GateDevice : public server::Device {
 public:
  GateDevice(std::shared_ptr<GateState> gate, int index)
      : gate_(std::move(gate)), name_("gate:" + std::to_string(index)) {}
  std::string kind() const override { return "cpu"; }
  std::string name() const override { return name_; }
  absl::StatusOr<AuditReport> Run(const Snapshot& snapshot,
                                  const AuditOptions& options) override;

 private:
  std::shared_ptr<GateState> gate_;
  std::string name_;
};

// Loopback-only defaults: 127.0.0.1:0, no metrics endpoint, no fsync, one
// single-threaded CPU worker, short drain.
server::AuditServerOptions TestOptions(const std::string& data_dir);

struct TestServer {
  std::unique_ptr<server::AuditServer> server;
  std::unique_ptr<client::Client> client;
  std::shared_ptr<grpc::Channel> channel;  // for raw stubs
  std::unique_ptr<v1::AuditService::Stub> stub;
  std::string data_dir;
  std::string address;
};

// Starts a server (failing the test on error) and connects a client with
// `client_options` (address filled in).
std::unique_ptr<TestServer> StartServer(
    server::AuditServerOptions options,
    client::ClientOptions client_options = {});

// grpc.health.v1.Health/Check through the generic stub: the reported
// serving status (1 SERVING, 2 NOT_SERVING), or -1 with *status set when
// the call failed.
int HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                const std::string& service, grpc::Status* status);

// A unary call of `method` ("/attnaudit.v1.AuditService/GetResult") with
// raw request bytes, through gRPC's generic stub (bytes no generated stub
// would send); *response gets the raw response bytes.
grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& method, const std::string& request,
                          std::string* response = nullptr,
                          const std::string& bearer_token = "");

// grpc.reflection.v1alpha list_services: the raw response bytes.
std::string ReflectionListServices(
    const std::shared_ptr<grpc::Channel>& channel, grpc::Status* status);

// A client of `address` that sends bearer `token` (none when empty), with
// kWait as its call timeout; null (and a test failure) when it cannot.
std::unique_ptr<client::Client> ConnectAs(const std::string& address,
                                          const std::string& token);

// WatchResults on a thread of its own until `count` results arrived, the
// server ended the watch, or kWait passed. Join before reading status().
class WatchThread {
 public:
  WatchThread(client::Client* client, int count);
  ~WatchThread() { Join(); }
  void Join();
  // The results received so far, in order.
  std::vector<v1::JobResult> results();
  // The watch's status (client::Client::Watch); OK while it runs.
  absl::Status status();

 private:
  absl::Mutex mu_;
  std::vector<v1::JobResult> results_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Waits until `predicate` holds (polling every millisecond); false on
// timeout.
bool WaitFor(const std::function<bool()>& predicate,
             absl::Duration timeout = kWait);

// Polls GetResult until the job is DONE, FAILED or CANCELLED (or kWait
// passes); returns the last result seen.
v1::JobResult WaitFinished(client::Client* client, const std::string& id);

}  // namespace attnaudit::testing

#endif  // ATTNAUDIT_TESTS_INTEGRATION_TEST_SERVER_H_
