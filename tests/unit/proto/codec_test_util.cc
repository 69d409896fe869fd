#include "tests/unit/proto/codec_test_util.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace attnaudit {
namespace testing {
namespace {

Tensor RandomTensor(std::mt19937* rng, DType dtype,
                    std::vector<int64_t> shape) {
  Tensor t(dtype, std::move(shape));
  std::string* bytes = t.mutable_bytes();
  for (char& c : *bytes) c = static_cast<char>((*rng)() & 0xff);
  return t;
}

}  // namespace

Snapshot FullSnapshot(uint32_t seed) {
  std::mt19937 rng(seed);
  Snapshot s;
  s.q = RandomTensor(&rng, DType::kBF16, {2, 2, 4, 8});
  s.k_pages = RandomTensor(&rng, DType::kF8E4M3, {3, 2, 4, 8});
  s.v_pages = RandomTensor(&rng, DType::kF8E4M3, {3, 2, 4, 8});
  s.kv_layout = KvLayout::kHND;
  s.k_scale = RandomTensor(&rng, DType::kF32, {2});
  s.v_scale = RandomTensor(&rng, DType::kF32, {2});
  s.page_ids = RandomTensor(&rng, DType::kI64, {3});
  s.block_table = RandomTensor(&rng, DType::kI32, {2, 2});
  s.kv_seq_lens = RandomTensor(&rng, DType::kI32, {2});
  s.query_positions = RandomTensor(&rng, DType::kI64, {2, 2});
  s.slot_positions = RandomTensor(&rng, DType::kI32, {3, 4});
  s.key_rope_positions = RandomTensor(&rng, DType::kI64, {3, 4});
  s.softmax_scale = 0.125;
  s.sliding_window = 4096;
  s.window_convention = SlidingWindowConvention::kFlashLeft;
  s.logit_softcap = 50.0;
  s.sinks = RandomTensor(&rng, DType::kF32, {4});
  s.engine_lse_includes_sinks = true;

  s.rope.q_state = RopeState::kPreRope;
  s.rope.k_state = RopeState::kPreRope;
  s.rope.style = RopeStyle::kGptj;
  s.rope.theta = 500000.0;
  s.rope.rotary_dim = 4;
  s.rope.scaling.type = RopeScalingType::kYarn;
  s.rope.scaling.factor = 8.0;
  s.rope.scaling.low_freq_factor = 2.0;
  s.rope.scaling.high_freq_factor = 6.0;
  s.rope.scaling.original_max_position = 4096;
  s.rope.scaling.beta_fast = 16.0;
  s.rope.scaling.beta_slow = 2.0;
  s.rope.scaling.attention_factor = 1.25;
  s.rope.scaling.truncate = false;
  s.rope.scaling.sequence_length = 12000;
  s.rope.scaling.short_factor = {1.0, 1.25};  // rotary_dim / 2
  s.rope.scaling.long_factor = {2.5, 40.0};
  s.rope.cast_point = RopeCastPoint::kEachOp;
  s.rope.q_output_dtype = DType::kBF16;
  s.rope.k_output_dtype = DType::kF16;
  s.output_dtype = DType::kF16;

  s.cp.world_size = 2;
  s.cp.sharding = CpSharding::kTokenInterleaved;
  s.cp.interleave_size = 16;
  s.cp.block_owners = RandomTensor(&rng, DType::kI32, {2, 2});
  s.cp.rank_out = RandomTensor(&rng, DType::kF32, {2, 2, 2, 4, 8});
  s.cp.rank_lse = RandomTensor(&rng, DType::kF32, {2, 2, 2, 4});

  s.engine.out = RandomTensor(&rng, DType::kF16, {2, 2, 4, 8});
  s.engine.lse = RandomTensor(&rng, DType::kF32, {2, 2, 4});
  s.engine.lse_base = LseBase::k2;
  s.engine.logprobs = RandomTensor(&rng, DType::kF64, {2, 2});
  s.precision.profile = EngineProfile::kHfEager;
  s.precision.score_dtype = DType::kBF16;
  s.precision.probability_dtype = DType::kF16;
  s.precision.exp_ulps = 3;
  s.precision.split_keys = 128;
  s.precision.score_rounding = Rounding::kNearestEven;
  s.precision.probability_rounding = Rounding::kTowardZero;
  s.precision.output_rounding = Rounding::kTowardZero;
  s.precision.rope_rounding = Rounding::kNearestEven;
  s.precision.source = PrecisionSource::kMeasured;
  s.precision.evidence = "probe: output truncated in 64 of 64 cases";
  s.pre_rope.q = RandomTensor(&rng, DType::kBF16, {2, 2, 4, 8});
  s.pre_rope.k = RandomTensor(&rng, DType::kBF16, {2, 2, 2, 8});
  s.rope_table.inv_freq = RandomTensor(&rng, DType::kF32, {2});
  s.rope_table.positions = RandomTensor(&rng, DType::kI64, {3});
  s.rope_table.cos = RandomTensor(&rng, DType::kF32, {3, 2});
  s.rope_table.sin = RandomTensor(&rng, DType::kBF16, {3, 2});

  s.selected_token_ids = RandomTensor(&rng, DType::kI64, {2, 2});
  s.lm_head = RandomTensor(&rng, DType::kBF16, {5, 32});
  s.active_mask = RandomTensor(&rng, DType::kBool, {2, 2});
  s.logprob_temperature = 0.7;

  s.prefix.enabled = true;
  s.prefix.key = "prefix-key-42";
  s.prefix.length = 3;
  s.prefix.fingerprint = std::string(64, 'a');
  s.prefix.scheme = PrefixCache::Scheme::kRlKernelCompat;

  s.labels.model = "llama3-8b";
  s.labels.layer = 17;
  s.labels.engine = "vllm";
  s.labels.backend = "flashinfer";
  s.labels.step = 123456;
  s.labels.request_ids = {"req-a", "req-b"};
  s.labels.run = "grpo-run-7";
  s.labels.role = SnapshotRole::kTrainer;
  s.labels.weight_version = "sync-12";
  return s;
}

namespace {

DriftStats Drift(double base) {
  DriftStats d;
  d.count = static_cast<int64_t>(base * 1000);
  d.max_abs = base;
  d.mean_abs = base / 2;
  d.rms = base / 3;
  d.max_rel = base * 7;
  d.p99_abs = base * 0.9;
  d.ulp_dtype = DType::kBF16;
  d.max_ulp = 12;
  d.mean_ulp = 0.5;
  d.tolerance = 1e-3;
  d.over_tolerance = 3;
  d.candidate_nan = 1;
  d.candidate_inf = 2;
  d.baseline_nan = 4;
  d.baseline_inf = 5;
  d.worst = Location{1, 0, 3, 7};
  d.worst_candidate = 0.25;
  d.worst_baseline = -0.5;
  return d;
}

}  // namespace

AuditReport FullReport() {
  AuditReport r;
  r.verdict = Verdict::kDrift;
  r.invalid_reason = "not invalid, but set";
  r.dims.batch = 2;
  r.dims.queries = 1;
  r.dims.q_heads = 32;
  r.dims.kv_heads = 8;
  r.dims.head_dim = 128;
  r.dims.num_pages = 512;
  r.dims.page_size = 16;
  r.dims.max_blocks = 256;
  r.labels = FullSnapshot().labels;

  ComparisonResult er;
  er.comparison = Comparison::kEngineVsReference;
  er.verdict = Verdict::kDrift;
  er.has_out = true;
  er.out = Drift(0.01);
  er.has_lse = true;
  er.lse = Drift(0.002);
  er.lse.worst = Location{0, 0, 5, -1};
  er.has_logprob = true;
  er.logprob = Drift(0.3);
  er.logprob.worst = Location{1, 0, -1, -1};
  er.logprob_agreement =
      LogprobAgreement{2, 0.1, 0.3, -0.05, 0.01, 1.02, 0.8, 1.3, 0.07};
  er.worst_heads = {HeadSummary{3, 0.01, 0.002, 12},
                    HeadSummary{1, 0.005, 0.001, 6}};
  er.reasons = {"out: 3 elements over 1e-3", "lse: NaN in candidate"};
  er.has_statistical = true;
  er.statistical.computed = true;
  er.statistical.noise_epsilon = 0.0078125;
  er.statistical.clean_rms = 0.4;
  er.statistical.groups = 41;
  er.statistical.fired_groups = 2;
  StatisticalGroup g;
  g.scope = "row";
  g.where = Location{1, 0, -1, -1};
  g.count = 4096;
  g.rms = 1.5;
  g.mean = -0.1;
  g.bias = -0.2;
  g.rms_limit = 0.6;
  g.mean_limit = 0.15;
  g.fired = true;
  er.statistical.worst = {g};

  ComparisonResult pr;
  pr.comparison = Comparison::kReplayVsReference;
  pr.verdict = Verdict::kPass;
  pr.has_out = true;
  pr.out = Drift(1e-7);
  pr.has_lse = true;
  pr.lse = Drift(2e-7);

  ComparisonResult ep;  // only lse, nothing else
  ep.comparison = Comparison::kEngineVsReplay;
  ep.verdict = Verdict::kUnspecified;
  ep.has_lse = true;
  ep.lse = Drift(0.004);

  r.comparisons = {er, pr, ep};

  Provenance& p = r.provenance;
  p.backend = "cpu";
  p.threads = 2;
  p.softmax_scale = 0.08838834764831845;
  p.output_dtype = DType::kBF16;
  p.max_merged_blocks = 3;
  p.merge_orders = {{{0, 1, 2}, {}}, {{0}, {1, 2}}};
  p.block_owners = {{0, 1, 0}, {}};
  p.kv_fingerprint = std::string(64, 'b');
  p.prefix_fingerprint = std::string(64, 'c');
  p.rope_fingerprint = std::string(64, 'd');
  p.fingerprint_version = "attnaudit.kv.v1";
  p.prefix_fingerprint_scheme = "rl_kernel_compat";
  p.engine_profile = "vllm-cpu";
  p.rope_source = "engine inv_freq";
  p.precision_source = "measured";
  p.precision_evidence = "probe: output truncated in 64 of 64 cases";
  p.sensitivity = {"undeclared engine: ...", "pre-RoPE without a table"};
  r.inconclusive_reasons = {"E-R scores: beyond what fp32 orders"};
  r.overrides = {"tolerances.out_abs 0.1 (E-R policy 0.004)"};
  r.hull.present = true;
  r.hull.checked = 4096;
  r.hull.outside = 3;
  r.hull.worst = {1, 0, 5, 17};
  r.hull.worst_value = 1e4;
  r.hull.worst_low = -4.5;
  r.hull.worst_high = 5.25;
  p.timings.validate_seconds = 0.001;
  p.timings.reference_seconds = 0.5;
  p.timings.replay_seconds = 0.25;
  p.timings.compare_seconds = 0.01;
  p.timings.total_seconds = 0.8;
  p.timings.cp_seconds = 0.3;
  p.timings.cp_rank_compute_seconds = {0.1, 0.2, 0.05};
  p.timings.cp_rank_transport_seconds = {0.01, 0.02, 0.0};

  CpReport& cp = r.cp;
  cp.present = true;
  cp.strategy = "ring";
  cp.strategy_chosen = false;
  cp.world_size = 3;
  cp.sharding = CpSharding::kTokenInterleaved;
  cp.interleave_size = 2;
  cp.shard_tokens = {{4, 3, 3}, {1, 0, 0}};
  cp.rounds = 3;
  cp.steps = 6;
  cp.workers = 2;
  cp.execution = "lockstep";
  cp.engine_order.verdict = Verdict::kPass;
  cp.engine_order.has_out = true;
  cp.engine_order.out = Drift(0.0001);
  cp.engine_order.has_lse = true;
  cp.engine_order.lse = Drift(0.00002);
  cp.deterministic = cp.engine_order;
  cp.deterministic_matches_replay = true;
  for (int64_t k = 0; k < 3; ++k) {
    CpRankCheck rank;
    rank.rank = k;
    rank.check.verdict = k == 1 ? Verdict::kDrift : Verdict::kPass;
    rank.check.has_lse = true;
    rank.check.lse = Drift(0.5 * static_cast<double>(k));
    rank.check.has_out = k != 2;
    if (rank.check.has_out) rank.check.out = Drift(0.01);
    if (k == 1) rank.check.reasons = {"lse: 1 of 4 elements over tolerance"};
    rank.tokens = 5 - k;
    rank.empty_queries = k;
    cp.ranks.push_back(rank);
  }
  cp.has_combine = true;
  cp.combine.verdict = Verdict::kPass;
  cp.combine.has_lse = true;
  cp.combine.lse = Drift(0.0);
  cp.skipped = "";
  p.timings.diagnosis_seconds = 0.4;
  Diagnosis d;
  d.hypothesis = "stale-page";
  d.detail = "block 12";
  d.score = 0.9;
  d.explains = true;
  d.before = DiagnosisEvidence{0.1, 30, 0.01};
  d.after = DiagnosisEvidence{0.002, 0.4, 1e-6};
  d.location.row = 1;
  d.location.query = 0;
  d.location.heads = {3, 5};
  d.location.logical_block = 12;
  d.location.page = 1873;
  d.location.other_logical_block = 11;
  d.location.other_page = 7;
  d.location.cp_rank = 2;
  d.summary = "page 1873 holds stale data";
  r.diagnoses = {d};
  r.diagnosis_run = DiagnosisRun{true, false, 42, 2, "stopped"};
  return r;
}

void ExpectTensorEq(const Tensor& a, const Tensor& b, const char* where) {
  EXPECT_EQ(a.dtype(), b.dtype()) << where;
  EXPECT_EQ(a.shape(), b.shape()) << where;
  EXPECT_TRUE(a.bytes() == b.bytes()) << where << ": bytes differ";
}

void ExpectSnapshotEq(const Snapshot& a, const Snapshot& b) {
  ExpectTensorEq(a.q, b.q, "q");
  ExpectTensorEq(a.k_pages, b.k_pages, "k_pages");
  ExpectTensorEq(a.v_pages, b.v_pages, "v_pages");
  EXPECT_EQ(a.kv_layout, b.kv_layout);
  ExpectTensorEq(a.k_scale, b.k_scale, "k_scale");
  ExpectTensorEq(a.v_scale, b.v_scale, "v_scale");
  ExpectTensorEq(a.page_ids, b.page_ids, "page_ids");
  ExpectTensorEq(a.block_table, b.block_table, "block_table");
  ExpectTensorEq(a.kv_seq_lens, b.kv_seq_lens, "kv_seq_lens");
  ExpectTensorEq(a.query_positions, b.query_positions, "query_positions");
  ExpectTensorEq(a.slot_positions, b.slot_positions, "slot_positions");
  ExpectTensorEq(a.key_rope_positions, b.key_rope_positions,
                 "key_rope_positions");
  EXPECT_EQ(a.softmax_scale, b.softmax_scale);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.window_convention, b.window_convention);
  EXPECT_EQ(a.logit_softcap, b.logit_softcap);
  ExpectTensorEq(a.sinks, b.sinks, "sinks");
  EXPECT_EQ(a.engine_lse_includes_sinks, b.engine_lse_includes_sinks);

