// AuditReport <-> attnaudit.v1.AuditReport and AuditOptions <->
// attnaudit.v1.AuditOptions.
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "proto/codec/codec.h"
#include "proto/codec/internal.h"

namespace attnaudit {

using namespace codec_internal;  // NOLINT: the Encode*/Decode* family

// ---- Audit options ---------------------------------------------------------

absl::Status AuditOptionsFromProto(const v1::AuditOptions& msg,
                                   AuditOptions* options) {
  // Decode into locals first so that *options is untouched on error.
  bool wanted[kNumComparisons] = {false, false, false, false};
  if (msg.comparisons_size() == 0) {
    for (bool& w : wanted) w = true;
  }
  for (int i = 0; i < msg.comparisons_size(); ++i) {
    ATTNAUDIT_ASSIGN_OR_RETURN(
        const Comparison c,
        DecodeComparison(msg.comparisons(i),
                         absl::StrCat("comparisons[", i, "]")));
    wanted[static_cast<int>(c)] = true;
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(
      const CpStrategy strategy,
      DecodeCpStrategy(msg.cp_strategy(), "cp_strategy"));
  if (msg.has_worst_heads() && msg.worst_heads() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worst_heads: must be >= 0, got ", msg.worst_heads()));
  }
  if (!(msg.diagnosis_max_seconds() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("diagnosis_max_seconds: must be >= 0 (0: the default), "
                     "got ",
                     msg.diagnosis_max_seconds()));
  }
  const v1::ToleranceOverrides& t = msg.tolerances();
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"tolerances.out_abs", t.out_abs()},
        {"tolerances.lse_abs", t.lse_abs()},
        {"tolerances.logprob_abs", t.logprob_abs()}}) {
    if (!(std::isfinite(value) && value >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ": must be finite and >= 0 (0 keeps the "
                       "policy), got ",
                       value));
    }
  }

  options->engine_vs_reference =
      wanted[static_cast<int>(Comparison::kEngineVsReference)];
  options->replay_vs_reference =
      wanted[static_cast<int>(Comparison::kReplayVsReference)];
  options->engine_vs_replay =
      wanted[static_cast<int>(Comparison::kEngineVsReplay)];
  options->engine_vs_emulation =
      wanted[static_cast<int>(Comparison::kEngineVsEmulation)];
  options->tolerances.out_abs = t.out_abs();
  options->tolerances.lse_abs = t.lse_abs();
  options->tolerances.logprob_abs = t.logprob_abs();
  options->cp_strategy = strategy;
  options->include_merge_orders =
      msg.has_include_merge_orders() ? msg.include_merge_orders() : true;
  options->compute_kv_fingerprint = msg.compute_kv_fingerprint();
  options->worst_heads = msg.has_worst_heads() ? msg.worst_heads() : 4;
  options->statistical_test =
      msg.has_statistical_test() ? msg.statistical_test() : true;
  options->diagnose = msg.has_diagnose() ? msg.diagnose() : true;
  options->diagnosis_max_seconds = msg.diagnosis_max_seconds() > 0
                                       ? msg.diagnosis_max_seconds()
                                       : AuditOptions().diagnosis_max_seconds;
  return absl::OkStatus();
}

absl::StatusOr<AuditOptions> AuditOptionsFromProto(
    const v1::AuditOptions& msg) {
  AuditOptions options;
  ATTNAUDIT_RETURN_IF_ERROR(AuditOptionsFromProto(msg, &options));
  return options;
}

void AuditOptionsToProto(const AuditOptions& options, v1::AuditOptions* msg) {
  msg->Clear();
  if (options.engine_vs_reference) {
    msg->add_comparisons(v1::COMPARISON_ENGINE_VS_REFERENCE);
  }
  if (options.replay_vs_reference) {
    msg->add_comparisons(v1::COMPARISON_REPLAY_VS_REFERENCE);
  }
  if (options.engine_vs_replay) {
    msg->add_comparisons(v1::COMPARISON_ENGINE_VS_REPLAY);
  }
  if (options.engine_vs_emulation) {
    msg->add_comparisons(v1::COMPARISON_ENGINE_VS_EMULATION);
  }
  v1::ToleranceOverrides* t = msg->mutable_tolerances();
  t->set_out_abs(options.tolerances.out_abs);
  t->set_lse_abs(options.tolerances.lse_abs);
  t->set_logprob_abs(options.tolerances.logprob_abs);
  msg->set_cp_strategy(EncodeCpStrategy(options.cp_strategy));
  msg->set_include_merge_orders(options.include_merge_orders);
  msg->set_compute_kv_fingerprint(options.compute_kv_fingerprint);
  msg->set_worst_heads(options.worst_heads);
  msg->set_statistical_test(options.statistical_test);
  msg->set_diagnose(options.diagnose);
  if (options.diagnosis_max_seconds > 0) {
    msg->set_diagnosis_max_seconds(options.diagnosis_max_seconds);
  }
}

