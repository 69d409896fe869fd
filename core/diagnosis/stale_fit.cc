// The stale-page fit (diagnosis_internal.h, StaleFit; docs/DIAGNOSIS.md,
// "Pages"): per group of a row, how likely E is if that group was read with
// content of unknown values.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/common/parallel.h"
#include "core/diagnosis/diagnosis_internal.h"

namespace attnaudit {
namespace diagnosis_internal {
namespace {

// Identification (FitStalePages): the margin's least share of the best
// group's cost and of its gain over unstructured noise.
constexpr double kCostShare = 0.1;
constexpr double kNoiseShare = 0.5;
// The values a named stale state implies stay within this many times the
// row's largest |V| (an earlier occupant's values), up to E's noise.
constexpr double kStaleValueRange = 2.0;
// The share grid (log-spaced, plus 0) and its refinement.
constexpr int kGrid = 48;
constexpr double kMinShare = 1e-9;
constexpr double kMaxShare = 1.0 - 1e-9;
constexpr int kRefine = 24;

// One cell under one group left out: what the cost needs, summed over D
// once (e: E's out; r: the rest's normalised out; d = mean - r).
struct CellSums {
  double see = 0, ser = 0, sed = 0, srr = 0, srd = 0, sdd = 0;
  double rho = 0;  // the rest's key LSE
};

// What one cell of the row contributes, independent of the group.
struct CellModel {
  int64_t dim = 0;
  bool has_out = false, has_lse = false;
  double vs = 1;      // V scale of the cell's KV head
  bool sink = false;  // the head has a sink
  double sink_logit = 0;
  bool lse_with_sink = false;
  double e_lse = 0;    // the engine's declared LSE
  double lse_var = 1;  // its noise variance
  double n2 = 1;       // E's noise variance per out element
  double tau2 = 1;     // the values' prior variance per element
};

// Negative log-likelihood of the cell when the stale state takes a share
// sigma of the key weight (its values integrated out), relative to E's
// noise alone.
double Cost(const CellModel& m, const CellSums& s, double sigma) {
  const double lambda = s.rho - std::log1p(-sigma);
  double keep = 1.0, declared = lambda;
  if (m.sink) {
    const double x = m.sink_logit - lambda;
    keep = 1.0 / (1.0 + std::exp(x));
    if (m.lse_with_sink) declared = lambda + std::log1p(std::exp(x));
  }
  double c = 0;
  if (m.has_out) {
    const double a = m.vs * keep;
    const double sq = std::max(
        0.0, s.see - 2.0 * a * (s.ser + sigma * s.sed) +
                 a * a * (s.srr + 2.0 * sigma * s.srd + sigma * sigma * s.sdd));
    const double v = a * a * sigma * sigma * m.tau2 + m.n2;
    c += sq / (2.0 * v) + 0.5 * static_cast<double>(m.dim) * std::log(v / m.n2);
  }
  if (m.has_lse) {
    const double z = m.e_lse - declared;
    c += z * z / (2.0 * m.lse_var);
  }
  return c;
}

// min over sigma of Cost: a log-spaced grid (and 0), then golden-section
// refinement in log sigma between the best point's neighbours.
double BestCost(const CellModel& m, const CellSums& s, double* best_sigma) {
  const double lo = std::log(kMinShare), hi = std::log(kMaxShare);
  double best = Cost(m, s, 0.0);
  *best_sigma = 0;
  int at = -1;
  for (int k = 0; k < kGrid; ++k) {
    const double sigma = std::exp(lo + (hi - lo) * k / (kGrid - 1));
    const double c = Cost(m, s, sigma);
    if (c < best) {
      best = c;
      *best_sigma = sigma;
      at = k;
    }
  }
  if (at < 0) return best;
  double a = lo + (hi - lo) * std::max(at - 1, 0) / (kGrid - 1);
  double b = lo + (hi - lo) * std::min(at + 1, kGrid - 1) / (kGrid - 1);
  const double g = 0.5 * (std::sqrt(5.0) - 1.0);
  double x1 = b - g * (b - a), x2 = a + g * (b - a);
  double f1 = Cost(m, s, std::exp(x1)), f2 = Cost(m, s, std::exp(x2));
  for (int k = 0; k < kRefine; ++k) {
    if (f1 < f2) {
      b = x2;
      x2 = x1;
      f2 = f1;
      x1 = b - g * (b - a);
      f1 = Cost(m, s, std::exp(x1));
    } else {
      a = x1;
      x1 = x2;
      f1 = f2;
      x2 = a + g * (b - a);
      f2 = Cost(m, s, std::exp(x2));
    }
  }
  const double f = std::min(f1, f2);
  if (f < best) {
    best = f;
    *best_sigma = std::exp(f1 < f2 ? x1 : x2);
  }
  return best;
}

CellModel MakeCellModel(const Context& ctx, const Row& row,
                        const ValueStats& values, int64_t c) {
  const PreparedAttention& p = *ctx.p;
  const int64_t D = ctx.d.head_dim, h = c % ctx.d.q_heads;
  const int64_t g = h / ctx.d.group();
  CellModel m;
  m.dim = D;
  m.has_out = row.has_out;
  m.has_lse = row.has_lse;
  m.vs = p.v_scale[g];
  m.sink = !p.sinks.empty();
  if (m.sink) m.sink_logit = p.sinks[h];
  m.lse_with_sink = p.lse_includes_sinks;
  if (row.has_lse) m.e_lse = row.e_lse[c];
  m.lse_var = ctx.lse_unit * ctx.lse_unit;
  double u2 = 0;
  for (int64_t i = 0; i < D; ++i)
    u2 += row.unit[c * D + i] * row.unit[c * D + i];
  m.n2 = std::max(
      u2 / static_cast<double>(D) * std::max(ctx.noise.mean_square, 1.0 / 12.0),
      1e-300);
  m.tau2 = std::max(values.var[g], 1e-300);
  return m;
}

// The cell's cost under "E is R plus noise of unknown size" (out's and the
// LSE's variances fitted to the cell, at least E's rounding): what a drift
// without structure costs, the stale page's competitor.
double NoiseCost(const Context& ctx, const Row& row, const CellModel& m,
                 int64_t c) {
  const int64_t D = ctx.d.head_dim;
  double cost = 0;
  if (m.has_out) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) {
      const double d = Diff(row.e_out[c * D + i], row.r_out[c * D + i]);
      ss += std::isfinite(d) ? d * d : 1e300;
    }
    const double v = std::max(m.n2, ss / static_cast<double>(D));
    cost += ss / (2.0 * v) + 0.5 * static_cast<double>(D) * std::log(v / m.n2);
  }
  if (m.has_lse) {
    const double d = Diff(row.e_lse[c], row.r_lse[c]);
    const double z2 = std::isfinite(d) ? d * d : 1e300;
    const double v = std::max(m.lse_var, z2);
    cost += z2 / (2.0 * v) + 0.5 * std::log(v / m.lse_var);
  }
  return cost;
}

CellSums Sums(const Row& row, const ValueStats& values, const Acc& rest,
              int64_t c, int64_t D, int64_t g) {
  CellSums s;
  s.rho = rest.Lse();
  const double inv = rest.l > 0 ? 1.0 / rest.l : 0.0;
  for (int64_t i = 0; i < D; ++i) {
    const double e = row.has_out ? row.e_out[c * D + i] : 0.0;
    const double r = rest.acc[i] * inv;
    const double d = values.mean[g * D + i] - r;
    s.see += e * e;
    s.ser += e * r;
    s.sed += e * d;
    s.srr += r * r;
    s.srd += r * d;
    s.sdd += d * d;
  }
  return s;
}

// Cells [c0, c1): every group's best cost into cost[j], the cost with
// nothing stale into *none and with unstructured noise into *noise.
void FitCells(const Context& ctx, const Row& row, const RowStates& rs,
              const ValueStats& values,
              const std::vector<std::vector<int32_t>>* groups, int64_t c0,
              int64_t c1, std::vector<double>* cost, double* none,
              double* noise) {
  CellBlocks cb = groups ? CellBlocks(ctx, rs, *groups) : CellBlocks(ctx, rs);
  const int64_t D = ctx.d.head_dim;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    const int64_t g = h / ctx.d.group();
    cb.Load(s, h);
    const CellModel m = MakeCellModel(ctx, row, values, c);
    *none += Cost(m, Sums(row, values, cb.All(), c, D, g), 0.0);
    *noise += NoiseCost(ctx, row, m, c);
    for (int64_t j = 0; j < cb.blocks(); ++j) {
      const Acc rest = cb.Without(j);
      if (!(rest.l > 0)) {
        (*cost)[j] = std::numeric_limits<double>::infinity();
        continue;
      }
      double sigma = 0;
      (*cost)[j] += BestCost(m, Sums(row, values, rest, c, D, g), &sigma);
    }
  }
}

