// The GPU attention kernels' own source (kernels/attention_device.inc) run
// on the CPU under the SIMT emulator, with the CUDA backend's own plan
// (tests/unit/kernels/host_pass.h), against the CPU core (ComputeAttention):
// P and every P unit state with the core's bits for every launch shape the
// backend picks (split-KV, several runs a stage, query chunks, head tiles),
// R with the core's bits in the one-block pass and within the contract
// (1e-12) when split, R's unit states with the core's bits. A GPU runs the
// same text; what it adds is its exp/log library and timing
// (docs/NUMERICS.md, "CPU and GPU"), which the GPU tests check on a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/attention/attention.h"
#include "core/attention/unit_states.h"
#include "core/tensor/dtype.h"
#include "gtest/gtest.h"
#include "kernels/pass_plan.h"
#include "tests/unit/core/testing/prepared_case.h"
#include "tests/unit/core/testing/snapshot_builder.h"
#include "tests/unit/kernels/host_pass.h"

namespace attnaudit {
namespace testing {
namespace {

template <typename V>
void ExpectSameBits(const V& got, const V& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(want[i])))
        << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  }
}

// R's contract between two passes: within 1e-12 relative (absolute below
// 1).
void ExpectWithinContract(const std::vector<double>& got,
                          const std::vector<double>& want,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-12 * std::max(1.0, std::fabs(want[i])))
        << what << " " << i;
  }
}

struct PassCase {
  std::string name;
  DType kv;
  int64_t head_dim;
  int64_t page_size;
  KvLayout layout;
  int64_t window;
  double softcap;
  bool sinks;
  CpSharding sharding;
  int64_t q_heads = 8;  // of 2 KV heads
};

std::vector<PassCase> PassCases() {
  return {
      {"f32 nhd", DType::kF32, 32, 4, KvLayout::kNHD, 0, 0, false,
       CpSharding::kNone},
      {"bf16 hnd window", DType::kBF16, 64, 8, KvLayout::kHND, 9, 0, false,
       CpSharding::kNone},
      {"f16 softcap sinks", DType::kF16, 32, 4, KvLayout::kNHD, 0, 30.0, true,
       CpSharding::kNone},
      {"fp8 scales tail dim", DType::kF8E4M3, 20, 4, KvLayout::kHND, 0, 0,
       false, CpSharding::kNone},
      {"f64", DType::kF64, 24, 3, KvLayout::kNHD, 0, 0, true,
       CpSharding::kNone},
      {"token-interleaved units", DType::kBF16, 32, 4, KvLayout::kNHD, 0, 0,
       false, CpSharding::kTokenInterleaved},
      {"bf16 pages of 16", DType::kBF16, 128, 16, KvLayout::kNHD, 0, 0, false,
       CpSharding::kNone},
  };
}

std::unique_ptr<Prepared> PreparePassCase(const PassCase& pc) {
  RandomCaseOptions o;
  o.batch = 2;
  o.queries = 2;
  o.q_heads = pc.q_heads;
  o.kv_heads = 2;
  o.head_dim = pc.head_dim;
  o.seq_lens = {37, 13};
  o.max_gap = 1;
  o.spread_queries = true;
  o.kv_dtype = pc.kv;
  o.seed = 5;
  LogicalCase c = RandomCase(o);
  c.sliding_window = pc.window;
  c.softcap = pc.softcap;
  if (pc.sinks) c.sinks.assign(static_cast<size_t>(pc.q_heads), 0.25f);
  PagingOptions paging;
  paging.page_size = pc.page_size;
  paging.layout = pc.layout;
  paging.permute_pages = true;
  if (pc.sharding != CpSharding::kNone) {
    paging.sharding = pc.sharding;
    paging.cp_world_size = 3;
    paging.interleave_size = 1;
  }
  return Prepare(c, paging);
}

// Both orders, so a missing barrier shows; the race test's build (under
// ThreadSanitizer, which sees unordered accesses in any order) runs one.
#if defined(__SANITIZE_THREAD__)
const simt::ThreadOrder kOrders[] = {simt::ThreadOrder::kFirstToLast};
constexpr int kCoreThreads = 1;  // the core's pool is not instrumented
#else
const simt::ThreadOrder kOrders[] = {simt::ThreadOrder::kFirstToLast,
                                     simt::ThreadOrder::kLastToFirst};
constexpr int kCoreThreads = 2;
#endif

struct CoreRun {
  AttentionResults results;
  UnitStates states;
};

