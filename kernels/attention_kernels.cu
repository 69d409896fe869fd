// The fused R + P pass (attention_kernels.h states what it computes). The
// arithmetic is kernels/math/ and core/attention/merge_tree.h, in the CPU
// core's operation order; this file maps it onto threads:
//   - a stage holds up to runs_per_stage runs; run j of a stage keeps its
//     tokens at [j * P, j * P + n_j) of the stage's token index (P =
//     max_run), its units are the stage's units [0, stage units), and every
//     phase below runs over all of them at once;
//   - visibility: a warp per (query position, run) builds the run's
//     ascending list of visible tokens with a ballot;
//   - scores: a group of V threads (16 for fp32, 8 for fp64: the virtual
//     lanes) per (two tokens, four query rows); lane l computes its eight
//     partials, the eight lane trees run together as xor-shuffles (lane i
//     + lane i^m is the tree's pair, in either operand order: addition
//     commutes exactly), and the lane left holding a dot product adds the
//     tail and applies the scale and soft-cap;
//   - then a warp per work item, with no barrier between items: R's update
//     of one row through the stage's runs in order, or one unit's state
//     (P, and R's when asked) for one row. A max or a sum in key order is
//     computed by every lane of the warp alike (the same reads, the same
//     bits), the weights one key a lane, the output elements one FMA chain
//     per element in key order, four adjacent elements a lane;
//   - the unit tree (the second step): each (query, four elements) thread
//     runs their tree, computing each pair's weights itself (the same bits
//     on every thread).
// So every thread count, stage size and launch shape computes the same
// bits.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/common/status_macros.h"
#include "kernels/attention_kernels.h"
#include "kernels/cuda_check.h"
#include "kernels/math/dot.h"
#include "kernels/math/scalar.h"
#include "kernels/math/split_merge.h"
#include "kernels/math/unit_state.h"
#include "kernels/math/widen.h"

