// Tolerance policy and verdict. The formulas, their derivation and the
// measurements behind the constants are in docs/NUMERICS.md ("Tolerances");
// keep the two in step.
#include "core/verdict/verdict.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace {

// Keys per split of a flash-decoding engine: the least accumulation depth
// an engine has over a long context, whatever the page size.
constexpr int64_t kEngineSplitKeys = 256;
// Weight of the fp32 accumulation term per merged block. An fp32 left fold
// (an engine's; P itself merges in a tree, losing far less) loses up to
// ~0.7 k eps_f32 relative (measured, NUMERICS.md); 2 keeps it inside with
// room.
constexpr double kFoldCoefficient = 2.0;
// fp32 arithmetic inside one block's state, per side (measured: an f32
// output at 40-60 keys drifted 1.1x over the fold term alone).
constexpr double kBlockEpsilons = 8.0;
// A score error this large (nats) leaves the softmax weights undetermined
// to a factor e: nothing finer can be verified.
constexpr double kOrderedScoreError = 1.0;
// fp32 log-softmax over a large vocabulary (and the rounding of the result).
const double kLogprobFloor = std::ldexp(1.0, -14);

double NonNegativeOr(double value, double fallback) {
  return std::isfinite(value) && value >= 0 ? value : fallback;
}

std::string LocationString(const Location& loc) {
  std::string s = absl::StrCat("b=", loc.batch, " s=", loc.query);
  if (loc.head >= 0) absl::StrAppend(&s, " h=", loc.head);
  if (loc.dim >= 0) absl::StrAppend(&s, " d=", loc.dim);
  return s;
}

void AddReasons(Quantity quantity, const DriftStats& stats,
                std::vector<std::string>* reasons) {
  const absl::string_view name = QuantityName(quantity);
  const char* unit = quantity == Quantity::kLogprob ? "tokens" : "elements";
  if (stats.over_tolerance > 0) {
    reasons->push_back(absl::StrFormat(
        "%s: %d of %d %s over tolerance %.1e (max_abs %.1e at %s)", name,
        stats.over_tolerance, stats.count, unit, stats.tolerance, stats.max_abs,
        LocationString(stats.worst)));
  }
  if (stats.nonfinite_mismatch > 0) {
    reasons->push_back(absl::StrFormat(
        "%s: %d %s NaN/Inf on one side only (candidate %d NaN, %d Inf; "
        "baseline %d NaN, %d Inf; first at %s)",
        name, stats.nonfinite_mismatch, unit, stats.candidate_nan,
        stats.candidate_inf, stats.baseline_nan, stats.baseline_inf,
        LocationString(stats.first_nonfinite_mismatch)));
  }
}

std::string GroupName(const StatisticalGroup& g) {
  if (g.scope == "row") {
    return absl::StrCat("row b=", g.where.batch, " s=", g.where.query);
  }
  if (g.scope == "head") return absl::StrCat("head ", g.where.head);
  return "all elements";
}

// "statistical: out rms 1.21 noise units (limit 0.52, clean ~0.40) over
// 4096 elements of row b=0 s=0; 3 of 41 groups fired"
void AddStatisticalReason(const StatisticalResult& st,
                          std::vector<std::string>* reasons) {
  if (!st.computed || st.fired_groups == 0) return;
  const StatisticalGroup* worst = nullptr;
  for (const StatisticalGroup& g : st.worst) {
    if (g.fired && (worst == nullptr || g.count > worst->count)) worst = &g;
  }
  if (worst == nullptr) return;
  std::string what;
  if (worst->rms > worst->rms_limit) {
    what = absl::StrFormat("rms %.3g noise units (limit %.3g, clean ~%.2f)",
                           worst->rms, worst->rms_limit, st.clean_rms);
  } else if (std::fabs(worst->mean) > worst->mean_limit) {
    what = absl::StrFormat("mean signed error %.3g noise units (limit %.3g)",
                           worst->mean, worst->mean_limit);
  } else {
    what = absl::StrFormat("bias towards zero %.3g noise units (limit %.3g)",
                           worst->bias, worst->mean_limit);
  }
  reasons->push_back(absl::StrFormat(
      "statistical: out %s over %d elements of %s; %d of %d groups fired", what,
      worst->count, GroupName(*worst), st.fired_groups, st.groups));
}

}  // namespace

