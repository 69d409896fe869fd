// PrepareAttention: RoPE for q (and for a pre-RoPE K cache), fp8 scales, and
// the attention variant, resolved once per snapshot.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/attention/attention_internal.h"
#include "core/common/parallel.h"
#include "core/common/status_macros.h"
#include "core/rope/rope.h"
#include "core/simd/abs_max.h"
#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace {

std::vector<double> PerHeadScale(const Tensor& scale, int64_t kv_heads) {
  std::vector<double> out(static_cast<size_t>(kv_heads), 1.0);
  if (!scale.present()) return out;
  for (int64_t g = 0; g < kv_heads; ++g) {
    out[g] = scale.num_elements() == 1 ? scale.DoubleAt(0) : scale.DoubleAt(g);
  }
  return out;
}

// Pages referenced by some row.
std::vector<uint8_t> ReferencedPages(const ResolvedLayout& layout,
                                     const SnapshotDims& d) {
  std::vector<uint8_t> referenced(static_cast<size_t>(d.num_pages), 0);
  for (const auto& row : layout.block_pages) {
    for (int32_t page : row) referenced[page] = 1;
  }
  return referenced;
}

// The largest |v| of one stored V row, widened into `buf` (V scale not
// applied); non-finite values do not count.
float ValueRowMax(const Snapshot& s, const SnapshotDims& d, int64_t page,
                  int64_t slot, int64_t head, float* buf) {
  const int64_t src = KvSlotOffset(s.kv_layout, d, page, slot, head);
  ConvertToFloat(static_cast<const char*>(s.v_pages.raw()) +
                     src * DTypeSize(s.v_pages.dtype()),
                 s.v_pages.dtype(), d.head_dim, buf);
  float m = 0;
  for (int64_t i = 0; i < d.head_dim; ++i) {
    const float a = std::fabs(buf[i]);
    m = a <= std::numeric_limits<float>::max() && a > m ? a : m;
  }
  return m;
}

// Per rotary pair: the largest |pair| of any referenced, active key (k_scale
// applied) and of any query, and the largest |v| (V scale applied).
struct PairMaxima {
  std::vector<double> key, query;
  double value = 0;
};

// What one thread's scan keeps: per KV head the largest squared pair norm
// of its keys (before k_scale) and the largest |v| (before v_scale), so the
// inner loops are plain float maxima.
struct ScanPart {
  std::vector<float> key_sq;  // [Hkv][half]
  std::vector<float> value;   // [Hkv]
};

// The pairs of a widened K row into part->key_sq of head g.
void ScanKeyRow(const float* row, const RopeTable& rope, int64_t g,
                ScanPart* part) {
  const int64_t half = rope.rotary_dim() / 2;
  float* sq = &part->key_sq[g * half];
  const bool neox = rope.style() == RopeStyle::kNeox;
  for (int64_t i = 0; i < half; ++i) {
    const float a = row[neox ? i : 2 * i];
    const float b = row[neox ? i + half : 2 * i + 1];
    const float n = a * a + b * b;
    sq[i] = n <= std::numeric_limits<float>::max() && n > sq[i] ? n : sq[i];
  }
}

// The maxima of all parts, scales applied, norms taken.
void MergeMaxima(const std::vector<ScanPart>& parts, const Snapshot& s,
                 const SnapshotDims& d, size_t half, PairMaxima* out) {
  out->key.assign(half, 0.0);
  const std::vector<double> k_scale = PerHeadScale(s.k_scale, d.kv_heads);
  const std::vector<double> v_scale = PerHeadScale(s.v_scale, d.kv_heads);
  for (const ScanPart& part : parts) {
    if (part.value.empty()) continue;
    for (int64_t g = 0; g < d.kv_heads; ++g) {
      for (size_t i = 0; i < half; ++i) {
        out->key[i] =
            std::max(out->key[i],
                     std::sqrt(static_cast<double>(part.key_sq[g * half + i])) *
                         k_scale[g]);
      }
      out->value = std::max(out->value, part.value[g] * v_scale[g]);
    }
  }
}

double PairNorm(const float* x, int64_t a, int64_t b) {
  return std::sqrt(static_cast<double>(x[a]) * x[a] +
                   static_cast<double>(x[b]) * x[b]);
}

int64_t PairIndex(RopeStyle style, int64_t i, int64_t half, bool second) {
  if (style == RopeStyle::kNeox) return second ? i + half : i;
  return second ? 2 * i + 1 : 2 * i;
}

