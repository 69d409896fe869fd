// Attention recomputed under an alternative configuration, for the rows
// the diagnosis examines: the replay's own unit kernel (ComputeRunStates)
// over each block's page with a modified PreparedAttention (q, scale,
// soft-cap, window, fp8 scales) and, for the K RoPE hypotheses, re-rotated
// keys; the unit states are folded in fp64.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/parallel.h"
#include "core/common/status_macros.h"
#include "core/diagnosis/diagnosis_internal.h"
#include "core/rope/rope.h"
#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace diagnosis_internal {
namespace {

// A copy of the prepared inputs that shares their K/V (not the rotated
// pool, which is only pointed at).
PreparedAttention ShallowCopy(const PreparedAttention& p) {
  PreparedAttention a;
  a.snapshot = p.snapshot;
  a.layout = p.layout;
  a.dims = p.dims;
  a.q = p.q;
  a.query_positions = p.query_positions;
  a.k_data = p.k_data;
  a.k_dtype = p.k_dtype;
  a.k_layout = p.k_layout;
  a.v_data = p.v_data;
  a.v_dtype = p.v_dtype;
  a.v_layout = p.v_layout;
  a.k_scale = p.k_scale;
  a.v_scale = p.v_scale;
  a.softmax_scale = p.softmax_scale;
  a.softcap = p.softcap;
  a.window = p.window;
  a.window_inclusive = p.window_inclusive;
  a.sinks = p.sinks;
  a.lse_includes_sinks = p.lse_includes_sinks;
  a.output_dtype = p.output_dtype;
  a.units = p.units;
  a.block_unit_begin = p.block_unit_begin;
  return a;
}

// Base address and strides of a page of a pool in `layout`.
void PageAddress(const SnapshotDims& d, KvLayout layout, const void* data,
                 DType dtype, int64_t page, const void** base, int64_t* row,
                 int64_t* head) {
  const int64_t elem = DTypeSize(dtype);
  const int64_t page_elems = d.page_size * d.kv_heads * d.head_dim;
  *base = static_cast<const char*>(data) + page * page_elems * elem;
  *row = layout == KvLayout::kNHD ? d.kv_heads * d.head_dim : d.head_dim;
  *head = layout == KvLayout::kNHD ? d.head_dim : d.page_size * d.head_dim;
}

TokenRun PageRun(const PreparedAttention& p, int64_t k_page, int64_t v_page,
                 int64_t n, const int64_t* positions) {
  TokenRun run;
  PageAddress(p.dims, p.k_layout, p.k_data, p.k_dtype, k_page, &run.k_data,
              &run.k_row_stride, &run.k_head_stride);
  PageAddress(p.dims, p.v_layout, p.v_data, p.v_dtype, v_page, &run.v_data,
              &run.v_row_stride, &run.v_head_stride);
  run.k_dtype = p.k_dtype;
  run.v_dtype = p.v_dtype;
  run.positions = positions;
  run.n = n;
  return run;
}

void SlotPositions(const Snapshot& s, int64_t page, int64_t n,
                   int64_t page_size, std::vector<int64_t>* out) {
  out->resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    (*out)[t] = s.slot_positions.IntAt(page * page_size + t);
  }
}

int64_t RopePosition(const Snapshot& s, int64_t flat) {
  return s.key_rope_positions.present() ? s.key_rope_positions.IntAt(flat)
                                        : s.slot_positions.IntAt(flat);
}

// The KV head ranges [g0, g1) covering `kv_heads` (all when empty).
std::vector<std::pair<int64_t, int64_t>> Ranges(const SnapshotDims& d,
                                                std::vector<int64_t> kv_heads) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (kv_heads.empty()) {
    out.emplace_back(0, d.kv_heads);
    return out;
  }
  std::sort(kv_heads.begin(), kv_heads.end());
  for (int64_t g : kv_heads) {
    if (!out.empty() && out.back().second == g) {
      out.back().second = g + 1;
    } else {
      out.emplace_back(g, g + 1);
    }
  }
  return out;
}

