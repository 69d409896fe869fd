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

namespace {

int Gravity(Verdict v) {
  switch (v) {
    case Verdict::kInvalid:
      return 4;
    case Verdict::kDrift:
      return 3;
    case Verdict::kInconclusive:
      return 2;
    case Verdict::kPass:
      return 1;
    case Verdict::kUnspecified:
      break;
  }
  return 0;
}

}  // namespace

Verdict WorseVerdict(Verdict a, Verdict b) {
  return Gravity(a) >= Gravity(b) ? a : b;
}

absl::string_view ComparisonName(Comparison c) {
  switch (c) {
    case Comparison::kEngineVsReference:
      return "engine_vs_reference";
    case Comparison::kReplayVsReference:
      return "replay_vs_reference";
    case Comparison::kEngineVsReplay:
      return "engine_vs_replay";
    case Comparison::kEngineVsEmulation:
      return "engine_vs_emulation";
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
    case Comparison::kEngineVsEmulation:
      return "E-M";
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
