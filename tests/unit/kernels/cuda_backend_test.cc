// The CUDA backend on a GPU (kernels/cuda_backend.h), against the CPU
// backend: R within 1e-12 relative, P within its replay tolerance (and
// how many outputs have the CPU's bits printed) and bitwise reproducible,
// the split-KV, multi-run-stage pass and the one-block, one-run pass with the
// same P, unit states and CP replays
// (CUDA-local ring and partials, every world size) that fold back to the GPU's
// own P bit for bit, the drift reduction against core/drift, the pool fallback,
// and a whole audit. Without a visible GPU every GPU test skips with the
// driver's one-line reason; the error path of Create runs everywhere.
#include "kernels/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/attention/merge.h"
#include "core/attention/unit_states.h"
#include "core/audit/audit.h"
#include "core/backend/backend.h"
#include "core/backend/fallback_backend.h"
#include "core/cp/replay/combine.h"
#include "core/cp/replay/replay.h"
#include "core/cp/schedule/schedule.h"
#include "core/drift/drift.h"
#include "core/tensor/dtype.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "kernels/attention_kernels.h"
#include "sim/simulator.h"
#include "tests/unit/core/testing/prepared_case.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

// The GPU shared by the tests of this binary (created once: a context and
// a pool per test would dominate the run).
CudaBackend* Gpu() {
  static CudaBackend* gpu = [] {
    CudaBackendOptions o;
    o.pool_bytes = int64_t{2} << 30;
    absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Create(o);
    return b.ok() ? b->release() : nullptr;
  }();
  return gpu;
}

// The same GPU without split-KV: one block per (row, KV head, chunk).
CudaBackend* OneBlockGpu() {
  static CudaBackend* gpu = [] {
    CudaBackendOptions o;
    o.pool_bytes = int64_t{1} << 30;
    o.max_splits = 1;
    o.max_stage_runs = 1;
    absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Create(o);
    return b.ok() ? b->release() : nullptr;
  }();
  return gpu;
}

#define REQUIRE_GPU()                                                     \
  do {                                                                    \
    absl::StatusOr<std::vector<CudaDeviceInfo>> gpus = ListCudaDevices(); \
    if (!gpus.ok()) GTEST_SKIP() << gpus.status().message();              \
    ASSERT_NE(Gpu(), nullptr) << "cuda:0 did not initialise";             \
  } while (0)

TEST(CudaBackendTest, CreateFailsWithAStatusNotACrash) {
  CudaBackendOptions o;
  o.device = 1023;
  absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Create(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
}

struct Case {
  std::string name;
  DType kv;
  int64_t head_dim;
  int64_t page_size;
  KvLayout layout;
  int64_t window;
  double softcap;
  bool sinks;
  int64_t world;  // token-interleaved CP ranks (1: none)
};

std::vector<Case> Cases() {
  return {
      {"bf16 nhd", DType::kBF16, 128, 16, KvLayout::kNHD, 0, 0, false, 1},
      {"f16 hnd window sinks", DType::kF16, 64, 16, KvLayout::kHND, 40, 0, true,
       1},
      {"f32 softcap", DType::kF32, 64, 8, KvLayout::kNHD, 0, 30.0, false, 1},
      {"fp8 e4m3 scales", DType::kF8E4M3, 128, 16, KvLayout::kHND, 0, 0, false,
       1},
      {"f64 odd dim", DType::kF64, 20, 4, KvLayout::kNHD, 0, 0, false, 1},
      {"bf16 token-interleaved", DType::kBF16, 64, 16, KvLayout::kNHD, 0, 0,
       false, 3},
  };
}

// The case's snapshot; spare_pages: pages no row references.
std::unique_ptr<Prepared> PrepareCase(const Case& k, int64_t spare_pages = 0) {
  RandomCaseOptions o;
  o.batch = 3;
  o.queries = 2;
  o.q_heads = 16;
  o.kv_heads = 4;
  o.head_dim = k.head_dim;
  o.seq_lens = {300, 77, 129};
  o.max_gap = 1;
  o.spread_queries = true;
  o.kv_dtype = k.kv;
  o.seed = 9;
  LogicalCase c = RandomCase(o);
  c.sliding_window = k.window;
  c.softcap = k.softcap;
  if (k.sinks) c.sinks.assign(16, 0.5f);
  PagingOptions paging;
  paging.page_size = k.page_size;
  paging.layout = k.layout;
  paging.permute_pages = true;
  paging.spare_pages = spare_pages;
  if (k.world > 1) {
    paging.sharding = CpSharding::kTokenInterleaved;
    paging.cp_world_size = k.world;
    paging.interleave_size = 1;
  }
  return Prepare(c, paging);
}

// R's contract between two backends (or two passes): every value within
// 1e-12 relative (absolute below 1).
void ExpectReferenceWithinContract(const std::vector<double>& got,
                                   const std::vector<double>& want,
                                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-12 * std::max(1.0, std::fabs(want[i])))
        << what << " " << i;
  }
}