// Whether the values the best fit implies for group j stay in range in
// every cell that drifts: x = (E / a - (1 - sigma) r) / sigma.
bool ConsistentValues(const Context& ctx, const Row& row, const RowStates& rs,
                      const ValueStats& values,
                      const std::vector<std::vector<int32_t>>* groups,
                      int64_t j) {
  if (!row.has_out) return true;
  CellBlocks cb = groups ? CellBlocks(ctx, rs, *groups) : CellBlocks(ctx, rs);
  const int64_t D = ctx.d.head_dim;
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    if (!(row.before[c] > 4.0 * ctx.clean_cell)) continue;
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    const int64_t g = h / ctx.d.group();
    cb.Load(s, h);
    const Acc rest = cb.Without(j);
    if (!(rest.l > 0)) return false;
    const CellModel m = MakeCellModel(ctx, row, values, c);
    const CellSums sums = Sums(row, values, rest, c, D, g);
    double sigma = 0;
    BestCost(m, sums, &sigma);
    if (sigma <= 0) continue;  // nothing added: a dropped group
    double keep = 1.0;
    if (m.sink) {
      keep =
          1.0 / (1.0 + std::exp(m.sink_logit - sums.rho + std::log1p(-sigma)));
    }
    const double a = m.vs * keep;
    for (int64_t i = 0; i < D; ++i) {
      const int64_t k = c * D + i;
      const double x =
          (row.e_out[k] / a - (1.0 - sigma) * rest.acc[i] / rest.l) / sigma;
      if (std::fabs(x) >
          kStaleValueRange * values.max[g] + 4.0 * row.unit[k] / (a * sigma)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

bool StaleFit::Structured() const {
  return best >= 0 && consistent && over_noise >= kStaleMargin;
}

void LocateStaleFit(const StaleFit& fit, const std::string& runner_up,
                    Candidate* c) {
  c->located = true;
  c->fit_cost = fit.best >= 0 ? fit.cost[fit.best] : c->fit_cost;
  c->eval.explains = fit.identified;
  if (fit.identified) {
    c->eval.score = std::max(c->eval.score, kStaleScore);
    return;
  }
  c->eval.score = std::min(c->eval.score, kAmbiguousStaleScore);
  c->detail = absl::StrFormat("%s fits within %.3g nats as well", runner_up,
                              fit.margin);
}

StaleFit FitStalePages(const Context& ctx, const Row& row, const RowStates& rs,
                       const ValueStats& values,
                       const std::vector<std::vector<int32_t>>* groups,
                       const std::vector<uint8_t>* allowed) {
  StaleFit fit;
  const int64_t nb = groups ? static_cast<int64_t>(groups->size())
                            : static_cast<int64_t>(rs.pages.size());
  if (nb < 2) return fit;
  const int64_t cells = ctx.Cells();
  const int64_t chunks = std::min<int64_t>(cells, ctx.opt->threads);
  std::vector<std::vector<double>> part(static_cast<size_t>(chunks),
                                        std::vector<double>(nb, 0.0));
  std::vector<double> none(static_cast<size_t>(chunks), 0.0);
  std::vector<double> noise(static_cast<size_t>(chunks), 0.0);
  ParallelFor(chunks, ctx.opt->threads, [&](int64_t k) {
    FitCells(ctx, row, rs, values, groups, cells * k / chunks,
             cells * (k + 1) / chunks, &part[k], &none[k], &noise[k]);
  });
  fit.cost.assign(static_cast<size_t>(nb), 0.0);
  double cost_none = 0, cost_noise = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    for (int64_t j = 0; j < nb; ++j) fit.cost[j] += part[k][j];
    cost_none += none[k];
    cost_noise += noise[k];
  }
  // A group the partials rule out cannot be the stale one: it is neither
  // named nor an alternative.
  auto ok = [&](int64_t j) {
    return std::isfinite(fit.cost[j]) && (allowed == nullptr || (*allowed)[j]);
  };
  for (int64_t j = 0; j < nb; ++j) {
    if (ok(j) && (fit.best < 0 || fit.cost[j] < fit.cost[fit.best])) {
      fit.best = j;
    }
  }
  if (fit.best < 0) return fit;
  for (int64_t j = 0; j < nb; ++j) {
    if (j == fit.best || !ok(j)) continue;
    if (fit.runner_up < 0 || fit.cost[j] < fit.cost[fit.runner_up]) {
      fit.runner_up = j;
    }
  }
  fit.margin = fit.runner_up >= 0 ? fit.cost[fit.runner_up] - fit.cost[fit.best]
                                  : std::numeric_limits<double>::infinity();
  fit.evidence = cost_none - fit.cost[fit.best];
  fit.over_noise = cost_noise - fit.cost[fit.best];
  fit.consistent = ConsistentValues(ctx, row, rs, values, groups, fit.best);
  // Named when the best group fits clearly better than unstructured noise
  // and than any other group: by kStaleMargin, by a share of its own cost
  // (the model's misfit grows with it, and a margin lost in it says
  // nothing) and by half of what it gains over noise (the runner-up holds
  // at most half the structure).
  fit.identified = fit.consistent && fit.over_noise >= kStaleMargin &&
                   fit.margin >= kStaleMargin &&
                   fit.margin >= kCostShare * std::fabs(fit.cost[fit.best]) &&
                   fit.margin >= kNoiseShare * fit.over_noise;
  return fit;
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
