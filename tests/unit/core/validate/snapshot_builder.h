// Test helper: builds small, valid decode snapshots in attnaudit's layout
// (shared page pool, block table, slot positions) with deterministic
// content, plus small accessors to corrupt them field by field.
//
// Header-only so any test target can include it; copy it freely. Nothing in
// here checks validity: SnapshotSpec's defaults and the documented knobs
// produce snapshots that ValidateSnapshot accepts (the validate tests assert
// that), anything else is the caller's responsibility.
//
// Default (SnapshotSpec{}): the RL-Kernel harness decode fixture adapted to
// a pool: B=2, Sq=2, Hq=4, Hkv=2, D=8, P=2, kv_seq_lens [6, 6], positions
// 0..5 in every row, query positions [[4,5],[4,5]], fp32 q/K/V, i32
// indices, each row with its own 3 pages (6 pages), physically permuted.
// shared_prefix_blocks = 3 gives the harness's exact table: both rows on
// the same 3 pages.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_VALIDATE_SNAPSHOT_BUILDER_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_VALIDATE_SNAPSHOT_BUILDER_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "core/snapshot/snapshot.h"
#include "core/tensor/dtype.h"
#include "core/tensor/tensor.h"

namespace attnaudit {
namespace test {

// Deterministic 64-bit generator (SplitMix64): same bits on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  double Uniform() {
    return static_cast<double>(Next() >> 11) * 0x1.0p-52 - 1.0;
  }

 private:
  uint64_t state_;
};

inline Tensor IntTensor(DType dtype, std::vector<int64_t> shape,
                        const std::vector<int64_t>& values) {
  Tensor t(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kI64) {
      t.mutable_data<int64_t>()[i] = values[i];
    } else if (dtype == DType::kBool) {
      t.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(values[i]);
    } else {
      t.mutable_data<int32_t>()[i] = static_cast<int32_t>(values[i]);
    }
  }
  return t;
}

inline void SetInt(Tensor* t, int64_t flat, int64_t value) {
  if (t->dtype() == DType::kI64) {
    t->mutable_data<int64_t>()[flat] = value;
  } else if (t->dtype() == DType::kBool) {
    t->mutable_data<uint8_t>()[flat] = static_cast<uint8_t>(value);
  } else {
    t->mutable_data<int32_t>()[flat] = static_cast<int32_t>(value);
  }
}

inline int64_t GetInt(const Tensor& t, int64_t flat) { return t.IntAt(flat); }

// Floating tensor with the given values (rounded to dtype).
inline Tensor FloatTensor(DType dtype, std::vector<int64_t> shape,
                          const std::vector<double>& values) {
  Tensor t(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) {
    StoreFromDouble(t.mutable_raw(), dtype, static_cast<int64_t>(i), values[i]);
  }
  return t;
}

inline void SetFloat(Tensor* t, int64_t flat, double value) {
  StoreFromDouble(t->mutable_raw(), t->dtype(), flat, value);
}

// Fills every element with deterministic values in [-1, 1).
inline void FillUniform(Tensor* t, uint64_t seed) {
  SplitMix64 rng(seed);
  const int64_t n = t->num_elements();
  for (int64_t i = 0; i < n; ++i) SetFloat(t, i, rng.Uniform());
}

