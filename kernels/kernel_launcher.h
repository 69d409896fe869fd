// StreamLauncher: the launcher that kernels/*_device.inc's Run* functions
// take under nvcc -- launch(name, kernel, grid, threads, shared_bytes,
// args...) runs `kernel` over the grid on a stream and returns its launch
// status. Only for .cu files (it uses the <<<>>> launch syntax); the tests'
// SIMT emulator (tests/unit/kernels/simt.h) is the other launcher.
#ifndef ATTNAUDIT_KERNELS_KERNEL_LAUNCHER_H_
#define ATTNAUDIT_KERNELS_KERNEL_LAUNCHER_H_

#if !defined(__CUDACC__)
#error "kernel_launcher.h is for .cu files"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda_check.h"
#include "kernels/pass_params.h"

namespace attnaudit {
namespace cuda_internal {

// A kernel with dynamic shared memory may take all of it and all of L1
// that can be shared memory (blocks per multiprocessor are bounded by it).
struct StreamLauncher {
  cudaStream_t stream;

  template <typename... Params, typename... Args>
  absl::Status operator()(const char* name, void (*kernel)(Params...),
                          KernelGrid grid, int threads, int64_t shared_bytes,
                          Args&&... args) const {
    if (shared_bytes > 0) {
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
          static_cast<int>(shared_bytes)));
      ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
          cudaSharedmemCarveoutMaxShared));
    }
    kernel<<<dim3(grid.x, grid.y, grid.z), threads,
             static_cast<size_t>(shared_bytes), stream>>>(args...);
    return LaunchStatus(name);
  }
};

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_KERNEL_LAUNCHER_H_
