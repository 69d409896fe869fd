// The stale-page fit (diagnosis_internal.h, StaleFit; docs/DIAGNOSIS.md,
// "Pages"): per group of a row, how likely E is if that group was read with
// content of unknown values.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/common/parallel.h"
#include "core/diagnosis/diagnosis_internal.h"

namespace attnaudit {
namespace diagnosis_internal {
namespace {

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
  // 1 / the tokens the group holds: the least share of the values' prior
  // variance the state's average keeps (below).
  double inv_tokens = 1;
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
    // The state's value is its keys' softmax average of the group's values:
    // its prior variance is tau2 times sum p_i^2, between 1 / tokens (even
    // weights) and 1 (one key), unknown; fitted (closed form: the ML
    // variance sq / dim, clamped to that range).
    const double spread = a * a * sigma * sigma * m.tau2;
    const double v = std::clamp(sq / static_cast<double>(m.dim),
                                spread * s.inv_tokens + m.n2, spread + m.n2);
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
              int64_t c, int64_t D, int64_t g, double inv_tokens = 1.0) {
  CellSums s;
  s.rho = rest.Lse();
  s.inv_tokens = inv_tokens;
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

// 1 / the tokens of each group of the row (its logical blocks, or `groups`
// of units).
std::vector<double> InverseTokens(
    const RowStates& rs, const std::vector<std::vector<int32_t>>* groups) {
  std::vector<double> inv;
  const int64_t nb = groups ? static_cast<int64_t>(groups->size())
                            : static_cast<int64_t>(rs.pages.size());
  for (int64_t j = 0; j < nb; ++j) {
    int64_t tokens = 0;
    if (groups) {
      for (int32_t u : (*groups)[j]) tokens += rs.units[u].count;
    } else {
      for (int32_t u = rs.block_begin[j]; u < rs.block_begin[j + 1]; ++u) {
        tokens += rs.units[u].count;
      }
    }
    inv.push_back(1.0 / static_cast<double>(std::max<int64_t>(tokens, 1)));
  }
  return inv;
}

// The fit's costs, summed over cells: every group's, and the row's with
// nothing stale and with unstructured noise.
struct Totals {
  std::vector<double> stale;  // [groups]
  double none = 0, noise = 0;
};

// Cells [c0, c1) added to *t.
void FitCells(const Context& ctx, const Row& row, const RowStates& rs,
              const ValueStats& values,
              const std::vector<std::vector<int32_t>>* groups, int64_t c0,
              int64_t c1, Totals* t) {
  CellBlocks cb = groups ? CellBlocks(ctx, rs, *groups) : CellBlocks(ctx, rs);
  const std::vector<double> inv_tokens = InverseTokens(rs, groups);
  const int64_t D = ctx.d.head_dim;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    const int64_t g = h / ctx.d.group();
    cb.Load(s, h);
    const CellModel m = MakeCellModel(ctx, row, values, c);
    t->none += Cost(m, Sums(row, values, cb.All(), c, D, g), 0.0);
    t->noise += NoiseCost(ctx, row, m, c);
    for (int64_t j = 0; j < cb.blocks(); ++j) {
      const Acc rest = cb.Without(j);
      if (!(rest.l > 0)) {
        t->stale[j] = std::numeric_limits<double>::infinity();
        continue;
      }
      double sigma = 0;
      t->stale[j] +=
          BestCost(m, Sums(row, values, rest, c, D, g, inv_tokens[j]), &sigma);
    }
  }
}

// Every cell of the row, split over the audit's threads.
Totals FitRow(const Context& ctx, const Row& row, const RowStates& rs,
              const ValueStats& values,
              const std::vector<std::vector<int32_t>>* groups, int64_t nb) {
  const int64_t cells = ctx.Cells();
  const int64_t chunks =
      std::max<int64_t>(1, std::min<int64_t>(cells, ctx.opt->threads));
  std::vector<Totals> part(static_cast<size_t>(chunks));
  for (Totals& p : part) p.stale.assign(static_cast<size_t>(nb), 0.0);
  ParallelFor(chunks, ctx.opt->threads, [&](int64_t k) {
    FitCells(ctx, row, rs, values, groups, cells * k / chunks,
             cells * (k + 1) / chunks, &part[k]);
  });
  Totals t = std::move(part[0]);
  for (int64_t k = 1; k < chunks; ++k) {
    for (int64_t j = 0; j < nb; ++j) t.stale[j] += part[k].stale[j];
    t.none += part[k].none;
    t.noise += part[k].noise;
  }
  return t;
}

// Whether the values the best fit implies for group j stay in range in
// every cell that drifts: x = (E / a - (1 - sigma) r) / sigma.
bool ConsistentValues(const Context& ctx, const Row& row, const RowStates& rs,
                      const ValueStats& values,
                      const std::vector<std::vector<int32_t>>* groups,
                      int64_t j) {
  if (!row.has_out) return true;
  CellBlocks cb = groups ? CellBlocks(ctx, rs, *groups) : CellBlocks(ctx, rs);
  const std::vector<double> inv_tokens = InverseTokens(rs, groups);
  const int64_t D = ctx.d.head_dim;
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    if (!(row.before[c] > 4.0 * ctx.clean_cell)) continue;
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    const int64_t g = h / ctx.d.group();
    cb.Load(s, h);
    const Acc rest = cb.Without(j);
    if (!(rest.l > 0)) return false;
    const CellModel m = MakeCellModel(ctx, row, values, c);
    const CellSums sums = Sums(row, values, rest, c, D, g, inv_tokens[j]);
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

// Laplace's (BIC's) charge for the parameters the stale hypothesis fits
// beyond the noise model's, 1/2 ln n each (n: the elements that fit it).
// Per cell the noise model fits out's variance and the LSE's, the stale
// page its share sigma and the spread of its values (Cost): as many, when
// the engine wrote an LSE (sigma then takes the LSE's place). Without
// the LSE sigma is one more per cell, fitted from the cell's D elements.
double ExtraParameters(const Context& ctx, const Row& row) {
  if (row.has_lse || !row.has_out) return 0.0;
  return 0.5 * std::log(static_cast<double>(ctx.d.head_dim)) *
         static_cast<double>(ctx.Cells());
}

// ln of sum exp(x) over finite-or-infinite x (-inf terms add nothing).
double LogSumExp(const std::vector<double>& x) {
  double top = -std::numeric_limits<double>::infinity();
  for (double v : x) top = std::max(top, v);
  if (!std::isfinite(top)) return top;
  double sum = 0;
  for (double v : x) sum += std::exp(v - top);
  return top + std::log(sum);
}

// The cheapest group that may be named, and the next.
void PickBest(const Totals& t, const std::vector<uint8_t>& ok, StaleFit* fit) {
  const int64_t nb = static_cast<int64_t>(t.stale.size());
  for (int64_t j = 0; j < nb; ++j) {
    if (ok[j] && (fit->best < 0 || t.stale[j] < t.stale[fit->best])) {
      fit->best = j;
    }
  }
  for (int64_t j = 0; j < nb && fit->best >= 0; ++j) {
    if (j == fit->best || !ok[j]) continue;
    if (fit->runner_up < 0 || t.stale[j] < t.stale[fit->runner_up]) {
      fit->runner_up = j;
    }
  }
}

// The posterior over "unstructured drift" (prior 1/2) and "group j was
// stale" (1/2 shared evenly by the groups that may be named), each
// hypothesis' likelihood at its fitted parameters, the stale ones charged
// `extra` (above). Fills margin, evidence, over_noise, doubt and
// stale_odds of a fit with a best group.
void Posterior(const Totals& t, const std::vector<uint8_t>& ok, double extra,
               StaleFit* fit) {
  const double best = t.stale[fit->best];
  fit->margin = fit->runner_up >= 0 ? t.stale[fit->runner_up] - best
                                    : std::numeric_limits<double>::infinity();
  fit->evidence = t.none - best;
  fit->over_noise = t.noise - best - extra;
  // Log weights relative to the best group's.
  int64_t named = 0;
  for (uint8_t o : ok) named += o;
  const double drift = std::log(static_cast<double>(named)) - fit->over_noise;
  std::vector<double> others{drift}, groups{0.0};
  for (size_t j = 0; j < t.stale.size(); ++j) {
    if (!ok[j] || static_cast<int64_t>(j) == fit->best) continue;
    others.push_back(best - t.stale[j]);
    groups.push_back(best - t.stale[j]);
  }
  fit->doubt = LogSumExp(others);
  fit->stale_odds = LogSumExp(groups) - drift;
}

}  // namespace

double PlaceLogOdds() {
  const double alpha = StatisticalInputs().alpha;
  return std::log((1.0 - alpha) / alpha);
}

bool StaleFit::Structured() const {
  return best >= 0 && consistent && stale_odds >= PlaceLogOdds();
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
  // What keeps the place open: another group, or a drift without
  // structure (the noise model), whichever fits closer.
  if (fit.runner_up >= 0 && fit.margin <= fit.over_noise) {
    c->detail = absl::StrFormat("%s fits within %.3g nats as well", runner_up,
                                fit.margin);
  } else {
    c->detail = absl::StrFormat(
        "a drift without structure fits within %.3g nats as well",
        std::max(fit.over_noise, 0.0));
  }
}

StaleFit FitStalePages(const Context& ctx, const Row& row, const RowStates& rs,
                       const ValueStats& values,
                       const std::vector<std::vector<int32_t>>* groups,
                       const std::vector<uint8_t>* allowed) {
  StaleFit fit;
  const int64_t nb = groups ? static_cast<int64_t>(groups->size())
                            : static_cast<int64_t>(rs.pages.size());
  if (nb < 2) return fit;
  const Totals t = FitRow(ctx, row, rs, values, groups, nb);
  fit.cost = t.stale;
  // A group the partials rule out cannot be the stale one: it is neither
  // named nor an alternative.
  std::vector<uint8_t> ok(static_cast<size_t>(nb), 0);
  for (int64_t j = 0; j < nb; ++j) {
    ok[j] = std::isfinite(t.stale[j]) && (allowed == nullptr || (*allowed)[j]);
  }
  PickBest(t, ok, &fit);
  if (fit.best < 0) return fit;
  Posterior(t, ok, ExtraParameters(ctx, row), &fit);
  fit.consistent = ConsistentValues(ctx, row, rs, values, groups, fit.best);
  // Named when its posterior probability is at least 1 - alpha, alpha the
  // statistical detector's false-alarm probability: a place is named as
  // surely as a DRIFT is called.
  fit.identified = fit.consistent && fit.doubt <= -PlaceLogOdds();
  return fit;
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
