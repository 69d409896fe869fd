// W1 benchmark: times R, P, the fused pass, the in-memory audit and the whole
// `attnaudit check` (file read + parse + audit) on the W1 snapshot
// (llama3-8b, B=8, context 4096, page 16, bf16, permuted pages), next to the
// machine floor measured in the same run:
//   floor = max(KV bytes / read bandwidth,
//               R flops / fp64 FMA peak + P flops / fp32 FMA peak).
// Usage: attnaudit_bench_check [--threads N] [--repeats N] [--context L]
//        [--batch B] [--preset NAME] [--markdown]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/common/machine_floor.h"
#include "client/cli/args.h"
#include "client/cli/commands.h"
#include "core/attention/attention.h"
#include "core/audit/audit.h"
#include "core/common/parallel.h"
#include "core/sim/simulator.h"
#include "core/validate/validate.h"
#include "proto/codec/codec.h"

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

int Main(int argc, char** argv) {
  cli::Args args({"threads", "repeats", "context", "batch", "preset", "file"},
                 {"markdown"});
  if (absl::Status st = args.Parse(cli::Argv(argv + 1, argv + argc));
      !st.ok()) {
    Die(st);
  }
  const int threads =
      ResolveThreads(static_cast<int>(*args.GetInt("threads", 0)));
  const int repeats = static_cast<int>(*args.GetInt("repeats", 5));
  SynthOptions so;
  so.preset = args.Get("preset", "llama3-8b");
  so.batch = *args.GetInt("batch", 8);
  so.context = *args.GetInt("context", 4096);
  so.permute_pages = true;
  so.seed = 1;
  absl::StatusOr<Snapshot> synth = Synthesize(so);
  if (!synth.ok()) Die(synth.status());
  const std::string path = args.Get("file", "/tmp/attnaudit_bench_w1.pb");
  if (absl::Status st = WriteSnapshotFile(path, *synth); !st.ok()) Die(st);
  const Snapshot& snap = *synth;

  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(snap);
  if (!layout.ok()) Die(layout.status());
  const SnapshotDims& d = layout->dims;
  absl::StatusOr<PreparedAttention> prepared =
      PrepareAttention(snap, *layout, threads);
  if (!prepared.ok()) Die(prepared.status());

  // Work: visible keys per query (decode: all cached keys of the row).
  int64_t active_tokens = 0;
  for (int64_t len : layout->seq_lens) active_tokens += len;
  const double kv_bytes = static_cast<double>(active_tokens) * d.kv_heads *
                          d.head_dim * 2 * DTypeSize(snap.k_pages.dtype());
  AttentionRunOptions warm_up;
  warm_up.threads = threads;
  absl::StatusOr<AttentionResults> once = ComputeAttention(*prepared, warm_up);
  if (!once.ok()) Die(once.status());
  // Sum of visible keys over all queries, times heads: 4 flops per (key, dim).
  double visible_pairs = 0;
  for (int64_t b = 0; b < d.batch; ++b) {
    visible_pairs += static_cast<double>(layout->seq_lens[b]) * d.queries;
  }
  const double flops = 4.0 * d.head_dim * d.q_heads * visible_pairs;

  const MachineFloor floor = MeasureMachineFloor(threads);
  const double floor_memory = kv_bytes / floor.read_bytes_per_second;
  const double floor_compute =
      flops / floor.fp64_flops_per_second + flops / floor.fp32_flops_per_second;
  const double machine_floor = std::max(floor_memory, floor_compute);

  auto run_passes = [&](AttentionPasses passes) {
    AttentionRunOptions o;
    o.threads = threads;
    o.record_merge_orders = false;
    o.passes = passes;
    absl::StatusOr<AttentionResults> r = ComputeAttention(*prepared, o);
    if (!r.ok()) Die(r.status());
  };
  AuditOptions audit_options;
  audit_options.threads = threads;
  const Timing t_validate = Measure(repeats, [&] {
    if (!ValidateSnapshot(snap).ok()) Die(absl::InternalError("validate"));
  });
  const Timing t_ref =
      Measure(repeats, [&] { run_passes(AttentionPasses::kReferenceOnly); });
  const Timing t_rep =
      Measure(repeats, [&] { run_passes(AttentionPasses::kReplayOnly); });
  const Timing t_both =
      Measure(repeats, [&] { run_passes(AttentionPasses::kBoth); });
  Verdict verdict = Verdict::kUnspecified;
  const Timing t_audit = Measure(repeats, [&] {
    absl::StatusOr<AuditReport> r = RunAudit(snap, audit_options);
    if (!r.ok()) Die(r.status());
    verdict = r->verdict;
  });
  const Timing t_check = Measure(repeats, [&] {
    absl::StatusOr<Snapshot> s = ReadSnapshotFile(path);
    if (!s.ok()) Die(s.status());
    absl::StatusOr<AuditReport> r = RunAudit(*s, audit_options);
    if (!r.ok()) Die(r.status());
  });
  const Timing t_read = Measure(repeats, [&] {
    absl::StatusOr<Snapshot> s = ReadSnapshotFile(path);
    if (!s.ok()) Die(s.status());
  });

  std::printf(
      "W1: preset=%s B=%lld Sq=%lld Hq=%lld Hkv=%lld D=%lld page=%lld "
      "context=%lld kv=%s, verdict %s, threads %d\n",
      so.preset.c_str(), (long long)d.batch, (long long)d.queries,
      (long long)d.q_heads, (long long)d.kv_heads, (long long)d.head_dim,
      (long long)d.page_size, (long long)so.context,
      std::string(DTypeName(snap.k_pages.dtype())).c_str(),
      std::string(VerdictName(verdict)).c_str(), threads);
  std::printf(
      "machine: read %.2f GB/s, fp64 %.1f GFLOP/s, fp32 %.1f GFLOP/s (%s, %d "
      "FMA chains per thread)\n",
      floor.read_bytes_per_second / 1e9, floor.fp64_flops_per_second / 1e9,
      floor.fp32_flops_per_second / 1e9, floor.fma_isa.c_str(),
      floor.fma_chains);
  std::printf("work: KV %.1f MiB, %.3f GFLOP per pass (R fp64 + P fp32)\n",
              kv_bytes / 1048576.0, flops / 1e9);
  std::printf("floor: memory %.2f ms, compute %.2f ms -> %.2f ms\n",
              floor_memory * 1e3, floor_compute * 1e3, machine_floor * 1e3);
  auto row = [&](const char* name, const Timing& t) {
    std::printf("  %-34s min %8.2f ms  median %8.2f ms  %5.2fx floor\n", name,
                t.min * 1e3, t.median * 1e3, t.median / machine_floor);
  };
  row("validate", t_validate);
  row("R (fp64 reference) alone", t_ref);
  row("P (fp32 replay) alone", t_rep);
  row("R + P fused pass", t_both);
  row("audit in memory (R+P+drift)", t_audit);
  row("read + parse file", t_read);
  row("whole check (read+audit)", t_check);
  if (args.Has("markdown")) {
    std::printf(
        "\n| stage | median ms | min ms | x floor |\n|---|---|---|---|\n");
    auto md = [&](const char* name, const Timing& t) {
      std::printf("| %s | %.2f | %.2f | %.2f |\n", name, t.median * 1e3,
                  t.min * 1e3, t.median / machine_floor);
    };
    md("validate", t_validate);
    md("R alone", t_ref);
    md("P alone", t_rep);
    md("R+P fused", t_both);
    md("audit (R+P+drift)", t_audit);
    md("read+parse", t_read);
    md("whole check", t_check);
  }
  std::remove(path.c_str());
  return 0;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
