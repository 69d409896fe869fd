// Parallel loops for the numerical core, on oneTBB's process-wide worker
// pool: the threads are started once per process and reused by every audit,
// so no audit starts or joins a thread.
//
// ParallelFor(n, threads, fn) runs fn(i) for every i in [0, n) on up to
// `threads` threads (the calling thread takes part), handing out indices
// one at a time so uneven work items balance. It returns when every fn(i)
// has returned. fn must be safe to run concurrently for distinct indices;
// the order in which indices run is unspecified, so results must not depend
// on it (every caller writes index-owned outputs). Nested calls are allowed.
// threads <= 0 means all hardware threads; more than the hardware has are
// not used. fn must not throw.
//
// Thread-safe: any number of threads may call ParallelFor at once; their
// loops share the pool's workers (each limited to its own `threads`).
#ifndef ATTNAUDIT_CORE_COMMON_PARALLEL_H_
#define ATTNAUDIT_CORE_COMMON_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <thread>

#include "tbb/blocked_range.h"
#include "tbb/info.h"
#include "tbb/parallel_for.h"
#include "tbb/partitioner.h"
#include "tbb/task_arena.h"

namespace attnaudit {
namespace parallel_internal {

// An idle task arena of `workers` slots for one loop, from a process-wide
// pool, given back on destruction. Reusing arenas spares every loop the
// construction of one and its workers' first entry, a fixed cost that
// small audits would pay per loop; each caller holds its own, so
// concurrent loops never share one (a full arena would queue a loop
// behind another's). The pool grows to the most loops ever in flight at
// once and is never freed. Thread-safe.
class PooledArena {
 public:
  explicit PooledArena(int workers);
  ~PooledArena();
  PooledArena(const PooledArena&) = delete;
  PooledArena& operator=(const PooledArena&) = delete;

  tbb::task_arena& arena() { return *arena_; }

 private:
  tbb::task_arena* arena_;
};

// Arenas the pool has created since the process started (for tests).
int64_t ArenasCreated();

}  // namespace parallel_internal

inline int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

template <typename Fn>
void ParallelFor(int64_t n, int threads, Fn&& fn) {
  // More threads than the pool has (the hardware's) would only queue.
  const int workers = static_cast<int>(std::min<int64_t>(
      std::min(ResolveThreads(threads), tbb::info::default_concurrency()), n));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto loop = [&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, n, 1),
        [&](const tbb::blocked_range<int64_t>& range) {
          for (int64_t i = range.begin(); i != range.end(); ++i) fn(i);
        },
        tbb::simple_partitioner());
  };
  // An arena caps this loop's concurrency without creating threads: it
  // borrows workers from the process-wide pool.
  parallel_internal::PooledArena pooled(workers);
  pooled.arena().execute(loop);
}

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_COMMON_PARALLEL_H_
