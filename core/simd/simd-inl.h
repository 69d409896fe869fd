// Per-target SIMD building blocks for the core's hot loops, written once
// over Google Highway and compiled for every x86 target we dispatch to
// (SSE4, AVX2, AVX-512; see core/simd/CMakeLists.txt). A .cc that uses them
// sets HWY_TARGET_INCLUDE to itself, includes "hwy/foreach_target.h" and
// then this header, and writes its own code inside
// `namespace attnaudit::HWY_NAMESPACE`.
//
// The contract these blocks keep (docs/NUMERICS.md, "One source, every
// target"): for the same inputs they return the same bits on every target.
//  - Every multiply-add is one correctly rounded fused operation
//    (ExactMulAdd). SSE4 has no FMA instruction, and Highway's MulAdd is a
//    multiply then an add there, so that target emulates the fused
//    operation in vectors with error-free sums and rounding to odd:
//    slower, never different.
//  - A reduction over a vector is defined on *virtual lanes*, not on the
//    hardware's: a dot product has 16 fp32 (8 fp64) virtual lanes, element
//    d feeding lane d mod 16 (8), and the lanes are summed by a fixed tree
//    (lane i with lane i + 8, then i + 4, i + 2, i + 1). A target with
//    narrower vectors holds the virtual lanes in several vectors; the tree
//    pairs the same values on every target.
//  - Element-wise work (exp, widening, value accumulation) does the same
//    IEEE operations per element on every target; tails go through the
//    vector code too, padded, never through a scalar twin.
// Pure functions; thread-safe.

// Per-target include guard (Highway's convention for -inl.h headers).
#if defined(ATTNAUDIT_CORE_SIMD_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNAUDIT_CORE_SIMD_SIMD_INL_H_
#undef ATTNAUDIT_CORE_SIMD_SIMD_INL_H_
#else
#define ATTNAUDIT_CORE_SIMD_SIMD_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/tensor/dtype.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF32 = hn::ScalableTag<float>;
using DF64 = hn::ScalableTag<double>;
using VF32 = hn::Vec<DF32>;
using VF64 = hn::Vec<DF64>;

// Virtual lanes of a dot product (see the file comment).
constexpr int kVirtualF32 = 16;
constexpr int kVirtualF64 = 8;

// ------------------------------------------------------------ fused ops

