// The ready-made logical cases of snapshot_builder.h: random cases, the
// RL-Kernel harness fixture, and post-RoPE equivalents.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

using builder_internal::Require;

bool IsFp8(DType d) { return d == DType::kF8E4M3 || d == DType::kF8E5M2; }

}  // namespace

LogicalCase RandomCase(const RandomCaseOptions& o) {
  TestRng rng(o.seed);
  LogicalCase c;
  c.batch = o.batch;
  c.queries = o.queries;
  c.q_heads = o.q_heads;
  c.kv_heads = o.kv_heads;
  c.head_dim = o.head_dim;
  c.q_dtype = o.q_dtype;
  c.kv_dtype = o.kv_dtype;
  const int64_t B = o.batch, Hkv = o.kv_heads, D = o.head_dim;

  c.q.resize(static_cast<size_t>(B * o.queries * o.q_heads * D));
  for (double& x : c.q) x = RoundValue(o.q_std * rng.Normal(), o.q_dtype);

  const bool fp8 = IsFp8(o.kv_dtype);
  std::vector<float> scale(static_cast<size_t>(Hkv), 1.0f);
  if (fp8) {
    // |x / scale| stays well inside e4m3's 448 for |x| < 5 kv_std.
    for (int64_t g = 0; g < Hkv; ++g) {
      scale[g] = static_cast<float>(
          o.kv_std / 64.0 * (o.fp8_per_head_scales ? 1.0 + 0.25 * g : 1.0));
    }
    if (o.fp8_per_head_scales) {
      c.k_scale = scale;
      std::vector<float> vs(scale.rbegin(), scale.rend());
      c.v_scale = vs;
    } else {
      c.k_scale = {scale[0]};
      c.v_scale = {scale[0]};
    }
  }
  auto draw_kv = [&](const std::vector<float>& scales, int64_t g) {
    const double x = o.kv_std * rng.Normal();
    if (!fp8) return RoundValue(x, o.kv_dtype);
    const float s = scales.size() == 1 ? scales[0] : scales[g];
    return RoundValue(x / s, o.kv_dtype);  // decoded fp8 code, pre-scale
  };

  c.positions.resize(static_cast<size_t>(B));
  c.k.resize(static_cast<size_t>(B));
  c.v.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = o.seq_lens.empty() ? 12 : o.seq_lens[b];
    Require(L >= o.queries, "a row needs at least Sq tokens");
    int64_t pos = o.position_offset;
    for (int64_t t = 0; t < L; ++t) {
      c.positions[b].push_back(pos);
      pos += 1 + (o.max_gap > 0 ? rng.UniformInt(0, o.max_gap) : 0);
    }
    c.k[b].resize(static_cast<size_t>(L * Hkv * D));
    c.v[b].resize(static_cast<size_t>(L * Hkv * D));
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t g = 0; g < Hkv; ++g) {
        for (int64_t i = 0; i < D; ++i) {
          const int64_t at = (t * Hkv + g) * D + i;
          c.k[b][at] = draw_kv(c.k_scale, g);
          c.v[b][at] = draw_kv(c.v_scale, g);
        }
      }
    }
    // Queries.
    std::vector<int64_t> idx;
    if (!o.spread_queries) {
      for (int64_t s = L - o.queries; s < L; ++s) idx.push_back(s);
    } else {
      std::vector<int64_t> pool(static_cast<size_t>(L - 1));
      std::iota(pool.begin(), pool.end(), 0);
      for (int64_t i = L - 2; i > 0; --i) {
        std::swap(pool[i], pool[rng.UniformInt(0, i)]);
      }
      idx.assign(pool.begin(), pool.begin() + (o.queries - 1));
      idx.push_back(L - 1);
      std::sort(idx.begin(), idx.end());
    }
    for (int64_t s : idx) c.query_positions.push_back(c.positions[b][s]);
  }
  return c;
}

