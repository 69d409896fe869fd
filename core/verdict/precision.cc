// The engine profiles. Each value is what the profile's kernels do, read
// from their code and checked on real engine code by the conformance suite
// (docs/CONFORMANCE.md); docs/NUMERICS.md ("Engine precision") derives how
// each feeds the tolerances. Keep the three in step.
#include "core/verdict/precision.h"

#include <algorithm>
#include <cmath>

namespace attnaudit {
namespace {

const double kEpsF32 = std::ldexp(1.0, -23);
// torch's CPU flash attention, bf16/f16 inputs: the relative error of its
// LSE (see kTorchFlashCpu below).
const double kTorchFlash16BitLse = 128 * kEpsF32;

// A 16-bit dtype's epsilon, or fp32's for anything wider.
double WorkingEpsilon(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
      return DTypeEpsilon(dtype);
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      // fp8 values are dequantised into bf16 before they are multiplied.
      return DTypeEpsilon(DType::kBF16);
    case DType::kInvalid:
    case DType::kF32:
    case DType::kF64:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      break;
  }
  return kEpsF32;
}

// An fp32 dot product over D terms, summed in a tree or in blocks: about
// log2(D) roundings deep, plus the multiply by the softmax scale.
double Fp32ScoreEpsilon(int64_t head_dim) {
  const double depth =
      std::ceil(std::log2(static_cast<double>(std::max<int64_t>(2, head_dim))));
  return (depth + 1.0) * kEpsF32;
}

}  // namespace

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

EngineArithmetic ResolveEngineArithmetic(const EnginePrecision& declared,
                                         DType model_dtype, DType kv_dtype,
                                         int64_t head_dim, bool softcap) {
  EngineArithmetic a;
  a.profile = declared.profile;
  const double fp32_score = Fp32ScoreEpsilon(head_dim);
  // Half an ulp of the score dtype per rounding: q.k^T written in it, then
  // scaled; a soft-cap divides, takes tanh and multiplies (tanh's slope is
  // at most 1, so each step's error passes through).
  const double roundings = softcap ? 5.0 : 2.0;
  auto rounded_score = [&](DType dtype) {
    return std::max(roundings * 0.5 * WorkingEpsilon(dtype), fp32_score);
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
      // Every fp32-score kernel below at once. Scores rounded to 16 bits
      // (HF eager) move a peaked softmax by several percent; an engine
      // that does that must say so (score_dtype or its profile).
      a.score_epsilon = fp32_score;
      exp_ulps = 20;
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
      break;
    case EngineProfile::kTorchFlashCpu:
      // fp32 GEMM scores, a vectorised exp accurate to 20 ulp (exp_u20),
      // P rounded to the model dtype for the second GEMM. Its 16-bit path's
      // LSE is up to 55 eps_f32 (|lse| + ln L) from exact (measured over
      // D 64-256, L 1-2000, peaked and flat attention; NUMERICS.md): the
      // profile allows 128.
      a.score_epsilon =
          model_16bit ? std::max(kTorchFlash16BitLse, fp32_score) : fp32_score;
      exp_ulps = 20;
      a.probability_epsilon = model_probability;
      break;
  }
  if (declared.score_dtype != DType::kInvalid) {
    a.score_epsilon = rounded_score(declared.score_dtype);
  }
  if (declared.probability_dtype != DType::kInvalid) {
    a.probability_epsilon = WorkingEpsilon(declared.probability_dtype);
  }
  if (declared.exp_ulps > 0) exp_ulps = declared.exp_ulps;
  a.exp_epsilon = exp_ulps * kEpsF32;
  if (declared.split_keys > 0) a.split_keys = declared.split_keys;
  return a;
}

}  // namespace attnaudit