#if !HWY_NATIVE_FMA
// An exact multiply-add without an FMA instruction (the SSE4 target),
// in vectors. std::fma per lane would be glibc's software emulation on a
// CPU without FMA, many times slower. The device is rounding to odd:
// a sum rounded to odd with at least two more bits than the target
// format, then rounded to nearest, is the sum rounded to nearest once
// (docs/NUMERICS.md, "One source, every target"). exact_fma_test holds
// every lane to C's fma.
namespace exact_fma {

// s + *err == x + y exactly (Knuth's TwoSum; no overflow).
template <class V>
HWY_INLINE V TwoSum(V x, V y, V* err) {
  const V s = hn::Add(x, y);
  const V back = hn::Sub(s, x);
  *err = hn::Add(hn::Sub(x, hn::Sub(s, back)), hn::Sub(y, back));
  return s;
}

// x + y rounded to odd: the nearest sum when it is exact or its last bit
// is odd, else its neighbour toward the exact sum (whose last bit is odd).
// Non-finite sums are left as rounded.
template <class V>
HWY_INLINE V AddRoundToOdd(V x, V y) {
  using D = hn::DFromV<V>;
  const D d;
  const hn::RebindToSigned<D> di;
  V err;
  const V s = TwoSum(x, y, &err);
  const auto bits = hn::BitCast(di, s);
  const auto one = hn::Set(di, 1);
  const auto even = hn::Eq(hn::And(bits, one), hn::Zero(di));
  const auto inexact = hn::RebindMask(di, hn::Ne(err, hn::Zero(d)));
  const auto finite = hn::RebindMask(di, hn::IsFinite(s));
  // Toward err: the magnitude shrinks when err's sign is not s's.
  const auto shrink = hn::Lt(hn::Xor(bits, hn::BitCast(di, err)), hn::Zero(di));
  const auto step = hn::IfThenElse(shrink, hn::Neg(one), one);
  const auto adjust = hn::And(hn::And(even, inexact), finite);
  return hn::BitCast(d, hn::IfThenElse(adjust, hn::Add(bits, step), bits));
}

// hi + lo == x, each with at most 26 significant bits (Veltkamp).
template <class V>
HWY_INLINE V Split(V x, V* lo) {
  const V t = hn::Mul(hn::Set(hn::DFromV<V>(), 134217729.0), x);  // 2^27+1
  const V hi = hn::Sub(t, hn::Sub(t, x));
  *lo = hn::Sub(x, hi);
  return hi;
}

// p + *err == a * b exactly (Dekker's product), unless something overflows
// or |p| < 2^-960.
template <class V>
HWY_INLINE V TwoProduct(V a, V b, V* err) {
  const V p = hn::Mul(a, b);
  V a_lo, b_lo;
  const V a_hi = Split(a, &a_lo);
  const V b_hi = Split(b, &b_lo);
  const V e =
      hn::Add(hn::Add(hn::Sub(hn::Mul(a_hi, b_hi), p), hn::Mul(a_hi, b_lo)),
              hn::Mul(a_lo, b_hi));
  *err = hn::Add(e, hn::Mul(a_lo, b_lo));
  return p;
}

// The same lanes through the math library (operands near the ends of the
// exponent range, inf, NaN: rare, and still exact).
template <class V>
HWY_NOINLINE V MulAddByLane(V a, V b, V c) {
  using D = hn::DFromV<V>;
  using T = hn::TFromD<D>;
  const D d;
  HWY_ALIGN T la[hn::MaxLanes(d)];
  HWY_ALIGN T lb[hn::MaxLanes(d)];
  HWY_ALIGN T lc[hn::MaxLanes(d)];
  hn::Store(a, d, la);
  hn::Store(b, d, lb);
  hn::Store(c, d, lc);
  for (size_t i = 0; i < hn::MaxLanes(d); ++i) {
    lc[i] = std::fma(la[i], lb[i], lc[i]);
  }
  return hn::Load(d, lc);
}

// fp64: a * b = p + e exactly; (h, t) = TwoSum(c, p); the result is
// RN(h + RO(t + e)), the correctly rounded sum of the three. A zero
// product keeps IEEE's sign rule for zero sums (c + p). Checked after the
// fact: an overflow anywhere leaves a non-finite result, and Dekker's
// product is exact while |p| >= 2^-960; other lanes (rare) go through the
// math library.
template <class V>
HWY_INLINE V MulAddF64(V a, V b, V c) {
  const hn::DFromV<V> d;
  const V zero = hn::Zero(d);
  V e, t;
  const V p = TwoProduct(a, b, &e);
  const V h = TwoSum(c, p, &t);
  const auto zero_product = hn::Or(hn::Eq(a, zero), hn::Eq(b, zero));
  const V r = hn::IfThenElse(zero_product, hn::Add(c, p),
                             hn::Add(h, AddRoundToOdd(t, e)));
  const auto exact =
      hn::And(hn::IsFinite(r),
              hn::Or(zero_product, hn::Ge(hn::Abs(p), hn::Set(d, 0x1p-960))));
  if (HWY_UNLIKELY(!hn::AllTrue(d, exact))) return MulAddByLane(a, b, c);
  return r;
}

// fp32 through fp64: the product of two floats is exact in fp64, their
// sum with c rounded to odd in fp64 (53 >= 24 + 2 bits), then to nearest
// in fp32. No range limits: fp32 values are far inside fp64's.
template <class D>
HWY_INLINE hn::Vec<hn::Rebind<float, D>> MulAddHalfF32(D /* tag */,
                                                       hn::Vec<D> a,
                                                       hn::Vec<D> b,
                                                       hn::Vec<D> c) {
  return hn::DemoteTo(hn::Rebind<float, D>(), AddRoundToOdd(hn::Mul(a, b), c));
}

// Lanes where rounding the fp64 sum s = RN64(a*b + c) to fp32 might not
// be rounding the exact sum once: s on an fp32 midpoint (the 29 bits below
// fp32's last are 1000...0; the first rounding may have landed there), or
// below fp32's normal range (its midpoints sit elsewhere). Rounding to
// nearest never crosses a value it can represent, and every fp32 midpoint
// of the normal range is one, so any other lane rounds correctly as is.
template <class D>
HWY_INLINE hn::Mask<D> MaybeDoubleRounded(D dd, hn::Vec<D> s) {
  const hn::RebindToUnsigned<D> du;
  const auto low = hn::And(hn::BitCast(du, s), hn::Set(du, (1ull << 29) - 1));
  return hn::Or(hn::RebindMask(dd, hn::Eq(low, hn::Set(du, 1ull << 28))),
                hn::Lt(hn::Abs(s), hn::Set(dd, 0x1p-126)));
}

template <class V>
HWY_INLINE V MulAddF32(V a, V b, V c) {
  using D = hn::DFromV<V>;
  const D d;
  const hn::Half<D> dh;
  const hn::Rebind<double, decltype(dh)> dd;
  const hn::Rebind<float, decltype(dd)> df;
  auto lower = [&](V v) { return hn::PromoteTo(dd, hn::LowerHalf(dh, v)); };
  auto upper = [&](V v) { return hn::PromoteTo(dd, hn::UpperHalf(dh, v)); };
  // Most lanes: one fp64 multiply-add, then to fp32.
  const auto s_lo = hn::Add(hn::Mul(lower(a), lower(b)), lower(c));
  const auto s_hi = hn::Add(hn::Mul(upper(a), upper(b)), upper(c));
  if (HWY_LIKELY(hn::AllFalse(dd, hn::Or(MaybeDoubleRounded(dd, s_lo),
                                         MaybeDoubleRounded(dd, s_hi))))) {
    return hn::Combine(d, hn::DemoteTo(df, s_hi), hn::DemoteTo(df, s_lo));
  }
  return hn::Combine(d, MulAddHalfF32(dd, upper(a), upper(b), upper(c)),
                     MulAddHalfF32(dd, lower(a), lower(b), lower(c)));
}

}  // namespace exact_fma
#endif  // !HWY_NATIVE_FMA

// a * b + c with one rounding, on every target.
template <class V>
HWY_INLINE V ExactMulAdd(V a, V b, V c) {
#if HWY_NATIVE_FMA
  return hn::MulAdd(a, b, c);
#else
  if constexpr (std::is_same_v<hn::TFromV<V>, double>) {
    return exact_fma::MulAddF64(a, b, c);
  } else {
    return exact_fma::MulAddF32(a, b, c);
  }
#endif
}

// c - a * b with one rounding.
template <class V>
HWY_INLINE V ExactNegMulAdd(V a, V b, V c) {
  return ExactMulAdd(hn::Neg(a), b, c);
}

// ------------------------------------------------------------ exp

// 2^k for integral k in [-1100, 0] held in a double/float vector, applied
// to p as two exact power-of-two scalings so subnormal results round once,
// as a single correctly rounded p * 2^k would.
HWY_INLINE VF64 ScaleByPow2(VF64 p, VF64 k) {
  const DF64 d;
  const hn::RebindToSigned<DF64> di;
  const auto ki = hn::ConvertTo(di, k);
  const auto k1 = hn::ShiftRight<1>(ki);  // arithmetic: floor(k / 2)
  const auto k2 = hn::Sub(ki, k1);
  const auto bias = hn::Set(di, 1023);
  const VF64 s1 = hn::BitCast(d, hn::ShiftLeft<52>(hn::Add(k1, bias)));
  const VF64 s2 = hn::BitCast(d, hn::ShiftLeft<52>(hn::Add(k2, bias)));
  return hn::Mul(hn::Mul(p, s1), s2);
}

