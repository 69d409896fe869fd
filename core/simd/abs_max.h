// Element-wise maxima of |x| over many rows of one floating dtype, taken on
// the stored bits: in IEEE-style sign-magnitude encodings (f64, f32, bf16,
// f16, fp8 e4m3 and e5m2) the order of |x| over finite values is the order
// of the bits with the sign cleared, so a row is never converted, and the
// scan runs at memory speed in the widest vectors of the CPU. Non-finite
// elements (infinities, NaN) are skipped, as the callers' bounds need.
//
// Why: a tolerance that needs the largest |k| per dimension or |v| of a
// snapshot's keys reads megabytes per audit; converting each row to float
// first cost more than the audit's own pass over the same bytes.
//
// A value type; not thread-safe (one per thread, merged with Merge).
#ifndef ATTNAUDIT_CORE_SIMD_ABS_MAX_H_
#define ATTNAUDIT_CORE_SIMD_ABS_MAX_H_

#include <cstdint>
#include <vector>

#include "core/tensor/dtype.h"

namespace attnaudit {

class AbsMaxima {
 public:
  // Whether `dtype` is one of the encodings above.
  static bool Supports(DType dtype);

  // Maxima of rows of `n` elements of `dtype` (Supports(dtype) must hold),
  // all 0 until a row is added.
  AbsMaxima(DType dtype, int64_t n);

  // Folds one row of n elements in the stored encoding (unaligned is fine).
  void Add(const void* row);
  // Folds `rows` rows of n elements whose starts lie `stride` elements
  // apart (stride >= n), the first at `first`.
  void AddRows(const void* first, int64_t rows, int64_t stride);
  // Folds another AbsMaxima of the same dtype and n.
  void Merge(const AbsMaxima& other);

  // Element i's largest finite |x| as a float (0 when none was finite; an
  // f64 beyond float's range reads as infinity).
  float At(int64_t i) const;
  // The largest of them all.
  float Max() const;

 private:
  DType dtype_;
  int64_t n_;
  // The running maxima in the dtype's encoding, sign cleared.
  std::vector<uint8_t> bits_;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_SIMD_ABS_MAX_H_
