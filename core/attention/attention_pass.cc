// The fused R + P pass of one work item (batch row b, KV heads [g0, g1)),
// written once over Highway and compiled per SIMD target; RunPassItem
// picks the best target of the CPU at run time. Every target computes the
// same bits (core/simd/simd-inl.h states how).
//
// Per logical block (one page): the page's K and V rows are checked for
// non-finite values (the audit's only scan of the KV cache), then shared by
// every query row of each head's GQA group and every query position. bf16
// pages, the common case, are read in place and widened in registers as
// they are loaded; other dtypes are first widened into per-thread f32 (and
// f64) sweep buffers. Scores, exp and value accumulation run over register
// tiles of several rows at once, so each K/V load feeds several FMAs.

// clang-format off: foreach_target.h must come first, before the
// headers it re-includes for every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/attention/attention_pass.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/arithmetic/scalar_exp.h"
#include "core/attention/attention_internal.h"
#include "core/attention/unit_states.h"
#include "core/attention/value_tiles-inl.h"
#include "core/simd/dispatch.h"
#include "core/simd/simd-inl.h"
#include "core/tensor/dtype.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

using attention_internal::LeafPlan;
using attention_internal::PassContext;
using attention_internal::PlanFold;
using attention_internal::Scratch;
using attention_internal::TreeStep;
using attnaudit::TokenRun;

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

// Points *run at a pool page: its first n slots, rows addressed through
// the page's layout. The run's unit lists are left as they are (BlockUnits
// refills them), so their buffers last from page to page.
void PointAtPage(const PreparedAttention& p, int64_t page, int64_t n,
                 const int64_t* positions, TokenRun* run) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  auto address = [&](KvLayout layout, const void* data, DType dtype,
                     const void** base, int64_t* row, int64_t* head) {
    const int64_t elem = DTypeSize(dtype);
    const int64_t page_elems = d.page_size * d.kv_heads * D;
    *base = static_cast<const char*>(data) + page * page_elems * elem;
    *row = layout == KvLayout::kNHD ? d.kv_heads * D : D;
    *head = layout == KvLayout::kNHD ? D : d.page_size * D;
  };
  address(p.k_layout, p.k_data, p.k_dtype, &run->k_data, &run->k_row_stride,
          &run->k_head_stride);
  address(p.v_layout, p.v_data, p.v_dtype, &run->v_data, &run->v_row_stride,
          &run->v_head_stride);
  run->k_dtype = p.k_dtype;
  run->v_dtype = p.v_dtype;
  run->positions = positions;
  run->n = n;
}

// Widens K and V of KV heads [gs, ge) of the run's tokens into the sweep
// buffers ([head - gs][token][D]), reading in memory order so the hardware
// prefetchers stream it. Returns true when a value is not finite.
bool LoadSweep(const PreparedAttention& p, const TokenRun& run, int64_t gs,
               int64_t ge, Scratch& sc) {
  const int64_t D = p.dims.head_dim;
  const int64_t P = p.dims.page_size;
  bool bad = false;
  auto load = [&](const void* base, DType dtype, int64_t row_stride,
                  int64_t head_stride, std::vector<float>& f32,
                  std::vector<double>& f64) {
    // Token-major when a token's heads are adjacent (NHD), else head-major.
    const bool token_major = head_stride <= row_stride;
    for (int64_t outer = 0; outer < (token_major ? run.n : ge - gs); ++outer) {
      for (int64_t inner = 0; inner < (token_major ? ge - gs : run.n);
           ++inner) {
        const int64_t t = token_major ? outer : inner;
        const int64_t h = token_major ? inner : outer;
        const int64_t at = (h * P + t) * D;
        bad |= WidenRow(base, dtype, t * row_stride + (gs + h) * head_stride, D,
                        &f32[at], dtype == DType::kF64 ? &f64[at] : nullptr);
      }
    }
  };
  load(run.k_data, run.k_dtype, run.k_row_stride, run.k_head_stride,
       sc.sweep_k32, sc.sweep_k64);
  load(run.v_data, run.v_dtype, run.v_row_stride, run.v_head_stride,
       sc.sweep_v32, sc.sweep_v64);
  return bad;
}

