// The simulated split-KV flash-decoding kernel; see flash_decode.h.
#include "sim/flash_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/common/parallel.h"

namespace attnaudit::sim_internal {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2E = 1.4426950408889634f;

// f16 -> f32 through a table (the library converter is exact but slow).
const float* F16Table() {
  static const std::vector<float>* table = [] {
    auto* t = new std::vector<float>(65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      (*t)[i] = F16ToFloat(static_cast<uint16_t>(i));
    }
    return t;
  }();
  return table->data();
}

// Widens n stored values to fp32 and multiplies by the dequant factor (an
// exact no-op for factor 1).
void LoadRow(const char* src, DType dtype, int64_t n, float factor,
             float* dst) {
  switch (dtype) {
    case DType::kBF16: {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(s[i]) * factor;
      return;
    }
    case DType::kF16: {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
      const float* t = F16Table();
      for (int64_t i = 0; i < n; ++i) dst[i] = t[s[i]] * factor;
      return;
    }
    case DType::kF32: {
      const float* s = reinterpret_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i] * factor;
      return;
    }
    case DType::kF8E4M3:  // fp8 and the rest: the table-driven library path
    case DType::kF8E5M2:
    case DType::kF64:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
    case DType::kInvalid:
      break;
  }
  ConvertToFloat(src, dtype, n, dst);
  for (int64_t i = 0; i < n; ++i) dst[i] *= factor;
}

// One (row, KV head) of the kernel.
class WorkItem {
 public:
  WorkItem(const EnginePlan& plan, int64_t b, int64_t kvh, EngineResult* result)
      : p_(plan), b_(b), kvh_(kvh), result_(result) {}

  void Run() {
    const int64_t d = p_.head_dim;
    const int64_t sq = p_.queries;
    for (int64_t h = 0; h < p_.q_heads; ++h) {
      if (KvHeadOf(p_, h) == kvh_) heads_.push_back(h);
    }
    g_ = static_cast<int64_t>(heads_.size());
    if (g_ == 0) return;
    PrepareQueries();
    const int64_t states = sq * g_;
    // Like real split-KV kernels, the number of splits is capped; very long
    // rows get proportionally longer splits.
    const int64_t split = std::max<int64_t>(
        {1, p_.split_tokens, (key_hi_ + kMaxSplits - 1) / kMaxSplits});
    const int64_t first_split = key_lo_ / split;
    const int64_t last_split = (key_hi_ - 1) / split;
    const int64_t n_splits =
        key_hi_ > key_lo_ ? last_split - first_split + 1 : 0;
    part_out_.assign(static_cast<size_t>(n_splits * states * d), 0.0f);
    part_lse_.assign(static_cast<size_t>(n_splits * states), kNegInf);
    kt_.resize(static_cast<size_t>(kTileTokens * d));
    vt_.resize(static_cast<size_t>(kTileTokens * d));
    m_.resize(static_cast<size_t>(states));
    l_.resize(static_cast<size_t>(states));
    acc_.resize(static_cast<size_t>(states * d));
    for (int64_t k = 0; k < n_splits; ++k) {
      const int64_t begin = std::max((first_split + k) * split, key_lo_);
      const int64_t end = std::min((first_split + k + 1) * split, key_hi_);
      RunSplit(begin, end, &part_out_[k * states * d], &part_lse_[k * states]);
    }
    Combine(n_splits);
  }

