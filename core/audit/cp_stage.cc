#include "core/audit/cp_stage.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/attention/merge.h"
#include "core/common/parallel.h"
#include "core/common/status_macros.h"
#include "core/cp/replay/combine.h"
#include "core/cp/replay/replay.h"
#include "core/cp/schedule/schedule.h"
#include "core/drift/drift.h"

namespace attnaudit {
namespace audit_internal {
namespace {

using Clock = std::chrono::steady_clock;

// A ring step's message holds one chunk of every row of a pass; rows are
// grouped so that one message stays within this (the slots are 2 x W of
// them).
constexpr int64_t kMessageBudget = int64_t{8} << 20;
// The ring's slots, all ranks together.
constexpr int64_t kMaxRingBuffers = int64_t{1} << 30;
// Rank-steps (steps x W) of one replay: the ring's grow with W^2, and a
// hostile world size must not turn one audit into hours of empty steps.
constexpr int64_t kMaxRankSteps = int64_t{1} << 26;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double MaxAbsFinite(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

int64_t SaturatingMul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  const int64_t max = std::numeric_limits<int64_t>::max();
  return a > max / b ? max : a * b;
}

struct Candidate {
  const std::vector<double>* out = nullptr;
  const std::vector<double>* lse = nullptr;
};

// candidate vs baseline over out and lse with these tolerances.
absl::StatusOr<CpCheck> Check(Backend& backend, const SnapshotDims& d,
                              DType out_dtype, const Candidate& cand,
                              const Candidate& base, const Tolerances& tol) {
  const std::vector<int64_t> out_shape{d.batch, d.queries, d.q_heads,
                                       d.head_dim};
  const std::vector<int64_t> lse_shape{d.batch, d.queries, d.q_heads};
  ComparisonResult r;
  if (cand.out != nullptr && base.out != nullptr) {
    DriftOptions o;
    o.ulp_dtype = out_dtype;
    o.tolerance = tol.out_abs;
    ATTNAUDIT_ASSIGN_OR_RETURN(
        r.out, backend.ComputeDrift({cand.out->data(), out_shape},
                                    {base.out->data(), out_shape}, o));
    r.has_out = true;
  }
  if (cand.lse != nullptr && base.lse != nullptr) {
    DriftOptions o;
    o.ulp_dtype = DType::kF32;
    o.tolerance = tol.lse_abs;
    ATTNAUDIT_ASSIGN_OR_RETURN(
        r.lse, backend.ComputeDrift({cand.lse->data(), lse_shape},
                                    {base.lse->data(), lse_shape}, o));
    r.has_lse = true;
  }
  DecideComparison(&r);
  CpCheck c;
  c.verdict = r.verdict;
  c.has_out = r.has_out;
  c.out = r.out;
  c.has_lse = r.has_lse;
  c.lse = r.lse;
  c.reasons = std::move(r.reasons);
  return c;
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

void FillShape(const Snapshot& s, const PreparedAttention& p, CpReport* cp) {
  cp->present = true;
  cp->world_size = s.cp.world_size;
  cp->sharding = s.cp.sharding;
  cp->interleave_size = s.cp.sharding == CpSharding::kTokenInterleaved
                            ? std::max<int64_t>(1, s.cp.interleave_size)
                            : 1;
  cp->shard_tokens.assign(
      static_cast<size_t>(p.dims.batch),
      std::vector<int64_t>(static_cast<size_t>(s.cp.world_size), 0));
  for (int64_t b = 0; b < p.dims.batch; ++b) {
    for (const KvUnit& u : p.units[b]) {
      cp->shard_tokens[b][static_cast<size_t>(u.rank)] += u.count;
    }
  }
}

// One rank's engine partial (cp.rank_out[k], cp.rank_lse[k] in natural
// log) against the reference partial. Where the rank holds no key a query
// sees, only the lse is compared: it must be -inf, and the merge ignores
// the out of such a partial.
absl::StatusOr<CpRankCheck> CheckRank(const CpStageInputs& in,
                                      const CpShards& shards, int64_t k) {
  const PreparedAttention& p = in.prepared;
  const SnapshotDims& d = p.dims;
  const Tensor& rank_out = in.snapshot.cp.rank_out;
  const Tensor& rank_lse = in.snapshot.cp.rank_lse;
  const CpRankPartial ref =
      ReferenceRankPartial(p, shards, *in.single_states, k, in.threads);
  const int64_t queries = d.batch * d.queries * d.q_heads;
  std::vector<double> out(static_cast<size_t>(queries * d.head_dim));
  std::vector<double> lse(static_cast<size_t>(queries));
  ConvertToDouble(static_cast<const char*>(rank_out.raw()) +
                      k * queries * d.head_dim * DTypeSize(rank_out.dtype()),
                  rank_out.dtype(), queries * d.head_dim, out.data());
  ConvertToDouble(static_cast<const char*>(rank_lse.raw()) +
                      k * queries * DTypeSize(rank_lse.dtype()),
                  rank_lse.dtype(), queries, lse.data());
  for (int64_t q = 0; q < queries; ++q) {
    if (in.snapshot.engine.lse_base == LseBase::k2)
      lse[q] = LseFromBase2(lse[q]);
    if (ref.lse[q] == kNegInf) {
      std::copy(&ref.out[q * d.head_dim], &ref.out[(q + 1) * d.head_dim],
                &out[q * d.head_dim]);
    }
  }
  // The partial comes out of the same kernel as the whole call, whose
  // accumulation depth it shares (its tiles and splits run over the whole
  // row): the call's depth, or the rank's units when more; the magnitudes
  // are the partial's own.
  ToleranceInputs ti = in.tolerance_inputs;
  ti.comparison = Comparison::kEngineVsReference;
  ti.output_dtype = rank_out.dtype();
  ti.max_merged_blocks = std::max(ti.max_merged_blocks, ref.max_units);
  ti.max_context = std::max(ti.max_context, ref.max_tokens);
  ti.cp_world_size = 1;  // a partial has not been through the combine
  ti.max_abs_out_reference = MaxAbsFinite(ref.out);
  ti.max_abs_lse_reference = MaxAbsFinite(ref.lse);
  CpRankCheck r;
  r.rank = k;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      r.check, Check(in.backend, d, rank_out.dtype(), {&out, &lse},
                     {&ref.out, &ref.lse}, ComputeTolerances(ti, {})));
  for (int64_t b = 0; b < d.batch; ++b) r.tokens += shards.tokens[b][k];
  r.empty_queries = ref.empty_queries;
  return r;
}

// The engine's combine step alone: its final out/lse against our merge of
// its own partials.
absl::StatusOr<CpCheck> CheckCombine(const CpStageInputs& in) {
  const PreparedAttention& p = in.prepared;
  const CpCombined merged =
      MergeEnginePartials(p, in.snapshot.cp.rank_out, in.snapshot.cp.rank_lse,
                          in.snapshot.engine.lse_base, in.threads);
  CombineToleranceInputs ci;
  ci.output_dtype = p.output_dtype;
  ci.world = in.snapshot.cp.world_size;
  ci.max_abs_out = MaxAbsFinite(merged.out);
  ci.max_abs_lse = MaxAbsFinite(merged.lse);
  return Check(in.backend, p.dims, p.output_dtype,
               {in.engine_out, in.engine_lse}, {&merged.out, &merged.lse},
               ComputeCombineTolerances(ci));
}

// Our replay's two combines against R, and the deterministic one against P.
absl::Status CheckReplay(const CpStageInputs& in, const CpSchedule& schedule,
                         const CpReplayRun& run, CpReport* cp) {
  const PreparedAttention& p = in.prepared;
  ToleranceInputs ti = in.tolerance_inputs;
  ti.comparison = Comparison::kReplayVsReference;
  const Tolerances tol = ComputeTolerances(ti, {});
  const Candidate reference{&in.reference_out, &in.reference_lse};
  const CpCombined det = CombineDeterministic(p, run.states, in.threads);
  cp->deterministic_matches_replay =
      SameBits(det.out, in.replay_out) && SameBits(det.lse, in.replay_lse);
  ATTNAUDIT_ASSIGN_OR_RETURN(cp->deterministic,
                             Check(in.backend, p.dims, p.output_dtype,
                                   {&det.out, &det.lse}, reference, tol));
  // The engine's order merges the W rank partials on top of the fold.
  ti.max_merged_blocks += schedule.world();
  const CpCombined eng =
      CombineEngineOrder(p, schedule, run.states, in.threads);
  ATTNAUDIT_ASSIGN_OR_RETURN(
      cp->engine_order,
      Check(in.backend, p.dims, p.output_dtype, {&eng.out, &eng.lse}, reference,
            ComputeTolerances(ti, {})));
  return absl::OkStatus();
}

absl::Status CheckEngine(const CpStageInputs& in, const CpShards& shards,
                         CpReport* cp) {
  const Snapshot& s = in.snapshot;
  if (!s.cp.rank_out.present() || in.single_states == nullptr) {
    return absl::OkStatus();
  }
  for (int64_t k = 0; k < s.cp.world_size; ++k) {
    ATTNAUDIT_ASSIGN_OR_RETURN(CpRankCheck r, CheckRank(in, shards, k));
    cp->ranks.push_back(std::move(r));
  }
  if (in.engine_out != nullptr || in.engine_lse != nullptr) {
    ATTNAUDIT_ASSIGN_OR_RETURN(cp->combine, CheckCombine(in));
    cp->has_combine = true;
  }
  return absl::OkStatus();
}

}  // namespace

bool CpNeedsReferenceStates(const Snapshot& snapshot) {
  return snapshot.cp.world_size > 1 && snapshot.cp.rank_out.present() &&
         snapshot.cp.rank_lse.present();
}

int64_t CpStateBytes(const PreparedAttention& p, bool with_reference) {
  int64_t units = 0;
  for (const auto& row : p.units) units += static_cast<int64_t>(row.size());
  const int64_t per_state = (p.dims.head_dim + 1) * (with_reference ? 16 : 4);
  return SaturatingMul(SaturatingMul(units, p.dims.queries * p.dims.q_heads),
                       per_state);
}

absl::Status RunCpStage(const CpStageInputs& in, AuditReport* report) {
  const Clock::time_point start = Clock::now();
  CpReport& cp = report->cp;
  FillShape(in.snapshot, in.prepared, &cp);
  const bool chosen = in.options.cp_strategy == CpStrategy::kAuto;
  // Auto: partials, the design of the decode engines that shard their KV
  // (every rank attends its shard, the partials are merged), so the
  // engine-order combine is theirs.
  const CpReplayStrategy strategy = in.options.cp_strategy == CpStrategy::kRing
                                        ? CpReplayStrategy::kRing
                                        : CpReplayStrategy::kPartials;
  cp.strategy = CpReplayStrategyName(strategy);
  cp.strategy_chosen = chosen;
  cp.skipped = in.skipped;
  if (!cp.skipped.empty()) return absl::OkStatus();
  const PreparedAttention& p = in.prepared;
  const CpShards shards =
      PlanShards(p.units, in.snapshot.cp.world_size, p.dims.page_size);
  const CpSchedule schedule(shards, strategy, p.dims.kv_heads, CpTokenBytes(p),
                            kMessageBudget);
  if (SaturatingMul(schedule.steps(), schedule.world()) > kMaxRankSteps) {
    cp.skipped = absl::StrCat(
        "cp.world_size: the ", cp.strategy, " replay ", "would run ",
        schedule.steps(), " steps on each of ", schedule.world(),
        " ranks, over the limit of ", kMaxRankSteps, " rank-steps");
    return absl::OkStatus();
  }
  CpReplayOptions ro;
  ro.threads = in.threads;
  ro.workers = in.options.cp_workers;
  ro.max_buffer_bytes = kMaxRingBuffers;
  ro.cancelled = in.options.cancelled;
  absl::StatusOr<CpReplayRun> run = in.backend.ReplayCp(p, schedule, ro);
  if (run.status().code() == absl::StatusCode::kResourceExhausted) {
    cp.skipped = std::string(run.status().message());
    return absl::OkStatus();
  }
  if (!run.ok()) return run.status();
  cp.rounds = run->rounds;
  cp.steps = run->steps;
  cp.workers = ro.workers > 0 ? ro.workers : ResolveThreads(in.threads);
  cp.execution = CpExecutionName(run->execution);
  ATTNAUDIT_RETURN_IF_ERROR(CheckReplay(in, schedule, *run, &cp));
  ATTNAUDIT_RETURN_IF_ERROR(CheckEngine(in, shards, &cp));
  StageTimings& t = report->provenance.timings;
  t.cp_rank_compute_seconds = run->rank_compute_seconds;
  t.cp_rank_transport_seconds = run->rank_transport_seconds;
  t.cp_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return absl::OkStatus();
}

Verdict WithCpVerdict(const CpReport& cp, Verdict verdict) {
  if (!cp.present || verdict == Verdict::kInvalid) return verdict;
  bool drift = cp.engine_order.verdict == Verdict::kDrift ||
               cp.deterministic.verdict == Verdict::kDrift ||
               (cp.has_combine && cp.combine.verdict == Verdict::kDrift);
  for (const CpRankCheck& r : cp.ranks) {
    drift = drift || r.check.verdict == Verdict::kDrift;
  }
  return drift ? Verdict::kDrift : verdict;
}

}  // namespace audit_internal
}  // namespace attnaudit
