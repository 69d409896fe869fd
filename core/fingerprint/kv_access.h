// Read access to the paged K/V of a snapshot in logical order, shared by the
// attnaudit v1 and the RL-Kernel compatible fingerprints. Internal to
// core/fingerprint.
//
// The fingerprint functions are given a validated snapshot and its layout,
// but they index raw bytes, so CheckKvAccess re-checks (in O(B * blocks),
// never per element) that every byte they will touch exists: shapes agree
// with the layout, tensors hold as many bytes as their shapes say, and each
// referenced page is in range. A snapshot/layout pair that fails it was not
// produced by ValidateSnapshot; the error says which field disagrees.
// Pure functions of their inputs; thread-safe.
#ifndef ATTNAUDIT_CORE_FINGERPRINT_KV_ACCESS_H_
#define ATTNAUDIT_CORE_FINGERPRINT_KV_ACCESS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"

namespace attnaudit {
namespace fingerprint_internal {

// Byte-level view of the K/V page pool, NHD or HND.
struct PagedKv {
  const unsigned char* k = nullptr;
  const unsigned char* v = nullptr;
  int64_t num_pages = 0;
  int64_t page_size = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t k_elem = 0;  // bytes per K element
  int64_t v_elem = 0;
  bool hnd = false;
  const Tensor* slot_positions = nullptr;  // [N, P] i32/i64
  // key_rope_positions when present, else slot_positions.
  const Tensor* key_positions = nullptr;

  // Element index of [page][slot][head][0] in either layout.
  int64_t RowElement(int64_t page, int64_t slot, int64_t head) const {
    return hnd ? ((page * kv_heads + head) * page_size + slot) * head_dim
               : ((page * page_size + slot) * kv_heads + head) * head_dim;
  }
  const unsigned char* KRow(int64_t page, int64_t slot, int64_t head) const {
    return k + RowElement(page, slot, head) * k_elem;
  }
  const unsigned char* VRow(int64_t page, int64_t slot, int64_t head) const {
    return v + RowElement(page, slot, head) * v_elem;
  }
  // Slot positions are [N, P] in both layouts.
  int64_t Position(int64_t page, int64_t slot) const {
    return slot_positions->IntAt(page * page_size + slot);
  }
  int64_t KeyPosition(int64_t page, int64_t slot) const {
    return key_positions->IntAt(page * page_size + slot);
  }
};

// True when `t` holds exactly as many bytes as its shape and dtype say
// (overflow-safe for any shape).
bool HoldsShapeBytes(const Tensor& t);

// Checks that the snapshot's K/V, positions and the layout agree for reading
// the first tokens[b] logical tokens of every row b (tokens.size() must be
// the batch), and returns the view. InvalidArgument naming the field.
absl::StatusOr<PagedKv> CheckKvAccess(const Snapshot& snapshot,
                                      const ResolvedLayout& layout,
                                      const std::vector<int64_t>& tokens);

// A prefix of `tokens` tokens exists in every row: 0 < tokens <= every
// kv_seq_len. InvalidArgument at "prefix.length".
absl::Status CheckPrefixTokens(const ResolvedLayout& layout, int64_t tokens);

}  // namespace fingerprint_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_FINGERPRINT_KV_ACCESS_H_
