#include "server/scheduler/device.h"

#include "absl/strings/str_cat.h"

namespace attnaudit::server {

absl::StatusOr<AuditReport> Device::RunGang(absl::Span<Device* const> gang,
                                            const Snapshot& snapshot,
                                            const AuditOptions& options) {
  if (gang.size() == 1) return Run(snapshot, options);
  return absl::UnimplementedError(absl::StrCat(
      "device ", name(), " (", kind(), ") does not support gang jobs of ",
      gang.size(), " devices"));
}

DeviceDescription Device::Describe() const {
  DeviceDescription d;
  d.name = name();
  d.kind = kind();
  d.model = "CPU worker";
  return d;
}

}  // namespace attnaudit::server