// One KV head's block as the arithmetic reads it: bf16 rows in place in
// the page when K and V are bf16 (k16/v16); otherwise f32 rows of the
// sweep buffers for P, and for R the exact f64 rows of f64 pages (null
// otherwise: R widens the f32 rows as it loads them). Row t of K is at
// t * ldk elements, of V at t * ldv, whichever pointer is set.
struct HeadBlock {
  const float* k32 = nullptr;
  const float* v32 = nullptr;
  const double* k64 = nullptr;
  const double* v64 = nullptr;
  const hwy::bfloat16_t* k16 = nullptr;
  const hwy::bfloat16_t* v16 = nullptr;
  int64_t ldk = 0;
  int64_t ldv = 0;
};

HeadBlock SelectHead(const PreparedAttention& p, const TokenRun& run, int64_t h,
                     Scratch& sc) {
  const int64_t at = h * p.dims.page_size * p.dims.head_dim;
  HeadBlock blk;
  blk.k32 = &sc.sweep_k32[at];
  blk.v32 = &sc.sweep_v32[at];
  if (run.k_dtype == DType::kF64) blk.k64 = &sc.sweep_k64[at];
  if (run.v_dtype == DType::kF64) blk.v64 = &sc.sweep_v64[at];
  blk.ldk = blk.ldv = p.dims.head_dim;
  return blk;
}

// Calls f(k) with the K rows R reads, or P reads (f32 or bf16 in place).
template <class F>
void WithReferenceK(const HeadBlock& blk, F&& f) {
  if (blk.k64 != nullptr) return f(blk.k64);
  if (blk.k16 != nullptr) return f(blk.k16);
  f(blk.k32);
}
template <class F>
void WithReplayK(const HeadBlock& blk, F&& f) {
  if (blk.k16 != nullptr) return f(blk.k16);
  f(blk.k32);
}
// Likewise for V.
template <class F>
void WithReferenceV(const HeadBlock& blk, F&& f) {
  if (blk.v64 != nullptr) return f(blk.v64);
  if (blk.v16 != nullptr) return f(blk.v16);
  f(blk.v32);
}
template <class F>
void WithReplayV(const HeadBlock& blk, F&& f) {
  if (blk.v16 != nullptr) return f(blk.v16);
  f(blk.v32);
}

// Per query position, which of the run's tokens are visible (ascending
// token indices). Returns whether any query sees any token.
bool ComputeVisibility(const PassContext& ctx, int64_t b, const TokenRun& run,
                       Scratch& sc) {
  const PreparedAttention& p = ctx.p;
  const SnapshotDims& d = p.dims;
  const int64_t P = d.page_size;
  bool any = false;
  for (int64_t sq = 0; sq < d.queries; ++sq) {
    const int64_t qpos =
        p.query_positions[b * d.queries + sq] + run.query_shift;
    int32_t* vis = &sc.visible[sq * P];
    int64_t count = 0;
    for (int64_t t = 0; t < run.n; ++t) {
      if (attention_internal::Visible(p, run.positions[t], qpos)) {
        vis[count++] = static_cast<int32_t>(t);
      }
    }
    sc.visible_count[sq] = count;
    any = any || count > 0;
  }
  return any;
}

// Scaled (and soft-capped) scores of the `group` rows of q against the
// run's n keys.
template <class D, typename K>
void GroupScores(D d, const PassContext& ctx, const hn::TFromD<D>* q,
                 const K* k, int64_t ldk, int64_t n, hn::TFromD<D> scale,
                 hn::TFromD<D>* s) {
  using T = hn::TFromD<D>;
  const PreparedAttention& p = ctx.p;
  const int64_t group = p.dims.group();
  const int64_t P = p.dims.page_size;
  // The scale is applied as the scores leave the tiles (the same rounded
  // multiply as a loop over s afterwards).
  DotRows(d, q, group, k, ldk, n, p.dims.head_dim, s, P, scale);
  // The soft-cap in vectors: glibc's tanh, one score at a time, would be a
  // large share of a soft-capped model's pass.
  const T cap = static_cast<T>(p.softcap);
  if (!(cap > 0)) return;
  if (n == P) return SoftCapArray(d, cap, s, group * P);
  for (int64_t j = 0; j < group; ++j) SoftCapArray(d, cap, &s[j * P], n);
}

