// The GPU benchmark (docs/PERF.md, "GPU backend"), on one GPU, each figure
// with its same-run baseline:
//   1. the partial-state (replay P) kernel's achieved bandwidth -- KV bytes
//      read / kernel time -- against a device-to-device copy of the same
//      bytes measured in the same run, at each --contexts value with W1's
//      heads (llama3-8b: 32 query / 8 KV heads, D 128, page 16, bf16);
//      also the R kernel and the fused R + P pass;
//   2. the full W1 audit on the GPU (host snapshot in, report out), split
//      into transfer (upload, download) and compute (kernel), next to the
//      same audit on the CPU backend;
//   3. the CP ring on the CUDA-local transport (W ranks as streams of the
//      GPU): time per step and per round, the ranks' compute share;
//   4. the drift statistics of one comparison (host arrays in, statistics
//      out: uploads, kernels, download) on the GPU against the core's
//      ComputeDrift on one host thread, at W1's out size and larger.
// Timings are CUDA events on the backend's stream (medians of --repeats
// runs after one warm-up). Prints markdown; --json writes the figures.
// Usage: attnaudit_bench_gpu [--device N] [--repeats N] [--batch B]
//        [--contexts 4096,32768,131072] [--world W] [--json PATH]
//        [--bandwidth-only] [--pool-gib G] [--max-splits N]
//        [--max-stage-runs N] [--generic-kernels] [--tree-every-level]
//        [--copy-threads N]
// The P column splits off the second step's share (P's unit tree) and the
// splits (blocks per row along its runs) the backend chose.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/attention/attention.h"
#include "core/audit/audit.h"
#include "core/backend/fallback_backend.h"
#include "core/cp/replay/replay.h"
#include "core/cp/schedule/schedule.h"
#include "core/drift/drift.h"
#include "core/tensor/dtype.h"
#include "core/validate/validate.h"
#include "kernels/cuda_backend.h"
#include "sim/simulator.h"

namespace attnaudit::bench {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const absl::Status& st) {
  std::fprintf(stderr, "bench: %s\n", st.ToString().c_str());
  std::exit(1);
}

