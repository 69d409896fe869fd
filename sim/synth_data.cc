// Synthetic decode data: the page layout, q/K/V content and the KV pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/common/parallel.h"
#include "core/tensor/dtype_traits.h"
#include "sim/random.h"
#include "sim/synth_internal.h"

namespace attnaudit::sim_internal {
namespace {

constexpr float kFp8E4M3Max =
    static_cast<float>(DTypeMaxFinite(DType::kF8E4M3));
constexpr uint64_t kHeavyOneIn = 32;  // ~3% of keys are "heavy"
constexpr int64_t kPagesPerChunk = 8;

// Score boosts (scaled-logit units) of heavy keys and of the sink token.
constexpr double kHeavyBoost = 5.0;
constexpr double kSinkToHeavy = 1.8;
// Peaked attention: the rotary pairs it reserves, the sink key's massive
// activation and every key's shared offset component (a real model's K
// has both: a few channels of large magnitude, most of them at the sink).
constexpr int64_t kReservedPairs = 2;
constexpr double kSinkKey = 8.0;
constexpr double kOffsetKey = 2.0;

bool Peaked(const SynthOptions& o) {
  return o.sink_share_max > 0 || o.logit_offset > 0;
}

// Pre-RoPE fp32 content of every slot of pool page `page` ([P, Hkv, D]),
// rotated in fp32 at the slot's position; inactive slots get the previous
// occupant's content (random, never rotated). positions may be null.
void PageContent(const SynthLayout& layout, const ContentModel& model,
                 const RopeTable& rope, int64_t page, bool stale, float* k,
                 float* v, int32_t* positions) {
  const int64_t row = layout.page_row[page];
  const int64_t block = layout.page_block[page];
  const int64_t len = layout.seq_lens[row];
  const int64_t width = model.kv_heads * model.head_dim;
  std::vector<float> cos_half(rope.inv_freq().size());
  std::vector<float> sin_half(rope.inv_freq().size());
  for (int64_t j = 0; j < layout.page_size; ++j) {
    float* ks = k + j * width;
    float* vs = v + j * width;
    const int64_t index = block * layout.page_size + j;
    if (index < len) {
      TokenContent(model, row, index, stale, ks, vs);
      const int64_t pos = layout.first_positions[row] + index;
      rope.Angles(pos, cos_half.data(), sin_half.data());
      for (int64_t h = 0; h < model.kv_heads; ++h) {
        rope.RotateWith(ks + h * model.head_dim, cos_half.data(),
                        sin_half.data());
      }
      if (positions != nullptr) positions[j] = static_cast<int32_t>(pos);
    } else {
      NormalSource ns(
          DeriveSeed(model.seed, {kTagGarbage, static_cast<uint64_t>(page),
                                  static_cast<uint64_t>(j), stale ? 1u : 0u}));
      for (int64_t i = 0; i < width; ++i) ks[i] = ns.NormalF();
      for (int64_t i = 0; i < width; ++i) vs[i] = ns.NormalF();
      if (positions != nullptr) positions[j] = -1;
    }
  }
}

// Casts fp32 page content to the KV dtype. fp8: bf16 first (the model's
// dtype), then x / scale[head] saturated into e4m3.
void StoreRows(const float* src, int64_t rows, int64_t heads, int64_t dim,
               DType dtype, const float* scale, char* dst) {
  const int64_t n = rows * heads * dim;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16: {
      uint16_t* out = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* out = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = FloatToF16(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      uint8_t* out = reinterpret_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t h = (i / dim) % heads;
        const float model_value = Bf16ToFloat(FloatToBf16(src[i]));
        out[i] = FloatToF8E4M3(model_value / scale[h]);
      }
      return;
    }
    case DType::kF8E5M2:  // not a KV dtype of the simulator: Synthesize
    case DType::kF64:     // refuses it before any page is written
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
    case DType::kInvalid:
      return;
  }
}

}  // namespace

int64_t RowLength(const SynthOptions& options, int64_t row) {
  if (options.last_row_context > 0 && row == options.batch - 1) {
    return std::max<int64_t>({options.last_row_context, options.queries, 1});
  }
  return std::max<int64_t>({options.context - 7 * row, options.queries, 1});
}

