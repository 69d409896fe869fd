// The --devices flag's value: which devices the server drives.
//   "cpu"              the CPU workers (--cpu-workers, --threads-per-job)
//   "all"              one worker per visible GPU; the CPU workers when the
//                      build has no CUDA backend or no GPU is visible
//   "cuda:0,cuda:2"    those GPUs, one worker each (start-up fails when one
//                      is missing)
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_SERVER_DEVICE_POOL_DEVICE_SELECTION_H_
#define ATTNAUDIT_SERVER_DEVICE_POOL_DEVICE_SELECTION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnaudit::server {

struct DeviceSelection {
  enum class Mode { kCpu, kAll, kList };
  Mode mode = Mode::kCpu;
  std::vector<int> gpus;  // kList: CUDA ordinals, ascending, distinct
};

// InvalidArgument naming the bad entry ("'cuda:x' is not cpu, all or
// cuda:N[,cuda:M...]").
absl::StatusOr<DeviceSelection> ParseDeviceSelection(absl::string_view text);

// The canonical spelling ("cpu", "all", "cuda:0,cuda:2").
std::string DeviceSelectionText(const DeviceSelection& selection);

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_DEVICE_POOL_DEVICE_SELECTION_H_
