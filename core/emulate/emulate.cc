// The emulated engine; docs/NUMERICS.md ("The emulated engine") derives the
// tolerance. Keep the two in step.
#include "core/emulate/emulate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/common/parallel.h"
#include "core/tensor/dtype.h"
#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace {

// The error of one fp32 rounding, relative (the unit roundoff).
const double kUnitF32 = std::ldexp(1.0, -24);
// tanh of a 16-bit tensor is computed in fp32 by a vectorised tanh within
// an ulp (Sleef's u10); two allow any libm.
constexpr double kTanhUlps = 2.0;

bool IsSixteenBit(DType dtype) {
  return IsFloating(dtype) && DTypeSize(dtype) == 2;  // bf16, f16
}

// Narrows to a dtype as the engine does (a float first: what the engine
// narrows is an fp32 value).
struct Narrower {
  DType dtype = DType::kF32;
  bool truncate = false;
  double operator()(double x) const {
    const float f = static_cast<float>(x);
    return truncate ? RoundTowardZeroToDType(f, dtype) : RoundToDType(f, dtype);
  }
};

// A value the engine may hold: its central estimate and the bounds of what
// a correct engine computes (equal unless some rounding is ambiguous).
struct Uncertain {
  double lo, mid, hi;
  bool ambiguous() const { return lo != hi; }
};

// The score chain of one key (docs/NUMERICS.md): dot = q.k exactly, err a
// bound on the engine's fp32 dot product's error. Each step is monotone
// non-decreasing (scale and cap are positive), so pushing the bounds
// through it bounds the result.
struct ScoreChain {
  Narrower narrow;
  float scale = 1.0f;
  float cap = 0.0f;  // 0: no soft-cap
  double Step(double x, int side) const {
    double v = narrow(x);
    v = narrow(static_cast<float>(v) * scale);
    if (cap > 0) {
      v = narrow(static_cast<float>(v) / cap);
      const double t = std::tanh(static_cast<float>(v));
      v = narrow(t + side * kTanhUlps * kEpsF32 * std::fabs(t));
      v = narrow(static_cast<float>(v) * cap);
    }
    return v;
  }
  Uncertain Of(double dot, double err) const {
    return {Step(dot - err, -1), Step(dot, 0), Step(dot + err, 1)};
  }
};

// The visible rows of one (row, KV head): K and V widened to float, and
// each key's position.
struct CellRows {
  std::vector<float> k, v;
  std::vector<int64_t> position;
  int64_t size() const { return static_cast<int64_t>(position.size()); }
};

CellRows LoadCell(const PreparedAttention& p, int64_t b, int64_t g) {
  const SnapshotDims& d = p.dims;
  const Snapshot& snapshot = *p.snapshot;
  const int64_t length = p.layout->seq_lens[b];
  const std::vector<int32_t>& pages = p.layout->block_pages[b];
  int64_t last_query = -1;
  for (int64_t s = 0; s < d.queries; ++s) {
    last_query = std::max(last_query, p.query_positions[b * d.queries + s]);
  }
  CellRows rows;
  std::vector<float> row(static_cast<size_t>(d.head_dim));
  const size_t k_size = DTypeSize(p.k_dtype), v_size = DTypeSize(p.v_dtype);
  for (int64_t token = 0; token < length; ++token) {
    const int64_t page = pages[token / d.page_size];
    const int64_t slot = token % d.page_size;
    const int64_t pos =
        snapshot.slot_positions.IntAt(page * d.page_size + slot);
    if (pos < 0 || pos > last_query) continue;
    rows.position.push_back(pos);
    ConvertToFloat(static_cast<const char*>(p.k_data) +
                       KvSlotOffset(p.k_layout, d, page, slot, g) * k_size,
                   p.k_dtype, d.head_dim, row.data());
    rows.k.insert(rows.k.end(), row.begin(), row.end());
    ConvertToFloat(static_cast<const char*>(p.v_data) +
                       KvSlotOffset(p.v_layout, d, page, slot, g) * v_size,
                   p.v_dtype, d.head_dim, row.data());
    rows.v.insert(rows.v.end(), row.begin(), row.end());
  }
  return rows;
}

// The relative error of the engine's fp32 sums over n terms (its softmax
// normaliser, its P.V accumulation): a blocked or split fold's depth plus a
// random walk over n, the tolerances' own fold terms.
double SumEpsilon(int64_t n, int64_t split_keys) {
  const int64_t split = std::max<int64_t>(1, split_keys);
  return kEpsF32 * (2.0 * static_cast<double>((n + split - 1) / split) + 8.0 +
                    4.0 * std::sqrt(static_cast<double>(n)));
}

// The per-query scratch: the engine's scores, and what its probabilities
// and their ambiguities weigh.
struct QueryScratch {
  std::vector<int64_t> keys;  // indices into the cell's rows
  std::vector<Uncertain> score;
};

struct CellCounts {
  int64_t scores = 0, ambiguous = 0;
};