SynthLayout BuildLayout(const SynthOptions& options) {
  SynthLayout l;
  l.batch = options.batch;
  l.queries = options.queries;
  l.page_size = options.page_size;
  const int64_t ps = options.page_size;
  l.shared_blocks = options.prefix / ps;
  std::vector<int64_t> blocks(static_cast<size_t>(l.batch));
  for (int64_t b = 0; b < l.batch; ++b) {
    l.seq_lens.push_back(RowLength(options, b));
    // Rows without a shared prefix start at different offsets (positions
    // need not start at 0); a shared prefix pins every row to 0.
    l.first_positions.push_back(options.prefix == 0 && b % 2 == 1 ? 1000 * b + 3
                                                                  : 0);
    blocks[b] = (l.seq_lens[b] + ps - 1) / ps;
    l.max_blocks = std::max(l.max_blocks, blocks[b]);
  }
  // Allocation order: the shared blocks once, then each row's own blocks.
  std::vector<std::pair<int32_t, int32_t>> alloc;  // (row, block)
  for (int64_t k = 0; k < l.shared_blocks; ++k) alloc.emplace_back(0, k);
  for (int64_t b = 0; b < l.batch; ++b) {
    for (int64_t k = l.shared_blocks; k < blocks[b]; ++k)
      alloc.emplace_back(b, k);
  }
  l.num_pages = static_cast<int64_t>(alloc.size());
  std::vector<int32_t> perm(alloc.size());
  std::iota(perm.begin(), perm.end(), 0);
  if (options.permute_pages) {  // Fisher-Yates with our own uniform draws
    NormalSource ns(DeriveSeed(options.seed, {kTagPermute}));
    for (size_t i = perm.size(); i > 1; --i) {
      std::swap(perm[i - 1], perm[ns.Below(i)]);
    }
  }
  l.page_row.assign(alloc.size(), 0);
  l.page_block.assign(alloc.size(), 0);
  l.block_pages.resize(static_cast<size_t>(l.batch));
  for (int64_t b = 0; b < l.batch; ++b) l.block_pages[b].assign(blocks[b], -1);
  for (size_t a = 0; a < alloc.size(); ++a) {
    const int32_t page = perm[a];
    l.page_row[page] = alloc[a].first;
    l.page_block[page] = alloc[a].second;
    if (alloc[a].second < l.shared_blocks) {
      for (int64_t b = 0; b < l.batch; ++b)
        l.block_pages[b][alloc[a].second] = page;
    } else {
      l.block_pages[alloc[a].first][alloc[a].second] = page;
    }
  }
  return l;
}

ContentModel MakeContentModel(const SynthOptions& options,
                              const ModelPreset& preset, const RopeTable& rope,
                              double scale) {
  ContentModel m;
  m.seed = options.seed;
  m.q_heads = preset.q_heads;
  m.kv_heads = preset.kv_heads;
  m.head_dim = preset.head_dim;
  m.prefix = options.prefix;
  const int64_t d = preset.head_dim;
  const int64_t rot = rope.rotary_dim();
  const int64_t half = rot / 2;
  const int64_t low_pairs = std::max<int64_t>(1, half / 16);
  // Peaked attention reserves the two lowest-frequency pairs (the sink's,
  // then the offset's); the heavy direction moves to the pairs below them.
  const int64_t reserved = Peaked(options) ? kReservedPairs : 0;
  const int64_t top = std::max<int64_t>(low_pairs, half - reserved);
  auto pair = [&](int64_t i, int64_t* dims) {
    const bool gptj = preset.rope.style == RopeStyle::kGptj;
    dims[0] = gptj ? 2 * i : i;
    dims[1] = gptj ? 2 * i + 1 : i + half;
  };
  std::vector<int64_t> support;
  for (int64_t i = top - low_pairs; i < top; ++i) {
    int64_t dims[2];
    pair(i, dims);
    support.push_back(dims[0]);
    support.push_back(dims[1]);
  }
  if (options.sink_share_max > 0) {
    pair(half - 1, m.sink_dims);
    m.sink_key = static_cast<float>(kSinkKey);
  }
  if (options.logit_offset > 0) {
    pair(half - 2, m.offset_dims);
    m.offset_key = static_cast<float>(kOffsetKey);
    m.offset_query =
        static_cast<float>(options.logit_offset / (scale * kOffsetKey));
  }
  for (int64_t i = rot; i < d; ++i) support.push_back(i);
  NormalSource ns(DeriveSeed(options.seed, {kTagHeads}));
  m.direction.assign(static_cast<size_t>(m.kv_heads * d), 0.0f);
  for (int64_t h = 0; h < m.kv_heads; ++h) {
    double norm2 = 0;
    std::vector<double> g(support.size());
    for (double& x : g) {
      x = ns.Normal();
      norm2 += x * x;
    }
    const double inv = 1.0 / std::sqrt(norm2);
    for (size_t i = 0; i < support.size(); ++i) {
      m.direction[h * d + support[i]] = static_cast<float>(g[i] * inv);
    }
  }
  // scale * strength * c = boost: heavy keys gain ~kHeavyBoost in the scaled
  // score of an aligned query (times the head's 0.6-1.4 strength factor).
  const double c = std::sqrt(kHeavyBoost / scale);
  m.heavy_strength = static_cast<float>(c);
  m.sink_strength = static_cast<float>(c * kSinkToHeavy);
  for (int64_t h = 0; h < m.q_heads; ++h) {
    m.q_strength.push_back(static_cast<float>(c * (0.6 + 0.8 * ns.Uniform())));
  }
  return m;
}

