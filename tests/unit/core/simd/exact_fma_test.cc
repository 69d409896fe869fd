// ExactMulAdd on every target against C's fma (one rounding, by
// definition): the SSE4 target emulates it with error-free sums and
// rounding to odd, the others use the FMA instruction. Random operands
// over the whole exponent range, and operands built to land the exact
// sum on or next to a rounding midpoint, in a cancellation, at the
// overflow threshold, on signed zeros and in the subnormal range.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/simd/fused_ops.h"
#include "core/simd/targets.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

template <typename T>
struct Bits;
template <>
struct Bits<double> {
  using U = uint64_t;
  static constexpr int kMantissa = 52;
  static constexpr int kMaxExp = 1023;
};
template <>
struct Bits<float> {
  using U = uint32_t;
  static constexpr int kMantissa = 23;
  static constexpr int kMaxExp = 127;
};

template <typename T>
bool SameValue(T x, T y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  typename Bits<T>::U bx, by;
  std::memcpy(&bx, &x, sizeof(T));
  std::memcpy(&by, &y, sizeof(T));
  return bx == by;
}

template <typename T>
struct Cases {
  std::vector<T> a, b, c;
  void Add(T x, T y, T z) {
    a.push_back(x);
    b.push_back(y);
    c.push_back(z);
  }
};

// A value with `bits` random significant bits, exponent e, random sign.
template <typename T>
T RandomValue(std::mt19937_64& rng, int bits, int e) {
  const int m = Bits<T>::kMantissa + 1;
  const uint64_t mantissa =
      (rng() >> (64 - bits)) | (uint64_t{1} << (bits - 1));  // top bit set
  T x = std::ldexp(static_cast<T>(mantissa), e - bits + 1);
  if (bits > m) x = static_cast<T>(x);  // never: bits <= m below
  return (rng() & 1) ? -x : x;
}

template <typename T>
Cases<T> MakeCases(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  const int m = Bits<T>::kMantissa + 1;
  const int emax = Bits<T>::kMaxExp;
  Cases<T> cs;
  std::uniform_int_distribution<int> bits(1, m);
  for (int i = 0; i < count; ++i) {
    // Operands of few or many bits (short ones make exact products, hence
    // exact ties), exponents anywhere the product stays finite-ish.
    const int ea = std::uniform_int_distribution<int>(-emax / 2, emax / 2)(rng);
    const int eb = std::uniform_int_distribution<int>(-emax / 2, emax / 2)(rng);
    const T a = RandomValue<T>(rng, bits(rng), ea);
    const T b = RandomValue<T>(rng, bits(rng), eb);
    const T p = a * b;  // rounded: a neighbour of the exact product
    switch (i % 8) {
      case 0:  // c anywhere from far below to far above the product
        cs.Add(a, b,
               RandomValue<T>(
                   rng, bits(rng),
                   ea + eb +
                       std::uniform_int_distribution<int>(-3 * m, 3 * m)(rng)));
        break;
      case 1:  // cancellation: c = -RN(ab)
        cs.Add(a, b, -p);
        break;
      case 2:  // c a few ulps of the product off the cancellation
        cs.Add(
            a, b,
            -p + std::ldexp(static_cast<T>(
                                std::uniform_int_distribution<int>(-4, 4)(rng)),
                            std::ilogb(p) - m));
        break;
      case 3:  // c a power of two near the product's last bits: midpoints
        cs.Add(a, b,
               std::ldexp(static_cast<T>((rng() & 1) ? 1 : -1),
                          std::ilogb(p) - m +
                              std::uniform_int_distribution<int>(-2, 2)(rng)));
        break;
      case 4:  // c dominates, the product at its rounding position
        cs.Add(a, b,
               std::ldexp(static_cast<T>((rng() & 1) ? 3 : -3),
                          std::ilogb(p) + m +
                              std::uniform_int_distribution<int>(-2, 2)(rng)));
        break;
      case 5:  // zero operands and signed zeros
        cs.Add((rng() & 1) ? T(0) : -T(0), b,
               (rng() & 1) ? T(0) : ((rng() & 1) ? -T(0) : p));
        break;
      case 6: {  // tiny: products and sums near and below the normal range
        std::uniform_int_distribution<int> e_tiny(-emax / 2 - m,
                                                  -emax / 2 + m / 2);
        cs.Add(RandomValue<T>(rng, bits(rng), e_tiny(rng)),
               RandomValue<T>(rng, bits(rng), e_tiny(rng)),
               RandomValue<T>(rng, bits(rng),
                              std::uniform_int_distribution<int>(
                                  -emax - m, -emax + m / 2)(rng)));
        break;
      }
      default:  // huge: near the overflow threshold
        cs.Add(RandomValue<T>(rng, bits(rng), emax / 2),
               RandomValue<T>(rng, bits(rng), emax / 2 + 1),
               RandomValue<T>(rng, bits(rng), emax - 1));
    }
  }
  const T inf = std::numeric_limits<T>::infinity();
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const T specials[] = {inf,
                        -inf,
                        nan,
                        T(0),
                        -T(0),
                        T(1),
                        std::numeric_limits<T>::denorm_min(),
                        std::numeric_limits<T>::max()};
  for (T x : specials) {
    for (T y : specials) {
      for (T z : specials) cs.Add(x, y, z);
    }
  }
  return cs;
}

template <typename T>
void ExpectEveryTargetIsFma(uint64_t seed) {
  const Cases<T> cs = MakeCases<T>(seed, 1000000);
  const int64_t n = static_cast<int64_t>(cs.a.size());
  for (int64_t target : CompiledSimdTargets()) {
    ForceSimdTargetForTest(target);
    const std::string name = SimdTargetName(target);
    std::vector<T> out(static_cast<size_t>(n));
    ExactMulAddArray(cs.a.data(), cs.b.data(), cs.c.data(), n, out.data());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T want = std::fma(cs.a[i], cs.b[i], cs.c[i]);
      if (SameValue(out[i], want)) continue;
      if (++wrong <= 5) {
        ADD_FAILURE() << name << " case " << i << ": fma(" << cs.a[i] << ", "
                      << cs.b[i] << ", " << cs.c[i] << ") = " << want
                      << ", got " << out[i];
      }
    }
    EXPECT_EQ(wrong, 0) << name << ": of " << n;
  }
  ForceSimdTargetForTest(0);
}

TEST(ExactFmaTest, Fp64OnEveryTargetIsTheFusedOperation) {
  ExpectEveryTargetIsFma<double>(11);
}

TEST(ExactFmaTest, Fp32OnEveryTargetIsTheFusedOperation) {
  ExpectEveryTargetIsFma<float>(12);
}

// Lengths that leave tails of every size go through the same code.
TEST(ExactFmaTest, TailsAreComputedLikeFullVectors) {
  for (int64_t target : CompiledSimdTargets()) {
    ForceSimdTargetForTest(target);
    for (int64_t n = 1; n <= 19; ++n) {
      std::vector<double> a(n), b(n), c(n), out(n);
      for (int64_t i = 0; i < n; ++i) {
        a[i] = 1.0 + std::ldexp(1.0, -52) * (i + 1);
        b[i] = 1.0 - std::ldexp(1.0, -53) * (i + 3);
        c[i] = -1.0;
      }
      ExactMulAddArray(a.data(), b.data(), c.data(), n, out.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(SameValue(out[i], std::fma(a[i], b[i], c[i])))
            << SimdTargetName(target) << " n=" << n << " i=" << i;
      }
    }
  }
  ForceSimdTargetForTest(0);
}

}  // namespace
}  // namespace attnaudit