class Emulator {
 public:
  Emulator(const PreparedAttention& p, const EmulationPlan& plan)
      : p_(p), plan_(plan) {
    chain_.narrow = {plan.score_dtype, plan.score_truncates};
    chain_.scale = static_cast<float>(p.softmax_scale);
    chain_.cap = static_cast<float>(p.softcap);
    probability_ = {plan.probability_dtype, plan.probability_truncates};
    output_ = {plan.output_dtype, plan.output_truncates};
    // The engine's fp32 dot product of D exact products: at most D
    // roundings of the running sum.
    dot_error_ = static_cast<double>(p.dims.head_dim) * kUnitF32;
    // attnaudit's own RoPE, in the dot product's units (before the scale).
    rope_dot_error_ = p.softmax_scale > 0
                          ? plan.rope_score_uncertainty / p.softmax_scale
                          : 0.0;
  }

  // Every query head of the cell's group, every query of the row.
  CellCounts Cell(int64_t b, int64_t g, Emulation* e) const {
    const SnapshotDims& d = p_.dims;
    const CellRows rows = LoadCell(p_, b, g);
    const int64_t group = d.q_heads / d.kv_heads;
    CellCounts counts;
    QueryScratch scratch;
    for (int64_t s = 0; s < d.queries; ++s) {
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        Query(rows, b, s, h, &scratch, &counts, e);
      }
    }
    return counts;
  }

 private:
  // `row_dot_error`: the row's own rotation-boundary uncertainty
  // (PreparedAttention::row_score_uncertainty), in the dot product's units.
  void Scores(const CellRows& rows, const double* q, int64_t qpos,
              double row_dot_error, QueryScratch* sc,
              CellCounts* counts) const {
    const int64_t D = p_.dims.head_dim;
    sc->keys.clear();
    sc->score.clear();
    for (int64_t j = 0; j < rows.size(); ++j) {
      if (!KeyVisible(p_, rows.position[j], qpos)) continue;
      const float* k = &rows.k[j * D];
      double dot = 0, magnitude = 0;
      for (int64_t i = 0; i < D; ++i) {
        const double term = q[i] * static_cast<double>(k[i]);
        dot += term;
        magnitude += std::fabs(term);
      }
      sc->keys.push_back(j);
      sc->score.push_back(chain_.Of(
          dot, dot_error_ * magnitude + rope_dot_error_ + row_dot_error));
      ++counts->scores;
      counts->ambiguous += sc->score.back().ambiguous() ? 1 : 0;
    }
  }

  // GPT-OSS: every logit (and the sink's) minus their max, in the score
  // dtype; returns the sink's centred logit.
  double Center(QueryScratch* sc, double sink) const {
    double m = sink;
    for (const Uncertain& u : sc->score) m = std::max(m, u.mid);
    const Narrower& n = chain_.narrow;
    for (Uncertain& u : sc->score) {
      u = {n(u.lo - m), n(u.mid - m), n(u.hi - m)};
    }
    return n(sink - m);
  }

  void Query(const CellRows& rows, int64_t b, int64_t s, int64_t h,
             QueryScratch* sc, CellCounts* counts, Emulation* e) const {
    const SnapshotDims& d = p_.dims;
    const int64_t D = d.head_dim;
    const int64_t cell = (b * d.queries + s) * d.q_heads + h;
    const double row_dot_error =
        !p_.row_score_uncertainty.empty() && p_.softmax_scale > 0
            ? p_.row_score_uncertainty[cell] / p_.softmax_scale
            : 0.0;
    Scores(rows, &p_.q[cell * D], p_.query_positions[b * d.queries + s],
           row_dot_error, sc, counts);
    const bool has_sink = !p_.sinks.empty();
    double sink =
        has_sink ? p_.sinks[h] : -std::numeric_limits<double>::infinity();
    if (plan_.center_scores) sink = Center(sc, sink);
    // The engine's fp32 softmax of its scores. Its normaliser sums every
    // key's weight, so a score that may have rounded either way moves every
    // probability, not only its own: the normaliser is bounded by the
    // scores' bounds (total_lo, total_hi) as well as estimated from their
    // central values.
    double m = sink;
    for (const Uncertain& u : sc->score) m = std::max(m, u.mid);
    const double sink_weight = has_sink ? std::exp(sink - m) : 0.0;
    double total = sink_weight, total_lo = sink_weight, total_hi = sink_weight;
    for (const Uncertain& u : sc->score) {
      total += std::exp(u.mid - m);
      total_lo += std::exp(u.lo - m);
      total_hi += std::exp(u.hi - m);
    }
    const int64_t n = static_cast<int64_t>(sc->keys.size());
    const double eta =
        plan_.exp_epsilon + 2.0 * kUnitF32 + SumEpsilon(n, plan_.split_keys);
    const double accumulate = SumEpsilon(n, plan_.split_keys);
    std::vector<double> out(D, 0.0), weight(D, 0.0), slack(D, 0.0);
    for (size_t k = 0; k < sc->keys.size(); ++k) {
      const Uncertain& u = sc->score[k];
      const double w_lo = std::exp(u.lo - m), w_mid = std::exp(u.mid - m),
                   w_hi = std::exp(u.hi - m);
      // Softmax is increasing in its own score and decreasing in every
      // other: its extremes are this key at one end of its interval and
      // every other key at the opposite end. A flip of a heavy key's score
      // (e^delta - 1 of its weight) thus moves a large probability of
      // another key by that fraction, enough to carry it across a rounding
      // boundary of the probability dtype: a whole 16-bit ulp of it.
      const Uncertain prob = {w_lo / (w_lo + std::max(0.0, total_hi - w_hi)),
                              w_mid / total,
                              w_hi / (w_hi + std::max(0.0, total_lo - w_lo))};
      const Uncertain pr = Probability(prob, eta);
      const float* v = &rows.v[sc->keys[k] * D];
      for (int64_t i = 0; i < D; ++i) {
        const double vi = v[i];
        out[i] += pr.mid * vi;
        weight[i] += pr.mid * std::fabs(vi);
        // The engine's probability and M's both lie in [lo, hi].
        slack[i] += (pr.hi - pr.lo) * std::fabs(vi);
      }
    }
    double* out_cell = &e->out[cell * D];
    double* tol_cell = &e->tolerance[cell * D];
    for (int64_t i = 0; i < D; ++i) {
      const double scale =
          p_.v_scale.empty() ? 1.0 : p_.v_scale[h * d.kv_heads / d.q_heads];
      const double o = out[i] * scale;
      out_cell[i] = output_(o);
      tol_cell[i] =
          2.0 * OutputUlp(o) +
          2.0 * std::fabs(scale) * (accumulate * weight[i] + slack[i]);
    }
  }

  // The engine's probability in its P.V dtype: exact within the bounds of
  // `prob` (its scores'), within eta relative in fp32, then narrowed; kept
  // in fp32, its own error is the uncertainty.
  Uncertain Probability(const Uncertain& prob, double eta) const {
    if (!IsSixteenBit(probability_.dtype)) {
      return {prob.lo * (1.0 - eta), prob.mid, prob.hi * (1.0 + eta)};
    }
    return {probability_(prob.lo * (1.0 - eta)), probability_(prob.mid),
            probability_(prob.hi * (1.0 + eta))};
  }

  // An ulp of the output dtype at |x| (at its smallest normal for tiny x).
  double OutputUlp(double x) const {
    const DType dt = output_.dtype;
    if (!IsFloating(dt) || dt == DType::kF64) return 0.0;
    return UlpAt(x, dt);
  }

  const PreparedAttention& p_;
  const EmulationPlan& plan_;
  ScoreChain chain_;
  Narrower probability_, output_;
  double dot_error_ = 0;
  double rope_dot_error_ = 0;
};

}  // namespace