HWY_INLINE VF32 ScaleByPow2(VF32 p, VF32 k) {
  const DF32 d;
  const hn::RebindToSigned<DF32> di;
  const auto ki = hn::ConvertTo(di, k);
  const auto k1 = hn::ShiftRight<1>(ki);
  const auto k2 = hn::Sub(ki, k1);
  const auto bias = hn::Set(di, 127);
  const VF32 s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(k1, bias)));
  const VF32 s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(k2, bias)));
  return hn::Mul(hn::Mul(p, s1), s2);
}

// The Cody-Waite reduction of exp and tanh's expm1: x = k ln2 + r with k
// integral and |r| <= ln2/2, ln2 in two parts so that r is exact to well
// below an ulp. Returns r; k goes to *k.
HWY_INLINE VF64 ReduceLn2(DF64 d, VF64 x, VF64* k) {
  *k = hn::Round(hn::Mul(x, hn::Set(d, 1.4426950408889634)));
  const VF64 r = ExactNegMulAdd(*k, hn::Set(d, 6.93147180369123816490e-01), x);
  return ExactNegMulAdd(*k, hn::Set(d, 1.90821492927058770002e-10), r);
}

HWY_INLINE VF32 ReduceLn2(DF32 d, VF32 x, VF32* k) {
  *k = hn::Round(hn::Mul(x, hn::Set(d, 1.44269504f)));
  const VF32 r = ExactNegMulAdd(*k, hn::Set(d, 0.693359375f), x);
  return ExactNegMulAdd(*k, hn::Set(d, -2.12194440e-4f), r);
}

// 1/n! from n = 14 down to 0 (fp64) and from 9 down to 0 (fp32): the Taylor
// coefficients of exp's and tanh's polynomials, which take runs of them.
// A Horner step from coefficient j to the next is ExactMulAdd(p, r, c[j+1]).
inline constexpr double kInverseFactorialsF64[15] = {1.0 / 87178291200.0,
                                                     1.0 / 6227020800.0,
                                                     1.0 / 479001600.0,
                                                     1.0 / 39916800.0,
                                                     1.0 / 3628800.0,
                                                     1.0 / 362880.0,
                                                     1.0 / 40320.0,
                                                     1.0 / 5040.0,
                                                     1.0 / 720.0,
                                                     1.0 / 120.0,
                                                     1.0 / 24.0,
                                                     1.0 / 6.0,
                                                     0.5,
                                                     1.0,
                                                     1.0};
inline constexpr float kInverseFactorialsF32[10] = {1.0f / 362880.0f,
                                                    1.0f / 40320.0f,
                                                    1.0f / 5040.0f,
                                                    1.0f / 720.0f,
                                                    1.0f / 120.0f,
                                                    1.0f / 24.0f,
                                                    1.0f / 6.0f,
                                                    0.5f,
                                                    1.0f,
                                                    1.0f};

// Horner's rule over c[first..last): p = c[first], then p = p * r + c[j],
// each step one exact multiply-add.
template <class D>
HWY_INLINE hn::Vec<D> HornerTaylor(D d, hn::Vec<D> r, int first, int last) {
  using T = hn::TFromD<D>;
  const T* c = nullptr;
  if constexpr (sizeof(T) == 8) {
    c = kInverseFactorialsF64;
  } else {
    c = kInverseFactorialsF32;
  }
  hn::Vec<D> p = hn::Set(d, c[first]);
  for (int j = first + 1; j < last; ++j)
    p = ExactMulAdd(p, r, hn::Set(d, c[j]));
  return p;
}

// exp(x) for x <= 0 (softmax arguments shifted by their running max):
// Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, a Taylor polynomial of
// degree 13 for e^r (truncation < 0.05 ulp), then 2^k. Within 2 ulp of the
// correctly rounded result (tested per target). x below the underflow
// threshold, -inf included, gives +0; NaN stays NaN.
HWY_INLINE VF64 ExpNonPositive(DF64 d, VF64 x) {
  const VF64 underflow = hn::Set(d, -745.2);
  const auto tiny = hn::Lt(x, underflow);
  const auto nan = hn::IsNaN(x);
  VF64 k;
  const VF64 r = ReduceLn2(d, hn::Max(x, underflow), &k);
  const VF64 p = HornerTaylor(d, r, 1, 15);  // 1/13! .. 1/0!
  const VF64 result = hn::IfThenZeroElse(tiny, ScaleByPow2(p, k));
  return hn::IfThenElse(nan, x, result);
}

// The fp32 twin: degree 7 (truncation < 0.05 ulp), 2 ulp.
HWY_INLINE VF32 ExpNonPositive(DF32 d, VF32 x) {
  const VF32 underflow = hn::Set(d, -103.98f);
  const auto tiny = hn::Lt(x, underflow);
  const auto nan = hn::IsNaN(x);
  VF32 k;
  const VF32 r = ReduceLn2(d, hn::Max(x, underflow), &k);
  const VF32 p = HornerTaylor(d, r, 2, 10);  // 1/7! .. 1/0!
  const VF32 result = hn::IfThenZeroElse(tiny, ScaleByPow2(p, k));
  return hn::IfThenElse(nan, x, result);
}

