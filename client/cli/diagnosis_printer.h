// The diagnosis of a drifting report in plain words, for the CLI's report
// printer: the top hypothesis as one sentence, the runners-up by name and
// score, and what the diagnosis examined. Pure functions.
#ifndef ATTNAUDIT_CLIENT_CLI_DIAGNOSIS_PRINTER_H_
#define ATTNAUDIT_CLIENT_CLI_DIAGNOSIS_PRINTER_H_

#include <string>

#include "core/report/report.h"

namespace attnaudit::client {

// Empty when the diagnosis did not run; else lines ending with a newline,
// the first "diagnosis: <the top one's summary>".
std::string FormatDiagnosis(const AuditReport& report);

}  // namespace attnaudit::client

#endif  // ATTNAUDIT_CLIENT_CLI_DIAGNOSIS_PRINTER_H_
