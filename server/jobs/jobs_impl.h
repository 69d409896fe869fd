// Internal: the JobService implementation's state. Not part of the public
// interface (include server/jobs/jobs.h instead). Its methods live by
// concern: jobs.cc (creation, start-up, shutdown, results), interactive.cc,
// submit.cc, lookups.cc (Get, Cancel, List, WatchBacklog), durable_jobs.cc
// (the Job of a durable job and the commit of its result) and
// spool_resume.cc (re-running spooled and taken-over jobs).
#ifndef ATTNAUDIT_SERVER_JOBS_JOBS_IMPL_H_
#define ATTNAUDIT_SERVER_JOBS_JOBS_IMPL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/jobs/admission.h"
#include "server/jobs/audit_result_writer.h"
#include "server/jobs/durable_registry.h"
#include "server/jobs/fleet_handoff.h"
#include "server/jobs/jobs.h"
#include "server/jobs/label_bounds.h"
#include "server/jobs/open_calls.h"
#include "server/jobs/result_feed.h"
#include "server/jobs/upload_ledger.h"

namespace attnaudit::server::jobs_internal {

class JobServiceImpl final : public JobService {
 public:
  JobServiceImpl(JobServiceOptions options, JobFormats formats,
                 Scheduler* scheduler, Spool* spool, JobStore* store,
                 Metrics* metrics, JobIdKey job_id_key);
  ~JobServiceImpl() override;

  absl::Status Start(ResultSubscriber* subscriber) override;
  int64_t ResumeSpool(const std::atomic<bool>& stop,
                      absl::Time accepted_before) override;
  absl::Status CheckAdmission(const AdmissionQuery& query,
                              absl::Duration* retry_after) override;
  absl::Status RunInteractive(InteractiveJob job, InteractiveDone done,
                              absl::Duration* retry_after) override;
  void StopInteractive(const std::string& job_id) override;
  absl::Status Submit(SubmitJob job, SubmitAnswer* answer) override;
  absl::StatusOr<ResultRecord> Get(const Principal& caller,
                                   const std::string& job_id) override;
  absl::StatusOr<JobState> Cancel(const Principal& caller,
                                  const std::string& job_id) override;
  absl::StatusOr<std::vector<ResultRecord>> List(const Principal& caller,
                                                 ResultQuery query) override;
  absl::StatusOr<std::vector<PairRecord>> ListPairs(const Principal& caller,
                                                    PairQuery query) override;
  absl::StatusOr<std::vector<ResultRecord>> WatchBacklog(
      const Principal& caller, int64_t after, int64_t until) override;
  OpenCalls* open_calls() override { return &open_calls_; }
  UploadLedger* uploads() override { return &uploads_; }
  void RecheckOpenCalls(const Authenticator& auth) override;
  void StartDraining() override { admission_.StartDraining(); }
  bool draining() const override { return admission_.draining(); }
  absl::Status Drain(absl::Duration timeout) override;
  void Shutdown() override;
  std::vector<DeviceInfo> Devices() const override {
    return scheduler_->Devices();
  }
  int64_t results_pending() const override { return durable_.pending(); }
  void CountRefusal(const absl::Status& status,
                    Metrics::InvalidInput where) override {
    admission_.CountRefusal(status, where);
  }

 private:
  // A Submit once its fields are checked (submit.cc).
  struct SubmitPlan {
    absl::Time created;
    absl::Time deadline = absl::InfiniteFuture();
  };

  // --- Results (jobs.cc).
  // The result writer's work: stores interactive results (one
  // transaction).
  absl::Status StoreAuditResults(const std::vector<ResultRecord>& records);
  // One result from the feed: to the subscriber, and in a fleet, the end
  // of this replica's copy of a job another replica finished or cancelled.
  void OnStoredResult(const ResultRecord& record);
  // An interactive result that is not stored: to the subscriber.
  void PublishUnstored(const ResultRecord& record);
  // Counts the label values a fresh request had cut (label_bounds.h).
  void CountTruncations(const LabelTruncations& t);

  // --- Interactive jobs (interactive.cc).
  // The answer to an interactive job once its outcome is known.
  InteractiveAnswer AnswerOf(const JobOutcome& outcome);
  // Keeps the job's result (or publishes it) and gives the answer.
  void KeepAndAnswer(ResultRecord record, InteractiveAnswer answer,
                     const InteractiveDone& done);

