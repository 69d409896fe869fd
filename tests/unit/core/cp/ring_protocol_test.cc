// The ring protocol (core/cp/transport/ring_protocol.h) on its own, over
// the real CP schedule (core/cp/schedule) for W = 1..8.
//
// A one-thread simulation plays every rank and the network: at each turn
// it picks, at random, one of the actions the protocol says may go ahead
// without blocking (a rank's next call, or the delivery of a pending send
// whose credit is there), so a run is one random interleaving,
// reproducible by its seed. Slots are host memory holding a tag (source
// rank, fill step) that the test writes and checks itself, so these
// properties are observed, not taken from the protocol: every slot is
// written exactly once per step that uses it, never read before its write
// nor overwritten before its last read, credits never exceed one per slot,
// and the run drains. The same schedules then run with a thread per rank
// over the in-process transport. Misuses each return Internal at once (a
// hang would time the test out).
#include "core/cp/transport/ring_protocol.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/units.h"
#include "core/common/status_macros.h"
#include "core/cp/schedule/schedule.h"
#include "core/cp/transport/in_process.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace testing {
namespace {

constexpr int64_t kPage = 4;

// Random rows of whole units, each unit on a random rank, some rows
// shorter than W: unequal and empty shards.
std::vector<std::vector<KvUnit>> RandomUnits(int64_t world, int64_t rows,
                                             std::mt19937_64* rng) {
  std::vector<std::vector<KvUnit>> units(static_cast<size_t>(rows));
  for (auto& row : units) {
    const int64_t blocks = 1 + static_cast<int64_t>((*rng)() % 5);
    for (int32_t b = 0; b < blocks; ++b) {
      int32_t first = 0;
      while (first < kPage) {
        const int32_t count =
            1 + static_cast<int32_t>((*rng)() % (kPage - first));
        const int32_t rank = static_cast<int32_t>((*rng)() % world);
        row.push_back({b, first, count, rank});
        first += count;
      }
    }
  }
  return units;
}

struct Tag {
  int64_t source = -1;
  int64_t fill_step = -1;
  bool operator==(const Tag& o) const {
    return source == o.source && fill_step == o.fill_step;
  }
};

class Simulation {
 public:
  Simulation(const CpSchedule& schedule, uint64_t seed)
      : s_(schedule),
        w_(schedule.world()),
        protocol_(w_, 64),
        slots_(w_, 64),
        rng_(seed),
        ranks_(static_cast<size_t>(w_)),
        writes_(static_cast<size_t>(w_),
                std::vector<int>(static_cast<size_t>(s_.steps()), 0)) {}

  void Run() {
    while (true) {
      std::vector<int64_t> ready;  // ranks 0..W-1, W + i: delivery i
      for (int64_t k = 0; k < w_; ++k) {
        if (RankReady(k)) ready.push_back(k);
      }
      for (size_t i = 0; i < pending_.size(); ++i) {
        if (protocol_.CreditReady(pending_[i].rank, pending_[i].step)) {
          ready.push_back(w_ + static_cast<int64_t>(i));
        }
      }
      if (ready.empty()) break;
      const int64_t pick = ready[rng_() % ready.size()];
      if (pick < w_) {
        RankAct(pick);
      } else {
        Deliver(static_cast<size_t>(pick - w_));
      }
      if (::testing::Test::HasFatalFailure()) return;
      for (int64_t k = 0; k < w_; ++k) {
        ASSERT_LE(protocol_.Credits(k), 2);
        max_credits_ = std::max(max_credits_, protocol_.Credits(k));
      }
    }
    // Nothing can go ahead: every rank must be done, nothing pending.
    for (int64_t k = 0; k < w_; ++k) {
      ASSERT_EQ(ranks_[k].phase, Phase::kDone) << "rank " << k << " stuck";
    }
    ASSERT_TRUE(pending_.empty());
    EXPECT_TRUE(protocol_.Drained().ok()) << protocol_.Drained();
    for (int64_t k = 0; k < w_; ++k) {
      for (int64_t t = 0; t < s_.steps(); ++t) {
        EXPECT_EQ(writes_[k][t], 1) << "rank " << k << " step " << t;
      }
    }
  }

