// The statistical detector: a test on the distribution of the out
// differences of one comparison, against the noise a correct engine makes.
//
// The per-element tolerance (verdict.h) is a worst case and so lets through
// precision bugs whose every element stays under it while the differences
// are plainly too large on average (an intermediate kept in bf16, a stale
// page at long context). This detector measures each difference in units
// of its element's expected rounding noise -- z = diff / u, u the ULP of
// max(|R|, half the rms of its head row) in a dtype whose epsilon is the
// noise epsilon -- and tests, over every element, each row (b, s) and each
// query head, the rms of z, its mean and its mean towards zero (bias). The
// limits are Bernstein bounds at a family-wise false-alarm level, around
// the noise level calibrated on simulated clean engines; docs/NUMERICS.md
// ("Statistical detector") derives them and gives the calibration.
//
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_CORE_VERDICT_STATISTICAL_H_
#define ATTNAUDIT_CORE_VERDICT_STATISTICAL_H_

#include <cstdint>

#include "core/report/report.h"
#include "core/tensor/dtype.h"

namespace attnaudit {

struct StatisticalInputs {
  Comparison comparison = Comparison::kEngineVsReference;
  DType output_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  int64_t max_context = 1;           // largest visible key count of a query
  int64_t max_merged_blocks = 1;     // largest number of merged blocks
  double max_abs_lse_reference = 1;  // Lambda: max |R.lse| (fp8 KV noise)
  // The engine's arithmetic (core/engine/arithmetic.h): the precision of its
  // probabilities (0: WorkingEpsilon(kv_dtype), core/engine/arithmetic.h) and
  // the absolute error of both sides' scores (ComparisonScoreError plus, for a
  // pre-RoPE snapshot's E-R and E-P, attnaudit's own RoPE uncertainty), which
  // moves out by about as much relative.
  double probability_epsilon = 0;
  double score_error = 0;
  // Where the candidate's roundings lean (E-R and E-P: the engine's, from
  // EngineArithmetic): the expected shrink of each candidate value towards
  // zero, in ulps of the output dtype at the reference (0.5 for an output
  // truncated, 0.25 when either rounding may be) plus a fraction of |R|
  // (truncated probabilities), is added back before z is taken, so a
  // correct truncating engine is centred like a rounding one. `shrink_known`
  // false (either rounding): the shrink may be anywhere from none to twice
  // the expected, and the mean and bias limits widen by it.
  double shrink_ulps = 0;
  double shrink_relative = 0;
  bool shrink_known = true;
  // Family-wise false-alarm probability per comparison under the noise
  // model (the measured rate is in docs/NUMERICS.md).
  double alpha = 1e-7;
  // Optional [B * Sq * Hq] (b, s, h) cells left out of every group (1):
  // rows whose bias the tolerances bound apart (a rotated element at a
  // rounding boundary, PreparedAttention::row_score_uncertainty).
  const uint8_t* excluded_cells = nullptr;
};

// The noise model of one comparison: the epsilon of the unit, the mean of
// z^2 and its spread for a correct engine, and the bound used for z^2 and
// |z| in the Bernstein limits.
struct NoiseModel {
  double epsilon = 0;
  double mean_square = 0;  // E[z^2] a correct engine stays under
  double sd_square = 0;    // sd of z^2
  double bound = 1;        // |z| and z^2 taken as at most this
};
NoiseModel StatisticalNoise(const StatisticalInputs& inputs);

// The noise unit of one element: the ULP of max(|reference|, floor) in a
// dtype with the given epsilon, floor = half the rms of the head row (and
// at least the smallest normal of the output dtype).
double NoiseUnit(double reference, double row_rms, double epsilon,
                 DType output_dtype);

// Tests candidate - baseline over dense [rows = B * Sq, Hq, D] values;
// `reference` (R, unrounded) gives each element's magnitude. The rows are
// numbered b * Sq + s. Elements where either side is not finite are left
// out (the drift statistics count them). result.computed is false when no
// element could be tested.
StatisticalResult RunStatisticalTest(const double* candidate,
                                     const double* baseline,
                                     const double* reference, int64_t batch,
                                     int64_t queries, int64_t heads,
                                     int64_t dim,
                                     const StatisticalInputs& inputs);

// The Bernstein limit on a mean of n values with mean <= mu, standard
// deviation <= sd and values <= bound above the mean, at one-sided level
// delta: mu + (b l / 3 + sqrt((b l / 3)^2 + 2 sd^2 l n)) / n, l = ln(1 /
// delta).
double BernsteinLimit(double mu, double sd, double bound, int64_t n,
                      double delta);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_VERDICT_STATISTICAL_H_
