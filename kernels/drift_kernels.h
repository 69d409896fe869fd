// The drift statistics reduction on the GPU (core/drift/drift.h,
// ComputeDrift), in the shape kernels/math/drift_reduce.h fixes: a
// grid-stride pass classifies every element (kmath::AddDriftElement),
// writes its p99 key and the first radix digit's histogram, reduces the
// per-thread statistics in a fixed tree, and its last block combines the
// blocks; five more grid-stride passes narrow the exact p99 down 11 bits at
// a time, each one's last block picking the digit. One memset and six
// launches per call; only the statistics come back to the host.
// Thread safety: a call uses its own buffers and stream.
#ifndef ATTNAUDIT_KERNELS_DRIFT_KERNELS_H_
#define ATTNAUDIT_KERNELS_DRIFT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/math/drift_reduce.h"

namespace attnaudit {
namespace cuda_internal {

using DriftTotals = kmath::DriftTotals;
// Device pointers; n elements, n / inner mask groups.
using DriftArgs = kmath::DriftInput;

// Device scratch a reduction of n elements needs (bytes).
int64_t DriftScratchBytes(int64_t n);

// Reduces on `stream` into *totals_device (one DriftTotals in device
// memory). scratch: DriftScratchBytes(n) bytes of device memory.
absl::Status LaunchDrift(const DriftArgs& args, void* scratch,
                         DriftTotals* totals_device, cudaStream_t stream);

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_DRIFT_KERNELS_H_
