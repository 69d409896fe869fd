// attnaudit v1 fingerprints and the prefix check. The byte streams are
// specified in docs/FINGERPRINTS.md; any change to what is
// written here is a new version, never an edit of v1.
#include "core/fingerprint/fingerprint.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/fingerprint/kv_access.h"
#include "core/fingerprint/sha256_stream.h"

namespace attnaudit {
namespace {

using fingerprint_internal::CheckKvAccess;
using fingerprint_internal::HoldsShapeBytes;
using fingerprint_internal::PagedKv;
using fingerprint_internal::Sha256Stream;

constexpr char kRopeFingerprintVersion[] = "attnaudit.rope.v1";

// v1's own dtype names: frozen here rather than borrowed from DTypeName so
// that renaming a dtype for display can never change a fingerprint.
absl::string_view V1DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF8E4M3:
      return "fp8_e4m3";
    case DType::kF8E5M2:
      return "fp8_e5m2";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kBool:
      return "bool";
    case DType::kInvalid:
      break;
  }
  return "invalid";
}

std::string G17(double value) { return absl::StrFormat("%.17g", value); }

struct G17Formatter {
  void operator()(std::string* out, double value) const {
    out->append(G17(value));
  }
};

std::string StateName(RopeState state) {
  switch (state) {
    case RopeState::kPostRope:
      return "post_rope";
    case RopeState::kPreRope:
      return "pre_rope";
  }
  return absl::StrCat("unknown_", static_cast<int>(state));
}

std::string StyleName(RopeStyle style) {
  switch (style) {
    case RopeStyle::kNeox:
      return "neox";
    case RopeStyle::kGptj:
      return "gptj";
  }
  return absl::StrCat("unknown_", static_cast<int>(style));
}

// New cast points get new names; the names of existing ones never change
// (a digest made before a cast point existed stays valid).
std::string CastName(RopeCastPoint cast) {
  switch (cast) {
    case RopeCastPoint::kAfterRope:
      return "after_rope";
    case RopeCastPoint::kCosSin:
      return "cos_sin";
    case RopeCastPoint::kEachOp:
      return "each_op";
  }
  return absl::StrCat("unknown_", static_cast<int>(cast));
}

// Only the parameters the scaling type reads are bound, so an unused
// default can never split two otherwise identical digests.
std::string ScalingText(const RopeScaling& s) {
  switch (s.type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return absl::StrCat("linear(factor=", G17(s.factor), ")");
    case RopeScalingType::kLlama3:
      return absl::StrCat("llama3(factor=", G17(s.factor),
                          ",low_freq_factor=", G17(s.low_freq_factor),
                          ",high_freq_factor=", G17(s.high_freq_factor),
                          ",original_max_position=", s.original_max_position,
                          ")");
    case RopeScalingType::kYarn:
      return absl::StrCat("yarn(factor=", G17(s.factor),
                          ",original_max_position=", s.original_max_position,
                          ",beta_fast=", G17(s.beta_fast),
                          ",beta_slow=", G17(s.beta_slow),
                          ",attention_factor=", G17(s.attention_factor),
                          // Added with the parameter: a truncating YaRN
                          // keeps the text (and digest) it always had.
                          s.truncate ? "" : ",truncate=false", ")");
    // The step's sequence_length is not here: a cache holds keys rotated
    // over many steps (Hugging Face rescales as the sequence grows), and a
    // prefix digest must identify the same prefix at every step. The RoPE
    // identity digest binds it (SequenceLengthText).
    case RopeScalingType::kDynamic:
      return absl::StrCat("dynamic(factor=", G17(s.factor),
                          ",original_max_position=", s.original_max_position,
                          ")");
    case RopeScalingType::kLongRope:
      return absl::StrCat(
          "longrope(factor=", G17(s.factor),
          ",original_max_position=", s.original_max_position,
          ",attention_factor=", G17(s.attention_factor), ",short_factor=[",
          absl::StrJoin(s.short_factor, ",", G17Formatter()), "],long_factor=[",
          absl::StrJoin(s.long_factor, ",", G17Formatter()), "])");
  }
  return absl::StrCat("unknown_", static_cast<int>(s.type));
}

// The RoPE identity's binding of the step's scaling length, written only
// for the types that read it (every earlier input hashes as it did).
std::string SequenceLengthText(const RopeScaling& s) {
  switch (s.type) {
    case RopeScalingType::kDynamic:
    case RopeScalingType::kLongRope:
      return absl::StrCat(";rope_sequence_length=", s.sequence_length);
    case RopeScalingType::kNone:
    case RopeScalingType::kLinear:
    case RopeScalingType::kLlama3:
    case RopeScalingType::kYarn:
      break;
  }
  return "";
}

DType EffectiveKRopeDType(const Snapshot& s) {
  return s.rope.k_output_dtype != DType::kInvalid ? s.rope.k_output_dtype
                                                  : s.k_pages.dtype();
}
DType EffectiveQRopeDType(const Snapshot& s) {
  return s.rope.q_output_dtype != DType::kInvalid ? s.rope.q_output_dtype
                                                  : s.q.dtype();
}

