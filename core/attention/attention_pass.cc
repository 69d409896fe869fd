// The fused R + P pass of one work item (batch row b, KV heads [g0, g1)),
// written once over Highway and compiled per SIMD target; RunPassItem
// picks the best target of the CPU at run time. Every target computes the
// same bits (core/simd/simd-inl.h states how).
//
// Per logical block (one page), per KV head: the page's K and V rows are
// widened once (and checked for non-finite values: this is the audit's
// only read of the KV cache), then shared by every query row of the head's
// GQA group and every query position. Scores, exp and value accumulation
// run over register tiles of several rows at once, so each K/V load feeds
// several FMAs.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/attention/attention_pass.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/attention/attention_internal.h"
#include "core/attention/merge.h"
#include "core/simd/dispatch.h"
#include "core/simd/simd-inl.h"
#include "core/tensor/dtype.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

using attention_internal::PassContext;
using attention_internal::Scratch;

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

// acc[r * dim + i] = fma chain over j < count of e[r * lde + j] *
// v[idx[j] * dim + i], in j order, for RT rows: each V load feeds RT rows.
// v may be f32 under an f64 accumulator (widened exactly as loaded).
template <int RT, class D, typename V>
HWY_INLINE void AccumulateTile(D d, hn::TFromD<D>* acc,
                               const hn::TFromD<D>* e, int64_t lde,
                               const V* v, const int32_t* idx, int64_t count,
                               int64_t dim) {
  using T = hn::TFromD<D>;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(D()));
  constexpr int kCols = 2;
  int64_t i = 0;
  for (; i + kCols * N <= dim; i += kCols * N) {
    hn::Vec<D> a[RT][kCols];
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < kCols; ++c) {
        a[r][c] = hn::LoadU(d, acc + r * dim + i + c * N);
      }
    }
    for (int64_t j = 0; j < count; ++j) {
      const V* vrow = v + idx[j] * dim + i;
      hn::Vec<D> vv[kCols];
      for (int c = 0; c < kCols; ++c) vv[c] = LoadAs(d, vrow + c * N);
      for (int r = 0; r < RT; ++r) {
        const hn::Vec<D> ej = hn::Set(d, e[r * lde + j]);
        for (int c = 0; c < kCols; ++c) a[r][c] = ExactMulAdd(ej, vv[c], a[r][c]);
      }
    }
    for (int r = 0; r < RT; ++r) {
      for (int c = 0; c < kCols; ++c) {
        hn::StoreU(a[r][c], d, acc + r * dim + i + c * N);
      }
    }
  }
  // Element-wise, so the scalar tail computes what a vector lane would.
  for (; i < dim; ++i) {
    for (int r = 0; r < RT; ++r) {
      T a = acc[r * dim + i];
      for (int64_t j = 0; j < count; ++j) {
        a = std::fma(e[r * lde + j], static_cast<T>(v[idx[j] * dim + i]), a);
      }
      acc[r * dim + i] = a;
    }
  }
}

template <class D, typename V>
void AccumulateRows(D d, hn::TFromD<D>* acc, int64_t rows,
                    const hn::TFromD<D>* e, int64_t lde, const V* v,
                    const int32_t* idx, int64_t count, int64_t dim) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    AccumulateTile<4>(d, acc + r * dim, e + r * lde, lde, v, idx, count, dim);
  }
  for (; r < rows; ++r) {
    AccumulateTile<1>(d, acc + r * dim, e + r * lde, lde, v, idx, count, dim);
  }
}

int64_t KvOffset(KvLayout layout, const SnapshotDims& d, int64_t page,
                 int64_t slot, int64_t head) {
  if (layout == KvLayout::kNHD) {
    return ((page * d.page_size + slot) * d.kv_heads + head) * d.head_dim;
  }
  return ((page * d.kv_heads + head) * d.page_size + slot) * d.head_dim;
}

