// The zero-copy AuditStream framing: every chunk ByteBuffer must hold
// exactly the bytes the typed stub would have serialised, and point at the
// tensors' own memory rather than copies.
#include "client/lib/zero_copy_stream.h"

#include <string>
#include <vector>

#include "attnaudit/v1/service.pb.h"
#include "gtest/gtest.h"
#include "proto/codec/stream.h"

namespace attnaudit::client {
namespace {

std::string Bytes(const grpc::ByteBuffer& buffer,
                  std::vector<grpc::Slice>* slices) {
  EXPECT_TRUE(buffer.Dump(slices).ok());
  std::string out;
  for (const grpc::Slice& s : *slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

TEST(ZeroCopyStreamTest, ChunkFramingIsTheTypedMessageAcrossVarintSizes) {
  const std::string backing(3 << 20, 'x');
  for (size_t n : {size_t{1}, size_t{127}, size_t{128}, size_t{16383},
                   size_t{16384}, size_t{2} << 20}) {
    // Two pieces, as when a chunk spans two tensors.
    const std::vector<absl::string_view> pieces = {
        absl::string_view(backing.data(), n / 2),
        absl::string_view(backing.data() + n / 2, n - n / 2)};
    v1::AuditStreamMessage typed;
    typed.mutable_chunk()->set_data(backing.substr(0, n));
    std::vector<grpc::Slice> slices;
    EXPECT_EQ(Bytes(client_internal::ChunkMessage(pieces), &slices),
              typed.SerializeAsString())
        << n << " bytes";
    // The data bytes are the tensors' memory itself (gRPC may join the
    // adjacent pieces into one slice): every byte of data lies in backing.
    size_t in_backing = 0;
    for (const grpc::Slice& slice : slices) {
      const char* begin = reinterpret_cast<const char*>(slice.begin());
      if (begin >= backing.data() &&
          begin + slice.size() <= backing.data() + backing.size()) {
        in_backing += slice.size();
      }
    }
    EXPECT_EQ(in_backing, n) << n;
  }
}

TEST(ZeroCopyStreamTest, NextPiecesCutsTheSameChunksAsNext) {
  Tensor a(DType::kF32, {1000});
  Tensor b(DType::kBF16, {3, 777});
  for (size_t i = 0; i < a.bytes().size(); ++i) {
    (*a.mutable_bytes())[i] = static_cast<char>(i * 13);
  }
  for (size_t i = 0; i < b.bytes().size(); ++i) {
    (*b.mutable_bytes())[i] = static_cast<char>(i * 7 + 3);
  }
  for (int64_t chunk : {1, 100, 4000, 4662, 1 << 20}) {
    AuditStreamChunker copying({&a, &b}, chunk);
    AuditStreamChunker viewing({&a, &b}, chunk);
    std::string want;
    std::vector<absl::string_view> pieces;
    int chunks = 0;
    while (copying.Next(&want)) {
      ASSERT_TRUE(viewing.NextPieces(&pieces)) << chunk;
      std::string got;
      for (absl::string_view p : pieces) got.append(p.data(), p.size());
      EXPECT_EQ(got, want) << "chunk size " << chunk << ", chunk " << chunks;
      ++chunks;
    }
    EXPECT_FALSE(viewing.NextPieces(&pieces));
    EXPECT_TRUE(pieces.empty());
  }
}

}  // namespace
}  // namespace attnaudit::client
