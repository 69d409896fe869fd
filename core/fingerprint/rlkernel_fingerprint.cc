// The RL-Kernel harness compatible prefix digest: the byte stream of its
// `_decode_cache_fingerprint(inputs, token_counts=(n,)*B,
// domain="shared_prefix")` (docs/FINGERPRINTS.md, "RL-Kernel compatible prefix
// stream"),
// reproduced from our shared-pool snapshot. The harness stores K/V per row
// as [B, Hkv, C, D]; after its logical gather the bytes it hashes are
// K[b][h][t][d] for t < n, which is what is streamed here (head-major),
// whatever our physical layout (NHD or HND) and page placement.
//
// Python formatting reproduced: repr() of the key (printable ASCII without
// quotes or backslashes only; anything else is Unimplemented rather than a
// guess at Python's escaping), float.__format__ ".17g" (identical to C's
// %.17g for finite doubles), str(tuple) ("(4,)", "(2, 4, 8)"), str(list)
// ("[0, 1, 0]") and str(torch.dtype) ("torch.float32").
#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/fingerprint/fingerprint.h"
#include "core/fingerprint/kv_access.h"
#include "core/fingerprint/sha256_stream.h"

namespace attnaudit {
namespace {

using fingerprint_internal::CheckKvAccess;
using fingerprint_internal::PagedKv;
using fingerprint_internal::Sha256Stream;

// str(torch.dtype) for the dtypes the harness can hold; empty otherwise.
absl::string_view TorchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "torch.float32";
    case DType::kF16:
      return "torch.float16";
    case DType::kBF16:
      return "torch.bfloat16";
    case DType::kF64:
      return "torch.float64";
    case DType::kI32:
      return "torch.int32";
    case DType::kI64:
      return "torch.int64";
    case DType::kInvalid:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kBool:
      break;
  }
  return "";
}

absl::Status Unexpressible(absl::string_view field, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(
      field, ": the RL-Kernel compatible fingerprint cannot express ", what));
}

absl::StatusOr<absl::string_view> FloatingTorchName(DType dtype,
                                                    absl::string_view field) {
  const absl::string_view name = TorchDTypeName(dtype);
  if (name.empty() || !IsFloating(dtype)) {
    return Unexpressible(field, absl::StrCat("dtype ", DTypeName(dtype),
                                             " (the harness has no fp8 KV)"));
  }
  return name;
}

// Python's repr() of a str, for the keys whose repr is simply the key in
// single quotes.
absl::StatusOr<std::string> PythonKeyRepr(const PrefixCache& prefix) {
  if (!prefix.enabled && prefix.key.empty()) return std::string("None");
  for (const char c : prefix.key) {
    if (c < 0x20 || c > 0x7e || c == '\'' || c == '"' || c == '\\') {
      return Unexpressible(
          "prefix.key",
          "a key with quotes, backslashes or non-printable-ASCII bytes");
    }
  }
  return absl::StrCat("'", prefix.key, "'");
}

// Rejects what the harness's model has no field for
// (docs/RL_KERNEL_HARNESS.md, "Limits of the harness"): anything but NeoX
// full-rotary unscaled RoPE, fp8 scales, CP blocks spanning ranks.
absl::Status CheckExpressible(const Snapshot& s, int64_t head_dim) {
  if (s.k_scale.present()) return Unexpressible("k_scale", "fp8 KV scales");
  if (s.v_scale.present()) return Unexpressible("v_scale", "fp8 KV scales");
  if (s.rope.style != RopeStyle::kNeox) {
    return Unexpressible("rope.style", "GPT-J interleaved RoPE");
  }
  if (s.rope.scaling.type != RopeScalingType::kNone) {
    return Unexpressible("rope.scaling", "RoPE scaling");
  }
  if (EffectiveRotaryDim(s) != head_dim) {
    return Unexpressible("rope.rotary_dim", "partial rotary RoPE");
  }
  if (s.rope.cast_point != RopeCastPoint::kAfterRope) {
    return Unexpressible("rope.cast_point", "a cast other than after_rope");
  }
  if (s.rope.k_state != RopeState::kPreRope &&
      s.rope.k_state != RopeState::kPostRope) {
    return Unexpressible("rope.k_state", "an unknown RoPE state");
  }
  return absl::OkStatus();
}

// Owners of the first `blocks` logical blocks of row b, as the harness's
// explicit per-block owner table would hold them.
absl::StatusOr<std::string> OwnersRepr(const Snapshot& s,
                                       const ResolvedLayout& layout, size_t b,
                                       int64_t blocks, int64_t page_size) {
  const CpConfig& cp = s.cp;
  if (cp.world_size > 1 && cp.sharding == CpSharding::kTokenInterleaved &&
      (cp.interleave_size <= 0 || cp.interleave_size % page_size != 0)) {
    return Unexpressible("cp.interleave_size",
                         "token-interleaved CP whose blocks span ranks");
  }
  std::vector<int64_t> owners(blocks, 0);
  if (layout.block_owners.empty() && cp.world_size <= 1) {
    // A hand-built layout without owners: one rank owns everything.
  } else if (b >= layout.block_owners.size() ||
             static_cast<int64_t>(layout.block_owners[b].size()) < blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp.block_owners[", b, "]: the resolved layout lacks block owners"));
  } else {
    for (int64_t i = 0; i < blocks; ++i) owners[i] = layout.block_owners[b][i];
  }
  return absl::StrCat("[", absl::StrJoin(owners, ", "), "]");
}

