// Durable (Submit and resumed) jobs (durable_jobs.cc): their store
// records, the commit of a result before its spool entry goes, and the
// Job that does both on completion. Internal to server/rpc.
#ifndef ATTNAUDIT_SERVER_RPC_DURABLE_JOBS_H_
#define ATTNAUDIT_SERVER_RPC_DURABLE_JOBS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/auth/tenants.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/conversions.h"
#include "server/scheduler/job.h"
#include "server/store/job_store.h"

namespace attnaudit::server::rpc_internal {

// A terminal store record (state from TerminalStateOf(status)), finished
// now. Status messages are stored and shown to the job's owner: callers
// pass client-safe ones (no paths).
ResultRecord TerminalRecord(const std::string& job_id,
                            const std::string& tenant, PriorityClass priority,
                            const JobLabels& labels, absl::Time created,
                            const absl::Status& status);
// The stored record of a finished job: TerminalRecord plus its start, and
// for an audit that ran its verdict, serialised report and top diagnosis.
ResultRecord OutcomeRecord(const JobOutcome& outcome, absl::Time created,
                           absl::Time started);
// The same for a job the store already knows (its labels and times).
ResultRecord TerminalRecord(const ResultRecord& known,
                            const absl::Status& status);
ResultRecord QueuedRecord(const std::string& job_id, const std::string& tenant,
                          PriorityClass priority, const JobLabels& labels,
                          absl::Time created);
// Stores a terminal result for a job that will not run (corrupt entry,
// expired, cancelled before it was re-queued), then drops its spool entry
// and publishes it. Blocking (SQLite, fsync); retried when the store fails.
void FailSpooledJob(AuditServiceImpl* svc, const ResultRecord& rec);
// The commit behind DurableJobs: stores `rec`, then removes the job's
// spool entry. True when the row is new.
absl::StatusOr<bool> CommitResult(AuditServiceImpl* svc,
                                  const ResultRecord& rec);
// A job whose completion commits the result to the store before removing
// the spool entry (and which marks RUNNING in the store when it starts).
// Registers the job with DurableJobs. With `recorded`, the job's start
// waits for it before marking RUNNING: its row is being created in the
// transaction that schedules it (ScheduleSubmit), and until that commits
// another connection cannot see the row to update it.
std::unique_ptr<Job> MakeDurableJob(
    AuditServiceImpl* svc, const std::string& job_id, const std::string& tenant,
    const TenantQuota& quota, PriorityClass priority, absl::Time deadline,
    absl::Time created, DecodedAudit audit,
    std::shared_ptr<absl::Notification> recorded = nullptr);

}  // namespace attnaudit::server::rpc_internal

#endif  // ATTNAUDIT_SERVER_RPC_DURABLE_JOBS_H_