  EXPECT_EQ(a.rope.q_state, b.rope.q_state);
  EXPECT_EQ(a.rope.k_state, b.rope.k_state);
  EXPECT_EQ(a.rope.style, b.rope.style);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.rotary_dim, b.rope.rotary_dim);
  EXPECT_EQ(a.rope.scaling.type, b.rope.scaling.type);
  EXPECT_EQ(a.rope.scaling.factor, b.rope.scaling.factor);
  EXPECT_EQ(a.rope.scaling.low_freq_factor, b.rope.scaling.low_freq_factor);
  EXPECT_EQ(a.rope.scaling.high_freq_factor, b.rope.scaling.high_freq_factor);
  EXPECT_EQ(a.rope.scaling.original_max_position,
            b.rope.scaling.original_max_position);
  EXPECT_EQ(a.rope.scaling.beta_fast, b.rope.scaling.beta_fast);
  EXPECT_EQ(a.rope.scaling.beta_slow, b.rope.scaling.beta_slow);
  EXPECT_EQ(a.rope.scaling.attention_factor, b.rope.scaling.attention_factor);
  EXPECT_EQ(a.rope.scaling.truncate, b.rope.scaling.truncate);
  EXPECT_EQ(a.rope.scaling.sequence_length, b.rope.scaling.sequence_length);
  EXPECT_EQ(a.rope.scaling.short_factor, b.rope.scaling.short_factor);
  EXPECT_EQ(a.rope.scaling.long_factor, b.rope.scaling.long_factor);
  EXPECT_EQ(a.rope.cast_point, b.rope.cast_point);
  EXPECT_EQ(a.rope.q_output_dtype, b.rope.q_output_dtype);
  EXPECT_EQ(a.rope.k_output_dtype, b.rope.k_output_dtype);
  EXPECT_EQ(a.output_dtype, b.output_dtype);

  EXPECT_EQ(a.cp.world_size, b.cp.world_size);
  EXPECT_EQ(a.cp.sharding, b.cp.sharding);
  EXPECT_EQ(a.cp.interleave_size, b.cp.interleave_size);
  ExpectTensorEq(a.cp.block_owners, b.cp.block_owners, "cp.block_owners");
  ExpectTensorEq(a.cp.rank_out, b.cp.rank_out, "cp.rank_out");
  ExpectTensorEq(a.cp.rank_lse, b.cp.rank_lse, "cp.rank_lse");

  ExpectTensorEq(a.engine.out, b.engine.out, "engine.out");
  ExpectTensorEq(a.engine.lse, b.engine.lse, "engine.lse");
  EXPECT_EQ(a.engine.lse_base, b.engine.lse_base);
  ExpectTensorEq(a.engine.logprobs, b.engine.logprobs, "engine.logprobs");
  EXPECT_EQ(a.precision.profile, b.precision.profile);
  EXPECT_EQ(a.precision.score_dtype, b.precision.score_dtype);
  EXPECT_EQ(a.precision.probability_dtype, b.precision.probability_dtype);
  EXPECT_EQ(a.precision.exp_ulps, b.precision.exp_ulps);
  EXPECT_EQ(a.precision.split_keys, b.precision.split_keys);
  EXPECT_EQ(a.precision.score_rounding, b.precision.score_rounding);
  EXPECT_EQ(a.precision.probability_rounding, b.precision.probability_rounding);
  EXPECT_EQ(a.precision.output_rounding, b.precision.output_rounding);
  EXPECT_EQ(a.precision.rope_rounding, b.precision.rope_rounding);
  EXPECT_EQ(a.precision.source, b.precision.source);
  EXPECT_EQ(a.precision.evidence, b.precision.evidence);
  ExpectTensorEq(a.pre_rope.q, b.pre_rope.q, "pre_rope.q");
  ExpectTensorEq(a.pre_rope.k, b.pre_rope.k, "pre_rope.k");
  ExpectTensorEq(a.rope_table.inv_freq, b.rope_table.inv_freq,
                 "rope_table.inv_freq");
  ExpectTensorEq(a.rope_table.positions, b.rope_table.positions,
                 "rope_table.positions");
  ExpectTensorEq(a.rope_table.cos, b.rope_table.cos, "rope_table.cos");
  ExpectTensorEq(a.rope_table.sin, b.rope_table.sin, "rope_table.sin");

  ExpectTensorEq(a.selected_token_ids, b.selected_token_ids,
                 "selected_token_ids");
  ExpectTensorEq(a.lm_head, b.lm_head, "lm_head");
  ExpectTensorEq(a.active_mask, b.active_mask, "active_mask");
  EXPECT_EQ(a.logprob_temperature, b.logprob_temperature);

  EXPECT_EQ(a.prefix.enabled, b.prefix.enabled);
  EXPECT_EQ(a.prefix.key, b.prefix.key);
  EXPECT_EQ(a.prefix.length, b.prefix.length);
  EXPECT_EQ(a.prefix.fingerprint, b.prefix.fingerprint);
  EXPECT_EQ(a.prefix.scheme, b.prefix.scheme);

  EXPECT_EQ(a.labels.model, b.labels.model);
  EXPECT_EQ(a.labels.layer, b.labels.layer);
  EXPECT_EQ(a.labels.engine, b.labels.engine);
  EXPECT_EQ(a.labels.backend, b.labels.backend);
  EXPECT_EQ(a.labels.step, b.labels.step);
  EXPECT_EQ(a.labels.request_ids, b.labels.request_ids);
  EXPECT_EQ(a.labels.run, b.labels.run);
}

