// UploadProgress: whether an AuditStream upload still makes progress,
// measured in bytes: over every window of `window` (the server's
// --upload-idle-timeout) it must deliver `min_rate` bytes a second, or
// what it still owes when that is less (at least one byte: a client that
// has sent everything must end its stream). Messages are not progress: an
// empty chunk every few seconds used to count as activity, and two
// tenants trickling empty chunks held the whole upload budget while a
// third was refused. A client too slow or silent for a
// whole window is stalled, and the caller ends its call and frees its
// reservation.
//
// Pure bookkeeping: the caller passes the time (tests use their own), and
// serialises access (AuditStreamCall holds its lock).
#ifndef ATTNAUDIT_SERVER_RPC_UPLOAD_PROGRESS_H_
#define ATTNAUDIT_SERVER_RPC_UPLOAD_PROGRESS_H_

#include <cstdint>

#include "absl/time/time.h"

namespace attnaudit::server {

class UploadProgress {
 public:
  // `window` > 0, `min_rate` >= 1 byte per second; the first window
  // starts at `start`.
  UploadProgress(absl::Duration window, int64_t min_rate, absl::Time start);

  // `bytes` of the upload arrived (a header's, or a chunk's data).
  void Add(int64_t bytes) { received_ += bytes; }
  // The upload's whole size, once its header announced it.
  void Expect(int64_t total_bytes) { expected_ = total_bytes; }

  // Whether the window that began at the last checkpoint is over at `now`
  // without enough bytes. A window that is over with enough bytes starts
  // the next one at `now`.
  bool Stalled(absl::Time now);

  // What one window must deliver: min_rate x window, in bytes.
  int64_t per_window() const { return per_window_; }
  absl::Duration window() const { return window_; }
  int64_t received() const { return received_; }

 private:
  const absl::Duration window_;
  const int64_t per_window_;
  absl::Time checkpoint_;
  int64_t received_at_checkpoint_ = 0;
  int64_t received_ = 0;
  int64_t expected_ = -1;  // unknown until the header
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_UPLOAD_PROGRESS_H_