double ScoreError(const EngineArithmetic& arithmetic,
                  const ToleranceInputs& inputs) {
  const double l = std::max(
      1.0, NonNegativeOr(std::fabs(inputs.max_abs_lse_reference), 1.0));
  const double keys =
      static_cast<double>(std::max<int64_t>(1, inputs.max_context));
  // sum_j p_j |s_j| = sum_j p_j |lse + ln p_j| <= |lse| + entropy.
  const double mean_abs_score = l + std::log(keys);
  return arithmetic.score_epsilon * mean_abs_score + arithmetic.exp_epsilon;
}

double EngineScoreError(const ToleranceInputs& inputs) {
  return ScoreError(inputs.engine, inputs);
}

double ComparisonScoreError(const ToleranceInputs& inputs) {
  switch (inputs.comparison) {
    case Comparison::kEngineVsReference:
    case Comparison::kEngineVsEmulation:  // its own tolerance (core/emulate)
      return ScoreError(inputs.engine, inputs);
    case Comparison::kReplayVsReference:
      return ScoreError(inputs.replay, inputs);
    case Comparison::kEngineVsReplay:
      return ScoreError(inputs.engine, inputs) +
             ScoreError(inputs.replay, inputs);
  }
  return 0.0;
}

Tolerances ComputeTolerances(const ToleranceInputs& inputs,
                             const ToleranceOverrides& overrides) {
  const bool engine = inputs.comparison != Comparison::kReplayVsReference;
  // Sides that carry an fp32 accumulation error: E-P has two.
  const double sides =
      inputs.comparison == Comparison::kEngineVsReplay ? 2.0 : 1.0;
  const double eps_out = IsFloating(inputs.output_dtype)
                             ? DTypeEpsilon(inputs.output_dtype)
                             : kEpsF32;
  const double eps_compute = inputs.engine.probability_epsilon > 0
                                 ? inputs.engine.probability_epsilon
                                 : WorkingEpsilon(inputs.kv_dtype);
  const bool fp8 = engine && IsFp8(inputs.kv_dtype);

  // A: out magnitude; L: lse magnitude (at least 1); n: accumulation depth.
  const double a = NonNegativeOr(inputs.max_abs_out_reference, 0.0);
  const double l = std::max(
      1.0, NonNegativeOr(std::fabs(inputs.max_abs_lse_reference), 1.0));
  const bool cp = engine && inputs.cp_world_size > 1;
  const double n = AccumulationDepth(inputs);
  // A score off by delta moves the softmax weights by ~delta relative:
  // the LSE by delta, out by up to twice |v - out| <~ 2A times delta
  // (either side's scores: the engine's, the replay's fp32 ones).
  const double score_error = ComparisonScoreError(inputs);
  const double rope_error =
      engine ? NonNegativeOr(inputs.rope_score_uncertainty, 0.0) : 0.0;

  Tolerances t;
  // Rounding of the final write(s), in ULPs of the output dtype at A, plus
  // the fp32 accumulation over n merges, plus the fp8 dequant rounding.
  double out_rel = engine ? std::max(2.0 * eps_out, eps_compute) : eps_out;
  out_rel += kFoldCoefficient * sides * n * kEpsF32;
  // Within each side's blocks: exp (<= 2 ulp), the sums and the division.
  out_rel += kBlockEpsilons * sides * kEpsF32;
  // Its weights exp(lse_k - lse) are off by ~eps_f |lse| relative each.
  if (cp) out_rel += 2.0 * kEpsF32 * l;
  if (fp8) out_rel += kEpsBf16 * l / 4.0;
  out_rel += 2.0 * score_error;
  t.out_abs = a * out_rel + 2.0 * DTypeDenormMin(inputs.output_dtype) +
              2.0 * NonNegativeOr(inputs.value_max, 0.0) * rope_error;

  // Per fp32 merge step: half an ULP of |lse| plus ~2 eps from log/exp.
  t.lse_abs = kEpsF32 * (4.0 * l + sides * n * (0.5 * l + 2.0));
  if (fp8) t.lse_abs += kEpsBf16 * l / 2.0;
  t.lse_abs += score_error + rope_error;

  // |d lp| <= 2 max_v |d z_v| <= 2 out_abs * max_v ||W_v||_1 / T, plus the
  // engine rounding its logits (|z| <= A ||W||_1 / T) to its compute type.
  const double temperature = inputs.logprob_temperature > 0 &&
                                     std::isfinite(inputs.logprob_temperature)
                                 ? inputs.logprob_temperature
                                 : 1.0;
  const double w = NonNegativeOr(inputs.lm_head_max_row_l1, 0.0) / temperature;
  const double w2 = NonNegativeOr(inputs.lm_head_max_row_l2, 0.0) / temperature;
  if (w2 > 0) {
    // Statistical bound: |d z_v| <~ 2 * out_abs * ||W_v||_2 (a 2x margin
    // over the per-element tolerance acting coherently on a unit direction),
    // and |d lp| <= 2 max_v |d z_v|.
    t.logprob_abs =
        (4.0 * t.out_abs + (engine ? 2.0 * eps_compute * a : 0.0)) * w2 +
        kLogprobFloor;
  } else if (w > 0) {
    t.logprob_abs = (2.0 * t.out_abs + (engine ? eps_compute * a : 0.0)) * w +
                    kLogprobFloor;
  } else {
    t.logprob_abs = 4.0 * std::max(eps_out, eps_compute) + kLogprobFloor;
  }

  if (overrides.out_abs > 0) t.out_abs = overrides.out_abs;
  if (overrides.lse_abs > 0) t.lse_abs = overrides.lse_abs;
  if (overrides.logprob_abs > 0) t.logprob_abs = overrides.logprob_abs;
  return t;
}

