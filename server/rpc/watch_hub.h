// WatchHub: the fan-out behind WatchResults. Every finished job's JobResult
// is published once; each open WatchResults call (a WatchReactor) gets the
// results matching its filter in a bounded buffer of its own and writes
// them one at a time. A watcher that falls `buffer` results behind is
// dropped with RESOURCE_EXHAUSTED (so one slow dashboard can never hold
// memory or slow the workers); Close ends every call (server shutdown).
//
// Cursor: results that were stored come from the store's result feed
// (result_feed.h) in seq order. A watcher that reads every tenant's
// results sees their feed seq as JobResult.cursor; any other sees the
// result's place among its tenant's results (tenant_seq), so a tenant's
// cursors reveal nothing of other tenants' volume. Each
// result is serialised once per numbering. A watcher that asks to resume
// after cursor N (in the numbering it has when it starts) first gets the
// stored results after N up to the hub's last seq at its registration
// from a backlog loader, which also refuses a cursor beyond the newest
// stored result, then the live ones, with nothing missed or repeated
// between the two.
//
// Tenants: a published result carries its owner's tenant; a watcher sees
// only its own tenant's results unless it reads all. Watchers re-check
// their credential when the token file is reloaded (WatchReactor).
//
// Ownership: results are shared immutable messages (shared_ptr), built and
// serialised once however many watchers there are. The hub does not own
// reactors: a reactor registers itself and unregisters in OnDone before it
// deletes itself; the hub lock makes that safe against a concurrent Publish.
//
// Thread safety: all methods are thread-safe. Publish never blocks on a
// client: it only appends to buffers and starts writes.
#ifndef ATTNAUDIT_SERVER_RPC_WATCH_HUB_H_
#define ATTNAUDIT_SERVER_RPC_WATCH_HUB_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"
#include "attnaudit/v1/service.pb.h"
#include "server/auth/tenants.h"
#include "server/jobs/jobs.h"
#include "server/jobs/open_calls.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

// Whether `result` passes `filter` (service.proto, ResultFilter).
bool MatchesFilter(const v1::ResultFilter& filter, const v1::JobResult& result);

// One finished job as the hub hands it out: the message (for filtering),
// its owner, and its wire bytes (written to every matching watcher): with
// the tenant's cursor, and with the feed's for watchers that read all.
struct PublishedResult {
  v1::JobResult result;
  std::string tenant;
  grpc::ByteBuffer wire;      // cursor: tenant_seq
  grpc::ByteBuffer wire_all;  // cursor: seq
  int64_t seq = 0;  // the feed's seq; 0 for a result that was not stored
  int64_t tenant_seq = 0;
};

class WatchHub;
class WatchReactor;

// Loads the stored results after cursor `after` (in the watcher's
// numbering) with seq <= `until` for a resumed watch, off the reaction
// thread, and hands them to exactly one of WatchReactor::DeliverBacklog /
// FailBacklog.
using BacklogLoader =
    std::function<void(WatchReactor* watcher, int64_t after, int64_t until)>;

// The reactor of one WatchResults call. It is an OpenCall: when the token
// file is reloaded, a watcher whose credential is revoked, moved to another
// tenant or stripped of `read` ends (UNAUTHENTICATED / PERMISSION_DENIED),
// and one that gained or lost read_all sees every tenant's results or only
// its own from then on.
class WatchReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                     public OpenCall {
 public:
  // Registers with `hub` unless it is closed (then finishes UNAVAILABLE)
  // and with `calls`, then sends the initial metadata: a client that has
  // received it knows the watch is live (every result published from then
  // on reaches it), without waiting for the first result. The watcher sees
  // results of principal.tenant, or every tenant's when it reads all.
  //
  // With `resume_after` set, results up to that cursor are never sent, and
  // the stored ones after it that were published before this watch began
  // come from `load_backlog` first (live results wait behind them). The
  // cursor is in the numbering of the principal as it starts (the feed's
  // when it reads all, else its tenant's).
  WatchReactor(WatchHub* hub, OpenCalls* calls, v1::ResultFilter filter,
               size_t buffer, Principal principal, Credentials credentials,
               absl::optional<int64_t> resume_after = absl::nullopt,
               const BacklogLoader& load_backlog = nullptr);

