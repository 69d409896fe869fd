#include "client/cli/report_printer.h"

#include <algorithm>
#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/cp_table.h"
#include "client/cli/diagnosis_printer.h"
#include "client/cli/findings.h"
#include "core/engine/arithmetic.h"
#include "core/fingerprint/fingerprint.h"
#include "core/hull/hull.h"
#include "proto/codec/codec.h"

namespace attnaudit::client {
namespace {

std::string Row(absl::string_view comparison, absl::string_view quantity,
                const DriftStats& st) {
  std::string nonfinite;
  if (st.candidate_nan + st.candidate_inf + st.nonfinite_mismatch > 0) {
    nonfinite =
        absl::StrCat(" nan=", st.candidate_nan, " inf=", st.candidate_inf,
                     " mismatched=", st.nonfinite_mismatch);
  }
  return absl::StrFormat(
      "  %-4s %-8s %10.3e %10.3e %10.3e %10.3e %9.0f %10.3e %8d%s\n",
      comparison, quantity, st.max_abs, st.mean_abs, st.rms, st.p99_abs,
      st.max_ulp, st.tolerance, st.over_tolerance, nonfinite);
}

std::string Bytes(int64_t n) {
  if (n >= (int64_t{1} << 30))
    return absl::StrFormat("%.2f GiB", n / 1073741824.0);
  if (n >= (int64_t{1} << 20))
    return absl::StrFormat("%.1f MiB", n / 1048576.0);
  if (n >= 1024) return absl::StrFormat("%.1f KiB", n / 1024.0);
  return absl::StrCat(n, " B");
}

// Enum values by name (`inspect`), spelled as the fingerprint's canonical
// text spells them where it has them.
absl::string_view LayoutName(KvLayout l) {
  return l == KvLayout::kHND ? "HND" : "NHD";
}
absl::string_view RopeStateName(RopeState s) {
  return s == RopeState::kPreRope ? "pre_rope" : "post_rope";
}
absl::string_view RopeStyleName(RopeStyle s) {
  return s == RopeStyle::kGptj ? "gptj" : "neox";
}
absl::string_view WindowConventionName(SlidingWindowConvention c) {
  return c == SlidingWindowConvention::kFlashLeft ? "flash_left"
                                                  : "hugging_face";
}
absl::string_view CpShardingName(CpSharding c) {
  switch (c) {
    case CpSharding::kNone:
      return "none";
    case CpSharding::kExplicitOwners:
      return "explicit_owners";
    case CpSharding::kTokenInterleaved:
      return "token_interleaved";
    case CpSharding::kPageInterleaved:
      return "page_interleaved";
  }
  return "unknown";
}
// "none", or the type and the factor: "llama3 factor=8".
std::string ScalingText(const RopeScaling& s) {
  switch (s.type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return absl::StrCat("linear factor=", s.factor);
    case RopeScalingType::kLlama3:
      return absl::StrCat("llama3 factor=", s.factor);
    case RopeScalingType::kYarn:
      return absl::StrCat("yarn factor=", s.factor);
    case RopeScalingType::kDynamic:
      return absl::StrCat("dynamic factor=", s.factor,
                          " sequence_length=", s.sequence_length);
    case RopeScalingType::kLongRope:
      return absl::StrCat(
          "longrope ",
          s.sequence_length > s.original_max_position ? "long" : "short",
          " factors sequence_length=", s.sequence_length);
  }
  return absl::StrCat("unknown(", static_cast<int>(s.type), ")");
}

std::string LabelLine(const Labels& l) {
  std::vector<std::string> parts;
  if (!l.model.empty()) parts.push_back(absl::StrCat("model=", l.model));
  if (l.layer >= 0) parts.push_back(absl::StrCat("layer=", l.layer));
  if (!l.engine.empty()) parts.push_back(absl::StrCat("engine=", l.engine));
  if (!l.backend.empty()) parts.push_back(absl::StrCat("backend=", l.backend));
  if (l.step >= 0) parts.push_back(absl::StrCat("step=", l.step));
  return parts.empty() ? "(none)" : absl::StrJoin(parts, " ");
}

// The fingerprints the audit computed, each with the definition's name
// (the same kFingerprintVersion that GetCapabilities reports).
void AppendFingerprints(const Provenance& p, std::string* out) {
  const std::string version =
      p.fingerprint_version.empty() ? "" : " " + p.fingerprint_version;
  if (!p.kv_fingerprint.empty()) {
    absl::StrAppend(out, "kv fingerprint:", version, " ", p.kv_fingerprint,
                    "\n");
  }
  if (!p.prefix_fingerprint.empty()) {
    const std::string scheme = p.prefix_fingerprint_scheme.empty()
                                   ? version
                                   : " " + p.prefix_fingerprint_scheme;
    absl::StrAppend(out, "prefix fingerprint:", scheme, " ",
                    p.prefix_fingerprint, " (verified)\n");
  }
}

}  // namespace

int ExitCodeFor(Verdict verdict) {
  switch (verdict) {
    case Verdict::kPass:
      return kExitPass;
    case Verdict::kDrift:
      return kExitDrift;
    case Verdict::kInconclusive:
      return kExitInconclusive;
    case Verdict::kUnspecified:
    case Verdict::kInvalid:
      break;
  }
  return kExitError;
}

// The table of comparisons x quantities.
void AppendComparisonTable(const AuditReport& r, std::string* out_ptr) {
  std::string& out = *out_ptr;
  absl::StrAppendFormat(&out, "  %-4s %-8s %10s %10s %10s %10s %9s %10s %8s\n",
                        "cmp", "quantity", "max_abs", "mean_abs", "rms",
                        "p99_abs", "max_ulp", "tolerance", "over");
  for (const ComparisonResult& c : r.comparisons) {
    const absl::string_view name = ComparisonShortName(c.comparison);
    if (c.has_out) out += Row(name, "out", c.out);
    if (c.has_lse) out += Row(name, "lse", c.lse);
    if (c.has_logprob) out += Row(name, "logprob", c.logprob);
  }
}

// Per comparison: its verdict, each quantity in the engine's terms (what
// fired, by how much, where), the worst heads, the log-prob agreement.
void AppendFindings(const AuditReport& r, std::string* out_ptr) {
  std::string& out = *out_ptr;
  const std::vector<Finding> findings = FindingsOf(r);
  for (const ComparisonResult& c : r.comparisons) {
    absl::StrAppend(&out, ComparisonShortName(c.comparison), " ",
                    CandidateName(c.comparison), " vs ",
                    BaselineName(c.comparison), ": ", VerdictName(c.verdict),
                    "\n");
    bool fired = false;
    for (const Finding& f : findings) {
      if (f.comparison != c.comparison) continue;
      fired |= f.fired();
      out += DescribeFinding(f, r.dims, "    ");
    }
    if (c.verdict == Verdict::kDrift && !fired) {
      // DRIFT for a reason the statistics do not carry: the core's words.
      for (const std::string& reason : c.reasons) {
        absl::StrAppend(&out, "    ", reason, "\n");
      }
    }
    if (!c.worst_heads.empty() && c.has_out && c.out.max_abs > 0) {
      std::vector<std::string> heads;
      for (const HeadSummary& h : c.worst_heads) {
        heads.push_back(absl::StrFormat("h%d %.2e", h.head, h.max_abs));
      }
      absl::StrAppend(
          &out, "    worst heads (out): ", absl::StrJoin(heads, ", "), "\n");
    }
    if (c.has_logprob && c.logprob_agreement.count > 0) {
      const LogprobAgreement& a = c.logprob_agreement;
      absl::StrAppendFormat(
          &out,
          "    log-prob agreement: %d tokens, mean|diff| %.3e, k1 %.3e, "
          "k3 %.3e, ratio [%.6f, %.6f]\n",
          a.count, a.mean_abs_diff, a.k1_kl, a.k3_kl, a.ratio_min, a.ratio_max);
    }
  }
}

// ", fired: E-R lse, E-P lse" after a DRIFT verdict (empty otherwise).
std::string FiredSummary(const AuditReport& r) {
  std::vector<std::string> fired;
  for (const Finding& f : FindingsOf(r)) {
    if (f.fired()) {
      fired.push_back(absl::StrCat(ComparisonShortName(f.comparison), " ",
                                   QuantityName(f.quantity)));
    }
  }
  for (const RopeCheckResult& c : r.rope_checks) {
    if (c.verdict == Verdict::kDrift)
      fired.push_back(absl::StrCat("rope ", c.what));
  }
  return fired.empty() ? ""
                       : absl::StrCat(" (", absl::StrJoin(fired, ", "), ")");
}

// What the log-prob tolerance bounds, under the table: it is far looser
// than out's and lse's, and a reader must know why.
void AppendLogprobToleranceNote(const AuditReport& r, std::string* out) {
  const ComparisonResult* er = r.Find(Comparison::kEngineVsReference);
  if (er == nullptr || !er->has_logprob) return;
  absl::StrAppendFormat(
      out,
      "  logprob tolerance (E-R %.2g nats): the most a selected-token "
      "log-prob can move\n  when every output value is within the out "
      "tolerance (about 4 x out tolerance x\n  the largest lm_head row norm). "
      "Loose on purpose: clean drift is 1e2-1e4 times smaller,\n  so a "
      "logprob DRIFT means a cause beyond attention (temperature, sampling\n"
      "  mode, wrong token, NaN).\n",
      er->logprob.tolerance);
}

// The rolling RoPE check and the RoPE table check, one line each.
void AppendRopeChecks(const AuditReport& r, std::string* out) {
  if (r.rope_checks.empty()) return;
  absl::StrAppend(out, "rope checks:\n");
  for (const RopeCheckResult& c : r.rope_checks) {
    absl::StrAppendFormat(
        out,
        "  %-5s %-5s %d of %d elements over tolerance, max |diff| %.3g, "
        "%.0f ulp, angle %.3g rad\n",
        c.what, VerdictName(c.verdict), c.mismatches, c.count, c.max_abs,
        c.max_ulp, c.max_angle_error);
    for (const std::string& reason : c.reasons) {
      absl::StrAppend(out, "    ", reason, "\n");
    }
  }
}

// Where the drift is, as far as this report knows. The statistics give the
// worst (row, query, head, dim); the logical block and engine page need a
// diagnosis, whose section goes here once AuditReport carries one.
void AppendLocalisation(const AuditReport& r, std::string* out) {
  if (r.verdict != Verdict::kDrift) return;
  absl::StrAppend(
      out,
      "\nlocalisation: rows, queries and heads above are the engine's "
      "(row = block_table\nrow, kv head = the K/V head the query head "
      "reads). The drift statistics do not\nsay which logical block or "
      "engine page caused it: not localised in this report.\n");
}

// Why INCONCLUSIVE, the request's overrides, the hull check when it failed,
// where the engine's precision came from and what the audit could not see.
void AppendVerdictNotes(const AuditReport& r, std::string* out) {
  for (const std::string& line : r.inconclusive_reasons) {
    absl::StrAppend(out, "inconclusive: ", line, "\n");
  }
  for (const std::string& line : r.overrides) {
    absl::StrAppend(out, "overridden: ", line, "\n");
  }
  if (r.hull.present && r.hull.outside > 0) {
    absl::StrAppend(out, "hull: ", HullReason(r.hull), "\n");
  }
  const Provenance& p = r.provenance;
  if (!p.precision_source.empty()) {
    absl::StrAppend(out, "precision: ", p.precision_source,
                    p.precision_evidence.empty() ? "" : " -- ",
                    p.precision_evidence, "\n");
  }
  for (const std::string& line : p.sensitivity) {
    absl::StrAppend(out, "sensitivity: ", line, "\n");
  }
}

std::string FormatReport(const AuditReport& r) {
  std::string out;
  const SnapshotDims& d = r.dims;
  absl::StrAppend(&out, "verdict: ", VerdictName(r.verdict), FiredSummary(r),
                  r.overrides.empty() ? "" : " [overridden]", "\n");
  if (r.verdict == Verdict::kInvalid) {
    absl::StrAppend(&out, "invalid: ", r.invalid_reason, "\n");
    return out;
  }
  AppendVerdictNotes(r, &out);
  absl::StrAppend(&out, "labels:  ", LabelLine(r.labels), "\n");
  absl::StrAppendFormat(
      &out,
      "shape:   B=%d Sq=%d Hq=%d Hkv=%d D=%d page=%d  out=%s  scale=%.6g  "
      "merged blocks<=%d\n\n",
      d.batch, d.queries, d.q_heads, d.kv_heads, d.head_dim, d.page_size,
      DTypeName(r.provenance.output_dtype), r.provenance.softmax_scale,
      r.provenance.max_merged_blocks);
  if (!r.provenance.engine_profile.empty()) {
    // Before the blank line the format above ends with.
    out.pop_back();
    absl::StrAppend(
        &out, "engine:  precision profile ", r.provenance.engine_profile,
        r.provenance.rope_source.empty()
            ? ""
            : absl::StrCat(", RoPE from ", r.provenance.rope_source),
        "\n\n");
  }
  AppendComparisonTable(r, &out);
  AppendLogprobToleranceNote(r, &out);
  out += "\n";
  AppendFindings(r, &out);
  AppendRopeChecks(r, &out);
  AppendCpSection(r, &out);
  out += FormatDiagnosis(r);
  if (r.diagnoses.empty()) AppendLocalisation(r, &out);
  const StageTimings& t = r.provenance.timings;
  absl::StrAppendFormat(
      &out,
      "\ntimings: validate %.1f ms, reference %.1f ms, replay %.1f ms, "
      "compare %.1f ms, total %.1f ms (%s, %d threads)\n",
      t.validate_seconds * 1e3, t.reference_seconds * 1e3,
      t.replay_seconds * 1e3, t.compare_seconds * 1e3, t.total_seconds * 1e3,
      r.provenance.backend, r.provenance.threads);
  if (t.diagnosis_seconds > 0) {
    absl::StrAppendFormat(&out, "timings: diagnosis %.1f ms\n",
                          t.diagnosis_seconds * 1e3);
  }
  AppendFingerprints(r.provenance, &out);
  return out;
}

std::string FormatSnapshotSummary(const Snapshot& s) {
  std::string out;
  const SnapshotDims d = DimsOf(s);
  auto tensor = [&](absl::string_view name, const Tensor& t) {
    if (!t.present()) return;
    absl::StrAppendFormat(&out, "  %-20s %-26s %s\n", name, t.DebugString(),
                          Bytes(static_cast<int64_t>(t.bytes().size())));
  };
  absl::StrAppend(&out, "labels:   ", LabelLine(s.labels), "\n");
  absl::StrAppendFormat(
      &out,
      "shape:    B=%d Sq=%d Hq=%d Hkv=%d D=%d pages=%d page_size=%d "
      "max_blocks=%d layout=%s\n",
      d.batch, d.queries, d.q_heads, d.kv_heads, d.head_dim, d.num_pages,
      d.page_size, d.max_blocks, LayoutName(s.kv_layout));
  absl::StrAppendFormat(
      &out, "rope:     q=%s k=%s style=%s theta=%g rotary_dim=%d scaling=%s\n",
      RopeStateName(s.rope.q_state), RopeStateName(s.rope.k_state),
      RopeStyleName(s.rope.style), s.rope.theta, s.rope.rotary_dim,
      ScalingText(s.rope.scaling));
  absl::StrAppendFormat(
      &out, "engine:   precision=%s rope_table=%s pre_rope=%s%s\n",
      EngineProfileName(s.precision.profile),
      s.rope_table.positions.present()  ? "rows"
      : s.rope_table.inv_freq.present() ? "inv_freq"
                                        : "none",
      s.pre_rope.q.present() ? "q" : "", s.pre_rope.k.present() ? "k" : "");
  absl::StrAppendFormat(
      &out,
      "variant:  scale=%g window=%d%s softcap=%g sinks=%s cp_world=%d%s\n",
      EffectiveScale(s), s.sliding_window,
      s.sliding_window > 0
          ? absl::StrCat(" (", WindowConventionName(s.window_convention), ")")
          : "",
      s.logit_softcap, s.sinks.present() ? "yes" : "no", s.cp.world_size,
      s.cp.world_size > 1
          ? absl::StrCat(" cp_sharding=", CpShardingName(s.cp.sharding))
          : "");
  if (s.prefix.enabled) {
    absl::StrAppend(&out, "prefix:   key=", s.prefix.key,
                    " length=", s.prefix.length,
                    " fingerprint=", s.prefix.fingerprint, "\n");
  }
  absl::StrAppend(&out, "tensors:\n");
  tensor("q", s.q);
  tensor("k_pages", s.k_pages);
  tensor("v_pages", s.v_pages);
  tensor("k_scale", s.k_scale);
  tensor("v_scale", s.v_scale);
  tensor("page_ids", s.page_ids);
  tensor("block_table", s.block_table);
  tensor("kv_seq_lens", s.kv_seq_lens);
  tensor("query_positions", s.query_positions);
  tensor("slot_positions", s.slot_positions);
  tensor("key_rope_positions", s.key_rope_positions);
  tensor("sinks", s.sinks);
  tensor("engine.out", s.engine.out);
  tensor("engine.lse", s.engine.lse);
  tensor("engine.logprobs", s.engine.logprobs);
  tensor("selected_token_ids", s.selected_token_ids);
  tensor("lm_head", s.lm_head);
  tensor("active_mask", s.active_mask);
  tensor("cp.block_owners", s.cp.block_owners);
  tensor("cp.rank_out", s.cp.rank_out);
  tensor("cp.rank_lse", s.cp.rank_lse);
  tensor("pre_rope.q", s.pre_rope.q);
  tensor("pre_rope.k", s.pre_rope.k);
  tensor("rope_table.inv_freq", s.rope_table.inv_freq);
  tensor("rope_table.positions", s.rope_table.positions);
  tensor("rope_table.cos", s.rope_table.cos);
  tensor("rope_table.sin", s.rope_table.sin);
  int64_t total = 0;
  for (const Tensor* t : {&s.q, &s.k_pages, &s.v_pages, &s.block_table,
                          &s.slot_positions, &s.engine.out, &s.lm_head}) {
    total += static_cast<int64_t>(t->bytes().size());
  }
  absl::StrAppend(&out, "total (main tensors): ", Bytes(total), "\n");
  if (s.engine.out.present()) {
    absl::StrAppend(&out, "engine lse base: ",
                    s.engine.lse_base == LseBase::kE ? "e" : "2", "\n");
  }
  if (s.prefix.enabled) {
    absl::StrAppend(&out, "prefix fingerprint scheme: ",
                    PrefixSchemeName(s.prefix.scheme), "\n");
  }
  return out;
}

int PrintReport(absl::string_view command, const AuditReport& report,
                bool json) {
  // Flushed here, not at exit: a caller reading the report gets it before
  // the process releases the snapshot (unmapping W1's 130 MiB file takes a
  // few ms).
  if (!json) {
    std::cout << FormatReport(report) << std::flush;
    return ExitCodeFor(report.verdict);
  }
  absl::StatusOr<std::string> text = ReportToJson(report);
  if (!text.ok()) {
    std::cerr << "attnaudit " << command << ": " << text.status() << "\n";
    return kExitError;
  }
  std::cout << *text << "\n" << std::flush;
  return ExitCodeFor(report.verdict);
}

}  // namespace attnaudit::client
