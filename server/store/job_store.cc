#include "server/store/job_store.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/store/postgres_job_store.h"
#include "server/store/sqlite_job_store.h"

namespace attnaudit::server {

absl::string_view JobStateName(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kDone:
      return "DONE";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

bool ParseJobState(absl::string_view name, JobState* out) {
  for (JobState st : {JobState::kQueued, JobState::kRunning, JobState::kDone,
                      JobState::kFailed, JobState::kCancelled}) {
    if (JobStateName(st) == name) {
      *out = st;
      return true;
    }
  }
  return false;
}

bool IsTerminal(JobState s) {
  return s == JobState::kDone || s == JobState::kFailed ||
         s == JobState::kCancelled;
}

namespace {

bool IsPostgresUrl(absl::string_view url) {
  return absl::StartsWith(url, "postgresql://") ||
         absl::StartsWith(url, "postgres://");
}

}  // namespace

std::string RedactStoreUrl(absl::string_view url) {
  // scheme://user:password@host... -> scheme://user:***@host...
  const size_t scheme_end = url.find("://");
  if (scheme_end == absl::string_view::npos) return std::string(url);
  const size_t authority = scheme_end + 3;
  const size_t at = url.find('@', authority);
  const size_t slash = url.find('/', authority);
  if (at == absl::string_view::npos ||
      (slash != absl::string_view::npos && slash < at)) {
    return std::string(url);
  }
  const size_t colon = url.find(':', authority);
  if (colon == absl::string_view::npos || colon > at) return std::string(url);
  return absl::StrCat(url.substr(0, colon + 1), "***", url.substr(at));
}

absl::StatusOr<std::unique_ptr<JobStore>> OpenJobStore(
    const StoreConfig& config) {
  if (config.url.empty() || config.url == "sqlite") {
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> store =
        SqliteJobStore::Open(config.data_dir, config.options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<JobStore>(*std::move(store));
  }
  if (IsPostgresUrl(config.url)) {
    absl::StatusOr<std::unique_ptr<PostgresJobStore>> store =
        PostgresJobStore::Open(config.url, config.options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<JobStore>(*std::move(store));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--store: '", RedactStoreUrl(config.url),
                   "' is neither 'sqlite' nor a postgresql:// URL "
                   "(postgresql://USER@HOST:PORT/DB)"));
}

}  // namespace attnaudit::server
