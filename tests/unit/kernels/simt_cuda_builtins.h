// CUDA's spellings over the SIMT emulator (simt.h), for the one test
// translation unit that includes kernel source (kernels/*.inc) to run it on
// the CPU: the execution-space keywords vanish, threadIdx and friends are
// the running fiber's, and the barriers, warp operations, pipeline copies
// and atomics are the emulator's. Include it last, right before the
// kernel source; it defines macros with CUDA's names.
#ifndef ATTNAUDIT_TESTS_UNIT_KERNELS_SIMT_CUDA_BUILTINS_H_
#define ATTNAUDIT_TESTS_UNIT_KERNELS_SIMT_CUDA_BUILTINS_H_

#if defined(__CUDACC__)
#error "simt_cuda_builtins.h is for host compilers only"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tests/unit/kernels/simt.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// A block's static shared memory: one object for all threads; blocks run
// one after another, so one object serves them all.
#define __shared__ static

#define threadIdx (::attnaudit::simt::ThreadIdx())
#define blockIdx (::attnaudit::simt::BlockIdx())
#define blockDim (::attnaudit::simt::BlockDim())
#define gridDim (::attnaudit::simt::GridDim())

#define ATTNAUDIT_DYNAMIC_SHARED_BYTES(name) \
  char* const name = ::attnaudit::simt::DynamicShared()

struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

inline float4 make_float4(float x, float y, float z, float w) {
  return float4{x, y, z, w};
}

inline void __syncthreads() { ::attnaudit::simt::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::attnaudit::simt::SyncWarp(mask);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a register's worth");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = ::attnaudit::simt::ShuffleXorBits(mask, bits, lane_mask);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::attnaudit::simt::Ballot(mask, predicate != 0);
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }

// Atomic, for the race test's build (one fiber runs at a time anyway).
inline int atomicOr(int* address, int value) {
  return __atomic_fetch_or(address, value, __ATOMIC_RELAXED);
}

inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

// Memory is coherent on one CPU thread: fences are no-ops and a load that
// bypasses L1 is a load.
inline void __threadfence() {}
template <typename T>
T __ldcg(const T* address) {
  return *address;
}

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes) {
  ::attnaudit::simt::PipelineCopy(dst, src, bytes);
}
inline void __pipeline_commit() { ::attnaudit::simt::PipelineCommit(); }
inline void __pipeline_wait_prior(size_t batches) {
  ::attnaudit::simt::PipelineWaitPrior(batches);
}

// CUDA's min for device code.
template <typename T>
T min(T a, T b) {
  return b < a ? b : a;
}

#endif  // ATTNAUDIT_TESTS_UNIT_KERNELS_SIMT_CUDA_BUILTINS_H_
