// The host-side bookkeeping of a device ring transport (CUDA-local, NCCL):
// which step each rank's slot is granted for, which message each slot
// holds, and the abort status -- the credit protocol of core/cp/transport/
// transport.h, whose waits are host waits; the data itself moves on CUDA
// streams, ordered by events the transports record. Thread-safe.
#ifndef ATTNAUDIT_KERNELS_RING_BOOK_H_
#define ATTNAUDIT_KERNELS_RING_BOOK_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attnaudit {
namespace cuda_internal {

class RingBook {
 public:
  explicit RingBook(int64_t world) : ranks_(static_cast<size_t>(world)) {}

  // Blocks until `rank` granted slot step % 2 for `step` (or an abort).
  absl::Status WaitGranted(int64_t rank, int64_t step);
  void Grant(int64_t rank, int64_t step);
  // The message for `step` is issued into rank's slot step % 2.
  void Arrive(int64_t rank, int64_t step, int64_t bytes);
  // Blocks until it is; its size, or Internal when a later message took
  // the slot (a credit granted too early).
  absl::StatusOr<int64_t> WaitArrived(int64_t rank, int64_t step);
  // The send of `step` by `rank` is issued (its completion event exists).
  void MarkSent(int64_t rank, int64_t step);
  absl::Status WaitSent(int64_t rank, int64_t step);
  void Abort(const absl::Status& status);
  absl::Status aborted();

 private:
  struct Rank {
    int64_t granted[2] = {-1, -1};
    int64_t arrived[2] = {-1, -1};
    int64_t bytes[2] = {0, 0};
    int64_t sent = -1;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Rank> ranks_;
  absl::Status abort_;
};

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_RING_BOOK_H_
