#include "proto/codec/chunk_view.h"

#include <cstddef>
#include <cstdint>

namespace attnaudit {
namespace {

// Field keys of the plain shape (field number << 3 | wire type 2).
constexpr uint8_t kChunkKey = (2 << 3) | 2;  // AuditStreamMessage.chunk
constexpr uint8_t kDataKey = (1 << 3) | 2;   // AuditStreamChunk.data

// Reads bytes across the pieces, front to back.
class PieceReader {
 public:
  explicit PieceReader(const std::vector<absl::string_view>& pieces)
      : pieces_(pieces) {}

  bool Byte(uint8_t* out) {
    while (piece_ < pieces_.size() && offset_ == pieces_[piece_].size()) {
      ++piece_;
      offset_ = 0;
    }
    if (piece_ == pieces_.size()) return false;
    *out = static_cast<uint8_t>(pieces_[piece_][offset_++]);
    ++consumed_;
    return true;
  }

  // A length varint, at most 5 bytes (lengths fit an int32 on the wire).
  bool Length(uint64_t* out) {
    uint64_t value = 0;
    for (int shift = 0; shift < 35; shift += 7) {
      uint8_t b = 0;
      if (!Byte(&b)) return false;
      value |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *out = value;
        return value <= INT32_MAX;
      }
    }
    return false;
  }

  // The rest of the bytes, as sub-ranges of the pieces.
  void Rest(std::vector<absl::string_view>* out) {
    for (; piece_ < pieces_.size(); ++piece_, offset_ = 0) {
      const absl::string_view rest = pieces_[piece_].substr(offset_);
      if (!rest.empty()) out->push_back(rest);
    }
  }

  uint64_t consumed() const { return consumed_; }

 private:
  const std::vector<absl::string_view>& pieces_;
  size_t piece_ = 0;
  size_t offset_ = 0;
  uint64_t consumed_ = 0;
};

}  // namespace

bool FindChunkData(const std::vector<absl::string_view>& pieces,
                   std::vector<absl::string_view>* data) {
  data->clear();
  uint64_t total = 0;
  for (absl::string_view p : pieces) total += p.size();
  PieceReader in(pieces);
  uint8_t key = 0;
  uint64_t chunk_length = 0;
  if (!in.Byte(&key) || key != kChunkKey || !in.Length(&chunk_length)) {
    return false;
  }
  // The chunk message must be the whole rest: nothing after it.
  if (in.consumed() + chunk_length != total) return false;
  const uint64_t chunk_start = in.consumed();
  uint64_t data_length = 0;
  if (chunk_length == 0) return true;  // a chunk with no data field
  if (!in.Byte(&key) || key != kDataKey || !in.Length(&data_length)) {
    return false;
  }
  // ... and the data field the whole chunk message.
  if (in.consumed() - chunk_start + data_length != chunk_length) return false;
  in.Rest(data);
  return true;
}

}  // namespace attnaudit
