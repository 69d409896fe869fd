#include "tests/unit/kernels/host_drift.h"

#include <cstring>
#include <vector>

#include "tests/unit/kernels/simt.h"
// The kernels' source, last: it needs CUDA's spellings.
#include "tests/unit/kernels/simt_cuda_builtins.h"
// clang-format off
#include "kernels/drift_device.inc"
// clang-format on

namespace attnaudit {
namespace testing {

absl::StatusOr<kmath::DriftTotals> RunDriftOnHost(const kmath::DriftInput& in) {
  const int64_t bytes = cuda_internal::DriftScratchSize(in.n);
  // Scratch as a previous job left it (8-byte words for the keys and
  // partials), the select's state zeroed as LaunchDrift's memset does.
  std::vector<uint64_t> scratch(static_cast<size_t>(bytes / 8 + 1),
                                0xA5A5A5A5A5A5A5A5ull);
  void* base = scratch.data();
  std::memset(cuda_internal::DriftSelectWork(base, in.n), 0,
              sizeof(cuda_internal::SelectWork));
  kmath::DriftTotals totals;
  simt::Launcher launcher;
  ATTNAUDIT_RETURN_IF_ERROR(
      cuda_internal::RunDrift(in, base, &totals, launcher));
  return totals;
}

}  // namespace testing
}  // namespace attnaudit
