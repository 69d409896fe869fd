// The layout routine of snapshot_builder.h (BuildSnapshot of a
// LogicalCase), the generator and the tensor helpers.
#include "tests/unit/core/testing/snapshot_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <utility>

namespace attnaudit {
namespace testing {

namespace builder_internal {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "snapshot_builder: %s\n", what);
    std::abort();
  }
}

}  // namespace builder_internal

namespace {

using builder_internal::Require;

int64_t PoolOffset(KvLayout layout, int64_t page_size, int64_t kv_heads,
                   int64_t head_dim, int64_t page, int64_t slot, int64_t head) {
  if (layout == KvLayout::kNHD) {
    return ((page * page_size + slot) * kv_heads + head) * head_dim;
  }
  return ((page * kv_heads + head) * page_size + slot) * head_dim;
}

// Where every logical block lives.
struct Placement {
  std::vector<std::vector<int32_t>> page_of;  // [B][blocks]
  int64_t num_pages = 0;                      // pool size, spares included
  int64_t max_blocks = 0;                     // block_table columns, M
};

// What the pool holds: K/V values and the position of every slot.
struct Pools {
  std::vector<double> k, v;       // [N * P * Hkv * D] in the pool layout
  std::vector<int64_t> slot_pos;  // [N * P], -1 for unused slots
};

void CheckCase(const LogicalCase& c, const PagingOptions& o) {
  const int64_t B = c.batch;
  Require(o.page_size > 0, "page_size must be positive");
  Require(static_cast<int64_t>(c.positions.size()) == B &&
              static_cast<int64_t>(c.k.size()) == B &&
              static_cast<int64_t>(c.v.size()) == B,
          "positions/k/v need one entry per row");
  Require(static_cast<int64_t>(c.q.size()) ==
              B * c.queries * c.q_heads * c.head_dim,
          "q has the wrong size");
  Require(static_cast<int64_t>(c.query_positions.size()) == B * c.queries,
          "query_positions has the wrong size");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = c.SeqLen(b) * c.kv_heads * c.head_dim;
    Require(static_cast<int64_t>(c.k[b].size()) == n &&
                static_cast<int64_t>(c.v[b].size()) == n,
            "k/v row has the wrong size");
  }
}

// Explicit pages from the options, or consecutive (optionally permuted)
// pages in row-major block order.
Placement PlacePages(const LogicalCase& c, const PagingOptions& o) {
  const int64_t B = c.batch, P = o.page_size;
  Placement out;
  out.page_of.resize(static_cast<size_t>(B));
  int64_t referenced = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = CeilDiv(c.SeqLen(b), P);
    referenced += n;
    out.max_blocks = std::max(out.max_blocks, n);
  }
  if (!o.page_of_block.empty()) {
    Require(static_cast<int64_t>(o.page_of_block.size()) == B,
            "page_of_block needs one row per batch row");
    for (int64_t b = 0; b < B; ++b) {
      Require(static_cast<int64_t>(o.page_of_block[b].size()) ==
                  CeilDiv(c.SeqLen(b), P),
              "page_of_block row has the wrong block count");
      out.page_of[b] = o.page_of_block[b];
      for (int32_t page : out.page_of[b]) {
        out.num_pages = std::max<int64_t>(out.num_pages, page + 1);
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
      for (int64_t j = 0; j < CeilDiv(c.SeqLen(b), P); ++j) {
        out.page_of[b].push_back(order[next++]);
      }
    }
    out.num_pages = referenced;
  }
  out.num_pages += o.spare_pages;
  out.max_blocks += o.extra_blocks;
  return out;
}

