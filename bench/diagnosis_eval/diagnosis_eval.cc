// The evaluation of the statistical detector and the diagnosis
// (docs/PERF.md, "Diagnosis"): over random snapshots of every preset and
// every simulator fault at random places, and over clean engines of every
// kind (fp32 P, bf16 P, fp8 KV with bf16 dequantisation, split sizes 16 to
// 512), it prints the detection rate, a confusion matrix of the top
// diagnosis, top-1 accuracy, localisation accuracy and the false-alarm
// rate; --w1 times the diagnosis against the plain audit on W1;
// --realistic N runs N snapshots per page, scale and CP bug at realistic
// attention (realistic.h).
//
// Usage: attnaudit_bench_diagnosis [--clean N] [--faulty N] [--w1]
//        [--realistic N [--bugs SUBSTR] [--min-context L] [--max-context L]]
//        [--seed S] [--threads T] [--repeats R] [--verbose]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/diagnosis_eval/realistic.h"
#include "core/audit/audit.h"
#include "core/diagnosis/diagnosis.h"
#include "core/tensor/dtype.h"
#include "sim/fault_registry.h"
#include "sim/simulator.h"

namespace attnaudit::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int clean = 2000;
  int faulty = 200;  // per fault class
  bool w1 = false;
  uint64_t seed = 1;
  int threads = 1;
  int repeats = 5;
  bool verbose = false;
  bool calibrate = false;
  bool small = false;  // cut heads (CutHeads) for speed
  std::string kinds;   // substring filter on engine kind names
  std::string faults;  // substring filter on fault names
  bool dump = false;   // print every diagnosis of a wrong top-1
  std::string replay;  // --case: one snapshot's options (printed by --dump)
  RealisticFlags realistic;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  CLI::App app("detector and diagnosis evaluation",
               "attnaudit_bench_diagnosis");
  app.add_option("--clean", f.clean, "clean snapshots across engine kinds");
  app.add_option("--faulty", f.faulty, "faulty snapshots per fault class");
  app.add_flag("--w1", f.w1, "time the diagnosis on W1 against the audit");
  app.add_option("--seed", f.seed, "first seed");
  app.add_option("--threads", f.threads, "threads per audit");
  app.add_option("--repeats", f.repeats, "W1 timing runs (median)");
  app.add_flag("--verbose", f.verbose, "one line per snapshot");
  app.add_flag("--calibrate", f.calibrate,
               "one line of detector statistics per clean audit");
  app.add_option("--kinds", f.kinds, "only engine kinds containing this");
  app.add_flag("--small", f.small, "at most 8 query heads (faster)");
  app.add_option("--faults", f.faults, "only faults containing this");
  app.add_flag("--dump", f.dump, "all diagnoses of a wrong top-1");
  app.add_option("--case", f.replay, "run only this snapshot (see --dump)");
  app.add_option("--realistic", f.realistic.seeds,
                 "snapshots per bug at realistic attention");
  app.add_option("--bugs", f.realistic.bugs,
                 "--realistic: only bugs whose label contains this");
  app.add_option("--min-context", f.realistic.min_context,
                 "--realistic: shortest context");
  app.add_option("--max-context", f.realistic.max_context,
                 "--realistic: longest context");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return f;
}

// SplitMix64, so that the same seed draws the same snapshots everywhere.
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
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(Next() % v.size())];
  }

 private:
  uint64_t s_;
};

// The engine kinds a correct engine can be (docs/SIMULATOR.md).
struct EngineKind {
  const char* name;
  DType kv;
  DType p;
  bool dequant_bf16;
};
const std::vector<EngineKind>& Kinds() {
  static const std::vector<EngineKind> kinds = {
      {"bf16 KV, fp32 P", DType::kBF16, DType::kF32, false},
      {"bf16 KV, bf16 P", DType::kBF16, DType::kBF16, false},
      {"fp8 KV, bf16 dequant, bf16 P", DType::kF8E4M3, DType::kBF16, true},
      {"fp8 KV, fp32 P", DType::kF8E4M3, DType::kF32, false},
      {"f16 KV, f16 P", DType::kF16, DType::kF16, false},
      {"f32 KV, fp32 P", DType::kF32, DType::kF32, false},
  };
  return kinds;
}