double HalfUlpAt(double x, DType dtype) {
  return 0.5 * DTypeEpsilon(dtype) * std::max(std::fabs(x), 1e-30);
}

TEST(CudaBackendTest, RAndPAgreeWithTheCpuAndPIsReproducible) {
  REQUIRE_GPU();
  for (const Case& k : Cases()) {
    std::unique_ptr<Prepared> prep = PrepareCase(k);
    AttentionRunOptions ro;
    ro.threads = 2;
    absl::StatusOr<AttentionResults> cpu = ComputeAttention(prep->p, ro);
    absl::StatusOr<AttentionResults> gpu = Gpu()->ComputeAttention(prep->p, ro);
    absl::StatusOr<AttentionResults> again =
        Gpu()->ComputeAttention(prep->p, ro);
    ASSERT_TRUE(cpu.ok() && gpu.ok() && again.ok()) << k.name;
    ExpectReferenceWithinContract(gpu->reference_out, cpu->reference_out,
                                  k.name + " R out");
    ExpectReferenceWithinContract(gpu->reference_lse, cpu->reference_lse,
                                  k.name + " R lse");
    // P: the device's exp/log/tanh may move a weight by an ulp; the result
    // stays within a few fp32 roundings of the CPU's, then one rounding
    // to the output dtype.
    const DType out_dtype = prep->p.output_dtype;
    for (size_t i = 0; i < cpu->replay_out.size(); ++i) {
      const double want = cpu->replay_out[i];
      ASSERT_NEAR(gpu->replay_out[i], want,
                  2 * HalfUlpAt(want, out_dtype) + 1e-5 * (1 + std::fabs(want)))
          << k.name << " P out " << i;
    }
    for (size_t i = 0; i < cpu->replay_lse.size(); ++i) {
      ASSERT_NEAR(gpu->replay_lse[i], cpu->replay_lse[i],
                  1e-5 * (1 + std::fabs(cpu->replay_lse[i])))
          << k.name << " P lse " << i;
    }
    // How often the GPU's P has the CPU's very bits (the device check's
    // table reports it; the contract allows the ulp above).
    int64_t same = 0;
    for (size_t i = 0; i < cpu->replay_out.size(); ++i) {
      same += std::memcmp(&cpu->replay_out[i], &gpu->replay_out[i],
                          sizeof(double)) == 0;
    }
    std::printf("[ P bits ] %s: %lld of %zu outputs equal the CPU's bits\n",
                k.name.c_str(), static_cast<long long>(same),
                cpu->replay_out.size());
    EXPECT_EQ(0, std::memcmp(gpu->replay_out.data(), again->replay_out.data(),
                             gpu->replay_out.size() * sizeof(double)))
        << k.name << ": P is not reproducible";
    EXPECT_EQ(gpu->merge_orders, cpu->merge_orders) << k.name;
    EXPECT_FALSE(gpu->kv_non_finite) << k.name;
  }
}

