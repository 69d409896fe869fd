// The fused R + P pass. One work item is (batch row b, KV head g): its rows
// are the Sq x group query heads that read KV head g, so each K/V row is
// widened once and used by every row of the item.
#include "core/attention/attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/attention/merge.h"
#include "core/attention/vexp.h"
#include "core/common/parallel.h"

namespace attnaudit {
namespace {

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

// Widens one row of D elements to float. The common dtypes get loops the
// compiler vectorises.
inline void WidenRow(const void* base, DType dtype, int64_t offset, int64_t n,
                     float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, static_cast<const float*>(base) + offset,
                  static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
        std::memcpy(&dst[i], &bits, sizeof(float));
      }
      return;
    }
    default:
      ConvertToFloat(static_cast<const char*>(base) + offset * DTypeSize(dtype),
                     dtype, n, dst);
      return;
  }
}

// Portable dot product with four fixed lanes (the fallback of the SIMD
// versions below, and R's fp64-page path): deterministic and vectorisable
// without reassociation.
template <typename Acc, typename K>
inline Acc LaneDot(const Acc* q, const K* k, int64_t n) {
  Acc lane[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) {
      lane[j] = std::fma(q[i + j], static_cast<Acc>(k[i + j]), lane[j]);
    }
  }
  Acc sum = (lane[0] + lane[1]) + (lane[2] + lane[3]);
  for (; i < n; ++i) sum = std::fma(q[i], static_cast<Acc>(k[i]), sum);
  return sum;
}

// Dot products in a fixed accumulation order (deterministic for a build).
// Explicit SIMD: GCC does not vectorise a floating reduction without
// reassociation, and the reference must not be built with -ffast-math.
#if defined(__AVX512F__)
inline double DotF64(const double* q, const float* k, int64_t n) {
  __m512d acc0 = _mm512_setzero_pd();
  __m512d acc1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm512_fmadd_pd(_mm512_loadu_pd(q + i),
                           _mm512_cvtps_pd(_mm256_loadu_ps(k + i)), acc0);
    acc1 = _mm512_fmadd_pd(_mm512_loadu_pd(q + i + 8),
                           _mm512_cvtps_pd(_mm256_loadu_ps(k + i + 8)), acc1);
  }
  double sum = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
  for (; i < n; ++i) sum = std::fma(q[i], static_cast<double>(k[i]), sum);
  return sum;
}

inline float DotF32(const float* q, const float* k, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 =
        _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16),
                           _mm512_loadu_ps(k + i + 16), acc1);
  }
  for (; i + 16 <= n; i += 16) {
    acc0 =
        _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), acc0);
  }
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; i < n; ++i) sum = std::fma(q[i], k[i], sum);
  return sum;
}
#elif defined(__AVX2__) && defined(__FMA__)
inline double HorizontalSum(__m256d v) {
  const __m128d lo = _mm256_castpd256_pd128(v);
  const __m128d hi = _mm256_extractf128_pd(v, 1);
  const __m128d s = _mm_add_pd(lo, hi);
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

inline double DotF64(const double* q, const float* k, int64_t n) {
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_pd(_mm256_loadu_pd(q + i),
                           _mm256_cvtps_pd(_mm_loadu_ps(k + i)), acc0);
    acc1 = _mm256_fmadd_pd(_mm256_loadu_pd(q + i + 4),
                           _mm256_cvtps_pd(_mm_loadu_ps(k + i + 4)), acc1);
  }
  double sum = HorizontalSum(_mm256_add_pd(acc0, acc1));
  for (; i < n; ++i) sum = std::fma(q[i], static_cast<double>(k[i]), sum);
  return sum;
}

inline float DotF32(const float* q, const float* k, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 =
        _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8),
                           _mm256_loadu_ps(k + i + 8), acc1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(acc0, acc1));
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) sum = std::fma(q[i], k[i], sum);
  return sum;
}
#else
inline double DotF64(const double* q, const float* k, int64_t n) {
  return LaneDot(q, k, n);
}

inline float DotF32(const float* q, const float* k, int64_t n) {
  return LaneDot(q, k, n);
}
#endif

