// Unit states (core/attention/unit_states.h): what the CP replays and the
// diagnosis rebuild P from. Folding the stored P states in ascending unit
// order with the shared merge routine must give P bit for bit; R's unit
// states must merge (here in long double, independently) to R; and a
// rank's run of tokens copied into a buffer of another layout must give the
// very same states as the pool.
#include "core/attention/unit_states.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/attention/merge.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/prepared_case.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

LogicalCase Case(DType kv, uint64_t seed) {
  RandomCaseOptions o;
  o.batch = 2;
  o.queries = 2;
  o.q_heads = 8;
  o.kv_heads = 2;
  o.head_dim = 32;
  o.seq_lens = {53, 20};
  o.max_gap = 1;
  o.position_offset = 100;
  o.spread_queries = true;
  o.kv_dtype = kv;
  o.seed = seed;
  LogicalCase c = RandomCase(o);
  c.sinks.assign(8, 0.5f);
  return c;
}

PagingOptions Paging(int64_t world, int64_t interleave) {
  PagingOptions p;
  p.page_size = 8;
  p.permute_pages = true;
  if (world > 1) {
    p.sharding = CpSharding::kTokenInterleaved;
    p.cp_world_size = world;
    p.interleave_size = interleave;
  }
  return p;
}

// Points run at tokens gathered [token][Hkv][D] (NHD) into k_buf/v_buf,
// with their positions.
void PointAtGathered(const std::string& k_buf, const std::string& v_buf,
                     const std::vector<int64_t>& positions, DType kv,
                     const SnapshotDims& d, TokenRun* run) {
  run->k_data = k_buf.data();
  run->v_data = v_buf.data();
  run->k_dtype = run->v_dtype = kv;
  run->k_row_stride = run->v_row_stride = d.kv_heads * d.head_dim;
  run->k_head_stride = run->v_head_stride = d.head_dim;
  run->positions = positions.data();
  run->n = static_cast<int64_t>(positions.size());
}

// P's merge order read recursively (core/attention/merge_tree.h): node
// (lo, size) merges (lo, size / 2) into (lo + size / 2, size / 2) with
// MergeInto; an empty (lse -inf) or absent child gives the other. False
// when the node is empty.
bool TreeNode(const UnitStates& st, int64_t b, int64_t sq, int64_t h,
              int64_t units, int64_t D, int64_t lo, int64_t size,
              std::vector<float>* out, float* lse) {
  if (lo >= units) return false;
  if (size == 1) {
    const int64_t i = st.Index(b, lo, sq, h);
    if (st.p_lse[i] == -std::numeric_limits<float>::infinity()) return false;
    out->assign(&st.p_out[i * D], &st.p_out[i * D] + D);
    *lse = st.p_lse[i];
    return true;
  }
  std::vector<float> right;
  float right_lse = 0;
  const bool has_left =
      TreeNode(st, b, sq, h, units, D, lo, size / 2, out, lse);
  const bool has_right = TreeNode(st, b, sq, h, units, D, lo + size / 2,
                                  size / 2, &right, &right_lse);
  if (!has_right) return has_left;
  if (!has_left) {
    *out = right;
    *lse = right_lse;
    return true;
  }
  MergeInto(out->data(), lse, right.data(), right_lse, D);
  return true;
}

