// MergeStates / MergeInto against an independent pairwise merge written
// here in long double (the logaddexp form of the RL-Kernel harness and
// of ring-flash-attention), plus the docs/DESIGN.md §2 edge cases.
#include "core/attention/merge.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/arithmetic/rounded_ops.h"
#include "core/arithmetic/scalar_exp.h"
#include "core/attention/merge_step.h"
#include "core/simd/targets.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

using testing::TestRng;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kU = 0x1.0p-24;

struct State {
  std::vector<float> out;
  float lse = 0;
};

struct Exact {
  std::vector<long double> out;
  long double lse = 0;
};

// The oracle: a pairwise logaddexp fold in long double. NaN and +inf LSEs
// mean "empty" (-inf); an empty state contributes nothing, whatever its
// out holds.
Exact PairwiseOracle(const std::vector<State>& states, int64_t d) {
  Exact acc{std::vector<long double>(static_cast<size_t>(d), 0.0L),
            -std::numeric_limits<long double>::infinity()};
  for (const State& s : states) {
    long double l = s.lse;
    if (std::isnan(l) || l == std::numeric_limits<long double>::infinity()) {
      l = -std::numeric_limits<long double>::infinity();
    }
    if (l == -std::numeric_limits<long double>::infinity()) continue;
    if (acc.lse == -std::numeric_limits<long double>::infinity()) {
      for (int64_t j = 0; j < d; ++j) acc.out[j] = s.out[j];
      acc.lse = l;
      continue;
    }
    // logaddexp(a, b) = max + log1p(exp(-|a - b|))
    const long double n =
        std::max(acc.lse, l) + std::log1p(std::exp(-std::fabs(acc.lse - l)));
    const long double wa = std::exp(acc.lse - n), wb = std::exp(l - n);
    for (int64_t j = 0; j < d; ++j)
      acc.out[j] = wa * acc.out[j] + wb * s.out[j];
    acc.lse = n;
  }
  return acc;
}

std::vector<State> RandomStates(TestRng& rng, int n, int64_t d,
                                double lse_spread, double lse_offset) {
  std::vector<State> states(static_cast<size_t>(n));
  for (State& s : states) {
    s.out.resize(static_cast<size_t>(d));
    for (float& x : s.out) x = static_cast<float>(rng.Normal());
    s.lse =
        static_cast<float>(lse_offset + rng.Uniform(-lse_spread, lse_spread));
  }
  return states;
}

void Merge(const std::vector<State>& states, int64_t d, std::vector<float>* out,
           float* lse) {
  std::vector<const float*> ptrs;
  std::vector<float> lses;
  for (const State& s : states) {
    ptrs.push_back(s.out.data());
    lses.push_back(s.lse);
  }
  out->assign(static_cast<size_t>(d), -1.0f);
  MergeStates(ptrs.data(), lses.data(), static_cast<int>(states.size()), d,
              out->data(), lse);
}

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// fp32 merge of n states: each weight exp(l_i - M) carries the rounding of
// l_i and M (<= 2*Lm*u) and of exp (u); the sum of n weights and the n-term
// weighted sum add <= n*u each; one division adds u. So
// |out - out*| <= max|out_i| * (2*Lm + 2n + 8) * u and
// |lse - lse*| <= (2*Lm + n + 4) * u (the final M + ln(total) rounding
// included in Lm).
TEST(MergeTest, MatchesThePairwiseOracleOnRandomStates) {
  TestRng rng(21);
  for (int n : {1, 2, 3, 5, 17, 64, 65, 100}) {  // > 64 uses the heap path
    for (int64_t d : {1, 7, 128}) {
      for (double offset : {0.0, -300.0, 1500.0}) {
        const std::vector<State> states = RandomStates(rng, n, d, 20, offset);
        std::vector<float> out;
        float lse = 0;
        Merge(states, d, &out, &lse);
        const Exact want = PairwiseOracle(states, d);
        double max_out = 0, lm = 1;
        for (const State& s : states) {
          lm = std::max(lm, std::fabs(static_cast<double>(s.lse)));
          for (float x : s.out)
            max_out = std::max(max_out, std::fabs(double{x}));
        }
        const double tol_out = max_out * (2 * lm + 2 * n + 8) * kU;
        const double tol_lse = (2 * lm + n + 4) * kU;
        EXPECT_NEAR(lse, static_cast<double>(want.lse), tol_lse)
            << "n=" << n << " d=" << d << " offset=" << offset;
        for (int64_t j = 0; j < d; ++j) {
          ASSERT_NEAR(out[j], static_cast<double>(want.out[j]), tol_out)
              << "n=" << n << " d=" << d << " j=" << j;
        }
      }
    }
  }
}

