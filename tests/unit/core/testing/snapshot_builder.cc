// The snapshot builder of snapshot_builder.h: the generator, tensor
// helpers and the page-pool layout (BuildSnapshot).
#include "tests/unit/core/testing/snapshot_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <utility>

namespace attnaudit {
namespace testutil {
namespace {

// Test-construction errors are bugs in the test itself: fail loudly.
void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "snapshot_builder: %s\n", what);
    std::abort();
  }
}

int64_t Blocks(int64_t len, int64_t page_size) {
  return (len + page_size - 1) / page_size;
}

int64_t PoolOffset(KvLayout layout, int64_t page_size, int64_t kv_heads,
                   int64_t head_dim, int64_t page, int64_t slot, int64_t head) {
  if (layout == KvLayout::kNHD) {
    return ((page * page_size + slot) * kv_heads + head) * head_dim;
  }
  return ((page * kv_heads + head) * page_size + slot) * head_dim;
}

double RoundValue(double x, DType dtype) {
  if (dtype == DType::kF64) return x;
  return RoundToDType(static_cast<float>(x), dtype);
}

}  // namespace

uint64_t TestRng::Next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double TestRng::Uniform(double lo, double hi) {
  const double unit = static_cast<double>(Next() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * unit;
}

int64_t TestRng::UniformInt(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(Next() % span);
}

double TestRng::Normal() {
  // Box-Muller; 1 - U keeps the log argument in (0, 1].
  const double u1 = 1.0 - Uniform(0.0, 1.0);
  const double u2 = Uniform(0.0, 1.0);
  return std::sqrt(-2.0 * std::log(u1)) *
         std::cos(6.283185307179586476925 * u2);
}

int64_t LogicalCase::MaxSeqLen() const {
  int64_t m = 0;
  for (const auto& p : positions) m = std::max<int64_t>(m, p.size());
  return m;
}

double LogicalCase::EffectiveScale() const {
  return softmax_scale > 0 ? softmax_scale
                           : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

void RoundTo(std::vector<double>* values, DType dtype) {
  for (double& x : *values) x = RoundValue(x, dtype);
}

Tensor MakeFloatTensor(DType dtype, std::vector<int64_t> shape,
                       const std::vector<double>& values) {
  Tensor t(dtype, std::move(shape));
  Require(static_cast<int64_t>(values.size()) == t.num_elements(),
          "MakeFloatTensor: value count does not match the shape");
  for (size_t i = 0; i < values.size(); ++i) {
    StoreFromDouble(t.mutable_raw(), dtype, static_cast<int64_t>(i), values[i]);
  }
  return t;
}

Tensor MakeIntTensor(DType dtype, std::vector<int64_t> shape,
                     const std::vector<int64_t>& values) {
  Tensor t(dtype, std::move(shape));
  Require(static_cast<int64_t>(values.size()) == t.num_elements(),
          "MakeIntTensor: value count does not match the shape");
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kI32) {
      t.mutable_data<int32_t>()[i] = static_cast<int32_t>(values[i]);
    } else {
      Require(dtype == DType::kI64, "MakeIntTensor: dtype must be i32/i64");
      t.mutable_data<int64_t>()[i] = values[i];
    }
  }
  return t;
}

Tensor MakeBoolTensor(std::vector<int64_t> shape,
                      const std::vector<bool>& values) {
  Tensor t(DType::kBool, std::move(shape));
  Require(static_cast<int64_t>(values.size()) == t.num_elements(),
          "MakeBoolTensor: value count does not match the shape");
  for (size_t i = 0; i < values.size(); ++i) {
    t.mutable_data<uint8_t>()[i] = values[i] ? 1 : 0;
  }
  return t;
}

std::vector<double> ToDoubles(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.num_elements()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.DoubleAt(static_cast<int64_t>(i));
  }
  return out;
}

