// WatchHub: the fan-out behind WatchResults. Every finished job's JobResult
// is published once; each open WatchResults call (a WatchReactor) gets the
// results matching its filter in a bounded buffer of its own and writes
// them one at a time. A watcher that falls `buffer` results behind is
// dropped with RESOURCE_EXHAUSTED (so one slow dashboard can never hold
// memory or slow the workers); Close ends every call (server shutdown).
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
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "attnaudit/v1/service.pb.h"
#include "server/auth/tenants.h"
#include "server/rpc/open_calls.h"

namespace attnaudit::server {

// Whether `result` passes `filter` (service.proto, ResultFilter).
bool MatchesFilter(const v1::ResultFilter& filter, const v1::JobResult& result);

// One finished job as the hub hands it out: the message (for filtering),
// its owner, and its wire bytes (written to every matching watcher).
struct PublishedResult {
  v1::JobResult result;
  std::string tenant;
  grpc::ByteBuffer wire;
};

class WatchHub;

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
  WatchReactor(WatchHub* hub, OpenCalls* calls, v1::ResultFilter filter,
               size_t buffer, Principal principal, Credentials credentials);

  bool Recheck(const Authenticator& auth) override;

  // Queues `result` if it matches; drops the watcher when the buffer is
  // full.
  void Push(const std::shared_ptr<const PublishedResult>& result);
  // Ends the call with `status` after the write in flight, if any.
  void Close(const grpc::Status& status);

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

  WatchHub* const hub_;
  OpenCalls* const calls_;
  const v1::ResultFilter filter_;
  const size_t buffer_;
  const Principal principal_;
  const Credentials credentials_;
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
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

class WatchHub {
 public:
  WatchHub() = default;
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // Cheap check, so publishers skip building a JobResult nobody watches.
  bool HasWatchers() const;
  // Serialises `result` once and offers it to every watcher.
  void Publish(v1::JobResult result, std::string tenant);
  // Finishes every open call with `status` and refuses new ones.
  void Close(const grpc::Status& status);
  size_t watchers() const;

 private:
  friend class WatchReactor;
  bool Add(WatchReactor* w);  // false when closed
  void Remove(WatchReactor* w);

  mutable absl::Mutex mu_;
  absl::flat_hash_set<WatchReactor*> watchers_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_WATCH_HUB_H_
