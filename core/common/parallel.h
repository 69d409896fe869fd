// ParallelFor: runs fn(i) for i in [0, n) on up to `threads` threads (the
// calling thread included), handing out indices dynamically so uneven work
// items balance. Blocks until all items ran. fn must be thread-safe across
// distinct indices. threads <= 0 means std::thread::hardware_concurrency().
#ifndef ATTNAUDIT_CORE_COMMON_PARALLEL_H_
#define ATTNAUDIT_CORE_COMMON_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace attnaudit {

inline int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

template <typename Fn>
void ParallelFor(int64_t n, int threads, Fn&& fn) {
  const int workers =
      static_cast<int>(std::min<int64_t>(ResolveThreads(threads), n));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto body = [&]() {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (int w = 1; w < workers; ++w) pool.emplace_back(body);
  body();
  for (std::thread& t : pool) t.join();
}

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_COMMON_PARALLEL_H_
