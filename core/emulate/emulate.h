// The emulated engine M: an engine's declared arithmetic replayed operation
// by operation, for engines that narrow their scores to 16 bits (Hugging
// Face eager attention: q.k^T written in the model dtype, the scaling and a
// soft-cap's three steps rounded again, the softmax in fp32 cast back to
// the model dtype, P.V accumulated in fp32 and written in the output
// dtype). Such an engine's scores are off by up to a 16-bit ulp, so its
// E-R tolerance must allow tens of percent of the output; E-M holds it to
// what its own arithmetic does instead (docs/NUMERICS.md, "The emulated
// engine").
//
// Every rounding the engine makes is made here from the exact value (fp64)
// of what it rounds. Where the engine's fp32 value of that operand may lie
// on either side of a rounding boundary (its dot product, exp and sums err
// by a bounded amount), the engine may have rounded either way: the
// operation is ambiguous, and each output element's tolerance counts what
// the other rounding would have moved it by. So the tolerance of an
// element is a few output ulps plus the rare ambiguous keys' effect, and a
// correct engine of this arithmetic is within it.
//
// Pure functions; thread-safe; reads the cache through `prepared` (which,
// with its snapshot, must outlive the call).
#ifndef ATTNAUDIT_CORE_EMULATE_EMULATE_H_
#define ATTNAUDIT_CORE_EMULATE_EMULATE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/engine/arithmetic.h"

namespace attnaudit {

// What the emulated engine replays, from the engine's resolved arithmetic.
struct EmulationPlan {
  bool run = false;
  // Why not, when the engine narrows its scores but cannot be emulated
  // (undeclared rounding, fp8 KV); empty when it keeps fp32 scores.
  std::string skipped;
  DType score_dtype = DType::kF32;
  bool score_truncates = false;
  DType probability_dtype = DType::kF32;
  bool probability_truncates = false;
  DType output_dtype = DType::kF32;
  bool output_truncates = false;
  // Hugging Face's GPT-OSS: the logits (sinks among them) minus their max
  // in the score dtype, then a softmax written in it.
  bool center_scores = false;
  double exp_epsilon = 0;  // the engine's exp, relative
  int64_t split_keys = 256;
  // A pre-RoPE snapshot's bound on |our score - the engine's| from
  // attnaudit's own rotation (PreparedAttention::rope_score_uncertainty):
  // every score's interval widens by it.
  double rope_score_uncertainty = 0;
};

// Runs when the engine narrows its scores to 16 bits with a declared (or
// measured) rounding and an f16/bf16/f32 cache.
EmulationPlan PlanEmulation(const PreparedAttention& prepared,
                            const EngineArithmetic& engine);

struct Emulation {
  std::vector<double> out;        // [B, Sq, Hq, D], output dtype values
  std::vector<double> tolerance;  // [B, Sq, Hq, D], absolute
  int64_t scores = 0;             // visible (key, query head) pairs
  int64_t ambiguous_scores = 0;   // whose rounding may have gone either way
};

// M and its per-element tolerance. Cancelled when `cancelled` turns true.
absl::StatusOr<Emulation> EmulateEngine(const PreparedAttention& prepared,
                                        const EmulationPlan& plan, int threads,
                                        const std::atomic<bool>* cancelled);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_EMULATE_EMULATE_H_
