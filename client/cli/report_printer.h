// Human-readable rendering of an AuditReport and of a snapshot summary, for
// `attnaudit check`, `audit` and `inspect`. Pure functions.
#ifndef ATTNAUDIT_CLIENT_CLI_REPORT_PRINTER_H_
#define ATTNAUDIT_CLIENT_CLI_REPORT_PRINTER_H_

#include <string>

#include "core/report/report.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit::cli {

// Verdict, a table of comparisons x quantities, worst locations and heads,
// log-prob agreement, timings. Ends with a newline.
std::string FormatReport(const AuditReport& report);

// Shapes, dtypes, sizes and labels of a snapshot (no validation needed).
std::string FormatSnapshotSummary(const Snapshot& snapshot);

// Exit code for a verdict: 0 PASS, 1 DRIFT, 2 INVALID/unspecified.
int ExitCodeFor(Verdict verdict);

}  // namespace attnaudit::cli

#endif  // ATTNAUDIT_CLIENT_CLI_REPORT_PRINTER_H_
