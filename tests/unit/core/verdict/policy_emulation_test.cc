// The tolerance policy against an emulated engine. The test builds its own
// three results for one decode query:
//   R: fp64 attention over all keys (then rounded to the output dtype);
//   P: per-16-key-page fp32 partials folded left with the docs/DESIGN.md §2
//   merge (the replay merges in a tree, whose rounding is smaller: the
//   test's P is the harder case for the tolerances); E: a flash-decoding
//   kernel: split-KV of 256 keys, 64-key tiles with an
//      online softmax in fp32, probabilities rounded to bf16 before P.V (as
//      tensor-core kernels do), an fp32 combine of the splits, bf16 output.
// Clean engines must PASS every comparison for contexts up to 128K; engines
// with real bugs must DRIFT. Everything here is independent of sim/.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/drift/drift.h"
#include "core/verdict/verdict.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

float RoundBf16(float f) {  // round to nearest even, finite inputs
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &b, 4);
  return f;
}

struct Problem {
  int64_t hq = 4, hkv = 2, d = 128, len = 0;
  std::vector<float> q_pre;  // [hq][d], before RoPE
  std::vector<float> k, v;   // [len][hkv][d], k already rotated
  int64_t position = 0;      // the query's position (keys at 0..len-1)
  // fp8 e4m3 KV with per-tensor scales: k and v hold the dequantised values
  // q8 * scale (fp32), which R and P use as they are.
  bool fp8 = false;
  float k_scale = 1, v_scale = 1;
};

// Rounds to fp8 e4m3 (3 mantissa bits, min normal 2^-6); |x| < 448 here.
float RoundE4m3(float x) {
  if (x == 0) return 0;
  int e = 0;
  std::frexp(std::fabs(x), &e);
  const float quantum = std::ldexp(1.0f, std::max(e - 1, -6) - 3);
  return std::copysign(std::nearbyint(std::fabs(x) / quantum) * quantum, x);
}

Problem MakeProblem(int64_t len, float q_scale, uint64_t seed,
                    bool fp8 = false) {
  Problem p;
  p.fp8 = fp8;
  p.len = len;
  p.position = len - 1;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.q_pre.resize(p.hq * p.d);
  for (float& x : p.q_pre) x = RoundBf16(normal(rng) * q_scale);
  p.k.resize(len * p.hkv * p.d);
  p.v.resize(len * p.hkv * p.d);
  if (fp8) {
    p.k_scale = 0.0173f;
    p.v_scale = 0.0219f;
    for (float& x : p.k) x = RoundE4m3(normal(rng) / p.k_scale) * p.k_scale;
    for (float& x : p.v) x = RoundE4m3(normal(rng) / p.v_scale) * p.v_scale;
  } else {
    for (float& x : p.k) x = RoundBf16(normal(rng));
    for (float& x : p.v) x = RoundBf16(normal(rng));
  }
  return p;
}

// NeoX RoPE in fp32 at `pos`, theta 5e5, then one cast to bf16.
std::vector<float> RotateQ(const Problem& p, int64_t pos) {
  std::vector<float> q(p.q_pre.size());
  const int64_t half = p.d / 2;
  for (int64_t h = 0; h < p.hq; ++h) {
    const float* x = &p.q_pre[h * p.d];
    for (int64_t i = 0; i < half; ++i) {
      const float freq = std::pow(5e5f, -2.0f * i / p.d);
      const float angle = static_cast<float>(pos) * freq;
      const float c = std::cos(angle), s = std::sin(angle);
      q[h * p.d + i] = RoundBf16(x[i] * c - x[i + half] * s);
      q[h * p.d + i + half] = RoundBf16(x[i + half] * c + x[i] * s);
    }
  }
  return q;
}

struct Result {
  std::vector<double> out;  // [hq][d], as written (rounded when bf16)
  std::vector<double> lse;  // [hq], natural log
};

