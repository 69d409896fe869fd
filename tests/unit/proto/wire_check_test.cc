// DescribeParseFailure names the field and byte where an encoding breaks,
// and flags nothing protobuf accepts: every corrupt buffer below is first
// checked to be refused by protobuf itself (the oracle).
#include "proto/codec/wire_check.h"

#include <random>
#include <string>

#include "attnaudit/v1/service.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::SubmitRequest Request() {
  v1::SubmitRequest r;
  v1::Tensor* q = r.mutable_snapshot()->mutable_q();
  q->set_dtype(v1::DTYPE_F32);
  q->add_shape(1);
  q->add_shape(64);
  q->set_data(std::string(256, 'x'));
  v1::Tensor* k = r.mutable_snapshot()->mutable_k_pages();
  k->set_dtype(v1::DTYPE_F16);
  k->add_shape(2);
  k->set_data(std::string(64, 'y'));
  r.mutable_snapshot()->mutable_labels()->set_model("llama");
  r.set_idempotency_key("key-1");
  return r;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

absl::Status Describe(const std::string& bytes) {
  v1::SubmitRequest probe;
  EXPECT_FALSE(probe.ParseFromString(bytes)) << "protobuf accepts it";
  return DescribeParseFailure(*v1::SubmitRequest::descriptor(), bytes,
                              "request");
}

TEST(WireCheckTest, CutOffTensorIsNamedAtTheDeepestField) {
  const std::string bytes = Request().SerializeAsString();
  const absl::Status s = Describe(bytes.substr(0, 100));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), StartsWith("snapshot.q.data: cannot decode: the "
                                 "field declares 256 bytes but"));
  EXPECT_THAT(Msg(s), HasSubstr("of the attnaudit.v1.SubmitRequest"));
}

TEST(WireCheckTest, InvalidUtf8InAStringFieldIsNamed) {
  v1::GetResultRequest r;
  r.set_job_id("abc");
  std::string bytes = r.SerializeAsString();
  bytes[3] = '\xff';
  v1::GetResultRequest probe;
  ASSERT_FALSE(probe.ParseFromString(bytes));
  const absl::Status s = DescribeParseFailure(
      *v1::GetResultRequest::descriptor(), bytes, "request");
  EXPECT_THAT(Msg(s),
              StartsWith("job_id: cannot decode: a string field that is not "
                         "valid UTF-8 (byte 0"));
  // Labels deep inside the snapshot too.
  v1::SubmitRequest sub = Request();
  sub.mutable_snapshot()->mutable_labels()->set_model("ll\xc3");
  std::string raw;
  sub.SerializePartialToString(&raw);  // does not check UTF-8
  EXPECT_THAT(Msg(Describe(raw)), StartsWith("snapshot.labels.model:"));
}

TEST(WireCheckTest, BadTagsWireTypesAndGroups) {
  // Field 0, wire type 7, a lone end-group, an unterminated group, a varint
  // of 11 bytes.
  EXPECT_THAT(Msg(Describe(std::string("\x00\x01", 2))),
              StartsWith("request: cannot decode: invalid field number 0 "
                         "(byte 0"));
  EXPECT_THAT(Msg(Describe("\x0f")), HasSubstr("invalid wire type 7"));
  EXPECT_THAT(Msg(Describe("\x0c")),
              HasSubstr("an end-group tag without its start"));
  EXPECT_THAT(Msg(Describe("\x4b\x50\x01")),
              HasSubstr("a group without its end-group tag"));
  EXPECT_THAT(
      Msg(Describe(std::string("\x18") + std::string(10, '\xff') + "\x01")),
      StartsWith("priority: cannot decode: a varint cut off or longer"));
  EXPECT_THAT(Msg(Describe("\x29\x01\x02")),
              HasSubstr("a 64-bit field with only 2 bytes left"));
}

// Found by snapshot_fuzz: protobuf reads a tag of up to 5 bytes and keeps
// its low 32 bits, so a tag whose full value names a field above 2^29 - 1
// is still accepted. The walk must not be stricter than protobuf.
TEST(WireCheckTest, TagsAreRead32BitsWideAsProtobufDoes) {
  const std::string bytes("\x08\x5d\x80\xff\x90\xaf\x3f\xe2\xca\x0a", 10);
  v1::Snapshot msg;
  ASSERT_TRUE(msg.ParseFromString(bytes));
  EXPECT_TRUE(CheckWireFormat(*v1::Snapshot::descriptor(), bytes).ok())
      << CheckWireFormat(*v1::Snapshot::descriptor(), bytes);
  // Six bytes are too many for a tag, for protobuf too.
  const std::string six("\x80\x80\x80\x80\x80\x01\x00", 7);
  ASSERT_FALSE(msg.ParseFromString(six));
  EXPECT_THAT(Msg(CheckWireFormat(*v1::Snapshot::descriptor(), six)),
              HasSubstr("longer than 5 bytes"));
}

TEST(WireCheckTest, RepeatedMessagesAreIndexed) {
  v1::AuditStreamMessage m;
  v1::AuditStreamHeader* h = m.mutable_header();
  h->add_manifest()->set_field_path("q");
  h->add_manifest()->set_field_path("k_pages");
  std::string raw;
  h->mutable_manifest(1)->set_field_path("k\xe0");
  m.SerializePartialToString(&raw);
  v1::AuditStreamMessage probe;
  ASSERT_FALSE(probe.ParseFromString(raw));
  EXPECT_THAT(Msg(DescribeParseFailure(*v1::AuditStreamMessage::descriptor(),
                                       raw, "request")),
              StartsWith("header.manifest[1].field_path:"));
}

// No false alarms, and never OK after a failure: random corruptions of a
// valid request (the fuzz target wire_check_fuzz explores further).
TEST(WireCheckTest, AgreesWithProtobufOnRandomCorruptions) {
  const std::string good = Request().SerializeAsString();
  std::mt19937 rng(12345);
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 3) {
        case 0:
          bytes[rng() % bytes.size()] = static_cast<char>(rng());
          break;
        case 1:
          bytes.resize(rng() % (bytes.size() + 1));
          break;
        default:
          bytes.insert(rng() % (bytes.size() + 1), 1, static_cast<char>(rng()));
      }
      if (bytes.empty()) bytes = "\x08";
    }
    v1::SubmitRequest probe;
    if (probe.ParseFromString(bytes)) {
      // What protobuf accepts, the walk accepts.
      EXPECT_TRUE(CheckWireFormat(*v1::SubmitRequest::descriptor(), bytes).ok())
          << CheckWireFormat(*v1::SubmitRequest::descriptor(), bytes);
      continue;
    }
    ++refused;
    const absl::Status s = DescribeParseFailure(
        *v1::SubmitRequest::descriptor(), bytes, "request");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(s), HasSubstr("cannot decode"));
  }
  EXPECT_GT(refused, 500);
}

TEST(WireCheckTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));          // cut off
  EXPECT_FALSE(IsValidUtf8("\x80"));
}

}  // namespace
}  // namespace attnaudit