EmulationPlan PlanEmulation(const PreparedAttention& prepared,
                            const EngineArithmetic& engine) {
  EmulationPlan plan;
  if (!IsSixteenBit(engine.score_dtype)) return plan;
  if (engine.undeclared || engine.score_rounding == ResolvedRounding::kEither ||
      engine.output_rounding == ResolvedRounding::kEither) {
    plan.skipped = "the engine's roundings are not declared";
    return plan;
  }
  const DType kv = prepared.v_dtype;
  if (IsFp8(kv)) {
    plan.skipped = "fp8 KV: no 16-bit-score engine keeps an fp8 cache";
    return plan;
  }
  plan.run = true;
  plan.score_dtype = engine.score_dtype;
  plan.score_truncates = engine.score_rounding == ResolvedRounding::kTowardZero;
  plan.probability_dtype = engine.probability_dtype;
  plan.probability_truncates =
      engine.probability_rounding == ResolvedRounding::kTowardZero;
  plan.output_dtype = prepared.output_dtype;
  plan.output_truncates =
      engine.output_rounding == ResolvedRounding::kTowardZero;
  plan.center_scores =
      engine.profile == EngineProfile::kHfEager && !prepared.sinks.empty();
  plan.exp_epsilon = engine.exp_epsilon;
  plan.split_keys = engine.split_keys;
  plan.rope_score_uncertainty = prepared.rope_score_uncertainty;
  return plan;
}

absl::StatusOr<Emulation> EmulateEngine(const PreparedAttention& prepared,
                                        const EmulationPlan& plan, int threads,
                                        const std::atomic<bool>* cancelled) {
  const SnapshotDims& d = prepared.dims;
  Emulation e;
  const size_t size =
      static_cast<size_t>(d.batch * d.queries * d.q_heads * d.head_dim);
  e.out.assign(size, 0.0);
  e.tolerance.assign(size, 0.0);
  const Emulator emulator(prepared, plan);
  const int64_t cells = d.batch * d.kv_heads;
  std::vector<CellCounts> counts(static_cast<size_t>(cells));
  ParallelFor(cells, threads, [&](int64_t c) {
    if (cancelled != nullptr && cancelled->load()) return;
    counts[c] = emulator.Cell(c / d.kv_heads, c % d.kv_heads, &e);
  });
  if (cancelled != nullptr && cancelled->load()) {
    return absl::CancelledError("audit cancelled");
  }
  for (const CellCounts& c : counts) {
    e.scores += c.scores;
    e.ambiguous_scores += c.ambiguous;
  }
  return e;
}

}  // namespace attnaudit