// The largest of s[vis[c]], c < count, exactly as the left fold
// m = std::max(m, x) from -inf computes it: NaN never wins and of equal
// values the first is kept. For consecutive keys the vector maximum is
// taken instead; it can differ from the fold only in the sign of a zero
// maximum, so a zero result is recomputed by the fold.
template <class D>
hn::TFromD<D> VisibleMax(D d, const hn::TFromD<D>* s, const int32_t* vis,
                         int64_t count) {
  using T = hn::TFromD<D>;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (Consecutive(vis, count)) {
    const T* x = s + vis[0];
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    const auto neg_inf = hn::Set(d, kNegInf);
    auto best = neg_inf;
    int64_t c = 0;
    for (; c + N <= count; c += N) {
      const auto v = hn::LoadU(d, x + c);
      best = hn::Max(best, hn::IfThenElse(hn::IsNaN(v), neg_inf, v));
    }
    T m = hn::GetLane(hn::MaxOfLanes(d, best));
    for (; c < count; ++c) m = std::max(m, x[c]);
    if (m != T(0)) return m;
  }
  T m = kNegInf;
  for (int64_t c = 0; c < count; ++c) m = std::max(m, s[vis[c]]);
  return m;
}

// e[c] = s[vis[c]] - m for c < count (contiguous loads for consecutive
// keys; the same subtraction either way).
template <class D>
void ShiftedScores(D d, const hn::TFromD<D>* s, const int32_t* vis,
                   int64_t count, hn::TFromD<D> m, hn::TFromD<D>* e) {
  int64_t c = 0;
  if (Consecutive(vis, count)) {
    const hn::TFromD<D>* x = s + vis[0];
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    const auto mv = hn::Set(d, m);
    for (; c + N <= count; c += N) {
      hn::StoreU(hn::Sub(hn::LoadU(d, x + c), mv), d, e + c);
    }
    for (; c < count; ++c) e[c] = x[c] - m;
    return;
  }
  for (; c < count; ++c) e[c] = s[vis[c]] - m;
}

// e[j * P + c] = exp(e[j * P + c]) for rows j < group and c < count: one
// array when the rows are back to back (count == P, the common case), so
// the exp chains of different rows overlap; element-wise either way.
template <class D>
void GroupExp(D d, hn::TFromD<D>* e, int64_t group, int64_t P, int64_t count) {
  if (count == P) return ExpNonPositiveArray(d, e, group * P, e);
  for (int64_t j = 0; j < group; ++j) {
    ExpNonPositiveArray(d, e + j * P, count, e + j * P);
  }
}

// sums[j] += e[j * lde + c] over c < count in c order, for rows j < rows:
// each row's chain is sequential (its bits are the plain loop's), four
// rows at a time so the chains overlap.
template <typename T>
void RowSums(const T* e, int64_t lde, int64_t rows, int64_t count, T* sums) {
  int64_t j = 0;
  for (; j + 4 <= rows; j += 4) {
    T a0 = sums[j], a1 = sums[j + 1], a2 = sums[j + 2], a3 = sums[j + 3];
    const T* e0 = e + j * lde;
    for (int64_t c = 0; c < count; ++c) {
      a0 += e0[c];
      a1 += e0[lde + c];
      a2 += e0[2 * lde + c];
      a3 += e0[3 * lde + c];
    }
    sums[j] = a0;
    sums[j + 1] = a1;
    sums[j + 2] = a2;
    sums[j + 3] = a3;
  }
  for (; j < rows; ++j) {
    T a = sums[j];
    for (int64_t c = 0; c < count; ++c) a += e[j * lde + c];
    sums[j] = a;
  }
}