// fp64 pages: R reads them unrounded (P still sees them as fp32, as an
// engine computing in fp32 would).
inline double DotF64Exact(const double* q, const double* k, int64_t n) {
  return LaneDot(q, k, n);
}

// acc[i] += sum over j (in order) of e[j] * v[rows[j]][i]: the value rows
// of a block folded into an accumulator, D in register-sized chunks so each
// accumulator chunk is loaded and stored once per block, not once per key.
// Per element the additions happen in token order, exactly as a token-major
// loop would do them.
inline void AccumulateF64(double* acc, const double* e, const float* v_block,
                          const int32_t* rows, int64_t count, int64_t D) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 8 <= D; i += 8) {
    __m512d a = _mm512_loadu_pd(acc + i);
    for (int64_t j = 0; j < count; ++j) {
      const __m512d v =
          _mm512_cvtps_pd(_mm256_loadu_ps(v_block + rows[j] * D + i));
      a = _mm512_fmadd_pd(_mm512_set1_pd(e[j]), v, a);
    }
    _mm512_storeu_pd(acc + i, a);
  }
#endif
  for (; i < D; ++i) {
    double a = acc[i];
    for (int64_t j = 0; j < count; ++j) {
      a = std::fma(e[j], static_cast<double>(v_block[rows[j] * D + i]), a);
    }
    acc[i] = a;
  }
}

inline void AccumulateF32(float* acc, const float* e, const float* v_block,
                          const int32_t* rows, int64_t count, int64_t D) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= D; i += 16) {
    __m512 a = _mm512_loadu_ps(acc + i);
    for (int64_t j = 0; j < count; ++j) {
      a = _mm512_fmadd_ps(_mm512_set1_ps(e[j]),
                          _mm512_loadu_ps(v_block + rows[j] * D + i), a);
    }
    _mm512_storeu_ps(acc + i, a);
  }
#endif
  for (; i < D; ++i) {
    float a = acc[i];
    for (int64_t j = 0; j < count; ++j) {
      a = std::fma(e[j], v_block[rows[j] * D + i], a);
    }
    acc[i] = a;
  }
}

// Starts pulling a page's K/V rows for heads [g0, g1) into the cache: the
// next logical block's page is anywhere in the pool, so the hardware
// prefetcher cannot guess it.
inline void PrefetchPage(const void* base, DType dtype, KvLayout layout,
                         const SnapshotDims& d, int64_t page, int64_t g0,
                         int64_t g1) {
  const char* bytes = static_cast<const char*>(base);
  const int64_t elem = DTypeSize(dtype);
  if (layout == KvLayout::kNHD) {
    const int64_t row_bytes = (g1 - g0) * d.head_dim * elem;
    for (int64_t t = 0; t < d.page_size; ++t) {
      const char* start =
          bytes +
          (((page * d.page_size + t) * d.kv_heads + g0) * d.head_dim) * elem;
      for (int64_t off = 0; off < row_bytes; off += 64) {
        __builtin_prefetch(start + off);
      }
    }
  } else {
    for (int64_t g = g0; g < g1; ++g) {
      const char* start =
          bytes + (((page * d.kv_heads + g) * d.page_size) * d.head_dim) * elem;
      const int64_t span = d.page_size * d.head_dim * elem;
      for (int64_t off = 0; off < span; off += 64)
        __builtin_prefetch(start + off);
    }
  }
}

int64_t KvOffset(KvLayout layout, const SnapshotDims& d, int64_t page,
                 int64_t slot, int64_t head) {
  if (layout == KvLayout::kNHD) {
    return ((page * d.page_size + slot) * d.kv_heads + head) * d.head_dim;
  }
  return ((page * d.kv_heads + head) * d.page_size + slot) * d.head_dim;
}

