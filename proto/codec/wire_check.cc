#include "proto/codec/wire_check.h"

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace attnaudit {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;

constexpr int kMaxDepth = 100;  // protobuf's default recursion limit

// The wire type a field of this type is written with (unpacked).
int WireTypeOf(FieldDescriptor::Type t) {
  switch (t) {
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
      return 1;
    case FieldDescriptor::TYPE_FLOAT:
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
      return 5;
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
    case FieldDescriptor::TYPE_MESSAGE:
      return 2;
    case FieldDescriptor::TYPE_GROUP:
      return 3;
    default:
      return 0;  // the varint types
  }
}

class Walker {
 public:
  Walker(absl::string_view bytes, const Descriptor& root_type,
         absl::string_view root)
      : bytes_(bytes), type_name_(root_type.full_name()), root_(root) {}

  // Checks the fields in [pos, end) of a message of type `d` (null: an
  // unknown message, fields are only skipped). `end_group`: the field
  // number whose end-group tag closes this range (0: none).
  absl::Status Walk(const Descriptor* d, size_t pos, size_t end,
                    const std::string& path, int depth, uint64_t end_group,
                    size_t* stop);

 private:
  absl::Status Fail(const std::string& path, size_t at,
                    absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path.empty() ? root_ : path, ": cannot decode: ", what,
                     " (byte ", at, " of the ", type_name_, ")"));
  }
  bool Varint(size_t* pos, size_t end, uint64_t* v) const;
  // A tag as protobuf reads one: at most 5 bytes, the low 32 bits kept.
  bool Tag(size_t* pos, size_t end, uint32_t* tag) const;
  std::string FieldPath(const std::string& path, const FieldDescriptor* f,
                        uint64_t number,
                        absl::flat_hash_map<uint64_t, int>* seen) const;
  // A length-delimited field: its length, then its body (LengthDelimited);
  // advances *pos past it.
  absl::Status LengthField(const FieldDescriptor* f, const std::string& fpath,
                           size_t at, size_t* pos, size_t end, int depth);
  absl::Status LengthDelimited(const FieldDescriptor* f,
                               const std::string& fpath, size_t at, size_t body,
                               size_t len, int depth);

  const absl::string_view bytes_;
  const std::string type_name_;
  const std::string root_;
};

bool Walker::Varint(size_t* pos, size_t end, uint64_t* v) const {
  *v = 0;
  for (int i = 0; i < 10; ++i) {
    if (*pos >= end) return false;
    const uint8_t b = static_cast<uint8_t>(bytes_[(*pos)++]);
    *v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) return true;
  }
  return false;  // more than 10 bytes
}

bool Walker::Tag(size_t* pos, size_t end, uint32_t* tag) const {
  uint64_t v = 0;
  for (int i = 0; i < 5; ++i) {
    if (*pos >= end) return false;
    const uint8_t b = static_cast<uint8_t>(bytes_[(*pos)++]);
    v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      *tag = static_cast<uint32_t>(v);
      return true;
    }
  }
  return false;  // more than 5 bytes
}

std::string Walker::FieldPath(const std::string& path, const FieldDescriptor* f,
                              uint64_t number,
                              absl::flat_hash_map<uint64_t, int>* seen) const {
  std::string name = f != nullptr ? f->name() : absl::StrCat("<", number, ">");
  if (f != nullptr && f->is_repeated() &&
      f->type() == FieldDescriptor::TYPE_MESSAGE) {
    absl::StrAppend(&name, "[", (*seen)[number]++, "]");
  }
  return path.empty() ? name : absl::StrCat(path, ".", name);
}

