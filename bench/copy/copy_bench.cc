// The GPU backend's staging copy on the host (docs/PERF.md, "Staging
// copy"): a W1-sized source (130 MiB, pageable) copied 16 MiB chunk by
// chunk into one of two 16 MiB buffers, as PinnedStaging::Upload fills its
// pinned buffers, on one thread (the baseline, plain memcpy) and with
// ParallelCopy on 2, 4, ... up to every hardware thread. No GPU: the figure
// is what the host side of an upload can feed the DMA. Runs alternate
// between the variants; medians of --repeats.
// Usage: attnaudit_bench_copy [--repeats N] [--mib M]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/common/parallel.h"
#include "core/common/parallel_copy.h"

namespace attnaudit::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kChunk = int64_t{16} << 20;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds to copy src through the two chunk buffers; threads 0: memcpy.
double CopySeconds(const std::vector<char>& src, std::vector<char>* buffers,
                   int threads) {
  const int64_t bytes = static_cast<int64_t>(src.size());
  const Clock::time_point start = Clock::now();
  for (int64_t off = 0, i = 0; off < bytes; off += kChunk, ++i) {
    const int64_t n = std::min(kChunk, bytes - off);
    char* dst = buffers[i % 2].data();
    if (threads == 0) {
      std::memcpy(dst, src.data() + off, static_cast<size_t>(n));
    } else {
      ParallelCopy(dst, src.data() + off, n, threads);
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int Main(int argc, char** argv) {
  int repeats = 15;
  int64_t mib = 130;
  CLI::App app("host staging copy: memcpy vs ParallelCopy",
               "attnaudit_bench_copy");
  app.add_option("--repeats", repeats, "timed runs per variant (median)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--mib", mib, "source size in MiB (W1's KV: 130)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  CLI11_PARSE(app, argc, argv);
  std::vector<char> src(static_cast<size_t>(mib << 20));
  for (size_t i = 0; i < src.size(); i += 4096) src[i] = static_cast<char>(i);
  std::vector<char> buffers[2] = {std::vector<char>(kChunk, 1),
                                  std::vector<char>(kChunk, 1)};
  std::vector<int> variants = {0};
  const int hw = ResolveThreads(0);
  for (int t = 1; t < hw; t *= 2) variants.push_back(t);
  variants.push_back(hw);
  std::vector<std::vector<double>> seconds(variants.size());
  for (size_t v = 0; v < variants.size(); ++v) {
    CopySeconds(src, buffers, variants[v]);  // warm-up, pages touched
  }
  for (int r = 0; r < repeats; ++r) {
    for (size_t v = 0; v < variants.size(); ++v) {
      seconds[v].push_back(CopySeconds(src, buffers, variants[v]));
    }
  }
  const double base = Median(seconds[0]);
  std::printf(
      "Staging copy of %lld MiB in 16 MiB chunks, %u hardware threads, "
      "median of %d\n| copy | ms | GB/s | vs memcpy |\n|---|---|---|---|\n",
      static_cast<long long>(mib), std::thread::hardware_concurrency(),
      repeats);
  for (size_t v = 0; v < variants.size(); ++v) {
    const double s = Median(seconds[v]);
    char name[64];
    if (variants[v] == 0) {
      std::snprintf(name, sizeof name, "memcpy (baseline)");
    } else {
      std::snprintf(name, sizeof name, "ParallelCopy, %d threads", variants[v]);
    }
    std::printf("| %s | %.2f | %.1f | %.2fx |\n", name, s * 1e3,
                static_cast<double>(src.size()) / s / 1e9, base / s);
  }
  return 0;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