void ValidationLimitsToProto(const ValidationLimits& limits, v1::Limits* msg) {
  msg->set_max_tensor_bytes(limits.max_tensor_bytes);
  msg->set_max_batch(limits.max_batch);
  msg->set_max_queries(limits.max_queries);
  msg->set_max_heads(limits.max_heads);
  msg->set_max_head_dim(limits.max_head_dim);
  msg->set_max_page_size(limits.max_page_size);
  msg->set_max_blocks(limits.max_blocks);
  msg->set_max_context(limits.max_context);
  msg->set_max_cp_world_size(limits.max_cp_world_size);
  msg->set_max_vocab(limits.max_vocab);
}

// ---- Reports ---------------------------------------------------------------

namespace {

void EncodeDrift(const DriftStats& d, v1::DriftStats* m) {
  m->set_count(d.count);
  m->set_max_abs(d.max_abs);
  m->set_mean_abs(d.mean_abs);
  m->set_rms(d.rms);
  m->set_max_rel(d.max_rel);
  m->set_p99_abs(d.p99_abs);
  m->set_ulp_dtype(EncodeDType(d.ulp_dtype));
  m->set_max_ulp(d.max_ulp);
  m->set_mean_ulp(d.mean_ulp);
  m->set_tolerance(d.tolerance);
  m->set_over_tolerance(d.over_tolerance);
  m->set_candidate_nan(d.candidate_nan);
  m->set_candidate_inf(d.candidate_inf);
  m->set_baseline_nan(d.baseline_nan);
  m->set_baseline_inf(d.baseline_inf);
  v1::Location* w = m->mutable_worst();
  w->set_batch(d.worst.batch);
  w->set_query(d.worst.query);
  w->set_head(d.worst.head);
  w->set_dim(d.worst.dim);
  m->set_worst_candidate(d.worst_candidate);
  m->set_worst_baseline(d.worst_baseline);
  m->set_nonfinite_mismatch(d.nonfinite_mismatch);
  if (d.nonfinite_mismatch > 0) {
    v1::Location* f = m->mutable_first_nonfinite_mismatch();
    f->set_batch(d.first_nonfinite_mismatch.batch);
    f->set_query(d.first_nonfinite_mismatch.query);
    f->set_head(d.first_nonfinite_mismatch.head);
    f->set_dim(d.first_nonfinite_mismatch.dim);
  }
}

absl::Status DecodeDrift(const v1::DriftStats& m, absl::string_view field,
                         DriftStats* d) {
  d->count = m.count();
  d->max_abs = m.max_abs();
  d->mean_abs = m.mean_abs();
  d->rms = m.rms();
  d->max_rel = m.max_rel();
  d->p99_abs = m.p99_abs();
  ATTNAUDIT_ASSIGN_OR_RETURN(
      d->ulp_dtype,
      DecodeDType(m.ulp_dtype(), absl::StrCat(field, ".ulp_dtype")));
  d->max_ulp = m.max_ulp();
  d->mean_ulp = m.mean_ulp();
  d->tolerance = m.tolerance();
  d->over_tolerance = m.over_tolerance();
  d->candidate_nan = m.candidate_nan();
  d->candidate_inf = m.candidate_inf();
  d->baseline_nan = m.baseline_nan();
  d->baseline_inf = m.baseline_inf();
  // An unset location is "nowhere" (-1), not element 0.
  if (m.has_worst()) {
    d->worst.batch = m.worst().batch();
    d->worst.query = m.worst().query();
    d->worst.head = m.worst().head();
    d->worst.dim = m.worst().dim();
  } else {
    d->worst = Location();
  }
  d->worst_candidate = m.worst_candidate();
  d->worst_baseline = m.worst_baseline();
  d->nonfinite_mismatch = m.nonfinite_mismatch();
  if (m.has_first_nonfinite_mismatch()) {
    const v1::Location& f = m.first_nonfinite_mismatch();
    d->first_nonfinite_mismatch = {f.batch(), f.query(), f.head(), f.dim()};
  } else {
    d->first_nonfinite_mismatch = Location();
  }
  return absl::OkStatus();
}

void EncodeAgreement(const LogprobAgreement& a, v1::LogprobAgreement* m) {
  m->set_count(a.count);
  m->set_mean_abs_diff(a.mean_abs_diff);
  m->set_max_abs_diff(a.max_abs_diff);
  m->set_k1_kl(a.k1_kl);
  m->set_k3_kl(a.k3_kl);
  m->set_ratio_mean(a.ratio_mean);
  m->set_ratio_min(a.ratio_min);
  m->set_ratio_max(a.ratio_max);
  m->set_ratio_std(a.ratio_std);
}

void DecodeAgreement(const v1::LogprobAgreement& m, LogprobAgreement* a) {
  a->count = m.count();
  a->mean_abs_diff = m.mean_abs_diff();
  a->max_abs_diff = m.max_abs_diff();
  a->k1_kl = m.k1_kl();
  a->k3_kl = m.k3_kl();
  a->ratio_mean = m.ratio_mean();
  a->ratio_min = m.ratio_min();
  a->ratio_max = m.ratio_max();
  a->ratio_std = m.ratio_std();
}

void EncodeLocation(const Location& l, v1::Location* m) {
  m->set_batch(l.batch);
  m->set_query(l.query);
  m->set_head(l.head);
  m->set_dim(l.dim);
}

void EncodeStatistical(const StatisticalResult& st, v1::StatisticalResult* m) {
  m->set_noise_epsilon(st.noise_epsilon);
  m->set_clean_rms(st.clean_rms);
  m->set_groups(st.groups);
  m->set_fired_groups(st.fired_groups);
  for (const StatisticalGroup& g : st.worst) {
    v1::StatisticalGroup* gm = m->add_worst();
    gm->set_scope(g.scope);
    EncodeLocation(g.where, gm->mutable_where());
    gm->set_count(g.count);
    gm->set_rms(g.rms);
    gm->set_mean(g.mean);
    gm->set_bias(g.bias);
    gm->set_rms_limit(g.rms_limit);
    gm->set_mean_limit(g.mean_limit);
    gm->set_fired(g.fired);
  }
}

void DecodeStatistical(const v1::StatisticalResult& m, StatisticalResult* st) {
  st->computed = true;
  st->noise_epsilon = m.noise_epsilon();
  st->clean_rms = m.clean_rms();
  st->groups = m.groups();
  st->fired_groups = m.fired_groups();
  st->worst.clear();
  for (const v1::StatisticalGroup& gm : m.worst()) {
    StatisticalGroup g;
    g.scope = gm.scope();
    if (gm.has_where()) {
      g.where = {gm.where().batch(), gm.where().query(), gm.where().head(),
                 gm.where().dim()};
    }
    g.count = gm.count();
    g.rms = gm.rms();
    g.mean = gm.mean();
    g.bias = gm.bias();
    g.rms_limit = gm.rms_limit();
    g.mean_limit = gm.mean_limit();
    g.fired = gm.fired();
    st->worst.push_back(std::move(g));
  }
}

void EncodeComparisonResult(const ComparisonResult& r,
                            v1::ComparisonResult* m) {
  m->set_comparison(codec_internal::EncodeComparison(r.comparison));
  m->set_verdict(EncodeVerdict(r.verdict));
  if (r.has_out) EncodeDrift(r.out, m->mutable_out());
  if (r.has_lse) EncodeDrift(r.lse, m->mutable_lse());
  if (r.has_logprob) EncodeDrift(r.logprob, m->mutable_logprob());
  if (r.logprob_agreement.count > 0) {
    EncodeAgreement(r.logprob_agreement, m->mutable_logprob_agreement());
  }
  for (const HeadSummary& h : r.worst_heads) {
    v1::HeadSummary* hm = m->add_worst_heads();
    hm->set_head(h.head);
    hm->set_max_abs(h.max_abs);
    hm->set_mean_abs(h.mean_abs);
    hm->set_max_ulp(h.max_ulp);
  }
  for (const std::string& reason : r.reasons) m->add_reasons(reason);
  if (r.has_statistical) {
    EncodeStatistical(r.statistical, m->mutable_statistical());
  }
}

absl::Status DecodeComparisonResult(const v1::ComparisonResult& m,
                                    const std::string& field,
                                    ComparisonResult* r) {
  ATTNAUDIT_ASSIGN_OR_RETURN(
      r->comparison,
      DecodeComparison(m.comparison(), absl::StrCat(field, ".comparison")));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      r->verdict, DecodeVerdict(m.verdict(), absl::StrCat(field, ".verdict")));
  r->has_out = m.has_out();
  if (r->has_out) {
    ATTNAUDIT_RETURN_IF_ERROR(
        DecodeDrift(m.out(), absl::StrCat(field, ".out"), &r->out));
  }
  r->has_lse = m.has_lse();
  if (r->has_lse) {
    ATTNAUDIT_RETURN_IF_ERROR(
        DecodeDrift(m.lse(), absl::StrCat(field, ".lse"), &r->lse));
  }
  r->has_logprob = m.has_logprob();
  if (r->has_logprob) {
    ATTNAUDIT_RETURN_IF_ERROR(
        DecodeDrift(m.logprob(), absl::StrCat(field, ".logprob"), &r->logprob));
  }
  DecodeAgreement(m.logprob_agreement(), &r->logprob_agreement);
  r->worst_heads.clear();
  for (const v1::HeadSummary& hm : m.worst_heads()) {
    HeadSummary h;
    h.head = hm.head();
    h.max_abs = hm.max_abs();
    h.mean_abs = hm.mean_abs();
    h.max_ulp = hm.max_ulp();
    r->worst_heads.push_back(h);
  }
  r->reasons.assign(m.reasons().begin(), m.reasons().end());
  r->has_statistical = m.has_statistical();
  if (r->has_statistical) DecodeStatistical(m.statistical(), &r->statistical);
  return absl::OkStatus();
}

