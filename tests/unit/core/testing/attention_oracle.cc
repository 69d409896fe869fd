#include "tests/unit/core/testing/attention_oracle.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/tensor/dtype.h"

namespace attnaudit {
namespace testing {
namespace {

constexpr long double kNegInf = -__builtin_infl();

bool Visible(const LogicalCase& c, int64_t key_pos, int64_t query_pos) {
  if (key_pos > query_pos) return false;
  if (c.sliding_window <= 0) return true;
  const int64_t w = c.sliding_window;
  // HF: t - W < pos (W keys); flash left window: t - W <= pos (W + 1 keys).
  return c.window_convention == SlidingWindowConvention::kHuggingFace
             ? query_pos - w < key_pos
             : query_pos - w <= key_pos;
}

long double ScaleOf(const std::vector<float>& scales, int64_t g) {
  if (scales.empty()) return 1.0L;
  return scales.size() == 1 ? scales[0] : scales[g];
}

}  // namespace

OracleResult OracleAttention(const LogicalCase& c) {
  if (c.rope.q_state != RopeState::kPostRope ||
      c.rope.k_state != RopeState::kPostRope) {
    std::fprintf(stderr, "OracleAttention: the case must be post-RoPE\n");
    std::abort();
  }
  const int64_t B = c.batch, Sq = c.queries, Hq = c.q_heads, Hkv = c.kv_heads,
                D = c.head_dim, group = Hq / Hkv;
  const long double scale = c.EffectiveScale();
  OracleResult r;
  r.out.assign(static_cast<size_t>(B * Sq * Hq * D), 0.0L);
  r.lse_keys.assign(static_cast<size_t>(B * Sq * Hq), 0.0L);
  r.lse_with_sinks = r.lse_keys;
  r.lse_declared = r.lse_keys;
  r.visible.assign(static_cast<size_t>(B * Sq), 0);
  std::vector<long double> scores;
  std::vector<int64_t> keys;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = c.SeqLen(b);
    for (int64_t s = 0; s < Sq; ++s) {
      const int64_t t = c.query_positions[b * Sq + s];
      keys.clear();
      for (int64_t j = 0; j < L; ++j) {
        if (Visible(c, c.positions[b][j], t)) keys.push_back(j);
      }
      r.visible[b * Sq + s] = static_cast<int64_t>(keys.size());
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t g = h / group;
        const long double ks = ScaleOf(c.k_scale, g);
        const long double vs = ScaleOf(c.v_scale, g);
        const double* q = &c.q[((b * Sq + s) * Hq + h) * D];
        scores.clear();
        long double m = kNegInf;
        for (int64_t j : keys) {
          const double* k = &c.k[b][(j * Hkv + g) * D];
          long double dot = 0, terms = 0;
          for (int64_t i = 0; i < D; ++i) {
            dot += static_cast<long double>(q[i]) * k[i];
            terms += std::fabs(static_cast<long double>(q[i]) * k[i]);
          }
          long double score = scale * ks * dot;
          r.max_abs_score_terms =
              std::max(r.max_abs_score_terms, scale * std::fabs(ks) * terms);
          if (c.softcap > 0) {
            const long double cap = c.softcap;
            score = cap * std::tanh(score / cap);
          }
          scores.push_back(score);
          m = std::max(m, score);
        }
        const bool sink = !c.sinks.empty();
        const long double sink_logit = sink ? c.sinks[h] : kNegInf;
        const long double mm = std::max(m, sink_logit);
        long double keys_sum = 0;  // sum exp(s_j - mm)
        long double* out = &r.out[((b * Sq + s) * Hq + h) * D];
        for (size_t n = 0; n < keys.size(); ++n) {
          const long double w = std::exp(scores[n] - mm);
          keys_sum += w;
          const double* v = &c.v[b][(keys[n] * Hkv + g) * D];
          for (int64_t i = 0; i < D; ++i) out[i] += w * v[i];
          for (int64_t i = 0; i < D; ++i) {
            r.max_abs_v = std::max(r.max_abs_v, std::fabs(v[i] * vs));
          }
        }
        const long double total =
            keys_sum + (sink ? std::exp(sink_logit - mm) : 0.0L);
        for (int64_t i = 0; i < D; ++i) {
          out[i] = out[i] / total * vs;
          r.max_abs_out = std::max(r.max_abs_out, std::fabs(out[i]));
        }
        const int64_t li = (b * Sq + s) * Hq + h;
        r.lse_keys[li] = mm + std::log(keys_sum);
        r.lse_with_sinks[li] = mm + std::log(total);
        r.lse_declared[li] = sink && c.lse_includes_sinks ? r.lse_with_sinks[li]
                                                          : r.lse_keys[li];
        r.max_abs_lse = std::max({r.max_abs_lse, std::fabs(r.lse_keys[li]),
                                  std::fabs(r.lse_with_sinks[li])});
      }
    }
  }
  return r;
}

