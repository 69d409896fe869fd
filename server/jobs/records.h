// The store's records of jobs as the lifecycle writes them (QUEUED,
// terminal, finished), the job labels they carry, and the rules every
// lookup shares: who may see a job, and the client-facing form of a
// storage failure. Pure functions (records.cc), thread-safe; internal to
// server/jobs except for tests.
#ifndef ATTNAUDIT_SERVER_JOBS_RECORDS_H_
#define ATTNAUDIT_SERVER_JOBS_RECORDS_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "server/auth/tenants.h"
#include "server/jobs/jobs.h"
#include "server/scheduler/job.h"
#include "server/spool/spool.h"
#include "server/store/job_store.h"

namespace attnaudit::server::jobs_internal {

// The terminal state of a job that ended with `status`: DONE for OK,
// CANCELLED for Cancelled and DeadlineExceeded, FAILED otherwise.
JobState TerminalStateOf(const absl::Status& status);

JobLabels JobLabelsOf(const Labels& labels);
JobLabels JobLabelsOf(const ResultRecord& record);
JobLabels JobLabelsOf(const SpoolMetadata& metadata);

ResultRecord QueuedRecord(const std::string& job_id, const std::string& tenant,
                          PriorityClass priority, const JobLabels& labels,
                          absl::Time created);
// A terminal record (state from TerminalStateOf(status)), finished now.
// Status messages are stored and shown to the job's owner: callers pass
// client-safe ones (no paths).
ResultRecord TerminalRecord(const std::string& job_id,
                            const std::string& tenant, PriorityClass priority,
                            const JobLabels& labels, absl::Time created,
                            const absl::Status& status);
// The same for a job the store already knows (its labels and times).
ResultRecord TerminalRecord(const ResultRecord& known,
                            const absl::Status& status);
// The record of a finished job: TerminalRecord plus its start, and for an
// audit that ran its verdict, report (as `encode_report` writes it) and
// top diagnosis.
ResultRecord OutcomeRecord(
    const JobOutcome& outcome, absl::Time created, absl::Time started,
    const std::function<std::string(const AuditReport&)>& encode_report);

// Whether `caller` may see a job of `owner` (its own, or it reads all).
bool MaySee(const Principal& caller, absl::string_view owner);

// PermissionDenied when the audit departs from the verdict policy
// (OverridesPolicy) and `caller` lacks the override permission.
absl::Status CheckOverridePermission(const Principal& caller,
                                     const AuditWork& work);

// The client-facing form of a storage failure (spool, result store): the
// full status, which names files, goes to the log with `what`; the caller
// gets ResourceExhausted "the server's disk is full" for a full disk and
// Unavailable otherwise, never a path.
absl::Status StorageError(absl::string_view what, const absl::Status& status);

}  // namespace attnaudit::server::jobs_internal

#endif  // ATTNAUDIT_SERVER_JOBS_RECORDS_H_
