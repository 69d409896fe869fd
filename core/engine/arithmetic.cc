// The engine profiles. Each value is what the profile's kernels do, read
// from their code and checked on real engine code by the conformance suite
// (docs/CONFORMANCE.md); docs/NUMERICS.md ("Engine precision") derives how
// each feeds the tolerances. Keep the three in step.
#include "core/engine/arithmetic.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace {

// torch's CPU flash attention, bf16/f16 inputs: the relative error of its
// LSE (see kTorchFlashCpu below).
const double kTorchFlash16BitLse = 128 * kEpsF32;

// Where the profiles end: the widest exp any profile has, and the narrowest
// score or probability dtype (16 bits). Beyond them a declaration widens
// the tolerances past what any known engine needs: an override.
constexpr int kWidestProfileExpUlps = 20;

ResolvedRounding Resolve(Rounding declared, bool undeclared) {
  switch (declared) {
    case Rounding::kNearestEven:
      return ResolvedRounding::kNearestEven;
    case Rounding::kTowardZero:
      return ResolvedRounding::kTowardZero;
    case Rounding::kProfile:
      break;
  }
  return undeclared ? ResolvedRounding::kEither
                    : ResolvedRounding::kNearestEven;
}

// The largest error of one rounding, in units of the dtype's epsilon:
// half an ulp to nearest, a whole one towards zero.
double RoundingUlps(ResolvedRounding rounding) {
  return rounding == ResolvedRounding::kNearestEven ? 0.5 : 1.0;
}

// The expected shrink towards zero of a truncation, in units of the
// dtype's epsilon: half an ulp; half that when either rounding may be.
double RoundingShrink(ResolvedRounding rounding) {
  switch (rounding) {
    case ResolvedRounding::kTowardZero:
      return 0.5;
    case ResolvedRounding::kEither:
      return 0.25;
    case ResolvedRounding::kNearestEven:
      break;
  }
  return 0.0;
}

// An fp32 dot product over D terms, summed in a tree or in blocks: about
// log2(D) roundings deep, plus the multiply by the softmax scale.
double Fp32ScoreEpsilon(int64_t head_dim) {
  const double depth =
      std::ceil(std::log2(static_cast<double>(std::max<int64_t>(2, head_dim))));
  return (depth + 1.0) * kEpsF32;
}

}  // namespace

double WorkingEpsilon(DType dtype) {
  if (IsFp8(dtype)) return kEpsBf16;  // dequantised into bf16 first
  const DTypeTraits& t = DTypeTraitsOf(dtype);
  return t.floating() && t.bytes == 2 ? t.epsilon() : kEpsF32;
}

EngineArithmetic ReplayArithmetic(int64_t head_dim, bool softcap) {
  EngineArithmetic a;
  a.profile = EngineProfile::kCustom;
  a.score_epsilon =
      Fp32ScoreEpsilon(head_dim) + (softcap ? 3.0 * kEpsF32 : 0.0);
  a.exp_epsilon = 4.0 * kEpsF32;
  a.probability_epsilon = kEpsF32;
  return a;
}

absl::string_view EngineProfileName(EngineProfile profile) {
  switch (profile) {
    case EngineProfile::kUnspecified:
      return "conservative";
    case EngineProfile::kCustom:
      return "custom";
    case EngineProfile::kFlashDecoding:
      return "flash-decoding";
    case EngineProfile::kVllmCpu:
      return "vllm-cpu";
    case EngineProfile::kHfEager:
      return "hf-eager";
    case EngineProfile::kTorchFlashCpu:
      return "torch-flash-cpu";
  }
  return "conservative";
}

OutputLean ExpectedOutputLean(const EngineArithmetic& arithmetic) {
  OutputLean lean;
  lean.ulps = RoundingShrink(arithmetic.output_rounding);
  lean.relative = arithmetic.probability_shrink;
  lean.known = arithmetic.output_rounding != ResolvedRounding::kEither &&
               (lean.relative == 0 ||
                arithmetic.probability_rounding != ResolvedRounding::kEither);
  return lean;
}

bool IsUndeclared(const EnginePrecision& declared) {
  return declared.Undeclared();
}

absl::string_view PrecisionSourceName(const EnginePrecision& declared) {
  switch (declared.source) {
    case PrecisionSource::kMeasured:
      return "measured";
    case PrecisionSource::kPreset:
      return "preset";
    case PrecisionSource::kUnspecified:
      break;
  }
  return IsUndeclared(declared) ? "undeclared" : "declared";
}

absl::string_view ResolvedRoundingName(ResolvedRounding rounding) {
  switch (rounding) {
    case ResolvedRounding::kTowardZero:
      return "toward-zero";
    case ResolvedRounding::kEither:
      return "either";
    case ResolvedRounding::kNearestEven:
      break;
  }
  return "nearest-even";
}