// Starts pulling a page's K or V rows of heads [g0, g1) into the cache: the
// next logical block's page lies anywhere in the pool, so the hardware
// prefetcher cannot guess it.
void PrefetchPage(const void* base, DType dtype, KvLayout layout,
                  const SnapshotDims& d, int64_t page, int64_t g0,
                  int64_t g1) {
  const char* bytes = static_cast<const char*>(base);
  const int64_t elem = DTypeSize(dtype);
  const int64_t row_bytes = d.head_dim * elem;
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t t = 0; t < d.page_size; ++t) {
      const char* row = bytes + KvOffset(layout, d, page, t, g) * elem;
      for (int64_t off = 0; off < row_bytes; off += 64) {
        hwy::Prefetch(row + off);
      }
    }
  }
}

// Widens K and V of KV heads [gs, ge) for the first n slots of `page` into
// the sweep buffers ([head - gs][slot][D]), reading the page in memory
// order so the hardware prefetchers stream it. Returns true when a value
// is not finite.
bool LoadSweep(const PreparedAttention& p, int64_t page, int64_t n,
               int64_t gs, int64_t ge, Scratch& sc) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t P = d.page_size;
  bool bad = false;
  auto load = [&](const void* base, DType dtype, KvLayout layout,
                  std::vector<float>& f32, std::vector<double>& f64) {
    const bool nhd = layout == KvLayout::kNHD;
    for (int64_t outer = 0; outer < (nhd ? n : ge - gs); ++outer) {
      for (int64_t inner = 0; inner < (nhd ? ge - gs : n); ++inner) {
        const int64_t t = nhd ? outer : inner;
        const int64_t h = nhd ? inner : outer;
        const int64_t at = (h * P + t) * D;
        bad |= WidenRow(base, dtype, KvOffset(layout, d, page, t, gs + h), D,
                        &f32[at], dtype == DType::kF64 ? &f64[at] : nullptr);
      }
    }
  };
  load(p.k_data, p.k_dtype, p.k_layout, sc.sweep_k32, sc.sweep_k64);
  load(p.v_data, p.v_dtype, p.v_layout, sc.sweep_v32, sc.sweep_v64);
  return bad;
}

// One KV head's block as the arithmetic reads it: f32 rows for P, and
// for R the exact f64 rows of f64 pages (null otherwise: R widens the f32
// rows as it loads them).
struct HeadBlock {
  const float* k32;
  const float* v32;
  const double* k64;
  const double* v64;
};

HeadBlock SelectHead(const PreparedAttention& p, int64_t h, Scratch& sc) {
  const int64_t at = h * p.dims.page_size * p.dims.head_dim;
  HeadBlock blk{&sc.sweep_k32[at], &sc.sweep_v32[at], nullptr, nullptr};
  if (p.k_dtype == DType::kF64) blk.k64 = &sc.sweep_k64[at];
  if (p.v_dtype == DType::kF64) blk.v64 = &sc.sweep_v64[at];
  return blk;
}

// The slot positions of a page and, per query position, which of its n
// slots are visible. Returns whether any query sees any slot.
bool ComputeVisibility(const PassContext& ctx, int64_t b, int64_t page,
                       int64_t n, Scratch& sc) {
  const PreparedAttention& p = ctx.p;
  const SnapshotDims& d = p.dims;
  const int64_t P = d.page_size;
  for (int64_t t = 0; t < n; ++t) {
    sc.positions[t] = p.snapshot->slot_positions.IntAt(page * P + t);
  }
  bool any = false;
  for (int64_t sq = 0; sq < d.queries; ++sq) {
    const int64_t qpos = p.query_positions[b * d.queries + sq];
    int32_t* vis = &sc.visible[sq * P];
    int64_t count = 0;
    for (int64_t t = 0; t < n; ++t) {
      if (attention_internal::Visible(p, sc.positions[t], qpos)) {
        vis[count++] = static_cast<int32_t>(t);
      }
    }
    sc.visible_count[sq] = count;
    any = any || count > 0;
  }
  return any;
}

