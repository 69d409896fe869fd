// Peaked attention (docs/SIMULATOR.md, "Peaked attention"): the sink's
// share of every query head's key weight, set through q's value on the
// sink pair once the rest of the row's scores are known.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/common/parallel.h"
#include "sim/random.h"
#include "sim/synth_internal.h"

namespace attnaudit::sim_internal {
namespace {

// Key `index` of `row` (post-RoPE, dequantised) of KV head g into k.
void LoadKey(const SynthLayout& layout, const KvPool& pool, int64_t row,
             int64_t index, int64_t g, int64_t kv_heads, int64_t d, float* k) {
  const int64_t ps = layout.page_size;
  const int64_t page = layout.block_pages[row][index / ps];
  const int64_t off = ((page * ps + index % ps) * kv_heads + g) * d;
  const DType dtype = pool.k_pages.dtype();
  ConvertToFloat(
      static_cast<const char*>(pool.k_pages.raw()) + off * DTypeSize(dtype),
      dtype, d, k);
  if (pool.k_scale.present()) {
    const float s = pool.k_scale.data<float>()[g];
    for (int64_t i = 0; i < d; ++i) k[i] *= s;
  }
}

double Dot(const float* a, const float* b, int64_t n) {
  double x = 0;
  for (int64_t i = 0; i < n; ++i) x += double{a[i]} * double{b[i]};
  return x;
}

// The sink pair's value for query head h of (row, s): the rest's LSE over
// the visible keys but token 0, then the value that puts the sink's logit
// at rest + logit(share). q_row is the head's pre-RoPE q (sink pair 0).
float SinkValue(const SynthOptions& o, const SynthLayout& layout,
                const ContentModel& model, const RopeTable& rope,
                const KvPool& pool, double scale, int64_t row, int64_t s,
                int64_t h, int64_t lo, int64_t hi, const float* q_row) {
  const int64_t d = model.head_dim;
  const int64_t g = h / (model.q_heads / model.kv_heads);
  const int64_t t = layout.first_positions[row] + hi - 1;
  std::vector<float> c(rope.inv_freq().size()), sn(c.size());
  rope.Angles(t, c.data(), sn.data());
  std::vector<float> q(q_row, q_row + d), unit(static_cast<size_t>(d), 0.0f);
  unit[model.sink_dims[0]] = 1.0f;
  rope.RotateWith(q.data(), c.data(), sn.data());
  rope.RotateWith(unit.data(), c.data(), sn.data());
  std::vector<float> k(static_cast<size_t>(d));
  double m = -std::numeric_limits<double>::infinity(), sum = 0;
  for (int64_t i = std::max<int64_t>(lo, 1); i < hi; ++i) {
    LoadKey(layout, pool, row, i, g, model.kv_heads, d, k.data());
    const double x = Dot(q.data(), k.data(), d) * scale;
    if (x > m) {
      sum *= std::exp(m - x);
      m = x;
    }
    sum += std::exp(x - m);
  }
  LoadKey(layout, pool, row, 0, g, model.kv_heads, d, k.data());
  const double base = Dot(q.data(), k.data(), d) * scale;
  const double slope = Dot(unit.data(), k.data(), d) * scale;
  NormalSource ns(
      DeriveSeed(o.seed, {kTagSink, static_cast<uint64_t>(row),
                          static_cast<uint64_t>(s), static_cast<uint64_t>(h)}));
  const double share =
      o.sink_share_min + (o.sink_share_max - o.sink_share_min) * ns.Uniform();
  if (!(slope > 0) || !(sum > 0)) return 0.0f;  // the sink alone
  const double want = m + std::log(sum) + std::log(share / (1.0 - share));
  return static_cast<float>((want - base) / slope);
}

}  // namespace

void SetSinkShares(const SynthOptions& options, const SynthLayout& layout,
                   const ContentModel& model, const RopeTable& rope,
                   const KvPool& pool, double scale, int64_t window,
                   Tensor* q) {
  if (model.sink_dims[0] < 0) return;
  const int64_t d = model.head_dim, hq = model.q_heads;
  const int64_t cells = layout.batch * layout.queries;
  const DType dtype = q->dtype();
  void* dst = q->mutable_raw();
  ParallelFor(cells * hq, options.threads, [&](int64_t k) {
    const int64_t row = k / (layout.queries * hq);
    const int64_t s = (k / hq) % layout.queries;
    const int64_t h = k % hq;
    const int64_t qi = layout.seq_lens[row] - layout.queries + s;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, qi - window + 1) : 0;
    if (lo > 0) return;  // the sink is outside the window
    std::vector<float> q_row(static_cast<size_t>(d));
    ConvertToFloat(static_cast<const char*>(dst) + k * d * DTypeSize(dtype),
                   dtype, d, q_row.data());
    const float v = SinkValue(options, layout, model, rope, pool, scale, row, s,
                              h, lo, qi + 1, q_row.data());
    StoreFromFloat(dst, dtype, k * d + model.sink_dims[0], v);
  });
}

}  // namespace attnaudit::sim_internal
