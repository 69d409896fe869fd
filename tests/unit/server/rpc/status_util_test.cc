// absl -> gRPC status conversion keeps the code number and the message.
#include "server/rpc/status_util.h"

#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

TEST(StatusUtilTest, EveryCodeMapsToTheSameGrpcCode) {
  const std::pair<absl::StatusCode, grpc::StatusCode> pairs[] = {
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded,
       grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kResourceExhausted,
       grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition,
       grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& [a, g] : pairs) {
    const grpc::Status s = ToGrpcStatus(absl::Status(a, "field: why"));
    EXPECT_EQ(s.error_code(), g);
    EXPECT_EQ(s.error_message(), "field: why");
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(StatusUtilTest, PrefixMakesFieldPathsAbsolute) {
  EXPECT_EQ(PrefixStatus("snapshot.", absl::InvalidArgumentError("q: bad")),
            absl::InvalidArgumentError("snapshot.q: bad"));
  EXPECT_TRUE(PrefixStatus("snapshot.", absl::OkStatus()).ok());
}

}  // namespace
}  // namespace attnaudit::server
