#include "tests/unit/sim/naive_oracle.h"

#include <algorithm>
#include <cmath>

#include "core/rope/rope.h"

namespace attnaudit::testing {
namespace {

long double ScaleOf(const Tensor& t, int64_t head) {
  if (!t.present()) return 1.0L;
  return t.num_elements() == 1 ? t.DoubleAt(0) : t.DoubleAt(head);
}

}  // namespace

OracleResult NaiveAttention(const Snapshot& s) {
  const SnapshotDims dm = DimsOf(s);
  const int64_t d = dm.head_dim;
  const int64_t group = dm.q_heads / dm.kv_heads;
  const RopeTable rope = RopeTable::Create(s.rope, d).value();
  const DType q_dtype = s.rope.q_output_dtype != DType::kInvalid
                            ? s.rope.q_output_dtype
                            : s.q.dtype();
  const long double scale = EffectiveScale(s);
  OracleResult r;
  r.out.assign(dm.batch * dm.queries * dm.q_heads * d, 0.0L);
  r.lse.assign(dm.batch * dm.queries * dm.q_heads, 0.0L);
  std::vector<float> q(d);
  for (int64_t b = 0; b < dm.batch; ++b) {
    const int64_t len = s.kv_seq_lens.IntAt(b);
    for (int64_t sq = 0; sq < dm.queries; ++sq) {
      const int64_t qpos = s.query_positions.IntAt(b * dm.queries + sq);
      for (int64_t h = 0; h < dm.q_heads; ++h) {
        const int64_t kvh = h / group;
        const int64_t row = (b * dm.queries + sq) * dm.q_heads + h;
        for (int64_t i = 0; i < d; ++i) q[i] = s.q.FloatAt(row * d + i);
        if (s.rope.q_state == RopeState::kPreRope) rope.Rotate(q.data(), qpos);
        std::vector<long double> scores, weights;
        std::vector<int64_t> rows;  // element offset of each visible key
        for (int64_t i = 0; i < len; ++i) {
          const int64_t page =
              s.block_table.IntAt(b * dm.max_blocks + i / dm.page_size);
          const int64_t slot = page * dm.page_size + i % dm.page_size;
          const int64_t pos = s.slot_positions.IntAt(slot);
          if (pos > qpos) continue;
          if (s.sliding_window > 0 && pos <= qpos - s.sliding_window) continue;
          const int64_t off = (slot * dm.kv_heads + kvh) * d;
          long double dot = 0;
          for (int64_t j = 0; j < d; ++j) {
            const long double qj = RoundToDType(q[j], q_dtype);
            dot += qj * (static_cast<long double>(s.k_pages.FloatAt(off + j)) *
                         ScaleOf(s.k_scale, kvh));
          }
          long double x = dot * scale;
          if (s.logit_softcap > 0) {
            x = s.logit_softcap * std::tanh(x / s.logit_softcap);
          }
          scores.push_back(x);
          rows.push_back(off);
        }
        const long double m = *std::max_element(scores.begin(), scores.end());
        long double sum = 0;
        for (long double x : scores) sum += std::exp(x - m);
        const long double lse = m + std::log(sum);
        long double denom = sum;
        if (s.sinks.present()) denom += std::exp(s.sinks.DoubleAt(h) - m);
        for (size_t k = 0; k < scores.size(); ++k) {
          const long double w = std::exp(scores[k] - m) / denom;
          for (int64_t j = 0; j < d; ++j) {
            r.out[row * d + j] +=
                w * static_cast<long double>(s.v_pages.FloatAt(rows[k] + j)) *
                ScaleOf(s.v_scale, kvh);
          }
        }
        r.lse[row] = lse;
      }
    }
  }
  return r;
}

OracleDistance CompareToOracle(const Snapshot& s, const OracleResult& o) {
  const SnapshotDims dm = DimsOf(s);
  const int64_t d = dm.head_dim;
  const long double eps = DTypeEpsilon(s.engine.out.dtype());
  OracleDistance dist;
  for (int64_t row = 0; row < static_cast<int64_t>(o.lse.size()); ++row) {
    long double head_max = 0;
    for (int64_t j = 0; j < d; ++j) {
      head_max = std::max(head_max, std::fabs(o.out[row * d + j]));
    }
    for (int64_t j = 0; j < d; ++j) {
      const long double ref = o.out[row * d + j];
      const long double tol = eps * std::fabs(ref) + 2e-5L * head_max + 1e-30L;
      const long double err =
          std::fabs(s.engine.out.DoubleAt(row * d + j) - ref);
      // NaN compares false everywhere: make it infinitely far instead.
      const double ratio = std::isnan(err) ? INFINITY : double(err / tol);
      dist.out_ratio = std::max(dist.out_ratio, ratio);
    }
    const long double ref = o.lse[row];
    const long double tol = 2e-5L * std::max<long double>(1, std::fabs(ref));
    const long double err = std::fabs(s.engine.lse.DoubleAt(row) - ref);
    const double ratio = std::isnan(err) ? INFINITY : double(err / tol);
    dist.lse_ratio = std::max(dist.lse_ratio, ratio);
  }
  return dist;
}

}  // namespace attnaudit::testing
