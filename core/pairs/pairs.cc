#include "core/pairs/pairs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/attention/attention.h"
#include "core/common/status_macros.h"
#include "core/tensor/dtype.h"
#include "core/tensor/dtype_traits.h"
#include "core/validate/validate.h"

namespace attnaudit {
namespace {

using RowKey = std::pair<std::string, int64_t>;  // (request id, position)

// One side, checked: its layout and the key of each row.
struct Side {
  const Snapshot* snapshot = nullptr;
  const char* name = "";  // "rollout" / "trainer"
  ResolvedLayout layout;
  std::vector<RowKey> keys;
};

absl::Status SideError(const Side& side, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(message, " (", side.name, " snapshot)"));
}

// What pairs need beyond a valid snapshot.
absl::Status CheckPairable(const Side& side) {
  const Snapshot& s = *side.snapshot;
  const SnapshotDims& d = side.layout.dims;
  if (d.queries != 1) {
    return SideError(
        side, absl::StrCat("query_positions: shape [", d.batch, ", ", d.queries,
                           "]; pairs compare decode rows (one "
                           "query per row)"));
  }
  if (s.labels.request_ids.empty()) {
    return SideError(side,
                     "labels.request_ids: empty; rows are paired by request "
                     "id");
  }
  if (static_cast<int64_t>(s.labels.request_ids.size()) != d.batch) {
    return SideError(
        side, absl::StrCat("labels.request_ids: ", s.labels.request_ids.size(),
                           " ids for ", d.batch, " rows"));
  }
  if (s.rope.k_state == RopeState::kPreRope) {
    return SideError(side,
                     "rope.k_state: pre-RoPE keys; pairs compare post-RoPE "
                     "snapshots");
  }
  if (IsFp8(s.k_pages.dtype()) || IsFp8(s.v_pages.dtype())) {
    return SideError(side, "k_pages: fp8 pages are not compared");
  }
  if (!s.engine.out.present()) {
    return SideError(side,
                     "engine.out: absent; pairs compare the engines' outputs");
  }
  return absl::OkStatus();
}

absl::StatusOr<Side> CheckSide(const Snapshot& snapshot, const char* name) {
  Side side;
  side.snapshot = &snapshot;
  side.name = name;
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(snapshot);
  if (!layout.ok()) return SideError(side, layout.status().message());
  side.layout = *std::move(layout);
  ATTNAUDIT_RETURN_IF_ERROR(CheckPairable(side));
  for (int64_t b = 0; b < side.layout.dims.batch; ++b) {
    side.keys.emplace_back(snapshot.labels.request_ids[b],
                           snapshot.query_positions.IntAt(b));
  }
  return side;
}

}  // namespace

absl::StatusOr<std::vector<PairRowKey>> PairRowKeys(const Snapshot& snapshot,
                                                    const char* side) {
  ATTNAUDIT_ASSIGN_OR_RETURN(Side checked, CheckSide(snapshot, side));
  return std::move(checked.keys);
}

