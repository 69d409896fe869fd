// The drift statistics reduction on the GPU (core/drift/drift.h,
// ComputeDrift): every element classified by kmath::ClassifyPair, the
// counts, maxima, worst element and sums reduced per thread block and then
// across blocks in a fixed order (so a run's result never depends on
// scheduling), and the exact p99 found by an 8-pass radix select over the
// |diff| bit patterns -- only the statistics come back to the host.
// Thread safety: a call uses its own buffers and stream.
#ifndef ATTNAUDIT_KERNELS_DRIFT_KERNELS_H_
#define ATTNAUDIT_KERNELS_DRIFT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace attnaudit {
namespace cuda_internal {

// What the device returns (DriftStats without the decoded locations).
struct DriftTotals {
  double sum_abs = 0;
  double sum_sq = 0;
  double sum_ulp = 0;
  double max_abs = 0;
  double max_rel = 0;
  double max_ulp = 0;
  long long count = 0;
  long long over = 0;
  long long candidate_nan = 0;
  long long candidate_inf = 0;
  long long baseline_nan = 0;
  long long baseline_inf = 0;
  long long mismatch = 0;
  long long worst = -1;           // flat index, -1: none
  long long first_mismatch = -1;  // flat index, -1: none
  double p99_abs = 0;
};

struct DriftArgs {
  const double* candidate = nullptr;  // device, n values
  const double* baseline = nullptr;
  const uint8_t* mask = nullptr;  // device, n / inner groups; may be null
  int64_t n = 0;
  int64_t inner = 1;  // elements per mask group
  double tolerance = 0;
  int ulp_dtype = 1;  // core DType number
};

// Device scratch a reduction of n elements needs (bytes).
int64_t DriftScratchBytes(int64_t n);

// Reduces on `stream` into *totals (host memory, valid once the stream is
// synchronised). scratch: DriftScratchBytes(n) bytes of device memory;
// totals_device: one DriftTotals in device memory.
absl::Status LaunchDrift(const DriftArgs& args, void* scratch,
                         DriftTotals* totals_device, cudaStream_t stream);

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_DRIFT_KERNELS_H_
