// The one-source SIMD contract (core/simd/simd-inl.h): every target this
// binary carries computes the same bits. Each test runs the dispatched code
// once per target (forcing dispatch to it) and compares with the first,
// bit for bit; the exp bound is checked on every target too.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/vexp.h"
#include "core/drift/drift.h"
#include "core/simd/targets.h"
#include "core/tensor/dtype.h"
#include "gtest/gtest.h"
#include "tests/unit/core/attention/run_attention.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

// Runs fn once per compiled target with dispatch forced to it.
template <typename Fn>
void ForEachTarget(Fn&& fn) {
  const std::vector<int64_t> targets = CompiledSimdTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    ForceSimdTargetForTest(t);
    ASSERT_EQ(ActiveSimdTarget(), SimdTargetName(t));
    fn(SimdTargetName(t));
  }
  ForceSimdTargetForTest(0);
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(SimdTargetsTest, CarriesSse4Avx2AndAvx512WhereTheCpuHasThem) {
  const std::vector<int64_t> targets = CompiledSimdTargets();
  std::vector<std::string> names;
  for (int64_t t : targets) names.push_back(SimdTargetName(t));
  // SSE4 is the baseline every x86-64-v2 CPU runs.
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.back(), "SSE4");
  EXPECT_EQ(ActiveSimdTarget(), names.front());
}

std::vector<double> ExpArguments64() {
  std::vector<double> x;
  for (double v = 0.0; v > -760.0; v -= 0.0137) x.push_back(v);
  x.push_back(-0.0);
  x.push_back(-std::numeric_limits<double>::infinity());
  x.push_back(-1e-300);
  x.push_back(-708.396418532264);  // near the normal/subnormal edge
  x.push_back(-744.44);            // subnormal result
  return x;
}

TEST(SimdTargetsTest, ExpF64WithinTwoUlpsAndIdenticalOnEveryTarget) {
  const std::vector<double> x = ExpArguments64();
  std::vector<double> first;
  ForEachTarget([&](const std::string& target) {
    std::vector<double> e(x.size());
    // Odd lengths exercise the padded tail on every vector width.
    ExpNonPositiveF64(x.data(), static_cast<int64_t>(x.size()), e.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const double want =
          static_cast<double>(std::exp(static_cast<long double>(x[i])));
      if (x[i] < -745.2) {
        EXPECT_EQ(e[i], 0.0) << target << " x=" << x[i];
        continue;
      }
      if (want < 1e-300) continue;  // subnormal: relative ulps are moot
      EXPECT_LE(UlpDistance(e[i], want, DType::kF64), 2u)
          << target << " x=" << x[i];
    }
    if (first.empty()) first = e;
    EXPECT_TRUE(SameBits(first, e)) << target;
  });
}

TEST(SimdTargetsTest, ExpF32WithinTwoUlpsAndIdenticalOnEveryTarget) {
  std::vector<float> x;
  for (float v = 0.0f; v > -110.0f; v -= 0.00731f) x.push_back(v);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  std::vector<float> first;
  ForEachTarget([&](const std::string& target) {
    std::vector<float> e(x.size());
    ExpNonPositiveF32(x.data(), static_cast<int64_t>(x.size()), e.data());
    for (size_t i = 0; i + 2 < x.size(); ++i) {
      const float want =
          static_cast<float>(std::exp(static_cast<long double>(x[i])));
      if (x[i] < -103.98f) {
        EXPECT_EQ(e[i], 0.0f) << target << " x=" << x[i];
        continue;
      }
      if (want < 1e-37f) continue;
      EXPECT_LE(UlpDistance(e[i], want, DType::kF32), 2u)
          << target << " x=" << x[i];
    }
    EXPECT_EQ(e[x.size() - 2], 0.0f) << target << ": exp(-inf)";
    EXPECT_TRUE(std::isnan(e.back())) << target << ": exp(NaN)";
    float zero = 0.0f;
    float one = 0.0f;
    ExpNonPositiveF32(&zero, 1, &one);
    EXPECT_EQ(one, 1.0f) << target;
    if (first.empty()) first = e;
    EXPECT_TRUE(SameBits(first, e)) << target;
  });
}

