// The fused R + P pass (attention_kernels.h states what it computes). The
// arithmetic is kernels/math/ and core/attention/merge_tree.h, in the CPU
// core's operation order; this file maps it onto threads:
//   - a stage holds up to runs_per_stage runs; run j of a stage keeps its
//     tokens at [j * P, j * P + n_j) of the stage's token index (P =
//     max_run), its units are the stage's units [0, stage units), and every
//     phase below runs over all of them at once;
//   - scores: a group of V threads (16 for fp32, 8 for fp64: the virtual
//     lanes) per (query row, token); lane l computes its partial, the lane
//     tree runs as xor-shuffles (lane i + lane i^m is the tree's pair, in
//     either operand order: addition commutes exactly), lane 0 adds the
//     tail and applies the scale and soft-cap;
//   - R's max and sum: one thread per row, its runs in order; a unit's max
//     and sum: one thread per (row, unit), in key order;
//   - weights and output elements: one thread per element (each an
//     independent FMA chain in key order);
//   - the unit tree (the second step): each (query, element) thread runs
//     its element's tree, computing each pair's weights itself (the same
//     bits on every thread).
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

// The shared-memory sections for the params' shape, stage and query chunk.
// -1 in total when it passes 2^31 bytes (never fits).
PassLayout MakeLayout(const PassParams& p) {
  const int64_t D = p.head_dim;
  const int64_t S = p.runs_per_stage;
  const int64_t T = S * p.max_run;  // stage tokens; also its most units
  const int64_t group = p.q_heads / p.kv_heads;
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
  l.units = take(T * static_cast<int64_t>(sizeof(PassUnit)));
  l.ulo = take(qpb * T * 4);
  l.ucnt = take(qpb * T * 4);
  l.s32 = take(p32 ? rows * T * 4 : 0);
  l.e32 = take(p32 ? rows * T * 4 : 0);
  l.s64 = take(r64 ? rows * T * 8 : 0);
  l.e64 = take(r64 ? rows * T * 8 : 0);
  l.u_max = take(p32 ? rows * T * 4 : 0);
  l.u_sum = take(p32 ? rows * T * 4 : 0);
  l.u_lse = take(p32 ? rows * T * 4 : 0);
  l.r_acc = take(p.reference ? rows * D * 8 : 0);
  l.r_m = take(p.reference ? rows * 8 : 0);
  l.r_l = take(p.reference ? rows * 8 : 0);
  l.r_mj = take(p.reference ? rows * S * 8 : 0);
  l.r_alpha = take(p.reference ? rows * S * 8 : 0);
  l.ru_max = take(p.store_r_states ? rows * T * 8 : 0);
  l.ru_sum = take(p.store_r_states ? rows * T * 8 : 0);
  l.ru_lse = take(p.store_r_states ? rows * T * 8 : 0);
  l.total = at < (int64_t{1} << 31) ? static_cast<int32_t>(at) : -1;
  return l;
}

// What one thread block works on. Shared-memory extents are 32-bit, so the
// index arithmetic of the inner loops is 32-bit (a 64-bit divide is a long
// software routine).
struct Item {
  int64_t b;      // batch row
  int64_t split;  // which of the row's run ranges (split-KV)
  int64_t g;      // KV head
  int64_t sq0;    // first query position
  int32_t qn;     // query positions (<= queries_per_block)
  int32_t group;  // query heads per KV head
  int32_t rows;   // group * qn
  int32_t D;
  int32_t P;  // max_run: a stage's token stride per run
  int32_t S;  // runs_per_stage
  int32_t T;  // S * P
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
// j * P).
__device__ void LoadStage(const PassParams& p, const Item& it, const Shared& sh,
                          const Stage& st) {
  const int ke = kmath::ElemBytes(p.k_dtype);
  const int ve = kmath::ElemBytes(p.v_dtype);
  const int w = p.copy_width;
  for (int32_t j = 0; j < st.count; ++j) {
    const PassRun run = p.runs[st.first + j];
    struct Part {
      const char* src;
      char* dst;
      int64_t row_stride_bytes;
      int32_t row_bytes;
    };
    const Part parts[2] = {
        {p.k_base + run.k_offset + it.g * p.k_head_stride * ke,
         sh.base + sh.l.raw_k + j * it.P * it.D * ke, p.k_row_stride * ke,
         it.D * ke},
        {p.v_base + run.v_offset + it.g * p.v_head_stride * ve,
         sh.base + sh.l.raw_v + j * it.P * it.D * ve, p.v_row_stride * ve,
         it.D * ve}};
    for (const Part& part : parts) {
      const int32_t per_row = part.row_bytes / w;
      const int32_t chunks = run.n * per_row;
      for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        const int32_t t = c / per_row;
        const int32_t off = (c - t * per_row) * w;
        const char* src = part.src + t * part.row_stride_bytes + off;
        char* dst = part.dst + t * part.row_bytes + off;
        if (w >= 4) {
          __pipeline_memcpy_async(dst, src, static_cast<size_t>(w));
        } else {
          *dst = *src;  // unaligned rows: plain loads
        }
      }
    }
  }
}

