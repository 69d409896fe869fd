// Phase 2 rules: scalars, fp8 scales, sinks, RoPE, CP configuration,
// log-prob inputs, prefix declaration, labels.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"
#include "tests/unit/core/validate/validate_test_util.h"

namespace attnaudit {
namespace testing {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const std::string kHex64(64, 'a');

SnapshotSpec Fp8() {
  SnapshotSpec spec;
  spec.kv_dtype = DType::kF8E4M3;
  return spec;
}

void EnablePrefix(Snapshot* s) {
  s->prefix.enabled = true;
  s->prefix.key = "shared-prefix";
  s->prefix.length = 4;
  s->prefix.fingerprint = kHex64;
}

class ConfigTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(ConfigTest, Rejects) { RunInvalidCase(GetParam()); }

std::vector<InvalidCase> ScalarCases() {
  std::vector<InvalidCase> cases;
  // Harness acceptance case 22 (scale nan/inf/-1; 0 is our "default").
  const std::vector<std::pair<std::string, double>> bad = {
      {"Nan", kNan}, {"Inf", kInf}, {"NegInf", -kInf}, {"Minus1", -1.0}};
  for (const auto& [name, v] : bad) {
    const double value = v;
    cases.push_back(
        {"SoftmaxScale" + name,
         [value](Snapshot* s, ValidationLimits*) { s->softmax_scale = value; },
         "softmax_scale", "positive finite"});
    cases.push_back(
        {"LogitSoftcap" + name,
         [value](Snapshot* s, ValidationLimits*) { s->logit_softcap = value; },
         "logit_softcap", "positive finite"});
    cases.push_back({"Temperature" + name,
                     [value](Snapshot* s, ValidationLimits*) {
                       s->logprob_temperature = value;
                     },
                     "logprob_temperature", "positive finite"});
  }
  // Values fp32 flushes to zero (or subnormal) would make the fp32 replay
  // compute a different attention than the fp64 reference.
  for (double tiny : {1e-46, 1e-40, 1e-320}) {
    cases.push_back(
        {"LogitSoftcapBelowFp32Normal" +
             std::to_string(static_cast<int>(-std::log10(tiny))),
         [tiny](Snapshot* s, ValidationLimits*) { s->logit_softcap = tiny; },
         "logit_softcap", "fp32's normal range"});
    cases.push_back(
        {"SoftmaxScaleBelowFp32Normal" +
             std::to_string(static_cast<int>(-std::log10(tiny))),
         [tiny](Snapshot* s, ValidationLimits*) { s->softmax_scale = tiny; },
         "softmax_scale", "fp32's normal range"});
  }
  cases.push_back(
      {"LogitSoftcapAboveFp32Max",
       [](Snapshot* s, ValidationLimits*) { s->logit_softcap = 1e39; },
       "logit_softcap", "fp32's normal range"});
  cases.push_back(
      {"TemperatureZero",
       [](Snapshot* s, ValidationLimits*) { s->logprob_temperature = 0.0; },
       "logprob_temperature", "positive finite"});
  cases.push_back(
      {"SlidingWindowNegative",
       [](Snapshot* s, ValidationLimits*) { s->sliding_window = -1; },
       "sliding_window", ">= 0"});
  cases.push_back({"WindowConventionUnknown",
                   [](Snapshot* s, ValidationLimits*) {
                     s->window_convention =
                         static_cast<SlidingWindowConvention>(5);
                   },
                   "window_convention", "unknown"});
  cases.push_back(
      {"OutputDtypeInteger",
       [](Snapshot* s, ValidationLimits*) { s->output_dtype = DType::kI32; },
       "output_dtype", "floating-point"});
  cases.push_back({"EngineOutDtypeDiffersFromOutputDtype",
                   [](Snapshot* s, ValidationLimits*) {
                     AddEngineOutputs(s, DType::kBF16);
                     s->output_dtype = DType::kF16;
                   },
                   "engine.out", "differs from output_dtype"});
  cases.push_back({"LseBaseUnknown",
                   [](Snapshot* s, ValidationLimits*) {
                     s->engine.lse_base = static_cast<LseBase>(3);
                   },
                   "engine.lse_base", "unknown"});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Scalars, ConfigTest,
                         ::testing::ValuesIn(ScalarCases()), CaseName);

std::vector<InvalidCase> ScaleAndSinkCases() {
  std::vector<InvalidCase> cases = {
      {"KScaleWithoutFp8Pages",
       [](Snapshot* s, ValidationLimits*) {
         s->k_scale = MakeFloatTensor(DType::kF32, {}, {0.5});
       },
       "k_scale", "only valid with fp8 pages"},
      {"VScaleWithoutFp8Pages",
       [](Snapshot* s, ValidationLimits*) {
         s->v_scale = MakeFloatTensor(DType::kF32, {2}, {0.5, 0.5});
       },
       "v_scale", "only valid with fp8 pages"},
      {"PerHeadScaleNan",
       [](Snapshot* s, ValidationLimits*) {
         s->k_scale = MakeFloatTensor(DType::kF32, {2}, {0.5, kNan});
       },
       "k_scale[1]", "positive finite", Fp8()},
      {"SinkNan",
       [](Snapshot* s, ValidationLimits*) {
         s->sinks = MakeFloatTensor(DType::kF32, {4}, {0.1, 0.2, kNan, 0.4});
       },
       "sinks[2]", "not finite"},
      {"SinkInf",
       [](Snapshot* s, ValidationLimits*) {
         s->sinks = MakeFloatTensor(DType::kF32, {4}, {-kInf, 0, 0, 0});
       },
       "sinks[0]", "not finite"},
  };
  // Per-tensor scales nan / inf / 0 / -1 for k and v.
  const std::vector<std::pair<std::string, double>> bad = {
      {"Nan", kNan}, {"Inf", kInf}, {"Zero", 0.0}, {"Minus1", -1.0}};
  for (const auto& [name, v] : bad) {
    const double value = v;
    cases.push_back({"KScale" + name,
                     [value](Snapshot* s, ValidationLimits*) {
                       s->k_scale = MakeFloatTensor(DType::kF32, {}, {value});
                     },
                     "k_scale", "positive finite", Fp8()});
    cases.push_back({"VScale" + name,
                     [value](Snapshot* s, ValidationLimits*) {
                       s->v_scale = MakeFloatTensor(DType::kF32, {}, {value});
                     },
                     "v_scale", "positive finite", Fp8()});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(ScalesAndSinks, ConfigTest,
                         ::testing::ValuesIn(ScaleAndSinkCases()), CaseName);

std::vector<InvalidCase> RopeCases() {
  std::vector<InvalidCase> cases = {
      // Harness acceptance case 17.
      {"CastPointUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.cast_point = static_cast<RopeCastPoint>(3);
       },
       "rope.cast_point", "after_rope, cos_sin or each_op"},
      {"QStateUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.q_state = static_cast<RopeState>(4);
       },
       "rope.q_state", "post_rope or pre_rope"},
      {"KStateUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.k_state = static_cast<RopeState>(-1);
       },
       "rope.k_state", "post_rope or pre_rope"},
      {"StyleUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.style = static_cast<RopeStyle>(2);
       },
       "rope.style", "unknown"},
      {"RotaryDimOdd",
       [](Snapshot* s, ValidationLimits*) { s->rope.rotary_dim = 3; },
       "rope.rotary_dim", ""},
      {"RotaryDimAboveHeadDim",
       [](Snapshot* s, ValidationLimits*) { s->rope.rotary_dim = 10; },
       "rope.rotary_dim", ""},
      {"RotaryDimNegative",
       [](Snapshot* s, ValidationLimits*) { s->rope.rotary_dim = -2; },
       "rope.rotary_dim", ""},
      {"ScalingLlama3FactorBelowOne",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.scaling.type = RopeScalingType::kLlama3;
         s->rope.scaling.factor = 0.5;
       },
       "rope.scaling", "llama3"},
      {"ScalingLinearZeroFactor",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.scaling.type = RopeScalingType::kLinear;
         s->rope.scaling.factor = 0.0;
       },
       "rope.scaling.factor", ""},
      {"ScalingTypeUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.scaling.type = static_cast<RopeScalingType>(9);
       },
       "rope.scaling.type", ""},
      {"DynamicWithoutSequenceLength",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.scaling.type = RopeScalingType::kDynamic;
         s->rope.scaling.factor = 2.0;
       },
       "rope.scaling.sequence_length", "dynamic"},
      {"DynamicFactorBelowOne",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.scaling.type = RopeScalingType::kDynamic;
         s->rope.scaling.factor = 0.5;
         s->rope.scaling.sequence_length = 9000;
       },
       "rope.scaling.factor", ">= 1"},
      {"LongRopeFactorsOfAnotherWidth",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.scaling.type = RopeScalingType::kLongRope;
         s->rope.scaling.sequence_length = 9000;
         s->rope.scaling.short_factor = {1, 1, 1};
         s->rope.scaling.long_factor = {1, 1, 1, 1};
       },
       "rope.scaling.short_factor", "rotary_dim / 2 = 4 entries, got 3"},
      {"LongRopeFactorNotPositive",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.scaling.type = RopeScalingType::kLongRope;
         s->rope.scaling.sequence_length = 9000;
         s->rope.scaling.short_factor = {1, 1, 1, 1};
         s->rope.scaling.long_factor = {1, 0, 1, 1};
       },
       "rope.scaling.long_factor[1]", "positive finite"},
      {"LongRopeWithoutSequenceLength",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.scaling.type = RopeScalingType::kLongRope;
         s->rope.scaling.short_factor = {1, 1, 1, 1};
         s->rope.scaling.long_factor = {1, 1, 1, 1};
       },
       "rope.scaling.sequence_length", "longrope"},
      {"QOutputDtypeInteger",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.q_state = RopeState::kPreRope;
         s->rope.q_output_dtype = DType::kI64;
       },
       "rope.q_output_dtype", "floating-point"},
      {"KOutputDtypeBool",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.k_output_dtype = DType::kBool;
       },
       "rope.k_output_dtype", "floating-point"},
      // Harness rule 18: post-RoPE data must already be in the declared
      // RoPE output dtype.
      {"PostRopeQDtypeMismatch",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.q_output_dtype = DType::kBF16;
       },
       "rope.q_output_dtype", "post-RoPE q dtype f32"},
      {"PostRopeKDtypeMismatch",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.k_output_dtype = DType::kF16;
       },
       "rope.k_output_dtype", "post-RoPE k_pages dtype f32"},
  };
  // Harness acceptance case 18 (plus 0 and negative), with post-RoPE state:
  // theta is checked regardless.
  const std::vector<std::pair<std::string, double>> bad = {
      {"Nan", kNan},
      {"Inf", kInf},
      {"NegInf", -kInf},
      {"Zero", 0.0},
      {"Negative", -10000.0}};
  for (const auto& [name, v] : bad) {
    const double value = v;
    cases.push_back(
        {"Theta" + name,
         [value](Snapshot* s, ValidationLimits*) { s->rope.theta = value; },
         "rope.theta", "positive finite"});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Rope, ConfigTest, ::testing::ValuesIn(RopeCases()),
                         CaseName);

