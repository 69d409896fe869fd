// Element types of snapshot tensors and exact conversions between them.
//
// Every narrow float type converts to float exactly (bf16, f16, fp8 are
// subsets of f32), so the reference widens without rounding. Narrowing
// (f32 -> bf16/f16/fp8) rounds to nearest, ties to even, as engines' casts
// do; fp8 narrowing saturates to the largest finite value (vLLM's
// scaled_fp8_quant clamps before it casts). What each dtype is (width,
// name, mantissa and exponent range, epsilon, limits) is one table,
// dtype_traits.h; the functions below that describe a dtype are lookups
// in it. All functions are pure and thread-safe.
#ifndef ATTNAUDIT_CORE_TENSOR_DTYPE_H_
#define ATTNAUDIT_CORE_TENSOR_DTYPE_H_

#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace attnaudit {

// The numbering matches proto/attnaudit/v1 DType so the codec is a cast.
enum class DType : int {
  kInvalid = 0,
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kF8E4M3 = 4,  // OCP e4m3fn: no infinities, 0x7f/0xff are NaN, max 448.
  kF8E5M2 = 5,  // OCP e5m2: IEEE-like, with infinities, max 57344.
  kF64 = 6,
  kI32 = 7,
  kI64 = 8,
  kBool = 9,  // one byte per element, 0 or 1.
};

// Bytes per element; 0 for kInvalid.
int DTypeSize(DType dtype);
// Short lowercase name: "f32", "bf16", "fp8_e4m3", ... ; "invalid".
absl::string_view DTypeName(DType dtype);
// Inverse of DTypeName (also accepts "float32", "bfloat16", "half",
// "float16", "e4m3", "e5m2"); kInvalid when unknown.
DType DTypeFromName(absl::string_view name);
bool IsFloating(DType dtype);
bool IsInteger(DType dtype);
// Machine epsilon of a floating dtype (distance from 1 to the next value).
double DTypeEpsilon(DType dtype);

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float Bf16ToFloat(uint16_t h) {
  return BitsToFloat(static_cast<uint32_t>(h) << 16);
}
inline uint16_t FloatToBf16(float f) {
  uint32_t bits = FloatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet NaN
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float F16ToFloat(uint16_t h);
uint16_t FloatToF16(float f);
float F8E4M3ToFloat(uint8_t v);
uint8_t FloatToF8E4M3(float f);
float F8E5M2ToFloat(uint8_t v);
uint8_t FloatToF8E5M2(float f);

// The smallest positive (subnormal) value of a floating dtype: one ULP at
// zero (f32's for non-floating dtypes).
double DTypeDenormMin(DType dtype);

// The spacing of a floating `dtype`'s values at |x| (one ulp there),
// counted as a normal number's: |x| below the smallest normal (f16's own,
// else f32's, where engines flush or compute) counts as that normal.
double UlpAt(double x, DType dtype);

// Rounds a float to the nearest value representable in `dtype` and returns
// it as a float (identity for f32 and f64-as-f32).
float RoundToDType(float value, DType dtype);

// Rounds a float towards zero to a value representable in `dtype`
// (truncation: the dropped mantissa bits cleared; a finite value never
// becomes infinite). NaN and infinities pass through; identity for f32 and
// f64-as-f32. What some engines' conversions do (vLLM's CPU bf16 without
// AVX512_BF16).
float RoundTowardZeroToDType(float value, DType dtype);

// Reads element i of a floating buffer of `dtype` as float (f64 is rounded
// to float). Slow path; hot loops use the typed converters directly.
float LoadAsFloat(const void* data, DType dtype, int64_t i);
double LoadAsDouble(const void* data, DType dtype, int64_t i);
// Writes `value` rounded to `dtype` into element i.
void StoreFromFloat(void* data, DType dtype, int64_t i, float value);
void StoreFromDouble(void* data, DType dtype, int64_t i, double value);

// Converts n elements of `src` (a floating dtype) to float / double.
void ConvertToFloat(const void* src, DType dtype, int64_t n, float* dst);
void ConvertToDouble(const void* src, DType dtype, int64_t n, double* dst);

// Distance in units in the last place between a and b after rounding both
// to `dtype` (a floating dtype): the number of representable values between
// them. 0 when both are NaN or equal; UINT64_MAX when exactly one is NaN.
uint64_t UlpDistance(double a, double b, DType dtype);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_TENSOR_DTYPE_H_
