// Test fixture for the fingerprint tests: the RL-Kernel decode acceptance
// fixture (shared/reference/seed1_rl_kernel.md §4) in attnaudit's shared
// page pool, with the logical content fixed and the physical placement,
// layout and dtypes free. The snapshot and its ResolvedLayout are built by
// hand (no ValidateSnapshot), so these tests depend on core/fingerprint only.
//
// Logical content, the same as tests/python/rlkernel_fingerprint_oracle.py:
//   K[b][h][t][d] = 0.25 * i,  V[b][h][t][d] = 1 - 0.125 * i,
//   i = ((b * Hkv + h) * 6 + t) * D + d      (exact in f32, bf16 and f16)
//   position of token t = position_offset + position_stride * t.
// Row b's logical block i lives on pool page b * 3 + page_order[i]; spare
// pages follow, full of garbage, with positions -1.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_FINGERPRINT_FIXTURE_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_FINGERPRINT_FIXTURE_H_

#include <cstdint>
#include <vector>

#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"

namespace attnaudit {
namespace testing_fixture {

struct FixtureOptions {
  int64_t batch = 2;
  int64_t kv_heads = 2;
  int64_t head_dim = 8;
  int64_t page_size = 2;
  std::vector<int64_t> seq_lens = {6, 6};
  std::vector<int> page_order = {0, 1, 2};  // per logical block
  KvLayout layout = KvLayout::kNHD;
  DType kv_dtype = DType::kF32;
  DType position_dtype = DType::kI64;
  int64_t position_offset = 0;
  int64_t position_stride = 1;
  bool explicit_key_positions = false;  // else key_rope_positions absent
  int64_t spare_pages = 0;
  float garbage = 123.0f;                   // value of inactive slots
  std::vector<int32_t> owners = {0, 1, 0};  // per logical block
};

struct Fixture {
  Snapshot snapshot;
  ResolvedLayout layout;
};

inline double KValue(int64_t i) { return 0.25 * static_cast<double>(i); }
inline double VValue(int64_t i) { return 1.0 - 0.125 * static_cast<double>(i); }

inline Fixture MakeFixture(const FixtureOptions& o) {
  constexpr int64_t kRowTokens = 6;  // the oracle's per-row cache length
  const int64_t pages_per_row = 3;
  const int64_t num_pages = o.batch * pages_per_row + o.spare_pages;
  const int64_t P = o.page_size, H = o.kv_heads, D = o.head_dim;
  const bool hnd = o.layout == KvLayout::kHND;
  const std::vector<int64_t> pool_shape =
      hnd ? std::vector<int64_t>{num_pages, H, P, D}
          : std::vector<int64_t>{num_pages, P, H, D};
  Fixture f;
  Snapshot& s = f.snapshot;
  s.kv_layout = o.layout;
  s.k_pages = Tensor(o.kv_dtype, pool_shape);
  s.v_pages = Tensor(o.kv_dtype, pool_shape);
  const int64_t pool_elements = s.k_pages.num_elements();
  for (int64_t e = 0; e < pool_elements; ++e) {
    StoreFromFloat(s.k_pages.mutable_raw(), o.kv_dtype, e, o.garbage);
    StoreFromFloat(s.v_pages.mutable_raw(), o.kv_dtype, e, -4 * o.garbage);
  }
  s.slot_positions = Tensor(o.position_dtype, {num_pages, P});
  for (int64_t e = 0; e < num_pages * P; ++e) {
    if (o.position_dtype == DType::kI32) {
      s.slot_positions.mutable_data<int32_t>()[e] = -1;
    } else {
      s.slot_positions.mutable_data<int64_t>()[e] = -1;
    }
  }
  const int64_t max_blocks = pages_per_row;
  s.block_table = Tensor(DType::kI32, {o.batch, max_blocks});
  s.kv_seq_lens = Tensor(DType::kI64, {o.batch});
  s.query_positions = Tensor(DType::kI64, {o.batch, 1});
  s.q = Tensor(DType::kF32, {o.batch, 1, 2 * H, D});

  ResolvedLayout& l = f.layout;
  for (int64_t b = 0; b < o.batch; ++b) {
    const int64_t len = o.seq_lens[b];
    const int64_t blocks = (len + P - 1) / P;
    l.seq_lens.push_back(len);
    l.block_pages.emplace_back();
    l.block_owners.emplace_back();
    s.kv_seq_lens.mutable_data<int64_t>()[b] = len;
    for (int64_t i = 0; i < max_blocks; ++i) {
      const int32_t page =
          i < blocks ? static_cast<int32_t>(b * pages_per_row + o.page_order[i])
                     : -1;
      s.block_table.mutable_data<int32_t>()[b * max_blocks + i] = page;
      if (i < blocks) {
        l.block_pages[b].push_back(page);
        l.block_owners[b].push_back(o.owners[i]);
      }
    }
    for (int64_t t = 0; t < len; ++t) {
      const int64_t page = l.block_pages[b][t / P], slot = t % P;
      const int64_t position = o.position_offset + o.position_stride * t;
      if (o.position_dtype == DType::kI32) {
        s.slot_positions.mutable_data<int32_t>()[page * P + slot] =
            static_cast<int32_t>(position);
      } else {
        s.slot_positions.mutable_data<int64_t>()[page * P + slot] = position;
      }
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          const int64_t i = ((b * H + h) * kRowTokens + t) * D + d;
          const int64_t e = hnd ? ((page * H + h) * P + slot) * D + d
                                : ((page * P + slot) * H + h) * D + d;
          StoreFromDouble(s.k_pages.mutable_raw(), o.kv_dtype, e, KValue(i));
          StoreFromDouble(s.v_pages.mutable_raw(), o.kv_dtype, e, VValue(i));
        }
      }
    }
    s.query_positions.mutable_data<int64_t>()[b] =
        o.position_offset + o.position_stride * (len - 1);
  }
  if (o.explicit_key_positions) s.key_rope_positions = s.slot_positions;

  s.rope.theta = 1e6;
  s.cp.world_size = 2;
  s.cp.sharding = CpSharding::kExplicitOwners;
  s.prefix.enabled = true;
  s.prefix.key = "shared-prefix";
  s.prefix.length = 4;

  l.dims.batch = o.batch;
  l.dims.queries = 1;
  l.dims.q_heads = 2 * H;
  l.dims.kv_heads = H;
  l.dims.head_dim = D;
  l.dims.num_pages = num_pages;
  l.dims.page_size = P;
  l.dims.max_blocks = max_blocks;
  return f;
}

// Pool element index of K/V [page][slot][head][d] for the snapshot's layout.
inline int64_t PoolIndex(const Snapshot& s, const ResolvedLayout& l,
                         int64_t page, int64_t slot, int64_t h, int64_t d) {
  const SnapshotDims& m = l.dims;
  return s.kv_layout == KvLayout::kHND
             ? ((page * m.kv_heads + h) * m.page_size + slot) * m.head_dim + d
             : ((page * m.page_size + slot) * m.kv_heads + h) * m.head_dim + d;
}

}  // namespace testing_fixture
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_FINGERPRINT_FIXTURE_H_
