// The GPU kernels' arithmetic (kernels/math/, core/attention/merge_step.h)
// run on the CPU against the core, bit for bit: the scalar exp and tanh
// against the vector ones of every SIMD target, exact widening against
// core/tensor, the drift element rule and the drift kernels' own source
// (host_drift.h: kernels/drift_device.inc under the SIMT emulator) against
// core/drift, the lane trees and the unit tree. The attention kernels' own
// source runs against the core in attention_device_test.cc. What the device
// adds on top is its exp/log library calls (docs/NUMERICS.md, "CPU and GPU");
// the GPU tests check those on a GPU.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/attention/vexp.h"
#include "core/drift/drift.h"
#include "core/simd/targets.h"
#include "core/tensor/dtype.h"
#include "core/tensor/dtype_traits.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "kernels/math/dot.h"
#include "kernels/math/drift_element.h"
#include "kernels/math/exp.h"
#include "kernels/math/scalar.h"
#include "kernels/math/split_merge.h"
#include "kernels/math/widen.h"
#include "tests/unit/kernels/host_drift.h"

namespace attnaudit {
namespace testing {
namespace {

template <typename T>
bool SameBits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

TEST(KernelMathExp, ScalarExpIsTheVectorExpOnEveryTarget) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> wide(-800.0, 0.0);
  std::uniform_real_distribution<double> narrow(-2.0, 0.0);
  std::vector<double> x64 = {0.0,
                             -0.0,
                             -1e-300,
                             -745.1,
                             -745.3,
                             -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN()};
  for (int i = 0; i < 20000; ++i)
    x64.push_back(i % 2 ? wide(rng) : narrow(rng));
  std::vector<float> x32;
  for (double x : x64) x32.push_back(static_cast<float>(x / 8.0));
  x32.push_back(-103.97f);
  x32.push_back(-103.99f);
  for (int64_t target : CompiledSimdTargets()) {
    ForceSimdTargetForTest(target);
    std::vector<double> e64(x64.size());
    std::vector<float> e32(x32.size());
    ExpNonPositiveF64(x64.data(), static_cast<int64_t>(x64.size()), e64.data());
    ExpNonPositiveF32(x32.data(), static_cast<int64_t>(x32.size()), e32.data());
    for (size_t i = 0; i < x64.size(); ++i) {
      ASSERT_TRUE(SameBits(kmath::ExpNonPositive(x64[i]), e64[i]))
          << SimdTargetName(target) << " exp(" << x64[i] << ")";
    }
    for (size_t i = 0; i < x32.size(); ++i) {
      ASSERT_TRUE(SameBits(kmath::ExpNonPositive(x32[i]), e32[i]))
          << SimdTargetName(target) << " exp(" << x32[i] << ")";
    }
  }
  ForceSimdTargetForTest(0);
  // The merge step gives the state at the max the weight 1 without the
  // polynomial (merge_step::Weight): the same bits.
  EXPECT_TRUE(SameBits(kmath::ExpNonPositive(0.0f), 1.0f));
  EXPECT_TRUE(SameBits(kmath::ExpNonPositive(-0.0f), 1.0f));
}

// The soft-cap: the scalar twin's cap * tanh(x / cap) against the core's
// vector soft-cap on every target, both signs, up to past saturation.
TEST(KernelMathTanh, ScalarSoftCapIsTheVectorSoftCapOnEveryTarget) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> wide(-60.0, 60.0);
  std::uniform_real_distribution<double> narrow(-1.0, 1.0);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x64 = {
      0.0,       -0.0,      1e-300,
      -4.9e-324, 19.1 * 30, -19.0 * 30,
      inf,       -inf,      std::numeric_limits<double>::quiet_NaN()};
  for (int i = 0; i < 20000; ++i) {
    x64.push_back(i % 2 ? wide(rng) : narrow(rng) * 1e-3);
  }
  std::vector<float> x32;
  for (double x : x64) x32.push_back(static_cast<float>(x));
  x32.push_back(9.1f * 30);
  x32.push_back(-9.09f * 30);
  for (int64_t target : CompiledSimdTargets()) {
    ForceSimdTargetForTest(target);
    std::vector<double> t64 = x64;
    std::vector<float> t32 = x32;
    SoftCapF64(30.0, t64.data(), static_cast<int64_t>(t64.size()));
    SoftCapF32(30.0f, t32.data(), static_cast<int64_t>(t32.size()));
    for (size_t i = 0; i < x64.size(); ++i) {
      ASSERT_TRUE(SameBits(kmath::Score(x64[i], 1.0, 30.0), t64[i]))
          << SimdTargetName(target) << " cap(" << x64[i] << ")";
    }
    for (size_t i = 0; i < x32.size(); ++i) {
      ASSERT_TRUE(SameBits(kmath::Score(x32[i], 1.0f, 30.0f), t32[i]))
          << SimdTargetName(target) << " cap(" << x32[i] << ")";
    }
  }
  ForceSimdTargetForTest(0);
}

TEST(KernelMathWiden, EveryCodeWidensAsTheCore) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t h = static_cast<uint16_t>(c);
    const float f16 = kmath::F16Bits(h);
    const float core16 = F16ToFloat(h);
    if (std::isnan(core16)) {
      ASSERT_TRUE(std::isnan(f16)) << c;
    } else {
      ASSERT_TRUE(SameBits(f16, core16)) << "f16 code " << c;
    }
    ASSERT_TRUE(SameBits(kmath::Bf16Bits(h), Bf16ToFloat(h)) ||
                std::isnan(Bf16ToFloat(h)))
        << "bf16 code " << c;
  }
  for (uint32_t c = 0; c < 256; ++c) {
    const uint8_t v = static_cast<uint8_t>(c);
    for (auto [mine, core] :
         {std::pair<float, float>{kmath::F8E4M3Bits(v), F8E4M3ToFloat(v)},
          {kmath::F8E5M2Bits(v), F8E5M2ToFloat(v)}}) {
      if (std::isnan(core)) {
        ASSERT_TRUE(std::isnan(mine)) << c;
      } else {
        ASSERT_TRUE(SameBits(mine, core)) << "fp8 code " << c;
      }
    }
  }
}