  int64_t max_credits() const { return max_credits_; }

 private:
  enum class Phase { kGrantInitial, kAcquire, kWaitSent, kRelease, kDone };
  struct RankState {
    Phase phase = Phase::kGrantInitial;
    int64_t step = 0;
  };
  struct Pending {
    int64_t rank, step;
  };

  // What rank k must hold at step t: chunk of its source rank, filled by
  // that rank at the pass's round-0 step of the chunk.
  Tag Expected(int64_t k, int64_t t) const {
    const int64_t round = s_.StepAt(t).round;
    return {s_.SourceRank(k, round), t - round};
  }
  Tag Read(int64_t k, int64_t t) {
    Tag tag;
    std::memcpy(&tag, slots_.Slot(k, t % 2), sizeof(tag));
    return tag;
  }

  bool RankReady(int64_t k) {
    const RankState& r = ranks_[k];
    switch (r.phase) {
      case Phase::kAcquire:
        return !s_.Receives(r.step) || protocol_.Arrived(k, r.step);
      case Phase::kWaitSent:
        return protocol_.SendComplete(k, r.step);
      case Phase::kDone:
        return false;
      default:
        return true;
    }
  }

  void RankAct(int64_t k) {
    RankState& r = ranks_[k];
    const int64_t t = r.step;
    switch (r.phase) {
      case Phase::kGrantInitial:
        for (int64_t u = 0; u < 2 && u < s_.steps(); ++u) {
          if (s_.Receives(u)) {
            ASSERT_TRUE(protocol_.Grant(k, u).ok());
          }
        }
        r.phase = s_.steps() > 0 ? Phase::kAcquire : Phase::kDone;
        return;
      case Phase::kAcquire:
        if (s_.Receives(t)) {
          absl::StatusOr<int64_t> bytes = protocol_.Receive(k, t);
          ASSERT_TRUE(bytes.ok()) << bytes.status();
          ASSERT_EQ(*bytes, static_cast<int64_t>(sizeof(Tag)));
        } else {
          // A local fill: this rank is the only writer of the slot now.
          const Tag tag{k, t};
          std::memcpy(slots_.Slot(k, t % 2), &tag, sizeof(tag));
          ++writes_[k][t];
        }
        ASSERT_TRUE(Read(k, t) == Expected(k, t)) << "rank " << k << " " << t;
        if (s_.Sends(t)) {
          ASSERT_TRUE(protocol_.Post(k, t, sizeof(Tag)).ok());
          pending_.push_back({k, t});
          r.phase = Phase::kWaitSent;
        } else {
          r.phase = Phase::kRelease;
        }
        return;
      case Phase::kWaitSent:
        ASSERT_TRUE(protocol_.AwaitSent(k, t).ok());
        r.phase = Phase::kRelease;
        return;
      case Phase::kRelease:
        // The compute reads the slot last: still the step's chunk.
        ASSERT_TRUE(Read(k, t) == Expected(k, t)) << "rank " << k << " " << t;
        if (s_.GrantsAfter(t)) {
          ASSERT_TRUE(protocol_.Grant(k, t + 2).ok());
        }
        r.step = t + 1;
        r.phase = r.step < s_.steps() ? Phase::kAcquire : Phase::kDone;
        return;
      case Phase::kDone:
        return;
    }
  }

  // The network: copies the sender's slot at delivery (a one-sided put).
  void Deliver(size_t i) {
    const Pending m = pending_[i];
    pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
    ASSERT_TRUE(protocol_.AwaitCredit(m.rank, m.step).ok());
    const int64_t next = protocol_.Next(m.rank);
    // The sender has not touched its slot since it posted the send.
    ASSERT_TRUE(Read(m.rank, m.step) == Expected(m.rank, m.step));
    std::memcpy(slots_.Slot(next, (m.step + 1) % 2),
                slots_.Slot(m.rank, m.step % 2), sizeof(Tag));
    ++writes_[next][m.step + 1];
    ASSERT_TRUE(protocol_.Delivered(m.rank, m.step).ok());
  }

