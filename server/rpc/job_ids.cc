#include "server/rpc/job_ids.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <atomic>
#include <cstdint>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace attnaudit::server {

std::string NewJobId(char kind) {
  static std::atomic<uint32_t> counter{0};
  static const uint32_t process_random = [] {
    absl::BitGen gen;
    return absl::Uniform<uint32_t>(gen);
  }();
  const uint64_t ms = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  const uint32_t n = counter.fetch_add(1, std::memory_order_relaxed);
  return absl::StrFormat("%c%011x%06x%08x", kind, ms & 0xfffffffffffull,
                         n & 0xffffff, process_random);
}

std::string IdempotentJobId(absl::string_view key) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(),
         digest);
  return absl::StrCat("k", absl::BytesToHexString(absl::string_view(
                               reinterpret_cast<const char*>(digest), 16)));
}

grpc::Status TokenAuth::Check(
    const grpc::CallbackServerContext& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing \"authorization: Bearer <token>\" metadata");
  }
  absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(value, kBearer)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "authorization metadata is not a Bearer token");
  }
  value.remove_prefix(kBearer.size());
  // Constant time over the expected token's length; the length itself is
  // not secret enough to matter, but compare it without branching early.
  const bool same_size = value.size() == token_.size();
  const std::string& probe = same_size ? std::string(value) : token_;
  const bool same =
      CRYPTO_memcmp(probe.data(), token_.data(), token_.size()) == 0;
  if (!(same_size && same)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "invalid bearer token");
  }
  return grpc::Status::OK;
}

}  // namespace attnaudit::server