Result Reference(const Problem& p, bool round_bf16) {
  const std::vector<float> q = RotateQ(p, p.position);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.d));
  Result r{std::vector<double>(p.hq * p.d), std::vector<double>(p.hq)};
  std::vector<double> s(p.len), o(p.d);
  for (int64_t h = 0; h < p.hq; ++h) {
    const int64_t g = h / (p.hq / p.hkv);
    double m = -INFINITY;
    for (int64_t j = 0; j < p.len; ++j) {
      const float* kj = &p.k[(j * p.hkv + g) * p.d];
      double a = 0;
      for (int64_t i = 0; i < p.d; ++i) a += double{q[h * p.d + i]} * kj[i];
      s[j] = a * scale;
      m = std::max(m, s[j]);
    }
    double sum = 0;
    std::fill(o.begin(), o.end(), 0.0);
    for (int64_t j = 0; j < p.len; ++j) {
      const double w = std::exp(s[j] - m);
      sum += w;
      const float* vj = &p.v[(j * p.hkv + g) * p.d];
      for (int64_t i = 0; i < p.d; ++i) o[i] += w * vj[i];
    }
    r.lse[h] = m + std::log(sum);
    for (int64_t i = 0; i < p.d; ++i) {
      const double x = o[i] / sum;
      r.out[h * p.d + i] = round_bf16 ? RoundBf16(static_cast<float>(x)) : x;
    }
  }
  return r;
}

// Attention state of a key range in fp32: normalised out and lse.
struct State {
  std::vector<float> out;
  float lse;
};

void MergeInto(State* acc,
               const State& next) {  // docs/DESIGN.md §2 merge, fp32
  const float m = std::max(acc->lse, next.lse);
  const float wa = std::exp(acc->lse - m), wb = std::exp(next.lse - m);
  const float sum = wa + wb;
  for (size_t i = 0; i < acc->out.size(); ++i) {
    acc->out[i] = (wa * acc->out[i] + wb * next.out[i]) / sum;
  }
  acc->lse = m + std::log(sum);
}

Result Replay(const Problem& p, bool round_bf16) {
  const std::vector<float> q = RotateQ(p, p.position);
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.d));
  Result r{std::vector<double>(p.hq * p.d), std::vector<double>(p.hq)};
  for (int64_t h = 0; h < p.hq; ++h) {
    const int64_t g = h / (p.hq / p.hkv);
    State acc;
    for (int64_t b0 = 0; b0 < p.len; b0 += 16) {
      const int64_t b1 = std::min(p.len, b0 + 16);
      float s[16], m = -INFINITY;
      for (int64_t j = b0; j < b1; ++j) {
        float a = 0;
        for (int64_t i = 0; i < p.d; ++i) {
          a += q[h * p.d + i] * p.k[(j * p.hkv + g) * p.d + i];
        }
        s[j - b0] = a * scale;
        m = std::max(m, s[j - b0]);
      }
      State blk{std::vector<float>(p.d, 0.0f), 0.0f};
      float l = 0;
      for (int64_t j = b0; j < b1; ++j) {
        const float w = std::exp(s[j - b0] - m);
        l += w;
        for (int64_t i = 0; i < p.d; ++i) {
          blk.out[i] += w * p.v[(j * p.hkv + g) * p.d + i];
        }
      }
      for (float& x : blk.out) x /= l;
      blk.lse = m + std::log(l);
      if (b0 == 0) {
        acc = blk;
      } else {
        MergeInto(&acc, blk);
      }
    }
    r.lse[h] = acc.lse;
    for (int64_t i = 0; i < p.d; ++i) {
      r.out[h * p.d + i] = round_bf16 ? RoundBf16(acc.out[i]) : acc.out[i];
    }
  }
  return r;
}

enum class Bug {
  kNone,
  kStalePage,   // one page of K/V read with outdated content
  kWrongScale,  // 1/D instead of 1/sqrt(D)
  kLseBase2,    // lse returned in base 2
  kRopeOffset,  // q rotated at position + 1
  kDropSplit,   // one split skipped
  kGqaMapping,  // query head h reads KV head h % Hkv
  kFp8Scale,    // fp8 K dequantised with v_scale
};