// What RotateKeys finds of the rotated keys that may round the other way
// in the engine (RopeTable::RotationAmbiguity): their count, per key
// sum_d gap_{j,d} max|q_d| (the most its score moves before the softmax
// scale; 0 for a clear key), and per KV head the largest of those.
struct KeyAmbiguity {
  int64_t elements = 0;
  std::vector<double> head_score;  // [Hkv]
  std::vector<float> key_score;    // [N * P * Hkv], slot-major
};

// One rotated key row's ambiguous elements (gap != 0) into *found: their
// count, and the most its score moves for KV head g before the softmax
// scale (returned). requantize_scale > 0: an fp8 cache re-quantises the
// rotated value with that scale, so its two candidates may land an fp8
// step apart.
double NoteKeyAmbiguity(const float* gap, const float* rotated,
                        int64_t head_dim, int64_t g, float requantize_scale,
                        DType out_dtype,
                        const std::vector<double>& query_dim_max,
                        KeyAmbiguity* found) {
  const float ks = requantize_scale;
  double score = 0;
  for (int64_t i = 0; i < head_dim; ++i) {
    if (gap[i] == 0.0f) continue;
    const double step =
        ks > 0
            ? std::fabs(RoundToDType((rotated[i] + gap[i]) / ks, out_dtype) -
                        RoundToDType((rotated[i] - gap[i]) / ks, out_dtype)) *
                  ks
            : gap[i];
    ++found->elements;
    score += step * query_dim_max[g * head_dim + i];
  }
  found->head_score[g] = std::max(found->head_score[g], score);
  return score;
}

void MergeKeyAmbiguity(const std::vector<KeyAmbiguity>& parts, int64_t kv_heads,
                       KeyAmbiguity* out) {
  out->head_score.assign(static_cast<size_t>(kv_heads), 0.0);
  for (const KeyAmbiguity& part : parts) {
    out->elements += part.elements;
    for (size_t g = 0; g < part.head_score.size(); ++g) {
      out->head_score[g] = std::max(out->head_score[g], part.head_score[g]);
    }
  }
}

