// The CUDA backend's drift reduction run on the CPU: the kernels' own
// source (kernels/drift_device.inc) under the SIMT emulator (simt.h), as
// LaunchDrift runs it, with host buffers in place of device scratch.
// Test-only; not thread-safe (one emulated launch at a time).
#ifndef ATTNAUDIT_TESTS_UNIT_KERNELS_HOST_DRIFT_H_
#define ATTNAUDIT_TESTS_UNIT_KERNELS_HOST_DRIFT_H_

#include "absl/status/statusor.h"
#include "kernels/math/drift_reduce.h"

namespace attnaudit {
namespace testing {

// The statistics the GPU reduction returns for `in` (host pointers); an
// error when the emulator finds a fault in the kernels.
absl::StatusOr<kmath::DriftTotals> RunDriftOnHost(const kmath::DriftInput& in);

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_KERNELS_HOST_DRIFT_H_