namespace {

struct Match {
  RowKey key;
  int64_t rollout_row;
  int64_t trainer_row;
};

// The rollout's rows the trainer holds too, in the rollout's order (the
// trainer's last row of a key when it holds it twice).
std::vector<Match> MatchRows(const Side& rollout, const Side& trainer) {
  std::map<RowKey, int64_t> where;
  for (size_t t = 0; t < trainer.keys.size(); ++t) {
    where[trainer.keys[t]] = static_cast<int64_t>(t);
  }
  std::vector<Match> matched;
  for (size_t r = 0; r < rollout.keys.size(); ++r) {
    auto it = where.find(rollout.keys[r]);
    if (it != where.end()) {
      matched.push_back({rollout.keys[r], static_cast<int64_t>(r), it->second});
    }
  }
  return matched;
}

absl::Status CheckSameHeads(const Side& rollout, const Side& trainer) {
  const SnapshotDims& r = rollout.layout.dims;
  const SnapshotDims& t = trainer.layout.dims;
  if (r.q_heads != t.q_heads || r.head_dim != t.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine.out: row shapes [", r.q_heads, ", ", r.head_dim,
                     "] and [", t.q_heads, ", ", t.head_dim,
                     "] differ (the same heads on both sides are needed)"));
  }
  if (rollout.snapshot->rope.q_state != trainer.snapshot->rope.q_state) {
    return absl::InvalidArgumentError(
        "rope.q_state: pre-RoPE queries on one side only; q is compared as "
        "stored, so both sides need the same");
  }
  if (r.kv_heads != t.kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k_pages: ", r.kv_heads, " and ", t.kv_heads,
        " KV heads differ (the same heads on both sides are needed)"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Numbers.

// The dtype ulps are counted in: bf16, f16, f32 or f64 as stored, f32 for
// anything else.
DType UlpDType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
    case DType::kF64:
      return dtype;
    default:
      return DType::kF32;
  }
}

// The spacing of `dtype` at |x| (f32's smallest normal's below it).
double Ulp(double x, DType dtype) {
  const double mag =
      std::max(std::fabs(x), DTypeTraitsOf(DType::kF32).smallest_normal());
  return std::ldexp(
      1.0, std::ilogb(mag) - DTypeTraitsOf(UlpDType(dtype)).mantissa_bits);
}

// max(m, x), NaN sticking once seen (as numpy's max).
void TakeMax(double x, double* m) {
  if (std::isnan(x) || x > *m) *m = x;
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) TakeMax(std::fabs(a[i] - b[i]), &m);
  return m;
}

// The largest |a - b| in ulps of `dtype` at the largest magnitude of either
// (an element near zero would otherwise count its tiny spacing).
double MaxUlps(const std::vector<double>& a, const std::vector<double>& b,
               DType dtype) {
  if (a.empty()) return 0;
  const double diff = MaxAbsDiff(a, b);
  if (diff == 0) return 0;
  double mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    TakeMax(std::fabs(a[i]), &mag);
    TakeMax(std::fabs(b[i]), &mag);
  }
  return diff / Ulp(mag, dtype);
}

// The report's engine-vs-reference output tolerance (0 when none).
double Tolerance(const AuditReport* report) {
  double best = 0;
  if (report == nullptr) return best;
  for (const ComparisonResult& c : report->comparisons) {
    if (c.comparison == Comparison::kEngineVsReference && c.has_out &&
        c.out.tolerance > 0) {
      best = std::max(best, c.out.tolerance);
    }
  }
  return best;
}

std::string TopDiagnosis(const AuditReport* report) {
  if (report == nullptr || report->diagnoses.empty()) return "";
  const Diagnosis& top = report->diagnoses.front();
  // Some summaries name their hypothesis already (core/diagnosis).
  const std::string prefix = absl::StrCat(top.hypothesis, ": ");
  if (absl::StartsWith(top.summary, prefix)) return top.summary;
  return absl::StrCat(prefix, top.summary);
}

// ---------------------------------------------------------------------------
// Tensors of one row.

// Elements [row * count, (row + 1) * count) of `t` as doubles.
std::vector<double> RowValues(const Tensor& t, int64_t row, int64_t count) {
  std::vector<double> out(count);
  ConvertToDouble(
      static_cast<const char*>(t.raw()) + row * count * DTypeSize(t.dtype()),
      t.dtype(), count, out.data());
  return out;
}

