// Job ids: fresh (unguessable) ones and idempotent ones (keyed by a secret
// of the data directory, or of the fleet's store).
//
// Ids are spool file names (server/spool ValidateJobId: [A-Za-z0-9_.-]) and
// must not be guessable: knowing one id must not help to find another
// tenant's job. So every fresh id carries 128 random bits from OpenSSL's
// CSPRNG (RAND_bytes), after the creation time in milliseconds (which
// keeps a directory listing roughly in creation order, and is no secret):
//   NewJobId('s') -> "s0190a3c4e2f" + 32 hex digits   (44 characters)
//
// An idempotent Submit's id is derived from its key, so a retry after a
// crash maps onto the same job without any extra state. It is a keyed hash
// (HMAC-SHA256) of the caller's tenant and key under a secret of this data
// directory, so ids of other tenants' keys cannot be computed, and the same
// key of two tenants names two jobs:
//   JobIdKey::IdempotentJobId("fleet-a", "k1") -> "k" + 32 hex digits
// The secret is 32 random bytes in <data_dir>/job-id.key (mode 0600),
// created on first start; moving a data directory moves it along. A fleet
// sharing one store shares one secret, kept in the store (Shared), so a
// retry that reaches another replica names the same job.
//
// Thread-safe.
#ifndef ATTNAUDIT_SERVER_STORE_JOB_IDS_H_
#define ATTNAUDIT_SERVER_STORE_JOB_IDS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

// `kind`: 'a' Audit/AuditStream, 's' Submit. Internal when the CSPRNG
// fails (no id is better than a guessable one).
absl::StatusOr<std::string> NewJobId(char kind);

class JobIdKey {
 public:
  // Reads <data_dir>/job-id.key, creating it (write, fsync, rename) when
  // missing. Errors name the file's role, not its path ("job id key: ...").
  static absl::StatusOr<JobIdKey> LoadOrCreate(const std::string& data_dir);
  // The fleet's secret: the one in `store`, or a fresh one stored there
  // when it has none yet (the first replica to start wins).
  static absl::StatusOr<JobIdKey> Shared(JobStore& store);
  // A key from the given secret (tests).
  static JobIdKey FromSecret(std::string secret) {
    return JobIdKey(std::move(secret));
  }

  std::string IdempotentJobId(absl::string_view tenant,
                              absl::string_view key) const;

 private:
  explicit JobIdKey(std::string secret) : secret_(std::move(secret)) {}
  std::string secret_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_STORE_JOB_IDS_H_
