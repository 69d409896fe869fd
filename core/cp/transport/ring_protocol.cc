#include "core/cp/transport/ring_protocol.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace attnaudit {
namespace {

absl::Status Violation(int64_t rank, int64_t step, const std::string& what) {
  return absl::InternalError(absl::StrCat("cp ring protocol: rank ", rank,
                                          " step ", step, ": ", what));
}

}  // namespace

CpRingProtocol::CpRingProtocol(int64_t world, int64_t slot_bytes)
    : world_(world),
      slot_bytes_(slot_bytes),
      ranks_(static_cast<size_t>(world < 1 ? 1 : world)) {}

absl::Status CpRingProtocol::CheckArgs(int64_t rank, int64_t step) const {
  if (!abort_.ok()) return abort_;
  if (rank < 0 || rank >= world_ || step < 0) {
    return Violation(rank, step,
                     absl::StrCat("out of range (", world_, " ranks)"));
  }
  return absl::OkStatus();
}

absl::Status CpRingProtocol::CheckGrantLocked(int64_t rank,
                                              int64_t step) const {
  const RankState& r = ranks_[rank];
  const int64_t slot = SlotOf(step);
  const SlotState& s = r.slot[slot];
  if (step <= s.granted) {
    return Violation(
        rank, step,
        absl::StrCat("grant of slot ", slot, ", already granted for step ",
                     s.granted, " (grants go forward, once per step)"));
  }
  if (step <= r.posted) {
    return Violation(rank, step,
                     absl::StrCat("grant of a step the rank is past (it sent "
                                  "step ",
                                  r.posted, ")"));
  }
  if (s.granted > s.arrived) {
    return Violation(
        rank, step,
        absl::StrCat("grant of slot ", slot, " while its credit for step ",
                     s.granted, " is unused (one credit per slot)"));
  }
  if (s.arrived > s.received) {
    return Violation(
        rank, step,
        absl::StrCat("grant of slot ", slot, " before the message of step ",
                     s.arrived, " in it was received"));
  }
  if (r.posted >= 0 && SlotOf(r.posted) == slot && r.waited < r.posted) {
    return Violation(rank, step,
                     absl::StrCat("grant of slot ", slot,
                                  " before its forwarding send of step ",
                                  r.posted, " completed (AwaitSent)"));
  }
  return absl::OkStatus();
}

absl::Status CpRingProtocol::CheckGrant(int64_t rank, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckArgs(rank, step); !s.ok()) return s;
  return CheckGrantLocked(rank, step);
}

absl::Status CpRingProtocol::Grant(int64_t rank, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckArgs(rank, step); !s.ok()) return s;
    if (absl::Status s = CheckGrantLocked(rank, step); !s.ok()) return s;
    ranks_[rank].slot[SlotOf(step)].granted = step;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CpRingProtocol::Receive(int64_t rank, int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  if (absl::Status s = CheckArgs(rank, step); !s.ok()) return s;
  SlotState& s = ranks_[rank].slot[SlotOf(step)];
  if (step <= s.received) {
    return Violation(rank, step,
                     absl::StrCat("receive after step ", s.received,
                                  " was received (once per step, in order)"));
  }
  if (s.granted != step) {
    // Nobody may send into a slot that was not granted for the step: the
    // wait could never end.
    return Violation(rank, step,
                     absl::StrCat("receive from slot ", SlotOf(step),
                                  ", which is granted for step ", s.granted));
  }
  const RankState& sender = ranks_[Prev(rank)];
  cv_.wait(lock, [&] {
    return !abort_.ok() || s.arrived >= step || sender.posted >= step;
  });
  if (!abort_.ok()) return abort_;
  if (s.arrived != step) {
    // Sends go forward one at a time, so the sender will never send the
    // step this rank waits for.
    return Violation(
        rank, step,
        absl::StrCat("rank ", Prev(rank), " sent step ", sender.posted,
                     " without sending step ", step - 1,
                     ", whose message this receive "
                     "waits for"));
  }
  s.received = step;
  return s.bytes;
}

absl::Status CpRingProtocol::Post(int64_t rank, int64_t step, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckArgs(rank, step); !s.ok()) return s;
    RankState& r = ranks_[rank];
    if (bytes < 0 || bytes > slot_bytes_) {
      return Violation(rank, step,
                       absl::StrCat("send of ", bytes, " bytes; a slot holds ",
                                    slot_bytes_));
    }
    if (step <= r.posted) {
      return Violation(rank, step,
                       absl::StrCat("send after step ", r.posted,
                                    " was sent (sends go forward, once per "
                                    "step)"));
    }
    if (r.waited < r.posted) {
      return Violation(rank, step,
                       absl::StrCat("send while the send of step ", r.posted,
                                    " is in flight (AwaitSent first)"));
    }
    const SlotState& s = r.slot[SlotOf(step)];
    if (s.granted > step) {
      return Violation(rank, step,
                       absl::StrCat("send from slot ", SlotOf(step),
                                    ", already granted for step ", s.granted,
                                    " (a grant comes after the last read)"));
    }
    if (s.granted == step && s.received != step) {
      return Violation(rank, step,
                       "forwarding the step's message before receiving it");
    }
    r.posted = step;
    r.posted_bytes = bytes;
  }
  cv_.notify_all();  // a receiver may learn that its wait cannot end
  return absl::OkStatus();
}

