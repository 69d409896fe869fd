// The diagnosis at realistic attention (realistic.h).
#include "bench/diagnosis_eval/realistic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/audit/audit.h"
#include "core/tensor/dtype.h"
#include "sim/simulator.h"

namespace attnaudit::bench {
namespace {

// SplitMix64: the same seed draws the same snapshots everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t Int(int64_t lo, int64_t hi) {  // [lo, hi]
    return lo +
           static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1p-53; }

 private:
  uint64_t s_;
};

// What a right diagnosis names besides the hypothesis.
enum class Where {
  kNothing,  // the hypothesis alone (a global bug, the CP combine)
  kBlock,    // row, logical block and page (a swap: either order)
  kRank,     // the CP rank the fault hit
  kRowRank,  // row and CP rank (a rank's local page)
};

struct Bug {
  const char* label;
  Fault fault;
  CpFault cp;
  const char* hypothesis;
  Where where;
  bool fp8;
  bool also_without_lse;  // a second audit with the engine's LSE removed
};

const std::vector<Bug>& Bugs() {
  static const std::vector<Bug> bugs = {
      {"stale-page", Fault::kStalePage, CpFault::kNone, "stale-page",
       Where::kBlock, false, true},
      {"drop-block", Fault::kDropBlock, CpFault::kNone, "drop-block",
       Where::kBlock, false, true},
      {"duplicate-page", Fault::kDuplicatePage, CpFault::kNone,
       "duplicate-page", Where::kBlock, false, true},
      {"swapped-pages", Fault::kSwappedPages, CpFault::kNone, "swapped-pages",
       Where::kBlock, false, true},
      {"fp8-scale (K with v_scale)", Fault::kFp8Scale, CpFault::kNone,
       "fp8-scale", Where::kNothing, true, false},
      {"fp8-k-scale-missing", Fault::kFp8KScaleMissing, CpFault::kNone,
       "fp8-scale", Where::kNothing, true, false},
      {"fp8-scale-missing", Fault::kFp8ScaleMissing, CpFault::kNone,
       "fp8-scale", Where::kNothing, true, false},
      {"fp8-scale-twice", Fault::kFp8ScaleTwice, CpFault::kNone, "fp8-scale",
       Where::kNothing, true, false},
      {"wrong-scale", Fault::kWrongScale, CpFault::kNone, "wrong-scale",
       Where::kNothing, false, false},
      {"wrong-scale, fp8 KV", Fault::kWrongScale, CpFault::kNone, "wrong-scale",
       Where::kNothing, true, false},
      {"CP interleave: stale-page", Fault::kStalePage, CpFault::kNone,
       "stale-page", Where::kBlock, false, false},
      {"CP interleave: stale-rank-page", Fault::kNone, CpFault::kStaleRankPage,
       "stale-page", Where::kRowRank, false, false},
      {"CP interleave: drop-shard", Fault::kNone, CpFault::kDropShard,
       "cp-missing-shard", Where::kRank, false, false},
      {"CP interleave: lse-base2-rank", Fault::kNone, CpFault::kLseBase2Rank,
       "cp-lse-base", Where::kRank, false, false},
      {"CP interleave: bf16-combine", Fault::kNone, CpFault::kBf16Combine,
       "cp-bf16-combine", Where::kNothing, false, false},
  };
  return bugs;
}

bool IsCp(const Bug& bug) { return absl::StartsWith(bug.label, "CP "); }

