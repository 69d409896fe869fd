#include "core/audit/verdict_steps.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/status_macros.h"
#include "core/drift/drift.h"
#include "core/emulate/emulate.h"
#include "core/engine/arithmetic.h"
#include "core/hull/hull.h"

namespace attnaudit {
namespace audit_internal {
namespace {

std::vector<int64_t> OutShape(const SnapshotDims& d) {
  return {d.batch, d.queries, d.q_heads, d.head_dim};
}

ToleranceInputs EngineVsReference(const VerdictInputs& in) {
  ToleranceInputs ti = in.tolerance_inputs;
  ti.comparison = Comparison::kEngineVsReference;
  return ti;
}

// The median of a per-element tolerance (the figure a report shows).
double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  return values[mid];
}

// E-M's statistics: the drift of E from M, over the per-element tolerance.
absl::Status EmulationDrift(const VerdictInputs& in, const Emulation& m,
                            ComparisonResult* r) {
  const std::vector<double>& e = *in.engine_out;
  const std::vector<int64_t> shape = OutShape(in.prepared.dims);
  DriftOptions o;
  o.ulp_dtype = in.output_dtype;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      r->out,
      in.backend.ComputeDrift({e.data(), shape}, {m.out.data(), shape}, o));
  r->has_out = true;
  r->out.tolerance = Median(m.tolerance);
  r->out.over_tolerance = 0;
  for (size_t i = 0; i < m.out.size(); ++i) {
    // A NaN difference is not "over": the drift counts it as non-finite.
    r->out.over_tolerance += std::fabs(e[i] - m.out[i]) > m.tolerance[i];
  }
  r->worst_heads = WorstHeads({e.data(), shape}, {m.out.data(), shape},
                              in.output_dtype, in.options.worst_heads);
  return absl::OkStatus();
}

std::string EmulationReason(const ComparisonResult& r, const Emulation& m) {
  return absl::StrFormat(
      "out: %d of %d elements beyond what the declared arithmetic allows "
      "(per-element tolerance, median %.2e; %d of %d scores could round "
      "either way; max_abs %.2e at b=%d s=%d h=%d d=%d)",
      r.out.over_tolerance, r.out.count, r.out.tolerance, m.ambiguous_scores,
      m.scores, r.out.max_abs, r.out.worst.batch, r.out.worst.query,
      r.out.worst.head, r.out.worst.dim);
}

// Whether E-M passed with a tolerance that verifies something (below the
// largest |R.out|): then the engine is verified whatever E-R's worst case.
bool EmulationVerifies(const VerdictInputs& in, const AuditReport& report) {
  const ComparisonResult* em = report.Find(Comparison::kEngineVsEmulation);
  return em != nullptr && em->verdict == Verdict::kPass &&
         em->out.tolerance < in.tolerance_inputs.max_abs_out_reference;
}

}  // namespace

DType ModelDType(const Snapshot& s) {
  return s.rope.q_output_dtype != DType::kInvalid ? s.rope.q_output_dtype
                                                  : s.q.dtype();
}

