// SIGKILL under load, over and over (loopback only): each cycle starts the
// real server on the same data dir, keeps Submits with idempotency keys
// flowing from several threads, and kills it (SIGKILL) at a random moment.
// A Submit whose answer was lost is retried with its key in the next cycle,
// as a client would. At the end one clean server runs everything left,
// and the store is checked directly:
//   - every acknowledged job has exactly one terminal result (DONE);
//   - a key always maps to the same job, and the store holds no job that
//     was never acknowledged under some key (nothing duplicated);
//   - no spool entry is left.
// The cycle count and totals are printed (docs/perf-history.md quotes one
// run's).
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/lib/client.h"
#include "gtest/gtest.h"
#include "server/store/sqlite_job_store.h"
#include "sim/simulator.h"
#include "tests/load/server_process.h"

namespace attnaudit::testing {
namespace {

constexpr int kCycles = 8;
constexpr int kSubmitters = 3;

Snapshot Small(int64_t tag) {
  SynthOptions o;
  o.preset = "llama3-8b";
  o.context = 64;
  o.vocab = 16;
  o.threads = 1;
  o.seed = static_cast<uint64_t>(tag) + 1;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Snapshot();
}

// Keys and the job each was acknowledged as; keys whose Submit got no
// answer (the server died first) wait to be retried.
class Ledger {
 public:
  std::string NextKey() {
    absl::MutexLock lock(&mu_);
    if (!retry_.empty()) {
      std::string k = *retry_.begin();
      retry_.erase(retry_.begin());
      return k;
    }
    return absl::StrCat("job-", next_++);
  }
  void Acked(const std::string& key, const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = acked_.emplace(key, id);
    if (!inserted && it->second != id) {
      ADD_FAILURE() << key << " acknowledged as " << it->second << " and "
                    << id;
    }
    ++acks_;
  }
  void Unanswered(const std::string& key) {
    absl::MutexLock lock(&mu_);
    retry_.insert(key);
  }
  // Keys still waiting for an answer (taken: the caller retries them).
  std::set<std::string> TakeUnanswered() {
    absl::MutexLock lock(&mu_);
    std::set<std::string> out;
    out.swap(retry_);
    return out;
  }
  std::map<std::string, std::string> acked() {
    absl::MutexLock lock(&mu_);
    return acked_;
  }
  int64_t acks() {
    absl::MutexLock lock(&mu_);
    return acks_;
  }

