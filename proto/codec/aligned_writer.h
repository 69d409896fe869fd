// Serializes a message as protobuf's own serializer would, except that the
// data of every non-empty attnaudit.v1.Tensor starts at an offset of the
// output that is a multiple of kTensorDataAlignment. Each such tensor is
// written as dtype, shape, a `padding` field of p bytes, data, and a
// second `padding` field of kTensorDataAlignment - 1 - p bytes: its size is
// the same wherever it lands, so every enclosing length is known before
// the first byte is written, and p is picked from the stream position
// when the tensor is reached. Readers ignore `padding`; any protobuf
// parser reads the output as the same message (fields may come in any
// order, and a tensor's own `padding`, if it had one, is dropped).
//
// Why: a snapshot file is mapped and its tensors used in place
// (file_codec.cc); the core reads elements through typed pointers, which
// must be naturally aligned, so a payload at an odd offset would have to be
// copied.
//
// Thread-safe for distinct outputs; `message` must not change meanwhile.
#ifndef ATTNAUDIT_PROTO_CODEC_ALIGNED_WRITER_H_
#define ATTNAUDIT_PROTO_CODEC_ALIGNED_WRITER_H_

#include <cstddef>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message.h"

namespace attnaudit {

inline constexpr size_t kTensorDataAlignment = 64;

// The number of bytes WriteAligned writes for `message`.
size_t AlignedByteSize(const google::protobuf::Message& message);

// Writes `message` to `out`, whose ByteCount() must be the offset from the
// start of the file (or buffer) that alignment is measured from. Returns
// false when the stream failed (out->HadError()).
bool WriteAligned(const google::protobuf::Message& message,
                  google::protobuf::io::CodedOutputStream* out);

}  // namespace attnaudit

#endif  // ATTNAUDIT_PROTO_CODEC_ALIGNED_WRITER_H_
