// FleetHandoff against a scripted store: heartbeats go on while a claimed
// job is adopted (their own thread), nothing is claimed until the
// replica's heartbeats have held for a lease (after start and after a
// failure), claims carry the byte budget and payloads are read after the
// claim, and a live replica's id is refused at start.
#include "server/jobs/fleet_handoff.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

bool WaitFor(const std::function<bool()>& done) {
  const absl::Time until = absl::Now() + kWait;
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Only the hand-off's calls; the rest is not used.
class FakeFleetStore final : public JobStore {
 public:
  absl::Status Heartbeat(absl::string_view) override {
    absl::MutexLock lock(&mu_);
    ++beats_;
    return beats_fail_ ? absl::UnavailableError("store away")
                       : absl::OkStatus();
  }
  absl::StatusOr<ReplicaBeat> ReadHeartbeat(absl::string_view) override {
    absl::MutexLock lock(&mu_);
    if (!other_beat_) return absl::NotFoundError("none");
    ReplicaBeat b;
    b.now = absl::FromUnixSeconds(1000);
    // A live twin writes on; a dead predecessor's heartbeat stays put.
    b.written =
        b.now - absl::Seconds(1) +
        (other_alive_ ? absl::Milliseconds(++reads_) : absl::ZeroDuration());
    return b;
  }
  absl::Status Retire(absl::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<StoredJob>> ClaimStranded(
      absl::string_view replica, absl::Duration, int limit, int64_t max_bytes,
      bool retired_only) override {
    absl::MutexLock lock(&mu_);
    ++claims_;
    if (!retired_only) ++stale_claims_;
    last_claim_bytes_ = max_bytes;
    if (retired_only) return std::vector<StoredJob>();  // ours are silent
    std::vector<StoredJob> out;
    for (int i = 0; i < limit && !stranded_.empty(); ++i) {
      StoredJob j;
      j.record.job_id = stranded_.back();
      j.record.replica = std::string(replica);
      j.payload_bytes = 7;
      stranded_.pop_back();
      out.push_back(std::move(j));
    }
    return out;
  }
  absl::StatusOr<StoredJob> ReadPayload(absl::string_view id) override {
    StoredJob j;
    j.record.job_id = std::string(id);
    j.payload = "payload";
    j.payload_bytes = 7;
    return j;
  }

  void Strand(const std::string& id) {
    absl::MutexLock lock(&mu_);
    stranded_.push_back(id);
  }
  void FailBeats(bool fail) {
    absl::MutexLock lock(&mu_);
    beats_fail_ = fail;
  }
  void HasTwin(bool alive) {
    absl::MutexLock lock(&mu_);
    other_beat_ = true;
    other_alive_ = alive;
  }
  int beats() {
    absl::MutexLock lock(&mu_);
    return beats_;
  }
  int claims() {
    absl::MutexLock lock(&mu_);
    return claims_;
  }
  // Claims that could take a silent (not retired) replica's jobs.
  int stale_claims() {
    absl::MutexLock lock(&mu_);
    return stale_claims_;
  }
  int64_t last_claim_bytes() {
    absl::MutexLock lock(&mu_);
    return last_claim_bytes_;
  }

  // --- Not used by the hand-off.
  absl::StatusOr<bool> RecordQueued(const ResultRecord&) override {
    return Unused();
  }
  absl::StatusOr<bool> RecordQueuedWithPayload(const ResultRecord&, absl::Time,
                                               absl::string_view) override {
    return Unused();
  }
  absl::StatusOr<bool> RecordAdmitted(const AdmittedJob&,
                                      const Admit&) override {
    return Unused();
  }
  absl::StatusOr<bool> MarkRunning(absl::string_view, absl::Time) override {
    return Unused();
  }
  absl::StatusOr<bool> PutResult(const ResultRecord&) override {
    return Unused();
  }
  absl::StatusOr<std::vector<bool>> PutResults(
      const std::vector<ResultRecord>&) override {
    return Unused();
  }
  absl::StatusOr<ResultRecord> Get(absl::string_view) override {
    return Unused();
  }
  absl::StatusOr<std::vector<ResultRecord>> Query(const ResultQuery&) override {
    return Unused();
  }
  absl::StatusOr<std::vector<ResultRecord>> ResultsAfter(int64_t,
                                                         int) override {
    return Unused();
  }
  absl::StatusOr<int64_t> LastSeq() override { return Unused(); }
  absl::StatusOr<std::vector<ResultRecord>> TenantResultsAfter(
      absl::string_view, int64_t, int) override {
    return Unused();
  }
  absl::StatusOr<int64_t> LastTenantSeq(absl::string_view) override {
    return Unused();
  }
  absl::StatusOr<std::vector<std::string>> Unfinished(
      absl::string_view) override {
    return Unused();
  }
  absl::StatusOr<int64_t> Prune(absl::Time) override { return Unused(); }
  absl::StatusOr<std::vector<PairSide>> PutPairSide(const PairSide&,
                                                    absl::Time,
                                                    int) override {
    return Unused();
  }
  absl::StatusOr<bool> PutPair(const PairRecord&) override { return Unused(); }
  absl::StatusOr<std::vector<PairRecord>> QueryPairs(
      const PairQuery&) override {
    return Unused();
  }
  absl::StatusOr<std::string> SharedSecret(absl::string_view,
                                           absl::string_view) override {
    return Unused();
  }
  absl::StatusOr<TenantUsage> OthersUsage(absl::string_view,
                                          absl::string_view) override {
    return Unused();
  }
  bool shared() const override { return true; }
  std::string description() const override { return "fake"; }

 private:
  static absl::Status Unused() { return absl::UnimplementedError("unused"); }

  absl::Mutex mu_;
  int beats_ ABSL_GUARDED_BY(mu_) = 0;
  bool beats_fail_ ABSL_GUARDED_BY(mu_) = false;
  int claims_ ABSL_GUARDED_BY(mu_) = 0;
  int stale_claims_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_claim_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int reads_ ABSL_GUARDED_BY(mu_) = 0;
  bool other_beat_ ABSL_GUARDED_BY(mu_) = false;
  bool other_alive_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> stranded_ ABSL_GUARDED_BY(mu_);
};

// A clock the test moves.
class TestClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(5000);
};

FleetHandoff::Options TestOptions(TestClock* clock) {
  FleetHandoff::Options o;
  o.replica = "me";
  o.lease = absl::Seconds(1);  // a heartbeat and a claim round every 200 ms
  o.claim_bytes = 12345;
  o.now = [clock] { return clock->Now(); };
  return o;
}

// The claimer read and spooled the payloads of the jobs it
// took over before its next heartbeat, which then came 17 s late (lease
// 15 s), so its own jobs were claimed from it.
TEST(FleetHandoffTest, HeartbeatsGoOnWhileAClaimedJobIsAdopted) {
  FakeFleetStore store;
  TestClock clock;
  store.Strand("stranded");
  absl::Notification adopting, release;
  std::vector<std::string> adopted;
  FleetHandoff handoff(
      &store, TestOptions(&clock),
      [&](StoredJob job) {
        EXPECT_EQ(job.payload, "payload");  // read after the claim
        adopted.push_back(job.record.job_id);
        adopting.Notify();
        release.WaitForNotification();  // a slow spool, a full scheduler
      },
      [] { return false; });
  ASSERT_TRUE(handoff.Start().ok());
  clock.Advance(absl::Seconds(2));  // healthy for a lease: claims may start
  ASSERT_TRUE(adopting.WaitForNotificationWithTimeout(kWait));
  const int beats = store.beats();
  EXPECT_TRUE(WaitFor([&] { return store.beats() >= beats + 3; }))
      << "no heartbeat while a claimed job was being adopted";
  release.Notify();
  handoff.Stop(/*retire=*/false);
  EXPECT_EQ(adopted, std::vector<std::string>{"stranded"});
  EXPECT_EQ(store.last_claim_bytes(), 12345);
  EXPECT_EQ(handoff.claimed(), 1);
}

// After an outage of the store every heartbeat is stale, and
// the first replica back claimed the live replicas' jobs, which then ran
// twice. A replica claims a silent replica's jobs only once its own
// heartbeats have held for a lease since start and since its last failed
// heartbeat; retired replicas' jobs it claims at once.
TEST(FleetHandoffTest, SilentReplicasJobsWaitUntilHeartbeatsHeldForALease) {
  FakeFleetStore store;
  TestClock clock;
  FleetHandoff handoff(
      &store, TestOptions(&clock), [](StoredJob) {}, [] { return false; });
  ASSERT_TRUE(handoff.Start().ok());
  auto some_rounds = [&] {
    const int seen = store.claims();
    return WaitFor([&] { return store.claims() >= seen + 3; });
  };
  clock.Advance(absl::Milliseconds(999));
  ASSERT_TRUE(some_rounds());  // retired replicas' jobs: claimed at once
  EXPECT_EQ(store.stale_claims(), 0) << "before a lease of heartbeats";
  clock.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(WaitFor([&] { return store.stale_claims() > 0; }));

  auto some_beats = [&] {
    const int seen = store.beats();
    return WaitFor([&] { return store.beats() >= seen + 3; });
  };
  store.FailBeats(true);  // the store goes away...
  ASSERT_TRUE(some_beats());
  store.FailBeats(false);  // ...and comes back
  ASSERT_TRUE(some_beats());
  ASSERT_TRUE(some_rounds());
  const int stale = store.stale_claims();
  clock.Advance(absl::Milliseconds(500));
  ASSERT_TRUE(some_rounds());
  EXPECT_EQ(store.stale_claims(), stale) << "right after an outage";
  clock.Advance(absl::Milliseconds(600));
  EXPECT_TRUE(WaitFor([&] { return store.stale_claims() > stale; }));
  handoff.Stop(false);
}

TEST(FleetHandoffTest, ALiveReplicasIdIsRefusedAtStart) {
  FakeFleetStore store;
  TestClock clock;
  store.HasTwin(/*alive=*/true);
  FleetHandoff twin(
      &store, TestOptions(&clock), [](StoredJob) {}, [] { return false; });
  const absl::Status s = twin.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StartsWith(s.message(), "--replica-id me: ")) << s;
  EXPECT_EQ(store.beats(), 0);  // it never wrote the other's heartbeat

  // A predecessor that died moments ago (same id, heartbeat still fresh
  // but no longer moving) is not in the way of its restart.
  FakeFleetStore restarted;
  restarted.HasTwin(/*alive=*/false);
  FleetHandoff again(
      &restarted, TestOptions(&clock), [](StoredJob) {}, [] { return false; });
  EXPECT_TRUE(again.Start().ok());
  again.Stop(false);
}

}  // namespace
}  // namespace attnaudit::server