// R: the fp64 online-softmax update of the group's rows with visible keys
// `vis` (V rows bf16 in place, f32, or f64 for f64 pages).
template <typename V>
void UpdateReference(const PassContext& ctx, Scratch& sc, const V* v,
                     int64_t ldv, int64_t first_row, const int32_t* vis,
                     int64_t count) {
  const DF64 d64;
  const PreparedAttention& p = ctx.p;
  const int64_t group = p.dims.group();
  const int64_t P = p.dims.page_size;
  const int64_t D = p.dims.head_dim;
  for (int64_t j = 0; j < group; ++j) {
    const int64_t r = first_row + j;
    const double* s = &sc.s64[j * P];
    double* e = &sc.e64[j * P];
    const double bmax = VisibleMax(d64, s, vis, count);
    double& m = sc.ref_m[r];
    const double m_new = std::max(m, bmax);
    if (m != kNegInfD && m_new != m) {
      const double alpha = std::exp(m - m_new);
      sc.ref_l[r] *= alpha;
      double* acc = &sc.ref_acc[r * D];
      for (int64_t i = 0; i < D; ++i) acc[i] *= alpha;
    }
    m = m_new;
    ShiftedScores(d64, s, vis, count, m_new, e);
  }
  GroupExp(d64, sc.e64.data(), group, P, count);
  RowSums(sc.e64.data(), P, group, count, &sc.ref_l[first_row]);
  AccumulateRows(d64, RowsOut<DF64>{&sc.ref_acc[first_row * D], D}, group,
                 sc.e64.data(), P, v, ldv, vis, count, D);
}

// The softmax of one unit (visible keys `vis`) for the group's rows, in
// the lane type of D: e = exp(s - m) ([group][P]), the row sums of e in key
// order and lse = m + ln(sum), m the unit's max score. Scores s are
// [group][P] as GroupScores left them.
template <class D>
void UnitSoftmax(D d, const PreparedAttention& p, const hn::TFromD<D>* s,
                 const int32_t* vis, int64_t count, hn::TFromD<D>* e,
                 hn::TFromD<D>* sum, hn::TFromD<D>* lse) {
  using T = hn::TFromD<D>;
  const int64_t group = p.dims.group();
  const int64_t P = p.dims.page_size;
  for (int64_t j = 0; j < group; ++j) {
    lse[j] = VisibleMax(d, &s[j * P], vis, count);  // the block max, for now
    ShiftedScores(d, &s[j * P], vis, count, lse[j], &e[j * P]);
  }
  GroupExp(d, e, group, P, count);
  std::fill(sum, sum + group, T(0));
  RowSums(e, P, group, count, sum);
  for (int64_t j = 0; j < group; ++j) {
    if constexpr (sizeof(T) == 4) {
      lse[j] = lse[j] + rounded::LogPositive(sum[j]);  // the GPU's bits
    } else {
      lse[j] = lse[j] + std::log(sum[j]);
    }
  }
}

// Where one group row's state of unit `unit` goes in ctx.unit_states.
int64_t StateIndex(const PassContext& ctx, int64_t b, int64_t unit, int64_t sq,
                   int64_t h) {
  return ctx.unit_states->Index(b, unit, sq, h);
}

// What the query rows of one KV head do with one unit of the run.
struct UnitTarget {
  int64_t b, sq, g, first_row, unit;
};

// Where each group row's state of unit at.unit goes in its merge tree:
// the pending left nodes it merges with on the way up, each merge's
// weights from the lses (known before the values), and the node it ends
// in. The rows' weight chains are computed step by step across the rows,
// so the chains (each a sequence of dependent exp and log) overlap. An
// empty state (lse -inf, only from non-finite K) is no leaf: its elements
// go to a discarded buffer.
void PlanLeaves(Scratch& sc, const UnitTarget& at, int64_t group) {
  const int levels = sc.rep_tree[at.first_row].Levels();
  int most = 0;
  for (int64_t j = 0; j < group; ++j) {
    LeafPlan& lp = sc.rep_plan[j];
    lp.steps = &sc.rep_steps[j * levels];
    sc.rep_new_lse[j] = sc.blk_lse[j];
    if (merge_tree::Empty(sc.blk_lse[j])) {
      lp.n = 0;
      lp.dest = sc.rep_discard.data();
      continue;
    }
    lp.n = sc.rep_tree[at.first_row + j].PlanLeaf(
        at.unit, &sc.rep_lefts[j * levels], &sc.rep_left_lse[j * levels],
        &lp.dest);
    most = std::max(most, lp.n);
  }
  for (int s = 0; s < most; ++s) {
    for (int64_t j = 0; j < group; ++j) {
      LeafPlan& lp = sc.rep_plan[j];
      if (s >= lp.n) continue;
      TreeStep& step = sc.rep_steps[j * levels + s];
      step.left = sc.rep_lefts[j * levels + s];
      step.fold = PlanFold(true, sc.rep_left_lse[j * levels + s],
                           sc.rep_new_lse[j], &sc.rep_new_lse[j]);
    }
  }
}

