#include "bench/common/machine_floor.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace attnaudit::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Starts `threads` threads, releases them together and returns the seconds
// until the last one finished fn(thread_index).
template <typename Fn>
double TimeThreads(int threads, Fn&& fn) {
  std::vector<std::thread> pool;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) {
      }
      fn(t);
    });
  }
  while (ready.load() < threads) {
  }
  const Clock::time_point start = Clock::now();
  go.store(true);
  for (std::thread& t : pool) t.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Sum of 64-bit words: vectorised integer adds, so the probe is bound by
// memory, not arithmetic.
uint64_t SumWords(const uint64_t* p, size_t n) {
  uint64_t lane[8] = {0};
  for (size_t i = 0; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += p[i + j];
  }
  uint64_t s = 0;
  for (uint64_t v : lane) s += v;
  return s;
}

// The FMA probes. Each runs kChains independent dependency chains
// acc[j] = acc[j] * a + b; the chains start from different values, so the
// compiler can neither merge them nor fold them (no fast-math), and the
// fully unrolled loop body keeps every accumulator in a register (the
// loops compile to exactly kChains vfmadd per iteration and nothing else).
// Compiled per ISA with target attributes and chosen at run time, so the
// probe measures the machine, not the build flags.
constexpr int kChains512 = 16;  // + 2 constants: 18 of 32 zmm registers
constexpr int kChains256 = 12;  // + 2 constants: 14 of 16 ymm registers
constexpr int kChains128 = 12;

__attribute__((target("avx512f"))) double FmaF64Avx512(int64_t iterations,
                                                       double seed) {
  __m512d acc[kChains512];
#pragma GCC unroll 16
  for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_set1_pd(seed + j);
  const __m512d a = _mm512_set1_pd(0.999999);
  const __m512d b = _mm512_set1_pd(1e-7);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_fmadd_pd(acc[j], a, b);
  }
  // Stored and summed by hand: GCC 12's _mm512_reduce_add_* trip
  // -Wuninitialized inside a target("avx512f") function.
  alignas(64) double lanes[8];
  double s = 0;
  for (int j = 0; j < kChains512; ++j) {
    _mm512_store_pd(lanes, acc[j]);
    for (double x : lanes) s += x;
  }
  return s;
}

__attribute__((target("avx512f"))) double FmaF32Avx512(int64_t iterations,
                                                       double seed) {
  __m512 acc[kChains512];
#pragma GCC unroll 16
  for (int j = 0; j < kChains512; ++j) {
    acc[j] = _mm512_set1_ps(static_cast<float>(seed + j));
  }
  const __m512 a = _mm512_set1_ps(0.999999f);
  const __m512 b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  alignas(64) float lanes[16];
  float s = 0;
  for (int j = 0; j < kChains512; ++j) {
    _mm512_store_ps(lanes, acc[j]);
    for (float x : lanes) s += x;
  }
  return s;
}

__attribute__((target("avx2,fma"))) double FmaF64Avx2(int64_t iterations,
                                                      double seed) {
  __m256d acc[kChains256];
#pragma GCC unroll 12
  for (int j = 0; j < kChains256; ++j) acc[j] = _mm256_set1_pd(seed + j);
  const __m256d a = _mm256_set1_pd(0.999999);
  const __m256d b = _mm256_set1_pd(1e-7);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains256; ++j) acc[j] = _mm256_fmadd_pd(acc[j], a, b);
  }
  alignas(32) double lanes[4];
  double s = 0;
  for (int j = 0; j < kChains256; ++j) {
    _mm256_store_pd(lanes, acc[j]);
    s += lanes[0] + lanes[1] + lanes[2] + lanes[3];
  }
  return s;
}

__attribute__((target("avx2,fma"))) double FmaF32Avx2(int64_t iterations,
                                                      double seed) {
  __m256 acc[kChains256];
#pragma GCC unroll 12
  for (int j = 0; j < kChains256; ++j) {
    acc[j] = _mm256_set1_ps(static_cast<float>(seed + j));
  }
  const __m256 a = _mm256_set1_ps(0.999999f);
  const __m256 b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains256; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  alignas(32) float lanes[8];
  float s = 0;
  for (int j = 0; j < kChains256; ++j) {
    _mm256_store_ps(lanes, acc[j]);
    for (float x : lanes) s += x;
  }
  return s;
}

// No FMA unit (pre-2013 x86): a multiply and an add per step, 2 flops.
double MulAddF64Sse2(int64_t iterations, double seed) {
  __m128d acc[kChains128];
#pragma GCC unroll 12
  for (int j = 0; j < kChains128; ++j) acc[j] = _mm_set1_pd(seed + j);
  const __m128d a = _mm_set1_pd(0.999999);
  const __m128d b = _mm_set1_pd(1e-7);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains128; ++j) {
      acc[j] = _mm_add_pd(_mm_mul_pd(acc[j], a), b);
    }
  }
  alignas(16) double lanes[2];
  double s = 0;
  for (int j = 0; j < kChains128; ++j) {
    _mm_store_pd(lanes, acc[j]);
    s += lanes[0] + lanes[1];
  }
  return s;
}

