#include "client/cli/report_printer.h"

#include <algorithm>
#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/diagnosis_printer.h"
#include "proto/codec/codec.h"

namespace attnaudit::client {
namespace {

std::string Loc(const Location& l) {
  std::string s = absl::StrCat("b=", l.batch, " s=", l.query);
  if (l.head >= 0) absl::StrAppend(&s, " h=", l.head);
  if (l.dim >= 0) absl::StrAppend(&s, " d=", l.dim);
  return s;
}

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

std::string LabelLine(const Labels& l) {
  std::vector<std::string> parts;
  if (!l.model.empty()) parts.push_back(absl::StrCat("model=", l.model));
  if (l.layer >= 0) parts.push_back(absl::StrCat("layer=", l.layer));
  if (!l.engine.empty()) parts.push_back(absl::StrCat("engine=", l.engine));
  if (!l.backend.empty()) parts.push_back(absl::StrCat("backend=", l.backend));
  if (l.step >= 0) parts.push_back(absl::StrCat("step=", l.step));
  return parts.empty() ? "(none)" : absl::StrJoin(parts, " ");
}

}  // namespace

int ExitCodeFor(Verdict verdict) {
  switch (verdict) {
    case Verdict::kPass:
      return kExitPass;
    case Verdict::kDrift:
      return kExitDrift;
    default:
      return kExitError;
  }
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

// Per comparison: its verdict, the reasons, the worst locations and heads,
// the log-prob agreement.
void AppendFindings(const AuditReport& r, std::string* out_ptr) {
  std::string& out = *out_ptr;
  for (const ComparisonResult& c : r.comparisons) {
    absl::StrAppend(&out, ComparisonShortName(c.comparison), " (",
                    ComparisonName(c.comparison), "): ", VerdictName(c.verdict),
                    "\n");
    for (const std::string& reason : c.reasons) {
      absl::StrAppend(&out, "    ", reason, "\n");
    }
    if (c.has_out && c.out.max_abs > 0) {
      absl::StrAppendFormat(&out, "    worst out at %s: %.9g vs %.9g\n",
                            Loc(c.out.worst), c.out.worst_candidate,
                            c.out.worst_baseline);
    }
    if (c.has_lse && c.lse.max_abs > 0) {
      absl::StrAppendFormat(&out, "    worst lse at %s: %.9g vs %.9g\n",
                            Loc(c.lse.worst), c.lse.worst_candidate,
                            c.lse.worst_baseline);
    }
    if (!c.worst_heads.empty() && c.has_out && c.out.max_abs > 0) {
      std::vector<std::string> heads;
      for (const HeadSummary& h : c.worst_heads) {
        heads.push_back(absl::StrFormat("h%d %.2e", h.head, h.max_abs));
      }
      absl::StrAppend(&out, "    worst heads: ", absl::StrJoin(heads, ", "),
                      "\n");
    }
    if (c.has_logprob && c.logprob_agreement.count > 0) {
      const LogprobAgreement& a = c.logprob_agreement;
      absl::StrAppendFormat(
          &out,
          "    log-prob: %d tokens, mean|diff| %.3e, k1 %.3e, k3 %.3e, "
          "ratio [%.6f, %.6f]\n",
          a.count, a.mean_abs_diff, a.k1_kl, a.k3_kl, a.ratio_min, a.ratio_max);
    }
  }
}

std::string FormatReport(const AuditReport& r) {
  std::string out;
  const SnapshotDims& d = r.dims;
  absl::StrAppend(&out, "verdict: ", VerdictName(r.verdict), "\n");
  if (r.verdict == Verdict::kInvalid) {
    absl::StrAppend(&out, "invalid: ", r.invalid_reason, "\n");
    return out;
  }
  absl::StrAppend(&out, "labels:  ", LabelLine(r.labels), "\n");
  absl::StrAppendFormat(
      &out,
      "shape:   B=%d Sq=%d Hq=%d Hkv=%d D=%d page=%d  out=%s  scale=%.6g  "
      "merged blocks<=%d\n\n",
      d.batch, d.queries, d.q_heads, d.kv_heads, d.head_dim, d.page_size,
      DTypeName(r.provenance.output_dtype), r.provenance.softmax_scale,
      r.provenance.max_merged_blocks);
  AppendComparisonTable(r, &out);
  out += "\n";
  AppendFindings(r, &out);
  out += FormatDiagnosis(r);
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
  if (!r.provenance.prefix_fingerprint.empty()) {
    absl::StrAppend(&out,
                    "prefix fingerprint: ", r.provenance.prefix_fingerprint,
                    " (verified)\n");
  }
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
      d.page_size, d.max_blocks, s.kv_layout == KvLayout::kNHD ? "NHD" : "HND");
  absl::StrAppendFormat(
      &out, "rope:     q=%s k=%s style=%s theta=%g rotary_dim=%d scaling=%d\n",
      s.rope.q_state == RopeState::kPreRope ? "pre" : "post",
      s.rope.k_state == RopeState::kPreRope ? "pre" : "post",
      s.rope.style == RopeStyle::kNeox ? "neox" : "gptj", s.rope.theta,
      s.rope.rotary_dim, static_cast<int>(s.rope.scaling.type));
  absl::StrAppendFormat(
      &out, "variant:  scale=%g window=%d softcap=%g sinks=%s cp_world=%d\n",
      EffectiveScale(s), s.sliding_window, s.logit_softcap,
      s.sinks.present() ? "yes" : "no", s.cp.world_size);
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
  return out;
}

int PrintReport(absl::string_view command, const AuditReport& report,
                bool json) {
  if (!json) {
    std::cout << FormatReport(report);
    return ExitCodeFor(report.verdict);
  }
  absl::StatusOr<std::string> text = ReportToJson(report);
  if (!text.ok()) {
    std::cerr << "attnaudit " << command << ": " << text.status() << "\n";
    return kExitError;
  }
  std::cout << *text << "\n";
  return ExitCodeFor(report.verdict);
}

}  // namespace attnaudit::client