// One [n] position tensor in logical order: its raw bytes in its own dtype.
void AppendPositionBytes(const PagedKv& kv, const Tensor& positions,
                         const std::vector<int32_t>& pages, int64_t n,
                         Sha256Stream* stream) {
  const int64_t elem = DTypeSize(positions.dtype());
  const auto* base = reinterpret_cast<const unsigned char*>(positions.raw());
  stream->Append(absl::StrCat("(", n, ",)", TorchDTypeName(positions.dtype())));
  for (int64_t first = 0, block = 0; first < n;
       first += kv.page_size, ++block) {
    const int64_t count = std::min(kv.page_size, n - first);
    stream->Append(base + pages[block] * kv.page_size * elem, count * elem);
  }
}

// One [Hkv, n, D] cache tensor in logical order, head-major.
void AppendCacheBytes(const PagedKv& kv, bool is_k, absl::string_view dtype,
                      const std::vector<int32_t>& pages, int64_t n,
                      Sha256Stream* stream) {
  const int64_t head_bytes = kv.head_dim * (is_k ? kv.k_elem : kv.v_elem);
  stream->Append(
      absl::StrCat("(", kv.kv_heads, ", ", n, ", ", kv.head_dim, ")", dtype));
  for (int64_t h = 0; h < kv.kv_heads; ++h) {
    for (int64_t first = 0, block = 0; first < n;
         first += kv.page_size, ++block) {
      const int64_t page = pages[block];
      const int64_t count = std::min(kv.page_size, n - first);
      if (kv.hnd) {  // the page's slots of one head are contiguous
        stream->Append(is_k ? kv.KRow(page, 0, h) : kv.VRow(page, 0, h),
                       count * head_bytes);
        continue;
      }
      for (int64_t slot = 0; slot < count; ++slot) {
        stream->Append(is_k ? kv.KRow(page, slot, h) : kv.VRow(page, slot, h),
                       head_bytes);
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::string> RlKernelPrefixFingerprint(
    const Snapshot& snapshot, const ResolvedLayout& layout, int64_t tokens) {
  const Snapshot& s = snapshot;
  ATTNAUDIT_RETURN_IF_ERROR(
      fingerprint_internal::CheckPrefixTokens(layout, tokens));
  const std::vector<int64_t> counts(layout.seq_lens.size(), tokens);
  ATTNAUDIT_ASSIGN_OR_RETURN(const PagedKv kv,
                             CheckKvAccess(s, layout, counts));
  ATTNAUDIT_RETURN_IF_ERROR(CheckExpressible(s, kv.head_dim));
  ATTNAUDIT_ASSIGN_OR_RETURN(const absl::string_view k_dtype,
                             FloatingTorchName(s.k_pages.dtype(), "k_pages"));
  ATTNAUDIT_ASSIGN_OR_RETURN(const absl::string_view v_dtype,
                             FloatingTorchName(s.v_pages.dtype(), "v_pages"));
  const DType k_rope_dtype = s.rope.k_output_dtype != DType::kInvalid
                                 ? s.rope.k_output_dtype
                                 : s.k_pages.dtype();
  ATTNAUDIT_ASSIGN_OR_RETURN(
      const absl::string_view k_rope_name,
      FloatingTorchName(k_rope_dtype, "rope.k_output_dtype"));
  ATTNAUDIT_ASSIGN_OR_RETURN(const std::string key, PythonKeyRepr(s.prefix));

  Sha256Stream stream;
  stream.Append(absl::StrCat(
      "domain=shared_prefix;page_size=", kv.page_size, ";prefix_cache_enabled=",
      s.prefix.enabled ? "True" : "False", ";prefix_cache_key=", key,
      ";prefix_length=", s.prefix.length, ";k_rope_state=",
      s.rope.k_state == RopeState::kPreRope ? "pre_rope" : "post_rope",
      ";rope_theta=", absl::StrFormat("%.17g", s.rope.theta),
      ";rotary_dim=", EffectiveRotaryDim(s), ";rope_cast_at=after_rope",
      ";k_rope_output_dtype=", k_rope_name, ";k_dtype=", k_dtype,
      ";v_dtype=", v_dtype, "\n"));
  for (size_t b = 0; b < counts.size(); ++b) {
    const int64_t blocks = (tokens + kv.page_size - 1) / kv.page_size;
    ATTNAUDIT_ASSIGN_OR_RETURN(const std::string owners,
                               OwnersRepr(s, layout, b, blocks, kv.page_size));
    stream.Append(absl::StrCat("batch=", b, ";tokens=", tokens,
                               ";owners=", owners, "\n"));
    const std::vector<int32_t>& pages = layout.block_pages[b];
    AppendPositionBytes(kv, *kv.slot_positions, pages, tokens, &stream);
    AppendPositionBytes(kv, *kv.key_positions, pages, tokens, &stream);
    AppendCacheBytes(kv, /*is_k=*/true, k_dtype, pages, tokens, &stream);
    AppendCacheBytes(kv, /*is_k=*/false, v_dtype, pages, tokens, &stream);
  }
  return stream.Finish();
}

}  // namespace attnaudit
