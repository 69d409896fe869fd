// The fused R + P pass (attention_kernels.h states what it computes). The
// arithmetic is kernels/math/ and core/attention/merge_tree.h, in the CPU
// core's operation order; this file maps it onto threads:
//   - scores: a group of V threads (16 for fp32, 8 for fp64: the virtual
//     lanes) per (query row, token); lane l computes its partial, the lane
//     tree runs as xor-shuffles (lane i + lane i^m is the tree's pair, in
//     either operand order: addition commutes exactly), lane 0 adds the
//     tail and applies the scale and soft-cap;
//   - the max and the sum of a row: one thread per row, in key order;
//   - weights and output elements: one thread per element (each an
//     independent FMA chain in key order);
//   - the unit tree (the second step): each (query, element) thread runs
//     its element's tree, computing each pair's weights itself (the same
//     bits on every thread).
// So every thread count and launch shape computes the same bits.
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
constexpr int kStages = 3;  // runs in flight: the one computed + 2 loading
// Resident blocks per multiprocessor the register budget is cut for (the
// compiler's free choice, 122 registers, allowed 2 on an H200).
constexpr int kMinBlocksPerSm = 3;

__host__ __device__ inline int64_t Align16(int64_t x) {
  return (x + 15) / 16 * 16;
}

// Byte offsets of the shared-memory sections of one thread block.
struct Layout {
  int64_t stage_k, stage_v, stage_k_bytes, stage_v_bytes;
  int64_t k32, v32, k64, v64;
  int64_t q32, q64;
  int64_t vis, vcount, ulo, ucnt;
  int64_t s32, e32, s64, e64;
  int64_t u_max, u_sum, u_lse;
  int64_t r_acc, r_m, r_l, r_alpha;
  int64_t ru_max, ru_sum, ru_lse;
  int64_t total;
};

__host__ __device__ inline Layout MakeLayout(const PassParams& p) {
  const int64_t D = p.head_dim;
  const int64_t P = p.max_run;
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t qpb = p.queries_per_block;
  const int64_t rows = group * qpb;
  const bool r64 = p.reference || p.store_r_states;
  const bool p32 = p.store_p_states;
  Layout l{};
  int64_t at = 0;
  auto take = [&at](int64_t bytes) {
    const int64_t here = at;
    at += Align16(bytes);
    return here;
  };
  l.stage_k_bytes = Align16(P * D * kmath::ElemBytes(p.k_dtype));
  l.stage_v_bytes = Align16(P * D * kmath::ElemBytes(p.v_dtype));
  l.stage_k = take(kStages * l.stage_k_bytes);
  l.stage_v = take(kStages * l.stage_v_bytes);
  l.k32 = take(P * D * 4);
  l.v32 = take(P * D * 4);
  l.k64 = take(p.k_dtype == kmath::kElemF64 ? P * D * 8 : 0);
  l.v64 = take(p.v_dtype == kmath::kElemF64 ? P * D * 8 : 0);
  l.q32 = take(p32 ? rows * D * 4 : 0);
  l.q64 = take(r64 ? rows * D * 8 : 0);
  l.vis = take(qpb * P * 4);
  l.vcount = take(qpb * 4);
  l.ulo = take(qpb * 4);
  l.ucnt = take(qpb * 4);
  l.s32 = take(p32 ? rows * P * 4 : 0);
  l.e32 = take(p32 ? rows * P * 4 : 0);
  l.s64 = take(r64 ? rows * P * 8 : 0);
  l.e64 = take(r64 ? rows * P * 8 : 0);
  l.u_max = take(p32 ? rows * 4 : 0);
  l.u_sum = take(p32 ? rows * 4 : 0);
  l.u_lse = take(p32 ? rows * 4 : 0);
  l.r_acc = take(p.reference ? rows * D * 8 : 0);
  l.r_m = take(p.reference ? rows * 8 : 0);
  l.r_l = take(p.reference ? rows * 8 : 0);
  l.r_alpha = take(p.reference ? rows * 8 : 0);
  l.ru_max = take(p.store_r_states ? rows * 8 : 0);
  l.ru_sum = take(p.store_r_states ? rows * 8 : 0);
  l.ru_lse = take(p.store_r_states ? rows * 8 : 0);
  l.total = at;
  return l;
}

