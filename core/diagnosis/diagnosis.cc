// Diagnose: picks the rows to examine, runs the hypothesis families within
// the time limit, ranks what they found and words it.
#include "core/diagnosis/diagnosis.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/diagnosis/diagnosis_internal.h"

namespace attnaudit {
namespace diagnosis_internal {
namespace {

// Candidates below this share of the drift are not reported, and with no
// candidate above kExplainedFloor the answer is "unexplained".
constexpr double kReportFloor = 0.25;
constexpr double kExplainedFloor = 0.5;
// A recomputed hypothesis removing this share of the drift outranks a
// located one (Candidate::located), explained or not.
constexpr double kNearlyAll = 0.98;
// Two hypotheses whose scores differ by at most this fit E equally.
constexpr double kEqualFit = 0.01;

absl::Status CheckInputs(const DiagnosisInputs& in) {
  if (in.snapshot == nullptr || in.layout == nullptr ||
      in.prepared == nullptr || in.reference_out == nullptr ||
      in.reference_lse == nullptr || in.engine_out == nullptr ||
      in.engine_lse == nullptr) {
    return absl::InvalidArgumentError("diagnosis: an input is missing");
  }
  const SnapshotDims& d = in.prepared->dims;
  const size_t cells = static_cast<size_t>(d.batch * d.queries * d.q_heads);
  const size_t elements = cells * static_cast<size_t>(d.head_dim);
  if (in.reference_out->size() != elements ||
      in.reference_lse->size() != cells ||
      (!in.engine_out->empty() && in.engine_out->size() != elements) ||
      (!in.engine_lse->empty() && in.engine_lse->size() != cells)) {
    return absl::InvalidArgumentError(
        "diagnosis: result sizes do not match the snapshot's dims");
  }
  return absl::OkStatus();
}

Context MakeContext(const DiagnosisInputs& in, const DiagnosisOptions& opt) {
  Context ctx;
  ctx.in = &in;
  ctx.opt = &opt;
  ctx.p = in.prepared;
  ctx.d = in.prepared->dims;
  ctx.start = Clock::now();
  ToleranceInputs ti = in.tolerance_inputs;
  ti.comparison = Comparison::kEngineVsReference;
  ctx.tol = ComputeTolerances(ti, in.tolerance_overrides);
  StatisticalInputs si;
  si.comparison = Comparison::kEngineVsReference;
  si.output_dtype = ti.output_dtype;
  si.kv_dtype = ti.kv_dtype;
  si.max_context = ti.max_context;
  si.max_merged_blocks = ti.max_merged_blocks;
  si.max_abs_lse_reference = ti.max_abs_lse_reference;
  si.probability_epsilon = ti.engine.probability_epsilon;
  si.score_error = EngineScoreError(ti) + ti.rope_score_noise;
  ctx.noise = StatisticalNoise(si);
  // An eighth of the worst-case LSE tolerance: a correct engine's LSE
  // noise is far below it (docs/DIAGNOSIS.md, "Scores").
  ctx.lse_unit = std::max(ctx.tol.lse_abs / 8.0, 1e-30);
  ctx.lse_magnitude = ti.max_abs_lse_reference;
  ctx.clean_cell =
      ctx.noise.mean_square + (in.engine_lse->empty() ? 0.0 : 1.0 / 16.0);
  return ctx;
}

Row BuildRow(const Context& ctx, int64_t b) {
  const SnapshotDims& d = ctx.d;
  const int64_t D = d.head_dim, cells = ctx.Cells();
  const DiagnosisInputs& in = *ctx.in;
  Row row;
  row.b = b;
  row.has_out = !in.engine_out->empty();
  row.has_lse = !in.engine_lse->empty();
  const int64_t o0 = b * cells * D, l0 = b * cells;
  row.r_out.assign(in.reference_out->begin() + o0,
                   in.reference_out->begin() + o0 + cells * D);
  row.r_lse.assign(in.reference_lse->begin() + l0,
                   in.reference_lse->begin() + l0 + cells);
  if (row.has_out) {
    row.e_out.assign(in.engine_out->begin() + o0,
                     in.engine_out->begin() + o0 + cells * D);
  }
  if (row.has_lse) {
    row.e_lse.assign(in.engine_lse->begin() + l0,
                     in.engine_lse->begin() + l0 + cells);
  }
  row.unit.resize(static_cast<size_t>(cells * D));
  row.before.resize(static_cast<size_t>(cells));
  row.before_max.assign(static_cast<size_t>(cells), 0.0);
  row.before_z2.assign(static_cast<size_t>(cells), 0.0);
  row.before_lse.assign(static_cast<size_t>(cells), 0.0);
  for (int64_t c = 0; c < cells; ++c) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i)
      ss += row.r_out[c * D + i] * row.r_out[c * D + i];
    const double rms = std::sqrt(ss / static_cast<double>(D));
    for (int64_t i = 0; i < D; ++i) {
      row.unit[c * D + i] = NoiseUnit(row.r_out[c * D + i], rms,
                                      ctx.noise.epsilon, ctx.p->output_dtype);
    }
    row.before[c] = CellEnergy(ctx, row, &row.r_out[c * D], row.r_lse[c], c);
    for (int64_t i = 0; row.has_out && i < D; ++i) {
      const int64_t k = c * D + i;
      const double diff = std::fabs(Diff(row.e_out[k], row.r_out[k]));
      const double z = diff / row.unit[k];
      row.before_max[c] = std::max(row.before_max[c], diff);
      row.before_z2[c] += std::isfinite(z) ? z * z : 1e30;
    }
    if (row.has_lse) {
      row.before_lse[c] = std::fabs(Diff(row.e_lse[c], row.r_lse[c]));
      row.lse_drift +=
          std::fabs(Diff(row.e_lse[c], row.r_lse[c])) / ctx.lse_unit;
    }
  }
  row.lse_drift /= static_cast<double>(cells);
  return row;
}

// The rows that drift most (those with any excess energy), at most
// opt.max_rows of them.
std::vector<Row> PickRows(const Context& ctx) {
  std::vector<std::pair<double, int64_t>> excess;
  for (int64_t b = 0; b < ctx.d.batch; ++b) {
    const Row row = BuildRow(ctx, b);
    double x = 0;
    for (double e : row.before) x += std::max(0.0, e - ctx.clean_cell);
    if (x > 0) excess.emplace_back(x, b);
  }
  std::stable_sort(
      excess.begin(), excess.end(),
      [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Row> rows;
  for (const auto& [x, b] : excess) {
    if (static_cast<int>(rows.size()) >= ctx.opt->max_rows) break;
    rows.push_back(BuildRow(ctx, b));
  }
  return rows;
}

std::string Drift(const Evaluation& e) {
  return absl::StrFormat(
      "max |diff| %.2g -> %.2g, rms %.2g -> %.2g noise units",
      e.before.out_max_abs, e.after.out_max_abs, e.before.out_rms_noise,
      e.after.out_rms_noise);
}

std::string Tail(const Candidate& c) {
  if (c.eval.explains) {
    return absl::StrCat(
        ": with it, engine and reference agree within the "
        "engine's rounding (",
        Drift(c.eval), ")");
  }
  return absl::StrFormat(": it accounts for %.0f%% of the drift (%s)",
                         100.0 * c.eval.score, Drift(c.eval));
}

std::string Heads(const Context& ctx, const DiagnosisLocation& l) {
  if (l.heads.empty() ||
      static_cast<int64_t>(l.heads.size()) == ctx.d.q_heads) {
    return "";
  }
  std::vector<int64_t> shown(
      l.heads.begin(), l.heads.begin() + std::min<size_t>(8, l.heads.size()));
  return absl::StrCat(" (heads ", absl::StrJoin(shown, ", "),
                      l.heads.size() > shown.size() ? ", ..." : "", ")");
}

std::string Summarize(const Context& ctx, const Candidate& c) {
  const DiagnosisLocation& l = c.location;
  const std::string& h = c.hypothesis;
  if (h == kStalePage) {
    // Its content is unknown: the evidence is what is left without it.
    const bool agree = c.eval.after.out_rms_noise <= 2.0;
    const std::string where = absl::StrFormat(
        "page %d (logical block %d of row %d%s)", l.page, l.logical_block,
        l.row, l.cp_rank >= 0 ? absl::StrCat(", CP rank ", l.cp_rank) : "");
    if (!c.eval.explains) {
      return absl::StrCat("a stale page, perhaps ", where, ": ", c.detail);
    }
    return absl::StrFormat(
        "%s holds stale data: %s (%s)", where,
        agree ? "without it, engine and reference agree to about an output "
                "ulp"
              : "the drift is what content of unknown values in its place "
                "gives, and no other block fits as well",
        Drift(c.eval));
  }
  if (h == kDropBlock) {
    return absl::StrCat(absl::StrFormat("the engine skipped logical block %d "
                                        "(page %d) of row %d",
                                        l.logical_block, l.page, l.row),
                        Tail(c));
  }
  if (h == kDuplicatePage) {
    return absl::StrCat(
        absl::StrFormat("logical block %d of row %d read page %d (logical "
                        "block %d's) instead of its own page %d",
                        l.logical_block, l.row, l.other_page,
                        l.other_logical_block, l.page),
        c.detail.empty() ? "" : absl::StrCat(" (", c.detail, ")"), Tail(c));
  }
  if (h == kSwappedPages) {
    return absl::StrCat(
        absl::StrFormat("logical blocks %d and %d of row %d (pages %d and %d) "
                        "are swapped in the engine's block table",
                        l.logical_block, l.other_logical_block, l.row, l.page,
                        l.other_page),
        Tail(c));
  }
  if (h == kRopeOffset) {
    return absl::StrCat("RoPE position off by ", c.detail,
                        ": q rotated at its position ", c.detail,
                        " (or every key at the opposite shift)", Heads(ctx, l),
                        Tail(c));
  }
  if (h == kUnexplained) {
    return absl::StrCat("no known failure explains the drift", c.detail);
  }
  if (h == kLowPrecision) {
    return absl::StrCat(
        "a reduced-precision intermediate (e.g. a bf16 running output or "
        "partials): ",
        c.detail);
  }
  if (h == kCpBf16Combine) {
    return absl::StrCat("the CP combine runs in bf16: ", c.detail);
  }
  std::string where = Heads(ctx, l);
  if (l.cp_rank >= 0) absl::StrAppend(&where, " (row ", l.row, ")");
  return absl::StrCat(h, ": ", c.detail, where, Tail(c));
}

bool Better(const Candidate& a, const Candidate& b) {
  if (a.located != b.located) {
    const Candidate& computed = a.located ? b : a;
    const Candidate& located = a.located ? a : b;
    if (computed.eval.score >= kNearlyAll &&
        (computed.eval.explains || !located.eval.explains)) {
      return !a.located;
    }
  }
  if (a.eval.explains != b.eval.explains) return a.eval.explains;
  const double sa = std::round(a.eval.score * 100.0);
  const double sb = std::round(b.eval.score * 100.0);
  if (sa != sb) return sa > sb;
  if (a.rank_bias != b.rank_bias) return a.rank_bias < b.rank_bias;
  return a.eval.score > b.eval.score;
}

Diagnosis ToDiagnosis(const Context& ctx, const Candidate& c) {
  Diagnosis d;
  d.hypothesis = c.hypothesis;
  d.detail = c.detail;
  d.score = c.eval.score;
  d.explains = c.eval.explains;
  d.before = c.eval.before;
  d.after = c.eval.after;
  d.location = c.location;
  d.summary = Summarize(ctx, c);
  return d;
}

// Stale pages located by different fits of one row (its pages, a CP
// rank's local pages) are alternatives: the one whose fit is best stands,
// named only when the other's best group, one more alternative, leaves
// its posterior odds above PlaceLogOdds.
void ResolveLocated(std::vector<Candidate>* all) {
  std::map<int64_t, std::vector<size_t>> by_row;
  for (size_t i = 0; i < all->size(); ++i) {
    if ((*all)[i].located) by_row[(*all)[i].location.row].push_back(i);
  }
  std::vector<uint8_t> drop(all->size(), 0);
  for (auto& [row, idx] : by_row) {
    if (idx.size() < 2) continue;
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return (*all)[a].fit_cost < (*all)[b].fit_cost;
    });
    Candidate& best = (*all)[idx[0]];
    if ((*all)[idx[1]].fit_cost - best.fit_cost < PlaceLogOdds() &&
        best.eval.explains) {
      best.eval.explains = false;
      best.eval.score = std::min(best.eval.score, kAmbiguousStaleScore);
      best.detail =
          "a CP rank's local page and one of the engine's pages fit about as "
          "well";
    }
    for (size_t k = 1; k < idx.size(); ++k) drop[idx[k]] = 1;
  }
  size_t n = 0;
  for (size_t i = 0; i < all->size(); ++i) {
    if (drop[i]) continue;
    if (n != i) (*all)[n] = std::move((*all)[i]);
    ++n;
  }
  all->resize(n);
}

bool IsPageHypothesis(const std::string& h) {
  return h == kStalePage || h == kDropBlock || h == kDuplicatePage ||
         h == kSwappedPages || h == kForeignPage || h == kSeqLenOffByOne;
}

// The logical blocks a page candidate names (a swap: both).
std::vector<int64_t> Places(const Candidate& c) {
  std::vector<int64_t> p{c.location.logical_block};
  if (c.hypothesis == kSwappedPages)
    p.push_back(c.location.other_logical_block);
  return p;
}

bool Overlap(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  for (int64_t x : a) {
    if (std::find(b.begin(), b.end(), x) != b.end()) return true;
  }
  return false;
}

// Page accounts of one row that explain E at places that do not overlap
// (a duplicate read at one block, a stale page at another): the evidence
// does not fix the place -- content that takes no weight, or only mass
// added, reads the same at many blocks -- so none is named.
void DemoteConflictingPlaces(std::vector<Candidate>* all) {
  std::map<int64_t, std::vector<size_t>> by_row;
  for (size_t i = 0; i < all->size(); ++i) {
    const Candidate& c = (*all)[i];
    if (c.eval.explains && IsPageHypothesis(c.hypothesis)) {
      by_row[c.location.row].push_back(i);
    }
  }
  for (const auto& [row, idx] : by_row) {
    int64_t other = -1;
    for (size_t a = 0; a < idx.size() && other < 0; ++a) {
      for (size_t b = a + 1; b < idx.size() && other < 0; ++b) {
        if (!Overlap(Places((*all)[idx[a]]), Places((*all)[idx[b]]))) {
          other = (*all)[idx[b]].location.logical_block;
        }
      }
    }
    if (other < 0) continue;
    for (size_t i : idx) {
      Candidate& c = (*all)[i];
      c.eval.explains = false;
      c.eval.score = std::min(c.eval.score, kAmbiguousStaleScore);
      c.detail = absl::StrCat(c.detail.empty() ? "" : c.detail + "; ",
                              "another page account fits as well at another "
                              "place (logical block ",
                              c.location.logical_block == other
                                  ? (*all)[idx[0]].location.logical_block
                                  : other,
                              ")");
    }
  }
}

// A page account of one row cannot explain an examined row that does not
// read its page and lies beyond the tolerance too (a fault of every row: a
// RoPE or scale bug whose variant did not reproduce E exactly, which a
// stale-page fit of one row may otherwise claim): it is named as a
// candidate only.
void DemoteWhereOtherRowsDrift(const Context& ctx, const std::vector<Row>& rows,
                               std::vector<Candidate>* all) {
  const std::vector<std::vector<int32_t>>& tables = ctx.in->layout->block_pages;
  for (Candidate& c : *all) {
    const int64_t b = c.location.row;
    const int64_t blk = c.location.logical_block;
    if (!c.eval.explains || !IsPageHypothesis(c.hypothesis) || b < 0 ||
        b >= static_cast<int64_t>(tables.size()) || blk < 0 ||
        blk >= static_cast<int64_t>(tables[b].size())) {
      continue;
    }
    const int32_t page = tables[b][blk];
    for (const Row& other : rows) {
      const std::vector<int32_t>& read = tables[other.b];
      if (other.b == b || !BeyondTolerance(ctx, other) ||
          std::find(read.begin(), read.end(), page) != read.end()) {
        continue;
      }
      c.eval.explains = false;
      c.eval.score = std::min(c.eval.score, kAmbiguousStaleScore);
      c.detail =
          absl::StrCat(c.detail.empty() ? "" : c.detail + "; ", "row ", other.b,
                       " drifts beyond the tolerance too and does not "
                       "read this page");
      break;
    }
  }
}

// An fp8 scale error and another global hypothesis (a wrong softmax scale,
// most often) can fit E equally: a factor large enough to make every
// head's attention one-hot leaves the same output whatever made it. The
// fp8 scale, which names which of the snapshot's declared scales was
// misapplied, is the more specific account, and leads; the others are
// named after it (EquallyHere).
void PreferSpecific(std::vector<Candidate>* all) {
  if (all->empty() || (*all)[0].hypothesis == kFp8Scale ||
      (*all)[0].location.logical_block >= 0 || (*all)[0].located) {
    return;
  }
  const Candidate& top = (*all)[0];
  for (size_t i = 1; i < all->size(); ++i) {
    const Candidate& c = (*all)[i];
    if (c.hypothesis == kFp8Scale && c.eval.explains == top.eval.explains &&
        std::fabs(c.eval.score - top.eval.score) <= kEqualFit) {
      std::rotate(all->begin(), all->begin() + static_cast<ptrdiff_t>(i),
                  all->begin() + static_cast<ptrdiff_t>(i) + 1);
      return;
    }
  }
}

// The other hypotheses that explain E as well at the top's place (a page
// whose content takes no weight reads the same skipped, stale or replaced
// by another page): named after the top's summary.
std::string EquallyHere(const std::vector<Candidate>& all) {
  const Candidate& top = all[0];
  if (!top.eval.explains) return "";
  std::vector<std::string> names;
  for (size_t i = 1; i < all.size(); ++i) {
    const Candidate& c = all[i];
    if (c.eval.explains && c.hypothesis != top.hypothesis &&
        c.location.row == top.location.row &&
        c.location.logical_block == top.location.logical_block &&
        c.location.cp_rank == top.location.cp_rank &&
        std::fabs(c.eval.score - top.eval.score) <= kEqualFit &&
        std::find(names.begin(), names.end(), c.hypothesis) == names.end()) {
      names.push_back(c.hypothesis);
    }
  }
  if (names.empty()) return "";
  return absl::StrCat("; at the same place, ", absl::StrJoin(names, ", "),
                      names.size() == 1 ? " explains" : " explain",
                      " it as well");
}

// Best first, one per hypothesis, "unexplained" first when nothing
// explains at least half of the drift.
std::vector<Diagnosis> Rank(const Context& ctx, const std::vector<Row>& rows,
                            std::vector<Candidate> all) {
  ResolveLocated(&all);
  DemoteConflictingPlaces(&all);
  DemoteWhereOtherRowsDrift(ctx, rows, &all);
  std::stable_sort(all.begin(), all.end(), Better);
  PreferSpecific(&all);
  std::vector<Diagnosis> out;
  std::vector<std::string> seen;
  const Candidate* best = all.empty() ? nullptr : &all[0];
  if (best == nullptr || best->eval.score < kExplainedFloor) {
    Candidate u;
    u.hypothesis = kUnexplained;
    Scorer scorer(ctx);
    for (const Row& row : rows) {
      for (int64_t c = 0; c < ctx.Cells(); ++c) {
        scorer.AddCell(row, c, &row.r_out[c * ctx.d.head_dim], row.r_lse[c]);
      }
    }
    u.eval = scorer.Finish();
    u.eval.score = 0;
    u.eval.after = u.eval.before;
    if (best != nullptr && best->located) {
      u.detail = absl::StrCat(
          " (the best candidate, a stale page, cannot be "
          "placed: ",
          best->detail, ")");
    } else if (best != nullptr) {
      u.detail =
          absl::StrFormat(" (the best candidate, %s, accounts for %.0f%%)",
                          best->hypothesis, 100.0 * best->eval.score);
    }
    out.push_back(ToDiagnosis(ctx, u));
  }
  for (const Candidate& c : all) {
    if (static_cast<int>(out.size()) >= ctx.opt->max_diagnoses) break;
    if (c.eval.score < kReportFloor) continue;
    if (std::find(seen.begin(), seen.end(), c.hypothesis) != seen.end()) {
      continue;
    }
    seen.push_back(c.hypothesis);
    out.push_back(ToDiagnosis(ctx, c));
    if (&c == best) absl::StrAppend(&out.back().summary, EquallyHere(all));
  }
  return out;
}

// Whether some candidate already explains E exactly: the costlier
// recomputations would only rank below it.
bool Explained(const std::vector<Candidate>& all) {
  for (const Candidate& c : all) {
    if (c.eval.explains && c.eval.score >= 0.98) return true;
  }
  return false;
}

absl::Status RunFamilies(const Context& ctx, const std::vector<Row>& rows,
                         std::vector<Candidate>* all) {
  ATTNAUDIT_RETURN_IF_ERROR(LseHypotheses(ctx, rows, all));
  if (Explained(*all)) return absl::OkStatus();
  // Global variants are screened first: when one explains the screening
  // row, it is confirmed before any per-row page work.
  GlobalScreen screen;
  ATTNAUDIT_RETURN_IF_ERROR(ScreenGlobal(ctx, rows, &screen));
  bool confirmed = false;
  if (BestScreened(screen) >= 0.95) {
    ATTNAUDIT_RETURN_IF_ERROR(ConfirmGlobal(ctx, rows, screen, all));
    confirmed = true;
  }
  // Against E - M + R (only E-M drifted), a page fault, whose effect on
  // out stays under E-R's tolerance, is not told from the rounding that
  // E - M keeps: only recomputed hypotheses are tried.
  const bool pages = !ctx.in->engine_arithmetic_removed;
  for (const Row& row : rows) {
    if (!pages || ctx.TimeUp() || ctx.Cancelled() || Explained(*all)) break;
    // A page that was dropped, stale, duplicated or swapped changes the
    // keys, but not always the LSE: a stale page whose content carries as
    // much weight as the original moves out alone. Only a row where
    // neither quantity drifts beyond noise has no page fault to find.
    if (!RowDrifts(ctx, row) && ctx.in->snapshot->cp.world_size <= 1) {
      continue;
    }
    RowStates rs;
    ATTNAUDIT_RETURN_IF_ERROR(ComputeRowStates(ctx, row.b, &rs));
    const RankEvidence ranks = RankDrift(ctx, row, rs);
    ATTNAUDIT_RETURN_IF_ERROR(BlockHypotheses(ctx, row, rs, ranks, all));
    ATTNAUDIT_RETURN_IF_ERROR(CpHypotheses(ctx, row, rs, ranks, all));
  }
  if (!confirmed && !ctx.TimeUp() && !ctx.Cancelled() && !Explained(*all)) {
    ATTNAUDIT_RETURN_IF_ERROR(ConfirmGlobal(ctx, rows, screen, all));
  }
  if (!ctx.in->engine_arithmetic_removed) PrecisionHypothesis(ctx, rows, all);
  return absl::OkStatus();
}

}  // namespace
}  // namespace diagnosis_internal

