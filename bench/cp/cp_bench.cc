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
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/attention/attention.h"
#include "core/audit/audit.h"
#include "core/common/parallel.h"
#include "core/cp/replay/replay.h"
#include "core/cp/schedule/schedule.h"
#include "core/validate/validate.h"
#include "sim/simulator.h"

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

// Seconds of every run of one measurement; runs of the measurements are
// interleaved (one of each per repeat), so a change in the machine's load
// hits them alike.
struct Samples {
  std::vector<double> t;
  double Median() const {
    std::vector<double> v = t;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  double Min() const { return *std::min_element(t.begin(), t.end()); }
};

template <typename Fn>
void Time(Samples* s, Fn&& fn) {
  const Clock::time_point start = Clock::now();
  fn();
  s->t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
}

double Sum(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0);
}

// One audit; returns the report's CP stage seconds.
double Audit(const Snapshot& s, CpStrategy strategy, int threads) {
  AuditOptions o;
  o.threads = threads;
  o.cp_strategy = strategy;
  o.include_merge_orders = false;
  absl::StatusOr<AuditReport> r = AuditSnapshot(s, o);
  if (!r.ok()) Die(r.status());
  return r->provenance.timings.cp_seconds;
}

struct Replay {
  std::unique_ptr<CpShards> shards;
  std::unique_ptr<CpSchedule> schedule;
  double compute = 0;    // all ranks, last run
  double transport = 0;  // all ranks, last run
  int64_t steps = 0;
  std::string execution;
};

Replay MakeReplay(const PreparedAttention& p, CpReplayStrategy strategy,
                  int64_t world) {
  Replay r;
  r.shards =
      std::make_unique<CpShards>(PlanShards(p.units, world, p.dims.page_size));
  r.schedule = std::make_unique<CpSchedule>(
      *r.shards, strategy, p.dims.kv_heads, CpTokenBytes(p), int64_t{8} << 20);
  return r;
}

void RunReplay(const PreparedAttention& p, Replay* r, int threads) {
  CpReplayOptions o;
  o.threads = threads;
  absl::StatusOr<CpReplayRun> run = RunCpReplay(p, *r->schedule, o);
  if (!run.ok()) Die(run.status());
  r->compute = Sum(run->rank_compute_seconds);
  r->transport = Sum(run->rank_transport_seconds);
  r->steps = run->steps;
  r->execution = CpExecutionName(run->execution);
}

// The W1-shaped CP snapshot the flags describe.
Snapshot SynthesizeCp(const Flags& f, int threads) {
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
  return *std::move(cp);
}

int Main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  const int threads = ResolveThreads(f.threads);
  const Snapshot cp_snapshot = SynthesizeCp(f, threads);
  const Snapshot* cp = &cp_snapshot;
  Snapshot single = *cp;  // the same call without its CP section
  single.cp = CpConfig();

  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(*cp);
  if (!layout.ok()) Die(layout.status());
  absl::StatusOr<PreparedAttention> prepared =
      PrepareAttention(*cp, *layout, threads);
  if (!prepared.ok()) Die(prepared.status());
  Replay partials = MakeReplay(*prepared, CpReplayStrategy::kPartials, f.world);
  Replay ring = MakeReplay(*prepared, CpReplayStrategy::kRing, f.world);

  Samples base, audit_partials, audit_ring, stage_partials, stage_ring,
      replay_partials, replay_ring;
  Audit(single, CpStrategy::kAuto, threads);  // warm-up
  for (int i = 0; i < f.repeats; ++i) {
    Time(&base, [&] { Audit(single, CpStrategy::kAuto, threads); });
    Time(&audit_partials, [&] {
      stage_partials.t.push_back(Audit(*cp, CpStrategy::kPartials, threads));
    });
    Time(&audit_ring, [&] {
      stage_ring.t.push_back(Audit(*cp, CpStrategy::kRing, threads));
    });
    Time(&replay_partials, [&] { RunReplay(*prepared, &partials, threads); });
    Time(&replay_ring, [&] { RunReplay(*prepared, &ring, threads); });
  }

  std::printf(
      "CP bench: llama3-8b B=%lld context=%lld page 16 bf16, W=%lld %s "
      "sharding, threads %d, %d interleaved runs\n",
      (long long)f.batch, (long long)f.context, (long long)f.world,
      f.sharding.c_str(), threads, f.repeats);
  const double b = base.Median();
  std::printf(
      "| measurement | median s | min s | median vs single-rank audit |\n"
      "|---|---|---|---|\n");
  auto row = [&](const std::string& what, const Samples& s) {
    std::printf("| %s | %.3f | %.3f | %.2fx |\n", what.c_str(), s.Median(),
                s.Min(), s.Median() / b);
  };
  row("single-rank audit", base);
  row("audit with CP partials", audit_partials);
  row("  of which the CP stage", stage_partials);
  row("audit with CP ring", audit_ring);
  row("  of which the CP stage", stage_ring);
  row("partials replay alone (" + partials.execution + ", " +
          std::to_string(partials.steps) + " steps)",
      replay_partials);
  row("ring replay alone (" + ring.execution + ", " +
          std::to_string(ring.steps) + " steps)",
      replay_ring);
  const double r = replay_ring.Median();
  std::printf(
      "ring: %.1f ms per round (W=%lld rounds), %.2f ms per step; ranks' "
      "time %.0f%% compute, %.0f%% transport (fills, copies, waits)\n",
      r / f.world * 1e3, (long long)f.world,
      r / std::max<int64_t>(1, ring.steps) * 1e3,
      100 * ring.compute / (ring.compute + ring.transport),
      100 * ring.transport / (ring.compute + ring.transport));
  std::printf(
      "partials: ranks' time %.0f%% compute, %.0f%% transport (fills)\n",
      100 * partials.compute / (partials.compute + partials.transport),
      100 * partials.transport / (partials.compute + partials.transport));
  return 0;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