// Scaled (and soft-capped) scores of the `group` rows starting at
// `first_row` against the block's keys.
template <class D, typename K>
void GroupScores(D d, const PassContext& ctx, const hn::TFromD<D>* q,
                 const K* k, int64_t n, hn::TFromD<D> scale,
                 hn::TFromD<D>* s) {
  using T = hn::TFromD<D>;
  const PreparedAttention& p = ctx.p;
  const int64_t group = p.dims.group();
  const int64_t P = p.dims.page_size;
  DotRows(d, q, group, k, n, p.dims.head_dim, s, P);
  const T cap = static_cast<T>(p.softcap);
  for (int64_t j = 0; j < group; ++j) {
    for (int64_t t = 0; t < n; ++t) {
      T x = s[j * P + t] * scale;
      if (cap > 0) x = cap * std::tanh(x / cap);
      s[j * P + t] = x;
    }
  }
}

// R: the fp64 online-softmax update of the group's rows with this block
// (V rows f32, or f64 for f64 pages).
template <typename V>
void UpdateReference(const PassContext& ctx, Scratch& sc, const V* v,
                     int64_t first_row, const int32_t* vis, int64_t count) {
  const DF64 d64;
  const PreparedAttention& p = ctx.p;
  const int64_t group = p.dims.group();
  const int64_t P = p.dims.page_size;
  const int64_t D = p.dims.head_dim;
  for (int64_t j = 0; j < group; ++j) {
    const int64_t r = first_row + j;
    const double* s = &sc.s64[j * P];
    double* e = &sc.e64[j * P];
    double bmax = kNegInfD;
    for (int64_t c = 0; c < count; ++c) bmax = std::max(bmax, s[vis[c]]);
    double& m = sc.ref_m[r];
    const double m_new = std::max(m, bmax);
    if (m != kNegInfD && m_new != m) {
      const double alpha = std::exp(m - m_new);
      sc.ref_l[r] *= alpha;
      double* acc = &sc.ref_acc[r * D];
      for (int64_t i = 0; i < D; ++i) acc[i] *= alpha;
    }
    m = m_new;
    for (int64_t c = 0; c < count; ++c) e[c] = s[vis[c]] - m_new;
    ExpNonPositiveArray(d64, e, count, e);
    double l = sc.ref_l[r];
    for (int64_t c = 0; c < count; ++c) l += e[c];
    sc.ref_l[r] = l;
  }
  AccumulateRows(d64, &sc.ref_acc[first_row * D], group, sc.e64.data(), P, v,
                 vis, count, D);
}

// P: the fp32 partial state of this block for the group's rows (out
// normalised within the block, lse), folded into each row's running state
// by the shared merge routine, in ascending logical block order.
void UpdateReplay(const PassContext& ctx, Scratch& sc, const float* v32,
                  int64_t first_row, const int32_t* vis, int64_t count) {
  const DF32 d32;
  const PreparedAttention& p = ctx.p;
  const int64_t group = p.dims.group();
  const int64_t P = p.dims.page_size;
  const int64_t D = p.dims.head_dim;
  for (int64_t j = 0; j < group; ++j) {
    const float* s = &sc.s32[j * P];
    float* e = &sc.e32[j * P];
    float bmax = kNegInfF;
    for (int64_t c = 0; c < count; ++c) bmax = std::max(bmax, s[vis[c]]);
    for (int64_t c = 0; c < count; ++c) e[c] = s[vis[c]] - bmax;
    ExpNonPositiveArray(d32, e, count, e);
    float sum = 0.0f;
    for (int64_t c = 0; c < count; ++c) sum += e[c];
    sc.blk_sum[j] = sum;
    sc.blk_lse[j] = bmax + std::log(sum);
  }
  float* blk_out = sc.blk_out.data();
  std::fill(blk_out, blk_out + group * D, 0.0f);
  AccumulateRows(d32, blk_out, group, sc.e32.data(), P, v32, vis, count, D);
  for (int64_t j = 0; j < group; ++j) {
    const int64_t r = first_row + j;
    float* out = &blk_out[j * D];
    for (int64_t i = 0; i < D; ++i) out[i] /= sc.blk_sum[j];
    float* rep = &sc.rep_out[r * D];
    if (!sc.rep_started[r]) {
      std::copy(out, out + D, rep);
      sc.rep_lse[r] = sc.blk_lse[j];
      sc.rep_started[r] = 1;
    } else {
      MergeInto(rep, &sc.rep_lse[r], out, sc.blk_lse[j], D);
    }
  }
}

