// ShardPages: the pages of a paged KV pool that one GPU of a CP ring reads,
// and where each lands in the compact copy the GPU uploads instead of the
// whole pool. Rank k of a ring fills its first chunks from its own shard
// of the cache (the pages it owns) and receives every other chunk from its
// neighbour, so a GPU needs only its ranks' pages: a gang of G GPUs
// uploads the pool once in all, not G times.
//
// Compact page i is pool page pages()[i] (ascending); a byte at `offset`
// in pool page offset / page_bytes sits at Compact(offset, page_bytes) in
// the copy. Plain C++ with no CUDA include, so that it is built and tested
// on every machine (tests/unit/kernels/shard_pages_test.cc); the CUDA CP
// replay (kernels/cuda_cp_replay.cc) builds the copy and remaps its fill
// offsets with it. Immutable after Of(); thread-safe to read.
#ifndef ATTNAUDIT_KERNELS_SHARD_PAGES_H_
#define ATTNAUDIT_KERNELS_SHARD_PAGES_H_

#include <cstdint>
#include <vector>

namespace attnaudit {

class ShardPages {
 public:
  // The pages `used` names (any order, repeats allowed; each in [0,
  // num_pages)) of a pool of num_pages pages.
  static ShardPages Of(const std::vector<int64_t>& used, int64_t num_pages);

  // Ascending, each once.
  const std::vector<int64_t>& pages() const { return pages_; }
  // Every page of the pool: the pool itself is the copy.
  bool whole_pool() const {
    return static_cast<int64_t>(pages_.size()) == num_pages_;
  }
  bool Holds(int64_t page) const {
    return page >= 0 && page < num_pages_ && compact_of_[page] >= 0;
  }
  // The offset in the copy of pool byte `offset` (its page must be held;
  // page_bytes: the bytes of one page of the array the offset is into).
  int64_t Compact(int64_t offset, int64_t page_bytes) const {
    const int64_t page = offset / page_bytes;
    return compact_of_[page] * page_bytes + offset % page_bytes;
  }

 private:
  int64_t num_pages_ = 0;
  std::vector<int64_t> pages_;
  std::vector<int64_t> compact_of_;  // pool page -> compact page, or -1
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_SHARD_PAGES_H_