struct Flags {
  int device = 0;
  int repeats = 5;
  int64_t batch = 8;
  std::vector<int64_t> contexts = {4096, 32768, 131072};
  int64_t world = 4;
  bool bandwidth_only = false;
  double pool_gib = 0;         // 0: the backend's default (3/4 of free memory)
  int64_t max_splits = 0;      // 0: the backend's choice; 1: no split-KV
  int64_t max_stage_runs = 0;  // 0: the backend's choice; 1: a run a stage
  int copy_threads = 0;        // staging copies; 0: every hardware thread
  bool generic_kernels = false;   // never the kernel built for the shape
  bool tree_every_level = false;  // the unit tree's every-level carry
  std::string json;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  CLI::App app("GPU backend benchmark on W1's heads", "attnaudit_bench_gpu");
  app.add_option("--device", f.device, "CUDA device ordinal");
  app.add_option("--repeats", f.repeats, "timed runs per figure (median)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--batch", f.batch, "rows")->check(CLI::Range(1, 4096));
  app.add_option("--contexts", f.contexts, "KV lengths of row 0")
      ->delimiter(',');
  app.add_option("--world", f.world, "CP ranks of the ring figure")
      ->check(CLI::Range(2, 64));
  app.add_option("--json", f.json, "also write the figures as JSON here");
  app.add_flag("--bandwidth-only", f.bandwidth_only,
               "only the kernel bandwidth table (for profilers)");
  app.add_option("--pool-gib", f.pool_gib,
                 "device memory pool in GiB (a profiler that replays kernels "
                 "saves and restores all of it: give it a few GiB)")
      ->check(CLI::Range(0.0, 1024.0));
  app.add_option("--max-splits", f.max_splits,
                 "most blocks per row along its runs (1: the one-block "
                 "pass, the split-KV pass's baseline)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--max-stage-runs", f.max_stage_runs,
                 "most runs (pages) a block computes as one stage (1: one "
                 "at a time, the staged pass's baseline)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_flag("--generic-kernels", f.generic_kernels,
               "always the pass's generic kernel, not the one built for "
               "the head dim and dtype (the specialisation's baseline)");
  app.add_flag("--tree-every-level", f.tree_every_level,
               "the second step's unit tree walks every level of a carry "
               "(in registers) instead of the levels it needs (in local "
               "memory)");
  app.add_option("--copy-threads", f.copy_threads,
                 "host threads copying into and out of the pinned staging "
                 "buffers (0: every hardware thread, as one GPU worker on "
                 "the machine gets; 1: the single-threaded baseline)")
      ->check(CLI::Range(0, 4096));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return f;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Case {
  Snapshot snapshot;
  ResolvedLayout layout;
  PreparedAttention prepared;
  int64_t kv_bytes = 0;  // K and V of the pages the rows read
};

std::unique_ptr<Case> MakeCase(int64_t batch, int64_t context, int64_t world) {
  auto c = std::make_unique<Case>();
  SynthOptions so;
  so.preset = "llama3-8b";
  so.batch = batch;
  so.context = context;
  so.permute_pages = true;
  so.cp_world_size = world;
  if (world > 1) so.cp_sharding = CpSharding::kPageInterleaved;
  absl::StatusOr<Snapshot> s = Synthesize(so);
  if (!s.ok()) Die(s.status());
  c->snapshot = *std::move(s);
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(c->snapshot);
  if (!layout.ok()) Die(layout.status());
  c->layout = *std::move(layout);
  absl::StatusOr<PreparedAttention> p =
      PrepareAttention(c->snapshot, c->layout, 0);
  if (!p.ok()) Die(p.status());
  c->prepared = *std::move(p);
  const SnapshotDims& d = c->prepared.dims;
  int64_t tokens = 0;
  for (int64_t len : c->layout.seq_lens) tokens += len;
  c->kv_bytes =
      tokens * d.kv_heads * d.head_dim *
      (DTypeSize(c->prepared.k_dtype) + DTypeSize(c->prepared.v_dtype));
  return c;
}

// Device-to-device copy of `bytes`, seconds per copy (median).
double CopySeconds(int64_t bytes, int repeats) {
  void* a = nullptr;
  void* b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess ||
      cudaMalloc(&b, bytes) != cudaSuccess) {
    Die(absl::ResourceExhaustedError("copy buffers"));
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> t;
  for (int i = 0; i <= repeats; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0) t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return Median(t);
}

// Kernel seconds of one pass kind (median), from the backend's events;
// the second step's share (P's unit tree) and the splits go to *merge /
// *splits.
double KernelSeconds(CudaBackend& gpu, const PreparedAttention& p,
                     AttentionPasses passes, int repeats,
                     double* merge = nullptr, int64_t* splits = nullptr,
                     int64_t* stage_runs = nullptr,
                     bool* specialized = nullptr) {
  std::vector<double> t, m;
  AttentionRunOptions o;
  o.passes = passes;
  o.record_merge_orders = false;
  for (int i = 0; i <= repeats; ++i) {
    absl::StatusOr<AttentionResults> r = gpu.ComputeAttention(p, o);
    if (!r.ok()) Die(r.status());
    if (i == 0) continue;
    t.push_back(gpu.last_timings().kernel_seconds);
    m.push_back(gpu.last_timings().merge_seconds);
    if (splits != nullptr) *splits = gpu.last_timings().splits;
    if (stage_runs != nullptr) *stage_runs = gpu.last_timings().stage_runs;
    if (specialized != nullptr) *specialized = gpu.last_timings().specialized;
  }
  if (merge != nullptr) *merge = Median(m);
  return Median(t);
}

struct BandwidthRow {
  int64_t context = 0;
  double kv_gib = 0;
  double copy_gbs = 0;  // (read + write) bytes / s of the D2D copy
  double p_gbs = 0;     // KV bytes / s of the P kernel
  double r_gbs = 0;
  double fused_gbs = 0;
  double p_ms = 0;
  double p_merge_ms = 0;  // of p_ms: the second step (P's unit tree)
  int64_t splits = 1;
  int64_t stage_runs = 1;
  bool specialized = false;  // the kernel built for W1's shape ran
};

BandwidthRow Bandwidth(CudaBackend& gpu, const Flags& f, int64_t context) {
  std::unique_ptr<Case> c = MakeCase(f.batch, context, 1);
  BandwidthRow row;
  row.context = context;
  row.kv_gib = c->kv_bytes / 1073741824.0;
  const double copy = CopySeconds(c->kv_bytes, f.repeats);
  row.copy_gbs = 2.0 * c->kv_bytes / copy / 1e9;
  double p_merge = 0;
  const double p =
      KernelSeconds(gpu, c->prepared, AttentionPasses::kReplayOnly, f.repeats,
                    &p_merge, &row.splits, &row.stage_runs, &row.specialized);
  row.p_merge_ms = p_merge * 1e3;
  const double r = KernelSeconds(gpu, c->prepared,
                                 AttentionPasses::kReferenceOnly, f.repeats);
  const double both =
      KernelSeconds(gpu, c->prepared, AttentionPasses::kBoth, f.repeats);
  row.p_gbs = c->kv_bytes / p / 1e9;
  row.r_gbs = c->kv_bytes / r / 1e9;
  row.fused_gbs = c->kv_bytes / both / 1e9;
  row.p_ms = p * 1e3;
  return row;
}

struct AuditRow {
  double gpu_total_ms = 0, upload_ms = 0, kernel_ms = 0, download_ms = 0;
  double host_ms = 0;  // validate + prepare + compare on the host
  double cpu_total_ms = 0;
  std::string verdict;
};

AuditRow W1Audit(CudaBackend& gpu, const Flags& f) {
  std::unique_ptr<Case> c = MakeCase(8, 4096, 1);
  AuditRow row;
  std::vector<double> total, up, kern, down, cpu;
  for (int i = 0; i <= f.repeats; ++i) {
    // As the server's CudaDevice runs it: what the GPU refuses runs on the
    // CPU, and the row says so.
    FallbackBackend job_backend(gpu, CpuBackendInstance());
    AuditOptions o;
    o.backend = &job_backend;
    Clock::time_point start = Clock::now();
    absl::StatusOr<AuditReport> r = AuditSnapshot(c->snapshot, o);
    const double s =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (!r.ok()) Die(r.status());
    row.verdict = r->provenance.backend == gpu.name()
                      ? std::string(VerdictName(r->verdict))
                      : "ran on " + r->provenance.backend;
    const CudaJobTimings t = gpu.last_timings();
    o.backend = nullptr;
    start = Clock::now();
    absl::StatusOr<AuditReport> rc = AuditSnapshot(c->snapshot, o);
    const double sc =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (!rc.ok()) Die(rc.status());
    if (i == 0) continue;
    total.push_back(s);
    up.push_back(t.upload_seconds);
    kern.push_back(t.kernel_seconds);
    down.push_back(t.download_seconds);
    cpu.push_back(sc);
  }
  row.gpu_total_ms = Median(total) * 1e3;
  row.upload_ms = Median(up) * 1e3;
  row.kernel_ms = Median(kern) * 1e3;
  row.download_ms = Median(down) * 1e3;
  row.host_ms =
      row.gpu_total_ms - row.upload_ms - row.kernel_ms - row.download_ms;
  row.cpu_total_ms = Median(cpu) * 1e3;
  return row;
}

struct RingRow {
  int64_t world = 0, steps = 0, rounds = 0;
  double replay_ms = 0, per_step_us = 0, per_round_us = 0, compute_share = 0;
};

RingRow Ring(CudaBackend& gpu, const Flags& f) {
  std::unique_ptr<Case> c = MakeCase(8, 4096, f.world);
  const PreparedAttention& p = c->prepared;
  const CpShards shards = PlanShards(p.units, f.world, p.dims.page_size);
  const CpSchedule schedule(shards, CpReplayStrategy::kRing, p.dims.kv_heads,
                            CpTokenBytes(p), int64_t{8} << 20);
  std::vector<double> t, share;
  RingRow row;
  for (int i = 0; i <= f.repeats; ++i) {
    absl::StatusOr<CpReplayRun> run =
        gpu.ReplayCp(p, schedule, CpReplayOptions{});
    if (!run.ok()) Die(run.status());
    double compute = 0, transport = 0;
    for (double x : run->rank_compute_seconds) compute += x;
    for (double x : run->rank_transport_seconds) transport += x;
    row.steps = run->steps;
    row.rounds = run->rounds;
    if (i == 0) continue;
    t.push_back(run->seconds);
    share.push_back(compute / std::max(1e-12, compute + transport));
  }
  row.world = f.world;
  row.replay_ms = Median(t) * 1e3;
  row.per_step_us = Median(t) / std::max<int64_t>(1, row.steps) * 1e6;
  row.per_round_us = row.per_step_us;  // a step is one round of one chunk
  row.compute_share = Median(share);
  return row;
}

struct DriftRow {
  int64_t elements = 0;
  double gpu_ms = 0;  // wall clock of CudaBackend::ComputeDrift
  double cpu_ms = 0;  // wall clock of the core's, one thread
  bool same = false;  // counts, maxima, worst and p99 equal
};

template <typename Fn>
double WallMs(int repeats, Fn&& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const Clock::time_point start = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start)
                    .count());
  }
  return Median(t);
}

