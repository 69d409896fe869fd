#include "server/spool/spool_format.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "server/spool/spool_record.pb.h"

namespace attnaudit::server {
namespace spool_internal {
namespace {

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

// Reads little-endian values from a bounded view; every read is checked.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool U32(uint32_t* v) { return Fixed(v); }
  bool U64(uint64_t* v) { return Fixed(v); }
  bool String(std::string* s) {
    uint32_t n;
    if (!U32(&n) || in_.size() < n) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  // A little-endian unsigned integer of sizeof(T) bytes.
  template <typename T>
  bool Fixed(T* v) {
    if (in_.size() < sizeof(T)) return false;
    *v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      *v |= static_cast<T>(static_cast<unsigned char>(in_[i])) << (8 * i);
    }
    in_.remove_prefix(sizeof(T));
    return true;
  }

  absl::string_view in_;
};

int64_t TimeToMicros(absl::Time t) {
  if (t == absl::InfiniteFuture()) return std::numeric_limits<int64_t>::max();
  if (t == absl::InfinitePast()) return std::numeric_limits<int64_t>::min();
  return absl::ToUnixMicros(t);
}

absl::Time MicrosToTime(int64_t us) {
  if (us == std::numeric_limits<int64_t>::max()) return absl::InfiniteFuture();
  if (us == std::numeric_limits<int64_t>::min()) return absl::InfinitePast();
  return absl::FromUnixMicros(us);
}

}  // namespace

absl::Status EncodePrefix(const SpoolMetadata& metadata, uint64_t payload_bytes,
                          std::string* out) {
  spool::SpoolRecordMetadata record;
  record.set_priority(metadata.priority);
  record.set_created_unix_micros(TimeToMicros(metadata.created));
  record.set_deadline_unix_micros(TimeToMicros(metadata.deadline));
  record.set_model(metadata.model);
  record.set_layer(metadata.layer);
  record.set_engine(metadata.engine);
  record.set_attributes(metadata.attributes);
  record.set_tenant(metadata.tenant);
  const size_t meta_bytes = record.ByteSizeLong();
  if (meta_bytes > kMaxMetadataBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata: ", meta_bytes, " bytes encoded, limit ", kMaxMetadataBytes));
  }
  out->clear();
  out->append(kMagic, sizeof(kMagic));
  PutU32(out, kVersionProto);
  PutU32(out, static_cast<uint32_t>(meta_bytes));
  PutU64(out, payload_bytes);
  if (!record.AppendToString(out)) {
    return absl::InternalError("metadata: could not be serialised");
  }
  return absl::OkStatus();
}

absl::Status DecodeHeader(absl::string_view bytes, uint64_t max_payload_bytes,
                          Header* header) {
  if (bytes.size() < kHeaderBytes) {
    return absl::DataLossError("header: file shorter than the header");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("header: bad magic");
  }
  Reader r(bytes.substr(sizeof(kMagic), kHeaderBytes - sizeof(kMagic)));
  uint32_t version = 0;
  r.U32(&version);
  r.U32(&header->metadata_bytes);
  r.U64(&header->payload_bytes);
  header->version = version;
  if (version != kVersionFields && version != kVersionProto) {
    return absl::DataLossError(
        absl::StrCat("header: unknown format version ", version));
  }
  if (header->metadata_bytes > kMaxMetadataBytes) {
    return absl::DataLossError(absl::StrCat(
        "header: metadata length ", header->metadata_bytes, " over the limit"));
  }
  if (header->payload_bytes > max_payload_bytes) {
    return absl::DataLossError(
        absl::StrCat("header: payload length ", header->payload_bytes,
                     " over the limit ", max_payload_bytes));
  }
  return absl::OkStatus();
}

namespace {

// Version 1: priority u32, created/deadline/layer u64, then model, engine,
// attributes and (since tenants) tenant as u32 length + bytes; an entry
// that ends after `attributes` predates tenants.
absl::Status DecodeFieldsMetadata(absl::string_view bytes,
                                  SpoolMetadata* metadata) {
  Reader r(bytes);
  uint32_t priority;
  uint64_t created, deadline, layer;
  if (!r.U32(&priority) || !r.U64(&created) || !r.U64(&deadline) ||
      !r.U64(&layer) || !r.String(&metadata->model) ||
      !r.String(&metadata->engine) || !r.String(&metadata->attributes)) {
    return absl::DataLossError("metadata: malformed");
  }
  if (!r.done() && (!r.String(&metadata->tenant) || !r.done())) {
    return absl::DataLossError("metadata: malformed");
  }
  metadata->priority = static_cast<int32_t>(priority);
  metadata->created = MicrosToTime(static_cast<int64_t>(created));
  metadata->deadline = MicrosToTime(static_cast<int64_t>(deadline));
  metadata->layer = static_cast<int64_t>(layer);
  return absl::OkStatus();
}

absl::Status DecodeProtoMetadata(absl::string_view bytes,
                                 SpoolMetadata* metadata) {
  spool::SpoolRecordMetadata record;
  if (!record.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("metadata: malformed");
  }
  metadata->priority = record.priority();
  metadata->created = MicrosToTime(record.created_unix_micros());
  metadata->deadline = MicrosToTime(record.deadline_unix_micros());
  metadata->model = record.model();
  metadata->layer = record.layer();
  metadata->engine = record.engine();
  metadata->attributes = record.attributes();
  metadata->tenant = record.tenant();
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeMetadata(uint32_t version, absl::string_view bytes,
                            SpoolMetadata* metadata) {
  if (version == kVersionFields) return DecodeFieldsMetadata(bytes, metadata);
  if (version == kVersionProto) return DecodeProtoMetadata(bytes, metadata);
  return absl::DataLossError(
      absl::StrCat("header: unknown format version ", version));
}

}  // namespace spool_internal
}  // namespace attnaudit::server
