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

CpHostSlots::CpHostSlots(int64_t world, int64_t slot_bytes)
    : words_per_slot_(Words(slot_bytes)),
      // Zeroed: no slot ever holds bytes a previous audit left behind.
      memory_(
          new uint64_t[static_cast<size_t>(2 * world * Words(slot_bytes))]()) {}

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
  if (absl::Status s = protocol_.Post(rank, step, bytes); !s.ok()) return s;
  if (absl::Status s = protocol_.AwaitCredit(rank, step); !s.ok()) return s;
  std::memcpy(
      slots_.Slot(protocol_.Next(rank), CpRingProtocol::SlotOf(step + 1)),
      slots_.Slot(rank, CpRingProtocol::SlotOf(step)),
      static_cast<size_t>(bytes));
  return protocol_.Delivered(rank, step);
}

}  // namespace attnaudit
