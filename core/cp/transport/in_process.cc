#include "core/cp/transport/in_process.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace attnaudit {
namespace {

int64_t Words(int64_t bytes) { return std::max<int64_t>(1, (bytes + 7) / 8); }

}  // namespace

int64_t CpTransportBytes(int64_t world, int64_t slot_bytes) {
  const int64_t words = Words(slot_bytes);
  const int64_t max = std::numeric_limits<int64_t>::max();
  if (world <= 0) return 0;
  if (words > max / 16 / world) return max;
  return 16 * world * words;
}

CpSlots::CpSlots(int64_t world, int64_t slot_bytes)
    : world_(world),
      slot_bytes_(slot_bytes),
      words_per_slot_(Words(slot_bytes)),
      // Zeroed: no slot ever holds bytes a previous audit left behind.
      memory_(
          new uint64_t[static_cast<size_t>(2 * world * Words(slot_bytes))]()),
      ranks_(static_cast<size_t>(world)) {}

char* CpSlots::Slot(int64_t rank, int64_t slot) {
  return reinterpret_cast<char*>(memory_.get() +
                                 (rank * 2 + slot) * words_per_slot_);
}

absl::Status CpSlots::WaitGranted(int64_t rank, int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    return !abort_.ok() || ranks_[rank].granted[step % 2] >= step;
  });
  return abort_;
}

bool CpSlots::Granted(int64_t rank, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_[rank].granted[step % 2] >= step;
}

void CpSlots::Arrive(int64_t rank, int64_t step, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranks_[rank].arrived[step % 2] = step;
    ranks_[rank].bytes[step % 2] = bytes;
  }
  cv_.notify_all();
}

absl::StatusOr<int64_t> CpSlots::WaitArrived(int64_t rank, int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    return !abort_.ok() || ranks_[rank].arrived[step % 2] >= step;
  });
  if (!abort_.ok()) return abort_;
  const RankState& r = ranks_[rank];
  if (r.arrived[step % 2] != step) {
    // A later message landed before this one was read: a credit was
    // granted too early.
    return absl::InternalError(absl::StrCat(
        "cp transport: rank ", rank, " slot ", step % 2, " holds step ",
        r.arrived[step % 2], " when step ", step, " reads it"));
  }
  return r.bytes[step % 2];
}

void CpSlots::Grant(int64_t rank, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t& g = ranks_[rank].granted[step % 2];
    g = std::max(g, step);
  }
  cv_.notify_all();
}

void CpSlots::Abort(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_.ok()) {
      abort_ =
          status.ok() ? absl::AbortedError("cp transport aborted") : status;
    }
  }
  cv_.notify_all();
}

absl::Status CpSlots::aborted() {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_;
}

absl::StatusOr<std::unique_ptr<InProcessTransport>> InProcessTransport::Create(
    int64_t world, int64_t slot_bytes, int64_t max_bytes) {
  if (world < 1 || slot_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cp transport: world ", world, " and slot bytes ",
                     slot_bytes, " must be >= 1 and >= 0"));
  }
  const int64_t bytes = CpTransportBytes(world, slot_bytes);
  if (bytes > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cp.world_size: the ring's buffers (2 slots x ", world, " ranks x ",
        slot_bytes, " bytes) exceed the limit of ", max_bytes, " bytes"));
  }
  return std::unique_ptr<InProcessTransport>(
      new InProcessTransport(world, slot_bytes));
}

absl::Status InProcessTransport::Send(int64_t rank, int64_t step,
                                      int64_t bytes) {
  if (bytes < 0 || bytes > slots_.slot_bytes()) {
    return absl::InternalError(
        absl::StrCat("cp transport: rank ", rank, " sends ", bytes,
                     " bytes; a slot holds ", slots_.slot_bytes()));
  }
  const int64_t next = (rank + 1) % slots_.world();
  if (absl::Status s = slots_.WaitGranted(next, step + 1); !s.ok()) return s;
  std::memcpy(slots_.Slot(next, (step + 1) % 2), slots_.Slot(rank, step % 2),
              static_cast<size_t>(bytes));
  slots_.Arrive(next, step + 1, bytes);
  return absl::OkStatus();
}

absl::Status InProcessTransport::WaitSent(int64_t, int64_t) {
  return slots_.aborted();  // Send copied synchronously
}

absl::StatusOr<int64_t> InProcessTransport::Receive(int64_t rank,
                                                    int64_t step) {
  return slots_.WaitArrived(rank, step);
}

absl::Status InProcessTransport::Release(int64_t rank, int64_t step) {
  slots_.Grant(rank, step);
  return slots_.aborted();
}

}  // namespace attnaudit