// Widens element i of the raw stage's K and V; true when one is not
// finite.
__device__ bool WidenElement(const PassParams& p, const char* k_raw,
                             const char* v_raw, int32_t i, float* k32,
                             float* v32, double* k64, double* v64) {
  bool bad = false;
  if (p.k_dtype == kmath::kElemF64) {
    const double x = reinterpret_cast<const double*>(k_raw)[i];
    k64[i] = x;
    k32[i] = static_cast<float>(x);
    bad |= !kmath::Ops<double>::IsFinite(x);
  } else {
    k32[i] = kmath::WidenToFloat(k_raw, p.k_dtype, i);
    bad |= !kmath::Ops<float>::IsFinite(k32[i]);
  }
  if (p.v_dtype == kmath::kElemF64) {
    const double x = reinterpret_cast<const double*>(v_raw)[i];
    v64[i] = x;
    v32[i] = static_cast<float>(x);
    bad |= !kmath::Ops<double>::IsFinite(x);
  } else {
    v32[i] = kmath::WidenToFloat(v_raw, p.v_dtype, i);
    bad |= !kmath::Ops<float>::IsFinite(v32[i]);
  }
  return bad;
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

// Widens `elems` elements of one run's rows, 16 raw bytes a thread at a
// time (per = elements in 16 bytes).
__device__ bool WidenRun16(const char* raw, int dtype, int per, int32_t elems,
                           float* out) {
  bool bad = false;
  for (int32_t i = threadIdx.x * per; i < elems; i += blockDim.x * per) {
    const char* piece = raw + (i / per) * 16;
    if (per == 4) {
      bad |= WidenSixteen<4>(piece, dtype, out + i);
    } else if (per == 8) {
      bad |= WidenSixteen<8>(piece, dtype, out + i);
    } else {
      bad |= WidenSixteen<16>(piece, dtype, out + i);
    }
  }
  return bad;
}

// Widens the raw stage into k32/v32 (and k64/v64 for f64 pages), flagging
// non-finite values: the pass is the audit's only read of the cache, as on
// the CPU. Also copies the stage's run lengths and units (with their run's
// slot in `pad`) into shared memory.
__device__ void WidenStage(const PassParams& p, const Item& it,
                           const Shared& sh, const Stage& st) {
  int32_t* run_n = sh.at<int32_t>(sh.l.run_n);
  for (int32_t j = threadIdx.x; j < st.count; j += blockDim.x) {
    run_n[j] = p.runs[st.first + j].n;
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
  for (int32_t j = 0; j < st.count; ++j) {
    const int32_t begin = j * it.P * it.D;
    const int32_t elems = p.runs[st.first + j].n * it.D;
    if (by_sixteen) {
      bad |= WidenRun16(k_raw + begin * ke, p.k_dtype, 16 / ke, elems,
                        k32 + begin);
      bad |= WidenRun16(v_raw + begin * ve, p.v_dtype, 16 / ve, elems,
                        v32 + begin);
      continue;
    }
    for (int32_t i = begin + threadIdx.x; i < begin + elems; i += blockDim.x) {
      bad |= WidenElement(p, k_raw, v_raw, i, k32, v32, k64, v64);
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
// tokens at vis[q * T + j * P]: the flags in parallel (their position loads
// are global), then one thread per (query position, run) compacts its
// flags in place, in token order.
__device__ void BuildVisibility(const PassParams& p, const Item& it,
                                const Shared& sh, const Stage& st) {
  int32_t* vis = sh.at<int32_t>(sh.l.vis);
  int32_t* vcount = sh.at<int32_t>(sh.l.vcount);
  const int32_t* run_n = sh.at<int32_t>(sh.l.run_n);
  const int32_t span = st.count * it.P;
  for (int32_t i = threadIdx.x; i < it.qn * span; i += blockDim.x) {
    const int32_t q = i / span;
    const int32_t tt = i - q * span;
    const int32_t j = tt / it.P;
    const int32_t t = tt - j * it.P;
    bool visible = false;
    if (t < run_n[j]) {
      const int64_t qpos = p.query_positions[it.b * p.queries + it.sq0 + q];
      visible =
          Visible(p, p.positions[p.runs[st.first + j].pos_offset + t], qpos);
    }
    vis[q * it.T + tt] = visible;
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < it.qn * st.count; i += blockDim.x) {
    const int32_t q = i / st.count;
    const int32_t j = i - q * st.count;
    int32_t* row = vis + q * it.T + j * it.P;
    int32_t count = 0;
    for (int32_t t = 0; t < run_n[j]; ++t) {
      if (row[t] != 0) row[count++] = t;
    }
    vcount[q * it.S + j] = count;
  }
}

// Scores of every (row, token) pair of the stage in T: a group of V
// threads (the virtual lanes) per (token, kScoreRows rows), reading the K
// row once for those rows; the lane tree as xor-shuffles. K rows are
// k_rows ([stage token][D] of type K, widened to T as read).
constexpr int kScoreRows = 4;

template <typename T, typename K>
__device__ void Scores(const Item& it, const Shared& sh, const Stage& st,
                       const T* q, const K* k_rows, T scale, T cap, T* s) {
  constexpr int V = kmath::VirtualLanes<T>::kCount;
  const int32_t* run_n = sh.at<int32_t>(sh.l.run_n);
  const int lane = threadIdx.x % V;
  const int32_t group_id = threadIdx.x / V;
  const int32_t groups = blockDim.x / V;
  const int32_t span = st.count * it.P;
  const int32_t chunks = (it.rows + kScoreRows - 1) / kScoreRows;
  const int32_t items = span * chunks;
  for (int32_t base = 0; base < items; base += groups) {
    const int32_t item = base + group_id;
    const int32_t chunk = item < items ? item / span : 0;
    const int32_t tt = item - chunk * span;
    const int32_t j = tt / it.P;
    const bool active = item < items && tt - j * it.P < run_n[j];
    const int32_t r0 = chunk * kScoreRows;
    const int32_t nr = active ? min(kScoreRows, it.rows - r0) : 0;
    T part[kScoreRows];
    // Every lane reaches the shuffles (an idle group adds zeros).
    kmath::LanePartials(q + r0 * it.D, it.D, k_rows + (active ? tt : 0) * it.D,
                        it.D, lane, nr, part);
    for (int m = V / 2; m >= 1; m /= 2) {
#pragma unroll
      for (int r = 0; r < kScoreRows; ++r) {
        part[r] =
            kmath::Ops<T>::Add(part[r], __shfl_xor_sync(0xffffffffu, part[r], m));
      }
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kScoreRows; ++r) {  // constant indices: registers
        if (r >= nr) break;
        const T dot = kmath::DotTail(q + (r0 + r) * it.D, k_rows + tt * it.D,
                                     it.D, part[r]);
        s[(r0 + r) * it.T + tt] = kmath::Score(dot, scale, cap);
      }
    }
  }
}

// R's online-softmax update with the stage's runs, each a logical block,
// in order: per row the running max through the runs (m_j, alpha_j; a run
// with no visible key leaves the state as it is: alpha 1), then the
// weights in parallel, then the sum and every output element through the
// runs in order.
__device__ void UpdateReference(const Item& it, const Shared& sh,
                                const Stage& st, bool v_f64) {
  const int32_t* vis = sh.at<int32_t>(sh.l.vis);
  const int32_t* vcount = sh.at<int32_t>(sh.l.vcount);
  const double* s = sh.at<double>(sh.l.s64);
  double* e = sh.at<double>(sh.l.e64);
  double* acc = sh.at<double>(sh.l.r_acc);
  double* m = sh.at<double>(sh.l.r_m);
  double* l = sh.at<double>(sh.l.r_l);
  double* mj = sh.at<double>(sh.l.r_mj);
  double* alpha = sh.at<double>(sh.l.r_alpha);
  const float* v32 = sh.at<float>(sh.l.v32);
  const double* v64 = sh.at<double>(sh.l.v64);
  for (int32_t r = threadIdx.x; r < it.rows; r += blockDim.x) {
    const int32_t q = r / it.group;
    double running = m[r];
    for (int32_t j = 0; j < st.count; ++j) {
      const int32_t count = vcount[q * it.S + j];
      double a = 1.0;
      if (count > 0) {
        const double m_new = kmath::MaxStep(
            running, kmath::VisibleMax(s + r * it.T + j * it.P,
                                       vis + q * it.T + j * it.P, count));
        a = kmath::RescaleFactor(running, m_new);
        running = m_new;
      }
      mj[r * it.S + j] = running;
      alpha[r * it.S + j] = a;
    }
    m[r] = running;
  }
  __syncthreads();
  const int32_t span = st.count * it.P;
  for (int32_t i = threadIdx.x; i < it.rows * span; i += blockDim.x) {
    const int32_t r = i / span;
    const int32_t tt = i - r * span;
    const int32_t j = tt / it.P;
    const int32_t c = tt - j * it.P;
    const int32_t q = r / it.group;
    if (c < vcount[q * it.S + j]) {
      const int32_t base = j * it.P;
      e[r * it.T + base + c] = kmath::Weight(
          s[r * it.T + base + vis[q * it.T + base + c]], mj[r * it.S + j]);
    }
  }
  __syncthreads();
  for (int32_t r = threadIdx.x; r < it.rows; r += blockDim.x) {
    const int32_t q = r / it.group;
    double sum = l[r];
    for (int32_t j = 0; j < st.count; ++j) {
      const int32_t count = vcount[q * it.S + j];
      if (count == 0) continue;
      sum = kmath::SumInOrder(e + r * it.T + j * it.P, count,
                              kmath::Ops<double>::Mul(sum, alpha[r * it.S + j]));
    }
    l[r] = sum;
  }
  for (int32_t i = threadIdx.x; i < it.rows * it.D; i += blockDim.x) {
    const int32_t r = i / it.D;
    const int32_t d = i - r * it.D;
    const int32_t q = r / it.group;
    double a = acc[i];
    for (int32_t j = 0; j < st.count; ++j) {
      const int32_t count = vcount[q * it.S + j];
      if (count == 0) continue;
      const int32_t base = j * it.P;
      a = kmath::AccumulateElement(
          e + r * it.T + base, vis + q * it.T + base, count,
          [&](int32_t t) {
            const int32_t at = (base + t) * it.D + d;
            return v_f64 ? v64[at] : static_cast<double>(v32[at]);
          },
          kmath::Ops<double>::Mul(a, alpha[r * it.S + j]));
    }
    acc[i] = a;
  }
  __syncthreads();
}

// For every (query position, stage unit k): the unit's visible sub-list of
// its run's list, ulo (offset) and ucnt.
__device__ void UnitRanges(const Item& it, const Shared& sh, const Stage& st) {
  const int32_t* vis = sh.at<int32_t>(sh.l.vis);
  const int32_t* vcount = sh.at<int32_t>(sh.l.vcount);
  const PassUnit* units = sh.at<PassUnit>(sh.l.units);
  int32_t* ulo = sh.at<int32_t>(sh.l.ulo);
  int32_t* ucnt = sh.at<int32_t>(sh.l.ucnt);
  for (int32_t i = threadIdx.x; i < it.qn * st.units; i += blockDim.x) {
    const int32_t q = i / st.units;
    const int32_t k = i - q * st.units;
    const PassUnit unit = units[k];
    const int32_t* list = vis + q * it.T + unit.pad * it.P;
    const int32_t count = vcount[q * it.S + unit.pad];
    int32_t lo = 0;
    while (lo < count && list[lo] < unit.first) ++lo;
    int32_t hi = lo;
    while (hi < count && list[hi] < unit.first + unit.count) ++hi;
    ulo[q * it.T + k] = lo;
    ucnt[q * it.T + k] = hi - lo;
  }
}

// Every stage unit's state for every row whose query position sees some
// of its keys, in T (fp32: P; fp64: R's unit states): steps of
// kmath::UnitState, one thread per (row, unit) for the max and the sum,
// stored at state ((unit_base[b] + unit index) * Sq + sq) * Hq + h.
template <typename T>
__device__ void UnitStates(const PassParams& p, const Item& it,
                           const Shared& sh, const Stage& st, const T* s, T* e,
                           T* umax, T* usum, T* ulse, const float* v32,
                           const double* v64, T* state_out, T* state_lse) {
  const int32_t* vis = sh.at<int32_t>(sh.l.vis);
  const PassUnit* units = sh.at<PassUnit>(sh.l.units);
  const int32_t* ulo = sh.at<int32_t>(sh.l.ulo);
  const int32_t* ucnt = sh.at<int32_t>(sh.l.ucnt);
  const int32_t ru = it.rows * st.units;
  // (row, unit) -> the unit's visible keys: vis[list + c] for c < count,
  // weights at e[r * T + list_base + c].
  for (int32_t i = threadIdx.x; i < ru; i += blockDim.x) {
    const int32_t r = i / st.units;
    const int32_t k = i - r * st.units;
    const int32_t q = r / it.group;
    const int32_t count = ucnt[q * it.T + k];
    if (count == 0) continue;
    const int32_t base = units[k].pad * it.P;
    umax[r * it.T + k] = kmath::VisibleMax(
        s + r * it.T + base, vis + q * it.T + base + ulo[q * it.T + k], count);
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < ru * it.P; i += blockDim.x) {
    const int32_t rk = i / it.P;
    const int32_t c = i - rk * it.P;
    const int32_t r = rk / st.units;
    const int32_t k = rk - r * st.units;
    const int32_t q = r / it.group;
    if (c >= ucnt[q * it.T + k]) continue;
    const int32_t base = units[k].pad * it.P;
    const int32_t lo = ulo[q * it.T + k];
    e[r * it.T + base + lo + c] =
        kmath::Weight(s[r * it.T + base + vis[q * it.T + base + lo + c]],
                      umax[r * it.T + k]);
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < ru; i += blockDim.x) {
    const int32_t r = i / st.units;
    const int32_t k = i - r * st.units;
    const int32_t q = r / it.group;
    const int32_t count = ucnt[q * it.T + k];
    if (count == 0) continue;
    const int32_t base = units[k].pad * it.P + ulo[q * it.T + k];
    usum[r * it.T + k] = kmath::SumInOrder(e + r * it.T + base, count, T(0));
    ulse[r * it.T + k] = kmath::UnitLse(umax[r * it.T + k], usum[r * it.T + k]);
  }
  __syncthreads();
  const int64_t unit_base =
      p.unit_base != nullptr ? p.unit_base[it.b] : int64_t{0};
  // A warp per (row, unit): its output elements are the lanes' FMA chains,
  // four adjacent elements a lane when they are 16-byte aligned (one read
  // of each weight and index for four chains).
  const int32_t warp = threadIdx.x / 32;
  const int32_t lane = threadIdx.x % 32;
  const int32_t warps = blockDim.x / 32;
  const bool by_four = sizeof(T) == 4 && it.D % 4 == 0;
  for (int32_t rk = warp; rk < ru; rk += warps) {
    const int32_t r = rk / st.units;
    const int32_t k = rk - r * st.units;
    const int32_t q = r / it.group;
    const int32_t count = ucnt[q * it.T + k];
    if (count == 0) continue;
    const int32_t run_base = units[k].pad * it.P;
    const int32_t base = run_base + ulo[q * it.T + k];
    const T* ek = e + r * it.T + base;
    const int32_t* vk = vis + q * it.T + base;
    const T total = usum[r * it.T + k];
    const int64_t h = it.g * it.group + r % it.group;
    const int64_t state =
        ((unit_base + units[k].index) * p.queries + it.sq0 + q) * p.q_heads +
        h;
    T* out = state_out + state * it.D;
    if (by_four) {
      for (int32_t d = lane * 4; d < it.D; d += 128) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int32_t c = 0; c < count; ++c) {
          const float w = static_cast<float>(ek[c]);
          const float4 v = *reinterpret_cast<const float4*>(
              v32 + (run_base + vk[c]) * it.D + d);
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
      }
    } else {
      for (int32_t d = lane; d < it.D; d += 32) {
        const T acc = kmath::AccumulateElement(
            ek, vk, count,
            [&](int32_t t) {
              const int32_t at = (run_base + t) * it.D + d;
              if constexpr (sizeof(T) == 8) {
                return v64 != nullptr ? v64[at] : static_cast<double>(v32[at]);
              } else {
                return v32[at];
              }
            },
            T(0));
        out[d] = kmath::Ops<T>::Div(acc, total);
      }
    }
    if (lane == 0) {
      state_lse[state] = ulse[r * it.T + k];
      if (sizeof(T) == 4 && p.p_state_present != nullptr) {
        p.p_state_present[state] = 1;
      }
    }
  }
  __syncthreads();
}

// Every unit of the stage: P's and, when asked, R's unit states.
__device__ void StageUnits(const PassParams& p, const Item& it,
                           const Shared& sh, const Stage& st) {
  UnitRanges(it, sh, st);
  __syncthreads();
  if (p.store_p_states) {
    UnitStates<float>(p, it, sh, st, sh.at<float>(sh.l.s32),
                      sh.at<float>(sh.l.e32), sh.at<float>(sh.l.u_max),
                      sh.at<float>(sh.l.u_sum), sh.at<float>(sh.l.u_lse),
                      sh.at<float>(sh.l.v32), nullptr, p.p_state_out,
                      p.p_state_lse);
  }
  if (p.store_r_states) {
    UnitStates<double>(
        p, it, sh, st, sh.at<double>(sh.l.s64), sh.at<double>(sh.l.e64),
        sh.at<double>(sh.l.ru_max), sh.at<double>(sh.l.ru_sum),
        sh.at<double>(sh.l.ru_lse), sh.at<float>(sh.l.v32),
        p.v_dtype == kmath::kElemF64 ? sh.at<double>(sh.l.v64) : nullptr,
        p.r_state_out, p.r_state_lse);
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
    const int64_t h = it.g * it.group + r % it.group;
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
    const int64_t h = it.g * it.group + r % it.group;
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

// Scores, R's update and the units of one stage already widened.
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
      Scores<double>(it, sh, st, sh.at<double>(sh.l.q64), k32, scale,
                     p.softcap, sh.at<double>(sh.l.s64));
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
  if (p.reference) {
    UpdateReference(it, sh, st, p.v_dtype == kmath::kElemF64);
  }
  StageUnits(p, it, sh, st);
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
  it.sq0 = static_cast<int64_t>(blockIdx.z) * p.queries_per_block;
  it.qn = static_cast<int32_t>(p.queries - it.sq0 < p.queries_per_block
                                   ? p.queries - it.sq0
                                   : p.queries_per_block);
  it.group = static_cast<int32_t>(p.q_heads / p.kv_heads);
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
    if (at + it.S < last) LoadStage(p, it, sh, StageAt(p, at + it.S, last, it.S));
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

// P's first phase (split_merge.h): thread i is element i % D of block
// (i / D) % tree_blocks of query i / D / tree_blocks -- consecutive threads
// read consecutive elements of one unit state.
__global__ void UnitTreeBlocksKernel(const SplitMergeParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t D = p.head_dim;
  const int64_t n = p.rows * p.queries * p.q_heads * p.tree_blocks * D;
  if (i >= n) return;
  const int64_t d = i % D;
  const int64_t block = (i / D) % p.tree_blocks;
  const int64_t local = i / D / p.tree_blocks;
  const TreeQuery q = TreeQueryOf(p, local);
  const int64_t lo = block * p.tree_block;
  const int64_t hi = lo + p.tree_block < q.units ? lo + p.tree_block : q.units;
  kmath::UnitTree tree;
  tree.Reset();
  for (int64_t u = lo; u < hi; ++u) {
    const int64_t state = q.first + u * q.stride;
    if (p.p_state_present[state] == 0) continue;
    tree.Add(u - lo, p.p_state_out[state * D + d], p.p_state_lse[state]);
  }
  float out = 0.0f;
  float lse = 0.0f;
  tree.Finish(&out, &lse);
  const int64_t root = local * p.tree_blocks + block;
  p.tree_out[root * D + d] = out;
  if (d == 0) p.tree_lse[root] = lse;
}

// P's second phase: thread i is element i % D of query i / D; the tree
// over its blocks' roots.
__global__ void UnitTreeRootsKernel(const SplitMergeParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t D = p.head_dim;
  if (i >= p.rows * p.queries * p.q_heads * D) return;
  const int64_t d = i % D;
  const int64_t local = i / D;
  kmath::UnitTree tree;
  tree.Reset();
  for (int64_t block = 0; block < p.tree_blocks; ++block) {
    const int64_t root = local * p.tree_blocks + block;
    tree.Add(block, p.tree_out[root * D + d], p.tree_lse[root]);
  }
  float out = 0.0f;
  float lse = 0.0f;
  tree.Finish(&out, &lse);
  const int64_t qi = p.row_begin * p.queries * p.q_heads + local;
  p.p_out[qi * D + d] = out;
  if (d == 0) p.p_lse[qi] = lse;
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

unsigned BlocksFor(int64_t threads, int per_block) {
  return static_cast<unsigned>((threads + per_block - 1) / per_block);
}

}  // namespace

absl::Status LaunchSplitMerge(const SplitMergeParams& params,
                              cudaStream_t stream) {
  const int64_t elements =
      params.rows * params.queries * params.q_heads * params.head_dim;
  if (elements <= 0) return absl::OkStatus();
  constexpr int kMergeThreads = 256;
  if (params.p_out != nullptr) {
    UnitTreeBlocksKernel<<<BlocksFor(elements * params.tree_blocks,
                                     kMergeThreads),
                           kMergeThreads, 0, stream>>>(params);
    ATTNAUDIT_RETURN_IF_ERROR(LaunchStatus("UnitTreeBlocksKernel"));
    UnitTreeRootsKernel<<<BlocksFor(elements, kMergeThreads), kMergeThreads, 0,
                          stream>>>(params);
    ATTNAUDIT_RETURN_IF_ERROR(LaunchStatus("UnitTreeRootsKernel"));
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
  int64_t qpb = std::max<int64_t>(1, params->queries);
  for (; qpb >= 1; qpb = qpb == 1 ? 0 : (qpb + 1) / 2) {
    params->queries_per_block = qpb;
    if (Fits(*params, max_shared)) break;
  }
  if (qpb < 1) {
    params->queries_per_block = 1;
    return false;
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
    return absl::InvalidArgumentError("cuda: the pass's shared memory overflows");
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
                  static_cast<unsigned>(chunks));
  FusedPassKernel<<<grid, kThreads, static_cast<size_t>(shared), stream>>>(
      params);
  return LaunchStatus("FusedPassKernel");
}

}  // namespace cuda_internal
}  // namespace attnaudit
