// The spool resume at start-up: every acknowledged Submit job without a
// terminal result goes back to the scheduler (durable_jobs.cc explains why
// this yields exactly one result per job).
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/codec/codec.h"
#include "server/common/log.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/rpc_internal.h"
#include "server/rpc/status_util.h"

namespace attnaudit::rpc {
namespace {

using server::JobState;
using server::PriorityClass;
using server::ResultRecord;

// Reads, decodes and re-enqueues one spooled job (*requeued tells whether
// it went back to the scheduler). Returns Unavailable when the scheduler
// drains (stop resuming).
absl::Status ResumeOne(AuditServiceImpl* svc,
                       const server::SpoolListing& listing, bool* requeued) {
  *requeued = false;
  const std::string& id = listing.job_id;
  const server::SpoolMetadata& meta = listing.metadata;
  server::JobLabels labels;
  labels.model = meta.model;
  labels.layer = meta.layer;
  labels.engine = meta.engine;
  const auto priority = static_cast<PriorityClass>(
      meta.priority == static_cast<int>(PriorityClass::kInteractive)
          ? PriorityClass::kInteractive
          : PriorityClass::kSampled);
  absl::StatusOr<ResultRecord> existing = svc->store()->Get(id);
  if (existing.ok() && server::IsTerminal(existing->state)) {
    // Crashed between the result commit and the spool remove.
    return svc->spool()->Remove(id);
  }
  absl::StatusOr<server::SpoolEntry> entry = svc->spool()->Read(id);
  if (!entry.ok()) {
    if (entry.status().code() == absl::StatusCode::kNotFound) {
      return absl::OkStatus();  // removed meanwhile
    }
    FailSpooledJob(svc, TerminalRecord(id, priority, labels, meta.created,
                                       entry.status()));
    return absl::OkStatus();
  }
  v1::SubmitRequest request;
  if (!request.ParseFromString(entry->payload)) {
    FailSpooledJob(
        svc, TerminalRecord(id, priority, labels, meta.created,
                            absl::DataLossError("spool entry does not hold a "
                                                "SubmitRequest")));
    return absl::OkStatus();
  }
  std::string().swap(entry->payload);
  absl::StatusOr<Snapshot> snapshot =
      SnapshotFromProto(request.mutable_snapshot());
  absl::StatusOr<AuditOptions> options =
      AuditOptionsFromProto(request.options());
  if (!snapshot.ok() || !options.ok()) {
    FailSpooledJob(
        svc, TerminalRecord(id, priority, labels, meta.created,
                            !snapshot.ok()
                                ? PrefixStatus("snapshot.", snapshot.status())
                                : PrefixStatus("options.", options.status())));
    return absl::OkStatus();
  }
  absl::StatusOr<bool> recorded = svc->store()->RecordQueued(
      QueuedRecord(id, priority, labels, meta.created));
  if (!recorded.ok()) {
    ATTNAUDIT_LOG(kWarn, "result store RecordQueued failed")
        .Kv("job_id", id)
        .Kv("status", recorded.status());
  }
  std::unique_ptr<server::Job> job =
      MakeDurableJob(svc, id, priority, meta.deadline, meta.created,
                     *std::move(snapshot), *std::move(options));
  absl::Status s = svc->scheduler()->SubmitWhenAdmitted(std::move(job),
                                                        absl::InfiniteFuture());
  *requeued = s.ok();
  if (s.ok() || s.code() == absl::StatusCode::kUnavailable) return s;
  if (s.code() == absl::StatusCode::kAlreadyExists) {
    return absl::OkStatus();  // a concurrent resume of the same id
  }
  // Expired while the server was down, or refused for good.
  FailSpooledJob(svc, TerminalRecord(id, priority, labels, meta.created, s));
  return absl::OkStatus();
}

}  // namespace

int64_t AuditServiceImpl::ResumeSpool(const std::atomic<bool>& stop) {
  // Rows the store thinks are unfinished but whose spool entry is gone can
  // never finish: close them so GetResult does not say QUEUED forever.
  if (absl::StatusOr<std::vector<std::string>> unfinished =
          store_->Unfinished();
      unfinished.ok()) {
    for (const std::string& id : *unfinished) {
      if (stop.load()) return 0;
      if (spool_->Contains(id)) continue;
      absl::StatusOr<ResultRecord> rec = store_->Get(id);
      if (!rec.ok() || server::IsTerminal(rec->state)) continue;
      server::JobLabels labels;
      labels.model = rec->model;
      labels.layer = rec->layer;
      labels.engine = rec->engine;
      FailSpooledJob(
          this, TerminalRecord(id, static_cast<PriorityClass>(rec->priority),
                               labels, rec->created,
                               absl::InternalError(
                                   "job lost: its spool entry is missing")));
    }
  }
  absl::StatusOr<std::vector<server::SpoolListing>> listing = spool_->List();
  if (!listing.ok()) {
    ATTNAUDIT_LOG(kError, "spool listing failed; nothing resumed")
        .Kv("status", listing.status());
    return 0;
  }
  int64_t resumed = 0;
  for (const server::SpoolListing& l : *listing) {
    if (stop.load() || draining()) break;
    bool requeued = false;
    absl::Status s = ResumeOne(this, l, &requeued);
    if (s.code() == absl::StatusCode::kUnavailable) break;
    if (requeued) ++resumed;
  }
  ATTNAUDIT_LOG(kInfo, "spool resumed")
      .Kv("spooled", static_cast<int64_t>(listing->size()))
      .Kv("requeued", resumed);
  return resumed;
}

}  // namespace attnaudit::rpc