// The pass widens its pages 16 bytes at a time (WidenWords): every code of
// every 4-, 2- and 1-byte dtype, at every position of the 16 bytes, widens
// to WidenToFloat's bits of the same bytes, and the flag is set exactly
// when one of them is not finite.
template <int N>
void CheckWidenWords(int dtype, uint32_t codes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int size = 16 / N;
  for (uint32_t c = 0; c < codes; ++c) {
    for (int at = 0; at < N; ++at) {
      unsigned char bytes[16];
      for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng());
      const uint32_t code = size == 4 ? static_cast<uint32_t>(rng()) : c;
      std::memcpy(bytes + at * size, &code, size);  // little-endian
      uint32_t words[4];
      std::memcpy(words, bytes, 16);
      float f[N];
      const bool bad = kmath::WidenWords<N>(words, dtype, f);
      bool want_bad = false;
      for (int e = 0; e < N; ++e) {
        const float want = kmath::WidenToFloat(bytes, dtype, e);
        ASSERT_TRUE(SameBits(f[e], want))
            << "dtype " << dtype << " code " << c << " element " << e;
        want_bad |= !std::isfinite(want);
      }
      ASSERT_EQ(bad, want_bad) << "dtype " << dtype << " code " << c;
    }
  }
}

TEST(KernelMathWiden, SixteenBytesAtATimeWidenAsOneAtATime) {
  CheckWidenWords<8>(kmath::kElemBF16, 65536, 1);
  CheckWidenWords<8>(kmath::kElemF16, 65536, 2);
  CheckWidenWords<16>(kmath::kElemF8E4M3, 256, 3);
  CheckWidenWords<16>(kmath::kElemF8E5M2, 256, 4);
  CheckWidenWords<4>(kmath::kElemF32, 4096, 5);
}

// The scores read each K element once for several query rows
// (LanePartials): every row's lane partial has LanePartial's bits, for
// dims with and without a tail, fp32 and fp64 lanes, fewer rows than the
// group holds.
template <typename T>
void CheckLanePartials() {
  constexpr int V = kmath::VirtualLanes<T>::kCount;
  constexpr int R = 4;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> n(0.0, 3.0);
  for (int dim : {1, 7, 8, 16, 20, 64, 100, 128, 256}) {
    std::vector<T> q(R * dim);
    std::vector<float> k(dim);
    for (T& x : q) x = static_cast<T>(n(rng));
    for (float& x : k) x = static_cast<float>(n(rng));
    for (int rows = 0; rows <= R; ++rows) {
      for (int lane = 0; lane < V; ++lane) {
        T out[R];
        kmath::LanePartials(q.data(), dim, k.data(), dim, lane, rows, out);
        for (int r = 0; r < R; ++r) {
          const T want = r < rows ? kmath::LanePartial(q.data() + r * dim,
                                                       k.data(), dim, lane)
                                  : T(0);
          ASSERT_TRUE(SameBits(out[r], want))
              << "dim " << dim << " rows " << rows << " lane " << lane
              << " row " << r;
        }
      }
    }
  }
}

