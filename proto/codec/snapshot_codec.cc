// Snapshot <-> attnaudit.v1.Snapshot, and tensors. The decoder moves every
// tensor's bytes (std::string swap: the heap buffer changes owner, no copy).
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "proto/codec/codec.h"
#include "proto/codec/internal.h"
#include "proto/codec/tensor_paths.h"

namespace attnaudit {

using namespace codec_internal;  // NOLINT: the Encode*/Decode* family

absl::StatusOr<Tensor> TensorFromProto(v1::Tensor* msg,
                                       absl::string_view field) {
  ATTNAUDIT_ASSIGN_OR_RETURN(
      const DType dtype,
      DecodeDType(msg->dtype(), absl::StrCat(field, ".dtype")));
  if (dtype == DType::kInvalid) {
    // An empty message (e.g. "{}" in JSON) is the same as an unset field.
    if (msg->shape_size() == 0 && msg->data().empty()) return Tensor();
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dtype: must be set"));
  }
  if (msg->shape_size() > kMaxTensorRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: rank ", msg->shape_size(),
                     " is above the largest supported rank ", kMaxTensorRank));
  }
  std::vector<int64_t> shape(msg->shape().begin(), msg->shape().end());
  std::string bytes;
  msg->mutable_data()->swap(bytes);
  return Tensor(dtype, std::move(shape), std::move(bytes));
}

void TensorToProto(const Tensor& tensor, v1::Tensor* msg) {
  msg->set_dtype(EncodeDType(tensor.dtype()));
  msg->mutable_shape()->Assign(tensor.shape().begin(), tensor.shape().end());
  msg->set_data(tensor.bytes().data(), tensor.bytes().size());
}

void TensorToProto(Tensor&& tensor, v1::Tensor* msg) {
  msg->set_dtype(EncodeDType(tensor.dtype()));
  msg->mutable_shape()->Assign(tensor.shape().begin(), tensor.shape().end());
  std::string* data = msg->mutable_data();
  data->clear();
  data->swap(*tensor.mutable_bytes());
}

namespace codec_internal {

void EncodeLabels(const Labels& labels, v1::Labels* m) {
  m->set_model(labels.model);
  if (labels.layer >= 0) m->set_layer(labels.layer);
  m->set_engine(labels.engine);
  m->set_backend(labels.backend);
  if (labels.step >= 0) m->set_step(labels.step);
  for (const std::string& id : labels.request_ids) m->add_request_ids(id);
  m->set_run(labels.run);
  m->set_role(EncodeSnapshotRole(labels.role));
  m->set_weight_version(labels.weight_version);
}

absl::Status DecodeLabels(const v1::Labels& m, Labels* labels) {
  labels->model = m.model();
  labels->layer = m.has_layer() ? m.layer() : -1;
  labels->engine = m.engine();
  labels->backend = m.backend();
  labels->step = m.has_step() ? m.step() : -1;
  labels->request_ids.assign(m.request_ids().begin(), m.request_ids().end());
  labels->run = m.run();
  ATTNAUDIT_ASSIGN_OR_RETURN(labels->role,
                             DecodeSnapshotRole(m.role(), "labels.role"));
  labels->weight_version = m.weight_version();
  return absl::OkStatus();
}

}  // namespace codec_internal

namespace {

// Zero on the wire means "the default"; see snapshot.proto.
double OrDefault(double value, double fallback) {
  return value == 0.0 ? fallback : value;
}
int64_t OrDefault(int64_t value, int64_t fallback) {
  return value == 0 ? fallback : value;
}

absl::Status DecodeRope(const v1::RopeConfig& m, RopeConfig* rope) {
  ATTNAUDIT_ASSIGN_OR_RETURN(rope->q_state,
                             DecodeRopeState(m.q_state(), "rope.q_state"));
  ATTNAUDIT_ASSIGN_OR_RETURN(rope->k_state,
                             DecodeRopeState(m.k_state(), "rope.k_state"));
  ATTNAUDIT_ASSIGN_OR_RETURN(rope->style,
                             DecodeRopeStyle(m.style(), "rope.style"));
  rope->theta = OrDefault(m.theta(), 10000.0);
  rope->rotary_dim = m.rotary_dim();
  const v1::RopeScaling& s = m.scaling();
  RopeScaling& scaling = rope->scaling;
  ATTNAUDIT_ASSIGN_OR_RETURN(
      scaling.type, DecodeRopeScalingType(s.type(), "rope.scaling.type"));
  scaling.factor = OrDefault(s.factor(), 1.0);
  scaling.low_freq_factor = OrDefault(s.low_freq_factor(), 1.0);
  scaling.high_freq_factor = OrDefault(s.high_freq_factor(), 4.0);
  scaling.original_max_position =
      OrDefault(s.original_max_position(), int64_t{8192});
  scaling.beta_fast = OrDefault(s.beta_fast(), 32.0);
  scaling.beta_slow = OrDefault(s.beta_slow(), 1.0);
  scaling.attention_factor = s.attention_factor();
  scaling.truncate = !s.no_truncate();
  scaling.sequence_length = s.sequence_length();
  // Bounded here, before the copy; validation then wants exactly
  // rotary_dim / 2 of each.
  for (const auto& [field, from, to] :
       {std::tuple{"rope.scaling.short_factor", &s.short_factor(),
                   &scaling.short_factor},
        std::tuple{"rope.scaling.long_factor", &s.long_factor(),
                   &scaling.long_factor}}) {
    if (static_cast<size_t>(from->size()) > kMaxRopeFactorEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": at most ", kMaxRopeFactorEntries,
                       " entries, got ", from->size()));
    }
    to->assign(from->begin(), from->end());
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(
      rope->cast_point, DecodeRopeCastPoint(m.cast_point(), "rope.cast_point"));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      rope->q_output_dtype,
      DecodeDType(m.q_output_dtype(), "rope.q_output_dtype"));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      rope->k_output_dtype,
      DecodeDType(m.k_output_dtype(), "rope.k_output_dtype"));
  return absl::OkStatus();
}

