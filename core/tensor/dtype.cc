#include "core/tensor/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace {

// A small IEEE-like binary float format: 1 sign bit, `ebits`, `mbits`.
struct SmallFloat {
  int ebits;
  int mbits;
  int bias;
  bool has_inf;  // all-ones exponent is inf/NaN (IEEE); else e4m3fn
  double max_finite;
  bool saturate;  // out-of-range finite values clamp to max_finite
};

constexpr SmallFloat SmallFloatOf(DType dtype) {
  const DTypeTraits& t = DTypeTraitsOf(dtype);
  return {t.exponent_bits, t.mantissa_bits, t.exponent_bias(),
          t.has_infinity,  t.max_finite,    t.saturates};
}

constexpr SmallFloat kF16Format = SmallFloatOf(DType::kF16);
constexpr SmallFloat kE4M3Format = SmallFloatOf(DType::kF8E4M3);
constexpr SmallFloat kE5M2Format = SmallFloatOf(DType::kF8E5M2);

uint32_t SignBit(const SmallFloat& fmt) {
  return 1u << (fmt.ebits + fmt.mbits);
}

uint32_t MaxFiniteCode(const SmallFloat& fmt) {
  const uint32_t mant_all = (1u << fmt.mbits) - 1;
  if (fmt.has_inf) {
    return (((1u << fmt.ebits) - 2) << fmt.mbits) | mant_all;
  }
  // e4m3fn: exponent all ones is usable except the NaN mantissa all ones.
  return (((1u << fmt.ebits) - 1) << fmt.mbits) | (mant_all - 1);
}

uint32_t Encode(double f, const SmallFloat& fmt) {
  const uint32_t sign = std::signbit(f) ? SignBit(fmt) : 0u;
  const uint32_t exp_all = (1u << fmt.ebits) - 1;
  if (std::isnan(f)) {
    return sign | (exp_all << fmt.mbits) | ((1u << fmt.mbits) - 1);
  }
  double a = std::fabs(f);
  const uint32_t inf_code = fmt.has_inf ? (exp_all << fmt.mbits) : 0u;
  if (std::isinf(a)) {
    return sign |
           (fmt.has_inf && !fmt.saturate ? inf_code : MaxFiniteCode(fmt));
  }
  if (a == 0.0) return sign;
  int e2 = 0;
  std::frexp(a, &e2);
  int exponent = e2 - 1;
  const int min_exp = 1 - fmt.bias;
  if (exponent < min_exp) exponent = min_exp;
  double quantum = std::ldexp(1.0, exponent - fmt.mbits);
  double q = std::nearbyint(a / quantum);  // default rounding: ties to even
  const double implicit = std::ldexp(1.0, fmt.mbits);
  if (q >= 2 * implicit) {
    exponent += 1;
    q = implicit;
  }
  const double value = q * std::ldexp(1.0, exponent - fmt.mbits);
  if (value > fmt.max_finite) {
    if (fmt.saturate || !fmt.has_inf) return sign | MaxFiniteCode(fmt);
    return sign | inf_code;
  }
  if (q < implicit) {  // subnormal
    return sign | static_cast<uint32_t>(q);
  }
  const uint32_t exp_field = static_cast<uint32_t>(exponent + fmt.bias);
  return sign | (exp_field << fmt.mbits) | static_cast<uint32_t>(q - implicit);
}

double Decode(uint32_t code, const SmallFloat& fmt) {
  const bool negative = (code & SignBit(fmt)) != 0;
  const uint32_t exp_all = (1u << fmt.ebits) - 1;
  const uint32_t exp_field = (code >> fmt.mbits) & exp_all;
  const uint32_t mant = code & ((1u << fmt.mbits) - 1);
  double value;
  if (fmt.has_inf && exp_field == exp_all) {
    value = mant == 0 ? std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::quiet_NaN();
  } else if (!fmt.has_inf && exp_field == exp_all &&
             mant == (1u << fmt.mbits) - 1) {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (exp_field == 0) {
    value = std::ldexp(static_cast<double>(mant), 1 - fmt.bias - fmt.mbits);
  } else {
    value = std::ldexp(static_cast<double>(mant + (1u << fmt.mbits)),
                       static_cast<int>(exp_field) - fmt.bias - fmt.mbits);
  }
  return negative ? -value : value;
}

struct Fp8Tables {
  float e4m3[256];
  float e5m2[256];
  Fp8Tables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = static_cast<float>(Decode(i, kE4M3Format));
      e5m2[i] = static_cast<float>(Decode(i, kE5M2Format));
    }
  }
};
const Fp8Tables& Tables() {
  static const Fp8Tables* tables = new Fp8Tables();
  return *tables;
}