// The RoPE facts that decide how the cached K is interpreted.
std::string KRopeText(const Snapshot& s) {
  return absl::StrCat(
      "k_rope_state=", StateName(s.rope.k_state),
      ";rope_style=", StyleName(s.rope.style),
      ";rope_theta=", G17(s.rope.theta), ";rotary_dim=", EffectiveRotaryDim(s),
      ";rope_scaling=", ScalingText(s.rope.scaling),
      ";rope_cast_at=", CastName(s.rope.cast_point),
      ";k_rope_output_dtype=", V1DTypeName(EffectiveKRopeDType(s)));
}

// Canonical fp8 scale: one f32 bit pattern per KV head (a per-tensor scale
// is repeated; an absent scale on fp8 pages is 1.0). "none" for non-fp8
// pages without a scale.
absl::StatusOr<std::string> ScaleText(const Tensor& scale, DType kv_dtype,
                                      int64_t kv_heads,
                                      absl::string_view field) {
  const bool fp8 = kv_dtype == DType::kF8E4M3 || kv_dtype == DType::kF8E5M2;
  if (!scale.present()) {
    if (!fp8) return std::string("none");
    return absl::StrJoin(std::vector<std::string>(kv_heads, "3f800000"), ",");
  }
  const int64_t n = HoldsShapeBytes(scale) ? scale.num_elements() : -1;
  if (!IsFloating(scale.dtype()) || (n != 1 && n != kv_heads)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected f32[] or f32[", kv_heads, "], got ",
                     scale.DebugString()));
  }
  std::string text;
  for (int64_t h = 0; h < kv_heads; ++h) {
    if (h > 0) text += ',';
    text += absl::StrFormat("%08x", FloatToBits(scale.FloatAt(n == 1 ? 0 : h)));
  }
  return text;
}

// The v1 KV stream: one header line, then per row a line and `tokens[b]`
// fixed-size token records (position, key RoPE position, K, V).
absl::StatusOr<std::string> KvDigestV1(const Snapshot& s,
                                       const ResolvedLayout& layout,
                                       const std::vector<int64_t>& tokens,
                                       absl::string_view domain,
                                       bool bind_prefix_key) {
  ATTNAUDIT_ASSIGN_OR_RETURN(const PagedKv kv,
                             CheckKvAccess(s, layout, tokens));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      const std::string k_scale,
      ScaleText(s.k_scale, s.k_pages.dtype(), kv.kv_heads, "k_scale"));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      const std::string v_scale,
      ScaleText(s.v_scale, s.v_pages.dtype(), kv.kv_heads, "v_scale"));

  Sha256Stream stream;
  stream.Append(absl::StrCat(
      kFingerprintVersion, ";domain=", domain, ";page_size=", kv.page_size,
      ";kv_heads=", kv.kv_heads, ";head_dim=", kv.head_dim,
      ";k_dtype=", V1DTypeName(s.k_pages.dtype()),
      ";v_dtype=", V1DTypeName(s.v_pages.dtype()), ";k_scale=", k_scale,
      ";v_scale=", v_scale, ";", KRopeText(s)));
  if (bind_prefix_key) {
    // Length-prefixed, so any byte of the key is unambiguous.
    stream.Append(absl::StrCat(";prefix_key=", s.prefix.key.size(), ":"));
    stream.Append(s.prefix.key);
  }
  stream.Append("\n");

  const int64_t k_head_bytes = kv.head_dim * kv.k_elem;
  const int64_t v_head_bytes = kv.head_dim * kv.v_elem;
  for (size_t b = 0; b < tokens.size(); ++b) {
    const int64_t n = tokens[b];
    stream.Append(absl::StrCat("row=", b, ";tokens=", n, "\n"));
    for (int64_t first = 0, block = 0; first < n;
         first += kv.page_size, ++block) {
      const int64_t page = layout.block_pages[b][block];
      const int64_t count = std::min(kv.page_size, n - first);
      for (int64_t slot = 0; slot < count; ++slot) {
        stream.AppendInt64Le(kv.Position(page, slot));
        stream.AppendInt64Le(kv.KeyPosition(page, slot));
        if (!kv.hnd) {  // NHD: the token's [Hkv, D] rows are contiguous
          stream.Append(kv.KRow(page, slot, 0), kv.kv_heads * k_head_bytes);
          stream.Append(kv.VRow(page, slot, 0), kv.kv_heads * v_head_bytes);
        } else {
          for (int64_t h = 0; h < kv.kv_heads; ++h) {
            stream.Append(kv.KRow(page, slot, h), k_head_bytes);
          }
          for (int64_t h = 0; h < kv.kv_heads; ++h) {
            stream.Append(kv.VRow(page, slot, h), v_head_bytes);
          }
        }
      }
    }
  }
  return stream.Finish();
}

