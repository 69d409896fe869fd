// The audit pipeline: validate -> prepare (RoPE, fp8 dequant) -> reference R
// and replay P (one fused pass over the KV) -> drift per comparison ->
// verdict. This is what `attnaudit check` and the service's workers run.
//
// RunAudit never fails for bad input: an invalid snapshot yields a report
// with verdict INVALID and invalid_reason naming the field; its Status is
// non-OK only for internal errors. AuditSnapshot is the Status-returning
// form used where INVALID must become an RPC error. Thread-safe: concurrent
// calls share nothing; each call uses up to options.threads threads.
#ifndef ATTNAUDIT_CORE_AUDIT_AUDIT_H_
#define ATTNAUDIT_CORE_AUDIT_AUDIT_H_

#include "absl/status/statusor.h"
#include "core/audit/options.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {

// InvalidArgument for a bad snapshot, Cancelled when options.cancelled.
absl::StatusOr<AuditReport> AuditSnapshot(const Snapshot& snapshot,
                                          const AuditOptions& options);

// As AuditSnapshot, but InvalidArgument becomes a report with verdict
// INVALID.
absl::StatusOr<AuditReport> RunAudit(const Snapshot& snapshot,
                                     const AuditOptions& options);

// Whether the request departs from the verdict policy: a tolerance
// override, the statistical test off, or precision fields past every
// profile's documented range (PrecisionOverrides). Such a report lists them
// (AuditReport::overrides); a multi-tenant server asks for the `override`
// permission first.
bool OverridesPolicy(const Snapshot& snapshot, const AuditOptions& options);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_AUDIT_AUDIT_H_
