#include "tests/unit/kernels/simt.h"

#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace attnaudit {
namespace simt {
namespace {

constexpr int kWarpSize = 32;
constexpr size_t kStackBytes = size_t{256} << 10;

// A suspended fiber's (or the scheduler's) execution context. On x86-64 a
// switch saves the callee-saved registers on the running stack and swaps
// stack pointers (a few nanoseconds); elsewhere it is ucontext, whose
// swapcontext also saves the signal mask with a system call each time
// (about 100 times slower: a 600,000-element drift reduction is half a
// million block barriers).
#if defined(__x86_64__)
extern "C" void attnaudit_simt_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl attnaudit_simt_switch
  .type attnaudit_simt_switch, @function
attnaudit_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size attnaudit_simt_switch, .-attnaudit_simt_switch
)");

struct Context {
  void* sp = nullptr;
};

void SwitchTo(Context* save, const Context& load) {
  attnaudit_simt_switch(&save->sp, load.sp);
}

// A context that starts `entry` on the stack [base, base + bytes): six
// zero registers for the switch to pop, then entry's address for its ret,
// then a zero return address for entry itself (which never returns), so
// entry starts with the stack aligned as after a call.
void MakeContext(Context* c, char* base, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(base + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<void**>(top);
  *--slot = nullptr;
  *--slot = reinterpret_cast<void*>(entry);
  for (int i = 0; i < 6; ++i) *--slot = nullptr;
  c->sp = slot;
}
#else
struct Context {
  ucontext_t uc;
};

void SwitchTo(Context* save, const Context& load) {
  swapcontext(&save->uc, &load.uc);
}

void MakeContext(Context* c, char* base, size_t bytes, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = base;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

// Memory from mmap with a PROT_NONE guard page: below it for a stack
// (overflow faults), after it for shared memory (writes past the end
// fault).
class GuardedBytes {
 public:
  GuardedBytes(size_t bytes, bool guard_below) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    usable_ = (bytes + page - 1) / page * page;
    mapped_ = usable_ + page;
    void* m = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = m == MAP_FAILED ? nullptr : static_cast<char*>(m);
    if (base_ == nullptr) return;
    if (guard_below) {
      mprotect(base_, page, PROT_NONE);
      begin_ = base_ + page;
    } else {
      mprotect(base_ + usable_, page, PROT_NONE);
      // The bytes end where the guard starts.
      begin_ = base_ + usable_ - bytes;
    }
  }
  ~GuardedBytes() {
    if (base_ != nullptr) munmap(base_, mapped_);
  }
  GuardedBytes(const GuardedBytes&) = delete;
  GuardedBytes& operator=(const GuardedBytes&) = delete;

  char* begin() const { return begin_; }
  size_t usable() const { return usable_; }
  bool ok() const { return base_ != nullptr; }

 private:
  char* base_ = nullptr;
  char* begin_ = nullptr;
  size_t usable_ = 0;
  size_t mapped_ = 0;
};

// Under ThreadSanitizer (the race test's build) each fiber is a TSan
// thread and the barriers are its release/acquire pairs, so an access to
// shared (or global) memory that no barrier orders with another thread's
// is reported as a data race: the CPU's racecheck. Switching fibers does
// not synchronise them, and the scheduler's own bookkeeping is ignored.
#if defined(__SANITIZE_THREAD__)
void* RaceNewFiber() { return __tsan_create_fiber(0); }
void RaceFreeFiber(void* fiber) { __tsan_destroy_fiber(fiber); }
void* RaceCurrentFiber() { return __tsan_get_current_fiber(); }
void RaceSwitch(void* to) {
  __tsan_switch_to_fiber(to, __tsan_switch_to_fiber_no_sync);
}
void RaceRelease(void* sync) { __tsan_release(sync); }
void RaceAcquire(void* sync) { __tsan_acquire(sync); }
extern "C" void AnnotateIgnoreReadsBegin(const char*, int);
extern "C" void AnnotateIgnoreReadsEnd(const char*, int);
extern "C" void AnnotateIgnoreWritesBegin(const char*, int);
extern "C" void AnnotateIgnoreWritesEnd(const char*, int);
void RaceIgnoreBegin() {
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
}
void RaceIgnoreEnd() {
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
}
#else
void* RaceNewFiber() { return nullptr; }
void RaceFreeFiber(void*) {}
void* RaceCurrentFiber() { return nullptr; }
void RaceSwitch(void*) {}
void RaceRelease(void*) {}
void RaceAcquire(void*) {}
void RaceIgnoreBegin() {}
void RaceIgnoreEnd() {}
#endif

enum class Wait { kRunnable, kBlock, kWarp, kDone };

struct PendingCopy {
  void* dst;
  const void* src;
  size_t bytes;
  uint64_t batch;  // commits before it was issued
};

struct Fiber {
  Context context;
  std::unique_ptr<GuardedBytes> stack;
  Dim3 thread_idx;
  int warp = 0;
  int lane = 0;
  Wait wait = Wait::kRunnable;
  const char* op = "";
  std::vector<PendingCopy> copies;
  uint64_t commits = 0;
  void* race = nullptr;  // its TSan thread (race test builds)
};

struct LaunchState {
  Context scheduler;
  std::vector<Fiber> fibers;
  std::vector<uint64_t> slots;  // [warp][lane] values being exchanged
  Fiber* current = nullptr;
  Dim3 block_idx;
  Dim3 block_dim;
  Dim3 grid_dim;
  char* shared = nullptr;
  const std::function<void()>* body = nullptr;
  std::string error;  // the first failure
  // Race test builds: the scheduler's TSan thread, and the addresses the
  // barriers release and acquire (their bytes are never accessed).
  void* race_scheduler = nullptr;
  char block_sync = 0;
  std::vector<char> warp_sync;
};

// What a block's fibers acquire as they start and release as they end
// (race test builds): the host's writes before a block, and everything a
// block did before the next block or the host's reads.
char g_block_boundary = 0;

LaunchState* g_launch = nullptr;
ThreadOrder g_order = ThreadOrder::kFirstToLast;

Fiber& Current() { return *g_launch->current; }

void Fail(std::string why) {
  if (g_launch->error.empty()) g_launch->error = std::move(why);
}

void LandCopies(Fiber& f, uint64_t below_batch) {
  std::vector<PendingCopy> keep;
  for (const PendingCopy& c : f.copies) {
    if (c.batch < below_batch) {
      std::memcpy(c.dst, c.src, c.bytes);
    } else {
      keep.push_back(c);
    }
  }
  f.copies = std::move(keep);
}

// Where a barrier of this kind synchronises the running fiber's scope.
void* SyncOf(const Fiber& f, Wait wait) {
  return wait == Wait::kBlock ? &g_launch->block_sync
                              : &g_launch->warp_sync[f.warp];
}

void Suspend(Wait wait, const char* op) {
  Fiber& f = Current();
  f.wait = wait;
  f.op = op;
  RaceRelease(SyncOf(f, wait));
  RaceSwitch(g_launch->race_scheduler);
  SwitchTo(&f.context, g_launch->scheduler);
  RaceAcquire(SyncOf(f, wait));
}

// A fiber's whole life: the kernel, then back to the scheduler for good.
void FiberMain() {
  RaceAcquire(&g_block_boundary);
  (*g_launch->body)();
  Fiber& f = Current();
  // A copy never waited for still lands (as on a GPU).
  LandCopies(f, UINT64_MAX);
  f.wait = Wait::kDone;
  // Nothing of the launch's state is read after the last release.
  void* const race_scheduler = g_launch->race_scheduler;
  Context* const save = &f.context;
  const Context scheduler = g_launch->scheduler;
  RaceRelease(&g_block_boundary);
  RaceSwitch(race_scheduler);
  SwitchTo(save, scheduler);
}

void CheckMask(uint32_t mask, const char* op) {
  if (mask != 0xffffffffu) {
    Fail(absl::StrCat(op, " with a partial mask ", mask,
                      ": not modelled by the emulator"));
  }
}

std::string Where(const LaunchState& l, const Fiber& f) {
  return absl::StrCat("block (", l.block_idx.x, ",", l.block_idx.y, ",",
                      l.block_idx.z, ") thread ", f.thread_idx.x);
}

// Releases the barrier the waiting fibers can pass; false when none can
// (a deadlock, recorded as the error).
bool ReleaseBarriers(LaunchState& l) {
  bool all_at_block = true;
  bool any_live = false;
  for (const Fiber& f : l.fibers) {
    if (f.wait == Wait::kDone) continue;
    any_live = true;
    all_at_block &= f.wait == Wait::kBlock;
  }
  if (!any_live) return true;
  if (all_at_block) {
    for (Fiber& f : l.fibers) {
      if (f.wait == Wait::kBlock) f.wait = Wait::kRunnable;
    }
    return true;
  }
  bool released = false;
  const int warps =
      (static_cast<int>(l.fibers.size()) + kWarpSize - 1) / kWarpSize;
  for (int w = 0; w < warps; ++w) {
    const size_t first = static_cast<size_t>(w) * kWarpSize;
    const size_t last = std::min(l.fibers.size(), first + kWarpSize);
    bool all_at_warp = true;
    bool any_at_warp = false;
    for (size_t i = first; i < last; ++i) {
      all_at_warp &= l.fibers[i].wait == Wait::kWarp;
      any_at_warp |= l.fibers[i].wait == Wait::kWarp;
    }
    if (!any_at_warp) continue;
    if (!all_at_warp) {
      for (size_t i = first; i < last; ++i) {
        if (l.fibers[i].wait == Wait::kDone) {
          Fail(absl::StrCat(Where(l, l.fibers[i]), " exited while its warp ",
                            "waits at ", l.fibers[first].op));
          return false;
        }
      }
      continue;
    }
    for (size_t i = first + 1; i < last; ++i) {
      if (std::strcmp(l.fibers[i].op, l.fibers[first].op) != 0) {
        Fail(absl::StrCat("warp ", w, " diverged: ", Where(l, l.fibers[first]),
                          " at ", l.fibers[first].op, ", ",
                          Where(l, l.fibers[i]), " at ", l.fibers[i].op));
        return false;
      }
    }
    for (size_t i = first; i < last; ++i) l.fibers[i].wait = Wait::kRunnable;
    released = true;
  }
  if (!released) {
    std::string states;
    for (const Fiber& f : l.fibers) {
      if (f.wait == Wait::kDone || f.thread_idx.x % kWarpSize != 0) continue;
      absl::StrAppend(&states, " warp ", f.warp, ": ", f.op, ";");
    }
    Fail(absl::StrCat("deadlock in block (", l.block_idx.x, ",", l.block_idx.y,
                      ",", l.block_idx.z, "):", states));
  }
  return released;
}

// Runs one block to its end (or to the first failure).
void RunBlock(LaunchState& l) {
  for (Fiber& f : l.fibers) {
    f.wait = Wait::kRunnable;
    f.op = "";
    f.copies.clear();
    f.commits = 0;
    MakeContext(&f.context, f.stack->begin(), f.stack->usable(), FiberMain);
  }
  while (l.error.empty()) {
    bool any_live = false;
    const size_t n = l.fibers.size();
    for (size_t i = 0; i < n; ++i) {
      Fiber& f = l.fibers[g_order == ThreadOrder::kFirstToLast ? i : n - 1 - i];
      if (f.wait != Wait::kRunnable) continue;
      l.current = &f;
      RaceSwitch(f.race);
      SwitchTo(&l.scheduler, f.context);
      l.current = nullptr;
    }
    for (const Fiber& f : l.fibers) any_live |= f.wait != Wait::kDone;
    if (!any_live || !ReleaseBarriers(l)) return;
  }
}

}  // namespace

void SetThreadOrder(ThreadOrder order) { g_order = order; }

const Dim3& ThreadIdx() { return Current().thread_idx; }
const Dim3& BlockIdx() { return g_launch->block_idx; }
const Dim3& BlockDim() { return g_launch->block_dim; }
const Dim3& GridDim() { return g_launch->grid_dim; }
char* DynamicShared() { return g_launch->shared; }

void SyncThreads() { Suspend(Wait::kBlock, "__syncthreads"); }

void SyncWarp(uint32_t mask) {
  CheckMask(mask, "__syncwarp");
  Suspend(Wait::kWarp, "__syncwarp");
}

uint64_t ShuffleXorBits(uint32_t mask, uint64_t bits, int lane_mask) {
  CheckMask(mask, "__shfl_xor_sync");
  Fiber& f = Current();
  const size_t warp_base = static_cast<size_t>(f.warp) * kWarpSize;
  g_launch->slots[warp_base + f.lane] = bits;
  Suspend(Wait::kWarp, "__shfl_xor_sync");
  const int partner = f.lane ^ lane_mask;
  uint64_t got = bits;
  if (partner < 0 || partner >= kWarpSize ||
      warp_base + partner >= g_launch->fibers.size()) {
    Fail(absl::StrCat("__shfl_xor_sync: lane ", f.lane, " ^ ", lane_mask,
                      " is outside the warp"));
  } else {
    got = g_launch->slots[warp_base + partner];
  }
  // Nobody writes the slots again before every lane has read them.
  Suspend(Wait::kWarp, "__shfl_xor_sync (read)");
  return got;
}

uint32_t Ballot(uint32_t mask, bool predicate) {
  CheckMask(mask, "__ballot_sync");
  Fiber& f = Current();
  const size_t warp_base = static_cast<size_t>(f.warp) * kWarpSize;
  g_launch->slots[warp_base + f.lane] = predicate ? 1 : 0;
  Suspend(Wait::kWarp, "__ballot_sync");
  uint32_t out = 0;
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if (warp_base + lane < g_launch->fibers.size() &&
        g_launch->slots[warp_base + lane] != 0) {
      out |= 1u << lane;
    }
  }
  Suspend(Wait::kWarp, "__ballot_sync (read)");
  return out;
}

