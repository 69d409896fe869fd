#include "kernels/shard_pages.h"

#include <cstddef>

namespace attnaudit {

ShardPages ShardPages::Of(const std::vector<int64_t>& used, int64_t num_pages) {
  ShardPages s;
  s.num_pages_ = num_pages;
  s.compact_of_.assign(static_cast<size_t>(num_pages), -1);
  for (int64_t page : used) s.compact_of_[page] = 0;
  for (int64_t page = 0; page < num_pages; ++page) {
    if (s.compact_of_[page] < 0) continue;
    s.compact_of_[page] = static_cast<int64_t>(s.pages_.size());
    s.pages_.push_back(page);
  }
  return s;
}

}  // namespace attnaudit
