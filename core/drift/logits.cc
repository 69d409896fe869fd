// Per-target lm_head pass (see logits_internal.h).
// clang-format off: foreach_target.h must come first, before the
// headers it re-includes for every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/drift/logits.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/drift/logits_internal.h"
#include "core/simd/dispatch.h"
#include "core/simd/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

// Rows widened per block: a few hundred KiB of f64, so the block stays in
// L2 while every hidden vector reads it.
constexpr int64_t kBlockRows = 8;

// Norms of rows [0, n) of `rows` (each `hidden` long): sum |w| and the
// sum of the rounded squares w * w, each in virtual-lane order: the bits of
// a dot product with a row of ones (ExactMulAdd(1, x, acc) is acc + x), so
// the sums are accumulated in registers without widened copies.
void RowNorms(const double* rows, int64_t n, int64_t hidden, double* max_l1,
              double* max_l2) {
  const DF64 d;
  constexpr int kVec = VecsPerDot<DF64>();
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(DF64()));
  constexpr int64_t kChunk = kVec * N;
  const int64_t full = hidden / kChunk * kChunk;
  for (int64_t r = 0; r < n; ++r) {
    const double* w = rows + r * hidden;
    VF64 l1_acc[kVec];
    VF64 sq_acc[kVec];
    for (int v = 0; v < kVec; ++v) l1_acc[v] = sq_acc[v] = hn::Zero(d);
    for (int64_t c = 0; c < full; c += kChunk) {
      for (int v = 0; v < kVec; ++v) {
        const VF64 x = hn::LoadU(d, w + c + v * N);
        l1_acc[v] = hn::Add(l1_acc[v], hn::Abs(x));
        sq_acc[v] = hn::Add(sq_acc[v], hn::Mul(x, x));
      }
    }
    double l1 = VirtualLaneSum<kVec>(d, l1_acc);
    double sq = VirtualLaneSum<kVec>(d, sq_acc);
    for (int64_t e = full; e < hidden; ++e) {
      l1 += std::fabs(w[e]);
      sq += w[e] * w[e];
    }
    *max_l1 = std::max(*max_l1, l1);
    *max_l2 = std::max(*max_l2, std::sqrt(sq));
  }
}

void LogitRowsImpl(const void* head, DType dtype, int64_t hidden, int64_t v0,
                   int64_t v1, const double* hiddens, int64_t num_hidden,
                   double* logits, int64_t ld, double* max_l1, double* max_l2) {
  const DF64 d;
  thread_local std::vector<float> row32;
  thread_local std::vector<double> rows64;
  row32.resize(static_cast<size_t>(hidden));
  rows64.resize(static_cast<size_t>(kBlockRows * hidden));
  for (int64_t first = v0; first < v1; first += kBlockRows) {
    const int64_t n = std::min(kBlockRows, v1 - first);
    for (int64_t r = 0; r < n; ++r) {
      double* w = &rows64[r * hidden];
      const int64_t offset = (first + r) * hidden;
      if (dtype == DType::kF64) {
        const double* src = static_cast<const double*>(head) + offset;
        std::copy(src, src + hidden, w);
      } else {
        WidenRow(head, dtype, offset, hidden, row32.data(), nullptr);
        PromoteRows(row32.data(), hidden, w);
      }
    }
    RowNorms(rows64.data(), n, hidden, max_l1, max_l2);
    DotRows(d, hiddens, num_hidden, rows64.data(), hidden, n, hidden,
            logits + first, ld);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {
namespace drift_internal {

ATTNAUDIT_SIMD_EXPORT(LogitRowsImpl);

void LogitRows(const void* head, DType dtype, int64_t hidden, int64_t v0,
               int64_t v1, const double* hiddens, int64_t num_hidden,
               double* logits, int64_t ld, double* max_l1, double* max_l2) {
  ATTNAUDIT_SIMD_DISPATCH(LogitRowsImpl)
  (head, dtype, hidden, v0, v1, hiddens, num_hidden, logits, ld, max_l1,
   max_l2);
}

}  // namespace drift_internal
}  // namespace attnaudit
#endif  // HWY_ONCE
