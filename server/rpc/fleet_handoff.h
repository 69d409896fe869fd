// FleetHandoff: a replica's part in the hand-off of a fleet sharing one
// store (JobStore::shared()). On a thread of its own, every
// min(lease / 5, 1 s) it
//   1. writes this replica's heartbeat (the store's clock), and
//   2. unless the replica drains, claims jobs whose replica has been
//      silent for a whole lease (it died, or drained and retired) and
//      hands each to `adopt`, which spools and schedules it here.
// So an acknowledged job whose replica never comes back is run by another
// within about a lease and a second, exactly once (a claim moves the row; a
// replica that was only slow and still finishes gets its result refused).
//
// Thread safety: Start and Stop from one thread; `adopt` and `draining`
// run on the hand-off thread.
#ifndef ATTNAUDIT_SERVER_RPC_FLEET_HANDOFF_H_
#define ATTNAUDIT_SERVER_RPC_FLEET_HANDOFF_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

class FleetHandoff {
 public:
  using Adopt = std::function<void(StoredJob job)>;
  struct Options {
    std::string replica;
    absl::Duration lease = absl::Seconds(15);
    int claims_per_round = 8;
  };

  // `store` is not owned and outlives the hand-off.
  FleetHandoff(JobStore* store, Options options, Adopt adopt,
               std::function<bool()> draining);
  ~FleetHandoff();  // Stop()
  FleetHandoff(const FleetHandoff&) = delete;
  FleetHandoff& operator=(const FleetHandoff&) = delete;

  // Writes the first heartbeat (the store's error when it cannot: the
  // replica should not serve) and starts the thread.
  absl::Status Start();
  // Stops the thread; with `retire`, also removes the heartbeat so the
  // replica's unfinished jobs can be claimed at once. Idempotent.
  void Stop(bool retire);
  // Jobs this replica claimed so far.
  int64_t claimed() const;

 private:
  void Loop();
  void Round();

  JobStore* const store_;
  const Options options_;
  const Adopt adopt_;
  const std::function<bool()> draining_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t claimed_ ABSL_GUARDED_BY(mu_) = 0;
  bool failing_ = false;  // hand-off thread only
  std::thread thread_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_FLEET_HANDOFF_H_