absl::Status Walker::LengthDelimited(const FieldDescriptor* f,
                                     const std::string& fpath, size_t at,
                                     size_t body, size_t len, int depth) {
  if (f == nullptr) return absl::OkStatus();
  if (f->is_packable()) {
    const int element = WireTypeOf(f->type());
    if (element == 1 || element == 5) {
      const size_t width = element == 1 ? 8 : 4;
      if (len % width != 0) {
        return Fail(fpath, at,
                    absl::StrCat("packed ", width * 8, "-bit values in ", len,
                                 " bytes"));
      }
      return absl::OkStatus();
    }
    size_t pos = body;
    uint64_t v = 0;
    while (pos < body + len) {
      if (!Varint(&pos, body + len, &v)) {
        return Fail(fpath, at, "a packed varint cut off or too long");
      }
    }
    return absl::OkStatus();
  }
  if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
    if (depth + 1 > kMaxDepth) {
      return Fail(fpath, at, "messages nested deeper than 100 levels");
    }
    size_t stop = 0;
    return Walk(f->message_type(), body, body + len, fpath, depth + 1, 0,
                &stop);
  }
  if (f->type() == FieldDescriptor::TYPE_STRING &&
      f->file()->syntax() == FileDescriptor::SYNTAX_PROTO3 &&
      !IsValidUtf8(bytes_.substr(body, len))) {
    return Fail(fpath, at, "a string field that is not valid UTF-8");
  }
  return absl::OkStatus();
}

absl::Status Walker::LengthField(const FieldDescriptor* f,
                                 const std::string& fpath, size_t at,
                                 size_t* pos, size_t end, int depth) {
  uint64_t v = 0;
  if (!Varint(pos, end, &v)) {
    return Fail(fpath, at, "a length cut off or longer than 10 bytes");
  }
  if (v > end - *pos) {
    // Cut off: the deepest field inside that breaks is the better answer
    // ("snapshot.q.data" rather than "snapshot").
    if (f != nullptr && f->type() == FieldDescriptor::TYPE_MESSAGE &&
        depth + 1 <= kMaxDepth) {
      size_t stop = 0;
      absl::Status inner =
          Walk(f->message_type(), *pos, end, fpath, depth + 1, 0, &stop);
      if (!inner.ok()) return inner;
    }
    return Fail(fpath, at,
                absl::StrCat("the field declares ", v, " bytes but ",
                             end - *pos, " remain"));
  }
  const size_t len = static_cast<size_t>(v);
  ATTNAUDIT_RETURN_IF_ERROR(LengthDelimited(f, fpath, at, *pos, len, depth));
  *pos += len;
  return absl::OkStatus();
}

absl::Status Walker::Walk(const Descriptor* d, size_t pos, size_t end,
                          const std::string& path, int depth,
                          uint64_t end_group, size_t* stop) {
  absl::flat_hash_map<uint64_t, int> seen;
  while (pos < end) {
    const size_t at = pos;
    uint32_t tag = 0;
    if (!Tag(&pos, end, &tag)) {
      return Fail(path, at, "a tag cut off or longer than 5 bytes");
    }
    const uint64_t number = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (number == 0) {
      return Fail(path, at, "invalid field number 0");
    }
    const FieldDescriptor* f =
        d != nullptr ? d->FindFieldByNumber(static_cast<int>(number)) : nullptr;
    // A wire type other than the declared one makes it an unknown field
    // (packable repeated scalars may come packed, as wire type 2).
    if (f != nullptr && wire_type != WireTypeOf(f->type()) &&
        !(f->is_packable() && wire_type == 2)) {
      f = nullptr;
    }
    const std::string fpath = FieldPath(path, f, number, &seen);
    uint64_t v = 0;
    switch (wire_type) {
      case 0:
        if (!Varint(&pos, end, &v)) {
          return Fail(fpath, at, "a varint cut off or longer than 10 bytes");
        }
        break;
      case 1:
      case 5: {
        const size_t width = wire_type == 1 ? 8 : 4;
        if (end - pos < width) {
          return Fail(fpath, at,
                      absl::StrCat("a ", width * 8, "-bit field with only ",
                                   end - pos, " bytes left"));
        }
        pos += width;
        break;
      }
      case 2:
        if (absl::Status s = LengthField(f, fpath, at, &pos, end, depth);
            !s.ok()) {
          return s;
        }
        break;
      case 3: {  // a group: fields until the matching end-group tag
        if (depth + 1 > kMaxDepth) {
          return Fail(fpath, at, "groups nested deeper than 100 levels");
        }
        size_t group_end = 0;
        if (absl::Status s =
                Walk(nullptr, pos, end, fpath, depth + 1, number, &group_end);
            !s.ok()) {
          return s;
        }
        pos = group_end;
        break;
      }
      case 4:
        if (number != end_group) {
          return Fail(path, at, "an end-group tag without its start");
        }
        *stop = pos;
        return absl::OkStatus();
      default:  // no field has this wire type: name the message
        return Fail(path, at, absl::StrCat("invalid wire type ", wire_type));
    }
  }
  if (end_group != 0) {
    return Fail(path, end, "a group without its end-group tag");
  }
  *stop = pos;
  return absl::OkStatus();
}