// Rotates every active slot of the referenced K pages into an f32 NHD pool,
// as the engine did (its cast point; one cast to the K RoPE output dtype),
// and, when `maxima` is set, takes the pair maxima of K and V on the way. With
// `query_dim_max` set, also what may round the other way into *ambiguity.
absl::Status RotateKeys(const Snapshot& s, const ResolvedLayout& layout,
                        const RopeTable& rope, PreparedAttention* p,
                        PairMaxima* maxima, int threads,
                        const std::vector<double>* query_dim_max,
                        KeyAmbiguity* ambiguity) {
  const SnapshotDims& d = p->dims;
  const DType out_dtype = s.rope.k_output_dtype != DType::kInvalid
                              ? s.rope.k_output_dtype
                              : s.k_pages.dtype();
  const Tensor& rope_pos =
      s.key_rope_positions.present() ? s.key_rope_positions : s.slot_positions;
  p->rotated_k.assign(
      static_cast<size_t>(d.num_pages * d.page_size * d.kv_heads * d.head_dim),
      0.0f);
  const std::vector<uint8_t> referenced = ReferencedPages(layout, d);
  const std::vector<double> k_scale = PerHeadScale(s.k_scale, d.kv_heads);
  const bool requantize = IsFp8(out_dtype);
  // fp8: the engine rotates in its compute dtype, then quantises.
  const DType rotation_dtype = requantize ? DType::kBF16 : out_dtype;
  const size_t half = rope.inv_freq().size();
  std::vector<ScanPart> per_page(
      maxima != nullptr ? static_cast<size_t>(d.num_pages) : 0);
  const bool detect = query_dim_max != nullptr;
  std::vector<KeyAmbiguity> page_ambiguity(
      detect ? static_cast<size_t>(d.num_pages) : 0);
  // Each page's slots are written by its own task.
  std::vector<float> key_score(
      detect ? static_cast<size_t>(d.num_pages * d.page_size * d.kv_heads) : 0);
  ParallelFor(d.num_pages, threads, [&](int64_t page) {
    if (!referenced[page]) return;
    std::vector<float> cos_half(half);
    std::vector<float> sin_half(half);
    std::vector<float> row(static_cast<size_t>(d.head_dim));
    std::vector<float> vrow(row.size());
    std::vector<float> gap(detect ? row.size() : 0);
    KeyAmbiguity* found = detect ? &page_ambiguity[page] : nullptr;
    if (found != nullptr) found->head_score.assign(d.kv_heads, 0.0);
    ScanPart* part = maxima != nullptr ? &per_page[page] : nullptr;
    if (part != nullptr) {
      part->key_sq.assign(static_cast<size_t>(d.kv_heads) * half, 0.0f);
      part->value.assign(static_cast<size_t>(d.kv_heads), 0.0f);
    }
    for (int64_t slot = 0; slot < d.page_size; ++slot) {
      const int64_t pos = rope_pos.IntAt(page * d.page_size + slot);
      if (s.slot_positions.IntAt(page * d.page_size + slot) < 0) continue;
      rope.Angles(pos, cos_half.data(), sin_half.data());
      for (int64_t g = 0; g < d.kv_heads; ++g) {
        const int64_t src = KvSlotOffset(s.kv_layout, d, page, slot, g);
        const float ks = static_cast<float>(k_scale[g]);
        ConvertToFloat(static_cast<const char*>(s.k_pages.raw()) +
                           src * DTypeSize(s.k_pages.dtype()),
                       s.k_pages.dtype(), d.head_dim, row.data());
        if (part != nullptr) {
          ScanKeyRow(row.data(), rope, g, part);
          part->value[g] = std::max(
              part->value[g], ValueRowMax(s, d, page, slot, g, vrow.data()));
        }
        if (s.k_scale.present()) {
          for (int64_t i = 0; i < d.head_dim; ++i) row[i] *= ks;
        }
        float* dst = p->rotated_k.data() +
                     KvSlotOffset(KvLayout::kNHD, d, page, slot, g);
        if (found != nullptr) {
          rope.RotationAmbiguity(row.data(), cos_half.data(), sin_half.data(),
                                 rotation_dtype, pos, gap.data());
        }
        rope.RotateAs(row.data(), cos_half.data(), sin_half.data(),
                      rotation_dtype, dst);
        if (found != nullptr) {
          key_score[(page * d.page_size + slot) * d.kv_heads + g] =
              static_cast<float>(NoteKeyAmbiguity(
                  gap.data(), dst, d.head_dim, g, requantize ? ks : 0,
                  out_dtype, *query_dim_max, found));
        }
        if (requantize) {
          // An fp8 cache stores the rotated key re-quantised with its scale;
          // the pool holds the dequantised value (the scale is applied here,
          // so the kernel's k_scale becomes 1).
          for (int64_t i = 0; i < d.head_dim; ++i) {
            dst[i] = RoundToDType(dst[i] / ks, out_dtype) * ks;
          }
        }
      }
    }
  });
  if (maxima != nullptr) MergeMaxima(per_page, s, d, half, maxima);
  if (detect) {
    MergeKeyAmbiguity(page_ambiguity, d.kv_heads, ambiguity);
    ambiguity->key_score = std::move(key_score);
  }
  p->k_data = p->rotated_k.data();
  p->k_dtype = DType::kF32;
  p->k_layout = KvLayout::kNHD;
  p->k_scale.assign(static_cast<size_t>(d.kv_heads), 1.0);
  return absl::OkStatus();
}

// The pair maxima of the referenced K and V as stored (a post-RoPE cache:
// rotation keeps a pair's norm, so these are the rotated keys' too).
void ScanKeys(const Snapshot& s, const ResolvedLayout& layout,
              const RopeTable& rope, const SnapshotDims& d, int threads,
              PairMaxima* maxima) {
  const std::vector<uint8_t> referenced = ReferencedPages(layout, d);
  const size_t half = rope.inv_freq().size();
  std::vector<ScanPart> per_page(static_cast<size_t>(d.num_pages));
  ParallelFor(d.num_pages, threads, [&](int64_t page) {
    if (!referenced[page]) return;
    ScanPart& part = per_page[page];
    part.key_sq.assign(static_cast<size_t>(d.kv_heads) * half, 0.0f);
    part.value.assign(static_cast<size_t>(d.kv_heads), 0.0f);
    std::vector<float> row(static_cast<size_t>(d.head_dim));
    for (int64_t slot = 0; slot < d.page_size; ++slot) {
      if (s.slot_positions.IntAt(page * d.page_size + slot) < 0) continue;
      for (int64_t g = 0; g < d.kv_heads; ++g) {
        const int64_t src = KvSlotOffset(s.kv_layout, d, page, slot, g);
        ConvertToFloat(static_cast<const char*>(s.k_pages.raw()) +
                           src * DTypeSize(s.k_pages.dtype()),
                       s.k_pages.dtype(), d.head_dim, row.data());
        ScanKeyRow(row.data(), rope, g, &part);
        part.value[g] = std::max(part.value[g],
                                 ValueRowMax(s, d, page, slot, g, row.data()));
      }
    }
  });
  MergeMaxima(per_page, s, d, half, maxima);
}

