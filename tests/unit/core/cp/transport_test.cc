// The ring protocol under a transport that delays and reorders deliveries
// at random: a send returns at once, and a delivery thread copies pending
// messages in random order after random delays, reading the sender's slot
// only then (like a one-sided put) and landing only in slots the receiver
// has granted, all through the ring protocol (ring_protocol.h). The replay
// must produce the very same bits as over the in-process transport, for
// odd and even W and both executions. Also: a transport that delivers to
// the wrong rank is caught, not folded in.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cp/replay/combine.h"
#include "core/cp/replay/replay.h"
#include "core/cp/transport/in_process.h"
#include "core/cp/transport/ring_protocol.h"
#include "gtest/gtest.h"
#include "tests/unit/core/cp/cp_cases.h"

namespace attnaudit {
namespace testing {
namespace {

class DelayingTransport : public CpTransport {
 public:
  DelayingTransport(int64_t world, int64_t slot_bytes, uint64_t seed)
      : protocol_(world, slot_bytes),
        slots_(world, slot_bytes),
        rng_(seed),
        thread_([this] { Deliver(); }) {}
  ~DelayingTransport() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    thread_.join();
  }

  int64_t world() const override { return protocol_.world(); }
  int64_t slot_bytes() const override { return protocol_.slot_bytes(); }
  char* Slot(int64_t rank, int64_t slot) override {
    return slots_.Slot(rank, slot);
  }
  absl::Status Send(int64_t rank, int64_t step, int64_t bytes) override {
    if (absl::Status s = protocol_.Post(rank, step, bytes); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({rank, step, bytes});
    return absl::OkStatus();
  }
  absl::Status WaitSent(int64_t rank, int64_t step) override {
    return protocol_.AwaitSent(rank, step);
  }
  absl::StatusOr<int64_t> Receive(int64_t rank, int64_t step) override {
    return protocol_.Receive(rank, step);
  }
  absl::Status Release(int64_t rank, int64_t step) override {
    return protocol_.Grant(rank, step);
  }
  absl::Status Drained() override { return protocol_.Drained(); }
  void Abort(const absl::Status& status) override { protocol_.Abort(status); }

  int64_t delivered() const { return delivered_.load(); }

 private:
  struct Message {
    int64_t rank, step, bytes;
  };

  // Picks a random pending message whose destination slot is granted,
  // waits a random while, then copies it.
  void Deliver() {
    while (true) {
      Message m{-1, 0, 0};
      int64_t delay_us = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        std::vector<size_t> ready;
        for (size_t i = 0; i < pending_.size(); ++i) {
          if (protocol_.CreditReady(pending_[i].rank, pending_[i].step)) {
            ready.push_back(i);
          }
        }
        if (!ready.empty()) {
          const size_t pick = ready[rng_() % ready.size()];
          m = pending_[pick];
          pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(pick));
          delay_us = static_cast<int64_t>(rng_() % 200);
        }
      }
      if (m.rank < 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(10));
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      // Returns at once (the credit is ready); a wrong credit is an error.
      absl::Status s = protocol_.AwaitCredit(m.rank, m.step);
      if (s.ok()) {
        std::memcpy(slots_.Slot(protocol_.Next(m.rank), (m.step + 1) % 2),
                    slots_.Slot(m.rank, m.step % 2),
                    static_cast<size_t>(m.bytes));
        // Counted first: a waiting sender may finish the run as soon as
        // the protocol knows.
        delivered_.fetch_add(1);
        s = protocol_.Delivered(m.rank, m.step);
      }
      if (!s.ok()) protocol_.Abort(s);
    }
  }

  CpRingProtocol protocol_;
  CpHostSlots slots_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  std::vector<Message> pending_;
  bool stop_ = false;
  std::atomic<int64_t> delivered_{0};
  std::thread thread_;
};

// A ring wired in another order: rank r's successor is r + 2 (W odd). The
// protocol is kept to the letter (its ranks are the wiring's order,
// protocol rank 2r mod W for rank r), but rank r + 1 waits for rank r's
// chunk and rank r + 2 gets it.
class CrossWiredTransport : public CpTransport {
 public:
  CrossWiredTransport(int64_t world, int64_t slot_bytes)
      : protocol_(world, slot_bytes), slots_(world, slot_bytes) {}
  int64_t world() const override { return protocol_.world(); }
  int64_t slot_bytes() const override { return protocol_.slot_bytes(); }
  char* Slot(int64_t rank, int64_t slot) override {
    return slots_.Slot(rank, slot);
  }
  absl::Status Send(int64_t rank, int64_t step, int64_t bytes) override {
    const int64_t v = Wired(rank);
    if (absl::Status s = protocol_.Post(v, step, bytes); !s.ok()) return s;
    if (absl::Status s = protocol_.AwaitCredit(v, step); !s.ok()) return s;
    std::memcpy(slots_.Slot(Real(protocol_.Next(v)), (step + 1) % 2),
                slots_.Slot(rank, step % 2), static_cast<size_t>(bytes));
    return protocol_.Delivered(v, step);
  }
  absl::Status WaitSent(int64_t rank, int64_t step) override {
    return protocol_.AwaitSent(Wired(rank), step);
  }
  absl::StatusOr<int64_t> Receive(int64_t rank, int64_t step) override {
    return protocol_.Receive(Wired(rank), step);
  }
  absl::Status Release(int64_t rank, int64_t step) override {
    return protocol_.Grant(Wired(rank), step);
  }
  absl::Status Drained() override { return protocol_.Drained(); }
  void Abort(const absl::Status& status) override { protocol_.Abort(status); }

