// Device memory of the CUDA backend: one pool per GPU, sized by the
// server's --gpu-memory-pool-bytes, carved by a bump allocator that a job
// resets when it ends (no cudaMalloc/cudaFree per job, which synchronise
// the device), and pinned host staging buffers reused across jobs (the
// snapshot lives in pageable memory; it is copied through the staging
// buffers in chunks, two in flight, so the host copy of one chunk overlaps
// the DMA of the other; each chunk's host copy is cut among the job's host
// threads, core/common/parallel_copy.h, since one thread copies at a
// fraction of what the DMA takes).
//
// Thread safety: one job at a time per object (the backend's contract);
// DeviceArena::used() may be read from any thread (metrics).
// Errors: ResourceExhausted when the pool (or pinned memory) is too small
// for the request, naming what was asked for; CUDA errors via
// kernels/cuda_check.h.
#ifndef ATTNAUDIT_KERNELS_DEVICE_MEMORY_H_
#define ATTNAUDIT_KERNELS_DEVICE_MEMORY_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnaudit {
namespace cuda_internal {

class DeviceArena {
 public:
  // `bytes` of device memory on the current device.
  static absl::StatusOr<std::unique_ptr<DeviceArena>> Create(int64_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // 256-byte aligned; valid until Reset.
  absl::StatusOr<char*> Allocate(int64_t bytes, absl::string_view what);
  template <typename T>
  absl::StatusOr<T*> AllocateArray(int64_t count, absl::string_view what) {
    absl::StatusOr<char*> p =
        Allocate(count * static_cast<int64_t>(sizeof(T)), what);
    if (!p.ok()) return p.status();
    return reinterpret_cast<T*>(*p);
  }
  // Frees every allocation (the caller's stream work on them must be done).
  void Reset() { used_.store(0, std::memory_order_relaxed); }
  int64_t capacity() const { return capacity_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  DeviceArena(char* base, int64_t capacity)
      : base_(base), capacity_(capacity) {}
  char* base_;
  int64_t capacity_;
  std::atomic<int64_t> used_{0};
};

class PinnedStaging {
 public:
  // Two pinned buffers of chunk_bytes each; host copies on up to
  // copy_threads threads (ParallelCopy's rule: <= 0 every hardware thread).
  static absl::StatusOr<std::unique_ptr<PinnedStaging>> Create(
      int64_t chunk_bytes, int copy_threads);
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Copies host -> device on `stream`. Returns once `host` may be reused;
  // the device copy is ordered before later work on `stream`.
  absl::Status Upload(void* device, const void* host, int64_t bytes,
                      cudaStream_t stream);
  // A host piece of an upload.
  struct Piece {
    const void* host = nullptr;
    int64_t bytes = 0;
  };
  // Copies `pieces`, one after another, to `device` on `stream`: packed
  // into the staging buffers, so many small pieces (the pages of a CP
  // shard) cost the DMAs of one upload of their sum. Returns once every
  // piece may be reused.
  absl::Status UploadPieces(void* device, const std::vector<Piece>& pieces,
                            cudaStream_t stream);
  // Copies device -> host after the work already on `stream`; returns when
  // `host` holds the data.
  absl::Status Download(void* host, const void* device, int64_t bytes,
                        cudaStream_t stream);

 private:
  PinnedStaging() = default;
  int64_t chunk_ = 0;
  int copy_threads_ = 1;
  char* buffer_[2] = {nullptr, nullptr};
  cudaEvent_t free_[2] = {nullptr, nullptr};
};

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_DEVICE_MEMORY_H_
