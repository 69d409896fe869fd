// The per-block math of the replay P and the reference R, host and device:
// the steps the CPU core's fused pass takes for one query row (core/
// attention/attention_pass.cc: UnitState, UpdateReference), one function
// per step, in the CPU's operation order. The GPU kernels (kernels/
// attention_device.inc) run these steps with threads in parallel where the
// CPU runs them in a loop -- only where the order does not change a bit
// (independent scores, weights and output elements); the max and the sum
// of a row run in key order on one thread, as on the CPU.
//
// A unit's state (P, in fp32; R's unit states in fp64), for the visible
// keys vis[0..count) of the unit in ascending order, scores s (Score()d):
//   max   = running MaxStep over s[vis[c]]
//   e_c   = ExpNonPositive(s[vis[c]] - max)
//   total = sum of e_c in order from +0;  lse = max + log(total)
//   out_i = (FMA chain over c of e_c * v[vis[c]][i], from +0) / total
// R's running state per logical block (the fp64 online softmax):
//   m' = MaxStep(m, block max); alpha = exp(m - m') when m is finite and
//   moves (else 1: multiplying by 1 is exact); l = l * alpha, then + e_c in
//   order; acc_i = acc_i * alpha, then the FMA chain over the block's keys.
// UnitState / ReferenceUpdate compose the steps on one thread: the unit
// tests run them on the CPU against the core, bit for bit.
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_KERNELS_MATH_UNIT_STATE_H_
#define ATTNAUDIT_KERNELS_MATH_UNIT_STATE_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"
#include "kernels/math/exp.h"
#include "kernels/math/scalar.h"

namespace attnaudit {
namespace kmath {

// The max of s[key(c)] over c in [0, count), in order. key maps a position
// in the visible list to a token (VisibleMax: vis[c]; a kernel whose list
// is a run of consecutive tokens computes it instead of loading it).
template <typename T, typename Key>
ATTNAUDIT_HOST_DEVICE inline T VisibleMaxOf(const T* s, Key key,
                                            int64_t count) {
  T m = Ops<T>::NegInf();
  for (int64_t c = 0; c < count; ++c) m = MaxStep(m, s[key(c)]);
  return m;
}

template <typename T>
ATTNAUDIT_HOST_DEVICE inline T VisibleMax(const T* s, const int32_t* vis,
                                          int64_t count) {
  return VisibleMaxOf(
      s, [vis](int64_t c) { return vis[c]; }, count);
}

template <typename T>
ATTNAUDIT_HOST_DEVICE inline T Weight(T score, T max) {
  return ExpNonPositive(Ops<T>::Sub(score, max));
}

template <typename T>
ATTNAUDIT_HOST_DEVICE inline T SumInOrder(const T* e, int64_t count, T acc) {
  for (int64_t c = 0; c < count; ++c) acc = Ops<T>::Add(acc, e[c]);
  return acc;
}

// P's (fp32) log is LogPositive, the same bits on the host and the GPU;
// R's unit states (fp64) take the platform's log.
template <typename T>
ATTNAUDIT_HOST_DEVICE inline T UnitLse(T max, T total) {
  if constexpr (sizeof(T) == 4) {
    return Ops<T>::Add(max, LogPositive(total));
  } else {
    return Ops<T>::Add(max, Ops<T>::Log(total));
  }
}

// acc + sum over c of e[c] * v(vis[c]) as one FMA per key, in key order.
// v(t) returns element i of token t's V row, widened to T.
template <typename T, typename Key, typename VElem>
ATTNAUDIT_HOST_DEVICE inline T AccumulateElementOf(const T* e, Key key,
                                                   int64_t count, VElem v,
                                                   T acc) {
  for (int64_t c = 0; c < count; ++c) acc = Ops<T>::Fma(e[c], v(key(c)), acc);
  return acc;
}

template <typename T, typename VElem>
ATTNAUDIT_HOST_DEVICE inline T AccumulateElement(const T* e, const int32_t* vis,
                                                 int64_t count, VElem v,
                                                 T acc) {
  return AccumulateElementOf(
      e, [vis](int64_t c) { return vis[c]; }, count, v, acc);
}

// R's rescale factor when the running max moves from m to m_new.
template <typename T>
ATTNAUDIT_HOST_DEVICE inline T RescaleFactor(T m, T m_new) {
  if (m == Ops<T>::NegInf() || m_new == m) return T(1);
  return Ops<T>::Exp(Ops<T>::Sub(m, m_new));
}

// One unit's state for one query row on one thread. s: the run's scores;
// vis: the unit's visible tokens (count >= 1); v_row(t) points at token
// t's V row (dim elements of type V, widened to T as read); e: count
// scratch values.
template <typename T, typename V, typename VRow>
ATTNAUDIT_HOST_DEVICE inline void UnitState(const T* s, const int32_t* vis,
                                            int64_t count, VRow v_row,
                                            int64_t dim, T* e, T* out, T* lse) {
  const T max = VisibleMax(s, vis, count);
  for (int64_t c = 0; c < count; ++c) e[c] = Weight(s[vis[c]], max);
  const T total = SumInOrder(e, count, T(0));
  *lse = UnitLse(max, total);
  for (int64_t i = 0; i < dim; ++i) {
    const T acc = AccumulateElement(
        e, vis, count,
        [&](int32_t t) {
          return static_cast<T>(static_cast<const V*>(v_row(t))[i]);
        },
        T(0));
    out[i] = Ops<T>::Div(acc, total);
  }
}

// R's online-softmax update of one query row with one block's visible keys
// (count >= 1), on one thread: (m, l, acc[dim]) in place.
template <typename T, typename V, typename VRow>
ATTNAUDIT_HOST_DEVICE inline void ReferenceUpdate(const T* s,
                                                  const int32_t* vis,
                                                  int64_t count, VRow v_row,
                                                  int64_t dim, T* e, T* m, T* l,
                                                  T* acc) {
  const T m_new = MaxStep(*m, VisibleMax(s, vis, count));
  const T alpha = RescaleFactor(*m, m_new);
  *l = Ops<T>::Mul(*l, alpha);
  for (int64_t i = 0; i < dim; ++i) acc[i] = Ops<T>::Mul(acc[i], alpha);
  *m = m_new;
  for (int64_t c = 0; c < count; ++c) e[c] = Weight(s[vis[c]], m_new);
  *l = SumInOrder(e, count, *l);
  for (int64_t i = 0; i < dim; ++i) {
    acc[i] = AccumulateElement(
        e, vis, count,
        [&](int32_t t) {
          return static_cast<T>(static_cast<const V*>(v_row(t))[i]);
        },
        acc[i]);
  }
}

}  // namespace kmath
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_MATH_UNIT_STATE_H_
