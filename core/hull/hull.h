// The convex-hull check: attention's output is a convex combination of the
// value rows it attends over (a sink only adds weight that carries no
// value: it pulls the output towards zero). So for every row b, query s,
// query head h and dimension d, a correct engine's out lies between the
// least and the largest V[j, g(h), d] over the keys j visible to the query,
// 0 included when the head has a sink, widened by the engine's own
// rounding. An output outside is wrong whatever the arithmetic, whatever
// the tolerances: the audit calls it DRIFT (docs/NUMERICS.md, "The convex
// hull").
//
// The hull of a (row, KV head) is the union over the row's queries of their
// visible keys (exact for decode, Sq = 1; a superset for Sq > 1, which only
// widens it). It is read from the cache only for the (row, KV head) cells
// where some output is farther from R than the slack (R is inside the hull,
// so every other output is too): a clean audit reads little or nothing.
//
// Pure function of its inputs; thread-safe; reads the snapshot's V pages
// through `prepared` (which, with its snapshot, must outlive the call).
#ifndef ATTNAUDIT_CORE_HULL_HULL_H_
#define ATTNAUDIT_CORE_HULL_HULL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/attention/attention.h"
#include "core/engine/arithmetic.h"
#include "core/report/report.h"

namespace attnaudit {

// How far outside its hull a correct engine's output may land:
// relative * max(|low|, |high|) + absolute.
struct HullSlack {
  double relative = 0;
  double absolute = 0;
};

// The slack of an engine of `engine`'s arithmetic writing `output_dtype`
// after `depth` fp32 merges (the accumulation depth of the tolerances):
// its output rounding (a truncated one loses up to an ulp), probabilities
// rounded for P.V whose sum is no longer the normaliser's, the fp32 merges,
// and fp8 values dequantised to bf16 -- each counted twice.
HullSlack EngineHullSlack(const EngineArithmetic& engine, DType output_dtype,
                          DType kv_dtype, double depth);

// Checks the engine's out [B, Sq, Hq, D] against the hull of each visible
// V; `reference_out` is R (same shape). Non-finite engine values are left
// out (the drift statistics count them). `threads` as ParallelFor's.
HullCheck CheckEngineHull(const PreparedAttention& prepared,
                          const std::vector<double>& engine_out,
                          const std::vector<double>& reference_out,
                          const HullSlack& slack, int threads);

// "out: 3 of 32768 elements outside the convex hull of the visible V rows
// (worst 1e+04 at b=0 s=0 h=1 d=2, hull [-4.9, 5.1]): no attention produces
// them", for a check with elements outside.
std::string HullReason(const HullCheck& check);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_HULL_HULL_H_
