// The pool of idle task arenas behind ParallelFor (parallel.h).
#include "core/common/parallel.h"

#include <cstdint>
#include <mutex>
#include <vector>

namespace attnaudit {
namespace parallel_internal {
namespace {

struct IdleArenas {
  std::mutex mu;
  std::vector<tbb::task_arena*> idle;  // each of its own concurrency
  int64_t created = 0;
};

// Leaked on purpose: a loop may still run on some thread while static
// destructors run at exit.
IdleArenas& Pool() {
  static IdleArenas* pool = new IdleArenas;
  return *pool;
}

}  // namespace

PooledArena::PooledArena(int workers) : arena_(nullptr) {
  IdleArenas& pool = Pool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    for (size_t i = 0; i < pool.idle.size(); ++i) {
      if (pool.idle[i]->max_concurrency() == workers) {
        arena_ = pool.idle[i];
        pool.idle[i] = pool.idle.back();
        pool.idle.pop_back();
        break;
      }
    }
  }
  if (arena_ == nullptr) {
    arena_ = new tbb::task_arena(workers);
    std::lock_guard<std::mutex> lock(pool.mu);
    ++pool.created;
  }
}

PooledArena::~PooledArena() {
  IdleArenas& pool = Pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.idle.push_back(arena_);
}

int64_t ArenasCreated() {
  IdleArenas& pool = Pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  return pool.created;
}

}  // namespace parallel_internal
}  // namespace attnaudit
