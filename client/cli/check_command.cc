// attnaudit check FILE [--json] [--threads N] [--no-engine-vs-reference ...]
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/cli/args.h"
#include "client/cli/commands.h"
#include "client/cli/report_printer.h"
#include "core/audit/audit.h"
#include "proto/codec/codec.h"

namespace attnaudit::cli {
namespace {

constexpr char kCheckHelp[] =
    "usage: attnaudit check FILE [--json] [--threads N] [--kv-fingerprint]\n"
    "                       [--out-tol X] [--lse-tol X] [--logprob-tol X]\n"
    "Audits an attnaudit.v1.Snapshot file offline: reference R (fp64), replay\n"
    "P (fp32 per-block, ordered merge) and the engine's output E, compared\n"
    "E-R, P-R, E-P. Exit 0 PASS, 1 DRIFT, 2 invalid input or error.\n";

absl::Status ParseAuditFlags(const Args& args, AuditOptions* options) {
  absl::StatusOr<int64_t> threads = args.GetInt("threads", 0);
  if (!threads.ok()) return threads.status();
  options->threads = static_cast<int>(*threads);
  options->compute_kv_fingerprint = args.Has("kv-fingerprint");
  for (auto [flag, field] :
       {std::pair<const char*, double*>{"out-tol",
                                        &options->tolerances.out_abs},
        {"lse-tol", &options->tolerances.lse_abs},
        {"logprob-tol", &options->tolerances.logprob_abs}}) {
    absl::StatusOr<double> v = args.GetDouble(flag, 0);
    if (!v.ok()) return v.status();
    if (*v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " must be >= 0"));
    }
    *field = *v;
  }
  return absl::OkStatus();
}

}  // namespace

int RunCheck(const Argv& argv) {
  Args args({"threads", "out-tol", "lse-tol", "logprob-tol"},
            {"json", "kv-fingerprint", "help"});
  if (absl::Status st = args.Parse(argv); !st.ok()) {
    std::cerr << "attnaudit check: " << st.message() << "\n" << kCheckHelp;
    return kExitError;
  }
  if (args.Has("help")) {
    std::cout << kCheckHelp;
    return 0;
  }
  if (args.positional().size() != 1) {
    std::cerr << kCheckHelp;
    return kExitError;
  }
  AuditOptions options;
  if (absl::Status st = ParseAuditFlags(args, &options); !st.ok()) {
    std::cerr << "attnaudit check: " << st.message() << "\n";
    return kExitError;
  }
  const std::string& path = args.positional()[0];
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(path);
  if (!snapshot.ok()) {
    std::cerr << "attnaudit check: " << snapshot.status().message() << "\n";
    return kExitError;
  }
  absl::StatusOr<AuditReport> report = RunAudit(*snapshot, options);
  if (!report.ok()) {
    std::cerr << "attnaudit check: " << report.status().ToString() << "\n";
    return kExitError;
  }
  if (args.Has("json")) {
    absl::StatusOr<std::string> json = ReportToJson(*report);
    if (!json.ok()) {
      std::cerr << "attnaudit check: " << json.status().message() << "\n";
      return kExitError;
    }
    std::cout << *json << "\n";
  } else {
    std::cout << FormatReport(*report);
  }
  if (report->verdict == Verdict::kInvalid) {
    std::cerr << "attnaudit check: invalid snapshot: " << report->invalid_reason
              << "\n";
  }
  return ExitCodeFor(report->verdict);
}

}  // namespace attnaudit::cli