// An out comparison of n elements ([n / 4096, 32, 128]), bf16 output.
DriftRow Drift(CudaBackend& gpu, const Flags& f, int64_t n) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> c(static_cast<size_t>(n)), r(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    r[i] = normal(rng);
    c[i] = r[i] + 1e-3 * normal(rng);
  }
  const std::vector<int64_t> shape = {n / 4096, 1, 32, 128};
  DriftOptions o;
  o.ulp_dtype = DType::kBF16;
  o.tolerance = 3e-3;
  absl::StatusOr<DriftStats> on_gpu, on_cpu;
  DriftRow row;
  row.elements = n;
  row.gpu_ms = WallMs(f.repeats, [&] {
    on_gpu = gpu.ComputeDrift({c.data(), shape}, {r.data(), shape}, o);
  });
  row.cpu_ms = WallMs(f.repeats, [&] {
    on_cpu = ComputeDrift({c.data(), shape}, {r.data(), shape}, o);
  });
  if (!on_gpu.ok()) Die(on_gpu.status());
  if (!on_cpu.ok()) Die(on_cpu.status());
  row.same = on_gpu->count == on_cpu->count &&
             on_gpu->over_tolerance == on_cpu->over_tolerance &&
             on_gpu->max_abs == on_cpu->max_abs &&
             on_gpu->max_ulp == on_cpu->max_ulp &&
             on_gpu->p99_abs == on_cpu->p99_abs &&
             on_gpu->worst.batch == on_cpu->worst.batch &&
             on_gpu->worst.head == on_cpu->worst.head &&
             on_gpu->worst.dim == on_cpu->worst.dim;
  return row;
}