void EncodeEvidence(const DiagnosisEvidence& e, v1::DiagnosisEvidence* m) {
  m->set_out_max_abs(e.out_max_abs);
  m->set_out_rms_noise(e.out_rms_noise);
  m->set_lse_max_abs(e.lse_max_abs);
}

DiagnosisEvidence DecodeEvidence(const v1::DiagnosisEvidence& m) {
  return {m.out_max_abs(), m.out_rms_noise(), m.lse_max_abs()};
}

void EncodeDiagnoses(const AuditReport& r, v1::AuditReport* msg) {
  for (const Diagnosis& d : r.diagnoses) {
    v1::Diagnosis* m = msg->add_diagnoses();
    m->set_hypothesis(d.hypothesis);
    m->set_detail(d.detail);
    m->set_score(d.score);
    m->set_explains(d.explains);
    EncodeEvidence(d.before, m->mutable_before());
    EncodeEvidence(d.after, m->mutable_after());
    v1::DiagnosisLocation* l = m->mutable_location();
    l->set_row(d.location.row);
    l->set_query(d.location.query);
    l->mutable_heads()->Assign(d.location.heads.begin(),
                               d.location.heads.end());
    l->set_logical_block(d.location.logical_block);
    l->set_page(d.location.page);
    l->set_other_logical_block(d.location.other_logical_block);
    l->set_other_page(d.location.other_page);
    l->set_cp_rank(d.location.cp_rank);
    m->set_summary(d.summary);
  }
  if (r.diagnosis_run.ran || !r.diagnosis_run.note.empty()) {
    v1::DiagnosisRun* run = msg->mutable_diagnosis_run();
    run->set_ran(r.diagnosis_run.ran);
    run->set_complete(r.diagnosis_run.complete);
    run->set_hypotheses(r.diagnosis_run.hypotheses);
    run->set_rows(r.diagnosis_run.rows);
    run->set_note(r.diagnosis_run.note);
  }
}