TEST(KernelMathDot, LanePartialsOfSeveralRowsAreEachRowsLanePartial) {
  CheckLanePartials<float>();
  CheckLanePartials<double>();
}

// A barrier for the V threads that stand in for a warp's lanes.
class LaneBarrier {
 public:
  explicit LaneBarrier(int lanes) : lanes_(lanes) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t round = round_;
    if (++waiting_ == lanes_) {
      waiting_ = 0;
      ++round_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return round_ != round; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int lanes_;
  int waiting_ = 0;
  int64_t round_ = 0;
};

// The transposed lane tree (LaneTreeOfValues), run by V threads that
// exchange values as a warp's shuffles do: every value ends on the lanes
// the function names with LaneTree's bits for that value.
template <typename T, int N>
void CheckLaneTreeOfValues(uint64_t seed) {
  constexpr int V = kmath::VirtualLanes<T>::kCount;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1e3);
  T partial[V][N];
  for (auto& lane : partial) {
    for (T& x : lane)
      x = static_cast<T>(dist(rng) * std::ldexp(1.0, rng() % 40 - 20));
  }
  T mailbox[V];
  LaneBarrier barrier(V);
  T held_value[V];
  int held_index[V];
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < V; ++lane) {
    lanes.emplace_back([&, lane] {
      T vals[N];
      std::copy(partial[lane], partial[lane] + N, vals);
      held_index[lane] =
          kmath::LaneTreeOfValues<V, N>(lane, vals, [&](T send, int m) {
            mailbox[lane] = send;
            barrier.Wait();
            const T got = mailbox[lane ^ m];
            barrier.Wait();
            return got;
          });
      held_value[lane] = vals[0];
    });
  }
  for (std::thread& t : lanes) t.join();
  std::vector<int> seen(N, 0);
  for (int lane = 0; lane < V; ++lane) {
    const int v = held_index[lane];
    ASSERT_GE(v, 0);
    ASSERT_LT(v, N);
    T column[V];
    for (int l = 0; l < V; ++l) column[l] = partial[l][v];
    const T want = kmath::LaneTree(column);
    ASSERT_TRUE(SameBits(held_value[lane], want))
        << "lane " << lane << " value " << v << " of " << N;
    if (lane % (V / N) == 0) ++seen[v];
  }
  for (int v = 0; v < N; ++v) EXPECT_EQ(seen[v], 1) << "value " << v;
}

TEST(KernelMathDot, TheTransposedLaneTreeGivesEveryValueTheLaneTreesBits) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CheckLaneTreeOfValues<float, 1>(seed);
    CheckLaneTreeOfValues<float, 2>(seed);
    CheckLaneTreeOfValues<float, 8>(seed);
    CheckLaneTreeOfValues<float, 16>(seed);
    CheckLaneTreeOfValues<double, 1>(seed);
    CheckLaneTreeOfValues<double, 4>(seed);
    CheckLaneTreeOfValues<double, 8>(seed);
  }
}

TEST(KernelMathDrift, UlpDistanceIsTheCore) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> n(0.0, 100.0);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3,
                   DType::kF8E5M2, DType::kF64}) {
    for (int i = 0; i < 5000; ++i) {
      const double a = n(rng) * (i % 7 == 0 ? 1e3 : 1.0);
      const double b = i % 3 == 0 ? -a : a * (1 + 1e-3 * n(rng) / 100.0);
      ASSERT_EQ(kmath::UlpIn(a, b, static_cast<int>(dt)),
                static_cast<double>(UlpDistance(a, b, dt)))
          << DTypeName(dt) << " " << a << " " << b;
    }
  }
}

