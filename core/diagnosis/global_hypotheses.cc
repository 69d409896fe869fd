// Hypotheses that change the whole computation (RoPE, scale, soft-cap,
// GQA mapping, window, sinks, fp8 scales) and those that change only the
// LSE (its base, the sinks in it). Recomputed variants are screened on the
// row and KV heads that drift most; the best are recomputed on every
// examined row (docs/DIAGNOSIS.md, "Cost").
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/status_macros.h"
#include "core/diagnosis/diagnosis_internal.h"
#include "core/rope/rope.h"
#include "core/rope/scaling.h"

namespace attnaudit {
namespace diagnosis_internal {
namespace {

constexpr double kLog2E = 1.4426950408889634074;
constexpr double kLn2 = 0.69314718055994530942;
// Screening keeps variants that remove at least this share of the drift.
constexpr double kScreenFloor = 0.2;
// Variants screening within this of the last confirmed one are confirmed
// too, up to kMaxTied in all.
constexpr double kTiedScreen = 0.005;
constexpr size_t kMaxTied = 12;

void AddRopeVariants(const Context& ctx, std::vector<Variant>* out) {
  for (int64_t delta : {1, -1, 2, -2, 3, -3, 4, -4}) {
    absl::StatusOr<std::vector<double>> q =
        AlternativeQueries(ctx, delta, false);
    if (!q.ok()) return;  // no usable RoPE configuration
    Variant v{kRopeOffset,
              absl::StrFormat("%+d", delta),
              {},
              static_cast<int>(std::abs(delta))};
    v.spec.q = *std::move(q);
    out->push_back(std::move(v));
  }
  Variant twice{kKRopeTwice, "K rotated again at its position", {}, 1};
  twice.spec.keys = KeyTransform::kRotateAgain;
  out->push_back(std::move(twice));
  Variant missing{kKRopeMissing, "K used without its rotation", {}, 1};
  missing.spec.keys = KeyTransform::kUnrotate;
  out->push_back(std::move(missing));
  absl::StatusOr<std::vector<double>> restyled =
      AlternativeQueries(ctx, 0, true);
  if (!restyled.ok()) return;
  const bool neox = ctx.in->snapshot->rope.style == RopeStyle::kNeox;
  const std::string other = neox ? "GPT-J" : "NeoX";
  Variant q_only{kRopeStyle, "q rotated with " + other + " pairing", {}, 1};
  q_only.spec.q = *restyled;
  out->push_back(std::move(q_only));
  Variant both{kRopeStyle, "q and K rotated with " + other + " pairing", {}, 2};
  both.spec.q = *std::move(restyled);
  both.spec.keys = KeyTransform::kRestyle;
  out->push_back(std::move(both));
}

// The engine's RoPE under another model configuration (theta, scaling,
// rotary width), for a snapshot whose q (and K) attnaudit rotates itself:
// q rotated with it, and pre-RoPE keys too. A post-RoPE snapshot needs
// none: the engine's q and cache agree with each other whatever it did
// (the rolling RoPE check sees those bugs).
void AddRopeConfigVariants(const Context& ctx, std::vector<Variant>* out) {
  const Snapshot& s = *ctx.in->snapshot;
  const bool pre_q = s.rope.q_state == RopeState::kPreRope;
  const bool pre_k = s.rope.k_state == RopeState::kPreRope;
  if (!pre_q && !pre_k) return;
  const RopeConfig& base = s.rope;
  const int64_t D = ctx.d.head_dim;
  const int64_t rotary = base.rotary_dim > 0 ? base.rotary_dim : D;
  struct Option {
    const char* hypothesis;
    std::string detail;
    RopeConfig config;
  };
  std::vector<Option> options;
  for (double theta : CandidateThetas(base.theta)) {
    RopeConfig c = base;
    c.theta = theta;
    options.push_back(
        {kRopeTheta,
         absl::StrFormat("theta %g instead of %g", theta, base.theta), c});
  }
  if (base.scaling.type != RopeScalingType::kNone) {
    RopeConfig c = base;
    c.scaling = RopeScaling();
    options.push_back({kRopeScalingIgnored, "the RoPE scaling not applied", c});
  }
  const int64_t max_position = *std::max_element(ctx.p->query_positions.begin(),
                                                 ctx.p->query_positions.end());
  for (const ScalingLengthCandidate& length :
       CandidateScalingLengths(base.scaling, max_position)) {
    RopeConfig c = base;
    c.scaling.sequence_length = length.sequence_length;
    options.push_back({kRopeScalingLength,
                       absl::StrCat("the RoPE scaled for ", length.detail), c});
  }
  for (int64_t width : {D, D / 2}) {
    if (width == rotary || width < 2 || width % 2 != 0) continue;
    RopeConfig c = base;
    c.rotary_dim = width;
    options.push_back(
        {kRopePartialRotary,
         absl::StrFormat("%d rotated dims instead of %d", width, rotary), c});
  }
  for (Option& o : options) {
    Variant v{o.hypothesis, o.detail, {}, 2};
    if (pre_q) {
      absl::StatusOr<std::vector<double>> q = QueriesRotatedWith(ctx, o.config);
      if (!q.ok()) continue;
      v.spec.q = *std::move(q);
    }
    if (pre_k) {
      v.spec.keys = KeyTransform::kReRotate;
      v.spec.key_rope = std::make_shared<const RopeConfig>(o.config);
    }
    out->push_back(std::move(v));
  }
}

// Reads of the cache the engine got wrong: V from the K buffer, and pages
// in another layout than declared (K transposed per page and head, as
// vLLM's CPU cache stores it; NHD read as HND or the reverse).
void AddCacheVariants(const Context& ctx, std::vector<Variant>* out) {
  Variant v{kVFromK, "V read from the K buffer", {}, 1};
  v.spec.v_from_k = true;
  out->push_back(std::move(v));
  if (ctx.in->snapshot->rope.k_state == RopeState::kPreRope) return;
  Variant t{kLayout,
            "K pages hold each KV head's block transposed, [D, page_size] "
            "(vLLM's CPU cache: layout=\"vllm_cpu\")",
            {},
            1};
  t.spec.keys = KeyTransform::kTransposed;
  out->push_back(std::move(t));
  if (ctx.d.kv_heads > 1) {
    const bool nhd = ctx.p->k_layout == KvLayout::kNHD;
    Variant swap{kLayout,
                 nhd ? "the pages are HND, declared NHD"
                     : "the pages are NHD, declared HND",
                 {},
                 1};
    swap.spec.keys = KeyTransform::kSwapLayout;
    out->push_back(std::move(swap));
  }
}

void AddScaleVariants(const Context& ctx, std::vector<Variant>* out) {
  const double s = ctx.p->softmax_scale;
  const double root = std::sqrt(static_cast<double>(ctx.d.head_dim));
  const std::pair<double, const char*> options[] = {
      {1.0 / root, "the kernel's default 1/sqrt(D)"},
      {s / root, "applied twice"},
      {s * root, "divided by sqrt(D) instead of multiplied"},
      {s * kLog2E, "log2(e) folded in with exp instead of exp2"},
      {s * kLn2, "log2(e) missing with exp2"},
      {1.0, "not applied"},
  };
  std::vector<double> seen{s};
  for (const auto& [value, why] : options) {
    bool dup = false;
    for (double x : seen) dup |= std::fabs(x - value) <= 1e-6 * std::fabs(x);
    if (dup) continue;
    seen.push_back(value);
    Variant v{kWrongScale,
              absl::StrFormat("scale %.6g instead of %.6g (%s)", value, s, why),
              {},
              1};
    v.spec.set_scale = true;
    v.spec.scale = value;
    out->push_back(std::move(v));
  }
}

// The KV heads in another order: query head h reads KV head
// perm[h / group] (reversed, rotated by one either way, pairs swapped).
void AddKvPermutations(const Context& ctx, std::vector<Variant>* out) {
  const SnapshotDims& d = ctx.d;
  const int64_t n = d.kv_heads;
  if (n < 2) return;
  std::vector<std::pair<std::string, std::vector<int64_t>>> perms;
  std::vector<int64_t> reversed(static_cast<size_t>(n));
  for (int64_t g = 0; g < n; ++g) reversed[g] = n - 1 - g;
  perms.emplace_back("in reverse order", reversed);
  if (n > 2) {
    std::vector<int64_t> up(static_cast<size_t>(n)), down(up.size());
    for (int64_t g = 0; g < n; ++g) {
      up[g] = (g + 1) % n;
      down[g] = (g + n - 1) % n;
    }
    perms.emplace_back("shifted by +1", up);
    perms.emplace_back("shifted by -1", down);
  }
  if (n > 2 && n % 2 == 0) {
    std::vector<int64_t> pairs(static_cast<size_t>(n));
    for (int64_t g = 0; g < n; ++g) pairs[g] = g ^ 1;
    perms.emplace_back("swapped in pairs", pairs);
  }
  for (const auto& [what, perm] : perms) {
    Variant v{kKvHeadsPermuted, "KV heads " + what, {}, 1};
    v.spec.kv_of.resize(static_cast<size_t>(d.q_heads));
    for (int64_t h = 0; h < d.q_heads; ++h) {
      v.spec.kv_of[h] = perm[h / d.group()];
    }
    out->push_back(std::move(v));
  }
}

void AddVariantVariants(const Context& ctx, std::vector<Variant>* out) {
  const PreparedAttention& p = *ctx.p;
  const SnapshotDims& d = ctx.d;
  if (p.softcap > 0) {
    Variant v{kSoftcapMissing, "the logit soft-cap not applied", {}, 1};
    v.spec.set_softcap = true;
    v.spec.softcap = 0;
    out->push_back(std::move(v));
  }
  if (d.kv_heads > 1 && d.kv_heads < d.q_heads) {
    Variant v{kGqaMapping, "query head h reads KV head h % Hkv", {}, 1};
    v.spec.kv_of.resize(static_cast<size_t>(d.q_heads));
    for (int64_t h = 0; h < d.q_heads; ++h) v.spec.kv_of[h] = h % d.kv_heads;
    out->push_back(std::move(v));
  }
  AddKvPermutations(ctx, out);
  if (p.window > 0) {
    // Ranked after an off-by-one it ties with: when the keys past W + 1 carry
    // no weight, one more key is all the evidence shows.
    Variant none{kWindowIgnored, "the sliding window not applied", {}, 2};
    none.spec.set_window = true;
    none.spec.window = 0;
    out->push_back(std::move(none));
    for (int64_t delta : {1, -1}) {
      if (p.window + delta < 1) continue;
      Variant v{kWindowOffByOne,
                absl::StrFormat("window %d instead of %d", p.window + delta,
                                p.window),
                {},
                1};
      v.spec.set_window = true;
      v.spec.window = p.window + delta;
      out->push_back(std::move(v));
    }
  }
  if (!p.sinks.empty()) {
    Variant v{kSinksMissing, "the sinks left out of the softmax", {}, 1};
    v.spec.drop_sinks = true;
    out->push_back(std::move(v));
  }
}

void AddFp8Variants(const Context& ctx, std::vector<Variant>* out) {
  const Snapshot& s = *ctx.in->snapshot;
  if (!s.k_scale.present() && !s.v_scale.present()) return;
  const std::vector<double>& k = ctx.p->k_scale;
  const std::vector<double>& v = ctx.p->v_scale;
  auto squared = [](std::vector<double> x) {
    for (double& e : x) e *= e;
    return x;
  };
  const std::vector<double> ones(k.size(), 1.0);
  struct Option {
    const char* what;
    std::vector<double> k, v;
    int bias;
  };
  const Option options[] = {
      {"K and V scales applied twice", squared(k), squared(v), 1},
      {"K scale applied twice", squared(k), v, 2},
      {"V scale applied twice", k, squared(v), 2},
      {"K and V scales not applied", ones, ones, 1},
      {"K scale not applied", ones, v, 2},
      {"V scale not applied", k, ones, 2},
      {"K dequantised with v_scale", v, v, 2},
      {"K and V scales swapped", v, k, 2},
  };
  for (const Option& o : options) {
    if (o.k == k && o.v == v) continue;
    Variant var{kFp8Scale, o.what, {}, o.bias};
    var.spec.k_scale = o.k;
    var.spec.v_scale = o.v;
    out->push_back(std::move(var));
  }
}

std::vector<Variant> Catalogue(const Context& ctx) {
  std::vector<Variant> v;
  AddRopeVariants(ctx, &v);
  AddRopeConfigVariants(ctx, &v);
  AddScaleVariants(ctx, &v);
  AddCacheVariants(ctx, &v);
  AddVariantVariants(ctx, &v);
  AddFp8Variants(ctx, &v);
  return v;
}

// The KV heads of the row whose cells drift most.
std::vector<int64_t> TopKvHeads(const Context& ctx, const Row& row, int n) {
  const SnapshotDims& d = ctx.d;
  std::vector<double> energy(static_cast<size_t>(d.kv_heads), 0.0);
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    energy[(c % d.q_heads) / d.group()] += row.before[c];
  }
  std::vector<int64_t> order(static_cast<size_t>(d.kv_heads));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return energy[a] > energy[b]; });
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(n)));
  return order;
}

