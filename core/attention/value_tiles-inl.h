// The value accumulation of the fused pass (attention_pass.cc), per SIMD
// target: acc[r][i] += sum_j e[r][j] v[j][i] for a group's rows, a fused
// multiply-add chain per output element in key order, run over register
// tiles of several rows and column vectors so that each V load feeds
// several FMAs. Included by attention_pass.cc inside its per-target
// namespace (Highway's -inl.h convention, as core/simd/simd-inl.h).
//
// Where a tile's finished columns go is a policy (`Out`): plain rows of
// running sums (R's online softmax), or a unit's normalised state
// (NormalisedOut), which divides by the row sums as the columns leave the
// registers, keeps them where the unit states live and carries them into
// the row's merge tree with the merge routine's element step. Each of those is
// the same rounded operation, in the same order, as the separate loops it
// replaces (divide the stored sums, copy, MergeTree::Add), so the bits are
// theirs (docs/NUMERICS.md, "R, P and E"); only the round trips through memory
// are gone.
//
// Pure functions over caller-owned buffers; thread-safe for disjoint
// outputs.

// Per-target include guard (Highway's convention for -inl.h headers).
#if defined(ATTNAUDIT_CORE_ATTENTION_VALUE_TILES_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef ATTNAUDIT_CORE_ATTENTION_VALUE_TILES_INL_H_
#undef ATTNAUDIT_CORE_ATTENTION_VALUE_TILES_INL_H_
#else
#define ATTNAUDIT_CORE_ATTENTION_VALUE_TILES_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/attention/attention_internal.h"
#include "core/attention/merge_step.h"
#include "core/simd/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

// Rows of running sums, `dim` apart: the tile reads them first (unless it
// starts from zero) and writes them back.
template <class D>
struct RowsOut {
  using T = hn::TFromD<D>;
  T* rows;
  int64_t dim;

  HWY_INLINE hn::Vec<D> Load(D d, int64_t r, int64_t i) const {
    return hn::LoadU(d, rows + r * dim + i);
  }
  // Row r's kCols vectors from column i.
  template <int kCols>
  HWY_INLINE void StoreRow(D d, int64_t r, int64_t i,
                           const hn::Vec<D>* a) const {
    constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(D()));
    for (int c = 0; c < kCols; ++c) {
      hn::StoreU(a[c], d, rows + r * dim + i + c * N);
    }
  }
  T LoadScalar(int64_t r, int64_t i) const { return rows[r * dim + i]; }
  void StoreScalar(int64_t r, int64_t i, T x) const { rows[r * dim + i] = x; }
};

using attention_internal::FoldRow;
using attention_internal::LeafPlan;

// A unit's state leaving the tile: out = sum / row sum, written to
// keep[r] (a unit state's slot; null: not kept) and, for fp32 with `plan`
// set, carried into row r's merge tree as plan[r] says: merged with each
// pending left node in turn (core/attention/merge_tree.h, PlanLeaf), the
// result written to its node. The tile starts from zero, so Load is never
// called.
template <class D>
struct NormalisedOut {
  using T = hn::TFromD<D>;
  const T* sum;          // [rows]
  T* const* keep;        // [rows] destinations, or null
  const LeafPlan* plan;  // [rows] P's merge tree, or null
  int64_t dim;