 private:
  int64_t Wired(int64_t rank) const { return 2 * rank % world(); }
  // 2 has the inverse (W + 1) / 2 modulo an odd W.
  int64_t Real(int64_t wired) const {
    return wired * ((world() + 1) / 2) % world();
  }

  CpRingProtocol protocol_;
  CpHostSlots slots_;
};

TEST(CpTransportTest, RandomDelaysAndReorderingGiveTheSameBits) {
  int seed = 0;
  for (int64_t world : {2, 3, 5, 8}) {
    for (const CpLayout& l :
         {CpLayout{CpSharding::kTokenInterleaved, world, 3},
          CpLayout{CpSharding::kPageInterleaved, world, 1}}) {
      CpCaseOptions o;
      o.seq_lens = {31, 6, 19};
      o.seed = static_cast<uint64_t>(world);
      const auto c = MakeCpCase(l, o);
      ASSERT_NE(c, nullptr);
      const PreparedAttention& p = c->prepared;
      const CpShards shards = PlanShards(p.units, world, p.dims.page_size);
      // Two rows per pass: the global step counter crosses passes.
      const CpSchedule schedule(shards, CpReplayStrategy::kRing,
                                p.dims.kv_heads, CpTokenBytes(p),
                                2 * p.dims.page_size * CpTokenBytes(p));
      for (CpExecution e :
           {CpExecution::kThreadPerRank, CpExecution::kLockstep}) {
        const std::string what =
            absl::StrCat(Describe(l), " ", CpExecutionName(e));
        DelayingTransport transport(world, CpSlotBytes(p, schedule),
                                    static_cast<uint64_t>(++seed));
        CpReplayOptions opt;
        opt.threads = 2;
        opt.execution = e;
        opt.transport = &transport;
        absl::StatusOr<CpReplayRun> run = RunCpReplay(p, schedule, opt);
        ASSERT_TRUE(run.ok()) << what << ": " << run.status();
        // Every send of every rank went through the delaying thread.
        int64_t sends = 0;
        for (int64_t s = 0; s < schedule.steps(); ++s) {
          sends += schedule.Sends(s) ? world : 0;
        }
        EXPECT_EQ(transport.delivered(), sends) << what;
        EXPECT_EQ(std::memcmp(run->states.p_out.data(), c->states.p_out.data(),
                              c->states.p_out.size() * sizeof(float)),
                  0)
            << what;
        EXPECT_EQ(std::memcmp(run->states.p_lse.data(), c->states.p_lse.data(),
                              c->states.p_lse.size() * sizeof(float)),
                  0)
            << what;
        const CpCombined det = CombineDeterministic(p, run->states, 2);
        EXPECT_EQ(std::memcmp(det.out.data(), c->single.replay_out.data(),
                              det.out.size() * sizeof(double)),
                  0)
            << what;
      }
    }
  }
}

TEST(CpTransportTest, AMisroutedChunkIsAnErrorNotAResult) {
  const CpLayout l{CpSharding::kPageInterleaved, 3, 1};
  const auto c = MakeCpCase(l, {});
  ASSERT_NE(c, nullptr);
  const PreparedAttention& p = c->prepared;
  const CpShards shards = PlanShards(p.units, 3, p.dims.page_size);
  const CpSchedule schedule(shards, CpReplayStrategy::kRing, p.dims.kv_heads,
                            CpTokenBytes(p), int64_t{1} << 20);
  for (CpExecution e : {CpExecution::kThreadPerRank, CpExecution::kLockstep}) {
    CrossWiredTransport transport(3, CpSlotBytes(p, schedule));
    CpReplayOptions opt;
    opt.execution = e;
    opt.transport = &transport;
    absl::StatusOr<CpReplayRun> run = RunCpReplay(p, schedule, opt);
    EXPECT_EQ(run.status().code(), absl::StatusCode::kInternal)
        << CpExecutionName(e) << ": " << run.status();
  }
}

TEST(CpTransportTest, InProcessCreateChecksItsArguments) {
  EXPECT_EQ(InProcessTransport::Create(0, 8, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InProcessTransport::Create(2, 1 << 20, 1 << 20).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<std::unique_ptr<InProcessTransport>> t =
      InProcessTransport::Create(2, 64, 1 << 20);
  ASSERT_TRUE(t.ok());
  // Slots are distinct, aligned and zeroed.
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t s = 0; s < 2; ++s) {
      const char* slot = (*t)->Slot(r, s);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(slot) % 8, 0u);
      for (int i = 0; i < 64; ++i) EXPECT_EQ(slot[i], 0);
    }
  }
  EXPECT_NE((*t)->Slot(0, 1), (*t)->Slot(1, 0));
  // A send larger than a slot is a protocol error.
  EXPECT_TRUE((*t)->Release(1, 1).ok());
  EXPECT_EQ((*t)->Send(0, 0, 65).code(), absl::StatusCode::kInternal);
  // A granted send lands in the next rank's other slot.
  std::memcpy((*t)->Slot(0, 0), "hello", 6);
  ASSERT_TRUE((*t)->Send(0, 0, 6).ok());
  absl::StatusOr<int64_t> got = (*t)->Receive(1, 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 6);
  EXPECT_STREQ((*t)->Slot(1, 1), "hello");
  // Abort releases a waiter with the abort status.
  ASSERT_TRUE((*t)->Release(0, 1).ok());
  std::thread waiter([&] {
    EXPECT_EQ((*t)->Receive(0, 1).status().code(),
              absl::StatusCode::kCancelled);
  });
  (*t)->Abort(absl::CancelledError("stop"));
  waiter.join();
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