void TokenContent(const ContentModel& model, int64_t row, int64_t index,
                  bool stale, float* k, float* v) {
  const bool shared = !stale && index < model.prefix;
  const uint64_t tag = stale ? kTagStale : (shared ? kTagShared : kTagToken);
  const uint64_t stream =
      DeriveSeed(model.seed, {tag, shared ? 0u : static_cast<uint64_t>(row),
                              static_cast<uint64_t>(index)});
  NormalSource ns(stream);
  const int64_t width = model.kv_heads * model.head_dim;
  for (int64_t i = 0; i < width; ++i) k[i] = ns.NormalF();
  for (int64_t i = 0; i < width; ++i) v[i] = ns.NormalF();
  float strength = 0.0f;
  if (index == 0 && !stale) {
    strength = model.sink_strength;
  } else if (Mix64(stream ^ kTagHeavy) % kHeavyOneIn == 0) {
    strength = model.heavy_strength;
  }
  if (strength != 0.0f) {
    for (int64_t i = 0; i < width; ++i) k[i] += strength * model.direction[i];
  }
  // Peaked attention: only the sink holds the massive activation, and every
  // token (a stale one too) the shared offset component.
  for (int64_t h = 0; h < model.kv_heads; ++h) {
    float* kh = k + h * model.head_dim;
    if (model.sink_dims[0] >= 0) {
      kh[model.sink_dims[0]] = index == 0 && !stale ? model.sink_key : 0.0f;
      kh[model.sink_dims[1]] = 0.0f;
    }
    if (model.offset_dims[0] >= 0) {
      kh[model.offset_dims[0]] = model.offset_key;
      kh[model.offset_dims[1]] = 0.0f;
    }
  }
}

KvPool GeneratePool(const SynthLayout& layout, const ContentModel& model,
                    const RopeTable& rope, DType kv_dtype, int threads) {
  const int64_t n = layout.num_pages;
  const int64_t ps = layout.page_size;
  const int64_t heads = model.kv_heads;
  const int64_t d = model.head_dim;
  const int64_t page_elems = ps * heads * d;
  KvPool pool;
  pool.k_pages = Tensor(kv_dtype, {n, ps, heads, d});
  pool.v_pages = Tensor(kv_dtype, {n, ps, heads, d});
  pool.slot_positions = Tensor(DType::kI32, {n, ps});
  const int64_t chunks = (n + kPagesPerChunk - 1) / kPagesPerChunk;
  const bool fp8 = kv_dtype == DType::kF8E4M3;
  std::vector<float> k_scale(static_cast<size_t>(heads), 1.0f);
  std::vector<float> v_scale(static_cast<size_t>(heads), 1.0f);
  if (fp8) {
    // Pass 1: per-head amax of the active (bf16-rounded) K/V, per chunk,
    // reduced in chunk order (deterministic). Content is regenerated in pass
    // 2 rather than kept, so fp8 costs time, not memory.
    std::vector<float> amax(static_cast<size_t>(chunks * 2 * heads), 0.0f);
    ParallelFor(chunks, threads, [&](int64_t c) {
      std::vector<float> k(page_elems), v(page_elems);
      std::vector<int32_t> pos(ps);
      float* am = &amax[c * 2 * heads];
      for (int64_t page = c * kPagesPerChunk;
           page < std::min(n, (c + 1) * kPagesPerChunk); ++page) {
        PageContent(layout, model, rope, page, false, k.data(), v.data(),
                    pos.data());
        for (int64_t j = 0; j < ps; ++j) {
          if (pos[j] < 0) continue;
          for (int64_t h = 0; h < heads; ++h) {
            for (int64_t i = 0; i < d; ++i) {
              const int64_t e = (j * heads + h) * d + i;
              am[h] =
                  std::max(am[h], std::fabs(Bf16ToFloat(FloatToBf16(k[e]))));
              am[heads + h] = std::max(
                  am[heads + h], std::fabs(Bf16ToFloat(FloatToBf16(v[e]))));
            }
          }
        }
      }
    });
    for (int64_t h = 0; h < heads; ++h) {
      float ka = 0, va = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        ka = std::max(ka, amax[c * 2 * heads + h]);
        va = std::max(va, amax[c * 2 * heads + heads + h]);
      }
      k_scale[h] = ka > 0 ? ka / kFp8E4M3Max : 1.0f;
      v_scale[h] = va > 0 ? va / kFp8E4M3Max : 1.0f;
    }
    pool.k_scale = Tensor(DType::kF32, {heads});
    pool.v_scale = Tensor(DType::kF32, {heads});
    std::memcpy(pool.k_scale.mutable_raw(), k_scale.data(),
                heads * sizeof(float));
    std::memcpy(pool.v_scale.mutable_raw(), v_scale.data(),
                heads * sizeof(float));
  }
  const int elt = DTypeSize(kv_dtype);
  char* kdst = static_cast<char*>(pool.k_pages.mutable_raw());
  char* vdst = static_cast<char*>(pool.v_pages.mutable_raw());
  int32_t* positions = pool.slot_positions.mutable_data<int32_t>();
  ParallelFor(chunks, threads, [&](int64_t c) {
    std::vector<float> k(page_elems), v(page_elems);
    for (int64_t page = c * kPagesPerChunk;
         page < std::min(n, (c + 1) * kPagesPerChunk); ++page) {
      PageContent(layout, model, rope, page, false, k.data(), v.data(),
                  positions + page * ps);
      StoreRows(k.data(), ps, heads, d, kv_dtype, k_scale.data(),
                kdst + page * page_elems * elt);
      StoreRows(v.data(), ps, heads, d, kv_dtype, v_scale.data(),
                vdst + page * page_elems * elt);
    }
  });
  return pool;
}

