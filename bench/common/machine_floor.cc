#include "bench/common/machine_floor.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace attnaudit::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The CPUs the calling thread may run on, in order.
std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

void PinCallerTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Whether TimeThreads pins `threads` threads: one per allowed CPU.
bool PinsThreads(int threads) {
  return static_cast<int>(AllowedCpus().size()) == threads;
}

// Runs fn(0) on the calling thread and fn(1..threads-1) on threads of its
// own, released together; returns the seconds until the last one
// finished. With one thread per allowed CPU, each is pinned to its own
// CPU (the caller's affinity is restored after), so no two share a core
// for a moment; with fewer the scheduler places them. The caller does
// work instead of waiting, so no extra thread competes for the CPUs.
template <typename Fn>
double TimeThreads(int threads, Fn&& fn) {
  const std::vector<int> cpus = AllowedCpus();
  cpu_set_t saved;
  const bool pin =
      static_cast<int>(cpus.size()) == threads &&
      pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0;
  if (pin) PinCallerTo(cpus[0]);
  std::vector<std::thread> pool;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      if (pin) PinCallerTo(cpus[t]);
      ready.fetch_add(1);
      while (!go.load()) {
        if (!pin) std::this_thread::yield();
      }
      fn(t);
    });
  }
  while (ready.load() < threads - 1) std::this_thread::yield();
  const Clock::time_point start = Clock::now();
  go.store(true);
  fn(0);
  for (std::thread& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  if (pin) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  return seconds;
}

// 16 x n dependent register adds: one a cycle on any x86 core (the added
// register is opaque, so no core can fold the adds as it may immediates).
uint64_t AddChain(int64_t n, uint64_t one) {
  uint64_t x = 0;
  for (int64_t i = 0; i < n; ++i) {
    asm volatile(
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
        : "+r"(x)
        : "r"(one));
  }
  return x;
}

// The core clock from one run: every thread runs ~2.5 ms of dependent
// adds at once; the slowest thread's cycles per second.
double ClockOnce(int threads) {
  const int64_t n = 625'000;  // 10M cycles: 2.5 ms at 4 GHz
  std::vector<double> hz(threads);
  std::atomic<uint64_t> sink{0};
  TimeThreads(threads, [&](int t) {
    const Clock::time_point s = Clock::now();
    sink.fetch_add(AddChain(n, 1));
    hz[t] = 16.0 * n / std::chrono::duration<double>(Clock::now() - s).count();
  });
  return *std::min_element(hz.begin(), hz.end());
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
  int bits;  // vector width
  ProbeFn f64;
  ProbeFn f32;
};

// The probes this CPU runs, no wider than `widest` ("" for all), widest
// first.
std::vector<FmaProbe> SupportedProbes(const std::string& widest) {
  std::vector<FmaProbe> probes;
  __builtin_cpu_init();
  const bool any = widest.empty();
  if (any && __builtin_cpu_supports("avx512f")) {
    probes.push_back({"avx512", kChains512, 512, FmaF64Avx512, FmaF32Avx512});
  }
  if ((any || widest == "avx2") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma")) {
    probes.push_back({"avx2", kChains256, 256, FmaF64Avx2, FmaF32Avx2});
  }
  // SSE2 can never beat an FMA probe; it only stands in where there is none.
  if (probes.empty()) {
    probes.push_back({"sse2", kChains128, 128, MulAddF64Sse2, MulAddF32Sse2});
  }
  return probes;
}