// ComputeDrift's pass in element order with the kernels' element rule.
DriftStats SequentialDrift(const std::vector<double>& c,
                           const std::vector<double>& r, const DriftOptions& o,
                           int64_t inner) {
  DriftStats s;
  std::vector<double> diffs;
  double sum_abs = 0, sum_sq = 0, sum_ulp = 0;
  int64_t worst = -1;
  const double tiny = kmath::SmallestNormal(static_cast<int>(o.ulp_dtype));
  for (size_t i = 0; i < c.size(); ++i) {
    if (o.active_mask != nullptr && o.active_mask[i / inner] == 0) continue;
    double ad = 0;
    if (!std::isfinite(c[i]) || !std::isfinite(r[i])) {
      s.candidate_nan += std::isnan(c[i]);
      s.candidate_inf += std::isinf(c[i]);
      s.baseline_nan += std::isnan(r[i]);
      s.baseline_inf += std::isinf(r[i]);
    }
    const int kind = kmath::ClassifyPair(c[i], r[i], &ad);
    if (kind == kmath::kPairMismatch) ++s.nonfinite_mismatch;
    if (kind != kmath::kPairValue) continue;
    diffs.push_back(ad);
    sum_abs += ad;
    sum_sq += ad * ad;
    if (worst < 0 || ad > s.max_abs) {
      s.max_abs = ad;
      worst = static_cast<int64_t>(i);
    }
    s.over_tolerance += ad > o.tolerance;
    if (ad > 0) {
      s.max_rel = std::max(s.max_rel, ad / std::max(std::fabs(r[i]), tiny));
      const double u = kmath::UlpIn(c[i], r[i], static_cast<int>(o.ulp_dtype));
      s.max_ulp = std::max(s.max_ulp, u);
      sum_ulp += u;
    }
  }
  s.count = static_cast<int64_t>(diffs.size());
  if (s.count > 0) {
    s.mean_abs = sum_abs / s.count;
    s.rms = std::sqrt(sum_sq / s.count);
    s.mean_ulp = sum_ulp / s.count;
    std::sort(diffs.begin(), diffs.end());
    s.p99_abs = diffs[(99 * s.count + 99) / 100 - 1];
    s.worst.dim = worst;  // flat index, compared below
  }
  return s;
}

TEST(KernelMathDrift, ElementRuleReproducesComputeDrift) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> n(0.0, 1.0);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    std::vector<double> c(4 * 3 * 50), r(c.size());
    for (size_t i = 0; i < c.size(); ++i) {
      r[i] = n(rng);
      c[i] = i % 5 == 0 ? r[i] : r[i] + 1e-3 * n(rng);
    }
    c[7] = nan;
    r[8] = inf;
    c[9] = r[9] = inf;
    c[10] = r[10] = nan;
    c[11] = -inf;
    r[11] = inf;
    std::vector<uint8_t> mask = {1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1};
    for (bool masked : {false, true}) {
      DriftOptions o;
      o.ulp_dtype = dt;
      o.tolerance = 1e-3;
      o.active_mask = masked ? mask.data() : nullptr;
      absl::StatusOr<DriftStats> core =
          ComputeDrift({c.data(), {4, 3, 50}}, {r.data(), {4, 3, 50}}, o);
      ASSERT_TRUE(core.ok()) << core.status();
      const DriftStats mine = SequentialDrift(c, r, o, masked ? 50 : 1);
      const std::string what =
          absl::StrCat(DTypeName(dt), masked ? " masked" : "");
      EXPECT_EQ(mine.count, core->count) << what;
      EXPECT_EQ(mine.over_tolerance, core->over_tolerance) << what;
      EXPECT_EQ(mine.max_abs, core->max_abs) << what;
      EXPECT_EQ(mine.mean_abs, core->mean_abs) << what;
      EXPECT_EQ(mine.rms, core->rms) << what;
      EXPECT_EQ(mine.max_rel, core->max_rel) << what;
      EXPECT_EQ(mine.p99_abs, core->p99_abs) << what;
      EXPECT_EQ(mine.max_ulp, core->max_ulp) << what;
      EXPECT_EQ(mine.mean_ulp, core->mean_ulp) << what;
      EXPECT_EQ(mine.candidate_nan, core->candidate_nan) << what;
      EXPECT_EQ(mine.candidate_inf, core->candidate_inf) << what;
      EXPECT_EQ(mine.baseline_nan, core->baseline_nan) << what;
      EXPECT_EQ(mine.baseline_inf, core->baseline_inf) << what;
      EXPECT_EQ(mine.nonfinite_mismatch, core->nonfinite_mismatch) << what;
      const Location& w = core->worst;
      EXPECT_EQ(mine.worst.dim, (w.batch * 3 + w.query) * 50 + w.head) << what;
    }
  }
}

