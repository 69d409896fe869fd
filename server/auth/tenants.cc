#include "server/auth/tenants.h"

#include <openssl/sha.h>

#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnaudit::server {
namespace {

constexpr std::array<std::pair<absl::string_view, Permission>, 7>
    kPermissionNames = {{{"audit", kPermAudit},
                         {"submit", kPermSubmit},
                         {"read", kPermRead},
                         {"read_all", kPermReadAll},
                         {"cancel", kPermCancel},
                         {"admin", kPermAdmin},
                         {"override", kPermOverride}}};

std::string Digest(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
         digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

absl::Status LineError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

absl::StatusOr<uint32_t> ParsePermissions(int line, absl::string_view text) {
  uint32_t perms = 0;
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    bool known = false;
    for (const auto& [spelling, p] : kPermissionNames) {
      if (name == spelling) {
        perms |= p;
        known = true;
      }
    }
    if (!known) {
      // A permission name is not secret; cap it so a stray token pasted
      // into the wrong column is not echoed whole.
      return LineError(line, absl::StrCat("unknown permission \"",
                                          name.substr(0, 16), "\""));
    }
  }
  if (perms == 0) return LineError(line, "no permissions");
  return perms;
}

// "4096", "64MiB", "2G": binary suffixes, as the server's size flags.
bool ParseSize(absl::string_view text, int64_t* out) {
  std::string v = absl::AsciiStrToLower(text);
  int shift = 0;
  for (const auto& [suffix, s] : {std::pair<absl::string_view, int>{"kib", 10},
                                  {"mib", 20},
                                  {"gib", 30},
                                  {"k", 10},
                                  {"m", 20},
                                  {"g", 30}}) {
    if (absl::EndsWith(v, suffix)) {
      v.resize(v.size() - suffix.size());
      shift = s;
      break;
    }
  }
  int64_t x = 0;
  if (!absl::SimpleAtoi(v, &x) || x < 0 || x > (int64_t{1} << (62 - shift))) {
    return false;
  }
  *out = x << shift;
  return true;
}

// One parsed line before quotas are settled.
struct Entry {
  int line = 0;
  bool token = false;  // else certificate
  std::string key;     // token digest, certificate identity or "*"
  Principal principal;
  bool has_quota = false;
};

absl::Status ParseQuotas(int line, const std::vector<absl::string_view>& fields,
                         Entry* e) {
  for (size_t i = 3; i < fields.size(); ++i) {
    absl::string_view f = fields[i];
    int64_t value = 0;
    if (absl::ConsumePrefix(&f, "max_jobs=")) {
      if (!absl::SimpleAtoi(f, &value) || value < 0) {
        return LineError(line, "max_jobs: not a count");
      }
      e->principal.quota.max_jobs = value;
    } else if (absl::ConsumePrefix(&f, "max_bytes=")) {
      if (!ParseSize(f, &value)) {
        return LineError(line, "max_bytes: not a size (e.g. 2GiB)");
      }
      e->principal.quota.max_bytes = value;
    } else {
      return LineError(line,
                       "expected max_jobs=N or max_bytes=SIZE after "
                       "the permissions");
    }
    e->has_quota = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<Entry> ParseLine(int line,
                                const std::vector<absl::string_view>& fields) {
  if (fields.size() < 3) {
    return LineError(line,
                     "expected token:SECRET or cert:IDENTITY, a tenant and "
                     "permissions");
  }
  Entry e;
  e.line = line;
  absl::string_view principal = fields[0];
  if (absl::ConsumePrefix(&principal, "token:")) {
    if (principal.empty()) return LineError(line, "empty token");
    e.token = true;
    e.key = Digest(principal);
  } else if (absl::ConsumePrefix(&principal, "cert:")) {
    if (principal.empty()) return LineError(line, "empty certificate identity");
    e.key = std::string(principal);
  } else {
    return LineError(line, "the first field must start with token: or cert:");
  }
  const absl::string_view tenant = fields[1];
  const bool any = !e.token && e.key == "*";
  if (any != (tenant == "*")) {
    return LineError(line, "tenant \"*\" goes with cert:* and only with it");
  }
  if (!any && !IsValidTenantName(tenant)) {
    return LineError(line, "tenant: 1-128 characters of [A-Za-z0-9_.:/@+-]");
  }
  if (!any) e.principal.tenant = std::string(tenant);
  absl::StatusOr<uint32_t> perms = ParsePermissions(line, fields[2]);
  if (!perms.ok()) return perms.status();
  e.principal.permissions = *perms;
  if (absl::Status s = ParseQuotas(line, fields, &e); !s.ok()) return s;
  return e;
}

// Every tenant's quota: the one its lines give (they must agree), else the
// default.
absl::Status SettleQuotas(const TenantQuota& default_quota,
                          std::vector<Entry>* entries) {
  absl::flat_hash_map<std::string, const Entry*> explicit_quota;
  for (const Entry& e : *entries) {
    if (!e.has_quota || e.principal.tenant.empty()) continue;
    auto [it, inserted] = explicit_quota.emplace(e.principal.tenant, &e);
    const TenantQuota& q = it->second->principal.quota;
    if (!inserted && (q.max_jobs != e.principal.quota.max_jobs ||
                      q.max_bytes != e.principal.quota.max_bytes)) {
      return LineError(
          e.line, absl::StrCat("tenant ", e.principal.tenant,
                               " has other quotas on line ", it->second->line));
    }
  }
  for (Entry& e : *entries) {
    if (e.has_quota) continue;
    auto it = explicit_quota.find(e.principal.tenant);
    e.principal.quota = it != explicit_quota.end() ? it->second->principal.quota
                                                   : default_quota;
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view PermissionName(Permission p) {
  for (const auto& [name, perm] : kPermissionNames) {
    if (perm == p) return name;
  }
  return "unknown";
}

Principal DefaultPrincipal(const TenantQuota& quota) {
  return Principal{kDefaultTenant, kAllPermissions, quota};
}

bool IsValidTenantName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        !absl::StrContains("_.:/@+-", c)) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<TenantTable> TenantTable::Parse(
    absl::string_view text, const TenantQuota& default_quota) {
  std::vector<std::vector<absl::string_view>> lines;
  std::vector<int> numbers;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    lines.push_back(
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty()));
    numbers.push_back(number);
  }
  TenantTable table;
  if (lines.size() == 1 && lines[0].size() == 1 &&
      !absl::StartsWith(lines[0][0], "token:") &&
      !absl::StartsWith(lines[0][0], "cert:")) {
    // The legacy single-token file.
    table.by_token_digest_[Digest(lines[0][0])] =
        DefaultPrincipal(default_quota);
    return table;
  }
  std::vector<Entry> entries;
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::StatusOr<Entry> e = ParseLine(numbers[i], lines[i]);
    if (!e.ok()) return e.status();
    entries.push_back(*std::move(e));
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError("no token: or cert: line");
  }
  if (absl::Status s = SettleQuotas(default_quota, &entries); !s.ok()) return s;
  for (Entry& e : entries) {
    if (!e.token && e.key == "*") {
      if (table.any_cert_.has_value()) {
        return LineError(e.line, "cert:* is listed twice");
      }
      table.any_cert_ = e.principal;
      continue;
    }
    auto& map = e.token ? table.by_token_digest_ : table.by_cert_;
    if (!map.emplace(e.key, e.principal).second) {
      return LineError(e.line, e.token
                                   ? "the same token is listed twice"
                                   : "the same certificate is listed twice");
    }
  }
  return table;
}

const Principal* TenantTable::FindToken(absl::string_view token) const {
  auto it = by_token_digest_.find(Digest(token));
  return it == by_token_digest_.end() ? nullptr : &it->second;
}

absl::optional<Principal> TenantTable::FindCertificate(
    const std::vector<std::string>& identities) const {
  for (const std::string& id : identities) {
    auto it = by_cert_.find(id);
    if (it != by_cert_.end()) return it->second;
  }
  if (any_cert_.has_value() && !identities.empty()) {
    // Own namespace: no certificate can take a token tenant's name.
    std::string tenant =
        absl::StrCat(kCertificateTenantPrefix, identities.front());
    if (!IsValidTenantName(tenant)) return absl::nullopt;
    Principal p = *any_cert_;
    p.tenant = std::move(tenant);
    return p;
  }
  return absl::nullopt;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(
    std::string token_file, TenantQuota default_quota) {
  const bool enabled = !token_file.empty();
  std::unique_ptr<Authenticator> auth(
      new Authenticator(std::move(token_file), default_quota, enabled));
  if (!enabled) return auth;
  absl::StatusOr<std::shared_ptr<const TenantTable>> table = auth->Load();
  if (!table.ok()) return table.status();
  absl::MutexLock lock(&auth->mu_);
  auth->table_ = *std::move(table);
  return auth;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::CreateFromTable(
    TenantTable table, TenantQuota default_quota) {
  std::unique_ptr<Authenticator> auth(
      new Authenticator("", default_quota, /*enabled=*/true));
  absl::MutexLock lock(&auth->mu_);
  auth->table_ = std::make_shared<const TenantTable>(std::move(table));
  return auth;
}

absl::StatusOr<std::shared_ptr<const TenantTable>> Authenticator::Load() const {
  std::ifstream in(token_file_);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-token-file: cannot read ", token_file_));
  }
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  absl::StatusOr<TenantTable> table = TenantTable::Parse(text, default_quota_);
  if (!table.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth-token-file: ", token_file_, ": ", table.status().message()));
  }
  return std::make_shared<const TenantTable>(*std::move(table));
}

absl::Status Authenticator::Reload() {
  if (token_file_.empty()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const TenantTable>> table = Load();
  if (!table.ok()) return table.status();
  absl::MutexLock lock(&mu_);
  table_ = *std::move(table);
  return absl::OkStatus();
}

size_t Authenticator::principals() const {
  absl::MutexLock lock(&mu_);
  return table_ == nullptr ? 0 : table_->tokens() + table_->certificates();
}

absl::StatusOr<Principal> Authenticator::Authenticate(
    const Credentials& credentials) const {
  if (!enabled()) return DefaultPrincipal(default_quota_);
  std::shared_ptr<const TenantTable> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  if (credentials.authorization.has_value()) {
    absl::string_view value = *credentials.authorization;
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWithIgnoreCase(value, kBearer)) {
      return absl::UnauthenticatedError(
          "authorization metadata is not a Bearer token");
    }
    value.remove_prefix(kBearer.size());
    const Principal* p = table->FindToken(value);
    if (p == nullptr) return absl::UnauthenticatedError("invalid bearer token");
    return *p;
  }
  if (absl::optional<Principal> p =
          table->FindCertificate(credentials.certificate_identities);
      p.has_value()) {
    return *std::move(p);
  }
  if (!credentials.certificate_identities.empty()) {
    return absl::UnauthenticatedError(
        "the client certificate is not authorized and no bearer token was "
        "sent");
  }
  return absl::UnauthenticatedError(
      "missing \"authorization: Bearer <token>\" metadata");
}

}  // namespace attnaudit::server