// What one thread block works on.
struct Item {
  int64_t b;      // batch row
  int64_t split;  // which of the row's run ranges (split-KV)
  int64_t g;      // KV head
  int64_t sq0;    // first query position
  // Shared-memory extents: 32-bit, so the index arithmetic of the inner
  // loops is 32-bit (a 64-bit divide is a long software routine).
  int32_t qn;     // query positions (<= queries_per_block)
  int32_t group;  // query heads per KV head
  int32_t rows;   // group * qn
  int32_t D;
  int32_t P;
};

struct Shared {
  char* base;
  Layout l;
  template <typename T>
  __device__ T* at(int64_t offset) const {
    return reinterpret_cast<T*>(base + offset);
  }
};

// Starts the asynchronous copy of run `run`'s K and V rows of head g into
// stage `stage` (whole rows, copy_width bytes per copy).
__device__ void LoadRun(const PassParams& p, const Item& it, const Shared& sh,
                        const PassRun& run, int stage) {
  const int ke = kmath::ElemBytes(p.k_dtype);
  const int ve = kmath::ElemBytes(p.v_dtype);
  struct Part {
    const char* src;
    char* dst;
    int64_t row_stride_bytes;
    int64_t row_bytes;
  };
  const Part parts[2] = {{p.k_base + run.k_offset + it.g * p.k_head_stride * ke,
                          sh.base + sh.l.stage_k + stage * sh.l.stage_k_bytes,
                          p.k_row_stride * ke, it.D * ke},
                         {p.v_base + run.v_offset + it.g * p.v_head_stride * ve,
                          sh.base + sh.l.stage_v + stage * sh.l.stage_v_bytes,
                          p.v_row_stride * ve, it.D * ve}};
  const int w = p.copy_width;
  for (const Part& part : parts) {
    const int32_t per_row = part.row_bytes / w;
    const int32_t chunks = run.n * per_row;
    for (int32_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const int32_t t = c / per_row;
      const int32_t off = (c % per_row) * w;
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

// Widens the stage's K and V into k32/v32 (and k64/v64 for f64 pages),
// flagging non-finite values: the pass is the audit's only read of the
// cache, as on the CPU.
__device__ void WidenRun(const PassParams& p, const Item& it, const Shared& sh,
                         int n, int stage) {
  const char* k_raw = sh.base + sh.l.stage_k + stage * sh.l.stage_k_bytes;
  const char* v_raw = sh.base + sh.l.stage_v + stage * sh.l.stage_v_bytes;
  float* k32 = sh.at<float>(sh.l.k32);
  float* v32 = sh.at<float>(sh.l.v32);
  double* k64 = sh.at<double>(sh.l.k64);
  double* v64 = sh.at<double>(sh.l.v64);
  bool bad = false;
  for (int32_t i = threadIdx.x; i < n * it.D; i += blockDim.x) {
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

// Per query position, the ascending list of the run's visible tokens: the
// flags in parallel (their position loads are global), then one thread per
// query position compacts its flags in place, in token order.
__device__ void BuildVisibility(const PassParams& p, const Item& it,
                                const Shared& sh, const PassRun& run) {
  int32_t* vis = sh.at<int32_t>(sh.l.vis);
  int32_t* vcount = sh.at<int32_t>(sh.l.vcount);
  const int32_t n = run.n;
  for (int32_t i = threadIdx.x; i < it.qn * n; i += blockDim.x) {
    const int32_t q = i / n;
    const int32_t t = i - q * n;
    const int64_t qpos = p.query_positions[it.b * p.queries + it.sq0 + q];
    vis[q * it.P + t] = Visible(p, p.positions[run.pos_offset + t], qpos);
  }
  __syncthreads();
  for (int32_t q = threadIdx.x; q < it.qn; q += blockDim.x) {
    int32_t* row = vis + q * it.P;
    int32_t count = 0;
    for (int32_t t = 0; t < n; ++t) {
      if (row[t] != 0) row[count++] = t;
    }
    vcount[q] = count;
  }
}

// Scores of every (row, token) pair in T: a group of V threads per pair
// (the virtual lanes), the lane tree as xor-shuffles. K rows are k_rows
// ([token][D] of type K, widened to T as read).
template <typename T, typename K>
__device__ void Scores(const Item& it, const T* q, const K* k_rows, int n,
                       T scale, T cap, T* s) {
  constexpr int V = kmath::VirtualLanes<T>::kCount;
  const int lane = threadIdx.x % V;
  const int32_t group_id = threadIdx.x / V;
  const int32_t groups = blockDim.x / V;
  const int32_t pairs = it.rows * n;
  for (int32_t base = 0; base < pairs; base += groups) {
    const int32_t pair = base + group_id;
    const bool active = pair < pairs;
    const int32_t r = active ? pair / n : 0;
    const int32_t t = active ? pair % n : 0;
    T part =
        active ? kmath::LanePartial(q + r * it.D, k_rows + t * it.D, it.D, lane)
               : T(0);
    for (int m = V / 2; m >= 1; m /= 2) {
      part = kmath::Ops<T>::Add(part, __shfl_xor_sync(0xffffffffu, part, m));
    }
    if (active && lane == 0) {
      const T dot = kmath::DotTail(q + r * it.D, k_rows + t * it.D, it.D, part);
      s[r * it.P + t] = kmath::Score(dot, scale, cap);
    }
  }
}

// R's online-softmax update for the run (a logical block).
__device__ void UpdateReference(const Item& it, const Shared& sh, bool v_f64) {
  const int32_t* vis = sh.at<int32_t>(sh.l.vis);
  const int32_t* vcount = sh.at<int32_t>(sh.l.vcount);
  const double* s = sh.at<double>(sh.l.s64);
  double* e = sh.at<double>(sh.l.e64);
  double* acc = sh.at<double>(sh.l.r_acc);
  double* m = sh.at<double>(sh.l.r_m);
  double* l = sh.at<double>(sh.l.r_l);
  double* alpha = sh.at<double>(sh.l.r_alpha);
  const float* v32 = sh.at<float>(sh.l.v32);
  const double* v64 = sh.at<double>(sh.l.v64);
  for (int32_t r = threadIdx.x; r < it.rows; r += blockDim.x) {
    const int32_t q = r / it.group;
    if (vcount[q] == 0) continue;
    const double m_new = kmath::MaxStep(
        m[r], kmath::VisibleMax(s + r * it.P, vis + q * it.P, vcount[q]));
    alpha[r] = kmath::RescaleFactor(m[r], m_new);
    m[r] = m_new;
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < it.rows * it.P; i += blockDim.x) {
    const int32_t r = i / it.P;
    const int32_t c = i % it.P;
    const int32_t q = r / it.group;
    if (c < vcount[q]) {
      e[r * it.P + c] = kmath::Weight(s[r * it.P + vis[q * it.P + c]], m[r]);
    }
  }
  __syncthreads();
  for (int32_t r = threadIdx.x; r < it.rows; r += blockDim.x) {
    const int32_t q = r / it.group;
    if (vcount[q] == 0) continue;
    l[r] = kmath::SumInOrder(e + r * it.P, vcount[q],
                             kmath::Ops<double>::Mul(l[r], alpha[r]));
  }
  for (int32_t i = threadIdx.x; i < it.rows * it.D; i += blockDim.x) {
    const int32_t r = i / it.D;
    const int32_t d = i % it.D;
    const int32_t q = r / it.group;
    if (vcount[q] == 0) continue;
    const double start = kmath::Ops<double>::Mul(acc[i], alpha[r]);
    acc[i] = kmath::AccumulateElement(
        e + r * it.P, vis + q * it.P, vcount[q],
        [&](int32_t t) {
          return v_f64 ? v64[t * it.D + d]
                       : static_cast<double>(v32[t * it.D + d]);
        },
        start);
  }
  __syncthreads();
}

// The visible sub-list of unit [first, first + count) for every query
// position: ulo (offset in the position's list) and ucnt.
__device__ void UnitRange(const Item& it, const Shared& sh,
                          const PassUnit& unit) {
  const int32_t* vis = sh.at<int32_t>(sh.l.vis);
  const int32_t* vcount = sh.at<int32_t>(sh.l.vcount);
  int32_t* ulo = sh.at<int32_t>(sh.l.ulo);
  int32_t* ucnt = sh.at<int32_t>(sh.l.ucnt);
  for (int32_t q = threadIdx.x; q < it.qn; q += blockDim.x) {
    int32_t lo = 0;
    while (lo < vcount[q] && vis[q * it.P + lo] < unit.first) ++lo;
    int32_t hi = lo;
    while (hi < vcount[q] && vis[q * it.P + hi] < unit.first + unit.count) {
      ++hi;
    }
    ulo[q] = lo;
    ucnt[q] = hi - lo;
  }
}

// One unit's state for every row whose query position sees some of its
// keys, in T (fp32: P; fp64: R's unit states): steps of kmath::UnitState,
// stored at state row `state_row` ((unit_base[b] + unit) * Sq: add sq,
// times Hq, + h).
template <typename T>
__device__ void UnitStates(const PassParams& p, const Item& it,
                           const Shared& sh, const T* s, T* e, T* umax, T* usum,
                           T* ulse, const float* v32, const double* v64,
                           T* state_out, T* state_lse, int64_t state_row) {
  const int32_t* vis = sh.at<int32_t>(sh.l.vis);
  const int32_t* ulo = sh.at<int32_t>(sh.l.ulo);
  const int32_t* ucnt = sh.at<int32_t>(sh.l.ucnt);
  for (int32_t r = threadIdx.x; r < it.rows; r += blockDim.x) {
    const int32_t q = r / it.group;
    if (ucnt[q] == 0) continue;
    umax[r] = kmath::VisibleMax(s + r * it.P, vis + q * it.P + ulo[q], ucnt[q]);
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < it.rows * it.P; i += blockDim.x) {
    const int32_t r = i / it.P;
    const int32_t c = i % it.P;
    const int32_t q = r / it.group;
    if (c < ucnt[q]) {
      e[i] = kmath::Weight(s[r * it.P + vis[q * it.P + ulo[q] + c]], umax[r]);
    }
  }
  __syncthreads();
  for (int32_t r = threadIdx.x; r < it.rows; r += blockDim.x) {
    const int32_t q = r / it.group;
    if (ucnt[q] == 0) continue;
    usum[r] = kmath::SumInOrder(e + r * it.P, ucnt[q], T(0));
    ulse[r] = kmath::UnitLse(umax[r], usum[r]);
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < it.rows * it.D; i += blockDim.x) {
    const int32_t r = i / it.D;
    const int32_t d = i % it.D;
    const int32_t q = r / it.group;
    if (ucnt[q] == 0) continue;
    const T acc = kmath::AccumulateElement(
        e + r * it.P, vis + q * it.P + ulo[q], ucnt[q],
        [&](int32_t t) {
          if constexpr (sizeof(T) == 8) {
            return v64 != nullptr ? v64[t * it.D + d]
                                  : static_cast<double>(v32[t * it.D + d]);
          } else {
            return v32[t * it.D + d];
          }
        },
        T(0));
    const int64_t h = it.g * it.group + r % it.group;
    const int64_t state = (state_row + it.sq0 + q) * p.q_heads + h;
    state_out[state * it.D + d] = kmath::Ops<T>::Div(acc, usum[r]);
    if (d == 0) {
      state_lse[state] = ulse[r];
      if (sizeof(T) == 4 && p.p_state_present != nullptr) {
        p.p_state_present[state] = 1;
      }
    }
  }
  __syncthreads();
}

// Every unit of the run: P's and, when asked, R's unit states.
__device__ void RunUnits(const PassParams& p, const Item& it, const Shared& sh,
                         const PassRun& run) {
  const bool v_f64 = p.v_dtype == kmath::kElemF64;
  for (int32_t u = run.unit_begin; u < run.unit_end; ++u) {
    const PassUnit unit = p.units[u];
    UnitRange(it, sh, unit);
    __syncthreads();
    const int64_t state_row = p.unit_base != nullptr
                                  ? (p.unit_base[it.b] + unit.index) * p.queries
                                  : 0;
    if (p.store_p_states) {
      UnitStates<float>(p, it, sh, sh.at<float>(sh.l.s32),
                        sh.at<float>(sh.l.e32), sh.at<float>(sh.l.u_max),
                        sh.at<float>(sh.l.u_sum), sh.at<float>(sh.l.u_lse),
                        sh.at<float>(sh.l.v32), nullptr, p.p_state_out,
                        p.p_state_lse, state_row);
    }
    if (p.store_r_states) {
      UnitStates<double>(p, it, sh, sh.at<double>(sh.l.s64),
                         sh.at<double>(sh.l.e64), sh.at<double>(sh.l.ru_max),
                         sh.at<double>(sh.l.ru_sum), sh.at<double>(sh.l.ru_lse),
                         sh.at<float>(sh.l.v32),
                         v_f64 ? sh.at<double>(sh.l.v64) : nullptr,
                         p.r_state_out, p.r_state_lse, state_row);
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
  for (int32_t i = threadIdx.x; i < it.rows * it.D; i += blockDim.x) {
    const int32_t r = i / it.D;
    const int64_t h = it.g * it.group + r % it.group;
    const int64_t qi =
        (it.b * p.queries + it.sq0 + r / it.group) * p.q_heads + h;
    const int32_t d = i % it.D;
    const int64_t ri = it.split * p.r_split_stride + qi;
    if (p.reference) p.r_acc[ri * it.D + d] = sh.at<double>(sh.l.r_acc)[i];
    if (d != 0) continue;
    if (p.reference) {
      p.r_m[ri] = sh.at<double>(sh.l.r_m)[r];
      p.r_l[ri] = sh.at<double>(sh.l.r_l)[r];
    }
  }
}

// Scores, R's update and the units of one run already widened.
__device__ void ComputeRun(const PassParams& p, const Item& it,
                           const Shared& sh, const PassRun& run) {
  BuildVisibility(p, it, sh, run);
  const float* k32 = sh.at<float>(sh.l.k32);
  const bool k_f64 = p.k_dtype == kmath::kElemF64;
  const float cap32 = static_cast<float>(p.softcap);
  if (p.reference || p.store_r_states) {
    const double scale = p.softmax_scale * p.k_scale[it.g];
    if (k_f64) {
      Scores<double>(it, sh.at<double>(sh.l.q64), sh.at<double>(sh.l.k64),
                     run.n, scale, p.softcap, sh.at<double>(sh.l.s64));
    } else {
      Scores<double>(it, sh.at<double>(sh.l.q64), k32, run.n, scale, p.softcap,
                     sh.at<double>(sh.l.s64));
    }
  }
  if (p.store_p_states) {
    const float scale =
        kmath::Ops<float>::Mul(static_cast<float>(p.softmax_scale),
                               static_cast<float>(p.k_scale[it.g]));
    Scores<float>(it, sh.at<float>(sh.l.q32), k32, run.n, scale, cap32,
                  sh.at<float>(sh.l.s32));
  }
  __syncthreads();
  if (p.reference) UpdateReference(it, sh, p.v_dtype == kmath::kElemF64);
  RunUnits(p, it, sh, run);
}

__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    FusedPassKernel(const PassParams p) {
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
  const Shared sh{smem, MakeLayout(p)};
  InitItem(p, it, sh);
  int32_t first = 0;
  int32_t last = 0;
  kmath::SplitRuns(p.row_runs[row], p.row_runs[row + 1], p.splits, it.split,
                   &first, &last);
  // Prologue: the first kStages - 1 runs start loading.
  for (int s = 0; s < kStages - 1; ++s) {
    if (first + s < last) LoadRun(p, it, sh, p.runs[first + s], s);
    __pipeline_commit();
  }
  for (int32_t i = first; i < last; ++i) {
    __pipeline_wait_prior(kStages - 2);
    __syncthreads();
    const int32_t ahead = i + kStages - 1;
    if (ahead < last) {
      LoadRun(p, it, sh, p.runs[ahead], (ahead - first) % kStages);
    }
    __pipeline_commit();
    const PassRun run = p.runs[i];
    WidenRun(p, it, sh, run.n, (i - first) % kStages);
    __syncthreads();
    ComputeRun(p, it, sh, run);
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

bool FitPassToSharedMemory(PassParams* params, int64_t max_shared) {
  int64_t qpb = std::max<int64_t>(1, params->queries);
  for (; qpb >= 1; qpb = qpb == 1 ? 0 : (qpb + 1) / 2) {
    params->queries_per_block = qpb;
    if (PassSharedBytes(*params) <= max_shared) return true;
  }
  params->queries_per_block = 1;
  return false;
}

absl::Status LaunchFusedPass(const PassParams& params, cudaStream_t stream) {
  if (params.rows <= 0) return absl::OkStatus();
  const int64_t shared = PassSharedBytes(params);
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
