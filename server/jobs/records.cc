#include "server/jobs/records.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/audit/audit.h"
#include "server/log/log.h"

namespace attnaudit::server {

int64_t CursorFor(const Principal& caller, const ResultRecord& record) {
  return caller.ReadsAll() ? record.seq : record.tenant_seq;
}

namespace jobs_internal {

JobState TerminalStateOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return JobState::kDone;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      return JobState::kCancelled;
    default:
      return JobState::kFailed;
  }
}

JobLabels JobLabelsOf(const Labels& labels) {
  return JobLabels{labels.model,   labels.layer, labels.engine,
                   labels.backend, labels.step,  labels.run};
}

JobLabels JobLabelsOf(const ResultRecord& record) {
  return JobLabels{record.model,   record.layer, record.engine,
                   record.backend, record.step,  record.run};
}

JobLabels JobLabelsOf(const SpoolMetadata& metadata) {
  JobLabels labels;  // the spool keeps no backend, step or run
  labels.model = metadata.model;
  labels.layer = metadata.layer;
  labels.engine = metadata.engine;
  return labels;
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

ResultRecord OutcomeRecord(
    const JobOutcome& outcome, absl::Time created, absl::Time started,
    const std::function<std::string(const AuditReport&)>& encode_report) {
  ResultRecord rec =
      TerminalRecord(outcome.job_id, outcome.tenant, outcome.priority,
                     outcome.labels, created, outcome.status);
  if (outcome.ran && started != absl::InfinitePast()) rec.started = started;
  if (outcome.status.ok()) {
    rec.verdict = static_cast<int>(outcome.report.verdict);
    rec.report = encode_report(outcome.report);
    if (!outcome.report.diagnoses.empty()) {
      rec.diagnosis = outcome.report.diagnoses.front().hypothesis;
    }
  }
  return rec;
}

bool MaySee(const Principal& caller, absl::string_view owner) {
  return caller.ReadsAll() || caller.tenant == owner;
}

absl::Status CheckOverridePermission(const Principal& caller,
                                     const AuditWork& work) {
  if (caller.Has(kPermOverride) ||
      !OverridesPolicy(work.snapshot, work.options)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      "options: tolerance overrides, the statistical test off and precision "
      "fields past every profile's range need the override permission");
}

absl::Status StorageError(absl::string_view what, const absl::Status& status) {
  ATTNAUDIT_LOG(err, "storage error").Kv("what", what).Kv("status", status);
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": the server's disk is full; retry later"));
  }
  return absl::UnavailableError(
      absl::StrCat(what, ": the server's storage failed (",
                   absl::StatusCodeToString(status.code()),
                   "); retry later or on another replica"));
}

}  // namespace jobs_internal
}  // namespace attnaudit::server
