// CUDA and NCCL errors as absl::Status, through one macro each: every
// runtime call of the backend goes through ATTNAUDIT_CUDA_RETURN_IF_ERROR
// (or CudaStatus for the rare call whose error is handled), so a failing
// call becomes Internal (Unavailable for "no device", ResourceExhausted
// for out-of-memory) naming the call and the CUDA error, and nothing in
// kernels/ exits or aborts the process. A sticky error (the context is
// unusable after an illegal address) says so: the device must be taken out
// of the pool.
// Thread-safe (pure functions of the error code).
#ifndef ATTNAUDIT_KERNELS_CUDA_CHECK_H_
#define ATTNAUDIT_KERNELS_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace attnaudit {
namespace cuda_internal {

// OK for cudaSuccess; otherwise a status naming `what` (the call's text)
// and the error.
absl::Status CudaStatus(cudaError_t error, const char* what);

// True for the errors after which the device's context is unusable (every
// later call fails the same way until the process ends).
bool IsStickyError(cudaError_t error);

// The status of the last kernel launch on this thread (launch errors are
// reported by cudaGetLastError, execution errors at the next sync).
absl::Status LaunchStatus(const char* kernel);

}  // namespace cuda_internal
}  // namespace attnaudit

#define ATTNAUDIT_CUDA_RETURN_IF_ERROR(expr)                         \
  do {                                                               \
    const ::absl::Status _attnaudit_cuda_status =                    \
        ::attnaudit::cuda_internal::CudaStatus((expr), #expr);       \
    if (!_attnaudit_cuda_status.ok()) return _attnaudit_cuda_status; \
  } while (0)

#endif  // ATTNAUDIT_KERNELS_CUDA_CHECK_H_
