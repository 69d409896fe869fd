// The scheduler tests' fixtures, shared by the scheduler, metrics and RPC
// admission tests: a device whose runs block until the test releases them
// (or the job is cancelled), a recorder of outcomes, and builders of jobs,
// admission queries and schedulers. Synchronisation is by mutex
// conditions, never by sleeping.
#ifndef ATTNAUDIT_TESTS_UNIT_SERVER_SCHEDULER_TEST_DEVICES_H_
#define ATTNAUDIT_TESTS_UNIT_SERVER_SCHEDULER_TEST_DEVICES_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/scheduler/device.h"
#include "server/scheduler/job.h"
#include "server/scheduler/scheduler.h"

namespace attnaudit::testing {

inline constexpr server::PriorityClass kI = server::PriorityClass::kInteractive;
inline constexpr server::PriorityClass kS = server::PriorityClass::kSampled;

// Shared by all GateDevices of a test: which jobs started (in order) and
// how many runs may finish.
class Gate {
 public:
  // Lets `n` more runs return (in any order they are waiting).
  void Release(int n) {
    absl::MutexLock lock(&mu_);
    tokens_ += n;
  }
  // Every run, now and later, returns at once.
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // Blocks until `n` runs have started.
  void WaitStarted(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() {
      mu_.AssertReaderHeld();
      return static_cast<int>(started_.size()) >= n;
    };
    mu_.Await(absl::Condition(&reached));
  }
  std::vector<std::string> started() {
    absl::MutexLock lock(&mu_);
    return started_;
  }

  // Called by GateDevice::Run. Model label = job marker.
  absl::Status Pass(const std::string& marker,
                    const std::atomic<bool>* cancelled) {
    absl::MutexLock lock(&mu_);
    started_.push_back(marker);
    // Cancellation is an atomic that nobody signals through mu_, so poll it
    // the way a real device polls between work items.
    while (!open_ && tokens_ == 0) {
      if (cancelled != nullptr && cancelled->load()) {
        return absl::CancelledError("device saw the cancel flag");
      }
      auto released = [this]() {
        mu_.AssertReaderHeld();
        return open_ || tokens_ > 0;
      };
      mu_.AwaitWithTimeout(absl::Condition(&released), absl::Milliseconds(1));
    }
    if (!open_) --tokens_;
    return absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> started_;
  int tokens_ = 0;
  bool open_ = false;
};

class GateDevice : public server::Device {
 public:
  GateDevice(std::string name, std::string kind, Gate* gate)
      : name_(std::move(name)), kind_(std::move(kind)), gate_(gate) {}
  std::string kind() const override { return kind_; }
  std::string name() const override { return name_; }
  absl::StatusOr<AuditReport> Run(const Snapshot& snapshot,
                                  const AuditOptions& options) override {
    absl::Status s = gate_->Pass(snapshot.labels.model, options.cancelled);
    if (!s.ok()) return s;
    AuditReport report;
    report.verdict = Verdict::kPass;
    report.labels = snapshot.labels;
    return report;
  }
  // What Describe reports as the memory one job may use (a GPU's pool).
  void set_job_memory_bytes(int64_t bytes) { job_memory_bytes_ = bytes; }
  server::DeviceDescription Describe() const override {
    server::DeviceDescription d = server::Device::Describe();
    d.job_memory_bytes = job_memory_bytes_;
    return d;
  }

 private:
  std::string name_;
  std::string kind_;
  Gate* gate_;
  int64_t job_memory_bytes_ = 0;
};

// A device that supports gangs and reports the gang size in the report's
// labels.layer.
class GangDevice : public GateDevice {
 public:
  using GateDevice::GateDevice;
  absl::StatusOr<AuditReport> RunGang(absl::Span<server::Device* const> gang,
                                      const Snapshot& snapshot,
                                      const AuditOptions& options) override {
    absl::StatusOr<AuditReport> r = Run(snapshot, options);
    if (r.ok()) r->labels.layer = static_cast<int64_t>(gang.size());
    return r;
  }
};

// A GangDevice that can fail for good, as a GPU does when a sticky error
// destroys its CUDA context: FailNextRun makes its next run return
// `run_error` (unless OK) and its Health() report `health_after` (unless
// OK) from then on; SetHealth fails it at once, without a run (a gang
// member that is not the leader).
class BreakableDevice : public GangDevice {
 public:
  using GangDevice::GangDevice;
  void FailNextRun(absl::Status run_error, absl::Status health_after) {
    absl::MutexLock lock(&mu_);
    run_error_ = std::move(run_error);
    health_after_ = std::move(health_after);
    armed_ = true;
  }
  void SetHealth(absl::Status health) {
    absl::MutexLock lock(&mu_);
    health_ = std::move(health);
  }
  absl::StatusOr<AuditReport> Run(const Snapshot& snapshot,
                                  const AuditOptions& options) override {
    absl::StatusOr<AuditReport> r = GangDevice::Run(snapshot, options);
    absl::MutexLock lock(&mu_);
    if (!armed_) return r;
    armed_ = false;
    if (!health_after_.ok()) health_ = health_after_;
    if (!run_error_.ok()) return run_error_;
    return r;
  }
  absl::Status Health() const override {
    absl::MutexLock lock(&mu_);
    return health_;
  }