// P for one unit: its fp32 state, normalised as it leaves the value tiles,
// stored as a unit state when asked and carried up each row's merge tree
// (units arrive in ascending order) by the merge routine's step.
template <typename V>
void ReplayUnit(const PassContext& ctx, Scratch& sc, const V* v, int64_t ldv,
                const int32_t* vis, int64_t count, const UnitTarget& at) {
  const PreparedAttention& p = ctx.p;
  const int64_t group = p.dims.group();
  const int64_t D = p.dims.head_dim;
  UnitSoftmax(DF32(), p, sc.s32.data(), vis, count, sc.e32.data(),
              sc.blk_sum.data(), sc.blk_lse.data());
  NormalisedOut<DF32> out{sc.blk_sum.data(), nullptr, nullptr, D};
  if (ctx.unit_states != nullptr) {
    UnitStates& st = *ctx.unit_states;
    for (int64_t j = 0; j < group; ++j) {
      const int64_t i = StateIndex(ctx, at.b, at.unit, at.sq, at.g * group + j);
      sc.keep32[j] = &st.p_out[i * D];
      st.p_lse[i] = sc.blk_lse[j];
    }
    out.keep = sc.keep32.data();
  }
  if (ctx.fold_replay) {
    PlanLeaves(sc, at, group);
    out.plan = sc.rep_plan.data();
  }
  AccumulateRows</*kFromZero=*/true>(DF32(), out, group, sc.e32.data(),
                                     p.dims.page_size, v, ldv, vis, count, D);
  if (ctx.fold_replay) {
    for (int64_t j = 0; j < group; ++j) {
      if (merge_tree::Empty(sc.blk_lse[j])) continue;
      sc.rep_tree[at.first_row + j].Commit(at.unit, sc.rep_new_lse[j]);
    }
  }
}

// R's state of one unit (fp64), into ctx.unit_states.
template <typename V>
void StoreReference(const PassContext& ctx, Scratch& sc, const V* v,
                    int64_t ldv, const int32_t* vis, int64_t count,
                    const UnitTarget& at) {
  const int64_t group = ctx.p.dims.group();
  const int64_t D = ctx.p.dims.head_dim;
  UnitSoftmax(DF64(), ctx.p, sc.s64.data(), vis, count, sc.e64.data(),
              sc.ref_unit_sum.data(), sc.ref_unit_lse.data());
  UnitStates& st = *ctx.unit_states;
  for (int64_t j = 0; j < group; ++j) {
    const int64_t i = StateIndex(ctx, at.b, at.unit, at.sq, at.g * group + j);
    sc.keep64[j] = &st.r_out[i * D];
    st.r_lse[i] = sc.ref_unit_lse[j];
  }
  const NormalisedOut<DF64> out{sc.ref_unit_sum.data(), sc.keep64.data(),
                                nullptr, D};
  AccumulateRows</*kFromZero=*/true>(DF64(), out, group, sc.e64.data(),
                                     ctx.p.dims.page_size, v, ldv, vis, count,
                                     D);
}

// The visible keys of run tokens [first, first + count): a sub-span of the
// ascending visible list.
std::pair<const int32_t*, int64_t> VisibleIn(const int32_t* vis, int64_t n,
                                             int64_t first, int64_t count) {
  const int32_t* lo = std::lower_bound(vis, vis + n, first);
  const int32_t* hi = std::lower_bound(lo, vis + n, first + count);
  return {lo, hi - lo};
}