// Per-thread scratch, reused across work items.
struct Scratch {
  std::vector<float> k_block, v_block;        // [P][D] for one KV head
  std::vector<double> k_block64, v_block64;   // [P][D], fp64 pages only
  std::vector<int64_t> positions;             // [P]
  std::vector<uint8_t> visible;               // [Sq][P]
  std::vector<int64_t> visible_count;         // [Sq]
  std::vector<double> q64;                    // [rows][D]
  std::vector<float> q32;                     // [rows][D]
  std::vector<double> ref_m, ref_l, ref_acc;  // [rows], [rows], [rows][D]
  std::vector<float> rep_out, rep_lse;        // [rows][D], [rows]
  std::vector<uint8_t> rep_started;           // [rows]
  std::vector<float> blk_out;                 // [D]
  std::vector<double> s64;                    // [P]
  std::vector<float> s32;                     // [P]
  std::vector<int32_t> rows;                  // [P] visible token indices
  std::vector<double> e64;                    // [P]
  std::vector<float> e32;                     // [P]
};

struct Item {
  const PreparedAttention& p;
  AttentionResults* results;
  bool record_orders;
  bool reference;  // run R
  bool replay;     // run P
};

inline bool Visible(const PreparedAttention& p, int64_t key_pos,
                    int64_t query_pos) {
  if (key_pos < 0 || key_pos > query_pos) return false;
  if (p.window <= 0) return true;
  const int64_t distance = query_pos - key_pos;
  return p.window_inclusive ? distance <= p.window : distance < p.window;
}

// One query row against the visible keys of one block: R's fp64 online
// softmax update and P's fp32 block partial, folded into the running state.
void ProcessRow(const Item& item, Scratch& sc, int64_t r, int64_t n,
                const uint8_t* visible, double scale64, float scale32) {
  const PreparedAttention& p = item.p;
  const int64_t D = p.dims.head_dim;
  const double cap64 = p.softcap;
  const float cap32 = static_cast<float>(p.softcap);
  const double* q64 = &sc.q64[r * D];
  const float* q32 = &sc.q32[r * D];
  double bmax64 = kNegInfD;
  float bmax32 = kNegInfF;
  for (int64_t t = 0; t < n; ++t) {
    if (!visible[t]) continue;
    const float* k = &sc.k_block[t * D];
    if (item.reference) {
      double s64 =
          (p.k_dtype == DType::kF64 ? DotF64Exact(q64, &sc.k_block64[t * D], D)
                                    : DotF64(q64, k, D)) *
          scale64;
      if (cap64 > 0) s64 = cap64 * std::tanh(s64 / cap64);
      sc.s64[t] = s64;
      bmax64 = std::max(bmax64, s64);
    }
    if (item.replay) {
      float s32 = DotF32(q32, k, D) * scale32;
      if (cap32 > 0) s32 = cap32 * std::tanh(s32 / cap32);
      sc.s32[t] = s32;
      bmax32 = std::max(bmax32, s32);
    }
  }
  if (item.reference) {
    double& m = sc.ref_m[r];
    double& l = sc.ref_l[r];
    double* acc = &sc.ref_acc[r * D];
    const double m_new = std::max(m, bmax64);
    if (m != kNegInfD && m_new != m) {
      const double alpha = std::exp(m - m_new);
      l *= alpha;
      for (int64_t i = 0; i < D; ++i) acc[i] *= alpha;
    }
    m = m_new;
    int64_t count = 0;
    for (int64_t t = 0; t < n; ++t) {
      if (!visible[t]) continue;
      sc.rows[count] = static_cast<int32_t>(t);
      sc.e64[count++] = sc.s64[t] - m;
    }
    ExpNonPositiveF64(sc.e64.data(), count, sc.e64.data());
    for (int64_t j = 0; j < count; ++j) l += sc.e64[j];
    if (p.v_dtype == DType::kF64) {
      for (int64_t j = 0; j < count; ++j) {
        const double* v64 = &sc.v_block64[sc.rows[j] * D];
        for (int64_t i = 0; i < D; ++i)
          acc[i] = std::fma(sc.e64[j], v64[i], acc[i]);
      }
    } else {
      AccumulateF64(acc, sc.e64.data(), sc.v_block.data(), sc.rows.data(),
                    count, D);
    }
  }
  if (item.replay) {
    float* blk_out = sc.blk_out.data();
    std::fill(blk_out, blk_out + D, 0.0f);
    float blk_sum = 0.0f;
    int64_t count = 0;
    for (int64_t t = 0; t < n; ++t) {
      if (!visible[t]) continue;
      sc.rows[count] = static_cast<int32_t>(t);
      sc.e32[count++] = sc.s32[t] - bmax32;
    }
    ExpNonPositiveF32(sc.e32.data(), count, sc.e32.data());
    for (int64_t j = 0; j < count; ++j) blk_sum += sc.e32[j];
    AccumulateF32(blk_out, sc.e32.data(), sc.v_block.data(), sc.rows.data(),
                  count, D);
    for (int64_t i = 0; i < D; ++i) blk_out[i] /= blk_sum;
    const float blk_lse = bmax32 + std::log(blk_sum);
    float* rep = &sc.rep_out[r * D];
    if (!sc.rep_started[r]) {
      std::copy(blk_out, blk_out + D, rep);
      sc.rep_lse[r] = blk_lse;
      sc.rep_started[r] = 1;
    } else {
      MergeInto(rep, &sc.rep_lse[r], blk_out, blk_lse, D);
    }
  }
}

