// SplitSnapshotTensorData: the skeleton plus payload ranges must carry
// exactly what protobuf's own parser would have read, without copying a
// tensor byte.
#include "proto/codec/tensor_data.h"

#include <string>
#include <vector>

#include "attnaudit/v1/snapshot.pb.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "proto/codec/tensor_paths.h"
#include "tests/unit/proto/codec_test_util.h"

namespace attnaudit {
namespace {

using google::protobuf::util::MessageDifferencer;
using testing::FullSnapshot;

std::string Serialized(uint32_t seed, v1::Snapshot* msg) {
  SnapshotToProto(FullSnapshot(seed), msg);
  return msg->SerializeAsString();
}

// Puts the payloads back into the parsed skeleton.
v1::Snapshot Reassemble(const std::string& skeleton,
                        const std::vector<TensorDataRange>& ranges) {
  v1::Snapshot out;
  EXPECT_TRUE(out.ParseFromString(skeleton));
  for (const TensorDataRange& r : ranges) {
    v1::Tensor* t = MutableSnapshotTensor(&out, r.path);
    EXPECT_NE(t, nullptr) << r.path;
    if (t != nullptr) t->set_data(r.bytes.data(), r.bytes.size());
  }
  return out;
}

TEST(TensorDataTest, SkeletonPlusRangesIsTheMessageAndRangesPointIntoIt) {
  v1::Snapshot original;
  const std::string wire = Serialized(3, &original);
  std::string skeleton;
  std::vector<TensorDataRange> ranges;
  ASSERT_TRUE(SplitSnapshotTensorData(wire, &skeleton, &ranges).ok());
  EXPECT_TRUE(
      MessageDifferencer::Equals(Reassemble(skeleton, ranges), original));
  // Every present tensor's payload is a range of the input, not a copy.
  size_t tensors = 0;
  size_t data_bytes = 0;
  for (absl::string_view path : SnapshotTensorPaths()) {
    const v1::Tensor* t = FindSnapshotTensor(original, path);
    if (t == nullptr || t->data().empty()) continue;
    ++tensors;
    data_bytes += t->data().size();
  }
  ASSERT_EQ(ranges.size(), tensors);
  for (const TensorDataRange& r : ranges) {
    EXPECT_GE(r.bytes.data(), wire.data()) << r.path;
    EXPECT_LE(r.bytes.data() + r.bytes.size(), wire.data() + wire.size());
  }
  EXPECT_LT(skeleton.size(), wire.size() - data_bytes + 64 * tensors);
}

TEST(TensorDataTest, RepeatedDataFieldsAndUnknownFieldsFollowProtobuf) {
  v1::Snapshot original;
  std::string wire = Serialized(4, &original);
  // A second q message on the wire: protobuf merges it into the first, its
  // data (last occurrence) winning. Then an unknown field number 999.
  v1::Snapshot extra;
  extra.mutable_q()->set_data("later bytes");
  wire += extra.SerializeAsString();
  wire += std::string(
      "\xba\x3e\x03"
      "abc",
      6);  // field 999, 3 bytes
  v1::Snapshot want;
  ASSERT_TRUE(want.ParseFromString(wire));
  std::string skeleton;
  std::vector<TensorDataRange> ranges;
  ASSERT_TRUE(SplitSnapshotTensorData(wire, &skeleton, &ranges).ok());
  const v1::Snapshot got = Reassemble(skeleton, ranges);
  EXPECT_TRUE(MessageDifferencer::Equals(got, want));
  EXPECT_EQ(got.q().data(), "later bytes");
  EXPECT_EQ(got.GetReflection()->GetUnknownFields(got).field_count(), 1);
}

TEST(TensorDataTest, MalformedMessagesAreRejected) {
  v1::Snapshot original;
  const std::string wire = Serialized(5, &original);
  std::string skeleton;
  std::vector<TensorDataRange> ranges;
  for (size_t cut : {size_t{1}, wire.size() / 3, wire.size() - 1}) {
    const std::string prefix = wire.substr(0, cut);
    v1::Snapshot parsed;
    if (parsed.ParseFromString(prefix)) continue;  // a field boundary
    EXPECT_FALSE(SplitSnapshotTensorData(prefix, &skeleton, &ranges).ok())
        << "cut at " << cut;
  }
  // A length prefix past the end, inside a nested message.
  const std::string bad(
      "\x0a\x05\x1a\x7f"
      "ab",
      6);  // q { data: len 127 }
  EXPECT_FALSE(SplitSnapshotTensorData(bad, &skeleton, &ranges).ok());
  // A stray end-group tag.
  EXPECT_FALSE(
      SplitSnapshotTensorData(std::string("\x0c", 1), &skeleton, &ranges).ok());
}

}  // namespace
}  // namespace attnaudit