Result Engine(const Problem& p, Bug bug, bool round_bf16) {
  constexpr int64_t kSplit = 256, kTile = 64;
  const std::vector<float> q =
      RotateQ(p, p.position + (bug == Bug::kRopeOffset ? 1 : 0));
  const float scale = bug == Bug::kWrongScale
                          ? 1.0f / static_cast<float>(p.d)
                          : 1.0f / std::sqrt(static_cast<float>(p.d));
  // A stale page: the page at a third of the context holds other content.
  std::vector<float> k = p.k, v = p.v;
  if (p.fp8) {
    // Like vLLM's Triton path: dequantise in fp32, round to the bf16
    // compute type. A clean fp8 engine differs from R by this rounding.
    const float k_fix = bug == Bug::kFp8Scale ? p.v_scale / p.k_scale : 1.0f;
    for (float& x : k) x = RoundBf16(x * k_fix);
    for (float& x : v) x = RoundBf16(x);
  }
  if (bug == Bug::kStalePage) {
    std::mt19937_64 rng(99);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t first = (p.len / 3) / 16 * 16;
    for (int64_t i = first * p.hkv * p.d; i < (first + 16) * p.hkv * p.d; ++i) {
      k[i] = RoundBf16(normal(rng));
      v[i] = RoundBf16(normal(rng));
    }
  }
  const int64_t num_groups = p.hq / p.hkv;
  Result r{std::vector<double>(p.hq * p.d), std::vector<double>(p.hq)};
  for (int64_t h = 0; h < p.hq; ++h) {
    const int64_t g = bug == Bug::kGqaMapping ? h % p.hkv : h / num_groups;
    std::vector<State> splits;
    for (int64_t s0 = 0; s0 < p.len; s0 += kSplit) {
      if (bug == Bug::kDropSplit && s0 == kSplit) continue;
      const int64_t s1 = std::min(p.len, s0 + kSplit);
      float m = -INFINITY, l = 0;
      std::vector<float> acc(p.d, 0.0f);
      for (int64_t t0 = s0; t0 < s1; t0 += kTile) {
        const int64_t t1 = std::min(s1, t0 + kTile);
        float s[kTile], tile_max = -INFINITY;
        for (int64_t j = t0; j < t1; ++j) {
          float a = 0;
          for (int64_t i = 0; i < p.d; ++i) {
            a += q[h * p.d + i] * k[(j * p.hkv + g) * p.d + i];
          }
          s[j - t0] = a * scale;
          tile_max = std::max(tile_max, s[j - t0]);
        }
        const float new_max = std::max(m, tile_max);
        const float alpha = std::exp(m - new_max);
        l *= alpha;
        for (float& x : acc) x *= alpha;
        for (int64_t j = t0; j < t1; ++j) {
          const float w = std::exp(s[j - t0] - new_max);
          l += w;
          const float w16 = RoundBf16(w);  // P is bf16 for the P.V MMA
          for (int64_t i = 0; i < p.d; ++i) {
            acc[i] += w16 * v[(j * p.hkv + g) * p.d + i];
          }
        }
        m = new_max;
      }
      for (float& x : acc) x /= l;
      splits.push_back({acc, m + std::log(l)});
    }
    float m = -INFINITY;
    for (const State& st : splits) m = std::max(m, st.lse);
    float wsum = 0;
    std::vector<float> out(p.d, 0.0f);
    for (const State& st : splits) {
      const float w = std::exp(st.lse - m);
      wsum += w;
      for (int64_t i = 0; i < p.d; ++i) out[i] += w * st.out[i];
    }
    const float lse = m + std::log(wsum);
    r.lse[h] = bug == Bug::kLseBase2 ? lse / std::log(2.0f) : lse;
    for (int64_t i = 0; i < p.d; ++i) {
      const float x = out[i] / wsum;
      r.out[h * p.d + i] = round_bf16 ? RoundBf16(x) : x;
    }
  }
  return r;
}

// Selected log-probs through a synthetic V=256 head, rows N(0, 1/sqrt(HqD)).
struct Head {
  Tensor weights;
  double max_row_l1 = 0;
  Tensor ids;
};

