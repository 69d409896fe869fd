// Selected-token log-probs through a (synthetic) lm_head, and the RL
// frameworks' agreement metrics. Declared in drift.h; definitions in
// docs/NUMERICS.md ("Log-prob agreement").
#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/drift/drift.h"

namespace attnaudit {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Dot product in fp64 in a fixed order (deterministic for a build): four
// independent accumulators, or explicit AVX-512 where available, because
// GCC will not vectorise a floating reduction by itself.
double Dot(const double* a, const double* b, int64_t n) {
  int64_t i = 0;
  double sum = 0;
#if defined(__AVX512F__)
  __m512d acc0 = _mm512_setzero_pd();
  __m512d acc1 = _mm512_setzero_pd();
  for (; i + 16 <= n; i += 16) {
    acc0 =
        _mm512_fmadd_pd(_mm512_loadu_pd(a + i), _mm512_loadu_pd(b + i), acc0);
    acc1 = _mm512_fmadd_pd(_mm512_loadu_pd(a + i + 8),
                           _mm512_loadu_pd(b + i + 8), acc1);
  }
  sum = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
#else
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (; i + 4 <= n; i += 4) {
    s0 = std::fma(a[i], b[i], s0);
    s1 = std::fma(a[i + 1], b[i + 1], s1);
    s2 = std::fma(a[i + 2], b[i + 2], s2);
    s3 = std::fma(a[i + 3], b[i + 3], s3);
  }
  sum = (s0 + s1) + (s2 + s3);
#endif
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

double K3Term(double x) {
  if (std::fabs(x) < 1e-4) {
    // x^2/2 + x^3/6 + x^4/24; the next term is below 1e-20 relative.
    return x * x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0)));
  }
  return std::expm1(x) - x;
}

// log_softmax(z / temperature)[id], max-shifted; NaN when any logit is not
// finite, so an engine NaN/Inf in out stays visible.
double SelectedLogSoftmax(double* z, int64_t vocab, int64_t id,
                          double temperature) {
  double max_z = -std::numeric_limits<double>::infinity();
  bool finite = true;
  for (int64_t v = 0; v < vocab; ++v) {
    z[v] /= temperature;
    finite = finite && std::isfinite(z[v]);
    max_z = std::max(max_z, z[v]);
  }
  if (!finite) return kNaN;
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(z[v] - max_z);
  return (z[id] - max_z) - std::log(sum);
}

// The shapes SelectedLogprobs works with, once its inputs are checked.
struct LogprobShape {
  int64_t batch = 0;
  int64_t queries = 0;
  int64_t hidden = 0;  // Hq * D
  int64_t vocab = 0;
};

absl::StatusOr<LogprobShape> CheckLogprobInputs(const DenseView& out,
                                                const Tensor& lm_head,
                                                const Tensor& token_ids,
                                                double temperature) {
  if (out.shape.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("out: expected [B,Sq,Hq,D], got rank ", out.shape.size()));
  }
  int64_t out_n = 0;
  if (!CheckedNumElements(out.shape, &out_n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "out: shape [", absl::StrJoin(out.shape, ","), "] is invalid"));
  }
  if (out_n > 0 && out.values == nullptr) {
    return absl::InvalidArgumentError("out: values are null");
  }
  LogprobShape shape;
  shape.batch = out.shape[0];
  shape.queries = out.shape[1];
  shape.hidden = out.shape[2] * out.shape[3];
  if (!lm_head.present() || !IsFloating(lm_head.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lm_head: expected a floating tensor, got ", lm_head.DebugString()));
  }
  absl::Status status =
      lm_head.CheckLayout("lm_head", std::numeric_limits<int64_t>::max());
  if (!status.ok()) return status;
  if (shape.hidden < 1 || lm_head.rank() != 2 ||
      lm_head.dim(1) != shape.hidden || lm_head.dim(0) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lm_head: expected [V>=1, Hq*D=", shape.hidden, "], got ",
                     lm_head.DebugString()));
  }
  shape.vocab = lm_head.dim(0);
  if (!token_ids.present() || !IsInteger(token_ids.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("selected_token_ids: expected an i32/i64 tensor, got ",
                     token_ids.DebugString()));
  }
  status = token_ids.CheckLayout("selected_token_ids",
                                 std::numeric_limits<int64_t>::max());
  if (!status.ok()) return status;
  if (token_ids.rank() != 2 || token_ids.dim(0) != shape.batch ||
      token_ids.dim(1) != shape.queries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "selected_token_ids: expected [B=", shape.batch, ", Sq=", shape.queries,
        "], got ", token_ids.DebugString()));
  }
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be finite and > 0, got ", temperature));
  }
  return shape;
}

// The active tokens (flat b * Sq + s) and their ids, every id checked
// against the vocabulary; done before any O(V) allocation.
absl::Status ActiveTokens(const Tensor& token_ids, const uint8_t* active_mask,
                          const LogprobShape& shape,
                          std::vector<int64_t>* active,
                          std::vector<int64_t>* ids) {
  for (int64_t t = 0; t < shape.batch * shape.queries; ++t) {
    if (active_mask != nullptr && active_mask[t] == 0) continue;
    const int64_t id = token_ids.IntAt(t);
    if (id < 0 || id >= shape.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "selected_token_ids[", t / shape.queries, "][", t % shape.queries,
          "]: token id ", id, " is outside [0, ", shape.vocab, ")"));
    }
    active->push_back(t);
    ids->push_back(id);
  }
  return absl::OkStatus();
}

