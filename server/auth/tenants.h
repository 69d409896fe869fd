// Tenants and permissions: who a caller is, and what it may do.
//
// A Principal is a tenant (the owner of jobs) and a set of permissions. The
// RPC layer authenticates every call to one (Authenticator::Authenticate),
// then checks the permission of the call:
//
//   audit     Audit, AuditStream
//   submit    Submit
//   read      GetResult and WatchResults of the tenant's own jobs
//   read_all  GetResult and WatchResults of every tenant's jobs
//   cancel    Cancel of the tenant's own jobs
//   admin     all of the above, on every tenant's jobs
//
// GetCapabilities needs only a valid identity.
//
// Token file (--auth-token-file; re-read on SIGHUP). One principal per line;
// blank lines and lines starting with '#' are ignored; fields are separated
// by spaces or tabs:
//
//   token:SECRET     TENANT  PERMISSIONS  [max_jobs=N] [max_bytes=SIZE]
//   cert:IDENTITY    TENANT  PERMISSIONS  [...]
//   cert:*           *       PERMISSIONS  [...]
//
// token: lines match the bearer token of the call ("authorization: Bearer
// SECRET"); cert: lines match an identity of the verified mTLS client
// certificate (its subject alternative names or common name, as gRPC
// reports them); `cert:* *` makes every other verified certificate a tenant
// of its own, named "cert:" + its first identity. That prefix keeps such
// tenants apart from every tenant a line names: a certificate whose
// identity equals a token tenant's name ("fleet-a") becomes "cert:fleet-a",
// never "fleet-a". Only a line that names a "cert:..." tenant itself (an
// explicit choice in the file) shares it. A bearer token, when sent, is
// what counts. PERMISSIONS is a comma-separated list of the names above.
// TENANT is 1-128 characters of [A-Za-z0-9_.:/@+-]. The quotas cap what the
// tenant holds queued or running at once (server/scheduler TenantQuota);
// several lines of one tenant must not give different quotas, and a tenant
// without its own takes the default quota.
//
// Legacy form: a file whose only line is a single word uses that word as
// the token of tenant "default" with every permission (the file format
// before tenants existed).
//
// Without a token file there is no authentication: every caller is tenant
// "default" with every permission (DefaultPrincipal).
//
// Secrets: tokens are kept only as SHA-256 digests and looked up by digest,
// so the comparison does not depend on how much of a token matches. No
// error message, log line or status carries a token.
//
// Thread safety: TenantTable is immutable after Parse. Authenticator is
// thread-safe; Reload swaps the table atomically (calls in flight keep the
// table they started with).
#ifndef ATTNAUDIT_SERVER_AUTH_TENANTS_H_
#define ATTNAUDIT_SERVER_AUTH_TENANTS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"
#include "server/scheduler/job.h"

namespace attnaudit::server {

enum Permission : uint32_t {
  kPermAudit = 1u << 0,
  kPermSubmit = 1u << 1,
  kPermRead = 1u << 2,
  kPermReadAll = 1u << 3,
  kPermCancel = 1u << 4,
  kPermAdmin = 1u << 5,
  // May depart from the verdict policy: tolerance overrides, the
  // statistical test off, precision fields past every profile's range
  // (core/audit/audit.h, OverridesPolicy).
  kPermOverride = 1u << 6,
};
inline constexpr uint32_t kAllPermissions = (1u << 7) - 1;

// "audit", "submit", "read", "read_all", "cancel", "admin", "override".
absl::string_view PermissionName(Permission p);

// The tenant every caller belongs to without a token file.
inline constexpr char kDefaultTenant[] = "default";
// Prefix of the tenants `cert:* *` creates (see the file comment).
inline constexpr char kCertificateTenantPrefix[] = "cert:";

struct Principal {
  std::string tenant;
  uint32_t permissions = 0;
  TenantQuota quota;

  // Whether the principal holds `p` (admin holds every permission, and
  // read_all includes read).
  bool Has(Permission p) const {
    const uint32_t enough =
        p | kPermAdmin | (p == kPermRead ? kPermReadAll : 0u);
    return (permissions & enough) != 0;
  }
  // May see every tenant's jobs (read_all or admin).
  bool ReadsAll() const { return Has(kPermReadAll); }
  // May cancel every tenant's jobs (admin only).
  bool CancelsAll() const { return (permissions & kPermAdmin) != 0; }
};

// Tenant "default" with every permission and `quota`.
Principal DefaultPrincipal(const TenantQuota& quota);

// Whether `name` is a valid tenant name (see the file comment).
bool IsValidTenantName(absl::string_view name);

class TenantTable {
 public:
  // Parses a token file's text. Errors are InvalidArgument naming the line
  // ("line 3: unknown permission \"reed\""), never the secret. Quotas not
  // given fall back to `default_quota`. A file without any principal is an
  // error.
  static absl::StatusOr<TenantTable> Parse(absl::string_view text,
                                           const TenantQuota& default_quota);

  // The principal of a bearer token, or null.
  const Principal* FindToken(absl::string_view token) const;
  // The principal of a client certificate with these identities (the
  // first cert: line that names one of them, else `cert:* *`), or null.
  absl::optional<Principal> FindCertificate(
      const std::vector<std::string>& identities) const;

  size_t tokens() const { return by_token_digest_.size(); }
  size_t certificates() const { return by_cert_.size() + (any_cert_ ? 1 : 0); }

 private:
  TenantTable() = default;
  absl::flat_hash_map<std::string, Principal> by_token_digest_;
  absl::flat_hash_map<std::string, Principal> by_cert_;
  absl::optional<Principal> any_cert_;  // `cert:* *`: tenant left empty
};

// How a call identified itself.
struct Credentials {
  // The "authorization" metadata value, if the call sent one.
  absl::optional<std::string> authorization;
  // Identities of the verified client certificate (empty without mTLS).
  std::vector<std::string> certificate_identities;
};

class Authenticator {
 public:
  // Without a token file (empty path) every caller is DefaultPrincipal.
  // Otherwise reads and parses the file; errors name --auth-token-file and
  // the path.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(
      std::string token_file, TenantQuota default_quota);
  // With a fixed table (embeddings and tests; Reload is a no-op).
  static absl::StatusOr<std::unique_ptr<Authenticator>> CreateFromTable(
      TenantTable table, TenantQuota default_quota);

  // Re-reads the token file. On error the current table stays in force and
  // the error is returned. OK and a no-op without a token file.
  absl::Status Reload();

  // The principal of a call, or Unauthenticated (never naming a secret):
  // a bearer token not in the table, a malformed authorization value, or,
  // with neither a valid token nor a listed certificate, "missing
  // credentials".
  absl::StatusOr<Principal> Authenticate(const Credentials& credentials) const;

  bool enabled() const { return enabled_; }
  // Principals in the current table (tokens + certificate entries).
  size_t principals() const;

 private:
  Authenticator(std::string token_file, TenantQuota default_quota, bool enabled)
      : token_file_(std::move(token_file)),
        default_quota_(default_quota),
        enabled_(enabled) {}
  absl::StatusOr<std::shared_ptr<const TenantTable>> Load() const;

  const std::string token_file_;
  const TenantQuota default_quota_;
  const bool enabled_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TenantTable> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_AUTH_TENANTS_H_
