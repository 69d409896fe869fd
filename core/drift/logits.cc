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

// Norms of rows [0, n) of `rows` (each `hidden` long, widened exactly to
// f64 as they are loaded): sum |w| and the sum of the rounded squares
// w * w, each in virtual-lane order: the bits of a dot product with a row
// of ones (ExactMulAdd(1, x, acc) is acc + x), so the sums are accumulated
// in registers without widened copies.
template <typename K>
void RowNorms(const K* rows, int64_t n, int64_t hidden, double* max_l1,
              double* max_l2) {
  const DF64 d;
  constexpr int kVec = VecsPerDot<DF64>();
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(DF64()));
  constexpr int64_t kChunk = kVec * N;
  const int64_t full = hidden / kChunk * kChunk;
  for (int64_t r = 0; r < n; ++r) {
    const K* w = rows + r * hidden;
    VF64 l1_acc[kVec];
    VF64 sq_acc[kVec];
    for (int v = 0; v < kVec; ++v) l1_acc[v] = sq_acc[v] = hn::Zero(d);
    for (int64_t c = 0; c < full; c += kChunk) {
      for (int v = 0; v < kVec; ++v) {
        const VF64 x = LoadAs(d, w + c + v * N);
        l1_acc[v] = hn::Add(l1_acc[v], hn::Abs(x));
        sq_acc[v] = hn::Add(sq_acc[v], hn::Mul(x, x));
      }
    }
    double l1 = VirtualLaneSum<kVec>(d, l1_acc);
    double sq = VirtualLaneSum<kVec>(d, sq_acc);
    for (int64_t e = full; e < hidden; ++e) {
      const double x = ScalarAs<double>(w[e]);
      l1 += std::fabs(x);
      sq += x * x;
    }
    *max_l1 = std::max(*max_l1, l1);
    *max_l2 = std::max(*max_l2, std::sqrt(sq));
  }
}

// The norms of n rows (at most kBlockRows, so they stay in L1/L2 while
// every hidden vector reads them) and their logits, logits[h * ld + t] for
// row t.
template <typename K>
void LogitBlock(const K* rows, int64_t n, int64_t hidden, const double* hiddens,
                int64_t num_hidden, double* logits, int64_t ld, double* max_l1,
                double* max_l2) {
  RowNorms(rows, n, hidden, max_l1, max_l2);
  DotRows(DF64(), hiddens, num_hidden, rows, hidden, n, hidden, logits, ld);
}

// Rows [v0, v1) of an lm_head whose rows LoadAs widens in registers (bf16,
// f32, f64): no widened copy.
template <typename K>
void LogitRowsInPlace(const K* head, int64_t hidden, int64_t v0, int64_t v1,
                      const double* hiddens, int64_t num_hidden, double* logits,
                      int64_t ld, double* max_l1, double* max_l2) {
  for (int64_t first = v0; first < v1; first += kBlockRows) {
    LogitBlock(head + first * hidden, std::min(kBlockRows, v1 - first), hidden,
               hiddens, num_hidden, logits + first, ld, max_l1, max_l2);
  }
}

// The other dtypes (f16, fp8): each block widened to f64 first.
void LogitRowsWidened(const void* head, DType dtype, int64_t hidden, int64_t v0,
                      int64_t v1, const double* hiddens, int64_t num_hidden,
                      double* logits, int64_t ld, double* max_l1,
                      double* max_l2) {
  thread_local std::vector<float> row32;
  thread_local std::vector<double> rows64;
  row32.resize(static_cast<size_t>(hidden));
  rows64.resize(static_cast<size_t>(kBlockRows * hidden));
  for (int64_t first = v0; first < v1; first += kBlockRows) {
    const int64_t n = std::min(kBlockRows, v1 - first);
    for (int64_t r = 0; r < n; ++r) {
      WidenRow(head, dtype, (first + r) * hidden, hidden, row32.data(),
               nullptr);
      PromoteRows(row32.data(), hidden, &rows64[r * hidden]);
    }
    LogitBlock(rows64.data(), n, hidden, hiddens, num_hidden, logits + first,
               ld, max_l1, max_l2);
  }
}

void LogitRowsImpl(const void* head, DType dtype, int64_t hidden, int64_t v0,
                   int64_t v1, const double* hiddens, int64_t num_hidden,
                   double* logits, int64_t ld, double* max_l1, double* max_l2) {
  switch (dtype) {
    case DType::kBF16:
      return LogitRowsInPlace(static_cast<const hwy::bfloat16_t*>(head), hidden,
                              v0, v1, hiddens, num_hidden, logits, ld, max_l1,
                              max_l2);
    case DType::kF32:
      return LogitRowsInPlace(static_cast<const float*>(head), hidden, v0, v1,
                              hiddens, num_hidden, logits, ld, max_l1, max_l2);
    case DType::kF64:
      return LogitRowsInPlace(static_cast<const double*>(head), hidden, v0, v1,
                              hiddens, num_hidden, logits, ld, max_l1, max_l2);
    case DType::kInvalid:
    case DType::kF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      break;
  }
  return LogitRowsWidened(head, dtype, hidden, v0, v1, hiddens, num_hidden,
                          logits, ld, max_l1, max_l2);
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