// Transformed keys of one page ([n][Hkv][D] f32, fp8 scales applied) for
// the K RoPE and layout hypotheses (KeyTransform).
class KeyRotator {
 public:
  static absl::StatusOr<KeyRotator> Create(const Context& ctx,
                                           const AltSpec& spec) {
    KeyRotator k(ctx, spec.keys);
    const RopeConfig& config = ctx.in->snapshot->rope;
    if (spec.keys == KeyTransform::kTransposed) return k;
    const bool pre_k = ctx.in->snapshot->rope.k_state == RopeState::kPreRope;
    if (spec.keys == KeyTransform::kReRotate) {
      if (spec.key_rope == nullptr || !pre_k) {
        return absl::FailedPreconditionError("no pre-RoPE keys to rotate");
      }
      ATTNAUDIT_ASSIGN_OR_RETURN(
          RopeTable table, RopeTable::Create(*spec.key_rope, ctx.d.head_dim));
      k.tables_.push_back(std::move(table));
      return k;
    }
    ATTNAUDIT_ASSIGN_OR_RETURN(RopeTable table,
                               RopeTable::Create(config, ctx.d.head_dim));
    k.tables_.push_back(std::move(table));
    if (spec.keys == KeyTransform::kRestyle) {
      RopeConfig other = config;
      other.style = config.style == RopeStyle::kNeox ? RopeStyle::kGptj
                                                     : RopeStyle::kNeox;
      ATTNAUDIT_ASSIGN_OR_RETURN(RopeTable t2,
                                 RopeTable::Create(other, ctx.d.head_dim));
      k.tables_.push_back(std::move(t2));
    }
    return k;
  }

  const float* Page(int64_t page, int64_t n) {
    const PreparedAttention& p = *ctx_.p;
    const SnapshotDims& d = ctx_.d;
    const int64_t D = d.head_dim;
    buffer_.assign(static_cast<size_t>(n * d.kv_heads * D), 0.0f);
    if (transform_ == KeyTransform::kTransposed) {
      Transposed(page, n);
      return buffer_.data();
    }
    if (transform_ == KeyTransform::kReRotate) {
      ReRotated(page, n);
      return buffer_.data();
    }
    const void* base;
    int64_t row, head;
    PageAddress(d, p.k_layout, p.k_data, p.k_dtype, page, &base, &row, &head);
    const RopeTable& t = tables_[0];
    cos_.resize(t.inv_freq().size());
    sin_.resize(t.inv_freq().size());
    const float undo = 1.0f / (t.magnitude() * t.magnitude());
    for (int64_t slot = 0; slot < n; ++slot) {
      const int64_t pos =
          RopePosition(*ctx_.in->snapshot, page * d.page_size + slot);
      for (int64_t g = 0; g < d.kv_heads; ++g) {
        float* k = &buffer_[(slot * d.kv_heads + g) * D];
        const float ks = static_cast<float>(p.k_scale[g]);
        ConvertToFloat(static_cast<const char*>(base) +
                           (slot * row + g * head) * DTypeSize(p.k_dtype),
                       p.k_dtype, D, k);
        if (ks != 1.0f) {
          for (int64_t i = 0; i < D; ++i) k[i] *= ks;
        }
      }
      if (pos < 0) continue;  // an unused slot: nothing to rotate
      if (transform_ == KeyTransform::kRotateAgain) {
        t.Angles(pos, cos_.data(), sin_.data());
        RotateAll(t, slot, 1.0f);
      } else {
        t.Angles(-pos, cos_.data(), sin_.data());
        RotateAll(t, slot, undo);
        if (transform_ == KeyTransform::kRestyle) {
          tables_[1].Angles(pos, cos_.data(), sin_.data());
          RotateAll(tables_[1], slot, 1.0f);
        }
      }
    }
    return buffer_.data();
  }

 private:
  KeyRotator(const Context& ctx, KeyTransform transform)
      : ctx_(ctx), transform_(transform) {}

  void RotateAll(const RopeTable& t, int64_t slot, float factor) {
    const int64_t D = ctx_.d.head_dim;
    for (int64_t g = 0; g < ctx_.d.kv_heads; ++g) {
      float* k = &buffer_[(slot * ctx_.d.kv_heads + g) * D];
      t.RotateWith(k, cos_.data(), sin_.data());
      if (factor != 1.0f) {
        for (int64_t i = 0; i < t.rotary_dim(); ++i) k[i] *= factor;
      }
    }
  }