absl::Status EmulationStep(const VerdictInputs& in, AuditReport* report,
                           std::vector<double>* emulated_out) {
  emulated_out->clear();
  if (!in.options.engine_vs_emulation || in.engine_out == nullptr) {
    return absl::OkStatus();
  }
  const EmulationPlan plan =
      PlanEmulation(in.prepared, in.tolerance_inputs.engine);
  if (!plan.run) {
    if (!plan.skipped.empty()) {
      report->provenance.sensitivity.push_back(
          absl::StrCat("no emulated engine (E-M): ", plan.skipped,
                       "; E-R alone bounds its 16-bit scores' worst case"));
    }
    return absl::OkStatus();
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(
      const Emulation m,
      EmulateEngine(in.prepared, plan, in.threads, in.options.cancelled));
  ComparisonResult r;
  r.comparison = Comparison::kEngineVsEmulation;
  ATTNAUDIT_RETURN_IF_ERROR(EmulationDrift(in, m, &r));
  DecideComparison(&r);
  if (r.out.over_tolerance > 0) {
    // The per-element tolerance in its own words (not "over tolerance X").
    r.reasons.erase(r.reasons.begin());
    r.reasons.insert(r.reasons.begin(), EmulationReason(r, m));
  }
  const bool drifted = r.verdict == Verdict::kDrift;
  report->comparisons.push_back(std::move(r));
  if (drifted) *emulated_out = m.out;
  return absl::OkStatus();
}

void HullStep(const VerdictInputs& in, AuditReport* report) {
  if (in.engine_out == nullptr) return;
  const ToleranceInputs ti = EngineVsReference(in);
  const HullSlack slack = EngineHullSlack(ti.engine, in.output_dtype,
                                          ti.kv_dtype, AccumulationDepth(ti));
  report->hull = CheckEngineHull(in.prepared, *in.engine_out, in.reference_out,
                                 slack, in.threads);
  if (report->hull.outside == 0) return;
  const std::string reason = HullReason(report->hull);
  for (ComparisonResult& c : report->comparisons) {
    if (c.comparison == Comparison::kReplayVsReference) continue;
    c.reasons.push_back(reason);
    c.verdict = Verdict::kDrift;
  }
}

void ConclusionStep(const VerdictInputs& in, AuditReport* report) {
  if (EmulationVerifies(in, *report)) return;
  for (ComparisonResult& c : report->comparisons) {
    if (c.comparison == Comparison::kReplayVsReference ||
        c.comparison == Comparison::kEngineVsEmulation ||
        c.verdict != Verdict::kPass) {
      continue;
    }
    ToleranceInputs ti = in.tolerance_inputs;
    ti.comparison = c.comparison;
    const Tolerances tol = ComputeTolerances(ti, in.options.tolerances);
    const std::vector<std::string> why =
        InconclusiveReasons(ti, tol, c.has_out);
    if (why.empty()) continue;
    c.verdict = Verdict::kInconclusive;
    for (const std::string& line : why) {
      report->inconclusive_reasons.push_back(
          absl::StrCat(ComparisonShortName(c.comparison), " ", line));
    }
  }
}

void NoteOverrides(const VerdictInputs& in, AuditReport* report) {
  const Tolerances policy = ComputeTolerances(EngineVsReference(in), {});
  const ToleranceOverrides& o = in.options.tolerances;
  std::vector<std::string>& lines = report->overrides;
  for (const auto& [name, value, policy_value] :
       {std::tuple<const char*, double, double>{"out_abs", o.out_abs,
                                                policy.out_abs},
        {"lse_abs", o.lse_abs, policy.lse_abs},
        {"logprob_abs", o.logprob_abs, policy.logprob_abs}}) {
    if (value > 0) {
      lines.push_back(absl::StrFormat("tolerances.%s %.3g (E-R policy %.3g)",
                                      name, value, policy_value));
    }
  }
  if (!in.options.statistical_test) {
    lines.push_back("statistical_test off: the detector does not vote");
  }
  for (std::string& line : PrecisionOverrides(in.snapshot.precision)) {
    lines.push_back(std::move(line));
  }
}

void NoteSensitivity(const VerdictInputs& in, AuditReport* report) {
  const ToleranceInputs ti = EngineVsReference(in);
  const Tolerances now = ComputeTolerances(ti, {});
  std::vector<std::string>& lines = report->provenance.sensitivity;
  if (ti.engine.undeclared) {
    ToleranceInputs declared = ti;
    EnginePrecision flash;
    flash.profile = EngineProfile::kFlashDecoding;
    declared.engine = ResolveEngineArithmetic(
        flash, ModelDType(in.snapshot), ti.kv_dtype, in.prepared.dims.head_dim,
        in.snapshot.logit_softcap > 0);
    const Tolerances sharp = ComputeTolerances(declared, {});
    lines.push_back(absl::StrFormat(
        "undeclared engine: audited with the widest envelope of every engine "
        "the conformance suite runs (16-bit scores, a 20-ulp exp, either "
        "rounding): E-R out tolerance %.3g, %.1fx a declared flash-decoding "
        "engine's %.3g; declare the engine (engine= or the probe's measured "
        "precision) to see smaller drift",
        now.out_abs, now.out_abs / std::max(sharp.out_abs, 1e-300),
        sharp.out_abs));
  }
  const PreparedAttention& p = in.prepared;
  if (!p.row_score_uncertainty.empty()) {
    RowScoreInputs rows;
    rows.row_score_uncertainty = &p.row_score_uncertainty;
    rows.row_value_max = &p.row_value_max;
    rows.q_heads = p.dims.q_heads;
    rows.kv_heads = p.dims.kv_heads;
    const RowTolerances extra = ComputeRowTolerances(ti, rows, {});
    const double max_lse = *std::max_element(p.row_score_uncertainty.begin(),
                                             p.row_score_uncertainty.end());
    const double max_out =
        extra.out.empty()
            ? 0.0
            : *std::max_element(extra.out.begin(), extra.out.end());
    lines.push_back(absl::StrFormat(
        "%d rotated q and %d rotated K elements lie at a rounding boundary "
        "of %s within the engine's libm and fp32 difference (the engine may "
        "store them one ulp the other way): their %d of %d rows (b, s, h) "
        "are held to tolerances widened by up to %.3g (lse) and %.3g (out, "
        "%.1fx the E-R out tolerance), or where a comparison finds a row "
        "beyond its scalar tolerance, to the smaller bound from the row's own "
        "keys' weights; rows with an ambiguous q element are left out of the "
        "statistical test",
        p.ambiguous_q_elements, p.ambiguous_k_elements,
        DTypeName(p.rotation_dtype), p.ambiguous_rows,
        static_cast<int64_t>(p.row_score_uncertainty.size()), max_lse, max_out,
        max_out / std::max(now.out_abs, 1e-300)));
  }
  if (ti.rope_score_uncertainty > 0) {
    ToleranceInputs exact = ti;
    exact.rope_score_uncertainty = 0;
    const Tolerances sharp = ComputeTolerances(exact, {});
    lines.push_back(absl::StrFormat(
        "pre-RoPE without the engine's RoPE table: attnaudit's own rotation "
        "may move a score by up to %.3g from the engine's, which widens the "
        "E-R out tolerance from %.3g to %.3g (%.1fx) and the lse tolerance "
        "by %.3g; send rope_table (the engine's inv_freq, rotary_dim / 2 "
        "floats) to audit at full sensitivity",
        ti.rope_score_uncertainty, sharp.out_abs, now.out_abs,
        now.out_abs / std::max(sharp.out_abs, 1e-300),
        ti.rope_score_uncertainty));
  }
}

}  // namespace audit_internal
}  // namespace attnaudit
