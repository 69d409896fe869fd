#include "core/fingerprint/sha256_stream.h"

#include <openssl/evp.h>

#include "absl/status/status.h"

namespace attnaudit {
namespace fingerprint_internal {

Sha256Stream::Sha256Stream()
    : ctx_(EVP_MD_CTX_new()), buffer_(new unsigned char[kBufferBytes]) {
  ok_ = ctx_ != nullptr &&
        EVP_DigestInit_ex(ctx_, EVP_sha256(), /*impl=*/nullptr) == 1;
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(ctx_); }

void Sha256Stream::Flush() {
  if (used_ > 0 && ok_) {
    ok_ = EVP_DigestUpdate(ctx_, buffer_.get(), used_) == 1;
  }
  used_ = 0;
}

void Sha256Stream::AppendLarge(const void* data, size_t n) {
  Flush();
  if (n >= kBufferBytes) {
    if (ok_) ok_ = EVP_DigestUpdate(ctx_, data, n) == 1;
    return;
  }
  std::memcpy(buffer_.get(), data, n);
  used_ = n;
}

absl::StatusOr<std::string> Sha256Stream::Finish() {
  Flush();
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!ok_ || EVP_DigestFinal_ex(ctx_, digest, &length) != 1 || length != 32) {
    ok_ = false;
    return absl::InternalError("fingerprint: OpenSSL SHA-256 failed");
  }
  ok_ = false;  // a finished context cannot take more input
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(2 * length, '0');
  for (unsigned int i = 0; i < length; ++i) {
    hex[2 * i] = kHex[digest[i] >> 4];
    hex[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return hex;
}

}  // namespace fingerprint_internal
}  // namespace attnaudit
