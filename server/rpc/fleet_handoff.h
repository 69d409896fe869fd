// FleetHandoff: a replica's part in the hand-off of a fleet sharing one
// store (JobStore::shared()), on two threads of its own:
//
//   heartbeat  every min(lease / 5, 1 s) writes this replica's heartbeat
//              (the store's clock, on the store's heartbeat connection),
//              and nothing else, so no claim, payload or slow call can
//              delay it past the lease;
//   claims     at the same pace, unless the replica drains, claims jobs
//              whose replica retired (drained) or has been silent for a
//              whole lease (it died): at most claims_per_round jobs and
//              claim_bytes of payload a round (ClaimStranded), then reads
//              each payload after the claim committed (ReadPayload) and
//              hands the job to `adopt`, which spools and schedules it
//              here (and may wait for room in the scheduler: the next
//              round waits too, so a replica claims no more than it runs).
//              A claimed job whose payload cannot be read yet (the store
//              went away) is retried first in the next round: it is this
//              replica's now.
//
// A live replica's jobs are never claimed. Its heartbeats come from a
// thread nothing else holds, and a replica claims a silent replica's jobs
// only once its own heartbeats have succeeded for a whole lease without a
// failure: after an outage of the store every replica's heartbeat is
// stale, and the first to reach the store again would otherwise take the
// others' jobs before they could write theirs, and run them twice). A
// retired replica's jobs are claimed at once (it said it is
// gone).
//
// Start refuses a replica id that a live replica uses: when the id's
// heartbeat is younger than the lease, it reads it again after three
// heartbeat periods, and a heartbeat that moved meanwhile is another
// process's (FailedPrecondition naming --replica-id). A replica that
// restarts under its own id waits those periods once.
//
// So an acknowledged job whose replica dies is run by another within about
// a lease and a second (two leases after the claimer's own start or
// outage), exactly once (a claim moves the row; a replica
// that was only slow and still finishes gets its result refused).
//
// Thread safety: Start and Stop from one thread; `adopt` and `draining`
// run on the claim thread.
#ifndef ATTNAUDIT_SERVER_RPC_FLEET_HANDOFF_H_
#define ATTNAUDIT_SERVER_RPC_FLEET_HANDOFF_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

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
    // Payload bytes one round claims (one job at least, whatever its
    // size).
    int64_t claim_bytes = int64_t{256} << 20;
    // The clock that decides when the replica has been healthy for a
    // lease (tests inject one; the threads' pace stays real time).
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  // `store` is not owned and outlives the hand-off.
  FleetHandoff(JobStore* store, Options options, Adopt adopt,
               std::function<bool()> draining);
  ~FleetHandoff();  // Stop()
  FleetHandoff(const FleetHandoff&) = delete;
  FleetHandoff& operator=(const FleetHandoff&) = delete;

  // Refuses an id a live replica uses (see the file comment), writes the
  // first heartbeat (the store's error when it cannot: the replica should
  // not serve) and starts the threads.
  absl::Status Start();
  // Stops the threads; with `retire`, also removes the heartbeat so the
  // replica's unfinished jobs can be claimed at once. Idempotent.
  void Stop(bool retire);
  // Jobs this replica claimed so far, and heartbeats written.
  int64_t claimed() const;
  int64_t heartbeats() const;

  // The pace of heartbeats and claim rounds for `lease`.
  static absl::Duration PeriodOf(absl::Duration lease);

 private:
  absl::Status CheckReplicaIdFree();
  void HeartbeatLoop();
  void ClaimLoop();
  void Beat();
  // Whether heartbeats have succeeded for a whole lease, without a
  // failure in between.
  bool HealthyForALease() const;
  void ClaimRound();
  // Reads the payload of a claimed job and adopts it; false (the job kept
  // in pending_) when its payload cannot be read now.
  bool AdoptClaimed(const StoredJob& claimed);
  // Waits one period; true when stopping.
  bool WaitPeriod();

  JobStore* const store_;
  const Options options_;
  const absl::Duration period_;
  const Adopt adopt_;
  const std::function<bool()> draining_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t claimed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  // Since when heartbeats have succeeded without a failure (InfiniteFuture
  // after a failure, until the next success).
  absl::Time healthy_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool beat_failing_ = false;       // heartbeat thread only
  bool claim_failing_ = false;      // claim thread only
  std::vector<StoredJob> pending_;  // claim thread only
  std::thread heartbeat_thread_;
  std::thread claim_thread_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_FLEET_HANDOFF_H_
