#include "client/cli/cp_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnaudit::client {
namespace {

constexpr size_t kMaxRows = 12;

const char* ShardingName(CpSharding s) {
  switch (s) {
    case CpSharding::kExplicitOwners:
      return "owners";
    case CpSharding::kTokenInterleaved:
      return "interleave";
    case CpSharding::kPageInterleaved:
      return "page";
    case CpSharding::kNone:
      break;
  }
  return "none";
}

// "PASS (out 1.2e-03 / 3.9e-03, lse ...)": max_abs against tolerance.
std::string Summary(const CpCheck& c) {
  std::string s(VerdictName(c.verdict));
  std::string parts;
  if (c.has_out) {
    absl::StrAppendFormat(&parts, "out %.2e/%.2e", c.out.max_abs,
                          c.out.tolerance);
  }
  if (c.has_lse) {
    absl::StrAppendFormat(&parts, "%slse %.2e/%.2e", parts.empty() ? "" : ", ",
                          c.lse.max_abs, c.lse.tolerance);
  }
  if (!parts.empty()) absl::StrAppend(&s, " (", parts, ")");
  return s;
}

std::string Cell(const DriftStats& st, bool has) {
  if (!has) return absl::StrFormat("%21s", "-");
  if (st.nonfinite_mismatch > 0) {
    return absl::StrFormat("%21s",
                           absl::StrCat(st.nonfinite_mismatch, " non-finite"));
  }
  return absl::StrFormat("%10.3e %10.3e", st.max_abs, st.tolerance);
}

void AppendReasons(const CpCheck& c, std::string* out) {
  for (const std::string& reason : c.reasons) {
    absl::StrAppend(out, "    ", reason, "\n");
  }
}

}  // namespace

void AppendCpSection(const AuditReport& r, std::string* out) {
  const CpReport& cp = r.cp;
  if (!cp.present) return;
  absl::StrAppendFormat(out, "\ncontext parallelism: W=%d %s", cp.world_size,
                        ShardingName(cp.sharding));
  if (cp.sharding == CpSharding::kTokenInterleaved) {
    absl::StrAppend(out, " I=", cp.interleave_size);
  }
  absl::StrAppend(out, ", strategy ", cp.strategy,
                  cp.strategy_chosen ? " (auto)" : "");
  if (!cp.skipped.empty()) {
    absl::StrAppend(out, "\n  replay skipped: ", cp.skipped, "\n");
    return;
  }
  absl::StrAppendFormat(out, ", %d rounds, %d steps, %s on %d worker(s)\n",
                        cp.rounds, cp.steps, cp.execution, cp.workers);
  absl::StrAppend(out, "  replay, engine order: ", Summary(cp.engine_order),
                  "\n  replay, unit order:   ", Summary(cp.deterministic),
                  cp.deterministic_matches_replay ? ", = P bit for bit"
                                                  : ", DIFFERS from P",
                  "\n");
  if (!cp.ranks.empty()) {
    absl::StrAppendFormat(out, "  %-4s %8s %7s %-7s %21s %21s\n", "rank",
                          "keys", "empty", "verdict", "out max_abs / tol",
                          "lse max_abs / tol");
    // Short for large worlds: every drifting rank, passing ones up to
    // kMaxRows rows.
    size_t shown = 0, passing = 0;
    for (const CpRankCheck& k : cp.ranks) {
      const bool pass = k.check.verdict == Verdict::kPass;
      passing += pass;
      if (pass && shown >= kMaxRows) continue;
      shown += pass;
      absl::StrAppendFormat(
          out, "  %-4d %8d %7d %-7s %s %s\n", k.rank, k.tokens, k.empty_queries,
          VerdictName(k.check.verdict), Cell(k.check.out, k.check.has_out),
          Cell(k.check.lse, k.check.has_lse));
    }
    if (passing > shown) {
      absl::StrAppendFormat(out, "  (%d more ranks PASS)\n", passing - shown);
    }
    for (const CpRankCheck& k : cp.ranks) {
      if (k.check.verdict != Verdict::kDrift) continue;
      absl::StrAppend(out, "  rank ", k.rank, ":\n");
      AppendReasons(k.check, out);
    }
  }
  if (cp.has_combine) {
    absl::StrAppend(out, "  combine (engine vs merge of its partials): ",
                    Summary(cp.combine), "\n");
    AppendReasons(cp.combine, out);
  }
  const StageTimings& t = r.provenance.timings;
  if (!t.cp_rank_compute_seconds.empty()) {
    double busiest = 0;
    for (double s : t.cp_rank_compute_seconds) busiest = std::max(busiest, s);
    absl::StrAppendFormat(out,
                          "  cp timings: %.1f ms, busiest rank %.1f ms "
                          "compute\n",
                          t.cp_seconds * 1e3, busiest * 1e3);
  }
}

}  // namespace attnaudit::client