TEST(UnitStatesTest, MergingThePStatesInTheUnitTreeIsPBitForBit) {
  for (int64_t world : {1, 3}) {
    const auto prep = Prepare(Case(DType::kBF16, 5), Paging(world, 2));
    const PreparedAttention& p = prep->p;
    UnitStates states;
    states.has_reference = true;
    AttentionRunOptions o;
    o.unit_states = &states;
    absl::StatusOr<AttentionResults> res = ComputeAttention(p, o);
    ASSERT_TRUE(res.ok()) << res.status();
    const SnapshotDims& d = p.dims;
    const int64_t D = d.head_dim;
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t sq = 0; sq < d.queries; ++sq) {
        for (int64_t h = 0; h < d.q_heads; ++h) {
          std::vector<float> acc;
          float lse = 0;
          const int64_t units = static_cast<int64_t>(p.units[b].size());
          int64_t size = 1;
          while (size < units) size *= 2;
          if (!TreeNode(states, b, sq, h, units, D, 0, size, &acc, &lse)) {
            acc.assign(static_cast<size_t>(D), 0.0f);
            lse = -std::numeric_limits<float>::infinity();
          }
          long double m = -INFINITY, l = 0;
          std::vector<long double> r_acc(static_cast<size_t>(D), 0);
          for (size_t u = 0; u < p.units[b].size(); ++u) {
            const int64_t i = states.Index(b, static_cast<int64_t>(u), sq, h);
            if (states.p_lse[i] == -std::numeric_limits<float>::infinity()) {
              continue;
            }
            // R: an independent long-double LSE merge.
            const long double li = states.r_lse[i];
            const long double mn = std::max(m, li);
            const long double a = std::exp(m - mn), w = std::exp(li - mn);
            for (int64_t k = 0; k < D; ++k) {
              r_acc[k] = r_acc[k] * a + w * states.r_out[i * D + k];
            }
            l = l * a + w;
            m = mn;
          }
          std::vector<double> out(static_cast<size_t>(D));
          double out_lse = 0;
          FinishReplayState(p, h, acc.data(), lse, out.data(), &out_lse);
          const int64_t qi = (b * d.queries + sq) * d.q_heads + h;
          const std::string at =
              absl::StrCat("world ", world, " b", b, " s", sq, " h", h);
          EXPECT_EQ(std::memcmp(out.data(), &res->replay_out[qi * D],
                                D * sizeof(double)),
                    0)
              << at;
          EXPECT_EQ(out_lse, res->replay_lse[qi]) << at;
          // R over keys (sinks excluded) against R's output with the sink:
          // compare the key-only LSE by removing nothing -- the snapshot's
          // engine LSE excludes sinks, so R.lse is over keys.
          EXPECT_NEAR(static_cast<double>(m + std::log(l)),
                      res->reference_lse[qi], 1e-12)
              << at;
        }
      }
    }
  }
}

// A CP rank works on the tokens it holds, received into its own buffer:
// the states must not depend on where the rows live.
TEST(UnitStatesTest, ARunCopiedIntoAnotherLayoutGivesTheSameStates) {
  for (DType kv : {DType::kBF16, DType::kF32, DType::kF8E4M3}) {
    const auto prep = Prepare(Case(kv, 9), Paging(2, 1));
    const PreparedAttention& p = prep->p;
    UnitStates want;
    want.has_reference = true;
    AttentionRunOptions o;
    o.unit_states = &want;
    ASSERT_TRUE(ComputeAttention(p, o).ok());
    UnitStates got;
    got.Reset(p.units, p.dims, true);
    const SnapshotDims& d = p.dims;
    const int64_t D = d.head_dim;
    const int64_t elem = DTypeSize(kv);
    for (int64_t b = 0; b < d.batch; ++b) {
      // Rank 0's tokens of each block, gathered [token][Hkv][D] (HND pages
      // in the pool would be laid out differently: the run says how).
      for (size_t blk = 0; blk < prep->layout.block_pages[b].size(); ++blk) {
        const int64_t page = prep->layout.block_pages[b][blk];
        TokenRun run;
        std::string k_buf, v_buf;
        std::vector<int64_t> positions;
        for (int32_t u = p.block_unit_begin[b][blk];
             u < p.block_unit_begin[b][blk + 1]; ++u) {
          const KvUnit& unit = p.units[b][u];
          if (unit.rank != 0) continue;
          run.unit_of.push_back(u);
          run.first.push_back(static_cast<int32_t>(positions.size()));
          run.count.push_back(unit.count);
          for (int32_t t = unit.first; t < unit.first + unit.count; ++t) {
            const int64_t slot = page * d.page_size + t;
            positions.push_back(prep->snapshot.slot_positions.IntAt(slot));
            const int64_t row = slot * d.kv_heads * D * elem;  // NHD pool
            k_buf.append(prep->snapshot.k_pages.bytes().data() + row,
                         d.kv_heads * D * elem);
            v_buf.append(prep->snapshot.v_pages.bytes().data() + row,
                         d.kv_heads * D * elem);
          }
        }
        if (positions.empty()) continue;
        PointAtGathered(k_buf, v_buf, positions, kv, d, &run);
        ASSERT_TRUE(ComputeRunStates(p, run, b, 0, d.kv_heads, &got).ok());
      }
    }
    // Every rank-0 state equals the pool's; the others stay empty.
    for (int64_t b = 0; b < d.batch; ++b) {
      for (size_t u = 0; u < p.units[b].size(); ++u) {
        for (int64_t sq = 0; sq < d.queries; ++sq) {
          for (int64_t h = 0; h < d.q_heads; ++h) {
            const int64_t i = want.Index(b, static_cast<int64_t>(u), sq, h);
            if (p.units[b][u].rank != 0) {
              EXPECT_EQ(got.p_lse[i], -std::numeric_limits<float>::infinity());
              continue;
            }
            EXPECT_EQ(got.p_lse[i], want.p_lse[i]);
            EXPECT_EQ(got.r_lse[i], want.r_lse[i]);
            EXPECT_EQ(std::memcmp(&got.p_out[i * D], &want.p_out[i * D],
                                  D * sizeof(float)),
                      0);
            EXPECT_EQ(std::memcmp(&got.r_out[i * D], &want.r_out[i * D],
                                  D * sizeof(double)),
                      0);
          }
        }
      }
    }
  }
}

