// AwaitCollective: a bounded wait for collective communication that may
// never finish. A CP ring step's NCCL send/receive waits for its peer; when
// the peer's GPU died, its process hung or the connection broke, a plain
// cudaEventSynchronize on it blocks forever and holds the gang's GPUs, the
// job's worker and the server's drain with it.
//
// AwaitCollective polls `done` (e.g. cudaEventQuery of the ring's last
// event) and `async_error` (ncclCommGetAsyncError of the gang's
// communicators) until `done` says true, `done` or `async_error` fails,
// the cancel flag is set (the job was cancelled, passed its deadline or the
// server drains) or `timeout` passes. In every case but done it calls
// `abort` exactly once before returning (ncclCommAbort of every
// communicator: NCCL's kernels return and the streams drain; the
// communicators are unusable from then on, so the caller must drop them):
//   OK                 done
//   the error          from `done` or `async_error`, with `what` prefixed
//   DeadlineExceeded   "<what>: not done within <timeout>; the collective
//                      was aborted"
//   Cancelled          "<what>: cancelled; the collective was aborted"
//
// Plain C++ with no CUDA or NCCL include, so that it is built and tested on
// every machine (tests/unit/kernels/collective_watchdog_test.cc); the NCCL
// code in kernels/ supplies the three callbacks. Thread safety: a free
// function; the callbacks run on the calling thread.
#ifndef ATTNAUDIT_KERNELS_COLLECTIVE_WATCHDOG_H_
#define ATTNAUDIT_KERNELS_COLLECTIVE_WATCHDOG_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnaudit {

struct CollectiveWait {
  // Names the wait in errors, e.g. "cp ring on cuda:0,cuda:1".
  std::string what = "collective";
  absl::Duration timeout = absl::Seconds(120);
  // Polled with the rest; may be null.
  const std::atomic<bool>* cancelled = nullptr;
  // The first polls come quickly (a finished ring answers at once), then
  // the interval doubles up to this.
  absl::Duration max_poll_interval = absl::Milliseconds(10);
};

absl::Status AwaitCollective(const std::function<absl::StatusOr<bool>()>& done,
                             const std::function<absl::Status()>& async_error,
                             const std::function<void()>& abort,
                             const CollectiveWait& wait);

}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_COLLECTIVE_WATCHDOG_H_