// The dtypes the engine's rotated q and K are narrowed to (bf16 before an
// fp8 cache's quantisation).
DType QueryRotationDtype(const Snapshot& s) {
  return s.rope.q_output_dtype != DType::kInvalid ? s.rope.q_output_dtype
                                                  : s.q.dtype();
}

DType KeyRotationDtype(const Snapshot& s) {
  const DType out = s.rope.k_output_dtype != DType::kInvalid
                        ? s.rope.k_output_dtype
                        : s.k_pages.dtype();
  return IsFp8(out) ? DType::kBF16 : out;
}

// How far our scores can be from the engine's because attnaudit rotated q
// and/or K itself: per rotary pair, a rotation by an angle off by dtheta
// moves q_pair . k_pair by at most |q_pair| |k_pair| dtheta
// (docs/NUMERICS.md, "RoPE tables"). `bound` adds the pairs' worst cases
// (the tolerance); `typical` adds them in quadrature (independent pairs,
// the statistical detector's noise).
struct RopeScoreError {
  double bound = 0;
  double typical = 0;
};

RopeScoreError RopeScoreUncertainty(const PreparedAttention& p,
                                    const Snapshot& s,
                                    const ResolvedLayout& layout,
                                    const RopeTable& rope,
                                    const PairMaxima& m) {
  const SnapshotDims& d = p.dims;
  const size_t half = rope.inv_freq().size();
  std::vector<double> dq(half, 0.0), dk(half, 0.0);
  if (s.rope.q_state == RopeState::kPreRope) {
    for (int64_t pos : p.query_positions) {
      for (size_t i = 0; i < half; ++i) {
        dq[i] = std::max(dq[i], rope.AngleUncertainty(pos, i));
      }
    }
  }
  if (s.rope.k_state == RopeState::kPreRope) {
    const Tensor& rope_pos = s.key_rope_positions.present()
                                 ? s.key_rope_positions
                                 : s.slot_positions;
    // The bound grows with |position| except where the engine's own row
    // gives the angle: the extreme position without a row bounds it.
    int64_t extreme = -1;
    const std::vector<uint8_t> referenced = ReferencedPages(layout, d);
    for (int64_t page = 0; page < d.num_pages; ++page) {
      if (!referenced[page]) continue;
      for (int64_t slot = 0; slot < d.page_size; ++slot) {
        if (s.slot_positions.IntAt(page * d.page_size + slot) < 0) continue;
        const int64_t pos = rope_pos.IntAt(page * d.page_size + slot);
        if (rope.SourceAt(pos) == RopeTable::Source::kEngineRow) continue;
        if (extreme < 0 || std::llabs(pos) > std::llabs(extreme)) extreme = pos;
      }
    }
    for (size_t i = 0; i < half && extreme >= 0; ++i) {
      dk[i] = rope.AngleUncertainty(extreme, i);
    }
  }
  if (s.precision.Undeclared()) {
    // An engine silent about its cast point and rounding may have narrowed
    // each rotated element anywhere within about two ulps of ours (the cast
    // points differ by up to 1.5, a truncation by one more): as an angle,
    // 4 eps of the rotation dtype per pair.
    const double q_ulps = 4.0 * DTypeEpsilon(QueryRotationDtype(s));
    const double k_ulps = 4.0 * DTypeEpsilon(KeyRotationDtype(s));
    for (size_t i = 0; i < half; ++i) {
      if (s.rope.q_state == RopeState::kPreRope) dq[i] += q_ulps;
      if (s.rope.k_state == RopeState::kPreRope) dk[i] += k_ulps;
    }
  }
  RopeScoreError e;
  double squares = 0;
  for (size_t i = 0; i < half; ++i) {
    const double term = m.query[i] * m.key[i] * (dq[i] + dk[i]);
    e.bound += term;
    squares += term * term;
  }
  e.bound *= p.softmax_scale;
  e.typical = p.softmax_scale * std::sqrt(squares);
  return e;
}

