// Get, Cancel, List and WatchBacklog: the calls about jobs that exist.
// They read the store (blocking). Another tenant's job is NOT_FOUND, word
// for word as an unknown id; a caller that may see a job but not cancel
// it gets PERMISSION_DENIED.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/jobs/jobs_impl.h"
#include "server/jobs/records.h"

namespace attnaudit::server::jobs_internal {
namespace {

absl::Status UnknownJob(const std::string& job_id) {
  return absl::NotFoundError(
      absl::StrCat("job_id: no stored job '", job_id,
                   "' (unknown, pruned, or an Audit call's job)"));
}

// A resumed watch's numbering: the feed's (a watcher that reads every
// tenant's results) or one tenant's.
struct CursorSpace {
  bool feed = true;
  std::string tenant;

  int64_t Of(const ResultRecord& r) const {
    return feed ? r.seq : r.tenant_seq;
  }
};

absl::Status Pruned(int64_t after) {
  return absl::OutOfRangeError(
      absl::StrCat("resume_after: results after cursor ", after,
                   " were pruned by the retention policy; read what is left "
                   "with ListResults, then watch again"));
}

// The backlog after `after` up to the feed's `until`, read from `store`
// (blocking), or why the watch must end: *refusal for a cursor beyond the
// newest stored result (it would drop live results silently), a gap
// (pruned) and more than kMaxWatchBacklog results, with messages that
// count nothing beyond the caller's own numbering; the store's error.
absl::StatusOr<std::vector<ResultRecord>> ReadBacklog(JobStore* store,
                                                      const CursorSpace& space,
                                                      int64_t after,
                                                      int64_t until,
                                                      absl::Status* refusal) {
  absl::StatusOr<int64_t> newest =
      space.feed ? store->LastSeq() : store->LastTenantSeq(space.tenant);
  if (!newest.ok()) return newest.status();
  std::vector<ResultRecord> backlog;
  if (after > *newest) {
    *refusal = absl::InvalidArgumentError(absl::StrCat(
        "resume_after: cursor ", after, " is beyond the newest stored result (",
        *newest, "); resume from a JobResult.cursor this service sent"));
    return backlog;
  }
  for (int64_t next = after; next < *newest;) {
    absl::StatusOr<std::vector<ResultRecord>> rows =
        space.feed ? store->ResultsAfter(next, 1000)
                   : store->TenantResultsAfter(space.tenant, next, 1000);
    if (!rows.ok()) return rows.status();
    for (ResultRecord& r : *rows) {
      if (r.seq > until) return backlog;  // live from here on
      if (space.Of(r) != next + 1) {
        *refusal = Pruned(next);
        return backlog;
      }
      if (static_cast<int64_t>(backlog.size()) == kMaxWatchBacklog) {
        *refusal = absl::OutOfRangeError(
            absl::StrCat("resume_after: more than ", kMaxWatchBacklog,
                         " results were stored after cursor ", after,
                         ", more than a watch replays; read them with "
                         "ListResults, then watch again"));
        return backlog;
      }
      next = space.Of(r);
      backlog.push_back(std::move(r));
    }
    if (rows->empty()) break;
  }
  return backlog;
}

}  // namespace

absl::StatusOr<ResultRecord> JobServiceImpl::Get(const Principal& caller,
                                                 const std::string& job_id) {
  // A job between acknowledgement and the commit of its result.
  if (absl::optional<ResultRecord> live = durable_.Get(job_id);
      live.has_value()) {
    if (!MaySee(caller, live->tenant)) return UnknownJob(job_id);
    return *std::move(live);
  }
  // An interactive result journalled here while the store was away.
  if (ResultJournal* journal = options_.result_journal;
      journal != nullptr && journal->Contains(job_id)) {
    absl::StatusOr<ResultRecord> kept = journal->Read(job_id);
    if (kept.ok()) {
      if (!MaySee(caller, kept->tenant)) return UnknownJob(job_id);
      return kept;
    }
  }
  absl::StatusOr<ResultRecord> rec = store_->Get(job_id);
  if (rec.status().code() == absl::StatusCode::kNotFound ||
      (rec.ok() && !MaySee(caller, rec->tenant))) {
    return UnknownJob(job_id);
  }
  if (!rec.ok()) return StorageError("result store", rec.status());
  return rec;
}

// The owner of a queued, running, finishing or stored job; NotFound when
// there is none.
absl::StatusOr<std::string> JobServiceImpl::OwnerOf(const std::string& job_id) {
  if (absl::StatusOr<std::string> o = scheduler_->OwnerOf(job_id); o.ok()) {
    return o;
  }
  if (absl::optional<ResultRecord> live = durable_.Get(job_id);
      live.has_value()) {
    return live->tenant;
  }
  absl::StatusOr<ResultRecord> rec = store_->Get(job_id);
  if (!rec.ok()) return rec.status();
  return rec->tenant;
}

// Why a job the store knows was cancelled, by its stored state: running
// or queued on a replica (in a fleet, possibly another one), or spooled
// here and not yet resumed.
absl::Status JobServiceImpl::CancelledWhile(const ResultRecord& rec) const {
  const std::string where =
      rec.replica.empty() ? "" : absl::StrCat(" on replica ", rec.replica);
  if (rec.state == JobState::kRunning) {
    return absl::CancelledError(absl::StrCat("cancelled while it ran", where));
  }
  if (!rec.replica.empty() && rec.replica != options_.replica_id) {
    return absl::CancelledError(
        absl::StrCat("cancelled while it was queued", where));
  }
  return absl::CancelledError("cancelled before it was scheduled");
}

// Cancel of a job the scheduler no longer holds: a finishing job keeps
// running to its result; a stored one keeps its state; one that is
// spooled but not yet resumed is recorded cancelled.
absl::StatusOr<JobState> JobServiceImpl::CancelUnscheduled(
    const std::string& job_id) {
  if (durable_.Get(job_id).has_value()) {
    return JobState::kRunning;  // its result is being stored
  }
  absl::StatusOr<ResultRecord> rec = store_->Get(job_id);
  if (!rec.ok()) return StorageError("result store", rec.status());
  if (IsTerminal(rec->state)) return rec->state;
  // Known but not in this scheduler: spooled and not (yet) resumed, or
  // queued or running on another replica of a fleet. Record the
  // cancellation; the replica that has the job stops its copy when the
  // result feed brings it, and its own result is refused by PutResult, so
  // the job keeps exactly this one.
  StoreResult(TerminalRecord(*rec, CancelledWhile(*rec)));
  return JobState::kCancelled;
}

absl::StatusOr<JobState> JobServiceImpl::Cancel(const Principal& caller,
                                                const std::string& job_id) {
  absl::StatusOr<std::string> owner = OwnerOf(job_id);
  if (owner.status().code() == absl::StatusCode::kNotFound ||
      (owner.ok() && !MaySee(caller, *owner))) {
    return absl::NotFoundError(absl::StrCat(
        "job_id: no queued, running or stored job '", job_id, "'"));
  }
  if (!owner.ok()) return StorageError("result store", owner.status());
  if (*owner != caller.tenant && !caller.CancelsAll()) {
    metrics_->CountRejection(RejectReason::kPermissionDenied);
    return absl::PermissionDeniedError(
        "Cancel of another tenant's job needs the admin permission");
  }
  absl::Status cancelled = scheduler_->Cancel(job_id);
  if (cancelled.ok()) return JobState::kCancelled;
  if (cancelled.code() != absl::StatusCode::kNotFound) return cancelled;
  return CancelUnscheduled(job_id);
}

absl::StatusOr<std::vector<ResultRecord>> JobServiceImpl::List(
    const Principal& caller, ResultQuery query) {
  if (!caller.ReadsAll()) {
    query.tenant = caller.tenant;
    query.tenant_cursor = true;
  }
  absl::StatusOr<std::vector<ResultRecord>> rows = store_->Query(query);
  if (!rows.ok()) return StorageError("result store", rows.status());
  return rows;
}

absl::StatusOr<std::vector<PairRecord>> JobServiceImpl::ListPairs(
    const Principal& caller, PairQuery query) {
  if (!caller.ReadsAll()) query.tenant = caller.tenant;
  absl::StatusOr<std::vector<PairRecord>> rows = store_->QueryPairs(query);
  if (!rows.ok()) return StorageError("result store", rows.status());
  return rows;
}

absl::StatusOr<std::vector<ResultRecord>> JobServiceImpl::WatchBacklog(
    const Principal& caller, int64_t after, int64_t until) {
  CursorSpace space;
  space.feed = caller.ReadsAll();
  space.tenant = caller.tenant;
  absl::Status refusal;
  absl::StatusOr<std::vector<ResultRecord>> backlog =
      ReadBacklog(store_, space, after, until, &refusal);
  if (!backlog.ok()) return StorageError("result store", backlog.status());
  if (!refusal.ok()) {
    // InvalidArgument counts as invalid input; OutOfRange does not.
    CountRefusal(refusal, Metrics::InvalidInput::kOtherRequest);
    return refusal;
  }
  return backlog;
}

}  // namespace attnaudit::server::jobs_internal
