// The GPU attention kernels under nvcc: CUDA's built-ins for
// attention_device.inc, and the launchers of attention_kernels.h on a
// stream.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include "kernels/attention_kernels.h"
#include "kernels/cuda_check.h"
#include "kernels/kernel_launcher.h"

#define ATTNAUDIT_DYNAMIC_SHARED_BYTES(name) \
  extern __shared__ __align__(16) char name[]

#include "kernels/attention_device.inc"

namespace attnaudit {
namespace cuda_internal {

absl::Status LaunchFusedPass(const PassParams& params, cudaStream_t stream,
                             bool* specialized) {
  return RunFusedPass(params, StreamLauncher{stream}, specialized);
}

absl::Status LaunchSplitMerge(const SplitMergeParams& params,
                              cudaStream_t stream) {
  return RunSplitMerge(params, StreamLauncher{stream});
}

absl::Status LaunchGather(const GatherParams& params, cudaStream_t stream) {
  return RunGather(params, StreamLauncher{stream});
}

}  // namespace cuda_internal
}  // namespace attnaudit