absl::StatusOr<DiagnosisResult> Diagnose(const DiagnosisInputs& inputs,
                                         const DiagnosisOptions& options) {
  namespace di = diagnosis_internal;
  ATTNAUDIT_RETURN_IF_ERROR(di::CheckInputs(inputs));
  DiagnosisResult result;
  if (inputs.engine_out->empty() && inputs.engine_lse->empty()) {
    result.run.note = "the snapshot has no engine out or LSE to explain";
    return result;
  }
  const di::Context ctx = di::MakeContext(inputs, options);
  const std::vector<di::Row> rows = di::PickRows(ctx);
  result.run.ran = true;
  result.run.rows = static_cast<int64_t>(rows.size());
  if (rows.empty()) {
    result.run.complete = true;
    result.run.note =
        "out and LSE are within the engine's noise against the reference: "
        "the drift is elsewhere (the log-probs, a CP rank's partial, a RoPE "
        "check, or the E-M comparison with the engine's declared arithmetic "
        "replayed, which the hypotheses here are not scored against)";
    return result;
  }
  std::vector<di::Candidate> all;
  ATTNAUDIT_RETURN_IF_ERROR(di::RunFamilies(ctx, rows, &all));
  if (ctx.Cancelled()) return absl::CancelledError("audit cancelled");
  result.run.complete = !ctx.TimeUp();
  if (!result.run.complete) {
    result.run.note = absl::StrFormat(
        "stopped at the time limit of %.3g s; later hypotheses were not tried",
        options.max_seconds);
  }
  result.run.hypotheses = ctx.evaluated;
  result.diagnoses = di::Rank(ctx, rows, std::move(all));
  return result;
}

const std::vector<std::string>& HypothesisNames() {
#define ATTNAUDIT_DIAGNOSIS_NAME(constant, name) name,
  static const std::vector<std::string>* names = new std::vector<std::string>{
      ATTNAUDIT_DIAGNOSIS_HYPOTHESES(ATTNAUDIT_DIAGNOSIS_NAME)};
#undef ATTNAUDIT_DIAGNOSIS_NAME
  return *names;
}

}  // namespace attnaudit
