// Test fixture for the fingerprint tests: the RL-Kernel decode acceptance
// fixture (docs/RL_KERNEL_HARNESS.md, "Acceptance fixture") in attnaudit's
// shared page pool, with the logical content fixed and the physical
// placement, layout and dtypes free. The snapshot comes from the shared
// builder (tests/unit/core/testing); its ResolvedLayout is written out by
// hand (no ValidateSnapshot), so these tests exercise core/fingerprint on
// its own.
//
// Logical content, the same as tests/python/rlkernel_fingerprint_oracle.py:
//   K[b][h][t][d] = 0.25 * i,  V[b][h][t][d] = 1 - 0.125 * i,
//   i = ((b * Hkv + h) * 6 + t) * D + d      (exact in f32, bf16 and f16)
//   position of token t = position_offset + position_stride * t.
// Row b's logical block i lives on pool page b * 3 + page_order[i]; spare
// pages follow, full of garbage, with positions -1. One decode query per
// row, at the row's last position; q is zero (fingerprints never read it).
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_FINGERPRINT_FIXTURE_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_FINGERPRINT_FIXTURE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {

struct FixtureOptions {
  int64_t batch = 2;
  int64_t kv_heads = 2;
  int64_t head_dim = 8;
  int64_t page_size = 2;
  std::vector<int64_t> seq_lens = {6, 6};
  std::vector<int> page_order = {0, 1, 2};  // per logical block
  KvLayout layout = KvLayout::kNHD;
  DType kv_dtype = DType::kF32;
  DType position_dtype = DType::kI64;  // every index tensor
  int64_t position_offset = 0;
  int64_t position_stride = 1;
  bool explicit_key_positions = false;  // else key_rope_positions absent
  int64_t spare_pages = 0;
  float garbage = 123.0f;  // K of inactive slots; V gets -4 * garbage
  std::vector<int32_t> owners = {0, 1, 0};  // per logical block
};

struct Fixture {
  Snapshot snapshot;
  ResolvedLayout layout;
};

inline double KValue(int64_t i) { return 0.25 * static_cast<double>(i); }
inline double VValue(int64_t i) { return 1.0 - 0.125 * static_cast<double>(i); }

// The fixture's logical content (see the file comment).
inline LogicalCase FixtureCase(const FixtureOptions& o) {
  constexpr int64_t kRowTokens = 6;  // the oracle's per-row cache length
  const int64_t H = o.kv_heads, D = o.head_dim;
  LogicalCase c;
  c.batch = o.batch;
  c.q_heads = 2 * H;
  c.kv_heads = H;
  c.head_dim = D;
  c.kv_dtype = o.kv_dtype;
  c.q.assign(static_cast<size_t>(o.batch * c.q_heads * D), 0.0);
  for (int64_t b = 0; b < o.batch; ++b) {
    const int64_t len = o.seq_lens[b];
    c.positions.emplace_back();
    c.k.emplace_back();
    c.v.emplace_back();
    for (int64_t t = 0; t < len; ++t) {
      c.positions[b].push_back(o.position_offset + o.position_stride * t);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const int64_t i = ((b * H + h) * kRowTokens + t) * D + d;
          c.k[b].push_back(KValue(i));
          c.v[b].push_back(VValue(i));
        }
      }
    }
    c.query_positions.push_back(c.positions[b].back());
  }
  c.rope.theta = 1e6;
  return c;
}

inline Fixture MakeFixture(const FixtureOptions& o) {
  constexpr int64_t kPagesPerRow = 3;
  PagingOptions p;
  p.page_size = o.page_size;
  p.layout = o.layout;
  p.index_dtype = o.position_dtype;
  p.key_rope_positions = o.explicit_key_positions;
  p.junk_value = o.garbage;
  p.junk_v_value = -4.0 * o.garbage;
  p.sharding = CpSharding::kExplicitOwners;
  p.cp_world_size = 2;
  Fixture f;
  ResolvedLayout& l = f.layout;
  int64_t named_pages = 0, row_blocks = 0;
  for (int64_t b = 0; b < o.batch; ++b) {
    const int64_t blocks = CeilDiv(o.seq_lens[b], o.page_size);
    row_blocks = std::max(row_blocks, blocks);
    l.seq_lens.push_back(o.seq_lens[b]);
    l.block_pages.emplace_back();
    l.block_owners.emplace_back(o.owners.begin(), o.owners.begin() + blocks);
    for (int64_t i = 0; i < blocks; ++i) {
      l.block_pages[b].push_back(
          static_cast<int32_t>(b * kPagesPerRow + o.page_order[i]));
      named_pages = std::max<int64_t>(named_pages, l.block_pages[b][i] + 1);
    }
  }
  p.page_of_block = l.block_pages;
  p.block_owners = l.block_owners;
  p.spare_pages = o.batch * kPagesPerRow + o.spare_pages - named_pages;
  p.extra_blocks = kPagesPerRow - row_blocks;
  f.snapshot = BuildSnapshot(FixtureCase(o), p);

  Snapshot& s = f.snapshot;
  s.prefix.enabled = true;
  s.prefix.key = "shared-prefix";
  s.prefix.length = 4;
  l.dims = DimsOf(s);
  return f;
}

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_FINGERPRINT_FIXTURE_H_
