// The tensor path table against the Snapshot descriptor (an independent
// enumeration by reflection) and against the core struct.
#include "proto/codec/tensor_paths.h"

#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "tests/unit/proto/codec_test_util.h"

namespace attnaudit {
namespace {

// Paths of every attnaudit.v1.Tensor field reachable from `d`.
void CollectTensorPaths(const google::protobuf::Descriptor* d,
                        const std::string& prefix, std::set<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE) continue;
    const google::protobuf::Descriptor* child = f->message_type();
    if (child == v1::Tensor::descriptor()) {
      out->insert(prefix + f->name());
    } else if (child->file() == d->file() ||
               child->file()->package() == "attnaudit.v1") {
      CollectTensorPaths(child, prefix + f->name() + ".", out);
    }
  }
}

TEST(TensorPathsTest, CoversEveryTensorFieldOfTheMessage) {
  std::set<std::string> expected;
  CollectTensorPaths(v1::Snapshot::descriptor(), "", &expected);
  const std::set<std::string> actual(SnapshotTensorPaths().begin(),
                                     SnapshotTensorPaths().end());
  EXPECT_EQ(actual, expected);
  EXPECT_EQ(SnapshotTensorPaths().size(), expected.size());  // no duplicates
}

TEST(TensorPathsTest, FindsAndCreatesMessageFields) {
  v1::Snapshot msg;
  EXPECT_EQ(FindSnapshotTensor(msg, "cp.rank_out"), nullptr);
  v1::Tensor* t = MutableSnapshotTensor(&msg, "cp.rank_out");
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(msg.has_cp());
  EXPECT_EQ(t, msg.mutable_cp()->mutable_rank_out());
  EXPECT_EQ(FindSnapshotTensor(msg, "cp.rank_out"), t);
  // The sibling stays unset.
  EXPECT_EQ(FindSnapshotTensor(msg, "cp.rank_lse"), nullptr);
  EXPECT_EQ(MutableSnapshotTensor(&msg, "cp"), nullptr);
  EXPECT_EQ(MutableSnapshotTensor(&msg, "nope"), nullptr);
  EXPECT_EQ(FindSnapshotTensor(msg, "rope"), nullptr);
}

TEST(TensorPathsTest, NamesTheCoreMembers) {
  Snapshot s = testing::FullSnapshot();
  EXPECT_EQ(MutableSnapshotTensor(&s, "q"), &s.q);
  EXPECT_EQ(MutableSnapshotTensor(&s, "engine.lse"), &s.engine.lse);
  EXPECT_EQ(MutableSnapshotTensor(&s, "cp.block_owners"), &s.cp.block_owners);
  EXPECT_EQ(FindSnapshotTensor(static_cast<const Snapshot&>(s), "lm_head"),
            &s.lm_head);
  EXPECT_EQ(FindSnapshotTensor(static_cast<const Snapshot&>(s), "x"), nullptr);
  // Every path reaches a distinct member.
  std::set<const Tensor*> members;
  for (absl::string_view path : SnapshotTensorPaths()) {
    members.insert(MutableSnapshotTensor(&s, path));
  }
  EXPECT_EQ(members.size(), SnapshotTensorPaths().size());
  EXPECT_EQ(members.count(nullptr), 0u);
}

}  // namespace
}  // namespace attnaudit