struct SnapshotSpec {
  std::vector<int64_t> seq_lens = {6, 6};  // one entry per row: B
  int64_t queries = 2;                     // Sq
  int64_t q_heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 8;
  int64_t page_size = 2;
  // Row b, logical token i has global position offset + stride * i.
  int64_t position_offset = 0;
  int64_t position_stride = 1;  // > 1: gapped positions (evicted cache)
  // Empty: each row queries its last `queries` tokens.
  std::vector<std::vector<int64_t>> query_positions;
  // The first this-many logical blocks of every row use the same pages
  // (prefix sharing across rows; positions agree by construction).
  int64_t shared_prefix_blocks = 0;
  int64_t spare_pages = 0;   // pages no row references (positions -1)
  int64_t extra_blocks = 0;  // block_table columns past the longest row
  bool permute_pages = true;
  uint64_t seed = 17;
  KvLayout kv_layout = KvLayout::kNHD;
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  DType index_dtype = DType::kI32;  // block_table, lengths, positions
  bool with_key_rope_positions = true;
  // page_ids[i] = 1000 + 7 * i and block_table holds those ids.
  bool with_page_ids = false;
};

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline Snapshot BuildSnapshot(const SnapshotSpec& spec) {
  const int64_t batch = static_cast<int64_t>(spec.seq_lens.size());
  const int64_t p = spec.page_size;
  std::vector<int64_t> row_blocks(static_cast<size_t>(batch));
  int64_t max_row_blocks = 0;
  for (int64_t b = 0; b < batch; ++b) {
    row_blocks[b] = CeilDiv(spec.seq_lens[b], p);
    max_row_blocks = std::max(max_row_blocks, row_blocks[b]);
  }
  const int64_t m = max_row_blocks + spec.extra_blocks;
  const int64_t shared =
      std::min<int64_t>(spec.shared_prefix_blocks, max_row_blocks);

  // Logical page numbers: shared blocks first, then each row's own blocks.
  std::vector<std::vector<int64_t>> logical(static_cast<size_t>(batch));
  int64_t next = shared;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < row_blocks[b]; ++j) {
      logical[b].push_back(j < shared ? j : next++);
    }
  }
  const int64_t num_pages = next + spec.spare_pages;
  std::vector<int64_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  if (spec.permute_pages) {
    SplitMix64 rng(spec.seed * 31 + 7);
    for (int64_t i = num_pages - 1; i > 0; --i) {
      std::swap(perm[i], perm[rng.Next() % static_cast<uint64_t>(i + 1)]);
    }
  }

  Snapshot s;
  s.kv_layout = spec.kv_layout;
  s.q =
      Tensor(spec.q_dtype, {batch, spec.queries, spec.q_heads, spec.head_dim});
  FillUniform(&s.q, spec.seed);
  const std::vector<int64_t> pool_shape =
      spec.kv_layout == KvLayout::kNHD
          ? std::vector<int64_t>{num_pages, p, spec.kv_heads, spec.head_dim}
          : std::vector<int64_t>{num_pages, spec.kv_heads, p, spec.head_dim};
  s.k_pages = Tensor(spec.kv_dtype, pool_shape);
  s.v_pages = Tensor(spec.kv_dtype, pool_shape);
  FillUniform(&s.k_pages, spec.seed + 1);
  FillUniform(&s.v_pages, spec.seed + 2);

  std::vector<int64_t> page_ids(static_cast<size_t>(num_pages));
  for (int64_t i = 0; i < num_pages; ++i) page_ids[i] = 1000 + 7 * i;
  if (spec.with_page_ids) {
    s.page_ids = IntTensor(spec.index_dtype, {num_pages}, page_ids);
  }

  std::vector<int64_t> table(static_cast<size_t>(batch * m), -1);
  std::vector<int64_t> slot_pos(static_cast<size_t>(num_pages * p), -1);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < row_blocks[b]; ++j) {
      const int64_t page = perm[logical[b][j]];
      table[b * m + j] = spec.with_page_ids ? page_ids[page] : page;
      for (int64_t k = 0; k < p && j * p + k < spec.seq_lens[b]; ++k) {
        slot_pos[page * p + k] =
            spec.position_offset + spec.position_stride * (j * p + k);
      }
    }
  }
  s.block_table = IntTensor(spec.index_dtype, {batch, m}, table);
  s.kv_seq_lens = IntTensor(spec.index_dtype, {batch}, spec.seq_lens);
  s.slot_positions = IntTensor(spec.index_dtype, {num_pages, p}, slot_pos);
  if (spec.with_key_rope_positions) s.key_rope_positions = s.slot_positions;

  std::vector<int64_t> qpos;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t q = 0; q < spec.queries; ++q) {
      if (!spec.query_positions.empty()) {
        qpos.push_back(spec.query_positions[b][q]);
      } else {
        const int64_t i = spec.seq_lens[b] - spec.queries + q;
        qpos.push_back(spec.position_offset + spec.position_stride * i);
      }
    }
  }
  s.query_positions = IntTensor(spec.index_dtype, {batch, spec.queries}, qpos);
  return s;
}

// Index into k_pages/v_pages of the page holding row b's logical block j
// (follows page_ids when present).
inline int64_t PageOfBlock(const Snapshot& s, int64_t b, int64_t j) {
  const int64_t entry = GetInt(s.block_table, b * s.block_table.dim(1) + j);
  if (!s.page_ids.present()) return entry;
  for (int64_t i = 0; i < s.page_ids.dim(0); ++i) {
    if (GetInt(s.page_ids, i) == entry) return i;
  }
  return -1;
}

// Flat element index of (page, slot, kv head, d) in k_pages/v_pages.
inline int64_t KvIndex(const Snapshot& s, int64_t page, int64_t slot,
                       int64_t head, int64_t d) {
  const SnapshotDims dims = DimsOf(s);
  if (s.kv_layout == KvLayout::kNHD) {
    return ((page * dims.page_size + slot) * dims.kv_heads + head) *
               dims.head_dim +
           d;
  }
  return ((page * dims.kv_heads + head) * dims.page_size + slot) *
             dims.head_dim +
         d;
}

// Engine out [B,Sq,Hq,D], lse [B,Sq,Hq] (zero-filled, `dtype` for out).
inline void AddEngineOutputs(Snapshot* s, DType dtype = DType::kF32) {
  const SnapshotDims d = DimsOf(*s);
  s->engine.out = Tensor(dtype, {d.batch, d.queries, d.q_heads, d.head_dim});
  s->engine.lse = Tensor(DType::kF32, {d.batch, d.queries, d.q_heads});
}

// lm_head [vocab, Hq*D], selected ids (b * Sq + q) % vocab, all-active mask.
inline void AddLogprobInputs(Snapshot* s, int64_t vocab = 11) {
  const SnapshotDims d = DimsOf(*s);
  s->lm_head = Tensor(DType::kF32, {vocab, d.q_heads * d.head_dim});
  FillUniform(&s->lm_head, 18);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < d.batch * d.queries; ++i) ids.push_back(i % vocab);
  s->selected_token_ids = IntTensor(DType::kI32, {d.batch, d.queries}, ids);
  s->active_mask = IntTensor(
      DType::kBool, {d.batch, d.queries},
      std::vector<int64_t>(static_cast<size_t>(d.batch * d.queries), 1));
}

// Explicit CP owners: owners[b][j] for the active blocks, -1 in the tail.
inline void SetExplicitOwners(Snapshot* s, int64_t world,
                              const std::vector<std::vector<int64_t>>& owners) {
  const int64_t b = s->block_table.dim(0);
  const int64_t m = s->block_table.dim(1);
  std::vector<int64_t> flat(static_cast<size_t>(b * m), -1);
  for (int64_t i = 0; i < b; ++i) {
    for (size_t j = 0; j < owners[i].size(); ++j)
      flat[i * m + j] = owners[i][j];
  }
  s->cp.world_size = world;
  s->cp.sharding = CpSharding::kExplicitOwners;
  s->cp.block_owners = IntTensor(DType::kI32, {b, m}, flat);
}

}  // namespace test
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_VALIDATE_SNAPSHOT_BUILDER_H_
