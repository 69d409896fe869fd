#include "proto/codec/aligned_writer.h"

#include <string>
#include <vector>

#include "attnaudit/v1/tensor.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/wire_format.h"
#include "google/protobuf/wire_format_lite.h"

namespace attnaudit {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::internal::WireFormat;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedOutputStream;

constexpr int kDataField = v1::Tensor::kDataFieldNumber;
constexpr int kPaddingField = v1::Tensor::kPaddingFieldNumber;
// Each padding field: a one-byte tag and a one-byte length (both < 128).
static_assert((kPaddingField << 3 | 2) < 128 && kTensorDataAlignment <= 128);
constexpr size_t kPaddingBytes = 2 * 2 + (kTensorDataAlignment - 1);

const v1::Tensor* PaddedTensor(const Message& m) {
  if (m.GetDescriptor() != v1::Tensor::descriptor()) return nullptr;
  const auto* t = static_cast<const v1::Tensor*>(&m);
  return t->data().empty() ? nullptr : t;
}

// dtype and shape only.
v1::Tensor TensorHead(const v1::Tensor& t) {
  v1::Tensor head;
  head.set_dtype(t.dtype());
  *head.mutable_shape() = t.shape();
  return head;
}

size_t DataFieldSize(const v1::Tensor& t) {
  const size_t n = t.data().size();
  return 1 + CodedOutputStream::VarintSize64(n) + n;
}

bool RecursesInto(const FieldDescriptor* f) {
  return f->type() == FieldDescriptor::TYPE_MESSAGE && !f->is_map();
}

std::vector<const FieldDescriptor*> SetFields(const Message& m) {
  std::vector<const FieldDescriptor*> fields;
  m.GetReflection()->ListFields(m, &fields);
  return fields;
}

// The elements of a (repeated or singular) message field.
std::vector<const Message*> Elements(const Message& m,
                                     const FieldDescriptor* f) {
  const Reflection* r = m.GetReflection();
  std::vector<const Message*> out;
  if (!f->is_repeated()) {
    out.push_back(&r->GetMessage(m, f));
    return out;
  }
  const int n = r->FieldSize(m, f);
  for (int i = 0; i < n; ++i) out.push_back(&r->GetRepeatedMessage(m, f, i));
  return out;
}

void WritePadding(size_t bytes, CodedOutputStream* out) {
  static const std::string kZeros(kTensorDataAlignment, '\0');
  out->WriteTag(WireFormatLite::MakeTag(
      kPaddingField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
  out->WriteVarint32(static_cast<uint32_t>(bytes));
  out->WriteRaw(kZeros.data(), static_cast<int>(bytes));
}

// dtype, shape, padding (p), data, padding (alignment - 1 - p).
void WriteTensor(const v1::Tensor& t, CodedOutputStream* out) {
  const v1::Tensor head = TensorHead(t);
  head.SerializeToCodedStream(out);  // computes its cached sizes first
  const size_t n = t.data().size();
  // Where the payload would start with p = 0: after this padding field's
  // two bytes and the data field's tag and length.
  const size_t start = static_cast<size_t>(out->ByteCount()) + 2 + 1 +
                       CodedOutputStream::VarintSize64(n);
  const size_t p = (kTensorDataAlignment - start % kTensorDataAlignment) %
                   kTensorDataAlignment;
  WritePadding(p, out);
  out->WriteTag(WireFormatLite::MakeTag(
      kDataField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
  out->WriteVarint64(n);
  out->WriteRawMaybeAliased(t.data().data(), static_cast<int>(n));
  WritePadding(kTensorDataAlignment - 1 - p, out);
}

}  // namespace

size_t AlignedByteSize(const Message& m) {
  if (const v1::Tensor* t = PaddedTensor(m)) {
    return TensorHead(*t).ByteSizeLong() + DataFieldSize(*t) + kPaddingBytes;
  }
  size_t size = 0;
  for (const FieldDescriptor* f : SetFields(m)) {
    if (!RecursesInto(f)) {
      size += WireFormat::FieldByteSize(f, m);
      continue;
    }
    for (const Message* e : Elements(m, f)) {
      const size_t len = AlignedByteSize(*e);
      size += WireFormat::TagSize(f->number(), f->type()) +
              CodedOutputStream::VarintSize64(len) + len;
    }
  }
  return size + WireFormat::ComputeUnknownFieldsSize(
                    m.GetReflection()->GetUnknownFields(m));
}

bool WriteAligned(const Message& m, CodedOutputStream* out) {
  if (const v1::Tensor* t = PaddedTensor(m)) {
    WriteTensor(*t, out);
    return !out->HadError();
  }
  m.ByteSizeLong();  // SerializeFieldWithCachedSizes reads cached sizes
  for (const FieldDescriptor* f : SetFields(m)) {
    if (!RecursesInto(f)) {
      WireFormat::SerializeFieldWithCachedSizes(f, m, out);
      continue;
    }
    for (const Message* e : Elements(m, f)) {
      out->WriteTag(WireFormatLite::MakeTag(
          f->number(), WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
      out->WriteVarint64(AlignedByteSize(*e));
      if (!WriteAligned(*e, out)) return false;
    }
  }
  WireFormat::SerializeUnknownFields(m.GetReflection()->GetUnknownFields(m),
                                     out);
  return !out->HadError();
}

}  // namespace attnaudit
