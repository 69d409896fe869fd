// Tolerance policy and verdict. A comparison DRIFTs when any quantity has an
// element over its tolerance or a NaN/Inf where the baseline is finite; the
// report's verdict is DRIFT when any requested comparison drifts.
//
// Tolerances are dtype-aware and grow with the number of merged blocks k:
// an engine's fp32 left fold over k partial states is not bitwise, and its
// error grows ~linearly in k (P's tree, with log2 k, stays inside)
// (docs/NUMERICS.md, "Tolerances", gives the formulas and the measurements
// behind them). Every tolerance can be overridden per request. Pure functions;
// thread-safe.
#ifndef ATTNAUDIT_CORE_VERDICT_VERDICT_H_
#define ATTNAUDIT_CORE_VERDICT_VERDICT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/engine/arithmetic.h"
#include "core/report/report.h"

namespace attnaudit {

// Zero (the default) means "use the policy".
struct ToleranceOverrides {
  double out_abs = 0;
  double lse_abs = 0;
  double logprob_abs = 0;
};

struct Tolerances {
  double out_abs = 0;
  double lse_abs = 0;
  double logprob_abs = 0;
};

struct ToleranceInputs {
  Comparison comparison = Comparison::kEngineVsReference;
  DType output_dtype = DType::kF32;  // dtype of the compared out
  DType kv_dtype = DType::kF32;      // storage dtype of the KV pages
  int64_t max_merged_blocks = 1;     // largest k over the snapshot's queries
  int64_t max_context = 1;           // largest visible key count of a query
  double max_abs_out_reference = 1;  // max |R.out|, scales the out tolerance
  double max_abs_lse_reference = 1;  // max |R.lse|
  // max_v sum_i |lm_head[v, i]|: propagates the out tolerance to the
  // selected log-probs (docs/NUMERICS.md, "Tolerances"). 0: unknown, a
  // dtype-scaled constant is used instead.
  double lm_head_max_row_l1 = 0;
  // max_v ||lm_head[v, :]||_2. When known it takes precedence over the L1
  // bound: output drift is spread over Hq*D elements with mixed signs, so
  // a logit moves ~||W_v||_2 * |d out|, not ||W_v||_1 * |d out| (the L1
  // worst case is ~sqrt(Hq*D) times looser and never fires).
  double lm_head_max_row_l2 = 0;
  double logprob_temperature = 1;  // logits are divided by it
  // A context-parallel engine (W > 1) merges W per-rank partials with
  // weights exp(lse_k - lse): W more merges, and weights whose exponent
  // carries ~eps_f |lse| of rounding (docs/NUMERICS.md, "Tolerances").
  int64_t cp_world_size = 1;
  // The engine's declared arithmetic (core/engine/arithmetic.h). Zero
  // fields (the default) mean a flash-decoding engine of kv_dtype with
  // exact scores: no score term, probabilities by WorkingEpsilon(kv_dtype).
  EngineArithmetic engine;
  // The replay's own (ReplayArithmetic): its fp32 scores err like an fp32
  // engine's. Zero (the default): none.
  EngineArithmetic replay;
  // Pre-RoPE snapshots: a bound on |our score - the engine's| from
  // attnaudit's own RoPE (PreparedAttention), and max |V| (V scale applied),
  // through which it moves out.
  double rope_score_uncertainty = 0;
  double value_max = 0;
  // Its typical size (the pairs in quadrature), for the statistical
  // detector; not used by the tolerances.
  double rope_score_noise = 0;
};

// The absolute score error of an arithmetic: the relative error of its
// scores times the weighted mean |score| (at most max|lse| + ln L over L
// visible keys), plus its exp's; docs/NUMERICS.md, "Engine precision".
double ScoreError(const EngineArithmetic& arithmetic,
                  const ToleranceInputs& inputs);
// The engine's (inputs.engine).
double EngineScoreError(const ToleranceInputs& inputs);
// What one comparison's two sides may differ by in their scores: the
// engine's (E-R), the replay's (P-R) or both (E-P).
double ComparisonScoreError(const ToleranceInputs& inputs);

Tolerances ComputeTolerances(const ToleranceInputs& inputs,
                             const ToleranceOverrides& overrides);

// Rotation-boundary ambiguity of a pre-RoPE snapshot
// (PreparedAttention::row_score_uncertainty): per (b, s, h) row a score
// uncertainty, and per KV head the largest |v|. Empty: none.
struct RowScoreInputs {
  const std::vector<double>* row_score_uncertainty = nullptr;  // [B*Sq*Hq]
  const std::vector<double>* row_value_max = nullptr;          // [Hkv]
  int64_t q_heads = 1;
  int64_t kv_heads = 1;
  bool empty() const {
    return row_score_uncertainty == nullptr || row_score_uncertainty->empty();
  }
};

// What an engine comparison (E-R, E-P) adds to its tolerances on the rows
// whose scores carry such an uncertainty d, mirroring ComputeTolerances'
// use of rope_score_uncertainty: out by 2 max|v| d per element of the row
// (its KV head's max|v|), lse by d, and a token's log-prob by what its
// rows' largest out slack moves it (the log-prob bound's factor). Empty
// vectors where nothing is added (P-R, no ambiguity, or the quantity's
// tolerance overridden).
struct RowTolerances {
  std::vector<double> out;      // [B*Sq*Hq], per element of the row
  std::vector<double> lse;      // [B*Sq*Hq]
  std::vector<double> logprob;  // [B*Sq]
};
RowTolerances ComputeRowTolerances(const ToleranceInputs& inputs,
                                   const RowScoreInputs& rows,
                                   const ToleranceOverrides& overrides);

// The elements of candidate - baseline (n of them, in rows of
// n / row_extra.size()) beyond tolerance + their row's extra; a pair with a
// non-finite side is not counted (the drift statistics count it apart),
// nor one whose row is inactive in `active_mask` (per row; may be null).
int64_t CountOverRowTolerance(const double* candidate, const double* baseline,
                              int64_t n, double tolerance,
                              const std::vector<double>& row_extra,
                              const uint8_t* active_mask);

// The fp32 accumulation depth the tolerances assume: the merged blocks, or
// the splits of the engine's split size over the longest context, whichever
// is more, plus a CP engine's W combine merges (engine sides only).
double AccumulationDepth(const ToleranceInputs& inputs);

// Why an engine comparison (E-R or E-P) that found nothing wrong still
// verifies nothing a PASS promises, one line each; empty when it does:
// - its scores are beyond what the engine's arithmetic orders: a correct
//   engine's scores may be off by a nat or more (the softmax weights by a
//   factor e), at scores of this magnitude in this precision;
// - its out tolerance is at least the largest |R.out|: an all-zero output
//   (or any output of the right size) would pass.
// `tolerances` are the comparison's (overrides applied).
std::vector<std::string> InconclusiveReasons(const ToleranceInputs& inputs,
                                             const Tolerances& tolerances,
                                             bool has_out);

// The combine step of a context-parallel engine alone: its final out/lse
// against our fp32 merge of the engine's own W per-rank partials
// (docs/NUMERICS.md, "Context parallelism"). Both sides merge the same
// values in fp32 and round once to the output dtype, so they may differ by
// one rounding of the output plus the fp32 merge error over W states (an
// engine weighting by exp(lse_k - lse) carries eps_f |lse| per weight):
//   out_abs = A (eps_o + 4 W eps_f + 2 eps_f L) + 2 denorm_min(output)
//   lse_abs = eps_f (4 L + 2 W (L / 2 + 2))
// with A = max |merged out| and L = max(1, max |merged lse|). A combine in
// a lower precision (bf16), or one missing or doubling a partial, is far
// outside. Request overrides do not apply (they are for the final result).
struct CombineToleranceInputs {
  DType output_dtype = DType::kF32;
  int64_t world = 1;
  double max_abs_out = 0;
  double max_abs_lse = 0;
};
Tolerances ComputeCombineTolerances(const CombineToleranceInputs& inputs);

// Fills result->verdict and result->reasons from its stats (whose
// `tolerance` and `over_tolerance` fields the caller set via ComputeDrift)
// and, when has_statistical, from the statistical detector (statistical.h):
// a group that fired adds a reason starting "statistical:".
void DecideComparison(ComparisonResult* result);

// The gravest of the comparisons' verdicts (WorseVerdict); an undecided
// one counts as DRIFT; PASS with no comparisons.
Verdict CombineVerdicts(const std::vector<ComparisonResult>& results);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_VERDICT_VERDICT_H_