// Junk (or zeros) everywhere, then every row's tokens at their slots.
Pools FillPools(const LogicalCase& c, const PagingOptions& o,
                const Placement& placement) {
  const int64_t Hkv = c.kv_heads, D = c.head_dim, P = o.page_size;
  const size_t pool = static_cast<size_t>(placement.num_pages * P * Hkv * D);
  Pools out;
  out.k.assign(pool, o.junk_unused_slots ? o.junk_value : 0.0);
  out.v.assign(pool, o.junk_unused_slots ? o.junk_v_value : 0.0);
  out.slot_pos.assign(static_cast<size_t>(placement.num_pages * P), -1);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t t = 0; t < c.SeqLen(b); ++t) {
      const int64_t page = placement.page_of[b][t / P];
      const int64_t slot = t % P;
      int64_t& sp = out.slot_pos[page * P + slot];
      Require(sp == -1 || sp == c.positions[b][t],
              "a shared page slot holds two different positions");
      sp = c.positions[b][t];
      for (int64_t g = 0; g < Hkv; ++g) {
        const int64_t dst = PoolOffset(o.layout, P, Hkv, D, page, slot, g);
        const int64_t src = (t * Hkv + g) * D;
        std::copy_n(c.k[b].begin() + src, D, out.k.begin() + dst);
        std::copy_n(c.v[b].begin() + src, D, out.v.begin() + dst);
      }
    }
  }
  return out;
}

// block_table (page ids when page_id_base > 0), kv_seq_lens, positions,
// page_ids.
void SetIndexTensors(const LogicalCase& c, const PagingOptions& o,
                     const Placement& placement, const Pools& pools,
                     Snapshot* s) {
  const int64_t B = c.batch, M = placement.max_blocks, N = placement.num_pages;
  auto page_entry = [&](int64_t page) {
    return o.page_id_base > 0 ? o.page_id_base + 7 * page : page;
  };
  std::vector<int64_t> table(static_cast<size_t>(B * M), -1);
  std::vector<int64_t> lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    lens[b] = c.SeqLen(b);
    for (size_t j = 0; j < placement.page_of[b].size(); ++j) {
      table[b * M + j] = page_entry(placement.page_of[b][j]);
    }
  }
  const DType dt = o.index_dtype;
  s->block_table = MakeIntTensor(dt, {B, M}, table);
  s->kv_seq_lens = MakeIntTensor(dt, {B}, lens);
  s->query_positions = MakeIntTensor(dt, {B, c.queries}, c.query_positions);
  s->slot_positions = MakeIntTensor(dt, {N, o.page_size}, pools.slot_pos);
  if (o.key_rope_positions) {
    s->key_rope_positions = MakeIntTensor(dt, {N, o.page_size}, pools.slot_pos);
  }
  if (o.page_id_base > 0) {
    std::vector<int64_t> ids(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) ids[i] = page_entry(i);
    s->page_ids = MakeIntTensor(dt, {N}, ids);
  }
}

// fp8 scales, sinks and the scalar attention settings.
void SetVariant(const LogicalCase& c, Snapshot* s) {
  for (const auto& [src, dst] :
       {std::pair<const std::vector<float>*, Tensor*>{&c.k_scale, &s->k_scale},
        {&c.v_scale, &s->v_scale}}) {
    if (src->empty()) continue;
    const std::vector<double> values(src->begin(), src->end());
    *dst = src->size() == 1
               ? MakeFloatTensor(DType::kF32, {}, values)
               : MakeFloatTensor(DType::kF32, {c.kv_heads}, values);
  }
  if (!c.sinks.empty()) {
    s->sinks =
        MakeFloatTensor(DType::kF32, {c.q_heads},
                        std::vector<double>(c.sinks.begin(), c.sinks.end()));
  }
  s->engine_lse_includes_sinks = c.lse_includes_sinks;
  s->softmax_scale = c.softmax_scale;
  s->sliding_window = c.sliding_window;
  s->window_convention = c.window_convention;
  s->logit_softcap = c.softcap;
  s->rope = c.rope;
  s->output_dtype = c.output_dtype;
}