// e[i] = exp(x[i]) for i < n; x and e may alias. The tail is padded into
// one full vector, so every element takes the same path.
template <class D>
HWY_INLINE void ExpNonPositiveArray(D d, const hn::TFromD<D>* x, int64_t n,
                                    hn::TFromD<D>* e) {
  using T = hn::TFromD<D>;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  // Two vectors at a time: each is one long dependent chain, so a pair in
  // flight keeps the FMA ports busy (element-wise, so no bit changes).
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto a = ExpNonPositive(d, hn::LoadU(d, x + i));
    const auto b = ExpNonPositive(d, hn::LoadU(d, x + i + N));
    hn::StoreU(a, d, e + i);
    hn::StoreU(b, d, e + i + N);
  }
  for (; i + N <= n; i += N) {
    hn::StoreU(ExpNonPositive(d, hn::LoadU(d, x + i)), d, e + i);
  }
  if (i < n) {
    HWY_ALIGN T buf[hn::MaxLanes(d)] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(T));
    hn::Store(ExpNonPositive(d, hn::Load(d, buf)), d, buf);
    std::memcpy(e + i, buf, static_cast<size_t>(n - i) * sizeof(T));
  }
}

// ------------------------------------------------------------ tanh

// tanh for the logit soft-cap, in vectors: tanh(|x|) = e / (e + 2) with
// e = expm1(2|x|), given the sign of x. expm1: the Cody-Waite reduction of
// exp (2|x| = k ln2 + r, |r| <= ln2/2), expm1(r) = r + r * (r * P(r)) with
// P the Taylor series from 1/2! (to 1/14! in fp64, 1/9! in fp32:
// truncation < 0.01 ulp), then expm1 = 2^k expm1(r) + (2^k - 1) in one
// rounding. |x| from kTanhOne on, where tanh rounds to 1, gives +-1; +-0
// and the sign are kept; NaN stays NaN. Within 3 ulp of the correctly
// rounded result (simd_targets_test); every operation is IEEE or an exact
// multiply-add, so every target gives the same bits, and so does the
// scalar twin the GPU runs (kernels/math/tanh.h).
constexpr double kTanhOneF64 = 19.1;  // 1 - tanh(19.1) < 2^-54
constexpr float kTanhOneF32 = 9.1f;   // 1 - tanh(9.1) < 2^-25

template <class D>
HWY_INLINE hn::Vec<D> Tanh(D d, hn::Vec<D> x) {
  using T = hn::TFromD<D>;
  constexpr bool kF64 = sizeof(T) == 8;
  const T one_from = kF64 ? static_cast<T>(kTanhOneF64) : kTanhOneF32;
  const auto a = hn::Min(hn::Abs(x), hn::Set(d, one_from));
  hn::Vec<D> k;
  const hn::Vec<D> r = ReduceLn2(d, hn::Add(a, a), &k);
  // P: 1/14! .. 1/2! (fp64), 1/9! .. 1/2! (fp32).
  const hn::Vec<D> p = HornerTaylor(d, r, 0, kF64 ? 13 : 8);
  const auto expm1_r = ExactMulAdd(r, hn::Mul(r, p), r);
  const auto two_k = ScaleByPow2(hn::Set(d, T(1)), k);
  const auto e = ExactMulAdd(two_k, expm1_r, hn::Sub(two_k, hn::Set(d, T(1))));
  auto t = hn::Div(e, hn::Add(e, hn::Set(d, T(2))));
  t = hn::IfThenElse(hn::Ge(hn::Abs(x), hn::Set(d, one_from)), hn::Set(d, T(1)),
                     t);
  return hn::IfThenElse(hn::IsNaN(x), x, hn::CopySign(t, x));
}

// x[i] = cap * tanh(x[i] / cap) for i < n (cap > 0), the soft-cap of a row
// of scores; the tail is padded into one full vector, as for exp.
template <class D>
HWY_INLINE void SoftCapArray(D d, hn::TFromD<D> cap, hn::TFromD<D>* x,
                             int64_t n) {
  using T = hn::TFromD<D>;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto c = hn::Set(d, cap);
  auto capped = [&](hn::Vec<D> v) {
    return hn::Mul(c, Tanh(d, hn::Div(v, c)));
  };
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(capped(hn::LoadU(d, x + i)), d, x + i);
  if (i < n) {
    HWY_ALIGN T buf[hn::MaxLanes(d)] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(T));
    hn::Store(capped(hn::Load(d, buf)), d, buf);
    std::memcpy(x + i, buf, static_cast<size_t>(n - i) * sizeof(T));
  }
}

// ------------------------------------------------------------ reductions

// Sum of the lanes of one vector by the tree "lane i + lane i + N/2",
// recursively, down to lane 0.
template <class D>
HWY_INLINE hn::TFromD<D> TreeSumOfLanes(D d, hn::Vec<D> v) {
  using T = hn::TFromD<D>;
  constexpr size_t kLanes128 = 16 / sizeof(T);
  if constexpr (hn::MaxLanes(D()) > kLanes128) {
    const hn::Half<D> dh;
    return TreeSumOfLanes(dh,
                          hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else if constexpr (sizeof(T) == 4) {
    // 4 fp32 lanes: (0 + 2, 1 + 3), then their sum.
    v = hn::Add(v, hn::Shuffle1032(v));
    v = hn::Add(v, hn::Shuffle2301(v));
    return hn::GetLane(v);
  } else {
    // 2 fp64 lanes.
    return hn::GetLane(hn::Add(v, hn::Shuffle01(v)));
  }
}

// Sum of kVirtual virtual lanes held in kVec = kVirtual / N vectors
// (vector j holds virtual lanes [j N, (j + 1) N)): the halves of the
// vector array first (virtual i with i + kVirtual / 2, ...), then the tree
// inside the last vector; the same pairings as one kVirtual-lane vector.
template <int kVec, class D>
HWY_INLINE hn::TFromD<D> VirtualLaneSum(D d, hn::Vec<D>* acc) {
  for (int half = kVec / 2; half >= 1; half /= 2) {
    for (int j = 0; j < half; ++j) acc[j] = hn::Add(acc[j], acc[j + half]);
  }
  return TreeSumOfLanes(d, acc[0]);
}

// ------------------------------------------------------------ dot products

// Vectors that hold one dot product's virtual lanes on this target.
template <class D>
constexpr int VecsPerDot() {
  constexpr int virtual_lanes =
      sizeof(hn::TFromD<D>) == 4 ? kVirtualF32 : kVirtualF64;
  static_assert(virtual_lanes >= static_cast<int>(hn::MaxLanes(D())),
                "vectors wider than the virtual lanes");
  return virtual_lanes / static_cast<int>(hn::MaxLanes(D()));
}

// Loads N values of k at p as D's lane type: a plain load, or an exact
// widening (bf16 -> f32 -> f64, f32 -> f64) fused with the load, so bf16
// pages and f32 rows need no widened copy.
template <class D, typename K>
HWY_INLINE hn::Vec<D> LoadAs(D d, const K* p) {
  if constexpr (std::is_same_v<K, hn::TFromD<D>>) {
    return hn::LoadU(d, p);
  } else if constexpr (std::is_same_v<K, hwy::bfloat16_t>) {
    // A bf16 value is the top half of the f32 of the same value.
    const hn::Rebind<float, D> df;
    const hn::RebindToUnsigned<decltype(df)> du32;
    const hn::Rebind<uint16_t, D> du16;
    const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(
        du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p))));
    if constexpr (std::is_same_v<hn::TFromD<D>, float>) {
      return hn::BitCast(d, bits);
    } else {
      return hn::PromoteTo(d, hn::BitCast(df, bits));
    }
  } else {
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<K, D>(), p));
  }
}

