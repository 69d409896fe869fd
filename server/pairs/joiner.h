// PairJoiner: the train-rollout pairs of audited snapshots, joined on the
// server. A snapshot whose labels name a role (rollout or trainer), a run,
// a layer and its rows' request ids is a pair side: once audited, it is
// kept in the job store for its counterpart (the other role's snapshot of
// the same tenant, run and layer holding a common (request id, query
// position) row) for PairJoinerOptions::wait, and compared with every
// counterpart already waiting there (core/pairs ComparePairs, each side
// judged with its own audit report). So the two sides join whichever
// arrives first, and on whichever replica of a fleet: the store is where
// they meet (JobStore::PutPairSide). Each joined pair is stored
// (JobStore::PutPair, once per two jobs) and its rows counted in
// attnaudit_pair_verdicts_total{layer,verdict}.
//
//   PairJoinerOptions options;  options.replica_id = "r1";
//   ATTNAUDIT_ASSIGN_OR_RETURN(auto joiner,
//       PairJoiner::Create(options, formats, store, metrics));
//   ... joiner->Offer(tenant, job_id, snapshot, report) from a job's end ...
//   joiner->Shutdown();
//
// Cost and bounds: Offer encodes the snapshot on the caller's thread (a
// copy of its tensors) and queues it for one worker thread; a side larger
// than max_side_bytes, or one that does not fit max_queued_bytes, is
// dropped and counted (attnaudit_pair_sides_total{outcome="dropped"}).
// The worker's store calls and comparisons never block an audit: a store
// that fails only fails the side (counted "failed", logged).
//
// Pairs are derived data: a side queued when the server stops is not kept
// (Shutdown drops what the worker has not started), and its own audit
// result is unaffected.
//
// Ownership: the store and metrics are not owned and must outlive the
// joiner. Thread safety: Offer and Flush may be called from any thread;
// Shutdown once, after the last Offer.
#ifndef ATTNAUDIT_SERVER_PAIRS_JOINER_H_
#define ATTNAUDIT_SERVER_PAIRS_JOINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/pairs/pairs.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "server/metrics/metrics.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

struct PairJoinerOptions {
  // The replica stored with the pairs it joins.
  std::string replica_id;
  // How long a side waits in the store for its counterpart (> 0).
  absl::Duration wait = absl::Minutes(10);
  // A side's encoded snapshot above this is not kept (>= 1).
  int64_t max_side_bytes = int64_t{64} << 20;
  // Encoded sides waiting for the worker, together (>= max_side_bytes).
  int64_t max_queued_bytes = int64_t{256} << 20;
  // Threads of a comparison's reference pass (>= 1).
  int threads = 1;
  // Counterparts one side is compared with at most (1..1000).
  int max_counterparts = 64;
};

// The wire formats the joiner keeps sides and pairs in (opaque bytes
// here); server/app gives the attnaudit.v1 messages'.
struct PairFormats {
  std::function<std::string(const Snapshot& snapshot)> encode_snapshot;
  std::function<absl::StatusOr<Snapshot>(const std::string& bytes)>
      decode_snapshot;
  std::function<std::string(const AuditReport& report)> encode_report;
  std::function<absl::StatusOr<AuditReport>(const std::string& bytes)>
      decode_report;
  std::function<std::string(const PairReport& report)> encode_pair;
};

class PairJoiner {
 public:
  // InvalidArgument naming the option out of range; store and metrics
  // must be non-null.
  static absl::StatusOr<std::unique_ptr<PairJoiner>> Create(
      const PairJoinerOptions& options, PairFormats formats, JobStore* store,
      Metrics* metrics);
  ~PairJoiner();  // Shutdown() if not yet called
  PairJoiner(const PairJoiner&) = delete;
  PairJoiner& operator=(const PairJoiner&) = delete;

  // Whether the snapshot names a role, a run, a layer and request ids: a
  // pair side. Cheap (labels only).
  static bool IsSide(const Snapshot& snapshot);

  // Hands an audited side to the worker (nothing for a snapshot that is
  // not a side, or a report that is not PASS, DRIFT or INCONCLUSIVE).
  // Never blocks on the store.
  void Offer(const std::string& tenant, const std::string& job_id,
             const Snapshot& snapshot, const AuditReport& report);

  // Returns once every side offered before the call has been handled
  // (tests; a drain).
  void Flush();

  // Stops the worker after the side it is handling; drops the rest.
  void Shutdown();

 private:
  class Impl;
  explicit PairJoiner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_PAIRS_JOINER_H_