double MulAddF32Sse2(int64_t iterations, double seed) {
  __m128 acc[kChains128];
#pragma GCC unroll 12
  for (int j = 0; j < kChains128; ++j) {
    acc[j] = _mm_set1_ps(static_cast<float>(seed + j));
  }
  const __m128 a = _mm_set1_ps(0.999999f);
  const __m128 b = _mm_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains128; ++j) {
      acc[j] = _mm_add_ps(_mm_mul_ps(acc[j], a), b);
    }
  }
  alignas(16) float lanes[4];
  float s = 0;
  for (int j = 0; j < kChains128; ++j) {
    _mm_store_ps(lanes, acc[j]);
    for (float x : lanes) s += x;
  }
  return s;
}

using ProbeFn = double (*)(int64_t iterations, double seed);

struct FmaProbe {
  const char* isa;
  int chains;
  int bytes_per_vector;
  ProbeFn f64;
  ProbeFn f32;
};

// The probes this CPU runs, no wider than `widest` ("" for all).
std::vector<FmaProbe> SupportedProbes(const std::string& widest) {
  std::vector<FmaProbe> probes;
  __builtin_cpu_init();
  const bool any = widest.empty();
  if (any && __builtin_cpu_supports("avx512f")) {
    probes.push_back({"avx512", kChains512, 64, FmaF64Avx512, FmaF32Avx512});
  }
  if ((any || widest == "avx2") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma")) {
    probes.push_back({"avx2", kChains256, 32, FmaF64Avx2, FmaF32Avx2});
  }
  // SSE2 can never beat an FMA probe; it only stands in where there is none.
  if (probes.empty()) {
    probes.push_back({"sse2", kChains128, 16, MulAddF64Sse2, MulAddF32Sse2});
  }
  return probes;
}

// Flops per second of `fn` on `threads` threads: best of `repeats`.
double ProbeFlops(ProbeFn fn, int chains, int lanes, int threads, int repeats) {
  // ~40 ms per run at 2 FMAs per cycle and 4 GHz with 16 chains.
  const int64_t iterations = 10'000'000;
  const double flops =
      2.0 * chains * lanes * static_cast<double>(iterations) * threads;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    best = std::min(best, TimeThreads(threads, [&](int t) {
                      volatile double sink = fn(iterations, 1.0 + t);
                      (void)sink;
                    }));
  }
  return flops / best;
}

// Flops per second of `fn` in one run of about `ms` milliseconds, assuming
// 2 FMAs a cycle at 4 GHz (a slower machine runs longer; the ratio does
// not depend on it).
double ProbeFlopsOnce(ProbeFn fn, int chains, int lanes, int threads,
                      double ms) {
  const int64_t iterations =
      std::max<int64_t>(1000, static_cast<int64_t>(ms * 1e-3 * 8e9 / chains));
  const double flops =
      2.0 * chains * lanes * static_cast<double>(iterations) * threads;
  return flops / TimeThreads(threads, [&](int t) {
           volatile double sink = fn(iterations, 1.0 + t);
           (void)sink;
         });
}

double ReadBandwidth(int threads, int repeats) {
  const size_t bytes = size_t{1} << 30;  // far beyond any L3 here
  const size_t words = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buffer(words);
  for (size_t i = 0; i < words; ++i) buffer[i] = i;
  std::atomic<uint64_t> sink{0};
  const size_t per = words / threads;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    best = std::min(best, TimeThreads(threads, [&](int t) {
                      sink.fetch_add(SumWords(buffer.data() + t * per, per));
                    }));
  }
  if (sink.load() == 42) std::printf(" ");
  return static_cast<double>(per * threads * sizeof(uint64_t)) / best;
}

}  // namespace

MachineFloor MeasureMachineFloor(int threads, int repeats,
                                 const std::string& widest_isa) {
  MachineFloor f;
  threads = std::max(threads, 1);
  f.threads = threads;
  f.read_bytes_per_second = ReadBandwidth(threads, repeats);
  for (const FmaProbe& p : SupportedProbes(widest_isa)) {
    const double f64 =
        ProbeFlops(p.f64, p.chains, p.bytes_per_vector / 8, threads, repeats);
    const double f32 =
        ProbeFlops(p.f32, p.chains, p.bytes_per_vector / 4, threads, repeats);
    if (f64 > f.fp64_flops_per_second) {
      f.fp64_flops_per_second = f64;
      f.fma_isa = p.isa;
      f.fma_chains = p.chains;
    }
    f.fp32_flops_per_second = std::max(f.fp32_flops_per_second, f32);
  }
  return f;
}

double ComputeFloorNow(double flops, const std::string& isa, int threads,
                       double probe_ms) {
  threads = std::max(threads, 1);
  for (const FmaProbe& p : SupportedProbes(isa == "avx512" ? "" : isa)) {
    if (isa != p.isa) continue;
    const double f64 = ProbeFlopsOnce(p.f64, p.chains, p.bytes_per_vector / 8,
                                      threads, probe_ms);
    const double f32 = ProbeFlopsOnce(p.f32, p.chains, p.bytes_per_vector / 4,
                                      threads, probe_ms);
    return flops / f64 + flops / f32;
  }
  return 0;
}

std::string MachineFloorJson(const MachineFloor& f) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "{\"threads\":%d,\"read_bytes_per_second\":%.6g,"
                "\"fp64_flops_per_second\":%.6g,"
                "\"fp32_flops_per_second\":%.6g,\"fma_isa\":\"%s\","
                "\"fma_chains\":%d}",
                f.threads, f.read_bytes_per_second, f.fp64_flops_per_second,
                f.fp32_flops_per_second, f.fma_isa.c_str(), f.fma_chains);
  return buf;
}

}  // namespace attnaudit::bench
