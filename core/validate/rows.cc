// Phase 3 of snapshot validation: the page table and position semantics of
// every row, resolved into a ResolvedLayout.
//
// For row b with L = kv_seq_lens[b], logical token i lives in slot
// (page of block i / P, i % P) of the shared pool. The row's blocks must
// name distinct pages (a page may be shared by different rows: prefix
// sharing), positions read in logical order must be >= 0 and strictly
// increasing, every query position must be one of them, and every slot no
// row reaches must carry -1. Work is O(B * M + sum L + N * P) with
// allocations of O(N * P) bytes (bounded by the k_pages bytes already in
// memory) plus the layout itself.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/validate/validate_internal.h"

namespace attnaudit {
namespace validate_internal {
namespace {

// Maps block_table entries to indices into k_pages/v_pages: the identity
// when page_ids is absent, else the position of the entry in page_ids.
class PageResolver {
 public:
  static absl::StatusOr<PageResolver> Create(const Snapshot& s,
                                             int64_t num_pages) {
    PageResolver r;
    r.num_pages_ = num_pages;
    if (!s.page_ids.present()) return r;
    r.mapped_ = true;
    const IntView ids(s.page_ids);
    r.sorted_.reserve(static_cast<size_t>(num_pages));
    for (int64_t i = 0; i < num_pages; ++i) {
      if (ids[i] < 0) {
        return Invalid(IndexPath("page_ids", {i}), "page id ", ids[i],
                       " is negative");
      }
      r.sorted_.emplace_back(ids[i], static_cast<int32_t>(i));
    }
    std::sort(r.sorted_.begin(), r.sorted_.end());
    for (size_t i = 1; i < r.sorted_.size(); ++i) {
      if (r.sorted_[i].first == r.sorted_[i - 1].first) {
        return Invalid(IndexPath("page_ids", {r.sorted_[i].second}),
                       "duplicate page id ", r.sorted_[i].first,
                       " (also page_ids[", r.sorted_[i - 1].second, "])");
      }
    }
    return r;
  }

  // Page index for `entry`, or -1 when it names no page (Unresolved says
  // why). The error path is built only then, so a valid table costs no
  // allocation per entry.
  int64_t Resolve(int64_t entry) const {
    if (!mapped_) return entry >= 0 && entry < num_pages_ ? entry : -1;
    auto it = std::lower_bound(sorted_.begin(), sorted_.end(),
                               std::make_pair(entry, int32_t{-1}));
    return it != sorted_.end() && it->first == entry ? it->second : -1;
  }

  // Why `entry`, at `path`, names no page.
  absl::Status Unresolved(int64_t entry, absl::string_view path) const {
    if (!mapped_) {
      return Invalid(path, "page ", entry, " is out of range [0, ", num_pages_,
                     ")");
    }
    return Invalid(path, "page id ", entry, " is not in page_ids");
  }