// The base snapshot: B=2, Sq=2, Hq=4, Hkv=2, D=8 (rotary_dim 8: 4 pairs).
Tensor F32(std::vector<int64_t> shape, float value) {
  Tensor t(DType::kF32, std::move(shape));
  std::fill_n(t.mutable_data<float>(), t.num_elements(), value);
  return t;
}

Tensor I64(std::vector<int64_t> values) {
  Tensor t(DType::kI64, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.mutable_data<int64_t>());
  return t;
}

void SetRows(Snapshot* s, std::vector<int64_t> positions) {
  const int64_t rows = static_cast<int64_t>(positions.size());
  s->rope_table.positions = I64(std::move(positions));
  s->rope_table.cos = F32({rows, 4}, 1.0f);
  s->rope_table.sin = F32({rows, 4}, 0.0f);
}

std::vector<InvalidCase> RopeInputCases() {
  return {
      {"PreRopeQWrongShape",
       [](Snapshot* s, ValidationLimits*) {
         s->pre_rope.q = F32({2, 2, 2, 8}, 0.5f);
       },
       "pre_rope.q", "[B=2, Sq=2, Hq=4, D=8]"},
      {"PreRopeKWrongShape",
       [](Snapshot* s, ValidationLimits*) {
         s->pre_rope.k = F32({2, 2, 4, 8}, 0.5f);
       },
       "pre_rope.k", "[B=2, Sq=2, Hkv=2, D=8]"},
      {"PreRopeQWithPreRopeState",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.q_state = RopeState::kPreRope;
         s->pre_rope.q = F32({2, 2, 4, 8}, 0.5f);
       },
       "pre_rope.q", "needs rope.q_state post_rope"},
      {"PreRopeKWithPreRopeState",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.k_state = RopeState::kPreRope;
         s->pre_rope.k = F32({2, 2, 2, 8}, 0.5f);
       },
       "pre_rope.k", "needs rope.k_state post_rope"},
      {"PreRopeQNotFinite",
       [](Snapshot* s, ValidationLimits*) {
         s->pre_rope.q = F32({2, 2, 4, 8}, 0.5f);
         s->pre_rope.q.mutable_data<float>()[9] = kNan;
       },
       "pre_rope.q[0][0][1][1]", "not finite"},
      {"PreRopeKBeyondRotatableRange",
       [](Snapshot* s, ValidationLimits*) {
         s->pre_rope.k = F32({2, 2, 2, 8}, 0.5f);
         s->pre_rope.k.mutable_data<float>()[3] = -3e38f;  // a valid bf16
       },
       "pre_rope.k[0][0][0][3]", "overflow"},
      {"PreRopeQueriesBeyondRotatableRange",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.q_state = RopeState::kPreRope;
         s->q.mutable_data<float>()[0] = 1e38f;
       },
       "q[0][0][0][0]", "overflow"},
      {"InvFreqWrongWidth",
       [](Snapshot* s, ValidationLimits*) {
         s->rope_table.inv_freq = F32({8}, 1.0f);
       },
       "rope_table.inv_freq", "[rotary_dim / 2=4]"},
      {"InvFreqOfNeitherWidthOnAPartialConfig",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.rotary_dim = 4;
         s->rope_table.inv_freq = F32({3}, 1.0f);
       },
       "rope_table.inv_freq", "[rotary_dim / 2=2]"},
      // A full-head table is accepted on a partial config, but all of it:
      // rows of the rotary width beside full-head inverse frequencies are
      // malformed.
      {"FullHeadInvFreqWithRotaryWidthRows",
       [](Snapshot* s, ValidationLimits*) {
         s->rope.rotary_dim = 4;
         s->rope_table.inv_freq = F32({4}, 1.0f);
         s->rope_table.positions = I64({3, 4});
         s->rope_table.cos = F32({2, 2}, 1.0f);
         s->rope_table.sin = F32({2, 2}, 0.0f);
       },
       "rope_table.cos", "[T=2, head_dim / 2=4]"},
      {"InvFreqNotPositive",
       [](Snapshot* s, ValidationLimits*) {
         s->rope_table.inv_freq = F32({4}, 1.0f);
         s->rope_table.inv_freq.mutable_data<float>()[2] = 0.0f;
       },
       "rope_table.inv_freq[2]", "positive finite"},
      {"RowsWithoutSin",
       [](Snapshot* s, ValidationLimits*) {
         SetRows(s, {0, 1});
         s->rope_table.sin = Tensor();
       },
       "rope_table.sin", "come together"},
      {"RowsWrongWidth",
       [](Snapshot* s, ValidationLimits*) {
         SetRows(s, {0, 1});
         s->rope_table.cos = F32({2, 8}, 1.0f);
       },
       "rope_table.cos", "[T=2, rotary_dim / 2=4]"},
      {"RowPositionRepeats",
       [](Snapshot* s, ValidationLimits*) {
         SetRows(s, {4, 9, 4});
       },
       "rope_table.positions[2]", "repeats entry 0"},
      {"RowPositionNegative",
       [](Snapshot* s, ValidationLimits*) {
         SetRows(s, {4, -1});
       },
       "rope_table.positions[1]", ">= 0"},
      {"RowValueNotFinite",
       [](Snapshot* s, ValidationLimits*) {
         SetRows(s, {4, 5});
         s->rope_table.sin.mutable_data<float>()[5] = kInf;
       },
       "rope_table.sin[1][1]", "not finite"},
      {"PrecisionProfileUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->precision.profile = static_cast<EngineProfile>(17);
       },
       "precision.profile", "unknown value 17"},
      {"PrecisionScoreDtypeInteger",
       [](Snapshot* s, ValidationLimits*) {
         s->precision.score_dtype = DType::kI32;
       },
       "precision.score_dtype", "floating-point"},
      {"PrecisionExpUlpsNegative",
       [](Snapshot* s, ValidationLimits*) { s->precision.exp_ulps = -1; },
       "precision.exp_ulps", "[0, 2^20]"},
      {"PrecisionSplitKeysNegative",
       [](Snapshot* s, ValidationLimits*) { s->precision.split_keys = -5; },
       "precision.split_keys", ">= 0"},
      {"PrecisionRoundingUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->precision.output_rounding = static_cast<Rounding>(9);
       },
       "precision.output_rounding", "unknown value 9"},
      {"PrecisionSourceUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->precision.source = static_cast<PrecisionSource>(5);
       },
       "precision.source", "unknown value 5"},
      {"PrecisionEvidenceTooLong",
       [](Snapshot* s, ValidationLimits*) {
         s->precision.evidence.assign(1025, 'x');
       },
       "precision.evidence", "at most 1024 bytes"},
  };
}
INSTANTIATE_TEST_SUITE_P(RopeInputs, ConfigTest,
                         ::testing::ValuesIn(RopeInputCases()), CaseName);

