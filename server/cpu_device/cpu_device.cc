#include "server/cpu_device/cpu_device.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/audit/audit.h"

namespace attnaudit::server {

CpuDevice::CpuDevice(int index, int threads)
    : name_(absl::StrCat("cpu:", index)), threads_(std::max(1, threads)) {}

absl::StatusOr<AuditReport> CpuDevice::Run(const Snapshot& snapshot,
                                           const AuditOptions& options) {
  if (options.cancelled != nullptr && options.cancelled->load()) {
    return absl::CancelledError("cancelled before the audit started");
  }
  if (options.threads != 0) return RunAudit(snapshot, options);
  // The pool divides the machine between workers: without an explicit
  // request a job gets this worker's share, not every core.
  AuditOptions own = options;
  own.threads = threads_;
  return RunAudit(snapshot, own);
}

absl::StatusOr<AuditReport> CpuDevice::RunGang(absl::Span<Device* const> gang,
                                               const Snapshot& snapshot,
                                               const AuditOptions& options) {
  if (gang.size() <= 1) return Run(snapshot, options);
  if (options.cancelled != nullptr && options.cancelled->load()) {
    return absl::CancelledError("cancelled before the audit started");
  }
  // Each worker of the gang brings its share of the machine.
  int threads = 0;
  for (Device* device : gang) {
    const auto* cpu = dynamic_cast<const CpuDevice*>(device);
    if (cpu == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gang: device ", device->name(), " is not a CPU device"));
    }
    threads += options.threads != 0 ? options.threads : cpu->threads_;
  }
  AuditOptions own = options;
  own.threads = threads;
  own.cp_workers = static_cast<int>(gang.size());
  return RunAudit(snapshot, own);
}

std::vector<std::unique_ptr<Device>> MakeCpuDevices(int count,
                                                    int threads_each) {
  std::vector<std::unique_ptr<Device>> out;
  for (int i = 0; i < count; ++i) {
    out.push_back(std::make_unique<CpuDevice>(i, threads_each));
  }
  return out;
}

}  // namespace attnaudit::server