void DecodeDiagnoses(const v1::AuditReport& msg, AuditReport* r) {
  for (const v1::Diagnosis& m : msg.diagnoses()) {
    Diagnosis d;
    d.hypothesis = m.hypothesis();
    d.detail = m.detail();
    d.score = m.score();
    d.explains = m.explains();
    d.before = DecodeEvidence(m.before());
    d.after = DecodeEvidence(m.after());
    if (m.has_location()) {
      const v1::DiagnosisLocation& l = m.location();
      d.location.row = l.row();
      d.location.query = l.query();
      d.location.heads.assign(l.heads().begin(), l.heads().end());
      d.location.logical_block = l.logical_block();
      d.location.page = l.page();
      d.location.other_logical_block = l.other_logical_block();
      d.location.other_page = l.other_page();
      d.location.cp_rank = l.cp_rank();
    }
    d.summary = m.summary();
    r->diagnoses.push_back(std::move(d));
  }
  const v1::DiagnosisRun& run = msg.diagnosis_run();
  r->diagnosis_run.ran = run.ran();
  r->diagnosis_run.complete = run.complete();
  r->diagnosis_run.hypotheses = run.hypotheses();
  r->diagnosis_run.rows = run.rows();
  r->diagnosis_run.note = run.note();
}

void EncodeRopeChecks(const AuditReport& r, v1::AuditReport* msg) {
  for (const RopeCheckResult& c : r.rope_checks) {
    v1::RopeCheck* m = msg->add_rope_checks();
    m->set_what(c.what);
    m->set_verdict(EncodeVerdict(c.verdict));
    m->set_count(c.count);
    m->set_mismatches(c.mismatches);
    m->set_max_abs(c.max_abs);
    m->set_max_ulp(c.max_ulp);
    m->set_max_angle_error(c.max_angle_error);
    m->set_tolerance(c.tolerance);
    EncodeLocation(c.worst, m->mutable_worst());
    for (const std::string& reason : c.reasons) m->add_reasons(reason);
  }
}