std::unique_ptr<CoreRun> RunCore(const PreparedAttention& p) {
  auto run = std::make_unique<CoreRun>();
  run->states.has_reference = true;
  AttentionRunOptions ro;
  ro.threads = kCoreThreads;
  ro.unit_states = &run->states;
  absl::StatusOr<AttentionResults> core = ComputeAttention(p, ro);
  EXPECT_TRUE(core.ok()) << core.status();
  if (core.ok()) run->results = *std::move(core);
  return run;
}

std::string OrderName(simt::ThreadOrder order) {
  return order == simt::ThreadOrder::kFirstToLast ? "first to last"
                                                  : "last to first";
}

// The one-block pass a run at a time: every output and unit state with
// the core's bits (R too: its online softmax runs the core's blocks in the
// core's order), whichever thread of a block runs first.
TEST(AttentionDevice, TheOneBlockPassIsTheCorePassBitForBit) {
  for (const simt::ThreadOrder order : kOrders)
    for (const PassCase& case_in_order : PassCases()) {
      PassCase pc = case_in_order;
      pc.name += ", " + OrderName(order);
      HostPassOptions one;
      one.max_splits = 1;
      one.max_stage_runs = 1;
      one.record_merge_orders = true;
      one.order = order;
      std::unique_ptr<Prepared> prep = PreparePassCase(pc);
      std::unique_ptr<CoreRun> core = RunCore(prep->p);
      UnitStates states;
      states.has_reference = true;
      absl::StatusOr<HostPassRun> mine = RunPassOnHost(prep->p, &states, one);
      ASSERT_TRUE(mine.ok()) << pc.name << ": " << mine.status();
      EXPECT_EQ(mine->params.splits, 1) << pc.name;
      EXPECT_EQ(mine->params.runs_per_stage, 1) << pc.name;
      const AttentionResults& got = mine->results;
      const AttentionResults& want = core->results;
      ExpectSameBits(got.reference_out, want.reference_out, pc.name + " R out");
      ExpectSameBits(got.reference_lse, want.reference_lse, pc.name + " R lse");
      ExpectSameBits(got.replay_out, want.replay_out, pc.name + " P out");
      ExpectSameBits(got.replay_lse, want.replay_lse, pc.name + " P lse");
      EXPECT_EQ(got.merge_orders, want.merge_orders) << pc.name;
      EXPECT_FALSE(got.kv_non_finite) << pc.name;
      ExpectSameBits(states.p_out, core->states.p_out, pc.name + " P states");
      ExpectSameBits(states.p_lse, core->states.p_lse,
                     pc.name + " P state lse");
      ExpectSameBits(states.r_out, core->states.r_out, pc.name + " R states");
      ExpectSameBits(states.r_lse, core->states.r_lse,
                     pc.name + " R state lse");
    }
}

// The launch shapes the backend picks on an H200 (split-KV over the rows'
// runs, several runs a stage) and forced ones: P keeps the core's bits,
// R stays within the contract.
TEST(AttentionDevice, EveryLaunchShapeKeepsPsBits) {
  struct Shape {
    std::string name;
    int64_t max_splits;
    int64_t max_stage_runs;
    bool tree_every_level;
  };
  const std::vector<Shape> shapes = {
      {"the H200 plan", 0, 0, false},
      {"two splits", 2, 0, false},
      {"two runs a stage", 1, 2, false},
      {"the unit tree's every-level carry", 0, 0, true}};
  for (const PassCase& pc : PassCases()) {
    std::unique_ptr<Prepared> prep = PreparePassCase(pc);
    std::unique_ptr<CoreRun> core = RunCore(prep->p);
    for (const simt::ThreadOrder order : kOrders)
      for (const Shape& shape : shapes) {
        const std::string what =
            pc.name + ", " + shape.name + ", " + OrderName(order);
        HostPassOptions o;
        o.max_splits = shape.max_splits;
        o.max_stage_runs = shape.max_stage_runs;
        o.tree_every_level = shape.tree_every_level;
        o.order = order;
        absl::StatusOr<HostPassRun> mine = RunPassOnHost(prep->p, nullptr, o);
        ASSERT_TRUE(mine.ok()) << what << ": " << mine.status();
        if (shape.max_splits == 0) {
          EXPECT_GT(mine->params.splits, 1) << what;
          if (pc.page_size <= cuda_internal::kPassStageTokens / 2) {
            EXPECT_GT(mine->params.runs_per_stage, 1) << what;
          }
        }
        ExpectSameBits(mine->results.replay_out, core->results.replay_out,
                       what + " P out");
        ExpectSameBits(mine->results.replay_lse, core->results.replay_lse,
                       what + " P lse");
        ExpectWithinContract(mine->results.reference_out,
                             core->results.reference_out, what + " R out");
        ExpectWithinContract(mine->results.reference_lse,
                             core->results.reference_lse, what + " R lse");
      }
  }
}

