// attnaudit_bench_kernels: the fused pass's four arithmetic kernels in
// isolation, per SIMD target, against the FMA peak measured in the same
// run: how close the register tiles come to the machine when nothing else
// of the pass (softmax bookkeeping, merges, prefetch, first touch of the
// page) is around them.
//
// Method. One KV head of one W1 page (llama3-8b: 16 bf16 tokens of an NHD
// page with 8 KV heads, head_dim 128, a GQA group of 4 query rows), L1
// resident, through the pass's own code (core/simd/simd-inl.h DotRows,
// core/attention/value_tiles-inl.h AccumulateRows): R's fp64 scores and
// value accumulation, P's fp32 scores and value accumulation (from zero, as
// a unit's are), and P's values again with the unit's epilogue (each row
// divided by its sum and merged into a running state, as the pass folds a
// unit). Each kernel runs back to back for `--run-ms`, best of
// `--repeats`; a kernel's time is per (page, KV head), its efficiency the
// multiply-adds it must do over the target's FMA peak (fp64 or fp32 probe
// of bench/common/machine_floor.h on one thread). One thread, so the
// figures are per core.
//
// usage: attnaudit_bench_kernels [--run-ms MS] [--repeats N]
// clang-format off: foreach_target.h must come first, before the
// headers it re-includes for every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/kernels/kernels_bench.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/attention/value_tiles-inl.h"
#include "core/simd/dispatch.h"
#include "core/simd/simd-inl.h"
#include "hwy/highway.h"

// Compiled once, not per target (foreach_target re-includes this file).
#ifndef ATTNAUDIT_BENCH_KERNELS_SHARED_
#define ATTNAUDIT_BENCH_KERNELS_SHARED_
namespace attnaudit::bench {

// Seconds per (page, KV head) call of each kernel.
struct KernelTimes {
  double r_scores = 0;
  double r_values = 0;
  double p_scores = 0;
  double p_values = 0;
  double p_unit = 0;  // P values with the unit's epilogue: normalise, fold
};

// The W1 page's shape.
constexpr int64_t kTokens = 16;
constexpr int64_t kKvHeads = 8;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kRows = 4;  // one GQA group

}  // namespace attnaudit::bench
#endif  // ATTNAUDIT_BENCH_KERNELS_SHARED_

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

using bench::kHeadDim;
using bench::kKvHeads;
using bench::kRows;
using bench::kTokens;

// Best of `repeats` runs of about `seconds` each (the call count set from
// a first short run), per call.
template <class Fn>
double BestPerCall(double seconds, int repeats, Fn&& fn) {
  auto time = [&](int64_t calls) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i) fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  const double first = time(16) / 16;
  const int64_t iterations =
      std::max<int64_t>(16, static_cast<int64_t>(seconds / first));
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) best = std::min(best, time(iterations));
  return best / static_cast<double>(iterations);
}

void TimeKernelsImpl(double seconds, int repeats, bench::KernelTimes* out) {
  const DF64 d64;
  const DF32 d32;
  constexpr int64_t kRow = kKvHeads * kHeadDim;  // NHD: a token's heads
  // K and V of one page, bf16 values in [1, 2) with varied mantissas.
  std::vector<uint16_t> kv(2 * kTokens * kRow);
  for (size_t i = 0; i < kv.size(); ++i) {
    kv[i] = static_cast<uint16_t>(0x3f80 + (i * 37) % 127);
  }
  const auto* k = reinterpret_cast<const hwy::bfloat16_t*>(kv.data());
  const hwy::bfloat16_t* v = k + kTokens * kRow;
  std::vector<double> q64(kRows * kHeadDim), acc64(kRows * kHeadDim, 0.0);
  std::vector<float> q32(kRows * kHeadDim), acc32(kRows * kHeadDim, 0.0f);
  std::vector<double> s64(kRows * kTokens), e64(kRows * kTokens, 0.5);
  std::vector<float> s32(kRows * kTokens), e32(kRows * kTokens, 0.5f);
  for (int64_t i = 0; i < kRows * kHeadDim; ++i) {
    q64[i] = 1e-3 * static_cast<double>(i % 101) - 0.05;
    q32[i] = static_cast<float>(q64[i]);
  }
  int32_t idx[kTokens];
  for (int32_t t = 0; t < kTokens; ++t) idx[t] = t;
  out->r_scores = BestPerCall(seconds, repeats, [&] {
    DotRows(d64, q64.data(), kRows, k, kRow, kTokens, kHeadDim, s64.data(),
            kTokens, 0.088);
  });
  out->r_values = BestPerCall(seconds, repeats, [&] {
    AccumulateRows(d64, RowsOut<DF64>{acc64.data(), kHeadDim}, kRows,
                   e64.data(), kTokens, v, kRow, idx, kTokens, kHeadDim);
  });
  out->p_scores = BestPerCall(seconds, repeats, [&] {
    DotRows(d32, q32.data(), kRows, k, kRow, kTokens, kHeadDim, s32.data(),
            kTokens, 0.088f);
  });
  out->p_values = BestPerCall(seconds, repeats, [&] {
    AccumulateRows</*kFromZero=*/true>(
        d32, RowsOut<DF32>{acc32.data(), kHeadDim}, kRows, e32.data(), kTokens,
        v, kRow, idx, kTokens, kHeadDim);
  });
  // What the pass does with a unit: the values, then each row divided by
  // its sum and merged into a pending left node of its merge tree
  // (merge_step's weights).
  std::vector<float> rep(kRows * kHeadDim, 0.25f), sums(kRows, 7.0f);
  attention_internal::TreeStep step[kRows];
  attention_internal::LeafPlan plan[kRows];
  for (int64_t r = 0; r < kRows; ++r) {
    float lse = 0;
    step[r].left = &rep[r * kHeadDim];
    step[r].fold = attention_internal::PlanFold(true, 1.0f, 1.5f, &lse);
    plan[r].steps = &step[r];
    plan[r].n = 1;
    plan[r].dest = &rep[r * kHeadDim];
  }
  out->p_unit = BestPerCall(seconds, repeats, [&] {
    const NormalisedOut<DF32> unit{sums.data(), nullptr, plan, kHeadDim};
    AccumulateRows</*kFromZero=*/true>(d32, unit, kRows, e32.data(), kTokens, v,
                                       kRow, idx, kTokens, kHeadDim);
  });
  // Keep the results alive.
  volatile double sink = s64[3] + acc64[5] + s32[2] + acc32[7];
  (void)sink;
}

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <CLI/CLI.hpp>