absl::Status DecodeRopeChecks(const v1::AuditReport& msg, AuditReport* r) {
  for (int i = 0; i < msg.rope_checks_size(); ++i) {
    const v1::RopeCheck& m = msg.rope_checks(i);
    RopeCheckResult c;
    c.what = m.what();
    ATTNAUDIT_ASSIGN_OR_RETURN(
        c.verdict, DecodeVerdict(m.verdict(),
                                 absl::StrCat("rope_checks[", i, "].verdict")));
    c.count = m.count();
    c.mismatches = m.mismatches();
    c.max_abs = m.max_abs();
    c.max_ulp = m.max_ulp();
    c.max_angle_error = m.max_angle_error();
    c.tolerance = m.tolerance();
    c.worst = {m.worst().batch(), m.worst().query(), m.worst().head(),
               m.worst().dim()};
    c.reasons.assign(m.reasons().begin(), m.reasons().end());
    r->rope_checks.push_back(std::move(c));
  }
  return absl::OkStatus();
}

void EncodeProvenance(const Provenance& p, v1::Provenance* m) {
  m->set_backend(p.backend);
  m->set_threads(p.threads);
  m->set_softmax_scale(p.softmax_scale);
  m->set_output_dtype(EncodeDType(p.output_dtype));
  m->set_max_merged_blocks(p.max_merged_blocks);
  for (const auto& sequence : p.merge_orders) {
    v1::SequenceMergeOrders* sm = m->add_merge_orders();
    for (const auto& query : sequence) {
      sm->add_queries()->mutable_logical_blocks()->Assign(query.begin(),
                                                          query.end());
    }
  }
  for (const auto& owners : p.block_owners) {
    m->add_block_owners()->mutable_ranks()->Assign(owners.begin(),
                                                   owners.end());
  }
  m->set_kv_fingerprint(p.kv_fingerprint);
  m->set_prefix_fingerprint(p.prefix_fingerprint);
  m->set_rope_fingerprint(p.rope_fingerprint);
  m->set_fingerprint_version(p.fingerprint_version);
  m->set_prefix_fingerprint_scheme(p.prefix_fingerprint_scheme);
  m->set_engine_profile(p.engine_profile);
  m->set_rope_source(p.rope_source);
  m->set_precision_source(p.precision_source);
  m->set_precision_evidence(p.precision_evidence);
  for (const std::string& line : p.sensitivity) m->add_sensitivity(line);
  v1::StageTimings* t = m->mutable_timings();
  t->set_validate_seconds(p.timings.validate_seconds);
  t->set_reference_seconds(p.timings.reference_seconds);
  t->set_replay_seconds(p.timings.replay_seconds);
  t->set_compare_seconds(p.timings.compare_seconds);
  t->set_total_seconds(p.timings.total_seconds);
  t->set_cp_seconds(p.timings.cp_seconds);
  t->mutable_cp_rank_compute_seconds()->Assign(
      p.timings.cp_rank_compute_seconds.begin(),
      p.timings.cp_rank_compute_seconds.end());
  t->mutable_cp_rank_transport_seconds()->Assign(
      p.timings.cp_rank_transport_seconds.begin(),
      p.timings.cp_rank_transport_seconds.end());
  t->set_diagnosis_seconds(p.timings.diagnosis_seconds);
}