// Writes R and P of every row of the item to the results.
void FinishRows(const Item& item, Scratch& sc, int64_t b, int64_t g0,
                int64_t g1) {
  const PreparedAttention& p = item.p;
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t group = d.group();
  const int64_t per_query = (g1 - g0) * group;
  AttentionResults& res = *item.results;
  const std::vector<float> zeros(static_cast<size_t>(D), 0.0f);
  for (int64_t r = 0; r < d.queries * per_query; ++r) {
    const int64_t sq = r / per_query;
    const int64_t h = g0 * group + r % per_query;
    const int64_t g = h / group;
    const int64_t qi = (b * d.queries + sq) * d.q_heads + h;
    if (item.reference) {
      double l = sc.ref_l[r];
      double m = sc.ref_m[r];
      double acc_scale = 1.0;
      double lse_ref = m + std::log(l);
      if (!p.sinks.empty()) {
        // The sink is one more logit in the denominator, with no value.
        // Work relative to max(m, sink): a (finite, valid) sink far above
        // every score must not overflow exp().
        const double sink = p.sinks[h];
        if (sink > m) {
          acc_scale = std::exp(m - sink);
          l = l * acc_scale + 1.0;
          m = sink;
        } else {
          l += std::exp(sink - m);
        }
        if (p.lse_includes_sinks) lse_ref = m + std::log(l);
      }
      const double vs = p.v_scale[g];
      for (int64_t i = 0; i < D; ++i) {
        res.reference_out[qi * D + i] =
            sc.ref_acc[r * D + i] * acc_scale / l * vs;
      }
      res.reference_lse[qi] = lse_ref;
    }
    if (item.replay) {
      float* rep = &sc.rep_out[r * D];
      float rep_lse = sc.rep_lse[r];
      const float rep_lse_keys = rep_lse;
      if (!p.sinks.empty()) {
        MergeInto(rep, &rep_lse, zeros.data(), static_cast<float>(p.sinks[h]),
                  D);
      }
      const double vs = p.v_scale[g];
      const float vs32 = static_cast<float>(vs);
      for (int64_t i = 0; i < D; ++i) {
        const float value = vs == 1.0 ? rep[i] : rep[i] * vs32;
        res.replay_out[qi * D + i] = RoundToDType(value, p.output_dtype);
      }
      res.replay_lse[qi] = p.lse_includes_sinks ? rep_lse : rep_lse_keys;
    }
  }
}