Snapshot BuildSnapshot(const LogicalCase& c, const PagingOptions& o) {
  const int64_t B = c.batch, Sq = c.queries, Hq = c.q_heads, Hkv = c.kv_heads,
                D = c.head_dim, P = o.page_size;
  Require(P > 0, "page_size must be positive");
  Require(static_cast<int64_t>(c.positions.size()) == B &&
              static_cast<int64_t>(c.k.size()) == B &&
              static_cast<int64_t>(c.v.size()) == B,
          "positions/k/v need one entry per row");
  Require(static_cast<int64_t>(c.q.size()) == B * Sq * Hq * D,
          "q has the wrong size");
  Require(static_cast<int64_t>(c.query_positions.size()) == B * Sq,
          "query_positions has the wrong size");

  // Physical page of every logical block.
  std::vector<std::vector<int32_t>> page_of(static_cast<size_t>(B));
  int64_t referenced = 0;
  int64_t max_blocks = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = Blocks(c.SeqLen(b), P);
    referenced += n;
    max_blocks = std::max(max_blocks, n);
  }
  int64_t num_pages = 0;
  if (!o.page_of_block.empty()) {
    Require(static_cast<int64_t>(o.page_of_block.size()) == B,
            "page_of_block needs one row per batch row");
    for (int64_t b = 0; b < B; ++b) {
      Require(static_cast<int64_t>(o.page_of_block[b].size()) ==
                  Blocks(c.SeqLen(b), P),
              "page_of_block row has the wrong block count");
      page_of[b] = o.page_of_block[b];
      for (int32_t page : page_of[b]) {
        num_pages = std::max<int64_t>(num_pages, page + 1);
      }
    }
  } else {
    std::vector<int32_t> order(static_cast<size_t>(referenced));
    std::iota(order.begin(), order.end(), 0);
    if (o.permute_pages) {
      TestRng rng(o.permutation_seed);
      for (int64_t i = referenced - 1; i > 0; --i) {
        std::swap(order[i], order[rng.UniformInt(0, i)]);
      }
    }
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < Blocks(c.SeqLen(b), P); ++j) {
        page_of[b].push_back(order[next++]);
      }
    }
    num_pages = referenced;
  }
  num_pages += o.spare_pages;
  const int64_t M = max_blocks + o.extra_blocks;

  // Pools, junk first, then the logical tokens at their slots.
  const int64_t pool = num_pages * P * Hkv * D;
  std::vector<double> k_pool(static_cast<size_t>(pool),
                             o.junk_unused_slots ? o.junk_value : 0.0);
  std::vector<double> v_pool(static_cast<size_t>(pool),
                             o.junk_unused_slots ? -456.0 : 0.0);
  std::vector<int64_t> slot_pos(static_cast<size_t>(num_pages * P), -1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = c.SeqLen(b);
    Require(static_cast<int64_t>(c.k[b].size()) == L * Hkv * D &&
                static_cast<int64_t>(c.v[b].size()) == L * Hkv * D,
            "k/v row has the wrong size");
    for (int64_t t = 0; t < L; ++t) {
      const int64_t page = page_of[b][t / P];
      const int64_t slot = t % P;
      int64_t& sp = slot_pos[page * P + slot];
      Require(sp == -1 || sp == c.positions[b][t],
              "a shared page slot holds two different positions");
      sp = c.positions[b][t];
      for (int64_t g = 0; g < Hkv; ++g) {
        const int64_t dst = PoolOffset(o.layout, P, Hkv, D, page, slot, g);
        for (int64_t i = 0; i < D; ++i) {
          k_pool[dst + i] = c.k[b][(t * Hkv + g) * D + i];
          v_pool[dst + i] = c.v[b][(t * Hkv + g) * D + i];
        }
      }
    }
  }

  Snapshot s;
  s.q = MakeFloatTensor(c.q_dtype, {B, Sq, Hq, D}, c.q);
  const std::vector<int64_t> kv_shape =
      o.layout == KvLayout::kNHD ? std::vector<int64_t>{num_pages, P, Hkv, D}
                                 : std::vector<int64_t>{num_pages, Hkv, P, D};
  s.k_pages = MakeFloatTensor(c.kv_dtype, kv_shape, k_pool);
  s.v_pages = MakeFloatTensor(c.kv_dtype, kv_shape, v_pool);
  s.kv_layout = o.layout;

  auto page_entry = [&](int64_t page) {
    return o.page_id_base > 0 ? o.page_id_base + 7 * page : page;
  };
  std::vector<int64_t> table(static_cast<size_t>(B * M), -1);
  std::vector<int64_t> lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    lens[b] = c.SeqLen(b);
    for (size_t j = 0; j < page_of[b].size(); ++j) {
      table[b * M + j] = page_entry(page_of[b][j]);
    }
  }
  s.block_table = MakeIntTensor(o.index_dtype, {B, M}, table);
  s.kv_seq_lens = MakeIntTensor(o.index_dtype, {B}, lens);
  s.query_positions = MakeIntTensor(o.index_dtype, {B, Sq}, c.query_positions);
  s.slot_positions = MakeIntTensor(o.index_dtype, {num_pages, P}, slot_pos);
  if (o.key_rope_positions) {
    s.key_rope_positions =
        MakeIntTensor(o.index_dtype, {num_pages, P}, slot_pos);
  }
  if (o.page_id_base > 0) {
    std::vector<int64_t> ids(static_cast<size_t>(num_pages));
    for (int64_t i = 0; i < num_pages; ++i) ids[i] = page_entry(i);
    s.page_ids = MakeIntTensor(o.index_dtype, {num_pages}, ids);
  }

  for (const auto& [src, dst] :
       {std::pair<const std::vector<float>*, Tensor*>{&c.k_scale, &s.k_scale},
        {&c.v_scale, &s.v_scale}}) {
    if (src->empty()) continue;
    const std::vector<double> values(src->begin(), src->end());
    *dst = src->size() == 1 ? MakeFloatTensor(DType::kF32, {}, values)
                            : MakeFloatTensor(DType::kF32, {Hkv}, values);
  }
  if (!c.sinks.empty()) {
    s.sinks = MakeFloatTensor(
        DType::kF32, {Hq}, std::vector<double>(c.sinks.begin(), c.sinks.end()));
  }
  s.engine_lse_includes_sinks = c.lse_includes_sinks;
  s.softmax_scale = c.softmax_scale;
  s.sliding_window = c.sliding_window;
  s.window_convention = c.window_convention;
  s.logit_softcap = c.softcap;
  s.rope = c.rope;
  s.output_dtype = c.output_dtype;

  s.cp.world_size = o.cp_world_size;
  s.cp.sharding = o.sharding;
  s.cp.interleave_size = o.interleave_size;
  if (o.sharding == CpSharding::kExplicitOwners) {
    TestRng rng(o.owner_seed);
    std::vector<int64_t> owners(static_cast<size_t>(B * M), -1);
    for (int64_t b = 0; b < B; ++b) {
      for (size_t j = 0; j < page_of[b].size(); ++j) {
        owners[b * M + j] = o.block_owners.empty()
                                ? rng.UniformInt(0, o.cp_world_size - 1)
                                : o.block_owners[b][j];
      }
    }
    s.cp.block_owners = MakeIntTensor(o.index_dtype, {B, M}, owners);
  }
  return s;
}

}  // namespace testutil
}  // namespace attnaudit
