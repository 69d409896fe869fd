// Orchestration of the fused R + P pass: work items, per-thread scratch,
// the final write of each row. The per-block arithmetic is in
// attention_pass.cc (one source, every SIMD target).
#include "core/attention/attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "core/attention/attention_internal.h"
#include "core/attention/merge.h"
#include "core/attention/unit_states.h"
#include "core/common/parallel.h"

namespace attnaudit {
namespace attention_internal {
namespace {

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

template <typename T>
void Grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

void PrepareItem(const PreparedAttention& p, int64_t b, int64_t g0, int64_t g1,
                 Scratch& sc) {
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t P = d.page_size;
  const int64_t group = d.group();
  const int64_t per_query = (g1 - g0) * group;
  const int64_t rows = d.queries * per_query;
  // Heads per sweep: K and V in f32 within ~512 KiB.
  constexpr int64_t kSweepBytes = int64_t{512} << 10;
  const int64_t head_bytes = 2 * P * D * static_cast<int64_t>(sizeof(float));
  sc.sweep_heads = std::clamp<int64_t>(kSweepBytes / head_bytes, 1, g1 - g0);
  for (auto* v : {&sc.sweep_k32, &sc.sweep_v32})
    Grow(*v, sc.sweep_heads * P * D);
  if (p.k_dtype == DType::kF64) Grow(sc.sweep_k64, sc.sweep_heads * P * D);
  if (p.v_dtype == DType::kF64) Grow(sc.sweep_v64, sc.sweep_heads * P * D);
  Grow(sc.positions, P);
  Grow(sc.visible, d.queries * P);
  Grow(sc.visible_count, d.queries);
  Grow(sc.q64, rows * D);
  Grow(sc.q32, rows * D);
  for (auto* v : {&sc.s64, &sc.e64}) Grow(*v, group * P);
  for (auto* v : {&sc.s32, &sc.e32}) Grow(*v, group * P);
  Grow(sc.blk_sum, group);
  Grow(sc.blk_lse, group);
  Grow(sc.ref_unit_sum, group);
  Grow(sc.ref_unit_lse, group);
  Grow(sc.keep32, group);
  Grow(sc.keep64, group);
  sc.ref_m.assign(static_cast<size_t>(rows), kNegInfD);
  sc.ref_l.assign(static_cast<size_t>(rows), 0.0);
  sc.ref_acc.assign(static_cast<size_t>(rows * D), 0.0);
  if (static_cast<int64_t>(sc.rep_tree.size()) < rows) sc.rep_tree.resize(rows);
  const int64_t units = static_cast<int64_t>(p.units[b].size());
  for (int64_t r = 0; r < rows; ++r) sc.rep_tree[r].Reset(D, units);
  const int levels = merge_tree::LevelsFor(units);
  Grow(sc.rep_plan, group);
  Grow(sc.rep_steps, group * levels);
  Grow(sc.rep_lefts, group * levels);
  Grow(sc.rep_left_lse, group * levels);
  Grow(sc.rep_new_lse, group);
  Grow(sc.rep_discard, D);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t sq = r / per_query;
    const int64_t h = g0 * group + r % per_query;
    const double* src = &p.q[((b * d.queries + sq) * d.q_heads + h) * D];
    for (int64_t i = 0; i < D; ++i) {
      sc.q64[r * D + i] = src[i];
      sc.q32[r * D + i] = static_cast<float>(src[i]);
    }
  }
}

namespace {

// Writes R and P of every row of the item to the results.
void FinishRows(const PassContext& item, Scratch& sc, int64_t b, int64_t g0,
                int64_t g1) {
  const PreparedAttention& p = item.p;
  const SnapshotDims& d = p.dims;
  const int64_t D = d.head_dim;
  const int64_t group = d.group();
  const int64_t per_query = (g1 - g0) * group;
  AttentionResults& res = *item.results;
  for (int64_t r = 0; r < d.queries * per_query; ++r) {
    const int64_t sq = r / per_query;
    const int64_t h = g0 * group + r % per_query;
    const int64_t qi = (b * d.queries + sq) * d.q_heads + h;
    if (item.reference) {
      FinishReferenceState(p, h, &sc.ref_acc[r * D], sc.ref_m[r], sc.ref_l[r],
                           &res.reference_out[qi * D], &res.reference_lse[qi]);
    }
    if (item.replay) {
      float lse = 0;
      sc.rep_tree[r].Finish(sc.rep_discard.data(), &lse);
      FinishReplayState(p, h, sc.rep_discard.data(), lse,
                        &res.replay_out[qi * D], &res.replay_lse[qi]);
    }
  }
}

}  // namespace
}  // namespace attention_internal

namespace {

// The most units any query merged, and the most keys any query sees
// (positions <= the query's, in the window): they size the tolerances.
// visible_keys: the pass's counts ([B][Sq]), or null to count here (a
// serial walk of every token, which the pass's counts spare).
void SummariseMerges(const PreparedAttention& p,
                     const std::vector<int64_t>* visible_keys,
                     AttentionResults* res) {
  res->max_merged_blocks = 0;
  res->max_visible_keys = 0;
  const SnapshotDims& d = p.dims;
  for (int64_t b = 0; b < d.batch; ++b) {
    const int64_t L = p.layout->seq_lens[b];
    for (int64_t sq = 0; sq < d.queries; ++sq) {
      res->max_merged_blocks = std::max<int64_t>(
          res->max_merged_blocks,
          static_cast<int64_t>(res->merge_orders[b][sq].size()));
      if (visible_keys != nullptr) {
        res->max_visible_keys =
            std::max(res->max_visible_keys,
                     (*visible_keys)[static_cast<size_t>(b * d.queries + sq)]);
        continue;
      }
      const int64_t qpos = p.query_positions[b * d.queries + sq];
      int64_t visible = 0;
      for (int64_t t = 0; t < L; ++t) {
        const int64_t page = p.layout->block_pages[b][t / d.page_size];
        const int64_t slot = page * d.page_size + t % d.page_size;
        visible += attention_internal::Visible(
            p, p.snapshot->slot_positions.IntAt(slot), qpos);
      }
      res->max_visible_keys = std::max(res->max_visible_keys, visible);
    }
  }
}

}  // namespace

void SummariseUnits(const PreparedAttention& p, bool record_merge_orders,
                    AttentionResults* res) {
  const SnapshotDims& d = p.dims;
  const int64_t P = d.page_size;
  res->merge_orders.assign(
      static_cast<size_t>(d.batch),
      std::vector<std::vector<int32_t>>(static_cast<size_t>(d.queries)));
  for (int64_t b = 0; b < d.batch; ++b) {
    for (const KvUnit& u : p.units[b]) {
      const int64_t page = p.layout->block_pages[b][u.block];
      for (int64_t sq = 0; sq < d.queries; ++sq) {
        const int64_t qpos = p.query_positions[b * d.queries + sq];
        for (int64_t t = u.first; t < u.first + u.count; ++t) {
          if (attention_internal::Visible(
                  p, p.snapshot->slot_positions.IntAt(page * P + t), qpos)) {
            res->merge_orders[b][sq].push_back(u.block);
            break;
          }
        }
      }
    }
  }
  SummariseMerges(p, nullptr, res);
  if (!record_merge_orders) res->merge_orders.clear();
}

absl::StatusOr<AttentionResults> ComputeAttention(
    const PreparedAttention& p, const AttentionRunOptions& options) {
  const int threads = options.threads;
  const bool record_merge_orders = options.record_merge_orders;
  const std::atomic<bool>* cancelled = options.cancelled;
  const auto start = std::chrono::steady_clock::now();
  const SnapshotDims& d = p.dims;
  AttentionResults res;
  const size_t n_out =
      static_cast<size_t>(d.batch * d.queries * d.q_heads * d.head_dim);
  const size_t n_lse = static_cast<size_t>(d.batch * d.queries * d.q_heads);
  res.reference_out.assign(n_out, 0.0);
  res.replay_out.assign(n_out, 0.0);
  res.reference_lse.assign(n_lse, 0.0);
  res.replay_lse.assign(n_lse, 0.0);
  // Merge orders are always tracked (cheap) to size the tolerances. A
  // query merges at most one entry per unit of its row: reserved, so the
  // pass does not grow them.
  res.merge_orders.assign(
      static_cast<size_t>(d.batch),
      std::vector<std::vector<int32_t>>(static_cast<size_t>(d.queries)));
  for (int64_t b = 0; b < d.batch; ++b) {
    for (std::vector<int32_t>& order : res.merge_orders[b]) {
      order.reserve(p.units[b].size());
    }
  }
  if (!p.slack_cells.empty()) {
    // Sized only where marked: each cell is written by its item alone.
    for (uint8_t marked : p.slack_cells) {
      const int64_t n = marked ? d.head_dim : 0;
      res.slack_key_maxima.emplace_back(p.k_dtype, n);
      res.slack_value_maxima.emplace_back(p.v_dtype, n);
    }
  }
  std::atomic<bool> kv_non_finite{false};
  const bool replay = options.passes != AttentionPasses::kReferenceOnly;
  // The states are cleared by the items, each its own rows and heads, in
  // parallel: the states of a large snapshot are as many bytes as the pass
  // reads, too many for one thread to clear.
  UnitStates* const states = options.unit_states;
  if (states != nullptr) {
    states->Allocate(p.units, d, states->has_reference);
  }
  std::vector<int64_t> visible_keys(static_cast<size_t>(d.batch * d.queries));
  const attention_internal::PassContext ctx{
      p,
      &res,
      options.passes != AttentionPasses::kReplayOnly,
      replay,
      replay,
      options.unit_states,
      &kv_non_finite,
      visible_keys.data()};
  // Work items: (row, range of KV heads). Whole rows keep each page read
  // contiguously; a head range reads every token's row in pieces, so rows
  // are split only as far as it takes to give every thread the same number
  // of items (or several each). Splitting further cuts every page read
  // into one piece per head (docs/perf-history.md, "The fused pass").
  const int workers = ResolveThreads(threads);
  int64_t splits = 1;
  while (splits < d.kv_heads && (d.batch * splits) % workers != 0 &&
         d.batch * splits < 4 * workers) {
    splits *= 2;
  }
  splits = std::min(splits, d.kv_heads);
  const int64_t heads_per_item = (d.kv_heads + splits - 1) / splits;
  const int64_t chunks = (d.kv_heads + heads_per_item - 1) / heads_per_item;
  const int64_t items = d.batch * chunks;
  std::atomic<bool> was_cancelled{false};
  ParallelFor(items, threads, [&](int64_t i) {
    if (cancelled != nullptr && cancelled->load(std::memory_order_relaxed)) {
      was_cancelled.store(true);
      return;
    }
    thread_local attention_internal::Scratch scratch;
    const int64_t b = i / chunks;
    const int64_t g0 = (i % chunks) * heads_per_item;
    const int64_t g1 = std::min(d.kv_heads, g0 + heads_per_item);
    if (states != nullptr) states->ClearRows(b, g0 * d.group(), g1 * d.group());
    attention_internal::PrepareItem(p, b, g0, g1, scratch);
    attention_internal::RunPassItem(ctx, b, g0, g1, scratch);
    attention_internal::FinishRows(ctx, scratch, b, g0, g1);
  });
  if (was_cancelled.load()) return absl::CancelledError("audit cancelled");
  res.kv_non_finite = kv_non_finite.load();

  SummariseMerges(p, &visible_keys, &res);
  if (!record_merge_orders) res.merge_orders.clear();
  res.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return res;
}

// The lse of a state no query sees (its out is 0).
constexpr float kEmptyLse32 = -std::numeric_limits<float>::infinity();
constexpr double kEmptyLse64 = -std::numeric_limits<double>::infinity();

void UnitStates::Allocate(const std::vector<std::vector<KvUnit>>& units,
                          const SnapshotDims& dims, bool with_reference) {
  queries = dims.queries;
  q_heads = dims.q_heads;
  head_dim = dims.head_dim;
  has_reference = with_reference;
  unit_base.assign(units.size() + 1, 0);
  for (size_t b = 0; b < units.size(); ++b) {
    unit_base[b + 1] = unit_base[b] + static_cast<int64_t>(units[b].size());
  }
  const size_t states =
      static_cast<size_t>(unit_base.back() * queries * q_heads);
  p_out.resize(states * static_cast<size_t>(head_dim));
  p_lse.resize(states);
  r_out.resize(with_reference ? states * static_cast<size_t>(head_dim) : 0);
  r_lse.resize(with_reference ? states : 0);
}

void UnitStates::Reset(const std::vector<std::vector<KvUnit>>& units,
                       const SnapshotDims& dims, bool with_reference) {
  Allocate(units, dims, with_reference);
  std::fill(p_out.begin(), p_out.end(), 0.0f);
  std::fill(p_lse.begin(), p_lse.end(), kEmptyLse32);
  std::fill(r_out.begin(), r_out.end(), 0.0);
  std::fill(r_lse.begin(), r_lse.end(), kEmptyLse64);
}

void UnitStates::ClearRows(int64_t b, int64_t h0, int64_t h1) {
  const int64_t heads = h1 - h0;
  for (int64_t u = 0; u < unit_base[b + 1] - unit_base[b]; ++u) {
    for (int64_t sq = 0; sq < queries; ++sq) {
      const int64_t first = Index(b, u, sq, h0);
      std::fill_n(&p_out[first * head_dim], heads * head_dim, 0.0f);
      std::fill_n(&p_lse[first], heads, kEmptyLse32);
      if (!has_reference) continue;
      std::fill_n(&r_out[first * head_dim], heads * head_dim, 0.0);
      std::fill_n(&r_lse[first], heads, kEmptyLse64);
    }
  }
}

absl::Status ComputeRunStates(const PreparedAttention& p, const TokenRun& run,
                              int64_t b, int64_t g0, int64_t g1,
                              UnitStates* states) {
  if (run.n > p.dims.page_size || run.n < 0) {
    return absl::InvalidArgumentError(
        "run: more tokens than a page holds (split it)");
  }
  std::atomic<bool> kv_non_finite{false};
  const attention_internal::PassContext ctx{p,     nullptr, false,         true,
                                            false, states,  &kv_non_finite};
  thread_local attention_internal::Scratch scratch;
  attention_internal::PrepareItem(p, b, g0, g1, scratch);
  attention_internal::RunStates(ctx, run, b, g0, g1, scratch);
  if (kv_non_finite.load()) {
    return absl::InvalidArgumentError("run: a K/V value is not finite");
  }
  return absl::OkStatus();
}

void FinishReferenceState(const PreparedAttention& p, int64_t h,
                          const double* acc, double m, double l,
                          double* out_final, double* lse_out) {
  const int64_t D = p.dims.head_dim;
  double acc_scale = 1.0;
  double lse_ref = m + std::log(l);
  if (!p.sinks.empty()) {
    // The sink is one more logit in the denominator, with no value. Work
    // relative to max(m, sink): a (finite, valid) sink far above every
    // score must not overflow exp().
    const double sink = p.sinks[h];
    if (sink > m) {
      acc_scale = std::exp(m - sink);
      l = l * acc_scale + 1.0;
      m = sink;
    } else {
      l += std::exp(sink - m);
    }
    if (p.lse_includes_sinks) lse_ref = m + std::log(l);
  }
  const double vs = p.v_scale[h / p.dims.group()];
  for (int64_t i = 0; i < D; ++i) out_final[i] = acc[i] * acc_scale / l * vs;
  *lse_out = lse_ref;
}

void FinishReplayState(const PreparedAttention& p, int64_t h, float* out,
                       float lse, double* out_final, double* lse_out) {
  const int64_t D = p.dims.head_dim;
  const float lse_keys = lse;
  if (!p.sinks.empty()) {
    thread_local std::vector<float> zeros;
    zeros.assign(static_cast<size_t>(D), 0.0f);
    MergeInto(out, &lse, zeros.data(), static_cast<float>(p.sinks[h]), D);
  }
  const double vs = p.v_scale[h / p.dims.group()];
  const float vs32 = static_cast<float>(vs);
  for (int64_t i = 0; i < D; ++i) {
    const float value = vs == 1.0 ? out[i] : out[i] * vs32;
    out_final[i] = RoundToDType(value, p.output_dtype);
  }
  *lse_out = p.lse_includes_sinks ? lse : lse_keys;
}

}  // namespace attnaudit