// Sequential reads over a chunked encoding.
class ChunkReader {
 public:
  explicit ChunkReader(absl::Span<const absl::string_view> chunks)
      : chunks_(chunks) {}
  bool Byte(uint8_t* b) {
    while (chunk_ < chunks_.size() && offset_ >= chunks_[chunk_].size()) {
      ++chunk_;
      offset_ = 0;
    }
    if (chunk_ >= chunks_.size()) return false;
    *b = static_cast<uint8_t>(chunks_[chunk_][offset_++]);
    return true;
  }
  bool Varint(uint64_t* v, int max_bytes) {
    *v = 0;
    for (int i = 0; i < max_bytes; ++i) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  bool Skip(uint64_t n) {
    while (n > 0) {
      if (chunk_ >= chunks_.size()) return false;
      const uint64_t here = chunks_[chunk_].size() - offset_;
      if (n < here) {
        offset_ += n;
        return true;
      }
      n -= here;
      ++chunk_;
      offset_ = 0;
    }
    return true;
  }
  bool AtEnd() {
    while (chunk_ < chunks_.size() && offset_ >= chunks_[chunk_].size()) {
      ++chunk_;
      offset_ = 0;
    }
    return chunk_ >= chunks_.size();
  }

 private:
  absl::Span<const absl::string_view> chunks_;
  size_t chunk_ = 0;
  size_t offset_ = 0;
};

}  // namespace

absl::optional<uint64_t> PeekVarintField(
    absl::Span<const absl::string_view> chunks, int number) {
  ChunkReader r(chunks);
  absl::optional<uint64_t> found;
  while (!r.AtEnd()) {
    uint64_t tag = 0, v = 0;
    if (!r.Varint(&tag, 5)) return absl::nullopt;
    const uint64_t field = (tag & 0xffffffffu) >> 3;
    switch (tag & 7) {
      case 0:
        if (!r.Varint(&v, 10)) return absl::nullopt;
        if (static_cast<int64_t>(field) == number) found = v;
        break;
      case 1:
        if (!r.Skip(8)) return absl::nullopt;
        break;
      case 5:
        if (!r.Skip(4)) return absl::nullopt;
        break;
      case 2:
        if (!r.Varint(&v, 10) || !r.Skip(v)) return absl::nullopt;
        break;
      default:  // groups are not in our requests; give up
        return absl::nullopt;
    }
  }
  return found;
}

bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const uint8_t c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < static_cast<size_t>(len)) return false;
    for (int k = 1; k < len; ++k) {
      const uint8_t cc = static_cast<uint8_t>(text[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

absl::Status CheckWireFormat(const Descriptor& type, absl::string_view bytes,
                             absl::string_view root) {
  Walker walker(bytes, type, root);
  size_t stop = 0;
  return walker.Walk(&type, 0, bytes.size(), "", 0, 0, &stop);
}

absl::Status DescribeParseFailure(const Descriptor& type,
                                  absl::string_view bytes,
                                  absl::string_view root) {
  absl::Status s = CheckWireFormat(type, bytes, root);
  if (!s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat(
      root, ": cannot decode: not a valid ", type.full_name(), " (",
      bytes.size(), " bytes; corrupt or too large protobuf)"));
}

}  // namespace attnaudit
