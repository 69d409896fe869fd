// Long-double RoPE oracle, written from Hugging Face transformers'
// documented definitions (modeling_rope_utils: default, linear, llama3,
// yarn, dynamic NTK and longrope inverse frequencies; apply_rotary_pos_emb with
// rotate_half for the NeoX pairing; interleaved pairs for GPT-J), independently
// of core/rope. Partial rotary: the first rotary_dim dims rotate, the rest pass
// through. Test-only; pure functions; thread-safe. Configs are assumed valid.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_TESTING_ROPE_ORACLE_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_TESTING_ROPE_ORACLE_H_

#include <cstdint>
#include <vector>

#include "core/snapshot/snapshot.h"

namespace attnaudit {
namespace testing {

// rotary_dim / 2 inverse frequencies after scaling.
std::vector<long double> OracleInvFreq(const RopeConfig& config,
                                       int64_t head_dim);

// The cos/sin magnitude: YaRN's attention factor (default
// 0.1 * ln(factor) + 1 for factor > 1), LongRoPE's (default
// sqrt(1 + ln(factor) / ln(original_max_position)) for factor > 1), else 1.
long double OracleMagnitude(const RopeConfig& config);

// YaRN's correction range before and after HF's floor/ceil and clamping.
struct YarnRange {
  long double low_dim = 0;   // find_correction_dim(beta_fast), unrounded
  long double high_dim = 0;  // find_correction_dim(beta_slow), unrounded
  long double low = 0;       // max(floor(low_dim), 0)
  long double high = 0;      // min(ceil(high_dim), rotary_dim - 1)
};
YarnRange OracleYarnRange(const RopeConfig& config, int64_t head_dim);

// x[head_dim] rotated for `position`.
std::vector<long double> OracleRope(const RopeConfig& config,
                                    const std::vector<long double>& x,
                                    int64_t position);

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_TESTING_ROPE_ORACLE_H_
