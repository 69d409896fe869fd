// Fuzz target: the AuditStream assembler (proto/codec/stream.h) with a
// header and chunks from the input, then decoding and validation of the
// assembled snapshot. Input layout:
//   u16 (little-endian) header length h | h bytes: AuditStreamHeader |
//   u8 c: chunk size (c + 1) * 61 bytes | the rest: the streamed bytes,
//   cut into chunks of that size (chunks may span tensors).
// Invariants: every refusal is InvalidArgument; the assembler never takes
// more than the announced bytes (Append past the total fails); a finished
// stream decodes or fails InvalidArgument, and validation never crashes.
// The server's chunk fast path (proto/codec/chunk_view.h) is checked
// against protobuf on the whole input, read as a message cut into pieces,
// and on a chunk message built around it: whatever FindChunkData accepts,
// protobuf parses to exactly the bytes it found.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "attnaudit/v1/service.pb.h"
#include "core/validate/validate.h"
#include "proto/codec/chunk_view.h"
#include "proto/codec/codec.h"
#include "proto/codec/stream.h"
#include "tests/fuzz/fuzz_limits.h"

namespace {

void Require(bool invariant) {
  if (!invariant) std::abort();
}

bool Refused(const absl::Status& s) {
  Require(s.ok() || s.code() == absl::StatusCode::kInvalidArgument);
  return !s.ok();
}

// `message` cut into pieces of `piece` bytes (the last one shorter).
std::vector<absl::string_view> Cut(absl::string_view message, size_t piece) {
  std::vector<absl::string_view> pieces;
  for (size_t at = 0; at < message.size(); at += piece) {
    pieces.push_back(message.substr(at, piece));
  }
  return pieces;
}

// Whatever FindChunkData accepts parses, with protobuf, to a chunk whose
// data are exactly the bytes it found.
void CheckChunkView(absl::string_view message, size_t piece) {
  std::vector<absl::string_view> found;
  if (!attnaudit::FindChunkData(Cut(message, piece), &found)) {
    Require(found.empty());
    return;
  }
  std::string joined;
  for (absl::string_view r : found) joined.append(r.data(), r.size());
  attnaudit::v1::AuditStreamMessage parsed;
  Require(
      parsed.ParseFromArray(message.data(), static_cast<int>(message.size())));
  Require(parsed.has_chunk() && parsed.chunk().data() == joined);
}

// On the first 2 KiB only: the stream inputs run to megabytes, and copying
// them twice more under ASan would starve the assembler's own fuzzing.
void CheckChunkViews(const uint8_t* data, size_t size) {
  size = std::min<size_t>(size, 2048);
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t piece = size > 0 ? static_cast<size_t>(data[0] % 13) + 1 : 1;
  CheckChunkView(input, piece);
  attnaudit::v1::AuditStreamMessage built;
  built.mutable_chunk()->set_data(input.data(), input.size());
  const std::string wire = built.SerializeAsString();
  std::vector<absl::string_view> found;
  Require(attnaudit::FindChunkData(Cut(wire, piece), &found));
  std::string joined;
  for (absl::string_view r : found) joined.append(r.data(), r.size());
  Require(joined == input);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnaudit;  // NOLINT: a fuzz entry point
  CheckChunkViews(data, size);
  if (size < 3) return 0;
  const size_t h = data[0] | (size_t{data[1]} << 8);
  if (size < 2 + h + 1) return 0;
  v1::AuditStreamHeader header;
  if (!header.ParseFromArray(data + 2, static_cast<int>(h))) return 0;
  const size_t chunk = (size_t{data[2 + h]} + 1) * 61;
  absl::string_view rest(reinterpret_cast<const char*>(data) + 2 + h + 1,
                         size - 2 - h - 1);
  AuditStreamAssembler assembler(testing::kFuzzStreamBytes);
  if (Refused(assembler.Begin(&header))) return 0;
  Require(assembler.bytes_expected() <= testing::kFuzzStreamBytes);
  int64_t sent = 0;
  while (!rest.empty()) {
    const absl::string_view piece = rest.substr(0, chunk);
    rest.remove_prefix(piece.size());
    const bool refused = Refused(assembler.Append(piece));
    // Bytes beyond the announced total are always refused.
    if (sent + static_cast<int64_t>(piece.size()) >
        assembler.bytes_expected()) {
      Require(refused);
    }
    if (refused) return 0;
    sent += static_cast<int64_t>(piece.size());
  }
  if (Refused(assembler.Finish())) return 0;
  absl::StatusOr<Snapshot> snapshot =
      SnapshotFromProto(assembler.mutable_snapshot());
  if (Refused(snapshot.status())) return 0;
  absl::StatusOr<ResolvedLayout> layout =
      ValidateSnapshot(*snapshot, testing::FuzzLimits());
  Refused(layout.status());
  return 0;
}