// Row b's K or V [n, Hkv, D] in logical order, read through its page table.
std::vector<double> RowKeys(const Side& side, const Tensor& pages, int64_t b) {
  const SnapshotDims& d = side.layout.dims;
  const int64_t n = side.layout.seq_lens[b];
  const std::vector<int32_t>& blocks = side.layout.block_pages[b];
  std::vector<double> out(n * d.kv_heads * d.head_dim);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t page = blocks[j / d.page_size];
    for (int64_t h = 0; h < d.kv_heads; ++h) {
      const int64_t at =
          KvSlotOffset(side.snapshot->kv_layout, d, page, j % d.page_size, h);
      ConvertToDouble(
          static_cast<const char*>(pages.raw()) + at * DTypeSize(pages.dtype()),
          pages.dtype(), d.head_dim, &out[(j * d.kv_heads + h) * d.head_dim]);
    }
  }
  return out;
}

// Keys [lo, hi) of a row's K or V.
std::vector<double> KeyRange(const std::vector<double>& kv, int64_t width,
                             int64_t lo, int64_t hi) {
  return std::vector<double>(kv.begin() + lo * width, kv.begin() + hi * width);
}

// max(K ulps, V ulps) over keys [lo, hi) of both sides.
double KvUlps(const Snapshot& rollout, const std::vector<double>* kv_r,
              const std::vector<double>* kv_t, int64_t width, int64_t lo,
              int64_t hi) {
  if (hi <= lo || lo < 0) return 0;
  const DType dtypes[2] = {rollout.k_pages.dtype(), rollout.v_pages.dtype()};
  double worst = 0;
  for (int i = 0; i < 2; ++i) {
    TakeMax(MaxUlps(KeyRange(kv_r[i], width, lo, hi),
                    KeyRange(kv_t[i], width, lo, hi), dtypes[i]),
            &worst);
  }
  return worst;
}

// ---------------------------------------------------------------------------
// The inputs' effect: core's fp64 reference on each side's q/K/V.

// Whether the trainer's R may use its own snapshot: the same parameters as
// the rollout's, and post-RoPE queries (pre-RoPE ones are rotated with the
// rollout's RoPE on both sides).
bool SameParameters(const Snapshot& a, const Snapshot& b) {
  if (a.rope.q_state == RopeState::kPreRope) return false;
  const auto sinks = [](const Snapshot& s) {
    return s.sinks.present() ? std::string(s.sinks.bytes()) : std::string();
  };
  return EffectiveScale(a) == EffectiveScale(b) &&
         a.logit_softcap == b.logit_softcap &&
         a.sliding_window == b.sliding_window &&
         a.window_convention == b.window_convention &&
         a.sinks.dtype() == b.sinks.dtype() && sinks(a) == sinks(b);
}

// R's out [B, 1, Hq, D] of `snapshot` (valid, post-RoPE).
absl::StatusOr<std::vector<double>> ReferenceOut(const Snapshot& snapshot,
                                                 const ResolvedLayout& layout,
                                                 int threads) {
  ATTNAUDIT_ASSIGN_OR_RETURN(PreparedAttention prepared,
                             PrepareAttention(snapshot, layout, threads));
  AttentionRunOptions options;
  options.threads = threads;
  options.record_merge_orders = false;
  options.passes = AttentionPasses::kReferenceOnly;
  ATTNAUDIT_ASSIGN_OR_RETURN(AttentionResults results,
                             ComputeAttention(prepared, options));
  return std::move(results.reference_out);
}

// R's out of each side, both with the rollout's parameters (scale, soft
// cap, window, sinks): the trainer's inputs are attended as the rollout's
// kernel was asked to attend them.
absl::Status ReferenceOuts(const Side& rollout, const Side& trainer,
                           int threads, std::vector<double>* out_r,
                           std::vector<double>* out_t) {
  ATTNAUDIT_ASSIGN_OR_RETURN(
      *out_r, ReferenceOut(*rollout.snapshot, rollout.layout, threads));
  const Snapshot& r = *rollout.snapshot;
  if (SameParameters(r, *trainer.snapshot)) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        *out_t, ReferenceOut(*trainer.snapshot, trainer.layout, threads));
    return absl::OkStatus();
  }
  Snapshot t = *trainer.snapshot;  // views are shared, owned bytes copied
  t.softmax_scale = EffectiveScale(r);
  t.logit_softcap = r.logit_softcap;
  t.sliding_window = r.sliding_window;
  t.window_convention = r.window_convention;
  t.sinks = r.sinks;
  t.rope = r.rope;
  t.rope_table = r.rope_table;
  ATTNAUDIT_ASSIGN_OR_RETURN(*out_t, ReferenceOut(t, trainer.layout, threads));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// One pair.