TEST(ConfigValidTest, RopeInputsAndPrecisionWellFormedPass) {
  Snapshot s = BuildSnapshot({});
  s.pre_rope.q = F32({2, 2, 4, 8}, 0.5f);
  s.pre_rope.k = F32({2, 2, 2, 8}, 0.5f);
  s.rope_table.inv_freq = F32({4}, 0.25f);
  SetRows(&s, {7, 3, 100000});
  s.rope.cast_point = RopeCastPoint::kCosSin;
  s.precision.profile = EngineProfile::kHfEager;
  s.precision.score_dtype = DType::kBF16;
  s.precision.exp_ulps = 20;
  s.precision.split_keys = 512;
  s.precision.output_rounding = Rounding::kTowardZero;
  s.precision.rope_rounding = Rounding::kNearestEven;
  s.precision.source = PrecisionSource::kMeasured;
  s.precision.evidence.assign(1024, 'x');
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
}

// An engine that rotated the whole head of a partial-rotary model and sent
// its table: not malformed (the table check reports it as DRIFT).
TEST(ConfigValidTest, AFullHeadTableOnAPartialRotaryConfigIsAccepted) {
  Snapshot s = BuildSnapshot({});
  s.rope.rotary_dim = 4;
  s.rope_table.inv_freq = F32({4}, 0.25f);
  SetRows(&s, {7, 3});  // [T, 4] = [T, head_dim / 2]
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
  s.rope_table.inv_freq = Tensor();  // rows alone
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
  s.rope_table.inv_freq = F32({2}, 0.25f);  // the rotary width, rows not
  EXPECT_FALSE(IsValid(ValidateSnapshot(s)));
}

