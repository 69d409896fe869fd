// The wire walk behind SplitSnapshotTensorData. It follows the message
// schema through descriptors (so a new Tensor field anywhere in a Snapshot
// needs no change here), copies every field it does not strip verbatim,
// and re-encodes the lengths of the messages it shortened.
#include "proto/codec/tensor_data.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "attnaudit/v1/snapshot.pb.h"
#include "attnaudit/v1/tensor.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace attnaudit {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

absl::Status Malformed() {
  return absl::InvalidArgumentError("not a well-formed protobuf message");
}

class Splitter {
 public:
  explicit Splitter(std::vector<TensorDataRange>* ranges) : ranges_(ranges) {}

  // Walks one message of type `type` (bytes `in`) whose tensors are named
  // under `prefix`, appending its skeleton to *out.
  absl::Status Walk(const Descriptor* type, absl::string_view in,
                    const std::string& prefix, std::string* out) {
    const bool is_tensor = type == v1::Tensor::descriptor();
    CodedInputStream input(reinterpret_cast<const uint8_t*>(in.data()),
                           static_cast<int>(in.size()));
    for (;;) {
      const int start = input.CurrentPosition();
      const uint32_t tag = input.ReadTag();
      if (tag == 0) break;
      const int number =
          static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
      const bool delimited = WireFormatLite::GetTagWireType(tag) ==
                             WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
      const FieldDescriptor* field = type->FindFieldByNumber(number);
      if (delimited && field != nullptr &&
          (is_tensor ? field->name() == "data"
                     : field->type() == FieldDescriptor::TYPE_MESSAGE &&
                           !field->is_repeated())) {
        uint32_t length = 0;
        if (!input.ReadVarint32(&length)) return Malformed();
        const int payload = input.CurrentPosition();
        if (length > in.size() - static_cast<size_t>(payload)) {
          return Malformed();
        }
        const absl::string_view bytes = in.substr(payload, length);
        if (!input.Skip(static_cast<int>(length))) return Malformed();
        if (is_tensor) {
          Record(prefix, bytes);
          continue;
        }
        std::string sub;
        const std::string path = prefix.empty()
                                     ? field->name()
                                     : absl::StrCat(prefix, ".", field->name());
        if (absl::Status s = Walk(field->message_type(), bytes, path, &sub);
            !s.ok()) {
          return s;
        }
        AppendVarint(tag, out);
        AppendVarint(sub.size(), out);
        out->append(sub);
        continue;
      }
      if (!WireFormatLite::SkipField(&input, tag)) return Malformed();
      out->append(in.data() + start, input.CurrentPosition() - start);
    }
    if (!input.ConsumedEntireMessage() ||
        input.CurrentPosition() != static_cast<int>(in.size())) {
      return Malformed();
    }
    return absl::OkStatus();
  }

 private:
  void Record(const std::string& path, absl::string_view bytes) {
    for (TensorDataRange& r : *ranges_) {
      if (r.path == path) {  // a repeated occurrence: the last one wins
        r.bytes = bytes;
        return;
      }
    }
    ranges_->push_back({path, bytes});
  }

  std::vector<TensorDataRange>* ranges_;
};

}  // namespace

absl::Status SplitSnapshotTensorData(absl::string_view message,
                                     std::string* skeleton,
                                     std::vector<TensorDataRange>* ranges) {
  skeleton->clear();
  ranges->clear();
  if (message.size() > static_cast<size_t>(INT32_MAX)) return Malformed();
  return Splitter(ranges).Walk(v1::Snapshot::descriptor(), message, "",
                               skeleton);
}

}  // namespace attnaudit
