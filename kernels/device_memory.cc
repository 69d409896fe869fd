#include "kernels/device_memory.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/common/parallel_copy.h"
#include "core/common/status_macros.h"
#include "kernels/cuda_check.h"

namespace attnaudit {
namespace cuda_internal {

absl::StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::Create(
    int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu memory pool: ", bytes, " bytes must be positive"));
  }
  void* base = nullptr;
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, static_cast<size_t>(bytes)));
  return std::unique_ptr<DeviceArena>(
      new DeviceArena(static_cast<char*>(base), bytes));
}

DeviceArena::~DeviceArena() {
  if (base_ != nullptr) cudaFree(base_);  // errors here have no one to go to
}

absl::StatusOr<char*> DeviceArena::Allocate(int64_t bytes,
                                            absl::string_view what) {
  const int64_t aligned = (std::max<int64_t>(bytes, 0) + 255) / 256 * 256;
  const int64_t used = used_.load(std::memory_order_relaxed);
  if (aligned > capacity_ - used) {
    return absl::ResourceExhaustedError(
        absl::StrCat("gpu memory pool: ", what, " needs ", bytes, " bytes; ",
                     capacity_ - used, " of ", capacity_,
                     " are free (--gpu-memory-pool-bytes)"));
  }
  used_.store(used + aligned, std::memory_order_relaxed);
  return base_ + used;
}

absl::StatusOr<std::unique_ptr<PinnedStaging>> PinnedStaging::Create(
    int64_t chunk_bytes, int copy_threads) {
  std::unique_ptr<PinnedStaging> s(new PinnedStaging());
  s->chunk_ = std::max<int64_t>(chunk_bytes, 1 << 16);
  s->copy_threads_ = copy_threads;
  for (int i = 0; i < 2; ++i) {
    void* p = nullptr;
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaMallocHost(&p, static_cast<size_t>(s->chunk_)));
    s->buffer_[i] = static_cast<char*>(p);
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&s->free_[i], cudaEventDisableTiming));
  }
  return s;
}

PinnedStaging::~PinnedStaging() {
  for (int i = 0; i < 2; ++i) {
    if (free_[i] != nullptr) {
      cudaEventSynchronize(free_[i]);
      cudaEventDestroy(free_[i]);
    }
    if (buffer_[i] != nullptr) cudaFreeHost(buffer_[i]);
  }
}

absl::Status PinnedStaging::Upload(void* device, const void* host,
                                   int64_t bytes, cudaStream_t stream) {
  const char* src = static_cast<const char*>(host);
  char* dst = static_cast<char*>(device);
  for (int64_t off = 0, i = 0; off < bytes; off += chunk_, ++i) {
    const int b = static_cast<int>(i % 2);
    const int64_t n = std::min(chunk_, bytes - off);
    // The buffer's previous DMA must be done before it is refilled.
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(free_[b]));
    ParallelCopy(buffer_[b], src + off, n, copy_threads_);
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst + off, buffer_[b], static_cast<size_t>(n),
                        cudaMemcpyHostToDevice, stream));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(free_[b], stream));
  }
  return absl::OkStatus();
}

absl::Status PinnedStaging::UploadPieces(void* device,
                                         const std::vector<Piece>& pieces,
                                         cudaStream_t stream) {
  char* dst = static_cast<char*>(device);
  int b = 0;         // the buffer being filled
  int64_t fill = 0;  // its bytes so far
  auto flush = [&]() -> absl::Status {
    if (fill == 0) return absl::OkStatus();
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, buffer_[b], static_cast<size_t>(fill),
                        cudaMemcpyHostToDevice, stream));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(free_[b], stream));
    dst += fill;
    fill = 0;
    b = 1 - b;
    // The next buffer's previous DMA must be done before it is refilled.
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(free_[b]));
    return absl::OkStatus();
  };
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(free_[b]));
  for (const Piece& piece : pieces) {
    const char* src = static_cast<const char*>(piece.host);
    for (int64_t off = 0; off < piece.bytes;) {
      const int64_t n = std::min(chunk_ - fill, piece.bytes - off);
      ParallelCopy(buffer_[b] + fill, src + off, n, copy_threads_);
      fill += n;
      off += n;
      if (fill == chunk_) ATTNAUDIT_RETURN_IF_ERROR(flush());
    }
  }
  return flush();
}

absl::Status PinnedStaging::Download(void* host, const void* device,
                                     int64_t bytes, cudaStream_t stream) {
  char* dst = static_cast<char*>(host);
  const char* src = static_cast<const char*>(device);
  auto issue = [&](int64_t i) -> absl::Status {
    const int b = static_cast<int>(i % 2);
    const int64_t off = i * chunk_;
    const int64_t n = std::min(chunk_, bytes - off);
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(buffer_[b], src + off, static_cast<size_t>(n),
                        cudaMemcpyDeviceToHost, stream));
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventRecord(free_[b], stream));
    return absl::OkStatus();
  };
  const int64_t chunks = (bytes + chunk_ - 1) / chunk_;
  if (chunks > 0) {
    if (absl::Status s = issue(0); !s.ok()) return s;
  }
  for (int64_t i = 0; i < chunks; ++i) {
    // Chunk i + 1 goes into the other buffer while chunk i is copied out.
    if (i + 1 < chunks) {
      if (absl::Status s = issue(i + 1); !s.ok()) return s;
    }
    const int b = static_cast<int>(i % 2);
    ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(free_[b]));
    const int64_t off = i * chunk_;
    ParallelCopy(dst + off, buffer_[b], std::min(chunk_, bytes - off),
                 copy_threads_);
  }
  return absl::OkStatus();
}

}  // namespace cuda_internal
}  // namespace attnaudit