  // --- Submit (submit.cc).
  absl::Status PlanSubmit(const SubmitJob& job, SubmitPlan* plan,
                          SubmitAnswer* answer);
  absl::Status ValidateAndAdmit(const SubmitJob& job, const SubmitPlan& plan,
                                absl::Duration* retry_after);
  absl::Status SpoolSubmit(const SubmitJob& job, const SubmitPlan& plan,
                           const std::string& job_id, bool* deduplicated,
                           absl::Duration* retry_after);
  absl::Status ScheduleSubmit(SubmitJob job, const SubmitPlan& plan,
                              const std::string& job_id, bool* deduplicated,
                              absl::Duration* retry_after);
  bool KnownJob(const std::string& job_id);
  // Gives a deduplicated job its row before the answer: a job spooled by
  // a run that died before its row's commit gets its QUEUED row from the
  // spool entry (Unavailable, with a hint, when the entry is gone).
  absl::Status RecordDeduplicated(const std::string& job_id,
                                  absl::Duration* retry_after);
  void DropSpooled(const std::string& job_id);
  // Marks an idempotent job id as being submitted; false when another
  // Submit holds it.
  bool BeginIdempotentSubmit(const std::string& job_id);
  void EndIdempotentSubmit(const std::string& job_id);

  // --- Cancel (lookups.cc).
  absl::StatusOr<std::string> OwnerOf(const std::string& job_id);
  absl::Status CancelledWhile(const ResultRecord& rec) const;
  absl::StatusOr<JobState> CancelUnscheduled(const std::string& job_id);

  // --- Durable jobs (durable_jobs.cc).
  // A job whose completion commits its result to the store before its
  // spool entry goes (and which marks RUNNING when it starts), registered
  // with durable_. With `recorded`, its start waits for it: its row is
  // being created in the transaction that schedules it (ScheduleSubmit).
  std::unique_ptr<Job> MakeDurableJob(
      const std::string& job_id, const std::string& tenant,
      const TenantQuota& quota, PriorityClass priority, absl::Time deadline,
      absl::Time created, AuditWork work,
      std::shared_ptr<absl::Notification> recorded = nullptr);
  // The commit behind durable_: stores `rec`, then removes the job's
  // spool entry. True when the row is new.
  absl::StatusOr<bool> CommitResult(const ResultRecord& rec);
  // Hands a terminal result to durable_ (committed now, retried when the
  // store refuses); the feed publishes it once stored.
  void StoreResult(ResultRecord rec);
  // An audited job's snapshot to the pair joiner (options_.pair_joiner),
  // before its result is stored: the joiner copies what it keeps.
  void OfferPairSide(const JobOutcome& outcome);
  void CompleteDurable(const JobOutcome& outcome, absl::Time created,
                       absl::Time started);

  // --- Spool resume (spool_resume.cc).
  // Runs a job another replica accepted (claimed from the store, or this
  // replica's own whose spool entry is gone): spools it here and
  // schedules it as the resume does.
  void AdoptStoredJob(StoredJob job);
  // Reads, decodes and re-enqueues one spooled job (*requeued: it went
  // back to the scheduler). Unavailable when the scheduler drains.
  absl::Status ResumeOne(const SpoolListing& listing, bool* requeued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(resume_mu_);
  absl::StatusOr<AuditWork> ReadSpooledJob(const std::string& id);
  // Closes the store's unfinished rows whose spool entry is gone, and
  // lists those a fleet's store can still run (it has their payload).
  // False when `stop` ended it.
  bool CloseLostJobs(const std::atomic<bool>& stop, absl::Time accepted_before,
                     std::vector<std::string>* in_store_only);
  // Adopts a job of the store's that this replica's spool lost; false
  // (the job closed) when its payload cannot be read.
  bool AdoptFromStore(const std::string& id);

  const JobServiceOptions options_;
  const JobFormats formats_;
  Scheduler* const scheduler_;
  Spool* const spool_;
  JobStore* const store_;
  Metrics* const metrics_;
  const JobIdKey job_id_key_;
  Admission admission_;
  DurableJobs durable_;
  ResultFeed feed_;
  std::unique_ptr<FleetHandoff> handoff_;  // fleet only
  UploadLedger uploads_;
  // Set once by Start, before the feed and jobs can publish.
  std::atomic<ResultSubscriber*> subscriber_{nullptr};
  // After feed_, which it wakes: keeps what it holds before feed_ goes.
  // Reset by Shutdown.
  std::unique_ptr<AuditResultWriter> audit_results_;

  // Serialises resuming and adopting jobs, so one job is scheduled once.
  absl::Mutex resume_mu_;
  // Idempotency ids whose Submit is between "not found" and "spooled", so
  // a concurrent retry answers ABORTED instead of racing.
  absl::Mutex submit_mu_;
  absl::flat_hash_set<std::string> submitting_ ABSL_GUARDED_BY(submit_mu_);
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  // Last: its sweeper thread is joined before anything it reaches goes.
  OpenCalls open_calls_;
};

}  // namespace attnaudit::server::jobs_internal

#endif  // ATTNAUDIT_SERVER_JOBS_JOBS_IMPL_H_