namespace {

void ExpectDriftEq(const DriftStats& a, const DriftStats& b,
                   const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(a.count, b.count);
  EXPECT_EQ(a.max_abs, b.max_abs);
  EXPECT_EQ(a.mean_abs, b.mean_abs);
  EXPECT_EQ(a.rms, b.rms);
  EXPECT_EQ(a.max_rel, b.max_rel);
  EXPECT_EQ(a.p99_abs, b.p99_abs);
  EXPECT_EQ(a.ulp_dtype, b.ulp_dtype);
  EXPECT_EQ(a.max_ulp, b.max_ulp);
  EXPECT_EQ(a.mean_ulp, b.mean_ulp);
  EXPECT_EQ(a.tolerance, b.tolerance);
  EXPECT_EQ(a.over_tolerance, b.over_tolerance);
  EXPECT_EQ(a.candidate_nan, b.candidate_nan);
  EXPECT_EQ(a.candidate_inf, b.candidate_inf);
  EXPECT_EQ(a.baseline_nan, b.baseline_nan);
  EXPECT_EQ(a.baseline_inf, b.baseline_inf);
  EXPECT_EQ(a.worst.batch, b.worst.batch);
  EXPECT_EQ(a.worst.query, b.worst.query);
  EXPECT_EQ(a.worst.head, b.worst.head);
  EXPECT_EQ(a.worst.dim, b.worst.dim);
  EXPECT_EQ(a.worst_candidate, b.worst_candidate);
  EXPECT_EQ(a.worst_baseline, b.worst_baseline);
}

}  // namespace