absl::Status DecodeProvenance(const v1::Provenance& m, Provenance* p) {
  p->backend = m.backend();
  p->threads = m.threads();
  p->softmax_scale = m.softmax_scale();
  ATTNAUDIT_ASSIGN_OR_RETURN(
      p->output_dtype,
      DecodeDType(m.output_dtype(), "provenance.output_dtype"));
  p->max_merged_blocks = m.max_merged_blocks();
  p->merge_orders.clear();
  p->merge_orders.reserve(m.merge_orders_size());
  for (const v1::SequenceMergeOrders& sm : m.merge_orders()) {
    auto& sequence = p->merge_orders.emplace_back();
    sequence.reserve(sm.queries_size());
    for (const v1::BlockOrder& order : sm.queries()) {
      sequence.emplace_back(order.logical_blocks().begin(),
                            order.logical_blocks().end());
    }
  }
  p->block_owners.clear();
  p->block_owners.reserve(m.block_owners_size());
  for (const v1::BlockOwners& owners : m.block_owners()) {
    p->block_owners.emplace_back(owners.ranks().begin(), owners.ranks().end());
  }
  p->kv_fingerprint = m.kv_fingerprint();
  p->prefix_fingerprint = m.prefix_fingerprint();
  p->rope_fingerprint = m.rope_fingerprint();
  p->fingerprint_version = m.fingerprint_version();
  p->prefix_fingerprint_scheme = m.prefix_fingerprint_scheme();
  p->engine_profile = m.engine_profile();
  p->rope_source = m.rope_source();
  p->precision_source = m.precision_source();
  p->precision_evidence = m.precision_evidence();
  p->sensitivity.assign(m.sensitivity().begin(), m.sensitivity().end());
  const v1::StageTimings& t = m.timings();
  p->timings.validate_seconds = t.validate_seconds();
  p->timings.reference_seconds = t.reference_seconds();
  p->timings.replay_seconds = t.replay_seconds();
  p->timings.compare_seconds = t.compare_seconds();
  p->timings.total_seconds = t.total_seconds();
  p->timings.cp_seconds = t.cp_seconds();
  p->timings.cp_rank_compute_seconds.assign(t.cp_rank_compute_seconds().begin(),
                                            t.cp_rank_compute_seconds().end());
  p->timings.cp_rank_transport_seconds.assign(
      t.cp_rank_transport_seconds().begin(),
      t.cp_rank_transport_seconds().end());
  p->timings.diagnosis_seconds = t.diagnosis_seconds();
  return absl::OkStatus();
}

void EncodeCpCheck(const CpCheck& c, v1::CpCheck* m) {
  m->set_verdict(EncodeVerdict(c.verdict));
  if (c.has_out) EncodeDrift(c.out, m->mutable_out());
  if (c.has_lse) EncodeDrift(c.lse, m->mutable_lse());
  for (const std::string& reason : c.reasons) m->add_reasons(reason);
}

absl::Status DecodeCpCheck(const v1::CpCheck& m, const std::string& field,
                           CpCheck* c) {
  ATTNAUDIT_ASSIGN_OR_RETURN(
      c->verdict, DecodeVerdict(m.verdict(), absl::StrCat(field, ".verdict")));
  c->has_out = m.has_out();
  if (c->has_out) {
    ATTNAUDIT_RETURN_IF_ERROR(
        DecodeDrift(m.out(), absl::StrCat(field, ".out"), &c->out));
  }
  c->has_lse = m.has_lse();
  if (c->has_lse) {
    ATTNAUDIT_RETURN_IF_ERROR(
        DecodeDrift(m.lse(), absl::StrCat(field, ".lse"), &c->lse));
  }
  c->reasons.assign(m.reasons().begin(), m.reasons().end());
  return absl::OkStatus();
}

CpStrategy CpStrategyOfName(const std::string& name) {
  return name == "ring"       ? CpStrategy::kRing
         : name == "partials" ? CpStrategy::kPartials
                              : CpStrategy::kAuto;
}

void EncodeCp(const CpReport& cp, v1::CpReport* m) {
  m->set_strategy(EncodeCpStrategy(CpStrategyOfName(cp.strategy)));
  m->set_strategy_chosen(cp.strategy_chosen);
  m->set_world_size(cp.world_size);
  m->set_sharding(EncodeCpSharding(cp.sharding));
  m->set_interleave_size(cp.interleave_size);
  for (const auto& row : cp.shard_tokens) {
    m->add_shards()->mutable_tokens()->Assign(row.begin(), row.end());
  }
  m->set_rounds(cp.rounds);
  m->set_steps(cp.steps);
  m->set_workers(cp.workers);
  m->set_execution(cp.execution);
  EncodeCpCheck(cp.engine_order, m->mutable_engine_order());
  EncodeCpCheck(cp.deterministic, m->mutable_deterministic());
  m->set_deterministic_matches_replay(cp.deterministic_matches_replay);
  for (const CpRankCheck& r : cp.ranks) {
    v1::CpRankCheck* rm = m->add_ranks();
    rm->set_rank(r.rank);
    rm->set_verdict(EncodeVerdict(r.check.verdict));
    if (r.check.has_out) EncodeDrift(r.check.out, rm->mutable_out());
    if (r.check.has_lse) EncodeDrift(r.check.lse, rm->mutable_lse());
    for (const std::string& reason : r.check.reasons) rm->add_reasons(reason);
    rm->set_tokens(r.tokens);
    rm->set_empty_queries(r.empty_queries);
  }
  if (cp.has_combine) EncodeCpCheck(cp.combine, m->mutable_combine());
  m->set_skipped(cp.skipped);
}

