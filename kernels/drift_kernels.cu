// The GPU drift kernels under nvcc: CUDA's built-ins for drift_device.inc,
// and LaunchDrift (drift_kernels.h) on a stream.
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/drift_device.inc"
#include "kernels/drift_kernels.h"
#include "kernels/kernel_launcher.h"

namespace attnaudit {
namespace cuda_internal {

int64_t DriftScratchBytes(int64_t n) { return DriftScratchSize(n); }

absl::Status LaunchDrift(const DriftArgs& args, void* scratch,
                         DriftTotals* totals_device, cudaStream_t stream) {
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
      DriftSelectWork(scratch, args.n), 0, sizeof(SelectWork), stream));
  return RunDrift(args, scratch, totals_device, StreamLauncher{stream});
}

}  // namespace cuda_internal
}  // namespace attnaudit
