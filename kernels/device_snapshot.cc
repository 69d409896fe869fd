#include "kernels/device_snapshot.h"

#include "core/common/status_macros.h"
#include "core/tensor/dtype.h"

namespace attnaudit {
namespace cuda_internal {

absl::StatusOr<DeviceSnapshot> UploadSnapshot(const PreparedAttention& p,
                                              DeviceArena& arena,
                                              PinnedStaging& staging,
                                              cudaStream_t stream,
                                              const ShardPages* shard) {
  const SnapshotDims& d = p.dims;
  const bool compact = shard != nullptr && !shard->whole_pool();
  const int64_t page_elems = d.page_size * d.kv_heads * d.head_dim;
  const int64_t pages =
      compact ? static_cast<int64_t>(shard->pages().size()) : d.num_pages;
  DeviceSnapshot s;
  const int64_t k_page = page_elems * DTypeSize(p.k_dtype);
  const int64_t v_page = page_elems * DTypeSize(p.v_dtype);
  const int64_t k_bytes = pages * k_page;
  const int64_t v_bytes = pages * v_page;
  ATTNAUDIT_ASSIGN_OR_RETURN(char* k, arena.Allocate(k_bytes, "the K pages"));
  ATTNAUDIT_ASSIGN_OR_RETURN(char* v, arena.Allocate(v_bytes, "the V pages"));
  std::vector<int64_t> positions;
  positions.reserve(static_cast<size_t>(pages * d.page_size));
  if (compact) {
    std::vector<PinnedStaging::Piece> k_pieces;
    std::vector<PinnedStaging::Piece> v_pieces;
    const char* k_data = static_cast<const char*>(p.k_data);
    const char* v_data = static_cast<const char*>(p.v_data);
    for (int64_t page : shard->pages()) {
      k_pieces.push_back({k_data + page * k_page, k_page});
      v_pieces.push_back({v_data + page * v_page, v_page});
      for (int64_t t = 0; t < d.page_size; ++t) {
        positions.push_back(
            p.snapshot->slot_positions.IntAt(page * d.page_size + t));
      }
    }
    ATTNAUDIT_RETURN_IF_ERROR(staging.UploadPieces(k, k_pieces, stream));
    ATTNAUDIT_RETURN_IF_ERROR(staging.UploadPieces(v, v_pieces, stream));
  } else {
    ATTNAUDIT_RETURN_IF_ERROR(staging.Upload(k, p.k_data, k_bytes, stream));
    ATTNAUDIT_RETURN_IF_ERROR(staging.Upload(v, p.v_data, v_bytes, stream));
    for (int64_t i = 0; i < d.num_pages * d.page_size; ++i) {
      positions.push_back(p.snapshot->slot_positions.IntAt(i));
    }
  }
  s.k = k;
  s.v = v;
  ATTNAUDIT_ASSIGN_OR_RETURN(s.positions, UploadVector(positions, "positions",
                                                       arena, staging, stream));
  ATTNAUDIT_ASSIGN_OR_RETURN(s.q,
                             UploadVector(p.q, "q", arena, staging, stream));
  ATTNAUDIT_ASSIGN_OR_RETURN(s.query_positions,
                             UploadVector(p.query_positions, "query positions",
                                          arena, staging, stream));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      s.k_scale, UploadVector(p.k_scale, "k scales", arena, staging, stream));
  const std::vector<int64_t> unit_base = UnitBase(p);
  ATTNAUDIT_ASSIGN_OR_RETURN(s.unit_base, UploadVector(unit_base, "unit bases",
                                                       arena, staging, stream));
  s.bytes = k_bytes + v_bytes +
            static_cast<int64_t>(positions.size() * 8 + p.q.size() * 8);
  return s;
}

}  // namespace cuda_internal
}  // namespace attnaudit