 private:
  void PrepareQueries() {
    const int64_t d = p_.head_dim;
    const int64_t sq = p_.queries;
    const RopeTable& rope = p_.q_rope != nullptr ? *p_.q_rope : *p_.rope;
    std::vector<float> cos_half(rope.inv_freq().size());
    std::vector<float> sin_half(rope.inv_freq().size());
    qf_.resize(static_cast<size_t>(sq * g_ * d));
    lo_.resize(static_cast<size_t>(sq));
    hi_.resize(static_cast<size_t>(sq));
    key_lo_ = std::numeric_limits<int64_t>::max();
    key_hi_ = 0;
    const char* q = static_cast<const char*>(p_.q->raw());
    const int elt = DTypeSize(p_.q->dtype());
    for (int64_t s = 0; s < sq; ++s) {
      const int64_t qi = p_.query_index[b_ * sq + s];
      const int64_t pos = p_.first_positions[b_] + qi + p_.q_position_delta;
      rope.Angles(pos, cos_half.data(), sin_half.data());
      for (int64_t gi = 0; gi < g_; ++gi) {
        float* dst = &qf_[(s * g_ + gi) * d];
        const int64_t off = ((b_ * sq + s) * p_.q_heads + heads_[gi]) * d;
        LoadRow(q + off * elt, p_.q->dtype(), d, 1.0f, dst);
        rope.RotateWith(dst, cos_half.data(), sin_half.data());
        for (int64_t i = 0; i < d; ++i) {
          dst[i] = RoundToDType(dst[i], p_.q_rope_dtype);
        }
      }
      hi_[s] = std::min(qi + 1, p_.seq_lens[b_]);
      lo_[s] = p_.window > 0 ? std::max<int64_t>(0, qi - p_.window + 1) : 0;
      key_lo_ = std::min(key_lo_, lo_[s]);
      key_hi_ = std::max(key_hi_, hi_[s]);
    }
    if (key_hi_ <= key_lo_) key_lo_ = key_hi_ = 0;
  }

  // The stale content a plan reads for (page, slot), or null.
  const EnginePlan::StaleRead* StaleFor(int32_t page, int64_t slot) const {
    for (const EnginePlan::StaleRead& s : p_.stale_reads) {
      if (s.page == page && (s.slots.empty() || s.slots[slot] != 0)) return &s;
    }
    return nullptr;
  }

  // Loads keys [t, t + n) of one block (K/V of this KV head) into kt_/vt_.
  void LoadTile(int64_t block, int64_t t, int64_t n) {
    const int64_t d = p_.head_dim;
    const int64_t ps = p_.page_size;
    const int32_t page = p_.block_pages[b_][block];
    const int64_t slot0 = t - block * ps;
    const DType dtype = p_.k_pages->dtype();
    const int elt = DTypeSize(dtype);
    for (int64_t j = 0; j < n; ++j) {
      const EnginePlan::StaleRead* stale = StaleFor(page, slot0 + j);
      const char* kbase;
      const char* vbase;
      int64_t row;  // element offset of (slot0 + j, kvh) in the buffers
      if (stale != nullptr) {
        kbase = static_cast<const char*>(stale->k->raw());
        vbase = static_cast<const char*>(stale->v->raw());
        row = ((slot0 + j) * p_.kv_heads + kvh_) * d;
      } else {
        kbase = static_cast<const char*>(p_.k_pages->raw());
        vbase = static_cast<const char*>(p_.v_pages->raw());
        row = ((static_cast<int64_t>(page) * ps + slot0 + j) * p_.kv_heads +
               kvh_) *
              d;
      }
      LoadRow(kbase + row * elt, dtype, d, p_.k_descale[kvh_], &kt_[j * d]);
      LoadRow(vbase + row * elt, dtype, d, p_.v_descale[kvh_], &vt_[j * d]);
    }
    if (p_.dequant_bf16) {
      for (int64_t i = 0; i < n * d; ++i) {
        kt_[i] = RoundToDType(kt_[i], DType::kBF16);
        vt_[i] = RoundToDType(vt_[i], DType::kBF16);
      }
    }
    if (p_.rotate_k_again || p_.unrotate_k) RotateTileKeys(t, n);
  }

