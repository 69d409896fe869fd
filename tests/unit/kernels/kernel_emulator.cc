#include "tests/unit/kernels/kernel_emulator.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/tensor/dtype.h"
#include "kernels/math/dot.h"
#include "kernels/math/scalar.h"
#include "kernels/math/split_merge.h"
#include "kernels/math/unit_state.h"
#include "kernels/math/widen.h"

namespace attnaudit {
namespace testing {
namespace {

using kmath::Ops;

// One (row, KV head) work item as a thread block holds it.
struct Block {
  int64_t n = 0;
  std::vector<float> k32, v32;   // [t][D]
  std::vector<double> k64, v64;  // f64 pages only
  std::vector<int32_t> vis;      // [sq][P]
  std::vector<int32_t> vcount;   // [sq]
  std::vector<float> s32;        // [row][P]
  std::vector<double> s64;
};

bool Visible(const PreparedAttention& p, int64_t key, int64_t query) {
  if (key < 0 || key > query) return false;
  if (p.window <= 0) return true;
  const int64_t distance = query - key;
  return p.window_inclusive ? distance <= p.window : distance < p.window;
}

void Widen(const PreparedAttention& p, int64_t page, int64_t g, Block* blk) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  auto one = [&](const void* data, DType dtype, KvLayout layout,
                 std::vector<float>* f, std::vector<double>* f64) {
    const int64_t row = layout == KvLayout::kNHD ? d.kv_heads * D : D;
    const int64_t head = layout == KvLayout::kNHD ? D : d.page_size * D;
    f->assign(static_cast<size_t>(blk->n * D), 0.0f);
    f64->assign(static_cast<size_t>(blk->n * D), 0.0);
    for (int64_t t = 0; t < blk->n; ++t) {
      for (int64_t i = 0; i < D; ++i) {
        const int64_t at =
            page * d.page_size * d.kv_heads * D + t * row + g * head + i;
        (*f)[t * D + i] =
            kmath::WidenToFloat(data, static_cast<int>(dtype), at);
        (*f64)[t * D + i] =
            kmath::WidenToDouble(data, static_cast<int>(dtype), at);
      }
    }
  };
  one(p.k_data, p.k_dtype, p.k_layout, &blk->k32, &blk->k64);
  one(p.v_data, p.v_dtype, p.v_layout, &blk->v32, &blk->v64);
}

void Scores(const PreparedAttention& p, int64_t b, int64_t g, Block* blk) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t group = d.group();
  const int64_t P = d.page_size;
  const bool f64k = p.k_dtype == DType::kF64;
  const float scale32 = Ops<float>::Mul(static_cast<float>(p.softmax_scale),
                                        static_cast<float>(p.k_scale[g]));
  const double scale64 = p.softmax_scale * p.k_scale[g];
  blk->s32.assign(static_cast<size_t>(d.queries * group * P), 0.0f);
  blk->s64.assign(static_cast<size_t>(d.queries * group * P), 0.0);
  for (int64_t r = 0; r < d.queries * group; ++r) {
    const int64_t h = g * group + r % group;
    const int64_t qi = (b * d.queries + r / group) * d.q_heads + h;
    std::vector<double> q64(p.q.begin() + qi * D, p.q.begin() + (qi + 1) * D);
    std::vector<float> q32(q64.begin(), q64.end());
    for (int64_t t = 0; t < blk->n; ++t) {
      const float dot32 = kmath::VirtualDot(q32.data(), &blk->k32[t * D], D);
      blk->s32[r * P + t] =
          kmath::Score(dot32, scale32, static_cast<float>(p.softcap));
      const double dot64 =
          f64k ? kmath::VirtualDot(q64.data(), &blk->k64[t * D], D)
               : kmath::VirtualDot(q64.data(), &blk->k32[t * D], D);
      blk->s64[r * P + t] = kmath::Score(dot64, scale64, p.softcap);
    }
  }
}

// The unit state of row r for visible list `vis` (count >= 1).
template <typename T>
void UnitOf(const Block& blk, const T* s, const int32_t* vis, int64_t count,
            int64_t D, bool f64v, std::vector<T>* out, T* lse) {
  std::vector<T> e(static_cast<size_t>(count));
  out->assign(static_cast<size_t>(D), T(0));
  auto row = [&](int32_t t) -> const void* {
    if constexpr (sizeof(T) == 8) {
      if (f64v) return &blk.v64[t * D];
    }
    return &blk.v32[t * D];
  };
  if constexpr (sizeof(T) == 8) {
    if (f64v) {
      kmath::UnitState<double, double>(s, vis, count, row, D, e.data(),
                                       out->data(), lse);
      return;
    }
  }
  kmath::UnitState<T, float>(s, vis, count, row, D, e.data(), out->data(), lse);
}

struct RowState {
  std::vector<double> acc;
  double m, l;
  std::vector<float> p_out;
  float p_lse;
  // Every unit's P state, merged in the unit tree after the runs.
  std::vector<std::vector<float>> unit_out;
  std::vector<float> unit_lse;
  std::vector<bool> unit_present;

