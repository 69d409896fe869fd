// attnaudit_bench_floor: prints the machine floor (read bandwidth, fp64 and
// fp32 FMA peaks, with the ISA, vector width, chains and threads of the FMA
// probe, the measured clock and the FMAs per cycle it implies;
// bench/common/machine_floor.h states the method) so that benchmarks
// outside C++ (bench/peers, bench/sweeps) compare against the same probe as
// the C++ benchmarks, measured in their own run.
//
// usage: attnaudit_bench_floor [--threads N] [--repeats R] [--sweep] [--json]
//   --threads N  threads for the probes (default: all hardware threads)
//   --repeats R  best of R runs of each probe (default 5)
//   --sweep      measure every thread count from 1 to N, one line each
//   --json       one JSON object per thread count instead of text
// Exit 0, or 2 for a bad argument.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "bench/common/machine_floor.h"

namespace attnaudit::bench {
namespace {

constexpr char kUsage[] =
    "usage: attnaudit_bench_floor [--threads N] [--repeats R] [--sweep] "
    "[--json]\n";

// Parses a positive int; false for anything else.
bool ParsePositive(const char* text, int* out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < 1 || v > 4096) return false;
  *out = static_cast<int>(v);
  return true;
}

int Main(int argc, char** argv) {
  const unsigned hw = std::thread::hardware_concurrency();
  int threads = hw == 0 ? 1 : static_cast<int>(hw);
  int repeats = 5;
  bool sweep = false;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--threads" || arg == "--repeats") && i + 1 < argc) {
      if (!ParsePositive(argv[++i], arg == "--threads" ? &threads : &repeats)) {
        std::fprintf(stderr, "%s: expected a positive integer, got '%s'\n",
                     arg.c_str(), argv[i]);
        return 2;
      }
    } else if (arg == "--sweep") {
      sweep = true;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  for (int t = sweep ? 1 : threads; t <= threads; ++t) {
    const MachineFloor f = MeasureMachineFloor(t, repeats);
    if (json) {
      std::printf("%s\n", MachineFloorJson(f).c_str());
    } else {
      std::printf("%s\n", MachineFloorText(f).c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