// logits[a][v] for a chunk of active tokens; the pass over lm_head rows
// widens each row once per chunk. The chunk bounds the scratch to
// kMaxLogits doubles (or one token's V when V is larger).
std::vector<double> LogprobsOfActive(const DenseView& out,
                                     const Tensor& lm_head,
                                     const LogprobShape& shape,
                                     const std::vector<int64_t>& active,
                                     const std::vector<int64_t>& ids,
                                     double temperature) {
  constexpr int64_t kMaxLogits = int64_t{1} << 22;
  const int64_t vocab = shape.vocab, hidden = shape.hidden;
  const int64_t num_active = static_cast<int64_t>(active.size());
  const int64_t chunk =
      std::max<int64_t>(1, std::min(num_active, kMaxLogits / vocab));
  std::vector<double> logits(static_cast<size_t>(chunk * vocab));
  std::vector<double> row(static_cast<size_t>(hidden));
  std::vector<float> row_f32(
      lm_head.dtype() == DType::kF64 ? 0 : static_cast<size_t>(hidden));
  const size_t row_bytes =
      static_cast<size_t>(hidden) * DTypeSize(lm_head.dtype());
  const char* head_bytes = static_cast<const char*>(lm_head.raw());

  std::vector<double> result(static_cast<size_t>(shape.batch * shape.queries),
                             0.0);
  for (int64_t first = 0; first < num_active; first += chunk) {
    const int64_t last = std::min(num_active, first + chunk);
    for (int64_t v = 0; v < vocab; ++v) {
      const char* src = head_bytes + static_cast<size_t>(v) * row_bytes;
      if (lm_head.dtype() == DType::kF64) {
        ConvertToDouble(src, DType::kF64, hidden, row.data());
      } else {
        ConvertToFloat(src, lm_head.dtype(), hidden, row_f32.data());
        std::copy(row_f32.begin(), row_f32.end(), row.begin());
      }
      for (int64_t a = first; a < last; ++a) {
        const double* h = out.values + active[a] * hidden;
        logits[(a - first) * vocab + v] = Dot(h, row.data(), hidden);
      }
    }
    for (int64_t a = first; a < last; ++a) {
      result[active[a]] = SelectedLogSoftmax(&logits[(a - first) * vocab],
                                             vocab, ids[a], temperature);
    }
  }
  return result;
}

}  // namespace

absl::StatusOr<std::vector<double>> SelectedLogprobs(const DenseView& out,
                                                     const Tensor& lm_head,
                                                     const Tensor& token_ids,
                                                     const uint8_t* active_mask,
                                                     double temperature) {
  absl::StatusOr<LogprobShape> shape =
      CheckLogprobInputs(out, lm_head, token_ids, temperature);
  if (!shape.ok()) return shape.status();
  std::vector<int64_t> active, ids;
  absl::Status status =
      ActiveTokens(token_ids, active_mask, *shape, &active, &ids);
  if (!status.ok()) return status;
  return LogprobsOfActive(out, lm_head, *shape, active, ids, temperature);
}

LogprobAgreement CompareLogprobs(const DenseView& candidate,
                                 const DenseView& baseline,
                                 const uint8_t* active_mask) {
  LogprobAgreement agreement;
  const int64_t n = candidate.size();
  if (candidate.shape != baseline.shape || n == 0 ||
      candidate.values == nullptr || baseline.values == nullptr) {
    return agreement;
  }
  double sum_abs = 0;
  double sum_diff = 0;
  double sum_k3 = 0;
  double sum_ratio = 0;
  double min_ratio = std::numeric_limits<double>::infinity();
  double max_ratio = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (active_mask != nullptr && active_mask[i] == 0) continue;
    const double diff = candidate.values[i] - baseline.values[i];
    if (!std::isfinite(diff)) continue;  // visible in the DriftStats counts
    ++count;
    const double log_ratio = -diff;  // log r = lp_ref - lp_cand
    const double ratio = std::exp(log_ratio);
    sum_abs += std::fabs(diff);
    agreement.max_abs_diff = std::max(agreement.max_abs_diff, std::fabs(diff));
    sum_diff += diff;
    sum_k3 += K3Term(log_ratio);
    sum_ratio += ratio;
    min_ratio = std::min(min_ratio, ratio);
    max_ratio = std::max(max_ratio, ratio);
  }
  if (count == 0) return agreement;
  const double cnt = static_cast<double>(count);
  agreement.count = count;
  agreement.mean_abs_diff = sum_abs / cnt;
  agreement.k1_kl = sum_diff / cnt;
  agreement.k3_kl = sum_k3 / cnt;
  agreement.ratio_mean = sum_ratio / cnt;
  agreement.ratio_min = min_ratio;
  agreement.ratio_max = max_ratio;
  // Population standard deviation, second pass around the mean (the ratios
  // sit near 1, where the one-pass formula cancels).
  double sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (active_mask != nullptr && active_mask[i] == 0) continue;
    const double diff = candidate.values[i] - baseline.values[i];
    if (!std::isfinite(diff)) continue;
    const double dev = std::exp(-diff) - agreement.ratio_mean;
    sum_sq += dev * dev;
  }
  agreement.ratio_std = std::sqrt(sum_sq / cnt);
  return agreement;
}

}  // namespace attnaudit
