// W1 benchmark: times R, P, the fused pass, the in-memory audit and the whole
// `attnaudit check` (file read + parse + audit) on the W1 snapshot
// (llama3-8b, B=8, context 4096, page 16, bf16, permuted pages), next to the
// machine floor measured in the same run:
//   floor = max(KV bytes / read bandwidth,
//               R flops / fp64 FMA peak + P flops / fp32 FMA peak).
// Usage: attnaudit_bench_check [--threads N] [--repeats N] [--context L]
//        [--batch B] [--preset NAME] [--markdown]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/common/machine_floor.h"
#include "core/attention/attention.h"
#include "core/audit/audit.h"
#include "core/common/parallel.h"
#include "core/simd/targets.h"
#include "core/validate/validate.h"
#include "proto/codec/codec.h"
#include "sim/simulator.h"

// Every operator new of the process, counted: the audit's heap allocations
// (its own and its libraries' C++ ones; C allocations such as OpenSSL's are
// not counted). Replacing the global operator new is this benchmark's
// alone; the library never does.
namespace {
std::atomic<int64_t> g_operator_news{0};
}  // namespace

void* operator new(std::size_t bytes) {
  g_operator_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
// Not inlined: GCC would see free() meet its built-in idea of new.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace attnaudit::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  double min = 0;
  double median = 0;
};

template <typename Fn>
Timing Measure(int repeats, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const Clock::time_point s = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - s).count());
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

void Die(const absl::Status& st) {
  std::fprintf(stderr, "bench: %s\n", st.ToString().c_str());
  std::exit(1);
}

struct BenchFlags {
  int threads = 0;  // 0: all cores
  int repeats = 5;
  std::string preset = "llama3-8b";
  int64_t batch = 8;
  int64_t context = 4096;
  std::string kv_dtype = "bf16";
  std::string file = "/tmp/attnaudit_bench_w1.pb";
  bool markdown = false;
  std::string simd_target;  // empty: the best one this CPU runs
};

// CLI11 parses; a usage error exits 2 with what was wrong.
BenchFlags ParseFlags(int argc, char** argv) {
  BenchFlags f;
  CLI::App app("W1 benchmark of the audit against this machine's floor",
               "attnaudit_bench_check");
  app.add_option("--threads", f.threads, "threads (0: all cores)");
  app.add_option("--repeats", f.repeats, "runs per stage (min and median)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--preset", f.preset, "model preset");
  app.add_option("--batch", f.batch, "rows")->check(CLI::Range(1, 4096));
  app.add_option("--context", f.context, "KV length of row 0")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--kv-dtype", f.kv_dtype, "KV cache dtype of the snapshot")
      ->check(CLI::IsMember({"bf16", "f16", "f32", "fp8_e4m3"}));
  app.add_option("--file", f.file, "where the snapshot file is written");
  app.add_flag("--markdown", f.markdown, "also print a Markdown table");
  app.add_option("--simd-target", f.simd_target,
                 "run the SIMD code as this target (AVX3, AVX2, SSE4), to "
                 "measure another ISA on this machine, against that ISA's "
                 "floor (SSE4: multiply then add, no FMA)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return f;
}

// The W1 snapshot, validated and prepared, with the work it represents.
struct Workload {
  Snapshot snapshot;
  ResolvedLayout layout;
  PreparedAttention prepared;
  double kv_bytes = 0;  // the KV rows the pass reads
  double flops = 0;     // per pass: 4 flops per (visible key, dim, head)
};

// On the heap: `prepared` points into the snapshot and layout beside it.
std::unique_ptr<Workload> PrepareWorkload(const BenchFlags& flags,
                                          int threads) {
  SynthOptions so;
  so.preset = flags.preset;
  so.batch = flags.batch;
  so.context = flags.context;
  so.kv_dtype = DTypeFromName(flags.kv_dtype);
  so.permute_pages = true;
  so.seed = 1;
  auto owned = std::make_unique<Workload>();
  Workload& w = *owned;
  absl::StatusOr<Snapshot> synth = Synthesize(so);
  if (!synth.ok()) Die(synth.status());
  w.snapshot = *std::move(synth);
  if (absl::Status st = WriteSnapshotFile(flags.file, w.snapshot); !st.ok()) {
    Die(st);
  }
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(w.snapshot);
  if (!layout.ok()) Die(layout.status());
  w.layout = *std::move(layout);
  absl::StatusOr<PreparedAttention> prepared =
      PrepareAttention(w.snapshot, w.layout, threads);
  if (!prepared.ok()) Die(prepared.status());
  w.prepared = *std::move(prepared);
  const SnapshotDims& d = w.layout.dims;
  // Work: visible keys per query (decode: all cached keys of the row).
  int64_t active_tokens = 0;
  double visible_pairs = 0;
  for (int64_t b = 0; b < d.batch; ++b) {
    active_tokens += w.layout.seq_lens[b];
    visible_pairs += static_cast<double>(w.layout.seq_lens[b]) * d.queries;
  }
  w.kv_bytes = static_cast<double>(active_tokens) * d.kv_heads * d.head_dim *
               2 * DTypeSize(w.snapshot.k_pages.dtype());
  w.flops = 4.0 * d.head_dim * d.q_heads * visible_pairs;
  return owned;
}

// What the kernel charges to make every page of the file (in the page
// cache) addressable and to take the mapping down again, on all threads:
// the part of a whole check that no floor counts and no code of ours can
// skip while the file is read through a mapping. MADV_POPULATE_READ in
// 4 MiB ranges is the cheapest form this benchmark has found (its figures:
// docs/perf-history.md).
void MapAndUnmap(const std::string& path, int threads) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die(absl::ErrnoToStatus(errno, path));
  struct stat st;
  if (::fstat(fd, &st) != 0) Die(absl::ErrnoToStatus(errno, path));
  const size_t size = static_cast<size_t>(st.st_size);
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) Die(absl::ErrnoToStatus(errno, path));
  constexpr size_t kRange = size_t{4} << 20;
  char* base = static_cast<char*>(mapped);
  ParallelFor(
      static_cast<int64_t>((size + kRange - 1) / kRange), threads,
      [&](int64_t i) {
        const size_t begin = static_cast<size_t>(i) * kRange;
        const size_t length = std::min(kRange, size - begin);
        if (::madvise(base + begin, length, MADV_POPULATE_READ) == 0) {
          return;
        }
        // A kernel before 5.14: first touch, one read per page.
        const long page = ::sysconf(_SC_PAGESIZE);
        for (size_t at = 0; at < length; at += page) {
          static_cast<void>(*static_cast<volatile char*>(base + begin + at));
        }
      });
  ::munmap(mapped, size);
}