void ExpectReportEq(const AuditReport& a, const AuditReport& b) {
  EXPECT_EQ(a.verdict, b.verdict);
  EXPECT_EQ(a.invalid_reason, b.invalid_reason);
  EXPECT_EQ(a.dims.batch, b.dims.batch);
  EXPECT_EQ(a.dims.queries, b.dims.queries);
  EXPECT_EQ(a.dims.q_heads, b.dims.q_heads);
  EXPECT_EQ(a.dims.kv_heads, b.dims.kv_heads);
  EXPECT_EQ(a.dims.head_dim, b.dims.head_dim);
  EXPECT_EQ(a.dims.num_pages, b.dims.num_pages);
  EXPECT_EQ(a.dims.page_size, b.dims.page_size);
  EXPECT_EQ(a.dims.max_blocks, b.dims.max_blocks);
  EXPECT_EQ(a.labels.model, b.labels.model);
  EXPECT_EQ(a.labels.layer, b.labels.layer);
  EXPECT_EQ(a.labels.engine, b.labels.engine);
  EXPECT_EQ(a.labels.backend, b.labels.backend);
  EXPECT_EQ(a.labels.step, b.labels.step);
  EXPECT_EQ(a.labels.request_ids, b.labels.request_ids);
  EXPECT_EQ(a.labels.run, b.labels.run);

  ASSERT_EQ(a.comparisons.size(), b.comparisons.size());
  for (size_t i = 0; i < a.comparisons.size(); ++i) {
    const ComparisonResult& x = a.comparisons[i];
    const ComparisonResult& y = b.comparisons[i];
    SCOPED_TRACE("comparison " + std::to_string(i));
    EXPECT_EQ(x.comparison, y.comparison);
    EXPECT_EQ(x.verdict, y.verdict);
    EXPECT_EQ(x.has_out, y.has_out);
    EXPECT_EQ(x.has_lse, y.has_lse);
    EXPECT_EQ(x.has_logprob, y.has_logprob);
    if (x.has_out && y.has_out) ExpectDriftEq(x.out, y.out, "out");
    if (x.has_lse && y.has_lse) ExpectDriftEq(x.lse, y.lse, "lse");
    if (x.has_logprob && y.has_logprob) {
      ExpectDriftEq(x.logprob, y.logprob, "logprob");
    }
    const LogprobAgreement& p = x.logprob_agreement;
    const LogprobAgreement& q = y.logprob_agreement;
    EXPECT_EQ(p.count, q.count);
    EXPECT_EQ(p.mean_abs_diff, q.mean_abs_diff);
    EXPECT_EQ(p.max_abs_diff, q.max_abs_diff);
    EXPECT_EQ(p.k1_kl, q.k1_kl);
    EXPECT_EQ(p.k3_kl, q.k3_kl);
    EXPECT_EQ(p.ratio_mean, q.ratio_mean);
    EXPECT_EQ(p.ratio_min, q.ratio_min);
    EXPECT_EQ(p.ratio_max, q.ratio_max);
    EXPECT_EQ(p.ratio_std, q.ratio_std);
    ASSERT_EQ(x.worst_heads.size(), y.worst_heads.size());
    for (size_t h = 0; h < x.worst_heads.size(); ++h) {
      EXPECT_EQ(x.worst_heads[h].head, y.worst_heads[h].head);
      EXPECT_EQ(x.worst_heads[h].max_abs, y.worst_heads[h].max_abs);
      EXPECT_EQ(x.worst_heads[h].mean_abs, y.worst_heads[h].mean_abs);
      EXPECT_EQ(x.worst_heads[h].max_ulp, y.worst_heads[h].max_ulp);
    }
    EXPECT_EQ(x.reasons, y.reasons);
    ASSERT_EQ(x.has_statistical, y.has_statistical);
    ASSERT_EQ(x.statistical.worst.size(), y.statistical.worst.size());
    EXPECT_EQ(x.statistical.noise_epsilon, y.statistical.noise_epsilon);
    EXPECT_EQ(x.statistical.clean_rms, y.statistical.clean_rms);
    EXPECT_EQ(x.statistical.groups, y.statistical.groups);
    EXPECT_EQ(x.statistical.fired_groups, y.statistical.fired_groups);
    for (size_t k = 0; k < x.statistical.worst.size(); ++k) {
      const StatisticalGroup& gx = x.statistical.worst[k];
      const StatisticalGroup& gy = y.statistical.worst[k];
      EXPECT_EQ(gx.scope, gy.scope);
      EXPECT_EQ(gx.where.batch, gy.where.batch);
      EXPECT_EQ(gx.where.query, gy.where.query);
      EXPECT_EQ(gx.where.head, gy.where.head);
      EXPECT_EQ(gx.count, gy.count);
      EXPECT_EQ(gx.rms, gy.rms);
      EXPECT_EQ(gx.mean, gy.mean);
      EXPECT_EQ(gx.bias, gy.bias);
      EXPECT_EQ(gx.rms_limit, gy.rms_limit);
      EXPECT_EQ(gx.mean_limit, gy.mean_limit);
      EXPECT_EQ(gx.fired, gy.fired);
    }
  }
  ASSERT_EQ(a.diagnoses.size(), b.diagnoses.size());
  for (size_t k = 0; k < a.diagnoses.size(); ++k) {
    const Diagnosis& x = a.diagnoses[k];
    const Diagnosis& y = b.diagnoses[k];
    EXPECT_EQ(x.hypothesis, y.hypothesis);
    EXPECT_EQ(x.detail, y.detail);
    EXPECT_EQ(x.score, y.score);
    EXPECT_EQ(x.explains, y.explains);
    EXPECT_EQ(x.before.out_max_abs, y.before.out_max_abs);
    EXPECT_EQ(x.before.out_rms_noise, y.before.out_rms_noise);
    EXPECT_EQ(x.before.lse_max_abs, y.before.lse_max_abs);
    EXPECT_EQ(x.after.out_max_abs, y.after.out_max_abs);
    EXPECT_EQ(x.after.out_rms_noise, y.after.out_rms_noise);
    EXPECT_EQ(x.after.lse_max_abs, y.after.lse_max_abs);
    EXPECT_EQ(x.location.row, y.location.row);
    EXPECT_EQ(x.location.query, y.location.query);
    EXPECT_EQ(x.location.heads, y.location.heads);
    EXPECT_EQ(x.location.logical_block, y.location.logical_block);
    EXPECT_EQ(x.location.page, y.location.page);
    EXPECT_EQ(x.location.other_logical_block, y.location.other_logical_block);
    EXPECT_EQ(x.location.other_page, y.location.other_page);
    EXPECT_EQ(x.location.cp_rank, y.location.cp_rank);
    EXPECT_EQ(x.summary, y.summary);
  }
  EXPECT_EQ(a.diagnosis_run.ran, b.diagnosis_run.ran);
  EXPECT_EQ(a.diagnosis_run.complete, b.diagnosis_run.complete);
  EXPECT_EQ(a.diagnosis_run.hypotheses, b.diagnosis_run.hypotheses);
  EXPECT_EQ(a.diagnosis_run.rows, b.diagnosis_run.rows);
  EXPECT_EQ(a.diagnosis_run.note, b.diagnosis_run.note);

  const Provenance& p = a.provenance;
  const Provenance& q = b.provenance;
  EXPECT_EQ(p.backend, q.backend);
  EXPECT_EQ(p.threads, q.threads);
  EXPECT_EQ(p.softmax_scale, q.softmax_scale);
  EXPECT_EQ(p.output_dtype, q.output_dtype);
  EXPECT_EQ(p.max_merged_blocks, q.max_merged_blocks);
  EXPECT_EQ(p.merge_orders, q.merge_orders);
  EXPECT_EQ(p.block_owners, q.block_owners);
  EXPECT_EQ(p.kv_fingerprint, q.kv_fingerprint);
  EXPECT_EQ(p.prefix_fingerprint, q.prefix_fingerprint);
  EXPECT_EQ(p.rope_fingerprint, q.rope_fingerprint);
  EXPECT_EQ(p.fingerprint_version, q.fingerprint_version);
  EXPECT_EQ(p.prefix_fingerprint_scheme, q.prefix_fingerprint_scheme);
  EXPECT_EQ(p.engine_profile, q.engine_profile);
  EXPECT_EQ(p.rope_source, q.rope_source);
  EXPECT_EQ(p.precision_source, q.precision_source);
  EXPECT_EQ(p.precision_evidence, q.precision_evidence);
  EXPECT_EQ(p.sensitivity, q.sensitivity);
  EXPECT_EQ(a.inconclusive_reasons, b.inconclusive_reasons);
  EXPECT_EQ(a.overrides, b.overrides);
  EXPECT_EQ(a.hull.present, b.hull.present);
  EXPECT_EQ(a.hull.checked, b.hull.checked);
  EXPECT_EQ(a.hull.outside, b.hull.outside);
  EXPECT_EQ(a.hull.worst.batch, b.hull.worst.batch);
  EXPECT_EQ(a.hull.worst.query, b.hull.worst.query);
  EXPECT_EQ(a.hull.worst.head, b.hull.worst.head);
  EXPECT_EQ(a.hull.worst.dim, b.hull.worst.dim);
  EXPECT_EQ(a.hull.worst_value, b.hull.worst_value);
  EXPECT_EQ(a.hull.worst_low, b.hull.worst_low);
  EXPECT_EQ(a.hull.worst_high, b.hull.worst_high);
  EXPECT_EQ(p.timings.validate_seconds, q.timings.validate_seconds);
  EXPECT_EQ(p.timings.reference_seconds, q.timings.reference_seconds);
  EXPECT_EQ(p.timings.replay_seconds, q.timings.replay_seconds);
  EXPECT_EQ(p.timings.compare_seconds, q.timings.compare_seconds);
  EXPECT_EQ(p.timings.total_seconds, q.timings.total_seconds);
  EXPECT_EQ(p.timings.cp_seconds, q.timings.cp_seconds);
  EXPECT_EQ(p.timings.cp_rank_compute_seconds,
            q.timings.cp_rank_compute_seconds);
  EXPECT_EQ(p.timings.cp_rank_transport_seconds,
            q.timings.cp_rank_transport_seconds);

  const CpReport& c = a.cp;
  const CpReport& d = b.cp;
  EXPECT_EQ(c.present, d.present);
  EXPECT_EQ(c.strategy, d.strategy);
  EXPECT_EQ(c.strategy_chosen, d.strategy_chosen);
  EXPECT_EQ(c.world_size, d.world_size);
  EXPECT_EQ(c.sharding, d.sharding);
  EXPECT_EQ(c.interleave_size, d.interleave_size);
  EXPECT_EQ(c.shard_tokens, d.shard_tokens);
  EXPECT_EQ(c.rounds, d.rounds);
  EXPECT_EQ(c.steps, d.steps);
  EXPECT_EQ(c.workers, d.workers);
  EXPECT_EQ(c.execution, d.execution);
  EXPECT_EQ(c.deterministic_matches_replay, d.deterministic_matches_replay);
  EXPECT_EQ(c.has_combine, d.has_combine);
  EXPECT_EQ(c.skipped, d.skipped);
  auto check_eq = [](const CpCheck& x, const CpCheck& y, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(x.verdict, y.verdict);
    EXPECT_EQ(x.has_out, y.has_out);
    EXPECT_EQ(x.has_lse, y.has_lse);
    if (x.has_out && y.has_out) ExpectDriftEq(x.out, y.out, "out");
    if (x.has_lse && y.has_lse) ExpectDriftEq(x.lse, y.lse, "lse");
    EXPECT_EQ(x.reasons, y.reasons);
  };
  check_eq(c.engine_order, d.engine_order, "cp.engine_order");
  check_eq(c.deterministic, d.deterministic, "cp.deterministic");
  if (c.has_combine && d.has_combine) {
    check_eq(c.combine, d.combine, "cp.combine");
  }
  ASSERT_EQ(c.ranks.size(), d.ranks.size());
  for (size_t k = 0; k < c.ranks.size(); ++k) {
    EXPECT_EQ(c.ranks[k].rank, d.ranks[k].rank);
    EXPECT_EQ(c.ranks[k].tokens, d.ranks[k].tokens);
    EXPECT_EQ(c.ranks[k].empty_queries, d.ranks[k].empty_queries);
    check_eq(c.ranks[k].check, d.ranks[k].check, "cp.ranks[k]");
  }
  EXPECT_EQ(p.timings.diagnosis_seconds, q.timings.diagnosis_seconds);
}

}  // namespace testing
}  // namespace attnaudit