// The units of the run for one query position and KV head: P (folded, or
// stored) and, when asked, R's unit states.
void ProcessUnits(const PassContext& ctx, Scratch& sc, const TokenRun& run,
                  const HeadBlock& blk, const UnitTarget& base,
                  const int32_t* vis, int64_t visible) {
  for (size_t u = 0; u < run.unit_of.size(); ++u) {
    // Named copies: a lambda may not capture structured bindings (C++17).
    const std::pair<const int32_t*, int64_t> span =
        VisibleIn(vis, visible, run.first[u], run.count[u]);
    const int32_t* uvis = span.first;
    const int64_t ucount = span.second;
    if (ucount == 0) continue;
    UnitTarget at = base;
    at.unit = run.unit_of[u];
    if (ctx.replay) {
      WithReplayV(blk, [&](const auto* v) {
        ReplayUnit(ctx, sc, v, blk.ldv, uvis, ucount, at);
      });
    }
    if (ctx.unit_states != nullptr && ctx.unit_states->has_reference) {
      WithReferenceV(blk, [&](const auto* v) {
        StoreReference(ctx, sc, v, blk.ldv, uvis, ucount, at);
      });
    }
  }
}

// One KV head of one run: scores, then R and P for every query position
// that sees some token of the run.
void ProcessHead(const PassContext& ctx, Scratch& sc, const TokenRun& run,
                 const HeadBlock& blk, int64_t b, int64_t g, int64_t g0,
                 int64_t g1) {
  const PreparedAttention& p = ctx.p;
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t P = d.page_size;
  const int64_t group = d.group();
  const int64_t per_query = (g1 - g0) * group;
  const double scale64 = p.softmax_scale * p.k_scale[g];
  const float scale32 =
      static_cast<float>(p.softmax_scale) * static_cast<float>(p.k_scale[g]);
  const bool unit_reference =
      ctx.unit_states != nullptr && ctx.unit_states->has_reference;
  for (int64_t sq = 0; sq < d.queries; ++sq) {
    const int64_t count = sc.visible_count[sq];
    if (count == 0) continue;
    const int32_t* vis = &sc.visible[sq * P];
    const int64_t first_row = sq * per_query + (g - g0) * group;
    // The next page's prefetches, one slice before each of the four steps.
    sc.prefetch.Step();
    if (ctx.reference || unit_reference) {
      WithReferenceK(blk, [&](const auto* k) {
        GroupScores(DF64(), ctx, &sc.q64[first_row * D], k, blk.ldk, run.n,
                    scale64, sc.s64.data());
      });
    }
    sc.prefetch.Step();
    if (ctx.reference) {
      WithReferenceV(blk, [&](const auto* v) {
        UpdateReference(ctx, sc, v, blk.ldv, first_row, vis, count);
      });
    }
    sc.prefetch.Step();
    if (ctx.replay) {
      WithReplayK(blk, [&](const auto* k) {
        GroupScores(DF32(), ctx, &sc.q32[first_row * D], k, blk.ldk, run.n,
                    scale32, sc.s32.data());
      });
    }
    sc.prefetch.Step();
    ProcessUnits(ctx, sc, run, blk, {b, sq, g, first_row, 0}, vis, count);
  }
}

// Whether the arithmetic reads the run's K and V in place (bf16 pages),
// with no widened copy.
bool ReadsInPlace(const TokenRun& run) {
  return run.k_dtype == DType::kBF16 && run.v_dtype == DType::kBF16;
}

// The finite check of heads [g0, g1) of a bf16 run, every token, visible or
// not, in memory order.
bool ScanRunBF16(const TokenRun& run, int64_t g0, int64_t g1, int64_t D) {
  bool bad = false;
  auto scan = [&](const void* data, int64_t row_stride, int64_t head_stride) {
    const uint16_t* base = static_cast<const uint16_t*>(data);
    if (head_stride == D) {  // a token's heads are adjacent
      for (int64_t t = 0; t < run.n; ++t) {
        bad |= AnyNonFiniteBF16(base + t * row_stride + g0 * D, (g1 - g0) * D);
      }
    } else if (row_stride == D) {  // a head's tokens are adjacent
      for (int64_t h = g0; h < g1; ++h) {
        bad |= AnyNonFiniteBF16(base + h * head_stride, run.n * D);
      }
    } else {
      for (int64_t t = 0; t < run.n; ++t) {
        for (int64_t h = g0; h < g1; ++h) {
          bad |= AnyNonFiniteBF16(base + t * row_stride + h * head_stride, D);
        }
      }
    }
  };
  scan(run.k_data, run.k_row_stride, run.k_head_stride);
  scan(run.v_data, run.v_row_stride, run.v_head_stride);
  return bad;
}