namespace attnaudit {
namespace cuda_internal {
namespace {

constexpr int kThreads = 256;
// Resident blocks per multiprocessor the register budget is cut for (128
// registers a thread): FitPassToSharedMemory sizes stages for two.
constexpr int kMinBlocksPerSm = 2;

int64_t Align16(int64_t x) { return (x + 15) / 16 * 16; }

// Query heads of a head tile (the last tile may have fewer).
__host__ __device__ inline int64_t TileHeads(const PassParams& p) {
  const int64_t group = p.q_heads / p.kv_heads;
  return (group + p.head_tiles - 1) / p.head_tiles;
}

// The shared-memory sections for the params' shape, stage and query chunk.
// -1 in total when it passes 2^31 bytes (never fits).
PassLayout MakeLayout(const PassParams& p) {
  const int64_t D = p.head_dim;
  const int64_t S = p.runs_per_stage;
  const int64_t T = S * p.max_run;  // stage tokens; also its most units
  const int64_t group = TileHeads(p);
  const int64_t qpb = p.queries_per_block;
  const int64_t rows = group * qpb;
  const bool r64 = p.reference || p.store_r_states;
  const bool p32 = p.store_p_states;
  PassLayout l;
  int64_t at = 0;
  auto take = [&at](int64_t bytes) {
    const int64_t here = at;
    at += Align16(bytes);
    return static_cast<int32_t>(here);
  };
  l.raw_k = take(T * D * kmath::ElemBytes(p.k_dtype));
  l.raw_v = take(T * D * kmath::ElemBytes(p.v_dtype));
  l.k32 = take(T * D * 4);
  l.v32 = take(T * D * 4);
  l.k64 = take(p.k_dtype == kmath::kElemF64 ? T * D * 8 : 0);
  l.v64 = take(p.v_dtype == kmath::kElemF64 ? T * D * 8 : 0);
  l.q32 = take(p32 ? rows * D * 4 : 0);
  l.q64 = take(r64 ? rows * D * 8 : 0);
  l.vis = take(qpb * T * 4);
  l.vcount = take(qpb * S * 4);
  l.run_n = take(S * 4);
  l.tok = take(T * 4);
  l.units = take(T * static_cast<int64_t>(sizeof(PassUnit)));
  l.s32 = take(p32 ? rows * T * 4 : 0);
  l.e32 = take(p32 ? rows * T * 4 : 0);
  l.s64 = take(r64 ? rows * T * 8 : 0);
  l.e64 = take(p.reference ? rows * T * 8 : 0);
  l.re64 = take(p.store_r_states ? rows * T * 8 : 0);
  l.r_acc = take(p.reference ? rows * D * 8 : 0);
  l.r_m = take(p.reference ? rows * 8 : 0);
  l.r_l = take(p.reference ? rows * 8 : 0);
  l.total = at < (int64_t{1} << 31) ? static_cast<int32_t>(at) : -1;
  return l;
}

// What one thread block works on. Shared-memory extents are 32-bit, so the
// index arithmetic of the inner loops is 32-bit (a 64-bit divide is a long
// software routine).
struct Item {
  int64_t b;          // batch row
  int64_t split;      // which of the row's run ranges (split-KV)
  int64_t g;          // KV head
  int64_t sq0;        // first query position
  int64_t head_base;  // query head of the tile's first row
  int32_t qn;         // query positions (<= queries_per_block)
  int32_t group;      // query heads of the tile (the GQA group's, one tile)
  int32_t rows;       // group * qn
  int32_t D;
  int32_t P;  // max_run: a stage's token stride per run
  int32_t S;  // runs_per_stage
  int32_t T;  // S * P
  // The query head of row r (rows are query position-major).
  __device__ int64_t HeadOf(int32_t r) const { return head_base + r % group; }
};

// One stage: runs [first, first + count) and their units [unit_begin,
// unit_begin + units).
struct Stage {
  int32_t first;
  int32_t count;
  int32_t unit_begin;
  int32_t units;
};

struct Shared {
  char* base;
  const PassLayout& l;
  template <typename T>
  __device__ T* at(int32_t offset) const {
    return reinterpret_cast<T*>(base + offset);
  }
};

__device__ Stage StageAt(const PassParams& p, int32_t first, int32_t last,
                         int32_t S) {
  Stage st;
  st.first = first;
  st.count = last - first < S ? last - first : S;
  st.unit_begin = p.runs[first].unit_begin;
  st.units = p.runs[first + st.count - 1].unit_end - st.unit_begin;
  return st;
}

// Starts the asynchronous copy of the stage's K and V rows of head g into
// the raw stage (whole rows, copy_width bytes per copy; run j at token
// j * P): a warp per (run, K or V), so a run's setup is one warp's, not
// every thread's.
__device__ void LoadStage(const PassParams& p, const Item& it, const Shared& sh,
                          const Stage& st) {
  const int32_t lane = threadIdx.x % 32;
  const int w = p.copy_width;
  for (int32_t item = threadIdx.x / 32; item < 2 * st.count;
       item += blockDim.x / 32) {
    const int32_t j = item / 2;
    const bool is_v = item % 2 != 0;
    const PassRun& run = p.runs[st.first + j];
    const int elem = kmath::ElemBytes(is_v ? p.v_dtype : p.k_dtype);
    const char* src =
        (is_v ? p.v_base + run.v_offset : p.k_base + run.k_offset) +
        it.g * (is_v ? p.v_head_stride : p.k_head_stride) * elem;
    const int64_t stride =
        (is_v ? p.v_row_stride : p.k_row_stride) * int64_t{elem};
    const int32_t row_bytes = it.D * elem;
    char* dst =
        sh.base + (is_v ? sh.l.raw_v : sh.l.raw_k) + j * it.P * row_bytes;
    // Lane l copies chunks l, l + 32, ...: (row t, chunk off) advanced
    // without a division per chunk.
    const int32_t per_row = row_bytes / w;
    const int32_t dt = 32 / per_row;
    const int32_t doff = 32 - dt * per_row;
    int32_t t = lane / per_row;
    int32_t off = lane - t * per_row;
    const int32_t n = run.n;
    // The addresses advance with (t, off): no multiply per chunk.
    const char* from = src + t * stride + off * w;
    char* to = dst + t * row_bytes + off * w;
    const int64_t from_step = dt * stride + doff * w;
    const int32_t to_step = dt * row_bytes + doff * w;
    const int64_t from_wrap = stride - int64_t{per_row} * w;
    const int32_t to_wrap = row_bytes - per_row * w;  // 0: rows are packed
    while (t < n) {
      if (w >= 4) {
        __pipeline_memcpy_async(to, from, static_cast<size_t>(w));
      } else {
        *to = *from;  // unaligned rows: plain loads
      }
      t += dt;
      off += doff;
      from += from_step;
      to += to_step;
      if (off >= per_row) {
        off -= per_row;
        ++t;
        from += from_wrap;
        to += to_wrap;
      }
    }
  }
}

// Widens element i of a raw stage (K or V) into out32 (and out64 for f64
// pages); true when it is not finite.
__device__ bool WidenElement(const char* raw, int dtype, int32_t i,
                             float* out32, double* out64) {
  if (dtype == kmath::kElemF64) {
    const double x = reinterpret_cast<const double*>(raw)[i];
    out64[i] = x;
    out32[i] = static_cast<float>(x);
    return !kmath::Ops<double>::IsFinite(x);
  }
  out32[i] = kmath::WidenToFloat(raw, dtype, i);
  return !kmath::Ops<float>::IsFinite(out32[i]);
}

// Widens the N elements of 16 raw bytes into out (kmath::WidenWords);
// true when one is not finite.
template <int N>
__device__ bool WidenSixteen(const char* raw, int dtype, float* out) {
  const uint4 v = *reinterpret_cast<const uint4*>(raw);
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  float f[N];
  const bool bad = kmath::WidenWords<N>(words, dtype, f);
#pragma unroll
  for (int e = 0; e < N; e += 4) {
    *reinterpret_cast<float4*>(out + e) =
        make_float4(f[e], f[e + 1], f[e + 2], f[e + 3]);
  }
  return bad;
}

// Widens `elems` elements of one run's rows, 16 raw bytes (N elements) a
// lane of the calling warp at a time.
template <int N>
__device__ bool WidenRun16(const char* raw, int dtype, int32_t elems,
                           float* out) {
  bool bad = false;
  for (int32_t i = (threadIdx.x % 32) * N; i < elems; i += 32 * N) {
    bad |= WidenSixteen<N>(raw + (i / N) * 16, dtype, out + i);
  }
  return bad;
}

__device__ bool WidenRun16(const char* raw, int dtype, int bytes, int32_t elems,
                           float* out) {
  switch (bytes) {
    case 4:
      return WidenRun16<4>(raw, dtype, elems, out);
    case 2:
      return WidenRun16<8>(raw, dtype, elems, out);
    default:
      return WidenRun16<16>(raw, dtype, elems, out);
  }
}

// Widens the raw stage into k32/v32 (and k64/v64 for f64 pages), flagging
// non-finite values: the pass is the audit's only read of the cache, as on
// the CPU. Also copies the stage's run lengths, which stage tokens exist
// (tok) and its units (with their run's slot in `pad`) into shared memory.
__device__ void WidenStage(const PassParams& p, const Item& it,
                           const Shared& sh, const Stage& st) {
  int32_t* run_n = sh.at<int32_t>(sh.l.run_n);
  int32_t* tok = sh.at<int32_t>(sh.l.tok);
  for (int32_t j = 0; j < st.count; ++j) {
    const int32_t n = p.runs[st.first + j].n;
    if (threadIdx.x == 0) run_n[j] = n;
    for (int32_t t = threadIdx.x; t < it.P; t += blockDim.x) {
      tok[j * it.P + t] = t < n;
    }
  }
  PassUnit* units = sh.at<PassUnit>(sh.l.units);
  for (int32_t k = threadIdx.x; k < st.units; k += blockDim.x) {
    const int32_t u = st.unit_begin + k;
    int32_t j = 0;
    while (p.runs[st.first + j].unit_end <= u) ++j;
    PassUnit unit = p.units[u];
    unit.pad = j;
    units[k] = unit;
  }
  const char* k_raw = sh.base + sh.l.raw_k;
  const char* v_raw = sh.base + sh.l.raw_v;
  float* k32 = sh.at<float>(sh.l.k32);
  float* v32 = sh.at<float>(sh.l.v32);
  double* k64 = sh.at<double>(sh.l.k64);
  double* v64 = sh.at<double>(sh.l.v64);
  const int ke = kmath::ElemBytes(p.k_dtype);
  const int ve = kmath::ElemBytes(p.v_dtype);
  // Whole 16-byte pieces: every run's rows start and end on one.
  const bool by_sixteen = p.k_dtype != kmath::kElemF64 &&
                          p.v_dtype != kmath::kElemF64 &&
                          (it.D * ke) % 16 == 0 && (it.D * ve) % 16 == 0;
  bool bad = false;
  if (by_sixteen) {
    // A warp per (run, K or V).
    for (int32_t item = threadIdx.x / 32; item < 2 * st.count;
         item += blockDim.x / 32) {
      const int32_t j = item / 2;
      const int32_t begin = j * it.P * it.D;
      const int32_t elems = p.runs[st.first + j].n * it.D;
      if (item % 2 == 0) {
        bad |=
            WidenRun16(k_raw + begin * ke, p.k_dtype, ke, elems, k32 + begin);
      } else {
        bad |=
            WidenRun16(v_raw + begin * ve, p.v_dtype, ve, elems, v32 + begin);
      }
    }
  } else {
    for (int32_t j = 0; j < st.count; ++j) {
      const int32_t begin = j * it.P * it.D;
      const int32_t elems = p.runs[st.first + j].n * it.D;
      for (int32_t i = begin + threadIdx.x; i < begin + elems;
           i += blockDim.x) {
        bad |= WidenElement(k_raw, p.k_dtype, i, k32, k64);
        bad |= WidenElement(v_raw, p.v_dtype, i, v32, v64);
      }
    }
  }
  if (bad) atomicOr(p.kv_non_finite, 1);
}

__device__ bool Visible(const PassParams& p, int64_t key_pos,
                        int64_t query_pos) {
  if (key_pos < 0 || key_pos > query_pos) return false;
  if (p.window <= 0) return true;
  const int64_t distance = query_pos - key_pos;
  return p.window_inclusive ? distance <= p.window : distance < p.window;
}

// Per (query position, run), the ascending list of the run's visible
// tokens at vis[q * T + j * P] and its length at vcount[q * S + j]: a warp
// per (query position, run), 32 tokens a ballot.
__device__ void BuildVisibility(const PassParams& p, const Item& it,
                                const Shared& sh, const Stage& st) {
  int32_t* vis = sh.at<int32_t>(sh.l.vis);
  int32_t* vcount = sh.at<int32_t>(sh.l.vcount);
  const int32_t* run_n = sh.at<int32_t>(sh.l.run_n);
  const int32_t lane = threadIdx.x % 32;
  for (int32_t qj = threadIdx.x / 32; qj < it.qn * st.count;
       qj += blockDim.x / 32) {
    const int32_t q = qj / st.count;
    const int32_t j = qj - q * st.count;
    const int32_t n = run_n[j];
    const int64_t* positions = p.positions + p.runs[st.first + j].pos_offset;
    const int64_t qpos = p.query_positions[it.b * p.queries + it.sq0 + q];
    int32_t* list = vis + q * it.T + j * it.P;
    int32_t count = 0;
    for (int32_t t0 = 0; t0 < n; t0 += 32) {
      const int32_t t = t0 + lane;
      const bool visible = t < n && Visible(p, positions[t], qpos);
      const unsigned mask = __ballot_sync(0xffffffffu, visible);
      if (visible) list[count + __popc(mask & ((1u << lane) - 1u))] = t;
      count += __popc(mask);
    }
    if (lane == 0) vcount[q * it.S + j] = count;
  }
}

// Scores of every (row, token) pair of the stage in T: a group of V
// threads (the virtual lanes) per (two tokens, four query rows), reading
// each q and K element once for the eight dot products, whose lane trees
// run together as xor-shuffles (kmath::LaneTreeOfValues: 8 exchanges, not
// 8 trees of log2 V). K rows are k_rows ([stage token][D] of type K,
// widened to T as read).
constexpr int kScoreRows = 4;
constexpr int kScoreTokens = 2;

template <typename T, typename K>
__device__ void Scores(const Item& it, const Shared& sh, const Stage& st,
                       const T* q, const K* k_rows, T scale, T cap, T* s) {
  constexpr int V = kmath::VirtualLanes<T>::kCount;
  constexpr int N = kScoreRows * kScoreTokens;
  static_assert(N <= V, "one value a lane at the end of the tree");
  const int32_t* tok = sh.at<int32_t>(sh.l.tok);
  const int lane = threadIdx.x % V;
  const int32_t group_id = threadIdx.x / V;
  const int32_t groups = blockDim.x / V;
  const int32_t span = st.count * it.P;
  const int32_t pairs = (span + kScoreTokens - 1) / kScoreTokens;
  const int32_t chunks = (it.rows + kScoreRows - 1) / kScoreRows;
  const int32_t items = pairs * chunks;
  for (int32_t base = 0; base < items; base += groups) {
    const int32_t item = base + group_id;
    const int32_t chunk = chunks == 1 || item >= items ? 0 : item / pairs;
    const int32_t t0 = (item - chunk * pairs) * kScoreTokens;
    const int32_t r0 = chunk * kScoreRows;
    const int32_t nr = item < items ? min(kScoreRows, it.rows - r0) : 0;
    const K* k[kScoreTokens];
#pragma unroll
    for (int x = 0; x < kScoreTokens; ++x) {
      k[x] = k_rows + (t0 + x < span ? t0 + x : 0) * it.D;
    }
    // Every lane reaches the shuffles (an idle group adds zeros).
    T part[kScoreTokens][kScoreRows];
    kmath::LanePartialsOfTokens(q + r0 * it.D, it.D, k, it.D, lane, nr, part);
    T vals[N];
#pragma unroll
    for (int x = 0; x < kScoreTokens; ++x) {
#pragma unroll
      for (int r = 0; r < kScoreRows; ++r)
        vals[x * kScoreRows + r] = part[x][r];
    }
    const int held = kmath::LaneTreeOfValues<V, N>(
        lane, vals,
        [](T send, int m) { return __shfl_xor_sync(0xffffffffu, send, m); });
    const int32_t x = held / kScoreRows;
    const int32_t r = held % kScoreRows;
    const int32_t tt = t0 + x;
    if (lane % (V / N) == 0 && r < nr && tt < span && tok[tt] != 0) {
      const T dot = kmath::DotTail(q + (r0 + r) * it.D, k_rows + tt * it.D,
                                   it.D, vals[0]);
      s[(r0 + r) * it.T + tt] = kmath::Score(dot, scale, cap);
    }
  }
}

// The output elements a lane of a warp computes: four adjacent ones from
// 4 * lane when the row is float4-aligned (D % 4 == 0), else one from lane;
// the next at + step.
struct LaneElements {
  int32_t first;
  int32_t step;
  bool by_four;
};

__device__ LaneElements ElementsOf(int32_t D, int32_t lane) {
  const bool by_four = D % 4 == 0;
  return by_four ? LaneElements{lane * 4, 128, true}
                 : LaneElements{lane, 32, false};
}

// Calls body(key) with the visible list's key map: list[c], or, when the
// list is a run of consecutive tokens (every key of the range visible:
// the common case), first + c, which needs no load.
template <typename Body>
__device__ void WithKeys(const int32_t* list, int32_t count, Body body) {
  const int32_t first = list[0];
  if (list[count - 1] - first == count - 1) {
    body([first](int64_t c) { return first + static_cast<int32_t>(c); });
  } else {
    body([list](int64_t c) { return list[c]; });
  }
}

// R's online-softmax update of row r with the stage's runs, each a logical
// block, in order, by one warp: the running max, the rescale factor and
// the sum on every lane alike, the weights a key a lane, the output
// elements as LaneElements. A run with no visible key leaves the state as
// it is.
__device__ void UpdateReferenceRow(const Item& it, const Shared& sh,
                                   const Stage& st, bool v_f64, int32_t r,
                                   int32_t lane) {
  const int32_t* vis = sh.at<int32_t>(sh.l.vis);
  const int32_t* vcount = sh.at<int32_t>(sh.l.vcount);
  const double* s = sh.at<double>(sh.l.s64) + r * it.T;
  double* e = sh.at<double>(sh.l.e64) + r * it.T;
  double* acc = sh.at<double>(sh.l.r_acc) + r * it.D;
  const float* v32 = sh.at<float>(sh.l.v32);
  const double* v64 = sh.at<double>(sh.l.v64);
  const int32_t q = r / it.group;
  const LaneElements el = ElementsOf(it.D, lane);
  double m = sh.at<double>(sh.l.r_m)[r];
  double l = sh.at<double>(sh.l.r_l)[r];
  for (int32_t j = 0; j < st.count; ++j) {
    const int32_t count = vcount[q * it.S + j];
    if (count == 0) continue;
    const int32_t base = j * it.P;
    WithKeys(vis + q * it.T + base, count, [&](auto key) {
      const double m_new =
          kmath::MaxStep(m, kmath::VisibleMaxOf(s + base, key, count));
      const double alpha = kmath::RescaleFactor(m, m_new);
      m = m_new;
      for (int32_t c = lane; c < count; c += 32) {
        e[base + c] = kmath::Weight(s[base + key(c)], m);
      }
      __syncwarp();
      l = kmath::SumInOrder(e + base, count, kmath::Ops<double>::Mul(l, alpha));
      const int32_t width = el.by_four ? 4 : 1;
      for (int32_t d = el.first; d < it.D; d += el.step) {
        for (int32_t x = 0; x < width; ++x) {
          acc[d + x] = kmath::AccumulateElementOf(
              e + base, key, count,
              [&](int32_t t) {
                const int32_t at = (base + t) * it.D + d + x;
                return v_f64 ? v64[at] : static_cast<double>(v32[at]);
              },
              kmath::Ops<double>::Mul(acc[d + x], alpha));
        }
      }
    });
  }
  __syncwarp();  // every lane has read the state it started from
  if (lane == 0) {
    sh.at<double>(sh.l.r_m)[r] = m;
    sh.at<double>(sh.l.r_l)[r] = l;
  }
}

// One unit's state (stage unit k) for row r, by one warp, in T (fp32: P;
// fp64: R's unit states), with kmath::UnitState's steps: the unit's part of
// the run's visible list, its max and sum on every lane alike, the weights
// a key a lane (into e, the row's scratch), the output elements as
// LaneElements; stored at state ((unit_base[b] + unit index) * Sq + sq) *
// Hq + h with its lse (and, for P, its presence flag).
template <typename T>
__device__ void UnitStateOfRow(const PassParams& p, const Item& it,
                               const Shared& sh, const T* s_rows, T* e_rows,
                               T* state_out, T* state_lse, int32_t r, int32_t k,
                               int32_t lane) {
  const PassUnit unit = sh.at<PassUnit>(sh.l.units)[k];
  const int32_t q = r / it.group;
  const int32_t run_base = unit.pad * it.P;
  const int32_t* list = sh.at<int32_t>(sh.l.vis) + q * it.T + run_base;
  const int32_t run_count = sh.at<int32_t>(sh.l.vcount)[q * it.S + unit.pad];
  int32_t lo = 0;
  int32_t hi = run_count;
  if (unit.first != 0 || unit.count < sh.at<int32_t>(sh.l.run_n)[unit.pad]) {
    // A unit that is part of its run (CP token interleaving).
    while (lo < run_count && list[lo] < unit.first) ++lo;
    hi = lo;
    while (hi < run_count && list[hi] < unit.first + unit.count) ++hi;
  }
  const int32_t count = hi - lo;
  if (count == 0) return;
  list += lo;
  const int64_t h = it.HeadOf(r);
  const int64_t unit_base =
      p.unit_base != nullptr ? p.unit_base[it.b] : int64_t{0};
  const int64_t state =
      ((unit_base + unit.index) * p.queries + it.sq0 + q) * p.q_heads + h;
  const T* s = s_rows + r * it.T + run_base;
  T* e = e_rows + r * it.T + run_base + lo;
  T* out = state_out + state * it.D;
  const float* v32 = sh.at<float>(sh.l.v32);
  const double* v64 =
      p.v_dtype == kmath::kElemF64 ? sh.at<double>(sh.l.v64) : nullptr;
  const LaneElements el = ElementsOf(it.D, lane);
  WithKeys(list, count, [&](auto key) {
    const T max = kmath::VisibleMaxOf(s, key, count);
    for (int32_t c = lane; c < count; c += 32) {
      e[c] = kmath::Weight(s[key(c)], max);
    }
    __syncwarp();
    const T total = kmath::SumInOrder(e, count, T(0));
    for (int32_t d = el.first; d < it.D; d += el.step) {
      if (sizeof(T) == 4 && el.by_four) {
        // One read of each weight and key for four chains.
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int32_t c = 0; c < count; ++c) {
          const float w = static_cast<float>(e[c]);
          const float4 v = *reinterpret_cast<const float4*>(
              v32 + (run_base + key(c)) * it.D + d);
          acc.x = kmath::Ops<float>::Fma(w, v.x, acc.x);
          acc.y = kmath::Ops<float>::Fma(w, v.y, acc.y);
          acc.z = kmath::Ops<float>::Fma(w, v.z, acc.z);
          acc.w = kmath::Ops<float>::Fma(w, v.w, acc.w);
        }
        const float sum = static_cast<float>(total);
        *reinterpret_cast<float4*>(reinterpret_cast<float*>(out) + d) =
            make_float4(kmath::Ops<float>::Div(acc.x, sum),
                        kmath::Ops<float>::Div(acc.y, sum),
                        kmath::Ops<float>::Div(acc.z, sum),
                        kmath::Ops<float>::Div(acc.w, sum));
        continue;
      }
      const int32_t width = el.by_four ? 4 : 1;
      for (int32_t x = 0; x < width; ++x) {
        const T acc = kmath::AccumulateElementOf(
            e, key, count,
            [&](int32_t t) {
              const int32_t at = (run_base + t) * it.D + d + x;
              if constexpr (sizeof(T) == 8) {
                return v64 != nullptr ? v64[at] : static_cast<double>(v32[at]);
              } else {
                return v32[at];
              }
            },
            T(0));
        out[d + x] = kmath::Ops<T>::Div(acc, total);
      }
    }
    if (lane == 0) {
      state_lse[state] = kmath::UnitLse(max, total);
      if (sizeof(T) == 4 && p.p_state_present != nullptr) {
        p.p_state_present[state] = 1;
      }
    }
  });
}

// After the scores: a warp per item -- R's rows, then P's (row, unit)
// states, then R's -- with no barrier between items (each writes its own
// row's scratch and outputs).
__device__ void StageItems(const PassParams& p, const Item& it,
                           const Shared& sh, const Stage& st) {
  const int32_t lane = threadIdx.x % 32;
  const int32_t r_rows = p.reference ? it.rows : 0;
  const int32_t row_units = it.rows * st.units;
  const int32_t p_items = p.store_p_states ? row_units : 0;
  const int32_t r_items = p.store_r_states ? row_units : 0;
  const bool v_f64 = p.v_dtype == kmath::kElemF64;
  for (int32_t i = threadIdx.x / 32; i < r_rows + p_items + r_items;
       i += blockDim.x / 32) {
    if (i < r_rows) {
      UpdateReferenceRow(it, sh, st, v_f64, i, lane);
      continue;
    }
    const bool p_item = i < r_rows + p_items;
    const int32_t rk = i - r_rows - (p_item ? 0 : p_items);
    const int32_t r = rk / st.units;
    const int32_t k = rk - r * st.units;
    if (p_item) {
      UnitStateOfRow<float>(p, it, sh, sh.at<float>(sh.l.s32),
                            sh.at<float>(sh.l.e32), p.p_state_out,
                            p.p_state_lse, r, k, lane);
    } else {
      UnitStateOfRow<double>(p, it, sh, sh.at<double>(sh.l.s64),
                             sh.at<double>(sh.l.re64), p.r_state_out,
                             p.r_state_lse, r, k, lane);
    }
  }
}

// Loads the item's query rows (q32 = float(q), as the CPU) and resets the
// running states.
__device__ void InitItem(const PassParams& p, const Item& it,
                         const Shared& sh) {
  float* q32 = sh.at<float>(sh.l.q32);
  double* q64 = sh.at<double>(sh.l.q64);
  const bool r64 = p.reference || p.store_r_states;
  const bool p32 = p.store_p_states;
  for (int32_t i = threadIdx.x; i < it.rows * it.D; i += blockDim.x) {
    const int32_t r = i / it.D;
    const int64_t h = it.HeadOf(r);
    const int64_t qi =
        (it.b * p.queries + it.sq0 + r / it.group) * p.q_heads + h;
    const double x = p.q[qi * it.D + i % it.D];
    if (r64) q64[i] = x;
    if (p32) q32[i] = static_cast<float>(x);
    if (p.reference) sh.at<double>(sh.l.r_acc)[i] = 0.0;
  }
  for (int32_t r = threadIdx.x; r < it.rows; r += blockDim.x) {
    if (p.reference) {
      sh.at<double>(sh.l.r_m)[r] = kmath::Ops<double>::NegInf();
      sh.at<double>(sh.l.r_l)[r] = 0.0;
    }
  }
  __syncthreads();
}

// Writes the item's running states (unfinished: the host finishes them).
__device__ void StoreItem(const PassParams& p, const Item& it,
                          const Shared& sh) {
  if (!p.reference) return;
  for (int32_t i = threadIdx.x; i < it.rows * it.D; i += blockDim.x) {
    const int32_t r = i / it.D;
    const int64_t h = it.HeadOf(r);
    const int64_t qi =
        (it.b * p.queries + it.sq0 + r / it.group) * p.q_heads + h;
    const int32_t d = i - r * it.D;
    const int64_t ri = it.split * p.r_split_stride + qi;
    p.r_acc[ri * it.D + d] = sh.at<double>(sh.l.r_acc)[i];
    if (d != 0) continue;
    p.r_m[ri] = sh.at<double>(sh.l.r_m)[r];
    p.r_l[ri] = sh.at<double>(sh.l.r_l)[r];
  }
}

// Visibility, scores, R's update and the units of one stage already
// widened.
__device__ void ComputeStage(const PassParams& p, const Item& it,
                             const Shared& sh, const Stage& st) {
  BuildVisibility(p, it, sh, st);
  const float* k32 = sh.at<float>(sh.l.k32);
  const bool k_f64 = p.k_dtype == kmath::kElemF64;
  const float cap32 = static_cast<float>(p.softcap);
  if (p.reference || p.store_r_states) {
    const double scale = p.softmax_scale * p.k_scale[it.g];
    if (k_f64) {
      Scores<double>(it, sh, st, sh.at<double>(sh.l.q64),
                     sh.at<double>(sh.l.k64), scale, p.softcap,
                     sh.at<double>(sh.l.s64));
    } else {
      Scores<double>(it, sh, st, sh.at<double>(sh.l.q64), k32, scale, p.softcap,
                     sh.at<double>(sh.l.s64));
    }
  }
  if (p.store_p_states) {
    const float scale =
        kmath::Ops<float>::Mul(static_cast<float>(p.softmax_scale),
                               static_cast<float>(p.k_scale[it.g]));
    Scores<float>(it, sh, st, sh.at<float>(sh.l.q32), k32, scale, cap32,
                  sh.at<float>(sh.l.s32));
  }
  __syncthreads();
  StageItems(p, it, sh, st);
}

// The raw stage is read once, by WidenStage; so the next stage's copies
// start as soon as it is widened and run under this stage's compute.
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    FusedPassKernel(const __grid_constant__ PassParams p) {
  extern __shared__ __align__(16) char smem[];
  Item it;
  const int64_t row = blockIdx.x / p.splits;
  it.split = blockIdx.x % p.splits;
  it.b = p.row_begin + row;
  it.g = blockIdx.y;
  if (p.owner_world > 0 &&
      (it.b * p.kv_heads + it.g) % p.owner_world != p.owner_rank) {
    return;
  }
  const int64_t chunk = blockIdx.z / p.head_tiles;
  const int64_t tile = blockIdx.z % p.head_tiles;
  it.sq0 = chunk * p.queries_per_block;
  it.qn = static_cast<int32_t>(p.queries - it.sq0 < p.queries_per_block
                                   ? p.queries - it.sq0
                                   : p.queries_per_block);
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t tile_heads = TileHeads(p);
  const int64_t h0 = tile * tile_heads;  // within the GQA group
  if (h0 >= group) return;               // more tiles than heads: nothing here
  it.group =
      static_cast<int32_t>(group - h0 < tile_heads ? group - h0 : tile_heads);
  it.head_base = it.g * group + h0;
  it.rows = it.group * it.qn;
  it.D = static_cast<int32_t>(p.head_dim);
  it.P = static_cast<int32_t>(p.max_run);
  it.S = static_cast<int32_t>(p.runs_per_stage);
  it.T = it.S * it.P;
  const Shared sh{smem, p.layout};
  InitItem(p, it, sh);
  int32_t first = 0;
  int32_t last = 0;
  kmath::SplitRuns(p.row_runs[row], p.row_runs[row + 1], p.splits, it.split,
                   &first, &last);
  if (first < last) LoadStage(p, it, sh, StageAt(p, first, last, it.S));
  __pipeline_commit();
  for (int32_t at = first; at < last; at += it.S) {
    const Stage st = StageAt(p, at, last, it.S);
    __pipeline_wait_prior(0);
    __syncthreads();
    WidenStage(p, it, sh, st);
    __syncthreads();
    if (at + it.S < last)
      LoadStage(p, it, sh, StageAt(p, at + it.S, last, it.S));
    __pipeline_commit();
    ComputeStage(p, it, sh, st);
    __syncthreads();
  }
  StoreItem(p, it, sh);
}

// One thread block per token: its position, then its K and V rows.
__global__ void GatherKernel(const GatherParams p) {
  const GatherToken tok = p.tokens[blockIdx.x];
  if (threadIdx.x == 0) {
    *reinterpret_cast<int64_t*>(p.slot + tok.pos_dst) =
        p.positions[tok.pos_src];
  }
  // A token's rows are a few KB: 32-bit index arithmetic.
  const int32_t k_row = static_cast<int32_t>(p.k_row_bytes);
  const int32_t k_bytes = static_cast<int32_t>(p.kv_heads) * k_row;
  for (int32_t i = threadIdx.x; i < k_bytes; i += blockDim.x) {
    const int32_t h = i / k_row;
    p.slot[tok.k_dst + i] =
        p.k_base[tok.k_src + h * p.k_head_stride_bytes + (i - h * k_row)];
  }
  const int32_t v_row = static_cast<int32_t>(p.v_row_bytes);
  const int32_t v_bytes = static_cast<int32_t>(p.kv_heads) * v_row;
  for (int32_t i = threadIdx.x; i < v_bytes; i += blockDim.x) {
    const int32_t h = i / v_row;
    p.slot[tok.v_dst + i] =
        p.v_base[tok.v_src + h * p.v_head_stride_bytes + (i - h * v_row)];
  }
}

// The query (b, sq, h) of rows [row_begin, ...) with index `local` among
// them, and where its unit states start.
struct TreeQuery {
  int64_t qi;     // index among all queries
  int64_t first;  // state index of unit 0; unit u at first + u * stride
  int64_t stride;
  int64_t units;
};

__device__ TreeQuery TreeQueryOf(const SplitMergeParams& p, int64_t local) {
  TreeQuery t;
  t.stride = p.queries * p.q_heads;
  t.qi = p.row_begin * t.stride + local;
  const int64_t b = t.qi / t.stride;
  t.units = p.unit_base[b + 1] - p.unit_base[b];
  t.first = p.unit_base[b] * t.stride + t.qi % t.stride;
  return t;
}

unsigned BlocksFor(int64_t threads, int per_block) {
  return static_cast<unsigned>((threads + per_block - 1) / per_block);
}

// Loads / stores W adjacent floats (W = 4: one 16-byte access).
template <int W>
__device__ void LoadFloats(const float* from, float (&to)[W]) {
  if constexpr (W == 4) {
    const float4 v = *reinterpret_cast<const float4*>(from);
    to[0] = v.x;
    to[1] = v.y;
    to[2] = v.z;
    to[3] = v.w;
  } else {
    for (int x = 0; x < W; ++x) to[x] = from[x];
  }
}

template <int W>
__device__ void StoreFloats(const float (&from)[W], float* to) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(to) =
        make_float4(from[0], from[1], from[2], from[3]);
  } else {
    for (int x = 0; x < W; ++x) to[x] = from[x];
  }
}

