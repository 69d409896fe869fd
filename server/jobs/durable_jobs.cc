// Durable (Submit and resumed) jobs: the Job that runs one and its
// completion. Everything here touches the disk and runs on a blocking
// thread (the caller of Submit), a scheduler worker or the resume thread.
//
// Exactly-once results: a Submit is acknowledged only after its spool
// entry is durable (submit.cc); a job's terminal result is committed to
// the store BEFORE its spool entry is removed; PutResult never overwrites
// a terminal row. So a crash anywhere leaves either the spool entry (the
// job is re-run on the next start) or the result (the entry is dropped on
// the next start), and a job never gets two results. A commit the store
// refuses (a full disk) is retried by DurableJobs with backoff until it
// succeeds, while the job stays visible as RUNNING (durable_registry.h).
#include <memory>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "server/jobs/jobs_impl.h"
#include "server/jobs/records.h"
#include "server/log/log.h"

namespace attnaudit::server::jobs_internal {

void JobServiceImpl::StoreResult(ResultRecord rec) {
  durable_.Finish(std::move(rec), [this] { feed_.Wake(); });
}

void JobServiceImpl::CompleteDurable(const JobOutcome& outcome,
                                     absl::Time created, absl::Time started) {
  if (outcome.status.code() == absl::StatusCode::kUnavailable) {
    // Drain or shutdown: not a result. The spool entry stays and the next
    // start resumes the job.
    durable_.Forget(outcome.job_id);
    ATTNAUDIT_LOG(info, "job left spooled for the next start")
        .Kv("job_id", outcome.job_id);
    return;
  }
  OfferPairSide(outcome);
  StoreResult(OutcomeRecord(outcome, created, started, formats_.encode_report));
}

void JobServiceImpl::OfferPairSide(const JobOutcome& outcome) {
  if (options_.pair_joiner == nullptr || !outcome.status.ok() ||
      outcome.snapshot == nullptr) {
    return;
  }
  options_.pair_joiner->Offer(outcome.tenant, outcome.job_id,
                              *outcome.snapshot, outcome.report);
}

absl::StatusOr<bool> JobServiceImpl::CommitResult(const ResultRecord& rec) {
  // A row the store has already keeps its replica; this one is used only
  // when the result is the job's first row.
  ResultRecord owned = rec;
  if (owned.replica.empty()) owned.replica = options_.replica_id;
  absl::StatusOr<bool> put = store_->PutResult(owned);
  if (!put.ok()) return put.status();
  if (absl::Status s = spool_->Remove(rec.job_id); !s.ok()) {
    // The result is stored: the next start drops the entry unrun.
    ATTNAUDIT_LOG(warn, "spool remove failed")
        .Kv("job_id", rec.job_id)
        .Kv("status", s);
  }
  return put;
}

std::unique_ptr<Job> JobServiceImpl::MakeDurableJob(
    const std::string& job_id, const std::string& tenant,
    const TenantQuota& quota, PriorityClass priority, absl::Time deadline,
    absl::Time created, AuditWork work,
    std::shared_ptr<absl::Notification> recorded) {
  auto job = std::make_unique<Job>();
  job->id = job_id;
  job->priority = priority;
  job->deadline = deadline;
  job->tenant = tenant;
  job->quota = quota;
  job->labels = JobLabelsOf(work.snapshot.labels);
  job->bytes = work.bytes;
  durable_.Add(QueuedRecord(job_id, tenant, priority, job->labels, created));
  job->snapshot = std::move(work.snapshot);
  job->options = std::move(work.options);
  admission_.Shape(job.get());
  auto started = std::make_shared<absl::Time>(absl::InfinitePast());
  job->on_start = [this, started, recorded](const Job& j, absl::string_view) {
    // A moment at most: the admission's COMMIT follows its scheduling.
    if (recorded != nullptr) {
      recorded->WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    *started = absl::Now();
    durable_.MarkRunning(j.id, *started);
    absl::StatusOr<bool> marked = store_->MarkRunning(j.id, *started);
    if (!marked.ok()) {
      ATTNAUDIT_LOG(warn, "result store MarkRunning failed")
          .Kv("job_id", j.id)
          .Kv("status", marked.status());
    }
  };
  job->on_done = [this, created, started](const JobOutcome& outcome) {
    CompleteDurable(outcome, created, *started);
  };
  return job;
}

}  // namespace attnaudit::server::jobs_internal
