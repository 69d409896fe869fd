// Content fingerprints (SHA-256, lowercase hex) of a snapshot's logical KV.
//
// attnaudit v1 ("attnaudit.kv.v1"): a versioned, documented digest over the
// logical prefix of every row — positions, key RoPE positions and the
// stored K/V bytes, gathered in logical order — bound to the page size, the
// K/V dtypes, the fp8 scales and the RoPE identity. It is invariant to
// physical page placement, NHD vs HND, the integer width of the position
// tensors and the content of inactive slots. The exact
// byte stream is specified in docs/FINGERPRINTS.md.
//
// RL-Kernel compatible: byte-compatible with the harness's
// `_decode_cache_fingerprint` (docs/FINGERPRINTS.md, "RL-Kernel compatible
// prefix stream"),
// for snapshots expressible in its model (f32/f16/bf16/f64 pages in either
// layout, no fp8 scales, NeoX full rotary, no scaling, each CP block on one
// rank).
// Pure functions; thread-safe. Need a validated snapshot and its layout;
// they re-check (per block, not per element) that every byte they read
// exists, so a mismatched pair is an error, never a crash.
#ifndef ATTNAUDIT_CORE_FINGERPRINT_FINGERPRINT_H_
#define ATTNAUDIT_CORE_FINGERPRINT_FINGERPRINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"

namespace attnaudit {

inline constexpr char kFingerprintVersion[] = "attnaudit.kv.v1";

// Digest over the first `tokens` logical tokens of every row (all rows the
// same count: the shared-prefix use). InvalidArgument when tokens exceeds a
// row's length or is not positive.
absl::StatusOr<std::string> PrefixFingerprint(const Snapshot& snapshot,
                                              const ResolvedLayout& layout,
                                              int64_t tokens);

// Digest over every row's whole logical cache (kv_seq_lens tokens).
// Empty when the snapshot and layout disagree (never after validation).
std::string KvCacheFingerprint(const Snapshot& snapshot,
                               const ResolvedLayout& layout);

// Digest of the RoPE identity: states, style, theta, rotary dim, scaling,
// cast point, output dtypes and all query/key RoPE positions (as sent, so
// not invariant to page placement). Empty for inconsistent position tensors.
std::string RopeIdentityFingerprint(const Snapshot& snapshot);

// RL-Kernel harness compatible digest, domain "shared_prefix" with
// `tokens` per row (its decode_prefix_cache_fingerprint). Unimplemented
// error for snapshots its model cannot express.
absl::StatusOr<std::string> RlKernelPrefixFingerprint(
    const Snapshot& snapshot, const ResolvedLayout& layout, int64_t tokens);

// The name of a prefix fingerprint scheme as reports give it:
// kFingerprintVersion ("attnaudit.kv.v1") or "rl_kernel_compat".
absl::string_view PrefixSchemeName(PrefixCache::Scheme scheme);

// Checks snapshot.prefix (when enabled) against the recomputed digest of the
// declared scheme; InvalidArgument naming prefix.fingerprint on mismatch.
// Expects a validated snapshot: the fingerprint's spelling (64 lowercase
// hex) is validation's one check (core/validate, C24), not repeated here.
// On success, stores the recomputed digest in *recomputed (may be null).
absl::Status VerifyPrefixFingerprint(const Snapshot& snapshot,
                                     const ResolvedLayout& layout,
                                     std::string* recomputed);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_FINGERPRINT_FINGERPRINT_H_