// A snapshot of the shapes users run: llama3-8b or qwen3-8b heads (32 / 8,
// D 128), batch 4-8, log-uniform context, pages of 16, a sink carrying
// 30-90 % of every head's weight and logits shifted by up to 40.
SynthOptions RealisticOptions(Rng& rng, const RealisticFlags& f,
                              const Bug& bug) {
  SynthOptions o;
  o.preset = rng.Int(0, 1) ? "llama3-8b" : "qwen3-8b";
  o.batch = rng.Int(4, 8);
  int64_t hi = f.max_context;
  if (IsCp(bug)) {
    // Token interleaving makes every token a unit: the per-unit states of
    // the CP checks and the diagnosis grow with the context.
    o.batch = 4;
    hi = std::min<int64_t>(hi, 4096);
  }
  const int64_t lo = std::min(f.min_context, hi);
  o.context = static_cast<int64_t>(
      std::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * rng.Uniform()));
  o.page_size = 16;
  o.split_tokens = rng.Int(0, 1) ? 256 : 512;
  o.permute_pages = true;
  o.kv_dtype = bug.fp8 ? DType::kF8E4M3 : DType::kBF16;
  o.dequant_to_bf16 = bug.fp8 && rng.Int(0, 1) == 1;
  o.engine_p_dtype = rng.Int(0, 1) ? DType::kBF16 : DType::kF32;
  o.sink_share_min = 0.3;
  o.sink_share_max = 0.9;
  o.logit_offset = 40.0 * rng.Uniform();
  o.vocab = 64;
  o.seed = rng.Next();
  o.threads = f.threads;
  o.fault = bug.fault;
  o.cp_fault = bug.cp;
  if (IsCp(bug)) {
    o.cp_world_size = rng.Int(2, 4);
    o.cp_sharding = CpSharding::kTokenInterleaved;
    const int64_t sizes[] = {1, 8, 16};
    o.cp_interleave = sizes[rng.Int(0, 2)];
  }
  // One-place faults: the heaviest block (the sink's), one of the next
  // three, or a block anywhere in the row, of a random row.
  o.fault_row = rng.Int(0, o.batch - 1);
  const int64_t pick = rng.Int(0, 3);
  if (pick == 0) o.fault_block_rank = 0;
  if (pick == 1) o.fault_block_rank = rng.Int(1, 3);
  if (pick >= 2) {
    const int64_t len = std::max<int64_t>(o.context - 7 * o.fault_row, 1);
    o.fault_block = rng.Int(0, (len + o.page_size - 1) / o.page_size - 1);
  }
  return o;
}

bool IsPageHypothesis(const std::string& h) {
  for (const char* name :
       {"stale-page", "drop-block", "duplicate-page", "swapped-pages",
        "foreign-page", "seq-len-off-by-one"}) {
    if (h == name) return true;
  }
  return false;
}

// Whether d names the place the bug hit: the row, block and page (a page
// hypothesis), the rank (and row), or for a bug without a place its
// hypothesis.
bool PlaceRight(const Diagnosis& d, const Bug& bug, const SynthDetails& site) {
  const DiagnosisLocation& l = d.location;
  switch (bug.where) {
    case Where::kNothing:
      return d.hypothesis == bug.hypothesis;
    case Where::kRank:
      return l.cp_rank == site.cp_fault_rank;
    case Where::kRowRank:
      return l.row == site.fault_row && l.cp_rank == site.cp_fault_rank;
    case Where::kBlock:
      break;
  }
  if (!IsPageHypothesis(d.hypothesis) || l.row != site.fault_row) return false;
  // A swap's place is either of its blocks, and an account naming two
  // blocks (a swap) is at the place when either is.
  std::vector<int64_t> hit{site.fault_block};
  if (bug.fault == Fault::kSwappedPages) hit.push_back(site.fault_other_block);
  const int64_t other =
      d.hypothesis == "swapped-pages" ? l.other_logical_block : -1;
  for (int64_t b : {l.logical_block, other}) {
    if (b >= 0 && std::find(hit.begin(), hit.end(), b) != hit.end()) {
      return true;
    }
  }
  return false;
}

bool Right(const Diagnosis& d, const Bug& bug, const SynthDetails& site) {
  return d.hypothesis == bug.hypothesis && PlaceRight(d, bug, site);
}

// The top diagnosis is right: the bug at its place, or an account that
// explains E equally at the bug's place while the bug's own hypothesis,
// also listed there, explains too (a page whose content takes no weight
// reads the same skipped, stale or replaced by another page).
bool TopRight(const std::vector<Diagnosis>& list, const Bug& bug,
              const SynthDetails& site) {
  if (list.empty()) return false;
  const Diagnosis& top = list[0];
  if (Right(top, bug, site)) return true;
  if (!top.explains || !PlaceRight(top, bug, site)) return false;
  for (const Diagnosis& d : list) {
    if (d.explains && Right(d, bug, site)) return true;
  }
  return false;
}

struct Stats {
  int64_t n = 0, reach = 0, detected = 0, right = 0, place = 0;
  int64_t unexplained = 0, wrong = 0, wrong_explains = 0;
  int64_t any_wrong_explains = 0, below_drift = 0;
  int64_t quiet_lse = 0, quiet_lse_right = 0;
  double diagnosis_seconds = 0;
};