std::vector<std::string> PrecisionOverrides(const EnginePrecision& declared) {
  std::vector<std::string> lines;
  if (declared.exp_ulps > kWidestProfileExpUlps) {
    lines.push_back(absl::StrCat("precision.exp_ulps ", declared.exp_ulps,
                                 " (profiles: at most ", kWidestProfileExpUlps,
                                 ")"));
  }
  for (const auto& [field, dtype] :
       {std::pair<const char*, DType>{"precision.score_dtype",
                                      declared.score_dtype},
        {"precision.probability_dtype", declared.probability_dtype}}) {
    if (IsFp8(dtype)) {
      lines.push_back(absl::StrCat(field, " ", DTypeName(dtype),
                                   " (profiles: 16 bits or wider)"));
    }
  }
  return lines;
}

EngineArithmetic ResolveEngineArithmetic(const EnginePrecision& declared,
                                         DType model_dtype, DType kv_dtype,
                                         int64_t head_dim, bool softcap) {
  EngineArithmetic a;
  a.profile = declared.profile;
  a.undeclared = IsUndeclared(declared);
  a.score_rounding = Resolve(declared.score_rounding, a.undeclared);
  const ResolvedRounding score_rounding = a.score_rounding;
  a.probability_rounding = Resolve(declared.probability_rounding, a.undeclared);
  a.output_rounding = Resolve(declared.output_rounding, a.undeclared);
  a.rope_rounding = Resolve(declared.rope_rounding, a.undeclared);
  const double fp32_score = Fp32ScoreEpsilon(head_dim);
  // Per rounding of the score dtype: half an ulp (a whole one truncated):
  // q.k^T written in it, then scaled; a soft-cap divides, takes tanh and
  // multiplies (tanh's slope is at most 1, so each step's error passes
  // through).
  const double roundings = (softcap ? 5.0 : 2.0) * RoundingUlps(score_rounding);
  auto rounded_score = [&](DType dtype) {
    return std::max(roundings * WorkingEpsilon(dtype), fp32_score);
  };
  const double model_score = rounded_score(model_dtype);
  const bool model_16bit =
      model_dtype == DType::kBF16 || model_dtype == DType::kF16;
  const double kv_probability = WorkingEpsilon(kv_dtype);
  const double model_probability =
      std::max(WorkingEpsilon(model_dtype), kv_probability);
  int exp_ulps = 2;
  switch (declared.profile) {
    case EngineProfile::kUnspecified:
      // The widest envelope of every engine the conformance suite runs:
      // scores rounded to the model dtype (HF eager), the loosest exp
      // (torch's CPU flash), probabilities in the model dtype.
      a.score_epsilon = model_score;
      exp_ulps = kWidestProfileExpUlps;
      a.probability_epsilon = model_probability;
      break;
    case EngineProfile::kCustom:
      a.score_epsilon = fp32_score;
      a.probability_epsilon = kEpsF32;
      break;
    case EngineProfile::kFlashDecoding:
      // fp32 scores and softmax (ex2.approx: ~2 ulp); P rounded to the
      // tensor-core input dtype of the P.V product.
      a.score_epsilon = fp32_score;
      a.probability_epsilon = kv_probability;
      break;
    case EngineProfile::kVllmCpu:
      // fp32 scores and softmax on vectors of the model dtype's widened
      // values; P.V may use the model dtype's dot instructions.
      a.score_epsilon = fp32_score;
      exp_ulps = 4;
      a.probability_epsilon = model_probability;
      break;
    case EngineProfile::kHfEager:
      // matmul(q, k^T) returns the model dtype, "* scaling" rounds again;
      // softmax in fp32, cast back to the model dtype for matmul(P, V).
      a.score_epsilon = model_score;
      a.probability_epsilon = model_probability;
      a.score_dtype = model_dtype;
      a.probability_dtype = model_dtype;
      break;
    case EngineProfile::kTorchFlashCpu:
      // fp32 GEMM scores, a vectorised exp accurate to 20 ulp (exp_u20),
      // P rounded to the model dtype for the second GEMM. Its 16-bit path's
      // LSE is up to 55 eps_f32 (|lse| + ln L) from exact (measured over
      // D 64-256, L 1-2000, peaked and flat attention; NUMERICS.md): the
      // profile allows 128.
      a.score_epsilon =
          model_16bit ? std::max(kTorchFlash16BitLse, fp32_score) : fp32_score;
      exp_ulps = kWidestProfileExpUlps;
      a.probability_epsilon = model_probability;
      break;
  }
  if (declared.score_dtype != DType::kInvalid) {
    a.score_epsilon = rounded_score(declared.score_dtype);
    a.score_dtype = declared.score_dtype;
  }
  if (declared.probability_dtype != DType::kInvalid) {
    a.probability_epsilon = WorkingEpsilon(declared.probability_dtype);
    a.probability_dtype = declared.probability_dtype;
  }
  // Truncated probabilities all lose mass: out shrinks towards zero.
  if (a.probability_epsilon > kEpsF32) {
    a.probability_shrink =
        RoundingShrink(a.probability_rounding) * a.probability_epsilon;
  }
  if (declared.exp_ulps > 0) exp_ulps = declared.exp_ulps;
  a.exp_epsilon = exp_ulps * kEpsF32;
  if (declared.split_keys > 0) a.split_keys = declared.split_keys;
  return a;
}

}  // namespace attnaudit