TEST(ConfigValidTest, SequenceLengthScalingsWellFormedPass) {
  Snapshot s = BuildSnapshot({});
  s.rope.scaling.type = RopeScalingType::kDynamic;
  s.rope.scaling.factor = 4;
  s.rope.scaling.original_max_position = 4096;
  s.rope.scaling.sequence_length = 1;
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
  s.rope.scaling.type = RopeScalingType::kLongRope;
  s.rope.scaling.short_factor = {1, 1.5, 2, 3};
  s.rope.scaling.long_factor = {1, 4, 16, 64};
  s.rope.scaling.sequence_length = 131072;
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
}

TEST(ConfigValidTest, KOutputDtypeAppliesBeforeAnFp8CachesQuantisation) {
  // The engine rotates post-RoPE fp8 keys in bf16, then quantises them:
  // k_output_dtype names that dtype (the rolling RoPE check uses it).
  SnapshotSpec spec;
  spec.kv_dtype = DType::kF8E4M3;
  Snapshot s = BuildSnapshot(spec);
  s.rope.k_output_dtype = DType::kBF16;
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
}

std::vector<InvalidCase> CpCases() {
  return {
      {"WorldSizeZero",
       [](Snapshot* s, ValidationLimits*) { s->cp.world_size = 0; },
       "cp.world_size", ">= 1"},
      {"NoneShardingWithWorld2",
       [](Snapshot* s, ValidationLimits*) { s->cp.world_size = 2; },
       "cp.sharding", "requires cp.world_size 1"},
      {"ShardingUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->cp.sharding = static_cast<CpSharding>(8);
       },
       "cp.sharding", "unknown"},
      {"ExplicitWithoutOwners",
       [](Snapshot* s, ValidationLimits*) {
         s->cp.world_size = 2;
         s->cp.sharding = CpSharding::kExplicitOwners;
       },
       "cp.block_owners", "required"},
      {"OwnersWithPageInterleaved",
       [](Snapshot* s, ValidationLimits*) {
         SetExplicitOwners(s, 2, {{0, 1, 0}, {0, 1, 0}});
         s->cp.sharding = CpSharding::kPageInterleaved;
       },
       "cp.block_owners", "only valid with sharding explicit_owners"},
      {"InterleaveZero",
       [](Snapshot* s, ValidationLimits*) {
         s->cp.world_size = 2;
         s->cp.sharding = CpSharding::kTokenInterleaved;
         s->cp.interleave_size = 0;
       },
       "cp.interleave_size", ">= 1"},
      {"RankOutWithoutRankLse",
       [](Snapshot* s, ValidationLimits*) {
         s->cp.rank_out = Tensor(DType::kF32, {1, 2, 2, 4, 8});
       },
       "cp.rank_lse", "together"},
      {"RankLseWithoutRankOut",
       [](Snapshot* s, ValidationLimits*) {
         s->cp.rank_lse = Tensor(DType::kF32, {1, 2, 2, 4});
       },
       "cp.rank_out", "together"},
  };
}
INSTANTIATE_TEST_SUITE_P(Cp, ConfigTest, ::testing::ValuesIn(CpCases()),
                         CaseName);

