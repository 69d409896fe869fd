// The CP benchmark (docs/PERF.md, "Context-parallel replay"): on the W1
// shape (llama3-8b, B=8, context 4096, page 16, bf16) synthesized with a
// sharded engine of --world ranks, measures in one run
//   - the single-rank audit (the same snapshot without its CP section),
//   - the audit with each CP strategy (single-rank pass + CP stage),
//   - each strategy's replay alone (RunCpReplay), and for the ring its cost
//     per round (replay / W) with the ranks' compute and transport shares.
// Usage: attnaudit_bench_cp [--threads N] [--repeats N] [--world W]
//        [--sharding page|interleave|owners] [--interleave I] [--context L]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "core/attention/attention.h"
#include "core/audit/audit.h"
#include "core/common/parallel.h"
#include "core/cp/replay/replay.h"
#include "core/cp/schedule/schedule.h"
#include "core/sim/simulator.h"
#include "core/validate/validate.h"

namespace attnaudit::bench {
namespace {

using Clock = std::chrono::steady_clock;

void Die(const absl::Status& st) {
  std::fprintf(stderr, "bench: %s\n", st.ToString().c_str());
  std::exit(1);
}

struct Flags {
  int threads = 0;
  int repeats = 5;
  int64_t world = 4;
  std::string sharding = "page";
  int64_t interleave = 1;
  int64_t context = 4096;
  int64_t batch = 8;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  CLI::App app("CP replay benchmark on the W1 shape", "attnaudit_bench_cp");
  app.add_option("--threads", f.threads, "threads (0: all cores)");
  app.add_option("--repeats", f.repeats, "runs per measurement (median)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--world", f.world, "CP ranks")->check(CLI::Range(2, 64));
  app.add_option("--sharding", f.sharding, "page, interleave or owners")
      ->check(CLI::IsMember({"page", "interleave", "owners"}));
  app.add_option("--interleave", f.interleave, "interleave size")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--context", f.context, "KV length of row 0")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--batch", f.batch, "rows")->check(CLI::Range(1, 4096));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return f;
}

template <typename Fn>
double Median(int repeats, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const Clock::time_point s = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - s).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double Sum(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0);
}

struct AuditTime {
  double total = 0;
  double cp = 0;  // the CP stage of the last run
  std::string execution;
};

AuditTime TimeAudit(const Snapshot& s, CpStrategy strategy, const Flags& f,
                    int threads) {
  AuditOptions o;
  o.threads = threads;
  o.cp_strategy = strategy;
  o.include_merge_orders = false;
  AuditTime t;
  t.total = Median(f.repeats, [&] {
    absl::StatusOr<AuditReport> r = AuditSnapshot(s, o);
    if (!r.ok()) Die(r.status());
    t.cp = r->provenance.timings.cp_seconds;
    t.execution = r->cp.execution;
  });
  return t;
}

struct ReplayTime {
  double seconds = 0;
  double compute = 0;    // all ranks, last run
  double transport = 0;  // all ranks, last run
  int64_t steps = 0;
  std::string execution;
};

ReplayTime TimeReplay(const PreparedAttention& p, CpReplayStrategy strategy,
                      int64_t world, const Flags& f, int threads) {
  const CpShards shards = PlanShards(p.units, world, p.dims.page_size);
  const CpSchedule schedule(shards, strategy, p.dims.kv_heads, CpTokenBytes(p),
                            int64_t{8} << 20);
  CpReplayOptions o;
  o.threads = threads;
  ReplayTime t;
  t.seconds = Median(f.repeats, [&] {
    absl::StatusOr<CpReplayRun> run = RunCpReplay(p, schedule, o);
    if (!run.ok()) Die(run.status());
    t.compute = Sum(run->rank_compute_seconds);
    t.transport = Sum(run->rank_transport_seconds);
    t.steps = run->steps;
    t.execution = CpExecutionName(run->execution);
  });
  return t;
}

int Main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  const int threads = ResolveThreads(f.threads);
  SynthOptions so;
  so.preset = "llama3-8b";
  so.batch = f.batch;
  so.context = f.context;
  so.permute_pages = true;
  so.seed = 1;
  so.threads = threads;
  so.cp_world_size = f.world;
  so.cp_sharding = f.sharding == "owners"       ? CpSharding::kExplicitOwners
                   : f.sharding == "interleave" ? CpSharding::kTokenInterleaved
                                                : CpSharding::kPageInterleaved;
  so.cp_interleave = f.interleave;
  absl::StatusOr<Snapshot> cp = Synthesize(so);
  if (!cp.ok()) Die(cp.status());
  Snapshot single = *cp;  // the same call without its CP section
  single.cp = CpConfig();

  const AuditTime base = TimeAudit(single, CpStrategy::kAuto, f, threads);
  const AuditTime partials = TimeAudit(*cp, CpStrategy::kPartials, f, threads);
  const AuditTime ring = TimeAudit(*cp, CpStrategy::kRing, f, threads);

  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(*cp);
  if (!layout.ok()) Die(layout.status());
  absl::StatusOr<PreparedAttention> prepared =
      PrepareAttention(*cp, *layout, threads);
  if (!prepared.ok()) Die(prepared.status());
  const ReplayTime rp =
      TimeReplay(*prepared, CpReplayStrategy::kPartials, f.world, f, threads);
  const ReplayTime rr =
      TimeReplay(*prepared, CpReplayStrategy::kRing, f.world, f, threads);

  std::printf(
      "CP bench: llama3-8b B=%lld context=%lld page 16 bf16, W=%lld "
      "%s sharding, threads %d, median of %d\n",
      (long long)f.batch, (long long)f.context, (long long)f.world,
      f.sharding.c_str(), threads, f.repeats);
  std::printf(
      "| measurement | seconds | vs single-rank audit |\n|---|---|---|\n");
  std::printf("| single-rank audit | %.3f | 1.00x |\n", base.total);
  std::printf("| audit + CP partials (stage %.3f s) | %.3f | %.2fx |\n",
              partials.cp, partials.total, partials.total / base.total);
  std::printf("| audit + CP ring (stage %.3f s) | %.3f | %.2fx |\n", ring.cp,
              ring.total, ring.total / base.total);
  std::printf("| partials replay alone (%s, %lld steps) | %.3f | %.2fx |\n",
              rp.execution.c_str(), (long long)rp.steps, rp.seconds,
              rp.seconds / base.total);
  std::printf("| ring replay alone (%s, %lld steps) | %.3f | %.2fx |\n",
              rr.execution.c_str(), (long long)rr.steps, rr.seconds,
              rr.seconds / base.total);
  std::printf(
      "ring: %.1f ms per round (W=%lld rounds), %.2f ms per step; ranks' "
      "time %.0f%% compute, %.0f%% transport (fills, copies, waits)\n",
      rr.seconds / f.world * 1e3, (long long)f.world,
      rr.seconds / std::max<int64_t>(1, rr.steps) * 1e3,
      100 * rr.compute / (rr.compute + rr.transport),
      100 * rr.transport / (rr.compute + rr.transport));
  std::printf(
      "partials: ranks' time %.0f%% compute, %.0f%% transport (fills)\n",
      100 * rp.compute / (rp.compute + rp.transport),
      100 * rp.transport / (rp.compute + rp.transport));
  return 0;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
