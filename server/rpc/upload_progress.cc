#include "server/rpc/upload_progress.h"

#include <algorithm>
#include <cmath>

namespace attnaudit::server {

UploadProgress::UploadProgress(absl::Duration window, int64_t min_rate,
                               absl::Time start)
    : window_(window),
      per_window_(static_cast<int64_t>(std::min(
          std::ceil(absl::ToDoubleSeconds(window) *
                    static_cast<double>(std::max<int64_t>(1, min_rate))),
          9e18))),
      checkpoint_(start) {}

bool UploadProgress::Stalled(absl::Time now) {
  if (now - checkpoint_ < window_) return false;
  int64_t owed = per_window_;
  if (expected_ >= 0) {
    // Near its end an upload owes only what is left, and at least a byte
    // (its end of stream arrives as a read, not as bytes).
    owed = std::max<int64_t>(
        1, std::min(owed, expected_ - received_at_checkpoint_));
  }
  if (received_ - received_at_checkpoint_ < owed) return true;
  checkpoint_ = now;
  received_at_checkpoint_ = received_;
  return false;
}

}  // namespace attnaudit::server