std::vector<InvalidCase> LogprobCases() {
  return {
      {"LmHeadWithoutIds",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         s->selected_token_ids = Tensor();
       },
       "selected_token_ids",
       "lm_head and selected_token_ids must be provided together"},
      {"IdsWithoutLmHead",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         s->lm_head = Tensor();
       },
       "lm_head", "lm_head and selected_token_ids must be provided together"},
      {"EngineLogprobsWithoutIds",
       [](Snapshot* s, ValidationLimits*) {
         s->engine.logprobs = Tensor(DType::kF32, {2, 2});
       },
       "engine.logprobs", "requires selected_token_ids"},
      {"IdAtVocab",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s, 11);
         SetInt(&s->selected_token_ids, 2, 11);
       },
       "selected_token_ids[1][0]", "11 is outside [0, 11)"},
      {"IdNegative",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s, 11);
         SetInt(&s->selected_token_ids, 3, -1);
       },
       "selected_token_ids[1][1]", "-1 is outside [0, 11)"},
      {"MaskValueTwo",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         SetInt(&s->active_mask, 1, 2);
       },
       "active_mask[0][1]", "not 0 or 1"},
  };
}
INSTANTIATE_TEST_SUITE_P(Logprob, ConfigTest,
                         ::testing::ValuesIn(LogprobCases()), CaseName);

