// A SIMT emulator that runs CUDA kernel source on one CPU thread, so the
// GPU kernels' own text (kernels/attention_device.inc) is tested on every
// machine against the CPU backend, bit for bit.
//
// Each GPU thread of a block is a fiber with its own stack. The scheduler
// runs the block's fibers in turn, each until it reaches a barrier:
// __syncthreads (every live thread of the block), or a warp operation --
// __syncwarp, a shuffle, a ballot (every lane of the warp) -- and releases
// a barrier once all its threads have arrived. What a GPU would hang on or
// leave undefined is an error instead: a barrier that can never complete
// (threads waiting at different barriers), the lanes of a warp at different
// warp operations, a lane that exited while its warp waits, a partial
// mask. Asynchronous copies (__pipeline_memcpy_async) land only at the
// __pipeline_wait_prior that covers them, so reading a stage before
// waiting for it reads stale bytes; dynamic shared memory starts as 0xFF
// bytes (NaN in every float type) and ends at a guard page, so reading
// what no thread wrote or writing past the block's bytes shows.
//
// What it does not model: timing, and global-memory bounds (the tests size
// their buffers). A data race shows only as far as the thread order does:
// the scheduler runs a block's threads from first to last, or from last to
// first (SetThreadOrder), each up to its next barrier, so a missing barrier
// between a writer and a reader shows in the order that runs the reader
// first; the tests run both.
//
// Not thread-safe: one launch at a time per process. Kernel source reaches
// it through simt_cuda_builtins.h (CUDA's spellings).
#ifndef ATTNAUDIT_TESTS_UNIT_KERNELS_SIMT_H_
#define ATTNAUDIT_TESTS_UNIT_KERNELS_SIMT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/pass_params.h"

namespace attnaudit {
namespace simt {

struct Dim3 {
  uint32_t x = 0;
  uint32_t y = 0;
  uint32_t z = 0;
};

// The running thread's indices and its launch's shape.
const Dim3& ThreadIdx();
const Dim3& BlockIdx();
const Dim3& BlockDim();
const Dim3& GridDim();
// The block's dynamic shared memory.
char* DynamicShared();

// Barriers and warp operations of the running thread (full-warp masks
// only: `mask` must be 0xffffffff).
void SyncThreads();
void SyncWarp(uint32_t mask);
uint64_t ShuffleXorBits(uint32_t mask, uint64_t bits, int lane_mask);
uint32_t Ballot(uint32_t mask, bool predicate);

// Asynchronous copies: issued, committed in batches, and landed by
// PipelineWaitPrior(n) for every batch but the last n.
void PipelineCopy(void* dst, const void* src, size_t bytes);
void PipelineCommit();
void PipelineWaitPrior(size_t batches);

// The order each scheduling round runs a block's threads in, for every
// later launch (process-wide).
enum class ThreadOrder { kFirstToLast, kLastToFirst };
void SetThreadOrder(ThreadOrder order);

// Runs body() once per thread of the grid, block after block (x fastest);
// an error names the first barrier that failed.
absl::Status RunGrid(cuda_internal::KernelGrid grid, int threads_per_block,
                     int64_t shared_bytes, const std::function<void()>& body);

// A launcher for kernels/*_device.inc's Run* functions: runs each kernel
// with RunGrid and records what was launched.
struct Launch {
  std::string kernel;
  cuda_internal::KernelGrid grid;
  int threads = 0;
  int64_t shared_bytes = 0;
};

class Launcher {
 public:
  template <typename... Params, typename... Args>
  absl::Status operator()(const char* name, void (*kernel)(Params...),
                          cuda_internal::KernelGrid grid, int threads,
                          int64_t shared_bytes, const Args&... args) {
    launches_.push_back({name, grid, threads, shared_bytes});
    return RunGrid(grid, threads, shared_bytes,
                   [&kernel, &args...] { kernel(args...); });
  }

  const std::vector<Launch>& launches() const { return launches_; }

 private:
  std::vector<Launch> launches_;
};

}  // namespace simt
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_KERNELS_SIMT_H_