Candidate MakeCandidate(const Variant& v, Evaluation eval) {
  Candidate c;
  c.hypothesis = v.hypothesis;
  c.detail = v.detail;
  c.eval = std::move(eval);
  c.location.heads = c.eval.heads;
  c.location.query = c.eval.query;
  c.rank_bias = v.rank_bias;
  return c;
}

}  // namespace

absl::Status ScreenGlobal(const Context& ctx, const std::vector<Row>& rows,
                          GlobalScreen* screen) {
  if (rows.empty()) return absl::OkStatus();
  screen->variants = Catalogue(ctx);
  std::vector<Variant>& variants = screen->variants;
  // Screening: the row that drifts most, its most drifting KV heads.
  const Row& first = rows[0];
  const std::vector<int64_t> heads =
      TopKvHeads(ctx, first, ctx.opt->screen_kv_heads);
  std::vector<std::pair<double, size_t>> screened;
  std::vector<const AltSpec*> specs;
  for (const Variant& v : variants) specs.push_back(&v.spec);
  std::vector<RowResult> results;
  ATTNAUDIT_RETURN_IF_ERROR(
      ComputeAlternatives(ctx, specs, first.b, heads, &results));
  ctx.evaluated += static_cast<int64_t>(variants.size());
  for (size_t i = 0; i < variants.size(); ++i) {
    Scorer scorer(ctx);
    scorer.Add(first, results[i]);
    const Evaluation e = scorer.Finish();
    if (e.score >= kScreenFloor) screened.emplace_back(e.score, i);
  }
  std::stable_sort(
      screened.begin(), screened.end(),
      [](const auto& a, const auto& b) { return a.first > b.first; });
  // The best `confirm`, and every variant that screens as well as the last
  // of them (attention made one-hot fits many variants equally: each is
  // confirmed, and the ranking names the most specific), up to kMaxTied.
  size_t keep =
      std::min(screened.size(), static_cast<size_t>(ctx.opt->confirm));
  while (keep > 0 && keep < screened.size() && keep < kMaxTied &&
         screened[keep].first >= screened[keep - 1].first - kTiedScreen) {
    ++keep;
  }
  if (screened.size() > keep) {
    screened.resize(keep);
  }
  screen->screened = std::move(screened);
  return absl::OkStatus();
}

