#include "proto/codec/stream.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "proto/codec/codec.h"
#include "proto/codec/internal.h"
#include "proto/codec/tensor_paths.h"

namespace attnaudit {
namespace {

// One manifest entry: a known, not yet listed tensor path whose dtype and
// shape the header's snapshot sets (with no data), and whose byte length
// is what they say, within the stream limit.
absl::Status CheckManifestEntry(const v1::StreamedTensor& entry, int index,
                                const v1::Snapshot& snapshot,
                                int64_t max_stream_bytes,
                                std::set<std::string>* seen) {
  const std::string where = absl::StrCat("header.manifest[", index, "]");
  const std::string& path = entry.field_path();
  const bool known =
      std::find(SnapshotTensorPaths().begin(), SnapshotTensorPaths().end(),
                path) != SnapshotTensorPaths().end();
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".field_path: \"", path, "\" is not a tensor of Snapshot"));
  }
  if (!seen->insert(path).second) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".field_path: \"", path, "\" is listed twice"));
  }
  const v1::Tensor* tensor = FindSnapshotTensor(snapshot, path);
  if (tensor == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": snapshot.", path,
                     " is not set in the header (its dtype and shape must "
                     "be)"));
  }
  if (!tensor->data().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": snapshot.", path, ".data must be empty in the header"));
  }
  const int element = v1::DType_IsValid(tensor->dtype())
                          ? DTypeSize(static_cast<DType>(tensor->dtype()))
                          : 0;
  if (element == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": snapshot.", path, ".dtype: unknown value ", tensor->dtype()));
  }
  const std::vector<int64_t> shape(tensor->shape().begin(),
                                   tensor->shape().end());
  int64_t elements = 0;
  if (!CheckedNumElements(shape, &elements) ||
      elements > max_stream_bytes / element) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": snapshot.", path,
                     ".shape is negative or larger than the stream limit of ",
                     max_stream_bytes, " bytes"));
  }
  if (entry.byte_length() != elements * element) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".byte_length: ", entry.byte_length(), " but snapshot.", path,
        " holds ", elements, " elements of ", element,
        " bytes = ", elements * element));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<const Tensor*> BuildAuditStreamHeader(
    const Snapshot& snapshot, int64_t min_streamed_bytes,
    v1::AuditStreamHeader* header) {
  std::vector<const Tensor*> streamed;
  v1::Snapshot* msg = header->mutable_snapshot();
  msg->Clear();
  header->clear_manifest();
  for (absl::string_view path : SnapshotTensorPaths()) {
    const Tensor* tensor = FindSnapshotTensor(snapshot, path);
    if (!tensor->present()) continue;
    v1::Tensor* field = MutableSnapshotTensor(msg, path);
    const int64_t size = static_cast<int64_t>(tensor->bytes().size());
    if (size < min_streamed_bytes) {
      TensorToProto(*tensor, field);
      continue;
    }
    field->set_dtype(codec_internal::EncodeDType(tensor->dtype()));
    field->mutable_shape()->Assign(tensor->shape().begin(),
                                   tensor->shape().end());
    v1::StreamedTensor* entry = header->add_manifest();
    entry->set_field_path(std::string(path));
    entry->set_byte_length(size);
    streamed.push_back(tensor);
  }
  codec_internal::EncodeScalars(snapshot, msg);
  return streamed;
}

AuditStreamChunker::AuditStreamChunker(std::vector<const Tensor*> tensors,
                                       int64_t chunk_bytes)
    : tensors_(std::move(tensors)),
      chunk_bytes_(std::max<int64_t>(chunk_bytes, 1)) {
  for (const Tensor* t : tensors_) {
    total_bytes_ += static_cast<int64_t>(t->bytes().size());
  }
}

