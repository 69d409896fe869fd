// Every RoPE scaling type the wire can carry goes the whole path a new
// variant must be given (docs/EXTENDING.md, "A RoPE variant"): the codec
// decodes it and encodes it back to the same value, the RoPE table builds
// its frequencies, and the RoPE identity digest binds it apart from every
// other type. A value added to snapshot.proto and forgotten in one of those
// places fails here; the Python client's half is
// tests/python/test_builders.py (test_every_rope_scaling_type_...).
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "core/fingerprint/fingerprint.h"
#include "core/rope/rope.h"
#include "core/tensor/tensor.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"

namespace attnaudit {
namespace {

TEST(RopeScalingPathTest, EveryWireTypeDecodesBuildsATableAndIsBound) {
  const google::protobuf::EnumDescriptor* types =
      v1::RopeScalingType_descriptor();
  ASSERT_GE(types->value_count(), 4);
  std::set<std::string> digests;
  for (int i = 0; i < types->value_count(); ++i) {
    const int wire = types->value(i)->number();
    SCOPED_TRACE(types->value(i)->name());
    v1::Snapshot msg;
    v1::RopeScaling* scaling = msg.mutable_rope()->mutable_scaling();
    scaling->set_type(static_cast<v1::RopeScalingType>(wire));
    // Parameters every scaling type accepts; each type reads its own.
    scaling->set_factor(4.0);
    scaling->set_original_max_position(4096);
    scaling->set_sequence_length(8192);
    for (int f = 0; f < 64; ++f) {  // rotary_dim / 2 at head_dim 128
      scaling->add_short_factor(1.0 + 0.01 * f);
      scaling->add_long_factor(1.0 + 0.5 * f);
    }
    msg.mutable_rope()->set_theta(10000.0);

    absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&msg);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    v1::Snapshot again;
    SnapshotToProto(*decoded, &again);
    EXPECT_EQ(again.rope().scaling().type(), wire);

    absl::StatusOr<RopeTable> table = RopeTable::Create(decoded->rope, 128);
    ASSERT_TRUE(table.ok()) << table.status();
    // The digest binds positions too; any consistent ones will do.
    decoded->query_positions = Tensor(DType::kI64, {1, 1});
    decoded->slot_positions = Tensor(DType::kI64, {1, 4});
    const std::string digest = RopeIdentityFingerprint(*decoded);
    ASSERT_EQ(digest.size(), 64u);
    digests.insert(digest);
  }
  // Distinct digests: no two types share a fingerprint text, so none falls
  // through to another's.
  EXPECT_EQ(digests.size(), static_cast<size_t>(types->value_count()));
}

}  // namespace
}  // namespace attnaudit