// At most 8 query heads and 2 KV heads, keeping the head dim and the GQA
// group where it fits (small, fast snapshots).
void CutHeads(SynthOptions* o) {
  const ModelPreset preset = FindPreset(o->preset).value();
  o->kv_heads = std::min<int64_t>(2, preset.kv_heads);
  const int64_t group = preset.q_heads / preset.kv_heads;
  o->q_heads = o->kv_heads * std::min<int64_t>(group, 8 / o->kv_heads);
}

// A random snapshot of a random preset: the preset's heads, or with
// `small` cut by CutHeads.
SynthOptions RandomOptions(Rng& rng, const EngineKind& kind, bool small) {
  SynthOptions o;
  o.preset = rng.Pick(PresetNames());
  const ModelPreset preset = FindPreset(o.preset).value();
  if (small) CutHeads(&o);
  o.batch = rng.Int(1, small ? 3 : 2);
  // Log-uniform context in [32, 4096].
  o.context = static_cast<int64_t>(std::exp(
      std::log(32.0) + (std::log(4096.0) - std::log(32.0)) *
                           static_cast<double>(rng.Int(0, 1000)) / 1000.0));
  o.queries = rng.Int(0, 3) == 0 ? rng.Int(2, 4) : 1;
  o.context = std::max(o.context, o.queries + 8 * (o.batch - 1));
  o.page_size = rng.Pick(std::vector<int64_t>{16, 16, 16, 32, 8});
  o.split_tokens = rng.Pick(std::vector<int64_t>{16, 32, 64, 128, 256, 512});
  o.permute_pages = rng.Int(0, 1) == 1;
  o.layer = rng.Int(0, 1);
  o.kv_dtype = kind.kv;
  o.engine_p_dtype = kind.p;
  o.dequant_to_bf16 = kind.dequant_bf16;
  o.vocab = 64;
  o.seed = rng.Next();
  o.threads = 1;
  return o;
}

AuditOptions Audit(int threads) {
  AuditOptions a;
  a.threads = threads;
  a.include_merge_orders = false;
  return a;
}

// --- Clean engines: false alarms and the detector's margin. ---

struct CleanStats {
  int64_t n = 0, drift = 0, statistical = 0;
  double worst_ratio = 0;  // largest rms^2 / limit^2 of any group
  double worst_mean = 0;   // largest |mean| / limit
  double sum_ms = 0;       // global mean z^2, summed
};

void ObserveClean(const AuditReport& r, CleanStats* s) {
  ++s->n;
  if (r.verdict != Verdict::kPass) ++s->drift;
  for (const ComparisonResult& c : r.comparisons) {
    if (!c.has_statistical) continue;
    if (c.statistical.fired_groups > 0) ++s->statistical;
    for (const StatisticalGroup& g : c.statistical.worst) {
      s->worst_ratio =
          std::max(s->worst_ratio, g.rms * g.rms / (g.rms_limit * g.rms_limit));
      s->worst_mean = std::max({s->worst_mean, std::fabs(g.mean) / g.mean_limit,
                                std::fabs(g.bias) / g.mean_limit});
      if (g.scope == "all" && c.comparison == Comparison::kEngineVsReference) {
        s->sum_ms += g.rms * g.rms;
      }
    }
  }
}

// One line per clean audit for fitting the noise model: the E-R groups'
// statistics and what they depend on.
void PrintCalibration(const EngineKind& kind, const SynthOptions& o,
                      const AuditReport& r) {
  const ComparisonResult* c = r.Find(Comparison::kEngineVsReference);
  if (c == nullptr || !c->has_statistical) return;
  double lse = 0;
  std::printf("cal\t%s\t%s\tL=%lld\tsplit=%lld\tblocks=%lld\teps=%.3g",
              kind.name, o.preset.c_str(), static_cast<long long>(o.context),
              static_cast<long long>(o.split_tokens),
              static_cast<long long>(r.provenance.max_merged_blocks),
              c->statistical.noise_epsilon);
  (void)lse;
  for (const StatisticalGroup& g : c->statistical.worst) {
    std::printf("\t%s:n=%lld,rms2=%.3f(lim %.3f),mean=%.3f,bias=%.3f(lim %.3f)",
                g.scope.c_str(), static_cast<long long>(g.count), g.rms * g.rms,
                g.rms_limit * g.rms_limit, g.mean, g.bias, g.mean_limit);
  }
  std::printf("\n");
}

