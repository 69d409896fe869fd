// InProcessTransport: the CpTransport of the CPU replay, ranks as threads
// of one process (or as turns of a lock-step loop). Send waits for the
// receiver's credit and copies the slot into the receiver's slot at once
// (so WaitSent returns immediately); Receive waits for the copy. Slots are
// plain host memory owned by the transport.
//
// Thread safety and errors: as CpTransport (transport.h). Create fails with
// InvalidArgument for world < 1 or slot_bytes < 0, and ResourceExhausted
// when the slots (2 x world x slot_bytes) would exceed `max_bytes`.
#ifndef ATTNAUDIT_CORE_CP_TRANSPORT_IN_PROCESS_H_
#define ATTNAUDIT_CORE_CP_TRANSPORT_IN_PROCESS_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cp/transport/transport.h"

namespace attnaudit {

// Two 8-byte aligned slots per rank and the credit/arrival bookkeeping of
// the protocol, shared by InProcessTransport and test transports that
// deliver differently (tests/unit/core/cp).
class CpSlots {
 public:
  CpSlots(int64_t world, int64_t slot_bytes);

  int64_t world() const { return world_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  char* Slot(int64_t rank, int64_t slot);

  // All waits return the abort status once Abort was called.
  // Blocks until `rank` granted slot step % 2 for `step`.
  absl::Status WaitGranted(int64_t rank, int64_t step);
  bool Granted(int64_t rank, int64_t step);
  // Marks the message for `step` complete in rank's slot step % 2.
  void Arrive(int64_t rank, int64_t step, int64_t bytes);
  // Blocks until the message for `step` arrived; returns its size.
  absl::StatusOr<int64_t> WaitArrived(int64_t rank, int64_t step);
  void Grant(int64_t rank, int64_t step);
  void Abort(const absl::Status& status);
  absl::Status aborted();

 private:
  struct RankState {
    int64_t granted[2] = {-1, -1};  // step each slot is granted for
    int64_t arrived[2] = {-1, -1};  // step of the message each slot holds
    int64_t bytes[2] = {0, 0};
  };
  int64_t world_;
  int64_t slot_bytes_;
  int64_t words_per_slot_;
  std::unique_ptr<uint64_t[]> memory_;
  std::vector<RankState> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  absl::Status abort_;
};

class InProcessTransport : public CpTransport {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessTransport>> Create(
      int64_t world, int64_t slot_bytes, int64_t max_bytes);

  int64_t world() const override { return slots_.world(); }
  int64_t slot_bytes() const override { return slots_.slot_bytes(); }
  char* Slot(int64_t rank, int64_t slot) override {
    return slots_.Slot(rank, slot);
  }
  absl::Status Send(int64_t rank, int64_t step, int64_t bytes) override;
  absl::Status WaitSent(int64_t rank, int64_t step) override;
  absl::StatusOr<int64_t> Receive(int64_t rank, int64_t step) override;
  absl::Status Release(int64_t rank, int64_t step) override;
  void Abort(const absl::Status& status) override { slots_.Abort(status); }

 private:
  InProcessTransport(int64_t world, int64_t slot_bytes)
      : slots_(world, slot_bytes) {}
  CpSlots slots_;
};

// The bytes Create would allocate: 2 x world x slot_bytes, rounded to
// words (saturating).
int64_t CpTransportBytes(int64_t world, int64_t slot_bytes);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_CP_TRANSPORT_IN_PROCESS_H_