// Arguments for tanh: a dense irregular grid over both signs up to past
// the saturation threshold, tiny and subnormal values (where tanh(x) = x),
// the thresholds themselves and the special values.
template <typename T>
std::vector<T> TanhArguments(T one_from) {
  std::vector<T> x;
  for (T v = -25; v < 25; v += static_cast<T>(0.00173)) x.push_back(v);
  for (T v = static_cast<T>(1e-7); v < 2; v *= static_cast<T>(1.37)) {
    x.push_back(v);
    x.push_back(-v);
  }
  const T inf = std::numeric_limits<T>::infinity();
  for (T v : {T(0), -T(0), std::numeric_limits<T>::denorm_min(),
              -std::numeric_limits<T>::min(), T(1e-30), one_from,
              std::nextafter(one_from, T(0)), -one_from,
              std::numeric_limits<T>::max(), inf, -inf}) {
    x.push_back(v);
  }
  return x;
}

// tanh (SoftCap with cap 1) against the long-double tanh, every target.
template <typename T, typename Fn>
void CheckTanh(Fn soft_cap, T one_from, DType dtype, uint64_t bound) {
  std::vector<T> x = TanhArguments(one_from);
  x.push_back(std::numeric_limits<T>::quiet_NaN());
  std::vector<T> first;
  ForEachTarget([&](const std::string& target) {
    std::vector<T> t = x;
    soft_cap(T(1), t.data(), static_cast<int64_t>(t.size()));
    uint64_t worst = 0;
    for (size_t i = 0; i + 1 < x.size(); ++i) {
      const T want = static_cast<T>(std::tanh(static_cast<long double>(x[i])));
      const uint64_t ulps = UlpDistance(t[i], want, dtype);
      worst = std::max(worst, ulps);
      EXPECT_LE(ulps, bound) << target << " x=" << x[i] << " got " << t[i];
      EXPECT_EQ(std::signbit(t[i]), std::signbit(x[i])) << target << x[i];
    }
    EXPECT_TRUE(std::isnan(t.back())) << target << ": tanh(NaN)";
    std::printf("%s tanh (%s): worst %llu ulp over %zu arguments\n",
                target.c_str(), std::string(DTypeName(dtype)).c_str(),
                static_cast<unsigned long long>(worst), x.size() - 1);
    // A soft-cap of 30 through the same code: identical on every target.
    std::vector<T> capped = x;
    for (T& v : capped) v *= 30;
    soft_cap(T(30), capped.data(), static_cast<int64_t>(capped.size()));
    t.insert(t.end(), capped.begin(), capped.end());
    if (first.empty()) first = t;
    EXPECT_TRUE(SameBits(first, t)) << target;
  });
}

TEST(SimdTargetsTest, TanhF64WithinThreeUlpsAndIdenticalOnEveryTarget) {
  CheckTanh<double>(SoftCapF64, 19.1, DType::kF64, 3);
}

TEST(SimdTargetsTest, TanhF32WithinThreeUlpsAndIdenticalOnEveryTarget) {
  CheckTanh<float>(SoftCapF32, 9.1f, DType::kF32, 3);
}

struct PassCase {
  std::string name;
  RandomCaseOptions options;
  int64_t window = 0;
  double softcap = 0;
  bool sinks = false;
  KvLayout layout = KvLayout::kNHD;
  int64_t page_size = 16;
};

std::vector<PassCase> PassCases() {
  std::vector<PassCase> cases;
  auto base = [](const std::string& name, DType kv, int64_t dim) {
    PassCase c;
    c.name = name;
    c.options.batch = 2;
    c.options.queries = 2;
    c.options.q_heads = 8;
    c.options.kv_heads = 2;
    c.options.head_dim = dim;
    c.options.seq_lens = {75, 40};
    c.options.spread_queries = true;
    c.options.kv_dtype = kv;
    c.options.q_dtype = DType::kBF16;
    c.options.seed = 11 + dim;
    return c;
  };
  cases.push_back(base("bf16 D=128", DType::kBF16, 128));
  cases.push_back(base("f16 D=64", DType::kF16, 64));
  cases.push_back(base("f32 D=80", DType::kF32, 80));
  cases.push_back(base("fp8 D=96", DType::kF8E4M3, 96));
  cases.push_back(base("fp8 e5m2 D=36 (widening tail)", DType::kF8E5M2, 36));
  cases.push_back(base("f64 D=72 (dot tail)", DType::kF64, 72));
  PassCase odd = base("bf16 D=20 HND page 5", DType::kBF16, 20);
  odd.layout = KvLayout::kHND;
  odd.page_size = 5;
  cases.push_back(odd);
  // GQA groups that leave rows past the 4-row tiles: 2-row tiles (groups
  // 2, 3, 7) and single rows (1, 3, 7), for scores and the V accumulation.
  for (int64_t group : {1, 2, 3, 7}) {
    PassCase g =
        base("bf16 D=128 GQA " + std::to_string(group), DType::kBF16, 128);
    g.options.q_heads = 2 * group;
    cases.push_back(g);
  }
  PassCase f32_pair = base("f32 D=80 GQA 2", DType::kF32, 80);
  f32_pair.options.q_heads = 4;
  cases.push_back(f32_pair);
  PassCase variants = base("window, soft-cap, sinks", DType::kBF16, 128);
  variants.window = 30;
  variants.softcap = 30.0;
  variants.sinks = true;
  cases.push_back(variants);
  return cases;
}

