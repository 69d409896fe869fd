#include "kernels/ring_book.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace attnaudit {
namespace cuda_internal {

absl::Status RingBook::WaitGranted(int64_t rank, int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    return !abort_.ok() || ranks_[rank].granted[step % 2] >= step;
  });
  return abort_;
}

void RingBook::Grant(int64_t rank, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t& g = ranks_[rank].granted[step % 2];
    g = std::max(g, step);
  }
  cv_.notify_all();
}

void RingBook::Arrive(int64_t rank, int64_t step, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranks_[rank].arrived[step % 2] = step;
    ranks_[rank].bytes[step % 2] = bytes;
  }
  cv_.notify_all();
}

absl::StatusOr<int64_t> RingBook::WaitArrived(int64_t rank, int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    return !abort_.ok() || ranks_[rank].arrived[step % 2] >= step;
  });
  if (!abort_.ok()) return abort_;
  const Rank& r = ranks_[rank];
  if (r.arrived[step % 2] != step) {
    return absl::InternalError(absl::StrCat(
        "cp transport: rank ", rank, " slot ", step % 2, " holds step ",
        r.arrived[step % 2], " when step ", step, " reads it"));
  }
  return r.bytes[step % 2];
}

void RingBook::MarkSent(int64_t rank, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranks_[rank].sent = std::max(ranks_[rank].sent, step);
  }
  cv_.notify_all();
}

absl::Status RingBook::WaitSent(int64_t rank, int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !abort_.ok() || ranks_[rank].sent >= step; });
  return abort_;
}

void RingBook::Abort(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_.ok()) {
      abort_ =
          status.ok() ? absl::AbortedError("cp transport aborted") : status;
    }
  }
  cv_.notify_all();
}

absl::Status RingBook::aborted() {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_;
}

}  // namespace cuda_internal
}  // namespace attnaudit