// Head g of a bf16 run, read in place.
HeadBlock InPlaceHead(const TokenRun& run, int64_t g) {
  HeadBlock blk;
  blk.k16 =
      static_cast<const hwy::bfloat16_t*>(run.k_data) + g * run.k_head_stride;
  blk.v16 =
      static_cast<const hwy::bfloat16_t*>(run.v_data) + g * run.v_head_stride;
  blk.ldk = run.k_row_stride;
  blk.ldv = run.v_row_stride;
  return blk;
}

// Every head of [g0, g1) against one run: in place for bf16 pages, else in
// sweeps of heads whose widened K/V fit the scratch. Every token is
// checked, visible or not: this is the finite check of the cache. Returns
// true when a value is not finite.
bool ProcessRun(const PassContext& ctx, const TokenRun& run, int64_t b,
                int64_t g0, int64_t g1, Scratch& sc) {
  const bool any = ComputeVisibility(ctx, b, run, sc);
  if (ReadsInPlace(run)) {
    const bool non_finite = ScanRunBF16(run, g0, g1, ctx.p.dims.head_dim);
    if (!any) return non_finite;
    for (int64_t g = g0; g < g1; ++g) {
      ProcessHead(ctx, sc, run, InPlaceHead(run, g), b, g, g0, g1);
    }
    return non_finite;
  }
  bool non_finite = false;
  for (int64_t gs = g0; gs < g1; gs += sc.sweep_heads) {
    const int64_t ge = std::min(g1, gs + sc.sweep_heads);
    non_finite |= LoadSweep(ctx.p, run, gs, ge, sc);
    if (!any) continue;
    for (int64_t g = gs; g < ge; ++g) {
      ProcessHead(ctx, sc, run, SelectHead(ctx.p, run, g - gs, sc), b, g, g0,
                  g1);
    }
  }
  return non_finite;
}

// The units of a row that lie in logical block blk (a contiguous range of
// the row's ascending plan), as a run over the block's page.
void BlockUnits(const PreparedAttention& p, int64_t b, int64_t blk,
                TokenRun* run) {
  run->unit_of.clear();
  run->first.clear();
  run->count.clear();
  const std::vector<KvUnit>& units = p.units[b];
  for (int32_t u = p.block_unit_begin[b][blk];
       u < p.block_unit_begin[b][blk + 1]; ++u) {
    run->unit_of.push_back(u);
    run->first.push_back(units[u].first);
    run->count.push_back(units[u].count);
  }
}

// Records, per query position, the blocks of the units it merges and the
// keys it sees.
void RecordMergeOrder(const PassContext& ctx, const TokenRun& run, int64_t b,
                      int64_t blk, const Scratch& sc) {
  const int64_t P = ctx.p.dims.page_size;
  for (int64_t sq = 0; sq < ctx.p.dims.queries; ++sq) {
    if (ctx.visible_keys != nullptr) {
      ctx.visible_keys[b * ctx.p.dims.queries + sq] += sc.visible_count[sq];
    }
    const int32_t* vis = &sc.visible[sq * P];
    for (size_t u = 0; u < run.unit_of.size(); ++u) {
      if (VisibleIn(vis, sc.visible_count[sq], run.first[u], run.count[u])
              .second > 0) {
        ctx.results->merge_orders[b][sq].push_back(static_cast<int32_t>(blk));
      }
    }
  }
}

// out[t] = positions[first + t] for t < n, read as the tensor's integer
// type (validation allows i32 and i64).
void SlotPositions(const Tensor& positions, int64_t first, int64_t n,
                   int64_t* out) {
  if (positions.dtype() == DType::kI32) {
    const int32_t* src = positions.data<int32_t>() + first;
    std::copy(src, src + n, out);
  } else if (positions.dtype() == DType::kI64) {
    const int64_t* src = positions.data<int64_t>() + first;
    std::copy(src, src + n, out);
  } else {
    for (int64_t t = 0; t < n; ++t) out[t] = positions.IntAt(first + t);
  }
}