// A GQA group too large for one block's shared memory (256 query heads on
// one KV head at D = 128) runs on the GPU in tiles of heads, not on the
// CPU: the CPU's P bits, R within the contract.
TEST(CudaBackendTest, AGroupTooLargeForOneBlockIsTiled) {
  REQUIRE_GPU();
  RandomCaseOptions o;
  o.batch = 2;
  o.queries = 1;
  o.q_heads = 256;
  o.kv_heads = 1;
  o.head_dim = 128;
  o.seq_lens = {70, 33};
  o.kv_dtype = DType::kBF16;
  o.seed = 4;
  PagingOptions paging;
  paging.page_size = 16;
  paging.permute_pages = true;
  std::unique_ptr<Prepared> prep = Prepare(RandomCase(o), paging);
  AttentionRunOptions ro;
  ro.threads = 2;
  absl::StatusOr<AttentionResults> cpu = ComputeAttention(prep->p, ro);
  absl::StatusOr<AttentionResults> gpu = Gpu()->ComputeAttention(prep->p, ro);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_GT(Gpu()->last_timings().head_tiles, 1);
  EXPECT_EQ(0, std::memcmp(gpu->replay_out.data(), cpu->replay_out.data(),
                           cpu->replay_out.size() * sizeof(double)))
      << "P out";
  ExpectReferenceWithinContract(gpu->reference_out, cpu->reference_out,
                                "R out");
}

// The split-KV pass with several runs a stage (the cases' few rows always
// split; their pages are small) and the one-block pass a run at a time:
// the same P bits, R within the contract.
TEST(CudaBackendTest, SplitKvAndTheOneBlockPassGiveTheSameP) {
  REQUIRE_GPU();
  ASSERT_NE(OneBlockGpu(), nullptr);
  for (const Case& k : Cases()) {
    std::unique_ptr<Prepared> prep = PrepareCase(k);
    AttentionRunOptions ro;
    absl::StatusOr<AttentionResults> split =
        Gpu()->ComputeAttention(prep->p, ro);
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_GT(Gpu()->last_timings().splits, 1) << k.name;
    absl::StatusOr<AttentionResults> one =
        OneBlockGpu()->ComputeAttention(prep->p, ro);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(OneBlockGpu()->last_timings().splits, 1) << k.name;
    EXPECT_EQ(OneBlockGpu()->last_timings().stage_runs, 1) << k.name;
    if (k.page_size <= cuda_internal::kPassStageTokens / 2) {
      EXPECT_GT(Gpu()->last_timings().stage_runs, 1) << k.name;
    }
    EXPECT_EQ(0, std::memcmp(split->replay_out.data(), one->replay_out.data(),
                             one->replay_out.size() * sizeof(double)))
        << k.name << ": P out";
    EXPECT_EQ(0, std::memcmp(split->replay_lse.data(), one->replay_lse.data(),
                             one->replay_lse.size() * sizeof(double)))
        << k.name << ": P lse";
    ExpectReferenceWithinContract(split->reference_out, one->reference_out,
                                  k.name + " R out");
  }
}