 private:
  mutable absl::Mutex mu_;
  bool armed_ = false;
  absl::Status run_error_;
  absl::Status health_after_;
  absl::Status health_;
};

inline std::vector<std::unique_ptr<server::Device>> GateDevices(
    int n, Gate* gate, std::string kind = "cpu") {
  std::vector<std::unique_ptr<server::Device>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<GateDevice>(kind + ":" + std::to_string(i),
                                               kind, gate));
  }
  return out;
}

// Collects outcomes by job id.
class Recorder {
 public:
  std::function<void(const server::JobOutcome&)> Callback() {
    return [this](const server::JobOutcome& o) {
      absl::MutexLock lock(&mu_);
      ++calls_[o.job_id];
      outcomes_[o.job_id] = o;
      order_.push_back(o.job_id);
    };
  }
  server::JobOutcome Wait(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto done = [this, &id]() {
      mu_.AssertReaderHeld();
      return outcomes_.contains(id);
    };
    mu_.Await(absl::Condition(&done));
    return outcomes_[id];
  }
  bool Has(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return outcomes_.contains(id);
  }
  int Calls(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(id);
    return it == calls_.end() ? 0 : it->second;
  }
  std::vector<std::string> order() {
    absl::MutexLock lock(&mu_);
    return order_;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, server::JobOutcome> outcomes_;
  absl::flat_hash_map<std::string, int> calls_;
  std::vector<std::string> order_;
};

inline std::unique_ptr<server::Job> MakeJob(const std::string& id,
                                            server::PriorityClass c,
                                            Recorder* recorder,
                                            int64_t bytes = 0) {
  auto job = std::make_unique<server::Job>();
  job->id = id;
  job->priority = c;
  job->bytes = bytes;
  job->snapshot.labels.model = id;  // the marker GateDevice records
  job->labels.model = "m";
  if (recorder != nullptr) job->on_done = recorder->Callback();
  return job;
}

// MakeJob owned by `tenant` with `quota`.
inline std::unique_ptr<server::Job> TenantJob(const std::string& id,
                                              server::PriorityClass c,
                                              Recorder* recorder,
                                              const std::string& tenant,
                                              int64_t bytes = 0,
                                              server::TenantQuota quota = {}) {
  auto job = MakeJob(id, c, recorder, bytes);
  job->tenant = tenant;
  job->quota = quota;
  return job;
}

// An admission query for `bytes` of class `c` (no tenant, no deadline).
inline server::AdmissionQuery Query(server::PriorityClass c, int64_t bytes) {
  server::AdmissionQuery q;
  q.priority = c;
  q.bytes = bytes;
  return q;
}

// Scheduler options with `n` GateDevices of `kind` at `gate` (n = 1: the
// pool most tests use, so the test decides what runs when).
inline server::SchedulerOptions GatedOptions(Gate* gate, int n = 1,
                                             std::string kind = "cpu") {
  server::SchedulerOptions o;
  o.devices = GateDevices(n, gate, std::move(kind));
  return o;
}

// A scheduler from `options`; a Create failure fails the test (and the
// null result then fails it again where it is used).
inline std::unique_ptr<server::Scheduler> MakeScheduler(
    server::SchedulerOptions options) {
  auto s = server::Scheduler::Create(std::move(options));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

}  // namespace attnaudit::testing

#endif  // ATTNAUDIT_TESTS_UNIT_SERVER_SCHEDULER_TEST_DEVICES_H_
