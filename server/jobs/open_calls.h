// OpenCalls: the calls in progress that must be ended from outside their
// own reactions: when the token file is reloaded (a principal lost its
// tenant or a permission) and when an upload stalls.
//
// Audit, AuditStream and WatchResults register a call once it has a
// principal and unregister it in OnDone, before they delete it. Every
// OpenCall method runs with the registry's lock held, so a registered call
// stays alive for the whole invocation; an implementation must not block
// and must not call back into the registry (gRPC 1.51 never runs a
// reaction, hence OnDone, inline inside Finish).
//
// Thread safety: all methods are thread-safe. The sweeper thread started
// by StartSweeper is joined by the destructor.
#ifndef ATTNAUDIT_SERVER_JOBS_OPEN_CALLS_H_
#define ATTNAUDIT_SERVER_JOBS_OPEN_CALLS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/auth/tenants.h"

namespace attnaudit::server {

class OpenCall {
 public:
  virtual ~OpenCall() = default;
  // The token file was re-read: check the call's credentials against
  // `auth` (Reauthorize below) and end the call, or adapt to what its
  // principal may do now. True when this call was ended by it.
  virtual bool Recheck(const Authenticator& auth) = 0;
  // Periodic: end the call if its client has been silent for too long.
  // True when this call was ended by it.
  virtual bool EndIfIdle(absl::Time now) { return false; }
};

class OpenCalls {
 public:
  OpenCalls() = default;
  ~OpenCalls();
  OpenCalls(const OpenCalls&) = delete;
  OpenCalls& operator=(const OpenCalls&) = delete;

  void Add(OpenCall* call);
  void Remove(OpenCall* call);
  size_t size() const;

  // Recheck on every open call (after a successful reload); the number of
  // calls it ended.
  int64_t RecheckAll(const Authenticator& auth);
  // EndIfIdle on every open call; the number it ended.
  int64_t EndIdle(absl::Time now);
  // Calls EndIdle every `period` on a thread of its own until destruction;
  // `on_ended` (may be empty) gets each non-zero count.
  void StartSweeper(absl::Duration period,
                    std::function<void(int64_t)> on_ended);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_set<OpenCall*> calls_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

// What a call whose principal was `was` may still do under `auth`: the
// current principal, or UNAUTHENTICATED when its credentials are no longer
// valid, or PERMISSION_DENIED when they now belong to another tenant or
// lack `needed`. `method` names the call in messages.
absl::StatusOr<Principal> Reauthorize(const Authenticator& auth,
                                      const Credentials& credentials,
                                      const Principal& was, uint32_t needed,
                                      const char* method);

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_JOBS_OPEN_CALLS_H_
