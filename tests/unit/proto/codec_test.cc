// Snapshot codec: round trips of every field, zero-copy moves, wire
// defaults, and rejection of unknown enum values by field path.
#include "proto/codec/codec.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "tests/unit/proto/codec_test_util.h"

namespace attnaudit {
namespace {

using testing::ExpectSnapshotEq;
using testing::FullSnapshot;

// Every singular field of `msg`, recursively, that is not set, as paths.
// Repeated fields count as set when non-empty.
void CollectUnset(const google::protobuf::Message& msg,
                  const std::string& prefix, std::vector<std::string>* out) {
  const google::protobuf::Descriptor* d = msg.GetDescriptor();
  const google::protobuf::Reflection* r = msg.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    // Filler only the file writer sets (proto/codec/aligned_writer.h).
    if (d == v1::Tensor::descriptor() &&
        f->number() == v1::Tensor::kPaddingFieldNumber) {
      continue;
    }
    const std::string path = prefix + f->name();
    if (f->is_repeated()) {
      if (r->FieldSize(msg, f) == 0) out->push_back(path);
      continue;
    }
    if (!r->HasField(msg, f)) {
      out->push_back(path);
    } else if (f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      CollectUnset(r->GetMessage(msg, f), path + ".", out);
    }
  }
}

TEST(SnapshotCodecTest, RoundTripsEveryField) {
  const Snapshot original = FullSnapshot();
  v1::Snapshot msg;
  SnapshotToProto(original, &msg);

  // The fixture sets every core field to a non-default value, so the encoder
  // must have set every wire field: a field it forgot would show up here.
  std::vector<std::string> unset;
  CollectUnset(msg, "", &unset);
  EXPECT_TRUE(unset.empty()) << "first unset field: " << unset.front();

  // Through the wire bytes, as a server would receive it.
  v1::Snapshot received;
  ASSERT_TRUE(received.ParseFromString(msg.SerializeAsString()));
  absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&received);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSnapshotEq(original, *decoded);
}

TEST(SnapshotCodecTest, EncoderWritesExplicitEnums) {
  v1::Snapshot msg;
  SnapshotToProto(Snapshot(), &msg);
  EXPECT_EQ(msg.kv_layout(), v1::KV_LAYOUT_NHD);
  EXPECT_EQ(msg.rope().q_state(), v1::ROPE_STATE_POST_ROPE);
  EXPECT_EQ(msg.rope().style(), v1::ROPE_STYLE_NEOX);
  EXPECT_EQ(msg.rope().cast_point(), v1::ROPE_CAST_POINT_AFTER_ROPE);
  EXPECT_EQ(msg.cp().sharding(), v1::CP_SHARDING_NONE);
  EXPECT_EQ(msg.engine().lse_base(), v1::LSE_BASE_E);
  EXPECT_EQ(msg.window_convention(),
            v1::SLIDING_WINDOW_CONVENTION_HUGGING_FACE);
  EXPECT_EQ(msg.prefix().scheme(), v1::FINGERPRINT_SCHEME_ATTNAUDIT_V1);
  // Absent tensors stay unset; unknown layer/step stay unset.
  EXPECT_FALSE(msg.has_q());
  EXPECT_FALSE(msg.engine().has_out());
  EXPECT_FALSE(msg.labels().has_layer());
  EXPECT_FALSE(msg.labels().has_step());
}

TEST(SnapshotCodecTest, EmptyMessageDecodesToCoreDefaults) {
  v1::Snapshot empty;
  absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&empty);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSnapshotEq(Snapshot(), *decoded);
  // The defaults snapshot.proto documents, spelled out.
  EXPECT_EQ(decoded->rope.theta, 10000.0);
  EXPECT_EQ(decoded->rope.scaling.factor, 1.0);
  EXPECT_EQ(decoded->rope.scaling.high_freq_factor, 4.0);
  EXPECT_EQ(decoded->rope.scaling.original_max_position, 8192);
  EXPECT_EQ(decoded->rope.scaling.beta_fast, 32.0);
  EXPECT_EQ(decoded->cp.world_size, 1);
  EXPECT_EQ(decoded->cp.interleave_size, 1);
  EXPECT_EQ(decoded->logprob_temperature, 1.0);
  EXPECT_EQ(decoded->labels.layer, -1);
  EXPECT_EQ(decoded->labels.step, -1);
  EXPECT_FALSE(decoded->q.present());
}