// The in-memory audit's own stages (AuditOptions::on_stage), median
// seconds over the audit runs: where a small audit's time goes besides the
// pass.
struct AuditStageTimes {
  double validate = 0;   // everything but the K/V values
  double attention = 0;  // RoPE, scales and the fused pass ("reference" +
                         // "replay")
  double compare = 0;    // log-probs, the three comparisons, the verdict
};

// Per-run ratios of a stage to the compute floor measured by a short FMA
// probe just before that run (ComputeFloorNow): median and best.
struct PairedRatio {
  double median = 0;
  double best = 0;
  double median_floor = 0;  // seconds: the probes' compute floor, median
};

struct StageTimes {
  Timing validate, reference, replay, fused, audit, read, check, mapping;
  PairedRatio fused_paired, audit_paired, check_paired;
  AuditStageTimes audit_stages;
  double news_per_audit = 0;  // operator new calls per in-memory audit
  Verdict verdict = Verdict::kUnspecified;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `repeats` runs of fn, each right after a short probe of the machine's
// FMA rate: the ratios run time / max(memory floor, compute floor now),
// each against the machine's speed of that moment rather than its best
// moment minutes before.
template <typename Fn>
PairedRatio MeasurePaired(int repeats, const Workload& w,
                          const MachineFloor& floor, int threads, Fn&& fn) {
  const double memory = w.kv_bytes / floor.read_bytes_per_second;
  std::vector<double> ratios, floors;
  for (int i = 0; i < repeats; ++i) {
    // The previous run's worker threads spin for a while after it ends; a
    // probe among them read ~30 % slow on the 2-vCPU VM (so the ratios
    // came out low). Let them go idle first.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const double compute = ComputeFloorNow(w.flops, floor.fma_isa, threads);
    floors.push_back(compute);
    const Clock::time_point s = Clock::now();
    fn();
    const double seconds =
        std::chrono::duration<double>(Clock::now() - s).count();
    ratios.push_back(seconds / std::max(memory, compute));
  }
  std::sort(ratios.begin(), ratios.end());
  return {ratios[ratios.size() / 2], ratios.front(), Median(floors)};
}

StageTimes MeasureStages(const Workload& w, const BenchFlags& flags,
                         const MachineFloor& floor, int threads) {
  // Warm-up: one fused pass before anything is timed.
  AttentionRunOptions warm_up;
  warm_up.threads = threads;
  absl::StatusOr<AttentionResults> once = ComputeAttention(w.prepared, warm_up);
  if (!once.ok()) Die(once.status());
  auto run_passes = [&](AttentionPasses passes) {
    AttentionRunOptions o;
    o.threads = threads;
    o.record_merge_orders = false;
    o.passes = passes;
    absl::StatusOr<AttentionResults> r = ComputeAttention(w.prepared, o);
    if (!r.ok()) Die(r.status());
  };
  AuditOptions audit_options;
  audit_options.threads = threads;
  const int n = flags.repeats;
  StageTimes t;
  t.validate = Measure(n, [&] {
    if (!ValidateSnapshot(w.snapshot).ok())
      Die(absl::InternalError("validate"));
  });
  t.reference =
      Measure(n, [&] { run_passes(AttentionPasses::kReferenceOnly); });
  t.replay = Measure(n, [&] { run_passes(AttentionPasses::kReplayOnly); });
  t.fused = Measure(n, [&] { run_passes(AttentionPasses::kBoth); });
  t.fused_paired = MeasurePaired(n, w, floor, threads,
                                 [&] { run_passes(AttentionPasses::kBoth); });
  std::vector<double> validate, attention, compare;
  AuditOptions staged = audit_options;
  staged.on_stage = [&](const char* stage, double seconds) {
    const std::string name = stage;
    if (name == "validate") validate.push_back(seconds);
    if (name == "reference") attention.push_back(seconds);
    // "replay" follows "reference": the two share the pass's time.
    if (name == "replay") attention.back() += seconds;
    if (name == "compare") compare.push_back(seconds);
  };
  t.audit = Measure(n, [&] {
    absl::StatusOr<AuditReport> r = RunAudit(w.snapshot, staged);
    if (!r.ok()) Die(r.status());
    t.verdict = r->verdict;
  });
  t.audit_stages = {Median(validate), Median(attention), Median(compare)};
  t.audit_paired = MeasurePaired(n, w, floor, threads, [&] {
    if (!RunAudit(w.snapshot, audit_options).ok())
      Die(absl::InternalError("audit"));
  });
  // Counted apart from the timed runs (all warm by now).
  constexpr int kCounted = 5;
  const int64_t news_before = g_operator_news.load();
  for (int i = 0; i < kCounted; ++i) {
    if (!RunAudit(w.snapshot, audit_options).ok())
      Die(absl::InternalError("audit"));
  }
  t.news_per_audit =
      static_cast<double>(g_operator_news.load() - news_before) / kCounted;
  t.check = Measure(n, [&] {
    absl::StatusOr<Snapshot> s = ReadSnapshotFile(flags.file);
    if (!s.ok()) Die(s.status());
    absl::StatusOr<AuditReport> r = RunAudit(*s, audit_options);
    if (!r.ok()) Die(r.status());
  });
  t.check_paired = MeasurePaired(n, w, floor, threads, [&] {
    absl::StatusOr<Snapshot> s = ReadSnapshotFile(flags.file);
    if (!s.ok()) Die(s.status());
    if (!RunAudit(*s, audit_options).ok()) Die(absl::InternalError("check"));
  });
  t.read = Measure(n, [&] {
    absl::StatusOr<Snapshot> s = ReadSnapshotFile(flags.file);
    if (!s.ok()) Die(s.status());
  });
  t.mapping = Measure(n, [&] { MapAndUnmap(flags.file, threads); });
  return t;
}

void PrintResults(const BenchFlags& flags, const Workload& w, int threads,
                  const MachineFloor& floor, const StageTimes& t) {
  const SnapshotDims& d = w.layout.dims;
  const double floor_memory = w.kv_bytes / floor.read_bytes_per_second;
  const double floor_compute = w.flops / floor.fp64_flops_per_second +
                               w.flops / floor.fp32_flops_per_second;
  const double machine_floor = std::max(floor_memory, floor_compute);
  std::printf(
      "W1: preset=%s B=%lld Sq=%lld Hq=%lld Hkv=%lld D=%lld page=%lld "
      "context=%lld kv=%s, verdict %s, threads %d\n",
      flags.preset.c_str(), (long long)d.batch, (long long)d.queries,
      (long long)d.q_heads, (long long)d.kv_heads, (long long)d.head_dim,
      (long long)d.page_size, (long long)flags.context,
      std::string(DTypeName(w.snapshot.k_pages.dtype())).c_str(),
      std::string(VerdictName(t.verdict)).c_str(), threads);
  std::printf(
      "machine: read %.2f GB/s, fp64 %.1f GFLOP/s, fp32 %.1f GFLOP/s (%s, %d "
      "FMA chains per thread)\n",
      floor.read_bytes_per_second / 1e9, floor.fp64_flops_per_second / 1e9,
      floor.fp32_flops_per_second / 1e9, floor.fma_isa.c_str(),
      floor.fma_chains);
  std::printf("work: KV %.1f MiB, %.3f GFLOP per pass (R fp64 + P fp32)\n",
              w.kv_bytes / 1048576.0, w.flops / 1e9);
  std::printf("floor: memory %.2f ms, compute %.2f ms -> %.2f ms\n",
              floor_memory * 1e3, floor_compute * 1e3, machine_floor * 1e3);
  const std::pair<const char*, const Timing*> rows[] = {
      {"validate", &t.validate},
      {"R (fp64 reference) alone", &t.reference},
      {"P (fp32 replay) alone", &t.replay},
      {"R + P fused pass", &t.fused},
      {"audit in memory (R+P+drift)", &t.audit},
      {"read + parse file", &t.read},
      {"whole check (read+audit)", &t.check},
      {"map + unmap the file's pages", &t.mapping}};
  for (const auto& [name, timing] : rows) {
    std::printf("  %-34s min %8.2f ms  median %8.2f ms  %5.2fx floor\n", name,
                timing->min * 1e3, timing->median * 1e3,
                timing->median / machine_floor);
  }
  const AuditStageTimes& a = t.audit_stages;
  std::printf(
      "  audit stages, median ms: validate %.3f, attention %.3f (fused pass "
      "%.3f), compare %.3f, rest %.3f\n",
      a.validate * 1e3, a.attention * 1e3, t.fused.median * 1e3,
      a.compare * 1e3,
      (t.audit.median - a.validate - a.attention - a.compare) * 1e3);
  std::printf("  audit heap allocations (operator new) per audit: %.0f\n",
              t.news_per_audit);
  // Robust to the VM's drift: each run against the FMA rate of the moment.
  std::printf(
      "  paired x floor (an FMA probe before each run; median / best): "
      "fused pass %.2fx / %.2fx, audit in memory %.2fx / %.2fx, whole check "
      "(in process) %.2fx / %.2fx\n",
      t.fused_paired.median, t.fused_paired.best, t.audit_paired.median,
      t.audit_paired.best, t.check_paired.median, t.check_paired.best);
  std::printf(
      "  (the probes' compute floor, median: %.2f ms, against %.2f ms from "
      "the best of the start-of-run probes)\n",
      t.fused_paired.median_floor * 1e3,
      (w.flops / floor.fp64_flops_per_second +
       w.flops / floor.fp32_flops_per_second) *
          1e3);
  // The least a whole check can cost here: the floor's work plus the
  // kernel's page mapping, which the floor does not count.
  const double bound = machine_floor + t.mapping.median;
  std::printf("check bound: floor + page mapping = %.2f ms (%.2fx floor)\n",
              bound * 1e3, bound / machine_floor);
  if (!flags.markdown) return;
  std::printf(
      "\n| stage | median ms | min ms | x floor |\n|---|---|---|---|\n");
  for (const auto& [name, timing] : rows) {
    std::printf("| %s | %.2f | %.2f | %.2f |\n", name, timing->median * 1e3,
                timing->min * 1e3, timing->median / machine_floor);
  }
}

int Main(int argc, char** argv) {
  const BenchFlags flags = ParseFlags(argc, argv);
  const int threads = ResolveThreads(flags.threads);
  if (!flags.simd_target.empty()) {
    bool found = false;
    for (int64_t target : CompiledSimdTargets()) {
      if (SimdTargetName(target) != flags.simd_target) continue;
      ForceSimdTargetForTest(target);
      found = true;
    }
    if (!found) {
      std::fprintf(stderr,
                   "bench: --simd-target %s: not a target this CPU runs\n",
                   flags.simd_target.c_str());
      return 2;
    }
  }
  std::printf("simd target: %s\n", ActiveSimdTarget().c_str());
  const std::unique_ptr<Workload> owned = PrepareWorkload(flags, threads);
  const Workload& w = *owned;
  // The floor of the ISA the SIMD code runs as: a forced target is
  // compared with what a CPU of that ISA (at this core's clock) can do.
  const std::string widest = flags.simd_target == "AVX2"   ? "avx2"
                             : flags.simd_target == "SSE4" ? "sse2"
                                                           : "";
  const MachineFloor floor = MeasureMachineFloor(threads, 5, widest);
  const StageTimes t = MeasureStages(w, flags, floor, threads);
  PrintResults(flags, w, threads, floor, t);
  std::remove(flags.file.c_str());
  return 0;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
