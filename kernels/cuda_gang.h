// CudaGang: the GPUs of one gang job (a CP replay over W ranks on G GPUs,
// the scheduler's RunGang), with what their ring needs and what is worth
// keeping between jobs: for G > 1 one NCCL communicator per GPU
// (ncclCommInitAll over the members' devices) and a communication stream
// per GPU, created once, warmed up with one exchange around the ring (the
// first send/receive of a pair sets up its connection, which takes long
// enough to distort a measured round), and cached by the server's device
// for the next gang of the same devices.
//
// NCCL allocates its buffers outside the members' pools: Create measures
// each member's free device memory before the communicators and after the
// warm-up, keeps the difference (comm_bytes) and adds it to the member's
// CudaBackend::comm_memory() until the gang is destroyed; a communicator
// that cannot be made says how much each member had free.
//
// A collective that does not finish (a peer GPU that died, a broken
// connection) is bounded by the CP replay's collective watchdog
// (kernels/collective_watchdog.h): it reads AsyncError and calls Abort,
// after which the gang is broken() and its owner drops it.
//
// Ownership: the members are not owned and must outlive the gang.
// Thread safety: one job at a time (the members are held by the job).
// Errors: FailedPrecondition for G > 1 in a build without NCCL; NCCL and
// CUDA errors as statuses.
#ifndef ATTNAUDIT_KERNELS_CUDA_GANG_H_
#define ATTNAUDIT_KERNELS_CUDA_GANG_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  // "cuda:0,cuda:1" for messages.
  std::string Names() const;
  // How long one job's collectives may take before the watchdog aborts.
  absl::Duration collective_timeout() const { return collective_timeout_; }
  // The first asynchronous error of the gang's communicators, or OK.
  absl::Status AsyncError() const;
  // Aborts every communicator (pending NCCL work returns); the gang is
  // broken() from then on and must be dropped, never reused.
  void Abort();
  bool broken() const { return broken_; }
  // Device bytes member i's NCCL communicator and its warm-up took (0 for
  // a gang of one GPU).
  int64_t comm_bytes(int i) const { return comm_bytes_[i]; }
#ifdef ATTNAUDIT_HAVE_NCCL
  ncclComm_t comm(int i) const { return comms_[i]; }
#endif

 private:
  CudaGang() = default;
  absl::Status WarmUp();

  std::vector<CudaBackend*> members_;
  std::vector<cudaStream_t> comm_streams_;
  std::vector<int64_t> comm_bytes_;
  // A CP replay of the largest snapshots takes seconds; minutes without
  // progress is a hang, not a slow ring.
  absl::Duration collective_timeout_ = absl::Seconds(120);
  bool broken_ = false;
#ifdef ATTNAUDIT_HAVE_NCCL
  std::vector<ncclComm_t> comms_;
#endif
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_CUDA_GANG_H_
