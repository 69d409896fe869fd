// Per-target lm_head pass (see logits_internal.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/drift/logits.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

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

void LogitRowsImpl(const void* head, DType dtype, int64_t hidden, int64_t v0,
                   int64_t v1, const double* hiddens, int64_t num_hidden,
                   double* logits, int64_t ld, double* max_l1,
                   double* max_l2) {
  const DF64 d;
  thread_local std::vector<float> row32;
  thread_local std::vector<double> rows64;
  thread_local std::vector<double> abs64;
  thread_local std::vector<double> ones;
  row32.resize(static_cast<size_t>(hidden));
  rows64.resize(static_cast<size_t>(kBlockRows * hidden));
  abs64.resize(static_cast<size_t>(hidden));
  ones.assign(static_cast<size_t>(hidden), 1.0);
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
      // Norms in the same virtual-lane order: |w| . 1 and w . w.
      for (int64_t i = 0; i < hidden; ++i) abs64[i] = std::fabs(w[i]);
      double l1 = 0;
      double sq = 0;
      DotRows(d, abs64.data(), 1, ones.data(), 1, hidden, &l1, 1);
      DotRows(d, w, 1, w, 1, hidden, &sq, 1);
      *max_l1 = std::max(*max_l1, l1);
      *max_l2 = std::max(*max_l2, std::sqrt(sq));
    }
    DotRows(d, hiddens, num_hidden, rows64.data(), n, hidden, logits + first,
            ld);
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
  ATTNAUDIT_SIMD_DISPATCH(LogitRowsImpl)(head, dtype, hidden, v0, v1, hiddens,
                                      num_hidden, logits, ld, max_l1, max_l2);
}

}  // namespace drift_internal
}  // namespace attnaudit
#endif  // HWY_ONCE