// A GQA group too large for one block's shared memory runs in tiles of
// query heads, with the same bits; so do query positions cut into chunks.
TEST(AttentionDevice, HeadTilesAndQueryChunksKeepTheBits) {
  RandomCaseOptions o;
  o.batch = 2;
  o.queries = 3;
  o.q_heads = 64;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.seq_lens = {40, 23};
  o.max_gap = 1;
  o.spread_queries = true;
  o.kv_dtype = DType::kBF16;
  o.seed = 4;
  PagingOptions paging;
  paging.page_size = 8;
  paging.permute_pages = true;
  std::unique_ptr<Prepared> prep = Prepare(RandomCase(o), paging);
  std::unique_ptr<CoreRun> core = RunCore(prep->p);
  // 48 KB a block: one query position of the 32-head group does not fit.
  HostPassOptions small;
  small.max_shared = 48 * 1024;
  small.max_splits = 1;
  absl::StatusOr<HostPassRun> tiled = RunPassOnHost(prep->p, nullptr, small);
  ASSERT_TRUE(tiled.ok()) << tiled.status();
  EXPECT_GT(tiled->params.head_tiles, 1);
  EXPECT_EQ(tiled->params.queries_per_block, 1);
  ExpectSameBits(tiled->results.replay_out, core->results.replay_out,
                 "tiled P out");
  ExpectSameBits(tiled->results.reference_out, core->results.reference_out,
                 "tiled R out");
  // 80 KB: the group fits, not all three positions.
  HostPassOptions chunked;
  chunked.max_shared = 80 * 1024;
  absl::StatusOr<HostPassRun> chunks = RunPassOnHost(prep->p, nullptr, chunked);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_EQ(chunks->params.head_tiles, 1);
  EXPECT_LT(chunks->params.queries_per_block, 3);
  ExpectSameBits(chunks->results.replay_out, core->results.replay_out,
                 "chunked P out");
  ExpectWithinContract(chunks->results.reference_out,
                       core->results.reference_out, "chunked R out");
}

// Every specialised kernel (kSpecializedPasses: D = 128 and 64 in the
// usual cache dtypes, GQA groups of 4 and 8 at D = 128 in bf16) gives the
// core's P bits and the generic kernel's R bits; the most specific build
// runs, and a shape without one runs the generic kernel.
TEST(AttentionDevice, SpecialisedKernelsGiveTheGenericKernelsBits) {
  struct Shape {
    DType kv;
    int64_t head_dim;
    int64_t q_heads;  // of 2 KV heads
    std::string kernel;
  };
  const std::vector<Shape> shapes = {
      {DType::kBF16, 128, 8, "FusedPassKernel<128, bf16, 4>"},
      {DType::kBF16, 128, 16, "FusedPassKernel<128, bf16, 8>"},
      {DType::kBF16, 128, 4, "FusedPassKernel<128, bf16>"},
      {DType::kF16, 128, 8, "FusedPassKernel<128, f16>"},
      {DType::kF8E4M3, 128, 8, "FusedPassKernel<128, fp8 e4m3>"},
      {DType::kBF16, 64, 8, "FusedPassKernel<64, bf16>"},
      {DType::kF16, 64, 8, "FusedPassKernel<64, f16>"},
      {DType::kBF16, 32, 8, "FusedPassKernel"},
      {DType::kF32, 128, 8, "FusedPassKernel"}};
  for (const Shape& shape : shapes) {
    const std::string name = shape.kernel + " for D " +
                             std::to_string(shape.head_dim) + ", " +
                             std::to_string(shape.q_heads) + " query heads";
    PassCase pc = PassCases().back();  // pages of 16, no variant
    pc.kv = shape.kv;
    pc.head_dim = shape.head_dim;
    pc.q_heads = shape.q_heads;
    std::unique_ptr<Prepared> prep = PreparePassCase(pc);
    std::unique_ptr<CoreRun> core = RunCore(prep->p);
    HostPassOptions generic;
    generic.specialized = false;
    absl::StatusOr<HostPassRun> base = RunPassOnHost(prep->p, nullptr, generic);
    absl::StatusOr<HostPassRun> mine = RunPassOnHost(prep->p, nullptr);
    ASSERT_TRUE(base.ok()) << name << ": " << base.status();
    ASSERT_TRUE(mine.ok()) << name << ": " << mine.status();
    ASSERT_FALSE(mine->launches.empty());
    EXPECT_EQ(base->launches[0].kernel, "FusedPassKernel") << name;
    EXPECT_EQ(mine->launches[0].kernel, shape.kernel) << name;
    ExpectSameBits(mine->results.replay_out, core->results.replay_out,
                   name + " P out");
    ExpectSameBits(mine->results.replay_lse, core->results.replay_lse,
                   name + " P lse");
    ExpectSameBits(mine->results.reference_out, base->results.reference_out,
                   name + " R out");
    ExpectSameBits(mine->results.reference_lse, base->results.reference_lse,
                   name + " R lse");
  }
}