int RunClean(const Flags& f) {
  std::map<std::string, CleanStats> by_kind;
  Rng rng(f.seed);
  int64_t made = 0;
  for (int i = 0; i < f.clean; ++i) {
    const EngineKind& kind = Kinds()[static_cast<size_t>(i) % Kinds().size()];
    const SynthOptions o = RandomOptions(rng, kind, f.small);
    if (std::string(kind.name).find(f.kinds) == std::string::npos) continue;
    absl::StatusOr<Snapshot> s = Synthesize(o);
    if (!s.ok()) {
      std::fprintf(stderr, "synth: %s\n", s.status().ToString().c_str());
      continue;
    }
    absl::StatusOr<AuditReport> r = RunAudit(*s, Audit(f.threads));
    if (!r.ok()) {
      std::fprintf(stderr, "audit: %s\n", r.status().ToString().c_str());
      continue;
    }
    ++made;
    ObserveClean(*r, &by_kind[kind.name]);
    if (f.calibrate) PrintCalibration(kind, o, *r);
    if (f.verbose || r->verdict != Verdict::kPass) {
      std::string reasons;
      for (const ComparisonResult& c : r->comparisons) {
        for (const std::string& x : c.reasons) {
          reasons +=
              absl::StrCat(" [", ComparisonShortName(c.comparison), "] ", x);
        }
      }
      std::printf("clean %s %s B=%lld L=%lld split=%lld: %s%s\n", kind.name,
                  o.preset.c_str(), static_cast<long long>(o.batch),
                  static_cast<long long>(o.context),
                  static_cast<long long>(o.split_tokens),
                  std::string(VerdictName(r->verdict)).c_str(),
                  reasons.c_str());
    }
  }
  std::printf("\n## Clean engines (%lld snapshots)\n\n",
              static_cast<long long>(made));
  std::printf(
      "| engine kind | audits | false alarms | statistical | mean z^2 (E-R) | "
      "worst rms^2/limit | worst |mean|/limit "
      "|\n|---|---|---|---|---|---|---|\n");
  CleanStats total;
  for (const auto& [name, s] : by_kind) {
    std::printf("| %s | %lld | %lld | %lld | %.3f | %.2f | %.2f |\n",
                name.c_str(), static_cast<long long>(s.n),
                static_cast<long long>(s.drift),
                static_cast<long long>(s.statistical),
                s.n ? s.sum_ms / s.n : 0.0, s.worst_ratio, s.worst_mean);
    total.n += s.n;
    total.drift += s.drift;
    total.statistical += s.statistical;
  }
  std::printf("\nfalse alarms: %lld of %lld clean audits\n",
              static_cast<long long>(total.drift),
              static_cast<long long>(total.n));
  return total.drift == 0 ? 0 : 1;
}

// --- Faulty snapshots: detection, top-1 and localisation. ---