void EncodeRope(const RopeConfig& rope, v1::RopeConfig* m) {
  m->set_q_state(EncodeRopeState(rope.q_state));
  m->set_k_state(EncodeRopeState(rope.k_state));
  m->set_style(EncodeRopeStyle(rope.style));
  m->set_theta(rope.theta);
  m->set_rotary_dim(rope.rotary_dim);
  v1::RopeScaling* s = m->mutable_scaling();
  s->set_type(EncodeRopeScalingType(rope.scaling.type));
  s->set_factor(rope.scaling.factor);
  s->set_low_freq_factor(rope.scaling.low_freq_factor);
  s->set_high_freq_factor(rope.scaling.high_freq_factor);
  s->set_original_max_position(rope.scaling.original_max_position);
  s->set_beta_fast(rope.scaling.beta_fast);
  s->set_beta_slow(rope.scaling.beta_slow);
  s->set_attention_factor(rope.scaling.attention_factor);
  s->set_no_truncate(!rope.scaling.truncate);
  s->set_sequence_length(rope.scaling.sequence_length);
  s->mutable_short_factor()->Assign(rope.scaling.short_factor.begin(),
                                    rope.scaling.short_factor.end());
  s->mutable_long_factor()->Assign(rope.scaling.long_factor.begin(),
                                   rope.scaling.long_factor.end());
  m->set_cast_point(EncodeRopeCastPoint(rope.cast_point));
  m->set_q_output_dtype(EncodeDType(rope.q_output_dtype));
  m->set_k_output_dtype(EncodeDType(rope.k_output_dtype));
}

}  // namespace

// Everything but the tensors.
void codec_internal::EncodeScalars(const Snapshot& s, v1::Snapshot* m) {
  m->set_kv_layout(EncodeKvLayout(s.kv_layout));
  m->set_softmax_scale(s.softmax_scale);
  m->set_sliding_window(s.sliding_window);
  m->set_window_convention(EncodeWindowConvention(s.window_convention));
  m->set_logit_softcap(s.logit_softcap);
  m->set_engine_lse_includes_sinks(s.engine_lse_includes_sinks);
  EncodeRope(s.rope, m->mutable_rope());
  m->set_output_dtype(EncodeDType(s.output_dtype));

  v1::ContextParallel* cp = m->mutable_cp();
  cp->set_world_size(s.cp.world_size);
  cp->set_sharding(EncodeCpSharding(s.cp.sharding));
  cp->set_interleave_size(s.cp.interleave_size);

  m->mutable_engine()->set_lse_base(EncodeLseBase(s.engine.lse_base));
  v1::EnginePrecision* precision = m->mutable_precision();
  precision->set_profile(EncodeEngineProfile(s.precision.profile));
  precision->set_score_dtype(EncodeDType(s.precision.score_dtype));
  precision->set_probability_dtype(EncodeDType(s.precision.probability_dtype));
  precision->set_exp_ulps(s.precision.exp_ulps);
  precision->set_split_keys(s.precision.split_keys);
  precision->set_score_rounding(EncodeRounding(s.precision.score_rounding));
  precision->set_probability_rounding(
      EncodeRounding(s.precision.probability_rounding));
  precision->set_output_rounding(EncodeRounding(s.precision.output_rounding));
  precision->set_rope_rounding(EncodeRounding(s.precision.rope_rounding));
  precision->set_source(EncodePrecisionSource(s.precision.source));
  precision->set_evidence(s.precision.evidence);
  m->set_logprob_temperature(s.logprob_temperature);

  v1::PrefixCache* prefix = m->mutable_prefix();
  prefix->set_enabled(s.prefix.enabled);
  prefix->set_key(s.prefix.key);
  prefix->set_length(s.prefix.length);
  prefix->set_fingerprint(s.prefix.fingerprint);
  prefix->set_scheme(EncodeFingerprintScheme(s.prefix.scheme));

  EncodeLabels(s.labels, m->mutable_labels());
}