// Loads 2N values of k at p as D's lane type into two vectors (*lo: the
// first N, *hi: the next N), widened exactly as LoadAs widens them. Where
// 2N bf16 values fill one 128-bit vector (f64 lanes under AVX2), one load
// and two interleaves with zero do what two LoadAs would do with two
// zero-extending loads and two shifts: the interleave puts each bf16's bits
// in the upper half of a 32-bit lane, which is the f32 of the same value
// (fewer instructions per FMA of the fp64 kernels, which are bound by
// instructions issued). Either way the same values.
template <class D, typename K>
HWY_INLINE void LoadPairAs(D d, const K* p, hn::Vec<D>* lo, hn::Vec<D>* hi) {
  constexpr size_t N = hn::MaxLanes(D());
  if constexpr (std::is_same_v<K, hwy::bfloat16_t> &&
                std::is_same_v<hn::TFromD<D>, double> && N == 4) {
    const hn::Full128<uint16_t> du16;
    const hn::Full128<uint32_t> du32;
    const hn::Full128<float> df;
    const auto bits = hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p));
    const auto zero = hn::Zero(du16);
    *lo = hn::PromoteTo(d, hn::BitCast(df, hn::ZipLower(du32, zero, bits)));
    *hi = hn::PromoteTo(d, hn::BitCast(df, hn::ZipUpper(du32, zero, bits)));
  } else {
    *lo = LoadAs(d, p);
    *hi = LoadAs(d, p + N);
  }
}

// One element widened as LoadAs widens it (exact either way), for the
// elements a loop handles past its last full vector.
template <typename T, typename K>
HWY_INLINE T ScalarAs(K x) {
  if constexpr (std::is_same_v<K, hwy::bfloat16_t>) {
    return static_cast<T>(hwy::F32FromBF16(x));
  } else {
    return static_cast<T>(x);
  }
}

