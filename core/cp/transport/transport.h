// The ring transport of a context-parallel (CP) replay: how a rank's chunk
// of KV moves to the next rank (core/cp/schedule/schedule.h states the
// schedule it serves). One small interface so that the CPU replay, a
// single-GPU (CUDA-local) ring and a multi-GPU (NCCL) ring run the same
// schedule; InProcessTransport (in_process.h) is the CPU one.
//
// Buffers. Every rank r owns two receive slots, 0 and 1, of slot_bytes()
// bytes each, stable for the transport's whole life (Slot() returns
// 8-byte aligned memory: host memory the transport owns here, device
// memory its caller owns for the GPU transports of
// kernels/cuda_transports.h, which keep
// this contract in stream order -- "complete" there means "ordered before
// later work on the rank's stream"). Step s of the schedule uses slot s % 2
// of every rank.
//
// Contract: the ring protocol of ring_protocol.h (CpRingProtocol), which
// every transport is built on; per rank r and global step s (calls for one
// rank come from one thread at a time, in step order; different ranks may
// call concurrently), the operations are its steps:
//   - Release(r, s) grants slot s % 2 of rank r to rank r - 1 for step s
//     (CpRingProtocol::Grant): only after rank r's last read of that
//     slot's previous content (its compute AND its own forwarding send,
//     i.e. after WaitSent). Credits start at zero: before its first step a
//     rank grants the steps in {0, 1} that receive, and after step s it
//     grants step s + 2 when that step receives (CpSchedule::GrantsAfter).
//   - Receive(r, s) blocks until the message that rank r - 1 sent for step
//     s is complete in slot s % 2, and returns its size. A step that does
//     not receive (round 0) is a local fill: the rank writes slot s % 2
//     itself, which it may because it granted nobody that slot for step s.
//   - Send(r, s, bytes) sends the first `bytes` of rank r's slot s % 2 to
//     rank r + 1, into that rank's slot (s + 1) % 2, for step s + 1 (Post,
//     then the data lands once the receiver's credit is there: Send blocks
//     or delivery waits). It may return before the data has moved: rank r
//     must not modify its slot s % 2 until WaitSent(r, s) has returned.
//   - Drained(), after the last step: OK when the run ended with no credit
//     outstanding, every message received and every send waited for.
//   - Abort(status) makes every blocked and every later call return
//     `status` (a failed or cancelled rank must not leave the others
//     waiting forever). Idempotent; the first status wins.
// One transport serves one replay (steps start at 0 and only increase).
// Errors: Internal for a protocol violation (ring_protocol.h lists them: a
// message for the wrong step, a send larger than a slot, a grant before
// the last read, a receive never granted), the abort status after Abort.
// Thread-safe under the per-rank rule above.
#ifndef ATTNAUDIT_CORE_CP_TRANSPORT_TRANSPORT_H_
#define ATTNAUDIT_CORE_CP_TRANSPORT_TRANSPORT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attnaudit {

class CpTransport {
 public:
  virtual ~CpTransport() = default;

  virtual int64_t world() const = 0;
  virtual int64_t slot_bytes() const = 0;
  virtual char* Slot(int64_t rank, int64_t slot) = 0;

  virtual absl::Status Send(int64_t rank, int64_t step, int64_t bytes) = 0;
  virtual absl::Status WaitSent(int64_t rank, int64_t step) = 0;
  virtual absl::StatusOr<int64_t> Receive(int64_t rank, int64_t step) = 0;
  virtual absl::Status Release(int64_t rank, int64_t step) = 0;
  virtual absl::Status Drained() = 0;
  virtual void Abort(const absl::Status& status) = 0;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_CP_TRANSPORT_TRANSPORT_H_
