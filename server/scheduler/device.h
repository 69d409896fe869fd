// Device: one execution slot of the scheduler's pool (a CPU worker, one
// GPU). The scheduler runs one worker thread per device and hands a device
// at most one job at a time, so an implementation need not be reentrant
// for Run; kind()/name() must be callable from any thread.
//
// Gang jobs (Job::gang_size = P > 1, e.g. a ring attention replay over P
// GPUs): the scheduler waits until P idle devices of the job's kind are
// free, marks them all busy, and calls RunGang on the leader (gang[0]) from
// the leader's worker thread; the other P-1 devices stay reserved (their
// workers idle) until RunGang returns. A CUDA device that supports ring
// jobs overrides RunGang; the default runs P == 1 jobs through Run and
// fails the rest with Unimplemented.
//
// Health: a failure that outlives its job (a GPU whose CUDA context a
// sticky error destroyed, a communicator that was aborted) is reported by
// Health(), which the scheduler asks after every run of the device. Once it
// is not OK the scheduler takes the device out of the pool for good (it is
// never given a job again; Devices(), metrics and GetCapabilities show it
// failed), and a job that failed on it runs once more on another device.
//
// Errors: a Run error becomes the job's outcome status. Run must poll
// options.cancelled (set by Cancel, the deadline timer and Drain) and
// return Cancelled promptly when it is set; the scheduler maps the final
// status (Cancelled, DeadlineExceeded or Unavailable) from why it was set.
#ifndef ATTNAUDIT_SERVER_SCHEDULER_DEVICE_H_
#define ATTNAUDIT_SERVER_SCHEDULER_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/audit/options.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit::server {

// What GetCapabilities shows of a device: fixed at start-up.
struct DeviceDescription {
  std::string name;          // "cpu:0", "cuda:1" (Device::name())
  std::string kind;          // "cpu", "cuda"
  std::string model;         // "CPU worker", "NVIDIA H200"
  int64_t memory_bytes = 0;  // device memory; 0 for CPU workers
  // Memory one job may use on the device (a GPU's pool); 0: not bounded.
  int64_t job_memory_bytes = 0;
  std::string compute_capability;  // "9.0"; empty for CPU workers
};

class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda": the device_kind metric label and Job::device_kind.
  virtual std::string kind() const = 0;
  // Unique within the pool, e.g. "cpu:0", "cuda:1".
  virtual std::string name() const = 0;

  // Audits one snapshot. `snapshot` and `options` stay valid until Run
  // returns. Called from this device's worker thread only.
  virtual absl::StatusOr<AuditReport> Run(const Snapshot& snapshot,
                                          const AuditOptions& options) = 0;

  // Audits one snapshot on `gang` (gang[0] == this, size P >= 1, all of the
  // same kind, held exclusively until return).
  virtual absl::StatusOr<AuditReport> RunGang(absl::Span<Device* const> gang,
                                              const Snapshot& snapshot,
                                              const AuditOptions& options);

  // Callable from any thread. The default describes a CPU worker.
  virtual DeviceDescription Describe() const;
  // Device memory the running job holds, in bytes (0 when the device does
  // not track it). Callable from any thread (metrics).
  virtual int64_t memory_in_use_bytes() const { return 0; }
  // OK while the device can run jobs; otherwise why it cannot, for good
  // (see Health in the file comment). Callable from any thread; must not
  // wait for a running job.
  virtual absl::Status Health() const { return absl::OkStatus(); }
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_SCHEDULER_DEVICE_H_
