// The merge tree (core/attention/merge_tree.h) against the definition read
// recursively -- node (lo, size) is the merge of (lo, size / 2) and
// (lo + size / 2, size / 2), an empty or absent child giving the other --
// with merge_step's element arithmetic, bit for bit, in every form the
// code takes: MergeTree fed every leaf, only the present ones, or through
// the fused Begin/End; ElementTree per element and four at a time; and the
// GPU's two phases (aligned subtrees, then a tree over their roots).
#include "core/attention/merge_tree.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/attention/merge_step.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace merge_tree {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct State {
  std::vector<float> out;
  float lse = kNegInf;
};

std::optional<State> MergeOf(const std::optional<State>& a,
                             const std::optional<State>& b) {
  if (!a) return b;
  if (!b) return a;
  const merge_step::PairWeights w = merge_step::Weights(a->lse, b->lse);
  State m;
  for (size_t i = 0; i < a->out.size(); ++i) {
    m.out.push_back(merge_step::Element(w, a->out[i], b->out[i]));
  }
  m.lse = merge_step::Lse(w);
  return m;
}

std::optional<State> Node(const std::vector<State>& leaves, int64_t lo,
                          int64_t size) {
  const int64_t n = static_cast<int64_t>(leaves.size());
  if (lo >= n) return std::nullopt;
  if (size == 1) {
    if (Empty(leaves[lo].lse)) return std::nullopt;
    return leaves[lo];
  }
  return MergeOf(Node(leaves, lo, size / 2),
                 Node(leaves, lo + size / 2, size / 2));
}

State Root(const std::vector<State>& leaves, int64_t d) {
  int64_t size = 1;
  while (size < static_cast<int64_t>(leaves.size())) size *= 2;
  std::optional<State> root = Node(leaves, 0, size);
  if (!root) return State{std::vector<float>(d, 0.0f), kNegInf};
  return *root;
}

