#include "core/fingerprint/kv_access.h"

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace attnaudit {
namespace fingerprint_internal {
namespace {

bool IsPositionDType(DType dtype) {
  return dtype == DType::kI32 || dtype == DType::kI64;
}

absl::Status CheckBytes(const Tensor& t, absl::string_view field) {
  if (!HoldsShapeBytes(t)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", t.DebugString(), " does not hold ",
                     "as many bytes as its shape says"));
  }
  return absl::OkStatus();
}

absl::Status CheckPositions(const Tensor& t, absl::string_view field,
                            int64_t num_pages, int64_t page_size) {
  if (!IsPositionDType(t.dtype()) || t.rank() != 2 || t.dim(0) != num_pages ||
      t.dim(1) != page_size) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected i32/i64[",
                                                   num_pages, ",", page_size,
                                                   "], got ", t.DebugString()));
  }
  return CheckBytes(t, field);
}

// K and V: floating, shaped as the resolved layout says, holding their
// bytes. Fills the pool fields of *kv.
absl::Status CheckPools(const Snapshot& snapshot, const SnapshotDims& dims,
                        PagedKv* kv) {
  const Tensor& k = snapshot.k_pages;
  const Tensor& v = snapshot.v_pages;
  kv->hnd = snapshot.kv_layout == KvLayout::kHND;
  kv->num_pages = dims.num_pages;
  kv->page_size = dims.page_size;
  kv->kv_heads = dims.kv_heads;
  kv->head_dim = dims.head_dim;
  if (kv->page_size <= 0 || kv->kv_heads <= 0 || kv->head_dim <= 0 ||
      kv->num_pages < 0) {
    return absl::InvalidArgumentError(
        "k_pages: the resolved layout has a non-positive page size, head "
        "count or head dim");
  }
  const std::vector<int64_t> expected =
      kv->hnd ? std::vector<int64_t>{kv->num_pages, kv->kv_heads, kv->page_size,
                                     kv->head_dim}
              : std::vector<int64_t>{kv->num_pages, kv->page_size, kv->kv_heads,
                                     kv->head_dim};
  for (const auto* t : {&k, &v}) {
    const char* field = t == &k ? "k_pages" : "v_pages";
    if (!IsFloating(t->dtype()) || t->shape() != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", t->DebugString(),
                       " disagrees with the resolved layout"));
    }
    ATTNAUDIT_RETURN_IF_ERROR(CheckBytes(*t, field));
  }
  kv->k = reinterpret_cast<const unsigned char*>(k.raw());
  kv->v = reinterpret_cast<const unsigned char*>(v.raw());
  kv->k_elem = DTypeSize(k.dtype());
  kv->v_elem = DTypeSize(v.dtype());
  return absl::OkStatus();
}

// Slot positions and (when sent) key RoPE positions: [N, P] integers.
absl::Status CheckSlotPositions(const Snapshot& snapshot, PagedKv* kv) {
  ATTNAUDIT_RETURN_IF_ERROR(CheckPositions(
      snapshot.slot_positions, "slot_positions", kv->num_pages, kv->page_size));
  kv->slot_positions = &snapshot.slot_positions;
  kv->key_positions = &snapshot.slot_positions;
  if (snapshot.key_rope_positions.present()) {
    ATTNAUDIT_RETURN_IF_ERROR(CheckPositions(snapshot.key_rope_positions,
                                             "key_rope_positions",
                                             kv->num_pages, kv->page_size));
    kv->key_positions = &snapshot.key_rope_positions;
  }
  return absl::OkStatus();
}

// Every row can supply its requested tokens from pages inside the pool.
absl::Status CheckRowPages(const ResolvedLayout& layout,
                           const std::vector<int64_t>& tokens,
                           const PagedKv& kv) {
  const size_t batch = layout.seq_lens.size();
  if (layout.block_pages.size() != batch || tokens.size() != batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_table: the resolved layout has ", layout.block_pages.size(),
        " rows of pages for ", batch, " sequence lengths"));
  }
  for (size_t b = 0; b < batch; ++b) {
    if (tokens[b] < 0 || tokens[b] > layout.seq_lens[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv_seq_lens[", b, "]: ", tokens[b],
                       " tokens requested of a row of ", layout.seq_lens[b]));
    }
    const int64_t blocks = (tokens[b] + kv.page_size - 1) / kv.page_size;
    if (static_cast<int64_t>(layout.block_pages[b].size()) < blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block_table[", b, "]: the resolved layout has ",
          layout.block_pages[b].size(), " blocks, ", blocks, " needed"));
    }
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t page = layout.block_pages[b][i];
      if (page < 0 || page >= kv.num_pages) {
        return absl::InvalidArgumentError(
            absl::StrCat("block_table[", b, "][", i, "]: page index ", page,
                         " is out of range [0, ", kv.num_pages, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool HoldsShapeBytes(const Tensor& t) {
  const uint64_t elem = DTypeSize(t.dtype());
  int64_t n = 0;
  return elem > 0 && CheckedNumElements(t.shape(), &n) &&
         t.bytes().size() % elem == 0 &&
         static_cast<uint64_t>(n) == t.bytes().size() / elem;
}

absl::StatusOr<PagedKv> CheckKvAccess(const Snapshot& snapshot,
                                      const ResolvedLayout& layout,
                                      const std::vector<int64_t>& tokens) {
  PagedKv kv;
  ATTNAUDIT_RETURN_IF_ERROR(CheckPools(snapshot, layout.dims, &kv));
  ATTNAUDIT_RETURN_IF_ERROR(CheckSlotPositions(snapshot, &kv));
  ATTNAUDIT_RETURN_IF_ERROR(CheckRowPages(layout, tokens, kv));
  return kv;
}

absl::Status CheckPrefixTokens(const ResolvedLayout& layout, int64_t tokens) {
  if (tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix.length: must be a positive number of tokens, got ", tokens));
  }
  for (size_t b = 0; b < layout.seq_lens.size(); ++b) {
    if (tokens > layout.seq_lens[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefix.length: ", tokens, " tokens exceed kv_seq_lens[",
                       b, "] = ", layout.seq_lens[b]));
    }
  }
  return absl::OkStatus();
}

}  // namespace fingerprint_internal
}  // namespace attnaudit