// Maps a code of a sign-magnitude format to an integer that orders like the
// value, so that ULP distance is a difference.
int64_t OrderedFromSignMagnitude(uint64_t code, int sign_bit) {
  const uint64_t sign = uint64_t{1} << sign_bit;
  const int64_t magnitude = static_cast<int64_t>(code & (sign - 1));
  return (code & sign) ? -magnitude : magnitude;
}

}  // namespace

int DTypeSize(DType dtype) { return DTypeTraitsOf(dtype).bytes; }

absl::string_view DTypeName(DType dtype) { return DTypeTraitsOf(dtype).name; }

DType DTypeFromName(absl::string_view name) {
  for (const DTypeTraits& t : kDTypeTraits) {
    if (t.dtype == DType::kInvalid) continue;
    if (name == t.name) return t.dtype;
    for (absl::string_view alias : t.aliases) {
      if (!alias.empty() && name == alias) return t.dtype;
    }
  }
  return DType::kInvalid;
}

bool IsFloating(DType dtype) { return DTypeTraitsOf(dtype).floating(); }

bool IsInteger(DType dtype) {
  return DTypeTraitsOf(dtype).kind == DTypeKind::kInteger;
}

double DTypeEpsilon(DType dtype) { return DTypeTraitsOf(dtype).epsilon(); }

float F16ToFloat(uint16_t h) {
  return static_cast<float>(Decode(h, kF16Format));
}
uint16_t FloatToF16(float f) {
  return static_cast<uint16_t>(Encode(f, kF16Format));
}
float F8E4M3ToFloat(uint8_t v) { return Tables().e4m3[v]; }
uint8_t FloatToF8E4M3(float f) {
  return static_cast<uint8_t>(Encode(f, kE4M3Format));
}
float F8E5M2ToFloat(uint8_t v) { return Tables().e5m2[v]; }
uint8_t FloatToF8E5M2(float f) {
  return static_cast<uint8_t>(Encode(f, kE5M2Format));
}

double DTypeDenormMin(DType dtype) {
  const DTypeTraits& t = DTypeTraitsOf(dtype);
  return t.floating() ? t.denorm_min()
                      : DTypeTraitsOf(DType::kF32).denorm_min();
}

float RoundToDType(float value, DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return F16ToFloat(FloatToF16(value));
    case DType::kBF16:
      return Bf16ToFloat(FloatToBf16(value));
    case DType::kF8E4M3:
      return F8E4M3ToFloat(FloatToF8E4M3(value));
    case DType::kF8E5M2:
      return F8E5M2ToFloat(FloatToF8E5M2(value));
    case DType::kInvalid:
    case DType::kF32:
    case DType::kF64:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      break;
  }
  return value;
}

namespace {

// Truncation to a floating format narrower than f32.
float TruncateTo(float value, const DTypeTraits& t) {
  if (!std::isfinite(value)) return value;
  const float max_finite = static_cast<float>(t.max_finite);
  const float a = std::fabs(value);
  if (a >= max_finite) return std::copysign(max_finite, value);
  int e = t.min_normal_exponent;
  if (a >= std::ldexp(1.0f, t.min_normal_exponent)) {
    std::frexp(a, &e);
    --e;  // a in [2^e, 2^(e+1))
  }
  // Powers of two: the division and the product are exact.
  const double quantum = std::ldexp(1.0, e - t.mantissa_bits);
  const double q = std::floor(static_cast<double>(a) / quantum) * quantum;
  return std::copysign(static_cast<float>(q), value);
}

}  // namespace

float RoundTowardZeroToDType(float value, DType dtype) {
  const DTypeTraits& t = DTypeTraitsOf(dtype);
  if (!t.floating() || t.bytes >= 4) return value;  // f32, f64: identity
  return TruncateTo(value, t);
}

double LoadAsDouble(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF64:
      return static_cast<const double*>(data)[i];
    case DType::kI32:
      return static_cast<const int32_t*>(data)[i];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::kBool:
      return static_cast<const uint8_t*>(data)[i];
    case DType::kInvalid:
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      break;
  }
  return LoadAsFloat(data, dtype, i);
}

float LoadAsFloat(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kF8E4M3:
      return Tables().e4m3[static_cast<const uint8_t*>(data)[i]];
    case DType::kF8E5M2:
      return Tables().e5m2[static_cast<const uint8_t*>(data)[i]];
    case DType::kF64:
      return static_cast<float>(static_cast<const double*>(data)[i]);
    case DType::kI32:
      return static_cast<float>(static_cast<const int32_t*>(data)[i]);
    case DType::kI64:
      return static_cast<float>(static_cast<const int64_t*>(data)[i]);
    case DType::kBool:
      return static_cast<const uint8_t*>(data)[i];
    case DType::kInvalid:
      break;
  }
  return std::numeric_limits<float>::quiet_NaN();
}