void PipelineCopy(void* dst, const void* src, size_t bytes) {
  Fiber& f = Current();
  f.copies.push_back({dst, src, bytes, f.commits});
}

void PipelineCommit() { ++Current().commits; }

void PipelineWaitPrior(size_t batches) {
  Fiber& f = Current();
  if (f.commits >= batches) LandCopies(f, f.commits - batches);
}

absl::Status RunGrid(cuda_internal::KernelGrid grid, int threads_per_block,
                     int64_t shared_bytes, const std::function<void()>& body) {
  if (g_launch != nullptr) {
    return absl::FailedPreconditionError("simt: a launch is already running");
  }
  if (threads_per_block <= 0 || threads_per_block > 1024 || shared_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("simt: bad launch: ", threads_per_block, " threads, ",
                     shared_bytes, " shared bytes"));
  }
  LaunchState l;
  l.body = &body;
  l.grid_dim = {grid.x, grid.y, grid.z};
  l.block_dim = {static_cast<uint32_t>(threads_per_block), 1, 1};
  l.slots.assign(static_cast<size_t>(threads_per_block + kWarpSize), 0);
  l.warp_sync.assign(static_cast<size_t>(threads_per_block / kWarpSize + 1), 0);
  l.race_scheduler = RaceCurrentFiber();
  l.fibers.resize(static_cast<size_t>(threads_per_block));
  for (int t = 0; t < threads_per_block; ++t) {
    Fiber& f = l.fibers[t];
    f.stack = std::make_unique<GuardedBytes>(kStackBytes, true);
    if (!f.stack->ok()) return absl::ResourceExhaustedError("simt: no stack");
    f.thread_idx = {static_cast<uint32_t>(t), 0, 0};
    f.warp = t / kWarpSize;
    f.lane = t % kWarpSize;
    f.race = RaceNewFiber();
  }
  GuardedBytes shared(static_cast<size_t>(std::max<int64_t>(shared_bytes, 16)),
                      false);
  if (!shared.ok()) return absl::ResourceExhaustedError("simt: no shared");
  l.shared = shared.begin();
  g_launch = &l;
  // The host's writes before the launch happen before every block.
  RaceRelease(&g_block_boundary);
  RaceIgnoreBegin();
  for (uint32_t z = 0; z < grid.z && l.error.empty(); ++z) {
    for (uint32_t y = 0; y < grid.y && l.error.empty(); ++y) {
      for (uint32_t x = 0; x < grid.x && l.error.empty(); ++x) {
        l.block_idx = {x, y, z};
        std::memset(l.shared, 0xFF, static_cast<size_t>(shared_bytes));
        RunBlock(l);
      }
    }
  }
  RaceIgnoreEnd();
  RaceAcquire(&g_block_boundary);
  for (Fiber& f : l.fibers) RaceFreeFiber(f.race);
  g_launch = nullptr;
  if (!l.error.empty()) return absl::InternalError("simt: " + l.error);
  return absl::OkStatus();
}

}  // namespace simt
}  // namespace attnaudit
