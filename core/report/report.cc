#include "core/report/report.h"

namespace attnaudit {

absl::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kDrift:
      return "DRIFT";
    case Verdict::kInvalid:
      return "INVALID";
    case Verdict::kInconclusive:
      return "INCONCLUSIVE";
    case Verdict::kUnspecified:
      break;
  }
  return "UNSPECIFIED";
}

absl::string_view ComparisonName(Comparison c) {
  switch (c) {
    case Comparison::kEngineVsReference:
      return "engine_vs_reference";
    case Comparison::kReplayVsReference:
      return "replay_vs_reference";
    case Comparison::kEngineVsReplay:
      return "engine_vs_replay";
  }
  return "unknown";
}

absl::string_view ComparisonShortName(Comparison c) {
  switch (c) {
    case Comparison::kEngineVsReference:
      return "E-R";
    case Comparison::kReplayVsReference:
      return "P-R";
    case Comparison::kEngineVsReplay:
      return "E-P";
  }
  return "?";
}

absl::string_view QuantityName(Quantity q) {
  switch (q) {
    case Quantity::kOut:
      return "out";
    case Quantity::kLse:
      return "lse";
    case Quantity::kLogprob:
      return "logprob";
  }
  return "unknown";
}

const ComparisonResult* AuditReport::Find(Comparison c) const {
  for (const ComparisonResult& r : comparisons) {
    if (r.comparison == c) return &r;
  }
  return nullptr;
}

}  // namespace attnaudit