// Sums in another order: equal up to rounding, or both overflowed.
void ExpectSameRounded(double got, double want, const std::string& what) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what;
  } else {
    EXPECT_NEAR(got, want, 1e-13 * std::fabs(want)) << what;
  }
}

// The GPU reduction's shape (grid-stride partials, block trees, the last
// block's combine, the 11-bit radix select) against ComputeDrift: the
// order-free statistics exactly, the sums within rounding.
void ExpectDeviceShapeIsTheCore(const std::vector<double>& c,
                                const std::vector<double>& r,
                                const std::vector<int64_t>& shape,
                                const DriftOptions& o,
                                const std::string& what) {
  absl::StatusOr<DriftStats> core =
      ComputeDrift({c.data(), shape}, {r.data(), shape}, o);
  ASSERT_TRUE(core.ok()) << core.status();
  kmath::DriftInput in;
  in.candidate = c.data();
  in.baseline = r.data();
  in.n = static_cast<long long>(c.size());
  in.mask = o.active_mask;
  in.inner = static_cast<long long>(c.size() / (shape[0] * shape[1]));
  in.tolerance = o.tolerance;
  in.ulp_dtype = static_cast<int>(o.ulp_dtype);
  absl::StatusOr<kmath::DriftTotals> on_host = RunDriftOnHost(in);
  ASSERT_TRUE(on_host.ok()) << what << ": " << on_host.status();
  const kmath::DriftTotals& t = *on_host;
  auto flat = [&](const Location& l) {
    return (l.batch * shape[1] + l.query) * shape[2] + l.head;
  };
  EXPECT_EQ(t.count, core->count) << what;
  EXPECT_EQ(t.over, core->over_tolerance) << what;
  EXPECT_EQ(t.max_abs, core->max_abs) << what;
  EXPECT_EQ(t.max_rel, core->max_rel) << what;
  EXPECT_EQ(t.max_ulp, core->max_ulp) << what;
  EXPECT_EQ(t.p99_abs, core->p99_abs) << what;
  EXPECT_EQ(t.candidate_nan, core->candidate_nan) << what;
  EXPECT_EQ(t.candidate_inf, core->candidate_inf) << what;
  EXPECT_EQ(t.baseline_nan, core->baseline_nan) << what;
  EXPECT_EQ(t.baseline_inf, core->baseline_inf) << what;
  EXPECT_EQ(t.mismatch, core->nonfinite_mismatch) << what;
  EXPECT_EQ(t.first_mismatch, core->nonfinite_mismatch > 0
                                  ? flat(core->first_nonfinite_mismatch)
                                  : -1)
      << what;
  if (core->count == 0) return;
  EXPECT_EQ(t.worst, flat(core->worst)) << what;
  const double n = static_cast<double>(t.count);
  ExpectSameRounded(t.sum_abs / n, core->mean_abs, what + " mean");
  ExpectSameRounded(std::sqrt(t.sum_sq / n), core->rms, what + " rms");
  ExpectSameRounded(t.sum_ulp / n, core->mean_ulp, what + " mean ulp");
}

TEST(KernelMathDrift, TheDeviceReductionShapeReproducesComputeDrift) {
  std::mt19937_64 rng(23);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> exponent(-300.0, 300.0);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // {groups0, groups1, inner}: 600,000 elements is more than one per thread
  // of the largest grid (1024 blocks of 256).
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 1}, {1, 1, 7}, {4, 3, 50}, {8, 2, 4096}, {20, 30, 1000}};
  for (const std::vector<int64_t>& shape : shapes) {
    const size_t n = static_cast<size_t>(shape[0] * shape[1] * shape[2]);
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<double> c(n), r(n);
      for (size_t i = 0; i < n; ++i) {
        r[i] = normal(rng);
        // Variant 1 spreads |diff| over the whole double range, so every
        // digit of the select decides; variant 2 has no difference at all.
        const double scale =
            variant == 1 ? std::pow(10.0, exponent(rng)) : 1e-3;
        c[i] = variant == 2 || i % 5 == 0 ? r[i] : r[i] + scale * normal(rng);
      }
      if (variant == 3 && n > 20) {
        // Ties of the largest |diff| far apart (other threads, other
        // blocks) and non-finite pairs, the first of them late.
        for (size_t i : {n / 3, n - 1, n / 2, size_t{5}}) c[i] = r[i] + 8.0;
        c[n / 4] = nan;
        r[n / 4 + 1] = inf;
        c[n / 4 + 2] = r[n / 4 + 2] = inf;
        c[n / 4 + 3] = r[n / 4 + 3] = nan;
        c[n - 2] = -inf;
        r[n - 2] = inf;
      }
      std::vector<uint8_t> mask(static_cast<size_t>(shape[0] * shape[1]));
      for (size_t g = 0; g < mask.size(); ++g) mask[g] = g % 3 != 1;
      for (DType dt : {DType::kBF16, DType::kF32, DType::kF64}) {
        for (bool masked : {false, true}) {
          DriftOptions o;
          o.ulp_dtype = dt;
          o.tolerance = 2e-3;
          o.active_mask = masked ? mask.data() : nullptr;
          ExpectDeviceShapeIsTheCore(
              c, r, shape, o,
              absl::StrCat(n, " elements, variant ", variant, ", ",
                           DTypeName(dt), masked ? ", masked" : ""));
        }
      }
    }
  }
}

