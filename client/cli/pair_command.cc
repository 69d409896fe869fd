// attnaudit pair ROLLOUT TRAINER [--json] [--threads N]: the train-rollout
// pair comparison offline (core/pairs): both snapshot files read as `check`
// reads them, each audited in process, their rows paired and judged.
#include <cmath>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/commands.h"
#include "core/audit/audit.h"
#include "core/pairs/pairs.h"
#include "proto/codec/codec.h"

namespace attnaudit::client::cli_internal {
namespace {

struct PairCommand {
  std::string rollout;
  std::string trainer;
  bool json = false;
  int threads = 0;
};

int Fail(absl::string_view message) {
  std::cerr << "attnaudit pair: " << message << "\n";
  return kExitError;
}

// A snapshot file read and audited; the error names the side.
struct AuditedSide {
  Snapshot snapshot;
  AuditReport report;
};

absl::StatusOr<AuditedSide> ReadAndAudit(const std::string& path,
                                         absl::string_view side, int threads) {
  AuditedSide out;
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(path);
  if (!snapshot.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(side, " ", path, ": ", snapshot.status().message()));
  }
  out.snapshot = *std::move(snapshot);
  AuditOptions options;
  options.threads = threads;
  absl::StatusOr<AuditReport> report = RunAudit(out.snapshot, options);
  if (!report.ok()) {
    return absl::InternalError(
        absl::StrCat(side, " ", path, ": ", report.status().message()));
  }
  if (report->verdict == Verdict::kInvalid) {
    return absl::InvalidArgumentError(absl::StrCat(
        side, " ", path, ": invalid snapshot: ", report->invalid_reason));
  }
  out.report = *std::move(report);
  return out;
}

// ---------------------------------------------------------------------------
// JSON, with the Python PairReport's and RowPair's field names.

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(double x) {
  return std::isfinite(x) ? absl::StrFormat("%.17g", x) : "null";
}

std::string JsonVerdict(Verdict v) {
  return v == Verdict::kUnspecified ? "null" : JsonString(VerdictName(v));
}

std::string JsonOptional(const std::string& s) {
  return s.empty() ? "null" : JsonString(s);
}

std::string RowJson(const RowPair& r) {
  return absl::StrCat(
      "{\"request_id\": ", JsonString(r.request_id),
      ", \"position\": ", r.position, ", \"rollout_row\": ", r.rollout_row,
      ", \"trainer_row\": ", r.trainer_row,
      ", \"out_bitwise\": ", r.out_bitwise ? "true" : "false",
      ", \"out_max_abs\": ", JsonNumber(r.out_max_abs),
      ", \"out_max_ulps\": ", JsonNumber(r.out_max_ulps),
      ", \"q_ulps\": ", JsonNumber(r.q_ulps),
      ", \"kv_ulps\": ", JsonNumber(r.kv_ulps),
      ", \"newest_kv_ulps\": ", JsonNumber(r.newest_kv_ulps),
      ", \"keys_compared\": ", r.keys_compared,
      ", \"input_effect\": ", JsonNumber(r.input_effect),
      ", \"noise\": ", JsonNumber(r.noise),
      ", \"verdict\": ", JsonString(PairVerdictName(r.verdict)),
      ", \"inputs_differing\": ", JsonString(r.InputsDiffering()), "}");
}

std::string ReportJson(const PairReport& p) {
  std::vector<std::string> rows;
  for (const RowPair& r : p.rows) rows.push_back(RowJson(r));
  const std::optional<PairVerdict> verdict = p.verdict();
  return absl::StrCat(
      "{\"layer\": ", p.layer < 0 ? "null" : absl::StrCat(p.layer),
      ", \"rows\": [", absl::StrJoin(rows, ", "),
      "], \"rollout_verdict\": ", JsonVerdict(p.rollout_verdict),
      ", \"trainer_verdict\": ", JsonVerdict(p.trainer_verdict),
      ", \"rollout_diagnosis\": ", JsonOptional(p.rollout_diagnosis),
      ", \"trainer_diagnosis\": ", JsonOptional(p.trainer_diagnosis),
      ", \"unmatched_rollout\": ", p.unmatched_rollout,
      ", \"unmatched_trainer\": ", p.unmatched_trainer, ", \"verdict\": ",
      verdict ? JsonString(PairVerdictName(*verdict)) : "null", "}\n");
}

// ---------------------------------------------------------------------------
// The human table.

std::string SideLine(absl::string_view side, Verdict verdict,
                     const std::string& diagnosis) {
  return absl::StrCat(side, ": ", VerdictName(verdict),
                      diagnosis.empty() ? "" : "; diagnosis ", diagnosis, "\n");
}

std::string FormatPairs(const PairReport& p) {
  const std::optional<PairVerdict> verdict = p.verdict();
  std::string out = absl::StrCat(
      "pair layer ", p.layer < 0 ? "-" : absl::StrCat(p.layer), ": ",
      verdict ? PairVerdictName(*verdict)
              : "no common (request, position) rows",
      " (", p.rows.size(), " pairs; ", p.unmatched_rollout, " rollout, ",
      p.unmatched_trainer, " trainer rows unmatched)\n");
  absl::StrAppend(&out,
                  SideLine("rollout", p.rollout_verdict, p.rollout_diagnosis),
                  SideLine("trainer", p.trainer_verdict, p.trainer_diagnosis));
  if (p.rows.empty()) return out;
  absl::StrAppend(
      &out, absl::StrFormat("%-24s %8s  %-16s %10s %8s %8s  %s\n", "request",
                            "position", "verdict", "out ulps", "q ulps",
                            "kv ulps", "effect/noise"));
  for (const RowPair& r : p.rows) {
    absl::StrAppend(
        &out,
        absl::StrFormat("%-24s %8d  %-16s %10.3g %8.3g %8.3g  %.3g/%.3g\n",
                        r.request_id, r.position, PairVerdictName(r.verdict),
                        r.out_max_ulps, r.q_ulps, r.kv_ulps, r.input_effect,
                        r.noise));
  }
  return out;
}

int RunPair(const PairCommand& o) {
  absl::StatusOr<AuditedSide> rollout =
      ReadAndAudit(o.rollout, "rollout", o.threads);
  if (!rollout.ok()) return Fail(rollout.status().message());
  absl::StatusOr<AuditedSide> trainer =
      ReadAndAudit(o.trainer, "trainer", o.threads);
  if (!trainer.ok()) return Fail(trainer.status().message());
  absl::StatusOr<PairReport> pairs =
      ComparePairs(rollout->snapshot, trainer->snapshot, &rollout->report,
                   &trainer->report, o.threads);
  if (!pairs.ok()) return Fail(pairs.status().message());
  std::cout << (o.json ? ReportJson(*pairs) : FormatPairs(*pairs));
  const std::optional<PairVerdict> verdict = pairs->verdict();
  return !verdict || *verdict <= PairVerdict::kWithinNoise ? kExitPass
                                                           : kExitDrift;
}

}  // namespace

void AddPairCommand(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<PairCommand>(
      app, exit_code, "pair",
      "compare a rollout's and a trainer's snapshot of the same rows (exit 0 "
      "consistent or within-noise, 1 otherwise, 2 invalid)",
      "Reads a rollout snapshot and a trainer snapshot of the same layer, "
      "audits\neach offline, joins their rows by (request id, query "
      "position) and gives each\npair a verdict: consistent, within-noise, "
      "inputs-differ, stale-prefix-kv,\nrollout-drift, trainer-drift or "
      "both-drift (the rules of attnaudit.pairs;\nsee docs/PYTHON.md). Exit 0 "
      "when every pair is consistent or within-noise, 1\notherwise, 2 "
      "invalid input or error.",
      &RunPair);
  command->add_option("ROLLOUT", o->rollout, "the rollout's snapshot file")
      ->required();
  command->add_option("TRAINER", o->trainer, "the trainer's snapshot file")
      ->required();
  command->add_flag("--json", o->json,
                    "print the PairReport as JSON (attnaudit.pairs' field "
                    "names)");
  command->add_option("--threads", o->threads, "threads (0: all cores)")
      ->check(CLI::Range(0, 4096));
}

}  // namespace attnaudit::client::cli_internal
