// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the SSE4.2 crc32
// instruction 8 bytes at a time where the build targets it (x86-64-v2 and
// -march=native both do), a byte-wise table otherwise.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "server/spool/spool.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace attnaudit::server {
namespace {

#if !defined(__SSE4_2__)
struct Table {
  uint32_t v[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      v[i] = c;
    }
  }
};
#endif

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t size) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__SSE4_2__)
  uint64_t c64 = c;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c64 = _mm_crc32_u64(c64, word);
    p += 8;
    size -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (size > 0) {
    c = _mm_crc32_u8(c, *p++);
    --size;
  }
#else
  static const Table table;
  while (size > 0) {
    c = table.v[(c ^ *p++) & 0xFFu] ^ (c >> 8);
    --size;
  }
#endif
  return ~c;
}

}  // namespace attnaudit::server