  // k-rope-twice rotates the cached (post-RoPE) keys again at their
  // positions; k-rope-missing rotates them back (by -position, undoing the
  // table's magnitude), as if the cache held unrotated keys.
  void RotateTileKeys(int64_t t, int64_t n) {
    const int64_t d = p_.head_dim;
    const RopeTable& rope = *p_.rope;
    cos_.resize(rope.inv_freq().size());
    sin_.resize(rope.inv_freq().size());
    const float undo = 1.0f / (rope.magnitude() * rope.magnitude());
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = p_.first_positions[b_] + t + j;
      rope.Angles(p_.unrotate_k ? -pos : pos, cos_.data(), sin_.data());
      float* k = &kt_[j * d];
      rope.RotateWith(k, cos_.data(), sin_.data());
      if (p_.unrotate_k && undo != 1.0f) {
        for (int64_t i = 0; i < rope.rotary_dim(); ++i) k[i] *= undo;
      }
    }
  }

  // Whether this run attends logical key j of the row (CP: the rank's own).
  bool Attends(int64_t j) const {
    return p_.rank < 0 || (*p_.token_owner)[b_][j] == p_.rank;
  }

  void RunSplit(int64_t begin, int64_t end, float* out, float* lse) {
    const int64_t d = p_.head_dim;
    const int64_t sq = p_.queries;
    const int64_t ps = p_.page_size;
    std::fill(m_.begin(), m_.end(), kNegInf);
    std::fill(l_.begin(), l_.end(), 0.0f);
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    const int64_t dropped =
        p_.dropped_block.empty() ? -1 : p_.dropped_block[b_];
    float score[kTileTokens];
    int64_t key[kTileTokens];
    for (int64_t t = begin; t < end;) {
      const int64_t block = t / ps;
      const int64_t t1 = std::min({end, (block + 1) * ps, t + kTileTokens});
      if (block == dropped) {  // the buggy loop never visits this block
        t = t1;
        continue;
      }
      LoadTile(block, t, t1 - t);
      for (int64_t s = 0; s < sq; ++s) {
        const int64_t a = std::max(t, lo_[s]);
        const int64_t e = std::min(t1, hi_[s]);
        if (a >= e) continue;
        for (int64_t gi = 0; gi < g_; ++gi) {
          const int64_t idx = s * g_ + gi;
          const float* qv = &qf_[idx * d];
          float tile_max = kNegInf;
          int64_t cnt = 0;
          for (int64_t j = a; j < e; ++j) {
            if (!Attends(j)) continue;
            float x = DotF32(qv, &kt_[(j - t) * d], d) * p_.scale;
            if (p_.softcap > 0.0f) x = p_.softcap * std::tanh(x / p_.softcap);
            score[cnt] = x;
            key[cnt++] = j;
            tile_max = std::max(tile_max, x);
          }
          if (cnt == 0) continue;
          const float m_old = m_[idx];
          const float m_new = std::max(m_old, tile_max);
          const float alpha = m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
          float sum = 0.0f;
          for (int64_t j = 0; j < cnt; ++j) {
            score[j] = std::exp(score[j] - m_new);
            sum += score[j];
            // Tensor cores multiply P in bf16/f16; the sum stays fp32.
            if (p_.p_dtype != DType::kF32) {
              score[j] = RoundToDType(score[j], p_.p_dtype);
            }
          }
          l_[idx] = l_[idx] * alpha + sum;
          m_[idx] = m_new;
          float* acc = &acc_[idx * d];
          for (int64_t i = 0; i < d; ++i) acc[i] *= alpha;
          for (int64_t j = 0; j < cnt; ++j) {
            const float pj = score[j];
            const float* v = &vt_[(key[j] - t) * d];
            for (int64_t i = 0; i < d; ++i) acc[i] += pj * v[i];
          }
        }
      }
      t = t1;
    }
    for (int64_t idx = 0; idx < sq * g_; ++idx) {
      if (!(l_[idx] > 0.0f)) continue;  // nothing visible: lse stays -inf
      const float inv = 1.0f / l_[idx];
      for (int64_t i = 0; i < d; ++i)
        out[idx * d + i] = acc_[idx * d + i] * inv;
      lse[idx] = m_[idx] + std::log(l_[idx]);
    }
  }

  // The split-KV combine kernel: max-lse weighted sum in fp32, then sinks,
  // then the one cast of out.
  void Combine(int64_t n_splits) {
    const int64_t d = p_.head_dim;
    const int64_t sq = p_.queries;
    const int64_t states = sq * g_;
    std::vector<float> o(static_cast<size_t>(d));
    for (int64_t s = 0; s < sq; ++s) {
      for (int64_t gi = 0; gi < g_; ++gi) {
        const int64_t idx = s * g_ + gi;
        const int64_t h = heads_[gi];
        float m = kNegInf;
        for (int64_t k = 0; k < n_splits; ++k) {
          m = std::max(m, part_lse_[k * states + idx]);
        }
        std::fill(o.begin(), o.end(), 0.0f);
        float lse = kNegInf;
        if (p_.running_out_dtype != DType::kF32) {
          lse = FoldRounded(n_splits, idx, o.data());
          if (lse != kNegInf) ApplySink(h, lse, o.data());
        } else if (m != kNegInf) {
          float wsum = 0.0f;
          for (int64_t k = 0; k < n_splits; ++k) {
            const float lk = part_lse_[k * states + idx];
            if (lk == kNegInf) continue;
            const float w = std::exp(lk - m);
            wsum += w;
            const float* ok = &part_out_[(k * states + idx) * d];
            for (int64_t i = 0; i < d; ++i) o[i] += w * ok[i];
          }
          const float inv = 1.0f / wsum;
          for (int64_t i = 0; i < d; ++i) o[i] *= inv;
          lse = m + std::log(wsum);
          ApplySink(h, lse, o.data());
        }
        const int64_t row = (b_ * sq + s) * p_.q_heads + h;
        void* out = result_->out.mutable_raw();
        for (int64_t i = 0; i < d; ++i) {
          StoreFromFloat(out, p_.out_dtype, row * d + i, o[i]);
        }
        result_->lse.mutable_data<float>()[row] =
            p_.lse_base2 ? lse * kLog2E : lse;
      }
    }
  }

  void ApplySink(int64_t h, float lse, float* o) const {
    if (p_.sinks.empty()) return;
    const float keep = 1.0f / (1.0f + std::exp(p_.sinks[h] - lse));
    for (int64_t i = 0; i < p_.head_dim; ++i) o[i] *= keep;
  }

  // bf16-running-out: the splits folded one by one into a running output
  // that is rounded to running_out_dtype after every step (a combine that
  // merges in place into a low-precision buffer). Returns the lse.
  float FoldRounded(int64_t n_splits, int64_t idx, float* o) const {
    const int64_t d = p_.head_dim;
    const int64_t states = p_.queries * g_;
    float lse = kNegInf;
    for (int64_t k = 0; k < n_splits; ++k) {
      const float lk = part_lse_[k * states + idx];
      if (lk == kNegInf) continue;
      const float* ok = &part_out_[(k * states + idx) * d];
      if (lse == kNegInf) {
        for (int64_t i = 0; i < d; ++i) {
          o[i] = RoundToDType(ok[i], p_.running_out_dtype);
        }
        lse = lk;
        continue;
      }
      const float m = std::max(lse, lk);
      const float wa = std::exp(lse - m), wb = std::exp(lk - m);
      const float inv = 1.0f / (wa + wb);
      for (int64_t i = 0; i < d; ++i) {
        o[i] =
            RoundToDType((wa * o[i] + wb * ok[i]) * inv, p_.running_out_dtype);
      }
      lse = m + std::log(wa + wb);
    }
    return lse;
  }

  const EnginePlan& p_;
  const int64_t b_;
  const int64_t kvh_;
  EngineResult* result_;
  std::vector<int64_t> heads_;
  int64_t g_ = 0;
  std::vector<float> qf_;
  std::vector<int64_t> lo_, hi_;
  int64_t key_lo_ = 0, key_hi_ = 0;
  std::vector<float> kt_, vt_, m_, l_, acc_, part_out_, part_lse_;
  std::vector<float> cos_, sin_;
};

}  // namespace

float DotF32(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += a[d + l] * b[d + l];
  }
  float tail = 0.0f;
  for (; d < n; ++d) tail += a[d] * b[d];
  return (((lane[0] + lane[4]) + (lane[2] + lane[6])) +
          ((lane[1] + lane[5]) + (lane[3] + lane[7]))) +
         tail;
}

EngineResult RunFlashDecode(const EnginePlan& plan) {
  EngineResult result;
  result.out = Tensor(plan.out_dtype,
                      {plan.batch, plan.queries, plan.q_heads, plan.head_dim});
  result.lse = Tensor(DType::kF32, {plan.batch, plan.queries, plan.q_heads});
  ParallelFor(plan.batch * plan.kv_heads, plan.threads, [&](int64_t item) {
    WorkItem(plan, item / plan.kv_heads, item % plan.kv_heads, &result).Run();
  });
  return result;
}

}  // namespace attnaudit::sim_internal
