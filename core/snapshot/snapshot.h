// The decode snapshot: everything one attention call of one layer at one
// decode step read and wrote, for a batch of B sequences. This is the core's
// model of proto/attnaudit/v1/snapshot.proto (the codec maps one to the other
// field by field); docs/DESIGN.md §2 and docs/NUMERICS.md define the
// semantics.
//
// Shapes (B batch, Sq queries per sequence, Hq/Hkv heads, D head dim,
// N pages sent, P page size, M max blocks per sequence):
//   q                 [B, Sq, Hq, D]       floating
//   k_pages, v_pages  [N, P, Hkv, D] (NHD) or [N, Hkv, P, D] (HND)
//   block_table       [B, M] i32/i64       logical block -> page, tail -1
//   kv_seq_lens       [B] i32/i64
//   query_positions   [B, Sq] i32/i64      global position of each query
//   slot_positions    [N, P] i32/i64       global position per slot, -1 unused
//   key_rope_positions[N, P] optional      RoPE position per slot (default:
//                                          slot_positions)
// A Snapshot is a plain value: no invariants hold until ValidateSnapshot
// (core/validate) returned OK. Not thread-safe to mutate; read-only sharing
// is fine.
#ifndef ATTNAUDIT_CORE_SNAPSHOT_SNAPSHOT_H_
#define ATTNAUDIT_CORE_SNAPSHOT_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace attnaudit {

enum class KvLayout : int { kNHD = 0, kHND = 1 };

enum class RopeState : int {
  kPostRope = 0,  // already rotated (what engines usually cache)
  kPreRope = 1,   // the auditor applies RoPE
};

enum class RopeStyle : int {
  kNeox = 0,  // rotate-half: pairs (i, i + rotary_dim/2)
  kGptj = 1,  // interleaved: pairs (2i, 2i + 1)
};

enum class RopeScalingType : int {
  kNone = 0,
  kLinear = 1,    // positions / factor
  kLlama3 = 2,    // Llama 3.1 frequency-band scaling
  kYarn = 3,      // YaRN ramp between interpolation and extrapolation
  kDynamic = 4,   // dynamic NTK: theta raised for the sequence length
  kLongRope = 5,  // LongRoPE: per-frequency short / long divisors
};

// The most entries a LongRoPE factor list may have on the wire (the codec
// refuses more before copying; validation wants exactly rotary_dim / 2).
inline constexpr size_t kMaxRopeFactorEntries = 1 << 15;

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;  // llama3, yarn, dynamic, longrope
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  // YaRN's and LongRoPE's cos/sin magnitude factor; 0 means the method's
  // default (0.1*ln(factor)+1; sqrt(1 + ln(factor)/ln(original_max_position))).
  double attention_factor = 0.0;
  // YaRN: floor/ceil the correction range's bounds (false: keep them
  // fractional, Hugging Face's truncate=false, as GPT-OSS).
  bool truncate = true;
  // dynamic and longrope: the sequence length the engine scaled for (> 0).
  int64_t sequence_length = 0;
  // longrope: rotary_dim / 2 divisors each, short up to
  // original_max_position, long beyond.
  std::vector<double> short_factor, long_factor;
};

// Where the engine rounds while it rotates (the RoPE arithmetic profile;
// docs/NUMERICS.md, "RoPE arithmetic"). "The rotation dtype" is the dtype
// the rotated values are cast to (q_output_dtype / k_output_dtype).
enum class RopeCastPoint : int {
  kAfterRope = 0,  // fp32 cos/sin and rotation, one cast afterwards
  kCosSin = 1,     // cos/sin rounded to the rotation dtype first (vLLM)
  kEachOp = 2,     // each product and the sum rounded too (Hugging Face)
};

struct RopeConfig {
  RopeState q_state = RopeState::kPostRope;
  RopeState k_state = RopeState::kPostRope;
  RopeStyle style = RopeStyle::kNeox;
  double theta = 10000.0;
  int64_t rotary_dim = 0;  // 0 means head_dim; must be even and <= head_dim
  RopeScaling scaling;
  RopeCastPoint cast_point = RopeCastPoint::kAfterRope;
  // dtype q / K are cast to after RoPE; kInvalid means "the input's dtype".
  DType q_output_dtype = DType::kInvalid;
  DType k_output_dtype = DType::kInvalid;
};

