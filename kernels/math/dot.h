// Dot products in the CPU core's virtual-lane order (core/simd/simd-inl.h,
// docs/NUMERICS.md "One source, every target"), written as the pieces a GPU
// thread group computes: 16 virtual lanes for fp32 (8 for fp64); lane l
// accumulates elements l, l + V, l + 2V, ... of the last full group of V
// with one FMA each, starting from +0; the lanes are summed by the fixed
// tree (lane i with i + V/2, then i + V/4, ... down to lane 0); the
// elements past the last full group are then added in order, one FMA each.
// A GPU runs lane l on thread l of a group of V and the tree as shuffles;
// VirtualDot runs the same pieces on one thread. Either way the bits are
// the CPU's. Pure; thread-safe.
#ifndef ATTNAUDIT_KERNELS_MATH_DOT_H_
#define ATTNAUDIT_KERNELS_MATH_DOT_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"
#include "kernels/math/scalar.h"
#include "kernels/math/tanh.h"

namespace attnaudit {
namespace kmath {

template <typename T>
struct VirtualLanes {
  static constexpr int kCount = sizeof(T) == 4 ? 16 : 8;
};

// Lane `lane` of the dot product of q and k (dim elements; k of type K is
// widened exactly to T as it is read).
template <typename T, typename K>
ATTNAUDIT_HOST_DEVICE inline T LanePartial(const T* q, const K* k, int64_t dim,
                                           int lane) {
  constexpr int V = VirtualLanes<T>::kCount;
  const int64_t full = dim / V * V;
  T acc = T(0);
  for (int64_t d = lane; d < full; d += V) {
    acc = Ops<T>::Fma(q[d], static_cast<T>(k[d]), acc);
  }
  return acc;
}

// LanePartial of `rows` (<= R) query rows, row r at q + r * q_stride,
// against N K rows k[0..N) at once: each q and K element is read and
// widened once for all of them. out[n][r] has LanePartial(q + r *
// q_stride, k[n], dim, lane)'s bits; rows past `rows` stay +0.
template <int R, int N, typename T, typename K>
ATTNAUDIT_HOST_DEVICE inline void LanePartialsOfTokens(const T* q, int q_stride,
                                                       const K* const (&k)[N],
                                                       int dim, int lane,
                                                       int rows,
                                                       T (&out)[N][R]) {
  constexpr int V = VirtualLanes<T>::kCount;
  for (int n = 0; n < N; ++n) {
    for (int r = 0; r < R; ++r) out[n][r] = T(0);
  }
  const int full = dim / V * V;
  for (int d = lane; d < full; d += V) {
    T kd[N];
    for (int n = 0; n < N; ++n) kd[n] = static_cast<T>(k[n][d]);
    for (int r = 0; r < R; ++r) {
      if (r >= rows) continue;
      const T qd = q[r * q_stride + d];
      for (int n = 0; n < N; ++n) out[n][r] = Ops<T>::Fma(qd, kd[n], out[n][r]);
    }
  }
}

// The same for one K row.
template <int R, typename T, typename K>
ATTNAUDIT_HOST_DEVICE inline void LanePartials(const T* q, int q_stride,
                                               const K* k, int dim, int lane,
                                               int rows, T (&out)[R]) {
  const K* const one[1] = {k};
  T both[1][R];
  LanePartialsOfTokens<R, 1>(q, q_stride, one, dim, lane, rows, both);
  for (int r = 0; r < R; ++r) out[r] = both[0][r];
}

// The lane tree of V lanes over N values at once (N a power of two, <= V),
// with fewer exchanges than N trees: at each distance m = V/2, V/4, ...,
// while a lane holds n > 1 values it keeps one half (the upper when bit m
// of its lane is set) and sends the other, adding its partner's half of
// the same values; then single values are added as in LaneTree. Every
// addition pairs the tree's two nodes (lane i and lane i + m of one value),
// so each value gets LaneTree's bits. `exchange(x, m)` returns the partner
// lane's (lane ^ m) x for this step. Returns the index of the value the
// lane holds in vals[0]; lanes with lane % (V / N) == 0 hold each value
// once.
template <int V, int N, typename T, typename Exchange>
ATTNAUDIT_HOST_DEVICE inline int LaneTreeOfValues(int lane, T (&vals)[N],
                                                  Exchange exchange) {
  int n = N;
  int held = 0;
  for (int m = V / 2; m >= 1; m /= 2) {
    if (n > 1) {
      const bool upper = (lane & m) != 0;
      for (int x = 0; x < n / 2; ++x) {
        const T keep = upper ? vals[x + n / 2] : vals[x];
        const T send = upper ? vals[x] : vals[x + n / 2];
        vals[x] = Ops<T>::Add(keep, exchange(send, m));
      }
      if (upper) held += n / 2;
      n /= 2;
    } else {
      vals[0] = Ops<T>::Add(vals[0], exchange(vals[0], m));
    }
  }
  return held;
}

// The lane tree over V partials (overwritten).
template <typename T>
ATTNAUDIT_HOST_DEVICE inline T LaneTree(T* lanes) {
  constexpr int V = VirtualLanes<T>::kCount;
  for (int half = V / 2; half >= 1; half /= 2) {
    for (int i = 0; i < half; ++i)
      lanes[i] = Ops<T>::Add(lanes[i], lanes[i + half]);
  }
  return lanes[0];
}

// The elements past the last full group, added in order to the tree sum.
template <typename T, typename K>
ATTNAUDIT_HOST_DEVICE inline T DotTail(const T* q, const K* k, int64_t dim,
                                       T sum) {
  constexpr int V = VirtualLanes<T>::kCount;
  for (int64_t d = dim / V * V; d < dim; ++d) {
    sum = Ops<T>::Fma(q[d], static_cast<T>(k[d]), sum);
  }
  return sum;
}

// The whole dot product on one thread.
template <typename T, typename K>
ATTNAUDIT_HOST_DEVICE inline T VirtualDot(const T* q, const K* k, int64_t dim) {
  constexpr int V = VirtualLanes<T>::kCount;
  T lanes[V];
  for (int l = 0; l < V; ++l) lanes[l] = LanePartial(q, k, dim, l);
  return DotTail(q, k, dim, LaneTree(lanes));
}

// A score from its dot product: scaled, then soft-capped when cap > 0
// (cap * tanh(x / cap), with the core's tanh: kernels/math/tanh.h), as the
// CPU kernels do in T.
template <typename T>
ATTNAUDIT_HOST_DEVICE inline T Score(T dot, T scale, T cap) {
  T x = Ops<T>::Mul(dot, scale);
  if (cap > 0) x = Ops<T>::Mul(cap, Tanh(Ops<T>::Div(x, cap)));
  return x;
}

}  // namespace kmath
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_MATH_DOT_H_