struct Judged {
  Verdict rollout = Verdict::kUnspecified;
  Verdict trainer = Verdict::kUnspecified;
  double noise = 0;
};

bool BitwiseEqualRows(const Tensor& a, int64_t ra, const Tensor& b, int64_t rb,
                      int64_t count) {
  if (a.dtype() != b.dtype()) return false;
  const int64_t bytes = count * DTypeSize(a.dtype());
  return std::memcmp(static_cast<const char*>(a.raw()) + ra * bytes,
                     static_cast<const char*>(b.raw()) + rb * bytes,
                     bytes) == 0;
}

RowPair PairRow(const Side& rollout, const Side& trainer, const Match& m,
                const std::vector<double>& ref_r,
                const std::vector<double>& ref_t, const Judged& judged) {
  const Snapshot& sr = *rollout.snapshot;
  const Snapshot& st = *trainer.snapshot;
  const SnapshotDims& d = rollout.layout.dims;
  const int64_t r = m.rollout_row, t = m.trainer_row;
  const int64_t row = d.q_heads * d.head_dim;
  const int64_t width = d.kv_heads * d.head_dim;
  RowPair p;
  p.request_id = m.key.first;
  p.position = m.key.second;
  p.rollout_row = r;
  p.trainer_row = t;
  const std::vector<double> out_r = RowValues(sr.engine.out, r, row);
  const std::vector<double> out_t = RowValues(st.engine.out, t, row);
  p.out_bitwise = BitwiseEqualRows(sr.engine.out, r, st.engine.out, t, row);
  p.out_max_abs = MaxAbsDiff(out_r, out_t);
  p.out_max_ulps = MaxUlps(out_r, out_t, sr.engine.out.dtype());
  p.q_ulps =
      MaxUlps(RowValues(sr.q, r, row), RowValues(st.q, t, row), sr.q.dtype());
  const std::vector<double> kv_r[2] = {RowKeys(rollout, sr.k_pages, r),
                                       RowKeys(rollout, sr.v_pages, r)};
  const std::vector<double> kv_t[2] = {RowKeys(trainer, st.k_pages, t),
                                       RowKeys(trainer, st.v_pages, t)};
  const int64_t n =
      std::min(rollout.layout.seq_lens[r], trainer.layout.seq_lens[t]);
  p.keys_compared = n;
  p.kv_ulps = KvUlps(sr, kv_r, kv_t, width, 0, n);
  p.newest_kv_ulps = KvUlps(sr, kv_r, kv_t, width, n - 1, n);
  p.input_effect =
      MaxAbsDiff(std::vector<double>(ref_t.begin() + t * row,
                                     ref_t.begin() + (t + 1) * row),
                 std::vector<double>(ref_r.begin() + r * row,
                                     ref_r.begin() + (r + 1) * row));
  p.noise = judged.noise;
  if (p.noise <= 0) {
    double largest = 0;
    for (double x : out_r) TakeMax(std::fabs(x), &largest);
    p.noise = 4 * Ulp(largest, sr.engine.out.dtype());
  }
  p.verdict =
      RowVerdict(judged.rollout, judged.trainer, p.out_bitwise, p.input_effect,
                 p.noise, p.q_ulps, p.kv_ulps, p.newest_kv_ulps);
  return p;
}

}  // namespace

