// The engine's arithmetic, as the tolerances and the statistical detector
// need it: how far a correct engine's scores, exponentials, probabilities,
// output and RoPE may be from exact, and which way its roundings lean,
// resolved from the snapshot's declared EnginePrecision (a profile, fields
// that replace its values, per-operation roundings; docs/NUMERICS.md,
// "Engine precision"). An undeclared engine gets the widest envelope of
// every engine the conformance suite runs: 16-bit scores, a 20-ulp exp,
// probabilities in the model dtype, either rounding of its output and RoPE.
//
// This is the one home of what attnaudit knows of engines' arithmetic; the
// Python client's presets name these profiles.
//
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_CORE_ENGINE_ARITHMETIC_H_
#define ATTNAUDIT_CORE_ENGINE_ARITHMETIC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/snapshot/snapshot.h"
#include "core/tensor/dtype.h"

namespace attnaudit {

// How an engine narrows a value, once resolved: a declared rounding, or
// kEither when nothing says (an undeclared engine may do either).
enum class ResolvedRounding : int { kNearestEven, kTowardZero, kEither };

struct EngineArithmetic {
  // Relative error of one score s_j = scale q.k_j before the softmax: the
  // fp32 dot product's roundings, or the score's own dtype (rounded twice:
  // the product and the scaling; a full ulp each when truncated).
  double score_epsilon = 0;
  // Relative error of the engine's exp (its ulps times eps_f32): an
  // absolute error of that size on every score.
  double exp_epsilon = 0;
  // Relative precision of the probabilities in P.V (bf16 / f16 for kernels
  // that round them; eps_f32 when kept in fp32).
  double probability_epsilon = 0;
  // Keys per split of a split-KV kernel: the least accumulation depth an
  // engine has over a long context.
  int64_t split_keys = 256;
  // How the engine rounds its output to the output dtype and its rotated q
  // and k to their dtypes.
  ResolvedRounding output_rounding = ResolvedRounding::kNearestEven;
  ResolvedRounding rope_rounding = ResolvedRounding::kNearestEven;
  ResolvedRounding probability_rounding = ResolvedRounding::kNearestEven;
  // The expected relative shrink of out towards zero from probabilities
  // truncated for P.V (each loses half an ulp on average): probability
  // epsilon / 2 when truncated, half that when either rounding may be.
  double probability_shrink = 0;
  // The dtypes the engine narrows its scores and its probabilities to
  // (kF32: kept in fp32), with score_rounding; what the emulated engine
  // (core/emulate) replays.
  DType score_dtype = DType::kF32;
  ResolvedRounding score_rounding = ResolvedRounding::kNearestEven;
  DType probability_dtype = DType::kF32;
  // The effective profile, for the report ("flash-decoding", ...).
  EngineProfile profile = EngineProfile::kUnspecified;
  // Nothing declared: the widest envelope (undeclared_sensitivity says what
  // it costs).
  bool undeclared = false;
};

// The engine's arithmetic for a snapshot whose queries are `model_dtype`,
// KV pages `kv_dtype`, head dim `head_dim`; `softcap` when it applies a
// logit soft-cap (an engine that rounds its scores rounds the capped ones
// three more times).
EngineArithmetic ResolveEngineArithmetic(const EnginePrecision& declared,
                                         DType model_dtype, DType kv_dtype,
                                         int64_t head_dim,
                                         bool softcap = false);

// Which way a correct engine's output leans, on average, from its roundings:
// towards zero by `ulps` of the output dtype (a truncated output: 0.5) plus
// `relative` of its magnitude (truncated probabilities); `known` is false
// when either rounding may be (an undeclared engine), so the lean lies
// anywhere from none to twice these.
struct OutputLean {
  double ulps = 0;
  double relative = 0;
  bool known = true;
};
OutputLean ExpectedOutputLean(const EngineArithmetic& arithmetic);

// The relative precision engines multiply values stored in `dtype` in
// (the P.V product of a KV cache of `dtype`, a declared score or
// probability dtype): tensor-core engines round to a 16-bit dtype's own
// epsilon, to bf16's for fp8 (dequantised into bf16 before it is
// multiplied); anything wider keeps fp32's.
double WorkingEpsilon(DType dtype);

// True when the snapshot declares nothing of its engine's arithmetic.
bool IsUndeclared(const EnginePrecision& declared);

// The replay P's own arithmetic: fp32 scores (a D-term dot product, the
// vectorised tanh of a soft-cap within 3 ulp) and exp within 4 ulp; its
// probabilities stay in fp32.
EngineArithmetic ReplayArithmetic(int64_t head_dim, bool softcap);

// The declaration's departures from every profile's documented range
// (docs/NUMERICS.md, "Engine precision"): an exp worse than 20 ulps, an
// 8-bit score or probability dtype. Each is a client override of the policy
// (it widens the tolerances past what any known engine needs), one line
// each, e.g. "precision.exp_ulps 1048576 (profiles: at most 20)".
std::vector<std::string> PrecisionOverrides(const EnginePrecision& declared);

// "conservative", "custom", "flash-decoding", "vllm-cpu", "hf-eager",
// "torch-flash-cpu".
absl::string_view EngineProfileName(EngineProfile profile);

// "measured", "preset", "declared" (a declaration without a source) or
// "undeclared".
absl::string_view PrecisionSourceName(const EnginePrecision& declared);

// "nearest-even", "toward-zero", "either".
absl::string_view ResolvedRoundingName(ResolvedRounding rounding);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ENGINE_ARITHMETIC_H_
