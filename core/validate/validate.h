// Snapshot validation: every structural and semantic rule a snapshot must
// satisfy before any attention is computed. See docs/VALIDATION.md
// for the rule list; it follows the RL-Kernel decode harness
// (docs/RL_KERNEL_HARNESS.md, "Validation rules") adapted to a shared page
// pool, plus attnaudit's own rules (page bounds, window/soft-cap/sink ranges,
// fp8 scales, CP sharding, size caps).
//
// Errors are absl::InvalidArgumentError whose message starts with the field
// path, e.g. "block_table[1][3]: page 9 is out of range [0, 8)". Sizes are
// checked against ValidationLimits before anything is allocated, so a hostile
// snapshot can never make validation allocate more than O(limits).
// Thread-safe (pure function of its inputs).
#ifndef ATTNAUDIT_CORE_VALIDATE_VALIDATE_H_
#define ATTNAUDIT_CORE_VALIDATE_VALIDATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {

struct ValidationLimits {
  int64_t max_tensor_bytes = int64_t{4} << 30;  // any single tensor
  int64_t max_total_bytes = int64_t{8} << 30;   // all tensors together
  int64_t max_batch = 4096;
  int64_t max_queries = 64;  // Sq
  int64_t max_heads = 1024;  // Hq
  int64_t max_head_dim = 1024;
  int64_t max_page_size = 4096;
  int64_t max_blocks = 1 << 20;   // M
  int64_t max_context = 1 << 24;  // kv_seq_len
  int64_t max_cp_world_size = 1024;
  int64_t max_vocab = 1 << 20;
};

// The layout a valid snapshot resolves to; what the compute stages use.
struct ResolvedLayout {
  SnapshotDims dims;
  std::vector<int64_t> seq_lens;  // [B]
  // [B][ceil(L_b / P)]: index into k_pages/v_pages of each logical block.
  std::vector<std::vector<int32_t>> block_pages;
  // [B][ceil(L_b / P)]: CP rank owning each logical block under the
  // snapshot's sharding rule (0 when cp world size is 1). For the
  // token-interleaved rule a block may span ranks; this holds the rank of
  // its first token and per-token owners come from TokenOwner().
  std::vector<std::vector<int32_t>> block_owners;
};

// Rank owning logical token `token` (position index within the row) of a
// validated snapshot.
int32_t TokenOwner(const Snapshot& snapshot, const ResolvedLayout& layout,
                   int64_t batch, int64_t token);

// What ValidateSnapshot reads of the tensors' values.
enum class ValueScan {
  // Every active q/K/V value and lm_head is checked finite.
  kAll,
  // As kAll but K and V values are not read: the caller's single pass over
  // the cache checks them (the audit's fused pass does, and calls
  // ValidateSnapshot again with kAll to name the value when it finds one).
  kSkipKv,
};

// Validates everything, including (per `scan`) that every active q/K/V
// value is finite. The prefix fingerprint is checked by the audit pipeline
// right after this (core/fingerprint needs the resolved layout).
absl::StatusOr<ResolvedLayout> ValidateSnapshot(
    const Snapshot& snapshot, const ValidationLimits& limits = {},
    ValueScan scan = ValueScan::kAll);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_VALIDATE_VALIDATE_H_