absl::string_view PairVerdictName(PairVerdict verdict) {
  switch (verdict) {
    case PairVerdict::kConsistent:
      return "consistent";
    case PairVerdict::kWithinNoise:
      return "within-noise";
    case PairVerdict::kInputsDiffer:
      return "inputs-differ";
    case PairVerdict::kStalePrefixKv:
      return "stale-prefix-kv";
    case PairVerdict::kRolloutDrift:
      return "rollout-drift";
    case PairVerdict::kTrainerDrift:
      return "trainer-drift";
    case PairVerdict::kBothDrift:
      return "both-drift";
  }
  return "unknown";
}

std::string RowPair::InputsDiffering() const {
  const std::pair<const char*, double> both[2] = {{"q", q_ulps},
                                                  {"K/V", kv_ulps}};
  std::vector<std::string> parts;
  for (const auto& [name, ulps] : both) {
    if (ulps > kInputRoundingUlps) parts.push_back(name);
  }
  if (parts.empty()) {
    for (const auto& [name, ulps] : both) {
      if (ulps != 0) parts.push_back(name);
    }
  }
  return absl::StrJoin(parts, " and ");
}

std::optional<PairVerdict> PairReport::verdict() const {
  std::optional<PairVerdict> worst;
  for (const RowPair& r : rows) {
    if (!worst || r.verdict > *worst) worst = r.verdict;
  }
  return worst;
}

PairVerdict RowVerdict(Verdict rollout, Verdict trainer, bool bitwise,
                       double effect, double noise, double q_ulps,
                       double kv_ulps, double newest_kv_ulps) {
  const bool r_drift = rollout == Verdict::kDrift;
  const bool t_drift = trainer == Verdict::kDrift;
  if (r_drift && t_drift) return PairVerdict::kBothDrift;
  if (r_drift) return PairVerdict::kRolloutDrift;
  if (t_drift) return PairVerdict::kTrainerDrift;
  if (bitwise) return PairVerdict::kConsistent;
  if (effect <= noise || std::max(q_ulps, kv_ulps) <= kInputRoundingUlps) {
    return PairVerdict::kWithinNoise;
  }
  const double fresh = std::max(q_ulps, newest_kv_ulps);
  return fresh > kInputRoundingUlps ? PairVerdict::kInputsDiffer
                                    : PairVerdict::kStalePrefixKv;
}

absl::StatusOr<PairReport> ComparePairs(const Snapshot& rollout,
                                        const Snapshot& trainer,
                                        const AuditReport* rollout_report,
                                        const AuditReport* trainer_report,
                                        int threads) {
  ATTNAUDIT_ASSIGN_OR_RETURN(Side r, CheckSide(rollout, "rollout"));
  ATTNAUDIT_ASSIGN_OR_RETURN(Side t, CheckSide(trainer, "trainer"));
  const std::vector<Match> matched = MatchRows(r, t);
  PairReport report;
  report.layer = rollout.labels.layer;
  if (rollout_report) report.rollout_verdict = rollout_report->verdict;
  if (trainer_report) report.trainer_verdict = trainer_report->verdict;
  report.rollout_diagnosis = TopDiagnosis(rollout_report);
  report.trainer_diagnosis = TopDiagnosis(trainer_report);
  report.unmatched_rollout =
      static_cast<int64_t>(r.keys.size() - matched.size());
  report.unmatched_trainer =
      static_cast<int64_t>(t.keys.size() - matched.size());
  if (matched.empty()) return report;
  ATTNAUDIT_RETURN_IF_ERROR(CheckSameHeads(r, t));
  std::vector<double> ref_r, ref_t;
  ATTNAUDIT_RETURN_IF_ERROR(ReferenceOuts(r, t, threads, &ref_r, &ref_t));
  const Judged judged{
      report.rollout_verdict, report.trainer_verdict,
      std::max(Tolerance(rollout_report), Tolerance(trainer_report))};
  for (const Match& m : matched) {
    report.rows.push_back(PairRow(r, t, m, ref_r, ref_t, judged));
  }
  return report;
}

}  // namespace attnaudit