bool AuditStreamChunker::NextPieces(std::vector<absl::string_view>* pieces) {
  pieces->clear();
  int64_t size = 0;
  while (tensor_ < tensors_.size() && size < chunk_bytes_) {
    const absl::string_view bytes = tensors_[tensor_]->bytes();
    const size_t want = static_cast<size_t>(chunk_bytes_ - size);
    const size_t take = std::min(want, bytes.size() - offset_);
    if (take > 0) pieces->push_back(bytes.substr(offset_, take));
    size += static_cast<int64_t>(take);
    offset_ += take;
    if (offset_ == bytes.size()) {
      ++tensor_;
      offset_ = 0;
    }
  }
  return size > 0;
}

bool AuditStreamChunker::Next(std::string* chunk) {
  chunk->clear();
  while (tensor_ < tensors_.size() &&
         static_cast<int64_t>(chunk->size()) < chunk_bytes_) {
    const absl::string_view bytes = tensors_[tensor_]->bytes();
    const size_t want = static_cast<size_t>(chunk_bytes_) - chunk->size();
    const size_t take = std::min(want, bytes.size() - offset_);
    chunk->append(bytes.data() + offset_, take);
    offset_ += take;
    if (offset_ == bytes.size()) {
      ++tensor_;
      offset_ = 0;
    }
  }
  return !chunk->empty();
}

AuditStreamAssembler::AuditStreamAssembler(int64_t max_stream_bytes)
    : max_stream_bytes_(max_stream_bytes) {}

absl::Status AuditStreamAssembler::Begin(v1::AuditStreamHeader* header) {
  if (begun_) {
    return absl::InvalidArgumentError(
        "header: a second header; AuditStream takes exactly one, first");
  }
  // Check the whole manifest before reserving any memory.
  std::set<std::string> seen;
  int64_t total = 0;
  for (int i = 0; i < header->manifest_size(); ++i) {
    ATTNAUDIT_RETURN_IF_ERROR(CheckManifestEntry(
        header->manifest(i), i, header->snapshot(), max_stream_bytes_, &seen));
    total += header->manifest(i).byte_length();  // each <= max: no overflow
    if (total > max_stream_bytes_) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.manifest: more than the limit of ",
                       max_stream_bytes_, " streamed bytes announced"));
    }
  }

  begun_ = true;
  snapshot_.Swap(header->mutable_snapshot());
  for (const v1::StreamedTensor& entry : header->manifest()) {
    std::string* data =
        MutableSnapshotTensor(&snapshot_, entry.field_path())->mutable_data();
    data->reserve(static_cast<size_t>(entry.byte_length()));
    targets_.push_back(data);
    lengths_.push_back(entry.byte_length());
  }
  bytes_expected_ = total;
  return absl::OkStatus();
}

absl::Status AuditStreamAssembler::Append(absl::string_view chunk) {
  if (!begun_) {
    return absl::InvalidArgumentError(
        "chunk: received before the header; the header comes first");
  }
  if (static_cast<int64_t>(chunk.size()) > bytes_expected_ - bytes_received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk: ", bytes_received_ + static_cast<int64_t>(chunk.size()),
        " bytes received, more than the ", bytes_expected_,
        " the manifest announced"));
  }
  while (!chunk.empty()) {
    std::string* target = targets_[target_];
    const size_t room = static_cast<size_t>(lengths_[target_]) - target->size();
    const size_t take = std::min(room, chunk.size());
    target->append(chunk.data(), take);
    chunk.remove_prefix(take);
    bytes_received_ += static_cast<int64_t>(take);
    if (take == room) ++target_;
  }
  // Skip zero-length tensors so target_ always points at one with room.
  while (target_ < targets_.size() &&
         static_cast<int64_t>(targets_[target_]->size()) == lengths_[target_]) {
    ++target_;
  }
  return absl::OkStatus();
}

absl::Status AuditStreamAssembler::Finish() const {
  if (!begun_) {
    return absl::InvalidArgumentError("stream ended before the header");
  }
  if (bytes_received_ != bytes_expected_) {
    return absl::InvalidArgumentError(absl::StrCat("stream ended after ",
                                                   bytes_received_, " of ",
                                                   bytes_expected_, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace attnaudit