RowTolerances ComputeRowTolerances(const ToleranceInputs& inputs,
                                   const RowScoreInputs& rows,
                                   const ToleranceOverrides& overrides) {
  RowTolerances t;
  if (inputs.comparison == Comparison::kReplayVsReference || rows.empty()) {
    return t;
  }
  const std::vector<double>& delta = *rows.row_score_uncertainty;
  const int64_t n = static_cast<int64_t>(delta.size());
  const int64_t q_heads = std::max<int64_t>(1, rows.q_heads);
  const int64_t group =
      std::max<int64_t>(1, q_heads / std::max<int64_t>(1, rows.kv_heads));
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const size_t g = static_cast<size_t>((r % q_heads) / group);
    const double v = rows.row_value_max != nullptr &&
                             g < rows.row_value_max->size()
                         ? NonNegativeOr((*rows.row_value_max)[g], 0.0)
                         : NonNegativeOr(inputs.value_max, 0.0);
    out[r] = 2.0 * v * NonNegativeOr(delta[r], 0.0);
  }
  if (overrides.lse_abs <= 0) {
    t.lse.resize(delta.size());
    for (int64_t r = 0; r < n; ++r) t.lse[r] = NonNegativeOr(delta[r], 0.0);
  }
  // The log-prob bound is linear in out_abs (ComputeTolerances): the same
  // factor carries a token's largest row slack.
  const double temperature = inputs.logprob_temperature > 0 &&
                                     std::isfinite(inputs.logprob_temperature)
                                 ? inputs.logprob_temperature
                                 : 1.0;
  const double w = NonNegativeOr(inputs.lm_head_max_row_l1, 0.0) / temperature;
  const double w2 = NonNegativeOr(inputs.lm_head_max_row_l2, 0.0) / temperature;
  const double factor = w2 > 0 ? 4.0 * w2 : 2.0 * w;
  if (overrides.logprob_abs <= 0 && factor > 0) {
    t.logprob.assign(static_cast<size_t>(n / q_heads), 0.0);
    for (int64_t r = 0; r < n; ++r) {
      double& lp = t.logprob[r / q_heads];
      lp = std::max(lp, factor * out[r]);
    }
  }
  if (overrides.out_abs <= 0) t.out = std::move(out);
  return t;
}

