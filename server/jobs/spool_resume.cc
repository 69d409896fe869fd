// The spool resume at start-up: every acknowledged Submit job without a
// terminal result goes back to the scheduler (durable_jobs.cc explains why
// this yields exactly one result per job); and the adoption of a job
// another replica of a fleet accepted (fleet_handoff.h).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/jobs/jobs_impl.h"
#include "server/jobs/label_bounds.h"
#include "server/jobs/records.h"
#include "server/log/log.h"

namespace attnaudit::server::jobs_internal {

// Reads and decodes one spooled Submit. A failure is the job's terminal
// status (the entry is corrupt or no longer decodes), which its owner
// reads: the spool's own error, naming files, goes to the log only.
absl::StatusOr<AuditWork> JobServiceImpl::ReadSpooledJob(
    const std::string& id) {
  absl::StatusOr<SpoolEntry> entry = spool_->Read(id);
  if (entry.status().code() == absl::StatusCode::kNotFound) {
    return entry.status();
  }
  if (!entry.ok()) {
    ATTNAUDIT_LOG(err, "spool entry unreadable")
        .Kv("job_id", id)
        .Kv("status", entry.status());
    return absl::Status(
        entry.status().code() == absl::StatusCode::kDataLoss
            ? absl::StatusCode::kDataLoss
            : absl::StatusCode::kInternal,
        "the job's spool entry could not be read back after a restart "
        "(corrupt or unreadable; kept on the server for inspection)");
  }
  std::string payload;
  payload.swap(entry->payload);
  absl::StatusOr<AuditWork> work = formats_.decode_payload(payload);
  if (work.ok()) BoundLabels(&work->snapshot.labels);
  return work;
}

absl::Status JobServiceImpl::ResumeOne(const SpoolListing& listing,
                                       bool* requeued) {
  *requeued = false;
  const std::string& id = listing.job_id;
  // Already live here (the start-up resume and the fleet's hand-off may
  // both find one job).
  if (durable_.Get(id).has_value()) return absl::OkStatus();
  const SpoolMetadata& meta = listing.metadata;
  const JobLabels labels = JobLabelsOf(meta);
  const PriorityClass priority =
      meta.priority == static_cast<int>(PriorityClass::kInteractive)
          ? PriorityClass::kInteractive
          : PriorityClass::kSampled;
  absl::StatusOr<ResultRecord> existing = store_->Get(id);
  if (existing.ok() && IsTerminal(existing->state)) {
    // Crashed between the result commit and the spool remove.
    return spool_->Remove(id);
  }
  if (existing.ok() && store_->shared() &&
      existing->replica != options_.replica_id) {
    // Another replica of the fleet took the job over while this one was
    // away: it runs there.
    return spool_->Remove(id);
  }
  absl::StatusOr<AuditWork> work = ReadSpooledJob(id);
  if (work.status().code() == absl::StatusCode::kNotFound) {
    return absl::OkStatus();  // removed meanwhile
  }
  if (!work.ok()) {
    StoreResult(TerminalRecord(id, meta.tenant, priority, labels, meta.created,
                               work.status()));
    return absl::OkStatus();
  }
  ResultRecord queued =
      QueuedRecord(id, meta.tenant, priority, labels, meta.created);
  queued.replica = options_.replica_id;
  absl::StatusOr<bool> recorded = store_->RecordQueued(queued);
  if (!recorded.ok()) {
    ATTNAUDIT_LOG(warn, "result store RecordQueued failed")
        .Kv("job_id", id)
        .Kv("status", recorded.status());
  }
  // Accepted before: no quota applies again (it still counts against its
  // tenant while it runs).
  absl::Status s = scheduler_->SubmitWhenAdmitted(
      MakeDurableJob(id, meta.tenant, TenantQuota{}, priority, meta.deadline,
                     meta.created, *std::move(work)),
      absl::InfiniteFuture());
  *requeued = s.ok();
  if (s.ok()) return s;
  if (s.code() == absl::StatusCode::kUnavailable) {
    durable_.Forget(id);
    return s;
  }
  if (s.code() == absl::StatusCode::kAlreadyExists) {
    return absl::OkStatus();  // a concurrent resume of the same id
  }
  // Expired while the server was down, or refused for good.
  StoreResult(
      TerminalRecord(id, meta.tenant, priority, labels, meta.created, s));
  return absl::OkStatus();
}

void JobServiceImpl::AdoptStoredJob(StoredJob job) {
  const ResultRecord& r = job.record;
  SpoolMetadata meta;
  meta.priority = r.priority;
  meta.created = r.created;
  meta.deadline = job.deadline;
  meta.model = r.model;
  meta.layer = r.layer;
  meta.engine = r.engine;
  meta.tenant = r.tenant;
  absl::Status put = spool_->Put(r.job_id, meta, job.payload);
  if (!put.ok() && put.code() != absl::StatusCode::kAlreadyExists) {
    // Not taken after all: the row is this replica's now, so the next
    // start (or nobody) runs it; say so loudly.
    ATTNAUDIT_LOG(err, "fleet: a claimed job could not be spooled")
        .Kv("job_id", r.job_id)
        .Kv("status", put);
    return;
  }
  SpoolListing listing;
  listing.job_id = r.job_id;
  listing.metadata = meta;
  listing.payload_bytes = static_cast<int64_t>(job.payload.size());
  // On disk now, and read back from there: one copy in memory at a time
  // (a claimer adopts its jobs one after another).
  std::string().swap(job.payload);
  bool requeued = false;
  absl::MutexLock lock(&resume_mu_);
  ResumeOne(listing, &requeued).IgnoreError();
}

// Rows the store thinks are unfinished but whose spool entry is gone: in a
// fleet the store has the payload (the replica lost its volume), so the
// job runs here again; otherwise it can never finish, and is closed so
// Get does not say QUEUED forever.
bool JobServiceImpl::CloseLostJobs(const std::atomic<bool>& stop,
                                   absl::Time accepted_before,
                                   std::vector<std::string>* in_store_only) {
  absl::StatusOr<std::vector<std::string>> unfinished =
      store_->Unfinished(options_.replica_id);
  if (!unfinished.ok()) return true;
  for (const std::string& id : *unfinished) {
    if (stop.load()) return false;
    if (spool_->Contains(id)) continue;
    absl::StatusOr<ResultRecord> rec = store_->Get(id);
    if (!rec.ok() || IsTerminal(rec->state)) continue;
    if (rec->created >= accepted_before) continue;  // this run's own job
    if (store_->shared()) {
      in_store_only->push_back(id);  // adopted after the spool's own
      continue;
    }
    StoreResult(TerminalRecord(
        *rec, absl::InternalError("job lost: its spool entry is missing")));
  }
  return true;
}

bool JobServiceImpl::AdoptFromStore(const std::string& id) {
  absl::StatusOr<StoredJob> stored = store_->ReadPayload(id);
  if (stored.ok()) {
    AdoptStoredJob(*std::move(stored));
    return true;
  }
  absl::StatusOr<ResultRecord> rec = store_->Get(id);
  if (rec.ok() && !IsTerminal(rec->state)) {
    StoreResult(TerminalRecord(
        *rec,
        absl::InternalError("job lost: no spool entry and no stored payload")));
  }
  return false;
}

int64_t JobServiceImpl::ResumeSpool(const std::atomic<bool>& stop,
                                    absl::Time accepted_before) {
  std::vector<std::string> in_store_only;
  if (!CloseLostJobs(stop, accepted_before, &in_store_only)) return 0;
  absl::StatusOr<std::vector<SpoolListing>> listing = spool_->List();
  if (!listing.ok()) {
    ATTNAUDIT_LOG(err, "spool listing failed; nothing resumed")
        .Kv("status", listing.status());
    return 0;
  }
  int64_t resumed = 0;
  for (const SpoolListing& l : *listing) {
    if (stop.load() || draining()) break;
    // Submits this server accepted itself are already scheduled.
    if (l.metadata.created >= accepted_before) continue;
    bool requeued = false;
    absl::MutexLock lock(&resume_mu_);
    absl::Status s = ResumeOne(l, &requeued);
    if (s.code() == absl::StatusCode::kUnavailable) break;
    if (requeued) ++resumed;
  }
  for (const std::string& id : in_store_only) {
    if (stop.load() || draining()) break;
    if (AdoptFromStore(id)) ++resumed;
  }
  ATTNAUDIT_LOG(info, "spool resumed")
      .Kv("spooled", static_cast<int64_t>(listing->size()))
      .Kv("requeued", resumed);
  return resumed;
}

}  // namespace attnaudit::server::jobs_internal
