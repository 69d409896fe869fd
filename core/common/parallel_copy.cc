#include "core/common/parallel_copy.h"

#include <algorithm>
#include <cstring>

#include "core/common/parallel.h"

namespace attnaudit {

void ParallelCopy(void* dst, const void* src, int64_t bytes, int threads) {
  if (bytes <= 0) return;
  const int64_t most_pieces = bytes / kParallelCopyPiece;
  const int64_t pieces = std::max<int64_t>(
      1, std::min<int64_t>(most_pieces, ResolveThreads(threads)));
  // Piece boundaries on 64-byte lines, so no two threads write one line.
  const int64_t piece = (bytes / pieces + 63) / 64 * 64;
  char* to = static_cast<char*>(dst);
  const char* from = static_cast<const char*>(src);
  ParallelFor(pieces, threads, [&](int64_t i) {
    const int64_t begin = std::min(bytes, i * piece);
    const int64_t end =
        i + 1 == pieces ? bytes : std::min(bytes, begin + piece);
    if (end > begin) {
      std::memcpy(to + begin, from + begin, static_cast<size_t>(end - begin));
    }
  });
}

}  // namespace attnaudit