void StoreFromFloat(void* data, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(data)[i] = value;
      return;
    case DType::kF16:
      static_cast<uint16_t*>(data)[i] = FloatToF16(value);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(data)[i] = FloatToBf16(value);
      return;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(data)[i] = FloatToF8E4M3(value);
      return;
    case DType::kF8E5M2:
      static_cast<uint8_t*>(data)[i] = FloatToF8E5M2(value);
      return;
    case DType::kF64:
      static_cast<double*>(data)[i] = value;
      return;
    case DType::kI32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(value);
      return;
    case DType::kI64:
      static_cast<int64_t*>(data)[i] = static_cast<int64_t>(value);
      return;
    case DType::kBool:
      static_cast<uint8_t*>(data)[i] = value != 0.0f;
      return;
    case DType::kInvalid:
      return;
  }
}

void StoreFromDouble(void* data, DType dtype, int64_t i, double value) {
  if (dtype == DType::kF64) {
    static_cast<double*>(data)[i] = value;
  } else if (dtype == DType::kI64) {
    static_cast<int64_t*>(data)[i] = static_cast<int64_t>(value);
  } else {
    StoreFromFloat(data, dtype, i, static_cast<float>(value));
  }
}

double UlpAt(double x, DType dtype) {
  const double smallest =
      DTypeSmallestNormal(dtype == DType::kF16 ? dtype : DType::kF32);
  int e = 0;
  std::frexp(std::max(std::fabs(x), smallest), &e);
  return DTypeEpsilon(dtype) * std::ldexp(1.0, e - 1);
}

void ConvertToFloat(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      const float* table = Tables().e4m3;
      for (int64_t i = 0; i < n; ++i) dst[i] = table[s[i]];
      return;
    }
    case DType::kF8E5M2: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      const float* table = Tables().e5m2;
      for (int64_t i = 0; i < n; ++i) dst[i] = table[s[i]];
      return;
    }
    case DType::kInvalid:
    case DType::kF16:
    case DType::kF64:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      break;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = LoadAsFloat(src, dtype, i);
}

void ConvertToDouble(const void* src, DType dtype, int64_t n, double* dst) {
  if (dtype == DType::kF64) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(double));
    return;
  }
  if (IsFloating(dtype)) {
    // Every narrower float widens exactly through float; chunks keep the
    // scratch on the stack and the loops vectorisable.
    float chunk[256];
    for (int64_t start = 0; start < n; start += 256) {
      const int64_t len = std::min<int64_t>(256, n - start);
      ConvertToFloat(static_cast<const char*>(src) + start * DTypeSize(dtype),
                     dtype, len, chunk);
      for (int64_t i = 0; i < len; ++i) dst[start + i] = chunk[i];
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = LoadAsDouble(src, dtype, i);
}

uint64_t UlpDistance(double a, double b, DType dtype) {
  const bool a_nan = std::isnan(a);
  const bool b_nan = std::isnan(b);
  if (a_nan || b_nan) {
    return a_nan && b_nan ? 0 : std::numeric_limits<uint64_t>::max();
  }
  int64_t oa = 0;
  int64_t ob = 0;
  switch (dtype) {
    case DType::kF64: {
      uint64_t ba, bb;
      std::memcpy(&ba, &a, 8);
      std::memcpy(&bb, &b, 8);
      oa = OrderedFromSignMagnitude(ba, 63);
      ob = OrderedFromSignMagnitude(bb, 63);
      break;
    }
    case DType::kF16:
      oa = OrderedFromSignMagnitude(Encode(a, kF16Format), 15);
      ob = OrderedFromSignMagnitude(Encode(b, kF16Format), 15);
      break;
    case DType::kBF16:
      oa = OrderedFromSignMagnitude(FloatToBf16(static_cast<float>(a)), 15);
      ob = OrderedFromSignMagnitude(FloatToBf16(static_cast<float>(b)), 15);
      break;
    case DType::kF8E4M3:
      oa = OrderedFromSignMagnitude(Encode(a, kE4M3Format), 7);
      ob = OrderedFromSignMagnitude(Encode(b, kE4M3Format), 7);
      break;
    case DType::kF8E5M2:
      oa = OrderedFromSignMagnitude(Encode(a, kE5M2Format), 7);
      ob = OrderedFromSignMagnitude(Encode(b, kE5M2Format), 7);
      break;
    case DType::kInvalid:
    case DType::kF32:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      oa = OrderedFromSignMagnitude(FloatToBits(static_cast<float>(a)), 31);
      ob = OrderedFromSignMagnitude(FloatToBits(static_cast<float>(b)), 31);
      break;
  }
  // Unsigned arithmetic: the difference of two f64 orderings can exceed
  // INT64_MAX, and it wraps correctly in uint64.
  const uint64_t ua = static_cast<uint64_t>(oa);
  const uint64_t ub = static_cast<uint64_t>(ob);
  return oa > ob ? ua - ub : ub - ua;
}

}  // namespace attnaudit