// Options a fault can show with (the preset, the cache dtype, the place).
// Every fault is listed, so a new one fails -Wswitch here until what it
// needs is stated.
void FitFault(const FaultInfo& info, Rng& rng, bool small, SynthOptions* o) {
  const Fault fault = info.fault;
  o->fault = fault;
  if (info.is_cp()) {
    // A sharded engine of 2 to 4 ranks, any sharding; the fault's rank is
    // picked by the simulator from the seed among those it can show on.
    o->cp_fault = info.cp_fault;
    o->cp_world_size = rng.Int(2, 4);
    o->cp_sharding = rng.Pick(std::vector<CpSharding>{
        CpSharding::kPageInterleaved, CpSharding::kTokenInterleaved,
        CpSharding::kExplicitOwners});
    o->cp_interleave = rng.Pick(std::vector<int64_t>{1, 8, o->page_size});
  }
  o->kv_dtype = DType::kBF16;
  o->engine_p_dtype = rng.Int(0, 1) ? DType::kBF16 : DType::kF32;
  o->dequant_to_bf16 = false;
  if (info.needs_fp8_cache) {
    o->kv_dtype = DType::kF8E4M3;
    o->dequant_to_bf16 = rng.Int(0, 1) == 1;
  }
  switch (fault) {
    case Fault::kSoftcapMissing:
      o->preset = "gemma2-9b";
      break;
    case Fault::kSinksMissing:
      o->preset = "gpt-oss-20b";
      break;
    case Fault::kWindowOffByOne:
      o->preset = "gpt-oss-20b";
      o->layer = 0;
      o->context = std::max<int64_t>(o->context, 160);
      break;
    case Fault::kGqaMapping:
      if (o->preset == "glm4-9b" && small) o->preset = "llama3-8b";
      break;
    case Fault::kRopeOffset:
      o->fault_magnitude = rng.Int(1, 4) * (rng.Int(0, 1) ? 1 : -1);
      break;
    case Fault::kBf16RunningOut:
      // Visible with many splits: a long row, short splits, no window.
      o->context = std::max<int64_t>(o->context, 1024);
      o->split_tokens = rng.Pick(std::vector<int64_t>{16, 32, 64});
      o->layer = 1;
      break;
    case Fault::kNone:
    case Fault::kStalePage:
    case Fault::kSwappedPages:
    case Fault::kKRopeTwice:
    case Fault::kLseBase2:
    case Fault::kWrongScale:
    case Fault::kDropBlock:
    case Fault::kFp8Scale:
    case Fault::kKRopeMissing:
    case Fault::kRopeStyle:
    case Fault::kFp8ScaleTwice:
    case Fault::kFp8ScaleMissing:
    case Fault::kFp8KScaleMissing:
    case Fault::kDuplicatePage:
      break;
  }
  o->q_heads = o->kv_heads = 0;
  if (small) CutHeads(o);
  o->fault_row = rng.Int(0, o->batch - 1);
  o->fault_block = -1;
  o->fault_block_rank = 0;
  if (info.site == FaultSite::kOnePlace && fault != Fault::kSwappedPages &&
      rng.Int(0, 1)) {
    // Half of the one-place faults hit a random block, not the heaviest.
    const int64_t len = std::max<int64_t>(o->context - 7 * o->fault_row, 1);
    o->fault_block = rng.Int(0, (len + o->page_size - 1) / o->page_size - 1);
  }
}

// Whether the fault moved the engine's result beyond its own rounding
// (docs/PERF.md states the criterion): some out element by 4 ULPs or more,
// the out elements by 0.5 ULP rms or more, or some LSE beyond 1e-5
// relative (~80 fp32 ULPs). Below that the fault hides in the rounding.
bool Visible(const Snapshot& clean, const Snapshot& faulty) {
  const Tensor& a = clean.engine.out;
  const Tensor& b = faulty.engine.out;
  double sum = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    const double u = static_cast<double>(
        UlpDistance(a.DoubleAt(i), b.DoubleAt(i), a.dtype()));
    if (u >= 4) return true;
    sum += u * u;
  }
  if (sum >= 0.25 * static_cast<double>(a.num_elements())) return true;
  for (int64_t i = 0; i < clean.engine.lse.num_elements(); ++i) {
    const double x = clean.engine.lse.DoubleAt(i),
                 y = faulty.engine.lse.DoubleAt(i);
    if (std::fabs(x - y) > 1e-5 * std::max(1.0, std::fabs(x))) return true;
  }
  return false;
}

struct ClassStats {
  int64_t n = 0, visible = 0, detected = 0, detected_all = 0, top1 = 0;
  int64_t placed = 0, located = 0;
  double diagnosis_seconds = 0, audit_seconds = 0;
  std::map<std::string, int64_t> confusion;  // top-1 hypothesis -> count
};

