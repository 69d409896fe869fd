// Hostile sizes are rejected before anything proportional to them is
// allocated. This binary replaces the global operator new to record the
// largest single allocation made while validation runs (its own test
// executable, so the replacement affects nothing else).
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"
#include "tests/unit/core/validate/validate_test_util.h"

namespace {
std::atomic<bool> g_tracking{false};
std::atomic<size_t> g_largest{0};
}  // namespace

// GCC cannot see that these replacements pair malloc with free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
  if (g_tracking.load(std::memory_order_relaxed)) {
    size_t seen = g_largest.load(std::memory_order_relaxed);
    while (n > seen && !g_largest.compare_exchange_weak(seen, n)) {
    }
  }
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace attnaudit {
namespace testing {
namespace {

// Every single allocation during validation stays below this.
constexpr size_t kSmall = 64 * 1024;

absl::StatusOr<ResolvedLayout> TrackedValidate(const Snapshot& s,
                                               size_t* largest) {
  g_largest = 0;
  g_tracking = true;
  absl::StatusOr<ResolvedLayout> result = ValidateSnapshot(s);
  g_tracking = false;
  *largest = g_largest;
  return result;
}

TEST(HostileTest, ShapeWith2To62ElementsAndNoBytes) {
  Snapshot s = BuildSnapshot({});
  s.k_pages =
      Tensor(DType::kF32, {int64_t{1} << 31, int64_t{1} << 31, 1, 1}, "");
  size_t largest = 0;
  EXPECT_TRUE(IsInvalid(TrackedValidate(s, &largest), "k_pages", "limit"));
  EXPECT_LT(largest, kSmall);
}

TEST(HostileTest, OverflowingShape) {
  Snapshot s = BuildSnapshot({});
  s.q = Tensor(DType::kBF16,
               {int64_t{1} << 32, int64_t{1} << 32, int64_t{1} << 32, 8}, "");
  size_t largest = 0;
  EXPECT_TRUE(IsInvalid(TrackedValidate(s, &largest), "q", "overflows"));
  EXPECT_LT(largest, kSmall);
}

TEST(HostileTest, BytesDisagreeWithShape) {
  Snapshot s = BuildSnapshot({});
  s.slot_positions = Tensor(DType::kI64, {1 << 20, 4096}, std::string(8, 'x'));
  size_t largest = 0;
  EXPECT_TRUE(
      IsInvalid(TrackedValidate(s, &largest), "slot_positions", "bytes"));
  EXPECT_LT(largest, kSmall);
}

TEST(HostileTest, HugeVocabulary) {
  Snapshot s = BuildSnapshot({});
  AddLogprobInputs(&s);
  s.lm_head = Tensor(DType::kF32, {int64_t{1} << 40, 32}, "");
  size_t largest = 0;
  EXPECT_TRUE(IsInvalid(TrackedValidate(s, &largest), "lm_head", "limit"));
  EXPECT_LT(largest, kSmall);
}

TEST(HostileTest, HugeSequenceLength) {
  Snapshot s = BuildSnapshot({});
  s.kv_seq_lens = MakeIntTensor(DType::kI64, {2}, {int64_t{1} << 62, 6});
  size_t largest = 0;
  EXPECT_TRUE(IsInvalid(TrackedValidate(s, &largest), "kv_seq_lens[0]",
                        "is outside [1, 6]"));
  EXPECT_LT(largest, kSmall);
}

TEST(HostileTest, HugePageIndexAndPositions) {
  SnapshotSpec spec;
  spec.index_dtype = DType::kI64;
  Snapshot s = BuildSnapshot(spec);
  SetInt(&s.block_table, 4, int64_t{1} << 40);
  size_t largest = 0;
  EXPECT_TRUE(IsInvalid(TrackedValidate(s, &largest), "block_table[1][1]",
                        "out of range"));
  EXPECT_LT(largest, kSmall);

  Snapshot t = BuildSnapshot(spec);
  SetInt(&t.query_positions, 3, int64_t{1} << 62);
  EXPECT_TRUE(IsInvalid(TrackedValidate(t, &largest), "query_positions[1][1]",
                        "present"));
  EXPECT_LT(largest, kSmall);
}

TEST(HostileTest, HugeWorldSize) {
  Snapshot s = BuildSnapshot({});
  s.cp.world_size = int64_t{1} << 40;
  s.cp.sharding = CpSharding::kPageInterleaved;
  size_t largest = 0;
  EXPECT_TRUE(
      IsInvalid(TrackedValidate(s, &largest), "cp.world_size", "limits"));
  EXPECT_LT(largest, kSmall);
}

// The block table's M is checked against limits.max_blocks before the
// per-page and per-row structures are allocated.
TEST(HostileTest, TooManyBlocksRejectedBeforeRowWork) {
  Snapshot s = BuildSnapshot({});
  const int64_t m = (1 << 20) + 1;
  s.block_table = Tensor(DType::kI32, {2, m});  // allocated here, not tracked
  size_t largest = 0;
  EXPECT_TRUE(IsInvalid(TrackedValidate(s, &largest), "block_table",
                        "limits.max_blocks"));
  EXPECT_LT(largest, kSmall);
}

// A valid snapshot's validation allocates O(pages * page size + B * M), not
// O(KV bytes): here k_pages and v_pages are 10 MiB each and no single
// allocation comes near that.
TEST(HostileTest, ValidSnapshotAllocatesLittle) {
  SnapshotSpec spec;
  spec.head_dim = 128;
  spec.q_heads = 8;
  spec.kv_heads = 8;
  spec.page_size = 64;
  spec.seq_lens = {1000, 1500};
  Snapshot s = BuildSnapshot(spec);
  size_t largest = 0;
  EXPECT_TRUE(IsValid(TrackedValidate(s, &largest)));
  EXPECT_LT(largest, kSmall);
  // The hook sees validation's own allocations (at least the active-slot
  // map of 40 pages * 64 slots), so the bounds above are not vacuous.
  EXPECT_GE(largest, size_t{40 * 64});
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