// The kernels step through the rows of consecutive visible keys and go
// through the index list otherwise. Validated snapshots only ever give
// consecutive ones (positions rise along a row), so here each page's first
// half is run twice: as it is, and with an invisible decoy token (a
// position past every query, large finite K/V) after each real one, so the
// visible keys are every other token. Every state must come out bit for
// bit the same.
TEST(UnitStatesTest, InvisibleTokensBetweenVisibleOnesChangeNoState) {
  for (DType kv : {DType::kBF16, DType::kF32}) {
    const auto prep = Prepare(Case(kv, 21), Paging(1, 1));
    const PreparedAttention& p = prep->p;
    const SnapshotDims& d = p.dims;
    const int64_t D = d.head_dim;
    const int64_t row_bytes = d.kv_heads * D * DTypeSize(kv);
    std::string decoy;
    for (int64_t i = 0; i < d.kv_heads * D; ++i) {
      const uint32_t f32 = 0x42800000u;  // 64.0f: it would dominate if seen
      const uint16_t bf16 = 0x4280;
      if (kv == DType::kBF16) {
        decoy.append(reinterpret_cast<const char*>(&bf16), 2);
      } else {
        decoy.append(reinterpret_cast<const char*>(&f32), 4);
      }
    }
    const int64_t invisible = std::numeric_limits<int64_t>::max() / 2;
    UnitStates plain, decoyed;
    plain.Reset(p.units, p.dims, true);
    decoyed.Reset(p.units, p.dims, true);
    for (int64_t b = 0; b < d.batch; ++b) {
      for (size_t blk = 0; blk < prep->layout.block_pages[b].size(); ++blk) {
        const int64_t page = prep->layout.block_pages[b][blk];
        for (bool with_decoys : {false, true}) {
          TokenRun run;
          std::string k_buf, v_buf;
          std::vector<int64_t> positions;
          int64_t room = d.page_size / 2;  // real tokens that fit twice over
          for (int32_t u = p.block_unit_begin[b][blk];
               u < p.block_unit_begin[b][blk + 1] && room > 0; ++u) {
            const KvUnit& unit = p.units[b][u];
            const int32_t take =
                static_cast<int32_t>(std::min<int64_t>(unit.count, room));
            room -= take;
            run.unit_of.push_back(u);
            run.first.push_back(static_cast<int32_t>(positions.size()));
            run.count.push_back(with_decoys ? 2 * take : take);
            for (int32_t t = unit.first; t < unit.first + take; ++t) {
              const int64_t slot = page * d.page_size + t;
              const int64_t row = slot * row_bytes;  // NHD pool
              positions.push_back(prep->snapshot.slot_positions.IntAt(slot));
              k_buf.append(prep->snapshot.k_pages.bytes().data() + row,
                           row_bytes);
              v_buf.append(prep->snapshot.v_pages.bytes().data() + row,
                           row_bytes);
              if (!with_decoys) continue;
              positions.push_back(invisible);
              k_buf.append(decoy);
              v_buf.append(decoy);
            }
          }
          PointAtGathered(k_buf, v_buf, positions, kv, d, &run);
          ASSERT_TRUE(ComputeRunStates(p, run, b, 0, d.kv_heads,
                                       with_decoys ? &decoyed : &plain)
                          .ok());
        }
      }
    }
    int64_t seen = 0;
    for (size_t i = 0; i < plain.p_lse.size(); ++i) {
      const std::string at = absl::StrCat(DTypeName(kv), " state ", i);
      EXPECT_EQ(decoyed.p_lse[i], plain.p_lse[i]) << at;
      EXPECT_EQ(decoyed.r_lse[i], plain.r_lse[i]) << at;
      EXPECT_EQ(std::memcmp(&decoyed.p_out[i * D], &plain.p_out[i * D],
                            D * sizeof(float)),
                0)
          << at;
      EXPECT_EQ(std::memcmp(&decoyed.r_out[i * D], &plain.r_out[i * D],
                            D * sizeof(double)),
                0)
          << at;
      seen += plain.p_lse[i] != -std::numeric_limits<float>::infinity();
    }
    EXPECT_GT(seen, 100) << DTypeName(kv);
  }
}

