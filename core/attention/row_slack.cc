// BoundRowSlack (row_slack.h): one read of the row's visible keys in fp64.
#include "core/attention/row_slack.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/tensor/dtype.h"

namespace attnaudit {
namespace {

// The row's visible keys: each one's score and shift bound, and their V
// rows (K and V scales applied), in block order.
struct SeenKeys {
  std::vector<double> score, eta;
  std::vector<double> v;  // [keys][D]
  size_t size() const { return score.size(); }
};

SeenKeys ReadRowKeys(const PreparedAttention& p, int64_t b,
                     int64_t query_position, int64_t g, const double* q,
                     const float* gap, double widen) {
  const SnapshotDims& d = p.dims;
  const std::vector<int32_t>& pages = p.layout->block_pages[b];
  const int64_t length = p.layout->seq_lens[b];
  std::vector<double> k(static_cast<size_t>(d.head_dim));
  std::vector<double> v(static_cast<size_t>(d.head_dim));
  SeenKeys keys;
  for (size_t blk = 0; blk < pages.size(); ++blk) {
    const int64_t first = static_cast<int64_t>(blk) * d.page_size;
    const int64_t n = std::min(d.page_size, length - first);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t slot = pages[blk] * d.page_size + t;
      if (!KeyVisible(p, p.snapshot->slot_positions.IntAt(slot),
                      query_position)) {
        continue;
      }
      // The key's own move, or the KV head's worst key's when not kept.
      double eta = 0;
      if (!p.slack_key_score.empty()) {
        eta = p.slack_key_score[slot * d.kv_heads + g];
      } else if (!p.slack_key_head_score.empty()) {
        eta = p.slack_key_head_score[g];
      }
      eta *= widen * p.softmax_scale;
      ConvertToDouble(static_cast<const char*>(p.k_data) +
                          KvSlotOffset(p.k_layout, d, pages[blk], t, g) *
                              DTypeSize(p.k_dtype),
                      p.k_dtype, d.head_dim, k.data());
      ConvertToDouble(static_cast<const char*>(p.v_data) +
                          KvSlotOffset(p.v_layout, d, pages[blk], t, g) *
                              DTypeSize(p.v_dtype),
                      p.v_dtype, d.head_dim, v.data());
      double dot = 0;
      for (int64_t i = 0; i < d.head_dim; ++i) {
        const double ki = k[i] * p.k_scale[g];
        dot += q[i] * ki;
        if (gap != nullptr && gap[i] != 0.0f) {
          eta += p.softmax_scale * gap[i] * std::fabs(ki) * widen;
        }
        keys.v.push_back(v[i] * p.v_scale[g]);
      }
      keys.score.push_back(dot * p.softmax_scale);
      keys.eta.push_back(eta);
    }
  }
  return keys;
}

// Λ for the weights exp(score - lse) of `keys` (a sink, η 0, adds
// nothing): a weight moved by shifts within η_j is at most
// p_j e^{η_j + A}, A = Σ p_j η_j (by Jensen the normaliser falls by at most
// e^{-A}), so |ΔLSE| <= Σ p_j e^{η_j + A} η_j. Exponents are summed before
// exp, so a key of no weight with a large η adds nothing.
double LseSlack(const SeenKeys& keys, double lse) {
  double mean_shift = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    mean_shift += std::exp(keys.score[j] - lse) * keys.eta[j];
  }
  double slack = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    slack +=
        std::exp(keys.score[j] - lse + keys.eta[j] + mean_shift) * keys.eta[j];
  }
  return slack;
}

double LogSumExp(const SeenKeys& keys, const double* sink) {
  double m = sink != nullptr ? *sink : -INFINITY;
  for (double score : keys.score) m = std::max(m, score);
  if (!std::isfinite(m)) return m;
  double sum = sink != nullptr ? std::exp(*sink - m) : 0.0;
  for (double score : keys.score) sum += std::exp(score - m);
  return m + std::log(sum);
}

}  // namespace

RowSlackBound BoundRowSlack(const PreparedAttention& p, int64_t row) {
  RowSlackBound bound;
  const SnapshotDims& d = p.dims;
  if (p.slack_cells.empty() || p.softcap > 0 || row < 0 ||
      row >= d.batch * d.queries * d.q_heads) {
    return bound;
  }
  const int64_t h = row % d.q_heads;
  const int64_t bs = row / d.q_heads;
  const int64_t b = bs / d.queries;
  const int64_t g = h / (d.q_heads / d.kv_heads);
  const double widen = 1.0 + 2.0 * DTypeEpsilon(p.rotation_dtype);
  const float* gap =
      p.slack_q_gap.empty() ? nullptr : &p.slack_q_gap[row * d.head_dim];
  const SeenKeys keys = ReadRowKeys(p, b, p.query_positions[bs], g,
                                    &p.q[row * d.head_dim], gap, widen);
  const double* sink = p.sinks.empty() ? nullptr : &p.sinks[h];
  // Weights over keys and sink (what out is made of), and over the keys
  // alone (an LSE reported without the sink moves with those).
  const double lse_all = LogSumExp(keys, sink);
  const double lse_keys = LogSumExp(keys, nullptr);
  if (!std::isfinite(lse_all)) return bound;
  const double lambda = LseSlack(keys, lse_all);
  const double lambda_keys =
      std::isfinite(lse_keys) ? LseSlack(keys, lse_keys) : 0.0;
  const int64_t D = d.head_dim;
  std::vector<double> out(static_cast<size_t>(D), 0.0);
  for (size_t j = 0; j < keys.size(); ++j) {
    const double w = std::exp(keys.score[j] - lse_all);
    for (int64_t i = 0; i < D; ++i) out[i] += w * keys.v[j * D + i];
  }
  std::vector<double> slack(static_cast<size_t>(D), 0.0);
  for (size_t j = 0; j < keys.size(); ++j) {
    const double w = std::exp(keys.score[j] - lse_all + keys.eta[j] + lambda) *
                     (keys.eta[j] + lambda);
    for (int64_t i = 0; i < D; ++i) {
      slack[i] += w * std::fabs(keys.v[j * D + i] - out[i]);
    }
  }
  if (sink != nullptr) {
    const double w = std::exp(*sink - lse_all + lambda) * lambda;
    for (int64_t i = 0; i < d.head_dim; ++i) slack[i] += w * std::fabs(out[i]);
  }
  bound.bounded = true;
  bound.lse = p.lse_includes_sinks ? lambda : std::max(lambda, lambda_keys);
  bound.out = *std::max_element(slack.begin(), slack.end());
  return bound;
}

RowSlackBound RowSlackCache::Get(int64_t row) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = memo_.find(row);
    if (it != memo_.end()) return it->second;
  }
  // Computed outside the lock: two comparisons asking for one row at once
  // compute the same bound twice, which is harmless.
  const RowSlackBound bound = BoundRowSlack(p_, row);
  std::lock_guard<std::mutex> lock(mu_);
  memo_.emplace(row, bound);
  return bound;
}

}  // namespace attnaudit