void GenerateStalePage(const SynthLayout& layout, const ContentModel& model,
                       const RopeTable& rope, const KvPool& pool, int64_t page,
                       Tensor* k, Tensor* v) {
  const int64_t ps = layout.page_size;
  const int64_t heads = model.kv_heads;
  const int64_t d = model.head_dim;
  const DType dtype = pool.k_pages.dtype();
  std::vector<float> kf(ps * heads * d), vf(ps * heads * d);
  PageContent(layout, model, rope, page, true, kf.data(), vf.data(), nullptr);
  std::vector<float> ks(heads, 1.0f), vs(heads, 1.0f);
  for (int64_t h = 0; h < heads && pool.k_scale.present(); ++h) {
    ks[h] = pool.k_scale.data<float>()[h];
    vs[h] = pool.v_scale.data<float>()[h];
  }
  *k = Tensor(dtype, {ps, heads, d});
  *v = Tensor(dtype, {ps, heads, d});
  StoreRows(kf.data(), ps, heads, d, dtype, ks.data(),
            static_cast<char*>(k->mutable_raw()));
  StoreRows(vf.data(), ps, heads, d, dtype, vs.data(),
            static_cast<char*>(v->mutable_raw()));
}

Tensor GenerateQueries(const SynthLayout& layout, const ContentModel& model,
                       DType dtype) {
  const int64_t hq = model.q_heads;
  const int64_t d = model.head_dim;
  const int64_t group = hq / model.kv_heads;
  Tensor q(dtype, {layout.batch, layout.queries, hq, d});
  void* dst = q.mutable_raw();
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t s = 0; s < layout.queries; ++s) {
      NormalSource ns(DeriveSeed(
          model.seed,
          {kTagQuery, static_cast<uint64_t>(b), static_cast<uint64_t>(s)}));
      for (int64_t h = 0; h < hq; ++h) {
        const float* u = &model.direction[(h / group) * d];
        const int64_t row = ((b * layout.queries + s) * hq + h) * d;
        for (int64_t i = 0; i < d; ++i) {
          StoreFromFloat(dst, dtype, row + i,
                         ns.NormalF() + model.q_strength[h] * u[i]);
        }
        // Peaked attention: SetSinkShares sets the sink pair's first dim.
        for (int k = 0; k < 2; ++k) {
          if (model.sink_dims[k] >= 0) {
            StoreFromFloat(dst, dtype, row + model.sink_dims[k], 0.0f);
          }
          if (model.offset_dims[k] >= 0) {
            StoreFromFloat(dst, dtype, row + model.offset_dims[k],
                           k == 0 ? model.offset_query : 0.0f);
          }
        }
      }
    }
  }
  return q;
}

}  // namespace attnaudit::sim_internal
