#include "core/common/parallel_copy.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnaudit {
namespace {

// Every byte copied, none written outside [dst, dst + bytes), for sizes
// around the piece size and thread counts that do not divide them.
TEST(ParallelCopyTest, CopiesEveryByteAndNothingElse) {
  std::mt19937 rng(1);
  constexpr int64_t kGuard = 4096;
  for (int64_t bytes :
       {int64_t{0}, int64_t{1}, int64_t{63}, kParallelCopyPiece - 1,
        kParallelCopyPiece, 2 * kParallelCopyPiece + 1,
        3 * kParallelCopyPiece + 17, 10 * kParallelCopyPiece + 5}) {
    std::vector<uint8_t> src(static_cast<size_t>(bytes) + 1);
    for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
    for (int threads : {0, 1, 2, 3, 8}) {
      std::vector<uint8_t> dst(static_cast<size_t>(bytes + 2 * kGuard), 0xA5);
      // Off by one from the source's alignment, as a snapshot's tensors may
      // be.
      ParallelCopy(dst.data() + kGuard, src.data() + 1, bytes, threads);
      for (int64_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(dst[kGuard + i], src[i + 1])
            << "byte " << i << " of " << bytes << ", threads " << threads;
      }
      for (int64_t i = 0; i < kGuard; ++i) {
        ASSERT_EQ(dst[i], 0xA5) << "before, " << bytes << " bytes";
        ASSERT_EQ(dst[kGuard + bytes + i], 0xA5) << "after, " << bytes;
      }
    }
  }
}

}  // namespace
}  // namespace attnaudit
