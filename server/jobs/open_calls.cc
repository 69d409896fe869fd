#include "server/jobs/open_calls.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace attnaudit::server {

OpenCalls::~OpenCalls() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
}

void OpenCalls::Add(OpenCall* call) {
  absl::MutexLock lock(&mu_);
  calls_.insert(call);
}

void OpenCalls::Remove(OpenCall* call) {
  absl::MutexLock lock(&mu_);
  calls_.erase(call);
}

size_t OpenCalls::size() const {
  absl::MutexLock lock(&mu_);
  return calls_.size();
}

int64_t OpenCalls::RecheckAll(const Authenticator& auth) {
  absl::MutexLock lock(&mu_);
  int64_t ended = 0;
  for (OpenCall* call : calls_) ended += call->Recheck(auth) ? 1 : 0;
  return ended;
}

int64_t OpenCalls::EndIdle(absl::Time now) {
  absl::MutexLock lock(&mu_);
  int64_t ended = 0;
  for (OpenCall* call : calls_) ended += call->EndIfIdle(now) ? 1 : 0;
  return ended;
}

void OpenCalls::StartSweeper(absl::Duration period,
                             std::function<void(int64_t)> on_ended) {
  sweeper_ = std::thread([this, period, on_ended = std::move(on_ended)] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) return;
      }
      const int64_t ended = EndIdle(absl::Now());
      if (ended > 0 && on_ended) on_ended(ended);
    }
  });
}

absl::StatusOr<Principal> Reauthorize(const Authenticator& auth,
                                      const Credentials& credentials,
                                      const Principal& was, uint32_t needed,
                                      const char* method) {
  absl::StatusOr<Principal> now = auth.Authenticate(credentials);
  if (!now.ok()) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": the call's credential is no longer valid (",
        now.status().message(), ") after the token file was reloaded"));
  }
  if (now->tenant != was.tenant) {
    return absl::PermissionDeniedError(absl::StrCat(
        method, ": the call's credential no longer belongs to tenant ",
        was.tenant, " after the token file was reloaded"));
  }
  for (uint32_t bit = 1; bit <= kPermAdmin; bit <<= 1) {
    if ((needed & bit) == 0) continue;
    const Permission p = static_cast<Permission>(bit);
    if (!now->Has(p)) {
      return absl::PermissionDeniedError(
          absl::StrCat(method, " needs the ", PermissionName(p),
                       " permission, which tenant ", was.tenant,
                       "'s credential lost when the token file was reloaded"));
    }
  }
  return now;
}

}  // namespace attnaudit::server