void SetContextParallel(const PagingOptions& o, const Placement& placement,
                        int64_t batch, Snapshot* s) {
  s->cp.world_size = o.cp_world_size;
  s->cp.sharding = o.sharding;
  s->cp.interleave_size = o.interleave_size;
  if (o.sharding != CpSharding::kExplicitOwners) return;
  const int64_t M = placement.max_blocks;
  TestRng rng(o.owner_seed);
  std::vector<int64_t> owners(static_cast<size_t>(batch * M), -1);
  for (int64_t b = 0; b < batch; ++b) {
    for (size_t j = 0; j < placement.page_of[b].size(); ++j) {
      owners[b * M + j] = o.block_owners.empty()
                              ? rng.UniformInt(0, o.cp_world_size - 1)
                              : o.block_owners[b][j];
    }
  }
  s->cp.block_owners = MakeIntTensor(o.index_dtype, {batch, M}, owners);
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

double RoundValue(double x, DType dtype) {
  if (dtype == DType::kF64) return x;
  return RoundToDType(static_cast<float>(x), dtype);
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
  Require(dtype == DType::kI32 || dtype == DType::kI64 || dtype == DType::kBool,
          "MakeIntTensor: dtype must be i32, i64 or bool");
  Tensor t(dtype, std::move(shape));
  Require(static_cast<int64_t>(values.size()) == t.num_elements(),
          "MakeIntTensor: value count does not match the shape");
  for (size_t i = 0; i < values.size(); ++i) {
    SetInt(&t, static_cast<int64_t>(i), values[i]);
  }
  return t;
}

Tensor MakeBoolTensor(std::vector<int64_t> shape,
                      const std::vector<bool>& values) {
  return MakeIntTensor(DType::kBool, std::move(shape),
                       std::vector<int64_t>(values.begin(), values.end()));
}

std::vector<double> ToDoubles(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.num_elements()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.DoubleAt(static_cast<int64_t>(i));
  }
  return out;
}

void SetInt(Tensor* t, int64_t flat, int64_t value) {
  if (t->dtype() == DType::kI64) {
    t->mutable_data<int64_t>()[flat] = value;
  } else if (t->dtype() == DType::kBool) {
    t->mutable_data<uint8_t>()[flat] = static_cast<uint8_t>(value);
  } else {
    t->mutable_data<int32_t>()[flat] = static_cast<int32_t>(value);
  }
}

int64_t GetInt(const Tensor& t, int64_t flat) { return t.IntAt(flat); }

void SetFloat(Tensor* t, int64_t flat, double value) {
  StoreFromDouble(t->mutable_raw(), t->dtype(), flat, value);
}

void FillUniform(Tensor* t, uint64_t seed) {
  TestRng rng(seed);
  const int64_t n = t->num_elements();
  for (int64_t i = 0; i < n; ++i) SetFloat(t, i, rng.Uniform(-1.0, 1.0));
}

Snapshot BuildSnapshot(const LogicalCase& c, const PagingOptions& o) {
  CheckCase(c, o);
  const Placement placement = PlacePages(c, o);
  const Pools pools = FillPools(c, o, placement);
  const int64_t N = placement.num_pages, P = o.page_size;
  const std::vector<int64_t> kv_shape =
      o.layout == KvLayout::kNHD
          ? std::vector<int64_t>{N, P, c.kv_heads, c.head_dim}
          : std::vector<int64_t>{N, c.kv_heads, P, c.head_dim};
  Snapshot s;
  s.q = MakeFloatTensor(c.q_dtype, {c.batch, c.queries, c.q_heads, c.head_dim},
                        c.q);
  s.k_pages = MakeFloatTensor(c.kv_dtype, kv_shape, pools.k);
  s.v_pages = MakeFloatTensor(c.kv_dtype, kv_shape, pools.v);
  s.kv_layout = o.layout;
  SetIndexTensors(c, o, placement, pools, &s);
  SetVariant(c, &s);
  SetContextParallel(o, placement, c.batch, &s);
  return s;
}

}  // namespace testing
}  // namespace attnaudit