// The sequence-length scalings through the wire bytes: the new type
// values, the length and LongRoPE's factor lists, exactly.
TEST(SnapshotCodecTest, SequenceLengthScalingsRoundTrip) {
  for (RopeScalingType type :
       {RopeScalingType::kDynamic, RopeScalingType::kLongRope}) {
    Snapshot s;
    s.rope.scaling.type = type;
    s.rope.scaling.factor = 32;
    s.rope.scaling.original_max_position = 4096;
    s.rope.scaling.sequence_length = 131072;
    s.rope.scaling.attention_factor = 1.1902380714238083;
    s.rope.scaling.short_factor = {1.0, 1.0199999809265137, 3.0e-5};
    s.rope.scaling.long_factor = {1.0800000429153442, 64.5, 1e300};
    v1::Snapshot msg;
    SnapshotToProto(s, &msg);
    v1::Snapshot received;
    ASSERT_TRUE(received.ParseFromString(msg.SerializeAsString()));
    absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&received);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectSnapshotEq(s, *decoded);
  }
}

// LongRoPE's lists are bounded before they are copied.
TEST(SnapshotCodecTest, OverlongFactorListsNameTheField) {
  for (bool is_long : {false, true}) {
    v1::Snapshot msg;
    v1::RopeScaling* s = msg.mutable_rope()->mutable_scaling();
    s->set_type(v1::ROPE_SCALING_TYPE_LONGROPE);
    for (size_t i = 0; i <= kMaxRopeFactorEntries; ++i) {
      if (is_long) {
        s->add_long_factor(1.0);
      } else {
        s->add_short_factor(1.0);
      }
    }
    absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&msg);
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(decoded.status().message())
                  .rfind(is_long ? "rope.scaling.long_factor: at most"
                                 : "rope.scaling.short_factor: at most",
                         0),
              0u)
        << decoded.status();
  }
}

TEST(SnapshotCodecTest, LayerZeroIsNotUnknown) {
  Snapshot s;
  s.labels.layer = 0;
  s.labels.step = 0;
  v1::Snapshot msg;
  SnapshotToProto(s, &msg);
  absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&msg);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->labels.layer, 0);
  EXPECT_EQ(decoded->labels.step, 0);
}

TEST(SnapshotCodecTest, DecodeMovesBytesWithoutCopy) {
  v1::Snapshot msg;
  SnapshotToProto(FullSnapshot(), &msg);
  // Well past any small-string buffer, so the heap buffer's address is the
  // identity of the bytes.
  msg.mutable_k_pages()->mutable_data()->assign(1 << 20, 'k');
  msg.mutable_engine()->mutable_out()->mutable_data()->assign(1 << 16, 'o');
  const char* k_before = msg.k_pages().data().data();
  const char* out_before = msg.engine().out().data().data();

  absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&msg);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->k_pages.bytes().data(), k_before);
  EXPECT_EQ(decoded->engine.out.bytes().data(), out_before);
  EXPECT_EQ(decoded->k_pages.bytes().size(), size_t{1} << 20);
  // Every tensor's bytes left the message.
  EXPECT_TRUE(msg.k_pages().data().empty());
  EXPECT_TRUE(msg.engine().out().data().empty());
  EXPECT_TRUE(msg.q().data().empty());
  EXPECT_TRUE(msg.cp().rank_lse().data().empty());
}

TEST(SnapshotCodecTest, MovingEncodeMovesBytesWithoutCopy) {
  Snapshot s = FullSnapshot();
  s.v_pages = Tensor(DType::kBF16, {3, 2, 4, 8 * 1024});
  const std::string expected(s.v_pages.bytes());
  const char* before = s.v_pages.bytes().data();

  v1::Snapshot msg;
  SnapshotToProto(std::move(s), &msg);
  EXPECT_EQ(msg.v_pages().data().data(), before);
  EXPECT_EQ(msg.v_pages().data(), expected);
  EXPECT_TRUE(s.v_pages.bytes().empty());  // NOLINT: moved-from on purpose
  EXPECT_EQ(msg.v_pages().dtype(), v1::DTYPE_BF16);
}

TEST(SnapshotCodecTest, DecodeWorksOnArenaMessages) {
  google::protobuf::Arena arena;
  auto* msg = google::protobuf::Arena::CreateMessage<v1::Snapshot>(&arena);
  const Snapshot original = FullSnapshot(7);
  SnapshotToProto(original, msg);
  absl::StatusOr<Snapshot> decoded = SnapshotFromProto(msg);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSnapshotEq(original, *decoded);
}

struct BadEnumCase {
  const char* expected_prefix;
  std::function<void(v1::Snapshot*)> corrupt;
};

