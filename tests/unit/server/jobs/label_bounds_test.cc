// Label values are bounded in length (with the truncation marker) and
// charset before anything behind the RPC layer sees them.
#include "server/jobs/label_bounds.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

TEST(LabelBoundsTest, ShortPlainValuesPassUnchanged) {
  for (std::string v : {std::string(""), std::string("meta-llama/Llama-3.1-8B"),
                        std::string("vllm 0.6.3"), std::string("a:b@c+d=e#f~g"),
                        std::string(kMaxLabelBytes, 'x')}) {
    const std::string before = v;
    EXPECT_FALSE(BoundLabelValue(&v));
    EXPECT_EQ(v, before);
  }
}

TEST(LabelBoundsTest, OtherCharactersBecomeUnderscores) {
  std::string v =
      "a\"b\\c\nd\x01"
      "e\xc3\xa9{f}";
  EXPECT_FALSE(BoundLabelValue(&v));
  EXPECT_EQ(v, "a_b_c_d_e___f_");
}

TEST(LabelBoundsTest, LongValuesAreCutAndMarked) {
  std::string v(1 << 20, 'm');
  EXPECT_TRUE(BoundLabelValue(&v));
  EXPECT_EQ(v.size(), kMaxLabelBytes);
  EXPECT_TRUE(absl::EndsWith(v, kTruncationMarker));
  EXPECT_EQ(v.substr(0, kMaxLabelBytes - kTruncationMarker.size()),
            std::string(kMaxLabelBytes - kTruncationMarker.size(), 'm'));
  std::string one_over(kMaxLabelBytes + 1, 'q');
  EXPECT_TRUE(BoundLabelValue(&one_over));
  EXPECT_EQ(one_over.size(), kMaxLabelBytes);
  // Bounding is idempotent: a bounded value stays as it is.
  std::string again = v;
  EXPECT_FALSE(BoundLabelValue(&again));
  EXPECT_EQ(again, v);
}

TEST(LabelBoundsTest, EveryStringLabelIsBoundedAndCounted) {
  Labels l;
  l.model = std::string(100, 'a');
  l.engine = "vllm";
  l.backend = std::string(65, 'b');
  l.request_ids = {"r1", std::string(70, 'r'), std::string(200, 's')};
  l.layer = 3;
  const LabelTruncations t = BoundLabels(&l);
  EXPECT_TRUE(t.model);
  EXPECT_FALSE(t.engine);
  EXPECT_TRUE(t.backend);
  EXPECT_EQ(t.request_ids, 2);
  EXPECT_EQ(t.total(), 4);
  EXPECT_EQ(l.request_ids[0], "r1");
  for (const std::string& v : {l.model, l.backend, l.request_ids[1]}) {
    EXPECT_LE(v.size(), kMaxLabelBytes);
  }
  EXPECT_EQ(l.layer, 3);
}

}  // namespace
}  // namespace attnaudit::server