double BestScreened(const GlobalScreen& screen) {
  return screen.screened.empty() ? 0.0 : screen.screened[0].first;
}

absl::Status ConfirmGlobal(const Context& ctx, const std::vector<Row>& rows,
                           const GlobalScreen& screen,
                           std::vector<Candidate>* out) {
  // Confirmation: every head of every examined row, the finalists of the
  // screening in one pass per row.
  if (screen.screened.empty() || ctx.TimeUp() || ctx.Cancelled()) {
    return absl::OkStatus();
  }
  std::vector<const AltSpec*> specs;
  for (const auto& [score, i] : screen.screened) {
    specs.push_back(&screen.variants[i].spec);
  }
  std::vector<Scorer> scorers(specs.size(), Scorer(ctx));
  std::vector<RowResult> results;
  for (const Row& row : rows) {
    ATTNAUDIT_RETURN_IF_ERROR(
        ComputeAlternatives(ctx, specs, row.b, {}, &results));
    for (size_t k = 0; k < specs.size(); ++k) scorers[k].Add(row, results[k]);
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    out->push_back(MakeCandidate(screen.variants[screen.screened[k].second],
                                 scorers[k].Finish()));
  }
  return absl::OkStatus();
}

absl::Status LseHypotheses(const Context& ctx, const std::vector<Row>& rows,
                           std::vector<Candidate>* out) {
  if (rows.empty() || !rows[0].has_lse) return absl::OkStatus();
  const PreparedAttention& p = *ctx.p;
  const SnapshotDims& d = ctx.d;
  const int64_t D = d.head_dim;
  struct Option {
    const char* hypothesis;
    const char* detail;
    int kind;  // 0: x log2 e, 1: x ln 2, 2: sinks toggled
  };
  std::vector<Option> options = {
      {kLseBase, "engine LSE in base 2, declared base e", 0},
      {kLseBase, "engine LSE in base e, declared base 2", 1}};
  if (!p.sinks.empty()) {
    options.push_back({kSinksInLse,
                       p.lse_includes_sinks
                           ? "engine LSE without the sinks, declared with them"
                           : "engine LSE with the sinks, declared without them",
                       2});
  }
  for (const Option& o : options) {
    Scorer scorer(ctx);
    for (const Row& row : rows) {
      for (int64_t c = 0; c < ctx.Cells(); ++c) {
        const double r = row.r_lse[c];
        double a = r;
        if (o.kind == 0) a = r * kLog2E;
        if (o.kind == 1) a = r * kLn2;
        if (o.kind == 2) {
          const double sink = p.sinks[c % d.q_heads];
          a = p.lse_includes_sinks ? r + std::log(-std::expm1(sink - r))
                                   : r + std::log1p(std::exp(sink - r));
        }
        scorer.AddCell(row, c, &row.r_out[c * D], a);
      }
    }
    ++ctx.evaluated;
    Candidate c;
    c.hypothesis = o.hypothesis;
    c.detail = o.detail;
    c.eval = scorer.Finish();
    c.location.heads = c.eval.heads;
    c.location.query = c.eval.query;
    out->push_back(std::move(c));
  }
  return absl::OkStatus();
}