TEST(SnapshotCodecTest, UnknownEnumValuesNameTheField) {
  const std::vector<BadEnumCase> cases = {
      {"kv_layout: unknown value 9",
       [](v1::Snapshot* m) { m->set_kv_layout(static_cast<v1::KvLayout>(9)); }},
      {"window_convention: unknown value 3",
       [](v1::Snapshot* m) {
         m->set_window_convention(static_cast<v1::SlidingWindowConvention>(3));
       }},
      {"rope.style: unknown value 7",
       [](v1::Snapshot* m) {
         m->mutable_rope()->set_style(static_cast<v1::RopeStyle>(7));
       }},
      {"rope.q_state: unknown value 3",
       [](v1::Snapshot* m) {
         m->mutable_rope()->set_q_state(static_cast<v1::RopeState>(3));
       }},
      {"rope.k_state: unknown value -1",
       [](v1::Snapshot* m) {
         m->mutable_rope()->set_k_state(static_cast<v1::RopeState>(-1));
       }},
      {"rope.scaling.type: unknown value 6",
       [](v1::Snapshot* m) {
         m->mutable_rope()->mutable_scaling()->set_type(
             static_cast<v1::RopeScalingType>(6));
       }},
      {"rope.cast_point: unknown value 4",
       [](v1::Snapshot* m) {
         m->mutable_rope()->set_cast_point(static_cast<v1::RopeCastPoint>(4));
       }},
      {"precision.profile: unknown value 6",
       [](v1::Snapshot* m) {
         m->mutable_precision()->set_profile(static_cast<v1::EngineProfile>(6));
       }},
      {"precision.score_dtype: unknown value 12",
       [](v1::Snapshot* m) {
         m->mutable_precision()->set_score_dtype(static_cast<v1::DType>(12));
       }},
      {"rope.q_output_dtype: unknown value 10",
       [](v1::Snapshot* m) {
         m->mutable_rope()->set_q_output_dtype(static_cast<v1::DType>(10));
       }},
      {"rope.k_output_dtype: unknown value 99",
       [](v1::Snapshot* m) {
         m->mutable_rope()->set_k_output_dtype(static_cast<v1::DType>(99));
       }},
      {"output_dtype: unknown value 12",
       [](v1::Snapshot* m) {
         m->set_output_dtype(static_cast<v1::DType>(12));
       }},
      {"cp.sharding: unknown value 5",
       [](v1::Snapshot* m) {
         m->mutable_cp()->set_sharding(static_cast<v1::CpSharding>(5));
       }},
      {"engine.lse_base: unknown value 10",
       [](v1::Snapshot* m) {
         m->mutable_engine()->set_lse_base(static_cast<v1::LseBase>(10));
       }},
      {"prefix.scheme: unknown value 3",
       [](v1::Snapshot* m) {
         m->mutable_prefix()->set_scheme(static_cast<v1::FingerprintScheme>(3));
       }},
      {"q.dtype: unknown value 10",
       [](v1::Snapshot* m) {
         m->mutable_q()->set_dtype(static_cast<v1::DType>(10));
       }},
      {"cp.rank_out.dtype: unknown value 42",
       [](v1::Snapshot* m) {
         m->mutable_cp()->mutable_rank_out()->set_dtype(
             static_cast<v1::DType>(42));
       }},
      {"engine.logprobs.dtype: unknown value 11",
       [](v1::Snapshot* m) {
         m->mutable_engine()->mutable_logprobs()->set_dtype(
             static_cast<v1::DType>(11));
       }},
      {"active_mask.dtype: must be set",
       [](v1::Snapshot* m) {
         m->mutable_active_mask()->set_dtype(v1::DTYPE_UNSPECIFIED);
       }},
      {"lm_head.shape: rank 9 is above",
       [](v1::Snapshot* m) {
         for (int i = 0; i < 7; ++i) m->mutable_lm_head()->add_shape(1);
       }},
  };
  for (const BadEnumCase& c : cases) {
    v1::Snapshot msg;
    SnapshotToProto(FullSnapshot(), &msg);
    c.corrupt(&msg);
    // Unknown enum values survive the wire (proto3 enums are open).
    v1::Snapshot received;
    ASSERT_TRUE(received.ParseFromString(msg.SerializeAsString()));
    absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&received);
    ASSERT_FALSE(decoded.ok()) << c.expected_prefix;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(decoded.status().message(), c.expected_prefix))
        << "got: " << decoded.status().message()
        << "\nwant prefix: " << c.expected_prefix;
  }
}

TEST(SnapshotCodecTest, ScalarTensorKeepsItsEmptyShape) {
  Snapshot s;
  s.k_scale = Tensor(DType::kF32, {});
  *s.k_scale.mutable_data<float>() = 0.5f;
  v1::Snapshot msg;
  SnapshotToProto(s, &msg);
  ASSERT_TRUE(msg.has_k_scale());
  EXPECT_EQ(msg.k_scale().shape_size(), 0);
  absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&msg);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_TRUE(decoded->k_scale.present());
  EXPECT_EQ(decoded->k_scale.rank(), 0);
  EXPECT_EQ(decoded->k_scale.FloatAt(0), 0.5f);
}

TEST(SnapshotCodecTest, EmptyTensorMessageIsAbsent) {
  v1::Snapshot msg;
  msg.mutable_sinks();  // set, but with nothing in it (JSON "sinks": {})
  absl::StatusOr<Snapshot> decoded = SnapshotFromProto(&msg);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(decoded->sinks.present());
}

}  // namespace
}  // namespace attnaudit