Head MakeHead(const Problem& p) {
  const int64_t vocab = 256, hidden = p.hq * p.d;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(vocab * hidden);
  Head head;
  for (int64_t r = 0; r < vocab; ++r) {
    double l1 = 0;
    for (int64_t i = 0; i < hidden; ++i) {
      w[r * hidden + i] = normal(rng) / std::sqrt(static_cast<float>(hidden));
      l1 += std::fabs(w[r * hidden + i]);
    }
    head.max_row_l1 = std::max(head.max_row_l1, l1);
  }
  std::string bytes(w.size() * 4, '\0');
  std::memcpy(&bytes[0], w.data(), bytes.size());
  head.weights = Tensor(DType::kF32, {vocab, hidden}, std::move(bytes));
  const int32_t id = 17;
  head.ids = Tensor(DType::kI32, {1, 1}, std::string(4, '\0'));
  std::memcpy(head.ids.mutable_raw(), &id, 4);
  return head;
}

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Runs one comparison through the production API: tolerances, drift stats,
// decision. `reference` supplies the magnitudes as the audit does.
ComparisonResult Compare(Comparison c, const Problem& p, const Result& cand,
                         const Result& base, const Result& reference,
                         DType out_dtype, const Head& head) {
  ToleranceInputs in;
  in.comparison = c;
  in.output_dtype = out_dtype;
  in.kv_dtype = p.fp8 ? DType::kF8E4M3 : DType::kBF16;
  in.max_merged_blocks = (p.len + 15) / 16;
  in.max_context = p.len;
  in.max_abs_out_reference = MaxAbs(reference.out);
  in.max_abs_lse_reference = MaxAbs(reference.lse);
  in.lm_head_max_row_l1 = head.max_row_l1;
  const Tolerances tol = ComputeTolerances(in, {});

  auto view = [&](const std::vector<double>& v, std::vector<int64_t> shape) {
    DenseView dv;
    dv.values = v.data();
    dv.shape = std::move(shape);
    return dv;
  };
  const std::vector<int64_t> out_shape = {1, 1, p.hq, p.d};
  ComparisonResult r;
  r.comparison = c;
  DriftOptions o;
  o.ulp_dtype = out_dtype;
  o.tolerance = tol.out_abs;
  r.out =
      *ComputeDrift(view(cand.out, out_shape), view(base.out, out_shape), o);
  r.has_out = true;
  o.ulp_dtype = DType::kF32;
  o.tolerance = tol.lse_abs;
  r.lse = *ComputeDrift(view(cand.lse, {1, 1, p.hq}),
                        view(base.lse, {1, 1, p.hq}), o);
  r.has_lse = true;
  const std::vector<double> lp_c = *SelectedLogprobs(
      view(cand.out, out_shape), head.weights, head.ids, nullptr, 1.0);
  const std::vector<double> lp_b = *SelectedLogprobs(
      view(base.out, out_shape), head.weights, head.ids, nullptr, 1.0);
  o.tolerance = tol.logprob_abs;
  r.logprob = *ComputeDrift(view(lp_c, {1, 1}), view(lp_b, {1, 1}), o);
  r.has_logprob = true;
  DecideComparison(&r);
  return r;
}

std::string Describe(const ComparisonResult& r) {
  std::string s = std::string(ComparisonShortName(r.comparison)) + ": ";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "out %.2e/%.2e (%.0f ulp) lse %.2e/%.2e logprob %.2e/%.2e",
                r.out.max_abs, r.out.tolerance, r.out.max_ulp, r.lse.max_abs,
                r.lse.tolerance, r.logprob.max_abs, r.logprob.tolerance);
  s += buf;
  for (const std::string& reason : r.reasons) s += "\n  " + reason;
  return s;
}

struct CleanCase {
  int64_t len;
  float q_scale;  // 1: diffuse attention; 4, 8: peaked
  bool bf16_out;
  bool fp8 = false;
};

class CleanEngineTest : public ::testing::TestWithParam<CleanCase> {};