int64_t CountOverRowTolerance(const double* candidate, const double* baseline,
                              int64_t n, double tolerance,
                              const std::vector<double>& row_extra,
                              const uint8_t* active_mask) {
  const int64_t rows = static_cast<int64_t>(row_extra.size());
  // Extras that do not tile the values (a caller's slip) widen nothing.
  const bool per_row = rows > 0 && n % rows == 0;
  const int64_t length = per_row ? n / rows : 1;
  int64_t over = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = i / length;
    if (active_mask != nullptr && active_mask[row] == 0) continue;
    if (!std::isfinite(candidate[i]) || !std::isfinite(baseline[i])) continue;
    const double extra = per_row ? row_extra[row] : 0.0;
    over += std::fabs(candidate[i] - baseline[i]) > tolerance + extra;
  }
  return over;
}

double AccumulationDepth(const ToleranceInputs& inputs) {
  const bool engine = inputs.comparison != Comparison::kReplayVsReference;
  const int64_t context = std::max<int64_t>(1, inputs.max_context);
  // A CP engine's combine merges W more partials (engine sides only).
  const int64_t cp =
      engine && inputs.cp_world_size > 1 ? inputs.cp_world_size : 0;
  const int64_t split = inputs.engine.split_keys > 0 ? inputs.engine.split_keys
                                                     : kEngineSplitKeys;
  return static_cast<double>(std::max({int64_t{1}, inputs.max_merged_blocks,
                                       (context + split - 1) / split}) +
                             cp);
}

std::vector<std::string> InconclusiveReasons(const ToleranceInputs& inputs,
                                             const Tolerances& tolerances,
                                             bool has_out) {
  std::vector<std::string> reasons;
  const double score_error = EngineScoreError(inputs);
  if (!(score_error < kOrderedScoreError)) {
    reasons.push_back(absl::StrFormat(
        "scores: at max |lse| %.3g a correct engine's scores may be off by "
        "%.3g nats in its precision (%s): the softmax weights are undetermined "
        "to a factor e or more",
        inputs.max_abs_lse_reference, score_error,
        EngineProfileName(inputs.engine.profile)));
  }
  const double a = NonNegativeOr(inputs.max_abs_out_reference, 0.0);
  if (has_out && !(tolerances.out_abs < a)) {
    reasons.push_back(absl::StrFormat(
        "out: the tolerance %.3g is at least the largest |R.out| %.3g: an "
        "all-zero output would pass",
        tolerances.out_abs, a));
  }
  return reasons;
}

Tolerances ComputeCombineTolerances(const CombineToleranceInputs& inputs) {
  const double eps_out = IsFloating(inputs.output_dtype)
                             ? DTypeEpsilon(inputs.output_dtype)
                             : kEpsF32;
  const double w = static_cast<double>(std::max<int64_t>(1, inputs.world));
  const double a = NonNegativeOr(inputs.max_abs_out, 0.0);
  const double l =
      std::max(1.0, NonNegativeOr(std::fabs(inputs.max_abs_lse), 1.0));
  Tolerances t;
  // An engine may weight by exp(lse_k - lse) directly: eps_f |lse| each.
  t.out_abs = a * (eps_out + 4.0 * w * kEpsF32 + 2.0 * kEpsF32 * l) +
              2.0 * DTypeDenormMin(inputs.output_dtype);
  t.lse_abs = kEpsF32 * (4.0 * l + 2.0 * w * (0.5 * l + 2.0));
  return t;
}

void DecideComparison(ComparisonResult* result) {
  result->reasons.clear();
  if (result->has_out)
    AddReasons(Quantity::kOut, result->out, &result->reasons);
  if (result->has_lse)
    AddReasons(Quantity::kLse, result->lse, &result->reasons);
  if (result->has_logprob) {
    AddReasons(Quantity::kLogprob, result->logprob, &result->reasons);
  }
  if (result->has_statistical) {
    AddStatisticalReason(result->statistical, &result->reasons);
  }
  result->verdict = result->reasons.empty() ? Verdict::kPass : Verdict::kDrift;
}

Verdict CombineVerdicts(const std::vector<ComparisonResult>& results) {
  Verdict verdict = Verdict::kPass;
  for (const ComparisonResult& r : results) {
    verdict = WorseVerdict(verdict, r.verdict == Verdict::kUnspecified
                                        ? Verdict::kDrift
                                        : r.verdict);
  }
  return verdict;
}

}  // namespace attnaudit