  // The snapshot's pre-RoPE keys rotated with the hypothesis' RoPE, as the
  // prepared pool was with the declared one (cast point, output dtype).
  void ReRotated(int64_t page, int64_t n) {
    const Snapshot& s = *ctx_.in->snapshot;
    const SnapshotDims& d = ctx_.d;
    const int64_t D = d.head_dim;
    const RopeTable& t = tables_[0];
    const DType out = s.rope.k_output_dtype != DType::kInvalid
                          ? s.rope.k_output_dtype
                          : s.k_pages.dtype();
    const DType rotation = IsFp8(out) ? DType::kBF16 : out;
    const void* base;
    int64_t row, head;
    PageAddress(d, s.kv_layout, s.k_pages.raw(), s.k_pages.dtype(), page, &base,
                &row, &head);
    cos_.resize(t.inv_freq().size());
    sin_.resize(t.inv_freq().size());
    for (int64_t slot = 0; slot < n; ++slot) {
      const int64_t flat = page * d.page_size + slot;
      const bool used = s.slot_positions.IntAt(flat) >= 0;
      if (used) t.Angles(RopePosition(s, flat), cos_.data(), sin_.data());
      for (int64_t g = 0; g < d.kv_heads; ++g) {
        float* k = &buffer_[(slot * d.kv_heads + g) * D];
        ConvertToFloat(
            static_cast<const char*>(base) +
                (slot * row + g * head) * DTypeSize(s.k_pages.dtype()),
            s.k_pages.dtype(), D, k);
        const float ks = static_cast<float>(ScaleOf(s.k_scale, g));
        for (int64_t i = 0; i < D && ks != 1.0f; ++i) k[i] *= ks;
        if (used) t.RotateAs(k, cos_.data(), sin_.data(), rotation, k);
      }
    }
  }

  // Each KV head's [page_size, D] block of the page read in memory order as
  // [D, page_size]: the key of slot j is column j.
  void Transposed(int64_t page, int64_t n) {
    const PreparedAttention& p = *ctx_.p;
    const SnapshotDims& d = ctx_.d;
    const int64_t D = d.head_dim, P = d.page_size;
    const void* base;
    int64_t row, head;
    PageAddress(d, p.k_layout, p.k_data, p.k_dtype, page, &base, &row, &head);
    std::vector<float> block(static_cast<size_t>(P * D));
    for (int64_t g = 0; g < d.kv_heads; ++g) {
      for (int64_t t = 0; t < P; ++t) {
        ConvertToFloat(static_cast<const char*>(base) +
                           (t * row + g * head) * DTypeSize(p.k_dtype),
                       p.k_dtype, D, &block[t * D]);
      }
      const float ks = static_cast<float>(p.k_scale[g]);
      for (int64_t j = 0; j < n; ++j) {
        float* k = &buffer_[(j * d.kv_heads + g) * D];
        for (int64_t i = 0; i < D; ++i) k[i] = block[i * P + j] * ks;
      }
    }
  }

  static double ScaleOf(const Tensor& scale, int64_t g) {
    if (!scale.present()) return 1.0;
    return scale.num_elements() == 1 ? scale.DoubleAt(0) : scale.DoubleAt(g);
  }

  const Context& ctx_;
  KeyTransform transform_;
  std::vector<RopeTable> tables_;
  std::vector<float> buffer_, cos_, sin_;
};

// The query slot that computes head h under a GQA remapping: the heads
// reading KV head g fill g's group in head order.
std::vector<int64_t> SlotsOf(const SnapshotDims& d,
                             const std::vector<int64_t>& kv_of) {
  std::vector<int64_t> slot(static_cast<size_t>(d.q_heads), 0);
  std::vector<int64_t> used(static_cast<size_t>(d.kv_heads), 0);
  for (int64_t h = 0; h < d.q_heads; ++h) {
    const int64_t g = kv_of[h];
    slot[h] = g * d.group() + used[g]++;
  }
  return slot;
}

// The run's units: the plan units of logical block j of row b.
void BlockUnits(const PreparedAttention& p, int64_t b, int64_t j,
                TokenRun* run) {
  for (int32_t u = p.block_unit_begin[b][j]; u < p.block_unit_begin[b][j + 1];
       ++u) {
    run->unit_of.push_back(u);
    run->first.push_back(p.units[b][u].first);
    run->count.push_back(p.units[b][u].count);
  }
}

// Folds the row's P states of (s, slot) in fp64 into acc.
void FoldCell(const UnitStates& st, int64_t b, int64_t units, int64_t s,
              int64_t slot, Acc* acc) {
  acc->Clear();
  const int64_t D = st.head_dim;
  for (int64_t u = 0; u < units; ++u) {
    const int64_t i = st.Index(b, u, s, slot);
    acc->Add(&st.p_out[i * D], st.p_lse[i]);
  }
}

}  // namespace

