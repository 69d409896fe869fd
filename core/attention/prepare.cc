// PrepareAttention: RoPE for q (and for a pre-RoPE K cache), fp8 scales, and
// the attention variant, resolved once per snapshot.
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/common/parallel.h"
#include "core/common/status_macros.h"
#include "core/rope/rope.h"

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

int64_t SlotOffset(KvLayout layout, const SnapshotDims& d, int64_t page,
                   int64_t slot, int64_t head) {
  if (layout == KvLayout::kNHD) {
    return ((page * d.page_size + slot) * d.kv_heads + head) * d.head_dim;
  }
  return ((page * d.kv_heads + head) * d.page_size + slot) * d.head_dim;
}

// Rotates every active slot of the referenced K pages into an f32 NHD pool,
// rounding to the K RoPE output dtype (the engine's one cast after RoPE).
absl::Status RotateKeys(const Snapshot& s, const ResolvedLayout& layout,
                        const RopeTable& rope, PreparedAttention* p,
                        int threads) {
  const SnapshotDims& d = p->dims;
  const DType out_dtype = s.rope.k_output_dtype != DType::kInvalid
                              ? s.rope.k_output_dtype
                              : s.k_pages.dtype();
  const Tensor& rope_pos =
      s.key_rope_positions.present() ? s.key_rope_positions : s.slot_positions;
  p->rotated_k.assign(
      static_cast<size_t>(d.num_pages * d.page_size * d.kv_heads * d.head_dim),
      0.0f);
  // Pages referenced by some row; inactive slots stay zero.
  std::vector<uint8_t> referenced(static_cast<size_t>(d.num_pages), 0);
  for (const auto& row : layout.block_pages) {
    for (int32_t page : row) referenced[page] = 1;
  }
  const std::vector<double> k_scale = PerHeadScale(s.k_scale, d.kv_heads);
  const bool requantize =
      out_dtype == DType::kF8E4M3 || out_dtype == DType::kF8E5M2;
  ParallelFor(d.num_pages, threads, [&](int64_t page) {
    if (!referenced[page]) return;
    std::vector<float> cos_half(rope.inv_freq().size());
    std::vector<float> sin_half(rope.inv_freq().size());
    std::vector<float> row(static_cast<size_t>(d.head_dim));
    for (int64_t slot = 0; slot < d.page_size; ++slot) {
      const int64_t pos = rope_pos.IntAt(page * d.page_size + slot);
      if (s.slot_positions.IntAt(page * d.page_size + slot) < 0) continue;
      rope.Angles(pos, cos_half.data(), sin_half.data());
      for (int64_t g = 0; g < d.kv_heads; ++g) {
        const int64_t src = SlotOffset(s.kv_layout, d, page, slot, g);
        const float ks = static_cast<float>(k_scale[g]);
        for (int64_t i = 0; i < d.head_dim; ++i) {
          row[i] = LoadAsFloat(s.k_pages.raw(), s.k_pages.dtype(), src + i);
          if (s.k_scale.present()) row[i] *= ks;
        }
        rope.RotateWith(row.data(), cos_half.data(), sin_half.data());
        float* dst =
            p->rotated_k.data() + SlotOffset(KvLayout::kNHD, d, page, slot, g);
        if (requantize) {
          // An fp8 cache stores the rotated key re-quantised with its scale;
          // the pool holds the dequantised value (the scale is applied here,
          // so the kernel's k_scale becomes 1).
          for (int64_t i = 0; i < d.head_dim; ++i) {
            dst[i] = RoundToDType(row[i] / ks, out_dtype) * ks;
          }
        } else {
          for (int64_t i = 0; i < d.head_dim; ++i) {
            dst[i] = RoundToDType(row[i], out_dtype);
          }
        }
      }
    }
  });
  p->k_data = p->rotated_k.data();
  p->k_dtype = DType::kF32;
  p->k_layout = KvLayout::kNHD;
  p->k_scale.assign(static_cast<size_t>(d.kv_heads), 1.0);
  return absl::OkStatus();
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
  absl::StatusOr<RopeTable> rope = absl::InternalError("unused");
  if (need_rope) {
    rope = RopeTable::Create(s.rope, d.head_dim);
    if (!rope.ok()) return rope.status();
  }

  const int64_t n_q = d.batch * d.queries * d.q_heads;
  p.q.resize(static_cast<size_t>(n_q * d.head_dim));
  const DType q_out_dtype = s.rope.q_output_dtype != DType::kInvalid
                                ? s.rope.q_output_dtype
                                : s.q.dtype();
  std::vector<float> row(static_cast<size_t>(d.head_dim));
  // A query position's angles serve all of its heads.
  const size_t half = need_rope ? rope->inv_freq().size() : 0;
  std::vector<float> cos_half(half);
  std::vector<float> sin_half(half);
  const bool rotate = s.rope.q_state != RopeState::kPostRope;
  for (int64_t bs = 0; bs < d.batch * d.queries; ++bs) {
    if (rotate) {
      rope->Angles(p.query_positions[bs], cos_half.data(), sin_half.data());
    }
    for (int64_t h = 0; h < d.q_heads; ++h) {
      const int64_t base = (bs * d.q_heads + h) * d.head_dim;
      if (!rotate) {
        for (int64_t i = 0; i < d.head_dim; ++i) {
          p.q[base + i] = s.q.DoubleAt(base + i);
        }
        continue;
      }
      for (int64_t i = 0; i < d.head_dim; ++i) row[i] = s.q.FloatAt(base + i);
      rope->RotateWith(row.data(), cos_half.data(), sin_half.data());
      for (int64_t i = 0; i < d.head_dim; ++i) {
        p.q[base + i] = RoundToDType(row[i], q_out_dtype);
      }
    }
  }
  if (s.rope.k_state == RopeState::kPreRope) {
    ATTNAUDIT_RETURN_IF_ERROR(RotateKeys(s, layout, *rope, &p, threads));
  }
  return p;
}

}  // namespace attnaudit
