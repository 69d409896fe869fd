// Human-readable rendering of an AuditReport and of a snapshot summary, for
// `attnaudit check`, `audit` and `inspect` (pure functions), and the
// printing of a report with its exit code.
#ifndef ATTNAUDIT_CLIENT_CLI_REPORT_PRINTER_H_
#define ATTNAUDIT_CLIENT_CLI_REPORT_PRINTER_H_

#include <string>

#include "absl/strings/string_view.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit::client {

// Verdict, a table of comparisons x quantities, worst locations and heads,
// log-prob agreement, timings. Ends with a newline.
std::string FormatReport(const AuditReport& report);

// Shapes, dtypes, sizes and labels of a snapshot (no validation needed).
std::string FormatSnapshotSummary(const Snapshot& snapshot);

// The CLI's exit codes.
constexpr int kExitPass = 0;
constexpr int kExitDrift = 1;
constexpr int kExitError = 2;  // invalid input or an error
// Nothing drifted, but the audit could not verify what a PASS promises.
constexpr int kExitInconclusive = 3;

// Exit code for a verdict: 0 PASS, 1 DRIFT, 2 INVALID/unspecified,
// 3 INCONCLUSIVE.
int ExitCodeFor(Verdict verdict);

// Writes `report` to stdout (FormatReport, or proto3 JSON when `json`) and
// returns ExitCodeFor its verdict; kExitError, with "attnaudit COMMAND: ..."
// on stderr, when it cannot be converted to JSON.
int PrintReport(absl::string_view command, const AuditReport& report,
                bool json);

}  // namespace attnaudit::client

#endif  // ATTNAUDIT_CLIENT_CLI_REPORT_PRINTER_H_