// Appends a shape line and the tensor's integers as int64 little endian.
// False when the tensor is not a consistent i32/i64 tensor.
bool AppendPositions(const Tensor& t, absl::string_view name,
                     Sha256Stream* stream) {
  if ((t.dtype() != DType::kI32 && t.dtype() != DType::kI64) ||
      !HoldsShapeBytes(t)) {
    return false;
  }
  const int64_t n = t.num_elements();
  stream->Append(
      absl::StrCat(name, "=[", absl::StrJoin(t.shape(), ","), "]\n"));
  if (t.dtype() == DType::kI32) {
    stream->AppendInt64LeArray(t.data<int32_t>(), n);
  } else {
    stream->AppendInt64LeArray(t.data<int64_t>(), n);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> PrefixFingerprint(const Snapshot& snapshot,
                                              const ResolvedLayout& layout,
                                              int64_t tokens) {
  ATTNAUDIT_RETURN_IF_ERROR(
      fingerprint_internal::CheckPrefixTokens(layout, tokens));
  return KvDigestV1(snapshot, layout,
                    std::vector<int64_t>(layout.seq_lens.size(), tokens),
                    "prefix", /*bind_prefix_key=*/true);
}

std::string KvCacheFingerprint(const Snapshot& snapshot,
                               const ResolvedLayout& layout) {
  absl::StatusOr<std::string> digest =
      KvDigestV1(snapshot, layout, layout.seq_lens, "kv_cache",
                 /*bind_prefix_key=*/false);
  return digest.ok() ? *std::move(digest) : std::string();
}

std::string RopeIdentityFingerprint(const Snapshot& snapshot) {
  const Snapshot& s = snapshot;
  Sha256Stream stream;
  stream.Append(absl::StrCat(
      kRopeFingerprintVersion, ";q_rope_state=", StateName(s.rope.q_state), ";",
      KRopeText(s),
      ";q_rope_output_dtype=", V1DTypeName(EffectiveQRopeDType(s)),
      SequenceLengthText(s.rope.scaling), "\n"));
  const Tensor& key =
      s.key_rope_positions.present() ? s.key_rope_positions : s.slot_positions;
  if (!AppendPositions(s.query_positions, "query_positions", &stream) ||
      !AppendPositions(key, "key_rope_positions", &stream)) {
    return std::string();
  }
  absl::StatusOr<std::string> digest = stream.Finish();
  return digest.ok() ? *std::move(digest) : std::string();
}

absl::string_view PrefixSchemeName(PrefixCache::Scheme scheme) {
  switch (scheme) {
    case PrefixCache::Scheme::kAttnauditV1:
      return kFingerprintVersion;
    case PrefixCache::Scheme::kRlKernelCompat:
      return "rl_kernel_compat";
  }
  return "unknown";
}

absl::Status VerifyPrefixFingerprint(const Snapshot& snapshot,
                                     const ResolvedLayout& layout,
                                     std::string* recomputed) {
  if (recomputed != nullptr) recomputed->clear();
  const PrefixCache& prefix = snapshot.prefix;
  if (!prefix.enabled) return absl::OkStatus();
  if (prefix.fingerprint.empty()) {  // validation refuses it first (C24)
    return absl::InvalidArgumentError(
        "prefix.fingerprint: is required when the prefix cache is enabled");
  }
  // A Snapshot built in code may hold any int here: refused before the
  // switch, which lists every scheme (no default, so -Wswitch names one
  // it forgets).
  const int scheme_value = static_cast<int>(prefix.scheme);
  if (scheme_value < static_cast<int>(PrefixCache::Scheme::kAttnauditV1) ||
      scheme_value > static_cast<int>(PrefixCache::Scheme::kRlKernelCompat)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix.scheme: unknown fingerprint scheme ", scheme_value));
  }
  absl::StatusOr<std::string> digest;
  absl::string_view scheme;
  switch (prefix.scheme) {
    case PrefixCache::Scheme::kAttnauditV1:
      scheme = PrefixSchemeName(prefix.scheme);
      digest = PrefixFingerprint(snapshot, layout, prefix.length);
      break;
    case PrefixCache::Scheme::kRlKernelCompat:
      scheme = PrefixSchemeName(prefix.scheme);
      digest = RlKernelPrefixFingerprint(snapshot, layout, prefix.length);
      break;
  }
  if (!digest.ok()) return digest.status();
  // Both are lowercase hex: validation (C24) refuses any other spelling.
  if (prefix.fingerprint != *digest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix.fingerprint: does not match the logical prefix "
        "positions/content (scheme ",
        scheme, ", ", prefix.length, " tokens; expected ",
        // The client's string is bounded before it reaches a log line.
        absl::string_view(prefix.fingerprint).substr(0, 80), ", recomputed ",
        *digest, ")"));
  }
  if (recomputed != nullptr) *recomputed = *std::move(digest);
  return absl::OkStatus();
}

}  // namespace attnaudit