TEST(MergeTest, NoStatesGiveZeroAndMinusInfinity) {
  std::vector<float> out(4, 5.0f);
  float lse = 1;
  MergeStates(nullptr, nullptr, 0, 4, out.data(), &lse);
  EXPECT_EQ(lse, -kInf);
  for (float x : out) EXPECT_EQ(x, 0.0f);
}

TEST(MergeTest, AllEmptyStatesGiveZeroAndMinusInfinity) {
  // -inf, NaN and +inf all mean "empty"; their outs (even NaN) are ignored.
  const std::vector<State> states = {
      {{kNaN, 1, 2}, -kInf}, {{3, kInf, 4}, kNaN}, {{5, 6, kNaN}, kInf}};
  std::vector<float> out;
  float lse = 0;
  Merge(states, 3, &out, &lse);
  EXPECT_EQ(lse, -kInf);
  for (float x : out) EXPECT_EQ(Bits(x), Bits(0.0f));
  std::vector<float> acc = states[0].out;
  float acc_lse = states[0].lse;
  MergeInto(acc.data(), &acc_lse, states[1].out.data(), states[1].lse, 3);
  EXPECT_EQ(acc_lse, -kInf);
  for (float x : acc) EXPECT_EQ(Bits(x), Bits(0.0f));
}

// A NaN or +inf LSE is treated as -inf: the state is empty and drops out,
// so merging it with a real state returns that state exactly, whatever the
// empty state's out holds (a failed rank typically reports NaN out AND NaN
// lse).
TEST(MergeTest, NanAndPlusInfinityLseStatesDropOut) {
  const State real{{0.25f, -1.5f, 3.0f}, 2.5f};
  for (float bad_lse : {kNaN, kInf, -kInf}) {
    for (float junk : {7.0f, kNaN, kInf}) {
      const State empty{{junk, junk, junk}, bad_lse};
      for (bool empty_first : {false, true}) {
        std::vector<State> states = {real, empty};
        if (empty_first) std::swap(states[0], states[1]);
        std::vector<float> out;
        float lse = 0;
        Merge(states, 3, &out, &lse);
        EXPECT_EQ(lse, real.lse) << bad_lse << " " << junk;
        EXPECT_EQ(out, real.out) << "lse " << bad_lse << " out " << junk
                                 << " empty_first " << empty_first;
        std::vector<float> acc = states[0].out;
        float acc_lse = states[0].lse;
        MergeInto(acc.data(), &acc_lse, states[1].out.data(), states[1].lse, 3);
        EXPECT_EQ(acc_lse, real.lse);
        EXPECT_EQ(acc, real.out) << "MergeInto lse " << bad_lse << " out "
                                 << junk << " empty_first " << empty_first;
      }
    }
  }
}

// The fold uses MergeInto; a documented contract is that it is the same
// arithmetic as MergeStates with n = 2, bit for bit (signed zeros, equal
// LSEs, underflowing weights and empty states included).
TEST(MergeTest, MergeIntoIsBitwiseMergeStatesOfTwo) {
  TestRng rng(33);
  const std::vector<float> special_lse = {0.0f,   -kInf,  1e-30f, 88.0f,
                                          -88.0f, 150.0f, -150.0f};
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t d = 1 + trial % 9;
    std::vector<State> states = RandomStates(rng, 2, d, 30, 0);
    if (trial % 4 == 1) states[1].lse = states[0].lse;
    if (trial % 5 == 2) states[trial % 2].lse = special_lse[trial % 7];
    if (trial % 3 == 0) {
      for (State& s : states) {
        for (float& x : s.out) {
          if (rng.Uniform(0, 1) < 0.4)
            x = rng.Uniform(0, 1) < 0.5 ? 0.0f : -0.0f;
        }
      }
    }
    std::vector<float> out;
    float lse = 0;
    Merge(states, d, &out, &lse);
    std::vector<float> acc = states[0].out;
    float acc_lse = states[0].lse;
    MergeInto(acc.data(), &acc_lse, states[1].out.data(), states[1].lse, d);
    ASSERT_EQ(Bits(acc_lse), Bits(lse)) << "trial " << trial;
    for (int64_t j = 0; j < d; ++j) {
      ASSERT_EQ(Bits(acc[j]), Bits(out[j])) << "trial " << trial << " j=" << j;
    }
  }
}

