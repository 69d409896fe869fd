// Per-unit partial attention states (core/attention/units.h), for the
// context-parallel replays (core/cp) and the diagnosis, which rebuild and
// re-fold P from them instead of re-reading the cache.
//
// A state is (out, lse): out normalised over the unit's visible keys, lse
// their log-sum-exp (natural log, of the scaled and soft-capped scores,
// sinks excluded). A unit none of whose keys a query sees has lse -inf and
// out 0: the merge routine skips it. P states are fp32, exactly those the
// fused pass folds into P; R states are fp64.
//
// UnitStates is a plain value, written by one ComputeAttention call (or
// ComputeRunStates calls on disjoint query rows) and read afterwards.
#ifndef ATTNAUDIT_CORE_ATTENTION_UNIT_STATES_H_
#define ATTNAUDIT_CORE_ATTENTION_UNIT_STATES_H_

#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/attention/attention.h"
#include "core/attention/units.h"

namespace attnaudit {

// std::allocator, except that a resize leaves new elements uninitialised:
// buffers of ~100 MiB that are written in parallel anyway are not first
// filled by one thread.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <typename T>
using StateVector = std::vector<T, DefaultInitAllocator<T>>;

struct UnitStates {
  int64_t queries = 0;   // Sq
  int64_t q_heads = 0;   // Hq
  int64_t head_dim = 0;  // D
  bool has_reference = false;
  // unit_base[b] = units of rows before b; unit_base[B] = all units.
  std::vector<int64_t> unit_base;
  StateVector<float> p_out;   // [state][D]
  StateVector<float> p_lse;   // [state]
  StateVector<double> r_out;  // [state][D], when has_reference
  StateVector<double> r_lse;  // [state]

  // The state of query (b, sq, h) for unit u of row b.
  int64_t Index(int64_t b, int64_t u, int64_t sq, int64_t h) const {
    return ((unit_base[b] + u) * queries + sq) * q_heads + h;
  }
  // Sized for `units` (every state empty: lse -inf, out 0).
  void Reset(const std::vector<std::vector<KvUnit>>& units,
             const SnapshotDims& dims, bool with_reference);
  // Sized for `units`, the states left unwritten: the caller writes every
  // state (ClearRows, then whatever it computes) before any is read.
  void Allocate(const std::vector<std::vector<KvUnit>>& units,
                const SnapshotDims& dims, bool with_reference);
  // Empties the states of row b for query heads [h0, h1): every unit, every
  // query position. Rows and head ranges that do not overlap may be
  // cleared from different threads.
  void ClearRows(int64_t b, int64_t h0, int64_t h1);
};

// K/V rows the unit kernel reads: token t (0 <= t < n) of KV head g is at
// element t * row_stride + g * head_stride of k_data / v_data (which may be
// a page of the pool or a buffer a CP rank received). positions[t] is the
// token's position. units lists the units whose tokens the run holds:
// unit_of[i] is the unit's index in its row's plan, and its tokens are
// [first[i], first[i] + count[i]) of the run.
struct TokenRun {
  const void* k_data = nullptr;
  DType k_dtype = DType::kInvalid;
  int64_t k_row_stride = 0;
  int64_t k_head_stride = 0;
  const void* v_data = nullptr;
  DType v_dtype = DType::kInvalid;
  int64_t v_row_stride = 0;
  int64_t v_head_stride = 0;
  const int64_t* positions = nullptr;
  int64_t n = 0;
  std::vector<int32_t> unit_of, first, count;
  // The row's queries taken as this many positions later for visibility
  // only (their causal and window limits; their rotation is done): the
  // diagnosis's account of an engine that counts a row's keys off by one.
  int64_t query_shift = 0;
};

// Computes the states of the run's units for the query rows of batch row b
// whose KV head lies in [g0, g1) (all Sq, all their query heads) into
// *states (sized by Reset; R states when states->has_reference). K/V of
// pre-RoPE caches must already be rotated, as PrepareAttention does for the
// pool: callers pass prepared.k_data-based runs. Thread-safe for calls that
// write disjoint (b, g) ranges. InvalidArgument when a K/V value of the run
// is not finite.
absl::Status ComputeRunStates(const PreparedAttention& prepared,
                              const TokenRun& run, int64_t b, int64_t g0,
                              int64_t g1, UnitStates* states);

// The final write of R for query head h from its fp64 online-softmax state
// (acc: the un-normalised sum of e^(s_j - m) v_j, D values; m the running
// max, l the running sum): merges the head's sink when there is one,
// normalises and applies the V scale, as the fused pass does. *lse_out is
// the LSE the engine declared (with or without the sink).
void FinishReferenceState(const PreparedAttention& prepared, int64_t h,
                          const double* acc, double m, double l,
                          double* out_final, double* lse_out);

// The final write of P for query head h from its folded state (out, lse
// over keys, in place): merges the head's sink when there is one, applies
// the V scale and rounds to the output dtype, as the fused pass does.
// *lse_out is the LSE the engine declared (with or without the sink).
void FinishReplayState(const PreparedAttention& prepared, int64_t h, float* out,
                       float lse, double* out_final, double* lse_out);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_UNIT_STATES_H_
