// The drift reduction (drift_kernels.h). The element rule and the
// reduction's shape are kernels/math/drift_reduce.h; here: the block tree,
// the last-block combines and the radix select's histograms.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/common/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/drift_kernels.h"

namespace attnaudit {
namespace cuda_internal {
namespace {

using kmath::DriftInput;
using kmath::kDigitBins;
using kmath::kDriftThreads;
using kmath::kNotCounted;
using kmath::kSelectPasses;

constexpr int kBinsPerThread = kDigitBins / kDriftThreads;
static_assert(kBinsPerThread * kDriftThreads == kDigitBins,
              "the digit scan gives every thread the same number of bins");

// The select's state between passes, in device scratch; zeroed per call.
struct SelectWork {
  unsigned int hist[kDigitBins];  // this pass's digits, all blocks
  unsigned long long prefix;      // the digits found so far
  unsigned long long k;           // the rank sought among the matching keys
  unsigned int blocks_done;       // blocks of this launch that finished
};

// A select pass's shared memory: the block's digit histogram and the
// last block's scan of it.
struct SelectShared {
  unsigned int hist[kDigitBins];
  unsigned long long group_sums[kDriftThreads];
  bool last;
};

// The statistics pass adds the block's tree (43 KB in all).
struct StatsShared {
  DriftTotals tree[kDriftThreads];
  SelectShared select;
};

template <typename T>
__device__ T& Shared() {
  // Raw storage: a __shared__ object may not have a constructor.
  __shared__ __align__(16) unsigned char bytes[sizeof(T)];
  return *reinterpret_cast<T*>(bytes);
}

// tree[0] <- the fixed tree over tree[0 .. kDriftThreads).
__device__ void CombineTree(DriftTotals* tree) {
  for (int half = kDriftThreads / 2; half >= 1; half /= 2) {
    if (threadIdx.x < half) {
      kmath::CombineTotals(&tree[threadIdx.x], tree[threadIdx.x + half]);
    }
    __syncthreads();
  }
}

__device__ void ClearHistogram(unsigned int* hist) {
  for (int i = threadIdx.x; i < kDigitBins; i += blockDim.x) hist[i] = 0;
}

// Adds the block's histogram into the launch's (nonzero bins only).
__device__ void FlushHistogram(const unsigned int* hist, SelectWork* work) {
  for (int i = threadIdx.x; i < kDigitBins; i += blockDim.x) {
    if (hist[i] != 0) atomicAdd(&work->hist[i], hist[i]);
  }
}

// Whether this block finished last in its launch; the fences make every
// block's partial and histogram visible to that block.
__device__ bool IsLastBlock(SelectWork* work, SelectShared& sh) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    sh.last = atomicAdd(&work->blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (sh.last) __threadfence();
  return sh.last;
}

// A block partial written by another block of this launch, read from L2.
__device__ DriftTotals LoadPartial(const DriftTotals* p) {
  static_assert(sizeof(DriftTotals) % 8 == 0, "whole 8-byte words");
  DriftTotals t;
  const auto* src = reinterpret_cast<const unsigned long long*>(p);
  auto* dst = reinterpret_cast<unsigned long long*>(&t);
  for (int w = 0; w < static_cast<int>(sizeof(DriftTotals) / 8); ++w) {
    dst[w] = __ldcg(src + w);
  }
  return t;
}

// The last block: pass `pass`'s digit from the launch's histogram
// (kmath::SelectDigit, the bins summed by 256 threads then walked by one),
// the histogram cleared and the launch counter reset for the next pass.
__device__ void SelectPassDigit(int pass, SelectWork* work, SelectShared& sh) {
  const int first_bin = threadIdx.x * kBinsPerThread;
  unsigned long long sum = 0;
  for (int j = 0; j < kBinsPerThread; ++j) {
    sum += __ldcg(&work->hist[first_bin + j]);
  }
  sh.group_sums[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long k = work->k;
    unsigned long long below = 0;
    int group = 0;
    while (group < kDriftThreads - 1 && below + sh.group_sums[group] < k) {
      below += sh.group_sums[group++];
    }
    int digit = group * kBinsPerThread;
    for (int j = 0; j < kBinsPerThread - 1; ++j, ++digit) {
      const unsigned int h = __ldcg(&work->hist[digit]);
      if (below + h >= k) break;
      below += h;
    }
    work->k = k - below;
    work->prefix |= static_cast<unsigned long long>(digit)
                    << kmath::DigitShift(pass);
    work->blocks_done = 0;
  }
  __syncthreads();
  ClearHistogram(work->hist);
}

// Step 1 (drift_reduce.h) and the select's first pass.
__global__ void __launch_bounds__(kDriftThreads)
    DriftStatsKernel(const DriftInput in, unsigned long long* keys,
                     DriftTotals* partials, SelectWork* work,
                     DriftTotals* totals) {
  StatsShared& sh = Shared<StatsShared>();
  ClearHistogram(sh.select.hist);
  __syncthreads();
  const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
  const double tiny = kmath::SmallestNormal(in.ulp_dtype);
  DriftTotals t;
  for (long long i =
           static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < in.n; i += threads) {
    const unsigned long long key = kmath::AddDriftElement(in, i, tiny, &t);
    keys[i] = key;
    if (key != kNotCounted) {
      atomicAdd(&sh.select.hist[kmath::DigitOf(key, 0)], 1u);
    }
  }
  sh.tree[threadIdx.x] = t;
  __syncthreads();
  CombineTree(sh.tree);
  if (threadIdx.x == 0) partials[blockIdx.x] = sh.tree[0];
  FlushHistogram(sh.select.hist, work);
  if (!IsLastBlock(work, sh.select)) return;

  const int per = kmath::BlocksPerThread(gridDim.x);
  DriftTotals mine;
  for (int b = threadIdx.x * per;
       b < (threadIdx.x + 1) * per && b < static_cast<int>(gridDim.x); ++b) {
    kmath::CombineTotals(&mine, LoadPartial(&partials[b]));
  }
  __syncthreads();  // every thread is done with the block's own tree
  sh.tree[threadIdx.x] = mine;
  __syncthreads();
  CombineTree(sh.tree);
  if (threadIdx.x == 0) {
    *totals = sh.tree[0];
    work->k = kmath::P99Rank(sh.tree[0].count);
    work->prefix = 0;
  }
  __syncthreads();
  SelectPassDigit(0, work, sh.select);
}

// Passes 1 .. kSelectPasses - 1 of the select; the last stores the p99.
__global__ void __launch_bounds__(kDriftThreads)
    DriftSelectKernel(const unsigned long long* keys, long long n, int pass,
                      SelectWork* work, DriftTotals* totals) {
  SelectShared& sh = Shared<SelectShared>();
  ClearHistogram(sh.hist);
  __syncthreads();
  const unsigned long long prefix = work->prefix;
  const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i =
           static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += threads) {
    const unsigned long long key = keys[i];
    if (kmath::MatchesPrefix(key, prefix, pass)) {
      atomicAdd(&sh.hist[kmath::DigitOf(key, pass)], 1u);
    }
  }
  __syncthreads();
  FlushHistogram(sh.hist, work);
  if (!IsLastBlock(work, sh)) return;
  SelectPassDigit(pass, work, sh);
  if (pass == kSelectPasses - 1 && threadIdx.x == 0) {
    totals->p99_abs =
        totals->count > 0 ? kmath::BitsAsDouble(work->prefix) : 0.0;
  }
}

int64_t Align(int64_t x) { return (x + 255) / 256 * 256; }

}  // namespace

int64_t DriftScratchBytes(int64_t n) {
  return Align(static_cast<int64_t>(sizeof(unsigned long long)) * n) +
         Align(static_cast<int64_t>(sizeof(DriftTotals)) *
               kmath::kDriftMaxBlocks) +
         Align(sizeof(SelectWork));
}

absl::Status LaunchDrift(const DriftArgs& args, void* scratch,
                         DriftTotals* totals_device, cudaStream_t stream) {
  char* base = static_cast<char*>(scratch);
  auto* keys = reinterpret_cast<unsigned long long*>(base);
  auto* partials = reinterpret_cast<DriftTotals*>(
      base + Align(static_cast<int64_t>(sizeof(unsigned long long)) * args.n));
  auto* work = reinterpret_cast<SelectWork*>(
      reinterpret_cast<char*>(partials) +
      Align(static_cast<int64_t>(sizeof(DriftTotals)) *
            kmath::kDriftMaxBlocks));
  const int blocks = kmath::DriftBlocks(args.n);
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(work, 0, sizeof(SelectWork), stream));
  DriftStatsKernel<<<blocks, kDriftThreads, 0, stream>>>(args, keys, partials,
                                                         work, totals_device);
  ATTNAUDIT_RETURN_IF_ERROR(LaunchStatus("DriftStatsKernel"));
  for (int pass = 1; pass < kSelectPasses; ++pass) {
    DriftSelectKernel<<<blocks, kDriftThreads, 0, stream>>>(
        keys, args.n, pass, work, totals_device);
  }
  return LaunchStatus("DriftSelectKernel");
}

}  // namespace cuda_internal
}  // namespace attnaudit
