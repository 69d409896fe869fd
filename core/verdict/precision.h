// The engine's arithmetic, as the tolerances and the statistical detector
// need it: how far a correct engine's scores, exponentials and
// probabilities may be from exact, resolved from the snapshot's declared
// EnginePrecision (a profile and optional overrides; docs/NUMERICS.md,
// "Engine precision"). An undeclared engine gets the conservative profile:
// the loosest arithmetic of every engine the conformance suite runs.
//
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_CORE_VERDICT_PRECISION_H_
#define ATTNAUDIT_CORE_VERDICT_PRECISION_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "core/snapshot/snapshot.h"
#include "core/tensor/dtype.h"

namespace attnaudit {

struct EngineArithmetic {
  // Relative error of one score s_j = scale q.k_j before the softmax: the
  // fp32 dot product's roundings, or the score's own dtype (rounded twice:
  // the product and the scaling).
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
  // The effective profile, for the report ("flash-decoding", ...).
  EngineProfile profile = EngineProfile::kUnspecified;
};

// The engine's arithmetic for a snapshot whose queries are `model_dtype`,
// KV pages `kv_dtype`, head dim `head_dim`; `softcap` when it applies a
// logit soft-cap (an engine that rounds its scores rounds the capped ones
// three more times).
EngineArithmetic ResolveEngineArithmetic(const EnginePrecision& declared,
                                         DType model_dtype, DType kv_dtype,
                                         int64_t head_dim,
                                         bool softcap = false);

// The replay P's own arithmetic: fp32 scores (a D-term dot product, the
// vectorised tanh of a soft-cap within 3 ulp) and exp within 4 ulp; its
// probabilities stay in fp32.
EngineArithmetic ReplayArithmetic(int64_t head_dim, bool softcap);

// "conservative", "custom", "flash-decoding", "vllm-cpu", "hf-eager",
// "torch-flash-cpu".
absl::string_view EngineProfileName(EngineProfile profile);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_VERDICT_PRECISION_H_