std::vector<State> RandomLeaves(int64_t units, int64_t d, std::mt19937& rng) {
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::uniform_real_distribution<float> lse(-30.0f, 30.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<State> leaves(static_cast<size_t>(units));
  for (State& s : leaves) {
    s.out.resize(static_cast<size_t>(d));
    for (float& x : s.out) x = pick(rng) == 0 ? -0.0f : value(rng);
    const int kind = pick(rng);
    // Empties alone and in runs; now and then a lse far below the others,
    // whose weight is 0.
    s.lse = kind < 3 ? kNegInf : (kind == 3 ? -150.0f : lse(rng));
  }
  if (units > 8) {
    for (int64_t u = units / 3; u < units / 3 + units / 4; ++u) {
      leaves[u].lse = kNegInf;
    }
  }
  return leaves;
}

void ExpectSame(const State& want, const float* out, float lse, int64_t d,
                const std::string& what) {
  EXPECT_EQ(0, std::memcmp(&want.lse, &lse, sizeof lse)) << what << " lse";
  EXPECT_EQ(0, std::memcmp(want.out.data(), out, d * sizeof(float)))
      << what << " out";
}

TEST(MergeTreeTest, EveryFormIsTheRecursiveDefinition) {
  std::mt19937 rng(17);
  MergeTree tree;
  for (int64_t d : {int64_t{1}, int64_t{5}, int64_t{16}}) {
    for (int64_t units : {0, 1, 2, 3, 4, 5, 7, 8, 13, 64, 100, 257, 1000}) {
      const std::vector<State> leaves = RandomLeaves(units, d, rng);
      const State want = Root(leaves, d);
      const std::string what =
          std::to_string(units) + " units, d " + std::to_string(d);
      std::vector<float> out(static_cast<size_t>(d));
      float lse = 0;

      tree.Reset(d, units);
      for (int64_t u = 0; u < units; ++u) {
        tree.Add(u, leaves[u].out.data(), leaves[u].lse);
      }
      tree.Finish(out.data(), &lse);
      ExpectSame(want, out.data(), lse, d, what + ", every leaf");

      tree.Reset(d, units);
      for (int64_t u = 0; u < units; ++u) {
        if (!Empty(leaves[u].lse)) {
          tree.Add(u, leaves[u].out.data(), leaves[u].lse);
        }
      }
      tree.Finish(out.data(), &lse);
      ExpectSame(want, out.data(), lse, d, what + ", present leaves");

      // The CPU pass's fused form: the caller carries the leaf up.
      tree.Reset(d, units);
      for (int64_t u = 0; u < units; ++u) {
        const State& s = leaves[u];
        if (Empty(s.lse)) continue;
        std::vector<const float*> lefts(tree.Levels());
        std::vector<float> left_lse(tree.Levels());
        float* dest = nullptr;
        const int n = tree.PlanLeaf(u, lefts.data(), left_lse.data(), &dest);
        std::vector<float> x = s.out;
        float node_lse = s.lse;
        for (int k = 0; k < n; ++k) {
          const merge_step::PairWeights w =
              merge_step::Weights(left_lse[k], node_lse);
          for (int64_t i = 0; i < d; ++i) {
            x[i] = merge_step::Element(w, lefts[k][i], x[i]);
          }
          node_lse = merge_step::Lse(w);
        }
        for (int k = 0; k < n; ++k) ASSERT_NE(lefts[k], dest) << what;
        std::copy(x.begin(), x.end(), dest);
        tree.Commit(u, node_lse);
      }
      tree.Finish(out.data(), &lse);
      ExpectSame(want, out.data(), lse, d, what + ", fused");

      for (int64_t i = 0; i < d; ++i) {
        ElementTree<12> e;
        e.Reset();
        for (int64_t u = 0; u < units; ++u) {
          e.Add(u, leaves[u].out[i], leaves[u].lse);
        }
        float o = 0, l = 0;
        e.Finish(&o, &l);
        ASSERT_EQ(0, std::memcmp(&o, &want.out[i], sizeof o))
            << what << ", element " << i;
        ASSERT_EQ(0, std::memcmp(&l, &want.lse, sizeof l)) << what;
      }

      // Four adjacent elements in one tree (one weight per merge): each
      // has the one-element tree's bits; the last group may run past d.
      // The same walking every level (kEveryLevel).
      auto four_at_a_time = [&](auto tree, const std::string& how) {
        for (int64_t i = 0; i < d; i += 4) {
          tree.Reset();
          for (int64_t u = 0; u < units; ++u) {
            float four[4];
            for (int x = 0; x < 4; ++x) {
              four[x] = i + x < d ? leaves[u].out[i + x] : 0.0f;
            }
            tree.Add(u, four, leaves[u].lse);
          }
          float o[4];
          float l = 0;
          tree.Finish(o, &l);
          for (int x = 0; x < 4 && i + x < d; ++x) {
            ASSERT_EQ(0, std::memcmp(&o[x], &want.out[i + x], sizeof o[x]))
                << what << ", " << how << ", element " << i + x;
          }
          ASSERT_EQ(0, std::memcmp(&l, &want.lse, sizeof l)) << what;
        }
      };
      four_at_a_time(ElementTree<12, 4>(), "four at a time");
      four_at_a_time(ElementTree<12, 4, true>(), "every level");

      // The GPU's phases: roots of aligned blocks of 2^m leaves, then the
      // tree over the roots.
      for (int m : {0, 1, 3, 5}) {
        const int64_t block = int64_t{1} << m;
        for (int64_t i = 0; i < d; ++i) {
          ElementTree<12> top;
          top.Reset();
          for (int64_t j = 0; j * block < units; ++j) {
            ElementTree<12> sub;
            sub.Reset();
            for (int64_t u = j * block; u < units && u < (j + 1) * block; ++u) {
              sub.Add(u - j * block, leaves[u].out[i], leaves[u].lse);
            }
            float o = 0, l = 0;
            sub.Finish(&o, &l);
            top.Add(j, o, l);
          }
          float o = 0, l = 0;
          top.Finish(&o, &l);
          ASSERT_EQ(0, std::memcmp(&o, &want.out[i], sizeof o))
              << what << ", blocks of " << block << ", element " << i;
          ASSERT_EQ(0, std::memcmp(&l, &want.lse, sizeof l)) << what;
        }
      }
    }
  }
}

TEST(MergeTreeTest, LevelsCoverTheLargestIndex) {
  EXPECT_EQ(LevelsFor(0), 1);
  EXPECT_EQ(LevelsFor(1), 1);
  EXPECT_EQ(LevelsFor(2), 2);
  EXPECT_EQ(LevelsFor(3), 3);
  EXPECT_EQ(LevelsFor(4), 3);
  EXPECT_EQ(LevelsFor(5), 4);
  EXPECT_EQ(LevelsFor(8192), 14);
}

// A tree's rounding grows with its depth, log2 U, where a left fold's
// grows with U: merging U equal-lse states of the same out must give that
// out, and the tree's error at U = 4096 stays within a few ulps.
TEST(MergeTreeTest, EqualStatesMergeBackToThemselves) {
  for (int64_t units : {2, 3, 1000, 4096}) {
    std::vector<State> leaves(static_cast<size_t>(units),
                              State{{0.1f, -3.0f, 7.5f}, 1.25f});
    MergeTree tree;
    tree.Reset(3, units);
    for (int64_t u = 0; u < units; ++u)
      tree.Add(u, leaves[u].out.data(), 1.25f);
    float out[3];
    float lse = 0;
    tree.Finish(out, &lse);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(out[i], leaves[0].out[i], 4e-7f * std::fabs(leaves[0].out[i]))
          << units;
    }
    EXPECT_NEAR(lse, 1.25f + std::log(static_cast<float>(units)), 1e-5f)
        << units;
  }
}

}  // namespace
}  // namespace merge_tree
}  // namespace attnaudit