  const CpSchedule& s_;
  const int64_t w_;
  CpRingProtocol protocol_;
  CpHostSlots slots_;
  std::mt19937_64 rng_;
  std::vector<RankState> ranks_;
  std::vector<Pending> pending_;
  std::vector<std::vector<int>> writes_;
  int64_t max_credits_ = 0;
};

TEST(CpRingProtocolTest, EverySlotWrittenOnceReadAfterWriteForW1To8) {
  uint64_t seed = 1;
  for (int64_t world = 1; world <= 8; ++world) {
    for (int trial = 0; trial < 6; ++trial, ++seed) {
      std::mt19937_64 rng(seed);
      const auto units = RandomUnits(world, 1 + trial % 4, &rng);
      const CpShards shards = PlanShards(units, world, kPage);
      // Budgets of one and of several rows per pass: the global step
      // counter crosses passes whose length is odd or even.
      const CpSchedule schedule(shards, CpReplayStrategy::kRing,
                                /*kv_heads=*/1, /*token_bytes=*/1,
                                trial % 2 == 0 ? kPage : 64 * kPage);
      Simulation sim(schedule, seed);
      sim.Run();
      ASSERT_FALSE(HasFailure()) << "W " << world << " seed " << seed;
      if (world > 1) {
        EXPECT_GT(sim.max_credits(), 0);
      } else {
        EXPECT_EQ(sim.max_credits(), 0);  // a ring of one never sends
      }
    }
  }
}

// The same schedules with real threads, one per rank, over the in-process
// transport (the protocol's waits instead of the simulation's choices):
// every step reads the tag the schedule says, at acquire and after the
// compute, and the run drains.
TEST(CpRingProtocolTest, ThreadPerRankOverTheInProcessTransportForW1To8) {
  uint64_t seed = 100;
  for (int64_t world = 1; world <= 8; ++world) {
    for (int trial = 0; trial < 3; ++trial, ++seed) {
      std::mt19937_64 rng(seed);
      const auto units = RandomUnits(world, 2 + trial, &rng);
      const CpShards shards = PlanShards(units, world, kPage);
      const CpSchedule s(shards, CpReplayStrategy::kRing, 1, 1,
                         trial == 0 ? kPage : 64 * kPage);
      absl::StatusOr<std::unique_ptr<InProcessTransport>> made =
          InProcessTransport::Create(world, 64, 1 << 20);
      ASSERT_TRUE(made.ok());
      InProcessTransport& t = **made;
      std::vector<absl::Status> status(static_cast<size_t>(world));
      auto expect = [&](int64_t k, int64_t step) -> absl::Status {
        const int64_t round = s.StepAt(step).round;
        const Tag want{s.SourceRank(k, round), step - round};
        Tag got;
        std::memcpy(&got, t.Slot(k, step % 2), sizeof(got));
        if (got == want) return absl::OkStatus();
        return absl::InternalError(absl::StrCat(
            "rank ", k, " step ", step, " holds (", got.source, ", ",
            got.fill_step, "), not (", want.source, ", ", want.fill_step, ")"));
      };
      auto rank_loop = [&](int64_t k) -> absl::Status {
        for (int64_t u = 0; u < 2 && u < s.steps(); ++u) {
          if (s.Receives(u)) ATTNAUDIT_RETURN_IF_ERROR(t.Release(k, u));
        }
        for (int64_t step = 0; step < s.steps(); ++step) {
          if (s.Receives(step)) {
            ATTNAUDIT_RETURN_IF_ERROR(t.Receive(k, step).status());
          } else {
            const Tag tag{k, step};
            std::memcpy(t.Slot(k, step % 2), &tag, sizeof(tag));
          }
          ATTNAUDIT_RETURN_IF_ERROR(expect(k, step));
          if (s.Sends(step)) {
            ATTNAUDIT_RETURN_IF_ERROR(t.Send(k, step, sizeof(Tag)));
          }
          std::this_thread::yield();  // let deliveries interleave
          ATTNAUDIT_RETURN_IF_ERROR(expect(k, step));
          if (s.Sends(step)) ATTNAUDIT_RETURN_IF_ERROR(t.WaitSent(k, step));
          if (s.GrantsAfter(step)) {
            ATTNAUDIT_RETURN_IF_ERROR(t.Release(k, step + 2));
          }
        }
        return absl::OkStatus();
      };
      std::vector<std::thread> threads;
      for (int64_t k = 0; k < world; ++k) {
        threads.emplace_back([&, k] {
          status[k] = rank_loop(k);
          if (!status[k].ok()) t.Abort(status[k]);
        });
      }
      for (std::thread& th : threads) th.join();
      for (int64_t k = 0; k < world; ++k) {
        EXPECT_TRUE(status[k].ok())
            << "W " << world << " seed " << seed << ": " << status[k];
      }
      EXPECT_TRUE(t.Drained().ok()) << "W " << world << " seed " << seed;
    }
  }
}

// A fresh protocol of W = 2: rank 1 receives rank 0's sends.
TEST(CpRingProtocolTest, MisusesAreErrorsNotHangs) {
  auto internal = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kInternal;
  };
  {  // Receive from a slot never granted for the step: nobody will send.
    CpRingProtocol p(2, 64);
    EXPECT_TRUE(internal(p.Receive(1, 1).status()));
  }
  {  // Out-of-range arguments.
    CpRingProtocol p(2, 64);
    EXPECT_TRUE(internal(p.Grant(2, 0)));
    EXPECT_TRUE(internal(p.Grant(-1, 0)));
    EXPECT_TRUE(internal(p.Grant(0, -1)));
    EXPECT_TRUE(internal(p.Post(0, 0, 65)));
    EXPECT_TRUE(internal(p.Post(0, 0, -1)));
  }
  {  // A second credit on a slot whose credit is unused; a grant twice.
    CpRingProtocol p(2, 64);
    ASSERT_TRUE(p.Grant(1, 1).ok());
    EXPECT_TRUE(internal(p.Grant(1, 1)));
    EXPECT_TRUE(internal(p.Grant(1, 3)));
    EXPECT_EQ(p.Credits(1), 1);
  }
  {  // A grant before the message in the slot was received.
    CpRingProtocol p(2, 64);
    ASSERT_TRUE(p.Grant(1, 1).ok());
    ASSERT_TRUE(p.Post(0, 0, 8).ok());
    ASSERT_TRUE(p.AwaitCredit(0, 0).ok());
    ASSERT_TRUE(p.Delivered(0, 0).ok());
    EXPECT_TRUE(internal(p.Grant(1, 3)));
    // Receiving it makes the same grant legal.
    ASSERT_TRUE(p.Receive(1, 1).ok());
    EXPECT_TRUE(internal(p.Receive(1, 1).status()));  // twice
    EXPECT_TRUE(p.Grant(1, 3).ok());
  }
  {  // Forwarding a received step before receiving it; a grant before the
     // forwarding send completed; a second send in flight.
    CpRingProtocol p(3, 64);
    ASSERT_TRUE(p.Grant(1, 1).ok());
    ASSERT_TRUE(p.Grant(2, 2).ok());
    ASSERT_TRUE(p.Post(0, 0, 8).ok());
    EXPECT_TRUE(internal(p.Post(1, 1, 8)));  // read before write
    ASSERT_TRUE(p.Delivered(0, 0).ok());
    EXPECT_TRUE(internal(p.Post(0, 2, 8)));  // step 0 not waited for
    ASSERT_TRUE(p.Receive(1, 1).ok());
    ASSERT_TRUE(p.Post(1, 1, 8).ok());
    EXPECT_TRUE(internal(p.Grant(1, 3)));  // its send reads slot 1
    ASSERT_TRUE(p.Delivered(1, 1).ok());
    ASSERT_TRUE(p.AwaitSent(1, 1).ok());
    EXPECT_TRUE(p.Grant(1, 3).ok());
    EXPECT_TRUE(internal(p.Post(1, 1, 8)));  // a step sent twice
  }
  {  // Deliveries need the receiver's credit for exactly the next step.
    CpRingProtocol p(2, 64);
    ASSERT_TRUE(p.Post(0, 0, 8).ok());
    EXPECT_FALSE(p.CreditReady(0, 0));
    EXPECT_TRUE(internal(p.Delivered(0, 0)));
    ASSERT_TRUE(p.Grant(1, 3).ok());  // slot 1, but for step 3
    EXPECT_TRUE(internal(p.AwaitCredit(0, 0)));
    EXPECT_TRUE(internal(p.Delivered(0, 0)));
  }
  {  // Waiting for a send never posted, or a credit for one.
    CpRingProtocol p(2, 64);
    EXPECT_TRUE(internal(p.AwaitSent(0, 0)));
    EXPECT_TRUE(internal(p.AwaitCredit(0, 0)));
  }
  {  // A receive whose sender went past the step it waits for.
    CpRingProtocol p(2, 64);
    ASSERT_TRUE(p.Grant(1, 1).ok());
    ASSERT_TRUE(p.Post(0, 2, 8).ok());  // skipped step 0
    EXPECT_TRUE(internal(p.Receive(1, 1).status()));
  }
  {  // The end of a run with a credit, a message or a send outstanding.
    CpRingProtocol credit(2, 64);
    ASSERT_TRUE(credit.Grant(1, 1).ok());
    EXPECT_TRUE(internal(credit.Drained()));
    CpRingProtocol message(2, 64);
    ASSERT_TRUE(message.Grant(1, 1).ok());
    ASSERT_TRUE(message.Post(0, 0, 8).ok());
    ASSERT_TRUE(message.Delivered(0, 0).ok());
    ASSERT_TRUE(message.AwaitSent(0, 0).ok());
    EXPECT_TRUE(internal(message.Drained()));
    ASSERT_TRUE(message.Receive(1, 1).ok());
    EXPECT_TRUE(message.Drained().ok());
    CpRingProtocol send(2, 64);
    ASSERT_TRUE(send.Post(0, 1, 8).ok());  // step 1 is a fill of slot 1
    EXPECT_TRUE(internal(send.Drained()));
  }
}