namespace {

absl::Status DecodePrecisionRounding(const v1::EnginePrecision& m,
                                     EnginePrecision* p) {
  ATTNAUDIT_ASSIGN_OR_RETURN(
      p->score_rounding,
      DecodeRounding(m.score_rounding(), "precision.score_rounding"));
  ATTNAUDIT_ASSIGN_OR_RETURN(p->probability_rounding,
                             DecodeRounding(m.probability_rounding(),
                                            "precision.probability_rounding"));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      p->output_rounding,
      DecodeRounding(m.output_rounding(), "precision.output_rounding"));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      p->rope_rounding,
      DecodeRounding(m.rope_rounding(), "precision.rope_rounding"));
  return absl::OkStatus();
}

absl::Status DecodeScalars(const v1::Snapshot& m, Snapshot* s) {
  ATTNAUDIT_ASSIGN_OR_RETURN(s->kv_layout,
                             DecodeKvLayout(m.kv_layout(), "kv_layout"));
  s->softmax_scale = m.softmax_scale();
  s->sliding_window = m.sliding_window();
  ATTNAUDIT_ASSIGN_OR_RETURN(
      s->window_convention,
      DecodeWindowConvention(m.window_convention(), "window_convention"));
  s->logit_softcap = m.logit_softcap();
  s->engine_lse_includes_sinks = m.engine_lse_includes_sinks();
  ATTNAUDIT_RETURN_IF_ERROR(DecodeRope(m.rope(), &s->rope));
  ATTNAUDIT_ASSIGN_OR_RETURN(s->output_dtype,
                             DecodeDType(m.output_dtype(), "output_dtype"));

  const v1::ContextParallel& cp = m.cp();
  s->cp.world_size = OrDefault(cp.world_size(), int64_t{1});
  ATTNAUDIT_ASSIGN_OR_RETURN(s->cp.sharding,
                             DecodeCpSharding(cp.sharding(), "cp.sharding"));
  s->cp.interleave_size = OrDefault(cp.interleave_size(), int64_t{1});

  ATTNAUDIT_ASSIGN_OR_RETURN(
      s->engine.lse_base,
      DecodeLseBase(m.engine().lse_base(), "engine.lse_base"));
  const v1::EnginePrecision& precision = m.precision();
  ATTNAUDIT_ASSIGN_OR_RETURN(
      s->precision.profile,
      DecodeEngineProfile(precision.profile(), "precision.profile"));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      s->precision.score_dtype,
      DecodeDType(precision.score_dtype(), "precision.score_dtype"));
  ATTNAUDIT_ASSIGN_OR_RETURN(s->precision.probability_dtype,
                             DecodeDType(precision.probability_dtype(),
                                         "precision.probability_dtype"));
  s->precision.exp_ulps = precision.exp_ulps();
  s->precision.split_keys = precision.split_keys();
  ATTNAUDIT_RETURN_IF_ERROR(DecodePrecisionRounding(precision, &s->precision));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      s->precision.source,
      DecodePrecisionSource(precision.source(), "precision.source"));
  s->precision.evidence = precision.evidence();
  s->logprob_temperature = OrDefault(m.logprob_temperature(), 1.0);

  const v1::PrefixCache& prefix = m.prefix();
  s->prefix.enabled = prefix.enabled();
  s->prefix.key = prefix.key();
  s->prefix.length = prefix.length();
  s->prefix.fingerprint = prefix.fingerprint();
  ATTNAUDIT_ASSIGN_OR_RETURN(
      s->prefix.scheme,
      DecodeFingerprintScheme(prefix.scheme(), "prefix.scheme"));

  return DecodeLabels(m.labels(), &s->labels);
}

}  // namespace

absl::StatusOr<Snapshot> SnapshotFromProto(v1::Snapshot* msg) {
  Snapshot snapshot;
  // Scalars first: they fail without touching the message's bytes.
  ATTNAUDIT_RETURN_IF_ERROR(DecodeScalars(*msg, &snapshot));
  for (absl::string_view path : SnapshotTensorPaths()) {
    if (FindSnapshotTensor(*msg, path) == nullptr) continue;  // absent
    ATTNAUDIT_ASSIGN_OR_RETURN(
        *MutableSnapshotTensor(&snapshot, path),
        TensorFromProto(MutableSnapshotTensor(msg, path), path));
  }
  return snapshot;
}

void SnapshotToProto(const Snapshot& snapshot, v1::Snapshot* msg) {
  msg->Clear();
  for (absl::string_view path : SnapshotTensorPaths()) {
    const Tensor* tensor = FindSnapshotTensor(snapshot, path);
    if (tensor->present()) {
      TensorToProto(*tensor, MutableSnapshotTensor(msg, path));
    }
  }
  EncodeScalars(snapshot, msg);
}

void SnapshotToProto(Snapshot&& snapshot, v1::Snapshot* msg) {
  msg->Clear();
  for (absl::string_view path : SnapshotTensorPaths()) {
    Tensor* tensor = MutableSnapshotTensor(&snapshot, path);
    if (tensor->present()) {
      TensorToProto(std::move(*tensor), MutableSnapshotTensor(msg, path));
    }
  }
  EncodeScalars(snapshot, msg);
}

}  // namespace attnaudit
