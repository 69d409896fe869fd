// BoundRowSlack (row_slack.h): one read of the row's visible keys in fp64.
#include "core/attention/row_slack.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/tensor/dtype.h"

namespace attnaudit {
namespace {

// A visible key of the row: its score, its shift bound and its V.
struct SeenKey {
  double score;
  double eta;
  std::vector<double> v;
};

// The row's visible keys (K and V scales applied) in block order.
std::vector<SeenKey> ReadRowKeys(const PreparedAttention& p, int64_t b,
                                 int64_t query_position, int64_t g,
                                 const double* q, const float* gap,
                                 double widen) {
  const SnapshotDims& d = p.dims;
  const std::vector<int32_t>& pages = p.layout->block_pages[b];
  const int64_t length = p.layout->seq_lens[b];
  std::vector<double> k(static_cast<size_t>(d.head_dim));
  std::vector<SeenKey> keys;
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
      double own_key = 0;
      if (!p.slack_key_score.empty()) {
        own_key = p.slack_key_score[slot * d.kv_heads + g];
      } else if (!p.slack_key_head_score.empty()) {
        own_key = p.slack_key_head_score[g];
      }
      SeenKey key{0.0, own_key * widen * p.softmax_scale,
                  std::vector<double>(d.head_dim)};
      ConvertToDouble(static_cast<const char*>(p.k_data) +
                          KvSlotOffset(p.k_layout, d, pages[blk], t, g) *
                              DTypeSize(p.k_dtype),
                      p.k_dtype, d.head_dim, k.data());
      ConvertToDouble(static_cast<const char*>(p.v_data) +
                          KvSlotOffset(p.v_layout, d, pages[blk], t, g) *
                              DTypeSize(p.v_dtype),
                      p.v_dtype, d.head_dim, key.v.data());
      double dot = 0;
      for (int64_t i = 0; i < d.head_dim; ++i) {
        const double ki = k[i] * p.k_scale[g];
        dot += q[i] * ki;
        if (gap != nullptr && gap[i] != 0.0f) {
          key.eta += p.softmax_scale * gap[i] * std::fabs(ki) * widen;
        }
        key.v[i] *= p.v_scale[g];
      }
      key.score = dot * p.softmax_scale;
      keys.push_back(std::move(key));
    }
  }
  return keys;
}

// Λ for the weights exp(score - lse) of `keys` (a sink, η 0, adds
// nothing): a weight moved by shifts within η_j is at most
// p_j e^{η_j + A}, A = Σ p_j η_j (by Jensen the normaliser falls by at most
// e^{-A}), so |ΔLSE| <= Σ p_j e^{η_j + A} η_j. Exponents are summed before
// exp, so a key of no weight with a large η adds nothing.
double LseSlack(const std::vector<SeenKey>& keys, double lse) {
  double mean_shift = 0;
  for (const SeenKey& key : keys) {
    mean_shift += std::exp(key.score - lse) * key.eta;
  }
  double slack = 0;
  for (const SeenKey& key : keys) {
    slack += std::exp(key.score - lse + key.eta + mean_shift) * key.eta;
  }
  return slack;
}

double LogSumExp(const std::vector<SeenKey>& keys, const double* sink) {
  double m = sink != nullptr ? *sink : -INFINITY;
  for (const SeenKey& key : keys) m = std::max(m, key.score);
  if (!std::isfinite(m)) return m;
  double sum = sink != nullptr ? std::exp(*sink - m) : 0.0;
  for (const SeenKey& key : keys) sum += std::exp(key.score - m);
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
  const std::vector<SeenKey> keys = ReadRowKeys(
      p, b, p.query_positions[bs], g, &p.q[row * d.head_dim], gap, widen);
  const double* sink = p.sinks.empty() ? nullptr : &p.sinks[h];
  // Weights over keys and sink (what out is made of), and over the keys
  // alone (an LSE reported without the sink moves with those).
  const double lse_all = LogSumExp(keys, sink);
  const double lse_keys = LogSumExp(keys, nullptr);
  if (!std::isfinite(lse_all)) return bound;
  const double lambda = LseSlack(keys, lse_all);
  const double lambda_keys =
      std::isfinite(lse_keys) ? LseSlack(keys, lse_keys) : 0.0;
  std::vector<double> out(static_cast<size_t>(d.head_dim), 0.0);
  for (const SeenKey& key : keys) {
    const double w = std::exp(key.score - lse_all);
    for (int64_t i = 0; i < d.head_dim; ++i) out[i] += w * key.v[i];
  }
  std::vector<double> slack(static_cast<size_t>(d.head_dim), 0.0);
  for (const SeenKey& key : keys) {
    const double w =
        std::exp(key.score - lse_all + key.eta + lambda) * (key.eta + lambda);
    for (int64_t i = 0; i < d.head_dim; ++i) {
      slack[i] += w * std::fabs(key.v[i] - out[i]);
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
