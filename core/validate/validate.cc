// Snapshot validation entry points. The work is split into four phases
// (validate_internal.h), run cheapest first so that nothing proportional to
// a claimed size is allocated or read before the sizes are proven
// consistent with the bytes actually received and within the limits.
#include "core/validate/validate.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/validate/validate_internal.h"

namespace attnaudit {
namespace validate_internal {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string IndexPath(absl::string_view field,
                      std::initializer_list<int64_t> index) {
  std::string out(field);
  for (int64_t i : index) absl::StrAppend(&out, "[", i, "]");
  return out;
}

std::string ElementPath(absl::string_view field,
                        const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] > 0) {
      index[k] = flat % shape[k];
      flat /= shape[k];
    }
  }
  std::string out(field);
  for (int64_t i : index) absl::StrAppend(&out, "[", i, "]");
  return out;
}

}  // namespace validate_internal

absl::StatusOr<ResolvedLayout> ValidateSnapshot(const Snapshot& snapshot,
                                                const ValidationLimits& limits,
                                                ValueScan scan) {
  using namespace validate_internal;  // NOLINT(build/namespaces)
  SnapshotDims dims;
  ATTNAUDIT_RETURN_IF_ERROR(CheckStructure(snapshot, limits, &dims));
  ATTNAUDIT_RETURN_IF_ERROR(CheckConfig(snapshot, limits, dims));
  ResolvedLayout layout;
  std::vector<uint8_t> active_slots;
  ATTNAUDIT_RETURN_IF_ERROR(
      CheckRows(snapshot, limits, dims, &layout, &active_slots));
  ATTNAUDIT_RETURN_IF_ERROR(
      CheckFiniteValues(snapshot, dims, active_slots, scan == ValueScan::kAll));
  return layout;
}

// Returns -1 when (batch, token) is outside the layout; callers pass
// indices of a validated snapshot, so that never happens in the pipeline.
int32_t TokenOwner(const Snapshot& snapshot, const ResolvedLayout& layout,
                   int64_t batch, int64_t token) {
  const int64_t page_size = layout.dims.page_size;
  if (batch < 0 || batch >= static_cast<int64_t>(layout.block_pages.size()) ||
      token < 0 || page_size <= 0 ||
      token >= layout.seq_lens[static_cast<size_t>(batch)]) {
    return -1;
  }
  const int64_t world = snapshot.cp.world_size;
  if (world <= 1) return 0;
  const int64_t block = token / page_size;
  switch (snapshot.cp.sharding) {
    case CpSharding::kExplicitOwners:
      return layout.block_owners[batch][block];
    case CpSharding::kPageInterleaved:
      return static_cast<int32_t>(block % world);
    case CpSharding::kTokenInterleaved: {
      const int64_t page = layout.block_pages[batch][block];
      const int64_t pos = validate_internal::IntView(
          snapshot.slot_positions)[page * page_size + token % page_size];
      const int64_t interleave =
          std::max<int64_t>(1, snapshot.cp.interleave_size);
      return static_cast<int32_t>((pos / interleave) % world);
    }
    case CpSharding::kNone:
      break;
  }
  return 0;
}

}  // namespace attnaudit
