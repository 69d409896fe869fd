#include "core/common/parallel.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace attnaudit {
namespace {

TEST(ParallelForTest, RunsEveryIndexExactlyOnceForAnyThreads) {
  for (int threads : {0, 1, 2, 3, 64}) {
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      for (auto& r : runs) r = 0;
      ParallelFor(n, threads, [&](int64_t i) { ++runs[i]; });
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(runs[i].load(), 1)
            << "index " << i << " of " << n << ", threads " << threads;
      }
    }
  }
}

// Also after a wider loop left a wider arena idle in the pool (with more
// than two hardware threads).
TEST(ParallelForTest, UsesNoMoreThreadsThanAsked) {
  ParallelFor(256, 0, [](int64_t) {});
  std::mutex mu;
  std::set<std::thread::id> seen;
  ParallelFor(256, 2, [&](int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(std::this_thread::get_id());
  });
  EXPECT_GE(seen.size(), 1u);
  EXPECT_LE(seen.size(), 2u);
}

TEST(ParallelForTest, NestedLoopsComplete) {
  std::atomic<int64_t> sum{0};
  ParallelFor(8, 2, [&](int64_t outer) {
    ParallelFor(100, 2, [&](int64_t inner) { sum += outer * 100 + inner; });
  });
  // The sum of 0 .. 799.
  EXPECT_EQ(sum.load(), 799 * 800 / 2);
}

// Callers on many threads at once: each loop sees all of its own indices
// and none of another's, whatever arenas they share over time.
TEST(ParallelForTest, ConcurrentCallersEachRunTheirWholeLoop) {
  constexpr int kCallers = 6;
  constexpr int kLoops = 50;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&sums, c] {
      for (int loop = 0; loop < kLoops; ++loop) {
        std::atomic<int64_t> sum{0};
        ParallelFor(64, 2, [&](int64_t i) { sum += i + c; });
        sums[c] += sum.load();
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(sums[c], kLoops * (63 * 64 / 2 + 64 * c)) << "caller " << c;
  }
}

// One loop after another reuses one arena: the pool does not grow with the
// number of loops.
TEST(ParallelForTest, SequentialLoopsReuseOneArena) {
  if (ResolveThreads(0) < 2) GTEST_SKIP() << "one hardware thread: no arena";
  ParallelFor(4, 2, [](int64_t) {});
  const int64_t before = parallel_internal::ArenasCreated();
  for (int loop = 0; loop < 100; ++loop) ParallelFor(4, 2, [](int64_t) {});
  EXPECT_EQ(parallel_internal::ArenasCreated(), before);
}

}  // namespace
}  // namespace attnaudit