TEST_P(CleanEngineTest, AllComparisonsPass) {
  const CleanCase cc = GetParam();
  const Problem p = MakeProblem(cc.len, cc.q_scale, 1000 + cc.len, cc.fp8);
  const Head head = MakeHead(p);
  const DType out_dtype = cc.bf16_out ? DType::kBF16 : DType::kF32;
  const Result ref = Reference(p, cc.bf16_out);
  const Result rep = Replay(p, cc.bf16_out);
  const Result eng = Engine(p, Bug::kNone, cc.bf16_out);
  for (const ComparisonResult& r : {Compare(Comparison::kEngineVsReference, p,
                                            eng, ref, ref, out_dtype, head),
                                    Compare(Comparison::kReplayVsReference, p,
                                            rep, ref, ref, out_dtype, head),
                                    Compare(Comparison::kEngineVsReplay, p, eng,
                                            rep, ref, out_dtype, head)}) {
    EXPECT_EQ(r.verdict, Verdict::kPass) << Describe(r);
    // The emulated engine really drifts: the policy is not passing zeros.
    if (r.comparison == Comparison::kEngineVsReference) {
      EXPECT_GT(r.lse.max_abs, 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Contexts, CleanEngineTest,
    ::testing::Values(CleanCase{1000, 1, true}, CleanCase{1024, 4, true},
                      CleanCase{4096, 1, true}, CleanCase{16384, 1, true},
                      CleanCase{16384, 4, true}, CleanCase{16384, 1, false},
                      CleanCase{16384, 4, false}, CleanCase{131072, 1, true},
                      CleanCase{131072, 4, false},
                      CleanCase{4096, 1, true, true},
                      CleanCase{4096, 8, true, true},
                      CleanCase{16384, 4, false, true}));

struct BugCase {
  Bug bug;
  int64_t len;
  const char* name;
  bool fp8 = false;
};

class BuggyEngineTest : public ::testing::TestWithParam<BugCase> {};

TEST_P(BuggyEngineTest, EngineComparisonsDrift) {
  const BugCase bc = GetParam();
  SCOPED_TRACE(bc.name);
  const Problem p = MakeProblem(bc.len, 1, 2000 + bc.len, bc.fp8);
  const Head head = MakeHead(p);
  const Result ref = Reference(p, true);
  const Result rep = Replay(p, true);
  const Result eng = Engine(p, bc.bug, true);
  const ComparisonResult er = Compare(Comparison::kEngineVsReference, p, eng,
                                      ref, ref, DType::kBF16, head);
  const ComparisonResult ep = Compare(Comparison::kEngineVsReplay, p, eng, rep,
                                      ref, DType::kBF16, head);
  const ComparisonResult pr = Compare(Comparison::kReplayVsReference, p, rep,
                                      ref, ref, DType::kBF16, head);
  EXPECT_EQ(er.verdict, Verdict::kDrift) << Describe(er);
  EXPECT_EQ(ep.verdict, Verdict::kDrift) << Describe(ep);
  EXPECT_EQ(pr.verdict, Verdict::kPass) << Describe(pr);
}

INSTANTIATE_TEST_SUITE_P(
    Bugs, BuggyEngineTest,
    ::testing::Values(BugCase{Bug::kStalePage, 4096, "stale-page 4K"},
                      BugCase{Bug::kWrongScale, 4096, "wrong-scale 4K"},
                      BugCase{Bug::kLseBase2, 4096, "lse-base2 4K"},
                      BugCase{Bug::kRopeOffset, 4096, "rope-offset 4K"},
                      BugCase{Bug::kDropSplit, 4096, "drop-split 4K"},
                      BugCase{Bug::kGqaMapping, 4096, "gqa-mapping 4K"},
                      BugCase{Bug::kRopeOffset, 32768, "rope-offset 32K"},
                      BugCase{Bug::kDropSplit, 32768, "drop-split 32K"},
                      BugCase{Bug::kStalePage, 4096, "fp8 stale-page 4K", true},
                      BugCase{Bug::kFp8Scale, 4096, "fp8-scale 4K", true},
                      BugCase{Bug::kRopeOffset, 4096, "fp8 rope-offset 4K",
                              true}));

}  // namespace
}  // namespace attnaudit
