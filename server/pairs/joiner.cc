#include "server/pairs/joiner.h"

#include <deque>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/log/log.h"

namespace attnaudit::server {

namespace {

bool Audited(Verdict v) {
  return v == Verdict::kPass || v == Verdict::kDrift ||
         v == Verdict::kInconclusive;
}

const char* RoleName(SnapshotRole role) {
  return role == SnapshotRole::kTrainer ? "trainer" : "rollout";
}

// A side as the worker gets it: its store row (bytes included) and its
// report, decoded already.
struct QueuedSide {
  PairSide side;
  AuditReport report;
  int64_t bytes = 0;
};

// One side of a comparison, decoded.
struct Decoded {
  const PairSide* side = nullptr;
  Snapshot snapshot;
  AuditReport report;
};

}  // namespace

class PairJoiner::Impl {
 public:
  Impl(const PairJoinerOptions& options, PairFormats formats, JobStore* store,
       Metrics* metrics)
      : options_(options),
        formats_(std::move(formats)),
        store_(store),
        metrics_(metrics),
        worker_([this] { Run(); }) {}

  ~Impl() { Shutdown(); }

  void Offer(const std::string& tenant, const std::string& job_id,
             const Snapshot& snapshot, const AuditReport& report);
  void Flush();
  void Shutdown();

 private:
  void Run();
  void Handle(QueuedSide& queued);
  absl::Status Join(const Decoded& mine, const PairSide& other_side);
  PairRecord RecordOf(const Decoded& rollout, const Decoded& trainer,
                      const PairReport& report) const;
  void Dropped(const std::string& job_id, absl::string_view why);

  const PairJoinerOptions options_;
  const PairFormats formats_;
  JobStore* const store_;
  Metrics* const metrics_;

  absl::Mutex mu_;
  std::deque<QueuedSide> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t offered_ ABSL_GUARDED_BY(mu_) = 0;  // sides queued, ever
  int64_t handled_ ABSL_GUARDED_BY(mu_) = 0;  // of those, done or dropped
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;  // last: starts once the members above exist
};

void PairJoiner::Impl::Dropped(const std::string& job_id,
                               absl::string_view why) {
  metrics_->CountPairSide(Metrics::PairSide::kDropped);
  ATTNAUDIT_LOG(warn, "pair side dropped").Kv("job_id", job_id).Kv("why", why);
}

void PairJoiner::Impl::Offer(const std::string& tenant,
                             const std::string& job_id,
                             const Snapshot& snapshot,
                             const AuditReport& report) {
  if (!IsSide(snapshot) || !Audited(report.verdict)) return;
  QueuedSide q;
  q.side.job_id = job_id;
  q.side.tenant = tenant;
  q.side.run = snapshot.labels.run;
  q.side.layer = snapshot.labels.layer;
  q.side.role = static_cast<int>(snapshot.labels.role);
  q.side.step = snapshot.labels.step;
  q.side.weight_version = snapshot.labels.weight_version;
  q.side.snapshot = formats_.encode_snapshot(snapshot);
  q.bytes = static_cast<int64_t>(q.side.snapshot.size());
  if (q.bytes > options_.max_side_bytes) {
    Dropped(job_id, absl::StrCat("snapshot of ", q.bytes,
                                 " bytes; --pair-max-side-bytes is ",
                                 options_.max_side_bytes));
    return;
  }
  q.report = report;
  q.side.report = formats_.encode_report(report);
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ && queued_bytes_ + q.bytes <= options_.max_queued_bytes) {
      queued_bytes_ += q.bytes;
      ++offered_;
      queue_.push_back(std::move(q));
      return;
    }
  }
  Dropped(job_id, "the joiner's queue is full (or it is stopping)");
}

void PairJoiner::Impl::Flush() {
  absl::MutexLock lock(&mu_);
  const int64_t target = offered_;
  auto done = [this, target]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return handled_ >= target || stopping_;
  };
  mu_.Await(absl::Condition(&done));
}

void PairJoiner::Impl::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
  absl::MutexLock lock(&mu_);
  for (const QueuedSide& q : queue_) {
    metrics_->CountPairSide(Metrics::PairSide::kDropped);
    ATTNAUDIT_LOG(info, "pair side not joined: the server is stopping")
        .Kv("job_id", q.side.job_id);
  }
  handled_ += static_cast<int64_t>(queue_.size());
  queue_.clear();
  queued_bytes_ = 0;
}

void PairJoiner::Impl::Run() {
  for (;;) {
    QueuedSide q;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      q = std::move(queue_.front());
      queue_.pop_front();
    }
    Handle(q);
    absl::MutexLock lock(&mu_);
    queued_bytes_ -= q.bytes;
    ++handled_;
  }
}