// The CP fill: each token's position and its K and V rows of every KV head
// land where the slot expects them.
TEST(AttentionDevice, TheGatherKernelCopiesEachTokensRowsAndPosition) {
  constexpr int64_t kHeads = 3;
  constexpr int64_t kRowBytes = 40;  // a row of 20 bf16 elements
  constexpr int64_t kHeadStride = 1000;
  std::vector<char> k(8 * kHeadStride * kHeads), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<char>(i * 7 + 1);
    v[i] = static_cast<char>(i * 13 + 5);
  }
  const std::vector<int64_t> positions = {100, 101, 102, 103, 104, 105};
  const int64_t token_bytes = 8 + 2 * kHeads * kRowBytes;
  std::vector<cuda_internal::GatherToken> tokens;
  for (int64_t t : {4, 1, 5}) {
    cuda_internal::GatherToken tok;
    const int64_t at = static_cast<int64_t>(tokens.size()) * token_bytes;
    tok.k_src = t * kRowBytes;
    tok.v_src = t * kRowBytes + 3;
    tok.pos_src = t;
    tok.pos_dst = at;
    tok.k_dst = at + 8;
    tok.v_dst = at + 8 + kHeads * kRowBytes;
    tokens.push_back(tok);
  }
  std::vector<char> slot(tokens.size() * token_bytes, 0);
  cuda_internal::GatherParams g;
  g.k_base = k.data();
  g.v_base = v.data();
  g.positions = positions.data();
  g.slot = slot.data();
  g.tokens = tokens.data();
  g.count = static_cast<int64_t>(tokens.size());
  g.kv_heads = kHeads;
  g.k_row_bytes = kRowBytes;
  g.v_row_bytes = kRowBytes;
  g.k_head_stride_bytes = kHeadStride;
  g.v_head_stride_bytes = kHeadStride;
  ASSERT_TRUE(RunGatherOnHost(g).ok());
  for (const cuda_internal::GatherToken& tok : tokens) {
    int64_t pos = 0;
    std::memcpy(&pos, slot.data() + tok.pos_dst, 8);
    EXPECT_EQ(pos, positions[tok.pos_src]);
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t i = 0; i < kRowBytes; ++i) {
        ASSERT_EQ(slot[tok.k_dst + h * kRowBytes + i],
                  k[tok.k_src + h * kHeadStride + i])
            << "K, head " << h << " byte " << i;
        ASSERT_EQ(slot[tok.v_dst + h * kRowBytes + i],
                  v[tok.v_src + h * kHeadStride + i])
            << "V, head " << h << " byte " << i;
      }
    }
  }
}

// A value that is not finite in the cache raises the pass's flag.
TEST(AttentionDevice, ANonFiniteCacheValueRaisesTheFlag) {
  const PassCase pc = PassCases()[0];  // f32: any bit pattern is storable
  std::unique_ptr<Prepared> prep = PreparePassCase(pc);
  // The first page any row reads.
  const int64_t page = prep->p.layout->block_pages[0][0];
  const SnapshotDims& d = prep->p.dims;
  float* v = static_cast<float*>(const_cast<void*>(prep->p.v_data));
  v[page * d.page_size * d.kv_heads * d.head_dim + 3] =
      std::numeric_limits<float>::infinity();
  absl::StatusOr<HostPassRun> mine = RunPassOnHost(prep->p, nullptr);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_TRUE(mine->results.kv_non_finite);
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