TEST(KernelMathDrift, TheRadixDigitsCoverEveryKeyBitOnce) {
  unsigned long long covered = 0;
  for (int pass = 0; pass < kmath::kSelectPasses; ++pass) {
    const unsigned long long all = ~0ull;
    const int shift = kmath::DigitShift(pass);
    const unsigned long long digit_bits =
        static_cast<unsigned long long>(kmath::DigitOf(all, pass)) << shift;
    EXPECT_EQ(covered & digit_bits, 0u) << "pass " << pass;
    covered |= digit_bits;
    EXPECT_LT(kmath::DigitOf(all, pass), kmath::kDigitBins);
  }
  EXPECT_EQ(covered, ~0ull);
  // A key matches the prefix of its own digits at every pass, and a key
  // differing in an earlier digit does not.
  const unsigned long long key = 0x3ff0123456789abcull;
  EXPECT_FALSE(kmath::MatchesPrefix(kmath::kNotCounted, 0, 0));
  for (int pass = 1; pass < kmath::kSelectPasses; ++pass) {
    EXPECT_TRUE(kmath::MatchesPrefix(key, key, pass));
    const unsigned long long other =
        key ^ (1ull << kmath::DigitShift(pass - 1));
    EXPECT_FALSE(kmath::MatchesPrefix(other, key, pass)) << pass;
  }
}

// Device code cannot read core/tensor/dtype_traits.h's host table, so
// kernels/math holds its own copy of the dtype facts it needs; this keeps
// the copy equal to the table, row by row.
static_assert(kmath::kElemF32 == static_cast<int>(DType::kF32) &&
                  kmath::kElemF16 == static_cast<int>(DType::kF16) &&
                  kmath::kElemBF16 == static_cast<int>(DType::kBF16) &&
                  kmath::kElemF8E4M3 == static_cast<int>(DType::kF8E4M3) &&
                  kmath::kElemF8E5M2 == static_cast<int>(DType::kF8E5M2) &&
                  kmath::kElemF64 == static_cast<int>(DType::kF64),
              "kmath::ElemType numbers the dtypes as DType does");

TEST(KernelMathDTypes, TheKernelsCopyOfTheDTypeFactsIsTheTraitsTable) {
  for (const DTypeTraits& t : kDTypeTraits) {
    if (!t.floating()) continue;
    SCOPED_TRACE(t.name);
    const int elem = static_cast<int>(t.dtype);
    EXPECT_EQ(kmath::ElemBytes(elem), t.bytes);
    EXPECT_EQ(kmath::SmallestNormal(elem), t.smallest_normal());
    // The small formats kmath encodes itself (bf16 and wider go through
    // their bits).
    if (t.bytes == 1 || t.dtype == DType::kF16) {
      const kmath::SmallFormat f = kmath::FormatOf(elem);
      EXPECT_EQ(f.ebits, t.exponent_bits);
      EXPECT_EQ(f.mbits, t.mantissa_bits);
      EXPECT_EQ(f.bias, t.exponent_bias());
      EXPECT_EQ(f.has_inf, t.has_infinity);
      EXPECT_EQ(f.max_finite, t.max_finite);
      EXPECT_EQ(f.saturate, t.saturates);
    }
  }
  EXPECT_EQ(kmath::ElemBytes(static_cast<int>(DType::kI32)), 0);
}

