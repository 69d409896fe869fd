// The ring transports of the GPU CP replay, implementing core/cp's
// CpTransport (core/cp/transport/transport.h) with slots in device memory:
//
//   CudaLocalTransport  the ranks of one GPU, each a CUDA stream; a send is
//                       a device-to-device copy on the sender's copy
//                       stream.
//   NcclTransport       ranks on the GPUs of a CudaGang (rank k on GPU
//                       k mod G); the sends of one step are issued as one
//                       ncclGroupStart/End of ncclSend/ncclRecv pairs on
//                       each GPU's communication stream (a hop between two
//                       ranks of the same GPU is a device copy inside it).
//
// Stream-ordered contract. The protocol is the ring protocol of
// core/cp/transport/ring_protocol.h (CpRingProtocol, which every transport
// is built on: two slots per rank keyed on step parity, one credit per
// slot granted after the last read, zero credits at start and end, misuse
// an Internal error). The protocol's bookkeeping runs on the host when a
// call is issued; the data moves on streams, so "complete" means "ordered
// before later work on the rank's stream", and each protocol step has an
// event that carries it onto the device:
//   - Send(r, s, bytes) posts the send and waits (on the host) for the
//     receiver's grant, then orders the copy after everything already
//     queued on rank r's stream (the fill or the receive of the data) and
//     after the receiver's grant event; it reports the delivery once the
//     copy and its completion events are issued.
//   - Receive(r, s) returns once the message is issued, having made rank
//     r's stream wait for its arrival; WaitSent(r, s) makes rank r's stream
//     wait for the send's completion (so a later write to the slot on that
//     stream cannot overtake the send's read).
//   - Release(r, s) checks the grant, records the grant event on rank r's
//     stream (the slot is free once the stream has passed every read
//     queued before it), then grants, so a sender never waits on an event
//     not yet recorded.
// NcclTransport issues a step's group when the last of the step's senders
// called Send (two-sided send/receive needs both sides posted together;
// a receive is posted only into a slot granted for it, so the receive is
// the credit); a driver must therefore issue every rank's Send of a step
// before any rank's WaitSent of that step (the GPU replay's lock-step
// driver does: all sends, then all computes); a WaitSent before that is
// Internal.
//
// Ownership: slots and rank streams belong to the caller (the replay), and
// must outlive the transport; the transport owns its events and copy /
// communication streams. Thread safety: as CpTransport. Errors: CUDA and
// NCCL errors as statuses (kernels/cuda_check.h), Internal for protocol
// violations, the abort status after Abort.
#ifndef ATTNAUDIT_KERNELS_CUDA_TRANSPORTS_H_
#define ATTNAUDIT_KERNELS_CUDA_TRANSPORTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cp/transport/ring_protocol.h"
#include "core/cp/transport/transport.h"

namespace attnaudit {

class CudaGang;  // kernels/cuda_gang.h

namespace cuda_internal {

// Where a rank lives: its GPU, compute stream and two device slots.
struct RankPlacement {
  int device = 0;
  cudaStream_t stream = nullptr;
  char* slots[2] = {nullptr, nullptr};
};

// What the device transports share: placements, events, the protocol.
class DeviceRingTransport : public CpTransport {
 public:
  ~DeviceRingTransport() override;

  int64_t world() const override { return static_cast<int64_t>(ranks_.size()); }
  int64_t slot_bytes() const override { return slot_bytes_; }
  char* Slot(int64_t rank, int64_t slot) override {
    return ranks_[rank].place.slots[slot];
  }
  absl::Status WaitSent(int64_t rank, int64_t step) override;
  absl::StatusOr<int64_t> Receive(int64_t rank, int64_t step) override;
  absl::Status Release(int64_t rank, int64_t step) override;
  absl::Status Drained() override { return protocol_.Drained(); }
  void Abort(const absl::Status& status) override { protocol_.Abort(status); }

 protected:
  struct RankIo {
    RankPlacement place;
    cudaEvent_t ready = nullptr;  // data in the slot, on the rank stream
    cudaEvent_t sent[2] = {nullptr, nullptr};
    cudaEvent_t arrived[2] = {nullptr, nullptr};
    cudaEvent_t granted[2] = {nullptr, nullptr};
  };
  DeviceRingTransport(std::vector<RankPlacement> ranks, int64_t slot_bytes);
  absl::Status CreateEvents();
  // Posts a send, waits for its credit and records the data-ready point on
  // the rank stream.
  absl::Status BeginSend(int64_t rank, int64_t step, int64_t bytes);
  // Orders `stream` after the sender's data and the receiver's grant.
  absl::Status OrderCopy(int64_t rank, int64_t step, cudaStream_t stream);
  // Records the send's completion and the arrival on `stream`, then
  // reports the delivery to the protocol.
  absl::Status EndSend(int64_t rank, int64_t step, cudaStream_t stream);

  std::vector<RankIo> ranks_;
  int64_t slot_bytes_;
  CpRingProtocol protocol_;
};

class CudaLocalTransport : public DeviceRingTransport {
 public:
  static absl::StatusOr<std::unique_ptr<CudaLocalTransport>> Create(
      std::vector<RankPlacement> ranks, int64_t slot_bytes);
  ~CudaLocalTransport() override;
  absl::Status Send(int64_t rank, int64_t step, int64_t bytes) override;

 private:
  using DeviceRingTransport::DeviceRingTransport;
  std::vector<cudaStream_t> copy_streams_;  // one per rank
};

#ifdef ATTNAUDIT_HAVE_NCCL
class NcclTransport : public DeviceRingTransport {
 public:
  // Every rank's device must be a member of `gang` (its communicator).
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      std::vector<RankPlacement> ranks, int64_t slot_bytes, CudaGang* gang);
  absl::Status Send(int64_t rank, int64_t step, int64_t bytes) override;
  // Internal, not a wait, before every rank's Send of the step was issued.
  absl::Status WaitSent(int64_t rank, int64_t step) override;

 private:
  NcclTransport(std::vector<RankPlacement> ranks, int64_t slot_bytes,
                CudaGang* gang)
      : DeviceRingTransport(std::move(ranks), slot_bytes), gang_(gang) {}
  absl::Status IssueStep(int64_t step);

  CudaGang* gang_;
  std::mutex mu_;
  struct Pending {
    int64_t rank;
    int64_t bytes;
  };
  std::vector<Pending> pending_;
  int64_t pending_step_ = -1;
};
#endif  // ATTNAUDIT_HAVE_NCCL

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_CUDA_TRANSPORTS_H_
