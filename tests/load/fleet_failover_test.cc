// No job stranded (loopback, real PostgreSQL in the throwaway cluster
// ctest starts): three attnaudit-server processes share one store.
//   - SIGKILL replica A under a load of Submits: every job A acknowledged
//     is finished by B or C once A's lease runs out, each exactly once
//     (one row, DONE; checked in the store directly);
//   - SIGTERM replica B with a queue and no drain time: what it leaves is
//     claimed by C at once (B retires), long before B's lease would run
//     out.
#include <signal.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/lib/client.h"
#include "gtest/gtest.h"
#include "server/store/postgres_job_store.h"
#include "sim/simulator.h"
#include "tests/load/server_process.h"
#include "tests/unit/server/store/postgres_testing.h"

namespace attnaudit::testing {
namespace {

// A DRIFT, so each job runs the diagnosis too: slow enough that a queue
// builds up behind one single-threaded worker.
Snapshot Slow(int64_t tag) {
  SynthOptions o;
  o.preset = "llama3-8b";
  o.fault = Fault::kStalePage;
  o.context = 4096;
  o.vocab = 16;
  o.threads = 1;
  o.seed = static_cast<uint64_t>(tag) + 1;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Snapshot();
}

class FleetFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PostgresAvailable()) GTEST_SKIP() << kNoPostgres;
    absl::StatusOr<std::string> url = FreshPostgresDatabase();
    ASSERT_TRUE(url.ok()) << url.status();
    url_ = *url;
    dir_ = ::testing::TempDir() + "/attnaudit_fleet_failover";
    std::system(
        absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "'").c_str());
    snapshot_ = Slow(1);
  }

  std::unique_ptr<ServerProcess> Replica(const std::string& name,
                                         const std::string& lease,
                                         const std::string& drain = "30s") {
    auto s = ServerProcess::Start(
        {"--data-dir", dir_ + "/" + name, "--store", url_, "--replica-id", name,
         "--fleet-lease", lease, "--cpu-workers", "1", "--threads-per-job", "1",
         "--drain-timeout", drain},
        dir_ + "/" + name + ".log");
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  static std::unique_ptr<client::Client> Connect(const ServerProcess& s) {
    client::ClientOptions o;
    o.address = s.address();
    o.timeout = absl::Seconds(20);
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // Submits `n` jobs to `c` from four threads at once (faster than one
  // worker audits them, so a queue builds up); the acknowledged ids.
  std::vector<std::string> SubmitMany(client::Client* c, int n,
                                      const std::string& prefix) {
    absl::Mutex mu;
    std::vector<std::string> ids;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = t; i < n; i += 4) {
          client::SubmitOptions so;
          so.idempotency_key = absl::StrCat(prefix, i);
          absl::StatusOr<v1::SubmitResponse> r = c->Submit(snapshot_, so);
          EXPECT_TRUE(r.ok()) << r.status();
          absl::MutexLock lock(&mu);
          if (r.ok()) ids.push_back(r->job_id());
        }
      });
    }
    for (auto& t : threads) t.join();
    return ids;
  }

  // Waits until every id is DONE as `reader` sees it; the replicas that
  // finished them.
  std::map<std::string, int> AwaitDone(client::Client* reader,
                                       const std::vector<std::string>& ids,
                                       absl::Duration within) {
    std::map<std::string, int> by_replica;
    const absl::Time until = absl::Now() + within;
    for (const std::string& id : ids) {
      v1::JobResult last;
      while (absl::Now() < until) {
        absl::StatusOr<v1::JobResult> r = reader->GetResult(id);
        EXPECT_TRUE(r.ok()) << id << ": " << r.status();  // never lost
        if (!r.ok()) break;
        last = *r;
        if (r->state() == v1::JOB_STATE_DONE) break;
        absl::SleepFor(absl::Milliseconds(50));
      }
      EXPECT_EQ(last.state(), v1::JOB_STATE_DONE) << id;
      ++by_replica[last.replica()];
    }
    return by_replica;
  }

  // The store holds exactly these jobs, each DONE once.
  void ExpectExactlyOnce(const std::vector<std::string>& ids) {
    auto store = server::PostgresJobStore::Open(url_);
    ASSERT_TRUE(store.ok()) << store.status();
    server::ResultQuery all;
    all.limit = 10000;
    auto rows = (*store)->Query(all);
    ASSERT_TRUE(rows.ok()) << rows.status();
    std::set<std::string> stored;
    for (const server::ResultRecord& r : *rows) {
      EXPECT_EQ(r.state, server::JobState::kDone) << r.job_id;
      EXPECT_TRUE(stored.insert(r.job_id).second);
    }
    EXPECT_EQ(stored, std::set<std::string>(ids.begin(), ids.end()));
  }

  std::string url_;
  std::string dir_;
  Snapshot snapshot_;
};

TEST_F(FleetFailoverTest, AKilledReplicasJobsAreFinishedByTheOthers) {
  auto a = Replica("a", "2s");
  auto b = Replica("b", "2s");
  auto c = Replica("c", "2s");
  ASSERT_TRUE(a && b && c);
  auto to_a = Connect(*a);
  auto to_b = Connect(*b);
  const std::vector<std::string> ids = SubmitMany(to_a.get(), 16, "k-");
  ASSERT_EQ(ids.size(), 16u);
  a->Signal(SIGKILL);
  EXPECT_EQ(a->Wait(), 128 + SIGKILL);
  const std::map<std::string, int> finished_by =
      AwaitDone(to_b.get(), ids, absl::Seconds(120));
  // A could not have finished them all before it died: B and C did.
  EXPECT_GT(finished_by.count("b") + finished_by.count("c"), 0u);
  std::printf("after SIGKILL of a: finished by a=%d b=%d c=%d\n",
              finished_by.count("a") ? finished_by.at("a") : 0,
              finished_by.count("b") ? finished_by.at("b") : 0,
              finished_by.count("c") ? finished_by.at("c") : 0);
  ExpectExactlyOnce(ids);
}

TEST_F(FleetFailoverTest, ADrainedReplicaHandsItsQueueOverAtOnce) {
  // A lease far longer than the test's bound: only the retire can do it.
  auto b = Replica("b", "300s", /*drain=*/"0s");
  auto c = Replica("c", "300s");
  ASSERT_TRUE(b && c);
  auto to_b = Connect(*b);
  auto to_c = Connect(*c);
  const std::vector<std::string> ids = SubmitMany(to_b.get(), 12, "d-");
  ASSERT_EQ(ids.size(), 12u);
  const absl::Time drained = absl::Now();
  b->Signal(SIGTERM);
  EXPECT_EQ(b->Wait(), 0);
  const std::map<std::string, int> finished_by =
      AwaitDone(to_c.get(), ids, absl::Seconds(60));
  EXPECT_GT(finished_by.count("c"), 0u);
  std::printf("after SIGTERM of b: finished by b=%d c=%d, %.1f s after it\n",
              finished_by.count("b") ? finished_by.at("b") : 0,
              finished_by.count("c") ? finished_by.at("c") : 0,
              absl::ToDoubleSeconds(absl::Now() - drained));
  // Far inside the 300 s lease: the retire handed them over.
  EXPECT_LT(absl::Now() - drained, absl::Seconds(60));
  ExpectExactlyOnce(ids);
}

}  // namespace
}  // namespace attnaudit::testing