// max |a - b| over two tensors of the same shape (0 when either is absent).
double MaxDiff(const Tensor& a, const Tensor& b) {
  if (!a.present() || !b.present()) return 0;
  double m = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    const double d = std::fabs(a.DoubleAt(i) - b.DoubleAt(i));
    m = std::max(m, std::isfinite(d) ? d : 1e300);
  }
  return m;
}

std::string DriftingRanks(const AuditReport& r) {
  std::vector<int64_t> ranks;
  for (const CpRankCheck& c : r.cp.ranks) {
    if (c.check.verdict == Verdict::kDrift) ranks.push_back(c.rank);
  }
  return absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
}

void Print(const std::string& label, const SynthOptions& o,
           const SynthDetails& site, const AuditReport& r, bool right,
           bool dump) {
  const std::string top =
      r.diagnoses.empty() ? "(none)" : r.diagnoses[0].hypothesis;
  std::printf(
      "%s: %s B=%lld L=%lld offset=%.1f seed=%llu: %s %s [%s] ranks "
      "drifting %s\n",
      label.c_str(), o.preset.c_str(), static_cast<long long>(o.batch),
      static_cast<long long>(o.context), o.logit_offset,
      static_cast<unsigned long long>(o.seed), right ? "right" : "MISS",
      top.c_str(), site.fault.c_str(), DriftingRanks(r).c_str());
  if (!dump) return;
  for (const Diagnosis& d : r.diagnoses) {
    std::printf(
        "    %s %.3f explains=%d row=%lld block=%lld page=%lld "
        "rank=%lld: %s\n",
        d.hypothesis.c_str(), d.score, d.explains,
        static_cast<long long>(d.location.row),
        static_cast<long long>(d.location.logical_block),
        static_cast<long long>(d.location.page),
        static_cast<long long>(d.location.cp_rank), d.summary.c_str());
  }
}

// One audit of `faulty` (its effect measured against `clean`) into *s.
void Observe(const RealisticFlags& f, const std::string& label, const Bug& bug,
             const SynthOptions& o, const SynthDetails& site,
             const Snapshot& clean, const Snapshot& faulty, Stats* s) {
  AuditOptions a;
  a.threads = f.threads;
  a.include_merge_orders = false;
  // Accuracy, not speed: a shared or slow machine must not cut the search
  // short (the seconds it took are reported).
  a.diagnosis_max_seconds = 300;
  absl::StatusOr<AuditReport> r = RunAudit(faulty, a);
  if (!r.ok()) {
    std::fprintf(stderr, "%s: audit: %s\n", label.c_str(),
                 r.status().ToString().c_str());
    return;
  }
  ++s->n;
  const ComparisonResult* er = r->Find(Comparison::kEngineVsReference);
  if (er == nullptr) return;
  const bool with_lse = faulty.engine.lse.present();
  const bool reach =
      MaxDiff(clean.engine.out, faulty.engine.out) >= er->out.tolerance ||
      (with_lse &&
       MaxDiff(clean.engine.lse, faulty.engine.lse) >= er->lse.tolerance);
  // Confidently wrong: an entry that claims to explain E at the wrong place
  // (or, for a bug without a place, with the wrong hypothesis), counted
  // over every DRIFT, the effect at the tolerance or below it.
  bool any = false;
  for (const Diagnosis& d : r->diagnoses) {
    any |= d.explains && !PlaceRight(d, bug, site);
  }
  s->any_wrong_explains += any;
  if (!reach) {
    const bool drift = r->verdict == Verdict::kDrift;
    s->below_drift += drift;
    if (drift && (f.verbose || any)) {
      Print(label + " (below the tolerance)", o, site, *r, !any, f.dump && any);
    }
    return;
  }
  ++s->reach;
  // Out's evidence alone: the engine's LSE within its tolerance.
  const bool quiet_lse =
      with_lse &&
      MaxDiff(clean.engine.lse, faulty.engine.lse) < er->lse.tolerance;
  if (r->verdict != Verdict::kDrift) {
    std::printf("%s: seed=%llu reaches the tolerance but %s\n", label.c_str(),
                static_cast<unsigned long long>(o.seed),
                std::string(VerdictName(r->verdict)).c_str());
    return;
  }
  ++s->detected;
  s->diagnosis_seconds += r->provenance.timings.diagnosis_seconds;
  const bool right = TopRight(r->diagnoses, bug, site);
  const bool place =
      !r->diagnoses.empty() && PlaceRight(r->diagnoses[0], bug, site);
  const bool unexplained =
      r->diagnoses.empty() || r->diagnoses[0].hypothesis == "unexplained";
  s->right += right;
  s->quiet_lse += quiet_lse;
  s->quiet_lse_right += quiet_lse && right;
  s->place += place;
  s->unexplained += unexplained;
  if (!right && !unexplained) {
    ++s->wrong;
    s->wrong_explains += r->diagnoses[0].explains && !place;
  }
  if (f.verbose || !right) Print(label, o, site, *r, right, f.dump && !right);
}