#if HWY_TARGET == HWY_AVX3
// AVX-512 only: the virtual-lane sums of 8 one-vector accumulators at once
// (a[0..7] hold whole dot products: kVec == 1), by shuffles that pair
// exactly the lanes the tree pairs (i + 8 for fp32, then i + 4, i + 2,
// i + 1), so each sum has the same bits as VirtualLaneSum's. out[j] is the
// sum of a[j]. About 3 instructions per sum instead of 9.
// JointLaneSumVector8 returns the sums as lanes 0..7 of a vector.
HWY_INLINE __m512d JointLaneSumVector8(hn::Vec<DF64>* a) {
  __m512d s[4];
  for (int p = 0; p < 4; ++p) {  // i + 4: [x.lo + x.hi, y.lo + y.hi]
    const __m512d x = a[2 * p].raw;
    const __m512d y = a[2 * p + 1].raw;
    s[p] = _mm512_add_pd(_mm512_shuffle_f64x2(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f64x2(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512d t[2];
  for (int p = 0; p < 2; ++p) {  // i + 2 within each 4-lane partial
    const __m512d u = s[2 * p];
    const __m512d w = s[2 * p + 1];
    t[p] = _mm512_add_pd(_mm512_shuffle_f64x2(u, w, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f64x2(u, w, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // i + 1: lane 2k holds a[k], lane 2k + 1 holds a[4 + k]; then lane j
  // holds a[j].
  const __m512d r = _mm512_add_pd(_mm512_unpacklo_pd(t[0], t[1]),
                                  _mm512_unpackhi_pd(t[0], t[1]));
  return _mm512_permutexvar_pd(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), r);
}

HWY_INLINE void JointLaneSums8(hn::Vec<DF64>* a, double* out) {
  _mm512_storeu_pd(out, JointLaneSumVector8(a));
}

HWY_INLINE __m512 JointLaneSumVector8(hn::Vec<DF32>* a) {
  __m512 s[4];
  for (int p = 0; p < 4; ++p) {  // i + 8
    const __m512 x = a[2 * p].raw;
    const __m512 y = a[2 * p + 1].raw;
    s[p] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512 t[2];
  for (int p = 0; p < 2; ++p) {  // i + 4
    const __m512 u = s[2 * p];
    const __m512 w = s[2 * p + 1];
    t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(u, w, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u, w, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // i + 2: per 128-bit lane [t0 pair, t1 pair].
  const __m512 u =
      _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                    _mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
  // i + 1: lane 4k holds a[k], lane 4k + 2 holds a[4 + k]; then lane j
  // (j < 8) holds a[j].
  const __m512 v =
      _mm512_add_ps(u, _mm512_shuffle_ps(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0), v);
}

HWY_INLINE void JointLaneSums8(hn::Vec<DF32>* a, float* out) {
  _mm256_storeu_ps(out, _mm512_castps512_ps256(JointLaneSumVector8(a)));
}

// The sums of a 2 x 4 block of dot products, a[4 * i + t] for rows i < 2
// and keys t < 4, times scale, stored as four values at row0 and four at
// row1.
HWY_INLINE void StoreLaneSums2x4(hn::Vec<DF64>* a, double scale, double* row0,
                                 double* row1) {
  const __m512d v =
      _mm512_mul_pd(JointLaneSumVector8(a), _mm512_set1_pd(scale));
  _mm256_storeu_pd(row0, _mm512_castpd512_pd256(v));
  _mm256_storeu_pd(row1, _mm512_extractf64x4_pd(v, 1));
}

HWY_INLINE void StoreLaneSums2x4(hn::Vec<DF32>* a, float scale, float* row0,
                                 float* row1) {
  const __m512 v = _mm512_mul_ps(JointLaneSumVector8(a), _mm512_set1_ps(scale));
  _mm_storeu_ps(row0, _mm512_castps512_ps128(v));
  _mm_storeu_ps(row1, _mm512_extractf32x4_ps(v, 1));
}
#endif  // HWY_TARGET == HWY_AVX3

// s[r * lds + t] = (q_r . k_t) * scale for a tile of RT rows of q and KT
// rows of k (each `dim` long, k's rows ldk elements apart; k may be bf16 or
// f32 under a wider q, widened exactly as it is loaded), each dot product
// in virtual-lane order: chunks of the virtual width, the fixed lane tree,
// then the elements past the last full chunk in order; then one rounded
// multiply by scale (exact for scale 1), as the scores leave the tile. The
// same bits on every target.
template <int RT, int KT, class D, typename K>
HWY_INLINE void DotTile(D d, const hn::TFromD<D>* q, const K* k, int64_t ldk,
                        int64_t dim, hn::TFromD<D>* s, int64_t lds,
                        hn::TFromD<D> scale) {
  using T = hn::TFromD<D>;
  constexpr int kVec = VecsPerDot<D>();
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(D()));
  constexpr int64_t kChunk = kVec * N;
  hn::Vec<D> acc[RT * KT][kVec];
  for (int j = 0; j < RT * KT; ++j) {
    for (int v = 0; v < kVec; ++v) acc[j][v] = hn::Zero(d);
  }
  const int64_t full = dim / kChunk * kChunk;
  for (int64_t c = 0; c < full; c += kChunk) {
    // Vectors v and v + 1 of the chunk are adjacent: loaded as a pair.
    for (int v = 0; v < kVec; v += 2) {
      constexpr int kPair = kVec >= 2 ? 2 : 1;
      const int64_t off = c + v * N;
      hn::Vec<D> kv[kPair][KT];
      for (int t = 0; t < KT; ++t) {
        if constexpr (kPair == 2) {
          LoadPairAs(d, k + t * ldk + off, &kv[0][t], &kv[1][t]);
        } else {
          kv[0][t] = LoadAs(d, k + t * ldk + off);
        }
      }
      for (int h = 0; h < kPair; ++h) {
        for (int r = 0; r < RT; ++r) {
          const hn::Vec<D> qv = hn::LoadU(d, q + r * dim + off + h * N);
          for (int t = 0; t < KT; ++t) {
            acc[r * KT + t][v + h] =
                ExactMulAdd(qv, kv[h][t], acc[r * KT + t][v + h]);
          }
        }
      }
    }
  }
#if HWY_TARGET == HWY_AVX3
  // Whole chunks only (every element is in a lane): the sums of each pair
  // of rows go straight to s.
  if constexpr (KT == 4 && RT % 2 == 0 && kVec == 1) {
    if (full == dim) {
      for (int r = 0; r < RT; r += 2) {
        hn::Vec<D> pair[8];
        for (int j = 0; j < 8; ++j) pair[j] = acc[r * KT + j][0];
        StoreLaneSums2x4(pair, scale, s + r * lds, s + (r + 1) * lds);
      }
      return;
    }
  }
#endif
  T sums[RT * KT];
#if HWY_TARGET == HWY_AVX3
  if constexpr (RT * KT % 8 == 0 && kVec == 1) {
    for (int j0 = 0; j0 < RT * KT; j0 += 8) {
      hn::Vec<D> whole[8];
      for (int j = 0; j < 8; ++j) whole[j] = acc[j0 + j][0];
      JointLaneSums8(whole, sums + j0);
    }
  } else  // NOLINT(readability/braces)
#endif
  {
    for (int j = 0; j < RT * KT; ++j) sums[j] = VirtualLaneSum<kVec>(d, acc[j]);
  }
  if (full == dim) {  // the common head_dims: no element past the chunks
    for (int r = 0; r < RT; ++r) {
      for (int t = 0; t < KT; ++t) s[r * lds + t] = sums[r * KT + t] * scale;
    }
    return;
  }
  for (int r = 0; r < RT; ++r) {
    for (int t = 0; t < KT; ++t) {
      T sum = sums[r * KT + t];
      for (int64_t e = full; e < dim; ++e) {
        sum = std::fma(q[r * dim + e], ScalarAs<T>(k[t * ldk + e]), sum);
      }
      s[r * lds + t] = sum * scale;
    }
  }
}

// Rows [*r, rows) of q taken RT at a time while they fit (advancing *r),
// each band against the n keys in tiles of KT keys, then the keys left one
// at a time.
template <int RT, int KT, class D, typename K>
HWY_INLINE void DotRowBands(D d, const hn::TFromD<D>* q, int64_t* r,
                            int64_t rows, const K* k, int64_t ldk, int64_t n,
                            int64_t dim, hn::TFromD<D>* s, int64_t lds,
                            hn::TFromD<D> scale) {
  for (; *r + RT <= rows; *r += RT) {
    const hn::TFromD<D>* qr = q + *r * dim;
    hn::TFromD<D>* sr = s + *r * lds;
    int64_t t = 0;
    for (; t + KT <= n; t += KT) {
      DotTile<RT, KT>(d, qr, k + t * ldk, ldk, dim, sr + t, lds, scale);
    }
    for (; t < n; ++t)
      DotTile<RT, 1>(d, qr, k + t * ldk, ldk, dim, sr + t, lds, scale);
  }
}

// All dot products of `rows` rows of q ([rows][dim]) with n rows of k
// (row t at k + t * ldk), times scale, into s[r * lds + t], in register
// tiles.
template <class D, typename K>
HWY_INLINE void DotRows(D d, const hn::TFromD<D>* q, int64_t rows, const K* k,
                        int64_t ldk, int64_t n, int64_t dim, hn::TFromD<D>* s,
                        int64_t lds, hn::TFromD<D> scale = 1) {
  // Enough independent FMA chains to cover the FMA latency without
  // spilling registers: 16 one-vector accumulators with AVX-512's 32
  // registers (a 4 x 4 tile: each widened k vector feeds four rows, and
  // the lane sums go eight at a time), eight with AVX2's 16 (4 rows x 1
  // key x 2 vectors, so each widened k vector still feeds four rows). Each
  // made the W1 fused pass faster than the 4 x 2 / 2 x 2 tiles before it
  // (docs/perf-history.md). Two rows left (GQA groups of 2 or 3) share a tile,
  // so each widened k vector feeds both (one row at a time widened it twice);
  // a last row goes against eight vectors' worth of k rows, so even one
  // row keeps eight chains busy.
  constexpr int kVec = VecsPerDot<D>();
  constexpr int RT = kVec <= 2 ? 4 : 2;
  constexpr int KT = kVec == 1 ? 4 : 1;
  int64_t r = 0;
  DotRowBands<RT, KT>(d, q, &r, rows, k, ldk, n, dim, s, lds, scale);
  if constexpr (RT > 2) {
    DotRowBands<2, kVec == 1 ? 4 : 2>(d, q, &r, rows, k, ldk, n, dim, s, lds,
                                      scale);
  }
  DotRowBands<1, 8 / kVec>(d, q, &r, rows, k, ldk, n, dim, s, lds, scale);
}

// ------------------------------------------------------------ widening

// bf16 -> f32 (exact). Returns the OR of every element's magnitude
// exponent check: true when some element is Inf or NaN.
HWY_INLINE bool WidenBF16(const uint16_t* src, int64_t n, float* dst) {
  const DF32 df;
  const hn::Rebind<uint16_t, DF32> du16;
  const hn::RebindToUnsigned<DF32> du32;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto bad = hn::Zero(du32);
  const auto exp_mask = hn::Set(du32, 0x7f800000u);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto bits =
        hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src + i)));
    bad = hn::Or(
        bad, hn::VecFromMask(du32, hn::Eq(hn::And(bits, exp_mask), exp_mask)));
    hn::StoreU(hn::BitCast(df, bits), df, dst + i);
  }
  bool any = !hn::AllTrue(du32, hn::Eq(bad, hn::Zero(du32)));
  for (; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(&dst[i], &bits, sizeof(float));
    any = any || (bits & 0x7f800000u) == 0x7f800000u;
  }
  return any;
}

// Whether some of the n bf16 values at src is Inf or NaN, without widening
// them (the check of KV pages the arithmetic reads in place).
HWY_INLINE bool AnyNonFiniteBF16(const uint16_t* src, int64_t n) {
  const hn::ScalableTag<uint16_t> du16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du16));
  // Non-finite exactly when the magnitude bits exceed the largest finite.
  const auto largest_finite = hn::Set(du16, uint16_t{0x7f7f});
  const auto magnitude = hn::Set(du16, uint16_t{0x7fff});
  auto worst = hn::Zero(du16);
  auto worst2 = hn::Zero(du16);
  int64_t i = 0;
  // Two vectors a step into two running maxima: with one, the loop's own
  // count and branch were half of its instructions.
  for (; i + 2 * N <= n; i += 2 * N) {
    worst = hn::Max(worst, hn::And(hn::LoadU(du16, src + i), magnitude));
    worst2 = hn::Max(worst2, hn::And(hn::LoadU(du16, src + i + N), magnitude));
  }
  worst = hn::Max(worst, worst2);
  for (; i + N <= n; i += N) {
    worst = hn::Max(worst, hn::And(hn::LoadU(du16, src + i), magnitude));
  }
  bool any = !hn::AllTrue(
      du16, hn::Eq(hn::Max(worst, largest_finite), largest_finite));
  for (; i < n; ++i) any = any || (src[i] & 0x7fff) > 0x7f7f;
  return any;
}

// f16 -> f32 (exact).
HWY_INLINE bool WidenF16(const uint16_t* src, int64_t n, float* dst) {
  const DF32 df;
  const hn::Rebind<hwy::float16_t, DF32> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  bool any = false;
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF32 v = hn::PromoteTo(
        df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(src + i)));
    any = any || !hn::AllFalse(df, hn::Not(hn::IsFinite(v)));
    hn::StoreU(v, df, dst + i);
  }
  if (i < n) {
    HWY_ALIGN uint16_t buf[hn::MaxLanes(df)] = {};
    std::memcpy(buf, src + i, static_cast<size_t>(n - i) * sizeof(uint16_t));
    HWY_ALIGN float out[hn::MaxLanes(df)];
    const VF32 v = hn::PromoteTo(
        df, hn::Load(dh, reinterpret_cast<const hwy::float16_t*>(buf)));
    any = any || !hn::AllFalse(df, hn::Not(hn::IsFinite(v)));
    hn::Store(v, df, out);
    std::memcpy(dst + i, out, static_cast<size_t>(n - i) * sizeof(float));
  }
  return any;
}

// fp8 -> f32 (exact), e4m3fn when kE4M3, else e5m2: the magnitude bits
// are moved into an f32's exponent and mantissa fields and scaled by 2^(127
// - fp8 bias), a power of two, so the product is exact (fp8 subnormals land
// on f32 subnormals first and scale up exactly). The codes without a finite
// value (e4m3fn: magnitude 0x7f, NaN; e5m2: exponent all ones) become NaN,
// or +-inf for e5m2's two infinities, and make the result true.
template <bool kE4M3>
HWY_INLINE hn::Vec<DF32> F8Block(hn::Vec<hn::RebindToSigned<DF32>> bytes,
                                 hn::Mask<DF32>* non_finite) {
  const DF32 df;
  const hn::RebindToSigned<DF32> di;
  constexpr int kShift = kE4M3 ? 20 : 21;
  const auto magnitude = hn::And(bytes, hn::Set(di, 0x7f));
  const auto sign = hn::ShiftLeft<24>(hn::And(bytes, hn::Set(di, 0x80)));
  const auto moved = hn::Or(sign, hn::ShiftLeft<kShift>(magnitude));
  const VF32 value =
      hn::Mul(hn::BitCast(df, moved), hn::Set(df, kE4M3 ? 0x1p120f : 0x1p112f));
  const auto special =
      hn::Gt(magnitude, hn::Set(di, kE4M3 ? 0x7e : 0x7b));  // no finite value
  *non_finite = hn::RebindMask(df, special);
  VF32 replaced = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  if constexpr (!kE4M3) {
    const auto inf = hn::RebindMask(df, hn::Eq(magnitude, hn::Set(di, 0x7c)));
    const VF32 signed_inf =
        hn::BitCast(df, hn::Or(sign, hn::Set(di, 0x7f800000)));
    replaced = hn::IfThenElse(inf, signed_inf, replaced);
  }
  return hn::IfThenElse(*non_finite, replaced, value);
}

template <bool kE4M3>
HWY_INLINE bool WidenF8(const uint8_t* src, int64_t n, float* dst) {
  const DF32 df;
  const hn::RebindToSigned<DF32> di;
  const hn::Rebind<uint8_t, DF32> du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto bad = hn::FirstN(df, 0);  // no lane set
  hn::Mask<DF32> non_finite;
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto bytes = hn::BitCast(
        di,
        hn::PromoteTo(hn::RebindToUnsigned<DF32>(), hn::LoadU(du8, src + i)));
    hn::StoreU(F8Block<kE4M3>(bytes, &non_finite), df, dst + i);
    bad = hn::Or(bad, non_finite);
  }
  bool any = !hn::AllFalse(df, bad);
  if (i < n) {  // the tail through the same vector code, padded with zeros
    HWY_ALIGN uint8_t buf[hn::MaxLanes(df)] = {};
    std::memcpy(buf, src + i, static_cast<size_t>(n - i));
    HWY_ALIGN float out[hn::MaxLanes(df)];
    const auto bytes = hn::BitCast(
        di, hn::PromoteTo(hn::RebindToUnsigned<DF32>(), hn::Load(du8, buf)));
    hn::Store(F8Block<kE4M3>(bytes, &non_finite), df, out);
    any = any || !hn::AllFalse(df, non_finite);
    std::memcpy(dst + i, out, static_cast<size_t>(n - i) * sizeof(float));
  }
  return any;
}

