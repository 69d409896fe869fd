// The diagnosis at realistic attention (docs/DIAGNOSIS.md, "Diagnosis at
// realistic attention"): page, scale and CP bugs on snapshots of the shapes
// users run (llama3-8b / qwen3-8b heads, batch 4-8, 1k-16k keys, pages of
// 16, a sink carrying 30-90 % of the weight, logits up to ~50), with and
// without the engine's LSE; per bug, how often the top diagnosis is right,
// unexplained or wrong, and how often a wrong one claims to explain.
#ifndef ATTNAUDIT_BENCH_DIAGNOSIS_EVAL_REALISTIC_H_
#define ATTNAUDIT_BENCH_DIAGNOSIS_EVAL_REALISTIC_H_

#include <cstdint>
#include <string>

namespace attnaudit::bench {

struct RealisticFlags {
  int seeds = 0;  // snapshots per bug
  uint64_t seed = 1;
  int threads = 1;
  std::string bugs;  // only bugs whose label contains this
  int64_t min_context = 1024;
  int64_t max_context = 16384;
  bool dump = false;     // every diagnosis of a snapshot not diagnosed right
  bool verbose = false;  // one line per snapshot
};

// Prints the table; returns 1 when some entry explains at a wrong place.
int RunRealistic(const RealisticFlags& f);

}  // namespace attnaudit::bench

#endif  // ATTNAUDIT_BENCH_DIAGNOSIS_EVAL_REALISTIC_H_