// The engine's own RoPE values (docs/NUMERICS.md, "RoPE tables"): rows of
// its cos/sin cache for some positions, and/or its inverse frequencies.
// All optional; rows take precedence over inv_freq for their positions.
struct EngineRopeTable {
  Tensor inv_freq;   // f32 [rotary_dim / 2]
  Tensor positions;  // [T] i32/i64, distinct, >= 0
  Tensor cos;        // [T, rotary_dim / 2] floating, magnitude included
  Tensor sin;        // [T, rotary_dim / 2] floating
  bool present() const { return inv_freq.present() || positions.present(); }
};

// The rolling RoPE check's inputs: this step's q and new keys before RoPE.
struct PreRopeInputs {
  Tensor q;  // [B, Sq, Hq, D], with rope.q_state post
  Tensor k;  // [B, Sq, Hkv, D]: the key written at each query's position
};

// How the engine's attention kernel rounds (docs/NUMERICS.md, "Engine
// precision"). kUnspecified is a conservative profile that covers every
// kernel keeping its scores in fp32; 16-bit scores must be declared.
enum class EngineProfile : int {
  kUnspecified = 0,
  kCustom = 1,         // the explicit fields only; fp32 elsewhere
  kFlashDecoding = 2,  // GPU flash-decoding: fp32 scores, P in the KV dtype
  kVllmCpu = 3,        // vLLM's CPU attention
  kHfEager = 4,        // HF eager: scores and P in the model dtype
  kTorchFlashCpu = 5,  // torch's CPU flash attention (sdpa on the CPU)
};

// How an engine narrows an fp32 value to a 16-bit dtype.
enum class Rounding : int {
  kProfile = 0,      // unset: the profile's (nearest-even for every profile)
  kNearestEven = 1,  // IEEE round to nearest, ties to even
  kTowardZero = 2,   // truncation (vLLM's CPU bf16 without AVX512_BF16)
};

// The longest EnginePrecision::evidence a snapshot may carry.
inline constexpr size_t kMaxPrecisionEvidenceBytes = 1024;

// Where a precision declaration came from (reported as it is).
enum class PrecisionSource : int {
  kUnspecified = 0,  // written by hand, or nothing declared
  kPreset = 1,       // a named engine preset
  kMeasured = 2,     // the engine probe ran the engine's ops on the host
};

struct EnginePrecision {
  EngineProfile profile = EngineProfile::kUnspecified;
  // Each replaces the profile's value when set (kInvalid / 0: unset).
  DType score_dtype = DType::kInvalid;
  DType probability_dtype = DType::kInvalid;
  int exp_ulps = 0;
  int64_t split_keys = 0;
  Rounding score_rounding = Rounding::kProfile;
  Rounding probability_rounding = Rounding::kProfile;
  Rounding output_rounding = Rounding::kProfile;
  Rounding rope_rounding = Rounding::kProfile;
  PrecisionSource source = PrecisionSource::kUnspecified;
  std::string evidence;  // at most kMaxPrecisionEvidenceBytes (validated)

  // Nothing declared: no profile, field, rounding or source (an undeclared
  // engine is audited with the widest envelope; core/engine/arithmetic.h).
  bool Undeclared() const {
    return profile == EngineProfile::kUnspecified &&
           score_dtype == DType::kInvalid &&
           probability_dtype == DType::kInvalid && exp_ulps == 0 &&
           split_keys == 0 && score_rounding == Rounding::kProfile &&
           probability_rounding == Rounding::kProfile &&
           output_rounding == Rounding::kProfile &&
           rope_rounding == Rounding::kProfile &&
           source == PrecisionSource::kUnspecified;
  }
};

enum class CpSharding : int {
  kNone = 0,              // cp_world_size 1
  kExplicitOwners = 1,    // cp_block_owners gives the rank of each block
  kTokenInterleaved = 2,  // token t on rank (t / interleave) % world (vLLM DCP)
  kPageInterleaved = 3,   // logical block i on rank i % world
};

struct CpConfig {
  int64_t world_size = 1;
  CpSharding sharding = CpSharding::kNone;
  int64_t interleave_size = 1;  // kTokenInterleaved only
  Tensor block_owners;          // [B, M] i32/i64, kExplicitOwners only
  // Optional: the engine's per-rank partial states before its combine.
  Tensor rank_out;  // [world, B, Sq, Hq, D] floating
  Tensor rank_lse;  // [world, B, Sq, Hq] floating, base engine.lse_base
};