  void Reset(int64_t D, int64_t units) {
    acc.assign(static_cast<size_t>(D), 0.0);
    m = Ops<double>::NegInf();
    l = 0;
    p_out.assign(static_cast<size_t>(D), 0.0f);
    p_lse = Ops<float>::NegInf();
    unit_out.assign(static_cast<size_t>(units), {});
    unit_lse.assign(static_cast<size_t>(units), 0.0f);
    unit_present.assign(static_cast<size_t>(units), false);
  }
};

// Each query's visible tokens of the page, in token order (the kernel's
// per-page visibility list).
void Visibility(const PreparedAttention& p, int64_t b, int64_t page,
                Block* blk) {
  const SnapshotDims& d = p.dims;
  const int64_t P = d.page_size;
  blk->vis.assign(static_cast<size_t>(d.queries * P), 0);
  blk->vcount.assign(static_cast<size_t>(d.queries), 0);
  for (int64_t q = 0; q < d.queries; ++q) {
    const int64_t qpos = p.query_positions[b * d.queries + q];
    for (int64_t t = 0; t < blk->n; ++t) {
      if (Visible(p, p.snapshot->slot_positions.IntAt(page * P + t), qpos)) {
        blk->vis[q * P + blk->vcount[q]++] = static_cast<int32_t>(t);
      }
    }
  }
}

// Runs [first_block, last_block) of row b, KV head g: R's running state
// and P's unit states.
void Item(const PreparedAttention& p, int64_t b, int64_t g, int32_t first_block,
          int32_t last_block, std::vector<RowState>& rows, UnitStates* states) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t P = d.page_size;
  const int64_t group = d.group();
  const int64_t L = p.layout->seq_lens[b];
  const bool f64v = p.v_dtype == DType::kF64;
  for (int64_t blk_i = first_block; blk_i < last_block; ++blk_i) {
    const int64_t page = p.layout->block_pages[b][blk_i];
    Block blk;
    blk.n = std::min(P, L - blk_i * P);
    Widen(p, page, g, &blk);
    Visibility(p, b, page, &blk);
    Scores(p, b, g, &blk);
    for (int64_t r = 0; r < d.queries * group; ++r) {
      const int64_t q = r / group;
      const int32_t* vis = &blk.vis[q * P];
      if (blk.vcount[q] == 0) continue;
      RowState& st = rows[r];
      std::vector<double> e(static_cast<size_t>(blk.vcount[q]));
      auto vrow = [&](int32_t t) -> const void* {
        return f64v ? static_cast<const void*>(&blk.v64[t * D])
                    : static_cast<const void*>(&blk.v32[t * D]);
      };
      if (f64v) {
        kmath::ReferenceUpdate<double, double>(&blk.s64[r * P], vis,
                                               blk.vcount[q], vrow, D, e.data(),
                                               &st.m, &st.l, st.acc.data());
      } else {
        kmath::ReferenceUpdate<double, float>(&blk.s64[r * P], vis,
                                              blk.vcount[q], vrow, D, e.data(),
                                              &st.m, &st.l, st.acc.data());
      }
    }
    for (int32_t u = p.block_unit_begin[b][blk_i];
         u < p.block_unit_begin[b][blk_i + 1]; ++u) {
      const KvUnit& unit = p.units[b][u];
      for (int64_t r = 0; r < d.queries * group; ++r) {
        const int64_t q = r / group;
        const int32_t* all = &blk.vis[q * P];
        const int32_t* lo =
            std::lower_bound(all, all + blk.vcount[q], unit.first);
        const int32_t* hi =
            std::lower_bound(lo, all + blk.vcount[q], unit.first + unit.count);
        if (hi == lo) continue;
        std::vector<float> out;
        float lse = 0;
        UnitOf<float>(blk, &blk.s32[r * P], lo, hi - lo, D, false, &out, &lse);
        RowState& st = rows[r];
        st.unit_out[u] = out;
        st.unit_lse[u] = lse;
        st.unit_present[u] = true;
        if (states == nullptr) continue;
        const int64_t h = g * group + r % group;
        const int64_t si = states->Index(b, u, q, h);
        std::copy(out.begin(), out.end(), &states->p_out[si * D]);
        states->p_lse[si] = lse;
        std::vector<double> rout;
        double rlse = 0;
        UnitOf<double>(blk, &blk.s64[r * P], lo, hi - lo, D, f64v, &rout,
                       &rlse);
        std::copy(rout.begin(), rout.end(), &states->r_out[si * D]);
        states->r_lse[si] = rlse;
      }
    }
  }
}