absl::Status DecodeCp(const v1::CpReport& m, CpReport* cp) {
  cp->present = true;
  ATTNAUDIT_ASSIGN_OR_RETURN(const CpStrategy strategy,
                             DecodeCpStrategy(m.strategy(), "cp.strategy"));
  cp->strategy = strategy == CpStrategy::kRing       ? "ring"
                 : strategy == CpStrategy::kPartials ? "partials"
                                                     : "";
  cp->strategy_chosen = m.strategy_chosen();
  cp->world_size = m.world_size();
  ATTNAUDIT_ASSIGN_OR_RETURN(cp->sharding,
                             DecodeCpSharding(m.sharding(), "cp.sharding"));
  cp->interleave_size = m.interleave_size();
  cp->shard_tokens.clear();
  for (const v1::CpRowShards& row : m.shards()) {
    cp->shard_tokens.emplace_back(row.tokens().begin(), row.tokens().end());
  }
  cp->rounds = m.rounds();
  cp->steps = m.steps();
  cp->workers = m.workers();
  cp->execution = m.execution();
  ATTNAUDIT_RETURN_IF_ERROR(
      DecodeCpCheck(m.engine_order(), "cp.engine_order", &cp->engine_order));
  ATTNAUDIT_RETURN_IF_ERROR(
      DecodeCpCheck(m.deterministic(), "cp.deterministic", &cp->deterministic));
  cp->deterministic_matches_replay = m.deterministic_matches_replay();
  cp->ranks.clear();
  for (int i = 0; i < m.ranks_size(); ++i) {
    const v1::CpRankCheck& rm = m.ranks(i);
    CpRankCheck r;
    r.rank = rm.rank();
    v1::CpCheck check;
    check.set_verdict(rm.verdict());
    if (rm.has_out()) *check.mutable_out() = rm.out();
    if (rm.has_lse()) *check.mutable_lse() = rm.lse();
    *check.mutable_reasons() = rm.reasons();
    ATTNAUDIT_RETURN_IF_ERROR(
        DecodeCpCheck(check, absl::StrCat("cp.ranks[", i, "]"), &r.check));
    r.tokens = rm.tokens();
    r.empty_queries = rm.empty_queries();
    cp->ranks.push_back(std::move(r));
  }
  cp->has_combine = m.has_combine();
  if (cp->has_combine) {
    ATTNAUDIT_RETURN_IF_ERROR(
        DecodeCpCheck(m.combine(), "cp.combine", &cp->combine));
  }
  cp->skipped = m.skipped();
  return absl::OkStatus();
}

void EncodeVerdictNotes(const AuditReport& r, v1::AuditReport* msg) {
  for (const std::string& line : r.inconclusive_reasons) {
    msg->add_inconclusive_reasons(line);
  }
  for (const std::string& line : r.overrides) msg->add_overrides(line);
  if (!r.hull.present) return;
  v1::HullCheck* h = msg->mutable_hull();
  h->set_checked(r.hull.checked);
  h->set_outside(r.hull.outside);
  EncodeLocation(r.hull.worst, h->mutable_worst());
  h->set_worst_value(r.hull.worst_value);
  h->set_worst_low(r.hull.worst_low);
  h->set_worst_high(r.hull.worst_high);
}

void DecodeVerdictNotes(const v1::AuditReport& msg, AuditReport* r) {
  r->inconclusive_reasons.assign(msg.inconclusive_reasons().begin(),
                                 msg.inconclusive_reasons().end());
  r->overrides.assign(msg.overrides().begin(), msg.overrides().end());
  if (!msg.has_hull()) return;
  const v1::HullCheck& h = msg.hull();
  r->hull.present = true;
  r->hull.checked = h.checked();
  r->hull.outside = h.outside();
  r->hull.worst = {h.worst().batch(), h.worst().query(), h.worst().head(),
                   h.worst().dim()};
  r->hull.worst_value = h.worst_value();
  r->hull.worst_low = h.worst_low();
  r->hull.worst_high = h.worst_high();
}

}  // namespace

void ReportToProto(const AuditReport& report, v1::AuditReport* msg) {
  msg->Clear();
  msg->set_verdict(EncodeVerdict(report.verdict));
  msg->set_invalid_reason(report.invalid_reason);
  v1::SnapshotDims* dims = msg->mutable_dims();
  dims->set_batch(report.dims.batch);
  dims->set_queries(report.dims.queries);
  dims->set_q_heads(report.dims.q_heads);
  dims->set_kv_heads(report.dims.kv_heads);
  dims->set_head_dim(report.dims.head_dim);
  dims->set_num_pages(report.dims.num_pages);
  dims->set_page_size(report.dims.page_size);
  dims->set_max_blocks(report.dims.max_blocks);
  EncodeLabels(report.labels, msg->mutable_labels());
  for (const ComparisonResult& r : report.comparisons) {
    EncodeComparisonResult(r, msg->add_comparisons());
  }
  EncodeProvenance(report.provenance, msg->mutable_provenance());
  if (report.cp.present) EncodeCp(report.cp, msg->mutable_cp());
  EncodeDiagnoses(report, msg);
  EncodeRopeChecks(report, msg);
  EncodeVerdictNotes(report, msg);
}

