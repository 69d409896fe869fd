// attnaudit check FILE [--json] [--threads N] [--kv-fingerprint] [tolerances]
#include <iostream>
#include <string>

#include "client/cli/cli_flags.h"
#include "client/cli/commands.h"
#include "client/cli/report_printer.h"
#include "core/audit/audit.h"
#include "proto/codec/codec.h"

namespace attnaudit::client::cli_internal {
namespace {

struct CheckCommand {
  std::string file;
  bool json = false;
  int threads = 0;
  AuditFlags audit;
};

int Fail(absl::string_view message) {
  std::cerr << "attnaudit check: " << message << "\n";
  return kExitError;
}

int RunCheck(const CheckCommand& o) {
  AuditOptions options = ToAuditOptions(o.audit);
  options.threads = o.threads;
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(o.file);
  if (!snapshot.ok()) return Fail(snapshot.status().message());
  absl::StatusOr<AuditReport> report = RunAudit(*snapshot, options);
  if (!report.ok()) return Fail(report.status().message());
  const int exit_code = PrintReport("check", *report, o.json);
  if (report->verdict == Verdict::kInvalid) {
    std::cerr << "attnaudit check: invalid snapshot: " << report->invalid_reason
              << "\n";
  }
  return exit_code;
}

}  // namespace

void AddCheckCommand(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<CheckCommand>(
      app, exit_code, "check",
      "audit a snapshot file offline (exit 0 PASS, 1 DRIFT, 2 invalid, 3 "
      "INCONCLUSIVE)",
      "Audits an attnaudit.v1.Snapshot file offline: reference R (fp64), "
      "replay\nP (fp32 per-block, ordered merge) and the engine's output E, "
      "compared\nE-R, P-R, E-P. Exit 0 PASS, 1 DRIFT, 2 invalid input or "
      "error, 3 INCONCLUSIVE\n(nothing drifted, but the audit could not "
      "verify what a PASS promises).",
      &RunCheck);
  command->add_option("FILE", o->file, "snapshot file")->required();
  command->add_flag("--json", o->json, "print the report as proto3 JSON");
  command->add_option("--threads", o->threads, "threads (0: all cores)")
      ->check(CLI::Range(0, 4096));
  AddAuditFlags(command, &o->audit);
}

}  // namespace attnaudit::client::cli_internal
