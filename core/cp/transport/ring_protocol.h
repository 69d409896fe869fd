// CpRingProtocol: the one slot/credit protocol of the CP ring, the
// bookkeeping every ring transport is built on (InProcessTransport, the
// CUDA-local and NCCL transports of kernels/cuda_transports.h, the tests'
// delaying transport). It moves no data and owns no buffers: a transport
// moves the bytes its own way (memcpy, a device copy, ncclSend/ncclRecv)
// and tells the protocol what happened; the protocol says when a step may
// go ahead, and refuses what breaks the rules. Host code, no CUDA.
//
// What it guarantees. W ranks in a ring, each with two receive slots;
// step s uses slot s % 2 (SlotOf). Rank r's send of step s goes to rank
// Next(r) = (r + 1) mod W, into that rank's slot (s + 1) % 2, for step
// s + 1. With the calls below made in the documented order:
//   - a message lands only in a slot its receiver granted for exactly that
//     step (a credit), and each credit is used once: at most one credit per
//     slot, so at most two per rank, are ever outstanding;
//   - every slot is written once per step that uses it: by the rank itself
//     (a local fill: a step it granted nobody) or by exactly one delivery;
//   - a step reads a slot only after its write: Receive(r, s) returns once
//     the message of step s is complete, and a rank forwards (Send) a
//     received step only after it received it;
//   - a slot is granted again only after its last read: its message was
//     received and the rank's own forwarding send of it completed;
//   - a run starts with no credit and, when it is done, Drained() says
//     whether it ended with none: every credit used, every message
//     received, every send waited for.
// A call that would break a rule returns Internal (naming rank, step and
// rule) and changes nothing; a wait that can never end because the other
// party already went past it (a Receive whose sender sent a later step
// instead) returns Internal too, rather than hanging. Waits that depend on
// another rank's future calls block until that call or Abort.
//
// The sequence, per rank r and step s (one thread at a time per rank, in
// step order; different ranks concurrently):
//   Grant(r, s)          r frees slot s % 2 for its predecessor's message of
//                        step s (before step 0: the steps in {0, 1} that
//                        receive; after step s: step s + 2 when it
//                        receives, CpSchedule::GrantsAfter).
//   Receive(r, s)        blocks until the message of step s is complete in
//                        slot s % 2; its size.
//   Post(r, s, bytes)    r sends the first `bytes` of its slot s % 2 on.
//                        At most one send per rank is in flight: the
//                        previous one must have been waited for.
//   AwaitCredit(r, s)    blocks until Next(r) granted slot (s + 1) % 2 for
//                        step s + 1 (CreditReady: the same, not blocking).
//   Delivered(r, s)      the transport's report that r's posted send of
//                        step s is complete: in the receiver's slot, and
//                        r's slot no longer read by it. Uses the credit.
//                        Stream-ordered transports report it once the copy
//                        is ordered, i.e. before later work on the streams.
//   AwaitSent(r, s)      blocks until Delivered(r, s); r may then rewrite
//                        its slot s % 2 (and grant it).
// A step that does not receive is a local fill: the rank writes slot s % 2
// itself, which it may since it granted nobody that slot for step s.
//
// Steps start at 0 and only increase: one protocol (one transport) serves
// one replay. Abort(status) makes every blocked and every later call
// return `status` (the first status wins; OK becomes Aborted), so a failed
// rank cannot leave the others waiting forever.
//
// Thread safety: every method may be called from any thread (one mutex);
// the rules are checked in the order the calls take it. Arguments out of
// range (rank outside [0, W), a negative step, a size outside [0,
// slot_bytes]) are Internal errors, never undefined behaviour.
#ifndef ATTNAUDIT_CORE_CP_TRANSPORT_RING_PROTOCOL_H_
#define ATTNAUDIT_CORE_CP_TRANSPORT_RING_PROTOCOL_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attnaudit {

class CpRingProtocol {
 public:
  // world >= 1 and slot_bytes >= 0 (the transports' Create checks them).
  CpRingProtocol(int64_t world, int64_t slot_bytes);

  int64_t world() const { return world_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  static int64_t SlotOf(int64_t step) { return step % 2; }
  int64_t Next(int64_t rank) const { return (rank + 1) % world_; }
  int64_t Prev(int64_t rank) const { return (rank + world_ - 1) % world_; }

  // Receiver side.
  absl::Status Grant(int64_t rank, int64_t step);
  // Grant's checks alone: a transport that must record device work before
  // a grant becomes visible (kernels/cuda_transports.cc) checks, records,
  // then grants.
  absl::Status CheckGrant(int64_t rank, int64_t step);
  absl::StatusOr<int64_t> Receive(int64_t rank, int64_t step);

  // Sender side.
  absl::Status Post(int64_t rank, int64_t step, int64_t bytes);
  absl::Status AwaitCredit(int64_t rank, int64_t step);
  absl::Status Delivered(int64_t rank, int64_t step);
  absl::Status AwaitSent(int64_t rank, int64_t step);

  // Non-blocking observers, for transports that poll (a delivery thread)
  // and for tests.
  bool CreditReady(int64_t rank, int64_t step);   // AwaitCredit would return
  bool Arrived(int64_t rank, int64_t step);       // Receive would return
  bool SendComplete(int64_t rank, int64_t step);  // AwaitSent would return
  int64_t Credits(int64_t rank);                  // outstanding, 0..2

  absl::Status Drained();
  void Abort(const absl::Status& status);
  absl::Status status();

 private:
  struct SlotState {
    int64_t granted = -1;   // latest step the slot was granted for
    int64_t arrived = -1;   // step of the latest message delivered into it
    int64_t received = -1;  // latest step the rank took with Receive
    int64_t bytes = 0;      // size of the message of `arrived`
  };
  struct RankState {
    SlotState slot[2];
    int64_t posted = -1;  // latest step whose send was posted
    int64_t posted_bytes = 0;
    int64_t delivered = -1;  // latest step whose send completed
    int64_t waited = -1;     // latest step AwaitSent returned for
  };

  // Each takes mu_ held.
  absl::Status CheckArgs(int64_t rank, int64_t step) const;
  absl::Status CheckGrantLocked(int64_t rank, int64_t step) const;
  absl::Status CheckCreditLocked(int64_t rank, int64_t step) const;
  bool CreditReadyLocked(int64_t rank, int64_t step) const;

  const int64_t world_;
  const int64_t slot_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RankState> ranks_;
  absl::Status abort_;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_CP_TRANSPORT_RING_PROTOCOL_H_