TEST(KernelMathSplit, SplitRunsCoverEveryRunOnceInOrder) {
  for (int32_t n : {0, 1, 5, 16, 17}) {
    for (int64_t splits : {1, 2, 3, 7, 40}) {
      int32_t expect = 10;  // the row's first run
      for (int64_t s = 0; s < splits; ++s) {
        int32_t first = -1;
        int32_t last = -1;
        kmath::SplitRuns(10, 10 + n, splits, s, &first, &last);
        ASSERT_EQ(first, expect) << n << " runs, split " << s << "/" << splits;
        ASSERT_LE(first, last);
        ASSERT_LE(last - first, (n + splits - 1) / splits);
        expect = last;
      }
      EXPECT_EQ(expect, 10 + n) << n << " runs in " << splits << " splits";
    }
  }
}

// Hand-computed at W1's shape (B = 8, one position, 32 query heads, D =
// 128, 17 splits): R's split states 17 x 256 x 130 x 8 bytes; nothing
// without R (P's unit states are stored by every pass).
TEST(KernelMathSplit, SplitExtraBytesCountsWhatTheSplitAdds) {
  const int64_t queries = 8 * 32;
  EXPECT_EQ(kmath::SplitExtraBytes(17, queries, 128, true), 4526080);
  EXPECT_EQ(kmath::SplitExtraBytes(17, queries, 128, false), 0);
}

// Both phases of the unit tree walk about sqrt(units) leaves, and the
// blocks cover the most units with room for each phase's tree.
TEST(KernelMathSplit, TreeBlocksSplitTheUnitsIntoTwoShortPhases) {
  EXPECT_EQ(kmath::TreeBlockUnits(0), 1);
  EXPECT_EQ(kmath::TreeBlockUnits(1), 1);
  EXPECT_EQ(kmath::TreeBlockUnits(2), 2);
  EXPECT_EQ(kmath::TreeBlockUnits(256), 16);
  EXPECT_EQ(kmath::TreeBlockUnits(8192), 128);  // 64 blocks of 128
  const int64_t most_leaves = int64_t{1} << (kmath::kUnitTreeLevels - 1);
  for (int64_t units :
       {int64_t{3}, int64_t{8192}, int64_t{1} << 20, int64_t{1} << 32}) {
    const int64_t block = kmath::TreeBlockUnits(units);
    EXPECT_LE(block, most_leaves) << units;
    EXPECT_LE((units + block - 1) / block, most_leaves) << units;
  }
}

TEST(KernelMathSplit, SplitsFillTheTargetWithoutExceedingTheRuns) {
  EXPECT_EQ(kmath::SplitsFor(64, 8192, 1056), 17);   // ceil(1056 / 64)
  EXPECT_EQ(kmath::SplitsFor(64, 10, 1056), 10);     // no more than runs
  EXPECT_EQ(kmath::SplitsFor(2000, 8192, 1056), 1);  // already full
  EXPECT_EQ(kmath::SplitsFor(64, 1, 1056), 1);
  EXPECT_EQ(kmath::SplitsFor(0, 100, 1056), 1);
}

// LogPositive against the long-double log: within one fp32 rounding of the
// exact value (half an ulp and the fp64 path's hair), special values as
// the C library's.
TEST(KernelMathLog, LogPositiveIsWithinHalfAnUlpAndHandlesSpecials) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits(1, 0x7f7fffffu);
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 1000 ? 1.0f + static_cast<float>(i) / 1000.0f
                             : kmath::BitsAsFloat(bits(rng));
    const long double exact = std::log(static_cast<long double>(x));
    const float got = kmath::LogPositive(x);
    const long double ulp =
        std::nextafter(std::fabs(got), INFINITY) - std::fabs(got);
    ASSERT_LE(std::fabs(static_cast<long double>(got) - exact),
              0.5000001L * ulp)
        << "x = " << x;
  }
  EXPECT_EQ(kmath::LogPositive(1.0f), 0.0f);
  EXPECT_EQ(kmath::LogPositive(0.0f), -INFINITY);
  EXPECT_EQ(kmath::LogPositive(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(kmath::LogPositive(-1.0f)));
  EXPECT_TRUE(std::isnan(kmath::LogPositive(NAN)));
  const float tiny = kmath::BitsAsFloat(1u);  // the least subnormal
  EXPECT_NEAR(kmath::LogPositive(tiny), std::log(static_cast<double>(tiny)),
              1e-5);
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