// ComputeAttention sizes the states without filling them and every work
// item clears its own rows and heads: states left over from an earlier
// call (NaN here) must never survive, and a state no query sees is empty
// (lse -inf, out 0) in P and R alike, whatever the thread count.
TEST(UnitStatesTest, EveryStateIsWrittenAndUnseenOnesAreEmpty) {
  for (int threads : {1, 2, 3}) {
    const auto prep = Prepare(Case(DType::kBF16, 13), Paging(3, 2));
    const PreparedAttention& p = prep->p;
    UnitStates states;
    states.Reset(p.units, p.dims, true);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::fill(states.p_out.begin(), states.p_out.end(),
              static_cast<float>(nan));
    std::fill(states.p_lse.begin(), states.p_lse.end(),
              static_cast<float>(nan));
    std::fill(states.r_out.begin(), states.r_out.end(), nan);
    std::fill(states.r_lse.begin(), states.r_lse.end(), nan);
    AttentionRunOptions o;
    o.threads = threads;
    o.unit_states = &states;
    ASSERT_TRUE(ComputeAttention(p, o).ok());
    const int64_t D = p.dims.head_dim;
    int64_t empty = 0;
    int64_t seen = 0;
    for (size_t i = 0; i < states.p_lse.size(); ++i) {
      const std::string at = absl::StrCat("threads ", threads, " state ", i);
      ASSERT_FALSE(std::isnan(states.p_lse[i])) << at;
      ASSERT_FALSE(std::isnan(states.r_lse[i])) << at;
      const bool unseen =
          states.p_lse[i] == -std::numeric_limits<float>::infinity();
      EXPECT_EQ(unseen,
                states.r_lse[i] == -std::numeric_limits<double>::infinity())
          << at;
      for (int64_t k = 0; k < D; ++k) {
        ASSERT_TRUE(std::isfinite(states.p_out[i * D + k])) << at;
        ASSERT_TRUE(std::isfinite(states.r_out[i * D + k])) << at;
        if (unseen) {
          EXPECT_EQ(states.p_out[i * D + k], 0.0f) << at;
          EXPECT_EQ(states.r_out[i * D + k], 0.0) << at;
        }
      }
      ++(unseen ? empty : seen);
    }
    // The case has both kinds (queries spread over the context).
    EXPECT_GT(empty, 0);
    EXPECT_GT(seen, 0);
  }
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