std::vector<std::vector<std::vector<int32_t>>> OracleMergeOrders(
    const LogicalCase& c, int64_t page_size) {
  std::vector<std::vector<std::vector<int32_t>>> orders(
      static_cast<size_t>(c.batch),
      std::vector<std::vector<int32_t>>(static_cast<size_t>(c.queries)));
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t L = c.SeqLen(b);
    for (int64_t s = 0; s < c.queries; ++s) {
      const int64_t t = c.query_positions[b * c.queries + s];
      for (int64_t first = 0; first < L; first += page_size) {
        bool any = false;
        for (int64_t j = first; j < std::min(L, first + page_size); ++j) {
          any = any || Visible(c, c.positions[b][j], t);
        }
        if (any) {
          orders[b][s].push_back(static_cast<int32_t>(first / page_size));
        }
      }
    }
  }
  return orders;
}

ErrorBound ReferenceBound(const LogicalCase& c, const OracleResult& o) {
  const double u = std::ldexp(1.0, -53);
  const double D = static_cast<double>(c.head_dim);
  const double L = static_cast<double>(c.MaxSeqLen());
  const double S = static_cast<double>(o.max_abs_score_terms);
  const double V = static_cast<double>(o.max_abs_v);
  const double Lm = std::max(1.0, static_cast<double>(o.max_abs_lse));
  const double E = (D + 4) * u * S;
  // R's online softmax rescales by exp(m - m') of exact fp64 scores (one
  // rounding per rescale, at most one per key), and computes lse = m +
  // ln(l) once: no Lm growth with the block count.
  ErrorBound bound;
  bound.out = V * (4 * E + (12 * L + 16) * u);
  bound.lse = E + (L + 8 + 2 * Lm) * u;
  return bound;
}

ErrorBound ReplayBound(const LogicalCase& c, const OracleResult& o,
                       int64_t page_size, int64_t merged_blocks) {
  const double u = std::ldexp(1.0, -24);
  const double D = static_cast<double>(c.head_dim);
  const double P = static_cast<double>(page_size);
  const double k = static_cast<double>(std::max<int64_t>(1, merged_blocks)) +
                   (c.sinks.empty() ? 0.0 : 1.0);  // the sink is a merge
  const double S = static_cast<double>(o.max_abs_score_terms);
  const double V = static_cast<double>(o.max_abs_v);
  const double Lm = std::max(1.0, static_cast<double>(o.max_abs_lse));
  const double E = (D + 4) * u * S;
  ErrorBound bound;
  bound.out = V * (4 * E + (2 * P + 8 * k + 16 + 4 * k * Lm) * u);
  bound.lse = E + (P + 4 * k + 8 + 2 * k * Lm) * u;
  return bound;
}

double HalfUlp(double x, DType dtype) {
  const double eps = DTypeEpsilon(dtype);
  // ulp(x) <= eps * |x| for normal x; f16 subnormals have ulp 2^-24.
  const double floor = dtype == DType::kF16 ? std::ldexp(1.0, -25) : 0.0;
  return std::max(0.5 * eps * std::fabs(x), floor);
}

}  // namespace testing
}  // namespace attnaudit