TEST(MergeTest, OutputMayAliasTheFirstState) {
  TestRng rng(4);
  const std::vector<State> states = RandomStates(rng, 3, 16, 5, 0);
  std::vector<float> want;
  float want_lse = 0;
  Merge(states, 16, &want, &want_lse);
  std::vector<State> copy = states;
  const float* ptrs[3] = {copy[0].out.data(), copy[1].out.data(),
                          copy[2].out.data()};
  const float lses[3] = {copy[0].lse, copy[1].lse, copy[2].lse};
  float lse = 0;
  MergeStates(ptrs, lses, 3, 16, copy[0].out.data(), &lse);
  EXPECT_EQ(copy[0].out, want);
  EXPECT_EQ(lse, want_lse);
}

// Associativity is NOT assumed: ((a, b), c) and (a, (b, c)) and the n-ary
// merge may differ in the last bits; each must sit within the fp32 bound
// of the exact merge. (Equality here would be luck, not contract.)
TEST(MergeTest, GroupingsAllStayWithinTheBoundOfTheExactMerge) {
  TestRng rng(8);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t d = 32;
    const std::vector<State> s = RandomStates(rng, 3, d, 10, 0);
    const Exact want = PairwiseOracle(s, d);
    // ((a, b), c)
    std::vector<float> left = s[0].out;
    float left_lse = s[0].lse;
    MergeInto(left.data(), &left_lse, s[1].out.data(), s[1].lse, d);
    MergeInto(left.data(), &left_lse, s[2].out.data(), s[2].lse, d);
    // (a, (b, c))
    std::vector<float> bc = s[1].out;
    float bc_lse = s[1].lse;
    MergeInto(bc.data(), &bc_lse, s[2].out.data(), s[2].lse, d);
    std::vector<float> right = s[0].out;
    float right_lse = s[0].lse;
    MergeInto(right.data(), &right_lse, bc.data(), bc_lse, d);
    std::vector<float> nary;
    float nary_lse = 0;
    Merge(s, d, &nary, &nary_lse);
    double max_out = 0;
    for (const State& x : s) {
      for (float v : x.out) max_out = std::max(max_out, std::fabs(double{v}));
    }
    // Two fold steps: twice the n = 2 bound (Lm <= 10 here).
    const double tol_out = 2 * max_out * (2 * 10 + 4 + 8) * kU;
    const double tol_lse = 2 * (2 * 10 + 2 + 4) * kU;
    for (const auto& [out, lse] :
         {std::make_pair(&left, left_lse), std::make_pair(&right, right_lse),
          std::make_pair(&nary, nary_lse)}) {
      EXPECT_NEAR(lse, static_cast<double>(want.lse), tol_lse);
      for (int64_t j = 0; j < d; ++j) {
        EXPECT_NEAR((*out)[j], static_cast<double>(want.out[j]), tol_out);
      }
    }
  }
}

TEST(MergeTest, ShiftingAllLsesShiftsTheResultAndKeepsTheOutput) {
  TestRng rng(12);
  std::vector<State> s = RandomStates(rng, 4, 8, 3, 0);
  // LSEs on a 2^-10 grid, so that adding 64 is exact in fp32.
  for (State& x : s) x.lse = std::round(x.lse * 1024.0f) / 1024.0f;
  std::vector<State> shifted = s;
  for (State& x : shifted) x.lse += 64.0f;
  std::vector<float> a, b;
  float la = 0, lb = 0;
  Merge(s, 8, &a, &la);
  Merge(shifted, 8, &b, &lb);
  // The weights exp(l_i - M) see the same (exact) differences.
  EXPECT_EQ(a, b);
  EXPECT_NEAR(lb, la + 64.0, 4 * 64 * kU);
}

