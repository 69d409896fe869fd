// Interactive (Audit, AuditStream) jobs: admitted through Admission,
// answered from the job's completion, their result kept (stored, or
// journalled until the store takes it) by the result writer before a
// report is answered, or only published with store_audit_results off.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "server/jobs/jobs_impl.h"
#include "server/jobs/label_bounds.h"
#include "server/jobs/records.h"

namespace attnaudit::server::jobs_internal {

absl::Status JobServiceImpl::CheckAdmission(const AdmissionQuery& query,
                                            absl::Duration* retry_after) {
  return admission_.Check(query, retry_after);
}

absl::Status JobServiceImpl::RunInteractive(InteractiveJob job,
                                            InteractiveDone done,
                                            absl::Duration* retry_after) {
  *retry_after = absl::ZeroDuration();
  CountTruncations(BoundLabels(&job.work.snapshot.labels));
  ATTNAUDIT_RETURN_IF_ERROR(CheckOverridePermission(job.caller, job.work));
  ATTNAUDIT_RETURN_IF_ERROR(admission_.RefuseIfDraining());
  auto run = std::make_unique<Job>();
  run->id = job.job_id;
  run->priority = job.priority;
  run->deadline = job.deadline;
  run->labels = JobLabelsOf(job.work.snapshot.labels);
  run->bytes = job.work.bytes;
  run->tenant = job.caller.tenant;
  run->quota = job.caller.quota;
  run->snapshot = std::move(job.work.snapshot);
  run->options = std::move(job.work.options);
  admission_.Shape(run.get());
  const absl::Time submitted = absl::Now();
  // Written by on_start on the worker, read by on_done on the same worker.
  auto started = std::make_shared<absl::Time>(absl::InfinitePast());
  run->on_start = [started](const Job&, absl::string_view) {
    *started = absl::Now();
  };
  run->on_done = [this, done = std::move(done), submitted,
                  started](const JobOutcome& outcome) {
    if (options_.store_audit_results) OfferPairSide(outcome);
    KeepAndAnswer(
        OutcomeRecord(outcome, submitted, *started, formats_.encode_report),
        AnswerOf(outcome), done);
  };
  return admission_.Submit(std::move(run), retry_after);
}

void JobServiceImpl::StopInteractive(const std::string& job_id) {
  scheduler_->Cancel(job_id).IgnoreError();
}

// The job's answer: the report, or the error; an INVALID verdict is
// InvalidArgument naming the field.
InteractiveAnswer JobServiceImpl::AnswerOf(const JobOutcome& outcome) {
  InteractiveAnswer answer;
  if (!outcome.status.ok()) {
    answer.status = outcome.status;
    return answer;
  }
  if (outcome.report.verdict == Verdict::kInvalid) {
    metrics_->CountInvalidInput(Metrics::InvalidInput::kAuditVerdict);
    answer.status = absl::InvalidArgumentError(
        absl::StrCat("snapshot.", outcome.report.invalid_reason));
    return answer;
  }
  answer.report = outcome.report;
  answer.job_id = outcome.job_id;
  return answer;
}

// A report is answered only once its result is kept (stored, or
// journalled until the store takes it), so its job id can be read back;
// otherwise the answer has no job id and says why. An error answer waits
// for nothing: its job's record is kept on the side. With
// store_audit_results off, results are only published to the subscriber.
void JobServiceImpl::KeepAndAnswer(ResultRecord record,
                                   InteractiveAnswer answer,
                                   const InteractiveDone& done) {
  record.replica = options_.replica_id;
  if (!options_.store_audit_results) {
    if (answer.status.ok()) {
      answer.job_id.clear();
      answer.not_stored_reason =
          "the server runs with --store-audit-results=false";
    }
    done(std::move(answer));
    PublishUnstored(record);
    return;
  }
  if (!answer.status.ok()) {
    done(std::move(answer));
    audit_results_->Add(std::move(record),
                        [this](const ResultRecord& r, bool kept) {
                          if (!kept) PublishUnstored(r);
                        });
    return;
  }
  auto pending = std::make_shared<InteractiveAnswer>(std::move(answer));
  audit_results_->Add(std::move(record), [this, pending, done](
                                             const ResultRecord& r, bool kept) {
    if (!kept) {
      pending->job_id.clear();
      pending->not_stored_reason =
          "the result store and this replica's result journal could not "
          "take the result (see the server's log)";
      PublishUnstored(r);
    }
    done(std::move(*pending));
  });
}

}  // namespace attnaudit::server::jobs_internal
