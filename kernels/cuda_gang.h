// CudaGang: the GPUs of one gang job (a CP replay over W ranks on G GPUs,
// the scheduler's RunGang), with what their ring needs and what is worth
// keeping between jobs: for G > 1 one NCCL communicator per GPU
// (ncclCommInitAll over the members' devices) and a communication stream
// per GPU, created once, warmed up with one exchange around the ring (the
// first send/receive of a pair sets up its connection, which takes long
// enough to distort a measured round), and cached by the server's device
// for the next gang of the same devices.
//
// Ownership: the members are not owned and must outlive the gang.
// Thread safety: one job at a time (the members are held by the job).
// Errors: FailedPrecondition for G > 1 in a build without NCCL; NCCL and
// CUDA errors as statuses.
#ifndef ATTNAUDIT_KERNELS_CUDA_GANG_H_
#define ATTNAUDIT_KERNELS_CUDA_GANG_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda_backend.h"

#ifdef ATTNAUDIT_HAVE_NCCL
#include <nccl.h>
#endif

namespace attnaudit {

class CudaGang {
 public:
  static absl::StatusOr<std::unique_ptr<CudaGang>> Create(
      std::vector<CudaBackend*> members);
  ~CudaGang();
  CudaGang(const CudaGang&) = delete;
  CudaGang& operator=(const CudaGang&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  CudaBackend* member(int i) const { return members_[i]; }
  // The member index of a CUDA device ordinal, or -1.
  int IndexOfDevice(int device) const;
  cudaStream_t comm_stream(int i) const { return comm_streams_[i]; }
#ifdef ATTNAUDIT_HAVE_NCCL
  ncclComm_t comm(int i) const { return comms_[i]; }
#endif

 private:
  CudaGang() = default;
  absl::Status WarmUp();

  std::vector<CudaBackend*> members_;
  std::vector<cudaStream_t> comm_streams_;
#ifdef ATTNAUDIT_HAVE_NCCL
  std::vector<ncclComm_t> comms_;
#endif
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_CUDA_GANG_H_
