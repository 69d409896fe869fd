// FindChunkData against protobuf's own parser: for every chunk message a
// client may send, split into slices anywhere (inside the keys and length
// varints too), the ranges it finds hold exactly the bytes protobuf parses
// as chunk.data; every other message is declined, so protobuf decides it.
#include "proto/codec/chunk_view.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnaudit/v1/service.pb.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

std::string ChunkMessage(const std::string& data) {
  v1::AuditStreamMessage m;
  m.mutable_chunk()->set_data(data);
  return m.SerializeAsString();
}

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) & 0xff);
  return s;
}

// The message cut at the given offsets (sorted, within the message).
std::vector<absl::string_view> Cut(const std::string& message,
                                   const std::vector<size_t>& cuts) {
  std::vector<absl::string_view> pieces;
  size_t from = 0;
  for (size_t at : cuts) {
    pieces.push_back(absl::string_view(message).substr(from, at - from));
    from = at;
  }
  pieces.push_back(absl::string_view(message).substr(from));
  return pieces;
}

std::string Joined(const std::vector<absl::string_view>& ranges) {
  std::string s;
  for (absl::string_view r : ranges) s.append(r.data(), r.size());
  return s;
}

TEST(ChunkViewTest, FindsTheDataProtobufParsesWhereverTheSlicesEnd) {
  // Sizes around the varint boundaries of both length prefixes.
  for (size_t n : {size_t{0}, size_t{1}, size_t{124}, size_t{125}, size_t{126},
                   size_t{127}, size_t{128}, size_t{16380}, size_t{16384},
                   size_t{1} << 20}) {
    const std::string data = Pattern(n);
    const std::string message = ChunkMessage(data);
    v1::AuditStreamMessage parsed;
    ASSERT_TRUE(parsed.ParseFromString(message));
    ASSERT_EQ(parsed.chunk().data(), data);
    std::vector<std::vector<size_t>> cuttings = {{}};
    for (size_t at = 1; at < std::min<size_t>(message.size(), 9); ++at) {
      cuttings.push_back({at});  // inside the keys and varints
    }
    if (message.size() > 20) {
      cuttings.push_back({3, 7, message.size() / 2, message.size() - 1});
      cuttings.push_back({message.size() / 3, message.size() / 3});  // empty
    }
    for (const std::vector<size_t>& cuts : cuttings) {
      std::vector<absl::string_view> ranges;
      ASSERT_TRUE(FindChunkData(Cut(message, cuts), &ranges))
          << n << " bytes, " << cuts.size() << " cuts";
      EXPECT_EQ(Joined(ranges), data) << n << " bytes";
      for (absl::string_view r : ranges) EXPECT_FALSE(r.empty());
    }
  }
}

TEST(ChunkViewTest, DeclinesEveryOtherShape) {
  const std::string data = Pattern(300);
  std::vector<std::pair<std::string, std::string>> others;
  {
    v1::AuditStreamMessage m;
    m.mutable_header();
    others.push_back({"a header", m.SerializeAsString()});
  }
  // Two data fields (protobuf keeps the last one).
  others.push_back(
      {"data twice", ChunkMessage(data) + std::string("\x12\x03\x0a\x01x", 5)});
  // chunk { data: "y" data: "z" }: 12 06 0a 01 'y' 0a 01 'z'.
  others.push_back({"data twice inside one chunk",
                    std::string("\x12\x06\x0a\x01y\x0a\x01z", 8)});
  // An unknown field inside the chunk, after its data.
  {
    std::string m = ChunkMessage("abc");  // 12 05 0a 03 'a' 'b' 'c'
    m[1] = static_cast<char>(m[1] + 2);
    m += std::string("\x10\x01", 2);  // field 2, varint 1
    others.push_back({"unknown field in the chunk", m});
  }
  others.push_back({"truncated data", ChunkMessage(data).substr(0, 200)});
  others.push_back({"trailing byte", ChunkMessage(data) + "x"});
  others.push_back({"empty message", ""});
  others.push_back(
      {"overlong varint", std::string("\x12\xff\xff\xff\xff\xff\x01", 7)});
  for (const auto& [what, message] : others) {
    std::vector<absl::string_view> ranges;
    EXPECT_FALSE(FindChunkData({message}, &ranges)) << what;
    EXPECT_TRUE(ranges.empty()) << what;
  }
}

}  // namespace
}  // namespace attnaudit
