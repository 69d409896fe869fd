// The SIMT emulator (simt.h) on small kernels written in CUDA's spelling:
// the warp operations' results, and the faults it must report rather than
// hide -- divergent warp operations, a lane that leaves its warp waiting,
// a barrier some threads never reach, a stage read before its copy landed,
// shared memory no thread wrote.
#include "tests/unit/kernels/simt.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
// CUDA's spellings, last.
#include "tests/unit/kernels/simt_cuda_builtins.h"

namespace attnaudit {
namespace simt {
namespace {

cuda_internal::KernelGrid Blocks(uint32_t x) {
  cuda_internal::KernelGrid g;
  g.x = x;
  return g;
}

TEST(Simt, ShufflesAndBallotsExchangeWithinTheWarp) {
  std::vector<int> got(64, -1);
  std::vector<unsigned> ballots(64, 0);
  ASSERT_TRUE(RunGrid(Blocks(1), 64, 0, [&] {
                const int t = static_cast<int>(threadIdx.x);
                got[t] = __shfl_xor_sync(0xffffffffu, t * 10, 5);
                ballots[t] = __ballot_sync(0xffffffffu, t % 3 == 0);
              }).ok());
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(got[t], (t ^ 5) * 10) << t;
    unsigned want = 0;
    for (int lane = 0; lane < 32; ++lane) {
      if ((t / 32 * 32 + lane) % 3 == 0) want |= 1u << lane;
    }
    EXPECT_EQ(ballots[t], want) << t;
  }
}

TEST(Simt, ABarrierOrdersWritesBeforeReadsInEitherThreadOrder) {
  for (ThreadOrder order :
       {ThreadOrder::kFirstToLast, ThreadOrder::kLastToFirst}) {
    SetThreadOrder(order);
    std::vector<int> got(256, -1);
    ASSERT_TRUE(RunGrid(Blocks(2), 256, 256 * 4, [&] {
                  int* s = reinterpret_cast<int*>(DynamicShared());
                  const int t = static_cast<int>(threadIdx.x);
                  s[t] = t + static_cast<int>(blockIdx.x);
                  __syncthreads();
                  got[t] = s[255 - t];
                }).ok());
    for (int t = 0; t < 256; ++t) EXPECT_EQ(got[t], 255 - t + 1) << t;
  }
  SetThreadOrder(ThreadOrder::kFirstToLast);
}

// Without the barrier, one of the two orders reads before the write (what
// the attention tests rely on to show a missing barrier).
TEST(Simt, AMissingBarrierShowsInOneOfTheOrders) {
  int stale = 0;
  for (ThreadOrder order :
       {ThreadOrder::kFirstToLast, ThreadOrder::kLastToFirst}) {
    SetThreadOrder(order);
    ASSERT_TRUE(RunGrid(Blocks(1), 64, 64 * 4, [&] {
                  int* s = reinterpret_cast<int*>(DynamicShared());
                  const int t = static_cast<int>(threadIdx.x);
                  s[t] = t;
                  if (s[63 - t] != 63 - t) ++stale;
                }).ok());
  }
  SetThreadOrder(ThreadOrder::kFirstToLast);
  EXPECT_GT(stale, 0);
}

TEST(Simt, DivergentWarpOperationsAreAnError) {
  const absl::Status s = RunGrid(Blocks(1), 32, 0, [] {
    if (threadIdx.x < 16) {
      __syncwarp();
    } else {
      (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
    }
  });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("diverged"), std::string::npos) << s;
}

TEST(Simt, ALaneThatExitsWhileItsWarpWaitsIsAnError) {
  const absl::Status s = RunGrid(Blocks(1), 32, 0, [] {
    if (threadIdx.x == 7) return;
    __syncwarp();
  });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("exited"), std::string::npos) << s;
}

TEST(Simt, ABarrierSomeThreadsNeverReachIsADeadlockNotAHang) {
  // Half of warp 1 waits for the block, the other half for its warp.
  const absl::Status s = RunGrid(Blocks(1), 64, 0, [] {
    if (threadIdx.x < 48) {
      __syncthreads();
    } else {
      __syncwarp();
    }
  });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("deadlock"), std::string::npos) << s;
}

TEST(Simt, PartialMasksAreRefused) {
  const absl::Status s =
      RunGrid(Blocks(1), 32, 0, [] { __syncwarp(0x0000ffffu); });
  EXPECT_FALSE(s.ok());
}

TEST(Simt, ACopyLandsAtTheWaitThatCoversIt) {
  std::vector<int> before(32, -1);
  std::vector<int> after(32, -1);
  std::vector<int> global(32);
  for (int i = 0; i < 32; ++i) global[i] = 1000 + i;
  ASSERT_TRUE(RunGrid(Blocks(1), 32, 32 * 4, [&] {
                int* s = reinterpret_cast<int*>(DynamicShared());
                const int t = static_cast<int>(threadIdx.x);
                s[t] = -7;
                __pipeline_memcpy_async(s + t, &global[t], 4);
                __pipeline_commit();
                before[t] = s[t];
                __pipeline_wait_prior(0);
                after[t] = s[t];
              }).ok());
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(before[t], -7) << t;
    EXPECT_EQ(after[t], 1000 + t) << t;
  }
}

TEST(Simt, SharedMemoryStartsAsNaNBytes) {
  std::vector<float> got(8, 0.0f);
  ASSERT_TRUE(RunGrid(Blocks(1), 8, 64, [&] {
                got[threadIdx.x] =
                    reinterpret_cast<float*>(DynamicShared())[threadIdx.x];
              }).ok());
  for (float x : got) EXPECT_TRUE(x != x);
}

}  // namespace
}  // namespace simt
}  // namespace attnaudit
