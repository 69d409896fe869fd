// A naive long-double decode attention over a snapshot, for the simulator
// tests: an oracle independent of both the simulated kernel and the
// project's reference (core/attention). It follows the contract literally:
// q rotated in fp32 (RopeTable, the contract's RoPE) and cast to the q RoPE
// output dtype; every other step in long double, key by key, through the
// block table and the slot positions.
#ifndef ATTNAUDIT_TESTS_UNIT_SIM_NAIVE_ORACLE_H_
#define ATTNAUDIT_TESTS_UNIT_SIM_NAIVE_ORACLE_H_

#include <vector>

#include "core/snapshot/snapshot.h"

namespace attnaudit::testing {

struct OracleResult {
  std::vector<long double> out;  // [B, Sq, Hq, D]
  std::vector<long double> lse;  // [B, Sq, Hq], natural log, without sinks
};

OracleResult NaiveAttention(const Snapshot& s);

// Largest |engine - oracle| divided by the tolerance "the engine's fp32
// arithmetic plus one rounding of out to its dtype" (eps_out * |o| plus
// 2e-5 of the head's largest |o|); <= 1 means within bf16 (or f16/f32)
// rounding. lse_ratio: the same for lse with tolerance 2e-5 * max(1, |lse|).
struct OracleDistance {
  double out_ratio = 0;
  double lse_ratio = 0;
};
OracleDistance CompareToOracle(const Snapshot& s, const OracleResult& o);

}  // namespace attnaudit::testing

#endif  // ATTNAUDIT_TESTS_UNIT_SIM_NAIVE_ORACLE_H_