// One KV head of one block: scores, then R and P for every query position
// that sees some slot of the block.
void ProcessHead(const PassContext& ctx, Scratch& sc, const HeadBlock& blk,
                 int64_t g, int64_t g0, int64_t g1, int64_t n) {
  const PreparedAttention& p = ctx.p;
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t P = d.page_size;
  const int64_t group = d.group();
  const int64_t per_query = (g1 - g0) * group;
  const double scale64 = p.softmax_scale * p.k_scale[g];
  const float scale32 =
      static_cast<float>(p.softmax_scale) * static_cast<float>(p.k_scale[g]);
  for (int64_t sq = 0; sq < d.queries; ++sq) {
    const int64_t count = sc.visible_count[sq];
    if (count == 0) continue;
    const int32_t* vis = &sc.visible[sq * P];
    const int64_t first_row = sq * per_query + (g - g0) * group;
    if (ctx.reference) {
      const double* q64 = &sc.q64[first_row * D];
      if (blk.k64 != nullptr) {
        GroupScores(DF64(), ctx, q64, blk.k64, n, scale64, sc.s64.data());
      } else {
        GroupScores(DF64(), ctx, q64, blk.k32, n, scale64, sc.s64.data());
      }
      if (blk.v64 != nullptr) {
        UpdateReference(ctx, sc, blk.v64, first_row, vis, count);
      } else {
        UpdateReference(ctx, sc, blk.v32, first_row, vis, count);
      }
    }
    if (ctx.replay) {
      GroupScores(DF32(), ctx, &sc.q32[first_row * D], blk.k32, n, scale32,
                  sc.s32.data());
      UpdateReplay(ctx, sc, blk.v32, first_row, vis, count);
    }
  }
}

void RunPassItemImpl(const PassContext& ctx, int64_t b, int64_t g0,
                     int64_t g1, Scratch& sc) {
  const PreparedAttention& p = ctx.p;
  const SnapshotDims& d = p.dims;
  const int64_t P = d.page_size;
  const int64_t L = p.layout->seq_lens[b];
  const std::vector<int32_t>& pages = p.layout->block_pages[b];
  const int64_t num_blocks = (L + P - 1) / P;
  bool non_finite = false;
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t page = pages[blk];
    const int64_t n = std::min(P, L - blk * P);
    if (blk + 1 < num_blocks) {
      PrefetchPage(p.k_data, p.k_dtype, p.k_layout, d, pages[blk + 1], g0, g1);
      PrefetchPage(p.v_data, p.v_dtype, p.v_layout, d, pages[blk + 1], g0, g1);
    }
    const bool any = ComputeVisibility(ctx, b, page, n, sc);
    if (any && g0 == 0) {
      for (int64_t sq = 0; sq < d.queries; ++sq) {
        if (sc.visible_count[sq] > 0) {
          ctx.results->merge_orders[b][sq].push_back(static_cast<int32_t>(blk));
        }
      }
    }
    for (int64_t gs = g0; gs < g1; gs += sc.sweep_heads) {
      const int64_t ge = std::min(g1, gs + sc.sweep_heads);
      // Every active slot is widened, visible or not: this is the finite
      // check of the cache.
      non_finite |= LoadSweep(p, page, n, gs, ge, sc);
      if (!any) continue;
      for (int64_t g = gs; g < ge; ++g) {
        ProcessHead(ctx, sc, SelectHead(p, g - gs, sc), g, g0, g1, n);
      }
    }
  }
  if (non_finite) ctx.kv_non_finite->store(true, std::memory_order_relaxed);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {
namespace attention_internal {

ATTNAUDIT_SIMD_EXPORT(RunPassItemImpl);

void RunPassItem(const PassContext& ctx, int64_t b, int64_t g0, int64_t g1,
                 Scratch& scratch) {
  ATTNAUDIT_SIMD_DISPATCH(RunPassItemImpl)(ctx, b, g0, g1, scratch);
}

}  // namespace attention_internal
}  // namespace attnaudit
#endif  // HWY_ONCE