// The GPU's unit states fold (host MergeInto, ascending) to the GPU's P,
// and every CP replay on the GPU -- ring and partials, every world size --
// gives those states back bit for bit.
TEST(CudaBackendTest, UnitStatesAndCpReplaysRebuildTheGpuP) {
  REQUIRE_GPU();
  for (const Case& k : Cases()) {
    std::unique_ptr<Prepared> prep = PrepareCase(k);
    const PreparedAttention& p = prep->p;
    UnitStates states;
    AttentionRunOptions ro;
    ro.unit_states = &states;
    absl::StatusOr<AttentionResults> gpu = Gpu()->ComputeAttention(p, ro);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    for (int64_t world : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}}) {
      if (k.world > 1 && world != k.world) continue;
      for (CpReplayStrategy strategy :
           {CpReplayStrategy::kRing, CpReplayStrategy::kPartials}) {
        const CpShards shards = PlanShards(p.units, world, p.dims.page_size);
        const CpSchedule schedule(shards, strategy, p.dims.kv_heads,
                                  CpTokenBytes(p), int64_t{1} << 20);
        absl::StatusOr<CpReplayRun> run =
            Gpu()->ReplayCp(p, schedule, CpReplayOptions{});
        ASSERT_TRUE(run.ok())
            << k.name << " W=" << world << ": " << run.status();
        const std::string what = absl::StrCat(k.name, " W=", world, " ",
                                              CpReplayStrategyName(strategy));
        EXPECT_EQ(0, std::memcmp(run->states.p_lse.data(), states.p_lse.data(),
                                 states.p_lse.size() * sizeof(float)))
            << what;
        EXPECT_EQ(0, std::memcmp(run->states.p_out.data(), states.p_out.data(),
                                 states.p_out.size() * sizeof(float)))
            << what;
        const CpCombined det = CombineDeterministic(p, run->states, 2);
        EXPECT_EQ(0, std::memcmp(det.out.data(), gpu->replay_out.data(),
                                 det.out.size() * sizeof(double)))
            << what << ": the deterministic combine is not the GPU's P";
      }
    }
  }
}

// A replay whose GPU uploads only its ranks' pages (the gang's shard path,
// forced on one GPU) into a compact copy: the pool has pages no row
// references and its pages are permuted, so the copy is not the pool; the
// states are the whole-pool replay's, bit for bit.
TEST(CudaBackendTest, AShardUploadReplaysAsTheWholePool) {
  REQUIRE_GPU();
  CudaBackendOptions o;
  o.pool_bytes = int64_t{1} << 30;
  o.shard_uploads = true;
  absl::StatusOr<std::unique_ptr<CudaBackend>> sharded = CudaBackend::Create(o);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  for (const Case& k : Cases()) {
    std::unique_ptr<Prepared> prep = PrepareCase(k, /*spare_pages=*/5);
    const PreparedAttention& p = prep->p;
    for (int64_t world : {int64_t{2}, int64_t{3}}) {
      if (k.world > 1 && world != k.world) continue;
      const CpShards shards = PlanShards(p.units, world, p.dims.page_size);
      const CpSchedule schedule(shards, CpReplayStrategy::kRing,
                                p.dims.kv_heads, CpTokenBytes(p),
                                int64_t{1} << 20);
      absl::StatusOr<CpReplayRun> whole =
          Gpu()->ReplayCp(p, schedule, CpReplayOptions{});
      ASSERT_TRUE(whole.ok()) << whole.status();
      absl::StatusOr<CpReplayRun> shard =
          (*sharded)->ReplayCp(p, schedule, CpReplayOptions{});
      ASSERT_TRUE(shard.ok()) << shard.status();
      const std::string what = absl::StrCat(k.name, " W=", world);
      EXPECT_EQ(
          0, std::memcmp(shard->states.p_out.data(), whole->states.p_out.data(),
                         whole->states.p_out.size() * sizeof(float)))
          << what;
      EXPECT_EQ(
          0, std::memcmp(shard->states.p_lse.data(), whole->states.p_lse.data(),
                         whole->states.p_lse.size() * sizeof(float)))
          << what;
    }
  }
}

