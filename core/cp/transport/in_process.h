// InProcessTransport: the CpTransport of the CPU replay, ranks as threads
// of one process (or as turns of a lock-step loop), on the ring protocol of
// ring_protocol.h. Send waits for the receiver's credit and copies the slot
// into the receiver's slot at once (so WaitSent returns immediately);
// Receive waits for the copy. Slots are plain host memory owned by the
// transport (CpHostSlots).
//
// Thread safety and errors: as CpTransport (transport.h). Create fails with
// InvalidArgument for world < 1 or slot_bytes < 0, and ResourceExhausted
// when the slots (2 x world x slot_bytes) would exceed `max_bytes`.
#ifndef ATTNAUDIT_CORE_CP_TRANSPORT_IN_PROCESS_H_
#define ATTNAUDIT_CORE_CP_TRANSPORT_IN_PROCESS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cp/transport/ring_protocol.h"
#include "core/cp/transport/transport.h"

namespace attnaudit {

// Two zeroed, 8-byte aligned host slots of slot_bytes bytes per rank: the
// memory of InProcessTransport and of test transports that deliver
// differently (tests/unit/core/cp). Owns the memory; no synchronisation
// (the ring protocol says who may touch which slot when).
class CpHostSlots {
 public:
  CpHostSlots(int64_t world, int64_t slot_bytes);

  char* Slot(int64_t rank, int64_t slot) {
    return reinterpret_cast<char*>(memory_.get() +
                                   (rank * 2 + slot) * words_per_slot_);
  }

 private:
  int64_t words_per_slot_;
  std::unique_ptr<uint64_t[]> memory_;
};

class InProcessTransport : public CpTransport {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessTransport>> Create(
      int64_t world, int64_t slot_bytes, int64_t max_bytes);

  int64_t world() const override { return protocol_.world(); }
  int64_t slot_bytes() const override { return protocol_.slot_bytes(); }
  char* Slot(int64_t rank, int64_t slot) override {
    return slots_.Slot(rank, slot);
  }
  absl::Status Send(int64_t rank, int64_t step, int64_t bytes) override;
  absl::Status WaitSent(int64_t rank, int64_t step) override {
    return protocol_.AwaitSent(rank, step);  // Send copied synchronously
  }
  absl::StatusOr<int64_t> Receive(int64_t rank, int64_t step) override {
    return protocol_.Receive(rank, step);
  }
  absl::Status Release(int64_t rank, int64_t step) override {
    return protocol_.Grant(rank, step);
  }
  absl::Status Drained() override { return protocol_.Drained(); }
  void Abort(const absl::Status& status) override { protocol_.Abort(status); }

 private:
  InProcessTransport(int64_t world, int64_t slot_bytes)
      : protocol_(world, slot_bytes), slots_(world, slot_bytes) {}
  CpRingProtocol protocol_;
  CpHostSlots slots_;
};

// The bytes Create would allocate: 2 x world x slot_bytes, rounded to
// words (saturating).
int64_t CpTransportBytes(int64_t world, int64_t slot_bytes);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_CP_TRANSPORT_IN_PROCESS_H_