#include "bench/common/machine_floor.h"
#include "core/simd/targets.h"

namespace attnaudit::bench {
namespace {

ATTNAUDIT_SIMD_EXPORT(TimeKernelsImpl);

// The FMA probe that matches a SIMD target's widest vectors.
std::string ProbeIsa(const std::string& target) {
  if (target == "AVX3") return "";
  if (target == "AVX2") return "avx2";
  return "sse2";
}

int Main(int argc, char** argv) {
  CLI::App app{"the fused pass's kernels in isolation, per SIMD target"};
  double run_ms = 20;
  int repeats = 7;
  app.add_option("--run-ms", run_ms, "length of one timed run")
      ->check(CLI::Range(0.1, 10000.0));
  app.add_option("--repeats", repeats, "timed runs (best counts)")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  // Multiply-adds per (page, KV head): rows x tokens x head_dim, for the
  // scores and again for the values.
  const double madds = static_cast<double>(kRows * kTokens * kHeadDim);
  std::printf(
      "one KV head of a W1 page (16 bf16 tokens, head_dim 128, 4 query "
      "rows), L1 resident, one thread; best of %d runs of ~%.0f ms\n",
      repeats, run_ms);
  std::printf(
      "| target | kernel | us per (page, KV head) | x its FMA floor |\n"
      "|---|---|---|---|\n");
  for (int64_t target : CompiledSimdTargets()) {
    const std::string name = SimdTargetName(target);
    ForceSimdTargetForTest(target);
    const MachineFloor floor = MeasureMachineFloor(1, 5, ProbeIsa(name));
    // An FMA counts 2 flops in the probe.
    const double f64_floor = 2 * madds / floor.fp64_flops_per_second;
    const double f32_floor = 2 * madds / floor.fp32_flops_per_second;
    KernelTimes t;
    ATTNAUDIT_SIMD_DISPATCH(TimeKernelsImpl)(run_ms * 1e-3, repeats, &t);
    const struct {
      const char* kernel;
      double seconds;
      double floor;
    } rows[] = {{"R scores (fp64)", t.r_scores, f64_floor},
                {"R values (fp64)", t.r_values, f64_floor},
                {"P scores (fp32)", t.p_scores, f32_floor},
                {"P values (fp32)", t.p_values, f32_floor},
                {"P values + unit epilogue", t.p_unit, f32_floor}};
    for (const auto& r : rows) {
      std::printf("| %s | %s | %.3f | %.2f |\n", name.c_str(), r.kernel,
                  r.seconds * 1e6, r.seconds / r.floor);
    }
    const double total = t.r_scores + t.r_values + t.p_scores + t.p_values;
    const double total_floor = 2 * f64_floor + 2 * f32_floor;
    std::printf("| %s | all four | %.3f | %.2f |\n", name.c_str(), total * 1e6,
                total / total_floor);
  }
  ForceSimdTargetForTest(0);
  return 0;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
#endif  // HWY_ONCE
