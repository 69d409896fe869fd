// WriteAligned: protobuf's parser reads its output as the message itself,
// every tensor payload starts at an aligned offset whatever comes before
// it, and AlignedByteSize is exactly what is written.
#include "proto/codec/aligned_writer.h"

#include <string>
#include <vector>

#include "attnaudit/v1/snapshot.pb.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "proto/codec/tensor_data.h"
#include "tests/unit/proto/codec_test_util.h"

namespace attnaudit {
namespace {

using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;
using google::protobuf::util::MessageDifferencer;

// Writes `msg` after `prefix` bytes of something else, so that the output
// starts at every offset modulo the alignment across the cases.
std::string WriteAfter(const google::protobuf::Message& msg, size_t prefix) {
  std::string out(prefix, 'x');
  {
    StringOutputStream stream(&out);
    CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    // StringOutputStream appends; the coded stream counts from zero, so
    // offsets are measured from its own start (the prefix is only there to
    // move the buffer's own alignment).
    EXPECT_TRUE(WriteAligned(msg, &coded));
  }
  return out.substr(prefix);
}

TEST(AlignedWriterTest, ParsesAsTheSameMessageWithAlignedPayloads) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    v1::Snapshot msg;
    SnapshotToProto(testing::FullSnapshot(seed), &msg);
    msg.mutable_labels()->set_model(std::string(seed * 7, 'm'));
    const std::string bytes = WriteAfter(msg, seed);
    EXPECT_EQ(bytes.size(), AlignedByteSize(msg));

    v1::Snapshot parsed;
    ASSERT_TRUE(parsed.ParseFromString(bytes));
    MessageDifferencer diff;
    diff.IgnoreField(v1::Tensor::descriptor()->FindFieldByName("padding"));
    std::string why;
    diff.ReportDifferencesToString(&why);
    EXPECT_TRUE(diff.Compare(msg, parsed)) << why;

    std::string skeleton;
    std::vector<TensorDataRange> ranges;
    ASSERT_TRUE(SplitSnapshotTensorData(bytes, &skeleton, &ranges).ok());
    ASSERT_GT(ranges.size(), 3u);
    for (const TensorDataRange& r : ranges) {
      const size_t offset = static_cast<size_t>(r.bytes.data() - bytes.data());
      EXPECT_EQ(offset % kTensorDataAlignment, 0u) << r.path;
    }
  }
}

TEST(AlignedWriterTest, EmptyTensorsAndPlainMessagesAreUnchanged) {
  v1::Snapshot msg;
  msg.mutable_labels()->set_model("m");
  msg.mutable_q()->set_dtype(v1::DTYPE_BF16);  // present, no data
  msg.mutable_q()->add_shape(0);
  EXPECT_EQ(WriteAfter(msg, 0), msg.SerializeAsString());
}

}  // namespace
}  // namespace attnaudit
