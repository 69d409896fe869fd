// NCCL errors as absl::Status, through one macro (the NCCL twin of
// kernels/cuda_check.h). Only in builds with NCCL.
#ifndef ATTNAUDIT_KERNELS_NCCL_CHECK_H_
#define ATTNAUDIT_KERNELS_NCCL_CHECK_H_

#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnaudit {
namespace cuda_internal {

inline absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("nccl: ", what, ": ", ncclGetErrorString(result)));
}

}  // namespace cuda_internal
}  // namespace attnaudit

#define ATTNAUDIT_NCCL_RETURN_IF_ERROR(expr)                         \
  do {                                                               \
    const ::absl::Status _attnaudit_nccl_status =                    \
        ::attnaudit::cuda_internal::NcclStatus((expr), #expr);       \
    if (!_attnaudit_nccl_status.ok()) return _attnaudit_nccl_status; \
  } while (0)

#endif  // ATTNAUDIT_KERNELS_NCCL_CHECK_H_
