// ParallelCopy: memcpy of a large buffer cut into pieces that the core's
// worker pool (parallel.h) copies at once. One thread copies 6-10 GB/s of
// pageable memory; the GPU backend's staging (kernels/device_memory.h)
// feeds a DMA engine that takes several times that, so its host copy uses
// every thread the job has.
//
// Pieces are at least kParallelCopyPiece bytes, so a small copy stays one
// memcpy on the calling thread. dst and src must not overlap. Thread-safe
// as ParallelFor is; returns when every byte is copied.
#ifndef ATTNAUDIT_CORE_COMMON_PARALLEL_COPY_H_
#define ATTNAUDIT_CORE_COMMON_PARALLEL_COPY_H_

#include <cstdint>

namespace attnaudit {

inline constexpr int64_t kParallelCopyPiece = int64_t{1} << 20;

// threads <= 0: every hardware thread (ParallelFor's rule).
void ParallelCopy(void* dst, const void* src, int64_t bytes, int threads);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_COMMON_PARALLEL_COPY_H_