// The cache lines of positions [first, first + n): the next page's, which
// lie anywhere in the table, so the first read of each page's positions
// would otherwise miss.
void PrefetchSlotPositions(const Tensor& positions, int64_t first, int64_t n) {
  const int64_t elem = DTypeSize(positions.dtype());
  const char* begin = static_cast<const char*>(positions.raw()) + first * elem;
  for (int64_t at = 0; at < n * elem; at += 64) {
    __builtin_prefetch(begin + at, /*rw=*/0, /*locality=*/3);
  }
  __builtin_prefetch(begin + n * elem - 1, /*rw=*/0, /*locality=*/3);
}

// The slack's maxima of the marked cells of heads [g0, g1) of the page
// just read (PreparedAttention::slack_cells), while it is in cache.
void FoldSlackCells(const PassContext& ctx, int64_t b, int64_t g0, int64_t g1,
                    int64_t page, int64_t n, const int64_t* positions) {
  AttentionResults* res = ctx.results;
  if (res == nullptr || res->slack_key_maxima.empty()) return;
  const int64_t kv_heads = ctx.p.dims.kv_heads;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t cell = b * kv_heads + g;
    if (!ctx.p.slack_cells[cell]) continue;
    attention_internal::FoldSlackMaxima(ctx.p, page, n, positions, g,
                                        &res->slack_key_maxima[cell],
                                        &res->slack_value_maxima[cell]);
  }
}

void RunPassItemImpl(const PassContext& ctx, int64_t b, int64_t g0, int64_t g1,
                     Scratch& sc) {
  const PreparedAttention& p = ctx.p;
  const SnapshotDims& d = p.dims;
  const int64_t P = d.page_size;
  const int64_t L = p.layout->seq_lens[b];
  const std::vector<int32_t>& pages = p.layout->block_pages[b];
  const int64_t num_blocks = (L + P - 1) / P;
  bool non_finite = false;
  // ProcessHead steps the cursor four times per (head, query position).
  const int64_t prefetch_steps = 4 * (g1 - g0) * d.queries;
  TokenRun run;
  TokenRun next;
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t page = pages[blk];
    const int64_t n = std::min(P, L - blk * P);
    if (blk + 1 < num_blocks) {
      PointAtPage(p, pages[blk + 1], P, nullptr, &next);
      sc.prefetch.Start(next, d.head_dim, g0, g1, prefetch_steps);
      PrefetchSlotPositions(p.snapshot->slot_positions, pages[blk + 1] * P, P);
    } else {
      sc.prefetch.Clear();
    }
    SlotPositions(p.snapshot->slot_positions, page * P, n, sc.positions.data());
    PointAtPage(p, page, n, sc.positions.data(), &run);
    BlockUnits(p, b, blk, &run);
    non_finite |= ProcessRun(ctx, run, b, g0, g1, sc);
    FoldSlackCells(ctx, b, g0, g1, page, n, sc.positions.data());
    sc.prefetch.Finish();  // what skipped steps left (invisible tokens)
    if (g0 == 0) RecordMergeOrder(ctx, run, b, blk, sc);
  }
  if (non_finite) ctx.kv_non_finite->store(true, std::memory_order_relaxed);
}

// A run given by a caller (a CP rank's received shard): its units' states.
void RunStatesImpl(const PassContext& ctx, const TokenRun& run, int64_t b,
                   int64_t g0, int64_t g1, Scratch& sc) {
  sc.prefetch.Clear();
  if (ProcessRun(ctx, run, b, g0, g1, sc)) {
    ctx.kv_non_finite->store(true, std::memory_order_relaxed);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {
namespace attention_internal {

ATTNAUDIT_SIMD_EXPORT(RunPassItemImpl);
ATTNAUDIT_SIMD_EXPORT(RunStatesImpl);

void RunPassItem(const PassContext& ctx, int64_t b, int64_t g0, int64_t g1,
                 Scratch& scratch) {
  ATTNAUDIT_SIMD_DISPATCH(RunPassItemImpl)(ctx, b, g0, g1, scratch);
}

void RunStates(const PassContext& ctx, const TokenRun& run, int64_t b,
               int64_t g0, int64_t g1, Scratch& scratch) {
  ATTNAUDIT_SIMD_DISPATCH(RunStatesImpl)(ctx, run, b, g0, g1, scratch);
}

}  // namespace attention_internal
}  // namespace attnaudit
#endif  // HWY_ONCE
