// SnapshotSpec (snapshot_builder.h): quick valid snapshots, turned into a
// LogicalCase and PagingOptions for the one layout routine; and the
// helpers that read and edit a built snapshot.
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

// Physical page of every logical block of a spec: the shared prefix blocks
// first (one page each, used by every row), then each row's own blocks,
// all permuted together with the spare pages.
struct SpecPages {
  std::vector<std::vector<int32_t>> page_of;  // [B][blocks]
  int64_t num_pages = 0;
};

SpecPages PlaceSpecPages(const SnapshotSpec& spec) {
  const int64_t batch = static_cast<int64_t>(spec.seq_lens.size());
  std::vector<int64_t> row_blocks(static_cast<size_t>(batch));
  int64_t max_row_blocks = 0;
  for (int64_t b = 0; b < batch; ++b) {
    row_blocks[b] = CeilDiv(spec.seq_lens[b], spec.page_size);
    max_row_blocks = std::max(max_row_blocks, row_blocks[b]);
  }
  const int64_t shared =
      std::min<int64_t>(spec.shared_prefix_blocks, max_row_blocks);
  std::vector<std::vector<int64_t>> logical(static_cast<size_t>(batch));
  int64_t next = shared;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < row_blocks[b]; ++j) {
      logical[b].push_back(j < shared ? j : next++);
    }
  }
  SpecPages out;
  out.num_pages = next + spec.spare_pages;
  std::vector<int32_t> perm(static_cast<size_t>(out.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  if (spec.permute_pages) {
    TestRng rng(spec.seed * 31 + 7);
    for (int64_t i = out.num_pages - 1; i > 0; --i) {
      std::swap(perm[i], perm[rng.UniformInt(0, i)]);
    }
  }
  out.page_of.resize(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t l : logical[b]) out.page_of[b].push_back(perm[l]);
  }
  return out;
}

// Deterministic uniform content: q from `seed`, and a whole K (V) pool from
// seed + 1 (seed + 2) in physical order, of which each row reads its
// tokens; so rows sharing a page read the same values.
LogicalCase SpecContent(const SnapshotSpec& spec, const SpecPages& pages) {
  LogicalCase c;
  c.batch = static_cast<int64_t>(spec.seq_lens.size());
  c.queries = spec.queries;
  c.q_heads = spec.q_heads;
  c.kv_heads = spec.kv_heads;
  c.head_dim = spec.head_dim;
  c.q_dtype = spec.q_dtype;
  c.kv_dtype = spec.kv_dtype;
  const int64_t P = spec.page_size, Hkv = spec.kv_heads, D = spec.head_dim;
  TestRng q_rng(spec.seed);
  c.q.resize(static_cast<size_t>(c.batch * c.queries * c.q_heads * D));
  for (double& x : c.q) x = q_rng.Uniform(-1.0, 1.0);
  const int64_t pool = pages.num_pages * P * Hkv * D;
  std::vector<double> k_pool(static_cast<size_t>(pool));
  std::vector<double> v_pool(static_cast<size_t>(pool));
  TestRng k_rng(spec.seed + 1), v_rng(spec.seed + 2);
  for (double& x : k_pool) x = k_rng.Uniform(-1.0, 1.0);
  for (double& x : v_pool) x = v_rng.Uniform(-1.0, 1.0);
  const bool nhd = spec.kv_layout == KvLayout::kNHD;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t len = spec.seq_lens[b];
    c.k.emplace_back();
    c.v.emplace_back();
    c.positions.emplace_back();
    for (int64_t t = 0; t < len; ++t) {
      const int64_t page = pages.page_of[b][t / P], slot = t % P;
      c.positions[b].push_back(spec.position_offset + spec.position_stride * t);
      for (int64_t g = 0; g < Hkv; ++g) {
        const int64_t at = nhd ? ((page * P + slot) * Hkv + g) * D
                               : ((page * Hkv + g) * P + slot) * D;
        c.k[b].insert(c.k[b].end(), k_pool.begin() + at,
                      k_pool.begin() + at + D);
        c.v[b].insert(c.v[b].end(), v_pool.begin() + at,
                      v_pool.begin() + at + D);
      }
    }
    for (int64_t q = 0; q < spec.queries; ++q) {
      const int64_t i = len - spec.queries + q;
      c.query_positions.push_back(spec.query_positions.empty()
                                      ? spec.position_offset +
                                            spec.position_stride * i
                                      : spec.query_positions[b][q]);
    }
  }
  return c;
}

}  // namespace

Snapshot BuildSnapshot(const SnapshotSpec& spec) {
  const SpecPages pages = PlaceSpecPages(spec);
  PagingOptions o;
  o.page_size = spec.page_size;
  o.layout = spec.kv_layout;
  o.page_of_block = pages.page_of;
  int64_t named = 0;
  for (const auto& row : pages.page_of) {
    for (int32_t page : row) named = std::max<int64_t>(named, page + 1);
  }
  o.spare_pages = pages.num_pages - named;  // spares may sit anywhere
  o.extra_blocks = spec.extra_blocks;
  o.index_dtype = spec.index_dtype;
  o.key_rope_positions = spec.with_key_rope_positions;
  o.page_id_base = spec.with_page_ids ? 1000 : 0;
  return BuildSnapshot(SpecContent(spec, pages), o);
}

int64_t PageOfBlock(const Snapshot& s, int64_t b, int64_t j) {
  const int64_t entry = GetInt(s.block_table, b * s.block_table.dim(1) + j);
  if (!s.page_ids.present()) return entry;
  for (int64_t i = 0; i < s.page_ids.dim(0); ++i) {
    if (GetInt(s.page_ids, i) == entry) return i;
  }
  return -1;
}

int64_t KvIndex(const Snapshot& s, int64_t page, int64_t slot, int64_t head,
                int64_t d) {
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

void AddEngineOutputs(Snapshot* s, DType dtype) {
  const SnapshotDims d = DimsOf(*s);
  s->engine.out = Tensor(dtype, {d.batch, d.queries, d.q_heads, d.head_dim});
  s->engine.lse = Tensor(DType::kF32, {d.batch, d.queries, d.q_heads});
}

void AddLogprobInputs(Snapshot* s, int64_t vocab) {
  const SnapshotDims d = DimsOf(*s);
  s->lm_head = Tensor(DType::kF32, {vocab, d.q_heads * d.head_dim});
  FillUniform(&s->lm_head, 18);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < d.batch * d.queries; ++i) ids.push_back(i % vocab);
  s->selected_token_ids = MakeIntTensor(DType::kI32, {d.batch, d.queries}, ids);
  s->active_mask = MakeIntTensor(
      DType::kBool, {d.batch, d.queries},
      std::vector<int64_t>(static_cast<size_t>(d.batch * d.queries), 1));
}

void SetExplicitOwners(Snapshot* s, int64_t world,
                       const std::vector<std::vector<int64_t>>& owners) {
  const int64_t b = s->block_table.dim(0);
  const int64_t m = s->block_table.dim(1);
  std::vector<int64_t> flat(static_cast<size_t>(b * m), -1);
  for (int64_t i = 0; i < b; ++i) {
    for (size_t j = 0; j < owners[i].size(); ++j) {
      flat[i * m + j] = owners[i][j];
    }
  }
  s->cp.world_size = world;
  s->cp.sharding = CpSharding::kExplicitOwners;
  s->cp.block_owners = MakeIntTensor(DType::kI32, {b, m}, flat);
}

}  // namespace testing
}  // namespace attnaudit
