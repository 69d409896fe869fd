#include "core/cp/replay/combine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/attention/merge.h"
#include "core/attention/merge_tree.h"
#include "core/common/parallel.h"

namespace attnaudit {
namespace {

constexpr float kNegInfF = -std::numeric_limits<float>::infinity();
constexpr double kNegInfD = -std::numeric_limits<double>::infinity();

CpCombined Sized(const SnapshotDims& d) {
  CpCombined c;
  const int64_t queries = d.batch * d.queries * d.q_heads;
  c.out.assign(static_cast<size_t>(queries * d.head_dim), 0.0);
  c.lse.assign(static_cast<size_t>(queries), 0.0);
  return c;
}

// Runs fn(b, sq, h, query index) for every query, rows in parallel.
template <typename Fn>
void ForEachQuery(const SnapshotDims& d, int threads, Fn&& fn) {
  ParallelFor(d.batch, threads, [&](int64_t b) {
    for (int64_t sq = 0; sq < d.queries; ++sq) {
      for (int64_t h = 0; h < d.q_heads; ++h) {
        fn(b, sq, h, (b * d.queries + sq) * d.q_heads + h);
      }
    }
  });
}

// An empty fp32 state (out 0, lse -inf), the fold's start.
struct Acc {
  std::vector<float> out;
  float lse = kNegInfF;
  void Reset(int64_t d) {
    out.assign(static_cast<size_t>(d), 0.0f);
    lse = kNegInfF;
  }
  void Fold(const UnitStates& st, int64_t i, int64_t d) {
    MergeInto(out.data(), &lse, &st.p_out[i * d], st.p_lse[i], d);
  }
};

}  // namespace

CpCombined CombineDeterministic(const PreparedAttention& p,
                                const UnitStates& st, int threads) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  CpCombined c = Sized(d);
  ForEachQuery(d, threads, [&](int64_t b, int64_t sq, int64_t h, int64_t qi) {
    thread_local merge_tree::MergeTree tree;
    thread_local std::vector<float> root;
    const int64_t units = static_cast<int64_t>(p.units[b].size());
    tree.Reset(D, units);
    for (int64_t u = 0; u < units; ++u) {
      const int64_t i = st.Index(b, u, sq, h);
      tree.Add(u, &st.p_out[i * D], st.p_lse[i]);
    }
    root.resize(static_cast<size_t>(D));
    float lse = 0;
    tree.Finish(root.data(), &lse);
    FinishReplayState(p, h, root.data(), lse, &c.out[qi * D], &c.lse[qi]);
  });
  return c;
}

CpCombined CombineEngineOrder(const PreparedAttention& p,
                              const CpSchedule& schedule, const UnitStates& st,
                              int threads) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t W = schedule.world();
  const CpShards& shards = schedule.shards();
  CpCombined c = Sized(d);
  ForEachQuery(d, threads, [&](int64_t b, int64_t sq, int64_t h, int64_t qi) {
    thread_local Acc acc;
    thread_local std::vector<Acc> partials;
    thread_local std::vector<const float*> outs;
    thread_local std::vector<float> lses;
    if (schedule.strategy() == CpReplayStrategy::kRing) {
      acc.Reset(D);
      schedule.ForEachUnitInRingOrder(b, h / d.group(), [&](int32_t u) {
        acc.Fold(st, st.Index(b, u, sq, h), D);
      });
    } else {
      partials.resize(static_cast<size_t>(W));
      outs.resize(static_cast<size_t>(W));
      lses.resize(static_cast<size_t>(W));
      for (int64_t k = 0; k < W; ++k) {
        Acc& part = partials[static_cast<size_t>(k)];
        part.Reset(D);
        for (int32_t i = shards.unit_begin[b][k];
             i < shards.unit_begin[b][k + 1]; ++i) {
          part.Fold(st, st.Index(b, shards.rank_units[b][i], sq, h), D);
        }
        outs[static_cast<size_t>(k)] = part.out.data();
        lses[static_cast<size_t>(k)] = part.lse;
      }
      acc.Reset(D);
      MergeStates(outs.data(), lses.data(), static_cast<int>(W), D,
                  acc.out.data(), &acc.lse);
    }
    FinishReplayState(p, h, acc.out.data(), acc.lse, &c.out[qi * D],
                      &c.lse[qi]);
  });
  return c;
}