// A tree of W adjacent elements (one merge weight for all W).
template <int W>
using ElementsTree = merge_tree::ElementTree<kmath::kUnitTreeLevels, W>;

// P's first phase (split_merge.h): thread i is elements [W g, W g + W)
// (g = i % (D / W)) of block (i / (D / W)) % tree_blocks of query
// i / (D / W) / tree_blocks -- consecutive threads read consecutive
// elements of one unit state.
template <int W>
__global__ void UnitTreeBlocksKernel(const SplitMergeParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t D = p.head_dim;
  const int64_t groups = D / W;
  const int64_t n = p.rows * p.queries * p.q_heads * p.tree_blocks * groups;
  if (i >= n) return;
  const int64_t d = i % groups * W;
  const int64_t block = (i / groups) % p.tree_blocks;
  const int64_t local = i / groups / p.tree_blocks;
  const TreeQuery q = TreeQueryOf(p, local);
  const int64_t lo = block * p.tree_block;
  const int64_t hi = lo + p.tree_block < q.units ? lo + p.tree_block : q.units;
  ElementsTree<W> tree;
  tree.Reset();
  for (int64_t u = lo; u < hi; ++u) {
    const int64_t state = q.first + u * q.stride;
    if (p.p_state_present[state] == 0) continue;
    float leaf[W];
    LoadFloats<W>(p.p_state_out + state * D + d, leaf);
    tree.Add(u - lo, leaf, p.p_state_lse[state]);
  }
  float out[W];
  float lse = 0.0f;
  tree.Finish(out, &lse);
  const int64_t root = local * p.tree_blocks + block;
  StoreFloats<W>(out, p.tree_out + root * D + d);
  if (d == 0) p.tree_lse[root] = lse;
}