std::vector<InvalidCase> PrefixCases() {
  return {
      {"EnabledWithoutKey",
       [](Snapshot* s, ValidationLimits*) {
         EnablePrefix(s);
         s->prefix.key.clear();
       },
       "prefix.key", "required"},
      {"EnabledZeroLength",
       [](Snapshot* s, ValidationLimits*) {
         EnablePrefix(s);
         s->prefix.length = 0;
       },
       "prefix.length", "positive"},
      {"EnabledLengthAboveSeqLen",
       [](Snapshot* s, ValidationLimits*) {
         EnablePrefix(s);
         s->prefix.length = 6;  // row 1 holds only 5 tokens
       },
       "prefix.length", "kv_seq_lens[1]=5",
       [] {
         SnapshotSpec spec;
         spec.seq_lens = {6, 5};
         return spec;
       }()},
      {"EnabledWithoutFingerprint",
       [](Snapshot* s, ValidationLimits*) {
         EnablePrefix(s);
         s->prefix.fingerprint.clear();
       },
       "prefix.fingerprint", "required"},
      {"FingerprintUppercase",
       [](Snapshot* s, ValidationLimits*) {
         EnablePrefix(s);
         s->prefix.fingerprint = std::string(64, 'A');
       },
       "prefix.fingerprint", "uppercase hex is refused, character 0"},
      {"FingerprintNotHex",
       [](Snapshot* s, ValidationLimits*) {
         EnablePrefix(s);
         s->prefix.fingerprint = std::string(63, 'a') + "z";
       },
       "prefix.fingerprint", "character 63 is not 0-9 or a-f"},
      {"FingerprintTooShort",
       [](Snapshot* s, ValidationLimits*) {
         EnablePrefix(s);
         s->prefix.fingerprint = std::string(63, 'a');
       },
       "prefix.fingerprint", "63 characters"},
      {"DisabledWithKey",
       [](Snapshot* s, ValidationLimits*) { s->prefix.key = "k"; },
       "prefix.key", "disabled"},
      {"DisabledWithLength",
       [](Snapshot* s, ValidationLimits*) { s->prefix.length = 2; },
       "prefix.length", "disabled"},
      {"DisabledWithFingerprint",
       [](Snapshot* s, ValidationLimits*) { s->prefix.fingerprint = kHex64; },
       "prefix.fingerprint", "disabled"},
      {"SchemeUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->prefix.scheme = static_cast<PrefixCache::Scheme>(3);
       },
       "prefix.scheme", "unknown"},
      {"RequestIdsCount",
       [](Snapshot* s, ValidationLimits*) {
         s->labels.request_ids = {"a", "b", "c"};
       },
       "labels.request_ids", "expected 0 or B=2"},
  };
}
INSTANTIATE_TEST_SUITE_P(Prefix, ConfigTest, ::testing::ValuesIn(PrefixCases()),
                         CaseName);

