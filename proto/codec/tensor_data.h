// Where the tensor bytes of a serialized attnaudit.v1.Snapshot lie, without
// parsing (copying) them: the snapshot file reader maps a file, splits it
// into a small "skeleton" message (everything but the Tensor.data payloads)
// that protobuf parses as usual, and points each tensor at its payload in
// the mapping. A file's tensor bytes are never copied.
//
// Thread-safe (pure function of its arguments).
#ifndef ATTNAUDIT_PROTO_CODEC_TENSOR_DATA_H_
#define ATTNAUDIT_PROTO_CODEC_TENSOR_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnaudit {

// One Tensor.data payload: the tensor's path (as in tensor_paths.h, e.g.
// "k_pages", "engine.out") and its bytes inside the serialized message.
struct TensorDataRange {
  std::string path;
  absl::string_view bytes;
};

// Splits a serialized attnaudit.v1.Snapshot into *skeleton (the same
// message with every Tensor.data field removed; every other field,
// unknown ones included, copied verbatim) and the payload ranges, in wire
// order. When a tensor's data field occurs more than once the last one
// wins, as protobuf's parser would have it. InvalidArgument when the bytes
// are not a well-formed protobuf message.
absl::Status SplitSnapshotTensorData(absl::string_view message,
                                     std::string* skeleton,
                                     std::vector<TensorDataRange>* ranges);

}  // namespace attnaudit

#endif  // ATTNAUDIT_PROTO_CODEC_TENSOR_DATA_H_
