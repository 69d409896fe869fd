#include "server/store/job_ids.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace attnaudit::server {
namespace {

constexpr size_t kSecretBytes = 32;
constexpr size_t kRandomIdBytes = 16;  // 128 bits

absl::Status KeyError(absl::string_view what, int err) {
  return absl::InternalError(
      absl::StrCat("job id key: ", what, ": ", std::strerror(err)));
}

// Writes `secret` to `path` atomically and durably.
absl::Status WriteSecret(const std::string& dir, const std::string& path,
                         const std::string& secret) {
  const std::string tmp = path + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return KeyError("create", errno);
  const bool written = ::write(fd, secret.data(), secret.size()) ==
                           static_cast<ssize_t>(secret.size()) &&
                       ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!written) {
    ::unlink(tmp.c_str());
    return KeyError("write", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(tmp.c_str());
    return KeyError("rename", rename_err);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> NewJobId(char kind) {
  unsigned char random[kRandomIdBytes];
  if (RAND_bytes(random, sizeof(random)) != 1) {
    return absl::InternalError("job id: the random generator failed");
  }
  const uint64_t ms = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  return absl::StrCat(
      absl::StrFormat("%c%011x", kind, ms & 0xfffffffffffull),
      absl::BytesToHexString(absl::string_view(
          reinterpret_cast<const char*>(random), sizeof(random))));
}

absl::StatusOr<JobIdKey> JobIdKey::LoadOrCreate(const std::string& data_dir) {
  const std::string path = data_dir + "/job-id.key";
  std::ifstream in(path, std::ios::binary);
  if (in) {
    std::string secret((std::istreambuf_iterator<char>(in)),
                       std::istreambuf_iterator<char>());
    if (secret.size() != kSecretBytes) {
      return absl::DataLossError(
          absl::StrCat("job id key: job-id.key holds ", secret.size(),
                       " bytes, not ", kSecretBytes,
                       " (restore it from a backup, or delete it to make "
                       "a new one: idempotency keys of unfinished jobs then "
                       "map to new ids)"));
    }
    return JobIdKey(std::move(secret));
  }
  std::string secret(kSecretBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&secret[0]),
                 static_cast<int>(secret.size())) != 1) {
    return absl::InternalError("job id key: the random generator failed");
  }
  if (absl::Status s = WriteSecret(data_dir, path, secret); !s.ok()) return s;
  return JobIdKey(std::move(secret));
}

absl::StatusOr<JobIdKey> JobIdKey::Shared(JobStore& store) {
  std::string candidate(kSecretBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&candidate[0]),
                 static_cast<int>(candidate.size())) != 1) {
    return absl::InternalError("job id key: the random generator failed");
  }
  absl::StatusOr<std::string> secret =
      store.SharedSecret("job-id-key", candidate);
  if (!secret.ok()) return secret.status();
  if (secret->size() != kSecretBytes) {
    return absl::DataLossError(
        absl::StrCat("job id key: the store's job-id-key holds ",
                     secret->size(), " bytes, not ", kSecretBytes));
  }
  return JobIdKey(*std::move(secret));
}

std::string JobIdKey::IdempotentJobId(absl::string_view tenant,
                                      absl::string_view key) const {
  // The tenant is length-prefixed so that no (tenant, key) pair can collide
  // with another by moving bytes between the two.
  const std::string message = absl::StrCat(tenant.size(), ":", tenant, key);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac, &mac_len);
  return absl::StrCat("k", absl::BytesToHexString(absl::string_view(
                               reinterpret_cast<const char*>(mac), 16)));
}

}  // namespace attnaudit::server
