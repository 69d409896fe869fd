#include "kernels/collective_watchdog.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attnaudit {
namespace {

absl::Status Prefixed(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// One poll: OK(true) when done, OK(false) to keep waiting, else why not.
absl::StatusOr<bool> Poll(const std::function<absl::StatusOr<bool>()>& done,
                          const std::function<absl::Status()>& async_error,
                          const CollectiveWait& wait, absl::Time deadline) {
  absl::StatusOr<bool> finished = done();
  if (!finished.ok()) return Prefixed(finished.status(), wait.what);
  if (*finished) return true;
  if (absl::Status s = async_error(); !s.ok()) return Prefixed(s, wait.what);
  if (wait.cancelled != nullptr && wait.cancelled->load()) {
    return absl::CancelledError(
        absl::StrCat(wait.what, ": cancelled; the collective was aborted"));
  }
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat(
        wait.what, ": not done within ", absl::FormatDuration(wait.timeout),
        "; the collective was aborted"));
  }
  return false;
}

}  // namespace

absl::Status AwaitCollective(const std::function<absl::StatusOr<bool>()>& done,
                             const std::function<absl::Status()>& async_error,
                             const std::function<void()>& abort,
                             const CollectiveWait& wait) {
  const absl::Time deadline = absl::Now() + wait.timeout;
  absl::Duration interval = absl::Microseconds(20);
  while (true) {
    absl::StatusOr<bool> polled = Poll(done, async_error, wait, deadline);
    if (!polled.ok()) {
      abort();
      return polled.status();
    }
    if (*polled) return absl::OkStatus();
    absl::SleepFor(interval);
    interval = std::min(interval * 2, wait.max_poll_interval);
  }
}

}  // namespace attnaudit