// Each bug draws from its own stream (the seed and its row of Bugs()), so
// that --bugs selects snapshots without changing them.
void RunBug(const RealisticFlags& f, const Bug& bug, size_t index,
            std::map<std::string, Stats>* stats) {
  Rng rng(f.seed * 104729 + 7919 * index + 3);
  for (int i = 0; i < f.seeds; ++i) {
    // A draw the fault cannot show on (synth refuses) is redrawn.
    for (int attempt = 0; attempt < 10; ++attempt) {
      const SynthOptions o = RealisticOptions(rng, f, bug);
      SynthDetails site;
      absl::StatusOr<Snapshot> faulty = Synthesize(o, &site);
      if (!faulty.ok()) continue;
      SynthOptions c = o;
      AdjustForFault(&c);
      c.fault = Fault::kNone;
      c.cp_fault = CpFault::kNone;
      absl::StatusOr<Snapshot> clean = Synthesize(c);
      if (!clean.ok()) continue;
      Observe(f, bug.label, bug, o, site, *clean, *faulty,
              &(*stats)[bug.label]);
      if (bug.also_without_lse) {
        faulty->engine.lse = Tensor();
        const std::string label = absl::StrCat(bug.label, ", no LSE");
        Observe(f, label, bug, o, site, *clean, *faulty, &(*stats)[label]);
      }
      break;
    }
  }
}

std::string Rate(int64_t k, int64_t n) {
  return n > 0 ? absl::StrFormat(
                     "%lld (%.0f%%)", static_cast<long long>(k),
                     100.0 * static_cast<double>(k) / static_cast<double>(n))
               : "-";
}

}  // namespace

int RunRealistic(const RealisticFlags& f) {
  std::map<std::string, Stats> stats;
  std::vector<std::string> order;
  for (size_t i = 0; i < Bugs().size(); ++i) {
    const Bug& bug = Bugs()[i];
    if (std::string(bug.label).find(f.bugs) == std::string::npos) continue;
    order.push_back(bug.label);
    if (bug.also_without_lse) {
      order.push_back(absl::StrCat(bug.label, ", no LSE"));
    }
    RunBug(f, bug, i, &stats);
  }
  std::printf(
      "\n## Diagnosis at realistic attention (%d snapshots per bug, seed "
      "%llu)\n\n| bug | snapshots | effect reaches tolerance | detected | "
      "right | right place | unexplained | wrong | top explains at a wrong "
      "place | DRIFT below the tolerance | an entry explains at a wrong "
      "place (any DRIFT) | LSE within its tolerance: right | diagnosis s "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      f.seeds, static_cast<unsigned long long>(f.seed));
  int64_t confident = 0;
  for (const std::string& label : order) {
    const Stats& s = stats[label];
    std::printf(
        "| %s | %lld | %lld | %lld | %s | %s | %s | %s | %lld | %lld | %lld "
        "| %lld of %lld | %.2f |\n",
        label.c_str(), static_cast<long long>(s.n),
        static_cast<long long>(s.reach), static_cast<long long>(s.detected),
        Rate(s.right, s.detected).c_str(), Rate(s.place, s.detected).c_str(),
        Rate(s.unexplained, s.detected).c_str(),
        Rate(s.wrong, s.detected).c_str(),
        static_cast<long long>(s.wrong_explains),
        static_cast<long long>(s.below_drift),
        static_cast<long long>(s.any_wrong_explains),
        static_cast<long long>(s.quiet_lse_right),
        static_cast<long long>(s.quiet_lse),
        s.detected ? s.diagnosis_seconds / s.detected : 0.0);
    confident += s.any_wrong_explains;
  }
  return confident > 0 ? 1 : 0;
}

}  // namespace attnaudit::bench
