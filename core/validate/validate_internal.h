// Internal pieces of snapshot validation (core/validate/validate.h), split
// by phase so each file reads in one sitting:
//   structure.cc  presence, byte layouts, dtypes, ranks, shapes, size limits
//   config.cc     scalars and small configuration (RoPE, CP, prefix, ...)
//   rows.cc       per-row page table / position semantics -> ResolvedLayout
//   values.cc     finite scans over q, the active K/V slots and lm_head
// Nothing here is part of the public API; only validate.cc and the tests of
// core/validate include it. All functions are pure and thread-safe.
#ifndef ATTNAUDIT_CORE_VALIDATE_VALIDATE_INTERNAL_H_
#define ATTNAUDIT_CORE_VALIDATE_VALIDATE_INTERNAL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/snapshot/snapshot.h"
#include "core/tensor/tensor.h"
#include "core/validate/validate.h"

namespace attnaudit {
namespace validate_internal {

// InvalidArgument "<field>: <message pieces...>".
template <typename... Args>
absl::Status Invalid(absl::string_view field, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", args...));
}

// "[1,2,3]"
std::string ShapeString(const std::vector<int64_t>& shape);

// "field[i0][i1]..." for an explicit multi-index.
std::string IndexPath(absl::string_view field,
                      std::initializer_list<int64_t> index);

// "field[i0][i1]..." for the row-major flat index `flat` of `shape`.
std::string ElementPath(absl::string_view field,
                        const std::vector<int64_t>& shape, int64_t flat);

// Read-only element access to an i32/i64 tensor, widened to int64. Holds a
// pointer into the tensor; the tensor must outlive the view. Reads through
// memcpy so the tensor's byte buffer needs no particular alignment.
class IntView {
 public:
  IntView() = default;
  explicit IntView(const Tensor& t)
      : data_(static_cast<const char*>(t.raw())),
        wide_(t.dtype() == DType::kI64) {}
  int64_t operator[](int64_t i) const {
    if (wide_) {
      int64_t v;
      std::memcpy(&v, data_ + 8 * i, 8);
      return v;
    }
    int32_t v;
    std::memcpy(&v, data_ + 4 * i, 4);
    return v;
  }

 private:
  const char* data_ = nullptr;
  bool wide_ = false;
};

// Phase 1 (structure.cc): presence of required tensors, Tensor::CheckLayout
// of every tensor against limits.max_tensor_bytes, the total against
// limits.max_total_bytes, dtypes, ranks, dims against the limits and shapes
// against each other. Touches no element and allocates nothing that grows
// with the input. On success fills *dims.
absl::Status CheckStructure(const Snapshot& s, const ValidationLimits& limits,
                            SnapshotDims* dims);

// Phase 2 (config.cc): every scalar/enum field, RoPE (through
// RopeTable::Create), CP configuration, prefix configuration, and the
// element values of the small tensors whose size the limits bound tightly
// (k/v scales, sinks, page_ids, selected ids, active mask). Needs phase 1.
absl::Status CheckConfig(const Snapshot& s, const ValidationLimits& limits,
                         const SnapshotDims& dims);

// Phase 3 (rows.cc): per row, kv_seq_len, the block table, CP owners,
// logical positions, query positions and the prefix length; then every
// slot of the pool (inactive slots -1, key RoPE positions). Fills *layout
// and, in *active_slots ([N * P], 1 = reached by some row), the slots whose
// K/V the audit reads. Needs phases 1 and 2.
absl::Status CheckRows(const Snapshot& s, const ValidationLimits& limits,
                       const SnapshotDims& dims, ResolvedLayout* layout,
                       std::vector<uint8_t>* active_slots);

// Phase 4 (values.cc): every q value, every K/V value of an active slot and
// every lm_head value are finite. Engine outputs are not checked (NaN there
// is drift, not bad input). K and V only when `scan_kv`.
absl::Status CheckFiniteValues(const Snapshot& s, const SnapshotDims& dims,
                               const std::vector<uint8_t>& active_slots,
                               bool scan_kv);

// Index (relative to `data`) of the first non-finite element among n
// elements of floating `dtype`, or -1 when all are finite. Works on the bit
// patterns with integer max-reductions the compiler vectorises.
int64_t FirstNonFinite(const void* data, DType dtype, int64_t n);

}  // namespace validate_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_VALIDATE_VALIDATE_INTERNAL_H_