// Values the rules above must keep accepting.
TEST(ConfigValidTest, DefaultsAndBoundaryValuesPass) {
  Snapshot s = BuildSnapshot({});
  s.softmax_scale = 0.0;  // default 1/sqrt(D)
  s.logit_softcap = 0.0;
  s.sliding_window = 0;
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
  s.softmax_scale = 0.125;
  s.logit_softcap = 30.0;
  s.sliding_window = 3;
  s.window_convention = SlidingWindowConvention::kFlashLeft;
  s.logprob_temperature = 0.7;
  s.sinks = MakeFloatTensor(DType::kF32, {4}, {0.5, -1.0, 2.0, 0.0});
  s.engine_lse_includes_sinks = true;
  s.output_dtype = DType::kBF16;
  AddEngineOutputs(&s, DType::kBF16);
  s.engine.lse_base = LseBase::k2;
  s.labels.request_ids = {"r0", "r1"};
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
}

TEST(ConfigValidTest, PreRopeMayCastToOtherDtypes) {
  Snapshot s = BuildSnapshot({});
  s.rope.q_state = RopeState::kPreRope;
  s.rope.k_state = RopeState::kPreRope;
  s.rope.q_output_dtype = DType::kF32;
  s.rope.k_output_dtype = DType::kBF16;  // bf16 cache with fp32 q
  s.rope.style = RopeStyle::kGptj;
  s.rope.rotary_dim = 4;
  s.rope.scaling.type = RopeScalingType::kYarn;
  s.rope.scaling.factor = 4.0;
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
  // Post-RoPE with the matching dtype declared is fine too.
  s.rope.q_state = RopeState::kPostRope;
  s.rope.k_state = RopeState::kPostRope;
  s.rope.k_output_dtype = DType::kF32;
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
}

TEST(ConfigValidTest, PrefixEnabledWellFormedPasses) {
  Snapshot s = BuildSnapshot({});
  EnablePrefix(&s);
  s.prefix.length = 6;  // == every kv_seq_len
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
  s.prefix.scheme = PrefixCache::Scheme::kRlKernelCompat;
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