bool Located(const Diagnosis& d, const SynthDetails& site) {
  const DiagnosisLocation& l = d.location;
  if (l.row != site.fault_row) return false;
  if (l.logical_block == site.fault_block && l.page == site.fault_page)
    return true;
  // A swap names either of its two blocks first.
  return l.logical_block == site.fault_other_block &&
         l.other_logical_block == site.fault_block;
}

// The options of one snapshot as a --case string, and back.
std::string CaseString(const SynthOptions& o) {
  return absl::StrFormat("%s,%d,%d,%d,%d,%d,%d,%d,%u,%s,%s,%s,%d,%d,%d,%d,%d",
                         o.preset, o.batch, o.context, o.queries, o.page_size,
                         o.split_tokens, o.permute_pages, o.layer, o.seed,
                         DTypeName(o.kv_dtype), DTypeName(o.engine_p_dtype),
                         FaultName(o.fault), o.fault_row, o.fault_block,
                         o.fault_magnitude, o.q_heads, o.kv_heads) +
         (o.dequant_to_bf16 ? ",dq" : ",-") +
         (o.cp_world_size > 1
              ? absl::StrFormat(
                    ",%s,%d,%d,%d", CpFaultName(o.cp_fault), o.cp_world_size,
                    static_cast<int>(o.cp_sharding), o.cp_interleave)
              : "");
}

SynthOptions ParseCase(const std::string& text) {
  std::vector<std::string> f;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    f.push_back(text.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  SynthOptions o;
  if (f.size() < 17) return o;
  o.preset = f[0];
  o.batch = std::stoll(f[1]);
  o.context = std::stoll(f[2]);
  o.queries = std::stoll(f[3]);
  o.page_size = std::stoll(f[4]);
  o.split_tokens = std::stoll(f[5]);
  o.permute_pages = f[6] == "1";
  o.layer = std::stoll(f[7]);
  o.seed = std::stoull(f[8]);
  o.kv_dtype = DTypeFromName(f[9]);
  o.engine_p_dtype = DTypeFromName(f[10]);
  o.fault = ParseFault(f[11]).value_or(Fault::kNone);
  o.fault_row = std::stoll(f[12]);
  o.fault_block = std::stoll(f[13]);
  o.fault_magnitude = std::stoll(f[14]);
  o.q_heads = std::stoll(f[15]);
  o.kv_heads = std::stoll(f[16]);
  o.dequant_to_bf16 = f.size() > 17 && f[17] == "dq";
  if (f.size() >= 22) {
    o.cp_fault = ParseCpFault(f[18]).value_or(CpFault::kNone);
    o.cp_world_size = std::stoll(f[19]);
    o.cp_sharding = static_cast<CpSharding>(std::stoi(f[20]));
    o.cp_interleave = std::stoll(f[21]);
  }
  o.vocab = 64;
  o.threads = 1;
  return o;
}

void RunOneFaulty(const Flags& f, const FaultInfo& info, Rng& rng,
                  ClassStats* s) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    SynthOptions o = RandomOptions(rng, Kinds()[0], f.small);
    FitFault(info, rng, f.small, &o);
    if (!f.replay.empty()) o = ParseCase(f.replay);
    SynthDetails site;
    absl::StatusOr<Snapshot> faulty = Synthesize(o, &site);
    if (!faulty.ok()) continue;
    SynthOptions clean_options = o;
    AdjustForFault(&clean_options);
    clean_options.fault = Fault::kNone;
    clean_options.cp_fault = CpFault::kNone;
    absl::StatusOr<Snapshot> clean = Synthesize(clean_options);
    if (!clean.ok()) continue;
    absl::StatusOr<AuditReport> r = RunAudit(*faulty, Audit(f.threads));
    if (!r.ok()) continue;
    ++s->n;
    const bool visible = Visible(*clean, *faulty);
    const bool detected = r->verdict == Verdict::kDrift;
    s->visible += visible;
    s->detected_all += detected;
    if (!visible || !detected) {
      if (visible || f.verbose) {
        std::printf("%s %s: visible=%d detected=%d (%s)\n", info.name,
                    o.preset.c_str(), visible, detected, site.fault.c_str());
        if (f.dump) {
          std::printf("    --case %s\n", CaseString(o).c_str());
          for (const ComparisonResult& c : r->comparisons) {
            for (const StatisticalGroup& g : c.statistical.worst) {
              std::printf(
                  "    %s %s n=%lld rms %.3f (limit %.3f) mean %.3f "
                  "bias %.3f (limit %.3f)\n",
                  std::string(ComparisonShortName(c.comparison)).c_str(),
                  g.scope.c_str(), static_cast<long long>(g.count), g.rms,
                  g.rms_limit, g.mean, g.bias, g.mean_limit);
            }
          }
        }
      }
      return;
    }
    ++s->detected;
    s->audit_seconds += r->provenance.timings.total_seconds -
                        r->provenance.timings.diagnosis_seconds;
    s->diagnosis_seconds += r->provenance.timings.diagnosis_seconds;
    const std::string top =
        r->diagnoses.empty() ? "(none)" : r->diagnoses[0].hypothesis;
    ++s->confusion[top];
    const bool right = info.hypothesis != nullptr && top == info.hypothesis;
    s->top1 += right;
    bool located = true;
    if (info.site == FaultSite::kOnePlace) {
      ++s->placed;
      located = right && Located(r->diagnoses[0], site);
      if (located) ++s->located;
    }
    if (f.verbose || !right || !located) {
      std::printf(
          "%s %s B=%lld L=%lld Sq=%lld P=%lld: top %s%s [%s]\n", info.name,
          o.preset.c_str(), static_cast<long long>(o.batch),
          static_cast<long long>(o.context), static_cast<long long>(o.queries),
          static_cast<long long>(o.page_size), top.c_str(),
          r->diagnoses.empty() ? "" : (": " + r->diagnoses[0].summary).c_str(),
          site.fault.c_str());
      if (f.dump) {
        std::printf("    --case %s\n", CaseString(o).c_str());
        for (const Diagnosis& d : r->diagnoses) {
          std::printf("    %s %.3f explains=%d row=%lld block=%lld: %s\n",
                      d.hypothesis.c_str(), d.score, d.explains,
                      static_cast<long long>(d.location.row),
                      static_cast<long long>(d.location.logical_block),
                      d.summary.c_str());
        }
      }
    }
    return;
  }
}

