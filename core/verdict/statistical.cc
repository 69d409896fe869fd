// The statistical detector; docs/NUMERICS.md ("Statistical detector") has
// the derivation of the noise model and its calibration. Keep the two in
// step.
#include "core/verdict/statistical.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/engine/arithmetic.h"
#include "core/tensor/dtype_traits.h"
#include "core/verdict/verdict.h"

namespace attnaudit {
namespace {

// The calibrated noise level of one comparison (NUMERICS.md): E[z^2] of a
// pure rounding is 1/12; the engines' bf16 P, fp8 dequantisation and split
// merges add to it, and E-P carries the noise of both of its sides.
struct Level {
  double mean_square;
  double sd_square;
};
constexpr Level kEngineLevel = {0.16, 0.20};
constexpr Level kReplayLevel = {0.10, 0.10};
constexpr Level kEngineReplayLevel = {0.30, 0.45};
constexpr double kBound = 1.0;
// Elements counted as one independent sample, and the margin on the mean
// z^2, of the rms test (NUMERICS.md: calibrated on the clean engines).
constexpr int64_t kDesignEffect = 16;
constexpr double kRmsMargin = 0.1;
// Multiplier of the fp32 accumulation depth in the noise epsilon, and the
// score magnitude per bf16 epsilon of fp8 noise (NUMERICS.md).
constexpr double kFp32Depth = 4.0;
constexpr double kFp8Lambda = 2.5;
// The noise epsilon per unit of the sides' worst-case score error (the
// bound adds every key's error with one sign; a correct engine's have
// mixed signs): calibrated on the real engines of the conformance suite
// (NUMERICS.md, "Statistical detector").
constexpr double kScoreNoise = 1.5;
// u is floored at this fraction of the head row's rms (near-zero elements
// carry the row's absolute noise, not their own ULP's).
constexpr double kRowFloor = 0.5;

// Where a noise unit and an output ulp bottom out: the output dtype's
// smallest normal value, an fp8 output's at f32's.
double SmallestNormal(DType dtype) {
  return DTypeSmallestNormal(IsFp8(dtype) ? DType::kF32 : dtype);
}

// Running sums of one group: z^2 per element; the mean z and the mean
// z * sign(R) per cell (one head of one query: the D elements that share
// the cell's normalisation and keys, whose errors are correlated).
// `slack` is the sum of each element's unknown rounding lean (in z units:
// the shrink a correct engine may have beyond the one already added back),
// averaged per cell like z.
struct Sums {
  int64_t n = 0, cells = 0;
  double z2 = 0, z = 0, zs = 0, slack = 0;
  void AddCell(const Sums& cell) {
    if (cell.n == 0) return;
    n += cell.n;
    z2 += cell.z2;
    ++cells;
    z += cell.z / static_cast<double>(cell.n);
    zs += cell.zs / static_cast<double>(cell.n);
    slack += cell.slack / static_cast<double>(cell.n);
  }
  void Add(double zi, double sign, double lean) {
    ++n;
    z2 += zi * zi;
    z += zi;
    zs += zi * sign;
    slack += lean;
  }
};

struct Limits {
  NoiseModel noise;
  double delta = 0;  // one-sided level per test
};

// Fills the group's statistics and limits; returns its excess ratio (the
// largest statistic over its limit, > 1 when it fires).
double Judge(const Sums& s, const Limits& lim, StatisticalGroup* g) {
  g->count = s.n;
  if (s.n == 0 || s.cells == 0) return 0.0;
  const double n = static_cast<double>(s.n);
  const double cells = static_cast<double>(s.cells);
  g->rms = std::sqrt(s.z2 / n);
  g->mean = s.z / cells;
  g->bias = s.zs / cells;
  const NoiseModel& m = lim.noise;
  // An unknown rounding lean may shift every z of the group by up to its
  // mean slack: the mean tests allow it, the rms test its square.
  const double slack = s.slack / cells;
  // Elements are not independent (rows attending to the same sink repeat
  // the same values; a cell's elements share its keys): the rms test
  // counts kDesignEffect elements as one, and adds a margin.
  const int64_t n_eff = std::max<int64_t>(1, s.n / kDesignEffect);
  const double ms_limit =
      BernsteinLimit(m.mean_square + kRmsMargin + slack * slack, m.sd_square,
                     m.bound, n_eff, lim.delta);
  g->rms_limit = std::sqrt(ms_limit);
  // The mean tests take each cell's mean as one sample, with the spread of
  // a single element (a cell mean spreads far less unless its elements
  // move together).
  g->mean_limit = BernsteinLimit(slack, std::sqrt(m.mean_square), m.bound,
                                 s.cells, lim.delta / 2.0);
  const double ratio =
      std::max({(s.z2 / n) / ms_limit, std::fabs(g->mean) / g->mean_limit,
                std::fabs(g->bias) / g->mean_limit});
  g->fired = ratio > 1.0;
  return ratio;
}

// Keeps the worst group of one scope and counts the fired ones.
struct ScopeResult {
  StatisticalGroup worst;
  double worst_ratio = -1;
};

void Consider(const Sums& s, const Limits& lim, StatisticalGroup g,
              ScopeResult* scope, StatisticalResult* result) {
  if (s.n == 0) return;
  const double ratio = Judge(s, lim, &g);
  ++result->groups;
  if (g.fired) ++result->fired_groups;
  if (ratio > scope->worst_ratio) {
    scope->worst_ratio = ratio;
    scope->worst = std::move(g);
  }
}

}  // namespace

double BernsteinLimit(double mu, double sd, double bound, int64_t n,
                      double delta) {
  const double l = std::log(1.0 / delta);
  const double nn = static_cast<double>(std::max<int64_t>(1, n));
  const double c = bound * l / 3.0;
  return mu + (c + std::sqrt(c * c + 2.0 * sd * sd * l * nn)) / nn;
}

NoiseModel StatisticalNoise(const StatisticalInputs& in) {
  NoiseModel m;
  const double eps_out =
      IsFloating(in.output_dtype) ? DTypeEpsilon(in.output_dtype) : kEpsF32;
  // fp32 accumulation: ~sqrt(L) for sums over L keys, ~n for a fold of n
  // blocks (both far below a 16-bit output's epsilon), with a row-wide
  // relative error of a few eps_f (the normalisation) on top.
  const double depth = std::max(
      std::sqrt(static_cast<double>(std::max<int64_t>(1, in.max_context))),
      static_cast<double>(std::max<int64_t>(1, in.max_merged_blocks)));
  const double eps_probability = in.probability_epsilon > 0
                                     ? in.probability_epsilon
                                     : WorkingEpsilon(in.kv_dtype);
  m.epsilon = std::max({eps_out, eps_probability, kFp32Depth * kEpsF32 * depth,
                        kScoreNoise * std::max(0.0, in.score_error)});
  // fp8 K dequantised and rounded to bf16 moves every score by up to
  // eps_bf16 / 2 of its terms: noise that grows with the score magnitude,
  // for which Lambda stands.
  if (IsFp8(in.kv_dtype)) {
    const double lambda = std::isfinite(in.max_abs_lse_reference)
                              ? std::fabs(in.max_abs_lse_reference)
                              : 1.0;
    m.epsilon = std::max(m.epsilon, kEpsBf16 * lambda / kFp8Lambda);
  }
  const Level level =
      in.comparison == Comparison::kEngineVsReference   ? kEngineLevel
      : in.comparison == Comparison::kReplayVsReference ? kReplayLevel
                                                        : kEngineReplayLevel;
  m.mean_square = level.mean_square;
  m.sd_square = level.sd_square;
  m.bound = kBound;
  return m;
}

namespace {

// NoiseUnit with the floor's dtype part already known (`smallest`, a
// positive normal double). The binade of m, 2^(e-1) for m = f 2^e with f in
// [0.5, 1), is m's exponent field alone (m is a normal double), and
// epsilon times it is exact: the bits of ldexp(epsilon, e - 1), without two
// library calls per element.
inline double NoiseUnitAbove(double reference, double row_rms, double epsilon,
                             double smallest) {
  const double m =
      std::max(std::max(std::fabs(reference), kRowFloor * row_rms), smallest);
  uint64_t bits;
  std::memcpy(&bits, &m, sizeof bits);
  bits &= uint64_t{0x7ff} << 52;
  double binade;
  std::memcpy(&binade, &bits, sizeof binade);
  return epsilon * binade;
}

// The elements a test reads, the noise unit's constants, and the
// candidate's rounding lean (StatisticalInputs::shrink_*): the output
// dtype's epsilon and smallest normal give the ulp at the reference.
struct CellInputs {
  const double* candidate;
  const double* baseline;
  const double* reference;
  double epsilon;
  double smallest;
  double shrink_ulps = 0;
  double shrink_relative = 0;
  bool shrink_known = true;
  double out_epsilon = 0;
  double out_smallest = 0;
  bool Leans() const { return shrink_ulps > 0 || shrink_relative > 0; }
};

// The expected shrink of a candidate towards zero at reference `ref`,
// signed: adding it to the difference centres a correct engine's z.
inline double LeanAt(const CellInputs& in, double ref) {
  const double magnitude =
      in.shrink_ulps *
          NoiseUnitAbove(ref, 0.0, in.out_epsilon, in.out_smallest) +
      in.shrink_relative * std::fabs(ref);
  return ref > 0 ? magnitude : ref < 0 ? -magnitude : 0.0;
}

// z of the dim elements of kCells cells (from element `base`, dim each),
// NaN where either side is not finite; with kLean the candidate's rounding
// lean is added back and its unknown part (in z units) written to `slack`.
// Each cell's sum of squares runs in element order, the cells side by side
// so their chains overlap; the z loop has no branch, so the compiler
// vectorises its divisions.
template <int kCells, bool kLean>
void CellZ(const CellInputs& in, int64_t base, int64_t dim, double* z,
           double* slack) {
  double ss[kCells] = {};
  for (int64_t d = 0; d < dim; ++d) {
    for (int k = 0; k < kCells; ++k) {
      const double x = in.reference[base + k * dim + d];
      if (std::isfinite(x)) ss[k] += x * x;
    }
  }
  constexpr double kLargest = std::numeric_limits<double>::max();
  for (int k = 0; k < kCells; ++k) {
    const double row_rms = std::sqrt(ss[k] / static_cast<double>(dim));
    const int64_t first = base + k * dim;
    for (int64_t d = 0; d < dim; ++d) {
      const double ref = in.reference[first + d];
      double diff = in.candidate[first + d] - in.baseline[first + d];
      // & rather than &&: no branch.
      const bool counted =
          (std::fabs(diff) <= kLargest) & (std::fabs(ref) <= kLargest);
      const double unit = NoiseUnitAbove(ref, row_rms, in.epsilon, in.smallest);
      if constexpr (kLean) {
        const double lean = LeanAt(in, ref);
        diff += lean;
        slack[k * dim + d] = in.shrink_known ? 0.0 : std::fabs(lean) / unit;
      }
      const double q = diff / unit;
      z[k * dim + d] = counted ? q : std::numeric_limits<double>::quiet_NaN();
    }
  }
}

// The sums of kCells cells side by side from their z (dim each, NaN left
// out) and the reference's signs: every cell's sums in element order,
// exactly as one cell alone would take them (its bits do not depend on the
// band); the band lets the cells' chains of dependent adds overlap.
template <int kCells>
void CellBand(const CellInputs& in, int64_t base, int64_t dim, const double* z,
              const double* slack, Sums* cells) {
  for (int k = 0; k < kCells; ++k) cells[k] = Sums();
  for (int64_t d = 0; d < dim; ++d) {
    for (int k = 0; k < kCells; ++k) {
      const double zk = z[k * dim + d];
      if (std::isnan(zk)) continue;
      cells[k].Add(zk, in.reference[base + k * dim + d] < 0 ? -1.0 : 1.0,
                   slack[k * dim + d]);
    }
  }
}

template <int kCells>
void CellsOf(const CellInputs& in, int64_t base, int64_t dim, double* z,
             double* slack, Sums* cells) {
  if (in.Leans()) {
    CellZ<kCells, true>(in, base, dim, z, slack);
  } else {
    CellZ<kCells, false>(in, base, dim, z, slack);
  }
  CellBand<kCells>(in, base, dim, z, slack, cells);
}

// The cells (one per head) of the row whose first element is `base`, four
// at a time; z and slack are scratch of heads * dim (slack all zero unless
// the candidate leans by an unknown amount).
void RowCells(const CellInputs& in, int64_t base, int64_t heads, int64_t dim,
              double* z, double* slack, std::vector<Sums>* cells) {
  constexpr int kBand = 4;
  int64_t h = 0;
  for (; h + kBand <= heads; h += kBand) {
    CellsOf<kBand>(in, base + h * dim, dim, z + h * dim, slack + h * dim,
                   &(*cells)[h]);
  }
  for (; h < heads; ++h) {
    CellsOf<1>(in, base + h * dim, dim, z + h * dim, slack + h * dim,
               &(*cells)[h]);
  }
}

}  // namespace

double NoiseUnit(double reference, double row_rms, double epsilon,
                 DType output_dtype) {
  return NoiseUnitAbove(reference, row_rms, epsilon,
                        SmallestNormal(output_dtype));
}

StatisticalResult RunStatisticalTest(const double* candidate,
                                     const double* baseline,
                                     const double* reference, int64_t batch,
                                     int64_t queries, int64_t heads,
                                     int64_t dim,
                                     const StatisticalInputs& inputs) {
  StatisticalResult result;
  const int64_t rows = batch * queries;
  Limits lim;
  lim.noise = StatisticalNoise(inputs);
  // Three tests (rms, mean, bias) per group, the last two two-sided.
  const double groups = static_cast<double>(1 + rows + heads);
  lim.delta = inputs.alpha / (5.0 * groups);
  result.noise_epsilon = lim.noise.epsilon;
  result.clean_rms = std::sqrt(lim.noise.mean_square);

  CellInputs elements{candidate, baseline, reference, lim.noise.epsilon,
                      SmallestNormal(inputs.output_dtype)};
  elements.shrink_ulps = std::max(0.0, inputs.shrink_ulps);
  elements.shrink_relative = std::max(0.0, inputs.shrink_relative);
  elements.shrink_known = inputs.shrink_known;
  elements.out_epsilon = IsFloating(inputs.output_dtype)
                             ? DTypeEpsilon(inputs.output_dtype)
                             : kEpsF32;
  elements.out_smallest = SmallestNormal(inputs.output_dtype);
  Sums all;
  std::vector<Sums> per_head(static_cast<size_t>(heads));
  ScopeResult row_scope;
  std::vector<Sums> cells(static_cast<size_t>(heads));
  std::vector<double> z(static_cast<size_t>(heads * dim));
  std::vector<double> slack(static_cast<size_t>(heads * dim), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    RowCells(elements, r * heads * dim, heads, dim, z.data(), slack.data(),
             &cells);
    Sums row;
    for (int64_t h = 0; h < heads; ++h) {
      if (inputs.excluded_cells != nullptr &&
          inputs.excluded_cells[r * heads + h] != 0) {
        continue;
      }
      all.AddCell(cells[h]);
      row.AddCell(cells[h]);
      per_head[h].AddCell(cells[h]);
    }
    StatisticalGroup g;
    g.scope = "row";
    g.where.batch = r / queries;
    g.where.query = r % queries;
    Consider(row, lim, g, &row_scope, &result);
  }
  if (all.n == 0) return result;
  ScopeResult all_scope, head_scope;
  StatisticalGroup g;
  g.scope = "all";
  Consider(all, lim, g, &all_scope, &result);
  for (int64_t h = 0; h < heads; ++h) {
    StatisticalGroup gh;
    gh.scope = "head";
    gh.where.head = h;
    Consider(per_head[h], lim, gh, &head_scope, &result);
  }
  result.computed = true;
  for (ScopeResult* s : {&all_scope, &row_scope, &head_scope}) {
    if (s->worst_ratio >= 0) result.worst.push_back(s->worst);
  }
  return result;
}

}  // namespace attnaudit