  bool Recheck(const Authenticator& auth) override;

  // Queues `result` if it matches; drops the watcher when the buffer is
  // full.
  void Push(const std::shared_ptr<const PublishedResult>& result);
  // Ends the call with `status` after the write in flight, if any.
  void Close(const grpc::Status& status);
  // The backlog of a resumed watch, oldest first (unfiltered: this
  // filters), or why it could not be read (the call ends with it).
  void DeliverBacklog(
      const std::vector<std::shared_ptr<const PublishedResult>>& backlog);
  void FailBacklog(const grpc::Status& status);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // Finishes now, or after the write in flight (gRPC allows no operation
  // after Finish, and the message being written must stay alive).
  // StartWrite/Finish are called with mu_ held: gRPC 1.51 never runs a
  // reaction inline inside them (write and finish reactions are scheduled),
  // so this cannot re-enter mu_.
  void FinishLocked(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the watcher wants `result` (filter, tenant, cursor).
  bool WantsLocked(const PublishedResult& result) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the backlog load; true when the reactor is done and must be
  // deleted by the caller (after unlocking).
  bool EndBacklogLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  WatchHub* const hub_;
  OpenCalls* const calls_;
  const v1::ResultFilter filter_;
  const size_t buffer_;
  const Principal principal_;
  const Credentials credentials_;
  const int64_t resume_after_;  // -1: live only
  // resume_after_ counts the feed's seq (else the tenant's tenant_seq).
  const bool resume_in_feed_order_;
  absl::Mutex mu_;
  // Follows the principal's read_all across reloads.
  bool reads_all_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<const PublishedResult>> queue_
      ABSL_GUARDED_BY(mu_);
  // Writes wait until the initial metadata has been started (gRPC allows
  // no StartSendInitialMetadata after a write).
  bool metadata_started_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;    // a write is issued
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // Finish requested
  bool finished_ ABSL_GUARDED_BY(mu_) = false;   // Finish called
  // A backlog load is in flight: writes wait for it, and OnDone leaves
  // the delete to its end.
  bool backlog_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

// The hub is the JobService's ResultSubscriber (server/jobs/jobs.h): the
// results it publishes reach the watchers as JobResults.
class WatchHub final : public ResultSubscriber {
 public:
  WatchHub() = default;
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // --- ResultSubscriber (called by the JobService; never block).
  // SetLastSeq.
  void StartAfter(int64_t seq) override { SetLastSeq(seq); }
  // A stored result of the feed, as Publish(seq, ...).
  void Stored(const ResultRecord& record) override;
  // A result that was not stored, to the watchers of the moment (built
  // only when someone watches).
  void Unstored(const ResultRecord& record) override;

  // Cheap check, so publishers skip building a JobResult nobody watches.
  bool HasWatchers() const;
  // Offers a result that was not stored (cursor 0) to every watcher.
  void Publish(v1::JobResult result, std::string tenant);
  // A stored result of the feed, `seq` in seq order (tenant_seq its place
  // among its tenant's): built by `make` only when someone watches (the
  // hub's cursor moves either way).
  void Publish(int64_t seq, int64_t tenant_seq, const std::string& tenant,
               const std::function<v1::JobResult()>& make);
  // The feed starts after `seq` (results before it are not published).
  void SetLastSeq(int64_t seq);
  // Serialises a result (both numberings) for Publish and DeliverBacklog.
  static std::shared_ptr<const PublishedResult> Prepare(v1::JobResult result,
                                                        std::string tenant,
                                                        int64_t seq,
                                                        int64_t tenant_seq);
  // Finishes every open call with `status` and refuses new ones.
  void Close(const grpc::Status& status);
  size_t watchers() const;

 private:
  friend class WatchReactor;
  // False when closed; else *live_after = the last seq published.
  bool Add(WatchReactor* w, int64_t* live_after);
  void Remove(WatchReactor* w);

  mutable absl::Mutex mu_;
  absl::flat_hash_set<WatchReactor*> watchers_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_WATCH_HUB_H_