// P's second phase: thread i is elements [W g, W g + W) of query
// i / (D / W); the tree over its blocks' roots.
template <int W>
__global__ void UnitTreeRootsKernel(const SplitMergeParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t D = p.head_dim;
  const int64_t groups = D / W;
  if (i >= p.rows * p.queries * p.q_heads * groups) return;
  const int64_t d = i % groups * W;
  const int64_t local = i / groups;
  ElementsTree<W> tree;
  tree.Reset();
  for (int64_t block = 0; block < p.tree_blocks; ++block) {
    const int64_t root = local * p.tree_blocks + block;
    float leaf[W];
    LoadFloats<W>(p.tree_out + root * D + d, leaf);
    tree.Add(block, leaf, p.tree_lse[root]);
  }
  float out[W];
  float lse = 0.0f;
  tree.Finish(out, &lse);
  const int64_t qi = p.row_begin * p.queries * p.q_heads + local;
  StoreFloats<W>(out, p.p_out + qi * D + d);
  if (d == 0) p.p_lse[qi] = lse;
}

// The two phases with W elements a thread.
template <int W>
absl::Status LaunchUnitTree(const SplitMergeParams& params, int64_t elements,
                            int threads, cudaStream_t stream) {
  const int64_t groups = elements / W;
  UnitTreeBlocksKernel<W>
      <<<BlocksFor(groups * params.tree_blocks, threads), threads, 0, stream>>>(
          params);
  ATTNAUDIT_RETURN_IF_ERROR(LaunchStatus("UnitTreeBlocksKernel"));
  UnitTreeRootsKernel<W>
      <<<BlocksFor(groups, threads), threads, 0, stream>>>(params);
  return LaunchStatus("UnitTreeRootsKernel");
}