bool CpRingProtocol::CreditReadyLocked(int64_t rank, int64_t step) const {
  return ranks_[Next(rank)].slot[SlotOf(step + 1)].granted >= step + 1;
}

absl::Status CpRingProtocol::CheckCreditLocked(int64_t rank,
                                               int64_t step) const {
  const int64_t next = Next(rank);
  const SlotState& s = ranks_[next].slot[SlotOf(step + 1)];
  if (s.granted != step + 1) {
    return Violation(
        rank, step,
        absl::StrCat("rank ", next, " granted slot ", SlotOf(step + 1),
                     " for step ", s.granted, ", not for step ", step + 1));
  }
  if (s.arrived >= step + 1) {
    return Violation(rank, step,
                     absl::StrCat("rank ", next, "'s credit for step ",
                                  step + 1, " is already used"));
  }
  return absl::OkStatus();
}

absl::Status CpRingProtocol::AwaitCredit(int64_t rank, int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  if (absl::Status s = CheckArgs(rank, step); !s.ok()) return s;
  if (ranks_[rank].posted != step) {
    return Violation(rank, step,
                     absl::StrCat("credit awaited for a send not posted (the "
                                  "rank's last send is step ",
                                  ranks_[rank].posted, ")"));
  }
  cv_.wait(lock, [&] { return !abort_.ok() || CreditReadyLocked(rank, step); });
  if (!abort_.ok()) return abort_;
  return CheckCreditLocked(rank, step);
}

absl::Status CpRingProtocol::Delivered(int64_t rank, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckArgs(rank, step); !s.ok()) return s;
    RankState& r = ranks_[rank];
    if (r.posted != step || r.delivered >= step) {
      return Violation(
          rank, step,
          absl::StrCat("delivery of a send not in flight (last "
                       "posted step ",
                       r.posted, ", last delivered ", r.delivered, ")"));
    }
    if (absl::Status s = CheckCreditLocked(rank, step); !s.ok()) return s;
    SlotState& s = ranks_[Next(rank)].slot[SlotOf(step + 1)];
    s.arrived = step + 1;
    s.bytes = r.posted_bytes;
    r.delivered = step;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status CpRingProtocol::AwaitSent(int64_t rank, int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  if (absl::Status s = CheckArgs(rank, step); !s.ok()) return s;
  RankState& r = ranks_[rank];
  if (r.posted != step) {
    return Violation(rank, step,
                     absl::StrCat("wait for a send not posted (the rank's "
                                  "last send is step ",
                                  r.posted, ")"));
  }
  cv_.wait(lock, [&] { return !abort_.ok() || r.delivered >= step; });
  if (!abort_.ok()) return abort_;
  r.waited = step;
  return absl::OkStatus();
}

bool CpRingProtocol::CreditReady(int64_t rank, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!CheckArgs(rank, step).ok()) return !abort_.ok();
  return CreditReadyLocked(rank, step);
}

bool CpRingProtocol::Arrived(int64_t rank, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!CheckArgs(rank, step).ok()) return !abort_.ok();
  return ranks_[rank].slot[SlotOf(step)].arrived >= step;
}

bool CpRingProtocol::SendComplete(int64_t rank, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!CheckArgs(rank, step).ok()) return !abort_.ok();
  return ranks_[rank].delivered >= step;
}

int64_t CpRingProtocol::Credits(int64_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (rank < 0 || rank >= world_) return 0;
  int64_t credits = 0;
  for (const SlotState& s : ranks_[rank].slot) {
    credits += s.granted > s.arrived ? 1 : 0;
  }
  return credits;
}

absl::Status CpRingProtocol::Drained() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!abort_.ok()) return abort_;
  for (int64_t k = 0; k < world_; ++k) {
    const RankState& r = ranks_[k];
    for (const SlotState& s : r.slot) {
      if (s.granted > s.arrived) {
        return Violation(k, s.granted, "credit never used (the run ended)");
      }
      if (s.arrived > s.received) {
        return Violation(k, s.arrived,
                         "message never received (the run ended)");
      }
    }
    if (r.waited < r.posted) {
      return Violation(k, r.posted, "send never waited for (the run ended)");
    }
  }
  return absl::OkStatus();
}

void CpRingProtocol::Abort(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_.ok()) {
      abort_ =
          status.ok() ? absl::AbortedError("cp transport aborted") : status;
    }
  }
  cv_.notify_all();
}

absl::Status CpRingProtocol::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_;
}

}  // namespace attnaudit