// One work item: batch row b, KV heads [g0, g1). Rows are ordered
// (sq, query head within the range). Each logical block's page is consumed
// for all heads of the range before moving on, so a page is read from
// memory once, contiguously.
void RunItem(const Item& item, int64_t b, int64_t g0, int64_t g1, Scratch& sc) {
  const PreparedAttention& p = item.p;
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t P = d.page_size;
  const int64_t group = d.group();
  const int64_t per_query = (g1 - g0) * group;
  const int64_t rows = d.queries * per_query;
  const int64_t L = p.layout->seq_lens[b];
  const std::vector<int32_t>& pages = p.layout->block_pages[b];

  sc.k_block.resize(static_cast<size_t>(P * D));
  sc.v_block.resize(static_cast<size_t>(P * D));
  if (p.k_dtype == DType::kF64) sc.k_block64.resize(static_cast<size_t>(P * D));
  if (p.v_dtype == DType::kF64) sc.v_block64.resize(static_cast<size_t>(P * D));
  sc.positions.resize(static_cast<size_t>(P));
  sc.visible.resize(static_cast<size_t>(d.queries * P));
  sc.visible_count.resize(static_cast<size_t>(d.queries));
  sc.q64.resize(static_cast<size_t>(rows * D));
  sc.q32.resize(static_cast<size_t>(rows * D));
  sc.ref_m.assign(static_cast<size_t>(rows), kNegInfD);
  sc.ref_l.assign(static_cast<size_t>(rows), 0.0);
  sc.ref_acc.assign(static_cast<size_t>(rows * D), 0.0);
  sc.rep_out.assign(static_cast<size_t>(rows * D), 0.0f);
  sc.rep_lse.assign(static_cast<size_t>(rows), kNegInfF);
  sc.rep_started.assign(static_cast<size_t>(rows), 0);
  sc.blk_out.resize(static_cast<size_t>(D));
  sc.s64.resize(static_cast<size_t>(P));
  sc.s32.resize(static_cast<size_t>(P));
  sc.rows.resize(static_cast<size_t>(P));
  sc.e64.resize(static_cast<size_t>(P));
  sc.e32.resize(static_cast<size_t>(P));

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t sq = r / per_query;
    const int64_t h = g0 * group + r % per_query;
    const double* src = &p.q[((b * d.queries + sq) * d.q_heads + h) * D];
    for (int64_t i = 0; i < D; ++i) {
      sc.q64[r * D + i] = src[i];
      sc.q32[r * D + i] = static_cast<float>(src[i]);
    }
  }
  const Tensor& slot_positions = p.snapshot->slot_positions;
  const int64_t num_blocks = (L + P - 1) / P;
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t page = pages[blk];
    const int64_t n = std::min(P, L - blk * P);
    if (blk + 1 < num_blocks) {
      PrefetchPage(p.k_data, p.k_dtype, p.k_layout, d, pages[blk + 1], g0, g1);
      PrefetchPage(p.v_data, p.v_dtype, p.v_layout, d, pages[blk + 1], g0, g1);
    }
    for (int64_t t = 0; t < n; ++t) {
      sc.positions[t] = slot_positions.IntAt(page * P + t);
    }
    bool any = false;
    for (int64_t sq = 0; sq < d.queries; ++sq) {
      const int64_t qpos = p.query_positions[b * d.queries + sq];
      uint8_t* vis = &sc.visible[sq * P];
      int64_t count = 0;
      for (int64_t t = 0; t < n; ++t) {
        vis[t] = Visible(p, sc.positions[t], qpos);
        count += vis[t];
      }
      sc.visible_count[sq] = count;
      any = any || count > 0;
      if (count > 0 && item.record_orders && g0 == 0) {
        item.results->merge_orders[b][sq].push_back(static_cast<int32_t>(blk));
      }
    }
    if (!any) continue;
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t t = 0; t < n; ++t) {
        const int64_t k_off = KvOffset(p.k_layout, d, page, t, g);
        const int64_t v_off = KvOffset(p.v_layout, d, page, t, g);
        WidenRow(p.k_data, p.k_dtype, k_off, D, &sc.k_block[t * D]);
        WidenRow(p.v_data, p.v_dtype, v_off, D, &sc.v_block[t * D]);
        if (p.k_dtype == DType::kF64) {
          std::memcpy(&sc.k_block64[t * D],
                      static_cast<const double*>(p.k_data) + k_off,
                      static_cast<size_t>(D) * sizeof(double));
        }
        if (p.v_dtype == DType::kF64) {
          std::memcpy(&sc.v_block64[t * D],
                      static_cast<const double*>(p.v_data) + v_off,
                      static_cast<size_t>(D) * sizeof(double));
        }
      }
      const double scale64 = p.softmax_scale * p.k_scale[g];
      const float scale32 = static_cast<float>(p.softmax_scale) *
                            static_cast<float>(p.k_scale[g]);
      for (int64_t sq = 0; sq < d.queries; ++sq) {
        if (sc.visible_count[sq] == 0) continue;
        const int64_t first_row = sq * per_query + (g - g0) * group;
        for (int64_t j = 0; j < group; ++j) {
          ProcessRow(item, sc, first_row + j, n, &sc.visible[sq * P], scale64,
                     scale32);
        }
      }
    }
  }
  FinishRows(item, sc, b, g0, g1);
}

}  // namespace

