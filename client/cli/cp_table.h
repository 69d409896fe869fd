// The context-parallel part of the human-readable report (`attnaudit
// check` and `audit`): the CP run in one line, our replay's two combines,
// one row per rank (its partial against the reference partial over its
// shard) and the combine check. Pure function; nothing for reports without
// a CP section.
#ifndef ATTNAUDIT_CLIENT_CLI_CP_TABLE_H_
#define ATTNAUDIT_CLIENT_CLI_CP_TABLE_H_

#include <string>

#include "core/report/report.h"

namespace attnaudit::client {

// Appends the section (ending with a newline) to *out.
void AppendCpSection(const AuditReport& report, std::string* out);

}  // namespace attnaudit::client

#endif  // ATTNAUDIT_CLIENT_CLI_CP_TABLE_H_