 private:
  int64_t num_pages_ = 0;
  bool mapped_ = false;
  std::vector<std::pair<int64_t, int32_t>> sorted_;  // (page id, index)
};

// Position of logical token i of a row whose block pages are `pages`.
inline int64_t LogicalPosition(const IntView& slot_pos,
                               const std::vector<int32_t>& pages,
                               int64_t page_size, int64_t i) {
  return slot_pos[pages[i / page_size] * page_size + i % page_size];
}

// Block table entries and owners of row b; fills the row's pages.
absl::Status CheckBlockTableRow(const Snapshot& s, const SnapshotDims& d,
                                const PageResolver& resolver, int64_t b,
                                int64_t blocks, std::vector<int32_t>* stamp,
                                std::vector<int32_t>* first_block,
                                std::vector<int32_t>* pages) {
  const IntView table(s.block_table);
  const int64_t m = d.max_blocks;
  pages->resize(static_cast<size_t>(blocks));
  for (int64_t j = 0; j < blocks; ++j) {
    const int64_t entry = table[b * m + j];
    const int64_t page = resolver.Resolve(entry);
    if (page < 0) {
      return resolver.Unresolved(entry, IndexPath("block_table", {b, j}));
    }
    if ((*stamp)[page] == b) {
      return Invalid(IndexPath("block_table", {b, j}), "page ", entry,
                     " is already used by block ", (*first_block)[page],
                     " of this row (active block_table entries must not "
                     "contain duplicate pages)");
    }
    (*stamp)[page] = static_cast<int32_t>(b);
    (*first_block)[page] = static_cast<int32_t>(j);
    (*pages)[j] = static_cast<int32_t>(page);
  }
  for (int64_t j = blocks; j < m; ++j) {
    if (table[b * m + j] != -1) {
      return Invalid(IndexPath("block_table", {b, j}),
                     "unused block_table entries must be -1, got ",
                     table[b * m + j], " (kv_seq_lens[", b, "] needs ", blocks,
                     " blocks)");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOwnersRow(const Snapshot& s, const SnapshotDims& d, int64_t b,
                            const std::vector<int32_t>& pages,
                            std::vector<int32_t>* owners) {
  const int64_t blocks = static_cast<int64_t>(pages.size());
  const int64_t world = s.cp.world_size;
  owners->assign(static_cast<size_t>(blocks), 0);
  switch (s.cp.sharding) {
    case CpSharding::kExplicitOwners: {
      const IntView table(s.cp.block_owners);
      const int64_t m = d.max_blocks;
      for (int64_t j = 0; j < blocks; ++j) {
        const int64_t owner = table[b * m + j];
        if (owner < 0 || owner >= world) {
          return Invalid(IndexPath("cp.block_owners", {b, j}),
                         "active cp_block_owners entries must be in [0, ",
                         world, "), got ", owner);
        }
        (*owners)[j] = static_cast<int32_t>(owner);
      }
      for (int64_t j = blocks; j < m; ++j) {
        if (table[b * m + j] != -1) {
          return Invalid(IndexPath("cp.block_owners", {b, j}),
                         "unused cp_block_owners entries must be -1, got ",
                         table[b * m + j]);
        }
      }
      break;
    }
    case CpSharding::kPageInterleaved:
      for (int64_t j = 0; j < blocks; ++j) {
        (*owners)[j] = static_cast<int32_t>(j % world);
      }
      break;
    case CpSharding::kTokenInterleaved: {
      // vLLM DCP places token t on rank (t / I) % world, t being the
      // token's global position; a block's entry is its first token's rank.
      const IntView slot_pos(s.slot_positions);
      const int64_t interleave = s.cp.interleave_size;
      for (int64_t j = 0; j < blocks; ++j) {
        const int64_t pos = slot_pos[int64_t{pages[j]} * d.page_size];
        (*owners)[j] = static_cast<int32_t>((pos / interleave) % world);
      }
      break;
    }
    case CpSharding::kNone:  // every block on rank 0
      break;
  }
  return absl::OkStatus();
}

// Logical positions of row b: >= 0 and strictly increasing. Marks the
// row's slots active.
absl::Status CheckRowPositions(const Snapshot& s, const SnapshotDims& d,
                               int64_t b, int64_t len,
                               const std::vector<int32_t>& pages,
                               std::vector<uint8_t>* active) {
  const IntView slot_pos(s.slot_positions);
  const int64_t p = d.page_size;
  int64_t previous = -1;
  for (int64_t j = 0; j < static_cast<int64_t>(pages.size()); ++j) {
    const int64_t base = int64_t{pages[j]} * p;
    const int64_t count = std::min(p, len - j * p);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t pos = slot_pos[base + k];
      if (pos < 0 || pos <= previous) {
        return Invalid(
            IndexPath("slot_positions", {pages[j], k}),
            "block_table/slot_positions must reconstruct logical positions "
            "in strictly increasing global order: row ",
            b, " logical token ", j * p + k, " (block_table[", b, "][", j,
            "] -> page ", pages[j], ", slot ", k, ") has position ", pos,
            j * p + k == 0 ? std::string() : absl::StrCat(" after ", previous));
      }
      previous = pos;
      (*active)[base + k] = 1;
    }
  }
  return absl::OkStatus();
}

// Query positions of row b: >= 0, strictly increasing, each the position
// of a token of the row's cache (binary search: the row's positions are
// strictly increasing by now).
absl::Status CheckQueryPositions(const Snapshot& s, const SnapshotDims& d,
                                 int64_t b, int64_t len,
                                 const std::vector<int32_t>& pages) {
  const IntView query_pos(s.query_positions);
  const IntView slot_pos(s.slot_positions);
  int64_t previous = -1;
  for (int64_t q = 0; q < d.queries; ++q) {
    const int64_t t = query_pos[b * d.queries + q];
    // The error path, built only on failure.
    auto path = [&] { return IndexPath("query_positions", {b, q}); };
    if (t < 0) return Invalid(path(), "position ", t, " is negative");
    if (q > 0 && t <= previous) {
      return Invalid(path(), "position ", t,
                     " must be greater than the previous query position ",
                     previous,
                     " (query positions must be strictly "
                     "increasing)");
    }
    previous = t;
    int64_t lo = 0;
    int64_t hi = len;  // first logical index with position >= t
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (LogicalPosition(slot_pos, pages, d.page_size, mid) < t) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo == len || LogicalPosition(slot_pos, pages, d.page_size, lo) != t) {
      return Invalid(path(), "position ", t,
                     " must refer to a token present in row ", b,
                     "'s KV cache");
    }
  }
  return absl::OkStatus();
}

// Every slot: inactive ones carry -1 in slot_positions and
// key_rope_positions; active ones have key_rope_positions equal to
// slot_positions.
absl::Status CheckSlots(const Snapshot& s, const SnapshotDims& d,
                        const std::vector<uint8_t>& active) {
  const IntView slot_pos(s.slot_positions);
  const bool has_rope_pos = s.key_rope_positions.present();
  const IntView rope_pos =
      has_rope_pos ? IntView(s.key_rope_positions) : IntView(s.slot_positions);
  const int64_t p = d.page_size;
  for (int64_t page = 0; page < d.num_pages; ++page) {
    for (int64_t k = 0; k < p; ++k) {
      const int64_t slot = page * p + k;
      const int64_t pos = slot_pos[slot];
      const int64_t rpos = rope_pos[slot];
      if (active[slot]) {
        if (rpos != pos) {
          return Invalid(IndexPath("key_rope_positions", {page, k}), rpos,
                         " must match the cached global position ", pos,
                         " of this active slot");
        }
        continue;
      }
      if (pos != -1) {
        return Invalid(IndexPath("slot_positions", {page, k}),
                       "unused slot_positions entries must be -1, got ", pos,
                       " (no row's block table and kv_seq_len reach this "
                       "slot)");
      }
      if (rpos != -1) {
        return Invalid(IndexPath("key_rope_positions", {page, k}),
                       "unused key_rope_positions entries must be -1, got ",
                       rpos);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRows(const Snapshot& s, const ValidationLimits& limits,
                       const SnapshotDims& d, ResolvedLayout* layout,
                       std::vector<uint8_t>* active_slots) {
  ATTNAUDIT_ASSIGN_OR_RETURN(const PageResolver resolver,
                             PageResolver::Create(s, d.num_pages));
  const IntView seq_lens(s.kv_seq_lens);
  const int64_t p = d.page_size;
  // M * P, saturated (the limits keep it far below 2^63 unless a caller
  // lifts them).
  const int64_t capacity =
      d.max_blocks > std::numeric_limits<int64_t>::max() / p
          ? std::numeric_limits<int64_t>::max()
          : d.max_blocks * p;
  layout->dims = d;
  layout->seq_lens.assign(static_cast<size_t>(d.batch), 0);
  layout->block_pages.assign(static_cast<size_t>(d.batch), {});
  layout->block_owners.assign(static_cast<size_t>(d.batch), {});
  active_slots->assign(static_cast<size_t>(d.num_pages * p), 0);
  // stamp[page] = last row whose table named the page; first_block: where.
  std::vector<int32_t> stamp(static_cast<size_t>(d.num_pages), -1);
  std::vector<int32_t> first_block(static_cast<size_t>(d.num_pages), -1);

  for (int64_t b = 0; b < d.batch; ++b) {
    const int64_t len = seq_lens[b];
    auto len_path = [&] { return IndexPath("kv_seq_lens", {b}); };
    if (len < 1 || len > capacity) {
      return Invalid(len_path(), len, " is outside [1, ", capacity,
                     "] (M=", d.max_blocks, " blocks of P=", p, ")");
    }
    if (len > limits.max_context) {
      return Invalid(len_path(), len,
                     " exceeds limits.max_context=", limits.max_context);
    }
    layout->seq_lens[b] = len;
    const int64_t blocks = (len + p - 1) / p;
    std::vector<int32_t>& pages = layout->block_pages[b];
    ATTNAUDIT_RETURN_IF_ERROR(CheckBlockTableRow(s, d, resolver, b, blocks,
                                                 &stamp, &first_block, &pages));
    ATTNAUDIT_RETURN_IF_ERROR(
        CheckRowPositions(s, d, b, len, pages, active_slots));
    ATTNAUDIT_RETURN_IF_ERROR(
        CheckOwnersRow(s, d, b, pages, &layout->block_owners[b]));
    ATTNAUDIT_RETURN_IF_ERROR(CheckQueryPositions(s, d, b, len, pages));
    if (s.prefix.enabled && s.prefix.length > len) {
      return Invalid("prefix.length", s.prefix.length,
                     " must not exceed any kv_seq_lens entry, but "
                     "kv_seq_lens[",
                     b, "]=", len);
    }
  }
  return CheckSlots(s, d, *active_slots);
}

}  // namespace validate_internal
}  // namespace attnaudit