void PrintAndSave(const Flags& f, const CudaBackend& gpu,
                  const std::vector<BandwidthRow>& bw, const AuditRow& audit,
                  const RingRow& ring, const std::vector<DriftRow>& drift) {
  const CudaDeviceInfo& info = gpu.info();
  std::printf(
      "GPU bench: %s (sm %d.%d, %.1f GiB), llama3-8b heads, B=%lld, "
      "page 16, bf16, %d runs (median)\n\n",
      info.name.c_str(), info.compute_major, info.compute_minor,
      info.memory_bytes / 1073741824.0, (long long)f.batch, f.repeats);
  std::printf(
      "| context | KV GiB | D2D copy GB/s (r+w) | P kernel GB/s | "
      "P / copy | P ms | of which merge ms | splits | runs per stage | "
      "kernel | R GB/s | fused R+P GB/s |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string json =
      absl::StrCat("{\"device\": \"", info.name, "\", \"bandwidth\": [");
  for (size_t i = 0; i < bw.size(); ++i) {
    const BandwidthRow& r = bw[i];
    std::printf(
        "| %lld | %.2f | %.0f | %.0f | %.0f %% | %.3f | %.3f | %lld | %lld | "
        "%s | %.0f | %.0f |\n",
        (long long)r.context, r.kv_gib, r.copy_gbs, r.p_gbs,
        100.0 * r.p_gbs / r.copy_gbs, r.p_ms, r.p_merge_ms, (long long)r.splits,
        (long long)r.stage_runs, r.specialized ? "specialised" : "generic",
        r.r_gbs, r.fused_gbs);
    absl::StrAppend(
        &json, i ? ", " : "", "{\"context\": ", r.context,
        ", \"kv_gib\": ", r.kv_gib, ", \"copy_gbs\": ", r.copy_gbs,
        ", \"p_gbs\": ", r.p_gbs, ", \"r_gbs\": ", r.r_gbs,
        ", \"fused_gbs\": ", r.fused_gbs, ", \"p_ms\": ", r.p_ms,
        ", \"p_merge_ms\": ", r.p_merge_ms, ", \"splits\": ", r.splits,
        ", \"stage_runs\": ", r.stage_runs,
        ", \"specialized\": ", r.specialized ? "true" : "false", "}");
  }
  std::printf(
      "\nW1 audit (B=8, 4096, llama3-8b), verdict %s:\n"
      "| backend | total ms | upload ms | kernel ms | download ms | "
      "host stages ms |\n|---|---|---|---|---|---|\n"
      "| %s | %.2f | %.2f | %.3f | %.2f | %.2f |\n"
      "| cpu | %.2f | | | | |\n",
      audit.verdict.c_str(), gpu.name().c_str(), audit.gpu_total_ms,
      audit.upload_ms, audit.kernel_ms, audit.download_ms, audit.host_ms,
      audit.cpu_total_ms);
  std::printf(
      "\nCP ring on the CUDA-local transport, W=%lld (W1, page "
      "interleaved): %lld steps, replay %.2f ms, %.1f us per step "
      "(one round of one chunk), ranks computing %.0f %% of their "
      "time\n",
      (long long)ring.world, (long long)ring.steps, ring.replay_ms,
      ring.per_step_us, 100.0 * ring.compute_share);
  std::printf(
      "\nDrift statistics of one comparison (bf16 out; host arrays in, "
      "statistics out):\n| elements | GPU ms | CPU ms (1 thread) | same "
      "statistics |\n|---|---|---|---|\n");
  std::string drift_json;
  for (const DriftRow& d : drift) {
    std::printf("| %lld | %.3f | %.3f | %s |\n", (long long)d.elements,
                d.gpu_ms, d.cpu_ms, d.same ? "yes" : "NO");
    absl::StrAppend(&drift_json, drift_json.empty() ? "" : ", ",
                    "{\"elements\": ", d.elements, ", \"gpu_ms\": ", d.gpu_ms,
                    ", \"cpu_ms\": ", d.cpu_ms,
                    ", \"same\": ", d.same ? "true" : "false", "}");
  }
  absl::StrAppend(
      &json, "], \"w1_audit\": {\"gpu_total_ms\": ", audit.gpu_total_ms,
      ", \"upload_ms\": ", audit.upload_ms,
      ", \"kernel_ms\": ", audit.kernel_ms,
      ", \"download_ms\": ", audit.download_ms,
      ", \"host_ms\": ", audit.host_ms,
      ", \"cpu_total_ms\": ", audit.cpu_total_ms, ", \"verdict\": \"",
      audit.verdict, "\"}, \"ring\": {\"world\": ", ring.world,
      ", \"steps\": ", ring.steps, ", \"replay_ms\": ", ring.replay_ms,
      ", \"per_step_us\": ", ring.per_step_us,
      ", \"compute_share\": ", ring.compute_share, "}, \"drift\": [",
      drift_json, "]}\n");
  if (!f.json.empty()) std::ofstream(f.json) << json;
}

int Main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  CudaBackendOptions o;
  o.device = f.device;
  o.pool_bytes = static_cast<int64_t>(f.pool_gib * 1073741824.0);
  o.max_splits = f.max_splits;
  o.max_stage_runs = f.max_stage_runs;
  o.specialized_kernels = !f.generic_kernels;
  o.unit_tree_every_level = f.tree_every_level;
  o.host_copy_threads = f.copy_threads;
  absl::StatusOr<std::unique_ptr<CudaBackend>> gpu = CudaBackend::Create(o);
  if (!gpu.ok()) Die(gpu.status());
  std::vector<BandwidthRow> bw;
  for (int64_t context : f.contexts) bw.push_back(Bandwidth(**gpu, f, context));
  if (f.bandwidth_only) {
    for (const BandwidthRow& r : bw) {
      std::printf(
          "context %lld: P %.0f GB/s, %.3f ms (merge %.3f, %lld "
          "splits, %lld runs per stage, %s kernel), R %.0f GB/s, fused %.0f "
          "GB/s, copy %.0f GB/s\n",
          (long long)r.context, r.p_gbs, r.p_ms, r.p_merge_ms,
          (long long)r.splits, (long long)r.stage_runs,
          r.specialized ? "specialised" : "generic", r.r_gbs, r.fused_gbs,
          r.copy_gbs);
    }
    return 0;
  }
  const AuditRow audit = W1Audit(**gpu, f);
  const RingRow ring = Ring(**gpu, f);
  std::vector<DriftRow> drift;
  for (int64_t n : {int64_t{8} * 4096, int64_t{1} << 20, int64_t{1} << 24}) {
    drift.push_back(Drift(**gpu, f, n));
  }
  PrintAndSave(f, **gpu, bw, audit, ring, drift);
  return 0;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