void PrecisionHypothesis(const Context& ctx, const std::vector<Row>& rows,
                         std::vector<Candidate>* out) {
  // A reduced-precision intermediate shows as noise above a correct
  // engine's spread over (nearly) every cell, no element far over the
  // tolerance (16x) and no structure a recomputation could explain.
  // A located stale page is structure a page accounts for (its fit beats
  // unstructured noise), though perhaps not where.
  for (const Candidate& c : *out) {
    if (c.located) return;
  }
  int64_t cells = 0, noisy = 0;
  double total = 0, worst = 0, max_abs = 0;
  for (const Row& row : rows) {
    // An LSE that moved points at a change of the keys, not of precision.
    if (!row.has_out || (row.has_lse && row.lse_drift >= 3.0)) return;
    for (int64_t c = 0; c < ctx.Cells(); ++c) {
      const double e = row.before[c];
      ++cells;
      total += e;
      worst = std::max(worst, e);
      if (e > 2.0 * ctx.clean_cell) ++noisy;
      for (int64_t i = 0; i < ctx.d.head_dim; ++i) {
        const int64_t k = c * ctx.d.head_dim + i;
        max_abs = std::max(max_abs, std::fabs(row.e_out[k] - row.r_out[k]));
      }
    }
  }
  if (cells == 0) return;
  const double mean = total / static_cast<double>(cells);
  const bool spread = 2 * noisy >= cells && worst <= 20.0 * mean;
  const bool small = max_abs <= 16.0 * ctx.tol.out_abs;
  if (!spread || !small || mean <= 2.0 * ctx.clean_cell) return;
  Candidate c;
  c.hypothesis = kLowPrecision;
  c.detail = absl::StrFormat(
      "noise %.1fx a correct engine's, spread over %d of %d cells",
      std::sqrt(mean / ctx.clean_cell), noisy, cells);
  c.eval.score = 0.6;  // a pattern, not a recomputation: never "explains"
  c.eval.before.out_max_abs = max_abs;
  c.eval.before.out_rms_noise = std::sqrt(mean);
  c.rank_bias = 3;
  out->push_back(std::move(c));
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
