// The RoPE scalings whose frequencies depend on the sequence length the
// engine scaled for (RopeScaling::sequence_length): dynamic NTK and
// LongRoPE (docs/NUMERICS.md, "RoPE scaling by sequence length"). Internal
// to core/rope and core/rope_check.
//
// The formulas are Hugging Face transformers' (modeling_rope_utils:
// _compute_dynamic_ntk_parameters, _compute_longrope_parameters), which
// vLLM's DynamicNTKScalingRotaryEmbedding and
// Phi3LongRoPEScaledRotaryEmbedding compute the same way; the engines
// differ only in which sequence length they scale for, which the snapshot
// declares. In precision T: float as the engines compute (the order of
// their operations, so that a correct engine's fp32 values are ours to an
// ulp or two), double for the model's definition.
//
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_CORE_ROPE_SCALING_H_
#define ATTNAUDIT_CORE_ROPE_SCALING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {
namespace rope_internal {

// Dynamic NTK: inverse frequencies 1 / theta'^(2i/r) with
//   theta' = theta * (factor * S / L - (factor - 1))^(r / (r - 2)),
//   S = max(sequence_length, L), L = original_max_position, r = rotary_dim
// (theta' computed in double as Hugging Face does at initialisation and
// vLLM always does; Hugging Face's per-step update computes it in fp32,
// within an ulp of the same frequencies). InvalidArgument naming the field
// for factor < 1, a non-positive original_max_position or sequence_length,
// or rotary_dim < 4.
template <typename T>
absl::Status DynamicNtkInvFreq(const RopeConfig& config, int64_t rotary_dim,
                               std::vector<T>* inv_freq);

// LongRoPE: inverse frequencies 1 / (ext_i * theta^(2i/r)), ext the
// long_factor when UsesLongFactors, else the short_factor, rounded to T
// first as the engines do (a float32 tensor); *magnitude the attention
// factor (LongRopeMagnitude). InvalidArgument naming the field for factor
// lists that are not rotary_dim / 2 positive finite numbers, a
// non-positive original_max_position or sequence_length, a non-positive
// factor or an attention_factor outside (0, 1e6).
template <typename T>
absl::Status LongRopeInvFreq(const RopeConfig& config, int64_t rotary_dim,
                             std::vector<T>* inv_freq, T* magnitude);

// Whether LongRoPE rotates with its long factors: sequence_length >
// original_max_position (Hugging Face's test, per step; vLLM's, once, on
// max_model_len).
bool UsesLongFactors(const RopeScaling& s);

// LongRoPE's cos/sin magnitude in double: attention_factor when set, else
// sqrt(1 + ln(factor) / ln(original_max_position)), 1 for factor <= 1.
double LongRopeMagnitude(const RopeScaling& s);

// Ulps an engine's fp32 inverse frequency may be from ours under `s`: its
// pow, and with scaling the order of the scaling arithmetic too (measured
// within 1.5 ulps of the exact value for dynamic NTK on Hugging Face's
// fp32 path).
double InvFreqUlps(const RopeScaling& s);

}  // namespace rope_internal

// The sequence lengths a RoPE bug hypothesis ("rope-scaling-length") tries
// for an engine that scaled for another length than `declared` says, with
// a line saying what each means; empty for a scaling that reads none.
// LongRoPE: a length that selects the other factor set. Dynamic NTK: the
// step's largest position + 1 (Hugging Face's rule), factor x
// original_max_position (one cache for the whole context) and twice or
// half the declared length; lengths at or below original_max_position are
// left out (that is the scaling ignored, a hypothesis of its own).
struct ScalingLengthCandidate {
  int64_t sequence_length = 0;
  std::string detail;
};
std::vector<ScalingLengthCandidate> CandidateScalingLengths(
    const RopeScaling& declared, int64_t max_query_position);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ROPE_SCALING_H_
