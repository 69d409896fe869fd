// Naive long-double oracles for decode attention and RoPE, written from the
// definitions (docs/NUMERICS.md; HF transformers' documented RoPE formulas),
// independently of core/attention and core/rope. Test-only; slow on
// purpose (one key at a time, no blocking, no online softmax).
//
// Attention, for row b, query s at position t, head h (KV head
// g = h / (Hq / Hkv)): gather the row's logical keys, keep those with
// pos <= t and, with a window W, t - W < pos (HF) or t - W <= pos (flash
// left), scores s_j = scale * k_scale[g] * (q . k_j), soft-cap
// cap * tanh(s / cap), and
//   out = v_scale[g] * sum_j exp(s_j) v_j / (sum_j exp(s_j) + [exp(sink_h)])
//   lse = ln(sum_j exp(s_j))          (keys only)
//   lse_with_sinks = ln(sum_j exp(s_j) + exp(sink_h))
// all in long double with max subtraction. The case must be post-RoPE (use
// PostRopeEquivalent first).
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_TESTING_ATTENTION_ORACLE_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_TESTING_ATTENTION_ORACLE_H_

#include <cstdint>
#include <vector>

#include "core/snapshot/snapshot.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {

struct OracleResult {
  std::vector<long double> out;             // [B, Sq, Hq, D]
  std::vector<long double> lse_keys;        // [B, Sq, Hq]
  std::vector<long double> lse_with_sinks;  // [B, Sq, Hq] (== keys w/o sinks)
  // What the library reports: lse_with_sinks iff the case declares the
  // engine LSE includes sinks (and sinks exist), else lse_keys.
  std::vector<long double> lse_declared;
  std::vector<int64_t> visible;  // [B, Sq] visible key count
  // Magnitudes that size the floating-point error bounds:
  long double max_abs_score_terms = 0;  // max scale*|ks|*sum_i |q_i k_i|
  long double max_abs_v = 0;            // max |v * v_scale|
  long double max_abs_out = 0;
  long double max_abs_lse = 0;
};

// Aborts (test bug) for a pre-RoPE case.
OracleResult OracleAttention(const LogicalCase& c);

// [B][Sq][k]: ascending logical blocks of `page_size` tokens holding >= 1
// key visible to the query (the replay's merge order).
std::vector<std::vector<std::vector<int32_t>>> OracleMergeOrders(
    const LogicalCase& c, int64_t page_size);

// Error bounds (absolute) for the library's results against the oracle.
// Let u be the unit roundoff of the arithmetic (2^-53 for R, 2^-24 for P),
// S = max_abs_score_terms, V = max_abs_v, Lm = max(1, max |lse|), D the
// head dim, P the page size, k the number of merged blocks (1 for R's
// single online pass, whose rescalings we count in the term with L).
//  - A fused dot product of D terms errs by at most D*u*S (plus the scale
//    and soft-cap roundings, 4*u*S): E = (D + 4) * u * S.
//  - The softmax weights exp(s_j - m) then err relatively by <= 2E + 2u,
//    the normaliser (a sum of up to L or P positive terms) by <= L*u,
//    and every fp32 merge step rescales by exp(lse_a - M), whose argument
//    carries the rounding of two LSEs of magnitude <= Lm: 4*Lm*u per step.
// So |out - out*| <= V * (4E + (2P + 8k + 16 + 4k*Lm) * u) and
// |lse - lse*| <= E + (P + 4k + 8 + 2k*Lm) * u. These are worst-case
// (triangle-inequality) bounds, a few times above typical errors, and
// scale linearly with k, as an fp32 left fold does (the replay's merge
// tree, of depth log2 k, stays inside them).
struct ErrorBound {
  double out = 0;
  double lse = 0;
};
ErrorBound ReferenceBound(const LogicalCase& c, const OracleResult& o);
ErrorBound ReplayBound(const LogicalCase& c, const OracleResult& o,
                       int64_t page_size, int64_t merged_blocks);

// An upper bound on half a unit in the last place of `dtype` at |x|: the
// error of one round-to-nearest cast to `dtype` (eps/2 * |x|; f16
// subnormals: 2^-25).
double HalfUlp(double x, DType dtype);

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_TESTING_ATTENTION_ORACLE_H_
