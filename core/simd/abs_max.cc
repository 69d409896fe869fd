// AbsMaxima (abs_max.h): one vector loop per element width, dispatched to
// the target in use.
// clang-format off: foreach_target.h must come first, before the
// headers it re-includes for every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/simd/abs_max.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cstring>

#include "core/simd/abs_max.h"
#include "core/simd/dispatch.h"
#include "core/simd/simd-inl.h"
#include "core/tensor/dtype_traits.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

// running[i] = max(running[i], |row[i]| if finite else 0), on the bits:
// `magnitude` clears the sign, and a magnitude at or above `non_finite`
// (the first infinity or NaN pattern) counts as 0.
template <typename T>
void FoldAbsRow(const T* row, int64_t n, T magnitude, T non_finite,
                T* running) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto mask = hn::Set(d, magnitude);
  const auto limit = hn::Set(d, non_finite);
  const auto fold = [&](const T* src, T* dst) {
    const auto a = hn::And(hn::LoadU(d, src), mask);
    const auto finite = hn::IfThenElseZero(hn::Lt(a, limit), a);
    hn::StoreU(hn::Max(hn::LoadU(d, dst), finite), d, dst);
  };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) fold(row + i, running + i);
  // The tail through the same vector code, padded with zeros.
  if (i < n) {
    HWY_ALIGN T src[hn::MaxLanes(d)] = {};
    HWY_ALIGN T dst[hn::MaxLanes(d)] = {};
    std::copy(row + i, row + n, src);
    std::copy(running + i, running + n, dst);
    fold(src, dst);
    std::copy(dst, dst + (n - i), running + i);
  }
}

// `rows` rows of n elements, `stride` elements apart, in one call: a page
// of one head's keys is a few dozen rows, and a call per row cost more
// than the fold.
template <typename T>
void FoldAbsRows(const T* first, int64_t rows, int64_t stride, int64_t n,
                 T magnitude, T non_finite, T* running) {
  for (int64_t r = 0; r < rows; ++r) {
    FoldAbsRow(first + r * stride, n, magnitude, non_finite, running);
  }
}

void FoldAbs8Impl(const uint8_t* first, int64_t rows, int64_t stride, int64_t n,
                  uint8_t magnitude, uint8_t non_finite, uint8_t* running) {
  FoldAbsRows(first, rows, stride, n, magnitude, non_finite, running);
}
void FoldAbs16Impl(const uint16_t* first, int64_t rows, int64_t stride,
                   int64_t n, uint16_t magnitude, uint16_t non_finite,
                   uint16_t* running) {
  FoldAbsRows(first, rows, stride, n, magnitude, non_finite, running);
}
void FoldAbs32Impl(const uint32_t* first, int64_t rows, int64_t stride,
                   int64_t n, uint32_t magnitude, uint32_t non_finite,
                   uint32_t* running) {
  FoldAbsRows(first, rows, stride, n, magnitude, non_finite, running);
}
void FoldAbs64Impl(const uint64_t* first, int64_t rows, int64_t stride,
                   int64_t n, uint64_t magnitude, uint64_t non_finite,
                   uint64_t* running) {
  FoldAbsRows(first, rows, stride, n, magnitude, non_finite, running);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {

ATTNAUDIT_SIMD_EXPORT(FoldAbs8Impl);
ATTNAUDIT_SIMD_EXPORT(FoldAbs16Impl);
ATTNAUDIT_SIMD_EXPORT(FoldAbs32Impl);
ATTNAUDIT_SIMD_EXPORT(FoldAbs64Impl);

namespace {

// The sign-cleared pattern of the first non-finite value of a floating
// encoding, as validation's finite scan reads it: the all-ones exponent
// (infinity), or e4m3fn's S.1111.111 (NaN; it has no infinity). 0 for a
// dtype that is not floating.
uint64_t NonFiniteFrom(DType dtype) {
  const DTypeTraits& t = DTypeTraitsOf(dtype);
  if (!t.floating()) return 0;
  const uint64_t magnitude = (uint64_t{1} << (8 * t.bytes - 1)) - 1;
  return t.has_infinity
             ? ((uint64_t{1} << t.exponent_bits) - 1) << t.mantissa_bits
             : magnitude;
}

template <typename T>
const T* As(const void* p) {
  return static_cast<const T*>(p);
}
template <typename T>
T* As(void* p) {
  return static_cast<T*>(p);
}

}  // namespace

bool AbsMaxima::Supports(DType dtype) { return NonFiniteFrom(dtype) != 0; }

AbsMaxima::AbsMaxima(DType dtype, int64_t n)
    : dtype_(dtype),
      n_(n),
      bits_(static_cast<size_t>(n * DTypeSize(dtype)), 0) {}

void AbsMaxima::Add(const void* row) { AddRows(row, 1, n_); }

void AbsMaxima::AddRows(const void* first, int64_t rows, int64_t stride) {
  const uint64_t limit = NonFiniteFrom(dtype_);
  void* running = bits_.data();
  switch (DTypeSize(dtype_)) {
    case 1:
      ATTNAUDIT_SIMD_DISPATCH(FoldAbs8Impl)
      (As<uint8_t>(first), rows, stride, n_, 0x7f, static_cast<uint8_t>(limit),
       As<uint8_t>(running));
      return;
    case 2:
      ATTNAUDIT_SIMD_DISPATCH(FoldAbs16Impl)
      (As<uint16_t>(first), rows, stride, n_, 0x7fff,
       static_cast<uint16_t>(limit), As<uint16_t>(running));
      return;
    case 4:
      ATTNAUDIT_SIMD_DISPATCH(FoldAbs32Impl)
      (As<uint32_t>(first), rows, stride, n_, 0x7fffffffu,
       static_cast<uint32_t>(limit), As<uint32_t>(running));
      return;
    default:
      ATTNAUDIT_SIMD_DISPATCH(FoldAbs64Impl)
      (As<uint64_t>(first), rows, stride, n_, 0x7fffffffffffffffull, limit,
       As<uint64_t>(running));
      return;
  }
}

void AbsMaxima::Merge(const AbsMaxima& other) { Add(other.bits_.data()); }

float AbsMaxima::At(int64_t i) const {
  return LoadAsFloat(bits_.data(), dtype_, i);
}

float AbsMaxima::Max() const {
  float m = 0;
  for (int64_t i = 0; i < n_; ++i) m = std::max(m, At(i));
  return m;
}

}  // namespace attnaudit
#endif  // HWY_ONCE