TEST(CudaBackendTest, DriftOnTheDeviceIsTheCoresStatistics) {
  REQUIRE_GPU();
  std::mt19937_64 rng(5);
  std::normal_distribution<double> n(0.0, 1.0);
  std::uniform_real_distribution<double> exponent(-300.0, 300.0);
  // The second shape has more elements than the largest grid has threads
  // (1024 blocks of 256), and |diff|s over the whole double range, so
  // every digit of the p99's radix select decides.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{8, 2, 32, 128},
        std::vector<int64_t>{40, 2, 32, 128}}) {
    const bool wide = shape[0] == 40;
    std::vector<double> c(shape[0] * shape[1] * shape[2] * shape[3]);
    std::vector<double> r(c.size());
    for (size_t i = 0; i < c.size(); ++i) {
      r[i] = n(rng);
      const double scale = wide ? std::pow(10.0, exponent(rng)) : 1e-4;
      c[i] = i % 7 == 0 ? r[i] : r[i] + scale * n(rng);
    }
    c[3] = std::numeric_limits<double>::quiet_NaN();
    r[5] = std::numeric_limits<double>::infinity();
    c[c.size() - 9] = r[c.size() - 9] + 1e301;  // ties for the worst
    c[c.size() / 2] = r[c.size() / 2] + 1e301;
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      DriftOptions o;
      o.ulp_dtype = dt;
      o.tolerance = 2e-4;
      absl::StatusOr<DriftStats> want =
          ComputeDrift({c.data(), shape}, {r.data(), shape}, o);
      absl::StatusOr<DriftStats> got =
          Gpu()->ComputeDrift({c.data(), shape}, {r.data(), shape}, o);
      ASSERT_TRUE(want.ok() && got.ok()) << got.status();
      const std::string what = absl::StrCat(c.size(), " ", DTypeName(dt));
      EXPECT_EQ(got->count, want->count) << what;
      EXPECT_EQ(got->over_tolerance, want->over_tolerance) << what;
      EXPECT_EQ(got->max_abs, want->max_abs) << what;
      EXPECT_EQ(got->p99_abs, want->p99_abs) << what;
      EXPECT_EQ(got->max_rel, want->max_rel) << what;
      EXPECT_EQ(got->max_ulp, want->max_ulp) << what;
      EXPECT_EQ(got->nonfinite_mismatch, want->nonfinite_mismatch) << what;
      EXPECT_EQ(got->worst.batch, want->worst.batch) << what;
      EXPECT_EQ(got->worst.dim, want->worst.dim) << what;
      EXPECT_EQ(got->worst.head, want->worst.head) << what;
      EXPECT_EQ(got->first_nonfinite_mismatch.dim,
                want->first_nonfinite_mismatch.dim)
          << what;
      for (auto [mine, core] : {std::pair{got->mean_abs, want->mean_abs},
                                std::pair{got->rms, want->rms},
                                std::pair{got->mean_ulp, want->mean_ulp}}) {
        if (std::isinf(core)) {
          EXPECT_EQ(mine, core) << what;
        } else {
          EXPECT_NEAR(mine, core, 1e-12 * core) << what;
        }
      }
    }
  }
}

TEST(CudaBackendTest, AWholeAuditRunsOnTheGpuAndTooBigFallsBackToTheCpu) {
  REQUIRE_GPU();
  SynthOptions so;
  so.batch = 2;
  so.context = 512;
  so.cp_world_size = 4;
  so.cp_sharding = CpSharding::kTokenInterleaved;
  absl::StatusOr<Snapshot> sim = Synthesize(so);
  ASSERT_TRUE(sim.ok()) << sim.status();
  AuditOptions options;
  options.backend = Gpu();
  options.cp_strategy = CpStrategy::kRing;
  absl::StatusOr<AuditReport> report = RunAudit(*sim, options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->verdict, Verdict::kPass);
  EXPECT_EQ(report->provenance.backend, "cuda:0");
  EXPECT_TRUE(report->cp.present);
  EXPECT_TRUE(report->cp.deterministic_matches_replay);

  CudaBackendOptions small;
  small.pool_bytes = 1 << 20;  // far below the snapshot
  absl::StatusOr<std::unique_ptr<CudaBackend>> tiny =
      CudaBackend::Create(small);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  options.backend = tiny->get();
  report = RunAudit(*sim, options);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kResourceExhausted);
  FallbackBackend fallback(**tiny, CpuBackendInstance());
  options.backend = &fallback;
  report = RunAudit(*sim, options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->verdict, Verdict::kPass);
  EXPECT_EQ(report->provenance.backend, "cpu");
  EXPECT_TRUE(fallback.fell_back());
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