TEST(SimdTargetsTest, FusedPassIsBitIdenticalOnEveryTarget) {
  for (const PassCase& pc : PassCases()) {
    LogicalCase c = RandomCase(pc.options);
    c.sliding_window = pc.window;
    c.softcap = pc.softcap;
    if (pc.sinks) c.sinks.assign(static_cast<size_t>(c.q_heads), 0.75f);
    PagingOptions paging;
    paging.page_size = pc.page_size;
    paging.layout = pc.layout;
    paging.permute_pages = true;
    const Snapshot s = BuildSnapshot(c, paging);
    std::vector<AttentionResults> runs;
    ForEachTarget([&](const std::string& target) {
      absl::StatusOr<AttentionRun> run = RunAttention(s, 2);
      ASSERT_TRUE(run.ok()) << pc.name << " " << target << ": " << run.status();
      const AttentionResults& r = run->results;
      if (!runs.empty()) {
        const AttentionResults& f = runs.front();
        EXPECT_TRUE(SameBits(f.replay_out, r.replay_out))
            << pc.name << ": P.out differs on " << target;
        EXPECT_TRUE(SameBits(f.replay_lse, r.replay_lse))
            << pc.name << ": P.lse differs on " << target;
        EXPECT_TRUE(SameBits(f.reference_out, r.reference_out))
            << pc.name << ": R.out differs on " << target;
        EXPECT_TRUE(SameBits(f.reference_lse, r.reference_lse))
            << pc.name << ": R.lse differs on " << target;
      }
      runs.push_back(r);
    });
    ASSERT_EQ(runs.size(), CompiledSimdTargets().size()) << pc.name;
  }
}

// The lm_head pass (logits and row norms) is a dot-product user too.
TEST(SimdTargetsTest, LogprobsAndLmHeadNormsAreBitIdenticalOnEveryTarget) {
  TestRng rng(3);
  const int64_t vocab = 37;
  const int64_t hidden = 4 * 40 + 3;  // not a multiple of the lanes
  std::vector<double> head(static_cast<size_t>(vocab * hidden));
  for (double& w : head) w = rng.Normal() * 0.05;
  RoundTo(&head, DType::kBF16);
  const Tensor lm_head = MakeFloatTensor(DType::kBF16, {vocab, hidden}, head);
  const Tensor ids = MakeIntTensor(DType::kI64, {2, 1}, {5, 36});
  std::vector<std::vector<double>> outs(3);
  std::vector<DenseView> views;
  for (auto& out : outs) {
    out.resize(static_cast<size_t>(2 * hidden));
    for (double& x : out) x = rng.Normal();
    views.push_back({out.data(), {2, 1, 1, hidden}});
  }
  std::vector<std::vector<double>> first;
  LmHeadNorms first_norms;
  ForEachTarget([&](const std::string& target) {
    LmHeadNorms norms;
    absl::StatusOr<std::vector<std::vector<double>>> lp =
        SelectedLogprobsForEach(views, lm_head, ids, nullptr, 1.0, 2, &norms);
    ASSERT_TRUE(lp.ok()) << lp.status();
    if (first.empty()) {
      first = *lp;
      first_norms = norms;
      return;
    }
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_TRUE(SameBits(first[i], (*lp)[i])) << target << " output " << i;
    }
    EXPECT_EQ(norms.max_row_l1, first_norms.max_row_l1) << target;
    EXPECT_EQ(norms.max_row_l2, first_norms.max_row_l2) << target;
  });
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