namespace {

// What the specs of one pass share: the keys, soft-cap and window (q, the
// scales and the GQA slots differ per spec and ride as extra queries).
struct PassKey {
  int keys;
  const RopeConfig* key_rope;
  bool v_from_k;
  bool set_softcap;
  double softcap;
  bool set_window;
  int64_t window;
  bool gqa;
  bool operator<(const PassKey& o) const {
    return std::tie(keys, key_rope, v_from_k, set_softcap, softcap, set_window,
                    window, gqa) < std::tie(o.keys, o.key_rope, o.v_from_k,
                                            o.set_softcap, o.softcap,
                                            o.set_window, o.window, o.gqa);
  }
};

PassKey KeyOf(const AltSpec& s) {
  return {static_cast<int>(s.keys),
          s.key_rope.get(),
          s.v_from_k,
          s.set_softcap,
          s.set_softcap ? s.softcap : 0,
          s.set_window,
          s.set_window ? s.window : 0,
          !s.kv_of.empty()};
}

// q of one spec as the pass computes it: the spec's q (or the prepared
// one), a changed softmax scale or K scale folded into it (both multiply
// the score before any soft-cap), moved to the slot whose KV head the
// spec's head reads.
void StackQueries(const Context& ctx, const AltSpec& spec, int64_t b, int64_t v,
                  int64_t variants, std::vector<double>* q,
                  std::vector<int64_t>* slot) {
  const PreparedAttention& p = *ctx.p;
  const SnapshotDims& d = ctx.d;
  const int64_t D = d.head_dim;
  const std::vector<double>& src = spec.q.empty() ? p.q : spec.q;
  slot->resize(static_cast<size_t>(d.q_heads));
  for (int64_t h = 0; h < d.q_heads; ++h) (*slot)[h] = h;
  if (!spec.kv_of.empty()) *slot = SlotsOf(d, spec.kv_of);
  for (int64_t s = 0; s < d.queries; ++s) {
    for (int64_t h = 0; h < d.q_heads; ++h) {
      const int64_t g = spec.kv_of.empty() ? h / d.group() : spec.kv_of[h];
      double factor = spec.set_scale ? spec.scale / p.softmax_scale : 1.0;
      if (!spec.k_scale.empty()) factor *= spec.k_scale[g] / p.k_scale[g];
      const double* from = &src[((b * d.queries + s) * d.q_heads + h) * D];
      double* to =
          &(*q)[((b * d.queries * variants + v * d.queries + s) * d.q_heads +
                 (*slot)[h]) *
                D];
      for (int64_t i = 0; i < D; ++i) to[i] = from[i] * factor;
    }
  }
}

// The unit states of row b for one pass: every page of the row, chunks of
// blocks in parallel (they write disjoint states).
absl::Status RunPages(const Context& ctx, const PreparedAttention& alt,
                      const AltSpec& spec, int64_t b,
                      const std::vector<std::pair<int64_t, int64_t>>& ranges,
                      UnitStates* st) {
  const SnapshotDims& d = ctx.d;
  const int64_t D = d.head_dim, P = d.page_size;
  const int64_t L = ctx.in->layout->seq_lens[b];
  const int64_t blocks = (L + P - 1) / P;
  const int64_t chunks = std::min<int64_t>(blocks, 4 * ctx.opt->threads);
  const bool rotated = spec.keys != KeyTransform::kNone &&
                       spec.keys != KeyTransform::kSwapLayout;
  const KvLayout other =
      alt.k_layout == KvLayout::kNHD ? KvLayout::kHND : KvLayout::kNHD;
  std::vector<absl::Status> status(static_cast<size_t>(chunks));
  ParallelFor(chunks, ctx.opt->threads, [&](int64_t chunk) {
    std::vector<KeyRotator> rotator;
    if (rotated) rotator.push_back(*KeyRotator::Create(ctx, spec));
    std::vector<int64_t> positions;
    for (int64_t j = chunk; j < blocks; j += chunks) {
      const int64_t page = ctx.in->layout->block_pages[b][j];
      const int64_t n = std::min(P, L - j * P);
      SlotPositions(*ctx.in->snapshot, page, n, P, &positions);
      TokenRun run = PageRun(alt, page, page, n, positions.data());
      if (spec.keys == KeyTransform::kSwapLayout) {
        // The same page memory read with the other layout's strides.
        PageAddress(d, other, alt.k_data, alt.k_dtype, page, &run.k_data,
                    &run.k_row_stride, &run.k_head_stride);
        PageAddress(d, other, alt.v_data, alt.v_dtype, page, &run.v_data,
                    &run.v_row_stride, &run.v_head_stride);
      }
      if (!rotator.empty()) {
        run.k_data = rotator[0].Page(page, n);
        run.k_dtype = DType::kF32;
        run.k_row_stride = d.kv_heads * D;
        run.k_head_stride = D;
      }
      if (spec.v_from_k) {
        run.v_data = run.k_data;
        run.v_dtype = run.k_dtype;
        run.v_row_stride = run.k_row_stride;
        run.v_head_stride = run.k_head_stride;
      }
      BlockUnits(alt, b, j, &run);
      for (const auto& [g0, g1] : ranges) {
        absl::Status s = ComputeRunStates(alt, run, b, g0, g1, st);
        if (!s.ok()) status[chunk] = s;
      }
    }
  });
  for (const absl::Status& s : status) ATTNAUDIT_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// One pass for the specs `which` (sharing a PassKey): their queries are
// stacked as V * Sq queries of a copy of the prepared inputs.
absl::Status RunPass(const Context& ctx,
                     const std::vector<const AltSpec*>& specs,
                     const std::vector<size_t>& which, int64_t b,
                     const std::vector<int64_t>& kv_heads,
                     std::vector<RowResult>* results) {
  const PreparedAttention& p = *ctx.p;
  const SnapshotDims& d = ctx.d;
  const int64_t D = d.head_dim;
  const int64_t V = static_cast<int64_t>(which.size());
  const AltSpec& first = *specs[which[0]];
  PreparedAttention alt = ShallowCopy(p);
  alt.dims.queries = d.queries * V;
  alt.q.assign(static_cast<size_t>(d.batch * alt.dims.queries * d.q_heads * D),
               0.0);
  alt.query_positions.resize(static_cast<size_t>(d.batch * alt.dims.queries));
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int64_t k = 0; k < alt.dims.queries; ++k) {
      alt.query_positions[r * alt.dims.queries + k] =
          p.query_positions[r * d.queries + k % d.queries];
    }
  }
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) {
    StackQueries(ctx, *specs[which[v]], b, v, V, &alt.q, &slots[v]);
  }
  if (first.set_softcap) alt.softcap = first.softcap;
  if (first.set_window) alt.window = first.window;
  if (first.keys != KeyTransform::kNone &&
      first.keys != KeyTransform::kSwapLayout) {
    ATTNAUDIT_RETURN_IF_ERROR(KeyRotator::Create(ctx, first).status());
    alt.k_scale.assign(static_cast<size_t>(d.kv_heads), 1.0);
  }
  std::vector<std::vector<KvUnit>> plan(static_cast<size_t>(d.batch));
  plan[b] = p.units[b];
  UnitStates st;
  st.Reset(plan, alt.dims, false);
  // A GQA remap reads every KV head; otherwise the requested ones.
  const auto ranges =
      Ranges(d, first.kv_of.empty() ? kv_heads : std::vector<int64_t>{});
  ATTNAUDIT_RETURN_IF_ERROR(RunPages(ctx, alt, first, b, ranges, &st));
  std::vector<uint8_t> computed(static_cast<size_t>(d.kv_heads), 0);
  for (const auto& [g0, g1] : ranges) {
    for (int64_t g = g0; g < g1; ++g) computed[g] = 1;
  }
  Acc acc(D);
  const int64_t units = static_cast<int64_t>(plan[b].size());
  for (int64_t v = 0; v < V; ++v) {
    RowResult& result = (*results)[which[v]];
    result.Reset(d);
    for (int64_t s = 0; s < d.queries; ++s) {
      for (int64_t h = 0; h < d.q_heads; ++h) {
        const int64_t slot = slots[v][h];
        if (!computed[slot / d.group()]) continue;
        const int64_t c = s * d.q_heads + h;
        FoldCell(st, b, units, v * d.queries + s, slot, &acc);
        double* out = &result.out[c * D];
        double lse = acc.Lse();
        acc.Out(out, 1.0);
        FinishState(ctx, specs[which[v]], h, out, &lse);
        result.lse[c] = lse;
        result.have[c] = 1;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ComputeAlternatives(const Context& ctx,
                                 const std::vector<const AltSpec*>& specs,
                                 int64_t b,
                                 const std::vector<int64_t>& kv_heads,
                                 std::vector<RowResult>* results) {
  results->assign(specs.size(), RowResult());
  std::map<PassKey, std::vector<size_t>> passes;
  for (size_t i = 0; i < specs.size(); ++i)
    passes[KeyOf(*specs[i])].push_back(i);
  for (const auto& [key, which] : passes) {
    if (ctx.Cancelled()) return absl::CancelledError("audit cancelled");
    const absl::Status st = RunPass(ctx, specs, which, b, kv_heads, results);
    // A hypothesis that reads a non-finite value (an unused slot of a
    // partly filled page, read through another layout) does not apply:
    // its specs keep no computed cell.
    if (absl::IsInvalidArgument(st)) {
      for (size_t i : which) (*results)[i].Reset(ctx.d);
      continue;
    }
    ATTNAUDIT_RETURN_IF_ERROR(st);
  }
  return absl::OkStatus();
}

namespace {

// q rotated by `target` at query position + delta: from the snapshot's
// pre-RoPE q, or from the post-RoPE q rotated back by the declared RoPE
// (up to its rounding), under the snapshot's cast point.
absl::StatusOr<std::vector<double>> RotatedQueries(const Context& ctx,
                                                   const RopeTable& target,
                                                   int64_t delta) {
  const Snapshot& s = *ctx.in->snapshot;
  const SnapshotDims& d = ctx.d;
  const int64_t D = d.head_dim;
  ATTNAUDIT_ASSIGN_OR_RETURN(RopeTable table, RopeTable::Create(s.rope, D));
  const DType q_dtype = s.rope.q_output_dtype != DType::kInvalid
                            ? s.rope.q_output_dtype
                            : s.q.dtype();
  const bool pre = s.rope.q_state == RopeState::kPreRope;
  const float undo = 1.0f / (table.magnitude() * table.magnitude());
  std::vector<double> q(ctx.p->q.size());
  std::vector<float> row(static_cast<size_t>(D));
  std::vector<float> c(table.inv_freq().size()), sn(table.inv_freq().size());
  std::vector<float> tc(target.inv_freq().size()), ts(target.inv_freq().size());
  for (int64_t bs = 0; bs < d.batch * d.queries; ++bs) {
    const int64_t pos = ctx.p->query_positions[bs];
    target.Angles(pos + delta, tc.data(), ts.data());
    for (int64_t h = 0; h < d.q_heads; ++h) {
      const int64_t base = (bs * d.q_heads + h) * D;
      for (int64_t i = 0; i < D; ++i) {
        row[i] = pre ? s.q.FloatAt(base + i)
                     : static_cast<float>(ctx.p->q[base + i]);
      }
      if (!pre) {  // back to the pre-RoPE q (up to its rounding)
        table.Angles(-pos, c.data(), sn.data());
        table.RotateWith(row.data(), c.data(), sn.data());
        for (int64_t i = 0; i < table.rotary_dim(); ++i) row[i] *= undo;
      }
      target.RotateAs(row.data(), tc.data(), ts.data(), q_dtype, row.data());
      for (int64_t i = 0; i < D; ++i) q[base + i] = row[i];
    }
  }
  return q;
}

}  // namespace

absl::StatusOr<std::vector<double>> AlternativeQueries(const Context& ctx,
                                                       int64_t delta,
                                                       bool restyle) {
  const Snapshot& s = *ctx.in->snapshot;
  RopeConfig other_config = s.rope;
  if (restyle) {
    other_config.style =
        s.rope.style == RopeStyle::kNeox ? RopeStyle::kGptj : RopeStyle::kNeox;
  }
  // A shift keeps the engine's own table (its rows at the shifted
  // position, or its inverse frequencies); a new pairing does not need it.
  ATTNAUDIT_ASSIGN_OR_RETURN(
      RopeTable target,
      restyle ? RopeTable::Create(other_config, ctx.d.head_dim)
              : RopeTable::Create(other_config, ctx.d.head_dim, s.rope_table));
  target.SetFinalRounding(s.precision.rope_rounding);
  return RotatedQueries(ctx, target, delta);
}

absl::StatusOr<std::vector<double>> QueriesRotatedWith(
    const Context& ctx, const RopeConfig& config) {
  ATTNAUDIT_ASSIGN_OR_RETURN(RopeTable target,
                             RopeTable::Create(config, ctx.d.head_dim));
  target.SetFinalRounding(ctx.in->snapshot->precision.rope_rounding);
  return RotatedQueries(ctx, target, 0);
}

namespace {

bool VisibleTo(const PreparedAttention& p, int64_t key, int64_t query) {
  if (key < 0 || key > query) return false;
  if (p.window <= 0) return true;
  return p.window_inclusive ? query - key <= p.window : query - key < p.window;
}

}  // namespace

absl::Status ComputeRowStates(const Context& ctx, int64_t b, RowStates* rs) {
  const PreparedAttention& p = *ctx.p;
  const SnapshotDims& d = ctx.d;
  const int64_t P = d.page_size;
  rs->b = b;
  rs->units = p.units[b];
  std::vector<std::vector<KvUnit>> plan(static_cast<size_t>(d.batch));
  plan[b] = p.units[b];
  rs->states.Reset(plan, d, true);
  rs->block_begin = p.block_unit_begin[b];
  const int64_t L = ctx.in->layout->seq_lens[b];
  const int64_t blocks = (L + P - 1) / P;
  rs->pages.assign(static_cast<size_t>(blocks), 0);
  rs->full.assign(static_cast<size_t>(blocks), 0);
  const int64_t chunks = std::min<int64_t>(blocks, 4 * ctx.opt->threads);
  std::vector<absl::Status> status(static_cast<size_t>(chunks));
  ParallelFor(chunks, ctx.opt->threads, [&](int64_t chunk) {
    std::vector<int64_t> positions;
    for (int64_t j = chunk; j < blocks; j += chunks) {
      const int64_t page = ctx.in->layout->block_pages[b][j];
      const int64_t n = std::min(P, L - j * P);
      rs->pages[j] = static_cast<int32_t>(page);
      SlotPositions(*ctx.in->snapshot, page, n, P, &positions);
      bool full = n == P;
      for (int64_t s = 0; s < d.queries && full; ++s) {
        const int64_t qpos = p.query_positions[b * d.queries + s];
        for (int64_t t = 0; t < n && full; ++t) {
          full = VisibleTo(p, positions[t], qpos);
        }
      }
      rs->full[j] = full ? 1 : 0;
      TokenRun run = PageRun(p, page, page, n, positions.data());
      BlockUnits(p, b, j, &run);
      absl::Status s = ComputeRunStates(p, run, b, 0, d.kv_heads, &rs->states);
      if (!s.ok()) status[chunk] = s;
    }
  });
  for (const absl::Status& s : status) ATTNAUDIT_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

ValueStats RowValueStats(const Context& ctx, int64_t b) {
  const PreparedAttention& p = *ctx.p;
  const SnapshotDims& d = ctx.d;
  const int64_t D = d.head_dim;
  ValueStats vs;
  vs.max.assign(static_cast<size_t>(d.kv_heads), 0.0);
  vs.mean.assign(static_cast<size_t>(d.kv_heads * D), 0.0);
  vs.var.assign(static_cast<size_t>(d.kv_heads), 0.0);
  std::vector<double> sq(vs.mean.size(), 0.0);
  const int64_t L = ctx.in->layout->seq_lens[b];
  std::vector<float> values(static_cast<size_t>(D));
  for (int64_t j = 0; j * d.page_size < L; ++j) {
    const int64_t page = ctx.in->layout->block_pages[b][j];
    const int64_t n = std::min(d.page_size, L - j * d.page_size);
    const void* base;
    int64_t row, head;
    PageAddress(d, p.v_layout, p.v_data, p.v_dtype, page, &base, &row, &head);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t g = 0; g < d.kv_heads; ++g) {
        ConvertToFloat(static_cast<const char*>(base) +
                           (t * row + g * head) * DTypeSize(p.v_dtype),
                       p.v_dtype, D, values.data());
        for (int64_t i = 0; i < D; ++i) {
          const double v = values[i];
          vs.max[g] = std::max(vs.max[g], std::fabs(v));
          vs.mean[g * D + i] += v;
          sq[g * D + i] += v * v;
        }
      }
    }
  }
  const double count = static_cast<double>(std::max<int64_t>(L, 1));
  for (int64_t g = 0; g < d.kv_heads; ++g) {
    for (int64_t i = 0; i < D; ++i) {
      double& m = vs.mean[g * D + i];
      m /= count;
      vs.var[g] += std::max(0.0, sq[g * D + i] / count - m * m);
    }
    vs.var[g] /= static_cast<double>(D);
  }
  return vs;
}

namespace {

// States per cell of one page read as logical block `as_block` of row b:
// its first n slots at `positions`, seen by the row's queries moved by
// `query_shift` (TokenRun::query_shift).
absl::Status PageAsBlockStates(const Context& ctx, int64_t b, int64_t page,
                               int64_t as_block, int64_t n,
                               const int64_t* positions, int64_t query_shift,
                               std::vector<double>* out,
                               std::vector<double>* lse) {
  const PreparedAttention& p = *ctx.p;
  const SnapshotDims& d = ctx.d;
  const int64_t D = d.head_dim;
  std::vector<std::vector<KvUnit>> plan(static_cast<size_t>(d.batch));
  plan[b].push_back(
      KvUnit{static_cast<int32_t>(as_block), 0, static_cast<int32_t>(n), 0});
  UnitStates st;
  st.Reset(plan, d, false);
  TokenRun run = PageRun(p, page, page, n, positions);
  run.unit_of = {0};
  run.first = {0};
  run.count = {static_cast<int32_t>(n)};
  run.query_shift = query_shift;
  ATTNAUDIT_RETURN_IF_ERROR(ComputeRunStates(p, run, b, 0, d.kv_heads, &st));
  out->assign(static_cast<size_t>(ctx.Cells() * D), 0.0);
  lse->assign(static_cast<size_t>(ctx.Cells()),
              -std::numeric_limits<double>::infinity());
  for (int64_t s = 0; s < d.queries; ++s) {
    for (int64_t h = 0; h < d.q_heads; ++h) {
      const int64_t c = s * d.q_heads + h;
      const int64_t i = st.Index(b, 0, s, h);
      for (int64_t k = 0; k < D; ++k) (*out)[c * D + k] = st.p_out[i * D + k];
      (*lse)[c] = st.p_lse[i];
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ComputeSubstituteStates(const Context& ctx, int64_t b,
                                     int64_t page, int64_t as_block,
                                     std::vector<double>* out,
                                     std::vector<double>* lse) {
  const int64_t P = ctx.d.page_size;
  const int64_t L = ctx.in->layout->seq_lens[b];
  const int64_t n = std::min(P, L - as_block * P);
  const int64_t own_page = ctx.in->layout->block_pages[b][as_block];
  std::vector<int64_t> positions;
  SlotPositions(*ctx.in->snapshot, own_page, n, P, &positions);
  return PageAsBlockStates(ctx, b, page, as_block, n, positions.data(), 0, out,
                           lse);
}

absl::Status ComputeResizedLastBlock(const Context& ctx, int64_t b,
                                     int64_t delta, std::vector<double>* out,
                                     std::vector<double>* lse) {
  const int64_t P = ctx.d.page_size;
  const int64_t L = ctx.in->layout->seq_lens[b];
  const int64_t j = (L - 1) / P;
  const int64_t n = L - j * P;
  const int64_t resized = n + delta;
  if (resized < 1 || resized > P) {
    return absl::NotFoundError("no such slot in the last page");
  }
  const int64_t page = ctx.in->layout->block_pages[b][j];
  std::vector<int64_t> positions;
  SlotPositions(*ctx.in->snapshot, page, resized, P, &positions);
  // The slots past the row's end hold no position of the row: to the
  // engine they follow its newest key.
  const int64_t last_query = (b + 1) * ctx.d.queries - 1;
  for (int64_t t = n; t < resized; ++t) {
    positions[t] = ctx.p->query_positions[last_query] + (t - n + 1);
  }
  return PageAsBlockStates(ctx, b, page, j, resized, positions.data(), delta,
                           out, lse);
}

std::vector<int64_t> BlocksMovedByCount(const Context& ctx, int64_t b,
                                        int64_t delta) {
  const PreparedAttention& p = *ctx.p;
  const int64_t P = ctx.d.page_size;
  const int64_t L = ctx.in->layout->seq_lens[b];
  const int64_t last = (L - 1) / P;
  const int64_t* queries = &p.query_positions[b * ctx.d.queries];
  std::vector<int64_t> positions, moved;
  for (int64_t j = 0; j < last; ++j) {
    SlotPositions(*ctx.in->snapshot, ctx.in->layout->block_pages[b][j], P, P,
                  &positions);
    bool changes = false;
    for (int64_t t = 0; t < P && !changes; ++t) {
      for (int64_t s = 0; s < ctx.d.queries && !changes; ++s) {
        changes = KeyVisible(p, positions[t], queries[s]) !=
                  KeyVisible(p, positions[t], queries[s] + delta);
      }
    }
    if (changes) moved.push_back(j);
  }
  return moved;
}

absl::Status ComputeMovedBlock(const Context& ctx, int64_t b, int64_t block,
                               int64_t delta, std::vector<double>* out,
                               std::vector<double>* lse) {
  const int64_t P = ctx.d.page_size;
  const int64_t page = ctx.in->layout->block_pages[b][block];
  std::vector<int64_t> positions;
  SlotPositions(*ctx.in->snapshot, page, P, P, &positions);
  return PageAsBlockStates(ctx, b, page, block, P, positions.data(), delta, out,
                           lse);
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
