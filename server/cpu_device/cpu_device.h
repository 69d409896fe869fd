// CpuDevice: a scheduler Device that runs the core CPU audit pipeline
// (core/audit RunAudit) on the calling worker thread plus up to `threads`
// helper threads.
//
// Bad input is not an error here: RunAudit turns an invalid snapshot into a
// report with verdict INVALID (invalid_reason names the field), so the
// outcome is OK and the report is stored and counted like any other. The
// RPC layer maps verdict INVALID to INVALID_ARGUMENT where an RPC must fail
// (the unary Audit). Cancelled when options.cancelled is set; Internal for
// internal errors.
//
// Gang jobs (a context-parallel snapshot, docs/ARCHITECTURE.md "CP
// replay"): RunGang runs the audit with the threads of every worker of the
// gang and tells the CP replay that gang.size() ranks may run at once; a
// gang smaller than the CP world size runs the ranks in turns. Every device
// of a gang must be a CpuDevice (InvalidArgument otherwise).
//
// Thread safety: kind()/name() from any thread; Run from one thread at a
// time (the scheduler guarantees it).
#ifndef ATTNAUDIT_SERVER_CPU_DEVICE_CPU_DEVICE_H_
#define ATTNAUDIT_SERVER_CPU_DEVICE_CPU_DEVICE_H_

#include <memory>
#include <string>
#include <vector>

#include "server/scheduler/device.h"

namespace attnaudit::server {

class CpuDevice : public Device {
 public:
  // `index` names the device "cpu:<index>". `threads` (>= 1) is the thread
  // count the audit uses when the job's AuditOptions::threads is 0.
  CpuDevice(int index, int threads);

  std::string kind() const override { return "cpu"; }
  std::string name() const override { return name_; }
  absl::StatusOr<AuditReport> Run(const Snapshot& snapshot,
                                  const AuditOptions& options) override;
  absl::StatusOr<AuditReport> RunGang(absl::Span<Device* const> gang,
                                      const Snapshot& snapshot,
                                      const AuditOptions& options) override;

 private:
  std::string name_;
  int threads_;
};

// `count` CPU devices "cpu:0".."cpu:<count-1>", each auditing with
// `threads_each` threads (>= 1; values < 1 are treated as 1).
std::vector<std::unique_ptr<Device>> MakeCpuDevices(int count,
                                                    int threads_each);

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_CPU_DEVICE_CPU_DEVICE_H_