// Whether every angle attnaudit rotates with comes from the engine's own
// values: its inverse frequencies, or a row for every rotated position.
bool EngineAnglesEverywhere(const Snapshot& s, const PreparedAttention& p,
                            const ResolvedLayout& layout,
                            const RopeTable& rope) {
  if (rope.has_engine_inv_freq()) return true;
  if (!s.rope_table.positions.present()) return false;
  auto covered = [&](int64_t pos) {
    return rope.SourceAt(pos) == RopeTable::Source::kEngineRow;
  };
  if (s.rope.q_state == RopeState::kPreRope) {
    for (int64_t pos : p.query_positions) {
      if (!covered(pos)) return false;
    }
  }
  if (s.rope.k_state != RopeState::kPreRope) return true;
  const SnapshotDims& d = p.dims;
  const Tensor& rope_pos =
      s.key_rope_positions.present() ? s.key_rope_positions : s.slot_positions;
  const std::vector<uint8_t> referenced = ReferencedPages(layout, d);
  for (int64_t page = 0; page < d.num_pages; ++page) {
    if (!referenced[page]) continue;
    for (int64_t slot = 0; slot < d.page_size; ++slot) {
      const int64_t flat = page * d.page_size + slot;
      if (s.slot_positions.IntAt(flat) >= 0 && !covered(rope_pos.IntAt(flat))) {
        return false;
      }
    }
  }
  return true;
}

// q as the engine attends with it: rotated as the engine did when it is
// pre-RoPE; the largest |q pair| per rotary pair into *pair_max.
// With `q_gap` set, also each rotated element's gap
// (RopeTable::RotationAmbiguity) into it [B * Sq * Hq * D].
void RotateQueries(const Snapshot& s, const RopeTable& rope,
                   PreparedAttention* p, std::vector<double>* pair_max,
                   std::vector<float>* q_gap) {
  const SnapshotDims& d = p->dims;
  const size_t half = rope.inv_freq().size();
  pair_max->assign(half, 0.0);
  p->q.resize(
      static_cast<size_t>(d.batch * d.queries * d.q_heads * d.head_dim));
  const DType q_out_dtype = s.rope.q_output_dtype != DType::kInvalid
                                ? s.rope.q_output_dtype
                                : s.q.dtype();
  const bool rotate = s.rope.q_state == RopeState::kPreRope;
  std::vector<float> row(static_cast<size_t>(d.head_dim));
  // A query position's angles serve all of its heads.
  std::vector<float> cos_half(half);
  std::vector<float> sin_half(half);
  const bool detect = rotate && q_gap != nullptr;
  if (detect) q_gap->assign(p->q.size(), 0.0f);
  for (int64_t bs = 0; bs < d.batch * d.queries; ++bs) {
    if (rotate) {
      rope.Angles(p->query_positions[bs], cos_half.data(), sin_half.data());
    }
    for (int64_t h = 0; h < d.q_heads; ++h) {
      const int64_t base = (bs * d.q_heads + h) * d.head_dim;
      for (int64_t i = 0; i < d.head_dim; ++i) row[i] = s.q.FloatAt(base + i);
      for (size_t i = 0; i < half; ++i) {
        const int64_t a = PairIndex(rope.style(), i, half, false);
        const int64_t b = PairIndex(rope.style(), i, half, true);
        (*pair_max)[i] = std::max((*pair_max)[i], PairNorm(row.data(), a, b));
      }
      if (!rotate) {
        for (int64_t i = 0; i < d.head_dim; ++i) {
          p->q[base + i] = s.q.DoubleAt(base + i);
        }
        continue;
      }
      if (detect) {
        rope.RotationAmbiguity(row.data(), cos_half.data(), sin_half.data(),
                               q_out_dtype, p->query_positions[bs],
                               q_gap->data() + base);
      }
      rope.RotateAs(row.data(), cos_half.data(), sin_half.data(), q_out_dtype,
                    row.data());
      for (int64_t i = 0; i < d.head_dim; ++i) p->q[base + i] = row[i];
    }
  }
}