enum class LseBase : int { kE = 0, k2 = 1 };

struct EngineOutput {
  Tensor out;  // [B, Sq, Hq, D]
  Tensor lse;  // [B, Sq, Hq]
  LseBase lse_base = LseBase::kE;
  Tensor logprobs;  // [B, Sq] the engine's selected-token log-probs
};

struct PrefixCache {
  bool enabled = false;
  std::string key;
  int64_t length = 0;       // tokens of the shared prefix, all rows
  std::string fingerprint;  // lowercase hex SHA-256 the client expects
  // Which fingerprint definition `fingerprint` uses.
  enum class Scheme : int { kAttnauditV1 = 0, kRlKernelCompat = 1 };
  Scheme scheme = Scheme::kAttnauditV1;
};

// Which side of a train-rollout pair a snapshot is (server/pairs joins a
// rollout and a trainer snapshot of one run and layer by their rows).
enum class SnapshotRole : int { kNone = 0, kRollout = 1, kTrainer = 2 };

struct Labels {
  std::string model;
  int64_t layer = -1;
  std::string engine;
  std::string backend;  // the engine's attention backend, e.g. "flashinfer"
  int64_t step = -1;
  std::vector<std::string> request_ids;  // [B] or empty
  std::string run;  // the rollout / training run, e.g. a W&B run name
  SnapshotRole role = SnapshotRole::kNone;
  std::string weight_version;  // the policy weights in use; "" unknown
};

enum class SlidingWindowConvention : int {
  // HF: a query at position t sees keys with t - W < pos <= t (W keys).
  kHuggingFace = 0,
  // FlashAttention left window: t - W <= pos <= t (W + 1 keys).
  kFlashLeft = 1,
};

struct Snapshot {
  Tensor q;
  Tensor k_pages;
  Tensor v_pages;
  KvLayout kv_layout = KvLayout::kNHD;
  // fp8 KV dequantisation scales: f32 [] (per tensor) or [Hkv] (per head).
  // Absent means 1.0. Only valid with fp8 pages.
  Tensor k_scale;
  Tensor v_scale;
  // Optional [N] engine page ids of the pages sent; when present,
  // block_table holds engine page ids, else indices into k_pages.
  Tensor page_ids;
  Tensor block_table;
  Tensor kv_seq_lens;
  Tensor query_positions;
  Tensor slot_positions;
  Tensor key_rope_positions;

  double softmax_scale = 0.0;  // 0 means 1/sqrt(D)
  int64_t sliding_window = 0;  // 0 means none
  SlidingWindowConvention window_convention =
      SlidingWindowConvention::kHuggingFace;
  double logit_softcap = 0.0;  // 0 means none: s -> cap * tanh(s / cap)
  Tensor sinks;                // optional f32 [Hq], natural-log logits
  bool engine_lse_includes_sinks = false;

  RopeConfig rope;
  DType output_dtype = DType::kInvalid;  // kInvalid means q's dtype
  CpConfig cp;
  EngineOutput engine;
  EnginePrecision precision;
  PreRopeInputs pre_rope;
  EngineRopeTable rope_table;

  // Selected-token log-prob inputs (all optional, lm_head and ids together).
  Tensor selected_token_ids;  // [B, Sq] i32/i64
  Tensor lm_head;             // [V, Hq*D] floating
  Tensor active_mask;         // [B, Sq] bool
  double logprob_temperature = 1.0;

  PrefixCache prefix;
  Labels labels;
};

// Shape summary derived from a validated snapshot.
struct SnapshotDims {
  int64_t batch = 0;       // B
  int64_t queries = 0;     // Sq
  int64_t q_heads = 0;     // Hq
  int64_t kv_heads = 0;    // Hkv
  int64_t head_dim = 0;    // D
  int64_t num_pages = 0;   // N
  int64_t page_size = 0;   // P
  int64_t max_blocks = 0;  // M
  int64_t group() const { return kv_heads ? q_heads / kv_heads : 0; }
};

// Reads dims from tensor shapes without validating them; callers use it
// after validation. Returns zeros for absent tensors.
SnapshotDims DimsOf(const Snapshot& snapshot);

// Effective values with defaults applied.
double EffectiveScale(const Snapshot& snapshot);
DType EffectiveOutputDType(const Snapshot& snapshot);
int64_t EffectiveRotaryDim(const Snapshot& snapshot);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_SNAPSHOT_SNAPSHOT_H_