// The second step's P (split_merge.h): each element's unit tree, as the
// two kernels run it -- the roots of blocks of `tree_block` units, then
// the tree over `tree_blocks` roots.
void MergeUnitTree(int64_t tree_block, int64_t tree_blocks, int64_t D,
                   RowState* st) {
  const int64_t units = static_cast<int64_t>(st->unit_out.size());
  for (int64_t i = 0; i < D; ++i) {
    kmath::UnitTree top;
    top.Reset();
    for (int64_t j = 0; j < tree_blocks; ++j) {
      kmath::UnitTree block;
      block.Reset();
      for (int64_t u = j * tree_block;
           u < std::min(units, (j + 1) * tree_block); ++u) {
        if (st->unit_present[u]) {
          block.Add(u - j * tree_block, st->unit_out[u][i], st->unit_lse[u]);
        }
      }
      float out = 0;
      float lse = 0;
      block.Finish(&out, &lse);
      top.Add(j, out, lse);
    }
    top.Finish(&st->p_out[i], &st->p_lse);
  }
}

// The split-KV pass of row b, KV head g: each split's R from a fresh
// state, combined in split order; every unit's P state from its split.
void RunSplits(const PreparedAttention& p, int64_t b, int64_t g, int32_t blocks,
               int64_t splits, std::vector<RowState>& rows,
               UnitStates* states) {
  const int64_t D = p.dims.head_dim;
  const int64_t units = static_cast<int64_t>(p.units[b].size());
  std::vector<std::vector<RowState>> parts(static_cast<size_t>(splits), rows);
  for (int64_t s = 0; s < splits; ++s) {
    int32_t first = 0;
    int32_t last = 0;
    kmath::SplitRuns(0, blocks, splits, s, &first, &last);
    Item(p, b, g, first, last, parts[s], states);
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    RowState& st = rows[r];
    for (int64_t i = 0; i < D; ++i) {
      kmath::CombineReferenceSplits(
          splits, [&](int64_t s) { return parts[s][r].m; },
          [&](int64_t s) { return parts[s][r].l; },
          [&](int64_t s) { return parts[s][r].acc[i]; }, &st.m, &st.l,
          &st.acc[i]);
    }
    // A unit belongs to exactly one split: its state is that split's.
    for (const auto& part : parts) {
      for (int64_t u = 0; u < units; ++u) {
        if (!part[r].unit_present[u]) continue;
        st.unit_out[u] = part[r].unit_out[u];
        st.unit_lse[u] = part[r].unit_lse[u];
        st.unit_present[u] = true;
      }
    }
  }
}

}  // namespace

AttentionResults EmulateFusedPass(const PreparedAttention& p,
                                  UnitStates* states, int64_t splits) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t group = d.group();
  AttentionResults res;
  const size_t n_out = static_cast<size_t>(d.batch * d.queries * d.q_heads * D);
  const size_t n_lse = static_cast<size_t>(d.batch * d.queries * d.q_heads);
  res.reference_out.assign(n_out, 0.0);
  res.replay_out.assign(n_out, 0.0);
  res.reference_lse.assign(n_lse, 0.0);
  res.replay_lse.assign(n_lse, 0.0);
  if (states != nullptr) states->Reset(p.units, d, /*with_reference=*/true);
  // The backend's tree blocks: from the most units any row has.
  int64_t most = 0;
  for (const auto& row : p.units) {
    most = std::max<int64_t>(most, static_cast<int64_t>(row.size()));
  }
  const int64_t tree_block = kmath::TreeBlockUnits(most);
  const int64_t tree_blocks =
      std::max<int64_t>(1, (most + tree_block - 1) / tree_block);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t g = 0; g < d.kv_heads; ++g) {
      std::vector<RowState> rows(static_cast<size_t>(d.queries * group));
      const int64_t units = static_cast<int64_t>(p.units[b].size());
      for (RowState& r : rows) r.Reset(D, units);
      const int32_t blocks = static_cast<int32_t>(
          (p.layout->seq_lens[b] + d.page_size - 1) / d.page_size);
      if (splits <= 1) {
        Item(p, b, g, 0, blocks, rows, states);
      } else {
        RunSplits(p, b, g, blocks, splits, rows, states);
      }
      for (RowState& row : rows)
        MergeUnitTree(tree_block, tree_blocks, D, &row);
      for (int64_t r = 0; r < d.queries * group; ++r) {
        const int64_t h = g * group + r % group;
        const int64_t qi = (b * d.queries + r / group) * d.q_heads + h;
        FinishReferenceState(p, h, rows[r].acc.data(), rows[r].m, rows[r].l,
                             &res.reference_out[qi * D],
                             &res.reference_lse[qi]);
        FinishReplayState(p, h, rows[r].p_out.data(), rows[r].p_lse,
                          &res.replay_out[qi * D], &res.replay_lse[qi]);
      }
    }
  }
  SummariseUnits(p, true, &res);
  return res;
}

}  // namespace testing
}  // namespace attnaudit