// Flops per second of `fn` on `threads` threads: one untimed run of a
// quarter length (the clock ramps up), then best of `repeats`. The clock
// is sampled before each timed run, the best kept in *clock_hz, so that
// its samples spread over the whole probe as the FMA runs do.
double ProbeFlops(ProbeFn fn, int chains, int lanes, int threads, int repeats,
                  double* clock_hz) {
  // ~45 ms per run at one 512-bit FMA per cycle and 3.6 GHz with 16 chains.
  const int64_t iterations = 10'000'000;
  const double flops =
      2.0 * chains * lanes * static_cast<double>(iterations) * threads;
  TimeThreads(threads, [&](int t) {
    volatile double sink = fn(iterations / 4, 1.0 + t);
    (void)sink;
  });
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    *clock_hz = std::max(*clock_hz, ClockOnce(threads));
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
  repeats = std::max(repeats, 1);
  f.threads = threads;
  f.threads_pinned = PinsThreads(threads);
  f.read_bytes_per_second = ReadBandwidth(threads, repeats);
  // The widest probe counts unless a narrower one's compute floor is more
  // than 5 % lower (machine_floor.h, "Which ISA counts").
  double chosen_floor = 0;
  for (const FmaProbe& p : SupportedProbes(widest_isa)) {
    const double f64 =
        ProbeFlops(p.f64, p.chains, p.bits / 64, threads, repeats, &f.clock_hz);
    const double f32 =
        ProbeFlops(p.f32, p.chains, p.bits / 32, threads, repeats, &f.clock_hz);
    const double compute_floor = 1 / f64 + 1 / f32;
    if (f.fma_isa.empty() || compute_floor < 0.95 * chosen_floor) {
      chosen_floor = compute_floor;
      f.fp64_flops_per_second = f64;
      f.fp32_flops_per_second = f32;
      f.fma_isa = p.isa;
      f.fma_vector_bits = p.bits;
      f.fma_chains = p.chains;
    }
  }
  f.fma_per_cycle = f.fp64_flops_per_second /
                    (threads * f.clock_hz * 2.0 * (f.fma_vector_bits / 64));
  return f;
}

double ComputeFloorNow(double flops, const std::string& isa, int threads,
                       double probe_ms) {
  threads = std::max(threads, 1);
  for (const FmaProbe& p : SupportedProbes(isa == "avx512" ? "" : isa)) {
    if (isa != p.isa) continue;
    const double f64 =
        ProbeFlopsOnce(p.f64, p.chains, p.bits / 64, threads, probe_ms);
    const double f32 =
        ProbeFlopsOnce(p.f32, p.chains, p.bits / 32, threads, probe_ms);
    return flops / f64 + flops / f32;
  }
  return 0;
}

std::string MachineFloorText(const MachineFloor& f) {
  // A core retires a whole number of vector FMAs per cycle at its peak
  // (machine_floor.h); anything else means the probe did not run alone.
  const double whole = std::max(1.0, std::round(f.fma_per_cycle));
  const bool off = std::abs(f.fma_per_cycle - whole) > 0.1 * whole;
  char buf[768];
  std::snprintf(
      buf, sizeof(buf),
      "threads %d%s: read %.2f GB/s, fp64 %.1f GFLOP/s, fp32 %.1f GFLOP/s "
      "(%s: %d-bit FMA, %d chains per thread; clock %.2f GHz, %.2f FMAs per "
      "cycle per thread)%s",
      f.threads, f.threads_pinned ? " (one per CPU)" : "",
      f.read_bytes_per_second / 1e9, f.fp64_flops_per_second / 1e9,
      f.fp32_flops_per_second / 1e9, f.fma_isa.c_str(), f.fma_vector_bits,
      f.fma_chains, f.clock_hz / 1e9, f.fma_per_cycle,
      off ? "; not a whole number of FMAs per cycle: other work (or an SMT "
            "sibling) shared the cores, or the clock moved; re-run on a "
            "quiet machine"
          : "");
  return buf;
}

std::string MachineFloorJson(const MachineFloor& f) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "{\"threads\":%d,\"threads_pinned\":%s,"
                "\"read_bytes_per_second\":%.6g,"
                "\"fp64_flops_per_second\":%.6g,"
                "\"fp32_flops_per_second\":%.6g,\"fma_isa\":\"%s\","
                "\"fma_vector_bits\":%d,\"fma_chains\":%d,"
                "\"clock_hz\":%.6g,\"fma_per_cycle\":%.4g}",
                f.threads, f.threads_pinned ? "true" : "false",
                f.read_bytes_per_second, f.fp64_flops_per_second,
                f.fp32_flops_per_second, f.fma_isa.c_str(), f.fma_vector_bits,
                f.fma_chains, f.clock_hz, f.fma_per_cycle);
  return buf;
}

}  // namespace attnaudit::bench