absl::StatusOr<AttentionResults> ComputeReferenceAndReplay(
    const PreparedAttention& p, int threads, bool record_merge_orders,
    const std::atomic<bool>* cancelled) {
  AttentionRunOptions options;
  options.threads = threads;
  options.record_merge_orders = record_merge_orders;
  options.cancelled = cancelled;
  return ComputeAttention(p, options);
}

absl::StatusOr<AttentionResults> ComputeAttention(
    const PreparedAttention& p, const AttentionRunOptions& options) {
  const int threads = options.threads;
  const bool record_merge_orders = options.record_merge_orders;
  const std::atomic<bool>* cancelled = options.cancelled;
  const auto start = std::chrono::steady_clock::now();
  const SnapshotDims& d = p.dims;
  AttentionResults res;
  const size_t n_out =
      static_cast<size_t>(d.batch * d.queries * d.q_heads * d.head_dim);
  const size_t n_lse = static_cast<size_t>(d.batch * d.queries * d.q_heads);
  res.reference_out.assign(n_out, 0.0);
  res.replay_out.assign(n_out, 0.0);
  res.reference_lse.assign(n_lse, 0.0);
  res.replay_lse.assign(n_lse, 0.0);
  // Merge orders are always tracked (cheap) to size the tolerances.
  res.merge_orders.assign(
      static_cast<size_t>(d.batch),
      std::vector<std::vector<int32_t>>(static_cast<size_t>(d.queries)));
  const Item item{p, &res, true, options.passes != AttentionPasses::kReplayOnly,
                  options.passes != AttentionPasses::kReferenceOnly};
  // Work items: (row, range of KV heads). Whole rows keep each page read
  // contiguously; rows are split by heads only when there are too few rows
  // to keep every thread busy.
  const int workers = ResolveThreads(threads);
  int64_t splits = 1;
  while (splits < d.kv_heads && d.batch * splits < 4 * workers) splits *= 2;
  splits = std::min(splits, d.kv_heads);
  const int64_t heads_per_item = (d.kv_heads + splits - 1) / splits;
  const int64_t chunks = (d.kv_heads + heads_per_item - 1) / heads_per_item;
  const int64_t items = d.batch * chunks;
  std::atomic<bool> was_cancelled{false};
  ParallelFor(items, threads, [&](int64_t i) {
    if (cancelled != nullptr && cancelled->load(std::memory_order_relaxed)) {
      was_cancelled.store(true);
      return;
    }
    thread_local Scratch scratch;
    const int64_t b = i / chunks;
    const int64_t g0 = (i % chunks) * heads_per_item;
    const int64_t g1 = std::min(d.kv_heads, g0 + heads_per_item);
    RunItem(item, b, g0, g1, scratch);
  });
  if (was_cancelled.load()) return absl::CancelledError("audit cancelled");

  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t sq = 0; sq < d.queries; ++sq) {
      res.max_merged_blocks = std::max<int64_t>(
          res.max_merged_blocks,
          static_cast<int64_t>(res.merge_orders[b][sq].size()));
      // Visible keys: count positions <= query (and in the window).
      const int64_t qpos = p.query_positions[b * d.queries + sq];
      int64_t visible = 0;
      const int64_t L = p.layout->seq_lens[b];
      for (int64_t t = 0; t < L; ++t) {
        const int64_t page = p.layout->block_pages[b][t / d.page_size];
        visible += Visible(p,
                           p.snapshot->slot_positions.IntAt(page * d.page_size +
                                                            t % d.page_size),
                           qpos);
      }
      res.max_visible_keys = std::max(res.max_visible_keys, visible);
    }
  }
  if (!record_merge_orders) res.merge_orders.clear();
  res.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return res;
}

}  // namespace attnaudit