// Which (row, KV head) cells the slack's maxima need, [B * Hkv]: with
// ambiguous keys every one (their bound serves every row); else those of
// the rows with an ambiguous q element (a row without one has no slack to
// size). Empty when no element is ambiguous.
std::vector<uint8_t> SlackCells(const SnapshotDims& d,
                                const std::vector<float>& q_gap,
                                bool every_cell) {
  if (!every_cell && q_gap.empty()) return {};
  std::vector<uint8_t> cells(static_cast<size_t>(d.batch * d.kv_heads),
                             every_cell);
  const int64_t group = d.q_heads / d.kv_heads;
  const int64_t rows = d.batch * d.queries * d.q_heads;
  for (int64_t row = 0; !every_cell && row < rows; ++row) {
    const float* gap = &q_gap[row * d.head_dim];
    if (std::any_of(gap, gap + d.head_dim, [](float g) { return g != 0; })) {
      const int64_t b = row / (d.queries * d.q_heads);
      cells[b * d.kv_heads + (row % d.q_heads) / group] = 1;
    }
  }
  return cells;
}

// Per KV head and dim the largest |q| of the query heads reading it.
std::vector<double> QueryDimMaxima(const PreparedAttention& p) {
  const SnapshotDims& d = p.dims;
  const int64_t group = d.q_heads / d.kv_heads;
  std::vector<double> out(static_cast<size_t>(d.kv_heads * d.head_dim), 0.0);
  for (int64_t bs = 0; bs < d.batch * d.queries; ++bs) {
    for (int64_t h = 0; h < d.q_heads; ++h) {
      const double* q = &p.q[(bs * d.q_heads + h) * d.head_dim];
      double* m = &out[(h / group) * d.head_dim];
      for (int64_t i = 0; i < d.head_dim; ++i) {
        const double a = std::fabs(q[i]);
        if (std::isfinite(a)) m[i] = std::max(m[i], a);
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<PreparedAttention> PrepareAttention(const Snapshot& s,
                                                   const ResolvedLayout& layout,
                                                   int threads) {
  PreparedAttention p;
  p.snapshot = &s;
  p.layout = &layout;
  p.dims = layout.dims;
  const SnapshotDims& d = p.dims;
  p.softmax_scale = EffectiveScale(s);
  p.softcap = s.logit_softcap;
  p.window = s.sliding_window;
  p.window_inclusive =
      s.window_convention == SlidingWindowConvention::kFlashLeft;
  if (s.sinks.present()) {
    p.sinks.resize(static_cast<size_t>(d.q_heads));
    for (int64_t h = 0; h < d.q_heads; ++h) p.sinks[h] = s.sinks.DoubleAt(h);
  }
  p.lse_includes_sinks = s.engine_lse_includes_sinks && !p.sinks.empty();
  p.output_dtype = EffectiveOutputDType(s);
  p.k_data = s.k_pages.raw();
  p.k_dtype = s.k_pages.dtype();
  p.k_layout = s.kv_layout;
  p.v_data = s.v_pages.raw();
  p.v_dtype = s.v_pages.dtype();
  p.v_layout = s.kv_layout;
  p.k_scale = PerHeadScale(s.k_scale, d.kv_heads);
  p.v_scale = PerHeadScale(s.v_scale, d.kv_heads);

  p.units = PlanUnits(s, layout);
  p.block_unit_begin.resize(p.units.size());
  for (size_t b = 0; b < p.units.size(); ++b) {
    std::vector<int32_t>& begin = p.block_unit_begin[b];
    begin.assign(layout.block_pages[b].size() + 1, 0);
    for (const KvUnit& unit : p.units[b]) ++begin[unit.block + 1];
    for (size_t i = 1; i < begin.size(); ++i) begin[i] += begin[i - 1];
  }

  p.query_positions.resize(static_cast<size_t>(d.batch * d.queries));
  for (int64_t i = 0; i < d.batch * d.queries; ++i) {
    p.query_positions[i] = s.query_positions.IntAt(i);
  }

  const bool need_rope = s.rope.q_state == RopeState::kPreRope ||
                         s.rope.k_state == RopeState::kPreRope;
  if (!need_rope) {
    p.q.resize(
        static_cast<size_t>(d.batch * d.queries * d.q_heads * d.head_dim));
    for (size_t i = 0; i < p.q.size(); ++i) p.q[i] = s.q.DoubleAt(i);
    return p;
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(const RopeTable rope, EngineRopeOf(s, d.head_dim));
  PairMaxima maxima;
  // With the engine's own angles everywhere and its arithmetic declared,
  // our rotation is the engine's up to two libms' cos/sin (a few fp32 ulps
  // of angle): no snapshot-wide uncertainty and no scan of the cache, but
  // the elements that lie at a rounding boundary of the rotation dtype
  // within that difference may round the other way (RotationAmbiguity):
  // their rows get a bound of their own. With our own angles somewhere, or
  // an undeclared engine, RopeScoreUncertainty's snapshot-wide term holds
  // every score instead (the conformance sweeps' clean runs stay inside it).
  const bool exact =
      EngineAnglesEverywhere(s, p, layout, rope) && !s.precision.Undeclared();
  const bool detect = exact;
  std::vector<float> q_gap;
  RotateQueries(s, rope, &p, &maxima.query, detect ? &q_gap : nullptr);
  KeyAmbiguity key_ambiguity;
  if (s.rope.k_state == RopeState::kPreRope) {
    const std::vector<double> query_dim_max =
        detect ? QueryDimMaxima(p) : std::vector<double>();
    ATTNAUDIT_RETURN_IF_ERROR(
        RotateKeys(s, layout, rope, &p, exact ? nullptr : &maxima, threads,
                   detect ? &query_dim_max : nullptr, &key_ambiguity));
  } else if (!exact) {
    ScanKeys(s, layout, rope, d, threads, &maxima);
  }
  if (!exact) {
    const RopeScoreError rope_error =
        RopeScoreUncertainty(p, s, layout, rope, maxima);
    p.rope_score_uncertainty = rope_error.bound;
    p.rope_score_noise = rope_error.typical;
    p.value_max = maxima.value;
  }
  if (detect) {
    const DType rotation_dtype = s.rope.q_state == RopeState::kPreRope
                                     ? QueryRotationDtype(s)
                                     : KeyRotationDtype(s);
    for (float g : q_gap) p.ambiguous_q_elements += g != 0.0f;
    p.ambiguous_k_elements = key_ambiguity.elements;
    if (p.ambiguous_q_elements > 0 || key_ambiguity.elements > 0) {
      p.slack_cells = SlackCells(d, q_gap, key_ambiguity.elements > 0);
      p.rotation_dtype = rotation_dtype;
      if (p.ambiguous_q_elements > 0) p.slack_q_gap = std::move(q_gap);
      if (key_ambiguity.elements > 0) {
        p.slack_key_head_score = std::move(key_ambiguity.head_score);
        p.slack_key_score = std::move(key_ambiguity.key_score);
      }
    }
  }
  return p;
}

namespace attention_internal {

void FoldSlackMaxima(const PreparedAttention& p, int64_t page, int64_t n,
                     const int64_t* positions, int64_t g, AbsMaxima* key,
                     AbsMaxima* value) {
  const SnapshotDims& d = p.dims;
  const auto stride = [&](KvLayout layout) {
    return KvSlotOffset(layout, d, 0, 1, 0) - KvSlotOffset(layout, d, 0, 0, 0);
  };
  const char* k = static_cast<const char*>(p.k_data);
  const char* v = static_cast<const char*>(p.v_data);
  // Runs of active slots, each in one call (an inactive slot's bytes may
  // be anything).
  for (int64_t t = 0; t < n;) {
    if (positions[t] < 0) {
      ++t;
      continue;
    }
    int64_t end = t + 1;
    while (end < n && positions[end] >= 0) ++end;
    key->AddRows(
        k + KvSlotOffset(p.k_layout, d, page, t, g) * DTypeSize(p.k_dtype),
        end - t, stride(p.k_layout));
    value->AddRows(
        v + KvSlotOffset(p.v_layout, d, page, t, g) * DTypeSize(p.v_dtype),
        end - t, stride(p.v_layout));
    t = end;
  }
}

}  // namespace attention_internal

namespace {

// The maxima of the marked cells read here, for a backend whose pass did
// not take them: each row's blocks as the pass reads them.
void ReadSlackMaxima(const PreparedAttention& p, int threads,
                     std::vector<AbsMaxima>* key,
                     std::vector<AbsMaxima>* value) {
  const SnapshotDims& d = p.dims;
  ParallelFor(d.batch, threads, [&](int64_t b) {
    const std::vector<int32_t>& pages = p.layout->block_pages[b];
    const int64_t length = p.layout->seq_lens[b];
    std::vector<int64_t> positions(static_cast<size_t>(d.page_size));
    for (size_t blk = 0; blk < pages.size(); ++blk) {
      const int64_t first = static_cast<int64_t>(blk) * d.page_size;
      const int64_t n = std::min(d.page_size, length - first);
      for (int64_t t = 0; t < n; ++t) {
        positions[t] =
            p.snapshot->slot_positions.IntAt(pages[blk] * d.page_size + t);
      }
      for (int64_t g = 0; g < d.kv_heads; ++g) {
        const int64_t cell = b * d.kv_heads + g;
        if (!p.slack_cells[cell]) continue;
        attention_internal::FoldSlackMaxima(p, pages[blk], n, positions.data(),
                                            g, &(*key)[cell], &(*value)[cell]);
      }
    }
  });
}

}  // namespace

// An ambiguous q element (b, s, h, d) moves every score of its row by at
// most gap * |k_{j,d}| * scale, so the row's scores move by at most scale *
// sum over its ambiguous elements of gap * max_j |k_{j,d}|, the maximum
// over the KV head's marked cells. An ambiguous key element moves one key's
// score, by at most gap * |q_d| * scale; the largest such key of a KV head
// (slack_key_head_score) bounds every row of the heads reading it (a row's
// LSE and output move by at most the largest shift of its scores, so one
// key's bound serves all). The maxima are of our values; the engine's may
// be a flip larger, so they are widened by two ulps of the rotation dtype.
void FinishRowSlack(const AttentionResults& results, int threads,
                    PreparedAttention* p) {
  if (p->slack_cells.empty()) return;
  const SnapshotDims& d = p->dims;
  const size_t cells = p->slack_cells.size();
  std::vector<AbsMaxima> key_read, value_read;
  const std::vector<AbsMaxima>* key = &results.slack_key_maxima;
  const std::vector<AbsMaxima>* value = &results.slack_value_maxima;
  if (key->size() != cells || value->size() != cells) {
    key_read.assign(cells, AbsMaxima(p->k_dtype, d.head_dim));
    value_read.assign(cells, AbsMaxima(p->v_dtype, d.head_dim));
    ReadSlackMaxima(*p, threads, &key_read, &value_read);
    key = &key_read;
    value = &value_read;
  }
  std::vector<AbsMaxima> head_key(static_cast<size_t>(d.kv_heads),
                                  AbsMaxima(p->k_dtype, d.head_dim));
  std::vector<AbsMaxima> head_value(static_cast<size_t>(d.kv_heads),
                                    AbsMaxima(p->v_dtype, d.head_dim));
  for (size_t cell = 0; cell < cells; ++cell) {
    if (!p->slack_cells[cell]) continue;
    head_key[cell % d.kv_heads].Merge((*key)[cell]);
    head_value[cell % d.kv_heads].Merge((*value)[cell]);
  }
  std::vector<double> key_dim_max(static_cast<size_t>(d.kv_heads * d.head_dim));
  for (int64_t g = 0; g < d.kv_heads; ++g) {
    for (int64_t i = 0; i < d.head_dim; ++i) {
      key_dim_max[g * d.head_dim + i] = head_key[g].At(i) * p->k_scale[g];
    }
  }
  const double widen = 1.0 + 2.0 * DTypeEpsilon(p->rotation_dtype);
  const int64_t group = d.q_heads / d.kv_heads;
  const int64_t rows = d.batch * d.queries * d.q_heads;
  p->row_score_uncertainty.assign(static_cast<size_t>(rows), 0.0);
  p->row_query_ambiguous.assign(static_cast<size_t>(rows), 0);
  p->row_value_max.assign(static_cast<size_t>(d.kv_heads), 0.0);
  for (int64_t g = 0; g < d.kv_heads; ++g) {
    p->row_value_max[g] = head_value[g].Max() * p->v_scale[g];
  }
  p->ambiguous_rows = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t g = (row % d.q_heads) / group;
    double delta = p->slack_key_head_score.empty()
                       ? 0.0
                       : p->slack_key_head_score[g] * widen;
    if (!p->slack_q_gap.empty()) {
      const float* gap = &p->slack_q_gap[row * d.head_dim];
      for (int64_t i = 0; i < d.head_dim; ++i) {
        if (gap[i] != 0.0f) {
          delta += gap[i] * key_dim_max[g * d.head_dim + i] * widen;
          p->row_query_ambiguous[row] = 1;
        }
      }
    }
    p->row_score_uncertainty[row] = delta * p->softmax_scale;
    p->ambiguous_rows += delta > 0;
  }
}

}  // namespace attnaudit