int RunFaulty(const Flags& f) {
  // Every fault class, each expected to get its registry row's hypothesis;
  // the CP faults on a sharded engine, except those that leave the final
  // output right (no hypothesis: only a CP check sees them).
  std::vector<const FaultInfo*> faults;
  for (const FaultInfo& info : FaultRegistry()) {
    if (info.hypothesis != nullptr &&
        std::string(info.name).find(f.faults) != std::string::npos) {
      faults.push_back(&info);
    }
  }
  Rng rng(f.seed * 7919 + 17);
  std::map<std::string, ClassStats> stats;
  for (const FaultInfo* info : faults) {
    ClassStats& s = stats[info->name];
    for (int i = 0; i < f.faulty; ++i) RunOneFaulty(f, *info, rng, &s);
  }
  std::printf("\n## Faulty snapshots (%d per class)\n\n", f.faulty);
  std::printf(
      "| fault | snapshots | visible | detected (of visible) | top-1 | "
      "located | diagnosis / audit |\n|---|---|---|---|---|---|---|\n");
  int64_t det = 0, vis = 0, top = 0, placed = 0, located = 0;
  for (const auto& [name, s] : stats) {
    std::printf(
        "| %s | %lld | %lld | %lld (%.1f%%) | %.1f%% | %s | %.2f |\n",
        name.c_str(), static_cast<long long>(s.n),
        static_cast<long long>(s.visible), static_cast<long long>(s.detected),
        s.visible ? 100.0 * s.detected / s.visible : 100.0,
        s.detected ? 100.0 * s.top1 / s.detected : 0.0,
        s.placed
            ? absl::StrFormat("%.1f%%", 100.0 * s.located / s.placed).c_str()
            : "-",
        s.audit_seconds > 0 ? s.diagnosis_seconds / s.audit_seconds : 0.0);
    det += s.detected;
    vis += s.visible;
    top += s.top1;
    placed += s.placed;
    located += s.located;
  }
  std::printf(
      "\n### Confusion matrix (rows: injected fault; columns: top-1 "
      "diagnosis; detected snapshots)\n\n");
  std::vector<std::string> columns;
  for (const auto& [name, s] : stats) {
    for (const auto& [h, n] : s.confusion) {
      if (std::find(columns.begin(), columns.end(), h) == columns.end()) {
        columns.push_back(h);
      }
    }
  }
  std::sort(columns.begin(), columns.end());
  std::printf("| fault \\ top-1 |");
  for (const std::string& c : columns) std::printf(" %s |", c.c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < columns.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (const auto& [name, s] : stats) {
    std::printf("| %s |", name.c_str());
    for (const std::string& c : columns) {
      auto it = s.confusion.find(c);
      std::printf(" %lld |", static_cast<long long>(
                                 it == s.confusion.end() ? 0 : it->second));
    }
    std::printf("\n");
  }
  std::printf(
      "\ndetection %lld of %lld visible (%.2f%%); top-1 %.2f%%; "
      "localisation %.2f%%\n",
      static_cast<long long>(det), static_cast<long long>(vis),
      vis ? 100.0 * det / vis : 100.0, det ? 100.0 * top / det : 0.0,
      placed ? 100.0 * located / placed : 100.0);
  return 0;
}

// --- W1: the diagnosis against the plain audit. ---

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int RunW1(const Flags& f) {
  std::printf(
      "\n## W1: diagnosis cost (llama3-8b, B=8, 4096, page 16, bf16, "
      "threads %d)\n\n| fault | audit ms | diagnosis ms | ratio | top-1 |\n"
      "|---|---|---|---|---|\n",
      f.threads);
  for (Fault fault : {Fault::kStalePage, Fault::kRopeOffset, Fault::kGqaMapping,
                      Fault::kBf16RunningOut, Fault::kLseBase2}) {
    SynthOptions o;
    o.preset = "llama3-8b";
    o.batch = 8;
    o.context = 4096;
    o.permute_pages = true;
    o.fault = fault;
    absl::StatusOr<Snapshot> s = Synthesize(o);
    if (!s.ok()) {
      std::fprintf(stderr, "W1: %s\n", s.status().ToString().c_str());
      return 1;
    }
    AuditOptions plain = Audit(f.threads);
    plain.diagnose = false;
    const AuditOptions full = Audit(f.threads);
    std::vector<double> audit_t, diag_t;
    std::string top;
    for (int i = 0; i < f.repeats; ++i) {
      AuditReport a = RunAudit(*s, plain).value();
      audit_t.push_back(a.provenance.timings.total_seconds);
      AuditReport b = RunAudit(*s, full).value();
      diag_t.push_back(b.provenance.timings.diagnosis_seconds);
      top = b.diagnoses.empty() ? "(none)" : b.diagnoses[0].hypothesis;
    }
    const double am = Median(audit_t), dm = Median(diag_t);
    std::printf("| %s | %.1f | %.1f | %.2f | %s |\n", FaultName(fault).c_str(),
                1e3 * am, 1e3 * dm, dm / am, top.c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  int rc = 0;
  if (f.clean > 0) rc |= RunClean(f);
  if (f.faulty > 0) rc |= RunFaulty(f);
  if (f.w1) rc |= RunW1(f);
  if (f.realistic.seeds > 0) {
    RealisticFlags r = f.realistic;
    r.seed = f.seed;
    r.threads = f.threads;
    r.dump = f.dump;
    r.verbose = f.verbose;
    rc |= RunRealistic(r);
  }
  return rc;
}

}  // namespace
}  // namespace attnaudit::bench

int main(int argc, char** argv) { return attnaudit::bench::Main(argc, argv); }