TEST(CpRingProtocolTest, AMisuseChangesNothing) {
  CpRingProtocol p(2, 64);
  ASSERT_TRUE(p.Grant(1, 1).ok());
  EXPECT_FALSE(p.Post(0, 0, 65).ok());
  // The refused send left no trace: the same step may still be sent.
  ASSERT_TRUE(p.Post(0, 0, 8).ok());
  ASSERT_TRUE(p.AwaitCredit(0, 0).ok());
  ASSERT_TRUE(p.Delivered(0, 0).ok());
  absl::StatusOr<int64_t> bytes = p.Receive(1, 1);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, 8);
}

TEST(CpRingProtocolTest, AbortWakesEveryWaiterAndEveryLaterCall) {
  CpRingProtocol p(2, 64);
  ASSERT_TRUE(p.Grant(1, 1).ok());
  // Rank 1 fills and sends step 2; rank 0 never grants step 3.
  ASSERT_TRUE(p.Post(1, 2, 8).ok());
  std::thread blocked_receive([&] {
    EXPECT_EQ(p.Receive(1, 1).status().code(), absl::StatusCode::kCancelled);
  });
  std::thread blocked_credit([&] {
    EXPECT_EQ(p.AwaitCredit(1, 2).code(), absl::StatusCode::kCancelled);
  });
  p.Abort(absl::CancelledError("stop"));
  p.Abort(absl::InternalError("second"));  // the first status wins
  blocked_receive.join();
  blocked_credit.join();
  EXPECT_EQ(p.Grant(0, 4).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(p.Post(0, 0, 8).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(p.Drained().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