// R's split combine (split_merge.h): thread i is element i % D of query
// i / D.
__global__ void ReferenceCombineKernel(const SplitMergeParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t D = p.head_dim;
  if (i >= p.rows * p.queries * p.q_heads * D) return;
  const int64_t d = i % D;
  const int64_t qi = p.row_begin * p.queries * p.q_heads + i / D;
  const int64_t stride = p.r_split_stride;
  double m = 0, l = 0, acc = 0;
  kmath::CombineReferenceSplits(
      p.splits, [&](int64_t s) { return p.r_part_m[s * stride + qi]; },
      [&](int64_t s) { return p.r_part_l[s * stride + qi]; },
      [&](int64_t s) { return p.r_part_acc[(s * stride + qi) * D + d]; }, &m,
      &l, &acc);
  p.r_acc[qi * D + d] = acc;
  if (d == 0) {
    p.r_m[qi] = m;
    p.r_l[qi] = l;
  }
}

}  // namespace

absl::Status LaunchSplitMerge(const SplitMergeParams& params,
                              cudaStream_t stream) {
  const int64_t elements =
      params.rows * params.queries * params.q_heads * params.head_dim;
  if (elements <= 0) return absl::OkStatus();
  constexpr int kMergeThreads = 256;
  if (params.p_out != nullptr) {
    // Four elements a thread share each merge's weights (and 16-byte
    // accesses: the states are 256-byte aligned, rows D floats apart).
    ATTNAUDIT_RETURN_IF_ERROR(
        params.head_dim % 4 == 0
            ? LaunchUnitTree<4>(params, elements, kMergeThreads, stream)
            : LaunchUnitTree<1>(params, elements, kMergeThreads, stream));
  }
  if (params.r_acc != nullptr) {
    ReferenceCombineKernel<<<BlocksFor(elements, kMergeThreads), kMergeThreads,
                             0, stream>>>(params);
    ATTNAUDIT_RETURN_IF_ERROR(LaunchStatus("ReferenceCombineKernel"));
  }
  return absl::OkStatus();
}

