// ShardPages (kernels/shard_pages.h): the compact copy of a GPU's pages
// holds, at Compact(offset), the byte the pool holds at offset -- checked
// by building the copy as the CUDA replay does (the held pages in
// ascending order) from a pool of distinct bytes -- for random page sets
// with repeats, the empty set and the whole pool.
#include "kernels/shard_pages.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnaudit {
namespace {

TEST(ShardPagesTest, TheCompactCopyHoldsEveryHeldByteAtItsCompactOffset) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t num_pages = 1 + static_cast<int64_t>(rng() % 64);
    const int64_t page_bytes = 1 + static_cast<int64_t>(rng() % 40);
    std::vector<uint32_t> pool(static_cast<size_t>(num_pages * page_bytes));
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint32_t>(i);
    std::vector<int64_t> used;
    const int64_t draws = static_cast<int64_t>(rng() % (2 * num_pages + 1));
    std::vector<bool> held(static_cast<size_t>(num_pages), false);
    for (int64_t i = 0; i < draws; ++i) {
      const int64_t page = static_cast<int64_t>(rng() % num_pages);
      used.push_back(page);
      held[page] = true;
    }
    const ShardPages s = ShardPages::Of(used, num_pages);
    std::vector<uint32_t> copy;
    int64_t previous = -1;
    for (int64_t page : s.pages()) {
      ASSERT_GT(page, previous) << "ascending, each once";
      previous = page;
      for (int64_t b = 0; b < page_bytes; ++b) {
        copy.push_back(pool[page * page_bytes + b]);
      }
    }
    int64_t count = 0;
    for (int64_t page = 0; page < num_pages; ++page) {
      ASSERT_EQ(s.Holds(page), held[page]) << page;
      if (!held[page]) continue;
      ++count;
      for (int64_t b = 0; b < page_bytes; ++b) {
        const int64_t offset = page * page_bytes + b;
        const int64_t at = s.Compact(offset, page_bytes);
        ASSERT_GE(at, 0);
        ASSERT_LT(at, static_cast<int64_t>(copy.size()));
        ASSERT_EQ(copy[at], pool[offset]) << "page " << page << " byte " << b;
      }
    }
    EXPECT_EQ(static_cast<int64_t>(s.pages().size()), count);
    EXPECT_EQ(s.whole_pool(), count == num_pages);
    EXPECT_FALSE(s.Holds(-1));
    EXPECT_FALSE(s.Holds(num_pages));
  }
}

TEST(ShardPagesTest, EveryPageIsTheWholePool) {
  const ShardPages s = ShardPages::Of({3, 0, 2, 1, 2}, 4);
  EXPECT_TRUE(s.whole_pool());
  EXPECT_EQ(s.Compact(3 * 10 + 7, 10), 3 * 10 + 7);
  const ShardPages none = ShardPages::Of({}, 4);
  EXPECT_FALSE(none.whole_pool());
  EXPECT_TRUE(none.pages().empty());
}

}  // namespace
}  // namespace attnaudit