void PairJoiner::Impl::Handle(QueuedSide& q) {
  Decoded mine;
  mine.side = &q.side;
  mine.report = std::move(q.report);
  absl::StatusOr<Snapshot> snapshot = formats_.decode_snapshot(q.side.snapshot);
  absl::StatusOr<std::vector<PairRowKey>> rows =
      snapshot.ok()
          ? PairRowKeys(*snapshot, RoleName(SnapshotRole(q.side.role)))
          : absl::StatusOr<std::vector<PairRowKey>>(snapshot.status());
  if (!rows.ok() || rows->size() > kMaxPairSideRows) {
    metrics_->CountPairSide(Metrics::PairSide::kFailed);
    ATTNAUDIT_LOG(warn, "pair side cannot be paired")
        .Kv("job_id", q.side.job_id)
        .Kv("status", rows.ok() ? absl::InvalidArgumentError("too many rows")
                                : rows.status());
    return;
  }
  mine.snapshot = *std::move(snapshot);
  q.side.rows = *std::move(rows);
  q.side.expires = absl::Now() + options_.wait;
  absl::StatusOr<std::vector<PairSide>> others =
      store_->PutPairSide(q.side, absl::Now(), options_.max_counterparts);
  if (!others.ok()) {
    metrics_->CountPairSide(Metrics::PairSide::kFailed);
    ATTNAUDIT_LOG(warn, "pair side not kept: the store failed")
        .Kv("job_id", q.side.job_id)
        .Kv("status", others.status());
    return;
  }
  if (others->empty()) {
    metrics_->CountPairSide(Metrics::PairSide::kWaiting);
    return;
  }
  bool failed = false;
  for (const PairSide& other : *others) {
    if (absl::Status s = Join(mine, other); !s.ok()) {
      failed = true;
      ATTNAUDIT_LOG(warn, "pair not joined")
          .Kv("job_id", q.side.job_id)
          .Kv("counterpart", other.job_id)
          .Kv("status", s);
    }
  }
  metrics_->CountPairSide(failed ? Metrics::PairSide::kFailed
                                 : Metrics::PairSide::kJoined);
}

absl::Status PairJoiner::Impl::Join(const Decoded& mine,
                                    const PairSide& other_side) {
  Decoded other;
  other.side = &other_side;
  absl::StatusOr<Snapshot> snapshot =
      formats_.decode_snapshot(other_side.snapshot);
  if (!snapshot.ok()) return snapshot.status();
  other.snapshot = *std::move(snapshot);
  absl::StatusOr<AuditReport> report =
      formats_.decode_report(other_side.report);
  if (!report.ok()) return report.status();
  other.report = *std::move(report);
  const bool mine_rollout =
      mine.side->role == static_cast<int>(SnapshotRole::kRollout);
  const Decoded& rollout = mine_rollout ? mine : other;
  const Decoded& trainer = mine_rollout ? other : mine;
  absl::StatusOr<PairReport> pairs =
      ComparePairs(rollout.snapshot, trainer.snapshot, &rollout.report,
                   &trainer.report, options_.threads);
  if (!pairs.ok()) return pairs.status();
  absl::StatusOr<bool> stored =
      store_->PutPair(RecordOf(rollout, trainer, *pairs));
  if (!stored.ok()) return stored.status();
  if (!*stored) return absl::OkStatus();  // joined before: counted then
  for (const RowPair& row : pairs->rows) {
    metrics_->CountPairVerdicts(pairs->layer, PairVerdictName(row.verdict));
  }
  return absl::OkStatus();
}

PairRecord PairJoiner::Impl::RecordOf(const Decoded& rollout,
                                      const Decoded& trainer,
                                      const PairReport& report) const {
  PairRecord r;
  r.tenant = rollout.side->tenant;
  r.run = rollout.side->run;
  r.layer = rollout.side->layer;
  r.rollout_job = rollout.side->job_id;
  r.trainer_job = trainer.side->job_id;
  r.rollout_step = rollout.side->step;
  r.trainer_step = trainer.side->step;
  r.rollout_weight_version = rollout.side->weight_version;
  r.trainer_weight_version = trainer.side->weight_version;
  const std::optional<PairVerdict> verdict = report.verdict();
  // The wire's PairVerdict numbers the core's from 1 (0: no common row).
  r.verdict = verdict ? static_cast<int>(*verdict) + 1 : 0;
  std::set<std::string> ids;
  for (const RowPair& row : report.rows) ids.insert(row.request_id);
  r.request_ids.assign(ids.begin(), ids.end());
  r.report = formats_.encode_pair(report);
  r.replica = options_.replica_id;
  r.joined = absl::Now();
  return r;
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<PairJoiner>> PairJoiner::Create(
    const PairJoinerOptions& options, PairFormats formats, JobStore* store,
    Metrics* metrics) {
  if (store == nullptr || metrics == nullptr) {
    return absl::InvalidArgumentError("PairJoiner: store and metrics needed");
  }
  if (options.wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--pair-wait: must be positive");
  }
  if (options.max_side_bytes < 1) {
    return absl::InvalidArgumentError("--pair-max-side-bytes: must be >= 1");
  }
  if (options.max_queued_bytes < options.max_side_bytes) {
    return absl::InvalidArgumentError(
        "max_queued_bytes: must be >= max_side_bytes");
  }
  if (options.threads < 1) {
    return absl::InvalidArgumentError("threads: must be >= 1");
  }
  if (options.max_counterparts < 1 || options.max_counterparts > 1000) {
    return absl::InvalidArgumentError("max_counterparts: must be in [1, 1000]");
  }
  return std::unique_ptr<PairJoiner>(new PairJoiner(
      std::make_unique<Impl>(options, std::move(formats), store, metrics)));
}

PairJoiner::PairJoiner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PairJoiner::~PairJoiner() { Shutdown(); }

bool PairJoiner::IsSide(const Snapshot& snapshot) {
  const Labels& l = snapshot.labels;
  return l.role != SnapshotRole::kNone && !l.run.empty() && l.layer >= 0 &&
         !l.request_ids.empty();
}

void PairJoiner::Offer(const std::string& tenant, const std::string& job_id,
                       const Snapshot& snapshot, const AuditReport& report) {
  impl_->Offer(tenant, job_id, snapshot, report);
}

void PairJoiner::Flush() { impl_->Flush(); }
void PairJoiner::Shutdown() { impl_->Shutdown(); }

}  // namespace attnaudit::server