absl::Status LaunchGather(const GatherParams& params, cudaStream_t stream) {
  if (params.count <= 0) return absl::OkStatus();
  GatherKernel<<<static_cast<unsigned>(params.count), 128, 0, stream>>>(params);
  return LaunchStatus("GatherKernel");
}

int64_t PassSharedBytes(const PassParams& params) {
  return MakeLayout(params).total;
}

namespace {

bool Fits(const PassParams& params, int64_t bytes) {
  const int64_t need = PassSharedBytes(params);
  return need >= 0 && need <= bytes;
}

}  // namespace

bool FitPassToSharedMemory(PassParams* params, int64_t max_shared,
                           int64_t max_stage_runs) {
  params->runs_per_stage = 1;
  params->head_tiles = 1;
  int64_t qpb = std::max<int64_t>(1, params->queries);
  for (; qpb >= 1; qpb = qpb == 1 ? 0 : (qpb + 1) / 2) {
    params->queries_per_block = qpb;
    if (Fits(*params, max_shared)) break;
  }
  if (qpb < 1) {
    // One query position of the whole group is too much: tile the heads.
    params->queries_per_block = 1;
    const int64_t group = params->q_heads / params->kv_heads;
    int64_t tiles = 2;
    for (; tiles <= group; ++tiles) {
      params->head_tiles = tiles;
      if (Fits(*params, max_shared)) break;
    }
    if (tiles > group) {
      params->head_tiles = 1;
      return false;
    }
    // The fewest tiles of that many heads (no tile left empty).
    params->head_tiles = (group + TileHeads(*params) - 1) / TileHeads(*params);
  }
  // Two blocks on a multiprocessor (its shared memory is the opt-in block
  // limit plus 1 KB, less 1 KB reserved per block): one block's barriers
  // and one-thread steps leave it idle otherwise.
  const int64_t half = max_shared / 2 - 1024;
  int64_t most = std::max<int64_t>(
      1, kPassStageTokens / std::max<int64_t>(1, params->max_run));
  if (max_stage_runs > 0) most = std::min(most, max_stage_runs);
  for (int64_t runs = most; runs > 1; --runs) {
    params->runs_per_stage = runs;
    if (Fits(*params, half)) break;
  }
  if (!Fits(*params, half)) params->runs_per_stage = 1;
  return true;
}

absl::Status LaunchFusedPass(const PassParams& shape, cudaStream_t stream) {
  if (shape.rows <= 0) return absl::OkStatus();
  PassParams params = shape;
  params.layout = MakeLayout(shape);
  const int64_t shared = params.layout.total;
  if (shared < 0) {
    return absl::InvalidArgumentError(
        "cuda: the pass's shared memory overflows");
  }
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      FusedPassKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(shared)));
  // All of L1 that can be shared memory: blocks per SM are bounded by it.
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      FusedPassKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
      cudaSharedmemCarveoutMaxShared));
  const int64_t chunks = (params.queries + params.queries_per_block - 1) /
                         params.queries_per_block;
  const dim3 grid(static_cast<unsigned>(params.rows * params.splits),
                  static_cast<unsigned>(params.kv_heads),
                  static_cast<unsigned>(chunks * params.head_tiles));
  FusedPassKernel<<<grid, kThreads, static_cast<size_t>(shared), stream>>>(
      params);
  return LaunchStatus("FusedPassKernel");
}

}  // namespace cuda_internal
}  // namespace attnaudit
