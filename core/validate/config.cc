// Phase 2 of snapshot validation: scalar knobs, enums, RoPE, context
// parallelism, the prefix-cache declaration, and the values of the small
// tensors (at most O(Hq), O(Hkv) or O(B * Sq) elements, all bounded by the
// limits phase 1 enforced).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/rope/rope.h"
#include "core/tensor/dtype_traits.h"
#include "core/validate/validate_internal.h"

namespace attnaudit {
namespace validate_internal {
namespace {

// 0 (the documented default) or a positive finite number.
// Scale and soft-cap are used in fp32 by the replay: a value fp32 flushes to
// 0 or subnormal (or overflows) would make P compute a different attention
// than R, so the range is fp32's normal range.
absl::Status ZeroOrPositiveFinite(absl::string_view field, double v,
                                  absl::string_view zero_means) {
  if (v == 0.0) return absl::OkStatus();
  if (!(std::isfinite(v) && v > 0.0)) {
    return Invalid(field, "must be 0 (", zero_means,
                   ") or a positive finite number, got ", v);
  }
  if (v < std::numeric_limits<float>::min() ||
      v > std::numeric_limits<float>::max()) {
    return Invalid(field, "must lie in fp32's normal range [",
                   std::numeric_limits<float>::min(), ", ",
                   std::numeric_limits<float>::max(), "], got ", v);
  }
  return absl::OkStatus();
}

absl::Status CheckScalars(const Snapshot& s) {
  ATTNAUDIT_RETURN_IF_ERROR(
      ZeroOrPositiveFinite("softmax_scale", s.softmax_scale, "1/sqrt(D)"));
  if (s.sliding_window < 0) {
    return Invalid("sliding_window", "must be >= 0 (0: no window), got ",
                   s.sliding_window);
  }
  if (s.window_convention != SlidingWindowConvention::kHuggingFace &&
      s.window_convention != SlidingWindowConvention::kFlashLeft) {
    return Invalid("window_convention", "unknown value ",
                   static_cast<int>(s.window_convention));
  }
  ATTNAUDIT_RETURN_IF_ERROR(
      ZeroOrPositiveFinite("logit_softcap", s.logit_softcap, "no soft-cap"));
  if (!(std::isfinite(s.logprob_temperature) && s.logprob_temperature > 0)) {
    return Invalid("logprob_temperature",
                   "must be a positive finite number, got ",
                   s.logprob_temperature);
  }
  if (s.output_dtype != DType::kInvalid && !IsFloating(s.output_dtype)) {
    return Invalid("output_dtype", "must be a floating-point dtype, got ",
                   DTypeName(s.output_dtype));
  }
  if (s.output_dtype != DType::kInvalid && s.engine.out.present() &&
      s.engine.out.dtype() != s.output_dtype) {
    return Invalid("engine.out", "dtype ", DTypeName(s.engine.out.dtype()),
                   " differs from output_dtype ", DTypeName(s.output_dtype));
  }
  if (s.engine.lse_base != LseBase::kE && s.engine.lse_base != LseBase::k2) {
    return Invalid("engine.lse_base", "unknown value ",
                   static_cast<int>(s.engine.lse_base));
  }
  return absl::OkStatus();
}

absl::Status CheckScales(const Snapshot& s) {
  const bool fp8 = IsFp8(s.k_pages.dtype());
  for (const auto& [field, scale] :
       {std::pair<const char*, const Tensor*>{"k_scale", &s.k_scale},
        {"v_scale", &s.v_scale}}) {
    if (!scale->present()) continue;
    if (!fp8) {
      return Invalid(field, "is only valid with fp8 pages, but k_pages is ",
                     DTypeName(s.k_pages.dtype()));
    }
    const int64_t n = scale->num_elements();
    for (int64_t i = 0; i < n; ++i) {
      const float v = scale->FloatAt(i);
      if (!(std::isfinite(v) && v > 0.0f)) {
        const std::string path =
            scale->rank() == 0 ? std::string(field) : IndexPath(field, {i});
        return Invalid(path, "must be a positive finite number, got ", v);
      }
    }
  }
  if (s.sinks.present()) {
    const int64_t index =
        FirstNonFinite(s.sinks.raw(), DType::kF32, s.sinks.num_elements());
    if (index >= 0) {
      return Invalid(IndexPath("sinks", {index}), "value is not finite");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOutputDType(absl::string_view field, DType dt,
                              RopeState state, const Tensor& tensor,
                              absl::string_view tensor_name) {
  if (dt == DType::kInvalid) return absl::OkStatus();
  if (!IsFloating(dt)) {
    return Invalid(field, "must be a floating-point dtype, got ",
                   DTypeName(dt));
  }
  // Post-RoPE data was already cast by the engine; a declared RoPE output
  // dtype that differs from what was stored is a contradiction. Not so for
  // fp8: the engine rotates in a wider dtype, then quantises (what the
  // rolling RoPE check reproduces).
  if (state == RopeState::kPostRope && dt != tensor.dtype() &&
      !IsFp8(tensor.dtype())) {
    return Invalid(field, "post-RoPE ", tensor_name, " dtype ",
                   DTypeName(tensor.dtype()), " must match ", DTypeName(dt));
  }
  return absl::OkStatus();
}

// The engine's RoPE table: finite values, inverse frequencies positive,
// row positions >= 0 and distinct (each names one row).
absl::Status CheckRopeTable(const EngineRopeTable& t) {
  if (t.inv_freq.present()) {
    for (int64_t i = 0; i < t.inv_freq.num_elements(); ++i) {
      const float f = t.inv_freq.FloatAt(i);
      if (!(std::isfinite(f) && f > 0.0f)) {
        return Invalid(IndexPath("rope_table.inv_freq", {i}),
                       "must be a positive finite number, got ", f);
      }
    }
  }
  if (!t.positions.present()) return absl::OkStatus();
  const IntView positions(t.positions);
  const int64_t rows = t.positions.num_elements();
  std::vector<std::pair<int64_t, int64_t>> sorted;
  sorted.reserve(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    if (positions[i] < 0) {
      return Invalid(IndexPath("rope_table.positions", {i}),
                     "must be >= 0, got ", positions[i]);
    }
    sorted.emplace_back(positions[i], i);
  }
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].first == sorted[i - 1].first) {
      return Invalid(IndexPath("rope_table.positions", {sorted[i].second}),
                     "position ", sorted[i].first, " repeats entry ",
                     sorted[i - 1].second);
    }
  }
  for (const auto& [field, tensor] :
       {std::pair<const char*, const Tensor*>{"rope_table.cos", &t.cos},
        {"rope_table.sin", &t.sin}}) {
    const int64_t bad =
        FirstNonFinite(tensor->raw(), tensor->dtype(), tensor->num_elements());
    if (bad >= 0) {
      return Invalid(ElementPath(field, tensor->shape(), bad),
                     "value is not finite");
    }
  }
  return absl::OkStatus();
}

// Whether an enum field holds one of its enumerators. A Snapshot built in
// code can hold any int there (the codec refuses unknown ones, core's
// callers need not), so such a value is refused before any switch over it:
// the switches then list every enumerator with no default, and -Wswitch
// names one they forget.
template <typename E>
bool InEnum(E value, E first, E last) {
  const int v = static_cast<int>(value);
  return v >= static_cast<int>(first) && v <= static_cast<int>(last);
}

absl::Status CheckPrecision(const EnginePrecision& p) {
  if (!InEnum(p.profile, EngineProfile::kUnspecified,
              EngineProfile::kTorchFlashCpu)) {
    return Invalid("precision.profile", "unknown value ",
                   static_cast<int>(p.profile));
  }
  for (const auto& [field, dt] :
       {std::pair<const char*, DType>{"precision.score_dtype", p.score_dtype},
        {"precision.probability_dtype", p.probability_dtype}}) {
    if (dt != DType::kInvalid && !IsFloating(dt)) {
      return Invalid(field, "must be a floating-point dtype, got ",
                     DTypeName(dt));
    }
  }
  if (p.exp_ulps < 0 || p.exp_ulps > (1 << 20)) {
    return Invalid("precision.exp_ulps", "must be in [0, 2^20], got ",
                   p.exp_ulps);
  }
  if (p.split_keys < 0) {
    return Invalid("precision.split_keys", "must be >= 0, got ", p.split_keys);
  }
  for (const auto& [field, rounding] :
       {std::pair<const char*, Rounding>{"precision.score_rounding",
                                         p.score_rounding},
        {"precision.probability_rounding", p.probability_rounding},
        {"precision.output_rounding", p.output_rounding},
        {"precision.rope_rounding", p.rope_rounding}}) {
    if (!InEnum(rounding, Rounding::kProfile, Rounding::kTowardZero)) {
      return Invalid(field, "unknown value ", static_cast<int>(rounding));
    }
  }
  if (!InEnum(p.source, PrecisionSource::kUnspecified,
              PrecisionSource::kMeasured)) {
    return Invalid("precision.source", "unknown value ",
                   static_cast<int>(p.source));
  }
  if (p.evidence.size() > kMaxPrecisionEvidenceBytes) {
    return Invalid("precision.evidence", "must be at most ",
                   kMaxPrecisionEvidenceBytes, " bytes, got ",
                   p.evidence.size());
  }
  return absl::OkStatus();
}

absl::Status CheckRope(const Snapshot& s, const SnapshotDims& d) {
  const RopeConfig& r = s.rope;
  if (r.cast_point != RopeCastPoint::kAfterRope &&
      r.cast_point != RopeCastPoint::kCosSin &&
      r.cast_point != RopeCastPoint::kEachOp) {
    return Invalid("rope.cast_point",
                   "must be after_rope, cos_sin or each_op, got ",
                   static_cast<int>(r.cast_point));
  }
  for (const auto& [field, state] :
       {std::pair<const char*, RopeState>{"rope.q_state", r.q_state},
        {"rope.k_state", r.k_state}}) {
    if (state != RopeState::kPostRope && state != RopeState::kPreRope) {
      return Invalid(field, "must be post_rope or pre_rope, got ",
                     static_cast<int>(state));
    }
  }
  if (r.style != RopeStyle::kNeox && r.style != RopeStyle::kGptj) {
    return Invalid("rope.style", "unknown value ", static_cast<int>(r.style));
  }
  // The harness checks theta even for post-RoPE state (it is part of the
  // RoPE identity the fingerprints bind); RopeTable::Create checks theta,
  // rotary_dim and the scaling parameters with "rope.*" messages.
  const absl::StatusOr<RopeTable> table = RopeTable::Create(r, d.head_dim);
  if (!table.ok()) return table.status();
  ATTNAUDIT_RETURN_IF_ERROR(CheckOutputDType(
      "rope.q_output_dtype", r.q_output_dtype, r.q_state, s.q, "q"));
  ATTNAUDIT_RETURN_IF_ERROR(CheckOutputDType("rope.k_output_dtype",
                                             r.k_output_dtype, r.k_state,
                                             s.k_pages, "k_pages"));
  if (s.pre_rope.q.present() && r.q_state != RopeState::kPostRope) {
    return Invalid("pre_rope.q",
                   "needs rope.q_state post_rope (q then holds the rotated "
                   "queries to check)");
  }
  if (s.pre_rope.k.present() && r.k_state != RopeState::kPostRope) {
    return Invalid("pre_rope.k",
                   "needs rope.k_state post_rope (the cache then holds the "
                   "rotated keys to check)");
  }
  return CheckRopeTable(s.rope_table);
}

absl::Status CheckCp(const Snapshot& s) {
  const CpConfig& cp = s.cp;
  if (!InEnum(cp.sharding, CpSharding::kNone, CpSharding::kPageInterleaved)) {
    return Invalid("cp.sharding", "unknown value ",
                   static_cast<int>(cp.sharding));
  }
  switch (cp.sharding) {
    case CpSharding::kNone:
      if (cp.world_size != 1) {
        return Invalid("cp.sharding", "none requires cp.world_size 1, got ",
                       cp.world_size);
      }
      break;
    case CpSharding::kExplicitOwners:
      if (!cp.block_owners.present()) {
        return Invalid("cp.block_owners",
                       "is required with sharding explicit_owners");
      }
      break;
    case CpSharding::kTokenInterleaved:
      if (cp.interleave_size < 1) {
        return Invalid("cp.interleave_size", "must be >= 1, got ",
                       cp.interleave_size);
      }
      break;
    case CpSharding::kPageInterleaved:
      break;
  }
  if (cp.block_owners.present() && cp.sharding != CpSharding::kExplicitOwners) {
    return Invalid("cp.block_owners",
                   "is only valid with sharding explicit_owners");
  }
  if (cp.rank_out.present() != cp.rank_lse.present()) {
    return Invalid(cp.rank_out.present() ? "cp.rank_lse" : "cp.rank_out",
                   "cp.rank_out and cp.rank_lse must be provided together");
  }
  return absl::OkStatus();
}

absl::Status CheckLogprobInputs(const Snapshot& s, const SnapshotDims& d) {
  if (s.lm_head.present() != s.selected_token_ids.present()) {
    return Invalid(s.lm_head.present() ? "selected_token_ids" : "lm_head",
                   "lm_head and selected_token_ids must be provided together");
  }
  if (s.engine.logprobs.present() && !s.selected_token_ids.present()) {
    return Invalid("engine.logprobs",
                   "requires selected_token_ids and lm_head");
  }
  if (s.selected_token_ids.present()) {
    const IntView ids(s.selected_token_ids);
    const int64_t vocab = s.lm_head.dim(0);
    for (int64_t i = 0; i < d.batch * d.queries; ++i) {
      if (ids[i] < 0 || ids[i] >= vocab) {
        return Invalid(
            IndexPath("selected_token_ids", {i / d.queries, i % d.queries}),
            ids[i], " is outside [0, ", vocab, ")");
      }
    }
  }
  if (s.active_mask.present()) {
    const uint8_t* mask = s.active_mask.data<uint8_t>();
    for (int64_t i = 0; i < d.batch * d.queries; ++i) {
      if (mask[i] > 1) {
        return Invalid(IndexPath("active_mask", {i / d.queries, i % d.queries}),
                       "bool value ", static_cast<int>(mask[i]),
                       " is not 0 or 1");
      }
    }
  }
  return absl::OkStatus();
}

bool IsLowerHex64(const std::string& v) {
  if (v.size() != 64) return false;
  for (char c : v) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status CheckPrefix(const Snapshot& s) {
  const PrefixCache& p = s.prefix;
  if (p.scheme != PrefixCache::Scheme::kAttnauditV1 &&
      p.scheme != PrefixCache::Scheme::kRlKernelCompat) {
    return Invalid("prefix.scheme", "unknown value ",
                   static_cast<int>(p.scheme));
  }
  if (p.enabled) {
    if (p.key.empty()) {
      return Invalid("prefix.key",
                     "is required when the prefix cache is enabled");
    }
    if (p.length <= 0) {
      return Invalid("prefix.length", "must be a positive integer, got ",
                     p.length);
    }
    if (p.fingerprint.empty()) {
      return Invalid("prefix.fingerprint",
                     "is required when the prefix cache is enabled");
    }
    if (!IsLowerHex64(p.fingerprint)) {
      if (p.fingerprint.size() != 64) {
        return Invalid("prefix.fingerprint",
                       "must be 64 lowercase hex characters (SHA-256), got ",
                       p.fingerprint.size(), " characters");
      }
      const size_t bad = p.fingerprint.find_first_not_of("0123456789abcdef");
      const char c = p.fingerprint[bad];
      return Invalid("prefix.fingerprint",
                     "must be 64 lowercase hex characters (SHA-256): ",
                     c >= 'A' && c <= 'F' ? "uppercase hex is refused, " : "",
                     "character ", bad, " is not 0-9 or a-f");
    }
    return absl::OkStatus();  // length <= every kv_seq_len: rows.cc
  }
  if (!p.key.empty()) {
    return Invalid("prefix.key",
                   "must be empty when the prefix cache is disabled");
  }
  if (p.length != 0) {
    return Invalid("prefix.length",
                   "must be 0 when the prefix cache is disabled, got ",
                   p.length);
  }
  if (!p.fingerprint.empty()) {
    return Invalid("prefix.fingerprint",
                   "must be empty when the prefix cache is disabled");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckConfig(const Snapshot& s, const ValidationLimits& limits,
                         const SnapshotDims& dims) {
  ATTNAUDIT_RETURN_IF_ERROR(CheckScalars(s));
  ATTNAUDIT_RETURN_IF_ERROR(CheckScales(s));
  ATTNAUDIT_RETURN_IF_ERROR(CheckRope(s, dims));
  ATTNAUDIT_RETURN_IF_ERROR(CheckPrecision(s.precision));
  ATTNAUDIT_RETURN_IF_ERROR(CheckCp(s));
  ATTNAUDIT_RETURN_IF_ERROR(CheckLogprobInputs(s, dims));
  ATTNAUDIT_RETURN_IF_ERROR(CheckPrefix(s));
  const size_t ids = s.labels.request_ids.size();
  if (ids != 0 && static_cast<int64_t>(ids) != dims.batch) {
    return Invalid("labels.request_ids", "has ", ids,
                   " entries; expected 0 or B=", dims.batch);
  }
  return absl::OkStatus();
}

}  // namespace validate_internal
}  // namespace attnaudit