absl::StatusOr<AuditReport> ReportFromProto(const v1::AuditReport& msg) {
  AuditReport report;
  ATTNAUDIT_ASSIGN_OR_RETURN(report.verdict,
                             DecodeVerdict(msg.verdict(), "verdict"));
  report.invalid_reason = msg.invalid_reason();
  const v1::SnapshotDims& dims = msg.dims();
  report.dims.batch = dims.batch();
  report.dims.queries = dims.queries();
  report.dims.q_heads = dims.q_heads();
  report.dims.kv_heads = dims.kv_heads();
  report.dims.head_dim = dims.head_dim();
  report.dims.num_pages = dims.num_pages();
  report.dims.page_size = dims.page_size();
  report.dims.max_blocks = dims.max_blocks();
  ATTNAUDIT_RETURN_IF_ERROR(DecodeLabels(msg.labels(), &report.labels));
  report.comparisons.resize(msg.comparisons_size());
  for (int i = 0; i < msg.comparisons_size(); ++i) {
    ATTNAUDIT_RETURN_IF_ERROR(DecodeComparisonResult(
        msg.comparisons(i), absl::StrCat("comparisons[", i, "]"),
        &report.comparisons[i]));
  }
  ATTNAUDIT_RETURN_IF_ERROR(
      DecodeProvenance(msg.provenance(), &report.provenance));
  if (msg.has_cp()) ATTNAUDIT_RETURN_IF_ERROR(DecodeCp(msg.cp(), &report.cp));
  DecodeDiagnoses(msg, &report);
  ATTNAUDIT_RETURN_IF_ERROR(DecodeRopeChecks(msg, &report));
  DecodeVerdictNotes(msg, &report);
  return report;
}

v1::PairVerdict EncodePairVerdict(PairVerdict verdict) {
  switch (verdict) {
    case PairVerdict::kConsistent:
      return v1::PAIR_VERDICT_CONSISTENT;
    case PairVerdict::kWithinNoise:
      return v1::PAIR_VERDICT_WITHIN_NOISE;
    case PairVerdict::kInputsDiffer:
      return v1::PAIR_VERDICT_INPUTS_DIFFER;
    case PairVerdict::kStalePrefixKv:
      return v1::PAIR_VERDICT_STALE_PREFIX_KV;
    case PairVerdict::kRolloutDrift:
      return v1::PAIR_VERDICT_ROLLOUT_DRIFT;
    case PairVerdict::kTrainerDrift:
      return v1::PAIR_VERDICT_TRAINER_DRIFT;
    case PairVerdict::kBothDrift:
      return v1::PAIR_VERDICT_BOTH_DRIFT;
  }
  return v1::PAIR_VERDICT_UNSPECIFIED;
}

void PairReportToProto(const PairReport& report, v1::PairReport* msg) {
  msg->Clear();
  const std::optional<PairVerdict> verdict = report.verdict();
  if (verdict) msg->set_verdict(EncodePairVerdict(*verdict));
  if (report.layer >= 0) msg->set_layer(report.layer);
  for (const RowPair& r : report.rows) {
    v1::PairRow* m = msg->add_rows();
    m->set_request_id(r.request_id);
    m->set_position(r.position);
    m->set_rollout_row(r.rollout_row);
    m->set_trainer_row(r.trainer_row);
    m->set_out_bitwise(r.out_bitwise);
    m->set_out_max_abs(r.out_max_abs);
    m->set_out_max_ulps(r.out_max_ulps);
    m->set_q_ulps(r.q_ulps);
    m->set_kv_ulps(r.kv_ulps);
    m->set_newest_kv_ulps(r.newest_kv_ulps);
    m->set_keys_compared(r.keys_compared);
    m->set_input_effect(r.input_effect);
    m->set_noise(r.noise);
    m->set_verdict(EncodePairVerdict(r.verdict));
    m->set_inputs_differing(r.InputsDiffering());
  }
  msg->set_rollout_verdict(EncodeVerdict(report.rollout_verdict));
  msg->set_trainer_verdict(EncodeVerdict(report.trainer_verdict));
  msg->set_rollout_diagnosis(report.rollout_diagnosis);
  msg->set_trainer_diagnosis(report.trainer_diagnosis);
  msg->set_unmatched_rollout(report.unmatched_rollout);
  msg->set_unmatched_trainer(report.unmatched_trainer);
}

}  // namespace attnaudit
