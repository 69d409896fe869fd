// Durable (Submit and resumed) jobs: their store records and their
// completion. Everything here touches the disk and runs on the
// BlockingExecutor, a scheduler worker or the resume thread, never on a
// gRPC reaction thread.
//
// Exactly-once results: a Submit is acknowledged only after its spool
// entry is durable (blocking_calls.cc); a job's terminal result is
// committed to the store BEFORE its spool entry is removed; PutResult never
// overwrites a terminal row. So a crash anywhere leaves either the spool
// entry (the job is re-run on the next start) or the result (the entry is
// dropped on the next start), and a job never gets two results. A commit
// the store refuses (a full disk) is retried by DurableJobs with backoff
// until it succeeds, while the job stays visible as RUNNING
// (durable_registry.h).
#include "server/rpc/durable_jobs.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "proto/codec/codec.h"
#include "server/common/log.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/conversions.h"

namespace attnaudit::server::rpc_internal {
namespace {

// Hands a terminal result to DurableJobs, which commits it now (store,
// then spool entry) and keeps retrying when the store refuses; once the
// row is new, the result feed publishes it to the watchers.
void StoreResult(AuditServiceImpl* svc, ResultRecord rec) {
  svc->durable()->Finish(std::move(rec), [svc] { svc->feed()->Wake(); });
}

// The completion of a durable (Submit or resumed) job.
void CompleteDurable(AuditServiceImpl* svc, const JobOutcome& outcome,
                     absl::Time created, absl::Time started) {
  if (outcome.status.code() == absl::StatusCode::kUnavailable) {
    // Drain or shutdown: not a result. The spool entry stays and the next
    // start resumes the job.
    svc->durable()->Forget(outcome.job_id);
    ATTNAUDIT_LOG(info, "job left spooled for the next start")
        .Kv("job_id", outcome.job_id);
    return;
  }
  StoreResult(svc, OutcomeRecord(outcome, created, started));
}

}  // namespace

ResultRecord OutcomeRecord(const JobOutcome& outcome, absl::Time created,
                           absl::Time started) {
  ResultRecord rec =
      TerminalRecord(outcome.job_id, outcome.tenant, outcome.priority,
                     outcome.labels, created, outcome.status);
  if (outcome.ran && started != absl::InfinitePast()) rec.started = started;
  if (outcome.status.ok()) {
    rec.verdict = static_cast<int>(outcome.report.verdict);
    v1::AuditReport report;
    ReportToProto(outcome.report, &report);
    report.SerializeToString(&rec.report);
    if (!outcome.report.diagnoses.empty()) {
      rec.diagnosis = outcome.report.diagnoses.front().hypothesis;
    }
  }
  return rec;
}

absl::StatusOr<bool> CommitResult(AuditServiceImpl* svc,
                                  const ResultRecord& rec) {
  // A row the store has already keeps its replica; this one is used only
  // when the result is the job's first row.
  ResultRecord owned = rec;
  if (owned.replica.empty()) owned.replica = svc->options().replica_id;
  absl::StatusOr<bool> put = svc->store()->PutResult(owned);
  if (!put.ok()) return put.status();
  if (absl::Status s = svc->spool()->Remove(rec.job_id); !s.ok()) {
    // The result is stored: the next start drops the entry unrun.
    ATTNAUDIT_LOG(warn, "spool remove failed")
        .Kv("job_id", rec.job_id)
        .Kv("status", s);
  }
  return put;
}

ResultRecord TerminalRecord(const std::string& job_id,
                            const std::string& tenant, PriorityClass priority,
                            const JobLabels& labels, absl::Time created,
                            const absl::Status& status) {
  ResultRecord rec = QueuedRecord(job_id, tenant, priority, labels, created);
  rec.state = TerminalStateOf(status);
  rec.finished = absl::Now();
  rec.error_code = static_cast<int>(status.code());
  rec.error_message = std::string(status.message());
  return rec;
}

ResultRecord TerminalRecord(const ResultRecord& known,
                            const absl::Status& status) {
  return TerminalRecord(known.job_id, known.tenant,
                        static_cast<PriorityClass>(known.priority),
                        JobLabelsOf(known), known.created, status);
}

ResultRecord QueuedRecord(const std::string& job_id, const std::string& tenant,
                          PriorityClass priority, const JobLabels& labels,
                          absl::Time created) {
  ResultRecord rec;
  rec.job_id = job_id;
  rec.tenant = tenant;
  rec.state = JobState::kQueued;
  rec.priority = static_cast<int32_t>(priority);
  rec.model = labels.model;
  rec.layer = labels.layer;
  rec.engine = labels.engine;
  rec.backend = labels.backend;
  rec.step = labels.step;
  rec.run = labels.run;
  rec.created = created;
  return rec;
}

void FailSpooledJob(AuditServiceImpl* svc, const ResultRecord& rec) {
  StoreResult(svc, rec);
}

std::unique_ptr<Job> MakeDurableJob(
    AuditServiceImpl* svc, const std::string& job_id, const std::string& tenant,
    const TenantQuota& quota, PriorityClass priority, absl::Time deadline,
    absl::Time created, DecodedAudit audit,
    std::shared_ptr<absl::Notification> recorded) {
  auto job = std::make_unique<Job>();
  job->id = job_id;
  job->priority = priority;
  job->deadline = deadline;
  job->tenant = tenant;
  job->quota = quota;
  job->labels = JobLabelsOf(audit.snapshot.labels);
  job->bytes = SnapshotTensorBytes(audit.snapshot);
  svc->durable()->Add(
      QueuedRecord(job_id, tenant, priority, job->labels, created));
  job->snapshot = std::move(audit.snapshot);
  job->options = std::move(audit.options);
  svc->admission()->Shape(job.get());
  auto started = std::make_shared<absl::Time>(absl::InfinitePast());
  job->on_start = [svc, started, recorded](const Job& j, absl::string_view) {
    // A moment at most: the admission's COMMIT follows its scheduling.
    if (recorded != nullptr) {
      recorded->WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    *started = absl::Now();
    svc->durable()->MarkRunning(j.id, *started);
    absl::StatusOr<bool> marked = svc->store()->MarkRunning(j.id, *started);
    if (!marked.ok()) {
      ATTNAUDIT_LOG(warn, "result store MarkRunning failed")
          .Kv("job_id", j.id)
          .Kv("status", marked.status());
    }
  };
  job->on_done = [svc, created, started](const JobOutcome& outcome) {
    CompleteDurable(svc, outcome, created, *started);
  };
  return job;
}

}  // namespace attnaudit::server::rpc_internal
