// JobService: creation, start-up, shutdown and the results' way to the
// subscriber (jobs_impl.h lists where the rest lives).
#include "server/jobs/jobs.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/jobs/jobs_impl.h"
#include "server/jobs/label_bounds.h"
#include "server/log/log.h"

namespace attnaudit::server {

absl::StatusOr<std::unique_ptr<JobService>> JobService::Create(
    JobServiceOptions options, JobFormats formats, Scheduler* scheduler,
    Spool* spool, JobStore* store, Metrics* metrics, JobIdKey job_id_key) {
  if (scheduler == nullptr || spool == nullptr || store == nullptr ||
      metrics == nullptr) {
    return absl::FailedPreconditionError(
        "job service: the scheduler, spool, store and metrics are required");
  }
  if (!formats.decode_payload || !formats.encode_report) {
    return absl::FailedPreconditionError(
        "job service: formats.decode_payload and formats.encode_report are "
        "required");
  }
  return std::unique_ptr<JobService>(new jobs_internal::JobServiceImpl(
      std::move(options), std::move(formats), scheduler, spool, store, metrics,
      std::move(job_id_key)));
}

namespace jobs_internal {

JobServiceImpl::JobServiceImpl(JobServiceOptions options, JobFormats formats,
                               Scheduler* scheduler, Spool* spool,
                               JobStore* store, Metrics* metrics,
                               JobIdKey job_id_key)
    : options_(std::move(options)),
      formats_(std::move(formats)),
      scheduler_(scheduler),
      spool_(spool),
      store_(store),
      metrics_(metrics),
      job_id_key_(std::move(job_id_key)),
      admission_(scheduler, metrics,
                 Admission::Options{options_.threads_per_job, options_.limits,
                                    options_.ring_gang}),
      durable_([this](const ResultRecord& rec) { return CommitResult(rec); },
               DurableJobs::Options{}),
      feed_(
          store,
          ResultFeed::Options{options_.feed_poll_interval, /*batch=*/256},
          [this](const ResultRecord& rec) { OnStoredResult(rec); },
          [this](bool up) {
            metrics_->SetStoreUp(up);
            if (up && audit_results_ != nullptr) {
              audit_results_->StoreAnswered();
            }
          }),
      uploads_(std::max<int64_t>(1, options_.upload_budget_bytes),
               options_.upload_tenant_share),
      audit_results_(std::make_unique<AuditResultWriter>(
          AuditResultWriter::Options{},
          [this](const std::vector<ResultRecord>& records) {
            return StoreAuditResults(records);
          },
          options_.result_journal)) {
  // Idle uploads are found within a quarter of the timeout (at most 1 s).
  const absl::Duration period =
      std::clamp(options_.upload_idle_timeout / 4, absl::Milliseconds(10),
                 absl::Seconds(1));
  open_calls_.StartSweeper(period, [this](int64_t ended) {
    metrics_->CountCallsEnded(Metrics::CallEnd::kUploadIdle, ended);
  });
}

JobServiceImpl::~JobServiceImpl() { Shutdown(); }

absl::Status JobServiceImpl::Start(ResultSubscriber* subscriber) {
  absl::StatusOr<int64_t> last = store_->LastSeq();
  if (!last.ok()) {
    return absl::Status(last.status().code(),
                        absl::StrCat("result store (", store_->description(),
                                     "): ", last.status().message()));
  }
  if (subscriber != nullptr) subscriber->StartAfter(*last);
  subscriber_.store(subscriber);
  feed_.Start(*last);
  if (!store_->shared()) return absl::OkStatus();
  FleetHandoff::Options handoff;
  handoff.replica = options_.replica_id;
  handoff.lease = options_.fleet_lease;
  handoff.claim_bytes = options_.fleet_claim_bytes;
  handoff_ = std::make_unique<FleetHandoff>(
      store_, std::move(handoff),
      [this](StoredJob job) {
        metrics_->CountJobsTakenOver();
        AdoptStoredJob(std::move(job));
      },
      [this] { return draining(); });
  return handoff_->Start();
}

absl::Status JobServiceImpl::Drain(absl::Duration timeout) {
  StartDraining();
  absl::Status drained = scheduler_->Drain(timeout);
  // In a fleet, what the drain left unfinished is claimed by the other
  // replicas at once (it stays in the local spool too, for a restart).
  if (handoff_ != nullptr) handoff_->Stop(/*retire=*/true);
  feed_.Stop();
  // Interactive results still being kept wait for them: to the local
  // journal now (stored by the next start), not to a store that may be
  // slow or away.
  if (audit_results_ != nullptr) audit_results_->JournalOnly();
  return drained;
}

void JobServiceImpl::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  // Without a Drain (a start-up that failed half-way) these still run.
  if (handoff_ != nullptr) handoff_->Stop(/*retire=*/false);
  feed_.Stop();
  // Results the store still refuses stay spooled for the next start.
  durable_.Shutdown();
  // Keeps what it holds (journal) and answers it, while the subscriber
  // is still there.
  audit_results_.reset();
  subscriber_.store(nullptr);
}

void JobServiceImpl::RecheckOpenCalls(const Authenticator& auth) {
  metrics_->CountCallsEnded(Metrics::CallEnd::kCredentials,
                            open_calls_.RecheckAll(auth));
}

absl::Status JobServiceImpl::StoreAuditResults(
    const std::vector<ResultRecord>& records) {
  absl::StatusOr<std::vector<bool>> put = store_->PutResults(records);
  if (!put.ok()) return put.status();
  feed_.Wake();
  return absl::OkStatus();
}

void JobServiceImpl::PublishUnstored(const ResultRecord& record) {
  if (ResultSubscriber* s = subscriber_.load(); s != nullptr) {
    s->Unstored(record);
  }
}

void JobServiceImpl::OnStoredResult(const ResultRecord& record) {
  if (ResultSubscriber* s = subscriber_.load(); s != nullptr) {
    s->Stored(record);
  }
  if (!store_->shared()) return;
  // Another replica cancelled this replica's job, or finished it after
  // taking it over: stop this copy (its own result would be refused).
  if (absl::Status s = scheduler_->Cancel(record.job_id); s.ok()) {
    ATTNAUDIT_LOG(info, "job ended elsewhere in the fleet; stopped here")
        .Kv("job_id", record.job_id)
        .Kv("state", JobStateName(record.state));
  }
}

void JobServiceImpl::CountTruncations(const LabelTruncations& t) {
  if (t.total() == 0) return;
  metrics_->CountTruncatedLabel("model", t.model);
  metrics_->CountTruncatedLabel("engine", t.engine);
  metrics_->CountTruncatedLabel("backend", t.backend);
  metrics_->CountTruncatedLabel("request_id", t.request_ids);
  metrics_->CountTruncatedLabel("run", t.run);
  metrics_->CountTruncatedLabel("weight_version", t.weight_version);
}

}  // namespace jobs_internal
}  // namespace attnaudit::server