  HWY_INLINE hn::Vec<D> Load(D d, int64_t, int64_t) const {
    return hn::Zero(d);
  }
  // Row r's kCols vectors from column i.
  template <int kCols>
  HWY_INLINE void StoreRow(D d, int64_t r, int64_t i,
                           const hn::Vec<D>* a) const {
    constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(D()));
    const hn::Vec<D> row_sum = hn::Set(d, sum[r]);
    hn::Vec<D> o[kCols];
    for (int c = 0; c < kCols; ++c) o[c] = hn::Div(a[c], row_sum);
    if (keep != nullptr) {
      T* const to = keep[r] + i;
      for (int c = 0; c < kCols; ++c) hn::StoreU(o[c], d, to + c * N);
    }
    if constexpr (std::is_same_v<T, float>) {
      if (plan != nullptr) {
        const LeafPlan& lp = plan[r];
        for (int s = 0; s < lp.n; ++s) {
          MergeLeftInto<kCols>(d, lp.steps[s].fold, lp.steps[s].left + i, o);
        }
        for (int c = 0; c < kCols; ++c)
          hn::StoreU(o[c], d, lp.dest + i + c * N);
      }
    }
  }
  void StoreScalar(int64_t r, int64_t i, T a) const {
    T o = a / sum[r];
    if (keep != nullptr) keep[r][i] = o;
    if constexpr (std::is_same_v<T, float>) {
      if (plan == nullptr) return;
      const LeafPlan& lp = plan[r];
      for (int s = 0; s < lp.n; ++s) {
        o = merge_step::Element(lp.steps[s].fold.w, lp.steps[s].left[i], o);
      }
      lp.dest[i] = o;
    }
  }
  T LoadScalar(int64_t, int64_t) const { return T(0); }

  // o <- merge(left, o), lane for lane merge_step::Element (merge.cc's
  // PairElements with the left node as the accumulator; f by value: its
  // flags stay in registers across the columns).
  template <int kCols>
  static HWY_INLINE void MergeLeftInto(D d, const FoldRow f, const float* left,
                                       hn::Vec<D>* o) {
    constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(D()));
    if (f.kind == FoldRow::kZero) {
      for (int c = 0; c < kCols; ++c) o[c] = hn::Zero(d);
      return;
    }
    const hn::Vec<D> wa = hn::Set(d, f.w.wa);
    const hn::Vec<D> wb = hn::Set(d, f.w.wb);
    const hn::Vec<D> total = hn::Set(d, f.w.total);
    for (int c = 0; c < kCols; ++c) {
      hn::Vec<D> m = hn::Zero(d);
      if (f.use_acc) m = hn::Add(m, hn::Mul(wa, hn::LoadU(d, left + c * N)));
      if (f.use_next) m = hn::Add(m, hn::Mul(wb, o[c]));
      o[c] = hn::Div(m, total);
    }
  }
};

// out rows row0 + r (r < RT), kCols vectors of columns from i:
// += e[r * lde + j] * v[idx[j] * ldv + i], a fused multiply-add chain over
// j < count in j order. v may be bf16 or f32 under a wider accumulator
// (widened exactly as loaded). kFromZero: the chains start from +0 instead
// of the rows' contents. kConsecutive: idx[j] == idx[0] + j.
template <bool kFromZero, bool kConsecutive, int RT, int kCols, class D,
          class Out, typename V>
HWY_INLINE void AccumulateColumns(D d, Out out, int64_t row0, int64_t i,
                                  const hn::TFromD<D>* e, int64_t lde,
                                  const V* v, int64_t ldv, const int32_t* idx,
                                  int64_t count) {
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(D()));
  hn::Vec<D> a[RT][kCols];
  for (int r = 0; r < RT; ++r) {
    for (int c = 0; c < kCols; ++c) {
      a[r][c] = kFromZero ? hn::Zero(d) : out.Load(d, row0 + r, i + c * N);
    }
  }
  // Two keys an iteration halve the loop's own count-and-branch (each
  // chain still takes its keys in j order).
#pragma GCC unroll 2
  for (int64_t j = 0; j < count; ++j) {
    // Consecutive keys (the common case) step through the rows without
    // reading the index list.
    const V* vrow = v + (kConsecutive ? idx[0] + j : idx[j]) * ldv + i;
    hn::Vec<D> vv[kCols];
    if constexpr (kCols % 2 == 0) {
      for (int c = 0; c < kCols; c += 2) {
        LoadPairAs(d, vrow + c * N, &vv[c], &vv[c + 1]);
      }
    } else {
      for (int c = 0; c < kCols; ++c) vv[c] = LoadAs(d, vrow + c * N);
    }
    for (int r = 0; r < RT; ++r) {
      const hn::Vec<D> ej = hn::Set(d, e[r * lde + j]);
      for (int c = 0; c < kCols; ++c) a[r][c] = ExactMulAdd(ej, vv[c], a[r][c]);
    }
  }
  for (int r = 0; r < RT; ++r) {
    out.template StoreRow<kCols>(d, row0 + r, i, a[r]);
  }
}

// Column vectors per tile of RT rows: at least eight independent FMA
// chains (two FMA ports, four cycles each) within the registers: 16
// accumulators under AVX-512's 32 registers, 8 elsewhere. One or two rows
// (GQA groups of 1-3) would otherwise get two or four chains, and each V
// load would wait on the previous FMA.
template <int RT, class D>
constexpr int ColsPerTile() {
  constexpr bool wide = hn::MaxLanes(D()) * sizeof(hn::TFromD<D>) == 64;
  if constexpr (RT >= 4) return wide ? 4 : 2;
  if constexpr (RT == 2) return 4;
  return wide ? 8 : 4;
}

