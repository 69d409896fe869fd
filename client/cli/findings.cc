#include "client/cli/findings.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace attnaudit::client {
namespace {

// "values" for the per-element quantities, "tokens" for log-probs.
absl::string_view Unit(Quantity q) {
  return q == Quantity::kLogprob ? "tokens" : "values";
}

// Log-probs are in nats; the others carry no unit.
absl::string_view Nats(Quantity q) {
  return q == Quantity::kLogprob ? " nats" : "";
}

// The first line of a finding that fired: how many are over the tolerance
// (or NaN/Inf on one side only) and the largest |diff|.
std::string FiredHead(const Finding& f) {
  const DriftStats& s = *f.stats;
  std::vector<std::string> parts;
  if (s.over_tolerance > 0) {
    parts.push_back(absl::StrFormat(
        "%d of %d %s over the tolerance %.1e%s, the largest %.1e",
        s.over_tolerance, s.count, Unit(f.quantity), s.tolerance,
        Nats(f.quantity), s.max_abs));
  }
  if (s.nonfinite_mismatch > 0) {
    parts.push_back(absl::StrFormat(
        "%d %s NaN/Inf on one side only (%s %d NaN, %d Inf; %s %d NaN, "
        "%d Inf)",
        s.nonfinite_mismatch, Unit(f.quantity), CandidateName(f.comparison),
        s.candidate_nan, s.candidate_inf, BaselineName(f.comparison),
        s.baseline_nan, s.baseline_inf));
  }
  return absl::StrJoin(parts, "; ");
}

// Where the finding's worst value is: the argmax |diff|, or the first
// non-finite mismatch when only those fired.
const Location& WorstOf(const DriftStats& s) {
  return s.over_tolerance == 0 && s.nonfinite_mismatch > 0
             ? s.first_nonfinite_mismatch
             : s.worst;
}

}  // namespace

EngineLocation ToEngineLocation(const Location& l, const SnapshotDims& dims) {
  EngineLocation e;
  e.row = l.batch;
  e.query = l.query;
  e.head = l.head;
  e.dim = l.dim;
  const int64_t group = dims.group();
  if (l.head >= 0 && group > 0) e.kv_head = l.head / group;
  return e;
}

std::string FormatEngineLocation(const EngineLocation& l) {
  std::string s = absl::StrCat("row ", l.row, ", query ", l.query);
  if (l.head >= 0) absl::StrAppend(&s, ", head ", l.head);
  if (l.kv_head >= 0) absl::StrAppend(&s, " (kv head ", l.kv_head, ")");
  if (l.dim >= 0) absl::StrAppend(&s, ", dim ", l.dim);
  if (l.logical_block >= 0) {
    absl::StrAppend(&s, ", logical block ", l.logical_block);
  }
  if (l.page_id >= 0) absl::StrAppend(&s, ", page ", l.page_id);
  return s;
}

absl::string_view CandidateName(Comparison c) {
  return c == Comparison::kReplayVsReference ? "replay" : "engine";
}

absl::string_view BaselineName(Comparison c) {
  switch (c) {
    case Comparison::kEngineVsReplay:
      return "replay";
    case Comparison::kEngineVsEmulation:
      return "emulated engine";
    case Comparison::kEngineVsReference:
    case Comparison::kReplayVsReference:
      break;
  }
  return "reference";
}

bool Finding::fired() const {
  return stats != nullptr &&
         (stats->over_tolerance > 0 || stats->nonfinite_mismatch > 0);
}

std::vector<Finding> FindingsOf(const AuditReport& r) {
  std::vector<Finding> out;
  for (const ComparisonResult& c : r.comparisons) {
    if (c.has_out) out.push_back({c.comparison, Quantity::kOut, &c.out});
    if (c.has_lse) out.push_back({c.comparison, Quantity::kLse, &c.lse});
    if (c.has_logprob) {
      out.push_back({c.comparison, Quantity::kLogprob, &c.logprob});
    }
  }
  return out;
}

std::string DescribeFinding(const Finding& f, const SnapshotDims& dims,
                            absl::string_view indent) {
  const DriftStats& s = *f.stats;
  const std::string where =
      FormatEngineLocation(ToEngineLocation(WorstOf(s), dims));
  if (!f.fired()) {
    return absl::StrFormat(
        "%s%s: within the tolerance %.1e%s, the largest %.1e at %s\n", indent,
        QuantityName(f.quantity), s.tolerance, Nats(f.quantity), s.max_abs,
        where);
  }
  std::string out = absl::StrCat(indent, QuantityName(f.quantity), ": ",
                                 FiredHead(f), "\n", indent, "  at ", where);
  if (s.over_tolerance > 0) {
    absl::StrAppendFormat(&out, ": %s %.9g, %s %.9g",
                          CandidateName(f.comparison), s.worst_candidate,
                          BaselineName(f.comparison), s.worst_baseline);
  } else {
    absl::StrAppend(&out, " (the first)");
  }
  return out + "\n";
}

std::string ReasonLine(const AuditReport& r) {
  if (r.verdict == Verdict::kInvalid) {
    return absl::StrCat("invalid: ", r.invalid_reason);
  }
  const std::vector<Finding> findings = FindingsOf(r);
  const Finding* first = nullptr;
  std::vector<std::string> also;
  for (const Finding& f : findings) {
    if (!f.fired()) continue;
    if (first == nullptr) {
      first = &f;
    } else {
      also.push_back(absl::StrCat(ComparisonShortName(f.comparison), " ",
                                  QuantityName(f.quantity)));
    }
  }
  if (first != nullptr) {
    std::string line = absl::StrCat(
        ComparisonShortName(first->comparison), " ",
        QuantityName(first->quantity), ": ", FiredHead(*first), " at ",
        FormatEngineLocation(ToEngineLocation(WorstOf(*first->stats), r.dims)));
    if (!also.empty()) {
      absl::StrAppend(&line, "; also fired: ", absl::StrJoin(also, ", "));
    }
    return line;
  }
  for (const Finding& f : findings) {
    if (f.comparison == Comparison::kEngineVsReference &&
        f.quantity == Quantity::kOut) {
      return absl::StrFormat(
          "E-R out: the largest %.1e within the tolerance "
          "%.1e",
          f.stats->max_abs, f.stats->tolerance);
    }
  }
  if (r.verdict == Verdict::kDrift) {
    // Fired for a reason the statistics do not carry (e.g. undecided).
    for (const ComparisonResult& c : r.comparisons) {
      if (!c.reasons.empty()) {
        return absl::StrCat(ComparisonShortName(c.comparison), " ",
                            c.reasons.front());
      }
    }
  }
  return "no comparison";
}

}  // namespace attnaudit::client