 private:
  absl::Mutex mu_;
  int64_t next_ = 0;
  int64_t acks_ = 0;
  std::map<std::string, std::string> acked_;
  std::set<std::string> retry_;
};

std::unique_ptr<client::Client> Connect(const ServerProcess& server) {
  client::ClientOptions o;
  o.address = server.address();
  o.timeout = absl::Seconds(10);
  auto c = client::Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

TEST(CrashCyclesTest, SigkillUnderLoadLosesAndDuplicatesNothing) {
  const std::string dir = ::testing::TempDir() + "/attnaudit_crash_cycles";
  std::system(
      absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'").c_str());
  const std::vector<std::string> flags = {"--data-dir",        dir + "/data",
                                          "--cpu-workers",     "1",
                                          "--threads-per-job", "1"};
  std::vector<Snapshot> snapshots;
  for (int i = 0; i < 4; ++i) snapshots.push_back(Small(i));
  Ledger ledger;
  std::mt19937 rng(7);
  int kills = 0;
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    auto server = ServerProcess::Start(
        flags, absl::StrCat(dir, "/server", cycle, ".log"));
    ASSERT_TRUE(server.ok()) << server.status();
    auto c = Connect(**server);
    ASSERT_NE(c, nullptr);
    std::atomic<bool> stop{false};
    std::vector<std::thread> submitters;
    for (int t = 0; t < kSubmitters; ++t) {
      submitters.emplace_back([&, t] {
        for (int i = 0; !stop.load(); ++i) {
          const std::string key = ledger.NextKey();
          client::SubmitOptions so;
          so.idempotency_key = key;
          absl::StatusOr<v1::SubmitResponse> r =
              c->Submit(snapshots[(t + i) % snapshots.size()], so);
          if (r.ok()) {
            ledger.Acked(key, r->job_id());
          } else {
            ledger.Unanswered(key);  // retried with the same key later
            if (r.status().code() == absl::StatusCode::kUnavailable) return;
          }
        }
      });
    }
    absl::SleepFor(absl::Milliseconds(300 + rng() % 700));
    (*server)->Signal(SIGKILL);
    ++kills;
    EXPECT_EQ((*server)->Wait(), 128 + SIGKILL);
    stop.store(true);
    for (auto& t : submitters) t.join();
  }

  // A clean server resumes and finishes everything acknowledged.
  auto server = ServerProcess::Start(flags, dir + "/server-final.log");
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = Connect(**server);
  ASSERT_NE(c, nullptr);
  // The client retries what the last kill left unanswered.
  for (const std::string& key : ledger.TakeUnanswered()) {
    client::SubmitOptions so;
    so.idempotency_key = key;
    absl::StatusOr<v1::SubmitResponse> r = c->Submit(snapshots[0], so);
    ASSERT_TRUE(r.ok()) << key << ": " << r.status();
    ledger.Acked(key, r->job_id());
  }
  const std::map<std::string, std::string> acked = ledger.acked();
  std::set<std::string> ids;
  for (const auto& [key, id] : acked) ids.insert(id);
  for (const std::string& id : ids) {
    v1::JobResult last;
    const absl::Time until = absl::Now() + absl::Seconds(60);
    while (absl::Now() < until) {
      absl::StatusOr<v1::JobResult> r = c->GetResult(id);
      ASSERT_TRUE(r.ok()) << id << ": " << r.status();  // never lost
      last = *r;
      if (r->state() == v1::JOB_STATE_DONE) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(last.state(), v1::JOB_STATE_DONE) << id;
  }
  (*server)->Signal(SIGTERM);
  ASSERT_EQ((*server)->Wait(), 0);

  // The store, read directly: one row per acknowledged job, all DONE, and
  // nothing else (a duplicate would be a second row for one key's job).
  absl::StatusOr<std::unique_ptr<server::SqliteJobStore>> store =
      server::SqliteJobStore::Open(dir + "/data");
  ASSERT_TRUE(store.ok()) << store.status();
  server::ResultQuery q;
  q.limit = 10000;
  absl::StatusOr<std::vector<server::ResultRecord>> rows = (*store)->Query(q);
  ASSERT_TRUE(rows.ok());
  std::set<std::string> stored;
  int done = 0;
  for (const server::ResultRecord& r : *rows) {
    stored.insert(r.job_id);
    done += r.state == server::JobState::kDone;
  }
  int lost = 0;
  for (const std::string& id : ids) lost += stored.count(id) == 0;
  const int extra =
      static_cast<int>(stored.size()) - static_cast<int>(ids.size()) + lost;
  std::printf(
      "\ncrash cycles: %d SIGKILLs under load, %ld Submit answers for %zu "
      "acknowledged jobs (%zu keys), stored %zu rows, %d DONE, lost %d, "
      "unacknowledged extra rows %d\n",
      kills, static_cast<long>(ledger.acks()), ids.size(), acked.size(),
      stored.size(), done, lost, extra);
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(stored.size(), ids.size()) << "rows of jobs never acknowledged";
  EXPECT_EQ(done, static_cast<int>(ids.size()));
  EXPECT_GT(ids.size(), 20u) << "too little load to mean anything";
  EXPECT_EQ(std::system(absl::StrCat("test -z \"$(ls '", dir,
                                     "/data/spool' | grep '\\.job$')\"")
                            .c_str()),
            0)
      << "spool entries left";
}

}  // namespace
}  // namespace attnaudit::testing
