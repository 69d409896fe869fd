// Submit: a durable job is acknowledged only once its spool entry is
// durable and the scheduler and the store both hold it (durable_jobs.cc
// explains the exactly-once rule). A Submit's job belongs to the caller's
// tenant and its idempotency key is scoped to it.
#include <memory>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/optional.h"
#include "core/common/status_macros.h"
#include "core/validate/validate.h"
#include "server/jobs/jobs_impl.h"
#include "server/jobs/label_bounds.h"
#include "server/jobs/records.h"
#include "server/log/log.h"

namespace attnaudit::server::jobs_internal {
namespace {

// InvalidArgument errors are invalid input (one accounting across calls:
// Metrics::CountInvalidInput).
absl::Status CountInvalid(Metrics* metrics, absl::Status s) {
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    metrics->CountInvalidInput(Metrics::InvalidInput::kAuditRequest);
  }
  return s;
}

}  // namespace

// Step 1: the job's own fields (key, timeout) and its id (an idempotent
// one is the caller tenant's).
absl::Status JobServiceImpl::PlanSubmit(const SubmitJob& job, SubmitPlan* plan,
                                        SubmitAnswer* answer) {
  const std::string& key = job.idempotency_key;
  if (key.size() > kMaxIdempotencyKey) {
    return absl::InvalidArgumentError(
        absl::StrCat("idempotency_key: ", key.size(), " bytes; at most ",
                     kMaxIdempotencyKey, " are allowed"));
  }
  plan->created = absl::Now();
  if (job.timeout.has_value()) {
    if (*job.timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("timeout: must be positive");
    }
    plan->deadline = plan->created + *job.timeout;
  } else if (options_.default_submit_timeout != absl::InfiniteDuration()) {
    plan->deadline = plan->created + options_.default_submit_timeout;
  }
  if (key.empty()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(answer->job_id, NewJobId('s'));
  } else {
    answer->job_id = job_id_key_.IdempotentJobId(job.caller.tenant, key);
  }
  return absl::OkStatus();
}

// Step 2: validates the work (bad input creates no job) and checks
// admission (advisory; ScheduleSubmit submits).
absl::Status JobServiceImpl::ValidateAndAdmit(const SubmitJob& job,
                                              const SubmitPlan& plan,
                                              absl::Duration* retry_after) {
  const Principal& caller = job.caller;
  ATTNAUDIT_RETURN_IF_ERROR(CheckOverridePermission(caller, job.work));
  if (absl::StatusOr<ResolvedLayout> layout =
          ValidateSnapshot(job.work.snapshot, options_.limits);
      !layout.ok()) {
    const absl::Status& s = layout.status();
    return CountInvalid(
        metrics_,
        absl::Status(s.code(), absl::StrCat("snapshot.", s.message())));
  }
  AdmissionQuery query;
  query.priority = job.priority;
  query.bytes = job.work.bytes;
  query.tenant = caller.tenant;
  query.quota = caller.quota;
  query.deadline = plan.deadline;
  if (store_->shared() &&
      (caller.quota.max_jobs > 0 || caller.quota.max_bytes > 0)) {
    // A fleet's quota counts the tenant's jobs on every replica; the
    // scheduler adds this replica's own.
    absl::StatusOr<TenantUsage> others =
        store_->OthersUsage(caller.tenant, options_.replica_id);
    if (!others.ok()) {
      *retry_after = absl::Seconds(1);
      return StorageError("result store", others.status());
    }
    query.held_jobs += others->jobs;
    query.held_bytes += others->bytes;
  }
  return admission_.Check(query, retry_after);
}

