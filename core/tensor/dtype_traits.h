// What each DType is, in one constexpr table: its name and the names also
// accepted for it, its width, its kind, and for the floating formats the
// numbers the rest of the core reads off them (mantissa bits, exponent
// range, epsilon, smallest normal, smallest subnormal, largest finite,
// infinities, saturating narrowing). dtype.h's DTypeSize, DTypeName,
// DTypeFromName, IsFloating, IsInteger, DTypeEpsilon and DTypeDenormMin are
// lookups in it, and a new dtype is one more row here (plus its
// conversions in dtype.cc). Device code cannot read this host table:
// kernels/math holds a copy of the few facts it needs, and
// tests/unit/kernels/kernel_math_test.cc keeps that copy equal to it.
// Pure, constexpr and thread-safe.
#ifndef ATTNAUDIT_CORE_TENSOR_DTYPE_TRAITS_H_
#define ATTNAUDIT_CORE_TENSOR_DTYPE_TRAITS_H_

#include "absl/strings/string_view.h"
#include "core/tensor/dtype.h"

namespace attnaudit {

enum class DTypeKind { kInvalid, kFloating, kInteger, kBool };

namespace dtype_internal {
// 2^e, exactly, for e from -1074 to 1023 (std::ldexp is not constexpr in
// C++17). By squaring: the epsilons and limits below are also read at run
// time, per element in places, so it takes log2|e| steps, not |e|. Every
// partial product is a power of two no smaller than the result, so exact.
constexpr double Pow2(int e) {
  double r = 1.0;
  double base = e < 0 ? 0.5 : 2.0;
  for (unsigned n = static_cast<unsigned>(e < 0 ? -e : e); n != 0;) {
    if ((n & 1u) != 0) r *= base;
    n >>= 1;
    if (n != 0) base *= base;
  }
  return r;
}
}  // namespace dtype_internal

struct DTypeTraits {
  DType dtype;
  absl::string_view name;        // DTypeName's
  absl::string_view aliases[3];  // also accepted by DTypeFromName
  int bytes;                     // per element; 0 for kInvalid
  DTypeKind kind;

  // Floating formats only (0 or false otherwise). A normal value is
  // 1.m * 2^e with min_normal_exponent <= e <= max_exponent.
  int mantissa_bits;  // stored fraction bits: f32 23, bf16 7, e4m3 3
  int exponent_bits;
  int min_normal_exponent;
  int max_exponent;   // of the largest finite value
  double max_finite;  // e4m3fn: 448 (its top code is NaN, not 480)
  bool has_infinity;  // false: e4m3fn (0x7f/0xff are NaN)
  // Narrowing to this dtype clamps finite values beyond max_finite to it
  // instead of rounding them to infinity (fp8: vLLM clamps, then casts).
  bool saturates;

  constexpr bool floating() const { return kind == DTypeKind::kFloating; }
  // The distance from 1 to the next value.
  constexpr double epsilon() const {
    return floating() ? dtype_internal::Pow2(-mantissa_bits) : 0.0;
  }
  constexpr double smallest_normal() const {
    return floating() ? dtype_internal::Pow2(min_normal_exponent) : 0.0;
  }
  // The smallest positive (subnormal) value: one ULP at zero.
  constexpr double denorm_min() const {
    return floating()
               ? dtype_internal::Pow2(min_normal_exponent - mantissa_bits)
               : 0.0;
  }
  constexpr int exponent_bias() const { return 1 - min_normal_exponent; }
};

// clang-format off
inline constexpr DTypeTraits kDTypeTraits[] = {
    // dtype, name, aliases, bytes, kind,
    //   mantissa bits, exponent bits, min normal exponent, max exponent,
    //   max finite, has infinity, saturates
    {DType::kInvalid, "invalid", {}, 0, DTypeKind::kInvalid,
     0, 0, 0, 0, 0.0, false, false},
    {DType::kF32, "f32", {"float32", "float"}, 4, DTypeKind::kFloating,
     23, 8, -126, 127, 3.4028234663852886e38, true, false},
    {DType::kF16, "f16", {"float16", "half"}, 2, DTypeKind::kFloating,
     10, 5, -14, 15, 65504.0, true, false},
    {DType::kBF16, "bf16", {"bfloat16"}, 2, DTypeKind::kFloating,
     7, 8, -126, 127, 3.3895313892515355e38, true, false},
    {DType::kF8E4M3, "fp8_e4m3", {"e4m3", "f8e4m3"}, 1, DTypeKind::kFloating,
     3, 4, -6, 8, 448.0, false, true},
    {DType::kF8E5M2, "fp8_e5m2", {"e5m2", "f8e5m2"}, 1, DTypeKind::kFloating,
     2, 5, -14, 15, 57344.0, true, true},
    {DType::kF64, "f64", {"float64", "double"}, 8, DTypeKind::kFloating,
     52, 11, -1022, 1023, 1.7976931348623157e308, true, false},
    {DType::kI32, "i32", {"int32"}, 4, DTypeKind::kInteger,
     0, 0, 0, 0, 0.0, false, false},
    {DType::kI64, "i64", {"int64"}, 8, DTypeKind::kInteger,
     0, 0, 0, 0, 0.0, false, false},
    {DType::kBool, "bool", {}, 1, DTypeKind::kBool,
     0, 0, 0, 0, 0.0, false, false},
};
// clang-format on
inline constexpr int kNumDTypes =
    static_cast<int>(sizeof kDTypeTraits / sizeof kDTypeTraits[0]);

namespace dtype_internal {
constexpr bool RowsFollowTheEnum() {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (static_cast<int>(kDTypeTraits[i].dtype) != i) return false;
  }
  return true;
}
static_assert(RowsFollowTheEnum(), "kDTypeTraits[i] is the row of DType i");
}  // namespace dtype_internal

// The row of `dtype`; kInvalid's for a value outside the enum (a dtype
// cast from an unchecked integer).
constexpr const DTypeTraits& DTypeTraitsOf(DType dtype) {
  const int i = static_cast<int>(dtype);
  return kDTypeTraits[i >= 0 && i < kNumDTypes ? i : 0];
}

constexpr bool IsFp8(DType dtype) {
  return DTypeTraitsOf(dtype).floating() && DTypeTraitsOf(dtype).bytes == 1;
}
// The smallest positive normal value: f32's for a dtype that is not
// floating (as DTypeDenormMin).
constexpr double DTypeSmallestNormal(DType dtype) {
  return DTypeTraitsOf(dtype).floating()
             ? DTypeTraitsOf(dtype).smallest_normal()
             : DTypeTraitsOf(DType::kF32).smallest_normal();
}
// The largest finite value of a floating dtype; 0 otherwise.
constexpr double DTypeMaxFinite(DType dtype) {
  return DTypeTraitsOf(dtype).max_finite;
}

// fp32's and bf16's epsilons, which the tolerances are written in.
inline constexpr double kEpsF32 = DTypeTraitsOf(DType::kF32).epsilon();
inline constexpr double kEpsBf16 = DTypeTraitsOf(DType::kBF16).epsilon();

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_TENSOR_DTYPE_TRAITS_H_
