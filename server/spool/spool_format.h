// Internal: the spool file format (see spool.h) — encoding of the header
// and metadata, and their parsing with every length checked. Writes
// version 2 (the metadata as a SpoolRecordMetadata message); reads
// versions 1 (hand-encoded fields, written before) and 2.
#ifndef ATTNAUDIT_SERVER_SPOOL_SPOOL_FORMAT_H_
#define ATTNAUDIT_SERVER_SPOOL_SPOOL_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/spool/spool.h"

namespace attnaudit::server {
namespace spool_internal {

constexpr char kMagic[8] = {'A', 'A', 'S', 'P', 'O', 'O', 'L', '1'};
// Version 1: the metadata as little-endian fields (read only).
constexpr uint32_t kVersionFields = 1;
// Version 2: the metadata as a SpoolRecordMetadata message (written).
constexpr uint32_t kVersionProto = 2;
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8;
constexpr size_t kTrailerBytes = 4;
// Metadata is a few small strings; anything larger is corruption.
constexpr uint32_t kMaxMetadataBytes = 1 << 20;

struct Header {
  uint32_t version = kVersionProto;
  uint32_t metadata_bytes = 0;
  uint64_t payload_bytes = 0;
  uint64_t file_bytes() const {
    return kHeaderBytes + metadata_bytes + payload_bytes + kTrailerBytes;
  }
};

// Header followed by the encoded metadata (version 2). InvalidArgument when
// the metadata strings are too large.
absl::Status EncodePrefix(const SpoolMetadata& metadata, uint64_t payload_bytes,
                          std::string* out);

// Parses the fixed header; DataLoss naming the problem when it is not ours
// or its lengths exceed the limits.
absl::Status DecodeHeader(absl::string_view bytes, uint64_t max_payload_bytes,
                          Header* header);

// Parses the metadata block of a file of format `version` (the header's);
// DataLoss when malformed.
absl::Status DecodeMetadata(uint32_t version, absl::string_view bytes,
                            SpoolMetadata* metadata);

}  // namespace spool_internal
}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_SPOOL_SPOOL_FORMAT_H_