// Step 3: writes the spool entry (fsync). *deduplicated when an idempotent
// Submit with the same key already spooled it.
absl::Status JobServiceImpl::SpoolSubmit(const SubmitJob& job,
                                         const SubmitPlan& plan,
                                         const std::string& job_id,
                                         bool* deduplicated,
                                         absl::Duration* retry_after) {
  const Labels& labels = job.work.snapshot.labels;
  SpoolMetadata meta;
  meta.priority = static_cast<int32_t>(job.priority);
  meta.created = plan.created;
  meta.deadline = plan.deadline;
  meta.model = labels.model;
  meta.layer = labels.layer;
  meta.engine = labels.engine;
  meta.tenant = job.caller.tenant;
  absl::Status s = spool_->Put(job_id, meta, job.payload);
  if (s.code() == absl::StatusCode::kAlreadyExists &&
      !job.idempotency_key.empty()) {
    *deduplicated = true;
    return absl::OkStatus();
  }
  if (s.ok()) return s;
  if (s.code() == absl::StatusCode::kResourceExhausted) {
    *retry_after = absl::Seconds(1);
  }
  return StorageError("could not store the job", s);
}

// Drops the spool entry of a Submit that will not run here.
void JobServiceImpl::DropSpooled(const std::string& job_id) {
  if (absl::Status r = spool_->Remove(job_id); !r.ok()) {
    ATTNAUDIT_LOG(warn, "spool remove failed")
        .Kv("job_id", job_id)
        .Kv("status", r);
  }
}

// Step 4: admission and the job's row as one decision
// (JobStore::RecordAdmitted): the store creates the QUEUED row (in a fleet
// with the request bytes, the payload, so another replica can take the job
// over if this one never comes back) in the transaction that hands the
// spooled job to the scheduler, and commits it only when the scheduler
// took the job. So the Submit is acknowledged only once both hold; a job
// the scheduler refuses leaves no row another replica could deduplicate
// against, and a replica given the same key meanwhile waits for this
// decision: it then finds the row (the job runs here) or creates its own
// (this replica refused it). In a fleet with a quota the store also counts
// the tenant's jobs on the other replicas under the tenant's lock, and the
// scheduler adds them to the tenant's jobs here.
absl::Status JobServiceImpl::ScheduleSubmit(SubmitJob job,
                                            const SubmitPlan& plan,
                                            const std::string& job_id,
                                            bool* deduplicated,
                                            absl::Duration* retry_after) {
  const bool shared = store_->shared();
  const Principal& caller = job.caller;
  AdmittedJob row;
  row.record =
      QueuedRecord(job_id, caller.tenant, job.priority,
                   JobLabelsOf(job.work.snapshot.labels), plan.created);
  row.record.replica = options_.replica_id;
  row.record.bytes = job.work.bytes;
  row.deadline = plan.deadline;
  row.payload = shared ? absl::string_view(job.payload) : absl::string_view();
  row.count_tenant =
      shared && (caller.quota.max_jobs > 0 || caller.quota.max_bytes > 0);
  auto recorded = std::make_shared<absl::Notification>();
  std::unique_ptr<Job> run = MakeDurableJob(
      job_id, caller.tenant, caller.quota, job.priority, plan.deadline,
      plan.created, std::move(job.work), recorded);
  bool scheduled = false;
  absl::Status refusal;
  absl::StatusOr<bool> created =
      store_->RecordAdmitted(row, [&](const TenantUsage& elsewhere) {
        run->held_jobs_elsewhere = elsewhere.jobs;
        run->held_bytes_elsewhere = elsewhere.bytes;
        refusal = admission_.Submit(std::move(run), retry_after);
        scheduled = refusal.ok();
        return refusal;
      });
  recorded->Notify();  // the job may mark itself RUNNING now
  if (created.ok() && *created) return absl::OkStatus();
  if (!scheduled) {
    durable_.Forget(job_id);
    DropSpooled(job_id);
  }
  if (created.ok()) {  // the job has its row already: it runs there
    *deduplicated = true;
    return absl::OkStatus();
  }
  if (!refusal.ok()) return refusal;
  if (scheduled) {
    // The COMMIT failed after the scheduler took the job: it runs here
    // (spooled) and its result creates its row, but the answer cannot
    // promise what the store did not confirm.
    ATTNAUDIT_LOG(warn, "job scheduled but its row not confirmed")
        .Kv("job_id", job_id)
        .Kv("status", created.status());
  }
  *retry_after = absl::Seconds(1);
  return StorageError("result store", created.status());
}

// Whether the idempotent job `job_id` is known already.
bool JobServiceImpl::KnownJob(const std::string& job_id) {
  return durable_.Get(job_id).has_value() || store_->Get(job_id).ok() ||
         spool_->Contains(job_id);
}

