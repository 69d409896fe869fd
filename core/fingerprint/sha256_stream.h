// Sha256Stream: an incremental SHA-256 (OpenSSL EVP) behind a 64 KiB
// staging buffer. Internal to core/fingerprint.
//
// Why the buffer: the fingerprints feed many small pieces (an 8-byte
// position, a 256-byte head row). Handing each piece to EVP_DigestUpdate
// costs a call and a partial-block copy per piece; staging them and hashing
// in 64 KiB chunks keeps the cost at the SHA-256 compression speed (SHA-NI
// where the CPU has it). Pieces larger than the buffer go to OpenSSL
// directly.
//
// Errors: an OpenSSL failure (only allocation can fail) is remembered and
// reported by Finish as an Internal error; appends after it are ignored.
// Not thread-safe; one stream per digest. Not copyable.
#ifndef ATTNAUDIT_CORE_FINGERPRINT_SHA256_STREAM_H_
#define ATTNAUDIT_CORE_FINGERPRINT_SHA256_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

typedef struct evp_md_ctx_st EVP_MD_CTX;

namespace attnaudit {
namespace fingerprint_internal {

class Sha256Stream {
 public:
  static constexpr size_t kBufferBytes = size_t{1} << 16;

  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;

  void Append(const void* data, size_t n) {
    if (n <= kBufferBytes - used_) {
      std::memcpy(buffer_.get() + used_, data, n);
      used_ += n;
      return;
    }
    AppendLarge(data, n);
  }
  void Append(absl::string_view text) { Append(text.data(), text.size()); }
  // Eight bytes, little endian, whatever the host order.
  void AppendInt64Le(int64_t value) {
    const uint64_t u = static_cast<uint64_t>(value);
    unsigned char bytes[8];
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<unsigned char>(u >> (8 * i));
    Append(bytes, sizeof bytes);
  }
  // values[0..n) widened to int64, each as AppendInt64Le appends it, a
  // block at a time: one Append per 512 values rather than per value,
  // whose call overhead would dominate tens of thousands of positions.
  template <typename Int>
  void AppendInt64LeArray(const Int* values, int64_t n) {
    constexpr int64_t kBlock = 512;
    unsigned char bytes[kBlock * 8];
    for (int64_t first = 0; first < n; first += kBlock) {
      const int64_t m = n - first < kBlock ? n - first : kBlock;
      for (int64_t j = 0; j < m; ++j) {
        const uint64_t u =
            static_cast<uint64_t>(static_cast<int64_t>(values[first + j]));
        for (int i = 0; i < 8; ++i) {
          bytes[8 * j + i] = static_cast<unsigned char>(u >> (8 * i));
        }
      }
      Append(bytes, static_cast<size_t>(8 * m));
    }
  }

  // The digest as 64 lowercase hex characters. Call once.
  absl::StatusOr<std::string> Finish();

 private:
  void AppendLarge(const void* data, size_t n);
  void Flush();

  EVP_MD_CTX* ctx_ = nullptr;
  bool ok_ = false;
  std::unique_ptr<unsigned char[]> buffer_;
  size_t used_ = 0;
};

}  // namespace fingerprint_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_FINGERPRINT_SHA256_STREAM_H_
