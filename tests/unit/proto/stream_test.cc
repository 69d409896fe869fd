// The AuditStream protocol: header + chunks reassemble to the same snapshot
// for any chunk size; every protocol violation is rejected with its place.
#include "proto/codec/stream.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "tests/unit/proto/codec_test_util.h"

namespace attnaudit {
namespace {

using testing::ExpectSnapshotEq;
using testing::FullSnapshot;

constexpr int64_t kLimit = int64_t{1} << 30;

// Sends `snapshot` through header + chunks of `chunk_bytes` over the wire
// encoding and returns what the server decodes.
Snapshot RoundTrip(const Snapshot& snapshot, int64_t min_streamed,
                   int64_t chunk_bytes, int* chunks_sent) {
  v1::AuditStreamMessage header_msg;
  std::vector<const Tensor*> streamed = BuildAuditStreamHeader(
      snapshot, min_streamed, header_msg.mutable_header());
  AuditStreamChunker chunker(streamed, chunk_bytes);

  AuditStreamAssembler assembler(kLimit);
  v1::AuditStreamMessage received;
  EXPECT_TRUE(received.ParseFromString(header_msg.SerializeAsString()));
  EXPECT_TRUE(received.has_header());
  EXPECT_TRUE(assembler.Begin(received.mutable_header()).ok());
  EXPECT_EQ(assembler.bytes_expected(), chunker.total_bytes());

  v1::AuditStreamMessage chunk_msg;
  *chunks_sent = 0;
  while (chunker.Next(chunk_msg.mutable_chunk()->mutable_data())) {
    EXPECT_LE(static_cast<int64_t>(chunk_msg.chunk().data().size()),
              chunk_bytes);
    EXPECT_TRUE(received.ParseFromString(chunk_msg.SerializeAsString()));
    EXPECT_TRUE(assembler.Append(received.chunk().data()).ok());
    ++*chunks_sent;
  }
  EXPECT_TRUE(assembler.Finish().ok()) << assembler.Finish();
  absl::StatusOr<Snapshot> decoded =
      SnapshotFromProto(assembler.mutable_snapshot());
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  return decoded.ok() ? *std::move(decoded) : Snapshot();
}

TEST(AuditStreamTest, ReassemblesForAnyChunkSize) {
  const Snapshot original = FullSnapshot(21);
  for (int64_t chunk : {1, 7, 100, 383, 384, 385, 4096, 1 << 20}) {
    SCOPED_TRACE(chunk);
    int chunks = 0;
    ExpectSnapshotEq(original, RoundTrip(original, 128, chunk, &chunks));
    EXPECT_GT(chunks, 0);
  }
}

TEST(AuditStreamTest, ThresholdDecidesWhatIsStreamed) {
  const Snapshot original = FullSnapshot(22);
  v1::AuditStreamHeader header;
  std::vector<const Tensor*> streamed =
      BuildAuditStreamHeader(original, 300, &header);
  // Of the fixture's tensors only cp.rank_out (f32 [2,2,2,4,8], 1024 bytes)
  // and lm_head (bf16 [5,32], 320 bytes) reach 300 bytes; q (256) stays
  // inline.
  std::vector<std::string> paths;
  for (const v1::StreamedTensor& e : header.manifest()) {
    paths.push_back(e.field_path());
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"cp.rank_out", "lm_head"}));
  ASSERT_EQ(streamed.size(), 2u);
  EXPECT_EQ(streamed[0], &original.cp.rank_out);
  EXPECT_EQ(streamed[1], &original.lm_head);
  EXPECT_EQ(header.manifest(0).byte_length(), 1024);
  EXPECT_EQ(header.manifest(1).byte_length(), 320);
  EXPECT_TRUE(header.snapshot().cp().rank_out().data().empty());
  EXPECT_EQ(header.snapshot().cp().rank_out().shape_size(), 5);
  EXPECT_EQ(header.snapshot().q().data(), original.q.bytes());
  EXPECT_EQ(header.snapshot().labels().model(), "llama3-8b");

  int chunks = 0;
  ExpectSnapshotEq(original, RoundTrip(original, 300, 1000, &chunks));
  EXPECT_EQ(chunks, 2);  // 1344 bytes in chunks of 1000
}

TEST(AuditStreamTest, EmptyManifestNeedsNoChunk) {
  const Snapshot original = FullSnapshot(23);
  int chunks = 0;
  ExpectSnapshotEq(original,
                   RoundTrip(original, int64_t{1} << 40, 4096, &chunks));
  EXPECT_EQ(chunks, 0);
}