// A retried Submit is answered with its job only once the job has a row
// that Get finds. A job spooled by an earlier run that died before the
// row's commit has none until the start-up resume reaches it (which, with
// a long spool, can be well after the retry): the row is created here from
// the spool entry, so the acknowledged job is never reported unknown.
absl::Status JobServiceImpl::RecordDeduplicated(const std::string& job_id,
                                                absl::Duration* retry_after) {
  absl::StatusOr<ResultRecord> stored = store_->Get(job_id);
  if (stored.ok()) return absl::OkStatus();
  if (stored.status().code() != absl::StatusCode::kNotFound) {
    *retry_after = absl::Seconds(1);
    return StorageError("result store", stored.status());
  }
  absl::optional<ResultRecord> row = durable_.Get(job_id);
  if (!row.has_value()) {
    absl::StatusOr<SpoolMetadata> meta = spool_->ReadMetadata(job_id);
    if (!meta.ok()) {
      // Finished and pruned meanwhile, or unreadable: the resume decides.
      *retry_after = absl::Seconds(1);
      return absl::UnavailableError(
          "idempotency_key: the job with this key is being resumed; retry");
    }
    row = QueuedRecord(job_id, meta->tenant,
                       static_cast<PriorityClass>(meta->priority),
                       JobLabelsOf(*meta), meta->created);
  }
  row->replica = options_.replica_id;
  absl::StatusOr<bool> recorded = store_->RecordQueued(*row);
  if (recorded.ok()) return absl::OkStatus();
  *retry_after = absl::Seconds(1);
  return StorageError("result store", recorded.status());
}

absl::Status JobServiceImpl::Submit(SubmitJob job, SubmitAnswer* answer) {
  if (absl::Status s = admission_.RefuseIfDraining(); !s.ok()) return s;
  SubmitPlan plan;
  if (absl::Status s = PlanSubmit(job, &plan, answer); !s.ok()) {
    return CountInvalid(metrics_, s);
  }
  const std::string job_id = answer->job_id;
  const bool idempotent = !job.idempotency_key.empty();
  if (idempotent && !BeginIdempotentSubmit(job_id)) {
    return absl::AbortedError(
        "idempotency_key: a Submit with this key is in progress; retry");
  }
  auto end_submit = absl::MakeCleanup([this, idempotent, &job_id] {
    if (idempotent) EndIdempotentSubmit(job_id);
  });
  if (idempotent && KnownJob(job_id)) {
    ATTNAUDIT_RETURN_IF_ERROR(RecordDeduplicated(job_id, &answer->retry_after));
    answer->deduplicated = true;
    return absl::OkStatus();
  }
  const LabelTruncations cut = BoundLabels(&job.work.snapshot.labels);
  ATTNAUDIT_RETURN_IF_ERROR(ValidateAndAdmit(job, plan, &answer->retry_after));
  CountTruncations(cut);
  bool deduplicated = false;
  ATTNAUDIT_RETURN_IF_ERROR(
      SpoolSubmit(job, plan, job_id, &deduplicated, &answer->retry_after));
  if (deduplicated) {
    ATTNAUDIT_RETURN_IF_ERROR(RecordDeduplicated(job_id, &answer->retry_after));
    answer->deduplicated = true;
    return absl::OkStatus();
  }
  // On disk now: free the copy, unless a fleet store keeps it too.
  if (!store_->shared()) std::string().swap(job.payload);
  // Admission and the row (ScheduleSubmit) before the answer.
  ATTNAUDIT_RETURN_IF_ERROR(ScheduleSubmit(
      std::move(job), plan, job_id, &deduplicated, &answer->retry_after));
  answer->deduplicated = deduplicated;
  return absl::OkStatus();
}

bool JobServiceImpl::BeginIdempotentSubmit(const std::string& job_id) {
  absl::MutexLock lock(&submit_mu_);
  return submitting_.insert(job_id).second;
}

void JobServiceImpl::EndIdempotentSubmit(const std::string& job_id) {
  absl::MutexLock lock(&submit_mu_);
  submitting_.erase(job_id);
}

}  // namespace attnaudit::server::jobs_internal