// The definition in scalar form, written from docs/DESIGN.md §2 with one
// rounded fp32 operation per step and the contract's exp and log
// (core/arithmetic/scalar_exp.h): the vector loops must give its bits.
void ScalarMerge(const std::vector<State>& states, int64_t d,
                 std::vector<float>* out, float* lse) {
  using F = rounded::Ops<float>;
  float m = F::NegInf();
  for (const State& s : states) m = F::Fmax(m, merge_step::SanitizeLse(s.lse));
  out->assign(static_cast<size_t>(d), 0.0f);
  if (m == F::NegInf()) {
    *lse = m;
    return;
  }
  std::vector<float> w;
  std::vector<const State*> live;
  float total = 0.0f;
  for (const State& s : states) {
    const float l = merge_step::SanitizeLse(s.lse);
    if (l == F::NegInf()) continue;
    const float wi = rounded::ExpNonPositive(F::Sub(l, m));
    if (wi == 0.0f) continue;
    total = F::Add(total, wi);
    w.push_back(wi);
    live.push_back(&s);
  }
  for (int64_t j = 0; j < d; ++j) {
    float acc = 0.0f;
    for (size_t i = 0; i < live.size(); ++i) {
      acc = F::Add(acc, F::Mul(w[i], live[i]->out[j]));
    }
    (*out)[j] = F::Div(acc, total);
  }
  *lse = F::Add(m, rounded::LogPositive(total));
}

// States whose outs hold signed zeros, subnormals, huge values, inf and
// NaN, with LSEs that make some weights 0 (empty, or underflowing) and
// others equal.
std::vector<State> AwkwardStates(TestRng& rng, int n, int64_t d) {
  const float values[] = {0.0f, -0.0f, 1e-40f, -3e38f, kInf, kNaN, 1.0f};
  const float lses[] = {-kInf, kNaN, kInf, -200.0f, 0.0f, 0.0f, 5.0f};
  std::vector<State> states = RandomStates(rng, n, d, 10, 0);
  for (State& s : states) {
    if (rng.Uniform(0, 1) < 0.3) s.lse = lses[rng.UniformInt(0, 6)];
    for (float& x : s.out) {
      if (rng.Uniform(0, 1) < 0.1) x = values[rng.UniformInt(0, 6)];
    }
  }
  return states;
}

TEST(MergeTest, EveryTargetGivesTheScalarDefinitionsBits) {
  TestRng rng(55);
  for (int64_t target : CompiledSimdTargets()) {
    ForceSimdTargetForTest(target);
    const std::string name = SimdTargetName(target);
    for (int trial = 0; trial < 300; ++trial) {
      const int n = 1 + trial % 5;
      const int64_t d = 1 + (trial * 7) % 70;  // tails of every length
      const std::vector<State> states = AwkwardStates(rng, n, d);
      std::vector<float> want;
      float want_lse = 0;
      ScalarMerge(states, d, &want, &want_lse);
      std::vector<float> out;
      float lse = 0;
      Merge(states, d, &out, &lse);
      ASSERT_EQ(Bits(lse), Bits(want_lse)) << name << " trial " << trial;
      for (int64_t j = 0; j < d; ++j) {
        ASSERT_EQ(Bits(out[j]), Bits(want[j]))
            << name << " trial " << trial << " j=" << j;
      }
      if (n != 2) continue;
      std::vector<float> acc = states[0].out;
      float acc_lse = states[0].lse;
      MergeInto(acc.data(), &acc_lse, states[1].out.data(), states[1].lse, d);
      ASSERT_EQ(Bits(acc_lse), Bits(want_lse)) << name << " trial " << trial;
      for (int64_t j = 0; j < d; ++j) {
        ASSERT_EQ(Bits(acc[j]), Bits(want[j]))
            << name << " MergeInto trial " << trial << " j=" << j;
      }
    }
  }
  ForceSimdTargetForTest(0);
}

TEST(MergeTest, LseFromBase2ScalesByLn2) {
  EXPECT_EQ(LseFromBase2(0.0), 0.0);
  // log2(e^3) in base 2 is 3 / ln 2; converting gives back 3.
  EXPECT_NEAR(LseFromBase2(3.0 / std::log(2.0)), 3.0, 1e-15);
  EXPECT_NEAR(LseFromBase2(-10.0), -10.0 * std::log(2.0), 1e-15);
  EXPECT_EQ(LseFromBase2(-std::numeric_limits<double>::infinity()),
            -std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace attnaudit