// A valid header for FullSnapshot with q and engine.out streamed.
v1::AuditStreamHeader ValidHeader() {
  v1::AuditStreamHeader header;
  SnapshotToProto(FullSnapshot(24), header.mutable_snapshot());
  header.mutable_snapshot()->mutable_q()->clear_data();
  header.mutable_snapshot()->mutable_engine()->mutable_out()->clear_data();
  v1::StreamedTensor* q = header.add_manifest();
  q->set_field_path("q");
  q->set_byte_length(2 * 2 * 4 * 8 * 2);
  v1::StreamedTensor* out = header.add_manifest();
  out->set_field_path("engine.out");
  out->set_byte_length(2 * 2 * 4 * 8 * 2);
  return header;
}

TEST(AuditStreamTest, RejectsBadHeaders) {
  struct Case {
    const char* prefix;
    void (*corrupt)(v1::AuditStreamHeader*);
    int64_t limit;
  };
  const Case cases[] = {
      {"header.manifest[1].field_path: \"rope\" is not a tensor",
       [](v1::AuditStreamHeader* h) {
         h->mutable_manifest(1)->set_field_path("rope");
       },
       kLimit},
      {"header.manifest[1].field_path: \"q\" is listed twice",
       [](v1::AuditStreamHeader* h) {
         h->mutable_manifest(1)->set_field_path("q");
       },
       kLimit},
      {"header.manifest[1]: snapshot.lm_head.data must be empty",
       [](v1::AuditStreamHeader* h) {
         h->mutable_manifest(1)->set_field_path("lm_head");
       },
       kLimit},
      {"header.manifest[0]: snapshot.q is not set",
       [](v1::AuditStreamHeader* h) { h->mutable_snapshot()->clear_q(); },
       kLimit},
      {"header.manifest[0].byte_length: 255 but snapshot.q holds 128 "
       "elements of 2 bytes = 256",
       [](v1::AuditStreamHeader* h) {
         h->mutable_manifest(0)->set_byte_length(255);
       },
       kLimit},
      {"header.manifest[0]: snapshot.q.dtype: unknown value 0",
       [](v1::AuditStreamHeader* h) {
         h->mutable_snapshot()->mutable_q()->set_dtype(v1::DTYPE_UNSPECIFIED);
       },
       kLimit},
      {"header.manifest[0]: snapshot.q.shape is negative",
       [](v1::AuditStreamHeader* h) {
         h->mutable_snapshot()->mutable_q()->set_shape(0, -2);
       },
       kLimit},
      {"header.manifest[0]: snapshot.q.shape is negative or larger",
       [](v1::AuditStreamHeader* h) {
         // 2^62 elements: must be refused before anything is reserved.
         h->mutable_snapshot()->mutable_q()->set_shape(0, int64_t{1} << 60);
         h->mutable_manifest(0)->set_byte_length(0);
       },
       kLimit},
      {"header.manifest: more than the limit of 300",
       [](v1::AuditStreamHeader*) {}, 300},
  };
  for (const Case& c : cases) {
    v1::AuditStreamHeader header = ValidHeader();
    c.corrupt(&header);
    AuditStreamAssembler assembler(c.limit);
    const absl::Status status = assembler.Begin(&header);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.prefix;
    EXPECT_TRUE(absl::StartsWith(status.message(), c.prefix))
        << "got: " << status.message() << "\nwant prefix: " << c.prefix;
    EXPECT_FALSE(assembler.begun());
  }
}

TEST(AuditStreamTest, RejectsProtocolViolations) {
  AuditStreamAssembler early(kLimit);
  EXPECT_TRUE(absl::StartsWith(early.Append("x").message(),
                               "chunk: received before the header"));
  EXPECT_EQ(early.Finish().message(), "stream ended before the header");

  AuditStreamAssembler assembler(kLimit);
  v1::AuditStreamHeader header = ValidHeader();
  ASSERT_TRUE(assembler.Begin(&header).ok());
  v1::AuditStreamHeader second = ValidHeader();
  EXPECT_TRUE(absl::StartsWith(assembler.Begin(&second).message(),
                               "header: a second header"));

  ASSERT_TRUE(assembler.Append(std::string(300, 'a')).ok());
  EXPECT_EQ(assembler.Finish().message(),
            "stream ended after 300 of 512 bytes");
  EXPECT_EQ(assembler.Append(std::string(213, 'b')).message(),
            "chunk: 513 bytes received, more than the 512 the manifest "
            "announced");
  ASSERT_TRUE(assembler.Append(std::string(212, 'b')).ok());
  EXPECT_TRUE(assembler.Finish().ok());
  // The bytes landed in manifest order: q gets 256 'a', engine.out 44 'a'
  // then 212 'b'.
  const v1::Snapshot& s = *assembler.mutable_snapshot();
  EXPECT_EQ(s.q().data(), std::string(256, 'a'));
  EXPECT_EQ(s.engine().out().data(),
            std::string(44, 'a') + std::string(212, 'b'));
}

}  // namespace
}  // namespace attnaudit