LogicalCase PeakedBf16Case(uint64_t seed) {
  RandomCaseOptions o;
  o.batch = 2;
  o.q_heads = 8;
  o.kv_heads = 2;
  o.head_dim = 32;
  o.seq_lens = {70, 61};
  o.q_dtype = DType::kBF16;
  o.kv_dtype = DType::kBF16;
  o.q_std = 2.0;
  o.seed = seed;
  LogicalCase c = RandomCase(o);
  c.output_dtype = DType::kBF16;
  return c;
}

LogicalCase SeedFixture(int64_t position_offset, uint64_t seed) {
  RandomCaseOptions o;
  o.batch = 2;
  o.queries = 2;
  o.q_heads = 4;
  o.kv_heads = 2;
  o.head_dim = 8;
  o.seq_lens = {6, 6};
  o.position_offset = position_offset;
  o.seed = seed;
  return RandomCase(o);  // queries: the last two positions, 4 and 5
}

PagingOptions SeedFixturePaging(std::vector<int32_t> page_order) {
  PagingOptions p;
  p.page_size = 2;
  // The harness stores each row separately; in our shared pool row 1 uses
  // pages 3..5 in the same order.
  std::vector<int32_t> row1;
  for (int32_t page : page_order) row1.push_back(page + 3);
  p.page_of_block = {page_order, row1};
  p.sharding = CpSharding::kExplicitOwners;
  p.cp_world_size = 2;
  p.block_owners = {{0, 1, 0}, {0, 1, 0}};
  return p;
}

LogicalCase PostRopeEquivalent(const LogicalCase& c) {
  absl::StatusOr<RopeTable> table = RopeTable::Create(c.rope, c.head_dim);
  Require(table.ok(), "PostRopeEquivalent: invalid RoPE config");
  LogicalCase out = c;
  const int64_t D = c.head_dim;
  std::vector<float> row(static_cast<size_t>(D));
  if (c.rope.q_state == RopeState::kPreRope) {
    const DType q_out = c.rope.q_output_dtype != DType::kInvalid
                            ? c.rope.q_output_dtype
                            : c.q_dtype;
    for (int64_t bs = 0; bs < c.batch * c.queries; ++bs) {
      for (int64_t h = 0; h < c.q_heads; ++h) {
        const int64_t base = (bs * c.q_heads + h) * D;
        for (int64_t i = 0; i < D; ++i) {
          row[i] = static_cast<float>(c.q[base + i]);
        }
        table->Rotate(row.data(), c.query_positions[bs]);
        for (int64_t i = 0; i < D; ++i) {
          out.q[base + i] = RoundToDType(row[i], q_out);
        }
      }
    }
    out.q_dtype = q_out;
  }
  if (c.rope.k_state == RopeState::kPreRope) {
    Require(!IsFp8(c.kv_dtype), "PostRopeEquivalent: fp8 K is unsupported");
    const DType k_out = c.rope.k_output_dtype != DType::kInvalid
                            ? c.rope.k_output_dtype
                            : c.kv_dtype;
    Require(k_out == c.kv_dtype,
            "PostRopeEquivalent: K RoPE output dtype must be the V dtype");
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t t = 0; t < c.SeqLen(b); ++t) {
        for (int64_t g = 0; g < c.kv_heads; ++g) {
          const int64_t base = (t * c.kv_heads + g) * D;
          for (int64_t i = 0; i < D; ++i) {
            row[i] = static_cast<float>(c.k[b][base + i]);
          }
          table->Rotate(row.data(), c.positions[b][t]);
          for (int64_t i = 0; i < D; ++i) {
            out.k[b][base + i] = RoundToDType(row[i], k_out);
          }
        }
      }
    }
  }
  out.rope.q_state = RopeState::kPostRope;
  out.rope.k_state = RopeState::kPostRope;
  out.rope.q_output_dtype = DType::kInvalid;
  out.rope.k_output_dtype = DType::kInvalid;
  return out;
}

}  // namespace testing
}  // namespace attnaudit