// Columns from *i in blocks of kCols vectors while they fit, then of half
// as many, down to single vectors (a short head_dim still gets several
// chains per tile).
template <bool kFromZero, bool kConsecutive, int RT, int kCols, class D,
          class Out, typename V>
HWY_INLINE void AccumulateBlocks(D d, Out out, int64_t row0, int64_t* i,
                                 const hn::TFromD<D>* e, int64_t lde,
                                 const V* v, int64_t ldv, const int32_t* idx,
                                 int64_t count, int64_t dim) {
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(D()));
  for (; *i + kCols * N <= dim; *i += kCols * N) {
    AccumulateColumns<kFromZero, kConsecutive, RT, kCols>(
        d, out, row0, *i, e, lde, v, ldv, idx, count);
  }
  if constexpr (kCols > 1) {
    AccumulateBlocks<kFromZero, kConsecutive, RT, kCols / 2>(
        d, out, row0, i, e, lde, v, ldv, idx, count, dim);
  }
}

// The same over every column: blocks of ColsPerTile vectors and smaller,
// then the elements past the last vector. Every column's chain is the
// same, so the blocking never changes a bit.
template <bool kFromZero, bool kConsecutive, int RT, class D, class Out,
          typename V>
HWY_INLINE void AccumulateTile(D d, Out out, int64_t row0,
                               const hn::TFromD<D>* e, int64_t lde, const V* v,
                               int64_t ldv, const int32_t* idx, int64_t count,
                               int64_t dim) {
  using T = hn::TFromD<D>;
  int64_t i = 0;
  AccumulateBlocks<kFromZero, kConsecutive, RT, ColsPerTile<RT, D>()>(
      d, out, row0, &i, e, lde, v, ldv, idx, count, dim);
  // Element-wise, so the scalar tail computes what a vector lane would.
  for (; i < dim; ++i) {
    for (int r = 0; r < RT; ++r) {
      T a = kFromZero ? T(0) : out.LoadScalar(row0 + r, i);
      for (int64_t j = 0; j < count; ++j) {
        a = std::fma(e[r * lde + j], ScalarAs<T>(v[idx[j] * ldv + i]), a);
      }
      out.StoreScalar(row0 + r, i, a);
    }
  }
}

template <bool kFromZero, bool kConsecutive, class D, class Out, typename V>
void AccumulateRowTiles(D d, Out out, int64_t rows, const hn::TFromD<D>* e,
                        int64_t lde, const V* v, int64_t ldv,
                        const int32_t* idx, int64_t count, int64_t dim) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    AccumulateTile<kFromZero, kConsecutive, 4>(d, out, r, e + r * lde, lde, v,
                                               ldv, idx, count, dim);
  }
  for (; r + 2 <= rows; r += 2) {
    AccumulateTile<kFromZero, kConsecutive, 2>(d, out, r, e + r * lde, lde, v,
                                               ldv, idx, count, dim);
  }
  for (; r < rows; ++r) {
    AccumulateTile<kFromZero, kConsecutive, 1>(d, out, r, e + r * lde, lde, v,
                                               ldv, idx, count, dim);
  }
}

// Whether the visible keys vis[0..count) are consecutive tokens (the
// common decode case: every token of the span is visible), so their scores
// can be read as contiguous vectors and their rows stepped through.
inline bool Consecutive(const int32_t* vis, int64_t count) {
  return count > 0 && vis[count - 1] - vis[0] == count - 1;
}

// out rows r < rows: += sum_j e[r][j] v[idx[j]], in tiles.
template <bool kFromZero = false, class D, class Out, typename V>
void AccumulateRows(D d, Out out, int64_t rows, const hn::TFromD<D>* e,
                    int64_t lde, const V* v, int64_t ldv, const int32_t* idx,
                    int64_t count, int64_t dim) {
  if (Consecutive(idx, count)) {
    return AccumulateRowTiles<kFromZero, true>(d, out, rows, e, lde, v, ldv,
                                               idx, count, dim);
  }
  AccumulateRowTiles<kFromZero, false>(d, out, rows, e, lde, v, ldv, idx, count,
                                       dim);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#endif  // ATTNAUDIT_CORE_ATTENTION_VALUE_TILES_INL_H_
