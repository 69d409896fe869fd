#include "bench/common/machine_floor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace attnaudit::bench {
namespace {

using Clock = std::chrono::steady_clock;

template <typename Fn>
double TimeThreads(int threads, Fn&& fn) {
  std::vector<std::thread> pool;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point start;
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
  start = Clock::now();
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

// Independent FMA chains (8 vector registers) hide the FMA latency, so the
// probe runs at the FMA units' throughput: the peak the audit could reach.
#if defined(__AVX512F__)
constexpr int kDoublesPerVector = 8;
double FmaPeakF64(int64_t iterations, double seed) {
  __m512d acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm512_set1_pd(seed + j * 1e-3);
  const __m512d a = _mm512_set1_pd(0.999999);
  const __m512d b = _mm512_set1_pd(1e-7);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_fmadd_pd(acc[j], a, b);
  }
  double s = 0;
  for (int j = 0; j < 8; ++j) s += _mm512_reduce_add_pd(acc[j]);
  return s;
}
float FmaPeakF32(int64_t iterations, float seed) {
  __m512 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm512_set1_ps(seed + j * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f);
  const __m512 b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  float s = 0;
  for (int j = 0; j < 8; ++j) s += _mm512_reduce_add_ps(acc[j]);
  return s;
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kDoublesPerVector = 4;
double FmaPeakF64(int64_t iterations, double seed) {
  __m256d acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_set1_pd(seed + j * 1e-3);
  const __m256d a = _mm256_set1_pd(0.999999);
  const __m256d b = _mm256_set1_pd(1e-7);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_pd(acc[j], a, b);
  }
  alignas(32) double lanes[4];
  double s = 0;
  for (int j = 0; j < 8; ++j) {
    _mm256_store_pd(lanes, acc[j]);
    s += lanes[0] + lanes[1] + lanes[2] + lanes[3];
  }
  return s;
}
float FmaPeakF32(int64_t iterations, float seed) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_set1_ps(seed + j * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f);
  const __m256 b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  alignas(32) float lanes[8];
  float s = 0;
  for (int j = 0; j < 8; ++j) {
    _mm256_store_ps(lanes, acc[j]);
    for (float x : lanes) s += x;
  }
  return s;
}
#else
constexpr int kDoublesPerVector = 1;
double FmaPeakF64(int64_t iterations, double seed) {
  double acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = seed + j * 1e-3;
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < 8; ++j) acc[j] = std::fma(acc[j], 0.999999, 1e-7);
  }
  double s = 0;
  for (double x : acc) s += x;
  return s;
}
float FmaPeakF32(int64_t iterations, float seed) {
  float acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = seed + j * 1e-3f;
  for (int64_t i = 0; i < iterations; ++i) {
    for (int j = 0; j < 8; ++j) acc[j] = std::fma(acc[j], 0.999999f, 1e-7f);
  }
  float s = 0;
  for (float x : acc) s += x;
  return s;
}
#endif

}  // namespace

MachineFloor MeasureMachineFloor(int threads, int repeats) {
  MachineFloor f;
  f.threads = threads;
  const size_t bytes = size_t{1} << 30;  // far beyond any L3 here
  const size_t words = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buffer(words);
  for (size_t i = 0; i < words; ++i) buffer[i] = i;
  std::atomic<uint64_t> sink{0};
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double s = TimeThreads(threads, [&](int t) {
      const size_t per = words / threads;
      sink.fetch_add(SumWords(buffer.data() + t * per, per));
    });
    best = std::min(best, s);
  }
  f.read_bytes_per_second = static_cast<double>(bytes) / best;

  const int64_t iters = 20'000'000;
  // 8 vector FMAs per iteration, 2 flops per lane.
  const double flops64 = 2.0 * 8 * kDoublesPerVector * iters * threads;
  best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    best = std::min(best, TimeThreads(threads, [&](int t) {
                      volatile double v = FmaPeakF64(iters, 1.0 + t);
                      (void)v;
                    }));
  }
  f.fp64_flops_per_second = flops64 / best;
  best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    best = std::min(best, TimeThreads(threads, [&](int t) {
                      volatile float v = FmaPeakF32(iters, 1.0f + t);
                      (void)v;
                    }));
  }
  f.fp32_flops_per_second = 2.0 * flops64 / best;
  if (sink.load() == 42) std::printf(" ");
  return f;
}

}  // namespace attnaudit::bench