// f32 copy with the finite check.
HWY_INLINE bool CopyF32(const float* src, int64_t n, float* dst) {
  const DF32 df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto bad = hn::Zero(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF32 v = hn::LoadU(df, src + i);
    // x - x is 0 for finite x and NaN otherwise.
    bad = hn::Or(bad, hn::Sub(v, v));
    hn::StoreU(v, df, dst + i);
  }
  bool any = !hn::AllTrue(df, hn::Eq(bad, hn::Zero(df)));
  for (; i < n; ++i) {
    dst[i] = src[i];
    any = any || !std::isfinite(src[i]);
  }
  return any;
}

// Widens one row of `n` elements at element `offset` of `base` into f32
// (and, for f64 pages, keeps the exact values in dst64). Returns true when
// some element is not finite.
HWY_INLINE bool WidenRow(const void* base, DType dtype, int64_t offset,
                         int64_t n, float* dst32, double* dst64) {
  switch (dtype) {
    case DType::kBF16:
      return WidenBF16(static_cast<const uint16_t*>(base) + offset, n, dst32);
    case DType::kF16:
      return WidenF16(static_cast<const uint16_t*>(base) + offset, n, dst32);
    case DType::kF32:
      return CopyF32(static_cast<const float*>(base) + offset, n, dst32);
    case DType::kF64: {
      const double* src = static_cast<const double*>(base) + offset;
      bool bad = false;
      for (int64_t i = 0; i < n; ++i) {
        dst64[i] = src[i];
        dst32[i] = static_cast<float>(src[i]);
        bad = bad || !std::isfinite(src[i]);
      }
      return bad;
    }
    case DType::kF8E4M3:
      return WidenF8<true>(static_cast<const uint8_t*>(base) + offset, n,
                           dst32);
    case DType::kF8E5M2:
      return WidenF8<false>(static_cast<const uint8_t*>(base) + offset, n,
                            dst32);
    case DType::kInvalid:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      break;
  }
  return true;  // validation admits floating dtypes only; flag it if not
}

// f32 -> f64 (exact).
HWY_INLINE void PromoteRows(const float* src, int64_t n, double* dst) {
  const DF64 d64;
  const hn::Rebind<float, DF64> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d64));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::PromoteTo(d64, hn::LoadU(df, src + i)), d64, dst + i);
  }
  for (; i < n; ++i) dst[i] = static_cast<double>(src[i]);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#endif  // ATTNAUDIT_CORE_SIMD_SIMD_INL_H_