CpRankPartial ReferenceRankPartial(const PreparedAttention& p,
                                   const CpShards& shards, const UnitStates& st,
                                   int64_t rank, int threads) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  CpRankPartial r;
  const int64_t queries = d.batch * d.queries * d.q_heads;
  r.out.assign(static_cast<size_t>(queries * D), 0.0);
  r.lse.assign(static_cast<size_t>(queries), kNegInfD);
  std::vector<int64_t> units_merged(static_cast<size_t>(queries), 0);
  ForEachQuery(d, threads, [&](int64_t b, int64_t sq, int64_t h, int64_t qi) {
    double* out = &r.out[qi * D];
    double lse = kNegInfD;
    int64_t merged = 0;
    for (int32_t i = shards.unit_begin[b][rank];
         i < shards.unit_begin[b][rank + 1]; ++i) {
      const int64_t s = st.Index(b, shards.rank_units[b][i], sq, h);
      if (st.r_lse[s] == kNegInfD) continue;
      MergeIntoReference(out, &lse, &st.r_out[s * D], st.r_lse[s], D);
      ++merged;
    }
    const double vs = p.v_scale[h / d.group()];
    for (int64_t j = 0; j < D; ++j)
      out[j] = lse == kNegInfD ? 0.0 : out[j] * vs;
    r.lse[qi] = lse;
    units_merged[static_cast<size_t>(qi)] = merged;
  });
  for (size_t q = 0; q < units_merged.size(); ++q) {
    r.max_units = std::max(r.max_units, units_merged[q]);
    r.empty_queries += r.lse[q] == kNegInfD;
  }
  for (int64_t b = 0; b < d.batch; ++b) {
    r.max_tokens = std::max(r.max_tokens, shards.tokens[b][rank]);
  }
  return r;
}

CpCombined MergeEnginePartials(const PreparedAttention& p,
                               const Tensor& rank_out, const Tensor& rank_lse,
                               LseBase base, int threads) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t W = rank_lse.shape()[0];
  const int64_t queries = d.batch * d.queries * d.q_heads;
  const int64_t elem = DTypeSize(rank_out.dtype());
  const char* raw = static_cast<const char*>(rank_out.raw());
  CpCombined c = Sized(d);
  ForEachQuery(d, threads, [&](int64_t, int64_t, int64_t h, int64_t qi) {
    thread_local std::vector<float> values;
    thread_local std::vector<const float*> outs;
    thread_local std::vector<float> lses;
    thread_local std::vector<float> merged;
    values.resize(static_cast<size_t>(W * D));
    outs.resize(static_cast<size_t>(W));
    lses.resize(static_cast<size_t>(W));
    merged.resize(static_cast<size_t>(D));
    for (int64_t k = 0; k < W; ++k) {
      const int64_t at = k * queries + qi;
      ConvertToFloat(raw + at * D * elem, rank_out.dtype(), D, &values[k * D]);
      const double lse = rank_lse.DoubleAt(at);
      lses[static_cast<size_t>(k)] =
          static_cast<float>(base == LseBase::k2 ? LseFromBase2(lse) : lse);
      outs[static_cast<size_t>(k)] = &values[k * D];
    }
    float lse = 0;
    MergeStates(outs.data(), lses.data(), static_cast<int>(W), D, merged.data(),
                &lse);
    const float lse_keys = lse;
    if (!p.sinks.empty()) {
      // The sink is one more logit in the denominator, with no value.
      thread_local std::vector<float> zeros;
      zeros.assign(static_cast<size_t>(D), 0.0f);
      MergeInto(merged.data(), &lse, zeros.data(),
                static_cast<float>(p.sinks[h]), D);
    }
    for (int64_t j = 0; j < D; ++j) {
      c.out[qi * D + j] = RoundToDType(merged[j], p.output_dtype);
    }
    c.lse[qi] = p.lse_includes_sinks ? lse : lse_keys;
  });
  return c;
}

}  // namespace attnaudit
